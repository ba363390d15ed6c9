/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/ckpt/test_ckpt.c: zinf_engine_save / zinf_engine_load in one process (comm "single",
 * device "host"): resume is exact (N steps straight equal k steps, save, a new engine loaded
 * from the checkpoint, N - k steps: bit for bit, for every stage and tier, fp32 and bf16, loaded
 * in place of init and into a running engine); the trainer's blob round-trips; every refusal
 * (bad tag, inside a window, other parameters, other optimizer, a corrupted, truncated or
 * deleted file, a held lock) names what is wrong and leaves the engine usable; a process killed
 * at every point of a save (by its own progress hook, zinf_ckpt_opts.progress, and at random
 * moments) leaves a checkpoint that loads and equals the reference of its own step count, never
 * a mix; the hook hears every point in order, on the publishing thread; the library never kills
 * (an environment variable once made it). Several ranks and other world sizes:
 * test_ckpt_ranks.c. What a load restores into a trained engine: test_ckpt_resume.c; the
 * directory on the file system: test_ckpt_fs.c.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/test_util.h"
#include "engine/engine_drive.h"
#include "engine/engine_ref.h"
#include "zinf/checkpoint.h"
#include "zinf/engine.h"

#define QUANTUM 0x1p-14f
#define GAS	2

#include "ckpt/ckpt_test.h"

static bool exists(const char *dir, const char *name);

struct cfg {
	int stage;
	enum zinf_offload_device opt, param;
	enum zinf_dtype dtype;
};

static const char *const tier[] = {"none", "cpu", "nvme"};

static struct zinf_engine *
make(const struct cfg *c, const char *nvme, const char *load_dir, int *load_rc)
{
	struct zinf_engine_opts o;
	edrive_opts(&o, "single", c->stage, c->opt, c->param, nvme, c->dtype, GAS);
	struct zinf_engine *e = NULL;
	int rc = zinf_engine_create(&o, &e);
	cr_assert_eq(rc, 0, "create: %d %s", rc, zinf_last_error());
	rc = edrive_add_params(e);
	cr_assert_eq(rc, 0, "add_params: %d %s", rc, zinf_last_error());
	if (load_dir) {
		rc = zinf_engine_load(e, load_dir, NULL, NULL);
		if (load_rc) {
			*load_rc = rc;
			return e;
		}
		cr_assert_eq(rc, 0, "load: %d %s", rc, zinf_last_error());
	} else {
		rc = zinf_engine_init(e);
		cr_assert_eq(rc, 0, "init: %d %s", rc, zinf_last_error());
	}
	return e;
}

/* The test's two scratch directories, removed and freed. */
static void
rm_dirs(char *nvme, char *ck)
{
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
	free(ck);
}

/* The reference after `steps` steps (one rank). */
static void
reference(struct eref_result *ref, enum zinf_dtype dtype, int steps)
{
	struct eref_opts ro = {
		.world = 1, .steps = steps, .gas = GAS, .dtype = dtype, .quantum = QUANTUM};
	edrive_optimizer(&ro.opt);
	int rc = eref_train(&ro, ref);
	cr_assert_eq(rc, 0, "eref_train: %d", rc);
}

/* N = 4 steps straight, and 2 + save + load (in place of init, or into an initialised engine)
 * + 2: the same master weights bit for bit, equal to the reference, and the same step count. */
static void
resume_one(const struct cfg *c, bool after_init)
{
	char what[128];
	snprintf(what, sizeof(what), "stage %d optimizer %s param %s %s%s", c->stage, tier[c->opt],
		 tier[c->param], zinf_dtype_name(c->dtype),
		 after_init ? " (loaded after init)" : "");
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = make(c, nvme, NULL, NULL);
	run(e, c->dtype, 0, 4);
	struct master straight;
	read_all(e, &straight);
	zinf_engine_destroy(e);

	e = make(c, nvme, NULL, NULL);
	run(e, c->dtype, 0, 2);
	save_ok(e, ck, NULL);
	zinf_engine_destroy(e);

	if (after_init) {
		e = make(c, nvme, NULL, NULL);
		int rc = zinf_engine_load(e, ck, NULL, NULL);
		cr_assert_eq(rc, 0, "%s: load: %d %s", what, rc, zinf_last_error());
	} else {
		e = make(c, nvme, ck, NULL);
	}
	cr_assert_eq(zinf_engine_steps(e), 2, "%s: steps after load %lld", what,
		     (long long)zinf_engine_steps(e));
	run(e, c->dtype, 2, 2);
	struct master resumed;
	read_all(e, &resumed);
	cr_assert_eq(zinf_engine_steps(e), 4);
	zinf_engine_destroy(e);
	assert_same(resumed.p, straight.p, what);
	struct eref_result ref;
	reference(&ref, c->dtype, 4);
	assert_same(resumed.p, ref.master, what);
	eref_result_free(&ref);
	free_all(&straight);
	free_all(&resumed);
	rm_dirs(nvme, ck);
}

Test(ckpt, resume_every_tier_fp32_bf16_f16)
{
	enum zinf_dtype dts[] = {ZINF_F32, ZINF_BF16, ZINF_F16};
	for (int t = 0; t < 3; t++) {
		for (int stage = 0; stage <= 3; stage++) {
			for (int opt = 0; opt <= (stage ? 2 : 0); opt++) {
				for (int par = 0; par <= (stage == 3 ? 2 : 0); par++) {
					struct cfg c = {stage, opt, par, dts[t]};
					resume_one(&c, false);
				}
			}
		}
	}
}

