/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvme/io.c: the generic I/O core behind include/zinf/io.h. It chooses a backend, opens files
 * (O_DIRECT, alignment from the file system), validates requests, splits them into blocks and
 * runs the worker threads: each keeps up to queue_depth blocks in flight, refilled from one
 * queue shared by all requests, checks every completion (short: resubmit the remainder;
 * EINTR/EAGAIN: retry; other errors fail that request only) and completes requests.
 *
 * It does not move bytes itself (the backends do) and it never blocks a submitter on the disk.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <linux/futex.h>
#include <linux/magic.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <linux/fs.h>

#include "nvme/io_internal.h"

_Static_assert(sizeof(((struct zinf_io_req *)0)->priv) >= 6 * sizeof(uint64_t), "priv");

/* The request's bookkeeping in r->priv. */
enum {
	P_REMAIN = 0, /* bytes whose blocks have not finished (atomic) */
	P_CURSOR = 1, /* bytes already split into blocks (under qlock) */
	P_NEXT = 2,   /* next request in the shared queue */
	P_STATE = 3,  /* low 32 bits: futex word, see REQ_* */
	P_ERR = 4,    /* first error, negative errno (atomic) */
	P_IO = 5,     /* the context, to catch a request waited on in the wrong one */
};

enum { REQ_PENDING = 0, REQ_WAITED = 1, REQ_DONE = 2 };

#define RETRY_MAX 10000 /* EINTR/EAGAIN resubmissions of one block before giving up */

static const char *const op_name[] = {"read", "write"};

static uint32_t *
req_state(struct zinf_io_req *r)
{
	return (uint32_t *)&r->priv[P_STATE];
}

/* ---- options and backend choice ----------------------------------------------------------- */

ZINF_API void
zinf_io_opts_init(struct zinf_io_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	o->queue_depth = 32;
	o->block_size = 1u << 20;
	o->threads = 1;
}

int
zinf_io_worker_init(struct zinf_io_worker *w, struct zinf_io *io, unsigned id, unsigned depth)
{
	w->io = io;
	w->id = id;
	w->depth = depth;
	w->wake_fd = -1;
	w->sleeping = 0;
	w->blks = zinf_calloc(depth, sizeof(*w->blks));
	w->free_blks = zinf_calloc(depth, sizeof(*w->free_blks));
	w->pending = zinf_calloc(depth, sizeof(*w->pending));
	w->reaped = zinf_calloc(depth, sizeof(*w->reaped));
	if (!w->blks || !w->free_blks || !w->pending || !w->reaped) {
		zinf_io_worker_fini(w);
		return -ENOMEM;
	}
	for (unsigned i = 0; i < depth; i++) {
		w->blks[i].idx = i;
		w->free_blks[i] = &w->blks[depth - 1 - i];
	}
	w->nfree = depth;
	return 0;
}

void
zinf_io_worker_fini(struct zinf_io_worker *w)
{
	zinf_free(w->blks);
	zinf_free(w->free_blks);
	zinf_free(w->pending);
	zinf_free(w->reaped);
	w->blks = NULL;
	w->free_blks = w->pending = w->reaped = NULL;
}

static void
workers_destroy(struct zinf_io *io)
{
	for (unsigned i = 0; i < io->nworkers; i++) {
		if (io->workers[i]) {
			io->ops->worker_destroy(io->workers[i]);
		}
	}
	zinf_free(io->workers);
	io->workers = NULL;
	if (io->ops && io->ops->fini) {
		io->ops->fini(io);
	}
	io->be = NULL;
}

/* The test hook's state (zinf_io_test_refuse): process-wide, like the allocation hook. */
static struct {
	const char *name;
	int err;
} refused_by_test[4];

void
zinf_io_test_refuse(const char *backend, int err)
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
	io->workers = zinf_calloc(n, sizeof(*io->workers));
	if (!io->workers) {
		return -ENOMEM;
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
	return ZINF_FAIL(rc, "no I/O backend works");
}

static void *worker_main(void *arg);

