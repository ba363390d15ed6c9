/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/ckpt/test_ckpt_export_hf.c: zinf_ckpt_export_hf, on checkpoints that an engine saves
 * here of the Hugging Face fixtures' models (tests/fixtures/hf/: gpt2-tiny, llama-tiny),
 * registered as a trainer registers them (Hugging Face's names and shapes, GPT-2's Conv1D
 * weights as [out, in]) with the fixture's values:
 *  - the directory written holds the fixture's tensors, names, shapes and values bit for bit
 *    (GPT-2's transposed back), and its config.json is the fixture's, byte for byte; with
 *    buffers of 1, 7 and 1000 elements (a Conv1D weight then goes in bands of 1, of 7 columns
 *    with a last one shorter, and of several columns), and the default;
 *  - bf16: config.json's dtype becomes "bfloat16", every other key as it was;
 *  - shards: several files and the index, equal to the single file, and a single file written
 *    over them with overwrite leaves no shard or index behind;
 *  - refusals, each naming what differs, nothing written (the directory not even made): a
 *    config.json of another model (a tensor the checkpoint has that it lacks), a missing tensor
 *    (a tied checkpoint for an untied config), a Conv1D weight held as Hugging Face's [in, out],
 *    a checkpoint without shapes (1-D tensors), an existing config.json without overwrite.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/test_util.h"
#include "common/util.h" /* zc_test_alloc_fail_nth */
#include "zinf/checkpoint.h"
#include "zinf/engine.h"
#include "zinf/safetensors.h"

#define FIX ZINF_TEST_FIXTURES "/hf"

ZT_TMPDIR_SUITE(ckpt_export_hf);

/* How the checkpoint holds the fixture's tensors. */
enum layout {
	AS_TRAINER,  /* GPT-2's Conv1D weights [out, in]: what the export expects */
	AS_HF_FILES, /* every tensor as the file stores it (Conv1D [in, out]) */
	FLAT,	     /* every tensor 1-D (a trainer that gives no shapes) */
	NO_LM_HEAD,  /* lm_head.weight left out */
};

static bool
conv1d(const char *name)
{
	static const char *const s[] = {".attn.c_attn.weight", ".attn.c_proj.weight",
					".mlp.c_fc.weight", ".mlp.c_proj.weight"};
	size_t n = strlen(name);
	for (size_t i = 0; i < 4; i++) {
		size_t k = strlen(s[i]);
		if (n > k && !strcmp(name + n - k, s[i])) {
			return true;
		}
	}
	return false;
}

/* Save dir/ck: the fixture `model`'s tensors registered as `how` says, with its values. */
static void
save_checkpoint(const char *model, enum layout how)
{
	char p[4200];
	snprintf(p, sizeof(p), FIX "/%s", model);
	struct zinf_safetensors *st = NULL;
	cr_assert_eq(zinf_safetensors_open(p, &st), 0, "%s", zinf_last_error());
	struct zinf_engine_opts o;
	zinf_engine_opts_init(&o);
	o.device_backend = "host";
	o.comm_backend = "single";
	struct zinf_engine *e = NULL;
	cr_assert_eq(zinf_engine_create(&o, &e), 0, "%s", zinf_last_error());
	uint32_t n = zinf_safetensors_count(st);
	float **vals = calloc(n, sizeof(*vals));
	for (uint32_t i = 0; i < n; i++) {
		struct zinf_safetensors_info in = {.size = sizeof(in)};
		zinf_safetensors_info(st, i, &in);
		if (how == NO_LM_HEAD && !strcmp(in.name, "lm_head.weight")) {
			continue;
		}
		float *v = malloc(in.numel * sizeof(float));
		vals[i] = malloc(in.numel * sizeof(float));
		cr_assert_eq(zinf_safetensors_read(st, i, 0, in.numel, ZINF_F32, v), 0);
		struct zinf_param_desc d;
		zinf_param_desc_init(&d);
		d.name = in.name;
		d.numel = in.numel;
		d.layer = 0;
		d.ndim = how == FLAT ? 1 : in.ndim;
		d.shape[0] = how == FLAT ? in.numel : in.shape[0];
		d.shape[1] = in.shape[1];
		memcpy(vals[i], v, in.numel * sizeof(float));
		if (how == AS_TRAINER && conv1d(in.name)) { /* [in, out] -> [out, in] */
			uint64_t r = in.shape[0], c = in.shape[1];
			for (uint64_t a = 0; a < r; a++) {
				for (uint64_t b = 0; b < c; b++) {
					vals[i][b * r + a] = v[a * c + b];
				}
			}
			d.shape[0] = c;
			d.shape[1] = r;
		}
		free(v);
		d.init = vals[i];
		cr_assert_geq(zinf_engine_add_param(e, &d), 0, "%s", zinf_last_error());
	}
	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
	snprintf(p, sizeof(p), "%s/ck", dir);
	cr_assert_eq(zinf_engine_save(e, p, "step0", NULL), 0, "%s", zinf_last_error());
	zinf_engine_destroy(e);
	for (uint32_t i = 0; i < n; i++) {
		free(vals[i]);
	}
	free(vals);
	zinf_safetensors_close(st);
}

static struct zinf_ckpt *
open_ck(void)
{
	char p[4200];
	snprintf(p, sizeof(p), "%s/ck", dir);
	struct zinf_ckpt *c = NULL;
	cr_assert_eq(zinf_ckpt_open(p, NULL, &c), 0, "%s", zinf_last_error());
	return c;
}

/* Export dir/ck to dir/<out>; the return value. */
static int
export_to(const char *out, const char *config, int dtype, uint64_t shard, uint64_t buffer,
	  bool overwrite)
{
	struct zinf_ckpt *c = open_ck();
	struct zinf_ckpt_hf_opts o;
	zinf_ckpt_hf_opts_init(&o);
	o.config = config;
	o.dtype = dtype;
	if (shard) {
		o.shard_bytes = shard;
	}
	if (buffer) {
		o.buffer_bytes = buffer;
	}
	o.overwrite = overwrite;
	char p[4200];
	snprintf(p, sizeof(p), "%s/%s", dir, out);
	int rc = zinf_ckpt_export_hf(c, p, &o);
	zinf_ckpt_close(c);
	return rc;
}

/* Every tensor of a and b the same: names, shapes, stored types and bytes. */
static void
assert_same_tensors(const char *a_path, const char *b_path)
{
	char why[512];
	cr_assert_eq(zt_safetensors_diff(a_path, b_path, why, sizeof(why)), 0, "%s", why);
}

static char *
slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "%s", path);
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	rewind(f);
	char *s = malloc((size_t)n + 1);
	cr_assert_eq(fread(s, 1, (size_t)n, f), (size_t)n);
	s[n] = '\0';
	fclose(f);
	*len = (size_t)n;
	return s;
}

