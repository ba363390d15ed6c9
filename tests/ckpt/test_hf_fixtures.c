/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/ckpt/test_hf_fixtures.c: the Hugging Face fixtures of tests/fixtures/hf/ (made by
 * make_fixtures.py with transformers and PyTorch; README.md there) read in C with
 * zinf/safetensors.h, so that the tests built on them need no Python. For each model directory:
 * every tensor's Hugging Face name, shape and stored dtype, worked out here from the model's
 * dimensions (GPT-2's Conv1D weights [in, out], Llama's grouped-query k and v [kv_heads x
 * head_dim, hidden], a tied head absent from the file); config.json read by zinf_hf_model_read
 * and its parameter count equal to the file's; the stored values against the probes that
 * make_fixtures.py wrote from the model (first and last 4 of every tensor); the bf16 and f16
 * copies equal to the f32 model rounded to nearest even; the shards through their index. For the
 * references: a gradient of the parameter's shape for every tensor of the model, the logits'
 * shape, the loss equal to the JSON's and to the mean cross-entropy worked here in double from
 * the stored logits and the token file's targets, the 5 AdamW steps' losses; the token file's
 * llm.c header.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zinf/config.h"
#include "zinf/safetensors.h"

#define HF ZINF_TEST_FIXTURES "/hf"
#define B  2
#define T  16
#define V  96

TestSuite(hf_fixtures);

/* ---- expected tensors --------------------------------------------------------------------- */

struct want {
	char name[96];
	uint32_t ndim;
	uint64_t shape[2];
};

static uint32_t
add(struct want *w, uint32_t n, const char *name, uint64_t d0, uint64_t d1)
{
	snprintf(w[n].name, sizeof(w[n].name), "%s", name);
	w[n].ndim = d1 ? 2 : 1;
	w[n].shape[0] = d0;
	w[n].shape[1] = d1;
	return n + 1;
}

/* GPT2LMHeadModel, n_embd 32, 4 x 32 MLP, vocab 96, 32 positions: the head tied (not stored). */
static uint32_t
gpt2_tensors(struct want *w, int layers)
{
	uint32_t n = 0;
	n = add(w, n, "transformer.wte.weight", V, 32);
	n = add(w, n, "transformer.wpe.weight", 32, 32);
	for (int l = 0; l < layers; l++) {
		static const struct {
			const char *s;
			uint64_t d0, d1;
		} blk[] = {
			{"ln_1.weight", 32, 0},		{"ln_1.bias", 32, 0},
			{"attn.c_attn.weight", 32, 96}, {"attn.c_attn.bias", 96, 0},
			{"attn.c_proj.weight", 32, 32}, {"attn.c_proj.bias", 32, 0},
			{"ln_2.weight", 32, 0},		{"ln_2.bias", 32, 0},
			{"mlp.c_fc.weight", 32, 128},	{"mlp.c_fc.bias", 128, 0},
			{"mlp.c_proj.weight", 128, 32}, {"mlp.c_proj.bias", 32, 0},
		};
		for (size_t k = 0; k < sizeof(blk) / sizeof(blk[0]); k++) {
			char name[96];
			snprintf(name, sizeof(name), "transformer.h.%d.%s", l, blk[k].s);
			n = add(w, n, name, blk[k].d0, blk[k].d1);
		}
	}
	n = add(w, n, "transformer.ln_f.weight", 32, 0);
	return add(w, n, "transformer.ln_f.bias", 32, 0);
}

/* LlamaForCausalLM, hidden 32, 4 heads of 8, 2 key-value heads, intermediate 88, vocab 96. */
static uint32_t
llama_tensors(struct want *w, int layers, bool tied)
{
	uint32_t n = 0;
	n = add(w, n, "model.embed_tokens.weight", V, 32);
	for (int l = 0; l < layers; l++) {
		static const struct {
			const char *s;
			uint64_t d0, d1;
		} blk[] = {
			{"input_layernorm.weight", 32, 0},
			{"self_attn.q_proj.weight", 32, 32},
			{"self_attn.k_proj.weight", 16, 32}, /* 2 kv heads x 8 */
			{"self_attn.v_proj.weight", 16, 32},
			{"self_attn.o_proj.weight", 32, 32},
			{"post_attention_layernorm.weight", 32, 0},
			{"mlp.gate_proj.weight", 88, 32},
			{"mlp.up_proj.weight", 88, 32},
			{"mlp.down_proj.weight", 32, 88},
		};
		for (size_t k = 0; k < sizeof(blk) / sizeof(blk[0]); k++) {
			char name[96];
			snprintf(name, sizeof(name), "model.layers.%d.%s", l, blk[k].s);
			n = add(w, n, name, blk[k].d0, blk[k].d1);
		}
	}
	n = add(w, n, "model.norm.weight", 32, 0);
	return tied ? n : add(w, n, "lm_head.weight", V, 32);
}

