/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvme/io_uring.c: the io_uring backend (liburing). One ring per worker, sized to its depth,
 * with a sparse registered-file table (files are used by slot, IOSQE_FIXED_FILE) and the
 * context's registered buffers (READ_FIXED/WRITE_FIXED when a block lies inside one).
 * Submission is batched: queue() only fills SQEs, and reap() submits them and waits for
 * completions in one io_uring_enter. SQPOLL when asked (opts.sqpoll).
 *
 * Wake-up: each ring keeps one read of the worker's eventfd (wake_fd) armed; a submitter's
 * write completes it, which ends a wait in io_uring_submit_and_wait, and reap() re-arms it.
 */
#include <liburing.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "nvme/io_internal.h"

struct uring_worker {
	struct zinf_io_worker w;
	struct io_uring ring;
	bool files;	   /* sparse file table registered */
	bool buffers;	   /* buffers registered */
	int efd;	   /* the eventfd (w.wake_fd until a read of it fails), -1: none */
	bool wake_armed;   /* the read of wake_fd is queued or in the kernel */
	uint64_t wake_buf; /* its 8 bytes; its address is its user_data */
};

/* Queue the read of wake_fd (submitted with the next batch). */
static void
uring_wake_arm(struct uring_worker *u)
{
	struct io_uring_sqe *sqe;
	if (u->wake_armed || u->w.wake_fd < 0 || !(sqe = io_uring_get_sqe(&u->ring))) {
		return;
	}
	io_uring_prep_read(sqe, u->efd, &u->wake_buf, sizeof(u->wake_buf), 0);
	io_uring_sqe_set_data(sqe, &u->wake_buf);
	u->wake_armed = true;
}

static int
uring_worker_create(struct zinf_io *io, unsigned id, unsigned depth, struct zinf_io_worker **out)
{
	struct io_uring_params p = {0};
	struct uring_worker *u = zc_calloc(1, sizeof(*u));
	int rc;

	if (!u) {
		return IO_FAIL(io, -ENOMEM, "io_uring worker %u: out of memory", id);
	}
	rc = io_worker_init(&u->w, io, id, depth);
	if (rc < 0) {
		goto fail_free;
	}
	if (io->opts.sqpoll) {
		p.flags |= IORING_SETUP_SQPOLL;
		p.sq_thread_idle = 1000; /* ms */
	}
	/* One entry more than the depth: the read of wake_fd. */
	rc = io_uring_queue_init_params(depth + 1, &u->ring, &p);
	if (rc < 0) {
		goto fail_worker;
	}
	/* Registered files spare the kernel a file-table lookup and refcount per op. */
	u->files = io_uring_register_files_sparse(&u->ring, ZINF_IO_MAX_FILES) == 0;
	/* Blocking on purpose: io_uring completes a read of an O_NONBLOCK file with -EAGAIN
	 * instead of waiting for data. Without one the worker only wakes on completions. */
	u->efd = eventfd(0, EFD_CLOEXEC);
	if (u->efd >= 0) {
		u->w.wake_fd = u->efd;
		uring_wake_arm(u);
		if (io_uring_submit(&u->ring) < 0) {
			close(u->efd);
			u->efd = u->w.wake_fd = -1;
		}
	}
	*out = &u->w;
	return 0;

fail_worker:
	io_worker_fini(&u->w);
fail_free:
	zc_free(u);
	return rc;
}

static void
uring_worker_destroy(struct zinf_io_worker *w)
{
	struct uring_worker *u = zinf_container_of(w, struct uring_worker, w);
	io_uring_queue_exit(&u->ring); /* cancels the read of wake_fd */
	if (u->efd >= 0) {
		close(u->efd);
	}
	io_worker_fini(w);
	zc_free(u);
}

static int
uring_queue(struct zinf_io_worker *w, struct zinf_io_blk *b)
{
	struct uring_worker *u = zinf_container_of(w, struct uring_worker, w);
	struct io_uring_sqe *sqe = io_uring_get_sqe(&u->ring);
	struct zinf_io_file *f = b->file;
	int fd = f->fixed ? f->slot : f->fd;
	char *buf = b->buf + b->done;
	uint64_t off = b->off + b->done;

	if (!sqe) {
		return -EBUSY;
	}
	if (b->buf_index >= 0 && u->buffers) {
		if (b->op == ZINF_IO_READ) {
			io_uring_prep_read_fixed(sqe, fd, buf, b->xfer, off, b->buf_index);
		} else {
			io_uring_prep_write_fixed(sqe, fd, buf, b->xfer, off, b->buf_index);
		}
	} else if (b->op == ZINF_IO_READ) {
		io_uring_prep_read(sqe, fd, buf, b->xfer, off);
	} else {
		io_uring_prep_write(sqe, fd, buf, b->xfer, off);
	}
	if (f->fixed) {
		sqe->flags |= IOSQE_FIXED_FILE;
	}
	io_uring_sqe_set_data(sqe, b);
	return 0;
}

