#!/usr/bin/env bash
# Session 9 (1 GPU, ~2 min): gemm_wg's GPU tests in full after the K-tile change (the dense case
# had stopped at a variant that cannot fit shared memory), then hf20b.sh (both precisions).
# Needs .device/bin/{xserv,codegen_gpu_tests,cli_gpu_tests}, .device/data.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="*gemm_wg*"
grep -c "rel L2" "$OUT/codegen_gpu_tests.log"
bash scripts/device/hf20b.sh 2>&1 | grep -E "MESSAGE|rc=|positions|greedy" | grep -v Loading | sed 's/.*MESSAGE: //'
