/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/test_engine_rollback.c: the speculative step during backward and its roll-back
 * (engine/engine_spec.c) where test_engine_spec.c's tier matrix does not go, each a speculating
 * engine against a non-speculating one in lockstep, bit for bit after every step (the same
 * harness: 20 steps of plain, clipped and fp16-overflow steps): every optimizer kind (Adam,
 * Adagrad, Lion), one and three micro-batches per step, the parameter store's CPU cache
 * (max_in_cpu), stage 3 persistent parameters, a window that spills the speculated gradients,
 * one sub-group, stage 0; the NVMe bytes of a kept, redone and restored speculation and the
 * previous state kept from the step's buffer; a checkpoint saved right after a rolled-back step
 * (foreground and background), loaded into a fresh engine that must go on as the
 * non-speculating one does; an overflow at the minimum loss scale while speculating (-ERANGE)
 * and a destroy in the middle of a speculation. Not here: several ranks (test_engine_ranks.c).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "zinf/checkpoint.h"
#include "zinf/engine.h"
#include "engine/test_model.h"

#include "engine/spec_model.h"

struct cfg {
	int stage;
	enum zinf_offload_device opt, param;
	uint32_t buffers; /* offload_optimizer.buffer_count: the reserve's slots */
	bool bf16;	  /* bf16 parameters and optimizer state (stochastic rounding), clipping
			     without fp16: no overflow step (those are plain) */
	/* beyond test_engine_spec.c's fields (0: its values) */
	enum zinf_optim_kind kind; /* 0: AdamW as there (ZINF_OPTIM_ADAM is 0: use adam) */
	bool adam;		   /* plain Adam */
	uint32_t gas;		   /* 0: 2 */
	uint32_t max_in_cpu;	   /* offload_param.max_in_cpu */
	uint64_t persist;	   /* stage3_param_persistence_threshold */
	uint64_t sg_size;	   /* sub_group_size (0: 64, five sub-groups) */
	double min_scale;	   /* fp16.min_loss_scale with hysteresis 1 (0: 1, hysteresis 2) */
};

