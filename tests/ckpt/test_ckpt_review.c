// SPDX-License-Identifier: Apache-2.0
/*
 * tests/ckpt/test_ckpt_review.c: a reviewer's tests of the checkpoints (zinf_engine_save /
 * zinf_engine_load, the directory they write), one process (comm "single", device "host").
 * A test of a defect failed before its fix (the commit and notes/REVIEW_CKPT.md name both);
 * the others check what was found sound. renameat2, rename and fsync are interposed (this
 * program's own, forwarding to the system calls) so that a file system without renameat2's flags
 * and the order of the syncs can be tested. Several ranks: test_engine_ranks.c (ckpt_review_*).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "ckpt/ckpt_fixture.h"
#include "common/test_util.h"
#include "ckpt/ckpt_fs.h"
#include "engine/engine_drive.h"
#include "engine/engine_ref.h"
#include "zinf/checkpoint.h"
#include "zinf/engine.h"
#include "zinf/io.h"
#include "zinf/swap.h"

#define QUANTUM 0x1p-14f
#define GAS	2

#include "ckpt/ckpt_test.h"

struct cfg {
	int stage;
	enum zinf_offload_device opt, param;
	enum zinf_dtype dtype;
	bool caches; /* stage 3: layers stay gathered after release, partitions cached in CPU */
};

static struct zinf_engine *
make(const struct cfg *c, const char *nvme)
{
	struct zinf_engine_opts o;
	edrive_opts(&o, "single", c->stage, c->opt, c->param, nvme, c->dtype, GAS);
	if (c->caches) {
		o.stage3_max_reuse_distance = 1000000;
		o.stage3_param_persistence_threshold = 40; /* the biases are persistent */
		o.offload_param.max_in_cpu = 1000000;
	}
	struct zinf_engine *e = NULL;
	int rc = zinf_engine_create(&o, &e);
	cr_assert_eq(rc, 0, "create: %d %s", rc, zinf_last_error());
	rc = edrive_add_params(e);
	cr_assert_eq(rc, 0, "add_params: %d %s", rc, zinf_last_error());
	rc = zinf_engine_init(e);
	cr_assert_eq(rc, 0, "init: %d %s", rc, zinf_last_error());
	return e;
}

static bool
exists(const char *dir, const char *name)
{
	char p[8192];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	struct stat st;
	return lstat(p, &st) == 0;
}

static void
put_file(const char *path)
{
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f, "%s", path);
	fputs("the user's\n", f);
	fclose(f);
}

/* ---- replacing a tag ----------------------------------------------------------------------- */

/*
 * A tag saved again whose directory holds more than a save writes (a subdirectory the trainer
 * put there, as Hugging Face trainers put a tokenizer beside the weights): the old directory is
 * swapped out and must be removed whole, or its leftover DIR/.TAG.tmp makes every later save
 * into DIR fail (the next save's clean-up cannot remove it; the same tag cannot make its
 * temporary directory).
 */
