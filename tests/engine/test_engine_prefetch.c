/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/test_engine_prefetch.c: stage 3's prefetch with the parameters on NVMe, one
 * process (single collectives, host device: every stream is a thread, so a store buffer handed
 * back before the copy out of it is done shows as wrong bits). Every value a fetch gathers
 * (forward and backward, every step) is compared bit for bit with a run whose parameters live
 * on the CPU tier without a trace; the statistics show the trace followed (hits), the prefetch
 * gathering ahead when the partitions are read, and the budgets kept. No timing is asserted.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "zinf/engine.h"

#define NL	    5	     /* layers */
#define NP	    (3 * NL) /* parameters: a, b (gathered) and c (persistent) per layer */
#define STEPS	    3
#define GAS	    2
#define LAYER_ELEMS (600 + 400) /* a + b: W = 1, no padding */
#define PERSIST	    40		/* c */
#define BUSY	    (16u << 20) /* floats */

static const uint64_t pnumel[3] = {600, 400, PERSIST};

struct pcfg {
	enum zinf_offload_device pt;
	bool trace;
	uint32_t buffers;    /* offload_param.buffer_count */
	uint64_t max_in_cpu; /* offload_param.max_in_cpu */
	uint64_t pf, live;   /* stage3_prefetch_bucket_size, stage3_max_live_parameters */
	uint64_t reuse;	     /* stage3_max_reuse_distance */
	bool check_ahead;    /* assert the prefetch gathered the next layer (see prun) */
	bool busy;	     /* the compute stream busy before each release (see prun) */
};

/* What a run gathered: for each fetch in order, the 16-bit values of its layer's parameters. */
struct pout {
	uint16_t *bits;
	size_t n, cap;
	float *master[NP];
	struct zinf_engine_stats st;
};

static int
init_val(void *ctx, uint32_t param, uint64_t first, uint64_t count, float *out)
{
	(void)ctx;
	for (uint64_t i = 0; i < count; i++) {
		out[i] = (float)((param * 37 + first + i) % 23) / 32.0f - 0.3f;
	}
	return 0;
}

static float
pgrad(uint32_t id, uint64_t i, int micro, int step)
{
	return (float)((int)((i * 7 + id * 5 + (uint64_t)micro * 3 + (uint64_t)step * 13) % 21) -
		       10) /
	       64.0f;
}

static void
keep(struct pout *o, const void *src, size_t n)
{
	if (o->n + n > o->cap) {
		o->cap = (o->n + n) * 2;
		o->bits = realloc(o->bits, o->cap * 2);
		cr_assert(o->bits);
	}
	memcpy(o->bits + o->n, src, n * 2);
	o->n += n;
}

/* Fetch layer l and keep the values of its parameters (after the compute stream's view). */
static void
fetch_keep(struct zinf_engine *e, int l, struct pout *o)
{
	cr_assert_eq(zinf_engine_fetch(e, l), 0, "fetch %d: %s", l, zinf_last_error());
	cr_assert_eq(zinf_stream_sync(zinf_engine_compute_stream(e)), 0);
	for (int j = 0; j < 3; j++) {
		void *d = NULL;
		cr_assert_eq(zinf_engine_param(e, (uint32_t)(3 * l + j), &d), 0);
		keep(o, d, pnumel[j]);
	}
}

