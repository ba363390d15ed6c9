/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/test_engine_betas.c: zinf_engine_set_betas (OneCycle's momentum cycling) and
 * zinf_optimizer_set_betas. The engine trained with betas changed after step 2 equals, bit for
 * bit, engine_ref's reference whose optimizer is created anew with those betas for step 3 on
 * (not through the setter), on every optimizer tier (none, cpu, nvme) and for Adam, AdamW and
 * Lion; and differs from the reference that keeps the old betas (so the comparison can fail).
 * The value set before the first gradient of a step's last micro-batch is the one the step
 * uses; out-of-range values and Adagrad are refused and change nothing. One process, "single"
 * collectives, device "host" (or ZINF_TEST_DEVICE).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "engine/engine_drive.h"
#include "engine/engine_ref.h"
#include "zinf/engine.h"
#include "zinf/blocks/optimizer.h"
#include "zinf/schedule.h"

#define QUANTUM 0x1p-14f

static struct zinf_engine *
make_model(struct zinf_engine_opts *o)
{
	struct zinf_engine *e = NULL;
	int rc = zinf_engine_create(o, &e);
	cr_assert_eq(rc, 0, "zinf_engine_create: %d %s", rc, zinf_last_error());
	rc = edrive_add_params(e);
	cr_assert_eq(rc, 0, "add_params: %d %s", rc, zinf_last_error());
	rc = zinf_engine_init(e);
	cr_assert_eq(rc, 0, "zinf_engine_init: %d %s", rc, zinf_last_error());
	return e;
}

static void
reference(struct eref_result *ref, int steps, uint32_t gas, const struct zinf_optimizer_opts *opt,
	  int betas_step, float b1, float b2)
{
	struct eref_opts ro = {.world = 1,
			       .steps = steps,
			       .gas = gas,
			       .dtype = ZINF_F32,
			       .quantum = QUANTUM,
			       .opt = *opt,
			       .betas_step = betas_step,
			       .beta1_after = b1,
			       .beta2_after = b2};
	int rc = eref_train(&ro, ref);
	cr_assert_eq(rc, 0, "eref_train: %d %s", rc, zinf_last_error());
	for (int t = 1; t <= steps; t++) {
		cr_assert_lt(ref->abs_grad[t], 64.0); /* engine_ref.h's exactness bound */
	}
}

/* Every master weight equal to ref's bit for bit (want_equal), or at least one differing. */
static void
compare_master(struct zinf_engine *e, const struct eref_result *ref, bool want_equal,
	       const char *what)
{
	uint64_t differ = 0;
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		uint64_t n = eref_numel(id);
		float *m = calloc(n, sizeof(float));
		cr_assert_not_null(m);
		int rc = zinf_engine_read_master(e, id, m);
		cr_assert_eq(rc, 0, "%s: read_master(%u): %d %s", what, id, rc, zinf_last_error());
		for (uint64_t i = 0; i < n; i++) {
			bool same = memcmp(&m[i], &ref->master[id][i], sizeof(float)) == 0;
			differ += !same;
			if (want_equal) {
				cr_assert(same, "%s: %s[%llu] = %.9g, reference %.9g", what,
					  eref_params[id].name, (unsigned long long)i, m[i],
					  ref->master[id][i]);
			}
		}
		free(m);
	}
	if (!want_equal) {
		cr_assert_gt(differ, 0, "%s: the betas changed nothing", what);
	}
}

/* Betas (0.8, 0.95) from step 3 on, set between steps: equal to the reference with those
 * betas from step 3, different from the one without, for each kind and tier. */
