// Runs a grid's work items on the host's cores, the way both host executors do: each thread
// claims the next id from an atomic counter and reuses its own scratch buffers.
//
// The helper threads are started once per process and wait between calls (a call of a few
// milliseconds would otherwise spend a large part of it starting threads and faulting in fresh
// scratch); each thread keeps its scratch (one per Scratch type, about 1 MiB for the attention
// block) for the next call. A call that finds the helpers busy (another executor call running
// at the same time, e.g. one per device of a sharded computation) or in a forked child starts
// its own threads as before.
#ifndef JAX_MLA_HOST_PARALLEL_WORKGROUPS_H_
#define JAX_MLA_HOST_PARALLEL_WORKGROUPS_H_

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "host/cpu_info.h"

namespace jax_mla::host {

// The process's helper threads: one job at a time, run by the caller and up to `helpers`
// threads. Never destroyed (threads waiting at exit are simply ended with the process).
class HelperPool {
 public:
  static HelperPool& Instance() {
    static HelperPool* pool = new HelperPool(HostThreads() > 1 ? HostThreads() - 1 : 0);
    return *pool;
  }

  // Runs work() on the calling thread and on `helpers` (<= size()) helper threads, and returns
  // when all have returned. False (nothing run) when the pool is busy or this is a forked child.
  bool TryRun(unsigned helpers, const std::function<void()>& work) {
    if (getpid() != pid_) return false;
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    helpers = std::min<unsigned>(helpers, static_cast<unsigned>(threads_.size()));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &work;
      wanted_ = helpers;
      running_ = helpers;
      ++generation_;
    }
    wake_.notify_all();
    work();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return running_ == 0; });
    job_ = nullptr;
    return true;
  }

  unsigned size() const { return static_cast<unsigned>(threads_.size()); }

 private:
  explicit HelperPool(unsigned helpers) : pid_(getpid()) {
    try {
      for (unsigned i = 0; i < helpers; ++i) threads_.emplace_back([this, i] { Loop(i); });
    } catch (...) {
      // Fewer helpers: the ones started serve.
    }
    for (std::thread& t : threads_) t.detach();
  }

  void Loop(unsigned index) {
    std::uint64_t seen = 0;
    for (;;) {
      const std::function<void()>* job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        if (index >= wanted_) continue;
        job = job_;
      }
      (*job)();
      std::lock_guard<std::mutex> lock(mutex_);
      if (--running_ == 0) done_.notify_one();
    }
  }

  const pid_t pid_;
  std::vector<std::thread> threads_;
  std::mutex busy_;
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void()>* job_ = nullptr;
  unsigned wanted_ = 0, running_ = 0;
  std::uint64_t generation_ = 0;
};

// Calls run(id, scratch) for every id in [0, count) on up to max_threads threads (0: one per
// CPU this process may use, HostThreads()), the calling thread included, each with its own
// Scratch (default-constructed once per thread and kept). Returns false when a call or a scratch
// allocation threw: the remaining ids are then skipped (no exception escapes a thread or the FFI
// boundary).
template <typename Scratch, typename Run>
bool RunWorkgroups(std::int64_t count, unsigned max_threads, const Run& run) {
  unsigned threads = max_threads ? max_threads : HostThreads();
  threads = static_cast<unsigned>(
      std::clamp<std::int64_t>(threads, 1, std::max<std::int64_t>(count, 1)));
  std::atomic<std::int64_t> next{0};
  std::atomic<bool> failed{false};
  auto worker = [&] {
    try {
      thread_local std::unique_ptr<Scratch> kept;
      if (!kept) kept = std::make_unique<Scratch>();
      for (std::int64_t id = next.fetch_add(1); id < count && !failed.load();
           id = next.fetch_add(1)) {
        run(id, *kept);
      }
    } catch (...) {
      failed.store(true);
    }
  };
  if (threads == 1) {
    worker();
    return !failed.load();
  }
  const std::function<void()> job = worker;
  if (HelperPool::Instance().TryRun(threads - 1, job)) return !failed.load();
  std::vector<std::thread> pool;
  try {
    pool.reserve(threads - 1);
    for (unsigned t = 1; t < threads; ++t) pool.emplace_back(worker);
  } catch (...) {
    // Fewer threads: the ones started and this one share what is left.
  }
  worker();
  for (std::thread& t : pool) t.join();
  return !failed.load();
}

}  // namespace jax_mla::host

#endif  // JAX_MLA_HOST_PARALLEL_WORKGROUPS_H_
