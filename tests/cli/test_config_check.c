/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/cli/test_config_check.c: `zinf config check` as a user runs it: Hugging Face's ZeRO-3
 * config with "auto" resolved from --hidden and the trainer's defaults, and its memory plan
 * per rank worked by hand; an NVMe config written into a scratch directory (fits, and then a
 * model too large for the disk: exit 1 naming the path); a misspelt key (exit 2 naming it, its
 * line and the nearest key); a million unknown keys (exit 2 in seconds, 21 lines).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli_run.h"
#include "common/test_util.h"

static struct zc_scratch sc;

static void
setup(void)
{
	zc_scratch_init(&sc);
}

static void
teardown(void)
{
	zc_scratch_fini(&sc);
}

TestSuite(config_check, .init = setup, .fini = teardown);

/* The bytes of the plan item whose description starts with `what` (and tier). */
static double
item(json_t *o, const char *tier, const char *what)
{
	size_t i;
	json_t *it;
	json_array_foreach(json_object_get(json_object_get(o, "plan"), "items"), i, it)
	{
		if (strcmp(json_string_value(json_object_get(it, "tier")), tier) == 0 &&
		    strncmp(json_string_value(json_object_get(it, "what")), what, strlen(what)) ==
			    0) {
			return zc_num(it, "bytes");
		}
	}
	return -1;
}

static const char *
resolved(json_t *o, const char *path)
{
	size_t i;
	json_t *r;
	json_array_foreach(json_object_get(o, "resolved"), i, r)
	{
		if (strcmp(json_string_value(json_object_get(r, "path")), path) == 0) {
			return json_string_value(json_object_get(r, "value"));
		}
	}
	return "(not resolved)";
}

Test(config_check, hf_zero3_auto_and_plan)
{
	cr_assert_eq(zc_run_sh(&sc, "", "",
			       "config check %s/tests/config/configs/hf_zero3.json --hidden 1024 "
			       "--world 2 --params 1e8 --json",
			       ZINF_SOURCE_DIR),
		     0);
	json_t *o = zc_json(sc.out);
	cr_expect(json_is_true(json_object_get(o, "ok")));
	/* hidden 1024: reduce_bucket_size 1024^2, prefetch 0.9 x 1024^2 (943718.4, floored),
	   persistence 10 x 1024; the batch from the trainer's default micro batch 8 x 2 ranks. */
	cr_expect_str_eq(resolved(o, "zero_optimization.reduce_bucket_size"), "1048576");
	cr_expect_str_eq(resolved(o, "zero_optimization.stage3_prefetch_bucket_size"), "943718");
	cr_expect_str_eq(resolved(o, "zero_optimization.stage3_param_persistence_threshold"),
			 "10240");
	cr_expect_str_eq(resolved(o, "train_batch_size"), "16");
	/* fp32 training (fp16/bf16 "auto" with the default --precision fp32): 4-byte parameters.
	   Stage 3, both offloaded to the CPU, 2 ranks: a rank owns 5e7 elements of each kind. */
	cr_expect_eq(item(o, "gpu", "gathered parameters"), 1e8 * 4); /* min(1e9 live, 1e8) */
	cr_expect_eq(item(o, "gpu", "gradient buckets"), 2 * 1048576.0 * 4);
	/* stage 3 on 2 ranks: each bucket's reduce-scatter receives its half */
	cr_expect_eq(item(o, "gpu", "reduce-scatter receive buffers"), 2 * 524288.0 * 4);
	cr_expect_eq(item(o, "gpu", "16-bit parameter"), -1); /* offloaded */
	cr_expect_eq(item(o, "pinned", "optimizer state"), 5e7 * 12);
	cr_expect_eq(item(o, "pinned", "fp32 gradient partition"), 5e7 * 4);
	cr_expect_eq(item(o, "pinned", "16-bit parameter partitions"), 5e7 * 4);
	/* CPU tier: the pool's buffers carry one sub-group's copy each: 4 x 5e7 x 4, aligned */
	double buf = item(o, "pinned", "optimizer swap buffers");
	cr_expect(buf >= 4 * 5e7 * 4 && buf < 4 * (5e7 * 4 + 4096), "%.0f", buf);
	json_decref(o);
}

