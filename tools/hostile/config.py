"""Class "config": config.json fields at hostile values, missing, inconsistent or unparsable,
compiled and (when compile accepts them) run."""
import json
import os
import re

from .common import (C, RUN_ARGS, X, classify, copy_model, message_line, record, run_cmd,
                     scratch)


def config_case(desc, mutate, expect="fail", names=None, raw=None):
    d = scratch("case_model")
    copy_model(d)
    cp = os.path.join(d, "config.json")
    if raw is not None:
        open(cp, "wb").write(raw)
    else:
        cfg = json.load(open(cp))
        mutate(cfg)
        with open(cp, "w") as f:
            json.dump(cfg, f)
    out = scratch("case_plan")
    cmd = X("compile", d, "-o", out, "--max-batch", 2, "--max-seq", 64, "--no-cubins")
    rc, o, err, wall, to = run_cmd(cmd)
    left = rc != 0 and os.path.exists(out)
    oc = classify(rc, err, to, expect, names or ["config.json"], left)
    note = ""
    if rc == 0 and not to:  # compile accepted it: does the plan run?
        cmd2 = X("run", out, *RUN_ARGS)
        rc2, o2, err2, wall2, to2 = run_cmd(cmd2)
        note = f"compile rc 0; run rc {rc2}: {message_line(err2)[:150]}"
        if expect == "fail":
            oc = classify(rc2, err2, to2, "fail", names or ["config.json"])
            if oc == "clean":  # refused only at run time, after a plan was written
                oc = "silent_wrong" if rc2 == 0 else "clean"
        elif classify(rc2, err2, to2, "either", None) in ("crash", "hang"):
            oc = classify(rc2, err2, to2, "either", None)
        wall += wall2
    record("config", desc, rc, err, wall, oc, note=note, cmd=" ".join(cmd))


