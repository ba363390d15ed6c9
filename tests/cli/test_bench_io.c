/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/cli/test_bench_io.c: the `zinf bench io` command as a user runs it ($ZINF_CLI, set by
 * CMake): its JSON output (keys, null for a mode not run, what really ran), the DeepSpeed "aio"
 * section of a sweep, the default directory created and removed, the memory check made before
 * allocating, errors printed once, --buffered on tmpfs, and cleanup: SIGINT and SIGHUP mid-run,
 * `ulimit -f` (EFBIG reported, no file left), and the files of a killed run removed by the next.
 * Also the command's front: `zinf bench --help`, ZINF_LOG_LEVEL. Bandwidth figures are not
 * judged here (benchmarks, not tests).
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_run.h"
#include "common/test_util.h"
#include "zinf/blocks/swap.h"

Test(bench_io, json_keys_and_null_mode)
{
	struct zc_scratch s;
	zc_scratch_init(&s);
	char *argv[] = {"zinf", "bench",  "io",	   "--path",	   s.dir,  "--size",
			"8M",	"--mode", "write", "--block-size", "256K", "--queue-depth",
			"4",	"--json", NULL};
	cr_assert_eq(zc_run(NULL, argv, s.out, s.err), 0);
	json_t *j = zc_json(s.out);
	const char *be = json_string_value(json_object_get(j, "backend"));
	cr_assert(be && (!strcmp(be, "io_uring") || !strcmp(be, "libaio") || !strcmp(be, "psync")),
		  "backend %s", be ? be : "(none)");
	cr_assert_eq(json_integer_value(json_object_get(j, "block_size")), 256 * 1024);
	cr_assert_eq(json_integer_value(json_object_get(j, "queue_depth")), 4);
	cr_assert_eq(json_integer_value(json_object_get(j, "threads")), 1);
	cr_assert_eq(json_integer_value(json_object_get(j, "bytes")), 8 << 20);
	cr_assert(json_is_null(json_object_get(j, "read_GBps")), "read not run: null");
	cr_assert(json_is_null(json_object_get(j, "read_s")), "read not run: null");
	cr_assert(json_real_value(json_object_get(j, "write_GBps")) > 0);
	cr_assert(json_is_boolean(json_object_get(j, "registered")));
	cr_assert(json_is_false(json_object_get(j, "buffered")));
	cr_assert(json_is_true(json_object_get(j, "direct")));
	json_decref(j);
	cr_assert_eq(zc_count(s.dir), 0, "files removed");
	zc_scratch_fini(&s);
}

/* psync registers nothing: the report must not claim registered buffers. */
Test(bench_io, registered_reports_what_ran)
{
	struct zc_scratch s;
	zc_scratch_init(&s);
	char *argv[] = {"zinf", "bench",     "io",    "--path", s.dir, "--size",
			"4M",	"--backend", "psync", "--json", NULL};
	cr_assert_eq(zc_run(NULL, argv, s.out, s.err), 0);
	json_t *j = zc_json(s.out);
	cr_assert_str_eq(json_string_value(json_object_get(j, "backend")), "psync");
	cr_assert(json_is_false(json_object_get(j, "registered")), "psync registers no buffers");
	json_decref(j);
	char *argv2[] = {"zinf",   "bench", "io",	 "--path", s.dir,
			 "--size", "4M",    "--backend", "psync",  NULL};
	cr_assert_eq(zc_run(NULL, argv2, s.out, s.err), 0);
	char *t = zc_text(s.out);
	cr_assert(strstr(t, "not registered"), "%s", t);
	free(t);
	zc_scratch_fini(&s);
}

/*
 * A user without CAP_IPC_LOCK over `ulimit -l`: io_uring refuses to pin the buffer, the library
 * falls back with one warning naming `ulimit -l`; the report says "not registered" (it said
 * registered, and the warning was held back). Root drops the capability with setpriv(1).
 */