/* The directory holds exactly the tensors of w[0..n), stored as dtype, in at least min_files
 * files; returns the handle. */
static struct zinf_safetensors *
expect_model(const char *dir, const struct want *w, uint32_t n, const char *dtype,
	     uint32_t min_files)
{
	struct zinf_safetensors *st = NULL;
	int rc = zinf_safetensors_open(dir, &st);
	cr_assert_eq(rc, 0, "%s: %d %s", dir, rc, zinf_last_error());
	cr_expect_eq(zinf_safetensors_count(st), n, "%s: %u tensors, expected %u", dir,
		     zinf_safetensors_count(st), n);
	const char *files[8];
	uint32_t n_files = 0;
	for (uint32_t k = 0; k < n; k++) {
		int i = zinf_safetensors_find(st, w[k].name);
		cr_assert_geq(i, 0, "%s: no tensor %s", dir, w[k].name);
		struct zinf_safetensors_info in = {.size = sizeof(in)};
		cr_assert_eq(zinf_safetensors_info(st, (uint32_t)i, &in), 0);
		cr_expect_str_eq(in.dtype_name, dtype, "%s: %s", dir, w[k].name);
		cr_expect_eq(in.ndim, w[k].ndim, "%s: %s", dir, w[k].name);
		cr_expect_eq(in.shape[0], w[k].shape[0], "%s: %s", dir, w[k].name);
		cr_expect_eq(in.shape[1], w[k].shape[1], "%s: %s", dir, w[k].name);
		uint32_t f = 0;
		while (f < n_files && strcmp(files[f], in.file) != 0) {
			f++;
		}
		if (f == n_files && n_files < 8) {
			files[n_files++] = in.file;
		}
	}
	cr_expect_geq(n_files, min_files, "%s: %u files", dir, n_files);
	return st;
}

Test(hf_fixtures, gpt2_tiny_holds_gpt2s_tensors_with_the_head_tied)
{
	struct want w[40];
	uint32_t n = gpt2_tensors(w, 2);
	cr_assert_eq(n, 28);
	struct zinf_safetensors *st = expect_model(HF "/gpt2-tiny", w, n, "F32", 1);
	cr_expect_eq(zinf_safetensors_find(st, "lm_head.weight"), -ENOENT);
	zinf_safetensors_close(st);
}

Test(hf_fixtures, llama_tiny_holds_llamas_tensors_with_grouped_query_attention)
{
	struct want w[40];
	uint32_t n = llama_tensors(w, 2, false);
	cr_assert_eq(n, 21);
	zinf_safetensors_close(expect_model(HF "/llama-tiny", w, n, "F32", 1));
	zinf_safetensors_close(expect_model(HF "/llama-tiny-bf16", w, n, "BF16", 1));
	zinf_safetensors_close(expect_model(HF "/llama-tiny-sharded", w, n, "F16", 3));
	n = llama_tensors(w, 1, true);
	struct zinf_safetensors *st = expect_model(HF "/llama-tiny-tied", w, n, "F32", 1);
	cr_expect_eq(zinf_safetensors_find(st, "lm_head.weight"), -ENOENT);
	zinf_safetensors_close(st);
}

/* ---- config.json -------------------------------------------------------------------------- */

/* The parameters of the file: every element of every tensor. */
static uint64_t
file_params(const char *dir)
{
	struct zinf_safetensors *st = NULL;
	cr_assert_eq(zinf_safetensors_open(dir, &st), 0, "%s", zinf_last_error());
	uint64_t n = 0;
	for (uint32_t i = 0; i < zinf_safetensors_count(st); i++) {
		struct zinf_safetensors_info in = {.size = sizeof(in)};
		cr_assert_eq(zinf_safetensors_info(st, i, &in), 0);
		n += in.numel;
	}
	zinf_safetensors_close(st);
	return n;
}

