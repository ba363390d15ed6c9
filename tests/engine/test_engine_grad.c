/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/test_engine_grad.c: the engine's gradient path in one process (comm "single",
 * device "host" with asynchronous streams): a reduce-scatter moves only the filled part of a
 * bucket; with both tiers on NVMe the engine's host pools do not grow with the model (the
 * gradient window instead of a whole fp32 gradient partition); gradient accumulation through a
 * window smaller than the sub-groups (spills to the optimizer's swap space and reads back)
 * equals tier cpu and the single-process reference bit for bit, with the step during backward
 * and after it; whoever reads the host tiers' gradients waits for the engine stream (its
 * copies made to lag by the host device's test hook); an NVMe fault on a gradient's write or
 * read fails the engine with a message naming the sub-group and the swap file. Not here:
 * several ranks (test_engine_ranks.c, whose cases cover the packed reduce-scatter with W > 1,
 * and a stage-1 partition holding none of a tensor: grad_empty_partition).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "device/dev_internal.h"
#include "engine/engine_drive.h"
#include "engine/engine_internal.h"
#include "engine/engine_ref.h"
#include "zinf/engine.h"

#define QUANTUM 0x1p-14f

static struct zinf_engine *
make(const struct zinf_engine_opts *o)
{
	struct zinf_engine *e = NULL;
	int rc = zinf_engine_create(o, &e);
	cr_assert_eq(rc, 0, "zinf_engine_create: %d %s", rc, zinf_last_error());
	return e;
}

static struct zinf_engine *
make_model(const struct zinf_engine_opts *o)
{
	struct zinf_engine *e = make(o);
	int rc = edrive_add_params(e);
	cr_assert_eq(rc, 0, "add_params: %d %s", rc, zinf_last_error());
	rc = zinf_engine_init(e);
	cr_assert_eq(rc, 0, "zinf_engine_init: %d %s", rc, zinf_last_error());
	return e;
}

static int
add(struct zinf_engine *e, const char *name, uint64_t numel, int layer)
{
	struct zinf_param_desc d;
	zinf_param_desc_init(&d);
	d.name = name;
	d.numel = numel;
	d.layer = layer;
	return zinf_engine_add_param(e, &d); /* zeros */
}

/* n elements of bf16 1/64 on the device */
static void *
grad16(struct zinf_engine *e, uint64_t n)
{
	void *g;
	uint16_t *h = malloc(n * 2);
	cr_assert(h);
	for (uint64_t i = 0; i < n; i++) {
		h[i] = 0x3c80; /* bf16 of 2^-6 */
	}
	cr_assert_eq(zinf_device_alloc(zinf_engine_device(e), n * 2, &g), 0);
	struct zinf_stream *s = zinf_engine_compute_stream(e);
	cr_assert_eq(zinf_device_copy(s, g, h, n * 2, ZINF_COPY_H2D), 0);
	cr_assert_eq(zinf_stream_sync(s), 0);
	free(h);
	return g;
}

/*
 * Stage 2, buckets of 1000 elements, a parameter of 3 elements (layer 0) and one of 1000
 * (layer 1): backward hands the 1000 first, alone in its bucket, then the 3, alone in the
 * next: 1003 fp32 elements of gradients, 4012 bytes reduced. Before, every reduce-scatter
 * moved the bucket's whole capacity (8000 bytes).
 */
Test(engine_grad, reduce_scatter_moves_only_the_filled_bucket)
{
	struct zinf_engine_opts o;
	zinf_engine_opts_init(&o);
	o.device_backend = "host";
	o.comm_backend = "single";
	o.stage = 2;
	o.reduce_bucket_size = 1000;
	struct zinf_engine *e = make(&o);
	cr_assert_eq(add(e, "small", 3, 0), 0);
	cr_assert_eq(add(e, "big", 1000, 1), 1);
	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
	void *g[2] = {grad16(e, 3), grad16(e, 1000)};
	for (int l = 0; l < 2; l++) {
		cr_assert_eq(zinf_engine_fetch(e, l), 0);
		cr_assert_eq(zinf_engine_release(e, l), 0);
	}
	for (int l = 1; l >= 0; l--) {
		cr_assert_eq(zinf_engine_fetch(e, l), 0);
		cr_assert_eq(zinf_engine_grad(e, (uint32_t)l, g[l], ZINF_BF16), 0, "%s",
			     zinf_last_error());
		cr_assert_eq(zinf_engine_release(e, l), 0);
	}
	cr_assert_eq(zinf_engine_step(e), 1, "%s", zinf_last_error());
	struct zinf_engine_stats st = {.size = sizeof(st)};
	cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
	cr_assert_eq(st.reduced_bytes, 1003 * 4, "reduced %llu bytes for 1003 fp32 elements",
		     (unsigned long long)st.reduced_bytes);
	/* the reduced gradient is the one handed: AdamW's first step moves every element by
	   about lr (the weights start at 0, so weight decay does nothing) */
	float big[1000];
	cr_assert_eq(zinf_engine_read_master(e, 1, big), 0);
	for (int i = 0; i < 1000; i++) {
		cr_assert(big[i] < -0.9f * o.optimizer.lr && big[i] > -1.1f * o.optimizer.lr,
			  "big[%d] = %g after one step, lr %g", i, big[i], o.optimizer.lr);
	}
	for (int i = 0; i < 2; i++) {
		zinf_device_free(zinf_engine_device(e), g[i]);
	}
	zinf_engine_destroy(e);
}

/* An engine with both tiers on NVMe over `layers` layers of one 4096-element parameter each
 * (sub-groups of 4 parameters, buckets of 8192 elements, the buffer sizes fixed); its host pool
 * bytes after init. */
static uint64_t
pool_bytes_for(const char *dir, int layers, uint32_t *sub_groups)
{
	struct zinf_engine_opts o;
	zinf_engine_opts_init(&o);
	o.device_backend = "host";
	o.comm_backend = "single";
	o.stage = 3;
	o.offload_optimizer.device = ZINF_OFFLOAD_NVME;
	o.offload_optimizer.n_paths = 1;
	o.offload_optimizer.nvme_path[0] = dir;
	o.offload_param.device = ZINF_OFFLOAD_NVME;
	o.offload_param.n_paths = 1;
	o.offload_param.nvme_path[0] = dir;
	o.offload_param.buffer_size = 8192;
	o.offload_param.max_in_cpu = 0;
	o.sub_group_size = 4 * 4096;
	o.reduce_bucket_size = 8192;
	o.stage3_param_persistence_threshold = 0;
	o.swap_prefix = "eflat";
	struct zinf_engine *e = make(&o);
	for (int l = 0; l < layers; l++) {
		char name[32];
		snprintf(name, sizeof(name), "w%d", l);
		cr_assert_eq(add(e, name, 4096, l), l);
	}
	cr_assert_eq(zinf_engine_init(e), 0, "%d layers: %s", layers, zinf_last_error());
	struct zinf_engine_stats st = {.size = sizeof(st)};
	cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
	*sub_groups = st.sub_groups;
	zinf_engine_destroy(e);
	return st.host_pool_bytes;
}

/*
 * With parameters and optimizer state on NVMe, host memory stays flat as the model grows. 32
 * and 128 layers of 4096 elements (a model 4x larger), the same sub_group_size and buffer
 * sizes: the engine's host pools are the same bytes (a whole fp32 gradient partition in them
 * would be 4 bytes per element: 1.5 MiB more for the larger model).
 */
Test(engine_grad, host_pools_do_not_grow_with_the_model)
{
	char *dir = zt_mkdtemp(NULL);
	cr_assert(dir);
	uint32_t sg_small = 0, sg_big = 0;
	uint64_t small = pool_bytes_for(dir, 32, &sg_small);
	uint64_t big = pool_bytes_for(dir, 128, &sg_big);
	cr_assert_eq(sg_small, 8);
	cr_assert_eq(sg_big, 32);
	cr_assert_gt(small, 0, "no host pool with both tiers on NVMe");
	cr_assert_eq(big, small, "host pools: %llu bytes for 32 layers, %llu for 128",
		     (unsigned long long)small, (unsigned long long)big);
	/* less than the larger model's fp32 gradient partition alone */
	cr_assert_lt(big, 128ull * 4096 * 4, "host pools of %llu bytes", (unsigned long long)big);
	zt_rmtree(dir);
	free(dir);
}

/* Compare every master weight of a and b, bit for bit, and with the reference. */
static void
assert_same_master(struct zinf_engine *a, struct zinf_engine *b, const struct eref_result *ref,
		   const char *what)
{
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		uint64_t n = eref_numel(id);
		float *ma = calloc(n, sizeof(float)), *mb = calloc(n, sizeof(float));
		cr_assert(ma && mb);
		cr_assert_eq(zinf_engine_read_master(a, id, ma), 0, "%s: %s", what,
			     zinf_last_error());
		cr_assert_eq(zinf_engine_read_master(b, id, mb), 0, "%s: %s", what,
			     zinf_last_error());
		for (uint64_t i = 0; i < n; i++) {
			cr_assert(memcmp(&ma[i], &mb[i], 4) == 0 &&
					  memcmp(&ma[i], &ref->master[id][i], 4) == 0,
				  "%s: %s[%llu]: nvme %.9g, cpu %.9g, reference %.9g", what,
				  eref_params[id].name, (unsigned long long)i, ma[i], mb[i],
				  ref->master[id][i]);
		}
		free(ma);
		free(mb);
	}
}

