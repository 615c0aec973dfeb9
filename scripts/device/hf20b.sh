#!/usr/bin/env bash
# xserv's CUDA engine against HF transformers (BF16 and fp32) in one call: tools/hf_20b_reference.py
# writes HF's logits for a random prompt (teacher-forced) and its greedy tokens, then
# engine_gpu_tests' "gpu: synthetic 20b" cases (tests/engine/hf20b_gpu_test.cpp) compile the checkpoint
# with split and plain bf16 gemms (and plain bf16 in the canonical order, and over a bf16 KV
# cache) and compare (relative L2 per position, shared greedy steps).
#   MODEL=20b      (default; an H200, ~5 min: HF fp32 of the 20b does not fit an H100's 80 GB)
#                  the synthetic 20b, 256 ids, 64 greedy steps
#   MODEL=120b-4l  (an H100 or H200, ~1 min) gpt-oss-120b's config cut to its first 4 layers (the
#                  120b's router, MoE and attention widths), 96 ids, 32 greedy steps
#   MODEL=120b     (nvidia-h200-x2, ~6 min) the whole 120b: xserv with --pp 2 over the two GPUs,
#                  then HF BF16 spread over them (device_map auto, 234 GB), 64 ids, 32 greedy
#                  tokens: how many the two share (xserv runs first, so its part comes back
#                  even if HF's load runs long)
# Needs .device/bin/{xserv,engine_gpu_tests}, .device/data/gpt-oss-20b.json, torch + transformers
# on the machine; carry [".device/bin", ".device/data"]. Logs land in $OUT.
source "$(dirname "$0")/common.sh"
gpu_info
model=${MODEL:-20b}

# reference CKPT TOKENS GREEDY: HF's BF16 and fp32 reference of CKPT into /tmp/ref.
reference() {
  timeout 240 python3 tools/hf_20b_reference.py "$1" --ids-seed 0 --tokens "$2" --greedy "$3" \
    --out /tmp/ref > "$OUT/hf_ref.log" 2>&1
  echo "== HF reference rc=$? at $(at)"
  grep -vE "warn|Warn|^\s*$" "$OUT/hf_ref.log" | tail -6 | cut -c1-200
  cp /tmp/ref/meta.json "$OUT/hf_meta.json" 2> /dev/null
}

# compare CKPT: engine_gpu_tests' HF cases on CKPT against /tmp/ref.
compare() {
  XSERV_20B_CKPT=$1 XSERV_20B_REF=/tmp/ref timeout 400 $B/engine_gpu_tests \
    -tc="gpu: synthetic 20b*" > "$OUT/hf_test.log" 2>&1
  echo "== HF test rc=$?: $(grep -E '^\[doctest\] test cases' "$OUT/hf_test.log" | tail -1)"
  grep -E "MESSAGE|ERROR|CHECK|positions over|greedy step" -A1 "$OUT/hf_test.log" |
    grep -vE "^--$" | cut -c1-220 | head -30
}

case $model in
  20b)
    synth20b
    reference /tmp/g20 256 64
    compare /tmp/g20
    ;;
  120b-4l)
    python3 - << 'PY'
import json
c = json.load(open("examples/gpt-oss-120b/config.json"))
c["num_hidden_layers"] = 4
c["layer_types"] = c["layer_types"][:4]
json.dump(c, open("/tmp/g120s.json", "w"), indent=1)
PY
    rm -rf /tmp/g120s
    $X synth --config /tmp/g120s.json -o /tmp/g120s --seed 0 2>&1 | tail -1
    reference /tmp/g120s 96 32
    compare /tmp/g120s
    ;;
  120b)
    [ "$NGPU" -ge 2 ] || { echo "MODEL=120b needs two GPUs (nvidia-h200-x2)"; exit 1; }
    rm -rf /tmp/g20
    $X synth --config examples/gpt-oss-120b/config.json -o /tmp/g120 --seed 0 2>&1 | tail -1
    echo "== synth done at $(at)"
    # The prompt hf_20b_reference.py draws for --ids-seed 0 --tokens 64 (the 120b's vocabulary).
    ids=$(python3 -c 'import sys; sys.path.insert(0, "tools"); from hf_20b_reference import draw_ids
print(",".join(str(int(i)) for i in draw_ids(0, 64, 201088)[0]))')
    $X compile /tmp/g120 -o /tmp/p120 --pp 2 --max-seq 4096 --max-batch 8 2>&1 | tail -1
    timeout 240 $X run /tmp/p120 --backend cuda --prompt-ids "$ids" --max-tokens 32 \
      > "$OUT/x120.txt" 2> "$OUT/x120.err"
    echo "xserv pp 2 rc=$? at $(at)"
    grep -E "^\[run\]|\[cuda\] ready|\[load\] done|ranks ready" "$OUT/x120.err"
    rows "pp2" $X /tmp/p120 -p 512 -n 32 -b 1,8 -r 1
    echo "== xserv done at $(at)"
    timeout $((560 - (SECONDS - start))) python3 tools/hf_20b_reference.py /tmp/g120 --ids-seed 0 \
      --tokens 64 --greedy 32 --out /tmp/ref120 --device-map auto --bf16-only > "$OUT/hf120.log" 2>&1
    echo "HF rc=$? at $(at)"
    grep -vE "warn|Warn|Loading|^\s*$" "$OUT/hf120.log" | tail -4
    python3 - "$OUT/x120.txt" /tmp/ref120/hf_bf16_greedy.json "$ids" /tmp/ref120/ids.txt << 'PY'
import json, sys
xs = [int(t) for t in open(sys.argv[1]).read().strip().split(",") if t]
ref = json.load(open(sys.argv[2]))
same_prompt = sys.argv[3].split(",") == open(sys.argv[4]).read().split()
hf, margin = ref["greedy"], ref["margin"]
shared = next((i for i, (a, b) in enumerate(zip(xs, hf)) if a != b), min(len(xs), len(hf)))
low = next((i for i, m in enumerate(margin) if m < 0.05), len(margin))
print(f"same prompt: {same_prompt}; xserv pp 2 vs HF BF16 (2 GPUs): {shared} of {len(hf)} greedy "
      f"tokens shared; HF's own top-2 margin first below 0.05 at step {low}")
PY
    ;;
  *)
    echo "MODEL is 20b, 120b-4l or 120b"
    exit 2
    ;;
esac
echo "== done at $(at)"
