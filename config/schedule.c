/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/schedule.c: DeepSpeed's learning-rate schedules, and OneCycle's momentum, as pure
 * functions of last_batch_iteration (zinf/schedule.h). Each formula is DeepSpeed's get_lr() (or
 * OneCycle's get_mom()), in double; the caller rounds to the optimizer's float. No state and no
 * logging.
 */
#include <math.h>
#include <string.h>

#include "common/util.h"
#include "zinf/schedule.h"

static const char *const sched_names[] = {"none",	    "WarmupLR", "WarmupDecayLR",
					  "WarmupCosineLR", "OneCycle", "LRRangeTest"};

const char *
zinf_schedule_name(enum zinf_sched_type type)
{
	return (unsigned)type < ZINF_ARRAY_SIZE(sched_names) ? sched_names[type] : "?";
}

int
zinf_schedule_parse(const char *name, enum zinf_sched_type *out)
{
	for (unsigned i = 1; name && i < ZINF_ARRAY_SIZE(sched_names); i++) {
		if (strcmp(name, sched_names[i]) == 0) {
			*out = (enum zinf_sched_type)i;
			return 0;
		}
	}
	return -EINVAL;
}

void
zinf_schedule_opts_init(struct zinf_schedule_opts *s, enum zinf_sched_type type, double base_lr)
{
	if (!s) {
		return;
	}
	memset(s, 0, sizeof(*s));
	s->type = type;
	s->warmup_type = ZINF_WARMUP_LOG;
	s->base_lr = base_lr;
	s->warmup_min_lr = 0.0;
	/* WarmupLR's warmup_max_lr defaults to the optimizer's lr; WarmupDecayLR keeps 0.001 */
	s->warmup_max_lr = type == ZINF_SCHED_WARMUP_DECAY ? 0.001 : base_lr;
	s->warmup_num_steps = 1000;
	s->total_num_steps = 0;
	s->warmup_min_ratio = 0.0;
	s->cos_min_ratio = 0.0001;
	s->decay_lr_rate = 0.0;
	s->cycle_first_step_size = 2000;
	s->cycle_second_step_size = -1;
	s->cycle_first_stair_count = 0;
	s->cycle_second_stair_count = -1;
	s->decay_step_size = 0;
	s->cycle_momentum = true;
	s->cycle_min_mom = 0.8;
	s->cycle_max_mom = 0.9;
	s->decay_mom_rate = 0.0;
	s->lr_range_test_min_lr = 1e-3;
	s->lr_range_test_step_size = 2000;
	s->lr_range_test_step_rate = 1.0;
	s->lr_range_test_staircase = false;
}

/* The warm-up fraction of WarmupLR/WarmupDecayLR/WarmupCosineLR at `it` < warmup steps. */
static double
warmup_gamma(const struct zinf_schedule_opts *s, int64_t warm, int64_t it)
{
	if (s->warmup_type == ZINF_WARMUP_LINEAR) {
		return (double)it / (double)warm;
	}
	return (1.0 / log((double)warm)) * log((double)it + 1.0);
}

static double
cosine_lr(const struct zinf_schedule_opts *s, int64_t warm, int64_t it)
{
	double ratio;
	if (it < 0) {
		return 0.0; /* DeepSpeed's constructor writes 0 */
	}
	if (it < warm) {
		ratio = warmup_gamma(s, warm, it);
		ratio = s->warmup_min_ratio + ratio * (1.0 - s->warmup_min_ratio);
	} else {
		double real_last = (double)(it - warm + 1);
		double real_total = (double)(s->total_num_steps - warm);
		ratio = (1.0 + cos(M_PI * real_last / real_total)) / 2.0;
		ratio = fmax(0.0, s->cos_min_ratio + (1.0 - s->cos_min_ratio) * ratio);
	}
	return s->base_lr * ratio;
}

/* OneCycle's position in its cycle (DeepSpeed's _get_scale_factor): 0 at the ends, 1 at the
   peak; `it` < the cycle's length. */
static double
one_cycle_scale(const struct zinf_schedule_opts *s, int64_t it, double total)
{
	double first = s->cycle_first_step_size;
	double ratio = first / total;
	double bi = (double)(it + 1);
	double cycle = floor(1.0 + bi / total);
	double x = 1.0 + bi / total - cycle;
	return x <= ratio ? x / ratio : (x - 1.0) / (ratio - 1.0);
}

