/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/config_auto.c: "auto" in ds_config.json, resolved as transformers'
 * HfTrainerDeepSpeedConfig does: batch keys from the trainer's micro batch, accumulation and the
 * world size; gradient_clipping, optimizer and scheduler values from the trainer's arguments;
 * fp16/bf16 from its flags; reduce_bucket_size = hidden^2, stage3_prefetch_bucket_size =
 * int(0.9 hidden^2), stage3_param_persistence_threshold = 10 hidden from the model's hidden
 * size. Each resolved value is logged at INFO and kept in the config's list. A value that needs
 * an input the caller did not give is an error naming both.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "config/config_internal.h"

static void
record_resolved(struct cfg_ctx *x, const char *path, json_t *v)
{
	char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(10));
	struct zinf_train_config *c = x->c;
	if (!t) {
		x->fatal = -ENOMEM;
		return;
	}
	ZINF_INFO("%s: %s: \"auto\" resolved to %s", x->name, path, t);
	if (c->n_resolved < ZINF_CONFIG_MAX_RESOLVED) {
		struct zinf_config_resolved *r = &c->resolved[c->n_resolved++];
		snprintf(r->path, sizeof(r->path), "%s", path);
		snprintf(r->value, sizeof(r->value), "%s", t);
	}
	free(t);
}

void
cfg_resolve_auto(struct cfg_ctx *x, const struct cfg_key *k, void *base, const char *path)
{
	const struct zinf_config_inputs *in = x->in;
	double h = (double)in->hidden_size;
	const char *need = NULL;
	json_t *v = NULL;
#define NEED_NUM(val, field)                                                                       \
	do {                                                                                       \
		if (isnan(val)) {                                                                  \
			need = field;                                                              \
		} else {                                                                           \
			v = json_real(val);                                                        \
		}                                                                                  \
	} while (0)
	switch (k->auto_id) {
	case A_TRAIN_BATCH: {
		json_int_t tb;
		if (!(in->micro_batch > 0 && in->grad_accum > 0)) {
			need = "micro_batch and grad_accum";
		} else if (__builtin_mul_overflow(in->micro_batch, in->grad_accum, &tb) ||
			   __builtin_mul_overflow(tb, (json_int_t)in->world_size, &tb)) {
			CERR(x, path,
			     "is \"auto\": micro_batch %lld x grad_accum %lld x world size %d "
			     "is past 2^63 - 1",
			     (long long)in->micro_batch, (long long)in->grad_accum,
			     (int)in->world_size);
			return;
		} else {
			v = json_integer(tb);
		}
		break;
	}
	case A_MICRO:
		need = in->micro_batch > 0 ? NULL : "micro_batch";
		v = need ? NULL : json_integer(in->micro_batch);
		break;
	case A_GAS:
		need = in->grad_accum > 0 ? NULL : "grad_accum";
		v = need ? NULL : json_integer(in->grad_accum);
		break;
	case A_FP16:
	case A_BF16: {
		int32_t f = k->auto_id == A_FP16 ? in->fp16 : in->bf16;
		need = f < 0 ? (k->auto_id == A_FP16 ? "fp16" : "bf16") : NULL;
		v = need ? NULL : json_boolean(f > 0);
		break;
	}
	case A_CLIP:
		NEED_NUM(in->max_grad_norm, "max_grad_norm");
		break;
	case A_LR:
	case A_WARMUP_MAX_LR:
		NEED_NUM(in->lr, "lr");
		break;
	case A_EPS:
		NEED_NUM(in->eps, "eps");
		break;
	case A_WD:
		NEED_NUM(in->weight_decay, "weight_decay");
		break;
	case A_BETAS:
		if (isnan(in->beta1) || isnan(in->beta2)) {
			need = "beta1 and beta2";
		} else {
			v = json_pack("[ff]", in->beta1, in->beta2);
		}
		break;
	case A_WARMUP_MIN_LR:
		v = json_real(0.0);
		break;
	case A_WARMUP_STEPS:
		need = in->warmup_num_steps >= 0 ? NULL : "warmup_num_steps";
		v = need ? NULL : json_integer(in->warmup_num_steps);
		break;
	case A_TOTAL_STEPS:
		need = in->total_num_steps > 0 ? NULL : "total_num_steps";
		v = need ? NULL : json_integer(in->total_num_steps);
		break;
	case A_REDUCE_BUCKET:
	case A_PREFETCH:
	case A_PERSIST:
		if (in->hidden_size == 0) {
			need = "hidden_size";
		} else if (!((k->auto_id == A_PERSIST ? 10 * h : h * h) < 0x1p63)) {
			/* past int64 (the product would wrap, the conversion be undefined) */
			CERR(x, path,
			     "is \"auto\": the hidden size %llu makes it %.4g, past 2^63 - 1",
			     (unsigned long long)in->hidden_size,
			     k->auto_id == A_PERSIST	? 10 * h
			     : k->auto_id == A_PREFETCH ? 0.9 * h * h
							: h * h);
			return;
		} else if (k->auto_id == A_REDUCE_BUCKET) {
			v = json_integer((json_int_t)(in->hidden_size * in->hidden_size));
		} else if (k->auto_id == A_PREFETCH) {
			v = json_integer((json_int_t)(0.9 * h * h)); /* int(0.9 * h * h) */
		} else {
			v = json_integer((json_int_t)(10 * in->hidden_size));
		}
		break;
	}
#undef NEED_NUM
	if (need) {
		CERR(x, path,
		     "is \"auto\", which is resolved from the trainer's %s "
		     "(struct zinf_config_inputs), not given",
		     need);
		return;
	}
	if (!v) {
		x->fatal = -ENOMEM;
		return;
	}
	if (cfg_store_value(x, k, v, base, path)) {
		x->given |= 1u << k->auto_id;
		record_resolved(x, path, v);
	}
	json_decref(v);
}
