/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvme/scratch.c: scratch that names its owner (zinf/blocks/swap.h). A scratch directory is
 * made under a lock file held for its whole life (the lock first, then the directory; the
 * directory removed first, then the lock), and zinf_scratch_reclaim removes what owners that
 * are gone left in a shared directory: entries `<stem>-<pid>-...` whose pid does not run and
 * whose `<stem>-<pid>-*.lock` nobody holds. Used by the `zinf` command's benchmarks (their swap
 * files, prefix `<stem>-<pid>`) and the example trainer (its scratch directory under
 * --scratch-parent).
 *
 * Not here: a swap space's leftovers of its own names, found at reserve (swap_owner.c), and the
 * lock taking itself (swap_lock_file, shared with the swap space).
 */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nvme/swap_internal.h"

/* Deep enough for any scratch a zinf program makes; a deeper tree is left as it is. */
#define SCRATCH_DEPTH 16

struct zinf_scratch_dir {
	char *path; /* the directory */
	char *lock; /* its lock file */
	int lock_fd;
};

static bool
name_ok(const char *s)
{
	if (!s || !*s) {
		return false;
	}
	for (; *s; s++) {
		char c = *s;
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '-' || c == '_' || c == '.')) {
			return false;
		}
	}
	return true;
}

/*
 * Remove `name` in the directory dfd: a file, or a directory and everything in it (at most
 * `depth` levels; symbolic links are removed, never followed). Entries that vanish meanwhile
 * (another process removing the same) are no error. 0 or the first -errno.
 */
static int
rm_at(int dfd, const char *name, int depth)
{
	if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT) {
		return 0;
	}
	int e = errno; /* EISDIR (EPERM on some systems) for a directory */
	if (e != EISDIR && e != EPERM) {
		return -e;
	}
	if (depth <= 0) {
		return -ELOOP;
	}
	int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		return errno == ENOENT ? 0 : errno == ENOTDIR ? -e : -errno;
	}
	DIR *d = fdopendir(fd);
	if (!d) {
		e = errno;
		close(fd);
		return -e;
	}
	int ret = 0;
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		if (strcmp(de->d_name, ".") != 0 && strcmp(de->d_name, "..") != 0) {
			int r = rm_at(dirfd(d), de->d_name, depth - 1);
			ret = ret ? ret : r;
		}
	}
	closedir(d);
	if (unlinkat(dfd, name, AT_REMOVEDIR) != 0 && errno != ENOENT && !ret) {
		ret = -errno;
	}
	return ret;
}

int
zinf_scratch_dir_create(const char *parent, const char *stem, const char *tag,
			struct zinf_scratch_dir **out)
{
	if (!parent || !*parent || !name_ok(stem) || !name_ok(tag) || !out) {
		return ZINF_FAIL(-EINVAL, "scratch directory: a parent, and a stem and a tag of "
					  "letters, digits, '-', '_' and '.', are needed");
	}
	struct zinf_scratch_dir *d = zc_calloc(1, sizeof(*d));
	if (!d) {
		return ZINF_FAIL(-ENOMEM, "scratch directory under %s: out of memory", parent);
	}
	d->lock_fd = -1;
	long pid = (long)getpid(), holder;
	if (asprintf(&d->lock, "%s/%s-%ld-%s.lock", parent, stem, pid, tag) < 0) {
		d->lock = NULL;
		zinf_scratch_dir_destroy(d);
		return ZINF_FAIL(-ENOMEM, "scratch directory under %s: out of memory", parent);
	}
	if (asprintf(&d->path, "%s/%s-%ld-%s-XXXXXX", parent, stem, pid, tag) < 0) {
		d->path = NULL;
		zinf_scratch_dir_destroy(d);
		return ZINF_FAIL(-ENOMEM, "scratch directory under %s: out of memory", parent);
	}
	/* the lock before the directory: a reclaim that sees the directory finds it held */
	int ret = swap_lock_file(d->lock, &d->lock_fd, &holder);
	if (ret == -EWOULDBLOCK && holder == pid) {
		ret = ZINF_FAIL(-EBUSY,
				"scratch directory: the lock %s: this process holds it "
				"already (one directory per tag)",
				d->lock);
	} else if (ret == -EWOULDBLOCK) {
		char who[48] = "no pid in it";
		if (holder > 0) {
			snprintf(who, sizeof(who), "the file names pid %ld", holder);
		}
		ret = ZINF_FAIL(-EBUSY,
				"scratch directory: the lock %s: held by another process for more "
				"than %d ms (%s)",
				d->lock, SWAP_LOCK_BUSY_TRIES * SWAP_LOCK_BUSY_US / 1000, who);
	} else if (ret) {
		ret = ZINF_FAIL(ret, "scratch directory: the lock %s: %s", d->lock,
				zinf_strerror(ret));
	}
	if (ret) {
		zinf_scratch_dir_destroy(d);
		return ret;
	}
	if (!mkdtemp(d->path)) {
		ret = -errno;
		ZINF_FAIL(ret, "scratch directory: creating %s: %s", d->path, zinf_strerror(ret));
		d->path[0] = '\0';
		zinf_scratch_dir_destroy(d);
		return ret;
	}
	*out = d;
	return 0;
}

