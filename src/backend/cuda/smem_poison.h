// Test hook (smem_poison.cu): fills every SM's shared memory with 0xff bytes (NaN) so that a
// kernel reading a shared-memory slot before its copy lands reads NaN, not what the previous
// launch of the same test left there.
#pragma once

namespace gyre::qlinear_detail {
void poison_shared_memory();
}  // namespace gyre::qlinear_detail