Test(bench_io, registration_refused_over_memlock_reported)
{
	const char *wrap = "";
	if (geteuid() == 0) {
		if (system("setpriv --help >/dev/null 2>&1") != 0) {
			cr_skip_test("setpriv(1) not installed: cannot drop CAP_IPC_LOCK");
		}
		wrap = "setpriv --bounding-set -ipc_lock --inh-caps -ipc_lock";
	}
	struct zc_scratch s;
	zc_scratch_init(&s);
	cr_assert_eq(zc_run_sh(&s, "ulimit -l 64", wrap,
			       "bench io --path '%s' --size 16M --mode write --json", s.dir),
		     0);
	json_t *j = zc_json(s.out);
	const char *be = json_string_value(json_object_get(j, "backend"));
	char *t = zc_text(s.err);
	if (strcmp(be, "io_uring") == 0) {
		cr_assert(json_is_false(json_object_get(j, "registered")),
			  "registered over memlock");
		cr_assert(strstr(t, "zinf: warning:") && strstr(t, "ulimit -l"), "%s", t);
		cr_assert_eq(zc_count_substr(t, "\n"), 1, "one warning:\n%s", t);
	}
	free(t);
	json_decref(j);
	zc_scratch_fini(&s);
}

Test(bench_io, sweep_prints_deepspeed_aio)
{
	struct zc_scratch s;
	zc_scratch_init(&s);
	char *argv[] = {"zinf",	   "bench",    "io", "--path",	  s.dir,   "--size", "4M",
			"--sweep", "--rounds", "1",  "--backend", "psync", "--json", NULL};
	cr_assert_eq(zc_run(NULL, argv, s.out, s.err), 0);
	json_t *j = zc_json(s.out);
	cr_assert_eq(json_array_size(json_object_get(j, "results")), 18);
	cr_assert_eq(json_integer_value(json_object_get(j, "rounds")), 1);
	json_t *aio = json_object_get(j, "aio");
	const char *keys[] = {"block_size",    "queue_depth",	 "intra_op_parallelism",
			      "single_submit", "overlap_events", "use_gds"};
	cr_assert_eq(json_object_size(aio), 6);
	for (size_t i = 0; i < 6; i++) {
		cr_assert_not_null(json_object_get(aio, keys[i]), "aio.%s", keys[i]);
	}
	json_t *best = json_object_get(j, "best");
	cr_assert_eq(json_integer_value(json_object_get(aio, "block_size")),
		     json_integer_value(json_object_get(best, "block_size")));
	cr_assert_eq(json_integer_value(json_object_get(aio, "intra_op_parallelism")),
		     json_integer_value(json_object_get(best, "threads")));
	json_decref(j);
	cr_assert_eq(zc_count(s.dir), 0);
	zc_scratch_fini(&s);
}

Test(bench_io, default_dir_created_and_removed)
{
	struct zc_scratch s;
	zc_scratch_init(&s);
	char *argv[] = {"zinf", "bench", "io", "--size", "4M", NULL};
	cr_assert_eq(zc_run(s.dir, argv, s.out, s.err), 0);
	char *t = zc_text(s.out);
	cr_assert(strstr(t, "zinf bench io:") && strstr(t, "./zinf-bench-io"), "%s", t);
	free(t);
	cr_assert_eq(zc_count(s.dir), 0, "./zinf-bench-io removed");
	zc_scratch_fini(&s);
}

/* 1 TiB of buffers: refused before anything is allocated, naming what to lower. */
Test(bench_io, memory_checked_before_allocating)
{
	struct zc_scratch s;
	zc_scratch_init(&s);
	char *argv[] = {"zinf",	 "bench",	 "io",	"--path",
			s.dir,	 "--size",	 "1T",	"--buffer-pattern",
			"small", "--threads",	 "64",	"--queue-depth",
			"4096",	 "--block-size", "64M", NULL};
	cr_assert_eq(zc_run(NULL, argv, s.out, s.err), 1);
	char *t = zc_text(s.err);
	cr_assert(strstr(t, "1.0 TiB needed") && strstr(t, "lower --queue-depth, --threads or "
							   "--block-size"),
		  "%s", t);
	free(t);
	cr_assert_eq(zc_count(s.dir), 0, "no file created");
	zc_scratch_fini(&s);
}

