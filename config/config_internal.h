/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/config_internal.h: what the ds_config.json reader's files share: the key tables
 * (config_keys.c), the text helpers (config_text.c: the non-ASCII pre-scan, the line of every
 * key, edit distance), and the reader's context. Not installed.
 */
#ifndef ZINF_ENGINE_CONFIG_INTERNAL_H
#define ZINF_ENGINE_CONFIG_INTERNAL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "common/util.h"
#include "zinf/config.h"

/* How a key's value is stored at (char *)base + off. */
enum cfg_store {
	ST_NONE = 0,	/* accepted, not stored */
	ST_BOOL,	/* bool */
	ST_U32,		/* uint32_t */
	ST_I32,		/* int32_t */
	ST_U64,		/* uint64_t */
	ST_I64,		/* int64_t */
	ST_F64,		/* double */
	ST_F32,		/* float */
	ST_DEVICE,	/* enum zinf_offload_device from "none" | "cpu" | "nvme" */
	ST_PATHS,	/* a zinf_offload_opts' nvme_path (a string or a list of strings) */
	ST_BETAS,	/* [beta1, beta2] into zinf_optimizer_opts.beta1/.beta2 (base) */
	ST_WARMUP_TYPE, /* "log" | "linear" */
	ST_SECTION,	/* an object: `sub`, based at base + off */
	ST_SPECIAL,	/* handled by the reader itself (optimizer, scheduler, deprecated) */
	ST_STATES,	/* zinf_optimizer_opts' state_dtype and state_format (base) from "fp32" |
			   "bf16" | "q8"; dumped only when not fp32 */
	ST_FLAG,	/* bool, dumped only when true (a key most files do not have) */
	ST_MASTER,	/* a byte holding an enum zinf_dtype (zinf_optimizer_opts.master_dtype) from
			   "fp32" | "bf16";      dumped only when not fp32 */
};

enum cfg_flag {
	F_AUTO = 1u << 0,	/* "auto" accepted (auto_id says from what) */
	F_DEPRECATED = 1u << 1, /* DeepSpeed's older spelling of `alias` (warned) */
	F_ALIAS = 1u << 2,	/* another accepted spelling of `alias` (silent) */
	F_WARN = 1u << 3,	/* a DeepSpeed feature zinf does not implement: one warning */
	F_IGNORED = 1u << 4,	/* accepted, no effect on zinf, silent */
	F_NOT_TRUE = 1u << 5,	/* a boolean that zinf only supports false for (`note` says why) */
};

enum cfg_auto {
	A_NONE = 0,
	A_TRAIN_BATCH,
	A_MICRO,
	A_GAS,
	A_CLIP,
	A_FP16,
	A_BF16,
	A_LR,
	A_BETAS,
	A_EPS,
	A_WD,
	A_REDUCE_BUCKET,
	A_PREFETCH,
	A_PERSIST,
	A_WARMUP_MIN_LR,
	A_WARMUP_MAX_LR,
	A_WARMUP_STEPS,
	A_TOTAL_STEPS,
};

struct cfg_section;

struct cfg_key {
	const char *name;
	uint8_t store;	   /* enum cfg_store */
	uint8_t flags;	   /* enum cfg_flag */
	uint8_t auto_id;   /* enum cfg_auto */
	uint8_t mask;	   /* optimizer.params: 1 << zinf_optim_kind; scheduler.params:
			      1 << zinf_sched_type; 0: every kind */
	size_t off;	   /* of the value from the section's base */
	double min, max;   /* numbers: allowed range (inclusive) */
	const char *alias; /* F_DEPRECATED / F_ALIAS: the key it stands for */
	const char *note;  /* F_NOT_TRUE / F_WARN: why */
	const struct cfg_section *sub;
};

struct cfg_section {
	const char *path; /* "" for the top level */
	const struct cfg_key *keys;
	size_t n;
};

/* The sections, top level first (config_keys.c). */
extern const struct cfg_section cfg_top, cfg_zero, cfg_offload_param, cfg_offload_optimizer,
	cfg_aio, cfg_fp16, cfg_bf16, cfg_optimizer, cfg_optimizer_params, cfg_scheduler,
	cfg_scheduler_params;
extern const struct cfg_section *const cfg_all_sections[];
extern const size_t cfg_n_sections;

