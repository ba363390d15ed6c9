/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/test_model.h: the small models of the clipping and speculation tests
 * (test_engine_clip.c, test_engine_spec.c, test_engine_rollback.c): n parameters registered from
 * host arrays of initial values, the engine initialised, an fp32 gradient buffer per parameter
 * in the engine's device memory. Criterion asserts. Each test file keeps its own shapes.
 */
#ifndef ZINF_TEST_MODEL_H
#define ZINF_TEST_MODEL_H

#include <criterion/criterion.h>
#include <stdlib.h>

#include "zinf/engine.h"

/* Register, init, allocate: init[p] receives val(p, i) for its numel[p] elements (freed by
 * tm_free), gdev[p] numel[p] floats of device memory. */
static inline void
tm_make(struct zinf_engine *e, int n, const char *const names[], const uint64_t numel[],
	const int layer[], float (*val)(int, uint64_t), float *init[], float *gdev[])
{
	for (int p = 0; p < n; p++) {
		init[p] = malloc(numel[p] * sizeof(float));
		cr_assert(init[p]);
		for (uint64_t i = 0; i < numel[p]; i++) {
			init[p][i] = val(p, i);
		}
		struct zinf_param_desc d;
		zinf_param_desc_init(&d);
		d.name = names[p];
		d.numel = numel[p];
		d.layer = layer[p];
		d.init = init[p];
		d.init_dtype = ZINF_F32;
		cr_assert_eq(zinf_engine_add_param(e, &d), p);
	}
	int rc = zinf_engine_init(e);
	cr_assert_eq(rc, 0, "zinf_engine_init: %d %s", rc, zinf_last_error());
	for (int p = 0; p < n; p++) {
		cr_assert_eq(
			zinf_device_alloc(zinf_engine_device(e), numel[p] * 4, (void **)&gdev[p]),
			0);
	}
}

static inline void
tm_free(struct zinf_engine *e, int n, float *init[], float *gdev[])
{
	for (int p = 0; p < n; p++) {
		zinf_device_free(zinf_engine_device(e), gdev[p]);
		free(init[p]);
	}
}

#endif
