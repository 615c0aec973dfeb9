#!/usr/bin/env bash
# Session 16, call 3 (1 GPU, ~4 min): one-token steps run the MoE down rows with a 3-chunk ring
# (kMoeDownStagesOneToken), old (4c51153) against new: greedy tokens, the batch-1 rows twice,
# batch 8, the new plan's timeline at depth 0 and 4096; the tensor-core MoE GPU test and the
# engine GPU tests. Needs .device/bin/{xserv,codegen_gpu_tests,engine_gpu_tests},
# .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
synth20b
ab_compile
$X compile /tmp/g20 -o /tmp/p_tl_new --max-seq 8192 --max-batch 64 --timeline > /tmp/c_tl.log 2>&1 &
ab_tokens 64
ab_decode 2
ab_batch 8
wait
for args in "-b 1 -d 0" "-b 1 -d 4096"; do
  echo "== new timeline $args"
  timeout 100 $X bench /tmp/p_tl_new --backend cuda -p 0 -n 128 $args -r 1 2> "$OUT/tl.log" |
    grep -E "tg" | cut -d'|' -f6,7
  grep -E "^\[timeline\]" "$OUT/tl.log" | sed -n '1p;3,13p' | cut -c1-118
  cp "$OUT/tl.log" "$OUT/tl_${args// /}.log"
done
RUN_TIMEOUT=240 run_tests codegen_gpu_tests -tc="*tensor-core MoE decode*"
engine_tests
echo "done in $((SECONDS - start)) s"