Test(ckpt, resume_into_running_engine)
{
	struct cfg cs[] = {{3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, ZINF_BF16},
			   {2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, ZINF_F32},
			   {0, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, ZINF_BF16}};
	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		resume_one(&cs[i], true);
	}
}

/* A checkpoint written with one tier layout loads into another (the files are tier-free). */
Test(ckpt, load_into_other_tiers_and_stage)
{
	struct cfg a = {3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_CPU, ZINF_F32};
	struct cfg b = {1, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, ZINF_F32};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = make(&a, nvme, NULL, NULL);
	run(e, ZINF_F32, 0, 3);
	save_ok(e, ck, "x");
	zinf_engine_destroy(e);
	e = make(&b, nvme, ck, NULL);
	run(e, ZINF_F32, 3, 2);
	struct master m;
	read_all(e, &m);
	zinf_engine_destroy(e);
	struct eref_result ref;
	reference(&ref, ZINF_F32, 5);
	assert_same(m.p, ref.master, "stage 3 nvme/cpu -> stage 1 none");
	eref_result_free(&ref);
	free_all(&m);
	rm_dirs(nvme, ck);
}

/* The betas set by the trainer (OneCycle's momentum) are part of the state: a resumed run
 * that does not set them again steps with the saved ones. */
Test(ckpt, betas_are_restored)
{
	struct cfg c = {2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, ZINF_F32};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = make(&c, nvme, NULL, NULL);
	cr_assert_eq(zinf_engine_set_betas(e, 0.5f, 0.75f), 0);
	run(e, c.dtype, 0, 2);
	save_ok(e, ck, NULL);
	run(e, c.dtype, 2, 2);
	struct master straight, resumed, plain;
	read_all(e, &straight);
	zinf_engine_destroy(e);
	e = make(&c, nvme, ck, NULL);
	run(e, c.dtype, 2, 2);
	read_all(e, &resumed);
	zinf_engine_destroy(e);
	assert_same(resumed.p, straight.p, "betas (0.5, 0.75) resumed");
	/* and they matter: the options' betas give other values */
	e = make(&c, nvme, NULL, NULL);
	run(e, c.dtype, 0, 4);
	read_all(e, &plain);
	zinf_engine_destroy(e);
	cr_assert(memcmp(plain.p[0], straight.p[0], 4 * eref_numel(0)) != 0,
		  "the betas changed nothing: the test cannot tell");
	free_all(&straight);
	free_all(&resumed);
	free_all(&plain);
	rm_dirs(nvme, ck);
}

/*
 * A background save: zinf_engine_save returns with nothing published; training goes on; the
 * next step's first gradient of its last micro-batch publishes it (the step waits for the copy
 * there), and it holds the state of when it was asked for: a new engine loaded from it and
 * trained on equals the straight run. A background save not yet published when the engine is
 * destroyed is abandoned (nothing published, the next save cleans up).
 */
static void
background_one(const struct cfg *c)
{
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = make(c, nvme, NULL, NULL);
	run(e, c->dtype, 0, 4);
	struct master straight, resumed;
	read_all(e, &straight);
	zinf_engine_destroy(e);

	e = make(c, nvme, NULL, NULL);
	run(e, c->dtype, 0, 2);
	struct zinf_ckpt_opts so;
	zinf_ckpt_opts_init(&so);
	so.background = true;
	int rc = zinf_engine_save(e, ck, "bg", &so);
	cr_assert_eq(rc, 0, "%d %s", rc, zinf_last_error());
	cr_assert(!exists(ck, "bg") && !exists(ck, "latest"), "published before the next step");
	run(e, c->dtype, 2, 2); /* publishes it at step 3's last micro-batch */
	cr_assert(exists(ck, "bg") && exists(ck, "latest"), "not published by the next step");
	cr_assert_eq(zinf_engine_save_wait(e), 0, "%s", zinf_last_error());
	struct master after;
	read_all(e, &after);
	assert_same(after.p, straight.p, "the run with a background save");
	free_all(&after);
	/* one more, abandoned by destroy */
	rc = zinf_engine_save(e, ck, "gone", &so);
	cr_assert_eq(rc, 0);
	zinf_engine_destroy(e);
	cr_assert(!exists(ck, "gone"), "an abandoned background save was published");

	e = make(c, nvme, ck, NULL);
	cr_assert_eq(zinf_engine_steps(e), 2);
	run(e, c->dtype, 2, 2);
	read_all(e, &resumed);
	assert_same(resumed.p, straight.p, "resumed from a background save");
	save_ok(e, ck, "after"); /* cleans the abandoned one's temporary directory */
	cr_assert(!exists(ck, ".gone.tmp"), "the abandoned save's directory is left");
	zinf_engine_destroy(e);
	free_all(&straight);
	free_all(&resumed);
	rm_dirs(nvme, ck);
}

Test(ckpt, background_save_every_tier)
{
	struct cfg cs[] = {{3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, ZINF_BF16},
			   {2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, ZINF_F32},
			   {1, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, ZINF_F32},
			   {0, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, ZINF_BF16}};
	for (size_t i = 0; i < sizeof(cs) / sizeof(cs[0]); i++) {
		background_one(&cs[i]);
	}
}

