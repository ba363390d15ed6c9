#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/house_ab.sh: two builds of zinf (A: before a change, B: after) in interleaved rounds on
# the same disk and memory, so that drift hits both alike: `bench io` (one large registered
# buffer, write then read), `bench step` (pipelined step, fp32 Adam) and `bench adam` (fused
# step, 1 and 2 threads, the best SIMD path). Then, on B alone, `bench step` for every
# --optimizer/--state pair in interleaved rounds. JSON lines on stdout (one per run, with
# "build" and "round" added); medians with scripts/ tools: see bench/RESULTS.md.
#
# usage: bench/house_ab.sh A/zinf B/zinf [--rounds 3] [--dir DIR] [--params 1e8] [--io-size 1G]
set -euo pipefail
A=$1
B=$2
shift 2
ROUNDS=3
DIR=./zinf-house-ab
PARAMS=1e8
IOSIZE=1G
while [ $# -gt 0 ]; do
	case "$1" in
	--rounds) ROUNDS=$2; shift 2 ;;
	--dir) DIR=$2; shift 2 ;;
	--params) PARAMS=$2; shift 2 ;;
	--io-size) IOSIZE=$2; shift 2 ;;
	*) echo "house_ab.sh: unknown option $1" >&2; exit 2 ;;
	esac
done
mkdir -p "$DIR"
tag() { python3 -c 'import json,sys; [print(json.dumps(dict(json.loads(l), build=sys.argv[1], round=int(sys.argv[2]), what=sys.argv[3]))) for l in sys.stdin if l.startswith("{")]' "$@"; }
echo "# $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for r in $(seq 1 "$ROUNDS"); do
	order="A B"
	[ $((r % 2)) -eq 0 ] && order="B A"
	for b in $order; do
		z=$A
		[ "$b" = B ] && z=$B
		"$z" bench io --path "$DIR" --size "$IOSIZE" --json | tr -d '\n' | sed 's/$/\n/' | tag "$b" "$r" io
		"$z" bench step --params "$PARAMS" --sub-group 1e7 --buffers 4 --steps 3 --path "$DIR" \
			--json | tr -d '\n' | sed 's/$/\n/' | tag "$b" "$r" step
		for t in 1 2; do
			"$z" bench adam --params "$PARAMS" --threads "$t" --reps 5 --json |
				tr -d '\n' | sed 's/$/\n/' | tag "$b" "$r" "adam-t$t"
		done
	done
done
for r in $(seq 1 "$ROUNDS"); do
	for os in "adamw f32" "adamw bf16" "adagrad f32" "lion f32"; do
		set -- $os
		"$B" bench step --params "$PARAMS" --sub-group 1e7 --buffers 4 --steps 3 --path "$DIR" \
			--optimizer "$1" --state "$2" --json | tr -d '\n' | sed 's/$/\n/' |
			tag B "$r" "step-$1-$2"
	done
done
rmdir "$DIR" 2>/dev/null || true
