#!/usr/bin/env bash
# Session 8 (1 GPU, ~6 min): the warpgroup-MMA gemms end to end. The CUDA model's GPU tests
# (tiny model against the fixtures, plan replay, batch fixtures), then the synthetic 20b's
# bench rows of the binary before them (.device/old/xserv, bf16 experts, split gemms) against
# the new one: bf16 experts with split and plain-bf16 gemm activations, mxfp4 experts plain.
# Needs .device/bin/{xserv,cli_gpu_tests,engine_gpu_tests}, .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
[ -z "${SKIP_TESTS:-}" ] && run_tests cli_gpu_tests
[ -z "${SKIP_TESTS:-}" ] && run_tests engine_gpu_tests -tc="*tiny*"
synth20b
OLD=.device/old/xserv
$OLD compile /tmp/g20 -o /tmp/p_old --max-seq 8192 --max-batch 64 > /dev/null 2>&1 &
$X compile /tmp/g20 -o /tmp/p_bf16 --max-seq 8192 --max-batch 64 > /dev/null 2>&1 &
$X compile /tmp/g20 -o /tmp/p_mx4 --max-seq 8192 --max-batch 64 --expert-format mxfp4 \
  > /dev/null 2>&1 &
wait
echo "== compiled at $((SECONDS - start)) s"
bench() { # label, binary, plan, env
  echo "-- $1"
  env $4 timeout 150 $2 bench $3 --backend cuda -p 512,2048 -n 64 -b 1,64 -r ${REPS:-2} \
    2> "$OUT/bench_$1.err" | grep -E "pp|tg" | cut -d'|' -f6,7,8
}
bench old $OLD /tmp/p_old ""
bench bf16-split $X /tmp/p_bf16 ""
bench bf16-plain $X /tmp/p_bf16 XSERV_GEMM_PRECISION=bf16
bench mx4-plain $X /tmp/p_mx4 XSERV_GEMM_PRECISION=bf16
bench mx4-split $X /tmp/p_mx4 ""
[ -n "${PROFILE:-}" ] && XSERV_PROFILE=1 XSERV_GEMM_PRECISION=bf16 timeout 100 $X bench /tmp/p_mx4 \
  --backend cuda -p 512,2048 -n 8 -b 64 -r 1 2>&1 | grep profile | head -40
echo "done in $((SECONDS - start)) s"