static void
prun(const struct pcfg *c, const char *dir, const char *prefix, struct pout *o)
{
	memset(o, 0, sizeof(*o));
	struct zinf_engine_opts eo;
	zinf_engine_opts_init(&eo);
	eo.device_backend = "host";
	eo.comm_backend = "single";
	eo.optimizer.lr = 1e-2f;
	eo.stage = 3;
	eo.gradient_accumulation_steps = GAS;
	eo.offload_optimizer.device = ZINF_OFFLOAD_CPU;
	eo.offload_param.device = c->pt;
	if (c->pt == ZINF_OFFLOAD_NVME) {
		eo.offload_param.n_paths = 1;
		eo.offload_param.nvme_path[0] = dir;
		eo.offload_param.buffer_count = c->buffers;
		eo.offload_param.max_in_cpu = c->max_in_cpu;
	}
	eo.swap_prefix = prefix;
	eo.record_trace = c->trace;
	eo.stage3_prefetch_bucket_size = c->pf;
	eo.stage3_max_live_parameters = c->live;
	eo.stage3_max_reuse_distance = c->reuse;
	eo.stage3_param_persistence_threshold = 60;
	eo.sub_group_size = 700; /* sub-groups across layers: stepped during backward */
	eo.reduce_bucket_size = 500;
	struct zinf_engine *e = NULL;
	cr_assert_eq(zinf_engine_create(&eo, &e), 0, "%s", zinf_last_error());
	for (int i = 0; i < NP; i++) {
		char name[16];
		snprintf(name, sizeof(name), "l%d.%c", i / 3, 'a' + i % 3);
		struct zinf_param_desc d;
		zinf_param_desc_init(&d);
		d.name = name;
		d.numel = pnumel[i % 3];
		d.layer = i / 3;
		d.init_fn = init_val;
		cr_assert_eq(zinf_engine_add_param(e, &d), i);
	}
	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
	struct zinf_stream *cs = zinf_engine_compute_stream(e);
	void *g[NP];
	float *f = malloc(600 * 4);
	for (int i = 0; i < NP; i++) {
		cr_assert_eq(zinf_device_alloc(zinf_engine_device(e), pnumel[i % 3] * 2, &g[i]), 0);
	}
	/* busy: BUSY floats filled on the compute stream before each layer's gradients (which the
	   engine's copy stream waits for) and before each release keep the streams behind, so the
	   copies out of the store queued by the next fetches run late: a store buffer handed back
	   before its copy is done has been read into again by then */
	float *busy = NULL;
	if (c->busy) {
		cr_assert_eq(zinf_device_alloc(zinf_engine_device(e), BUSY * 4, (void **)&busy), 0);
	}
	struct zinf_engine_stats st = {.size = sizeof(st)};
	for (int step = 1; step <= STEPS; step++) {
		for (int m = 0; m < GAS; m++) {
			struct zinf_engine_stats s0 = {.size = sizeof(s0)};
			cr_assert_eq(zinf_engine_get_stats(e, &s0), 0);
			for (int l = 0; l < NL; l++) {
				fetch_keep(e, l, o);
				cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
				/* the prefetch stays within its budget: beyond the fetched layer
				   and the persistent parameters, at most the bucket is gathered */
				cr_assert_leq(st.live_elems,
					      st.persistent_elems + (uint64_t)LAYER_ELEMS + c->pf,
					      "step %d micro %d layer %d", step, m, l);
				/* micro-batch 2 follows the trace over partitions all read in
				   micro-batch 1 and cached (no step wrote since): the next layer
				   is gathered ahead */
				if (c->check_ahead && m == 1 && l + 1 < NL) {
					cr_assert_geq(
						st.live_elems,
						st.persistent_elems + 2ull * LAYER_ELEMS,
						"step %d layer %d: layer %d not gathered ahead",
						step, l, l + 1);
				}
				if (busy) {
					zinf_device_fill(cs, busy, ZINF_F32, 1.0f, BUSY);
				}
				cr_assert_eq(zinf_engine_release(e, l), 0);
			}
			for (int l = NL - 1; l >= 0; l--) {
				fetch_keep(e, l, o); /* the compute stream is idle: g is free */
				for (int j = 2; j >= 0; j--) {
					uint32_t id = (uint32_t)(3 * l + j);
					for (uint64_t i = 0; i < pnumel[j]; i++) {
						f[i] = pgrad(id, i, m, step);
					}
					zinf_dtype_convert(g[id], ZINF_BF16, f, ZINF_F32,
							   pnumel[j]);
				}
				if (busy) {
					zinf_device_fill(cs, busy, ZINF_F32, 1.0f, BUSY);
				}
				for (int j = 2; j >= 0; j--) {
					uint32_t id = (uint32_t)(3 * l + j);
					cr_assert_eq(zinf_engine_grad(e, id, g[id], ZINF_BF16), 0,
						     "%s", zinf_last_error());
				}
				cr_assert_eq(zinf_engine_release(e, l), 0);
			}
			cr_assert_eq(zinf_engine_step(e), m == GAS - 1, "%s", zinf_last_error());
			if (c->trace && (step > 1 || m > 0)) {
				struct zinf_engine_stats s1 = {.size = sizeof(s1)};
				cr_assert_eq(zinf_engine_get_stats(e, &s1), 0);
				cr_assert_eq(s1.trace_hits - s0.trace_hits, 2 * NL,
					     "step %d micro %d: every fetch follows the trace",
					     step, m);
				cr_assert_eq(s1.trace_misses, 0);
				cr_assert_eq(s1.trace_invalidations, 0);
			}
		}
	}
	for (int i = 0; i < NP; i++) {
		o->master[i] = malloc(pnumel[i % 3] * 4);
		cr_assert_eq(zinf_engine_read_master(e, (uint32_t)i, o->master[i]), 0);
	}
	o->st.size = sizeof(o->st);
	cr_assert_eq(zinf_engine_get_stats(e, &o->st), 0);
	cr_assert_leq(o->st.peak_live_elems, c->live, "peak %llu over the bound %llu",
		      (unsigned long long)o->st.peak_live_elems, (unsigned long long)c->live);
	for (int i = 0; i < NP; i++) {
		zinf_device_free(zinf_engine_device(e), g[i]);
	}
	zinf_device_free(zinf_engine_device(e), busy);
	free(f);
	zinf_engine_destroy(e);
}

