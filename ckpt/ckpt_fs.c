/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ckpt/ckpt_fs.c: the file-system half of a checkpoint save, load and export: tags, the
 * directory lock, a checkpoint's own file opened in its directory (ckpt_open_in: no symbolic
 * link followed, regular files only), fsync of files and directories, whole writes, a file
 * written under a temporary name and renamed into place (ckpt_atomic_open/close), the atomic
 * publication (rename, RENAME_EXCHANGE, `latest`), removal of a temporary directory, and the
 * streaming writer that puts a rank's state files on disk through the I/O engine (aligned
 * double buffers, O_DIRECT where the file system has it, CRC32C as the bytes go). Not here:
 * what the files hold (ckpt_save.c).
 */
#include <dirent.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/opts.h"
#include "ckpt/ckpt_fs.h"
#include "zinf/blocks/swap.h"

void
ckpt_join(char *out, const char *dir, const char *fmt, ...)
{
	int n = snprintf(out, CKPT_PATH, "%s/", dir);
	va_list ap;
	va_start(ap, fmt);
	if (n >= 0 && n < CKPT_PATH) {
		vsnprintf(out + n, (size_t)(CKPT_PATH - n), fmt, ap);
	}
	va_end(ap);
}

char *
ckpt_join_alloc(const char *dir, const char *name)
{
	size_t dl = strlen(dir), nl = strlen(name);
	char *p = zc_malloc(dl + nl + 2);
	if (p) {
		memcpy(p, dir, dl);
		p[dl] = '/';
		memcpy(p + dl + 1, name, nl + 1);
	}
	return p;
}

bool
ckpt_tag_ok(const char *tag)
{
	size_t n = tag ? strlen(tag) : 0;
	if (n == 0 || n > ZINF_CKPT_MAX_TAG || tag[0] == '.' || strcmp(tag, "latest") == 0) {
		return false;
	}
	for (size_t i = 0; i < n; i++) {
		char c = tag[i];
		bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
			  (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
		if (!ok) {
			return false;
		}
	}
	return true;
}

static const char *
file_kind(mode_t m)
{
	return S_ISDIR(m)    ? "a directory"
	       : S_ISREG(m)  ? "a regular file"
	       : S_ISFIFO(m) ? "a FIFO"
	       : S_ISSOCK(m) ? "a socket"
	       : S_ISCHR(m)  ? "a character device"
	       : S_ISBLK(m)  ? "a block device"
			     : "a special file";
}

int
ckpt_open_in(int dirfd, const char *dirpath, const char *name, bool dir, struct stat *st)
{
	if (!name[0] || strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, "..")) {
		return ZINF_FAIL(-EINVAL, "checkpoint: %s/%s: not a name in that directory",
				 dirpath, name);
	}
	int fd = openat(dirfd, name,
			O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | (dir ? O_DIRECTORY : 0));
	struct stat s;
	if (fd < 0) {
		int e = errno;
		if (e == ENOENT || e == EMFILE || e == ENFILE) {
			return -e; /* the caller's to say */
		}
		/* O_NOFOLLOW on a link: ELOOP (ENOTDIR with O_DIRECTORY on some kernels) */
		if ((e == ELOOP || e == ENOTDIR) &&
		    fstatat(dirfd, name, &s, AT_SYMLINK_NOFOLLOW) == 0) {
			if (S_ISLNK(s.st_mode)) {
				return ZINF_FAIL(
					-EBADMSG,
					"%s/%s: a symbolic link, not followed: a checkpoint's "
					"files are its own, in its directory",
					dirpath, name);
			}
			return ZINF_FAIL(-EBADMSG, "%s/%s: %s, expected %s", dirpath, name,
					 file_kind(s.st_mode),
					 dir ? "a directory" : "a regular file");
		}
		return ZINF_FAIL(-e, "%s/%s: open: %s", dirpath, name, zinf_strerror(-e));
	}
	if (fstat(fd, &s) != 0) {
		int e = errno;
		close(fd);
		return ZINF_FAIL(-e, "%s/%s: fstat: %s", dirpath, name, zinf_strerror(-e));
	}
	if (dir ? !S_ISDIR(s.st_mode) : !S_ISREG(s.st_mode)) {
		close(fd);
		return ZINF_FAIL(-EBADMSG, "%s/%s: %s, expected %s", dirpath, name,
				 file_kind(s.st_mode), dir ? "a directory" : "a regular file");
	}
	int fl = fcntl(fd, F_GETFL);
	if (fl >= 0) {
		(void)fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
	}
	if (st) {
		*st = s;
	}
	return fd;
}

