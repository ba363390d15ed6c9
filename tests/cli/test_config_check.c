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
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli_run.h"
#include "common/test_util.h"
#include "zinf/config.h"
#include "zinf/engine.h"

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

/* plan.engine[key] */
static double
eng(json_t *o, const char *key)
{
	return zc_num(json_object_get(json_object_get(o, "plan"), "engine"), key);
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
	   persistence 10 x 1024; the batch from Hugging Face's default micro batch 8 x 2 ranks. */
	cr_expect_str_eq(resolved(o, "zero_optimization.reduce_bucket_size"), "1048576");
	cr_expect_str_eq(resolved(o, "zero_optimization.stage3_prefetch_bucket_size"), "943718");
	cr_expect_str_eq(resolved(o, "zero_optimization.stage3_param_persistence_threshold"),
			 "10240");
	cr_expect_str_eq(resolved(o, "train_batch_size"), "16");
	/* the model: 1e8 parameters in layers of 12 x 1024^2 + 6 x 1024: 8 layers */
	json_t *plan = json_object_get(o, "plan");
	double P = 8 * (12.0 * 1024 * 1024 + 6 * 1024);
	cr_expect_eq(zc_num(plan, "layers"), 8);
	cr_expect_eq(zc_num(plan, "params"), P);
	/* fp32 training (fp16/bf16 "auto" resolve to off): 4-byte parameters. Stage 3, both
	   offloaded to the CPU, 2 ranks. */
	cr_expect_eq(item(o, "gpu", "gathered parameters"), P * 4); /* min(1e9 live, P) */
	/* the engine's bucket holds the largest parameter (fc1, 4 x 1024^2) whatever
	   reduce_bucket_size: two of them, and on 2 ranks each reduce-scatter receives half */
	cr_expect_eq(eng(o, "bucket_elems"), 4.0 * 1024 * 1024);
	cr_expect_eq(item(o, "gpu", "gradient buckets"), 2 * 4.0 * 1024 * 1024 * 4);
	cr_expect_eq(item(o, "gpu", "reduce-scatter receive buffers"), 2 * 2.0 * 1024 * 1024 * 4);
	cr_expect_eq(item(o, "gpu", "16-bit parameter"), -1); /* offloaded */
	/* pinned: the engine's pools (zinf_engine_plan), half the model per rank: the parameters'
	   CPU partitions (4 bytes each, each partition page-aligned) and the optimizer's state,
	   gradient and staging (12 + 4 bytes each, and more) */
	double param_pool = item(o, "pinned", "16-bit parameter partitions");
	double optim_pool = item(o, "pinned", "optimizer state");
	cr_expect(param_pool >= P / 2 * 4 && param_pool < P / 2 * 4 + 80 * 2 * 4096, "%.0f",
		  param_pool);
	cr_expect_gt(optim_pool, P / 2 * 16);
	cr_expect_eq(zc_num(plan, "pinned_bytes"), eng(o, "host_pool_bytes"));
	cr_expect_eq(param_pool + optim_pool, eng(o, "host_pool_bytes"));
	json_decref(o);
	/* no model shape, no plan: --hidden is needed */
	cr_assert_eq(zc_run_sh(&sc, "", "",
			       "config check %s/tests/config/configs/ds_zero1.json "
			       "--params 1e8",
			       ZINF_SOURCE_DIR),
		     2);
	char *t = zc_text(sc.err);
	cr_expect(strstr(t, "--hidden") != NULL, "%s", t);
	free(t);
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

/* --hf-config: the model's hidden size resolves "auto" (reduce_bucket_size = hidden^2) and its
 * parameter count makes the plan; a --hidden given wins. */
Test(config_check, hidden_and_parameters_from_a_hugging_face_config)
{
	char cfgf[4300], hf[4300];
	snprintf(cfgf, sizeof(cfgf), "%s/ds.json", sc.dir);
	snprintf(hf, sizeof(hf), "%s/config.json", sc.dir);
	FILE *f = fopen(cfgf, "w");
	cr_assert_not_null(f);
	fputs("{\"train_micro_batch_size_per_gpu\": 1,\n"
	      " \"zero_optimization\": {\"stage\": 3, \"reduce_bucket_size\": \"auto\"}}\n",
	      f);
	fclose(f);
	f = fopen(hf, "w");
	cr_assert_not_null(f);
	fputs("{\"model_type\": \"gpt2\", \"n_embd\": 768, \"n_head\": 12, \"n_layer\": 12,\n"
	      " \"n_positions\": 1024, \"vocab_size\": 50257}\n",
	      f);
	fclose(f);
	cr_assert_eq(zc_run_sh(&sc, "", "", "config check %s --hf-config %s", cfgf, sc.dir), 0,
		     "%s", zc_text(sc.err));
	char *t = zc_text(sc.out);
	cr_expect(strstr(t, "(gpt2): hidden 768, 124439808 parameters"), "%s", t);
	cr_expect(strstr(t, "reduce_bucket_size = 589824"), "768^2: %s", t);
	cr_expect(strstr(t, "memory plan per rank"), "%s", t);
	free(t);
	cr_assert_eq(
		zc_run_sh(&sc, "", "", "config check %s --hf-config %s --hidden 100", cfgf, hf), 0,
		"%s", zc_text(sc.err));
	t = zc_text(sc.out);
	cr_expect(strstr(t, "reduce_bucket_size = 10000"), "--hidden wins: %s", t);
	free(t);
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
write_nvme_config(const char *buffer_size)
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
		"\"buffer_size\": %s}\n  }\n}\n",
		sc.dir, sc.dir, buffer_size);
	fclose(f);
}

