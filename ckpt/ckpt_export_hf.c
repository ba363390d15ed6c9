/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ckpt/ckpt_export_hf.c: zinf_ckpt_export_hf: a checkpoint as a Hugging Face model directory.
 * The tensors the config.json's model has (its family's names and shapes, from the sizes
 * zinf_hf_model_read gives) are matched to the checkpoint's parameters, each by name and shape,
 * before anything is written; then the weights go through the safetensors writer (one file, or
 * shards and their index) and config.json is written last (the caller's file, its dtype key
 * set to the type written when it names another). GPT-2's Conv1D weights, [out, in] in the
 * checkpoint, are written [in, out], transposed in bands of columns. Not here: the safetensors
 * format (safetensors_write.c), config.json's sizes (config/hf_model.c), the choice of file
 * and the refusals of the command line (cli/checkpoint.c).
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_fs.h"
#include "common/util.h"
#include "zinf/checkpoint.h"
#include "zinf/config.h"
#include "zinf/safetensors.h"

/* config.json is read whole: a model's is a few KB (with a tokenizer's label maps, hundreds) */
#define HF_CONFIG_MAX (16u << 20)

void
zinf_ckpt_hf_opts_init(struct zinf_ckpt_hf_opts *o)
{
	if (!o) {
		return;
	}
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	o->dtype = -1;
	o->shard_bytes = ZINF_CKPT_HF_SHARD_BYTES;
	o->buffer_bytes = ZINF_CKPT_HF_BUFFER_BYTES;
}

/* ---- the tensors of the config's model ---------------------------------------------------- */

/* A tensor of the model: its name, Hugging Face's shape, and whether the checkpoint holds it
 * transposed (GPT-2's Conv1D weights: [out, in] there, [in, out] in the files). */
struct hf_tensor {
	char name[112];
	uint32_t ndim;
	uint64_t shape[2]; /* Hugging Face's */
	bool conv1d;
	int32_t param; /* the checkpoint's parameter; -1: none yet */
};

struct hf_list {
	struct hf_tensor *t;
	uint32_t n, cap;
	int err;
};

