/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli/bench/bench_comm.c: `zinf bench comm`: bandwidth of zinf's collectives (zinf/blocks/comm.h)
 * against the backend's own call on the same communicator, timed in the same run. Run under mpirun
 * (or alone: one rank). Figures as nccl-tests defines them: algbw = bytes / time, bytes the
 * full tensor; busbw = algbw x (n - 1) / n for all_gather and reduce_scatter, x 2 (n - 1) / n
 * for all_reduce. Each iteration times one zinf call and one raw call, in alternating order,
 * each ended by a barrier so that the ranks start the next one together; an iteration's time
 * is the slowest rank's; medians are reported, with ratio = raw time / zinf time.
 *
 * The raw reference: mpi: MPI_Allgather, MPI_Reduce_scatter_block, MPI_Allreduce on the
 * MPI_Comm that zinf_comm_native() returns, on the same buffers; 16-bit all_gather moves
 * MPI_UINT16_T as zinf does; 16-bit reductions: MPI has no 16-bit float reduction, so the
 * reference is the call zinf makes after widening: the same element count as MPI_FLOAT, in
 * place in an fp32 buffer (its bytes are raw_bytes; the ratio then prices the widening and
 * rounding). nccl: ncclAllGather, ncclReduceScatter, ncclAllReduce on the same device buffers
 * and the ncclComm_t, on a stream of our own. single: memcpy (a one-rank all_gather or
 * reduce_scatter is a copy); a one-rank all_reduce has no reference (null).
 * The quantized calls (qall_gather, qreduce_scatter: zinf_comm_qall_gather/qreduce_scatter, 8-bit,
 * blocks of 256, the default groups) are timed against zinf's unquantized all_gather and
 * reduce_scatter; bytes and busbw are the unquantized tensor's, so that the ratio and the
 * bandwidths compare the same work; wire_bytes is what one rank sends to the others.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/bench/bench.h"
#include "common/dtype.h"
#include "zinf/blocks/comm.h"
#include "zinf/device.h"
#include "zinf_config.h"

#if ZINF_HAVE_MPI
#include <mpi.h>
#endif
#if ZINF_HAVE_NCCL && ZINF_HAVE_MPI
#include <cuda_runtime.h>
#include <nccl.h>
#define HAVE_NCCL_REF 1
#else
#define HAVE_NCCL_REF 0
#endif

#define PROG "zinf bench comm"

enum { OP_AG, OP_RS, OP_AR, OP_QAG, OP_QRS, OP_ALL };
static const char *const op_names[] = {"all_gather",  "reduce_scatter",	 "all_reduce",
				       "qall_gather", "qreduce_scatter", "all",
				       NULL};
/* The quantized ops have the shape (buffers, sizes, bus factor) of the unquantized ones. */
#define BASE(op)  ((op) == OP_QAG ? OP_AG : (op) == OP_QRS ? OP_RS : (op))
#define QUANT(op) ((op) == OP_QAG || (op) == OP_QRS)
static const char *const dtypes[] = {"f32", "bf16", "f16", NULL};
static const char *const backends[] = {"auto", "mpi", "nccl", "single", NULL};

struct cfg {
	int op, dtype, backend, iters, warmup;
	struct cli_list sizes;
	bool json, sweep;
};

static struct cfg cfg;

static const char synopsis[] =
	"[--op all_gather|reduce_scatter|all_reduce|qall_gather|qreduce_scatter|all]\n"
	"       [--size N]... [--sweep]\n"
	"       [--dtype f32|bf16|f16] [--backend auto|mpi|nccl|single] [--iters N] "
	"[--warmup N] [--json]\n"
	"       (under mpirun: mpirun -np 4 zinf bench comm ...)";
static const char description[] =
	"Time zinf's collectives against the backend's raw call (MPI_Allgather,\n"
	"MPI_Reduce_scatter_block, MPI_Allreduce; ncclAllGather, ...) on the same communicator "
	"and\n"
	"buffers, interleaved in the same run; each iteration ends with a barrier and counts the\n"
	"slowest rank; medians. algbw = bytes / time (bytes: the full tensor); busbw = algbw x\n"
	"(n-1)/n (all_gather, reduce_scatter) or x 2(n-1)/n (all_reduce), as nccl-tests.\n"
	"ratio = raw time / zinf time (the target is >= 0.95). 16-bit reductions over MPI are\n"
	"compared with the fp32 call of the same element count (MPI has no 16-bit reduction).\n"
	"qall_gather and qreduce_scatter (ZeRO++'s qwZ and qgZ: 8-bit codes, a scale per 256\n"
	"elements, groups of a node's ranks) are timed against zinf's unquantized call, with the\n"
	"bytes each rank sends (wire_B) for both; their results are checked within the codec's\n"
	"bound.\n";

