// SPDX-License-Identifier: Apache-2.0
/*
 * nvme/swap.c: swap files. Named tensors (state kind, index) mapped to extents of per-kind
 * files under one or more directories, read and written through the zinf_io engine.
 *
 * Layout. Every tensor's buffer is bytes rounded up to the alignment (buf_bytes) and is cut
 * into stripe units; unit u goes to directory (dir0 + u) % n_dirs (RAID-0). The first
 * directory rotates: a tensor's dir0 is (its kind's index + the stripe units of the kind's
 * earlier tensors) % n_dirs, so the units of one kind go round the directories without a gap
 * (tensors smaller than a unit too, instead of all on directory 0), and the kinds of one
 * index start on different directories. It depends only on the declarations (kinds in order
 * of first use, tensors in order), so the same declarations give the same layout in every
 * run. In each directory the kind
 * has one file, `<prefix>-r<rank>-<kind>.<dir index>.swp`; a tensor's units in that file are
 * one contiguous extent, and extents follow each other in declaration order, each starting
 * at a multiple of the alignment. With one directory a tensor is one extent and one request.
 *
 * Reservation checks every directory's free space (statvfs; directories on one file system
 * are summed) before creating anything, then preallocates with fallocate (ftruncate where the
 * file system lacks it). A write marks the tensor unwritten until it completes, so a failed or
 * interrupted write is never read back as data (-ENODATA).
 *
 * CRC (opts.crc): one CRC32C per stripe unit of a tensor (also with one directory, where the
 * tensor is then moved as one request per unit rather than one request), computed on the
 * caller's buffer just before that unit's write is submitted and kept in memory with the
 * tensor; a read checks each unit as it completes, while later units are still in flight,
 * and fails with -EBADMSG on a mismatch. It guards against corruption between a write and a read of
 * the same run; the checksums are not stored in the files (a checkpoint would save them beside the
 * files).
 *
 * Ownership. A swap space owns its file names while it lives: for each directory d it holds a
 * flock(2) on `<prefix>-r<rank>.<d>.lock` there (the lock guards `<prefix>-r<rank>-*.<d>.swp`
 * and the probe file), taken at create, with its pid written inside for the message another
 * process gets (-EBUSY naming the files, the lock and that pid). flock belongs to the open file
 * description, so two swap spaces of one process conflict too. Files of its names found at
 * reserve belong to nobody alive (the lock is held): leftovers of a process that died or of
 * keep_files. Reserve counts the space they will give back in its free-space check, then
 * removes them with one warning naming each file and its size.
 *
 * Not here: the engine itself (nvme/io*.c), buffer management (offload/).
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/opts.h"
#include "common/util.h"
#include "nvme/swap_internal.h"
#include "zinf/swap.h"

#define SWAP_KIND_MAX	 48
#define SWAP_DEFAULT_SU	 (1u << 20)
#define SWAP_MIN_ALIGN	 4096u	   /* layout unit when a file reports less (buffered I/O) */
#define SWAP_MAX_TENSORS (1 << 28) /* keeps the hash table's capacity within an unsigned */

ZINF_OPTS_NO_TAIL_PAD(struct zinf_swap_opts, reserved);

/* Messages about a swap space name it: "swap <prefix>-r<rank> in <dir>[,<dir>...]". */
#define SWAP_FAIL(s, err, ...)	ZINF_OBJ_FAIL(swap_name(s), err, __VA_ARGS__)
#define SWAP_LOG(s, level, ...) ZINF_OBJ_LOG(level, swap_name(s), __VA_ARGS__)

enum swap_state { SWAP_UNWRITTEN = 0, SWAP_WRITING, SWAP_VALID, SWAP_READING };

struct swap_kind {
	char name[SWAP_KIND_MAX + 1];
	uint64_t *file_bytes;	     /* [n_dirs]: size of the kind's file in each directory */
	struct zinf_io_file **files; /* [n_dirs]; NULL where the kind has no bytes */
	char **paths;		     /* [n_dirs] */
};

struct swap_tensor {
	int kind; /* index into kinds */
	uint32_t index;
	uint64_t bytes;	    /* as declared */
	uint64_t buf_bytes; /* bytes rounded up to the alignment */
	uint32_t npieces;   /* requests per operation */
	unsigned dir0;	    /* directory of stripe unit 0 (striped) */
	enum swap_state state;
	uint32_t *crc;	   /* [npieces] of the last completed write (opts.crc) */
	uint32_t *crc_new; /* [npieces] of the write in flight */
};

struct zinf_swap {
	struct zinf_io *io;
	char *name;	    /* swap_name() */
	char **dirs;	    /* [n_dirs], copied */
	int *lock_fd;	    /* [n_dirs]: flock held on lock_path[d], -1: none */
	char **lock_path;   /* [n_dirs] */
	bool *dir_buffered; /* [n_dirs]: O_DIRECT refused there, opts.buffered allowed it */
	unsigned n_dirs;
	uint64_t stripe_unit; /* bytes */
	int rank;
	char *prefix;
	bool crc, keep_files, reserved;
	uint32_t align; /* bytes; the largest of the directories' */

	struct swap_kind *kinds;
	int nkinds, kinds_cap;
	struct swap_tensor *t;
	int nt, t_cap;
	uint64_t *ext_off; /* [nt * n_dirs]: file offset of tensor i's extent in directory d */
	int *hash;	   /* open addressing over (kind, index) -> id + 1; 0 empty */
	unsigned hash_cap; /* power of two */
	uint64_t total_bytes;
};

/* The test hook's figure; UINT64_MAX: ask statvfs. */
static _Atomic uint64_t test_free_bytes = UINT64_MAX;

void
zinf_swap_test_set_free_bytes(uint64_t bytes)
{
	atomic_store(&test_free_bytes, bytes);
}

static const char *
swap_name(const struct zinf_swap *s)
{
	return s && s->name ? s->name : "swap";
}

ZINF_API void
zinf_swap_opts_init(struct zinf_swap_opts *o)
{
	if (!o) {
		return;
	}
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	o->stripe_unit = SWAP_DEFAULT_SU;
	o->prefix = "zinf";
}

/* ---- create / destroy --------------------------------------------------------------------- */