ZINF_API int
zinf_io_create(const struct zinf_io_opts *opts, struct zinf_io **out)
{
	struct zinf_io_opts o;
	struct zinf_io *io;
	unsigned started = 0;
	int rc;

	zinf_io_opts_init(&o);
	if (opts) {
		if (opts->size < offsetof(struct zinf_io_opts, fault_inner) ||
		    opts->size > sizeof(o)) {
			return ZINF_FAIL(-EINVAL,
					 "zinf_io_opts.size %zu unknown (call "
					 "zinf_io_opts_init)",
					 opts->size);
		}
		memcpy(&o, opts, opts->size);
		o.size = sizeof(o);
	}
	if (!o.queue_depth) {
		o.queue_depth = 32;
	}
	if (!o.block_size) {
		o.block_size = 1u << 20;
	}
	if (!o.threads) {
		o.threads = 1;
	}
	if (!ZINF_IS_POW2(o.block_size) || o.block_size < 4096 || o.block_size > (1u << 30)) {
		return ZINF_FAIL(-EINVAL, "block_size %u must be a power of two in [4096, 1 GiB]",
				 o.block_size);
	}
	if (o.queue_depth > 4096 || o.threads > 64) {
		return ZINF_FAIL(-EINVAL,
				 "queue_depth %u (max 4096) or threads %u (max 64) too large",
				 o.queue_depth, o.threads);
	}

	io = zinf_calloc(1, sizeof(*io));
	if (!io) {
		return -ENOMEM;
	}
	io->opts = o;
	pthread_mutex_init(&io->qlock, NULL);
	pthread_cond_init(&io->qcv, NULL);
	pthread_mutex_init(&io->flock, NULL);
	pthread_cond_init(&io->fcv, NULL);

	const struct zinf_io_ops *ops = NULL;
	if (o.backend) {
		ops = zinf_io_ops_find(o.backend);
		if (!ops) {
			rc = ZINF_FAIL(-EINVAL,
				       "unknown I/O backend \"%s\" (io_uring, libaio, psync, "
				       "fault)",
				       o.backend);
			goto fail;
		}
	}
	if (ops && (ops->flags & ZINF_IO_F_WRAPPER)) {
		const struct zinf_io_ops *inner = NULL;
		if (o.fault_inner) {
			inner = zinf_io_ops_find(o.fault_inner);
			if (!inner || (inner->flags & ZINF_IO_F_WRAPPER)) {
				rc = ZINF_FAIL(-EINVAL, "fault_inner \"%s\" is not a backend",
					       o.fault_inner);
				goto fail;
			}
			rc = backend_try(io, ops, inner);
			if (rc < 0) {
				rc = ZINF_FAIL(rc == -ENOMEM ? rc : -ENODEV,
					       "I/O backend %s unavailable: %s", inner->name,
					       strerror(-rc));
				goto fail;
			}
		} else if ((rc = backend_best(io, ops)) < 0) {
			goto fail;
		}
		io->opts.fault_inner = io->inner_ops->name;
	} else if (ops) {
		rc = backend_try(io, ops, NULL);
		if (rc < 0) {
			rc = ZINF_FAIL(rc == -ENOMEM ? rc : -ENODEV,
				       "I/O backend %s unavailable: %s", ops->name,
				       rc == -ENODEV ? "not built" : strerror(-rc));
			goto fail;
		}
	} else if ((rc = backend_best(io, NULL)) < 0) {
		goto fail;
	}
	io->opts.backend = io->ops->name;

	for (started = 0; started < io->nworkers; started++) {
		rc = -pthread_create(&io->workers[started]->thread, NULL, worker_main,
				     io->workers[started]);
		if (rc < 0) {
			ZINF_ERR("cannot start I/O worker thread: %s", strerror(-rc));
			goto fail_threads;
		}
	}
	*out = io;
	return 0;

fail_threads:
	pthread_mutex_lock(&io->qlock);
	io->stopping = true;
	pthread_cond_broadcast(&io->qcv);
	pthread_mutex_unlock(&io->qlock);
	for (unsigned i = 0; i < started; i++) {
		pthread_join(io->workers[i]->thread, NULL);
	}
	workers_destroy(io);
fail:
	pthread_mutex_destroy(&io->qlock);
	pthread_cond_destroy(&io->qcv);
	pthread_mutex_destroy(&io->flock);
	pthread_cond_destroy(&io->fcv);
	zinf_free(io);
	return rc;
}

