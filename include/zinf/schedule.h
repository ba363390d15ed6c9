/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zinf/schedule.h: DeepSpeed's learning-rate schedules (deepspeed/runtime/lr_schedules.py:
 * WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle, LRRangeTest) with DeepSpeed's parameter
 * names and defaults, as pure functions of the step. No state: the caller keeps the step count
 * (the engine's checkpoint saves it).
 * The trainer's API (zinf/zinf.h includes it).
 *
 * DeepSpeed's engine calls scheduler.step() after every optimizer step; step() sets
 * last_batch_iteration += 1 (from -1) and writes get_lr() into the optimizer. So optimizer step
 * n (1-based) runs with get_lr() at last_batch_iteration = n - 2, the first with the value the
 * scheduler's constructor wrote (its get_lr() at -1). zinf_schedule_lr() is get_lr();
 * zinf_schedule_step_lr() is the lr optimizer step n uses.
 *
 * OneCycle with cycle_momentum also writes the optimizer's betas at the same points:
 * (get_mom(), 0.99), the momentum as the first and DeepSpeed's fixed 0.99 as the second
 * (lr_schedules.py's min_moms / max_moms), so under it Adam's beta2 is 0.99 whatever the
 * optimizer's config says. zinf_schedule_momentum() is get_mom()'s first element,
 * zinf_schedule_step_momentum() the one optimizer step n uses (same convention as the lr); the
 * trainer hands both betas to zinf_engine_set_betas(). DeepSpeed turns cycle_momentum off (a
 * warning) for an optimizer without betas (Adagrad).
 *
 * Not here: per-parameter-group lists of lrs (zinf has one group); OneCycle's stair counts
 * (read, no effect, as in DeepSpeed before its staircase was added).
 */
#ifndef ZINF_SCHEDULE_H
#define ZINF_SCHEDULE_H

#include <stdbool.h>
#include <stdint.h>

#include "zinf/common.h"

#ifdef __cplusplus
extern "C" {
#endif

enum zinf_sched_type {
	ZINF_SCHED_NONE = 0,	      /* the optimizer's lr, constant */
	ZINF_SCHED_WARMUP_LR = 1,     /* "WarmupLR" */
	ZINF_SCHED_WARMUP_DECAY = 2,  /* "WarmupDecayLR" */
	ZINF_SCHED_WARMUP_COSINE = 3, /* "WarmupCosineLR" */
	ZINF_SCHED_ONE_CYCLE = 4,     /* "OneCycle" */
	ZINF_SCHED_LR_RANGE_TEST = 5, /* "LRRangeTest" */
};

enum zinf_warmup_type { ZINF_WARMUP_LOG = 0, ZINF_WARMUP_LINEAR = 1 };

/** A schedule: its type and every type's parameters (DeepSpeed's names, DeepSpeed's defaults). */
struct zinf_schedule_opts {
	enum zinf_sched_type type;
	enum zinf_warmup_type warmup_type; /* Warmup*: "log" (default) or "linear" */
	double base_lr; /* the optimizer's lr: WarmupCosineLR's org_lr, WarmupLR's
			   warmup_max_lr when that is absent, NONE's lr */
	/* WarmupLR, WarmupDecayLR */
	double warmup_min_lr;	  /* default 0 */
	double warmup_max_lr;	  /* WarmupLR: default base_lr; WarmupDecayLR: 0.001 */
	int64_t warmup_num_steps; /* default 1000; values below 2 act as 2 */
	int64_t total_num_steps;  /* WarmupDecayLR, WarmupCosineLR (required) */
	/* WarmupCosineLR */
	double warmup_min_ratio; /* default 0 */
	double cos_min_ratio;	 /* default 1e-4 */
	/* OneCycle */
	double cycle_min_lr, cycle_max_lr;   /* required */
	double decay_lr_rate;		     /* default 0: no decay after the cycle */
	double cycle_first_step_size;	     /* default 2000 */
	double cycle_second_step_size;	     /* < 0 (default): cycle_first_step_size */
	int64_t cycle_first_stair_count;     /* read, no effect (as in DeepSpeed); 0 */
	int64_t cycle_second_stair_count;    /* read, no effect; -1: first's */
	double decay_step_size;		     /* default 0: no decay */
	bool cycle_momentum;		     /* cycle the betas; default true */
	uint8_t reserved[7];		     /* zero */
	double cycle_min_mom, cycle_max_mom; /* 0.8, 0.9 */
	double decay_mom_rate;		     /* 0 */
	/* LRRangeTest */
	double lr_range_test_min_lr;	/* default 1e-3 */
	double lr_range_test_step_size; /* default 2000 */
	double lr_range_test_step_rate; /* default 1.0 */
	bool lr_range_test_staircase;	/* default false */
	uint8_t reserved2[7];		/* zero */
};

/** Fill *s with `type`'s defaults, base_lr the optimizer's lr. */
ZINF_API void zinf_schedule_opts_init(struct zinf_schedule_opts *s, enum zinf_sched_type type,
				      double base_lr);

/**
 * DeepSpeed's get_lr() with last_batch_iteration = it (it = -1: the value its constructor
 * writes into the optimizer: WarmupLR/WarmupDecayLR warmup_min_lr, WarmupCosineLR 0, OneCycle
 * cycle_min_lr, LRRangeTest lr_range_test_min_lr). NaN for a NULL schedule or unknown type.
 */
ZINF_API double zinf_schedule_lr(const struct zinf_schedule_opts *s, int64_t it);
/** The lr that optimizer step `step` (1, 2, ...) runs with: zinf_schedule_lr(s, step - 2). */
ZINF_API double zinf_schedule_step_lr(const struct zinf_schedule_opts *s, int64_t step);

/** The second beta DeepSpeed's OneCycle writes beside each momentum (cycle_momentum). */
#define ZINF_SCHEDULE_MOM_BETA2 0.99

/**
 * OneCycle's momentum, DeepSpeed's get_mom()[0] with last_batch_iteration = it: during the
 * cycle cycle_max_mom - (cycle_max_mom - cycle_min_mom) * f, f the lr's position (0 at the
 * ends, 1 at the peak), so it falls from cycle_max_mom to cycle_min_mom over the first part and
 * climbs back over the second; after the cycle cycle_max_mom * (1 + decay_mom_rate *
 * (it - cycle + 1) / decay_step_size) (it grows: a decay_mom_rate > 0 reaches 1 eventually, and
 * zinf_engine_set_betas refuses a beta1 >= 1), or cycle_max_mom when decay_step_size or
 * decay_mom_rate is 0. it < 0: cycle_min_mom, what DeepSpeed's constructor writes. NaN when the
 * schedule does not cycle momentum (NULL, a type other than OneCycle, cycle_momentum false):
 * the optimizer keeps its betas.
 */
ZINF_API double zinf_schedule_momentum(const struct zinf_schedule_opts *s, int64_t it);
/** The momentum optimizer step `step` (1, 2, ...) runs with: momentum(s, step - 2). */
ZINF_API double zinf_schedule_step_momentum(const struct zinf_schedule_opts *s, int64_t step);

/** "WarmupLR", ... ("none" for ZINF_SCHED_NONE, "?" otherwise). */
ZINF_API const char *zinf_schedule_name(enum zinf_sched_type type);
/** Parse DeepSpeed's type name (exact spelling). 0, or -EINVAL (nothing logged). */
ZINF_API int zinf_schedule_parse(const char *name, enum zinf_sched_type *out);

#ifdef __cplusplus
}
#endif
#endif
