// A small persistent pool of worker threads for the CPU backend. Ops call parallel_for once or a
// few times each, so the threads are created once and sleep on a condition variable between jobs
// (never spin: the machine may be shared). The calling thread takes part in every job.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gyre {

class ThreadPool {
 public:
  // n_threads counts the caller too; n_threads <= 0 means one per hardware thread.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over disjoint ranges covering [0, n), each at least `grain` items long
  // (except the last), and returns when all are done. Jobs too small to split run inline.
  // The first exception thrown by fn is rethrown here after the job finishes. Calls from
  // several threads are serialized; fn must not call parallel_for itself (it would deadlock).
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop();
  void run_chunks();

  std::vector<std::thread> workers_;
  std::mutex call_mutex_;  // one job at a time, whoever calls
  std::mutex mutex_;
  std::condition_variable start_cv_, done_cv_;
  uint64_t generation_ = 0;
  bool stopping_ = false;
  int busy_workers_ = 0;

  // The job in flight.
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0, job_chunk_ = 0;
  std::atomic<int64_t> next_chunk_{0};
  std::exception_ptr error_;
};

}  // namespace gyre