static const struct cli_opt opts[] = {
	{"op", CLI_ENUM, &cfg.op, "all_reduce", NULL, "collective (all: the five in turn)",
	 .choices = op_names},
	{"size", CLI_LIST, &cfg.sizes, "64M", "N",
	 "bytes of the full tensor (\"64M\"); may be given several times;\nrounded down to a "
	 "multiple of ranks x element size",
	 .max = CLI_LIST_MAX},
	{"sweep", CLI_FLAG, &cfg.sweep, NULL, NULL,
	 "every power of two from 1M to the largest --size"},
	{"dtype", CLI_ENUM, &cfg.dtype, "f32", NULL, "element type", .choices = dtypes},
	{"backend", CLI_ENUM, &cfg.backend, "auto", NULL,
	 "collective backend (auto: mpi under mpirun, else single)", .choices = backends},
	{"iters", CLI_INT, &cfg.iters, "20", "N", "timed iterations (each: one zinf, one raw call)",
	 .min = 1, .max = 100000},
	{"warmup", CLI_INT, &cfg.warmup, "3", "N",
	 "untimed iterations first (the first is checked)", .min = 1, .max = 10000},
	{"json", CLI_FLAG, &cfg.json, NULL, NULL, "one JSON object on stdout (rank 0)"},
	{NULL},
};

/* ---- the run: communicator, native handles, memory -------------------------------------- */

struct run {
	const struct cfg *c;
	struct zinf_comm *comm;
	const char *backend;
	int rank, world, node_ranks;
	enum zinf_dtype dt;
	size_t es;
	struct zinf_device *dev; /* nccl: device buffers; NULL: host buffers */
	struct zinf_stream *stream;
#if ZINF_HAVE_MPI
	MPI_Comm mpi; /* the barrier's and the times' communicator (MPI_COMM_NULL: single) */
#endif
};

static bool
is_nccl(const struct run *r)
{
	return r->dev != NULL;
}

static void *
mem_alloc(struct run *r, size_t n)
{
	void *p = NULL;
	if (r->dev) {
		return zinf_device_alloc(r->dev, n ? n : 1, &p) ? NULL : p;
	}
	p = zinf_alloc_aligned(4096, n ? n : 1);
	if (p) {
		memset(p, 0, n); /* first touch outside the timed calls */
	}
	return p;
}

static void
mem_free(struct run *r, void *p)
{
	if (r->dev) {
		zinf_device_free(r->dev, p);
	} else {
		zinf_free_aligned(p);
	}
}

/* Copy n bytes between our memory and the host (dir H2D: into ours), or within ours (D2D). */
static int
mem_copy(struct run *r, void *dst, const void *src, size_t n, enum zinf_copy_dir dir)
{
	if (!r->dev) {
		memcpy(dst, src, n);
		return 0;
	}
	int rc = zinf_device_copy(r->stream, dst, src, n, dir);
	return rc ? rc : zinf_stream_sync(r->stream);
}

/* Every rank's rc: the lowest (an error anywhere is an error everywhere). */
static int
agree(struct run *r, int rc)
{
#if ZINF_HAVE_MPI
	if (r->mpi != MPI_COMM_NULL) {
		int all = rc;
		MPI_Allreduce(&rc, &all, 1, MPI_INT, MPI_MIN, r->mpi);
		return all;
	}
#endif
	return rc;
}

static void
barrier(struct run *r)
{
#if ZINF_HAVE_MPI
	if (r->mpi != MPI_COMM_NULL) {
		MPI_Barrier(r->mpi);
	}
#endif
}

/* t[i] = the slowest rank's t[i]. */
static void
max_over_ranks(struct run *r, double *t, int n)
{
#if ZINF_HAVE_MPI
	if (r->mpi != MPI_COMM_NULL) {
		MPI_Allreduce(MPI_IN_PLACE, t, n, MPI_DOUBLE, MPI_MAX, r->mpi);
	}
#endif
}

