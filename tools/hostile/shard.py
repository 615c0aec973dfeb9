"""Class "shard": damaged safetensors shards (truncations, header length and JSON, offsets,
dtypes, shapes, names, NaN/Inf values, MXFP4 scales, a swapped shard) and index.json."""
import json
import os
import shutil
import struct

from .common import C, RUN_ARGS, X, classify, copy_model, record, run_cmd, scratch


def shard_parts(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    return raw, n, head


def write_shard(path, head_bytes, data, length=None):
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head_bytes) if length is None else length))
        f.write(head_bytes)
        f.write(data)


def shard_case(desc, mutate, expect="fail", names=None, via="compile+run", extra=()):
    """mutate(shard_path) damages the copied shard. The damaged model is compiled (headers),
    and when that succeeds the new plan is run on the CPU (data)."""
    d = scratch("case_model")
    copy_model(d, copy_shard=True)
    sp = os.path.join(d, C.shard_name)
    mutate(sp)
    names = names or [C.shard_name, "safetensors"]
    out = scratch("case_plan")
    if via == "weights":  # the good plan, the damaged weights
        cmd = X("run", C.plan, "--weights", d, *RUN_ARGS, *extra)
        rc, o, err, wall, to = run_cmd(cmd)
        oc = classify(rc, err, to, expect, names)
        record("shard", desc, rc, err, wall, oc, cmd=" ".join(cmd))
        return
    cmd = X("compile", d, "-o", out, "--max-batch", 2, "--max-seq", 64, "--no-cubins")
    rc, o, err, wall, to = run_cmd(cmd)
    left = rc != 0 and os.path.exists(out)
    if rc != 0 or to or left:
        oc = classify(rc, err, to, expect, names, left)
        record("shard", desc + " [compile]", rc, err, wall, oc, cmd=" ".join(cmd))
        return
    cmd2 = X("run", out, *RUN_ARGS)
    rc2, o2, err2, wall2, to2 = run_cmd(cmd2)
    oc = classify(rc2, err2, to2, expect, names)
    record("shard", desc + " [compile ok, run]", rc2, err2, wall + wall2, oc,
           note=("tokens: " + o2.strip()[:80]) if rc2 == 0 else "", cmd=" ".join(cmd2))


