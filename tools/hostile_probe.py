#!/usr/bin/env python3
"""Hostile-input probe for xserv (issue 18's last Done-when item), standard library only.

    python3 tools/hostile_probe.py --xserv build/cli/xserv --out DIR [--cases N] [--only CLASS,...]

Synthesises the tiny checkpoint, compiles a small plan (and a --pp 2 one), then runs hostile
cases on the CPU backend, each on a fresh copy of what it damages and under a timeout:
safetensors shards, config.json, plan directories, command lines and tokenizer files, the
pipeline protocol (a real rank 0 / worker spoken to over raw sockets on 127.0.0.1) and the
HTTP server. Every case is classified:

  clean        non-zero exit (or a 4xx) with one message naming the file / field / limit
  crash        a signal, "terminate called", an assertion or sanitizer report
  hang         the timeout ran out
  silent_wrong exit 0 / 200 although the input is bad (or the output is wrong)
  misleading   refused, but the message names nothing, or is a library's (json.exception, stoul)
  leftover     a failed compile / synth left its output behind
  resource     handled, but only after using far more memory than the input warrants
  refused_ok   a valid input refused (a control case)

Writes DIR/results.jsonl and DIR/summary.md, and prints the summary. Written without reading
tests/ so that it is independent of the project's own hostile-input tests; the cases for what
the first run left (frames with lying sizes, Content-Length and Transfer-Encoding oddities with a
smuggled request behind them, --verify-weights, plan.json's config block) were added with the
fixes. The code lives in tools/hostile/: common.py (context, running, classification, set-up)
and one module per class.
"""
import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hostile import cli, config, http_server, pipeline, plan, shard  # noqa: E402
from hostile.common import C, RESULTS, now, prepare  # noqa: E402


def summary():
    outcomes = ["clean", "crash", "hang", "silent_wrong", "misleading", "leftover", "resource",
                "refused_ok", "probe_error"]
    classes = sorted(set(r["class"] for r in RESULTS))
    lines = ["# xserv hostile-input probe", "",
             f"{len(RESULTS)} cases, xserv = {C.xserv}", "",
             "| class | " + " | ".join(outcomes) + " | total |",
             "|---|" + "---|" * (len(outcomes) + 1)]
    for c in classes + ["all"]:
        rs = [r for r in RESULTS if c == "all" or r["class"] == c]
        lines.append(f"| {c} | " + " | ".join(str(sum(1 for r in rs if r["outcome"] == o))
                                              for o in outcomes) + f" | {len(rs)} |")
    lines += ["", "## Every non-clean case", ""]
    for i, r in enumerate(RESULTS, 1):
        if r["outcome"] != "clean":
            st = f"HTTP {r['http_status']}" if r["http_status"] is not None else f"rc {r['exit']}"
            lines.append(f"- #{i} **{r['outcome']}** [{r['class']}] {r['description']} ({st}, "
                         f"{r['wall_s']} s): `{r['message'][:200]}` {r['note'][:200]}")
    return "\n".join(lines) + "\n"



def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--xserv", default="build/cli/xserv")
    ap.add_argument("--out", required=True)
    ap.add_argument("--cases", type=int, default=0, help="stop after N cases (0: all)")
    ap.add_argument("--only", default="", help="classes to run: shard,config,plan,cli,"
                    "pipeline,http")
    ap.add_argument("--config", default="examples/tiny/config.json")
    a = ap.parse_args()
    prepare(a.xserv, a.out, a.config, a.cases)
    t0 = now()
    groups = [("shard", shard.shard_cases), ("config", config.config_cases),
              ("plan", plan.plan_cases), ("cli", cli.cli_cases),
              ("pipeline", pipeline.pipeline_cases), ("http", http_server.http_cases)]
    only = set(x for x in a.only.split(",") if x)
    try:
        for name, fn in groups:
            if only and name not in only:
                continue
            try:
                fn()
            except StopIteration:
                raise
            except Exception as e:  # noqa: BLE001 (a probe bug must not lose the results)
                print(f"!! {name}: probe error {type(e).__name__}: {e}", flush=True)
                RESULTS.append({"class": name, "description": f"probe error: {e}", "exit": None,
                                "http_status": None, "stderr_first": "", "message": str(e),
                                "wall_s": 0, "outcome": "probe_error", "note": "", "cmd": None})
    except StopIteration:
        pass
    shutil.rmtree(C.work, ignore_errors=True)
    with open(os.path.join(C.out, "results.jsonl"), "w") as f:
        for r in RESULTS:
            f.write(json.dumps(r) + "\n")
    s = summary() + f"\nwall time {now() - t0:.0f} s\n"
    open(os.path.join(C.out, "summary.md"), "w").write(s)
    print(s)


if __name__ == "__main__":
    main()
