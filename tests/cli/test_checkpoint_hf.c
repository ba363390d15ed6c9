/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/cli/test_checkpoint_hf.c: `zinf checkpoint export DIR --hf OUT` on checkpoints that
 * zinf_gpt saves ($ZINF_GPT; the fixtures of tests/fixtures/hf/, $ZINF_HF_FIXTURES), as a user
 * runs them (OMP_NUM_THREADS=1, the CPU layers):
 *  - identity: zinf_gpt --from-hf llama-tiny (ZeRO-0) and gpt2-tiny (ZeRO-3, parameters and
 *    optimizer on NVMe) for one step at lr 0 (AdamW with weight decay 0.1: nothing moves),
 *    saved, exported: every tensor of the fixture, name, shape, stored type and bits (GPT-2's
 *    Conv1D weights transposed back), nothing more, and config.json byte for byte; then
 *    export -> import: zinf_gpt --from-hf OUT trains 6 steps at lr 1e-2 to the same losses, bit
 *    for bit, as from the fixture (and the loss falls, so that the runs train);
 *  - a model zinf_gpt made from its flags (GPT-2, a grouped-query Llama with its own head): the
 *    config.json it writes beside its checkpoints (its fields, GPT-2's n_positions the
 *    context), exported, imported again, saved and exported again: the same tensors and
 *    config.json;
 *  - the default export (--out) of those checkpoints carries every tensor's real shape: the 2-D
 *    weights 2-D ([3C, C] for c_attn, zinf's layout; [KV heads x head size, C] for k_proj);
 *  - shards: --shard-size 20KB gives several shards and model.safetensors.index.json, read back
 *    equal to the single file; "20KB" is 20000 bytes, "20KiB" 20480, "160Kb" (bits) 20000, as
 *    transformers reads max_shard_size; a size that is none is refused;
 *  - --dtype bf16: every value the fixture's f32 rounded to nearest even (worked here on the
 *    bits; some values round up, so truncation would fail), config.json's dtype "bfloat16";
 *  - refusals (exit 2, nothing written): no config.json beside the checkpoint and no
 *    --hf-config (both places named), another model's config.json (a tensor named), an OUT
 *    that holds an export (named; --force replaces it), --out with --hf, --hf-config without
 *    --hf, an OUT that is a file.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_run.h"
#include "common/test_util.h"
#include "zinf/safetensors.h"

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

TestSuite(checkpoint_hf, .init = setup, .fini = teardown);

static const char *
gpt(void)
{
	const char *p = getenv("ZINF_GPT");
	if (!p || access(p, X_OK) != 0) {
		cr_skip_test("ZINF_GPT not set or not executable (run through ctest)");
	}
	return p;
}

static const char *
fix(void)
{
	const char *p = getenv("ZINF_HF_FIXTURES");
	cr_assert(p && *p, "ZINF_HF_FIXTURES not set (run through ctest)");
	return p;
}

/* "<sc.dir>/<name>" */
static const char *
at(const char *name)
{
	static char buf[8][4400];
	static int k;
	char *b = buf[k++ % 8];
	snprintf(b, sizeof(buf[0]), "%s/%s", sc.dir, name);
	return b;
}

/*
 * A ds_config into sc.dir/<name>: AdamW, lr "auto" (zinf_gpt's --lr), weight decay 0.1, no
 * scheduler (a constant lr); ZeRO-0, or ZeRO-3 with parameters and optimizer on NVMe.
 */
