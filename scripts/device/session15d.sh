#!/usr/bin/env bash
# Session 15, call 2 (1 GPU, ~6 min): no combine launches in decode steps. Decode attention's
# last split of each (token, kv head) merges the others, and the tensor-core MoE down rows' last
# block of each (token, row block) adds the slots (+ the residual), both with block_arrive_last
# counters; o_proj's rows resident in shared memory (15c) then stream during attention itself.
# The changed kernels' GPU tests, old (b086909) against new, the engine GPU tests, then the
# timeline of the new plan. Needs .device/bin/{xserv,codegen_gpu_tests,engine_gpu_tests},
# .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
RUN_TIMEOUT=200 run_tests codegen_gpu_tests \
  -tc="linear_decode_smem*,attention kernels match*,tensor-core MoE decode*,decode attention with ROUND16*"
synth20b
ab_compile
$X compile /tmp/g20 -o /tmp/p_tl --max-seq 8192 --max-batch 64 --timeline > /tmp/c_tl.log 2>&1
$X inspect /tmp/p_new | grep -iE "launches" | head -2
ab_tokens 64
ab_decode 2
ab_batch 8
for args in "-b 1 -d 0" "-b 1 -d 4096"; do
  echo "== timeline $args"
  timeout 100 $X bench /tmp/p_tl --backend cuda -p 0 -n 128 $args -r 1 2> "$OUT/tl.log" |
    grep -E "tg" | cut -d'|' -f6,7
  grep -E "^\[timeline\]" "$OUT/tl.log" | head -14
  cp "$OUT/tl.log" "$OUT/tl_${args// /}.log"
done
engine_tests
echo "done in $((SECONDS - start)) s"