/* ---- the trainer's blob, the layout on disk ----------------------------------------------- */

static bool
exists(const char *dir, const char *name)
{
	char p[8192];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	struct stat st;
	return stat(p, &st) == 0;
}

static char *
slurp(const char *dir, const char *name)
{
	char p[8192];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	FILE *f = fopen(p, "rb");
	cr_assert_not_null(f, "%s missing", p);
	char *buf = calloc(1, 1 << 20);
	size_t n = fread(buf, 1, (1 << 20) - 1, f);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

Test(ckpt, client_blob_and_layout)
{
	struct cfg c = {3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, ZINF_BF16};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = make(&c, nvme, NULL, NULL);
	run(e, c.dtype, 0, 1);
	char blob[300];
	for (size_t i = 0; i < sizeof(blob); i++) {
		blob[i] = (char)(i * 7 + 1);
	}
	struct zinf_ckpt_opts so;
	zinf_ckpt_opts_init(&so);
	so.client = blob;
	so.client_bytes = sizeof(blob);
	int rc = zinf_engine_save(e, ck, "first", &so);
	cr_assert_eq(rc, 0, "%d %s", rc, zinf_last_error());
	zinf_engine_destroy(e);

	char tagdir[4096];
	snprintf(tagdir, sizeof(tagdir), "%s/first", ck);
	char *latest = slurp(ck, "latest");
	cr_assert_str_eq(latest, "first\n");
	free(latest);
	const char *files[] = {"manifest.json", "r00000.fp32", "r00000.exp_avg",
			       "r00000.exp_avg_sq", "client.bin"};
	for (size_t i = 0; i < 5; i++) {
		cr_assert(exists(tagdir, files[i]), "%s/%s missing", tagdir, files[i]);
	}
	cr_assert(!exists(ck, ".first.tmp"), "the temporary directory is left");
	char *man = slurp(tagdir, "manifest.json");
	cr_assert(strstr(man, "\"zinf-checkpoint\"") && strstr(man, "\"steps\": 1"), "%s", man);
	free(man);

	/* too small a buffer: refused before anything is loaded */
	char out[300] = {0};
	struct zinf_ckpt_opts lo;
	zinf_ckpt_opts_init(&lo);
	lo.client_out = out;
	lo.client_cap = 100;
	struct zinf_engine_opts o;
	edrive_opts(&o, "single", c.stage, c.opt, c.param, nvme, c.dtype, GAS);
	rc = zinf_engine_create(&o, &e);
	cr_assert_eq(rc, 0);
	cr_assert_eq(edrive_add_params(e), 0);
	rc = zinf_engine_load(e, ck, NULL, &lo);
	cr_assert_eq(rc, -ENOSPC, "%d %s", rc, zinf_last_error());
	cr_assert(strstr(zinf_last_error(), "client.bin"), "%s", zinf_last_error());
	cr_assert_eq(lo.client_len, sizeof(blob));
	lo.client_cap = sizeof(out);
	rc = zinf_engine_load(e, ck, "first", &lo);
	cr_assert_eq(rc, 0, "%d %s", rc, zinf_last_error());
	cr_assert_eq(lo.client_len, sizeof(blob));
	cr_assert(memcmp(out, blob, sizeof(blob)) == 0);
	cr_assert_eq(zinf_engine_steps(e), 1);
	zinf_engine_destroy(e);
	rm_dirs(nvme, ck);
}

/* The same tag twice: the second replaces the first whole; latest names it; nothing is left. */
Test(ckpt, same_tag_twice)
{
	struct cfg c = {2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, ZINF_F32};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = make(&c, nvme, NULL, NULL);
	run(e, c.dtype, 0, 1);
	save_ok(e, ck, "t");
	run(e, c.dtype, 1, 2);
	save_ok(e, ck, "t");
	zinf_engine_destroy(e);
	cr_assert(!exists(ck, ".t.tmp"));
	e = make(&c, nvme, ck, NULL);
	cr_assert_eq(zinf_engine_steps(e), 3);
	struct master m;
	read_all(e, &m);
	struct eref_result ref;
	reference(&ref, c.dtype, 3);
	assert_same(m.p, ref.master, "the second save of tag t");
	eref_result_free(&ref);
	free_all(&m);
	zinf_engine_destroy(e);
	rm_dirs(nvme, ck);
}

/*
 * stage3_gather_16bit_weights_on_model_save: the save also writes model.safetensors, listed in
 * the manifest with its CRC; its tensors are the masters rounded to bf16, by name, shape and
 * offsets as the format says (parsed here by its rules).
 */
Test(ckpt, gather_16bit_weights_on_save)
{
	struct cfg c = {3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_CPU, ZINF_BF16};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine_opts o;
	edrive_opts(&o, "single", c.stage, c.opt, c.param, nvme, c.dtype, GAS);
	o.stage3_gather_16bit_weights_on_model_save = true;
	struct zinf_engine *e = NULL;
	cr_assert_eq(zinf_engine_create(&o, &e), 0);
	cr_assert_eq(edrive_add_params(e), 0);
	cr_assert_eq(zinf_engine_init(e), 0);
	run(e, c.dtype, 0, 2);
	save_ok(e, ck, "g");
	struct master m;
	read_all(e, &m);
	zinf_engine_destroy(e);

	char tagdir[4200], path[4300];
	snprintf(tagdir, sizeof(tagdir), "%s/g", ck);
	snprintf(path, sizeof(path), "%s/model.safetensors", tagdir);
	struct zinf_ckpt *ckp = NULL;
	cr_assert_eq(zinf_ckpt_open(ck, "g", &ckp), 0, "%s", zinf_last_error());
	bool listed = false;
	for (uint32_t i = 0; i < zinf_ckpt_file_count(ckp); i++) {
		struct zinf_ckpt_file f = {.size = sizeof(f)};
		cr_assert_eq(zinf_ckpt_file(ckp, i, &f), 0);
		listed |= strcmp(f.name, "model.safetensors") == 0;
		cr_assert_eq(zinf_ckpt_verify_file(ckp, i), 0, "%s: %s", f.name, zinf_last_error());
	}
	zinf_ckpt_close(ckp);
	cr_assert(listed, "model.safetensors is not in the manifest's files");

	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "%s missing", path);
	fseek(f, 0, SEEK_END);
	long size = ftell(f);
	rewind(f);
	unsigned char *buf = malloc((size_t)size);
	cr_assert_eq(fread(buf, 1, (size_t)size, f), (size_t)size);
	fclose(f);
	uint64_t hn = 0;
	for (int i = 7; i >= 0; i--) {
		hn = hn << 8 | buf[i];
	}
	cr_assert(hn % 8 == 0 && 8 + hn <= (uint64_t)size, "header length %llu",
		  (unsigned long long)hn);
	json_error_t jerr;
	json_t *h = json_loadb((const char *)buf + 8, hn, 0, &jerr);
	cr_assert_not_null(h, "header: %s", jerr.text);
	const unsigned char *data = buf + 8 + hn;
	uint64_t total = 0;
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		json_t *t = json_object_get(h, eref_params[id].name);
		cr_assert(json_is_object(t), "%s missing", eref_params[id].name);
		cr_assert_str_eq(json_string_value(json_object_get(t, "dtype")), "BF16");
		/* the shape registered (engine_drive.c: weights rows x cols, biases one dimension)
		 */
		json_t *shape = json_object_get(t, "shape");
		bool mat = eref_params[id].cols > 1;
		cr_assert_eq(json_array_size(shape), mat ? 2u : 1u, "%s", eref_params[id].name);
		cr_assert_eq(json_integer_value(json_array_get(shape, 0)),
			     mat ? (json_int_t)eref_params[id].rows : (json_int_t)eref_numel(id));
		if (mat) {
			cr_assert_eq(json_integer_value(json_array_get(shape, 1)),
				     (json_int_t)eref_params[id].cols);
		}
		json_t *off = json_object_get(t, "data_offsets");
		uint64_t b = (uint64_t)json_integer_value(json_array_get(off, 0));
		uint64_t en = (uint64_t)json_integer_value(json_array_get(off, 1));
		uint64_t n = eref_numel(id);
		cr_assert_eq(en - b, 2 * n, "%s: %llu bytes", eref_params[id].name,
			     (unsigned long long)(en - b));
		uint16_t *want = calloc(n, 2);
		cr_assert_eq(zinf_dtype_convert(want, ZINF_BF16, m.p[id], ZINF_F32, n), 0);
		cr_assert(memcmp(data + b, want, 2 * n) == 0, "%s: values differ from the masters",
			  eref_params[id].name);
		free(want);
		total += 2 * n;
	}
	cr_assert_eq(8 + hn + total, (uint64_t)size, "data is not exactly the tensors");
	json_decref(h);
	free(buf);

	/* zinf_ckpt_export in f32: the gathered master weights (zinf_engine_read_master), bit for
	   bit, at the offsets its header gives */
	char out[4400];
	snprintf(out, sizeof(out), "%s/export.safetensors", ck);
	cr_assert_eq(zinf_ckpt_open(ck, "g", &ckp), 0);
	cr_assert_eq(zinf_ckpt_export(ckp, out, ZINF_F32, 0), 0, "%s", zinf_last_error());
	zinf_ckpt_close(ckp);
	f = fopen(out, "rb");
	cr_assert_not_null(f);
	fseek(f, 0, SEEK_END);
	size = ftell(f);
	rewind(f);
	buf = malloc((size_t)size);
	cr_assert_eq(fread(buf, 1, (size_t)size, f), (size_t)size);
	fclose(f);
	hn = 0;
	for (int i = 7; i >= 0; i--) {
		hn = hn << 8 | buf[i];
	}
	h = json_loadb((const char *)buf + 8, hn, 0, &jerr);
	cr_assert_not_null(h);
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		json_t *t = json_object_get(h, eref_params[id].name);
		cr_assert_str_eq(json_string_value(json_object_get(t, "dtype")), "F32");
		uint64_t b = (uint64_t)json_integer_value(
			json_array_get(json_object_get(t, "data_offsets"), 0));
		cr_assert(memcmp(buf + 8 + hn + b, m.p[id], 4 * eref_numel(id)) == 0,
			  "%s: the export differs from read_master", eref_params[id].name);
	}
	json_decref(h);
	free(buf);
	free_all(&m);
	rm_dirs(nvme, ck);
}

