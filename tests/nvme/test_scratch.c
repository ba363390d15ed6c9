/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/nvme/test_scratch.c: scratch that names its owner (nvme/scratch.c) on the scratch file
 * system: a scratch directory made under its lock and removed with it; the reclaim of what dead
 * owners left (a forked child that exited is a pid that is gone): their directories with all
 * they hold and their lock files go, while a live pid's entries, a dead pid's entries whose lock
 * is held (an owner in another pid namespace), this process's own entries and other names stay;
 * symbolic links are not followed; bad arguments.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/test_util.h"
#include "zinf/blocks/swap.h"

#define STEM "zinf-test"

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

static void
touch(const char *dir, const char *fmt, long pid)
{
	char name[256], path[4400];
	snprintf(name, sizeof(name), fmt, pid);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	int fd = open(path, O_RDWR | O_CREAT, 0600);
	cr_assert(fd >= 0, "%s", path);
	cr_assert_eq(write(fd, "x", 1), 1);
	close(fd);
}

static void
make_dir(const char *dir, const char *fmt, long pid)
{
	char name[256], path[4400];
	snprintf(name, sizeof(name), fmt, pid);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	cr_assert_eq(mkdir(path, 0700), 0, "%s", path);
}

static bool
exists(const char *dir, const char *fmt, long pid)
{
	char name[256], path[4400];
	struct stat st;
	snprintf(name, sizeof(name), fmt, pid);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	return lstat(path, &st) == 0;
}

/* What the callback heard. */
struct heard {
	int removed, kept, failed;
	long pid;
};

static void
hear(void *ctx, const char *path, int64_t pid, int status)
{
	struct heard *h = ctx;
	cr_assert(strstr(path, STEM), "%s", path);
	h->pid = (long)pid;
	if (status == 0) {
		h->removed++;
	} else if (status == 1) {
		h->kept++;
	} else {
		h->failed++;
	}
}

Test(scratch, dir_made_under_its_lock_and_removed_with_it)
{
	char *parent = zt_mkdtemp(NULL);
	struct zinf_scratch_dir *d = NULL;
	cr_assert_eq(zinf_scratch_dir_create(parent, STEM, "r3", &d), 0, "%s", zinf_last_error());
	const char *p = zinf_scratch_dir_path(d);
	char want[4400];
	snprintf(want, sizeof(want), "%s/" STEM "-%ld-r3-", parent, (long)getpid());
	cr_assert(strncmp(p, want, strlen(want)) == 0 && strlen(p) == strlen(want) + 6, "%s", p);
	struct stat st;
	cr_assert(stat(p, &st) == 0 && S_ISDIR(st.st_mode));
	/* its lock: held (by this process, through another open file), the pid inside */
	char lock[4400], buf[32] = "";
	snprintf(lock, sizeof(lock), "%s/" STEM "-%ld-r3.lock", parent, (long)getpid());
	int fd = open(lock, O_RDWR);
	cr_assert(fd >= 0, "%s", lock);
	cr_assert(flock(fd, LOCK_EX | LOCK_NB) != 0, "the lock is not held");
	cr_assert_gt(read(fd, buf, sizeof(buf) - 1), 0);
	cr_assert_eq(strtol(buf, NULL, 10), (long)getpid());
	close(fd);
	/* a second directory of the same tag in this process is refused; another tag is fine */
	struct zinf_scratch_dir *d2 = NULL;
	cr_assert_eq(zinf_scratch_dir_create(parent, STEM, "r3", &d2), -EBUSY);
	cr_assert_null(d2);
	cr_assert_eq(zinf_scratch_dir_create(parent, STEM, "r4", &d2), 0);
	/* what the owner put inside, a subdirectory too, goes with it */
	char sub[4400];
	snprintf(sub, sizeof(sub), "%s/sub", p);
	cr_assert_eq(mkdir(sub, 0700), 0);
	touch(sub, "f%ld", 1);
	touch(p, "swap%ld.swp", 2);
	/* a reclaim by this process leaves its own entries alone, and reports none of them */
	struct heard h = {0};
	cr_assert_eq(zinf_scratch_reclaim(parent, STEM, hear, &h), 0);
	cr_assert_eq(h.removed + h.kept + h.failed, 0);
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
	snprintf(lock, sizeof(lock), "%s/" STEM "-%ld-r0.lock", parent, (long)getpid());
	int fds[2];
	pid_t p = hold_lock(lock, fds, 50000);
	struct zinf_scratch_dir *d = NULL;
	int rc = zinf_scratch_dir_create(parent, STEM, "r0", &d);
	cr_expect_eq(rc, 0, "held for 50 ms by pid %ld: %d %s", (long)p, rc, zinf_last_error());
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
	cr_assert_eq(zinf_scratch_dir_create(NULL, STEM, "r0", &d), -EINVAL);
	cr_assert_eq(zinf_scratch_dir_create(parent, "a/b", "r0", &d), -EINVAL);
	cr_assert_eq(zinf_scratch_dir_create(parent, STEM, "", &d), -EINVAL);
	cr_assert_eq(zinf_scratch_dir_create(parent, STEM, "r0", NULL), -EINVAL);
	char missing[4400];
	snprintf(missing, sizeof(missing), "%s/missing", parent);
	cr_assert_eq(zinf_scratch_dir_create(missing, STEM, "r0", &d), -ENOENT);
	cr_assert(strstr(zinf_last_error(), missing), "%s", zinf_last_error());
	cr_assert_null(d);
	cr_assert_eq(zinf_scratch_reclaim(NULL, STEM, NULL, NULL), -EINVAL);
	cr_assert_eq(zinf_scratch_reclaim(parent, "", NULL, NULL), -EINVAL);
	cr_assert_eq(zinf_scratch_reclaim(missing, STEM, NULL, NULL), -ENOENT);
	cr_assert(strstr(zinf_last_error(), missing), "%s", zinf_last_error());
	zt_rmtree(parent);
	free(parent);
}

