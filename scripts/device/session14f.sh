#!/usr/bin/env bash
# Session 14, call 6 (1 GPU, ~9 min): the session's last check, most important first, each part
# logging on its own so that a cut leaves the rest: the 20b against HF transformers (hf20b.sh's
# steps), the engine GPU tests, the HF batch fixtures, then every other GPU test binary (13e's
# halves of codegen_gpu_tests, runtime_gpu_tests). Needs .device/bin/{xserv,codegen_gpu_tests,
# engine_gpu_tests,runtime_gpu_tests,cli_gpu_tests}, .device/data.
source "$(dirname "$0")/common.sh"
synth20b
hf_fidelity
echo "== engine at $((SECONDS - start)) s"
engine_tests
hf_batch_fixtures
echo "== runtime at $((SECONDS - start)) s"
run_tests runtime_gpu_tests
echo "== codegen at $((SECONDS - start)) s"
RUN_LOG=_a run_tests codegen_gpu_tests -tce="moe kernels match ir::ref,*attention*"
RUN_LOG=_b run_tests codegen_gpu_tests -tc="moe kernels match ir::ref,*attention*"
echo "done in $((SECONDS - start)) s"
