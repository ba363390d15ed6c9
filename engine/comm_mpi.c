/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/comm_mpi.c: the collectives over MPI, on host buffers, as non-blocking MPI_I* calls
 * that the generic layer polls with MPI_Test under each call's deadline. Also the MPI side
 * that the nccl backend reuses: joining the job (MPI_Init_thread when the program has not),
 * exchanging the call descriptors, broadcasting NCCL's unique id.
 *
 * The communicator is a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN, so that zinf's
 * calls never match the program's own and an MPI error is a return value, never an abort.
 * 16-bit reductions are widened to fp32 into a scratch buffer, reduced as MPI_FLOAT (MPI's
 * order of summation), divided by the world size for AVG, and rounded once to nearest even
 * into the caller's buffer when the request completes. Counts above INT_MAX elements are
 * refused (MPI counts are int): split the call. Not here: MPI_Abort (the library never ends
 * the process), cancelling a collective (MPI has no way to).
 */
#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "engine/comm_internal.h"

struct zinf_comm_mpi {
	MPI_Comm comm; /* dup of MPI_COMM_WORLD, MPI_ERRORS_RETURN */
	bool owns;     /* this communicator called MPI_Init_thread: it finalises MPI */
};

struct mpi_req {
	MPI_Request req;
	float *scratch; /* 16-bit reductions: the fp32 operands, then the fp32 result */
};

/* The one place MPI status codes become errnos: logs the call, file and line; -EIO. */
static int
mpi_status(int rc, const char *call, const char *file, int line)
{
	char text[MPI_MAX_ERROR_STRING];
	int len = 0;

	if (rc == MPI_SUCCESS) {
		return 0;
	}
	if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) {
		snprintf(text, sizeof(text), "MPI error %d", rc);
	}
	return zinf_log_emit(-EIO, ZINF_LOG_ERROR, file, line, "mpi", "%s failed: %s", call, text);
}
#define MPI_TRY(x) mpi_status((x), #x, __FILE__, __LINE__)

bool
zinf_comm_mpi_initialized(void)
{
	int init = 0, fin = 0;
	MPI_Initialized(&init);
	MPI_Finalized(&fin);
	return init && !fin;
}

int
zinf_comm_mpi_join(struct zinf_comm *c, struct zinf_comm_mpi **out)
{
	struct zinf_comm_mpi *m;
	MPI_Comm node;
	int init = 0, fin = 0, provided, rc;

	MPI_Initialized(&init);
	MPI_Finalized(&fin);
	if (fin) {
		return ZINF_FAIL(
			-ENODEV,
			"comm %s: MPI was finalised already (by the program, or by the "
			"zinf communicator that initialised it); MPI cannot be initialised "
			"twice in a process: initialise it in the program",
			c->ops->name);
	}
	m = zinf_calloc(1, sizeof(*m));
	if (!m) {
		return ZINF_FAIL(-ENOMEM, "comm %s: out of memory", c->ops->name);
	}
	if (!init) {
		rc = MPI_TRY(MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided));
		if (rc < 0) {
			goto err_free;
		}
		m->owns = true;
	}
	rc = MPI_TRY(MPI_Comm_dup(MPI_COMM_WORLD, &m->comm));
	if (rc < 0) {
		goto err_fini;
	}
	rc = MPI_TRY(MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN));
	if (!rc) {
		rc = MPI_TRY(MPI_Comm_rank(m->comm, &c->rank));
	}
	if (!rc) {
		rc = MPI_TRY(MPI_Comm_size(m->comm, &c->world));
	}
	if (!rc) {
		rc = MPI_TRY(MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL,
						 &node));
	}
	if (!rc) {
		rc = MPI_TRY(MPI_Comm_rank(node, &c->local_rank));
		MPI_Comm_free(&node);
	}
	if (rc < 0) {
		goto err_dup;
	}
	*out = m;
	return 0;

err_dup:
	MPI_Comm_free(&m->comm);
err_fini:
	if (m->owns) {
		MPI_Finalize();
	}
err_free:
	zinf_free(m);
	return rc;
}