static void
make_opts(struct zinf_engine_opts *o, const struct cfg *c, const char *dir, bool spec)
{
	spec_model_opts(o, c->stage, c->opt, c->param, c->buffers, dir,
			c->adam	  ? ZINF_OPTIM_ADAM
			: c->kind ? c->kind
				  : ZINF_OPTIM_ADAMW);
	o->gradient_accumulation_steps = c->gas ? c->gas : 2;
	o->offload_param.max_in_cpu = c->max_in_cpu;
	o->stage3_param_persistence_threshold = c->persist;
	o->sub_group_size = c->sg_size ? c->sg_size : 64;
	if (c->bf16) {
		o->dtype = ZINF_BF16;
		o->optimizer.state_dtype = ZINF_BF16;
		o->optimizer.rounding = ZINF_ROUND_STOCHASTIC;
		o->gradient_clipping = CLIP;
		o->step_during_backward = spec;
		o->swap_prefix = "esrev";
		return;
	}
	o->dtype = ZINF_F16;
	o->fp16.enabled = true;
	o->fp16.initial_scale_power = 8;
	o->fp16.hysteresis = 2;
	o->fp16.loss_scale_window = 3;
	o->fp16.min_loss_scale = 1;
	if (c->min_scale > 0) {
		o->fp16.min_loss_scale = c->min_scale;
		o->fp16.hysteresis = 1;
	}
	o->gradient_clipping = CLIP;
	o->step_during_backward = spec;
	o->swap_prefix = "esrev";
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
static bool no_step; /* micro: leave out the final zinf_engine_step */

static int
micro(struct model *m, int s, int mi, double factor, bool inf, struct seen *out)
{
	spec_passes(m->e, m->gdev, out->p16, s, mi, factor, inf);
	return no_step ? 0 : zinf_engine_step(m->e);
}

static void
train_step(struct model *m, const struct cfg *c, int s, struct seen *out)
{
	enum kind k = c->bf16 && kind_of(s) == OVERFLOW ? PLAIN : kind_of(s);
	double factor = k == CLIPPED ? 4.0 : 1.0;
	uint32_t gas = c->gas ? c->gas : 2;
	for (uint32_t mi = 0; mi + 1 < gas; mi++) {
		int rc = micro(m, s, (int)mi, factor, k == OVERFLOW, out);
		cr_assert_eq(rc, 0, "step %d micro %u: %d %s", s, mi, rc, zinf_last_error());
	}
	out->rc = micro(m, s, (int)gas - 1, factor, gas == 1 && k == OVERFLOW, out);
	cr_assert(out->rc == 1 || out->rc == 2, "step %d micro 1: %d %s", s, out->rc,
		  zinf_last_error());
	spec_record(m, out, c->bf16);
}

/* the speculating run's gradient-window traffic over compare_runs' last call */
static uint64_t grad_read_spec, grad_write_spec;
/* each step's statistics over compare_runs' last call, both runs */
static struct zinf_engine_stats io_spec[STEPS], io_ref[STEPS];

static void
compare_runs(const struct cfg *c)
{
	grad_read_spec = grad_write_spec = 0;
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
		/* one sub-group: nothing to speculate (the last one never is) */
		cr_assert(c->sg_size >= 1000 ? a.st.stepped_during_backward == 0
					     : a.st.stepped_during_backward > 0,
			  "step %d: %u speculated", s, a.st.stepped_during_backward);
		cr_assert_leq(a.st.stepped_during_backward, c->buffers, "step %d: reserve of %u", s,
			      c->buffers);
		cr_assert_eq(a.st.rolled_back,
			     k == PLAIN || c->sg_size >= 1000 ? 0 : a.st.stepped_during_backward,
			     "step %d (%d): rolled back %u of %u", s, (int)k, a.st.rolled_back,
			     a.st.stepped_during_backward);
		cr_assert_eq(b.st.stepped_during_backward, 0, "step %d", s);
		cr_assert_eq(b.st.rolled_back, 0, "step %d", s);
		spec_steps += a.st.stepped_during_backward;
		grad_read_spec += a.st.grad_nvme_read_bytes;
		io_spec[s] = a.st;
		io_ref[s] = b.st;
		grad_write_spec += a.st.grad_nvme_write_bytes;
		rolled += a.st.rolled_back;
		rolled_clip += k == CLIPPED ? a.st.rolled_back : 0;
		rolled_skip += k == OVERFLOW ? a.st.rolled_back : 0;
	}
	cr_assert_eq(zinf_engine_steps(ms.e), c->bf16 ? STEPS : STEPS - 4);
	cr_assert_eq(zinf_engine_steps(mn.e), c->bf16 ? STEPS : STEPS - 4);
	cr_assert(c->sg_size >= 1000 || rolled_clip > 0);
	cr_assert(c->bf16 || c->sg_size >= 1000 || rolled_skip > 0);
	cr_assert(c->sg_size >= 1000 || rolled < spec_steps, "plain steps kept their speculation");
	model_free(&ms);
	model_free(&mn);
}

Test(engine_rollback, adam_cpu)
{
	compare_runs(&(struct cfg){.stage = 2,
				   .opt = ZINF_OFFLOAD_CPU,
				   .param = ZINF_OFFLOAD_NONE,
				   .buffers = 4,
				   .bf16 = false,
				   .adam = true});
}

Test(engine_rollback, adagrad_none_and_nvme)
{
	compare_runs(&(struct cfg){.stage = 2,
				   .opt = ZINF_OFFLOAD_NONE,
				   .param = ZINF_OFFLOAD_NONE,
				   .buffers = 4,
				   .bf16 = false,
				   .kind = ZINF_OPTIM_ADAGRAD});
	compare_runs(&(struct cfg){.stage = 3,
				   .opt = ZINF_OFFLOAD_NVME,
				   .param = ZINF_OFFLOAD_NVME,
				   .buffers = 3,
				   .bf16 = false,
				   .kind = ZINF_OPTIM_ADAGRAD});
}

Test(engine_rollback, lion_cpu_and_nvme)
{
	compare_runs(&(struct cfg){.stage = 2,
				   .opt = ZINF_OFFLOAD_CPU,
				   .param = ZINF_OFFLOAD_NONE,
				   .buffers = 4,
				   .bf16 = false,
				   .kind = ZINF_OPTIM_LION});
	compare_runs(&(struct cfg){.stage = 3,
				   .opt = ZINF_OFFLOAD_NVME,
				   .param = ZINF_OFFLOAD_CPU,
				   .buffers = 2,
				   .bf16 = false,
				   .kind = ZINF_OPTIM_LION});
}

