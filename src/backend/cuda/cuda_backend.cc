// CudaBackend: device setup, memory, weight upload, staging of per-step inputs, graph capture
// and replay, and the entry points of cuda_backend.h. The ops themselves are in cuda_ops.cc.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "backend/cuda/cuda_backend_impl.h"
#include "backend/cuda/cuda_buffers.h"
#include "core/half.h"

namespace gyre {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::unique_ptr<Backend> make_cuda_backend(int device_index, const BackendOptions& options) {
  return std::make_unique<cuda::CudaBackend>(device_index, options);
}

namespace {
cuda::CudaBackend& as_cuda(Backend& b) {
  auto* c = dynamic_cast<cuda::CudaBackend*>(&b);
  GYRE_CHECK(c != nullptr, "backend ", b.name(), " is not a CUDA backend");
  return *c;
}
}  // namespace

CudaMemoryReport cuda_memory_report(Backend& backend) {
  return as_cuda(backend).memory_report();
}
void cuda_set_synthetic_weights(Backend& backend, uint64_t seed) {
  as_cuda(backend).set_synthetic(seed);
}
double cuda_measure_bandwidth(Backend& backend) {
  return as_cuda(backend).measure_bandwidth();
}
void cuda_set_decode_graphs(Backend& backend, bool buckets, bool record) {
  as_cuda(backend).set_decode_graphs(buckets, record);
}
uint64_t cuda_graph_replays(Backend& backend) {
  return as_cuda(backend).graph_replays();
}
uint64_t cuda_fed_steps(Backend& backend) {
  return as_cuda(backend).fed_steps();
}
uint64_t cuda_permuted_handoffs(Backend& backend) {
  return as_cuda(backend).permuted_handoffs();
}
uint64_t cuda_parts_row_gathers(Backend& backend) {
  return as_cuda(backend).parts_row_gathers();
}

namespace cuda {

namespace {
void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) fail("cuBLAS error ", static_cast<int>(s), " in ", what);
}
}  // namespace

CudaKvCache::CudaKvCache(int n_layers, int n_kv_heads, int head_dim, int max_seq, KvType type)
    : n_layers(n_layers),
      n_kv_heads(n_kv_heads),
      head_dim(head_dim),
      type(type),
      max_seq_(max_seq) {
  GYRE_CHECK(n_layers > 0 && n_kv_heads > 0 && head_dim > 0 && max_seq > 0,
             "KV cache sizes must be positive");
  const size_t rows = static_cast<size_t>(n_kv_heads) * static_cast<size_t>(max_seq);
  code_plane_ = rows * kv_code_bytes(type, head_dim);
  param_plane_ = rows * kv_param_halves(type, head_dim) * sizeof(half);
  const size_t planes = 2ull * static_cast<size_t>(n_layers);
  bytes_ = planes * (code_plane_ + param_plane_);
  const std::string what =
      "the KV cache (" + std::to_string(max_seq) + " positions, " + kv_type_name(type) + ")";
  codes_ = device_alloc(planes * code_plane_, what);
  if (param_plane_ > 0) params_ = device_alloc(planes * param_plane_, what);
}

void* CudaKvCache::codes(int layer, int kv) const {
  return static_cast<uint8_t*>(codes_.get()) + (2 * static_cast<size_t>(layer) + kv) * code_plane_;
}

half* CudaKvCache::params(int layer, int kv) const {
  if (!params_) return nullptr;
  return reinterpret_cast<half*>(static_cast<uint8_t*>(params_.get()) +
                                 (2 * static_cast<size_t>(layer) + kv) * param_plane_);
}

