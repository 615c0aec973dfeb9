#!/usr/bin/env bash
# The demo: install and build, then compile the tiny example model and show its IR.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
out=${XSERV_DEMO_DIR:-build/demo}
mkdir -p "$out"
echo
echo "== compiling examples/tiny (a 2-layer gpt-oss) =="
./build/cli/xserv compile examples/tiny -o "$out/tiny.plan"
echo
echo "== the compiled graph ($out/tiny.plan/graph.ir), first layer =="
sed -n '1,40p' "$out/tiny.plan/graph.ir"
echo "   ... ($(wc -l < "$out/tiny.plan/graph.ir") lines)"
