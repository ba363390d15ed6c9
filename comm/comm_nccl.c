/* SPDX-License-Identifier: Apache-2.0 */
/*
 * comm/comm_nccl.c: the collectives over NCCL, on device buffers, ordered on one CUDA
 * stream (the caller's opts.stream, or one this backend creates until the device module owns
 * streams). MPI (comm_mpi.c) supplies rank, world and local rank, broadcasts the unique id, and
 * carries the call check's descriptors. The communicator is non-blocking (config.blocking =
 * 0), so no NCCL call can hang the caller: every call is followed by polling
 * ncclCommGetAsyncError under the deadline, a request completes when its CUDA event does, and
 * a request past its deadline aborts the communicator (ncclCommAbort).
 *
 * 16-bit reductions run in NCCL's kernels, in the input's type. Not here: a barrier of NCCL's
 * own (it is an all-reduce of one float on the stream), device selection beyond
 * cudaSetDevice(opts.device or local rank modulo the device count).
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <stdio.h>
#include <string.h>

#include "comm/comm_internal.h"
#include "common/quant.h"
#include "kernels/kernels.h"

struct nccl_be {
	struct zinf_comm_mpi *mpi;
	ncclComm_t comm;
	cudaStream_t stream;
	bool own_stream;
	float *dev_one; /* one float on the device: the barrier's all-reduce */
	int device;
	bool aborted;	   /* ncclCommAbort called: a request passed its deadline, or c failed */
	void *dev_scratch; /* the quantized calls' scratch, grow-only, freed at close */
	size_t scratch_bytes;
};

struct nccl_req {
	cudaEvent_t done;
};

/* The one place CUDA and NCCL status codes become errnos (call, file, line logged). */
static int
cuda_status(cudaError_t rc, const char *call, const char *file, int line)
{
	if (rc == cudaSuccess) {
		return 0;
	}
	int err = rc == cudaErrorNoDevice || rc == cudaErrorInsufficientDriver ? -ENODEV : -EIO;
	return zc_log_emit(err, ZINF_LOG_ERROR, file, line, "cuda", "%s failed: %s", call,
			   cudaGetErrorString(rc));
}
#define CUDA_TRY(x) cuda_status((x), #x, __FILE__, __LINE__)

static int
nccl_status(ncclResult_t rc, const char *call, const char *file, int line)
{
	if (rc == ncclSuccess || rc == ncclInProgress) {
		return 0;
	}
	return zc_log_emit(-EIO, ZINF_LOG_ERROR, file, line, "nccl", "%s failed: %s", call,
			   ncclGetErrorString(rc));
}
#define NCCL_TRY(x) nccl_status((x), #x, __FILE__, __LINE__)

/* Wait until the non-blocking communicator has finished enqueueing, or the deadline. */
static int
settle(struct nccl_be *b, uint64_t deadline_ns)
{
	ncclResult_t st = ncclInProgress;
	unsigned spins = 0;

	for (;;) {
		int rc = NCCL_TRY(ncclCommGetAsyncError(b->comm, &st));
		if (rc < 0) {
			return rc;
		}
		if (st != ncclInProgress) {
			return NCCL_TRY(st);
		}
		if (zinf_now_ns() > deadline_ns) {
			return -ETIMEDOUT;
		}
		comm_backoff(&spins);
	}
}

/* CUDA devices of this process; -ENODEV (before MPI is touched) when there is none. */
static int
count_devices(int *n)
{
	*n = 0;
	cudaError_t e = cudaGetDeviceCount(n);
	if (e != cudaSuccess || *n < 1) {
		return ZINF_FAIL(-ENODEV, "comm nccl: no CUDA device (%s)",
				 e != cudaSuccess ? cudaGetErrorString(e) : "count 0");
	}
	return 0;
}

static int
check_version(void)
{
	int v = 0;
	char why[200];
	int rc = NCCL_TRY(ncclGetVersion(&v));
	if (rc == 0 && comm_nccl_version_ok(v, NCCL_VERSION_CODE, why, sizeof(why)) < 0) {
		rc = ZINF_FAIL(-ENOTSUP, "comm nccl: %s", why);
	}
	return rc;
}

static int
pick_device(struct zinf_comm *c, struct nccl_be *b, int n)
{
	b->device = c->opts.device >= 0 ? c->opts.device : c->local_rank % n;
	if (b->device >= n) {
		return ZINF_FAIL(-EINVAL, "comm nccl rank %d: device %d of %d devices", c->rank,
				 b->device, n);
	}
	return CUDA_TRY(cudaSetDevice(b->device));
}

