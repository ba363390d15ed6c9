/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/config/test_schedule.c: the lr schedules against their published formulas (DeepSpeed's
 * lr_schedules.py docstrings and code, written again here in double, independently of
 * config/schedule.c) and against values worked by hand; OneCycle's momentum against its
 * formula and against values worked by hand. The loss scaler: tests/engine/test_loss_scale.c.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>

#include "zinf/schedule.h"

static void
expect_lr(const struct zinf_schedule_opts *s, int64_t it, double want)
{
	double got = zinf_schedule_lr(s, it);
	cr_expect(fabs(got - want) <= 1e-12 * fmax(1.0, fabs(want)),
		  "%s at iteration %lld: %.17g, want %.17g", zinf_schedule_name(s->type),
		  (long long)it, got, want);
}

/* ---- reference formulas (double) ---------------------------------------------------------- */

static double
ref_warm_gamma(bool linear, double warm, double it)
{
	return linear ? it / warm : log(it + 1.0) / log(warm);
}

static double
ref_warmup(double lo, double hi, double warm, double it, bool linear)
{
	if (it < 0) {
		return lo;
	}
	return lo + (hi - lo) * (it < warm ? ref_warm_gamma(linear, warm, it) : 1.0);
}

static double
ref_decay(double lo, double hi, double warm, double total, double it, bool linear)
{
	if (it < 0) {
		return lo;
	}
	double g = it < warm ? ref_warm_gamma(linear, warm, it)
			     : fmax(0.0, (total - it) / fmax(1.0, total - warm));
	return lo + (hi - lo) * g;
}

static double
ref_cosine(double base, double wmin, double cmin, double warm, double total, double it, bool linear)
{
	if (it < 0) {
		return 0.0;
	}
	if (it < warm) {
		return base * (wmin + (1 - wmin) * ref_warm_gamma(linear, warm, it));
	}
	double r = 0.5 * (1 + cos(M_PI * (it - warm + 1) / (total - warm)));
	return base * fmax(0.0, cmin + (1 - cmin) * r);
}

Test(schedule, warmup_lr_log_and_linear)
{
	struct zinf_schedule_opts s;
	zinf_schedule_opts_init(&s, ZINF_SCHED_WARMUP_LR, 0.5);
	cr_assert_eq(s.warmup_max_lr, 0.5, "WarmupLR's max defaults to the optimizer's lr");
	s.warmup_min_lr = 1e-5;
	s.warmup_max_lr = 3e-4;
	s.warmup_num_steps = 50;
	for (int64_t it = -1; it < 80; it++) {
		expect_lr(&s, it, ref_warmup(1e-5, 3e-4, 50, (double)it, false));
	}
	s.warmup_type = ZINF_WARMUP_LINEAR;
	for (int64_t it = -1; it < 80; it++) {
		expect_lr(&s, it, ref_warmup(1e-5, 3e-4, 50, (double)it, true));
	}
	/* by hand: linear, 0 -> 1 over 4 steps */
	s.warmup_min_lr = 0;
	s.warmup_max_lr = 1;
	s.warmup_num_steps = 4;
	expect_lr(&s, 0, 0.0);
	expect_lr(&s, 1, 0.25);
	expect_lr(&s, 3, 0.75);
	expect_lr(&s, 4, 1.0);
	expect_lr(&s, 1000, 1.0);
	/* optimizer step n runs with get_lr at n - 2: steps 1 and 2 both at the minimum */
	cr_expect_eq(zinf_schedule_step_lr(&s, 1), 0.0);
	cr_expect_eq(zinf_schedule_step_lr(&s, 2), 0.0);
	cr_expect_eq(zinf_schedule_step_lr(&s, 3), 0.25);
	/* warmup_num_steps below 2 acts as 2 (log(1) would divide by zero) */
	s.warmup_num_steps = 1;
	s.warmup_type = ZINF_WARMUP_LOG;
	expect_lr(&s, 0, 0.0);
	expect_lr(&s, 1, 1.0); /* log(2) / log(2) */
	expect_lr(&s, 2, 1.0);
}

Test(schedule, warmup_decay)
{
	struct zinf_schedule_opts s;
	zinf_schedule_opts_init(&s, ZINF_SCHED_WARMUP_DECAY, 0.5);
	cr_assert_eq(s.warmup_max_lr, 0.001, "WarmupDecayLR's max defaults to 0.001");
	s.warmup_num_steps = 20;
	s.total_num_steps = 100;
	s.warmup_min_lr = 1e-6;
	for (int64_t it = -1; it < 130; it++) {
		expect_lr(&s, it, ref_decay(1e-6, 0.001, 20, 100, (double)it, false));
	}
	/* by hand: linear, 0 -> 1 in 4, to 0 at 10 */
	s.warmup_type = ZINF_WARMUP_LINEAR;
	s.warmup_min_lr = 0;
	s.warmup_max_lr = 1;
	s.warmup_num_steps = 4;
	s.total_num_steps = 10;
	expect_lr(&s, 2, 0.5);
	expect_lr(&s, 4, 1.0);
	expect_lr(&s, 7, 0.5);
	expect_lr(&s, 10, 0.0);
	expect_lr(&s, 12, 0.0);
}

