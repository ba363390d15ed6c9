/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/nvme/test_scratch.c: scratch that names its owner (nvme/scratch.c) on the scratch file
 * system: names `<stem>-<host>-<pid>-...` with this host made safe (checked against a sanitiser
 * of the test's own); a scratch directory made under its lock and removed with it; its lock held
 * by another process for a moment or for good; the reclaim of what dead owners on this host left
 * (a forked child that exited is a pid that is gone): their directories with all they hold,
 * their swap files and probes, and their lock files go, each only under its own lock; a live
 * pid's entries, a dead pid's entries whose lock is held (an owner in another pid namespace),
 * this process's own entries, entries of another host, look-alike names without their lock file
 * (a user's `<stem>-2024-results/`), other shapes and other names stay; a swap space of a killed
 * child reclaimed; symbolic links are not followed; bad arguments.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/test_util.h"
#include "zinf/blocks/io.h"
#include "zinf/blocks/swap.h"

#define STEM "zinf-test"

/* This host's part of the names, by the test's own reading of the rule (zinf/blocks/swap.h):
 * gethostname, every byte but letters, digits and '.' as '_'. */
static const char *
host(void)
{
	static char h[256];
	char raw[256] = "";
	cr_assert_eq(gethostname(raw, sizeof(raw) - 1), 0);
	if (!raw[0]) {
		snprintf(raw, sizeof(raw), "localhost");
	}
	cr_assert_leq(strlen(raw), 64, "a host name past 64 bytes: the test's rule is shorter");
	size_t i = 0;
	for (; raw[i]; i++) {
		char c = raw[i];
		h[i] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
				       c == '.'
			       ? c
			       : '_';
	}
	h[i] = '\0';
	return h;
}

/* A pid that is gone: a forked child that exited and was reaped. */
static long
dead_pid(void)
{
	pid_t p = fork();
	cr_assert(p >= 0);
	if (p == 0) {
		_exit(0);
	}
	cr_assert_eq(waitpid(p, NULL, 0), p);
	return (long)p;
}

/* "dir/<fmt...>" into path (4400 bytes). */
static void __attribute__((format(printf, 3, 0)))
vjoin(char *path, const char *dir, const char *fmt, va_list ap)
{
	char name[512];
	vsnprintf(name, sizeof(name), fmt, ap);
	snprintf(path, 4400, "%s/%s", dir, name);
}

static void __attribute__((format(printf, 2, 3))) touch(const char *dir, const char *fmt, ...)
{
	char path[4400];
	va_list ap;
	va_start(ap, fmt);
	vjoin(path, dir, fmt, ap);
	va_end(ap);
	int fd = open(path, O_RDWR | O_CREAT, 0600);
	cr_assert(fd >= 0, "%s", path);
	cr_assert_eq(write(fd, "x", 1), 1);
	close(fd);
}

static void __attribute__((format(printf, 2, 3))) make_dir(const char *dir, const char *fmt, ...)
{
	char path[4400];
	va_list ap;
	va_start(ap, fmt);
	vjoin(path, dir, fmt, ap);
	va_end(ap);
	cr_assert_eq(mkdir(path, 0700), 0, "%s", path);
}

static bool __attribute__((format(printf, 2, 3))) exists(const char *dir, const char *fmt, ...)
{
	char path[4400];
	struct stat st;
	va_list ap;
	va_start(ap, fmt);
	vjoin(path, dir, fmt, ap);
	va_end(ap);
	return lstat(path, &st) == 0;
}

/* What the callback heard. */
struct heard {
	int removed, live, no_lock, other_host, failed;
	long pid;
};

static void
hear(void *ctx, const char *path, int64_t pid, int status)
{
	struct heard *h = ctx;
	cr_assert(strstr(path, STEM), "%s", path);
	h->pid = (long)pid;
	switch (status) {
	case ZINF_SCRATCH_REMOVED:
		h->removed++;
		break;
	case ZINF_SCRATCH_KEPT_LIVE:
		h->live++;
		break;
	case ZINF_SCRATCH_KEPT_NO_LOCK:
		h->no_lock++;
		break;
	case ZINF_SCRATCH_KEPT_OTHER_HOST:
		h->other_host++;
		break;
	default:
		cr_assert_lt(status, 0, "status %d", status);
		h->failed++;
	}
}

Test(scratch, names_carry_this_host_and_pid)
{
	char buf[ZINF_SCRATCH_HOST_MAX + 88], want[ZINF_SCRATCH_HOST_MAX + 88];
	cr_assert_eq(zinf_scratch_host(buf, sizeof(buf)), (int)strlen(host()));
	cr_assert_str_eq(buf, host());
	cr_assert_null(strchr(buf, '-'));
	snprintf(want, sizeof(want), STEM "-%s-%ld", host(), (long)getpid());
	cr_assert_eq(zinf_scratch_prefix(STEM, buf, sizeof(buf)), (int)strlen(want));
	cr_assert_str_eq(buf, want);
}

Test(scratch, dir_made_under_its_lock_and_removed_with_it)
{
	char *parent = zt_mkdtemp(NULL);
	struct zinf_scratch_dir *d = NULL;
	cr_assert_eq(zinf_scratch_dir_create(parent, STEM, "r3", &d), 0, "%s", zinf_last_error());
	const char *p = zinf_scratch_dir_path(d);
	char want[4400];
	snprintf(want, sizeof(want), "%s/" STEM "-%s-%ld-r3-", parent, host(), (long)getpid());
	cr_assert(strncmp(p, want, strlen(want)) == 0 && strlen(p) == strlen(want) + 6,
		  "%s, expected %sXXXXXX", p, want);
	struct stat st;
	cr_assert(stat(p, &st) == 0 && S_ISDIR(st.st_mode));
	/* its lock: held (by this process, through another open file), the pid inside */
	char lock[4400], buf[32] = "";
	snprintf(lock, sizeof(lock), "%s/" STEM "-%s-%ld-r3.lock", parent, host(), (long)getpid());
	int fd = open(lock, O_RDWR);
	cr_assert(fd >= 0, "%s", lock);
	cr_assert(flock(fd, LOCK_EX | LOCK_NB) != 0, "the lock is not held");
	cr_assert_gt(read(fd, buf, sizeof(buf) - 1), 0);
	cr_assert_eq(strtol(buf, NULL, 10), (long)getpid());
	close(fd);
	/* a second directory of the same tag in this process is refused; another tag is fine */
	struct zinf_scratch_dir *d2 = NULL;
	cr_assert_eq(zinf_scratch_dir_create(parent, STEM, "r3", &d2), -EBUSY);
	cr_assert(strstr(zinf_last_error(), "this process holds it already"), "%s",
		  zinf_last_error());
	cr_assert_null(d2);
	cr_assert_eq(zinf_scratch_dir_create(parent, STEM, "r4", &d2), 0);
	/* what the owner put inside, a subdirectory too, goes with it */
	char sub[4400];
	snprintf(sub, sizeof(sub), "%s/sub", p);
	cr_assert_eq(mkdir(sub, 0700), 0);
	touch(sub, "f%d", 1);
	touch(p, "swap%d.swp", 2);
	/* a reclaim by this process leaves its own entries alone, and reports none of them */
	struct heard h = {0};
	cr_assert_eq(zinf_scratch_reclaim(parent, STEM, hear, &h), 0);
	cr_assert_eq(h.removed + h.live + h.no_lock + h.other_host + h.failed, 0);
	char path[4400];
	snprintf(path, sizeof(path), "%s", p);
	zinf_scratch_dir_destroy(d);
	zinf_scratch_dir_destroy(d2);
	cr_assert(stat(path, &st) != 0 && errno == ENOENT, "%s stayed", path);
	cr_assert(stat(lock, &st) != 0 && errno == ENOENT, "%s stayed", lock);
	zinf_scratch_dir_destroy(NULL);
	cr_assert_str_eq(zinf_scratch_dir_path(NULL), "");
	zt_rmtree(parent);
	free(parent);
}

/*
 * A child takes `lock` (an open file description of its own, as a reclaim's look at it in
 * another process), says so through fds[1], holds it for hold_us (0: until killed), and exits.
 */
static pid_t
hold_lock(const char *lock, int fds[2], useconds_t hold_us)
{
	cr_assert_eq(pipe(fds), 0);
	pid_t p = fork();
	cr_assert(p >= 0);
	if (p == 0) {
		int fd = open(lock, O_RDWR | O_CREAT, 0600);
		char c = 'x';
		if (fd < 0 || flock(fd, LOCK_EX | LOCK_NB) != 0 || write(fds[1], &c, 1) != 1) {
			_exit(1);
		}
		if (!hold_us) {
			alarm(60); /* gone by itself should the test fail before killing it */
			pause();
		}
		usleep(hold_us);
		_exit(0);
	}
	char c;
	cr_assert_eq(read(fds[0], &c, 1), 1);
	return p;
}

/*
 * Another process holding a scratch directory's lock for a moment (a reclaim looking at it) as
 * its owner takes it does not fail the owner: it tries again for a while. One that holds it for
 * good is -EBUSY naming another process, not "this process holds it already".
 */
Test(scratch, lock_held_by_another_process)
{
	char *parent = zt_mkdtemp(NULL);
	char lock[4400];
	snprintf(lock, sizeof(lock), "%s/" STEM "-%s-%ld-r0.lock", parent, host(), (long)getpid());
	int fds[2];
	pid_t p = hold_lock(lock, fds, 10000); /* 10 ms of the 200 ms the owner tries for */
	struct zinf_scratch_dir *d = NULL;
	int rc = zinf_scratch_dir_create(parent, STEM, "r0", &d);
	cr_expect_eq(rc, 0, "held for 10 ms by pid %ld: %d %s", (long)p, rc, zinf_last_error());
	zinf_scratch_dir_destroy(d);
	waitpid(p, NULL, 0);
	close(fds[0]);
	close(fds[1]);
	d = NULL;
	p = hold_lock(lock, fds, 0);
	rc = zinf_scratch_dir_create(parent, STEM, "r0", &d);
	const char *msg = zinf_last_error();
	cr_expect_eq(rc, -EBUSY);
	cr_expect_null(d);
	cr_expect(strstr(msg, "held by another process") && !strstr(msg, "this process"), "%s",
		  msg);
	kill(p, SIGKILL);
	waitpid(p, NULL, 0);
	close(fds[0]);
	close(fds[1]);
	zt_rmtree(parent);
	free(parent);
}

Test(scratch, bad_arguments)
{
	char *parent = zt_mkdtemp(NULL);
	struct zinf_scratch_dir *d = NULL;
	char long_stem[80];
	memset(long_stem, 'a', 65);
	long_stem[65] = '\0';
	cr_assert_eq(zinf_scratch_dir_create(NULL, STEM, "r0", &d), -EINVAL);
	cr_assert_eq(zinf_scratch_dir_create(parent, "a/b", "r0", &d), -EINVAL);
	cr_assert_eq(zinf_scratch_dir_create(parent, STEM, "", &d), -EINVAL);
	cr_assert_eq(zinf_scratch_dir_create(parent, STEM, "r0", NULL), -EINVAL);
	cr_assert_eq(zinf_scratch_dir_create(parent, long_stem, "r0", &d), -EINVAL);
	cr_assert_eq(zinf_scratch_dir_create(parent, STEM, long_stem, &d), -EINVAL);
	char missing[4400];
	snprintf(missing, sizeof(missing), "%s/missing", parent);
	cr_assert_eq(zinf_scratch_dir_create(missing, STEM, "r0", &d), -ENOENT);
	cr_assert(strstr(zinf_last_error(), missing), "%s", zinf_last_error());
	cr_assert_null(d);
	cr_assert_eq(zinf_scratch_reclaim(NULL, STEM, NULL, NULL), -EINVAL);
	cr_assert_eq(zinf_scratch_reclaim(parent, "", NULL, NULL), -EINVAL);
	cr_assert_eq(zinf_scratch_reclaim(parent, long_stem, NULL, NULL), -EINVAL);
	cr_assert_eq(zinf_scratch_reclaim(missing, STEM, NULL, NULL), -ENOENT);
	cr_assert(strstr(zinf_last_error(), missing), "%s", zinf_last_error());
	char small[8] = "x";
	cr_assert_eq(zinf_scratch_host(NULL, 64), -EINVAL);
	cr_assert_eq(zinf_scratch_prefix(STEM, small, sizeof(small)), -ENAMETOOLONG);
	cr_assert_str_eq(small, "");
	cr_assert_eq(zinf_scratch_prefix("a/b", small, sizeof(small)), -EINVAL);
	cr_assert_eq(zinf_scratch_host(small, 1), -ENAMETOOLONG);
	zt_rmtree(parent);
	free(parent);
}

/*
 * A dead owner's scratch directory (files and a subdirectory in it) and its lock file, and its
 * swap space's file, probe and lock, are removed; a live pid's are kept (its lock held or not);
 * other stems and names are not looked at.
 */
Test(scratch, dead_owners_entries_removed_live_and_others_kept)
{
	char *dir = zt_mkdtemp(NULL);
	const char *H = host();
	long dead = dead_pid(), live = (long)getppid();
	make_dir(dir, STEM "-%s-%ld-r0-AbCdEf", H, dead);
	char sub[4400];
	snprintf(sub, sizeof(sub), "%s/" STEM "-%s-%ld-r0-AbCdEf/sub", dir, H, dead);
	cr_assert_eq(mkdir(sub, 0700), 0);
	touch(sub, "zinf-param-r0.%d.swp", 0);
	touch(dir, STEM "-%s-%ld-r0.lock", H, dead);
	touch(dir, STEM "-%s-%ld-r0-exp_avg.0.swp", H, dead);
	touch(dir, STEM "-%s-%ld-b-r2-fp32.1.swp", H, dead); /* a prefix with more after the pid */
	touch(dir, "." STEM "-%s-%ld-r0.0.probe", H, dead);
	touch(dir, STEM "-%s-%ld-r0.0.lock", H, dead);
	touch(dir, STEM "-%s-%ld-b-r2.1.lock", H, dead);
	make_dir(dir, STEM "-%s-%ld-r1-GhIjKl", H, live);
	touch(dir, STEM "-%s-%ld-r1.lock", H, live);
	/* not of this stem, or not of the library's shapes: never touched, never told of */
	touch(dir, STEM "x-%s-%ld-r0.lock", H, dead);
	touch(dir, "other-%s-%ld-r0.lock", H, dead);
	make_dir(dir, STEM "-r0-%ld", dead); /* zinf_gpt's names before they carried the pid */
	touch(dir, STEM "-%s-%ld", H, dead); /* nothing after the pid */
	struct heard h = {0};
	cr_assert_eq(zinf_scratch_reclaim(dir, STEM, hear, &h), 7, "%s", zinf_last_error());
	cr_assert_eq(h.removed, 7);
	cr_assert_eq(h.live, 2, "the live pid's two entries");
	cr_assert_eq(h.failed + h.no_lock + h.other_host, 0);
	cr_assert_not(exists(dir, STEM "-%s-%ld-r0-AbCdEf", H, dead));
	cr_assert_not(exists(dir, STEM "-%s-%ld-r0.lock", H, dead));
	cr_assert_not(exists(dir, STEM "-%s-%ld-r0-exp_avg.0.swp", H, dead));
	cr_assert_not(exists(dir, STEM "-%s-%ld-b-r2-fp32.1.swp", H, dead));
	cr_assert_not(exists(dir, "." STEM "-%s-%ld-r0.0.probe", H, dead));
	cr_assert_not(exists(dir, STEM "-%s-%ld-r0.0.lock", H, dead));
	cr_assert_not(exists(dir, STEM "-%s-%ld-b-r2.1.lock", H, dead));
	cr_assert(exists(dir, STEM "-%s-%ld-r1-GhIjKl", H, live));
	cr_assert(exists(dir, STEM "-%s-%ld-r1.lock", H, live));
	cr_assert(exists(dir, STEM "x-%s-%ld-r0.lock", H, dead));
	cr_assert(exists(dir, "other-%s-%ld-r0.lock", H, dead));
	cr_assert(exists(dir, STEM "-r0-%ld", dead));
	cr_assert(exists(dir, STEM "-%s-%ld", H, dead));
	/* without a callback: the same, nothing left to remove */
	cr_assert_eq(zinf_scratch_reclaim(dir, STEM, NULL, NULL), 0);
	zt_rmtree(dir);
	free(dir);
}

/*
 * Only the shapes the library makes are removed, and only under their own lock file: a user's
 * directory named like a dead pid's scratch (`<stem>-<pid>-results`, `<stem>-2024-results`, in
 * a --scratch-parent of `.`) is not touched, with what it holds; neither is a directory of this
 * host and a dead pid of the exact shape whose lock file is missing, nor a swap file whose lock
 * is missing (both told of as not locked), nor a regular file of a directory's shape, nor a
 * file of another shape.
 */
Test(scratch, only_the_library_shapes_removed_under_their_own_lock)
{
	char *dir = zt_mkdtemp(NULL);
	const char *H = host();
	long dead = dead_pid();
	make_dir(dir, STEM "-%ld-results", dead);
	touch(dir, STEM "-%ld-results/thesis.tex", dead);
	make_dir(dir, STEM "-2024-results");
	touch(dir, STEM "-2024-results/data.csv");
	make_dir(dir, STEM "-%s-%ld-r0-AbCdEf", H, dead); /* no lock file */
	touch(dir, STEM "-%s-%ld-r0-AbCdEf/keep", H, dead);
	touch(dir, STEM "-%s-%ld-r0-data.0.swp", H, dead); /* no lock file */
	touch(dir, STEM "-%s-%ld-r9-GhIjKl", H, dead);	   /* a file of a directory's shape */
	touch(dir, STEM "-%s-%ld-notes.txt", H, dead);
	make_dir(dir, STEM "-%s-%ld-r5-MnOpQr.lock", H, dead); /* a directory of a lock's */
	struct heard h = {0};
	cr_assert_eq(zinf_scratch_reclaim(dir, STEM, hear, &h), 0, "%s", zinf_last_error());
	cr_assert_eq(h.no_lock, 2, "the directory and the swap file without their lock");
	cr_assert_eq(h.removed + h.failed + h.live + h.other_host, 0);
	cr_assert(exists(dir, STEM "-%ld-results/thesis.tex", dead), "a user's directory removed");
	cr_assert(exists(dir, STEM "-2024-results/data.csv"), "a user's directory removed");
	cr_assert(exists(dir, STEM "-%s-%ld-r0-AbCdEf/keep", H, dead));
	cr_assert(exists(dir, STEM "-%s-%ld-r0-data.0.swp", H, dead));
	cr_assert(exists(dir, STEM "-%s-%ld-r9-GhIjKl", H, dead));
	cr_assert(exists(dir, STEM "-%s-%ld-notes.txt", H, dead));
	cr_assert(exists(dir, STEM "-%s-%ld-r5-MnOpQr.lock", H, dead));
	/* with its lock file back, the directory is the library's and goes */
	touch(dir, STEM "-%s-%ld-r0.lock", H, dead);
	memset(&h, 0, sizeof(h));
	cr_assert_eq(zinf_scratch_reclaim(dir, STEM, hear, &h), 2, "%s", zinf_last_error());
	cr_assert_not(exists(dir, STEM "-%s-%ld-r0-AbCdEf", H, dead));
	cr_assert_not(exists(dir, STEM "-%s-%ld-r0.lock", H, dead));
	cr_assert(exists(dir, STEM "-%ld-results/thesis.tex", dead));
	zt_rmtree(dir);
	free(dir);
}

/*
 * Entries of another host are left alone, whatever their pid and lock say here (flock is local
 * to a node on many shared file systems: a lock another node holds looks free): told of as
 * another host's, never removed. A host part of a single '.' or with '_' parses as a host too.
 */
Test(scratch, other_hosts_entries_left_alone)
{
	char *dir = zt_mkdtemp(NULL);
	long dead = dead_pid();
	static const char *const hosts[] = {"node7.cluster", "gpu_12", "x"};
	for (size_t i = 0; i < 3; i++) {
		const char *o = hosts[i];
		cr_assert_str_neq(o, host());
		make_dir(dir, STEM "-%s-%ld-r0-AbCdEf", o, dead);
		touch(dir, STEM "-%s-%ld-r0.lock", o, dead);
		touch(dir, STEM "-%s-%ld-r0-data.0.swp", o, dead);
		touch(dir, STEM "-%s-%ld-r0.0.lock", o, dead);
	}
	struct heard h = {0};
	cr_assert_eq(zinf_scratch_reclaim(dir, STEM, hear, &h), 0, "%s", zinf_last_error());
	cr_assert_eq(h.other_host, 12);
	cr_assert_eq(h.removed + h.failed + h.live + h.no_lock, 0);
	for (size_t i = 0; i < 3; i++) {
		cr_assert(exists(dir, STEM "-%s-%ld-r0-AbCdEf", hosts[i], dead));
		cr_assert(exists(dir, STEM "-%s-%ld-r0.lock", hosts[i], dead));
		cr_assert(exists(dir, STEM "-%s-%ld-r0-data.0.swp", hosts[i], dead));
	}
	zt_rmtree(dir);
	free(dir);
}

/* An owner this process cannot see (its pid does not run here: another pid namespace) but whose
 * lock is held keeps its directory; once the lock is let go, the next reclaim removes it. */
Test(scratch, held_lock_keeps_an_unseen_owners_entries)
{
	char *dir = zt_mkdtemp(NULL);
	const char *H = host();
	long dead = dead_pid();
	make_dir(dir, STEM "-%s-%ld-r0-AbCdEf", H, dead);
	touch(dir, STEM "-%s-%ld-r0.lock", H, dead);
	char lock[4400];
	snprintf(lock, sizeof(lock), "%s/" STEM "-%s-%ld-r0.lock", dir, H, dead);
	int fd = open(lock, O_RDWR);
	cr_assert(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0);
	struct heard h = {0};
	cr_assert_eq(zinf_scratch_reclaim(dir, STEM, hear, &h), 0);
	cr_assert_eq(h.live, 2);
	cr_assert_eq(h.pid, dead);
	cr_assert(exists(dir, STEM "-%s-%ld-r0-AbCdEf", H, dead));
	close(fd);
	memset(&h, 0, sizeof(h));
	cr_assert_eq(zinf_scratch_reclaim(dir, STEM, hear, &h), 2);
	cr_assert_eq(h.removed, 2);
	cr_assert_not(exists(dir, STEM "-%s-%ld-r0-AbCdEf", H, dead));
	zt_rmtree(dir);
	free(dir);
}

/* A symbolic link in a dead owner's directory is removed, not followed: its target stays. A link
 * in the shared directory itself, named as a directory of the library's, is not one: kept. */
Test(scratch, links_not_followed)
{
	char *dir = zt_mkdtemp(NULL), *outside = zt_mkdtemp(NULL);
	const char *H = host();
	long dead = dead_pid();
	touch(outside, "keep%d", 0);
	make_dir(dir, STEM "-%s-%ld-r0-AbCdEf", H, dead);
	touch(dir, STEM "-%s-%ld-r0.lock", H, dead);
	touch(dir, STEM "-%s-%ld-r1.lock", H, dead);
	char link[4400], entry[4400];
	snprintf(link, sizeof(link), "%s/" STEM "-%s-%ld-r0-AbCdEf/out", dir, H, dead);
	cr_assert_eq(symlink(outside, link), 0);
	snprintf(entry, sizeof(entry), "%s/" STEM "-%s-%ld-r1-linkXX", dir, H, dead);
	cr_assert_eq(symlink(outside, entry), 0);
	cr_assert_eq(zinf_scratch_reclaim(dir, STEM, NULL, NULL), 3); /* the dir, both locks */
	cr_assert_not(exists(dir, STEM "-%s-%ld-r0-AbCdEf", H, dead));
	cr_assert(exists(dir, STEM "-%s-%ld-r1-linkXX", H, dead), "a link taken for a directory");
	cr_assert(exists(outside, "keep%d", 0), "the link's target was removed");
	zt_rmtree(dir);
	zt_rmtree(outside);
	free(dir);
	free(outside);
}

/* A child that made a scratch directory and was killed (SIGKILL: no destroy) leaves it; the
 * next reclaim removes it and its lock. */
Test(scratch, killed_owners_directory_reclaimed)
{
	char *dir = zt_mkdtemp(NULL);
	int fds[2];
	cr_assert_eq(pipe(fds), 0);
	pid_t p = fork();
	cr_assert(p >= 0);
	if (p == 0) {
		struct zinf_scratch_dir *d = NULL;
		char c = 'x';
		if (zinf_scratch_dir_create(dir, STEM, "r0", &d) != 0 ||
		    write(fds[1], &c, 1) != 1) {
			_exit(1);
		}
		alarm(60); /* gone by itself should the test fail before killing it */
		pause();
		_exit(2);
	}
	char c;
	cr_assert_eq(read(fds[0], &c, 1), 1);
	/* alive: kept */
	struct heard h = {0};
	cr_assert_eq(zinf_scratch_reclaim(dir, STEM, hear, &h), 0);
	cr_assert_eq(h.live, 2, "the live child's directory and lock");
	kill(p, SIGKILL);
	waitpid(p, NULL, 0);
	memset(&h, 0, sizeof(h));
	cr_assert_eq(zinf_scratch_reclaim(dir, STEM, hear, &h), 2);
	cr_assert_eq(h.pid, (long)p);
	cr_assert_eq(h.live, 0);
	close(fds[0]);
	close(fds[1]);
	zt_rmtree(dir);
	free(dir);
}

/* A child's swap space of prefix zinf_scratch_prefix (as the zinf command's benchmarks make
 * one): its files and lock are the library's shapes, kept while it lives and reclaimed once it
 * was killed, leaving the directory empty. */
Test(scratch, killed_swap_space_reclaimed)
{
	char *dir = zt_mkdtemp(NULL);
	int fds[2];
	cr_assert_eq(pipe(fds), 0);
	pid_t p = fork();
	cr_assert(p >= 0);
	if (p == 0) {
		char prefix[ZINF_SCRATCH_HOST_MAX + 88], c = 'x';
		struct zinf_io_opts io_o;
		zinf_io_opts_init(&io_o);
		io_o.backend = "psync";
		struct zinf_io *io = NULL;
		struct zinf_swap *s = NULL;
		struct zinf_swap_opts so;
		zinf_swap_opts_init(&so);
		const char *dirs[1] = {dir};
		so.dirs = dirs;
		so.n_dirs = 1;
		so.rank = 3;
		so.prefix = prefix;
		so.buffered = true;
		if (zinf_scratch_prefix(STEM, prefix, sizeof(prefix)) < 0 ||
		    zinf_io_create(&io_o, &io) || zinf_swap_create(io, &so, &s) ||
		    zinf_swap_add(s, "exp_avg", 0, 8192) < 0 || zinf_swap_reserve(s) ||
		    write(fds[1], &c, 1) != 1) {
			_exit(1);
		}
		alarm(60); /* gone by itself should the test fail before killing it */
		pause();
		_exit(2);
	}
	char c;
	cr_assert_eq(read(fds[0], &c, 1), 1, "the child's swap space");
	struct heard h = {0};
	cr_assert_eq(zinf_scratch_reclaim(dir, STEM, hear, &h), 0);
	cr_assert_eq(h.live, 2, "the live child's swap file and lock");
	cr_assert(exists(dir, STEM "-%s-%ld-r3-exp_avg.0.swp", host(), (long)p));
	kill(p, SIGKILL);
	waitpid(p, NULL, 0);
	memset(&h, 0, sizeof(h));
	cr_assert_eq(zinf_scratch_reclaim(dir, STEM, hear, &h), 2);
	cr_assert_eq(h.live + h.no_lock + h.failed, 0);
	cr_assert_not(exists(dir, STEM "-%s-%ld-r3-exp_avg.0.swp", host(), (long)p));
	cr_assert_not(exists(dir, STEM "-%s-%ld-r3.0.lock", host(), (long)p));
	close(fds[0]);
	close(fds[1]);
	zt_rmtree(dir);
	free(dir);
}
