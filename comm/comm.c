/* SPDX-License-Identifier: Apache-2.0 */
/*
 * comm/comm.c: the generic side of the collectives (zinf/blocks/comm.h) and the backend registry.
 * It validates every call, numbers it, compares it across ranks when opts.check is on, puts a
 * deadline on it and fails the communicator past it, and heeds other ranks' failure notices
 * (zinf_comm_notify_failure) while it waits; the backends only post, poll and carry notices. The
 * registry at the bottom is the only place that knows which backends were built (MPI, NCCL):
 * one that was not answers -ENODEV. No MPI, NCCL or CUDA header is included here.
 */
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <time.h>

#include "common/opts.h"
#include "comm/comm_internal.h"

ZINF_OPTS_NO_TAIL_PAD(struct zinf_comm_opts, reserved);
_Static_assert(sizeof(struct zinf_comm_desc) == 32, "descriptors are exchanged as 32 bytes");
_Static_assert(sizeof(struct zinf_comm_notice) == 512, "notices are sent as 512 bytes");

/* A wait looks for another rank's failure notice at most this often (an MPI_Iprobe). */
#define NOTICE_PERIOD_NS 1000000u

double
comm_timeout_default(void)
{
	const char *s = getenv("ZINF_COMM_TIMEOUT_S");
	if (!s || !*s) {
		return 1800.0;
	}
	char *end;
	double v = strtod(s, &end);
	return *end == '\0' && v > 0.0 && v < 1e9 ? v : NAN; /* NaN: refused at create */
}

int
comm_timeout_check(double t, const char *who)
{
	if (t > 0.0 && t < 1e9) {
		return 0;
	}
	const char *s = getenv("ZINF_COMM_TIMEOUT_S");
	if (isnan(t) && s && *s) {
		return ZINF_FAIL(
			-EINVAL,
			"%s: ZINF_COMM_TIMEOUT_S=%s: expected seconds in (0, 1e9), e.g. 600", who,
			s);
	}
	return ZINF_FAIL(-EINVAL, "%s: comm_timeout_s %g must be in (0, 1e9) seconds", who, t);
}

void
zinf_comm_opts_init(struct zinf_comm_opts *o)
{
	if (!o) {
		return;
	}
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	o->timeout_s = comm_timeout_default();
	o->device = -1;
}

static const char *const kind_names[] = {"all_gather", "reduce_scatter", "all_reduce",
					 "broadcast",  "barrier",	 "all_to_all"};
static const char *const red_names[] = {"sum", "avg", "max"};

const char *
comm_kind_name(int kind)
{
	return kind >= 0 && kind < (int)ZINF_ARRAY_SIZE(kind_names) ? kind_names[kind] : "?";
}

int
comm_node_group(int world, int lw_min, int lw_max, bool all_consecutive)
{
	if (lw_min != lw_max || lw_min < 1 || !all_consecutive || world % lw_min != 0) {
		return world;
	}
	return lw_min;
}

bool
comm_node_consecutive(int rank, int node_first, int local_rank, int local_world)
{
	return local_world > 0 && node_first % local_world == 0 && rank == node_first + local_rank;
}

void
comm_backoff(unsigned *spins)
{
	unsigned s = (*spins)++;
	if (s < 64) {
		return; /* a collective on one node often completes within microseconds */
	}
	/*
	 * MPI (Open MPI without a progress thread) advances a non-blocking collective only inside
	 * MPI calls, one step of its algorithm per call: a sleep between two tests delays every
	 * step of a ring by the sleep. Yield instead (an oversubscribed peer rank gets the core,
	 * as Open MPI's own blocking wait does with yield_when_idle) for the first ~2^16 polls,
	 * tens of milliseconds; only a longer wait sleeps, 100 us at a time, so a stuck
	 * collective does not hold a core until its deadline.
	 */
	if (s < 64 + (1u << 16)) {
		sched_yield();
		return;
	}
	struct timespec ts = {0, 100000L};
	nanosleep(&ts, NULL);
}

/* A process started by a launcher we know: Open MPI's mpirun, Hydra (MPICH), Slurm's srun. */
static bool
launched_by_mpi(void)
{
	static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMI_RANK",
					   "PMIX_RANK"};
	for (unsigned i = 0; i < ZINF_ARRAY_SIZE(vars); i++) {
		if (getenv(vars[i])) {
			return true;
		}
	}
	return false;
}

static int
pick_backend(const struct zinf_comm_opts *o, const struct zinf_comm_ops **out)
{
	const char *name = o->backend;
	if (!name) {
		name = launched_by_mpi() || comm_mpi_initialized() ? "mpi" : "single";
	}
	*out = comm_ops_find(name);
	if (!*out) {
		return ZINF_FAIL(-EINVAL, "comm backend \"%s\" unknown (mpi, nccl, single)", name);
	}
	return 0;
}