static void push_tensor(struct hf_list *l, uint64_t rows, uint64_t cols, bool conv1d,
			const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* Append one (rows 0: a vector of cols). Errors stick in l->err. */
static void
push_tensor(struct hf_list *l, uint64_t rows, uint64_t cols, bool conv1d, const char *fmt, ...)
{
	if (l->err) {
		return;
	}
	if (l->n == l->cap) {
		uint32_t cap = l->cap ? 2 * l->cap : 64;
		struct hf_tensor *t = zc_malloc(cap * sizeof(*t));
		if (!t) {
			l->err = ZINF_FAIL(-ENOMEM, "checkpoint export: the model's tensor list");
			return;
		}
		if (l->n) {
			memcpy(t, l->t, l->n * sizeof(*t));
		}
		zc_free(l->t);
		l->t = t;
		l->cap = cap;
	}
	struct hf_tensor *t = &l->t[l->n++];
	memset(t, 0, sizeof(*t));
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(t->name, sizeof(t->name), fmt, ap);
	va_end(ap);
	t->ndim = rows ? 2 : 1;
	t->shape[0] = rows ? rows : cols;
	t->shape[1] = rows ? cols : 0;
	t->conv1d = conv1d;
	t->param = -1;
}

/*
 * What transformers builds for m: GPT2LMHeadModel (Conv1D weights [in, out]; the head is wte
 * unless tie_word_embeddings is false)
 * or LlamaForCausalLM and kin (nn.Linear weights [out, in]; biases as the config says, qwen2's
 * on q, k and v only; lm_head unless tied). The names as state_dict() gives them.
 */
static void
model_tensors(const struct zinf_hf_model *m, struct hf_list *l)
{
	uint64_t V = m->vocab, C = m->hidden, I = m->intermediate;
	if (m->arch == ZINF_HF_GPT2) {
		push_tensor(l, V, C, false, "transformer.wte.weight");
		push_tensor(l, m->positions, C, false, "transformer.wpe.weight");
		for (uint64_t b = 0; b < m->layers; b++) {
			const char *h = "transformer.h";
			unsigned long long k = (unsigned long long)b;
			push_tensor(l, 0, C, false, "%s.%llu.ln_1.weight", h, k);
			push_tensor(l, 0, C, false, "%s.%llu.ln_1.bias", h, k);
			push_tensor(l, C, 3 * C, true, "%s.%llu.attn.c_attn.weight", h, k);
			push_tensor(l, 0, 3 * C, false, "%s.%llu.attn.c_attn.bias", h, k);
			push_tensor(l, C, C, true, "%s.%llu.attn.c_proj.weight", h, k);
			push_tensor(l, 0, C, false, "%s.%llu.attn.c_proj.bias", h, k);
			push_tensor(l, 0, C, false, "%s.%llu.ln_2.weight", h, k);
			push_tensor(l, 0, C, false, "%s.%llu.ln_2.bias", h, k);
			push_tensor(l, C, I, true, "%s.%llu.mlp.c_fc.weight", h, k);
			push_tensor(l, 0, I, false, "%s.%llu.mlp.c_fc.bias", h, k);
			push_tensor(l, I, C, true, "%s.%llu.mlp.c_proj.weight", h, k);
			push_tensor(l, 0, C, false, "%s.%llu.mlp.c_proj.bias", h, k);
		}
		push_tensor(l, 0, C, false, "transformer.ln_f.weight");
		push_tensor(l, 0, C, false, "transformer.ln_f.bias");
		if (!m->tied) {
			push_tensor(l, V, C, false, "lm_head.weight");
		}
	} else {
		uint64_t q = m->heads * m->head_dim, kv = m->kv_heads * m->head_dim;
		bool qwen2 = !strcmp(m->model_type, "qwen2"), ab = m->attention_bias,
		     mb = m->mlp_bias;
		push_tensor(l, V, C, false, "model.embed_tokens.weight");
		for (uint64_t b = 0; b < m->layers; b++) {
			const char *h = "model.layers";
			unsigned long long k = (unsigned long long)b;
			push_tensor(l, 0, C, false, "%s.%llu.input_layernorm.weight", h, k);
			push_tensor(l, q, C, false, "%s.%llu.self_attn.q_proj.weight", h, k);
			push_tensor(l, kv, C, false, "%s.%llu.self_attn.k_proj.weight", h, k);
			push_tensor(l, kv, C, false, "%s.%llu.self_attn.v_proj.weight", h, k);
			push_tensor(l, C, q, false, "%s.%llu.self_attn.o_proj.weight", h, k);
			if (ab) {
				push_tensor(l, 0, q, false, "%s.%llu.self_attn.q_proj.bias", h, k);
				push_tensor(l, 0, kv, false, "%s.%llu.self_attn.k_proj.bias", h, k);
				push_tensor(l, 0, kv, false, "%s.%llu.self_attn.v_proj.bias", h, k);
			}
			if (ab && !qwen2) {
				push_tensor(l, 0, C, false, "%s.%llu.self_attn.o_proj.bias", h, k);
			}
			push_tensor(l, 0, C, false, "%s.%llu.post_attention_layernorm.weight", h,
				    k);
			push_tensor(l, I, C, false, "%s.%llu.mlp.gate_proj.weight", h, k);
			push_tensor(l, I, C, false, "%s.%llu.mlp.up_proj.weight", h, k);
			push_tensor(l, C, I, false, "%s.%llu.mlp.down_proj.weight", h, k);
			if (mb) {
				push_tensor(l, 0, I, false, "%s.%llu.mlp.gate_proj.bias", h, k);
				push_tensor(l, 0, I, false, "%s.%llu.mlp.up_proj.bias", h, k);
				push_tensor(l, 0, C, false, "%s.%llu.mlp.down_proj.bias", h, k);
			}
		}
		push_tensor(l, 0, C, false, "model.norm.weight");
		if (!m->tied) {
			push_tensor(l, V, C, false, "lm_head.weight");
		}
	}
}

static int
by_name(const void *a, const void *b)
{
	return strcmp(((const struct hf_tensor *)a)->name, ((const struct hf_tensor *)b)->name);
}

/* "[a, b]" of n dimensions into buf */
static const char *
shape_str(char *buf, size_t len, uint32_t n, const uint64_t *s)
{
	size_t at = (size_t)snprintf(buf, len, "[");
	for (uint32_t d = 0; d < n && at < len; d++) {
		at += (size_t)snprintf(buf + at, len - at, "%s%llu", d ? ", " : "",
				       (unsigned long long)s[d]);
	}
	if (at < len) {
		snprintf(buf + at, len - at, "]");
	}
	return buf;
}

/*
 * Every parameter of c matched to its tensor in l (sorted by name here; each t->param set), by
 * name and by shape (a Conv1D weight's held transposed). The first mismatch is the error, with
 * how many others there are: -EINVAL.
 */
static int
match(struct zinf_ckpt *c, const struct zinf_ckpt_info *in, struct hf_list *l, const char *config,
      const struct zinf_hf_model *m)
{
	qsort(l->t, l->n, sizeof(*l->t), by_name);
	char first[1024] = "", a[96], b[96];
	uint32_t bad = 0;
	for (uint32_t i = 0; i < in->n_params; i++) {
		struct zinf_ckpt_param p = {.size = sizeof(p)};
		int rc = zinf_ckpt_param(c, i, &p);
		if (rc) {
			return rc;
		}
		struct hf_tensor key;
		snprintf(key.name, sizeof(key.name), "%s", p.name);
		struct hf_tensor *t = strlen(p.name) < sizeof(key.name)
					      ? bsearch(&key, l->t, l->n, sizeof(*l->t), by_name)
					      : NULL;
		if (!t) {
			if (!bad++) {
				snprintf(first, sizeof(first),
					 "the checkpoint's %s %s is no tensor of the %s model %s "
					 "describes",
					 p.name, shape_str(a, sizeof(a), p.ndim, p.shape),
					 m->model_type, config);
			}
			continue;
		}
		t->param = (int32_t)i;
		/* what the checkpoint holds: Hugging Face's shape, a Conv1D weight's reversed */
		uint64_t want[2] = {t->shape[t->conv1d], t->shape[!t->conv1d]};
		if (t->ndim == 1) {
			want[0] = t->shape[0];
		}
		bool ok = p.ndim == t->ndim && p.shape[0] == want[0] &&
			  (t->ndim == 1 || p.shape[1] == want[1]);
		if (!ok && !bad++) {
			uint64_t numel = t->ndim == 1 ? want[0] : want[0] * want[1];
			snprintf(first, sizeof(first),
				 "%s is %s in the checkpoint; the %s model %s describes needs "
				 "%s%s%s",
				 p.name, shape_str(a, sizeof(a), p.ndim, p.shape), m->model_type,
				 config, shape_str(b, sizeof(b), t->ndim, want),
				 t->conv1d ? " (a Conv1D weight, held as [out, in] and written as "
					     "Hugging Face's [in, out])"
					   : "",
				 p.ndim == 1 && t->ndim == 2 && p.numel == numel
					 ? " (the checkpoint was saved without shapes: save it "
					   "again with a trainer that gives them)"
					 : "");
		}
	}
	for (uint32_t k = 0; k < l->n; k++) {
		if (l->t[k].param < 0 && !bad++) {
			snprintf(first, sizeof(first),
				 "the %s model %s describes has %s %s; the checkpoint has no such "
				 "tensor",
				 m->model_type, config, l->t[k].name,
				 shape_str(a, sizeof(a), l->t[k].ndim, l->t[k].shape));
		}
	}
	if (bad) {
		return ZINF_FAIL(
			-EINVAL,
			"checkpoint export to Hugging Face: %s: %s (%u mismatch%s in all); "
			"nothing written",
			in->path, first, bad, bad == 1 ? "" : "es");
	}
	return 0;
}

/* ---- config.json -------------------------------------------------------------------------- */

static const char *
torch_name(enum zinf_dtype dt)
{
	return dt == ZINF_BF16 ? "bfloat16" : dt == ZINF_F16 ? "float16" : "float32";
}

/*
 * config.json as written: the file's bytes, or (its dtype naming another type than dt) its JSON
 * with "dtype" (transformers 4's "torch_dtype" when only that is there) set to dt's name, keys
 * in the file's order, indented by 2 as transformers writes it. *out malloc'ed, *len its bytes.
 */
static int
config_text(const char *config, enum zinf_dtype dt, char **out, size_t *len)
{
	int fd = open(config, O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		int e = -errno;
		if (fd >= 0) {
			close(fd);
		}
		return ZINF_FAIL(e, "checkpoint export: %s: %s", config, zinf_strerror(e));
	}
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size > HF_CONFIG_MAX) {
		close(fd);
		return ZINF_FAIL(-EINVAL, "checkpoint export: %s: %s", config,
				 S_ISREG(st.st_mode) ? "larger than 16 MiB: not a config.json"
						     : "not a regular file");
	}
	size_t n = (size_t)st.st_size, got = 0;
	char *text = zc_malloc(n + 1);
	if (!text) {
		close(fd);
		return ZINF_FAIL(-ENOMEM, "checkpoint export: %s: %zu bytes", config, n);
	}
	while (got < n) {
		ssize_t r = read(fd, text + got, n - got);
		if (r < 0 && errno == EINTR) {
			continue;
		}
		if (r <= 0) {
			int e = r < 0 ? -errno : -EIO;
			close(fd);
			zc_free(text);
			return ZINF_FAIL(e, "checkpoint export: reading %s: %s", config,
					 zinf_strerror(e));
		}
		got += (size_t)r;
	}
	close(fd);
	text[n] = '\0';
	json_error_t je;
	json_t *o = json_loadb(text, n, JSON_REJECT_DUPLICATES, &je);
	if (!json_is_object(o)) {
		json_decref(o);
		zc_free(text);
		return ZINF_FAIL(-EINVAL, "checkpoint export: %s:%d: %s", config, je.line,
				 o ? "not a JSON object" : je.text);
	}
	const char *key = json_object_get(o, "dtype") || !json_object_get(o, "torch_dtype")
				  ? "dtype"
				  : "torch_dtype";
	const char *has = json_string_value(json_object_get(o, key));
	int rc = 0;
	if (has && !strcmp(has, torch_name(dt))) {
		*out = text;
		*len = n;
	} else {
		zc_free(text);
		char *d = NULL, *t = NULL;
		if (json_object_set_new(o, key, json_string(torch_name(dt))) == 0) {
			d = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
		}
		size_t dl = d ? strlen(d) : 0;
		if (d && (t = zc_malloc(dl + 2))) {
			memcpy(t, d, dl);
			t[dl] = '\n'; /* as transformers ends it */
			t[dl + 1] = '\0';
			*out = t;
			*len = dl + 1;
		} else {
			rc = ZINF_FAIL(-ENOMEM, "checkpoint export: %s: its new text", config);
		}
		free(d);
	}
	json_decref(o);
	return rc;
}

