/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/test_engine_worker.c: the step worker of the step during backward
 * (engine/engine_worker.c), one process (single collectives, host device): with the optimizer
 * on NVMe the boundary forward's first fetch begins the step (eng_worker_prime), and what a
 * trainer may do before the step's gradients behaves as without it (read_master after the
 * forward, an evaluation forward between steps, set_lr after the prime: the same bits); an
 * NVMe read of the optimizer state failing in the step (EIO, or EINVAL as io_uring reports an
 * O_DIRECT request it refuses) stops the engine; a layer handed to the worker is not fetched
 * again in the same micro-batch. Not here: several ranks (test_engine_ranks.c).
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

/* engine/engine_worker.c (internal, linked from zinf_static): wait for the worker's prime, so
 * that the test does not depend on the thread's timing. */
int eng_worker_wait(struct zinf_engine *e);

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
 * between forward and backward) returns the master weights as initialised (no step has run),
 * not zinf_step_save's -EBUSY for a step in progress, and without a data race on the step
 * object with the worker thread. The wait below keeps the test off the
 * thread's timing.
 */
Test(engine_worker, read_master_after_forward_with_nvme_optimizer)
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
Test(engine_worker, eval_forward_between_steps_same_bits)
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
 * An NVMe read of the optimizer state failing in the step with errno EIO, or EINVAL (what
 * io_uring reports for an O_DIRECT request it refuses): the step fails half done (zinf_step
 * read nothing for the sub-group; steps not advanced), and the engine stops: a later fetch
 * returns an error, the failed engine's and not a refusal of a stale hand-off, with the step
 * during backward and after it. EINVAL too, although the call's error boundary keeps a caller's
 * bad argument (-EINVAL) from failing the engine: an I/O EINVAL after the step began must fail
 * it, or later calls would go on over a half-stepped state. The gradient path's faults:
 * test_engine_grad.c (gradient_*_fault).
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

Test(engine_worker, step_io_error_eio_stops_engine)
{
	step_read_fault(EIO, false);
}

Test(engine_worker, step_io_error_einval_stops_engine)
{
	step_read_fault(EINVAL, false);
	step_read_fault(EINVAL, true);
}

/*
 * zinf_engine_set_lr between the boundary forward (whose first fetch primed the worker: the
 * NVMe step begun) and the first gradient: the contract takes it for this step. Expected: the
 * same bits with the step during backward (prime) as after backward.
 */
Test(engine_worker, set_lr_after_prime_same_bits)
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

/* ---- a layer handed to the worker ---------------------------------------------------------- */

/*
 * With the step during backward, a layer's sub-group goes to the step worker once its
 * gradients are in and the layer is released; fetching that layer again in the same micro-batch
 * (tied weights fetched twice) would read values being stepped. It is -EINVAL, naming the
 * parameter, and leaves the engine as it was: the micro-batch completes and steps.
 */
Test(engine_worker, fetch_after_handing_to_the_worker_refused)
{
	struct zinf_engine_opts o;
	base_opts(&o);
	o.stage = 3;
	o.offload_optimizer.device = ZINF_OFFLOAD_CPU;
	o.offload_param.device = ZINF_OFFLOAD_CPU;
	o.stage3_param_persistence_threshold = 0;
	o.sub_group_size = 100;	    /* one sub-group per parameter */
	o.reduce_bucket_size = 100; /* one bucket per gradient */
	o.step_during_backward = true;
	struct zinf_engine *e = make(&o);
	cr_assert_eq(add(e, "a", 100, 0, init_val, NULL), 0);
	cr_assert_eq(add(e, "b", 100, 1, init_val, NULL), 1);
	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
	void *g[2] = {grad16(e, 100, 1), grad16(e, 100, 2)};
	for (int l = 0; l < 2; l++) {
		cr_assert_eq(zinf_engine_fetch(e, l), 0);
		cr_assert_eq(zinf_engine_release(e, l), 0);
	}
	cr_assert_eq(zinf_engine_fetch(e, 1), 0);
	cr_assert_eq(zinf_engine_grad(e, 1, g[1], ZINF_BF16), 0);
	cr_assert_eq(zinf_engine_release(e, 1), 0);
	/* b's bucket is reduced, b's sub-group final and handed by a's gradient at the latest */
	cr_assert_eq(zinf_engine_fetch(e, 0), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_grad(e, 0, g[0], ZINF_BF16), 0);
	int rc = zinf_engine_fetch(e, 1);
	cr_expect_eq(rc, -EINVAL, "layer 1 fetched again while its sub-group is being stepped: %d",
		     rc);
	cr_assert_eq(zinf_engine_release(e, 0), 0);
	rc = zinf_engine_step(e);
	cr_expect_eq(rc, 1, "step: %d %s", rc, zinf_last_error());
	rc = zinf_engine_fetch(e, 1);
	cr_expect_eq(rc, 0, "after the step the layer is fetched again: %s", zinf_last_error());
	cr_expect_eq(zinf_engine_release(e, 1), 0);
	for (int i = 0; i < 2; i++) {
		zinf_device_free(zinf_engine_device(e), g[i]);
	}
	zinf_engine_destroy(e);
}
