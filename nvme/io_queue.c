/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvme/io_queue.c: requests and the workers that serve them. zinf_io_submit validates a
 * request and appends it to the one queue all workers share; a worker takes one block_size
 * piece of the head request at a time (the request then goes to the back: round robin),
 * keeps up to its depth of blocks in flight, submits them in one batch, reaps, and checks
 * every completion (short: resubmit the remainder; EINTR/EAGAIN: retry; any other error fails
 * that request alone). A submitter wakes a worker asleep in its backend's reap() through the
 * worker's eventfd. Waiting is per request, on the request's own futex word.
 *
 * Not here: context creation and backend choice (io.c), files and registration (io_file.c),
 * moving bytes (the backends).
 */
#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "nvme/io_internal.h"

#define RETRY_MAX 10000 /* EINTR/EAGAIN resubmissions of one block before giving up */

static const char *const op_name[] = {"read", "write"};

/* ---- workers' block arrays (backends embed a worker) -------------------------------------- */

int
io_worker_init(struct zinf_io_worker *w, struct zinf_io *io, unsigned id, unsigned depth)
{
	w->io = io;
	w->id = id;
	w->depth = depth;
	w->wake_fd = -1;
	w->sleeping = 0;
	w->blks = zc_calloc(depth, sizeof(*w->blks));
	w->free_blks = zc_calloc(depth, sizeof(*w->free_blks));
	w->pending = zc_calloc(depth, sizeof(*w->pending));
	w->reaped = zc_calloc(depth, sizeof(*w->reaped));
	if (!w->blks || !w->free_blks || !w->pending || !w->reaped) {
		io_worker_fini(w);
		return IO_FAIL(io, -ENOMEM, "worker %u: out of memory for a queue of %u blocks", id,
			       depth);
	}
	for (unsigned i = 0; i < depth; i++) {
		w->blks[i].idx = i;
		w->free_blks[i] = &w->blks[depth - 1 - i];
	}
	w->nfree = depth;
	return 0;
}

void
io_worker_fini(struct zinf_io_worker *w)
{
	zc_free(w->blks);
	zc_free(w->free_blks);
	zc_free(w->pending);
	zc_free(w->reaped);
	w->blks = NULL;
	w->free_blks = w->pending = w->reaped = NULL;
}

int64_t
io_blk_sync(struct zinf_io_blk *b)
{
	ssize_t n;
	if (b->op == ZINF_IO_READ) {
		n = pread(b->file->fd, b->buf + b->done, b->xfer, (off_t)(b->off + b->done));
	} else {
		n = pwrite(b->file->fd, b->buf + b->done, b->xfer, (off_t)(b->off + b->done));
	}
	return n < 0 ? -errno : n;
}

/* ---- completion --------------------------------------------------------------------------- */

/* Mark r complete, wake its waiters, then run its callback: the engine does not touch r
 * after the callback, so the callback may reuse or free it. */
