/* SPDX-License-Identifier: Apache-2.0 */
/*
 * comm/comm_mpi.c: the collectives over MPI, on host buffers. Also the MPI side that the
 * nccl backend reuses: joining the job (MPI_Init_thread when the program has not), exchanging
 * the call descriptors, broadcasting NCCL's unique id.
 *
 * Two ways to run a collective, chosen once per communicator (every rank agrees):
 * - progress thread (MPI_THREAD_MULTIPLE provided): the blocking call (MPI_Allgather,
 *   MPI_Reduce_scatter_block, MPI_Allreduce, MPI_Bcast, MPI_Barrier; MPI_Alltoallv for the
 *   quantized collectives' all_to_all, comm_quant.c) runs on a thread of the
 *   communicator's own, in call order (a FIFO: collectives are called in the same order on
 *   every rank), on a duplicate of MPI_COMM_WORLD used by nothing else; a request completes
 *   when the thread returns from the call, and the waiter sleeps on a condition variable
 *   meanwhile. Open MPI's blocking calls use its tuned algorithms, which the non-blocking ones
 *   (libnbc) do not: all_reduce twice as fast with 2 ranks (bench/RESULTS.md).
 * - non-blocking (all_gather, whose MPI_Iallgather measured at par with or faster than the
 *   blocking call; every kind below MPI_THREAD_MULTIPLE or with ZINF_COMM_MPI_PROGRESS=0):
 *   MPI_I* calls on the check's duplicate that the generic layer polls with MPI_Test under
 *   each call's deadline. ZINF_COMM_MPI_PROGRESS=all puts all_gather on the thread too.
 * The call check (opts.check) exchanges descriptors on another duplicate, so that it never
 * interleaves with the thread's calls. A call stuck in a blocking MPI call cannot be
 * cancelled: past its deadline the communicator is failed, and destroy leaves the thread (it
 * exits if its call ever returns) instead of joining it.
 *
 * Failure notices (zinf_comm_notify_failure) travel on a duplicate of their own: one 512-byte
 * MPI_Isend per other rank, taken with MPI_Iprobe + MPI_Recv by the generic layer's waits; the
 * nccl backend shares them through comm_mpi_notify/notice.
 * The communicators are duplicates of MPI_COMM_WORLD with MPI_ERRORS_RETURN, so that zinf's
 * calls never match the program's own and an MPI error is a return value, never an abort.
 * 16-bit reductions are widened to fp32 into a scratch buffer (cached per communicator,
 * grow-only, freed at destroy), reduced as MPI_FLOAT (MPI's order of summation), divided by
 * the world size for AVG, and rounded once to nearest even into the caller's buffer when the
 * request completes. Counts above INT_MAX elements are refused (MPI counts are int): split
 * the call. Not here: MPI_Abort (the library never ends the process), cancelling a collective
 * (MPI has no way to).
 */
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/dtype.h"
#include "comm/comm_internal.h"

struct zinf_comm_mpi {
	MPI_Comm comm; /* dup of MPI_COMM_WORLD, MPI_ERRORS_RETURN: the check, non-blocking calls */
	MPI_Comm notice; /* another dup: failure notices only (point to point, tag 0) */
	bool owns;	 /* this communicator called MPI_Init_thread: it finalises MPI */
	int level;	 /* the thread level MPI provides */
	struct zinf_comm_notice *sent; /* this rank's notice, while its sends may use it */
	MPI_Request *sends;	       /* one per rank (MPI_REQUEST_NULL for this one) */
	int nsends;
	uint64_t id;		/* this communicator's, in its notices: one of a communicator
				   before (sent after this rank freed it, so that MPI gave it to a
				   later one with the same context id) is dropped */
	uint64_t probe_next_ns; /* poll_until: the next look for a notice */
	MPI_Request xq;		/* the exchange a notice interrupted, resumed by the next call */
	bool x_posted;
};

/* One blocking call for the progress thread; shared by the thread and the request. */
struct job {
	struct job *next;
	int kind; /* enum zinf_comm_kind */
	const void *send;
	void *recv;
	int count, root;
	const int *a2a; /* all_to_all: counts and displacements, 4 x world ints (the request's) */
	MPI_Datatype type;
	MPI_Op op;
	int mpi_rc; /* the call's MPI status, once done */
	bool done;
	bool abandoned; /* the request gave it up: skip it if not started */
	int refs;	/* 2 at the start (thread, request); freed by whoever drops the last */
};

/* The progress thread of one communicator; everything below mu is guarded by it. */
struct progress {
	pthread_t thread;
	MPI_Comm comm; /* its own dup of MPI_COMM_WORLD: no other call uses it */
	pthread_mutex_t mu;
	pthread_cond_t work; /* a job queued, or stop */
	pthread_cond_t done; /* a job done */
	struct job *head, *tail;
	bool busy;     /* inside an MPI call */
	bool stop;     /* exit once the queue is empty (abandoned jobs skipped) */
	bool orphaned; /* the communicator is gone: the thread frees this on exit */
};

