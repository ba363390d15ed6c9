/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/test_engine.c: the ZeRO engine in one process (comm "single", device "host" with
 * asynchronous streams): the option checks of zinf_engine_create (every combination DeepSpeed
 * refuses is -EINVAL and leaves *out alone), argument and order checks (each -EINVAL, and the
 * engine goes on as if the wrong call had not been made: the run still equals the reference bit
 * for bit), and read_master after training against engine_ref's single-process reference for
 * every stage and tier. Several ranks: test_engine_ranks.c under mpirun.
 *
 * Why bit-exact comparisons: with one rank the averaged gradient is the rank's gradient, so the
 * engine and the reference step the same kernel on the same inputs; the tests' gradients are
 * quantised to 2^-14 anyway (engine_ref.h), which makes sums exact in any order.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/vfs.h>

#include "common/test_util.h"
#include "zinf/checkpoint.h"
#include "engine/engine_drive.h"
#include "engine/engine_ref.h"
#include "zinf/config.h"
#include "zinf/engine.h"
#include "zinf/blocks/offload.h"

#define QUANTUM 0x1p-14f

static struct zinf_engine *
make(struct zinf_engine_opts *o)
{
	struct zinf_engine *e = NULL;
	int rc = zinf_engine_create(o, &e);
	cr_assert_eq(rc, 0, "zinf_engine_create: %d %s", rc, zinf_last_error());
	cr_assert_not_null(e);
	return e;
}

static struct zinf_engine *
make_model(struct zinf_engine_opts *o)
{
	struct zinf_engine *e = make(o);
	int rc = edrive_add_params(e);
	cr_assert_eq(rc, 0, "add_params: %d %s", rc, zinf_last_error());
	rc = zinf_engine_init(e);
	cr_assert_eq(rc, 0, "zinf_engine_init: %d %s", rc, zinf_last_error());
	return e;
}

/* Compare every master weight with the reference's, bit for bit. */
static void
assert_master_equals(struct zinf_engine *e, const struct eref_result *ref, const char *what)
{
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		uint64_t n = eref_numel(id);
		float *m = calloc(n, sizeof(float));
		cr_assert_not_null(m);
		int rc = zinf_engine_read_master(e, id, m);
		cr_assert_eq(rc, 0, "%s: read_master(%u): %d %s", what, id, rc, zinf_last_error());
		for (uint64_t i = 0; i < n; i++) {
			cr_assert(memcmp(&m[i], &ref->master[id][i], sizeof(float)) == 0,
				  "%s: %s[%llu] = %.9g, reference %.9g", what, eref_params[id].name,
				  (unsigned long long)i, m[i], ref->master[id][i]);
		}
		free(m);
	}
}

static void
reference_opt(struct eref_result *ref, int steps, uint32_t gas, int lr_step, float lr_after,
	      const struct zinf_optimizer_opts *opt)
{
	struct eref_opts ro = {.world = 1,
			       .steps = steps,
			       .gas = gas,
			       .dtype = ZINF_F32,
			       .quantum = QUANTUM,
			       .lr_step = lr_step,
			       .lr_after = lr_after};
	if (opt) {
		ro.opt = *opt;
	} else {
		edrive_optimizer(&ro.opt);
	}
	int rc = eref_train(&ro, ref);
	cr_assert_eq(rc, 0, "eref_train: %d %s", rc, zinf_last_error());
	/* the quantisation is exact only below 2^6 (engine_ref.h) */
	for (int t = 1; t <= steps; t++) {
		cr_assert_lt(ref->abs_grad[t], 64.0);
	}
}

static void
reference(struct eref_result *ref, int steps, uint32_t gas, int lr_step, float lr_after)
{
	reference_opt(ref, steps, gas, lr_step, lr_after, NULL);
}

/* ---- options ------------------------------------------------------------------------------ */

Test(engine, opts_defaults)
{
	struct zinf_engine_opts o;
	memset(&o, 0xa5, sizeof(o));
	zinf_engine_opts_init(&o);
	cr_assert_eq(o.size, sizeof(o));
	cr_assert_eq(o.stage, 0);
	cr_assert_eq(o.offload_param.device, ZINF_OFFLOAD_NONE);
	cr_assert_eq(o.offload_optimizer.device, ZINF_OFFLOAD_NONE);
	cr_assert_eq(o.offload_param.buffer_count, 5);
	cr_assert_eq(o.offload_optimizer.buffer_count, 4);
	cr_assert_eq(o.offload_optimizer.ratio, 1.0);
	cr_assert_eq(o.sub_group_size, 1000000000ull);
	cr_assert_eq(o.reduce_bucket_size, 500000000ull);
	cr_assert_eq(o.stage3_param_persistence_threshold, 100000ull);
	cr_assert_eq(o.gradient_accumulation_steps, 1);
	cr_assert_eq(o.optimizer.kind, ZINF_OPTIM_ADAMW);
	/* fp32, as the config reader's default and DeepSpeed's with neither fp16 nor bf16: a
	   trainer that does not set it never reads 16-bit values as floats */
	cr_assert_eq(o.dtype, ZINF_F32);
	struct zinf_train_config tc;
	zinf_config_init(&tc);
	cr_assert_eq(tc.engine.dtype, o.dtype, "one default everywhere");
	zinf_config_fini(&tc);
	cr_assert_eq(o.aio.block_size, 1048576);
	cr_assert_eq(o.aio.use_gds, false);
	cr_assert_eq(o.device_index, -1);
	cr_assert_eq(o.host_sync, false);
	cr_assert_eq(o.comm_timeout_s, 1800.0);
	cr_assert_eq(o.step_during_backward, true);
	cr_assert_eq(o.record_trace, true);
	cr_assert_null(o.device);
	cr_assert_null(o.comm);
}

/* One refused combination: -EINVAL naming `key`, *out untouched. */
static void
refused(struct zinf_engine_opts *o, const char *key, const char *what)
{
	struct zinf_engine *sentinel = (struct zinf_engine *)(uintptr_t)0x5a5a;
	struct zinf_engine *e = sentinel;
	int rc = zinf_engine_create(o, &e);
	cr_expect_eq(rc, -EINVAL, "%s: rc %d", what, rc);
	cr_expect_eq(e, sentinel, "%s: *out changed", what);
	cr_expect(strstr(zinf_last_error(), key) != NULL, "%s: message does not name %s: %s", what,
		  key, zinf_last_error());
	if (rc == 0 && e != sentinel) {
		zinf_engine_destroy(e);
	}
}

