#!/usr/bin/env bash
# Session 9, second call (1 GPU, ~6 min): attention_decode's time under key splits at the 20b's
# heads (kernels_bench), then the 20b against HF transformers in both gemm precisions (hf20b.sh:
# the plain-bf16 greedy figure after the decode kernels began rounding their inputs). Needs
# .device/bin/{xserv,cli_gpu_tests,kernels_bench}, .device/data.
source "$(dirname "$0")/common.sh"
timeout 120 $B/kernels_bench -tc="attention decode under key splits*" > "$OUT/attn.log" 2>&1
echo "kernels_bench rc=$?"
grep -h "attention decode B=" "$OUT/attn.log" | sed 's/.*MESSAGE: //'
echo "== at $((SECONDS - start)) s"
bash scripts/device/hf20b.sh