/*
 * A checkpoint handle open while the same tag is saved again: what it reads is the checkpoint it
 * opened (files already open), or an error (files opened after the old directory went), never
 * the new checkpoint's bytes under the old manifest.
 */
Test(ckpt, reader_never_mixes_with_a_resave)
{
	struct cfg c = {2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, ZINF_F32};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = make(&c, nvme, NULL, NULL);
	run(e, c.dtype, 0, 2);
	save_ok(e, ck, "t");
	struct master old;
	read_all(e, &old);
	struct zinf_ckpt *h = NULL;
	cr_assert_eq(zinf_ckpt_open(ck, "t", &h), 0, "%s", zinf_last_error());
	uint64_t n = eref_numel(0);
	float *v = calloc(n, sizeof(float));
	cr_assert_eq(zinf_ckpt_read(h, 0, 0, 0, n, ZINF_F32, v), 0, "%s", zinf_last_error());
	run(e, c.dtype, 2, 1);
	save_ok(e, ck, "t"); /* swaps the tag out and removes the old directory */
	memset(v, 0, n * sizeof(float));
	cr_assert_eq(zinf_ckpt_read(h, 0, 0, 0, n, ZINF_F32, v), 0, "%s", zinf_last_error());
	cr_assert(memcmp(v, old.p[0], n * sizeof(float)) == 0, "an open file changed under it");
	int rc = zinf_ckpt_read(h, 0, 1, 0, n, ZINF_F32, v); /* exp_avg: not opened before */
	cr_assert_lt(rc, 0, "read the new checkpoint's exp_avg under the old manifest");
	zinf_ckpt_close(h);
	free(v);
	free_all(&old);
	zinf_engine_destroy(e);
	rm_dirs(nvme, ck);
}