/* Ranks on this node (the memory check counts them all). */
static int
node_ranks(struct run *r)
{
	int n = 1;
#if ZINF_HAVE_MPI
	if (r->mpi != MPI_COMM_NULL) {
		MPI_Comm node;
		if (MPI_Comm_split_type(r->mpi, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) ==
		    MPI_SUCCESS) {
			MPI_Comm_size(node, &n);
			MPI_Comm_free(&node);
		}
	}
#endif
	return n;
}

/* nccl: a device of the ordinal the backend made current, and a stream for the raw calls. */
static int
open_device(struct run *r)
{
#if HAVE_NCCL_REF
	int ord = 0;
	if (cudaGetDevice(&ord) != cudaSuccess) {
		fprintf(stderr, PROG ": rank %d: cudaGetDevice failed\n", r->rank);
		return -EIO;
	}
	struct zinf_device_opts o;
	zinf_device_opts_init(&o);
	o.backend = "cuda";
	o.index = ord;
	int rc = zinf_device_create(&o, &r->dev);
	return rc ? rc : zinf_stream_create(r->dev, "bench comm raw", &r->stream);
#else
	fprintf(stderr, PROG ": the nccl backend is not built into this zinf\n");
	return -ENODEV;
#endif
}

static int
run_open(struct run *r, const struct cfg *c)
{
	r->c = c;
	r->dt = c->dtype == 0 ? ZINF_F32 : c->dtype == 1 ? ZINF_BF16 : ZINF_F16;
	r->es = zinf_dtype_size(r->dt);
#if ZINF_HAVE_MPI
	r->mpi = MPI_COMM_NULL;
#endif
	struct zinf_comm_opts o;
	zinf_comm_opts_init(&o);
	o.backend = c->backend ? backends[c->backend] : NULL;
	o.timeout_s = 600; /* a benchmark call never takes this long: fail instead of hanging */
	int rc = zinf_comm_create(&o, &r->comm);
	if (rc) {
		return rc;
	}
	r->backend = zinf_comm_backend(r->comm);
	r->rank = zinf_comm_rank(r->comm);
	r->world = zinf_comm_world(r->comm);
#if ZINF_HAVE_MPI
	if (strcmp(r->backend, "mpi") == 0) {
		r->mpi = *(MPI_Comm *)zinf_comm_native(r->comm);
	} else if (strcmp(r->backend, "nccl") == 0) {
		r->mpi = MPI_COMM_WORLD; /* the nccl backend joined MPI */
	}
#endif
	r->node_ranks = node_ranks(r);
	if (strcmp(r->backend, "nccl") == 0) {
		rc = agree(r, open_device(r));
	}
	return rc;
}

static void
run_close(struct run *r)
{
	zinf_stream_destroy(r->stream);
	zinf_device_destroy(r->dev);
	zinf_comm_destroy(r->comm);
}

/* ---- one measurement ------------------------------------------------------------------------ */

struct meas {
	int op;
	uint64_t bytes;	    /* the full tensor */
	size_t count;	    /* elements per rank (all_gather, reduce_scatter) or in all */
	void *send, *recv;  /* zinf's and (same dtype) the raw call's buffers */
	void *init;	    /* all_reduce: the values every call starts from */
	float *raw32;	    /* 16-bit reductions over MPI: the fp32 buffer of the raw call */
	size_t raw32_n;	    /* its elements */
	const char *raw;    /* the raw call's name; NULL: none */
	uint64_t raw_bytes; /* the raw call's full tensor */
	double *tz, *tr;    /* per iteration, the slowest rank */
};

/* Rank r's value i: a small integer, so that every sum is exact in every dtype. */
static float
pattern(int rank, size_t i)
{
	return (float)((i + (size_t)rank * 3) % 8 + 1);
}

static const char *
raw_name(const struct run *r, int op)
{
	if (QUANT(op)) { /* the reference: the unquantized call, in the same run */
		return op == OP_QAG ? "zinf all_gather" : "zinf reduce_scatter";
	}
	static const char *const mpi[] = {"MPI_Allgather", "MPI_Reduce_scatter_block",
					  "MPI_Allreduce"};
	static const char *const nccl[] = {"ncclAllGather", "ncclReduceScatter", "ncclAllReduce"};
	if (strcmp(r->backend, "single") == 0) {
		return op == OP_AR ? NULL : "memcpy";
	}
	return is_nccl(r) ? nccl[op] : mpi[op];
}