/* one micro-batch per step: the boundary micro-batch is the first */
Test(engine_rollback, gas_one)
{
	compare_runs(&(struct cfg){.stage = 2,
				   .opt = ZINF_OFFLOAD_CPU,
				   .param = ZINF_OFFLOAD_NONE,
				   .buffers = 4,
				   .bf16 = false,
				   .gas = 1});
	compare_runs(&(struct cfg){.stage = 3,
				   .opt = ZINF_OFFLOAD_NVME,
				   .param = ZINF_OFFLOAD_NVME,
				   .buffers = 3,
				   .bf16 = false,
				   .gas = 1});
}

/* three micro-batches: the overflow in the first, the speculation in the last */
Test(engine_rollback, gas_three)
{
	compare_runs(&(struct cfg){.stage = 3,
				   .opt = ZINF_OFFLOAD_CPU,
				   .param = ZINF_OFFLOAD_CPU,
				   .buffers = 4,
				   .bf16 = false,
				   .gas = 3});
}

/* the parameter store keeps partitions in CPU memory (max_in_cpu): a restore must not leave a
   stale cached copy */
Test(engine_rollback, store_cpu_cache)
{
	compare_runs(&(struct cfg){.stage = 3,
				   .opt = ZINF_OFFLOAD_CPU,
				   .param = ZINF_OFFLOAD_NVME,
				   .buffers = 4,
				   .bf16 = false,
				   .max_in_cpu = 1 << 20});
	compare_runs(&(struct cfg){.stage = 3,
				   .opt = ZINF_OFFLOAD_NVME,
				   .param = ZINF_OFFLOAD_NVME,
				   .buffers = 3,
				   .bf16 = false,
				   .max_in_cpu = 1 << 20});
}

/* stage 3 persistent parameters (always gathered): re-gathered after a redo, untouched by a
   skip */
Test(engine_rollback, stage3_persistent)
{
	compare_runs(&(struct cfg){.stage = 3,
				   .opt = ZINF_OFFLOAD_CPU,
				   .param = ZINF_OFFLOAD_CPU,
				   .buffers = 4,
				   .bf16 = false,
				   .persist = 50});
	compare_runs(&(struct cfg){.stage = 3,
				   .opt = ZINF_OFFLOAD_NONE,
				   .param = ZINF_OFFLOAD_NVME,
				   .buffers = 4,
				   .bf16 = false,
				   .persist = 50});
	compare_runs(&(struct cfg){.stage = 3,
				   .opt = ZINF_OFFLOAD_NONE,
				   .param = ZINF_OFFLOAD_NONE,
				   .buffers = 4,
				   .persist = 50});
}

/* a window of two slots (buffer_count 2) over five sub-groups: the gradients of speculated
   sub-groups (GW_SPEC) are written out and read back for the redo */
Test(engine_rollback, window_spill)
{
	compare_runs(&(struct cfg){
		.stage = 2, .opt = ZINF_OFFLOAD_NVME, .param = ZINF_OFFLOAD_NONE, .buffers = 2});
	fprintf(stderr, "window_spill: grad read %llu write %llu\n",
		(unsigned long long)grad_read_spec, (unsigned long long)grad_write_spec);
	cr_assert_gt(grad_read_spec, 0);
	compare_runs(&(struct cfg){
		.stage = 3, .opt = ZINF_OFFLOAD_NVME, .param = ZINF_OFFLOAD_NVME, .buffers = 1});
	fprintf(stderr, "window_spill: grad read %llu write %llu\n",
		(unsigned long long)grad_read_spec, (unsigned long long)grad_write_spec);
	cr_assert_gt(grad_read_spec, 0);
}

/* one sub-group: no speculation, the step waits for the norm (every tier) */
Test(engine_rollback, single_sub_group)
{
	compare_runs(&(struct cfg){.stage = 2,
				   .opt = ZINF_OFFLOAD_NONE,
				   .param = ZINF_OFFLOAD_NONE,
				   .buffers = 4,
				   .sg_size = 100000});
	compare_runs(&(struct cfg){.stage = 3,
				   .opt = ZINF_OFFLOAD_NVME,
				   .param = ZINF_OFFLOAD_NVME,
				   .buffers = 4,
				   .sg_size = 100000});
}

Test(engine_rollback, stage0)
{
	compare_runs(&(struct cfg){.stage = 0,
				   .opt = ZINF_OFFLOAD_NONE,
				   .param = ZINF_OFFLOAD_NONE,
				   .buffers = 4,
				   .bf16 = false});
}

/*
 * A checkpoint saved right after a rolled-back step (step index `stop`: an overflow or a clip
 * step) holds the restored state: loaded into a fresh non-speculating engine, that engine goes
 * on bit for bit as the non-speculating run does.
 */