Test(config_check, nvme_plan_and_free_space)
{
	write_nvme_config("1e6");
	cr_assert_eq(zc_run_sh(&sc, "", "",
			       "config check %s/ds.json --world 2 --hidden 256 --params 4e6 --json",
			       sc.dir),
		     0, "%s", zc_text(sc.err));
	json_t *o = zc_json(sc.out);
	/* 6 layers of 12 x 256^2 + 6 x 256; a rank's flat partition, on NVMe: 12 bytes of fp32
	   Adam state and 4 of gradient (the window's spills), 2 of bf16 parameters */
	double part = eng(o, "partition_elems");
	cr_expect(part >= 6 * (12.0 * 65536 + 6 * 256) / 2, "%.0f", part);
	cr_expect_eq(item(o, "nvme", "optimizer state and gradients"), part * 16);
	cr_expect_eq(item(o, "nvme", "16-bit parameter partitions"), part * 2);
	/* pinned: 5 parameter buffers of the largest partition (fc1, 4 x 256^2 / 2 bf16), the
	   optimizer's 4 buffers of a sub-group, its window of min(4, sub-groups) sub-groups'
	   gradients */
	cr_expect_eq(item(o, "pinned", "parameter swap buffers"), 5 * 131072.0 * 2);
	/* and the cache (max_in_cpu, default 1e9 elements): capped at the rank's partitions, each
	   in 4 KiB units (60 of them) */
	double cache = item(o, "pinned", "16-bit parameter cache");
	cr_expect(cache >= part * 2 && cache <= part * 2 + 60 * 4096.0, "%.0f for %.0f", cache,
		  part * 2);
	cr_expect_gt(item(o, "pinned", "optimizer swap buffers"),
		     4 * eng(o, "max_sub_group_elems") * 14);
	double win = item(o, "pinned", "gradient window"), sg4 = eng(o, "max_sub_group_elems") * 4;
	double slots = fmin(4, eng(o, "sub_groups"));
	cr_expect(win >= slots * sg4 && win < slots * (sg4 + 4096) + 4096, "%.0f", win);
	json_decref(o);
	/* 1e14 parameters of hidden 2e5: partitions larger than offload_param.buffer_size (1e6
	   elements), which the engine's init refuses: so does the plan, naming the key */
	cr_assert_eq(zc_run_sh(&sc, "", "",
			       "config check %s/ds.json --world 2 --hidden 200000 --params 1e14",
			       sc.dir),
		     2, "%s", zc_text(sc.err));
	char *t = zc_text(sc.err);
	cr_expect(strstr(t, "offload_param.buffer_size") != NULL, "%s", t);
	free(t);
	/* with buffers that hold them: a petabyte per rank on the scratch disk */
	write_nvme_config("1e12");
	cr_assert_eq(zc_run_sh(&sc, "", "",
			       "config check %s/ds.json --world 2 --hidden 200000 --params 1e14",
			       sc.dir),
		     1, "%s", zc_text(sc.err));
	t = zc_text(sc.err);
	cr_expect(strstr(t, sc.dir) != NULL && strstr(t, "needed") != NULL, "%s", t);
	free(t);
	/* 1e15: past the engine's limit on a model's elements, refused as add_param refuses it */
	cr_assert_eq(zc_run_sh(&sc, "", "",
			       "config check %s/ds.json --world 2 --hidden 200000 --params 1e15",
			       sc.dir),
		     2, "%s", zc_text(sc.err));
	t = zc_text(sc.err);
	cr_expect(strstr(t, "ZINF_ENGINE_MAX_ELEMS") != NULL, "%s", t);
	free(t);
}