Test(schedule, warmup_cosine)
{
	struct zinf_schedule_opts s;
	zinf_schedule_opts_init(&s, ZINF_SCHED_WARMUP_COSINE, 2e-4);
	s.warmup_num_steps = 30;
	s.total_num_steps = 200;
	s.warmup_min_ratio = 0.1;
	for (int64_t it = -1; it < 220; it++) {
		expect_lr(&s, it, ref_cosine(2e-4, 0.1, 1e-4, 30, 200, (double)it, false));
	}
	s.warmup_type = ZINF_WARMUP_LINEAR;
	for (int64_t it = -1; it < 220; it++) {
		expect_lr(&s, it, ref_cosine(2e-4, 0.1, 1e-4, 30, 200, (double)it, true));
	}
	/* by hand: base 1, linear warm-up over 4, 8 cosine steps to 0 */
	s.base_lr = 1;
	s.warmup_min_ratio = 0;
	s.cos_min_ratio = 0;
	s.warmup_num_steps = 4;
	s.total_num_steps = 12;
	expect_lr(&s, -1, 0.0);
	expect_lr(&s, 3, 0.75);
	expect_lr(&s, 4, (1 + cos(M_PI / 8)) / 2);
	expect_lr(&s, 7, 0.5); /* real step 4 of 8 */
	expect_lr(&s, 11, 0.0);
	s.cos_min_ratio = 0.1;
	expect_lr(&s, 7, 0.1 + 0.9 * 0.5);
}

Test(schedule, one_cycle)
{
	struct zinf_schedule_opts s;
	zinf_schedule_opts_init(&s, ZINF_SCHED_ONE_CYCLE, 0.5);
	s.cycle_min_lr = 0.1;
	s.cycle_max_lr = 1.0;
	s.cycle_first_step_size = 4;
	s.decay_step_size = 2;
	s.decay_lr_rate = 0.5;
	/* by hand: cycle of 8 (second size = first), peak at iteration 3 */
	double want[] = {0.1, 0.325, 0.55, 0.775, 1.0, 0.775, 0.55, 0.325, 0.1};
	for (int i = 0; i < 9; i++) {
		expect_lr(&s, i - 1, want[i]);
	}
	expect_lr(&s, 8, 0.1 / 1.25); /* decay interval (8 - 8 + 1) / 2 */
	expect_lr(&s, 11, 0.1 / 2.0);
	/* asymmetric cycle: up 2, down 6 */
	s.cycle_first_step_size = 2;
	s.cycle_second_step_size = 6;
	expect_lr(&s, 1, 1.0);
	expect_lr(&s, 4, 0.1 + 0.9 * (1.0 - 3.0 / 6.0));
	/* no decay when decay_step_size is 0 */
	s.decay_step_size = 0;
	expect_lr(&s, 100, 0.1);
}

/* OneCycle's get_mom()[0] (lr_schedules.py) written again in double: it < 0 is what its
 * constructor writes (min_moms); the cycle's scale as _get_scale_factor; after the cycle
 * max_moms times (1 + rate * interval), or max_moms when either decay key is 0. */
static double
ref_one_cycle_mom(double lo, double hi, double first, double second, double rate, double dstep,
		  double it)
{
	double total = first + second;
	if (it < 0) {
		return lo;
	}
	if (it < total) {
		double bi = it + 1, ratio = first / total;
		double x = 1 + bi / total - floor(1 + bi / total);
		double f = x <= ratio ? x / ratio : (x - 1) / (ratio - 1);
		return hi - (hi - lo) * f;
	}
	if (rate == 0 || dstep == 0) {
		return hi;
	}
	return hi * (1 + rate * (it - total + 1) / dstep);
}

static void
expect_mom(const struct zinf_schedule_opts *s, int64_t it, double want)
{
	double got = zinf_schedule_momentum(s, it);
	cr_expect(fabs(got - want) <= 1e-12,
		  "OneCycle momentum at iteration %lld: %.17g, want %.17g", (long long)it, got,
		  want);
}

