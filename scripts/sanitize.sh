#!/usr/bin/env bash
# The hostile-input tests under ASan + UBSan: configures build-asan with -DXSERV_SANITIZE=ON
# (only the ir, models and runtime libraries, tests' hostile_tests and the fuzz corpus replays;
# no xserv binary, no CUDA code beyond what the runtime library compiles), builds it and runs its
# ctest. scripts/test.sh calls it after the main suite; extra arguments go to ctest.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${XSERV_JOBS:-$(nproc)}
if [ ! -f build-asan/build.ninja ]; then
  # -O1: what ASan is usually run at; it compiles about twice as fast as Release's -O3.
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE=-O1 \
    -DXSERV_SANITIZE=ON -DCUDAToolkit_ROOT=/usr/local/cuda >/dev/null
fi
echo "[sanitize] building the hostile-input tests with ASan + UBSan ($jobs jobs)"
cmake --build build-asan -j "$jobs"
cd build-asan
# A sanitizer report ends the process (-fno-sanitize-recover, halt_on_error) and fails the test.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:halt_on_error=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --output-on-failure -j "$jobs" "$@"