Test(ckpt_review, retagging_a_directory_with_a_subdirectory)
{
	struct cfg c = {2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, ZINF_F32, false};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = make(&c, nvme);
	run(e, c.dtype, 0, 1);
	save_ok(e, ck, "t");
	char p[8192];
	snprintf(p, sizeof(p), "%s/t/tokenizer", ck);
	cr_assert_eq(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/t/tokenizer/vocab.json", ck);
	put_file(p);
	run(e, c.dtype, 1, 1);
	save_ok(e, ck, "t"); /* t replaced */
	cr_assert(!exists(ck, ".t.tmp"), "the swapped-out t is left as .t.tmp");
	run(e, c.dtype, 2, 1);
	save_ok(e, ck, "u"); /* another tag */
	run(e, c.dtype, 3, 1);
	save_ok(e, ck, "t"); /* and t once more */
	zinf_engine_destroy(e);
	e = make(&c, nvme);
	cr_assert_eq(zinf_engine_load(e, ck, NULL, NULL), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_steps(e), 4);
	zinf_engine_destroy(e);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
	free(ck);
}

/* A file (not a directory) named like the tag: replaced too, and later saves still work. */
Test(ckpt_review, retagging_over_a_file)
{
	struct cfg c = {2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, ZINF_F32, false};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = make(&c, nvme);
	run(e, c.dtype, 0, 1);
	char p[8192];
	snprintf(p, sizeof(p), "%s/t", ck);
	put_file(p);
	int rc = zinf_engine_save(e, ck, "t", NULL);
	cr_assert(rc == 0 || rc == -EEXIST || rc == -ENOTDIR, "%d %s", rc, zinf_last_error());
	run(e, c.dtype, 1, 1);
	save_ok(e, ck, "u");
	save_ok(e, ck, "u");
	zinf_engine_destroy(e);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
	free(ck);
}

/* ---- loading into a running engine --------------------------------------------------------- */

/*
 * Stage 3 with layers kept gathered after release (stage3_max_reuse_distance), persistent
 * parameters and the parameter store's CPU cache (max_in_cpu): an engine that ran 3 steps and an
 * evaluation's forward (its layers left gathered) loads the checkpoint of step 2 and runs 2
 * more; it must equal 4 steps straight, bit for bit.
 */
static void
resume_running_with_caches(enum zinf_offload_device opt, enum zinf_offload_device par)
{
	struct cfg c = {3, opt, par, ZINF_BF16, true};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = make(&c, nvme);
	run(e, c.dtype, 0, 2);
	save_ok(e, ck, "two");
	run(e, c.dtype, 2, 2);
	struct master straight;
	read_all(e, &straight);
	zinf_engine_destroy(e);

	e = make(&c, nvme);
	run(e, c.dtype, 0, 3);
	for (int32_t l = 0; l < 3; l++) { /* an evaluation's forward: layers left gathered */
		cr_assert_eq(zinf_engine_fetch(e, l), 0, "%s", zinf_last_error());
		cr_assert_eq(zinf_engine_release(e, l), 0, "%s", zinf_last_error());
	}
	struct zinf_engine_stats st = {.size = sizeof(st)};
	cr_assert_eq(zinf_engine_get_stats(e, &st), 0);
	cr_assert(st.persistent_elems > 0 && st.live_elems > st.persistent_elems,
		  "no layer is left gathered (live %llu, persistent %llu): the test cannot tell",
		  (unsigned long long)st.live_elems, (unsigned long long)st.persistent_elems);
	int rc = zinf_engine_load(e, ck, "two", NULL);
	cr_assert_eq(rc, 0, "load: %d %s", rc, zinf_last_error());
	cr_assert_eq(zinf_engine_steps(e), 2);
	run(e, c.dtype, 2, 2);
	struct master resumed;
	read_all(e, &resumed);
	zinf_engine_destroy(e);
	char what[64];
	snprintf(what, sizeof(what), "caches, optimizer %d param %d", opt, par);
	assert_same(resumed.p, straight.p, what);
	free_all(&straight);
	free_all(&resumed);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
	free(ck);
}

Test(ckpt_review, load_into_running_stage3_with_caches)
{
	resume_running_with_caches(ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME);
	resume_running_with_caches(ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_CPU);
	resume_running_with_caches(ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE);
}

/*
 * A load while the trainer holds a layer fetched (its gathered copy in use): the step refuses
 * that ("still fetched"), and so must load: it cannot replace what the trainer is reading, and
 * the gathered copy would keep the old values.
 */
Test(ckpt_review, load_refused_while_a_layer_is_fetched)
{
	struct cfg c = {3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_CPU, ZINF_F32, false};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = make(&c, nvme);
	run(e, c.dtype, 0, 2);
	save_ok(e, ck, "two");
	run(e, c.dtype, 2, 1);
	struct master before;
	read_all(e, &before);
	cr_assert_eq(zinf_engine_fetch(e, 0), 0, "%s", zinf_last_error());
	int rc = zinf_engine_load(e, ck, "two", NULL);
	cr_expect_eq(rc, -EINVAL, "load with layer 0 fetched: %d", rc);
	cr_expect(strstr(zinf_last_error(), "fetched") != NULL, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_release(e, 0), 0, "%s", zinf_last_error());
	/* refused: nothing changed, and the engine goes on */
	struct master after;
	read_all(e, &after);
	cr_assert_eq(zinf_engine_steps(e), 3);
	assert_same(after.p, before.p, "a refused load");
	cr_assert_eq(zinf_engine_load(e, ck, "two", NULL), 0, "%s", zinf_last_error());
	run(e, c.dtype, 2, 1);
	free_all(&before);
	free_all(&after);
	zinf_engine_destroy(e);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
	free(ck);
}

/* ---- file systems -------------------------------------------------------------------------- */

/* tmpfs refuses O_DIRECT: the writer falls back to buffered I/O, the sizes stay exact. */
Test(ckpt_review, save_and_load_on_tmpfs)
{
	struct stat st;
	if (stat("/dev/shm", &st) != 0 || !S_ISDIR(st.st_mode)) {
		cr_skip_test("no /dev/shm");
	}
	char tmpl[] = "/dev/shm/zinf-ckpt-review-XXXXXX";
	char *ck = mkdtemp(tmpl);
	cr_assert_not_null(ck);
	struct cfg c = {3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, ZINF_BF16, false};
	char *nvme = zt_mkdtemp(NULL);
	struct zinf_engine *e = make(&c, nvme);
	run(e, c.dtype, 0, 2);
	int rc = zinf_engine_save(e, ck, NULL, NULL);
	struct master a;
	read_all(e, &a);
	zinf_engine_destroy(e);
	cr_assert_eq(rc, 0, "save into %s: %d %s", ck, rc, zinf_last_error());
	e = make(&c, nvme);
	rc = zinf_engine_load(e, ck, NULL, NULL);
	cr_assert_eq(rc, 0, "load: %d %s", rc, zinf_last_error());
	struct master b;
	read_all(e, &b);
	zinf_engine_destroy(e);
	assert_same(b.p, a.p, "tmpfs");
	free_all(&a);
	free_all(&b);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
}

/* ---- what a save does to the engine -------------------------------------------------------- */

/* The step after a save reads the same NVMe bytes as without it (the bytes written are counted
 * as the writes complete, which varies run to run), and its values are the same. */
Test(ckpt_review, save_leaves_the_next_step_alone)
{
	struct cfg c = {3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, ZINF_BF16, false};
	struct zinf_engine_stats s[2];
	struct master m[2];
	for (int with = 0; with < 2; with++) {
		char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
		struct zinf_engine *e = make(&c, nvme);
		run(e, c.dtype, 0, 2);
		if (with) {
			save_ok(e, ck, NULL);
		}
		run(e, c.dtype, 2, 1);
		s[with] = (struct zinf_engine_stats){.size = sizeof(s[with])};
		cr_assert_eq(zinf_engine_get_stats(e, &s[with]), 0);
		read_all(e, &m[with]);
		zinf_engine_destroy(e);
		zt_rmtree(nvme);
		zt_rmtree(ck);
		free(nvme);
		free(ck);
	}
	cr_expect_eq(s[1].nvme_read_bytes, s[0].nvme_read_bytes, "read %llu with a save, %llu",
		     (unsigned long long)s[1].nvme_read_bytes,
		     (unsigned long long)s[0].nvme_read_bytes);
	cr_expect_eq(s[1].steps, s[0].steps);
	cr_expect_eq(s[1].host_pool_bytes, s[0].host_pool_bytes);
	assert_same(m[1].p, m[0].p, "the step after a save");
	free_all(&m[0]);
	free_all(&m[1]);
}

/* ---- manifests with values out of range ---------------------------------------------------- */

/* Set key (a path of object keys, '.'-separated) of DIR/TAG/manifest.json to the JSON text v. */
static void
edit_manifest(const char *tagdir, const char *key, const char *v)
{
	char p[8192];
	snprintf(p, sizeof(p), "%s/manifest.json", tagdir);
	json_error_t jerr;
	json_t *m = json_load_file(p, 0, &jerr);
	cr_assert_not_null(m, "%s: %s", p, jerr.text);
	json_t *o = m;
	char k[256];
	snprintf(k, sizeof(k), "%s", key);
	char *dot = strchr(k, '.');
	if (dot) {
		*dot = '\0';
		o = json_object_get(m, k);
		cr_assert_not_null(o, "%s", k);
	}
	json_t *val = json_loads(v, JSON_DECODE_ANY, &jerr);
	cr_assert_not_null(val, "%s: %s", v, jerr.text);
	cr_assert_eq(json_object_set_new(o, dot ? dot + 1 : k, val), 0);
	cr_assert_eq(json_dump_file(m, p, JSON_INDENT(1)), 0);
	fx_reseal(tagdir); /* as a writer would: the reader's checks of the values are seen */
	json_decref(m);
}

/*
 * Values a corrupted or hand-edited manifest may hold, refused (-EBADMSG naming the field)
 * before anything is loaded: a step count the next step cannot add 1 to, a loss scale that is
 * not a positive number (fp16 would multiply the loss by it), a hysteresis that does not fit the
 * scaler's counter.
 */
Test(ckpt_review, manifest_values_out_of_range)
{
	struct cfg c = {2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, ZINF_F16, false};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine_opts o;
	edrive_opts(&o, "single", c.stage, c.opt, c.param, nvme, c.dtype, GAS);
	o.fp16.enabled = true;
	struct zinf_engine *e = NULL;
	cr_assert_eq(zinf_engine_create(&o, &e), 0, "%s", zinf_last_error());
	cr_assert_eq(edrive_add_params(e), 0);
	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
	save_ok(e, ck, "good");
	zinf_engine_destroy(e);
	char good[4200], bad[4200], cmd[13000];
	snprintf(good, sizeof(good), "%s/good", ck);
	snprintf(bad, sizeof(bad), "%s/bad", ck);
	const struct {
		const char *key, *value, *needle;
	} cases[] = {
		{"steps", "9223372036854775807", "steps"},
		{"micro_steps", "9223372036854775807", "micro_steps"},
		{"loss_scaler.scale", "-65536.0", "scale"},
		{"loss_scaler.hysteresis_left", "4294967298", "hysteresis_left"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -a '%s' '%s'", bad, good, bad);
		cr_assert_eq(system(cmd), 0);
		edit_manifest(bad, cases[i].key, cases[i].value);
		cr_assert_eq(zinf_engine_create(&o, &e), 0);
		cr_assert_eq(edrive_add_params(e), 0);
		int rc = zinf_engine_load(e, ck, "bad", NULL);
		cr_expect_eq(rc, -EBADMSG, "%s = %s: load returned %d", cases[i].key,
			     cases[i].value, rc);
		cr_expect(strstr(zinf_last_error(), cases[i].needle) != NULL,
			  "%s = %s: the message does not name it: %s", cases[i].key, cases[i].value,
			  zinf_last_error());
		/* refused: the engine can still be initialised */
		cr_expect_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
		zinf_engine_destroy(e);
	}
	cr_assert_eq(zinf_engine_create(&o, &e), 0);
	cr_assert_eq(edrive_add_params(e), 0);
	cr_assert_eq(zinf_engine_load(e, ck, "good", NULL), 0, "%s", zinf_last_error());
	zinf_engine_destroy(e);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
	free(ck);
}

/*
 * A checkpoint of a run without loss scaling (bf16 here: its scaler was never set up, scale 0)
 * resumed with fp16: the fp16 engine keeps its own initial scaler; a scale of 0 would make the
 * trainer multiply its loss by 0 and every gradient vanish.
 */
Test(ckpt_review, unscaled_checkpoint_into_fp16_keeps_its_scaler)
{
	struct cfg c = {2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, ZINF_BF16, false};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = make(&c, nvme);
	run(e, c.dtype, 0, 2);
	save_ok(e, ck, NULL);
	zinf_engine_destroy(e);
	struct zinf_engine_opts o;
	edrive_opts(&o, "single", c.stage, c.opt, c.param, nvme, ZINF_F16, GAS);
	o.fp16.enabled = true;
	cr_assert_eq(zinf_engine_create(&o, &e), 0, "%s", zinf_last_error());
	cr_assert_eq(edrive_add_params(e), 0);
	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
	double fresh = zinf_engine_loss_scale(e);
	zinf_engine_destroy(e);
	cr_assert(fresh > 1, "the initial scale %g", fresh);
	cr_assert_eq(zinf_engine_create(&o, &e), 0, "%s", zinf_last_error());
	cr_assert_eq(edrive_add_params(e), 0);
	int rc = zinf_engine_load(e, ck, NULL, NULL);
	cr_assert_eq(rc, 0, "load: %d %s", rc, zinf_last_error());
	cr_expect_eq(zinf_engine_loss_scale(e), fresh, "loss scale %g after the load, expected %g",
		     zinf_engine_loss_scale(e), fresh);
	cr_expect_eq(zinf_engine_steps(e), 2);
	zinf_engine_destroy(e);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
	free(ck);
}

/* ---- other optimizers ---------------------------------------------------------------------- */

/*
 * Resume is exact for every optimizer kind and for bf16 optimizer state with stochastic
 * rounding (whose bits hash the step and the element's index: both must come back as they
 * were), on the CPU and NVMe tiers: 2 steps, save, a new engine loaded, 2 steps equal 4 steps.
 */
static void
resume_optimizer(enum zinf_optim_kind kind, enum zinf_dtype state, enum zinf_offload_device t)
{
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine_opts o;
	edrive_opts(&o, "single", 3, t, ZINF_OFFLOAD_NONE, nvme, ZINF_BF16, GAS);
	zinf_optimizer_opts_init(&o.optimizer, kind);
	o.optimizer.lr = 0.01f;
	o.optimizer.state_dtype = state;
	o.optimizer.seed = 7;
	struct master m[2];
	for (int resumed = 0; resumed < 2; resumed++) {
		struct zinf_engine *e = NULL;
		cr_assert_eq(zinf_engine_create(&o, &e), 0, "%s", zinf_last_error());
		cr_assert_eq(edrive_add_params(e), 0);
		cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
		run(e, ZINF_BF16, 0, 2);
		if (resumed) {
			save_ok(e, ck, NULL);
			zinf_engine_destroy(e);
			cr_assert_eq(zinf_engine_create(&o, &e), 0);
			cr_assert_eq(edrive_add_params(e), 0);
			int rc = zinf_engine_load(e, ck, NULL, NULL);
			cr_assert_eq(rc, 0, "load: %d %s", rc, zinf_last_error());
		}
		run(e, ZINF_BF16, 2, 2);
		read_all(e, &m[resumed]);
		zinf_engine_destroy(e);
	}
	char what[96];
	snprintf(what, sizeof(what), "optimizer %d, state %s, tier %d", kind,
		 zinf_dtype_name(state), t);
	assert_same(m[1].p, m[0].p, what);
	free_all(&m[0]);
	free_all(&m[1]);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
	free(ck);
}

Test(ckpt_review, resume_every_optimizer_and_bf16_state)
{
	enum zinf_offload_device tiers[] = {ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NVME};
	for (int t = 0; t < 2; t++) {
		resume_optimizer(ZINF_OPTIM_ADAM, ZINF_BF16, tiers[t]);
		resume_optimizer(ZINF_OPTIM_ADAMW, ZINF_BF16, tiers[t]);
		resume_optimizer(ZINF_OPTIM_LION, ZINF_F32, tiers[t]);
		resume_optimizer(ZINF_OPTIM_ADAGRAD, ZINF_F32, tiers[t]);
	}
}

/* ---- the streaming writer ------------------------------------------------------------------ */

/*
 * ckpt_writer on more than two of its buffers (both alternate, each waited for before it is
 * refilled) and a last partial block, put in odd-sized pieces: the file holds exactly the bytes
 * put, and the CRC32C is theirs. On the test scratch (O_DIRECT) and on tmpfs (buffered).
 */
static void
writer_one(const char *dir)
{
	struct zinf_io_opts io_o;
	zinf_io_opts_init(&io_o);
	struct zinf_io *io = NULL;
	cr_assert_eq(zinf_io_create(&io_o, &io), 0, "%s", zinf_last_error());
	size_t total = 2 * (size_t)CKPT_WBUF + (CKPT_WBUF / 2) + 4099;
	unsigned char *data = malloc(total);
	cr_assert_not_null(data);
	uint64_t s = 0x9e3779b97f4a7c15ull;
	for (size_t i = 0; i < total; i++) {
		s ^= s << 13, s ^= s >> 7, s ^= s << 17;
		data[i] = (unsigned char)s;
	}
	char p[8192];
	snprintf(p, sizeof(p), "%s/w.bin", dir);
	struct ckpt_writer w;
	cr_assert_eq(ckpt_writer_open(&w, io, p), 0, "%s", zinf_last_error());
	size_t off = 0, piece = 1;
	while (off < total) {
		size_t n = piece < total - off ? piece : total - off;
		cr_assert_eq(ckpt_writer_put(&w, data + off, n), 0, "%s", zinf_last_error());
		off += n;
		piece = piece * 3 + 1; /* 1, 4, 13, ... bytes: across the buffers' edges */
	}
	cr_assert_eq(ckpt_writer_finish(&w), 0, "%s", zinf_last_error());
	cr_assert_eq(w.bytes, total);
	cr_assert_eq(w.crc, zinf_crc32c(0, data, total));
	ckpt_writer_close(&w);
	FILE *f = fopen(p, "rb");
	cr_assert_not_null(f);
	unsigned char *back = malloc(total + 1);
	cr_assert_eq(fread(back, 1, total + 1, f), total, "%s: not %zu bytes", p, total);
	fclose(f);
	cr_assert(memcmp(back, data, total) == 0, "%s: the bytes differ", p);
	free(back);
	free(data);
	zinf_io_destroy(io);
}

Test(ckpt_review, writer_buffers_and_last_block)
{
	char *d = zt_mkdtemp(NULL);
	writer_one(d);
	zt_rmtree(d);
	free(d);
	struct stat st;
	if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode)) {
		char tmpl[] = "/dev/shm/zinf-ckpt-writer-XXXXXX";
		char *t = mkdtemp(tmpl);
		cr_assert_not_null(t);
		writer_one(t);
		zt_rmtree(t);
	}
}

