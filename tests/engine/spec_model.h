/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/spec_model.h: the speculative-step tests' model and steps (test_engine_spec.c,
 * test_spec_review.c): five parameters in three layers, 20 steps mixing plain, clipped and
 * fp16-overflow steps, initial values and dyadic gradients (sums stay exact).
 */
#ifndef ZINF_TEST_SPEC_MODEL_H
#define ZINF_TEST_SPEC_MODEL_H

#include <stdint.h>

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

#endif