/* Host bytes this rank allocates for m (zinf's 16-bit scratch included). */
static uint64_t
host_bytes(const struct run *r, const struct meas *m)
{
	uint64_t part = BASE(m->op) == OP_AR ? m->bytes : m->bytes / (uint64_t)r->world;
	uint64_t zinf32 = m->raw32_n * 4; /* zinf widens as much as the raw fp32 call holds */
	return m->bytes + part + (BASE(m->op) == OP_AR ? m->bytes : 0) + 2 * zinf32;
}

static void
meas_free(struct run *r, struct meas *m)
{
	mem_free(r, m->send);
	mem_free(r, m->recv);
	mem_free(r, m->init);
	zinf_free_aligned(m->raw32);
	free(m->tz);
	free(m->tr);
}

/* Fill send (all_reduce: init and recv) with this rank's pattern. */
static int
meas_fill(struct run *r, struct meas *m)
{
	size_t n = BASE(m->op) == OP_RS ? m->count * (size_t)r->world : m->count;
	size_t bytes = n * r->es;
	void *h = malloc(bytes ? bytes : 1);
	float *f = malloc(n * sizeof(float) + 1);
	int rc = h && f ? 0 : -ENOMEM;
	for (size_t i = 0; !rc && i < n; i++) {
		f[i] = pattern(r->rank, i);
	}
	rc = rc ? rc : zinf_dtype_convert(h, r->dt, f, ZINF_F32, n);
	if (!rc && m->raw32) {
		memcpy(m->raw32, f, m->raw32_n * sizeof(float));
	}
	if (!rc && BASE(m->op) == OP_AR) {
		rc = mem_copy(r, m->init, h, bytes, ZINF_COPY_H2D);
		rc = rc ? rc : mem_copy(r, m->recv, h, bytes, ZINF_COPY_H2D);
	} else if (!rc) {
		rc = mem_copy(r, m->send, h, bytes, ZINF_COPY_H2D);
	}
	free(h);
	free(f);
	return rc;
}

/*
 * Size m for its op and bytes (rounded down to whole elements per rank), check the host
 * memory of the node, allocate and fill. Errors are agreed by every rank; rank 0 prints.
 */
static int
meas_alloc(struct run *r, struct meas *m)
{
	size_t per = r->es * (BASE(m->op) == OP_AR ? 1 : (size_t)r->world);
	m->count = (size_t)(m->bytes / per);
	if (m->count == 0) {
		if (r->rank == 0) {
			fprintf(stderr,
				PROG ": --size %llu: less than %zu bytes (%d ranks x %zu)\n",
				(unsigned long long)m->bytes, per, r->world, r->es);
		}
		return -EINVAL;
	}
	m->bytes = (uint64_t)m->count * per;
	size_t part = m->count * r->es;
	bool red16 = !QUANT(m->op) && BASE(m->op) != OP_AG && r->dt != ZINF_F32 && !is_nccl(r) &&
		     strcmp(r->backend, "mpi") == 0;
	m->raw32_n = red16 ? (BASE(m->op) == OP_RS ? m->count * (size_t)r->world : m->count) : 0;
	m->raw = raw_name(r, m->op);
	m->raw_bytes = red16 ? (uint64_t)m->raw32_n * 4 : m->bytes;
	int rc = 0;
	if (!is_nccl(r) && zinf_comm_local_rank(r->comm) == 0) {
		char what[96];
		snprintf(what, sizeof(what), "the %s buffers of %d rank(s) on this node",
			 op_names[m->op], r->node_ranks);
		rc = cli_check_memory(PROG, what, host_bytes(r, m) * (uint64_t)r->node_ranks,
				      "--size");
	}
	if (agree(r, rc)) {
		return -ENOMEM;
	}
	m->send =
		BASE(m->op) == OP_AR ? NULL : mem_alloc(r, BASE(m->op) == OP_AG ? part : m->bytes);
	m->recv = mem_alloc(r, BASE(m->op) == OP_RS ? part : m->bytes);
	m->init = BASE(m->op) == OP_AR ? mem_alloc(r, m->bytes) : NULL;
	m->raw32 = m->raw32_n ? zinf_alloc_aligned(4096, m->raw32_n * 4) : NULL;
	m->tz = calloc(r->c->iters, sizeof(double));
	m->tr = calloc(r->c->iters, sizeof(double));
	rc = (BASE(m->op) != OP_AR && !m->send) || !m->recv || (BASE(m->op) == OP_AR && !m->init) ||
			     (m->raw32_n && !m->raw32) || !m->tz || !m->tr
		     ? -ENOMEM
		     : 0;
	if (rc) {
		fprintf(stderr, PROG ": rank %d: out of memory for %llu bytes of %s\n", r->rank,
			(unsigned long long)m->bytes, op_names[m->op]);
	}
	rc = agree(r, rc ? rc : meas_fill(r, m));
	return rc;
}

