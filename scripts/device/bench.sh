#!/usr/bin/env bash
# The rows of docs/TARGETS.md for the synthetic 20b in one call (nvidia-h200, ~2.5 min; ~4.5
# with an old binary): synth on the device, compile (max-seq 8192, max-batch 64, the defaults),
#   pp512, pp2048, tg128, tg128 @ d4096:  xserv bench P -p 512,2048 -n 128 -b 1 -d 0,4096 -r 2
#   tg128 at 8 and 64 sequences:          xserv bench P -p 0 -n 128 -b 8,64 -r 2
# and the peak memory of a batch-1 plan (max-batch 1). With an old binary (.device/old/xserv,
# carried; OLD= another path) its plan gets the same rows in the same call, old and new
# interleaved, and the greedy tokens of both are compared.
#   ROUNDS=1        rounds of the rows
#   FORMATS="..."   also plans of the new binary with other compile flags, their rows in each
#                   round: bf16-experts, both, split, wg, canonical, natural, kv-bf16, joined
#                   with + for several (split+bf16-experts); docs/PERF.md "Compile options"
#   ENVS="..."      also the new plan's rows under each environment setting, e.g.
#                   "XSERV_PDL=0 XSERV_CUDA_GRAPHS=0" (programmatic dependent launch, CUDA graphs)
#   BATCHED=1       also batched decode at depth 512 on default plans (decode graphs up to 256
#                   sequences, KV from the pool): xserv bench P -p 0 -n 32 -d 512 -b 64,128,256,
#                   old and new interleaved, each ROUNDS times (docs/PERF.md "At scale")
#   MODEL=120b      the 120b on this one GPU instead (65 GB of shards: the 20b is not made):
#                   -p 512 -n 64 -b 1,8 on a --max-seq 4096 --max-batch 8 plan, 32 greedy tokens
# Needs .device/bin/xserv, .device/data/gpt-oss-20b.json; carry
# [".device/bin", ".device/data"] (and ".device/old"). The rows also land in $OUT/rows.md.
source "$(dirname "$0")/common.sh"
gpu_info

# flags_of VARIANT: the compile flags of a FORMATS entry.
flags_of() {
  local part
  for part in ${1//+/ }; do
    case $part in
      bf16-experts) echo --expert-format bf16 ;;
      both) echo --expert-format both ;;
      split) echo --gemm-precision split ;;
      wg) echo --dense-gemm wg ;;
      canonical) echo --gemm-order canonical ;;
      natural) echo --gemm-order natural ;;
      kv-bf16) echo --kv-dtype bf16 ;;
      *) echo "unknown FORMATS entry $part" >&2; return 1 ;;
    esac
  done
}

model120b() {
  rm -rf /tmp/g20 /tmp/p_* # the disk holds one of the two checkpoints
  $X synth --config examples/gpt-oss-120b/config.json -o /tmp/g120 --seed 0 2>&1 | tail -1
  echo "== synth done at $(at)"
  $X compile /tmp/g120 -o /tmp/p120 --max-seq 4096 --max-batch 8 2>&1 | tail -1
  rows 120b $X /tmp/p120 -p 512 -n 64 -b 1,8 -r 2
  timeout 150 $X run /tmp/p120 --backend cuda --prompt-ids "${PROMPTS[0]}" --max-tokens 32 \
    > /tmp/tok120.txt 2> /tmp/run120.err
  echo "run rc=$?: $(grep -E '^\[run\]' /tmp/run120.err | tail -1)"
  echo "greedy: $(head -c 200 /tmp/tok120.txt)"
}

model20b() {
  local variants=(new) f flags round v e
  synth20b
  echo "== synth done at $(at)"
  have_old && variants=(old new)
  for f in ${FORMATS:-}; do
    flags=$(flags_of "$f") || return 2
    # shellcheck disable=SC2086
    $X compile /tmp/g20 -o "/tmp/p_$f" --max-seq 8192 --max-batch 64 $flags > "/tmp/c_$f.log" 2>&1 &
    variants+=("$f")
  done
  $X compile /tmp/g20 -o /tmp/p_b1 --max-seq 8192 --max-batch 1 > /tmp/c_b1.log 2>&1 &
  if [ "${BATCHED:-0}" = 1 ]; then # default plans for the batched rows
    for v in new old; do
      [ $v = old ] && ! have_old && continue
      "$(bin_of $v)" compile /tmp/g20 -o /tmp/pd_$v > /tmp/cd_$v.log 2>&1 &
    done
  fi
  compile_pair # waits for every compile
  echo "== compiled at $(at): ${variants[*]}"
  for round in $(seq "${ROUNDS:-1}"); do
    echo "== round $round"
    for v in "${variants[@]}"; do
      rows "$v" "$(bin_of "$v")" "/tmp/p_$v" -p 512,2048 -n 128 -b 1 -d 0,4096 -r 2
      rows "$v" "$(bin_of "$v")" "/tmp/p_$v" -p 0 -n 128 -b 8,64 -r 2
    done
    if [ "${BATCHED:-0}" = 1 ]; then
      for v in new old; do
        [ $v = old ] && ! have_old && continue
        rows "$v default plan" "$(bin_of $v)" /tmp/pd_$v -p 0 -n 32 -d 512 -b 64,128,256 -r 1
      done
    fi
    for e in ${ENVS:-}; do
      (
        export "${e?}"
        rows "$e" $X /tmp/p_new -p 512 -n 128 -b 1 -d 0,4096 -r 2
        rows "$e" $X /tmp/p_new -p 0 -n 128 -b 64 -r 2
      )
    done
  done
  echo "== batch-1 plan (peak memory of 8192 positions x 1)"
  rows b1 $X /tmp/p_b1 -p 512 -n 128 -b 1 -r 1
  if have_old; then tokens_equal old new; fi
}

if [ "${MODEL:-20b}" = 120b ]; then model120b; else model20b; fi 2>&1 | tee "$OUT/rows.md"
echo "== done at $(at)"