static const char *
config(const char *name, bool nvme)
{
	static char p[4400]; /* not at()'s: the runs that take it call at() */
	snprintf(p, sizeof(p), "%s", at(name));
	FILE *f = fopen(p, "w");
	cr_assert_not_null(f);
	fprintf(f,
		"{\"train_batch_size\": \"auto\", \"train_micro_batch_size_per_gpu\": \"auto\",\n"
		" \"gradient_accumulation_steps\": \"auto\", \"steps_per_print\": 100,\n"
		" \"optimizer\": {\"type\": \"AdamW\", \"params\": {\"lr\": \"auto\",\n"
		"   \"betas\": [0.9, 0.95], \"eps\": 1e-8, \"weight_decay\": 0.1}},\n"
		" \"zero_optimization\": %s}\n",
		nvme ? "{\"stage\": 3, \"stage3_param_persistence_threshold\": 0,\n"
		       "   \"offload_param\": {\"device\": \"nvme\", \"nvme_path\": \"scratch\",\n"
		       "     \"buffer_count\": 16, \"buffer_size\": 1e6, \"max_in_cpu\": 0},\n"
		       "   \"offload_optimizer\": {\"device\": \"nvme\",\n"
		       "     \"nvme_path\": \"scratch\"}}"
		     : "{\"stage\": 0}");
	fclose(f);
	return p;
}

/* zinf_gpt on the CPU layers, quiet, with the arguments after fmt; its exit code (stdout and
 * stderr in sc's files). */