/* 2^32 tensors of 4 KiB: refused before the swap space is made (ids are 31-bit). */
Test(bench_io, tensor_count_checked)
{
	struct zc_scratch s;
	zc_scratch_init(&s);
	char *argv[] = {"zinf", "bench",	"io", "--path",		  s.dir,   "--size",
			"16T",	"--block-size", "4K", "--buffer-pattern", "small", NULL};
	cr_assert_eq(zc_run(NULL, argv, s.out, s.err), 1);
	char *t = zc_text(s.err);
	cr_assert(strstr(t, "--size 16 TiB in tensors of 4 KiB is 4294967296 tensors") &&
			  strstr(t, "raise --block-size"),
		  "%s", t);
	free(t);
	cr_assert_eq(zc_count(s.dir), 0, "no file created");
	zc_scratch_fini(&s);
}

/* --size 2^64 - 1: the tensor count must not wrap (it did: 0 tensors, a read past an empty
 * array, "cannot allocate 0 bytes"); in 1 GiB tensors it is too many, and --size is to lower. */
Test(bench_io, size_near_2_64_refused)
{
	struct zc_scratch s;
	zc_scratch_init(&s);
	char *argv[] = {"zinf", "bench", "io", "--path", s.dir, "--size", "18446744073709551615",
			NULL};
	cr_assert_eq(zc_run(NULL, argv, s.out, s.err), 1);
	char *t = zc_text(s.err);
	cr_assert(strstr(t, "is 17179869184 tensors, more than a swap space holds (2^31 - 1): "
			    "lower --size"),
		  "%s", t);
	free(t);
	char *argv2[] = {"zinf",
			 "bench",
			 "io",
			 "--path",
			 s.dir,
			 "--size",
			 "18446744073709551615",
			 "--block-size",
			 "1G",
			 "--buffer-pattern",
			 "small",
			 NULL};
	cr_assert_eq(zc_run(NULL, argv2, s.out, s.err), 1);
	t = zc_text(s.err);
	cr_assert(strstr(t, "is 17179869184 tensors") && strstr(t, "raise --block-size"), "%s", t);
	free(t);
	cr_assert_eq(zc_count(s.dir), 0, "no file created");
	zc_scratch_fini(&s);
}

/*
 * Under valgrind: no read of uninitialised memory (the statistics structs went to
 * zinf_io_get_stats without their size: an error printed now and then, max_inflight from the
 * stack). Skipped without valgrind.
 */
Test(bench_io, no_uninitialised_reads)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	cr_skip_test("a sanitizer build: valgrind does not run its binaries");
#endif
	if (system("valgrind --version >/dev/null 2>&1") != 0) {
		cr_skip_test("valgrind not installed");
	}
	struct zc_scratch s;
	zc_scratch_init(&s);
	int rc = zc_run_sh(&s, "", "valgrind -q --error-exitcode=99",
			   "bench io --path '%s' --size 4M --backend psync --json", s.dir);
	char *t = zc_text(s.err);
	cr_assert_eq(rc, 0, "%s", t);
	cr_assert_null(strstr(t, "zinf: error"), "%s", t);
	free(t);
	json_t *j = zc_json(s.out);
	cr_assert(zc_num(j, "max_inflight") >= 1);
	json_decref(j);
	zc_scratch_fini(&s);
}