/* A dead owner's directory (files and a subdirectory in it) and its lock file are removed; a
 * live pid's and other names are not. */
Test(scratch, dead_owners_entries_removed_live_and_others_kept)
{
	char *dir = zt_mkdtemp(NULL);
	long dead = dead_pid(), live = (long)getppid();
	make_dir(dir, STEM "-%ld-r0-AbCdEf", dead);
	char sub[4400];
	snprintf(sub, sizeof(sub), "%s/" STEM "-%ld-r0-AbCdEf/sub", dir, dead);
	cr_assert_eq(mkdir(sub, 0700), 0);
	touch(sub, "zinf-param-r0.%ld.swp", 0);
	touch(dir, STEM "-%ld-r0.lock", dead);
	touch(dir, "." STEM "-%ld-direct.probe", dead);
	make_dir(dir, STEM "-%ld-r1-GhIjKl", live);
	touch(dir, STEM "-%ld-r1.lock", live);
	/* not of this stem, or no pid: never touched */
	touch(dir, STEM "x-%ld-r0.lock", dead);
	touch(dir, "other-%ld-r0.lock", dead);
	make_dir(dir, STEM "-r0-%ld", dead); /* zinf_gpt's names before they carried the pid */
	touch(dir, STEM "-%ld", dead);	     /* no '-' after the pid */
	struct heard h = {0};
	cr_assert_eq(zinf_scratch_reclaim(dir, STEM, hear, &h), 3, "%s", zinf_last_error());
	cr_assert_eq(h.removed, 3);
	cr_assert_eq(h.kept, 2, "the live pid's two entries");
	cr_assert_eq(h.failed, 0);
	cr_assert_not(exists(dir, STEM "-%ld-r0-AbCdEf", dead));
	cr_assert_not(exists(dir, STEM "-%ld-r0.lock", dead));
	cr_assert_not(exists(dir, "." STEM "-%ld-direct.probe", dead));
	cr_assert(exists(dir, STEM "-%ld-r1-GhIjKl", live));
	cr_assert(exists(dir, STEM "-%ld-r1.lock", live));
	cr_assert(exists(dir, STEM "x-%ld-r0.lock", dead));
	cr_assert(exists(dir, "other-%ld-r0.lock", dead));
	cr_assert(exists(dir, STEM "-r0-%ld", dead));
	cr_assert(exists(dir, STEM "-%ld", dead));
	/* without a callback: the same, nothing left to remove */
	cr_assert_eq(zinf_scratch_reclaim(dir, STEM, NULL, NULL), 0);
	zt_rmtree(dir);
	free(dir);
}