#define SCRATCH_SLOTS 4

/* The mpi backend's state (c->be). */
struct mpi_be {
	struct zinf_comm_mpi *m;
	struct progress *pt; /* NULL: non-blocking calls only */
	unsigned
		thread_kinds; /* 1 << enum zinf_comm_kind: the kinds pt runs; others non-blocking */
	/* fp32 scratch not in use: grow-only, freed at destroy; touched by the caller only */
	float *scratch[SCRATCH_SLOTS];
	size_t scratch_n[SCRATCH_SLOTS]; /* their capacities, elements */
	int nscratch;
};

struct mpi_req {
	MPI_Request req;  /* non-blocking path */
	struct job *job;  /* progress thread path */
	float *scratch;	  /* 16-bit reductions: the fp32 operands, then the fp32 result */
	int *a2a;	  /* all_to_all: MPI_Alltoallv's counts and displacements */
	size_t scratch_n; /* its capacity, elements */
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
	return zc_log_emit(-EIO, ZINF_LOG_ERROR, file, line, "mpi", "%s failed: %s", call, text);
}
#define MPI_TRY(x) mpi_status((x), #x, __FILE__, __LINE__)

bool
comm_mpi_initialized(void)
{
	int init = 0, fin = 0;
	MPI_Initialized(&init);
	MPI_Finalized(&fin);
	return init && !fin;
}

int
comm_mpi_join(struct zinf_comm *c, struct zinf_comm_mpi **out)
{
	struct zinf_comm_mpi *m;
	MPI_Comm node;
	int init = 0, fin = 0, provided, rc, node_first = -1;

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
	m = zc_calloc(1, sizeof(*m));
	if (!m) {
		return ZINF_FAIL(-ENOMEM, "comm %s: out of memory", c->ops->name);
	}
	if (!init) {
		rc = MPI_TRY(MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &provided));
		if (rc < 0) {
			goto err_free;
		}
		m->owns = true;
	} else {
		rc = MPI_TRY(MPI_Query_thread(&provided));
		if (rc < 0) {
			goto err_free;
		}
	}
	m->level = provided;
	if (provided < MPI_THREAD_SERIALIZED) {
		/* zinf calls MPI from whichever thread calls zinf: with FUNNELED that must be the
		 * thread that initialised MPI, with SINGLE the process must have no other thread */
		ZINF_WARN("comm %s: MPI provides thread level %s (below SERIALIZED): call zinf's "
			  "collectives only from the thread that initialised MPI",
			  c->ops->name, provided == MPI_THREAD_SINGLE ? "SINGLE" : "FUNNELED");
	}
	rc = MPI_TRY(MPI_Comm_dup(MPI_COMM_WORLD, &m->comm));
	if (rc < 0) {
		goto err_fini;
	}
	rc = MPI_TRY(MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN));
	if (!rc) {
		rc = MPI_TRY(MPI_Comm_dup(m->comm, &m->notice)); /* inherits ERRORS_RETURN */
	}
	if (rc < 0) {
		goto err_dup;
	}
	rc = MPI_TRY(MPI_Comm_rank(m->comm, &c->rank));
	if (!rc) {
		rc = MPI_TRY(MPI_Comm_size(m->comm, &c->world));
	}
	if (!rc) {
		rc = MPI_TRY(MPI_Comm_split_type(m->comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL,
						 &node));
	}
	if (!rc) {
		rc = MPI_TRY(MPI_Comm_rank(node, &c->local_rank));
		if (!rc) {
			rc = MPI_TRY(MPI_Comm_size(node, &c->local_world));
		}
		if (!rc) { /* the node's lowest world rank: where its ranks start if consecutive */
			rc = MPI_TRY(
				MPI_Allreduce(&c->rank, &node_first, 1, MPI_INT, MPI_MIN, node));
		}
		MPI_Comm_free(&node);
	}
	/*
	 * Rank 0's clock as the id (distinct for every communicator of the job, the same on all),
	 * and whether every rank asked for the call check: a rank checking and one not would post
	 * different first collectives (the check's exchange against the data), so a difference is
	 * refused here, on every rank.
	 */
	/* ... and the nodes' shape (comm_node_group): the largest and smallest local_world (as
	 * the largest INT_MAX - local_world) and whether any node's ranks are not consecutive */
	uint64_t v[6] = {
		c->rank == 0 ? zinf_now_ns() : 0,
		c->opts.check,
		!c->opts.check,
		(uint64_t)c->local_world,
		(uint64_t)(INT_MAX - c->local_world),
		!comm_node_consecutive(c->rank, node_first, c->local_rank, c->local_world)};
	if (!rc) {
		rc = MPI_TRY(MPI_Allreduce(MPI_IN_PLACE, v, 6, MPI_UINT64_T, MPI_MAX, m->comm));
		m->id = v[0];
		c->node_group = comm_node_group(c->world, INT_MAX - (int)v[4], (int)v[3], !v[5]);
	}
	if (!rc && v[1] && v[2]) {
		rc = ZINF_FAIL(-EINVAL,
			       "comm %s rank %d: comm_check (zinf_comm_opts.check) is %s here and "
			       "%s on another rank: every rank must ask the same",
			       c->ops->name, c->rank, c->opts.check ? "on" : "off",
			       c->opts.check ? "off" : "on");
	}
	if (rc < 0) {
		goto err_notice;
	}
	*out = m;
	return 0;

