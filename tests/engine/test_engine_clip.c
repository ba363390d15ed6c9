/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/test_engine_clip.c: gradient clipping by the global norm and fp16 loss scaling
 * in the engine, one process (comm "single", device "host" with asynchronous streams). A small
 * model (three parameters in two layers, sub-groups of at most 128 elements: four sub-groups)
 * is trained with gradients the test chooses (dyadic values, so that the engine's fp32
 * accumulation is exact), and the fp32 master weights are compared with a reference computed
 * here: the norm in float64 from the averaged gradients handed, DeepSpeed's clip coefficient,
 * then the step with that grad_scale through zinf_adam_step (the engine's kernel: bit for bit)
 * and, independently, a float64 AdamW (within a stated tolerance). Also: clipping above the
 * norm gives the bits of no clipping; every optimizer tier gives the same bits with clipping
 * active; an fp16 overflow skips the step (master and 16-bit parameters unchanged bit for bit,
 * zinf_engine_step returns 2), the dynamic scale halves after `hysteresis` overflows and
 * doubles after loss_scale_window clean steps; a static scale skips without changing; an
 * overflow at min_loss_scale fails the engine with -ERANGE; the options' checks; the config reader
 * fills the engine options. Not here: several ranks (test_engine_ranks.c's clip case).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "zinf/blocks/adam.h"
#include "zinf/config.h"
#include "zinf/engine.h"
#include "engine/test_model.h"

#define NP 3
static const uint64_t numel[NP] = {300, 200, 7}; /* "a" (layer 0), "b", "c" (layer 1) */
static const int layer_of[NP] = {0, 1, 1};
static const char *const names[NP] = {"a", "b", "c"};
#define NMAX 300
#define LR   0.01f

/* initial value i of parameter p: dyadic, exact in f16 */
static float
init_val(int p, uint64_t i)
{
	return (float)((int)((i * 13 + (uint64_t)p * 7) % 33) - 16) / 32.0f;
}

/* gradient of parameter p, element i, step s, micro m: dyadic with few bits (the fp32 sums
   of two micro-batches are exact) */
static float
grad_val(int p, uint64_t i, int s, int m)
{
	return (float)((int)((i * 37 + (uint64_t)p * 11 + (uint64_t)s * 5 + (uint64_t)m * 3) % 61) -
		       30) /
	       16.0f;
}

struct model {
	struct zinf_engine *e;
	char *dir;
	float *gdev[NP]; /* fp32 gradient buffers in device memory */
	float *init[NP];
};

static void
base_opts(struct zinf_engine_opts *o, enum zinf_offload_device tier, const char *dir)
{
	zinf_engine_opts_init(o);
	o->device_backend = "host";
	o->comm_backend = "single";
	o->stage = 2;
	o->offload_optimizer.device = tier;
	if (tier == ZINF_OFFLOAD_NVME) {
		o->offload_optimizer.n_paths = 1;
		o->offload_optimizer.nvme_path[0] = dir;
		o->offload_optimizer.buffer_count = 2; /* a window smaller than the sub-groups */
	}
	o->sub_group_size = 128;
	o->reduce_bucket_size = 256;
	o->allgather_bucket_size = 256;
	o->gradient_accumulation_steps = 2;
	zinf_optimizer_opts_init(&o->optimizer, ZINF_OPTIM_ADAMW);
	o->optimizer.lr = LR;
	o->optimizer.eps = 0.05f;
	o->optimizer.weight_decay = 0.01f;
	o->dtype = ZINF_F32;
	o->swap_prefix = "eclip";
}

static void
model_make(struct model *m, const struct zinf_engine_opts *o)
{
	int rc = zinf_engine_create(o, &m->e);
	cr_assert_eq(rc, 0, "zinf_engine_create: %d %s", rc, zinf_last_error());
	tm_make(m->e, NP, names, numel, layer_of, init_val, m->init, m->gdev);
}

static void
model_free(struct model *m)
{
	tm_free(m->e, NP, m->init, m->gdev);
	zinf_engine_destroy(m->e);
}

/*
 * One micro-batch: forward (fetch/release), backward handing grad_val(...) * scale for every
 * parameter (inf_at >= 0: element 0 of parameter inf_at is +infinity), then the step.
 */
static int
micro(struct model *m, int s, int mi, double scale, int inf_at)
{
	struct zinf_stream *cs = zinf_engine_compute_stream(m->e);
	for (int l = 0; l < 2; l++) {
		cr_assert_eq(zinf_engine_fetch(m->e, l), 0, "%s", zinf_last_error());
		cr_assert_eq(zinf_engine_release(m->e, l), 0);
	}
	float h[NMAX];
	for (int l = 1; l >= 0; l--) {
		cr_assert_eq(zinf_engine_fetch(m->e, l), 0, "%s", zinf_last_error());
		for (int p = NP - 1; p >= 0; p--) {
			if (layer_of[p] != l) {
				continue;
			}
			for (uint64_t i = 0; i < numel[p]; i++) {
				h[i] = (float)(grad_val(p, i, s, mi) * scale);
			}
			if (inf_at == p) {
				h[0] = INFINITY;
			}
			cr_assert_eq(zinf_stream_sync(cs), 0); /* the previous use of gdev[p] */
			cr_assert_eq(
				zinf_device_copy(cs, m->gdev[p], h, numel[p] * 4, ZINF_COPY_H2D),
				0);
			cr_assert_eq(zinf_stream_sync(cs), 0);
			int rc = zinf_engine_grad(m->e, (uint32_t)p, m->gdev[p], ZINF_F32);
			cr_assert_eq(rc, 0, "grad: %d %s", rc, zinf_last_error());
		}
		cr_assert_eq(zinf_engine_release(m->e, l), 0);
	}
	return zinf_engine_step(m->e);
}

/* One optimizer step (two micro-batches); returns the final zinf_engine_step value. */
static int
train_step(struct model *m, int s, double scale, int inf_at)
{
	int rc = micro(m, s, 0, scale, inf_at);
	cr_assert_eq(rc, 0, "micro 0: %d %s", rc, zinf_last_error());
	rc = micro(m, s, 1, scale, -1);
	cr_assert(rc == 1 || rc == 2, "micro 1: %d %s", rc, zinf_last_error());
	return rc;
}

static void
read_master(struct model *m, float out[NP][NMAX])
{
	for (int p = 0; p < NP; p++) {
		int rc = zinf_engine_read_master(m->e, (uint32_t)p, out[p]);
		cr_assert_eq(rc, 0, "read_master: %d %s", rc, zinf_last_error());
	}
}

static void
get_stats(struct model *m, struct zinf_engine_stats *st)
{
	memset(st, 0, sizeof(*st));
	st->size = sizeof(*st);
	cr_assert_eq(zinf_engine_get_stats(m->e, st), 0);
}

/* ---- the reference ------------------------------------------------------------------------ */

struct ref {
	float p[NP][NMAX], m[NP][NMAX], v[NP][NMAX];	 /* through zinf_adam_step */
	double dp[NP][NMAX], dm[NP][NMAX], dv[NP][NMAX]; /* float64 AdamW */
	double norm;					 /* the last step's */
};

static void
ref_init(struct ref *r)
{
	memset(r, 0, sizeof(*r));
	for (int p = 0; p < NP; p++) {
		for (uint64_t i = 0; i < numel[p]; i++) {
			r->p[p][i] = init_val(p, i);
			r->dp[p][i] = init_val(p, i);
		}
	}
}

/* Step `t` (from 1) on the gradients of training step index s (two micro-batches, the sum:
   exact in fp32) with clipping max_norm (0: none). Returns the grad_scale used. */
static float
ref_step(struct ref *r, int64_t t, int s, double max_norm)
{
	float g[NP][NMAX];
	double sumsq = 0.0;
	for (int p = 0; p < NP; p++) {
		for (uint64_t i = 0; i < numel[p]; i++) {
			g[p][i] = grad_val(p, i, s, 0) + grad_val(p, i, s, 1);
			sumsq += (double)g[p][i] * g[p][i];
		}
	}
	double norm = sqrt(sumsq), combined = 1.0;
	if (max_norm > 0 && (norm + 1e-6) / max_norm > 1.0) {
		combined = (norm + 1e-6) / max_norm; /* DeepSpeed's unscale_and_clip_grads */
	}
	r->norm = norm;
	float gs = (float)(1.0 / combined);
	struct zinf_adam_opts a;
	zinf_adam_opts_init(&a);
	a.lr = LR, a.eps = 0.05f, a.weight_decay = 0.01f;
	double b1 = a.beta1, b2 = a.beta2;
	for (int p = 0; p < NP; p++) {
		cr_assert_eq(zinf_adam_step(&a, t, gs, r->p[p], g[p], ZINF_F32, r->m[p], r->v[p],
					    numel[p], NULL, ZINF_F32),
			     0);
		for (uint64_t i = 0; i < numel[p]; i++) {
			double gg = (double)g[p][i] / combined;
			r->dp[p][i] *= 1.0 - (double)LR * 0.01;
			r->dm[p][i] = b1 * r->dm[p][i] + (1 - b1) * gg;
			r->dv[p][i] = b2 * r->dv[p][i] + (1 - b2) * gg * gg;
			double bc1 = 1 - pow(b1, (double)t), bc2 = sqrt(1 - pow(b2, (double)t));
			r->dp[p][i] -=
				(double)LR / bc1 * r->dm[p][i] / (sqrt(r->dv[p][i]) / bc2 + 0.05);
		}
	}
	return gs;
}

static void
expect_bits(float got[NP][NMAX], float want[NP][NMAX], const char *what)
{
	for (int p = 0; p < NP; p++) {
		for (uint64_t i = 0; i < numel[p]; i++) {
			cr_assert(memcmp(&got[p][i], &want[p][i], 4) == 0,
				  "%s: %s[%llu]: %.9g, expected %.9g", what, names[p],
				  (unsigned long long)i, got[p][i], want[p][i]);
		}
	}
}

/* ---- clipping ------------------------------------------------------------------------------ */

/* Three steps with clipping at max_norm on tier `tier`: master weights into out. */
static void
run_clip(enum zinf_offload_device tier, double max_norm, bool during, float out[NP][NMAX],
	 double *last_norm)
{
	struct model m = {0};
	m.dir = tier == ZINF_OFFLOAD_NVME ? zt_mkdtemp(NULL) : NULL;
	struct zinf_engine_opts o;
	base_opts(&o, tier, m.dir);
	o.gradient_clipping = max_norm;
	o.step_during_backward = during;
	model_make(&m, &o);
	for (int s = 0; s < 3; s++) {
		cr_assert_eq(train_step(&m, s, 1.0, -1), 1);
	}
	cr_assert_eq(zinf_engine_steps(m.e), 3);
	cr_assert_eq(zinf_engine_loss_scale(m.e), 1.0);
	struct zinf_engine_stats st;
	get_stats(&m, &st);
	*last_norm = st.grad_norm;
	cr_assert_eq(st.overflow, false);
	cr_assert_eq(st.skipped_steps, 0);
	if (!during) {
		cr_assert_eq(st.stepped_during_backward, 0);
		cr_assert_eq(st.rolled_back, 0);
	} else {
		/* stepped during backward, speculatively with clipping: rolled back (redone) when
		   clipping is active on the last step (max_norm 1), kept when not (1e6) */
		cr_assert_gt(st.stepped_during_backward, 0);
		cr_assert_eq(st.rolled_back,
			     max_norm > 0 && max_norm < 10.0 ? st.stepped_during_backward : 0,
			     "rolled back %u of %u", st.rolled_back, st.stepped_during_backward);
	}
	read_master(&m, out);
	model_free(&m);
	if (m.dir) {
		zt_rmtree(m.dir);
		free(m.dir);
	}
}

Test(engine_clip, clipped_step_matches_reference)
{
	static struct ref r;
	static float got[NP][NMAX];
	ref_init(&r);
	/* the gradients' norm is about 30 to 40: max_norm 1 clips every step */
	float gs = 1.0f;
	for (int s = 0; s < 3; s++) {
		gs = ref_step(&r, s + 1, s, 1.0);
		cr_assert(gs < 0.1f, "step %d: grad_scale %g: clipping is not active", s, gs);
	}
	double norm;
	run_clip(ZINF_OFFLOAD_CPU, 1.0, true, got, &norm);
	cr_assert(fabs(norm - r.norm) <= 1e-12 * r.norm, "grad_norm %.17g, reference %.17g", norm,
		  r.norm);
	expect_bits(got, r.p, "tier cpu against zinf_adam_step");
	/* the float64 AdamW: the engine's fp32 arithmetic within 1e-5 (the weights are ~0.5, the
	   three updates ~0.03 together: fp32 rounding is ~1e-7 per operation) */
	for (int p = 0; p < NP; p++) {
		for (uint64_t i = 0; i < numel[p]; i++) {
			cr_assert(fabs(got[p][i] - r.dp[p][i]) <= 1e-5, "%s[%llu]: %.9g vs %.12g",
				  names[p], (unsigned long long)i, got[p][i], r.dp[p][i]);
		}
	}
	/* and clipping changed the result: without it the weights differ */
	static struct ref r0;
	ref_init(&r0);
	for (int s = 0; s < 3; s++) {
		ref_step(&r0, s + 1, s, 0.0);
	}
	cr_assert(memcmp(r0.p, r.p, sizeof(r.p)) != 0);
}

Test(engine_clip, every_tier_same_bits)
{
	static float none[NP][NMAX], cpu[NP][NMAX], nvme[NP][NMAX], after[NP][NMAX];
	double n0, n1, n2, n3;
	run_clip(ZINF_OFFLOAD_NONE, 1.0, true, none, &n0);
	run_clip(ZINF_OFFLOAD_CPU, 1.0, true, cpu, &n1);
	run_clip(ZINF_OFFLOAD_NVME, 1.0, true, nvme, &n2);
	run_clip(ZINF_OFFLOAD_NVME, 1.0, false, after, &n3);
	expect_bits(none, cpu, "tier none against cpu");
	expect_bits(nvme, cpu, "tier nvme against cpu");
	expect_bits(after, cpu, "tier nvme, step after backward, against cpu");
	cr_assert(n0 == n1 && n1 == n2 && n2 == n3, "norms %.17g %.17g %.17g %.17g", n0, n1, n2,
		  n3);
}

/* max_norm above the norm: the bits of no clipping (and of the step during backward) */
Test(engine_clip, inactive_below_max_norm)
{
	static float off[NP][NMAX], on[NP][NMAX];
	double n_off, n_on;
	run_clip(ZINF_OFFLOAD_NONE, 0.0, true, off, &n_off);
	cr_assert_eq(n_off, 0.0, "grad_norm is 0 when not computed");
	run_clip(ZINF_OFFLOAD_NONE, 1e6, true, on, &n_on);
	cr_assert(n_on > 1.0 && n_on < 1e3, "grad_norm %g", n_on);
	expect_bits(on, off, "max_norm 1e6 against no clipping");
	static struct ref r;
	ref_init(&r);
	for (int s = 0; s < 3; s++) {
		cr_assert_eq(ref_step(&r, s + 1, s, 1e6), 1.0f);
	}
	expect_bits(off, r.p, "no clipping against zinf_adam_step");
}

/* ---- fp16 loss scaling --------------------------------------------------------------------- */

static void
fp16_opts(struct zinf_engine_opts *o, enum zinf_offload_device tier, const char *dir)
{
	base_opts(o, tier, dir);
	o->dtype = ZINF_F16;
	o->fp16.enabled = true;
	o->fp16.initial_scale_power = 4; /* 16 */
	o->fp16.hysteresis = 2;
	o->fp16.loss_scale_window = 2;
	o->fp16.min_loss_scale = 1;
}

/* the 16-bit parameters as the trainer sees them (stages 0-2: always valid) */
static void
read16(struct model *m, uint16_t out[NP][NMAX])
{
	struct zinf_stream *cs = zinf_engine_compute_stream(m->e);
	for (int p = 0; p < NP; p++) {
		void *dev;
		cr_assert_eq(zinf_engine_param(m->e, (uint32_t)p, &dev), 0);
		cr_assert_eq(zinf_device_copy(cs, out[p], dev, numel[p] * 2, ZINF_COPY_D2H), 0);
	}
	cr_assert_eq(zinf_stream_sync(cs), 0);
}

static void
fp16_case(enum zinf_offload_device tier)
{
	struct model m = {0};
	m.dir = tier == ZINF_OFFLOAD_NVME ? zt_mkdtemp(NULL) : NULL;
	struct zinf_engine_opts o;
	fp16_opts(&o, tier, m.dir);
	o.gradient_clipping = 1.0;
	model_make(&m, &o);
	static float before[NP][NMAX], after[NP][NMAX];
	static uint16_t h0[NP][NMAX], h1[NP][NMAX];
	struct zinf_engine_stats st;
	read_master(&m, before);
	read16(&m, h0);
	cr_assert_eq(zinf_engine_loss_scale(m.e), 16.0);

	/* overflow 1: skipped, hysteresis 2 -> 1, the scale stays 16 */
	cr_assert_eq(train_step(&m, 0, zinf_engine_loss_scale(m.e), 1), 2);
	get_stats(&m, &st);
	cr_assert_eq(st.skipped_steps, 1);
	cr_assert(st.overflow);
	cr_assert(!isfinite(st.grad_norm));
	cr_assert_eq(st.loss_scale, 16.0);
	cr_assert_eq(zinf_engine_steps(m.e), 0);
	read_master(&m, after);
	expect_bits(after, before, "master after a skipped step");
	read16(&m, h1);
	cr_assert(memcmp(h0, h1, sizeof(h0)) == 0, "16-bit parameters changed by a skipped step");

	/* overflow 2: skipped, the scale halves to 8 */
	cr_assert_eq(train_step(&m, 0, zinf_engine_loss_scale(m.e), 2), 2);
	get_stats(&m, &st);
	cr_assert_eq(st.skipped_steps, 2);
	cr_assert_eq(st.loss_scale, 8.0);
	cr_assert_eq(zinf_engine_loss_scale(m.e), 8.0);

	/* clean: stepped with grad_scale 1 / (8 * clip); iterations since the overflow 1: 8 */
	static struct ref r;
	ref_init(&r);
	for (int p = 0; p < NP; p++) { /* the 16-bit initial values: exact (dyadic) */
		for (uint64_t i = 0; i < numel[p]; i++) {
			cr_assert_eq(before[p][i], r.p[p][i]);
		}
	}
	cr_assert_eq(train_step(&m, 1, 8.0, -1), 1);
	ref_step(&r, 1, 1, 1.0); /* the gradients handed were * 8: exact, / 8 by the engine */
	get_stats(&m, &st);
	cr_assert(!st.overflow);
	cr_assert(fabs(st.grad_norm - r.norm) <= 1e-12 * r.norm, "grad_norm %.17g vs %.17g",
		  st.grad_norm, r.norm);
	cr_assert_eq(st.loss_scale, 8.0);
	cr_assert_eq(zinf_engine_steps(m.e), 1);
	read_master(&m, after);
	expect_bits(after, r.p, "fp16 step after the overflows");

	/* clean again: loss_scale_window 2 clean iterations since the overflow: doubles to 16 */
	cr_assert_eq(train_step(&m, 2, 8.0, -1), 1);
	ref_step(&r, 2, 2, 1.0);
	cr_assert_eq(zinf_engine_loss_scale(m.e), 16.0);
	get_stats(&m, &st);
	cr_assert_eq(st.skipped_steps, 2);
	read_master(&m, after);
	expect_bits(after, r.p, "fp16 second step");
	model_free(&m);
	if (m.dir) {
		zt_rmtree(m.dir);
		free(m.dir);
	}
}

Test(engine_clip, fp16_overflow_skips_and_scales_none)
{
	fp16_case(ZINF_OFFLOAD_NONE);
}

Test(engine_clip, fp16_overflow_skips_and_scales_cpu)
{
	fp16_case(ZINF_OFFLOAD_CPU);
}

Test(engine_clip, fp16_overflow_skips_and_scales_nvme)
{
	fp16_case(ZINF_OFFLOAD_NVME);
}

/* a static scale: an overflow is skipped, the scale never changes */
Test(engine_clip, fp16_static_scale_skips)
{
	struct model m = {0};
	struct zinf_engine_opts o;
	fp16_opts(&o, ZINF_OFFLOAD_CPU, NULL);
	o.fp16.loss_scale = 4.0;
	model_make(&m, &o);
	cr_assert_eq(zinf_engine_loss_scale(m.e), 4.0);
	cr_assert_eq(train_step(&m, 0, 4.0, 0), 2);
	cr_assert_eq(train_step(&m, 0, 4.0, 0), 2);
	cr_assert_eq(zinf_engine_loss_scale(m.e), 4.0);
	for (int s = 0; s < 3; s++) {
		cr_assert_eq(train_step(&m, s, 4.0, -1), 1);
	}
	cr_assert_eq(zinf_engine_loss_scale(m.e), 4.0);
	struct zinf_engine_stats st;
	get_stats(&m, &st);
	cr_assert_eq(st.skipped_steps, 2);
	cr_assert_eq(zinf_engine_steps(m.e), 3);
	/* no clipping: grad_scale 1/4 on gradients * 4: the reference without clipping */
	static struct ref r;
	static float got[NP][NMAX];
	ref_init(&r);
	for (int s = 0; s < 3; s++) {
		ref_step(&r, s + 1, s, 0.0);
	}
	read_master(&m, got);
	expect_bits(got, r.p, "static scale 4");
	model_free(&m);
}

/* an overflow with the scale at min_loss_scale: -ERANGE, the engine failed (DeepSpeed stops) */
Test(engine_clip, fp16_overflow_at_min_scale_fails)
{
	struct model m = {0};
	struct zinf_engine_opts o;
	fp16_opts(&o, ZINF_OFFLOAD_CPU, NULL);
	o.fp16.initial_scale_power = 1; /* 2 */
	o.fp16.min_loss_scale = 2;
	o.fp16.hysteresis = 1;
	model_make(&m, &o);
	cr_assert_eq(micro(&m, 0, 0, 2.0, 0), 0);
	int rc = micro(&m, 0, 1, 2.0, -1);
	cr_assert_eq(rc, -ERANGE, "%d %s", rc, zinf_last_error());
	cr_assert(strstr(zinf_last_error(), "min_loss_scale"), "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_fetch(m.e, 0), -ERANGE); /* failed: every later call */
	model_free(&m);
}

/* ---- options ------------------------------------------------------------------------------- */

Test(engine_clip, options_checked)
{
	struct zinf_engine_opts o;
	struct zinf_engine *e = NULL;
	base_opts(&o, ZINF_OFFLOAD_NONE, NULL);
	o.dtype = ZINF_BF16;
	o.fp16.enabled = true;
	cr_assert_eq(zinf_engine_create(&o, &e), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "fp16.enabled"), "%s", zinf_last_error());
	base_opts(&o, ZINF_OFFLOAD_NONE, NULL);
	o.gradient_clipping = -1.0;
	cr_assert_eq(zinf_engine_create(&o, &e), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "gradient_clipping"), "%s", zinf_last_error());
	base_opts(&o, ZINF_OFFLOAD_NONE, NULL);
	o.gradient_clipping = NAN;
	cr_assert_eq(zinf_engine_create(&o, &e), -EINVAL);
	fp16_opts(&o, ZINF_OFFLOAD_NONE, NULL);
	o.fp16.hysteresis = 0;
	cr_assert_eq(zinf_engine_create(&o, &e), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "hysteresis"), "%s", zinf_last_error());
	cr_assert_null(e);
	/* fp16 off: the scale the trainer multiplies by is 1 */
	base_opts(&o, ZINF_OFFLOAD_NONE, NULL);
	cr_assert_eq(zinf_engine_create(&o, &e), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_loss_scale(e), 1.0);
	zinf_engine_destroy(e);
}

