#!/usr/bin/env bash
# Session 9, the measured call (1 GPU, ~6 min): attention_decode's splits cut for steps of many
# tokens (runtime::attention_step_splits). The GPU tests of engine, cli and runtime; then the old
# binary (.device/old/xserv, HEAD before the change) against the new one in one call: the bench
# rows, B64 at the serving run's depth (640), the serving benchmark at concurrency 64 (with the
# same call's pp512 and B64 rows for the no-overlap ideal) and 1; batch invariance of the 20b.
# Needs .device/bin/{xserv,engine_gpu_tests,cli_gpu_tests,runtime_gpu_tests}, .device/old/xserv,
# .device/data.
source "$(dirname "$0")/common.sh"
run_tests engine_gpu_tests
run_tests runtime_gpu_tests
run_tests cli_gpu_tests -tce="*synthetic 20b*"
synth20b
OLD=.device/old/xserv
$OLD compile /tmp/g20 -o /tmp/p_old --max-seq 8192 --max-batch 64 > "$OUT/c_old.log" 2>&1 &
$X compile /tmp/g20 -o /tmp/p_new --max-seq 8192 --max-batch 64 > "$OUT/c_new.log" 2>&1 &
wait
echo "== compiled at $((SECONDS - start)) s"
for v in old new; do
  bin=$X; [ $v = old ] && bin=$OLD
  echo "-- $v"
  timeout 150 $bin bench /tmp/p_$v --backend cuda -p 512,2048 -n 128 -b 1,64 -r 2 2> /dev/null |
    grep -E "pp|tg" | cut -d'|' -f6,7,8,11
  timeout 150 $bin bench /tmp/p_$v --backend cuda -p 0 -n 128 -b 1,64 -d 640,4096 -r 1 \
    2> /dev/null | grep -E "tg" | cut -d'|' -f6,7,8,11
done
echo "== serving at $((SECONDS - start)) s"
show() { grep -E "output token|TTFT (median|p99)|TPOT (median|p99)|ITL p99|host share" "$1" | cut -c1-80 | tr '\n' ' '; echo; }
for v in old new; do
  bin=$X; [ $v = old ] && bin=$OLD
  echo "-- $v"
  timeout 120 $bin bench /tmp/p_$v --backend cuda --requests 256 --concurrency 64 \
    --input-len 512 --output-len 256 > "$OUT/serve_$v.md" 2> /dev/null
  show "$OUT/serve_$v.md"
  timeout 60 $bin bench /tmp/p_$v --backend cuda --requests 8 --concurrency 1 --input-len 512 \
    --output-len 256 > "$OUT/serve1_$v.md" 2> /dev/null
  show "$OUT/serve1_$v.md"
done
echo "== batch invariance at $((SECONDS - start)) s"
XSERV_20B_CKPT=/tmp/g20 timeout 150 $B/engine_gpu_tests -tc="*batch invariance*" \
  > "$OUT/inv.log" 2>&1
echo "invariance rc=$?"
grep -h "batch invariance (" "$OUT/inv.log" | sed 's/.*MESSAGE: //'
echo "done in $((SECONDS - start)) s"