Test(engine, create_refuses)
{
	struct zinf_engine_opts o;
	char *dir = zt_mkdtemp(NULL);

	/* offload_param below stage 3 (cpu and nvme, stages 0-2) */
	for (int stage = 0; stage < 3; stage++) {
		edrive_opts(&o, "single", stage, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_CPU, dir, ZINF_F32,
			    1);
		refused(&o, "offload_param", "offload_param cpu below stage 3");
		edrive_opts(&o, "single", stage, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NVME, dir,
			    ZINF_F32, 1);
		refused(&o, "offload_param", "offload_param nvme below stage 3");
	}
	/* offload_optimizer at stage 0 */
	edrive_opts(&o, "single", 0, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, dir, ZINF_F32, 1);
	refused(&o, "offload_optimizer", "offload_optimizer cpu at stage 0");
	/* nvme without nvme_path */
	edrive_opts(&o, "single", 2, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, dir, ZINF_F32, 1);
	o.offload_optimizer.n_paths = 0;
	refused(&o, "nvme_path", "optimizer nvme without a path");
	edrive_opts(&o, "single", 3, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NVME, dir, ZINF_F32, 1);
	o.offload_param.n_paths = 0;
	refused(&o, "nvme_path", "param nvme without a path");
	edrive_opts(&o, "single", 3, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NVME, dir, ZINF_F32, 1);
	o.offload_param.nvme_path[0] = NULL;
	refused(&o, "nvme_path", "param nvme with a NULL path");
	/* use_gds */
	edrive_opts(&o, "single", 3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, dir, ZINF_F32, 1);
	o.aio.use_gds = true;
	refused(&o, "use_gds", "use_gds");
	/* ratio other than 1 */
	edrive_opts(&o, "single", 2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, dir, ZINF_F32, 1);
	o.offload_optimizer.ratio = 0.5;
	refused(&o, "ratio", "ratio 0.5");
	/* bf16 state for an optimizer that has none */
	edrive_opts(&o, "single", 2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, dir, ZINF_F32, 1);
	zinf_optimizer_opts_init(&o.optimizer, ZINF_OPTIM_ADAGRAD);
	o.optimizer.state_dtype = ZINF_BF16;
	refused(&o, "state_dtype", "bf16 state for Adagrad");
	/* a bf16 master with fp16 parameters: the step's fp16 copy (the float update rounded) and a
	   load's (the bf16 master's) would differ, so resume would not be exact */
	edrive_opts(&o, "single", 2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, dir, ZINF_F16, 1);
	o.optimizer.master_dtype = ZINF_BF16;
	refused(&o, "zinf_master_weights", "bf16 master with fp16 parameters");
	/* stage out of range, accumulation 0 */
	edrive_opts(&o, "single", 4, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, dir, ZINF_F32, 1);
	refused(&o, "stage", "stage 4");
	edrive_opts(&o, "single", 2, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, dir, ZINF_F32, 0);
	refused(&o, "gradient_accumulation_steps", "gradient_accumulation_steps 0");
	/* a struct from a newer library */
	edrive_opts(&o, "single", 2, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, dir, ZINF_F32, 1);
	o.size = sizeof(o) + 8;
	refused(&o, "size", "size larger than the library's");

	zt_rmtree(dir);
	free(dir);
}

Test(engine, getters_and_registration)
{
	struct zinf_engine_opts o;
	struct zinf_engine *e;
	edrive_opts(&o, "single", 3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_CPU, NULL, ZINF_F32, 1);
	e = make(&o);
	cr_assert_eq(zinf_engine_rank(e), 0);
	cr_assert_eq(zinf_engine_world(e), 1);
	cr_assert_not_null(zinf_engine_device(e));
	cr_assert_str_eq(zinf_device_backend(zinf_engine_device(e)), "host");
	cr_assert_not_null(zinf_engine_compute_stream(e));
	cr_assert_null(zinf_engine_io(e), "no NVMe tier, yet an I/O context");

	/* init before any parameter */
	cr_assert_eq(zinf_engine_init(e), -EINVAL);

	struct zinf_param_desc d;
	zinf_param_desc_init(&d);
	cr_assert_eq(d.size, sizeof(d));
	cr_assert_eq(zinf_engine_add_param(e, NULL), -EINVAL);
	d.name = "x";
	d.numel = 0;
	cr_assert_eq(zinf_engine_add_param(e, &d), -EINVAL, "numel 0");
	d.numel = 4;
	d.layer = -1;
	cr_assert_eq(zinf_engine_add_param(e, &d), -EINVAL, "layer -1");
	cr_assert_eq(zinf_engine_param_count(e), 0, "a refused parameter was registered");
	cr_assert_eq(edrive_add_params(e), 0, "%s", zinf_last_error());
	zinf_param_desc_init(&d);
	d.name = eref_params[3].name;
	d.numel = 4;
	cr_assert_eq(zinf_engine_add_param(e, &d), -EINVAL, "duplicate name");
	cr_assert(strstr(zinf_last_error(), eref_params[3].name) != NULL, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_param_count(e), EREF_NPARAMS);
	cr_assert_eq(zinf_engine_param_find(e, "layer1.weight"), 2);
	cr_assert_eq(zinf_engine_param_find(e, "nope"), -ENOENT);

	/* calls that need init */
	cr_assert_eq(zinf_engine_fetch(e, 0), -EINVAL, "fetch before init");
	float g[16] = {0};
	cr_assert_eq(zinf_engine_grad(e, 1, g, ZINF_F32), -EINVAL, "grad before init");

	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
	zinf_param_desc_init(&d);
	d.name = "late";
	d.numel = 4;
	cr_assert_eq(zinf_engine_add_param(e, &d), -EINVAL, "add_param after init");
	cr_assert_eq(zinf_engine_param_count(e), EREF_NPARAMS);
	cr_assert_eq(zinf_engine_init(e), -EINVAL, "init twice");

	struct zinf_engine_stats st;
	st.size = 3;
	cr_assert_eq(zinf_engine_get_stats(e, &st), -EINVAL);
	cr_assert_eq(zinf_engine_get_stats(e, NULL), -EINVAL);
	st.size = sizeof(st);
	cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
	cr_assert_eq(st.steps, 0);
	cr_assert_eq(st.live_elems, 0, "nothing fetched, nothing persistent: %llu live",
		     (unsigned long long)st.live_elems);
	cr_assert_eq(st.persistent_elems, 0);
	/* one rank, sub-groups of <= 64 elements over the flat partition in backward order
	   b2(3) W2(21) b1(7) | W1(112) | b0(16) | W0(240) */
	cr_assert_eq(st.sub_groups, 4);

	cr_assert_eq(zinf_engine_set_lr(e, -1.0f), -EINVAL);
	cr_assert_eq(zinf_engine_set_lr(e, NAN), -EINVAL);
	cr_assert_eq(zinf_engine_steps(e), 0);
	zinf_engine_destroy(e);
	zinf_engine_destroy(NULL);
}

/*
 * Every wrong call of a micro-batch is -EINVAL and changes nothing: the two steps still equal
 * the reference bit for bit. Step 1 is driven by hand with the wrong calls in between; the
 * gradient of layer1.bias is left out, step() names it, then it is handed and step() finishes.
 */
