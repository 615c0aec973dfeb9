#!/usr/bin/env bash
# Session 14, call 2 (1 GPU, ~5 min): why 14a's faster MoE kernels (kernels_bench: gate_up 18.7 ->
# 16.4 us, down 12.5 -> 11.2) did not move tg128. Per-kernel durations inside the decode graph,
# old (.device/old/xserv: e85ce67) and new: Nsight Systems with graph nodes traced (if the machine
# has nsys), then Nsight Compute on gate_up / down / the router with graphs off and caches left
# as the step leaves them (weights from DRAM). Needs .device/bin/xserv, .device/old/xserv,
# .device/data.
source "$(dirname "$0")/common.sh"
synth20b
ab_compile
if command -v nsys > /dev/null; then
  for v in old new; do
    timeout 120 nsys profile -o /tmp/r_$v --cuda-graph-trace=node -t cuda --force-overwrite true \
      "$(bin_of $v)" bench /tmp/p_$v --backend cuda -p 0 -n 64 -b 1 -r 1 > "$OUT/nsys_$v.log" 2>&1
    echo "== nsys $v rc=$?"
    nsys stats --report cuda_gpu_kern_sum --format csv /tmp/r_$v.nsys-rep 2> /dev/null |
      python3 -c '
import csv, sys
rows = [r for r in csv.reader(sys.stdin) if len(r) > 8]
head = rows[0]; t, n, avg, name = (head.index(k) for k in ("Total Time (ns)", "Instances", "Avg (ns)", "Name"))
for r in rows[1:16]:
    print(f"{float(r[avg]) / 1000:8.2f} us x {r[n]:>6}  {r[name][:90]}")' | tee "$OUT/nsys_$v.txt"
  done
else
  echo "no nsys on this machine"
fi
for v in old new; do
  for k in moe_gate_up moe_down_part rmsnorm_router_topk; do
    XSERV_CUDA_GRAPHS=0 timeout 100 ncu --clock-control none --cache-control none \
      --kernel-name "regex:$k" --launch-skip 60 --launch-count 3 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
      "$(bin_of $v)" bench /tmp/p_$v --backend cuda -p 0 -n 8 -b 1 -r 1 > "$OUT/ncu_${v}_$k.txt" 2>&1
    echo "== ncu $v $k rc=$?: $(grep -E "^    Duration" "$OUT/ncu_${v}_$k.txt" | awk '{print $3 $2}' | tr '\n' ' ')"
    grep -E "DRAM Throughput|L2 Hit Rate|Achieved Occupancy|Warp Cycles Per Issued|Dynamic Shared" \
      "$OUT/ncu_${v}_$k.txt" | head -5
  done
done
echo "done in $((SECONDS - start)) s"
