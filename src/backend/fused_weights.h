// Host-side assembly of fused weights (Backend::upload_fused): the parts' rows in one buffer,
// stacked or interleaved in blocks (for backends whose SwiGLU kernels want a gate row next to
// its up row).
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace gyre {

// A view over `storage` (filled here) holding the parts' rows. block == 0: stacked in order.
// block > 0 (exactly two parts of one shape): rows interleaved as part 0 rows [kb, kb + block),
// part 1 rows [kb, kb + block), ... with the row count padded to a multiple of block with
// zero bytes (zero values in every dtype). Throws when dtypes or column counts differ.
TensorView fuse_views(const std::vector<TensorView>& parts, int block,
                      std::vector<uint8_t>& storage);

// The shape fuse_views would give, without touching data (for weights generated on a device).
std::vector<int64_t> fused_shape(const std::vector<TensorView>& parts, int block);

}  // namespace gyre
