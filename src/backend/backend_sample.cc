// Backend::sample's default: the rows come to the host and the host reference samples them.
#include <exception>
#include <vector>

#include "backend/backend.h"
#include "backend/sample_host.h"
#include "core/error.h"

namespace gyre {

void Backend::sample(const Tensor& logits, const SampleRequest* requests, int n,
                     SampleResult* out) {
  GYRE_CHECK(n >= 0 && n <= logits.rows, "sample: ", n, " rows asked of a tensor of ", logits.rows);
  if (n == 0) return;
  const int vocab = static_cast<int>(logits.cols);
  // Reused between calls: a fresh vocabulary-sized allocation per token costs page faults.
  thread_local std::vector<float> host;
  thread_local sampling::HostScratch scratch;
  host.resize(static_cast<size_t>(n) * static_cast<size_t>(vocab));
  to_host(logits.slice_rows(0, n), host.data());
  for (int i = 0; i < n; ++i) {
    try {
      out[i] = sampling::sample_row(host.data() + static_cast<size_t>(i) * vocab, vocab,
                                    requests[i], scratch);
    } catch (const std::exception& e) {  // one bad row must not fail the others
      out[i] = SampleResult{};
      out[i].error = e.what();
    }
  }
}

}  // namespace gyre