/* ---- the reader and many files ------------------------------------------------------------- */

/*
 * A checkpoint by hand (docs/CHECKPOINT.md) of a world of W ranks: one part (the master), one
 * parameter "w" of W elements, rank r's file r<r>.fp32 holding element r (= r + 0.5).
 */
static void
many_ranks_checkpoint(const char *tagdir, int W)
{
	cr_assert_eq(mkdir(tagdir, 0755), 0, "%s", tagdir);
	json_t *m = json_pack("{s:s, s:i, s:s, s:i, s:i, s:i, s:s, s:i, s:i, s:i, s:f, "
			      "s:{s:f, s:i, s:i, s:i}, s:{s:s, s:s}, s:[{s:s, s:s}], s:i}",
			      "format", "zinf-checkpoint", "version", 1, "tag", "many", "world", W,
			      "files_world", W, "stage", 3, "dtype", "f32", "steps", 1,
			      "micro_steps", 1, "skipped_steps", 0, "lr", 0.01, "loss_scaler",
			      "scale", 1.0, "good_steps", 0, "hysteresis_left", 2, "overflows", 0,
			      "optimizer", "kind", "sgd", "state_dtype", "f32", "parts", "name",
			      "fp32", "dtype", "f32", "client_bytes", 0);
	cr_assert_not_null(m);
	json_t *offs = json_array(), *ranks = json_array(), *files = json_array();
	char p[8192], name[32];
	for (int r = 0; r < W; r++) {
		float v = (float)r + 0.5f;
		snprintf(name, sizeof(name), "r%05d.fp32", r);
		snprintf(p, sizeof(p), "%s/%s", tagdir, name);
		FILE *f = fopen(p, "wb");
		cr_assert_not_null(f, "%s", p);
		cr_assert_eq(fwrite(&v, 4, 1, f), 1);
		fclose(f);
		json_array_append_new(offs, json_integer(0));
		json_array_append_new(ranks, json_pack("{s:i, s:i}", "rank", r, "flat", 1));
		json_array_append_new(files,
				      json_pack("{s:s, s:i, s:I}", "name", name, "bytes", 4,
						"crc32c", (json_int_t)zinf_crc32c(0, &v, 4)));
	}
	json_object_set_new(m, "params",
			    json_pack("[{s:s, s:i, s:i, s:i, s:o}]", "name", "w", "numel", W,
				      "layer", 0, "part", 1, "flat_off", offs));
	json_object_set_new(m, "ranks", ranks);
	json_object_set_new(m, "files", files);
	snprintf(p, sizeof(p), "%s/manifest.json", tagdir);
	cr_assert_eq(json_dump_file(m, p, JSON_INDENT(1)), 0);
	fx_reseal(tagdir); /* as a writer would: the reader's checks of the values are seen */
	json_decref(m);
}