/*
 * The check's descriptor buffers: world received, then the one this rank sends (descs[world]).
 * After a check timed out both stay with MPI, which may still read the one and write the
 * others (zinf_comm_destroy leaves them: zc_leave).
 */
static struct zinf_comm_desc *
comm_descs_alloc(int world)
{
	return zc_calloc((size_t)world + 1, sizeof(struct zinf_comm_desc));
}

int
zinf_comm_create(const struct zinf_comm_opts *opts, struct zinf_comm **out)
{
	struct zinf_comm_opts o;
	const struct zinf_comm_ops *ops;
	struct zinf_comm *c;
	int rc;

	if (!out) {
		return ZINF_FAIL(-EINVAL, "zinf_comm_create: out is NULL");
	}
	zinf_comm_opts_init(&o);
	rc = zc_opts_take(&o, sizeof(o), opts, "zinf_comm_opts");
	if (rc < 0) {
		return rc;
	}
	if ((rc = comm_timeout_check(o.timeout_s, "comm")) < 0) {
		return rc;
	}
	rc = pick_backend(&o, &ops);
	if (rc < 0) {
		return rc;
	}
	c = zc_calloc(1, sizeof(*c));
	if (!c) {
		return ZINF_FAIL(-ENOMEM, "comm: out of memory for the communicator");
	}
	c->ops = ops;
	c->opts = o;
	snprintf(c->backend_name, sizeof(c->backend_name), "%s", ops->name);
	c->opts.backend = c->backend_name;
	c->stats.size = sizeof(c->stats);
	c->lost = UINT64_MAX;
	rc = ops->open(c);
	if (rc < 0) {
		goto err_free;
	}
	if (c->node_group < 1) { /* a backend that agreed none: one node of the world */
		c->node_group = c->world;
	}
	c->descs = comm_descs_alloc(c->world);
	if (!c->descs) {
		rc = ZINF_FAIL(-ENOMEM, "comm %s: out of memory for %d descriptors", ops->name,
			       c->world);
		goto err_close;
	}
	*out = c;
	return 0;

err_close:
	ops->close(c);
err_free:
	zc_free(c);
	return rc;
}

/* Collective seq did not complete on this rank (failed, given up, never posted). */
static void
lose(struct zinf_comm *c, uint64_t seq)
{
	c->lost = ZINF_MIN(c->lost, seq);
}

static void
unlink_req(struct zinf_comm *c, struct zinf_comm_req *r)
{
	if (r->prev) {
		r->prev->next = r->next;
	} else {
		c->inflight = r->next;
	}
	if (r->next) {
		r->next->prev = r->prev;
	}
}

/* Give r up: the backend keeps what it still uses; r's memory is freed. */
static void
drop_req(struct zinf_comm *c, struct zinf_comm_req *r)
{
	c->abandoned++;
	lose(c, r->d.seq);
	c->ops->abandon(c, r);
	unlink_req(c, r);
	zc_free(r);
}

static int leave_notice(struct zinf_comm *c, const char *why);

void
zinf_comm_destroy(struct zinf_comm *c)
{
	if (!c) {
		return;
	}
	/* Each request completes or fails c within its own deadline: destroy is bounded. */
	while (c->inflight && !c->failed) {
		(void)zinf_comm_wait(c, c->inflight);
	}
	while (c->inflight) { /* c failed: MPI cannot cancel them; their memory stays theirs */
		drop_req(c, c->inflight);
	}
	/* a rank still calling collectives learns that this one is gone */
	char why[64];
	snprintf(why, sizeof(why), "zinf_comm_destroy after %llu collectives",
		 (unsigned long long)c->seq);
	(void)leave_notice(c, why);
	/*
	 * Failed by a notice (sent or taken) or a mismatch, with no call of its left posted: no
	 * rank waits for this one (every rank was told, or saw the mismatch), and nothing of its is
	 * in MPI's hands: leave as a healthy communicator does (MPI_Comm_free, MPI_Finalize when it
	 * initialised MPI), so that a job whose ranks all failed that way exits cleanly.
	 */
	if (c->failed && (c->known || c->told) && !c->abandoned && !c->descs_abandoned) {
		c->failed = 0;
	}
	c->ops->close(c);
	if (!c->descs_abandoned) {
		zc_free(c->descs);
	} else {
		zc_leave(c->descs); /* MPI may still read or write them */
	}
	zc_free(c);
}

int
zinf_comm_rank(const struct zinf_comm *c)
{
	return c ? c->rank : ZINF_FAIL(-EINVAL, "zinf_comm_rank: communicator is NULL");
}

