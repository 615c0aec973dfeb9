#!/usr/bin/env bash
# A short closing call (nvidia-h200-x2): the plan-replay and CUDA-pipeline GPU tests, then the
# synthetic 20b run from its plan (launch table + cubins replayed) with the decode bench rows,
# and --pp 2 over two GPUs (greedy ids from the last rank) against --pp 1. Needs
# .device/bin/{xserv,cli_gpu_tests} and .device/data/gpt-oss-20b.json (carry [".device/bin",
# ".device/data"]). Logs land in $OUT.
source "$(dirname "$0")/common.sh"
run_tests cli_gpu_tests -tc="gpu: a plan*,gpu: pp 2*"
grep -E "MESSAGE" -A1 "$OUT/cli_gpu_tests.log" | head -16
$X synth --config .device/data/gpt-oss-20b.json -o /tmp/g20 --seed 0 2>&1 | tail -1
$X compile /tmp/g20 -o /tmp/p64 --max-seq 8192 --max-batch 64 2>&1 | tail -1
CUDA_VISIBLE_DEVICES=0 timeout 120 $X bench /tmp/p64 --backend cuda -p 512 -n 128 -b 1 -r 2 2> "$OUT/bench.err" | tail -2
grep -E "launch table|lowering" "$OUT/bench.err" | head -2
CUDA_VISIBLE_DEVICES=0 timeout 120 $X bench /tmp/p64 --backend cuda -p 0 -n 32 -b 64 -r 2 2> /dev/null | tail -1
for pp in 1 2; do
  flags=""; [ "$pp" -gt 1 ] && flags="--pp $pp"
  $X compile /tmp/g20 -o /tmp/pp$pp --max-seq 4096 --max-batch 32 $flags 2>&1 | tail -1
  timeout 120 $X run /tmp/pp$pp --backend cuda --prompt-ids "$(seq -s, 1000 37 2800)" \
    --max-tokens 64 > "$OUT/pp$pp.txt" 2> "$OUT/pp$pp.err"
  echo "pp$pp rc=$? $(grep -E '^\[run\]' "$OUT/pp$pp.err" | tail -1)"
done
cmp -s "$OUT/pp1.txt" "$OUT/pp2.txt" && echo "pp2 gives pp1's 64 tokens" || echo "pp2 DIFFERS from pp1"
timeout 150 $X bench /tmp/pp2 --backend cuda -p 512 -n 32 -b 1,32 -r 1 2> /dev/null | tail -3
echo "== done at $((SECONDS - start)) s"
