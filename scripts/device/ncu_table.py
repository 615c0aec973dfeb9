#!/usr/bin/env python3
"""Sums an Nsight Compute --csv run (metrics gpu__time_duration.sum, dram__bytes_read.sum) by
kernel: launches, total and mean duration, DRAM bytes and bandwidth. Usage:
ncu_table.py FILE.csv [STEPS] (STEPS: how many decode steps the run covered, for the per-step
column)."""
import csv
import sys
from collections import defaultdict

rows = list(csv.reader(open(sys.argv[1], errors="replace")))
steps = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
head = next(i for i, r in enumerate(rows) if "Kernel Name" in r and "Metric Name" in r)
cols = rows[head]
kn, mn, mv, mu = (cols.index(c) for c in ("Kernel Name", "Metric Name", "Metric Value", "Metric Unit"))
idc = cols.index("ID")
per = defaultdict(dict)
names = {}
unknown = set()
for r in rows[head + 1:]:
    if len(r) <= mv:
        continue
    v = float(r[mv].replace(",", ""))
    unit = r[mu]
    scales = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3,
              "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}
    if unit not in scales and unit not in unknown:
        unknown.add(unit)
        print(f"unknown unit {unit!r} ({r[mn]}): taken as ns / bytes", file=sys.stderr)
    scale = scales.get(unit, 1e-3 if "time" in r[mn] else 1.0)
    per[r[idc]][r[mn]] = v * scale
    names[r[idc]] = r[kn].split("(")[0]
agg = defaultdict(lambda: [0, 0.0, 0.0])
for i, m in per.items():
    a = agg[names[i]]
    a[0] += 1
    a[1] += m.get("gpu__time_duration.sum", 0.0)
    a[2] += m.get("dram__bytes_read.sum", 0.0)
total = sum(a[1] for a in agg.values())
print(f"{len(per)} launches, {total:.1f} us of kernels, {total / steps:.1f} us per step ({steps:g} steps)")
print(f"{'kernel':62} {'n':>5} {'us/step':>8} {'mean us':>8} {'MB/launch':>9} {'GB/s':>6}")
for name, (n, t, b) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"{name[:62]:62} {n:5d} {t / steps:8.1f} {t / n:8.2f} {b / n / 1e6:9.2f} {b / t / 1e3 if t else 0:6.0f}")
