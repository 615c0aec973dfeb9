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
ab_compile
echo "== compiled at $((SECONDS - start)) s"
ab_decode 2
show() { grep -E "output token|TTFT (median|p99)|TPOT (median|p99)" "$1" | cut -c1-80 | tr '\n' ' '; echo; }
for v in old new; do
  bin=$(bin_of $v)
  echo "-- $v prompt rows, B64, serving c64"
  timeout 120 $bin bench /tmp/p_$v --backend cuda -p 512,2048 -n 128 -b 64 -r 2 2> /dev/null |
    grep -E "pp|tg" | cut -d'|' -f6,7,8,11
  timeout 120 $bin bench /tmp/p_$v --backend cuda --requests 256 --concurrency 64 \
    --input-len 512 --output-len 256 > /tmp/serve_$v.md 2> /dev/null
  show /tmp/serve_$v.md
done
ab_tokens 32
echo "done in $((SECONDS - start)) s"