/* One zinf call, complete (quantized: 8-bit codes, blocks of 256, groups of a node's ranks). */
static int
call_zinf(struct run *r, struct meas *m, int op)
{
	switch (op) {
	case OP_QAG:
		return zinf_comm_qall_gather(r->comm, NULL, m->send, m->recv, m->count, r->dt);
	case OP_QRS:
		return zinf_comm_qreduce_scatter(r->comm, NULL, m->send, m->recv, m->count, r->dt,
						 ZINF_COMM_SUM, NULL);
	case OP_AG:
		return zinf_comm_all_gather(r->comm, m->send, m->recv, m->count, r->dt, NULL);
	case OP_RS:
		return zinf_comm_reduce_scatter(r->comm, m->send, m->recv, m->count, r->dt,
						ZINF_COMM_SUM, NULL);
	default:
		return zinf_comm_all_reduce(r->comm, m->recv, m->count, r->dt, ZINF_COMM_SUM, NULL);
	}
}

#if HAVE_NCCL_REF
static int
call_nccl(struct run *r, struct meas *m)
{
	ncclComm_t nc = (ncclComm_t)zinf_comm_native(r->comm);
	cudaStream_t s = (cudaStream_t)zinf_stream_native(r->stream);
	ncclDataType_t t = r->dt == ZINF_F32	? ncclFloat32
			   : r->dt == ZINF_BF16 ? ncclBfloat16
						: ncclFloat16;
	ncclResult_t e = BASE(m->op) == OP_AG ? ncclAllGather(m->send, m->recv, m->count, t, nc, s)
			 : BASE(m->op) == OP_RS
				 ? ncclReduceScatter(m->send, m->recv, m->count, t, ncclSum, nc, s)
				 : ncclAllReduce(m->recv, m->recv, m->count, t, ncclSum, nc, s);
	/* zinf's communicator is non-blocking: the call may still be enqueueing */
	while (e == ncclInProgress) {
		ncclCommGetAsyncError(nc, &e);
	}
	if (e != ncclSuccess) {
		fprintf(stderr, PROG ": rank %d: %s failed: %s\n", r->rank, m->raw,
			ncclGetErrorString(e));
		return -EIO;
	}
	return cudaStreamSynchronize(s) == cudaSuccess ? 0 : -EIO;
}
#endif

#if ZINF_HAVE_MPI
static int
call_mpi(struct run *r, struct meas *m)
{
	MPI_Datatype t = r->dt == ZINF_F32 ? MPI_FLOAT : MPI_UINT16_T;
	int n = (int)m->count, e;
	if (BASE(m->op) == OP_AG) {
		e = MPI_Allgather(m->send, n, t, m->recv, n, t, r->mpi);
	} else if (m->raw32) { /* what zinf calls on its widened copy */
		e = BASE(m->op) == OP_RS
			    ? MPI_Reduce_scatter_block(MPI_IN_PLACE, m->raw32, n, MPI_FLOAT,
						       MPI_SUM, r->mpi)
			    : MPI_Allreduce(MPI_IN_PLACE, m->raw32, n, MPI_FLOAT, MPI_SUM, r->mpi);
	} else {
		e = BASE(m->op) == OP_RS
			    ? MPI_Reduce_scatter_block(m->send, m->recv, n, MPI_FLOAT, MPI_SUM,
						       r->mpi)
			    : MPI_Allreduce(MPI_IN_PLACE, m->recv, n, MPI_FLOAT, MPI_SUM, r->mpi);
	}
	if (e != MPI_SUCCESS) {
		fprintf(stderr, PROG ": rank %d: %s failed (MPI error %d)\n", r->rank, m->raw, e);
		return -EIO;
	}
	return 0;
}
#endif

