// engine::WorkerPool: every item of a batch runs once, batches follow one another, a slow item
// does not hold back the rest, an item's exception comes back from wait().
#include "engine/worker_pool.h"

#include <doctest/doctest.h>

#include <atomic>
#include <future>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>

using xserv::engine::WorkerPool;

TEST_CASE("WorkerPool runs every item of each batch exactly once") {
  WorkerPool pool(3);
  CHECK(pool.threads() == 3);
  for (size_t n : {size_t(0), size_t(1), size_t(7), size_t(1000)}) {
    std::vector<std::atomic<int>> runs(n);
    pool.start(n, [&](size_t i) { runs[i].fetch_add(1); });
    pool.wait();
    for (size_t i = 0; i < n; ++i)
      CHECK(runs[i].load() == 1);
  }
  WorkerPool automatic; // one fewer than the hardware threads, at least one
  CHECK(automatic.threads() >= 1);
}

TEST_CASE("WorkerPool hands items out one at a time: a blocked item leaves the rest to others") {
  WorkerPool pool(2);
  std::promise<void> release; // item 0 waits for it until every other item is done
  const std::shared_future<void> released = release.get_future().share();
  std::atomic<int> done{0};
  std::set<std::thread::id> others;
  std::mutex m;
  const int n = 50;
  pool.start(size_t(n), [&](size_t i) {
    if (i == 0) {
      released.wait();
      return;
    }
    {
      std::lock_guard lock(m);
      others.insert(std::this_thread::get_id());
    }
    if (done.fetch_add(1) + 1 == n - 1)
      release.set_value();
  });
  pool.wait();
  CHECK(done.load() == n - 1);
  CHECK(others.size() == 1); // item 0's thread was held: the other one ran all the rest
}

TEST_CASE("WorkerPool's wait rethrows an item's exception after the batch is done") {
  WorkerPool pool(2);
  std::atomic<int> runs{0};
  pool.start(20, [&](size_t i) {
    runs.fetch_add(1);
    if (i == 5)
      throw std::runtime_error("mask 5 failed");
  });
  CHECK_THROWS_WITH_AS(pool.wait(), "mask 5 failed", std::runtime_error);
  CHECK(runs.load() == 20);
  pool.start(3, [&](size_t) { runs.fetch_add(1); }); // the pool still works
  pool.wait();
  CHECK(runs.load() == 23);
}
