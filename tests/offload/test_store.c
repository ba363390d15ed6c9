/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/offload/test_store.c: the tensor store. Real bytes through swap files: more tensors than
 * buffers (back-pressure by waiting for writes), a request that cannot be served fails with the
 * budget named instead of hanging, the max_in_cpu cache (written data kept there too), the
 * prefetch byte budget and its eviction of the cache, zinf_store_ready, per-tensor waits, and
 * failed reads and writes (fault backend) that drop no data. The cache region (cache_bytes):
 * tensors of different sizes each in their own bytes, its budget, least recently used eviction,
 * written data kept and on disk, a buffer when no extent is left, its option errors.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <string.h>
#include <unistd.h>

#include "common/test_util.h"
#include "common/util.h"
#include "offload/swap_rig.h"
#include "zinf/blocks/offload.h"

#define ELEMS 10000u /* 40000 bytes per tensor */

struct srig {
	char *dir;
	struct zinf_io *io;
	struct zinf_swap *swap;
	struct zinf_pool *pool;
	struct zinf_store *st;
};

/* The swap space alone (srig_store adds the pool and the store): a test that sizes the store by
 * the swap space's alignment. */
static void
srig_swap(struct srig *r, bool fault)
{
	zt_log_to_stderr();
	memset(r, 0, sizeof(*r));
	swap_rig_open(16384, fault, &r->dir, &r->io, &r->swap);
}

static void
srig_store(struct srig *r, uint32_t buffers, struct zinf_store_opts *so)
{
	struct zinf_pool_opts po;
	zinf_pool_opts_init(&po);
	po.buffer_count = buffers;
	po.buffer_bytes = ELEMS * 4;
	po.cpu_bytes = 1 << 20;
	po.align = zinf_swap_align(r->swap); /* the cache region's extents are read into */
	po.io = r->io;
	po.what = "offload_param";
	cr_assert_eq(zinf_pool_create(&po, &r->pool), 0);
	so->pool = r->pool;
	so->swap = r->swap;
	cr_assert_eq(zinf_store_create(so, &r->st), 0, "%s", zinf_last_error());
}

static void
srig_init(struct srig *r, uint32_t buffers, struct zinf_store_opts *so, bool fault)
{
	srig_swap(r, fault);
	srig_store(r, buffers, so);
}

static void
srig_fini(struct srig *r)
{
	zinf_store_destroy(r->st);
	cr_assert_eq(zinf_pool_free_count(r->pool), zinf_pool_buffer_count(r->pool),
		     "a buffer leaked");
	zinf_pool_destroy(r->pool);
	zinf_swap_destroy(r->swap);
	zinf_io_destroy(r->io);
	zt_rmtree(r->dir);
	free(r->dir);
}

static int
add_n(struct srig *r, int n)
{
	for (int i = 0; i < n; i++) {
		cr_assert_eq(zinf_store_add(r->st, "param16", i, ELEMS, 4, ZINF_TIER_NVME), i);
	}
	int cpu = zinf_store_add(r->st, "cpu", 0, ELEMS, 4, ZINF_TIER_CPU);
	cr_assert_eq(cpu, n);
	cr_assert_eq(zinf_swap_reserve(r->swap), 0);
	return cpu;
}

/* Write n tensors of distinct data through the store; return the data. */
static float *
write_all(struct srig *r, int n, uint64_t *seed)
{
	float *ref = malloc((size_t)n * ELEMS * 4);
	zt_rand_fill(ref, (size_t)n * ELEMS * 4, seed);
	for (int i = 0; i < n; i++) {
		void *d = NULL;
		cr_assert_eq(zinf_store_swap_in(r->st, i, ZINF_STORE_NEW), 0, "%s",
			     zinf_last_error());
		cr_assert_eq(zinf_store_wait(r->st, i, &d), 0);
		cr_assert_eq(((float *)d)[17], 0.0f, "a new tensor starts zeroed");
		memcpy(d, ref + (size_t)i * ELEMS, ELEMS * 4);
		cr_assert_eq(zinf_store_mark_dirty(r->st, i), 0);
		cr_assert_eq(zinf_store_release(r->st, i), 0);
		/* Back-pressure keeps the tensors holding a buffer within the pool. */
		uint32_t held = 0;
		for (int j = 0; j < n; j++) {
			held += zinf_store_state(r->st, j) != ZINF_TENSOR_ABSENT;
		}
		cr_assert_leq(held, zinf_pool_buffer_count(r->pool), "after tensor %d", i);
	}
	return ref;
}

Test(store, more_tensors_than_buffers_round_trip)
{
	uint64_t seed = zt_seed();
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	struct srig r;
	srig_init(&r, 2, &so, false);
	int cpu = add_n(&r, 7);
	float *ref = write_all(&r, 7, &seed);
	cr_assert_eq(zinf_store_flush(r.st), 0);
	for (int i = 0; i < 7; i++) {
		cr_assert_eq(zinf_store_state(r.st, i), ZINF_TENSOR_ABSENT);
	}
	for (int i = 6; i >= 0; i--) {
		void *d;
		cr_assert_eq(zinf_store_swap_in(r.st, i, 0), 0);
		cr_assert_eq(zinf_store_wait(r.st, i, &d), 0);
		cr_assert_eq(memcmp(d, ref + (size_t)i * ELEMS, ELEMS * 4), 0, "tensor %d", i);
		cr_assert_eq(zinf_store_release(r.st, i), 0);
	}
	/* CPU-homed: always resident, in the pool's CPU region. */
	cr_assert_eq(zinf_store_state(r.st, cpu), ZINF_TENSOR_RESIDENT);
	struct zinf_store_stats s = {.size = sizeof(s)};
	cr_assert_eq(zinf_store_get_stats(r.st, &s), 0);
	cr_assert_eq(s.writes, 7);
	cr_assert_eq(s.reads, 7);
	/* Whether a swap-in had to wait for a write (buffer_waits) or found it already reaped
	 * depends on the disk's speed: not asserted (it failed about 1 run in 7 under ASan). */
	cr_log_info("buffer waits: %" PRIu64, s.buffer_waits);
	free(ref);
	srig_fini(&r);
}

Test(store, no_buffer_fails_with_the_budget_named_never_hangs)
{
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	struct srig r;
	srig_init(&r, 2, &so, false);
	add_n(&r, 3);
	cr_assert_eq(zinf_store_swap_in(r.st, 0, ZINF_STORE_NEW), 0);
	cr_assert_eq(zinf_store_swap_in(r.st, 1, ZINF_STORE_NEW), 0);
	cr_assert_eq(zinf_store_swap_in(r.st, 2, ZINF_STORE_NOWAIT), -EAGAIN);
	cr_assert(strstr(zinf_last_error(), "buffer_count"), "%s", zinf_last_error());
	cr_assert_eq(zinf_store_state(r.st, 2), ZINF_TENSOR_ABSENT);
	/* Waiting would never end (this thread holds both): an error, not a hang. */
	cr_assert_eq(zinf_store_swap_in(r.st, 2, 0), -EDEADLK);
	cr_assert(strstr(zinf_last_error(), "offload_param.buffer_count"), "%s", zinf_last_error());
	/* A tensor larger than a buffer is refused when declared. */
	cr_assert_eq(zinf_store_add(r.st, "big", 0, 2 * ELEMS, 4, ZINF_TIER_NVME), -EINVAL);
	/* Sizes that wrap 64 bits are refused, not declared as a few bytes. */
	cr_assert_eq(zinf_store_add(r.st, "huge", 0, 1ULL << 62, 8, ZINF_TIER_NVME), -EINVAL);
	cr_assert_eq(zinf_store_add(r.st, "huge", 1, 1ULL << 62, 4, ZINF_TIER_CPU), -EINVAL);
	zinf_store_release(r.st, 0);
	zinf_store_release(r.st, 1);
	cr_assert_eq(zinf_store_swap_in(r.st, 2, ZINF_STORE_NOWAIT | ZINF_STORE_NEW), 0);
	zinf_store_release(r.st, 2);
	srig_fini(&r);
}