err_notice:
	MPI_Comm_free(&m->notice);
err_dup:
	MPI_Comm_free(&m->comm);
err_fini:
	if (m->owns) {
		MPI_Finalize();
	}
err_free:
	zc_free(m);
	return rc;
}

/* ---- failure notices ---------------------------------------------------------------------- */

/*
 * The buffer of this rank's notice: a send not complete when the communicator goes is left to
 * MPI (MPI_Request_free), and so is the buffer it reads (notice_sends_end: zc_leave).
 */
static struct zinf_comm_notice *
notice_alloc(void)
{
	return zc_malloc(sizeof(struct zinf_comm_notice));
}

int
comm_mpi_notify(struct zinf_comm_mpi *m, int rank, int world, const struct zinf_comm_notice *n)
{
	int rc = 0;

	if (m->sent || world < 2) {
		return 0; /* once: the first failure is the one the others hear of */
	}
	m->sent = notice_alloc();
	m->sends = zc_calloc((size_t)world, sizeof(MPI_Request));
	if (!m->sent || !m->sends) {
		zc_free(m->sent);
		zc_free(m->sends);
		m->sent = NULL;
		m->sends = NULL;
		return ZINF_FAIL(-ENOMEM, "comm rank %d: out of memory for the failure notice",
				 rank);
	}
	*m->sent = *n;
	m->sent->comm_id = m->id;
	m->nsends = world;
	for (int r = 0; r < world; r++) {
		m->sends[r] = MPI_REQUEST_NULL;
		if (r != rank && rc == 0) {
			rc = MPI_TRY(MPI_Isend(m->sent, (int)sizeof(*n), MPI_BYTE, r, 0, m->notice,
					       &m->sends[r]));
		}
	}
	return rc;
}

int
comm_mpi_notice(struct zinf_comm_mpi *m, struct zinf_comm_notice *n)
{
	for (;;) {
		MPI_Status st;
		int flag = 0;
		int rc = MPI_TRY(MPI_Iprobe(MPI_ANY_SOURCE, 0, m->notice, &flag, &st));
		if (rc < 0 || !flag) {
			return rc;
		}
		rc = MPI_TRY(MPI_Recv(n, (int)sizeof(*n), MPI_BYTE, st.MPI_SOURCE, 0, m->notice,
				      MPI_STATUS_IGNORE));
		if (rc < 0 || n->comm_id == m->id) {
			return rc < 0 ? rc : 1;
		}
		/* a communicator's before, freed here before its notice came: not this one's */
	}
}

/* Whether a notice waits (looked for at most every millisecond); taken by the caller. */
static bool
notice_waiting(struct zinf_comm_mpi *m)
{
	uint64_t now = zinf_now_ns();
	int flag = 0;
	if (now < m->probe_next_ns) {
		return false;
	}
	m->probe_next_ns = now + 1000000u;
	return MPI_Iprobe(MPI_ANY_SOURCE, 0, m->notice, &flag, MPI_STATUS_IGNORE) == MPI_SUCCESS &&
	       flag;
}

/*
 * The notice's sends at the end: complete (a 512-byte message is sent eagerly: done once
 * posted), else left to MPI to finish (MPI_Request_free), with their buffer. Never waits.
 */
static void
notice_sends_end(struct zinf_comm_mpi *m)
{
	int done = 1;
	if (!m->sends) {
		return;
	}
	if (MPI_Testall(m->nsends, m->sends, &done, MPI_STATUSES_IGNORE) != MPI_SUCCESS) {
		done = 0;
	}
	for (int r = 0; !done && r < m->nsends; r++) {
		if (m->sends[r] != MPI_REQUEST_NULL) {
			MPI_Request_free(&m->sends[r]);
		}
	}
	if (done) {
		zc_free(m->sent);
	} else {
		zc_leave(m->sent); /* MPI's until its sends complete */
	}
	zc_free(m->sends);
	m->sent = NULL;
	m->sends = NULL;
}

void
comm_mpi_leave(struct zinf_comm_mpi *m, bool failed)
{
	if (!m) {
		return;
	}
	/*
	 * After a timeout another rank may never reach MPI_Finalize's synchronisation, and a
	 * collective of ours is still posted: freeing or finalising could wait forever. Leave
	 * MPI as it is; the process is told to exit.
	 */
	notice_sends_end(m);
	/*
	 * The notices' duplicate is never freed (MPI_Finalize frees it): a notice no call here took
	 * (another rank's leaving or failure, sent while this rank was ending too) stays in it. On
	 * a freed communicator MPI would match such a message on the next one given its context id,
	 * and Open MPI's per-peer ordering would then hold that one's own messages back (seen:
	 * notices lost, a segfault in a later MPI_Allreduce).
	 */
	if (!failed) {
		MPI_Comm_free(&m->comm);
		if (m->owns) {
			MPI_Finalize();
		}
	}
	zc_free(m);
}

