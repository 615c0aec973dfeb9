#!/usr/bin/env bash
# Device check for the checkpoint work: xserv synth of the real 20b config on the GPU machine,
# HF transformers loading it (BF16 vs fp32 conditioning), and the BF16 fixture references made on
# the GPU. Run through the device tool with carry [build/cli/xserv, .device]; results go to $OUT.
set -uo pipefail
export LD_LIBRARY_PATH=/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)'
./build/cli/xserv --help >/dev/null && echo "xserv binary runs"

echo "== xserv synth: gpt-oss-20b, seed 0 =="
rm -rf /tmp/g20
/usr/bin/time -f "synth wall %e s, max RSS %M KB" ./build/cli/xserv synth \
  --config .device/gpt-oss-20b.json -o /tmp/g20 --seed 0 2>&1 | tail -6
du -sh /tmp/g20; ls /tmp/g20

echo "== HF transformers loads it: BF16 vs fp32 on the GPU =="
python3 tools/hf_dtype_check.py /tmp/g20 --tokens 64 --greedy 16 2>&1 | grep -v Warning | tee "$OUT/hf_20b_dtype_check.txt"

echo "== BF16 fixture references on the GPU =="
python3 tools/make_fixtures.py --dtypes bfloat16 --device cuda 2>&1 | tail -12
for f in tiny2l deep4l window16; do cp tests/fixtures/$f/hf_bfloat16.json "$OUT/${f}_hf_bfloat16.json"; done
ls -la "$OUT"