Test(engine, wrong_order_calls_leave_state_intact)
{
	struct zinf_engine_opts o;
	struct edrive d;
	struct eref_result ref;
	edrive_opts(&o, "single", 3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_CPU, NULL, ZINF_F32, 1);
	struct zinf_engine *e = make_model(&o);
	cr_assert_eq(edrive_init(&d, e, ZINF_F32, QUANTUM), 0);
	void *p;

	cr_assert_eq(zinf_engine_fetch(e, 3), -EINVAL, "unknown layer");
	cr_assert(strstr(zinf_last_error(), "3") != NULL, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_fetch(e, -1), -EINVAL, "layer -1");
	cr_assert_eq(zinf_engine_release(e, 1), -EINVAL, "release of a layer not fetched");
	cr_assert_eq(zinf_engine_param(e, 0, &p), -EINVAL, "param of a layer not fetched");
	cr_assert_eq(zinf_engine_param(e, 99, &p), -EINVAL, "unknown id");

	/* forward */
	for (int32_t l = 0; l < EREF_NLAYERS; l++) {
		cr_assert_eq(zinf_engine_fetch(e, l), 0, "%s", zinf_last_error());
		cr_assert_eq(zinf_engine_fetch(e, l), -EINVAL, "layer %d fetched twice", l);
		for (uint32_t id = 2 * (uint32_t)l; id < 2 * (uint32_t)l + 2; id++) {
			cr_assert_eq(edrive_read_param(&d, id, d.host[id]), 0, "%s", d.why);
		}
		cr_assert_eq(zinf_engine_release(e, l), 0, "%s", zinf_last_error());
		cr_assert_eq(zinf_engine_release(e, l), -EINVAL, "layer %d released twice", l);
	}
	eref_grad((const float *const *)d.host, 0, 0, 0, QUANTUM, d.g);
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		memcpy(d.grad_dev[id], d.g[id], eref_numel(id) * sizeof(float));
	}
	/* backward, layer 2: its gradients, one twice, an unknown id, a step while fetched */
	cr_assert_eq(zinf_engine_fetch(e, 2), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_grad(e, 5, d.grad_dev[5], ZINF_F32), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_grad(e, 5, d.grad_dev[5], ZINF_F32), -EINVAL, "grad twice");
	cr_assert(strstr(zinf_last_error(), "layer2.bias") != NULL, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_grad(e, 6, d.grad_dev[4], ZINF_F32), -EINVAL, "unknown id");
	cr_assert_eq(zinf_engine_grad(e, 4, NULL, ZINF_F32), -EINVAL, "NULL gradient");
	cr_assert_eq(zinf_engine_grad(e, 4, d.grad_dev[4], ZINF_F32), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_step(e), -EINVAL, "step with layer 2 fetched");
	cr_assert_eq(zinf_engine_release(e, 2), 0, "%s", zinf_last_error());
	/* layer 1: the bias gradient left out */
	cr_assert_eq(zinf_engine_fetch(e, 1), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_grad(e, 2, d.grad_dev[2], ZINF_F32), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_release(e, 1), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_fetch(e, 0), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_grad(e, 1, d.grad_dev[1], ZINF_F32), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_grad(e, 0, d.grad_dev[0], ZINF_F32), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_release(e, 0), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_step(e), -EINVAL, "step with layer1.bias missing");
	cr_assert(strstr(zinf_last_error(), "layer1.bias") != NULL, "message: %s",
		  zinf_last_error());
	cr_assert_eq(zinf_engine_steps(e), 0);
	/* complete the micro-batch */
	cr_assert_eq(zinf_engine_grad(e, 3, d.grad_dev[3], ZINF_F32), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_step(e), 1, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_steps(e), 1);
	reference(&ref, 1, 1, 0, 0);
	assert_master_equals(e, &ref, "after step 1");
	eref_result_free(&ref);

	/* step 2 through the trainer */
	int rc = edrive_run(&d, 1, 1, 1, -1);
	cr_assert_eq(rc, 0, "%s", d.why);
	reference(&ref, 2, 1, 0, 0);
	assert_master_equals(e, &ref, "after step 2");
	eref_result_free(&ref);
	edrive_fini(&d);
	zinf_engine_destroy(e);
}

struct config {
	int stage;
	enum zinf_offload_device opt, param;
	uint32_t gas;
	bool sdb;
};

/* read_master after 4 steps equals the reference for every stage and tier; the learning rate
 * changes after step 2 (zinf_engine_set_lr). */
Test(engine, read_master_equals_reference)
{
	static const struct config cfgs[] = {
		{0, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, 2, true},
		{1, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, 2, true},
		{2, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, 1, false},
		{2, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, 3, true},
		{3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NVME, 2, true},
		{3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_CPU, 2, false},
		{3, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, 1, true},
	};
	char *dir = zt_mkdtemp(NULL);
	for (size_t k = 0; k < sizeof(cfgs) / sizeof(cfgs[0]); k++) {
		const struct config *c = &cfgs[k];
		struct zinf_engine_opts o;
		struct edrive d;
		struct eref_result ref;
		char what[96];
		snprintf(what, sizeof(what), "stage %d opt %d param %d gas %u sdb %d", c->stage,
			 c->opt, c->param, c->gas, c->sdb);
		edrive_opts(&o, "single", c->stage, c->opt, c->param, dir, ZINF_F32, c->gas);
		o.step_during_backward = c->sdb;
		struct zinf_engine *e = make_model(&o);
		cr_assert_eq((zinf_engine_io(e) != NULL),
			     (c->opt == ZINF_OFFLOAD_NVME || c->param == ZINF_OFFLOAD_NVME), "%s",
			     what);
		cr_assert_eq(edrive_init(&d, e, ZINF_F32, QUANTUM), 0);
		int rc = edrive_run(&d, 0, 2, c->gas, -1);
		cr_assert_eq(rc, 0, "%s: %s", what, d.why);
		cr_assert_eq(zinf_engine_set_lr(e, 0.003f), 0);
		rc = edrive_run(&d, 2, 2, c->gas, -1);
		cr_assert_eq(rc, 0, "%s: %s", what, d.why);
		cr_assert_eq(zinf_engine_steps(e), 4, "%s", what);
		struct zinf_engine_stats st = {.size = sizeof(st)};
		cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
		cr_assert_eq(st.steps, 4, "%s", what);
		cr_assert_eq(st.micro_steps, 4 * c->gas, "%s", what);
		cr_assert_eq(st.sub_groups, 4, "%s", what);
		cr_assert_leq(st.stepped_during_backward, st.sub_groups, "%s", what);
		if (!c->sdb) {
			cr_assert_eq(st.stepped_during_backward, 0, "%s", what);
		}
		if (c->stage == 3) {
			/* one layer at a time: at least the largest layer, 240 + 16 */
			cr_assert_geq(st.peak_live_elems, 256, "%s", what);
		}
		reference(&ref, 4, c->gas, 2, 0.003f);
		assert_master_equals(e, &ref, what);
		eref_result_free(&ref);
		edrive_fini(&d);
		zinf_engine_destroy(e);
	}
	zt_rmtree(dir);
	free(dir);
}