/* The unresolved entry for path, or NULL. */
static json_t *
unresolved(json_t *o, const char *path)
{
	size_t i;
	json_t *r;
	json_array_foreach(json_object_get(o, "unresolved"), i, r)
	{
		if (strcmp(json_string_value(json_object_get(r, "path")), path) == 0) {
			return r;
		}
	}
	return NULL;
}

/*
 * Every configuration the repository ships (examples/gpt/configs/) passes `zinf config check
 * FILE` as the README writes it: exit 0, its "auto" values resolved as the Hugging Face Trainer
 * would (TrainingArguments' defaults), what only the trainer knows (its steps, the world size)
 * listed with the option that gives it, never a C struct; with those options nothing is left.
 */
static void
check_shipped(const char *name, bool batch_auto)
{
	cr_assert_eq(zc_run_sh(&sc, "", "", "config check %s/examples/gpt/configs/%s --json",
			       ZINF_SOURCE_DIR, name),
		     0, "%s: %s", name, zc_text(sc.err));
	char *err = zc_text(sc.err);
	cr_expect(strstr(err, "struct") == NULL, "%s: %s", name, err);
	free(err);
	json_t *o = zc_json(sc.out);
	cr_expect(json_is_true(json_object_get(o, "ok")), "%s", name);
	json_t *u = unresolved(o, "scheduler.params.total_num_steps");
	cr_assert_not_null(u, "%s", name);
	cr_expect(strstr(json_string_value(json_object_get(u, "give")), "--total-steps") != NULL);
	if (batch_auto) {
		/* the micro batch and the accumulation take Hugging Face's defaults, 8 and 1 */
		cr_expect_str_eq(resolved(o, "train_micro_batch_size_per_gpu"), "8", "%s", name);
		cr_expect_str_eq(resolved(o, "gradient_accumulation_steps"), "1", "%s", name);
		u = unresolved(o, "train_batch_size");
		cr_assert_not_null(u, "%s", name);
		cr_expect(strstr(json_string_value(json_object_get(u, "give")), "--world") != NULL);
		cr_expect(json_is_null(json_object_get(o, "world")));
	} else {
		/* zero3_2ranks: 32 = 16 x 1 x world: two ranks */
		cr_expect_eq(json_integer_value(json_object_get(o, "world")), 2, "%s", name);
	}
	json_decref(o);
	/* the text the README shows: exit 0, and the option named */
	cr_assert_eq(zc_run_sh(&sc, "", "", "config check %s/examples/gpt/configs/%s",
			       ZINF_SOURCE_DIR, name),
		     0, "%s", name);
	char *t = zc_text(sc.out);
	cr_expect(strstr(t, "scheduler.params.total_num_steps unresolved") != NULL &&
			  strstr(t, "--total-steps N") != NULL && strstr(t, "\nok\n") != NULL,
		  "%s: %s", name, t);
	free(t);
	/* given what the trainer gives, nothing is left */
	cr_assert_eq(zc_run_sh(&sc, "", "",
			       "config check %s/examples/gpt/configs/%s --world %d --total-steps "
			       "300 --json",
			       ZINF_SOURCE_DIR, name, batch_auto ? 1 : 2),
		     0, "%s", name);
	o = zc_json(sc.out);
	cr_expect_eq(json_array_size(json_object_get(o, "unresolved")), 0, "%s", name);
	cr_expect_str_eq(resolved(o, "scheduler.params.total_num_steps"), "300", "%s", name);
	json_decref(o);
}

Test(config_check, shipped_zero0_memory)
{
	check_shipped("zero0_memory.json", true);
}

