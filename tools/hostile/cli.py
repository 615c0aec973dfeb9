"""Class "cli": hostile command lines for run, compile, synth, tokenize, chat, eval and bench,
and damaged tokenizer files."""
import json
import os
import shutil

from .common import (C, REAL_TIKTOKEN, RUN_ARGS, X, classify, copy_model, copy_plan,
                     message_line, record, run_cmd, scratch)


def cli_case(desc, args, expect="fail", names=None, cmd=None, stdin=None, check=None):
    cmd = cmd or X("run", C.plan, "--backend", "cpu", *args)
    rc, o, err, wall, to = run_cmd(cmd, stdin_data=stdin)
    oc = classify(rc, err, to, expect, names)
    note = ""
    if check and rc == 0 and not to:
        bad = check(o, err)
        if bad:
            oc, note = "silent_wrong", bad
    if rc == 0 and not note:
        note = "stdout: " + o.strip()[:80]
    record("cli", desc, rc, err, wall, oc, note=note, cmd=" ".join(cmd))


def cli_cases():
    base = ["--prompt-ids", "1,2,3", "--max-tokens", "2"]
    for bad in ["1,,2", ",1", "1,", "", " ", "nan", "inf", "-0", "1e99", "-1", "201088",
                "99999999999", "1.5", "0x10", "1;2", "１,２", "1, 2", "+1", "2147483648"]:
        exp = "fail"
        if bad in ("-0", "+1", "1, 2"):
            exp = "either"
        cli_case(f"--prompt-ids {bad!r}", ["--prompt-ids", bad, "--max-tokens", "2"], exp,
                 ["prompt-ids", "prompt_ids", "vocab", "token"])
    for flag, vals in [("--max-tokens", ["0", "-1", "nan", "inf", "1e99", "", "1,,2", "-0",
                                         "99999999999999999999", "2.5"]),
                       ("--temperature", ["-1", "nan", "inf", "-inf", "", "1e99", "abc"]),
                       ("--top-p", ["0", "-0.1", "1.1", "nan", "inf", "", "2"]),
                       ("--top-k", ["-1", "nan", "1.5", "", "1e99", "99999999999"]),
                       ("--min-p", ["-0.1", "1.5", "nan", "inf", ""]),
                       ("--seed", ["-1", "nan", "", "1e99", "99999999999999999999999"]),
                       ("--max-seq", ["-1", "nan", "", "1e99"]),
                       ("--max-batch", ["-1", "nan", "", "1e99"])]:
        for v in vals:
            exp = "fail"
            if (flag, v) in [("--max-tokens", "0"), ("--top-p", "0"), ("--seed", "-1"),
                             ("--max-tokens", "-0"), ("--temperature", "1e99"),
                             ("--top-k", "99999999999"), ("--max-tokens", "1e99")]:
                exp = "either"
            cli_case(f"{flag} {v!r}", base + ["--temperature", "0.7"] * (flag in (
                "--top-p", "--top-k", "--min-p")) + [flag, v], exp,
                [flag.lstrip("-"), flag.lstrip("-").replace("-", "_")])
    cli_case("--temperature 0.7 --top-k 0", base + ["--temperature", "0.7", "--top-k", "0"],
             "either", ["top-k"])
    for args, d in [(["--bogus"], "unknown flag"), (["--max-tokens"], "missing value at end"),
                    (["--prompt-ids"], "--prompt-ids without value"),
                    (["--max-tokens", "--temperature", "1"], "value swallowed by next flag"),
                    (["--backend", "tpu"], "--backend tpu"),
                    (["--max-tokens", "2", "--max-tokens", "3"], "flag given twice")]:
        exp = "either" if d == "flag given twice" else "fail"
        cli_case(d, base + args, exp, ["--", "option", "flag", "backend", "reasoning", "date"])
    for args, d in [(["--reasoning", "extreme"], "--reasoning extreme"),
                    (["--date", "2024-13-45"], "--date 2024-13-45"),
                    (["--date", "yesterday"], "--date yesterday")]:
        for pa, pn in [(base, "with --prompt-ids"), (["--prompt", "hi", "--tokenizer",
                                                      REAL_TIKTOKEN, "--max-tokens", "2"],
                                                     "with --prompt")]:
            cli_case(f"{d} {pn}", pa + args, "fail", ["reasoning", "date"],
                     cmd=X("run", C.plan_long, "--backend", "cpu", *pa, *args))
    cli_case("no prompt at all", ["--max-tokens", "2"], "fail", ["prompt"])
    cli_case("both --prompt and --prompt-ids", base + ["--prompt", "hi", "--tokenizer",
                                                       REAL_TIKTOKEN], "fail", ["prompt"])
    long_ids = ",".join(["5"] * 65)
    cli_case("prompt of 65 ids > max-seq 64", ["--prompt-ids", long_ids, "--max-tokens", "2"],
             "fail", ["max-seq", "max_seq", "64", "long"])
    def must_say_length(o, err):
        if "length" not in (o + err).lower() and "max-seq" not in (o + err).lower() and \
                "max_seq" not in (o + err).lower():
            return "stopped at max-seq without saying so"
    cli_case("prompt of 64 ids == max-seq", ["--prompt-ids", ",".join(["5"] * 64),
                                             "--max-tokens", "2"], "either",
             ["max-seq", "max_seq", "64", "long", "length"], check=must_say_length)
    cli_case("prompt 60 ids + 100 tokens reaches max-seq", ["--prompt-ids", ",".join(["5"] * 60),
                                                            "--max-tokens", "100"], "either",
             ["max-seq", "max_seq", "length"], check=must_say_length)
    cli_case("--prompt of 20000 chars (too long)", ["--prompt", "word " * 4000, "--tokenizer",
                                                    REAL_TIKTOKEN, "--max-tokens", "2"], "fail",
             ["max-seq", "max_seq", "long", "tokens"])
    cli_case("--logits-out into a missing directory", base + ["--logits-out",
                                                              "/nonexistent/dir/x.f32"], "fail",
             ["logits", "/nonexistent"])
    cli_case("--weights missing dir", base + ["--weights", "/nonexistent"], "fail",
             ["/nonexistent", "weights"])
    cli_case("plan path is a file", [], "fail", ["plan", "config"], cmd=X(
        "run", os.path.join(C.plan, "plan.json"), "--backend", "cpu", *base))
    for sub, args, names in [
            ("compile", ["--max-batch", "0"], ["max-batch"]),
            ("compile", ["--max-seq", "-5"], ["max-seq"]),
            ("compile", ["--max-seq", "1,,2"], ["max-seq"]),
            ("compile", ["--pp", "0"], ["pp"]), ("compile", ["--pp", "99"], ["pp", "layers"]),
            ("compile", ["--kv-dtype", "f8"], ["kv-dtype"]),
            ("compile", ["--expert-format", "int4"], ["expert-format"]),
            ("compile", ["--passes", "nosuchpass"], ["pass"]),
            ("compile", ["--emit", "xyz"], ["emit"])]:
        out = scratch("case_plan")
        cmd = X(sub, C.model, "-o", out, *args)
        rc, o, err, wall, to = run_cmd(cmd)
        left = rc != 0 and os.path.exists(out)
        record("cli", f"compile {' '.join(args)}", rc, err, wall,
               classify(rc, err, to, "fail", names, left), cmd=" ".join(cmd))
    # a compile that fails into an existing plan directory must leave the old plan usable
    d = scratch("case_planx")
    copy_plan(C.plan, d)
    bad_model = scratch("case_model")
    copy_model(bad_model)
    cj = json.load(open(os.path.join(bad_model, "config.json")))
    cj["hidden_size"] = -1
    json.dump(cj, open(os.path.join(bad_model, "config.json"), "w"))
    cmd = X("compile", bad_model, "-o", d, "--max-batch", 2, "--max-seq", 64, "--no-cubins")
    rc, o, err, wall, to = run_cmd(cmd)
    rc2, o2, err2, wall2, to2 = run_cmd(X("run", d, *RUN_ARGS))
    oc = classify(rc, err, to, "fail", ["hidden_size"])
    if oc == "clean" and rc2 != 0:
        oc = "leftover"
    record("cli", "failed compile into an existing plan dir, then run the old plan", rc, err,
           wall + wall2, oc, note=f"run afterwards rc {rc2}: {message_line(err2)[:120]}",
           cmd=" ".join(cmd))
    for args, d2 in [(["--seed", "1", "--config", "/nonexistent.json"], "synth missing config"),
                     (["--seed", "x"], "synth --seed x"),
                     (["--shard-size", "0"], "synth --shard-size 0"),
                     (["--shard-size", "-5GB"], "synth --shard-size -5GB"),
                     (["--shard-size", "1XB"], "synth --shard-size 1XB")]:
        out = scratch("case_synth")
        a = args if "--config" in args else args + ["--config", C.config]
        cmd = X("synth", "-o", out, *a)
        rc, o, err, wall, to = run_cmd(cmd)
        left = rc != 0 and os.path.exists(out)
        record("cli", d2, rc, err, wall, classify(rc, err, to, "fail",
                                                  ["config", "seed", "shard-size"], left),
               cmd=" ".join(cmd))
    # synth of an enormous config must refuse before writing (disk space) and leave nothing
    big = json.load(open(C.config))
    big["vocab_size"] = 2 ** 31
    bp = os.path.join(C.work, "big_config.json")
    json.dump(big, open(bp, "w"))
    out = scratch("case_synth")
    cmd = X("synth", "--config", bp, "-o", out, "--seed", "1")
    rc, o, err, wall, to = run_cmd(cmd, timeout=20)
    left = os.path.exists(out) and any(os.scandir(out)) if rc != 0 or to else False
    record("cli", "synth vocab 2^31 (hundreds of GB)", rc, err, wall,
           classify(rc, err, to, "fail", ["vocab", "space", "disk", "GB", "bytes"], left),
           cmd=" ".join(cmd))
    shutil.rmtree(out, ignore_errors=True)
    # tokenize
    for args, d2, names in [(["--decode", "abc"], "tokenize --decode abc", ["decode", "abc"]),
                            (["--decode", "1,,2"], "tokenize --decode 1,,2", ["decode"]),
                            (["--decode", "99999999999"], "tokenize --decode 99999999999",
                             ["decode", "vocab", "99999999999"]),
                            (["--decode", "-1"], "tokenize --decode -1", ["decode"])]:
        cmd = X("tokenize", REAL_TIKTOKEN, *args)
        rc, o, err, wall, to = run_cmd(cmd)
        oc = classify(rc, err, to, "fail", names)
        if oc == "clean" and rc != 2:
            oc, note = "misleading", f"usage mistake exits {rc}, README says 2"
        else:
            note = ""
        record("cli", d2, rc, err, wall, oc, note=note, cmd=" ".join(cmd))
    # tokenizer files cut short or edited
    real = open(REAL_TIKTOKEN, "rb").read()
    lines = real.splitlines(keepends=True)
    tok_variants = [
        ("empty", b""), ("first 1000 ranks", b"".join(lines[:1000])),
        ("all but the last rank", b"".join(lines[:-1])),
        ("cut mid-line", real[: len(real) // 2 + 3]),
        ("one rank's base64 corrupted", b"".join(lines[:500] + [b"!!!!@@@ 500\n"] + lines[501:])),
        ("a rank number changed to a duplicate", b"".join(
            lines[:500] + [lines[500].split(b" ")[0] + b" 499\n"] + lines[501:])),
        ("a rank number negative", b"".join(lines[:500] + [lines[500].split(b" ")[0] + b" -5\n"]
                                            + lines[501:])),
        ("a rank number huge", b"".join(lines[:500] + [lines[500].split(b" ")[0] +
                                                       b" 99999999999999\n"] + lines[501:])),
        ("two ranks swapped", b"".join(lines[:500] + [lines[501].split(b" ")[0] + b" 500\n",
                                                      lines[500].split(b" ")[0] + b" 501\n"]
                                       + lines[502:])),
        ("extra ranks appended", real + b"YWJjZGVmZ2hpams= 199998\n"),
        ("binary junk", os.urandom(4096)),
        ("a tokenizer.json that is not JSON", b"{\"model\": "),
        ("a tokenizer.json with wrong types", b"{\"model\": {\"vocab\": 5}}"),
    ]
    for desc, blob in tok_variants:
        suffix = ".json" if "tokenizer.json" in desc else ".tiktoken"
        p = os.path.join(C.work, "tok" + suffix)
        open(p, "wb").write(blob)
        cli_case(f"--tokenizer {desc}", ["--prompt", "Hello world", "--max-tokens", "2",
                                         "--tokenizer", p], "fail",
                 ["tok" + suffix, "tokenizer", "rank"])
    cli_case("--tokenizer missing file", ["--prompt", "hi", "--tokenizer", "/nonexistent.tiktoken",
                                          "--max-tokens", "2"], "fail", ["nonexistent"])
    cli_case("--tokenizer a directory", ["--prompt", "hi", "--tokenizer", C.work,
                                         "--max-tokens", "2"], "fail", ["tokenizer", C.work])
    cli_case("control: real tokenizer", ["--prompt", "Hello", "--max-tokens", "2", "--tokenizer",
                                         REAL_TIKTOKEN], "ok")
    cli_case("chat: /set garbage, bad lines", [], "either", None, cmd=X(
        "chat", C.plan, "--backend", "cpu", "--tokenizer", REAL_TIKTOKEN, "--max-tokens", "2"),
        stdin=b"/set reasoning=extreme\n/set foo\n/set temperature=nan\n\x00\xff\n/quit\n")
    cli_case("eval: --data a binary file", [], "fail", ["data", "jsonl", "line", C.shard_name], cmd=X(
        "eval", C.plan, "--backend", "cpu", "--task", "gsm8k", "--data",
        os.path.join(C.model, C.shard_name), "--limit", "1", "--tokenizer", REAL_TIKTOKEN))
    bp = os.path.join(C.work, "bad.jsonl")
    open(bp, "w").write('{"question": 5, "answer": []}\nnot json\n')
    cli_case("eval: --data with wrong types", [], "fail", ["bad.jsonl", "question", "line"],
             cmd=X("eval", C.plan, "--backend", "cpu", "--task", "gsm8k", "--data", bp,
                   "--limit", "2", "--tokenizer", REAL_TIKTOKEN, "--max-tokens", "2"))
    cli_case("bench: -p 1,,2", [], "fail", ["-p"], cmd=X("bench", C.plan, "--backend", "cpu",
                                                         "-p", "1,,2", "-n", "1"))
    cli_case("bench: -p 100000 > max-seq", [], "fail", ["max-seq", "max_seq", "64", "-p"],
             cmd=X("bench", C.plan, "--backend", "cpu", "-p", "100000", "-n", "1", "-r", "1"))
