/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvme/io_libaio.c: the Linux AIO backend (libaio). One AIO context per worker, one iocb per
 * block slot; queue() prepares an iocb, submit() hands all prepared ones to io_submit in one
 * call (keeping the rest when the kernel takes fewer), reap() is io_getevents. An iocb the
 * kernel rejects at submission completes with that error, like any other failed op.
 *
 * Waiting: every iocb signals the worker's eventfd (wake_fd) on completion, and a submitter
 * writes ZINF_IO_WAKE to it, so reap() collects what is there without blocking and then
 * blocks in poll(wake_fd) and reads (drains) it: it wakes for a completion or for new work,
 * whichever comes first. The eventfd is non-blocking, so that a writer never blocks on a
 * counter that reap() has not drained (a wake-up that arrived while events were ready).
 */
#include <errno.h>
#include <libaio.h>
#include <poll.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "nvme/io_internal.h"

struct aio_worker {
	struct zinf_io_worker w;
	io_context_t ctx;
	struct iocb *iocbs;	/* [depth], by block idx */
	struct iocb **prepared; /* [depth]: not yet accepted by io_submit */
	unsigned nprepared;
	struct zinf_io_blk **rejected; /* [depth]: refused by io_submit, reported by reap */
	unsigned nrejected;
	struct io_event *events; /* [depth] */
};

static void
aio_free(struct aio_worker *a)
{
	zc_free(a->iocbs);
	zc_free(a->prepared);
	zc_free(a->rejected);
	zc_free(a->events);
	zc_free(a);
}

static int
aio_worker_create(struct zinf_io *io, unsigned id, unsigned depth, struct zinf_io_worker **out)
{
	struct aio_worker *a = zc_calloc(1, sizeof(*a));
	int rc;

	if (!a) {
		return IO_FAIL(io, -ENOMEM, "libaio worker %u: out of memory", id);
	}
	a->iocbs = zc_calloc(depth, sizeof(*a->iocbs));
	a->prepared = zc_calloc(depth, sizeof(*a->prepared));
	a->rejected = zc_calloc(depth, sizeof(*a->rejected));
	a->events = zc_calloc(depth, sizeof(*a->events));
	if (!a->iocbs || !a->prepared || !a->rejected || !a->events) {
		rc = -ENOMEM;
		goto fail_free;
	}
	rc = io_worker_init(&a->w, io, id, depth);
	if (rc < 0) {
		goto fail_free;
	}
	rc = io_setup((int)depth, &a->ctx); /* libaio returns -errno */
	if (rc < 0) {
		goto fail_worker;
	}
	/* Without one, reap() blocks in io_getevents and wakes on completions only. */
	a->w.wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	*out = &a->w;
	return 0;

fail_worker:
	io_worker_fini(&a->w);
fail_free:
	aio_free(a);
	return rc;
}

static void
aio_worker_destroy(struct zinf_io_worker *w)
{
	struct aio_worker *a = zinf_container_of(w, struct aio_worker, w);
	io_destroy(a->ctx);
	if (w->wake_fd >= 0) {
		close(w->wake_fd);
	}
	io_worker_fini(w);
	aio_free(a);
}

static int
aio_queue(struct zinf_io_worker *w, struct zinf_io_blk *b)
{
	struct aio_worker *a = zinf_container_of(w, struct aio_worker, w);
	struct iocb *cb = &a->iocbs[b->idx];
	if (b->op == ZINF_IO_READ) {
		io_prep_pread(cb, b->file->fd, b->buf + b->done, b->xfer,
			      (long long)(b->off + b->done));
	} else {
		io_prep_pwrite(cb, b->file->fd, b->buf + b->done, b->xfer,
			       (long long)(b->off + b->done));
	}
	cb->data = b;
	if (w->wake_fd >= 0) {
		io_set_eventfd(cb, w->wake_fd);
	}
	a->prepared[a->nprepared++] = cb;
	return 0;
}

static int
aio_submit(struct zinf_io_worker *w)
{
	struct aio_worker *a = zinf_container_of(w, struct aio_worker, w);
	int rc = 0;

	while (a->nprepared) {
		rc = io_submit(a->ctx, (long)a->nprepared, a->prepared);
		if (rc == -EAGAIN || rc == -EINTR) {
			break; /* reap, then retry */
		}
		if (rc < 0) {
			/* The first iocb was refused: it completes with that error. */
			struct zinf_io_blk *b = a->prepared[0]->data;
			b->res = rc;
			a->rejected[a->nrejected++] = b;
			rc = 1;
		}
		a->nprepared -= (unsigned)rc;
		memmove(a->prepared, a->prepared + rc, a->nprepared * sizeof(*a->prepared));
		rc = 0;
	}
	return rc;
}

static int
aio_reap(struct zinf_io_worker *w, struct zinf_io_blk **out, unsigned min, unsigned max)
{
	struct aio_worker *a = zinf_container_of(w, struct aio_worker, w);
	unsigned n = 0;

	aio_submit(w);
	while (a->nrejected && n < max) {
		out[n++] = a->rejected[--a->nrejected];
	}
	if (n == max) {
		return (int)n;
	}
	/* Do not wait for more than the kernel holds. */
	unsigned in_kernel = w->inflight - n - a->nprepared - a->nrejected;
	unsigned want = n >= min ? 0 : ZINF_MIN(min - n, in_kernel);
	struct timespec zero = {0, 0};
	for (;;) {
		/* With wake_fd: never block here (a zero timeout on an empty ring costs no
		 * system call); the wait is the read below. */
		int rc = io_getevents(a->ctx, w->wake_fd >= 0 ? 0 : (long)want, (long)(max - n),
				      a->events, w->wake_fd >= 0 ? &zero : NULL);
		if (rc < 0 && rc != -EINTR) {
			return n ? (int)n : rc;
		}
		for (int i = 0; i < rc; i++) {
			struct zinf_io_blk *b = a->events[i].data;
			b->res = (int64_t)(long)a->events[i].res;
			out[n++] = b;
			want -= want ? 1 : 0;
		}
		if (want == 0 || n == max || w->wake_fd < 0) {
			return (int)n;
		}
		/* Completions signalled since the last drain make it return at once. */
		struct pollfd pfd = {.fd = w->wake_fd, .events = POLLIN};
		if (poll(&pfd, 1, -1) < 0 && errno != EINTR) {
			return n ? (int)n : -errno;
		}
		uint64_t v = 0;
		if (read(w->wake_fd, &v, sizeof(v)) < 0 && errno != EAGAIN && errno != EINTR) {
			return n ? (int)n : -errno;
		}
		if (v >= ZINF_IO_WAKE) {
			/* New work: collect what is there, then let the core take it. */
			want = 0;
		}
	}
}

const struct zinf_io_ops zinf_io_libaio_ops = {
	.name = "libaio",
	.worker_create = aio_worker_create,
	.worker_destroy = aio_worker_destroy,
	.queue = aio_queue,
	.submit = aio_submit,
	.reap = aio_reap,
};
