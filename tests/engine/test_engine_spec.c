/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/test_engine_spec.c: the speculative step during backward with roll-back
 * (engine/engine_spec.c), one process (comm "single", device "host" with asynchronous
 * streams). Two engines train the same model in lockstep, 20 steps of two micro-batches with
 * fp16 dynamic loss scaling and gradient clipping: one with step_during_backward (it speculates),
 * one without (the step waits for the norm). The gradients are chosen by the test (dyadic, so
 * that the fp32 accumulation is exact) with a magnitude per step: the global norm is about 40
 * on "plain" steps, under the clipping threshold 80, and about 160 on "clip" steps; on
 * "overflow" steps one gradient element is +infinity (the step is skipped). After every step the
 * two engines must agree bit for bit: the return value, the fp32 master weights
 * (zinf_engine_read_master), the 16-bit parameters the trainer reads (fetched), a loss computed
 * from them, the loss scale and the norm. The speculating engine must have stepped sub-groups
 * during backward at every boundary, and rolled back none of them on plain steps and all of
 * them on clip and overflow steps; the other none. For optimizer tiers none, cpu and nvme,
 * stages 1-3 and the parameter tiers of stage 3; bf16 parameters and state (stochastic
 * rounding) with clipping alone; and with a reserve of one sub-group (the others wait for the
 * norm). Not here: several ranks (test_engine_ranks.c's "spec" case).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "zinf/engine.h"
#include "engine/test_model.h"

#include "engine/spec_model.h"

struct cfg {
	int stage;
	enum zinf_offload_device opt, param;
	uint32_t buffers; /* offload_optimizer.buffer_count: the reserve's slots */
	bool bf16;	  /* bf16 parameters and optimizer state (stochastic rounding), clipping
			     without fp16: no overflow step (those are plain) */
	double clip;	  /* nonzero: gradient_clipping instead of CLIP (negative: none) */
	bool q8;	  /* 8-bit blockwise m and v (ZINF_STATE_Q8; with bf16: bf16 parameters) */
	bool bf16m;	  /* a bf16 master weight (optimizer.master_dtype) */
};

static void
make_opts(struct zinf_engine_opts *o, const struct cfg *c, const char *dir, bool spec)
{
	spec_model_opts(o, c->stage, c->opt, c->param, c->buffers, dir, ZINF_OPTIM_ADAMW);
	o->optimizer.state_format = c->q8 ? ZINF_STATE_Q8 : ZINF_STATE_PLAIN;
	o->optimizer.master_dtype = c->bf16m ? ZINF_BF16 : ZINF_F32;
	if (c->bf16) {
		o->dtype = ZINF_BF16;
		o->optimizer.state_dtype = c->q8 ? ZINF_F32 : ZINF_BF16;
		o->optimizer.rounding = ZINF_ROUND_STOCHASTIC;
		o->gradient_clipping = c->clip > 0 ? c->clip : c->clip < 0 ? 0 : CLIP;
		o->step_during_backward = spec;
		o->swap_prefix = "espec";
		return;
	}
	o->dtype = ZINF_F16;
	o->fp16.enabled = true;
	o->fp16.initial_scale_power = 8;
	o->fp16.hysteresis = 2;
	o->fp16.loss_scale_window = 3;
	o->fp16.min_loss_scale = 1;
	o->gradient_clipping = CLIP;
	o->step_during_backward = spec;
	o->swap_prefix = "espec";
}

static void
model_make(struct model *m, const struct cfg *c, bool spec)
{
	m->dir = c->opt == ZINF_OFFLOAD_NVME || c->param == ZINF_OFFLOAD_NVME ? zt_mkdtemp(NULL)
									      : NULL;
	struct zinf_engine_opts o;
	make_opts(&o, c, m->dir, spec);
	spec_model_create(m, &o);
}

/* One micro-batch (spec_passes: forward and backward), then zinf_engine_step. */
static int
micro(struct model *m, int s, int mi, double factor, bool inf, struct seen *out)
{
	spec_passes(m->e, m->gdev, out->p16, s, mi, factor, inf);
	return zinf_engine_step(m->e);
}

static void
train_step(struct model *m, const struct cfg *c, int s, struct seen *out)
{
	enum kind k = c->bf16 && kind_of(s) == OVERFLOW ? PLAIN : kind_of(s);
	double factor = k == CLIPPED ? 4.0 : 1.0;
	int rc = micro(m, s, 0, factor, k == OVERFLOW, out);
	cr_assert_eq(rc, 0, "step %d micro 0: %d %s", s, rc, zinf_last_error());
	out->rc = micro(m, s, 1, factor, false, out);
	cr_assert(out->rc == 1 || out->rc == 2, "step %d micro 1: %d %s", s, out->rc,
		  zinf_last_error());
	spec_record(m, out, c->bf16);
}

static void
compare_runs(const struct cfg *c)
{
	static struct seen a, b;
	struct model ms = {0}, mn = {0};
	model_make(&ms, c, true);
	model_make(&mn, c, false);
	uint32_t spec_steps = 0, rolled = 0, rolled_clip = 0, rolled_skip = 0;
	for (int s = 0; s < STEPS; s++) {
		enum kind k = c->bf16 && kind_of(s) == OVERFLOW ? PLAIN : kind_of(s);
		train_step(&ms, c, s, &a);
		train_step(&mn, c, s, &b);
		spec_expect_same(&a, &b, s, k);
		/* the speculation happened, and was rolled back exactly when it had to */
		cr_assert_gt(a.st.stepped_during_backward, 0, "step %d: nothing speculated", s);
		cr_assert_leq(a.st.stepped_during_backward, c->buffers, "step %d: reserve of %u", s,
			      c->buffers);
		cr_assert_eq(a.st.rolled_back, k == PLAIN ? 0 : a.st.stepped_during_backward,
			     "step %d (%d): rolled back %u of %u", s, (int)k, a.st.rolled_back,
			     a.st.stepped_during_backward);
		cr_assert_eq(b.st.stepped_during_backward, 0, "step %d", s);
		cr_assert_eq(b.st.rolled_back, 0, "step %d", s);
		spec_steps += a.st.stepped_during_backward;
		rolled += a.st.rolled_back;
		rolled_clip += k == CLIPPED ? a.st.rolled_back : 0;
		rolled_skip += k == OVERFLOW ? a.st.rolled_back : 0;
	}
	cr_assert_eq(zinf_engine_steps(ms.e), c->bf16 ? STEPS : STEPS - 4);
	cr_assert_eq(zinf_engine_steps(mn.e), c->bf16 ? STEPS : STEPS - 4);
	cr_assert_gt(rolled_clip, 0);
	cr_assert(c->bf16 || rolled_skip > 0);
	cr_assert_lt(rolled, spec_steps, "plain steps kept their speculation");
	model_free(&ms);
	model_free(&mn);
}

Test(engine_spec, stage2_tier_none)
{
	compare_runs(
		&(struct cfg){2, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, 4, false, 0, false, false});
}

Test(engine_spec, stage2_tier_cpu)
{
	compare_runs(
		&(struct cfg){2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, 4, false, 0, false, false});
}

Test(engine_spec, stage2_tier_nvme)
{
	compare_runs(
		&(struct cfg){2, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, 3, false, 0, false, false});
}

Test(engine_spec, stage1_tier_cpu)
{
	compare_runs(
		&(struct cfg){1, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, 4, false, 0, false, false});
}

Test(engine_spec, stage3_none_none)
{
	compare_runs(
		&(struct cfg){3, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, 4, false, 0, false, false});
}

Test(engine_spec, stage3_cpu_cpu)
{
	compare_runs(
		&(struct cfg){3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_CPU, 4, false, 0, false, false});
}

Test(engine_spec, stage3_nvme_nvme)
{
	compare_runs(
		&(struct cfg){3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, 3, false, 0, false, false});
}

Test(engine_spec, stage3_none_nvme)
{
	compare_runs(
		&(struct cfg){3, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NVME, 4, false, 0, false, false});
}

/* bf16 parameters and state (stochastic rounding), clipping without fp16 */
Test(engine_spec, bf16_clipping_cpu)
{
	compare_runs(
		&(struct cfg){2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, 4, true, 0, false, false});
}

Test(engine_spec, bf16_clipping_nvme)
{
	compare_runs(
		&(struct cfg){3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_CPU, 2, true, 0, false, false});
}

/* 8-bit blockwise m and v: the reserve keeps and restores each sub-group's codes and scales
 * (fp16 with overflow and clipping on the cpu tier and on NVMe; bf16 parameters with clipping) */
Test(engine_spec, q8_state_cpu)
{
	compare_runs(
		&(struct cfg){2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, 4, false, 0, true, false});
}

Test(engine_spec, q8_state_nvme)
{
	compare_runs(
		&(struct cfg){3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, 3, false, 0, true, false});
	compare_runs(
		&(struct cfg){3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_CPU, 2, true, 0, true, false});
}

/* a bf16 master: the reserve keeps and restores its 2-byte elements, and a redone step draws
 * the same rounding bits (bf16 parameters, whose copy is the master, with clipping, on the cpu
 * tier and on NVMe, with fp32 and q8 moments; a bf16 master with fp16 parameters is refused) */
Test(engine_spec, bf16_master_cpu)
{
	compare_runs(
		&(struct cfg){2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, 4, true, 0, false, true});
}

Test(engine_spec, bf16_master_nvme)
{
	compare_runs(
		&(struct cfg){3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, 3, true, 0, false, true});
	compare_runs(&(struct cfg){3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_CPU, 2, true, 0, true, true});
}

/* a reserve of one sub-group: one is speculated, the others wait for the norm */
Test(engine_spec, reserve_of_one)
{
	compare_runs(
		&(struct cfg){2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, 1, false, 0, false, false});
	compare_runs(
		&(struct cfg){3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, 1, false, 0, false, false});
}

/* the reserve is counted in the optimizer's pool: host_pool_bytes grows by the slots */
Test(engine_spec, reserve_in_pool_budget)
{
	struct cfg c = {2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, 4, false, 0, false, false};
	struct model ms = {0}, mn = {0};
	model_make(&ms, &c, true);
	model_make(&mn, &c, false);
	struct zinf_engine_stats a = {.size = sizeof(a)}, b = {.size = sizeof(b)};
	cr_assert_eq(zinf_engine_get_stats(ms.e, &a), 0);
	cr_assert_eq(zinf_engine_get_stats(mn.e, &b), 0);
	/* 4 slots of the largest sub-group (300 elements): master, m, v in fp32 and the f16 copy,
	   each 4 KiB-aligned: 4 x 4 x 4096 bytes */
	cr_assert_eq(a.host_pool_bytes - b.host_pool_bytes, 4u * 4 * 4096, "%llu vs %llu",
		     (unsigned long long)a.host_pool_bytes, (unsigned long long)b.host_pool_bytes);
	model_free(&ms);
	model_free(&mn);
}

/*
 * Clipping on but never active (a threshold far above every norm), the optimizer on NVMe: the
 * speculation always holds, and it costs no read of the optimizer state. Every step's
 * nvme_read_bytes equal those of the same run without clipping (both step during backward; the
 * previous state the reserve keeps is copied from the step's buffers, not read again from the
 * files), as do the master weights and 16-bit values, bit for bit; the state's share equals the
 * worked value, one read of every sub-group's state (fp32 master, bf16 m and v: 8 bytes an
 * element of the flat partition). With offload_optimizer.buffer_count 5 the gradient window
 * holds all five sub-groups: no gradient I/O, the totals are equal. With 3 the speculated
 * gradients hold their window slots until the norm (kept for a redo), so the window spills
 * what it would not without clipping, when the worker lets it: only the reads of the state are
 * compared. The parameters on the CPU tier (stage 3): their 16-bit values are kept from there,
 * no NVMe read either.
 */
static void
no_extra_read(int stage, uint32_t buffers)
{
	struct cfg cc = {stage,
			 ZINF_OFFLOAD_NVME,
			 stage == 3 ? ZINF_OFFLOAD_CPU : ZINF_OFFLOAD_NONE,
			 buffers,
			 true,
			 1e9,
			 false,
			 false};
	struct cfg cn = cc;
	cn.clip = -1; /* no clipping: no speculation, no reserve */
	static struct seen a, b;
	struct model mc = {0}, mn = {0};
	model_make(&mc, &cc, true);
	model_make(&mn, &cn, true);
	uint64_t flat = 0;
	for (int p = 0; p < NP; p++) {
		flat += numel[p]; /* one rank: the partition is every element */
	}
	for (int s = 0; s < 6; s++) {
		train_step(&mc, &cc, s, &a);
		train_step(&mn, &cn, s, &b);
		cr_assert_eq(a.rc, 1, "step %d", s);
		cr_assert_eq(b.rc, 1, "step %d", s);
		cr_assert_gt(a.st.stepped_during_backward, 0, "step %d: nothing speculated", s);
		cr_assert_eq(a.st.rolled_back, 0, "step %d: clipping was active", s);
		cr_assert(a.st.grad_norm < 1e9, "step %d", s);
		cr_assert(memcmp(a.p16, b.p16, sizeof(a.p16)) == 0, "step %d: 16-bit values", s);
		cr_assert(memcmp(a.master, b.master, sizeof(a.master)) == 0, "step %d: master", s);
		uint64_t sa = a.st.nvme_read_bytes - a.st.grad_nvme_read_bytes;
		uint64_t sb = b.st.nvme_read_bytes - b.st.grad_nvme_read_bytes;
		cr_assert_eq(sa, sb,
			     "step %d: NVMe reads of the state %llu with clipping vs %llu without "
			     "(%u speculated)",
			     s, (unsigned long long)sa, (unsigned long long)sb,
			     a.st.stepped_during_backward);
		cr_assert_eq(sa, flat * 8, "step %d: %llu bytes of state read", s,
			     (unsigned long long)sa);
		if (buffers >= NP) {
			cr_assert_eq(a.st.grad_nvme_read_bytes, 0, "step %d", s);
			cr_assert_eq(b.st.grad_nvme_read_bytes, 0, "step %d", s);
			cr_assert_eq(a.st.nvme_read_bytes, b.st.nvme_read_bytes, "step %d", s);
		}
	}
	model_free(&mc);
	model_free(&mn);
}

Test(engine_spec, nvme_no_extra_read_stage2)
{
	no_extra_read(2, 5);
	no_extra_read(2, 3);
}

Test(engine_spec, nvme_no_extra_read_stage3)
{
	no_extra_read(3, 5);
	no_extra_read(3, 3);
}
