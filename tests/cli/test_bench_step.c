/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/cli/test_bench_step.c: `zinf bench step` run as a command with tiny sizes: its JSON
 * (the sizes asked for echoed, the bytes the step moved worked by hand, the efficiency
 * recomputed from the per-round figures it reports), options out of range refused with the
 * range named (never truncated or clamped), and the memory check made before the pool is.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_run.h"
#include "common/test_util.h"
#include "zinf/blocks/swap.h"

static double
at(json_t *j, const char *key, size_t i)
{
	json_t *v = json_array_get(json_object_get(j, key), i);
	cr_assert(json_is_number(v), "%s[%zu] is not a number", key, i);
	return json_number_value(v);
}

static int
cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

Test(bench_step, json_tiny)
{
	char *d = zt_mkdtemp(NULL);
	char out[4200], err[4200];
	snprintf(out, sizeof(out), "%s.out", d);
	snprintf(err, sizeof(err), "%s.err", d);
	/* 250000 elements in sub-groups of 100000: 3 sub-groups, the last one 50000. */
	char *argv[] = {"zinf",	 "bench",     "step", "--params", "250000", "--sub-group",
			"1e5",	 "--buffers", "2",    "--steps",  "3",	    "--backend",
			"psync", "--path",    d,      "--json",	  NULL};
	int rc = zc_run(NULL, argv, out, err);
	char *e = zc_text(err);
	cr_assert_eq(rc, 0, "stderr: %s", e);
	free(e);
	json_t *j = zc_json(out);
	cr_assert_eq(zc_num(j, "params"), 250000);
	cr_assert_eq(zc_num(j, "sub_group"), 100000);
	cr_assert_eq(zc_num(j, "sub_groups"), 3);
	cr_assert_eq(zc_num(j, "buffers"), 2);
	cr_assert_eq(zc_num(j, "buffers_in_flight"), 2);
	cr_assert_eq(zc_num(j, "steps"), 3);
	cr_assert_str_eq(json_string_value(json_object_get(j, "backend")), "psync");
	cr_assert(json_is_boolean(json_object_get(j, "pinned")));
	/* master, m and v of every element, 4 bytes each, read once and written once */
	cr_assert_eq(zc_num(j, "read_bytes"), 250000.0 * 3 * 4);
	cr_assert_eq(zc_num(j, "write_bytes"), 250000.0 * 3 * 4);
	cr_assert_eq(zc_num(j, "io_bytes"), 2 * 250000.0 * 3 * 4, "io alone moves the same bytes");
	cr_assert_eq(json_array_size(json_object_get(j, "step_s_all")), 3);
	/* efficiency_all[i] = max(io_s[i] * step bytes / io bytes, adam_s[i]) / step_s[i] */
	double e3[3], sb = zc_num(j, "read_bytes") + zc_num(j, "write_bytes");
	for (size_t i = 0; i < 3; i++) {
		double iob = at(j, "io_s_all", i) * sb / zc_num(j, "io_bytes");
		double want = fmax(iob, at(j, "adam_s_all", i)) / at(j, "step_s_all", i);
		e3[i] = at(j, "efficiency_all", i);
		cr_assert_float_eq(e3[i], want, 1e-9 * want, "round %zu: %g vs %g", i, e3[i], want);
		cr_assert(e3[i] > 0 && isfinite(e3[i]));
		/* Adam inside the step is part of the step's time. */
		cr_assert_leq(at(j, "adam_in_step_s_all", i), at(j, "step_s_all", i));
	}
	qsort(e3, 3, sizeof(double), cmp);
	cr_assert_eq(zc_num(j, "efficiency"), e3[1], "efficiency is the median of rounds");
	const char *bound = json_string_value(json_object_get(j, "bound"));
	cr_assert(bound && (!strcmp(bound, "io") || !strcmp(bound, "adam")));
	json_decref(j);
	cr_assert_eq(zc_count(d), 0, "swap files removed");
	unlink(out);
	unlink(err);
	zt_rmtree(d);
	free(d);
}

