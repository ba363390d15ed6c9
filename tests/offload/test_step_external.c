/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/offload/test_step_external.c: zinf_step_opts.external_parts and fill_fn, the shape of
 * the engine's bf16 master shared with the 16-bit parameters. AdamW with a bf16 master and a bf16
 * copy (the kernel's copy is the master's bits): the external step keeps part 0 in the caller's
 * array (filled from it, written back to it by copy_fn), the reference step keeps it in its swap
 * space. Several steps of random gradients must give the same master, m and v bit for bit, the
 * swap files must hold only m and v, and the step's statistics count only their bytes (worked by
 * hand). Also save, visit and load, the refusals, and a failing fill_fn.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "common/util.h"
#include "offload/step_rig.h" /* struct rig, rig_fini */
#include "zinf/blocks/offload.h"
#include "zinf/blocks/optimizer.h"

#define N   3000u /* elements */
#define SGS 1000  /* per sub-group: 3 sub-groups */

struct keeper {
	uint16_t master[N]; /* bf16: the external part 0, as the engine's parameter home */
	int fills, fail_at; /* fill_fn calls; fail the fill_at-th (1-based), 0: never */
	uint32_t last_part;
};

static int
fill(void *ctx, uint32_t k, uint32_t part, void *buf, uint64_t len)
{
	struct keeper *kp = ctx;
	kp->fills++;
	kp->last_part = part;
	if (kp->fail_at && kp->fills == kp->fail_at) {
		return -EIO;
	}
	memcpy(buf, kp->master + (uint64_t)k * SGS, len * 2);
	return 0;
}

static int
copy_back(void *ctx, uint32_t k, const void *copy, uint64_t n)
{
	struct keeper *kp = ctx;
	if (kp) {
		memcpy(kp->master + (uint64_t)k * SGS, copy, n * 2);
	}
	return 0;
}

static void
ext_rig_open(struct rig *r, struct keeper *kp, enum zinf_step_schedule sched)
{
	memset(r, 0, sizeof(*r));
	swap_rig_open(0, false, &r->dir, &r->io, &r->swap);
	struct zinf_optimizer_opts oo;
	zinf_optimizer_opts_init(&oo, ZINF_OPTIM_ADAMW);
	oo.lr = 0.01f;
	oo.weight_decay = 0.01f;
	oo.master_dtype = ZINF_BF16;
	cr_assert_eq(zinf_optimizer_create(&oo, &r->opt), 0, "%s", zinf_last_error());
	struct zinf_step_opts so;
	zinf_step_opts_init(&so);
	so.n = N;
	so.sub_group_size = SGS;
	so.swap = r->swap;
	so.optimizer = r->opt;
	so.copy_dtype = ZINF_BF16;
	so.schedule = sched;
	so.copy_fn = copy_back;
	so.copy_ctx = kp;
	if (kp) {
		so.external_parts = 1u; /* the master */
		so.fill_fn = fill;
		so.fill_ctx = kp;
	}
	struct zinf_pool_opts po;
	zinf_pool_opts_init(&po);
	po.buffer_bytes = zinf_step_buffer_bytes(&so, zinf_swap_align(r->swap));
	po.buffer_count = 2;
	po.io = r->io;
	cr_assert_eq(zinf_pool_create(&po, &r->pool), 0, "%s", zinf_last_error());
	so.pool = r->pool;
	cr_assert_eq(zinf_step_create(&so, &r->st), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_swap_reserve(r->swap), 0, "%s", zinf_last_error());
}

/* Random bf16 masters in [-1, 1) (finite, low bits dropped) and fp32 gradients. */
static void
rand_master(uint16_t *m, uint64_t *seed)
{
	for (uint32_t i = 0; i < N; i++) {
		float f = (float)zt_uniform(seed, -1.0, 1.0);
		uint32_t u;
		memcpy(&u, &f, 4);
		m[i] = (uint16_t)(u >> 16);
	}
}

static void
rand_grad(float *g, uint64_t *seed)
{
	for (uint32_t i = 0; i < N; i++) {
		g[i] = (float)zt_uniform(seed, -0.5, 0.5);
	}
}

/* Part p of every sub-group through zinf_step_save (bf16 master: 2 bytes, m and v: 4). */
static void
save_part(struct zinf_step *st, uint32_t p, void *out)
{
	size_t b = p == 0 ? 2 : 4;
	for (uint32_t k = 0; k < N / SGS; k++) {
		void *arr[ZINF_OPTIM_MAX_PARTS] = {NULL};
		arr[p] = (char *)out + (size_t)k * SGS * b;
		cr_assert_eq(zinf_step_save(st, k, arr), 0, "%s", zinf_last_error());
	}
}

