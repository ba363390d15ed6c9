#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/gpt_blas_variants.sh: the CPU layers (bench_gpt_layers) on each of Debian's OpenBLAS
# builds, chosen at run time by LD_LIBRARY_PATH (all three are libopenblas.so.0, one ABI), in
# interleaved rounds: openmp (the BLAS on the layers' libgomp threads), pthread (its own thread
# pool beside the layers' OpenMP threads) and serial (one thread in every product). One JSON
# line per run: the variant, wall seconds per forward and backward (median), and the process's
# CPU seconds (user + system, /usr/bin/time) per step: the CPU the threads burned, spinning
# included. Then, per variant, the medians over the rounds.
#
# usage: bench/gpt_blas_variants.sh [--build DIR] [--rounds 5] [--threads 2]
#                                   [-- bench_gpt_layers flags]
# default flags: issue 21's model (8 layers, 8 heads, hidden 512, context 128, vocabulary 1024,
# batch 16), 3 reps after 2 warm-ups.
set -euo pipefail
build=build
rounds=5
threads=2
while [ $# -gt 0 ]; do
	case "$1" in
	--build) build=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	--threads) threads=$2; shift 2 ;;
	--) shift; break ;;
	*) echo "gpt_blas_variants.sh: unknown option $1" >&2; exit 2 ;;
	esac
done
[ $# -gt 0 ] || set -- --layers 8 --heads 8 --hidden 512 --context 128 --vocab 1024 --reps 3
lib=/usr/lib/$(gcc -print-multiarch)
echo "# $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg) OMP_NUM_THREADS=$threads" >&2
OUT=$(mktemp)
trap 'rm -f "$OUT" "$OUT.t"' EXIT
variants="openmp pthread serial"
for r in $(seq 1 "$rounds"); do
	for v in $variants; do
		[ -f "$lib/openblas-$v/libopenblas.so.0" ] || continue
		line=$(OMP_NUM_THREADS=$threads LD_LIBRARY_PATH=$lib/openblas-$v /usr/bin/time \
			-f "%U %S" -o "$OUT.t" "$build/bench_gpt_layers" "$@")
		echo "$line" | python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
u, s = map(float, open(sys.argv[3]).read().split()[-2:])
steps = j["reps"] + 2  # bench_gpt_layers warms up with 2
print(json.dumps(dict(variant=sys.argv[1], round=int(sys.argv[2]), blas=j["blas"],
                      threads=j["threads"], median_s=j["median_s"],
                      cpu_s_per_step=round((u + s) / steps, 3))))
' "$v" "$r" "$OUT.t" | tee -a "$OUT"
	done
done
python3 - "$OUT" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print("| OpenBLAS | wall s per step (median) | per round | CPU s per step (median) |")
print("|---|---|---|---|")
for v in dict.fromkeys(r["variant"] for r in runs):
    rs = [r for r in runs if r["variant"] == v]
    print("| %s | %.4g | %s | %.3g |" % (v, statistics.median(r["median_s"] for r in rs),
          " ".join("%.3g" % r["median_s"] for r in rs),
          statistics.median(r["cpu_s_per_step"] for r in rs)))
PY
