/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/offload/test_step_before.c: zinf_step_opts.before_fn, a sub-group's state shown to the
 * caller after its reads and before the optimizer runs on it (the engine's speculative step
 * keeps it so). State on NVMe (two pool buffers: sub-groups are read ahead), on the CPU tier
 * (in place) and on the CPU tier with a copy_fn (the pool's buffers carry the copy); AdamW,
 * three sub-groups of uneven length (1000, 1000, 500). Step 1 after zinf_step_load of known
 * values: the hook sees exactly them in every part, with its sub-group's length, once per
 * sub-group, on the thread that made it ready; the optimizer ran afterwards (the state read
 * back differs). Step 2 with sub-group 1 left out (zinf_step_skip): the hook sees exactly what
 * zinf_step_save read back before the step for 0 and 2, and is not called for 1. Step 3, the
 * hook failing on sub-group 1: zinf_step_ready returns its error, finish returns it again, the
 * message names the sub-group and before_fn, sub-group 1 is neither stepped nor written (its
 * state unchanged) while the others were stepped; every pool buffer is back. Options of an
 * older caller's size (without before_fn): never called. Also: sub-groups made ready out of
 * order (a read-ahead given up and read again), the DeepSpeed schedule, a sub-group longer than
 * ZINF_STEP_CHUNK (called once, whole), failed reads (never called for their sub-group).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "common/util.h"
#include "offload/step_rig.h"
#include "zinf/blocks/offload.h"

#define N   2500
#define SGS 1000 /* sub-groups of 1000, 1000, 500 */
#define NSG 3

/* element i of part p of sub-group k at load (all exact in fp32; m, v: v >= 0) */
static float
val(uint32_t k, uint32_t p, uint64_t i)
{
	return (float)(k * 10 + p) + (float)(i % 97) * 0.125f;
}

struct seen {
	const float *want[NSG][3]; /* what the hook must see, per sub-group and part */
	int calls[NSG];
	uint64_t len[NSG];
	int mismatches;
	bool other_thread;
	pthread_t th;
	int fail_k; /* the sub-group whose call fails (-1: none) */
	int err;
};

static int
before_cb(void *ctx, uint32_t k, const void *const parts[], uint64_t len)
{
	struct seen *x = ctx;
	cr_assert_lt(k, NSG);
	x->calls[k]++;
	x->len[k] = len;
	x->other_thread |= !pthread_equal(pthread_self(), x->th);
	for (uint32_t p = 0; p < 3; p++) {
		if (memcmp(parts[p], x->want[k][p], len * 4) != 0) {
			x->mismatches++;
		}
	}
	return (int)k == x->fail_k ? x->err : 0;
}

static int
copy_cb(void *ctx, uint32_t k, const void *copy, uint64_t n)
{
	(void)ctx, (void)k, (void)copy, (void)n;
	return 0;
}

/* every part of every sub-group, read back from the tier */
static void
save_all(struct rig *r, float *out[NSG][3])
{
	for (uint32_t k = 0; k < NSG; k++) {
		void *const st[3] = {out[k][0], out[k][1], out[k][2]};
		cr_assert_eq(zinf_step_save(r->st, k, st), 0, "%s", zinf_last_error());
	}
}

static bool
same(float *a[3], float *b[3], uint64_t len)
{
	for (int p = 0; p < 3; p++) {
		if (memcmp(a[p], b[p], len * 4) != 0) {
			return false;
		}
	}
	return true;
}

static void
reset(struct seen *x, float *want[NSG][3])
{
	memset(x->calls, 0, sizeof(x->calls));
	memset(x->len, 0, sizeof(x->len));
	x->mismatches = 0;
	x->other_thread = false;
	x->th = pthread_self();
	for (uint32_t k = 0; k < NSG; k++) {
		for (uint32_t p = 0; p < 3; p++) {
			x->want[k][p] = want[k][p];
		}
	}
}

static void
before_tier(enum zinf_tier tier, bool with_copy)
{
	static struct seen x;
	memset(&x, 0, sizeof(x));
	x.fail_k = -1;
	struct rig_hooks h = {.before_fn = before_cb, .before_ctx = &x};
	if (with_copy) {
		h.copy_fn = copy_cb;
	}
	struct rig r;
	rig_init_hooks(&r, tier, N, SGS, &h);
	cr_assert_eq(zinf_step_sub_groups(r.st), NSG);
	float *v0[NSG][3], *v1[NSG][3], *v2[NSG][3], *v3[NSG][3];
	for (uint32_t k = 0; k < NSG; k++) {
		for (uint32_t p = 0; p < 3; p++) {
			v0[k][p] = malloc(SGS * 4);
			v1[k][p] = malloc(SGS * 4);
			v2[k][p] = malloc(SGS * 4);
			v3[k][p] = malloc(SGS * 4);
			for (uint64_t i = 0; i < SGS; i++) {
				v0[k][p][i] = val(k, p, i);
			}
		}
		const void *const st[3] = {v0[k][0], v0[k][1], v0[k][2]};
		cr_assert_eq(zinf_step_load(r.st, k, st), 0, "%s", zinf_last_error());
	}
	float *g = calloc(N, sizeof(float));
	for (uint64_t i = 0; i < N; i++) {
		g[i] = (float)((int)(i * 13 % 23) - 11) / 8.0f;
	}
	const float *gk[NSG] = {g, g + SGS, g + 2 * SGS};

	/* step 1, in reverse: the hook sees the loaded values, once each, on this thread */
	reset(&x, v0);
	cr_assert_eq(zinf_step_begin(r.st, 1, 1.0f, NULL, true), 0, "%s", zinf_last_error());
	for (int k = NSG - 1; k >= 0; k--) {
		cr_assert_eq(zinf_step_ready(r.st, (uint32_t)k, gk[k], ZINF_F32), 0, "%s",
			     zinf_last_error());
	}
	cr_assert_eq(zinf_step_finish(r.st), 0, "%s", zinf_last_error());
	cr_assert_eq(x.mismatches, 0, "the hook saw other values than those loaded");
	cr_assert_not(x.other_thread, "the hook ran on another thread");
	for (uint32_t k = 0; k < NSG; k++) {
		cr_assert_eq(x.calls[k], 1, "sub-group %u: %d calls", k, x.calls[k]);
		cr_assert_eq(x.len[k], k < 2 ? 1000u : 500u, "sub-group %u", k);
	}
	save_all(&r, v1);
	for (uint32_t k = 0; k < NSG; k++) {
		cr_assert_not(same(v0[k], v1[k], zinf_step_sub_group_len(r.st, k)),
			      "sub-group %u was not stepped", k);
	}

	/* step 2, sub-group 1 left out: the hook sees step 1's state of 0 and 2, never 1 */
	reset(&x, v1);
	cr_assert_eq(zinf_step_begin(r.st, 2, 1.0f, NULL, false), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_step_ready(r.st, 0, gk[0], ZINF_F32), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_step_skip(r.st, 1), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_step_ready(r.st, 2, gk[2], ZINF_F32), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_step_finish(r.st), 0, "%s", zinf_last_error());
	cr_assert_eq(x.mismatches, 0, "the hook saw other values than the tier held");
	cr_assert_eq(x.calls[0], 1);
	cr_assert_eq(x.calls[1], 0, "called for a sub-group left out");
	cr_assert_eq(x.calls[2], 1);
	save_all(&r, v2);
	cr_assert(same(v1[1], v2[1], SGS), "the sub-group left out changed");
	cr_assert_not(same(v1[0], v2[0], SGS));

	/* step 3, the hook fails on sub-group 1: k's step fails, named; 1 neither stepped nor
	   written */
	reset(&x, v2);
	x.fail_k = 1;
	x.err = -ECANCELED;
	cr_assert_eq(zinf_step_begin(r.st, 3, 1.0f, NULL, false), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_step_ready(r.st, 0, gk[0], ZINF_F32), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_step_ready(r.st, 1, gk[1], ZINF_F32), -ECANCELED);
	const char *msg = zinf_last_error();
	cr_assert(strstr(msg, "sub-group 1 ") && strstr(msg, "before_fn"), "message: %s", msg);
	cr_assert_eq(zinf_step_ready(r.st, 2, gk[2], ZINF_F32), -ECANCELED); /* failed already */
	cr_assert_eq(zinf_step_finish(r.st), -ECANCELED);
	msg = zinf_last_error();
	cr_assert(strstr(msg, "sub-group 1 ") && strstr(msg, "before_fn"), "message: %s", msg);
	cr_assert_eq(x.calls[1], 1);
	cr_assert_eq(x.calls[2], 0, "called after the step failed");
	save_all(&r, v3);
	cr_assert(same(v2[1], v3[1], SGS), "sub-group 1 was stepped or written");
	cr_assert(same(v2[2], v3[2], 500), "sub-group 2 was stepped after the failure");
	cr_assert_not(same(v2[0], v3[0], SGS), "sub-group 0, before the failure, was not stepped");
	cr_assert_eq(zinf_step_sub_group_written(r.st, 0), 3);
	cr_assert_neq(zinf_step_sub_group_written(r.st, 1), 3);

	/* a positive return is a failure too (-EINVAL), named the same way */
	reset(&x, v3);
	x.fail_k = 0;
	x.err = 5;
	cr_assert_eq(zinf_step_begin(r.st, 3, 1.0f, NULL, false), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_step_ready(r.st, 0, gk[0], ZINF_F32), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "sub-group 0 "), "message: %s", zinf_last_error());
	cr_assert_eq(zinf_step_finish(r.st), -EINVAL);
	free(g);
	for (uint32_t k = 0; k < NSG; k++) {
		for (uint32_t p = 0; p < 3; p++) {
			free(v0[k][p]), free(v1[k][p]), free(v2[k][p]), free(v3[k][p]);
		}
	}
	rig_fini(&r);
}

