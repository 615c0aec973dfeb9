#!/usr/bin/env bash
# A closing call on nvidia-h200 (one GPU; the two-GPU cases skip): every GPU test binary (the
# tightened tolerances of session 6 included), then hf20b.sh (the 20b against HF transformers).
# Carry [".device/bin", ".device/data"]; .device/bin holds xserv and {cli,codegen,runtime,
# engine}_gpu_tests. Logs land in $OUT.
source "$(dirname "$0")/common.sh"
export LD_LIBRARY_PATH=$PWD/$B:$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
for t in ${TESTS-codegen_gpu_tests cli_gpu_tests runtime_gpu_tests engine_gpu_tests}; do
  run_tests $t ${TEST_ARGS:-}
done
grep -hE "measured|worst|bitwise|relative L2" "$OUT"/*_gpu_tests.log | head -30
echo "== tests done at $((SECONDS - start)) s"
[ -n "${SKIP_HF:-}" ] || bash scripts/device/hf20b.sh 2>&1 | tail -14
echo "== done at $((SECONDS - start)) s"
