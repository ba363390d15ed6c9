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
 * Not here: the engine itself (nvme/io*.c), buffer management (offload/).
 */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/util.h"
#include "nvme/swap_internal.h"
#include "zinf/swap.h"

#define SWAP_KIND_MAX	48
#define SWAP_DEFAULT_SU (1u << 20)
#define SWAP_MIN_ALIGN	4096u /* layout unit when a file reports less (buffered I/O) */

_Static_assert(sizeof(struct zinf_swap_opts) <= 128, "zinf_swap_opts grew: check opts.size use");

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
	char **dirs;	    /* [n_dirs], copied */
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

ZINF_API void
zinf_swap_opts_init(struct zinf_swap_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	o->stripe_unit = SWAP_DEFAULT_SU;
	o->prefix = "zinf";
}

/* ---- create / destroy --------------------------------------------------------------------- */

/*
 * Check that `dir` is a writable directory and find its direct-I/O alignment by opening a
 * probe file in it through the engine (which reads STATX_DIOALIGN).
 */
static int
probe_dir(struct zinf_swap *s, unsigned d, bool buffered_ok)
{
	const char *dir = s->dirs[d];
	struct stat st;
	if (stat(dir, &st) != 0) {
		int e = errno;
		return ZINF_FAIL(-e, "swap: directory %s: %s", dir, strerror(e));
	}
	if (!S_ISDIR(st.st_mode)) {
		return ZINF_FAIL(-ENOTDIR, "swap: %s is not a directory", dir);
	}
	if (access(dir, W_OK | X_OK) != 0) {
		int e = errno;
		return ZINF_FAIL(-e, "swap: directory %s is not writable: %s", dir, strerror(e));
	}
	char *path = NULL;
	if (asprintf(&path, "%s/.%s-r%d.%u.probe", dir, s->prefix, s->rank, d) < 0) {
		return -ENOMEM;
	}
	struct zinf_io_file *f = NULL;
	unsigned flags = ZINF_IO_RDWR | ZINF_IO_CREATE | ZINF_IO_TRUNC;
	int ret = zinf_io_file_open(s->io, path,
				    flags | (buffered_ok ? ZINF_IO_DIRECT_OR_BUFFERED : 0), &f);
	if (ret == 0) {
		s->dir_buffered[d] = !zinf_io_file_direct(f);
	}
	if (ret < 0) {
		unlink(path);
		free(path);
		if (ret == -EINVAL) {
			return ZINF_FAIL(
				-EINVAL,
				"swap: directory %s refuses O_DIRECT (tmpfs?) and buffered "
				"I/O was not allowed (opts.buffered)",
				dir);
		}
		return ZINF_FAIL(ret, "swap: cannot create a file in %s: %s", dir, strerror(-ret));
	}
	uint32_t a = zinf_io_file_align(f);
	zinf_io_file_close(s->io, f);
	unlink(path);
	free(path);
	if (a < SWAP_MIN_ALIGN) {
		a = SWAP_MIN_ALIGN;
	}
	if (a > s->align) {
		s->align = a;
	}
	return 0;
}