/*
 * Poll q until it completes or deadline_ns passes (-ETIMEDOUT, q left posted), or another rank's
 * failure notice waits (-ECONNABORTED, q left posted, the notice left for the caller to take).
 */
static int
poll_until(struct zinf_comm_mpi *m, MPI_Request *q, uint64_t deadline_ns)
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
		if (notice_waiting(m)) {
			return -ECONNABORTED;
		}
		comm_backoff(&spins);
	}
}

/* A call that returned -ECONNABORTED (a notice waits) is resumed by the next call, which must
 * pass the same buffers; any other result ends it (-ETIMEDOUT: left posted). */
int
comm_mpi_exchange(struct zinf_comm_mpi *m, const void *mine, void *all, size_t bytes,
		  const char *what, uint64_t deadline_ns)
{
	if (!m->x_posted) {
		int rc = MPI_TRY(MPI_Iallgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes,
						MPI_BYTE, m->comm, &m->xq));
		if (rc < 0) {
			return rc;
		}
		m->x_posted = true;
	}
	int rc = poll_until(m, &m->xq, deadline_ns);
	m->x_posted = rc == -ECONNABORTED;
	return rc;
}

int
comm_mpi_bcast_bytes(struct zinf_comm_mpi *m, void *buf, size_t bytes, const char *what,
		     uint64_t deadline_ns)
{
	MPI_Request q;
	int rc = MPI_TRY(MPI_Ibcast(buf, (int)bytes, MPI_BYTE, 0, m->comm, &q));
	return rc < 0 ? rc : poll_until(m, &q, deadline_ns);
}

/* ---- the progress thread ---------------------------------------------------------------- */

/* Drop one reference to j (mu held). */
static void
job_put(struct job *j)
{
	if (--j->refs == 0) {
		zc_free(j);
	}
}

static int
job_run(struct job *j, MPI_Comm comm)
{
	switch (j->kind) {
	case ZINF_COMM_ALL_GATHER:
		return MPI_Allgather(j->send, j->count, j->type, j->recv, j->count, j->type, comm);
	case ZINF_COMM_REDUCE_SCATTER:
		return MPI_Reduce_scatter_block(j->send, j->recv, j->count, j->type, j->op, comm);
	case ZINF_COMM_ALL_REDUCE:
		return MPI_Allreduce(j->send, j->recv, j->count, j->type, j->op, comm);
	case ZINF_COMM_BROADCAST:
		return MPI_Bcast(j->recv, j->count, j->type, j->root, comm);
	case ZINF_COMM_ALL_TO_ALL: {
		int w = j->root; /* the world size, for the four arrays */
		return MPI_Alltoallv(j->send, j->a2a, j->a2a + w, j->type, j->recv, j->a2a + 2 * w,
				     j->a2a + 3 * w, j->type, comm);
	}
	default:
		return MPI_Barrier(comm);
	}
}

static void
progress_free(struct progress *pt)
{
	pthread_cond_destroy(&pt->done);
	pthread_cond_destroy(&pt->work);
	pthread_mutex_destroy(&pt->mu);
	zc_free(pt);
}

/*
 * The thread: one blocking call at a time, in queue order. It logs nothing (the waiter names
 * the call and converts the MPI status). When the communicator was destroyed while a call of
 * ours hung (orphaned), the thread frees the shared state itself if the call ever returns.
 */
static void *
progress_main(void *arg)
{
	struct progress *pt = arg;

	pthread_mutex_lock(&pt->mu);
	for (;;) {
		while (!pt->head && !pt->stop) {
			pthread_cond_wait(&pt->work, &pt->mu);
		}
		struct job *j = pt->head;
		if (!j) {
			break; /* stop, and nothing queued */
		}
		pt->head = j->next;
		if (!pt->head) {
			pt->tail = NULL;
		}
		if (j->abandoned || pt->stop) {
			/* given up before it started (the communicator failed): not run */
			j->mpi_rc = MPI_ERR_OTHER;
		} else {
			pt->busy = true;
			pthread_mutex_unlock(&pt->mu);
			int rc = job_run(j, pt->comm);
			pthread_mutex_lock(&pt->mu);
			pt->busy = false;
			j->mpi_rc = rc;
		}
		j->done = true;
		job_put(j);
		pthread_cond_broadcast(&pt->done);
	}
	bool orphaned = pt->orphaned;
	pthread_mutex_unlock(&pt->mu);
	if (orphaned) {
		progress_free(pt);
	}
	return NULL;
}

