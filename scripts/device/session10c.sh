#!/usr/bin/env bash
# Session 10 (1 GPU, ~8 min): decode attention rounds its operands to fp16 where the tensor-core
# prompt kernel does (plain bf16 plans), for batch invariance. The attention GPU tests, the engine
# GPU tests (batch invariance on the tiny model and the 20b), old binary (.device/old/xserv,
# HEAD 10edade) against new: decode rows at depth 0, 640 and 4096 (what the rounding costs) and
# the prompt rows; Nsight Compute durations of every kernel of batch-1 decode steps (where a
# token's 1.9 ms go); then hf20b.sh (the 20b against HF transformers, both precisions). Needs
# .device/bin/{xserv,codegen_gpu_tests,engine_gpu_tests,cli_gpu_tests}, .device/old/xserv,
# .device/data.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="*attention*"
grep -E "decode against tensor-core" "$OUT/codegen_gpu_tests.log" | sed 's/.*MESSAGE: //' | head -12
run_tests engine_gpu_tests
grep -E "batch invariance \(" "$OUT/engine_gpu_tests.log" | sed 's/.*MESSAGE: //'
synth20b
XSERV_20B_CKPT=/tmp/g20 timeout 150 $B/engine_gpu_tests -tc="*batch invariance*" \
  > "$OUT/inv.log" 2>&1
echo "20b invariance rc=$?"; grep -E "batch invariance \(g20" "$OUT/inv.log" | sed 's/.*MESSAGE: //'
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
echo "== ncu at $((SECONDS - start)) s"
XSERV_CUDA_GRAPHS=0 timeout 150 ncu --clock-control none --cache-control none \
  --launch-skip 1500 --launch-count 600 --metrics gpu__time_duration.sum,dram__bytes_read.sum \
  --csv $X bench /tmp/p_new --backend cuda -p 0 -n 16 -b 1 -r 1 > "$OUT/ncu_decode.csv" 2> "$OUT/ncu.err"
echo "ncu rc=$? $(grep -c gpu__time_duration "$OUT/ncu_decode.csv") rows"
echo "== hf20b at $((SECONDS - start)) s"
bash scripts/device/hf20b.sh 2>&1 | grep -E "MESSAGE|rc=|positions|greedy" | grep -v Loading | sed 's/.*MESSAGE: //'
echo "done in $((SECONDS - start)) s"
