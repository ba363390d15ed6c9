/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/config_parse.c: the walk of a parsed ds_config.json against the key tables
 * (config_keys.c): each value checked (type, range) and stored where its key says, "auto"
 * resolved from the caller's inputs as Hugging Face's integration does, unknown keys reported
 * as misspelt (the nearest key) or misplaced (where they belong), the optimizer and schedule
 * types read with DeepSpeed's aliases. Every problem is logged with the file, the key's line
 * and full path, and counted; the walk goes on so that all are reported. Not here: the checks
 * across keys (batch sizes, stages, precision: config.c).
 */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

bool
cfg_muted(const struct cfg_ctx *x, enum zinf_log_level lvl)
{
	return (lvl == ZINF_LOG_ERROR ? x->errors : x->warnings) >= CFG_SHOWN;
}

void
cfg_msg(struct cfg_ctx *x, enum zinf_log_level lvl, const char *path, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	if (cfg_muted(x, lvl)) {
		/* counted only: no line looked up, nothing formatted */
		x->errors += lvl == ZINF_LOG_ERROR;
		x->warnings += lvl == ZINF_LOG_WARN;
		return;
	}
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	int line = cfg_keylines_find(x->kl, x->n_kl, path);
	if (line > 0) {
		zc_log_emit(0, lvl, __FILE__, __LINE__, __func__, "%s:%d: %s: %s", x->name, line,
			    path, msg);
	} else {
		zc_log_emit(0, lvl, __FILE__, __LINE__, __func__, "%s: %s: %s", x->name, path, msg);
	}
	x->errors += lvl == ZINF_LOG_ERROR;
	x->warnings += lvl == ZINF_LOG_WARN;
}

/* `v` for a message: its JSON text (shortened) and what it is. */
const char *
cfg_describe(json_t *v, char *buf, size_t len)
{
	static const char *const kinds[] = {"an object", "an array", "a string", "an integer",
					    "a number",	 "true",     "false",	 "null"};
	char *t = json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_ENSURE_ASCII);
	int type = json_typeof(v);
	if (type == JSON_OBJECT || type == JSON_ARRAY || !t) {
		snprintf(buf, len, "%s", kinds[type]);
	} else {
		snprintf(buf, len, "%.40s (%s)", t, kinds[type]);
	}
	free(t);
	return buf;
}

static const char *
range_text(const struct cfg_key *k, bool integer, char *buf, size_t len)
{
	const char *what = integer ? "an integer" : "a number";
	if (k->min == 1e-300) {
		snprintf(buf, len, "%s > 0", what);
	} else if (k->max >= 9.2e18) {
		snprintf(buf, len, "%s >= %.17g", what, k->min);
	} else {
		snprintf(buf, len, "%s in [%.17g, %.17g]", what, k->min, k->max);
	}
	return buf;
}

static bool
is_integer_store(int st)
{
	return st == ST_U32 || st == ST_I32 || st == ST_U64 || st == ST_I64;
}

static bool
store_number(struct cfg_ctx *x, const struct cfg_key *k, json_t *v, void *p, const char *path)
{
	char b1[96], b2[96];
	bool integer = is_integer_store(k->store);
	double d = json_number_value(v);
	if (!json_is_number(v) || (integer && json_is_real(v) && d != floor(d))) {
		CERR(x, path, "expected %s, not %s", range_text(k, integer, b1, sizeof(b1)),
		     cfg_describe(v, b2, sizeof(b2)));
		return false;
	}
	if (!(d >= k->min && d <= k->max)) {
		CERR(x, path, "%s is out of range: expected %s", cfg_describe(v, b2, sizeof(b2)),
		     range_text(k, integer, b1, sizeof(b1)));
		return false;
	}
	/* a real at the tables' widest bounds (2^63 and 2^64 are what I64M and BIG round to)
	   does not fit the field: converting it would be undefined (0 or a wrapped value) */
	if (json_is_real(v) &&
	    ((k->store == ST_I64 && !(d < 0x1p63)) || (k->store == ST_U64 && !(d < 0x1p64)))) {
		CERR(x, path, "%s is out of range: expected an integer in [%.17g, %s]",
		     cfg_describe(v, b2, sizeof(b2)), k->min,
		     k->store == ST_I64 ? "9223372036854775807" : "18446744073709551615");
		return false;
	}
	/* in the field's range now: an integer as JSON holds it (int64), or the real's value */
	bool js = json_is_integer(v);
	long long iv = js ? json_integer_value(v) : 0;
	switch (k->store) {
	case ST_U32:
		*(uint32_t *)p = js ? (uint32_t)iv : (uint32_t)d;
		break;
	case ST_I32:
		*(int32_t *)p = js ? (int32_t)iv : (int32_t)d;
		break;
	case ST_U64:
		*(uint64_t *)p = js ? (uint64_t)iv : (uint64_t)d;
		break;
	case ST_I64:
		*(int64_t *)p = js ? iv : (int64_t)d;
		break;
	case ST_F64:
		*(double *)p = d;
		break;
	case ST_F32:
		*(float *)p = (float)d;
		break;
	}
	return true;
}

