/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli/guard.c: what keeps a benchmark from hurting the machine it measures: signals turned into
 * a flag (so files are removed on the way out), the memory check made before any large
 * allocation, and the scratch files of runs that were killed (kill -9, the OOM killer) found and
 * removed by the next run (zinf_scratch_reclaim, zinf/blocks/swap.h, with the messages). It
 * allocates nothing large itself.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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

/* What the reclaim found, for its messages. */
struct reclaim_tally {
	int removed, failed;
	long dead, alive;
};

static void
tally(void *ctx, const char *path, int64_t pid, int status)
{
	struct reclaim_tally *t = ctx;
	(void)path;
	if (status == 0) {
		t->removed++;
		t->dead = (long)pid;
	} else if (status == 1) {
		t->alive = (long)pid;
	} else {
		t->failed++;
	}
}

int
cli_reclaim_scratch(const char *prog, const char *dir, const char *stem)
{
	struct reclaim_tally t = {0};
	cli_quiet_errors(true); /* a missing directory is reported by the swap space, named */
	int r = zinf_scratch_reclaim(dir, stem, tally, &t);
	cli_quiet_errors(false);
	if (r < 0) {
		return 0;
	}
	if (t.removed) {
		fprintf(stderr,
			"%s: removed %d file%s left in %s by an earlier run (pid %ld, no "
			"longer running)\n",
			prog, t.removed, t.removed == 1 ? "" : "s", dir, t.dead);
	}
	if (t.failed) {
		fprintf(stderr, "%s: could not remove %d file%s named %s-<pid>-* in %s\n", prog,
			t.failed, t.failed == 1 ? "" : "s", stem, dir);
	}
	if (t.alive) {
		fprintf(stderr,
			"%s: %s holds files of pid %ld, which is still running; left alone\n", prog,
			dir, t.alive);
	}
	return t.removed;
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