/* ---- the weights ---------------------------------------------------------------------------- */

/*
 * A Conv1D weight, [rows = out, cols = in] in the checkpoint, as tensor k of w in Hugging
 * Face's [in, out]: bands of `band` columns, each read as one range of `band` elements per row
 * into a (f32, [rows][band]) and written from b ([band][rows]) as the band's rows of the output.
 */
static int
write_transposed(struct zinf_ckpt *c, uint32_t i, uint64_t rows, uint64_t cols,
		 struct zinf_safetensors_writer *w, uint32_t k, float *a, float *b, uint64_t band)
{
	int rc = 0;
	for (uint64_t c0 = 0; c0 < cols && !rc; c0 += band) {
		uint64_t bw = ZINF_MIN(band, cols - c0);
		for (uint64_t r = 0; r < rows && !rc; r++) {
			rc = zinf_ckpt_read(c, i, 0, r * cols + c0, bw, ZINF_F32, a + r * bw);
		}
		for (uint64_t j = 0; j < bw && !rc; j++) {
			for (uint64_t r = 0; r < rows; r++) {
				b[j * rows + r] = a[r * bw + j];
			}
		}
		if (!rc) {
			rc = zinf_safetensors_writer_write(w, k, c0 * rows, bw * rows, ZINF_F32, b);
		}
	}
	return rc;
}