/*
 * ZINF_STORE_OVERWRITE: a written tensor swapped in for a caller that overwrites it whole is
 * neither read nor zeroed (the buffer keeps the bytes of whatever used it last, here a marker),
 * and what the caller writes goes to the file as usual.
 */
Test(store, overwrite_neither_reads_nor_zeroes)
{
	uint64_t seed = zt_seed();
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	struct srig r;
	srig_init(&r, 1, &so, false);
	add_n(&r, 2);
	float *ref = write_all(&r, 2, &seed);
	cr_assert_eq(zinf_store_flush(r.st), 0);
	struct zinf_store_stats s0 = {.size = sizeof(s0)}, s1 = {.size = sizeof(s1)};
	cr_assert_eq(zinf_store_get_stats(r.st, &s0), 0);
	/* the only buffer, marked through tensor 1 (read back: its own values) */
	void *d = NULL;
	cr_assert_eq(zinf_store_swap_in(r.st, 1, 0), 0);
	cr_assert_eq(zinf_store_wait(r.st, 1, &d), 0);
	((float *)d)[17] = -3.5f;
	cr_assert_eq(zinf_store_release(r.st, 1), 0); /* clean: not written */
	void *d0 = NULL;
	cr_assert_eq(zinf_store_swap_in(r.st, 0, ZINF_STORE_OVERWRITE), 0);
	cr_assert_eq(zinf_store_state(r.st, 0), ZINF_TENSOR_RESIDENT, "no read in flight");
	cr_assert_eq(zinf_store_wait(r.st, 0, &d0), 0);
	cr_assert_eq(d0, d, "the one buffer");
	cr_assert_eq(((float *)d0)[17], -3.5f, "not zeroed, not read");
	cr_assert_eq(zinf_store_get_stats(r.st, &s1), 0);
	cr_assert_eq(s1.reads - s0.reads, 1, "only tensor 1's read");
	for (int i = 0; i < ELEMS; i++) {
		((float *)d0)[i] = (float)i;
	}
	cr_assert_eq(zinf_store_mark_dirty(r.st, 0), 0);
	cr_assert_eq(zinf_store_release(r.st, 0), 0);
	cr_assert_eq(zinf_store_flush(r.st), 0);
	cr_assert_eq(zinf_store_swap_in(r.st, 0, 0), 0);
	cr_assert_eq(zinf_store_wait(r.st, 0, &d0), 0);
	for (int i = 0; i < ELEMS; i++) {
		cr_assert_eq(((float *)d0)[i], (float)i, "element %d as overwritten", i);
	}
	cr_assert_eq(zinf_store_release(r.st, 0), 0);
	free(ref);
	srig_fini(&r);
}

Test(store, max_in_cpu_cache)
{
	uint64_t seed = zt_seed();
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	so.max_in_cpu = 2 * ELEMS;
	struct srig r;
	srig_init(&r, 4, &so, false);
	add_n(&r, 4);
	float *ref = write_all(&r, 4, &seed);
	cr_assert_eq(zinf_store_flush(r.st), 0);
	void *d;
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(zinf_store_swap_in(r.st, i, 0), 0);
		cr_assert_eq(zinf_store_wait(r.st, i, &d), 0);
		cr_assert_eq(zinf_store_release(r.st, i), 0);
	}
	/* Cache holds 2 tensors' elements: 1 and 2 stay, 0 (least recent) was evicted. */
	cr_assert_eq(zinf_store_state(r.st, 0), ZINF_TENSOR_ABSENT);
	cr_assert_eq(zinf_store_state(r.st, 1), ZINF_TENSOR_RESIDENT);
	cr_assert_eq(zinf_store_state(r.st, 2), ZINF_TENSOR_RESIDENT);
	struct zinf_store_stats s0 = {.size = sizeof(s0)}, s1 = {.size = sizeof(s1)};
	cr_assert_eq(zinf_store_get_stats(r.st, &s0), 0);
	cr_assert_eq(s0.cached_elems, 2 * ELEMS);
	cr_assert_eq(zinf_store_swap_in(r.st, 1, 0), 0);
	cr_assert_eq(zinf_store_wait(r.st, 1, &d), 0);
	cr_assert_eq(memcmp(d, ref + ELEMS, ELEMS * 4), 0);
	cr_assert_eq(zinf_store_get_stats(r.st, &s1), 0);
	cr_assert_eq(s1.cache_hits, s0.cache_hits + 1);
	cr_assert_eq(s1.reads, s0.reads, "a cache hit reads nothing");
	zinf_store_release(r.st, 1);
	free(ref);
	srig_fini(&r);
}

Test(store, prefetch_byte_budget)
{
	uint64_t seed = zt_seed();
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	so.prefetch_bytes = 2 * ELEMS * 4;
	struct srig r;
	srig_init(&r, 4, &so, false);
	add_n(&r, 5);
	float *ref = write_all(&r, 5, &seed);
	cr_assert_eq(zinf_store_flush(r.st), 0);
	for (int i = 0; i < 4; i++) {
		cr_assert_eq(zinf_store_prefetch(r.st, i), 0);
	}
	cr_assert_neq(zinf_store_state(r.st, 0), ZINF_TENSOR_ABSENT);
	cr_assert_neq(zinf_store_state(r.st, 1), ZINF_TENSOR_ABSENT);
	cr_assert_eq(zinf_store_state(r.st, 2), ZINF_TENSOR_ABSENT, "over the byte budget");
	cr_assert_eq(zinf_store_state(r.st, 3), ZINF_TENSOR_ABSENT);
	/* Claiming one frees budget: the queue moves on. */
	void *d;
	cr_assert_eq(zinf_store_swap_in(r.st, 0, 0), 0);
	cr_assert_neq(zinf_store_state(r.st, 2), ZINF_TENSOR_ABSENT);
	cr_assert_eq(zinf_store_wait(r.st, 0, &d), 0);
	cr_assert_eq(memcmp(d, ref, ELEMS * 4), 0);
	for (int i = 1; i < 4; i++) {
		cr_assert_eq(zinf_store_swap_in(r.st, i, 0), 0);
		cr_assert_eq(zinf_store_wait(r.st, i, &d), 0);
		cr_assert_eq(memcmp(d, ref + (size_t)i * ELEMS, ELEMS * 4), 0);
		zinf_store_release(r.st, i);
	}
	zinf_store_release(r.st, 0);
	struct zinf_store_stats s = {.size = sizeof(s)};
	cr_assert_eq(zinf_store_get_stats(r.st, &s), 0);
	cr_assert_eq(s.prefetch_started, 4);
	so.prefetch_bytes = 100;
	struct zinf_store *st2;
	cr_assert_eq(zinf_store_create(&so, &st2), 0);
	int id = zinf_store_add(st2, "cpu", 1, 10, 4, ZINF_TIER_CPU);
	cr_assert_geq(id, 0);
	zinf_store_destroy(st2);
	cr_assert_eq(zinf_store_prefetch(r.st, 4), 0);
	free(ref);
	srig_fini(&r);
}

