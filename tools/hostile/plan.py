"""Class "plan": damaged plan directories (plan.json fields, paths, kernels/, graph.ir, stage
programs, other --max-batch/--max-seq), --verify-weights and plan.json's config block."""
import json
import os
import re
import shutil

from .common import (C, RUN_ARGS, X, classify, copy_model, copy_plan, record, run_cmd,
                     scratch)


def plan_case(desc, mutate, expect="fail", names=None, src=None, extra=None, cmd_tail=None):
    d = scratch("case_planx")
    copy_plan(src or C.plan, d)
    mutate(d)
    cmd = X("run", d, *(cmd_tail or RUN_ARGS)) + (extra or [])
    rc, o, err, wall, to = run_cmd(cmd)
    oc = classify(rc, err, to, expect, names or ["plan.json", "graph.ir", "kernels", d, "checkpoint directory"])
    record("plan", desc, rc, err, wall, oc, note=("stdout: " + o.strip()[:80]) if rc == 0 else "",
           cmd=" ".join(cmd))


def edit_json(d, fn):
    p = os.path.join(d, "plan.json")
    j = json.load(open(p))
    fn(j)
    json.dump(j, open(p, "w"), indent=1)


def set_path(j, path, v):
    cur = j
    for k in path[:-1]:
        cur = cur[k]
    if v is KeyError:
        del cur[path[-1]]
    else:
        cur[path[-1]] = v


