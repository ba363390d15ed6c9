#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/adam_ab.sh: two builds of `zinf bench adam` against each other on the RESULTS.md target
# (avx2, f32 grads, bf16 copy; fused, and three-pass on the new build), 1 and 2 threads,
# interleaved round by round so both see the same load. JSON lines on stdout, with "build" added.
# usage: bench/adam_ab.sh OLD_BUILD NEW_BUILD [params] [rounds]
set -euo pipefail
old=$1
new=$2
params=${3:-1e8}
rounds=${4:-5}
for round in $(seq "$rounds"); do
	echo "# round $round: $(uptime)" >&2
	for threads in 1 2; do
		for b in "$old" "$new"; do
			"$b/zinf" bench adam --params "$params" --threads "$threads" --simd avx2 \
				--grad-dtype f32 --copy-dtype bf16 --reps 7 --json |
				sed "s|^{|{\"build\": \"$b\", |" || true
		done
		"$new/zinf" bench adam --params "$params" --threads "$threads" --simd avx2 \
			--grad-dtype f32 --copy-dtype bf16 --reps 7 --three-pass --json |
			sed "s|^{|{\"build\": \"$new\", |" || true
	done
done