Test(store, failed_write_keeps_the_data_failed_read_frees_the_buffer)
{
	uint64_t seed = zt_seed();
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	struct srig r;
	srig_init(&r, 2, &so, true);
	add_n(&r, 2);
	struct zinf_io_fault f = {
		.kind = ZINF_IO_FAULT_FAIL, .op = ZINF_IO_WRITE, .nth = 2, .err = EIO};
	cr_assert_eq(zinf_io_fault_add(r.io, &f), 0);
	float *ref = write_all(&r, 1, &seed);
	cr_assert_eq(zinf_store_flush(r.st), -EIO);
	cr_assert_eq(zinf_store_state(r.st, 0), ZINF_TENSOR_RESIDENT, "the data is kept");
	/* The fault was one op: flushing again writes it. */
	cr_assert_eq(zinf_store_release(r.st, 0), 0);
	cr_assert_eq(zinf_store_flush(r.st), 0);
	cr_assert_eq(zinf_store_state(r.st, 0), ZINF_TENSOR_ABSENT);
	struct zinf_io_fault fr = {
		.kind = ZINF_IO_FAULT_FAIL, .op = ZINF_IO_READ, .nth = 1, .err = EIO};
	cr_assert_eq(zinf_io_fault_add(r.io, &fr), 0);
	void *d;
	cr_assert_eq(zinf_store_swap_in(r.st, 0, 0), 0);
	cr_assert_eq(zinf_store_wait(r.st, 0, &d), -EIO);
	/* The store's name, and one tensor throughout: the store's and the swap space's. */
	const char *e = zinf_last_error();
	cr_assert(strstr(e,
			 "store (offload_param): swap-in of param16[0] failed: swap zinf-r0 in ") &&
			  strstr(e, ": read of param16[0] failed: ") && strstr(e, r.dir),
		  "%s", e);
	cr_assert_eq(zinf_store_state(r.st, 0), ZINF_TENSOR_ABSENT);
	cr_assert_eq(zinf_pool_free_count(r.pool), 2);
	cr_assert_eq(zinf_store_swap_in(r.st, 0, 0), 0);
	cr_assert_eq(zinf_store_wait(r.st, 0, &d), 0);
	cr_assert_eq(memcmp(d, ref, ELEMS * 4), 0);
	zinf_store_release(r.st, 0);
	free(ref);
	srig_fini(&r);
}

/*
 * The same failure, reaped in the background (by another tensor's swap-in) before the flush:
 * a wait for the tensor reports it, and the flush reports it and keeps the data resident and
 * dirty, exactly as when the flush itself waits for the failing write (the test above, whose
 * order depends on the engine's timing). A flush that retried such a write at once and still
 * returned the old error would leave the tensor ABSENT: the test above then failed in about 1
 * run in 10 (an LSan report of the aborted test's allocations, ~47 KB, was the visible symptom
 * under ASan).
 */
Test(store, failed_write_reaped_in_the_background_is_reported_by_the_next_flush)
{
	uint64_t seed = zt_seed();
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	struct srig r;
	srig_init(&r, 2, &so, true);
	add_n(&r, 2);
	struct zinf_io_fault f = {
		.kind = ZINF_IO_FAULT_FAIL, .op = ZINF_IO_WRITE, .nth = 2, .err = EIO};
	cr_assert_eq(zinf_io_fault_add(r.io, &f), 0);
	float *ref = write_all(&r, 1, &seed);
	/* Another tensor's swap-in reaps finished writes: spin until tensor 0's failure is. */
	double t0 = zinf_now_s();
	while (zinf_store_state(r.st, 0) == ZINF_TENSOR_WRITING) {
		cr_assert_lt(zinf_now_s() - t0, 10.0, "the write never completed");
		cr_assert_eq(zinf_store_swap_in(r.st, 1, ZINF_STORE_NEW), 0);
		cr_assert_eq(zinf_store_release(r.st, 1), 0);
		usleep(1000);
	}
	cr_assert_eq(zinf_store_state(r.st, 0), ZINF_TENSOR_RESIDENT, "the data is kept");
	/* a wait for the released tensor reports the failure as if it had reaped it, naming the
	   tensor and the file; the flush still reports it */
	cr_assert_eq(zinf_store_wait(r.st, 0, NULL), -EIO);
	const char *why = zinf_last_error();
	cr_assert(strstr(why, "write of param16[0] failed") && strstr(why, r.dir), "%s", why);
	cr_assert_eq(zinf_store_swap_in(r.st, 99, 0), -EINVAL); /* another last error */
	cr_assert_eq(zinf_store_flush(r.st), -EIO, "the failed write is reported");
	why = zinf_last_error(); /* said by the flush too, not only returned */
	cr_assert(strstr(why, "write of param16[0] failed") && strstr(why, r.dir), "%s", why);
	cr_assert_eq(zinf_store_state(r.st, 0), ZINF_TENSOR_RESIDENT, "not retried by that flush");
	uint64_t w = zinf_io_fault_ops(r.io, ZINF_IO_WRITE);
	cr_assert_eq(zinf_store_flush(r.st), 0, "the next flush retries it");
	cr_assert_gt(zinf_io_fault_ops(r.io, ZINF_IO_WRITE), w);
	cr_assert_eq(zinf_store_state(r.st, 0), ZINF_TENSOR_ABSENT);
	cr_assert_eq(zinf_store_flush(r.st), 0, "reported once");
	void *d;
	cr_assert_eq(zinf_store_swap_in(r.st, 0, 0), 0);
	cr_assert_eq(zinf_store_wait(r.st, 0, &d), 0);
	cr_assert_eq(memcmp(d, ref, ELEMS * 4), 0);
	zinf_store_release(r.st, 0);
	free(ref);
	srig_fini(&r);
}

/*
 * A released clean tensor kept in the cache is RESIDENT, so mark_dirty accepts it; the contract
 * then says the next release or flush writes it. Evicting it from the cache (another release
 * over max_in_cpu) must not drop the modification: it used to give the buffer back unwritten,
 * and the flush found nothing to write.
 */
Test(store, dirty_cached_tensor_is_not_evicted_unwritten)
{
	uint64_t seed = zt_seed();
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	so.max_in_cpu = ELEMS;
	struct srig r;
	srig_init(&r, 3, &so, false);
	add_n(&r, 2);
	float *ref = write_all(&r, 2, &seed);
	cr_assert_eq(zinf_store_flush(r.st), 0);
	void *d;
	cr_assert_eq(zinf_store_swap_in(r.st, 0, 0), 0);
	cr_assert_eq(zinf_store_wait(r.st, 0, &d), 0);
	cr_assert_eq(zinf_store_release(r.st, 0), 0);
	cr_assert_eq(zinf_store_state(r.st, 0), ZINF_TENSOR_RESIDENT, "cached");
	((float *)d)[5] = 1234.5f;
	ref[5] = 1234.5f;
	cr_assert_eq(zinf_store_mark_dirty(r.st, 0), 0);
	cr_assert_eq(zinf_store_swap_in(r.st, 1, 0), 0);
	cr_assert_eq(zinf_store_wait(r.st, 1, NULL), 0);
	cr_assert_eq(zinf_store_release(r.st, 1), 0); /* the cache holds one tensor */
	cr_assert_eq(zinf_store_flush(r.st), 0);
	cr_assert_eq(zinf_store_release(r.st, 0), 0);
	cr_assert_eq(zinf_store_flush(r.st), 0);
	struct zinf_store_stats s = {.size = sizeof(s)};
	cr_assert_eq(zinf_store_get_stats(r.st, &s), 0);
	cr_assert_leq(s.cached_elems, ELEMS);
	/* The file is the truth (nothing in flight after the flush). */
	int id = zinf_swap_find(r.swap, "param16", 0);
	cr_assert_geq(id, 0);
	float *back = zinf_alloc_aligned(4096, zinf_swap_buf_bytes(r.swap, id));
	cr_assert_eq(zinf_swap_read(r.swap, id, back), 0);
	cr_assert_eq(memcmp(back, ref, ELEMS * 4), 0,
		     "the modification of a cached tensor was lost");
	zinf_free_aligned(back);
	free(ref);
	srig_fini(&r);
}

