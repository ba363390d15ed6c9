/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/test_engine_decay.c: ZINF_PARAM_NO_DECAY (zinf_param_desc.flags). A model of two
 * weight matrices and three 1-D tensors (two biases and a norm weight, flagged), trained a few
 * AdamW steps with weight decay 0.1, against AdamW worked here in float64 step by step with the
 * decay applied to the matrices only (torch's order: p *= 1 - lr wd, then the Adam update), on
 * every optimizer tier (device memory of the "host" device, pinned CPU memory, NVMe), with the
 * step after backward and during it (sub-groups that mix flagged and unflagged parameters,
 * stepped while backward goes on: asserted), with accumulation, and with clipping (the
 * speculative step redone: roll-backs asserted). Every master weight is within fp32 rounding of
 * the reference, and the references that decay everything or nothing are far from it on the
 * flagged or the unflagged tensors (so a flag ignored, or applied to all, fails). A checkpoint's
 * manifest names the flagged parameters. One process, "single" collectives, device "host" (or
 * ZINF_TEST_DEVICE=cuda: the device's Adam).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "zinf/checkpoint.h"
#include "zinf/device.h"
#include "zinf/engine.h"

#define NP    5
#define STEPS 6
#define LR    1e-2
#define WD    0.1
#define B1    0.9
#define B2    0.999
#define EPS   1e-8

/* Registered in this order; backward (flat) order is b1 w1 ln b0 w0, so the flagged b1 starts
 * the flat partition and ln, b0 are neighbours (one merged range). */
static const struct {
	const char *name;
	int layer;
	uint64_t rows, cols; /* cols 0: 1-D */
	bool no_decay;
} P[NP] = {
	{"w0", 0, 5, 7, false}, {"b0", 0, 7, 0, true}, {"ln", 1, 6, 0, true},
	{"w1", 1, 6, 5, false}, {"b1", 1, 5, 0, true},
};

static uint64_t
numel(int id)
{
	return P[id].rows * (P[id].cols ? P[id].cols : 1);
}

static float
init_value(int id, uint64_t i)
{
	return (float)(0.5 * cos(0.37 * (double)i + 1.1 * id));
}

static int
init_fn(void *ctx, uint32_t param, uint64_t first, uint64_t count, float *out)
{
	(void)ctx;
	for (uint64_t i = 0; i < count; i++) {
		out[i] = init_value((int)param, first + i);
	}
	return 0;
}

/* The gradient of element i of parameter id, step t (1-based), micro-batch m. */
static float
grad_value(int id, uint64_t i, int t, int m)
{
	return (float)(0.05 * sin(0.61 * (double)i + 1.7 * id + 0.83 * t + 0.29 * m) +
		       0.01 * (id + 1));
}

struct tcase {
	int stage;
	enum zinf_offload_device opt, param;
	uint64_t sub_group_size;
	bool sdb;
	uint32_t gas;
	double clip;
};

/* AdamW in float64 over STEPS steps; decay[id] says whether id decays. */
static void
reference(const struct tcase *c, const bool decay[NP], double *out[NP])
{
	static double m[NP][64], v[NP][64], g[NP][64];
	for (int id = 0; id < NP; id++) {
		for (uint64_t i = 0; i < numel(id); i++) {
			out[id][i] = init_value(id, i);
			m[id][i] = v[id][i] = 0;
		}
	}
	for (int t = 1; t <= STEPS; t++) {
		double sumsq = 0;
		for (int id = 0; id < NP; id++) {
			for (uint64_t i = 0; i < numel(id); i++) {
				g[id][i] = 0;
				for (uint32_t k = 0; k < c->gas; k++) {
					g[id][i] += grad_value(id, i, t, (int)k);
				}
				sumsq += g[id][i] * g[id][i];
			}
		}
		/* DeepSpeed's clip: the gradients times 1 / ((norm + 1e-6) / clip) when above 1 */
		double coef = c->clip > 0 ? (sqrt(sumsq) + 1e-6) / c->clip : 1;
		double scale = coef > 1 ? 1 / coef : 1;
		double bc1 = 1 - pow(B1, t), bc2 = 1 - pow(B2, t);
		for (int id = 0; id < NP; id++) {
			for (uint64_t i = 0; i < numel(id); i++) {
				double gi = g[id][i] * scale, *p = &out[id][i];
				m[id][i] = B1 * m[id][i] + (1 - B1) * gi;
				v[id][i] = B2 * v[id][i] + (1 - B2) * gi * gi;
				if (decay[id]) {
					*p *= 1 - LR * WD;
				}
				*p -= LR / bc1 * m[id][i] / (sqrt(v[id][i]) / sqrt(bc2) + EPS);
			}
		}
	}
}

static const char *
device(void)
{
	const char *d = getenv("ZINF_TEST_DEVICE");
	return d && *d ? d : "host";
}

/* Train case c; the masters into out[id]; the largest stepped_during_backward and rolled_back
 * of any step. */
static void
train(const struct tcase *c, const char *dir, float *out[NP], uint32_t *sdb, uint32_t *rolled)
{
	struct zinf_engine_opts o;
	zinf_engine_opts_init(&o);
	o.device_backend = device();
	o.comm_backend = "single";
	o.dtype = ZINF_F32;
	o.stage = c->stage;
	o.offload_optimizer.device = c->opt;
	o.offload_param.device = c->param;
	if (c->opt == ZINF_OFFLOAD_NVME) {
		o.offload_optimizer.n_paths = 1;
		o.offload_optimizer.nvme_path[0] = dir;
	}
	if (c->param == ZINF_OFFLOAD_NVME) {
		o.offload_param.n_paths = 1;
		o.offload_param.nvme_path[0] = dir;
	}
	o.offload_param.buffer_size = 1024;
	o.offload_param.max_in_cpu = 0;
	o.sub_group_size = c->sub_group_size;
	o.reduce_bucket_size = 16;
	o.stage3_param_persistence_threshold = 0;
	o.stage3_max_reuse_distance = 0;
	o.step_during_backward = c->sdb;
	o.gradient_accumulation_steps = c->gas;
	o.gradient_clipping = c->clip;
	o.swap_prefix = "decay";
	zinf_optimizer_opts_init(&o.optimizer, ZINF_OPTIM_ADAMW);
	o.optimizer.lr = (float)LR, o.optimizer.beta1 = (float)B1, o.optimizer.beta2 = (float)B2;
	o.optimizer.eps = (float)EPS, o.optimizer.weight_decay = (float)WD;
	struct zinf_engine *e = NULL;
	cr_assert_eq(zinf_engine_create(&o, &e), 0, "create: %s", zinf_last_error());
	for (int id = 0; id < NP; id++) {
		struct zinf_param_desc d;
		zinf_param_desc_init(&d);
		d.name = P[id].name;
		d.numel = numel(id);
		d.layer = P[id].layer;
		d.init_fn = init_fn;
		d.ndim = P[id].cols ? 2 : 1;
		d.shape[0] = P[id].rows;
		d.shape[1] = P[id].cols;
		d.flags = P[id].no_decay ? ZINF_PARAM_NO_DECAY : 0;
		cr_assert_eq(zinf_engine_add_param(e, &d), id, "%s", zinf_last_error());
	}
	cr_assert_eq(zinf_engine_init(e), 0, "init: %s", zinf_last_error());
	struct zinf_device *dev = zinf_engine_device(e);
	struct zinf_stream *cs = zinf_engine_compute_stream(e);
	float *gdev[NP], host[64];
	for (int id = 0; id < NP; id++) {
		cr_assert_eq(zinf_device_alloc(dev, numel(id) * sizeof(float), (void **)&gdev[id]),
			     0);
	}
	*sdb = *rolled = 0;
	for (int t = 1; t <= STEPS; t++) {
		for (uint32_t k = 0; k < c->gas; k++) {
			for (int l = 0; l < 2; l++) {
				cr_assert_eq(zinf_engine_fetch(e, l), 0, "%s", zinf_last_error());
				cr_assert_eq(zinf_engine_release(e, l), 0);
			}
			for (int l = 1; l >= 0; l--) {
				cr_assert_eq(zinf_engine_fetch(e, l), 0, "%s", zinf_last_error());
				for (int id = NP - 1; id >= 0; id--) {
					if (P[id].layer != l) {
						continue;
					}
					/* the copy out of host[] is done before it is rewritten */
					cr_assert_eq(zinf_stream_sync(cs), 0);
					for (uint64_t i = 0; i < numel(id); i++) {
						host[i] = grad_value(id, i, t, (int)k);
					}
					cr_assert_eq(zinf_device_copy(cs, gdev[id], host,
								      numel(id) * sizeof(float),
								      ZINF_COPY_H2D),
						     0);
					cr_assert_eq(zinf_engine_grad(e, (uint32_t)id, gdev[id],
								      ZINF_F32),
						     0, "%s", zinf_last_error());
				}
				cr_assert_eq(zinf_engine_release(e, l), 0);
			}
			int r = zinf_engine_step(e);
			cr_assert_eq(r, k == c->gas - 1 ? 1 : 0, "step %d micro %u: %d %s", t, k, r,
				     zinf_last_error());
		}
		struct zinf_engine_stats st = {.size = sizeof(st)};
		cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
		*sdb = st.stepped_during_backward > *sdb ? st.stepped_during_backward : *sdb;
		*rolled = st.rolled_back > *rolled ? st.rolled_back : *rolled;
	}
	for (int id = 0; id < NP; id++) {
		cr_assert_eq(zinf_engine_read_master(e, (uint32_t)id, out[id]), 0, "%s",
			     zinf_last_error());
	}
	cr_assert_eq(zinf_stream_sync(cs), 0);
	for (int id = 0; id < NP; id++) {
		zinf_device_free(dev, gdev[id]);
	}
	zinf_engine_destroy(e);
}

/* Largest |a - r| / (1 + |r|) over parameter id. */
static double
worst(const float *a, const double *r, int id)
{
	double w = 0;
	for (uint64_t i = 0; i < numel(id); i++) {
		w = fmax(w, fabs((double)a[i] - r[i]) / (1 + fabs(r[i])));
	}
	return w;
}

Test(engine_decay, flagged_parameters_step_without_weight_decay)
{
	/* stage, optimizer tier, parameter tier, sub_group_size, step during backward, gas,
	   clipping. Sub-groups of 40: {b1 w1}, {ln b0}, {w0}; of 0: one per parameter. */
	static const struct tcase cases[] = {
		{0, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, 1000000, true, 1, 0},
		{1, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, 40, true, 1, 0},
		{2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, 40, true, 2, 0},
		{2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, 0, false, 1, 0},
		{2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, 40, true, 1, 0.05},
		{3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NVME, 40, true, 1, 0},
		{3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, 40, true, 1, 0},
		{3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_CPU, 1000000, false, 2, 0},
		{3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, 40, true, 1, 0.05},
	};
	/* fp32 against float64 over 6 Adam steps of lr 1e-2: rounding of ~1e-7 a step, far
	   below the decay's 6 x lr x wd x |p| (about 3e-3 for |p| of 0.5) */
	const double tol = 2e-6, apart = 1e-4;
	static float eng[NP][64];
	static double ref[NP][64], all[NP][64], none[NP][64];
	float *e_[NP];
	double *r_[NP], *a_[NP], *n_[NP];
	bool decay[NP], every[NP], never[NP];
	for (int id = 0; id < NP; id++) {
		e_[id] = eng[id], r_[id] = ref[id], a_[id] = all[id], n_[id] = none[id];
		decay[id] = !P[id].no_decay, every[id] = true, never[id] = false;
	}
	char *dir = zt_mkdtemp(NULL);
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		const struct tcase *c = &cases[k];
		char what[128];
		snprintf(what, sizeof(what),
			 "stage %d tiers %d/%d sub-groups %llu sdb %d gas %u clip %g", c->stage,
			 c->opt, c->param, (unsigned long long)c->sub_group_size, c->sdb, c->gas,
			 c->clip);
		uint32_t sdb, rolled;
		train(c, dir, e_, &sdb, &rolled);
		reference(c, decay, r_);
		reference(c, every, a_);
		reference(c, never, n_);
		if (c->sdb && c->sub_group_size < 100) {
			cr_assert_gt(sdb, 0, "%s: nothing stepped during backward", what);
		}
		if (c->clip > 0) {
			cr_assert_gt(rolled, 0, "%s: no speculated sub-group was redone", what);
		}
		for (int id = 0; id < NP; id++) {
			double w = worst(e_[id], r_[id], id);
			cr_assert_leq(w, tol, "%s: %s is %.3g from the reference", what, P[id].name,
				      w);
			/* the reference with the other choice for this tensor is far off */
			double other = worst(e_[id], P[id].no_decay ? a_[id] : n_[id], id);
			cr_assert_geq(other, apart,
				      "%s: %s is as close (%.3g) to the reference that %s it", what,
				      P[id].name, other,
				      P[id].no_decay ? "decays" : "does not decay");
		}
	}
	zt_rmtree(dir);
	free(dir);
}

/* flags is 0 after zinf_param_desc_init (every parameter decays, as before the field was one);
 * unknown flags are refused, naming the parameter and the bits. */
Test(engine_decay, unknown_flags_refused)
{
	struct zinf_engine_opts o;
	zinf_engine_opts_init(&o);
	o.device_backend = device();
	o.comm_backend = "single";
	struct zinf_engine *e = NULL;
	cr_assert_eq(zinf_engine_create(&o, &e), 0);
	struct zinf_param_desc d;
	zinf_param_desc_init(&d);
	cr_assert_eq(d.flags, 0);
	d.name = "x";
	d.numel = 4;
	d.flags = ZINF_PARAM_NO_DECAY | 0x10;
	cr_assert_eq(zinf_engine_add_param(e, &d), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "\"x\"") && strstr(zinf_last_error(), "0x10"), "%s",
		  zinf_last_error());
	d.flags = ZINF_PARAM_NO_DECAY;
	cr_assert_eq(zinf_engine_add_param(e, &d), 0, "%s", zinf_last_error());
	zinf_engine_destroy(e);
}