void
zinf_comm_mpi_leave(struct zinf_comm_mpi *m, bool failed)
{
	if (!m) {
		return;
	}
	/*
	 * After a timeout another rank may never reach MPI_Finalize's synchronisation, and a
	 * collective of ours is still posted: freeing or finalising could wait forever. Leave
	 * MPI as it is; the process is told to exit.
	 */
	if (!failed) {
		MPI_Comm_free(&m->comm);
		if (m->owns) {
			MPI_Finalize();
		}
	}
	zinf_free(m);
}

/* Poll q until it completes or deadline_ns passes (-ETIMEDOUT, q left posted). */
static int
poll_until(MPI_Request *q, const char *what, uint64_t deadline_ns)
{
	unsigned spins = 0;
	int flag = 0;

	for (;;) {
		int rc = MPI_TRY(MPI_Test(q, &flag, MPI_STATUS_IGNORE));
		if (rc < 0 || flag) {
			return rc;
		}
		if (zinf_now_ns() > deadline_ns) {
			return -ETIMEDOUT; /* the caller names the call */
		}
		zinf_comm_backoff(&spins);
	}
}

int
zinf_comm_mpi_exchange(struct zinf_comm_mpi *m, const void *mine, void *all, size_t bytes,
		       const char *what, uint64_t deadline_ns)
{
	MPI_Request q;
	int rc = MPI_TRY(
		MPI_Iallgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, m->comm, &q));
	return rc < 0 ? rc : poll_until(&q, what, deadline_ns);
}

int
zinf_comm_mpi_bcast_bytes(struct zinf_comm_mpi *m, void *buf, size_t bytes, const char *what,
			  uint64_t deadline_ns)
{
	MPI_Request q;
	int rc = MPI_TRY(MPI_Ibcast(buf, (int)bytes, MPI_BYTE, 0, m->comm, &q));
	return rc < 0 ? rc : poll_until(&q, what, deadline_ns);
}

/* ---- the mpi backend ---------------------------------------------------------------------- */

static int
mpi_open(struct zinf_comm *c)
{
	return zinf_comm_mpi_join(c, (struct zinf_comm_mpi **)&c->be);
}

static void
mpi_close(struct zinf_comm *c)
{
	zinf_comm_mpi_leave(c->be, c->failed != 0);
}

/* Widen n elements of a 16-bit src into a new fp32 scratch buffer. */
static int
widen(struct mpi_req *q, const void *src, enum zinf_dtype dtype, size_t n)
{
	q->scratch = zinf_malloc(ZINF_MAX(n, 1) * sizeof(float));
	if (!q->scratch) {
		return ZINF_FAIL(-ENOMEM, "comm mpi: out of memory for %zu fp32 elements", n);
	}
	return zinf_dtype_convert(q->scratch, ZINF_F32, src, dtype, n);
}

/*
 * Post a reduction. f32 reduces in the caller's buffers; 16-bit types reduce an fp32 copy in
 * place (the reduce-scatter result is the first count elements of the scratch buffer).
 */
static int
start_reduce(struct zinf_comm *c, struct zinf_comm_req *r, struct mpi_req *q, int count)
{
	struct zinf_comm_mpi *m = c->be;
	MPI_Op op = r->d.red == ZINF_COMM_MAX ? MPI_MAX : MPI_SUM;
	bool scatter = r->d.kind == ZINF_COMM_REDUCE_SCATTER;
	size_t n = (size_t)count * (scatter ? (size_t)c->world : 1);
	int rc;

	if (r->d.dtype != ZINF_F32) {
		rc = widen(q, r->send, r->d.dtype, n);
		if (rc < 0) {
			return rc;
		}
		return scatter ? MPI_TRY(MPI_Ireduce_scatter_block(MPI_IN_PLACE, q->scratch, count,
								   MPI_FLOAT, op, m->comm, &q->req))
			       : MPI_TRY(MPI_Iallreduce(MPI_IN_PLACE, q->scratch, count, MPI_FLOAT,
							op, m->comm, &q->req));
	}
	return scatter ? MPI_TRY(MPI_Ireduce_scatter_block(r->send, r->recv, count, MPI_FLOAT, op,
							   m->comm, &q->req))
		       : MPI_TRY(MPI_Iallreduce(MPI_IN_PLACE, r->recv, count, MPI_FLOAT, op,
						m->comm, &q->req));
}

