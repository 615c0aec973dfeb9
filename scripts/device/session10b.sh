#!/usr/bin/env bash
# Session 10 (1 GPU, ~6 min): prompt-step attention on tensor cores (attention_mma.cuh, plain
# bf16 plans) and the router's split-K gemm at prompt steps. The kernels' GPU tests (against
# ir::ref; the informational times next to the SIMT kernel), the engine and cli GPU tests; then
# the old binary (.device/old/xserv, HEAD 10edade) against the new one in one call: pp512 /
# pp2048 / tg128, B64 for the no-overlap ideal, and the serving run at concurrency 64 (the new
# default token budget 8192 on both: --max-tokens-per-step passed explicitly); batch invariance
# of the 20b. Needs .device/bin/{xserv,codegen_gpu_tests,engine_gpu_tests,cli_gpu_tests},
# .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="*prefill attention*,gemm_wg dense*"
grep -E "time " "$OUT/codegen_gpu_tests.log" | sed 's/.*MESSAGE: //'
grep -E "attention_prefill_mma.*to exact" "$OUT/codegen_gpu_tests.log" | sed 's/.*rel L2 //' |
  awk '{r = $1 > r ? $1 : r; x = $5 > x ? $5 : x; n++} END {print n, "mma cases, worst rel L2: rounded", r, "exact", x}'
grep -E "gemmwg.*n32.*splitk9" "$OUT/codegen_gpu_tests.log" | sed 's/.*MESSAGE: //'
run_tests engine_gpu_tests
run_tests cli_gpu_tests -tce="*synthetic 20b*"
synth20b
OLD=.device/old/xserv
$OLD compile /tmp/g20 -o /tmp/p_old --max-seq 8192 --max-batch 64 > "$OUT/c_old.log" 2>&1 &
$X compile /tmp/g20 -o /tmp/p_new --max-seq 8192 --max-batch 64 > "$OUT/c_new.log" 2>&1 &
wait
echo "== compiled at $((SECONDS - start)) s"
W="--requests 256 --concurrency 64 --input-len 512 --output-len 256 --max-tokens-per-step 8192"
show() { grep -E "output token|TTFT (median|p99)|TPOT (median|p99)" "$1" | cut -c1-80 | tr '\n' ' '; echo; }
for v in old new; do
  bin=$X; [ $v = old ] && bin=$OLD
  echo "-- $v"
  timeout 150 $bin bench /tmp/p_$v --backend cuda -p 512,2048 -n 128 -b 1,64 -r 2 2> /dev/null |
    grep -E "pp|tg" | cut -d'|' -f6,7,8,11
  timeout 120 $bin bench /tmp/p_$v --backend cuda $W > "$OUT/serve_$v.md" 2> /dev/null
  show "$OUT/serve_$v.md"
done
echo "== batch invariance at $((SECONDS - start)) s"
XSERV_20B_CKPT=/tmp/g20 timeout 150 $B/engine_gpu_tests -tc="*batch invariance*" \
  > "$OUT/inv.log" 2>&1
echo "rc=$?"; grep -E "MESSAGE|ERROR" -A2 "$OUT/inv.log" | grep -vE "^--$" | sed 's/.*MESSAGE: //' | head -20
echo "done in $((SECONDS - start)) s"
