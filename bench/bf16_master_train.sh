#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/bf16_master_train.sh: the example GPT trainer with the master weight in fp32 and in bf16
# (stochastic rounding, zinf_adam_step_bf16master), each with Adam's m and v in fp32 and in q8
# (8-bit blockwise), the same seed, data and model, and the loss curves compared with the fp32
# master's with fp32 m and v: per run, the largest |loss - reference loss| over the steps, the
# mean of the last 50 steps' losses and its difference from the reference's, and the NVMe bytes
# of the last step. Chosen with the config keys optimizer.params.zinf_master_weights and
# zinf_optimizer_states on copies of CONFIG (issue 23, lever 3; the numbers are in
# bench/RESULTS.md). As bench/q8_state_train.sh (the same model and table); not a timing.
#
# usage: bench/bf16_master_train.sh ZINF_GPT [CONFIG] [STEPS] [OUTDIR]
#   ZINF_GPT  the built trainer (build/zinf_gpt)
#   CONFIG    default examples/gpt/configs/zero3_nvme.json (parameters and optimizer on NVMe)
#   STEPS     default 1000
#   OUTDIR    where the configs and the --json records go (default a temporary directory, removed)
set -euo pipefail
gpt=${1:?usage: $0 ZINF_GPT [CONFIG] [STEPS] [OUTDIR]}
here=$(cd "$(dirname "$0")" && pwd)
cfg=${2:-$here/../examples/gpt/configs/zero3_nvme.json}
steps=${3:-1000}
out=${4:-}
if [ -z "$out" ]; then
	out=$(mktemp -d)
	trap 'rm -rf "$out"' EXIT
fi
mkdir -p "$out"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
model=(--layers 4 --heads 4 --hidden 128 --context 64 --vocab 256 --batch 8 --seed 1
	--steps "$steps" --no-progress --quiet --device host --scratch-parent "$out")
runs="fp32-fp32 bf16-fp32 fp32-q8 bf16-q8" # master-moments
for r in $runs; do
	python3 - "$cfg" "${r%-*}" "${r#*-}" "$out/$r.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
p = c.setdefault("optimizer", {"type": "AdamW", "params": {}}).setdefault("params", {})
p["zinf_master_weights"] = sys.argv[2]
p["zinf_optimizer_states"] = sys.argv[3]
json.dump(c, open(sys.argv[4], "w"), indent=1)
PY
	"$gpt" "${model[@]}" --config "$out/$r.json" --json "$out/$r.jsonl" >"$out/$r.txt"
done
python3 - "$out" $runs <<'PY'
import json, sys
out, runs = sys.argv[1], sys.argv[2:]
def recs(s):
    return [json.loads(l) for l in open(f"{out}/{s}.jsonl") if l.startswith("{\"step\"")]
ref = recs(runs[0])
tail = lambda r: sum(x["loss"] for x in r[-50:]) / len(r[-50:])
print(f"{'master-m/v':10} {'steps':>5} {'first loss':>10} {'mean last 50':>12} {'diff vs ref':>11} "
      f"{'max |diff|':>10} {'at step':>7} {'mean |diff|':>11} {'nvme read/step':>14} "
      f"{'written/step':>12}")
for s in runs:
    r = recs(s)
    d = [abs(a["loss"] - b["loss"]) for a, b in zip(r, ref)]
    k = max(range(len(d)), key=d.__getitem__)
    print(f"{s:10} {len(r):5d} {r[0]['loss']:10.5f} {tail(r):12.6f} {tail(r) - tail(ref):+11.6f} "
          f"{d[k]:10.6f} {r[k]['step']:7d} {sum(d) / len(d):11.6f} "
          f"{r[-1]['nvme_read_bytes']:14d} {r[-1]['nvme_write_bytes']:12d}")
PY
