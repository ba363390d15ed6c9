/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvme/io_internal.h: what the generic I/O core and its backends share: the context, the file,
 * a request's bookkeeping, one block in flight, a worker, and the backend ops table. Not
 * installed. The core is three files: io.c (context creation and backend choice), io_file.c
 * (files, alignment, registered files and buffers), io_queue.c (requests, workers, wake-up).
 *
 * The core validates requests, splits them into blocks and runs one thread per worker; a
 * backend only moves blocks: queue() prepares one, submit() hands the prepared ones to the
 * kernel, reap() returns finished ones with their result set. A backend never completes a
 * request and never retries: the core checks every result.
 */
#ifndef ZINF_IO_INTERNAL_H
#define ZINF_IO_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/uio.h>

#include "common/util.h"
#include "zinf/blocks/io.h"

/* Fixed-file table size per ring; files beyond it are used by descriptor. */
#define ZINF_IO_MAX_FILES 1024

/* Messages about a context name its backend ("io_uring I/O context: ..."), about a file its
 * path. */
#define IO_FAIL(io, err, ...)	   ZINF_OBJ_FAIL(io_name(io), err, __VA_ARGS__)
#define IO_LOG(io, level, ...)	   ZINF_OBJ_LOG(level, io_name(io), __VA_ARGS__)
#define IO_FILE_FAIL(f, err, ...)  ZINF_OBJ_FAIL((f)->path, err, __VA_ARGS__)
#define IO_FILE_LOG(f, level, ...) ZINF_OBJ_LOG(level, (f)->path, __VA_ARGS__)
/* "io_uring I/O context", "fault(libaio) I/O context"; "I/O context (NULL)" for NULL. */
const char *io_name(const struct zinf_io *io);

/*
 * A request's bookkeeping, overlaid on the caller's zinf_io_req.priv[] (io_queue.c only). Set
 * by zinf_io_submit(); a refused submission leaves the request complete with its error, so a
 * wait on it returns that error at once.
 */
struct zinf_io_req_priv {
	uint64_t remain;	  /* bytes whose blocks have not finished (atomic) */
	uint64_t cursor;	  /* bytes already split into blocks (under qlock) */
	struct zinf_io_req *next; /* next request in the shared queue (under qlock) */
	uint32_t state;		  /* futex word: ZINF_IO_REQ_PENDING | _WAITED | _DONE */
	uint32_t pad;
	int64_t err;	    /* first error, negative errno (atomic) */
	struct zinf_io *io; /* the context it was submitted to, to catch a wait in another */
};
_Static_assert(sizeof(struct zinf_io_req_priv) <= sizeof(((struct zinf_io_req *)0)->priv),
	       "struct zinf_io_req_priv must fit in zinf_io_req.priv");
_Static_assert(_Alignof(struct zinf_io_req_priv) <= _Alignof(uint64_t),
	       "zinf_io_req.priv is only 8-byte aligned");

enum { ZINF_IO_REQ_PENDING = 0, ZINF_IO_REQ_WAITED = 1, ZINF_IO_REQ_DONE = 2 };

static inline struct zinf_io_req_priv *
io_req_priv(struct zinf_io_req *r)
{
	return (struct zinf_io_req_priv *)(void *)r->priv;
}

/* The context's counters (atomic); zinf_io_get_stats() copies them into zinf_io_stats. */
struct zinf_io_counters {
	uint64_t bytes_read, bytes_written, reqs, blocks;
	uint64_t short_retries, eagain_retries, errors, max_inflight;
};

struct zinf_io_file {
	struct zinf_io *io;
	char *path; /* copied */
	int fd;
	int slot;   /* index in io->files and the backends' file tables, -1: none */
	bool fixed; /* registered at `slot` in every worker's backend */
	bool writable;
	bool direct;			  /* opened with O_DIRECT */
	uint32_t align;			  /* bytes; 1 when buffered */
	uint64_t inflight;		  /* requests in flight on this file (atomic) */
	struct zinf_io_file *prev, *next; /* io->file_list, under io->flock */
};

/* One block of a request, owned by a worker while in flight. */
struct zinf_io_blk {
	struct zinf_io_req *req;
	struct zinf_io_file *file;
	char *buf;	  /* the block's start in the request's buffer */
	uint64_t off;	  /* the block's file offset */
	uint32_t len;	  /* block bytes */
	uint32_t done;	  /* bytes transferred so far (short transfers are resubmitted) */
	uint32_t xfer;	  /* bytes asked in the current submission; a backend reads
			   * buf + done, off + done, xfer */
	int op;		  /* ZINF_IO_READ | ZINF_IO_WRITE */
	int buf_index;	  /* registered buffer holding [buf, buf + len), -1: none */
	unsigned retries; /* EINTR/EAGAIN resubmissions */
	unsigned idx;	  /* index in the worker's block array (backends key per-op state on it) */
	int64_t res;	  /* set by reap(): bytes transferred or -errno */
};

/* A worker thread: one ring / AIO context / pread loop. Backends embed it. */
struct zinf_io_worker {
	struct zinf_io *io;
	unsigned id;
	unsigned depth; /* blocks in flight at most */
	pthread_t thread;
	struct zinf_io_blk *blks;	/* [depth] */
	struct zinf_io_blk **free_blks; /* stack of free blocks */
	unsigned nfree;
	struct zinf_io_blk **pending; /* taken or to resubmit, not yet queued */
	unsigned npending;
	struct zinf_io_blk **reaped; /* [depth]: reap() output */
	unsigned inflight;	     /* queued to the backend, not yet reaped */
	/*
	 * Wake-up while asleep in reap(): an eventfd the backend watches (-1: none; set by
	 * worker_create, closed by worker_destroy). The worker sets `sleeping` (atomic) before
	 * a blocking reap() when it has free blocks; a submitter that finds it set clears it and
	 * writes ZINF_IO_WAKE to wake_fd, so a request queued meanwhile goes in flight at once
	 * instead of after the next completion. Both sides store, then load the other's word,
	 * seq_cst: no wake-up is lost, and an awake worker costs a submitter no system call.
	 */
	int wake_fd;
	uint32_t sleeping;
};

