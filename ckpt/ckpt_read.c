/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ckpt/ckpt_read.c: reading a checkpoint offline (zinf/checkpoint.h, docs/CHECKPOINT.md):
 * DIR/latest resolved to the TAG directory, manifest.json's size bounded by its data files,
 * parsed (the parameters one entry at a time, memory proportional to the file) and checked
 * field by field (types, ranges, partitions tiling their ranks' files exactly, every listed
 * file present with its size), the ranges of a parameter's state gathered from the stored
 * ranks' files with pread (a descriptor per file opened on use, at most CKPT_MAX_OPEN kept) and
 * converted, and the files' CRC32C checked in bounded chunks. Every refusal names the file and the
 * field. Not here: writing checkpoints (the engine's save), safetensors (safetensors_*.c,
 * ckpt_export.c), any device or collective. A handle is used by one thread at a time.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/opts.h"
#include "common/util.h"
#include "ckpt/ckpt_fs.h"
#include "ckpt/ckpt_internal.h"
#include "zinf/checkpoint.h"
#include "zinf/blocks/swap.h"

#define CKPT_FORMAT    "zinf-checkpoint"
#define CKPT_MAX_PARTS 16
#define CKPT_MAX_WORLD (1 << 24)
/*
 * The manifest's size, bounded by what the data files can hold before a byte of it is read:
 * every parameter takes at least one element of every stored rank's master file
 * (r<rank>.fp32, 4 bytes an element), and its entry in the manifest (name, numel, layer, shape,
 * part, one offset per stored rank) takes far less than CKPT_MANIFEST_PER_ELEM bytes per
 * element it owns; each rank file is listed in about 100 bytes; the rest (header, options,
 * parts) fits CKPT_MANIFEST_BASE. Never more than CKPT_MANIFEST_MAX.
 */
#define CKPT_MANIFEST_BASE     (1u << 20)
#define CKPT_MANIFEST_PER_ELEM 4096u
#define CKPT_MANIFEST_PER_FILE 256u
#define CKPT_MANIFEST_MAX      (1ull << 30)
#define CKPT_NAME_CHUNK	       (64u << 10)
/* Counters (steps, micro-steps): far from INT64_MAX, so that the engine can go on counting. */
#define CKPT_MAX_COUNT	  (INT64_C(1) << 62)
#define CKPT_VERIFY_CHUNK (4u << 20)
/* Descriptors a handle keeps open at most: the files are opened on use, and a checkpoint of a
 * large world lists more of them than a process may hold (RLIMIT_NOFILE). */
#define CKPT_MAX_OPEN 32
/* Elements converted per pread when the dtypes differ (the bounce buffer: 1 MiB of f32). */
#define CKPT_BOUNCE_ELEMS (256u << 10)

/* 48 bytes a parameter beside its name and offsets: a checkpoint may list millions. */
struct ckpt_param {
	char *name; /* in the handle's name chunks */
	uint64_t numel;
	int32_t layer;
	uint32_t ndim;
	uint64_t *shape;    /* [ndim] in the name chunks; NULL for one dimension (numel) */
	uint64_t part;	    /* elements per stored rank: ceil(numel / files_world) */
	uint64_t *flat_off; /* [files_world]: element offset in that rank's part files */
};

struct ckpt_part {
	char *name;
	enum zinf_dtype dtype;
};

struct ckpt_file {
	char *name;
	uint64_t bytes;
	uint32_t crc32c;
	int fd; /* -1 until first read */
};

/* Parameter names and shapes, copied out of the manifest into chunks of CKPT_NAME_CHUNK. */
struct name_chunk {
	struct name_chunk *next;
	size_t used, cap;
	char data[]; /* 8-aligned: after three 8-byte fields */
};

/* manifest.json's text while zinf_ckpt_open parses it: `params` is not built as one tree (a
 * jansson object costs about 1.4 KiB per entry), but read element by element from its text. */
struct mtext {
	const char *s;
	size_t len;
	size_t params_at;  /* the '[' of "params" (when params_n is valid) */
	size_t params_n;   /* its elements, counted when it was skipped */
	size_t params_len; /* its text's bytes, from '[' to ']' */
	bool params_seen;
};

struct zinf_ckpt {
	char *path;	  /* the TAG directory */
	char *mpath;	  /* its manifest.json, for messages */
	json_t *m;	  /* the manifest without "params" (in c->params) */
	struct mtext *mt; /* during zinf_ckpt_open only */
	const char *tag;
	const char *optimizer;
	int64_t steps;
	uint64_t micro_steps;
	int32_t world, files_world, stage;
	enum zinf_dtype dtype;
	uint32_t n_params, n_parts, n_files;
	struct ckpt_param *params;
	uint64_t *offs;		  /* [n_params * files_world]: every params[i].flat_off */
	struct name_chunk *names; /* params[i].name */
	struct ckpt_part *parts;
	struct ckpt_file *files;
	json_t *file_index;  /* name -> index into files */
	uint64_t *flat;	     /* [files_world]: elements of each stored rank's part files */
	uint32_t *rank_file; /* [files_world * n_parts]: index into files */
	uint64_t bytes;
	uint32_t n_open; /* files with a descriptor (at most CKPT_MAX_OPEN) */
	int dirfd;	 /* the TAG directory, opened once: every file is opened relative to it,
			    so a save that swaps the tag out meanwhile gives old files or errors,
			    never a mix */
	uint32_t evict;	 /* where the search for one to close starts (round robin) */
};

static void close_fds(struct zinf_ckpt *c);

/* ---- manifest checks ---------------------------------------------------------------------- */

/* Log "<manifest>: <field>: <what>" and return -EBADMSG. */
static int __attribute__((format(printf, 3, 4)))
bad(const struct zinf_ckpt *c, const char *field, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return ZINF_OBJ_FAIL(c->mpath, -EBADMSG, "%s: %s", field, msg);
}

static const char *
kind_of(const json_t *v)
{
	static const char *const kinds[] = {"an object", "an array", "a string", "an integer",
					    "a number",	 "true",     "false",	 "null"};
	return v ? kinds[json_typeof(v)] : "missing";
}

/* o[key] as an integer in [min, max]; `field` names it in messages. */
static int
get_int(const struct zinf_ckpt *c, const json_t *o, const char *key, const char *field, int64_t min,
	int64_t max, int64_t *out)
{
	const json_t *v = json_object_get(o, key);
	if (!json_is_integer(v)) {
		return bad(c, field, "expected an integer, found %s", kind_of(v));
	}
	json_int_t x = json_integer_value(v);
	if (x < min || x > max) {
		return bad(c, field, "%lld out of range [%" PRId64 ", %" PRId64 "]", (long long)x,
			   min, max);
	}
	*out = x;
	return 0;
}

static int
get_str(const struct zinf_ckpt *c, const json_t *o, const char *key, const char *field,
	const char **out)
{
	const json_t *v = json_object_get(o, key);
	if (!json_is_string(v)) {
		return bad(c, field, "expected a string, found %s", kind_of(v));
	}
	*out = json_string_value(v);
	return 0;
}

static int
get_dtype(const struct zinf_ckpt *c, const json_t *o, const char *key, const char *field,
	  enum zinf_dtype *out)
{
	const char *s = NULL;
	int rc = get_str(c, o, key, field, &s);
	if (rc) {
		return rc;
	}
	if (zinf_dtype_parse(s, out) < 0) {
		return bad(c, field, "\"%s\" is not a dtype (f32, f16, bf16)", s);
	}
	return 0;
}

/* A present key's type: number (integer or real), boolean, object or string. */
static int
check_type(const struct zinf_ckpt *c, const json_t *o, const char *key, const char *field, int want,
	   bool required)
{
	const json_t *v = json_object_get(o, key);
	if (!v && !required) {
		return 0;
	}
	bool ok = want == JSON_REAL	? json_is_number(v)
		  : want == JSON_TRUE	? json_is_boolean(v)
		  : want == JSON_OBJECT ? json_is_object(v)
		  : want == JSON_STRING ? json_is_string(v)
					: false;
	if (!ok) {
		const char *w = want == JSON_REAL     ? "a number"
				: want == JSON_TRUE   ? "a boolean"
				: want == JSON_OBJECT ? "an object"
						      : "a string";
		return bad(c, field, "expected %s, found %s", w, kind_of(v));
	}
	return 0;
}

/* A name usable as a file name's part: [A-Za-z0-9_-]{1,64}. */
static bool
safe_word(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > 64) {
		return false;
	}
	for (size_t i = 0; i < n; i++) {
		char ch = s[i];
		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || ch == '_' || ch == '-')) {
			return false;
		}
	}
	return true;
}