int
zinf_comm_world(const struct zinf_comm *c)
{
	return c ? c->world : ZINF_FAIL(-EINVAL, "zinf_comm_world: communicator is NULL");
}

int
zinf_comm_local_rank(const struct zinf_comm *c)
{
	return c ? c->local_rank : ZINF_FAIL(-EINVAL, "zinf_comm_local_rank: communicator is NULL");
}

const char *
zinf_comm_backend(const struct zinf_comm *c)
{
	return c ? c->ops->name : NULL;
}

const struct zinf_comm_opts *
zinf_comm_get_opts(const struct zinf_comm *c)
{
	return c ? &c->opts : NULL;
}

int
zinf_comm_failed(const struct zinf_comm *c)
{
	return c ? c->failed : ZINF_FAIL(-EINVAL, "zinf_comm_failed: communicator is NULL");
}

void *
zinf_comm_native(struct zinf_comm *c)
{
	return c && c->ops->native ? c->ops->native(c) : NULL;
}

void *
comm_stream(struct zinf_comm *c)
{
	return c && c->ops->stream ? c->ops->stream(c) : NULL;
}

int
zinf_comm_partition(size_t numel, int world, int rank, struct zinf_comm_part *out)
{
	if (!out || world < 1 || rank < 0 || rank >= world) {
		return ZINF_FAIL(-EINVAL, "comm partition: rank %d of world %d (out %p) invalid",
				 rank, world, (void *)out);
	}
	size_t part = numel / (size_t)world + (numel % (size_t)world != 0);
	if (part > SIZE_MAX / (size_t)world) {
		return ZINF_FAIL(-EINVAL, "comm partition: %zu elements over %d ranks wraps", numel,
				 world);
	}
	out->numel = numel;
	out->part = part;
	out->padded = part * (size_t)world;
	out->offset = part * (size_t)rank;
	out->count = out->offset >= numel ? 0 : ZINF_MIN(part, numel - out->offset);
	return 0;
}

/* ---- calls -------------------------------------------------------------------------------- */

size_t
comm_elem_size(int dtype)
{
	return dtype == COMM_U8 ? 1 : zinf_dtype_size((enum zinf_dtype)dtype);
}

/* "seq 7 all_gather 1000 f32" (+ " sum", " root 2", " group 4 stride 1"), as the mismatch
 * message prints calls. */
static void
desc_text(const struct zinf_comm_desc *d, char *buf, size_t len)
{
	int n = snprintf(buf, len, "seq %llu %s %llu %s", (unsigned long long)d->seq,
			 comm_kind_name(d->kind), (unsigned long long)d->count,
			 d->dtype == COMM_U8 ? "u8" : zinf_dtype_name((enum zinf_dtype)d->dtype));
	if (d->kind == ZINF_COMM_ALL_TO_ALL && n > 0 && (size_t)n < len) {
		snprintf(buf + n, len - n, " group %d stride %d", d->a2a_n, d->a2a_stride);
		return;
	}
	if (d->red >= 0 && d->red < (int)ZINF_ARRAY_SIZE(red_names) && n > 0 && (size_t)n < len) {
		n += snprintf(buf + n, len - n, " %s", red_names[d->red]);
	}
	if (d->root >= 0 && n > 0 && (size_t)n < len) {
		snprintf(buf + n, len - n, " root %d", d->root);
	}
}

/* Fail c with err; the message (already formatted) is kept for every later call. */
static int
fail_comm(struct zinf_comm *c, int err, const char *msg)
{
	if (!c->failed) {
		c->failed = err;
		snprintf(c->fail_msg, sizeof(c->fail_msg), "%s", msg);
		if (c->ops->failed) {
			c->ops->failed(c);
		}
	}
	return ZINF_FAIL(err, "comm %s rank %d: %s", c->ops->name, c->rank, msg);
}

/*
 * Other ranks' failure notices, looked for at most every NOTICE_PERIOD_NS (always with now),
 * for collective seq (waited on, or about to be posted). A notice says up to which collective
 * its sender completed: seq at or below it runs on (the failed rank did its part: it completes
 * here as it did there), seq after it fails c with -ECONNABORTED naming that rank and its
 * reason. So every rank completes the same collectives and fails at the same one. 0 when seq
 * may go on. A failed c looks for none (it said or heard why already).
 */