const char *
zinf_scratch_dir_path(const struct zinf_scratch_dir *d)
{
	return d && d->path ? d->path : "";
}

void
zinf_scratch_dir_destroy(struct zinf_scratch_dir *d)
{
	if (!d) {
		return;
	}
	if (d->path && d->path[0]) {
		int r = rm_at(AT_FDCWD, d->path, SCRATCH_DEPTH);
		if (r) {
			ZINF_WARN("scratch directory %s: not all removed: %s", d->path,
				  zinf_strerror(r));
		}
	}
	if (d->lock_fd >= 0) {
		/* unlinked while still held: a reclaim never takes a live lock for a dead one */
		unlink(d->lock);
		close(d->lock_fd);
	}
	free(d->path); /* asprintf's */
	free(d->lock);
	zc_free(d);
}

/* ---- what owners that are gone left ------------------------------------------------------- */

/* The owner's pid of an entry "<stem>-<pid>-..." (a leading '.' allowed), or 0. */
static long
owner_of(const char *name, const char *stem)
{
	size_t sl = strlen(stem);
	if (name[0] == '.') {
		name++;
	}
	if (strncmp(name, stem, sl) != 0 || name[sl] != '-' || name[sl + 1] < '0' ||
	    name[sl + 1] > '9') {
		return 0;
	}
	char *end = NULL;
	errno = 0;
	long pid = strtol(name + sl + 1, &end, 10);
	return errno == 0 && pid > 0 && *end == '-' ? pid : 0;
}

static bool
pid_runs(long pid)
{
	return kill((pid_t)pid, 0) == 0 || errno != ESRCH;
}

/*
 * Whether the lock file `name` in dfd is held by someone. One that cannot be opened or locked
 * for another reason than being held (permissions; a file system without flock) counts as
 * held: when in doubt, nothing is removed. Opened for writing, so that a network file system
 * that maps flock to byte-range locks (NFS) can take an exclusive one.
 */
static bool
lock_held(int dfd, const char *name)
{
	int fd = openat(dfd, name, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0) {
		return errno != ENOENT; /* gone: not held; unreadable: in doubt */
	}
	bool held = flock(fd, LOCK_EX | LOCK_NB) != 0;
	close(fd); /* lets go of it if we took it */
	return held;
}

/* Whether pid holds a lock `<stem>-<pid>-*.lock` in dir: listed afresh, after its entry was
 * seen (an owner locks before it makes an entry). */
static bool
owner_holds_lock(const char *dir, const char *stem, long pid)
{
	DIR *d = opendir(dir);
	if (!d) {
		return true; /* in doubt */
	}
	bool held = false;
	struct dirent *de;
	while (!held && (de = readdir(d)) != NULL) {
		size_t n = strlen(de->d_name);
		if (de->d_name[0] != '.' && n > 5 && strcmp(de->d_name + n - 5, ".lock") == 0 &&
		    owner_of(de->d_name, stem) == pid) {
			held = lock_held(dirfd(d), de->d_name);
		}
	}
	closedir(d);
	return held;
}

int
zinf_scratch_reclaim(const char *dir, const char *stem, zinf_scratch_cb cb, void *ctx)
{
	if (!dir || !name_ok(stem)) {
		return ZINF_FAIL(-EINVAL, "scratch reclaim: a directory and a stem of letters, "
					  "digits, '-', '_' and '.' are needed");
	}
	DIR *d = opendir(dir);
	if (!d) {
		int e = -errno;
		return ZINF_FAIL(e, "scratch reclaim: cannot list %s: %s", dir, zinf_strerror(e));
	}
	int removed = 0;
	long self = (long)getpid();
	size_t dl = strlen(dir);
	char *path = zc_malloc(dl + 2 + 256);
	if (!path) {
		closedir(d);
		return ZINF_FAIL(-ENOMEM, "scratch reclaim in %s: out of memory", dir);
	}
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		long pid = owner_of(de->d_name, stem);
		if (pid == 0 || pid == self) {
			continue;
		}
		snprintf(path, dl + 2 + 256, "%s/%s", dir, de->d_name);
		int status = 1;
		if (!pid_runs(pid) && !owner_holds_lock(dir, stem, pid)) {
			status = rm_at(dirfd(d), de->d_name, SCRATCH_DEPTH);
			removed += status == 0;
		}
		if (cb) {
			cb(ctx, path, pid, status);
		}
	}
	closedir(d);
	zc_free(path);
	return removed;
}