/*
 * Rank 0's unique id to every rank, then the communicator, within the deadline. The id goes
 * with rank 0's status, so that a failed ncclGetUniqueId fails every rank at once instead of
 * leaving them to time out.
 */
static int
init_comm(struct zinf_comm *c, struct nccl_be *b)
{
	uint64_t deadline = zinf_now_ns() + (uint64_t)(c->opts.timeout_s * 1e9);
	ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
	struct {
		int32_t status;
		ncclUniqueId id;
	} msg;
	int rc;

	memset(&msg, 0, sizeof(msg));
	if (c->rank == 0) {
		msg.status = NCCL_TRY(ncclGetUniqueId(&msg.id));
	}
	rc = comm_mpi_bcast_bytes(b->mpi, &msg, sizeof(msg), "nccl unique id", deadline);
	if (rc == -ETIMEDOUT) {
		return ZINF_FAIL(rc,
				 "comm nccl rank %d: the unique id broadcast timed out after %g s",
				 c->rank, c->opts.timeout_s);
	}
	if (rc == 0 && msg.status < 0) {
		rc = ZINF_FAIL(msg.status, "comm nccl rank %d: rank 0 could not make a unique id",
			       c->rank);
	}
	if (rc < 0) {
		return rc;
	}
	config.blocking = 0;
	rc = NCCL_TRY(ncclCommInitRankConfig(&b->comm, c->world, msg.id, c->rank, &config));
	if (rc == 0) {
		rc = settle(b, deadline);
	}
	if (rc < 0) {
		if (b->comm) {
			ncclCommAbort(b->comm);
			b->comm = NULL;
		}
		return rc == -ETIMEDOUT ? ZINF_FAIL(rc,
						    "comm nccl rank %d: ncclCommInitRankConfig "
						    "timed out",
						    c->rank)
					: rc;
	}
	return 0;
}

static int
nccl_open(struct zinf_comm *c)
{
	struct nccl_be *b = zc_calloc(1, sizeof(*b));
	int rc, ndev;

	if (!b) {
		return ZINF_FAIL(-ENOMEM, "comm nccl: out of memory");
	}
	rc = count_devices(&ndev);
	if (rc == 0) {
		rc = check_version();
	}
	if (rc < 0) {
		goto err_free;
	}
	rc = comm_mpi_join(c, &b->mpi);
	if (rc < 0) {
		goto err_free;
	}
	rc = pick_device(c, b, ndev);
	if (rc < 0) {
		goto err_mpi;
	}
	b->stream = c->opts.stream;
	if (!b->stream) {
		rc = CUDA_TRY(cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking));
		if (rc < 0) {
			goto err_mpi;
		}
		b->own_stream = true;
	}
	rc = CUDA_TRY(cudaMalloc((void **)&b->dev_one, sizeof(float)));
	if (rc < 0) {
		goto err_stream;
	}
	/* the barrier's all-reduce sums it: zero stays zero (never uninitialised memory) */
	rc = CUDA_TRY(cudaMemsetAsync(b->dev_one, 0, sizeof(float), b->stream));
	if (rc == 0) {
		rc = CUDA_TRY(cudaStreamSynchronize(b->stream));
	}
	if (rc < 0) {
		goto err_one;
	}
	rc = init_comm(c, b);
	if (rc < 0) {
		goto err_one;
	}
	c->be = b;
	return 0;

err_one:
	cudaFree(b->dev_one);
err_stream:
	if (b->own_stream) {
		cudaStreamDestroy(b->stream);
	}
err_mpi:
	/* a timed-out broadcast is still posted: leave MPI as a failed communicator does */
	comm_mpi_leave(b->mpi, rc == -ETIMEDOUT);
err_free:
	zc_free(b);
	return rc;
}

/*
 * A healthy communicator is finalised (ncclCommFinalize, which completes its pending work and
 * is non-blocking here) within one deadline, then destroyed; a failed one, or one whose
 * finalisation did not finish in time, is aborted, and nothing its kernels use is freed.
 */