static int
heed_notice(struct zinf_comm *c, bool now, uint64_t seq)
{
	struct zinf_comm_notice n;

	if (!c->ops->notice || c->failed) {
		return 0;
	}
	uint64_t t = zinf_now_ns();
	if (now || t >= c->notice_next_ns) {
		c->notice_next_ns = t + NOTICE_PERIOD_NS;
		int rc;
		while ((rc = c->ops->notice(c, &n)) == 1) {
			if (c->heard && n.upto >= c->heard_upto) {
				continue; /* a later failure than the one heard */
			}
			n.why[sizeof(n.why) - 1] = 0;
			c->heard = true;
			c->heard_upto = n.upto;
			if (n.err == -ESHUTDOWN) { /* zinf_comm_leave */
				snprintf(c->heard_msg, sizeof(c->heard_msg),
					 "rank %d left: %s; this rank called a collective it will "
					 "never join",
					 (int)n.rank, n.why);
			} else {
				snprintf(c->heard_msg, sizeof(c->heard_msg),
					 "rank %d failed (%s): %s", (int)n.rank,
					 zinf_strerror(n.err), n.why);
			}
		}
		if (rc < 0) {
			lose(c, seq);
			return fail_comm(c, rc, "looking for failure notices failed");
		}
	}
	if (!c->heard || seq <= c->heard_upto) {
		return 0;
	}
	c->known = true;
	lose(c, seq);
	return fail_comm(c, -ECONNABORTED, c->heard_msg);
}

/* The last collective completed here: every one before the first lost or still in flight. */
static uint64_t
completed(const struct zinf_comm *c)
{
	uint64_t first = ZINF_MIN(c->lost, c->seq + 1);
	for (const struct zinf_comm_req *r = c->inflight; r; r = r->next) {
		first = ZINF_MIN(first, r->d.seq);
	}
	return first - 1;
}

int
zinf_comm_notify_failure(struct zinf_comm *c, int err, const char *why)
{
	struct zinf_comm_notice n = {0};

	if (!c) {
		return ZINF_FAIL(-EINVAL, "zinf_comm_notify_failure: communicator is NULL");
	}
	if (!c->ops->notify || c->world < 2 || c->known || c->told) {
		return 0; /* no one to tell, or every rank was told already */
	}
	c->told = true;
	n.rank = c->rank;
	n.err = err < 0 ? err : -ECONNABORTED;
	n.upto = completed(c);
	snprintf(n.why, sizeof(n.why), "%s", why ? why : "(no reason given)");
	if (!c->failed) {
		c->failed = n.err;
		snprintf(c->fail_msg, sizeof(c->fail_msg), "this rank failed (%s): %s",
			 zinf_strerror(n.err), n.why);
	}
	int rc = c->ops->notify(c, &n);
	if (c->ops->failed) {
		c->ops->failed(c); /* after the notice left: nccl's abort does not touch MPI */
	}
	if (rc < 0) {
		return ZINF_FAIL(rc, "comm %s rank %d: the failure notice could not be sent",
				 c->ops->name, c->rank);
	}
	ZINF_WARN("comm %s rank %d: told the other %d ranks that this rank failed: %s",
		  c->ops->name, c->rank, c->world - 1, n.why);
	return 0;
}

/*
 * This rank's notice that it leaves (every collective it called completed): a rank that goes on
 * calling collectives fails at the first one it would wait for in vain. Sent once, only by a
 * healthy communicator with nothing in flight: a failed one told the others already (a notice)
 * or they fail alike (a timeout, a mismatch).
 */
static int
leave_notice(struct zinf_comm *c, const char *why)
{
	if (!c->ops->notify || c->world < 2 || c->told || c->failed || c->inflight) {
		return 0;
	}
	struct zinf_comm_notice n = {.rank = c->rank, .err = -ESHUTDOWN, .upto = c->seq};
	snprintf(n.why, sizeof(n.why), "%s", why ? why : "(no reason given)");
	c->told = true;
	c->known = true; /* nothing of this rank's to tell anyone again */
	c->failed = -ESHUTDOWN;
	snprintf(c->fail_msg, sizeof(c->fail_msg), "this rank left: %s", n.why);
	int rc = c->ops->notify(c, &n);
	if (rc < 0) {
		return ZINF_FAIL(rc, "comm %s rank %d: the notice of leaving could not be sent",
				 c->ops->name, c->rank);
	}
	ZINF_LOG(ZINF_LOG_DEBUG, "comm %s rank %d: left after collective %llu: %s", c->ops->name,
		 c->rank, (unsigned long long)n.upto, n.why);
	return 0;
}

int
zinf_comm_leave(struct zinf_comm *c, const char *why)
{
	if (!c) {
		return ZINF_FAIL(-EINVAL, "zinf_comm_leave: communicator is NULL");
	}
	if (c->inflight && !c->failed) {
		return ZINF_FAIL(
			-EBUSY,
			"zinf_comm_leave: comm %s rank %d has requests in flight: wait for "
			"them first (zinf_comm_wait)",
			c->ops->name, c->rank);
	}
	return leave_notice(c, why);
}

static int
refuse_failed(struct zinf_comm *c, const char *what)
{
	return ZINF_FAIL(c->failed,
			 "comm %s rank %d: %s refused: the communicator failed earlier (%s); "
			 "destroy it and exit the process",
			 c->ops->name, c->rank, what, c->fail_msg);
}