static bool
store_paths(struct cfg_ctx *x, json_t *v, struct zinf_offload_opts *o, const char *path)
{
	char b[96];
	size_t n = json_is_array(v) ? json_array_size(v) : 1;
	if (!json_is_string(v) && !json_is_array(v)) {
		CERR(x, path, "expected a directory (a string) or a list of directories, not %s",
		     cfg_describe(v, b, sizeof(b)));
		return false;
	}
	if (n < 1 || n > ZINF_ENGINE_MAX_PATHS) {
		CERR(x, path, "%zu directories: expected 1 to %d", n, ZINF_ENGINE_MAX_PATHS);
		return false;
	}
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
		if (!json_is_string(e) || json_string_length(e) == 0) {
			CERR(x, path, "expected a non-empty directory name, not %s",
			     cfg_describe(e, b, sizeof(b)));
			return false;
		}
	}
	for (uint32_t i = 0; i < o->n_paths; i++) {
		zc_free((char *)o->nvme_path[i]);
		o->nvme_path[i] = NULL;
	}
	o->n_paths = 0;
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
		o->nvme_path[i] = zc_strdup(json_string_value(e));
		if (!o->nvme_path[i]) {
			x->fatal = -ENOMEM;
			return false;
		}
		o->n_paths++;
	}
	return true;
}

bool
cfg_store_value(struct cfg_ctx *x, const struct cfg_key *k, json_t *v, void *base, const char *path)
{
	char b[96];
	void *p = (char *)base + k->off;
	const char *s = json_string_value(v);
	switch (k->store) {
	case ST_BOOL:
	case ST_FLAG:
		if (!json_is_boolean(v)) {
			CERR(x, path, "expected true or false, not %s",
			     cfg_describe(v, b, sizeof(b)));
			return false;
		}
		if ((k->flags & F_NOT_TRUE) && json_is_true(v)) {
			CERR(x, path, "true is not supported: %s (set it to false)", k->note);
			return false;
		}
		if (!(k->flags & F_IGNORED)) {
			*(bool *)p = json_is_true(v);
		}
		return true;
	case ST_DEVICE: {
		static const char *const dev[] = {"none", "cpu", "nvme"};
		for (int i = 0; s && i < 3; i++) {
			if (strcmp(s, dev[i]) == 0) {
				*(enum zinf_offload_device *)p = (enum zinf_offload_device)i;
				return true;
			}
		}
		CERR(x, path, "expected \"none\", \"cpu\" or \"nvme\", not %s",
		     cfg_describe(v, b, sizeof(b)));
		return false;
	}
	case ST_STATES: {
		struct zinf_optimizer_opts *o = base;
		static const char *const st[] = {"fp32", "bf16", "q8"};
		for (int i = 0; s && i < 3; i++) {
			if (strcmp(s, st[i]) == 0) {
				o->state_dtype = i == 1 ? ZINF_BF16 : ZINF_F32;
				o->state_format = i == 2 ? ZINF_STATE_Q8 : ZINF_STATE_PLAIN;
				return true;
			}
		}
		CERR(x, path, "expected \"fp32\", \"bf16\" or \"q8\", not %s",
		     cfg_describe(v, b, sizeof(b)));
		return false;
	}
	case ST_MASTER:
		if (s && (strcmp(s, "fp32") == 0 || strcmp(s, "bf16") == 0)) {
			*(uint8_t *)p = s[0] == 'b' ? ZINF_BF16 : ZINF_F32; /* a byte */
			return true;
		}
		CERR(x, path, "expected \"fp32\" or \"bf16\", not %s",
		     cfg_describe(v, b, sizeof(b)));
		return false;
	case ST_WARMUP_TYPE:
		if (s && (strcmp(s, "log") == 0 || strcmp(s, "linear") == 0)) {
			*(enum zinf_warmup_type *)p =
				s[1] == 'o' ? ZINF_WARMUP_LOG : ZINF_WARMUP_LINEAR;
			return true;
		}
		CERR(x, path, "expected \"log\" or \"linear\", not %s",
		     cfg_describe(v, b, sizeof(b)));
		return false;
	case ST_PATHS:
		return store_paths(x, v, base, path);
	case ST_BETAS: {
		json_t *b0 = json_array_get(v, 0), *b1 = json_array_get(v, 1);
		double d0 = json_number_value(b0), d1 = json_number_value(b1);
		if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_number(b0) ||
		    !json_is_number(b1) || !(d0 >= 0 && d0 < 1) || !(d1 >= 0 && d1 < 1)) {
			CERR(x, path, "expected [beta1, beta2], two numbers in [0, 1), not %s",
			     cfg_describe(v, b, sizeof(b)));
			return false;
		}
		((struct zinf_optimizer_opts *)base)->beta1 = (float)d0;
		((struct zinf_optimizer_opts *)base)->beta2 = (float)d1;
		return true;
	}
	default:
		return store_number(x, k, v, p, path);
	}
}