/* What a submitter adds to a worker's wake_fd: completions counted on the same eventfd (libaio)
 * add 1 each, so the high half tells a wake-up from completions. */
#define ZINF_IO_WAKE (1ull << 32)

/* Backend flags. */
enum {
	ZINF_IO_F_SYNC = 1 << 0,    /* executes ops one at a time (psync): depth is emulated
				     * with more workers */
	ZINF_IO_F_WRAPPER = 1 << 1, /* wraps another backend (fault) */
};

struct zinf_io_ops {
	const char *name;
	unsigned flags;
	/* Context-wide state (optional); inner is the wrapped backend for ZINF_IO_F_WRAPPER. */
	int (*init)(struct zinf_io *io, const struct zinf_io_ops *inner);
	void (*fini)(struct zinf_io *io);
	/* Make worker `id` able to hold `depth` ops. -ENODEV: not built; -EPERM/-ENOSYS:
	 * refused by the kernel. */
	int (*worker_create)(struct zinf_io *io, unsigned id, unsigned depth,
			     struct zinf_io_worker **out);
	void (*worker_destroy)(struct zinf_io_worker *w);
	/* Prepare one op (buf + done, off + done, xfer). -EBUSY: full, try after a reap. */
	int (*queue)(struct zinf_io_worker *w, struct zinf_io_blk *b);
	/* Hand prepared ops to the kernel. 0 or -errno (they stay prepared; retried later). */
	int (*submit)(struct zinf_io_worker *w);
	/* Return between min and max finished ops in out[], res set. Count or -errno. When the
	 * worker has a wake_fd, a blocking reap() also returns (with fewer than min, even 0) once
	 * wake_fd has been written. */
	int (*reap)(struct zinf_io_worker *w, struct zinf_io_blk **out, unsigned min, unsigned max);
	/* Optional: register f (f->slot >= 0) in this worker's file table / remove it. */
	int (*file_add)(struct zinf_io_worker *w, struct zinf_io_file *f);
	void (*file_remove)(struct zinf_io_worker *w, struct zinf_io_file *f);
	/* Optional: register buffers in this worker (n = 0: unregister). */
	int (*register_buffers)(struct zinf_io_worker *w, const struct iovec *iov, unsigned n);
};

struct zinf_io {
	struct zinf_io_opts opts; /* in effect; strings point at the tables' names */
	char name[48];		  /* io_name() */
	const struct zinf_io_ops *ops;
	const struct zinf_io_ops *inner_ops; /* fault: the wrapped backend */
	void *be;			     /* backend's context-wide state */

	unsigned nworkers;
	struct zinf_io_worker **workers;

	/* The shared queue of requests not yet fully split into blocks. */
	pthread_mutex_t qlock;
	pthread_cond_t qcv;
	struct zinf_io_req *qhead, *qtail;
	bool stopping;
	uint64_t inflight_reqs; /* under qlock increments; atomic decrements */

	/* Buffers registered with the backend (copied), looked up under qlock. None when the
	 * backend has no registration or the kernel refused it. */
	struct iovec *regs;
	unsigned nregs;

	/* Files and drain waits. */
	pthread_mutex_t flock;
	pthread_cond_t fcv;
	struct zinf_io_file *files[ZINF_IO_MAX_FILES]; /* by slot */
	struct zinf_io_file *file_list;		       /* every open file */

	/* Statistics (atomic). */
	struct zinf_io_counters stats;
	uint64_t inflight_blocks; /* block ops queued to the backends, not yet reaped */
	uint64_t stats_wakeups;	  /* sleeping workers woken by a submitter (atomic) */
	unsigned wake_next;	  /* where wake_sleepers() starts looking (atomic) */
};

/* The registry (io_registry.c): backends best first, and lookup by name. */
extern const struct zinf_io_ops *const zinf_io_registry[];
extern const unsigned zinf_io_registry_len;
const struct zinf_io_ops *io_ops_find(const char *name);

/* Backends (each its own file). */
extern const struct zinf_io_ops zinf_io_psync_ops;
extern const struct zinf_io_ops zinf_io_fault_ops_table;

/* io_queue.c: a worker thread's loop (started by zinf_io_create). */
void *io_worker_main(void *arg);

/* Core helpers for backends. */
int io_worker_init(struct zinf_io_worker *w, struct zinf_io *io, unsigned id, unsigned depth);
void io_worker_fini(struct zinf_io_worker *w);
/* Transfer a block synchronously with pread/pwrite (psync; fault's fallbacks). */
int64_t io_blk_sync(struct zinf_io_blk *b);

/*
 * Test hook: make every later attempt to set up `backend` fail with `err` (a negative errno,
 * e.g. -EPERM as a container's seccomp filter answers io_uring_setup); up to 4 backends;
 * NULL disarms them all.
 * Process-wide; only tests call it.
 */
void io_test_refuse(const char *backend, int err);

#define ZINF_IO_ATOMIC_ADD(p, v) __atomic_fetch_add((p), (v), __ATOMIC_RELAXED)

#endif