def shard_cases():
    raw, n, head = shard_parts(C.shard)
    size = len(raw)
    data = raw[8 + n:]
    tensors = {k: v for k, v in head.items() if k != "__metadata__"}

    # truncations at many offsets
    offs = sorted(set([0, 1, 4, 7, 8, 9, 16, 8 + n // 2, 8 + n - 1, 8 + n, 8 + n + 1,
                       8 + n + 2, size // 4, size // 2, size - 4096, size - 2, size - 1] +
                      [8 + n + v["data_offsets"][1] - 1 for v in list(tensors.values())[::6]]))
    for off in offs:
        shard_case(f"shard truncated to {off} of {size} bytes",
                   lambda p, off=off: open(p, "r+b").truncate(off))
    # bytes appended
    shard_case("shard with 1 MiB of junk appended",
               lambda p: open(p, "ab").write(os.urandom(1 << 20)), expect="either")
    # header length field
    for L, what in [(0, "0"), (1, "1"), (n - 1, "n-1"), (n + 1, "n+1"), (size, "file size"),
                    (size - 8, "file size - 8"), (2 ** 63, "2^63"), (2 ** 64 - 1, "-1 as u64"),
                    (2 ** 64 - 8, "-8 as u64"), (100 * 2 ** 20, "100 MiB")]:
        def m(p, L=L):
            with open(p, "r+b") as f:
                f.write(struct.pack("<Q", L))
        shard_case(f"header length field = {what}", m)

    def with_head(fn, pad=True):
        def m(p):
            h = json.loads(json.dumps(head))
            hb = fn(h)
            if not isinstance(hb, (bytes, bytearray)):
                hb = json.dumps(hb).encode()
            if pad and len(hb) < n:
                hb = hb + b" " * (n - len(hb))  # keep the data where it was
            write_shard(p, hb, data)
        return m

    bad_json = [b"", b"{", b"[]", b"null", b"42", b'"str"', b"{'a': 1}", b"{\"a\":}",
                b"\xff\xfe\x00{}", b"{}" + b"\x00" * 10, b'{"x": NaN}',
                b"{" + b'"k":' * 1 + b"[" * 5000 + b"]" * 5000 + b"}"]
    for hb in bad_json:
        shard_case(f"header JSON {hb[:24]!r}...", with_head(lambda h, hb=hb: hb))
    first = "model.layers.0.self_attn.q_proj.weight"
    norm = "model.layers.0.input_layernorm.weight"
    wrong_types = [
        ("dtype is 7", lambda h: h[first].__setitem__("dtype", 7)),
        ("dtype is null", lambda h: h[first].__setitem__("dtype", None)),
        ("shape is a string", lambda h: h[first].__setitem__("shape", "64,64")),
        ("shape has a float", lambda h: h[first].__setitem__("shape", [64.5, 64])),
        ("shape has a negative", lambda h: h[first].__setitem__("shape", [-64, -64])),
        ("shape has a string dim", lambda h: h[first].__setitem__("shape", ["64", 64])),
        ("data_offsets is a string", lambda h: h[first].__setitem__("data_offsets", "0,1")),
        ("data_offsets has 3 entries", lambda h: h[first].__setitem__(
            "data_offsets", h[first]["data_offsets"] + [0])),
        ("data_offsets has 1 entry", lambda h: h[first].__setitem__(
            "data_offsets", h[first]["data_offsets"][:1])),
        ("data_offsets negative", lambda h: h[first].__setitem__("data_offsets", [-8192, 0])),
        ("data_offsets floats", lambda h: h[first].__setitem__(
            "data_offsets", [float(x) for x in h[first]["data_offsets"]])),
        ("tensor entry is a list", lambda h: h.__setitem__(first, [1, 2])),
        ("tensor entry is a string", lambda h: h.__setitem__(first, "x")),
        ("tensor entry lacks dtype", lambda h: h[first].pop("dtype")),
        ("tensor entry lacks shape", lambda h: h[first].pop("shape")),
        ("tensor entry lacks data_offsets", lambda h: h[first].pop("data_offsets")),
        ("__metadata__ is a list", lambda h: h.__setitem__("__metadata__", [1])),
        ("__metadata__ holds a number", lambda h: h.__setitem__("__metadata__", {"format": 1})),
        ("begin > end", lambda h: h[first].__setitem__(
            "data_offsets", list(reversed(h[first]["data_offsets"])))),
        ("end past the file", lambda h: h[first].__setitem__(
            "data_offsets", [h[first]["data_offsets"][0], size * 2])),
        ("offsets 2^64-1", lambda h: h[first].__setitem__(
            "data_offsets", [2 ** 64 - 2, 2 ** 64 - 1])),
        ("offsets above u64", lambda h: h[first].__setitem__("data_offsets", [0, 2 ** 70])),
        ("overlapping data_offsets", lambda h: h[first].__setitem__(
            "data_offsets", h["model.embed_tokens.weight"]["data_offsets"][:1] +
            [h["model.embed_tokens.weight"]["data_offsets"][0] + 8192])),
        ("two tensors share offsets", lambda h: h[norm].__setitem__(
            "data_offsets", h["model.layers.0.post_attention_layernorm.weight"]["data_offsets"])),
        ("byte count != shape x dtype", lambda h: h[first].__setitem__(
            "data_offsets", [h[first]["data_offsets"][0], h[first]["data_offsets"][1] - 2])),
        ("unknown dtype BF17", lambda h: h[first].__setitem__("dtype", "BF17")),
        ("dtype F64 with matching bytes", lambda h: h[norm].__setitem__("shape", [16]) or
         h[norm].__setitem__("dtype", "F64")),
        ("dtype F8_E4M3 for a bf16 weight", lambda h: h[norm].__setitem__("dtype", "F8_E4M3")),
        ("dtype lower-case bf16", lambda h: h[norm].__setitem__("dtype", "bf16")),
        ("dtype U8 for blocks replaced by I8",
         lambda h: h["model.layers.0.mlp.experts.down_proj_blocks"].__setitem__("dtype", "I8")),
        ("shape product overflows u64", lambda h: h[first].__setitem__(
            "shape", [2 ** 32, 2 ** 32, 2 ** 8])),
        ("shape product overflows i64 to 0-ish", lambda h: h[first].__setitem__(
            "shape", [2 ** 62, 4])),
        ("shape [0, 64]", lambda h: h[first].__setitem__("shape", [0, 64])),
        ("shape [] (scalar)", lambda h: h[norm].__setitem__("shape", [])),
        ("shape transposed-compatible [32,128]", lambda h: h[first].__setitem__(
            "shape", [32, 128])),
        ("shape with 9 dims of 1", lambda h: h[norm].__setitem__("shape", [1] * 8 + [64])),
        ("tensor missing (q_proj.weight)", lambda h: h.pop(first)),
        ("tensor missing (lm_head)", lambda h: h.pop("lm_head.weight")),
        ("tensor missing (layer 1 sinks)", lambda h: h.pop("model.layers.1.self_attn.sinks")),
        ("tensor renamed to an extra name", lambda h: h.__setitem__("extra.weight", h.pop(norm))),
        ("extra tensor pointing at existing data", lambda h: h.__setitem__(
            "model.layers.2.input_layernorm.weight", dict(h[norm]))),
        ("extra tensor with unknown dtype", lambda h: h.__setitem__(
            "junk", {"dtype": "WHAT", "shape": [1], "data_offsets": [0, 1]})),
        ("empty name", lambda h: h.__setitem__("", h.pop(norm))),
    ]
    for desc, fn in wrong_types:
        exp = "either" if desc.startswith("extra tensor pointing") else "fail"
        shard_case("header: " + desc, with_head(lambda h, fn=fn: (fn(h), h)[1]), expect=exp)

    # duplicate names: JSON text with the key twice
    def dup(p):
        txt = json.dumps(head)
        entry = json.dumps({norm: head["model.layers.0.post_attention_layernorm.weight"]})[1:-1]
        hb = (txt[:-1] + ", " + entry + "}").encode()
        write_shard(p, hb, data)
    shard_case("header: duplicate tensor name (second entry points elsewhere)", dup)

    # data flips
    def put(name, rel, bts):
        def m(p):
            off = 8 + n + tensors[name]["data_offsets"][0] + rel
            with open(p, "r+b") as f:
                f.seek(off)
                f.write(bts)
        return m
    NAN, INF, NINF = b"\xc0\x7f", b"\x80\x7f", b"\x80\xff"
    for tname in ["model.layers.0.input_layernorm.weight", "model.norm.weight",
                  "model.layers.1.post_attention_layernorm.weight",
                  "model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.sinks",
                  "model.layers.0.mlp.router.weight",
                  "model.layers.1.mlp.experts.gate_up_proj_bias"]:
        for val, vn in [(NAN, "NaN"), (INF, "+Inf"), (NINF, "-Inf")]:
            shard_case(f"{vn} bf16 in {tname}", put(tname, 2, val),
                       names=[tname, "finite", "NaN", "Inf"])
    for row in [1, 2, 3, 150000, 201087]:
        shard_case(f"NaN in embed_tokens row {row}",
                   put("model.embed_tokens.weight", row * 128 + 6, NAN),
                   names=["embed_tokens", "finite", "NaN"])
        shard_case(f"Inf in lm_head row {row}", put("lm_head.weight", row * 128 + 10, INF),
                   names=["lm_head", "finite", "Inf"])
    shard_case("NaN in embed_tokens row 1, good plan, --weights",
               put("model.embed_tokens.weight", 128 + 6, NAN), via="weights",
               names=["embed_tokens", "finite", "NaN", "sha", "digest", "changed"])
    for tname in ["model.layers.0.mlp.experts.gate_up_proj_scales",
                  "model.layers.1.mlp.experts.down_proj_scales"]:
        for b, bn in [(b"\xff", "0xFF"), (b"\xfe", "0xFE"), (b"\xff" * 64, "64 x 0xFF"),
                      (b"\x00", "0x00")]:
            exp = "fail" if b[:1] == b"\xff" else "either"
            shard_case(f"MXFP4 scale byte {bn} in {tname}", put(tname, 5, b), expect=exp,
                       names=[tname, "scale", "E8M0", "0xff", "255"])
    # finite edits the sampled digest may or may not see (good plan, --weights): by design the
    # default check samples (docs/DESIGN.md); --verify-weights reads every byte
    shard_case("one finite byte flipped in the middle of embed_tokens, good plan, --weights "
               "(the sampled check: documented to miss it)",
               put("model.embed_tokens.weight", 12_000_001, b"\x3f"), expect="either",
               via="weights", names=["sha", "digest", "changed", "fingerprint"])
    shard_case("one finite byte flipped in the middle of embed_tokens, good plan, --weights, "
               "--verify-weights", put("model.embed_tokens.weight", 12_000_001, b"\x3f"),
               via="weights", names=[C.shard_name, "SHA-256"], extra=("--verify-weights",))
    # a shard swapped for another of the same size
    shard_case("shard swapped for another checkpoint's (same size), good plan, --weights",
               lambda p: shutil.copyfile(C.other_shard, p), via="weights",
               names=["sha", "digest", "changed", "fingerprint", C.shard_name])
    # index.json damage
    for desc, fn in [
        ("index weight_map names a missing file",
         lambda ix: ix["weight_map"].__setitem__(norm, "model-00009-of-00009.safetensors")),
        ("index weight_map path escapes", lambda ix: ix["weight_map"].__setitem__(
            norm, "../../../etc/passwd")),
        ("index weight_map not an object", lambda ix: ix.__setitem__("weight_map", [1])),
        ("index is not JSON", None),
    ]:
        d = scratch("case_model")
        copy_model(d)
        ip = os.path.join(d, "model.safetensors.index.json")
        if fn is None:
            open(ip, "w").write("{not json")
        else:
            ix = json.load(open(ip))
            fn(ix)
            json.dump(ix, open(ip, "w"))
        out = scratch("case_plan")
        cmd = X("compile", d, "-o", out, "--max-batch", 2, "--max-seq", 64, "--no-cubins")
        rc, o, err, wall, to = run_cmd(cmd)
        left = rc != 0 and os.path.exists(out)
        record("shard", desc, rc, err, wall,
               classify(rc, err, to, "fail", ["index.json", "weight_map"], left),
               cmd=" ".join(cmd))