def plan_cases():
    pj = json.load(open(os.path.join(C.plan, "plan.json")))
    fields = [("version",), ("format",), ("graph",), ("model_dir",), ("model_digest",),
              ("options", "max_batch"), ("options", "max_seq"), ("options", "pp"),
              ("options", "kv_dtype"), ("options", "expert_format"), ("options", "arch"),
              ("options", "prefill_chunk"), ("options", "last_logits_only"),
              ("codegen", "arena_bytes"), ("codegen", "layout", "max_seq"),
              ("codegen", "layout", "max_batch"), ("codegen", "layout", "tokens"),
              ("codegen", "layout", "arena_bytes"), ("weights",), ("digests",),
              ("config",), ("memory", "arena_bytes"), ("codegen", "launch_table")]
    for path in fields:
        pname = ".".join(path)
        cur = pj
        for k in path:
            cur = cur[k]
        variants = [("deleted", KeyError), ("null", None), ("a list", [1]),
                    ("an object", {"x": 1})]
        if isinstance(cur, str):
            variants += [("a number", 7), ("empty string", "")]
        elif isinstance(cur, bool):
            variants += [("a string", "yes")]
        elif isinstance(cur, int):
            variants += [("a string", str(cur)), ("0", 0), ("-1", -1), ("2^40", 2 ** 40),
                         ("2^63", 2 ** 63), ("a float", cur + 0.5)]
        for vn, v in variants:
            exp = "fail"
            if path in [("memory", "arena_bytes"), ("codegen", "launch_table")] or \
                    path[0] in ("memory",) or (path[0] == "codegen" and v is KeyError):
                exp = "either"  # the CPU backend may not read codegen at all
            if path == ("model_dir",) and vn == "deleted":
                exp = "either"
            plan_case(f"plan.json {pname} {vn}", lambda d, path=path, v=v: edit_json(
                d, lambda j: set_path(j, path, v)), exp, [pname.split(".")[-1], "plan.json"])
    plan_case("plan.json version 999", lambda d: edit_json(d, lambda j: j.__setitem__(
        "version", 999)), "fail", ["version"])
    plan_case("plan.json version 1", lambda d: edit_json(d, lambda j: j.__setitem__(
        "version", 1)), "fail", ["version"])
    plan_case("plan.json format other", lambda d: edit_json(d, lambda j: j.__setitem__(
        "format", "onnx")), "fail", ["format"])
    plan_case("plan.json arch sm_100", lambda d: edit_json(d, lambda j: j["options"].__setitem__(
        "arch", "sm_100")), "either", ["arch"])
    plan_case("plan.json extra top-level fields", lambda d: edit_json(d, lambda j: j.update(
        {"zzz": 1, "stages2": []})), "either")
    plan_case("plan.json config.hidden_size 128", lambda d: edit_json(
        d, lambda j: j["config"].__setitem__("hidden_size", 128)), "fail",
        ["hidden_size", "config", "digest"])
    plan_case("plan.json config.vocab_size 10", lambda d: edit_json(
        d, lambda j: j["config"].__setitem__("vocab_size", 10)), "fail",
        ["vocab", "config", "digest"])
    for esc in ["../../../../etc/passwd", "/etc/passwd", "kernels/../../plan.json", "graph.ir\x00x",
                "", "."]:
        plan_case(f"plan.json graph path {esc!r}", lambda d, esc=esc: edit_json(
            d, lambda j: j.__setitem__("graph", esc)), "fail", ["graph", "plan"])
    plan_case("plan.json weights[0].file escapes", lambda d: edit_json(
        d, lambda j: j["weights"][0].__setitem__("file", "../../../../etc/passwd")), "fail",
        ["weights", "file", "passwd", "plan.json"])
    plan_case("plan.json weights[0].bytes off by one", lambda d: edit_json(
        d, lambda j: j["weights"][0].__setitem__("bytes", j["weights"][0]["bytes"] + 1)), "fail",
        ["safetensors", "bytes", "size"])
    plan_case("plan.json weights[0].sample_sha256 changed", lambda d: edit_json(
        d, lambda j: j["weights"][0].__setitem__("sample_sha256", "0" * 64)), "fail",
        ["safetensors", "sha", "digest"])
    plan_case("plan.json model_digest changed", lambda d: edit_json(
        d, lambda j: j.__setitem__("model_digest", "fnv1a64:0000000000000000")), "fail",
        ["digest", "config"])
    plan_case("plan.json digests entry path escapes", lambda d: edit_json(
        d, lambda j: j["digests"].__setitem__("../../../etc/passwd", "0" * 64)), "fail",
        ["digests", "passwd", "plan"])
    plan_case("plan.json not JSON", lambda d: open(os.path.join(d, "plan.json"), "w").write(
        "{\"version\": 2,"), "fail", ["plan.json"])
    plan_case("plan.json empty", lambda d: open(os.path.join(d, "plan.json"), "w").write(""),
              "fail", ["plan.json"])
    plan_case("plan.json deleted", lambda d: os.remove(os.path.join(d, "plan.json")), "fail",
              ["plan.json", "plan"])
    plan_case("plan.json a directory", lambda d: (os.remove(os.path.join(d, "plan.json")),
                                                  os.mkdir(os.path.join(d, "plan.json"))),
              "fail", ["plan.json"])
    # kernels/
    kdir = os.path.join(C.plan, "kernels")
    ks = sorted(f for f in os.listdir(kdir) if f.endswith(".cu"))
    for k in ks[:4] + ["xserv_kernels/gemm.cuh"]:
        plan_case(f"kernels/{k} edited", lambda d, k=k: open(os.path.join(d, "kernels", k), "a")
                  .write("\n// x\n"), "fail", [k, "kernels", "digest"])
        plan_case(f"kernels/{k} deleted", lambda d, k=k: os.remove(os.path.join(d, "kernels", k)),
                  "fail", [k, "kernels"])
    plan_case("kernels/ deleted", lambda d: shutil.rmtree(os.path.join(d, "kernels")), "fail",
              ["kernels"])
    plan_case("kernels/ file replaced by a symlink to itself's copy elsewhere",
              lambda d: (shutil.copy(os.path.join(d, "kernels", ks[0]), "/tmp/_hp_k.cu"),
                         os.remove(os.path.join(d, "kernels", ks[0])),
                         os.symlink("/tmp/_hp_k.cu", os.path.join(d, "kernels", ks[0]))),
              "either", [ks[0], "kernels", "link"])
    plan_case("kernels/ extra file", lambda d: open(os.path.join(d, "kernels", "evil.cu"), "w")
              .write("x"), "either")
    # graph.ir
    g = open(os.path.join(C.plan, "graph.ir")).read()
    gedits = [
        ("attention scale 0.25 -> 0.5", g.replace("scale=0.25", "scale=0.5", 1)),
        ("eps changed", g.replace("eps=1e-05", "eps=1e-03", 1)),
        ("weight name changed", g.replace('model.layers.0.self_attn.q_proj.weight',
                                          'model.layers.1.self_attn.q_proj.weight', 1)),
        ("window 8 -> 64", g.replace("window=8", "window=64", 1)),
        ("an op renamed to an unknown op", g.replace("rms_norm(", "rms_normz(", 1)),
        ("a line deleted", "\n".join(l for i, l in enumerate(g.splitlines()) if i != 12) + "\n"),
        ("lines swapped", "\n".join(g.splitlines()[:5][::-1] + g.splitlines()[5:]) + "\n"),
        ("forward reference %9999", re.sub(r"embedding\((%\d+), %\d+\)", r"embedding(\1, %9999)",
                                            g, count=1)),
        ("type changed f32 -> bf16", g.replace(": f32[T,64]", ": bf16[T,64]", 1)),
        ("shape changed [T,64] -> [T,65]", g.replace(": f32[T,64]", ": f32[T,65]", 1)),
        ("truncated at half", g[: len(g) // 2]),
        ("truncated mid-line", g[: len(g) // 3 + 7]),
        ("empty", ""),
        ("binary junk", "\x00\xff\xfe" * 100),
        ("a huge integer attribute", g.replace("head_dim=16", "head_dim=99999999999999999999", 1)),
        ("theta changed", g.replace("theta=150000.0", "theta=10000.0", 1)),
        ("return value changed", re.sub(r"return %(\d+)", lambda m: "return %6", g)),
        ("comment appended", g + "# hello\n"),
    ]
    for desc, txt in gedits:
        if txt == g:  # the edit found nothing to change: the case would test nothing
            record("plan", f"graph.ir {desc}", None, "", 0.0, "probe_error",
                   note="the edit left graph.ir as it was (its format changed?)")
            continue
        plan_case(f"graph.ir {desc}", lambda d, txt=txt: open(os.path.join(d, "graph.ir"), "w")
                  .write(txt), "fail", ["graph.ir"])
    plan_case("graph.ir deleted", lambda d: os.remove(os.path.join(d, "graph.ir")), "fail",
              ["graph.ir"])
    # other max-batch/max-seq used with other flags
    for fl, names in [(["--max-seq", "65"], ["max-seq", "max_seq", "64"]),
                      (["--max-seq", "1000000"], ["max-seq", "max_seq"]),
                      (["--max-batch", "3"], ["max-batch", "max_batch", "2"]),
                      (["--max-batch", "0"], ["max-batch"]), (["--max-seq", "0"], ["max-seq"]),
                      (["--max-seq", "32"], None), (["--max-batch", "1"], None)]:
        exp = "ok" if names is None else "fail"
        plan_case(f"plan (b2,s64) run with {' '.join(fl)}", lambda d: None, exp, names,
                  extra=fl)
    plan_case("pp2 plan run with --pp-local and a stage file edited", lambda d: open(
        os.path.join(d, "stage1.ir"), "a").write("\n"), "fail", ["stage1.ir"], src=C.pp_plan,
        extra=["--pp-local"])
    plan_case("pp2 plan: pipeline.stages[1].graph escapes", lambda d: edit_json(
        d, lambda j: j["pipeline"]["stages"][1].__setitem__("graph", "../../../etc/passwd")),
        "fail", ["stage", "plan.json", "passwd"], src=C.pp_plan, extra=["--pp-local"])
    plan_case("pp2 plan: pipeline.stages[1].graph -> stage0.ir, --pp-local", lambda d: edit_json(
        d, lambda j: j["pipeline"]["stages"][1].__setitem__("graph", "stage0.ir")),
        "fail", ["stage", "plan.json"], src=C.pp_plan, extra=["--pp-local"])
    plan_case("pp2 plan: stage graphs swapped, --pp-local", lambda d: edit_json(
        d, lambda j: [j["pipeline"]["stages"][0].__setitem__("graph", "stage1.ir"),
                      j["pipeline"]["stages"][1].__setitem__("graph", "stage0.ir")]),
        "fail", ["stage", "plan.json", "recv", "send"], src=C.pp_plan, extra=["--pp-local"])
    plan_case("pp2 plan: one stage dropped", lambda d: edit_json(
        d, lambda j: j["pipeline"].__setitem__("stages", j["pipeline"]["stages"][:1])),
        "fail", ["stages"], src=C.pp_plan, extra=["--pp-local"])
    plan_case("pp2 plan run with --world 3", lambda d: None, "fail", ["world"], src=C.pp_plan,
              extra=["--world", "3", "--coordinator", "127.0.0.1:1"])
    plan_case("pp1 plan run with --pp-local", lambda d: None, "either", ["pp", "pipelined"],
              extra=["--pp-local"])
    integrity_cases()


def flip_byte(path, offset):
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0x40]))


def integrity_cases():
    """--verify-weights (a full SHA-256 of every shard against compile's) and plan.json's config
    block against the checkpoint's config.json."""
    size = os.path.getsize(C.shard)
    # Between the first two 4 KiB blocks the sampled fingerprint reads after the first 64 KiB.
    mid = 65536 + (size - 65536 - 4096) // 63 // 2

    def model_with(mutate):
        m = scratch("case_model_vw")
        copy_model(m, copy_shard=True)
        mutate(m)
        return m
    vw = ["--verify-weights"]
    m = model_with(lambda m: flip_byte(os.path.join(m, C.shard_name), mid))
    plan_case("--verify-weights: one byte changed mid-shard", lambda d: None, "fail",
              [C.shard_name, "SHA-256"], extra=["--weights", m] + vw)
    plan_case("no --verify-weights: one byte changed mid-shard (unsampled: runs, documented)",
              lambda d: None, "either", None, extra=["--weights", m])
    m = model_with(lambda m: flip_byte(os.path.join(m, C.shard_name), size - 1))
    plan_case("--verify-weights: the last byte changed", lambda d: None, "fail",
              [C.shard_name, "SHA-256"], extra=["--weights", m] + vw)
    m = model_with(lambda m: flip_byte(os.path.join(m, C.shard_name), 8 + 10))
    plan_case("--verify-weights: a byte of the safetensors header changed", lambda d: None,
              "fail", [C.shard_name, "header", "safetensors", "sha256"], extra=["--weights", m] + vw)
    plan_case("--verify-weights on an intact checkpoint (control)", lambda d: None, "ok",
              extra=vw)
    plan_case("--verify-weights: the plan's sha256 deleted", lambda d: edit_json(
        d, lambda j: j["weights"][0].pop("sha256")), "fail", ["sha256"], extra=vw)
    plan_case("--verify-weights: the plan's sha256 not hex", lambda d: edit_json(
        d, lambda j: j["weights"][0].__setitem__("sha256", "g" * 64)), "fail", ["sha256"])
    plan_case("--verify-weights: the plan's sha256 of another shard", lambda d: edit_json(
        d, lambda j: j["weights"][0].__setitem__("sha256", "0" * 64)), "fail",
        [C.shard_name, "SHA-256"], extra=vw)
    m = model_with(lambda m: flip_byte(os.path.join(m, C.shard_name), mid))
    plan_case("--verify-weights, pp2 plan with spawned workers: a byte changed", lambda d: None,
              "fail", [C.shard_name, "SHA-256"], src=C.pp_plan, extra=["--weights", m] + vw)
    cmd = X("run", C.model, *RUN_ARGS, "--verify-weights")
    rc, o, err, wall, to = run_cmd(cmd)
    record("plan", "--verify-weights with a checkpoint directory (no digests: usage)", rc, err,
           wall, "clean" if rc == 2 and "--verify-weights" in err else
           classify(rc, err, to, "fail", ["--verify-weights"]), cmd=" ".join(cmd))
    # the config block
    for key, value in [("num_hidden_layers", 3), ("rope_theta", 10000.0), ("vocab_size", 1000),
                       ("sliding_window", 128), ("swiglu_limit", 70.0), ("head_dim", 32)]:
        plan_case(f"plan.json config.{key} changed to {value}", lambda d, k=key, v=value:
                  edit_json(d, lambda j: j["config"].__setitem__(k, v)), "fail",
                  [f"config.{key}"])
    plan_case("plan.json config: a field deleted", lambda d: edit_json(
        d, lambda j: j["config"].pop("rms_norm_eps")), "fail", ["config.rms_norm_eps"])
    plan_case("plan.json config: a field added", lambda d: edit_json(
        d, lambda j: j["config"].__setitem__("extra_field", 1)), "fail", ["config.extra_field"])
    # the checkpoint's config.json swapped under the plan
    def other_config(m, fn):
        p = os.path.join(m, "config.json")
        j = json.load(open(p))
        fn(j)
        json.dump(j, open(p, "w"))
    m = model_with(lambda m: other_config(m, lambda j: j.__setitem__("rope_theta", 10000)))
    plan_case("checkpoint config.json swapped (rope_theta)", lambda d: None, "fail",
              ["config"], extra=["--weights", m])
    m = model_with(lambda m: other_config(m, lambda j: None))
    plan_case("checkpoint config.json reformatted, same values", lambda d: None, "either",
              ["config"], extra=["--weights", m])