/*
 * Back-pressure after a failed write: with every buffer held by writes, a swap-in waits for the
 * oldest; when that one fails (its data stays resident and dirty), the next write in flight
 * still frees a buffer. The store used to give up there and answer -EDEADLK (or, with a buffer
 * held by another thread, wait on the pool for a buffer that only its own reaping could free).
 * Tensor 0 (4 MiB) fails on its first block; tensor 1 (16 MiB, written next, its blocks
 * interleaved with 0's) is still in flight when 0 completes.
 */
Test(store, failed_oldest_write_does_not_stop_back_pressure)
{
	zt_log_to_stderr();
	const uint64_t elems = 4u << 20; /* 16 MiB of fp32 */
	struct zinf_io_opts io;
	zinf_io_opts_init(&io);
	io.block_size = 16384;
	io.backend = "fault";
	struct srig r;
	memset(&r, 0, sizeof(r));
	r.io = zt_io_open(&io);
	r.dir = zt_mkdtemp(NULL);
	struct zinf_swap_opts sw;
	zinf_swap_opts_init(&sw);
	const char *dirs[1] = {r.dir};
	sw.dirs = dirs;
	sw.n_dirs = 1;
	cr_assert_eq(zinf_swap_create(r.io, &sw, &r.swap), 0);
	struct zinf_pool_opts po;
	zinf_pool_opts_init(&po);
	po.buffer_count = 2;
	po.buffer_bytes = elems * 4;
	po.io = r.io;
	po.pin_memory = false;
	po.what = "offload_param";
	cr_assert_eq(zinf_pool_create(&po, &r.pool), 0);
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	so.pool = r.pool;
	so.swap = r.swap;
	cr_assert_eq(zinf_store_create(&so, &r.st), 0);
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(zinf_store_add(r.st, "param16", i, i == 1 ? elems : elems / 4, 4,
					    ZINF_TIER_NVME),
			     i);
	}
	cr_assert_eq(zinf_swap_reserve(r.swap), 0);
	/* Tensor 0's write fails on its first block; tensor 1's write follows it. */
	struct zinf_io_fault f = {
		.kind = ZINF_IO_FAULT_FAIL, .op = ZINF_IO_WRITE, .nth = 1, .err = EIO};
	cr_assert_eq(zinf_io_fault_add(r.io, &f), 0);
	for (int i = 0; i < 2; i++) {
		void *d;
		cr_assert_eq(zinf_store_swap_in(r.st, i, ZINF_STORE_NEW), 0);
		cr_assert_eq(zinf_store_wait(r.st, i, &d), 0);
		memset(d, i + 1, zinf_store_bytes(r.st, i));
		cr_assert_eq(zinf_store_mark_dirty(r.st, i), 0);
		cr_assert_eq(zinf_store_release(r.st, i), 0);
	}
	int rc = zinf_store_swap_in(r.st, 2, ZINF_STORE_NEW);
	cr_assert_eq(rc, 0, "tensor 1's write frees a buffer: got %d (%s)", rc, zinf_last_error());
	cr_assert_eq(zinf_store_release(r.st, 2), 0);
	cr_assert_eq(zinf_store_flush(r.st), -EIO, "the failed write is reported");
	cr_assert_eq(zinf_store_flush(r.st), 0, "and retried");
	srig_fini(&r);
}

/* Every public store function given a NULL handle: -EINVAL with a message; getters neutral. */
/* Poll zinf_store_ready until it answers something else than 0 (the I/O completes). */
static int
ready_eventually(struct zinf_store *st, int id)
{
	int rc = 0;
	for (int i = 0; i < 1000000 && (rc = zinf_store_ready(st, id)) == 0; i++) {
		usleep(100);
	}
	return rc;
}

/*
 * zinf_store_ready answers without waiting: 0 for a tensor on NVMe only, 1 once its read is
 * complete (prefetched, not claimed: the state stays READING until a wait or swap-in, which then
 * do not block and see the data), 1 for a resident or CPU-homed tensor, -EINVAL for an unknown id
 * or no store. Nothing is read or claimed by asking.
 */
Test(store, ready_says_whether_a_wait_would_block)
{
	uint64_t seed = zt_seed();
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	so.prefetch_bytes = 4 * ELEMS * 4;
	struct srig r;
	srig_init(&r, 2, &so, false);
	int cpu = add_n(&r, 3);
	float *ref = write_all(&r, 3, &seed);
	cr_assert_eq(zinf_store_flush(r.st), 0);
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(zinf_store_state(r.st, i), ZINF_TENSOR_ABSENT,
			     "max_in_cpu 0: not kept");
		cr_assert_eq(zinf_store_ready(r.st, i), 0, "tensor %d is on NVMe only", i);
	}
	cr_assert_eq(zinf_store_ready(r.st, cpu), 1);
	cr_assert_eq(zinf_store_ready(r.st, 99), -EINVAL);
	cr_assert_eq(zinf_store_ready(NULL, 0), -EINVAL);
	struct zinf_store_stats s0 = {.size = sizeof(s0)}, s1 = {.size = sizeof(s1)};
	cr_assert_eq(zinf_store_get_stats(r.st, &s0), 0);
	cr_assert_eq(zinf_store_state(r.st, 1), ZINF_TENSOR_ABSENT, "asking started no read");
	cr_assert_eq(zinf_store_prefetch(r.st, 1), 0);
	cr_assert_neq(zinf_store_state(r.st, 1), ZINF_TENSOR_ABSENT, "the prefetch started");
	cr_assert_eq(ready_eventually(r.st, 1), 1);
	cr_assert_eq(zinf_store_ready(r.st, 1), 1, "still ready when asked again");
	void *d = NULL;
	cr_assert_eq(zinf_store_swap_in(r.st, 1, 0), 0);
	cr_assert_eq(zinf_store_wait(r.st, 1, &d), 0);
	cr_assert_eq(zinf_store_state(r.st, 1), ZINF_TENSOR_RESIDENT);
	cr_assert_eq(memcmp(d, ref + ELEMS, ELEMS * 4), 0);
	cr_assert_eq(zinf_store_ready(r.st, 1), 1, "resident");
	cr_assert_eq(zinf_store_release(r.st, 1), 0);
	cr_assert_eq(zinf_store_get_stats(r.st, &s1), 0);
	cr_assert_eq(s1.reads, s0.reads + 1, "one read: the prefetch's");
	free(ref);
	srig_fini(&r);
}

/* A read that failed, seen complete by zinf_store_ready: the wait still reports it, naming the
 * tensor and the swap file, and the buffer goes back. */
