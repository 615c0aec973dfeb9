#!/usr/bin/env bash
# Where a decode step of the synthetic 20b spends its time, in one call (nvidia-h200, ~2 min
# for the default modes). MODES (space-separated, default "timeline table"):
#   timeline  a timeline plan (`xserv compile --timeline`: each kernel stamps the GPU clock as
#             it passes its dependency wait) at batch 1, depth 0 and 4096, and batch 8: each
#             kernel's share of the step inside the CUDA graph; with an old binary
#             (.device/old/xserv) its timeline too
#   table     Nsight Compute's duration and DRAM bytes of every kernel of 4 batch-1 decode
#             steps (graphs off, kernels serialised, caches and clocks left alone), summed by
#             kernel with ncu_table.py
#   stalls    Nsight Compute's warp states and source-level stall samples of KERNELS (default
#             "moe_gate_up moe_down_part"), two launches each at DEPTH (default 0); each
#             source page comes back as SASS with its samples per instruction ($OUT/sass_*.csv)
#   repeat    XSERV_PROFILE_REPEAT: each of KERNELS launched twice inside the graph, the
#             step's growth is its in-graph cost (its second launch finds its weights in L2)
#   gemms     Nsight Compute on NCU_COUNT (5) gemm launches of a 512-token prompt step
#             (GEMM_STEP=prompt), of a 64-sequence decode step (GEMM_STEP=b64) or of a
#             256-sequence one (GEMM_STEP=b256: a default plan, decode graphs to 256)
#   batched   batched decode: a timeline plan of the default 256 rows at B64, B128 and B256,
#             depth 512 (BATCHES), each kernel's share; then kernels_bench's MoE tile sweep
#             (gate_up + act + down a layer by tokens and tile; needs .device/bin/kernels_bench)
#   mixed     continuous batching's mixed steps: 64 decodes at depth 512 sharing each step with
#             a prompt chunk of MIXES (default "64 128 512") tokens (`bench --mixed`): the step
#             times of a plain plan against its decode-only steps, then a timeline plan's
#             kernels in the mixed steps
# NEW_FLAGS: compile flags of the new binary's plans (e.g. "--gemm-order canonical"; with the
# same binary as .device/old/xserv the timeline compares the two orders).
# docs/PERF.md "Where a decode step's time goes" reads these. Needs .device/bin/xserv,
# .device/data/gpt-oss-20b.json; carry [".device/bin", ".device/data"] (and ".device/old").
source "$(dirname "$0")/common.sh"
gpu_info
MODES=${MODES:-timeline table}
KERNELS=${KERNELS:-moe_gate_up moe_down_part}
synth20b
# shellcheck disable=SC2086
$X compile /tmp/g20 -o /tmp/p_new --max-seq 8192 --max-batch 64 ${NEW_FLAGS:-} > /tmp/c_new.log 2>&1 &
if [[ " $MODES " == *" timeline "* ]]; then
  for v in new old; do
    [ $v = old ] && ! have_old && continue
    flags=""
    [ $v = new ] && flags=${NEW_FLAGS:-}
    # shellcheck disable=SC2086
    "$(bin_of $v)" compile /tmp/g20 -o /tmp/p_tl_$v --max-seq 8192 --max-batch 64 --timeline \
      $flags > /tmp/c_tl_$v.log 2>&1 &
  done
fi
wait
tail -1 /tmp/c_new.log
echo "== compiled at $(at)"

