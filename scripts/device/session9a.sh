#!/usr/bin/env bash
# Session 9, first call (1 GPU, ~7 min): batch invariance of the 20b in both gemm precisions
# after gemm_act's plain-bf16 norm change; what a 64-sequence decode step costs at the serving
# run's depth (512-768 cached positions) against B64's (1-129), with an fp32 and a bf16 KV cache,
# and a per-op profile of it; the serving benchmark (256 x 512 + 256 at concurrency 64, and 8 at
# concurrency 1) on both caches and under a larger token budget. Needs .device/bin/{xserv,
# engine_gpu_tests}, .device/data.
source "$(dirname "$0")/common.sh"
synth20b
$X compile /tmp/g20 -o /tmp/p64 --max-seq 8192 --max-batch 64 > "$OUT/c64.log" 2>&1 &
$X compile /tmp/g20 -o /tmp/p64kv --max-seq 8192 --max-batch 64 --kv-dtype bf16 \
  > "$OUT/c64kv.log" 2>&1 &
wait
tail -1 "$OUT/c64.log"
echo "== compiled at $((SECONDS - start)) s"
XSERV_20B_CKPT=/tmp/g20 timeout 150 $B/engine_gpu_tests -tc="*batch invariance*" \
  > "$OUT/inv.log" 2>&1
echo "invariance rc=$?"
grep -h "batch invariance (\|ERROR\|CHECK" "$OUT/inv.log" | sed 's/.*MESSAGE: //' | head -12
echo "== decode depth at $((SECONDS - start)) s"
for p in p64 p64kv; do
  echo "-- $p"
  timeout 120 $X bench /tmp/$p --backend cuda -p 0 -n 64 -b 1,64 -d 0,640 -r 1 2> /dev/null |
    grep -E "tg" | cut -d'|' -f6,7,8,11
done
XSERV_PROFILE=1 timeout 100 $X bench /tmp/p64 --backend cuda -p 0 -n 16 -b 64 -d 640 -r 1 \
  > "$OUT/profile_d640.log" 2>&1
grep -E "^\||profile|ms" "$OUT/profile_d640.log" | head -40
echo "== serving at $((SECONDS - start)) s"
W="--requests 256 --concurrency 64 --input-len 512 --output-len 256"
show() { grep -E "output token|TTFT (median|p99)|TPOT (median|p99)|ITL p99|engine steps|host share" "$1" | cut -c1-90 | tr '\n' ' '; echo; }
i=0
for v in "p64" "p64kv" "p64 --max-tokens-per-step 4096" "p64 --max-tokens-per-step 8192"; do
  set -- $v
  p=$1; shift; i=$((i + 1))
  echo "-- $p $*"
  timeout 120 $X bench /tmp/$p --backend cuda $W "$@" > "$OUT/serve$i.md" 2> /dev/null
  show "$OUT/serve$i.md"
  [ $# -eq 0 ] && timeout 120 $X bench /tmp/$p --backend cuda -p 512 -n 128 -b 64 -r 1 \
    2> /dev/null | grep -E "pp|tg" | cut -d'|' -f6,7,8 | tr '\n' ' ' && echo
done
timeout 60 $X bench /tmp/p64 --backend cuda --requests 8 --concurrency 1 --input-len 512 \
  --output-len 256 2> /dev/null | grep -E "output token|TPOT (median|p99)|TTFT (median)" | tr '\n' ' '
echo
echo "done in $((SECONDS - start)) s"