static void
same_state_after_steps(enum zinf_step_schedule sched)
{
	uint64_t seed = zt_seed();
	static struct keeper kp;
	memset(&kp, 0, sizeof(kp));
	struct rig ext, ref;
	ext_rig_open(&ext, &kp, sched);
	ext_rig_open(&ref, NULL, sched);
	rand_master(kp.master, &seed);
	static uint16_t init[N];
	memcpy(init, kp.master, sizeof(init));
	for (uint32_t k = 0; k < N / SGS; k++) {
		const void *st[ZINF_OPTIM_MAX_PARTS] = {kp.master + (size_t)k * SGS};
		cr_assert_eq(zinf_step_load(ref.st, k, st), 0, "%s", zinf_last_error());
		cr_assert_eq(zinf_step_load(ext.st, k, st), 0, "%s", zinf_last_error());
	}
	/* the master is no swap tensor of the external step */
	cr_assert_eq(zinf_step_swap_id(ext.st, 0, 0), -ENOENT);
	cr_assert_geq(zinf_step_swap_id(ext.st, 0, 1), 0);
	cr_assert_geq(zinf_step_swap_id(ref.st, 0, 0), 0);
	struct zinf_step_part_info pi = {.size = sizeof(pi)};
	cr_assert_eq(zinf_step_part_info(ext.st, 0, &pi), 0);
	cr_assert(pi.external && pi.swap == NULL);
	cr_assert_eq(zinf_step_part_info(ext.st, 1, &pi), 0);
	cr_assert(!pi.external && pi.swap != NULL);
	static float g[N];
	for (int64_t t = 1; t <= 4; t++) {
		rand_grad(g, &seed);
		kp.fills = 0;
		cr_assert_eq(zinf_step_run(ref.st, t, 0.5f, g, ZINF_F32, NULL), 0, "%s",
			     zinf_last_error());
		cr_assert_eq(zinf_step_run(ext.st, t, 0.5f, g, ZINF_F32, NULL), 0, "%s",
			     zinf_last_error());
		cr_assert_eq(kp.fills, N / SGS, "one fill per sub-group, not %d", kp.fills);
		cr_assert_eq(kp.last_part, 0u);
		struct zinf_step_stats a = {.size = sizeof(a)}, b = {.size = sizeof(b)};
		cr_assert_eq(zinf_step_get_stats(ext.st, &a), 0);
		cr_assert_eq(zinf_step_get_stats(ref.st, &b), 0);
		/* by hand: m and v, 4 bytes each, of 3000 elements; the reference 2 more (the
		   bf16 master) */
		cr_assert_eq(a.read_bytes, (uint64_t)N * 8, "read %" PRIu64, a.read_bytes);
		cr_assert_eq(a.write_bytes, (uint64_t)N * 8, "written %" PRIu64, a.write_bytes);
		cr_assert_eq(b.read_bytes, (uint64_t)N * 10);
		cr_assert_eq(b.write_bytes, (uint64_t)N * 10);
	}
	static uint16_t m_ref[N], m_ext[N];
	static float mo_ref[N], mo_ext[N];
	save_part(ref.st, 0, m_ref);
	kp.fills = 0;
	save_part(ext.st, 0, m_ext); /* the external part through fill_fn */
	cr_assert_eq(kp.fills, N / SGS);
	cr_assert(!memcmp(m_ref, kp.master, sizeof(m_ref)), "the masters differ");
	cr_assert(!memcmp(m_ext, kp.master, sizeof(m_ext)), "save did not fill the master");
	for (uint32_t p = 1; p < 3; p++) {
		save_part(ref.st, p, mo_ref);
		save_part(ext.st, p, mo_ext);
		cr_assert(!memcmp(mo_ref, mo_ext, sizeof(mo_ref)), "part %u differs", p);
	}
	/* the masters moved: a step that lost its update would pass the comparisons above */
	int moved = 0;
	for (uint32_t i = 0; i < N; i++) {
		moved += m_ref[i] != init[i];
	}
	cr_assert_gt(moved, (int)N / 2, "%d of %u masters did not move", (int)N - moved, N);
	rig_fini(&ext);
	rig_fini(&ref);
}

Test(step_external, same_bits_as_the_master_in_the_swap_pipelined)
{
	same_state_after_steps(ZINF_SCHEDULE_PIPELINED);
}

Test(step_external, same_bits_as_the_master_in_the_swap_deepspeed)
{
	same_state_after_steps(ZINF_SCHEDULE_DEEPSPEED);
}

struct visit_ctx {
	int calls;
	uint16_t seen0[SGS];
};