ZINF_API void
zinf_io_destroy(struct zinf_io *io)
{
	if (!io) {
		return;
	}
	pthread_mutex_lock(&io->qlock);
	io->stopping = true;
	pthread_cond_broadcast(&io->qcv);
	pthread_mutex_unlock(&io->qlock);
	for (unsigned i = 0; i < io->nworkers; i++) {
		pthread_join(io->workers[i]->thread, NULL);
	}
	while (io->file_list) {
		zinf_io_file_close(io, io->file_list);
	}
	workers_destroy(io);
	zinf_free(io->regs);
	pthread_mutex_destroy(&io->qlock);
	pthread_cond_destroy(&io->qcv);
	pthread_mutex_destroy(&io->flock);
	pthread_cond_destroy(&io->fcv);
	zinf_free(io);
}

ZINF_API const char *
zinf_io_backend(const struct zinf_io *io)
{
	return io->ops->name;
}

ZINF_API void
zinf_io_get_opts(const struct zinf_io *io, struct zinf_io_opts *out)
{
	*out = io->opts;
}

ZINF_API void
zinf_io_get_stats(const struct zinf_io *io, struct zinf_io_stats *out)
{
	const uint64_t *s = (const uint64_t *)&io->stats;
	uint64_t *d = (uint64_t *)out;
	for (size_t i = 0; i < sizeof(*out) / sizeof(uint64_t); i++) {
		d[i] = __atomic_load_n(&s[i], __ATOMIC_RELAXED);
	}
}

/* ---- files -------------------------------------------------------------------------------- */

/*
 * Direct-I/O alignment of an open file: statx STATX_DIOALIGN (raw syscall with the kernel's
 * layout, so older headers do not matter), else the device's logical block size, else 4096.
 */
#define ZINF_STATX_DIOALIGN 0x2000u
#define ZINF_STATX_OFF_MASK 0x00
#define ZINF_STATX_OFF_MEM  0x98 /* stx_dio_mem_align */
#define ZINF_STATX_OFF_OFF  0x9c /* stx_dio_offset_align */

static uint32_t
sysfs_lbs(unsigned maj, unsigned min)
{
	static const char *const fmt[] = {"/sys/dev/block/%u:%u/queue/logical_block_size",
					  "/sys/dev/block/%u:%u/../queue/logical_block_size"};
	for (unsigned i = 0; i < 2; i++) {
		char p[128];
		unsigned v = 0;
		snprintf(p, sizeof(p), fmt[i], maj, min);
		FILE *fp = fopen(p, "re");
		if (!fp) {
			continue;
		}
		int ok = fscanf(fp, "%u", &v) == 1;
		fclose(fp);
		if (ok && ZINF_IS_POW2(v)) {
			return v;
		}
	}
	return 0;
}

static uint32_t
probe_align(int fd)
{
	uint8_t sx[256] __attribute__((aligned(8))) = {0};
	struct stat st;

	if (syscall(SYS_statx, fd, "", AT_EMPTY_PATH, ZINF_STATX_DIOALIGN, sx) == 0) {
		uint32_t mask, mem, off;
		memcpy(&mask, sx + ZINF_STATX_OFF_MASK, 4);
		memcpy(&mem, sx + ZINF_STATX_OFF_MEM, 4);
		memcpy(&off, sx + ZINF_STATX_OFF_OFF, 4);
		if ((mask & ZINF_STATX_DIOALIGN) && off && mem) {
			return ZINF_MAX(mem, off);
		}
	}
	if (fstat(fd, &st) == 0) {
		if (S_ISBLK(st.st_mode)) {
			int lbs = 0;
			if (ioctl(fd, BLKSSZGET, &lbs) == 0 && lbs > 0) {
				return (uint32_t)lbs;
			}
		} else {
			uint32_t v = sysfs_lbs(major(st.st_dev), minor(st.st_dev));
			if (v) {
				return v;
			}
		}
	}
	return 4096;
}

/* Name of a file system that only pretends to do O_DIRECT (or NULL). */
static const char *
fake_direct_fs(const char *path)
{
	struct statfs sf;
	if (statfs(path, &sf) < 0) {
		char *dup = zinf_strdup(path);
		int rc = dup ? statfs(dirname(dup), &sf) : -1;
		zinf_free(dup);
		if (rc < 0) {
			return NULL;
		}
	}
	switch ((unsigned long)sf.f_type) {
	case TMPFS_MAGIC:
		return "tmpfs";
	case RAMFS_MAGIC:
		return "ramfs";
	default:
		return NULL;
	}
}

