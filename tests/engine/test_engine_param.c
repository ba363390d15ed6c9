/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/test_engine_param.c: registration and zinf_engine_init (engine/engine_param.c)
 * in one process (single collectives, host device with asynchronous streams): an init
 * callback's error and what follows it (a failed init fails the engine for good, never a second
 * layout over the first); the initial values in pieces of at most ZINF_STEP_CHUNK elements,
 * intact in the master and the NVMe-homed 16-bit copy; fp16 parameters: the step equals
 * zinf_optimizer_step and the values fetched are the master rounded. The init errors of the
 * test model: test_engine.c (init_errors).
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

/* Fails with -EINVAL the first time it is called (a callback's own error), then works. */
static int
init_fail_once(void *ctx, uint32_t param, uint64_t first, uint64_t count, float *out)
{
	int *calls = ctx;
	if ((*calls)++ == 0) {
		return -EINVAL;
	}
	return init_val(NULL, param, first, count, out);
}

/*
 * zinf_engine_init returns an init callback's error, here -EINVAL (a callback's own error, not
 * a caller's bad argument). A second zinf_engine_init then either works as a first one would
 * (three sub-groups, 15 persistent elements, the callback's values) or is refused; it never
 * lays the model out again over the first one's arrays (the layers counted
 * twice overflowed the heap under ASan, the sub-groups and persistent elements doubled, a second
 * step worker started).
 */
Test(engine_param, init_again_after_callback_einval)
{
	struct zinf_engine_opts o;
	base_opts(&o);
	o.stage = 3;
	o.offload_optimizer.device = ZINF_OFFLOAD_CPU;
	o.sub_group_size = 8; /* one sub-group per parameter */
	struct zinf_engine *e = make(&o);
	int calls = 0;
	cr_assert_eq(add(e, "a", 5, 0, init_fail_once, &calls), 0);
	cr_assert_eq(add(e, "b", 7, 1, init_fail_once, &calls), 1);
	cr_assert_eq(add(e, "c", 3, 2, init_fail_once, &calls), 2);
	cr_assert_eq(zinf_engine_init(e), -EINVAL);
	int ret = zinf_engine_init(e);
	if (ret == 0) {
		struct zinf_engine_stats st = {.size = sizeof(st)};
		cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
		cr_expect_eq(st.sub_groups, 3, "sub-groups %u after a second init (3 expected)",
			     st.sub_groups);
		cr_expect_eq(st.persistent_elems, 15, "persistent elements %llu (15 expected)",
			     (unsigned long long)st.persistent_elems);
		float m[7];
		cr_expect_eq(zinf_engine_read_master(e, 1, m), 0);
		for (int i = 0; i < 7; i++) {
			float want;
			init_val(NULL, 1, (uint64_t)i, 1, &want);
			cr_expect_eq(m[i], want, "b[%d] %g, want %g", i, (double)m[i],
				     (double)want);
		}
	}
	zinf_engine_destroy(e);
}

/*
 * A failed init fails the engine for good (the contract chosen). After a callback's -EINVAL,
 * init again, add_param and fetch all return that error (add_param was accepted and a second
 * init laid the model out over the first, before); destroy frees what the first init set up
 * (ASan: nothing leaks, nothing is written out of bounds).
 */
Test(engine_param, failed_init_fails_the_engine_for_good)
{
	struct zinf_engine_opts o;
	base_opts(&o);
	o.stage = 3;
	o.offload_optimizer.device = ZINF_OFFLOAD_CPU;
	o.sub_group_size = 8;
	struct zinf_engine *e = make(&o);
	int calls = 0;
	cr_assert_eq(add(e, "a", 5, 0, init_fail_once, &calls), 0);
	cr_assert_eq(add(e, "b", 7, 1, init_fail_once, &calls), 1);
	cr_assert_eq(zinf_engine_init(e), -EINVAL);
	cr_expect_eq(zinf_engine_init(e), -EINVAL, "a second init after a failed one");
	cr_expect_eq(add(e, "c", 3, 2, init_val, NULL), -EINVAL, "add_param after a failed init");
	cr_expect_eq(zinf_engine_param_count(e), 2);
	cr_expect_eq(zinf_engine_fetch(e, 0), -EINVAL, "fetch after a failed init");
	zinf_engine_destroy(e);
}