Test(bench_step, out_of_range_is_an_error)
{
	char *a1[] = {"zinf", "bench", "step", "--params", "1000", "--steps", "5000", NULL};
	zc_refused(a1, "--steps 5000: must be in [1, 1000]");
	char *a2[] = {"zinf", "bench", "step", "--params", "1000", "--buffers", "4294967297", NULL};
	zc_refused(a2, "--buffers 4294967297: must be in [1, 1024]");
	char *a3[] = {"zinf", "bench", "step", "--params", "1000", "--block-size", "3K", NULL};
	zc_refused(a3, "--block-size 3K: must be in [4K, 1G]");
	char *a4[] = {"zinf", "bench", "step", "--params", "1000", "--block-size", "12K", NULL};
	zc_refused(a4, "--block-size 12K: must be a power of two");
	char *a5[] = {"zinf", "bench", "step", "--steps", "2", NULL};
	zc_refused(a5, "--params is required");
	char *a6[] = {"zinf", "bench", "step", "--params", "1.5", NULL};
	zc_refused(a6, "--params 1.5: not a whole number");
	char *a7[] = {"zinf", "bench", "step", "--params", "1000", "--schedule", "fast", NULL};
	zc_refused(a7, "--schedule fast: expected zinf or deepspeed");
}

/* 4 buffers of 1e11 elements x 12 bytes: refused before the pool, naming what to lower. */
Test(bench_step, memory_checked_before_allocating)
{
	char *d = zt_mkdtemp(NULL);
	char err[4200];
	snprintf(err, sizeof(err), "%s.err", d);
	char *argv[] = {"zinf",	       "bench", "step",	  "--params", "1e12",
			"--sub-group", "1e11",	"--path", d,	      NULL};
	cr_assert_eq(zc_run(NULL, argv, NULL, err), 1);
	char *t = zc_text(err);
	cr_assert(strstr(t, "needed, more than 90% of the machine's") &&
			  strstr(t, "lower --buffers or --sub-group"),
		  "%s", t);
	free(t);
	cr_assert_eq(zc_count(d), 0, "no file created");
	unlink(err);
	zt_rmtree(d);
	free(d);
}

/* A killed run's swap file and its lock (its pid no longer runs) are removed by the next run,
 * which says so. */
Test(bench_step, killed_run_leftovers_reclaimed)
{
	char *d = zt_mkdtemp(NULL);
	char out[4200], err[4200], path[4400];
	snprintf(out, sizeof(out), "%s.out", d);
	snprintf(err, sizeof(err), "%s.err", d);
	pid_t dead = fork();
	cr_assert(dead >= 0);
	if (dead == 0) {
		_exit(0);
	}
	waitpid(dead, NULL, 0);
	char host[ZINF_SCRATCH_HOST_MAX + 1];
	cr_assert_gt(zinf_scratch_host(host, sizeof(host)), 0);
	static const char *const left[] = {"r0-fp32.0.swp", "r0.0.lock"};
	for (int i = 0; i < 2; i++) {
		snprintf(path, sizeof(path), "%s/zinf-bench-step-%s-%ld-%s", d, host, (long)dead,
			 left[i]);
		FILE *f = fopen(path, "w");
		cr_assert_not_null(f);
		fclose(f);
	}
	char *argv[] = {"zinf", "bench",  "step", "--params", "1000", "--steps",
			"1",	"--path", d,	  "--json",   NULL};
	cr_assert_eq(zc_run(NULL, argv, out, err), 0);
	char *t = zc_text(err);
	char want[128];
	snprintf(want, sizeof(want), "removed 2 files left in %s by an earlier run (pid %ld", d,
		 (long)dead);
	cr_assert(strstr(t, want), "%s", t);
	free(t);
	cr_assert_eq(zc_count(d), 0);
	unlink(out);
	unlink(err);
	zt_rmtree(d);
	free(d);
}

/* tmpfs: refused without --buffered, with a hint naming it; runs with it and says so. The
 * sub-group reported is the one that ran (the partition is smaller than --sub-group). */