Test(store, ready_then_failed_read_names_the_file)
{
	uint64_t seed = zt_seed();
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	so.prefetch_bytes = ELEMS * 4;
	struct srig r;
	srig_init(&r, 2, &so, true);
	add_n(&r, 1);
	float *ref = write_all(&r, 1, &seed);
	cr_assert_eq(zinf_store_flush(r.st), 0);
	struct zinf_io_fault fr = {
		.kind = ZINF_IO_FAULT_FAIL, .op = ZINF_IO_READ, .nth = 1, .err = EIO};
	cr_assert_eq(zinf_io_fault_add(r.io, &fr), 0);
	cr_assert_eq(zinf_store_prefetch(r.st, 0), 0);
	cr_assert_eq(ready_eventually(r.st, 0), 1, "a failed read is complete");
	void *d = NULL;
	cr_assert_eq(zinf_store_swap_in(r.st, 0, 0), 0);
	cr_assert_eq(zinf_store_wait(r.st, 0, &d), -EIO);
	const char *e = zinf_last_error();
	cr_assert(strstr(e, "swap-in of param16[0] failed: ") && strstr(e, r.dir) &&
			  strstr(e, ".swp"),
		  "%s", e);
	cr_assert_eq(zinf_store_state(r.st, 0), ZINF_TENSOR_ABSENT);
	cr_assert_eq(zinf_pool_free_count(r.pool), 2);
	cr_assert_eq(zinf_store_swap_in(r.st, 0, 0), 0);
	cr_assert_eq(zinf_store_wait(r.st, 0, &d), 0, "the fault was one op");
	cr_assert_eq(memcmp(d, ref, ELEMS * 4), 0);
	zinf_store_release(r.st, 0);
	free(ref);
	srig_fini(&r);
}

/*
 * A completed write leaves its clean data cached (max_in_cpu): after the flush the cache holds
 * the elements it allows, and a swap-in of a written tensor kept there reads nothing and sees
 * the written bytes.
 */
Test(store, written_data_stays_cached)
{
	uint64_t seed = zt_seed();
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	so.max_in_cpu = 2 * ELEMS;
	struct srig r;
	srig_init(&r, 4, &so, false);
	add_n(&r, 3);
	float *ref = write_all(&r, 3, &seed);
	cr_assert_eq(zinf_store_flush(r.st), 0);
	struct zinf_store_stats s0 = {.size = sizeof(s0)}, s1 = {.size = sizeof(s1)};
	cr_assert_eq(zinf_store_get_stats(r.st, &s0), 0);
	cr_assert_eq(s0.writes, 3);
	cr_assert_eq(s0.reads, 0);
	cr_assert_eq(s0.cached_elems, 2 * ELEMS, "the cache is full: 2 of the 3 written");
	int resident = 0, id = -1;
	for (int i = 0; i < 3; i++) {
		if (zinf_store_state(r.st, i) == ZINF_TENSOR_RESIDENT) {
			resident++;
			id = i;
			cr_assert_eq(zinf_store_ready(r.st, i), 1);
		}
	}
	cr_assert_eq(resident, 2);
	void *d = NULL;
	cr_assert_eq(zinf_store_swap_in(r.st, id, 0), 0);
	cr_assert_eq(zinf_store_wait(r.st, id, &d), 0);
	cr_assert_eq(memcmp(d, ref + (size_t)id * ELEMS, ELEMS * 4), 0);
	cr_assert_eq(zinf_store_release(r.st, id), 0);
	cr_assert_eq(zinf_store_get_stats(r.st, &s1), 0);
	cr_assert_eq(s1.reads, 0, "served from the cache");
	cr_assert_eq(s1.cache_hits, s0.cache_hits + 1);
	free(ref);
	srig_fini(&r);
}

/*
 * With every buffer held by the cache, a prefetch waits for a free buffer by default and evicts
 * the least recently released cached tensor with prefetch_evicts; a prefetch of a cached tensor
 * marks it recent, so the other one is evicted.
 */
Test(store, prefetch_evicts_the_cache_only_when_asked)
{
	for (uint32_t evicts = 0; evicts < 2; evicts++) {
		uint64_t seed = zt_seed();
		struct zinf_store_opts so;
		zinf_store_opts_init(&so);
		so.max_in_cpu = 10 * ELEMS;
		so.prefetch_bytes = 10 * ELEMS * 4;
		so.prefetch_evicts = evicts;
		struct srig r;
		srig_init(&r, 2, &so, false);
		add_n(&r, 3);
		float *ref = write_all(&r, 3, &seed);
		cr_assert_eq(zinf_store_flush(r.st), 0);
		void *d = NULL;
		for (int i = 0; i < 2; i++) { /* the cache: 0, then 1 (most recent) */
			cr_assert_eq(zinf_store_swap_in(r.st, i, 0), 0);
			cr_assert_eq(zinf_store_wait(r.st, i, &d), 0);
			cr_assert_eq(zinf_store_release(r.st, i), 0);
		}
		cr_assert_eq(zinf_store_state(r.st, 2), ZINF_TENSOR_ABSENT);
		cr_assert_eq(zinf_pool_free_count(r.pool), 0);
		struct zinf_store_stats s0 = {.size = sizeof(s0)}, s1 = {.size = sizeof(s1)};
		cr_assert_eq(zinf_store_get_stats(r.st, &s0), 0);
		cr_assert_eq(zinf_store_prefetch(r.st, 0), 0); /* cached: now the most recent */
		cr_assert_eq(zinf_store_prefetch(r.st, 2), 0);
		cr_assert_eq(zinf_store_get_stats(r.st, &s1), 0);
		cr_assert_eq(zinf_store_state(r.st, 0), ZINF_TENSOR_RESIDENT, "evicts %u", evicts);
		if (evicts) {
			cr_assert_neq(zinf_store_state(r.st, 2), ZINF_TENSOR_ABSENT, "started");
			cr_assert_eq(zinf_store_state(r.st, 1), ZINF_TENSOR_ABSENT,
				     "1 is the least recent");
			cr_assert_eq(s1.evictions, s0.evictions + 1);
			cr_assert_eq(s1.prefetch_started, s0.prefetch_started + 1);
		} else {
			cr_assert_eq(zinf_store_state(r.st, 2), ZINF_TENSOR_ABSENT, "queued");
			cr_assert_eq(zinf_store_state(r.st, 1), ZINF_TENSOR_RESIDENT);
			cr_assert_eq(s1.evictions, s0.evictions);
			cr_assert_eq(s1.prefetch_started, s0.prefetch_started);
		}
		cr_assert_eq(zinf_store_swap_in(r.st, 2, 0), 0);
		cr_assert_eq(zinf_store_wait(r.st, 2, &d), 0);
		cr_assert_eq(memcmp(d, ref + 2 * ELEMS, ELEMS * 4), 0);
		cr_assert_eq(zinf_store_release(r.st, 2), 0);
		free(ref);
		srig_fini(&r);
	}
}

Test(store, null_handles_are_einval_not_a_crash)
{
	zt_log_to_stderr();
	struct zinf_store_stats s = {.size = sizeof(s)};
	int rcs[] = {
		zinf_store_add(NULL, "param16", 0, 1, 2, ZINF_TIER_CPU),
		zinf_store_swap_in(NULL, 0, 0),
		zinf_store_wait(NULL, 0, NULL),
		zinf_store_mark_dirty(NULL, 0),
		zinf_store_release(NULL, 0),
		zinf_store_prefetch(NULL, 0),
		zinf_store_flush(NULL),
		zinf_store_get_stats(NULL, &s),
	};
	for (size_t k = 0; k < ZINF_ARRAY_SIZE(rcs); k++) {
		cr_assert_eq(rcs[k], -EINVAL, "function %zu", k);
	}
	cr_assert(strstr(zinf_last_error(), "zinf_store_get_stats: NULL store"), "%s",
		  zinf_last_error());
	cr_assert_eq(zinf_store_state(NULL, 0), ZINF_TENSOR_ABSENT);
	cr_assert_eq(zinf_store_bytes(NULL, 0), 0);
	cr_assert_eq(zinf_store_create(NULL, NULL), -EINVAL);
	struct zinf_store *st = (void *)0x1;
	cr_assert_eq(zinf_store_create(NULL, &st), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "needs a pool"), "%s", zinf_last_error());
	cr_assert_eq(st, (void *)0x1);
	zinf_store_destroy(NULL);
}