/* A file name in the TAG directory: no '/', not hidden, not "." or "..". */
static bool
safe_file_name(const char *s)
{
	size_t n = strlen(s);
	return n > 0 && n < 256 && s[0] != '.' && !strchr(s, '/');
}

static bool
valid_tag(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > ZINF_CKPT_MAX_TAG || s[0] == '.') {
		return false;
	}
	for (size_t i = 0; i < n; i++) {
		char ch = s[i];
		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		      (ch >= '0' && ch <= '9') || ch == '_' || ch == '-' || ch == '.')) {
			return false;
		}
	}
	return true;
}

static int
parse_header(struct zinf_ckpt *c)
{
	const json_t *m = c->m;
	const char *s = NULL;
	int64_t v;
	int rc;
	if ((rc = get_str(c, m, "format", "format", &s))) {
		return rc;
	}
	if (strcmp(s, CKPT_FORMAT) != 0) {
		return bad(c, "format", "\"%s\", expected \"" CKPT_FORMAT "\"", s);
	}
	if ((rc = get_int(c, m, "version", "version", 0, INT64_MAX, &v))) {
		return rc;
	}
	if (v != ZINF_CKPT_VERSION) {
		return bad(c, "version", "%" PRId64 ": this library reads version %d only", v,
			   ZINF_CKPT_VERSION);
	}
	if ((rc = get_str(c, m, "tag", "tag", &c->tag))) {
		return rc;
	}
	if ((rc = check_type(c, m, "created", "created", JSON_STRING, false)) ||
	    (rc = check_type(c, m, "options", "options", JSON_OBJECT, false))) {
		return rc;
	}
	if ((rc = get_int(c, m, "world", "world", 1, CKPT_MAX_WORLD, &v))) {
		return rc;
	}
	c->world = (int32_t)v;
	if ((rc = get_int(c, m, "files_world", "files_world", 1, c->world, &v))) {
		return rc;
	}
	c->files_world = (int32_t)v;
	if ((rc = get_int(c, m, "stage", "stage", 0, 3, &v))) {
		return rc;
	}
	c->stage = (int32_t)v;
	if (c->files_world != 1 && c->files_world != c->world) {
		return bad(c, "files_world", "%d: expected 1 or the world (%d)", c->files_world,
			   c->world);
	}
	if ((rc = get_dtype(c, m, "dtype", "dtype", &c->dtype))) {
		return rc;
	}
	if ((rc = get_int(c, m, "steps", "steps", 0, CKPT_MAX_COUNT, &c->steps))) {
		return rc;
	}
	if ((rc = get_int(c, m, "micro_steps", "micro_steps", 0, CKPT_MAX_COUNT, &v))) {
		return rc;
	}
	c->micro_steps = (uint64_t)v;
	if ((rc = get_int(c, m, "skipped_steps", "skipped_steps", 0, CKPT_MAX_COUNT, &v)) ||
	    (rc = check_type(c, m, "lr", "lr", JSON_REAL, true))) {
		return rc;
	}
	const json_t *ls = json_object_get(m, "loss_scaler");
	if ((rc = check_type(c, m, "loss_scaler", "loss_scaler", JSON_OBJECT, true)) ||
	    (rc = check_type(c, ls, "scale", "loss_scaler.scale", JSON_REAL, true)) ||
	    (rc = get_int(c, ls, "good_steps", "loss_scaler.good_steps", 0, INT64_MAX, &v)) ||
	    (rc = get_int(c, ls, "hysteresis_left", "loss_scaler.hysteresis_left", 0, UINT32_MAX,
			  &v)) ||
	    (rc = get_int(c, ls, "overflows", "loss_scaler.overflows", 0, CKPT_MAX_COUNT, &v))) {
		return rc;
	}
	/* DeepSpeed's DynamicLossScaler counters and zinf_engine_set_betas's values, where present
	 */
	if ((json_object_get(ls, "iter") &&
	     (rc = get_int(c, ls, "iter", "loss_scaler.iter", 0, INT64_MAX, &v))) ||
	    (json_object_get(ls, "last_overflow") &&
	     (rc = get_int(c, ls, "last_overflow", "loss_scaler.last_overflow", -1, INT64_MAX,
			   &v)))) {
		return rc;
	}
	const json_t *betas = json_object_get(m, "betas");
	if (betas && (!json_is_array(betas) || json_array_size(betas) != 2 ||
		      !json_is_number(json_array_get(betas, 0)) ||
		      !json_is_number(json_array_get(betas, 1)))) {
		return bad(c, "betas", "expected an array of 2 numbers, found %s",
			   json_is_array(betas) ? "another array" : kind_of(betas));
	}
	const json_t *op = json_object_get(m, "optimizer");
	enum zinf_dtype sd;
	if ((rc = check_type(c, m, "optimizer", "optimizer", JSON_OBJECT, true)) ||
	    (rc = get_str(c, op, "kind", "optimizer.kind", &c->optimizer)) ||
	    (rc = get_dtype(c, op, "state_dtype", "optimizer.state_dtype", &sd))) {
		return rc;
	}
	static const char *const nums[] = {"lr",  "beta1",	  "beta2",
					   "eps", "weight_decay", "lr_decay"};
	char field[64];
	for (size_t i = 0; i < ZINF_ARRAY_SIZE(nums); i++) {
		snprintf(field, sizeof(field), "optimizer.%s", nums[i]);
		if ((rc = check_type(c, op, nums[i], field, JSON_REAL, false))) {
			return rc;
		}
	}
	if ((rc = check_type(c, op, "bias_correction", "optimizer.bias_correction", JSON_TRUE,
			     false))) {
		return rc;
	}
	return 0;
}

static int
parse_parts(struct zinf_ckpt *c)
{
	const json_t *a = json_object_get(c->m, "parts");
	if (!json_is_array(a)) {
		return bad(c, "parts", "expected an array, found %s", kind_of(a));
	}
	size_t n = json_array_size(a);
	if (n < 1 || n > CKPT_MAX_PARTS) {
		return bad(c, "parts", "%zu entries, expected 1 to %d", n, CKPT_MAX_PARTS);
	}
	c->parts = zc_calloc(n, sizeof(*c->parts));
	if (!c->parts) {
		return -ENOMEM;
	}
	c->n_parts = (uint32_t)n;
	char field[64];
	for (size_t i = 0; i < n; i++) {
		const json_t *p = json_array_get(a, i);
		int rc;
		const char *name = NULL;
		snprintf(field, sizeof(field), "parts[%zu]", i);
		if (!json_is_object(p)) {
			return bad(c, field, "expected an object, found %s", kind_of(p));
		}
		snprintf(field, sizeof(field), "parts[%zu].name", i);
		if ((rc = get_str(c, p, "name", field, &name))) {
			return rc;
		}
		if (!safe_word(name)) {
			return bad(c, field, "\"%s\": not a part name ([A-Za-z0-9_-], 1-64 bytes)",
				   name);
		}
		for (size_t j = 0; j < i; j++) {
			if (strcmp(c->parts[j].name, name) == 0) {
				return bad(c, field, "\"%s\" listed twice", name);
			}
		}
		c->parts[i].name = (char *)name; /* borrowed from the manifest */
		snprintf(field, sizeof(field), "parts[%zu].dtype", i);
		if ((rc = get_dtype(c, p, "dtype", field, &c->parts[i].dtype))) {
			return rc;
		}
	}
	if (strcmp(c->parts[0].name, "fp32") != 0 || c->parts[0].dtype != ZINF_F32) {
		return bad(c, "parts[0]", "\"%s\" (%s): expected the master, \"fp32\" (f32)",
			   c->parts[0].name, zinf_dtype_name(c->parts[0].dtype));
	}
	return 0;
}

