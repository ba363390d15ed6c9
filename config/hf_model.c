/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/hf_model.c: a Hugging Face model's shape from its config.json (zinf_hf_model_read): the
 * family, the sizes, and the parameter counts as transformers builds GPT2LMHeadModel and
 * LlamaForCausalLM (Mistral and Qwen2 alike), for `zinf estimate --hf-config` and `zinf config
 * check --hf-config`.
 */
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/util.h"
#include "zinf/config.h"

/* key's positive integer (absent: dflt when dflt >= 0, else an error), at most max. */
static int
size_of(const json_t *o, const char *file, const char *key, int64_t dflt, uint64_t max,
	uint64_t *out)
{
	const json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v)) {
		if (dflt < 0) {
			return ZINF_FAIL(-EINVAL, "%s: %s: missing (a model size zinf needs)", file,
					 key);
		}
		*out = (uint64_t)dflt;
		return 0;
	}
	if (!json_is_integer(v) || json_integer_value(v) < 1 ||
	    (uint64_t)json_integer_value(v) > max) {
		return ZINF_FAIL(-EINVAL, "%s: %s: expected an integer in [1, %llu]", file, key,
				 (unsigned long long)max);
	}
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

/* key's positive number (absent or null: dflt); errors name it `shown` */
static int
number_of(const json_t *o, const char *file, const char *key, const char *shown, double dflt,
	  double *out)
{
	const json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v)) {
		*out = dflt;
		return 0;
	}
	if (!json_is_number(v) || !(json_number_value(v) > 0)) {
		return ZINF_FAIL(-EINVAL, "%s: %s: expected a number > 0", file, shown);
	}
	*out = json_number_value(v);
	return 0;
}

/* key's string (absent or null: dflt) into out */
static int
string_of(const json_t *o, const char *file, const char *key, const char *dflt, char *out,
	  size_t cap)
{
	const json_t *v = json_object_get(o, key);
	if (v && !json_is_null(v) && !json_is_string(v)) {
		return ZINF_FAIL(-EINVAL, "%s: %s: expected a string", file, key);
	}
	const char *x = v && json_is_string(v) ? json_string_value(v) : dflt;
	if (strlen(x) >= cap) {
		return ZINF_FAIL(-EINVAL, "%s: %s: \"%.40s\" is longer than any zinf knows", file,
				 key, x);
	}
	snprintf(out, cap, "%s", x);
	return 0;
}

static bool
flag_of(const json_t *o, const char *key, bool dflt)
{
	const json_t *v = json_object_get(o, key);
	return json_is_boolean(v) ? json_is_true(v) : dflt;
}

/* GPT2LMHeadModel: wte, wpe, per block ln_1, c_attn (Conv1D H x 3H + 3H), c_proj, ln_2, c_fc
   (H x I + I), c_proj (I x H + H), then ln_f; the head is wte (tie_word_embeddings, default
   true), or an lm_head of its own. */
static void
count_gpt2(struct zinf_hf_model *m)
{
	uint64_t H = m->hidden, I = m->intermediate;
	m->layer_params =
		2 * H + (H * 3 * H + 3 * H) + (H * H + H) + 2 * H + (H * I + I) + (I * H + H);
	uint64_t wte = m->vocab * H;
	m->params = wte + m->positions * H + m->layers * m->layer_params + 2 * H +
		    (m->tied ? 0 : wte); /* an untied lm_head (no bias) */
	m->largest_layer = ZINF_MAX(m->layer_params, wte);
}

/* LlamaForCausalLM: embed_tokens, per block input_layernorm, q/k/v/o (GQA: k and v of
   kv_heads x head_dim), the SwiGLU's gate, up and down, post_attention_layernorm, then norm and
   lm_head (unless tied). Biases as the config says (qwen2: q, k and v only). */
