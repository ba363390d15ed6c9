/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/engine_unit.h: what the one-process engine tests that build their models by hand
 * share (test_engine_param.c, test_engine_stats.c, test_engine_fetch.c, test_engine_worker.c):
 * the base options (host device, single comm, lr 1e-2, bf16 parameters), create with an assert,
 * registration of one parameter, a deterministic initial value and a bf16 gradient. Criterion
 * asserts.
 */
#ifndef ZINF_TEST_ENGINE_UNIT_H
#define ZINF_TEST_ENGINE_UNIT_H

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdlib.h>

#include "zinf/device.h"
#include "zinf/engine.h"

static inline void
base_opts(struct zinf_engine_opts *o)
{
	zinf_engine_opts_init(o);
	o->device_backend = "host";
	o->comm_backend = "single";
	o->optimizer.lr = 1e-2f;
	o->dtype = ZINF_BF16; /* the tests read and hand 16-bit values */
}

/* base_opts at stage 3 with the parameters on NVMe in dir (swap files named prefix), the
 * optimizer on the CPU, nothing persistent, no trace: every fetch goes to the store. */
static inline void
nvme_param_opts(struct zinf_engine_opts *o, const char *dir, const char *prefix)
{
	base_opts(o);
	o->stage = 3;
	o->offload_optimizer.device = ZINF_OFFLOAD_CPU;
	o->offload_param.device = ZINF_OFFLOAD_NVME;
	o->offload_param.n_paths = 1;
	o->offload_param.nvme_path[0] = dir;
	o->swap_prefix = prefix;
	o->stage3_param_persistence_threshold = 0;
	o->record_trace = false;
}

static inline struct zinf_engine *
make(const struct zinf_engine_opts *o)
{
	struct zinf_engine *e = NULL;
	cr_assert_eq(zinf_engine_create(o, &e), 0, "create: %s", zinf_last_error());
	return e;
}

/* Register `name` of numel elements in `layer`, its initial values from fn (NULL: zeros). */
static inline int
add(struct zinf_engine *e, const char *name, uint64_t numel, int layer, zinf_param_init_fn fn,
    void *ctx)
{
	struct zinf_param_desc d;
	zinf_param_desc_init(&d);
	d.name = name;
	d.numel = numel;
	d.layer = layer;
	d.init_fn = fn;
	d.init_ctx = ctx;
	return zinf_engine_add_param(e, &d);
}

/* An init_fn: a value in [-0.25, 0.5) from the parameter and the element's index. */
static inline int
init_val(void *ctx, uint32_t param, uint64_t first, uint64_t count, float *out)
{
	(void)ctx;
	for (uint64_t i = 0; i < count; i++) {
		out[i] = (float)((param * 31 + first + i) % 13) / 16.0f - 0.25f;
	}
	return 0;
}

/* A bf16 gradient of n elements on the engine's device, values k/64 (exact in bf16) varied by
 * salt; free with zinf_device_free. */
static inline void *
grad16(struct zinf_engine *e, uint64_t n, int salt)
{
	void *g;
	float *f = malloc(n * sizeof(float));
	cr_assert(f);
	for (uint64_t i = 0; i < n; i++) {
		f[i] = (float)((int)((i * 7 + (uint64_t)salt) % 17) - 8) / 64.0f;
	}
	cr_assert_eq(zinf_device_alloc(zinf_engine_device(e), n * 2, &g), 0);
	cr_assert_eq(zinf_dtype_convert(g, ZINF_BF16, f, ZINF_F32, n), 0);
	free(f);
	return g;
}

#endif
