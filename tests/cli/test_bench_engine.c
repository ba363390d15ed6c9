/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/cli/test_bench_engine.c: `zinf bench engine` run as a command on a tiny model (2 layers,
 * hidden 32: 2 x (12 x 32^2 + 6 x 32) = 24960 parameters). Variant "alone": option errors
 * refused with exit 2 before anything is created; stage 3 with both tiers on the CPU: the JSON's
 * fields, the parameter count worked by hand, the simulated compute at least the loop's length,
 * per step efficiency = max(compute, io_bound) / step recomputed, its median; both tiers on
 * NVMe: bytes moved, io_bound = the step's NVMe bytes / the disk rate, the disk file's size from
 * the largest step's bytes, files removed; --compare: the second arm with step_during_backward
 * off and as many bytes per step; --clip: its value in the JSON, the speculated sub-groups
 * never rolled back under a threshold above the norm, all of them under one below it. Variant
 * "mpi": two ranks under mpirun ($ZINF_MPIRUN), one JSON object (rank 0's), world 2. No timing is
 * asserted beyond signs and the compute loop's floor.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_run.h"
#include "common/test_util.h"

#define PARAMS_2x32 (2.0 * (12 * 32 * 32 + 6 * 32))

/* Run `zinf bench engine args...` in cwd; expect exit 2 and `want` on stderr, nothing made. */
static void
refused(const char *const *args, const char *want)
{
	char *argv[32] = {"zinf", "bench", "engine"};
	int k = 3;
	for (int i = 0; args[i] && k < 31; i++) {
		argv[k++] = (char *)args[i];
	}
	argv[k] = NULL;
	zc_refused(argv, want);
}

Test(bench_engine, option_errors)
{
	zc_need_variant("alone");
	const char *a1[] = {"--stage", "4", NULL};
	refused(a1, "--stage 4: must be in [0, 3]");
	const char *a2[] = {"--stage", "2", "--offload-param", "cpu", NULL};
	refused(a2, "--offload-param cpu needs --stage 3");
	const char *a3[] = {"--stage", "0", "--offload-optimizer", "nvme", NULL};
	refused(a3, "--offload-optimizer nvme needs --stage 1 or above");
	const char *a4[] = {"--compare", "--no-step-during-backward", NULL};
	refused(a4, "drop --no-step-during-backward");
	const char *a5[] = {"--hidden", "0", NULL};
	refused(a5, "--hidden 0: must be in [1, ");
	const char *a6[] = {"--offload-param", "disk", NULL};
	refused(a6, "--offload-param disk: expected none, cpu or nvme");
	const char *a7[] = {"--layers", "2", "--steps", "0", NULL};
	refused(a7, "--steps 0: must be in [1, ");
	const char *a8[] = {"--dtype", "f64", NULL};
	refused(a8, "--dtype f64: expected bf16, f16 or f32");
	const char *a9[] = {"--clip", "-1", NULL};
	refused(a9, "--clip -1: must be at least 0");
}

/* A model whose state cannot fit is refused before anything is allocated (it once tried to
 * allocate 60 GB), naming the options that lower it; on NVMe the host memory check passes. */
Test(bench_engine, model_larger_than_memory_refused_first)
{
	zc_need_variant("alone");
	struct zc_scratch sc;
	zc_scratch_init(&sc);
	int rc = zc_run_sh(&sc, "", "", "bench engine --hidden 1e5 --layers 1");
	char *t = zc_text(sc.err);
	cr_expect_eq(rc, 1, "exit %d: %s", rc, t);
	cr_expect(strstr(t, "the model's state in host memory (at least): 2.0 TiB needed") &&
			  strstr(t, "lower --hidden or --layers"),
		  "%s", t);
	cr_expect(strstr(t, "cannot allocate") == NULL, "allocated first: %s", t);
	free(t);
	zc_scratch_fini(&sc);
}

static double
num(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	cr_assert(json_is_number(v), "%s is not a number", key);
	return json_number_value(v);
}

static int
cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/*
 * An arm's figures (the top level, or "compare"): every field, per-step efficiency recomputed,
 * medians of the steps, compute at least the loop's length (2 layers x (1 + 2) x compute_ms).
 * The efficiency's plausibility (at most 1.5: a step no faster than half again its bound) is
 * asserted on the median: one step's I/O bound divides its bytes by the disk rate measured once
 * before the run, and on a loaded machine a single step has measured 2.5 and 5.1.
 */
static void
check_arm(json_t *o, int steps, double compute_ms, bool nvme, double disk_Bps)
{
	static const char *const keys[] = {
		"step_s",	   "compute_s",	      "io_bound_s",
		"exposed_fetch_s", "exposed_step_s",  "optimizer_s",
		"efficiency",	   "nvme_read_bytes", "nvme_write_bytes",
		"h2d_bytes",	   "d2h_bytes",	      "reduced_bytes",
		"gathered_bytes",  "sub_groups",      "stepped_during_backward",
		"rolled_back"};
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		cr_assert(json_is_number(json_object_get(o, keys[i])), "JSON lacks %s", keys[i]);
	}
	json_t *per = json_object_get(o, "per_step");
	cr_assert_eq(json_array_size(per), (size_t)steps);
	double eff[64], step[64];
	for (int i = 0; i < steps; i++) {
		json_t *s = json_array_get(per, i);
		double st = num(s, "step_s"), c = num(s, "compute_s"), io = num(s, "io_bound_s");
		cr_assert_gt(st, 0);
		cr_assert_geq(c, 2 * 3 * compute_ms / 1e3, "step %d: compute %g s", i, c);
		cr_assert_leq(c, st, "the compute loop runs inside the step");
		double bytes = num(s, "nvme_read_bytes") + num(s, "nvme_write_bytes");
		if (nvme) {
			cr_assert_gt(num(s, "nvme_read_bytes"), 0);
			cr_assert_gt(num(s, "nvme_write_bytes"), 0);
			cr_assert_float_eq(io, bytes / disk_Bps, 1e-9 * io, "step %d", i);
		} else {
			cr_assert_eq(bytes, 0);
			cr_assert_eq(io, 0);
		}
		double want = fmax(c, io) / st;
		eff[i] = num(s, "efficiency");
		step[i] = st;
		cr_assert_float_eq(eff[i], want, 1e-9 * want, "step %d: %g vs %g", i, eff[i], want);
		cr_assert(eff[i] > 0, "step %d: efficiency %g", i, eff[i]);
	}
	qsort(eff, (size_t)steps, sizeof(double), cmp);
	qsort(step, (size_t)steps, sizeof(double), cmp);
	cr_assert_eq(num(o, "efficiency"), eff[steps / 2], "median of the steps (odd count)");
	cr_assert_eq(num(o, "step_s"), step[steps / 2]);
	cr_assert(num(o, "efficiency") > 0 && num(o, "efficiency") <= 1.5);
	cr_assert_geq(num(o, "sub_groups"), 1);
	cr_assert_leq(num(o, "stepped_during_backward"), num(o, "sub_groups"));
	cr_assert_leq(num(o, "rolled_back"), num(o, "stepped_during_backward"));
}

