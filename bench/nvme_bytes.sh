#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/nvme_bytes.sh: the NVMe bytes per parameter per step of issue 23's options, measured by
# `zinf bench engine` (both tiers on NVMe) in interleaved rounds, beside `zinf estimate`'s model
# of the same options. Each variant is "NAME;ZINF;BENCH FLAGS;ESTIMATE FLAGS": a name, the zinf
# binary to run (a baseline build may be given), the flags added to the common bench engine
# line, and the flags that tell estimate the same options. Round r runs the variants in order,
# reversed on even rounds, so that the disk's drift hits all alike. One JSON line per run on
# stdout (bytes per parameter read and written, by kind; step_s; the disk rate measured in that
# run; io_bound_s), then per variant the medians over the rounds and estimate's bytes, with
# bench / estimate. Python only prints.
#
# usage: bench/nvme_bytes.sh --dir DIR --estimate ZINF [--rounds 2] [--layers 160]
#            [--hidden 1024] [--steps 2] --variant 'NAME;ZINF;BENCH FLAGS;ESTIMATE FLAGS' ...
# (--estimate: the zinf whose `estimate` models every variant, a build with its options)
set -euo pipefail
ROUNDS=2
DIR=
LAYERS=160
HIDDEN=1024
STEPS=2
VARIANTS=()
ESTIMATE=
while [ $# -gt 0 ]; do
	case "$1" in
	--rounds) ROUNDS=$2; shift 2 ;;
	--dir) DIR=$2; shift 2 ;;
	--layers) LAYERS=$2; shift 2 ;;
	--hidden) HIDDEN=$2; shift 2 ;;
	--steps) STEPS=$2; shift 2 ;;
	--variant) VARIANTS+=("$2"); shift 2 ;;
	--estimate) ESTIMATE=$2; shift 2 ;;
	*) echo "nvme_bytes.sh: unknown option $1" >&2; exit 2 ;;
	esac
done
[ -n "$DIR" ] && [ -n "$ESTIMATE" ] && [ ${#VARIANTS[@]} -gt 0 ] || {
	echo "usage: nvme_bytes.sh --dir DIR --estimate ZINF --variant 'NAME;ZINF;BENCH FLAGS;ESTIMATE FLAGS' ..." >&2
	exit 2
}
for v in "${VARIANTS[@]}"; do
	IFS=';' read -r name zinf bflags eflags <<<"$v"
	[ -x "$zinf" ] || {
		echo "nvme_bytes.sh: --variant '$v': NAME;ZINF;BENCH FLAGS;ESTIMATE FLAGS, ZINF an" \
			"executable ('$zinf' is not; no ';' inside a field)" >&2
		exit 2
	}
done
mkdir -p "$DIR"
COMMON="--layers $LAYERS --hidden $HIDDEN --compute-ms 0 --stage 3 --offload-param nvme
	--offload-optimizer nvme --sub-group-size 1e7 --bucket 2e7 --param-buffer-size 1.3e7
	--max-live 1e8 --steps $STEPS --warmup 1"
PARAMS=$((LAYERS * (12 * HIDDEN * HIDDEN + 6 * HIDDEN)))
echo "# $(date -u +%FT%TZ) load $(cut -d' ' -f1-3 /proc/loadavg); $PARAMS parameters" >&2
OUT=$(mktemp)
EST=$(mktemp)
trap 'rm -f "$OUT" "$EST"' EXIT
n=${#VARIANTS[@]}
for i in $(seq 0 $((n - 1))); do
	IFS=';' read -r name zinf bflags eflags <<<"${VARIANTS[$i]}"
	# shellcheck disable=SC2086
	"$ESTIMATE" estimate --params "$PARAMS" --hidden "$HIDDEN" $eflags --json |
		python3 -c '
import json, sys
o = json.load(sys.stdin)
r = [r for r in o["rows"] if r["stage"] == 3 and r["offload_param"] == "nvme" and r["offload_optimizer"] == "nvme"][0]
print(json.dumps(dict(variant=sys.argv[1], estimate=r["nvme_bytes_per_param"])))
' "$name" >>"$EST"
done
for r in $(seq 1 "$ROUNDS"); do
	order=$(seq 0 $((n - 1)))
	[ $((r % 2)) -eq 0 ] && order=$(seq $((n - 1)) -1 0)
	for i in $order; do
		IFS=';' read -r name zinf bflags eflags <<<"${VARIANTS[$i]}"
		rm -rf "${DIR:?}"/*
		# shellcheck disable=SC2086
		"$zinf" bench engine --nvme-path "$DIR" $COMMON $bflags --json | tr -d '\n' |
			sed 's/$/\n/' | python3 -c '
import json, sys
P = None
for l in sys.stdin:
    if not l.startswith("{"):
        continue
    j = json.loads(l)
    P = j["params"]
    kinds = {}
    for k, pre in (("total", ""), ("param", "param_"), ("optim", "optim_"), ("grad", "grad_")):
        if pre + "nvme_read_bytes" in j:  # a build from before the kinds were counted: total only
            kinds[k] = dict(read=round(j[pre + "nvme_read_bytes"] / P, 3),
                            written=round(j[pre + "nvme_write_bytes"] / P, 3))
    print(json.dumps(dict(variant=sys.argv[1], round=int(sys.argv[2]), step_s=round(j["step_s"], 3),
                          disk_GBps=round(j["disk"]["GBps"], 3), io_bound_s=round(j["io_bound_s"], 3),
                          bytes_per_param=kinds)))
' "$name" "$r" | tee -a "$OUT"
	done
done
python3 - "$OUT" "$EST" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
est = {e["variant"]: e["estimate"] for e in map(json.loads, open(sys.argv[2]))}
print("| variant | NVMe B/param read + written (params, optimizer, gradients) | estimate | bench / estimate | step s (per round) | disk GB/s (per round) |")
print("|---|---|---|---:|---|---|")
for v in dict.fromkeys(r["variant"] for r in runs):
    rs = [r for r in runs if r["variant"] == v]
    med = lambda f: statistics.median(f(r) for r in rs)
    b = {k: {d: med(lambda r: r["bytes_per_param"][k][d]) for d in ("read", "written")}
         for k in ("total", "param", "optim", "grad") if k in rs[0]["bytes_per_param"]}
    tot = b["total"]["read"] + b["total"]["written"]
    e = est[v]["total"]["read"] + est[v]["total"]["written"]
    parts = ", ".join("%.2f + %.2f" % (b[k]["read"], b[k]["written"]) if k in b else "-"
                      for k in ("param", "optim", "grad"))
    print("| %s | %.2f + %.2f = %.2f (%s) | %.2f | %.3f | %.2f (%s) | %s |" % (
        v, b["total"]["read"], b["total"]["written"], tot, parts, e, tot / e if e else float("nan"),
        med(lambda r: r["step_s"]), ", ".join("%.2f" % r["step_s"] for r in rs),
        ", ".join("%.2f" % r["disk_GBps"] for r in rs)))
PY
