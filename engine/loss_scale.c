/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/loss_scale.c: DeepSpeed's DynamicLossScaler and static LossScaler
 * (zinf/blocks/loss_scale.h): the scale and whether a step is skipped, from the overflow flag of
 * each step. No detection of overflows here (the engine's), no threads.
 */
#include <math.h>
#include <string.h>

#include "common/util.h"
#include "zinf/blocks/loss_scale.h"

void
zinf_fp16_opts_init(struct zinf_fp16_opts *o)
{
	if (!o) {
		return;
	}
	memset(o, 0, sizeof(*o));
	o->loss_scale = 0.0;
	o->initial_scale_power = 16;
	o->loss_scale_window = 1000;
	o->hysteresis = 2;
	o->min_loss_scale = 1.0;
}

int
zinf_loss_scaler_init(struct zinf_loss_scaler *ls, const struct zinf_fp16_opts *f)
{
	if (!ls || !f) {
		return ZINF_FAIL(-EINVAL, "loss scaler: NULL argument");
	}
	if (!isfinite(f->loss_scale) || f->loss_scale < 0) {
		return ZINF_FAIL(-EINVAL, "fp16.loss_scale %g: must be 0 (dynamic) or > 0 (static)",
				 f->loss_scale);
	}
	if (f->initial_scale_power > 1023) {
		return ZINF_FAIL(-EINVAL, "fp16.initial_scale_power %u: at most 1023",
				 f->initial_scale_power);
	}
	if (f->loss_scale_window == 0 || f->hysteresis == 0) {
		return ZINF_FAIL(-EINVAL, "fp16.%s 0: must be at least 1",
				 f->hysteresis == 0 ? "hysteresis" : "loss_scale_window");
	}
	if (!(f->min_loss_scale > 0) || !isfinite(f->min_loss_scale)) {
		return ZINF_FAIL(-EINVAL, "fp16.min_loss_scale %g: must be > 0", f->min_loss_scale);
	}
	memset(ls, 0, sizeof(*ls));
	ls->dynamic = f->loss_scale == 0;
	ls->scale = ls->dynamic ? ldexp(1.0, (int)f->initial_scale_power) : f->loss_scale;
	ls->min_scale = f->min_loss_scale;
	ls->factor = 2.0;
	ls->consecutive_hysteresis = f->consecutive_hysteresis;
	ls->window = f->loss_scale_window;
	ls->hysteresis = f->hysteresis;
	ls->cur_hysteresis = f->hysteresis;
	ls->last_overflow = -1;
	return 0;
}

int
zinf_loss_scaler_update(struct zinf_loss_scaler *ls, bool overflow)
{
	if (!ls) {
		return ZINF_FAIL(-EINVAL, "loss scaler: NULL");
	}
	if (!ls->dynamic) {
		ls->iter++;
		ls->overflows += overflow;
		return overflow ? 1 : 0;
	}
	if (overflow) {
		if (ls->hysteresis == 1 || ls->cur_hysteresis == 1) {
			if (ls->scale == ls->min_scale) {
				return ZINF_FAIL(
					-ERANGE,
					"fp16: gradient overflow with the loss scale already "
					"at min_loss_scale %g (iteration %lld): the run "
					"cannot go on (DeepSpeed stops here too)",
					ls->min_scale, (long long)ls->iter);
			}
			ls->scale = fmax(ls->scale / ls->factor, ls->min_scale);
		} else {
			ls->cur_hysteresis--;
		}
		ls->last_overflow = ls->iter;
		ls->overflows++;
	} else {
		if (ls->consecutive_hysteresis) {
			ls->cur_hysteresis = ls->hysteresis;
		}
		if ((ls->iter - ls->last_overflow) % ls->window == 0) {
			if (!ls->consecutive_hysteresis) {
				ls->cur_hysteresis = ls->hysteresis;
			}
			ls->scale *= ls->factor;
		}
	}
	ls->iter++;
	return overflow ? 1 : 0;
}

double
zinf_loss_scaler_scale(const struct zinf_loss_scaler *ls)
{
	return ls ? ls->scale : NAN;
}
