/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/test_engine_fetch.c: stage 3's fetch paths (engine/engine_fetch.c,
 * engine_trace.c) in one process (single collectives, host device with asynchronous streams):
 * every combination of optimizer and parameter tiers, with and without prefetch, the reuse
 * distance, tight live bounds and the step during backward, trains to the bits of the plain
 * configuration (both tiers on the CPU, no trace, the step after backward) through a trace
 * invalidation, and keeps the live bound. The prefetch with the parameters on NVMe, its
 * buffers and budgets: test_engine_prefetch.c.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "engine/engine_unit.h"
#include "zinf/engine.h"

/* ---- stage 3 tiers, prefetch, reuse, live bound and the step during backward agree --------- */

#define XN 6
static const uint64_t xnumel[XN] = {240, 105, 300, 50, 1000, 33};
static const int xlayer[XN] = {0, 0, 1, 2, 2, 3};

struct xcfg {
	enum zinf_offload_device ot, pt;
	bool sdb, trace;
	uint64_t live, pf, reuse, sg;
};

static float
xgrad(int id, uint64_t i, int micro, int step)
{
	return (float)((int)((i * 5 + (uint64_t)id * 3 + (uint64_t)micro * 7 +
			      (uint64_t)step * 11) %
			     19) -
		       9) /
	       64.0f;
}

/* 4 steps of 2 micro-batches; the forward of step 3's first micro-batch fetches 0, 2, 1, 3.
   Returns the masters and the fetched 16-bit values after the last step (malloc'ed). */
static void
xrun(const struct xcfg *c, const char *dir, const char *prefix, float *master[XN],
     uint16_t *half[XN])
{
	struct zinf_engine_opts o;
	base_opts(&o);
	o.stage = 3;
	o.gradient_accumulation_steps = 2;
	o.offload_optimizer.device = c->ot;
	o.offload_param.device = c->pt;
	if (c->ot == ZINF_OFFLOAD_NVME) {
		o.offload_optimizer.n_paths = 1;
		o.offload_optimizer.nvme_path[0] = dir;
	}
	if (c->pt == ZINF_OFFLOAD_NVME) {
		o.offload_param.n_paths = 1;
		o.offload_param.nvme_path[0] = dir;
	}
	o.swap_prefix = prefix;
	o.step_during_backward = c->sdb;
	o.record_trace = c->trace;
	o.stage3_max_live_parameters = c->live;
	o.stage3_prefetch_bucket_size = c->pf;
	o.stage3_max_reuse_distance = c->reuse;
	o.sub_group_size = c->sg;
	o.stage3_param_persistence_threshold = 60;
	o.reduce_bucket_size = 400;
	struct zinf_engine *e = make(&o);
	for (int i = 0; i < XN; i++) {
		char name[8] = {(char)('a' + i), 0};
		cr_assert_eq(add(e, name, xnumel[i], xlayer[i], init_val, NULL), i);
	}
	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
	struct zinf_stream *cs = zinf_engine_compute_stream(e);
	void *g[XN];
	for (int i = 0; i < XN; i++) {
		cr_assert_eq(zinf_device_alloc(zinf_engine_device(e), xnumel[i] * 2, &g[i]), 0);
	}
	for (int step = 1; step <= 4; step++) {
		for (int m = 0; m < 2; m++) {
			static const int fwd[4] = {0, 1, 2, 3}, alt[4] = {0, 2, 1, 3};
			const int *order = step == 3 && m == 0 ? alt : fwd;
			for (int f = 0; f < 4; f++) {
				cr_assert_eq(zinf_engine_fetch(e, order[f]), 0, "%s",
					     zinf_last_error());
				cr_assert_eq(zinf_engine_release(e, order[f]), 0);
			}
			for (int l = 3; l >= 0; l--) {
				cr_assert_eq(zinf_engine_fetch(e, l), 0, "%s", zinf_last_error());
				for (int i = XN - 1; i >= 0; i--) {
					if (xlayer[i] != l) {
						continue;
					}
					/* the compute stream may still read g[i] (previous cast) */
					zinf_stream_sync(cs);
					float *f = malloc(xnumel[i] * 4);
					for (uint64_t j = 0; j < xnumel[i]; j++) {
						f[j] = xgrad(i, j, m, step);
					}
					zinf_dtype_convert(g[i], ZINF_BF16, f, ZINF_F32, xnumel[i]);
					free(f);
					cr_assert_eq(
						zinf_engine_grad(e, (uint32_t)i, g[i], ZINF_BF16),
						0, "%s", zinf_last_error());
				}
				cr_assert_eq(zinf_engine_release(e, l), 0);
			}
			cr_assert_eq(zinf_engine_step(e), m == 1, "%s", zinf_last_error());
		}
	}
	for (int i = 0; i < XN; i++) {
		master[i] = malloc(xnumel[i] * 4);
		half[i] = malloc(xnumel[i] * 2);
		cr_assert_eq(zinf_engine_read_master(e, (uint32_t)i, master[i]), 0);
	}
	for (int l = 0; l < 4; l++) {
		cr_assert_eq(zinf_engine_fetch(e, l), 0);
		zinf_stream_sync(cs);
		for (int i = 0; i < XN; i++) {
			void *d;
			if (xlayer[i] == l) {
				cr_assert_eq(zinf_engine_param(e, (uint32_t)i, &d), 0);
				memcpy(half[i], d, xnumel[i] * 2);
			}
		}
		cr_assert_eq(zinf_engine_release(e, l), 0);
	}
	struct zinf_engine_stats st = {.size = sizeof(st)};
	cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
	cr_expect_leq(st.peak_live_elems, c->live, "peak %llu over the bound %llu",
		      (unsigned long long)st.peak_live_elems, (unsigned long long)c->live);
	for (int i = 0; i < XN; i++) {
		zinf_device_free(zinf_engine_device(e), g[i]);
	}
	zinf_engine_destroy(e);
}

