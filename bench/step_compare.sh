#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/step_compare.sh: the pipelined optimizer step (zinf schedule) against DeepSpeed's depth-1
# schedule (PipelinedOptimizerSwapper with pipeline_read/pipeline_write), in interleaved rounds
# on the same disk (its speed drifts), with peak RSS from /usr/bin/time -v. Prints one JSON
# line per run and a markdown table of medians.
#
#   bench/step_compare.sh [--zinf PATH] [--params N] [--sub-group S] [--buffers B]
#                         [--rounds R] [--steps K] [--path DIR] [--schedules "zinf deepspeed"]
set -euo pipefail
ZINF=./build/zinf
PARAMS=2e8
SG=1e7
BUFS=4
ROUNDS=3
STEPS=3
DIR=./zinf-bench-step
SCHEDULES="zinf deepspeed"
while [ $# -gt 0 ]; do
	case "$1" in
	--zinf) ZINF=$2; shift 2 ;;
	--params) PARAMS=$2; shift 2 ;;
	--sub-group) SG=$2; shift 2 ;;
	--buffers) BUFS=$2; shift 2 ;;
	--rounds) ROUNDS=$2; shift 2 ;;
	--steps) STEPS=$2; shift 2 ;;
	--path) DIR=$2; shift 2 ;;
	--schedules) SCHEDULES=$2; shift 2 ;;
	*) echo "unknown option $1" >&2; exit 2 ;;
	esac
done
OUT=$(mktemp)
trap 'rm -f "$OUT" "$OUT".time' EXIT
echo "# $(date -u +%FT%TZ) $(uptime | sed 's/.*load/load/')" >&2
for r in $(seq 1 "$ROUNDS"); do
	for s in $SCHEDULES; do
		/usr/bin/time -v -o "$OUT.time" "$ZINF" bench step --params "$PARAMS" \
			--sub-group "$SG" --buffers "$BUFS" --schedule "$s" --steps "$STEPS" \
			--path "$DIR" --json >"$OUT.json"
		rss=$(awk -F: '/Maximum resident/ {gsub(/ /,"",$2); print $2}' "$OUT.time")
		python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["round"]=int(sys.argv[2]); d["time_v_maxrss_kB"]=int(sys.argv[3]); print(json.dumps(d))' \
			"$OUT.json" "$r" "$rss" | tee -a "$OUT"
	done
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print("\n| schedule | params | sub-group | buffers | step_s | io_s (io_GBps) | adam_s | efficiency (per-round range) | peak RSS MiB |")
print("|---|---|---|---|---|---|---|---|---|")
for s in sorted({r["schedule"] for r in runs}, reverse=True):
    rs = [r for r in runs if r["schedule"] == s]
    med = lambda k: statistics.median(r[k] for r in rs)
    print(f"| {s} | {rs[0]['params']:.3g} | {rs[0]['sub_group']:.3g} | {rs[0]['buffers']} | "
          f"{med('step_s'):.2f} | {med('io_s'):.2f} ({med('io_GBps'):.2f}) | {med('adam_s'):.2f} | "
          f"{statistics.median(e for r in rs for e in r['efficiency_all']):.3f} "
          f"({min(e for r in rs for e in r['efficiency_all']):.2f}..{max(e for r in rs for e in r['efficiency_all']):.2f}) | {max(r['time_v_maxrss_kB'] for r in rs)/1024:.0f} |")
PY
