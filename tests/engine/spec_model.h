/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/spec_model.h: the speculative-step tests' model and steps (test_engine_spec.c,
 * test_engine_rollback.c): five parameters in three layers, 20 steps mixing plain, clipped and
 * fp16-overflow steps, initial values and dyadic gradients (sums stay exact), the engine and
 * its model (struct model: spec_model_create, model_free), what a step leaves (struct seen), and
 * one micro-batch's forward and backward through the engine (spec_passes), a step's record
 * (spec_record) and the comparison of two runs' steps (spec_expect_same).
 */
#ifndef ZINF_TEST_SPEC_MODEL_H
#define ZINF_TEST_SPEC_MODEL_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "zinf/device.h"
#include "zinf/engine.h"
#include "common/test_util.h"
#include "engine/test_model.h"

#define NP    5
#define NL    3
#define NMAX  300
#define STEPS 20
#define CLIP  80.0
static const uint64_t numel[NP] = {300, 40, 200, 7, 120};
static const int layer_of[NP] = {0, 0, 1, 1, 2};
static const char *const names[NP] = {"a", "b", "c", "d", "e"};

enum kind { PLAIN, CLIPPED, OVERFLOW };

/* the steps: plain, clip and overflow steps mixed (four overflows: the scale stays above the
   minimum) */
static inline enum kind
kind_of(int s)
{
	static const enum kind k[STEPS] = {PLAIN, CLIPPED, OVERFLOW, PLAIN,    CLIPPED,
					   PLAIN, PLAIN,   OVERFLOW, CLIPPED,  CLIPPED,
					   PLAIN, CLIPPED, PLAIN,    OVERFLOW, PLAIN,
					   PLAIN, CLIPPED, OVERFLOW, PLAIN,    CLIPPED};
	return k[s];
}

static inline float
init_val(int p, uint64_t i)
{
	return (float)((int)((i * 13 + (uint64_t)p * 7) % 33) - 16) / 32.0f;
}

/* dyadic with few bits: sums of two micro-batches, times powers of two, stay exact */
static inline float
grad_val(int p, uint64_t i, int s, int m)
{
	return (float)((int)((i * 37 + (uint64_t)p * 11 + (uint64_t)s * 5 + (uint64_t)m * 3) % 61) -
		       30) /
	       16.0f;
}

/* The engine and its model (test_model.h), and what one step leaves. */
struct model {
	struct zinf_engine *e;
	char *dir;
	float *gdev[NP];
	float *init[NP];
};

/* What one step leaves: the 16-bit parameters read in the first forward, its loss, the master
 * weights after the step, the step's result and statistics. */
struct seen {
	uint16_t p16[NP][NMAX];
	double loss;
	float master[NP][NMAX];
	int rc;
	struct zinf_engine_stats st;
};

/*
 * The model's engine options shared by its tests: the host device, one process, the stage and
 * tiers (dir for the NVMe ones), `buffers` of the optimizer's, small buckets and whole-parameter
 * sub-groups (64: five), no cache, persistence or reuse, two micro-batches, the optimizer `kind`
 * with lr 0.01, eps 0.05 (large: the update depends on the gradient's size) and weight decay
 * 0.01. The callers set the dtype, clipping, fp16 and the rest.
 */
static inline void
spec_model_opts(struct zinf_engine_opts *o, int stage, enum zinf_offload_device opt,
		enum zinf_offload_device param, uint32_t buffers, const char *dir,
		enum zinf_optim_kind kind)
{
	zinf_engine_opts_init(o);
	o->device_backend = "host";
	o->comm_backend = "single";
	o->stage = stage;
	o->offload_optimizer.device = opt;
	o->offload_optimizer.buffer_count = buffers;
	if (opt == ZINF_OFFLOAD_NVME) {
		o->offload_optimizer.n_paths = 1;
		o->offload_optimizer.nvme_path[0] = dir;
	}
	o->offload_param.device = param;
	if (param == ZINF_OFFLOAD_NVME) {
		o->offload_param.n_paths = 1;
		o->offload_param.nvme_path[0] = dir;
	}
	o->offload_param.buffer_size = 4096;
	o->offload_param.max_in_cpu = 0;
	o->stage3_param_persistence_threshold = 0;
	o->stage3_max_reuse_distance = 0;
	o->stage3_prefetch_bucket_size = 300;
	o->sub_group_size = 64; /* whole parameters: five sub-groups */
	o->reduce_bucket_size = 256;
	o->allgather_bucket_size = 256;
	o->gradient_accumulation_steps = 2;
	zinf_optimizer_opts_init(&o->optimizer, kind);
	o->optimizer.lr = 0.01f;
	o->optimizer.eps = 0.05f;
	o->optimizer.weight_decay = 0.01f;
}

/* The engine with options o, the model's parameters registered and initialised. */
static inline void
spec_model_create(struct model *m, const struct zinf_engine_opts *o)
{
	int rc = zinf_engine_create(o, &m->e);
	cr_assert_eq(rc, 0, "zinf_engine_create: %d %s", rc, zinf_last_error());
	tm_make(m->e, NP, names, numel, layer_of, init_val, m->init, m->gdev);
}

static inline void
model_free(struct model *m)
{
	tm_free(m->e, NP, m->init, m->gdev);
	zinf_engine_destroy(m->e);
	if (m->dir) {
		zt_rmtree(m->dir);
		free(m->dir);
	}
}