/*
 * Compare this call with every rank's before it runs: the first rank whose call differs from
 * rank 0's is named with rank 0's, so every rank prints the same two calls.
 */
static int
check_call(struct zinf_comm *c, const struct zinf_comm_desc *d, uint64_t deadline_ns, double bytes)
{
	char msg[256], a[96], b[96];
	uint64_t t0 = zinf_now_ns();

	struct zinf_comm_desc *mine = &c->descs[c->world]; /* outlives c if abandoned */
	*mine = *d;
	int rc = c->ops->exchange(c, mine, c->descs, deadline_ns);
	desc_text(d, a, sizeof(a));
	while (rc == -ECONNABORTED) { /* a notice waits: this call may go on, or fail */
		if ((rc = heed_notice(c, true, d->seq)) < 0) {
			c->descs_abandoned = true; /* the exchange stays posted */
			return rc;
		}
		rc = c->ops->exchange(c, mine, c->descs, deadline_ns); /* resumed */
	}
	c->stats.check_ns += zinf_now_ns() - t0;
	if (rc == -ETIMEDOUT) {
		c->descs_abandoned = true; /* the exchange may still use them */
		c->stats.timeouts++;
		snprintf(msg, sizeof(msg),
			 "%s (%.0f bytes): the call check timed out after %g s (comm_timeout_s): "
			 "a rank skipped this collective, died or is stuck",
			 a, bytes, c->opts.timeout_s);
		return fail_comm(c, -ETIMEDOUT, msg);
	}
	if (rc < 0) {
		snprintf(msg, sizeof(msg), "%s: the call check failed (%s)", a, zinf_strerror(rc));
		return fail_comm(c, rc, msg);
	}
	for (int r = 1; r < c->world; r++) {
		if (memcmp(&c->descs[r], &c->descs[0], sizeof(*d)) != 0) {
			desc_text(&c->descs[0], a, sizeof(a));
			desc_text(&c->descs[r], b, sizeof(b));
			snprintf(msg, sizeof(msg),
				 "ranks called different collectives: rank 0: %s; "
				 "rank %d: %s",
				 a, r, b);
			c->known = true; /* every rank compared the same calls: no notice */
			return fail_comm(c, -EPROTO, msg);
		}
	}
	return 0;
}

static int
timed_out(struct zinf_comm *c, struct zinf_comm_req *r)
{
	char msg[256], a[96];
	desc_text(&r->d, a, sizeof(a));
	snprintf(msg, sizeof(msg),
		 "%s (%llu bytes) on rank %d of %d not complete after %g s (comm_timeout_s): a "
		 "rank skipped or reordered a collective, died or is stuck",
		 a, (unsigned long long)r->bytes, c->rank, c->world, c->opts.timeout_s);
	c->stats.timeouts++;
	drop_req(c, r);
	return fail_comm(c, -ETIMEDOUT, msg);
}

/*
 * One poll of r; frees r unless it is still in flight. 1 done, 0 in flight, -errno. On a
 * communicator that failed since r was posted, r is given up at once (its peers are gone or
 * out of step) rather than waited on for the rest of its deadline, and without polling the
 * backend: the failure abandoned a call, which may have torn down what a poll would query
 * (nccl aborts, and so frees, its communicator), and a call completed by an abort is no result.
 */
static int
poll_once(struct zinf_comm *c, struct zinf_comm_req *r)
{
	char msg[160], a[96];
	if (c->failed) {
		desc_text(&r->d, a, sizeof(a));
		drop_req(c, r);
		return refuse_failed(c, a);
	}
	int rc = c->ops->poll(c, r);
	if (rc == 0 && (rc = heed_notice(c, false, r->d.seq)) < 0) {
		drop_req(c, r); /* the failed rank will not join it */
		return rc;
	}
	if (rc == 0) {
		return zinf_now_ns() > r->deadline_ns ? timed_out(c, r) : 0;
	}
	if (rc < 0) {
		desc_text(&r->d, a, sizeof(a));
		snprintf(msg, sizeof(msg), "%s (%llu bytes) failed: %s", a,
			 (unsigned long long)r->bytes, zinf_strerror(rc));
		drop_req(c, r);
		return fail_comm(c, rc, msg);
	}
	unlink_req(c, r);
	zc_free(r);
	return 1;
}

