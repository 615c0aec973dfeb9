#!/usr/bin/env bash
# Session 11, call 3 (1 GPU, ~7 min): cuBLAS dense gemms by default and RoPE + both KV cache
# writes in qkv's epilogue for decode steps (qkv_rope_decode: one launch less a layer). The new
# kernel's bitwise test against qkv_decode + rope_yarn_qk_kv, every GPU test binary (cuBLAS is
# now under the engine's and the CLI's tests), then the 20b: old binary (.device/old/xserv: HEAD
# with the cuBLAS activation fix, gemm_wg default) against new in one call: decode rows at depth
# 0 and 4096, B64, prompt rows, the serving run at concurrency 64, greedy tokens old vs new.
# Needs .device/bin/{xserv,*_gpu_tests}, .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests
grep -E "qkv_rope_decode|rope_yarn_qk_kv" "$OUT/codegen_gpu_tests.log" | head -5
for t in runtime_gpu_tests cli_gpu_tests engine_gpu_tests; do run_tests $t; done
grep -E "cuBLAS plan against|batch invariance \(" "$OUT"/*.log | sed 's/.*MESSAGE: //'
synth20b
OLD=.device/old/xserv
$OLD compile /tmp/g20 -o /tmp/p_old --max-seq 8192 --max-batch 64 > /tmp/c_old.log 2>&1 &
$X compile /tmp/g20 -o /tmp/p_new --max-seq 8192 --max-batch 64 > /tmp/c_new.log 2>&1 &
wait
tail -1 /tmp/c_new.log
echo "== compiled at $((SECONDS - start)) s"
for round in 1 2; do
  for v in old new; do
    bin=$X; [ $v = old ] && bin=$OLD
    echo "-- $v (round $round)"
    timeout 100 $bin bench /tmp/p_$v --backend cuda -p 0 -n 128 -b 1 -d 0,4096 -r 2 2> /dev/null |
      grep -E "tg" | cut -d'|' -f6,7,8,11
  done
done
show() { grep -E "output token|TTFT (median|p99)|TPOT (median|p99)" "$1" | cut -c1-80 | tr '\n' ' '; echo; }
for v in old new; do
  bin=$X; [ $v = old ] && bin=$OLD
  echo "-- $v prompt rows, B64, serving c64"
  timeout 120 $bin bench /tmp/p_$v --backend cuda -p 512,2048 -n 128 -b 64 -r 2 2> /dev/null |
    grep -E "pp|tg" | cut -d'|' -f6,7,8,11
  timeout 120 $bin bench /tmp/p_$v --backend cuda --requests 256 --concurrency 64 \
    --input-len 512 --output-len 256 > /tmp/serve_$v.md 2> /dev/null
  show /tmp/serve_$v.md
  timeout 60 $bin run /tmp/p_$v --backend cuda --prompt-ids "$(seq -s, 1000 37 8000)" \
    --max-tokens 32 > /tmp/tok_$v.txt 2> /dev/null
done
cmp -s /tmp/tok_old.txt /tmp/tok_new.txt && echo "greedy tokens old/new: equal" || echo "greedy tokens old/new: differ"
echo "done in $((SECONDS - start)) s"