/* The lock of directory d is held by someone else: -EBUSY naming the files and its pid. */
static int
lock_busy(struct zinf_swap *s, unsigned d, int fd)
{
	char buf[32] = "";
	ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
	long pid = n > 0 ? strtol(buf, NULL, 10) : 0;
	char who[64] = "a process that did not say its pid";
	if (pid == (long)getpid()) {
		snprintf(who, sizeof(who), "this process, pid %ld", pid);
	} else if (pid > 0) {
		snprintf(who, sizeof(who), "process %ld", pid);
	}
	return SWAP_FAIL(s, -EBUSY,
			 "the files %s/%s-r%d-*.%u.swp belong to another live swap space (%s; "
			 "lock %s): give each job its own directory, prefix or rank",
			 s->dirs[d], s->prefix, s->rank, d, who, s->lock_path[d]);
}

/*
 * Take the names of directory d: an exclusive flock on its lock file, which must still be the
 * file at that path once locked (its previous owner unlinks it before letting go), with our
 * pid written in it for the message of the next one who tries.
 */
static int
lock_dir(struct zinf_swap *s, unsigned d)
{
	if (asprintf(&s->lock_path[d], "%s/%s-r%d.%u.lock", s->dirs[d], s->prefix, s->rank, d) <
	    0) {
		s->lock_path[d] = NULL;
		return -ENOMEM;
	}
	const char *path = s->lock_path[d];
	for (int tries = 0; tries < 100; tries++) {
		int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (fd < 0) {
			int e = errno;
			return SWAP_FAIL(s, -e, "cannot create the lock file %s: %s", path,
					 strerror(e));
		}
		if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
			int e = errno;
			int ret = e == EWOULDBLOCK ? lock_busy(s, d, fd)
						   : SWAP_FAIL(s, -e, "cannot lock %s: %s", path,
							       strerror(e));
			close(fd);
			return ret;
		}
		struct stat a, b;
		if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino &&
		    a.st_dev == b.st_dev) {
			char pid[32];
			int n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
			if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
				SWAP_LOG(s, ZINF_LOG_DEBUG, "%s: pid not written", path);
			}
			s->lock_fd[d] = fd;
			return 0;
		}
		close(fd); /* unlinked by its last owner after our open: try the new one */
	}
	return SWAP_FAIL(s, -EAGAIN, "the lock file %s keeps being replaced", path);
}

/*
 * Check that `dir` is a writable directory, take its names (lock_dir) and find its direct-I/O
 * alignment by opening a probe file in it through the engine (which reads STATX_DIOALIGN).
 */
static int
dir_open(struct zinf_swap *s, unsigned d, bool buffered_ok)
{
	const char *dir = s->dirs[d];
	struct stat st;
	if (stat(dir, &st) != 0) {
		int e = errno;
		return SWAP_FAIL(s, -e, "directory %s: %s", dir, strerror(e));
	}
	if (!S_ISDIR(st.st_mode)) {
		return SWAP_FAIL(s, -ENOTDIR, "%s is not a directory", dir);
	}
	if (access(dir, W_OK | X_OK) != 0) {
		int e = errno;
		return SWAP_FAIL(s, -e, "directory %s is not writable: %s", dir, strerror(e));
	}
	int ret = lock_dir(s, d);
	if (ret < 0) {
		return ret;
	}
	char *path = NULL;
	if (asprintf(&path, "%s/.%s-r%d.%u.probe", dir, s->prefix, s->rank, d) < 0) {
		return -ENOMEM;
	}
	struct zinf_io_file *f = NULL;
	unsigned flags = ZINF_IO_RDWR | ZINF_IO_CREATE | ZINF_IO_TRUNC;
	ret = zinf_io_file_open(s->io, path, flags | (buffered_ok ? ZINF_IO_DIRECT_OR_BUFFERED : 0),
				&f);
	if (ret < 0) {
		unlink(path);
		free(path);
		if (ret == -EINVAL) {
			return SWAP_FAIL(
				s, -EINVAL,
				"directory %s refuses O_DIRECT (tmpfs?) and buffered I/O was "
				"not allowed: set zinf_swap_opts.buffered (the zinf command: "
				"--buffered)",
				dir);
		}
		return SWAP_FAIL(s, ret, "cannot create a file in %s: %s", dir, strerror(-ret));
	}
	s->dir_buffered[d] = !zinf_io_file_direct(f);
	uint32_t a = zinf_io_file_align(f);
	zinf_io_file_close(s->io, f);
	unlink(path);
	free(path);
	s->align = ZINF_MAX(s->align, ZINF_MAX(a, SWAP_MIN_ALIGN));
	return 0;
}

static void
unlock_dirs(struct zinf_swap *s)
{
	for (unsigned d = 0; d < s->n_dirs; d++) {
		if (s->lock_fd && s->lock_fd[d] >= 0) {
			/* Unlinked while still held: a newcomer then locks a fresh file. */
			unlink(s->lock_path[d]);
			close(s->lock_fd[d]);
		}
		if (s->lock_path) {
			free(s->lock_path[d]); /* asprintf's */
		}
	}
	zinf_free(s->lock_fd);
	zinf_free(s->lock_path);
}

/* The caller's options, checked; prefix defaulted. */
static int
swap_opts_take(struct zinf_swap_opts *o, const struct zinf_swap_opts *opts)
{
	zinf_swap_opts_init(o);
	int ret = zinf_opts_take(o, sizeof(*o), opts, "zinf_swap_opts");
	if (ret < 0) {
		return ret;
	}
	if (o->n_dirs == 0 || !o->dirs) {
		return SWAP_FAIL(NULL, -EINVAL, "no directory given (zinf_swap_opts.dirs)");
	}
	for (unsigned d = 0; d < o->n_dirs; d++) {
		if (!o->dirs[d] || !o->dirs[d][0]) {
			return SWAP_FAIL(NULL, -EINVAL, "directory %u is empty", d);
		}
	}
	o->prefix = o->prefix ? o->prefix : "zinf";
	if (!o->prefix[0] || strchr(o->prefix, '/')) {
		return SWAP_FAIL(NULL, -EINVAL, "bad file name prefix '%s'", o->prefix);
	}
	o->stripe_unit = o->stripe_unit ? o->stripe_unit : SWAP_DEFAULT_SU;
	return 0;
}