/*
 * The size rule: an older caller's smaller options keep the defaults of the fields it does not
 * know (timeout_ms -1: waits), a larger struct is refused; statistics are given up to the
 * caller's size and no further.
 */
Test(store, options_and_statistics_size_rule)
{
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	so.timeout_ms = 0;
	so.size = offsetof(struct zinf_store_opts, timeout_ms);
	struct srig r;
	srig_init(&r, 1, &so, false);
	cr_assert_geq(zinf_store_add(r.st, "param16", 0, ELEMS, 4, ZINF_TIER_NVME), 0);
	cr_assert_eq(zinf_swap_reserve(r.swap), 0);
	cr_assert_eq(zinf_store_swap_in(r.st, 0, ZINF_STORE_NEW), 0);
	cr_assert_eq(zinf_store_mark_dirty(r.st, 0), 0);
	cr_assert_eq(zinf_store_flush(r.st), 0);
	struct zinf_store_stats s;
	memset(&s, 0xab, sizeof(s));
	s.size = offsetof(struct zinf_store_stats, read_bytes);
	cr_assert_eq(zinf_store_get_stats(r.st, &s), 0);
	cr_assert_eq(s.writes, 1);
	cr_assert_eq(s.reads, 0);
	cr_assert_eq(s.read_bytes, 0xababababababababull, "written past the caller's size");
	s.size = sizeof(s);
	cr_assert_eq(zinf_store_get_stats(r.st, &s), 0);
	cr_assert_eq(s.write_bytes, ELEMS * 4);
	cr_assert_eq(zinf_store_release(r.st, 0), 0);
	struct {
		struct zinf_store_opts o;
		uint64_t more;
	} big = {.o = so};
	big.o.size = sizeof(big);
	struct zinf_store *st = NULL;
	cr_assert_eq(zinf_store_create(&big.o, &st), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "newer zinf"), "%s", zinf_last_error());
	srig_fini(&r);
}

/* ---- the cache region (cache_bytes) ------------------------------------------------------- */

#define SMALL 100u /* elements of a small tensor (400 bytes; a norm vector beside a matrix) */

/* Bytes of the region's extent for a tensor of `bytes`: its swap capacity, aligned. */
static uint64_t
extent(const struct srig *r, uint64_t bytes)
{
	return ZINF_ALIGN_UP(bytes, (uint64_t)zinf_swap_align(r->swap));
}

static struct zinf_store_stats
stats(const struct srig *r)
{
	struct zinf_store_stats s = {.size = sizeof(s)};
	cr_assert_eq(zinf_store_get_stats(r->st, &s), 0);
	return s;
}

/* Write tensor id (elems floats) from src through the store and wait for the write: the
 * region holds no write in flight afterwards, so the next extent's eviction is deterministic. */
static void
write_one(struct srig *r, int id, const float *src, uint64_t elems)
{
	void *d = NULL;
	cr_assert_eq(zinf_store_swap_in(r->st, id, ZINF_STORE_NEW), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_store_wait(r->st, id, &d), 0);
	memcpy(d, src, elems * 4);
	cr_assert_eq(zinf_store_mark_dirty(r->st, id), 0);
	cr_assert_eq(zinf_store_release(r->st, id), 0);
	cr_assert_eq(zinf_store_flush(r->st), 0, "%s", zinf_last_error());
}

/* Swap tensor id in, compare it with ref (elems floats), release it. */
static void
read_check(struct srig *r, int id, const float *ref, uint64_t elems)
{
	void *d = NULL;
	cr_assert_eq(zinf_store_swap_in(r->st, id, 0), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_store_wait(r->st, id, &d), 0, "%s", zinf_last_error());
	cr_assert_eq(memcmp(d, ref, elems * 4), 0, "tensor %d: not the bytes written", id);
	cr_assert_eq(zinf_store_release(r->st, id), 0);
}

/*
 * Two large tensors and four small ones (100x smaller) in a region of exactly their extents,
 * with a pool of 2 buffers: all six stay cached, each in its own bytes (a cache of pool buffers
 * would hold 2), every buffer free, and reading them all back reads nothing. The extents sum to
 * the region: cache_used_bytes is worked from the sizes.
 */
Test(store, cache_region_holds_tensors_in_their_own_bytes)
{
	uint64_t seed = zt_seed();
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	struct srig r;
	srig_swap(&r, false);
	uint64_t big = extent(&r, ELEMS * 4), small = extent(&r, SMALL * 4);
	so.cache_bytes = 2 * big + 4 * small;
	srig_store(&r, 2, &so);
	uint64_t n[6] = {ELEMS, SMALL, SMALL, ELEMS, SMALL, SMALL};
	for (int i = 0; i < 6; i++) {
		cr_assert_eq(zinf_store_add(r.st, "param16", i, n[i], 4, ZINF_TIER_NVME), i);
	}
	cr_assert_eq(zinf_swap_reserve(r.swap), 0);
	float *ref = malloc(6 * ELEMS * 4);
	zt_rand_fill(ref, 6 * ELEMS * 4, &seed);
	for (int i = 0; i < 6; i++) {
		write_one(&r, i, ref + (size_t)i * ELEMS, n[i]);
	}
	struct zinf_store_stats s0 = stats(&r);
	cr_assert_eq(s0.cache_bytes, 2 * big + 4 * small);
	cr_assert_eq(s0.cache_used_bytes, 2 * big + 4 * small, "used %llu",
		     (unsigned long long)s0.cache_used_bytes);
	cr_assert_eq(s0.cached_elems, 2 * ELEMS + 4 * SMALL);
	cr_assert_eq(s0.evictions, 0);
	cr_assert_eq(s0.writes, 6);
	cr_assert_eq(zinf_pool_free_count(r.pool), 2, "the cache holds no pool buffer");
	for (int i = 5; i >= 0; i--) {
		cr_assert_eq(zinf_store_state(r.st, i), ZINF_TENSOR_RESIDENT, "tensor %d", i);
		read_check(&r, i, ref + (size_t)i * ELEMS, n[i]);
	}
	struct zinf_store_stats s1 = stats(&r);
	cr_assert_eq(s1.reads, 0, "all six served from the region");
	cr_assert_eq(s1.cache_hits, s0.cache_hits + 6);
	cr_assert_eq(s1.cache_peak_bytes, 2 * big + 4 * small);
	free(ref);
	srig_fini(&r);
}

/*
 * A region of 3 extents, 5 equal tensors: least recently used eviction, worked by hand.
 * Writing 0..4 leaves 2, 3, 4 (0 and 1 evicted for 3 and 4); a hit on 2 makes it the most
 * recent, so reading 0 evicts 3, the least recent, and reading 1 then evicts 4. Two reads in all,
 * every byte as written.
 */