static int gpt_run(const char *cfg, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int
gpt_run(const char *cfg, const char *fmt, ...)
{
	char args[4096], cmd[16384];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	snprintf(cmd, sizeof(cmd),
		 "OMP_NUM_THREADS=1 exec '%s' --config '%s' --device host --quiet --no-progress "
		 "--scratch-parent '%s' %s >'%s' 2>'%s'",
		 gpt(), cfg, sc.dir, args, sc.out, sc.err);
	int st = system(cmd);
	cr_assert(WIFEXITED(st), "%s: killed", cmd);
	return WEXITSTATUS(st);
}

static void
gpt_ok(const char *cfg, const char *args)
{
	int rc = gpt_run(cfg, "%s", args);
	cr_assert_eq(rc, 0, "zinf_gpt %s: exit %d: %s", args, rc, zc_text(sc.err));
}

static void
zinf_ok(const char *args)
{
	int rc = zc_run_sh(&sc, "", "", "%s", args);
	cr_assert_eq(rc, 0, "zinf %s: exit %d: %s", args, rc, zc_text(sc.err));
}

/* zinf exits 2, its stderr holding each of want, and `absent` (when given) does not exist. */
static void
zinf_refused(const char *args, const char *absent, const char *const *want)
{
	int rc = zc_run_sh(&sc, "", "", "%s", args);
	char *err = zc_text(sc.err);
	cr_assert_eq(rc, 2, "zinf %s: exit %d: %s", args, rc, err);
	for (; *want; want++) {
		cr_assert(strstr(err, *want), "zinf %s: \"%s\" not in its stderr: %s", args, *want,
			  err);
	}
	struct stat st;
	cr_assert(!absent || lstat(absent, &st) != 0, "a refused export made %s", absent);
	free(err);
}

static struct zinf_safetensors *
st_open(const char *path)
{
	struct zinf_safetensors *st = NULL;
	cr_assert_eq(zinf_safetensors_open(path, &st), 0, "%s: %s", path, zinf_last_error());
	return st;
}

/* Every tensor of a and b the same: names, shapes, stored types and bytes. */
static void
assert_same_tensors(const char *a_path, const char *b_path)
{
	char why[512];
	cr_assert_eq(zt_safetensors_diff(a_path, b_path, why, sizeof(why)), 0, "%s", why);
}

static void
assert_same_file(const char *a, const char *b)
{
	char *x = zc_text(a), *y = zc_text(b);
	cr_assert_str_eq(x, y, "%s differs from %s", a, b);
	free(x);
	free(y);
}

/* The losses of a --json file, in order (at most n); their count. */
static int
losses(const char *path, double *out, int n)
{
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s", path);
	char line[8192];
	int k = 0;
	while (k < n && fgets(line, sizeof(line), f)) {
		json_error_t je;
		json_t *o = json_loads(line, 0, &je);
		cr_assert_not_null(o, "%s: %s", path, je.text);
		out[k++] = json_real_value(json_object_get(o, "loss"));
		json_decref(o);
	}
	fclose(f);
	return k;
}

/*
 * The fixture `model` imported, one step at lr 0, saved, exported; the export equals the
 * fixture; then 6 steps at lr 1e-2 from the fixture and from the export: the same losses.
 */
static void
identity(const char *model, bool nvme)
{
	const char *cfg = config("ds.json", nvme);
	char src[4200], args[8192];
	snprintf(src, sizeof(src), "%s/%s", fix(), model);
	snprintf(args, sizeof(args),
		 "--from-hf '%s' --context 16 --batch 2 --steps 1 --lr 0 --save '%s'", src,
		 at("ck"));
	gpt_ok(cfg, args);
	/* zinf_gpt copied the model's config.json beside its checkpoints */
	char cj[4400];
	snprintf(cj, sizeof(cj), "%s/config.json", src);
	assert_same_file(at("ck/config.json"), cj);
	snprintf(args, sizeof(args), "checkpoint export '%s' --hf '%s'", at("ck"), at("out"));
	zinf_ok(args);
	char *o = zc_text(sc.out);
	cr_assert(strstr(o, "config.json (from ") && strstr(o, "model.safetensors"), "%s", o);
	free(o);
	assert_same_tensors(src, at("out"));
	assert_same_file(at("out/config.json"), cj);
	struct stat st;
	cr_assert(lstat(at("out/model.safetensors.index.json"), &st) != 0);

	/* export -> import: the same training */
	double a[6], b[6];
	const char *train = "--context 16 --batch 2 --steps 6 --lr 1e-2";
	snprintf(args, sizeof(args), "--from-hf '%s' %s --json '%s'", src, train, at("a.json"));
	gpt_ok(cfg, args);
	snprintf(args, sizeof(args), "--from-hf '%s' %s --json '%s'", at("out"), train,
		 at("b.json"));
	gpt_ok(cfg, args);
	cr_assert_eq(losses(at("a.json"), a, 6), 6);
	cr_assert_eq(losses(at("b.json"), b, 6), 6);
	for (int s = 0; s < 6; s++) {
		cr_assert(memcmp(&a[s], &b[s], sizeof(double)) == 0,
			  "step %d: %.17g from the fixture, %.17g from the export", s + 1, a[s],
			  b[s]);
	}
	cr_assert_lt(a[5], a[0] - 0.05, "the runs do not train: %.6f -> %.6f", a[0], a[5]);
}

Test(checkpoint_hf, identity_llama_and_back)
{
	identity("llama-tiny", false);
}

Test(checkpoint_hf, identity_gpt2_stage3_nvme_and_back)
{
	identity("gpt2-tiny", true);
}

/* Tensor `name` of st is n-D of [a] or [a, b]. */
static void
assert_shape(struct zinf_safetensors *st, const char *name, uint32_t n, uint64_t a, uint64_t b)
{
	int i = zinf_safetensors_find(st, name);
	cr_assert_geq(i, 0, "no %s", name);
	struct zinf_safetensors_info in = {.size = sizeof(in)};
	zinf_safetensors_info(st, (uint32_t)i, &in);
	cr_assert(in.ndim == n && in.shape[0] == a && (n == 1 || in.shape[1] == b),
		  "%s: %u-D [%llu, %llu], expected %u-D [%llu, %llu]", name, in.ndim,
		  (unsigned long long)in.shape[0], (unsigned long long)in.shape[1], n,
		  (unsigned long long)a, (unsigned long long)b);
}

/* 2-D tensors of a file */
static int
count_2d(struct zinf_safetensors *st)
{
	int n = 0;
	for (uint32_t i = 0; i < zinf_safetensors_count(st); i++) {
		struct zinf_safetensors_info in = {.size = sizeof(in)};
		zinf_safetensors_info(st, i, &in);
		n += in.ndim == 2;
	}
	return n;
}

static json_int_t
jint(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	cr_assert(json_is_integer(v), "config.json: %s is not an integer", key);
	return json_integer_value(v);
}

/*
 * A model made from the flags: its config.json, the default export's shapes, and export ->
 * import -> save -> export giving the same directory again.
 */
static void
from_flags(bool llama)
{
	const char *cfg = config("ds.json", false);
	const char *shape = llama ? "--arch llama --kv-heads 2 --untied --ffn 88" : "";
	char args[8192];
	snprintf(args, sizeof(args),
		 "%s --layers 2 --hidden 32 --heads 4 --context 16 --vocab 64 --batch 2 --steps 5 "
		 "--lr 1e-2 --save '%s'",
		 shape, at("ck"));
	gpt_ok(cfg, args);

	json_error_t je;
	json_t *c = json_load_file(at("ck/config.json"), JSON_REJECT_DUPLICATES, &je);
	cr_assert_not_null(c, "ck/config.json: %s", je.text);
	cr_assert_str_eq(json_string_value(json_object_get(c, "model_type")),
			 llama ? "llama" : "gpt2");
	cr_assert_str_eq(json_string_value(json_object_get(c, "dtype")), "float32");
	cr_assert_eq(jint(c, "vocab_size"), 64);
	if (llama) {
		cr_assert_eq(jint(c, "hidden_size"), 32);
		cr_assert_eq(jint(c, "num_hidden_layers"), 2);
		cr_assert_eq(jint(c, "num_attention_heads"), 4);
		cr_assert_eq(jint(c, "num_key_value_heads"), 2);
		cr_assert_eq(jint(c, "intermediate_size"), 88);
		cr_assert(json_is_false(json_object_get(c, "tie_word_embeddings")));
		cr_assert_eq(json_real_value(json_object_get(c, "rms_norm_eps")), 1e-5);
		cr_assert_eq(json_real_value(json_object_get(json_object_get(c, "rope_parameters"),
							     "rope_theta")),
			     10000.0);
	} else {
		cr_assert_eq(jint(c, "n_embd"), 32);
		cr_assert_eq(jint(c, "n_layer"), 2);
		cr_assert_eq(jint(c, "n_head"), 4);
		cr_assert_eq(jint(c, "n_positions"), 16, "wpe's rows are the context");
		cr_assert_str_eq(json_string_value(json_object_get(c, "activation_function")),
				 "gelu_new");
	}
	json_decref(c);

	/* the default export: zinf's names and shapes, every weight 2-D */
	snprintf(args, sizeof(args), "checkpoint export '%s' --out '%s'", at("ck"),
		 at("plain.safetensors"));
	zinf_ok(args);
	struct zinf_safetensors *st = st_open(at("plain.safetensors"));
	if (llama) {
		assert_shape(st, "model.embed_tokens.weight", 2, 64, 32);
		assert_shape(st, "model.layers.1.self_attn.k_proj.weight", 2, 16, 32);
		assert_shape(st, "model.layers.0.mlp.down_proj.weight", 2, 32, 88);
		assert_shape(st, "model.layers.0.input_layernorm.weight", 1, 32, 0);
		assert_shape(st, "lm_head.weight", 2, 64, 32);
		cr_assert_eq(count_2d(st), 2 + 2 * 7); /* embed, head; q k v o gate up down */
	} else {
		assert_shape(st, "transformer.wte.weight", 2, 64, 32);
		assert_shape(st, "transformer.wpe.weight", 2, 16, 32);
		assert_shape(st, "transformer.h.0.attn.c_attn.weight", 2, 96, 32);
		assert_shape(st, "transformer.h.1.mlp.c_fc.weight", 2, 128, 32);
		assert_shape(st, "transformer.h.1.mlp.c_proj.weight", 2, 32, 128);
		assert_shape(st, "transformer.h.0.ln_1.bias", 1, 32, 0);
		cr_assert_eq(count_2d(st), 2 + 2 * 4); /* wte, wpe; c_attn, c_proj, c_fc, proj */
	}
	zinf_safetensors_close(st);

	/* to Hugging Face (Conv1D [in, out] there), back into zinf_gpt, and out again */
	snprintf(args, sizeof(args), "checkpoint export '%s' --hf '%s'", at("ck"), at("out"));
	zinf_ok(args);
	st = st_open(at("out"));
	if (!llama) {
		assert_shape(st, "transformer.h.0.attn.c_attn.weight", 2, 32, 96);
		assert_shape(st, "transformer.h.1.mlp.c_proj.weight", 2, 128, 32);
	}
	zinf_safetensors_close(st);
	assert_same_file(at("out/config.json"), at("ck/config.json"));
	snprintf(args, sizeof(args),
		 "--from-hf '%s' --context 16 --batch 2 --steps 1 --lr 0 --save '%s'", at("out"),
		 at("ck2"));
	gpt_ok(cfg, args);
	snprintf(args, sizeof(args), "checkpoint export '%s' --hf '%s'", at("ck2"), at("out2"));
	zinf_ok(args);
	assert_same_tensors(at("out"), at("out2"));
	assert_same_file(at("out2/config.json"), at("out/config.json"));
}

Test(checkpoint_hf, gpt2_from_flags_config_shapes_round_trip)
{
	from_flags(false);
}

Test(checkpoint_hf, llama_from_flags_config_shapes_round_trip)
{
	from_flags(true);
}

/* dir/ck: llama-tiny imported, one step at lr 0 */
static void
llama_checkpoint(void)
{
	char args[8192];
	snprintf(args, sizeof(args),
		 "--from-hf '%s/llama-tiny' --context 16 --batch 2 --steps 1 --lr 0 --save '%s'",
		 fix(), at("ck"));
	gpt_ok(config("ds.json", false), args);
}

Test(checkpoint_hf, shards_equal_one_file)
{
	llama_checkpoint();
	char args[8192];
	snprintf(args, sizeof(args), "checkpoint export '%s' --hf '%s'", at("ck"), at("one"));
	zinf_ok(args);
	/* 117 KiB in shards of 20000 bytes: each tensor is at most 11 KiB, so 6 or more */
	snprintf(args, sizeof(args), "checkpoint export '%s' --hf '%s' --shard-size 20KB", at("ck"),
		 at("sh"));
	zinf_ok(args);
	char *o = zc_text(sc.out);
	int n = 0;
	cr_assert(sscanf(strstr(o, "config.json (from ") ? strstr(o, "), ") + 3 : "", "%d shards",
			 &n) == 1 &&
			  n >= 6,
		  "%s", o);
	cr_assert(strstr(o, "of at most 20000 bytes"), "%s", o);
	free(o);
	char name[64];
	snprintf(name, sizeof(name), "sh/model-%05d-of-%05d.safetensors", n, n);
	struct stat st;
	cr_assert_eq(lstat(at(name), &st), 0, "no %s", name);
	cr_assert_eq(lstat(at("sh/model.safetensors.index.json"), &st), 0);
	cr_assert_neq(lstat(at("sh/model.safetensors"), &st), 0);
	assert_same_tensors(at("sh"), at("one"));
	char src[4200];
	snprintf(src, sizeof(src), "%s/llama-tiny", fix());
	assert_same_tensors(at("sh/model.safetensors.index.json"), src);
}

/* The bytes --shard-size means: the export's line says them. */
static void
shard_size_is(const char *size, const char *bytes)
{
	char args[8192], want[64];
	snprintf(args, sizeof(args), "checkpoint export '%s' --hf '%s' --shard-size %s --force",
		 at("ck"), at("x"), size);
	zinf_ok(args);
	char *o = zc_text(sc.out);
	snprintf(want, sizeof(want), "of at most %s bytes", bytes);
	cr_assert(strstr(o, want), "--shard-size %s: \"%s\" not in: %s", size, want, o);
	free(o);
}

Test(checkpoint_hf, shard_size_as_transformers_reads_it)
{
	llama_checkpoint();
	shard_size_is("20KB", "20000");
	shard_size_is("20kB", "20000");
	shard_size_is("20KiB", "20480");
	shard_size_is("160Kb", "20000"); /* bits, as transformers' "b" */
	shard_size_is("0.02MB", "20000");
	shard_size_is("20000", "20000");
	shard_size_is("20K", "20480"); /* the command's other sizes: powers of 1024 */
	char args[8192];
	snprintf(args, sizeof(args), "checkpoint export '%s' --hf '%s' --shard-size 5XB", at("ck"),
		 at("y"));
	zinf_refused(args, at("y"), (const char *const[]){"--shard-size 5XB: not a size", NULL});
	/* 50GB by default: one file */
	snprintf(args, sizeof(args), "checkpoint export '%s' --hf '%s'", at("ck"), at("z"));
	zinf_ok(args);
	struct stat st;
	cr_assert_eq(lstat(at("z/model.safetensors"), &st), 0);
	cr_assert(zc_count(at("z")) == 2, "z holds more than config.json and model.safetensors");
}

/* bf16 of f32 by round to nearest even, on the bits (no NaN among the weights) */
static uint16_t
bf16_rne(float x)
{
	uint32_t u;
	memcpy(&u, &x, 4);
	uint32_t lower = u & 0xffff, keep = u >> 16;
	if (lower > 0x8000 || (lower == 0x8000 && (keep & 1))) {
		keep++;
	}
	return (uint16_t)keep;
}

Test(checkpoint_hf, dtype_bf16_rounds_to_nearest_even)
{
	llama_checkpoint();
	char args[8192], src[4200];
	snprintf(args, sizeof(args), "checkpoint export '%s' --hf '%s' --dtype bf16", at("ck"),
		 at("out"));
	zinf_ok(args);
	snprintf(src, sizeof(src), "%s/llama-tiny", fix());
	struct zinf_safetensors *a = st_open(src), *b = st_open(at("out"));
	cr_assert_eq(zinf_safetensors_count(a), zinf_safetensors_count(b));
	uint64_t up = 0, all = 0;
	for (uint32_t i = 0; i < zinf_safetensors_count(a); i++) {
		struct zinf_safetensors_info x = {.size = sizeof(x)}, y = {.size = sizeof(y)};
		zinf_safetensors_info(a, i, &x);
		int j = zinf_safetensors_find(b, x.name);
		cr_assert_geq(j, 0, "no %s", x.name);
		zinf_safetensors_info(b, (uint32_t)j, &y);
		cr_assert_str_eq(y.dtype_name, "BF16", "%s", x.name);
		float *f = malloc(x.numel * 4);
		uint16_t *h = malloc(y.bytes);
		cr_assert_eq(zinf_safetensors_read(a, i, 0, x.numel, ZINF_F32, f), 0);
		FILE *fp = fopen(y.file, "rb");
		fseek(fp, (long)y.offset, SEEK_SET);
		cr_assert_eq(fread(h, 1, y.bytes, fp), y.bytes);
		fclose(fp);
		for (uint64_t k = 0; k < x.numel; k++) {
			uint32_t u;
			memcpy(&u, &f[k], 4);
			cr_assert_eq(h[k], bf16_rne(f[k]), "%s[%llu]: %.9g as %04x, expected %04x",
				     x.name, (unsigned long long)k, f[k], h[k], bf16_rne(f[k]));
			up += h[k] != (uint16_t)(u >> 16);
			all++;
		}
		free(f);
		free(h);
	}
	/* about half the values round up: truncation would fail the check above */
	cr_assert(up > all / 4 && up < all, "%llu of %llu rounded up", (unsigned long long)up,
		  (unsigned long long)all);
	zinf_safetensors_close(a);
	zinf_safetensors_close(b);
	json_error_t je;
	json_t *c = json_load_file(at("out/config.json"), 0, &je);
	cr_assert_not_null(c, "%s", je.text);
	cr_assert_str_eq(json_string_value(json_object_get(c, "dtype")), "bfloat16");
	json_decref(c);
}

Test(checkpoint_hf, refusals)
{
	llama_checkpoint();
	char args[8192], want[4400];
	/* no config.json beside the checkpoint, none given */
	cr_assert_eq(rename(at("ck/config.json"), at("config.json.away")), 0);
	snprintf(args, sizeof(args), "checkpoint export '%s' --hf '%s'", at("ck"), at("out"));
	snprintf(want, sizeof(want), "%s/config.json", at("ck"));
	zinf_refused(args, at("out"),
		     (const char *const[]){"no config.json", want, "--hf-config", NULL});
	/* the TAG directory named: its parent's config.json is looked for too */
	snprintf(args, sizeof(args), "checkpoint export '%s' --hf '%s'", at("ck/step1"), at("out"));
	zinf_refused(args, at("out"), (const char *const[]){"ck/step1/config.json", want, NULL});
	/* another model's config.json */
	snprintf(args, sizeof(args), "checkpoint export '%s' --hf '%s' --hf-config '%s/%s'",
		 at("ck"), at("out"), fix(), "gpt2-tiny/config.json");
	zinf_refused(args, at("out"),
		     (const char *const[]){"is no tensor of the gpt2 model", "refused", NULL});
	snprintf(args, sizeof(args), "checkpoint export '%s' --hf '%s' --hf-config '%s/%s'",
		 at("ck"), at("out"), fix(), "llama-tiny-tied/config.json");
	zinf_refused(args, at("out"), (const char *const[]){"model.layers.1.", NULL});
	/* the right one given: written; the TAG directory finds DIR's config.json */
	cr_assert_eq(rename(at("config.json.away"), at("ck/config.json")), 0);
	snprintf(args, sizeof(args), "checkpoint export '%s' --hf '%s'", at("ck/step1"), at("out"));
	zinf_ok(args);
	/* OUT holds an export: refused, then --force */
	struct stat before, after;
	cr_assert_eq(stat(at("out/model.safetensors"), &before), 0);
	snprintf(want, sizeof(want), "%s exists: not replaced", at("out/config.json"));
	zinf_refused(args, NULL, (const char *const[]){want, "--force", NULL});
	cr_assert_eq(unlink(at("out/config.json")), 0);
	snprintf(want, sizeof(want), "%s exists: not replaced", at("out/model.safetensors"));
	zinf_refused(args, at("out/config.json"), (const char *const[]){want, NULL});
	cr_assert_eq(stat(at("out/model.safetensors"), &after), 0);
	cr_assert(before.st_ino == after.st_ino, "a refused export replaced model.safetensors");
	snprintf(args, sizeof(args), "checkpoint export '%s' --hf '%s' --force", at("ck"),
		 at("out"));
	zinf_ok(args);
	cr_assert_eq(stat(at("out/config.json"), &after), 0);
	/* the command line */
	snprintf(args, sizeof(args), "checkpoint export '%s' --hf '%s' --out '%s'", at("ck"),
		 at("o2"), at("x.safetensors"));
	zinf_refused(args, at("o2"), (const char *const[]){"one or the other", NULL});
	snprintf(args, sizeof(args), "checkpoint export '%s' --out '%s' --hf-config '%s'", at("ck"),
		 at("x.safetensors"), at("ck/config.json"));
	zinf_refused(args, at("x.safetensors"),
		     (const char *const[]){"--hf-config goes with --hf", NULL});
	snprintf(args, sizeof(args), "checkpoint export '%s' --hf '%s'", at("ck"),
		 at("ck/config.json"));
	zinf_refused(args, NULL, (const char *const[]){"not a directory", NULL});
}
