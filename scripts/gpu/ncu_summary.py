#!/usr/bin/env python3
"""Per-kernel time of one decode step from Nsight Compute's CSV (gpu__time_duration.sum).

    ncu --csv --print-units base --metrics gpu__time_duration.sum --launch-skip S --launch-count N \
        cachet bench forward ... > ncu.csv
    python3 scripts/gpu/ncu_summary.py ncu.csv

Note: ncu flushes caches and fixes clocks around each kernel, so small kernels read slower than in
a real run; use it for where the time goes, the bench for how long a step takes.
"""
import collections
import csv
import sys

rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
head = rows[0]
name, value = head.index("Kernel Name"), head.index("Metric Value")
grid, block = head.index("Grid Size"), head.index("Block Size")
agg = collections.defaultdict(lambda: [0, 0.0])
for r in rows[1:]:
    try:
        v = float(r[value].replace(",", ""))
    except ValueError:
        continue
    k = f"{r[name][:60]} grid {r[grid]} block {r[block]}"
    agg[k][0] += 1
    agg[k][1] += v
total = sum(v for _, v in agg.values())
print(f"{len(rows) - 1} kernels, {total / 1e3:.1f} us in all\n")
print("| us | calls | us/call | kernel |\n|---|---|---|---|")
for k, (n, v) in sorted(agg.items(), key=lambda x: -x[1][1]):
    print(f"| {v / 1e3:.1f} | {n} | {v / n / 1e3:.2f} | {k} |")