static void
nccl_close(struct zinf_comm *c)
{
	struct nccl_be *b = c->be;
	/* a communicator failed by a notice or a mismatch leaves with c->failed cleared (comm.c),
	   but its NCCL communicator was aborted when it failed */
	bool clean = !c->failed && !b->aborted;

	if (clean) {
		uint64_t deadline = zinf_now_ns() + (uint64_t)(c->opts.timeout_s * 1e9);
		clean = NCCL_TRY(ncclCommFinalize(b->comm)) == 0 && settle(b, deadline) == 0;
	}
	if (clean) {
		ncclCommDestroy(b->comm);
		cudaFree(b->dev_one);
		cudaFree(b->dev_scratch);
		if (b->own_stream) {
			cudaStreamDestroy(b->stream);
		}
	} else if (!b->aborted) {
		ncclCommAbort(b->comm);
	}
	comm_mpi_leave(b->mpi, !clean);
	zc_free(b);
}

static ncclDataType_t
nccl_type(int dtype)
{
	return dtype == ZINF_F16    ? ncclFloat16
	       : dtype == ZINF_BF16 ? ncclBfloat16
	       : dtype == COMM_U8   ? ncclUint8
				    : ncclFloat32;
}

static ncclRedOp_t
nccl_op(int red)
{
	return red == ZINF_COMM_MAX ? ncclMax : red == ZINF_COMM_AVG ? ncclAvg : ncclSum;
}

static int
post(struct zinf_comm *c, struct zinf_comm_req *r)
{
	struct nccl_be *b = c->be;
	ncclDataType_t t = nccl_type(r->d.dtype);
	size_t n = r->d.count;

	switch (r->d.kind) {
	case ZINF_COMM_ALL_GATHER:
		return NCCL_TRY(ncclAllGather(r->send, r->recv, n, t, b->comm, b->stream));
	case ZINF_COMM_REDUCE_SCATTER:
		return NCCL_TRY(ncclReduceScatter(r->send, r->recv, n, t, nccl_op(r->d.red),
						  b->comm, b->stream));
	case ZINF_COMM_ALL_REDUCE:
		return NCCL_TRY(ncclAllReduce(r->recv, r->recv, n, t, nccl_op(r->d.red), b->comm,
					      b->stream));
	case ZINF_COMM_BROADCAST:
		return NCCL_TRY(
			ncclBroadcast(r->recv, r->recv, n, t, r->d.root, b->comm, b->stream));
	case ZINF_COMM_BARRIER:
		return NCCL_TRY(ncclAllReduce(b->dev_one, b->dev_one, 1, ncclFloat32, ncclSum,
					      b->comm, b->stream));
	case ZINF_COMM_ALL_TO_ALL: {
		/* one group of sends and receives to the ranks of this rank's group (bytes) */
		int rc = NCCL_TRY(ncclGroupStart());
		for (int i = 0; rc == 0 && i < r->d.a2a_n; i++) {
			int peer = comm_a2a_peer(c->rank, r->d.a2a_n, r->d.a2a_stride, i);
			rc = NCCL_TRY(ncclSend((const char *)r->send + i * n, n, ncclUint8, peer,
					       b->comm, b->stream));
			if (rc == 0) {
				rc = NCCL_TRY(ncclRecv((char *)r->recv + i * n, n, ncclUint8, peer,
						       b->comm, b->stream));
			}
		}
		int rc2 = NCCL_TRY(ncclGroupEnd());
		return rc < 0 ? rc : rc2;
	}
	}
	return ZINF_FAIL(-EINVAL, "comm nccl: collective kind %d unknown", r->d.kind);
}

/* An event on the communicator's device, whatever device is current on the calling thread (an
 * event recorded on a stream of another device fails); the thread's current device is left as
 * it was. */
static int
event_on_device(struct nccl_be *b, cudaEvent_t *ev)
{
	int cur = -1;
	int rc = CUDA_TRY(cudaGetDevice(&cur));
	if (rc == 0 && cur != b->device) {
		rc = CUDA_TRY(cudaSetDevice(b->device));
	}
	if (rc == 0) {
		rc = CUDA_TRY(cudaEventCreateWithFlags(ev, cudaEventDisableTiming));
	}
	if (cur >= 0 && cur != b->device) {
		int rc2 = CUDA_TRY(cudaSetDevice(cur));
		if (rc == 0 && rc2 < 0) {
			cudaEventDestroy(*ev);
			rc = rc2;
		}
	}
	return rc;
}