/* Start c's progress thread on a new duplicate of MPI_COMM_WORLD (collective). */
static int
progress_start(struct zinf_comm *c, struct progress **out)
{
	pthread_condattr_t ca;
	struct progress *pt = zc_calloc(1, sizeof(*pt));
	int rc;

	if (!pt) {
		return ZINF_FAIL(-ENOMEM, "comm mpi rank %d: out of memory", c->rank);
	}
	rc = MPI_TRY(MPI_Comm_dup(MPI_COMM_WORLD, &pt->comm));
	if (rc < 0) {
		goto err_free;
	}
	rc = MPI_TRY(MPI_Comm_set_errhandler(pt->comm, MPI_ERRORS_RETURN));
	if (rc < 0) {
		goto err_comm;
	}
	/* waits end at deadlines of zinf_now_ns(), which is CLOCK_MONOTONIC */
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_mutex_init(&pt->mu, NULL);
	pthread_cond_init(&pt->work, NULL);
	pthread_cond_init(&pt->done, &ca);
	pthread_condattr_destroy(&ca);
	rc = -pthread_create(&pt->thread, NULL, progress_main, pt);
	if (rc < 0) {
		ZINF_FAIL(rc, "comm mpi rank %d: cannot start the progress thread", c->rank);
		pthread_cond_destroy(&pt->done);
		pthread_cond_destroy(&pt->work);
		pthread_mutex_destroy(&pt->mu);
		goto err_comm;
	}
	*out = pt;
	return 0;

err_comm:
	MPI_Comm_free(&pt->comm);
err_free:
	zc_free(pt);
	return rc;
}

/*
 * Stop the thread. Not failed: the queue is empty (destroy completed every request): join it
 * and free its communicator. Failed: a call of ours may hang in MPI for good, so neither join
 * nor free what could wait on another rank; an idle thread is joined, a busy one is left to
 * free the state itself if its call returns.
 */
static void
progress_stop(struct progress *pt, bool failed)
{
	pthread_mutex_lock(&pt->mu);
	pt->stop = true;
	bool busy = pt->busy;
	pt->orphaned = failed && busy;
	pthread_cond_signal(&pt->work);
	pthread_mutex_unlock(&pt->mu);
	if (failed && busy) {
		pthread_detach(pt->thread);
		return;
	}
	pthread_join(pt->thread, NULL);
	if (!failed) {
		MPI_Comm_free(&pt->comm);
	}
	progress_free(pt);
}

/* ---- the mpi backend ---------------------------------------------------------------------- */

extern const struct zinf_comm_ops zinf_comm_mpi_ops;

bool
comm_mpi_progress(const struct zinf_comm *c)
{
	return c && c->ops == &zinf_comm_mpi_ops && c->be && ((struct mpi_be *)c->be)->pt;
}

/*
 * Which kinds run on the progress thread (a mask of 1 << enum zinf_comm_kind; 0: no thread).
 * With MPI_THREAD_MULTIPLE on every rank: every kind but all_gather, whose non-blocking call
 * measured at par or faster than the blocking one here (bench/RESULTS.md, "Collectives and PCIe");
 * ZINF_COMM_MPI_PROGRESS=all puts all_gather on the thread too, =0 none. Every rank must agree
 * (the thread's duplicate communicator is created collectively): the minimum is taken.
 */
static int
progress_kinds(struct zinf_comm *c, struct mpi_be *b, unsigned *out)
{
	const unsigned every = (1u << (ZINF_COMM_ALL_TO_ALL + 1)) - 1;
	const char *env = getenv("ZINF_COMM_MPI_PROGRESS");
	bool off = env && strcmp(env, "0") == 0, all_kinds = env && strcmp(env, "all") == 0;
	int mine = b->m->level < MPI_THREAD_MULTIPLE || off ? 0
		   : all_kinds				    ? (int)every
			       : (int)(every & ~(1u << ZINF_COMM_ALL_GATHER));
	int agreed = 0;
	int rc = MPI_TRY(MPI_Allreduce(&mine, &agreed, 1, MPI_INT, MPI_MIN, b->m->comm));
	if (rc < 0) {
		return rc;
	}
	*out = (unsigned)agreed;
	if (!agreed && c->rank == 0) {
		ZINF_INFO("comm mpi: collectives are non-blocking MPI calls, not a progress thread "
			  "(%s)",
			  off	 ? "ZINF_COMM_MPI_PROGRESS=0"
			  : mine ? "a rank's MPI provides less than MPI_THREAD_MULTIPLE"
				 : "MPI provides less than MPI_THREAD_MULTIPLE");
	}
	return 0;
}

static int
mpi_open(struct zinf_comm *c)
{
	struct mpi_be *b = zc_calloc(1, sizeof(*b));
	int rc;

	if (!b) {
		return ZINF_FAIL(-ENOMEM, "comm mpi: out of memory");
	}
	rc = comm_mpi_join(c, &b->m);
	if (rc < 0) {
		goto err_free;
	}
	rc = progress_kinds(c, b, &b->thread_kinds);
	if (rc == 0 && b->thread_kinds) {
		rc = progress_start(c, &b->pt);
	}
	if (rc < 0) {
		goto err_leave;
	}
	c->be = b;
	return 0;

err_leave:
	comm_mpi_leave(b->m, false);
err_free:
	zc_free(b);
	return rc;
}