/*
 * A checkpoint of more ranks than the process may hold descriptors (RLIMIT_NOFILE; 1024 by
 * default, a 1024-rank save at stage 3 lists 3072 files): reading a tensor across every rank's
 * file, verifying every file and exporting must not keep a descriptor per file open.
 */
Test(ckpt_review, reader_with_more_files_than_descriptors)
{
	enum { W = 300 };
	char *dir = zt_mkdtemp(NULL);
	char tagdir[4200];
	snprintf(tagdir, sizeof(tagdir), "%s/many", dir);
	many_ranks_checkpoint(tagdir, W);
	struct rlimit rl;
	cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	rl.rlim_cur = 64;
	cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	struct zinf_ckpt *c = NULL;
	int rc = zinf_ckpt_open(dir, "many", &c);
	cr_assert_eq(rc, 0, "open: %d %s", rc, zinf_last_error());
	float out[W];
	rc = zinf_ckpt_read(c, 0, 0, 0, W, ZINF_F32, out);
	cr_assert_eq(rc, 0, "read across %d files: %d %s", W, rc, zinf_last_error());
	for (int r = 0; r < W; r++) {
		cr_assert_eq(out[r], (float)r + 0.5f, "element %d: %g", r, out[r]);
	}
	for (uint32_t i = 0; i < zinf_ckpt_file_count(c); i++) {
		rc = zinf_ckpt_verify_file(c, i);
		cr_assert_eq(rc, 0, "verify file %u: %d %s", i, rc, zinf_last_error());
	}
	char st[4300];
	snprintf(st, sizeof(st), "%s/w.safetensors", dir);
	rc = zinf_ckpt_export(c, st, ZINF_F32, 0);
	cr_assert_eq(rc, 0, "export: %d %s", rc, zinf_last_error());
	zinf_ckpt_close(c);
	zt_rmtree(dir);
	free(dir);
}

