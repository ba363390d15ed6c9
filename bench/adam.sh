#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/adam.sh: the CPU-Adam matrix recorded in bench/RESULTS.md: each SIMD path this CPU runs,
# fused vs three passes, 1 and 2 threads, f32 gradients with a bf16 copy (plus the other grad
# and copy dtypes on the best path), each against a STREAM triad in the same run.
# usage: bench/adam.sh [build-dir] [params] [rounds]   (JSON lines on stdout)
set -euo pipefail
build=${1:-build}
params=${2:-1e8}
rounds=${3:-3}
zinf=$build/zinf
for round in $(seq "$rounds"); do
	echo "# round $round: $(uptime)" >&2
	for simd in avx2 scalar; do
		for threads in 1 2; do
			for mode in "" --three-pass; do
				reps=7
				[ "$simd" = scalar ] && reps=3
				$zinf bench adam --params "$params" --threads "$threads" --simd "$simd" \
					--grad-dtype f32 --copy-dtype bf16 --reps "$reps" $mode --json || true
			done
		done
	done
	for threads in 1 2; do
		for cfg in "--grad-dtype f16 --copy-dtype f16" "--grad-dtype bf16 --copy-dtype bf16" \
			"--grad-dtype f32 --copy-dtype none" "--grad-dtype f32 --copy-dtype bf16 --state bf16-sr"; do
			$zinf bench adam --params "$params" --threads "$threads" $cfg --reps 7 --json || true
		done
	done
done
$zinf bench adam --accuracy --steps 10000 --json