/* A shape that does not multiply to numel, too many dimensions, reserved bytes: -EINVAL naming
 * the parameter; the engine takes the next, valid parameter as if nothing happened. */
Test(ckpt, param_shape_refusals)
{
	struct zinf_engine_opts o;
	edrive_opts(&o, "single", 0, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, NULL, ZINF_F32, 1);
	struct zinf_engine *e = NULL;
	cr_assert_eq(zinf_engine_create(&o, &e), 0);
	struct zinf_param_desc d;
	zinf_param_desc_init(&d);
	d.name = "w";
	d.numel = 12;
	d.ndim = 2;
	d.shape[0] = 3;
	d.shape[1] = 5;
	cr_assert_eq(zinf_engine_add_param(e, &d), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "\"w\"") && strstr(zinf_last_error(), "multiply"), "%s",
		  zinf_last_error());
	d.ndim = 9;
	cr_assert_eq(zinf_engine_add_param(e, &d), -EINVAL);
	d.ndim = 2;
	d.shape[1] = 4;
	d.flags = 1u << 7; /* not a ZINF_PARAM_* */
	cr_assert_eq(zinf_engine_add_param(e, &d), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "unknown flags 0x80"), "%s", zinf_last_error());
	d.flags = 0;
	cr_assert_eq(zinf_engine_add_param(e, &d), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
	zinf_engine_destroy(e);
}

/* ---- refusals ------------------------------------------------------------------------------ */

static void
expect_err(int rc, int want, const char *needle, const char *what)
{
	cr_expect_eq(rc, want, "%s: rc %d, expected %d (%s)", what, rc, want, zinf_last_error());
	cr_expect(strstr(zinf_last_error(), needle) != NULL, "%s: message does not name \"%s\": %s",
		  what, needle, zinf_last_error());
}

Test(ckpt, save_refusals_leave_the_engine_usable)
{
	struct cfg c = {3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_CPU, ZINF_F32};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = make(&c, nvme, NULL, NULL);
	expect_err(zinf_engine_save(e, ck, "../x", NULL), -EINVAL, "../x", "tag with a slash");
	expect_err(zinf_engine_save(e, ck, ".hidden", NULL), -EINVAL, ".hidden", "dot tag");
	expect_err(zinf_engine_save(e, ck, "latest", NULL), -EINVAL, "latest", "tag latest");
	expect_err(zinf_engine_save(e, NULL, "a", NULL), -EINVAL, "directory", "NULL dir");
	/* inside an accumulation window: one micro-batch of two */
	struct edrive d;
	cr_assert_eq(edrive_init(&d, e, c.dtype, QUANTUM), 0);
	cr_assert_eq(edrive_micro(&d, 0, 0, EDRIVE_ORDER_NORMAL), 0, "%s", d.why);
	expect_err(zinf_engine_save(e, ck, "a", NULL), -EINVAL, "accumulation window", "window");
	cr_assert_eq(edrive_micro(&d, 0, 1, EDRIVE_ORDER_NORMAL), 1, "%s", d.why);
	edrive_fini(&d);
	/* a directory held by another process's save */
	char lockp[4096];
	snprintf(lockp, sizeof(lockp), "%s/.zinf-ckpt.lock", ck);
	int fds[2];
	cr_assert_eq(pipe(fds), 0);
	pid_t pid = fork();
	if (pid == 0) {
		int fd = open(lockp, O_RDWR | O_CREAT, 0644);
		char buf[32];
		int n = snprintf(buf, sizeof(buf), "%ld\n", (long)getpid());
		if (fd < 0 || flock(fd, LOCK_EX) != 0 || write(fd, buf, (size_t)n) != n ||
		    write(fds[1], "k", 1) != 1) {
			_exit(1);
		}
		pause();
		_exit(0);
	}
	char k;
	cr_assert_eq(read(fds[0], &k, 1), 1);
	char pidtxt[32];
	snprintf(pidtxt, sizeof(pidtxt), "pid %ld", (long)pid);
	expect_err(zinf_engine_save(e, ck, "a", NULL), -EBUSY, pidtxt, "lock held");
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	close(fds[0]);
	close(fds[1]);
	cr_assert(!exists(ck, "a") && !exists(ck, "latest"), "a refused save left files");
	/* the engine goes on: the run still equals the reference */
	run(e, c.dtype, 1, 1);
	save_ok(e, ck, "a");
	struct master m;
	read_all(e, &m);
	struct eref_result ref;
	reference(&ref, c.dtype, 2);
	assert_same(m.p, ref.master, "after the refusals");
	eref_result_free(&ref);
	free_all(&m);
	zinf_engine_destroy(e);
	rm_dirs(nvme, ck);
}