static uint64_t max_init_count; /* the largest range an init callback was asked for */

static int
init_count(void *ctx, uint32_t param, uint64_t first, uint64_t count, float *out)
{
	(void)ctx;
	if (count > max_init_count) {
		max_init_count = count;
	}
	return init_val(NULL, param, first, count, out);
}

/*
 * The initial values go sub-group by sub-group through buffers of at most
 * ZINF_STEP_CHUNK elements, never one of the whole partition (the default sub_group_size makes
 * the sub-group the whole partition): the init callback is asked for at most ZINF_STEP_CHUNK
 * elements at a time (it was asked for the whole 1.5 Mi-element partition). The values arrive
 * intact across the pieces: the master equals the callback's values and the fetched bf16
 * values (the parameters on NVMe, written piece by piece) equal them rounded.
 */
Test(engine_param, initial_values_in_bounded_pieces)
{
	char *dir = zt_mkdtemp(NULL);
	cr_assert(dir);
	struct zinf_engine_opts o;
	nvme_param_opts(&o, dir, "reinit");
	const uint64_t n = 3u << 19;
	struct zinf_engine *e = make(&o);
	max_init_count = 0;
	cr_assert_eq(add(e, "w", n, 0, init_count, NULL), 0);
	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
	cr_expect_leq(max_init_count, 1u << 20, "init asked for %llu elements at once",
		      (unsigned long long)max_init_count);
	float *want = malloc(n * 4), *m = malloc(n * 4);
	uint16_t *want16 = malloc(n * 2);
	cr_assert(want && m && want16);
	init_val(NULL, 0, 0, n, want);
	cr_assert_eq(zinf_engine_read_master(e, 0, m), 0);
	cr_expect_eq(memcmp(m, want, n * 4), 0, "master differs from the initial values");
	cr_assert_eq(zinf_dtype_convert(want16, ZINF_BF16, want, ZINF_F32, n), 0);
	cr_assert_eq(zinf_engine_fetch(e, 0), 0, "%s", zinf_last_error());
	void *d;
	cr_assert_eq(zinf_engine_param(e, 0, &d), 0);
	zinf_stream_sync(zinf_engine_compute_stream(e));
	cr_expect_eq(memcmp(d, want16, n * 2), 0, "fetched values differ from the initial values");
	cr_assert_eq(zinf_engine_release(e, 0), 0);
	free(want);
	free(m);
	free(want16);
	zinf_engine_destroy(e);
	zt_rmtree(dir);
	free(dir);
}

/*
 * fp16 training (opts.dtype ZINF_F16): one step at stage 3 with both tiers on the CPU equals
 * zinf_optimizer_step on the fp32 mean gradient, and the fetched values are the master rounded
 * to fp16.
 */
Test(engine_param, fp16_step_matches_reference)
{
	struct zinf_engine_opts o;
	base_opts(&o);
	o.stage = 3;
	o.dtype = ZINF_F16;
	o.offload_optimizer.device = ZINF_OFFLOAD_CPU;
	o.offload_param.device = ZINF_OFFLOAD_CPU;
	o.stage3_param_persistence_threshold = 0;
	struct zinf_engine *e = make(&o);
	const uint64_t n = 300;
	cr_assert_eq(add(e, "w", n, 0, init_val, NULL), 0);
	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
	float *gf = malloc(n * 4), *ref[3], *m = malloc(n * 4);
	for (int k = 0; k < 3; k++) {
		ref[k] = calloc(n, 4);
	}
	init_val(NULL, 0, 0, n, ref[0]);
	for (uint64_t i = 0; i < n; i++) {
		gf[i] = (float)((int)(i % 9) - 4) / 64.0f;
	}
	void *g;
	cr_assert_eq(zinf_device_alloc(zinf_engine_device(e), n * 2, &g), 0);
	cr_assert_eq(zinf_dtype_convert(g, ZINF_F16, gf, ZINF_F32, n), 0);
	cr_assert_eq(zinf_engine_fetch(e, 0), 0);
	cr_assert_eq(zinf_engine_grad(e, 0, g, ZINF_F16), 0);
	cr_assert_eq(zinf_engine_release(e, 0), 0);
	cr_assert_eq(zinf_engine_step(e), 1, "%s", zinf_last_error());
	struct zinf_optimizer *opt;
	cr_assert_eq(zinf_optimizer_create(&o.optimizer, &opt), 0);
	void *parts[3] = {ref[0], ref[1], ref[2]};
	cr_assert_eq(zinf_optimizer_step(opt, 1, 1.0f, parts, gf, ZINF_F32, 0, n, NULL, ZINF_F32),
		     0);
	cr_assert_eq(zinf_engine_read_master(e, 0, m), 0);
	cr_expect_eq(memcmp(m, ref[0], n * 4), 0, "fp16: master differs from the reference");
	cr_assert_eq(zinf_engine_fetch(e, 0), 0);
	void *d;
	cr_assert_eq(zinf_engine_param(e, 0, &d), 0);
	zinf_stream_sync(zinf_engine_compute_stream(e));
	uint16_t *want = malloc(n * 2);
	zinf_dtype_convert(want, ZINF_F16, ref[0], ZINF_F32, n);
	cr_expect_eq(memcmp(d, want, n * 2), 0, "fp16: fetched values differ");
	cr_assert_eq(zinf_engine_release(e, 0), 0);
	free(want);
	zinf_optimizer_destroy(opt);
	zinf_device_free(zinf_engine_device(e), g);
	for (int k = 0; k < 3; k++) {
		free(ref[k]);
	}
	free(gf);
	free(m);
	zinf_engine_destroy(e);
}

