#include "engine/worker_pool.h"

#include <algorithm>

namespace xserv::engine {

WorkerPool::WorkerPool(int threads) {
  if (threads <= 0)
    threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) - 1, 1, 32);
  for (int i = 0; i < threads; ++i)
    workers_.emplace_back([this] { work(); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  go_.notify_all();
  for (std::thread& t : workers_)
    t.join();
}

void WorkerPool::start(size_t n, std::function<void(size_t)> fn) {
  {
    std::lock_guard lock(mu_);
    fn_ = std::move(fn);
    next_ = 0;
    items_ = n;
    finished_ = 0;
    error_ = nullptr;
    ++batch_;
  }
  go_.notify_all();
}

void WorkerPool::wait() {
  std::unique_lock lock(mu_);
  done_.wait(lock, [&] { return finished_ == items_; });
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void WorkerPool::work() {
  unsigned seen = 0;
  std::unique_lock lock(mu_);
  for (;;) {
    go_.wait(lock, [&] { return stop_ || (batch_ != seen && next_ < items_); });
    if (stop_)
      return;
    // Items of this batch until none is left; then sleep until the next batch.
    while (next_ < items_) {
      const size_t i = next_++;
      lock.unlock();
      std::exception_ptr failed;
      try {
        fn_(i);
      } catch (...) {
        failed = std::current_exception();
      }
      lock.lock();
      if (failed && !error_)
        error_ = failed;
      if (++finished_ == items_)
        done_.notify_all();
    }
    seen = batch_;
  }
}

} // namespace xserv::engine