/* A load refused before anything is loaded leaves the engine as it was (here: its initial
 * values, checked by training it afterwards). */
static void
load_refused(const struct cfg *c, const char *nvme, const char *ck, const char *tag, int want,
	     const char *needle, const char *what)
{
	struct zinf_engine *e = make(c, nvme, NULL, NULL);
	expect_err(zinf_engine_load(e, ck, tag, NULL), want, needle, what);
	run(e, c->dtype, 0, 1);
	struct master m;
	read_all(e, &m);
	struct eref_result ref;
	reference(&ref, c->dtype, 1);
	assert_same(m.p, ref.master, what);
	eref_result_free(&ref);
	free_all(&m);
	zinf_engine_destroy(e);
}

static void
corrupt(const char *dir, const char *name, long at, int how)
{
	char p[8192];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	if (how == 0) { /* flip one byte */
		int fd = open(p, O_RDWR);
		cr_assert_geq(fd, 0, "%s", p);
		unsigned char b;
		cr_assert_eq(pread(fd, &b, 1, at), 1);
		b ^= 0x10;
		cr_assert_eq(pwrite(fd, &b, 1, at), 1);
		close(fd);
	} else if (how == 1) {
		cr_assert_eq(truncate(p, at), 0);
	} else {
		cr_assert_eq(unlink(p), 0);
	}
}

Test(ckpt, load_refusals_name_the_problem)
{
	struct cfg c = {3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, ZINF_F32};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = make(&c, nvme, NULL, NULL);
	run(e, c.dtype, 0, 2);
	save_ok(e, ck, "good");
	zinf_engine_destroy(e);
	char good[4096], bad[4096], bad_tag[4096];
	snprintf(good, sizeof(good), "%s/good", ck);
	snprintf(bad, sizeof(bad), "%s/bad", ck);
	snprintf(bad_tag, sizeof(bad_tag), "%s", "bad");

	load_refused(&c, nvme, ck, "missing", -ENOENT, "missing", "no such tag");
	cr_assert_eq(zt_copytree(good, bad), 0);
	corrupt(bad, "r00000.exp_avg", 100, 0);
	load_refused(&c, nvme, ck, bad_tag, -EBADMSG, "r00000.exp_avg", "one byte flipped");
	cr_assert_eq(zt_copytree(good, bad), 0);
	corrupt(bad, "r00000.fp32", 64, 1);
	load_refused(&c, nvme, ck, bad_tag, -EBADMSG, "r00000.fp32", "truncated");
	cr_assert_eq(zt_copytree(good, bad), 0);
	corrupt(bad, "r00000.exp_avg_sq", 0, 2);
	load_refused(&c, nvme, ck, bad_tag, -EBADMSG, "r00000.exp_avg_sq", "deleted");
	cr_assert_eq(zt_copytree(good, bad), 0);
	corrupt(bad, "manifest.json", 0, 2);
	load_refused(&c, nvme, ck, bad_tag, -ENOENT, "manifest.json", "no manifest");
	/* the manifest itself: a digit changed where the JSON stays valid, its checksum deleted */
	cr_assert_eq(zt_copytree(good, bad), 0);
	char *man = slurp(bad, "manifest.json");
	char *at = strstr(man, "\"steps\": 2");
	cr_assert_not_null(at, "%s", man);
	corrupt(bad, "manifest.json", (long)(at - man) + 9, 0); /* '2' ^ 0x10 = '"': invalid */
	load_refused(&c, nvme, ck, bad_tag, -EBADMSG, "manifest.json", "manifest byte flipped");
	cr_assert_eq(zt_copytree(good, bad), 0);
	char path[8300];
	snprintf(path, sizeof(path), "%s/manifest.json", bad);
	at[9] = '3'; /* still valid JSON: only the checksum tells */
	FILE *mf = fopen(path, "w");
	cr_assert_not_null(mf);
	fputs(man, mf);
	fclose(mf);
	load_refused(&c, nvme, ck, bad_tag, -EBADMSG, "CRC32C", "manifest steps 2 -> 3");
	free(man);
	cr_assert_eq(zt_copytree(good, bad), 0);
	corrupt(bad, "manifest.crc32c", 0, 2);
	load_refused(&c, nvme, ck, bad_tag, -EBADMSG, "manifest.crc32c", "no manifest checksum");
	/* a data file that is a link to the same bytes outside DIR: not followed */
	char *out = zt_mkdtemp(NULL), from[8300], to[8300];
	const char *const linked[] = {"r00000.exp_avg", "manifest.json"};
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(zt_copytree(good, bad), 0);
		snprintf(from, sizeof(from), "%s/%s", bad, linked[i]);
		snprintf(to, sizeof(to), "%s/%s", out, linked[i]);
		cr_assert_eq(rename(from, to), 0, "%s", to);
		cr_assert_eq(symlink(to, from), 0, "%s", from);
		snprintf(path, sizeof(path), "%s: a symbolic link", linked[i]);
		load_refused(&c, nvme, ck, bad_tag, -EBADMSG, path, "a file linked out of DIR");
	}
	zt_rmtree(out);
	free(out);

	/* other parameters, another optimizer */
	struct zinf_engine_opts o;
	edrive_opts(&o, "single", c.stage, c.opt, c.param, nvme, c.dtype, GAS);
	cr_assert_eq(zinf_engine_create(&o, &e), 0);
	struct zinf_param_desc pd;
	zinf_param_desc_init(&pd);
	pd.name = "W0";
	pd.numel = 240;
	pd.layer = 0;
	cr_assert_eq(zinf_engine_add_param(e, &pd), 0);
	expect_err(zinf_engine_load(e, ck, "good", NULL), -EINVAL, "parameters", "one parameter");
	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error()); /* still usable */
	zinf_engine_destroy(e);

	edrive_opts(&o, "single", c.stage, c.opt, c.param, nvme, c.dtype, GAS);
	zinf_optimizer_opts_init(&o.optimizer, ZINF_OPTIM_LION);
	cr_assert_eq(zinf_engine_create(&o, &e), 0);
	cr_assert_eq(edrive_add_params(e), 0);
	expect_err(zinf_engine_load(e, ck, "good", NULL), -EINVAL, "lion", "another optimizer");
	zinf_engine_destroy(e);

	/* and the good one still loads */
	e = make(&c, nvme, NULL, NULL);
	cr_assert_eq(zinf_engine_load(e, ck, "good", NULL), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_steps(e), 2);
	zinf_engine_destroy(e);
	rm_dirs(nvme, ck);
}