int
zinf_comm_wait(struct zinf_comm *c, struct zinf_comm_req *r)
{
	unsigned spins = 0;
	int rc;

	if (!c || !r) {
		return ZINF_FAIL(-EINVAL, "zinf_comm_wait: communicator %p or request %p is NULL",
				 (void *)c, (void *)r);
	}
	uint64_t t0 = zinf_now_ns();
	while ((rc = poll_once(c, r)) == 0) {
		if (c->ops->block) {
			c->ops->block(c, r, r->deadline_ns, &spins);
		} else {
			comm_backoff(&spins);
		}
	}
	c->stats.wait_ns += zinf_now_ns() - t0;
	return rc < 0 ? rc : 0;
}

int
zinf_comm_test(struct zinf_comm *c, struct zinf_comm_req *r)
{
	if (!c || !r) {
		return ZINF_FAIL(-EINVAL, "zinf_comm_test: communicator %p or request %p is NULL",
				 (void *)c, (void *)r);
	}
	uint64_t t0 = zinf_now_ns();
	int rc = poll_once(c, r);
	c->stats.wait_ns += zinf_now_ns() - t0;
	return rc;
}

/*
 * Start the call d on c: number it, check it across ranks, post it, and either hand back the
 * request or wait for it. recv_bytes/send_bytes bound nothing here; bytes is the full tensor.
 */
static int
submit(struct zinf_comm *c, struct zinf_comm_desc *d, const void *send, void *recv, uint64_t bytes,
       struct zinf_comm_req **out)
{
	char msg[160], a[96];
	struct zinf_comm_req *r;
	int rc;

	rc = heed_notice(c, false, c->seq + 1); /* a failed rank may not join this call */
	d->seq = ++c->seq;
	if (rc < 0) {
		return rc;
	}
	uint64_t deadline = zinf_now_ns() + (uint64_t)(c->opts.timeout_s * 1e9);
	if (c->opts.check) {
		rc = check_call(c, d, deadline, (double)bytes);
		if (rc < 0) {
			lose(c, d->seq);
			return rc;
		}
	}
	r = zc_calloc(1, sizeof(*r) + c->ops->req_size);
	if (!r) {
		desc_text(d, a, sizeof(a));
		snprintf(msg, sizeof(msg), "%s: out of memory for its request", a);
		lose(c, d->seq);
		return fail_comm(c, -ENOMEM, msg); /* the other ranks go on: this one cannot */
	}
	r->d = *d;
	r->send = send;
	r->recv = recv;
	r->bytes = bytes;
	r->deadline_ns = deadline;
	rc = c->ops->start(c, r);
	if (rc < 0) {
		zc_free(r);
		desc_text(d, a, sizeof(a));
		snprintf(msg, sizeof(msg), "%s (%llu bytes) could not be posted: %s", a,
			 (unsigned long long)bytes, zinf_strerror(rc));
		lose(c, d->seq);
		return fail_comm(c, rc, msg);
	}
	r->next = c->inflight;
	if (r->next) {
		r->next->prev = r;
	}
	c->inflight = r;
	c->stats.calls++;
	c->stats.bytes += bytes;
	if (out) {
		*out = r;
		return 0;
	}
	return zinf_comm_wait(c, r);
}

/*
 * The checks every collective shares: c usable, dtype known, the reduction one of enum
 * zinf_comm_red when the call reduces (red is -1 for one that does not), buffers present,
 * count x mult x element size representable. Sets *bytes to that product.
 */
static int
check_args(struct zinf_comm *c, const char *what, const void *a, const void *b, size_t count,
	   size_t mult, enum zinf_dtype dtype, bool reduces, int red, uint64_t *bytes)
{
	if (!c) {
		return ZINF_FAIL(-EINVAL, "%s: communicator is NULL", what);
	}
	if (c->failed) {
		return refuse_failed(c, what);
	}
	size_t es = zinf_dtype_size(dtype);
	if (!es) {
		return ZINF_FAIL(-EINVAL, "%s: dtype %d unknown", what, (int)dtype);
	}
	if (reduces ? red < ZINF_COMM_SUM || red > ZINF_COMM_MAX : red != -1) {
		return ZINF_FAIL(-EINVAL, "%s: reduction %d unknown", what, red);
	}
	if (count && (!a || !b)) {
		return ZINF_FAIL(-EINVAL, "%s of %zu %s: a buffer is NULL", what, count,
				 zinf_dtype_name(dtype));
	}
	if (count > (UINT64_MAX / es) / mult) {
		return ZINF_FAIL(-EINVAL, "%s: %zu elements x %zu ranks x %zu bytes wraps", what,
				 count, mult, es);
	}
	*bytes = (uint64_t)count * mult * es;
	return 0;
}

