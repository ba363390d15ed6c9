/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvme/io_file.c: files and registration. Opening a file in a context (O_DIRECT unless asked
 * otherwise; the direct-I/O alignment read from the file system; file systems that only
 * pretend to do O_DIRECT refused or, on request, opened buffered), its slot in the backends'
 * registered-file tables, closing (after its requests), and registering buffers with the
 * backends (all workers or none; a refusal for lack of lockable memory is a warning).
 *
 * Not here: requests (io_queue.c), context creation (io.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <linux/magic.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <linux/fs.h>

#include "nvme/io_internal.h"

/* What every refusal of O_DIRECT says: the three ways to ask for buffered I/O. */
#define ASK_BUFFERED                                                                               \
	"use a disk-backed directory, or ask for buffered I/O (ZINF_IO_BUFFERED; swap: "           \
	"zinf_swap_opts.buffered; the zinf command: --buffered)"

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
		char *dup = zc_strdup(path);
		int rc = dup ? statfs(dirname(dup), &sf) : -1;
		zc_free(dup);
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

/*
 * Open path's descriptor with O_DIRECT unless flags say buffered (or, with
 * ZINF_IO_DIRECT_OR_BUFFERED, the file system does not do direct I/O). Sets f->fd, f->direct.
 */
static int
file_open_fd(struct zinf_io_file *f, unsigned flags)
{
	const char *path = f->path;
	bool direct = !(flags & ZINF_IO_BUFFERED);
	bool either = flags & ZINF_IO_DIRECT_OR_BUFFERED;
	int oflags = O_CLOEXEC | ((flags & ZINF_IO_RDWR) ? O_RDWR : O_RDONLY);

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
					 "(O_DIRECT); " ASK_BUFFERED,
					 path, fs);
		}
	}
	f->fd = open(path, oflags | (direct ? O_DIRECT : 0), 0600);
	if (f->fd < 0 && errno == EINVAL && direct && either) {
		ZINF_INFO("%s: the file system refuses O_DIRECT: buffered", path);
		direct = false;
		f->fd = open(path, oflags, 0600);
	}
	if (f->fd < 0) {
		int e = errno;
		if (e == EINVAL && direct) {
			return ZINF_FAIL(
				-EINVAL,
				"%s: the file system refuses direct I/O (O_DIRECT); " ASK_BUFFERED,
				path);
		}
		return ZINF_FAIL(-e, "cannot open %s: %s", path, strerror(e));
	}
	f->direct = direct;
	return 0;
}

/* Give f a slot in the backends' registered-file tables where one is free, and list it. */
static void
file_slot_add(struct zinf_io *io, struct zinf_io_file *f)
{
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
		ZINF_DEBUG("%s: no registered-file slot left; using the descriptor", f->path);
		return;
	}
	if (!io->ops->file_add) {
		return;
	}
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

int
zinf_io_file_open(struct zinf_io *io, const char *path, unsigned flags, struct zinf_io_file **out)
{
	if (!io || !path || !out) {
		return ZINF_FAIL(-EINVAL, "zinf_io_file_open: NULL %s",
				 !io	 ? "context"
				 : !path ? "path"
					 : "out");
	}
	struct zinf_io_file *f = zc_calloc(1, sizeof(*f));
	if (!f) {
		return IO_FAIL(io, -ENOMEM, "opening %s: out of memory", path);
	}
	int rc = -ENOMEM;
	f->path = zc_strdup(path);
	if (!f->path) {
		rc = IO_FAIL(io, -ENOMEM, "opening %s: out of memory", path);
		goto fail_free;
	}
	f->io = io;
	f->writable = flags & ZINF_IO_RDWR;
	f->slot = -1;
	rc = file_open_fd(f, flags);
	if (rc < 0) {
		goto fail_path;
	}
	f->align = f->direct ? probe_align(f->fd) : 1;
	file_slot_add(io, f);
	*out = f;
	return 0;

fail_path:
	zc_free(f->path);
fail_free:
	zc_free(f);
	return rc;
}

