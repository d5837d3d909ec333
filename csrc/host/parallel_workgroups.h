// Runs a grid's workgroups on the host's cores, the way both host executors do: each thread
// claims the next workgroup id from an atomic counter and reuses its own scratch buffers.
#ifndef JAX_MLA_HOST_PARALLEL_WORKGROUPS_H_
#define JAX_MLA_HOST_PARALLEL_WORKGROUPS_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

#include "host/cpu_info.h"

namespace jax_mla::host {

// Calls run(id, scratch) for every id in [0, count) on up to max_threads threads (0: one per
// CPU this process may use, HostThreads()), the calling thread included, each with its own default-constructed Scratch. Starts fewer
// threads when the system refuses more. Returns false when a call or a scratch allocation threw:
// the remaining ids are then skipped (no exception escapes a thread or the FFI boundary).
template <typename Scratch, typename Run>
bool RunWorkgroups(std::int64_t count, unsigned max_threads, const Run& run) {
  unsigned threads = max_threads ? max_threads : HostThreads();
  threads = static_cast<unsigned>(
      std::clamp<std::int64_t>(threads, 1, std::max<std::int64_t>(count, 1)));
  std::atomic<std::int64_t> next{0};
  std::atomic<bool> failed{false};
  auto worker = [&] {
    try {
      Scratch scratch;
      for (std::int64_t id = next.fetch_add(1); id < count && !failed.load();
           id = next.fetch_add(1)) {
        run(id, scratch);
      }
    } catch (...) {
      failed.store(true);
    }
  };
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
