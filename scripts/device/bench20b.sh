#!/usr/bin/env bash
# One device call: the synthetic 20b's decode speed with CUDA graphs on and off, and peak GPU
# memory for plans of max-seq 8192 at batch 1 and 64. Needs .device/bin/xserv and
# .device/data/gpt-oss-20b.json (carry [".device/bin", ".device/data"]).
set -uo pipefail
cd "$(dirname "$0")/../.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} XSERV_KERNEL_CACHE=/tmp/xk
X=.device/bin/xserv
start=$SECONDS
$X synth --config .device/data/gpt-oss-20b.json -o /tmp/g20 --seed 0 2>&1 | tail -1
$X compile /tmp/g20 -o /tmp/p32 --max-seq 2048 --max-batch 32 2>&1 | tail -1
for graphs in 1 0; do
  echo "== CUDA graphs $graphs"
  XSERV_CUDA_GRAPHS=$graphs timeout 100 $X bench /tmp/p32 --backend cuda -p 0 -n 128 -b 1,8,32 \
    -r 3 2>/dev/null
done
for b in 1 64; do
  $X compile /tmp/g20 -o /tmp/pm$b --max-seq 8192 --max-batch $b 2>&1 | tail -1
  echo "== peak memory, max-seq 8192, max-batch $b (KV f32)"
  timeout 60 $X bench /tmp/pm$b --backend cuda -p 16 -n 2 -r 1 2>/dev/null | tail -1
done
echo "== total $((SECONDS - start)) s"
