#!/usr/bin/env bash
# The demo: install and build, synthesise the tiny example model, compile it, and generate with it
# (on the GPU when there is one, else on the CPU reference interpreter).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
xserv=./build/cli/xserv
out=${XSERV_DEMO_DIR:-build/demo}
mkdir -p "$out"

echo
echo "== 1. a random-weight checkpoint of examples/tiny (2 layers, 8 experts, real vocabulary) =="
rm -rf "$out/tiny-model"
$xserv synth --config examples/tiny/config.json -o "$out/tiny-model" --seed 1

echo
echo "== 2. compile it: IR, passes, plan directory =="
$xserv compile "$out/tiny-model" -o "$out/tiny.plan" --max-seq 256 --max-batch 4
echo "   the first layer of $out/tiny.plan/graph.ir:"
sed -n '1,32p' "$out/tiny.plan/graph.ir" | sed 's/^/   /'
echo "   ... ($(wc -l < "$out/tiny.plan/graph.ir") lines)"

echo
backend=auto # cuda when a GPU is usable, else the CPU reference engine
echo "== 3. greedy generation from token ids (backend: $backend) =="
$xserv run "$out/tiny.plan" --prompt-ids 200006,1428,200008,13225,2375,200007 --max-tokens 16 \
  --backend "$backend"

data=${XSERV_DATA:-../shared/data}
if [ -f "$data/o200k_base.tiktoken" ]; then
  echo
  echo "== 4. text in, text out with the o200k tokenizer (random weights: expect noise) =="
  $xserv run "$out/tiny.plan" --raw --prompt "The capital of France is" \
    --tokenizer "$data/o200k_base.tiktoken" --max-tokens 16 --backend "$backend"
fi