Test(bench_step, buffered_on_tmpfs)
{
	struct zc_scratch s;
	zc_scratch_init(&s);
	char *d = zc_tmpfs_dir();
	char *argv[] = {"zinf", "bench",  "step", "--params", "1000", "--steps",
			"1",	"--path", d,	  "--json",   NULL};
	cr_assert_eq(zc_run(NULL, argv, s.out, s.err), 1);
	char *t = zc_text(s.err);
	cr_assert(strstr(t, "zinf bench step: for a file system without O_DIRECT (tmpfs), add "
			    "--buffered"),
		  "%s", t);
	/* once: the swap space's refusal and the hint, not also the probe's (which names the
	 * library's ZINF_IO_BUFFERED, no option of the command) */
	cr_assert_eq(zc_count_substr(t, "\n"), 2, "two lines:\n%s", t);
	cr_assert_null(strstr(t, "ZINF_IO_BUFFERED"), "%s", t);
	free(t);
	char *argv2[] = {"zinf", "bench",  "step", "--params",	 "1000",   "--steps",
			 "1",	 "--path", d,	   "--buffered", "--json", NULL};
	cr_assert_eq(zc_run(NULL, argv2, s.out, s.err), 0);
	json_t *j = zc_json(s.out);
	cr_assert(json_is_true(json_object_get(j, "buffered")));
	cr_assert(json_is_false(json_object_get(j, "direct")));
	cr_assert_eq(zc_num(j, "sub_group"), 1000, "the sub-group that ran, not the 1e7 default");
	cr_assert_eq(zc_num(j, "read_bytes"), 1000 * 3 * 4);
	json_decref(j);
	cr_assert_eq(zc_count(d), 0);
	zt_rmtree(d);
	free(d);
	zc_scratch_fini(&s);
}

/* --optimizer and --state: the parts the step moves are the optimizer's (bytes worked by hand:
 * master 4 + m, v 2 each for bf16 Adam; master 4 + one 4-byte part for Adagrad and Lion), the
 * io reference moves the same parts, and a state the optimizer has not is refused. */
Test(bench_step, optimizer_and_state_parts)
{
	static const struct {
		const char *opt, *state;
		double bytes_per_param;
	} cases[] = {{"adamw", "bf16", 8},
		     {"adagrad", "f32", 8},
		     {"lion", "f32", 8},
		     {"adam", "f32", 12}};
	char *d = zt_mkdtemp(NULL);
	char out[4200], err[4200];
	snprintf(out, sizeof(out), "%s.out", d);
	snprintf(err, sizeof(err), "%s.err", d);
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		char *argv[] = {"zinf",
				"bench",
				"step",
				"--params",
				"150000",
				"--sub-group",
				"1e5",
				"--steps",
				"1",
				"--optimizer",
				(char *)cases[c].opt,
				"--state",
				(char *)cases[c].state,
				"--path",
				d,
				"--json",
				NULL};
		int rc = zc_run(NULL, argv, out, err);
		char *e = zc_text(err);
		cr_assert_eq(rc, 0, "%s/%s: %s", cases[c].opt, cases[c].state, e);
		free(e);
		json_t *j = zc_json(out);
		cr_assert_str_eq(json_string_value(json_object_get(j, "optimizer")), cases[c].opt);
		cr_assert_str_eq(json_string_value(json_object_get(j, "state")), cases[c].state);
		cr_assert_eq(zc_num(j, "state_bytes_per_param"), cases[c].bytes_per_param);
		double want = 150000.0 * cases[c].bytes_per_param;
		cr_assert_eq(zc_num(j, "read_bytes"), want, "%s", cases[c].opt);
		cr_assert_eq(zc_num(j, "write_bytes"), want, "%s", cases[c].opt);
		cr_assert_eq(zc_num(j, "io_bytes"), 2 * want, "io alone moves the same parts");
		json_decref(j);
	}
	/* q8: sub-groups of 100000 and 50000 elements, each m and v n + 4 * ceil(n / 256) bytes:
	 * 150000 * 4 + 2 * ((100000 + 4 * 391) + (50000 + 4 * 196)) = 904696 each way */
	char *aq[] = {"zinf",	     "bench",  "step",	  "--params", "150000",
		      "--sub-group", "1e5",    "--steps", "1",	      "--state",
		      "q8",	     "--path", d,	  "--json",   NULL};
	cr_assert_eq(zc_run(NULL, aq, out, err), 0, "%s", zc_text(err));
	json_t *j = zc_json(out);
	cr_assert_str_eq(json_string_value(json_object_get(j, "state")), "q8");
	cr_assert_eq(zc_num(j, "read_bytes"), 904696);
	cr_assert_eq(zc_num(j, "write_bytes"), 904696);
	cr_assert_eq(zc_num(j, "io_bytes"), 2 * 904696, "io alone moves the same parts");
	cr_assert(fabs(zc_num(j, "io_bytes_per_param") - 2 * 904696 / 150000.0) < 1e-9);
	json_decref(j);
	/* --master bf16: the master in 2 bytes, with q8 (904696 - 2 * 150000 = 604696 each way)
	 * and with f32 m and v (10 bytes per parameter); refused for lion */
	char *am[] = {"zinf", "bench",	 "step", "--params", "150000", "--sub-group",
		      "1e5",  "--steps", "1",	 "--state",  "q8",     "--master",
		      "bf16", "--path",	 d,	 "--json",   NULL};
	cr_assert_eq(zc_run(NULL, am, out, err), 0, "%s", zc_text(err));
	j = zc_json(out);
	cr_assert_str_eq(json_string_value(json_object_get(j, "master")), "bf16");
	cr_assert_eq(zc_num(j, "read_bytes"), 604696);
	cr_assert_eq(zc_num(j, "write_bytes"), 604696);
	json_decref(j);
	am[10] = "f32";
	cr_assert_eq(zc_run(NULL, am, out, err), 0, "%s", zc_text(err));
	j = zc_json(out);
	cr_assert_eq(zc_num(j, "state_bytes_per_param"), 10);
	cr_assert_eq(zc_num(j, "read_bytes"), 150000.0 * 10);
	json_decref(j);
	char *al[] = {"zinf", "bench",	  "step", "--params", "150000", "--optimizer",
		      "lion", "--master", "bf16", "--path",   d,	NULL};
	cr_assert_eq(zc_run(NULL, al, out, err), 1);
	char *el = zc_text(err);
	cr_assert(strstr(el, "optimizer lion: master_dtype bf16 is not supported (f32 only)"), "%s",
		  el);
	free(el);
	char *argv[] = {"zinf", "bench",   "step", "--params", "150000", "--optimizer",
			"lion", "--state", "bf16", "--path",   d,	 NULL};
	cr_assert_eq(zc_run(NULL, argv, out, err), 1);
	char *e = zc_text(err);
	cr_assert(strstr(e, "optimizer lion: state_dtype bf16 is not supported (f32 only)"), "%s",
		  e);
	cr_assert_eq(zc_count_substr(e, "\n"), 1, "printed once: %s", e);
	free(e);
	cr_assert_eq(zc_count(d), 0, "swap files removed");
	unlink(out);
	unlink(err);
	zt_rmtree(d);
	free(d);
}

