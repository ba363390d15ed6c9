/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/comm/test_comm_ranks.c: the collective contract over several ranks, a plain program
 * that ctest runs under mpirun (1 to 4 ranks; Criterion forks every test, which MPI does not
 * survive). Every rank runs every case in the same order; each case returns its failures,
 * printed with rank and line. Rank 0 prints "N passed, M failed" (totals over ranks); the exit
 * status is 1 when any rank failed a case or the arguments are unknown, 77 when every case
 * skipped.
 *
 * Usage: test_comm_ranks BACKEND [--lib-init | --multiple]. BACKEND is "mpi" (host buffers)
 * or "nccl" (CUDA managed memory, which the host reads once a request completed). With
 * --lib-init the program leaves MPI to zinf (MPI_Init_thread(MULTIPLE) in zinf_comm_create,
 * MPI_Finalize in destroy) and runs the basic cases only; otherwise it initialises MPI itself,
 * which lets it go on after the cases that fail a communicator on purpose (a skipped call, a
 * mismatched call): with MPI_THREAD_MULTIPLE given --multiple (the mpi backend then runs its
 * collectives on a progress thread), else MPI_THREAD_SERIALIZED (non-blocking MPI calls).
 */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/dtype.h"
#include "common/quant.h"
#include "common/test_util.h"
#include "comm/comm_internal.h"
#include "engine/rank_check.h"
#include "zinf/blocks/comm.h"
#include "zinf_config.h"
#if ZINF_HAVE_NCCL
#include <cuda_runtime.h>
#endif

static const char *backend;
static int rank, world;
static bool want_thread; /* mpi: the progress thread is expected (MULTIPLE provided) */
static uint64_t seed;

static void *kept[16]; /* buffers of abandoned calls: reachable, not leaked */
static int nkept;

/* Buffers the backend can use: host memory for mpi, managed memory for nccl. */
static void *
buf_alloc(size_t bytes)
{
#if ZINF_HAVE_NCCL
	if (strcmp(backend, "nccl") == 0) {
		void *p = NULL;
		return cudaMallocManaged(&p, bytes ? bytes : 1, cudaMemAttachGlobal) == cudaSuccess
			       ? p
			       : NULL;
	}
#endif
	return calloc(1, bytes ? bytes : 1);
}

static void
buf_free(void *p)
{
#if ZINF_HAVE_NCCL
	if (strcmp(backend, "nccl") == 0) {
		cudaFree(p);
		return;
	}
#endif
	free(p);
}

static struct zinf_comm *
open_comm(double timeout_s, bool check)
{
	struct zinf_comm_opts o;
	struct zinf_comm *c = NULL;
	zinf_comm_opts_init(&o);
	o.backend = backend;
	o.timeout_s = timeout_s;
	o.check = check;
	int rc = zinf_comm_create(&o, &c);
	if (rc < 0) {
		fprintf(stderr, "rank %d: zinf_comm_create(%s): %s\n", rank, backend,
			zinf_last_error());
		return NULL;
	}
	return c;
}

/* Rank r's value of element i of a test tensor, exactly representable in every dtype. */
static float
value(uint64_t salt, int r, size_t i)
{
	uint64_t s = seed ^ (salt * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)r << 40) ^ i;
	zt_rand(&s);
	double v = zt_uniform(&s, -4.0, 4.0);
	return dt_f16_to_f32(dt_f32_to_f16_rne(dt_bf16_to_f32(dt_f32_to_bf16_rne(v))));
}

static float
load(const void *p, enum zinf_dtype t, size_t i)
{
	const uint16_t *h = p;
	return t == ZINF_F32	? ((const float *)p)[i]
	       : t == ZINF_BF16 ? dt_bf16_to_f32(h[i])
				: dt_f16_to_f32(h[i]);
}

static void
store(void *p, enum zinf_dtype t, size_t i, float v)
{
	if (t == ZINF_F32) {
		((float *)p)[i] = v;
	} else {
		((uint16_t *)p)[i] = t == ZINF_BF16 ? dt_f32_to_bf16_rne(v) : dt_f32_to_f16_rne(v);
	}
}

/* ---- cases -------------------------------------------------------------------------------- */

/* Uneven tensors: every rank's partition, padded, gathered; the padding never shows. */
static int
case_all_gather_uneven(void)
{
	static const size_t sizes[] = {1, 7, 1000, 1001, 4099};
	static const enum zinf_dtype types[] = {ZINF_F32, ZINF_BF16};
	struct zinf_comm *c = open_comm(60, true);
	int fails = 0;
	if (!c) {
		return 1;
	}
	for (size_t k = 0; k < 5; k++) {
		for (int tt = 0; tt < 2; tt++) {
			enum zinf_dtype t = types[tt];
			size_t es = zinf_dtype_size(t), numel = sizes[k] + (size_t)world;
			struct zinf_comm_part p;
			CHECK(zinf_comm_partition(numel, world, rank, &p) == 0, "partition");
			char *full = buf_alloc(p.padded * es), *part = buf_alloc(p.part * es);
			for (size_t i = 0; i < p.count; i++) {
				store(part, t, i, value(k, 0, p.offset + i));
			}
			/* in place on odd sizes: the partition sits in the full buffer already */
			bool inplace = k % 2;
			char *send = inplace ? full + p.offset * es : part;
			if (inplace) {
				memcpy(send, part, p.part * es);
			}
			int rc = zinf_comm_all_gather(c, send, full, p.part, t, NULL);
			CHECK(rc == 0, "all_gather %zu: %s", numel, zinf_last_error());
			for (size_t i = 0; i < numel && rc == 0; i++) {
				if (load(full, t, i) != value(k, 0, i)) {
					CHECK(0, "%s numel %zu element %zu: %g, expected %g",
					      zinf_dtype_name(t), numel, i, load(full, t, i),
					      value(k, 0, i));
					break;
				}
			}
			buf_free(full);
			buf_free(part);
		}
	}
	zinf_comm_destroy(c);
	return fails;
}

/*
 * Tolerance of a reduction of `world` terms against the float64 reference: fp32 accumulation
 * (at most world - 1 roundings of 2^-24 relative to sum |x|), then one rounding to the
 * output type (half an ulp of the result: 2^-8 relative for bf16, 2^-11 for f16, 2^-24 for
 * f32). Accumulating in a 16-bit type would round at every step and exceed it.
 */
static double
tolerance(enum zinf_dtype t, double ref, double abs_sum)
{
	double half_ulp = t == ZINF_BF16 ? 0x1p-8 : t == ZINF_F16 ? 0x1p-11 : 0x1p-24;
	double tiny = t == ZINF_F16 ? 0x1p-25 : 0x1p-126; /* subnormal spacing / 2 */
	return half_ulp * fabs(ref) * (1 + 0x1p-20) + world * 0x1p-24 * abs_sum + tiny;
}

/* Reduce-scatter SUM and AVG of f32, bf16 and f16 against a float64 reference. */
static int
case_reduce_scatter(void)
{
	static const enum zinf_dtype types[] = {ZINF_F32, ZINF_BF16, ZINF_F16};
	struct zinf_comm *c = open_comm(60, true);
	const size_t count = 513;
	int fails = 0;
	if (!c) {
		return 1;
	}
	for (int tt = 0; tt < 3; tt++) {
		for (int red = ZINF_COMM_SUM; red <= ZINF_COMM_AVG; red++) {
			enum zinf_dtype t = types[tt];
			size_t es = zinf_dtype_size(t);
			char *send = buf_alloc(count * world * es), *recv = buf_alloc(count * es);
			for (size_t i = 0; i < count * world; i++) {
				store(send, t, i, value(100 + tt, rank, i));
			}
			int rc = zinf_comm_reduce_scatter(c, send, recv, count, t, red, NULL);
			CHECK(rc == 0, "reduce_scatter: %s", zinf_last_error());
			for (size_t i = 0; i < count && rc == 0; i++) {
				size_t g = (size_t)rank * count + i;
				double ref = 0, abs_sum = 0;
				for (int r = 0; r < world; r++) {
					ref += value(100 + tt, r, g);
					abs_sum += fabs(value(100 + tt, r, g));
				}
				if (red == ZINF_COMM_AVG) {
					ref /= world;
					abs_sum /= world;
				}
				double got = load(recv, t, i);
				if (fabs(got - ref) > tolerance(t, ref, abs_sum)) {
					CHECK(0,
					      "%s %s element %zu: %.9g, reference %.9g (tol %.3g)",
					      zinf_dtype_name(t), red ? "avg" : "sum", i, got, ref,
					      tolerance(t, ref, abs_sum));
					break;
				}
			}
			buf_free(send);
			buf_free(recv);
		}
	}
	zinf_comm_destroy(c);
	return fails;
}

