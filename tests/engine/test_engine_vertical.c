/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/test_engine_vertical.c: zinf_engine_vertical, the "vertical" gradient
 * accumulation schedule (every micro-batch of a pass through a layer while it is fetched),
 * against the horizontal one (a pass per micro-batch) with the same micro-batches, in one
 * process: the master weights and the 16-bit parameters bit for bit after three steps on every
 * stage and every tier of parameters and optimizer, with the step during and after backward,
 * passes of the whole window and of part of it; clipping that applies with the speculative step
 * (redone sub-groups); an fp16 overflow in one micro-batch of a vertical pass (the step skipped
 * on both); misuse refused with -EINVAL and the engine unchanged (the run, completed, still
 * equals the horizontal one); and the parameter store's NVMe read bytes per step, 2 G
 * partition reads per parameter horizontally, 2 vertically (counted by hand). The trainer is
 * engine_drive.c's; the gradients are unquantised (eref_grad's quantum 0), so that a sum taken
 * in another order would differ. Not here: several ranks (test_engine_vertical_ranks.c).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "engine/engine_drive.h"
#include "zinf/engine.h"

ZT_TMPDIR_SUITE(vertical);

#define STEPS 3

struct vcfg {
	int stage;
	enum zinf_offload_device opt, param;
	enum zinf_dtype dtype; /* 0: bf16 (ZINF_F32 is not 0: see below) */
	bool f32;	       /* fp32 parameters */
	uint32_t gas, pass;    /* micro-batches per window; the vertical passes' (at most) */
	bool after;	       /* step after backward (step_during_backward false) */
	double clip;	       /* gradient_clipping */
	bool fp16;	       /* f16 parameters and gradients, fp16 loss scaling */
	int64_t inf_step1;     /* edrive's overflow (0: none) */
	uint32_t inf_micro;
};

/* What a run leaves: the master weights, the 16-bit parameters a forward reads afterwards (as
 * fp32), the last window's statistics. */
struct vrun {
	float *master[EREF_NPARAMS];
	float *param[EREF_NPARAMS];
	struct zinf_engine_stats st;
};

static void
vrun_free(struct vrun *r)
{
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		free(r->master[id]);
		free(r->param[id]);
	}
	memset(r, 0, sizeof(*r));
}

static enum zinf_dtype
cfg_dtype(const struct vcfg *c)
{
	return c->fp16 ? ZINF_F16 : c->f32 ? ZINF_F32 : ZINF_BF16;
}

static char *
subdir(const char *name)
{
	char *p = NULL;
	cr_assert(asprintf(&p, "%s/%s", dir, name) > 0);
	char *cmd = NULL;
	cr_assert(asprintf(&cmd, "mkdir -p '%s'", p) > 0);
	cr_assert(system(cmd) == 0);
	free(cmd);
	return p;
}

static struct zinf_engine *
make(const struct vcfg *c, const char *where)
{
	struct zinf_engine_opts o;
	edrive_opts(&o, "single", c->stage, c->opt, c->param, where, cfg_dtype(c), c->gas);
	o.step_during_backward = !c->after;
	o.gradient_clipping = c->clip;
	if (c->fp16) {
		zinf_fp16_opts_init(&o.fp16);
		o.fp16.enabled = true;
		o.fp16.initial_scale_power = 4;
	}
	struct zinf_engine *e = NULL;
	int rc = zinf_engine_create(&o, &e);
	cr_assert_eq(rc, 0, "create: %d %s", rc, zinf_last_error());
	rc = edrive_add_params(e);
	cr_assert_eq(rc, 0, "add_params: %d %s", rc, zinf_last_error());
	rc = zinf_engine_init(e);
	cr_assert_eq(rc, 0, "init: %d %s", rc, zinf_last_error());
	return e;
}

/* The state after the run into r: master weights, then a forward's 16-bit values. */
static void
collect(struct edrive *d, struct vrun *r)
{
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		r->master[id] = calloc(eref_numel(id), sizeof(float));
		r->param[id] = calloc(eref_numel(id), sizeof(float));
		cr_assert(r->master[id] && r->param[id]);
	}
	int rc = edrive_read_master(d->e, r->master);
	cr_assert_eq(rc, 0, "read_master: %d %s", rc, zinf_last_error());
	for (int32_t l = 0; l < EREF_NLAYERS; l++) {
		cr_assert_eq(zinf_engine_fetch(d->e, l), 0, "fetch %d: %s", l, zinf_last_error());
		for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
			if (eref_params[id].layer == l) {
				cr_assert_eq(edrive_read_param(d, id, r->param[id]), 0, "%s",
					     d->why);
			}
		}
		cr_assert_eq(zinf_engine_release(d->e, l), 0);
	}
	r->st.size = sizeof(r->st);
	cr_assert_eq(zinf_engine_get_stats(d->e, &r->st), 0);
}

