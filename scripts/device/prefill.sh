#!/usr/bin/env bash
# One device call: the kernel and engine GPU tests, then the synthetic 20b's prefill and batched
# decode speed with the gemm activations as bf16 hi + lo pairs (default) and as plain bf16.
# Needs .device/bin/{xserv,codegen_gpu_tests,cli_gpu_tests} and .device/data/gpt-oss-20b.json
# (carry [".device/bin", ".device/data"]). Logs land in $OUT.
source "$(dirname "$0")/common.sh"
for t in ${TESTS:-codegen_gpu_tests cli_gpu_tests}; do
  run_tests $t --duration=true
done
echo "== tests done at $((SECONDS - start)) s"
$X synth --config .device/data/gpt-oss-20b.json -o /tmp/g20 --seed 0 2>&1 | tail -1
$X compile /tmp/g20 -o /tmp/p64 --max-seq 4096 --max-batch 64 2>&1 | tail -1
for prec in ${PRECISIONS:-split bf16}; do
  echo "== gemm precision $prec"
  XSERV_GEMM_PRECISION=$prec timeout 200 $X bench /tmp/p64 --backend cuda ${BENCH:--p 512,2048 -n 128 -b 1,32,64 -r 3} \
    2> "$OUT/bench_$prec.err"
  tail -3 "$OUT/bench_$prec.err"
done
if [ -n "${PROFILE:-}" ]; then # per-op time of a pp512 step, a decode step and a B=64 decode step
  echo "== profile (XSERV_PROFILE=1, graphs off)"
  XSERV_PROFILE=1 timeout 120 $X bench /tmp/p64 --backend cuda -p 512,2048 -n 16 -b 1,64 -r 1 \
    2>&1 >/dev/null | grep "^\[profile\]"
fi
echo "== total $((SECONDS - start)) s"