static void
pout_free(struct pout *o)
{
	free(o->bits);
	for (int i = 0; i < NP; i++) {
		free(o->master[i]);
	}
}

static void
same_bits(const struct pout *a, const struct pout *ref, const char *what)
{
	cr_assert_eq(a->n, ref->n, "%s: %zu values gathered, reference %zu", what, a->n, ref->n);
	for (size_t i = 0; i < a->n; i++) {
		if (a->bits[i] != ref->bits[i]) {
			cr_assert_fail("%s: gathered value %zu is 0x%04x, reference 0x%04x", what,
				       i, a->bits[i], ref->bits[i]);
		}
	}
	for (int i = 0; i < NP; i++) {
		cr_assert_eq(memcmp(a->master[i], ref->master[i], pnumel[i % 3] * 4), 0,
			     "%s: master of parameter %d differs", what, i);
	}
}

static const struct pcfg REF = {.pt = ZINF_OFFLOAD_CPU, .pf = 1000000, .live = 1000000};

/*
 * A store that reuses its buffers at once: as many buffers as a layer has partitions (a, b and
 * the persistent c), no CPU cache, so every fetch and every prefetch reads into a buffer the
 * previous one just gave back, while the step during backward writes new values through the
 * same buffers; the compute stream is kept busy before each release (so the copies out of the
 * store run late). The prefetch may gather two layers ahead and release drops a layer (no reuse),
 * so backward fetches read again. Every gathered value and the masters equal the reference's.
 */
Test(engine_prefetch, reused_store_buffers_gather_the_right_bits)
{
	char *dir = zt_mkdtemp(NULL);
	cr_assert(dir);
	struct pout ref, o;
	prun(&REF, dir, "pf-ref", &ref);
	const struct pcfg tight = {.pt = ZINF_OFFLOAD_NVME,
				   .trace = true,
				   .buffers = 3,
				   .pf = 2 * LAYER_ELEMS,
				   .live = 1000000,
				   .busy = true};
	prun(&tight, dir, "pf-tight", &o);
	same_bits(&o, &ref, "3 buffers, no cache");
	cr_assert_gt(o.st.nvme_read_bytes, 0, "the last window read its parameters");
	pout_free(&o);
	/* a live bound of two layers besides the persistent ones: the prefetch gives way */
	const struct pcfg live = {.pt = ZINF_OFFLOAD_NVME,
				  .trace = true,
				  .buffers = 4,
				  .pf = 3 * LAYER_ELEMS,
				  .live = NL * PERSIST + 2 * LAYER_ELEMS,
				  .busy = true};
	prun(&live, dir, "pf-live", &o);
	same_bits(&o, &ref, "live bound of two layers");
	pout_free(&o);
	pout_free(&ref);
	zt_rmtree(dir);
	free(dir);
}

/*
 * With room for every partition in the cache, the second micro-batch of each step finds every
 * partition read: its fetches follow the trace (hits, asserted in prun), the layer after each
 * fetched one is gathered ahead (live elements), within the prefetch bucket, and the values are
 * the reference's. The step's new values are written through the cache (written data stays
 * there) and prefetches evict it when they need a buffer.
 */
Test(engine_prefetch, read_partitions_are_gathered_ahead_along_the_trace)
{
	char *dir = zt_mkdtemp(NULL);
	cr_assert(dir);
	struct pout ref, o;
	prun(&REF, dir, "pf-ref2", &ref);
	const struct pcfg cached = {.pt = ZINF_OFFLOAD_NVME,
				    .trace = true,
				    .buffers = 3 * NL + 1,
				    .max_in_cpu = 1000000,
				    .pf = 2 * LAYER_ELEMS,
				    .live = 1000000,
				    .check_ahead = true};
	prun(&cached, dir, "pf-cached", &o);
	same_bits(&o, &ref, "every partition cached");
	pout_free(&o);
	/* fewer buffers than partitions with the cache on: the prefetches evict it */
	const struct pcfg evict = {.pt = ZINF_OFFLOAD_NVME,
				   .trace = true,
				   .buffers = 5,
				   .max_in_cpu = 1000000,
				   .pf = 2 * LAYER_ELEMS,
				   .live = 1000000,
				   .busy = true};
	prun(&evict, dir, "pf-evict", &o);
	same_bits(&o, &ref, "5 buffers, cache on");
	pout_free(&o);
	pout_free(&ref);
	zt_rmtree(dir);
	free(dir);
}