int
ckpt_fsync_path(const char *path, bool dir)
{
	int fd = open(path, (dir ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		int err = -errno;
		return ZINF_FAIL(err, "checkpoint: opening %s to fsync it: %s", path,
				 zinf_strerror(err));
	}
	int ret = 0;
	/* EINVAL on a directory: a file system that cannot sync one (its entries are as durable
	 * as it makes them); a file's EINVAL stays an error */
	if (fsync(fd) != 0 && !(dir && errno == EINVAL)) {
		ret = -errno;
		ZINF_FAIL(ret, "checkpoint: fsync of %s: %s", path, zinf_strerror(ret));
	}
	close(fd);
	return ret;
}

/* path and what it holds: files, links (not followed) and subdirectories, at most `depth`
 * levels deep. A path that does not fit CKPT_PATH is refused, never cut. */
static int
rm_tree(const char *path, int depth)
{
	struct stat st;
	if (lstat(path, &st) != 0) {
		return errno == ENOENT ? 0
				       : ZINF_FAIL(-errno, "checkpoint: removing %s: %s", path,
						   zinf_strerror(-errno));
	}
	if (!S_ISDIR(st.st_mode)) {
		if (unlink(path) != 0 && errno != ENOENT) {
			return ZINF_FAIL(-errno, "checkpoint: removing %s: %s", path,
					 zinf_strerror(-errno));
		}
		return 0;
	}
	if (depth <= 0) {
		return ZINF_FAIL(-ELOOP, "checkpoint: removing %s: too deep", path);
	}
	DIR *d = opendir(path);
	if (!d) {
		return errno == ENOENT ? 0 : ZINF_FAIL(-errno, "checkpoint: opening %s", path);
	}
	int ret = 0;
	struct dirent *de;
	char *p = zc_malloc(CKPT_PATH);
	if (!p) {
		closedir(d);
		return -ENOMEM;
	}
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) {
			continue;
		}
		int n = snprintf(p, CKPT_PATH, "%s/%s", path, de->d_name);
		int r = n < 0 || n >= CKPT_PATH
				? ZINF_FAIL(-ENAMETOOLONG, "checkpoint: removing %s/%s: too long",
					    path, de->d_name)
				: rm_tree(p, depth - 1);
		ret = ret ? ret : r;
	}
	closedir(d);
	zc_free(p);
	if (rmdir(path) != 0 && errno != ENOENT && !ret) {
		ret = ZINF_FAIL(-errno, "checkpoint: removing %s: %s", path, zinf_strerror(-errno));
	}
	return ret;
}

/* A checkpoint directory swapped out or left by a dead save: whatever it holds (a trainer may
 * have put subdirectories in a tag's directory), or a file of that name. */
int
ckpt_rm_dir(const char *path)
{
	return rm_tree(path, 32);
}

int
ckpt_fsync_parent(const char *path)
{
	char parent[CKPT_PATH];
	snprintf(parent, sizeof(parent), "%s", path);
	size_t n = strlen(parent);
	while (n > 1 && parent[n - 1] == '/') {
		parent[--n] = '\0';
	}
	char *slash = strrchr(parent, '/');
	if (!slash) {
		snprintf(parent, sizeof(parent), ".");
	} else {
		slash[slash == parent ? 1 : 0] = '\0';
	}
	return ckpt_fsync_path(parent, true);
}