/* ---- file systems without renameat2's flags (NFS, Lustre) ---------------------------------- */

/*
 * This program's renameat2 (the library's calls resolve to it: the test links libzinf
 * statically): with no_rename_flags, any flag is refused with EINVAL, as the NFS client and
 * Lustre refuse RENAME_NOREPLACE and RENAME_EXCHANGE; otherwise the system call.
 */
static bool no_rename_flags;
static void ev_rename(const char *from, const char *to); /* the event log below */

int
renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags)
{
	if (no_rename_flags && flags) {
		errno = EINVAL;
		return -1;
	}
	ev_rename(oldpath, newpath);
	return (int)syscall(SYS_renameat2, olddirfd, oldpath, newdirfd, newpath, flags);
}

/*
 * A checkpoint directory on such a file system (the shared file system a multi-node save
 * needs): a new tag is published with a plain rename (the lock keeps other savers out), and
 * saving over an existing tag, which cannot be swapped in one step there, is refused naming
 * the reason, the previous checkpoints and latest untouched.
 */
Test(ckpt_review, publish_without_rename_flags)
{
	struct cfg c = {2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, ZINF_F32, false};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = make(&c, nvme);
	run(e, c.dtype, 0, 1);
	no_rename_flags = true;
	save_ok(e, ck, "a");
	run(e, c.dtype, 1, 1);
	save_ok(e, ck, "b");
	int rc = zinf_engine_save(e, ck, "b", NULL);
	cr_expect_eq(rc, -EOPNOTSUPP, "saving over tag b: %d %s", rc, zinf_last_error());
	cr_expect(strstr(zinf_last_error(), "RENAME_EXCHANGE") != NULL, "%s", zinf_last_error());
	cr_assert(!exists(ck, ".b.tmp"), "the refused save left .b.tmp");
	no_rename_flags = false;
	zinf_engine_destroy(e);
	e = make(&c, nvme);
	rc = zinf_engine_load(e, ck, NULL, NULL);
	cr_assert_eq(rc, 0, "load: %d %s", rc, zinf_last_error());
	cr_assert_eq(zinf_engine_steps(e), 2);
	cr_assert_eq(zinf_engine_load(e, ck, "a", NULL), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_steps(e), 1);
	zinf_engine_destroy(e);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
	free(ck);
}