CudaBackend::CudaBackend(int device, const BackendOptions& options)
    : device_(device), options_(options) {
  GYRE_CHECK(options.weight_bits == 0 || (options.weight_bits >= 2 && options.weight_bits <= 6) ||
                 options.weight_bits == 8,
             "weight bits must be 2, 3, 4, 5, 6 or 8 (or 0 for the file's precision), got ",
             options.weight_bits);
  kv_type_ = parse_kv_type(options.kv_cache);
  GYRE_CUDA_CHECK(cudaSetDevice(device));
  if (const char* g = std::getenv("GYRE_CUDA_GRAPH"))
    graphs_enabled_ = buckets_enabled_ = std::string(g) != "0";
  if (const char* f = std::getenv("GYRE_CUDA_FUSED_ROPE"))
    fused_rope_store_ = std::string(f) != "0";
  if (const char* r = std::getenv("GYRE_CUDA_ROPE_IN_ATTENTION"))
    rope_in_attention_ = std::string(r) != "0";
  if (const char* m = std::getenv("GYRE_CUDA_ATTN_MERGE"); m && std::string(m) == "online")
    attention_weighted_from_ = 1 << 20;
  if (const char* m = std::getenv("GYRE_CUDA_ATTN_MERGE"); m && std::string(m) == "weighted")
    attention_weighted_from_ = 1;
  if (const char* m = std::getenv("GYRE_CUDA_ATTN_CHUNK"); m && *m)
    attention_min_chunk_ = std::clamp(std::atoi(m), 32, 1024);
  if (const char* c = std::getenv("GYRE_CUDA_SPLIT_COMBINE"))
    combine_in_kernel_ = std::string(c) != "kernel";
  if (const char* n = std::getenv("GYRE_CUDA_ATTN_SINGLE"); n && *n)
    single_span_ = std::max(0, std::atoi(n));
  if (const char* n = std::getenv("GYRE_CUDA_ATTN_TRIGGER"); n && *n)
    trigger_span_ = std::max(0, std::atoi(n));
  if (const char* r = std::getenv("GYRE_CUDA_PERMUTED_RESIDUAL"))
    permuted_residual_enabled_ = std::string(r) != "0";
  if (const char* r = std::getenv("GYRE_CUDA_MIXED_NORM"))
    mixed_norm_in_gather_ = std::string(r) != "0";
  if (const char* r = std::getenv("GYRE_CUDA_MIXED_PRIOR"))
    mixed_prior_epilogue_ = std::string(r) != "0";
  if (const char* r = std::getenv("GYRE_CUDA_MIXED_ROW"))
    mixed_row_enabled_ = std::string(r) != "0";
  if (const char* r = std::getenv("GYRE_CUDA_MIXED_LATE")) mixed_late_wait_ = std::string(r) != "0";
  if (const char* r = std::getenv("GYRE_CUDA_MIXED_ORDER")) mixed_order_ = std::string(r) != "0";
  if (const char* r = std::getenv("GYRE_CUDA_PARTS_ROWS"))
    parts_rows_enabled_ = std::string(r) != "0";
  cudaDeviceProp prop{};
  GYRE_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  sm_count_ = prop.multiProcessorCount;
  name_ = "cuda:" + std::to_string(device) + " (" + prop.name + ")";
  GYRE_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  check_cublas(cublasCreate(&cublas_), "cublasCreate");
  check_cublas(cublasSetStream(cublas_, stream_), "cublasSetStream");
  // A fixed workspace keeps cuBLAS from allocating inside the forward pass.
  constexpr size_t kCublasWorkspace = 32u << 20;
  cublas_workspace_ = device_alloc(kCublasWorkspace, "the cuBLAS workspace");
  check_cublas(cublasSetWorkspace(cublas_, cublas_workspace_.get(), kCublasWorkspace),
               "cublasSetWorkspace");
  for (StagedInts* s : {&tokens_, &positions_, &pos0_}) {
    GYRE_CUDA_CHECK(cudaEventCreateWithFlags(&s->copied, cudaEventDisableTiming));
    reserve_staging(*s, 256);
  }
}

CudaBackend::~CudaBackend() {
  (void)cudaStreamSynchronize(stream_);
  drop_graph();
  for (StagedInts* s : {&tokens_, &positions_, &pos0_}) (void)cudaEventDestroy(s->copied);
  for (cudaEvent_t e : fed_events_)
    if (e) (void)cudaEventDestroy(e);
  if (cublas_) (void)cublasDestroy(cublas_);
  if (stream_) (void)cudaStreamDestroy(stream_);
}