static void
assert_same_file(const char *a, const char *b)
{
	size_t la, lb;
	char *x = slurp(a, &la), *y = slurp(b, &lb);
	cr_assert(la == lb && memcmp(x, y, la) == 0, "%s differs from %s", a, b);
	free(x);
	free(y);
}

static bool
exists(const char *fmt, const char *name)
{
	char p[4200];
	struct stat st;
	snprintf(p, sizeof(p), fmt, dir, name);
	return lstat(p, &st) == 0;
}

Test(ckpt_export_hf, gpt2_transposed_back_in_bands_of_every_width)
{
	save_checkpoint("gpt2-tiny", AS_TRAINER);
	/* 8 bytes: 1-element pieces, bands of 1 column; 56: 7 columns (96 = 13 x 7 + 5, 32 = 4
	   x 7 + 4: a short last band); 8000: 1000 elements, bands of 31 (c_attn), 10 (c_fc); 0:
	   the default (one band) */
	const uint64_t buffers[] = {8, 56, 8000, 0};
	for (size_t k = 0; k < 4; k++) {
		char out[32], p[4200], q[4200];
		snprintf(out, sizeof(out), "out%zu", k);
		int rc = export_to(out, FIX "/gpt2-tiny/config.json", -1, 0, buffers[k], false);
		cr_assert_eq(rc, 1, "buffer %llu: %d %s", (unsigned long long)buffers[k], rc,
			     zinf_last_error());
		snprintf(p, sizeof(p), "%s/%s", dir, out);
		assert_same_tensors(p, FIX "/gpt2-tiny");
		assert_same_tensors(FIX "/gpt2-tiny", p);
		snprintf(q, sizeof(q), "%s/%s/config.json", dir, out);
		assert_same_file(q, FIX "/gpt2-tiny/config.json");
	}
}

Test(ckpt_export_hf, llama_equal_to_its_files_and_config)
{
	save_checkpoint("llama-tiny", AS_TRAINER);
	cr_assert_eq(export_to("out", FIX "/llama-tiny/config.json", -1, 0, 0, false), 1, "%s",
		     zinf_last_error());
	char p[4200];
	snprintf(p, sizeof(p), "%s/out", dir);
	assert_same_tensors(p, FIX "/llama-tiny");
	snprintf(p, sizeof(p), "%s/out/config.json", dir);
	assert_same_file(p, FIX "/llama-tiny/config.json");
	cr_assert(!exists("%s/out/%s", "model.safetensors.index.json"));
}