/* One raw call, complete. */
static int
call_raw(struct run *r, struct meas *m)
{
	if (QUANT(m->op)) {
		return call_zinf(r, m, BASE(m->op));
	}
#if HAVE_NCCL_REF
	if (is_nccl(r)) {
		return call_nccl(r, m);
	}
#endif
#if ZINF_HAVE_MPI
	if (r->mpi != MPI_COMM_NULL) {
		return call_mpi(r, m);
	}
#endif
	memcpy(m->recv, m->send, BASE(m->op) == OP_AG ? m->count * r->es : m->bytes);
	return 0;
}

/* Time one call (zinf or raw) ended by the barrier; all_reduce starts from init. */
static int
timed(struct run *r, struct meas *m, bool raw, double *t)
{
	int rc = 0;
	if (BASE(m->op) == OP_AR && (!raw || !m->raw32)) {
		rc = mem_copy(r, m->recv, m->init, m->bytes, ZINF_COPY_D2D);
		barrier(r);
	}
	double t0 = zinf_now_s();
	rc = rc ? rc : raw ? call_raw(r, m) : call_zinf(r, m, m->op);
	barrier(r);
	*t = zinf_now_s() - t0;
	return rc;
}

/* The first zinf result against the pattern's exact sums. */
static int
meas_check(struct run *r, struct meas *m)
{
	size_t n = BASE(m->op) == OP_RS	  ? m->count
		   : BASE(m->op) == OP_AG ? m->count * (size_t)r->world
					  : m->count;
	void *h = malloc(n * r->es + 1);
	float *f = malloc(n * sizeof(float) + 1);
	int rc = h && f ? mem_copy(r, h, m->recv, n * r->es, ZINF_COPY_D2H) : -ENOMEM;
	rc = rc ? rc : zinf_dtype_convert(f, ZINF_F32, h, r->dt, n);
	for (size_t i = 0; !rc && i < n; i++) {
		double want = 0;
		if (BASE(m->op) == OP_AG) {
			want = pattern((int)(i / m->count), i % m->count);
		} else {
			size_t k = BASE(m->op) == OP_RS ? (size_t)r->rank * m->count + i : i;
			for (int q = 0; q < r->world; q++) {
				want += pattern(q, k);
			}
		}
		float w = (float)want; /* rounded once to the dtype, as the result is */
		uint32_t tmp;
		zinf_dtype_convert(&tmp, r->dt, &w, ZINF_F32, 1);
		zinf_dtype_convert(&w, ZINF_F32, &tmp, r->dt, 1);
		/* quantized: each value (at most 8) within 8 / 254 per quantization (two at
		   most), per rank, plus the dtype's rounding of the result */
		double tol =
			QUANT(m->op) ? 2.0 * r->world * 8.0 / 254.0 * 1.01 + fabs(want) / 128 : 0.0;
		if (fabs((double)f[i] - w) > tol) {
			fprintf(stderr,
				PROG ": rank %d: %s result wrong at element %zu: %g, not %g\n",
				r->rank, op_names[m->op], i, f[i], w);
			rc = -EPROTO;
		}
	}
	free(h);
	free(f);
	return rc;
}

/* Warm up (checking the first result), then the interleaved iterations. */
static int
meas_run(struct run *r, struct meas *m)
{
	const struct cfg *c = r->c;
	double t;
	int rc = timed(r, m, false, &t);
	rc = agree(r, rc ? rc : meas_check(r, m));
	for (int i = 1; !rc && i < c->warmup; i++) {
		rc = timed(r, m, false, &t);
		rc = rc ? rc : m->raw ? timed(r, m, true, &t) : 0;
	}
	if (!rc && m->raw) {
		rc = timed(r, m, true, &t);
	}
	for (int i = 0; !rc && i < c->iters; i++) {
		bool raw_first = i % 2 && m->raw;
		if (raw_first) {
			rc = timed(r, m, true, &m->tr[i]);
		}
		rc = rc ? rc : timed(r, m, false, &m->tz[i]);
		if (!rc && m->raw && !raw_first) {
			rc = timed(r, m, true, &m->tr[i]);
		}
	}
	rc = agree(r, rc);
	if (!rc) {
		max_over_ranks(r, m->tz, c->iters);
		max_over_ranks(r, m->tr, c->iters);
	}
	return rc;
}

