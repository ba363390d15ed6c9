/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/offload/test_step_visit.c: zinf_step_visit, a sub-group's optimizer state in place
 * (what a checkpoint streams). State on NVMe and on the CPU tier, AdamW (three parts), three
 * sub-groups of uneven length: after zinf_step_load of known values, a READ visit sees exactly
 * them in every part (and the length of its sub-group); a WRITE visit's values are what
 * zinf_step_save reads back, the other sub-groups untouched; a callback's error is returned and
 * writes nothing (the state read back is the previous one); a visit during a step is -EBUSY;
 * every pool buffer is back afterwards.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "common/util.h"
#include "offload/step_rig.h"
#include "zinf/blocks/offload.h"

#define N   2500
#define SGS 1000 /* sub-groups of 1000, 1000, 500 */

/* element i of part p of sub-group k, version v (all exact in fp32) */
static float
val(uint32_t k, uint32_t p, uint64_t i, int v)
{
	return (float)(v * 100000 + k * 10000 + p * 1000) + (float)(i % 997) * 0.25f;
}

struct expect {
	int v;		/* the version expected (READ) or written (WRITE) */
	uint64_t len;	/* the sub-group's length the callback saw */
	int calls, err; /* the callback's calls; the error it returns */
};

static int
check_cb(void *ctx, uint32_t k, void *const parts[], uint64_t len)
{
	struct expect *x = ctx;
	x->calls++;
	x->len = len;
	for (uint32_t p = 0; p < 3; p++) {
		const float *a = parts[p];
		for (uint64_t i = 0; i < len; i++) {
			if (a[i] != val(k, p, i, x->v)) {
				cr_expect(0, "sub-group %u part %u [%llu] = %g, expected %g", k, p,
					  (unsigned long long)i, a[i], val(k, p, i, x->v));
				return -EILSEQ;
			}
		}
	}
	return x->err;
}

static int
fill_cb(void *ctx, uint32_t k, void *const parts[], uint64_t len)
{
	struct expect *x = ctx;
	x->calls++;
	x->len = len;
	for (uint32_t p = 0; p < 3; p++) {
		float *a = parts[p];
		for (uint64_t i = 0; i < len; i++) {
			a[i] = val(k, p, i, x->v);
		}
	}
	return x->err;
}

/* zinf_step_save of sub-group k equals version v */
static void
assert_saved(struct rig *r, uint32_t k, int v)
{
	uint64_t len = zinf_step_sub_group_len(r->st, k);
	float *a[3];
	for (int p = 0; p < 3; p++) {
		a[p] = malloc(len * 4);
	}
	void *const st[3] = {a[0], a[1], a[2]};
	cr_assert_eq(zinf_step_save(r->st, k, st), 0, "%s", zinf_last_error());
	for (uint32_t p = 0; p < 3; p++) {
		for (uint64_t i = 0; i < len; i++) {
			cr_assert_eq(a[p][i], val(k, p, i, v), "sub-group %u part %u [%llu]", k, p,
				     (unsigned long long)i);
		}
		free(a[p]);
	}
}

static void
visit_tier(enum zinf_tier tier)
{
	struct rig r;
	rig_init(&r, tier, N, SGS);
	cr_assert_eq(zinf_step_sub_groups(r.st), 3);
	for (uint32_t k = 0; k < 3; k++) { /* version 1 through zinf_step_load */
		uint64_t len = zinf_step_sub_group_len(r.st, k);
		float *a[3];
		for (uint32_t p = 0; p < 3; p++) {
			a[p] = malloc(len * 4);
			for (uint64_t i = 0; i < len; i++) {
				a[p][i] = val(k, p, i, 1);
			}
		}
		const void *const st[3] = {a[0], a[1], a[2]};
		cr_assert_eq(zinf_step_load(r.st, k, st), 0, "%s", zinf_last_error());
		for (int p = 0; p < 3; p++) {
			free(a[p]);
		}
	}
	for (uint32_t k = 0; k < 3; k++) {
		struct expect x = {.v = 1};
		cr_assert_eq(zinf_step_visit(r.st, k, ZINF_STEP_VISIT_READ, check_cb, &x), 0);
		cr_assert_eq(x.calls, 1);
		cr_assert_eq(x.len, k < 2 ? 1000u : 500u);
	}
	/* sub-group 1 rewritten as version 2; 0 and 2 stay version 1 */
	struct expect w = {.v = 2};
	cr_assert_eq(zinf_step_visit(r.st, 1, ZINF_STEP_VISIT_WRITE, fill_cb, &w), 0, "%s",
		     zinf_last_error());
	assert_saved(&r, 0, 1);
	assert_saved(&r, 1, 2);
	assert_saved(&r, 2, 1);
	/* a callback's error: returned; on NVMe nothing written (version 2 stays) */
	struct expect bad = {.v = 3, .err = -ECANCELED};
	cr_assert_eq(zinf_step_visit(r.st, 1, ZINF_STEP_VISIT_WRITE, fill_cb, &bad), -ECANCELED);
	if (tier == ZINF_TIER_NVME) {
		assert_saved(&r, 1, 2);
	}
	struct expect rd = {.v = 1, .err = -ENOENT};
	cr_assert_eq(zinf_step_visit(r.st, 0, ZINF_STEP_VISIT_READ, check_cb, &rd), -ENOENT);
	cr_assert_eq(zinf_step_visit(r.st, 3, ZINF_STEP_VISIT_READ, check_cb, &rd), -EINVAL);
	cr_assert_eq(zinf_step_visit(r.st, 0, ZINF_STEP_VISIT_READ, NULL, &rd), -EINVAL);
	/* during a step: -EBUSY */
	cr_assert_eq(zinf_step_begin(r.st, 1, 1.0f, NULL, false), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_step_visit(r.st, 0, ZINF_STEP_VISIT_READ, check_cb, &rd), -EBUSY);
	float *g = calloc(N, sizeof(float));
	for (uint32_t k = 0; k < 3; k++) {
		cr_assert_eq(
			zinf_step_ready(r.st, k, g + zinf_step_sub_group_start(r.st, k), ZINF_F32),
			0);
	}
	cr_assert_eq(zinf_step_finish(r.st), 0, "%s", zinf_last_error());
	free(g);
	rig_fini(&r);
}

Test(step_visit, nvme_tier)
{
	visit_tier(ZINF_TIER_NVME);
}

Test(step_visit, cpu_tier)
{
	visit_tier(ZINF_TIER_CPU);
}
