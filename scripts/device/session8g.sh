#!/usr/bin/env bash
# Session 8 (1 GPU, ~1 min): batch invariance on the tiny model and the synthetic 20b in both gemm
# precisions, after gemm_act's rms norm was made linear_stage_x's bit for bit.
source "$(dirname "$0")/common.sh"
synth20b
XSERV_20B_CKPT=/tmp/g20 timeout 150 $B/engine_gpu_tests -tc="*batch invariance*" > "$OUT/inv.log" 2>&1
echo "rc=$?"
grep -h "batch invariance (\|ERROR" "$OUT/inv.log" | sed 's/.*MESSAGE: //' | head -8
echo "done in $((SECONDS - start)) s"