/* A missing directory: one message naming it, not the library's and the CLI's both. */
Test(bench_io, error_printed_once)
{
	struct zc_scratch s;
	zc_scratch_init(&s);
	char missing[4300];
	snprintf(missing, sizeof(missing), "%s/no-such-dir", s.dir);
	char *argv[] = {"zinf", "bench", "io", "--path", missing, "--size", "4M", NULL};
	cr_assert_eq(zc_run(NULL, argv, s.out, s.err), 1);
	char *t = zc_text(s.err);
	/* the swap space's name carries its directory, so the path may stand twice in the line */
	cr_assert_eq(zc_count_substr(t, "No such file or directory"), 1, "printed once:\n%s", t);
	cr_assert(strstr(t, "no-such-dir"), "names the directory:\n%s", t);
	cr_assert_eq(zc_count_substr(t, "\n"), 1, "one line:\n%s", t);
	free(t);
	zc_scratch_fini(&s);
}

/* Start a 4 GiB run, wait for its file, send sig; the run must exit 128 + sig, no file left. */
static void
signal_mid_run(int sig)
{
	struct zc_scratch s;
	zc_scratch_init(&s);
	/* Big enough to be mid-run when the signal arrives, small enough to be cheap if not. */
	char *argv[] = {"zinf",	 "bench",	  "io", "--path",
			s.dir,	 "--size",	  "4G", "--buffer-pattern",
			"small", "--queue-depth", "4",	NULL};
	pid_t pid = zc_spawn(NULL, argv, s.out, s.err);
	for (int i = 0; i < 3000 && zc_count(s.dir) == 0; i++) {
		usleep(10000);
	}
	cr_assert(zc_count(s.dir) > 0, "no file appeared");
	usleep(100000);
	kill(pid, sig);
	cr_assert_eq(zc_status(pid), 128 + sig, "exit status after signal %d", sig);
	cr_assert_eq(zc_count(s.dir), 0, "files removed after signal %d", sig);
	char *t = zc_text(s.err);
	cr_assert(strstr(t, "interrupted"), "%s", t);
	free(t);
	zc_scratch_fini(&s);
}

Test(bench_io, sigint_cleans_up)
{
	signal_mid_run(SIGINT);
}

Test(bench_io, sighup_cleans_up)
{
	signal_mid_run(SIGHUP);
}

/* `ulimit -f 1024` (512 KiB): the run fails with a message, not SIGXFSZ, and leaves no file. */
Test(bench_io, file_size_limit_reported)
{
	struct zc_scratch s;
	zc_scratch_init(&s);
	cr_assert_eq(zc_run_sh(&s, "ulimit -f 1024", "", "bench io --path '%s' --size 8M", s.dir),
		     1);
	char *t = zc_text(s.err);
	cr_assert(strstr(t, "file size limit") && strstr(t, s.dir), "%s", t);
	free(t);
	cr_assert_eq(zc_count(s.dir), 0, "no file left");
	zc_scratch_fini(&s);
}

/* `ulimit -v` below the buffers: the refusal names the option to lower. */
Test(bench_io, address_space_limit_reported)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	cr_skip_test("a sanitizer build reserves more address space than the limit");
#endif
	struct zc_scratch s;
	zc_scratch_init(&s);
	cr_assert_eq(zc_run_sh(&s, "ulimit -v 400000", "", "bench io --path '%s' --size 2G", s.dir),
		     1);
	char *t = zc_text(s.err);
	cr_assert(strstr(t, "cannot allocate 1073741824 bytes of buffers") &&
			  strstr(t, "lower --size"),
		  "%s", t);
	free(t);
	cr_assert_eq(zc_count(s.dir), 0, "no file left");
	zc_scratch_fini(&s);
}

/* A pid that ran and is gone. */
static pid_t
dead_pid(void)
{
	pid_t p = fork();
	cr_assert(p >= 0);
	if (p == 0) {
		_exit(0);
	}
	waitpid(p, NULL, 0);
	return p;
}

static void
touch(const char *dir, const char *fmt, long pid)
{
	char name[256], path[4400];
	snprintf(name, sizeof(name), fmt, pid);
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f, "%s", path);
	fputs("leftover", f);
	fclose(f);
}

/* This host's part of scratch names. */
static const char *
host(void)
{
	static char h[ZINF_SCRATCH_HOST_MAX + 1];
	cr_assert_gt(zinf_scratch_host(h, sizeof(h)), 0);
	return h;
}