static int
nccl_start(struct zinf_comm *c, struct zinf_comm_req *r)
{
	struct nccl_be *b = c->be;
	struct nccl_req *q = (struct nccl_req *)r->priv;
	int rc = event_on_device(b, &q->done);
	if (rc < 0) {
		return rc;
	}
	rc = post(c, r);
	if (rc == 0) {
		rc = settle(b, r->deadline_ns); /* enqueued only once NCCL says so */
	}
	if (rc == 0) {
		rc = CUDA_TRY(cudaEventRecord(q->done, b->stream));
	}
	if (rc < 0) {
		if (rc == -ETIMEDOUT) {
			rc = ZINF_FAIL(rc, "comm nccl rank %d: enqueueing %s timed out", c->rank,
				       comm_kind_name(r->d.kind));
		}
		cudaEventDestroy(q->done);
	}
	return rc;
}

static int
nccl_poll(struct zinf_comm *c, struct zinf_comm_req *r)
{
	struct nccl_be *b = c->be;
	struct nccl_req *q = (struct nccl_req *)r->priv;
	ncclResult_t st = ncclSuccess;

	cudaError_t e = cudaEventQuery(q->done);
	if (e == cudaSuccess) {
		cudaEventDestroy(q->done);
		return 1;
	}
	if (e != cudaErrorNotReady) {
		return CUDA_TRY(e); /* comm.c drops the request: nccl_abandon */
	}
	/* the query's NotReady may stay in the thread's last-error slot: consume it, or the next
	   kernel launch on this thread that checks cudaGetLastError would take it for its own */
	(void)cudaGetLastError();
	int rc = NCCL_TRY(ncclCommGetAsyncError(b->comm, &st));
	return rc < 0 ? rc : NCCL_TRY(st);
}

static void
nccl_abandon(struct zinf_comm *c, struct zinf_comm_req *r)
{
	struct nccl_be *b = c->be;
	struct nccl_req *q = (struct nccl_req *)r->priv;
	/* Abort now, so that the kernels of the failed call end and a stream synchronise of the
	 * caller's returns. The event is destroyed: CUDA releases it once the aborted stream
	 * reaches it (a request that failed or timed out is never polled again). */
	if (!b->aborted) {
		ncclCommAbort(b->comm);
		b->aborted = true;
	}
	cudaEventDestroy(q->done);
}

static int
nccl_exchange(struct zinf_comm *c, const struct zinf_comm_desc *mine, struct zinf_comm_desc *all,
	      uint64_t deadline_ns)
{
	struct nccl_be *b = c->be;
	return comm_mpi_exchange(b->mpi, mine, all, sizeof(*mine), "call check", deadline_ns);
}

/*
 * Failure notices travel on MPI (NCCL has no message that nobody waits for). A notice taken
 * is not yet a failure: the collectives up to its `upto` run on (the failed rank joined them),
 * so NCCL's communicator stays; once c fails (the generic layer: a notice sent, or heeded at
 * a collective past `upto`, or any other cause) it is aborted, as nccl_abandon does after a
 * timeout: the kernels of collectives the failed rank never joins end, so that a stream
 * synchronise (the engine's, before it destroys c) returns.
 */
static void
nccl_failed(struct zinf_comm *c)
{
	struct nccl_be *b = c->be;
	if (!b->aborted) {
		ncclCommAbort(b->comm);
		b->aborted = true;
	}
}

static int
nccl_notify(struct zinf_comm *c, const struct zinf_comm_notice *n)
{
	struct nccl_be *b = c->be;
	return comm_mpi_notify(b->mpi, c->rank, c->world, n);
}

static int
nccl_notice(struct zinf_comm *c, struct zinf_comm_notice *n)
{
	struct nccl_be *b = c->be;
	return comm_mpi_notice(b->mpi, n);
}

static void *
nccl_native(struct zinf_comm *c)
{
	return ((struct nccl_be *)c->be)->comm;
}

static void *
nccl_stream(struct zinf_comm *c)
{
	return ((struct nccl_be *)c->be)->stream;
}

/* ---- the quantized collectives' memory and codec: device memory, kernels on the stream ---- */

/* Make the communicator's device current on this thread; *cur: the device to restore. */
static int
dev_enter(struct nccl_be *b, int *cur)
{
	*cur = -1;
	int rc = CUDA_TRY(cudaGetDevice(cur));
	if (rc == 0 && *cur != b->device) {
		rc = CUDA_TRY(cudaSetDevice(b->device));
	}
	return rc;
}

static void
dev_leave(struct nccl_be *b, int cur)
{
	if (cur >= 0 && cur != b->device) {
		(void)cudaSetDevice(cur);
	}
}

static int
nccl_qalloc(struct zinf_comm *c, size_t bytes, void **out)
{
	struct nccl_be *b = c->be;
	int cur, rc = dev_enter(b, &cur);
	if (rc == 0) {
		rc = CUDA_TRY(cudaMalloc(out, bytes ? bytes : 1));
	}
	dev_leave(b, cur);
	return rc;
}

