#!/usr/bin/env bash
# Session 11, call 4 (1 GPU, ~6 min): the qkv_rope_decode bitwise test and the qkv / rope kernel
# tests (call 3's whole codegen_gpu_tests run ran past run_tests' 300 s before reaching them),
# then hf20b.sh: the 20b against HF transformers with cuBLAS dense gemms by default and RoPE in
# qkv's epilogue. Needs .device/bin/{codegen_gpu_tests,cli_gpu_tests,xserv}, .device/data.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tc="*qkv*,*rope*"
grep -E "^\[doctest\]|TEST CASE" "$OUT/codegen_gpu_tests.log" | head -12
bash scripts/device/hf20b.sh 2>&1 | grep -E "MESSAGE|rc=|positions|greedy" | grep -v Loading |
  sed 's/.*MESSAGE: //'
echo "done in $((SECONDS - start)) s"
