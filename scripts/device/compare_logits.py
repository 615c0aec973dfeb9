#!/usr/bin/env python3
"""Compares the logits files `xserv run --logits-out` wrote for two plans, prompt by prompt.

Usage: compare_logits.py DIR A B PROMPTS [VOCAB]
Reads DIR/logits_{A}_p{i}.f32 and DIR/logits_{B}_p{i}.f32 for i < PROMPTS (float32 rows of
VOCAB, default 201088) and prints, per prompt, B's worst relative L2 distance to A over the rows,
the first row's (the prompt step's), and how many rows are bitwise equal. Exits 1 when any row
is further than 1e-3 (docs/TESTING.md's bound for pipelines) or the row counts differ.
"""
import os
import sys

import numpy as np


def main():
    d, a_name, b_name, prompts = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    vocab = int(sys.argv[5]) if len(sys.argv) > 5 else 201088
    bad = False
    for i in range(prompts):
        files = [f"{d}/logits_{n}_p{i}.f32" for n in (a_name, b_name)]
        missing = [f for f in files if not os.path.isfile(f)]
        if missing:
            print(f"prompt {i}: no logits file {', '.join(missing)} (its run failed)")
            bad = True
            continue
        a = np.fromfile(files[0], "<f4").reshape(-1, vocab)
        b = np.fromfile(files[1], "<f4").reshape(-1, vocab)
        if a.shape != b.shape:
            print(f"prompt {i}: {len(b)} rows of {b_name} against {len(a)} of {a_name}")
            bad = True
            continue
        rel = np.linalg.norm(a - b, axis=1) / np.linalg.norm(a, axis=1)
        same = int((a == b).all(axis=1).sum())
        bad = bad or rel.max() > 1e-3
        print(f"prompt {i}: {b_name} vs {a_name} logits rel L2 max {rel.max():.3g} (prompt step "
              f"{rel[0]:.3g}), rows bitwise equal {same} of {len(a)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