/*
 * SIGINT at several points of the rounds: exit 130, files removed, one line saying so, and no
 * error: a step cut short by the interrupt used to add the library's "sub-group N was never
 * made ready" (an error about its own break). One buffer: the step is half of each round.
 */
Test(bench_step, sigint_mid_step_prints_no_error)
{
	for (int i = 0; i < 12; i++) {
		struct zc_scratch s;
		zc_scratch_init(&s);
		char *argv[] = {"zinf",	       "bench",	 "step",      "--params", "4e6",
				"--sub-group", "5e4",	 "--buffers", "1",	  "--steps",
				"1000",	       "--path", s.dir,	      NULL};
		pid_t pid = zc_spawn(NULL, argv, s.out, s.err);
		/* its files appear after it catches signals */
		for (int w = 0; w < 3000 && zc_count(s.dir) == 0; w++) {
			usleep(10000);
		}
		usleep(300000 + 130000 * (useconds_t)i);
		kill(pid, SIGINT);
		int st = zc_status(pid);
		char *t = zc_text(s.err);
		cr_assert_eq(st, 128 + SIGINT, "attempt %d: %s", i, t);
		cr_assert_null(strstr(t, "zinf: error"), "attempt %d:\n%s", i, t);
		cr_assert(strstr(t, "interrupted (signal 2); files removed"), "%s", t);
		free(t);
		cr_assert_eq(zc_count(s.dir), 0, "files removed");
		zc_scratch_fini(&s);
	}
}

/* `ulimit -v` below the pool: the library's refusal, then the options to lower. */
Test(bench_step, address_space_limit_names_options)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	cr_skip_test("a sanitizer build reserves more address space than the limit");
#endif
	struct zc_scratch s;
	zc_scratch_init(&s);
	cr_assert_eq(
		zc_run_sh(&s, "ulimit -v 400000", "", "bench step --params 1e8 --path '%s'", s.dir),
		1);
	char *t = zc_text(s.err);
	cr_assert(strstr(t, "pinned pool") && strstr(t, "lower --buffers or --sub-group"), "%s", t);
	cr_assert_eq(zc_count_substr(t, "\n"), 2, "%s", t);
	free(t);
	cr_assert_eq(zc_count(s.dir), 0, "no file left");
	zc_scratch_fini(&s);
}
