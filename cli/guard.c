/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli/guard.c: what keeps a benchmark from hurting the machine it measures: signals turned into
 * a flag (so files are removed on the way out), the memory check made before any large
 * allocation, and the scratch files of runs that were killed (kill -9, the OOM killer) found and
 * removed by the next run. It allocates nothing large itself.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "cli/cli.h"
#include "zinf/common.h"
#include "zinf/blocks/io.h"
#include "zinf/blocks/swap.h"

volatile sig_atomic_t cli_interrupted;

static void
on_signal(int sig)
{
	cli_interrupted = sig;
}

void
cli_catch_signals(void)
{
	static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
	struct sigaction sa = {0};
	sa.sa_handler = on_signal;
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
		sigaction(sigs[i], &sa, NULL);
	}
	/* A write past RLIMIT_FSIZE then fails with EFBIG, which is reported and cleaned up. */
	signal(SIGXFSZ, SIG_IGN);
}

int
cli_interrupt_status(void)
{
	return cli_interrupted ? 128 + cli_interrupted : 0;
}

uint64_t
cli_phys_memory(void)
{
	struct zinf_topo *t = NULL;
	uint64_t m = 0;
	if (zinf_topo_create(&t) == 0) {
		m = zinf_topo_memory(t);
		zinf_topo_destroy(t);
	}
	if (m == 0) {
		long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
		m = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
	}
	return m;
}

int
cli_check_memory(const char *prog, const char *what, double bytes, const char *lower)
{
	uint64_t phys = cli_phys_memory();
	if (phys == 0 || bytes <= 0.9 * (double)phys) {
		return 0;
	}
	char need[32], have[32];
	cli_size_str(need, sizeof(need), bytes >= 1.8e19 ? UINT64_MAX : (uint64_t)bytes);
	cli_size_str(have, sizeof(have), phys);
	fprintf(stderr,
		"%s: %s: %s needed, more than 90%% of the machine's %s of physical memory; "
		"lower %s\n",
		prog, what, need, have, lower);
	return -ENOMEM;
}

void
cli_scratch_prefix(char *out, size_t n, const char *stem)
{
	snprintf(out, n, "%s-%ld", stem, (long)getpid());
}

/* The owner's pid of a scratch name "<stem>-<pid>-..." (a leading '.' allowed), or 0. */
static long
scratch_owner(const char *name, const char *stem)
{
	size_t sl = strlen(stem);
	if (name[0] == '.') {
		name++;
	}
	if (strncmp(name, stem, sl) != 0 || name[sl] != '-') {
		return 0;
	}
	char *end = NULL;
	long pid = strtol(name + sl + 1, &end, 10);
	return pid > 0 && end != name + sl + 1 && *end == '-' ? pid : 0;
}

static bool
pid_running(long pid)
{
	return kill((pid_t)pid, 0) == 0 || errno == EPERM;
}

/*
 * Whether the swap lock file `name` in dir is held: its owner lives, though its pid may not be
 * one this process sees (another pid namespace: a container sharing the directory).
 */
static bool
lock_held(int dfd, const char *name)
{
	size_t n = strlen(name);
	if (n < 5 || strcmp(name + n - 5, ".lock") != 0) {
		return false;
	}
	int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		return false;
	}
	bool held = flock(fd, LOCK_EX | LOCK_NB) < 0 && errno == EWOULDBLOCK;
	close(fd); /* releases the lock if we took it */
	return held;
}

#define RECLAIM_LIVE_MAX 64

static bool
in(const long *v, int n, long x)
{
	for (int i = 0; i < n; i++) {
		if (v[i] == x) {
			return true;
		}
	}
	return false;
}