/* "swap <prefix>-r<rank> in <dir>,<dir>...". */
static char *
name_make(const struct zinf_swap_opts *o)
{
	size_t len = strlen(o->prefix) + 64;
	for (unsigned d = 0; d < o->n_dirs; d++) {
		len += strlen(o->dirs[d]) + 1;
	}
	char *n = zinf_malloc(len);
	if (!n) {
		return NULL;
	}
	size_t at = (size_t)snprintf(n, len, "swap %s-r%d in ", o->prefix, o->rank);
	for (unsigned d = 0; d < o->n_dirs; d++) {
		at += (size_t)snprintf(n + at, len - at, "%s%s", d ? "," : "", o->dirs[d]);
	}
	return n;
}

ZINF_API int
zinf_swap_create(struct zinf_io *io, const struct zinf_swap_opts *opts, struct zinf_swap **out)
{
	struct zinf_swap_opts o;
	if (!io || !opts || !out) {
		return ZINF_FAIL(-EINVAL, "zinf_swap_create: NULL %s",
				 !io	 ? "I/O context"
				 : !opts ? "options"
					 : "out");
	}
	int ret = swap_opts_take(&o, opts);
	if (ret < 0) {
		return ret;
	}
	struct zinf_swap *s = zinf_calloc(1, sizeof(*s));
	if (!s) {
		return -ENOMEM;
	}
	ret = -ENOMEM;
	s->io = io;
	s->n_dirs = o.n_dirs;
	s->stripe_unit = o.stripe_unit;
	s->rank = o.rank;
	s->crc = o.crc;
	s->keep_files = o.keep_files;
	s->align = 1;
	s->name = name_make(&o);
	s->prefix = zinf_strdup(o.prefix);
	s->dirs = zinf_calloc(s->n_dirs, sizeof(*s->dirs));
	s->dir_buffered = zinf_calloc(s->n_dirs, sizeof(*s->dir_buffered));
	s->lock_fd = zinf_calloc(s->n_dirs, sizeof(*s->lock_fd));
	s->lock_path = zinf_calloc(s->n_dirs, sizeof(*s->lock_path));
	for (unsigned d = 0; s->lock_fd && d < s->n_dirs; d++) {
		s->lock_fd[d] = -1;
	}
	if (!s->name || !s->prefix || !s->dirs || !s->dir_buffered || !s->lock_fd ||
	    !s->lock_path) {
		goto fail;
	}
	for (unsigned d = 0; d < s->n_dirs; d++) {
		s->dirs[d] = zinf_strdup(o.dirs[d]);
		if (!s->dirs[d]) {
			goto fail;
		}
	}
	for (unsigned d = 0; d < s->n_dirs; d++) {
		if ((ret = dir_open(s, d, o.buffered)) < 0) {
			goto fail;
		}
	}
	if (s->stripe_unit % s->align != 0) {
		ret = SWAP_FAIL(s, -EINVAL,
				"stripe unit %llu is not a multiple of the alignment %u",
				(unsigned long long)s->stripe_unit, s->align);
		goto fail;
	}
	*out = s;
	return 0;
fail:
	zinf_swap_destroy(s);
	return ret;
}

static void
kind_fini(struct zinf_swap *s, struct swap_kind *k)
{
	for (unsigned d = 0; d < s->n_dirs; d++) {
		if (k->files && k->files[d]) {
			zinf_io_file_close(s->io, k->files[d]);
		}
		if (k->paths && k->paths[d]) {
			if (!s->keep_files || !s->reserved) {
				unlink(k->paths[d]);
			}
			free(k->paths[d]);
		}
	}
	zinf_free(k->files);
	zinf_free(k->paths);
	zinf_free(k->file_bytes);
}

ZINF_API void
zinf_swap_destroy(struct zinf_swap *s)
{
	if (!s) {
		return;
	}
	for (int i = 0; i < s->nkinds; i++) {
		kind_fini(s, &s->kinds[i]);
	}
	zinf_free(s->kinds);
	for (int i = 0; i < s->nt; i++) {
		zinf_free(s->t[i].crc);
		zinf_free(s->t[i].crc_new);
	}
	zinf_free(s->t);
	zinf_free(s->ext_off);
	zinf_free(s->hash);
	/* After the files are gone: the names stay ours until then. */
	unlock_dirs(s);
	if (s->dirs) {
		for (unsigned d = 0; d < s->n_dirs; d++) {
			zinf_free(s->dirs[d]);
		}
	}
	zinf_free(s->dirs);
	zinf_free(s->dir_buffered);
	zinf_free(s->prefix);
	zinf_free(s->name);
	zinf_free(s);
}

/* ---- declarations ------------------------------------------------------------------------- */

static bool
kind_name_ok(const char *k)
{
	size_t n = 0;
	for (; k[n]; n++) {
		char c = k[n];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '_')) {
			return false;
		}
	}
	return n > 0 && n <= SWAP_KIND_MAX;
}

static int
kind_lookup(const struct zinf_swap *s, const char *kind)
{
	for (int i = 0; i < s->nkinds; i++) {
		if (strcmp(s->kinds[i].name, kind) == 0) {
			return i;
		}
	}
	return -ENOENT;
}

static unsigned
hash_key(int kind, uint32_t index)
{
	uint64_t h = ((uint64_t)(uint32_t)kind << 32 | index) * 0x9e3779b97f4a7c15ull;
	return (unsigned)(h >> 32);
}

/* Slot of (kind, index) in the table: its id + 1 there, or 0 for an empty slot. */
static unsigned
hash_slot(const struct zinf_swap *s, int kind, uint32_t index)
{
	unsigned m = s->hash_cap - 1, i = hash_key(kind, index) & m;
	while (s->hash[i]) {
		const struct swap_tensor *t = &s->t[s->hash[i] - 1];
		if (t->kind == kind && t->index == index) {
			break;
		}
		i = (i + 1) & m;
	}
	return i;
}

static int
hash_grow(struct zinf_swap *s)
{
	unsigned cap = s->hash_cap ? s->hash_cap * 2 : 64;
	int *h = zinf_calloc(cap, sizeof(*h));
	if (!h) {
		return -ENOMEM;
	}
	zinf_free(s->hash);
	s->hash = h;
	s->hash_cap = cap;
	for (int id = 0; id < s->nt; id++) {
		s->hash[hash_slot(s, s->t[id].kind, s->t[id].index)] = id + 1;
	}
	return 0;
}

