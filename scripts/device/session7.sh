#!/usr/bin/env bash
# One call on nvidia-h200 (session 7's closing check): every cli, engine and runtime GPU test
# (the HF batch fixtures, MXFP4 and both-format models, plan replay, pp 2 processes), then the
# 20b's decode and prompt rows with --expert-format both. Needs .device/bin/{xserv,cli_gpu_tests,
# engine_gpu_tests,runtime_gpu_tests} and .device/data/gpt-oss-20b.json
# (carry [".device/bin", ".device/data"]).
source "$(dirname "$0")/common.sh"
export LD_LIBRARY_PATH=$PWD/$B:$LD_LIBRARY_PATH
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
run_tests cli_gpu_tests
grep -h "MESSAGE" "$OUT/cli_gpu_tests.log" | grep -iE "mxfp4|batch fixture|logsumexp|rel L2" | cut -c1-200 | head -12
run_tests engine_gpu_tests
run_tests runtime_gpu_tests
echo "== tests done at $((SECONDS - start)) s"
synth20b
$X compile /tmp/g20 -o /tmp/p64_both --max-seq 8192 --max-batch 64 --expert-format both 2>&1 | tail -1
$X inspect /tmp/p64_both 2>&1 | grep -E "options|^0 " | head -2
timeout 150 $X bench /tmp/p64_both --backend cuda -p 512,2048 -n 128 -b 1,64 -r 2 -o csv \
  2> "$OUT/bench_both.err" | tee "$OUT/bench_both.csv" | cut -d, -f1-12 | tail -4
timeout 60 $X bench /tmp/p64_both --backend cuda -p 0 -n 128 -d 4096 -r 1 -o csv 2> /dev/null |
  tail -1 | cut -d, -f1-12
grep -E "GB on the GPU" "$OUT/bench_both.err" | head -1
echo "== done at $((SECONDS - start)) s"
