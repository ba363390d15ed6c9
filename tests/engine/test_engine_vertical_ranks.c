/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/test_engine_vertical_ranks.c: zinf_engine_vertical under mpirun (ctest
 * engine_vertical_mpi.np2): the vertical passes against one pass per micro-batch, bit for
 * bit on every rank (master weights and the 16-bit parameters a forward reads afterwards) on
 * stages 0-3, the tiers none, cpu and nvme, clipping with the speculative step and an fp16
 * overflow in one micro-batch (case "equal"); the ranks passing different counts, and one rank
 * refusing its count, -EINVAL on every rank naming it, the engines unchanged: the window then
 * completed equals the horizontal run (case "differ"). A bf16 master shared with the 16-bit
 * parameters (optimizer on NVMe) against one in memory (cpu tier), bit for bit on every rank
 * (case "shared_master"). The single-process cases are test_engine_vertical.c's.
 */
#include <sys/stat.h>

#include "engine/engine_ranks.h"

#define STEPS 3
#define GAS   3

struct vcfg {
	int stage;
	enum zinf_offload_device opt, param;
	uint32_t pass;
	double clip;
	bool fp16;
	int64_t inf_step1;
	uint32_t inf_micro;
	bool bf16m;	/* a bf16 master (optimizer.master_dtype) */
	uint64_t cache; /* offload_param.max_in_cpu (edrive_opts: 0) */
};

static enum zinf_dtype
dtype_of(const struct vcfg *c)
{
	return c->fp16 ? ZINF_F16 : ZINF_BF16;
}

static struct zinf_engine *
make(const struct vcfg *c, const char *sub, char **where, int *fails)
{
	if (asprintf(where, "%s/%s", scratch, sub) < 0) {
		return NULL;
	}
	mkdir(*where, 0700);
	struct zinf_engine_opts o;
	edrive_opts(&o, "mpi", c->stage, c->opt, c->param, *where, dtype_of(c), GAS);
	o.gradient_clipping = c->clip;
	o.optimizer.master_dtype = c->bf16m ? ZINF_BF16 : ZINF_F32;
	o.offload_param.max_in_cpu = c->cache;
	if (c->fp16) {
		zinf_fp16_opts_init(&o.fp16);
		o.fp16.enabled = true;
		o.fp16.initial_scale_power = 4;
	}
	return make_model(&o, fails);
}

/* The master weights and a forward's 16-bit values (as fp32) after the run. */
static int
collect(struct edrive *d, struct master *m, struct master *p16)
{
	int rc = master_alloc(m);
	rc = rc ? rc : master_alloc(p16);
	rc = rc ? rc : edrive_read_master(d->e, m->p);
	for (int32_t l = 0; l < EREF_NLAYERS && rc == 0; l++) {
		rc = zinf_engine_fetch(d->e, l);
		for (uint32_t id = 0; id < EREF_NPARAMS && rc == 0; id++) {
			rc = eref_params[id].layer == l ? edrive_read_param(d, id, p16->p[id]) : 0;
		}
		rc = rc ? rc : zinf_engine_release(d->e, l);
	}
	return rc;
}

/* STEPS steps of c, horizontally or vertically; the state into m, p16. */
static int
train(const struct vcfg *c, bool vertical, struct master *m, struct master *p16)
{
	int fails = 0;
	char *where = NULL;
	struct zinf_engine *e = make(c, vertical ? "v" : "h", &where, &fails);
	struct edrive d;
	int rc = e ? edrive_init(&d, e, dtype_of(c), 0.0f) : -EINVAL;
	if (e && rc == 0) {
		d.inf_step1 = c->inf_step1;
		d.inf_micro = c->inf_micro;
		rc = vertical ? edrive_run_vertical(&d, 0, STEPS, GAS, c->pass)
			      : edrive_run(&d, 0, STEPS, GAS, -1);
		CHECK(rc == 0, "stage %d %s: %s", c->stage, vertical ? "vertical" : "horizontal",
		      d.why);
		if (rc == 0) {
			rc = collect(&d, m, p16);
			CHECK(rc == 0, "collect: %d %s", rc, zinf_last_error());
		}
		edrive_fini(&d);
	}
	zinf_engine_destroy(e);
	zt_rmtree(where);
	free(where);
	return fails + (e ? 0 : 1);
}

static int
case_equal(void)
{
	const enum zinf_offload_device N = ZINF_OFFLOAD_NONE, C = ZINF_OFFLOAD_CPU,
				       V = ZINF_OFFLOAD_NVME;
	const struct vcfg cfgs[] = {
		{.stage = 0, .opt = N, .param = N, .pass = 3},
		{.stage = 1, .opt = C, .param = N, .pass = 2},
		{.stage = 2, .opt = V, .param = N, .pass = 3},
		{.stage = 3, .opt = N, .param = N, .pass = 2},
		{.stage = 3, .opt = C, .param = C, .pass = 3},
		{.stage = 3, .opt = V, .param = V, .pass = 3},
		{.stage = 3, .opt = V, .param = V, .pass = 2, .clip = 1e-3},
		{.stage = 3, .opt = C, .param = V, .pass = 3, .clip = 1e-3},
		{.stage = 3,
		 .opt = V,
		 .param = V,
		 .pass = 3,
		 .fp16 = true,
		 .inf_step1 = 2,
		 .inf_micro = 1},
		{.stage = 2,
		 .opt = C,
		 .param = N,
		 .pass = 2,
		 .fp16 = true,
		 .inf_step1 = 2,
		 .inf_micro = 2},
	};
	int fails = 0;
	for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++) {
		const struct vcfg *c = &cfgs[i];
		struct master hm = {0}, hp = {0}, vm = {0}, vp = {0};
		fails += train(c, false, &hm, &hp);
		fails += train(c, true, &vm, &vp);
		if (!fails) {
			char what[128];
			snprintf(what, sizeof(what), "stage %d opt %s param %s pass %u%s%s master",
				 c->stage, tier_names[c->opt], tier_names[c->param], c->pass,
				 c->clip ? " clip" : "", c->fp16 ? " fp16" : "");
			fails += compare(what, vm.p, hm.p, 0, NULL);
			snprintf(what + strlen(what) - 6, 8, "16-bit");
			fails += compare(what, vp.p, hp.p, 0, NULL);
		}
		master_free(&hm);
		master_free(&hp);
		master_free(&vm);
		master_free(&vp);
	}
	return fails;
}