ZINF_API int
zinf_swap_find(const struct zinf_swap *s, const char *kind, uint32_t index)
{
	if (!s || !kind) {
		return SWAP_FAIL(s, -EINVAL, "zinf_swap_find: NULL %s", s ? "kind" : "swap space");
	}
	int k = kind_lookup(s, kind);
	if (k < 0 || !s->hash_cap) {
		return -ENOENT;
	}
	int v = s->hash[hash_slot(s, k, index)];
	return v ? v - 1 : -ENOENT;
}

ZINF_API int
zinf_swap_add(struct zinf_swap *s, const char *kind, uint32_t index, uint64_t bytes)
{
	if (!s || !kind) {
		return SWAP_FAIL(s, -EINVAL, "zinf_swap_add: NULL %s", s ? "kind" : "swap space");
	}
	if (s->reserved) {
		return SWAP_FAIL(s, -EBUSY, "%s[%u] declared after zinf_swap_reserve()", kind,
				 index);
	}
	if (!kind_name_ok(kind)) {
		return SWAP_FAIL(s, -EINVAL, "bad state kind '%s' (1..%d letters, digits and '_')",
				 kind, SWAP_KIND_MAX);
	}
	if (zinf_swap_find(s, kind, index) >= 0) {
		return SWAP_FAIL(s, -EEXIST, "%s[%u] declared twice", kind, index);
	}
	/* Padded to the alignment, the tensor must still fit below the largest file offset. */
	if (bytes > ZINF_ALIGN_DOWN((uint64_t)INT64_MAX, (uint64_t)s->align)) {
		return SWAP_FAIL(
			s, -EOVERFLOW,
			"%s[%u]: %llu bytes is past the largest file offset (2^63 - 1) once "
			"padded to %u bytes (did elements x element size wrap?)",
			kind, index, (unsigned long long)bytes, s->align);
	}
	if (s->nt >= SWAP_MAX_TENSORS) {
		return SWAP_FAIL(s, -ENOSPC, "%s[%u]: more than %d tensors", kind, index,
				 SWAP_MAX_TENSORS);
	}
	int k = kind_lookup(s, kind);
	if (k < 0) {
		if (s->nkinds == s->kinds_cap) {
			int cap = s->kinds_cap ? s->kinds_cap * 2 : 4;
			struct swap_kind *nk = zinf_calloc(cap, sizeof(*nk));
			if (!nk) {
				return -ENOMEM;
			}
			if (s->nkinds) {
				memcpy(nk, s->kinds, s->nkinds * sizeof(*nk));
			}
			zinf_free(s->kinds);
			s->kinds = nk;
			s->kinds_cap = cap;
		}
		k = s->nkinds++;
		memset(&s->kinds[k], 0, sizeof(s->kinds[k]));
		strcpy(s->kinds[k].name, kind);
	}
	if (s->nt == s->t_cap) {
		int cap = s->t_cap ? s->t_cap * 2 : 64;
		struct swap_tensor *nt = zinf_calloc(cap, sizeof(*nt));
		if (!nt) {
			return -ENOMEM;
		}
		if (s->nt) {
			memcpy(nt, s->t, s->nt * sizeof(*nt));
		}
		zinf_free(s->t);
		s->t = nt;
		s->t_cap = cap;
	}
	if ((unsigned)(s->nt + 1) * 2 > s->hash_cap && hash_grow(s) < 0) {
		return -ENOMEM;
	}
	int id = s->nt++;
	struct swap_tensor *t = &s->t[id];
	memset(t, 0, sizeof(*t));
	t->kind = k;
	t->index = index;
	t->bytes = bytes;
	s->hash[hash_slot(s, k, index)] = id + 1;
	return id;
}

/* ---- layout and reservation --------------------------------------------------------------- */

/*
 * Piece p of tensor t: its bytes in the caller's buffer and in which file, where. With one
 * directory and CRC off the whole tensor is one piece; else piece u is stripe unit u.
 */
struct swap_piece {
	unsigned dir;
	uint64_t buf_off, file_off, len;
};

static void
piece_of(const struct zinf_swap *s, int id, uint32_t p, struct swap_piece *out)
{
	const struct swap_tensor *t = &s->t[id];
	const uint64_t *ext = &s->ext_off[(size_t)id * s->n_dirs];
	uint64_t su = s->stripe_unit;
	if (s->n_dirs == 1) {
		/* One extent: one request, or (CRC on) one per stripe unit, checked one by one. */
		out->dir = 0;
		out->buf_off = s->crc ? (uint64_t)p * su : 0;
		out->file_off = ext[0] + out->buf_off;
		out->len = s->crc ? ZINF_MIN(su, t->buf_bytes - out->buf_off) : t->buf_bytes;
		return;
	}
	out->dir = (t->dir0 + p) % s->n_dirs;
	out->buf_off = (uint64_t)p * su;
	out->file_off = ext[out->dir] + (uint64_t)(p / s->n_dirs) * su;
	out->len = ZINF_MIN(su, t->buf_bytes - out->buf_off);
}

/* Bytes of tensor t's extent in directory d (units r, r+n, r+2n... with r = d - dir0 mod n). */
static uint64_t
extent_bytes(const struct zinf_swap *s, const struct swap_tensor *t, unsigned d)
{
	if (s->n_dirs == 1) {
		return t->buf_bytes;
	}
	unsigned n = s->n_dirs, r = (d + n - t->dir0) % n;
	uint64_t su = s->stripe_unit, full = t->buf_bytes / su, tail = t->buf_bytes % su;
	uint64_t units = full / n + (r < full % n ? 1 : 0);
	uint64_t b = units * su;
	if (tail && r == full % n) {
		b += tail;
	}
	return b;
}

/* a / b rounded up, without the overflow of a + b - 1. */
static uint64_t
div_up(uint64_t a, uint64_t b)
{
	return a / b + (a % b != 0);
}

static int
layout_alloc(struct zinf_swap *s)
{
	s->ext_off = zinf_calloc((size_t)(s->nt ? s->nt : 1) * s->n_dirs, sizeof(*s->ext_off));
	if (!s->ext_off) {
		return -ENOMEM;
	}
	for (int k = 0; k < s->nkinds; k++) {
		struct swap_kind *kd = &s->kinds[k];
		kd->file_bytes = zinf_calloc(s->n_dirs, sizeof(*kd->file_bytes));
		kd->files = zinf_calloc(s->n_dirs, sizeof(*kd->files));
		kd->paths = zinf_calloc(s->n_dirs, sizeof(*kd->paths));
		if (!kd->file_bytes || !kd->files || !kd->paths) {
			return -ENOMEM;
		}
	}
	return 0;
}

