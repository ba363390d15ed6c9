/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/cli/test_bench_adam.c: `zinf bench adam` run as a command with tiny sizes: its JSON
 * (the settings echoed, bytes per parameter worked by hand for each state and dtype, the ratio
 * consistent with the two bandwidths), --accuracy's two runs, and its refusals (ranges,
 * enumerations, combinations, memory).
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

/* One throughput run; checks the echo and bytes per parameter. */
static void
throughput(char *const argv[], double bytes_per, const char *state, const char *grad,
	   const char *copy)
{
	struct zc_scratch r;
	cr_assert_eq((zc_scratch_init(&r), zc_run(NULL, argv, r.out, r.err)), 0);
	json_t *j = zc_json(r.out);
	cr_assert_eq(zc_num(j, "params"), 100000);
	cr_assert_eq(zc_num(j, "reps"), 3);
	cr_assert_eq(zc_num(j, "threads"), 1);
	cr_assert_eq(zc_num(j, "bytes_per_param"), bytes_per);
	cr_assert_str_eq(json_string_value(json_object_get(j, "state")), state);
	cr_assert_str_eq(json_string_value(json_object_get(j, "grad_dtype")), grad);
	cr_assert_str_eq(json_string_value(json_object_get(j, "copy_dtype")), copy);
	double g = zc_num(j, "GBps"), s = zc_num(j, "stream_GBps");
	cr_assert(g > 0 && s > 0);
	cr_assert_float_eq(zc_num(j, "ratio"), g / s, 1e-9 * g / s);
	cr_assert_float_eq(zc_num(j, "params_per_s") * bytes_per / 1e9, g, 1e-9 * g);
	json_decref(j);
	zc_scratch_fini(&r);
}

Test(bench_adam, json_f32_state)
{
	/* p read+write 8, grad 4, m and v read+write 16, bf16 copy 2 */
	char *argv[] = {"zinf", "bench", "adam", "--params", "1e5", "--reps", "3", "--json", NULL};
	throughput(argv, 30, "f32", "f32", "bf16");
}

Test(bench_adam, json_bf16_state)
{
	/* p 8, bf16 grad 2, bf16 m and v read+write 8, no copy */
	char *argv[] = {"zinf", "bench",   "adam", "--params",	   "100000", "--reps",
			"3",	"--state", "bf16", "--grad-dtype", "bf16",   "--copy-dtype",
			"none", "--json",  NULL};
	throughput(argv, 18, "bf16", "bf16", "none");
}

/* --master bf16 with q8 m and v: the bf16 master 2 + 2, grad 4, q8 m and v read + write
 * 4 x 101564 / 1e5 (zinf_q8_bytes(1e5) = 1e5 + 4 x 391 scales), bf16 copy 2; and the plain step
 * with the same m and v timed in the same run, the speed its time over the master's. */
Test(bench_adam, json_bf16_master_against_the_plain_step)
{
	char *argv[] = {"zinf",	   "bench", "adam",	"--params", "100000", "--reps", "3",
			"--state", "q8",    "--master", "bf16",	    "--json", NULL};
	throughput(argv, 4 + 4 + 4 * 1.01564 + 2, "q8", "f32", "bf16");
	struct zc_scratch r;
	cr_assert_eq((zc_scratch_init(&r), zc_run(NULL, argv, r.out, r.err)), 0);
	json_t *j = zc_json(r.out);
	cr_assert_str_eq(json_string_value(json_object_get(j, "master")), "bf16");
	double t = zc_num(j, "step_s"), tp = zc_num(j, "plain_step_s");
	cr_assert(t > 0 && tp > 0);
	cr_assert_float_eq(zc_num(j, "speed_vs_plain"), tp / t, 1e-9 * tp / t);
	cr_assert_float_eq(zc_num(j, "plain_params_per_s"), 1e5 / tp, 1e-9 * 1e5 / tp);
	json_decref(j);
	zc_scratch_fini(&r);
}

Test(bench_adam, accuracy_two_runs)
{
	struct zc_scratch r;
	char *argv[] = {"zinf", "bench",   "adam", "--accuracy", "--params",
			"256",	"--steps", "50",   "--json",	 NULL};
	cr_assert_eq((zc_scratch_init(&r), zc_run(NULL, argv, r.out, r.err)), 0);
	char *t = zc_text(r.out);
	char *nl = strchr(t, '\n');
	cr_assert_not_null(nl);
	*nl = '\0';
	const double sigma[2] = {0.1, 0.0};
	const char *line[2] = {t, nl + 1};
	for (int k = 0; k < 2; k++) {
		json_error_t e;
		json_t *j = json_loads(line[k], JSON_DISABLE_EOF_CHECK, &e);
		cr_assert_not_null(j, "line %d: %s", k, e.text);
		cr_assert_eq(zc_num(j, "params"), 256);
		cr_assert_eq(zc_num(j, "steps"), 50);
		cr_assert_eq(zc_num(j, "noise_sigma"), sigma[k]);
		json_t *runs = json_object_get(j, "runs");
		cr_assert_eq(json_array_size(runs), 3);
		cr_assert_eq(zc_num(json_array_get(runs, 0), "param_rel_diff_vs_f32"), 0,
			     "f32 against itself");
		double d1 = zc_num(json_array_get(runs, 1), "param_rel_diff_vs_f32");
		cr_assert(d1 > 0 && d1 < 0.05, "bf16 state differs a little: %g", d1);
		cr_assert(zc_num(json_array_get(runs, 0), "final_loss") <
			  zc_num(j, "initial_loss"));
		json_decref(j);
	}
	free(t);
	zc_scratch_fini(&r);
}