int
ckpt_clean_tmp(const char *dir)
{
	DIR *d = opendir(dir);
	if (!d) {
		return ZINF_FAIL(-errno, "checkpoint: opening %s: %s", dir, zinf_strerror(-errno));
	}
	int ret = 0;
	struct dirent *de;
	char p[CKPT_PATH];
	while ((de = readdir(d)) && !ret) {
		size_t n = strlen(de->d_name);
		if (de->d_name[0] == '.' && n > 5 && strcmp(de->d_name + n - 4, ".tmp") == 0 &&
		    strcmp(de->d_name, ".latest.tmp") != 0) {
			ckpt_join(p, dir, "%s", de->d_name);
			ret = ckpt_rm_dir(p);
		}
	}
	closedir(d);
	return ret;
}

int
ckpt_lock(const char *dir, int *fd_out)
{
	char p[CKPT_PATH];
	ckpt_join(p, dir, ".zinf-ckpt.lock");
	int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
	if (fd < 0) {
		int err = -errno;
		return ZINF_FAIL(err, "checkpoint: opening the lock %s: %s", p, zinf_strerror(err));
	}
	if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
		int err = errno;
		char pid[32] = "?";
		ssize_t n = pread(fd, pid, sizeof(pid) - 1, 0);
		pid[n > 0 ? n : 1] = '\0';
		pid[strcspn(pid, "\n")] = '\0';
		close(fd);
		if (err == EWOULDBLOCK) {
			return ZINF_FAIL(-EBUSY,
					 "checkpoint: %s is being saved into by another process "
					 "(pid %s holds %s); saves into one directory never race: "
					 "wait for it or use another directory",
					 dir, pid, p);
		}
		return ZINF_FAIL(-err, "checkpoint: locking %s: %s", p, zinf_strerror(-err));
	}
	char pid[32];
	int n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
	if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n) {
		/* the pid is for messages only */
	}
	*fd_out = fd;
	return 0;
}

void
ckpt_unlock(int fd)
{
	if (fd >= 0) {
		if (ftruncate(fd, 0) != 0) {
			/* the pid is for messages only */
		}
		flock(fd, LOCK_UN);
		close(fd);
	}
}

int
ckpt_write_full(int fd, const char *path, const void *data, size_t len)
{
	const char *s = data;
	size_t done = 0;
	while (done < len) {
		ssize_t w = write(fd, s + done, len - done);
		if (w < 0 && errno == EINTR) {
			continue;
		}
		if (w <= 0) {
			int ret = w < 0 ? -errno : -EIO;
			return ZINF_FAIL(ret, "checkpoint: writing %s at %zu of %zu bytes: %s",
					 path, done, len, zinf_strerror(ret));
		}
		done += (size_t)w;
	}
	return 0;
}

int
ckpt_write_small(const char *path, const void *data, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		int err = -errno;
		return ZINF_FAIL(err, "checkpoint: creating %s: %s", path, zinf_strerror(err));
	}
	int ret = ckpt_write_full(fd, path, data, len);
	if (!ret && fsync(fd) != 0) {
		ret = -errno;
		ZINF_FAIL(ret, "checkpoint: fsync of %s: %s", path, zinf_strerror(ret));
	}
	close(fd);
	return ret;
}

int
ckpt_atomic_open(const char *path, char tmp[CKPT_PATH], int *fd)
{
	const char *slash = strrchr(path, '/');
	int dl = slash ? (int)(slash - path + 1) : 0;
	int n = snprintf(tmp, CKPT_PATH, "%.*s.%s.tmp%ld", dl, path, path + dl, (long)getpid());
	if (n < 0 || n >= CKPT_PATH) {
		return ZINF_FAIL(-ENAMETOOLONG, "checkpoint: %s: path too long for its temporary",
				 path);
	}
	*fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (*fd < 0) {
		int err = -errno;
		return ZINF_FAIL(err, "checkpoint: creating %s: %s", tmp, zinf_strerror(err));
	}
	return 0;
}