/* ---- durability of a new checkpoint directory ---------------------------------------------- */

/* This program's fsync and rename (as renameat2 above): with fsync_log set, every fsync (the
 * descriptor's path) and every rename, renameat2 included, is remembered in order. */
static bool fsync_log;
static struct {
	char what; /* 's' fsync, 'r' rename */
	char a[512], b[512];
} ev[256];
static int n_ev;

static void
ev_rename(const char *from, const char *to)
{
	if (fsync_log && n_ev < 256) {
		ev[n_ev].what = 'r';
		snprintf(ev[n_ev].a, sizeof(ev[0].a), "%s", from);
		snprintf(ev[n_ev].b, sizeof(ev[0].b), "%s", to);
		n_ev++;
	}
}

int
fsync(int fd)
{
	if (fsync_log && n_ev < 256) {
		char l[64];
		snprintf(l, sizeof(l), "/proc/self/fd/%d", fd);
		ssize_t n = readlink(l, ev[n_ev].a, sizeof(ev[0].a) - 1);
		ev[n_ev].a[n > 0 ? n : 0] = '\0';
		ev[n_ev].what = 's';
		n_ev++;
	}
	return (int)syscall(SYS_fsync, fd);
}

int
rename(const char *from, const char *to)
{
	ev_rename(from, to);
	return (int)syscall(SYS_renameat2, AT_FDCWD, from, AT_FDCWD, to, 0);
}