/* The model config check plans with (cli/config_check.c, zinf bench engine's layers): per
 * layer qkv 3 H^2, proj H^2, fc1 4 H^2, fc2 4 H^2 and six vectors of H, in this order. */
static const struct {
	const char *name;
	uint32_t h2, h;
} layer_shape[] = {
	{"ln1.weight", 0, 1},	  {"ln1.bias", 0, 1},	  {"attn.qkv", 3, 0}, {"attn.proj", 1, 0},
	{"attn.proj.bias", 0, 1}, {"ln2.weight", 0, 1},	  {"ln2.bias", 0, 1}, {"mlp.fc1", 4, 0},
	{"mlp.fc2", 4, 0},	  {"mlp.fc2.bias", 0, 1},
};

/* A real engine (host device, one rank) from `file` resolved with hidden h and 10 steps, its
 * NVMe paths in the scratch directory, over `layers` such layers: its host_pool_bytes after
 * init. */
static uint64_t
engine_pool_bytes(const char *file, uint64_t h, int layers)
{
	struct zinf_config_inputs in;
	struct zinf_train_config tc;
	zinf_config_inputs_init(&in);
	in.hidden_size = h;
	in.total_num_steps = 10;
	zinf_config_init(&tc);
	cr_assert_eq(zinf_config_read_file(file, &in, &tc), 0, "%s: %s", file, zinf_last_error());
	struct zinf_engine_opts eo = tc.engine;
	for (uint32_t i = 0; i < eo.offload_param.n_paths; i++) {
		eo.offload_param.nvme_path[i] = sc.dir;
	}
	for (uint32_t i = 0; i < eo.offload_optimizer.n_paths; i++) {
		eo.offload_optimizer.nvme_path[i] = sc.dir;
	}
	eo.device_backend = "host";
	eo.comm_backend = "single";
	struct zinf_engine *e = NULL;
	cr_assert_eq(zinf_engine_create(&eo, &e), 0, "%s: %s", file, zinf_last_error());
	for (int l = 0; l < layers; l++) {
		for (size_t j = 0; j < sizeof(layer_shape) / sizeof(layer_shape[0]); j++) {
			char name[64];
			struct zinf_param_desc d;
			zinf_param_desc_init(&d);
			snprintf(name, sizeof(name), "layer%d.%s", l, layer_shape[j].name);
			d.name = name;
			d.numel = layer_shape[j].h2 * h * h + layer_shape[j].h * h;
			d.layer = l;
			cr_assert_geq(zinf_engine_add_param(e, &d), 0, "%s", zinf_last_error());
		}
	}
	cr_assert_eq(zinf_engine_init(e), 0, "%s: %s", file, zinf_last_error());
	struct zinf_engine_stats st = {.size = sizeof(st)};
	cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
	zinf_engine_destroy(e);
	zinf_config_fini(&tc);
	return st.host_pool_bytes;
}