ZINF_API int
zinf_io_file_open(struct zinf_io *io, const char *path, unsigned flags, struct zinf_io_file **out)
{
	bool direct = !(flags & ZINF_IO_BUFFERED);
	int oflags = O_CLOEXEC | ((flags & ZINF_IO_RDWR) ? O_RDWR : O_RDONLY);
	struct zinf_io_file *f;
	int rc;

	if (!path || !out) {
		return ZINF_FAIL(-EINVAL, "zinf_io_file_open: NULL path or out");
	}
	bool either = flags & ZINF_IO_DIRECT_OR_BUFFERED;
	oflags |= (flags & ZINF_IO_CREATE) ? O_CREAT : 0;
	oflags |= (flags & ZINF_IO_TRUNC) ? O_TRUNC : 0;
	if (direct) {
		const char *fs = fake_direct_fs(path);
		if (fs && either) {
			ZINF_INFO("%s: %s does not do direct I/O: buffered", path, fs);
			direct = false;
		} else if (fs) {
			return ZINF_FAIL(-EINVAL,
					 "%s: the file system (%s) does not do direct I/O "
					 "(O_DIRECT); use a disk-backed directory or ask for "
					 "buffered I/O (ZINF_IO_BUFFERED)",
					 path, fs);
		}
	}
	f = zinf_calloc(1, sizeof(*f));
	if (!f) {
		return -ENOMEM;
	}
	f->path = zinf_strdup(path);
	if (!f->path) {
		rc = -ENOMEM;
		goto fail_free;
	}
	f->io = io;
	f->writable = flags & ZINF_IO_RDWR;
	f->direct = direct;
	f->slot = -1;
	f->fd = open(path, oflags | (direct ? O_DIRECT : 0), 0600);
	if (f->fd < 0 && errno == EINVAL && direct && either) {
		ZINF_INFO("%s: the file system refuses O_DIRECT: buffered", path);
		direct = false;
		f->direct = false;
		f->fd = open(path, oflags, 0600);
	}
	if (f->fd < 0) {
		rc = -errno;
		if (rc == -EINVAL && direct) {
			rc = ZINF_FAIL(-EINVAL,
				       "%s: the file system refuses direct I/O (O_DIRECT); "
				       "use a disk-backed directory or ask for buffered I/O "
				       "(ZINF_IO_BUFFERED)",
				       path);
		} else {
			ZINF_ERR("cannot open %s: %s", path, strerror(-rc));
		}
		goto fail_path;
	}
	f->align = direct ? probe_align(f->fd) : 1;

	/* A slot in the backends' registered-file tables, where there is one free. */
	pthread_mutex_lock(&io->flock);
	for (int s = 0; s < ZINF_IO_MAX_FILES; s++) {
		if (!io->files[s]) {
			io->files[s] = f;
			f->slot = s;
			break;
		}
	}
	f->next = io->file_list;
	if (f->next) {
		f->next->prev = f;
	}
	io->file_list = f;
	pthread_mutex_unlock(&io->flock);
	if (f->slot < 0) {
		/* Full table: the file still works, by descriptor. */
		ZINF_DEBUG("%s: no registered-file slot left; using the descriptor", path);
	} else if (io->ops->file_add) {
		unsigned i;
		for (i = 0; i < io->nworkers; i++) {
			if (io->ops->file_add(io->workers[i], f) < 0) {
				break;
			}
		}
		if (i < io->nworkers) {
			/* Not registered everywhere: use the descriptor in every ring. */
			while (i-- > 0) {
				io->ops->file_remove(io->workers[i], f);
			}
		} else {
			f->fixed = true;
		}
	}
	*out = f;
	return 0;

fail_path:
	zinf_free(f->path);
fail_free:
	zinf_free(f);
	return rc;
}

