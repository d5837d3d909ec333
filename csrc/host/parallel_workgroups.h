// Runs a grid's work items on the host's cores, the way both host executors do: each thread
// claims the next id (or, with both_ends, every other thread the last) and reuses its own
// scratch buffers.
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

  // Runs work() on the calling thread and on up to `helpers` (<= size()) helper threads, and
  // returns when all that joined have returned. A helper joins only while the caller is still
  // in work(): once it returns the job is closed, so a helper that wakes late (milliseconds on a
  // VM whose idle vCPU was halted) skips it instead of holding up the call. work() must
  // therefore leave nothing undone that only a helper would do (RunWorkgroups's claim loop).
  // False (nothing run) when the pool is busy or this is a forked child.
  bool TryRun(unsigned helpers, const std::function<void()>& work) {
    if (getpid() != pid_) return false;
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    helpers = std::min<unsigned>(helpers, static_cast<unsigned>(threads_.size()));
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = &work;
      wanted_ = helpers;
      running_ = 0;
      ++generation_;
    }
    wake_.notify_all();
    work();
    std::unique_lock<std::mutex> lock(mutex_);
    job_ = nullptr;  // closed: no helper joins from here on
    done_.wait(lock, [&] { return running_ == 0; });
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
        if (index >= wanted_ || job_ == nullptr) continue;  // not asked, or already closed
        job = job_;
        ++running_;
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
// boundary). both_ends: every other thread claims ids from the last down instead of from the
// first up, so that each thread's consecutive ids are neighbours (the split executor keeps a
// sequence's Q between its splits) while threads still take what is left as they finish.
template <typename Scratch, typename Run>
bool RunWorkgroups(std::int64_t count, unsigned max_threads, const Run& run,
                   bool both_ends = false) {
  unsigned threads = max_threads ? max_threads : HostThreads();
  threads = static_cast<unsigned>(
      std::clamp<std::int64_t>(threads, 1, std::max<std::int64_t>(count, 1)));
  both_ends = both_ends && count < (std::int64_t{1} << 31);
  // Unclaimed ids [front, back), front in the high half: one compare-and-swap claims either end.
  std::atomic<std::uint64_t> ends{static_cast<std::uint64_t>(std::max<std::int64_t>(count, 0))};
  std::atomic<std::int64_t> next{0};
  std::atomic<unsigned> workers{0};
  std::atomic<bool> failed{false};
  auto claim = [&](bool from_back) -> std::int64_t {
    if (!both_ends) return next.fetch_add(1);
    std::uint64_t v = ends.load();
    for (;;) {
      const std::uint64_t front = v >> 32, back = v & 0xFFFFFFFFu;
      if (front >= back) return count;
      const std::uint64_t claimed = from_back ? (front << 32) | (back - 1) : ((front + 1) << 32) | back;
      if (ends.compare_exchange_weak(v, claimed)) {
        return static_cast<std::int64_t>(from_back ? back - 1 : front);
      }
    }
  };
  auto worker = [&] {
    try {
      const bool from_back = workers.fetch_add(1) % 2 == 1;
      thread_local std::unique_ptr<Scratch> kept;
      if (!kept) kept = std::make_unique<Scratch>();
      for (std::int64_t id = claim(from_back); id < count && !failed.load();
           id = claim(from_back)) {
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
