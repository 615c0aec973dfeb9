#!/usr/bin/env bash
# pp 2 and pp 4 against pp 1 on the synthetic 20b in one call: greedy tokens and every step's
# logits (`xserv run --logits-out`, 4 prompts x 64 steps, compared by compare_logits.py), then
# speed. On one GPU (nvidia-h200, ~5 min) the --pp plans run every stage in one process
# (--pp-local, the same-device transport); on more (nvidia-h200-x2 / -x4, ~7 min) pp 2 (and
# pp 4 with 4 GPUs) also run as one process a GPU with activations over NCCL.
# Expected: same-device runs and XSERV_PIPELINE_MICROBATCHES=1 runs bitwise pp 1's on every row;
# default multi-GPU runs (prompt steps in micro-batches: other gemm shapes) pp 1's tokens,
# logits within 1e-3 (about 2e-5).
#   SPEED=0          no bench rows
#   TRANSPORTS="nccl tcp"   the transports of the two-GPU bench rows (default nccl)
#   NO_IR=1          delete every plan's .ir files first (the runtime replays plan.json's tables)
# Needs .device/bin/xserv, .device/data/gpt-oss-20b.json, numpy; carry [".device/bin",
# ".device/data"]. Logs land in /tmp/pp; the comparison lines are printed.
source "$(dirname "$0")/common.sh"
gpu_info
synth20b
for pp in 1 2 4; do
  flags=""
  [ $pp -gt 1 ] && flags="--pp $pp"
  # shellcheck disable=SC2086
  $X compile /tmp/g20 -o /tmp/pp$pp --max-seq 4096 --max-batch 32 $flags > /tmp/c_pp$pp.log 2>&1 &
done
wait
tail -1 /tmp/c_pp2.log
[ "${NO_IR:-0}" = 1 ] && rm -f /tmp/pp1/*.ir /tmp/pp2/*.ir /tmp/pp4/*.ir
L=/tmp/pp
rm -rf $L /tmp/logits_*.f32
mkdir -p $L

# runs NAME PLAN [ENV=VALUE ...] -- [run flags]: the 4 prompts through PLAN, tokens into
# $L/NAME_pI.txt and logits into /tmp/logits_NAME_pI.f32 (none with NOLOGITS=1).
runs() {
  local name=$1 plan=$2 i
  shift 2
  local envs=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do envs+=("$1"); shift; done
  [ "${1:-}" = -- ] && shift
  for i in "${!PROMPTS[@]}"; do
    local lf=(--logits-out "/tmp/logits_${name}_p$i.f32")
    [ "${NOLOGITS:-0}" = 1 ] && lf=()
    env "${envs[@]}" timeout 150 $X run "$plan" --backend cuda "$@" --prompt-ids "${PROMPTS[$i]}" \
      --max-tokens 64 "${lf[@]}" > $L/${name}_p$i.txt 2> $L/${name}_p$i.err ||
      echo "$name prompt $i failed (rc $?): $(tail -1 $L/${name}_p$i.err)"
  done
  grep -h "pipeline\]" $L/${name}_p0.err | head -2
}

# against NAME: NAME's tokens and logits against pp 1's.
against() {
  local i same=0
  for i in "${!PROMPTS[@]}"; do cmp -s $L/pp1_p$i.txt $L/$1_p$i.txt && same=$((same + 1)); done
  echo "== $1: pp 1's 64 tokens on $same of ${#PROMPTS[@]} prompts"
  [ -f /tmp/logits_$1_p0.f32 ] && python3 scripts/device/compare_logits.py /tmp pp1 "$1" 4
}

runs pp1 /tmp/pp1
names=(pp2_local pp2_local_mb1 pp4_local)
runs pp2_local /tmp/pp2 -- --pp-local
runs pp2_local_mb1 /tmp/pp2 XSERV_PIPELINE_MICROBATCHES=1 -- --pp-local
runs pp4_local /tmp/pp4 -- --pp-local
NOLOGITS=1 runs pp2_local_gpu_picks /tmp/pp2 -- --pp-local # greedy picks on the GPU
names+=(pp2_local_gpu_picks)
if [ "$NGPU" -ge 2 ]; then
  runs pp2_nccl /tmp/pp2
  runs pp2_nccl_mb1 /tmp/pp2 XSERV_PIPELINE_MICROBATCHES=1
  names+=(pp2_nccl pp2_nccl_mb1)
fi
if [ "$NGPU" -ge 4 ]; then
  runs pp4_nccl /tmp/pp4
  names+=(pp4_nccl)
fi
for n in "${names[@]}"; do against "$n"; done
echo "== tokens and logits done at $(at)"

[ "${SPEED:-1}" = 1 ] || exit 0
S="-p 512,2048 -n 32 -b 1,32 -r 2"
# shellcheck disable=SC2086
{
  rows pp1 $X /tmp/pp1 $S
  rows pp2_local $X /tmp/pp2 --pp-local $S
  rows pp4_local $X /tmp/pp4 --pp-local $S
  if [ "$NGPU" -ge 2 ]; then
    for t in ${TRANSPORTS:-nccl}; do
      XSERV_PIPELINE_TRANSPORT=$t rows "pp2_$t" $X /tmp/pp2 $S
    done
  fi
  [ "$NGPU" -ge 4 ] && rows pp4_nccl $X /tmp/pp4 $S
} | tee "$OUT/pp_rows.md"
echo "== done at $(at)"
