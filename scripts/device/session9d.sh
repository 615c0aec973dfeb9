#!/usr/bin/env bash
# Session 9 (1 GPU, ~1 min): issue15_check.sh's plan part under today's compile defaults: a tiny
# plan with every .ir deleted, pp 1, pp 2 over --pp-local and pp 2 as two processes (one GPU:
# TCP), bf16 and mxfp4 experts, tokens against pp 1; XSERV_GEMM_PRECISION against the plan's
# precision refused. Needs .device/bin/xserv.
source "$(dirname "$0")/common.sh"
T=/tmp/i15 && rm -rf $T && mkdir -p $T
$X synth --config examples/tiny/config.json -o $T/m --seed 3 2>&1 | tail -1
ids=$(seq -s, 1000 37 2443) # 40 prompt tokens: the prefill gemms, then decode graphs
for v in "pp1 " "pp2 --pp 2" "bf1 --expert-format bf16" "bf2 --pp 2 --expert-format bf16"; do
  set -- $v
  name=$1 && shift
  $X compile $T/m -o $T/$name --max-batch 4 --max-seq 512 "$@" 2>&1 | tail -1
  rm -f $T/$name/*.ir # the CUDA runtime replays plan.json's tables: no IR is read
done
ls $T/pp2
run_plan() { # PLAN NAME [FLAGS...]: greedy tokens of the 40-token prompt into $T/NAME.out
  local plan=$1 name=$2 && shift 2
  timeout 120 $X run $T/$plan --backend cuda --prompt-ids $ids --max-tokens 16 "$@" \
    > $T/$name.out 2> "$OUT/$name.err"
  echo "$name rc=$? $(tr '\n' ' ' < $T/$name.out | cut -c1-80)"
}
run_plan pp1 pp1
run_plan pp2 pp2_local --pp-local
run_plan pp2 pp2_ranks
run_plan bf1 bf1
run_plan bf2 bf2_local --pp-local
run_plan bf2 bf2_ranks
for pair in "pp1 pp2_local" "pp1 pp2_ranks" "bf1 bf2_local" "bf1 bf2_ranks"; do
  set -- $pair
  cmp -s $T/$1.out $T/$2.out && echo "$2 == $1" || echo "$2 DIFFERS from $1"
done
grep -h "rank\|stage" "$OUT/pp2_ranks.err" | head -6
XSERV_GEMM_PRECISION=split $X run $T/pp1 --backend cuda --prompt-ids 1,2,3 --max-tokens 2 \
  > /dev/null 2> "$OUT/gemm.err"
echo "XSERV_GEMM_PRECISION=split on a bf16 plan: rc=$? (want 2): $(tail -1 "$OUT/gemm.err")"
echo "done in $((SECONDS - start)) s"