/*
 * Three micro-batches per step, the optimizer on NVMe with a gradient window of 1 or 2
 * sub-groups (offload_optimizer.buffer_count) for the model's 4 sub-groups: gradients leave
 * the window (written to the swap space) and come back (read) inside every step; with the
 * step during backward on and off, stages 2 and 3, after 3 steps the master weights equal tier
 * cpu's and the reference's bit for bit. The gradient I/O is counted in nvme_*_bytes.
 */
Test(engine_grad, accumulation_through_a_small_window_equals_cpu)
{
	static const struct {
		int stage;
		uint32_t window;
		bool sdb;
	} cfgs[] = {{2, 1, true}, {2, 1, false}, {3, 2, true}, {3, 2, false}, {2, 2, true}};
	char *dir = zt_mkdtemp(NULL);
	cr_assert(dir);
	struct eref_result ref;
	struct eref_opts ro = {
		.world = 1, .steps = 3, .gas = 3, .dtype = ZINF_F32, .quantum = QUANTUM};
	edrive_optimizer(&ro.opt);
	cr_assert_eq(eref_train(&ro, &ref), 0);
	for (size_t c = 0; c < sizeof(cfgs) / sizeof(cfgs[0]); c++) {
		char what[96];
		snprintf(what, sizeof(what), "stage %d window %u sdb %d", cfgs[c].stage,
			 cfgs[c].window, cfgs[c].sdb);
		struct zinf_engine_opts o;
		struct edrive dn, dc;
		edrive_opts(&o, "single", cfgs[c].stage, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, dir,
			    ZINF_F32, 3);
		o.offload_optimizer.buffer_count = cfgs[c].window;
		o.step_during_backward = cfgs[c].sdb;
		struct zinf_engine *en = make_model(&o);
		edrive_opts(&o, "single", cfgs[c].stage, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, NULL,
			    ZINF_F32, 3);
		o.step_during_backward = cfgs[c].sdb;
		struct zinf_engine *ec = make_model(&o);
		cr_assert_eq(edrive_init(&dn, en, ZINF_F32, QUANTUM), 0);
		cr_assert_eq(edrive_init(&dc, ec, ZINF_F32, QUANTUM), 0);
		uint64_t gr = 0, gw = 0;
		for (int s = 0; s < 3; s++) {
			cr_assert_eq(edrive_run(&dn, s, 1, 3, -1), 0, "%s: %s", what, dn.why);
			cr_assert_eq(edrive_run(&dc, s, 1, 3, -1), 0, "%s: %s", what, dc.why);
			struct zinf_engine_stats st = {.size = sizeof(st)};
			cr_assert_eq(zinf_engine_get_stats(en, &st), 0);
			cr_assert_eq(st.sub_groups, 4, "%s", what);
			cr_assert_geq(st.nvme_read_bytes, st.grad_nvme_read_bytes, "%s", what);
			cr_assert_geq(st.nvme_write_bytes, st.grad_nvme_write_bytes, "%s", what);
			gr += st.grad_nvme_read_bytes;
			gw += st.grad_nvme_write_bytes;
		}
		cr_assert_gt(gw, 0, "%s: no gradient written out with %u slots for 4 sub-groups",
			     what, cfgs[c].window);
		cr_assert_gt(gr, 0, "%s: no gradient read back", what);
		assert_same_master(en, ec, &ref, what);
		edrive_fini(&dn);
		edrive_fini(&dc);
		zinf_engine_destroy(en);
		zinf_engine_destroy(ec);
	}
	eref_result_free(&ref);
	zt_rmtree(dir);
	free(dir);
}

