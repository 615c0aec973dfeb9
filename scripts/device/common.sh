# Sourced by the device scripts (never run alone): the repository root as the working directory,
# the environment every call needs, and run_tests. Each script documents what it needs in
# .device/ (built here and carried with [".device/bin", ".device/data"]); logs land in $OUT.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[1]}")/../.."
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-} XSERV_SOURCE_DIR=$PWD
export XSERV_KERNEL_CACHE=${XSERV_KERNEL_CACHE:-/tmp/xk} NCCL_NVLS_ENABLE=0
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
B=.device/bin X=.device/bin/xserv D=.device/data
start=$SECONDS

# run_tests BINARY [doctest options]: runs one GPU test binary of .device/bin into
# $OUT/BINARY.log ($OUT/BINARY$RUN_LOG.log with RUN_LOG set: two runs of one binary keep both
# logs) and prints its exit code, doctest's summary and the first failures, within RUN_TIMEOUT
# seconds (300 by default). doctest's -tc patterns are case-insensitive and match anywhere only
# with a leading '*'.
run_tests() {
  local t=$1 log="$OUT/$1${RUN_LOG:-}.log"
  shift
  timeout "${RUN_TIMEOUT:-300}" "$B/$t" "$@" > "$log" 2>&1
  echo "$t rc=$?: $(grep -E '^\[doctest\] (test cases|assertions)' "$log" | tr '\n' ' ')"
  grep -E "ERROR|FAILED" -A3 "$log" | head -30
}

# The 4 prompts (token ids) every pp N against pp 1 comparison runs: 49, 98, 6 and 11 tokens.
PROMPTS=("$(seq -s, 1000 37 2800)" "$(seq -s, 7 3 300)" "200002,1,2,3,4,5" "$(seq -s, 50000 911 60000)")

# synth20b [--reuse]: the synthetic 20b (seed 0) at /tmp/g20; --reuse keeps one already there.
synth20b() {
  [ "${1:-}" = --reuse ] && [ -d /tmp/g20 ] && return 0
  $X synth --config $D/gpt-oss-20b.json -o /tmp/g20 --seed 0 2>&1 | tail -1
}


# Old against new in one call: OLD is the old binary (.device/old/xserv, carried), $X the new.
OLD=${OLD:-.device/old/xserv}
# bin_of old|new: the binary of a variant.
bin_of() { if [ "$1" = old ]; then echo "$OLD"; else echo "$X"; fi; }

# ab_compile [flags]: the 20b (synth20b first) compiled by both binaries, in parallel, into
# /tmp/p_old and /tmp/p_new (max-seq 8192, max-batch 64, then the flags).
ab_compile() {
  local v
  for v in old new; do
    "$(bin_of $v)" compile /tmp/g20 -o /tmp/p_$v --max-seq 8192 --max-batch 64 "$@" \
      > /tmp/c_$v.log 2>&1 &
  done
  wait
  tail -1 /tmp/c_new.log
}

# ab_decode [rounds]: batch-1 decode rows at depth 0 and 4096, old then new, `rounds` times.
ab_decode() {
  local round v
  for round in $(seq "${1:-2}"); do
    for v in old new; do
      echo "-- $v (round $round)"
      timeout 100 "$(bin_of $v)" bench /tmp/p_$v --backend cuda -p 0 -n 128 -b 1 -d 0,4096 -r 2 \
        2> /dev/null | grep -E "tg" | cut -d'|' -f6,7,8,11
    done
  done
}

# ab_tokens [max tokens]: greedy tokens of a 190-token prompt from both plans, compared.
ab_tokens() {
  local v
  for v in old new; do
    timeout 60 "$(bin_of $v)" run /tmp/p_$v --backend cuda --prompt-ids "$(seq -s, 1000 37 8000)" \
      --max-tokens "${1:-32}" > /tmp/tok_$v.txt 2> /dev/null
  done
  cmp -s /tmp/tok_old.txt /tmp/tok_new.txt && echo "greedy tokens old/new: equal" ||
    echo "greedy tokens old/new: differ"
}

