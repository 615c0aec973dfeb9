#!/usr/bin/env bash
# Session 16, call 2 (1 GPU, ~5 min): the tensor-core MoE kernels keep their scale bytes rather
# than float factors in shared memory (a quarter of the bytes), which leaves room for deeper
# rings at the same blocks an SM; old (4c51153) against the new binary's ring depths for gate_up
# and down (compile-time XSERV_EXP_GU_STAGES / XSERV_EXP_DN_STAGES while measured): greedy
# tokens against old, the batch-1 rows twice, batch 8, each variant's timeline at depth 0; then
# the tensor-core MoE GPU test. Needs .device/bin/{xserv,codegen_gpu_tests}, .device/old/xserv,
# .device/data.
source "$(dirname "$0")/common.sh"
synth20b
VARIANTS=(2_2 3_2 2_3 2_4 3_3 3_4)
plan() { # plan VARIANT DIR [flags]: the new binary's plan at ring depths gu_dn
  local v=$1 dir=$2
  shift 2
  XSERV_EXP_GU_STAGES=${v%_*} XSERV_EXP_DN_STAGES=${v#*_} $X compile /tmp/g20 -o "$dir" \
    --max-seq 8192 --max-batch 64 "$@" > "$dir.log" 2>&1
}
$OLD compile /tmp/g20 -o /tmp/p_old --max-seq 8192 --max-batch 64 > /tmp/c_old.log 2>&1 &
for v in "${VARIANTS[@]}"; do plan "$v" /tmp/p_$v & done
wait
tail -1 /tmp/c_old.log
for v in "${VARIANTS[@]}"; do plan "$v" /tmp/p_tl_$v --timeline & done
toks() {
  timeout 60 "$1" run "$2" --backend cuda --prompt-ids "$(seq -s, 1000 37 8000)" --max-tokens 64 \
    2> /dev/null
}
toks $OLD /tmp/p_old > /tmp/tok_old.txt
for v in "${VARIANTS[@]}"; do
  toks $X /tmp/p_$v > /tmp/tok_$v.txt
  cmp -s /tmp/tok_old.txt /tmp/tok_$v.txt && echo "greedy tokens old/$v: equal" ||
    echo "greedy tokens old/$v: differ"
done
row() { # row BINARY PLAN LABEL [bench flags]
  local b=$1 p=$2 l=$3
  shift 3
  echo "-- $l $*"
  timeout 100 "$b" bench "$p" --backend cuda -p 0 -n 128 "$@" -r 2 2> /dev/null | grep -E "tg" |
    cut -d'|' -f6,7,8,11
}
for round in 1 2; do
  row $OLD /tmp/p_old old -b 1 -d 0,4096
  for v in "${VARIANTS[@]}"; do row $X /tmp/p_$v "$v" -b 1 -d 0,4096; done
done
row $OLD /tmp/p_old old -b 8
for v in "${VARIANTS[@]}"; do row $X /tmp/p_$v "$v" -b 8; done
wait
for v in "${VARIANTS[@]}"; do
  echo "== $v timeline d0"
  timeout 100 $X bench /tmp/p_tl_$v --backend cuda -p 0 -n 128 -b 1 -d 0 -r 1 2> "$OUT/tl.log" |
    grep -E "tg" | cut -d'|' -f6,7
  grep -E "^\[timeline\] moe" "$OUT/tl.log" | cut -c1-118
  cp "$OUT/tl.log" "$OUT/tl_$v.log"
done
RUN_TIMEOUT=240 run_tests codegen_gpu_tests -tc="*tensor-core MoE decode*"
echo "done in $((SECONDS - start)) s"