/* All-reduce SUM (a squared-norm partial) and MAX (the fp16 overflow flag). */
static int
case_all_reduce(void)
{
	struct zinf_comm *c = open_comm(60, true);
	int fails = 0;
	if (!c) {
		return 1;
	}
	/* ctest runs every rank on this one machine: local rank = rank */
	CHECK(zinf_comm_rank(c) == rank && zinf_comm_world(c) == world, "rank/world");
	CHECK(zinf_comm_local_rank(c) == rank, "local rank %d", zinf_comm_local_rank(c));
	float *v = buf_alloc(3 * sizeof(float));
	v[0] = (float)(rank + 1) * 0.5f;	/* sum: world (world + 1) / 4 */
	v[1] = rank == world - 1 ? 1.0f : 0.0f; /* only the last rank overflowed */
	v[2] = -(float)rank;			/* sum: -world (world - 1) / 2 */
	CHECK(zinf_comm_all_reduce(c, v, 3, ZINF_F32, ZINF_COMM_SUM, NULL) == 0, "%s",
	      zinf_last_error());
	CHECK(v[0] == world * (world + 1) / 4.0f, "sum %g", v[0]);
	CHECK(v[2] == -world * (world - 1) / 2.0f, "sum %g", v[2]);
	v[0] = (float)rank;
	v[1] = rank == world - 1 ? 1.0f : 0.0f;
	v[2] = -(float)rank - 0.25f;
	CHECK(zinf_comm_all_reduce(c, v, 3, ZINF_F32, ZINF_COMM_MAX, NULL) == 0, "%s",
	      zinf_last_error());
	CHECK(v[0] == world - 1, "max %g", v[0]);
	CHECK(v[1] == 1.0f, "overflow flag %g", v[1]);
	CHECK(v[2] == -0.25f, "max %g", v[2]);
	uint16_t *h = buf_alloc(2 * sizeof(uint16_t));
	h[0] = dt_f32_to_bf16_rne(1.0f + (float)rank);
	h[1] = dt_f32_to_bf16_rne(-1.0f - (float)rank);
	CHECK(zinf_comm_all_reduce(c, h, 2, ZINF_BF16, ZINF_COMM_MAX, NULL) == 0, "%s",
	      zinf_last_error());
	CHECK(dt_bf16_to_f32(h[0]) == world, "bf16 max %g", dt_bf16_to_f32(h[0]));
	CHECK(dt_bf16_to_f32(h[1]) == -1.0f, "bf16 max %g", dt_bf16_to_f32(h[1]));
	buf_free(v);
	buf_free(h);
	zinf_comm_destroy(c);
	return fails;
}

static int
case_broadcast_barrier(void)
{
	struct zinf_comm *c = open_comm(60, true);
	const size_t n = 777;
	int fails = 0, root = world - 1;
	if (!c) {
		return 1;
	}
	float *b = buf_alloc(n * sizeof(float));
	for (size_t i = 0; i < n; i++) {
		b[i] = rank == root ? value(7, root, i) : -1.0f;
	}
	CHECK(zinf_comm_broadcast(c, b, n, ZINF_F32, root, NULL) == 0, "%s", zinf_last_error());
	for (size_t i = 0; i < n; i++) {
		if (b[i] != value(7, root, i)) {
			CHECK(0, "element %zu: %g, root's %g", i, b[i], value(7, root, i));
			break;
		}
	}
	CHECK(zinf_comm_barrier(c, NULL) == 0, "%s", zinf_last_error());
	CHECK(zinf_comm_broadcast(c, b, n, ZINF_F32, world, NULL) == -EINVAL, "root = world");
	buf_free(b);
	zinf_comm_destroy(c);
	return fails;
}

/* Two collectives in flight, completed in the reverse order; then statistics. */
static int
case_two_in_flight(void)
{
	struct zinf_comm *c = open_comm(60, false);
	const size_t n = 4096;
	struct zinf_comm_req *ra = NULL, *rb = NULL;
	int fails = 0;
	if (!c) {
		return 1;
	}
	float *part = buf_alloc(n * sizeof(float)), *full = buf_alloc(n * world * sizeof(float));
	float *s = buf_alloc(sizeof(float));
	for (size_t i = 0; i < n; i++) {
		part[i] = (float)(rank * n + i);
	}
	*s = 1.0f;
	CHECK(zinf_comm_all_gather(c, part, full, n, ZINF_F32, &ra) == 0, "%s", zinf_last_error());
	CHECK(zinf_comm_all_reduce(c, s, 1, ZINF_F32, ZINF_COMM_SUM, &rb) == 0, "%s",
	      zinf_last_error());
	int rc;
	while ((rc = zinf_comm_test(c, rb)) == 0) {
	}
	CHECK(rc == 1, "test: %d", rc);
	CHECK(zinf_comm_wait(c, ra) == 0, "%s", zinf_last_error());
	CHECK(*s == world, "sum %g", *s);
	for (size_t i = 0; i < n * world; i++) {
		if (full[i] != (float)i) {
			CHECK(0, "element %zu: %g", i, full[i]);
			break;
		}
	}
	struct zinf_comm_stats st = {.size = sizeof(st)};
	CHECK(zinf_comm_get_stats(c, &st) == 0, "stats");
	CHECK(st.calls == 2, "calls %llu", (unsigned long long)st.calls);
	CHECK(st.bytes == n * world * 4 + 4, "bytes %llu", (unsigned long long)st.bytes);
	CHECK(st.timeouts == 0, "timeouts");
	CHECK(st.wait_ns > 0, "time in wait");
	/* the native communicator, for benchmarks timing the raw call on the same buffers */
	if (strcmp(backend, "mpi") == 0) {
		MPI_Comm *mc = zinf_comm_native(c);
		int n = 0;
		CHECK(mc && MPI_Comm_size(*mc, &n) == MPI_SUCCESS && n == world, "native: %d", n);
	} else {
		CHECK(zinf_comm_native(c) != NULL, "native");
	}
	buf_free(part);
	buf_free(full);
	buf_free(s);
	zinf_comm_destroy(c); /* nothing in flight */
	return fails;
}

/* The mpi backend runs on a progress thread exactly when MPI provides MPI_THREAD_MULTIPLE. */
static int
case_path(void)
{
	if (strcmp(backend, "mpi") != 0) {
		return SKIP;
	}
	struct zinf_comm *c = open_comm(60, false);
	int fails = 0;
	if (!c) {
		return 1;
	}
	CHECK(comm_mpi_progress(c) == want_thread, "progress thread %d, expected %d",
	      comm_mpi_progress(c), want_thread);
	zinf_comm_destroy(c);
	return fails;
}

/*
 * Six collectives in flight at once (the progress thread's queue holds them in call order),
 * two of them 16-bit reductions that need their own fp32 scratch at the same time, completed in
 * reverse order; three rounds with growing counts, so that the cached scratch is reused and
 * grown. Every result against its exact value or a float64 reference.
 */
