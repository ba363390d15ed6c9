/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvme/io.c: the I/O context behind include/zinf/blocks/io.h: its options, the choice of backend
 * (named, wrapped by fault, or the best that the kernel accepts, warning once about a refused
 * one), starting and stopping the worker threads, and the statistics.
 *
 * Not here: files and registration (io_file.c), requests and the workers' loop (io_queue.c),
 * moving bytes (the backends, io_<name>.c).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "common/opts.h"
#include "nvme/io_internal.h"

ZINF_OPTS_NO_TAIL_PAD(struct zinf_io_opts, fault_inner);

void
zinf_io_opts_init(struct zinf_io_opts *o)
{
	if (!o) {
		return;
	}
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	o->queue_depth = 32;
	o->block_size = 1u << 20;
	o->threads = 1;
}

const char *
io_name(const struct zinf_io *io)
{
	return io ? io->name : "I/O context (NULL)";
}

/* ---- backend choice ----------------------------------------------------------------------- */

static void
workers_destroy(struct zinf_io *io)
{
	for (unsigned i = 0; i < io->nworkers; i++) {
		if (io->workers[i]) {
			io->ops->worker_destroy(io->workers[i]);
		}
	}
	zc_free(io->workers);
	io->workers = NULL;
	if (io->ops && io->ops->fini) {
		io->ops->fini(io);
	}
	io->be = NULL;
}

/* The test hook's state (io_test_refuse): process-wide, like the allocation hook. */
static struct {
	const char *name;
	int err;
} refused_by_test[4];

void
io_test_refuse(const char *backend, int err)
{
	for (unsigned i = 0; i < ZINF_ARRAY_SIZE(refused_by_test); i++) {
		if (!backend) {
			__atomic_store_n(&refused_by_test[i].name, NULL, __ATOMIC_RELEASE);
		} else if (!__atomic_load_n(&refused_by_test[i].name, __ATOMIC_ACQUIRE)) {
			refused_by_test[i].err = err;
			__atomic_store_n(&refused_by_test[i].name, backend, __ATOMIC_RELEASE);
			return;
		}
	}
}

static int
test_refused(const char *backend)
{
	for (unsigned i = 0; i < ZINF_ARRAY_SIZE(refused_by_test); i++) {
		const char *n = __atomic_load_n(&refused_by_test[i].name, __ATOMIC_ACQUIRE);
		if (n && strcmp(n, backend) == 0) {
			return refused_by_test[i].err;
		}
	}
	return 0;
}

/* Set up `ops` (wrapping `inner` for fault) with all its workers; nothing on failure. */
static int
backend_try(struct zinf_io *io, const struct zinf_io_ops *ops, const struct zinf_io_ops *inner)
{
	const struct zinf_io_ops *engine = inner ? inner : ops;
	unsigned depth = io->opts.queue_depth;
	unsigned n = io->opts.threads;
	int rc;

	if ((rc = test_refused(engine->name)) < 0) {
		return rc;
	}
	if (engine->flags & ZINF_IO_F_SYNC) {
		/* pread/pwrite do one op at a time: queue depth becomes more threads. */
		n = ZINF_MIN(io->opts.threads * io->opts.queue_depth, 64u);
		n = ZINF_MAX(n, io->opts.threads);
		depth = 1;
	}
	io->ops = ops;
	io->inner_ops = inner;
	io->workers = zc_calloc(n, sizeof(*io->workers));
	if (!io->workers) {
		return IO_FAIL(io, -ENOMEM, "out of memory for %u workers", n);
	}
	io->nworkers = n;
	if (ops->init && (rc = ops->init(io, inner)) < 0) {
		goto fail;
	}
	for (unsigned i = 0; i < n; i++) {
		rc = ops->worker_create(io, i, depth, &io->workers[i]);
		if (rc < 0) {
			goto fail;
		}
	}
	return 0;
fail:
	workers_destroy(io);
	io->nworkers = 0;
	io->ops = NULL;
	io->inner_ops = NULL;
	return rc;
}

/* The best backend that works (registry order), warning once about a refused one. */
static int
backend_best(struct zinf_io *io, const struct zinf_io_ops *wrapper)
{
	char refused[256] = "";
	int rc = -ENODEV;

	for (unsigned i = 0; i < zinf_io_registry_len; i++) {
		const struct zinf_io_ops *ops = zinf_io_registry[i];
		if (ops->flags & ZINF_IO_F_WRAPPER) {
			continue;
		}
		rc = wrapper ? backend_try(io, wrapper, ops) : backend_try(io, ops, NULL);
		if (rc == 0) {
			/* Once per process at WARN: every context would say the same. */
			static int warned;
			if (refused[0] && !__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED)) {
				ZINF_WARN("%s: using %s", refused, ops->name);
			} else if (refused[0]) {
				ZINF_DEBUG("%s: using %s", refused, ops->name);
			}
			return 0;
		}
		/* Any other failure passes to the next backend: io_uring rings count against
		 * RLIMIT_MEMLOCK on older kernels, so even -ENOMEM may be a refusal. */
		if (rc != -ENODEV && !refused[0]) {
			snprintf(refused, sizeof(refused),
				 "I/O backend %s refused by the kernel (%s)", ops->name,
				 strerror(-rc));
		}
	}
	return ZINF_FAIL(rc, "no I/O backend works (io_uring, libaio, psync)");
}

