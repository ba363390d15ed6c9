#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/comm_ab.sh: `zinf bench comm` for several variants in interleaved rounds (the order
# rotates each round, so that drift hits every variant alike), each at every rank count given.
# A variant is NAME=COMMAND, e.g. base=/tmp/zinf-old or nb="env ZINF_COMM_MPI_PROGRESS=0
# build/zinf". JSON lines on stdout, one per result, with "variant" and "round" added; summarise
# with bench/comm_summary.py (medians of the ratio over rounds). Extra arguments after -- go to
# `zinf bench comm` (default: --op all --size 1M --size 16M --size 64M --iters 10).
#
# usage: bench/comm_ab.sh [--rounds 3] [--np "2 4"] NAME=CMD... [-- BENCH ARGS]
set -euo pipefail
ROUNDS=3
NPS="2 4"
VARIANTS=()
while [ $# -gt 0 ]; do
	case "$1" in
	--rounds) ROUNDS=$2; shift 2 ;;
	--np) NPS=$2; shift 2 ;;
	--) shift; break ;;
	*=*) VARIANTS+=("$1"); shift ;;
	*) echo "comm_ab.sh: unknown argument $1" >&2; exit 2 ;;
	esac
done
ARGS=("$@")
[ ${#ARGS[@]} -eq 0 ] && ARGS=(--op all --size 1M --size 16M --size 64M --iters 10)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "# $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
n=${#VARIANTS[@]}
for r in $(seq 1 "$ROUNDS"); do
	for np in $NPS; do
		for k in $(seq 0 $((n - 1))); do
			v=${VARIANTS[$(((k + r) % n))]}
			name=${v%%=*}
			cmd=${v#*=}
			# shellcheck disable=SC2086
			mpirun --oversubscribe --bind-to none -np "$np" $cmd bench comm "${ARGS[@]}" --json |
				python3 -c '
import json, sys
o = json.loads(sys.stdin.read())
for x in o.get("results", [o]):
    x.update(variant=sys.argv[1], round=int(sys.argv[2]))
    print(json.dumps(x))' "$name" "$r"
		done
	done
done
echo "# $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