/*
 * One micro-batch per step, the step during backward, a window as large as the sub-groups:
 * every sub-group's gradient goes straight from its slot to the step; no gradient I/O at all.
 */
Test(engine_grad, no_gradient_io_with_one_micro_batch)
{
	char *dir = zt_mkdtemp(NULL);
	cr_assert(dir);
	struct zinf_engine_opts o;
	struct edrive d;
	edrive_opts(&o, "single", 2, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, dir, ZINF_F32, 1);
	o.step_during_backward = true;
	struct zinf_engine *e = make_model(&o);
	cr_assert_eq(edrive_init(&d, e, ZINF_F32, QUANTUM), 0);
	for (int s = 0; s < 2; s++) {
		cr_assert_eq(edrive_run(&d, s, 1, 1, -1), 0, "%s", d.why);
		struct zinf_engine_stats st = {.size = sizeof(st)};
		cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
		cr_assert_gt(st.nvme_read_bytes, 0, "the optimizer state is read");
		cr_assert_eq(st.grad_nvme_read_bytes + st.grad_nvme_write_bytes, 0,
			     "step %d: %llu + %llu gradient bytes moved", s,
			     (unsigned long long)st.grad_nvme_read_bytes,
			     (unsigned long long)st.grad_nvme_write_bytes);
	}
	edrive_fini(&d);
	zinf_engine_destroy(e);
	zt_rmtree(dir);
	free(dir);
}

