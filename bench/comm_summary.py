#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# bench/comm_summary.py: medians over rounds of bench/comm_ab.sh's JSON lines (stdin), one row
# per (ranks, dtype, op, bytes) and one column per variant: the ratio (raw time / zinf time),
# with its range, and zinf's busbw in GB/s. Markdown on stdout.
import json
import statistics
import sys

rows = {}
variants = []
for line in sys.stdin:
    if not line.startswith("{"):
        continue
    x = json.loads(line)
    if x["variant"] not in variants:
        variants.append(x["variant"])
    key = (x["ranks"], x["dtype"], x["op"], x["bytes"])
    rows.setdefault(key, {}).setdefault(x["variant"], []).append(x)


def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


head = "| ranks | dtype | op | bytes | " + " | ".join(
    f"{v}: ratio (range) | {v}: busbw" for v in variants) + " |"
print(head)
print("|" + "---:|" * 2 + "---|---:|" + "---:|---:|" * len(variants))
for key in sorted(rows, key=lambda k: (k[0], k[1], ["all_gather", "reduce_scatter", "all_reduce"].index(k[2]), k[3])):
    cells = []
    for v in variants:
        xs = rows[key].get(v, [])
        r = [x["ratio"] for x in xs if x["ratio"] is not None]
        b = [x["busbw_GBps"] for x in xs]
        if not r:
            cells += ["-", "-"]
            continue
        cells.append(f"{statistics.median(r):.2f} ({min(r):.2f}-{max(r):.2f})")
        cells.append(f"{statistics.median(b):.3f}")
    print(f"| {key[0]} | {key[1]} | {key[2]} | {size(key[3])} | " + " | ".join(cells) + " |")