static void
nccl_qfree(struct zinf_comm *c, void *p)
{
	/* after the stream's work that uses p (cudaFree synchronises the device) */
	if (!((struct nccl_be *)c->be)->aborted) {
		cudaFree(p);
	}
}

/*
 * The scratch of one quantized call: the communicator's, grown (cudaFree, which synchronises
 * the device, then cudaMalloc) only when a call needs more than any before it, so that a
 * steady training step neither allocates nor stalls the device. The stream orders one call's
 * use of it before the next's.
 */
static int
nccl_qscratch(struct zinf_comm *c, size_t bytes, void **out)
{
	struct nccl_be *b = c->be;
	if (bytes > b->scratch_bytes || !b->dev_scratch) {
		int cur, rc = dev_enter(b, &cur);
		if (rc == 0 && b->dev_scratch) {
			rc = CUDA_TRY(cudaFree(b->dev_scratch));
			b->dev_scratch = NULL;
			b->scratch_bytes = 0;
		}
		if (rc == 0) {
			rc = CUDA_TRY(cudaMalloc(&b->dev_scratch, bytes ? bytes : 1));
		}
		dev_leave(b, cur);
		if (rc < 0) {
			b->dev_scratch = NULL;
			return rc;
		}
		b->scratch_bytes = bytes ? bytes : 1;
	}
	*out = b->dev_scratch;
	return 0;
}

static int
nccl_qzero(struct zinf_comm *c, void *p, size_t bytes)
{
	struct nccl_be *b = c->be;
	int cur, rc = dev_enter(b, &cur);
	if (rc == 0) {
		rc = CUDA_TRY(cudaMemsetAsync(p, 0, bytes, b->stream));
	}
	dev_leave(b, cur);
	return rc;
}

static int
kern_status(int e, const char *what)
{
	return cuda_status((cudaError_t)e, what, __FILE__, __LINE__);
}

static int
nccl_quantize(struct zinf_comm *c, void *codes, float *scales, const void *x, enum zinf_dtype t,
	      size_t n, size_t block, unsigned bits, float *err, float beta)
{
	struct nccl_be *b = c->be;
	int cur, rc = dev_enter(b, &cur);
	if (rc == 0) {
		rc = kern_status(
			kern_quantize(b->stream, codes, scales, x, t, n, block, bits, err, beta),
			"kern_quantize");
	}
	dev_leave(b, cur);
	return rc;
}

static int
nccl_dequantize(struct zinf_comm *c, void *y, enum zinf_dtype t, const void *codes,
		const float *scales, size_t n, size_t block, unsigned bits, int acc)
{
	struct nccl_be *b = c->be;
	int cur, rc = dev_enter(b, &cur);
	if (rc == 0) {
		rc = kern_status(
			kern_dequantize(b->stream, y, t, codes, scales, n, block, bits, acc),
			"kern_dequantize");
	}
	dev_leave(b, cur);
	return rc;
}

static int
nccl_narrow(struct zinf_comm *c, void *out, enum zinf_dtype t, const float *y, size_t n, float mul)
{
	struct nccl_be *b = c->be;
	int cur, rc = dev_enter(b, &cur);
	if (rc == 0 && mul != 1.0f) {
		rc = kern_status(kern_scale(b->stream, (void *)y, ZINF_F32, mul, n), "kern_scale");
	}
	if (rc == 0) {
		rc = kern_status(kern_cast(b->stream, out, t, y, ZINF_F32, n), "kern_cast");
	}
	dev_leave(b, cur);
	return rc;
}

const struct zinf_comm_ops zinf_comm_nccl_ops = {
	.name = "nccl",
	.req_size = sizeof(struct nccl_req),
	.open = nccl_open,
	.close = nccl_close,
	.start = nccl_start,
	.poll = nccl_poll,
	.abandon = nccl_abandon,
	.exchange = nccl_exchange,
	.native = nccl_native,
	.stream = nccl_stream,
	.notify = nccl_notify,
	.notice = nccl_notice,
	.failed = nccl_failed,
	.qalloc = nccl_qalloc,
	.qfree = nccl_qfree,
	.qscratch = nccl_qscratch,
	.qzero = nccl_qzero,
	.quantize = nccl_quantize,
	.dequantize = nccl_dequantize,
	.narrow = nccl_narrow,
};
