#include "host/cpu_info.h"

#include <fstream>
#include <string>
#include <thread>

#if defined(__linux__)
#include <sched.h>
#include <unistd.h>
#endif

namespace jax_mla::host {
namespace {

unsigned ReadThreads() {
#if defined(__linux__)
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int count = CPU_COUNT(&set);
    if (count > 0) return static_cast<unsigned>(count);
  }
#endif
  const unsigned n = std::thread::hardware_concurrency();
  return n > 0 ? n : 1;
}

std::int64_t ReadL2() {
#if defined(__linux__) && defined(_SC_LEVEL2_CACHE_SIZE)
  const long bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (bytes > 0) return bytes;
#endif
#if defined(__linux__)
  // sysfs: "1024K"
  std::ifstream f("/sys/devices/system/cpu/cpu0/cache/index2/size");
  std::string text;
  if (f >> text && !text.empty()) {
    std::int64_t value = 0;
    std::size_t i = 0;
    for (; i < text.size() && text[i] >= '0' && text[i] <= '9'; ++i) value = value * 10 + (text[i] - '0');
    if (i < text.size() && (text[i] == 'K' || text[i] == 'k')) value <<= 10;
    if (i < text.size() && (text[i] == 'M' || text[i] == 'm')) value <<= 20;
    if (value > 0) return value;
  }
#endif
  return std::int64_t{512} << 10;
}

}  // namespace

unsigned HostThreads() {
  static const unsigned threads = ReadThreads();
  return threads;
}

std::int64_t L2CacheBytes() {
  static const std::int64_t bytes = ReadL2();
  return bytes;
}

}  // namespace jax_mla::host