Tensor CudaBackend::device_tensor(int64_t rows, int64_t cols, const std::string& what) {
  GYRE_CHECK(rows > 0 && cols > 0, "tensor ", what, " has an empty shape [", rows, ", ", cols, "]");
  Tensor t;
  t.dtype = DType::F16;
  t.rows = rows;
  t.cols = cols;
  t.owner = device_alloc(static_cast<size_t>(rows) * cols * sizeof(half), what);
  t.data = t.owner.get();
  return t;
}

Tensor CudaBackend::alloc(int64_t rows, int64_t cols) {
  GYRE_CHECK(!capturing_, "internal: allocation while capturing a CUDA graph");
  drop_graph();  // a recorded step may use the buffers this one replaces
  Tensor t = device_tensor(rows, cols, "activations");
  scratch_bytes_ += static_cast<size_t>(rows) * cols * sizeof(half);
  return t;
}

// Converts to FP16 on the GPU in pieces, so the raw copy needs only a bounded staging buffer.
void CudaBackend::upload_converted(half* dst, const TensorView& w) {
  const int64_t n = w.numel();
  const size_t elem = w.dtype == DType::F32 ? 4 : 2;
  constexpr int64_t kPiece = 16 << 20;  // elements
  auto staging =
      device_alloc(static_cast<size_t>(std::min(n, kPiece)) * elem, "upload staging for " + w.name);
  for (int64_t i = 0; i < n; i += kPiece) {
    const int64_t m = std::min(kPiece, n - i);
    GYRE_CUDA_CHECK(cudaMemcpyAsync(staging.get(), static_cast<const uint8_t*>(w.data) + i * elem,
                                    static_cast<size_t>(m) * elem, cudaMemcpyHostToDevice,
                                    stream_));
    convert_to_half(dst + i, staging.get(), w.dtype == DType::BF16, m, stream_);
    GYRE_CUDA_CHECK(cudaStreamSynchronize(stream_));  // staging is reused by the next piece
  }
}

Tensor CudaBackend::upload_weight(const TensorView& w) {
  if (Tensor q; try_upload_quantized(w, q)) return q;
  Tensor t = device_tensor(w.rows(), w.cols(), "weight " + w.name);
  half* dst = static_cast<half*>(t.data);
  const size_t bytes = static_cast<size_t>(t.rows) * t.cols * sizeof(half);
  weight_bytes_ += bytes;
  if (synthetic_) {
    // Norm weights near 1, matrices with unit-variance outputs for unit-variance inputs.
    const bool vector = t.rows == 1;
    const float scale = vector ? 0.2f : std::sqrt(3.0f / static_cast<float>(t.cols));
    fill_random(dst, t.rows * t.cols, synthetic_seed_++, scale, vector ? 1.0f : 0.0f, stream_);
    GYRE_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return t;
  }
  GYRE_CHECK(w.data != nullptr, "weight ", w.name, " has no data");
  switch (w.dtype) {
    case DType::F16:
      GYRE_CUDA_CHECK(cudaMemcpyAsync(dst, w.data, bytes, cudaMemcpyHostToDevice, stream_));
      GYRE_CUDA_CHECK(cudaStreamSynchronize(stream_));
      break;
    case DType::BF16:
    case DType::F32:
      upload_converted(dst, w);
      break;
    case DType::I32:
      fail("weight ", w.name, " has integer type I32");
    default: {
      // GGUF blocks qlinear cannot repack (and block-typed embedding tables): dequantized on
      // the host to FP16, row by row.
      const int64_t cols = t.cols;
      const size_t src_row = dtype_row_bytes(w.dtype, cols);
      std::vector<float> f(static_cast<size_t>(cols));
      std::vector<uint16_t> h(static_cast<size_t>(cols) * std::min<int64_t>(t.rows, 256));
      for (int64_t r0 = 0; r0 < t.rows; r0 += 256) {
        const int64_t nr = std::min<int64_t>(256, t.rows - r0);
        for (int64_t r = 0; r < nr; ++r) {
          dequantize_row(w.dtype, static_cast<const uint8_t*>(w.data) + (r0 + r) * src_row,
                         f.data(), cols);
          for (int64_t c = 0; c < cols; ++c)
            h[static_cast<size_t>(r * cols + c)] = f32_to_f16(f[static_cast<size_t>(c)]);
        }
        GYRE_CUDA_CHECK(cudaMemcpy(dst + r0 * cols, h.data(),
                                   static_cast<size_t>(nr * cols) * sizeof(half),
                                   cudaMemcpyHostToDevice));
      }
    }
  }
  return t;
}