/* The run's own fields: the model as asked, the RSS, the disk (or null). */
static void
check_run(json_t *j, int stage, const char *op, const char *oo)
{
	cr_assert_eq(num(j, "layers"), 2);
	cr_assert_eq(num(j, "hidden"), 32);
	cr_assert_eq(num(j, "params"), PARAMS_2x32);
	cr_assert_eq(num(j, "stage"), stage);
	cr_assert_str_eq(json_string_value(json_object_get(j, "offload_param")), op);
	cr_assert_str_eq(json_string_value(json_object_get(j, "offload_optimizer")), oo);
	cr_assert_gt(num(j, "rss_peak_bytes"), 1 << 20);
}

Test(bench_engine, json_tiny_cpu_tiers)
{
	zc_need_variant("alone");
	struct zc_scratch r;
	zc_scratch_init(&r);
	int st = zc_run_sh(&r, "", "",
			   "bench engine --layers 2 --hidden 32 --stage 3 --offload-param cpu "
			   "--offload-optimizer cpu --steps 3 --warmup 1 --compute-ms 2 --json");
	char *e = zc_text(r.err);
	cr_assert_eq(st, 0, "stderr: %s", e);
	free(e);
	json_t *j = zc_json(r.out);
	check_run(j, 3, "cpu", "cpu");
	cr_assert(json_is_null(json_object_get(j, "disk")), "no NVMe tier: no disk rate");
	cr_assert_eq(json_object_get(j, "compare"), NULL);
	cr_assert(json_is_true(json_object_get(j, "step_during_backward")));
	cr_assert_eq(num(j, "gradient_clipping"), 0, "--clip: off by default");
	check_arm(j, 3, 2, false, 0);
	json_decref(j);
	zc_scratch_fini(&r);
}