ZINF_API int
zinf_swap_create(struct zinf_io *io, const struct zinf_swap_opts *opts, struct zinf_swap **out)
{
	if (!io || !opts || !out) {
		return ZINF_FAIL(-EINVAL, "swap: NULL argument");
	}
	if (opts->size < offsetof(struct zinf_swap_opts, keep_files) + sizeof(bool)) {
		return ZINF_FAIL(-EINVAL, "swap: opts.size %zu: call zinf_swap_opts_init()",
				 opts->size);
	}
	if (opts->n_dirs == 0 || !opts->dirs) {
		return ZINF_FAIL(-EINVAL, "swap: no directory given");
	}
	for (unsigned d = 0; d < opts->n_dirs; d++) {
		if (!opts->dirs[d] || !opts->dirs[d][0]) {
			return ZINF_FAIL(-EINVAL, "swap: directory %u is empty", d);
		}
	}
	const char *prefix = opts->prefix ? opts->prefix : "zinf";
	if (!prefix[0] || strchr(prefix, '/')) {
		return ZINF_FAIL(-EINVAL, "swap: bad file name prefix '%s'", prefix);
	}
	uint64_t su = opts->stripe_unit ? opts->stripe_unit : SWAP_DEFAULT_SU;

	int ret = -ENOMEM;
	struct zinf_swap *s = zinf_calloc(1, sizeof(*s));
	if (!s) {
		return -ENOMEM;
	}
	s->io = io;
	s->n_dirs = opts->n_dirs;
	s->stripe_unit = su;
	s->rank = opts->rank;
	s->crc = opts->crc;
	s->keep_files = opts->keep_files;
	s->align = 1;
	s->prefix = zinf_strdup(prefix);
	s->dirs = zinf_calloc(s->n_dirs, sizeof(*s->dirs));
	s->dir_buffered = zinf_calloc(s->n_dirs, sizeof(*s->dir_buffered));
	if (!s->prefix || !s->dirs || !s->dir_buffered) {
		goto fail;
	}
	for (unsigned d = 0; d < s->n_dirs; d++) {
		s->dirs[d] = zinf_strdup(opts->dirs[d]);
		if (!s->dirs[d]) {
			goto fail;
		}
	}
	for (unsigned d = 0; d < s->n_dirs; d++) {
		ret = probe_dir(s, d, opts->buffered);
		if (ret < 0) {
			goto fail;
		}
	}
	if (su % s->align != 0) {
		ret = ZINF_FAIL(-EINVAL,
				"swap: stripe unit %llu is not a multiple of the alignment %u",
				(unsigned long long)su, s->align);
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
	if (s->dirs) {
		for (unsigned d = 0; d < s->n_dirs; d++) {
			zinf_free(s->dirs[d]);
		}
	}
	zinf_free(s->dirs);
	zinf_free(s->dir_buffered);
	zinf_free(s->prefix);
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
		return -EINVAL;
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
		return ZINF_FAIL(-EINVAL, "swap: NULL argument");
	}
	if (s->reserved) {
		return ZINF_FAIL(-EBUSY, "swap: %s[%u] declared after zinf_swap_reserve()", kind,
				 index);
	}
	if (!kind_name_ok(kind)) {
		return ZINF_FAIL(-EINVAL,
				 "swap: bad state kind '%s' (1..%d letters, digits and '_')", kind,
				 SWAP_KIND_MAX);
	}
	if (zinf_swap_find(s, kind, index) >= 0) {
		return ZINF_FAIL(-EEXIST, "swap: %s[%u] declared twice", kind, index);
	}
	if (s->nt == INT32_MAX - 1) {
		return -ENOSPC;
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

static int
layout(struct zinf_swap *s)
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
	uint64_t *kind_units =
		zinf_calloc((size_t)(s->nkinds ? s->nkinds : 1), sizeof(*kind_units));
	if (!kind_units) {
		return -ENOMEM;
	}
	s->total_bytes = 0;
	for (int id = 0; id < s->nt; id++) {
		struct swap_tensor *t = &s->t[id];
		struct swap_kind *kd = &s->kinds[t->kind];
		t->buf_bytes = ZINF_ALIGN_UP(t->bytes, (uint64_t)s->align);
		/* One request per extent, or one per stripe unit (striped, or to check CRCs). */
		t->npieces = (s->n_dirs == 1 && !s->crc)
				     ? (t->buf_bytes ? 1 : 0)
				     : (uint32_t)ZINF_DIV_ROUND_UP(t->buf_bytes, s->stripe_unit);
		/* Rotating first directory (see the top of this file). */
		t->dir0 = (unsigned)(((uint64_t)t->kind + kind_units[t->kind]) % s->n_dirs);
		kind_units[t->kind] += ZINF_DIV_ROUND_UP(t->buf_bytes, s->stripe_unit);
		for (unsigned d = 0; d < s->n_dirs; d++) {
			uint64_t b = extent_bytes(s, t, d);
			s->ext_off[(size_t)id * s->n_dirs + d] = kd->file_bytes[d];
			kd->file_bytes[d] += b; /* b is a multiple of the alignment */
			s->total_bytes += b;
		}
		if (s->crc && t->npieces) {
			t->crc = zinf_calloc(t->npieces, sizeof(*t->crc));
			t->crc_new = zinf_calloc(t->npieces, sizeof(*t->crc_new));
			if (!t->crc || !t->crc_new) {
				zinf_free(kind_units);
				return -ENOMEM;
			}
		}
	}
	zinf_free(kind_units);
	return 0;
}

/* Free bytes for an unprivileged writer in dir (or the test hook's figure). */
static int
dir_free_bytes(const char *dir, uint64_t *out)
{
	uint64_t hook = atomic_load(&test_free_bytes);
	if (hook != UINT64_MAX) {
		*out = hook;
		return 0;
	}
	struct statvfs v;
	if (statvfs(dir, &v) != 0) {
		int e = errno;
		return ZINF_FAIL(-e, "swap: statvfs %s: %s", dir, strerror(e));
	}
	*out = (uint64_t)v.f_bavail * v.f_frsize;
	return 0;
}

/*
 * Every directory's needs against its file system's free space, before anything is created.
 * Directories on one file system share its free space, so their needs are summed.
 */
static int
check_space(struct zinf_swap *s)
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
			ret = ZINF_FAIL(-e, "swap: directory %s: %s", s->dirs[d], strerror(e));
			goto out;
		}
		dev[d] = st.st_dev;
		for (int k = 0; k < s->nkinds; k++) {
			need[d] += s->kinds[k].file_bytes[d];
		}
	}
	for (unsigned d = 0; d < n; d++) {
		uint64_t sum = 0;
		unsigned first = d;
		for (unsigned e = 0; e < n; e++) {
			if (dev[e] == dev[d]) {
				sum += need[e];
				first = ZINF_MIN(first, e);
			}
		}
		if (first != d || sum == 0) {
			continue; /* counted with the first directory on that file system */
		}
		uint64_t avail;
		ret = dir_free_bytes(s->dirs[d], &avail);
		if (ret < 0) {
			goto out;
		}
		if (sum > avail) {
			ret = ZINF_FAIL(
				-ENOSPC,
				"swap: not enough space in %s: needs %llu bytes, %llu bytes "
				"free",
				s->dirs[d], (unsigned long long)sum, (unsigned long long)avail);
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
		dir_free_bytes(s->dirs[0], &avail);
		struct statvfs v;
		if (fstatvfs(fd, &v) == 0) {
			avail = (uint64_t)v.f_bavail * v.f_frsize;
		}
		return ZINF_FAIL(-ENOSPC,
				 "swap: preallocating %s: needs %llu bytes, %llu bytes free", path,
				 (unsigned long long)bytes, (unsigned long long)avail);
	}
	if (e == EFBIG) {
		return ZINF_FAIL(-EFBIG,
				 "swap: preallocating %s: %llu bytes exceed the file size limit "
				 "(ulimit -f, RLIMIT_FSIZE) or the file system's",
				 path, (unsigned long long)bytes);
	}
	if (e) {
		return ZINF_FAIL(-e, "swap: preallocating %llu bytes for %s: %s",
				 (unsigned long long)bytes, path, strerror(e));
	}
	return 0;
}