/* The options in effect: the caller's over the defaults, zeros meaning "default", checked. */
static int
io_opts_take(struct zinf_io_opts *o, const struct zinf_io_opts *opts)
{
	zinf_io_opts_init(o);
	int rc = zc_opts_take(o, sizeof(*o), opts, "zinf_io_opts");
	if (rc < 0) {
		return rc;
	}
	if (!o->queue_depth) {
		o->queue_depth = 32;
	}
	if (!o->block_size) {
		o->block_size = 1u << 20;
	}
	if (!o->threads) {
		o->threads = 1;
	}
	if (!ZINF_IS_POW2(o->block_size) || o->block_size < 4096 || o->block_size > (1u << 30)) {
		return ZINF_FAIL(
			-EINVAL,
			"zinf_io_opts.block_size %u must be a power of two in [4096, 1 GiB]",
			o->block_size);
	}
	if (o->queue_depth > 4096 || o->threads > 64) {
		return ZINF_FAIL(-EINVAL,
				 "zinf_io_opts: queue_depth %u (max 4096) or threads %u (max 64) "
				 "too large",
				 o->queue_depth, o->threads);
	}
	return 0;
}

/*
 * A named backend that did not start: absent here (-ENODEV) when it was not built (the
 * registry's stub answers -ENODEV) or the kernel refuses it (EPERM: seccomp, io_uring_disabled,
 * a privilege it needs; ENOSYS: a kernel without it); any other failure is a real one and keeps
 * its errno (-ENOMEM, -EINVAL, -EAGAIN over fs.aio-max-nr, ...). Callers and tests treat -ENODEV
 * as "this backend is not on this machine" and everything else as an error.
 */
static int
backend_failed(const struct zinf_io_ops *ops, const char *as, int rc)
{
	if (rc == -ENODEV) {
		return ZINF_FAIL(-ENODEV, "I/O backend %s%s is not built into this zinf", ops->name,
				 as);
	}
	if (rc == -EPERM || rc == -ENOSYS) {
		return ZINF_FAIL(-ENODEV, "I/O backend %s%s refused by the kernel: %s%s", ops->name,
				 as, strerror(-rc),
				 strcmp(ops->name, "io_uring") == 0
					 ? " (seccomp, or /proc/sys/kernel/io_uring_disabled)"
					 : "");
	}
	return ZINF_FAIL(rc, "I/O backend %s%s failed to start: %s", ops->name, as, strerror(-rc));
}

/* A backend named in the options (fault: with its inner one, named or the best). */
static int
backend_named(struct zinf_io *io, const struct zinf_io_ops *ops)
{
	const struct zinf_io_ops *inner = NULL;
	int rc;

	if (!(ops->flags & ZINF_IO_F_WRAPPER)) {
		rc = backend_try(io, ops, NULL);
		return rc < 0 ? backend_failed(ops, "", rc) : 0;
	}
	if (!io->opts.fault_inner) {
		rc = backend_best(io, ops);
	} else {
		inner = io_ops_find(io->opts.fault_inner);
		if (!inner || (inner->flags & ZINF_IO_F_WRAPPER)) {
			return ZINF_FAIL(-EINVAL,
					 "zinf_io_opts.fault_inner \"%s\" is not a backend",
					 io->opts.fault_inner);
		}
		rc = backend_try(io, ops, inner);
		if (rc < 0) {
			rc = backend_failed(inner, " (wrapped by fault)", rc);
		}
	}
	if (rc == 0) {
		io->opts.fault_inner = io->inner_ops->name;
	}
	return rc;
}

static int
backend_choose(struct zinf_io *io)
{
	int rc;
	if (!io->opts.backend) {
		rc = backend_best(io, NULL);
	} else {
		const struct zinf_io_ops *ops = io_ops_find(io->opts.backend);
		if (!ops) {
			return ZINF_FAIL(-EINVAL,
					 "zinf_io_opts.backend: unknown I/O backend \"%s\" "
					 "(io_uring, libaio, psync, fault)",
					 io->opts.backend);
		}
		rc = backend_named(io, ops);
	}
	if (rc < 0) {
		return rc;
	}
	io->opts.backend = io->ops->name;
	if (io->inner_ops) {
		snprintf(io->name, sizeof(io->name), "%s(%s) I/O context", io->ops->name,
			 io->inner_ops->name);
	} else {
		snprintf(io->name, sizeof(io->name), "%s I/O context", io->ops->name);
	}
	return 0;
}