/* Both tiers on NVMe under the scratch directory (O_DIRECT: not tmpfs), compared. */
Test(bench_engine, json_tiny_nvme_tiers_compare)
{
	zc_need_variant("alone");
	struct zc_scratch r;
	zc_scratch_init(&r);
	int st = zc_run_sh(&r, "", "",
			   "bench engine --layers 2 --hidden 32 --stage 3 --offload-param nvme "
			   "--offload-optimizer nvme --nvme-path %s --steps 3 --warmup 1 "
			   "--compute-ms 1 --compare --json",
			   r.dir);
	char *e = zc_text(r.err);
	cr_assert_eq(st, 0, "stderr: %s", e);
	free(e);
	json_t *j = zc_json(r.out);
	check_run(j, 3, "nvme", "nvme");
	json_t *disk = json_object_get(j, "disk");
	cr_assert(json_is_object(disk), "an NVMe tier: the disk rate measured");
	double rate = num(disk, "GBps") * 1e9;
	cr_assert_gt(rate, 0);
	/* rate = 2 x bytes / (write + read) */
	double want = 2 * num(disk, "bytes") / (num(disk, "write_s") + num(disk, "read_s"));
	cr_assert_float_eq(rate, want, 1e-9 * want);
	check_arm(j, 3, 1, true, rate);
	json_t *c = json_object_get(j, "compare");
	cr_assert(json_is_object(c), "--compare: the second arm");
	cr_assert(json_is_true(json_object_get(j, "step_during_backward")));
	cr_assert(json_is_false(json_object_get(c, "step_during_backward")));
	cr_assert_eq(num(c, "stepped_during_backward"), 0, "stepping after backward only");
	check_arm(c, 3, 1, true, rate);
	/* The disk file: half of the largest step's NVMe bytes, in 4 KiB units. */
	double most = 0;
	json_t *arms[2] = {j, c};
	for (int a = 0; a < 2; a++) {
		json_t *per = json_object_get(arms[a], "per_step");
		for (size_t i = 0; i < json_array_size(per); i++) {
			json_t *s = json_array_get(per, i);
			most = fmax(most, num(s, "nvme_read_bytes") + num(s, "nvme_write_bytes"));
		}
	}
	uint64_t half = (uint64_t)most / 2;
	cr_assert_eq(num(disk, "bytes"), (double)((half + 4095) / 4096 * 4096));
	/* The same model: the same state bytes per step on both arms (the optimizer's part). */
	cr_assert_eq(num(j, "params"), PARAMS_2x32);
	json_decref(j);
	cr_assert_eq(zc_count(r.dir), 0, "swap files and the disk file removed");
	zc_scratch_fini(&r);
}

/*
 * --clip: gradient clipping on, the step during backward speculative. Sub-groups of at most
 * 4000 elements (whole parameters: 9 of them) and buckets of 4000, so that sub-groups become
 * final during backward;
 * the optimizer on NVMe (4 pool buffers: a reserve of 4). The gradients (1e-3 each) have a
 * norm of 1e-3 sqrt(24960) = 0.158: --clip 1e6 never clips (sub-groups speculated, none rolled
 * back), --clip 1e-3 always does (every speculated one rolled back).
 */