/* STEPS steps of c, horizontally or in vertical passes, into r. */
static void
train(const struct vcfg *c, bool vertical, struct vrun *r)
{
	char *where = subdir(vertical ? "v" : "h");
	struct zinf_engine *e = make(c, where);
	struct edrive d;
	cr_assert_eq(edrive_init(&d, e, cfg_dtype(c), 0.0f), 0);
	d.inf_step1 = c->inf_step1;
	d.inf_micro = c->inf_micro;
	int rc = vertical ? edrive_run_vertical(&d, 0, STEPS, c->gas, c->pass)
			  : edrive_run(&d, 0, STEPS, c->gas, -1);
	cr_assert_eq(rc, 0, "%s run: %s", vertical ? "vertical" : "horizontal", d.why);
	collect(&d, r);
	edrive_fini(&d);
	zinf_engine_destroy(e);
	zt_rmtree(where);
	free(where);
}

/* Bit for bit: every master weight and 16-bit parameter; the counters. */
static void
expect_equal(const char *what, const struct vrun *h, const struct vrun *v)
{
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		for (uint64_t i = 0; i < eref_numel(id); i++) {
			cr_expect(memcmp(&h->master[id][i], &v->master[id][i], 4) == 0,
				  "%s: %s[%llu] master: horizontal %.9g, vertical %.9g", what,
				  eref_params[id].name, (unsigned long long)i, h->master[id][i],
				  v->master[id][i]);
			cr_expect(memcmp(&h->param[id][i], &v->param[id][i], 4) == 0,
				  "%s: %s[%llu] 16-bit: horizontal %.9g, vertical %.9g", what,
				  eref_params[id].name, (unsigned long long)i, h->param[id][i],
				  v->param[id][i]);
		}
	}
	cr_expect_eq(h->st.steps, v->st.steps, "%s: steps", what);
	cr_expect_eq(h->st.micro_steps, v->st.micro_steps, "%s: micro_steps", what);
	cr_expect_eq(h->st.skipped_steps, v->st.skipped_steps, "%s: skipped", what);
	cr_expect_eq(h->st.rolled_back, v->st.rolled_back, "%s: rolled_back", what);
	cr_expect(memcmp(&h->st.grad_norm, &v->st.grad_norm, sizeof(h->st.grad_norm)) == 0,
		  "%s: grad_norm %.17g vs %.17g", what, h->st.grad_norm, v->st.grad_norm);
}

static void
compare(const struct vcfg *c, struct vrun *h_out, struct vrun *v_out)
{
	char what[160];
	snprintf(what, sizeof(what), "stage %d opt %d param %d gas %u pass %u%s%s clip %g%s",
		 c->stage, c->opt, c->param, c->gas, c->pass, c->after ? " after" : " during",
		 c->f32 ? " f32" : "", c->clip, c->fp16 ? " fp16" : "");
	struct vrun h = {0}, v = {0};
	train(c, false, &h);
	train(c, true, &v);
	expect_equal(what, &h, &v);
	if (h_out) {
		*h_out = h;
		*v_out = v;
	} else {
		vrun_free(&h);
		vrun_free(&v);
	}
}

Test(vertical, equals_horizontal_every_stage_and_tier)
{
	const enum zinf_offload_device N = ZINF_OFFLOAD_NONE, C = ZINF_OFFLOAD_CPU,
				       V = ZINF_OFFLOAD_NVME;
	const struct vcfg cfgs[] = {
		{.stage = 0, .opt = N, .param = N},
		{.stage = 1, .opt = C, .param = N},
		{.stage = 1, .opt = V, .param = N, .after = true},
		{.stage = 2, .opt = N, .param = N},
		{.stage = 2, .opt = C, .param = N, .f32 = true},
		{.stage = 2, .opt = V, .param = N},
		{.stage = 3, .opt = N, .param = N},
		{.stage = 3, .opt = N, .param = C},
		{.stage = 3, .opt = N, .param = V},
		{.stage = 3, .opt = C, .param = N},
		{.stage = 3, .opt = C, .param = C, .after = true},
		{.stage = 3, .opt = C, .param = V},
		{.stage = 3, .opt = V, .param = N},
		{.stage = 3, .opt = V, .param = C},
		{.stage = 3, .opt = V, .param = V},
		{.stage = 3, .opt = V, .param = V, .after = true},
	};
	for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++) {
		for (uint32_t pass = 2; pass <= 3; pass++) { /* 2 + 1, and the whole window */
			struct vcfg c = cfgs[i];
			c.gas = 3;
			c.pass = pass;
			compare(&c, NULL, NULL);
		}
	}
}