Test(engine_betas, changed_betas_equal_reference)
{
	static const struct {
		enum zinf_optim_kind kind;
		int stage;
		enum zinf_offload_device opt, param;
		uint32_t gas;
		bool sdb;
	} cases[] = {
		{ZINF_OPTIM_ADAMW, 2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, 2, true},
		{ZINF_OPTIM_ADAMW, 3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_CPU, 1, false},
		{ZINF_OPTIM_ADAMW, 1, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, 2, true},
		{ZINF_OPTIM_ADAM, 3, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, 1, true},
		{ZINF_OPTIM_LION, 3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NVME, 2, true},
		{ZINF_OPTIM_LION, 2, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, 1, false},
	};
	char *dir = zt_mkdtemp(NULL);
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		struct zinf_engine_opts o;
		struct edrive d;
		struct eref_result ref;
		char what[96];
		snprintf(what, sizeof(what), "kind %d stage %d tiers %d/%d gas %u sdb %d",
			 cases[k].kind, cases[k].stage, cases[k].opt, cases[k].param, cases[k].gas,
			 cases[k].sdb);
		edrive_opts(&o, "single", cases[k].stage, cases[k].opt, cases[k].param, dir,
			    ZINF_F32, cases[k].gas);
		o.step_during_backward = cases[k].sdb;
		if (cases[k].kind != ZINF_OPTIM_ADAMW) {
			zinf_optimizer_opts_init(&o.optimizer, cases[k].kind);
			o.optimizer.lr = 0.01f;
			o.optimizer.weight_decay = 0.01f;
			if (cases[k].kind == ZINF_OPTIM_ADAM) {
				o.optimizer.eps = 0.05f;
			}
		}
		struct zinf_engine *e = make_model(&o);
		cr_assert_eq(edrive_init(&d, e, ZINF_F32, QUANTUM), 0);
		cr_assert_eq(edrive_run(&d, 0, 2, cases[k].gas, -1), 0, "%s: %s", what, d.why);
		cr_assert_eq(zinf_engine_set_betas(e, 0.8f, 0.95f), 0, "%s: %s", what,
			     zinf_last_error());
		cr_assert_eq(edrive_run(&d, 2, 3, cases[k].gas, -1), 0, "%s: %s", what, d.why);
		reference(&ref, 5, cases[k].gas, &o.optimizer, 2, 0.8f, 0.95f);
		compare_master(e, &ref, true, what);
		eref_result_free(&ref);
		reference(&ref, 5, cases[k].gas, &o.optimizer, 0, 0, 0);
		compare_master(e, &ref, false, what);
		eref_result_free(&ref);
		edrive_fini(&d);
		zinf_engine_destroy(e);
	}
	zt_rmtree(dir);
	free(dir);
}

/* Only beta1 changes (beta2 kept): the step uses it (the reference differs without). Set after
 * the first micro-batch of step 3's window of 2: it is taken at the first gradient of the last
 * micro-batch, so step 3 already runs with it. */
Test(engine_betas, beta1_set_inside_the_window)
{
	struct zinf_engine_opts o;
	struct edrive d;
	struct eref_result ref;
	edrive_opts(&o, "single", 2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, NULL, ZINF_F32, 2);
	o.step_during_backward = true;
	float b2 = o.optimizer.beta2;
	struct zinf_engine *e = make_model(&o);
	cr_assert_eq(edrive_init(&d, e, ZINF_F32, QUANTUM), 0);
	cr_assert_eq(edrive_run(&d, 0, 2, 2, -1), 0, "%s", d.why);
	cr_assert_eq(edrive_micro(&d, 2, 0, EDRIVE_ORDER_NORMAL), 0, "%s", d.why);
	cr_assert_eq(zinf_engine_set_betas(e, 0.5f, b2), 0, "%s", zinf_last_error());
	cr_assert_eq(edrive_micro(&d, 2, 1, EDRIVE_ORDER_NORMAL), 1, "%s", d.why);
	cr_assert_eq(edrive_run(&d, 3, 1, 2, -1), 0, "%s", d.why);
	reference(&ref, 4, 2, &o.optimizer, 2, 0.5f, b2);
	compare_master(e, &ref, true, "beta1 0.5 from step 3");
	eref_result_free(&ref);
	reference(&ref, 4, 2, &o.optimizer, 3, 0.5f, b2);
	compare_master(e, &ref, false, "beta1 0.5 from step 4 only");
	eref_result_free(&ref);
	edrive_fini(&d);
	zinf_engine_destroy(e);
}