const struct cfg_key *cfg_find_key(const struct cfg_section *sec, const char *name);

/* ---- the walk (config_parse.c) ----------------------------------------------------------- */

struct cfg_ctx {
	const char *name; /* of the file, for messages */
	const struct cfg_keyline *kl;
	size_t n_kl;
	const struct zinf_config_inputs *in;
	struct zinf_train_config *c;
	json_t *root;
	int errors;	     /* found (the first CFG_SHOWN logged, the rest counted) */
	int warnings;	     /* found (as errors) */
	int fatal;	     /* -ENOMEM */
	uint32_t given;	     /* 1 << enum cfg_auto of keys stored (batch and scheduler keys) */
	uint32_t unresolved; /* 1 << enum cfg_auto of "auto" whose input was missing */
};

/* Messages of each level a file reports; the rest are counted, and the count is reported: a
 * file of a million unknown keys reads in linear time and prints a screenful. */
#define CFG_SHOWN 20

/* Whether the next message of this level is past CFG_SHOWN: the caller counts it
 * (cfg_msg does) and skips the work of making it (the nearest key). */
bool cfg_muted(const struct cfg_ctx *x, enum zinf_log_level lvl);

/* Log "NAME:LINE: PATH: message" and count it (x->errors, x->warnings); past CFG_SHOWN of its
 * level only counted. */
void cfg_msg(struct cfg_ctx *x, enum zinf_log_level lvl, const char *path, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
#define CERR(x, path, ...)  cfg_msg((x), ZINF_LOG_ERROR, (path), __VA_ARGS__)
#define CWARN(x, path, ...) cfg_msg((x), ZINF_LOG_WARN, (path), __VA_ARGS__)

/* `v` for a message: its JSON text (shortened) and what it is; in buf. */
const char *cfg_describe(json_t *v, char *buf, size_t len);

/* Check value v of key k and store it at base + k->off; false (logged) when refused. */
bool cfg_store_value(struct cfg_ctx *x, const struct cfg_key *k, json_t *v, void *base,
		     const char *path);
/* Resolve k's "auto" from x->in and store it (config_auto.c). */
void cfg_resolve_auto(struct cfg_ctx *x, const struct cfg_key *k, void *base, const char *path);
/* An "auto" at path (of auto_id) that needs input `in`, not given: an error naming what it
 * needs, or with ZINF_CONFIG_UNRESOLVED_OK an entry of the config's unresolved[]. */
void cfg_unresolved(struct cfg_ctx *x, const char *path, enum zinf_config_input in, int auto_id);

/*
 * Walk object `obj` against section `sec`, storing at `base`; prefix is obj's full path ("" at
 * the top); mask (1 << kind or type) and kind_name for optimizer.params and scheduler.params.
 */
void cfg_parse_section(struct cfg_ctx *x, json_t *obj, const struct cfg_section *sec, void *base,
		       const char *prefix, unsigned mask, const char *kind_name);

/* ---- text helpers (config_text.c) --------------------------------------------------------- */

struct cfg_keyline {
	char *path; /* dotted full path (objects inside arrays share the array's path) */
	int line;   /* 1-based */
};

/*
 * The line of every key of valid JSON text, in order met. Returns the count (>= 0) and sets
 * *out (free with cfg_keylines_free), or -ENOMEM.
 */
int cfg_keylines_scan(const char *text, struct cfg_keyline **out);
void cfg_keylines_free(struct cfg_keyline *kl, size_t n);
/* The line of `path`, else of its nearest enclosing key found; 0 when none. */
int cfg_keylines_find(const struct cfg_keyline *kl, size_t n, const char *path);

/*
 * Log every non-ASCII character outside strings (NO-BREAK SPACE and its kin, typographic
 * quotes), named, with line and column, as "name:LINE:COL: ...". Returns how many.
 */
int cfg_prescan(const char *text, const char *name);

/* The Unicode name of a space or quote that web pages carry, else "a non-ASCII character". */
const char *cfg_char_name(uint32_t cp);
/* The 1-based character position of the first non-ASCII character of text (its code point in
 *cp), or 0 when there is none. */
int cfg_first_non_ascii(const char *text, uint32_t *cp);

/* Optimal string alignment distance (edits, adjacent transpositions count one). */
size_t cfg_edit_distance(const char *a, const char *b);

#endif