int
ckpt_atomic_close(int fd, const char *tmp, const char *path, int rc)
{
	if (!rc && fsync(fd) != 0) {
		rc = -errno;
		ZINF_FAIL(rc, "checkpoint: fsync of %s: %s", tmp, zinf_strerror(rc));
	}
	if (close(fd) != 0 && !rc) {
		rc = -errno;
		ZINF_FAIL(rc, "checkpoint: closing %s: %s", tmp, zinf_strerror(rc));
	}
	if (!rc && rename(tmp, path) != 0) {
		rc = -errno;
		ZINF_FAIL(rc, "checkpoint: renaming %s to %s: %s", tmp, path, zinf_strerror(rc));
	}
	if (rc) {
		unlink(tmp);
		return rc;
	}
	return ckpt_fsync_parent(path);
}

int
ckpt_publish(const char *dir, const char *tmp, const struct ckpt_progress *pr)
{
	const char *tag = pr->tag;
	char final[CKPT_PATH], p[CKPT_PATH], lt[CKPT_PATH];
	ckpt_join(final, dir, "%s", tag);
	int ret = ckpt_fsync_path(tmp, true);
	if (ret) {
		return ret;
	}
	ckpt_point(pr, "tmp_synced");
	/* a new tag appears whole; an existing one is swapped out in one step, then removed */
	int rc = renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_NOREPLACE);
	int err = rc ? errno : 0;
	struct stat st;
	if (rc && (err == EINVAL || err == ENOSYS)) {
		/* no RENAME_NOREPLACE here (the NFS client, Lustre): a new tag is renamed in
		   plainly, the lock keeping other savers out */
		if (lstat(final, &st) == 0) {
			err = EEXIST;
		} else if (rename(tmp, final) != 0) {
			err = errno;
		} else {
			rc = err = 0;
		}
	}
	if (rc) {
		if (err != EEXIST) {
			return ZINF_FAIL(-err, "checkpoint: renaming %s to %s: %s", tmp, final,
					 zinf_strerror(-err));
		}
		if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) != 0) {
			err = errno;
			if (err == EINVAL || err == ENOSYS) {
				return ZINF_FAIL(
					-EOPNOTSUPP,
					"checkpoint: %s exists and this file system cannot "
					"swap a directory in one step (no RENAME_EXCHANGE), "
					"so it is kept: save under a new tag",
					final);
			}
			return ZINF_FAIL(-err, "checkpoint: exchanging %s with %s: %s", tmp, final,
					 zinf_strerror(-err));
		}
		ckpt_point(pr, "swapped");
		if ((ret = ckpt_fsync_path(dir, true))) {
			return ret;
		}
		(void)ckpt_rm_dir(
			tmp); /* the previous TAG: a leftover is removed by the next save */
	}
	if ((ret = ckpt_fsync_path(dir, true))) {
		return ret;
	}
	ckpt_point(pr, "renamed");
	ckpt_join(p, dir, ".latest.tmp");
	ckpt_join(lt, dir, "latest");
	char line[ZINF_CKPT_MAX_TAG + 2];
	int n = snprintf(line, sizeof(line), "%s\n", tag);
	if ((ret = ckpt_write_small(p, line, (size_t)n))) {
		return ret;
	}
	ckpt_point(pr, "latest_tmp");
	if (rename(p, lt) != 0) {
		return ZINF_FAIL(-errno, "checkpoint: renaming %s to %s: %s", p, lt,
				 zinf_strerror(-errno));
	}
	if (!(ret = ckpt_fsync_path(dir, true))) {
		ckpt_point(pr, "latest");
	}
	return ret;
}

/* ---- the streaming writer ------------------------------------------------------------------ */

