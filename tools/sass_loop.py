#!/usr/bin/env python3
"""Instructions in the K loop of gemm_wg instantiations, from their SASS, without a GPU.

Compiles each configuration below (the 20b's shapes) with nvcc for sm_90a against
codegen/kernels, disassembles it with cuobjdump and counts the instructions of the longest loop
that holds an HGMMA (one K tile), with the registers and spills ptxas reports. This is how
docs/PERF.md counted a K tile before and after a kernel change this way; it measures
instructions, not time. cuobjdump is not in the CUDA toolkit here: `pip download --no-deps
nvidia-cuda-cuobjdump` and unzip the wheel, then pass its bin/ with --cuobjdump-dir.

  tools/sass_loop.py [--kernels DIR] [--cuobjdump-dir DIR] [--nvcc PATH]
DIR defaults to codegen/kernels of this checkout (its parent is put on the include path as
xserv_kernels/ through a temporary link).
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

# name: gemm_wg<K, N, BN, WM, STAGES, MX4, SPLIT, GROUPED, GATHER, KSEL, EPI, BIAS, RESIDUAL,
#               SPLITK, EXPERTS, KSUB, PIPE, CHUNKS, SMALL, NATURAL, STEPS>; the MoE tiles as
# the lowering takes them for the 20b (codegen::kWgMoeTilings: one-multiply MXFP4 scales, K
# steps as MMA batches of their own but at 32 tokens), then the same without the steps.
MOE = ("true, false, true, {gather}, 4, {epi}, true, false, 1, 32, {ksub}, false, 1, true, false, "
       "{steps}")
CONFIGS = {}
for bn, stages, ksub, steps in ((16, 4, 1, "true"), (32, 3, 2, "false"), (64, 4, 1, "true"),
                                (128, 4, 1, "true")):
    for what, n, gather, epi in (("gate_up", 5760, "true", 1), ("down", 2880, "false", 2)):
        CONFIGS[f"moe {what}, {bn} tokens x 128 rows, mxfp4"] = (
            f"2880, {n}, {bn}, 2, {stages}, " +
            MOE.format(gather=gather, epi=epi, ksub=ksub, steps=steps))
CONFIGS["moe gate_up, 128 x 128, mxfp4, batched MMAs"] = (
    "2880, 5760, 128, 2, 4, " + MOE.format(gather="true", epi=1, ksub=1, steps="false"))
CONFIGS.update({
    "qkv, 128 x 128, bf16":
        "2880, 5120, 128, 2, 3, false, false, false, false, 1, 0, true, false, 1, 1, 1, false",
    "o_proj, 64 x 64, bf16":
        "4096, 2880, 64, 1, 4, false, false, false, false, 1, 0, true, true, 1, 1, 1, false",
    "qkv split K 5, 64 x 64":
        "2880, 5120, 64, 1, 4, false, false, false, false, 1, 0, false, false, 5, 1, 1, false",
})

SOURCE = """#include "xserv_kernels/gemm_wg.cuh"
extern "C" __global__ void __launch_bounds__(128) k(
    const __nv_bfloat16* xh, const __nv_bfloat16* xl, const unsigned char* w,
    const __nv_bfloat16* b, const float* h, float* y, const int* pair, const int* tiles,
    const float* route_w, int tokens) {
  xserv_kernels::gemm_wg<%s>(xh, xl, w, b, h, y, pair, tiles, route_w, 7.0f, 1.702f, tokens);
}
"""

INSTR = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s*(.*?);")


def k_loop(sass):
    """Instructions of the longest backward branch's body that holds an HGMMA, and their mix."""
    ins = [(int(m.group(1), 16), m.group(2).strip()) for m in map(INSTR.match, sass.splitlines())
           if m]
    best = []
    for addr, text in ins:
        m = re.search(r"BRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            body = [t for a, t in ins if int(m.group(1), 16) <= a <= addr]
            if any("HGMMA" in t for t in body) and len(body) > len(best):
                best = body
    ops = collections.Counter(re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] for t in best)
    return len(best), ops


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kernels", default=os.path.join(here, "..", "codegen", "kernels"))
    ap.add_argument("--cuobjdump-dir", default="")
    ap.add_argument("--nvcc", default="/usr/local/cuda/bin/nvcc")
    ap.add_argument("--mix", action="store_true", help="print the K loop's top opcodes too")
    a = ap.parse_args()
    cuobjdump = os.path.join(a.cuobjdump_dir, "cuobjdump") if a.cuobjdump_dir else "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        os.symlink(os.path.abspath(a.kernels), os.path.join(tmp, "xserv_kernels"))
        print("| configuration (20b shapes) | registers | spill bytes | K-loop instructions |")
        print("|---|---|---|---|")
        for name, args in CONFIGS.items():
            cu, cubin = os.path.join(tmp, "k.cu"), os.path.join(tmp, "k.cubin")
            with open(cu, "w") as f:
                f.write(SOURCE % args)
            r = subprocess.run([a.nvcc, "-arch=sm_90a", "-cubin", "-O3", "-std=c++17", "-I", tmp,
                                "-Xptxas", "-v", cu, "-o", cubin], capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"{name}: nvcc failed:\n{r.stderr}")
            regs = re.search(r"Used (\d+) registers", r.stderr)
            spill = re.search(r"(\d+) bytes spill stores", r.stderr)
            sass = subprocess.run([cuobjdump, "-sass", cubin], capture_output=True, text=True,
                                  check=True).stdout
            n, ops = k_loop(sass)
            print(f"| {name} | {regs.group(1) if regs else '?'} | "
                  f"{spill.group(1) if spill else '?'} | {n} |")
            if a.mix:
                print("|  | | | " + ", ".join(f"{op} {c}" for op, c in ops.most_common(8)) + " |")


if __name__ == "__main__":
    main()