Test(bench_engine, clip_speculates)
{
	zc_need_variant("alone");
	const char *clips[] = {"1e6", "1e-3"};
	for (int i = 0; i < 2; i++) {
		struct zc_scratch r;
		zc_scratch_init(&r);
		int st = zc_run_sh(&r, "", "",
				   "bench engine --layers 2 --hidden 32 --stage 2 "
				   "--offload-optimizer nvme --nvme-path %s --sub-group-size 4000 "
				   "--bucket 4000 --steps 3 --warmup 1 --compute-ms 1 --clip %s "
				   "--json",
				   r.dir, clips[i]);
		char *e = zc_text(r.err);
		cr_assert_eq(st, 0, "stderr: %s", e);
		free(e);
		json_t *j = zc_json(r.out);
		cr_assert_eq(num(j, "gradient_clipping"), i == 0 ? 1e6 : 1e-3);
		check_arm(j, 3, 1, true, num(json_object_get(j, "disk"), "GBps") * 1e9);
		json_t *per = json_object_get(j, "per_step");
		for (size_t k = 0; k < json_array_size(per); k++) {
			json_t *s = json_array_get(per, k);
			double spec = num(s, "stepped_during_backward");
			cr_assert_gt(spec, 0, "--clip %s, step %zu: nothing speculated", clips[i],
				     k);
			cr_assert_leq(spec, 4, "a reserve of offload_optimizer.buffer_count");
			cr_assert_eq(num(s, "rolled_back"), i == 0 ? 0 : spec,
				     "--clip %s, step %zu", clips[i], k);
		}
		json_decref(j);
		zc_scratch_fini(&r);
	}
}

/* mpirun -np 2: one JSON object, from rank 0, world 2; an option error reported once. */
Test(bench_engine, mpirun_two_ranks)
{
	zc_need_variant("mpi");
	struct zc_scratch r;
	zc_scratch_init(&r);
	const char *args[] = {"bench",
			      "engine",
			      "--layers",
			      "2",
			      "--hidden",
			      "32",
			      "--stage",
			      "3",
			      "--offload-param",
			      "cpu",
			      "--offload-optimizer",
			      "cpu",
			      "--steps",
			      "3",
			      "--compute-ms",
			      "1",
			      "--json",
			      NULL};
	int st = zc_mpirun(2, args, r.out, r.err);
	char *e = zc_text(r.err);
	cr_assert_eq(st, 0, "stderr: %s", e);
	free(e);
	char *out = zc_text(r.out);
	cr_assert_eq(zc_count_substr(out, "\"rss_peak_bytes\""), 1, "rank 0 only: %s", out);
	free(out);
	json_t *j = zc_json(r.out);
	cr_assert_eq(num(j, "world"), 2);
	check_run(j, 3, "cpu", "cpu");
	check_arm(j, 3, 1, false, 0);
	/* Stage 3 on two ranks: gradients reduce-scattered, parameters gathered. */
	cr_assert_gt(num(j, "reduced_bytes"), 0);
	cr_assert_gt(num(j, "gathered_bytes"), 0);
	json_decref(j);
	const char *bad[] = {"bench", "engine", "--stage", "2", "--offload-param", "cpu", NULL};
	cr_assert_neq(zc_mpirun(2, bad, r.out, r.err), 0);
	e = zc_text(r.err);
	cr_assert_eq(zc_count_substr(e, "--offload-param cpu needs --stage 3"), 1,
		     "reported once: %s", e);
	free(e);
	zc_scratch_fini(&r);
}

/*
 * --checkpoint DIR: the state's bytes worked out (2 layers of hidden 32: PARAMS_2x32 elements of
 * 12 bytes of AdamW state, one rank), the save and load timed, the bound from the reference
 * measured in DIR (one write, plus one read with the optimizer on NVMe), the background save's
 * fields present, and the checkpoint left in DIR loadable by name ("bench").
 */
