#!/usr/bin/env bash
# Session 15, call 4 (1 GPU, ~6 min): the checks of the code as it lands (o_proj's one-token
# kernel with its rows in shared memory), most important first: the 20b against HF
# transformers, the engine GPU tests, the HF batch fixtures, runtime GPU tests, and the decode
# linear kernels' GPU tests. Needs .device/bin/{xserv,codegen_gpu_tests,engine_gpu_tests,
# runtime_gpu_tests,cli_gpu_tests}, .device/data.
source "$(dirname "$0")/common.sh"
synth20b
hf_fidelity
echo "== engine at $((SECONDS - start)) s"
engine_tests
hf_batch_fixtures
echo "== runtime at $((SECONDS - start)) s"
run_tests runtime_gpu_tests
echo "== codegen at $((SECONDS - start)) s"
RUN_TIMEOUT=120 run_tests codegen_gpu_tests -tc="*linear*"
echo "done in $((SECONDS - start)) s"
