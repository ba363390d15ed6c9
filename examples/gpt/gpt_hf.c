/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt_hf.c: a Hugging Face model directory as zinf_gpt's starting point (--from-hf
 * DIR): config.json read with zinf_hf_model_read into the model's shape (what the layers cannot
 * compute refused by its key), and the weights (zinf/safetensors.h: one file or shards) matched
 * to the registered tensors by name and shape and streamed into the engine through its init
 * callback, range by range, for the ranges this rank owns: host memory holds one range (the
 * engine's chunk) and, for GPT-2's transposed Conv1D weights, one such tensor. And the other
 * way: the model's config.json beside --save's checkpoints (gpt_hf_save_config: the source's
 * with --from-hf, else one made from the flags), which `zinf checkpoint export --hf` takes. Not
 * here: the export itself (the zinf command, zinf_ckpt_export_hf).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zinf/config.h>
#include <zinf/safetensors.h>

#include "gpt.h"

/* How a registered tensor is found in the checkpoint. */
struct hf_map {
	uint32_t idx;	 /* the checkpoint's tensor number */
	bool transposed; /* GPT-2's Conv1D weight: stored [cols, rows] */
	size_t rows, cols;
};

struct gpt_hf {
	char dir[4096];
	struct zinf_safetensors *st;
	struct hf_map *map; /* by parameter id */
	uint32_t n;
	float *cache; /* one transposed tensor, whole, as stored (f32) */
	uint32_t cache_id;
	bool gpt2;
};

static int
refuse(const char *dir, const char *what)
{
	fprintf(stderr, "zinf_gpt: --from-hf %s: config.json: %s\n", dir, what);
	return -1;
}

int
gpt_hf_open(const char *dir, struct gpt_dims *d, struct gpt_hf **out)
{
	struct zinf_hf_model m = {.size = sizeof(m)};
	char why[512];
	if (zinf_hf_model_read(dir, &m)) {
		fprintf(stderr, "zinf_gpt: --from-hf %s: %s\n", dir, zinf_last_error());
		return -1;
	}
	bool gpt2 = m.arch == ZINF_HF_GPT2;
	/* what the layers compute: refuse the rest by the key that asks for it */
	if (gpt2 && strcmp(m.act, "gelu_new") && strcmp(m.act, "gelu_pytorch_tanh")) {
		snprintf(why, sizeof(why),
			 "activation_function \"%s\": the GPT-2 layers compute the tanh GELU "
			 "(gelu_new, gelu_pytorch_tanh)",
			 m.act);
		return refuse(dir, why);
	}
	if (!gpt2 && strcmp(m.act, "silu")) {
		snprintf(why, sizeof(why),
			 "hidden_act \"%s\": the Llama layers compute SwiGLU with silu", m.act);
		return refuse(dir, why);
	}
	if (gpt2 && m.norm_eps != 1e-5) {
		snprintf(why, sizeof(why),
			 "layer_norm_epsilon %g: the GPT-2 layers (CPU and GPU) use 1e-5",
			 m.norm_eps);
		return refuse(dir, why);
	}
	if (gpt2 && (m.attn_unscaled || m.attn_layer_scaled)) {
		return refuse(dir, m.attn_unscaled
					   ? "scale_attn_weights false: the GPT-2 layers "
					     "divide the scores by sqrt(head size)"
					   : "scale_attn_by_inverse_layer_idx true: the GPT-2 "
					     "layers do not scale the scores by the layer");
	}
	if (gpt2 && !m.tied) {
		return refuse(dir, "tie_word_embeddings false: the GPT-2 layers tie the head to "
				   "the token embedding");
	}
	if (gpt2 && m.intermediate != 4 * m.hidden) {
		snprintf(why, sizeof(why),
			 "n_inner %llu: the GPT-2 layers' MLP is 4 x n_embd (%llu)",
			 (unsigned long long)m.intermediate, (unsigned long long)(4 * m.hidden));
		return refuse(dir, why);
	}
	if (m.rope_scaling) {
		return refuse(dir, "rope_scaling (or rope_parameters.rope_type other than "
				   "\"default\"): not supported (the rotary embeddings are plain, "
				   "rope_theta alone)");
	}
	if (!gpt2 && (m.attention_bias || m.mlp_bias)) {
		snprintf(why, sizeof(why), "%s: the Llama layers have no biases%s",
			 m.attention_bias ? "attention_bias" : "mlp_bias",
			 !strcmp(m.model_type, "qwen2") ? " (qwen2's q, k and v have them)" : "");
		return refuse(dir, why);
	}
	if (m.head_dim * m.heads != m.hidden) {
		snprintf(why, sizeof(why),
			 "head_dim %llu: the layers' heads are hidden_size / num_attention_heads "
			 "(%llu)",
			 (unsigned long long)m.head_dim, (unsigned long long)(m.hidden / m.heads));
		return refuse(dir, why);
	}
	if (!gpt2 && m.head_dim % 2) {
		snprintf(why, sizeof(why), "head size %llu: rotary embeddings need an even one",
			 (unsigned long long)m.head_dim);
		return refuse(dir, why);
	}
	if ((uint64_t)d->T > m.max_positions) {
		snprintf(why, sizeof(why), "%s %llu: --context %d goes past it",
			 gpt2 ? "n_positions" : "max_position_embeddings",
			 (unsigned long long)m.max_positions, d->T);
		return refuse(dir, why);
	}
	if (m.sliding_window && (uint64_t)d->T > m.sliding_window) {
		snprintf(why, sizeof(why),
			 "sliding_window %llu: --context %d is longer, and the layers attend to "
			 "the whole context (a context within the window is exact)",
			 (unsigned long long)m.sliding_window, d->T);
		return refuse(dir, why);
	}
	struct gpt_hf *h = calloc(1, sizeof(*h));
	if (!h) {
		fprintf(stderr, "zinf_gpt: --from-hf: out of memory\n");
		return -1;
	}
	snprintf(h->dir, sizeof(h->dir), "%s", dir);
	h->gpt2 = gpt2;
	h->cache_id = UINT32_MAX;
	int r = zinf_safetensors_open(dir, &h->st);
	if (r) {
		fprintf(stderr, "zinf_gpt: --from-hf %s: the weights: %s\n", dir,
			zinf_last_error());
		free(h);
		return -1;
	}
	*d = (struct gpt_dims){.V = (int)m.vocab,
			       .T = d->T,
			       .C = (int)m.hidden,
			       .NH = (int)m.heads,
			       .L = (int)m.layers,
			       .B = d->B,
			       .arch = gpt2 ? GPT_ARCH_GPT2 : GPT_ARCH_LLAMA,
			       .KVH = gpt2 ? 0 : (int)m.kv_heads,
			       .FF = gpt2 ? 0 : (int)m.intermediate,
			       .untied = !m.tied,
			       .rope_theta = m.rope_theta,
			       .eps = m.norm_eps,
			       .P = gpt2 ? (int)m.positions : 0};
	*out = h;
	return 0;
}

/* GPT-2's Conv1D weights, which Hugging Face stores [in, out] */
static bool
conv1d(const char *name)
{
	static const char *const s[] = {".attn.c_attn.weight", ".attn.c_proj.weight",
					".mlp.c_fc.weight", ".mlp.c_proj.weight"};
	size_t n = strlen(name);
	for (size_t i = 0; i < sizeof(s) / sizeof(s[0]); i++) {
		size_t k = strlen(s[i]);
		if (n > k && !strcmp(name + n - k, s[i])) {
			return true;
		}
	}
	return false;
}

/* Tensors a checkpoint may hold that are no parameter: GPT-2's attention masks, an old
 * Llama's rotary frequencies, a tied model's copy of its head. */
static bool
known_extra(const struct gpt_hf *h, const struct gpt_model *m, const char *name)
{
	size_t n = strlen(name);
	static const char *const buf[] = {".attn.bias", ".attn.masked_bias",
					  ".rotary_emb.inv_freq"};
	for (size_t i = 0; i < sizeof(buf) / sizeof(buf[0]); i++) {
		size_t k = strlen(buf[i]);
		if (n > k && !strcmp(name + n - k, buf[i])) {
			return true;
		}
	}
	(void)h;
	return gpt_tied(&m->d) && !strcmp(name, "lm_head.weight");
}

int
gpt_hf_bind(struct gpt_hf *h, struct gpt_model *m)
{
	uint32_t count = zinf_safetensors_count(h->st);
	bool *used = calloc(count ? count : 1, sizeof(bool));
	h->map = calloc(m->n_tensors ? m->n_tensors : 1, sizeof(*h->map));
	h->n = m->n_tensors;
	if (!used || !h->map) {
		free(used);
		fprintf(stderr, "zinf_gpt: --from-hf: out of memory\n");
		return -1;
	}
	const char *ck = zinf_safetensors_path(h->st);
	int bad = 0;
	for (uint32_t id = 0; id < m->n_tensors && !bad; id++) {
		const struct gpt_tensor *t = &m->tensors[id];
		int idx = zinf_safetensors_find(h->st, t->name);
		const char *bare = strchr(t->name, '.');
		if (idx == -ENOENT && bare && !strncmp(t->name, "transformer.", 12)) {
			idx = zinf_safetensors_find(h->st, bare + 1); /* as GPT2Model saves it */
		}
		if (idx < 0) {
			fprintf(stderr, "zinf_gpt: --from-hf %s: %s: no tensor %s\n", h->dir, ck,
				t->name);
			bad = 1;
			break;
		}
		struct zinf_safetensors_info in = {.size = sizeof(in)};
		zinf_safetensors_info(h->st, (uint32_t)idx, &in);
		bool tr = h->gpt2 && conv1d(t->name);
		uint64_t want[2] = {tr ? t->cols : t->rows, tr ? t->rows : t->cols};
		bool shape_ok =
			t->rows ? in.ndim == 2 && in.shape[0] == want[0] && in.shape[1] == want[1]
				: in.ndim == 1 && in.shape[0] == t->cols;
		if (!shape_ok) {
			char got[128] = "";
			for (uint32_t k = 0; k < in.ndim; k++) {
				size_t l = strlen(got);
				snprintf(got + l, sizeof(got) - l, "%s%llu", k ? ", " : "",
					 (unsigned long long)in.shape[k]);
			}
			if (t->rows) {
				fprintf(stderr,
					"zinf_gpt: --from-hf %s: %s: %s is [%s], the model needs "
					"[%llu, %llu]\n",
					h->dir, in.file, in.name, got, (unsigned long long)want[0],
					(unsigned long long)want[1]);
			} else {
				fprintf(stderr,
					"zinf_gpt: --from-hf %s: %s: %s is [%s], the model needs "
					"[%zu]\n",
					h->dir, in.file, in.name, got, t->cols);
			}
			bad = 1;
			break;
		}
		if (in.dtype == ZINF_SAFETENSORS_OTHER) {
			fprintf(stderr,
				"zinf_gpt: --from-hf %s: %s: %s is stored as %s; zinf reads F32, "
				"BF16, F16 and F64\n",
				h->dir, in.file, in.name, in.dtype_name);
			bad = 1;
			break;
		}
		used[idx] = true;
		h->map[id] = (struct hf_map){(uint32_t)idx, tr, t->rows, t->cols};
	}
	for (uint32_t i = 0; i < count && !bad; i++) {
		struct zinf_safetensors_info in = {.size = sizeof(in)};
		zinf_safetensors_info(h->st, i, &in);
		if (!used[i] && !known_extra(h, m, in.name)) {
			fprintf(stderr,
				"zinf_gpt: --from-hf %s: %s: %s is no parameter of this %s model "
				"(config.json says otherwise, or the checkpoint is another "
				"model's)\n",
				h->dir, in.file, in.name,
				m->d.arch == GPT_ARCH_LLAMA ? "llama" : "gpt2");
			bad = 1;
		}
	}
	free(used);
	return bad ? -1 : 0;
}

int
gpt_hf_init(void *ctx, uint32_t param, uint64_t first, uint64_t count, float *out)
{
	struct gpt_hf *h = ctx;
	if (param >= h->n) {
		return -EINVAL;
	}
	const struct hf_map *p = &h->map[param];
	if (!p->transposed) {
		return zinf_safetensors_read(h->st, p->idx, first, count, ZINF_F32, out);
	}
	/* element (o, c) here is (c, o) there: the whole tensor, once */
	if (h->cache_id != param) {
		free(h->cache);
		h->cache_id = UINT32_MAX;
		if (!(h->cache = malloc(p->rows * p->cols * sizeof(float)))) {
			return -ENOMEM;
		}
		int r = zinf_safetensors_read(h->st, p->idx, 0, p->rows * p->cols, ZINF_F32,
					      h->cache);
		if (r) {
			return r;
		}
		h->cache_id = param;
	}
	for (uint64_t k = 0; k < count; k++) {
		uint64_t e = first + k, o = e / p->cols, c = e % p->cols;
		out[k] = h->cache[c * p->rows + o];
	}
	return 0;
}

void
gpt_hf_close(struct gpt_hf *h)
{
	if (!h) {
		return;
	}
	zinf_safetensors_close(h->st);
	free(h->map);
	free(h->cache);
	free(h);
}

/* ---- config.json beside the checkpoints ----------------------------------------------------- */

/* x as JSON text that reads back as x, as Python's repr writes it: a whole number below 1e16
 * as "10000.0" (transformers keeps rope_theta and the epsilons as floats), else the shortest
 * %g that reads back ("1e-05"). */
static void
json_real(char *buf, size_t len, double x)
{
	if (x > -1e16 && x < 1e16 && x == (double)(long long)x) { /* the range first: the cast */
		snprintf(buf, len, "%.1f", x);
		return;
	}
	for (int prec = 1; prec <= 17; prec++) {
		snprintf(buf, len, "%.*g", prec, x);
		if (strtod(buf, NULL) == x) {
			break;
		}
	}
}

/* The config.json transformers' from_pretrained reads for d (GPT2Config or LlamaConfig, the
 * fields the layers compute with), into f. */
static void
config_from_dims(FILE *f, const struct gpt_dims *d, enum zinf_dtype dtype)
{
	static const char *const torch[] = {
		[ZINF_F32] = "float32", [ZINF_F16] = "float16", [ZINF_BF16] = "bfloat16"};
	char eps[32], theta[32];
	json_real(eps, sizeof(eps), gpt_eps(d));
	json_real(theta, sizeof(theta), gpt_rope_theta(d));
	if (d->arch != GPT_ARCH_LLAMA) {
		/* wpe's rows are the positions (--context without --from-hf); no special tokens
		   (GPT2Config's 50256 lies past a small vocabulary) */
		fprintf(f,
			"{\n"
			"  \"activation_function\": \"gelu_new\",\n"
			"  \"architectures\": [\n    \"GPT2LMHeadModel\"\n  ],\n"
			"  \"attn_pdrop\": 0.0,\n"
			"  \"bos_token_id\": null,\n"
			"  \"dtype\": \"%s\",\n"
			"  \"embd_pdrop\": 0.0,\n"
			"  \"eos_token_id\": null,\n"
			"  \"layer_norm_epsilon\": %s,\n"
			"  \"model_type\": \"gpt2\",\n"
			"  \"n_embd\": %d,\n"
			"  \"n_head\": %d,\n"
			"  \"n_inner\": null,\n"
			"  \"n_layer\": %d,\n"
			"  \"n_positions\": %d,\n"
			"  \"resid_pdrop\": 0.0,\n"
			"  \"tie_word_embeddings\": true,\n"
			"  \"vocab_size\": %d\n"
			"}\n",
			torch[dtype], eps, d->C, d->NH, d->L, gpt_positions(d), d->V);
		return;
	}
	/* rope_theta in both places: transformers 5 reads rope_parameters, 4 the top level */
	fprintf(f,
		"{\n"
		"  \"architectures\": [\n    \"LlamaForCausalLM\"\n  ],\n"
		"  \"attention_bias\": false,\n"
		"  \"attention_dropout\": 0.0,\n"
		"  \"dtype\": \"%s\",\n"
		"  \"head_dim\": %d,\n"
		"  \"hidden_act\": \"silu\",\n"
		"  \"hidden_size\": %d,\n"
		"  \"intermediate_size\": %d,\n"
		"  \"max_position_embeddings\": %d,\n"
		"  \"mlp_bias\": false,\n"
		"  \"model_type\": \"llama\",\n"
		"  \"num_attention_heads\": %d,\n"
		"  \"num_hidden_layers\": %d,\n"
		"  \"num_key_value_heads\": %d,\n"
		"  \"rms_norm_eps\": %s,\n"
		"  \"rope_parameters\": {\n"
		"    \"rope_theta\": %s,\n"
		"    \"rope_type\": \"default\"\n"
		"  },\n"
		"  \"rope_theta\": %s,\n"
		"  \"tie_word_embeddings\": %s,\n"
		"  \"vocab_size\": %d\n"
		"}\n",
		torch[dtype], gpt_hs(d), d->C, gpt_ff(d), d->T, d->NH, d->L, gpt_kvh(d), eps, theta,
		theta, gpt_tied(d) ? "true" : "false", d->V);
}

int
gpt_hf_save_config(const char *dir, const struct gpt_dims *d, enum zinf_dtype dtype,
		   const char *from_hf)
{
	char path[4200], tmp[4300], src[4200];
	snprintf(path, sizeof(path), "%s/config.json", dir);
	snprintf(tmp, sizeof(tmp), "%s/.config.json.tmp%ld", dir, (long)getpid());
	FILE *in = NULL;
	if (from_hf) { /* the source's, byte for byte (a directory, or its config.json) */
		struct stat st;
		bool is_dir = stat(from_hf, &st) == 0 && S_ISDIR(st.st_mode);
		snprintf(src, sizeof(src), is_dir ? "%s/config.json" : "%s", from_hf);
		if (!(in = fopen(src, "rb"))) {
			return errno;
		}
	}
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	FILE *f = fd < 0 ? NULL : fdopen(fd, "wb");
	int err = f ? 0 : errno;
	if (f && in) {
		char buf[8192];
		size_t n;
		while ((n = fread(buf, 1, sizeof(buf), in)) > 0 && !err) {
			err = fwrite(buf, 1, n, f) == n ? 0 : errno ? errno : EIO;
		}
		err = err ?: ferror(in) ? EIO : 0;
	} else if (f) {
		config_from_dims(f, d, dtype);
	}
	if (f && !err && (fflush(f) != 0 || fsync(fileno(f)) != 0)) {
		err = errno;
	}
	if (f && fclose(f) != 0 && !err) {
		err = errno;
	} else if (!f && fd >= 0) {
		close(fd);
	}
	if (in) {
		fclose(in);
	}
	if (!err && rename(tmp, path) != 0) {
		err = errno;
	}
	if (err) {
		unlink(tmp);
		return err;
	}
	/* the rename on disk: the directory synced */
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0 || fsync(dfd) != 0) {
		err = errno;
	}
	if (dfd >= 0) {
		close(dfd);
	}
	return err;
}
