/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/offload/test_step_skip.c: zinf_step_skip, a step pass over some sub-groups only (the
 * engine's speculative step). State on NVMe, three sub-groups, two pool buffers (so that the
 * skipped sub-groups were being read ahead): after a pass that makes sub-group 0 ready and
 * skips 1 and 2, finish succeeds, sub-group 0's state is the optimizer's in memory (AdamW,
 * zinf_optimizer_step on the same range and index0, bit for bit) and 1 and 2 are unchanged
 * bit for bit; a second pass with the same step number makes 1 and 2 ready and skips 0: every
 * sub-group is then the reference's after one step. Every buffer is back in the pool; skipping
 * outside a step, out of range or after ready is -EINVAL.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "offload/step_rig.h"
#include "zinf/blocks/offload.h"

#define N   3000
#define SGS 1000

static float master[N], m[N], v[N], grad[N];

/* Sub-group k's three parts from the files into out (3 x SGS floats). */
static void
save(struct rig *r, uint32_t k, float out[3][SGS])
{
	void *st[3] = {out[0], out[1], out[2]};
	cr_assert_eq(zinf_step_save(r->st, k, st), 0, "%s", zinf_last_error());
}

static void
expect_ref(float got[3][SGS], uint32_t k, bool stepped, const char *what)
{
	const float *want[3] = {master + k * SGS, m + k * SGS, v + k * SGS};
	static float init[3][SGS];
	for (int p = 0; p < 3; p++) {
		for (uint32_t i = 0; i < SGS; i++) {
			init[p][i] = p == 0 ? (float)((int)(i * 7 + k) % 19 - 9) / 16.0f : 0.0f;
		}
		const float *w = stepped ? want[p] : init[p];
		cr_assert(memcmp(got[p], w, SGS * 4) == 0, "%s: sub-group %u part %d %s", what, k,
			  p, stepped ? "is not the reference's" : "changed");
	}
}

Test(step_skip, partial_passes)
{
	struct rig r;
	rig_init(&r, ZINF_TIER_NVME, N, SGS);
	for (uint32_t i = 0; i < N; i++) {
		master[i] = (float)((int)(i % SGS * 7 + i / SGS) % 19 - 9) / 16.0f;
		grad[i] = (float)((int)(i * 13 % 23) - 11) / 8.0f;
	}
	for (uint32_t k = 0; k < N / SGS; k++) {
		const void *st[3] = {master + k * SGS, NULL, NULL};
		cr_assert_eq(zinf_step_load(r.st, k, st), 0, "%s", zinf_last_error());
	}
	/* the reference: one AdamW step over each sub-group with index0 its start */
	for (uint32_t k = 0; k < N / SGS; k++) {
		void *parts[3] = {master + k * SGS, m + k * SGS, v + k * SGS};
		cr_assert_eq(zinf_optimizer_step(r.opt, 1, 0.5f, parts, grad + k * SGS, ZINF_F32,
						 k * SGS, SGS, NULL, ZINF_F32),
			     0);
	}
	cr_assert_eq(zinf_step_skip(r.st, 0), -EINVAL); /* outside a step */
	static float got[3][SGS];

	/* pass 1: sub-group 0 only (1 and 2 were read ahead with the two buffers) */
	cr_assert_eq(zinf_step_begin(r.st, 1, 0.5f, NULL, false), 0);
	cr_assert_eq(zinf_step_ready(r.st, 0, grad, ZINF_F32), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_step_skip(r.st, 0), -EINVAL); /* already made ready */
	cr_assert_eq(zinf_step_skip(r.st, 3), -EINVAL); /* out of range */
	cr_assert_eq(zinf_step_skip(r.st, 1), 0);
	cr_assert_eq(zinf_step_skip(r.st, 2), 0);
	cr_assert_eq(zinf_step_finish(r.st), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_pool_free_count(r.pool), 2);
	save(&r, 0, got);
	expect_ref(got, 0, true, "pass 1");
	save(&r, 1, got);
	expect_ref(got, 1, false, "pass 1");
	save(&r, 2, got);
	expect_ref(got, 2, false, "pass 1");
	cr_assert_eq(zinf_step_sub_group_written(r.st, 0), 1);
	cr_assert_eq(zinf_step_sub_group_written(r.st, 1), 0);

	/* pass 2, the same step number: the others */
	cr_assert_eq(zinf_step_begin(r.st, 1, 0.5f, NULL, false), 0);
	cr_assert_eq(zinf_step_skip(r.st, 0), 0);
	cr_assert_eq(zinf_step_ready(r.st, 2, grad + 2 * SGS, ZINF_F32), 0, "%s",
		     zinf_last_error());
	cr_assert_eq(zinf_step_ready(r.st, 1, grad + SGS, ZINF_F32), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_step_finish(r.st), 0, "%s", zinf_last_error());
	for (uint32_t k = 0; k < N / SGS; k++) {
		save(&r, k, got);
		expect_ref(got, k, true, "pass 2");
	}
	rig_fini(&r);
}
