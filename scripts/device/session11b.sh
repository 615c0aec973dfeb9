#!/usr/bin/env bash
# Session 11, call 2 (1 GPU, ~6 min): weights asked of L2 ahead of the dependency wait (decode
# GEMVs: qkv, o_proj, lm_head and the MoE down rows before griddepcontrol.wait; the gate_up rows
# of the routed experts by the first blocks after it). Old binary (.device/old/xserv: HEAD with
# the cuBLAS activation fix) against new, both plans in one call: decode rows at depth 0 and
# 4096, B64, the prompt rows; the cuBLAS plan's GPU test and greedy tokens against gemm_wg;
# the MoE / linear kernel tests; engine GPU tests; Nsight table of batch-1 decode steps (new).
# Needs .device/bin/{xserv,cli_gpu_tests,codegen_gpu_tests,engine_gpu_tests}, .device/old/xserv,
# .device/data.
source "$(dirname "$0")/common.sh"
run_tests cli_gpu_tests -tc="*dense-gemm*"
grep -E "cuBLAS plan against" "$OUT/cli_gpu_tests.log" | sed 's/.*MESSAGE: //'
synth20b
ab_compile
$X compile /tmp/g20 -o /tmp/p_lib --max-seq 8192 --max-batch 64 --dense-gemm cublas \
  > /tmp/c_lib.log 2>&1
echo "== compiled at $((SECONDS - start)) s"
ab_decode 2
for v in old new; do
  bin=$(bin_of $v)
  echo "-- $v prompt rows, B64"
  timeout 120 $bin bench /tmp/p_$v --backend cuda -p 512,2048 -n 128 -b 64 -r 2 2> /dev/null |
    grep -E "pp|tg" | cut -d'|' -f6,7,8,11
done
echo "-- lib prompt rows"
timeout 100 $X bench /tmp/p_lib --backend cuda -p 512,2048 -n 0 -r 2 2> /dev/null |
  grep -E "pp" | cut -d'|' -f6,7,8,11
for v in new lib; do # greedy tokens of a 190-token prompt, both plans
  timeout 60 $X run /tmp/p_$v --backend cuda --prompt-ids "$(seq -s, 1000 37 8000)" \
    --max-tokens 32 > /tmp/tok_$v.txt 2> /dev/null
done
cmp -s /tmp/tok_new.txt /tmp/tok_lib.txt && echo "lib greedy tokens: equal" || echo "lib greedy tokens: differ"
echo "== tests at $((SECONDS - start)) s"
run_tests codegen_gpu_tests -tc="*moe*,*linear*,*qkv*"
run_tests engine_gpu_tests
echo "== ncu at $((SECONDS - start)) s"
XSERV_CUDA_GRAPHS=0 timeout 150 ncu --clock-control none --cache-control none \
  --launch-skip 1500 --launch-count 788 --metrics gpu__time_duration.sum,dram__bytes_read.sum \
  --csv $X bench /tmp/p_new --backend cuda -p 0 -n 16 -b 1 -r 1 > /tmp/ncu_decode.csv 2> /tmp/ncu.err
echo "ncu rc=$?"
python3 scripts/device/ncu_table.py /tmp/ncu_decode.csv 4 | tee "$OUT/ncu_decode.txt"
echo "done in $((SECONDS - start)) s"