ZINF_API void
zinf_io_file_close(struct zinf_io *io, struct zinf_io_file *f)
{
	if (!f) {
		return;
	}
	pthread_mutex_lock(&io->flock);
	while (__atomic_load_n(&f->inflight, __ATOMIC_ACQUIRE) != 0) {
		pthread_cond_wait(&io->fcv, &io->flock);
	}
	pthread_mutex_unlock(&io->flock);
	/* Out of the rings before the slot is free for another file. */
	if (f->fixed && io->ops->file_remove) {
		for (unsigned i = 0; i < io->nworkers; i++) {
			io->ops->file_remove(io->workers[i], f);
		}
	}
	pthread_mutex_lock(&io->flock);
	if (f->slot >= 0) {
		io->files[f->slot] = NULL;
	}
	if (f->prev) {
		f->prev->next = f->next;
	} else {
		io->file_list = f->next;
	}
	if (f->next) {
		f->next->prev = f->prev;
	}
	pthread_mutex_unlock(&io->flock);
	close(f->fd);
	zinf_free(f->path);
	zinf_free(f);
}

ZINF_API bool
zinf_io_file_direct(const struct zinf_io_file *f)
{
	return f->direct;
}

ZINF_API uint32_t
zinf_io_file_align(const struct zinf_io_file *f)
{
	return f->align;
}

ZINF_API const char *
zinf_io_file_path(const struct zinf_io_file *f)
{
	return f->path;
}

ZINF_API int
zinf_io_file_fd(const struct zinf_io_file *f)
{
	return f->fd;
}

/* ---- requests ----------------------------------------------------------------------------- */

/* Mark r complete, wake its waiters, then run its callback: the engine does not touch r
 * after the callback, so the callback may reuse or free it. */
