#!/usr/bin/env bash
# Session 11, call 7 (1 GPU, ~2 min): decode attention and the router, after the GEMVs (call 6),
# issue their first loads (cached keys and values; router weights) before griddepcontrol.wait.
# Old binary (.device/old/xserv: HEAD 24291f8) against new on the
# 20b: decode rows at depth 0 and 4096, B64, pp512, greedy tokens; the engine GPU tests and the
# decode kernel tests. Needs .device/bin/{xserv,codegen_gpu_tests,engine_gpu_tests},
# .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
synth20b
OLD=.device/old/xserv
$OLD compile /tmp/g20 -o /tmp/p_old --max-seq 8192 --max-batch 64 > /tmp/c_old.log 2>&1 &
$X compile /tmp/g20 -o /tmp/p_new --max-seq 8192 --max-batch 64 > /tmp/c_new.log 2>&1 &
wait
tail -1 /tmp/c_new.log
for round in 1 2; do
  for v in old new; do
    bin=$X; [ $v = old ] && bin=$OLD
    echo "-- $v (round $round)"
    timeout 100 $bin bench /tmp/p_$v --backend cuda -p 0 -n 128 -b 1 -d 0,4096 -r 2 2> /dev/null |
      grep -E "tg" | cut -d'|' -f6,7,8,11
  done
done
for v in old new; do
  bin=$X; [ $v = old ] && bin=$OLD
  echo "-- $v pp512, B64"
  timeout 100 $bin bench /tmp/p_$v --backend cuda -p 512 -n 128 -b 64 -r 2 2> /dev/null |
    grep -E "pp|tg" | cut -d'|' -f6,7,8,11
  timeout 60 $bin run /tmp/p_$v --backend cuda --prompt-ids "$(seq -s, 1000 37 8000)" \
    --max-tokens 64 > /tmp/tok_$v.txt 2> /dev/null
done
cmp -s /tmp/tok_old.txt /tmp/tok_new.txt && echo "greedy tokens old/new: equal" || echo "greedy tokens old/new: differ"
echo "== tests at $((SECONDS - start)) s"
run_tests engine_gpu_tests
grep -E "batch invariance \(" "$OUT/engine_gpu_tests.log" | sed 's/.*MESSAGE: //'
run_tests codegen_gpu_tests -tc="*decode attention*,*router*,attention kernels*,*rms_norm*"
echo "done in $((SECONDS - start)) s"