// Through pinned memory: a pageable device-to-host copy of a 128k-vocabulary logits row costs
// several times more than the pinned copy plus a host memcpy.
void CudaBackend::to_host(const Tensor& t, float* dst) {
  GYRE_CHECK(t.dtype == DType::F16, "to_host expects an FP16 activation");
  const size_t count = static_cast<size_t>(t.rows) * t.cols;
  if (count > to_host_floats_) {
    to_host_buf_ = device_alloc(count * sizeof(float), "the host-copy buffer");
    to_host_pinned_ = pinned_alloc(count * sizeof(float), "the host-copy buffer");
    to_host_floats_ = count;
  }
  float* buf = static_cast<float*>(to_host_buf_.get());
  half_to_float(buf, static_cast<const half*>(t.data), static_cast<int64_t>(count), stream_);
  GYRE_CUDA_CHECK(cudaMemcpyAsync(to_host_pinned_.get(), buf, count * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream_));
  GYRE_CUDA_CHECK(cudaStreamSynchronize(stream_));
  std::memcpy(dst, to_host_pinned_.get(), count * sizeof(float));
}

std::unique_ptr<KvCache> CudaBackend::new_kv_cache(int n_layers, int n_kv_heads, int head_dim,
                                                   int max_seq) {
  drop_graph();
  auto cache = std::make_unique<CudaKvCache>(n_layers, n_kv_heads, head_dim, max_seq, kv_type_);
  kv_bytes_ += cache->bytes();
  const CudaMemoryReport m = memory_report();
  std::fprintf(stderr,
               "gyre: %s: weights %.1f MiB, KV cache %.1f MiB (%d positions, %s), "
               "%.1f MiB free of %.1f MiB\n",
               name_.c_str(), mib(m.weights), mib(cache->bytes()), max_seq, kv_type_name(kv_type_),
               mib(m.free), mib(m.total));
  return cache;
}