/* Index of the first event (what, a[, b]) at or after `from`; -1 when none. */
static int
ev_find(int from, char what, const char *a, const char *b)
{
	for (int i = from; i < n_ev; i++) {
		if (ev[i].what == what && strcmp(ev[i].a, a) == 0 &&
		    (!b || strcmp(ev[i].b, b) == 0)) {
			return i;
		}
	}
	return -1;
}

static bool
was_fsynced(const char *path)
{
	char real[4096];
	cr_assert_not_null(realpath(path, real), "%s", path);
	return ev_find(0, 's', real, NULL) >= 0;
}

/*
 * The first save into a DIR it creates: DIR's entry in its parent is made durable too (the
 * parent fsynced), or a power cut after the save returned can take DIR, and the checkpoint in
 * it, away.
 */
Test(ckpt_review, new_directory_entry_is_synced)
{
	struct cfg c = {2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, ZINF_F32, false};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	char dir[4200];
	snprintf(dir, sizeof(dir), "%s/run1", ck);
	struct zinf_engine *e = make(&c, nvme);
	run(e, c.dtype, 0, 1);
	fsync_log = true;
	save_ok(e, dir, "a");
	fsync_log = false;
	cr_assert(was_fsynced(dir), "%s was not fsynced", dir);
	cr_assert(was_fsynced(ck), "%s (the parent of the new %s) was not fsynced", ck, dir);
	zinf_engine_destroy(e);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
	free(ck);
}

/*
 * The order of a save's durable steps (a tag saved again, with model.safetensors and a client
 * blob): every file of the new TAG fsynced (under its temporary name when it was renamed
 * inside the temporary directory) before the temporary directory is; that before it is swapped
 * into place; DIR fsynced after; then latest written, fsynced, renamed, and DIR fsynced again.
 */