#define parse_section cfg_parse_section

static void
join(char *out, size_t len, const char *prefix, const char *key)
{
	int n = snprintf(out, len, "%s%s%s", prefix, *prefix ? "." : "", key);
	if (n >= (int)len) {
		out[len - 4] = out[len - 3] = out[len - 2] =
			'.'; /* a key path that long: shown cut */
	}
}

/* An unknown key: in the wrong section, or misspelt. */
static void
unknown_key(struct cfg_ctx *x, const struct cfg_section *sec, const char *k, const char *prefix,
	    const char *path)
{
	char where[256] = "";
	size_t nw = 0;
	uint32_t cp;
	if (cfg_muted(x, ZINF_LOG_ERROR)) {
		x->errors++; /* past the ones shown: the nearest key is not looked for */
		return;
	}
	int at = cfg_first_non_ascii(k, &cp);
	if (at > 0) {
		CERR(x, path,
		     "unknown key: character %d of the name is U+%04X %s (copied from a web "
		     "page?); "
		     "keys are ASCII",
		     at, (unsigned)cp, cfg_char_name(cp));
		return;
	}
	for (size_t i = 0; i < cfg_n_sections; i++) {
		const struct cfg_section *s = cfg_all_sections[i];
		const struct cfg_key *o = s == sec ? NULL : cfg_find_key(s, k);
		if (o && nw < 3) {
			size_t l = strlen(where);
			snprintf(where + l, sizeof(where) - l, "%s%s", nw ? " or " : "",
				 *s->path ? s->path : "the top level");
			nw++;
		}
	}
	if (nw) {
		CERR(x, path, "\"%s\" does not belong in %s: it belongs in %s", k,
		     *prefix ? prefix : "the top level", where);
		return;
	}
	const struct cfg_key *best = NULL;
	const char *best_sec = NULL;
	size_t best_d = SIZE_MAX;
	for (size_t i = 0; i < cfg_n_sections; i++) {
		const struct cfg_section *s = cfg_all_sections[i];
		for (size_t j = 0; j < s->n; j++) {
			size_t d = cfg_edit_distance(k, s->keys[j].name);
			/* a key of this section wins a tie */
			if (d < best_d || (d == best_d && s == sec && best_sec != sec->path)) {
				best_d = d;
				best = &s->keys[j];
				best_sec = s->path;
			}
		}
	}
	size_t limit = ZINF_MAX((size_t)2, strlen(k) / 5);
	if (best && best_d <= limit && strcmp(best_sec, sec->path) == 0) {
		CERR(x, path, "unknown key; did you mean \"%s\"?", best->name);
	} else if (best && best_d <= limit) {
		CERR(x, path, "unknown key; did you mean \"%s\" (in %s)?", best->name,
		     *best_sec ? best_sec : "the top level");
	} else {
		CERR(x, path, "unknown key (not a DeepSpeed setting that zinf knows)");
	}
}

/* F_WARN keys: an explicitly disabled feature (false, {"enabled": false}, the number that means
   off: k->min, 0 by default) needs no warning. */
static bool
disabled(const struct cfg_key *k, json_t *v)
{
	json_t *en = json_is_object(v) ? json_object_get(v, "enabled") : NULL;
	return json_is_false(v) || json_is_null(v) || json_is_false(en) ||
	       (json_is_number(v) && json_number_value(v) == k->min);
}