int
zinf_comm_all_gather(struct zinf_comm *c, const void *send, void *recv, size_t count,
		     enum zinf_dtype dtype, struct zinf_comm_req **req)
{
	uint64_t bytes;
	int rc = check_args(c, "all_gather", send, recv, count, c ? (size_t)c->world : 1, dtype,
			    false, -1, &bytes);
	if (rc < 0) {
		return rc;
	}
	const char *s = send, *r = recv, *mine = r + bytes / c->world * c->rank;
	if (count && s != mine && s < r + bytes && r < s + bytes / c->world) {
		return ZINF_FAIL(-EINVAL,
				 "all_gather: send overlaps recv other than at rank %d's "
				 "partition (in place)",
				 c->rank);
	}
	struct zinf_comm_desc d = {.kind = ZINF_COMM_ALL_GATHER,
				   .count = count,
				   .dtype = dtype,
				   .red = -1,
				   .root = -1};
	return submit(c, &d, send, recv, bytes, req);
}

int
zinf_comm_reduce_scatter(struct zinf_comm *c, const void *send, void *recv, size_t count,
			 enum zinf_dtype dtype, enum zinf_comm_red red, struct zinf_comm_req **req)
{
	uint64_t bytes;
	int rc = check_args(c, "reduce_scatter", send, recv, count, c ? (size_t)c->world : 1, dtype,
			    true, (int)red, &bytes);
	if (rc < 0) {
		return rc;
	}
	const char *s = send, *r = recv;
	if (count && s < r + bytes / c->world && r < s + bytes) {
		return ZINF_FAIL(-EINVAL, "reduce_scatter: send and recv overlap");
	}
	struct zinf_comm_desc d = {.kind = ZINF_COMM_REDUCE_SCATTER,
				   .count = count,
				   .dtype = dtype,
				   .red = (int32_t)red,
				   .root = -1};
	return submit(c, &d, send, recv, bytes, req);
}

int
zinf_comm_all_reduce(struct zinf_comm *c, void *buf, size_t count, enum zinf_dtype dtype,
		     enum zinf_comm_red red, struct zinf_comm_req **req)
{
	uint64_t bytes;
	int rc = check_args(c, "all_reduce", buf, buf, count, 1, dtype, true, (int)red, &bytes);
	if (rc < 0) {
		return rc;
	}
	struct zinf_comm_desc d = {.kind = ZINF_COMM_ALL_REDUCE,
				   .count = count,
				   .dtype = dtype,
				   .red = (int32_t)red,
				   .root = -1};
	return submit(c, &d, buf, buf, bytes, req);
}

int
zinf_comm_broadcast(struct zinf_comm *c, void *buf, size_t count, enum zinf_dtype dtype, int root,
		    struct zinf_comm_req **req)
{
	uint64_t bytes;
	int rc = check_args(c, "broadcast", buf, buf, count, 1, dtype, false, -1, &bytes);
	if (rc < 0) {
		return rc;
	}
	if (root < 0 || root >= c->world) {
		return ZINF_FAIL(-EINVAL, "broadcast: root %d outside the world of %d ranks", root,
				 c->world);
	}
	struct zinf_comm_desc d = {.kind = ZINF_COMM_BROADCAST,
				   .count = count,
				   .dtype = dtype,
				   .red = -1,
				   .root = root};
	return submit(c, &d, buf, buf, bytes, req);
}

int
zinf_comm_barrier(struct zinf_comm *c, struct zinf_comm_req **req)
{
	uint64_t bytes;
	int rc = check_args(c, "barrier", NULL, NULL, 0, 1, ZINF_F32, false, -1, &bytes);
	if (rc < 0) {
		return rc;
	}
	struct zinf_comm_desc d = {
		.kind = ZINF_COMM_BARRIER, .dtype = ZINF_F32, .red = -1, .root = -1};
	return submit(c, &d, NULL, NULL, 0, req);
}

int
zinf_comm_get_stats(const struct zinf_comm *c, struct zinf_comm_stats *out)
{
	if (!c) {
		return ZINF_FAIL(-EINVAL, "zinf_comm_get_stats: communicator is NULL");
	}
	return zc_stats_give(out, &c->stats, sizeof(c->stats), "zinf_comm_stats");
}

int
comm_all_gather_u8(struct zinf_comm *c, const void *send, void *recv, size_t bytes)
{
	if (c->failed) {
		return refuse_failed(c, "all_gather");
	}
	struct zinf_comm_desc d = {.kind = ZINF_COMM_ALL_GATHER,
				   .count = bytes,
				   .dtype = COMM_U8,
				   .red = -1,
				   .root = -1};
	return submit(c, &d, send, recv, (uint64_t)bytes * (uint64_t)c->world, NULL);
}

