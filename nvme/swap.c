/* SPDX-License-Identifier: Apache-2.0 */
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
 * Files: swap.c (options, create/destroy, declarations, getters), swap_owner.c (the names'
 * locks and the leftovers), swap_reserve.c (layout, free space, preallocation), swap_op.c
 * (reads and writes, CRC). Not here: the engine itself (nvme/io*.c), buffer management
 * (offload/).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/opts.h"
#include "nvme/swap_internal.h"

ZINF_OPTS_NO_TAIL_PAD(struct zinf_swap_opts, reserved);

void
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

/* Whether `dir` is a directory this process may write in. Logged (for swap space s, or
 * NULL); 0 or -errno. */
static int
dir_writable(struct zinf_swap *s, const char *dir)
{
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
	return 0;
}

/*
 * Open a probe file `name` in `dir` through `io` as swap files are opened (O_DIRECT, or either
 * with buffered_ok), then close and remove it: *buffered and *align say what the file system
 * gives (the engine reads STATX_DIOALIGN). Logged for s (or NULL); 0 or -errno.
 */
static int
dir_probe(struct zinf_swap *s, struct zinf_io *io, const char *dir, const char *name,
	  bool buffered_ok, bool *buffered, uint32_t *align)
{
	char *path = NULL;
	if (asprintf(&path, "%s/%s", dir, name) < 0) {
		return SWAP_FAIL(s, -ENOMEM, "out of memory for the probe file's name in %s", dir);
	}
	struct zinf_io_file *f = NULL;
	unsigned flags = ZINF_IO_RDWR | ZINF_IO_CREATE | ZINF_IO_TRUNC;
	int ret = zinf_io_file_open(io, path,
				    flags | (buffered_ok ? ZINF_IO_DIRECT_OR_BUFFERED : 0), &f);
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
	*buffered = !zinf_io_file_direct(f);
	*align = zinf_io_file_align(f);
	zinf_io_file_close(io, f);
	unlink(path);
	free(path);
	return 0;
}

/*
 * Check that `dir` is a writable directory, take its names (lock_dir) and find its direct-I/O
 * alignment by opening a probe file in it through the engine (which reads STATX_DIOALIGN).
 */
static int
dir_open(struct zinf_swap *s, unsigned d, bool buffered_ok)
{
	const char *dir = s->dirs[d];
	int ret = dir_writable(s, dir);
	if (ret < 0 || (ret = swap_lock_dir(s, d)) < 0) {
		return ret;
	}
	char name[256];
	uint32_t a = 0;
	snprintf(name, sizeof(name), ".%s-r%d.%u.probe", s->prefix, s->rank, d);
	if ((ret = dir_probe(s, s->io, dir, name, buffered_ok, &s->dir_buffered[d], &a)) < 0) {
		return ret;
	}
	s->align = ZINF_MAX(s->align, ZINF_MAX(a, SWAP_MIN_ALIGN));
	return 0;
}

int
zinf_swap_check_dir(struct zinf_io *io, const char *dir, bool buffered_ok)
{
	if (!io || !dir || !dir[0]) {
		return SWAP_FAIL(NULL, -EINVAL, "zinf_swap_check_dir: NULL context or directory");
	}
	int ret = dir_writable(NULL, dir);
	if (ret < 0) {
		return ret;
	}
	/* a name of this process's own: a swap space in the same directory keeps its names */
	char name[64];
	bool buffered;
	uint32_t a;
	snprintf(name, sizeof(name), ".zinf-check-%ld.probe", (long)getpid());
	return dir_probe(NULL, io, dir, name, buffered_ok, &buffered, &a);
}

/* The caller's options, checked; prefix defaulted. */
static int
swap_opts_take(struct zinf_swap_opts *o, const struct zinf_swap_opts *opts)
{
	zinf_swap_opts_init(o);
	int ret = zc_opts_take(o, sizeof(*o), opts, "zinf_swap_opts");
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
	char *n = zc_malloc(len);
	if (!n) {
		return NULL;
	}
	size_t at = (size_t)snprintf(n, len, "swap %s-r%d in ", o->prefix, o->rank);
	for (unsigned d = 0; d < o->n_dirs; d++) {
		at += (size_t)snprintf(n + at, len - at, "%s%s", d ? "," : "", o->dirs[d]);
	}
	return n;
}

