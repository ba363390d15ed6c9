#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/gpt_layers.sh: the example trainer's CPU layers (bench_gpt_layers, bench/gpt_layers.c)
# against the same model written plainly in PyTorch (bench/gpt_layers.py), one forward and
# backward, in interleaved rounds (C then PyTorch, PyTorch then C, ...) with the same shapes and
# threads (OMP_NUM_THREADS for both; the script calls torch.set_num_threads), and the same BLAS:
# PyTorch runs with LD_LIBRARY_PATH at the directory of the libopenblas.so.0 that
# bench_gpt_layers loads (ldd), so that Debian's python3-torch, which links libblas.so.3 (an
# alternative, by default OpenBLAS's pthread build), gets the same OpenBLAS build; the run stops
# if PyTorch's /proc/self/maps shows another. One JSON line per run on stdout; at the end, per
# (model, threads), the medians of each side's medians and of the per-round ratio
# pytorch_s / c_s (the C layers' speed as a fraction of PyTorch's: >= 0.9 is the issue's target).
#
# usage: bench/gpt_layers.sh [--build DIR] [--rounds 5] [--reps 5] [--threads "1 2"]
#                            [--models "default issue"] [--python /usr/bin/python3]
#   default: zinf_gpt's default model (4 layers, 4 heads, hidden 64, context 32, vocabulary 64,
#            batch 16), 20 reps a run
#   issue:   issue 21's (8 layers, 8 heads, hidden 512, context 128, vocabulary 1024, batch 16:
#            25.8M parameters), --reps a run
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=build
rounds=5
reps=5
threads="1 2"
models="default issue"
python=/usr/bin/python3
while [ $# -gt 0 ]; do
	case "$1" in
	--build) build=$2; shift 2 ;;
	--rounds) rounds=$2; shift 2 ;;
	--reps) reps=$2; shift 2 ;;
	--threads) threads=$2; shift 2 ;;
	--models) models=$2; shift 2 ;;
	--python) python=$2; shift 2 ;;
	-h|--help) sed -n '3,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
	*) echo "gpt_layers.sh: unknown option $1" >&2; exit 2 ;;
	esac
done
bin=$build/bench_gpt_layers
die() { echo "gpt_layers.sh: $*" >&2; exit 1; }
[ -x "$bin" ] || die "$bin missing (cmake --build $build --target bench_gpt_layers)"
blas=$(ldd "$bin" | awk '$1 == "libopenblas.so.0" { print $3 }')
[ -n "$blas" ] || die "$bin does not load libopenblas.so.0 (built without a BLAS?)"
blasdir=$(dirname "$blas")
echo "# $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg); BLAS $blas;" \
	"OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-} OPENBLAS_L2_SIZE=${OPENBLAS_L2_SIZE:-}" >&2

model_args() {
	case "$1" in
	default) echo "--reps 20" ;;
	issue) echo "--layers 8 --heads 8 --hidden 512 --context 128 --vocab 1024" \
		"--reps $reps" ;;
	*) echo "gpt_layers.sh: unknown model $1" >&2; exit 2 ;;
	esac
}
one() { # SIDE MODEL THREADS: one run, its JSON line
	if [ "$1" = c ]; then
		OMP_NUM_THREADS=$3 "$bin" $(model_args "$2")
	else
		OMP_NUM_THREADS=$3 LD_LIBRARY_PATH=$blasdir "$python" "$here/gpt_layers.py" \
			$(model_args "$2")
	fi
}
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for r in $(seq 1 "$rounds"); do
	order="c pytorch"
	[ $((r % 2)) -eq 0 ] && order="pytorch c"
	for m in $models; do
		for t in $threads; do
			for side in $order; do
				one "$side" "$m" "$t" | python3 -c '
import json, os, sys
j = json.loads(sys.stdin.read())
if j["impl"] == "pytorch":
    blas = [l for l in j["libraries"] if "openblas" in l or "libblas" in l]
    if not blas or any(not l.startswith(sys.argv[4] + "/") for l in blas):
        sys.exit("gpt_layers.sh: PyTorch mapped %s, not %s" % (blas, sys.argv[4]))
print(json.dumps(dict(model=sys.argv[1], round=int(sys.argv[2]), **j)))
' "$m" "$r" "$t" "$blasdir" | tee -a "$OUT"
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
        def side(impl):
            return {r["round"]: r["median_s"] for r in runs
                    if (r["model"], r["threads"], r["impl"]) == (m, t, impl)}
        c, p = side("c"), side("pytorch")
        ratios = [p[k] / c[k] for k in sorted(c) if k in p]
        print("| %s | %d | %.4f | %.4f | %s | **%.2f** |" % (
            m, t, statistics.median(c.values()), statistics.median(p.values()),
            " ".join("%.2f" % x for x in ratios), statistics.median(ratios)))
EOF
