#!/usr/bin/env bash
# Session 13, call 4 (1 GPU, ~1 min): where the router's and decode attention's cycles go, per
# SASS instruction: Nsight Compute's source page (warp stall samples per instruction, CSV) for
# one launch each from `xserv bench` on the 20b (graphs off). The CSVs come back for reading
# here. Needs .device/bin/xserv, .device/data.
source "$(dirname "$0")/common.sh"
synth20b
$X compile /tmp/g20 -o /tmp/p_new --max-seq 8192 --max-batch 64 > /tmp/c_new.log 2>&1
tail -1 /tmp/c_new.log
for k in rmsnorm_router_topk attention_decode_h64_g8_d64_s8192; do
  XSERV_CUDA_GRAPHS=0 timeout 150 ncu --clock-control none --cache-control none \
    --kernel-name "regex:$k" --launch-skip 100 --launch-count 1 --section SourceCounters \
    --section WarpStateStats --page source --print-source sass --csv \
    $X bench /tmp/p_new --backend cuda -p 0 -n 8 -b 1 -r 1 > "$OUT/src_$k.csv" 2> /tmp/ncu_err.txt
  echo "== $k: ncu rc=$? $(wc -l < "$OUT/src_$k.csv") lines"
  tail -3 /tmp/ncu_err.txt
done
echo "done in $((SECONDS - start)) s"
