/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/ckpt/test_ckpt_resume.c: what zinf_engine_load restores into an engine and what a
 * save leaves of it, one process (comm "single", device "host"): a load into an engine that has
 * trained (stage 3 with layers kept gathered, persistent parameters and the store's CPU cache),
 * refused while the trainer holds a layer fetched; every optimizer kind and bf16 state with
 * stochastic rounding resumed exactly; the loss scaler of a checkpoint without one under fp16;
 * manifest values out of range and overlapping partitions refused before anything is loaded;
 * and the step after a save reads and computes what it would without the save. Resume over
 * every stage and tier, the blob, the other refusals, crashes: test_ckpt.c.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_fixture.h"
#include "common/dtype.h"
#include "common/test_util.h"
#include "engine/engine_drive.h"
#include "engine/engine_ref.h"
#include "common/dtype.h"
#include "zinf/blocks/offload.h"
#include "zinf/checkpoint.h"
#include "zinf/device.h"
#include "zinf/engine.h"

#define QUANTUM 0x1p-14f
#define GAS	2

#include "ckpt/ckpt_test.h"

/*
 * The largest calloc while tracking (q8 state's decode buffers of save and load are the
 * library's zc_calloc, which is calloc): this file's calloc is glibc's behind a counter. Not
 * under AddressSanitizer or ThreadSanitizer, whose own calloc this would bypass.
 */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define CALLOC_TRACKED 0
#else
#define CALLOC_TRACKED 1
#include <stdatomic.h>
extern void *__libc_calloc(size_t n, size_t len);
static atomic_bool calloc_track;
static atomic_size_t calloc_max;
void *
calloc(size_t n, size_t len)
{
	if (atomic_load(&calloc_track)) {
		size_t b = n * len, m = atomic_load(&calloc_max);
		while (b > m && !atomic_compare_exchange_weak(&calloc_max, &m, b)) {
		}
	}
	return __libc_calloc(n, len);
}
#endif

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
	struct ckpt_cfg c = {3, opt, par, ZINF_BF16, true};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = ckpt_make(&c, nvme);
	run(e, c.dtype, 0, 2);
	save_ok(e, ck, "two");
	run(e, c.dtype, 2, 2);
	struct master straight;
	read_all(e, &straight);
	zinf_engine_destroy(e);

	e = ckpt_make(&c, nvme);
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

Test(ckpt_resume, load_into_running_stage3_with_caches)
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
Test(ckpt_resume, load_refused_while_a_layer_is_fetched)
{
	struct ckpt_cfg c = {3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_CPU, ZINF_F32, false};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = ckpt_make(&c, nvme);
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

/* ---- what a save does to the engine -------------------------------------------------------- */

/* The step after a save reads no more NVMe bytes than without it (the save's own reads are no
 * step's; a partition the save read may still be in the store's buffers when the step fetches it,
 * which depends on timing: seen under ASan, 480 bytes fewer; the bytes written are counted as the
 * writes complete, which varies run to run), and its values are the same. */
Test(ckpt_resume, save_leaves_the_next_step_alone)
{
	struct ckpt_cfg c = {3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, ZINF_BF16, false};
	struct zinf_engine_stats s[2];
	struct master m[2];
	for (int with = 0; with < 2; with++) {
		char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
		struct zinf_engine *e = ckpt_make(&c, nvme);
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
	cr_expect_leq(s[1].nvme_read_bytes, s[0].nvme_read_bytes, "read %llu with a save, %llu",
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
Test(ckpt_resume, manifest_values_out_of_range)
{
	struct ckpt_cfg c = {2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, ZINF_F16, false};
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
	char good[4200], bad[4200];
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
		cr_assert_eq(zt_copytree(good, bad), 0);
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
 * Two parameters whose partitions overlap in a rank's files (of params[0] and params[1], the one
 * later in the files moved onto the other's offset, the manifest resealed with a valid CRC32C,
 * every file intact): a load would give both the same state and train on it. Refused before
 * anything is loaded, naming both parameters, the rank and its files; the engine is left as it
 * was and the good checkpoint still loads.
 */
Test(ckpt_resume, overlapping_partitions_refused)
{
	struct ckpt_cfg c = {2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, ZINF_F32, false};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = ckpt_make(&c, nvme);
	run(e, c.dtype, 0, 2);
	save_ok(e, ck, "good");
	zinf_engine_destroy(e);
	char good[4200], bad[4200], p[4300];
	snprintf(good, sizeof(good), "%s/good", ck);
	snprintf(bad, sizeof(bad), "%s/bad", ck);
	cr_assert_eq(zt_copytree(good, bad), 0);
	snprintf(p, sizeof(p), "%s/manifest.json", bad);
	json_error_t jerr;
	json_t *m = json_load_file(p, 0, &jerr);
	cr_assert_not_null(m, "%s: %s", p, jerr.text);
	json_t *params = json_object_get(m, "params");
	json_t *fo[2];
	json_int_t off[2];
	char names[2][64];
	for (int i = 0; i < 2; i++) {
		json_t *q = json_array_get(params, (size_t)i);
		fo[i] = json_object_get(q, "flat_off");
		off[i] = json_integer_value(json_array_get(fo[i], 0));
		snprintf(names[i], sizeof(names[i]), "\"%s\"",
			 json_string_value(json_object_get(q, "name")));
	}
	cr_assert_neq(off[0], off[1]);
	int later = off[1] > off[0]; /* moved onto the earlier: no hole before the overlap */
	json_array_set_new(fo[later], 0, json_integer(off[!later]));
	cr_assert_eq(json_dump_file(m, p, JSON_INDENT(1)), 0);
	json_decref(m);
	fx_reseal(bad);

	e = ckpt_make(&c, nvme);
	int rc = zinf_engine_load(e, ck, "bad", NULL);
	cr_expect_eq(rc, -EBADMSG, "load returned %d", rc);
	const char *msg = zinf_last_error();
	const char *need[] = {names[0], names[1], "overlaps", "rank 0 (r00000.fp32"};
	for (size_t i = 0; i < sizeof(need) / sizeof(need[0]); i++) {
		cr_expect(strstr(msg, need[i]) != NULL, "\"%s\" not in: %s", need[i], msg);
	}
	cr_expect_eq(zinf_engine_steps(e), 0, "a refused load changed the engine");
	struct master mine;
	read_all(e, &mine);
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		for (uint64_t i = 0; i < eref_numel(id); i++) {
			cr_assert_eq(mine.p[id][i], eref_init_value(id, i), "%s[%llu] changed",
				     eref_params[id].name, (unsigned long long)i);
		}
	}
	free_all(&mine);
	cr_assert_eq(zinf_engine_load(e, ck, "good", NULL), 0, "%s", zinf_last_error());
	cr_expect_eq(zinf_engine_steps(e), 2);
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
Test(ckpt_resume, unscaled_checkpoint_into_fp16_keeps_its_scaler)
{
	struct ckpt_cfg c = {2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, ZINF_BF16, false};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = ckpt_make(&c, nvme);
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
resume_optimizer_fmt(enum zinf_optim_kind kind, enum zinf_dtype state, enum zinf_offload_device t,
		     enum zinf_state_format fmt, enum zinf_dtype master)
{
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine_opts o;
	edrive_opts(&o, "single", 3, t, ZINF_OFFLOAD_NONE, nvme, ZINF_BF16, GAS);
	zinf_optimizer_opts_init(&o.optimizer, kind);
	o.optimizer.lr = 0.01f;
	o.optimizer.state_dtype = state;
	o.optimizer.state_format = fmt;
	o.optimizer.master_dtype = master;
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
	snprintf(what, sizeof(what), "optimizer %d, state %s%s, master %s, tier %d", kind,
		 zinf_dtype_name(state), fmt == ZINF_STATE_Q8 ? " q8" : "", zinf_dtype_name(master),
		 t);
	assert_same(m[1].p, m[0].p, what);
	free_all(&m[0]);
	free_all(&m[1]);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
	free(ck);
}

static void
resume_optimizer(enum zinf_optim_kind kind, enum zinf_dtype state, enum zinf_offload_device t)
{
	resume_optimizer_fmt(kind, state, t, ZINF_STATE_PLAIN, ZINF_F32);
}

/*
 * 8-bit blockwise (q8) state is saved decoded (f32 files) and encoded back at load: resume is
 * exact at the same sub-groups (decode then encode gives the same codes and scales), on both
 * tiers, for Adam (L2) and AdamW.
 */
Test(ckpt_resume, resume_q8_state)
{
	enum zinf_offload_device tiers[] = {ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NVME};
	for (int t = 0; t < 2; t++) {
		resume_optimizer_fmt(ZINF_OPTIM_ADAMW, ZINF_F32, tiers[t], ZINF_STATE_Q8, ZINF_F32);
		resume_optimizer_fmt(ZINF_OPTIM_ADAM, ZINF_F32, tiers[t], ZINF_STATE_Q8, ZINF_F32);
	}
}

/*
 * A bf16 master is saved widened (f32 files, exact) and rounded to nearest at load, which gives
 * back the same bf16 values: resume is exact (the stochastic rounding's bits hash the step and
 * the element's index, both as they were) with fp32, bf16 and q8 moments on both tiers.
 */
Test(ckpt_resume, resume_bf16_master)
{
	enum zinf_offload_device tiers[] = {ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NVME};
	for (int t = 0; t < 2; t++) {
		resume_optimizer_fmt(ZINF_OPTIM_ADAMW, ZINF_F32, tiers[t], ZINF_STATE_PLAIN,
				     ZINF_BF16);
		resume_optimizer_fmt(ZINF_OPTIM_ADAMW, ZINF_BF16, tiers[t], ZINF_STATE_PLAIN,
				     ZINF_BF16);
		resume_optimizer_fmt(ZINF_OPTIM_ADAM, ZINF_F32, tiers[t], ZINF_STATE_Q8, ZINF_BF16);
	}
}

/*
 * The master's file is f32 whatever the master's dtype, so checkpoints cross: one saved with a
 * bf16 master loads into an fp32-master engine with the same masters (bf16 values, widened), and
 * one saved with an fp32 master loads into a bf16-master engine as its masters rounded to
 * nearest (checked element by element against dt_f32_to_bf16_rne of the saved values; some of
 * them are not bf16 values, so the rounding is seen). Both then train.
 */
Test(ckpt_resume, bf16_master_and_fp32_master_checkpoints_cross)
{
	for (int from_bf16 = 0; from_bf16 < 2; from_bf16++) {
		char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
		struct zinf_engine_opts o;
		edrive_opts(&o, "single", 3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, nvme, ZINF_BF16,
			    GAS);
		o.optimizer.lr = 0.01f;
		o.optimizer.master_dtype = from_bf16 ? ZINF_BF16 : ZINF_F32;
		struct master saved, got;
		struct zinf_engine *e = NULL;
		cr_assert_eq(zinf_engine_create(&o, &e), 0, "%s", zinf_last_error());
		cr_assert_eq(edrive_add_params(e), 0);
		cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
		run(e, ZINF_BF16, 0, 2);
		save_ok(e, ck, NULL);
		read_all(e, &saved);
		zinf_engine_destroy(e);
		o.optimizer.master_dtype = from_bf16 ? ZINF_F32 : ZINF_BF16;
		cr_assert_eq(zinf_engine_create(&o, &e), 0, "%s", zinf_last_error());
		cr_assert_eq(edrive_add_params(e), 0);
		int rc = zinf_engine_load(e, ck, NULL, NULL);
		cr_assert_eq(rc, 0, "load: %d %s", rc, zinf_last_error());
		read_all(e, &got);
		uint64_t rounded = 0;
		for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
			for (uint64_t i = 0; i < eref_numel(id); i++) {
				float want = dt_bf16_to_f32(dt_f32_to_bf16_rne(saved.p[id][i]));
				cr_assert_eq(got.p[id][i], from_bf16 ? saved.p[id][i] : want,
					     "from %s: %s[%llu] %.9g, saved %.9g",
					     from_bf16 ? "bf16" : "fp32", eref_params[id].name,
					     (unsigned long long)i, got.p[id][i], saved.p[id][i]);
				rounded += want != saved.p[id][i];
			}
		}
		cr_assert(from_bf16 ? rounded == 0 : rounded > 0,
			  "from %s: %llu saved masters are not bf16 values",
			  from_bf16 ? "bf16" : "fp32", (unsigned long long)rounded);
		run(e, ZINF_BF16, 2, 2);
		cr_assert_eq(zinf_engine_steps(e), 4);
		free_all(&saved);
		free_all(&got);
		zinf_engine_destroy(e);
		zt_rmtree(nvme);
		zt_rmtree(ck);
		free(nvme);
		free(ck);
	}
}

Test(ckpt_resume, resume_every_optimizer_and_bf16_state)
{
	enum zinf_offload_device tiers[] = {ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NVME};
	for (int t = 0; t < 2; t++) {
		resume_optimizer(ZINF_OPTIM_ADAM, ZINF_BF16, tiers[t]);
		resume_optimizer(ZINF_OPTIM_ADAMW, ZINF_BF16, tiers[t]);
		resume_optimizer(ZINF_OPTIM_LION, ZINF_F32, tiers[t]);
		resume_optimizer(ZINF_OPTIM_ADAGRAD, ZINF_F32, tiers[t]);
	}
}

/* One step of the one-parameter engine below: a gradient of step t, as bf16. */
static void
big_step(struct zinf_engine *e, void *dev, uint16_t *gh, size_t n, int64_t t)
{
	for (size_t i = 0; i < n; i++) {
		double x = sin(0.001 * (double)i * (double)(t + 1)) * (i % 7 == 3 ? 1e-3 : 1.0);
		gh[i] = dt_f32_to_bf16_rne((float)x);
	}
	cr_assert_eq(zinf_engine_fetch(e, 0), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_release(e, 0), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_fetch(e, 0), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_device_copy(zinf_engine_compute_stream(e), dev, gh, n * 2, ZINF_COPY_H2D),
		     0);
	cr_assert_eq(zinf_engine_grad(e, 0, dev, ZINF_BF16), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_release(e, 0), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_step(e), 1, "%s", zinf_last_error());
	cr_assert_eq(zinf_stream_sync(zinf_engine_compute_stream(e)), 0);
}

static struct zinf_engine *
big_engine(const struct zinf_engine_opts *o, const float *init, uint64_t n)
{
	struct zinf_engine *e = NULL;
	cr_assert_eq(zinf_engine_create(o, &e), 0, "%s", zinf_last_error());
	struct zinf_param_desc d;
	zinf_param_desc_init(&d);
	d.name = "w";
	d.numel = n;
	d.init_dtype = ZINF_F32;
	d.init = init;
	cr_assert_eq(zinf_engine_add_param(e, &d), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
	return e;
}

/*
 * q8 state of a sub-group larger than ZINF_STEP_CHUNK (one sub-group of 2 x 2^20 + 1000
 * elements, the default sub_group_size): save decodes and load encodes it in pieces of
 * ZINF_STEP_CHUNK elements, so neither allocates more than ZINF_STEP_CHUNK floats for it (before:
 * one float per element of the sub-group to save, two to load, outside the pool budget), and
 * the resume is still bit for bit (the pieces are cut at the sub-group's blocks).
 */
Test(ckpt_resume, q8_state_of_a_sub_group_larger_than_a_piece)
{
	const uint64_t n = 2 * (uint64_t)ZINF_STEP_CHUNK + 1000;
	char *ck = zt_mkdtemp(NULL);
	struct zinf_engine_opts o;
	edrive_opts(&o, "single", 1, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, NULL, ZINF_BF16, 1);
	o.sub_group_size = 1000000000;
	o.optimizer.lr = 0.01f;
	o.optimizer.state_format = ZINF_STATE_Q8;
	float *init = malloc(n * 4), *a = malloc(n * 4), *b = malloc(n * 4);
	uint16_t *gh = malloc(n * 2);
	for (uint64_t i = 0; i < n; i++) {
		init[i] = (float)cos(0.37 * (double)i);
	}
	struct zinf_engine *e = big_engine(&o, init, n);
	void *dev = NULL, *dev2 = NULL;
	cr_assert_eq(zinf_device_alloc(zinf_engine_device(e), n * 2, &dev), 0);
	big_step(e, dev, gh, n, 0);
	big_step(e, dev, gh, n, 1);
#if CALLOC_TRACKED
	atomic_store(&calloc_max, 0);
	atomic_store(&calloc_track, true);
#endif
	save_ok(e, ck, NULL);
#if CALLOC_TRACKED
	atomic_store(&calloc_track, false);
	size_t save_max = atomic_load(&calloc_max);
#endif
	big_step(e, dev, gh, n, 2);
	cr_assert_eq(zinf_engine_read_master(e, 0, a), 0, "%s", zinf_last_error());
	struct zinf_engine *r = big_engine(&o, init, n);
#if CALLOC_TRACKED
	atomic_store(&calloc_max, 0);
	atomic_store(&calloc_track, true);
#endif
	int rc = zinf_engine_load(r, ck, NULL, NULL);
#if CALLOC_TRACKED
	atomic_store(&calloc_track, false);
	size_t load_max = atomic_load(&calloc_max);
#endif
	cr_assert_eq(rc, 0, "load: %d %s", rc, zinf_last_error());
	cr_assert_eq(zinf_device_alloc(zinf_engine_device(r), n * 2, &dev2), 0);
	big_step(r, dev2, gh, n, 2);
	cr_assert_eq(zinf_engine_read_master(r, 0, b), 0, "%s", zinf_last_error());
	for (uint64_t i = 0; i < n; i++) {
		cr_assert_eq(dt_f2u(a[i]), dt_f2u(b[i]), "master %llu: %.9g resumed, %.9g straight",
			     (unsigned long long)i, b[i], a[i]);
	}
	cr_assert(memcmp(a, init, n * 4) != 0, "the steps moved nothing");
#if CALLOC_TRACKED
	size_t bound = (size_t)ZINF_STEP_CHUNK * sizeof(float);
	cr_log_info("largest calloc: %zu bytes in save, %zu in load", save_max, load_max);
	cr_assert(save_max <= bound && load_max <= bound,
		  "largest calloc: %zu bytes in save, %zu in load, over %zu (a sub-group of %llu "
		  "elements)",
		  save_max, load_max, bound, (unsigned long long)n);
#else
	/* (a warning would fail Criterion's run: cr_log_warn counts as a failure) */
	cr_log_info("the allocation bound is not checked under this sanitizer");
#endif
	zinf_device_free(zinf_engine_device(e), dev);
	zinf_device_free(zinf_engine_device(r), dev2);
	zinf_engine_destroy(e);
	zinf_engine_destroy(r);
	free(init), free(a), free(b), free(gh);
	zt_rmtree(ck);
	free(ck);
}

/*
 * q8 state into other sub-groups (another sub_group_size: other blocks, as another world size
 * would give): the load works, encoding the saved floats into the new blocks; the masters come
 * back exactly, and two more steps stay within 5% of the uninterrupted run's movement over them
 * (the re-quantization moves m and v by at most their codes' error, 2^-5; measured 0.9%, and
 * 0.5% into fp32 state; a difference of 0 would mean the blocks did not change).
 * The same checkpoint loads into an engine with fp32 state, and resumes there.
 */
Test(ckpt_resume, q8_state_into_other_sub_groups_and_fp32)
{
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine_opts o;
	edrive_opts(&o, "single", 3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, nvme, ZINF_BF16, GAS);
	o.optimizer.lr = 0.01f;
	o.optimizer.state_format = ZINF_STATE_Q8;
	struct master saved, straight, moved, other, f32;
	struct zinf_engine *e = NULL;
	cr_assert_eq(zinf_engine_create(&o, &e), 0, "%s", zinf_last_error());
	cr_assert_eq(edrive_add_params(e), 0);
	cr_assert_eq(zinf_engine_init(e), 0, "%s", zinf_last_error());
	run(e, ZINF_BF16, 0, 2);
	save_ok(e, ck, NULL);
	read_all(e, &saved);
	run(e, ZINF_BF16, 2, 2);
	read_all(e, &straight);
	zinf_engine_destroy(e);
	for (int k = 0; k < 2; k++) {
		struct zinf_engine_opts p = o;
		if (k == 0) {
			p.sub_group_size =
				1000000; /* one sub-group, not one per parameter: other blocks */
		} else {
			p.optimizer.state_format = ZINF_STATE_PLAIN;
		}
		cr_assert_eq(zinf_engine_create(&p, &e), 0, "%s", zinf_last_error());
		cr_assert_eq(edrive_add_params(e), 0);
		int rc = zinf_engine_load(e, ck, NULL, NULL);
		cr_assert_eq(rc, 0, "load %d: %d %s", k, rc, zinf_last_error());
		read_all(e, &moved);
		assert_same(moved.p, saved.p,
			    k ? "masters loaded into fp32 state" : "masters loaded");
		free_all(&moved);
		run(e, ZINF_BF16, 2, 2);
		read_all(e, k ? &f32 : &other);
		zinf_engine_destroy(e);
	}
	double dev = 0, dev32 = 0, mv = 0;
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		for (uint64_t i = 0; i < eref_numel(id); i++) {
			dev += fabs((double)other.p[id][i] - straight.p[id][i]);
			dev32 += fabs((double)f32.p[id][i] - straight.p[id][i]);
			mv += fabs((double)straight.p[id][i] - saved.p[id][i]);
		}
	}
	cr_assert(mv > 0 && dev > 0 && dev < 0.05 * mv && dev32 < 0.05 * mv,
		  "after the load: %.6g (other sub-groups), %.6g (fp32 state) from the "
		  "uninterrupted run, which moved %.6g",
		  dev, dev32, mv);
	free_all(&saved), free_all(&straight), free_all(&other), free_all(&f32);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
	free(ck);
}
