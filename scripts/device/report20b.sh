#!/usr/bin/env bash
# One device call: the 20b against HF transformers (scripts/device/hf20b.sh), then the bench
# table for docs/PERF.md on a plan of max-seq 8192 and max-batch 64 (KV f32), gemm activations
# as bf16 hi + lo (default). Needs .device/bin/{xserv,cli_gpu_tests} and
# .device/data/gpt-oss-20b.json (carry [".device/bin", ".device/data"]). Logs land in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out} bash scripts/device/hf20b.sh
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} XSERV_KERNEL_CACHE=/tmp/xk
X=.device/bin/xserv
start=$SECONDS
$X compile /tmp/g20 -o /tmp/p64 --max-seq 8192 --max-batch 64 2>&1 | tail -1
timeout 150 $X bench /tmp/p64 --backend cuda -p 512,2048 -n 128 -b 1,64 -r 3 2> "$OUT/bench.err"
timeout 100 $X bench /tmp/p64 --backend cuda -p 0 -n 128 -d 4096 -r 2 2>> "$OUT/bench.err" | tail -1
echo "== bench done in $((SECONDS - start)) s"
