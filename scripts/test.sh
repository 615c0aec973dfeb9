#!/usr/bin/env bash
# Builds xserv and runs the whole test suite (arguments go to its ctest), then the hostile-input
# tests under ASan + UBSan (scripts/sanitize.sh). GPU tests (label `gpu`) skip cleanly without a
# GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
# The `xserv serve` tests with the official openai client and with jsonschema (tests/server/) skip
# without them: small installs, only when missing; a failure (offline) leaves those tests
# skipped.
python3 -c 'import openai' 2>/dev/null ||
  python3 -m pip install --quiet openai >/dev/null 2>&1 ||
  echo "[test] could not pip install openai: the openai client test will be skipped"
# The structured-output test validates outputs with jsonschema, an independent validator.
python3 -c 'import jsonschema' 2>/dev/null ||
  python3 -m pip install --quiet jsonschema >/dev/null 2>&1 ||
  echo "[test] could not pip install jsonschema: the structured-output schema test will be skipped"
(cd build && ctest --output-on-failure -j "${XSERV_JOBS:-$(nproc)}" "$@")
# The hostile-input tests again, under ASan + UBSan, in their own small build (build-asan).
./scripts/sanitize.sh