static int
write_weights(struct zinf_ckpt *c, const struct zinf_ckpt_info *in, const struct hf_list *l,
	      const char *out, enum zinf_dtype dt, const struct zinf_ckpt_hf_opts *o)
{
	/* by parameter: its tensor in l */
	const struct hf_tensor **of = zc_calloc(in->n_params, sizeof(*of));
	if (!of) {
		return ZINF_FAIL(-ENOMEM, "checkpoint export: %u tensors", in->n_params);
	}
	uint64_t longest = 0; /* the longest Conv1D column (its rows) */
	for (uint32_t k = 0; k < l->n; k++) {
		of[l->t[k].param] = &l->t[k];
		if (l->t[k].conv1d) {
			longest = ZINF_MAX(longest, l->t[k].shape[1]);
		}
	}
	struct zinf_safetensors_writer_opts wo;
	zinf_safetensors_writer_opts_init(&wo);
	wo.shard_bytes = o->shard_bytes;
	wo.overwrite = o->overwrite;
	char path[CKPT_PATH];
	snprintf(path, sizeof(path), "%s/model.safetensors", out);
	struct zinf_safetensors_writer *w = NULL;
	int rc = zinf_safetensors_writer_create(path, &wo, &w);
	for (uint32_t i = 0; i < in->n_params && rc >= 0; i++) {
		rc = zinf_safetensors_writer_add(w, of[i]->name, dt, of[i]->ndim, of[i]->shape);
	}
	uint64_t piece = ZINF_MAX(o->buffer_bytes / 8, 1), elems = ZINF_MAX(piece, longest);
	float *a = rc < 0 ? NULL : zc_malloc(elems * sizeof(float));
	float *b = rc < 0 ? NULL : zc_malloc(elems * sizeof(float));
	if (rc >= 0 && (!a || !b)) {
		rc = ZINF_FAIL(-ENOMEM, "checkpoint export: 2 buffers of %llu elements",
			       (unsigned long long)elems);
	}
	for (uint32_t i = 0; i < in->n_params && rc >= 0; i++) {
		const struct hf_tensor *t = of[i];
		uint64_t numel = t->ndim == 1 ? t->shape[0] : t->shape[0] * t->shape[1];
		if (t->conv1d) {
			/* [in, out] from [out, in]: columns of the checkpoint's rows */
			uint64_t rows = t->shape[1], cols = t->shape[0];
			rc = write_transposed(c, i, rows, cols, w, i, a, b,
					      ZINF_MAX(piece / rows, 1));
			continue;
		}
		for (uint64_t e = 0; rc >= 0 && e < numel; e += piece) {
			uint64_t n = ZINF_MIN(piece, numel - e);
			rc = zinf_ckpt_read(c, i, 0, e, n, dt, a);
			if (!rc) {
				rc = zinf_safetensors_writer_write(w, i, e, n, dt, a);
			}
		}
	}
	if (rc >= 0) {
		rc = zinf_safetensors_writer_finish(w);
	}
	zc_free(a);
	zc_free(b);
	zinf_safetensors_writer_destroy(w);
	zc_free(of);
	return rc;
}