static int
case_many_in_flight(void)
{
	struct zinf_comm *c = open_comm(60, true);
	int fails = 0;
	if (!c) {
		return 1;
	}
	for (int round = 0; round < 3; round++) {
		size_t n = (size_t)1000 << (2 * round) | (size_t)round; /* 1000, 4001, 16002 */
		struct zinf_comm_req *q[6] = {NULL};
		uint16_t *ar = buf_alloc(n * 2), *rs_send = buf_alloc(n * world * 2),
			 *rs = buf_alloc(n * 2);
		float *part = buf_alloc(n * 4), *full = buf_alloc(n * world * 4),
		      *bc = buf_alloc(n * 4);
		for (size_t i = 0; i < n; i++) {
			ar[i] = dt_f32_to_bf16_rne(value(200 + round, rank, i));
			part[i] = value(300 + round, rank, i);
			bc[i] = rank == 0 ? value(400 + round, 0, i) : 0.0f;
		}
		for (size_t i = 0; i < n * world; i++) {
			rs_send[i] = dt_f32_to_f16_rne(value(500 + round, rank, i));
		}
		CHECK(zinf_comm_all_reduce(c, ar, n, ZINF_BF16, ZINF_COMM_AVG, &q[0]) == 0, "%s",
		      zinf_last_error());
		CHECK(zinf_comm_reduce_scatter(c, rs_send, rs, n, ZINF_F16, ZINF_COMM_SUM, &q[1]) ==
			      0,
		      "%s", zinf_last_error());
		CHECK(zinf_comm_all_gather(c, part, full, n, ZINF_F32, &q[2]) == 0, "%s",
		      zinf_last_error());
		CHECK(zinf_comm_broadcast(c, bc, n, ZINF_F32, 0, &q[3]) == 0, "%s",
		      zinf_last_error());
		CHECK(zinf_comm_barrier(c, &q[4]) == 0, "%s", zinf_last_error());
		float *mx = buf_alloc(sizeof(float));
		*mx = (float)rank;
		CHECK(zinf_comm_all_reduce(c, mx, 1, ZINF_F32, ZINF_COMM_MAX, &q[5]) == 0, "%s",
		      zinf_last_error());
		for (int k = 5; k >= 0; k--) {
			int rc = 0;
			if (!q[k]) {
				continue;
			}
			if (k % 2) {
				while ((rc = zinf_comm_test(c, q[k])) == 0) {
				}
				rc = rc == 1 ? 0 : rc;
			} else {
				rc = zinf_comm_wait(c, q[k]);
			}
			CHECK(rc == 0, "request %d: %s", k, zinf_last_error());
		}
		CHECK(*mx == world - 1, "max %g", *mx);
		for (size_t i = 0; i < n; i++) {
			double ref = 0, abs_sum = 0;
			for (int r = 0; r < world; r++) {
				ref += dt_bf16_to_f32(dt_f32_to_bf16_rne(value(200 + round, r, i)));
			}
			ref /= world;
			for (int r = 0; r < world; r++) {
				abs_sum += fabs(value(200 + round, r, i)) / world;
			}
			double got = dt_bf16_to_f32(ar[i]);
			if (fabs(got - ref) > tolerance(ZINF_BF16, ref, abs_sum)) {
				CHECK(0, "round %d bf16 avg element %zu: %.9g, reference %.9g",
				      round, i, got, ref);
				break;
			}
		}
		for (size_t i = 0; i < n; i++) {
			size_t g = (size_t)rank * n + i;
			double ref = 0, abs_sum = 0;
			for (int r = 0; r < world; r++) {
				ref += value(500 + round, r, g);
				abs_sum += fabs(value(500 + round, r, g));
			}
			double got = dt_f16_to_f32(rs[i]);
			if (fabs(got - ref) > tolerance(ZINF_F16, ref, abs_sum)) {
				CHECK(0, "round %d f16 sum element %zu: %.9g, reference %.9g",
				      round, i, got, ref);
				break;
			}
		}
		for (size_t i = 0; i < n * world; i++) {
			if (full[i] != value(300 + round, (int)(i / n), i % n)) {
				CHECK(0, "round %d all_gather element %zu: %g", round, i, full[i]);
				break;
			}
		}
		for (size_t i = 0; i < n; i++) {
			if (bc[i] != value(400 + round, 0, i)) {
				CHECK(0, "round %d broadcast element %zu: %g", round, i, bc[i]);
				break;
			}
		}
		buf_free(ar);
		buf_free(rs_send);
		buf_free(rs);
		buf_free(part);
		buf_free(full);
		buf_free(bc);
		buf_free(mx);
	}
	zinf_comm_destroy(c);
	return fails;
}

/*
 * The last rank skips the third collective: the others return -ETIMEDOUT within the 2 s
 * deadline (not before it), naming the call and its sequence number, and refuse every later
 * call. With the check on, the check's own exchange times out the same way.
 */
static int
skip_one(bool check)
{
	struct zinf_comm *c = open_comm(2.0, check);
	float *v = buf_alloc(64 * sizeof(float));
	int fails = 0;
	if (!c || !v) {
		return 1;
	}
	CHECK(zinf_comm_all_reduce(c, v, 64, ZINF_F32, ZINF_COMM_SUM, NULL) == 0, "first");
	CHECK(zinf_comm_barrier(c, NULL) == 0, "second");
	if (rank != world - 1) {
		double t0 = zinf_now_s();
		int rc = zinf_comm_all_reduce(c, v, 64, ZINF_F32, ZINF_COMM_SUM, NULL);
		double dt = zinf_now_s() - t0;
		const char *msg = zinf_last_error();
		CHECK(rc == -ETIMEDOUT, "rc %d", rc);
		CHECK(dt >= 1.9 && dt < 10.0, "returned after %.2f s", dt);
		CHECK(strstr(msg, "seq 3 all_reduce 64 f32") != NULL, "message: %s", msg);
		CHECK(check || strstr(msg, "(256 bytes)") != NULL, "message: %s", msg);
		CHECK(zinf_comm_failed(c) == -ETIMEDOUT, "failed %d", zinf_comm_failed(c));
		CHECK(zinf_comm_barrier(c, NULL) == -ETIMEDOUT, "later call");
		CHECK(strstr(zinf_last_error(), "failed earlier") != NULL, "%s", zinf_last_error());
		struct zinf_comm_stats st = {.size = sizeof(st)};
		zinf_comm_get_stats(c, &st);
		CHECK(st.timeouts == 1, "timeouts %llu", (unsigned long long)st.timeouts);
	}
	/*
	 * Destroy must return: the failed communicator skips what could wait. On the progress
	 * thread the other ranks' thread is inside MPI_Allreduce for good: left, not joined.
	 * Then the late rank makes the call they wait for (before its own destroy frees the
	 * thread's communicator), so that their threads return and free what they hold instead
	 * of spinning through the remaining cases.
	 */
	bool late = comm_mpi_progress(c) && !check;
	if (rank != world - 1) {
		zinf_comm_destroy(c);
	}
	/* the others returned from destroy: the late rank, alive all along, never left (leaving
	   would have told them at once: case leave) */
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == world - 1) {
		if (late) {
			CHECK(zinf_comm_all_reduce(c, v, 64, ZINF_F32, ZINF_COMM_SUM, NULL) == 0,
			      "the late call: %s", zinf_last_error());
		}
		zinf_comm_destroy(c);
	}
	if (nkept < 16) {
		kept[nkept++] = v; /* a timed-out MPI request may still write it */
	}
	return fails;
}

/*
 * The last rank leaves (zinf_comm_destroy) after two collectives while the others call a third:
 * they fail at once (not after the 20 s deadline) with -ECONNABORTED naming the rank that left
 * and when, and refuse later calls; ranks that end together see nothing (every case's destroy).
 * The third is an all-gather, a non-blocking MPI call: on the progress thread (=all) it would
 * stay inside MPI for good, as any blocking call a rank that left never joins (the process
 * must then exit without MPI_Finalize, which this runner's later cases need).
 */
static int
case_leave(void)
{
	const char *pt = getenv("ZINF_COMM_MPI_PROGRESS");
	if (world < 2 || (pt && !strcmp(pt, "all"))) {
		return SKIP;
	}
	int fails = 0;
	struct zinf_comm *c = open_comm(20.0, false);
	float *v = buf_alloc(64 * ((size_t)world + 1) * sizeof(float));
	if (!c || !v) {
		return 1;
	}
	CHECK(zinf_comm_all_reduce(c, v, 64, ZINF_F32, ZINF_COMM_SUM, NULL) == 0, "first");
	CHECK(zinf_comm_barrier(c, NULL) == 0, "second");
	if (rank == world - 1) {
		zinf_comm_destroy(c);
	} else {
		double t0 = zinf_now_s();
		int rc = zinf_comm_all_gather(c, v, v + 64, 64, ZINF_F32, NULL);
		double dt = zinf_now_s() - t0;
		char want[96];
		snprintf(want, sizeof(want), "rank %d left: zinf_comm_destroy after 2 collectives",
			 world - 1);
		CHECK(rc == -ECONNABORTED, "rc %d (%s)", rc, zinf_last_error());
		CHECK(dt < 5.0, "returned after %.2f s: the deadline, not the notice", dt);
		CHECK(strstr(zinf_last_error(), want) != NULL, "message: %s", zinf_last_error());
		CHECK(zinf_comm_barrier(c, NULL) == -ECONNABORTED, "a later call");
		zinf_comm_destroy(c);
	}
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == world - 1) {
		buf_free(v); /* its communicator was destroyed healthy: nothing of MPI's uses it */
	} else if (nkept < 16) {
		kept[nkept++] = v; /* the others' refused all-gather was posted: MPI may hold it */
	}
	return fails;
}