/*
 * DeepSpeed's schema takes 0 for its sizes (ge=0, runtime/zero/config.py) and runs with them:
 * sub_group_size 0 is a sub-group per parameter (_create_fp16_sub_groups closes a group once it
 * holds sub_group_size elements), reduce_bucket_size 0 a bucket per parameter,
 * allgather_bucket_size 0 one all-gather at a time, stage3_prefetch_bucket_size 0 no prefetch.
 * Each alone and all four together, on stages 1-3 and every tier: the engine trains 4 steps of 2
 * micro-batches and equals the reference bit for bit; sub_group_size 0 gives 6 sub-groups (one
 * per parameter).
 */
Test(engine, deepspeed_zero_sizes)
{
	static const struct config cfgs[] = {
		{1, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, 2, true},
		{2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, 2, true},
		{3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, 2, true},
		{3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_CPU, 2, false},
	};
	static const char *const names[] = {"sub_group_size", "reduce_bucket_size",
					    "allgather_bucket_size", "stage3_prefetch_bucket_size",
					    "all four"};
	struct eref_result ref;
	char *dir = zt_mkdtemp(NULL);
	reference(&ref, 4, 2, 0, 0);
	for (size_t k = 0; k < sizeof(cfgs) / sizeof(cfgs[0]); k++) {
		const struct config *c = &cfgs[k];
		for (int z = 0; z < 5; z++) {
			struct zinf_engine_opts o;
			struct edrive d;
			char what[128];
			snprintf(what, sizeof(what), "stage %d opt %d param %d: %s 0", c->stage,
				 c->opt, c->param, names[z]);
			edrive_opts(&o, "single", c->stage, c->opt, c->param, dir, ZINF_F32,
				    c->gas);
			o.step_during_backward = c->sdb;
			o.sub_group_size = z == 0 || z == 4 ? 0 : o.sub_group_size;
			o.reduce_bucket_size = z == 1 || z == 4 ? 0 : o.reduce_bucket_size;
			o.allgather_bucket_size = z == 2 || z == 4 ? 0 : o.allgather_bucket_size;
			o.stage3_prefetch_bucket_size =
				z == 3 || z == 4 ? 0 : o.stage3_prefetch_bucket_size;
			struct zinf_engine *e = make_model(&o);
			cr_assert_eq(edrive_init(&d, e, ZINF_F32, QUANTUM), 0);
			cr_assert_eq(edrive_run(&d, 0, 4, c->gas, -1), 0, "%s: %s", what, d.why);
			struct zinf_engine_stats st = {.size = sizeof(st)};
			cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
			cr_assert_eq(st.steps, 4, "%s", what);
			cr_assert_eq(st.sub_groups, o.sub_group_size == 0 ? EREF_NPARAMS : 4,
				     "%s: %u sub-groups", what, st.sub_groups);
			assert_master_equals(e, &ref, what);
			edrive_fini(&d);
			zinf_engine_destroy(e);
		}
	}
	eref_result_free(&ref);
	zt_rmtree(dir);
	free(dir);
}

/*
 * zinf_engine_opts_check against the engine itself: for each option the engine refuses, the
 * check refuses it with the same errno (create's checks at create, the I/O checks where init
 * meets them: its I/O context and swap space), and what the check accepts the engine trains with.
 * Values: aio.block_size 1000 (not a power of two), aio.queue_depth 1e9, an nvme_path that is a
 * file, one that does not exist, tmpfs (no O_DIRECT), a read-only mount (a bind mount of a
 * scratch directory remounted read-only in a mount namespace of this test's own; skipped where
 * the process may not mount), a stage out of range.
 */
static void
check_like_engine(struct zinf_engine_opts *o, int want, const char *what)
{
	int rc = zinf_engine_opts_check(o);
	cr_expect_eq(rc, want, "%s: zinf_engine_opts_check %d, expected %d: %s", what, rc, want,
		     zinf_last_error());
	struct zinf_engine *e = NULL;
	int ec = zinf_engine_create(o, &e);
	if (ec == 0) {
		ec = edrive_add_params(e);
		ec = ec ? ec : zinf_engine_init(e);
	}
	cr_expect_eq(ec, want, "%s: the engine returned %d, the check %d", what, ec, rc);
	zinf_engine_destroy(e);
}

Test(engine, opts_check_refuses_what_the_engine_refuses)
{
	struct zinf_engine_opts o;
	char *dir = zt_mkdtemp(NULL), file[4200];
	snprintf(file, sizeof(file), "%s/a-file", dir);
	FILE *f = fopen(file, "w");
	cr_assert_not_null(f);
	fclose(f);

	edrive_opts(&o, "single", 3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, dir, ZINF_F32, 1);
	check_like_engine(&o, 0, "defaults on a scratch directory");
	o.aio.block_size = 1000;
	check_like_engine(&o, -EINVAL, "aio.block_size 1000");
	cr_assert_eq(zinf_engine_opts_check(&o), -EINVAL);
	cr_expect(strstr(zinf_last_error(), "aio: block_size 1000") != NULL, "%s",
		  zinf_last_error());
	o.aio.block_size = 1 << 20;
	o.aio.queue_depth = 1000000000;
	check_like_engine(&o, -EINVAL, "aio.queue_depth 1e9");
	cr_assert_eq(zinf_engine_opts_check(&o), -EINVAL);
	cr_expect(strstr(zinf_last_error(), "queue_depth 1000000000") != NULL, "%s",
		  zinf_last_error());
	o.aio.queue_depth = 8;
	o.offload_optimizer.nvme_path[0] = file;
	check_like_engine(&o, -ENOTDIR, "nvme_path a file");
	cr_assert_eq(zinf_engine_opts_check(&o), -ENOTDIR);
	cr_expect(strstr(zinf_last_error(), "zero_optimization.offload_optimizer.nvme_path") &&
			  strstr(zinf_last_error(), file),
		  "%s", zinf_last_error());
	o.offload_optimizer.nvme_path[0] = "/nonexistent/zinf";
	check_like_engine(&o, -ENOENT, "nvme_path missing");
	o.offload_optimizer.nvme_path[0] = dir;
	/* only a tier on NVMe opens the I/O context: the aio values do not matter elsewhere */
	edrive_opts(&o, "single", 3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_CPU, NULL, ZINF_F32, 1);
	o.aio.block_size = 1000;
	check_like_engine(&o, 0, "aio.block_size 1000 without NVMe");
	edrive_opts(&o, "single", 4, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, NULL, ZINF_F32, 1);
	check_like_engine(&o, -EINVAL, "stage 4");

	struct statfs sf;
	if (statfs("/dev/shm", &sf) == 0 && sf.f_type == TMPFS_MAGIC) {
		char *shm = zt_mkdtemp("/dev/shm");
		edrive_opts(&o, "single", 2, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, shm, ZINF_F32,
			    1);
		check_like_engine(&o, -EINVAL, "tmpfs");
		cr_assert_eq(zinf_engine_opts_check(&o), -EINVAL);
		cr_expect(strstr(zinf_last_error(), shm) != NULL, "%s", zinf_last_error());
		zt_rmtree(shm);
		free(shm);
	}
	/* last: the mount namespace stays this process's to its end */
	int rc = zt_readonly_bind(dir);
	if (rc == 0) {
		edrive_opts(&o, "single", 2, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, dir, ZINF_F32,
			    1);
		check_like_engine(&o, -EROFS, "a read-only mount");
		cr_assert_eq(zinf_engine_opts_check(&o), -EROFS);
		cr_expect(strstr(zinf_last_error(), dir) != NULL, "%s", zinf_last_error());
		zt_readonly_unbind(dir);
	}
	zt_rmtree(dir);
	free(dir);
	if (rc) {
		cr_skip_test("read-only mount: %s (the other values passed)", strerror(-rc));
	}
}