# ab_batch B: the batch-B decode row (-p 0 -n 128), old then new.
ab_batch() {
  local v
  for v in old new; do
    echo "-- $v B$1"
    timeout 100 "$(bin_of $v)" bench /tmp/p_$v --backend cuda -p 0 -n 128 -b "$1" -r 2 \
      2> /dev/null | grep -E "tg" | cut -d'|' -f6,7,8,11
  done
}

# ab_prompt_b64: the pp512 and 64-sequence rows, old then new.
ab_prompt_b64() {
  local v
  for v in old new; do
    echo "-- $v pp512, B64"
    timeout 100 "$(bin_of $v)" bench /tmp/p_$v --backend cuda -p 512 -n 128 -b 64 -r 2 \
      2> /dev/null | grep -E "pp|tg" | cut -d'|' -f6,7,8,11
  done
}

# kb_moe: kernels_bench's MXFP4 MoE decode sweep (FMA and tensor-core tilings), one line each.
kb_moe() {
  timeout 200 $B/kernels_bench -tc="MXFP4 MoE decode*" > "$OUT/kb.log" 2>&1
  echo "kernels_bench rc=$?"
  grep -E "mxfp4 (gate_up|down_part)|ERROR" "$OUT/kb.log" |
    sed 's/.*MESSAGE: //; s/moe_[a-z_]*e32_k4_d2880_i2880_mx4_a16//'
}

# engine_tests: the engine GPU tests and their batch-invariance lines.
engine_tests() {
  run_tests engine_gpu_tests
  grep -E "batch invariance \(" "$OUT/engine_gpu_tests.log" | sed 's/.*MESSAGE: //' | cut -c1-160
}

# hf_batch_fixtures: cli_gpu_tests' HF batch fixtures (the CUDA engine against HF transformers).
hf_batch_fixtures() {
  timeout 150 $B/cli_gpu_tests -tc="*hf batch fixture*" > "$OUT/cli_gpu_tests.log" 2>&1
  echo "cli_gpu_tests rc=$?: $(grep -E '^\[doctest\] (test cases|assertions)' \
    "$OUT/cli_gpu_tests.log" | tr '\n' ' ')"
  grep -E "ERROR|FAILED" -A3 "$OUT/cli_gpu_tests.log" | head -10
}

# hf_fidelity: the 20b at /tmp/g20 against HF transformers (hf20b.sh's steps: a 256-token random
# prompt, 64 greedy tokens; reference into /tmp/ref, then cli_gpu_tests' synthetic-20b cases).
hf_fidelity() {
  timeout 200 python3 tools/hf_20b_reference.py /tmp/g20 --ids-seed 0 --tokens 256 --greedy 64 \
    --out /tmp/ref > "$OUT/hf_ref.log" 2>&1
  echo "HF reference rc=$? at $((SECONDS - start)) s"
  XSERV_20B_CKPT=/tmp/g20 XSERV_20B_REF=/tmp/ref timeout 150 $B/cli_gpu_tests \
    -tc="gpu: synthetic 20b*" > "$OUT/hf20b_test.log" 2>&1
  echo "hf20b test rc=$?: $(grep -E '^\[doctest\] test cases' "$OUT/hf20b_test.log" | tail -1)"
  grep -E "MESSAGE|ERROR" -A1 "$OUT/hf20b_test.log" | grep -vE "^--$" | cut -c1-220 | head -16
}

# repeats DEPTHS KERNEL...: the batch-1 decode row of /tmp/p_new at DEPTHS (as bench -d takes
# them) with each KERNEL (a kernel-name fragment; "none": nothing) launched twice inside the
# graph (XSERV_PROFILE_REPEAT): the step's growth over the layers is that kernel's in-graph cost.
repeats() {
  local depths=$1 k rep
  shift
  for k in "$@"; do
    rep=$k
    [ "$k" = none ] && rep=
    echo "-- x2 $k: $(XSERV_PROFILE_REPEAT=$rep timeout 100 $X bench /tmp/p_new --backend cuda \
      -p 0 -n 128 -b 1 -d "$depths" -r 1 2> /dev/null | grep -E "tg" | cut -d'|' -f6,7,8 |
      tr '\n' ' ')"
  done
}