static void
req_complete(struct zinf_io *io, struct zinf_io_req *r)
{
	struct zinf_io_req_priv *p = io_req_priv(r);
	void (*done)(struct zinf_io_req *, void *) = r->done;
	void *arg = r->arg;
	struct zinf_io_file *f = r->file;
	int64_t err = __atomic_load_n(&p->err, __ATOMIC_ACQUIRE);

	r->result = err ? err : (int64_t)r->len;
	if (__atomic_sub_fetch(&f->inflight, 1, __ATOMIC_ACQ_REL) == 0) {
		/* f may be freed by a closer from here on. */
		pthread_mutex_lock(&io->flock);
		pthread_cond_broadcast(&io->fcv);
		pthread_mutex_unlock(&io->flock);
	}
	__atomic_sub_fetch(&io->inflight_reqs, 1, __ATOMIC_RELEASE);
	if (__atomic_exchange_n(&p->state, ZINF_IO_REQ_DONE, __ATOMIC_ACQ_REL) ==
	    ZINF_IO_REQ_WAITED) {
		syscall(SYS_futex, &p->state, FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
	}
	if (done) {
		done(r, arg);
	}
}

/* A block finished (all bytes or failed with err): account it to its request. */
static void
blk_finish(struct zinf_io_worker *w, struct zinf_io_blk *b, int64_t err)
{
	struct zinf_io *io = w->io;
	struct zinf_io_req *r = b->req;
	struct zinf_io_req_priv *p = io_req_priv(r);

	if (err) {
		int64_t zero = 0;
		__atomic_compare_exchange_n(&p->err, &zero, err, false, __ATOMIC_RELEASE,
					    __ATOMIC_RELAXED);
		ZINF_IO_ATOMIC_ADD(&io->stats.errors, 1);
	} else {
		ZINF_IO_ATOMIC_ADD(b->op == ZINF_IO_READ ? &io->stats.bytes_read
							 : &io->stats.bytes_written,
				   b->len);
	}
	uint32_t len = b->len;
	b->req = NULL;
	w->free_blks[w->nfree++] = b;
	if (__atomic_sub_fetch(&p->remain, len, __ATOMIC_ACQ_REL) == 0) {
		req_complete(io, r);
	}
}

static void
blk_fail(struct zinf_io_worker *w, struct zinf_io_blk *b, int64_t err, const char *why)
{
	IO_FILE_LOG(b->file, ZINF_LOG_ERROR, "%s at offset %llu length %u failed%s: %s (errno %d)",
		    op_name[b->op], (unsigned long long)(b->off + b->done), b->len - b->done, why,
		    strerror((int)-err), (int)-err);
	blk_finish(w, b, err);
}

static void
blk_resubmit(struct zinf_io_worker *w, struct zinf_io_blk *b)
{
	b->xfer = b->len - b->done;
	w->pending[w->npending++] = b;
}

/* Check one completion: the only place results are interpreted. */
static void
blk_check(struct zinf_io_worker *w, struct zinf_io_blk *b)
{
	struct zinf_io *io = w->io;
	int64_t res = b->res;
	uint32_t want = b->len - b->done;

	if (res == -EINTR || res == -EAGAIN) {
		ZINF_IO_ATOMIC_ADD(&io->stats.eagain_retries, 1);
		if (++b->retries > RETRY_MAX) {
			blk_fail(w, b, res, " (retries exhausted)");
		} else {
			blk_resubmit(w, b);
		}
	} else if (res < 0) {
		blk_fail(w, b, res, "");
	} else if (res == 0 && want > 0) {
		blk_fail(w, b, b->op == ZINF_IO_READ ? -ENODATA : -EIO,
			 b->op == ZINF_IO_READ ? " (end of file)" : " (nothing written)");
	} else if ((uint64_t)res < want) {
		ZINF_IO_ATOMIC_ADD(&io->stats.short_retries, 1);
		b->done += (uint32_t)res;
		blk_resubmit(w, b);
	} else {
		b->done += want;
		blk_finish(w, b, 0);
	}
}

/* ---- the workers -------------------------------------------------------------------------- */

/* Registered buffer that holds [p, p + len), or -1. Under qlock. (Registration refuses a
 * buffer whose end wraps the address space, and submission a request's.) */
static int
reg_index(const struct zinf_io *io, const char *p, size_t len)
{
	for (unsigned i = 0; i < io->nregs; i++) {
		uintptr_t base = (uintptr_t)io->regs[i].iov_base;
		if ((uintptr_t)p >= base && (uintptr_t)p - base <= io->regs[i].iov_len &&
		    len <= io->regs[i].iov_len - ((uintptr_t)p - base)) {
			return (int)i;
		}
	}
	return -1;
}

/* Take blocks from the shared queue into w->pending while w has free blocks. Under qlock. */
static void
take_blocks(struct zinf_io *io, struct zinf_io_worker *w)
{
	uint32_t bs = io->opts.block_size;

	while (w->nfree > 0 && io->qhead) {
		struct zinf_io_req *r = io->qhead;
		struct zinf_io_req_priv *p = io_req_priv(r);
		uint64_t cur = p->cursor;
		uint32_t len = (uint32_t)ZINF_MIN((uint64_t)bs, r->len - cur);
		struct zinf_io_blk *b = w->free_blks[--w->nfree];

		b->req = r;
		b->file = r->file;
		b->buf = (char *)r->buf + cur;
		b->off = r->offset + cur;
		b->len = len;
		b->done = 0;
		b->xfer = len;
		b->op = r->op;
		b->retries = 0;
		b->res = 0;
		b->buf_index = reg_index(io, b->buf, len);
		w->pending[w->npending++] = b;
		cur += len;
		p->cursor = cur;
		/* Round robin: the head request goes to the back after each block, so a small
		 * request queued behind a large one does not wait for all of it. */
		struct zinf_io_req *next = p->next;
		if (cur == r->len || next) {
			/* Atomic: a worker about to sleep reads it without the lock. */
			__atomic_store_n(&io->qhead, next, __ATOMIC_RELAXED);
			if (!next) {
				io->qtail = NULL;
			}
		}
		if (cur < r->len && next) {
			p->next = NULL;
			io_req_priv(io->qtail)->next = r;
			io->qtail = r;
		}
	}
}

/* Prepare everything pending with the backend, then one submission for the batch. */
static void
worker_submit(struct zinf_io_worker *w)
{
	struct zinf_io *io = w->io;
	const struct zinf_io_ops *ops = io->ops;
	unsigned i = 0, queued = 0;

	while (i < w->npending) {
		struct zinf_io_blk *b = w->pending[i];
		int rc = ops->queue(w, b);
		if (rc == -EBUSY) {
			break;
		}
		i++;
		if (rc < 0) {
			blk_fail(w, b, rc, " (could not be queued)");
			continue;
		}
		w->inflight++;
		queued++;
	}
	memmove(w->pending, w->pending + i, (w->npending - i) * sizeof(*w->pending));
	w->npending -= i;
	if (!queued) {
		return;
	}
	uint64_t now = __atomic_add_fetch(&io->inflight_blocks, queued, __ATOMIC_RELAXED);
	uint64_t max = __atomic_load_n(&io->stats.max_inflight, __ATOMIC_RELAXED);
	while (now > max && !__atomic_compare_exchange_n(&io->stats.max_inflight, &max, now, true,
							 __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
	}
	int rc = ops->submit(w);
	if (rc < 0 && rc != -EAGAIN && rc != -EBUSY && rc != -EINTR) {
		IO_LOG(io, ZINF_LOG_WARN, "submission failed: %s; retrying", strerror(-rc));
	}
}

/* Wait in the backend for completions (or a wake-up) and check them. */
static void
worker_reap(struct zinf_io_worker *w)
{
	struct zinf_io *io = w->io;
	/*
	 * About to block in reap() with room for more blocks: say so, then look at the queue
	 * once more (the submitter does the mirror image: the queue's head, then `sleeping`;
	 * all four seq_cst). Either the request is seen here and reap() does not wait, or the
	 * submitter sees `sleeping` and wakes the backend's wait through wake_fd. (A queue that
	 * was already non-empty: this worker's take_blocks() left it empty or had no free block,
	 * so the request that made it non-empty did the seq_cst store of the head.)
	 */
	unsigned min = 1;
	bool armed = w->wake_fd >= 0 && w->nfree > 0;
	if (armed) {
		__atomic_store_n(&w->sleeping, 1, __ATOMIC_SEQ_CST);
		if (__atomic_load_n(&io->qhead, __ATOMIC_SEQ_CST)) {
			/* New work: collect what finished, then take it. */
			__atomic_store_n(&w->sleeping, 0, __ATOMIC_RELAXED);
			armed = false;
			min = 0;
		}
	}
	int n = io->ops->reap(w, w->reaped, min, w->inflight);
	if (armed) {
		__atomic_store_n(&w->sleeping, 0, __ATOMIC_RELAXED);
	}
	if (n < 0) {
		if (n != -EINTR && n != -EAGAIN) {
			IO_LOG(io, ZINF_LOG_WARN, "reaping completions failed: %s; retrying",
			       strerror(-n));
		}
		return;
	}
	w->inflight -= (unsigned)n;
	__atomic_sub_fetch(&io->inflight_blocks, (uint64_t)n, __ATOMIC_RELAXED);
	for (int k = 0; k < n; k++) {
		blk_check(w, w->reaped[k]);
	}
}

void *
io_worker_main(void *arg)
{
	struct zinf_io_worker *w = arg;
	struct zinf_io *io = w->io;

	for (;;) {
		pthread_mutex_lock(&io->qlock);
		take_blocks(io, w);
		if (w->inflight == 0 && w->npending == 0) {
			if (io->stopping && !io->qhead) {
				pthread_mutex_unlock(&io->qlock);
				break;
			}
			pthread_cond_wait(&io->qcv, &io->qlock);
			pthread_mutex_unlock(&io->qlock);
			continue;
		}
		if (io->qhead) {
			/* More work than this worker can hold: let an idle one take some. */
			pthread_cond_signal(&io->qcv);
		}
		pthread_mutex_unlock(&io->qlock);

		worker_submit(w);
		if (w->inflight) {
			worker_reap(w);
		}
	}
	return NULL;
}

/*
 * Wake up to `want` workers asleep in their backend's reap() with free blocks, so that a
 * request just queued goes in flight now rather than after their next completion. A worker
 * that is awake costs a fence and a load (no system call): it takes the request itself.
 */
static void
wake_sleepers(struct zinf_io *io, uint64_t want)
{
	unsigned n = io->nworkers, start = 0, woken = 0;
	if (n > 1) {
		start = __atomic_fetch_add(&io->wake_next, 1, __ATOMIC_RELAXED) % n;
	}
	for (unsigned i = 0; i < n && woken < want; i++) {
		struct zinf_io_worker *w = io->workers[(start + i) % n];
		int fd = __atomic_load_n(&w->wake_fd, __ATOMIC_RELAXED);
		if (fd < 0 || !__atomic_load_n(&w->sleeping, __ATOMIC_SEQ_CST) ||
		    !__atomic_exchange_n(&w->sleeping, 0, __ATOMIC_ACQ_REL)) {
			continue;
		}
		/* Never blocks: the backend reads the eventfd, or it is non-blocking (libaio). */
		uint64_t v = ZINF_IO_WAKE;
		while (write(fd, &v, sizeof(v)) < 0 && errno == EINTR) {
		}
		ZINF_IO_ATOMIC_ADD(&io->stats_wakeups, 1);
		woken++;
	}
}

/* ---- requests ----------------------------------------------------------------------------- */

/* Refuse r: it is left complete with err (a wait returns err at once) and nothing queued. */
static int
req_refuse(struct zinf_io *io, struct zinf_io_req *r, int err)
{
	struct zinf_io_req_priv *p = io_req_priv(r);
	memset(p, 0, sizeof(*p));
	p->err = err;
	p->io = io;
	r->result = err;
	__atomic_store_n(&p->state, ZINF_IO_REQ_DONE, __ATOMIC_RELEASE);
	return err;
}

/* Everything zinf_io_submit checks before it touches the queue; 0 or a logged -errno. */
static int
req_validate(struct zinf_io *io, const struct zinf_io_req *r)
{
	struct zinf_io_file *f = r->file;
	if (!f || (!r->buf && r->len) || (r->op != ZINF_IO_READ && r->op != ZINF_IO_WRITE)) {
		return IO_FAIL(io, -EINVAL, "zinf_io_submit: NULL file or buffer, or bad op %d",
			       (int)r->op);
	}
	if (f->io != io) {
		return IO_FILE_FAIL(f, -EINVAL, "file belongs to another I/O context");
	}
	if (r->op == ZINF_IO_WRITE && !f->writable) {
		return IO_FILE_FAIL(f, -EBADF, "write to a file opened read-only");
	}
	/* A file offset is an off_t: the request must end at or below INT64_MAX. */
	if (r->offset > (uint64_t)INT64_MAX || r->len > (uint64_t)INT64_MAX - r->offset) {
		return IO_FILE_FAIL(f, -EINVAL,
				    "offset %llu + length %zu is past the largest file offset",
				    (unsigned long long)r->offset, r->len);
	}
	if (r->len > UINTPTR_MAX - (uintptr_t)r->buf) {
		return IO_FILE_FAIL(f, -EINVAL,
				    "%s: buffer %p + length %zu wraps the address space",
				    op_name[r->op], r->buf, r->len);
	}
	uint32_t a = f->align;
	if (a > 1 && (!ZINF_IS_ALIGNED((uintptr_t)r->buf, a) || !ZINF_IS_ALIGNED(r->offset, a) ||
		      !ZINF_IS_ALIGNED(r->len, a))) {
		return IO_FILE_FAIL(f, -EINVAL,
				    "%s: direct I/O needs buffer, offset and length multiples of "
				    "%u; got buffer %p (%% %u = %u), offset %llu (%% %u = %llu), "
				    "length %zu (%% %u = %zu)",
				    op_name[r->op], a, r->buf, a, (unsigned)((uintptr_t)r->buf % a),
				    (unsigned long long)r->offset, a,
				    (unsigned long long)(r->offset % a), r->len, a, r->len % a);
	}
	return 0;
}

int
zinf_io_submit(struct zinf_io *io, struct zinf_io_req *r)
{
	if (!r) {
		return IO_FAIL(io, -EINVAL, "zinf_io_submit: NULL request");
	}
	if (!io) {
		return req_refuse(io, r, IO_FAIL(io, -EINVAL, "zinf_io_submit: NULL context"));
	}
	int rc = req_validate(io, r);
	if (rc < 0) {
		return req_refuse(io, r, rc);
	}
	struct zinf_io_req_priv *p = io_req_priv(r);
	struct zinf_io_file *f = r->file;
	memset(p, 0, sizeof(*p));
	p->remain = r->len;
	p->io = io;
	r->result = 0;
	__atomic_store_n(&p->state, ZINF_IO_REQ_PENDING, __ATOMIC_RELAXED);
	__atomic_add_fetch(&f->inflight, 1, __ATOMIC_ACQ_REL);

	pthread_mutex_lock(&io->qlock);
	if (io->stopping) {
		pthread_mutex_unlock(&io->qlock);
		__atomic_sub_fetch(&f->inflight, 1, __ATOMIC_ACQ_REL);
		return req_refuse(
			io, r,
			IO_FAIL(io, -ESHUTDOWN, "zinf_io_submit: context is being destroyed"));
	}
	/* Counted once accepted: a refused request was not submitted. */
	ZINF_IO_ATOMIC_ADD(&io->stats.reqs, 1);
	ZINF_IO_ATOMIC_ADD(&io->stats.blocks, ZINF_DIV_ROUND_UP(r->len, io->opts.block_size));
	__atomic_add_fetch(&io->inflight_reqs, 1, __ATOMIC_RELAXED);
	if (r->len == 0) {
		pthread_mutex_unlock(&io->qlock);
		req_complete(io, r);
		return 0;
	}
	if (io->qtail) {
		io_req_priv(io->qtail)->next = r;
	} else {
		/* seq_cst: pairs with a sleeping worker's check (worker_reap). */
		__atomic_store_n(&io->qhead, r, __ATOMIC_SEQ_CST);
	}
	io->qtail = r;
	pthread_cond_signal(&io->qcv); /* an idle worker (nothing in flight) */
	pthread_mutex_unlock(&io->qlock);
	wake_sleepers(io, ZINF_DIV_ROUND_UP(r->len, io->opts.block_size));
	return 0;
}

static int
req_fill_submit(struct zinf_io *io, struct zinf_io_req *r, enum zinf_io_op op,
		struct zinf_io_file *f, void *buf, size_t len, uint64_t offset)
{
	if (!r) {
		return IO_FAIL(io, -EINVAL, "zinf_io_%s_async: NULL request", op_name[op]);
	}
	r->op = op;
	r->file = f;
	r->buf = buf;
	r->len = len;
	r->offset = offset;
	r->done = NULL;
	r->arg = NULL;
	return zinf_io_submit(io, r);
}

int
zinf_io_read_async(struct zinf_io *io, struct zinf_io_req *r, struct zinf_io_file *f, void *buf,
		   size_t len, uint64_t offset)
{
	return req_fill_submit(io, r, ZINF_IO_READ, f, buf, len, offset);
}

int
zinf_io_write_async(struct zinf_io *io, struct zinf_io_req *r, struct zinf_io_file *f,
		    const void *buf, size_t len, uint64_t offset)
{
	return req_fill_submit(io, r, ZINF_IO_WRITE, f, (void *)buf, len, offset);
}

/* A request that can be polled or waited on in io: 0 or a logged -EINVAL. */
static int
req_waitable(struct zinf_io *io, struct zinf_io_req *r, const char *fn)
{
	if (!io || !r) {
		return IO_FAIL(io, -EINVAL, "%s: NULL %s", fn, r ? "context" : "request");
	}
	if (io_req_priv(r)->io != io) {
		return IO_FAIL(io, -EINVAL,
			       "%s: request %p was not submitted to this context (never "
			       "submitted, or submitted to another)",
			       fn, (void *)r);
	}
	return 0;
}

int
zinf_io_poll(struct zinf_io *io, struct zinf_io_req *r)
{
	int rc = req_waitable(io, r, "zinf_io_poll");
	if (rc < 0) {
		return rc;
	}
	return __atomic_load_n(&io_req_priv(r)->state, __ATOMIC_ACQUIRE) == ZINF_IO_REQ_DONE;
}

int
zinf_io_wait(struct zinf_io *io, struct zinf_io_req *r)
{
	int rc = req_waitable(io, r, "zinf_io_wait");
	if (rc < 0) {
		return rc;
	}
	uint32_t *st = &io_req_priv(r)->state;
	uint32_t s = __atomic_load_n(st, __ATOMIC_ACQUIRE);

	while (s != ZINF_IO_REQ_DONE) {
		if (s == ZINF_IO_REQ_PENDING &&
		    !__atomic_compare_exchange_n(st, &s, ZINF_IO_REQ_WAITED, false,
						 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
			continue; /* s reloaded */
		}
		syscall(SYS_futex, st, FUTEX_WAIT_PRIVATE, ZINF_IO_REQ_WAITED, NULL, NULL, 0);
		s = __atomic_load_n(st, __ATOMIC_ACQUIRE);
	}
	return r->result < 0 ? (int)r->result : 0;
}

int
zinf_io_wait_all(struct zinf_io *io, struct zinf_io_req *const *rs, size_t n)
{
	if (n && !rs) {
		return IO_FAIL(io, -EINVAL, "zinf_io_wait_all: NULL array of %zu requests", n);
	}
	int first = 0;
	for (size_t i = 0; i < n; i++) {
		int rc = zinf_io_wait(io, rs[i]);
		if (rc < 0 && !first) {
			first = rc;
		}
	}
	return first;
}

int
zinf_io_pread(struct zinf_io *io, struct zinf_io_file *f, void *buf, size_t len, uint64_t offset)
{
	struct zinf_io_req r;
	int rc = zinf_io_read_async(io, &r, f, buf, len, offset);
	return rc < 0 ? rc : zinf_io_wait(io, &r);
}

int
zinf_io_pwrite(struct zinf_io *io, struct zinf_io_file *f, const void *buf, size_t len,
	       uint64_t offset)
{
	struct zinf_io_req r;
	int rc = zinf_io_write_async(io, &r, f, buf, len, offset);
	return rc < 0 ? rc : zinf_io_wait(io, &r);
}