/* ---- the context -------------------------------------------------------------------------- */

/* Let the workers drain the queue and exit; join the first `started`. */
static void
workers_stop(struct zinf_io *io, unsigned started)
{
	pthread_mutex_lock(&io->qlock);
	io->stopping = true;
	pthread_cond_broadcast(&io->qcv);
	pthread_mutex_unlock(&io->qlock);
	for (unsigned i = 0; i < started; i++) {
		pthread_join(io->workers[i]->thread, NULL);
	}
}

static void
io_free(struct zinf_io *io)
{
	zc_free(io->regs);
	pthread_mutex_destroy(&io->qlock);
	pthread_cond_destroy(&io->qcv);
	pthread_mutex_destroy(&io->flock);
	pthread_cond_destroy(&io->fcv);
	zc_free(io);
}

int
zinf_io_create(const struct zinf_io_opts *opts, struct zinf_io **out)
{
	struct zinf_io_opts o;
	struct zinf_io *io;
	unsigned started;
	int rc;

	if (!out) {
		return ZINF_FAIL(-EINVAL, "zinf_io_create: NULL out");
	}
	if ((rc = io_opts_take(&o, opts)) < 0) {
		return rc;
	}
	io = zc_calloc(1, sizeof(*io));
	if (!io) {
		return IO_FAIL(NULL, -ENOMEM, "zinf_io_create: out of memory");
	}
	io->opts = o;
	snprintf(io->name, sizeof(io->name), "I/O context");
	pthread_mutex_init(&io->qlock, NULL);
	pthread_cond_init(&io->qcv, NULL);
	pthread_mutex_init(&io->flock, NULL);
	pthread_cond_init(&io->fcv, NULL);
	if ((rc = backend_choose(io)) < 0) {
		goto fail;
	}
	for (started = 0; started < io->nworkers; started++) {
		rc = -pthread_create(&io->workers[started]->thread, NULL, io_worker_main,
				     io->workers[started]);
		if (rc < 0) {
			IO_FAIL(io, rc, "cannot start I/O worker thread %u: %s", started,
				strerror(-rc));
			goto fail_threads;
		}
	}
	*out = io;
	return 0;

fail_threads:
	workers_stop(io, started);
	workers_destroy(io);
fail:
	io_free(io);
	return rc;
}

void
zinf_io_destroy(struct zinf_io *io)
{
	if (!io) {
		return;
	}
	workers_stop(io, io->nworkers);
	while (io->file_list) {
		zinf_io_file_close(io, io->file_list);
	}
	workers_destroy(io);
	io_free(io);
}

const char *
zinf_io_backend(const struct zinf_io *io)
{
	return io ? io->ops->name : "";
}

void
zinf_io_get_opts(const struct zinf_io *io, struct zinf_io_opts *out)
{
	if (!out) {
		return;
	}
	if (!io) {
		zinf_io_opts_init(out);
		return;
	}
	*out = io->opts;
}

int
zinf_io_get_stats(const struct zinf_io *io, struct zinf_io_stats *out)
{
	if (!io) {
		return ZINF_FAIL(-EINVAL, "zinf_io_get_stats: NULL context");
	}
	const struct zinf_io_counters *c = &io->stats;
	struct zinf_io_stats s = {
		.size = sizeof(s),
		.bytes_read = __atomic_load_n(&c->bytes_read, __ATOMIC_RELAXED),
		.bytes_written = __atomic_load_n(&c->bytes_written, __ATOMIC_RELAXED),
		.reqs = __atomic_load_n(&c->reqs, __ATOMIC_RELAXED),
		.blocks = __atomic_load_n(&c->blocks, __ATOMIC_RELAXED),
		.short_retries = __atomic_load_n(&c->short_retries, __ATOMIC_RELAXED),
		.eagain_retries = __atomic_load_n(&c->eagain_retries, __ATOMIC_RELAXED),
		.errors = __atomic_load_n(&c->errors, __ATOMIC_RELAXED),
		.max_inflight = __atomic_load_n(&c->max_inflight, __ATOMIC_RELAXED),
		.wakeups = __atomic_load_n(&io->stats_wakeups, __ATOMIC_RELAXED),
	};
	return zc_stats_give(out, &s, sizeof(s), "zinf_io_stats");
}