/*
 * What a kill -9 leaves (a swap file, its probe and its lock): the next run removes it and says
 * so in one line; it keeps a live owner's file, another host's files, files named so whose lock
 * is missing (each said in a line) and foreign files.
 */
Test(bench_io, killed_run_leftovers_reclaimed)
{
	struct zc_scratch s;
	zc_scratch_init(&s);
	long pid = dead_pid(), unlocked = dead_pid();
	char name[256];
	snprintf(name, sizeof(name), "zinf-bench-io-%s-%%ld-r0-data.0.swp", host());
	touch(s.dir, name, pid);
	touch(s.dir, name, (long)getpid()); /* a live owner */
	touch(s.dir, name, unlocked);	    /* no lock file: not known to be zinf's */
	snprintf(name, sizeof(name), ".zinf-bench-io-%s-%%ld-r0.0.probe", host());
	touch(s.dir, name, pid);
	snprintf(name, sizeof(name), "zinf-bench-io-%s-%%ld-r0.0.lock", host());
	touch(s.dir, name, pid);
	touch(s.dir, "zinf-bench-io-otherhost-%ld-r0-data.0.swp", pid); /* another host's */
	touch(s.dir, "zinf-bench-io-otherhost-%ld-r0.0.lock", pid);
	touch(s.dir, "other-%ld.txt", pid); /* not ours */
	char *argv[] = {"zinf", "bench", "io", "--path", s.dir, "--size", "4M", NULL};
	cr_assert_eq(zc_run(NULL, argv, s.out, s.err), 0);
	char *t = zc_text(s.err);
	char want[4400];
	snprintf(want, sizeof(want), "removed 3 files left in %s by an earlier run (pid %ld", s.dir,
		 pid);
	cr_assert(strstr(t, want), "%s", t);
	cr_assert(strstr(t, "still running; left alone"), "%s", t);
	snprintf(want, sizeof(want),
		 "%s holds 1 file named like this command's of pid %ld, which no longer runs, "
		 "without their lock file",
		 s.dir, unlocked);
	cr_assert(strstr(t, want), "%s", t);
	snprintf(want, sizeof(want), "%s holds 2 files of this command's runs on other hosts",
		 s.dir);
	cr_assert(strstr(t, want), "%s", t);
	free(t);
	cr_assert_eq(zc_count(s.dir), 5,
		     "the live owner's, the unlocked, the other host's two "
		     "and the foreign file stay");
	zc_scratch_fini(&s);
}

/*
 * A run whose pid this process cannot see (another pid namespace: a container sharing the
 * directory) but whose swap lock is held is alive: its files stay (they were removed).
 */
Test(bench_io, locked_files_of_an_unseen_pid_kept)
{
	struct zc_scratch s;
	zc_scratch_init(&s);
	long pid = dead_pid();
	char name[256];
	snprintf(name, sizeof(name), "zinf-bench-io-%s-%%ld-r0-data.0.swp", host());
	touch(s.dir, name, pid);
	snprintf(name, sizeof(name), "zinf-bench-io-%s-%%ld-r0.0.lock", host());
	touch(s.dir, name, pid);
	char lock[4400];
	snprintf(lock, sizeof(lock), "%s/zinf-bench-io-%s-%ld-r0.0.lock", s.dir, host(), pid);
	int fd = open(lock, O_RDWR);
	cr_assert(fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0, "%s", lock);
	char *argv[] = {"zinf", "bench", "io", "--path", s.dir, "--size", "4M", NULL};
	cr_assert_eq(zc_run(NULL, argv, s.out, s.err), 0);
	char *t = zc_text(s.err);
	cr_assert(strstr(t, "still running; left alone") && !strstr(t, "removed"), "%s", t);
	free(t);
	cr_assert_eq(zc_count(s.dir), 2, "the locked run's files stay");
	close(fd);
	/* released (the run died): the next run reclaims them */
	cr_assert_eq(zc_run(NULL, argv, s.out, s.err), 0);
	cr_assert_eq(zc_count(s.dir), 0);
	zc_scratch_fini(&s);
}

