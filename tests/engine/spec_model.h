/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/spec_model.h: the speculative-step tests' model and steps (test_engine_spec.c,
 * test_spec_review.c): five parameters in three layers, 20 steps mixing plain, clipped and
 * fp16-overflow steps, initial values and dyadic gradients (sums stay exact), the engine and
 * its model (struct model: spec_model_create, model_free), what a step leaves (struct seen), and
 * one micro-batch's forward and backward through the engine (spec_passes).
 */
#ifndef ZINF_TEST_SPEC_MODEL_H
#define ZINF_TEST_SPEC_MODEL_H

#include <criterion/criterion.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>

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