/*
 * The host tiers' gradients are copied from the device without the trainer's thread waiting for
 * the copies: whoever reads them on the host must wait for the engine stream first (the step
 * worker through each sub-group's event, a window slot written out, the step after backward,
 * the norm for clipping). Here every copy and kernel on the engine stream starts 3 ms late
 * (the host device's lag hook), so a reader that does not wait reads the buffer before the
 * copy landed, every time. Optimizer on cpu and on NVMe (windows of 1 and 2 slots for 4
 * sub-groups), 1 and 3 micro-batches, the step during and after backward, stages 2 and 3:
 * master weights after 2 steps equal the reference's bit for bit, and with clipping (max_norm
 * small enough to clip every step) those of tier none (the device tier, which reads nothing on
 * the host).
 */
static void
lagged_run(int stage, enum zinf_offload_device tier, uint32_t window, uint32_t gas, bool sdb,
	   double clip, const char *dir, float *const out[EREF_NPARAMS], const char *what)
{
	struct zinf_engine_opts o;
	struct edrive d;
	edrive_opts(&o, "single", stage, tier, ZINF_OFFLOAD_NONE,
		    tier == ZINF_OFFLOAD_NVME ? dir : NULL, ZINF_F32, gas);
	if (tier == ZINF_OFFLOAD_NVME) {
		o.offload_optimizer.buffer_count = window;
	}
	o.step_during_backward = sdb;
	o.gradient_clipping = clip;
	struct zinf_engine *e = make_model(&o);
	if (tier != ZINF_OFFLOAD_NONE) {
		cr_assert_eq(dev_test_lag(e->cs, 3000), 0, "%s", zinf_last_error());
	}
	cr_assert_eq(edrive_init(&d, e, ZINF_F32, QUANTUM), 0);
	cr_assert_eq(edrive_run(&d, 0, 2, gas, -1), 0, "%s: %s", what, d.why);
	if (tier != ZINF_OFFLOAD_NONE) {
		cr_assert_eq(dev_test_lag(e->cs, 0), 0);
	}
	cr_assert_eq(edrive_read_master(e, out), 0, "%s: %s", what, zinf_last_error());
	edrive_fini(&d);
	zinf_engine_destroy(e);
}

static void
alloc_master(float *m[EREF_NPARAMS])
{
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		m[id] = calloc(eref_numel(id), sizeof(float));
		cr_assert(m[id]);
	}
}

static void
free_master(float *m[EREF_NPARAMS])
{
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		free(m[id]);
	}
}

static void
expect_master(float *const got[EREF_NPARAMS], float *const want[EREF_NPARAMS], const char *against,
	      const char *what)
{
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		for (uint64_t i = 0; i < eref_numel(id); i++) {
			cr_assert(memcmp(&got[id][i], &want[id][i], 4) == 0,
				  "%s: %s[%llu]: %.9g, %s %.9g", what, eref_params[id].name,
				  (unsigned long long)i, got[id][i], against, want[id][i]);
		}
	}
}

