// Calibration data for the quantizer: text (the built-in default or a file) tokenized into
// `rows` rows of `length` tokens, each starting with BOS when the model has one.
#pragma once
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace gyre::quant {

// A few KB of varied text written for Gyre: prose, dialogue, code, a table, several languages.
const std::string& default_calibration_text();

// Row i starts at token (i * stride) of the text's tokens, wrapping around to the beginning when
// the text is shorter than rows * length (stride spreads rows evenly over the text). Throws
// gyre::Error when the text has fewer than 16 tokens or rows/length are out of range.
std::vector<std::vector<int>> calibration_rows(const Tokenizer& tok, const std::string& text,
                                               int rows, int length, int bos_id);

}  // namespace gyre::quant