/* An older caller's options (size up to copy_ctx): before_fn is beyond them, never called. */
Test(step_before, older_options_no_hook)
{
	static struct seen x;
	memset(&x, 0, sizeof(x));
	x.fail_k = 0;
	x.err = -ECANCELED; /* would fail the step if it were called */
	struct rig_hooks h = {.before_fn = before_cb, .before_ctx = &x, .before_size = true};
	struct rig r;
	rig_init_hooks(&r, ZINF_TIER_NVME, N, SGS, &h);
	for (uint32_t k = 0; k < NSG; k++) {
		cr_assert_eq(zinf_step_load(r.st, k, NULL), 0, "%s", zinf_last_error());
	}
	float *g = calloc(N, sizeof(float));
	cr_assert_eq(zinf_step_run(r.st, 1, 1.0f, g, ZINF_F32, NULL), 0, "%s", zinf_last_error());
	for (uint32_t k = 0; k < NSG; k++) {
		cr_assert_eq(x.calls[k], 0, "sub-group %u: called", k);
	}
	free(g);
	rig_fini(&r);
}

Test(step_before, nvme_tier)
{
	before_tier(ZINF_TIER_NVME, false);
}

Test(step_before, nvme_tier_copy_fn)
{
	before_tier(ZINF_TIER_NVME, true);
}