Test(config_check, shipped_zero2_cpu)
{
	check_shipped("zero2_cpu.json", true);
}

Test(config_check, shipped_zero3_nvme)
{
	check_shipped("zero3_nvme.json", true);
}

Test(config_check, shipped_zero3_fp16)
{
	check_shipped("zero3_fp16.json", true);
}

Test(config_check, shipped_zero3_2ranks)
{
	check_shipped("zero3_2ranks.json", false);
}

/* Every file under examples/gpt/configs/, so that a configuration added there is checked too:
 * the README's command exits 0. */
Test(config_check, every_shipped_config)
{
	char dir[4200];
	snprintf(dir, sizeof(dir), "%s/examples/gpt/configs", ZINF_SOURCE_DIR);
	DIR *d = opendir(dir);
	cr_assert_not_null(d, "%s", dir);
	int n = 0;
	for (struct dirent *de; (de = readdir(d));) {
		size_t l = strlen(de->d_name);
		if (l < 5 || strcmp(de->d_name + l - 5, ".json") != 0) {
			continue;
		}
		n++;
		cr_expect_eq(zc_run_sh(&sc, "", "", "config check %s/%s", dir, de->d_name), 0,
			     "%s: %s", de->d_name, zc_text(sc.err));
	}
	closedir(d);
	cr_expect_geq(n, 5, "%d configurations", n);
}

static void
write_nvme_config(void)
{
	char path[4300];
	snprintf(path, sizeof(path), "%s/ds.json", sc.dir);
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fprintf(f,
		"{\n  \"train_micro_batch_size_per_gpu\": 1,\n  \"bf16\": {\"enabled\": true},\n"
		"  \"zero_optimization\": {\n    \"stage\": 3,\n    \"sub_group_size\": 1e6,\n"
		"    \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"%s\"},\n"
		"    \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"%s\", "
		"\"buffer_size\": 1e6}\n  }\n}\n",
		sc.dir, sc.dir);
	fclose(f);
}

Test(config_check, nvme_plan_and_free_space)
{
	write_nvme_config();
	cr_assert_eq(zc_run_sh(&sc, "", "", "config check %s/ds.json --world 2 --params 4e6 --json",
			       sc.dir),
		     0);
	json_t *o = zc_json(sc.out);
	/* 2e6 elements per rank: 12 bytes of fp32 Adam state, 2 of bf16 parameters, on NVMe; the
	   fp32 gradient partition pinned; 4 optimizer buffers of one sub-group (1e6 x (12 + 2),
	   aligned) and 5 parameter buffers of 1e6 bf16 elements. */
	cr_expect_eq(item(o, "nvme", "optimizer state"), 2e6 * 12);
	cr_expect_eq(item(o, "nvme", "16-bit parameter partitions"), 2e6 * 2);
	cr_expect_eq(item(o, "pinned", "fp32 gradient partition"), 2e6 * 4);
	cr_expect_eq(item(o, "pinned", "parameter swap buffers"), 5 * 1e6 * 2);
	double buf = item(o, "pinned", "optimizer swap buffers");
	cr_expect(buf >= 4 * 14e6 && buf < 4 * (14e6 + 4 * 4096), "%.0f", buf);
	json_decref(o);
	/* 1e15 parameters: 7e15 bytes per rank on the scratch disk. */
	cr_assert_eq(
		zc_run_sh(&sc, "", "", "config check %s/ds.json --world 2 --params 1e15", sc.dir),
		1);
	char *t = zc_text(sc.err);
	cr_expect(strstr(t, sc.dir) != NULL && strstr(t, "needed") != NULL, "%s", t);
	free(t);
}

/* Clipping with the step during backward: the speculative step's reserve, buffer_count (4)
 * sub-groups of 1e6 elements, each 12 bytes of fp32 Adam state and 2 of bf16 values, pinned
 * (the optimizer on the CPU); 5e6 elements per rank: 5 sub-groups, so all 4 slots. */