static int
parse_ranks(struct zinf_ckpt *c)
{
	const json_t *a = json_object_get(c->m, "ranks");
	if (!json_is_array(a)) {
		return bad(c, "ranks", "expected an array, found %s", kind_of(a));
	}
	size_t n = json_array_size(a);
	if (n != (size_t)c->files_world) {
		return bad(c, "ranks", "%zu entries, expected files_world (%d)", n, c->files_world);
	}
	c->flat = zc_calloc(n, sizeof(*c->flat));
	if (!c->flat) {
		return -ENOMEM;
	}
	char field[64];
	for (size_t r = 0; r < n; r++) {
		const json_t *e = json_array_get(a, r);
		int64_t v;
		int rc;
		snprintf(field, sizeof(field), "ranks[%zu]", r);
		if (!json_is_object(e)) {
			return bad(c, field, "expected an object, found %s", kind_of(e));
		}
		snprintf(field, sizeof(field), "ranks[%zu].rank", r);
		if ((rc = get_int(c, e, "rank", field, 0, INT64_MAX, &v))) {
			return rc;
		}
		if (v != (int64_t)r) {
			return bad(c, field, "%" PRId64 ", expected %zu (ranks in order)", v, r);
		}
		snprintf(field, sizeof(field), "ranks[%zu].flat", r);
		/* bytes of a file fit an off_t */
		if ((rc = get_int(c, e, "flat", field, 0, INT64_MAX / 8, &v))) {
			return rc;
		}
		c->flat[r] = (uint64_t)v;
	}
	return 0;
}

/* len bytes, 8-aligned, in the handle's chunks (names and shapes; freed by zinf_ckpt_close). */
static void *
chunk_alloc(struct zinf_ckpt *c, size_t len)
{
	struct name_chunk *k = c->names;
	len = ZINF_ALIGN_UP(len, 8);
	if (!k || k->cap - k->used < len) {
		size_t cap = ZINF_MAX(len, (size_t)CKPT_NAME_CHUNK);
		k = zc_malloc(sizeof(*k) + cap);
		if (!k) {
			return NULL;
		}
		k->next = c->names;
		k->used = 0;
		k->cap = cap;
		c->names = k;
	}
	void *p = k->data + k->used;
	k->used += len;
	return p;
}

static char *
name_copy(struct zinf_ckpt *c, const char *s)
{
	size_t n = strlen(s) + 1;
	char *p = chunk_alloc(c, n);
	if (p) {
		memcpy(p, s, n);
	}
	return p;
}

static int
parse_shape(struct zinf_ckpt *c, const json_t *p, size_t i, struct ckpt_param *q)
{
	char field[96];
	snprintf(field, sizeof(field), "params[%zu].shape", i);
	const json_t *s = json_object_get(p, "shape");
	q->ndim = 1;
	q->shape = NULL;
	if (!s) {
		return 0;
	}
	if (!json_is_array(s)) {
		return bad(c, field, "expected an array, found %s", kind_of(s));
	}
	size_t n = json_array_size(s);
	if (n < 1 || n > ZINF_CKPT_MAX_DIMS) {
		return bad(c, field, "%zu dimensions, expected 1 to %d", n, ZINF_CKPT_MAX_DIMS);
	}
	uint64_t prod = 1, dims[ZINF_CKPT_MAX_DIMS];
	for (size_t d = 0; d < n; d++) {
		const json_t *v = json_array_get(s, d);
		if (!json_is_integer(v) || json_integer_value(v) < 1) {
			return bad(c, field, "dimension %zu: expected an integer >= 1, found %s", d,
				   json_is_integer(v) ? "a smaller one" : kind_of(v));
		}
		uint64_t x = (uint64_t)json_integer_value(v);
		if (prod > UINT64_MAX / x) {
			return bad(c, field, "the product overflows");
		}
		prod *= x;
		dims[d] = x;
	}
	if (prod != q->numel) {
		return bad(c, field, "its product %" PRIu64 " differs from numel %" PRIu64, prod,
			   q->numel);
	}
	if (n > 1) {
		if (!(q->shape = chunk_alloc(c, n * sizeof(*dims)))) {
			return -ENOMEM;
		}
		memcpy(q->shape, dims, n * sizeof(*dims));
		q->ndim = (uint32_t)n;
	}
	return 0;
}

/* ---- manifest.json's text --------------------------------------------------------------- */

/* "<manifest>: line L column C: what" for byte `at` of the text; -EBADMSG. */
static int
syntax(const struct zinf_ckpt *c, size_t at, const char *what)
{
	const struct mtext *t = c->mt;
	size_t line = 1, col = 1;
	for (size_t k = 0; k < at && k < t->len; k++) {
		if (t->s[k] == '\n') {
			line++;
			col = 1;
		} else {
			col++;
		}
	}
	return ZINF_OBJ_FAIL(c->mpath, -EBADMSG, "line %zu column %zu: %s", line, col, what);
}

static void
skip_ws(const struct mtext *t, size_t *pos)
{
	size_t k = *pos;
	while (k < t->len &&
	       (t->s[k] == ' ' || t->s[k] == '\t' || t->s[k] == '\n' || t->s[k] == '\r')) {
		k++;
	}
	*pos = k;
}

/* One JSON value of any type at *pos (jansson; duplicate keys refused), *pos moved past it. */
static int
take_value(const struct zinf_ckpt *c, size_t *pos, json_t **out)
{
	const struct mtext *t = c->mt;
	json_error_t jerr;
	json_t *v = json_loadb(t->s + *pos, t->len - *pos,
			       JSON_DECODE_ANY | JSON_DISABLE_EOF_CHECK | JSON_REJECT_DUPLICATES,
			       &jerr);
	if (!v) {
		return syntax(c, *pos + (size_t)jerr.position, jerr.text);
	}
	*pos += (size_t)jerr.position;
	*out = v;
	return 0;
}

/* The array at *pos ('['): *pos moved past its ']', its elements counted (commas at its own
 * depth, strings and their escapes skipped). Only the brackets are followed here; each element
 * is parsed, and its syntax checked, when it is read (parse_params). */
static int
skip_array(const struct zinf_ckpt *c, size_t *pos, size_t *count)
{
	const struct mtext *t = c->mt;
	size_t k = *pos + 1, depth = 1, commas = 0;
	bool empty = true;
	for (; k < t->len && depth > 0; k++) {
		char ch = t->s[k];
		if (ch == '"') {
			for (k++; k < t->len && t->s[k] != '"'; k++) {
				k += t->s[k] == '\\';
			}
			if (k >= t->len) {
				break;
			}
			empty = false;
		} else if (ch == '[' || ch == '{') {
			depth++;
			empty = false;
		} else if (ch == ']' || ch == '}') {
			depth--;
		} else if (ch == ',' && depth == 1) {
			commas++;
		} else if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r') {
			empty = false;
		}
	}
	if (depth > 0) {
		return syntax(c, t->len, "params: the array does not end");
	}
	*count = empty ? 0 : commas + 1;
	*pos = k;
	return 0;
}

/*
 * The top-level object into c->m, one member at a time, except "params" (an array: skipped and
 * counted here, read element by element by parse_params). Duplicate keys and text after the
 * object are refused, as json_loadb with JSON_REJECT_DUPLICATES refuses them.
 */
static int
scan_manifest(struct zinf_ckpt *c)
{
	struct mtext *t = c->mt;
	size_t pos = 0;
	skip_ws(t, &pos);
	if (pos >= t->len || t->s[pos] != '{') {
		char ch = pos < t->len ? t->s[pos] : '\0';
		return ZINF_OBJ_FAIL(c->mpath, -EBADMSG, "expected a JSON object, found %s",
				     ch == '['	 ? "an array"
				     : ch == '"' ? "a string"
				     : !ch	 ? "nothing"
						 : "another value");
	}
	if (!(c->m = json_object())) {
		return -ENOMEM;
	}
	pos++;
	skip_ws(t, &pos);
	bool more = pos >= t->len || t->s[pos] != '}';
	pos += !more;
	while (more) {
		skip_ws(t, &pos);
		size_t at = pos;
		json_t *k = NULL, *v = NULL;
		if (pos >= t->len || t->s[pos] != '"') {
			return syntax(c, pos, "expected a key (a string)");
		}
		int rc = take_value(c, &pos, &k);
		if (rc) {
			return rc;
		}
		const char *key = json_string_value(k);
		bool params = strcmp(key, "params") == 0;
		skip_ws(t, &pos);
		if (json_object_get(c->m, key) || (params && t->params_seen)) {
			char msg[96];
			snprintf(msg, sizeof(msg), "duplicate object key \"%.60s\"", key);
			json_decref(k);
			return syntax(c, at, msg);
		}
		if (pos >= t->len || t->s[pos] != ':') {
			json_decref(k);
			return syntax(c, pos, "expected ':'");
		}
		pos++;
		skip_ws(t, &pos);
		if (params && pos < t->len && t->s[pos] == '[') {
			t->params_at = pos;
			rc = skip_array(c, &pos, &t->params_n);
			t->params_len = pos - t->params_at;
		} else {
			rc = take_value(c, &pos, &v);
			if (!rc && json_object_set_new(c->m, key, v)) {
				rc = -ENOMEM;
			}
		}
		t->params_seen = t->params_seen || params;
		json_decref(k);
		if (rc) {
			return rc;
		}
		skip_ws(t, &pos);
		if (pos < t->len && (t->s[pos] == ',' || t->s[pos] == '}')) {
			more = t->s[pos++] == ',';
		} else {
			return syntax(c, pos, "expected ',' or '}'");
		}
	}
	skip_ws(t, &pos);
	return pos == t->len ? 0 : syntax(c, pos, "end of file expected");
}