/*
 * The plan's host memory is the engine's: for every shipped configuration and the Hugging Face
 * ones, config check's pinned total equals the host_pool_bytes of a real engine made from the
 * same file over the same model (3 layers of hidden 64), and so does each pool's sum: some MiB
 * for zero3_nvme.json (buffers of the largest partition), not buffer_count x buffer_size
 * parameter buffers (3.0 GiB).
 */
Test(config_check, plan_equals_a_real_engine)
{
	static const char *const files[] = {
		"examples/gpt/configs/zero3_nvme.json", "examples/gpt/configs/zero2_cpu.json",
		"examples/gpt/configs/zero3_fp16.json", "examples/gpt/configs/zero0_memory.json",
		"tests/config/configs/hf_zero3.json",	"tests/config/configs/hf_zero2.json",
		"examples/gpt/configs/llama_nvme.json",
	};
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		char file[4300];
		snprintf(file, sizeof(file), "%s/%s", ZINF_SOURCE_DIR, files[i]);
		cr_assert_eq(zc_run_sh(&sc, "", "",
				       "config check %s --hidden 64 --layers 3 --world 1 "
				       "--total-steps 10 --nvme-path %s --json",
				       file, sc.dir),
			     0, "%s: %s", files[i], zc_text(sc.err));
		json_t *o = zc_json(sc.out);
		double pinned = zc_num(json_object_get(o, "plan"), "pinned_bytes");
		uint64_t real = engine_pool_bytes(file, 64, 3);
		cr_expect_eq(pinned, (double)real, "%s: the plan pins %.0f bytes, the engine %llu",
			     files[i], pinned, (unsigned long long)real);
		cr_expect_eq(eng(o, "host_pool_bytes"), (double)real, "%s", files[i]);
		if (strstr(files[i], "zero0")) {
			cr_expect_eq(real, 0, "%s: nothing offloaded", files[i]);
		} else {
			cr_expect_gt(real, 0, "%s", files[i]);
		}
		if (strstr(files[i], "zero3_nvme")) {
			cr_expect_lt(pinned, 64 << 20, "%s: %.0f bytes", files[i], pinned);
		}
		json_decref(o);
	}
	/* zero3_nvme.json with a parameter cache (offload_param.max_in_cpu 0 there): part of the
	   model (20000 elements), all of it (1e9, capped at the partitions) */
	char src[4300], buf[8192];
	snprintf(src, sizeof(src), "%s/examples/gpt/configs/zero3_nvme.json", ZINF_SOURCE_DIR);
	FILE *in = fopen(src, "r");
	cr_assert_not_null(in);
	size_t len = fread(buf, 1, sizeof(buf) - 1, in);
	fclose(in);
	buf[len] = 0;
	char *key = strstr(buf, "\"max_in_cpu\": 0");
	cr_assert_not_null(key, "zero3_nvme.json sets max_in_cpu 0");
	double plain = 0;
	static const char *const caches[] = {"0", "20000", "1e9"};
	for (size_t k = 0; k < 3; k++) {
		char file[4300];
		snprintf(file, sizeof(file), "%s/cache.json", sc.dir);
		FILE *f = fopen(file, "w");
		cr_assert_not_null(f);
		fprintf(f, "%.*s\"max_in_cpu\": %s%s", (int)(key - buf), buf, caches[k],
			key + strlen("\"max_in_cpu\": 0"));
		fclose(f);
		cr_assert_eq(zc_run_sh(&sc, "", "",
				       "config check %s --hidden 64 --layers 3 --world 1 "
				       "--total-steps 10 --nvme-path %s --json",
				       file, sc.dir),
			     0, "max_in_cpu %s: %s", caches[k], zc_text(sc.err));
		json_t *o = zc_json(sc.out);
		double pinned = zc_num(json_object_get(o, "plan"), "pinned_bytes");
		uint64_t real = engine_pool_bytes(file, 64, 3);
		cr_expect_eq(pinned, (double)real,
			     "max_in_cpu %s: the plan pins %.0f, the engine %llu", caches[k],
			     pinned, (unsigned long long)real);
		/* the cache on top of the buffers (the file's parameters are fp32): 20000 elements,
		   80000 bytes in 4 KiB units; all: more than that, within the model's
		   3 x (12 x 64^2 + 6 x 64) elements and 4 KiB for each of its 30 parameters */
		double cache = item(o, "pinned", "16-bit parameter cache");
		if (k == 0) {
			plain = pinned;
			cr_expect_eq(cache, -1, "no cache item: %.0f", cache);
		} else if (k == 1) {
			cr_expect_eq(pinned - plain, 81920, "%.0f", pinned - plain);
			cr_expect_eq(cache, 81920);
		} else {
			cr_expect(pinned - plain > 81920 &&
					  pinned - plain <=
						  3 * (12 * 64 * 64 + 6 * 64) * 4 + 30 * 4096,
				  "%.0f", pinned - plain);
			cr_expect_eq(cache, pinned - plain);
		}
		json_decref(o);
	}
}