Test(ckpt_export_hf, bf16_sets_config_dtype_and_nothing_else)
{
	save_checkpoint("llama-tiny", AS_TRAINER);
	cr_assert_eq(export_to("out", FIX "/llama-tiny/config.json", ZINF_BF16, 0, 0, false), 1,
		     "%s", zinf_last_error());
	char p[4200];
	snprintf(p, sizeof(p), "%s/out/config.json", dir);
	json_error_t je;
	json_t *got = json_load_file(p, JSON_REJECT_DUPLICATES, &je);
	json_t *want = json_load_file(FIX "/llama-tiny/config.json", 0, &je);
	cr_assert_not_null(got, "%s: %s", p, je.text);
	cr_assert_str_eq(json_string_value(json_object_get(got, "dtype")), "bfloat16");
	cr_assert_str_eq(json_string_value(json_object_get(want, "dtype")), "float32");
	json_object_set_new(want, "dtype", json_string("bfloat16"));
	cr_assert(json_equal(got, want), "config.json changed beyond its dtype");
	/* the weights are stored bf16 (their values: tests/cli's test_checkpoint_hf) */
	struct zinf_safetensors *st = NULL;
	snprintf(p, sizeof(p), "%s/out", dir);
	cr_assert_eq(zinf_safetensors_open(p, &st), 0);
	struct zinf_safetensors_info in = {.size = sizeof(in)};
	zinf_safetensors_info(st, 0, &in);
	cr_assert_str_eq(in.dtype_name, "BF16");
	zinf_safetensors_close(st);
	json_decref(got);
	json_decref(want);
	/* the same export in f32 over it: config.json the fixture's bytes again */
	cr_assert_eq(export_to("out", FIX "/llama-tiny/config.json", ZINF_F32, 0, 0, true), 1);
	snprintf(p, sizeof(p), "%s/out/config.json", dir);
	assert_same_file(p, FIX "/llama-tiny/config.json");
}

Test(ckpt_export_hf, shards_equal_one_file_and_leave_nothing_stale)
{
	save_checkpoint("llama-tiny", AS_TRAINER);
	int n = export_to("sh", FIX "/llama-tiny/config.json", -1, 20000, 0, false);
	cr_assert_geq(n, 4, "%d shards (117 KiB in 20 KB shards): %s", n, zinf_last_error());
	char name[64];
	snprintf(name, sizeof(name), "model-00001-of-%05d.safetensors", n);
	cr_assert(exists("%s/sh/%s", name));
	cr_assert(exists("%s/sh/%s", "model.safetensors.index.json"));
	cr_assert(!exists("%s/sh/%s", "model.safetensors"));
	char p[4200];
	snprintf(p, sizeof(p), "%s/sh", dir);
	assert_same_tensors(p, FIX "/llama-tiny");
	/* one file over the shards: the shards and the index go */
	cr_assert_eq(export_to("sh", FIX "/llama-tiny/config.json", -1, 0, 0, true), 1);
	cr_assert(exists("%s/sh/%s", "model.safetensors"));
	cr_assert(!exists("%s/sh/%s", name));
	cr_assert(!exists("%s/sh/%s", "model.safetensors.index.json"));
	assert_same_tensors(p, FIX "/llama-tiny");
}

/* The export refused with -EINVAL or -EEXIST, its message holding every string of want, and
 * dir/out not made. */
static void
refused(const char *config, int want_rc, const char *const *want)
{
	int rc = export_to("out", config, -1, 0, 0, false);
	const char *msg = zinf_last_error();
	cr_assert_eq(rc, want_rc, "%d: %s", rc, msg);
	for (; *want; want++) {
		cr_assert(strstr(msg, *want), "\"%s\" not in: %s", *want, msg);
	}
	if (want_rc == -EINVAL) {
		cr_assert(!exists("%s/%s", "out"), "a refused export made its directory");
	}
}

Test(ckpt_export_hf, refuses_another_models_config)
{
	save_checkpoint("llama-tiny", AS_TRAINER);
	/* llama-tiny-tied: 1 layer, no lm_head */
	refused(FIX "/llama-tiny-tied/config.json", -EINVAL,
		(const char *const[]){"is no tensor of the llama model",
				      "llama-tiny-tied/config.json", "10 mismatches", NULL});
	refused(FIX "/gpt2-tiny/config.json", -EINVAL,
		(const char *const[]){"is no tensor of the gpt2 model", NULL});
}

Test(ckpt_export_hf, refuses_a_missing_tensor)
{
	save_checkpoint("llama-tiny", NO_LM_HEAD);
	refused(FIX "/llama-tiny/config.json", -EINVAL,
		(const char *const[]){"has lm_head.weight [96, 32]; the checkpoint has no such "
				      "tensor",
				      "1 mismatch ", NULL});
}

