#!/usr/bin/env bash
# Next session's first call (1 GPU, ~4 min), written at the end of session 10 (no device time
# left): compile --dense-gemm cublas (the projections of prompt steps as cuBLAS library calls,
# opt-in until this runs). Its GPU tests (the library gemm against ir::ref; a tiny plan both ways:
# same tokens, logits within 1e-3), then the 20b compiled both ways in one call: pp512, pp2048
# and B64 rows and the serving run at concurrency 64. If every prompt row gains and nothing else
# moves, make cublas the default (cli/cmd_compile.cpp) and regenerate the goldens. Needs
# .device/bin/{xserv,runtime_gpu_tests,cli_gpu_tests,kernels_bench}, .device/data. First,
# kernels_bench's k / v projection tiles (32 blocks at 512 tokens on gemm_wg today).
source "$(dirname "$0")/common.sh"
timeout 90 $B/kernels_bench -tc="k and v projection tiles*" > /tmp/kv.log 2>&1
echo "kernels_bench k/v tiles rc=$?"; grep -h "gemm dense" /tmp/kv.log | sed 's/.*MESSAGE: //'
run_tests runtime_gpu_tests -tc="*library gemm*"
grep -E "library gemm .*rel L2" "$OUT/runtime_gpu_tests.log" | sed 's/.*MESSAGE: //'
run_tests cli_gpu_tests -tc="*dense-gemm*"
grep -E "cuBLAS plan against" "$OUT/cli_gpu_tests.log" | sed 's/.*MESSAGE: //'
synth20b
$X compile /tmp/g20 -o /tmp/p_wg --max-seq 8192 --max-batch 64 > /tmp/c_wg.log 2>&1 &
$X compile /tmp/g20 -o /tmp/p_lib --max-seq 8192 --max-batch 64 --dense-gemm cublas \
  > /tmp/c_lib.log 2>&1 &
wait
tail -1 /tmp/c_lib.log
show() { grep -E "output token|TTFT (median|p99)|TPOT (median|p99)" "$1" | cut -c1-80 | tr '\n' ' '; echo; }
for v in wg lib; do
  echo "-- $v"
  timeout 150 $X bench /tmp/p_$v --backend cuda -p 512,2048 -n 128 -b 1,64 -r 2 2> /dev/null |
    grep -E "pp|tg" | cut -d'|' -f6,7,8,11
  timeout 120 $X bench /tmp/p_$v --backend cuda --requests 256 --concurrency 64 \
    --input-len 512 --output-len 256 > "$OUT/serve_$v.md" 2> /dev/null
  show "$OUT/serve_$v.md"
done
for v in wg lib; do # greedy tokens of a 190-token prompt, both plans
  timeout 60 $X run /tmp/p_$v --backend cuda --prompt-ids "$(seq -s, 1000 37 8000)" \
    --max-tokens 32 > /tmp/tok_$v.txt 2> /dev/null
done
cmp -s /tmp/tok_wg.txt /tmp/tok_lib.txt && echo "greedy tokens: equal" || echo "greedy tokens: differ"
echo "== decode without CUDA graphs (launch cost) at $((SECONDS - start)) s"
XSERV_CUDA_GRAPHS=0 timeout 60 $X bench /tmp/p_wg --backend cuda -p 0 -n 128 -b 1 -r 1 2> /dev/null |
  grep -E "tg" | cut -d'|' -f6,7,8,11
echo "== ncu: every kernel of batch-1 decode steps at $((SECONDS - start)) s"
XSERV_CUDA_GRAPHS=0 timeout 200 ncu --clock-control none --cache-control none \
  --launch-skip 1500 --launch-count 788 --metrics gpu__time_duration.sum,dram__bytes_read.sum \
  --csv $X bench /tmp/p_wg --backend cuda -p 0 -n 16 -b 1 -r 1 > /tmp/ncu_decode.csv 2> /tmp/ncu.err
echo "ncu rc=$?"; tail -3 /tmp/ncu.err
python3 scripts/device/ncu_table.py /tmp/ncu_decode.csv 4 | tee "$OUT/ncu_decode.txt"
echo "done in $((SECONDS - start)) s"