/* The last rank asks for the call check, the others not: create fails on every rank, naming
 * it (they would post different first collectives: the check's exchange against the data). */
static int
case_check_differs(void)
{
	if (world < 2) {
		return SKIP;
	}
	int fails = 0;
	struct zinf_comm_opts o;
	struct zinf_comm *c = NULL;
	zinf_comm_opts_init(&o);
	o.backend = backend;
	o.timeout_s = 20;
	o.check = rank == world - 1;
	int rc = zinf_comm_create(&o, &c);
	CHECK(rc == -EINVAL && c == NULL, "create: %d", rc);
	CHECK(strstr(zinf_last_error(), o.check ? "comm_check (zinf_comm_opts.check) is on here"
						: "comm_check (zinf_comm_opts.check) is off here"),
	      "%s", zinf_last_error());
	zinf_comm_destroy(c);
	return fails;
}

static int
case_skip_unchecked(void)
{
	return world < 2 ? SKIP : skip_one(false);
}

static int
case_skip_checked(void)
{
	return world < 2 ? SKIP : skip_one(true);
}

/*
 * The last rank fails outside a collective and says so (zinf_comm_notify_failure) while the
 * others wait in an all-reduce that it never joins, under a 600 s deadline: the others return
 * -ECONNABORTED (not -ETIMEDOUT: without the notice they would wait past ctest's limit) with a
 * message naming the rank and its reason, and refuse later calls. With the check on they wait
 * in the check's exchange instead. The notifier's communicator is failed with its own error; a
 * second notice is a no-op.
 */
static int
notice_one(bool check)
{
	struct zinf_comm *c = open_comm(600, check);
	float *v = buf_alloc(64 * sizeof(float));
	int fails = 0, rc;
	char who[64];
	if (!c || !v) {
		return 1;
	}
	snprintf(who, sizeof(who), "rank %d failed (Input/output error): ", world - 1);
	CHECK(zinf_comm_all_reduce(c, v, 64, ZINF_F32, ZINF_COMM_SUM, NULL) == 0, "first: %s",
	      zinf_last_error());
	if (rank == world - 1) {
		struct timespec ts = {0, 100000000L}; /* most likely, the others wait by now */
		nanosleep(&ts, NULL);
		rc = zinf_comm_notify_failure(c, -EIO, "test: reading /dev/fire: on fire");
		CHECK(rc == 0, "notify: %d %s", rc, zinf_last_error());
		CHECK(zinf_comm_failed(c) == -EIO, "notifier's failed %d", zinf_comm_failed(c));
		CHECK(zinf_comm_notify_failure(c, -EIO, "again") == 0, "a second notice");
		rc = zinf_comm_barrier(c, NULL);
		CHECK(rc == -EIO, "notifier's later call: %d", rc);
		CHECK(strstr(zinf_last_error(), "this rank failed") != NULL, "%s",
		      zinf_last_error());
	} else {
		rc = zinf_comm_all_reduce(c, v, 64, ZINF_F32, ZINF_COMM_SUM, NULL);
		const char *msg = zinf_last_error();
		CHECK(rc == -ECONNABORTED, "rc %d (%s)", rc, msg);
		CHECK(strstr(msg, who) != NULL && strstr(msg, "/dev/fire: on fire") != NULL,
		      "the message names neither %s nor the reason: %s", who, msg);
		CHECK(zinf_comm_failed(c) == -ECONNABORTED, "failed %d", zinf_comm_failed(c));
		CHECK(zinf_comm_barrier(c, NULL) == -ECONNABORTED, "later call");
		CHECK(strstr(zinf_last_error(), who) != NULL, "later: %s", zinf_last_error());
		/* a failed communicator sends no notice of its own (every rank heard the first) */
		CHECK(zinf_comm_notify_failure(c, -ECONNABORTED, "relay") == 0, "relay");
	}
	/*
	 * As in skip_one: on the progress thread the others' thread stays inside MPI_Allreduce;
	 * once they destroyed theirs, the notifier makes that call (its failure cleared through
	 * the internal header), so that their threads return before MPI_Finalize.
	 */
	bool late = comm_mpi_progress(c) && !check;
	if (rank != world - 1) {
		zinf_comm_destroy(c);
	}
	if (late) {
		MPI_Barrier(MPI_COMM_WORLD);
	}
	if (rank == world - 1) {
		if (late) {
			c->failed = 0;
			CHECK(zinf_comm_all_reduce(c, v, 64, ZINF_F32, ZINF_COMM_SUM, NULL) == 0,
			      "the late call: %s", zinf_last_error());
		}
		zinf_comm_destroy(c);
	}
	if (nkept < 16) {
		kept[nkept++] = v; /* an abandoned MPI request may still write it */
	}
	return fails;
}

static int
case_notice(void)
{
	return world < 2 ? SKIP : notice_one(false);
}

static int
case_notice_checked(void)
{
	return world < 2 ? SKIP : notice_one(true);
}

/*
 * A notice nobody took (all: every rank notifies at once): the last rank notifies after its last
 * collective, before the others destroy their communicator (late false: the notice reaches them,
 * untaken) or after (late true: it reaches a communicator that is gone, as do the others'
 * notices of leaving). Every rank then creates a new communicator: its collectives (three, so
 * that an upto of 1 does not cover them) complete, no rank fails by a notice of the
 * communicator before.
 */
