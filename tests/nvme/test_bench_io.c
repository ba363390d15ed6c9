// SPDX-License-Identifier: Apache-2.0
/*
 * tests/nvme/test_bench_io.c: the `zinf bench io` command as a user runs it ($ZINF_CLI, set by
 * CMake): its JSON output (keys, null for a mode not run), the DeepSpeed "aio" section of a
 * sweep, the default directory created and removed, and cleanup when interrupted (SIGINT:
 * exit 130, no file left). Bandwidth figures are not judged here (benchmarks, not tests).
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/test_util.h"

static const char *
cli(void)
{
	const char *p = getenv("ZINF_CLI");
	if (!p || access(p, X_OK) != 0) {
		cr_skip_test("ZINF_CLI not set or not executable (run through ctest)");
	}
	return p;
}

/* Start the CLI in cwd (NULL: here) with argv, stdout to out_path. */
static pid_t
spawn(const char *cwd, char *const argv[], const char *out_path)
{
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		if (cwd && chdir(cwd) != 0) {
			_exit(120);
		}
		int fd = open(out_path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
		if (fd < 0) {
			_exit(121);
		}
		dup2(fd, 1);
		execv(argv[0], argv);
		_exit(122);
	}
	return pid;
}

static int
status_of(pid_t pid)
{
	int st = 0;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st)
			     : 1000 + WTERMSIG(st); /* not 128+: exit 130 must be an exit */
}

static json_t *
load_json(const char *path)
{
	json_error_t e;
	json_t *j = json_load_file(path, 0, &e);
	cr_assert_not_null(j, "%s: not JSON: %s (line %d)", path, e.text, e.line);
	return j;
}

static int
count_entries(const char *dir)
{
	char cmd[4200];
	snprintf(cmd, sizeof(cmd), "ls -A '%s' | wc -l", dir);
	FILE *f = popen(cmd, "r");
	int n = -1;
	cr_assert(f && fscanf(f, "%d", &n) == 1);
	pclose(f);
	return n;
}

Test(bench_io, json_keys_and_null_mode)
{
	const char *z = cli();
	char *d = zt_mkdtemp(NULL);
	char out[4200];
	snprintf(out, sizeof(out), "%s.out", d);
	char *argv[] = {(char *)z, "bench",  "io",    "--path",	      d,      "--size",
			"8M",	   "--mode", "write", "--block-size", "256K", "--queue-depth",
			"4",	   "--json", NULL};
	cr_assert_eq(status_of(spawn(NULL, argv, out)), 0);
	json_t *j = load_json(out);
	const char *be = json_string_value(json_object_get(j, "backend"));
	cr_assert(be && (!strcmp(be, "io_uring") || !strcmp(be, "libaio") || !strcmp(be, "psync")),
		  "backend %s", be ? be : "(none)");
	cr_assert_eq(json_integer_value(json_object_get(j, "block_size")), 256 * 1024);
	cr_assert_eq(json_integer_value(json_object_get(j, "queue_depth")), 4);
	cr_assert_eq(json_integer_value(json_object_get(j, "threads")), 1);
	cr_assert_eq(json_integer_value(json_object_get(j, "bytes")), 8 << 20);
	cr_assert(json_is_null(json_object_get(j, "read_GBps")), "read not run: null");
	cr_assert(json_real_value(json_object_get(j, "write_GBps")) > 0);
	json_decref(j);
	cr_assert_eq(count_entries(d), 0, "files removed");
	unlink(out);
	zt_rmtree(d);
	free(d);
}

Test(bench_io, sweep_prints_deepspeed_aio)
{
	const char *z = cli();
	char *d = zt_mkdtemp(NULL);
	char out[4200];
	snprintf(out, sizeof(out), "%s.out", d);
	char *argv[] = {(char *)z, "bench",    "io", "--path",	  d,	   "--size", "4M",
			"--sweep", "--rounds", "1",  "--backend", "psync", "--json", NULL};
	cr_assert_eq(status_of(spawn(NULL, argv, out)), 0);
	json_t *j = load_json(out);
	cr_assert_eq(json_array_size(json_object_get(j, "results")), 18);
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
	cr_assert_eq(count_entries(d), 0);
	unlink(out);
	zt_rmtree(d);
	free(d);
}

Test(bench_io, default_dir_created_and_removed)
{
	const char *z = cli();
	char *d = zt_mkdtemp(NULL);
	char out[4200];
	snprintf(out, sizeof(out), "%s.out", d);
	char *argv[] = {(char *)z, "bench", "io", "--size", "4M", NULL};
	cr_assert_eq(status_of(spawn(d, argv, out)), 0);
	FILE *f = fopen(out, "r");
	char line[512] = "";
	cr_assert(f && fgets(line, sizeof(line), f));
	fclose(f);
	cr_assert(strstr(line, "zinf bench io:") && strstr(line, "./zinf-bench-io"), "%s", line);
	cr_assert_eq(count_entries(d), 0, "./zinf-bench-io removed");
	unlink(out);
	zt_rmtree(d);
	free(d);
}

Test(bench_io, interrupted_cleans_up)
{
	const char *z = cli();
	char *d = zt_mkdtemp(NULL);
	char out[4200];
	snprintf(out, sizeof(out), "%s.out", d);
	/* Big enough to be mid-run when the signal arrives, small enough to be cheap if not. */
	char *argv[] = {(char *)z, "bench",	    "io", "--path",
			d,	   "--size",	    "4G", "--buffer-pattern",
			"small",   "--queue-depth", "4",  NULL};
	pid_t pid = spawn(NULL, argv, out);
	/* Wait until the swap file exists, then interrupt. */
	for (int i = 0; i < 500 && count_entries(d) == 0; i++) {
		usleep(10000);
	}
	cr_assert(count_entries(d) > 0, "no file appeared");
	usleep(100000);
	kill(pid, SIGINT);
	cr_assert_eq(status_of(pid), 130, "exit status after SIGINT");
	cr_assert_eq(count_entries(d), 0, "files removed after SIGINT");
	unlink(out);
	zt_rmtree(d);
	free(d);
}
