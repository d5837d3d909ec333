#!/usr/bin/env bash
# Builds the C++ extension in place (build/dev) and copies it next to the Python package, so
# `PYTHONPATH=src pytest` runs against the working tree without reinstalling.
# Usage: tools/dev_build.sh [extra cmake -D options], e.g. -DJAX_MLA_SANITIZE=address,undefined
set -euo pipefail
cd "$(dirname "$0")/.."
build=${JAX_MLA_BUILD_DIR:-build/dev}
py=${PYTHON:-python}
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-Release} \
  -DPython_EXECUTABLE="$(command -v "$py")" \
  -Dpybind11_DIR="$("$py" -m pybind11 --cmakedir)" "$@" >/dev/null
cmake --build "$build" -j 2
cp "$build"/_ext*.so src/jax_mla/
