#!/usr/bin/env bash
# Session 10 (1 GPU, ~4 min): the tensor-core prompt attention weighs with p as an fp16 pair
# (hi + lo), the decode kernel's ROUND16 rounds q, k and v only. The attention GPU tests (with the
# informational times), the engine GPU tests with the 20b's batch invariance, the new binary's
# prompt and decode rows. Needs .device/bin/{xserv,codegen_gpu_tests,engine_gpu_tests},
# .device/data.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="*attention*"
grep -E "decode against tensor-core|time attention_prefill_mma" "$OUT/codegen_gpu_tests.log" |
  sed 's/.*MESSAGE: //' | head -16
grep -E "attention_prefill_mma.*to exact" "$OUT/codegen_gpu_tests.log" | sed 's/.*rel L2 //' |
  awk '{r = $1 > r ? $1 : r; x = $5 > x ? $5 : x; n++} END {print n, "mma cases, worst rel L2: rounded", r, "exact", x}'
synth20b
XSERV_20B_CKPT=/tmp/g20 run_tests engine_gpu_tests
grep -E "batch invariance \(" "$OUT/engine_gpu_tests.log" | sed 's/.*MESSAGE: //'
$X compile /tmp/g20 -o /tmp/p_new --max-seq 8192 --max-batch 64 > /tmp/c_new.log 2>&1
echo "== compiled at $((SECONDS - start)) s"
timeout 100 $X bench /tmp/p_new --backend cuda -p 512,2048 -n 128 -b 1 -r 2 2> /dev/null |
  grep -E "pp|tg" | cut -d'|' -f6,7,8,11
timeout 100 $X bench /tmp/p_new --backend cuda -p 0 -n 128 -b 1 -d 4096 -r 1 2> /dev/null |
  grep -E "tg" | cut -d'|' -f6,7,8,11
echo "done in $((SECONDS - start)) s"
