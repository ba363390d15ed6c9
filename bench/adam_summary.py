#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# bench/adam_summary.py: medians over rounds of bench/adam.sh's JSON lines, as a Markdown table.
# usage: bench/adam.sh build 1e8 3 > adam.jsonl; bench/adam_summary.py adam.jsonl
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if not line.startswith('{'):
        continue
    d = json.loads(line)
    if d.get('bench') != 'adam':
        continue
    key = (d['simd'], d['threads'], d['passes'], d['grad_dtype'], d['copy_dtype'], d['state'])
    rows.setdefault(key, []).append(d)
print('| path | threads | passes | grad | copy | state | params/s | GB/s | STREAM GB/s | ratio (median) | ratios per round | load |')
print('|---|---|---|---|---|---|---|---|---|---|---|---|')
for key in sorted(rows, key=lambda k: (k[3] != 'f32' or k[4] != 'bf16' or k[5] != 'f32', k[0], k[1], k[2], k[3], k[4], k[5])):
    r = rows[key]
    med = lambda f: statistics.median(x[f] for x in r)
    print('| %s | %d | %d | %s | %s | %s | %.3g | %.2f | %.2f | **%.3f** | %s | %s |' % (
        key[0], key[1], key[2], key[3], key[4], key[5], med('params_per_s'), med('GBps'),
        med('stream_GBps'), med('ratio'), ' '.join('%.2f' % x['ratio'] for x in r),
        ' '.join('%.1f' % x['loadavg'] for x in r)))