static void
mpi_close(struct zinf_comm *c)
{
	struct mpi_be *b = c->be;
	if (!b) {
		return;
	}
	if (b->pt) {
		progress_stop(b->pt, c->failed != 0);
	}
	for (int i = 0; i < b->nscratch; i++) {
		zc_free(b->scratch[i]);
	}
	comm_mpi_leave(b->m, c->failed != 0);
	zc_free(b);
}

/*
 * An fp32 scratch buffer of at least n elements from c's cache (the smallest that fits, else
 * the largest, grown), or a new one; back to the cache when the request completes.
 */
static int
scratch_take(struct mpi_be *b, struct mpi_req *q, size_t n)
{
	int best = -1;
	n = ZINF_MAX(n, 1);
	for (int i = 0; i < b->nscratch; i++) {
		bool fits = b->scratch_n[i] >= n;
		if (best < 0 ||
		    (fits && (b->scratch_n[best] < n || b->scratch_n[i] < b->scratch_n[best])) ||
		    (!fits && b->scratch_n[best] < n && b->scratch_n[i] > b->scratch_n[best])) {
			best = i;
		}
	}
	if (best >= 0) {
		q->scratch = b->scratch[best];
		q->scratch_n = b->scratch_n[best];
		b->scratch[best] = b->scratch[--b->nscratch];
		b->scratch_n[best] = b->scratch_n[b->nscratch];
		if (q->scratch_n >= n) {
			return 0;
		}
		zc_free(q->scratch); /* grow: its contents do not matter */
	}
	q->scratch = zc_malloc(n * sizeof(float));
	q->scratch_n = q->scratch ? n : 0;
	return q->scratch ? 0
			  : ZINF_FAIL(-ENOMEM, "comm mpi: out of memory for %zu fp32 elements", n);
}

/* Back to the cache (the smallest one goes when it is full). */
static void
scratch_give(struct mpi_be *b, struct mpi_req *q)
{
	if (!q->scratch) {
		return;
	}
	if (b->nscratch == SCRATCH_SLOTS) {
		int small = 0;
		for (int i = 1; i < b->nscratch; i++) {
			small = b->scratch_n[i] < b->scratch_n[small] ? i : small;
		}
		if (b->scratch_n[small] >= q->scratch_n) {
			zc_free(q->scratch);
			q->scratch = NULL;
			return;
		}
		zc_free(b->scratch[small]);
		b->scratch[small] = b->scratch[--b->nscratch];
		b->scratch_n[small] = b->scratch_n[b->nscratch];
	}
	b->scratch[b->nscratch] = q->scratch;
	b->scratch_n[b->nscratch++] = q->scratch_n;
	q->scratch = NULL;
}

/*
 * Widen n 16-bit elements to fp32, exactly; one loop per type, so that the compiler
 * vectorises it (zinf_dtype_convert dispatches per element).
 */
static void
widen(float *dst, const uint16_t *src, enum zinf_dtype t, size_t n)
{
	if (t == ZINF_BF16) {
		for (size_t i = 0; i < n; i++) {
			dst[i] = dt_bf16_to_f32(src[i]);
		}
	} else {
		for (size_t i = 0; i < n; i++) {
			dst[i] = dt_f16_to_f32(src[i]);
		}
	}
}

/* dst = the 16-bit rounding (nearest even) of src / div (div 1: no division), in one pass. */
static void
narrow(uint16_t *dst, enum zinf_dtype t, const float *src, size_t n, float div)
{
	if (t == ZINF_BF16 && div == 1.0f) {
		for (size_t i = 0; i < n; i++) {
			dst[i] = dt_f32_to_bf16_rne(src[i]);
		}
	} else if (t == ZINF_BF16) {
		for (size_t i = 0; i < n; i++) {
			dst[i] = dt_f32_to_bf16_rne(src[i] / div);
		}
	} else {
		for (size_t i = 0; i < n; i++) {
			dst[i] = dt_f32_to_f16_rne(src[i] / div);
		}
	}
}