static void
parse_optimizer(struct cfg_ctx *x, json_t *obj, const char *path)
{
	static const char *const kinds[] = {"Adam", "AdamW", "Adagrad", "Lion"};
	static const char *const refused[] = {"lamb",	    "onebitadam", "zerooneadam",
					      "onebitlamb", "muadam",	  "muadamw",
					      "musgd",	    "sgd",	  "adafactor"};
	char tpath[256], lower[64], b[96];
	if (!json_is_object(obj)) {
		CERR(x, path, "expected an object ({\"type\": ..., \"params\": {...}}), not %s",
		     cfg_describe(obj, b, sizeof(b)));
		return;
	}
	join(tpath, sizeof(tpath), path, "type");
	json_t *type = json_object_get(obj, "type");
	json_t *params = json_object_get(obj, "params");
	json_t *wmode = json_is_object(params) ? json_object_get(params, "adam_w_mode") : NULL;
	if (!json_is_string(type)) {
		CERR(x, tpath, "expected the optimizer's name (Adam, AdamW, Adagrad, Lion), not %s",
		     type ? cfg_describe(type, b, sizeof(b)) : "nothing");
		return;
	}
	snprintf(lower, sizeof(lower), "%s", json_string_value(type));
	for (char *p = lower; *p; p++) {
		*p = (char)tolower((unsigned char)*p);
	}
	enum zinf_optim_kind kind;
	if (strcmp(lower, "adam") == 0) {
		/* DeepSpeed's "Adam" is AdamW unless adam_w_mode is false */
		if (wmode && !json_is_boolean(wmode)) {
			CERR(x, "optimizer.params.adam_w_mode", "expected true or false, not %s",
			     cfg_describe(wmode, b, sizeof(b)));
		}
		kind = json_is_false(wmode) ? ZINF_OPTIM_ADAM : ZINF_OPTIM_ADAMW;
	} else if (strcmp(lower, "adamw") == 0) {
		kind = ZINF_OPTIM_ADAMW;
	} else if (strcmp(lower, "adagrad") == 0) {
		kind = ZINF_OPTIM_ADAGRAD;
	} else if (strcmp(lower, "lion") == 0) {
		kind = ZINF_OPTIM_LION;
	} else {
		for (size_t i = 0; i < ZINF_ARRAY_SIZE(refused); i++) {
			if (strcmp(lower, refused[i]) == 0) {
				CERR(x, tpath,
				     "optimizer \"%s\" is not implemented by zinf (it has Adam, "
				     "AdamW, Adagrad and Lion)",
				     json_string_value(type));
				return;
			}
		}
		size_t best = 0, bd = SIZE_MAX;
		for (size_t i = 0; i < ZINF_ARRAY_SIZE(kinds); i++) {
			size_t d = cfg_edit_distance(json_string_value(type), kinds[i]);
			if (d < bd) {
				bd = d;
				best = i;
			}
		}
		CERR(x, tpath,
		     "unknown optimizer \"%s\"%s%s%s (zinf has Adam, AdamW, Adagrad, Lion)",
		     json_string_value(type), bd <= 2 ? "; did you mean \"" : "",
		     bd <= 2 ? kinds[best] : "", bd <= 2 ? "\"?" : "");
		return;
	}
	x->c->optimizer_given = true;
	zinf_optimizer_opts_init(&x->c->engine.optimizer, kind);
	parse_section(x, obj, &cfg_optimizer, x->c, path, 0, NULL);
	if (json_is_object(params) || (params && !json_is_null(params))) {
		char ppath[256];
		join(ppath, sizeof(ppath), path, "params");
		parse_section(x, params, &cfg_optimizer_params, &x->c->engine.optimizer, ppath,
			      1u << kind, kinds[kind]);
	}
}

static void
parse_scheduler(struct cfg_ctx *x, json_t *obj, const char *path)
{
	char tpath[256], b[96];
	if (!json_is_object(obj)) {
		CERR(x, path, "expected an object ({\"type\": ..., \"params\": {...}}), not %s",
		     cfg_describe(obj, b, sizeof(b)));
		return;
	}
	join(tpath, sizeof(tpath), path, "type");
	json_t *type = json_object_get(obj, "type");
	enum zinf_sched_type t;
	if (!json_is_string(type) || zinf_schedule_parse(json_string_value(type), &t) != 0) {
		size_t best = 1, bd = SIZE_MAX;
		for (int i = 1; json_is_string(type) && i <= ZINF_SCHED_LR_RANGE_TEST; i++) {
			size_t d = cfg_edit_distance(json_string_value(type),
						     zinf_schedule_name((enum zinf_sched_type)i));
			if (d < bd) {
				bd = d;
				best = (size_t)i;
			}
		}
		CERR(x, tpath,
		     "%s is not a schedule%s%s%s (DeepSpeed's: WarmupLR, WarmupDecayLR, "
		     "WarmupCosineLR, OneCycle, LRRangeTest)",
		     type ? cfg_describe(type, b, sizeof(b)) : "nothing",
		     bd <= 3 ? "; did you mean \"" : "",
		     bd <= 3 ? zinf_schedule_name((enum zinf_sched_type)best) : "",
		     bd <= 3 ? "\"?" : "");
		return;
	}
	x->c->scheduler_given = true;
	zinf_schedule_opts_init(&x->c->scheduler, t, 0.0);
	parse_section(x, obj, &cfg_scheduler, x->c, path, 0, NULL);
	json_t *params = json_object_get(obj, "params");
	if (params && !json_is_null(params)) {
		char ppath[256];
		join(ppath, sizeof(ppath), path, "params");
		parse_section(x, params, &cfg_scheduler_params, &x->c->scheduler, ppath, 1u << t,
			      zinf_schedule_name(t));
	}
}