Test(store, cache_region_evicts_the_least_recently_used)
{
	uint64_t seed = zt_seed();
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	struct srig r;
	srig_swap(&r, false);
	so.cache_bytes = 3 * extent(&r, ELEMS * 4);
	srig_store(&r, 1, &so);
	add_n(&r, 5);
	float *ref = malloc(5 * ELEMS * 4);
	zt_rand_fill(ref, 5 * ELEMS * 4, &seed);
	for (int i = 0; i < 5; i++) {
		write_one(&r, i, ref + (size_t)i * ELEMS, ELEMS);
	}
	enum zinf_tensor_state A = ZINF_TENSOR_ABSENT, R = ZINF_TENSOR_RESIDENT;
	const enum zinf_tensor_state want[3][5] = {
		{A, A, R, R, R}, /* after the writes */
		{R, A, R, A, R}, /* 2 hit, then 0 read: 3 evicted */
		{R, R, R, A, A}, /* 1 read: 4 evicted */
	};
	struct zinf_store_stats s0 = stats(&r);
	cr_assert_eq(s0.evictions, 2);
	for (int round = 0; round < 3; round++) {
		if (round == 1) {
			read_check(&r, 2, ref + 2 * ELEMS, ELEMS);
			read_check(&r, 0, ref, ELEMS);
		} else if (round == 2) {
			read_check(&r, 1, ref + ELEMS, ELEMS);
		}
		for (int i = 0; i < 5; i++) {
			cr_assert_eq(zinf_store_state(r.st, i), want[round][i],
				     "round %d, tensor %d: state %d", round, i,
				     zinf_store_state(r.st, i));
		}
	}
	struct zinf_store_stats s1 = stats(&r);
	cr_assert_eq(s1.reads, 2, "0 and 1 read, 2 served from the region");
	cr_assert_eq(s1.read_bytes, 2 * ELEMS * 4);
	cr_assert_eq(s1.cache_hits, 1);
	cr_assert_eq(s1.evictions, 4);
	cr_assert_eq(s1.cache_used_bytes, 3 * extent(&r, ELEMS * 4));
	free(ref);
	srig_fini(&r);
}

/*
 * New values of a cached tensor: the swap-in serves the cached extent (no read), the write goes
 * to the file from it and the clean new data stays cached; a later swap-in sees the new bytes,
 * from the region and, once evicted, from the file: never the old ones.
 */
Test(store, cache_region_write_keeps_the_new_data_and_serves_no_stale_bytes)
{
	uint64_t seed = zt_seed();
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	struct srig r;
	srig_swap(&r, false);
	so.cache_bytes = extent(&r, ELEMS * 4);
	srig_store(&r, 1, &so);
	add_n(&r, 2);
	float *ref = malloc(3 * ELEMS * 4);
	zt_rand_fill(ref, 3 * ELEMS * 4, &seed);
	write_one(&r, 0, ref, ELEMS);
	write_one(&r, 1, ref + ELEMS, ELEMS); /* evicts 0 */
	read_check(&r, 0, ref, ELEMS);	      /* read from the file, evicts 1 */
	struct zinf_store_stats s0 = stats(&r);
	cr_assert_eq(s0.reads, 1);
	/* new values over the cached 0 (as the engine's step writes them) */
	write_one(&r, 0, ref + 2 * ELEMS, ELEMS);
	struct zinf_store_stats s1 = stats(&r);
	cr_assert_eq(s1.reads, 1, "the new values' swap-in read nothing");
	cr_assert_eq(s1.writes, s0.writes + 1, "the new values went to the file");
	cr_assert_eq(zinf_store_state(r.st, 0), ZINF_TENSOR_RESIDENT, "kept cached, clean");
	read_check(&r, 0, ref + 2 * ELEMS, ELEMS);
	cr_assert_eq(stats(&r).reads, 1, "served from the region");
	read_check(&r, 1, ref + ELEMS, ELEMS); /* evicts 0 */
	cr_assert_eq(zinf_store_state(r.st, 0), ZINF_TENSOR_ABSENT);
	read_check(&r, 0, ref + 2 * ELEMS, ELEMS);
	cr_assert_eq(stats(&r).reads, 3, "1, then 0 again, read from the files");
	free(ref);
	srig_fini(&r);
}

/*
 * No extent left: a tensor larger than the region, or one that meets a region held by a tensor
 * in use, takes a pool buffer (and returns it at release: max_in_cpu 0 keeps nothing there),
 * with its bytes intact. Released when the region has a candidate older than it, it moves there.
 */
Test(store, cache_region_full_of_tensors_in_use_falls_back_to_a_buffer)
{
	uint64_t seed = zt_seed();
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	struct srig r;
	srig_swap(&r, false);
	so.cache_bytes = extent(&r, SMALL * 4);
	srig_store(&r, 2, &so);
	cr_assert_eq(zinf_store_add(r.st, "param16", 0, SMALL, 4, ZINF_TIER_NVME), 0);
	cr_assert_eq(zinf_store_add(r.st, "param16", 1, SMALL, 4, ZINF_TIER_NVME), 1);
	cr_assert_eq(zinf_store_add(r.st, "param16", 2, ELEMS, 4, ZINF_TIER_NVME), 2);
	cr_assert_eq(zinf_swap_reserve(r.swap), 0);
	float *ref = malloc(3 * ELEMS * 4);
	zt_rand_fill(ref, 3 * ELEMS * 4, &seed);
	write_one(&r, 2, ref + 2 * ELEMS, ELEMS); /* larger than the region */
	cr_assert_eq(zinf_store_state(r.st, 2), ZINF_TENSOR_ABSENT, "not cached in a buffer");
	cr_assert_eq(stats(&r).cache_used_bytes, 0);
	write_one(&r, 0, ref, SMALL);
	write_one(&r, 1, ref + ELEMS, SMALL);
	void *d0 = NULL, *d1 = NULL;
	cr_assert_eq(zinf_store_swap_in(r.st, 1, 0), 0); /* cached: the region's only extent */
	cr_assert_eq(zinf_store_wait(r.st, 1, &d1), 0);
	cr_assert_eq(zinf_store_swap_in(r.st, 0, 0), 0); /* 1 is in use: a buffer */
	cr_assert_eq(zinf_store_wait(r.st, 0, &d0), 0);
	cr_assert_eq(zinf_pool_free_count(r.pool), 1);
	cr_assert_eq(memcmp(d0, ref, SMALL * 4), 0);
	cr_assert_eq(memcmp(d1, ref + ELEMS, SMALL * 4), 0);
	cr_assert_eq(zinf_store_release(r.st, 0), 0);
	cr_assert_eq(zinf_store_release(r.st, 1), 0);
	cr_assert_eq(zinf_pool_free_count(r.pool), 2, "the buffer is back");
	cr_assert_eq(zinf_store_state(r.st, 0), ZINF_TENSOR_ABSENT);
	cr_assert_eq(zinf_store_state(r.st, 1), ZINF_TENSOR_RESIDENT);
	/* the other order: 1 released first, then 0 from its buffer is the most recent: it moves
	   into the region (1 evicted), and its buffer goes back */
	cr_assert_eq(zinf_store_swap_in(r.st, 1, 0), 0);
	cr_assert_eq(zinf_store_wait(r.st, 1, &d1), 0);
	cr_assert_eq(zinf_store_swap_in(r.st, 0, 0), 0);
	cr_assert_eq(zinf_store_wait(r.st, 0, &d0), 0);
	cr_assert_eq(zinf_pool_free_count(r.pool), 1);
	cr_assert_eq(zinf_store_release(r.st, 1), 0);
	cr_assert_eq(zinf_store_release(r.st, 0), 0);
	cr_assert_eq(zinf_pool_free_count(r.pool), 2);
	cr_assert_eq(zinf_store_state(r.st, 0), ZINF_TENSOR_RESIDENT, "moved into the region");
	cr_assert_eq(zinf_store_state(r.st, 1), ZINF_TENSOR_ABSENT);
	uint64_t reads = stats(&r).reads;
	read_check(&r, 0, ref, SMALL);
	cr_assert_eq(stats(&r).reads, reads, "0 served from the region");
	read_check(&r, 2, ref + 2 * ELEMS, ELEMS);
	free(ref);
	srig_fini(&r);
}