/* ---- parameters --------------------------------------------------------------------------- */

/* params[i] (its JSON) checked into q; q->flat_off points at its files_world entries. */
static int
parse_param(struct zinf_ckpt *c, const json_t *p, size_t i, struct ckpt_param *q)
{
	char field[96];
	size_t W = (size_t)c->files_world;
	const char *name = NULL;
	int64_t v;
	int rc;
	snprintf(field, sizeof(field), "params[%zu]", i);
	if (!json_is_object(p)) {
		return bad(c, field, "expected an object, found %s", kind_of(p));
	}
	snprintf(field, sizeof(field), "params[%zu].name", i);
	if ((rc = get_str(c, p, "name", field, &name))) {
		return rc;
	}
	if (!name[0]) {
		return bad(c, field, "empty");
	}
	if (!(q->name = name_copy(c, name))) {
		return -ENOMEM;
	}
	snprintf(field, sizeof(field), "params[%zu].numel", i);
	if ((rc = get_int(c, p, "numel", field, 1, INT64_MAX / 8, &v))) {
		return rc;
	}
	q->numel = (uint64_t)v;
	snprintf(field, sizeof(field), "params[%zu].layer", i);
	if ((rc = get_int(c, p, "layer", field, 0, INT32_MAX, &v))) {
		return rc;
	}
	q->layer = (int32_t)v;
	if ((rc = parse_shape(c, p, i, q))) {
		return rc;
	}
	snprintf(field, sizeof(field), "params[%zu].part", i);
	if ((rc = get_int(c, p, "part", field, 0, INT64_MAX / 8, &v))) {
		return rc;
	}
	q->part = (uint64_t)v;
	uint64_t want = ZINF_DIV_ROUND_UP(q->numel, (uint64_t)W);
	if (q->part != want) {
		return bad(c, field,
			   "\"%s\": %" PRIu64 ", expected ceil(numel %" PRIu64
			   " / files_world %zu) = %" PRIu64,
			   name, q->part, q->numel, W, want);
	}
	snprintf(field, sizeof(field), "params[%zu].flat_off", i);
	const json_t *fo = json_object_get(p, "flat_off");
	if (!json_is_array(fo) || json_array_size(fo) != W) {
		return json_is_array(fo)
			       ? bad(c, field, "\"%s\": %zu entries, expected files_world (%zu)",
				     name, json_array_size(fo), W)
			       : bad(c, field, "expected an array, found %s", kind_of(fo));
	}
	for (size_t r = 0; r < W; r++) {
		const json_t *x = json_array_get(fo, r);
		if (!json_is_integer(x) || json_integer_value(x) < 0) {
			return bad(c, field, "\"%s\": rank %zu: expected an integer >= 0, found %s",
				   name, r, json_is_integer(x) ? "a negative one" : kind_of(x));
		}
		uint64_t off = (uint64_t)json_integer_value(x);
		if (off > c->flat[r] || q->part > c->flat[r] - off) {
			return bad(c, field,
				   "\"%s\": rank %zu: partition [%" PRIu64 ", %" PRIu64
				   ") past the rank's flat %" PRIu64,
				   name, r, off, off + q->part, c->flat[r]);
		}
		q->flat_off[r] = off;
	}
	return 0;
}

static int
name_cmp(const void *a, const void *b, void *ctx)
{
	const struct ckpt_param *p = ctx;
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	int d = strcmp(p[x].name, p[y].name);
	return d ? d : (x > y) - (x < y);
}

/* Names are unique: sorted, equal neighbours. The first entry (in the manifest's order) that
 * repeats an earlier one is named. */
static int
check_names_unique(struct zinf_ckpt *c)
{
	uint32_t n = c->n_params, *ix = zc_calloc(n ? n : 1, sizeof(*ix));
	if (!ix) {
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++) {
		ix[i] = i;
	}
	qsort_r(ix, n, sizeof(*ix), name_cmp, c->params);
	uint32_t dup = UINT32_MAX;
	for (uint32_t k = 1; k < n; k++) {
		if (strcmp(c->params[ix[k]].name, c->params[ix[k - 1]].name) == 0 && ix[k] < dup) {
			dup = ix[k];
		}
	}
	zc_free(ix);
	if (dup == UINT32_MAX) {
		return 0;
	}
	char field[64];
	snprintf(field, sizeof(field), "params[%u].name", dup);
	return bad(c, field, "\"%s\" listed twice", c->params[dup].name);
}

/*
 * The shortest text of a valid element of "params" over W stored ranks:
 * {"name":"a","numel":1,"layer":0,"part":1,"flat_off":[0]} (56 bytes; every key but "shape" is
 * required, none may repeat) and ",0" per stored rank past the first.
 */
#define CKPT_PARAM_MIN_TEXT(W) (56 + 2 * ((W)-1))

/*
 * "params", read element by element from the manifest's text (each element a small tree, freed
 * once checked): memory grows with the parameters' names and offsets, not with jansson's trees.
 * Its count (from the commas skip_array saw) is bounded before anything is allocated for it: by
 * its text (n elements of at least CKPT_PARAM_MIN_TEXT bytes and n - 1 commas), so that the
 * parameter table (48 + 8 W bytes an element) stays within 4 times the text; and by what the
 * ranks' files can hold (every parameter takes at least one element of each).
 */
static int
parse_params(struct zinf_ckpt *c)
{
	const struct mtext *t = c->mt;
	if (!t->params_seen || json_object_get(c->m, "params")) { /* missing, or not an array */
		const json_t *a = json_object_get(c->m, "params");
		return bad(c, "params", "expected an array, found %s", kind_of(a));
	}
	size_t n = t->params_n, W = (size_t)c->files_world;
	size_t text = t->params_len - 2, least = CKPT_PARAM_MIN_TEXT(W); /* within [ and ] */
	if (n && n > (text + 1) / (least + 1)) {
		return bad(
			c, "params",
			"%zu entries in %zu bytes, but an entry takes at least %zu (name, numel, "
			"layer, part and %zu flat_off): not a list of parameters",
			n, text, least, W);
	}
	for (size_t r = 0; r < W; r++) {
		if (n > c->flat[r]) {
			return bad(c, "params",
				   "%zu entries, but rank %zu's files hold %" PRIu64
				   " elements (ranks[%zu].flat; r%05zu.fp32: %" PRIu64
				   " bytes): every parameter takes at least one element of every "
				   "stored rank",
				   n, r, c->flat[r], r, r, c->flat[r] * 4);
		}
	}
	if (n > UINT32_MAX || (n && W > SIZE_MAX / sizeof(uint64_t) / n)) {
		return bad(c, "params", "%zu entries: too many", n);
	}
	c->params = zc_calloc(n ? n : 1, sizeof(*c->params));
	c->offs = zc_calloc(n ? n * W : 1, sizeof(*c->offs));
	if (!c->params || !c->offs) {
		return -ENOMEM;
	}
	c->n_params = (uint32_t)n;
	size_t pos = t->params_at + 1, i = 0;
	int rc = 0;
	skip_ws(t, &pos);
	bool more = pos < t->len && t->s[pos] != ']';
	while (more && !rc) {
		json_t *p = NULL;
		if ((rc = take_value(c, &pos, &p))) {
			return rc;
		}
		if (i >= n) { /* the count skip_array made: the same text, so never */
			json_decref(p);
			return syntax(c, pos, "more parameters than counted");
		}
		c->params[i].flat_off = c->offs + i * W;
		rc = parse_param(c, p, i, &c->params[i]);
		json_decref(p);
		i++;
		skip_ws(t, &pos);
		if (!rc && pos < t->len && t->s[pos] == ',') {
			pos++;
		} else if (!rc && (pos >= t->len || t->s[pos] != ']')) {
			return syntax(c, pos, "expected ',' or ']' after an element of params");
		} else {
			more = false;
		}
	}
	if (!rc && i != n) {
		return syntax(c, pos, "fewer parameters than counted");
	}
	return rc ? rc : check_names_unique(c);
}

struct tile {
	uint64_t off; /* element offset in the rank's files */
	uint32_t i;   /* parameter index */
};