/* tmpfs has no O_DIRECT: refused without --buffered, runs with it. */
Test(bench_io, buffered_on_tmpfs)
{
	struct zc_scratch s;
	zc_scratch_init(&s);
	char *d = zc_tmpfs_dir();
	char *argv[] = {"zinf", "bench", "io", "--path", d, "--size", "4M", "--json", NULL};
	cr_assert_eq(zc_run(NULL, argv, s.out, s.err), 1, "O_DIRECT refused on tmpfs");
	char *t = zc_text(s.err);
	cr_assert(strstr(t, "zinf bench io: for a file system without O_DIRECT (tmpfs), add "
			    "--buffered"),
		  "%s", t);
	/* once: the swap space's refusal and the hint, not also the probe's (which names the
	 * library's ZINF_IO_BUFFERED, no option of the command) */
	cr_assert_eq(zc_count_substr(t, "\n"), 2, "two lines:\n%s", t);
	cr_assert_null(strstr(t, "ZINF_IO_BUFFERED"), "%s", t);
	free(t);
	char *argv2[] = {"zinf",   "bench", "io",	  "--path", d,
			 "--size", "4M",    "--buffered", "--json", NULL};
	cr_assert_eq(zc_run(NULL, argv2, s.out, s.err), 0);
	json_t *j = zc_json(s.out);
	cr_assert(json_is_true(json_object_get(j, "buffered")));
	cr_assert(json_is_false(json_object_get(j, "direct")), "tmpfs ran buffered, and says so");
	cr_assert_eq(json_integer_value(json_object_get(j, "bytes")), 4 << 20);
	json_decref(j);
	cr_assert_eq(zc_count(d), 0);
	zt_rmtree(d);
	free(d);
	zc_scratch_fini(&s);
}

Test(zinf, bench_help_lists_benchmarks)
{
	struct zc_scratch s;
	zc_scratch_init(&s);
	char *argv[] = {"zinf", "bench", "--help", NULL};
	cr_assert_eq(zc_run(NULL, argv, s.out, s.err), 0);
	char *t = zc_text(s.out);
	cr_assert(strstr(t, "  io ") && strstr(t, "  adam ") && strstr(t, "  step "), "%s", t);
	free(t);
	char *argv1[] = {"zinf", "bench", NULL};
	cr_assert_eq(zc_run(NULL, argv1, s.out, s.err), 2, "a group needs its command");
	t = zc_text(s.err);
	cr_assert(strstr(t, "usage: zinf bench <command>"), "%s", t);
	free(t);
	char *argv2[] = {"zinf", "bench", "stpe", NULL};
	cr_assert_eq(zc_run(NULL, argv2, s.out, s.err), 2);
	t = zc_text(s.err);
	cr_assert(strstr(t, "did you mean `zinf bench step`?"), "%s", t);
	free(t);
	zc_scratch_fini(&s);
}

Test(zinf, log_level_validated)
{
	struct zc_scratch s;
	zc_scratch_init(&s);
	char *argv[] = {"zinf", "version", NULL};
	setenv("ZINF_LOG_LEVEL", "verbose", 1);
	cr_assert_eq(zc_run(NULL, argv, s.out, s.err), 2);
	char *t = zc_text(s.err);
	cr_assert(strstr(t, "ZINF_LOG_LEVEL=verbose: expected error, warn, info or debug"), "%s",
		  t);
	free(t);
	setenv("ZINF_LOG_LEVEL", "debug", 1);
	cr_assert_eq(zc_run(NULL, argv, s.out, s.err), 0);
	setenv("ZINF_LOG_LEVEL", "2", 1);
	cr_assert_eq(zc_run(NULL, argv, s.out, s.err), 0);
	unsetenv("ZINF_LOG_LEVEL");
	zc_scratch_fini(&s);
}
