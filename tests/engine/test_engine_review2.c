// SPDX-License-Identifier: Apache-2.0
/*
 * tests/engine/test_engine_review2.c: a second reviewer's tests of the ZeRO engine after the
 * merge of the review fixes, the gradient window, the early step begin (eng_worker_prime) and
 * clipping/fp16 loss scaling: one process (single collectives, host device). Each test states
 * the contract it checks; a failing one is the evidence of a defect named in the review
 * report. Not here: several ranks, CUDA/NCCL.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "zinf/engine.h"

/* engine/engine_worker.c (internal, linked from zinf_static): wait for the worker's prime, so
 * that the test does not depend on the thread's timing. */
int eng_worker_wait(struct zinf_engine *e);

static int
init_val(void *ctx, uint32_t param, uint64_t first, uint64_t count, float *out)
{
	(void)ctx;
	for (uint64_t i = 0; i < count; i++) {
		out[i] = (float)((param * 31 + first + i) % 13) / 16.0f - 0.25f;
	}
	return 0;
}

static struct zinf_engine *
make_nvme_io(const char *dir, uint32_t gas, const char *io_backend, bool sdb)
{
	struct zinf_engine_opts o;
	zinf_engine_opts_init(&o);
	o.device_backend = "host";
	o.comm_backend = "single";
	o.optimizer.lr = 1e-2f;
	o.stage = 2;
	o.step_during_backward = sdb;
	o.io_backend = io_backend;
	o.gradient_accumulation_steps = gas;
	o.offload_optimizer.device = ZINF_OFFLOAD_NVME;
	o.offload_optimizer.n_paths = 1;
	o.offload_optimizer.nvme_path[0] = dir;
	o.swap_prefix = "review2";
	o.sub_group_size = 64;
	struct zinf_engine *e = NULL;
	cr_assert_eq(zinf_engine_create(&o, &e), 0, "create: %s", zinf_last_error());
	struct zinf_param_desc d;
	zinf_param_desc_init(&d);
	d.name = "w";
	d.numel = 100;
	d.layer = 0;
	d.init_fn = init_val;
	cr_assert_eq(zinf_engine_add_param(e, &d), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
	return e;
}

static struct zinf_engine *
make_nvme(const char *dir, uint32_t gas)
{
	return make_nvme_io(dir, gas, NULL, true);
}

/*
 * Contract (engine.h): zinf_engine_read_master is allowed outside an accumulation window
 * (micro == 0 and no gradient yet). With one micro-batch per step every forward is the
 * boundary's, so its first fetch primes the worker (eng_worker_prime), which begins the NVMe
 * step (zinf_step_begin, in_step). A read_master after the forward (an evaluation pass, or
 * between forward and backward) then meets zinf_step_save's in_step check: -EBUSY, and
 * without the wait below a data race on the step object with the worker thread. Expected:
 * the master weights as initialised (no step has run).
 */
Test(engine_review2, read_master_after_forward_with_nvme_optimizer)
{
	char *dir = zt_mkdtemp(NULL);
	cr_assert(dir);
	struct zinf_engine *e = make_nvme(dir, 1);
	cr_assert_eq(zinf_engine_fetch(e, 0), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_release(e, 0), 0, "%s", zinf_last_error());
	cr_assert_eq(eng_worker_wait(e), 0);
	float m[100];
	int rc = zinf_engine_read_master(e, 0, m);
	cr_expect_eq(rc, 0, "read_master after a forward: %d (%s)", rc, zinf_last_error());
	if (rc == 0) {
		float ref[100];
		init_val(NULL, 0, 0, 100, ref);
		cr_expect_arr_eq(m, ref, sizeof(ref), "master differs from its initial values");
	}
	zinf_engine_destroy(e);
	zt_rmtree(dir);
	free(dir);
}

/* bf16 gradient of n elements, dyadic values, on the device */
static void *
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

/* One training micro-batch over the one layer (eval: forward only, no gradient, no step). */
static int
train(struct zinf_engine *e, void *g, bool eval)
{
	int ret;
	if ((ret = zinf_engine_fetch(e, 0)) || (ret = zinf_engine_release(e, 0))) {
		return ret;
	}
	if (eval) {
		return 0;
	}
	if ((ret = zinf_engine_fetch(e, 0)) || (ret = zinf_engine_grad(e, 0, g, ZINF_BF16)) ||
	    (ret = zinf_engine_release(e, 0))) {
		return ret;
	}
	return zinf_engine_step(e);
}

/*
 * An evaluation forward between two steps (one micro-batch per step, the optimizer on NVMe,
 * the step during backward): the eval's fetch primes the worker, which begins step 2 then;
 * the training micro-batch that follows finds the step begun. Expected: the master weights
 * after 2 steps equal, bit for bit, those of the same training without the evaluation.
 */
Test(engine_review2, eval_forward_between_steps_same_bits)
{
	char *dir = zt_mkdtemp(NULL);
	cr_assert(dir);
	float m[2][100];
	for (int run = 0; run < 2; run++) {
		struct zinf_engine *e = make_nvme(dir, 1);
		void *g = grad16(e, 100, 3);
		cr_assert_eq(train(e, g, false), 1, "%s", zinf_last_error());
		if (run == 1) {
			cr_assert_eq(train(e, g, true), 0, "%s", zinf_last_error());
		}
		cr_assert_eq(train(e, g, false), 1, "%s", zinf_last_error());
		cr_assert_eq(zinf_engine_steps(e), 2);
		cr_assert_eq(zinf_engine_read_master(e, 0, m[run]), 0, "%s", zinf_last_error());
		zinf_device_free(zinf_engine_device(e), g);
		zinf_engine_destroy(e);
	}
	cr_expect(memcmp(m[0], m[1], sizeof(m[0])) == 0,
		  "an evaluation forward between the steps changed the master weights");
	float ref[100];
	init_val(NULL, 0, 0, 100, ref);
	cr_expect(memcmp(m[0], ref, sizeof(ref)) != 0, "two steps changed nothing");
	zt_rmtree(dir);
	free(dir);
}

/*
 * An NVMe read of the optimizer state failing in the step with errno EINVAL (what io_uring
 * reports for an O_DIRECT request it refuses): the step fails half done (zinf_step read
 * nothing for the sub-group; steps not advanced, micro and sg_pending not reset). eng_fail()
 * keeps -EINVAL out of e->failed (meant for a caller's bad argument), so the engine is not
 * failed: later calls go on over a half-stepped state instead of returning the error, as
 * they do for EIO (test_engine_grad's gradient_*_fault). Expected: like EIO, the engine
 * stops (a later fetch returns an error).
 */
static void
step_read_fault(int err, bool sdb)
{
	char *dir = zt_mkdtemp(NULL);
	cr_assert(dir);
	struct zinf_engine *e = make_nvme_io(dir, 1, "fault", sdb);
	void *g = grad16(e, 100, 5);
	struct zinf_io_fault f = {.kind = ZINF_IO_FAULT_FAIL,
				  .op = ZINF_IO_READ,
				  .nth = 1,
				  .count = 1000,
				  .err = err};
	cr_assert_eq(zinf_io_fault_add(zinf_engine_io(e), &f), 0, "%s", zinf_last_error());
	int rc = train(e, g, false);
	cr_assert_eq(rc, -err, "step with a failing state read: %d (%s)", rc, zinf_last_error());
	cr_assert_eq(zinf_engine_steps(e), 0);
	rc = zinf_engine_fetch(e, 0);
	cr_expect_lt(rc, 0,
		     "errno %d, sdb %d: a fetch after the failed step returned %d: the "
		     "engine goes on over a half-done step",
		     err, sdb, rc);
	if (rc < 0) {
		const char *msg = zinf_last_error();
		cr_expect(
			strstr(msg, "being stepped") == NULL,
			"errno %d, sdb %d: the fetch is refused for a stale hand-off, not for the "
			"failed engine: %s",
			err, sdb, msg);
	}
	zinf_device_free(zinf_engine_device(e), g);
	zinf_engine_destroy(e);
	zt_rmtree(dir);
	free(dir);
}

Test(engine_review2, step_io_error_eio_stops_engine)
{
	step_read_fault(EIO, false);
}

Test(engine_review2, step_io_error_einval_stops_engine)
{
	step_read_fault(EINVAL, false);
	step_read_fault(EINVAL, true);
}

/*
 * zinf_engine_set_lr between the boundary forward (whose first fetch primed the worker: the
 * NVMe step begun) and the first gradient: the contract takes it for this step. Expected: the
 * same bits with the step during backward (prime) as after backward.
 */
Test(engine_review2, set_lr_after_prime_same_bits)
{
	char *dir = zt_mkdtemp(NULL);
	cr_assert(dir);
	float m[2][100];
	for (int run = 0; run < 2; run++) {
		struct zinf_engine *e = make_nvme_io(dir, 1, NULL, run == 1);
		void *g = grad16(e, 100, 3);
		cr_assert_eq(train(e, g, false), 1, "%s", zinf_last_error());
		cr_assert_eq(zinf_engine_fetch(e, 0), 0);
		cr_assert_eq(zinf_engine_release(e, 0), 0);
		cr_assert_eq(zinf_engine_set_lr(e, 0.05f), 0);
		cr_assert_eq(zinf_engine_fetch(e, 0), 0);
		cr_assert_eq(zinf_engine_grad(e, 0, g, ZINF_BF16), 0, "%s", zinf_last_error());
		cr_assert_eq(zinf_engine_release(e, 0), 0);
		cr_assert_eq(zinf_engine_step(e), 1, "%s", zinf_last_error());
		cr_assert_eq(zinf_engine_read_master(e, 0, m[run]), 0, "%s", zinf_last_error());
		zinf_device_free(zinf_engine_device(e), g);
		zinf_engine_destroy(e);
	}
	cr_expect(memcmp(m[0], m[1], sizeof(m[0])) == 0,
		  "set_lr after the prime: the step during backward differs from after");
	zt_rmtree(dir);
	free(dir);
}
