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
	/* the buffer is CLI_PREFIX_MAX and the stem a constant of the command: it fits */
	(void)zinf_scratch_prefix(stem, out, n);
}

/* What the reclaim found, for its messages. */
struct reclaim_tally {
	int removed, failed, no_lock, other_host;
	long dead, alive, unlocked;
};

static void
tally(void *ctx, const char *path, int64_t pid, int status)
{
	struct reclaim_tally *t = ctx;
	(void)path;
	switch (status) {
	case ZINF_SCRATCH_REMOVED:
		t->removed++;
		t->dead = (long)pid;
		break;
	case ZINF_SCRATCH_KEPT_LIVE:
		t->alive = (long)pid;
		break;
	case ZINF_SCRATCH_KEPT_NO_LOCK:
		t->no_lock++;
		t->unlocked = (long)pid;
		break;
	case ZINF_SCRATCH_KEPT_OTHER_HOST:
		t->other_host++;
		break;
	default:
		t->failed++;
	}
}

static const char *
plural(int n)
{
	return n == 1 ? "" : "s";
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
			prog, t.removed, plural(t.removed), dir, t.dead);
	}
	if (t.failed) {
		fprintf(stderr, "%s: could not remove %d file%s named %s-<host>-<pid>-* in %s\n",
			prog, t.failed, plural(t.failed), stem, dir);
	}
	if (t.alive) {
		fprintf(stderr,
			"%s: %s holds files of pid %ld, which is still running; left alone\n", prog,
			dir, t.alive);
	}
	if (t.no_lock) {
		fprintf(stderr,
			"%s: %s holds %d file%s named like this command's of pid %ld, which no "
			"longer runs, without their lock file: not known to be zinf's; left "
			"alone\n",
			prog, dir, t.no_lock, plural(t.no_lock), t.unlocked);
	}
	if (t.other_host) {
		fprintf(stderr,
			"%s: %s holds %d file%s of this command's runs on other hosts; left alone "
			"(their own host reclaims them)\n",
			prog, dir, t.other_host, plural(t.other_host));
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