/* Refused values change nothing: the run equals the reference with the default betas. */
Test(engine_betas, refused_values)
{
	struct zinf_engine_opts o;
	struct edrive d;
	struct eref_result ref;
	cr_assert_eq(zinf_engine_set_betas(NULL, 0.9f, 0.99f), -EINVAL);
	edrive_opts(&o, "single", 3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_CPU, NULL, ZINF_F32, 1);
	struct zinf_engine *e = make_model(&o);
	cr_assert_eq(zinf_engine_set_betas(e, 1.0f, 0.99f), -EINVAL);
	cr_assert_eq(zinf_engine_set_betas(e, 0.9f, 1.0f), -EINVAL);
	cr_assert_eq(zinf_engine_set_betas(e, -0.1f, 0.99f), -EINVAL);
	cr_assert_eq(zinf_engine_set_betas(e, NAN, 0.99f), -EINVAL);
	cr_assert_eq(zinf_engine_set_betas(e, 0.9f, NAN), -EINVAL);
	cr_assert_eq(edrive_init(&d, e, ZINF_F32, QUANTUM), 0);
	cr_assert_eq(edrive_run(&d, 0, 3, 1, -1), 0, "%s", d.why);
	reference(&ref, 3, 1, &o.optimizer, 0, 0, 0);
	compare_master(e, &ref, true, "after refused betas");
	eref_result_free(&ref);
	edrive_fini(&d);
	zinf_engine_destroy(e);

	/* Adagrad has no betas */
	edrive_opts(&o, "single", 2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, NULL, ZINF_F32, 1);
	zinf_optimizer_opts_init(&o.optimizer, ZINF_OPTIM_ADAGRAD);
	e = make_model(&o);
	cr_assert_eq(zinf_engine_set_betas(e, 0.9f, 0.99f), -EOPNOTSUPP);
	zinf_engine_destroy(e);
}

/* zinf_optimizer_set_betas: a step after it equals a step of an optimizer created with those
 * betas, bit for bit, and differs from the old betas'; refusals. */
Test(engine_betas, optimizer_setter)
{
	enum { N = 37 };
	static const enum zinf_optim_kind kinds[] = {ZINF_OPTIM_ADAM, ZINF_OPTIM_ADAMW,
						     ZINF_OPTIM_LION};
	for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
		struct zinf_optimizer_opts oo;
		struct zinf_optimizer *a = NULL, *b = NULL, *c = NULL;
		zinf_optimizer_opts_init(&oo, kinds[k]);
		oo.lr = 0.01f;
		cr_assert_eq(zinf_optimizer_create(&oo, &a), 0);
		cr_assert_eq(zinf_optimizer_create(&oo, &c), 0);
		oo.beta1 = 0.7f;
		oo.beta2 = 0.9f;
		cr_assert_eq(zinf_optimizer_create(&oo, &b), 0);
		cr_assert_eq(zinf_optimizer_set_betas(a, 0.7f, 0.9f), 0);
		cr_assert_eq(zinf_optimizer_set_betas(a, 1.0f, 0.9f), -EINVAL);
		cr_assert_eq(zinf_optimizer_set_betas(a, 0.7f, -1.0f), -EINVAL);
		float st[3][3][N], g[N];
		for (int i = 0; i < N; i++) {
			g[i] = (float)(i - 18) * 0x1p-6f;
			for (int s = 0; s < 3; s++) {
				st[s][0][i] = (float)i * 0x1p-5f;
				/* nonzero moments, so that both betas weigh in from step 2 */
				st[s][1][i] = (float)(18 - i) * 0x1p-7f;
				st[s][2][i] = (float)(i + 1) * 0x1p-9f;
			}
		}
		struct zinf_optimizer *opts[3] = {a, b, c};
		for (int s = 0; s < 3; s++) {
			void *parts[ZINF_OPTIM_MAX_PARTS] = {st[s][0], st[s][1], st[s][2]};
			cr_assert_eq(zinf_optimizer_step(opts[s], 2, 1.0f, parts, g, ZINF_F32, 0, N,
							 NULL, ZINF_F32),
				     0, "%s", zinf_last_error());
		}
		cr_assert(memcmp(st[0], st[1], sizeof(st[0])) == 0,
			  "kind %d: set_betas differs "
			  "from create",
			  kinds[k]);
		cr_assert(memcmp(st[0], st[2], sizeof(st[0])) != 0, "kind %d: betas had no effect",
			  kinds[k]);
		zinf_optimizer_destroy(a);
		zinf_optimizer_destroy(b);
		zinf_optimizer_destroy(c);
	}
	struct zinf_optimizer_opts oo;
	struct zinf_optimizer *ag = NULL;
	zinf_optimizer_opts_init(&oo, ZINF_OPTIM_ADAGRAD);
	cr_assert_eq(zinf_optimizer_create(&oo, &ag), 0);
	cr_assert_eq(zinf_optimizer_set_betas(ag, 0.9f, 0.99f), -EOPNOTSUPP);
	zinf_optimizer_destroy(ag);
	cr_assert_eq(zinf_optimizer_set_betas(NULL, 0.9f, 0.99f), -EINVAL);
}