# row LABEL BINARY PLAN: the batch-1 decode rows of PLAN at depth 0 and 4096 (-r 2) on one line.
row() {
  echo "-- $1: $(timeout 100 "$2" bench "$3" --backend cuda -p 0 -n 128 -b 1 -d 0,4096 -r 2 \
    2> /dev/null | grep -E "tg" | cut -d'|' -f6,7 | tr -s ' ' | tr '\n' ' ')"
}

# timelines TAG PLAN DEPTH...: the batch-1 row of a timeline plan (compile --timeline) at each
# depth, with the first rows of its kernel table; the whole report in $OUT/tl_TAG_dDEPTH.log.
timelines() {
  local tag=$1 plan=$2 depth
  shift 2
  for depth in "$@"; do
    echo "== timeline $tag -d $depth"
    timeout 100 $X bench "$plan" --backend cuda -p 0 -n 128 -b 1 -d "$depth" -r 1 \
      2> "$OUT/tl_${tag}_d$depth.log" | grep -E "tg" | cut -d'|' -f6,7
    grep -E "^\[timeline\]" "$OUT/tl_${tag}_d$depth.log" | sed -n '1p;3,13p' | cut -c1-118
  done
}

# compile_variants KNOBS_ARRAY VARIANT...: /tmp/g20 compiled by $X into /tmp/p_VARIANT for each
# variant, in parallel, with the environment assignments KNOBS_ARRAY[VARIANT] (the name of an
# associative array of compile-time knobs), and by $OLD into /tmp/p_old.
compile_variants() {
  local -n knobs=$1
  local v
  shift
  $OLD compile /tmp/g20 -o /tmp/p_old --max-seq 8192 --max-batch 64 > /tmp/c_old.log 2>&1 &
  for v in "$@"; do
    env ${knobs[$v]} $X compile /tmp/g20 -o /tmp/p_$v --max-seq 8192 --max-batch 64 \
      > /tmp/c_$v.log 2>&1 &
  done
  wait
}

# ab_round: the usual old-against-new measurement of a decode change: both plans (ab_compile),
# greedy tokens over 64 steps, the batch-1 rows twice, batch 8, then the new binary's timeline
# plan (compiled meanwhile) at depth 0 and 4096.
ab_round() {
  ab_compile
  $X compile /tmp/g20 -o /tmp/p_tl_new --max-seq 8192 --max-batch 64 --timeline \
    > /tmp/c_tl.log 2>&1 &
  ab_tokens 64
  ab_decode 2
  ab_batch 8
  wait
  timelines new /tmp/p_tl_new 0 4096
}

# variant_sweep KNOBS_ARRAY "VARIANT..." "TIMELINE_VARIANT..." AGAIN: compile_variants, timeline
# plans of the listed variants (compiled while the rows run), the batch-1 rows of old, of each
# variant, of old again and of AGAIN again (the spread between calls), then those timelines.
variant_sweep() {
  local -n sweep_knobs=$1
  local variants=$2 timeline_variants=$3 again=$4 v
  compile_variants sweep_knobs $variants
  for v in $timeline_variants; do
    env ${sweep_knobs[$v]} $X compile /tmp/g20 -o /tmp/p_tl_$v --max-seq 8192 --max-batch 64 \
      --timeline > /tmp/c_tl_$v.log 2>&1 &
  done
  row old $OLD /tmp/p_old
  for v in $variants; do row $v $X /tmp/p_$v; done
  row old $OLD /tmp/p_old
  row "$again" $X /tmp/p_$again
  wait
  for v in $timeline_variants; do timelines $v /tmp/p_tl_$v 0 4096; done
}
