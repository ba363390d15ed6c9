#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/gpt_layers.sh: the example trainer's CPU layers (bench/gpt_layers.c) against the same
# model written plainly in PyTorch (bench/gpt_layers.py), one forward and backward, with the same
# shapes, threads (OMP_NUM_THREADS for both; the script calls torch.set_num_threads) and BLAS:
# PyTorch runs with LD_LIBRARY_PATH at the directory of the libopenblas.so.0 that the C layers
# load (ldd), so that Debian's python3-torch, which links libblas.so.3 (an alternative, by default
# OpenBLAS's pthread build), gets the same OpenBLAS build; a run stops if PyTorch's
# /proc/self/maps shows another. Rounds: for each architecture, model and thread count, in turn,
#   pairs (default): one process, C and PyTorch steps alternately (gpt_layers.py --c-lib
#                    BUILD/libgpt_layers_bench.so); the round's ratio is the median over its pairs
#   processes:       bench_gpt_layers and gpt_layers.py as two processes, C first in odd rounds
#                    and PyTorch first in even ones; the round's ratio is of the two medians
# One JSON line per run on stdout; at the end, per (model, threads), the medians of each side's
# seconds and of the rounds' ratios pytorch_s / c_s (the C layers' speed as a fraction of
# PyTorch's: >= 0.9 is issue 21's target). Needs Debian's python3-torch (apt-get install
# python3-torch; --python names another interpreter with torch).
#
# usage: bench/gpt_layers.sh [--build DIR] [--rounds 5] [--reps 5] [--threads "1 2"]
#                            [--archs "gpt2 llama"] [--models "default issue"]
#                            [--mode pairs|processes] [--python /usr/bin/python3]
#   default: zinf_gpt's default model (4 layers, 4 heads, hidden 64, context 32, vocabulary 64,
#            batch 16), 20 reps a run
#   issue:   issue 21's (8 layers, 8 heads, hidden 512, context 128, vocabulary 1024, batch 16:
#            25.8M parameters as GPT-2), --reps a run; each run warms up with 2 reps
#   long:    issue's with context 256 and batch 4 (not run unless named)
#   llama:   the same shapes with --arch llama, the untied head; issue's and long's with 2
#            key-value heads and an MLP of 1408 (23.6M parameters)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=build
rounds=5
reps=5
threads="1 2"
models="default issue"
archs="gpt2 llama"
mode=pairs
python=/usr/bin/python3
while [ $# -gt 0 ]; do
	case "$1" in
	--build) build=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	--reps) reps=$2; shift 2 ;;
	--threads) threads=$2; shift 2 ;;
	--models) models=$2; shift 2 ;;
	--archs) archs=$2; shift 2 ;;
	--mode) mode=$2; shift 2 ;;
	--python) python=$2; shift 2 ;;
	-h|--help) sed -n '3,28p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "gpt_layers.sh: unknown option $1" >&2; exit 2 ;;
	esac
done
die() { echo "gpt_layers.sh: $*" >&2; exit 1; }
bin=$build/bench_gpt_layers
lib=$build/libgpt_layers_bench.so
[ -x "$bin" ] && [ -f "$lib" ] ||
	die "$bin or $lib missing (cmake --build $build --target bench_gpt_layers gpt_layers_bench)"
blas=$(ldd "$bin" | awk '$1 == "libopenblas.so.0" { print $3 }')
[ -n "$blas" ] || die "$bin does not load libopenblas.so.0 (built without a BLAS?)"
blasdir=$(dirname "$blas")
case $mode in pairs|processes) ;; *) die "--mode pairs or processes, not $mode" ;; esac
echo "# $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg); mode $mode; BLAS $blas;" \
	"OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE:-}" >&2

model_args() { # ARCH/MODEL
	case "${1#*/}" in
	default) echo "--reps 20" ;;
	issue) echo "--layers 8 --heads 8 --hidden 512 --context 128 --vocab 1024" \
		"--reps $reps" ;;
	long) echo "--layers 8 --heads 8 --hidden 512 --context 256 --batch 4 --vocab 1024" \
		"--reps $reps" ;;
	*) echo "gpt_layers.sh: unknown model ${1#*/}" >&2; exit 2 ;;
	esac
	case "$1" in
	gpt2/*) ;;
	llama/issue | llama/long) echo "--arch llama --kv-heads 2 --ffn 1408" ;;
	llama/*) echo "--arch llama" ;;
	*) echo "gpt_layers.sh: unknown architecture ${1%/*}" >&2; exit 2 ;;
	esac
}
one() { # SIDE MODEL THREADS: one run (SIDE c, pytorch or both), its JSON line
	local extra=()
	[ "$1" = both ] && extra=(--c-lib "$lib")
	if [ "$1" = c ]; then
		OMP_NUM_THREADS=$3 "$bin" $(model_args "$2")
	else
		OMP_NUM_THREADS=$3 LD_LIBRARY_PATH=$blasdir "$python" "$here/gpt_layers.py" \
			$(model_args "$2") "${extra[@]}"
	fi
}
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for r in $(seq 1 "$rounds"); do
	order="c pytorch"
	[ $((r % 2)) -eq 0 ] && order="pytorch c"
	[ "$mode" = pairs ] && order=both
	for m in $(for a in $archs; do for m in $models; do echo "$a/$m"; done; done); do
		for t in $threads; do
			for side in $order; do
				one "$side" "$m" "$t" | python3 -c '
import json, sys
j = json.loads(sys.stdin.read())
if j["impl"] != "c":
    blas = [l for l in j["libraries"] if "openblas" in l or "libblas" in l]
    if not blas or any(not l.startswith(sys.argv[3] + "/") for l in blas):
        sys.exit("gpt_layers.sh: PyTorch mapped %s, not %s" % (blas, sys.argv[3]))
print(json.dumps(dict(model=sys.argv[1], round=int(sys.argv[2]), **j)))
' "$m" "$r" "$blasdir" | tee -a "$OUT"
			done
		done
	done
done
python3 - "$OUT" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
print("| model | threads | C layers s (median) | PyTorch s (median) | PyTorch / C per round |"
      " median ratio |")
print("|---|---|---|---|---|---|")
for m in dict.fromkeys(r["model"] for r in runs):
    for t in sorted({r["threads"] for r in runs if r["model"] == m}):
        rs = [r for r in runs if (r["model"], r["threads"]) == (m, t)]
        c, p, ratio = {}, {}, {}
        for r in rs:
            if r["impl"] == "both":
                c[r["round"]], p[r["round"]] = r["c_median_s"], r["median_s"]
                ratio[r["round"]] = r["ratio_median"]
            else:
                (c if r["impl"] == "c" else p)[r["round"]] = r["median_s"]
        for k in c:
            if k in p and k not in ratio:
                ratio[k] = p[k] / c[k]
        ratios = [ratio[k] for k in sorted(ratio)]
        print("| %s | %d | %.4f | %.4f | %s | **%.2f** |" % (
            m, t, statistics.median(c.values()), statistics.median(p.values()),
            " ".join("%.2f" % x for x in ratios), statistics.median(ratios)))
EOF
