/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zinf/blocks/io.h: asynchronous block I/O between host buffers and files (the NVMe tier's engine).
 * A building block (zinf/blocks/): for tools and engines made of zinf's parts; a trainer
 * needs none of it beyond the option types zinf/engine.h takes from it.
 *
 * A context owns `threads` worker threads, each with its own ring (io_uring), AIO context
 * (libaio) or pread/pwrite loop (psync). A request larger than block_size is split into blocks
 * that are kept queue_depth deep per worker; blocks of many requests share the same queue, so
 * depth also holds across many small requests to many files. Requests may be submitted and
 * waited on from any thread; waiting on one request never waits for unrelated ones.
 *
 * Files are opened with O_DIRECT unless the caller asks for buffered I/O. Buffers, offsets and
 * lengths of O_DIRECT requests must be multiples of the file's alignment (zinf_io_file_align),
 * read from the file system at open; a misaligned request is -EINVAL before anything is
 * submitted. Every completion is checked: a short transfer is resubmitted for the remainder,
 * EINTR/EAGAIN are retried, and any other error fails that request alone, with the file,
 * offset, length and errno in the message.
 */
#ifndef ZINF_IO_H
#define ZINF_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "zinf/common.h"

#ifdef __cplusplus
extern "C" {
#endif

struct zinf_io;	     /* opaque: a context */
struct zinf_io_file; /* opaque: a file opened in a context */

struct zinf_io_opts {
	size_t size;	     /* sizeof(struct zinf_io_opts); set by zinf_io_opts_init() */
	const char *backend; /* "io_uring" | "libaio" | "psync" | "fault" | NULL: best that works */
	uint32_t queue_depth; /* blocks in flight per worker thread; default 32 */
	uint32_t block_size;  /* bytes per block request; power of two >= 4096; default 1 MiB */
	uint32_t threads;     /* worker threads, one ring each (intra_op_parallelism); default 1 */
	bool sqpoll;	      /* io_uring: kernel-side submission polling thread; default false */
	const char *fault_inner; /* backend "fault": the backend it wraps; NULL: best that works */
				 /*
				  * psync executes one op at a time per thread: it runs threads x queue_depth threads (at
				  * most 64) instead, so the disk sees the same depth.
				  */
};

/** Fill *o with the defaults above (and o->size). */
ZINF_API void zinf_io_opts_init(struct zinf_io_opts *o);

/**
 * Open an I/O context. With backend NULL, tries io_uring, then libaio, then psync; a backend
 * the kernel refuses (EPERM/ENOSYS, as in many containers) is passed over with one warning
 * that says why (once per process; later contexts log it at DEBUG). Free with zinf_io_destroy().
 * Returns 0 and sets *out, or a negative errno and leaves *out untouched:
 *   -EINVAL  bad option, NULL out, opts.size unknown (zinf_io_opts_init sets it)
 *   -ENODEV  named backend (or fault's inner one) absent here: not built, or refused by the
 *            kernel (EPERM: seccomp, io_uring_disabled; ENOSYS: a kernel without it)
 *   -ENOMEM  out of memory
 *   any other negative errno: the backend's set-up failed for another reason (its own errno,
 *            the message names the backend); with backend NULL, every backend failed
 */
ZINF_API int zinf_io_create(const struct zinf_io_opts *opts, struct zinf_io **out);
/** Wait for every request in flight, stop the workers, close the files. NULL is a no-op. */
ZINF_API void zinf_io_destroy(struct zinf_io *io);
/** Name of the backend in use ("io_uring", "libaio", "psync", "fault"); "" for NULL. */
ZINF_API const char *zinf_io_backend(const struct zinf_io *io);
/** The options in effect (defaults filled in); the defaults for a NULL context. */
ZINF_API void zinf_io_get_opts(const struct zinf_io *io, struct zinf_io_opts *out);

/* ---- files -------------------------------------------------------------------------------- */

enum zinf_io_open_flags {
	ZINF_IO_RDONLY = 0,
	ZINF_IO_RDWR = 1 << 0,
	ZINF_IO_CREATE = 1 << 1, /* create if missing (mode 0600) */
	ZINF_IO_TRUNC = 1 << 2,
	ZINF_IO_BUFFERED = 1 << 3, /* no O_DIRECT (required on tmpfs); alignment 1 */
	/* O_DIRECT where the file system does direct I/O, else buffered, without an error
	 * (zinf_io_file_direct() tells which one it got) */
	ZINF_IO_DIRECT_OR_BUFFERED = 1 << 4,
};

/**
 * Open `path` in the context (registered with the backend where it supports it).
 * Returns 0 and sets *out; -errno from open(2) with the path in the message; -EINVAL for a NULL
 * argument, or when the file system refuses O_DIRECT (tmpfs) and ZINF_IO_BUFFERED was not asked
 * for (the message names the flag, swap's opts.buffered and the zinf command's --buffered).
 * Close with zinf_io_file_close() (or zinf_io_destroy()).
 */
ZINF_API int zinf_io_file_open(struct zinf_io *io, const char *path, unsigned flags,
			       struct zinf_io_file **out);
/** Close a file; waits for its requests in flight. NULL is a no-op; a file is always closed
 * through its own context (a wrong or NULL `io` is a warning). */
ZINF_API void zinf_io_file_close(struct zinf_io *io, struct zinf_io_file *f);
/** Whether the file was opened with O_DIRECT (false for NULL). */
ZINF_API bool zinf_io_file_direct(const struct zinf_io_file *f);
/** Direct-I/O alignment of the file in bytes (1 for a buffered file; 0 for NULL). */
ZINF_API uint32_t zinf_io_file_align(const struct zinf_io_file *f);
/** The path the file was opened with ("" for NULL). */
ZINF_API const char *zinf_io_file_path(const struct zinf_io_file *f);
/** The file's descriptor (for fallocate, fstat...); -EBADF for NULL. */
ZINF_API int zinf_io_file_fd(const struct zinf_io_file *f);

/* ---- requests ----------------------------------------------------------------------------- */

enum zinf_io_op { ZINF_IO_READ = 0, ZINF_IO_WRITE = 1 };

/*
 * A request, owned by the caller, who must not touch it (nor its buffer) from
 * zinf_io_submit() until zinf_io_wait()/zinf_io_poll() has reported it complete.
 */
struct zinf_io_req {
	enum zinf_io_op op;
	struct zinf_io_file *file;
	void *buf;	 /* host buffer of len bytes */
	uint64_t offset; /* bytes into the file */
	size_t len;	 /* bytes */
	/*
	 * Called on a worker thread when the request completes (may be NULL). Must not block.
	 * It runs after the request is marked complete (zinf_io_poll() already reports it) and
	 * the engine does not touch r afterwards, so done may reuse, resubmit or free it. A
	 * zero-length request completes inside zinf_io_submit(), which runs done itself.
	 */
	void (*done)(struct zinf_io_req *r, void *arg);
	void *arg;
	/*
	 * Result once complete: len, or a negative errno (the first error of any of its blocks;
	 * -ENODATA for a read past the end of the file). Blocks of a failed request other than
	 * the failing one may still have been transferred.
	 */
	int64_t result;
	uint64_t priv[8]; /* the engine's bookkeeping */
};

/**
 * Start a request. Validates everything first: on -EINVAL (misalignment, with the numbers in
 * the message; a NULL context, buffer or file; a file of another context; offset + len past
 * INT64_MAX, the largest file offset; buf + len past the end of the address space), -EBADF (a write
 * to a file opened read-only) or -ESHUTDOWN (the context is being destroyed) nothing was submitted.
 * Returns 0 when queued. Never blocks on the disk (a full queue is absorbed by the workers).
 * Queued requests are served round robin, one block at a time, so a small request submitted
 * after a large one does not wait for all of it.
 */
ZINF_API int zinf_io_submit(struct zinf_io *io, struct zinf_io_req *r);
/** Queue a read/write as one call: fills *r and submits it. */
ZINF_API int zinf_io_read_async(struct zinf_io *io, struct zinf_io_req *r, struct zinf_io_file *f,
				void *buf, size_t len, uint64_t offset);
ZINF_API int zinf_io_write_async(struct zinf_io *io, struct zinf_io_req *r, struct zinf_io_file *f,
				 const void *buf, size_t len, uint64_t offset);
/**
 * 1 if r has completed (its result is set), 0 if it is still in flight; -EINVAL for a NULL
 * context or request, or one not submitted to this context. A request whose submission was
 * refused is complete, with the refusal's error as its result.
 */
ZINF_API int zinf_io_poll(struct zinf_io *io, struct zinf_io_req *r);
/**
 * Block until r completes. Returns 0 if it transferred all its bytes, else its -errno (for a
 * request whose submission was refused, that error, at once); -EINVAL as zinf_io_poll().
 */
ZINF_API int zinf_io_wait(struct zinf_io *io, struct zinf_io_req *r);
/**
 * Block until all n requests complete. Returns 0, or the error of the first failed one in
 * array order (each request's own result says which failed).
 */
ZINF_API int zinf_io_wait_all(struct zinf_io *io, struct zinf_io_req *const *rs, size_t n);
/** Synchronous helpers: submit and wait. */
ZINF_API int zinf_io_pread(struct zinf_io *io, struct zinf_io_file *f, void *buf, size_t len,
			   uint64_t offset);
ZINF_API int zinf_io_pwrite(struct zinf_io *io, struct zinf_io_file *f, const void *buf, size_t len,
			    uint64_t offset);

/**
 * Register buffers with the backend (io_uring fixed buffers); requests whose buffer lies inside
 * a registered one use it. Replaces any earlier registration; n = 0 unregisters. Registration
 * is an optimisation, so these return 0 without registering anything (requests then use the
 * buffers unregistered): a backend without registration (libaio, psync), and a kernel that
 * refuses to pin the buffers for a process without CAP_IPC_LOCK over RLIMIT_MEMLOCK (one
 * warning with the limit and `ulimit -l`). zinf_io_buffers_registered() tells which.
 * Returns 0; -EINVAL (NULL context, NULL iov with n > 0, a buffer that is NULL or wraps the
 * address space); -EBUSY while requests are in flight; -ENOMEM; another -errno from the kernel.
 * I/O buffers are best allocated with zinf_alloc_huge() (zinf/common.h).
 */
ZINF_API int zinf_io_register_buffers(struct zinf_io *io, const struct iovec *iov, unsigned n);
/** Buffers the backend holds registered (0: none, or a NULL context). */
ZINF_API unsigned zinf_io_buffers_registered(const struct zinf_io *io);

/* ---- fault injection (backend "fault") ---------------------------------------------------- */

enum zinf_io_fault_kind {
	ZINF_IO_FAULT_FAIL = 0,	 /* the op completes with -err and transfers nothing */
	ZINF_IO_FAULT_SHORT = 1, /* the op transfers short_bytes fewer bytes (rounded to align) */
};

struct zinf_io_fault {
	enum zinf_io_fault_kind kind;
	int op;		      /* ZINF_IO_READ, ZINF_IO_WRITE, or -1 for either */
	uint64_t nth;	      /* 1-based: the n-th block op of that direction from now */
	uint64_t count;	      /* how many consecutive matching ops are hit; 0 means 1 */
	int err;	      /* FAIL: positive errno to report (e.g. EIO) */
	uint32_t short_bytes; /* SHORT */
};

/** Arm a fault on a "fault" context. -EINVAL on any other backend or a bad rule. */
ZINF_API int zinf_io_fault_add(struct zinf_io *io, const struct zinf_io_fault *rule);
/** Block ops seen by the fault backend so far, by direction (for tests). */
ZINF_API uint64_t zinf_io_fault_ops(const struct zinf_io *io, int op);

/* ---- statistics --------------------------------------------------------------------------- */

struct zinf_io_stats {
	size_t size;			    /* sizeof(struct zinf_io_stats), set by the caller */
	uint64_t bytes_read, bytes_written; /* completed */
	uint64_t reqs, blocks;		    /* submitted */
	uint64_t short_retries, eagain_retries, errors;
	uint64_t max_inflight; /* most block ops in flight at once over all workers */
	uint64_t wakeups;      /* sleeping workers woken by a submitter (worker backends) */
};
/**
 * Copy the statistics into *out (out->size set by the caller: a caller built against an older,
 * smaller struct gets the fields it knows). Returns 0; -EINVAL (NULL, out->size too small).
 */
ZINF_API int zinf_io_get_stats(const struct zinf_io *io, struct zinf_io_stats *out);

#ifdef __cplusplus
}
#endif
#endif