Test(config_check, speculative_step_reserve)
{
	char path[4300];
	snprintf(path, sizeof(path), "%s/clip.json", sc.dir);
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fprintf(f, "{\"train_micro_batch_size_per_gpu\": 1, \"gradient_clipping\": 1.0,\n"
		   " \"bf16\": {\"enabled\": true},\n"
		   " \"zero_optimization\": {\"stage\": 2, \"sub_group_size\": 1e6,\n"
		   "  \"offload_optimizer\": {\"device\": \"cpu\"}}}\n");
	fclose(f);
	cr_assert_eq(zc_run_sh(&sc, "", "", "config check %s --world 2 --params 1e7 --json", path),
		     0);
	json_t *o = zc_json(sc.out);
	cr_expect_eq(item(o, "pinned", "speculative step reserve"), 4 * 1e6 * 14);
	cr_expect_eq(item(o, "gpu", "speculative step reserve"), -1);
	json_decref(o);
}

/* A ZeRO-3 config with both tiers on NVMe under `path` and the aio section `aio`, in sc.dir. */
static void
write_infinity(const char *path, const char *aio)
{
	char cfg[4300];
	snprintf(cfg, sizeof(cfg), "%s/inf.json", sc.dir);
	FILE *f = fopen(cfg, "w");
	cr_assert_not_null(f);
	fprintf(f,
		"{\"train_micro_batch_size_per_gpu\": 1,\n"
		" \"zero_optimization\": {\"stage\": 3,\n"
		"  \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"%s\"},\n"
		"  \"offload_optimizer\": {\"device\": \"nvme\", \"nvme_path\": \"%s\"}},\n"
		" \"aio\": {%s}}\n",
		path, path, aio);
	fclose(f);
}

/* `zinf config check` of inf.json: exit `want`; for a refusal, each needle in stderr and the
 * verdict on stdout. */
static void
expect_check(int want, const char *what, const char *const *needles)
{
	cr_assert_eq(zc_run_sh(&sc, "", "", "config check %s/inf.json", sc.dir), want, "%s: %s",
		     what, zc_text(sc.err));
	char *err = zc_text(sc.err), *out = zc_text(sc.out);
	for (int i = 0; needles && needles[i]; i++) {
		cr_expect(strstr(err, needles[i]) != NULL, "%s: no <%s> in:\n%s", what, needles[i],
			  err);
	}
	if (want == 2) {
		cr_expect(strstr(out, "REFUSED: the engine's checks fail") != NULL, "%s: %s", what,
			  out);
	}
	free(err);
	free(out);
}

/*
 * The engine's own checks (zinf_engine_opts_check: what zinf_engine_create and the I/O set-up of
 * zinf_engine_init refuse) run in config check: each value the trainer refuses is refused here,
 * exit 2, naming the key and the value or path. Before, each of these said "ok".
 */