/*
 * The library never kills: a kill request in the environment (ZINF_TEST_CKPT_KILL, naming this
 * save's first point) is ignored, and the save completes. In a child, so that a kill shows as
 * one.
 */
Test(ckpt, environment_never_kills_a_save)
{
	struct cfg c = {3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, ZINF_F32};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		setenv("ZINF_TEST_CKPT_KILL", "files:A", 1);
		struct zinf_engine_opts o;
		edrive_opts(&o, "single", c.stage, c.opt, c.param, nvme, c.dtype, GAS);
		struct zinf_engine *e = NULL;
		struct edrive d;
		if (zinf_engine_create(&o, &e) || edrive_add_params(e) || zinf_engine_init(e) ||
		    edrive_init(&d, e, c.dtype, QUANTUM) || edrive_run(&d, 0, 1, GAS, -1) ||
		    zinf_engine_save(e, ck, "A", NULL)) {
			_exit(3);
		}
		edrive_fini(&d);
		zinf_engine_destroy(e);
		_exit(0);
	}
	int status = 0;
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		  "the save with ZINF_TEST_CKPT_KILL=files:A set: status %#x%s", status,
		  WIFSIGNALED(status) ? " (killed: the library raised a signal)" : "");
	cr_assert(exists(ck, "A") && exists(ck, "latest"));
	rm_dirs(nvme, ck);
}

/* What a save's progress hook heard: the points in order, each with its tag and thread. */
struct heard {
	char seq[256];
	int wrong_tag, other_thread;
	pthread_t thread;
};

static void
hear(void *ctx, const char *point, const char *tag)
{
	struct heard *h = ctx;
	size_t n = strlen(h->seq);
	snprintf(h->seq + n, sizeof(h->seq) - n, "%s%s", n ? " " : "", point);
	h->wrong_tag += strcmp(tag, "A") != 0;
	h->other_thread += !pthread_equal(pthread_self(), h->thread);
}

/*
 * The progress hook (zinf_ckpt_opts.progress) hears every point of a save in order, with its
 * tag, on the thread that publishes it: a new tag (renamed into place), the same tag again
 * (swapped), and a background save (nothing while its files are written; the points when the
 * next step publishes it, on the training thread, not the writer's). Without a hook nothing is
 * called (the default).
 */
Test(ckpt, progress_hook_hears_every_point_in_order)
{
	struct cfg c = {3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, ZINF_F32};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = make(&c, nvme, NULL, NULL);
	run(e, c.dtype, 0, 1);
	struct heard h = {.thread = pthread_self()};
	struct zinf_ckpt_opts so;
	zinf_ckpt_opts_init(&so);
	cr_assert_null(so.progress);
	so.progress = hear;
	so.progress_ctx = &h;
	cr_assert_eq(zinf_engine_save(e, ck, "A", &so), 0, "%s", zinf_last_error());
	cr_expect_str_eq(h.seq, "files manifest tmp_synced renamed latest_tmp latest");
	h.seq[0] = '\0';
	cr_assert_eq(zinf_engine_save(e, ck, "A", &so), 0, "%s", zinf_last_error());
	cr_expect_str_eq(h.seq, "files manifest tmp_synced swapped renamed latest_tmp latest");
	h.seq[0] = '\0';
	so.background = true;
	cr_assert_eq(zinf_engine_save(e, ck, "A", &so), 0, "%s", zinf_last_error());
	cr_expect_str_eq(h.seq, "", "points before the background save was published");
	run(e, c.dtype, 1, 1); /* publishes it */
	cr_expect_str_eq(h.seq, "files manifest tmp_synced swapped renamed latest_tmp latest");
	cr_expect_eq(h.wrong_tag, 0);
	cr_expect_eq(h.other_thread, 0, "called on another thread than the one publishing");
	h.seq[0] = '\0';
	save_ok(e, ck, "A"); /* no hook */
	cr_expect_str_eq(h.seq, "");
	zinf_engine_destroy(e);
	rm_dirs(nvme, ck);
}