void
zinf_io_file_close(struct zinf_io *io, struct zinf_io_file *f)
{
	if (!f) {
		return;
	}
	if (io != f->io) {
		/* Closed through its own context all the same: a wrong handle must not crash. */
		IO_FILE_LOG(f, ZINF_LOG_WARN, "zinf_io_file_close: given %s, not the file's own",
			    io ? "another I/O context" : "a NULL context");
		io = f->io;
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
	zc_free(f->path);
	zc_free(f);
}

bool
zinf_io_file_direct(const struct zinf_io_file *f)
{
	return f ? f->direct : false;
}

uint32_t
zinf_io_file_align(const struct zinf_io_file *f)
{
	return f ? f->align : 0;
}

const char *
zinf_io_file_path(const struct zinf_io_file *f)
{
	return f ? f->path : "";
}

int
zinf_io_file_fd(const struct zinf_io_file *f)
{
	return f ? f->fd : -EBADF;
}

/* ---- registered buffers ------------------------------------------------------------------- */

/* Check the iovecs: none NULL with a length, none whose end wraps the address space. */
static int
regs_check(struct zinf_io *io, const struct iovec *iov, unsigned n, uint64_t *bytes)
{
	*bytes = 0;
	if (n && !iov) {
		return IO_FAIL(io, -EINVAL, "zinf_io_register_buffers: NULL iov with n = %u", n);
	}
	for (unsigned i = 0; i < n; i++) {
		uintptr_t base = (uintptr_t)iov[i].iov_base;
		if ((!base && iov[i].iov_len) || iov[i].iov_len > UINTPTR_MAX - base) {
			return IO_FAIL(
				io, -EINVAL,
				"zinf_io_register_buffers: buffer %u (%p, %zu bytes) is NULL "
				"or wraps the address space",
				i, iov[i].iov_base, iov[i].iov_len);
		}
		*bytes += iov[i].iov_len;
	}
	return 0;
}

/*
 * The backend refused to pin the buffers (ENOMEM/EPERM: over RLIMIT_MEMLOCK without
 * CAP_IPC_LOCK). A handled fallback: requests go unregistered. One warning with the limit.
 */
static void
regs_refused(struct zinf_io *io, unsigned n, uint64_t bytes, int rc)
{
	struct rlimit rl = {0};
	char limit[64] = "unknown";
	if (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur == RLIM_INFINITY) {
		snprintf(limit, sizeof(limit), "unlimited");
	} else if (rl.rlim_cur != 0 || rl.rlim_max != 0) {
		snprintf(limit, sizeof(limit), "%llu bytes", (unsigned long long)rl.rlim_cur);
	}
	IO_LOG(io, ZINF_LOG_WARN,
	       "registering %u buffers (%llu bytes) refused: %s; locked memory (RLIMIT_MEMLOCK) "
	       "is %s for a process without CAP_IPC_LOCK; requests use unregistered buffers "
	       "(raise the limit with `ulimit -l` or in /etc/security/limits.conf)",
	       n, (unsigned long long)bytes, strerror(-rc), limit);
}

/* Register in every worker, all or none. 0, 1 (refused: none registered) or -errno. */
static int
regs_backend(struct zinf_io *io, const struct iovec *iov, unsigned n, uint64_t bytes)
{
	int rc = 0;
	for (unsigned i = 0; i < io->nworkers && rc == 0; i++) {
		rc = io->ops->register_buffers(io->workers[i], iov, n);
	}
	if (rc == 0) {
		return 0;
	}
	/* All or nothing: no worker keeps a partial registration. */
	for (unsigned i = 0; i < io->nworkers; i++) {
		io->ops->register_buffers(io->workers[i], NULL, 0);
	}
	if (rc == -EOPNOTSUPP) {
		return 1; /* a wrapper (fault) around a backend without registration */
	}
	if (rc == -ENOMEM || rc == -EPERM) {
		regs_refused(io, n, bytes, rc);
		return 1;
	}
	return IO_FAIL(io, rc, "registering %u buffers (%llu bytes) failed: %s", n,
		       (unsigned long long)bytes, strerror(-rc));
}

int
zinf_io_register_buffers(struct zinf_io *io, const struct iovec *iov, unsigned n)
{
	struct iovec *copy = NULL;
	uint64_t bytes;
	int rc;

	if (!io) {
		return IO_FAIL(io, -EINVAL, "zinf_io_register_buffers: NULL context");
	}
	if ((rc = regs_check(io, iov, n, &bytes)) < 0) {
		return rc;
	}
	if (n && io->ops->register_buffers) {
		copy = zc_calloc(n, sizeof(*copy));
		if (!copy) {
			return IO_FAIL(io, -ENOMEM, "registering %u buffers: out of memory", n);
		}
		memcpy(copy, iov, n * sizeof(*copy));
	}
	pthread_mutex_lock(&io->qlock);
	if (__atomic_load_n(&io->inflight_reqs, __ATOMIC_ACQUIRE) != 0) {
		pthread_mutex_unlock(&io->qlock);
		zc_free(copy);
		return IO_FAIL(io, -EBUSY, "zinf_io_register_buffers: requests are in flight");
	}
	rc = io->ops->register_buffers ? regs_backend(io, iov, n, bytes) : 0;
	if (rc != 0 || !copy) {
		zc_free(copy);
		copy = NULL;
	}
	zc_free(io->regs);
	io->regs = copy;
	io->nregs = copy ? n : 0;
	pthread_mutex_unlock(&io->qlock);
	return rc < 0 ? rc : 0;
}

unsigned
zinf_io_buffers_registered(const struct zinf_io *io)
{
	if (!io) {
		return 0;
	}
	pthread_mutex_lock((pthread_mutex_t *)&io->qlock);
	unsigned n = io->nregs;
	pthread_mutex_unlock((pthread_mutex_t *)&io->qlock);
	return n;
}