static void
req_complete(struct zinf_io *io, struct zinf_io_req *r)
{
	void (*done)(struct zinf_io_req *, void *) = r->done;
	void *arg = r->arg;
	struct zinf_io_file *f = r->file;
	int64_t err = (int64_t)__atomic_load_n(&r->priv[P_ERR], __ATOMIC_ACQUIRE);

	r->result = err ? err : (int64_t)r->len;
	if (__atomic_sub_fetch(&f->inflight, 1, __ATOMIC_ACQ_REL) == 0) {
		/* f may be freed by a closer from here on. */
		pthread_mutex_lock(&io->flock);
		pthread_cond_broadcast(&io->fcv);
		pthread_mutex_unlock(&io->flock);
	}
	__atomic_sub_fetch(&io->inflight_reqs, 1, __ATOMIC_RELEASE);
	if (__atomic_exchange_n(req_state(r), REQ_DONE, __ATOMIC_ACQ_REL) == REQ_WAITED) {
		syscall(SYS_futex, req_state(r), FUTEX_WAKE_PRIVATE, INT_MAX, NULL, NULL, 0);
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

	if (err) {
		uint64_t zero = 0;
		__atomic_compare_exchange_n(&r->priv[P_ERR], &zero, (uint64_t)err, false,
					    __ATOMIC_RELEASE, __ATOMIC_RELAXED);
		ZINF_IO_ATOMIC_ADD(&io->stats.errors, 1);
	} else {
		ZINF_IO_ATOMIC_ADD(b->op == ZINF_IO_READ ? &io->stats.bytes_read
							 : &io->stats.bytes_written,
				   b->len);
	}
	uint32_t len = b->len;
	b->req = NULL;
	w->free_blks[w->nfree++] = b;
	if (__atomic_sub_fetch(&r->priv[P_REMAIN], len, __ATOMIC_ACQ_REL) == 0) {
		req_complete(io, r);
	}
}

static void
blk_fail(struct zinf_io_worker *w, struct zinf_io_blk *b, int64_t err, const char *why)
{
	ZINF_ERR("%s %s: offset %llu length %u failed%s: %s (errno %d)", op_name[b->op],
		 b->file->path, (unsigned long long)(b->off + b->done), b->len - b->done, why,
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

/* Registered buffer that holds [p, p + len), or -1. Under qlock. */
static int
reg_index(const struct zinf_io *io, const char *p, size_t len)
{
	for (unsigned i = 0; i < io->nregs; i++) {
		const char *base = io->regs[i].iov_base;
		if (p >= base && p + len <= base + io->regs[i].iov_len) {
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
		uint64_t cur = r->priv[P_CURSOR];
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
		r->priv[P_CURSOR] = cur;
		/* Round robin: the head request goes to the back after each block, so a small
		 * request queued behind a large one does not wait for all of it. */
		struct zinf_io_req *next = (struct zinf_io_req *)(uintptr_t)r->priv[P_NEXT];
		if (cur == r->len || next) {
			/* Atomic: a worker about to sleep reads it without the lock. */
			__atomic_store_n(&io->qhead, next, __ATOMIC_RELAXED);
			if (!next) {
				io->qtail = NULL;
			}
		}
		if (cur < r->len && next) {
			r->priv[P_NEXT] = 0;
			io->qtail->priv[P_NEXT] = (uintptr_t)r;
			io->qtail = r;
		}
	}
}

static void *
worker_main(void *arg)
{
	struct zinf_io_worker *w = arg;
	struct zinf_io *io = w->io;
	const struct zinf_io_ops *ops = io->ops;

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

		/* Prepare everything pending, then one submission for the batch. */
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
		if (queued) {
			uint64_t now =
				__atomic_add_fetch(&io->inflight_blocks, queued, __ATOMIC_RELAXED);
			uint64_t max = __atomic_load_n(&io->stats.max_inflight, __ATOMIC_RELAXED);
			while (now > max && !__atomic_compare_exchange_n(
						    &io->stats.max_inflight, &max, now, true,
						    __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
			}
		}
		memmove(w->pending, w->pending + i, (w->npending - i) * sizeof(*w->pending));
		w->npending -= i;
		if (queued) {
			int rc = ops->submit(w);
			if (rc < 0 && rc != -EAGAIN && rc != -EBUSY && rc != -EINTR) {
				ZINF_WARN("%s: submission failed: %s; retrying", ops->name,
					  strerror(-rc));
			}
		}
		if (w->inflight == 0) {
			continue;
		}
		/*
		 * About to block in reap() with room for more blocks: say so, then look at the
		 * queue once more (the submitter does the mirror image: the queue's head, then
		 * `sleeping`; all four seq_cst). Either the request is seen here and reap() does
		 * not wait, or the submitter sees `sleeping` and wakes the backend's wait through
		 * wake_fd. (A queue that was already non-empty: this worker's take_blocks() left
		 * it empty or had no free block, so the request that made it non-empty did the
		 * seq_cst store of the head.)
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
		int n = ops->reap(w, w->reaped, min, w->inflight);
		if (armed) {
			__atomic_store_n(&w->sleeping, 0, __ATOMIC_RELAXED);
		}
		if (n < 0) {
			if (n != -EINTR && n != -EAGAIN) {
				ZINF_WARN("%s: reaping completions failed: %s; retrying", ops->name,
					  strerror(-n));
			}
			continue;
		}
		w->inflight -= (unsigned)n;
		__atomic_sub_fetch(&io->inflight_blocks, (uint64_t)n, __ATOMIC_RELAXED);
		for (int k = 0; k < n; k++) {
			blk_check(w, w->reaped[k]);
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

ZINF_API int
zinf_io_submit(struct zinf_io *io, struct zinf_io_req *r)
{
	if (!io || !r) {
		return ZINF_FAIL(-EINVAL, "zinf_io_submit: NULL context or request");
	}
	struct zinf_io_file *f = r->file;
	if (!f || (!r->buf && r->len) || (r->op != ZINF_IO_READ && r->op != ZINF_IO_WRITE)) {
		return ZINF_FAIL(-EINVAL, "zinf_io_submit: NULL file or buffer, or bad op %d",
				 (int)r->op);
	}
	if (f->io != io) {
		return ZINF_FAIL(-EINVAL, "%s: file belongs to another I/O context", f->path);
	}
	if (r->op == ZINF_IO_WRITE && !f->writable) {
		return ZINF_FAIL(-EBADF, "%s: write to a file opened read-only", f->path);
	}
	/* A file offset is an off_t: the request must end at or below INT64_MAX. */
	if (r->offset > (uint64_t)INT64_MAX || r->len > (uint64_t)INT64_MAX - r->offset) {
		return ZINF_FAIL(-EINVAL,
				 "%s: offset %llu + length %zu is past the largest file offset",
				 f->path, (unsigned long long)r->offset, r->len);
	}
	uint32_t a = f->align;
	if (a > 1 && (!ZINF_IS_ALIGNED((uintptr_t)r->buf, a) || !ZINF_IS_ALIGNED(r->offset, a) ||
		      !ZINF_IS_ALIGNED(r->len, a))) {
		return ZINF_FAIL(-EINVAL,
				 "%s %s: direct I/O needs buffer, offset and length "
				 "multiples of %u; got buffer %p (%% %u = %u), offset %llu "
				 "(%% %u = %llu), length %zu (%% %u = %zu)",
				 op_name[r->op], f->path, a, r->buf, a,
				 (unsigned)((uintptr_t)r->buf % a), (unsigned long long)r->offset,
				 a, (unsigned long long)(r->offset % a), r->len, a, r->len % a);
	}

	r->result = 0;
	r->priv[P_REMAIN] = r->len;
	r->priv[P_CURSOR] = 0;
	r->priv[P_NEXT] = 0;
	r->priv[P_STATE] = 0;
	r->priv[P_ERR] = 0;
	r->priv[P_IO] = (uintptr_t)io;
	__atomic_store_n(req_state(r), REQ_PENDING, __ATOMIC_RELAXED);
	__atomic_add_fetch(&f->inflight, 1, __ATOMIC_ACQ_REL);

	pthread_mutex_lock(&io->qlock);
	if (io->stopping) {
		pthread_mutex_unlock(&io->qlock);
		__atomic_sub_fetch(&f->inflight, 1, __ATOMIC_ACQ_REL);
		return ZINF_FAIL(-ESHUTDOWN, "zinf_io_submit: context is being destroyed");
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
		io->qtail->priv[P_NEXT] = (uintptr_t)r;
	} else {
		/* seq_cst: pairs with a sleeping worker's check (worker_main). */
		__atomic_store_n(&io->qhead, r, __ATOMIC_SEQ_CST);
	}
	io->qtail = r;
	pthread_cond_signal(&io->qcv); /* an idle worker (nothing in flight) */
	pthread_mutex_unlock(&io->qlock);
	wake_sleepers(io, ZINF_DIV_ROUND_UP(r->len, io->opts.block_size));
	return 0;
}

ZINF_API int
zinf_io_read_async(struct zinf_io *io, struct zinf_io_req *r, struct zinf_io_file *f, void *buf,
		   size_t len, uint64_t offset)
{
	if (!r) {
		return ZINF_FAIL(-EINVAL, "zinf_io_read_async: NULL request");
	}
	r->op = ZINF_IO_READ;
	r->file = f;
	r->buf = buf;
	r->len = len;
	r->offset = offset;
	r->done = NULL;
	r->arg = NULL;
	return zinf_io_submit(io, r);
}

ZINF_API int
zinf_io_write_async(struct zinf_io *io, struct zinf_io_req *r, struct zinf_io_file *f,
		    const void *buf, size_t len, uint64_t offset)
{
	if (!r) {
		return ZINF_FAIL(-EINVAL, "zinf_io_write_async: NULL request");
	}
	r->op = ZINF_IO_WRITE;
	r->file = f;
	r->buf = (void *)buf;
	r->len = len;
	r->offset = offset;
	r->done = NULL;
	r->arg = NULL;
	return zinf_io_submit(io, r);
}

ZINF_API int
zinf_io_poll(struct zinf_io *io, struct zinf_io_req *r)
{
	return __atomic_load_n(req_state(r), __ATOMIC_ACQUIRE) == REQ_DONE;
}

ZINF_API int
zinf_io_wait(struct zinf_io *io, struct zinf_io_req *r)
{
	uint32_t *st = req_state(r);
	uint32_t s = __atomic_load_n(st, __ATOMIC_ACQUIRE);

	while (s != REQ_DONE) {
		if (s == REQ_PENDING &&
		    !__atomic_compare_exchange_n(st, &s, REQ_WAITED, false, __ATOMIC_ACQ_REL,
						 __ATOMIC_ACQUIRE)) {
			continue; /* s reloaded */
		}
		syscall(SYS_futex, st, FUTEX_WAIT_PRIVATE, REQ_WAITED, NULL, NULL, 0);
		s = __atomic_load_n(st, __ATOMIC_ACQUIRE);
	}
	return r->result < 0 ? (int)r->result : 0;
}

ZINF_API int
zinf_io_wait_all(struct zinf_io *io, struct zinf_io_req *const *rs, size_t n)
{
	int first = 0;
	for (size_t i = 0; i < n; i++) {
		int rc = zinf_io_wait(io, rs[i]);
		if (rc < 0 && !first) {
			first = rc;
		}
	}
	return first;
}

ZINF_API int
zinf_io_pread(struct zinf_io *io, struct zinf_io_file *f, void *buf, size_t len, uint64_t offset)
{
	struct zinf_io_req r;
	int rc = zinf_io_read_async(io, &r, f, buf, len, offset);
	return rc < 0 ? rc : zinf_io_wait(io, &r);
}

ZINF_API int
zinf_io_pwrite(struct zinf_io *io, struct zinf_io_file *f, const void *buf, size_t len,
	       uint64_t offset)
{
	struct zinf_io_req r;
	int rc = zinf_io_write_async(io, &r, f, buf, len, offset);
	return rc < 0 ? rc : zinf_io_wait(io, &r);
}

ZINF_API int
zinf_io_register_buffers(struct zinf_io *io, const struct iovec *iov, unsigned n)
{
	struct iovec *copy = NULL;
	int rc = 0;

	if (n && !iov) {
		return ZINF_FAIL(-EINVAL, "zinf_io_register_buffers: NULL iov with n = %u", n);
	}
	if (n) {
		copy = zinf_calloc(n, sizeof(*copy));
		if (!copy) {
			return -ENOMEM;
		}
		memcpy(copy, iov, n * sizeof(*copy));
	}
	pthread_mutex_lock(&io->qlock);
	if (__atomic_load_n(&io->inflight_reqs, __ATOMIC_ACQUIRE) != 0) {
		pthread_mutex_unlock(&io->qlock);
		zinf_free(copy);
		return ZINF_FAIL(-EBUSY, "zinf_io_register_buffers: requests are in flight");
	}
	if (io->ops->register_buffers) {
		for (unsigned i = 0; i < io->nworkers && rc == 0; i++) {
			rc = io->ops->register_buffers(io->workers[i], iov, n);
		}
		if (rc < 0) {
			/* All or nothing: no worker keeps a partial registration. */
			for (unsigned i = 0; i < io->nworkers; i++) {
				io->ops->register_buffers(io->workers[i], NULL, 0);
			}
			zinf_free(copy);
			copy = NULL;
			n = 0;
		}
	}
	zinf_free(io->regs);
	io->regs = copy;
	io->nregs = n;
	pthread_mutex_unlock(&io->qlock);
	return rc < 0 ? ZINF_FAIL(rc, "%s: registering buffers failed: %s", io->ops->name,
				  strerror(-rc))
		      : 0;
}

/* ---- helpers for backends ----------------------------------------------------------------- */

int64_t
zinf_io_blk_sync(struct zinf_io_blk *b)
{
	ssize_t n;
	if (b->op == ZINF_IO_READ) {
		n = pread(b->file->fd, b->buf + b->done, b->xfer, (off_t)(b->off + b->done));
	} else {
		n = pwrite(b->file->fd, b->buf + b->done, b->xfer, (off_t)(b->off + b->done));
	}
	return n < 0 ? -errno : n;
}

/* ---- I/O buffers -------------------------------------------------------------------------- */

#define HUGE_2M (2u << 20)

ZINF_API void *
zinf_io_buf_alloc(size_t len)
{
	if (len == 0 || len > SIZE_MAX - 2 * (size_t)HUGE_2M) {
		return NULL;
	}
	size_t map_len = ZINF_ALIGN_UP(len, (size_t)HUGE_2M);
	/* Over-map by 2 MiB, then trim, so that the buffer starts on a huge-page boundary. */
	char *m = mmap(NULL, map_len + HUGE_2M, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED) {
		return NULL;
	}
	char *p = (char *)ZINF_ALIGN_UP((uintptr_t)m, (uintptr_t)HUGE_2M);
	if (p > m) {
		munmap(m, (size_t)(p - m));
	}
	if (p + map_len < m + map_len + HUGE_2M) {
		munmap(p + map_len, (size_t)(m + map_len + HUGE_2M - (p + map_len)));
	}
	/* Before the first touch: pages faulted in earlier stay 4 KiB. */
	(void)madvise(p, map_len, MADV_HUGEPAGE);
	return p;
}

ZINF_API void
zinf_io_buf_free(void *p, size_t len)
{
	if (p) {
		munmap(p, ZINF_ALIGN_UP(len, (size_t)HUGE_2M));
	}
}
