#!/usr/bin/env python3
"""How well-conditioned a (synthetic) gpt-oss checkpoint is: HF transformers' BF16 run against
its own fp32 run on the same random prompt, on the GPU.

Usage: tools/hf_dtype_check.py CHECKPOINT [--tokens 64] [--greedy 16] [--seed 0]

Loads with Mxfp4Config(dequantize=True) and eager (sink-aware) attention in BF16, runs the prompt
and a greedy continuation, then converts to fp32 (TF32 off) and repeats. Prints load time, peak
GPU memory, per-position relative L2 of the BF16 logits against fp32 (median and max), and for
how many greedy steps the two agree. A chaotic random network shows tens of percent and an
early disagreement; a well-conditioned one a few percent and several shared steps.
"""

import argparse
import time

import torch
from transformers import AutoModelForCausalLM, Mxfp4Config


def run(model, ids, greedy):
    with torch.no_grad():
        logits = model(ids).logits[0].float()
        out = model.generate(ids, max_new_tokens=greedy, do_sample=False, top_p=None, top_k=None,
                             temperature=None)
    return logits, out[0, ids.shape[1]:].tolist()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoint")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--greedy", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(
        args.checkpoint, quantization_config=Mxfp4Config(dequantize=True), dtype=torch.bfloat16,
        attn_implementation="eager", device_map="cuda")
    torch.cuda.synchronize()
    load_s = time.time() - t0
    gen = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, model.config.vocab_size, (1, args.tokens), generator=gen).cuda()
    t1 = time.time()
    bf16_logits, bf16_tokens = run(model, ids, args.greedy)
    torch.cuda.synchronize()
    bf16_s = time.time() - t1
    mem_bf16 = torch.cuda.max_memory_allocated() / 2**30
    model.float()
    fp32_logits, fp32_tokens = run(model, ids, args.greedy)
    rel = ((bf16_logits - fp32_logits).norm(dim=-1) / fp32_logits.norm(dim=-1)).cpu()
    shared = next((i for i, (a, b) in enumerate(zip(bf16_tokens, fp32_tokens)) if a != b),
                  len(bf16_tokens))
    print(f"checkpoint       {args.checkpoint}")
    print(f"load (bf16)      {load_s:.1f} s, peak GPU memory {mem_bf16:.1f} GiB")
    print(f"bf16 forward+gen {bf16_s:.2f} s for {args.tokens} + {args.greedy} tokens")
    print(f"rel L2 bf16/fp32 median {rel.median():.4f}, max {rel.max():.4f} over {args.tokens} "
          f"positions")
    print(f"greedy           bf16 {bf16_tokens}\n                 fp32 {fp32_tokens}")
    print(f"greedy agreement {shared} of {args.greedy} steps")


if __name__ == "__main__":
    main()
