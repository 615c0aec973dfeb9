#!/usr/bin/env bash
# Builds xserv and runs the whole test suite. GPU tests (label `gpu`) skip cleanly without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
cd build
ctest --output-on-failure -j "${XSERV_JOBS:-$(nproc)}" "$@"