static void
refused(char *const argv[], int want_rc, const char *want)
{
	struct zc_scratch r;
	cr_assert_eq((zc_scratch_init(&r), zc_run(NULL, argv, r.out, r.err)), want_rc);
	char *t = zc_text(r.err);
	cr_assert(strstr(t, want), "want '%s' in:\n%s", want, t);
	free(t);
	zc_scratch_fini(&r);
}

Test(bench_adam, refusals)
{
	char *a1[] = {"zinf", "bench", "adam", "--grad-dtype", "f8", NULL};
	refused(a1, 2, "--grad-dtype f8: expected f32, f16 or bf16");
	char *a2[] = {"zinf", "bench", "adam", "--reps", "0", NULL};
	refused(a2, 2, "--reps 0: must be in [1, 10000]");
	char *a3[] = {"zinf", "bench", "adam", "--three-pass", "--state", "bf16", NULL};
	refused(a3, 2, "--three-pass times f32 state only");
	char *a6[] = {"zinf", "bench", "adam", "--three-pass", "--master", "bf16", NULL};
	refused(a6, 2, "--three-pass times f32 state only (not --state f32 --master bf16)");
	char *a4[] = {"zinf", "bench", "adam", "--params", "1e13", NULL};
	refused(a4, 1, "lower --params");
	char *a5[] = {"zinf", "bench", "adam", "--param", "1e5", NULL};
	refused(a5, 2, "--param: unknown option; did you mean --params?");
}

/*
 * --params whose arrays' bytes pass 2^64: the memory check must see the true size (it wrapped,
 * the allocations of 0 bytes succeeded and the first touch crashed).
 */
Test(bench_adam, params_bytes_past_2_64_refused)
{
	char *a1[] = {"zinf",	      "bench", "adam", "--params", "4611686018427387904",
		      "--copy-dtype", "none",  NULL};
	refused(a1, 1, "lower --params");
	/* q8 m and v and a bf16 master: 4611686018427387904 x 4 is 2^64 (the f32 reference's m) */
	char *a3[] = {"zinf",	 "bench", "adam",     "--params", "4611686018427387904",
		      "--state", "q8",	  "--master", "bf16",	  "--copy-dtype",
		      "none",	 NULL};
	refused(a3, 1, "lower --params");
	/* 44 bytes a parameter: 419244183493398901 x 44 is 2^64 + 28 */
	char *a2[] = {"zinf", "bench", "adam", "--accuracy", "--params", "419244183493398901",
		      NULL};
	refused(a2, 1, "lower --params");
}

/* Under `ulimit -v` the --accuracy arrays cannot be had: an error naming --params, no crash. */
Test(bench_adam, accuracy_out_of_memory_reported)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	cr_skip_test("a sanitizer build reserves more address space than the limit");
#endif
	struct zc_scratch r;
	zc_scratch_init(&r);
	cr_assert_eq(zc_run_sh(&r, "ulimit -v 1000000", "", "bench adam --accuracy --params 1e8"),
		     1);
	char *t = zc_text(r.err);
	cr_assert(strstr(t, "out of memory") && strstr(t, "lower --params"), "%s", t);
	free(t);
	zc_scratch_fini(&r);
}

/* SIGINT stops --accuracy (it ran to its end before): exit 130 within seconds. */
Test(bench_adam, accuracy_stops_on_sigint)
{
	struct zc_scratch r;
	zc_scratch_init(&r);
	char *argv[] = {"zinf",	  "bench",   "adam", "--accuracy", "--params",
			"100000", "--steps", "1e9",  NULL};
	pid_t pid = zc_spawn(NULL, argv, r.out, r.err);
	usleep(500000);
	kill(pid, SIGINT);
	int st = 0;
	pid_t got = 0;
	for (int i = 0; i < 3000 && got == 0; i++) { /* 30 s at most, then it ignored SIGINT */
		got = waitpid(pid, &st, WNOHANG);
		if (got == 0) {
			usleep(10000);
		}
	}
	if (got == 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		cr_assert_fail("--accuracy still running 30 s after SIGINT");
	}
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGINT, "status %#x", st);
	zc_scratch_fini(&r);
}