static double
one_cycle_total(const struct zinf_schedule_opts *s)
{
	double first = s->cycle_first_step_size;
	return first + (s->cycle_second_step_size >= 0 ? s->cycle_second_step_size : first);
}

static double
one_cycle_lr(const struct zinf_schedule_opts *s, int64_t it)
{
	double total = one_cycle_total(s);
	if ((double)it < total) {
		return s->cycle_min_lr +
		       (s->cycle_max_lr - s->cycle_min_lr) * one_cycle_scale(s, it, total);
	}
	/* DeepSpeed skips the decay when decay_step_size or decay_lr_rate is (close to) 0 */
	if (fabs(s->decay_step_size) < 1e-9 || fabs(s->decay_lr_rate) < 1e-9) {
		return s->cycle_min_lr;
	}
	double interval = ((double)it - total + 1.0) / s->decay_step_size;
	return s->cycle_min_lr / (1.0 + s->decay_lr_rate * interval);
}

double
zinf_schedule_lr(const struct zinf_schedule_opts *s, int64_t it)
{
	if (!s) {
		return NAN;
	}
	int64_t warm = s->warmup_num_steps < 2 ? 2 : s->warmup_num_steps;
	switch (s->type) {
	case ZINF_SCHED_NONE:
		return s->base_lr;
	case ZINF_SCHED_WARMUP_LR:
	case ZINF_SCHED_WARMUP_DECAY: {
		double gamma;
		if (it < 0) {
			return s->warmup_min_lr;
		}
		if (it < warm) {
			gamma = warmup_gamma(s, warm, it);
		} else if (s->type == ZINF_SCHED_WARMUP_LR) {
			gamma = 1.0;
		} else {
			double rest = (double)(s->total_num_steps - warm);
			gamma = fmax(0.0, (double)(s->total_num_steps - it) / fmax(1.0, rest));
		}
		return s->warmup_min_lr + (s->warmup_max_lr - s->warmup_min_lr) * gamma;
	}
	case ZINF_SCHED_WARMUP_COSINE:
		return cosine_lr(s, warm, it);
	case ZINF_SCHED_ONE_CYCLE:
		return one_cycle_lr(s, it);
	case ZINF_SCHED_LR_RANGE_TEST: {
		double interval = (double)(it + 1) / s->lr_range_test_step_size;
		if (s->lr_range_test_staircase) {
			interval = floor(interval);
		}
		return s->lr_range_test_min_lr * (1.0 + s->lr_range_test_step_rate * interval);
	}
	}
	return NAN;
}

double
zinf_schedule_step_lr(const struct zinf_schedule_opts *s, int64_t step)
{
	return zinf_schedule_lr(s, step - 2);
}

/*
 * DeepSpeed's get_mom()[0]: inverse to the lr in the cycle (max at the ends, min at the peak);
 * after it, cycle_max_mom times (not divided by) the decay factor, so a decay_mom_rate > 0
 * raises it. Its constructor writes cycle_min_mom (min_moms), which is what it = -1 returns.
 */
double
zinf_schedule_momentum(const struct zinf_schedule_opts *s, int64_t it)
{
	if (!s || s->type != ZINF_SCHED_ONE_CYCLE || !s->cycle_momentum) {
		return NAN;
	}
	if (it < 0) {
		return s->cycle_min_mom;
	}
	double total = one_cycle_total(s);
	if ((double)it < total) {
		return s->cycle_max_mom -
		       (s->cycle_max_mom - s->cycle_min_mom) * one_cycle_scale(s, it, total);
	}
	if (fabs(s->decay_step_size) < 1e-9 || fabs(s->decay_mom_rate) < 1e-9) {
		return s->cycle_max_mom;
	}
	double interval = ((double)it - total + 1.0) / s->decay_step_size;
	return s->cycle_max_mom * (1.0 + s->decay_mom_rate * interval);
}

double
zinf_schedule_step_momentum(const struct zinf_schedule_opts *s, int64_t step)
{
	return zinf_schedule_momentum(s, step - 2);
}