Test(engine_grad, host_readers_wait_for_the_lagging_engine_stream, .timeout = 120)
{
	static const struct {
		int stage;
		enum zinf_offload_device tier;
		uint32_t window;
	} tiers[] = {{2, ZINF_OFFLOAD_CPU, 0},
		     {3, ZINF_OFFLOAD_CPU, 0},
		     {2, ZINF_OFFLOAD_NVME, 1},
		     {3, ZINF_OFFLOAD_NVME, 2}};
	char *dir = zt_mkdtemp(NULL);
	cr_assert(dir);
	float *got[EREF_NPARAMS], *want[EREF_NPARAMS];
	alloc_master(got);
	alloc_master(want);
	for (uint32_t gas = 1; gas <= 3; gas += 2) {
		struct eref_result ref;
		struct eref_opts ro = {
			.world = 1, .steps = 2, .gas = gas, .dtype = ZINF_F32, .quantum = QUANTUM};
		edrive_optimizer(&ro.opt);
		cr_assert_eq(eref_train(&ro, &ref), 0);
		for (int clip = 0; clip < 2; clip++) {
			double max_norm = clip ? 1e-3 : 0.0;
			for (size_t t = 0; t < sizeof(tiers) / sizeof(tiers[0]); t++) {
				for (int sdb = 0; sdb < 2; sdb++) {
					char what[128];
					snprintf(what, sizeof(what),
						 "stage %d tier %d window %u gas %u clip %g sdb %d",
						 tiers[t].stage, (int)tiers[t].tier,
						 tiers[t].window, gas, max_norm, sdb);
					if (clip) {
						lagged_run(tiers[t].stage, ZINF_OFFLOAD_NONE, 0,
							   gas, sdb, max_norm, dir, want, what);
					}
					lagged_run(tiers[t].stage, tiers[t].tier, tiers[t].window,
						   gas, sdb, max_norm, dir, got, what);
					if (clip) {
						expect_master(got, want, "tier none", what);
					} else {
						expect_master(got, ref.master, "reference", what);
					}
				}
			}
		}
		eref_result_free(&ref);
	}
	free_master(got);
	free_master(want);
	zt_rmtree(dir);
	free(dir);
}

/* Train with a fault armed on the first NVMe op of direction `op` after init: the optimizer on
 * NVMe, a window of 1 sub-group, 2 micro-batches, the step after backward (the first writes
 * after init are gradients leaving the window in micro-batch 0, the first reads gradients
 * read back in micro-batch 1). */
static void
gradient_fault(int op)
{
	char *dir = zt_mkdtemp(NULL);
	cr_assert(dir);
	struct zinf_engine_opts o;
	struct edrive d;
	edrive_opts(&o, "single", 2, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, dir, ZINF_F32, 2);
	o.offload_optimizer.buffer_count = 1;
	o.step_during_backward = false;
	o.io_backend = "fault";
	struct zinf_engine *e = make_model(&o);
	cr_assert_eq(edrive_init(&d, e, ZINF_F32, QUANTUM), 0);
	struct zinf_io_fault f = {
		.kind = ZINF_IO_FAULT_FAIL, .op = op, .nth = 1, .count = 1000, .err = EIO};
	cr_assert_eq(zinf_io_fault_add(zinf_engine_io(e), &f), 0, "%s", zinf_last_error());
	int rc = edrive_run(&d, 0, 1, 2, -1);
	cr_assert_eq(rc, -EIO, "rc %d (%s)", rc, d.why);
	const char *msg = zinf_last_error();
	cr_assert(strstr(msg, "sub-group") && strstr(msg, "etest-optim-r0-grad") &&
			  strstr(msg, op == ZINF_IO_WRITE ? "writing its gradient"
							  : "reading its gradient"),
		  "the error names neither the sub-group nor the gradient's file: %s", msg);
	cr_assert_eq(zinf_engine_step(e), -EIO, "a later call returns the error");
	edrive_fini(&d);
	zinf_engine_destroy(e);
	zt_rmtree(dir);
	free(dir);
}

Test(engine_grad, gradient_write_fault_names_sub_group_and_file)
{
	gradient_fault(ZINF_IO_WRITE);
}

Test(engine_grad, gradient_read_fault_names_sub_group_and_file)
{
	gradient_fault(ZINF_IO_READ);
}
