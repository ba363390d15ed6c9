#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# bench/bf16m_summary.py: medians over rounds of bench/bf16m_speed.sh's output, as a Markdown
# table: the bf16-master step's and the plain step's elements/s and their ratio (speed_vs_plain,
# measured in the same run), per build, path, threads and m/v format.
# usage: bench/bf16m_speed.sh before=A after=B > s.jsonl; bench/bf16m_summary.py s.jsonl
import json, statistics, sys
rows, build = {}, None
for line in open(sys.argv[1]):
    line = line.strip()
    if line.startswith('# build '):
        build = line[len('# build '):]
        continue
    if not line.startswith('{'):
        continue
    d = json.loads(line)
    key = (d['state'], d['threads'], d['simd'], build)
    rows.setdefault(key, []).append(d)
print('| m, v | threads | path | build | bf16 master elem/s | plain elem/s | ratio (median) | ratios per round | load |')
print('|---|---|---|---|---|---|---|---|---|')
for key in sorted(rows, key=lambda k: (['q8', 'f32', 'bf16-sr'].index(k[0]), k[1], k[2], k[3])):
    r = rows[key]
    med = lambda f: statistics.median(x[f] for x in r)
    print('| %s | %d | %s | %s | %.3g | %.3g | **%.3f** | %s | %s |' % (
        key[0], key[1], key[2], key[3], med('params_per_s'), med('plain_params_per_s'),
        med('speed_vs_plain'), ' '.join('%.2f' % x['speed_vs_plain'] for x in r),
        ' '.join('%.1f' % x['loadavg'] for x in r)))