Test(schedule, one_cycle_momentum)
{
	struct zinf_schedule_opts s;
	zinf_schedule_opts_init(&s, ZINF_SCHED_ONE_CYCLE, 0.5);
	cr_expect(s.cycle_momentum);
	cr_expect_eq(s.cycle_min_mom, 0.8);
	cr_expect_eq(s.cycle_max_mom, 0.9);
	s.cycle_min_lr = 0.1;
	s.cycle_max_lr = 1.0;
	s.cycle_first_step_size = 4;
	s.cycle_min_mom = 0.85;
	s.cycle_max_mom = 0.95;
	/* by hand: cycle of 8, momentum lowest where the lr peaks (iteration 3); iteration -1
	   is the constructor's cycle_min_mom, not the cycle's start; no decay: cycle_max_mom */
	double want[] = {0.85, 0.925, 0.9, 0.875, 0.85, 0.875, 0.9, 0.925, 0.95, 0.95, 0.95};
	for (int i = 0; i < 11; i++) {
		expect_mom(&s, i - 1, want[i]);
	}
	expect_mom(&s, 1000, 0.95);
	/* decay after the cycle: 0.95 x (1 + 0.02 x (it - 8 + 1) / 3) */
	s.decay_step_size = 3;
	s.decay_mom_rate = 0.02;
	expect_mom(&s, 7, 0.95);
	expect_mom(&s, 8, 0.95 * (1 + 0.02 / 3));
	expect_mom(&s, 10, 0.95 * 1.02);
	/* decay_step_size 0 or decay_mom_rate 0: none */
	s.decay_step_size = 0;
	expect_mom(&s, 10, 0.95);
	s.decay_step_size = 3;
	s.decay_mom_rate = 0;
	expect_mom(&s, 10, 0.95);
	/* against the formula: an asymmetric cycle (up 5, down 11), both halves and the decay */
	s.cycle_first_step_size = 5;
	s.cycle_second_step_size = 11;
	s.decay_step_size = 7;
	s.decay_mom_rate = 0.001;
	s.cycle_min_mom = 0.8;
	s.cycle_max_mom = 0.9;
	for (int64_t it = -1; it < 60; it++) {
		expect_mom(&s, it, ref_one_cycle_mom(0.8, 0.9, 5, 11, 0.001, 7, (double)it));
	}
	/* the step convention: step n runs with iteration n - 2 */
	for (int64_t n = 1; n < 30; n++) {
		cr_expect_eq(zinf_schedule_step_momentum(&s, n), zinf_schedule_momentum(&s, n - 2));
	}
	cr_expect_eq(zinf_schedule_step_momentum(&s, 1), 0.8);
	cr_expect_eq(zinf_schedule_step_momentum(&s, 6), 0.8); /* the lr's peak: iteration 4 */
	cr_expect(fabs(zinf_schedule_step_lr(&s, 6) - 1.0) < 1e-12);
	/* no cycling: NaN (the optimizer keeps its betas) */
	s.cycle_momentum = false;
	cr_expect(isnan(zinf_schedule_momentum(&s, 3)));
	zinf_schedule_opts_init(&s, ZINF_SCHED_WARMUP_LR, 0.5);
	cr_expect(isnan(zinf_schedule_step_momentum(&s, 3)));
	cr_expect(isnan(zinf_schedule_momentum(NULL, 3)));
	cr_expect_eq(ZINF_SCHEDULE_MOM_BETA2, 0.99);
}

Test(schedule, lr_range_test)
{
	struct zinf_schedule_opts s;
	zinf_schedule_opts_init(&s, ZINF_SCHED_LR_RANGE_TEST, 0.5);
	s.lr_range_test_min_lr = 0.01;
	s.lr_range_test_step_size = 10;
	s.lr_range_test_step_rate = 2;
	expect_lr(&s, -1, 0.01);
	expect_lr(&s, 4, 0.02);
	expect_lr(&s, 9, 0.03);
	s.lr_range_test_staircase = true;
	expect_lr(&s, 4, 0.01);
	expect_lr(&s, 8, 0.01);
	expect_lr(&s, 9, 0.03);
	expect_lr(&s, 29, 0.07);
}

Test(schedule, names)
{
	enum zinf_sched_type t;
	cr_expect_eq(zinf_schedule_parse("WarmupCosineLR", &t), 0);
	cr_expect_eq(t, ZINF_SCHED_WARMUP_COSINE);
	cr_expect_eq(zinf_schedule_parse("warmuplr", &t), -EINVAL, "DeepSpeed's names are exact");
	cr_expect_str_eq(zinf_schedule_name(ZINF_SCHED_ONE_CYCLE), "OneCycle");
	cr_expect(isnan(zinf_schedule_lr(NULL, 0)));
}
