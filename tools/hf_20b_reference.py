#!/usr/bin/env python3
"""HF transformers reference for a full-size (synthetic) gpt-oss checkpoint, in BF16 and fp32.

Usage:
  tools/hf_20b_reference.py CHECKPOINT --ids-seed S --tokens 256 --greedy 64 --out DIR

Draws `--tokens` random ids (torch.Generator seeded with S, uniform over the vocabulary), loads
the checkpoint exactly as tools/hf_reference.py does (Mxfp4Config(dequantize=True), BF16, eager
attention, on the GPU), and writes into DIR:
  ids.txt                 the ids, space separated, one line
  hf_bf16_logits.f32      raw little-endian float32 logits of every position, [tokens, vocab]
  hf_bf16_greedy.json     {"greedy": [...], "margin": [...]}: argmax continuation (one prefill,
                          then one cached step per token) and each step's top-1 minus top-2 logit
then converts the model with model.float() (TF32 off: true fp32 matmuls) and writes the same as
hf_fp32_logits.f32 and hf_fp32_greedy.json, plus meta.json (vocab, versions, timings, memory).
With --device-map auto the layers spread over every visible GPU (gpt-oss-120b in BF16 needs two
H200s); --bf16-only skips the fp32 run (120b in fp32 fits nowhere here).
"""

import argparse
import json
import os
import sys
import time

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_reference import load_model  # noqa: E402  (same loading as the fixture references)
from transformers import DynamicCache  # noqa: E402


def greedy_with_margins(model, ids, n):
    """Argmax continuation of n tokens over a KV cache, with each step's top-2 margin."""
    import inspect

    cache = DynamicCache(config=model.config)
    names = inspect.signature(model.forward).parameters
    cache_kw = {"cache" if "cache" in names else "past_key_values": cache}
    step = ids
    tokens, margins = [], []
    for _ in range(n):
        logits = model(input_ids=step, use_cache=True, **cache_kw).logits
        row = logits[0, -1].float()
        top = torch.topk(row, 2)
        token = int(torch.argmax(row))  # lowest id on ties
        tokens.append(token)
        margins.append(float(top.values[0] - top.values[1]))
        step = torch.tensor([[token]], device=ids.device)
    del cache
    return tokens, margins


def run(model, ids, greedy, out_dir, tag):
    t0 = time.time()
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float().cpu()
        torch.cuda.empty_cache()
        tokens, margins = greedy_with_margins(model, ids, greedy)
    torch.cuda.synchronize()
    seconds = time.time() - t0
    logits.numpy().astype("<f4").tofile(os.path.join(out_dir, f"hf_{tag}_logits.f32"))
    with open(os.path.join(out_dir, f"hf_{tag}_greedy.json"), "w") as f:
        json.dump({"greedy": tokens, "margin": margins}, f)
        f.write("\n")
    print(f"[{tag}] forward + greedy {seconds:.1f} s, peak GPU memory "
          f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB, min greedy margin "
          f"{min(margins):.3g}, greedy {tokens[:16]}...", flush=True)
    return logits, tokens, seconds


def draw_ids(seed, tokens, vocab):
    """The random prompt of --ids-seed SEED (scripts/device/hf20b.sh hands xserv the same)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (1, tokens), generator=gen)


def write_meta(out_dir, meta):
    with open(os.path.join(out_dir, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--ids-seed", type=int, default=0)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--greedy", type=int, default=64)
    p.add_argument("--out", required=True, help="directory to write")
    p.add_argument("--device-map", default="cuda", choices=["cuda", "auto"],
                   help="cuda: one GPU; auto: the layers spread over every visible GPU")
    p.add_argument("--bf16-only", action="store_true", help="skip the fp32 run")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    t0 = time.time()
    model = load_model(a.checkpoint, "bfloat16", a.device_map)
    torch.cuda.synchronize()
    load_s = time.time() - t0
    vocab = model.config.vocab_size
    ids = draw_ids(a.ids_seed, a.tokens, vocab)
    with open(os.path.join(a.out, "ids.txt"), "w") as f:
        f.write(" ".join(str(int(i)) for i in ids[0]) + "\n")
    ids = ids.to(model.device)
    print(f"loaded {a.checkpoint} in {load_s:.1f} s; vocab {vocab}, {a.tokens} ids", flush=True)

    bf16, bf16_tokens, bf16_s = run(model, ids, a.greedy, a.out, "bf16")
    meta = {"checkpoint": a.checkpoint, "ids_seed": a.ids_seed, "tokens": a.tokens,
            "greedy": a.greedy, "vocab_size": vocab, "transformers": transformers.__version__,
            "torch": torch.__version__, "load_s": load_s, "bf16_s": bf16_s}
    if a.bf16_only:
        meta["device_map"] = a.device_map
        meta["peak_gib_per_gpu"] = [torch.cuda.max_memory_allocated(d) / 2**30
                                    for d in range(torch.cuda.device_count())]
        write_meta(a.out, meta)
        return
    torch.cuda.empty_cache()
    model.float()
    torch.cuda.empty_cache()
    fp32, fp32_tokens, fp32_s = run(model, ids, a.greedy, a.out, "fp32")

    rel = (bf16 - fp32).norm(dim=-1) / fp32.norm(dim=-1)
    shared = next((i for i, (x, y) in enumerate(zip(bf16_tokens, fp32_tokens)) if x != y),
                  len(bf16_tokens))
    meta.update({
        "fp32_s": fp32_s,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30,
        "bf16_vs_fp32_rel_l2_median": float(rel.median()),
        "bf16_vs_fp32_rel_l2_max": float(rel.max()),
        "bf16_fp32_greedy_shared": shared,
    })
    write_meta(a.out, meta)
    print(f"HF bf16 vs fp32: rel L2 median {rel.median():.4g}, max {rel.max():.4g}; greedy "
          f"shared {shared} of {a.greedy}", flush=True)


if __name__ == "__main__":
    main()