/* Clipping with the step during backward: the speculative step's reserve, in the optimizer's
 * pool (the optimizer on the CPU), buffer_count (4) sub-groups of state and bf16 values; none
 * without clipping. */
Test(config_check, speculative_step_reserve)
{
	char path[4300];
	snprintf(path, sizeof(path), "%s/clip.json", sc.dir);
	for (int clip = 1; clip >= 0; clip--) {
		FILE *f = fopen(path, "w");
		cr_assert_not_null(f);
		fprintf(f,
			"{\"train_micro_batch_size_per_gpu\": 1, \"gradient_clipping\": %d,\n"
			" \"bf16\": {\"enabled\": true},\n"
			" \"zero_optimization\": {\"stage\": 2, \"sub_group_size\": 1e6,\n"
			"  \"offload_optimizer\": {\"device\": \"cpu\"}}}\n",
			clip);
		fclose(f);
		cr_assert_eq(zc_run_sh(&sc, "", "",
				       "config check %s --world 2 --hidden 256 --params 1e7 --json",
				       path),
			     0);
		json_t *o = zc_json(sc.out);
		double spec = eng(o, "speculation_bytes"), sg = eng(o, "max_sub_group_elems");
		if (clip) {
			cr_expect_geq(eng(o, "sub_groups"), 5);
			cr_expect_geq(spec, 4 * sg * 14, "%.0f", spec);
			cr_expect_lt(spec, 4 * (sg * 14 + 4 * 4096), "%.0f", spec);
		} else {
			cr_expect_eq(spec, 0);
		}
		cr_expect_eq(item(o, "gpu", "speculative step reserve"), -1);
		json_decref(o);
	}
}

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
 * exit 2, naming the key and the value or path, never "ok".
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
	char cfg0[4300];
	snprintf(cfg0, sizeof(cfg0), "%s/inf.json", sc.dir);
	FILE *f0 = fopen(cfg0, "w");
	cr_assert_not_null(f0);
	fprintf(f0,
		"{\"train_micro_batch_size_per_gpu\": 1, \"zero_optimization\": {\"stage\": 3,\n"
		" \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"%s\", "
		"\"buffer_size\": 0}}}\n",
		sc.dir);
	fclose(f0);
	expect_check(
		2, "offload_param.buffer_size 0 with nvme",
		(const char *const[]){"offload_param.buffer_size is 0 with device nvme", NULL});
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