static int
visit_read(void *ctx, uint32_t k, void *const parts[], uint64_t len)
{
	struct visit_ctx *v = ctx;
	(void)k;
	v->calls++;
	memcpy(v->seen0, parts[0], len * 2);
	return 0;
}

static int
visit_write(void *ctx, uint32_t k, void *const parts[], uint64_t len)
{
	(void)ctx, (void)k;
	memset(parts[0], 0x7f, len * 2); /* not written anywhere: part 0 is the keeper's */
	memset(parts[1], 0, len * 4);
	memset(parts[2], 0, len * 4);
	return 0;
}

/* visit READ fills the external part before fn; WRITE does not write it (nor fill it); load of
 * an external part leaves the keeper's values. */
Test(step_external, visit_fills_and_never_writes_the_external_part)
{
	uint64_t seed = zt_seed();
	static struct keeper kp;
	memset(&kp, 0, sizeof(kp));
	struct rig r;
	ext_rig_open(&r, &kp, ZINF_SCHEDULE_PIPELINED);
	rand_master(kp.master, &seed);
	static uint16_t before[N];
	memcpy(before, kp.master, sizeof(before));
	cr_assert_eq(zinf_step_load(r.st, 1, NULL), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_step_visit(r.st, 1, ZINF_STEP_VISIT_WRITE, visit_write, NULL), 0, "%s",
		     zinf_last_error());
	cr_assert_eq(kp.fills, 0, "a write visit filled");
	cr_assert(!memcmp(before, kp.master, sizeof(before)), "the keeper's master changed");
	struct visit_ctx v = {0};
	cr_assert_eq(zinf_step_visit(r.st, 1, ZINF_STEP_VISIT_READ, visit_read, &v), 0, "%s",
		     zinf_last_error());
	cr_assert_eq(v.calls, 1);
	cr_assert_eq(kp.fills, 1);
	cr_assert(!memcmp(v.seen0, kp.master + SGS, sizeof(v.seen0)), "not the keeper's master");
	rig_fini(&r);
}

/* A fill_fn that fails fails the step (naming fill_fn and the sub-group), nothing of that
 * sub-group is written, and every buffer comes back. */
Test(step_external, failing_fill_fails_the_step_naming_it)
{
	uint64_t seed = zt_seed();
	static struct keeper kp;
	memset(&kp, 0, sizeof(kp));
	struct rig r;
	ext_rig_open(&r, &kp, ZINF_SCHEDULE_PIPELINED);
	rand_master(kp.master, &seed);
	for (uint32_t k = 0; k < N / SGS; k++) {
		cr_assert_eq(zinf_step_load(r.st, k, NULL), 0, "%s", zinf_last_error());
	}
	static float g[N];
	rand_grad(g, &seed);
	kp.fail_at = 2;
	cr_assert_eq(zinf_step_run(r.st, 1, 1.0f, g, ZINF_F32, NULL), -EIO);
	cr_assert(strstr(zinf_last_error(), "sub-group 1") && strstr(zinf_last_error(), "fill_fn"),
		  "%s", zinf_last_error());
	cr_assert_eq(zinf_step_sub_group_written(r.st, 0), 1);
	cr_assert_eq(zinf_step_sub_group_written(r.st, 1), 0);
	rig_fini(&r);
}

/* Refused at create, named: on the CPU tier, without fill_fn, a bit past the parts. */
Test(step_external, refusals_name_the_problem)
{
	struct rig r;
	static struct keeper kp;
	ext_rig_open(&r, &kp, ZINF_SCHEDULE_PIPELINED);
	static const struct {
		enum zinf_tier tier;
		uint32_t mask;
		bool fill;
		const char *msg;
	} bad[] = {
		{ZINF_TIER_CPU, 1u, true, "only with the state on NVMe"},
		{ZINF_TIER_NVME, 1u, false, "needs a fill_fn"},
		{ZINF_TIER_NVME, 8u, true, "names a part the optimizer lacks"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct zinf_step_opts so;
		zinf_step_opts_init(&so);
		so.n = N;
		so.sub_group_size = SGS;
		so.tier = bad[i].tier;
		so.swap = r.swap;
		so.pool = r.pool;
		so.optimizer = r.opt;
		so.copy_dtype = ZINF_BF16;
		so.external_parts = bad[i].mask;
		so.fill_fn = bad[i].fill ? fill : NULL;
		struct zinf_step *st = NULL;
		cr_assert_eq(zinf_step_create(&so, &st), -EINVAL, "case %zu", i);
		cr_assert(strstr(zinf_last_error(), bad[i].msg), "case %zu: %s", i,
			  zinf_last_error());
	}
	rig_fini(&r);
}
