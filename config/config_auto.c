/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/config_auto.c: "auto" in ds_config.json, resolved as the Hugging Face Trainer resolves
 * it (transformers' HfTrainerDeepSpeedConfig, trainer_config_process and _finalize): batch keys
 * from the trainer's micro batch, accumulation and the world size; gradient_clipping, optimizer
 * and scheduler values from the trainer's arguments; fp16/bf16 from its flags; reduce_bucket_size
 * = hidden^2, stage3_prefetch_bucket_size = int(0.9 hidden^2), stage3_param_persistence_threshold
 * = 10 hidden from the model's hidden size. An input the caller did not give takes
 * TrainingArguments' default (ZINF_CONFIG_HF_*), as the Trainer of a user who gave nothing would;
 * the three without one (training steps, hidden size, a world size given as 0) make the "auto"
 * an error naming what it needs, or, with ZINF_CONFIG_UNRESOLVED_OK, an unresolved entry. This is
 * the one resolver: zinf_gpt, zinf config check and any C trainer reach "auto" only through it.
 * Each resolved value is logged at INFO and kept in the config's list with its input.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "config/config_internal.h"

/* What an unresolved input is, for messages. */
static const char *
input_what(enum zinf_config_input in)
{
	switch (in) {
	case ZINF_CONFIG_IN_WORLD_SIZE:
		return "the world size (the number of data-parallel ranks)";
	case ZINF_CONFIG_IN_HIDDEN_SIZE:
		return "the model's hidden size (Hugging Face: model.config.hidden_size)";
	case ZINF_CONFIG_IN_TOTAL_STEPS:
		return "the trainer's number of training steps (Hugging Face: num_training_steps, "
		       "computed from the data)";
	}
	return "an input";
}

void
cfg_unresolved(struct cfg_ctx *x, const char *path, enum zinf_config_input in, int auto_id)
{
	struct zinf_train_config *c = x->c;
	x->unresolved |= 1u << auto_id; /* the checks that need it are left out either way */
	if (!(x->in->flags & ZINF_CONFIG_UNRESOLVED_OK)) {
		CERR(x, path,
		     "is \"auto\", resolved from %s, which has no default and was not given",
		     input_what(in));
		return;
	}
	ZINF_INFO("%s: %s: \"auto\" left unresolved: it needs %s", x->name, path, input_what(in));
	if (c->n_unresolved < ZINF_CONFIG_MAX_RESOLVED) {
		struct zinf_config_unresolved *u = &c->unresolved[c->n_unresolved++];
		snprintf(u->path, sizeof(u->path), "%s", path);
		u->input = in;
	}
}

static void
record_resolved(struct cfg_ctx *x, const char *path, json_t *v, const char *input, bool dflt)
{
	char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(10));
	struct zinf_train_config *c = x->c;
	if (!t) {
		x->fatal = -ENOMEM;
		return;
	}
	ZINF_INFO("%s: %s: \"auto\" resolved to %s (%s%s)", x->name, path, t, input,
		  dflt ? ": Hugging Face's default" : "");
	if (c->n_resolved < ZINF_CONFIG_MAX_RESOLVED) {
		struct zinf_config_resolved *r = &c->resolved[c->n_resolved++];
		snprintf(r->path, sizeof(r->path), "%s", path);
		snprintf(r->value, sizeof(r->value), "%s", t);
		snprintf(r->input, sizeof(r->input), "%s", input);
		r->defaulted = dflt;
	}
	free(t);
}

/* The input, or TrainingArguments' default when it was not given (NaN, or *dflt set). */
static double
num_or(double v, double hf, bool *dflt)
{
	if (isnan(v)) {
		*dflt = true;
		return hf;
	}
	return v;
}

static int64_t
count_or(int64_t v, int64_t hf, bool *dflt)
{
	if (v <= 0) {
		*dflt = true;
		return hf;
	}
	return v;
}

