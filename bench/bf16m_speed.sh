#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/bf16m_speed.sh: the bf16-master step's speed against the plain step with the same m and v
# (`zinf bench adam --master bf16`, which times both in one run, interleaved), for q8, f32 and
# bf16 (stochastic) m and v, 1 and 2 threads, the avx512 and avx2 paths, for each zinf binary
# given (e.g. a build before a change and one after), rounds interleaved. JSON lines on stdout,
# each preceded by a "# build LABEL" line; bench/bf16m_summary.py makes the table.
# usage: bench/bf16m_speed.sh LABEL=ZINF [LABEL=ZINF ...] [-- params rounds]
set -euo pipefail
bins=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do bins+=("$1"); shift; done
[ "${1:-}" = -- ] && shift
params=${1:-3e7}
rounds=${2:-3}
for round in $(seq "$rounds"); do
	echo "# round $round: $(uptime)" >&2
	for threads in 1 2; do
		for simd in avx512 avx2; do
			for state in q8 f32 bf16-sr; do
				for b in "${bins[@]}"; do
					echo "# build ${b%%=*}"
					"${b#*=}" bench adam --params "$params" --threads "$threads" \
						--simd "$simd" --state "$state" --master bf16 --reps 5 \
						--json || true
				done
			done
		done
	done
done