int
comm_all_to_all_u8(struct zinf_comm *c, const void *send, void *recv, size_t bytes, int n,
		   int stride)
{
	if (c->failed) {
		return refuse_failed(c, "all_to_all");
	}
	if (n < 1 || n > 0x7fff || stride < 1 || stride > 0xffff || c->world % n ||
	    (stride > 1 && stride * n != c->world)) {
		return ZINF_FAIL(-EINVAL,
				 "all_to_all: group of %d ranks, stride %d, in a world of %d", n,
				 stride, c->world);
	}
	struct zinf_comm_desc d = {.kind = ZINF_COMM_ALL_TO_ALL,
				   .count = bytes,
				   .dtype = COMM_U8,
				   .red = -1,
				   .a2a_n = (int16_t)n,
				   .a2a_stride = (uint16_t)stride};
	return submit(c, &d, send, recv, (uint64_t)bytes * (uint64_t)n, NULL);
}

/* ---- registry ----------------------------------------------------------------------------- */

static int __attribute__((unused)) not_built(struct zinf_comm *c)
{
	return ZINF_FAIL(-ENODEV, "comm backend \"%s\" was not built (configure found no %s)",
			 c->ops->name, strcmp(c->ops->name, "mpi") == 0 ? "MPI" : "NCCL or MPI");
}

#if ZINF_HAVE_MPI
extern const struct zinf_comm_ops zinf_comm_mpi_ops;
#else
static const struct zinf_comm_ops zinf_comm_mpi_ops = {.name = "mpi", .open = not_built};

bool
comm_mpi_initialized(void)
{
	return false;
}

int
comm_mpi_join(struct zinf_comm *c, struct zinf_comm_mpi **out)
{
	return ZINF_FAIL(-ENODEV, "comm %s: zinf was built without MPI", c->ops->name);
}

void
comm_mpi_leave(struct zinf_comm_mpi *m, bool failed)
{
}

bool
comm_mpi_progress(const struct zinf_comm *c)
{
	return false;
}

int
comm_mpi_exchange(struct zinf_comm_mpi *m, const void *mine, void *all, size_t bytes,
		  const char *what, uint64_t deadline_ns)
{
	return -ENODEV;
}

int
comm_mpi_bcast_bytes(struct zinf_comm_mpi *m, void *buf, size_t bytes, const char *what,
		     uint64_t deadline_ns)
{
	return -ENODEV;
}

int
comm_mpi_notify(struct zinf_comm_mpi *m, int rank, int world, const struct zinf_comm_notice *n)
{
	return -ENODEV;
}

int
comm_mpi_notice(struct zinf_comm_mpi *m, struct zinf_comm_notice *n)
{
	return 0;
}
#endif

/* NCCL shares its unique id through MPI: without MPI it is not built either. */
#if ZINF_HAVE_NCCL && ZINF_HAVE_MPI
extern const struct zinf_comm_ops zinf_comm_nccl_ops;
#else
static const struct zinf_comm_ops zinf_comm_nccl_ops = {.name = "nccl", .open = not_built};
#endif

const struct zinf_comm_ops *const zinf_comm_registry[] = {
	&zinf_comm_nccl_ops,
	&zinf_comm_mpi_ops,
	&zinf_comm_single_ops,
};
const unsigned zinf_comm_registry_len = ZINF_ARRAY_SIZE(zinf_comm_registry);

const struct zinf_comm_ops *
comm_ops_find(const char *name)
{
	for (unsigned i = 0; i < zinf_comm_registry_len; i++) {
		if (strcmp(zinf_comm_registry[i]->name, name) == 0) {
			return zinf_comm_registry[i];
		}
	}
	return NULL;
}

/* NCCL's version code as major, minor, patch: X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z
 * after (NCCL_VERSION in nccl.h). */
static void
version_parts(int code, int v[3])
{
	bool old = code < 10000;
	v[0] = old ? code / 1000 : code / 10000;
	v[1] = old ? code / 100 % 10 : code / 100 % 100;
	v[2] = code % 100;
}

/*
 * The libnccl loaded at run time against the headers compiled in. The API (ncclConfig_t's
 * fields, ncclCommFinalize, non-blocking communicators) is defined per minor release, so a
 * library of an older major.minor than the headers is refused with both versions named; an
 * older patch of the same minor release, or a newer library, is accepted (NCCL keeps its ABI
 * within a major release).
 */
int
comm_nccl_version_ok(int lib_code, int hdr_code, char *why, size_t len)
{
	int l[3], h[3];
	version_parts(lib_code, l);
	version_parts(hdr_code, h);
	if (l[0] == h[0] && l[1] >= h[1]) {
		return 0;
	}
	snprintf(why, len,
		 "the NCCL library loaded is %d.%d.%d, %s the %d.%d.%d headers zinf was compiled "
		 "with (put NCCL %d.%d or newer of major %d on the library path)",
		 l[0], l[1], l[2], l[0] != h[0] ? "of another major release than" : "older than",
		 h[0], h[1], h[2], h[0], h[1], h[0]);
	return -ENOTSUP;
}
