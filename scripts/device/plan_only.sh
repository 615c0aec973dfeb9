#!/usr/bin/env bash
# One short call (1 GPU): `xserv run` replays a plan as compiled and refuses a run with other
# sizes naming the compile flags; the engine GPU tests. Carry [".device/bin", ".device/data"].
source "$(dirname "$0")/common.sh"
export LD_LIBRARY_PATH=$PWD/$B:$LD_LIBRARY_PATH
$X synth --config examples/tiny/config.json -o /tmp/tm --seed 2 2>&1 | tail -1
$X compile /tmp/tm -o /tmp/tp --max-batch 4 --max-seq 256 2>&1 | tail -1
$X run /tmp/tp --prompt-ids 1,2,3 --max-tokens 4 --backend cuda 2> "$OUT/run.err"
echo "run as compiled: rc=$?; $(grep -E "launch table|lowering" "$OUT/run.err" | head -2)"
$X run /tmp/tp --prompt-ids 1,2,3 --max-tokens 4 --backend cuda --max-batch 2 2> "$OUT/run2.err"
echo "run with --max-batch 2: rc=$?; $(tail -1 "$OUT/run2.err")"
rm /tmp/tp/graph.ir
$X run /tmp/tp --prompt-ids 1,2,3 --max-tokens 4 --backend cuda 2> "$OUT/run3.err"
echo "run without graph.ir: rc=$?; $(tail -1 "$OUT/run3.err")"
run_tests engine_gpu_tests