/* ---- report --------------------------------------------------------------------------------- */

/* Bytes one rank sends to the others in one call (quantized: codes, padded to 4 bytes, and a
 * float per 256 elements; qgZ with the node's ranks as its groups). A 16-bit reduction on MPI
 * moves the fp32 copy zinf widens it to: 4 bytes an element (as red16 prices raw_bytes). */
static double
wire_bytes(const struct run *r, int op, size_t count)
{
	bool wide = (op == OP_RS || op == OP_AR) && r->dt != ZINF_F32 && !is_nccl(r) &&
		    strcmp(r->backend, "mpi") == 0;
	double n = r->world, part = (double)count * (wide ? 4 : r->es);
	double s = (double)((count + 3) / 4 * 4 + 4 * ((count + 255) / 256));
	int k = r->world % r->node_ranks == 0 ? r->node_ranks : r->world, g = r->world / k;
	switch (op) {
	case OP_AG:
	case OP_RS:
		return (n - 1) * part;
	case OP_AR: /* the ring's two passes over (n - 1) / n of the tensor */
		return 2 * (n - 1) / n * part;
	case OP_QAG:
		return (n - 1) * s;
	default:
		return (k > 1 || g == 1 ? (double)(k - 1) * g * s : 0) + (double)(g - 1) * s;
	}
}

static double
bus_factor(int op, int n)
{
	op = BASE(op);
	return op == OP_AR ? 2.0 * (n - 1) / n : (double)(n - 1) / n;
}

static json_t *
meas_json(const struct run *r, const struct meas *m)
{
	int it = r->c->iters;
	double tz = cli_median(m->tz, it), tr = m->raw ? cli_median(m->tr, it) : NAN;
	double f = bus_factor(m->op, r->world);
	double algbw = (double)m->bytes / tz / 1e9, raw_algbw = (double)m->raw_bytes / tr / 1e9;
	json_t *o = json_object();
	json_object_set_new(o, "bench", json_string("comm"));
	json_object_set_new(o, "op", json_string(op_names[m->op]));
	json_object_set_new(o, "bytes", json_integer((json_int_t)m->bytes));
	json_object_set_new(o, "count", json_integer((json_int_t)m->count));
	json_object_set_new(o, "ranks", json_integer(r->world));
	json_object_set_new(o, "backend", json_string(r->backend));
	json_object_set_new(o, "dtype", json_string(zinf_dtype_name(r->dt)));
	json_object_set_new(o, "iters", json_integer(it));
	json_object_set_new(o, "bus_factor", cli_json_real(f));
	json_object_set_new(o, "time_s", cli_json_real(tz));
	json_object_set_new(o, "algbw_GBps", cli_json_real(algbw));
	json_object_set_new(o, "busbw_GBps", cli_json_real(algbw * f));
	json_object_set_new(o, "raw_call", m->raw ? json_string(m->raw) : json_null());
	json_object_set_new(o, "raw_dtype", json_string(m->raw32 ? "f32" : zinf_dtype_name(r->dt)));
	json_object_set_new(o, "raw_bytes", json_integer((json_int_t)m->raw_bytes));
	json_object_set_new(o, "raw_time_s", cli_json_real(tr));
	json_object_set_new(o, "raw_algbw_GBps", cli_json_real(raw_algbw));
	json_object_set_new(o, "raw_busbw_GBps", cli_json_real(raw_algbw * f));
	json_object_set_new(o, "ratio", cli_json_real(tr / tz));
	json_object_set_new(o, "wire_bytes", cli_json_real(wire_bytes(r, m->op, m->count)));
	json_object_set_new(o, "raw_wire_bytes",
			    cli_json_real(wire_bytes(r, BASE(m->op), m->count)));
	return o;
}

