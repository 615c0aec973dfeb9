#!/usr/bin/env python3
"""Where xserv departs from HF transformers, layer by layer, on a teacher-forced prompt.

Usage:
  xserv trace PLAN --prompt-ids 1,2,3 -o trace.f32 [--backend cpu|cuda]
  tools/hf_layer_compare.py CHECKPOINT trace.f32 [--dtype float32|bfloat16] [--device cpu|cuda]
      [--tol 1e-3]

Reads the trace (trace.f32.json names its values: the embedding, then each layer's output, the
residual stream after the layer's MoE block) and runs the same ids through HF, loaded as
tools/hf_reference.py loads it, capturing the embedding's and every decoder layer's output with
forward hooks. Prints, per value, the relative L2 distance per position (median and max) and
names the first value whose worst position exceeds --tol; exits 1 when one does. Against HF fp32
an xserv trace from the interpreter agrees to ~1e-6 and one from the GPU engine to ~1e-4 (its
bf16 weights are the checkpoint's; activations fp32), so a value far above that is where to
look.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_reference import load_model  # noqa: E402  (the fixtures' loading, exactly)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("trace", help="the file `xserv trace -o` wrote (its .json beside it)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--tol", type=float, default=1e-3,
                   help="worst relative L2 per position above which a value departs")
    a = p.parse_args()
    with open(a.trace + ".json") as f:
        meta = json.load(f)
    names, tokens, hidden = meta["values"], meta["tokens"], meta["hidden"]
    xs = np.fromfile(a.trace, "<f4")
    if xs.size != len(names) * tokens * hidden:
        sys.exit(f"{a.trace}: {xs.size} floats, but its .json describes "
                 f"{len(names)} x {tokens} x {hidden}")
    xs = xs.reshape(len(names), tokens, hidden)

    model = load_model(a.checkpoint, a.dtype, a.device)
    captured = {}

    def keep(name):
        def hook(_module, _inputs, output):
            out = output[0] if isinstance(output, tuple) else output
            captured[name] = out[0].detach().float().cpu().numpy()
        return hook

    inner = model.model
    hooks = [inner.embed_tokens.register_forward_hook(keep("embedding"))]
    for i, layer in enumerate(inner.layers):
        hooks.append(layer.register_forward_hook(keep(f"layer {i}")))
    ids = torch.tensor([meta["ids"]], device=a.device)
    with torch.no_grad():
        model(input_ids=ids)
    for h in hooks:
        h.remove()

    print(f"xserv trace ({meta['backend']}, {tokens} tokens) against HF {a.dtype} on {a.device}")
    print(f"{'value':>12}  {'median rel L2':>14}  {'max rel L2':>12}  worst position")
    first_bad = None
    for name, x in zip(names, xs):
        if name not in captured:
            sys.exit(f"HF has no {name!r}: the trace and the checkpoint disagree on the layers")
        ref = captured[name].astype(np.float64)
        rel = np.linalg.norm(x - ref, axis=1) / np.maximum(np.linalg.norm(ref, axis=1), 1e-30)
        worst = int(np.argmax(rel))
        print(f"{name:>12}  {np.median(rel):14.3e}  {rel[worst]:12.3e}  {worst}")
        if first_bad is None and rel[worst] > a.tol:
            first_bad = name
    if first_bad is None:
        print(f"every value within {a.tol:g} at every position")
        return 0
    print(f"first departure: {first_bad} (worst position above {a.tol:g})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