/* The MPI call of r, as a job (the non-blocking path posts the same arguments). */
static int
make_call(struct zinf_comm *c, struct zinf_comm_req *r, struct mpi_req *q, struct job *j)
{
	size_t es = comm_elem_size(r->d.dtype);
	bool reduce = r->d.kind == ZINF_COMM_REDUCE_SCATTER || r->d.kind == ZINF_COMM_ALL_REDUCE;
	int rc;

	j->kind = r->d.kind;
	j->count = (int)r->d.count;
	j->root = r->d.root;
	j->type = r->d.dtype == ZINF_F32  ? MPI_FLOAT
		  : r->d.dtype == COMM_U8 ? MPI_BYTE
					  : MPI_UINT16_T;
	j->op = r->d.red == ZINF_COMM_MAX ? MPI_MAX : MPI_SUM;
	j->send = r->send;
	j->recv = r->recv;
	if (r->d.kind == ZINF_COMM_ALL_GATHER) {
		const char *mine = (const char *)r->recv + (size_t)c->rank * r->d.count * es;
		j->send = r->send == mine ? MPI_IN_PLACE : r->send;
	} else if (r->d.kind == ZINF_COMM_ALL_REDUCE) {
		j->send = MPI_IN_PLACE;
	} else if (r->d.kind == ZINF_COMM_ALL_TO_ALL) {
		/* Alltoallv over the whole world, 0 bytes to the ranks outside the group */
		int w = c->world, n = r->d.a2a_n;
		if ((uint64_t)r->d.count * (uint64_t)n > INT_MAX) {
			return ZINF_FAIL(-EINVAL,
					 "comm mpi: all_to_all of %llu bytes to %d ranks: MPI "
					 "displacements are int",
					 (unsigned long long)r->d.count, n);
		}
		q->a2a = zc_calloc(4 * (size_t)w, sizeof(int));
		if (!q->a2a) {
			return ZINF_FAIL(-ENOMEM, "comm mpi: out of memory for all_to_all counts");
		}
		for (int i = 0; i < n; i++) {
			int p = comm_a2a_peer(c->rank, n, r->d.a2a_stride, i);
			q->a2a[p] = q->a2a[2 * w + p] = (int)r->d.count;
			q->a2a[w + p] = q->a2a[3 * w + p] = i * (int)r->d.count;
		}
		j->a2a = q->a2a;
		j->root = w;
	}
	if (!reduce || r->d.dtype == ZINF_F32) {
		return 0;
	}
	/* 16-bit: reduce an fp32 copy in place (the reduce-scatter result is its first count) */
	size_t n = r->d.count * (r->d.kind == ZINF_COMM_REDUCE_SCATTER ? (size_t)c->world : 1);
	rc = scratch_take(c->be, q, n);
	if (rc < 0) {
		return rc;
	}
	widen(q->scratch, r->send, r->d.dtype, n);
	j->type = MPI_FLOAT;
	j->send = MPI_IN_PLACE;
	j->recv = q->scratch;
	return 0;
}

static int
post_nonblocking(const struct job *j, MPI_Comm comm, MPI_Request *req)
{
	switch (j->kind) {
	case ZINF_COMM_ALL_GATHER:
		return MPI_TRY(MPI_Iallgather(j->send, j->count, j->type, j->recv, j->count,
					      j->type, comm, req));
	case ZINF_COMM_REDUCE_SCATTER:
		return MPI_TRY(MPI_Ireduce_scatter_block(j->send, j->recv, j->count, j->type, j->op,
							 comm, req));
	case ZINF_COMM_ALL_REDUCE:
		return MPI_TRY(
			MPI_Iallreduce(j->send, j->recv, j->count, j->type, j->op, comm, req));
	case ZINF_COMM_BROADCAST:
		return MPI_TRY(MPI_Ibcast(j->recv, j->count, j->type, j->root, comm, req));
	case ZINF_COMM_ALL_TO_ALL: {
		int w = j->root;
		return MPI_TRY(MPI_Ialltoallv(j->send, j->a2a, j->a2a + w, j->type, j->recv,
					      j->a2a + 2 * w, j->a2a + 3 * w, j->type, comm, req));
	}
	default:
		return MPI_TRY(MPI_Ibarrier(comm, req));
	}
}

static int
mpi_start(struct zinf_comm *c, struct zinf_comm_req *r)
{
	struct mpi_be *b = c->be;
	struct mpi_req *q = (struct mpi_req *)r->priv;
	struct job call = {0};
	int rc;

	if (r->d.count > INT_MAX) {
		return ZINF_FAIL(-EINVAL,
				 "comm mpi: %s of %llu elements: MPI counts are int (at most %d): "
				 "split the call",
				 comm_kind_name(r->d.kind), (unsigned long long)r->d.count,
				 INT_MAX);
	}
	if (r->d.kind < ZINF_COMM_ALL_GATHER || r->d.kind > ZINF_COMM_ALL_TO_ALL) {
		return ZINF_FAIL(-EINVAL, "comm mpi: collective kind %d unknown", r->d.kind);
	}
	rc = make_call(c, r, q, &call);
	if (rc < 0) {
		return rc;
	}
	if (!(b->thread_kinds & (1u << r->d.kind))) {
		rc = post_nonblocking(&call, b->m->comm, &q->req);
		if (rc < 0) {
			scratch_give(b, q);
			zc_free(q->a2a);
		}
		return rc;
	}
	struct job *j = zc_malloc(sizeof(*j));
	if (!j) {
		scratch_give(b, q);
		zc_free(q->a2a);
		return ZINF_FAIL(-ENOMEM, "comm mpi rank %d: out of memory", c->rank);
	}
	*j = call;
	j->refs = 2;
	q->job = j;
	pthread_mutex_lock(&b->pt->mu);
	if (b->pt->tail) {
		b->pt->tail->next = j;
	} else {
		b->pt->head = j;
	}
	b->pt->tail = j;
	pthread_cond_signal(&b->pt->work);
	pthread_mutex_unlock(&b->pt->mu);
	return 0;
}

