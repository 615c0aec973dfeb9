#!/usr/bin/env python3
"""Golden reference logits and greedy continuations of a gpt-oss checkpoint from HF transformers.

Usage:
  tools/hf_reference.py CHECKPOINT --ids 1,2,3 --out FILE.json
      [--dtype float32|bfloat16] [--device cpu|cuda] [--greedy N]

HF transformers is the independent reference: the model is loaded and run exactly as a user of
transformers would, with the math untouched. Three loading details, all environment or config,
never arithmetic:
  * MXFP4 on CPU: with Mxfp4Config(dequantize=True), the quantizer's validate_environment()
    returns before any GPU/triton/kernels check, so CPU loading works unpatched (checked with
    transformers 5.24); nothing is monkeypatched.
  * pad_token_id: transformers refuses to build nn.Embedding when pad_token_id lies outside a
    small vocabulary. xserv's ModelConfig rejects such configs and the fixture configs carry
    none; for any other checkpoint the padding index only affects gradients and weight init
    (every weight here comes from the checkpoint), so it is dropped from the config.
  * device_map needs the `accelerate` package; without it the model is loaded on the CPU (the
    MXFP4 dequantisation is exact integer/power-of-two math either way) and moved with .to().
float32 loads in BF16 and then calls model.float(): loading directly in fp32 fails inside the
MXFP4 dequantisation. TF32 is switched off so CUDA fp32 matmuls are true fp32.

The JSON written holds: ids, dtype, device, versions, logits (one list per position, in 9
significant digits, which round-trip fp32 exactly, about 0.6 MB for 48 x 1024), the top-1 minus
top-2 logit margin per position, the greedy continuation (argmax, lowest id on ties, by a manual
loop over a KV cache) with its margins, whether an uncached forward of prompt + continuation picks
the same tokens (required in float32; bfloat16 rounds the two paths differently), and the
smallest router gap between the k-th and (k+1)-th expert over all layers and tokens (a near-tie
there makes expert choice depend on rounding; bfloat16 router logits tie exactly quite often).
"""

import argparse
import importlib.util
import inspect
import json
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache, Mxfp4Config

DTYPES = ("float32", "bfloat16")


def load_model(checkpoint, dtype, device):
    """Loads the checkpoint with dequantised MXFP4 experts and eager (sink-aware) attention."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    config = AutoConfig.from_pretrained(checkpoint)  # warns about pad_token_id; dropped below
    if config.pad_token_id is not None and not 0 <= config.pad_token_id < config.vocab_size:
        config.pad_token_id = None
    have_accelerate = importlib.util.find_spec("accelerate") is not None
    model, info = AutoModelForCausalLM.from_pretrained(
        checkpoint,
        config=config,
        quantization_config=Mxfp4Config(dequantize=True),
        dtype=torch.bfloat16,
        attn_implementation="eager",
        output_loading_info=True,
        **({"device_map": device} if have_accelerate else {}),
    )
    problems = {k: v for k, v in info.items() if v}
    if problems:
        sys.exit(f"{checkpoint}: transformers did not load every weight exactly: {problems}")
    if device != "auto":  # "auto": accelerate spread the layers over every visible GPU
        model = model.to(device)
    if dtype == "float32":
        model = model.float()
    model.eval()
    return model


def top2_margin(logits):
    """Top-1 minus top-2 value of each row of a [T, V] tensor."""
    top = torch.topk(logits.float(), 2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


def greedy_decode(model, ids, n):
    """Argmax continuation of n tokens: one prefill, then one cached step per token."""
    device = model.device
    cache = DynamicCache(config=model.config)
    # transformers 5.24 renamed past_key_values to cache (the old name warns until 5.40).
    names = inspect.signature(model.forward).parameters
    cache_kw = {"cache" if "cache" in names else "past_key_values": cache}
    step = torch.tensor([ids], device=device)
    out = []
    for _ in range(n):
        logits = model(input_ids=step, use_cache=True, **cache_kw).logits
        token = int(torch.argmax(logits[0, -1].float()))
        out.append(token)
        step = torch.tensor([[token]], device=device)
    return out


def forward_with_router_gap(model, ids):
    """Logits [T, V] of one uncached forward, and the smallest k-th/(k+1)-th router gap."""
    k = model.config.num_experts_per_tok
    gaps = []

    def hook(module, inputs, _output):
        # Recomputed from the router's input: what the router returns differs across versions.
        r = torch.nn.functional.linear(inputs[0], module.weight, module.bias)
        top = torch.topk(r.float(), k + 1, dim=-1).values
        gaps.append(float((top[:, k - 1] - top[:, k]).min()))

    handles = [layer.mlp.router.register_forward_hook(hook) for layer in model.model.layers]
    try:
        logits = model(input_ids=torch.tensor([ids], device=model.device)).logits[0]
    finally:
        for h in handles:
            h.remove()
    return logits, min(gaps)


def round_sig(values, digits=9):
    """Shortest-ish decimal text: 9 significant digits round-trip any fp32 value."""
    return [float(f"{v:.{digits - 1}e}") for v in values]


def reference(checkpoint, ids, dtype="float32", device="cpu", greedy=16):
    """Runs the checkpoint on `ids` and returns the JSON-ready reference record."""
    model = load_model(checkpoint, dtype, device)
    with torch.no_grad():
        logits, prompt_gap = forward_with_router_gap(model, ids)
        continuation = greedy_decode(model, ids, greedy)
        # An uncached forward over prompt + continuation must pick the same tokens.
        full, full_gap = forward_with_router_gap(model, ids + continuation)
    rows = full[len(ids) - 1 : len(ids) - 1 + greedy].float()
    uncached = torch.argmax(rows, dim=-1).tolist()
    if uncached != continuation and dtype == "float32":
        sys.exit(f"greedy with a KV cache {continuation} != uncached argmax {uncached}")
    logits = logits.float().cpu()
    return {
        "ids": ids,
        "dtype": dtype,
        "device": device,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "vocab_size": logits.shape[-1],
        "logits": [round_sig(row.tolist()) for row in logits],
        "top2_margin": round_sig(top2_margin(logits)),
        "greedy": continuation,
        "greedy_margin": round_sig(top2_margin(rows)),
        "greedy_uncached_agrees": uncached == continuation,
        "router_min_gap": min(prompt_gap, full_gap),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("--ids", required=True, help="comma-separated token ids")
    p.add_argument("--out", required=True, help="JSON file to write")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--greedy", type=int, default=16, help="tokens of greedy continuation")
    a = p.parse_args()
    ids = [int(x) for x in a.ids.split(",")]
    record = reference(a.checkpoint, ids, a.dtype, a.device, a.greedy)
    with open(a.out, "w") as f:
        json.dump(record, f, separators=(",", ":"))
        f.write("\n")
    print(
        f"{a.out}: {len(ids)} positions, greedy {record['greedy']}, "
        f"min top-2 margin {min(record['top2_margin']):.3g}, "
        f"router min gap {record['router_min_gap']:.3g}"
    )


if __name__ == "__main__":
    main()
