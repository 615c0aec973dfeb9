// A fixed set of worker threads that run one batch of independent items at a time: the token
// masks of a step's constrained sequences, computed on the host while the model step runs.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace xserv::engine {

class WorkerPool {
public:
  /// `threads` workers; 0: one fewer than the machine's hardware threads (at least 1, at
  /// most 32).
  explicit WorkerPool(int threads = 0);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  /// Starts fn(0) .. fn(n - 1) on the workers, handed out one at a time (a slow item does not
  /// hold back the others'), and returns at once. One batch at a time: wait() before the next.
  void start(size_t n, std::function<void(size_t)> fn);
  /// Returns when every item of the batch is done; rethrows the first exception an item threw
  /// (the other items still ran).
  void wait();
  int threads() const { return static_cast<int>(workers_.size()); }

private:
  void work();

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable go_, done_;
  std::function<void(size_t)> fn_;
  size_t next_ = 0, items_ = 0, finished_ = 0;
  unsigned batch_ = 0; ///< bumped by start(): a worker sleeps until it changes
  bool stop_ = false;
  std::exception_ptr error_;
};

} // namespace xserv::engine