Test(hf_fixtures, configs_match_their_weights)
{
	static const struct {
		const char *dir;
		enum zinf_hf_arch arch;
		uint64_t layers, kv_heads, intermediate;
		bool tied;
	} m[] = {
		{HF "/gpt2-tiny", ZINF_HF_GPT2, 2, 4, 128, true},
		{HF "/llama-tiny", ZINF_HF_LLAMA, 2, 2, 88, false},
		{HF "/llama-tiny-bf16", ZINF_HF_LLAMA, 2, 2, 88, false},
		{HF "/llama-tiny-sharded", ZINF_HF_LLAMA, 2, 2, 88, false},
		{HF "/llama-tiny-tied", ZINF_HF_LLAMA, 1, 2, 88, true},
	};
	for (size_t k = 0; k < sizeof(m) / sizeof(m[0]); k++) {
		struct zinf_hf_model h = {.size = sizeof(h)};
		int rc = zinf_hf_model_read(m[k].dir, &h);
		cr_assert_eq(rc, 0, "%s: %s", m[k].dir, zinf_last_error());
		cr_expect_eq(h.arch, m[k].arch, "%s", m[k].dir);
		cr_expect_eq(h.hidden, 32, "%s", m[k].dir);
		cr_expect_eq(h.heads, 4, "%s", m[k].dir);
		cr_expect_eq(h.head_dim, 8, "%s", m[k].dir);
		cr_expect_eq(h.vocab, V, "%s", m[k].dir);
		cr_expect_eq(h.layers, m[k].layers, "%s", m[k].dir);
		cr_expect_eq(h.kv_heads, m[k].kv_heads, "%s", m[k].dir);
		cr_expect_eq(h.intermediate, m[k].intermediate, "%s", m[k].dir);
		cr_expect_eq(h.tied, m[k].tied, "%s", m[k].dir);
		cr_expect_eq(h.params, file_params(m[k].dir), "%s: config counts %llu", m[k].dir,
			     (unsigned long long)h.params);
	}
}

/* ---- the stored values -------------------------------------------------------------------- */

static json_t *
load_json(const char *path)
{
	json_error_t je;
	json_t *j = json_load_file(path, 0, &je);
	cr_assert_not_null(j, "%s: %s", path, je.text);
	return j;
}

/* Every tensor of the f32 model dir against the probes of refs/<name>.json. */
static void
expect_probes(const char *name)
{
	char dir[512], ref[512];
	snprintf(dir, sizeof(dir), HF "/%s", name);
	snprintf(ref, sizeof(ref), HF "/refs/%s.json", name);
	json_t *j = load_json(ref);
	const json_t *probes = json_object_get(j, "probes");
	struct zinf_safetensors *st = NULL;
	cr_assert_eq(zinf_safetensors_open(dir, &st), 0, "%s", zinf_last_error());
	cr_expect_eq(json_object_size(probes), zinf_safetensors_count(st), "%s", name);
	for (uint32_t i = 0; i < zinf_safetensors_count(st); i++) {
		struct zinf_safetensors_info in = {.size = sizeof(in)};
		cr_assert_eq(zinf_safetensors_info(st, i, &in), 0);
		const json_t *p = json_object_get(probes, in.name);
		cr_assert_not_null(p, "%s: no probe of %s", name, in.name);
		float first[4], last[4];
		cr_assert_eq(zinf_safetensors_read(st, i, 0, 4, ZINF_F32, first), 0);
		cr_assert_eq(zinf_safetensors_read(st, i, in.numel - 4, 4, ZINF_F32, last), 0);
		for (size_t k = 0; k < 4; k++) {
			double a = json_real_value(json_array_get(json_object_get(p, "first"), k));
			double b = json_real_value(json_array_get(json_object_get(p, "last"), k));
			cr_expect_eq((double)first[k], a, "%s %s[%zu]: %.9g, probe %.9g", name,
				     in.name, k, first[k], a);
			cr_expect_eq((double)last[k], b, "%s %s[-%zu]: %.9g, probe %.9g", name,
				     in.name, 4 - k, last[k], b);
		}
	}
	zinf_safetensors_close(st);
	json_decref(j);
}

Test(hf_fixtures, stored_values_match_the_probes_made_with_the_model)
{
	expect_probes("gpt2-tiny");
	expect_probes("llama-tiny");
	expect_probes("llama-tiny-tied");
}