Test(engine_clip, config_fills_engine_options)
{
	struct zinf_train_config c;
	zinf_config_init(&c);
	const char *text = "{\"train_batch_size\": 1, \"gradient_clipping\": 0.5,"
			   " \"fp16\": {\"enabled\": true, \"initial_scale_power\": 8,"
			   " \"hysteresis\": 3}}";
	int rc = zinf_config_read_string(text, "clip.json", NULL, &c);
	cr_assert_eq(rc, 0, "%d %s", rc, zinf_last_error());
	cr_assert_eq(c.engine.gradient_clipping, 0.5);
	cr_assert_eq(c.gradient_clipping, 0.5);
	cr_assert(c.engine.fp16.enabled);
	cr_assert_eq(c.engine.fp16.initial_scale_power, 8);
	cr_assert_eq(c.engine.fp16.hysteresis, 3);
	cr_assert_eq(c.engine.dtype, ZINF_F16);
	zinf_config_fini(&c);
	zinf_config_init(&c);
	cr_assert_eq(zinf_config_read_string("{\"train_batch_size\": 1}", "plain.json", NULL, &c),
		     0);
	cr_assert_eq(c.engine.gradient_clipping, 0.0);
	cr_assert(!c.engine.fp16.enabled);
	cr_assert_eq(c.engine.fp16.hysteresis, 2);
	zinf_config_fini(&c);
}
