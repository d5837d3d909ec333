// What the host backend plans with on the CPU it runs on: how many threads it may use (the
// process's CPU affinity, not the machine's core count), the per-core L2 cache, and which
// instruction set the attention kernels run with.
#ifndef JAX_MLA_HOST_CPU_INFO_H_
#define JAX_MLA_HOST_CPU_INFO_H_

#include <cstdint>

namespace jax_mla::host {

// CPUs this process may run on (sched_getaffinity), at least 1. Read once.
unsigned HostThreads();

// Per-core L2 cache in bytes (sysconf, else sysfs), or 512 KiB when neither says. Read once.
std::int64_t L2CacheBytes();

}  // namespace jax_mla::host

#endif  // JAX_MLA_HOST_CPU_INFO_H_