/* An owner this process cannot see (its pid does not run here: another pid namespace) but whose
 * lock is held keeps its directory; once the lock is let go, the next reclaim removes it. */
Test(scratch, held_lock_keeps_an_unseen_owners_entries)
{
	char *dir = zt_mkdtemp(NULL);
	long dead = dead_pid();
	make_dir(dir, STEM "-%ld-r0-AbCdEf", dead);
	touch(dir, STEM "-%ld-r0.lock", dead);
	char lock[4400];
	snprintf(lock, sizeof(lock), "%s/" STEM "-%ld-r0.lock", dir, dead);
	int fd = open(lock, O_RDWR);
	cr_assert(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0);
	struct heard h = {0};
	cr_assert_eq(zinf_scratch_reclaim(dir, STEM, hear, &h), 0);
	cr_assert_eq(h.kept, 2);
	cr_assert_eq(h.pid, dead);
	cr_assert(exists(dir, STEM "-%ld-r0-AbCdEf", dead));
	close(fd);
	memset(&h, 0, sizeof(h));
	cr_assert_eq(zinf_scratch_reclaim(dir, STEM, hear, &h), 2);
	cr_assert_eq(h.removed, 2);
	cr_assert_not(exists(dir, STEM "-%ld-r0-AbCdEf", dead));
	zt_rmtree(dir);
	free(dir);
}

/* A symbolic link in a dead owner's directory is removed, not followed: its target stays. */
Test(scratch, links_not_followed)
{
	char *dir = zt_mkdtemp(NULL), *outside = zt_mkdtemp(NULL);
	long dead = dead_pid();
	touch(outside, "keep%ld", 0);
	make_dir(dir, STEM "-%ld-r0-AbCdEf", dead);
	char link[4400], entry[4400];
	snprintf(link, sizeof(link), "%s/" STEM "-%ld-r0-AbCdEf/out", dir, dead);
	cr_assert_eq(symlink(outside, link), 0);
	snprintf(entry, sizeof(entry), "%s/" STEM "-%ld-r1-link", dir, dead);
	cr_assert_eq(symlink(outside, entry), 0);
	cr_assert_eq(zinf_scratch_reclaim(dir, STEM, NULL, NULL), 2);
	cr_assert_not(exists(dir, STEM "-%ld-r0-AbCdEf", dead));
	cr_assert_not(exists(dir, STEM "-%ld-r1-link", dead));
	cr_assert(exists(outside, "keep%ld", 0), "the link's target was removed");
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
		pause();
		_exit(2);
	}
	char c;
	cr_assert_eq(read(fds[0], &c, 1), 1);
	/* alive: kept */
	struct heard h = {0};
	cr_assert_eq(zinf_scratch_reclaim(dir, STEM, hear, &h), 0);
	cr_assert_eq(h.kept, 2, "the live child's directory and lock");
	kill(p, SIGKILL);
	waitpid(p, NULL, 0);
	memset(&h, 0, sizeof(h));
	cr_assert_eq(zinf_scratch_reclaim(dir, STEM, hear, &h), 2);
	cr_assert_eq(h.pid, (long)p);
	cr_assert_eq(h.kept, 0);
	close(fds[0]);
	close(fds[1]);
	zt_rmtree(dir);
	free(dir);
}