int
ckpt_writer_open(struct ckpt_writer *w, struct zinf_io *io, const char *path)
{
	memset(w, 0, sizeof(*w));
	w->io = io;
	snprintf(w->path, sizeof(w->path), "%s", path);
	int ret = zinf_io_file_open(
		io, path,
		ZINF_IO_RDWR | ZINF_IO_CREATE | ZINF_IO_TRUNC | ZINF_IO_DIRECT_OR_BUFFERED, &w->f);
	if (ret) {
		return ret;
	}
	w->align = zinf_io_file_align(w->f);
	if (w->align < 4096) {
		w->align = 4096;
	}
	for (int i = 0; i < CKPT_NBUF; i++) {
		w->buf[i] = zinf_alloc_huge(CKPT_WBUF);
		if (!w->buf[i]) {
			ckpt_writer_close(w);
			return ZINF_FAIL(-ENOMEM, "checkpoint: %s: out of memory for its buffers",
					 path);
		}
	}
	return 0;
}

/* Write buffer `cur` (fill bytes, padded with zeros to the alignment) at w->off. */
static int
flush_cur(struct ckpt_writer *w)
{
	int c = w->cur;
	size_t len = w->fill;
	if (len == 0) {
		return 0;
	}
	size_t padded = (len + w->align - 1) / w->align * w->align;
	memset(w->buf[c] + len, 0, padded - len);
	int ret = zinf_io_write_async(w->io, &w->req[c], w->f, w->buf[c], padded, w->off);
	if (ret) {
		return ret;
	}
	w->busy[c] = true;
	w->off += len;
	w->fill = 0;
	w->cur = (w->cur + 1) % CKPT_NBUF;
	if (w->busy[w->cur]) { /* the next buffer's write must be done before it is refilled */
		w->busy[w->cur] = false;
		ret = zinf_io_wait(w->io, &w->req[w->cur]);
	}
	return ret;
}

int
ckpt_writer_put(struct ckpt_writer *w, const void *data, size_t len)
{
	const char *s = data;
	w->crc = zinf_crc32c(w->crc, data, len);
	w->bytes += len;
	while (len > 0) {
		size_t n = ZINF_MIN(len, (size_t)CKPT_WBUF - w->fill);
		memcpy(w->buf[w->cur] + w->fill, s, n);
		w->fill += n;
		s += n;
		len -= n;
		if (w->fill == CKPT_WBUF) {
			int ret = flush_cur(w);
			if (ret) {
				return ZINF_FAIL(ret,
						 "checkpoint: writing %s at byte %" PRIu64 ": %s",
						 w->path, w->off, zinf_strerror(ret));
			}
		}
	}
	return 0;
}

int
ckpt_writer_finish(struct ckpt_writer *w)
{
	int ret = flush_cur(w);
	for (int i = 0; i < CKPT_NBUF; i++) {
		if (w->busy[i]) {
			w->busy[i] = false;
			int r = zinf_io_wait(w->io, &w->req[i]);
			ret = ret ? ret : r;
		}
	}
	int fd = zinf_io_file_fd(w->f);
	if (!ret && ftruncate(fd, (off_t)w->bytes) != 0) {
		ret = -errno;
	}
	if (!ret && fsync(fd) != 0) {
		ret = -errno;
	}
	if (ret) {
		return ZINF_FAIL(ret, "checkpoint: writing %s (%" PRIu64 " bytes): %s", w->path,
				 w->bytes, zinf_strerror(ret));
	}
	return 0;
}

void
ckpt_writer_close(struct ckpt_writer *w)
{
	for (int i = 0; i < CKPT_NBUF; i++) {
		if (w->busy[i]) {
			(void)zinf_io_wait(w->io, &w->req[i]);
			w->busy[i] = false;
		}
		zinf_free_huge(w->buf[i], CKPT_WBUF);
		w->buf[i] = NULL;
	}
	if (w->f) {
		zinf_io_file_close(w->io, w->f);
		w->f = NULL;
	}
}