/* ---- the export ----------------------------------------------------------------------------- */

/* out made when missing (its parent must exist; the parent synced), and a directory */
static int
make_out(const char *out)
{
	struct stat st;
	if (mkdir(out, 0755) == 0) {
		return ckpt_fsync_parent(out);
	}
	int e = -errno;
	if (e == -EEXIST && stat(out, &st) == 0 && S_ISDIR(st.st_mode)) {
		return 0;
	}
	if (e == -EEXIST) {
		e = -ENOTDIR;
	}
	return ZINF_FAIL(e, "checkpoint export: making the directory %s: %s", out,
			 zinf_strerror(e));
}

int
zinf_ckpt_export_hf(struct zinf_ckpt *c, const char *out, const struct zinf_ckpt_hf_opts *opts)
{
	if (!c || !out || !*out || !opts || opts->size < sizeof(*opts) || !opts->config ||
	    (opts->dtype != -1 && zinf_dtype_size((enum zinf_dtype)opts->dtype) == 0) ||
	    strlen(out) > CKPT_PATH - 64) {
		return ZINF_FAIL(-EINVAL, "zinf_ckpt_export_hf: %s",
				 !c				? "NULL checkpoint"
				 : !out || !*out		? "no output directory"
				 : !opts			? "NULL opts"
				 : opts->size < sizeof(*opts)	? "opts->size too small"
				 : !opts->config		? "no config.json (opts->config)"
				 : strlen(out) > CKPT_PATH - 64 ? "output directory's path too long"
								: "unknown dtype");
	}
	struct zinf_ckpt_info in = {.size = sizeof(in)};
	int rc = zinf_ckpt_get_info(c, &in);
	if (rc) {
		return rc;
	}
	enum zinf_dtype dt = opts->dtype < 0 ? in.dtype : (enum zinf_dtype)opts->dtype;
	struct zinf_hf_model m = {.size = sizeof(m)};
	if ((rc = zinf_hf_model_read(opts->config, &m))) {
		return rc;
	}
	struct hf_list l = {0};
	model_tensors(&m, &l);
	char *cfg = NULL;
	size_t cfg_len = 0;
	char path[CKPT_PATH], tmp[CKPT_PATH];
	snprintf(path, sizeof(path), "%s/config.json", out);
	struct stat st;
	if (!(rc = l.err) && !(rc = match(c, &in, &l, opts->config, &m)) &&
	    !(rc = config_text(opts->config, dt, &cfg, &cfg_len))) {
		if (!opts->overwrite && lstat(path, &st) == 0) {
			rc = ZINF_FAIL(-EEXIST, "%s: exists: not replaced (overwrite not asked)",
				       path);
		}
	}
	int files = 0;
	if (!rc && !(rc = make_out(out)) &&
	    (files = write_weights(c, &in, &l, out, dt, opts)) < 0) {
		rc = files;
	}
	int fd = -1;
	if (!rc && !(rc = ckpt_atomic_open(path, tmp, &fd))) {
		rc = ckpt_atomic_close(fd, tmp, path, ckpt_write_full(fd, tmp, cfg, cfg_len));
	}
	zc_free(cfg);
	zc_free(l.t);
	return rc ? rc : files;
}
