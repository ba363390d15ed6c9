/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvme/swap_owner.c: the file names a swap space owns. For each directory d it holds an
 * exclusive flock(2) on `<prefix>-r<rank>.<d>.lock`, which guards `<prefix>-r<rank>-*.<d>.swp`
 * and the probe file, from create to destroy, with its pid written inside for the message the
 * next one gets (-EBUSY naming the files, the lock and that pid). flock belongs to the open file
 * description, so two swap spaces of one process conflict as two processes do. Files of its
 * names found at reserve belong to nobody alive (the lock is held): leftovers of a process that
 * died, or of keep_files; they are listed here (with the bytes removing them gives back) and
 * removed with one warning naming each and its size.
 *
 * Not here: the free-space check that counts them (swap_reserve.c).
 */
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nvme/swap_internal.h"

/* The lock of directory d is held by someone else (pid `holder`, 0: unknown): -EBUSY naming
 * the files and that pid. */
static int
lock_busy(struct zinf_swap *s, unsigned d, long holder)
{
	char who[64] = "a process that did not say its pid";
	if (holder == (long)getpid()) {
		snprintf(who, sizeof(who), "this process, pid %ld", holder);
	} else if (holder > 0) {
		snprintf(who, sizeof(who), "process %ld", holder);
	}
	return SWAP_FAIL(s, -EBUSY,
			 "the files %s/%s-r%d-*.%u.swp belong to another live swap space (%s; "
			 "lock %s): give each job its own directory, prefix or rank",
			 s->dirs[d], s->prefix, s->rank, d, who, s->lock_path[d]);
}

int
swap_lock_file(const char *path, int *fd_out, long *holder)
{
	*holder = 0;
	for (int tries = 0, busy = 0; tries < 100 + SWAP_LOCK_BUSY_TRIES; tries++) {
		int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (fd < 0) {
			return -errno;
		}
		if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
			int e = errno;
			if (e == EWOULDBLOCK) {
				char buf[32] = "";
				ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
				*holder = n > 0 ? strtol(buf, NULL, 10) : 0;
			}
			close(fd);
			if (e == EWOULDBLOCK && ++busy < SWAP_LOCK_BUSY_TRIES) {
				/* held for a moment (a reclaim's look) or for good: wait and see */
				usleep(SWAP_LOCK_BUSY_US);
				continue;
			}
			return -e;
		}
		struct stat a, b;
		if (fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_ino == b.st_ino &&
		    a.st_dev == b.st_dev) {
			char pid[32];
			int n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
			if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
				ZINF_DEBUG("%s: pid not written", path);
			}
			*fd_out = fd;
			return 0;
		}
		close(fd); /* unlinked by its last owner after our open: try the new one */
	}
	return -EAGAIN;
}

/* Take the names of directory d: its lock file (swap_lock_file). */
int
swap_lock_dir(struct zinf_swap *s, unsigned d)
{
	if (asprintf(&s->lock_path[d], "%s/%s-r%d.%u.lock", s->dirs[d], s->prefix, s->rank, d) <
	    0) {
		s->lock_path[d] = NULL;
		return SWAP_FAIL(s, -ENOMEM, "out of memory for the lock file's name in %s",
				 s->dirs[d]);
	}
	const char *path = s->lock_path[d];
	long holder;
	int ret = swap_lock_file(path, &s->lock_fd[d], &holder);
	if (ret == -EWOULDBLOCK) {
		return lock_busy(s, d, holder);
	}
	if (ret == -EAGAIN) {
		return SWAP_FAIL(s, ret, "the lock file %s keeps being replaced", path);
	}
	if (ret) {
		return SWAP_FAIL(s, ret, "cannot create or lock the lock file %s: %s", path,
				 strerror(-ret));
	}
	return 0;
}

void
swap_unlock_dirs(struct zinf_swap *s)
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
	zc_free(s->lock_fd);
	zc_free(s->lock_path);
}

/* ---- leftovers of a process that is gone -------------------------------------------------- */

void
swap_leftovers_free(struct swap_leftovers *lo)
{
	for (unsigned i = 0; i < lo->n; i++) {
		free(lo->paths[i]);
	}
	zc_free(lo->paths);
	zc_free(lo->bytes);
	zc_free(lo->dir_bytes);
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
	return swap_kind_name_ok(kind);
}

static int
leftover_add(struct swap_leftovers *lo, const char *dir, const char *name, uint64_t bytes)
{
	if (lo->n == lo->cap) {
		unsigned cap = lo->cap ? lo->cap * 2 : 8;
		char **p = zc_calloc(cap, sizeof(*p));
		uint64_t *b = zc_calloc(cap, sizeof(*b));
		if (!p || !b) {
			zc_free(p);
			zc_free(b);
			return -ENOMEM;
		}
		if (lo->n) {
			memcpy(p, lo->paths, lo->n * sizeof(*p));
			memcpy(b, lo->bytes, lo->n * sizeof(*b));
		}
		zc_free(lo->paths);
		zc_free(lo->bytes);
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
int
swap_leftovers_find(struct zinf_swap *s, struct swap_leftovers *lo)
{
	memset(lo, 0, sizeof(*lo));
	lo->dir_bytes = zc_calloc(s->n_dirs, sizeof(*lo->dir_bytes));
	if (!lo->dir_bytes) {
		return SWAP_FAIL(s, -ENOMEM, "reserve: out of memory listing leftovers");
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
			return SWAP_FAIL(s, ret, "reserve: out of memory listing leftovers in %s",
					 s->dirs[d]);
		}
	}
	return 0;
}

/* Remove the leftovers, with one warning that names each and its size. */
void
swap_leftovers_reclaim(struct zinf_swap *s, const struct swap_leftovers *lo)
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