static void
ckpt_after_rollback(const struct cfg *c, int stop, bool background)
{
	static struct seen a, b, l;
	struct model ms = {0}, mn = {0}, ml = {0};
	model_make(&ms, c, true);
	model_make(&mn, c, false);
	for (int s = 0; s <= stop; s++) {
		train_step(&ms, c, s, &a);
		train_step(&mn, c, s, &b);
		cr_assert_eq(a.rc, b.rc);
	}
	cr_assert_gt(a.st.rolled_back, 0, "step %d was not rolled back", stop);
	char *ck = zt_mkdtemp(NULL);
	struct zinf_ckpt_opts co;
	zinf_ckpt_opts_init(&co);
	co.background = background;
	int rc = zinf_engine_save(ms.e, ck, "t", &co);
	cr_assert_eq(rc, 0, "save: %d %s", rc, zinf_last_error());
	if (background) {
		/* the next step publishes it (its boundary's first gradient) and then speculates */
		train_step(&ms, c, stop + 1, &a);
		cr_assert_eq(zinf_engine_save_wait(ms.e), 0, "%s", zinf_last_error());
	}
	model_make(&ml, c, false);
	zinf_ckpt_opts_init(&co);
	rc = zinf_engine_load(ml.e, ck, "t", &co);
	cr_assert_eq(rc, 0, "load: %d %s", rc, zinf_last_error());
	cr_assert_eq(zinf_engine_loss_scale(ml.e), zinf_engine_loss_scale(mn.e));
	for (int s = stop + 1; s < STEPS; s++) {
		train_step(&mn, c, s, &b);
		train_step(&ml, c, s, &l);
		cr_assert_eq(l.rc, b.rc, "step %d", s);
		cr_assert(memcmp(l.p16, b.p16, sizeof(l.p16)) == 0,
			  "step %d: 16-bit parameters differ (loaded after a roll-back vs not)", s);
		cr_assert(memcmp(l.master, b.master, sizeof(l.master)) == 0,
			  "step %d: master weights differ (loaded after a roll-back vs not)", s);
	}
	model_free(&ms);
	model_free(&mn);
	model_free(&ml);
	zt_rmtree(ck);
	free(ck);
}

Test(engine_rollback, ckpt_after_skip)
{
	ckpt_after_rollback(&(struct cfg){.stage = 2,
					  .opt = ZINF_OFFLOAD_CPU,
					  .param = ZINF_OFFLOAD_NONE,
					  .buffers = 4,
					  .bf16 = false},
			    2, false);
	ckpt_after_rollback(&(struct cfg){.stage = 3,
					  .opt = ZINF_OFFLOAD_NVME,
					  .param = ZINF_OFFLOAD_NVME,
					  .buffers = 3,
					  .bf16 = false},
			    2, false);
}

Test(engine_rollback, ckpt_after_redo_background)
{
	ckpt_after_rollback(&(struct cfg){.stage = 2,
					  .opt = ZINF_OFFLOAD_NONE,
					  .param = ZINF_OFFLOAD_NONE,
					  .buffers = 4,
					  .bf16 = false},
			    1, true);
	ckpt_after_rollback(&(struct cfg){.stage = 3,
					  .opt = ZINF_OFFLOAD_NVME,
					  .param = ZINF_OFFLOAD_NVME,
					  .buffers = 3,
					  .bf16 = false},
			    2, true);
}

/*
 * The loss scaler at min_loss_scale on an overflow while sub-groups were stepped speculatively
 * (the optimizer on NVMe: a pass in flight): -ERANGE, the engine failed for good (a later step
 * returns it), destroyed cleanly (no buffer, thread or file left: ASan).
 */
static void
erange_one(const struct cfg *c)
{
	static struct seen a;
	struct model ms = {0};
	model_make(&ms, c, true);
	train_step(&ms, c, 0, &a); /* plain */
	train_step(&ms, c, 1, &a); /* clipped */
	cr_assert_eq(zinf_engine_loss_scale(ms.e), 256.0);
	int rc = micro(&ms, 2, 0, 1.0, true, &a); /* the overflow */
	cr_assert_eq(rc, 0, "%d %s", rc, zinf_last_error());
	rc = micro(&ms, 2, 1, 1.0, false, &a);
	cr_assert_eq(rc, -ERANGE, "the overflow at min_loss_scale returned %d", rc);
	cr_assert_eq(zinf_engine_step(ms.e), -ERANGE);
	model_free(&ms);
}

