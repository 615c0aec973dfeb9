#!/usr/bin/env bash
# Session 9 (1 GPU, ~1 min): gemm_wg's dense GPU test in full (every variant now checked against
# gemm_wg_fits first). Needs .device/bin/codegen_gpu_tests.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="gemm_wg dense*"
echo "$(grep -c "rel L2" "$OUT/codegen_gpu_tests.log") variants"
grep "rel L2" "$OUT/codegen_gpu_tests.log" | sed 's/.*MESSAGE: //' | tail -14
