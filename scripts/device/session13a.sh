#!/usr/bin/env bash
# Next session's first call (not yet run; 1 GPU, ~6 min): every GPU test binary at HEAD, since
# session 12's review (cd408f4: a launch helper, a test helper) was checked on the CPU only.
# codegen_gpu_tests runs in two halves (one run passes run_tests' 300 s), "moe kernels match
# ir::ref" alone being the slowest. Needs .device/bin/{codegen,engine,runtime,cli}_gpu_tests,
# .device/data.
source "$(dirname "$0")/common.sh"
run_tests codegen_gpu_tests -tce="*moe kernels match ir::ref*,*attention*"
run_tests codegen_gpu_tests -tc="*moe kernels match ir::ref*,*attention*"
run_tests runtime_gpu_tests
engine_tests
hf_batch_fixtures
echo "done in $((SECONDS - start)) s"