/* Tensor id's extents go at the end of its kind's files; none may pass INT64_MAX. */
static int
layout_extents(struct zinf_swap *s, int id)
{
	struct swap_tensor *t = &s->t[id];
	struct swap_kind *kd = &s->kinds[t->kind];
	for (unsigned d = 0; d < s->n_dirs; d++) {
		uint64_t b = extent_bytes(s, t, d); /* a multiple of the alignment */
		if (b > (uint64_t)INT64_MAX - kd->file_bytes[d] ||
		    __builtin_add_overflow(s->total_bytes, b, &s->total_bytes)) {
			return SWAP_FAIL(s, -EOVERFLOW,
					 "%s[%u]: the %s file in %s would pass the largest file "
					 "offset (2^63 - 1)",
					 kd->name, t->index, kd->name, s->dirs[d]);
		}
		s->ext_off[(size_t)id * s->n_dirs + d] = kd->file_bytes[d];
		kd->file_bytes[d] += b;
	}
	return 0;
}

static int
layout(struct zinf_swap *s)
{
	int ret = layout_alloc(s);
	uint64_t *kind_units =
		zinf_calloc((size_t)(s->nkinds ? s->nkinds : 1), sizeof(*kind_units));
	if (ret < 0 || !kind_units) {
		zinf_free(kind_units);
		return -ENOMEM;
	}
	s->total_bytes = 0;
	for (int id = 0; id < s->nt && ret == 0; id++) {
		struct swap_tensor *t = &s->t[id];
		t->buf_bytes = ZINF_ALIGN_UP(t->bytes, (uint64_t)s->align); /* checked at add */
		uint64_t units = div_up(t->buf_bytes, s->stripe_unit);
		/* One request per extent, or one per stripe unit (striped, or to check CRCs). */
		uint64_t pieces = (s->n_dirs == 1 && !s->crc) ? (t->buf_bytes ? 1 : 0) : units;
		if (pieces > INT32_MAX) {
			ret = SWAP_FAIL(
				s, -EOVERFLOW,
				"%s[%u]: %llu stripe units of %llu bytes: more than 2^31 - 1 "
				"requests; use a larger stripe unit",
				s->kinds[t->kind].name, t->index, (unsigned long long)units,
				(unsigned long long)s->stripe_unit);
			break;
		}
		t->npieces = (uint32_t)pieces;
		/* Rotating first directory (see the top of this file). */
		t->dir0 = (unsigned)(((uint64_t)t->kind + kind_units[t->kind]) % s->n_dirs);
		kind_units[t->kind] += units;
		ret = layout_extents(s, id);
		if (ret == 0 && s->crc && t->npieces) {
			t->crc = zinf_calloc(t->npieces, sizeof(*t->crc));
			t->crc_new = zinf_calloc(t->npieces, sizeof(*t->crc_new));
			ret = (!t->crc || !t->crc_new) ? -ENOMEM : 0;
		}
	}
	zinf_free(kind_units);
	return ret;
}

/* Free bytes for an unprivileged writer in dir (or the test hook's figure). */
static int
dir_free_bytes(const struct zinf_swap *s, const char *dir, uint64_t *out)
{
	uint64_t hook = atomic_load(&test_free_bytes);
	if (hook != UINT64_MAX) {
		*out = hook;
		return 0;
	}
	struct statvfs v;
	if (statvfs(dir, &v) != 0) {
		int e = errno;
		return SWAP_FAIL(s, -e, "statvfs %s: %s", dir, strerror(e));
	}
	*out = (uint64_t)v.f_bavail * v.f_frsize;
	return 0;
}

/* ---- leftovers of a process that is gone -------------------------------------------------- */

/* Files of this swap space's names found in its directories (the lock says nobody owns them). */
struct leftovers {
	char **paths;
	uint64_t *bytes; /* [n]: allocated on disk (st_blocks), what removing them gives back */
	unsigned n, cap;
	uint64_t *dir_bytes; /* [n_dirs] */
};

static void
leftovers_free(struct leftovers *lo)
{
	for (unsigned i = 0; i < lo->n; i++) {
		free(lo->paths[i]);
	}
	zinf_free(lo->paths);
	zinf_free(lo->bytes);
	zinf_free(lo->dir_bytes);
	memset(lo, 0, sizeof(*lo));
}

/* Whether `name` is `<prefix>-r<rank>-<kind>.<d>.swp` for a valid kind. */
static bool
leftover_name(const struct zinf_swap *s, unsigned d, const char *name)
{
	char head[64], tail[32];
	size_t pl = strlen(s->prefix), n = strlen(name);
	int hl = snprintf(head, sizeof(head), "-r%d-", s->rank);
	int tl = snprintf(tail, sizeof(tail), ".%u.swp", d);
	if (n <= pl + (size_t)hl + (size_t)tl || strncmp(name, s->prefix, pl) != 0 ||
	    strncmp(name + pl, head, (size_t)hl) != 0 || strcmp(name + n - tl, tail) != 0) {
		return false;
	}
	char kind[SWAP_KIND_MAX + 1];
	size_t kl = n - pl - (size_t)hl - (size_t)tl;
	if (kl > SWAP_KIND_MAX) {
		return false;
	}
	memcpy(kind, name + pl + hl, kl);
	kind[kl] = 0;
	return kind_name_ok(kind);
}

static int
leftover_add(struct leftovers *lo, const char *dir, const char *name, uint64_t bytes)
{
	if (lo->n == lo->cap) {
		unsigned cap = lo->cap ? lo->cap * 2 : 8;
		char **p = zinf_calloc(cap, sizeof(*p));
		uint64_t *b = zinf_calloc(cap, sizeof(*b));
		if (!p || !b) {
			zinf_free(p);
			zinf_free(b);
			return -ENOMEM;
		}
		if (lo->n) {
			memcpy(p, lo->paths, lo->n * sizeof(*p));
			memcpy(b, lo->bytes, lo->n * sizeof(*b));
		}
		zinf_free(lo->paths);
		zinf_free(lo->bytes);
		lo->paths = p;
		lo->bytes = b;
		lo->cap = cap;
	}
	if (asprintf(&lo->paths[lo->n], "%s/%s", dir, name) < 0) {
		return -ENOMEM;
	}
	lo->bytes[lo->n++] = bytes;
	return 0;
}