/* The request completed: AVG divides the fp32 sum once; 16-bit results are rounded once. */
static void
finish(struct zinf_comm *c, struct zinf_comm_req *r, struct mpi_req *q)
{
	size_t n = r->d.count;
	float div = r->d.red == ZINF_COMM_AVG ? (float)c->world : 1.0f;

	if (r->d.kind != ZINF_COMM_REDUCE_SCATTER && r->d.kind != ZINF_COMM_ALL_REDUCE) {
		return;
	}
	if (q->scratch) {
		narrow(r->recv, r->d.dtype, q->scratch, n, div);
		scratch_give(c->be, q);
	} else if (div != 1.0f) {
		float *x = r->recv;
		for (size_t i = 0; i < n; i++) {
			x[i] /= div;
		}
	}
}

static int
mpi_poll(struct zinf_comm *c, struct zinf_comm_req *r)
{
	struct mpi_be *b = c->be;
	struct mpi_req *q = (struct mpi_req *)r->priv;
	int flag = 0, rc;

	if (q->job) {
		pthread_mutex_lock(&b->pt->mu);
		flag = q->job->done;
		int mpi_rc = q->job->mpi_rc;
		if (flag) {
			job_put(q->job);
			q->job = NULL;
		}
		pthread_mutex_unlock(&b->pt->mu);
		if (!flag) {
			return 0;
		}
		rc = mpi_status(mpi_rc, comm_kind_name(r->d.kind), __FILE__, __LINE__);
	} else {
		rc = MPI_TRY(MPI_Test(&q->req, &flag, MPI_STATUS_IGNORE));
	}
	if (rc < 0) {
		scratch_give(b, q); /* MPI is done with it */
		zc_free(q->a2a);
		q->a2a = NULL; /* comm.c drops the request next: abandon must not leave it */
		return rc;
	}
	if (!flag) {
		return 0;
	}
	zc_free(q->a2a);
	q->a2a = NULL;
	finish(c, r, q);
	return 1;
}

/*
 * Sleep until r's job is done or deadline_ns. The non-blocking path backs off between
 * MPI_Tests as before (MPI advances those only inside MPI calls).
 */
static void
mpi_block(struct zinf_comm *c, struct zinf_comm_req *r, uint64_t deadline_ns, unsigned *spins)
{
	struct mpi_be *b = c->be;
	struct mpi_req *q = (struct mpi_req *)r->priv;

	if (!q->job) {
		comm_backoff(spins);
		return;
	}
	/* in slices of 10 ms, so that the caller looks for another rank's failure notice */
	uint64_t until = ZINF_MIN(deadline_ns, zinf_now_ns() + 10000000u);
	struct timespec ts = {.tv_sec = (time_t)(until / 1000000000u),
			      .tv_nsec = (long)(until % 1000000000u)};
	pthread_mutex_lock(&b->pt->mu);
	while (!q->job->done && zinf_now_ns() < until) {
		pthread_cond_timedwait(&b->pt->done, &b->pt->mu, &ts);
	}
	pthread_mutex_unlock(&b->pt->mu);
}

static void
mpi_abandon(struct zinf_comm *c, struct zinf_comm_req *r)
{
	struct mpi_be *b = c->be;
	struct mpi_req *q = (struct mpi_req *)r->priv;
	/* MPI (or the thread) may still write q->scratch and read q->a2a: they are left to it. */
	if (q->a2a) {
		zc_leave(q->a2a);
	}
	if (q->job) {
		pthread_mutex_lock(&b->pt->mu);
		q->job->abandoned = true;
		job_put(q->job);
		pthread_mutex_unlock(&b->pt->mu);
		q->job = NULL;
	}
}

static int
mpi_exchange(struct zinf_comm *c, const struct zinf_comm_desc *mine, struct zinf_comm_desc *all,
	     uint64_t deadline_ns)
{
	struct mpi_be *b = c->be;
	return comm_mpi_exchange(b->m, mine, all, sizeof(*mine), "call check", deadline_ns);
}

static int
mpi_notify(struct zinf_comm *c, const struct zinf_comm_notice *n)
{
	return comm_mpi_notify(((struct mpi_be *)c->be)->m, c->rank, c->world, n);
}

static int
mpi_notice(struct zinf_comm *c, struct zinf_comm_notice *n)
{
	return comm_mpi_notice(((struct mpi_be *)c->be)->m, n);
}

static void *
mpi_native(struct zinf_comm *c)
{
	return &((struct mpi_be *)c->be)->m->comm;
}

const struct zinf_comm_ops zinf_comm_mpi_ops = {
	.name = "mpi",
	.req_size = sizeof(struct mpi_req),
	.max_u8 = INT_MAX,
	.open = mpi_open,
	.close = mpi_close,
	.start = mpi_start,
	.poll = mpi_poll,
	.block = mpi_block,
	.abandon = mpi_abandon,
	.exchange = mpi_exchange,
	.native = mpi_native,
	.notify = mpi_notify,
	.notice = mpi_notice,
};