Test(step_before, cpu_tier_in_place)
{
	before_tier(ZINF_TIER_CPU, false);
}

Test(step_before, cpu_tier_copy_fn)
{
	before_tier(ZINF_TIER_CPU, true);
}

/* copy_fn's return, as before_fn's: a positive value is no success (-EINVAL), named */
static int copy_ret;

static int
copy_ret_cb(void *ctx, uint32_t k, const void *copy, uint64_t n)
{
	(void)ctx, (void)copy, (void)n;
	return k == 1 ? copy_ret : 0;
}

Test(step_before, copy_fn_positive_return_fails)
{
	for (int i = 0; i < 2; i++) {
		copy_ret = i == 0 ? 7 : -ECANCELED;
		struct rig_hooks h = {.copy_fn = copy_ret_cb};
		struct rig r;
		rig_init_hooks(&r, ZINF_TIER_NVME, N, SGS, &h);
		for (uint32_t k = 0; k < NSG; k++) {
			cr_assert_eq(zinf_step_load(r.st, k, NULL), 0, "%s", zinf_last_error());
		}
		float *g = calloc(N, sizeof(float));
		cr_assert_not_null(g);
		int want = i == 0 ? -EINVAL : -ECANCELED;
		int rc = zinf_step_run(r.st, 1, 1.0f, g, ZINF_F32, NULL);
		cr_assert_eq(rc, want, "copy_fn returned %d: the step returned %d", copy_ret, rc);
		const char *msg = zinf_last_error();
		cr_assert(strstr(msg, "sub-group 1 ") && strstr(msg, "copy_fn"), "message: %s",
			  msg);
		free(g);
		rig_fini(&r);
	}
}