/* Find the leftovers in every directory. */
static int
leftovers_find(struct zinf_swap *s, struct leftovers *lo)
{
	memset(lo, 0, sizeof(*lo));
	lo->dir_bytes = zinf_calloc(s->n_dirs, sizeof(*lo->dir_bytes));
	if (!lo->dir_bytes) {
		return -ENOMEM;
	}
	for (unsigned d = 0; d < s->n_dirs; d++) {
		DIR *dp = opendir(s->dirs[d]);
		if (!dp) {
			int e = errno;
			return SWAP_FAIL(s, -e, "cannot list %s: %s", s->dirs[d], strerror(e));
		}
		struct dirent *de;
		int ret = 0;
		while (ret == 0 && (de = readdir(dp)) != NULL) {
			struct stat st;
			if (!leftover_name(s, d, de->d_name) ||
			    fstatat(dirfd(dp), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
			    !S_ISREG(st.st_mode)) {
				continue;
			}
			uint64_t b = (uint64_t)st.st_blocks * 512;
			ret = leftover_add(lo, s->dirs[d], de->d_name, b);
			lo->dir_bytes[d] += b;
		}
		closedir(dp);
		if (ret < 0) {
			return ret;
		}
	}
	return 0;
}

/* Remove the leftovers, with one warning that names each and its size. */
static void
leftovers_reclaim(struct zinf_swap *s, const struct leftovers *lo)
{
	if (lo->n == 0) {
		return;
	}
	char list[640];
	size_t at = 0;
	uint64_t total = 0;
	unsigned listed = 0;
	for (unsigned i = 0; i < lo->n; i++) {
		unlink(lo->paths[i]);
		total += lo->bytes[i];
		int w = snprintf(list + at, sizeof(list) - at, "%s%s (%llu bytes)", i ? ", " : "",
				 lo->paths[i], (unsigned long long)lo->bytes[i]);
		if (w > 0 && (size_t)w < sizeof(list) - at) {
			at += (size_t)w;
			listed++;
		} else {
			list[at] = 0;
		}
	}
	SWAP_LOG(s, ZINF_LOG_WARN,
		 "reclaiming %u leftover swap file(s) of these names that no live process holds "
		 "(a run that died or kept its files), %llu bytes: %s%s",
		 lo->n, (unsigned long long)total, list, listed < lo->n ? ", ..." : "");
}

/*
 * Every directory's needs against its file system's free space plus what its leftovers give
 * back, before anything is created. Directories on one file system share its free space, so
 * their needs (and leftovers) are summed.
 */
static int
check_space(struct zinf_swap *s, const uint64_t *reclaim)
{
	unsigned n = s->n_dirs;
	uint64_t *need = zinf_calloc(n, sizeof(*need));
	dev_t *dev = zinf_calloc(n, sizeof(*dev));
	int ret = -ENOMEM;
	if (!need || !dev) {
		goto out;
	}
	for (unsigned d = 0; d < n; d++) {
		struct stat st;
		if (stat(s->dirs[d], &st) != 0) {
			int e = errno;
			ret = SWAP_FAIL(s, -e, "directory %s: %s", s->dirs[d], strerror(e));
			goto out;
		}
		dev[d] = st.st_dev;
		for (int k = 0; k < s->nkinds; k++) {
			need[d] += s->kinds[k].file_bytes[d]; /* bounded by total_bytes */
		}
	}
	for (unsigned d = 0; d < n; d++) {
		uint64_t sum = 0, back = 0, avail;
		unsigned first = d;
		for (unsigned e = 0; e < n; e++) {
			if (dev[e] == dev[d]) {
				sum += need[e];
				back += reclaim[e];
				first = ZINF_MIN(first, e);
			}
		}
		if (first != d || sum == 0) {
			continue; /* counted with the first directory on that file system */
		}
		if ((ret = dir_free_bytes(s, s->dirs[d], &avail)) < 0) {
			goto out;
		}
		if (sum > avail && sum - avail > back) {
			ret = SWAP_FAIL(s, -ENOSPC,
					"not enough space in %s: needs %llu bytes, %llu bytes free "
					"(+ %llu bytes in leftover files to reclaim)",
					s->dirs[d], (unsigned long long)sum,
					(unsigned long long)avail, (unsigned long long)back);
			goto out;
		}
	}
	ret = 0;
out:
	zinf_free(need);
	zinf_free(dev);
	return ret;
}

static int
preallocate(struct zinf_swap *s, struct zinf_io_file *f, uint64_t bytes)
{
	const char *path = zinf_io_file_path(f);
	int fd = zinf_io_file_fd(f);
	int r = fallocate(fd, 0, 0, (off_t)bytes);
	int e = r ? errno : 0;
	if (e == EOPNOTSUPP || e == ENOSYS) {
		r = ftruncate(fd, (off_t)bytes); /* no preallocation there: sparse */
		e = r ? errno : 0;
	}
	if (e == ENOSPC) {
		uint64_t avail = 0;
		dir_free_bytes(s, s->dirs[0], &avail);
		struct statvfs v;
		if (fstatvfs(fd, &v) == 0) {
			avail = (uint64_t)v.f_bavail * v.f_frsize;
		}
		return SWAP_FAIL(s, -ENOSPC, "preallocating %s: needs %llu bytes, %llu bytes free",
				 path, (unsigned long long)bytes, (unsigned long long)avail);
	}
	if (e == EFBIG) {
		return SWAP_FAIL(s, -EFBIG,
				 "preallocating %s: %llu bytes exceed the file size limit "
				 "(ulimit -f, RLIMIT_FSIZE) or the file system's",
				 path, (unsigned long long)bytes);
	}
	if (e) {
		return SWAP_FAIL(s, -e, "preallocating %llu bytes for %s: %s",
				 (unsigned long long)bytes, path, strerror(e));
	}
	return 0;
}

/* Create (truncated: the names are ours) and preallocate every kind's file in every directory. */
static int
files_create(struct zinf_swap *s)
{
	for (int k = 0; k < s->nkinds; k++) {
		struct swap_kind *kd = &s->kinds[k];
		for (unsigned d = 0; d < s->n_dirs; d++) {
			if (!kd->file_bytes[d]) {
				continue;
			}
			if (asprintf(&kd->paths[d], "%s/%s-r%d-%s.%u.swp", s->dirs[d], s->prefix,
				     s->rank, kd->name, d) < 0) {
				kd->paths[d] = NULL;
				return -ENOMEM;
			}
			unsigned fl = ZINF_IO_RDWR | ZINF_IO_CREATE | ZINF_IO_TRUNC;
			if (s->dir_buffered[d]) {
				fl |= ZINF_IO_BUFFERED;
			}
			int ret = zinf_io_file_open(s->io, kd->paths[d], fl, &kd->files[d]);
			if (ret < 0) {
				kd->files[d] = NULL;
				return SWAP_FAIL(s, ret, "cannot create %s: %s", kd->paths[d],
						 strerror(-ret));
			}
			ret = preallocate(s, kd->files[d], kd->file_bytes[d]);
			if (ret < 0) {
				return ret;
			}
		}
	}
	return 0;
}

/* Back to the declared state: close and remove what reserve created. */
static void
reserve_undo(struct zinf_swap *s)
{
	for (int k = 0; k < s->nkinds; k++) {
		kind_fini(s, &s->kinds[k]);
		s->kinds[k].files = NULL;
		s->kinds[k].paths = NULL;
		s->kinds[k].file_bytes = NULL;
	}
	for (int id = 0; id < s->nt; id++) {
		zinf_free(s->t[id].crc);
		zinf_free(s->t[id].crc_new);
		s->t[id].crc = s->t[id].crc_new = NULL;
	}
	zinf_free(s->ext_off);
	s->ext_off = NULL;
	s->total_bytes = 0;
}

ZINF_API int
zinf_swap_reserve(struct zinf_swap *s)
{
	struct leftovers lo = {0};
	if (!s) {
		return SWAP_FAIL(s, -EINVAL, "zinf_swap_reserve: NULL swap space");
	}
	if (s->reserved) {
		return SWAP_FAIL(s, -EBUSY, "already reserved");
	}
	int ret = layout(s);
	if (ret == 0) {
		ret = leftovers_find(s, &lo);
	}
	if (ret == 0) {
		ret = check_space(s, lo.dir_bytes);
	}
	if (ret == 0) {
		leftovers_reclaim(s, &lo);
		ret = files_create(s);
	}
	leftovers_free(&lo);
	if (ret < 0) {
		reserve_undo(s);
		return ret;
	}
	s->reserved = true;
	return 0;
}

ZINF_API uint32_t
zinf_swap_align(const struct zinf_swap *s)
{
	return s ? s->align : 0;
}

ZINF_API uint64_t
zinf_swap_bytes(const struct zinf_swap *s, int id)
{
	return (s && id >= 0 && id < s->nt) ? s->t[id].bytes : 0;
}

ZINF_API uint64_t
zinf_swap_buf_bytes(const struct zinf_swap *s, int id)
{
	return (s && id >= 0 && id < s->nt) ? ZINF_ALIGN_UP(s->t[id].bytes, (uint64_t)s->align) : 0;
}

ZINF_API uint64_t
zinf_swap_total_bytes(const struct zinf_swap *s)
{
	if (!s) {
		return 0;
	}
	if (s->reserved) {
		return s->total_bytes;
	}
	uint64_t sum = 0;
	for (int id = 0; id < s->nt; id++) {
		/* Each padded size fits (checked at add); their sum saturates. */
		if (__builtin_add_overflow(sum, ZINF_ALIGN_UP(s->t[id].bytes, (uint64_t)s->align),
					   &sum)) {
			return UINT64_MAX;
		}
	}
	return sum;
}

/* ---- operations --------------------------------------------------------------------------- */

static const char *
tensor_kind(const struct zinf_swap *s, int id)
{
	return s->kinds[s->t[id].kind].name;
}

static int
op_check(struct zinf_swap *s, int id, void *buf, struct zinf_swap_op *op, const char *what)
{
	if (!s || !op) {
		return SWAP_FAIL(s, -EINVAL, "%s: NULL %s", what, s ? "operation" : "swap space");
	}
	memset(op, 0, sizeof(*op));
	op->id = id;
	op->buf = buf;
	if (!s->reserved) {
		return op->result = SWAP_FAIL(s, -EBUSY, "%s before zinf_swap_reserve()", what);
	}
	if (id < 0 || id >= s->nt) {
		return op->result = SWAP_FAIL(s, -EINVAL, "%s of unknown tensor id %d", what, id);
	}
	if (!buf && s->t[id].buf_bytes) {
		return op->result = SWAP_FAIL(s, -EINVAL, "%s of %s[%u]: NULL buffer", what,
					      tensor_kind(s, id), s->t[id].index);
	}
	if ((uintptr_t)buf % s->align) {
		return op->result =
			       SWAP_FAIL(s, -EINVAL,
					 "%s of %s[%u]: buffer %p is not aligned to %u "
					 "bytes",
					 what, tensor_kind(s, id), s->t[id].index, buf, s->align);
	}
	enum swap_state st = s->t[id].state;
	if (st == SWAP_WRITING || st == SWAP_READING) {
		return op->result = SWAP_FAIL(s, -EBUSY, "%s of %s[%u] while a %s is in flight",
					      what, tensor_kind(s, id), s->t[id].index,
					      st == SWAP_WRITING ? "write" : "read");
	}
	return 0;
}

/* Submit piece p of op (its CRC first, for a write with CRC on). */
static int
piece_submit(struct zinf_swap *s, struct zinf_swap_op *op, uint32_t p)
{
	struct swap_tensor *t = &s->t[op->id];
	const struct swap_kind *kd = &s->kinds[t->kind];
	struct swap_piece pc;
	piece_of(s, op->id, p, &pc);
	char *b = (char *)op->buf + pc.buf_off;
	int ret;
	if (op->write) {
		if (s->crc) {
			t->crc_new[p] = zinf_crc32c(0, b, pc.len);
		}
		ret = zinf_io_write_async(s->io, &op->reqs[p], kd->files[pc.dir], b, pc.len,
					  pc.file_off);
	} else {
		ret = zinf_io_read_async(s->io, &op->reqs[p], kd->files[pc.dir], b, pc.len,
					 pc.file_off);
	}
	if (ret < 0) {
		return SWAP_FAIL(s, ret, "submitting %s of %s[%u] to %s: %s",
				 op->write ? "write" : "read", kd->name, t->index,
				 kd->paths[pc.dir], strerror(-ret));
	}
	return 0;
}

/*
 * Submit every piece of op. With CRC on, each piece's checksum is computed just before it is
 * submitted, so that checksumming overlaps the transfer of the pieces before it. On a failed
 * submit, wait for those already queued.
 */
static int
op_start(struct zinf_swap *s, struct zinf_swap_op *op)
{
	struct swap_tensor *t = &s->t[op->id];
	if (t->npieces == 0) {
		return 0;
	}
	op->reqs = zinf_calloc(t->npieces, sizeof(*op->reqs));
	if (!op->reqs) {
		return -ENOMEM;
	}
	for (uint32_t p = 0; p < t->npieces; p++) {
		int ret = piece_submit(s, op, p);
		if (ret < 0) {
			for (uint32_t q = 0; q < p; q++) {
				zinf_io_wait(s->io, &op->reqs[q]);
			}
			zinf_free(op->reqs);
			op->reqs = NULL;
			op->nreq = 0;
			return ret;
		}
		op->nreq = (int)p + 1;
	}
	return 0;
}

ZINF_API int
zinf_swap_write_async(struct zinf_swap *s, int id, void *buf, struct zinf_swap_op *op)
{
	int ret = op_check(s, id, buf, op, "write");
	if (ret < 0) {
		return ret;
	}
	op->write = true;
	struct swap_tensor *t = &s->t[id];
	/* Unwritten until the write completes: a failed or torn write is never read as data. */
	t->state = SWAP_WRITING;
	if (t->buf_bytes > t->bytes) {
		memset((char *)buf + t->bytes, 0, t->buf_bytes - t->bytes);
	}
	ret = op_start(s, op);
	if (ret < 0) {
		t->state = SWAP_UNWRITTEN;
		op->result = ret;
		return ret;
	}
	if (op->nreq == 0) {
		t->state = SWAP_VALID;
		op->result = 0;
	}
	return 0;
}

ZINF_API int
zinf_swap_read_async(struct zinf_swap *s, int id, void *buf, struct zinf_swap_op *op)
{
	int ret = op_check(s, id, buf, op, "read");
	if (ret < 0) {
		return ret;
	}
	struct swap_tensor *t = &s->t[id];
	if (t->state != SWAP_VALID) {
		return op->result = SWAP_FAIL(s, -ENODATA,
					      "read of %s[%u], which holds no data (never "
					      "written, or its last write failed)",
					      tensor_kind(s, id), t->index);
	}
	t->state = SWAP_READING;
	ret = op_start(s, op);
	if (ret < 0) {
		t->state = SWAP_VALID;
		op->result = ret;
		return ret;
	}
	if (op->nreq == 0) {
		t->state = SWAP_VALID;
		op->result = 0;
	}
	return 0;
}

/*
 * Piece op->ndone has completed: check its result and (a read with CRC on) its checksum, so
 * that verification overlaps the pieces still in flight. The first error is kept in
 * op->result, which holds 0 until then.
 */
static void
piece_done(struct zinf_swap *s, struct zinf_swap_op *op)
{
	struct swap_tensor *t = &s->t[op->id];
	const struct swap_kind *kd = &s->kinds[t->kind];
	const struct zinf_io_req *r = &op->reqs[op->ndone];
	uint32_t p = (uint32_t)op->ndone++;
	if (op->result) {
		return;
	}
	if (r->result != (int64_t)r->len) {
		int ret = r->result < 0 ? (int)r->result : -EIO;
		op->result =
			SWAP_FAIL(s, ret, "%s of %s[%u] failed: %s at offset %llu, %zu bytes: %s",
				  op->write ? "write" : "read", kd->name, t->index,
				  zinf_io_file_path(r->file), (unsigned long long)r->offset, r->len,
				  strerror(-ret));
		return;
	}
	if (!op->write && s->crc) {
		uint32_t c = zinf_crc32c(0, r->buf, r->len);
		if (c != t->crc[p]) {
			op->result = SWAP_FAIL(s, -EBADMSG,
					       "CRC mismatch reading %s[%u] from %s at offset "
					       "%llu, %zu bytes: 0x%08x, written 0x%08x",
					       kd->name, t->index, zinf_io_file_path(r->file),
					       (unsigned long long)r->offset, r->len, c, t->crc[p]);
		}
	}
}

/* Every piece is complete and checked: settle the tensor's state, free the requests. */
static int
op_finish(struct zinf_swap *s, struct zinf_swap_op *op)
{
	struct swap_tensor *t = &s->t[op->id];
	int ret = (int)op->result;
	if (op->write) {
		if (ret == 0) {
			if (s->crc) {
				memcpy(t->crc, t->crc_new, t->npieces * sizeof(*t->crc));
			}
			t->state = SWAP_VALID;
		} else {
			t->state = SWAP_UNWRITTEN;
		}
	} else {
		t->state = SWAP_VALID;
	}
	zinf_free(op->reqs);
	op->reqs = NULL;
	return ret;
}

ZINF_API int
zinf_swap_wait(struct zinf_swap *s, struct zinf_swap_op *op)
{
	if (!s || !op) {
		return SWAP_FAIL(s, -EINVAL, "zinf_swap_wait: NULL %s",
				 s ? "operation" : "swap space");
	}
	if (!op->reqs) {
		return (int)op->result;
	}
	while (op->ndone < op->nreq) {
		zinf_io_wait(s->io, &op->reqs[op->ndone]);
		piece_done(s, op);
	}
	return op_finish(s, op);
}

ZINF_API int
zinf_swap_poll(struct zinf_swap *s, struct zinf_swap_op *op)
{
	if (!s || !op) {
		return SWAP_FAIL(s, -EINVAL, "zinf_swap_poll: NULL %s",
				 s ? "operation" : "swap space");
	}
	if (!op->reqs) {
		return 1;
	}
	while (op->ndone < op->nreq) {
		if (!zinf_io_poll(s->io, &op->reqs[op->ndone])) {
			return 0;
		}
		piece_done(s, op);
	}
	op_finish(s, op);
	return 1;
}

ZINF_API int
zinf_swap_write(struct zinf_swap *s, int id, void *buf)
{
	struct zinf_swap_op op;
	int ret = zinf_swap_write_async(s, id, buf, &op);
	return ret < 0 ? ret : zinf_swap_wait(s, &op);
}

ZINF_API int
zinf_swap_read(struct zinf_swap *s, int id, void *buf)
{
	struct zinf_swap_op op;
	int ret = zinf_swap_read_async(s, id, buf, &op);
	return ret < 0 ? ret : zinf_swap_wait(s, &op);
}