/*
 * Sizes that would wrap a byte count or a file offset are refused where they enter: a parameter
 * of 2^62 elements (its init once wrote past an 8000-byte buffer), and one that brings the
 * model past ZINF_ENGINE_MAX_ELEMS, each naming the parameter and the limit; the engine stays
 * usable. Element-count options of "no limit" (UINT64_MAX) are read as the limit: a model then
 * trains as with the defaults.
 */
Test(engine_param, sizes_that_would_wrap_are_refused)
{
	struct zinf_engine_opts o;
	base_opts(&o);
	o.stage = 3;
	o.offload_optimizer.device = ZINF_OFFLOAD_CPU;
	o.stage3_max_live_parameters = UINT64_MAX;
	o.stage3_max_reuse_distance = UINT64_MAX;
	o.stage3_prefetch_bucket_size = UINT64_MAX;
	o.sub_group_size = UINT64_MAX;
	o.reduce_bucket_size = UINT64_MAX;
	struct zinf_engine *e = make(&o);
	cr_assert_eq(add(e, "huge", 1ull << 62, 0, NULL, NULL), -EINVAL);
	const char *msg = zinf_last_error();
	cr_assert(strstr(msg, "\"huge\"") && strstr(msg, "4611686018427387904") &&
			  strstr(msg, "ZINF_ENGINE_MAX_ELEMS"),
		  "%s", msg);
	cr_assert_eq(add(e, "half", ZINF_ENGINE_MAX_ELEMS / 2, 0, NULL, NULL), 0);
	cr_assert_eq(add(e, "other half", ZINF_ENGINE_MAX_ELEMS / 2 + 1, 0, NULL, NULL), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "past the limit"), "%s", zinf_last_error());
	zinf_engine_destroy(e);

	/* the same "no limit" options train a small model */
	e = make(&o);
	cr_assert_eq(add(e, "w", 1000, 0, init_val, NULL), 0);
	cr_assert_eq(add(e, "b", 10, 1, init_val, NULL), 1);
	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
	void *g = grad16(e, 1000, 1);
	for (int l = 0; l < 2; l++) {
		cr_assert_eq(zinf_engine_fetch(e, l), 0, "%s", zinf_last_error());
		cr_assert_eq(zinf_engine_release(e, l), 0);
	}
	for (int l = 1; l >= 0; l--) {
		cr_assert_eq(zinf_engine_fetch(e, l), 0, "%s", zinf_last_error());
		cr_assert_eq(zinf_engine_grad(e, (uint32_t)l, g, ZINF_BF16), 0, "%s",
			     zinf_last_error());
		cr_assert_eq(zinf_engine_release(e, l), 0);
	}
	cr_assert_eq(zinf_engine_step(e), 1, "%s", zinf_last_error());
	zinf_device_free(zinf_engine_device(e), g);
	zinf_engine_destroy(e);
}