static int
mpi_start(struct zinf_comm *c, struct zinf_comm_req *r)
{
	struct zinf_comm_mpi *m = c->be;
	struct mpi_req *q = (struct mpi_req *)r->priv;
	MPI_Datatype t = r->d.dtype == ZINF_F32 ? MPI_FLOAT : MPI_UINT16_T;
	size_t es = zinf_dtype_size(r->d.dtype);
	int rc, count = (int)r->d.count;

	if (r->d.count > INT_MAX) {
		return ZINF_FAIL(-EINVAL,
				 "comm mpi: %s of %llu elements: MPI counts are int (at most %d): "
				 "split the call",
				 zinf_comm_kind_name(r->d.kind), (unsigned long long)r->d.count,
				 INT_MAX);
	}
	switch (r->d.kind) {
	case ZINF_COMM_ALL_GATHER: {
		const char *mine = (const char *)r->recv + (size_t)c->rank * r->d.count * es;
		const void *send = r->send == mine ? MPI_IN_PLACE : r->send;
		return MPI_TRY(MPI_Iallgather(send, count, t, r->recv, count, t, m->comm, &q->req));
	}
	case ZINF_COMM_REDUCE_SCATTER:
	case ZINF_COMM_ALL_REDUCE:
		rc = start_reduce(c, r, q, count);
		if (rc < 0) {
			zinf_free(q->scratch);
			q->scratch = NULL;
		}
		return rc;
	case ZINF_COMM_BROADCAST:
		return MPI_TRY(MPI_Ibcast(r->recv, count, t, r->d.root, m->comm, &q->req));
	case ZINF_COMM_BARRIER:
		return MPI_TRY(MPI_Ibarrier(m->comm, &q->req));
	}
	return ZINF_FAIL(-EINVAL, "comm mpi: collective kind %d unknown", r->d.kind);
}

/* The request completed: AVG divides the fp32 sum once; 16-bit results are rounded once. */
static int
finish(struct zinf_comm *c, struct zinf_comm_req *r, struct mpi_req *q)
{
	size_t n = r->d.count;
	float *x = q->scratch ? q->scratch : r->recv;
	int rc = 0;

	if (r->d.kind != ZINF_COMM_REDUCE_SCATTER && r->d.kind != ZINF_COMM_ALL_REDUCE) {
		return 0;
	}
	if (r->d.red == ZINF_COMM_AVG) {
		for (size_t i = 0; i < n; i++) {
			x[i] /= (float)c->world;
		}
	}
	if (q->scratch) {
		rc = zinf_dtype_convert(r->recv, r->d.dtype, q->scratch, ZINF_F32, n);
		zinf_free(q->scratch);
		q->scratch = NULL;
	}
	return rc;
}

static int
mpi_poll(struct zinf_comm *c, struct zinf_comm_req *r)
{
	struct mpi_req *q = (struct mpi_req *)r->priv;
	int flag = 0;
	int rc = MPI_TRY(MPI_Test(&q->req, &flag, MPI_STATUS_IGNORE));
	if (rc < 0) {
		return rc;
	}
	if (!flag) {
		return 0;
	}
	rc = finish(c, r, q);
	return rc < 0 ? rc : 1;
}

static void
mpi_abandon(struct zinf_comm *c, struct zinf_comm_req *r)
{
	/* MPI still owns the request and may write q->scratch: both are left to it. */
}

static int
mpi_exchange(struct zinf_comm *c, const struct zinf_comm_desc *mine, struct zinf_comm_desc *all,
	     uint64_t deadline_ns)
{
	return zinf_comm_mpi_exchange(c->be, mine, all, sizeof(*mine), "call check", deadline_ns);
}

static void *
mpi_native(struct zinf_comm *c)
{
	return &((struct zinf_comm_mpi *)c->be)->comm;
}

const struct zinf_comm_ops zinf_comm_mpi_ops = {
	.name = "mpi",
	.req_size = sizeof(struct mpi_req),
	.open = mpi_open,
	.close = mpi_close,
	.start = mpi_start,
	.poll = mpi_poll,
	.abandon = mpi_abandon,
	.exchange = mpi_exchange,
	.native = mpi_native,
};
