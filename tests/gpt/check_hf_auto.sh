#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# tests/gpt/check_hf_auto.sh: the example trainer (zinf_gpt) and `zinf config check` resolve a
# Hugging Face-style ds_config.json ("auto" for the batch keys, lr, betas, eps, weight_decay,
# gradient_clipping, fp16/bf16, the schedule and the bucket sizes: tests/config/configs/hf_*.json)
# through the one resolver (config/config_auto.c), to the same values. zinf_gpt trains 10 steps
# of a tiny model with ZINF_LOG_LEVEL=info, which logs every "auto" resolved; config check is
# given what zinf_gpt gives (world 1, micro batch 6, accumulation 1, hidden 32, 10 steps, warmup
# a tenth of them) and nothing else (the optimizer's values take TrainingArguments' defaults on
# both sides). Asserted: zinf_gpt exits 0 (it refused such a file before: "betas is auto, which
# is resolved from the trainer's beta1 and beta2, not given"), config check exits 0, both list
# the same "auto" paths with the same values, and betas, eps, weight_decay and
# gradient_clipping are among them.
#
# usage: check_hf_auto.sh ZINF_GPT ZINF CONFIG_DIR SCRATCH
set -euo pipefail
gpt=$1 zinf=$2 cfgdir=$3 scratch=$4
work=$(mktemp -d "$scratch/hf-auto-XXXXXX")
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1

for c in hf_zero2 hf_zero3; do
	ZINF_LOG_LEVEL=info "$gpt" --config "$cfgdir/$c.json" --layers 2 --heads 2 --hidden 32 \
		--context 16 --vocab 32 --fanout 4 --steps 10 --batch 6 --no-progress --quiet \
		--scratch-parent "$work" --device host >"$work/$c.gpt.out" 2>"$work/$c.gpt.err" || {
		echo "FAIL: zinf_gpt refused $c.json:"
		cat "$work/$c.gpt.err"
		exit 1
	}
	"$zinf" config check "$cfgdir/$c.json" --world 1 --micro-batch 6 --grad-accum 1 \
		--hidden 32 --total-steps 10 --warmup-steps 1 >"$work/$c.cc.out" 2>"$work/$c.cc.err" || {
		echo "FAIL: zinf config check $c.json:"
		cat "$work/$c.cc.err"
		exit 1
	}
	# "path = value" from each: zinf_gpt's log lines, config check's "auto:" lines
	sed -n 's/.*: \([a-z0-9_.]*\): "auto" resolved to \([^ ]*\) (.*/\1 = \2/p' \
		"$work/$c.gpt.err" | sort >"$work/$c.gpt"
	sed -n 's/^auto: \([a-z0-9_.]*\) = \([^ ]*\) (.*/\1 = \2/p' "$work/$c.cc.out" |
		sort >"$work/$c.cc"
	for k in optimizer.params.betas optimizer.params.eps optimizer.params.weight_decay \
		gradient_clipping; do
		grep -q "^$k = " "$work/$c.gpt" || { echo "FAIL: $c: $k not resolved"; exit 1; }
	done
	if ! diff "$work/$c.gpt" "$work/$c.cc" >"$work/diff"; then
		echo "FAIL: $c: zinf_gpt (<) and config check (>) resolve differently:"
		cat "$work/diff"
		exit 1
	fi
	echo "ok: $c.json: $(wc -l <"$work/$c.gpt") \"auto\" values, the same in both:"
	sed 's/^/  /' "$work/$c.gpt"
done
