/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/test_engine_stats.c: the engine's byte counts against what moved, one process
 * (single collectives, host device with asynchronous streams): reduced_bytes counts only the
 * filled part of a bucket; nvme_read_bytes only what was read from the swap files (not the
 * store's cache), against the I/O context's count; a step writes an NVMe-homed parameter
 * partition once, however many ZINF_STEP_CHUNK pieces it is stepped in (the I/O context's
 * bytes written); the parameter cache's reads per step against the count worked by hand for a
 * cache of none, part and all of the model, with the same values fetched. Both tiers on NVMe
 * and the swap files: test_engine.c (nvme_bytes_and_swap_files).
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

/* One micro-batch: forward over layers 0..L-1, backward L-1..0 handing every gradient. */
static int
micro(struct zinf_engine *e, int layers, const int *layer_of, int np, void **g)
{
	int ret;
	for (int l = 0; l < layers; l++) {
		if ((ret = zinf_engine_fetch(e, l)) || (ret = zinf_engine_release(e, l))) {
			return ret;
		}
	}
	for (int l = layers - 1; l >= 0; l--) {
		if ((ret = zinf_engine_fetch(e, l))) {
			return ret;
		}
		for (int i = np - 1; i >= 0; i--) {
			if (layer_of[i] == l &&
			    (ret = zinf_engine_grad(e, (uint32_t)i, g[i], ZINF_BF16))) {
				return ret;
			}
		}
		if ((ret = zinf_engine_release(e, l))) {
			return ret;
		}
	}
	return zinf_engine_step(e);
}

/*
 * reduced_bytes is "gradients handed to collectives": at stages 2-3 a bucket is reduce-scattered
 * over its filled part only, not over its whole capacity zero-filled (reduce_bucket_size
 * elements: 2 GB for the last bucket of every micro-batch with the default 5e8). Two
 * parameters of 1000 and 3 elements, buckets of 1000: 1003 elements of gradients, at most 4012
 * bytes reduced (8000 for the whole capacity). The same with the reduced values checked:
 * test_engine_grad.c.
 */
Test(engine_stats, reduced_bytes_count_only_the_filled_bucket)
{
	struct zinf_engine_opts o;
	base_opts(&o);
	o.stage = 2;
	o.reduce_bucket_size = 1000;
	struct zinf_engine *e = make(&o);
	cr_assert_eq(add(e, "small", 3, 0, init_val, NULL), 0);
	cr_assert_eq(add(e, "big", 1000, 1, init_val, NULL), 1);
	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
	int layer_of[2] = {0, 1};
	void *g[2] = {grad16(e, 3, 1), grad16(e, 1000, 2)};
	cr_assert_eq(micro(e, 2, layer_of, 2, g), 1, "%s", zinf_last_error());
	struct zinf_engine_stats st = {.size = sizeof(st)};
	cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
	cr_expect_leq(st.reduced_bytes, 1003 * 4, "reduced %llu bytes for 1003 fp32 elements",
		      (unsigned long long)st.reduced_bytes);
	for (int i = 0; i < 2; i++) {
		zinf_device_free(zinf_engine_device(e), g[i]);
	}
	zinf_engine_destroy(e);
}

static uint64_t
io_read(struct zinf_engine *e)
{
	struct zinf_io_stats s = {.size = sizeof(s)};
	cr_assert_eq(zinf_io_get_stats(zinf_engine_io(e), &s), 0);
	return s.bytes_read;
}

static uint64_t
io_written(struct zinf_engine *e)
{
	struct zinf_io_stats s = {.size = sizeof(s)};
	cr_assert_eq(zinf_io_get_stats(zinf_engine_io(e), &s), 0);
	return s.bytes_written;
}

/*
 * nvme_read_bytes is "bytes per tier and direction" of the swap files: a fetch of an NVMe-homed
 * partition that the store serves from its cache (max_in_cpu, default 1e9 elements; here the
 * backward fetch of the only layer) reads nothing from the file and is not counted. Checked
 * against the I/O context's own count (the optimizer is on the CPU, so every read of the
 * context is a parameter read).
 */
Test(engine_stats, nvme_read_bytes_counts_only_reads)
{
	char *dir = zt_mkdtemp(NULL);
	cr_assert(dir);
	struct zinf_engine_opts o;
	nvme_param_opts(&o, dir, "review-read"); /* every fetch goes to the store */
	struct zinf_engine *e = make(&o);
	cr_assert_eq(add(e, "w", 5000, 0, init_val, NULL), 0);
	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
	int layer_of[1] = {0};
	void *g[1] = {grad16(e, 5000, 3)};
	uint64_t r0 = io_read(e);
	cr_assert_eq(micro(e, 1, layer_of, 1, g), 1, "%s", zinf_last_error());
	uint64_t r1 = io_read(e);
	struct zinf_engine_stats st = {.size = sizeof(st)};
	cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
	cr_expect_leq(st.nvme_read_bytes, r1 - r0,
		      "the engine reports %llu bytes read from NVMe, the I/O context read %llu",
		      (unsigned long long)st.nvme_read_bytes, (unsigned long long)(r1 - r0));
	zinf_device_free(zinf_engine_device(e), g[0]);
	zinf_engine_destroy(e);
	zt_rmtree(dir);
	free(dir);
}

/*
 * Parameters on NVMe, optimizer on the CPU: the step hands the new 16-bit values to
 * eng_param_home_write() in ZINF_STEP_CHUNK (2^20) pieces, and a partition of 1.5 Mi elements
 * (two pieces) is written once per step, not once per piece (swapping the whole partition in
 * and out for every piece would write it twice and read it once more).
 */
Test(engine_stats, nvme_param_written_once_per_step)
{
	char *dir = zt_mkdtemp(NULL);
	cr_assert(dir);
	struct zinf_engine_opts o;
	nvme_param_opts(&o, dir, "review-write");
	o.step_during_backward = false;
	const uint64_t n = 3u << 19; /* 1.5 Mi elements: two step chunks */
	struct zinf_engine *e = make(&o);
	cr_assert_eq(add(e, "w", n, 0, init_val, NULL), 0);
	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
	void *g[1] = {grad16(e, n, 5)};
	/* the micro-batch without its step, then the step alone */
	cr_assert_eq(zinf_engine_fetch(e, 0), 0);
	cr_assert_eq(zinf_engine_release(e, 0), 0);
	cr_assert_eq(zinf_engine_fetch(e, 0), 0);
	cr_assert_eq(zinf_engine_grad(e, 0, g[0], ZINF_BF16), 0);
	cr_assert_eq(zinf_engine_release(e, 0), 0);
	uint64_t w0 = io_written(e);
	cr_assert_eq(zinf_engine_step(e), 1, "%s", zinf_last_error());
	/* a fetch waits for the partition's write in flight */
	cr_assert_eq(zinf_engine_fetch(e, 0), 0);
	cr_assert_eq(zinf_engine_release(e, 0), 0);
	uint64_t w1 = io_written(e);
	cr_expect_leq(w1 - w0, n * 2 + 4096, "one step wrote %llu bytes for a %llu-byte partition",
		      (unsigned long long)(w1 - w0), (unsigned long long)(n * 2));
	zinf_device_free(zinf_engine_device(e), g[0]);
	zinf_engine_destroy(e);
	zt_rmtree(dir);
	free(dir);
}

/*
 * Both tiers on NVMe, the step during backward, one micro-batch per step: a layer of the bench's
 * transformer shape (qkv 3H^2, proj H^2, fc1 and fc2 4H^2, two vectors of H; H = 256) x 8, in
 * sub-groups of 625000 elements (one to two layers) and buckets of 1.25e6 (a bucket ends in the
 * middle of a sub-group), the gradient window's default 4 slots. Backward hands gradients much
 * faster than the step worker steps (no compute), so the worker holds slots while a sub-group
 * is still accumulating when the next one needs a slot: the window waits for the worker then
 * instead of writing the partly accumulated gradient out and reading it back (which cost 0.3-1.2
 * bytes per parameter per step here). Per step, worked by hand: no gradient byte; the optimizer
 * reads and writes its fp32 master, m and v once (12 bytes per element, each sub-group's extent
 * rounded up to 4096 bytes); the parameters are written once (2 bytes) and read at most twice
 * (4); and the three kinds add up to the totals.
 */
Test(engine_stats, nvme_bytes_by_kind_and_no_gradient_spill)
{
	enum { H = 256, LAYERS = 8, NP = 6 };
	const uint64_t sizes[NP] = {3 * H * H, H * H, 4 * H * H, 4 * H * H, H, H};
	char *dir = zt_mkdtemp(NULL);
	cr_assert(dir);
	struct zinf_engine_opts o;
	nvme_param_opts(&o, dir, "kinds");
	o.offload_optimizer.device = ZINF_OFFLOAD_NVME;
	o.offload_optimizer.n_paths = 1;
	o.offload_optimizer.nvme_path[0] = dir;
	o.offload_param.max_in_cpu = 0;
	o.offload_param.buffer_count = 2 * NP; /* a layer in use, the next one's prefetch */
	o.sub_group_size = 625000;
	o.reduce_bucket_size = 1250000;
	struct zinf_engine *e = make(&o);
	int layer_of[LAYERS * NP];
	void *g[LAYERS * NP];
	uint64_t n = 0;
	for (int l = 0; l < LAYERS; l++) {
		for (int j = 0; j < NP; j++) {
			char name[32];
			snprintf(name, sizeof(name), "l%d.p%d", l, j);
			cr_assert_eq(add(e, name, sizes[j], l, init_val, NULL), l * NP + j, "%s",
				     zinf_last_error());
			layer_of[l * NP + j] = l;
			g[l * NP + j] = grad16(e, sizes[j], l * NP + j);
			n += sizes[j];
		}
	}
	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
	for (int s = 0; s < 3; s++) {
		cr_assert_eq(micro(e, LAYERS, layer_of, LAYERS * NP, g), 1, "step %d: %s", s,
			     zinf_last_error());
		struct zinf_engine_stats st = {.size = sizeof(st)};
		cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
		cr_expect_eq(st.grad_nvme_write_bytes + st.grad_nvme_read_bytes, 0,
			     "step %d: %llu gradient bytes written and %llu read back (%u of %u "
			     "sub-groups stepped during backward)",
			     s, (unsigned long long)st.grad_nvme_write_bytes,
			     (unsigned long long)st.grad_nvme_read_bytes,
			     st.stepped_during_backward, st.sub_groups);
		uint64_t pad = 3ull * 4096 * st.sub_groups;
		cr_expect(st.optim_nvme_read_bytes >= 12 * n &&
				  st.optim_nvme_read_bytes < 12 * n + pad,
			  "step %d: the optimizer read %llu bytes for %llu elements", s,
			  (unsigned long long)st.optim_nvme_read_bytes, (unsigned long long)n);
		cr_expect_eq(st.optim_nvme_write_bytes, st.optim_nvme_read_bytes, "step %d", s);
		cr_expect(st.param_nvme_write_bytes >= 2 * n &&
				  st.param_nvme_write_bytes < 2 * n + 4096ull * LAYERS * NP,
			  "step %d: the parameters' writes %llu bytes for %llu elements", s,
			  (unsigned long long)st.param_nvme_write_bytes, (unsigned long long)n);
		cr_expect(st.param_nvme_read_bytes > 0 &&
				  st.param_nvme_read_bytes <= 2 * (2 * n + 4096ull * LAYERS * NP),
			  "step %d: the parameters' reads %llu bytes", s,
			  (unsigned long long)st.param_nvme_read_bytes);
		cr_expect_eq(st.param_nvme_read_bytes + st.optim_nvme_read_bytes +
				     st.grad_nvme_read_bytes,
			     st.nvme_read_bytes, "step %d: the kinds' reads add up", s);
		cr_expect_eq(st.param_nvme_write_bytes + st.optim_nvme_write_bytes +
				     st.grad_nvme_write_bytes,
			     st.nvme_write_bytes, "step %d: the kinds' writes add up", s);
	}
	for (int i = 0; i < LAYERS * NP; i++) {
		zinf_device_free(zinf_engine_device(e), g[i]);
	}
	zinf_engine_destroy(e);
	zt_rmtree(dir);
	free(dir);
}

/* Fetch layers 0..n-1 (parameter l in layer l, p elements of 16 bits) and copy them into out. */
static void
fetch_all(struct zinf_engine *e, int n, uint64_t p, uint16_t *out)
{
	for (int l = 0; l < n; l++) {
		void *d = NULL;
		cr_assert_eq(zinf_engine_fetch(e, l), 0, "%s", zinf_last_error());
		cr_assert_eq(zinf_engine_param(e, (uint32_t)l, &d), 0);
		cr_assert_eq(zinf_stream_sync(zinf_engine_compute_stream(e)), 0);
		memcpy(out + (size_t)l * p, d, p * 2);
		cr_assert_eq(zinf_engine_release(e, l), 0);
	}
}

/*
 * The parameter cache (offload_param.max_in_cpu): NVMe reads of the 16-bit partitions per step,
 * worked by hand, for N = 8 equal layers (one parameter of P elements each, a partition of
 * 64 KiB, a multiple of any direct-I/O alignment) and a cache of C layers. A step touches the
 * layers forward 0..N-1, backward N-1..0, and writes their new values in backward order (during
 * backward: one sub-group a layer; or after it). Under LRU a forward read of layer k finds k
 * other layers touched since its last use, a backward read N-1-k: it hits when that is below C.
 * So each pass reads N - C layers, 2(N - C) per step (C < N), none for C >= N; writes need no
 * read. With C = 3, 4 and 8 (max_in_cpu 1e9, capped at the model): 10, 8 and 0 partitions read
 * in step 3. Without a cache (C = 0) 2N, less the partitions whose new values are still being
 * written when the next forward asks for them (a write keeps its buffer: usually layer 0's, the
 * last written, but a slow step (seen under ASan) has reaped even that one; at most
 * buffer_count): 16 - 5 to 16. Every step writes every partition once:
 * 3N partitions through the I/O context from before step 1 to after a fetch of every layer
 * (which waits for writes in flight). The fetched values after three steps are the same bits
 * for every cache and both step orders.
 */
Test(engine_stats, nvme_param_reads_per_step_match_the_cache_worked_by_hand)
{
	enum { N = 8, P = 32768 };
	const uint64_t part = P * 2;
	static const struct {
		uint64_t max_in_cpu;
		uint64_t reads; /* partitions read per step */
	} cases[] = {{0, 2 * N}, {3 * P, 2 * (N - 3)}, {4 * P, 2 * (N - 4)}, {1000000000, 0}};
	uint16_t *ref = NULL; /* the first run's values, every layer */
	for (int sdb = 0; sdb < 2; sdb++) {
		for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
			char *dir = zt_mkdtemp(NULL);
			cr_assert(dir);
			struct zinf_engine_opts o;
			nvme_param_opts(&o, dir, "pcache");
			o.offload_param.max_in_cpu = cases[c].max_in_cpu;
			o.stage3_max_reuse_distance = 0; /* every fetch asks the store */
			o.sub_group_size = P;		 /* a sub-group a layer */
			o.step_during_backward = sdb;
			struct zinf_engine *e = make(&o);
			int layer_of[N];
			void *g[N];
			for (int i = 0; i < N; i++) {
				char name[16];
				snprintf(name, sizeof(name), "w%d", i);
				cr_assert_eq(add(e, name, P, i, init_val, NULL), i);
				layer_of[i] = i;
			}
			cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
			for (int i = 0; i < N; i++) {
				g[i] = grad16(e, P, i);
			}
			uint16_t *got = malloc(N * part);
			cr_assert(got);
			fetch_all(e, N, P, got); /* init's writes done */
			uint64_t w0 = io_written(e);
			for (int s = 0; s < 3; s++) {
				cr_assert_eq(micro(e, N, layer_of, N, g), 1, "%s",
					     zinf_last_error());
			}
			struct zinf_engine_stats st = {.size = sizeof(st)};
			cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
			uint64_t lo = cases[c].max_in_cpu
					      ? cases[c].reads
					      : cases[c].reads - o.offload_param.buffer_count;
			cr_expect(st.nvme_read_bytes >= lo * part &&
					  st.nvme_read_bytes <= cases[c].reads * part,
				  "max_in_cpu %llu, step during backward %d: read %llu bytes, "
				  "%llu to %llu partitions worked by hand",
				  (unsigned long long)cases[c].max_in_cpu, sdb,
				  (unsigned long long)st.nvme_read_bytes, (unsigned long long)lo,
				  (unsigned long long)cases[c].reads);
			fetch_all(e, N, P, got); /* the values, against the first run's */
			cr_expect_eq(io_written(e) - w0, 3 * N * part,
				     "max_in_cpu %llu, step during backward %d: three steps wrote "
				     "%llu bytes",
				     (unsigned long long)cases[c].max_in_cpu, sdb,
				     (unsigned long long)(io_written(e) - w0));
			if (!ref) {
				ref = got;
			} else {
				cr_expect_eq(memcmp(ref, got, N * part), 0,
					     "max_in_cpu %llu, step during backward %d: other "
					     "values than without a cache",
					     (unsigned long long)cases[c].max_in_cpu, sdb);
				free(got);
			}
			for (int i = 0; i < N; i++) {
				zinf_device_free(zinf_engine_device(e), g[i]);
			}
			zinf_engine_destroy(e);
			zt_rmtree(dir);
			free(dir);
		}
	}
	free(ref);
}