/* cache_bytes without a swap space is -EINVAL; more than the pool's CPU region has is -ENOMEM
 * naming max_in_cpu and the bytes. */
Test(store, cache_region_option_errors_name_the_setting)
{
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	struct srig r;
	srig_swap(&r, false);
	srig_store(&r, 1, &so);
	struct zinf_store *st = NULL;
	so.cache_bytes = 2 << 20; /* the rig's CPU region is 1 MiB */
	cr_assert_eq(zinf_store_create(&so, &st), -ENOMEM);
	cr_assert(strstr(zinf_last_error(), "2097152 bytes (max_in_cpu)"), "%s", zinf_last_error());
	so.swap = NULL;
	cr_assert_eq(zinf_store_create(&so, &st), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "without a swap space"), "%s", zinf_last_error());
	cr_assert_null(st);
	srig_fini(&r);
}

/*
 * Writes in flight in a full region: the new values of tensor 3 take the extent of the least
 * recently released tensor, 0, whose write is waited for (not a pool buffer, not a more recent
 * tensor), whatever the disk's speed; 1, 2 and 3 stay cached with their bytes.
 */
Test(store, cache_region_waits_for_the_least_recent_write_in_flight)
{
	uint64_t seed = zt_seed();
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	struct srig r;
	srig_swap(&r, false);
	so.cache_bytes = 3 * extent(&r, ELEMS * 4);
	srig_store(&r, 1, &so);
	add_n(&r, 4);
	float *ref = malloc(4 * ELEMS * 4);
	zt_rand_fill(ref, 4 * ELEMS * 4, &seed);
	for (int i = 0; i < 4; i++) { /* no flush between: writes stay in flight */
		void *d = NULL;
		cr_assert_eq(zinf_store_swap_in(r.st, i, ZINF_STORE_NEW), 0, "%s",
			     zinf_last_error());
		cr_assert_eq(zinf_store_wait(r.st, i, &d), 0);
		cr_assert(d);
		memcpy(d, ref + (size_t)i * ELEMS, ELEMS * 4);
		cr_assert_eq(zinf_store_mark_dirty(r.st, i), 0);
		cr_assert_eq(zinf_store_release(r.st, i), 0);
		cr_assert_eq(zinf_pool_free_count(r.pool), 1, "tensor %d took a pool buffer", i);
	}
	cr_assert_eq(zinf_store_flush(r.st), 0);
	cr_assert_eq(zinf_store_state(r.st, 0), ZINF_TENSOR_ABSENT, "the least recent evicted");
	for (int i = 1; i < 4; i++) {
		cr_assert_eq(zinf_store_state(r.st, i), ZINF_TENSOR_RESIDENT, "tensor %d", i);
		read_check(&r, i, ref + (size_t)i * ELEMS, ELEMS);
	}
	read_check(&r, 0, ref, ELEMS);
	struct zinf_store_stats s = stats(&r);
	cr_assert_eq(s.writes, 4);
	cr_assert_eq(s.reads, 1, "only 0, evicted, read back");
	free(ref);
	srig_fini(&r);
}

/*
 * Variable sizes in the region: small s0, big B0, small s1, big B1 written in that order (the
 * least recent first), exactly filling it. A new big tensor takes B0's bytes alone: the run of
 * extents whose newest member is the oldest, the fewest bytes of those. Evicting the least
 * recent one by one until a hole fits would also have evicted s0 (its 4 KiB fit nothing).
 */
Test(store, cache_region_evicts_a_contiguous_run_not_every_small_tensor)
{
	uint64_t seed = zt_seed();
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	struct srig r;
	srig_swap(&r, false);
	uint64_t big = extent(&r, ELEMS * 4), small = extent(&r, SMALL * 4);
	so.cache_bytes = 2 * big + 2 * small;
	srig_store(&r, 1, &so);
	uint64_t n[5] = {SMALL, ELEMS, SMALL, ELEMS, ELEMS}; /* s0 B0 s1 B1, then B2 */
	for (int i = 0; i < 5; i++) {
		cr_assert_eq(zinf_store_add(r.st, "param16", i, n[i], 4, ZINF_TIER_NVME), i);
	}
	cr_assert_eq(zinf_swap_reserve(r.swap), 0);
	float *ref = malloc(5 * ELEMS * 4);
	zt_rand_fill(ref, 5 * ELEMS * 4, &seed);
	for (int i = 0; i < 5; i++) {
		write_one(&r, i, ref + (size_t)i * ELEMS, n[i]);
	}
	enum zinf_tensor_state A = ZINF_TENSOR_ABSENT, R = ZINF_TENSOR_RESIDENT;
	const enum zinf_tensor_state want[5] = {R, A, R, R, R};
	for (int i = 0; i < 5; i++) {
		cr_assert_eq(zinf_store_state(r.st, i), want[i], "tensor %d", i);
	}
	struct zinf_store_stats s = stats(&r);
	cr_assert_eq(s.evictions, 1, "B0 alone");
	cr_assert_eq(s.cache_used_bytes, 2 * big + 2 * small);
	for (int i = 0; i < 5; i++) {
		read_check(&r, i, ref + (size_t)i * ELEMS, n[i]);
	}
	free(ref);
	srig_fini(&r);
}

/*
 * A writer that fails between the pieces of a tensor (the engine's eng_param_write_abort) drops
 * it: the partly overwritten bytes leave the store, in the region or in a pool buffer, and the
 * next swap-in reads what the file holds. Released instead, clean, they were cached and served
 * as the tensor's value, differing from the file's.
 */
Test(store, dropped_tensor_serves_the_files_bytes)
{
	uint64_t seed = zt_seed();
	for (int in_region = 0; in_region < 2; in_region++) {
		struct zinf_store_opts so;
		zinf_store_opts_init(&so);
		struct srig r;
		srig_swap(&r, false);
		so.cache_bytes = in_region ? extent(&r, ELEMS * 4) : 0;
		so.max_in_cpu = in_region ? 0 : ELEMS; /* else cached in its pool buffer */
		srig_store(&r, 2, &so);
		add_n(&r, 1);
		float *ref = malloc(2 * ELEMS * 4);
		zt_rand_fill(ref, 2 * ELEMS * 4, &seed);
		write_one(&r, 0, ref, ELEMS);
		void *d = NULL;
		cr_assert_eq(zinf_store_swap_in(r.st, 0, ZINF_STORE_NEW), 0);
		cr_assert_eq(zinf_store_wait(r.st, 0, &d), 0);
		memcpy(d, ref + ELEMS, ELEMS / 2 * 4); /* half of the new values, then a failure */
		cr_assert_eq(zinf_store_drop(r.st, 0), 0, "%s", zinf_last_error());
		cr_assert_eq(zinf_store_state(r.st, 0), ZINF_TENSOR_ABSENT, "in_region %d",
			     in_region);
		read_check(&r, 0, ref, ELEMS);
		cr_assert_eq(zinf_store_drop(r.st, 7), -EINVAL, "an unknown id");
		free(ref);
		srig_fini(&r);
	}
}
