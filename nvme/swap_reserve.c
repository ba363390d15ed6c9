/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvme/swap_reserve.c: laying the declared tensors out (stripe units round the directories,
 * one contiguous extent per tensor and directory, every extent aligned; see swap.c) and
 * reserving the space: free space checked (statvfs, directories on one file system summed,
 * what leftovers give back counted) before anything is created, then the files created and
 * preallocated (fallocate; ftruncate where the file system lacks it). Sizes that would pass the
 * largest file offset are -EOVERFLOW. A failed reserve removes what it created.
 *
 * Not here: the leftovers themselves (swap_owner.c), reads and writes (swap_op.c).
 */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "nvme/swap_internal.h"

/* The test hook's figure; UINT64_MAX: ask statvfs. */
static _Atomic uint64_t test_free_bytes = UINT64_MAX;

void
swap_test_set_free_bytes(uint64_t bytes)
{
	atomic_store(&test_free_bytes, bytes);
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
	s->ext_off = zc_calloc((size_t)(s->nt ? s->nt : 1) * s->n_dirs, sizeof(*s->ext_off));
	if (!s->ext_off) {
		return SWAP_FAIL(s, -ENOMEM, "reserve: out of memory for the layout");
	}
	for (int k = 0; k < s->nkinds; k++) {
		struct swap_kind *kd = &s->kinds[k];
		kd->file_bytes = zc_calloc(s->n_dirs, sizeof(*kd->file_bytes));
		kd->files = zc_calloc(s->n_dirs, sizeof(*kd->files));
		kd->paths = zc_calloc(s->n_dirs, sizeof(*kd->paths));
		if (!kd->file_bytes || !kd->files || !kd->paths) {
			return SWAP_FAIL(s, -ENOMEM, "reserve: out of memory for the layout");
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
	if (ret < 0) {
		return ret;
	}
	uint64_t *kind_units = zc_calloc((size_t)(s->nkinds ? s->nkinds : 1), sizeof(*kind_units));
	if (!kind_units) {
		return SWAP_FAIL(s, -ENOMEM, "reserve: out of memory for the layout");
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
			t->crc = zc_calloc(t->npieces, sizeof(*t->crc));
			t->crc_new = zc_calloc(t->npieces, sizeof(*t->crc_new));
			ret = (!t->crc || !t->crc_new)
				      ? SWAP_FAIL(s, -ENOMEM, "%s[%u]: out of memory for %u CRCs",
						  s->kinds[t->kind].name, t->index, t->npieces)
				      : 0;
		}
	}
	zc_free(kind_units);
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

/*
 * Every directory's needs against its file system's free space plus what its leftovers give
 * back, before anything is created. Directories on one file system share its free space, so
 * their needs (and leftovers) are summed.
 */
static int
check_space(struct zinf_swap *s, const uint64_t *reclaim)
{
	unsigned n = s->n_dirs;
	uint64_t *need = zc_calloc(n, sizeof(*need));
	dev_t *dev = zc_calloc(n, sizeof(*dev));
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
	zc_free(need);
	zc_free(dev);
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
				return SWAP_FAIL(s, -ENOMEM,
						 "out of memory for the name of the %s "
						 "file in %s",
						 kd->name, s->dirs[d]);
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
		swap_kind_fini(s, &s->kinds[k]);
		s->kinds[k].files = NULL;
		s->kinds[k].paths = NULL;
		s->kinds[k].file_bytes = NULL;
	}
	for (int id = 0; id < s->nt; id++) {
		zc_free(s->t[id].crc);
		zc_free(s->t[id].crc_new);
		s->t[id].crc = s->t[id].crc_new = NULL;
	}
	zc_free(s->ext_off);
	s->ext_off = NULL;
	s->total_bytes = 0;
}

int
zinf_swap_reserve(struct zinf_swap *s)
{
	struct swap_leftovers lo = {0};
	if (!s) {
		return SWAP_FAIL(s, -EINVAL, "zinf_swap_reserve: NULL swap space");
	}
	if (s->reserved) {
		return SWAP_FAIL(s, -EBUSY, "already reserved");
	}
	int ret = layout(s);
	if (ret == 0) {
		ret = swap_leftovers_find(s, &lo);
	}
	if (ret == 0) {
		ret = check_space(s, lo.dir_bytes);
	}
	if (ret == 0) {
		swap_leftovers_reclaim(s, &lo);
		ret = files_create(s);
	}
	swap_leftovers_free(&lo);
	if (ret < 0) {
		reserve_undo(s);
		return ret;
	}
	s->reserved = true;
	return 0;
}