Test(ckpt_review, save_syncs_in_order)
{
	struct cfg c = {3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_CPU, ZINF_BF16, false};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	char real[4096];
	cr_assert_not_null(realpath(ck, real));
	struct zinf_engine *e = make(&c, nvme);
	run(e, c.dtype, 0, 1);
	save_ok(e, real, "a");
	run(e, c.dtype, 1, 1);
	struct zinf_ckpt_opts so;
	zinf_ckpt_opts_init(&so);
	so.client = "blob";
	so.client_bytes = 4;
	so.gather_16bit = 1;
	fsync_log = true;
	n_ev = 0;
	int rc = zinf_engine_save(e, real, "a", &so);
	fsync_log = false;
	cr_assert_eq(rc, 0, "%d %s", rc, zinf_last_error());
	zinf_engine_destroy(e);
	char tmp[4200], fin[4200], lt[4200], ltmp[4200], p[8400];
	snprintf(tmp, sizeof(tmp), "%s/.a.tmp", real);
	snprintf(fin, sizeof(fin), "%s/a", real);
	snprintf(lt, sizeof(lt), "%s/latest", real);
	snprintf(ltmp, sizeof(ltmp), "%s/.latest.tmp", real);
	int t_sync = ev_find(0, 's', tmp, NULL);
	cr_assert_geq(t_sync, 0, "%s never fsynced", tmp);
	int swap = ev_find(t_sync, 'r', tmp, fin);
	cr_assert_geq(swap, 0, "%s not renamed to %s after its fsync", tmp, fin);
	int d_sync = ev_find(swap, 's', real, NULL);
	cr_assert_geq(d_sync, 0, "%s not fsynced after the rename", real);
	int l_sync = ev_find(d_sync, 's', ltmp, NULL);
	cr_assert_geq(l_sync, 0, "%s not fsynced after DIR", ltmp);
	int l_ren = ev_find(l_sync, 'r', ltmp, lt);
	cr_assert_geq(l_ren, 0, "latest not renamed into place after its fsync");
	cr_assert_geq(ev_find(l_ren, 's', real, NULL), 0, "DIR not fsynced after latest");
	DIR *d = opendir(fin);
	cr_assert_not_null(d);
	struct dirent *de;
	int files = 0;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.') {
			continue;
		}
		files++;
		snprintf(p, sizeof(p), "%s/%s", tmp, de->d_name);
		int at = ev_find(0, 's', p, NULL);
		for (int i = 0; at < 0 && i < n_ev; i++) { /* fsynced, then renamed to p */
			if (ev[i].what == 'r' && strcmp(ev[i].b, p) == 0) {
				int s2 = ev_find(0, 's', ev[i].a, NULL);
				at = s2 >= 0 && s2 < i ? i : -1;
			}
		}
		cr_expect(at >= 0 && at < t_sync, "%s: not fsynced before %s", de->d_name, tmp);
	}
	closedir(d);
	cr_assert_geq(files, 6, "%d files in %s", files, fin);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
	free(ck);
}

/* ---- a directory without room for the checkpoint ------------------------------------------- */

/* This program's statvfs (as renameat2 above): with fake_free set, the free space it reports. */
static uint64_t fake_free;

int
statvfs(const char *path, struct statvfs *out)
{
	struct statfs fs;
	int rc = (int)syscall(SYS_statfs, path, &fs);
	if (rc != 0) {
		return -1;
	}
	memset(out, 0, sizeof(*out));
	out->f_bsize = (unsigned long)fs.f_bsize;
	out->f_frsize = (unsigned long)(fs.f_frsize ? fs.f_frsize : fs.f_bsize);
	out->f_blocks = fs.f_blocks;
	out->f_bfree = fs.f_bfree;
	out->f_bavail = fs.f_bavail;
	if (fake_free) {
		out->f_bavail = fake_free / out->f_frsize;
	}
	return 0;
}

/* The checkpoint needs every stored rank's state: refused by rank 0 with the bytes free and
 * needed before anything is written; the previous checkpoint and `latest` stay, the engine goes
 * on. */
Test(ckpt_review, save_refused_without_room)
{
	struct cfg c = {3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, ZINF_F32, false};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = make(&c, nvme);
	run(e, c.dtype, 0, 1);
	save_ok(e, ck, "a");
	fake_free = 1 << 20; /* less than the 64 MiB margin alone */
	int rc = zinf_engine_save(e, ck, "b", NULL);
	fake_free = 0;
	cr_assert_eq(rc, -ENOSPC, "%d %s", rc, zinf_last_error());
	cr_assert(strstr(zinf_last_error(), "bytes free") && strstr(zinf_last_error(), "needs"),
		  "%s", zinf_last_error());
	char p[8300];
	snprintf(p, sizeof(p), "%s/.b.tmp", ck);
	cr_assert(access(p, F_OK) != 0, "the temporary directory is left");
	snprintf(p, sizeof(p), "%s/b", ck);
	cr_assert(access(p, F_OK) != 0, "a refused save was published");
	run(e, c.dtype, 1, 1); /* the engine goes on */
	save_ok(e, ck, "b");
	zinf_engine_destroy(e);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
	free(ck);
}