static int
tile_cmp(const void *a, const void *b)
{
	const struct tile *x = a, *y = b;
	return x->off < y->off ? -1 : x->off > y->off ? 1 : (x->i > y->i) - (x->i < y->i);
}

/* "rank 1 (r00001.fp32, r00001.exp_avg)": the files a rank's offsets index. */
static void
rank_files(const struct zinf_ckpt *c, size_t r, char *buf, size_t len)
{
	size_t at = (size_t)snprintf(buf, len, "rank %zu (", r);
	for (uint32_t p = 0; p < c->n_parts && at < len; p++) {
		at += (size_t)snprintf(buf + at, len - at, "%sr%05zu.%s", p ? ", " : "", r,
				       c->parts[p].name);
	}
	if (at < len) {
		snprintf(buf + at, len - at, ")");
	}
}

/*
 * Every stored rank's partitions tile its files exactly: sorted by flat_off[r], each starts
 * where the previous ends, the first at 0, the last ends at ranks[r].flat (the files' size).
 * An overlap would make two parameters share state (a load trains on the wrong values); a gap
 * holds state of no parameter. A refusal names both parameters, the rank and its files.
 */
static int
check_tiling(struct zinf_ckpt *c)
{
	size_t n = c->n_params, W = (size_t)c->files_world;
	struct tile *t = zc_calloc(n ? n : 1, sizeof(*t));
	if (!t) {
		return -ENOMEM;
	}
	int rc = 0;
	char field[96], where[64 + CKPT_MAX_PARTS * 80];
	for (size_t r = 0; r < W && !rc; r++) {
		for (size_t i = 0; i < n; i++) {
			t[i] = (struct tile){c->params[i].flat_off[r], (uint32_t)i};
		}
		qsort(t, n, sizeof(*t), tile_cmp);
		uint64_t end = 0; /* where the partitions so far end */
		for (size_t k = 0; k < n && !rc; k++) {
			const struct ckpt_param *q = &c->params[t[k].i];
			if (t[k].off == end) {
				end += q->part;
				continue;
			}
			rank_files(c, r, where, sizeof(where));
			snprintf(field, sizeof(field), "params[%u].flat_off", t[k].i);
			if (k == 0) {
				rc = bad(c, field,
					 "%s: \"%s\" starts at %" PRIu64 ": elements [0, %" PRIu64
					 ") belong to no parameter",
					 where, q->name, t[k].off, t[k].off);
				break;
			}
			const struct ckpt_param *pq = &c->params[t[k - 1].i];
			uint64_t pb = t[k - 1].off;
			rc = t[k].off < end
				     ? bad(c, field,
					   "%s: \"%s\" [%" PRIu64 ", %" PRIu64
					   ") overlaps \"%s\" (params[%u]) [%" PRIu64 ", %" PRIu64
					   "): two parameters would share state",
					   where, q->name, t[k].off, t[k].off + q->part, pq->name,
					   t[k - 1].i, pb, end)
				     : bad(c, field,
					   "%s: elements [%" PRIu64 ", %" PRIu64
					   ") between \"%s\" (params[%u]) and \"%s\" belong to no "
					   "parameter",
					   where, end, t[k].off, pq->name, t[k - 1].i, q->name);
		}
		if (!rc && end != c->flat[r]) {
			rank_files(c, r, where, sizeof(where));
			snprintf(field, sizeof(field), "ranks[%zu].flat", r);
			rc = n ? bad(c, field,
				     "%s: %" PRIu64 " elements, the partitions end at %" PRIu64
				     " (\"%s\", params[%u]): [%" PRIu64 ", %" PRIu64
				     ") belong to no parameter",
				     where, c->flat[r], end, c->params[t[n - 1].i].name, t[n - 1].i,
				     end, c->flat[r])
			       : bad(c, field, "%s: %" PRIu64 " elements but no parameter", where,
				     c->flat[r]);
		}
	}
	zc_free(t);
	return rc;
}

static int
parse_files(struct zinf_ckpt *c)
{
	const json_t *a = json_object_get(c->m, "files");
	if (!json_is_array(a)) {
		return bad(c, "files", "expected an array, found %s", kind_of(a));
	}
	size_t n = json_array_size(a);
	if (n > UINT32_MAX) {
		return bad(c, "files", "%zu entries: too many", n);
	}
	c->files = zc_calloc(n ? n : 1, sizeof(*c->files));
	if (!c->files) {
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		c->files[i].fd = -1;
	}
	c->n_files = (uint32_t)n;
	c->file_index = json_object();
	if (!c->file_index) {
		return -ENOMEM;
	}
	char field[64];
	for (size_t i = 0; i < n; i++) {
		const json_t *f = json_array_get(a, i);
		struct ckpt_file *q = &c->files[i];
		const char *name = NULL;
		int64_t v;
		int rc;
		snprintf(field, sizeof(field), "files[%zu]", i);
		if (!json_is_object(f)) {
			return bad(c, field, "expected an object, found %s", kind_of(f));
		}
		snprintf(field, sizeof(field), "files[%zu].name", i);
		if ((rc = get_str(c, f, "name", field, &name))) {
			return rc;
		}
		if (!safe_file_name(name)) {
			return bad(c, field, "\"%s\": not a plain file name", name);
		}
		if (json_object_get(c->file_index, name)) {
			return bad(c, field, "\"%s\" listed twice", name);
		}
		if (json_object_set_new(c->file_index, name, json_integer((json_int_t)i))) {
			return -ENOMEM;
		}
		q->name = (char *)name; /* borrowed from the manifest */
		snprintf(field, sizeof(field), "files[%zu].bytes", i);
		if ((rc = get_int(c, f, "bytes", field, 0, INT64_MAX, &v))) {
			return rc;
		}
		q->bytes = (uint64_t)v;
		snprintf(field, sizeof(field), "files[%zu].crc32c", i);
		if ((rc = get_int(c, f, "crc32c", field, 0, UINT32_MAX, &v))) {
			return rc;
		}
		q->crc32c = (uint32_t)v;
		c->bytes += q->bytes;
	}
	return 0;
}

int
ckpt_file_find(const struct zinf_ckpt *c, const char *name)
{
	const json_t *v = json_object_get(c->file_index, name);
	return v ? (int)json_integer_value(v) : -ENOENT;
}

/* The rank files each part needs, listed with the size flat * elem_bytes; client.bin and the
 * safetensors file listed when the manifest names them. */
static int
check_listed(struct zinf_ckpt *c)
{
	size_t W = (size_t)c->files_world;
	c->rank_file = zc_calloc(W * c->n_parts, sizeof(*c->rank_file));
	if (!c->rank_file) {
		return -ENOMEM;
	}
	char name[128];
	for (size_t r = 0; r < W; r++) {
		for (uint32_t p = 0; p < c->n_parts; p++) {
			snprintf(name, sizeof(name), "r%05zu.%s", r, c->parts[p].name);
			int k = ckpt_file_find(c, name);
			if (k < 0) {
				return bad(c, "files", "%s (rank %zu's part \"%s\") not listed",
					   name, r, c->parts[p].name);
			}
			uint64_t want = c->flat[r] * zinf_dtype_size(c->parts[p].dtype);
			if (c->files[k].bytes != want) {
				return bad(c, "files",
					   "%s: %" PRIu64 " bytes listed, expected flat %" PRIu64
					   " x %zu = %" PRIu64,
					   name, c->files[k].bytes, c->flat[r],
					   zinf_dtype_size(c->parts[p].dtype), want);
			}
			c->rank_file[r * c->n_parts + p] = (uint32_t)k;
		}
	}
	int64_t cb;
	int rc = get_int(c, c->m, "client_bytes", "client_bytes", 0, INT64_MAX, &cb);
	if (rc) {
		return rc;
	}
	if (cb > 0) {
		int k = ckpt_file_find(c, "client.bin");
		if (k < 0) {
			return bad(c, "client_bytes", "%" PRId64 " but client.bin is not listed",
				   cb);
		}
		if (c->files[k].bytes != (uint64_t)cb) {
			return bad(c, "client_bytes",
				   "%" PRId64 ", but client.bin is listed with %" PRIu64 " bytes",
				   cb, c->files[k].bytes);
		}
	}
	const json_t *st = json_object_get(c->m, "safetensors");
	if (st) {
		const char *s = NULL;
		if ((rc = get_str(c, c->m, "safetensors", "safetensors", &s))) {
			return rc;
		}
		if (ckpt_file_find(c, s) < 0) {
			return bad(c, "safetensors", "\"%s\" is not listed in files", s);
		}
	}
	return 0;
}