int
cli_reclaim_scratch(const char *prog, const char *dir, const char *stem)
{
	DIR *d = opendir(dir);
	if (!d) {
		return 0; /* a missing directory is reported by the swap space, with its name */
	}
	int removed = 0, failed = 0, nlive = 0;
	long dead = 0, alive = 0, live[RECLAIM_LIVE_MAX];
	struct dirent *e;
	/* First the owners whose swap lock is held: alive wherever their pid lives. */
	while ((e = readdir(d)) != NULL) {
		long pid = scratch_owner(e->d_name, stem);
		if (pid != 0 && !in(live, nlive, pid) && lock_held(dirfd(d), e->d_name)) {
			if (nlive == RECLAIM_LIVE_MAX) {
				closedir(d); /* too many to tell apart: remove nothing */
				return 0;
			}
			live[nlive++] = pid;
		}
	}
	rewinddir(d);
	while ((e = readdir(d)) != NULL) {
		long pid = scratch_owner(e->d_name, stem);
		if (pid == 0 || pid == (long)getpid()) {
			continue;
		}
		if (pid_running(pid) || in(live, nlive, pid)) {
			alive = pid;
			continue;
		}
		if (unlinkat(dirfd(d), e->d_name, 0) == 0) {
			removed++;
			dead = pid;
		} else {
			failed++;
		}
	}
	closedir(d);
	if (removed) {
		fprintf(stderr,
			"%s: removed %d file%s left in %s by an earlier run (pid %ld, no "
			"longer running)\n",
			prog, removed, removed == 1 ? "" : "s", dir, dead);
	}
	if (failed) {
		fprintf(stderr, "%s: could not remove %d file%s named %s-<pid>-* in %s\n", prog,
			failed, failed == 1 ? "" : "s", stem, dir);
	}
	if (alive) {
		fprintf(stderr,
			"%s: %s holds files of pid %ld, which is still running; left alone\n", prog,
			dir, alive);
	}
	return removed;
}

/* The log sink while a call's errors are held back: warnings and the rest go to stderr. */
static void
log_no_errors(void *ctx, enum zinf_log_level level, const char *file, int line, const char *func,
	      const char *msg)
{
	if (level != ZINF_LOG_ERROR) {
		zinf_log_to_file(ctx, level, file, line, func, msg);
	}
}

void
cli_quiet_errors(bool quiet)
{
	zinf_log_set_callback(quiet ? log_no_errors : zinf_log_to_file, stderr);
}

int
cli_swap_create(const char *prog, struct zinf_io *io, const struct zinf_swap_opts *opts,
		struct zinf_swap **out)
{
	cli_quiet_errors(true);
	int rc = zinf_swap_create(io, opts, out);
	cli_quiet_errors(false);
	if (rc < 0) {
		const char *msg = zinf_last_error();
		zinf_log_to_file(stderr, ZINF_LOG_ERROR, __FILE__, __LINE__, __func__, msg);
		/* The library names its own option (opts.buffered); the command's is --buffered. */
		if (rc == -EINVAL && !opts->buffered && strstr(msg, "O_DIRECT")) {
			fprintf(stderr,
				"%s: for a file system without O_DIRECT (tmpfs), add --buffered\n",
				prog);
		}
	}
	return rc;
}

bool
cli_dir_direct(struct zinf_io *io, const char *dir, const char *stem)
{
	char path[4096];
	snprintf(path, sizeof(path), "%s/.%s-%ld-direct.probe", dir, stem, (long)getpid());
	struct zinf_io_file *f = NULL;
	bool direct = false;
	/* The flags the swap space opens its files with when buffered I/O is allowed. */
	if (zinf_io_file_open(io, path, ZINF_IO_RDWR | ZINF_IO_CREATE | ZINF_IO_DIRECT_OR_BUFFERED,
			      &f) == 0) {
		direct = zinf_io_file_direct(f);
		zinf_io_file_close(io, f);
	}
	unlink(path);
	return direct;
}

static int
env_first(const char *const *vars, int def)
{
	for (unsigned i = 0; vars[i]; i++) {
		const char *v = getenv(vars[i]);
		if (v && *v) {
			return atoi(v);
		}
	}
	return def;
}

int
cli_launcher_rank(void)
{
	static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK",
					   "SLURM_PROCID", NULL};
	return env_first(vars, 0);
}

int
cli_launcher_size(void)
{
	static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS",
					   NULL};
	return env_first(vars, 1);
}