Test(engine_rollback, erange_while_speculating)
{
	erange_one(&(struct cfg){.stage = 3,
				 .opt = ZINF_OFFLOAD_NVME,
				 .param = ZINF_OFFLOAD_NVME,
				 .buffers = 3,
				 .min_scale = 256});
	erange_one(&(struct cfg){.stage = 2,
				 .opt = ZINF_OFFLOAD_CPU,
				 .param = ZINF_OFFLOAD_NONE,
				 .buffers = 4,
				 .min_scale = 256});
}

/* The trainer gives up in the middle of the boundary micro-batch (its backward done, no final
   zinf_engine_step) while the worker steps speculatively: the destroy joins it cleanly. */
Test(engine_rollback, destroy_mid_speculation)
{
	const struct cfg cs[] = {
		{.stage = 3, .opt = ZINF_OFFLOAD_NVME, .param = ZINF_OFFLOAD_NVME, .buffers = 3},
		{.stage = 2, .opt = ZINF_OFFLOAD_NONE, .param = ZINF_OFFLOAD_NONE, .buffers = 4},
	};
	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		static struct seen a;
		struct model ms = {0};
		model_make(&ms, &cs[i], true);
		train_step(&ms, &cs[i], 0, &a);
		cr_assert_eq(micro(&ms, 1, 0, 4.0, false, &a), 0);
		no_step = true;
		cr_assert_eq(micro(&ms, 1, 1, 4.0, false, &a), 0);
		no_step = false;
		/* the last gradient's cast reads the trainer's buffer on the engine stream: the
		   compute stream waits for it (zinf_engine_grad), the buffer is freed after */
		cr_assert_eq(zinf_stream_sync(zinf_engine_compute_stream(ms.e)), 0);
		model_free(&ms);
	}
}

/*
 * The NVMe bytes of the statistics, the optimizer on NVMe, a window of five slots (nothing
 * spilled), four of the five sub-groups speculated (all but the last): X = their state's bytes
 * (12 a parameter), kept from the step's buffers (zinf_step's before_fn), not read again. A
 * plain step reads and writes the same as the step after backward; a clip step writes 2X more
 * (the speculative writes, the roll-back's, then the redo as the other run's); a skipped step
 * writes 2X (the other run nothing).
 */
Test(engine_rollback, nvme_bytes)
{
	compare_runs(&(struct cfg){
		.stage = 2, .opt = ZINF_OFFLOAD_NVME, .param = ZINF_OFFLOAD_NONE, .buffers = 5});
	uint64_t x = 12 * (120 + 7 + 200 + 40);
	for (int s = 0; s < STEPS; s++) {
		const struct zinf_engine_stats *a = &io_spec[s], *b = &io_ref[s];
		cr_assert_eq(a->grad_nvme_write_bytes + b->grad_nvme_write_bytes, 0);
		switch (kind_of(s)) {
		case PLAIN:
			cr_assert_eq(a->nvme_read_bytes, b->nvme_read_bytes, "step %d", s);
			cr_assert_eq(a->nvme_write_bytes, b->nvme_write_bytes, "step %d", s);
			break;
		case CLIPPED:
			cr_assert_eq(a->nvme_write_bytes, b->nvme_write_bytes + 2 * x, "step %d",
				     s);
			break;
		case OVERFLOW:
			cr_assert_eq(b->nvme_write_bytes, 0, "step %d", s);
			cr_assert_eq(a->nvme_write_bytes, 2 * x, "step %d", s);
			break;
		}
	}
}

/*
 * The previous state kept from the step's buffer (zinf_step's before_fn) for the kinds the
 * NVMe cases above leave out: plain Adam, fp32 and bf16 state (2-byte m and v beside the fp32
 * master; Lion and Adagrad have fp32 state only, covered above). Every step equals the step
 * after backward.
 */
Test(engine_rollback, adam_nvme_before_fn)
{
	compare_runs(&(struct cfg){.stage = 2,
				   .opt = ZINF_OFFLOAD_NVME,
				   .param = ZINF_OFFLOAD_NONE,
				   .buffers = 4,
				   .adam = true});
	compare_runs(&(struct cfg){.stage = 3,
				   .opt = ZINF_OFFLOAD_NVME,
				   .param = ZINF_OFFLOAD_CPU,
				   .buffers = 3,
				   .bf16 = true,
				   .adam = true});
}