for mode in $MODES; do
  case $mode in
    timeline)
      for v in new old; do
        [ $v = old ] && ! have_old && continue
        for args in "-b 1 -d 0" "-b 1 -d 4096" "-b 8 -d 0"; do
          log=/tmp/tl_${v}_${args// /}.log
          echo "== timeline $v $args"
          # shellcheck disable=SC2086
          timeout 120 "$(bin_of $v)" bench /tmp/p_tl_$v --backend cuda -p 0 -n 128 $args -r 1 \
            2> "$log" | grep -E '^\| ' | grep -vE '^\| model ' | cut -d'|' -f6,7
          grep -E "^\[timeline\]" "$log" | head -16 | cut -c1-120
        done
      done
      ;;
    table)
      per=$($X inspect /tmp/p_new --json | python3 -c \
        'import json, sys; print(json.load(sys.stdin)["launches_per_decode_step"])')
      echo "== ncu: every kernel of 4 batch-1 decode steps ($per launches a step)"
      XSERV_CUDA_GRAPHS=0 timeout 240 ncu --clock-control none --cache-control none \
        --launch-skip $((per * 6)) --launch-count $((per * 4)) \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv \
        $X bench /tmp/p_new --backend cuda -p 0 -n 16 -b 1 -r 1 > /tmp/ncu_decode.csv 2> /tmp/ncu.err
      echo "ncu rc=$?"
      tail -2 /tmp/ncu.err
      python3 scripts/device/ncu_table.py /tmp/ncu_decode.csv 4 | tee "$OUT/ncu_decode.txt"
      ;;
    stalls)
      for k in $KERNELS; do
        XSERV_CUDA_GRAPHS=0 timeout 200 ncu --clock-control none --cache-control none \
          --kernel-name "regex:$k" --launch-skip 60 --launch-count 2 --import-source yes \
          --section SpeedOfLight --section Occupancy --section WarpStateStats \
          --section SchedulerStats --section InstructionStats --section SourceCounters \
          --export "/tmp/ncu_$k" --force-overwrite \
          $X bench /tmp/p_new --backend cuda -p 0 -n 8 -b 1 -d "${DEPTH:-0}" -r 1 \
          > "/tmp/ncu_$k.txt" 2>&1
        echo "== $k (depth ${DEPTH:-0}): ncu rc=$?"
        # Per SASS instruction: stall samples by reason (NVRTC kernels carry no line info).
        ncu --import "/tmp/ncu_$k.ncu-rep" --page source --print-source sass --csv \
          > "$OUT/sass_$k.csv" 2> /dev/null
        echo "   source page: $(wc -l < "$OUT/sass_$k.csv") lines in sass_$k.csv"
        grep -E "Duration|Registers Per|Warp Cycles Per Issued|Issued Warp Per|No Eligible|Active Warps Per|Stall|==PROF==" \
          "/tmp/ncu_$k.txt" | head -40
        grep -E "^    (OPT|INF|WRN)" -A3 "/tmp/ncu_$k.txt" | cut -c1-300 | head -20
      done
      ;;
    repeat)
      for k in none $KERNELS; do
        rep=$k
        [ "$k" = none ] && rep=
        echo "-- x2 $k: $(XSERV_PROFILE_REPEAT=$rep timeout 100 $X bench /tmp/p_new --backend cuda \
          -p 0 -n 128 -b 1 -d 0,4096 -r 1 2> /dev/null | grep -E '^\| ' | grep -vE '^\| model ' |
          cut -d'|' -f6,7 | tr -s ' ' | tr '\n' ' ')"
      done
      ;;
    gemms)
      step="-p 512 -n 1 -b 1" plan=/tmp/p_new
      [ "${GEMM_STEP:-prompt}" = b64 ] && step="-p 0 -n 4 -b 64"
      if [ "${GEMM_STEP:-prompt}" = b256 ]; then
        step="-p 0 -n 4 -b 256" plan=/tmp/pd
        # shellcheck disable=SC2086
        $X compile /tmp/g20 -o $plan ${NEW_FLAGS:-} > /tmp/c_pd.log 2>&1 || tail -3 /tmp/c_pd.log
      fi
      # shellcheck disable=SC2086
      XSERV_CUDA_GRAPHS=0 timeout 300 ncu --clock-control none --kernel-name "regex:${NCU_KERNELS:-gemm}" \
        --launch-skip "${NCU_SKIP:-12}" --launch-count "${NCU_COUNT:-5}" --section SpeedOfLight \
        --section Occupancy --section LaunchStats --section SchedulerStats --section WarpStateStats \
        --section MemoryWorkloadAnalysis \
        $X bench $plan --backend cuda $step -r 1 > /tmp/ncu_gemms.txt 2>&1
      echo "== gemms (${GEMM_STEP:-prompt}): ncu rc=$?"
      grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Issued Warp Per Scheduler|No Eligible|Stall|L2 Hit" \
        /tmp/ncu_gemms.txt | cut -c1-160 | head -100
      ;;
    batched)
      $X compile /tmp/g20 -o /tmp/p_tl_b --max-seq 8192 --timeline > /tmp/c_tl_b.log 2>&1 ||
        tail -3 /tmp/c_tl_b.log
      for b in ${BATCHES:-64 128 256}; do
        echo "== timeline new -b $b -d 512"
        timeout 150 $X bench /tmp/p_tl_b --backend cuda -p 0 -n 32 -b "$b" -d 512 -r 1 \
          2> /tmp/tl_b$b.log | grep -E '^\| ' | grep -vE '^\| model ' | cut -d'|' -f6,7
        grep -E "^\[timeline\]" /tmp/tl_b$b.log | cut -c12-120 | tee "$OUT/timeline_b$b.txt" |
          head -24
      done
      if [ -x $B/kernels_bench ]; then
        echo "== MoE tile sweep"
        timeout 240 $B/kernels_bench -tc="MoE grouped gemm tiles*" > /tmp/moe_tiles.log 2>&1
        echo "kernels_bench rc=$?"
        grep -E "^ *\|" /tmp/moe_tiles.log | tee "$OUT/moe_tiles.txt"
        grep -E "gemm moe wg" /tmp/moe_tiles.log > "$OUT/moe_tiles_all.txt"
      fi
      ;;
    mixed)
      # plans of 80 rows: the 64 decodes and the prompt's sequence
      $X compile /tmp/g20 -o /tmp/p_mix --max-seq 8192 --max-batch 80 > /tmp/c_mix.log 2>&1 &
      $X compile /tmp/g20 -o /tmp/p_tl_m --max-seq 8192 --max-batch 80 --timeline \
        > /tmp/c_tl_m.log 2>&1 &
      wait
      tail -1 /tmp/c_mix.log
      timeout 200 $X bench /tmp/p_mix --backend cuda -p 0 -n 32 -b 64 -d 512 -r 1 \
        --mixed "$(echo "${MIXES:-64 128 512}" | tr ' ' ',')" 2> /dev/null | grep -E "x B"
      tail -1 /tmp/c_tl_m.log
      for m in ${MIXES:-64 128 512}; do
        echo "== timeline new -b 64 -d 512 --mixed $m (the window: the mixed steps)"
        timeout 150 $X bench /tmp/p_tl_m --backend cuda -p 0 -n 32 -b 64 -d 512 -r 1 \
          --mixed "$m" 2> /tmp/tl_m$m.log | grep -E "\+ p" | cut -d'|' -f6,7,10,11
        grep -E "^\[timeline\]" /tmp/tl_m$m.log | cut -c12-120 | tee "$OUT/timeline_m$m.txt" |
          head -24
      done
      ;;
    *)
      echo "unknown mode $mode (timeline, table, stalls, repeat, gemms, batched, mixed)"
      ;;
  esac
  echo "== $mode done at $(at)"
done