void CudaBackend::synchronize() {
  GYRE_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

CudaMemoryReport CudaBackend::memory_report() {
  CudaMemoryReport r;
  r.weights = weight_bytes_;
  r.kv_cache = kv_bytes_;
  r.scratch = scratch_bytes_ + workspace_.bytes;
  GYRE_CUDA_CHECK(cudaMemGetInfo(&r.free, &r.total));
  return r;
}

double CudaBackend::measure_bandwidth() {
  size_t free_b = 0, total_b = 0;
  GYRE_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  const size_t bytes = std::min<size_t>(1ull << 30, free_b / 4) & ~size_t{4095};
  GYRE_CHECK(bytes >= (64u << 20), "too little free GPU memory to measure bandwidth");
  auto a = device_alloc(bytes, "the bandwidth test"), b = device_alloc(bytes, "the bandwidth test");
  fill_random(static_cast<half*>(a.get()), static_cast<int64_t>(bytes / 2), 7, 1.0f, 0.0f, stream_);
  cudaEvent_t start, stop;
  GYRE_CUDA_CHECK(cudaEventCreate(&start));
  GYRE_CUDA_CHECK(cudaEventCreate(&stop));
  GYRE_CUDA_CHECK(cudaMemcpyAsync(b.get(), a.get(), bytes, cudaMemcpyDeviceToDevice, stream_));
  constexpr int kReps = 10;
  GYRE_CUDA_CHECK(cudaEventRecord(start, stream_));
  for (int i = 0; i < kReps; ++i)
    GYRE_CUDA_CHECK(cudaMemcpyAsync(i % 2 ? a.get() : b.get(), i % 2 ? b.get() : a.get(), bytes,
                                    cudaMemcpyDeviceToDevice, stream_));
  GYRE_CUDA_CHECK(cudaEventRecord(stop, stream_));
  GYRE_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  GYRE_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  (void)cudaEventDestroy(start);
  (void)cudaEventDestroy(stop);
  return 2.0 * static_cast<double>(bytes) * kReps / (ms * 1e-3);
}

// ---- per-step inputs and graphs ----

void CudaBackend::reserve_staging(StagedInts& s, int n) {
  if (n <= s.capacity) return;
  GYRE_CHECK(!capturing_, "internal: staging buffer growth while capturing a CUDA graph");
  drop_graph();
  GYRE_CUDA_CHECK(cudaEventSynchronize(s.copied));
  const int cap = std::max(n, 2 * s.capacity);
  s.pinned = pinned_alloc(static_cast<size_t>(cap) * 4, "step inputs");
  s.device = device_alloc(static_cast<size_t>(cap) * 4, "step inputs");
  s.capacity = cap;
  s.valid = false;
}

const int32_t* CudaBackend::stage(StagedInts& s, const int32_t* host, int n) {
  if (fed_ && (&s == &tokens_ || &s == &positions_ || &s == &pos0_)) {
    GYRE_CHECK(n == 1, "internal: a fed decode step of ", n, " rows");
    return static_cast<const int32_t*>(s.device.get());  // the last step's pick wrote it
  }
  if (s.valid && static_cast<int>(s.current.size()) == n &&
      std::equal(host, host + n, s.current.begin()))
    return static_cast<const int32_t*>(s.device.get());
  reserve_staging(s, n);
  if (!capturing_) GYRE_CUDA_CHECK(cudaEventSynchronize(s.copied));
  std::memcpy(s.pinned.get(), host, static_cast<size_t>(n) * 4);
  GYRE_CUDA_CHECK(cudaMemcpyAsync(s.device.get(), s.pinned.get(), static_cast<size_t>(n) * 4,
                                  cudaMemcpyHostToDevice, stream_));
  if (!capturing_) GYRE_CUDA_CHECK(cudaEventRecord(s.copied, stream_));
  s.current.assign(host, host + n);
  s.valid = true;
  return static_cast<const int32_t*>(s.device.get());
}

void CudaBackend::stage_step_inputs(const int32_t* tokens, const int32_t* positions, int n,
                                    int pos0) {
  const std::pair<StagedInts*, const int32_t*> inputs[] = {
      {&tokens_, tokens}, {&positions_, positions}, {&pos0_, &pos0}};
  for (const auto& [s, host] : inputs) {
    const int count = s == &pos0_ ? 1 : n;
    reserve_staging(*s, count);
    GYRE_CUDA_CHECK(cudaEventSynchronize(s->copied));
    std::memcpy(s->pinned.get(), host, static_cast<size_t>(count) * 4);
    s->valid = false;  // the device copy is refreshed only by a replay
  }
}

std::vector<CudaBackend::Record>::iterator CudaBackend::find_record(const void* owner, int bucket) {
  const void* cache = nullptr;
  int span = 0;
  if (bucket > 0) {
    const PagedStep& st = bucket_step(bucket);
    cache = bucket_step_cache(st);
    span = bucket_step_span(st);
  }
  // A batched record writes the keys and values of the cache it was recorded with: it serves
  // only while that cache is the one staged (new caches drop every record, so a live pointer
  // cannot name another cache).
  return std::find_if(graphs_.begin(), graphs_.end(), [&](const Record& r) {
    return r.owner == owner && r.bucket == bucket && r.cache == cache && r.span == span;
  });
}

void CudaBackend::capture_begin(const void* owner, int bucket) {
  if (auto it = find_record(owner, bucket); it != graphs_.end()) {
    GYRE_CUDA_CHECK(cudaStreamSynchronize(stream_));  // it may still be running
    (void)cudaGraphExecDestroy(it->exec);
    graphs_.erase(it);
  }
  capture_owner_ = owner;
  capture_bucket_ = bucket;
  for (StagedInts* s : {&tokens_, &positions_, &pos0_}) s->valid = false;
  GYRE_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  capturing_ = true;
}

void CudaBackend::capture_end(bool keep) {
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  // Values staged during the capture were never copied (capture records, it does not run).
  for (StagedInts* s : {&tokens_, &positions_, &pos0_}) s->valid = false;
  GYRE_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  if (!keep) {  // an op failed part-way: the record is incomplete
    (void)cudaGraphDestroy(graph);
    return;
  }
  Record r;
  r.owner = capture_owner_;
  r.bucket = capture_bucket_;
  if (r.bucket > 0) {
    const PagedStep& st = bucket_step(r.bucket);
    r.cache = bucket_step_cache(st);
    r.span = bucket_step_span(st);
  }
  const cudaError_t err = cudaGraphInstantiate(&r.exec, graph, 0);
  (void)cudaGraphDestroy(graph);
  GYRE_CUDA_CHECK(err);
  graphs_.push_back(r);
}

bool CudaBackend::replay_step(const void* owner, int bucket) {
  auto it = find_record(owner, bucket);
  if (it == graphs_.end()) return false;
  GYRE_CUDA_CHECK(cudaGraphLaunch(it->exec, stream_));
  ++graph_replays_;
  for (StagedInts* s : {&tokens_, &positions_, &pos0_})
    GYRE_CUDA_CHECK(cudaEventRecord(s->copied, stream_));
  return true;
}

void CudaBackend::drop_graph() {
  if (graphs_.empty()) return;
  (void)cudaStreamSynchronize(stream_);
  for (const Record& r : graphs_) (void)cudaGraphExecDestroy(r.exec);
  graphs_.clear();
}

void CudaBackend::drop_bucket_graphs(int bucket) {
  auto stale = [bucket](const Record& r) { return r.bucket == bucket; };
  if (std::none_of(graphs_.begin(), graphs_.end(), stale)) return;
  (void)cudaStreamSynchronize(stream_);
  for (const Record& r : graphs_)
    if (stale(r)) (void)cudaGraphExecDestroy(r.exec);
  graphs_.erase(std::remove_if(graphs_.begin(), graphs_.end(), stale), graphs_.end());
}

int CudaBackend::decode_bucket(int rows) const {
  if (!buckets_enabled_ || rows < 1 || rows > kMaxDecodeBucket) return 0;
  int b = 1;
  while (b < rows) b *= 2;
  return b;
}

bool CudaBackend::grow(Scratch& b, size_t bytes, const char* what) {
  if (bytes <= b.bytes) return false;
  GYRE_CHECK(!capturing_, "internal: growth of ", what, " while capturing a CUDA graph");
  drop_graph();
  b.mem.reset();  // the old buffer goes first: together they may not fit
  b.bytes = 0;
  b.mem = device_alloc(bytes, what);
  b.bytes = bytes;
  return true;
}

float* CudaBackend::workspace(size_t floats) {
  grow(workspace_, floats * sizeof(float), "the attention workspace");
  return workspace_.as<float>();
}

unsigned* CudaBackend::split_counters(size_t n) {
  const size_t bytes = std::max<size_t>(n, 1024) * sizeof(unsigned);
  if (n * sizeof(unsigned) > counters_.bytes &&
      grow(counters_, bytes, "the attention combine counters"))
    GYRE_CUDA_CHECK(cudaMemsetAsync(counters_.mem.get(), 0, bytes, stream_));
  return counters_.as<unsigned>();
}

}  // namespace cuda
}  // namespace gyre