/* Every element of `copy` (stored as dt) equals the f32 model's rounded to dt (to nearest even,
 * as torch's .to() and zinf both round). */
static void
expect_rounded_copy(const char *copy, enum zinf_dtype dt)
{
	struct zinf_safetensors *a = NULL, *c = NULL;
	cr_assert_eq(zinf_safetensors_open(HF "/llama-tiny", &a), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_safetensors_open(copy, &c), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_safetensors_count(a), zinf_safetensors_count(c));
	uint64_t nonzero = 0;
	for (uint32_t i = 0; i < zinf_safetensors_count(a); i++) {
		struct zinf_safetensors_info in = {.size = sizeof(in)};
		cr_assert_eq(zinf_safetensors_info(a, i, &in), 0);
		int j = zinf_safetensors_find(c, in.name);
		cr_assert_geq(j, 0, "%s: no %s", copy, in.name);
		uint16_t *x = calloc(in.numel, 2), *y = calloc(in.numel, 2);
		cr_assert_eq(zinf_safetensors_read(a, i, 0, in.numel, dt, x), 0);
		cr_assert_eq(zinf_safetensors_read(c, (uint32_t)j, 0, in.numel, dt, y), 0);
		for (uint64_t e = 0; e < in.numel; e++) {
			cr_assert_eq(x[e], y[e], "%s %s[%llu]: 0x%04x, rounded f32 0x%04x", copy,
				     in.name, (unsigned long long)e, y[e], x[e]);
			nonzero += (y[e] & 0x7fff) != 0;
		}
		free(x);
		free(y);
	}
	cr_expect_gt(nonzero, 20000, "%s: %llu non-zero values", copy, (unsigned long long)nonzero);
	zinf_safetensors_close(a);
	zinf_safetensors_close(c);
}

Test(hf_fixtures, bf16_and_sharded_f16_copies_are_the_f32_model_rounded)
{
	expect_rounded_copy(HF "/llama-tiny-bf16", ZINF_BF16);
	expect_rounded_copy(HF "/llama-tiny-sharded", ZINF_F16);
	expect_rounded_copy(HF "/llama-tiny-sharded/model.safetensors.index.json", ZINF_F16);
}

/* ---- the references ----------------------------------------------------------------------- */

/* tokens.bin: llm.c's header, then uint16 tokens; into tok (at most cap). */
static uint32_t
read_tokens(uint16_t *tok, uint32_t cap)
{
	FILE *f = fopen(HF "/tokens.bin", "rb");
	cr_assert_not_null(f);
	int32_t h[256];
	cr_assert_eq(fread(h, 4, 256, f), 256);
	cr_expect_eq(h[0], 20240520, "magic");
	cr_expect_eq(h[1], 1, "version");
	cr_assert_gt(h[2], 0);
	cr_assert_leq((uint32_t)h[2], cap);
	cr_assert_eq(fread(tok, 2, (size_t)h[2], f), (size_t)h[2]);
	char extra;
	cr_expect_eq(fread(&extra, 1, 1, f), 0, "bytes after the tokens the header counts");
	fclose(f);
	return (uint32_t)h[2];
}

Test(hf_fixtures, token_file_is_llm_c_format_within_the_vocabulary)
{
	uint16_t tok[1024];
	uint32_t n = read_tokens(tok, 1024);
	cr_expect_geq(n, 5 * B * T + 1, "tokens for 5 steps of %d x %d", B, T);
	for (uint32_t k = 0; k < n; k++) {
		cr_assert_lt(tok[k], V, "token %u = %u", k, tok[k]);
	}
}

