#!/usr/bin/env bash
# One call (about 3 minutes): the decode kernels' GPU checks and tuning sweeps (codegen_gpu_tests
# cases matching TUNE_TESTS), then the synthetic 20b's batch-1 decode speed and per-op profile.
# Needs .device/bin/{xserv,codegen_gpu_tests} and .device/data/gpt-oss-20b.json (carry
# [".device/bin", ".device/data"]). Logs land in $OUT.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="${TUNE_TESTS:-*norm_router_topk*,*tuning variants*}"
grep -E "MESSAGE" "$OUT/codegen_gpu_tests.log" | sed 's/.*MESSAGE: //' | head -40
synth20b --reuse
$X compile /tmp/g20 -o /tmp/p1 --max-seq 8192 --max-batch 1 2>&1 | tail -1
timeout 120 $X bench /tmp/p1 --backend cuda -p 0 -n 128 -d 0,4096 -r 3 2> "$OUT/bench.err" |
  grep -E "^\| gpt"
XSERV_PROFILE=1 timeout 120 $X run /tmp/p1 --backend cuda --prompt-ids "$(seq -s, 1000 37 2800)" \
  --max-tokens 64 2>&1 > /dev/null | grep -E "^\[profile\]" | head -12
echo "== done at $((SECONDS - start)) s"