/* A refused zinf_engine_vertical: -EINVAL on this rank with a message containing `words`. */
static int
refused(int rc, const char *words)
{
	int fails = 0;
	CHECK(rc == -EINVAL, "vertical: %d, expected -EINVAL", rc);
	CHECK(strstr(zinf_last_error(), words) != NULL, "vertical: \"%s\" lacks \"%s\"",
	      zinf_last_error(), words);
	return fails;
}

static int
case_differ(void)
{
	if (world < 2) {
		return SKIP;
	}
	const struct vcfg c = {
		.stage = 3, .opt = ZINF_OFFLOAD_NVME, .param = ZINF_OFFLOAD_NVME, .pass = 3};
	int fails = 0;
	struct master hm = {0}, hp = {0}, vm = {0}, vp = {0};
	fails += train(&c, false, &hm, &hp);
	char *where = NULL;
	struct zinf_engine *e = make(&c, "v", &where, &fails);
	struct edrive d;
	if (!e || edrive_init(&d, e, ZINF_BF16, 0.0f) != 0) {
		zinf_engine_destroy(e);
		free(where);
		master_free(&hm);
		master_free(&hp);
		return fails + 1;
	}
	/* the last rank passes 2 where the others pass 3 */
	int rc = zinf_engine_vertical(e, rank == world - 1 ? 2 : 3);
	fails += refused(rc, "the ranks pass different micro-batch counts");
	/* the last rank passes 4 of the 3 left: refused there, and the others told */
	rc = zinf_engine_vertical(e, rank == world - 1 ? 4 : 3);
	fails += refused(rc, rank == world - 1 ? "but 3 left in the window"
					       : "vertical failed on rank");
	/* the engines unchanged: the run as the horizontal one */
	rc = edrive_run_vertical(&d, 0, STEPS, GAS, c.pass);
	CHECK(rc == 0, "the run after the refusals: %s", d.why);
	if (rc == 0 && collect(&d, &vm, &vp) == 0) {
		fails += compare("after the refusals: master", vm.p, hm.p, 0, NULL);
		fails += compare("after the refusals: 16-bit", vp.p, hp.p, 0, NULL);
	}
	edrive_fini(&d);
	zinf_engine_destroy(e);
	zt_rmtree(where);
	free(where);
	master_free(&hm);
	master_free(&hp);
	master_free(&vm);
	master_free(&vp);
	return fails;
}

/*
 * A bf16 master with bf16 parameters: with the optimizer on NVMe it shares the parameters'
 * home (the step fills it from there; engine/README.md; with the parameters on NVMe only where
 * they have a cache, here the whole model); with the optimizer on the CPU it lives in memory.
 * The two give the same bits on every rank, stage 3 with the parameters on NVMe (cached, and
 * without a cache: not shared) and on the CPU, clipping with the speculative step, horizontal
 * and vertical passes.
 */
static int
case_shared_master(void)
{
	const enum zinf_offload_device C = ZINF_OFFLOAD_CPU, V = ZINF_OFFLOAD_NVME;
	const struct vcfg cfgs[] = {
		{.stage = 3, .opt = V, .param = V, .pass = 1, .bf16m = true, .cache = 1000000},
		{.stage = 3, .opt = V, .param = V, .pass = 1, .bf16m = true},
		{.stage = 3,
		 .opt = V,
		 .param = V,
		 .pass = 1,
		 .clip = 1e-3,
		 .bf16m = true,
		 .cache = 1000000},
		{.stage = 3, .opt = V, .param = C, .pass = 1, .clip = 1e-3, .bf16m = true},
		{.stage = 3,
		 .opt = V,
		 .param = V,
		 .pass = 3,
		 .clip = 1e-3,
		 .bf16m = true,
		 .cache = 1000000},
		{.stage = 2, .opt = V, .param = ZINF_OFFLOAD_NONE, .pass = 1, .bf16m = true},
	};
	int fails = 0;
	for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++) {
		struct vcfg c = cfgs[i];
		struct master sm = {0}, sp = {0}, cm = {0}, cp = {0};
		fails += train(&c, c.pass > 1, &sm, &sp);
		c.opt = C;
		fails += train(&c, c.pass > 1, &cm, &cp);
		if (!fails) {
			char what[128];
			snprintf(what, sizeof(what),
				 "stage %d param %s pass %u%s: shared vs cpu master", c.stage,
				 tier_names[c.param], c.pass, c.clip ? " clip" : "");
			fails += compare(what, sm.p, cm.p, 0, NULL);
			snprintf(what + strlen(what) - 6, 8, "16-bit");
			fails += compare(what, sp.p, cp.p, 0, NULL);
		}
		master_free(&sm);
		master_free(&sp);
		master_free(&cm);
		master_free(&cp);
	}
	return fails;
}

static const struct ranks_case cases[] = {
	{"equal", case_equal, false},
	{"differ", case_differ, false},
	{"shared_master", case_shared_master, false},
};

int
main(int argc, char **argv)
{
	return ranks_main(argc, argv, "engine_vertical", cases, sizeof(cases) / sizeof(cases[0]));
}