static void
expect_references(const char *name, bool grads)
{
	char dir[512], ref[512], js[512];
	snprintf(dir, sizeof(dir), HF "/%s", name);
	snprintf(ref, sizeof(ref), HF "/refs/%s.safetensors", name);
	snprintf(js, sizeof(js), HF "/refs/%s.json", name);
	struct zinf_safetensors *m = NULL, *r = NULL;
	cr_assert_eq(zinf_safetensors_open(dir, &m), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_safetensors_open(ref, &r), 0, "%s", zinf_last_error());
	uint32_t n = zinf_safetensors_count(m);
	cr_expect_eq(zinf_safetensors_count(r), 3 + (grads ? n : 0), "%s", ref);
	/* a gradient of its parameter's shape for every tensor of the model */
	for (uint32_t i = 0; grads && i < n; i++) {
		struct zinf_safetensors_info p = {.size = sizeof(p)}, g = {.size = sizeof(g)};
		cr_assert_eq(zinf_safetensors_info(m, i, &p), 0);
		char gname[128];
		snprintf(gname, sizeof(gname), "grad.%s", p.name);
		int j = zinf_safetensors_find(r, gname);
		cr_assert_geq(j, 0, "%s: no %s", ref, gname);
		cr_assert_eq(zinf_safetensors_info(r, (uint32_t)j, &g), 0);
		cr_expect_str_eq(g.dtype_name, "F32", "%s", gname);
		cr_expect_eq(g.ndim, p.ndim, "%s", gname);
		cr_expect_eq(memcmp(g.shape, p.shape, sizeof(p.shape)), 0, "%s", gname);
	}
	/* the logits, and the loss worked from them and the token file */
	int li = zinf_safetensors_find(r, "logits");
	cr_assert_geq(li, 0);
	struct zinf_safetensors_info in = {.size = sizeof(in)};
	cr_assert_eq(zinf_safetensors_info(r, (uint32_t)li, &in), 0);
	cr_expect_str_eq(in.dtype_name, "F64");
	cr_assert_eq(in.ndim, 3);
	cr_assert_eq(in.shape[0], B);
	cr_assert_eq(in.shape[1], T);
	cr_assert_eq(in.shape[2], V);
	double *lg = malloc(B * T * V * sizeof(double));
	cr_assert_eq(zinf_safetensors_read_f64(r, (uint32_t)li, 0, B * T * V, lg), 0);
	uint16_t tok[1024];
	read_tokens(tok, 1024);
	double ce = 0;
	for (int b = 0; b < B; b++) {
		for (int t = 0; t < T; t++) {
			const double *x = lg + (b * T + t) * V;
			double mx = x[0], s = 0;
			for (int v = 1; v < V; v++) {
				mx = fmax(mx, x[v]);
			}
			for (int v = 0; v < V; v++) {
				s += exp(x[v] - mx);
			}
			ce += mx + log(s) - x[tok[b * T + t + 1]];
		}
	}
	ce /= B * T;
	double loss, steps[5];
	int si = zinf_safetensors_find(r, "step_losses"), lo = zinf_safetensors_find(r, "loss");
	cr_assert_geq(si, 0);
	cr_assert_geq(lo, 0);
	cr_assert_eq(zinf_safetensors_read_f64(r, (uint32_t)lo, 0, 1, &loss), 0);
	cr_assert_eq(zinf_safetensors_read_f64(r, (uint32_t)si, 0, 5, steps), 0);
	cr_expect(fabs(ce - loss) < 1e-12, "%s: cross-entropy of the logits %.15g, loss %.15g",
		  name, ce, loss);
	cr_expect(loss > 4.0 && loss < 5.0, "%s: loss %g, near ln(96) for a random model", name,
		  loss);
	json_t *j = load_json(js);
	cr_expect_eq(json_real_value(json_object_get(j, "loss")), loss, "%s", js);
	const json_t *sl = json_object_get(j, "step_losses");
	cr_assert_eq(json_array_size(sl), 5);
	for (size_t k = 0; k < 5; k++) {
		cr_expect_eq(json_real_value(json_array_get(sl, k)), steps[k], "%s step %zu", js,
			     k + 1);
	}
	cr_expect_eq(steps[0], loss, "step 1's loss is the reference loss");
	cr_expect_lt(steps[4], steps[0] - 0.3, "%s: 5 AdamW steps lower the loss", name);
	cr_expect_eq(json_integer_value(json_object_get(j, "batch")), B);
	cr_expect_eq(json_integer_value(json_object_get(j, "seq_len")), T);
	json_decref(j);
	free(lg);
	zinf_safetensors_close(m);
	zinf_safetensors_close(r);
}

Test(hf_fixtures, references_are_consistent_with_the_models_and_tokens)
{
	expect_references("gpt2-tiny", true);
	expect_references("llama-tiny", true);
	expect_references("llama-tiny-tied", false);
	json_t *v = load_json(HF "/refs/versions.json");
	const char *keys[] = {"torch", "transformers", "safetensors"};
	for (int k = 0; k < 3; k++) {
		cr_expect(json_is_string(json_object_get(v, keys[k])), "versions.json: no %s",
			  keys[k]);
	}
	json_decref(v);
}