/* Clipping that applies at every step (the norm is far above 1e-3): the sub-groups stepped
 * speculatively during backward are redone, on both schedules. */
Test(vertical, equals_horizontal_with_clipping_and_the_speculative_step)
{
	const struct vcfg cfgs[] = {
		{.stage = 3, .opt = ZINF_OFFLOAD_NVME, .param = ZINF_OFFLOAD_NVME},
		{.stage = 3, .opt = ZINF_OFFLOAD_CPU, .param = ZINF_OFFLOAD_NVME},
		{.stage = 2, .opt = ZINF_OFFLOAD_NONE, .param = ZINF_OFFLOAD_NONE},
	};
	for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++) {
		struct vcfg c = cfgs[i];
		c.gas = 3;
		c.pass = 3;
		c.clip = 1e-3;
		struct vrun h, v;
		compare(&c, &h, &v);
		cr_expect_gt(v.st.rolled_back, 0, "stage %d: the speculation was not redone",
			     c.stage);
		cr_expect_gt(v.st.stepped_during_backward, 0, "stage %d: nothing speculated",
			     c.stage);
		vrun_free(&h);
		vrun_free(&v);
	}
}

/* An infinity in one micro-batch of a vertical pass (its middle one, then the first of a pass
 * of 2): the step is skipped on both schedules, the later steps equal. */
Test(vertical, equals_horizontal_with_an_fp16_overflow_in_one_micro_batch)
{
	const struct vcfg cfgs[] = {
		{.stage = 3,
		 .opt = ZINF_OFFLOAD_NVME,
		 .param = ZINF_OFFLOAD_NVME,
		 .pass = 3,
		 .inf_micro = 1},
		{.stage = 3,
		 .opt = ZINF_OFFLOAD_CPU,
		 .param = ZINF_OFFLOAD_CPU,
		 .pass = 2,
		 .inf_micro = 0},
		{.stage = 1,
		 .opt = ZINF_OFFLOAD_CPU,
		 .param = ZINF_OFFLOAD_NONE,
		 .pass = 2,
		 .inf_micro = 2},
	};
	for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++) {
		struct vcfg c = cfgs[i];
		c.gas = 3;
		c.fp16 = true;
		c.inf_step1 = 2; /* step index 1 */
		struct vrun h, v;
		compare(&c, &h, &v);
		cr_expect_eq(v.st.skipped_steps, 1, "stage %d: %llu skipped", c.stage,
			     (unsigned long long)v.st.skipped_steps);
		cr_expect_eq(v.st.steps, STEPS - 1);
		vrun_free(&h);
		vrun_free(&v);
	}
}

/* ---- misuse ------------------------------------------------------------------------------ */

static void
expect_einval(int rc, const char *call, const char *words)
{
	cr_expect_eq(rc, -EINVAL, "%s: %d, expected -EINVAL", call, rc);
	cr_expect(strstr(zinf_last_error(), words) != NULL, "%s: the message \"%s\" lacks \"%s\"",
		  call, zinf_last_error(), words);
}

/* Parameter id's gradient g on the compute stream, handed (the staging synchronised first). */
static int
hand(struct edrive *d, uint32_t id, const float *g)
{
	struct zinf_stream *cs = zinf_engine_compute_stream(d->e);
	int rc = zinf_stream_sync(cs);
	if (rc) {
		return rc;
	}
	memcpy(d->stage[id], g, eref_numel(id) * sizeof(float));
	rc = zinf_device_copy(cs, d->grad_dev[id], d->stage[id], eref_numel(id) * sizeof(float),
			      ZINF_COPY_H2D);
	return rc ? rc : zinf_engine_grad(d->e, id, d->grad_dev[id], ZINF_F32);
}