int
ckpt_path(const struct zinf_ckpt *c, const char *name, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%s/%s", c->path, name);
	return n < 0 || (size_t)n >= len ? -ENAMETOOLONG : 0;
}

/* Every listed file exists, is a regular file and has its listed size. */
static int
check_files_present(struct zinf_ckpt *c)
{
	char path[4352];
	for (uint32_t i = 0; i < c->n_files; i++) {
		struct ckpt_file *f = &c->files[i];
		if (ckpt_path(c, f->name, path, sizeof(path))) {
			return ZINF_OBJ_FAIL(c->path, -ENAMETOOLONG, "%s: path too long", f->name);
		}
		struct stat st;
		if (fstatat(c->dirfd, f->name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			int e = errno;
			if (e == ENOENT) {
				return ZINF_OBJ_FAIL(path, -EBADMSG,
						     "listed in manifest.json but missing");
			}
			return ZINF_OBJ_FAIL(path, -e, "stat: %s", strerror(e));
		}
		if (S_ISLNK(st.st_mode)) {
			return ZINF_OBJ_FAIL(path, -EBADMSG,
					     "a symbolic link, not followed: a checkpoint's files "
					     "are its own, in its directory");
		}
		if (!S_ISREG(st.st_mode)) {
			return ZINF_OBJ_FAIL(path, -EBADMSG, "not a regular file");
		}
		if ((uint64_t)st.st_size != f->bytes) {
			return ZINF_OBJ_FAIL(
				path, -EBADMSG, "%jd bytes, manifest.json lists %" PRIu64 " (%s)",
				(intmax_t)st.st_size, f->bytes,
				(uint64_t)st.st_size < f->bytes ? "truncated" : "longer");
		}
	}
	return 0;
}

/* ---- opening ------------------------------------------------------------------------------ */

/* A failed ckpt_open_in (fd < 0) said: what it leaves unsaid logged on `path` (missing: the
 * error `enoent` with `missing`; out of descriptors). Returns the error. */
static int
open_failed(int fd, const char *path, int enoent, const char *missing)
{
	if (fd == -ENOENT) {
		return ZINF_OBJ_FAIL(path, enoent, "%s", missing);
	}
	if (fd == -EMFILE || fd == -ENFILE) {
		return ZINF_OBJ_FAIL(path, fd, "open: %s", strerror(-fd));
	}
	return fd; /* said by ckpt_open_in */
}

/* DIR/latest's tag into tag (ZINF_CKPT_MAX_TAG + 1 bytes); ddir is DIR open. */
static int
read_latest(int ddir, const char *dir, char *tag)
{
	char *lp = ckpt_join_alloc(dir, "latest");
	if (!lp) {
		return -ENOMEM;
	}
	int rc = 0;
	int fd = ckpt_open_in(ddir, dir, "latest", false, NULL);
	if (fd < 0) {
		rc = fd == -ENOENT
			     ? ZINF_OBJ_FAIL(dir, -ENOENT,
					     "no checkpoint: neither latest nor manifest.json")
			     : open_failed(fd, lp, -ENOENT, "missing");
		goto out;
	}
	char line[ZINF_CKPT_MAX_TAG + 8];
	ssize_t n = read(fd, line, sizeof(line) - 1);
	int e = errno;
	close(fd);
	if (n < 0) {
		rc = ZINF_OBJ_FAIL(lp, -e, "read: %s", strerror(e));
		goto out;
	}
	line[n] = '\0';
	while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ')) {
		line[--n] = '\0';
	}
	if (!valid_tag(line) || strlen(line) != (size_t)n) {
		rc = ZINF_OBJ_FAIL(lp, -EBADMSG, "\"%.40s\" is not a tag", line);
		goto out;
	}
	memcpy(tag, line, (size_t)n + 1);
out:
	zc_free(lp);
	return rc;
}

bool
ckpt_rank_file_name(const char *s)
{
	/* each byte looked at only once the ones before it are known not to be the NUL */
	if (s[0] != 'r') {
		return false;
	}
	for (int k = 1; k < 6; k++) {
		if (s[k] < '0' || s[k] > '9') {
			return false;
		}
	}
	return s[6] == '.' && safe_word(s + 7);
}

/*
 * manifest.json's size against what the TAG directory's data can need, before a byte of it is
 * read (CKPT_MANIFEST_BASE + CKPT_MANIFEST_PER_FILE per rank file + CKPT_MANIFEST_PER_ELEM per
 * element of the master files r<rank>.fp32, at most CKPT_MANIFEST_MAX): a small checkpoint
 * with a manifest of millions of entries is refused with the numbers, not parsed. Only regular
 * files count. The directory is read only for a manifest above CKPT_MANIFEST_BASE.
 */
static int
check_manifest_size(struct zinf_ckpt *c, uint64_t size)
{
	if (size <= CKPT_MANIFEST_BASE) {
		return 0;
	}
	if (size > CKPT_MANIFEST_MAX) {
		return ZINF_OBJ_FAIL(c->mpath, -EBADMSG,
				     "%" PRIu64
				     " bytes: more than a manifest may hold (%llu bytes)",
				     size, CKPT_MANIFEST_MAX);
	}
	int fd = openat(c->dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		int e = errno;
		if (fd >= 0) {
			close(fd);
		}
		return ZINF_OBJ_FAIL(c->path, -e, "reading the directory: %s", strerror(e));
	}
	uint64_t files = 0, elems = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		struct stat st;
		if (ckpt_rank_file_name(de->d_name) &&
		    fstatat(c->dirfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
		    S_ISREG(st.st_mode)) {
			files++;
			elems += strcmp(de->d_name + 7, "fp32") == 0 ? (uint64_t)st.st_size / 4 : 0;
		}
	}
	closedir(d);
	uint64_t bound = CKPT_MANIFEST_BASE + CKPT_MANIFEST_PER_FILE * files;
	bound = elems > (CKPT_MANIFEST_MAX - bound) / CKPT_MANIFEST_PER_ELEM
			? CKPT_MANIFEST_MAX
			: bound + CKPT_MANIFEST_PER_ELEM * elems;
	if (size > bound) {
		return ZINF_OBJ_FAIL(
			c->mpath, -EBADMSG,
			"%" PRIu64 " bytes, more than the %" PRIu64
			" its data files can need (%u bytes + %u per rank file + %u per element "
			"of the master files r<rank>.fp32; here %" PRIu64 " rank files, %" PRIu64
			" elements): refused unread",
			size, bound, CKPT_MANIFEST_BASE, CKPT_MANIFEST_PER_FILE,
			CKPT_MANIFEST_PER_ELEM, files, elems);
	}
	return 0;
}

/* A small file whole (the manifest: at most 1 GiB) from its descriptor, which it closes. */
static int
read_whole(int fd, const char *path, uint64_t size, char **out, size_t *len)
{
	if (size > (1ull << 30)) {
		close(fd);
		return ZINF_OBJ_FAIL(path, -EBADMSG, "%" PRIu64 " bytes: not a manifest", size);
	}
	char *buf = zc_malloc(size ? size : 1);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	size_t done = 0;
	while (done < size) {
		ssize_t n = read(fd, buf + done, (size_t)size - done);
		if (n < 0 && errno == EINTR) {
			continue;
		}
		if (n <= 0) {
			int e = n < 0 ? errno : 0;
			close(fd);
			zc_free(buf);
			return ZINF_OBJ_FAIL(path, -EIO, "read %zu of %" PRIu64 " bytes%s%s", done,
					     size, e ? ": " : "", e ? strerror(e) : "");
		}
		done += (size_t)n;
	}
	close(fd);
	*out = buf;
	*len = done;
	return 0;
}

/* manifest.json's own CRC32C, in manifest.crc32c beside it: the manifest cannot list its own
 * checksum, and a changed digit in it must not load silently. The file holds exactly what the
 * save writes, "%08x\n" (8 lowercase hexadecimal digits and a newline, 9 bytes), nothing else:
 * another content is refused, whatever it starts with. */