/* ---- the read-ahead given up, the DeepSpeed schedule, a sub-group cut into chunks ---- */

struct seen2 {
	float *want[2][NSG][3]; /* [sub-groups of up to NSG][part], per rig (0: under test) */
	int calls[NSG];
	uint64_t len[NSG];
	int mismatches;
};

static int
before_cb2(void *ctx, uint32_t k, const void *const parts[], uint64_t len)
{
	struct seen2 *x = ctx;
	cr_assert_lt(k, NSG);
	x->calls[k]++;
	x->len[k] = len;
	for (uint32_t p = 0; p < 3; p++) {
		if (memcmp(parts[p], x->want[0][k][p], len * 4) != 0) {
			x->mismatches++;
		}
	}
	return 0;
}

/*
 * Sub-groups made ready out of order (2, 0, 1) with two buffers: begin reads 0 and 1 ahead, 2
 * finds every slot holding a sub-group not ready and gives up the read of 1 (read again when
 * its turn comes). The hook sees each sub-group's loaded state once, whole, and the state after
 * the step equals the CPU tier's after the same step (same kernel on the same values), bit for
 * bit. Pipelined and DeepSpeed schedules.
 */
static void
out_of_order(bool deepspeed)
{
	static struct seen2 x;
	memset(&x, 0, sizeof(x));
	struct rig_hooks h = {.before_fn = before_cb2, .before_ctx = &x, .deepspeed = deepspeed};
	struct rig r, c;
	rig_init_hooks(&r, ZINF_TIER_NVME, N, SGS, &h);
	rig_init(&c, ZINF_TIER_CPU, N, SGS);
	float *v[NSG][3], *a[NSG][3], *b[NSG][3];
	for (uint32_t k = 0; k < NSG; k++) {
		for (uint32_t p = 0; p < 3; p++) {
			v[k][p] = malloc(SGS * 4);
			a[k][p] = malloc(SGS * 4);
			b[k][p] = malloc(SGS * 4);
			for (uint64_t i = 0; i < SGS; i++) {
				v[k][p][i] = val(k, p, i);
			}
			x.want[0][k][p] = v[k][p];
		}
		const void *const st[3] = {v[k][0], v[k][1], v[k][2]};
		cr_assert_eq(zinf_step_load(r.st, k, st), 0, "%s", zinf_last_error());
		cr_assert_eq(zinf_step_load(c.st, k, st), 0, "%s", zinf_last_error());
	}
	float *g = calloc(N, sizeof(float));
	for (uint64_t i = 0; i < N; i++) {
		g[i] = (float)((int)(i * 7 % 19) - 9) / 4.0f;
	}
	const uint32_t order[NSG] = {2, 0, 1};
	cr_assert_eq(zinf_step_begin(r.st, 1, 1.0f, NULL, false), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_step_begin(c.st, 1, 1.0f, NULL, false), 0, "%s", zinf_last_error());
	for (int i = 0; i < NSG; i++) {
		uint32_t k = order[i];
		cr_assert_eq(zinf_step_ready(r.st, k, g + k * SGS, ZINF_F32), 0, "%s",
			     zinf_last_error());
		cr_assert_eq(zinf_step_ready(c.st, k, g + k * SGS, ZINF_F32), 0, "%s",
			     zinf_last_error());
	}
	cr_assert_eq(zinf_step_finish(r.st), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_step_finish(c.st), 0, "%s", zinf_last_error());
	struct zinf_step_stats ss = {.size = sizeof(ss)};
	cr_assert_eq(zinf_step_get_stats(r.st, &ss), 0);
	/* pipelined: 0, 1 read ahead, 1's read given up for 2, read again (12 bytes an element);
	   DeepSpeed: one read ahead (0), a free slot for 2, nothing read twice */
	cr_assert_eq(ss.read_bytes, (uint64_t)(deepspeed ? N : N + SGS) * 12, "%llu bytes read",
		     (unsigned long long)ss.read_bytes);
	cr_assert_eq(x.mismatches, 0, "the hook saw other values than those loaded");
	for (uint32_t k = 0; k < NSG; k++) {
		cr_assert_eq(x.calls[k], 1, "sub-group %u: %d calls", k, x.calls[k]);
		cr_assert_eq(x.len[k], zinf_step_sub_group_len(r.st, k));
	}
	save_all(&r, a);
	save_all(&c, b);
	for (uint32_t k = 0; k < NSG; k++) {
		cr_assert(same(a[k], b[k], zinf_step_sub_group_len(r.st, k)),
			  "sub-group %u: NVMe and CPU tier differ", k);
		cr_assert_not(same(a[k], v[k], zinf_step_sub_group_len(r.st, k)));
	}
	free(g);
	for (uint32_t k = 0; k < NSG; k++) {
		for (uint32_t p = 0; p < 3; p++) {
			free(v[k][p]), free(a[k][p]), free(b[k][p]);
		}
	}
	rig_fini(&c);
	rig_fini(&r);
}

