#!/usr/bin/env bash
# Session 12, call 1 (1 GPU, ~5 min): the MoE decode kernels on tensor cores (moe_gate_up_mx4_mma,
# moe_down_part_mx4_mma, the lowering's default for MXFP4 + plain bf16 on sm_90). Their GPU test
# against the FMA kernels and a double reference; kernels_bench's sweep of FMA and tensor-core
# tilings on the 20b's shapes; then old binary (.device/old/xserv: session 11's kernels) against
# new on the 20b: decode rows at depth 0 and 4096, greedy tokens. Needs .device/bin/{xserv,
# codegen_gpu_tests,kernels_bench}, .device/old/xserv, .device/data.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="*tensor-core MoE*,*MoE decode kernels on MXFP4*"
grep -E "tiling" "$OUT/codegen_gpu_tests.log" | sed 's/.*MESSAGE: //' | head -40
echo "== bench at $((SECONDS - start)) s"
timeout 200 $B/kernels_bench -tc="MXFP4 MoE decode*" > "$OUT/kb.log" 2>&1
echo "kernels_bench rc=$?"; grep -E "mxfp4 (gate_up|down_part)" "$OUT/kb.log" | sed 's/.*MESSAGE: //'
echo "== 20b at $((SECONDS - start)) s"
synth20b
ab_compile
ab_decode 2
ab_tokens 64
echo "done in $((SECONDS - start)) s"