static int
check_manifest_crc(struct zinf_ckpt *c, const char *text, size_t len)
{
	char *cpath = ckpt_join_alloc(c->path, "manifest.crc32c");
	if (!cpath) {
		return -ENOMEM;
	}
	struct stat st;
	int rc = 0, fd = ckpt_open_in(c->dirfd, c->path, "manifest.crc32c", false, &st);
	if (fd < 0) {
		rc = open_failed(fd, cpath, -EBADMSG, "missing: manifest.json cannot be checked");
		goto out;
	}
	char got[16], want[16];
	ssize_t n;
	do {
		n = pread(fd, got, sizeof(got), 0);
	} while (n < 0 && errno == EINTR);
	int e = errno;
	close(fd);
	if (n < 0) {
		rc = ZINF_OBJ_FAIL(cpath, -e, "read: %s", strerror(e));
		goto out;
	}
	uint32_t crc = zinf_crc32c(0, text, len);
	snprintf(want, sizeof(want), "%08x\n", crc);
	bool form = n == 9 && got[8] == '\n';
	for (int k = 0; k < 8 && form; k++) {
		form = (got[k] >= '0' && got[k] <= '9') || (got[k] >= 'a' && got[k] <= 'f');
	}
	if (!form || (uint64_t)st.st_size != 9) {
		rc = ZINF_OBJ_FAIL(cpath, -EBADMSG,
				   "%jd bytes: expected exactly 8 lowercase hexadecimal digits and "
				   "a newline (9 bytes, as the save writes it), nothing else",
				   (intmax_t)st.st_size);
	} else if (memcmp(got, want, 9) != 0) {
		rc = ZINF_OBJ_FAIL(c->mpath, -EBADMSG,
				   "CRC32C 0x%08x, manifest.crc32c says 0x%.8s (corrupted)", crc,
				   got);
	}
out:
	zc_free(cpath);
	return rc;
}

/*
 * c->path and c->dirfd: DIR/TAG, or DIR itself when it holds manifest.json and no tag was asked
 * for. DIR is the caller's path (followed as given); `latest` and the TAG directory in it are
 * the checkpoint's own, opened relative to DIR with no symbolic link followed.
 */
static int
resolve(struct zinf_ckpt *c, const char *dir, const char *tag)
{
	char latest[ZINF_CKPT_MAX_TAG + 1];
	if (tag && !valid_tag(tag)) {
		return ZINF_OBJ_FAIL(dir, -EINVAL,
				     "tag \"%s\": letters, digits, '.', '_', '-', "
				     "at most %d bytes, not starting with '.'",
				     tag, ZINF_CKPT_MAX_TAG);
	}
	int ddir = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (ddir < 0) {
		int e = errno;
		return ZINF_OBJ_FAIL(dir, -e, "%s",
				     e == ENOENT ? "no checkpoint here (missing)" : strerror(e));
	}
	struct stat st;
	int rc = 0;
	if (!tag && fstatat(ddir, "manifest.json", &st, AT_SYMLINK_NOFOLLOW) == 0) {
		c->path = zc_strdup(dir);
		if (!c->path) {
			close(ddir);
			return -ENOMEM;
		}
		c->dirfd = ddir;
		return 0;
	}
	if (!tag) {
		if ((rc = read_latest(ddir, dir, latest))) {
			goto out;
		}
		tag = latest;
	}
	c->path = ckpt_join_alloc(dir, tag);
	if (!c->path) {
		rc = -ENOMEM;
		goto out;
	}
	int fd = ckpt_open_in(ddir, dir, tag, true, NULL);
	if (fd == -ENOENT) { /* named as its manifest: "DIR/step7/manifest.json: no checkpoint" */
		char *mp = ckpt_join_alloc(c->path, "manifest.json");
		rc = mp ? ZINF_OBJ_FAIL(mp, -ENOENT, "no checkpoint here (missing)") : -ENOMEM;
		zc_free(mp);
	} else if (fd < 0) {
		rc = open_failed(fd, c->path, -ENOENT, "missing");
	} else {
		c->dirfd = fd;
	}
out:
	close(ddir);
	return rc;
}

int
zinf_ckpt_open(const char *dir, const char *tag, struct zinf_ckpt **out)
{
	if (!dir || !out) {
		return ZINF_FAIL(-EINVAL, "zinf_ckpt_open: NULL %s", dir ? "out" : "dir");
	}
	struct zinf_ckpt *c = zc_calloc(1, sizeof(*c));
	if (!c) {
		return -ENOMEM;
	}
	c->dirfd = -1;
	int rc = resolve(c, dir, tag);
	if (rc) {
		goto fail;
	}
	c->mpath = ckpt_join_alloc(c->path, "manifest.json");
	if (!c->mpath) {
		rc = -ENOMEM;
		goto fail;
	}
	struct stat st;
	int mfd = ckpt_open_in(c->dirfd, c->path, "manifest.json", false, &st);
	if (mfd < 0) {
		rc = open_failed(mfd, c->mpath, -ENOENT, "no checkpoint here (missing)");
		goto fail;
	}
	size_t mlen = 0;
	char *mtext = NULL;
	if ((rc = check_manifest_size(c, (uint64_t)st.st_size))) {
		close(mfd);
		goto fail;
	}
	if ((rc = read_whole(mfd, c->mpath, (uint64_t)st.st_size, &mtext, &mlen))) {
		goto fail;
	}
	/* the text is kept until the parameters are read from it, then freed */
	struct mtext t = {.s = mtext, .len = mlen};
	c->mt = &t;
	if (!(rc = scan_manifest(c)) && !(rc = check_manifest_crc(c, mtext, mlen))) {
		(void)((rc = parse_header(c)) || (rc = parse_parts(c)) || (rc = parse_ranks(c)) ||
		       (rc = parse_params(c)));
	}
	c->mt = NULL;
	zc_free(mtext);
	if (rc || (rc = check_tiling(c)) || (rc = parse_files(c)) || (rc = check_listed(c)) ||
	    (rc = check_files_present(c))) {
		goto fail;
	}
	*out = c;
	return 0;
fail:
	zinf_ckpt_close(c);
	return rc;
}

void
zinf_ckpt_close(struct zinf_ckpt *c)
{
	if (!c) {
		return;
	}
	if (c->files) {
		close_fds(c);
	}
	if (c->dirfd >= 0) {
		close(c->dirfd);
	}
	zc_free(c->params);
	zc_free(c->offs);
	while (c->names) {
		struct name_chunk *k = c->names;
		c->names = k->next;
		zc_free(k);
	}
	zc_free(c->parts);
	zc_free(c->files);
	zc_free(c->flat);
	zc_free(c->rank_file);
	json_decref(c->file_index);
	json_decref(c->m);
	zc_free(c->mpath);
	zc_free(c->path);
	zc_free(c);
}

/* ---- queries ------------------------------------------------------------------------------ */

const json_t *
ckpt_manifest(const struct zinf_ckpt *c)
{
	return c->m;
}

int32_t
ckpt_files_world(const struct zinf_ckpt *c)
{
	return c->files_world;
}

int
zinf_ckpt_get_info(const struct zinf_ckpt *c, struct zinf_ckpt_info *out)
{
	if (!c) {
		return ZINF_FAIL(-EINVAL, "zinf_ckpt_get_info: NULL checkpoint");
	}
	struct zinf_ckpt_info i = {
		.size = sizeof(i),
		.path = c->path,
		.tag = c->tag,
		.steps = c->steps,
		.micro_steps = c->micro_steps,
		.world = c->world,
		.stage = c->stage,
		.dtype = c->dtype,
		.n_params = c->n_params,
		.n_parts = c->n_parts,
		.n_files = c->n_files,
		.bytes = c->bytes,
		.optimizer = c->optimizer,
	};
	return zc_stats_give(out, &i, sizeof(i), "zinf_ckpt_info");
}

int
zinf_ckpt_param(const struct zinf_ckpt *c, uint32_t i, struct zinf_ckpt_param *out)
{
	if (!c || i >= c->n_params) {
		return ZINF_FAIL(-EINVAL, "zinf_ckpt_param: %s",
				 c ? "index out of range" : "NULL checkpoint");
	}
	const struct ckpt_param *p = &c->params[i];
	struct zinf_ckpt_param q = {.size = sizeof(q),
				    .name = p->name,
				    .numel = p->numel,
				    .layer = p->layer,
				    .ndim = p->ndim};
	if (p->shape) {
		memcpy(q.shape, p->shape, p->ndim * sizeof(*p->shape));
	} else {
		q.shape[0] = p->numel;
	}
	return zc_stats_give(out, &q, sizeof(q), "zinf_ckpt_param");
}

int
zinf_ckpt_part(const struct zinf_ckpt *c, uint32_t part, struct zinf_ckpt_part *out)
{
	if (!c || part >= c->n_parts) {
		return ZINF_FAIL(-EINVAL, "zinf_ckpt_part: %s",
				 c ? "part out of range" : "NULL checkpoint");
	}
	struct zinf_ckpt_part q = {
		.size = sizeof(q), .name = c->parts[part].name, .dtype = c->parts[part].dtype};
	return zc_stats_give(out, &q, sizeof(q), "zinf_ckpt_part");
}