int
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
	struct zinf_swap *s = zc_calloc(1, sizeof(*s));
	if (!s) {
		return SWAP_FAIL(NULL, -ENOMEM, "zinf_swap_create: out of memory");
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
	s->prefix = zc_strdup(o.prefix);
	s->dirs = zc_calloc(s->n_dirs, sizeof(*s->dirs));
	s->dir_buffered = zc_calloc(s->n_dirs, sizeof(*s->dir_buffered));
	s->lock_fd = zc_calloc(s->n_dirs, sizeof(*s->lock_fd));
	s->lock_path = zc_calloc(s->n_dirs, sizeof(*s->lock_path));
	for (unsigned d = 0; s->lock_fd && d < s->n_dirs; d++) {
		s->lock_fd[d] = -1;
	}
	if (!s->name || !s->prefix || !s->dirs || !s->dir_buffered || !s->lock_fd ||
	    !s->lock_path) {
		ret = SWAP_FAIL(s, -ENOMEM, "zinf_swap_create: out of memory");
		goto fail;
	}
	for (unsigned d = 0; d < s->n_dirs; d++) {
		s->dirs[d] = zc_strdup(o.dirs[d]);
		if (!s->dirs[d]) {
			ret = SWAP_FAIL(s, -ENOMEM, "zinf_swap_create: out of memory");
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

void
swap_kind_fini(struct zinf_swap *s, struct swap_kind *k)
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
	zc_free(k->files);
	zc_free(k->paths);
	zc_free(k->file_bytes);
}

void
zinf_swap_destroy(struct zinf_swap *s)
{
	if (!s) {
		return;
	}
	for (int i = 0; i < s->nkinds; i++) {
		swap_kind_fini(s, &s->kinds[i]);
	}
	zc_free(s->kinds);
	for (int i = 0; i < s->nt; i++) {
		zc_free(s->t[i].crc);
		zc_free(s->t[i].crc_new);
	}
	zc_free(s->t);
	zc_free(s->ext_off);
	zc_free(s->hash);
	/* After the files are gone: the names stay ours until then. */
	swap_unlock_dirs(s);
	if (s->dirs) {
		for (unsigned d = 0; d < s->n_dirs; d++) {
			zc_free(s->dirs[d]);
		}
	}
	zc_free(s->dirs);
	zc_free(s->dir_buffered);
	zc_free(s->prefix);
	zc_free(s->name);
	zc_free(s);
}

/* ---- declarations ------------------------------------------------------------------------- */

bool
swap_kind_name_ok(const char *k)
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
	int *h = zc_calloc(cap, sizeof(*h));
	if (!h) {
		return SWAP_FAIL(s, -ENOMEM, "out of memory for a table of %u tensors", cap);
	}
	zc_free(s->hash);
	s->hash = h;
	s->hash_cap = cap;
	for (int id = 0; id < s->nt; id++) {
		s->hash[hash_slot(s, s->t[id].kind, s->t[id].index)] = id + 1;
	}
	return 0;
}

int
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

int
zinf_swap_add(struct zinf_swap *s, const char *kind, uint32_t index, uint64_t bytes)
{
	if (!s || !kind) {
		return SWAP_FAIL(s, -EINVAL, "zinf_swap_add: NULL %s", s ? "kind" : "swap space");
	}
	if (s->reserved) {
		return SWAP_FAIL(s, -EBUSY, "%s[%u] declared after zinf_swap_reserve()", kind,
				 index);
	}
	if (!swap_kind_name_ok(kind)) {
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
			struct swap_kind *nk = zc_calloc(cap, sizeof(*nk));
			if (!nk) {
				return SWAP_FAIL(s, -ENOMEM, "%s[%u]: out of memory", kind, index);
			}
			if (s->nkinds) {
				memcpy(nk, s->kinds, s->nkinds * sizeof(*nk));
			}
			zc_free(s->kinds);
			s->kinds = nk;
			s->kinds_cap = cap;
		}
		k = s->nkinds++;
		memset(&s->kinds[k], 0, sizeof(s->kinds[k]));
		strcpy(s->kinds[k].name, kind);
	}
	if (s->nt == s->t_cap) {
		int cap = s->t_cap ? s->t_cap * 2 : 64;
		struct swap_tensor *nt = zc_calloc(cap, sizeof(*nt));
		if (!nt) {
			return SWAP_FAIL(s, -ENOMEM, "%s[%u]: out of memory", kind, index);
		}
		if (s->nt) {
			memcpy(nt, s->t, s->nt * sizeof(*nt));
		}
		zc_free(s->t);
		s->t = nt;
		s->t_cap = cap;
	}
	if ((unsigned)(s->nt + 1) * 2 > s->hash_cap && hash_grow(s) < 0) {
		return -ENOMEM; /* logged */
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

/* ---- getters ------------------------------------------------------------------------------ */

uint32_t
zinf_swap_align(const struct zinf_swap *s)
{
	return s ? s->align : 0;
}

bool
zinf_swap_dir_direct(const struct zinf_swap *s, unsigned d)
{
	return s && d < s->n_dirs && !s->dir_buffered[d];
}

uint64_t
zinf_swap_bytes(const struct zinf_swap *s, int id)
{
	return (s && id >= 0 && id < s->nt) ? s->t[id].bytes : 0;
}

uint64_t
zinf_swap_buf_bytes(const struct zinf_swap *s, int id)
{
	return (s && id >= 0 && id < s->nt) ? ZINF_ALIGN_UP(s->t[id].bytes, (uint64_t)s->align) : 0;
}

uint64_t
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