static void
meas_print(const struct run *r, const struct meas *m)
{
	json_t *o = meas_json(r, m);
	char sz[32];
	cli_size_str(sz, sizeof(sz), m->bytes);
	printf("%-15s %10s %10.1f %10.3f %10.3f  %-24s %10.1f %10.3f %7.3f %10.0f %10.0f\n",
	       op_names[m->op], sz, 1e6 * cli_json_num(o, "time_s"), cli_json_num(o, "algbw_GBps"),
	       cli_json_num(o, "busbw_GBps"), m->raw ? m->raw : "-",
	       1e6 * cli_json_num(o, "raw_time_s"), cli_json_num(o, "raw_busbw_GBps"),
	       cli_json_num(o, "ratio"), cli_json_num(o, "wire_bytes"),
	       cli_json_num(o, "raw_wire_bytes"));
	fflush(stdout);
	json_decref(o);
}

/* ---- the command ---------------------------------------------------------------------------- */

/* The sizes to run: every --size, or with --sweep the powers of two from 1M to the largest. */
static int
sizes_of(const struct cfg *c, bool quiet, uint64_t *out, int max)
{
	int n = 0;
	uint64_t top = 0;
	for (unsigned i = 0; i < c->sizes.n; i++) {
		uint64_t v;
		if (cli_parse_size(c->sizes.v[i], &v) < 0 || v == 0) {
			if (!quiet) {
				fprintf(stderr, PROG ": --size %s: not a size of at least 1 byte\n",
					c->sizes.v[i]);
			}
			return -EINVAL;
		}
		top = v > top ? v : top;
		out[n++] = v;
	}
	if (c->sweep) {
		n = 0;
		for (uint64_t s = 1 << 20; s <= top && n < max; s *= 2) {
			out[n++] = s;
		}
		if (n == 0) {
			out[n++] = top;
		}
	}
	return n;
}

static int
run_all(struct run *r, const uint64_t *sizes, int nsizes)
{
	const struct cfg *c = r->c;
	json_t *all = json_array();
	int rc = 0, op0 = c->op == OP_ALL ? OP_AG : c->op, op1 = c->op == OP_ALL ? OP_QRS : c->op;
	if (r->rank == 0 && !c->json) {
		printf("# zinf bench comm: backend %s, %d rank(s), %s, %d iterations: medians, "
		       "slowest rank; ratio = raw time / zinf time\n",
		       r->backend, r->world, zinf_dtype_name(r->dt), c->iters);
		printf("%-15s %10s %10s %10s %10s  %-24s %10s %10s %7s %10s %10s\n", "# op",
		       "bytes", "time_us", "algbw_GBps", "busbw_GBps", "raw call", "raw_us",
		       "raw_busbw", "ratio", "wire_B", "raw_wire_B");
	}
	for (int op = op0; !rc && op <= op1; op++) {
		for (int i = 0; !rc && i < nsizes; i++) {
			struct meas m = {.op = op, .bytes = sizes[i]};
			rc = meas_alloc(r, &m);
			rc = rc ? rc : meas_run(r, &m);
			if (!rc && r->rank == 0) {
				if (c->json) {
					json_array_append_new(all, meas_json(r, &m));
				} else {
					meas_print(r, &m);
				}
			}
			meas_free(r, &m);
		}
	}
	if (!rc && r->rank == 0 && c->json) {
		json_t *o = json_array_size(all) == 1
				    ? json_incref(json_array_get(all, 0))
				    : json_pack("{s:s, s:O}", "bench", "comm", "results", all);
		rc = cli_json_print(o, 0);
	}
	json_decref(all);
	return rc;
}

int
cli_bench_comm(int argc, char **argv)
{
	bool quiet = cli_launcher_rank() != 0;
	char err[512];
	int rc = cli_opts_parse(opts, argc, argv, err, sizeof(err));
	if (rc == CLI_PARSE_HELP) {
		if (!quiet) {
			cli_opts_help(stdout, PROG, synopsis, description, opts);
		}
		return 0;
	}
	if (rc < 0) {
		if (!quiet) {
			fprintf(stderr, "%s: %s\nRun `%s --help` for the options.\n", PROG, err,
				PROG);
		}
		return 2;
	}
	struct cfg c = cfg;
	uint64_t sizes[64];
	int nsizes = sizes_of(&c, quiet, sizes, 64);
	if (nsizes < 0) {
		return 2;
	}
	struct run r = {0};
	rc = run_open(&r, &c);
	rc = rc ? rc : run_all(&r, sizes, nsizes);
	run_close(&r);
	return rc ? 1 : 0;
}