static int
uring_submit(struct zinf_io_worker *w)
{
	/* Deferred: reap() submits and waits in one system call. */
	return 0;
}

static int
uring_reap(struct zinf_io_worker *w, struct zinf_io_blk **out, unsigned min, unsigned max)
{
	struct uring_worker *u = zinf_container_of(w, struct uring_worker, w);
	struct io_uring_cqe *cqes[64];
	unsigned n = 0;
	bool woken = false;

	for (;;) {
		/* One CQE more than asked for: the wake-up's read may be among them. */
		unsigned got = io_uring_peek_batch_cqe(&u->ring, cqes, ZINF_MIN(max - n + 1, 64u));
		unsigned used = 0;
		for (unsigned i = 0; i < got; i++) {
			void *data = io_uring_cqe_get_data(cqes[i]);
			if (data == &u->wake_buf) {
				/* A failed read (none is expected) is not re-armed and the
				 * wake-up is off: the worker wakes on completions only, as
				 * without wake_fd, and no submitter writes the eventfd towards
				 * its limit (a blocking write) with nobody reading it. */
				int res = cqes[i]->res;
				u->wake_armed = false;
				woken = true;
				if (res >= 0 || res == -EINTR || res == -EAGAIN) {
					uring_wake_arm(u);
				} else {
					__atomic_store_n(&w->wake_fd, -1, __ATOMIC_RELAXED);
				}
				used++;
				continue;
			}
			if (n == max) {
				break; /* stays in the CQ for the next reap() */
			}
			struct zinf_io_blk *b = data;
			b->res = cqes[i]->res;
			out[n++] = b;
			used++;
		}
		io_uring_cq_advance(&u->ring, used);
		if (n >= min || n == max || woken) {
			break;
		}
		int rc = io_uring_submit_and_wait(&u->ring, 1);
		if (rc < 0 && rc != -EINTR && rc != -EAGAIN && rc != -EBUSY) {
			if (n) {
				break;
			}
			return rc;
		}
	}
	if (io_uring_sq_ready(&u->ring)) {
		/* Refill blocks queued since: hand them to the kernel without waiting. */
		io_uring_submit(&u->ring);
	}
	return (int)n;
}

static int
uring_file_add(struct zinf_io_worker *w, struct zinf_io_file *f)
{
	struct uring_worker *u = zinf_container_of(w, struct uring_worker, w);
	if (!u->files) {
		return -EOPNOTSUPP;
	}
	int rc = io_uring_register_files_update(&u->ring, (unsigned)f->slot, &f->fd, 1);
	return rc < 0 ? rc : 0;
}

static void
uring_file_remove(struct zinf_io_worker *w, struct zinf_io_file *f)
{
	struct uring_worker *u = zinf_container_of(w, struct uring_worker, w);
	int none = -1;
	if (u->files) {
		io_uring_register_files_update(&u->ring, (unsigned)f->slot, &none, 1);
	}
}

static int
uring_register_buffers(struct zinf_io_worker *w, const struct iovec *iov, unsigned n)
{
	struct uring_worker *u = zinf_container_of(w, struct uring_worker, w);
	if (u->buffers) {
		io_uring_unregister_buffers(&u->ring);
		u->buffers = false;
	}
	if (n == 0) {
		return 0;
	}
	int rc = io_uring_register_buffers(&u->ring, iov, n);
	if (rc < 0) {
		return rc;
	}
	u->buffers = true;
	return 0;
}

const struct zinf_io_ops zinf_io_uring_ops = {
	.name = "io_uring",
	.worker_create = uring_worker_create,
	.worker_destroy = uring_worker_destroy,
	.queue = uring_queue,
	.submit = uring_submit,
	.reap = uring_reap,
	.file_add = uring_file_add,
	.file_remove = uring_file_remove,
	.register_buffers = uring_register_buffers,
};
