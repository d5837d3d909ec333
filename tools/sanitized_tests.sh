#!/usr/bin/env bash
# Builds the C++ extension with AddressSanitizer + UBSan and runs the host-backend tests against
# it. Python is not instrumented, so the ASan runtime is preloaded; the sanitized .so goes into a
# copy of the sources (never beside the working tree's own .so) that PYTHONPATH points at.
# Usage: tools/sanitized_tests.sh [pytest args]   (default: the host-backend test files)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${JAX_MLA_BUILD_DIR:-build/asan}
py=${PYTHON:-python}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DPython_EXECUTABLE="$(command -v "$py")" \
  -Dpybind11_DIR="$("$py" -m pybind11 --cmakedir)" -DJAX_MLA_SANITIZE=address,undefined >/dev/null
cmake --build "$build" -j 2

# The copy keeps the checkout's layout (src/jax_mla beside hsa/ and tests/), so the package
# finds the manifest as it does in a checkout.
tree=$(mktemp -d)/checkout
mkdir -p "$tree/src"
cp -r hsa tests pyproject.toml "$tree"/
cp -r src/jax_mla "$tree"/src/
rm -f "$tree"/src/jax_mla/_ext*.so
cp "$build"/_ext*.so "$tree"/src/jax_mla/

if [ $# -eq 0 ]; then
  set -- tests/test_split_host.py tests/test_persistent_host.py tests/test_errors.py \
    tests/test_hip_launcher.py tests/test_persistent_hip.py tests/test_split_kernargs.py \
    tests/test_persistent_kernargs.py tests/test_persistent_workspace_use.py \
    tests/test_index_checks.py tests/test_large_pool.py tests/test_hip_faults.py \
    tests/test_fuzz.py::test_host_split tests/test_fuzz.py::test_host_split_fp32_kernels \
    tests/test_fuzz.py::test_host_persistent
  # A quarter of the fuzz's host cases (about 170): the instrumented extension is slower.
  export JAX_MLA_FUZZ_SCALE=${JAX_MLA_FUZZ_SCALE:-0.25}
fi
cd "$tree"
# CPU only: a PJRT plugin (libtpu, ...) dlopen'ed under the preloaded ASan runtime can abort.
export JAX_PLATFORMS=cpu
# libstdc++ is preloaded too: python does not link it, and without it ASan's __cxa_throw
# interceptor finds no real __cxa_throw and aborts on jaxlib's first C++ exception.
preload="$(gcc -print-file-name=libasan.so) $(gcc -print-file-name=libstdc++.so)"
# The extension must be the sanitized one, or this stage proves nothing.
LD_PRELOAD="$preload" ASAN_OPTIONS=detect_leaks=0 PYTHONPATH="$tree/src" "$py" -c '
import sys, jax_mla._src.ext as e
m = e.extension()
print("== sanitized extension:", m.__file__)
sys.exit(0 if m.__file__.startswith(sys.argv[1]) else 1)' "$tree"
# A report halts the process (a crashed test, or a crashed xdist worker, fails the run). pytest
# captures at the Python level only (--capture=sys): the sanitizers write to fd 2, and with fd
# capture their report was lost with the process (log_path wrote no file with the preloaded
# runtime either).
LD_PRELOAD="$preload" \
  ASAN_OPTIONS=detect_leaks=0:halt_on_error=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  PYTHONPATH="$tree/src" "$py" -m pytest -q -p no:cacheprovider --capture=sys "$@"