/* The test model's parameters as zinf_engine_plan takes them. */
static void
model_descs(struct zinf_param_desc d[EREF_NPARAMS])
{
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		zinf_param_desc_init(&d[id]);
		d[id].name = eref_params[id].name;
		d[id].numel = eref_numel(id);
		d[id].layer = eref_params[id].layer;
	}
}

/*
 * zinf_engine_plan against the engine it plans: for stages 0-3, every optimizer and parameter
 * tier, pinned or not, clipping (the speculation's reserve in the optimizer pool), sub_group_size
 * 0 and several buffer counts, the plan's host pool bytes equal the engine's host_pool_bytes
 * after init, and its sub-groups the engine's. (The plan of `zinf config check` said 3 GiB for a
 * run that pinned 5 MiB: it sized the parameter buffers by buffer_size, the engine by the largest
 * partition.)
 */
Test(engine, plan_equals_the_engine)
{
	static const struct {
		int stage;
		enum zinf_offload_device opt, param;
		bool pin, clip;
		uint32_t buffers;
		uint64_t sub_group;
		uint64_t max_in_cpu; /* offload_param: the NVMe tier's cache (0: none) */
	} cfgs[] = {
		{0, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, false, false, 4, 64, 0},
		{1, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, true, false, 4, 64, 0},
		{2, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, true, false, 4, 64, 0},
		{2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, false, true, 2, 64, 0},
		{3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_CPU, true, false, 4, 64, 0},
		{3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, true, false, 8, 64, 0},
		{3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, true, true, 3, 0, 0},
		{3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_CPU, false, true, 1, 1000, 0},
		{3, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NVME, true, false, 5, 64, 0},
		/* the parameter cache in the pool's CPU region: part of the model, all of it
		   (1e9 elements, capped at the partitions) */
		{3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, true, false, 4, 64, 500},
		{3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NVME, false, true, 2, 64, 1000000000},
	};
	struct zinf_param_desc descs[EREF_NPARAMS];
	model_descs(descs);
	char *dir = zt_mkdtemp(NULL);
	uint64_t seen_max = 0;
	for (size_t k = 0; k < sizeof(cfgs) / sizeof(cfgs[0]); k++) {
		struct zinf_engine_opts o;
		char what[96];
		snprintf(what, sizeof(what),
			 "stage %d opt %d param %d pin %d clip %d buffers %u max_in_cpu %llu",
			 cfgs[k].stage, cfgs[k].opt, cfgs[k].param, cfgs[k].pin, cfgs[k].clip,
			 cfgs[k].buffers, (unsigned long long)cfgs[k].max_in_cpu);
		edrive_opts(&o, "single", cfgs[k].stage, cfgs[k].opt, cfgs[k].param, dir, ZINF_F32,
			    1);
		o.offload_optimizer.pin_memory = o.offload_param.pin_memory = cfgs[k].pin;
		o.offload_optimizer.buffer_count = o.offload_param.buffer_count = cfgs[k].buffers;
		o.sub_group_size = cfgs[k].sub_group;
		o.gradient_clipping = cfgs[k].clip ? 1.0 : 0.0;
		o.offload_param.max_in_cpu = cfgs[k].max_in_cpu;
		struct zinf_engine_plan plan = {.size = sizeof(plan)};
		cr_assert_eq(zinf_engine_plan(&o, 1, 0, descs, EREF_NPARAMS, &plan), 0, "%s: %s",
			     what, zinf_last_error());
		struct zinf_engine *e = make_model(&o);
		struct zinf_engine_stats st = {.size = sizeof(st)};
		cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
		cr_expect_eq(plan.host_pool_bytes, st.host_pool_bytes, "%s: plan %llu, engine %llu",
			     what, (unsigned long long)plan.host_pool_bytes,
			     (unsigned long long)st.host_pool_bytes);
		cr_expect_eq(plan.host_pool_bytes,
			     plan.param_pool_bytes + plan.optim_pool_bytes + plan.grad_window_bytes,
			     "%s", what);
		cr_expect_eq(plan.sub_groups, st.sub_groups, "%s", what);
		/* NVMe parameters: the cache beyond the buffers, worked from the sizes (fp32, one
		   rank, extents of 4096 bytes): max_in_cpu x 4 bytes, or every partition's extent
		 */
		if (cfgs[k].param == ZINF_OFFLOAD_NVME && cfgs[k].max_in_cpu) {
			uint64_t all = 0;
			for (uint32_t i = 0; i < EREF_NPARAMS; i++) {
				all += (descs[i].numel * 4 + 4095) / 4096 * 4096;
			}
			uint64_t want = cfgs[k].max_in_cpu * 4 < all
						? (cfgs[k].max_in_cpu * 4 + 4095) / 4096 * 4096
						: all;
			cr_expect_eq(plan.param_pool_bytes,
				     (uint64_t)plan.param_buffers * plan.param_buffer_bytes + want,
				     "%s: cache of %llu bytes", what, (unsigned long long)want);
		}
		/* NVMe parameters: the cache beyond the buffers exactly when there is one */
		cr_expect(cfgs[k].param != ZINF_OFFLOAD_NVME ||
				  (plan.param_pool_bytes >
				   (uint64_t)plan.param_buffers * plan.param_buffer_bytes) ==
					  (cfgs[k].max_in_cpu > 0),
			  "%s: %llu", what, (unsigned long long)plan.param_pool_bytes);
		cr_expect_eq(plan.host_pool_bytes > 0,
			     cfgs[k].opt != ZINF_OFFLOAD_NONE || cfgs[k].param != ZINF_OFFLOAD_NONE,
			     "%s: %llu", what, (unsigned long long)plan.host_pool_bytes);
		/* the reserve: clipping, and a sub-group other than the last to speculate on */
		cr_expect_eq(plan.speculation_bytes > 0, cfgs[k].clip && plan.sub_groups > 1, "%s",
			     what);
		seen_max = plan.host_pool_bytes > seen_max ? plan.host_pool_bytes : seen_max;
		zinf_engine_destroy(e);
	}
	cr_expect_gt(seen_max, 0);
	/* bad options or parameters: refused as create and add_param refuse them */
	struct zinf_engine_opts o;
	struct zinf_engine_plan plan = {.size = sizeof(plan)};
	edrive_opts(&o, "single", 4, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, NULL, ZINF_F32, 1);
	cr_expect_eq(zinf_engine_plan(&o, 1, 0, descs, EREF_NPARAMS, &plan), -EINVAL);
	edrive_opts(&o, "single", 3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_CPU, NULL, ZINF_F32, 1);
	descs[2].name = descs[1].name;
	cr_expect_eq(zinf_engine_plan(&o, 1, 0, descs, EREF_NPARAMS, &plan), -EINVAL);
	cr_expect(strstr(zinf_last_error(), "already registered") != NULL, "%s", zinf_last_error());
	cr_expect_eq(zinf_engine_plan(&o, 0, 0, descs, EREF_NPARAMS, &plan), -EINVAL, "world 0");
	zt_rmtree(dir);
	free(dir);
}

