#!/usr/bin/env bash
# One call on nvidia-h200-x2 (about 3 minutes): the synthetic 20b with --pp 2 over two GPUs
# against --pp 1 on one: prefill and batched decode with the default micro-batches (one per rank
# for prompt steps, decode steps whole) and the default transport (NCCL with a GPU per rank),
# prefill with 4 micro-batches, and the decode profile of the whole model (XSERV_PROFILE=1).
# Needs .device/bin/xserv and .device/data/gpt-oss-20b.json (carry [".device/bin",
# ".device/data"]). Logs land in $OUT.
# GPU_TESTS="pattern" first runs those cases of cli_gpu_tests (doctest -tc).
source "$(dirname "$0")/common.sh"
if [ -n "${GPU_TESTS:-}" ]; then
  run_tests cli_gpu_tests -tc="$GPU_TESTS"
  grep -E "MESSAGE" "$OUT/cli_gpu_tests.log" | head
fi
synth20b --reuse
for pp in 1 2; do
  flags=""; [ "$pp" -gt 1 ] && flags="--pp $pp"
  $X compile /tmp/g20 -o /tmp/pp$pp --max-seq 4096 --max-batch 32 $flags 2>&1 | tail -1
done
echo "== decode profile, pp 1 (CUDA events per launch table entry, graphs off)"
XSERV_PROFILE=1 timeout 120 $X run /tmp/pp1 --backend cuda --prompt-ids "$(seq -s, 1000 37 2800)" \
  --max-tokens 64 2>&1 > /dev/null | grep -E "^\[profile\]" | head -40
bench() { # bench NAME PLAN [ENV=VALUE ...]: one table, rows only
  local name=$1 plan=$2
  shift 2
  echo "== bench $name"
  env "$@" timeout 150 $X bench $plan --backend cuda -p 512,2048 -n 32 -b 1,32 -r 2 \
    2> "$OUT/bench_$name.err" | grep -E "^\| gpt"
  grep -E "activations over|micro" "$OUT/bench_$name.err" | head -2
}
bench pp1 /tmp/pp1
bench pp2 /tmp/pp2
bench pp2_mb4 /tmp/pp2 XSERV_PIPELINE_MICROBATCHES=4
bench pp2_tcp /tmp/pp2 XSERV_PIPELINE_TRANSPORT=tcp
echo "== done at $((SECONDS - start)) s"
