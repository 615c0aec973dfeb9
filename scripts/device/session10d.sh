#!/usr/bin/env bash
# Session 10 (1 GPU, ~7 min): the running max of both fp16-weight attention kernels as a whole
# power of two (softmax_ref_log2 in attention.cuh), so that decode and prompt steps round a
# token's weights alike. The attention GPU tests, the engine GPU tests with the 20b's batch
# invariance, old binary (.device/old/xserv, HEAD 10edade) against new on the decode and prompt
# rows, then hf20b.sh (logs of it under /tmp/hf, the test's log copied). Needs
# .device/bin/{xserv,codegen_gpu_tests,engine_gpu_tests,cli_gpu_tests}, .device/old/xserv,
# .device/data.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="*attention*"
grep -E "decode against tensor-core" "$OUT/codegen_gpu_tests.log" | sed 's/.*MESSAGE: //' | head -12
synth20b
XSERV_20B_CKPT=/tmp/g20 run_tests engine_gpu_tests
grep -E "batch invariance \(" "$OUT/engine_gpu_tests.log" | sed 's/.*MESSAGE: //'
OLD=.device/old/xserv
$OLD compile /tmp/g20 -o /tmp/p_old --max-seq 8192 --max-batch 64 > /tmp/c_old.log 2>&1 &
$X compile /tmp/g20 -o /tmp/p_new --max-seq 8192 --max-batch 64 > /tmp/c_new.log 2>&1 &
wait
echo "== compiled at $((SECONDS - start)) s"
for v in old new; do
  bin=$X; [ $v = old ] && bin=$OLD
  echo "-- $v"
  timeout 150 $bin bench /tmp/p_$v --backend cuda -p 512,2048 -n 128 -b 1 -r 2 2> /dev/null |
    grep -E "pp|tg" | cut -d'|' -f6,7,8,11
  timeout 150 $bin bench /tmp/p_$v --backend cuda -p 0 -n 128 -b 1,64 -d 4096 -r 1 \
    2> /dev/null | grep -E "tg" | cut -d'|' -f6,7,8,11
done
echo "== hf20b at $((SECONDS - start)) s"
OUT=/tmp/hf bash scripts/device/hf20b.sh 2>&1 | grep -E "MESSAGE|rc=|positions|greedy" |
  grep -v Loading | sed 's/.*MESSAGE: //'
cp /tmp/hf/hf20b_test.log "$OUT/" 2> /dev/null
echo "done in $((SECONDS - start)) s"
