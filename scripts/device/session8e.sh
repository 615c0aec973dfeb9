#!/usr/bin/env bash
# Session 8, the measured call (1 GPU, ~7 min): the synthetic 20b's bench rows of the binary
# before the warpgroup-MMA gemms (.device/old/xserv: bf16 experts, split gemms, mma.sync) against
# the new one with plain-bf16 gemm activations and mxfp4 / both experts; the serving benchmark
# and batch invariance on the new default; peak memory of a batch-1 plan; then the 120b on this
# one GPU (mxfp4 experts). Needs .device/bin/{xserv,cli_gpu_tests,engine_gpu_tests},
# .device/old/xserv (+ its libcpp-httplib), .device/data.
source "$(dirname "$0")/common.sh"
export XSERV_GEMM_PRECISION_NEW=bf16
run_tests cli_gpu_tests -tc="*MXFP4 experts on the GPU*"
synth20b
OLD=.device/old/xserv
$OLD compile /tmp/g20 -o /tmp/p_old --max-seq 8192 --max-batch 64 > "$OUT/c_old.log" 2>&1 &
$X compile /tmp/g20 -o /tmp/p_mx4 --max-seq 8192 --max-batch 64 --expert-format mxfp4 \
  > "$OUT/c_mx4.log" 2>&1 &
$X compile /tmp/g20 -o /tmp/p_both --max-seq 8192 --max-batch 64 --expert-format both \
  > "$OUT/c_both.log" 2>&1 &
$X compile /tmp/g20 -o /tmp/p_one --max-seq 8192 --max-batch 1 --expert-format mxfp4 \
  > "$OUT/c_one.log" 2>&1 &
wait
echo "== compiled at $((SECONDS - start)) s"
bench() { # label, binary, plan, env
  echo "-- $1"
  env $4 timeout 150 $2 bench $3 --backend cuda -p 512,2048 -n 128 -b 1,64 -r 2 \
    2> "$OUT/bench_$1.err" | grep -E "pp|tg" | cut -d'|' -f6,7,8,11
  env $4 timeout 100 $2 bench $3 --backend cuda -p 0 -n 128 -d 4096 -r 1 2> /dev/null |
    grep -E "tg" | cut -d'|' -f6,7,8
}
bench old $OLD /tmp/p_old ""
bench mx4 $X /tmp/p_mx4 XSERV_GEMM_PRECISION=bf16
bench both $X /tmp/p_both XSERV_GEMM_PRECISION=bf16
echo "-- batch-1 plan, 8192 positions (peak memory)"
XSERV_GEMM_PRECISION=bf16 timeout 60 $X bench /tmp/p_one --backend cuda -p 512 -n 16 -r 1 \
  2> /dev/null | grep -E "pp|tg" | cut -d'|' -f6,7,8
echo "== serving at $((SECONDS - start)) s"
XSERV_GEMM_PRECISION=bf16 timeout 150 $X bench /tmp/p_mx4 --backend cuda --requests 256 \
  --concurrency 64 --input-len 512 --output-len 256 2> "$OUT/serve64.err" | tee "$OUT/serve64.md" |
  grep -vE "^\s*$" | head -30
XSERV_GEMM_PRECISION=bf16 timeout 60 $X bench /tmp/p_mx4 --backend cuda --requests 8 \
  --concurrency 1 --input-len 512 --output-len 256 2> /dev/null |
  grep -E "output token|TPOT|TTFT"
echo "== batch invariance at $((SECONDS - start)) s"
XSERV_GEMM_PRECISION=bf16 XSERV_20B_CKPT=/tmp/g20 run_tests engine_gpu_tests -tc="*batch invariance*"
grep -h "invariance\|bitwise\|identical" "$OUT/engine_gpu_tests.log" | head -6
echo "== 120b at $((SECONDS - start)) s"
if [ $((SECONDS - start)) -lt 300 ]; then
  rm -rf /tmp/g20 /tmp/p_old /tmp/p_both
  $X synth --config examples/gpt-oss-120b/config.json -o /tmp/g120 --seed 0 2>&1 | tail -1
  $X compile /tmp/g120 -o /tmp/p120 --max-seq 4096 --max-batch 8 --expert-format mxfp4 \
    > "$OUT/c120.log" 2>&1
  echo "compiled 120b at $((SECONDS - start)) s"
  XSERV_GEMM_PRECISION=bf16 timeout 120 $X bench /tmp/p120 --backend cuda -p 512 -n 64 -b 1,8 \
    -r 1 2> "$OUT/bench120.err" | grep -E "pp|tg" | cut -d'|' -f6,7,8
  XSERV_GEMM_PRECISION=bf16 timeout 60 $X run /tmp/p120 --backend cuda \
    --prompt-ids "$(seq -s, 1000 37 2800)" --max-tokens 32 2> /dev/null | tail -2
fi
echo "done in $((SECONDS - start)) s"