/*
 * Every misuse refused with -EINVAL naming what was wrong, the engine unchanged: the run,
 * completed with the right calls, equals the horizontal one (fp32 parameters and gradients, so
 * that edrive's arrays are handed as they are). Step 0: n 0 and 4 of 3; a layer fetched; a pass
 * of 2 with, inside it, a third gradient, a step before the earlier layers' gradients and a new
 * vertical call; then 2 of the 1 left; the last micro-batch horizontally. Step 1: one pass of 3
 * through edrive.
 */
Test(vertical, misuse_refused_and_the_engine_unchanged)
{
	struct vcfg c = {.stage = 3,
			 .opt = ZINF_OFFLOAD_NVME,
			 .param = ZINF_OFFLOAD_NVME,
			 .f32 = true,
			 .gas = 3,
			 .pass = 3};
	struct vrun h = {0}, v = {0};
	/* the reference: edrive_run, two steps horizontally */
	{
		char *where = subdir("h");
		struct zinf_engine *e = make(&c, where);
		struct edrive d;
		cr_assert_eq(edrive_init(&d, e, ZINF_F32, 0.0f), 0);
		cr_assert_eq(edrive_run(&d, 0, 2, 3, -1), 0, "%s", d.why);
		collect(&d, &h);
		edrive_fini(&d);
		zinf_engine_destroy(e);
		free(where);
	}
	char *where = subdir("v");
	struct zinf_engine *e = make(&c, where);
	struct edrive d;
	cr_assert_eq(edrive_init(&d, e, ZINF_F32, 0.0f), 0);
	expect_einval(zinf_engine_vertical(e, 0), "vertical(0)", "a pass of 0 micro-batches");
	expect_einval(zinf_engine_vertical(e, 4), "vertical(4)", "but 3 left in the window");
	cr_assert_eq(zinf_engine_fetch(e, 0), 0);
	expect_einval(zinf_engine_vertical(e, 2), "vertical with a layer fetched",
		      "layer 0 is fetched");
	cr_assert_eq(zinf_engine_release(e, 0), 0);

	/* a pass of 2 (micro-batches 0 and 1 of step 0), by hand */
	cr_assert_eq(zinf_engine_vertical(e, 2), 0, "%s", zinf_last_error());
	for (int32_t l = 0; l < EREF_NLAYERS; l++) {
		cr_assert_eq(zinf_engine_fetch(e, l), 0);
		for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
			if (eref_params[id].layer == l) {
				cr_assert_eq(edrive_read_param(&d, id, d.host[id]), 0);
			}
		}
		cr_assert_eq(zinf_engine_release(e, l), 0);
	}
	float *g[2][EREF_NPARAMS];
	for (uint32_t k = 0; k < 2; k++) {
		for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
			g[k][id] = malloc(eref_numel(id) * sizeof(float));
		}
		eref_grad((const float *const *)d.host, 0, 0, k, 0.0f, g[k]);
	}
	for (int32_t l = EREF_NLAYERS; l-- > 0;) {
		cr_assert_eq(zinf_engine_fetch(e, l), 0);
		for (uint32_t id = EREF_NPARAMS; id-- > 0;) {
			if (eref_params[id].layer != l) {
				continue;
			}
			for (uint32_t k = 0; k < 2; k++) {
				cr_assert_eq(hand(&d, id, g[k][id]), 0, "%s", zinf_last_error());
			}
			if (l == 2) {
				expect_einval(hand(&d, id, g[1][id]), "a third gradient",
					      "gradient 3 in a vertical pass of 2");
			}
		}
		cr_assert_eq(zinf_engine_release(e, l), 0);
		if (l == 2) {
			expect_einval(
				zinf_engine_step(e), "step before every gradient",
				"no gradient for parameter \"layer0.weight\" in micro-batch 0 "
				"of the vertical pass");
			expect_einval(zinf_engine_vertical(e, 1), "vertical mid-pass",
				      "4 gradients handed");
		}
	}
	cr_assert_eq(zinf_engine_step(e), 0, "%s", zinf_last_error());
	for (uint32_t k = 0; k < 2; k++) {
		for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
			free(g[k][id]);
		}
	}
	expect_einval(zinf_engine_vertical(e, 2), "vertical(2) with 1 left",
		      "but 1 left in the window");
	/* the window's last micro-batch horizontally, then a step of one pass of 3 */
	cr_assert_eq(edrive_micro(&d, 0, 2, EDRIVE_ORDER_NORMAL), 1, "%s", d.why);
	cr_assert_eq(edrive_run_vertical(&d, 1, 1, 3, 3), 0, "%s", d.why);
	collect(&d, &v);
	edrive_fini(&d);
	zinf_engine_destroy(e);
	free(where);
	expect_equal("misuse", &h, &v);
	cr_expect_eq(v.st.steps, 2);
	cr_expect_eq(v.st.micro_steps, 6);
	vrun_free(&h);
	vrun_free(&v);
}