static void
count_llama(struct zinf_hf_model *m, bool qwen2)
{
	uint64_t H = m->hidden, I = m->intermediate, q = m->heads * m->head_dim,
		 kv = m->kv_heads * m->head_dim;
	uint64_t attn = H * q + 2 * H * kv + q * H;
	if (m->attention_bias) {
		attn += q + 2 * kv + (qwen2 ? 0 : H);
	}
	uint64_t mlp = 3 * H * I + (m->mlp_bias ? 2 * I + H : 0);
	m->layer_params = attn + mlp + 2 * H;
	uint64_t embed = m->vocab * H;
	m->params = embed + m->layers * m->layer_params + H + (m->tied ? 0 : embed);
	m->largest_layer = ZINF_MAX(m->layer_params, embed);
}

int
zinf_hf_model_read(const char *path, struct zinf_hf_model *out)
{
	if (!path || !out || out->size < sizeof(*out)) {
		return ZINF_FAIL(-EINVAL, "zinf_hf_model_read: path %p, out %p (size %zu of %zu)",
				 (const void *)path, (void *)out, out ? out->size : 0,
				 sizeof(*out));
	}
	char file[4096];
	struct stat st;
	if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
		snprintf(file, sizeof(file), "%s/config.json", path);
	} else {
		snprintf(file, sizeof(file), "%s", path);
	}
	json_error_t je;
	json_t *o = json_load_file(file, JSON_REJECT_DUPLICATES, &je);
	if (!o) {
		int e = access(file, R_OK) ? -errno : -EINVAL;
		return ZINF_FAIL(e, "%s:%d: %s", file, je.line,
				 e == -EINVAL ? je.text : zinf_strerror(e));
	}
	struct zinf_hf_model m = {.size = sizeof(m)};
	const char *type = json_string_value(json_object_get(o, "model_type"));
	int rc = 0;
	bool gpt2 = type && !strcmp(type, "gpt2"), qwen2 = type && !strcmp(type, "qwen2");
	bool llama = type && (!strcmp(type, "llama") || !strcmp(type, "mistral") || qwen2);
	if (!json_is_object(o) || !(gpt2 || llama)) {
		rc = ZINF_FAIL(-EINVAL,
			       "%s: model_type %s: zinf knows gpt2, llama, mistral and qwen2", file,
			       type ? type : "(none)");
		goto out;
	}
	snprintf(m.model_type, sizeof(m.model_type), "%s", type);
	const uint64_t MAXH = 1u << 20;
	if (gpt2) {
		m.arch = ZINF_HF_GPT2;
		if ((rc = size_of(o, file, "vocab_size", -1, 1u << 24, &m.vocab)) ||
		    (rc = size_of(o, file, "n_embd", -1, MAXH, &m.hidden)) ||
		    (rc = size_of(o, file, "n_layer", -1, 1u << 16, &m.layers)) ||
		    (rc = size_of(o, file, "n_head", -1, MAXH, &m.heads)) ||
		    (rc = size_of(o, file, "n_positions", -1, 1u << 24, &m.positions)) ||
		    (rc = size_of(o, file, "n_inner", (int64_t)(4 * ZINF_MIN(m.hidden, MAXH)),
				  1u << 22, &m.intermediate))) {
			goto out;
		}
		m.kv_heads = m.heads;
		m.tied = flag_of(o, "tie_word_embeddings", true);
		m.attention_bias = m.mlp_bias = true;
		m.max_positions = m.positions;
		/* attention variants GPT2Attention has: scores not divided by sqrt(head_dim), or
		   also by the layer's number (the upcast of reorder_and_upcast_attn is numerics
		   only, as fp32 layers compute) */
		m.attn_unscaled = !flag_of(o, "scale_attn_weights", true);
		m.attn_layer_scaled = flag_of(o, "scale_attn_by_inverse_layer_idx", false);
		if ((rc = number_of(o, file, "layer_norm_epsilon", "layer_norm_epsilon", 1e-5,
				    &m.norm_eps)) ||
		    (rc = string_of(o, file, "activation_function", "gelu_new", m.act,
				    sizeof(m.act)))) {
			goto out;
		}
	} else {
		m.arch = ZINF_HF_LLAMA;
		if ((rc = size_of(o, file, "vocab_size", -1, 1u << 24, &m.vocab)) ||
		    (rc = size_of(o, file, "hidden_size", -1, MAXH, &m.hidden)) ||
		    (rc = size_of(o, file, "num_hidden_layers", -1, 1u << 16, &m.layers)) ||
		    (rc = size_of(o, file, "num_attention_heads", -1, MAXH, &m.heads)) ||
		    (rc = size_of(o, file, "num_key_value_heads", (int64_t)m.heads, MAXH,
				  &m.kv_heads)) ||
		    (rc = size_of(o, file, "intermediate_size", -1, 1u << 22, &m.intermediate))) {
			goto out;
		}
		m.tied = flag_of(o, "tie_word_embeddings", false);
		m.attention_bias = qwen2 || flag_of(o, "attention_bias", false);
		m.mlp_bias = flag_of(o, "mlp_bias", false);
		/* transformers 5 writes rope_parameters {"rope_theta", "rope_type"}; 4 wrote
		   rope_theta and rope_scaling at the top */
		const json_t *rp = json_object_get(o, "rope_parameters");
		bool in_rp = json_is_object(rp) && json_object_get(rp, "rope_theta");
		if ((rc = number_of(in_rp ? rp : o, file, "rope_theta",
				    in_rp ? "rope_parameters.rope_theta" : "rope_theta", 10000,
				    &m.rope_theta)) ||
		    (rc = number_of(o, file, "rms_norm_eps", "rms_norm_eps", 1e-6, &m.norm_eps)) ||
		    (rc = string_of(o, file, "hidden_act", "silu", m.act, sizeof(m.act))) ||
		    (rc = size_of(o, file, "max_position_embeddings", 2048, 1u << 30,
				  &m.max_positions))) {
			goto out;
		}
		/* a scaling whose type is "default" scales nothing (transformers 4 wrote
		   "type", later "rope_type") */
		const json_t *rs = json_object_get(o, "rope_scaling");
		const char *rst = json_string_value(json_object_get(rs, "rope_type"));
		rst = rst ? rst : json_string_value(json_object_get(rs, "type"));
		const char *rt = json_string_value(json_object_get(rp, "rope_type"));
		m.rope_scaling = (rs && !json_is_null(rs) && !(rst && !strcmp(rst, "default"))) ||
				 (rt && strcmp(rt, "default"));
		/* mistral's window applies (4096 when the key is absent: MistralConfig's default;
		   null: none); qwen2's only with use_sliding_window */
		bool mistral = !strcmp(type, "mistral");
		bool window = mistral || (qwen2 && flag_of(o, "use_sliding_window", false));
		const json_t *sw = json_object_get(o, "sliding_window");
		if (window && !(sw && json_is_null(sw)) &&
		    (rc = size_of(o, file, "sliding_window", mistral ? 4096 : 0, 1u << 30,
				  &m.sliding_window))) {
			goto out;
		}
	}
	if (m.hidden % m.heads && !json_object_get(o, "head_dim")) {
		rc = ZINF_FAIL(-EINVAL, "%s: %s %llu is not a multiple of the %llu heads", file,
			       gpt2 ? "n_embd" : "hidden_size", (unsigned long long)m.hidden,
			       (unsigned long long)m.heads);
		goto out;
	}
	if ((rc = size_of(o, file, "head_dim", (int64_t)(m.hidden / m.heads), MAXH, &m.head_dim))) {
		goto out;
	}
	if (m.heads % m.kv_heads || m.heads * m.head_dim > MAXH) {
		rc = ZINF_FAIL(-EINVAL,
			       "%s: %llu attention heads of %llu: the key/value heads (%llu) must "
			       "divide them, and heads x head_dim be at most 2^20",
			       file, (unsigned long long)m.heads, (unsigned long long)m.head_dim,
			       (unsigned long long)m.kv_heads);
		goto out;
	}
	if (gpt2) {
		count_gpt2(&m);
	} else {
		count_llama(&m, qwen2);
	}
	*out = m;
out:
	json_decref(o);
	return rc;
}