/* ST_SPECIAL keys other than optimizer.type/params, scheduler.type/params. */
static void
parse_special(struct cfg_ctx *x, const struct cfg_key *k, json_t *v, const char *path)
{
	char b[96];
	struct zinf_engine_opts *e = &x->c->engine;
	if (strcmp(k->name, "optimizer") == 0) {
		parse_optimizer(x, v, path);
		return;
	}
	if (strcmp(k->name, "scheduler") == 0) {
		parse_scheduler(x, v, path);
		return;
	}
	if (strncmp(k->name, "cpu_offload", 11) != 0 && strcmp(k->name, "adam_w_mode") != 0) {
		return; /* type, params: read by their section's parser */
	}
	if (!json_is_boolean(v)) {
		CERR(x, path, "expected true or false, not %s", cfg_describe(v, b, sizeof(b)));
		return;
	}
	if (strcmp(k->name, "cpu_offload_use_pin_memory") == 0) {
		e->offload_param.pin_memory = e->offload_optimizer.pin_memory = json_is_true(v);
	} else if (strcmp(k->name, "cpu_offload") == 0 && json_is_true(v)) {
		e->offload_optimizer.device = ZINF_OFFLOAD_CPU;
	} else if (strncmp(k->name, "cpu_offload_param", 17) == 0 && json_is_true(v)) {
		e->offload_param.device = ZINF_OFFLOAD_CPU;
	}
}

void
cfg_parse_section(struct cfg_ctx *x, json_t *obj, const struct cfg_section *sec, void *base,
		  const char *prefix, unsigned mask, const char *kind_name)
{
	char b[96];
	const char *k;
	json_t *v;
	if (!json_is_object(obj)) {
		CERR(x, prefix, "expected an object ({...}), not %s",
		     cfg_describe(obj, b, sizeof(b)));
		return;
	}
	json_object_foreach(obj, k, v)
	{
		char path[256];
		join(path, sizeof(path), prefix, k);
		const struct cfg_key *key = cfg_find_key(sec, k);
		if (!key) {
			unknown_key(x, sec, k, prefix, path);
			continue;
		}
		if (key->mask && mask && !(key->mask & mask)) {
			CERR(x, path, "\"%s\" is not a parameter of %s", k, kind_name);
			continue;
		}
		if (json_is_null(v)) {
			continue; /* DeepSpeed's None: the default */
		}
		if (key->flags & F_WARN) {
			if (!disabled(key, v)) {
				CWARN(x, path,
				      "a DeepSpeed feature zinf does not implement; ignored");
			}
			continue;
		}
		if (key->flags & (F_DEPRECATED | F_ALIAS)) {
			json_t *other = json_object_get(obj, key->alias);
			if (other && !json_is_null(other) &&
			    strcmp(k, "cpu_offload_use_pin_memory") != 0) {
				CERR(x, path,
				     "given together with \"%s\", which it is %s of: keep one",
				     key->alias,
				     key->flags & F_ALIAS ? "another name" : "the older name");
				continue;
			}
			if (key->flags & F_DEPRECATED) {
				CWARN(x, path, "deprecated by DeepSpeed: read as \"%s\"",
				      key->alias);
			}
		}
		if (key->store == ST_SPECIAL) {
			parse_special(x, key, v, path);
		} else if (json_is_string(v) && strcmp(json_string_value(v), "auto") == 0) {
			if (key->flags & F_AUTO) {
				cfg_resolve_auto(x, key, base, path);
			} else {
				CERR(x, path,
				     "\"auto\" is not accepted here (only where Hugging "
				     "Face's integration resolves it)");
			}
		} else if (key->store == ST_SECTION) {
			parse_section(x, v, key->sub, (char *)base + key->off, path, 0, NULL);
		} else if (key->store != ST_NONE && cfg_store_value(x, key, v, base, path)) {
			x->given |= 1u << key->auto_id;
		}
	}
}