Test(step_before, out_of_order_pipelined)
{
	out_of_order(false);
}

Test(step_before, out_of_order_deepspeed)
{
	out_of_order(true);
}

/*
 * A sub-group longer than ZINF_STEP_CHUNK (the optimizer runs over it in two chunks): the hook
 * is called once for it, with all of its elements, every one as loaded (the second chunk's
 * too: not called between chunks, after the first one ran). NVMe and the CPU tier.
 */
static void
chunked(enum zinf_tier tier)
{
	const uint64_t big = (uint64_t)ZINF_STEP_CHUNK + 1000, n = big + 500;
	static struct seen2 x;
	memset(&x, 0, sizeof(x));
	struct rig_hooks h = {.before_fn = before_cb2, .before_ctx = &x};
	struct rig r;
	rig_init_hooks(&r, tier, n, big, &h);
	cr_assert_eq(zinf_step_sub_groups(r.st), 2);
	for (uint32_t k = 0; k < 2; k++) {
		uint64_t len = zinf_step_sub_group_len(r.st, k);
		for (uint32_t p = 0; p < 3; p++) {
			x.want[0][k][p] = malloc(len * 4);
			for (uint64_t i = 0; i < len; i++) {
				x.want[0][k][p][i] = val(k, p, i);
			}
		}
		const void *const st[3] = {x.want[0][k][0], x.want[0][k][1], x.want[0][k][2]};
		cr_assert_eq(zinf_step_load(r.st, k, st), 0, "%s", zinf_last_error());
	}
	float *g = malloc(n * sizeof(float));
	for (uint64_t i = 0; i < n; i++) {
		g[i] = 0.5f;
	}
	cr_assert_eq(zinf_step_run(r.st, 1, 1.0f, g, ZINF_F32, NULL), 0, "%s", zinf_last_error());
	cr_assert_eq(x.mismatches, 0, "the hook saw other values than those loaded");
	cr_assert_eq(x.calls[0], 1, "%d calls for the chunked sub-group", x.calls[0]);
	cr_assert_eq(x.len[0], big);
	cr_assert_eq(x.calls[1], 1);
	cr_assert_eq(x.len[1], 500);
	free(g);
	for (uint32_t k = 0; k < 2; k++) {
		for (uint32_t p = 0; p < 3; p++) {
			free(x.want[0][k][p]);
		}
	}
	rig_fini(&r);
}

Test(step_before, chunked_nvme)
{
	chunked(ZINF_TIER_NVME);
}

Test(step_before, chunked_cpu)
{
	chunked(ZINF_TIER_CPU);
}

/*
 * A failed read (the "fault" I/O backend, EIO from sub-group 1's first block on): the hook is
 * called for 0 (read before the fault), never for 1 (its read failed) nor for 2 (the step
 * failed already); ready(1) and finish return -EIO naming sub-group 1's read; 1 and 2 are
 * neither stepped nor written, 0 is. The DeepSpeed schedule reads 1 only once 0 is in, so the
 * fault lands on 1 whatever the I/O threads' order. Then every read failing: the hook is never
 * called, on either schedule.
 */