ZINF_API int
zinf_swap_reserve(struct zinf_swap *s)
{
	if (!s) {
		return -EINVAL;
	}
	if (s->reserved) {
		return ZINF_FAIL(-EBUSY, "swap: already reserved");
	}
	int ret = layout(s);
	if (ret < 0) {
		goto fail;
	}
	ret = check_space(s);
	if (ret < 0) {
		goto fail;
	}
	for (int k = 0; k < s->nkinds; k++) {
		struct swap_kind *kd = &s->kinds[k];
		for (unsigned d = 0; d < s->n_dirs; d++) {
			if (!kd->file_bytes[d]) {
				continue;
			}
			if (asprintf(&kd->paths[d], "%s/%s-r%d-%s.%u.swp", s->dirs[d], s->prefix,
				     s->rank, kd->name, d) < 0) {
				kd->paths[d] = NULL;
				ret = -ENOMEM;
				goto fail;
			}
			unsigned fl = ZINF_IO_RDWR | ZINF_IO_CREATE | ZINF_IO_TRUNC;
			if (s->dir_buffered[d]) {
				fl |= ZINF_IO_BUFFERED;
			}
			ret = zinf_io_file_open(s->io, kd->paths[d], fl, &kd->files[d]);
			if (ret < 0) {
				kd->files[d] = NULL;
				ZINF_ERR("swap: cannot create %s: %s", kd->paths[d],
					 strerror(-ret));
				goto fail;
			}
			ret = preallocate(s, kd->files[d], kd->file_bytes[d]);
			if (ret < 0) {
				goto fail;
			}
		}
	}
	s->reserved = true;
	return 0;
fail:
	/* Back to the declared state: close and remove what was created. */
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
	return ret;
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
		sum += ZINF_ALIGN_UP(s->t[id].bytes, (uint64_t)s->align);
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
		return -EINVAL;
	}
	memset(op, 0, sizeof(*op));
	op->id = id;
	op->buf = buf;
	if (!s->reserved) {
		return op->result = ZINF_FAIL(-EBUSY, "swap: %s before zinf_swap_reserve()", what);
	}
	if (id < 0 || id >= s->nt) {
		return op->result =
			       ZINF_FAIL(-EINVAL, "swap: %s of unknown tensor id %d", what, id);
	}
	if (!buf && s->t[id].buf_bytes) {
		return op->result = ZINF_FAIL(-EINVAL, "swap: %s of %s[%u]: NULL buffer", what,
					      tensor_kind(s, id), s->t[id].index);
	}
	if ((uintptr_t)buf % s->align) {
		return op->result =
			       ZINF_FAIL(-EINVAL,
					 "swap: %s of %s[%u]: buffer %p is not aligned to %u "
					 "bytes",
					 what, tensor_kind(s, id), s->t[id].index, buf, s->align);
	}
	enum swap_state st = s->t[id].state;
	if (st == SWAP_WRITING || st == SWAP_READING) {
		return op->result = ZINF_FAIL(-EBUSY, "swap: %s of %s[%u] while a %s is in flight",
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
		return ZINF_FAIL(ret, "swap: submitting %s of %s[%u] to %s: %s",
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
		return op->result = ZINF_FAIL(-ENODATA,
					      "swap: read of %s[%u], which holds no data (never "
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
		op->result = ZINF_FAIL(
			ret, "swap: %s of %s[%u] failed: %s at offset %llu, %zu bytes: %s",
			op->write ? "write" : "read", kd->name, t->index,
			zinf_io_file_path(r->file), (unsigned long long)r->offset, r->len,
			strerror(-ret));
		return;
	}
	if (!op->write && s->crc) {
		uint32_t c = zinf_crc32c(0, r->buf, r->len);
		if (c != t->crc[p]) {
			op->result =
				ZINF_FAIL(-EBADMSG,
					  "swap: CRC mismatch reading %s[%u] from %s at offset "
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
		return -EINVAL;
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
		return -EINVAL;
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
