/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvme/scratch.c: scratch that names its owner (zinf/blocks/swap.h). Every name starts with
 * `<stem>-<host>-<pid>-` (zinf_scratch_prefix: this host's name made safe, this pid). A scratch
 * directory is made under a lock file held for its whole life (the lock first, then the
 * directory; the directory removed first, then the lock), and zinf_scratch_reclaim removes what
 * owners on this host that are gone left in a shared directory: only the exact shapes the library
 * makes (a scratch directory and its lock; a swap space's files, probe and lock), and only under
 * the entry's own lock file, taken while the entry is removed. Used by the `zinf` command's
 * benchmarks (their swap files, prefix `<stem>-<host>-<pid>`) and the example trainer (its scratch
 * directory under --scratch-parent).
 *
 * Not here: a swap space's leftovers of its own names, found at reserve (swap_owner.c), and the
 * lock taking itself (swap_lock_file, shared with the swap space).
 */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "nvme/swap_internal.h"

/* Deep enough for any scratch a zinf program makes; a deeper tree is left as it is. */
#define SCRATCH_DEPTH 16
/* A stem's or a tag's longest: with the host and the pid, a name stays within NAME_MAX (255). */
#define NAME_PART_MAX 64
/* "<stem>-<host>-<pid>" and its NUL */
#define SCRATCH_PREFIX_MAX (NAME_PART_MAX + ZINF_SCRATCH_HOST_MAX + 24)

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

static bool
stem_ok(const char *stem)
{
	return name_ok(stem) && strlen(stem) <= NAME_PART_MAX;
}

/* ---- names: <stem>-<host>-<pid>- ----------------------------------------------------------- */

static bool
host_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '.';
}

int
zinf_scratch_host(char *buf, size_t len)
{
	if (!buf) {
		return ZINF_FAIL(-EINVAL, "zinf_scratch_host: NULL buffer");
	}
	char raw[256] = "";
	if (gethostname(raw, sizeof(raw) - 1) != 0 || !raw[0]) {
		snprintf(raw, sizeof(raw), "localhost");
	}
	raw[sizeof(raw) - 1] = '\0';
	char h[ZINF_SCRATCH_HOST_MAX + 1];
	size_t n = strlen(raw);
	/* '-' becomes '_' too: it separates the name's parts */
	for (size_t i = 0; i < n && i < ZINF_SCRATCH_HOST_MAX; i++) {
		h[i] = host_char(raw[i]) ? raw[i] : '_';
	}
	if (n > ZINF_SCRATCH_HOST_MAX) {
		/* a longer name: its first bytes, then a hash of the whole (FNV-1a), so that two
		   names alike in their first ZINF_SCRATCH_HOST_MAX bytes still differ */
		uint32_t x = 2166136261u;
		for (size_t i = 0; i < n; i++) {
			x = (x ^ (unsigned char)raw[i]) * 16777619u;
		}
		n = ZINF_SCRATCH_HOST_MAX;
		snprintf(h + n - 9, 10, "_%08x", x);
	}
	h[n] = '\0';
	if (n + 1 > len) {
		return ZINF_FAIL(-ENAMETOOLONG, "zinf_scratch_host: %zu bytes needed, %zu given",
				 n + 1, len);
	}
	memcpy(buf, h, n + 1);
	return (int)n;
}

int
zinf_scratch_prefix(const char *stem, char *buf, size_t len)
{
	char host[ZINF_SCRATCH_HOST_MAX + 1];
	if (!stem_ok(stem) || !buf) {
		return ZINF_FAIL(-EINVAL,
				 "zinf_scratch_prefix: a buffer and a stem of letters, "
				 "digits, '-', '_' and '.' (at most %d bytes) are needed",
				 NAME_PART_MAX);
	}
	(void)zinf_scratch_host(host, sizeof(host));
	int n = snprintf(buf, len, "%s-%s-%ld", stem, host, (long)getpid());
	if (n < 0 || (size_t)n >= len) {
		if (len) {
			buf[0] = '\0';
		}
		return ZINF_FAIL(-ENAMETOOLONG, "zinf_scratch_prefix: %d bytes needed, %zu given",
				 n + 1, len);
	}
	return n;
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
	if (!parent || !*parent || !stem_ok(stem) || !name_ok(tag) || strlen(tag) > NAME_PART_MAX ||
	    !out) {
		return ZINF_FAIL(-EINVAL,
				 "scratch directory: a parent, and a stem and a tag of "
				 "letters, digits, '-', '_' and '.' (at most %d bytes each), "
				 "are needed",
				 NAME_PART_MAX);
	}
	struct zinf_scratch_dir *d = zc_calloc(1, sizeof(*d));
	if (!d) {
		return ZINF_FAIL(-ENOMEM, "scratch directory under %s: out of memory", parent);
	}
	d->lock_fd = -1;
	long pid = (long)getpid(), holder;
	char prefix[SCRATCH_PREFIX_MAX];
	(void)zinf_scratch_prefix(stem, prefix, sizeof(prefix)); /* fits: the stem was checked */
	if (asprintf(&d->lock, "%s/%s-%s.lock", parent, prefix, tag) < 0) {
		d->lock = NULL;
		zinf_scratch_dir_destroy(d);
		return ZINF_FAIL(-ENOMEM, "scratch directory under %s: out of memory", parent);
	}
	if (asprintf(&d->path, "%s/%s-%s-XXXXXX", parent, prefix, tag) < 0) {
		d->path = NULL;
		zinf_scratch_dir_destroy(d);
		return ZINF_FAIL(-ENOMEM, "scratch directory under %s: out of memory", parent);
	}
	/* the lock before the directory: a reclaim that sees the directory finds it held */
	int ret = swap_lock_file(d->lock, &d->lock_fd, &holder);
	if (ret == -EWOULDBLOCK && holder == pid) {
		ret = ZINF_FAIL(-EBUSY,
				"scratch directory: the lock %s: it names this process's pid: this "
				"process holds it already (one directory per tag), or a reclaim is "
				"removing what a gone owner with the same pid left (try again)",
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

/* An entry of the library's shapes, of this host and another pid. */
struct entry {
	char *name; /* in the directory */
	char *lock; /* the name of the lock that guards it (its own for a lock file) */
	long pid;
	bool is_lock;
};

static bool
all_digits(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9') {
			return false;
		}
	}
	return n > 0;
}

static bool
alnum(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

/* s[0, n) made of name_ok's characters, non-empty */
static bool
part_ok(const char *s, size_t n)
{
	char buf[256];
	if (n == 0 || n >= sizeof(buf)) {
		return false;
	}
	memcpy(buf, s, n);
	buf[n] = '\0';
	return name_ok(buf);
}

/* A swap space's "<sub>-r<rank>" or "r<rank>" (its prefix's tail past "<stem>-<host>-<pid>-", and
 * the rank): s[0, n). */
static bool
rank_part(const char *s, size_t n)
{
	size_t r = n;
	while (r > 0 && s[r - 1] >= '0' && s[r - 1] <= '9') {
		r--;
	}
	if (r == n || r == 0 || s[r - 1] != 'r') {
		return false;
	}
	r--; /* at the 'r' */
	return r == 0 || (r >= 2 && s[r - 1] == '-' && part_ok(s, r - 1));
}

/* s[0, n) ends in ".<digits>": where that '.' is, or 0 */
static size_t
dot_index(const char *s, size_t n)
{
	size_t k = n;
	while (k > 0 && s[k - 1] >= '0' && s[k - 1] <= '9') {
		k--;
	}
	return k < n && k > 1 && s[k - 1] == '.' ? k - 1 : 0;
}

static bool
ends_with(const char *s, size_t n, const char *suffix)
{
	size_t m = strlen(suffix);
	return n > m && memcmp(s + n - m, suffix, m) == 0;
}

/*
 * The lock guarding `rest` (a name's part past "<stem>-<host>-<pid>-"), written as its part past
 * that prefix into lock (256 bytes), for the library's shapes only:
 *   directory "<tag>-XXXXXX" (mkdtemp's letters and digits)   lock "<tag>.lock"
 *   file "<L>.lock"                                          itself (*is_lock)
 *   file "<A>-<kind>.<d>.swp", A = [<sub>-]r<rank>           lock "<A>.<d>.lock"
 *   hidden file ".<prefix>-<A>.<d>.probe" (hidden set)       lock "<A>.<d>.lock"
 * Anything else is not the library's: false.
 */
static bool
shape_lock(const char *rest, bool dir, bool hidden, char lock[256], bool *is_lock)
{
	size_t n = strlen(rest);
	*is_lock = false;
	if (dir) {
		if (hidden || n < 8 || rest[n - 7] != '-' || !part_ok(rest, n - 7)) {
			return false;
		}
		for (size_t i = n - 6; i < n; i++) {
			if (!alnum(rest[i])) {
				return false;
			}
		}
		return snprintf(lock, 256, "%.*s.lock", (int)(n - 7), rest) < 256;
	}
	if (!hidden && ends_with(rest, n, ".lock")) {
		*is_lock = part_ok(rest, n - 5);
		return *is_lock && snprintf(lock, 256, "%s", rest) < 256;
	}
	const char *ext = hidden ? ".probe" : ".swp";
	if (!ends_with(rest, n, ext)) {
		return false;
	}
	size_t q = n - strlen(ext), dot = dot_index(rest, q); /* rest[dot, q) = ".<d>" */
	if (!dot) {
		return false;
	}
	size_t a = dot; /* A = rest[0, a) */
	if (!hidden) {
		/* "<A>-<kind>": the kind has no '-' */
		const char *dash = memrchr(rest, '-', dot);
		char kind[SWAP_KIND_MAX + 1];
		size_t kl = dash ? dot - (size_t)(dash + 1 - rest) : 0;
		if (!dash || kl == 0 || kl > SWAP_KIND_MAX) {
			return false;
		}
		memcpy(kind, dash + 1, kl);
		kind[kl] = '\0';
		if (!swap_kind_name_ok(kind)) {
			return false;
		}
		a = (size_t)(dash - rest);
	}
	return rank_part(rest, a) &&
	       snprintf(lock, 256, "%.*s%.*s.lock", (int)a, rest, (int)(q - dot), rest + dot) < 256;
}

/*
 * Whether `name` is of the library's shapes for `stem`: "<stem>-<host>-<pid>-<rest>" (a leading
 * '.' for a probe), host of [A-Za-z0-9._], pid > 0. Sets host (ZINF_SCRATCH_HOST_MAX + 1 bytes),
 * *pid, lock (the full name of the lock that guards it) and *is_lock.
 */
static bool
parse_entry(const char *name, const char *stem, bool dir, char *host, long *pid, char lock[256],
	    bool *is_lock)
{
	bool hidden = name[0] == '.';
	const char *p = name + hidden;
	size_t sl = strlen(stem);
	if (strncmp(p, stem, sl) != 0 || p[sl] != '-') {
		return false;
	}
	p += sl + 1;
	size_t hl = 0;
	while (p[hl] && (host_char(p[hl]) || p[hl] == '_')) {
		hl++;
	}
	if (hl == 0 || hl > ZINF_SCRATCH_HOST_MAX || p[hl] != '-') {
		return false;
	}
	memcpy(host, p, hl);
	host[hl] = '\0';
	p += hl + 1;
	size_t dl = 0;
	while (p[dl] >= '0' && p[dl] <= '9') {
		dl++;
	}
	if (!all_digits(p, dl) || dl > 10 || p[dl] != '-' || p[0] == '0') {
		return false;
	}
	*pid = strtol(p, NULL, 10);
	const char *rest = p + dl + 1;
	char tail[256];
	if (*pid <= 0 || !shape_lock(rest, dir, hidden, tail, is_lock)) {
		return false;
	}
	size_t pre = (size_t)(rest - (name + hidden)); /* "<stem>-<host>-<pid>-" */
	return snprintf(lock, 256, "%.*s%s", (int)pre, name + hidden, tail) < 256;
}

static bool
pid_runs(long pid)
{
	return kill((pid_t)pid, 0) == 0 || errno != ESRCH;
}

/*
 * Take the lock file `name` in dfd for as long as its entries are removed: its descriptor (the
 * flock held), -ENOENT when there is no such file, or -EBUSY when it is held, cannot be opened
 * or locked for another reason (permissions; a file system without flock), is not a regular
 * file, or was replaced meanwhile: when in doubt, nothing is removed. Opened for writing, so that
 * a network file system that maps flock to byte-range locks (NFS) can take an exclusive one.
 */
static int
take_lock(int dfd, const char *name)
{
	int fd = openat(dfd, name, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0) {
		return errno == ENOENT ? -ENOENT : -EBUSY;
	}
	struct stat a, b;
	if (flock(fd, LOCK_EX | LOCK_NB) != 0 || fstat(fd, &a) != 0 || !S_ISREG(a.st_mode) ||
	    fstatat(dfd, name, &b, AT_SYMLINK_NOFOLLOW) != 0 || a.st_ino != b.st_ino ||
	    a.st_dev != b.st_dev) {
		close(fd); /* lets go of it if we took it */
		return -EBUSY;
	}
	return fd;
}

static int
entry_cmp(const void *x, const void *y)
{
	const struct entry *a = x, *b = y;
	int d = strcmp(a->lock, b->lock);
	return d ? d : (a->is_lock - b->is_lock); /* the lock after what it guards */
}

struct reclaim {
	const char *dir;
	int dfd;
	zinf_scratch_cb cb;
	void *ctx;
	char *path; /* for the callback: dir/name */
	size_t path_len;
	int removed;
};

static void
tell(struct reclaim *rc, const char *name, long pid, int status)
{
	if (rc->cb) {
		snprintf(rc->path, rc->path_len, "%s/%s", rc->dir, name);
		rc->cb(rc->ctx, rc->path, pid, status);
	}
}

/* One lock's entries e[0, n) (the lock itself last, when listed): kept or removed under it. */
static void
reclaim_group(struct reclaim *rc, struct entry *e, size_t n)
{
	int lfd = pid_runs(e[0].pid) ? -EBUSY : take_lock(rc->dfd, e[0].lock);
	if (lfd < 0) {
		int fate = lfd == -ENOENT ? ZINF_SCRATCH_KEPT_NO_LOCK : ZINF_SCRATCH_KEPT_LIVE;
		for (size_t i = 0; i < n; i++) {
			tell(rc, e[i].name, e[i].pid, fate);
		}
		return;
	}
	int first = 0;
	for (size_t i = 0; i < n; i++) {
		if (e[i].is_lock) {
			continue;
		}
		int r = rm_at(rc->dfd, e[i].name, SCRATCH_DEPTH);
		rc->removed += r == 0;
		first = first ? first : r;
		tell(rc, e[i].name, e[i].pid, r);
	}
	/* unlinked while still held (as its owner would): a newcomer then locks a fresh file.
	   Kept while anything it guards is left, so that the next reclaim tries again. */
	int r = first ? first : unlinkat(rc->dfd, e[0].lock, 0) == 0 ? 0 : -errno;
	close(lfd);
	if (e[n - 1].is_lock) {
		rc->removed += r == 0;
		tell(rc, e[n - 1].name, e[n - 1].pid, r);
	}
}

/* The entries of the library's shapes in d: other hosts' told of at once (and left), this
 * process's skipped, the rest into *out (*n of them). 0 or -ENOMEM. */
static int
list_entries(struct reclaim *rc, DIR *d, const char *stem, struct entry **out, size_t *n)
{
	char me[ZINF_SCRATCH_HOST_MAX + 1], host[ZINF_SCRATCH_HOST_MAX + 1], lock[256];
	long self = (long)getpid(), pid;
	size_t cap = 0;
	bool is_lock;
	(void)zinf_scratch_host(me, sizeof(me));
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		struct stat st;
		unsigned char t = de->d_type;
		if (t == DT_UNKNOWN &&
		    fstatat(rc->dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0) {
			t = S_ISDIR(st.st_mode)	  ? DT_DIR
			    : S_ISREG(st.st_mode) ? DT_REG
						  : DT_UNKNOWN;
		}
		if ((t != DT_DIR && t != DT_REG) ||
		    !parse_entry(de->d_name, stem, t == DT_DIR, host, &pid, lock, &is_lock)) {
			continue; /* not the library's: not looked at further */
		}
		if (strcmp(host, me) != 0) {
			tell(rc, de->d_name, pid, ZINF_SCRATCH_KEPT_OTHER_HOST);
			continue;
		}
		if (pid == self) {
			continue;
		}
		if (*n == cap) {
			cap = cap ? 2 * cap : 16;
			struct entry *e = zc_calloc(cap, sizeof(*e));
			if (!e) {
				return -ENOMEM;
			}
			if (*n) {
				memcpy(e, *out, *n * sizeof(*e));
			}
			zc_free(*out);
			*out = e;
		}
		struct entry *e = &(*out)[*n];
		e->name = zc_strdup(de->d_name);
		e->lock = zc_strdup(lock);
		e->pid = pid;
		e->is_lock = is_lock;
		if (!e->name || !e->lock) {
			zc_free(e->name);
			zc_free(e->lock);
			return -ENOMEM;
		}
		(*n)++;
	}
	return 0;
}

int
zinf_scratch_reclaim(const char *dir, const char *stem, zinf_scratch_cb cb, void *ctx)
{
	if (!dir || !stem_ok(stem)) {
		return ZINF_FAIL(-EINVAL,
				 "scratch reclaim: a directory and a stem of letters, "
				 "digits, '-', '_' and '.' (at most %d bytes) are needed",
				 NAME_PART_MAX);
	}
	DIR *d = opendir(dir);
	if (!d) {
		int e = -errno;
		return ZINF_FAIL(e, "scratch reclaim: cannot list %s: %s", dir, zinf_strerror(e));
	}
	struct reclaim rc = {.dir = dir, .dfd = dirfd(d), .cb = cb, .ctx = ctx};
	rc.path_len = strlen(dir) + 2 + 256;
	rc.path = zc_malloc(rc.path_len);
	struct entry *e = NULL;
	size_t n = 0;
	int ret = rc.path ? list_entries(&rc, d, stem, &e, &n) : -ENOMEM;
	if (ret == 0 && n > 0) {
		/* the locks are looked at after every entry was seen: an owner takes its lock
		   before it makes an entry, so one that appears meanwhile is never taken for dead
		 */
		qsort(e, n, sizeof(*e), entry_cmp);
		for (size_t i = 0, j; i < n; i = j) {
			for (j = i + 1; j < n && strcmp(e[j].lock, e[i].lock) == 0; j++) {
			}
			reclaim_group(&rc, e + i, j - i);
		}
	}
	for (size_t i = 0; i < n; i++) {
		zc_free(e[i].name);
		zc_free(e[i].lock);
	}
	zc_free(e);
	zc_free(rc.path);
	closedir(d);
	if (ret) {
		return ZINF_FAIL(ret, "scratch reclaim in %s: out of memory", dir);
	}
	return rc.removed;
}