Test(ckpt_export_hf, refuses_conv1d_held_as_in_out)
{
	save_checkpoint("gpt2-tiny", AS_HF_FILES);
	/* c_attn [32, 96], c_fc [32, 128], mlp.c_proj [128, 32] as the file stores them: 3 a
	   layer; attn.c_proj [32, 32] cannot be told apart */
	refused(FIX "/gpt2-tiny/config.json", -EINVAL,
		(const char *const[]){"transformer.h.0.attn.c_attn.weight is [32, 96] in the "
				      "checkpoint",
				      "needs [96, 32] (a Conv1D weight, held as [out, in]",
				      "6 mismatches", NULL});
}

Test(ckpt_export_hf, refuses_a_checkpoint_without_shapes)
{
	save_checkpoint("llama-tiny", FLAT);
	refused(FIX "/llama-tiny/config.json", -EINVAL,
		(const char *const[]){"is [3072] in the checkpoint", "needs [96, 32]",
				      "saved without shapes", NULL});
}

Test(ckpt_export_hf, refuses_to_replace_without_overwrite)
{
	save_checkpoint("llama-tiny", AS_TRAINER);
	cr_assert_eq(export_to("out", FIX "/llama-tiny/config.json", -1, 0, 0, false), 1);
	char p[4200];
	snprintf(p, sizeof(p), "%s/out/model.safetensors", dir);
	struct stat before, after;
	cr_assert_eq(stat(p, &before), 0);
	refused(FIX "/llama-tiny/config.json", -EEXIST,
		(const char *const[]){"out/config.json: exists: not replaced", NULL});
	/* config.json gone: the weights' file refuses in its turn */
	snprintf(p, sizeof(p), "%s/out/config.json", dir);
	cr_assert_eq(unlink(p), 0);
	refused(FIX "/llama-tiny/config.json", -EEXIST,
		(const char *const[]){"model.safetensors", NULL});
	snprintf(p, sizeof(p), "%s/out/model.safetensors", dir);
	cr_assert_eq(stat(p, &after), 0);
	cr_assert(after.st_ino == before.st_ino && after.st_mtime == before.st_mtime,
		  "a refused export replaced model.safetensors");
	cr_assert(!exists("%s/out/%s", "config.json"));
}

Test(ckpt_export_hf, refuses_bad_arguments)
{
	save_checkpoint("llama-tiny", AS_TRAINER);
	refused(NULL, -EINVAL, (const char *const[]){"no config.json", NULL});
	refused(FIX "/llama-tiny/no-such.json", -ENOENT,
		(const char *const[]){"no-such.json", NULL});
	cr_assert_eq(export_to("out", FIX "/llama-tiny/config.json", 7, 0, 0, false), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "unknown dtype"), "%s", zinf_last_error());
}

/* Entries of dir/out (a temporary one included); -1 when there is no dir/out. */
static int
entries(void)
{
	char p[4200];
	snprintf(p, sizeof(p), "%s/out", dir);
	DIR *d = opendir(p);
	if (!d) {
		return -1;
	}
	int n = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
	}
	closedir(d);
	return n;
}

Test(ckpt_export_hf, every_allocation_failing_in_turn)
{
	save_checkpoint("gpt2-tiny", AS_TRAINER);
	struct zinf_ckpt *c = open_ck();
	struct zinf_ckpt_hf_opts o;
	zinf_ckpt_hf_opts_init(&o);
	o.config = FIX "/gpt2-tiny/config.json";
	o.dtype = ZINF_BF16;   /* config.json rewritten */
	o.shard_bytes = 20000; /* shards and their index */
	o.buffer_bytes = 4000; /* bands */
	char p[4200];
	snprintf(p, sizeof(p), "%s/out", dir);
	int failed = 0, rc = 0;
	for (long nth = 1; nth < 1000; nth++) {
		zc_test_alloc_fail_nth(nth);
		rc = zinf_ckpt_export_hf(c, p, &o);
		zc_test_alloc_fail_nth(0);
		cr_assert(rc >= 1 || rc == -ENOMEM, "allocation %ld failing: %d %s", nth, rc,
			  zinf_last_error());
		if (rc >= 1) {
			break;
		}
		int n = entries();
		cr_assert(n <= 0, "allocation %ld failing: %d files left in out", nth, n);
		failed++;
	}
	cr_assert_geq(rc, 2, "never succeeded, or one file: %d", rc);
	cr_expect_gt(failed, 5, "the export allocated less than expected");
	zinf_ckpt_close(c);
	snprintf(p, sizeof(p), "%s/out/config.json", dir);
	cr_assert_eq(access(p, R_OK), 0);
}