/* A 16-bit parameter's value (bf16 or IEEE half); asserts it is finite. */
static inline float
half_to_float(uint16_t h, bool bf16)
{
	if (bf16) {
		uint32_t u = (uint32_t)h << 16;
		float f;
		memcpy(&f, &u, 4);
		cr_assert(isfinite(f), "a 16-bit parameter is not finite");
		return f;
	}
	uint32_t sign = (uint32_t)(h >> 15) << 31, ex = (h >> 10) & 31, man = h & 1023;
	float v = ex == 0 ? ldexpf((float)man, -24) : ldexpf((float)(man | 1024), (int)ex - 25);
	cr_assert(ex != 31, "a 16-bit parameter is not finite");
	uint32_t bits;
	memcpy(&bits, &v, 4);
	bits |= sign;
	memcpy(&v, &bits, 4);
	return v;
}

/* What step s left on m (the 16-bit values were read by spec_passes into out->p16): a loss
 * computed from them, the master weights, the statistics. */
static inline void
spec_record(struct model *m, struct seen *out, bool bf16)
{
	out->loss = 0;
	for (int p = 0; p < NP; p++) {
		for (uint64_t i = 0; i < numel[p]; i++) {
			double w = half_to_float(out->p16[p][i], bf16);
			out->loss += w * w * (double)(1 + (i % 7));
		}
		int r = zinf_engine_read_master(m->e, (uint32_t)p, out->master[p]);
		cr_assert_eq(r, 0, "read_master: %d %s", r, zinf_last_error());
	}
	memset(&out->st, 0, sizeof(out->st));
	out->st.size = sizeof(out->st);
	cr_assert_eq(zinf_engine_get_stats(m->e, &out->st), 0);
}

/* The speculating run's step s (a) against the other's (b): the same bits everywhere, the loss
 * scale and overflow as the step's kind k says, clipping active exactly on clip steps. */
static inline void
spec_expect_same(const struct seen *a, const struct seen *b, int s, enum kind k)
{
	cr_assert_eq(a->rc, b->rc, "step %d: %d vs %d", s, a->rc, b->rc);
	cr_assert_eq(a->rc, k == OVERFLOW ? 2 : 1, "step %d returned %d", s, a->rc);
	cr_assert(memcmp(a->p16, b->p16, sizeof(a->p16)) == 0, "step %d: 16-bit parameters differ",
		  s);
	cr_assert(memcmp(&a->loss, &b->loss, sizeof(a->loss)) == 0, "step %d: loss %.17g vs %.17g",
		  s, a->loss, b->loss);
	for (int p = 0; p < NP; p++) {
		for (uint64_t i = 0; i < numel[p]; i++) {
			cr_assert(memcmp(&a->master[p][i], &b->master[p][i], 4) == 0,
				  "step %d: master %s[%llu]: %.9g vs %.9g (speculative vs "
				  "not)",
				  s, names[p], (unsigned long long)i, a->master[p][i],
				  b->master[p][i]);
		}
	}
	cr_assert_eq(a->st.loss_scale, b->st.loss_scale, "step %d", s);
	cr_assert_eq(a->st.overflow, k == OVERFLOW, "step %d", s);
	cr_assert_eq(b->st.overflow, k == OVERFLOW, "step %d", s);
	if (k != OVERFLOW) {
		cr_assert(memcmp(&a->st.grad_norm, &b->st.grad_norm, 8) == 0, "step %d", s);
		/* the gradients were chosen so: clipping is active exactly on clip steps */
		cr_assert(k == CLIPPED ? a->st.grad_norm > CLIP : a->st.grad_norm < CLIP,
			  "step %d (%s): norm %g, threshold %g", s, k == CLIPPED ? "clip" : "plain",
			  a->st.grad_norm, CLIP);
	}
}

/*
 * One micro-batch's forward and backward on the model of this header: forward (fetch, the
 * 16-bit values into p16 in micro-batch 0, release), backward in reverse handing
 * grad_val * factor * loss scale through gdev (inf: element 3 of parameter "c" is +infinity).
 * The caller steps (or not).
 */
static inline void
spec_passes(struct zinf_engine *e, float *const gdev[NP], uint16_t p16[NP][NMAX], int s, int mi,
	    double factor, bool inf)
{
	struct zinf_stream *cs = zinf_engine_compute_stream(e);
	double S = zinf_engine_loss_scale(e);
	for (int l = 0; l < NL; l++) {
		cr_assert_eq(zinf_engine_fetch(e, l), 0, "%s", zinf_last_error());
		for (int p = 0; mi == 0 && p < NP; p++) {
			void *dev;
			if (layer_of[p] != l) {
				continue;
			}
			cr_assert_eq(zinf_engine_param(e, (uint32_t)p, &dev), 0);
			cr_assert_eq(zinf_device_copy(cs, p16[p], dev, numel[p] * 2, ZINF_COPY_D2H),
				     0);
		}
		cr_assert_eq(zinf_stream_sync(cs), 0);
		cr_assert_eq(zinf_engine_release(e, l), 0);
	}
	float h[NMAX];
	for (int l = NL - 1; l >= 0; l--) {
		cr_assert_eq(zinf_engine_fetch(e, l), 0, "%s", zinf_last_error());
		for (int p = NP - 1; p >= 0; p--) {
			if (layer_of[p] != l) {
				continue;
			}
			for (uint64_t i = 0; i < numel[p]; i++) {
				h[i] = (float)(grad_val(p, i, s, mi) * factor * S);
			}
			if (inf && p == 2) {
				h[3] = INFINITY;
			}
			cr_assert_eq(zinf_stream_sync(cs), 0);
			cr_assert_eq(zinf_device_copy(cs, gdev[p], h, numel[p] * 4, ZINF_COPY_H2D),
				     0);
			cr_assert_eq(zinf_stream_sync(cs), 0);
			int rc = zinf_engine_grad(e, (uint32_t)p, gdev[p], ZINF_F32);
			cr_assert_eq(rc, 0, "grad: %d %s", rc, zinf_last_error());
		}
		cr_assert_eq(zinf_engine_release(e, l), 0);
	}
}

#endif
