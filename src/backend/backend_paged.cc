// Default batched-serving ops: a backend without them says so in one clear line.
#include "backend/backend.h"
#include "core/error.h"

namespace gyre {

namespace {
[[noreturn]] void unsupported(const Backend& b) {
  fail("backend ", b.name(), " does not support batched serving (paged KV cache)");
}
}  // namespace

std::unique_ptr<PagedKvCache> Backend::new_paged_kv_cache(int, int, int, int, int) {
  unsupported(*this);
}

void Backend::copy_kv_page(PagedKvCache&, int, int, int) {
  unsupported(*this);
}

void Backend::attention_paged(Tensor&, const Tensor&, const Tensor&, const Tensor&, PagedKvCache&,
                              int, const PagedBatch&, const AttentionParams&) {
  unsupported(*this);
}

}  // namespace gyre
