/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/config_dump.c: a read configuration printed back as ds_config.json (zinf/config.h
 * zinf_config_dump), every key zinf uses with its value after defaults and "auto", in the key
 * tables' order. Older spellings, aliases and keys zinf ignores are not printed; the optimizer
 * and scheduler blocks only when the file had them; an "auto" left unresolved
 * (ZINF_CONFIG_UNRESOLVED_OK) is printed as "auto".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

/* A float as the shortest decimal that reads back as it (0.001f prints 0.001). */
static json_t *
float_json(float f)
{
	char buf[32];
	for (int prec = 6; prec <= 9; prec++) {
		snprintf(buf, sizeof(buf), "%.*g", prec, (double)f);
		if ((float)strtod(buf, NULL) == f) {
			break;
		}
	}
	return json_real(strtod(buf, NULL));
}

static json_t *
value_json(const struct cfg_key *k, const void *base)
{
	static const char *const dev[] = {"none", "cpu", "nvme"};
	const void *p = (const char *)base + k->off;
	switch (k->store) {
	case ST_BOOL:
	case ST_FLAG:
		return json_boolean(*(const bool *)p);
	case ST_STATES: {
		const struct zinf_optimizer_opts *o = base;
		return json_string(o->state_format == ZINF_STATE_Q8 ? "q8"
				   : o->state_dtype == ZINF_BF16    ? "bf16"
								    : "fp32");
	}
	case ST_MASTER:
		return json_string(*(const uint8_t *)p == ZINF_BF16 ? "bf16" : "fp32");
	case ST_U32:
		return json_integer(*(const uint32_t *)p);
	case ST_I32:
		return json_integer(*(const int32_t *)p);
	case ST_U64: {
		uint64_t u = *(const uint64_t *)p;
		return json_integer(u > INT64_MAX ? INT64_MAX : (json_int_t)u);
	}
	case ST_I64:
		return json_integer(*(const int64_t *)p);
	case ST_F64:
		return json_real(*(const double *)p);
	case ST_F32:
		return float_json(*(const float *)p);
	case ST_DEVICE:
		return json_string(dev[*(const enum zinf_offload_device *)p % 3]);
	case ST_WARMUP_TYPE:
		return json_string(
			*(const enum zinf_warmup_type *)p == ZINF_WARMUP_LINEAR ? "linear" : "log");
	case ST_BETAS: {
		const struct zinf_optimizer_opts *o = base;
		json_t *a = json_array();
		json_array_append_new(a, float_json(o->beta1));
		json_array_append_new(a, float_json(o->beta2));
		return a;
	}
	case ST_PATHS: {
		const struct zinf_offload_opts *o = base;
		if (o->n_paths == 1) {
			return json_string(o->nvme_path[0]);
		}
		json_t *a = json_array();
		for (uint32_t i = 0; i < o->n_paths; i++) {
			json_array_append_new(a, json_string(o->nvme_path[i]));
		}
		return o->n_paths ? a : (json_decref(a), json_null());
	}
	}
	return json_null();
}

/* Whether the "auto" at path was left unresolved (ZINF_CONFIG_UNRESOLVED_OK). */
static bool
unresolved(const struct zinf_train_config *c, const char *path)
{
	for (uint32_t i = 0; i < c->n_unresolved && i < ZINF_CONFIG_MAX_RESOLVED; i++) {
		if (strcmp(c->unresolved[i].path, path) == 0) {
			return true;
		}
	}
	return false;
}

static json_t *
section_json(const struct zinf_train_config *c, const struct cfg_section *sec, const void *base,
	     unsigned mask)
{
	static const char *const kinds[] = {"Adam", "AdamW", "Adagrad", "Lion"};
	json_t *obj = json_object();
	for (size_t i = 0; obj && i < sec->n; i++) {
		const struct cfg_key *k = &sec->keys[i];
		json_t *v = NULL;
		char path[256];
		snprintf(path, sizeof(path), "%s%s%s", sec->path, *sec->path ? "." : "", k->name);
		if ((k->flags & (F_ALIAS | F_DEPRECATED | F_WARN | F_IGNORED)) ||
		    (k->mask && mask && !(k->mask & mask))) {
			continue;
		}
		if ((k->flags & F_AUTO) && unresolved(c, path)) {
			v = json_string("auto"); /* the trainer's to resolve */
		} else if (k->store == ST_SECTION) {
			v = section_json(c, k->sub, (const char *)base + k->off, 0);
		} else if (k->store == ST_SPECIAL && strcmp(k->name, "optimizer") == 0) {
			if (!c->optimizer_given) {
				continue;
			}
			const struct zinf_optimizer_opts *o = &c->engine.optimizer;
			json_t *params = section_json(c, &cfg_optimizer_params, o, 1u << o->kind);
			if (params && o->kind == ZINF_OPTIM_ADAM) {
				/* DeepSpeed's "Adam" is AdamW unless told otherwise */
				json_object_set_new(params, "adam_w_mode", json_false());
			}
			v = json_pack("{s:s, s:o}", "type", kinds[o->kind % 4], "params", params);
		} else if (k->store == ST_SPECIAL && strcmp(k->name, "scheduler") == 0) {
			if (!c->scheduler_given) {
				continue;
			}
			const struct zinf_schedule_opts *s = &c->scheduler;
			v = json_pack("{s:s, s:o}", "type", zinf_schedule_name(s->type), "params",
				      section_json(c, &cfg_scheduler_params, s, 1u << s->type));
		} else if (k->store == ST_SPECIAL || k->store == ST_NONE) {
			continue;
		} else if ((k->store == ST_FLAG && !*(const bool *)((const char *)base + k->off)) ||
			   (k->store == ST_STATES &&
			    ((const struct zinf_optimizer_opts *)base)->state_format ==
				    ZINF_STATE_PLAIN &&
			    ((const struct zinf_optimizer_opts *)base)->state_dtype == ZINF_F32) ||
			   (k->store == ST_MASTER &&
			    *(const uint8_t *)((const char *)base + k->off) == ZINF_F32)) {
			continue; /* the default, which most files do not spell out */
		} else {
			v = value_json(k, base);
		}
		if (!v || json_object_set_new(obj, k->name, v) < 0) {
			json_decref(obj);
			return NULL;
		}
	}
	return obj;
}

int
zinf_config_dump(const struct zinf_train_config *c, char **out)
{
	if (!c || !out || c->size != sizeof(*c)) {
		return ZINF_FAIL(-EINVAL, "config dump: NULL or uninitialised config");
	}
	json_t *root = section_json(c, &cfg_top, c, 0);
	char *text = root ? json_dumps(root, JSON_INDENT(4) | JSON_REAL_PRECISION(10)) : NULL;
	json_decref(root);
	if (!text) {
		return ZINF_FAIL(-ENOMEM, "config dump: out of memory");
	}
	*out = text;
	return 0;
}