/* ---- crashes ------------------------------------------------------------------------------- */

/* The save's progress hook of a crash test: ctx names the point to die at. */
static void
kill_here(void *ctx, const char *point, const char *tag)
{
	(void)tag;
	if (strcmp(point, ctx) == 0) {
		raise(SIGKILL);
	}
}

/*
 * A child trains 2 steps and saves tag A (complete), trains 2 more and saves again (tag A
 * again, or tag B), killed at `point` of that save (or, with point NULL, after a random delay
 * while it saves over and over). The parent then loads the latest checkpoint: it must load,
 * hold 2 or 4 steps (or for random kills any count saved) and equal the reference of that many
 * steps: the previous or the new checkpoint, never a mix.
 */
static void
crash_one(const char *point, bool same_tag, uint64_t delay_us)
{
	struct cfg c = {3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, ZINF_F32};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	char child_nvme[4200];
	snprintf(child_nvme, sizeof(child_nvme), "%s/child", nvme);
	cr_assert_eq(mkdir(child_nvme, 0755), 0);
	int fds[2];
	cr_assert_eq(pipe(fds), 0);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct zinf_engine_opts o;
		edrive_opts(&o, "single", c.stage, c.opt, c.param, child_nvme, c.dtype, GAS);
		struct zinf_engine *e = NULL;
		struct edrive d;
		if (zinf_engine_create(&o, &e) || edrive_add_params(e) || zinf_engine_init(e) ||
		    edrive_init(&d, e, c.dtype, QUANTUM) || edrive_run(&d, 0, 2, GAS, -1) ||
		    zinf_engine_save(e, ck, "A", NULL)) {
			_exit(3);
		}
		if (!point) { /* save after every step until killed */
			if (write(fds[1], "s", 1) != 1) {
				_exit(4);
			}
			for (int64_t s = 2;; s++) {
				if (edrive_run(&d, s, 1, GAS, -1) ||
				    zinf_engine_save(e, ck, same_tag ? "A" : (s % 2 ? "B" : "A"),
						     NULL)) {
					_exit(5);
				}
			}
		}
		if (edrive_run(&d, 2, 2, GAS, -1)) {
			_exit(6);
		}
		struct zinf_ckpt_opts so;
		zinf_ckpt_opts_init(&so);
		so.progress = kill_here;
		so.progress_ctx = (void *)point;
		zinf_engine_save(e, ck, same_tag ? "A" : "B", &so);
		_exit(7); /* the point was not reached */
	}
	int status = 0;
	char k;
	if (!point && read(fds[0], &k, 1) == 1) { /* A is saved: now kill at random */
		usleep((useconds_t)delay_us);
		kill(pid, SIGKILL);
	}
	waitpid(pid, &status, 0);
	cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
		  "point %s: the child was not killed there (status %#x)", point ? point : "random",
		  status);
	close(fds[0]);
	close(fds[1]);
	/* the child's swap space is gone with it: a new engine reclaims its files */
	struct zinf_engine *e = make(&c, nvme, NULL, NULL);
	int rc = zinf_engine_load(e, ck, NULL, NULL);
	cr_assert_eq(rc, 0, "point %s, %s tag: load: %d %s", point ? point : "random",
		     same_tag ? "same" : "new", rc, zinf_last_error());
	int64_t steps = zinf_engine_steps(e);
	if (point) {
		bool new_one =
			!strcmp(point, "latest") ||
			(same_tag && (!strcmp(point, "swapped") || !strcmp(point, "renamed") ||
				      !strcmp(point, "latest_tmp")));
		cr_assert_eq(steps, new_one ? 4 : 2, "point %s, %s tag: %lld steps", point,
			     same_tag ? "same" : "new", (long long)steps);
	}
	cr_assert(steps >= 2, "%lld steps", (long long)steps);
	struct master m;
	read_all(e, &m);
	struct eref_result ref;
	reference(&ref, c.dtype, (int)steps);
	assert_same(m.p, ref.master, point ? point : "a random kill");
	eref_result_free(&ref);
	free_all(&m);
	zinf_engine_destroy(e);
	rm_dirs(nvme, ck);
}

Test(ckpt, killed_at_every_point_of_a_save)
{
	const char *points[] = {"files",   "manifest",	 "tmp_synced", "swapped",
				"renamed", "latest_tmp", "latest"};
	for (size_t i = 0; i < sizeof(points) / sizeof(points[0]); i++) {
		for (int same = 0; same <= 1; same++) {
			if (!same && !strcmp(points[i], "swapped")) {
				continue; /* a new tag is renamed, not swapped */
			}
			crash_one(points[i], same, 0);
		}
	}
}

Test(ckpt, killed_at_random_moments)
{
	uint64_t rs = zt_seed();
	for (int i = 0; i < 6; i++) {
		crash_one(NULL, i % 2, zt_rand(&rs) % 300000);
	}
}
