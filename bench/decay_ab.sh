#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# bench/decay_ab.sh: the cost of per-parameter weight decay (ZINF_PARAM_NO_DECAY). One build of
# zinf, `zinf bench engine` with weight decay 0.1 on every tensor (A) and the same with the norms
# and biases flagged (B, --no-decay-1d: the step cuts its optimizer calls at their boundaries),
# in interleaved rounds (A B, B A, ...). One line per run: the min and median over its timed steps
# of the optimizer kernel's time (optimizer_s) and of the step (step_s). The min is the number to
# compare on a shared machine (other work only adds time). Python only prints.
#
# usage: bench/decay_ab.sh ZINF [bench engine options]   (ROUNDS=4 by default)
set -euo pipefail
Z=$1
shift
for r in $(seq 1 ${ROUNDS:-4}); do
	for arm in A B; do
		[ $((r % 2)) -eq 0 ] && arm=$([ $arm = A ] && echo B || echo A)
		extra=(); [ $arm = B ] && extra=(--no-decay-1d)
		"$Z" bench engine "$@" --weight-decay 0.1 "${extra[@]}" --json |
			python3 -c "
import json,sys,statistics as s
d=json.load(sys.stdin); ps=d['per_step']
o=[x['optimizer_s'] for x in ps]; t=[x['step_s'] for x in ps]
print('$arm', $r, 'optimizer min %.4f med %.4f  step min %.4f med %.4f'
      % (min(o), s.median(o), min(t), s.median(t)))"
	done
done