uint32_t
zinf_ckpt_file_count(const struct zinf_ckpt *c)
{
	return c ? c->n_files : 0;
}

int
zinf_ckpt_file(const struct zinf_ckpt *c, uint32_t i, struct zinf_ckpt_file *out)
{
	if (!c || i >= c->n_files) {
		return ZINF_FAIL(-EINVAL, "zinf_ckpt_file: %s",
				 c ? "index out of range" : "NULL checkpoint");
	}
	struct zinf_ckpt_file q = {.size = sizeof(q),
				   .name = c->files[i].name,
				   .bytes = c->files[i].bytes,
				   .crc32c = c->files[i].crc32c};
	return zc_stats_give(out, &q, sizeof(q), "zinf_ckpt_file");
}

/* ---- reading ------------------------------------------------------------------------------ */

static void
close_fds(struct zinf_ckpt *c)
{
	for (uint32_t i = 0; i < c->n_files; i++) {
		if (c->files[i].fd >= 0) {
			close(c->files[i].fd);
			c->files[i].fd = -1;
		}
	}
	c->n_open = 0;
}

/* File k's descriptor, opened on first use and kept. Out of descriptors (thousands of rank
 * files against `ulimit -n`), the kept ones are closed and the open retried. */
static int
file_fd(struct zinf_ckpt *c, uint32_t k)
{
	struct ckpt_file *f = &c->files[k];
	if (f->fd >= 0) {
		return f->fd;
	}
	char path[4352];
	if (ckpt_path(c, f->name, path, sizeof(path))) {
		return ZINF_OBJ_FAIL(c->path, -ENAMETOOLONG, "%s: path too long", f->name);
	}
	for (uint32_t j = 0; c->n_open >= CKPT_MAX_OPEN && j < c->n_files; j++) {
		uint32_t x = (c->evict + j) % c->n_files;
		if (x != k && c->files[x].fd >= 0) {
			close(c->files[x].fd);
			c->files[x].fd = -1;
			c->n_open--;
			c->evict = x + 1;
		}
	}
	int fd = ckpt_open_in(c->dirfd, c->path, f->name, false, NULL);
	if ((fd == -EMFILE || fd == -ENFILE) && c->n_open > 0) {
		close_fds(c);
		fd = ckpt_open_in(c->dirfd, c->path, f->name, false, NULL);
	}
	if (fd < 0) {
		return open_failed(fd, path, -EBADMSG, "listed in manifest.json but missing");
	}
	f->fd = fd;
	c->n_open++;
	return fd;
}

/* len bytes at off of file k, whole: a short read means the file shrank since open. */
static int
pread_full(struct zinf_ckpt *c, uint32_t k, void *buf, size_t len, uint64_t off)
{
	int fd = file_fd(c, k);
	if (fd < 0) {
		return fd;
	}
	char *p = buf, path[4352];
	size_t done = 0;
	ckpt_path(c, c->files[k].name, path, sizeof(path));
	while (done < len) {
		ssize_t n = pread(fd, p + done, len - done, (off_t)(off + done));
		if (n < 0) {
			if (errno == EINTR) {
				continue;
			}
			int e = errno;
			return ZINF_OBJ_FAIL(path, -e, "pread %zu bytes at %" PRIu64 ": %s",
					     len - done, off + done, strerror(e));
		}
		if (n == 0) {
			return ZINF_OBJ_FAIL(path, -EBADMSG,
					     "ends at %" PRIu64 ", before %" PRIu64
					     " (truncated since the checkpoint was opened)",
					     off + done, off + len);
		}
		done += (size_t)n;
	}
	return 0;
}

int
ckpt_read_file(struct zinf_ckpt *c, uint32_t k, void *buf, size_t len, uint64_t off)
{
	if (k >= c->n_files) {
		return ZINF_OBJ_FAIL(c->path, -EINVAL, "file %u of %u listed", k, c->n_files);
	}
	return pread_full(c, k, buf, len, off);
}

int
zinf_ckpt_read(struct zinf_ckpt *c, uint32_t i, uint32_t part, uint64_t first, uint64_t count,
	       enum zinf_dtype dtype, void *out)
{
	if (!c || i >= c->n_params || part >= c->n_parts || zinf_dtype_size(dtype) == 0 ||
	    (!out && count > 0)) {
		return ZINF_FAIL(-EINVAL, "zinf_ckpt_read: %s",
				 !c			   ? "NULL checkpoint"
				 : i >= c->n_params	   ? "parameter index out of range"
				 : part >= c->n_parts	   ? "part out of range"
				 : !zinf_dtype_size(dtype) ? "unknown dtype"
							   : "NULL out");
	}
	const struct ckpt_param *p = &c->params[i];
	if (first > p->numel || count > p->numel - first) {
		return ZINF_OBJ_FAIL(c->path, -EINVAL,
				     "parameter \"%s\": elements [%" PRIu64 ", +%" PRIu64
				     ") past numel %" PRIu64,
				     p->name, first, count, p->numel);
	}
	enum zinf_dtype src = c->parts[part].dtype;
	size_t ssz = zinf_dtype_size(src), dsz = zinf_dtype_size(dtype);
	void *bounce = NULL;
	if (src != dtype && count > 0) {
		bounce = zc_malloc((size_t)ZINF_MIN(count, CKPT_BOUNCE_ELEMS) * ssz);
		if (!bounce) {
			return -ENOMEM;
		}
	}
	int rc = 0;
	char *dst = out;
	uint64_t e = first, end = first + count;
	while (e < end && !rc) {
		/* stored rank r holds [r * part, (r + 1) * part) of the tensor */
		uint64_t r = e / p->part, local = e - r * p->part;
		uint64_t n = ZINF_MIN(end - e, p->part - local);
		uint32_t k = c->rank_file[r * c->n_parts + part];
		uint64_t off = (p->flat_off[r] + local) * ssz;
		if (!bounce) {
			rc = pread_full(c, k, dst, (size_t)(n * ssz), off);
		} else {
			n = ZINF_MIN(n, CKPT_BOUNCE_ELEMS);
			rc = pread_full(c, k, bounce, (size_t)(n * ssz), off);
			if (!rc) {
				rc = zinf_dtype_convert(dst, dtype, bounce, src, (size_t)n);
			}
		}
		dst += n * dsz;
		e += n;
	}
	zc_free(bounce);
	return rc;
}

int
zinf_ckpt_verify_file(struct zinf_ckpt *c, uint32_t i)
{
	if (!c || i >= c->n_files) {
		return ZINF_FAIL(-EINVAL, "zinf_ckpt_verify_file: %s",
				 c ? "index out of range" : "NULL checkpoint");
	}
	struct ckpt_file *f = &c->files[i];
	char path[4352];
	ckpt_path(c, f->name, path, sizeof(path));
	bool kept = f->fd >= 0; /* a descriptor opened here for one pass is not kept */
	int fd = file_fd(c, i);
	if (fd < 0) {
		return fd;
	}
	posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
	struct stat st;
	void *buf = NULL;
	uint32_t crc = 0;
	int rc = 0;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		rc = ZINF_OBJ_FAIL(path, -e, "fstat: %s", strerror(e));
		goto out;
	}
	if ((uint64_t)st.st_size != f->bytes) {
		rc = ZINF_OBJ_FAIL(path, -EBADMSG, "%jd bytes, manifest.json lists %" PRIu64,
				   (intmax_t)st.st_size, f->bytes);
		goto out;
	}
	size_t chunk = (size_t)ZINF_MIN(f->bytes, (uint64_t)CKPT_VERIFY_CHUNK);
	buf = zc_malloc(chunk ? chunk : 1);
	if (!buf) {
		rc = -ENOMEM;
		goto out;
	}
	for (uint64_t off = 0; off < f->bytes && !rc; off += chunk) {
		size_t n = (size_t)ZINF_MIN((uint64_t)chunk, f->bytes - off);
		rc = pread_full(c, i, buf, n, off);
		if (!rc) {
			crc = zinf_crc32c(crc, buf, n);
		}
	}
	if (!rc && crc != f->crc32c) {
		rc = ZINF_OBJ_FAIL(path, -EBADMSG,
				   "CRC32C 0x%08x, manifest.json lists 0x%08x (corrupted)", crc,
				   f->crc32c);
	}
out:
	zc_free(buf);
	if (!kept && f->fd >= 0) {
		close(f->fd);
		f->fd = -1;
		c->n_open--;
	}
	return rc;
}