Test(bench_engine, checkpoint_timed_against_the_disk)
{
	zc_need_variant("alone");
	struct zc_scratch r;
	zc_scratch_init(&r);
	int st = zc_run_sh(&r, "", "",
			   "bench engine --layers 2 --hidden 32 --stage 3 --offload-param nvme "
			   "--offload-optimizer nvme --nvme-path %s/nv --steps 2 --warmup 1 "
			   "--compute-ms 1 --checkpoint %s/ck --json",
			   r.dir, r.dir);
	char *e = zc_text(r.err);
	cr_assert_eq(st, 0, "stderr: %s", e);
	free(e);
	json_t *j = zc_json(r.out);
	json_t *k = json_object_get(j, "checkpoint");
	cr_assert(json_is_object(k), "no checkpoint object");
	cr_assert_eq(num(k, "state_bytes"), (double)PARAMS_2x32 * 12);
	cr_assert_gt(num(k, "save_s"), 0);
	cr_assert_gt(num(k, "load_s"), 0);
	double scale = num(k, "state_bytes") / num(k, "ref_bytes");
	double bound = scale * (num(k, "ref_write_s") + num(k, "ref_read_s"));
	cr_assert_float_eq(num(k, "bound_s"), bound, 1e-9 * bound);
	cr_assert_float_eq(num(k, "save_efficiency"), bound / num(k, "save_s"), 1e-9);
	cr_assert_geq(num(k, "background_hidden_s"), 0);
	cr_assert_gt(num(k, "background_step_s"), 0);
	json_decref(j);
	char p[8300];
	snprintf(p, sizeof(p), "%s/ck/bench/manifest.json", r.dir);
	FILE *f = fopen(p, "r");
	cr_assert_not_null(f, "%s missing", p);
	fclose(f);
	zc_scratch_fini(&r);
}

/*
 * --master bf16 with each --optimizer-state, both tiers on NVMe: the JSON names them, and the
 * optimizer's NVMe bytes per parameter per step fall by 8 with the bf16 master: the bench's
 * parameters are bf16, so the master is their bits and shares their home (engine/README.md), and
 * the fp32 master's 4 read and 4 written go entirely: 24 -> 16 with f32 m and v, 16 -> 8 with
 * bf16, 12.0625 -> 4.0625 with q8 (these whole-parameter sub-groups are one q8 array each; their
 * scales: the 0.03 per direction that the f32 master measures the same). The 16-bit parameters'
 * writes (2 per parameter) do not change, nor their reads (the whole model is in the default
 * cache, so the master's fill reads no file).
 */
Test(bench_engine, bf16_master_saves_eight_optimizer_bytes_per_param)
{
	zc_need_variant("alone");
	static const char *const states[] = {"f32", "bf16", "q8"};
	for (int s = 0; s < 3; s++) {
		double optim[2] = {0, 0}, param_rd[2] = {0, 0};
		for (int m = 0; m < 2; m++) {
			struct zc_scratch r;
			zc_scratch_init(&r);
			int st = zc_run_sh(&r, "", "",
					   "bench engine --layers 2 --hidden 32 --stage 3 "
					   "--offload-param nvme --offload-optimizer nvme "
					   "--nvme-path %s --steps 2 --warmup 1 --compute-ms 0 "
					   "--optimizer-state %s --master %s --json",
					   r.dir, states[s], m ? "bf16" : "f32");
			char *e = zc_text(r.err);
			cr_assert_eq(st, 0, "%s %d stderr: %s", states[s], m, e);
			free(e);
			json_t *j = zc_json(r.out);
			cr_assert_str_eq(json_string_value(json_object_get(j, "master")),
					 m ? "bf16" : "f32");
			cr_assert_str_eq(json_string_value(json_object_get(j, "optimizer_state")),
					 states[s]);
			json_t *b = json_object_get(json_object_get(j, "nvme_bytes_per_param"),
						    "optim");
			cr_assert(json_is_object(b), "nvme_bytes_per_param.optim");
			cr_assert_eq(num(b, "read"), num(b, "written"),
				     "%s: as much read as written", states[s]);
			optim[m] = num(b, "read") + num(b, "written");
			json_t *p = json_object_get(json_object_get(j, "nvme_bytes_per_param"),
						    "param");
			cr_assert_eq(num(p, "written"), 2.0, "%s master %d", states[s], m);
			param_rd[m] = num(p, "read");
			json_decref(j);
			zc_scratch_fini(&r);
		}
		double want = s == 0 ? 24 : s == 1 ? 16 : 12;
		cr_assert(optim[0] >= want && optim[0] < want + 0.1, "%s: f32 master %.4f bytes",
			  states[s], optim[0]);
		cr_assert_eq(optim[0] - optim[1], 8.0, "%s: %.4f -> %.4f bytes per parameter",
			     states[s], optim[0], optim[1]);
		cr_assert_eq(param_rd[0], param_rd[1], "%s: the parameters read %.4f -> %.4f",
			     states[s], param_rd[0], param_rd[1]);
	}
}
