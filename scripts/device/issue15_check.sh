#!/usr/bin/env bash
# One call on nvidia-h200 (~6 min), issue 15's last items: the CUDA model runs only a stage
# program (graph mode moved to an in-memory compile), pipeline stages replay their plan's tables,
# the models moved to engine/ and the CUDA calls to runtime/. In order: the GPU tests those moves
# touch; a tiny plan run with graph.ir deleted, and XSERV_GEMM_PRECISION refused; a pp 2 plan with
# every .ir deleted, over --pp-local and over two processes (one GPU: TCP), against pp 1, in bf16
# and mxfp4 experts; then the synthetic 20b's bench rows, the binary before these changes
# (.device/old/xserv, HEAD 72fa6e1) against the new one, the new one twice for the spread.
# Needs .device/bin/{xserv,engine_gpu_tests,cli_gpu_tests,codegen_gpu_tests,runtime_gpu_tests},
# .device/old/xserv and .device/data/gpt-oss-20b.json (carry [".device/bin", ".device/old",
# ".device/data"]). SKIP_BENCH=1 leaves the 20b out; BENCH_ONLY=1 runs only the 20b (two calls
# if one would pass the 10-minute limit).
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
if [ -z "${BENCH_ONLY:-}" ]; then
run_tests engine_gpu_tests
run_tests cli_gpu_tests -tc="*plan's launch table*,*trace*,*pp 2*,*batch fixture*"
run_tests codegen_gpu_tests -tc="*argmax*"
run_tests runtime_gpu_tests
echo "== tests done at $((SECONDS - start)) s"

T=/tmp/i15 && rm -rf $T && mkdir -p $T
$X synth --config examples/tiny/config.json -o $T/m --seed 3 2>&1 | tail -1
ids=$(seq -s, 1000 37 2443) # 40 prompt tokens: the prefill gemms, then decode graphs
for v in "pp1 " "pp2 --pp 2" "mx1 --expert-format mxfp4" "mx2 --pp 2 --expert-format mxfp4"; do
  set -- $v
  name=$1 && shift
  $X compile $T/m -o $T/$name --max-batch 4 --max-seq 512 "$@" 2>&1 | tail -1
  rm -f $T/$name/*.ir # the CUDA runtime replays plan.json's tables: no IR is read
done
run_plan() { # PLAN NAME [FLAGS...]: greedy tokens of the 40-token prompt into $T/NAME.out
  local plan=$1 name=$2 && shift 2
  timeout 120 $X run $T/$plan --backend cuda --prompt-ids $ids --max-tokens 16 "$@" \
    > $T/$name.out 2> "$OUT/$name.err"
  echo "$name rc=$? $(tr '\n' ' ' < $T/$name.out | cut -c1-80)"
}
run_plan pp1 pp1
run_plan pp2 pp2_local --pp-local
run_plan pp2 pp2_ranks
run_plan mx1 mx1
run_plan mx2 mx2_local --pp-local
for pair in "pp1 pp2_local" "pp1 pp2_ranks" "mx1 mx2_local"; do
  set -- $pair
  cmp -s $T/$1.out $T/$2.out && echo "$2 == $1" || echo "$2 DIFFERS from $1"
done
grep -h "plan.json stage" "$OUT/pp2_local.err" | head -2
XSERV_GEMM_PRECISION=bf16 $X run $T/pp1 --backend cuda --prompt-ids 1,2,3 --max-tokens 2 \
  > /dev/null 2> "$OUT/gemm.err"
echo "XSERV_GEMM_PRECISION=bf16 on a split plan: rc=$? (want 2): $(tail -1 "$OUT/gemm.err")"
echo "== plans done at $((SECONDS - start)) s"
fi

[ -n "${SKIP_BENCH:-}" ] && exit 0
synth20b
OLD=.device/old/xserv
for v in new old; do
  bin=$X; [ "$v" = old ] && bin=$OLD
  $bin compile /tmp/g20 -o /tmp/p64_$v --max-seq 8192 --max-batch 64 2>&1 | tail -1
done
rm -f /tmp/p64_new/graph.ir
echo "== compiled at $((SECONDS - start)) s"
for v in new old new2; do
  bin=$X plan=/tmp/p64_new
  [ "$v" = old ] && bin=$OLD plan=/tmp/p64_old
  echo "== bench $v"
  timeout 200 $bin bench $plan --backend cuda -p 512,2048 -n 128 -b 1,64 -r 3 -o csv \
    2> "$OUT/bench_$v.err" | tee "$OUT/bench_$v.csv" | cut -d, -f1-12 | tail -4
  timeout 100 $bin bench $plan --backend cuda -p 0 -n 128 -d 4096 -r 2 -o csv 2> /dev/null |
    tail -1 | cut -d, -f1-12
done
echo "== done at $((SECONDS - start)) s"
