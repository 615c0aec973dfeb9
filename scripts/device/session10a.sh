#!/usr/bin/env bash
# Next session's first call (1 GPU, ~4 min), written at the end of session 9 when the device time
# ran out: issue 15's serving bar under the faster gemms. Session 9's last measurement (9g) put the
# serving run (256 x 512 + 256 at concurrency 64) at 5,026 output tok/s against a no-overlap
# ideal of 5,043 from the same call's rows: its decode steps read 512-768 cached positions and
# run ~10% slower than the B64 row's. Measured here, each with the same call's pp512 and B64
# rows: the engine's token budget (2048 default; vLLM's default on large GPUs is 8192) and a
# bf16 KV cache (attention now reads its bytes at 2.7 TB/s with one split at 64 sequences).
# First, kernels_bench's router tile variants (issue 17: the router's 2880 -> 32 gemm runs as 4
# blocks at 512 tokens) and cuBLAS against gemm_wg on the dense projections (issue 17 item 2). Needs .device/bin/{xserv,kernels_bench}, .device/data.
source "$(dirname "$0")/common.sh"
timeout 150 $B/kernels_bench -tc="router gemm tiles*,dense gemms: cuBLAS*" > "$OUT/router.log" 2>&1
echo "router tiles and cuBLAS rc=$?"
grep -h "gemm dense" "$OUT/router.log" | sed 's/.*MESSAGE: //'
synth20b
$X compile /tmp/g20 -o /tmp/p64 --max-seq 8192 --max-batch 64 > "$OUT/c64.log" 2>&1 &
$X compile /tmp/g20 -o /tmp/p64kv --max-seq 8192 --max-batch 64 --kv-dtype bf16 \
  > "$OUT/c64kv.log" 2>&1 &
wait
W="--requests 256 --concurrency 64 --input-len 512 --output-len 256"
show() { grep -E "output token|TTFT (median|p99)|TPOT (median|p99)" "$1" | cut -c1-80 | tr '\n' ' '; echo; }
for p in p64 p64kv; do
  echo "-- $p rows"
  timeout 120 $X bench /tmp/$p --backend cuda -p 512 -n 128 -b 64 -d 0,640 -r 2 2> /dev/null |
    grep -E "pp|tg" | cut -d'|' -f6,7,8,11
  for budget in 2048 4096 8192; do
    echo "-- $p, --max-tokens-per-step $budget"
    timeout 120 $X bench /tmp/$p --backend cuda $W --max-tokens-per-step $budget \
      > "$OUT/serve_${p}_$budget.md" 2> /dev/null
    show "$OUT/serve_${p}_$budget.md"
  done
done
echo "done in $((SECONDS - start)) s"