/* optimizer_schedule deepspeed (DeepSpeed's one read ahead, one write behind; for comparisons)
 * changes the order of the NVMe traffic, not the result: the reference bit for bit, during and
 * after backward; an unknown schedule is refused naming the option. */
Test(engine, deepspeed_schedule_same_result)
{
	char *dir = zt_mkdtemp(NULL);
	for (int sdb = 0; sdb <= 1; sdb++) {
		struct zinf_engine_opts o;
		struct edrive d;
		struct eref_result ref;
		edrive_opts(&o, "single", 3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, dir, ZINF_F32,
			    2);
		o.step_during_backward = sdb;
		o.optimizer_schedule = ZINF_SCHEDULE_DEEPSPEED;
		struct zinf_engine *e = make_model(&o);
		cr_assert_eq(edrive_init(&d, e, ZINF_F32, QUANTUM), 0);
		int rc = edrive_run(&d, 0, 3, 2, -1);
		cr_assert_eq(rc, 0, "%s", d.why);
		reference(&ref, 3, 2, 0, 0);
		assert_master_equals(e, &ref,
				     sdb ? "deepspeed schedule, during" : "deepspeed, after");
		eref_result_free(&ref);
		edrive_fini(&d);
		zinf_engine_destroy(e);
	}
	struct zinf_engine_opts o;
	edrive_opts(&o, "single", 3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, dir, ZINF_F32, 2);
	o.optimizer_schedule = 2;
	refused(&o, "optimizer_schedule", "schedule 2");
	zt_rmtree(dir);
	free(dir);
}

/* Learning rate 0 from the start: AdamW's p *= 1 - lr * wd and the update are both exactly
 * zero, so the master weights stay the initial values bit for bit. */
Test(engine, lr_zero_keeps_the_weights)
{
	struct zinf_engine_opts o;
	struct edrive d;
	edrive_opts(&o, "single", 2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, NULL, ZINF_F32, 1);
	struct zinf_engine *e = make_model(&o);
	cr_assert_eq(zinf_engine_set_lr(e, 0.0f), 0);
	cr_assert_eq(edrive_init(&d, e, ZINF_F32, QUANTUM), 0);
	cr_assert_eq(edrive_run(&d, 0, 2, 1, -1), 0, "%s", d.why);
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		float m[240];
		cr_assert_eq(zinf_engine_read_master(e, id, m), 0, "%s", zinf_last_error());
		for (uint64_t i = 0; i < eref_numel(id); i++) {
			cr_assert_eq(m[i], eref_init_value(id, i), "%s[%llu]", eref_params[id].name,
				     (unsigned long long)i);
		}
	}
	cr_assert_eq(zinf_engine_read_master(e, 6, (float[1]){0}), -EINVAL);
	edrive_fini(&d);
	zinf_engine_destroy(e);
}

/*
 * Every optimizer kind through the engine equals the same kernel run on whole tensors by the
 * reference, bit for bit: Adam (L2), Adagrad, Lion, and AdamW with bf16 state rounded to nearest
 * even (no dependence on how the engine cuts its sub-groups, unlike stochastic rounding), over
 * the tiers that step on the host (cpu, nvme) and on the device (none: "host" device memory).
 */
Test(engine, optimizers_equal_reference)
{
	static const struct {
		enum zinf_optim_kind kind;
		enum zinf_dtype state;
		int stage;
		enum zinf_offload_device opt, param;
	} cases[] = {
		{ZINF_OPTIM_ADAM, ZINF_F32, 2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE},
		{ZINF_OPTIM_ADAGRAD, ZINF_F32, 3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_CPU},
		{ZINF_OPTIM_ADAGRAD, ZINF_F32, 1, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE},
		{ZINF_OPTIM_LION, ZINF_F32, 3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NVME},
		{ZINF_OPTIM_LION, ZINF_F32, 2, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE},
		{ZINF_OPTIM_ADAMW, ZINF_BF16, 2, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE},
	};
	char *dir = zt_mkdtemp(NULL);
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		struct zinf_engine_opts o;
		struct edrive d;
		struct eref_result ref;
		char what[96];
		edrive_opts(&o, "single", cases[k].stage, cases[k].opt, cases[k].param, dir,
			    ZINF_F32, 2);
		zinf_optimizer_opts_init(&o.optimizer, cases[k].kind);
		o.optimizer.lr = 0.01f;
		o.optimizer.weight_decay = 0.01f;
		o.optimizer.state_dtype = cases[k].state;
		o.optimizer.rounding = ZINF_ROUND_NEAREST_EVEN;
		snprintf(what, sizeof(what), "optimizer kind %d state %s stage %d tier %d/%d",
			 cases[k].kind, zinf_dtype_name(cases[k].state), cases[k].stage,
			 cases[k].opt, cases[k].param);
		struct zinf_engine *e = make_model(&o);
		cr_assert_eq(edrive_init(&d, e, ZINF_F32, QUANTUM), 0);
		int rc = edrive_run(&d, 0, 3, 2, -1);
		cr_assert_eq(rc, 0, "%s: %s", what, d.why);
		reference_opt(&ref, 3, 2, 0, 0, &o.optimizer);
		assert_master_equals(e, &ref, what);
		eref_result_free(&ref);
		edrive_fini(&d);
		zinf_engine_destroy(e);
	}
	zt_rmtree(dir);
	free(dir);
}

/*
 * step_during_backward on, one rank ("single": every reduction completes when posted), stage 2,
 * buckets of 100 elements: backward hands b2 W2 b1 (31 elements, one bucket), W1 (112, a bucket
 * alone), b0, W0. When W1's bucket closes, the first bucket's reduction is accumulated, so
 * sub-group 0 (b2 W2 b1) is final while backward still runs layers 1 and 0: engine.h says it is
 * stepped then ("step each sub-group as soon as its gradient is final"), and the statistics
 * count it in stepped_during_backward. The result is bit for bit the one without.
 */