/* ---- the parameter store's NVMe reads ---------------------------------------------------- */

/*
 * Stage 3, the parameters on NVMe with no CPU cache (max_in_cpu 0), the optimizer on the CPU (no
 * other NVMe read), one rank: a fetch reads each partition of the layer, numel * 2 bytes
 * (bf16); the model's 399 elements are 798 bytes, layer 2's 24 are 48. Per pass the forward and
 * the backward fetch every layer: 2 * 798 bytes, but for layer 2 once the trace is valid (from
 * the second pass on): released last in the forward and fetched first in the backward, within
 * stage3_max_reuse_distance 0, it stays gathered (one fetch of 48 bytes less). Horizontally a
 * step is G passes: step 0 1596 + 3 * 1548 = 6240, later steps 4 * 1548 = 6192; vertically one
 * pass: 1596, then 1548. A partition may be served without a read: a swap-in of a tensor whose
 * write the store has not reaped keeps its buffer (offload/README.md); layer0.weight's
 * partition (480 bytes: the last sub-group in backward order, written last by init and by each
 * step) usually is at the next step's first fetch, and under load others written last by init
 * or the step can be too (seen: layer0.weight, layer1.bias and layer2.weight, 536 bytes, at step
 * 0; whether something reaped them first depends on the step worker's timing): a step reads
 * `want` less the bytes of some set of partitions, each at most once (a subset sum of the six
 * partitions' bytes, at most 798: less than a pass, so the counts of passes still show).
 */
/* Whether `bytes` is the bf16 bytes of some set of the model's partitions (one rank), each once. */
static bool
served_from_buffers(uint64_t bytes)
{
	for (uint32_t set = 0; set < (1u << EREF_NPARAMS); set++) {
		uint64_t sum = 0;
		for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
			sum += set >> id & 1 ? eref_numel(id) * 2 : 0;
		}
		if (sum == bytes) {
			return true;
		}
	}
	return false;
}

Test(vertical, param_nvme_reads_fall_from_2g_to_2_per_parameter)
{
	const uint32_t gas = 4;
	uint64_t model_bytes = 0;
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		model_bytes += eref_numel(id) * 2;
	}
	cr_assert_eq(model_bytes, 798);
	const uint64_t kept = (eref_numel(4) + eref_numel(5)) * 2; /* layer 2 */
	cr_assert_eq(kept, 48);
	struct vcfg c = {.stage = 3,
			 .opt = ZINF_OFFLOAD_CPU,
			 .param = ZINF_OFFLOAD_NVME,
			 .gas = gas,
			 .pass = gas};
	for (int vertical = 0; vertical < 2; vertical++) {
		char *where = subdir(vertical ? "v" : "h");
		struct zinf_engine *e = make(&c, where);
		struct edrive d;
		cr_assert_eq(edrive_init(&d, e, ZINF_BF16, 0.0f), 0);
		for (int64_t s = 0; s < 3; s++) {
			int rc = vertical ? edrive_run_vertical(&d, s, 1, gas, gas)
					  : edrive_run(&d, s, 1, gas, -1);
			cr_assert_eq(rc, 0, "%s", d.why);
			struct zinf_engine_stats st = {.size = sizeof(st)};
			cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
			uint64_t passes = vertical ? 1 : gas;
			uint64_t want = passes * (2 * model_bytes - kept) + (s == 0 ? kept : 0);
			uint64_t got = st.nvme_read_bytes;
			cr_expect(got <= want && served_from_buffers(want - got),
				  "%s step %lld: %llu bytes read, expected %llu less the bytes of "
				  "some partitions",
				  vertical ? "vertical" : "horizontal", (long long)s,
				  (unsigned long long)got, (unsigned long long)want);
		}
		edrive_fini(&d);
		zinf_engine_destroy(e);
		free(where);
	}
}