Test(config_check, refuses_what_the_engine_refuses)
{
	char file[4300], ro[4300];
	snprintf(file, sizeof(file), "%s/a-file", sc.dir);
	snprintf(ro, sizeof(ro), "%s/ro", sc.dir);
	FILE *f = fopen(file, "w");
	cr_assert_not_null(f);
	fclose(f);
	cr_assert_eq(mkdir(ro, 0700), 0);

	write_infinity(sc.dir, "\"block_size\": 1048576");
	expect_check(0, "a scratch directory", NULL);
	write_infinity(sc.dir, "\"block_size\": 1000");
	expect_check(2, "aio.block_size 1000",
		     (const char *const[]){"aio: block_size 1000", "power of two", NULL});
	write_infinity(sc.dir, "\"queue_depth\": 1e9");
	expect_check(2, "aio.queue_depth 1e9",
		     (const char *const[]){"queue_depth 1000000000", "max 4096", NULL});
	write_infinity(file, "");
	expect_check(2, "nvme_path a file",
		     (const char *const[]){"zero_optimization.offload_param.nvme_path", file,
					   "not a directory", NULL});
	write_infinity("/nonexistent/zinf", "");
	expect_check(2, "nvme_path missing",
		     (const char *const[]){"/nonexistent/zinf", "No such file", NULL});
	char *shm = zc_tmpfs_dir(); /* skips without a tmpfs */
	write_infinity(shm, "");
	expect_check(2, "tmpfs", (const char *const[]){shm, "O_DIRECT", NULL});
	zt_rmtree(shm);
	free(shm);
	int rc = zt_readonly_bind(ro);
	if (rc == 0) {
		write_infinity(ro, "");
		expect_check(2, "a read-only mount",
			     (const char *const[]){ro, "Read-only file system", NULL});
		zt_readonly_unbind(ro);
	} else {
		cr_skip_test("read-only mount: %s (the other values passed)", strerror(-rc));
	}
}

/* zinf_gpt's nvme_path "scratch" (a directory it makes under --scratch-parent) is checked as
 * that parent, and --nvme-path replaces every path, as zinf_gpt's flags do. */
Test(config_check, gpt_scratch_and_nvme_path)
{
	write_infinity("scratch", "");
	cr_assert_eq(zc_run_sh(&sc, "", "", "config check %s/inf.json --scratch-parent %s", sc.dir,
			       sc.dir),
		     0, "%s", zc_text(sc.err));
	cr_assert_eq(zc_run_sh(&sc, "", "",
			       "config check %s/inf.json --scratch-parent /nonexistent/zinf",
			       sc.dir),
		     2);
	char *err = zc_text(sc.err);
	cr_expect(strstr(err, "/nonexistent/zinf") != NULL, "%s", err);
	free(err);
	write_infinity("/nonexistent/zinf", "");
	cr_assert_eq(
		zc_run_sh(&sc, "", "", "config check %s/inf.json --nvme-path %s", sc.dir, sc.dir),
		0, "%s", zc_text(sc.err));
}

/* A file of a million unknown keys (made here): exit 2 in seconds, a screenful of messages (the
 * first 20 keys and the count), not a million lines. */
Test(config_check, a_million_unknown_keys)
{
	char path[4300];
	snprintf(path, sizeof(path), "%s/big.json", sc.dir);
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs("{\"train_batch_size\": 1", f);
	for (int i = 0; i < 1000000; i++) {
		fprintf(f, ",\n\"k%07d\": 0", i);
	}
	fputs("}\n", f);
	cr_assert_eq(fclose(f), 0);
	cr_assert_eq(zc_run_sh(&sc, "", "", "config check %s", path), 2);
	char *t = zc_text(sc.err);
	cr_expect_eq(zc_count_substr(t, "\n"), 21, "%s", t);
	cr_expect(strstr(t, "big.json:2: k0000000: unknown key") != NULL, "%s", t);
	cr_expect(strstr(t, "1000000 errors (the first 20 shown)") != NULL, "%s", t);
	free(t);
}

Test(config_check, misspelt_key)
{
	char path[4300];
	snprintf(path, sizeof(path), "%s/bad.json", sc.dir);
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs("{\n  \"train_batch_size\": 8,\n  \"zero_optimization\": {\n    \"stgae\": 2\n  "
	      "}\n}\n",
	      f);
	fclose(f);
	cr_assert_eq(zc_run_sh(&sc, "", "", "config check %s", path), 2);
	char *t = zc_text(sc.err);
	cr_expect(strstr(t, "bad.json:4") != NULL, "%s", t);
	cr_expect(strstr(t, "zero_optimization.stgae") != NULL, "%s", t);
	cr_expect(strstr(t, "stage") != NULL, "%s", t);
	free(t);
	cr_assert_eq(zc_run_sh(&sc, "", "", "config check"), 2);
}