Test(engine, step_during_backward_steps_early)
{
	struct zinf_engine_opts o;
	struct edrive d;
	struct eref_result ref;
	edrive_opts(&o, "single", 2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, NULL, ZINF_F32, 1);
	o.step_during_backward = true;
	struct zinf_engine *e = make_model(&o);
	cr_assert_eq(edrive_init(&d, e, ZINF_F32, QUANTUM), 0);
	cr_assert_eq(edrive_run(&d, 0, 2, 1, -1), 0, "%s", d.why);
	struct zinf_engine_stats st = {.size = sizeof(st)};
	cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
	cr_assert_eq(st.sub_groups, 4);
	cr_expect_geq(st.stepped_during_backward, 1,
		      "no sub-group of 4 stepped before the final zinf_engine_step() with "
		      "step_during_backward on");
	reference(&ref, 2, 1, 0, 0);
	assert_master_equals(e, &ref, "step during backward");
	eref_result_free(&ref);
	edrive_fini(&d);
	zinf_engine_destroy(e);
}

/*
 * stage3_max_live_parameters below the largest layer (64 < 240 + 16): the fetch of a layer
 * larger than the bound still happens when nothing else is live (a warning), the peak is that
 * layer, never two layers at once, and training is unchanged (bit for bit the reference).
 */
Test(engine, live_bound_below_a_layer)
{
	struct zinf_engine_opts o;
	struct edrive d;
	struct eref_result ref;
	edrive_opts(&o, "single", 3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_CPU, NULL, ZINF_F32, 1);
	o.stage3_max_live_parameters = 64;
	struct zinf_engine *e = make_model(&o);
	cr_assert_eq(edrive_init(&d, e, ZINF_F32, QUANTUM), 0);
	cr_assert_eq(edrive_run(&d, 0, 2, 1, -1), 0, "%s", d.why);
	struct zinf_engine_stats st = {.size = sizeof(st)};
	cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
	cr_assert_eq(st.peak_live_elems, 256, "peak %llu: layer 0 alone is 240 + 16",
		     (unsigned long long)st.peak_live_elems);
	cr_assert_eq(st.live_elems, 0);
	reference(&ref, 2, 1, 0, 0);
	assert_master_equals(e, &ref, "live bound below a layer");
	eref_result_free(&ref);
	edrive_fini(&d);
	zinf_engine_destroy(e);
}

static int
failing_init(void *ctx, uint32_t param, uint64_t first, uint64_t count, float *out)
{
	(void)ctx;
	(void)first;
	(void)count;
	(void)out;
	return param == 2 ? -EIO : 0;
}

/* An init callback's error comes back from zinf_engine_init; a parameter partition larger than
 * offload_param.buffer_size is -EINVAL naming the key. */
Test(engine, init_errors)
{
	struct zinf_engine_opts o;
	struct zinf_engine *e;
	struct zinf_param_desc d;
	char *dir = zt_mkdtemp(NULL);

	edrive_opts(&o, "single", 3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_CPU, NULL, ZINF_F32, 1);
	e = make(&o);
	for (uint32_t id = 0; id < 3; id++) {
		zinf_param_desc_init(&d);
		d.name = eref_params[id].name;
		d.numel = eref_numel(id);
		d.layer = eref_params[id].layer;
		d.init_fn = failing_init;
		cr_assert_eq(zinf_engine_add_param(e, &d), (int)id);
	}
	cr_assert_eq(zinf_engine_init(e), -EIO, "the init callback's error");
	zinf_engine_destroy(e);

	edrive_opts(&o, "single", 3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NVME, dir, ZINF_F32, 1);
	o.offload_param.buffer_size = 100; /* layer0.weight's partition is 240 */
	e = make(&o);
	cr_assert_eq(edrive_add_params(e), 0);
	cr_assert_eq(zinf_engine_init(e), -EINVAL, "a partition larger than buffer_size");
	cr_assert(strstr(zinf_last_error(), "buffer_size") != NULL, "%s", zinf_last_error());
	zinf_engine_destroy(e);
	zt_rmtree(dir);
	free(dir);
}

static int
count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	int n = 0;
	if (!d) {
		return -1;
	}
	for (struct dirent *de; (de = readdir(d));) {
		n += strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0;
	}
	closedir(d);
	return n;
}

/*
 * Both tiers on NVMe: the window's statistics count NVMe bytes both ways (the optimizer reads
 * and writes every sub-group; fetches read the parameters), the swap files are in nvme_path
 * while the engine lives and gone after zinf_engine_destroy (engine.h). With no NVMe tier the
 * NVMe counters stay 0.
 */
Test(engine, nvme_bytes_and_swap_files)
{
	struct zinf_engine_opts o;
	struct edrive d;
	char *dir = zt_mkdtemp(NULL);
	struct zinf_engine_stats st = {.size = sizeof(st)};

	edrive_opts(&o, "single", 3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, dir, ZINF_F32, 1);
	struct zinf_engine *e = make_model(&o);
	cr_assert_eq(edrive_init(&d, e, ZINF_F32, QUANTUM), 0);
	cr_assert_eq(edrive_run(&d, 0, 2, 1, -1), 0, "%s", d.why);
	cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
	cr_assert_gt(st.nvme_read_bytes, 0, "no NVMe read counted with both tiers on NVMe");
	cr_assert_gt(st.nvme_write_bytes, 0, "no NVMe write counted with both tiers on NVMe");
	cr_assert_gt(count_entries(dir), 0, "no swap file in %s", dir);
	edrive_fini(&d);
	zinf_engine_destroy(e);
	cr_assert_eq(count_entries(dir), 0, "swap files left in %s after destroy", dir);

	edrive_opts(&o, "single", 3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_CPU, dir, ZINF_F32, 1);
	e = make_model(&o);
	cr_assert_eq(edrive_init(&d, e, ZINF_F32, QUANTUM), 0);
	cr_assert_eq(edrive_run(&d, 0, 1, 1, -1), 0, "%s", d.why);
	cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
	cr_assert_eq(st.nvme_read_bytes + st.nvme_write_bytes, 0, "NVMe bytes with no NVMe tier");
	edrive_fini(&d);
	zinf_engine_destroy(e);
	zt_rmtree(dir);
	free(dir);
}

/* Masters of every parameter, concatenated (EREF order). */
static float *
read_masters(struct zinf_engine *e, size_t *n_out)
{
	size_t n = 0;
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		n += eref_numel(id);
	}
	float *m = calloc(n, sizeof(float)), *at = m;
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		cr_assert_eq(zinf_engine_read_master(e, id, at), 0, "%s", zinf_last_error());
		at += eref_numel(id);
	}
	*n_out = n;
	return m;
}

/*
 * A bf16 master (optimizer.master_dtype) through the engine, with fp32 and with q8 moments: the
 * cpu tier at stages 1 and 2 and NVMe at stage 3 (parameters on the CPU) give the same masters bit
 * for bit (one rank: the same flat partition, so every element hashes the same index); every
 * master read_master returns is a bf16 value widened (low 16 bits zero); they follow the fp32
 * master (the reference, per tensor): the bf16 master starts rounded to nearest (half an ulp of
 * |w| <= 2^-9 |w|) and each of the three steps rounds within one ulp, so the total deviation is
 * at most about 3.5 ulps of each weight summed: measured 5.3% of fp32's movement (lr 0.01),
 * 5.4% with q8 moments; the test allows 12%. A master that did not move (an update lost) would
 * deviate by the whole movement. The device tier refuses a bf16 master naming
 * offload_optimizer.device.
 */
