// The trellis encoder (the format and the decoder: backend/cpu/trellis.h): for one tile's 256
// targets, the bit stream whose decoded values are closest in squared error, found by the
// Viterbi algorithm over the 65536 states of the bitshift trellis.
//
// Tail-biting (the stream is circular, so no bits are spent on a start state): as QTIP does, a
// first Viterbi pass runs on the sequence rotated by half (positions 128..255, 0..127), with free
// start and end; its state at position 0 fixes the 16 - K bits that state 0 and state 255 share,
// and a second pass on the original order finds the best stream under that constraint. The
// result is exact for that overlap, near-optimal overall.
//
// Cost per tile: two passes of 256 steps over 65536 states, each step a min over the 2^K
// predecessors shared by 2^K states (the bitshift structure), i.e. ~2 x 256 x 2 x 65536 simple
// operations. The CPU encoder is the reference and serves small models; the GPU runs large ones.
#pragma once
#include <cstdint>

namespace gyre::quant {

// t[p], sc[p]: target and scale of sequence position p (trellis_position gives its place in the
// tile). Writes the tile's 8K words and returns sum_p (t[p] - sc[p] * code(state_p))^2 computed
// in float from the written words.
double trellis_encode_tile(const float* t, const float* sc, int k, uint32_t* words);

}  // namespace gyre::quant
