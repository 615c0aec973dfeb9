"""HF transformers reference for the batch fixtures: several prompts, stored compactly.

A batch fixture (tests/fixtures/NAME/fixture.json with "prompts") holds prompts of different
lengths that the C++ tests run together in one batch, in chunks, through the engine and the GPU.
HF runs each prompt alone (batch 1: the reference for what a batch must reproduce), and this
module returns, per prompt:
  * the greedy continuation (argmax over a KV cache, checked against an uncached forward) and
    its top-2 margins;
  * teacher-forced logits at the stored positions of prompt + continuation (all of them, or
    `first` + every `every`-th + the `last` ones), over all vocabulary columns or a fixed sample
    of them (a 201,088-wide row is 800 kB), with each row's logsumexp over the full vocabulary,
    its argmax and top-2 margin;
and over all prompts: the smallest router k-th/(k+1)-th gap, and how often the SwiGLU clamp
bites (gate above the limit, up below -limit, up above +limit), counted from the experts'
inputs with the checkpoint's own weights.

The rows go to a little-endian float32 file (rows x columns, prompts in order, positions
ascending); the JSON record names the file and lists the positions and columns.
"""

import math

import torch
import transformers

from hf_reference import greedy_decode, load_model, round_sig, top2_margin


def stored_positions(n, rule):
    """Positions of a sequence of n tokens whose logits are stored."""
    if rule == "all":
        return list(range(n))
    keep = set(range(min(n, rule["first"])))
    keep.update(range(0, n, rule["every"]))
    keep.update(range(max(0, n - rule["last"]), n))
    return sorted(keep)


def stored_columns(vocab, spec):
    """Vocabulary columns stored: all, or `sample` evenly spread ids plus the `top` highest."""
    if spec is None:
        return None
    cols = set(range(0, vocab, max(1, vocab // spec["sample"])))
    cols.update(range(vocab - spec["top"], vocab))
    return sorted(cols)


class Probe:
    """Forward hooks that record router gaps and SwiGLU clamp hits of every layer."""

    def __init__(self, model):
        self.k = model.config.num_experts_per_tok
        self.limit = float(model.config.swiglu_limit)
        self.router_gap = math.inf
        self.clamp = {"gate_above": 0, "up_below": 0, "up_above": 0, "elements": 0}
        self.handles = []
        for layer in model.model.layers:
            self.handles.append(layer.mlp.router.register_forward_hook(self.router_hook))
            self.handles.append(
                layer.mlp.experts.register_forward_hook(self.experts_hook, with_kwargs=True)
            )

    def router_hook(self, module, inputs, _output):
        # Recomputed from the router's input: what the router returns differs across versions.
        r = torch.nn.functional.linear(inputs[0], module.weight, module.bias)
        top = torch.topk(r.float(), self.k + 1, dim=-1).values
        self.router_gap = min(self.router_gap, float((top[:, self.k - 1] - top[:, self.k]).min()))

    def experts_hook(self, module, args, kwargs, _output):
        # GptOssExperts.forward(hidden_states, router_indices, routing_weights): recompute each
        # token's gate_up for its selected experts from the module's own weights.
        names = ("hidden_states", "router_indices", "routing_weights")
        values = list(args) + [kwargs[n] for n in names[len(args) :] if n in kwargs]
        x, idx = values[0], values[1]
        x = x.reshape(-1, x.shape[-1]).float()
        idx = idx.reshape(x.shape[0], -1)
        w, b = module.gate_up_proj.float(), module.gate_up_proj_bias.float()
        for j in range(idx.shape[1]):
            e = idx[:, j]
            gu = torch.bmm(x[:, None, :], w[e])[:, 0, :] + b[e]
            gate, up = gu[:, 0::2], gu[:, 1::2]
            self.clamp["gate_above"] += int((gate > self.limit).sum())
            self.clamp["up_below"] += int((up < -self.limit).sum())
            self.clamp["up_above"] += int((up > self.limit).sum())
            self.clamp["elements"] += gate.numel()

    def remove(self):
        for h in self.handles:
            h.remove()


def degenerate(tokens):
    """Why a greedy continuation is degenerate (few distinct ids, or a short cycle), or None."""
    if len(set(tokens)) < len(tokens) // 2:
        return f"only {len(set(tokens))} distinct tokens in {len(tokens)}"
    tail = tokens[len(tokens) // 2 :]
    for p in range(1, 5):
        if all(tail[i] == tail[i + p] for i in range(len(tail) - p)):
            return f"a cycle of {p} tokens"
    return None


def batch_reference(checkpoint, prompts, greedy, positions_rule, columns_spec):
    """Runs each prompt alone; returns (JSON-ready record, float32 rows [R, C] as a tensor)."""
    model = load_model(checkpoint, "float32", "cpu")
    vocab = model.config.vocab_size
    cols = stored_columns(vocab, columns_spec)
    probe = Probe(model)
    sequences, rows = [], []
    try:
        with torch.no_grad():
            for ids in prompts:
                continuation = greedy_decode(model, ids, greedy)
                full = model(input_ids=torch.tensor([ids + continuation])).logits[0].float()
                uncached = torch.argmax(full[len(ids) - 1 : -1], dim=-1).tolist()
                if uncached != continuation:
                    raise SystemExit(
                        f"greedy with a KV cache {continuation} != uncached argmax {uncached}"
                    )
                pos = stored_positions(len(ids) + greedy, positions_rule)
                sel = full[pos]
                rows.append(sel if cols is None else sel[:, cols])
                sequences.append(
                    {
                        "prompt_tokens": len(ids),
                        "greedy": continuation,
                        "greedy_margin": round_sig(top2_margin(full[len(ids) - 1 : -1])),
                        "positions": pos,
                        "argmax": torch.argmax(sel, dim=-1).tolist(),
                        "top2_margin": round_sig(top2_margin(sel)),
                        "logsumexp": round_sig(torch.logsumexp(sel.double(), -1).tolist(), 17),
                    }
                )
    finally:
        probe.remove()
    record = {
        "dtype": "float32",
        "device": "cpu",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "vocab_size": vocab,
        "columns": cols,
        "sequences": sequences,
        "router_min_gap": probe.router_gap,
        "clamp": probe.clamp,
    }
    return record, torch.cat(rows).contiguous()