Test(engine, bf16_master_tiers_agree_and_track_fp32)
{
	static const struct {
		int stage;
		enum zinf_offload_device opt, param;
	} cases[] = {
		{2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE},
		{1, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE},
		{3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_CPU},
	};
	char *dir = zt_mkdtemp(NULL);
	for (int q8 = 0; q8 < 2; q8++) {
		float *first = NULL, *init = NULL;
		size_t n = 0;
		for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
			struct zinf_engine_opts o;
			struct edrive d;
			edrive_opts(&o, "single", cases[k].stage, cases[k].opt, cases[k].param, dir,
				    ZINF_F32, 2);
			o.optimizer.lr = 0.01f;
			o.optimizer.weight_decay = 0.01f;
			o.optimizer.master_dtype = ZINF_BF16;
			o.optimizer.state_format = q8 ? ZINF_STATE_Q8 : ZINF_STATE_PLAIN;
			struct zinf_engine *e = make_model(&o);
			cr_assert_eq(edrive_init(&d, e, ZINF_F32, QUANTUM), 0);
			if (!init) {
				init = read_masters(e, &n);
			}
			int rc = edrive_run(&d, 0, 3, 2, -1);
			cr_assert_eq(rc, 0, "stage %d: %s", cases[k].stage, d.why);
			float *m = read_masters(e, &n);
			for (size_t i = 0; i < n; i++) {
				uint32_t u;
				memcpy(&u, &m[i], 4);
				cr_assert_eq(u & 0xffffu, 0,
					     "master %zu = %.9g is not a bf16 value", i, m[i]);
			}
			if (!first) {
				first = m;
				struct eref_result ref;
				struct zinf_optimizer_opts fp32 = o.optimizer;
				fp32.master_dtype = ZINF_F32;
				fp32.state_format = ZINF_STATE_PLAIN;
				reference_opt(&ref, 3, 2, 0, 0, &fp32);
				double dev = 0, moved = 0;
				size_t at = 0;
				for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
					for (uint64_t i = 0; i < eref_numel(id); i++, at++) {
						dev += fabs((double)m[at] - ref.master[id][i]);
						moved += fabs((double)ref.master[id][i] -
							      eref_init_value(id, i));
					}
				}
				printf("bf16 master%s: deviation %.4g of fp32's movement %.4g "
				       "(%.1f%%)\n",
				       q8 ? " + q8" : "", dev, moved, 100 * dev / moved);
				cr_assert(moved > 0 && dev < 0.12 * moved,
					  "bf16 master%s deviates %.6g from the fp32 master, which "
					  "moved %.6g",
					  q8 ? " + q8" : "", dev, moved);
				eref_result_free(&ref);
			} else {
				cr_assert(!memcmp(first, m, n * sizeof(float)),
					  "q8 %d stage %d tier %d: masters differ from stage 2 cpu",
					  q8, cases[k].stage, cases[k].opt);
				free(m);
			}
			edrive_fini(&d);
			zinf_engine_destroy(e);
		}
		free(first);
		free(init);
	}
	struct zinf_engine_opts o;
	edrive_opts(&o, "single", 2, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, dir, ZINF_F32, 1);
	o.optimizer.master_dtype = ZINF_BF16;
	refused(&o, "offload_optimizer.device", "a bf16 master on the device tier");
	zt_rmtree(dir);
	free(dir);
}

/*
 * 8-bit blockwise m and v (ZINF_STATE_Q8) through the engine: the cpu tier at stages 1 and 2 and
 * NVMe at stage 3 (parameters on the CPU) give the same masters bit for bit (one rank: the same
 * flat partition and sub-groups); they follow fp32 state (the reference, per tensor): over three
 * steps the masters' total deviation from it is under 5% of fp32's total movement (measured: 0.54%;
 * the codes' error, 2^-5 of m and of sqrt(v) per element, makes each update a few percent off; a
 * lost m, zero updates, would be a deviation of the whole movement). The device tier (offload
 * none) refuses q8 naming offload_optimizer.device (checkpoints: ckpt_resume).
 */
Test(engine, q8_state_tiers_agree_and_track_fp32)
{
	static const struct {
		int stage;
		enum zinf_offload_device opt, param;
	} cases[] = {
		{2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE},
		{1, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE},
		{3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_CPU},
	};
	char *dir = zt_mkdtemp(NULL);
	float *first = NULL, *init = NULL;
	size_t n = 0;
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		struct zinf_engine_opts o;
		struct edrive d;
		edrive_opts(&o, "single", cases[k].stage, cases[k].opt, cases[k].param, dir,
			    ZINF_F32, 2);
		o.optimizer.lr = 0.01f;
		o.optimizer.weight_decay = 0.01f;
		o.optimizer.state_format = ZINF_STATE_Q8;
		struct zinf_engine *e = make_model(&o);
		cr_assert_eq(edrive_init(&d, e, ZINF_F32, QUANTUM), 0);
		if (!init) {
			init = read_masters(e, &n);
		}
		int rc = edrive_run(&d, 0, 3, 2, -1);
		cr_assert_eq(rc, 0, "stage %d: %s", cases[k].stage, d.why);
		float *m = read_masters(e, &n);
		if (!first) {
			first = m;
			struct eref_result ref;
			struct zinf_optimizer_opts fp32 = o.optimizer;
			fp32.state_format = ZINF_STATE_PLAIN;
			reference_opt(&ref, 3, 2, 0, 0, &fp32);
			double dev = 0, moved = 0;
			size_t at = 0;
			for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
				for (uint64_t i = 0; i < eref_numel(id); i++, at++) {
					dev += fabs((double)m[at] - ref.master[id][i]);
					moved += fabs((double)ref.master[id][i] - init[at]);
				}
			}
			cr_assert(moved > 0 && dev < 0.05 * moved,
				  "q8 deviates %.6g from fp32 state, which moved %.6g", dev, moved);
			eref_result_free(&ref);
		} else {
			cr_assert(!memcmp(first, m, n * sizeof(float)),
				  "stage %d tier %d: masters differ from stage 2 cpu",
				  cases[k].stage, cases[k].opt);
			free(m);
		}
		edrive_fini(&d);
		zinf_engine_destroy(e);
	}
	struct zinf_engine_opts o;
	edrive_opts(&o, "single", 2, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, dir, ZINF_F32, 1);
	o.optimizer.state_format = ZINF_STATE_Q8;
	refused(&o, "offload_optimizer.device", "q8 state on the device tier");
	free(first);
	free(init);
	zt_rmtree(dir);
	free(dir);
}