def config_cases():
    base = json.load(open(os.path.join(C.model, "config.json")))
    numeric = [k for k, v in base.items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
    for k in numeric:
        values = [0, -1, 2 ** 31, 2 ** 63, 1.5, "64", None]
        if isinstance(base[k], float):
            values = [0, -1.0, 1e308, float("inf"), "x", None]
        for v in values:
            exp = "fail"
            # fields the compiler may legitimately ignore or accept in some of these forms
            if k in ("initial_context_length", "pad_token_id", "initializer_range",
                     "router_aux_loss_coef", "attention_dropout"):
                exp = "either"
            if k == "max_position_embeddings" and v == 2 ** 31:
                exp = "either"
            if k == "swiglu_limit" and v == 1e308:
                exp = "either"
            if k == "rope_theta" and v == 1e308:
                exp = "either"
            name = json.dumps(v) if not isinstance(v, float) or v == v else "NaN"
            if isinstance(v, float) and v in (float("inf"),):
                # json.dump writes Infinity, which is not JSON
                config_case(f"{k} = Infinity", None, exp, [k, "config.json"],
                            raw=json.dumps({**base, k: 0}).replace(
                                f'"{k}": 0', f'"{k}": Infinity').encode())
                continue
            config_case(f"{k} = {name}", lambda c, k=k, v=v: c.__setitem__(k, v), exp,
                        [k])
    for k in ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "head_dim", "vocab_size", "num_local_experts", "intermediate_size", "rms_norm_eps",
              "rope_theta", "sliding_window", "model_type", "rope_scaling", "swiglu_limit"]:
        config_case(f"missing {k}", lambda c, k=k: c.pop(k), "fail", [k])
    # What transformers' GptOssConfig also reads without: the top-k from its duplicate
    # experts_per_token, and layer_types as the alternation it defaults to (controls); the top-k
    # with neither is missing.
    config_case("missing num_experts_per_tok (experts_per_token kept: control)",
                lambda c: c.pop("num_experts_per_tok"), "either")
    config_case("missing num_experts_per_tok and experts_per_token",
                lambda c: (c.pop("num_experts_per_tok"), c.pop("experts_per_token", None)), "fail",
                ["num_experts_per_tok"])
    config_case("missing layer_types (the default alternation: control)",
                lambda c: c.pop("layer_types"), "either")
    more = [
        ("model_type llama", lambda c: c.__setitem__("model_type", "llama"), ["model_type"]),
        ("model_type 7", lambda c: c.__setitem__("model_type", 7), ["model_type"]),
        ("architectures wrong", lambda c: c.__setitem__("architectures", ["LlamaForCausalLM"]),
         ["architectures", "GptOss"]),
        ("heads 3 over kv heads 2", lambda c: c.__setitem__("num_attention_heads", 3),
         ["num_attention_heads", "num_key_value_heads"]),
        ("kv heads 3 > heads... 4/3", lambda c: c.__setitem__("num_key_value_heads", 3),
         ["num_key_value_heads"]),
        ("kv heads 8 > heads 4", lambda c: c.__setitem__("num_key_value_heads", 8),
         ["num_key_value_heads"]),
        ("experts_per_tok 9 > experts 8", lambda c: c.__setitem__("num_experts_per_tok", 9),
         ["num_experts_per_tok", "experts_per_token"]),
        ("experts_per_token disagrees with num_experts_per_tok",
         lambda c: c.__setitem__("experts_per_token", 4), ["experts_per_t"]),
        ("layer_types too short", lambda c: c.__setitem__("layer_types", ["full_attention"]),
         ["layer_types"]),
        ("layer_types too long", lambda c: c.__setitem__("layer_types", ["full_attention"] * 3),
         ["layer_types"]),
        ("layer_types empty", lambda c: c.__setitem__("layer_types", []), ["layer_types"]),
        ("layer_types unknown value", lambda c: c.__setitem__(
            "layer_types", ["sliding_attention", "chunked_attention"]), ["layer_types"]),
        ("layer_types not a list", lambda c: c.__setitem__("layer_types", "full_attention"),
         ["layer_types"]),
        ("layer_types holds numbers", lambda c: c.__setitem__("layer_types", [0, 1]),
         ["layer_types"]),
        ("sliding_window larger than max_position", lambda c: c.__setitem__(
            "sliding_window", 10 ** 6), ["sliding_window"]),
        ("rope_scaling null", lambda c: c.__setitem__("rope_scaling", None), ["rope_scaling"]),
        ("rope_scaling a list", lambda c: c.__setitem__("rope_scaling", [1, 2]), ["rope_scaling"]),
        ("rope_scaling empty object", lambda c: c.__setitem__("rope_scaling", {}),
         ["rope_scaling", "rope_type", "factor"]),
        ("rope_type linear", lambda c: c["rope_scaling"].__setitem__("rope_type", "linear"),
         ["rope_type", "rope_scaling"]),
        ("rope factor 0", lambda c: c["rope_scaling"].__setitem__("factor", 0), ["factor"]),
        ("rope factor -32", lambda c: c["rope_scaling"].__setitem__("factor", -32.0), ["factor"]),
        ("rope factor string", lambda c: c["rope_scaling"].__setitem__("factor", "32"),
         ["factor"]),
        ("rope beta_fast < beta_slow", lambda c: c["rope_scaling"].__setitem__("beta_fast", 0.5),
         ["beta"]),
        ("rope original_max 0", lambda c: c["rope_scaling"].__setitem__(
            "original_max_position_embeddings", 0), ["original_max"]),
        ("rope original_max -1", lambda c: c["rope_scaling"].__setitem__(
            "original_max_position_embeddings", -1), ["original_max"]),
        ("rope truncate string", lambda c: c["rope_scaling"].__setitem__("truncate", "no"),
         ["truncate"]),
        ("eos_token_id beyond 2^30", lambda c: c.__setitem__("eos_token_id", [2 ** 31]),
         ["eos_token_id"]),
        ("eos_token_id string", lambda c: c.__setitem__("eos_token_id", "x"), ["eos_token_id"]),
        ("head_dim 2^21", lambda c: c.__setitem__("head_dim", 2 ** 21), ["head_dim"]),
        ("head_dim odd 15", lambda c: c.__setitem__("head_dim", 15), ["head_dim"]),
        ("quantization_config quant_method gptq", lambda c: c["quantization_config"].__setitem__(
            "quant_method", "gptq"), ["quant"]),
        ("quantization_config a string", lambda c: c.__setitem__("quantization_config", "mxfp4"),
         ["quantization_config"]),
        ("tie_word_embeddings true (lm_head present)", lambda c: c.__setitem__(
            "tie_word_embeddings", True), ["tie_word_embeddings", "lm_head"]),
        ("num_hidden_layers 200000", lambda c: c.__setitem__("num_hidden_layers", 200000),
         ["num_hidden_layers", "layer_types"]),
        ("hidden_size 63 (odd)", lambda c: c.__setitem__("hidden_size", 63), ["hidden_size"]),
        ("unknown extra fields", lambda c: c.update({"foo": 1, "bar": {"x": []}}), None),
    ]
    for desc, fn, names in more:
        exp = "either" if desc in ("unknown extra fields",) else "fail"
        config_case(desc, fn, exp, names)
    # a sliding window far beyond the plan's max-seq: the ring needs no more than max-seq slots
    for w in (1_000_000, 4_000_000):
        d = scratch("case_model")
        copy_model(d)
        cp = os.path.join(d, "config.json")
        cfg = json.load(open(cp))
        cfg["sliding_window"] = w
        json.dump(cfg, open(cp, "w"))
        out = scratch("case_plan")
        rc, o, err, wall, to = run_cmd(X("compile", d, "-o", out, "--max-batch", 2, "--max-seq",
                                         64, "--no-cubins"))
        if rc != 0:
            record("config", f"sliding_window {w} on a max-seq 64 plan", rc, err, wall,
                   classify(rc, err, to, "either", ["sliding_window"]))
            continue
        cmd = ["/usr/bin/time", "-f", "MAXRSS_KB %M"] + X("run", out, *RUN_ARGS)
        rc, o, err, wall2, to = run_cmd(cmd)
        m = re.search(r"MAXRSS_KB (\d+)", err)
        mib = int(m.group(1)) // 1024 if m else 0
        oc = classify(rc, err, to, "either", None)
        if oc == "clean" and mib > 512:
            oc = "resource"
        record("config", f"sliding_window {w} on a max-seq 64 plan (run peak RSS)", rc, err,
               wall + wall2, oc, note=f"run peak RSS {mib} MiB", cmd=" ".join(cmd))
    for raw, desc in [(b"", "empty config.json"), (b"{", "config.json truncated '{'"),
                      (b"[]", "config.json a list"), (b"\x00\x01\x02", "config.json binary"),
                      (json.dumps(base).encode()[:200], "config.json cut at 200 bytes")]:
        config_case(desc, None, "fail", ["config.json"], raw=raw)