void
cfg_resolve_auto(struct cfg_ctx *x, const struct cfg_key *k, void *base, const char *path)
{
	const struct zinf_config_inputs *in = x->in;
	double h = (double)in->hidden_size;
	const char *from = NULL;
	bool dflt = false;
	json_t *v = NULL;
	switch (k->auto_id) {
	case A_TRAIN_BATCH: {
		int64_t mb = count_or(in->micro_batch, ZINF_CONFIG_HF_MICRO_BATCH, &dflt);
		int64_t gas = count_or(in->grad_accum, ZINF_CONFIG_HF_GRAD_ACCUM, &dflt);
		json_int_t tb;
		if (in->world_size == 0) {
			cfg_unresolved(x, path, ZINF_CONFIG_IN_WORLD_SIZE, k->auto_id);
			return;
		}
		if (__builtin_mul_overflow(mb, gas, &tb) ||
		    __builtin_mul_overflow(tb, (json_int_t)in->world_size, &tb)) {
			CERR(x, path,
			     "is \"auto\": micro_batch %lld x grad_accum %lld x world size %d "
			     "is past 2^63 - 1",
			     (long long)mb, (long long)gas, (int)in->world_size);
			return;
		}
		from = "train_batch_size (calculated)"; /* world x micro x accumulation */
		v = json_integer(tb);
		break;
	}
	case A_MICRO:
		from = "per_device_train_batch_size";
		v = json_integer(count_or(in->micro_batch, ZINF_CONFIG_HF_MICRO_BATCH, &dflt));
		break;
	case A_GAS:
		from = "gradient_accumulation_steps";
		v = json_integer(count_or(in->grad_accum, ZINF_CONFIG_HF_GRAD_ACCUM, &dflt));
		break;
	case A_FP16:
	case A_BF16: {
		int32_t f = k->auto_id == A_FP16 ? in->fp16 : in->bf16;
		from = k->auto_id == A_FP16 ? "fp16" : "bf16";
		dflt = f < 0;
		v = json_boolean(f > 0);
		break;
	}
	case A_CLIP:
		from = "max_grad_norm";
		v = json_real(num_or(in->max_grad_norm, ZINF_CONFIG_HF_MAX_GRAD_NORM, &dflt));
		break;
	case A_LR:
	case A_WARMUP_MAX_LR:
		from = "learning_rate";
		v = json_real(num_or(in->lr, ZINF_CONFIG_HF_LR, &dflt));
		break;
	case A_EPS:
		from = "adam_epsilon";
		v = json_real(num_or(in->eps, ZINF_CONFIG_HF_EPS, &dflt));
		break;
	case A_WD:
		from = "weight_decay";
		v = json_real(num_or(in->weight_decay, ZINF_CONFIG_HF_WEIGHT_DECAY, &dflt));
		break;
	case A_BETAS: {
		from = "adam_beta1+adam_beta2";
		double b1 = num_or(in->beta1, ZINF_CONFIG_HF_BETA1, &dflt);
		double b2 = num_or(in->beta2, ZINF_CONFIG_HF_BETA2, &dflt);
		v = json_pack("[ff]", b1, b2);
		break;
	}
	case A_WARMUP_MIN_LR:
		from = "0, not a trainer argument";
		v = json_real(0.0);
		break;
	case A_WARMUP_STEPS:
		/* get_warmup_steps(): warmup_steps, else ceil(warmup_ratio x steps); both 0 by
		   default */
		from = "warmup_steps";
		dflt = in->warmup_num_steps < 0;
		v = json_integer(dflt ? ZINF_CONFIG_HF_WARMUP_STEPS : in->warmup_num_steps);
		break;
	case A_TOTAL_STEPS:
		if (in->total_num_steps <= 0) {
			cfg_unresolved(x, path, ZINF_CONFIG_IN_TOTAL_STEPS, k->auto_id);
			return;
		}
		from = "num_training_steps";
		v = json_integer(in->total_num_steps);
		break;
	case A_REDUCE_BUCKET:
	case A_PREFETCH:
	case A_PERSIST:
		if (in->hidden_size == 0) {
			cfg_unresolved(x, path, ZINF_CONFIG_IN_HIDDEN_SIZE, k->auto_id);
			return;
		}
		if (!((k->auto_id == A_PERSIST ? 10 * h : h * h) < 0x1p63)) {
			/* past int64 (the product would wrap, the conversion be undefined) */
			CERR(x, path,
			     "is \"auto\": the hidden size %llu makes it %.4g, past 2^63 - 1",
			     (unsigned long long)in->hidden_size,
			     k->auto_id == A_PERSIST	? 10 * h
			     : k->auto_id == A_PREFETCH ? 0.9 * h * h
							: h * h);
			return;
		}
		from = "hidden_size";
		if (k->auto_id == A_REDUCE_BUCKET) {
			v = json_integer((json_int_t)(in->hidden_size * in->hidden_size));
		} else if (k->auto_id == A_PREFETCH) {
			v = json_integer((json_int_t)(0.9 * h * h)); /* int(0.9 * h * h) */
		} else {
			v = json_integer((json_int_t)(10 * in->hidden_size));
		}
		break;
	}
	if (!v) {
		x->fatal = -ENOMEM;
		return;
	}
	if (cfg_store_value(x, k, v, base, path)) {
		x->given |= 1u << k->auto_id;
		record_resolved(x, path, v, from, dflt);
	}
	json_decref(v);
}
