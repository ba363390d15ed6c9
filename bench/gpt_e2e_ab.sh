#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/gpt_e2e_ab.sh: two zinf_gpt binaries (A: before a change, B: after) training the same
# model with the same configurations in interleaved rounds (A B, B A, ...), so that drift of the
# disk and of the machine's load hits both alike. One JSON line per run on stdout: build,
# config, round, the median over the timed steps (all but the first) of step_s, of the engine's
# exposed fetch and exposed step, and the run's compute seconds per step (the summary's
# "compute", the layers' time); at the end, per configuration, each build's medians and the
# per-round ratio of A's step time to B's (B's speed-up).
#
# usage: bench/gpt_e2e_ab.sh A/zinf_gpt B/zinf_gpt [--rounds 3] [--steps 4]
#                            [--configs "zero2_cpu zero3_nvme"] [--scratch DIR] [-- zinf_gpt flags]
# default flags: issue 21's model (8 layers, 8 heads, hidden 512, context 128, vocabulary 1024,
# batch 16: 25.8M parameters). Threads: OMP_NUM_THREADS as set by the caller.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
A=$1
B=$2
shift 2
rounds=3
steps=4
configs="zero2_cpu zero3_nvme"
scratch=.
while [ $# -gt 0 ]; do
	case "$1" in
	--rounds) rounds=$2; shift 2 ;;
	--steps) steps=$2; shift 2 ;;
	--configs) configs=$2; shift 2 ;;
	--scratch) scratch=$2; shift 2 ;;
	--) shift; break ;;
	*) echo "gpt_e2e_ab.sh: unknown option $1" >&2; exit 2 ;;
	esac
done
[ $# -gt 0 ] || set -- --layers 8 --heads 8 --hidden 512 --context 128 --vocab 1024
echo "# $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" \
	"OMP_NUM_THREADS=${OMP_NUM_THREADS:-}" >&2
OUT=$(mktemp)
J=$(mktemp)
trap 'rm -f "$OUT" "$J" "$J.txt"' EXIT
for r in $(seq 1 "$rounds"); do
	order="A B"
	[ $((r % 2)) -eq 0 ] && order="B A"
	for c in $configs; do
		for b in $order; do
			z=$A
			[ "$b" = B ] && z=$B
			"$z" --config "$here/../examples/gpt/configs/$c.json" --steps "$steps" \
				--scratch-parent "$scratch" --no-progress --json "$J" "$@" >"$J.txt"
			python3 - "$J" "$J.txt" "$b" "$c" "$r" "$steps" <<'EOF' | tee -a "$OUT"
import json, re, statistics, sys
recs = [json.loads(l) for l in open(sys.argv[1])][1:]  # the first step warms up
text = open(sys.argv[2]).read()
compute = float(re.search(r"time \(rank 0\): compute ([0-9.]+) s", text).group(1))
med = lambda k: round(statistics.median(x[k] for x in recs), 4)
print(json.dumps(dict(build=sys.argv[3], config=sys.argv[4], round=int(sys.argv[5]),
                      step_s=med("step_s"), exposed_fetch_s=med("exposed_fetch_s"),
                      exposed_step_s=med("exposed_step_s"),
                      compute_s_per_step=round(compute / int(sys.argv[6]), 4))))
EOF
		done
	done
done
python3 - "$OUT" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print("| config | A step s | B step s | A compute s/step | B compute s/step | A / B per round |"
      " median A / B |")
print("|---|---|---|---|---|---|---|")
for c in dict.fromkeys(r["config"] for r in runs):
    side = lambda b, k: {r["round"]: r[k] for r in runs if (r["config"], r["build"]) == (c, b)}
    a, b = side("A", "step_s"), side("B", "step_s")
    ratios = [a[k] / b[k] for k in sorted(a) if k in b]
    print("| %s | %.3f | %.3f | %.3f | %.3f | %s | **%.2f** |" % (
        c, statistics.median(a.values()), statistics.median(b.values()),
        statistics.median(side("A", "compute_s_per_step").values()),
        statistics.median(side("B", "compute_s_per_step").values()),
        " ".join("%.2f" % x for x in ratios), statistics.median(ratios)))
EOF