/*
 * One rank: every tier combination, with and without prefetch/reuse/tight live bounds and the
 * step during backward, gives the same bits as the plain configuration (cpu/cpu, no trace,
 * step after backward), through a trace invalidation at step 3.
 */
Test(engine_fetch, stage3_configurations_bit_identical)
{
	char *dir = zt_mkdtemp(NULL);
	cr_assert(dir);
	const struct xcfg ref = {ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_CPU, false, false,
				 1000000,	   1000000,	     0,	    1000000};
	const struct xcfg cfg[] = {
		{ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, true, true, 1400, 500, 400, 1000000},
		{ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, true, true, 1300, 300, 2000, 1},
		{ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NVME, true, true, 1000000, 50000000, 1000000000,
		 500},
		{ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_CPU, true, true, 1100, 1300, 0, 1},
		{ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_CPU, false, true, 1500, 1500, 1500, 700},
	};
	float *rm[XN];
	uint16_t *rh[XN];
	xrun(&ref, dir, "configs-ref", rm, rh);
	for (int i = 0; i < XN; i++) { /* the reference trained: the masters moved */
		float v0;
		init_val(NULL, (uint32_t)i, 0, 1, &v0);
		cr_assert_neq(rm[i][0], v0, "parameter %c did not change", 'a' + i);
	}
	for (size_t c = 0; c < sizeof(cfg) / sizeof(cfg[0]); c++) {
		float *m[XN];
		uint16_t *h[XN];
		char prefix[32];
		snprintf(prefix, sizeof(prefix), "configs-%zu", c);
		xrun(&cfg[c], dir, prefix, m, h);
		for (int i = 0; i < XN; i++) {
			cr_expect_eq(memcmp(m[i], rm[i], xnumel[i] * 4), 0,
				     "configuration %zu: master of %c differs", c, 'a' + i);
			cr_expect_eq(memcmp(h[i], rh[i], xnumel[i] * 2), 0,
				     "configuration %zu: fetched %c differs", c, 'a' + i);
			free(m[i]);
			free(h[i]);
		}
	}
	for (int i = 0; i < XN; i++) {
		free(rm[i]);
		free(rh[i]);
	}
	zt_rmtree(dir);
	free(dir);
}