static void
failed_read(bool deepspeed)
{
	static struct seen x;
	memset(&x, 0, sizeof(x));
	x.fail_k = -1;
	struct rig_hooks h = {
		.before_fn = before_cb, .before_ctx = &x, .deepspeed = deepspeed, .fault = true};
	struct rig r;
	rig_init_hooks(&r, ZINF_TIER_NVME, N, SGS, &h);
	float *v[NSG][3], *a[NSG][3];
	for (uint32_t k = 0; k < NSG; k++) {
		for (uint32_t p = 0; p < 3; p++) {
			v[k][p] = malloc(SGS * 4);
			a[k][p] = malloc(SGS * 4);
			for (uint64_t i = 0; i < SGS; i++) {
				v[k][p][i] = val(k, p, i);
			}
		}
		const void *const st[3] = {v[k][0], v[k][1], v[k][2]};
		cr_assert_eq(zinf_step_load(r.st, k, st), 0, "%s", zinf_last_error());
	}
	/* block reads of one sub-group of SGS elements (its three parts) */
	uint64_t b0 = zinf_io_fault_ops(r.io, ZINF_IO_READ);
	save_all(&r, a);
	uint64_t per_sg = (zinf_io_fault_ops(r.io, ZINF_IO_READ) - b0) / NSG;
	cr_assert_gt(per_sg, 0);
	float *g = calloc(N, sizeof(float));
	for (uint64_t i = 0; i < N; i++) {
		g[i] = 0.25f;
	}
	if (deepspeed) {
		reset(&x, v);
		struct zinf_io_fault f = {.kind = ZINF_IO_FAULT_FAIL,
					  .op = ZINF_IO_READ,
					  .nth = per_sg + 1,
					  .err = EIO};
		cr_assert_eq(zinf_io_fault_add(r.io, &f), 0, "%s", zinf_last_error());
		cr_assert_eq(zinf_step_begin(r.st, 1, 1.0f, NULL, false), 0, "%s",
			     zinf_last_error());
		cr_assert_eq(zinf_step_ready(r.st, 0, g, ZINF_F32), 0, "%s", zinf_last_error());
		cr_assert_eq(zinf_step_ready(r.st, 1, g + SGS, ZINF_F32), -EIO);
		const char *m = zinf_last_error();
		cr_assert(strstr(m, "sub-group 1 ") && strstr(m, "read of "), "message: %s", m);
		cr_assert_eq(zinf_step_ready(r.st, 2, g + 2 * SGS, ZINF_F32), -EIO);
		cr_assert_eq(zinf_step_finish(r.st), -EIO);
		cr_assert_eq(x.mismatches, 0);
		cr_assert_eq(x.calls[0], 1);
		cr_assert_eq(x.calls[1], 0, "called for a sub-group whose read failed");
		cr_assert_eq(x.calls[2], 0, "called after the step failed");
		save_all(&r, a);
		cr_assert_not(same(a[0], v[0], SGS), "sub-group 0 was not stepped");
		cr_assert(same(a[1], v[1], SGS), "sub-group 1 was stepped or written");
		cr_assert(same(a[2], v[2], 500), "sub-group 2 was stepped or written");
	}
	/* every read of the step fails (as many as it may issue: every slot's) */
	reset(&x, v);
	struct zinf_io_fault f = {.kind = ZINF_IO_FAULT_FAIL,
				  .op = ZINF_IO_READ,
				  .nth = 1,
				  .count = 2 * per_sg,
				  .err = EIO};
	cr_assert_eq(zinf_io_fault_add(r.io, &f), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_step_begin(r.st, 2, 1.0f, NULL, false), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_step_ready(r.st, 0, g, ZINF_F32), -EIO);
	cr_assert(strstr(zinf_last_error(), "sub-group 0 "), "message: %s", zinf_last_error());
	cr_assert_eq(zinf_step_finish(r.st), -EIO);
	for (uint32_t k = 0; k < NSG; k++) {
		cr_assert_eq(x.calls[k], 0, "sub-group %u: called, its read failed", k);
	}
	free(g);
	for (uint32_t k = 0; k < NSG; k++) {
		for (uint32_t p = 0; p < 3; p++) {
			free(v[k][p]), free(a[k][p]);
		}
	}
	rig_fini(&r);
}

Test(step_before, failed_read_pipelined)
{
	failed_read(false);
}

Test(step_before, failed_read_deepspeed)
{
	failed_read(true);
}
