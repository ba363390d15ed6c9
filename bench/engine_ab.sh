#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/engine_ab.sh: two builds of zinf (A: before a change, B: after) running the same
# `zinf bench engine` in interleaved rounds (A B, B A, ...) on the same disk and cores, so that
# drift hits both alike. One line per run on stdout: build, round, then the medians of that
# run's timed steps (step_s, compute_s, io_bound_s, exposed_fetch_s, exposed_step_s,
# efficiency); a last line per build with the median over its rounds. Python only prints.
#
# usage: bench/engine_ab.sh A/zinf B/zinf [--rounds 3] [--dir DIR] [-- bench engine options]
# default options: the issue 9 run of bench/RESULTS.md (8 layers of hidden 1024, 100 ms of
# compute per layer forward, both tiers on NVMe, stage 3, 3 timed steps).
set -euo pipefail
A=$1
B=$2
shift 2
ROUNDS=3
DIR=./zinf-engine-ab
while [ $# -gt 0 ]; do
	case "$1" in
	--rounds) ROUNDS=$2; shift 2 ;;
	--dir) DIR=$2; shift 2 ;;
	--) shift; break ;;
	*) echo "engine_ab.sh: unknown option $1" >&2; exit 2 ;;
	esac
done
mkdir -p "$DIR"
if [ $# -eq 0 ]; then
	set -- --layers 8 --hidden 1024 --compute-ms 100 --stage 3 --offload-param nvme \
		--offload-optimizer nvme --sub-group-size 1e7 --bucket 1e7 \
		--param-buffer-size 1.3e7 --steps 3
fi
echo "# $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for r in $(seq 1 "$ROUNDS"); do
	order="A B"
	[ $((r % 2)) -eq 0 ] && order="B A"
	for b in $order; do
		z=$A
		[ "$b" = B ] && z=$B
		"$z" bench engine --nvme-path "$DIR" "$@" --json | tr -d '\n' | sed 's/$/\n/' |
			python3 -c '
import json, sys
for l in sys.stdin:
    if l.startswith("{"):
        j = json.loads(l)
        keys = ("step_s", "compute_s", "io_bound_s", "exposed_fetch_s", "exposed_step_s", "efficiency")
        print(json.dumps(dict(build=sys.argv[1], round=int(sys.argv[2]), **{k: j[k] for k in keys})))
' "$b" "$r" | tee -a "$OUT"
	done
done
python3 - "$OUT" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
for b in ("A", "B"):
    rs = [r for r in runs if r["build"] == b]
    med = {k: round(statistics.median(r[k] for r in rs), 4) for k in rs[0] if k not in ("build", "round")}
    print(json.dumps(dict(build=b, rounds=len(rs), median=med)))
EOF
