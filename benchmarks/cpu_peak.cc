// The CPU's arithmetic peak as the host kernels can use it: f32 FMAs (AVX2, 8 lanes) and, where
// the CPU has AVX512-BF16, VDPBF16PS (16 lanes of two bf16 products each), on one thread and on
// every CPU of the process at once. 12 independent accumulators per thread, no memory traffic.
//
// Build and run: g++ -O2 -pthread benchmarks/cpu_peak.cc -o /tmp/cpu_peak && /tmp/cpu_peak
// FLOPs: an FMA lane is 2, a VDPBF16PS lane 4 (two products, two adds). Other work on the machine
// lowers the all-threads figures: run it when the machine is otherwise idle, or read the
// one-thread figure times the CPU count as the peak.
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>

#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

namespace {

constexpr long kIterations = 40'000'000;

__attribute__((target("avx2,fma"))) float FmaLoop() {
  __m256 a[12];
  const __m256 b = _mm256_set1_ps(0.999f), c = _mm256_set1_ps(0.001f);
  for (int i = 0; i < 12; ++i) a[i] = _mm256_set1_ps(static_cast<float>(i));
  for (long n = 0; n < kIterations; ++n) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm256_fmadd_ps(a[i], b, c);
  }
  __m256 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm256_add_ps(s, a[i]);
  return s[0];
}
constexpr double kFmaFlops = 12.0 * 8 * 2 * kIterations;

__attribute__((target("avx512f,avx512bf16"))) float DotLoop() {
  __m512 a[12];
  const __m512bh b = (__m512bh)_mm512_set1_epi16(0x3f80);
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(static_cast<float>(i));
  for (long n = 0; n < kIterations; ++n) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm512_dpbf16_ps(a[i], b, b);
  }
  __m512 s = a[0];
  for (int i = 1; i < 12; ++i) s = _mm512_add_ps(s, a[i]);
  return s[0];
}
constexpr double kDotFlops = 12.0 * 16 * 4 * kIterations;

double GflopsOn(unsigned threads, float (*loop)(), double flops_per_thread) {
  std::vector<std::thread> pool;
  std::vector<float> sink(threads);
  const auto start = std::chrono::steady_clock::now();
  for (unsigned t = 0; t < threads; ++t) pool.emplace_back([&, t] { sink[t] = loop(); });
  for (auto& t : pool) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return threads * flops_per_thread / seconds / 1e9;
}

}  // namespace

int main() {
  cpu_set_t set;
  CPU_ZERO(&set);
  sched_getaffinity(0, sizeof(set), &set);
  const unsigned cpus = static_cast<unsigned>(CPU_COUNT(&set));
  __builtin_cpu_init();
  std::printf("CPUs: %u\n", cpus);
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    std::printf("f32 FMA (AVX2):   1 thread %.1f GFLOP/s, %u threads %.1f GFLOP/s\n",
                GflopsOn(1, FmaLoop, kFmaFlops), cpus, GflopsOn(cpus, FmaLoop, kFmaFlops));
  }
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16")) {
    std::printf("VDPBF16PS (zmm):  1 thread %.1f GFLOP/s, %u threads %.1f GFLOP/s\n",
                GflopsOn(1, DotLoop, kDotFlops), cpus, GflopsOn(cpus, DotLoop, kDotFlops));
  }
  return 0;
}
