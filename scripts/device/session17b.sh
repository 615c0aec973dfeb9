#!/usr/bin/env bash
# Session 17, call 2 (1 GPU, ~5 min): one-token steps run qkv with its weights resident in
# shared memory (qkv_rope_decode_smem), old (6d3ca8a) against new: greedy tokens, the batch-1
# rows twice, batch 8, the new plan's timeline at depth 0 and 4096; the qkv GPU tests and the
# engine GPU tests; then Nsight's per-instruction stall samples of moe_gate_up (17a's page did
# not come back). Needs .device/bin/{xserv,codegen_gpu_tests,engine_gpu_tests}, .device/old/xserv,
# .device/data.
source "$(dirname "$0")/common.sh"
synth20b
ab_round
RUN_TIMEOUT=240 run_tests codegen_gpu_tests -tc="*qkv_rope_decode*"
engine_tests
XSERV_CUDA_GRAPHS=0 timeout 200 ncu --clock-control none --cache-control none \
  --kernel-name "regex:moe_gate_up" --launch-skip 60 --launch-count 1 --warp-sampling-interval 0 \
  --section WarpStateStats --section SourceCounters --export /tmp/ncu_gu \
  $X bench /tmp/p_new --backend cuda -p 0 -n 8 -b 1 -d 0 -r 1 > /tmp/ncu_gu.txt 2>&1
echo "ncu rc=$?"
ncu --import /tmp/ncu_gu.ncu-rep --page source --print-source sass --csv > "$OUT/sass_gate_up.csv" 2>&1
echo "done in $((SECONDS - start)) s"