/* The manifest marks exactly the flagged parameters "no_decay": true (for readers). */
Test(engine_decay, checkpoint_manifest_records_no_decay)
{
	struct zinf_engine_opts o;
	zinf_engine_opts_init(&o);
	o.device_backend = device();
	o.comm_backend = "single";
	struct zinf_engine *e = NULL;
	cr_assert_eq(zinf_engine_create(&o, &e), 0);
	static const char *const names[] = {"dense.w", "dense.b"};
	for (int i = 0; i < 2; i++) {
		struct zinf_param_desc d;
		zinf_param_desc_init(&d);
		d.name = names[i];
		d.numel = 6;
		d.flags = i ? ZINF_PARAM_NO_DECAY : 0;
		cr_assert_eq(zinf_engine_add_param(e, &d), i, "%s", zinf_last_error());
	}
	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
	char *dir = zt_mkdtemp(NULL), path[4096];
	cr_assert_eq(zinf_engine_save(e, dir, "t", NULL), 0, "%s", zinf_last_error());
	snprintf(path, sizeof(path), "%s/t/manifest.json", dir);
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s", path);
	static char text[1 << 16];
	size_t n = fread(text, 1, sizeof(text) - 1, f);
	fclose(f);
	text[n] = '\0';
	/* the params entries in order: "dense.w" has no key, "dense.b" has it, once */
	const char *w = strstr(text, "\"dense.w\""), *b = strstr(text, "\"dense.b\"");
	const char *nd = strstr(text, "\"no_decay\": true");
	cr_assert(w && b && nd, "%s", text);
	cr_assert(w < b && b < nd, "no_decay is not in dense.b's entry:\n%s", text);
	cr_assert_null(strstr(nd + 1, "\"no_decay\""), "no_decay twice:\n%s", text);
	zinf_engine_destroy(e);
	zt_rmtree(dir);
	free(dir);
}