static int
stale_one(bool late, bool all)
{
	struct zinf_comm *c = open_comm(600, false);
	float v[16];
	int fails = 0, rc;
	if (!c) {
		return 1;
	}
	for (int i = 0; i < 16; i++) {
		v[i] = 1.0f;
	}
	CHECK(zinf_comm_all_reduce(c, v, 16, ZINF_F32, ZINF_COMM_SUM, NULL) == 0, "first: %s",
	      zinf_last_error());
	if (late && rank != world - 1) {
		zinf_comm_destroy(c);
		c = NULL;
	}
	MPI_Barrier(MPI_COMM_WORLD);
	if (rank == world - 1 || all) {
		rc = zinf_comm_notify_failure(c, -EIO, "test: a stale notice");
		CHECK(rc == 0, "notify: %d %s", rc, zinf_last_error());
	}
	if (all) { /* each failed with its own error, whatever the others' notices say */
		MPI_Barrier(MPI_COMM_WORLD);
		rc = zinf_comm_barrier(c, NULL);
		CHECK(rc == -EIO && strstr(zinf_last_error(), "this rank failed"),
		      "a call after every rank notified: %d %s", rc, zinf_last_error());
	}
	MPI_Barrier(MPI_COMM_WORLD);
	zinf_comm_destroy(c);
	MPI_Barrier(MPI_COMM_WORLD);
	c = open_comm(10, true); /* the check's exchange: a rank failed alone waits 10 s */
	if (!c) {
		return fails + 1;
	}
	for (int k = 0; k < 3; k++) {
		for (int i = 0; i < 16; i++) {
			v[i] = 1.0f;
		}
		rc = zinf_comm_all_reduce(c, v, 16, ZINF_F32, ZINF_COMM_SUM, NULL);
		CHECK(rc == 0 && v[0] == (float)world,
		      "new communicator, call %d: rc %d, %g (expected %d): %s", k + 1, rc,
		      (double)v[0], world, zinf_last_error());
		if (rc) {
			break;
		}
	}
	bool ok = zinf_comm_failed(c) == 0;
	int bad = 0, any = !ok;
	MPI_Allreduce(&any, &bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
	if (bad) {
		return fails +
		       1; /* a failed communicator on some rank: leave it, as after a skip */
	}
	zinf_comm_destroy(c);
	return fails;
}

static int
case_notice_stale(void)
{
	return world < 2 ? SKIP : stale_one(false, false);
}

static int
case_notice_stale_late(void)
{
	return world < 2 ? SKIP : stale_one(true, false);
}

/* Every rank notifies at once: each keeps its own error; the next communicator works. */
static int
case_notice_all(void)
{
	return world < 2 ? SKIP : stale_one(false, true);
}

/* One rank passes a different count with the check on: -EPROTO on every rank, both named. */
static int
case_mismatch(void)
{
	if (world < 2) {
		return SKIP;
	}
	struct zinf_comm *c = open_comm(30, true);
	const size_t n = 1000;
	int fails = 0;
	if (!c) {
		return 1;
	}
	float *part = buf_alloc(n * sizeof(float)), *full = buf_alloc(n * world * sizeof(float));
	CHECK(zinf_comm_barrier(c, NULL) == 0, "first");
	double t0 = zinf_now_s();
	int rc = zinf_comm_all_gather(c, part, full, rank == world - 1 ? n - 1 : n, ZINF_F32, NULL);
	char want[160];
	snprintf(want, sizeof(want),
		 "rank 0: seq 2 all_gather 1000 f32; rank %d: seq 2 all_gather 999 f32", world - 1);
	CHECK(rc == -EPROTO, "rc %d", rc);
	CHECK(strstr(zinf_last_error(), want) != NULL, "message: %s", zinf_last_error());
	CHECK(zinf_now_s() - t0 < 10, "took %.1f s", zinf_now_s() - t0);
	CHECK(zinf_comm_all_gather(c, part, full, n, ZINF_F32, NULL) == -EPROTO, "later call");
	buf_free(part);
	buf_free(full);
	zinf_comm_destroy(c);
	return fails;
}

/* ---- quantized collectives (comm_quant.c) ------------------------------------------------- */

/* Rank r's element i for the quantized cases: random, with one large value per 300 elements. */
static float
qvalue(uint64_t salt, int r, size_t i)
{
	float v = value(salt, r, i);
	return i % 300 == 17 ? v * 1000.0f : v;
}

/* deq(q(x)) of n elements of dtype t, worked here with the C reference, as dtype t. */
static void *
q_round_trip(const void *x, enum zinf_dtype t, size_t n, size_t block, unsigned bits)
{
	void *codes = malloc(qz_code_bytes(n, bits) + 1), *y = malloc(n * zinf_dtype_size(t));
	float *scales = malloc(qz_blocks(n, block) * 4 + 4);
	qz_quantize(codes, scales, x, t, n, block, bits, NULL, 0.0f);
	qz_dequantize(y, t, codes, scales, n, block, bits);
	free(codes);
	free(scales);
	return y;
}

/* Every rank's recv equals each rank's partition quantized and dequantized here, bit for bit. */
static int
case_qall_gather(void)
{
	static const enum zinf_dtype types[] = {ZINF_F32, ZINF_BF16, ZINF_F16};
	struct zinf_comm *c = open_comm(60, true);
	int fails = 0;
	if (!c) {
		return 1;
	}
	for (unsigned bits = 8; bits >= 4; bits -= 4) {
		/* 8 bits: 1000 = 3 blocks of 256 and one of 232; 4 bits: an odd count (the last
		   byte half used) in blocks of 62, not the default */
		size_t count = bits == 8 ? 1000 : 1001, block = bits == 8 ? 256 : 62;
		for (int tt = 0; tt < 3; tt++) {
			enum zinf_dtype t = types[tt];
			size_t es = zinf_dtype_size(t);
			char *full = buf_alloc(count * world * es), *part = buf_alloc(count * es);
			for (size_t i = 0; i < count; i++) {
				store(part, t, i, qvalue(200 + tt, rank, i));
			}
			bool inplace = tt == 1;
			char *send = inplace ? full + (size_t)rank * count * es : part;
			if (inplace) {
				memcpy(send, part, count * es);
			}
			struct zinf_comm_quant_opts q;
			zinf_comm_quant_opts_init(&q);
			q.bits = bits;
			q.block = (uint32_t)block;
			int rc = zinf_comm_qall_gather(c, &q, send, full, count, t);
			CHECK(rc == 0, "qall_gather: %s", zinf_last_error());
			for (int r = 0; r < world && rc == 0; r++) {
				char *x = malloc(count * es);
				for (size_t i = 0; i < count; i++) {
					store(x, t, i, qvalue(200 + tt, r, i));
				}
				char *ref = q_round_trip(x, t, count, block, bits);
				CHECK(memcmp(ref, full + (size_t)r * count * es, count * es) == 0,
				      "%u-bit %s: rank %d's partition differs from deq(q(x))", bits,
				      zinf_dtype_name(t), r);
				free(x);
				free(ref);
			}
			buf_free(full);
			buf_free(part);
		}
	}
	struct zinf_comm_quant_opts q;
	zinf_comm_quant_opts_init(&q);
	q.bits = 4;
	q.block = 3;
	float one = 1;
	CHECK(zinf_comm_qall_gather(c, &q, &one, &one, 1, ZINF_F32) == -EINVAL, "odd 4-bit block");
	zinf_comm_destroy(c);
	return fails;
}

/* The stated bound of a quantized reduce-scatter, element i of this rank's result: each
 * quantization costs max|block| / 2Q + 2^-22 max|block|, the first over the ranks' blocks (S =
 * the sum of their maxima), the second over the partial sums' (at most S, to rounding); fp32
 * sums cost world x 2^-22 S; the output's rounding half an ulp of the result. */
static double
q_bound(enum zinf_dtype t, unsigned bits, int stages, double s, double ref)
{
	double half_ulp = t == ZINF_BF16 ? 0x1p-8 : t == ZINF_F16 ? 0x1p-11 : 0x1p-24;
	double q = bits == 8 ? 127.0 : 7.0;
	return stages * s * (1.0 / (2.0 * q) + 0x1p-21) + world * 0x1p-22 * s +
	       half_ulp * fabs(ref) * (1 + 0x1p-20) + 0x1p-126;
}

/* The scheme worked here for this rank's segment with the C reference (no error feedback). */
static float *
q_simulate(uint64_t salt, enum zinf_dtype t, size_t count, size_t block, int k, unsigned bits,
	   bool avg)
{
	int groups = world / k;
	bool intra = k > 1 || groups == 1, inter = groups > 1;
	size_t es = zinf_dtype_size(t), cb = qz_code_bytes(count, bits) + 1;
	float *part = calloc((size_t)groups * count, 4), *sum = calloc(count, 4);
	char *x = malloc(count * es);
	void *codes = malloc(cb);
	float *scales = malloc(qz_blocks(count, block) * 4 + 4);
	for (int g = 0; g < groups; g++) { /* group g's partial sum of this rank's segment */
		for (int l = 0; l < k; l++) {
			int src = g * k + l;
			for (size_t i = 0; i < count; i++) {
				store(x, t, i, qvalue(salt, src, (size_t)rank * count + i));
			}
			if (intra) {
				qz_quantize(codes, scales, x, t, count, block, bits, NULL, 0);
				qz_dequantize_add(part + (size_t)g * count, codes, scales, count,
						  block, bits);
			} else {
				for (size_t i = 0; i < count; i++) {
					part[(size_t)g * count + i] = load(x, t, i);
				}
			}
		}
	}
	if (inter) {
		for (int g = 0; g < groups; g++) {
			qz_quantize(codes, scales, part + (size_t)g * count, ZINF_F32, count, block,
				    bits, NULL, 0);
			qz_dequantize_add(sum, codes, scales, count, block, bits);
		}
	} else {
		memcpy(sum, part, count * 4);
	}
	float mul = avg ? 1.0f / (float)world : 1.0f;
	for (size_t i = 0; i < count; i++) {
		sum[i] = avg ? sum[i] * mul : sum[i];
	}
	free(part);
	free(x);
	free(codes);
	free(scales);
	return sum;
}

/*
 * qgZ's reduce-scatter for every grouping of this world (every divisor of it, and group 0: the
 * default, the node's ranks agreed at create), 8 and 4 bits (an odd count; 4 bits in blocks of
 * 100, not the default), f32 and bf16, SUM and AVG: within the stated bound of the float64 sum,
 * and equal bit for bit to the scheme worked here (which ranks' codes meet in which order).
 */
static int
case_qreduce_scatter(void)
{
	static const enum zinf_dtype types[] = {ZINF_F32, ZINF_BF16};
	struct zinf_comm *c = open_comm(60, true);
	const size_t count = 701;
	int fails = 0;
	if (!c) {
		return 1;
	}
	/* one node here: the default group is every rank (local_world agreed, consecutive) */
	CHECK(c->node_group == world, "node_group %d, world %d on one node", c->node_group, world);
	for (int kk = 0; kk <= world; kk++) {
		if (kk && world % kk) {
			continue;
		}
		int k = kk ? kk : c->node_group; /* kk 0: q.group 0, the default */
		int groups = world / k, stages = (k > 1 || groups == 1) + (groups > 1);
		for (unsigned bits = 8; bits >= 4; bits -= 4) {
			size_t block = bits == 8 ? 256 : 100;
			for (int tt = 0; tt < 2; tt++) {
				for (int red = ZINF_COMM_SUM; red <= ZINF_COMM_AVG; red++) {
					enum zinf_dtype t = types[tt];
					uint64_t salt = 300 + (uint64_t)(k * 10 + tt);
					size_t es = zinf_dtype_size(t);
					char *send = buf_alloc(count * world * es),
					     *recv = buf_alloc(count * es);
					for (size_t i = 0; i < count * world; i++) {
						store(send, t, i, qvalue(salt, rank, i));
					}
					struct zinf_comm_quant_opts q;
					zinf_comm_quant_opts_init(&q);
					q.bits = bits;
					q.block = (uint32_t)block;
					q.group = kk;
					int rc = zinf_comm_qreduce_scatter(c, &q, send, recv, count,
									   t, red, NULL);
					CHECK(rc == 0, "qreduce_scatter: %s", zinf_last_error());
					float *sim =
						q_simulate(salt, t, count, block, k, bits, red);
					for (size_t i = 0; i < count && rc == 0; i++) {
						size_t g = (size_t)rank * count + i;
						double ref = 0, s = 0;
						for (int r = 0; r < world; r++) {
							ref += qvalue(salt, r, g);
						}
						/* S: the ranks' maxima over element i's block */
						size_t lo = i / block * block,
						       hi = lo + block < count ? lo + block : count;
						for (int r = 0; r < world; r++) {
							double m = 0;
							for (size_t j = lo; j < hi; j++) {
								m = fmax(
									m,
									fabs(qvalue(
										salt, r,
										(size_t)rank * count +
											j)));
							}
							s += m;
						}
						if (red == ZINF_COMM_AVG) {
							ref /= world;
							s /= world;
						}
						double got = load(recv, t, i),
						       b = q_bound(t, bits, stages, s, ref);
						if (fabs(got - ref) > b) {
							CHECK(0,
							      "group %d %u-bit %s %s element %zu: "
							      "%.9g, "
							      "reference %.9g (bound %.3g)",
							      k, bits, zinf_dtype_name(t),
							      red ? "avg" : "sum", i, got, ref, b);
							break;
						}
						char want[4];
						store(want, t, 0, sim[i]);
						if (memcmp(want, recv + i * es, es) != 0) {
							CHECK(0,
							      "group %d %u-bit %s %s element %zu: "
							      "%.9g, the "
							      "scheme worked here gives %.9g",
							      k, bits, zinf_dtype_name(t),
							      red ? "avg" : "sum", i, got, sim[i]);
							break;
						}
					}
					free(sim);
					buf_free(send);
					buf_free(recv);
				}
			}
		}
	}
	struct zinf_comm_quant_opts q;
	zinf_comm_quant_opts_init(&q);
	q.group = world + 1;
	float x[8] = {0};
	CHECK(zinf_comm_qreduce_scatter(c, &q, x, x + 4, 1, ZINF_F32, ZINF_COMM_SUM, NULL) ==
		      -EINVAL,
	      "a group that does not divide the world");
	CHECK(zinf_comm_qreduce_scatter(c, NULL, x, x + 4, 1, ZINF_F32, ZINF_COMM_MAX, NULL) ==
		      -EINVAL,
	      "MAX");
	zinf_comm_destroy(c);
	return fails;
}

/*
 * Error feedback: the same gradient reduced n times. Without it every call makes the same
 * error, so the sum of the n results is n x one call's error away from n x the exact sum; with
 * it (err_beta 1) each call carries the last one's residual, and the accumulated error stays
 * within two calls' bound (the residual carried, itself within one, and the last call's own; it
 * lands near one). Values without outliers: a residual far below a block's step
 * would take more calls than the test makes to cross it. reset_T 1 clears it before every call: the
 * no-feedback bits.
 */
static int
case_qreduce_scatter_error_feedback(void)
{
	struct zinf_comm *c = open_comm(60, true);
	const size_t count = 512;
	const int n = 16;
	int fails = 0;
	if (!c) {
		return 1;
	}
	int k = world >= 4 ? 2 : 1; /* two stages with 4 ranks, one below */
	float *send = buf_alloc(count * world * 4), *recv = buf_alloc(count * 4);
	double *acc[3];
	for (size_t i = 0; i < count * world; i++) {
		send[i] = value(400, rank, i);
	}
	struct zinf_comm_quant_opts q;
	zinf_comm_quant_opts_init(&q);
	q.bits = 4;
	q.group = k;
	float *first = malloc(count * 4);
	for (int mode = 0; mode < 3; mode++) { /* none, feedback, feedback reset every call */
		struct zinf_comm_qerr *e = NULL;
		acc[mode] = calloc(count, sizeof(double));
		if (mode) {
			CHECK(zinf_comm_qerr_create(c, count, 1.0f, mode == 2 ? 1 : 0, &e) == 0,
			      "%s", zinf_last_error());
		}
		for (int step = 0; step < n; step++) {
			int rc = zinf_comm_qreduce_scatter(c, &q, send, recv, count, ZINF_F32,
							   ZINF_COMM_SUM, e);
			CHECK(rc == 0, "qreduce_scatter: %s", zinf_last_error());
			for (size_t i = 0; i < count; i++) {
				acc[mode][i] += recv[i];
			}
			if (mode == 0 && step == 0) {
				memcpy(first, recv, count * 4);
			}
			if (mode == 2) {
				CHECK(memcmp(first, recv, count * 4) == 0,
				      "reset_T 1, step %d: not the no-feedback bits", step);
			}
		}
		zinf_comm_qerr_destroy(e);
	}
	double worst[2] = {0, 0}, bound = 0;
	for (size_t i = 0; i < count; i++) {
		size_t g = (size_t)rank * count + i;
		double ref = 0, s = 0;
		for (int r = 0; r < world; r++) {
			ref += value(400, r, g);
			double m = 0;
			for (size_t j = i / 256 * 256; j < i / 256 * 256 + 256; j++) {
				m = fmax(m, fabs(value(400, r, (size_t)rank * count + j)));
			}
			s += m;
		}
		for (int mode = 0; mode < 2; mode++) {
			worst[mode] = fmax(worst[mode], fabs(acc[mode][i] - n * ref));
		}
		bound = fmax(bound,
			     q_bound(ZINF_F32, 4, (k > 1) + (world / k > 1 || k == world), s, ref));
	}
	CHECK(worst[1] <= 2.0 * bound,
	      "with feedback the error over %d calls is %g, beyond two calls' bound %g", n,
	      worst[1], 2.0 * bound);
	CHECK(worst[0] > 4.0 * worst[1],
	      "without feedback %g, with %g: feedback should cut the accumulated error", worst[0],
	      worst[1]);
	if (rank == 0) {
		printf("error feedback, %d calls, %d ranks, 4 bits: accumulated error %g without, "
		       "%g with (one call's bound %g)\n",
		       n, world, worst[0], worst[1], bound);
	}
	for (int mode = 0; mode < 3; mode++) {
		free(acc[mode]);
	}
	free(first);
	buf_free(send);
	buf_free(recv);
	zinf_comm_destroy(c);
	return fails;
}

/* A communicator with deadline timeout_s (no call check) and a qreduce_scatter's f32 inputs:
 * count x world elements of value(salt, rank, i) to send, count to receive. NULL: no
 * communicator. */
static struct zinf_comm *
qrs_open(double timeout_s, uint64_t salt, size_t count, float **send, float **recv)
{
	struct zinf_comm *c = open_comm(timeout_s, false);
	if (!c) {
		return NULL;
	}
	*send = buf_alloc(count * world * 4);
	*recv = buf_alloc(count * 4);
	for (size_t i = 0; i < count * world; i++) {
		(*send)[i] = value(salt, rank, i);
	}
	return c;
}

/*
 * A quantized call given up by its deadline leaves its scratch to MPI: rank 0 times out in
 * qreduce_scatter (the others come 2.5 s late, past its 1 s deadline) while its all_to_all is
 * still posted (or blocked on the progress thread); when the others arrive, MPI writes their
 * codes into rank 0's scratch. Freed, that memory would be the next malloc of its size: rank 0
 * fills fresh blocks of that size with a pattern right after the timeout, and none may change.
 */
static int
case_qreduce_scatter_timeout_leaves_scratch(void)
{
	if (world < 2) {
		return SKIP;
	}
	const size_t count = 1000;
	int fails = 0;
	float *send, *recv;
	struct zinf_comm *c = qrs_open(1.0, 500, count, &send, &recv);
	if (!c) {
		return 1;
	}
	if (rank != 0) {
		struct timespec ts = {2, 500000000L};
		nanosleep(&ts, NULL);
	}
	int rc = zinf_comm_qreduce_scatter(c, NULL, send, recv, count, ZINF_F32, ZINF_COMM_SUM,
					   NULL);
	enum { NB = 8 };
	unsigned char *fresh[NB] = {0};
	/* the scratch: codes out and in (world chunks of 1000 codes and 4 scales), partial sums */
	size_t sz = 2 * (size_t)world * (1000 + 16) + (size_t)world / c->node_group * count * 4;
	if (rank == 0) {
		CHECK(rc == -ETIMEDOUT, "rank 0: rc %d (%s)", rc, zinf_last_error());
		for (int k = 0; k < NB; k++) {
			fresh[k] = malloc(sz);
			memset(fresh[k], 0xAA, sz);
		}
	}
	MPI_Barrier(MPI_COMM_WORLD); /* the others' calls are over: their codes were sent */
	if (rank == 0) {
		struct timespec ts = {0, 200000000L};
		nanosleep(&ts, NULL);
		for (int k = 0; k < NB; k++) {
			size_t bad = 0;
			for (size_t i = 0; i < sz; i++) {
				bad += fresh[k][i] != 0xAA;
			}
			CHECK(bad == 0, "fresh block %d: %zu of %zu bytes written behind our back",
			      k, bad, sz);
			free(fresh[k]);
		}
	}
	zinf_comm_destroy(c);
	buf_free(send);
	buf_free(recv);
	return fails;
}

/*
 * A failure of one rank alone inside a quantized call (out of memory for the scratch on rank
 * 0) is told to the others: their call fails well before their deadline (30 s), naming it.
 */
static int
case_qreduce_scatter_local_failure_told(void)
{
	if (world < 2) {
		return SKIP;
	}
	const size_t count = 1000;
	int fails = 0;
	float *send, *recv;
	struct zinf_comm *c = qrs_open(30, 510, count, &send, &recv);
	if (!c) {
		return 1;
	}
	double t0 = MPI_Wtime();
	if (rank == 0) {
		/* as notice_one: most likely the others have posted their all_to_all by now (the
		   late call below must meet every one of them) */
		struct timespec ts = {0, 300000000L};
		nanosleep(&ts, NULL);
		zc_test_alloc_fail_nth(1); /* the scratch */
	}
	int rc = zinf_comm_qreduce_scatter(c, NULL, send, recv, count, ZINF_F32, ZINF_COMM_SUM,
					   NULL);
	double dt = MPI_Wtime() - t0;
	const char *msg = zinf_last_error();
	if (rank == 0) {
		zc_test_alloc_fail_nth(0);
		CHECK(rc == -ENOMEM, "rank 0: rc %d (%s)", rc, msg);
		CHECK(zinf_comm_failed(c) == -ENOMEM, "rank 0's communicator: %d",
		      zinf_comm_failed(c));
	} else {
		CHECK(rc < 0 && dt < 10.0, "rank %d: rc %d after %.1f s (deadline 30 s): %s", rank,
		      rc, dt, msg);
		CHECK(strstr(msg, "rank 0 failed") && strstr(msg, "qreduce_scatter on rank 0"),
		      "the message names neither rank 0 nor the call: %s", msg);
	}
	/* as notice_one: on the progress thread the others' thread stays inside MPI_Alltoallv
	   until rank 0 makes that call, once they destroyed theirs */
	bool late = comm_mpi_progress(c);
	if (rank != 0) {
		zinf_comm_destroy(c);
	}
	if (late) {
		MPI_Barrier(MPI_COMM_WORLD);
	}
	if (rank == 0) {
		if (late) {
			c->failed = 0;
			CHECK(zinf_comm_qreduce_scatter(c, NULL, send, recv, count, ZINF_F32,
							ZINF_COMM_SUM, NULL) == 0,
			      "the late call: %s", zinf_last_error());
		}
		zinf_comm_destroy(c);
	}
	buf_free(send);
	buf_free(recv);
	return fails;
}

/*
 * A call above the backend's byte limit (mpi: INT_MAX, counts and displacements are int) is
 * refused before anything is numbered or quantized: the message names the count, the world
 * and the limit, the communicator stays healthy, and the next call (checked across ranks)
 * runs. The buffers are never touched: their addresses only.
 */
static int
case_quant_limit_refused_before_numbering(void)
{
	struct zinf_comm *c = open_comm(60, true);
	int fails = 0;
	if (!c) {
		return 1;
	}
	if (!c->ops->max_u8) {
		zinf_comm_destroy(c);
		return SKIP;
	}
	size_t count = (size_t)INT_MAX / (size_t)world + 1; /* world x codes > INT_MAX */
	char *send = (char *)(uintptr_t)0x100000, *recv = send + (size_t)world * count * 4 + 64;
	char want[64];
	snprintf(want, sizeof(want), "%zu elements per rank on %d ranks", count, world);
	int rc = zinf_comm_qreduce_scatter(c, NULL, send, recv, count, ZINF_F32, ZINF_COMM_SUM,
					   NULL);
	CHECK(rc == -EINVAL, "qreduce_scatter of %zu: rc %d", count, rc);
	CHECK(strstr(zinf_last_error(), want) && strstr(zinf_last_error(), "2147483647"), "%s",
	      zinf_last_error());
	count = (size_t)INT_MAX + 1;
	rc = zinf_comm_qall_gather(c, NULL, send, send + 8 * count, count, ZINF_F32);
	CHECK(rc == -EINVAL, "qall_gather of %zu: rc %d", count, rc);
	CHECK(zinf_comm_failed(c) == 0, "failed %d: %s", zinf_comm_failed(c), zinf_last_error());
	float x[8] = {1, 2, 3, 4, 5, 6, 7, 8}, y = 0;
	rc = zinf_comm_qreduce_scatter(c, NULL, x, &y, 1, ZINF_F32, ZINF_COMM_SUM, NULL);
	CHECK(rc == 0, "the next call: %s", zinf_last_error());
	zinf_comm_destroy(c);
	return fails;
}

/*
 * The default group is agreed, never decided per rank: nodes of unequal size, or ranks not
 * consecutive on their nodes (mpirun --map-by node), give the world; equal nodes of
 * consecutive ranks that divide it give a node's ranks. Worked by hand.
 */
static int
case_node_group_agreement(void)
{
	int fails = 0;
	CHECK(comm_node_group(8, 4, 4, true) == 4, "2 nodes of 4");
	CHECK(comm_node_group(6, 2, 4, true) == 6, "nodes of 4 and 2: the world");
	CHECK(comm_node_group(8, 4, 4, false) == 8, "not consecutive: the world");
	CHECK(comm_node_group(6, 4, 4, true) == 6, "4 does not divide 6: the world");
	CHECK(comm_node_group(4, 1, 1, true) == 1, "a rank per node");
	/* 4 ranks, 2 nodes, --map-by slot: node firsts 0 and 2; --map-by node: 0 and 1 */
	CHECK(comm_node_consecutive(3, 2, 1, 2), "rank 3 second on the node from 2");
	CHECK(!comm_node_consecutive(2, 0, 1, 2), "map-by node: rank 2 second on node 0");
	CHECK(!comm_node_consecutive(3, 1, 1, 2), "map-by node: node 1 starts at rank 1");
	CHECK(!comm_node_consecutive(5, 0, 2, 3), "ranks 0, 1 and 5 on one node");
	return fails;
}

/* zinf_comm_quant_opts: nonzero reserved bytes, a group too large or not dividing the world:
 * each refused with its own message, the communicator healthy. */
static int
case_quant_opts_refused(void)
{
	struct zinf_comm *c = open_comm(60, true);
	int fails = 0;
	if (!c) {
		return 1;
	}
	struct zinf_comm_quant_opts q;
	zinf_comm_quant_opts_init(&q);
	q.reserved = 1;
	float x[8] = {0};
	CHECK(zinf_comm_qall_gather(c, &q, x, x, 1, ZINF_F32) == -EINVAL, "reserved");
	CHECK(strstr(zinf_last_error(), "reserved is 1"), "%s", zinf_last_error());
	CHECK(zinf_comm_qreduce_scatter(c, &q, x, x + 4, 1, ZINF_F32, ZINF_COMM_SUM, NULL) ==
		      -EINVAL,
	      "reserved");
	zinf_comm_quant_opts_init(&q);
	q.group = world + 1;
	CHECK(zinf_comm_qreduce_scatter(c, &q, x, x + 4, 1, ZINF_F32, ZINF_COMM_SUM, NULL) ==
		      -EINVAL,
	      "group");
	CHECK(strstr(zinf_last_error(), "does not divide"), "%s", zinf_last_error());
	CHECK(zinf_comm_failed(c) == 0, "failed %d", zinf_comm_failed(c));
	zinf_comm_destroy(c);
	return fails;
}

/* ---- runner ------------------------------------------------------------------------------- */

static const struct {
	const char *name;
	int (*fn)(void);
	bool basic; /* also run with --lib-init */
} cases[] = {
	{"path", case_path, true},
	{"all_gather_uneven", case_all_gather_uneven, true},
	{"reduce_scatter", case_reduce_scatter, true},
	{"all_reduce", case_all_reduce, true},
	{"broadcast_barrier", case_broadcast_barrier, false},
	{"two_in_flight", case_two_in_flight, false},
	{"many_in_flight", case_many_in_flight, true},
	{"leave", case_leave, false},
	{"check_differs", case_check_differs, false},
	{"skip_unchecked", case_skip_unchecked, false},
	{"skip_checked", case_skip_checked, false},
	{"mismatch", case_mismatch, false},
	{"notice", case_notice, false},
	{"notice_checked", case_notice_checked, false},
	{"notice_stale", case_notice_stale, false},
	{"notice_stale_late", case_notice_stale_late, false},
	{"notice_all", case_notice_all, false},
	{"qall_gather", case_qall_gather, true},
	{"qreduce_scatter", case_qreduce_scatter, true},
	{"qreduce_scatter_error_feedback", case_qreduce_scatter_error_feedback, true},
	{"qreduce_scatter_timeout_leaves_scratch", case_qreduce_scatter_timeout_leaves_scratch,
	 false},
	{"qreduce_scatter_local_failure_told", case_qreduce_scatter_local_failure_told, false},
	{"quant_limit_refused_before_numbering", case_quant_limit_refused_before_numbering, true},
	{"node_group_agreement", case_node_group_agreement, true},
	{"quant_opts_refused", case_quant_opts_refused, true},
};

/* Sum of v over ranks, through MPI_COMM_WORLD or (lib-init) a zinf communicator. */
static int
total(struct zinf_comm *c, int v)
{
	float f = (float)v;
	if (c) {
		return zinf_comm_all_reduce(c, &f, 1, ZINF_F32, ZINF_COMM_SUM, NULL) < 0 ? -1
											 : (int)f;
	}
	int t = 0;
	MPI_Allreduce(&v, &t, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
	return t;
}

/*
 * Whether the command line is BACKEND [--lib-init | --multiple] with a backend this program
 * knows; if not, the first rank (by mpirun's environment: MPI is not initialised yet) says so
 * on stderr with the known names. A misspelt backend or option is an error (exit 1), never a
 * run of other cases or a skip.
 */
static bool
args_ok(int argc, char **argv)
{
	static const char *const backends[] = {"mpi", "nccl"};
	const char *r = getenv("OMPI_COMM_WORLD_RANK");
	bool say = !r || strcmp(r, "0") == 0;
	bool ok = argc <= 3;
	if (ok && argc > 1) {
		ok = strcmp(argv[1], backends[0]) == 0 || strcmp(argv[1], backends[1]) == 0;
	}
	if (ok && argc > 2) {
		ok = strcmp(argv[2], "--lib-init") == 0 || strcmp(argv[2], "--multiple") == 0;
	}
	if (!ok && say) {
		fprintf(stderr,
			"%s: unknown arguments (usage: %s BACKEND [--lib-init | --multiple]; the "
			"backends are: %s %s; the cases, all run:",
			argv[0], argv[0], backends[0], backends[1]);
		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
			fprintf(stderr, " %s", cases[i].name);
		}
		fprintf(stderr, ")\n");
	}
	return ok;
}

int
main(int argc, char **argv)
{
	if (!args_ok(argc, argv)) {
		return 1;
	}
	bool lib_init = argc > 2 && strcmp(argv[2], "--lib-init") == 0;
	bool multiple = argc > 2 && strcmp(argv[2], "--multiple") == 0;
	int provided = 0, passed = 0, failed = 0, skipped = 0, ran = 0;
	struct zinf_comm *lc = NULL;

	backend = argc > 1 ? argv[1] : "mpi";
	if (!lib_init) {
		MPI_Init_thread(&argc, &argv,
				multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SERIALIZED, &provided);
		MPI_Comm_rank(MPI_COMM_WORLD, &rank);
		MPI_Comm_size(MPI_COMM_WORLD, &world);
		want_thread = provided >= MPI_THREAD_MULTIPLE;
		if (multiple && !want_thread && rank == 0) {
			printf("note: MPI provides thread level %d, not MULTIPLE: the progress "
			       "thread is not tested\n",
			       provided);
		}
	} else {
		/* backend NULL: zinf sees mpirun's environment and picks mpi */
		if (zinf_comm_create(NULL, &lc) < 0) {
			fprintf(stderr, "zinf_comm_create: %s\n", zinf_last_error());
			return 1;
		}
		rank = zinf_comm_rank(lc);
		world = zinf_comm_world(lc);
		MPI_Query_thread(&provided); /* zinf asked for MULTIPLE */
		want_thread = provided >= MPI_THREAD_MULTIPLE;
		if (strcmp(zinf_comm_backend(lc), "mpi") != 0) {
			fprintf(stderr, "backend %s under mpirun\n", zinf_comm_backend(lc));
			return 1;
		}
		/* the backend's own communicator spans the same ranks in the same order */
		MPI_Comm *native = zinf_comm_native(lc);
		int nr = -1, nw = -1;
		if (!native || MPI_Comm_rank(*native, &nr) != MPI_SUCCESS ||
		    MPI_Comm_size(*native, &nw) != MPI_SUCCESS || nr != rank || nw != world) {
			fprintf(stderr, "zinf_comm_native: rank %d of %d, want %d of %d\n", nr, nw,
				rank, world);
			return 1;
		}
	}
#if ZINF_HAVE_NCCL
	int ndev = 0;
	if (strcmp(backend, "nccl") == 0 &&
	    (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1)) {
		/* without a device, nccl refuses before it touches MPI: -ENODEV, said why */
		struct zinf_comm *c = open_comm(10, false);
		int bad = c != NULL || !strstr(zinf_last_error(), "no CUDA device");
		if (rank == 0) {
			printf("SKIP: nccl needs a CUDA device; this machine has none (%s)\n",
			       bad ? "but zinf_comm_create did not say so: FAILED" : "refused");
		}
		zinf_comm_destroy(c);
		if (!lib_init) {
			MPI_Finalize();
		}
		return bad ? 1 : 77;
	}
#endif
	/* every rank draws the same tensors: rank 0's seed */
	seed = rank == 0 ? zt_seed() : 0;
	if (!lib_init) {
		MPI_Bcast(&seed, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
	} else {
		zinf_comm_broadcast(lc, &seed, 2, ZINF_F32, 0, NULL);
	}
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		if (lib_init && !cases[i].basic) {
			continue;
		}
		int f = cases[i].fn();
		int all = total(lc, f == SKIP ? 0 : f);
		if (rank == 0) {
			printf("%-20s %s (%d ranks)\n", cases[i].name,
			       f == SKIP ? "skipped"
			       : all	 ? "FAILED"
					 : "ok",
			       world);
		}
		skipped += f == SKIP;
		ran += f != SKIP;
		passed += f != SKIP && all == 0;
		failed += f != SKIP && all != 0;
	}
	if (rank == 0) {
		printf("%s, %d ranks: %d passed, %d failed, %d skipped\n", backend, world, passed,
		       failed, skipped);
		fflush(stdout);
	}
	if (lib_init) {
		zinf_comm_destroy(lc); /* finalises MPI: zinf initialised it */
	} else {
		MPI_Finalize();
	}
	/* 77 only when cases ran and every one skipped itself; none at all is an error */
	return failed ? 1 : ran ? 0 : skipped ? 77 : 1;
}
