/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/test_loss_scale.c: the loss scaler (engine/loss_scale.c, zinf/blocks/loss_scale.h)
 * through forced overflows against sequences worked by hand: the defaults, the window,
 * hysteresis (consecutive or not), the minimum scale, a window of one and a static scale.
 */
#include <criterion/criterion.h>
#include <errno.h>

#include "zinf/blocks/loss_scale.h"

/* ---- loss scaling --------------------------------------------------------------------------- */

static void
scaler(struct zinf_loss_scaler *ls, uint32_t power, uint32_t window, uint32_t hyst, bool consec,
       double min)
{
	struct zinf_fp16_opts f;
	zinf_fp16_opts_init(&f);
	f.enabled = true;
	f.initial_scale_power = power;
	f.loss_scale_window = window;
	f.hysteresis = hyst;
	f.consecutive_hysteresis = consec;
	f.min_loss_scale = min;
	cr_assert_eq(zinf_loss_scaler_init(ls, &f), 0);
}

/* Drive `seq` ('o' overflow, '.' clean) and compare the scale after each update. */
static void
drive(struct zinf_loss_scaler *ls, const char *seq, const double *want)
{
	for (int i = 0; seq[i]; i++) {
		int r = zinf_loss_scaler_update(ls, seq[i] == 'o');
		cr_expect_eq(r, seq[i] == 'o' ? 1 : 0, "update %d: returned %d", i, r);
		cr_expect_eq(zinf_loss_scaler_scale(ls), want[i],
			     "after update %d (%c): %g, want %g", i, seq[i],
			     zinf_loss_scaler_scale(ls), want[i]);
	}
}

Test(loss_scale, defaults)
{
	struct zinf_fp16_opts f;
	struct zinf_loss_scaler ls;
	zinf_fp16_opts_init(&f);
	cr_expect_eq(f.initial_scale_power, 16);
	cr_expect_eq(f.loss_scale_window, 1000);
	cr_expect_eq(f.hysteresis, 2);
	cr_expect_eq(f.min_loss_scale, 1.0);
	cr_assert_eq(zinf_loss_scaler_init(&ls, &f), 0);
	cr_expect_eq(zinf_loss_scaler_scale(&ls), 65536.0);
	f.hysteresis = 0;
	cr_expect_eq(zinf_loss_scaler_init(&ls, &f), -EINVAL);
}

Test(loss_scale, window_without_hysteresis)
{
	struct zinf_loss_scaler ls;
	scaler(&ls, 4, 3, 1, false, 1);
	/* the window counts from the start (last overflow -1): the 3rd clean update doubles */
	const double want[] = {16, 16, 32, 16, 16, 16, 32, 32, 32, 64};
	drive(&ls, "...o......", want);
	cr_expect_eq(ls.overflows, 1);
}

Test(loss_scale, hysteresis)
{
	struct zinf_loss_scaler ls;
	scaler(&ls, 4, 3, 2, false, 1);
	/* 1st overflow spends the hysteresis; the next ones halve (it is not refilled by clean
	   steps, only when the scale grows) */
	const double want[] = {16, 8, 4, 4, 4, 8, 8, 4};
	drive(&ls, "ooo...oo", want);
}

Test(loss_scale, consecutive_hysteresis)
{
	struct zinf_loss_scaler ls;
	scaler(&ls, 4, 3, 2, true, 1);
	/* a clean step refills the hysteresis: isolated overflows never halve */
	const double want[] = {16, 16, 16, 16, 16, 8};
	drive(&ls, "o.o.oo", want);
}

Test(loss_scale, minimum)
{
	struct zinf_loss_scaler ls;
	scaler(&ls, 1, 1000, 1, false, 1.5); /* 2^1 */
	const double want[] = {2, 1.5};
	drive(&ls, ".o", want);
	cr_expect_eq(ls.scale, 1.5, "halving stops at min_loss_scale");
	int64_t iter = ls.iter;
	cr_expect_eq(zinf_loss_scaler_update(&ls, true), -ERANGE, "at the minimum, as DeepSpeed");
	cr_expect_eq(ls.scale, 1.5);
	cr_expect_eq(ls.iter, iter, "state left as it was");
}

Test(loss_scale, window_one_and_static)
{
	struct zinf_loss_scaler ls;
	scaler(&ls, 0, 1, 1, false, 1);
	const double want[] = {2, 4, 2, 4};
	drive(&ls, "..o.", want);

	struct zinf_fp16_opts f;
	zinf_fp16_opts_init(&f);
	f.loss_scale = 128;
	cr_assert_eq(zinf_loss_scaler_init(&ls, &f), 0);
	const double st[] = {128, 128, 128};
	drive(&ls, "o.o", st);
	cr_expect_eq(ls.overflows, 2, "static scale: overflowed steps are still skipped");
}
