/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ckpt/safetensors_read.c: reading safetensors checkpoints (zinf/safetensors.h): a file, an
 * index and its shards, or a directory holding either. Every header is read (its length first,
 * bounded by ZINF_SAFETENSORS_MAX_HEADER and the file), parsed with jansson and checked by the
 * format's rules (dtype, shape against the byte span, the tensors tiling the data section); an
 * index is checked against its shards (every mapping held, every tensor mapped, no name in two
 * shards). The handle keeps the table of tensors (sorted by file and offset, and an index of
 * them sorted by name for lookups) and one descriptor per file; reads are positional (pread),
 * bounded by the caller's buffer, and may run concurrently. Every refusal names the file, the
 * tensor and the value. Not here: writing (safetensors_write.c); what the tensors mean (the
 * Hugging Face import, above).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_fs.h"
#include "common/dtype.h"
#include "common/opts.h"
#include "common/util.h"
#include "zinf/safetensors.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors files are little-endian: zinf reads them on little-endian hosts only"
#endif

#define ST_INDEX_NAME "model.safetensors.index.json"
#define ST_FILE_NAME  "model.safetensors"
/* The bounce buffer of a converting read, bytes. */
#define ST_BOUNCE_BYTES (1u << 20)
/* Bytes per pread call at most (Linux transfers at most 2 GiB - 4 KiB per call anyway). */
#define ST_PREAD_MAX (1u << 30)

#define ST_BAD(path, ...) ZINF_OBJ_FAIL((path), -EBADMSG, __VA_ARGS__)

/* The format's element types (safetensors 0.8), with their size in bits. */
static const struct st_dtype_def {
	const char *name;
	uint8_t bits;
	enum zinf_safetensors_dtype dt;
} st_dtypes[] = {
	{"F32", 32, ZINF_SAFETENSORS_F32},	    {"F16", 16, ZINF_SAFETENSORS_F16},
	{"BF16", 16, ZINF_SAFETENSORS_BF16},	    {"F64", 64, ZINF_SAFETENSORS_F64},
	{"BOOL", 8, ZINF_SAFETENSORS_OTHER},	    {"U8", 8, ZINF_SAFETENSORS_OTHER},
	{"I8", 8, ZINF_SAFETENSORS_OTHER},	    {"F8_E5M2", 8, ZINF_SAFETENSORS_OTHER},
	{"F8_E4M3", 8, ZINF_SAFETENSORS_OTHER},	    {"F8_E8M0", 8, ZINF_SAFETENSORS_OTHER},
	{"F8_E4M3FNUZ", 8, ZINF_SAFETENSORS_OTHER}, {"F8_E5M2FNUZ", 8, ZINF_SAFETENSORS_OTHER},
	{"I16", 16, ZINF_SAFETENSORS_OTHER},	    {"U16", 16, ZINF_SAFETENSORS_OTHER},
	{"I32", 32, ZINF_SAFETENSORS_OTHER},	    {"U32", 32, ZINF_SAFETENSORS_OTHER},
	{"I64", 64, ZINF_SAFETENSORS_OTHER},	    {"U64", 64, ZINF_SAFETENSORS_OTHER},
	{"C64", 64, ZINF_SAFETENSORS_OTHER},	    {"F4", 4, ZINF_SAFETENSORS_OTHER},
	{"F6_E2M3", 6, ZINF_SAFETENSORS_OTHER},	    {"F6_E3M2", 6, ZINF_SAFETENSORS_OTHER},
};

struct st_file {
	char *path;	   /* as opened: the index's directory joined with the shard's name */
	const char *shard; /* the name the index gives it (points into path); NULL: no index */
	int fd;		   /* -1: not open */
	uint64_t size;	   /* bytes */
	uint64_t data_off; /* where the data section starts: 8 + header length */
};

struct st_tensor {
	char *name;
	uint32_t file;
	uint8_t dt; /* index into st_dtypes */
	uint32_t ndim;
	uint64_t shape[ZINF_SAFETENSORS_MAX_DIMS];
	uint64_t numel;
	uint64_t begin, end; /* data_offsets: bytes of the data section */
};

struct zinf_safetensors {
	char *path; /* what was opened: the file or the index */
	struct st_file *files;
	uint32_t n_files;
	struct st_tensor *t; /* by file, then offset */
	uint32_t n, cap;
	uint32_t *by_name; /* [n]: indices of t sorted by name */
};

/* ---- helpers ------------------------------------------------------------------------------ */

/* "[2, 3]" into buf (truncated with "..." when it does not fit: messages only). */
static const char *
st_shape_text(char *buf, size_t len, const uint64_t *shape, uint32_t ndim)
{
	size_t at = (size_t)snprintf(buf, len, "[");
	for (uint32_t d = 0; d < ndim && at < len; d++) {
		at += (size_t)snprintf(buf + at, len - at, "%s%" PRIu64, d ? ", " : "", shape[d]);
	}
	if (at < len) {
		snprintf(buf + at, len - at, "]");
	} else if (len > 4) {
		memcpy(buf + len - 4, "...", 4);
	}
	return buf;
}

/* All len bytes at off; EOF is -EIO (a file shorter than its header said). */
static int
st_pread_full(int fd, const char *path, void *out, uint64_t len, uint64_t off)
{
	char *p = out;
	uint64_t done = 0;
	while (done < len) {
		size_t want = (size_t)ZINF_MIN(len - done, (uint64_t)ST_PREAD_MAX);
		ssize_t r = pread(fd, p + done, want, (off_t)(off + done));
		if (r < 0 && errno == EINTR) {
			continue;
		}
		if (r < 0) {
			int err = -errno;
			return ZINF_OBJ_FAIL(path, err,
					     "reading %" PRIu64 " bytes at offset %" PRIu64 ": %s",
					     len, off, zinf_strerror(err));
		}
		if (r == 0) {
			return ZINF_OBJ_FAIL(path, -EIO,
					     "ends at %" PRIu64 " bytes, before the %" PRIu64
					     " bytes at offset %" PRIu64
					     " (changed since it was opened?)",
					     off + done, len, off);
		}
		done += (uint64_t)r;
	}
	return 0;
}

/* Open a regular file read-only (symbolic links followed; O_NONBLOCK: a FIFO cannot block). */
static int
st_open_regular(const char *path, int *fd_out, uint64_t *size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0) {
		int err = -errno;
		return ZINF_OBJ_FAIL(path, err, "cannot open: %s", zinf_strerror(err));
	}
	struct stat sb;
	if (fstat(fd, &sb) != 0) {
		int err = -errno;
		close(fd);
		return ZINF_OBJ_FAIL(path, err, "fstat: %s", zinf_strerror(err));
	}
	if (!S_ISREG(sb.st_mode)) {
		close(fd);
		return ST_BAD(path, "not a regular file");
	}
	*fd_out = fd;
	*size = (uint64_t)sb.st_size;
	return 0;
}

/* A JSON text of at most ZINF_SAFETENSORS_MAX_HEADER bytes at fd's offset off, parsed. */
static int
st_load_json(int fd, const char *path, uint64_t off, uint64_t len, const char *what, json_t **out)
{
	char *buf = zc_malloc(len ? (size_t)len : 1);
	if (!buf) {
		return -ENOMEM;
	}
	int rc = st_pread_full(fd, path, buf, len, off);
	if (rc) {
		zc_free(buf);
		return rc;
	}
	if (len == 0 || buf[0] != '{') {
		zc_free(buf);
		return ST_BAD(path, "%s does not start with '{'", what);
	}
	json_error_t je;
	json_t *j = json_loadb(buf, (size_t)len, JSON_REJECT_DUPLICATES, &je);
	zc_free(buf);
	if (!j) {
		return ST_BAD(path, "%s is not JSON: %s (line %d, column %d)", what, je.text,
			      je.line, je.column);
	}
	if (!json_is_object(j)) {
		json_decref(j);
		return ST_BAD(path, "%s is not a JSON object", what);
	}
	*out = j;
	return 0;
}

/* A non-negative JSON integer. */
static bool
st_get_u64(const json_t *v, uint64_t *out)
{
	if (!json_is_integer(v) || json_integer_value(v) < 0) {
		return false;
	}
	*out = (uint64_t)json_integer_value(v);
	return true;
}

/* ---- one file's header -------------------------------------------------------------------- */

static int
st_push(struct zinf_safetensors *st, struct st_tensor **out)
{
	if (st->n == st->cap) {
		if (st->cap >= UINT32_MAX / 2) {
			return -ENOMEM;
		}
		uint32_t cap = st->cap ? st->cap * 2 : 64;
		struct st_tensor *t = zc_realloc(st->t, (size_t)cap * sizeof(*t));
		if (!t) {
			return -ENOMEM;
		}
		st->t = t;
		st->cap = cap;
	}
	*out = &st->t[st->n];
	memset(*out, 0, sizeof(**out));
	return 0;
}

/* Tensor `name`'s entry (val) of file fi, whose data section has data_len bytes. */
static int
st_parse_tensor(struct zinf_safetensors *st, uint32_t fi, const char *name, const json_t *val,
		uint64_t data_len)
{
	const char *path = st->files[fi].path;
	if (!json_is_object(val)) {
		return ST_BAD(path, "tensor \"%s\": its entry is not an object", name);
	}
	const json_t *dt = json_object_get(val, "dtype"), *sh = json_object_get(val, "shape");
	const json_t *off = json_object_get(val, "data_offsets");
	if (!json_is_string(dt)) {
		return ST_BAD(path, "tensor \"%s\": no \"dtype\" string", name);
	}
	uint8_t d = 0;
	while (d < ZINF_ARRAY_SIZE(st_dtypes) && strcmp(st_dtypes[d].name, json_string_value(dt))) {
		d++;
	}
	if (d == ZINF_ARRAY_SIZE(st_dtypes)) {
		return ST_BAD(path, "tensor \"%s\": unknown dtype \"%s\"", name,
			      json_string_value(dt));
	}
	if (!json_is_array(sh)) {
		return ST_BAD(path, "tensor \"%s\": no \"shape\" array", name);
	}
	size_t ndim = json_array_size(sh);
	if (ndim > ZINF_SAFETENSORS_MAX_DIMS) {
		return ST_BAD(path, "tensor \"%s\": %zu dimensions; zinf reads up to %d", name,
			      ndim, ZINF_SAFETENSORS_MAX_DIMS);
	}
	uint64_t shape[ZINF_SAFETENSORS_MAX_DIMS] = {0}, numel = 1, bits;
	bool overflow = false;
	for (size_t k = 0; k < ndim; k++) {
		if (!st_get_u64(json_array_get(sh, k), &shape[k])) {
			return ST_BAD(path,
				      "tensor \"%s\": shape[%zu] is not a non-negative integer",
				      name, k);
		}
		overflow |= __builtin_mul_overflow(numel, shape[k], &numel);
	}
	char stx[200];
	st_shape_text(stx, sizeof(stx), shape, (uint32_t)ndim);
	overflow |= __builtin_mul_overflow(numel, (uint64_t)st_dtypes[d].bits, &bits);
	if (overflow) {
		return ST_BAD(path, "tensor \"%s\": shape %s of %s overflows 64 bits", name, stx,
			      st_dtypes[d].name);
	}
	if (bits % 8) {
		return ST_BAD(path, "tensor \"%s\": shape %s of %s is not a whole number of bytes",
			      name, stx, st_dtypes[d].name);
	}
	uint64_t b, e;
	if (!json_is_array(off) || json_array_size(off) != 2 ||
	    !st_get_u64(json_array_get(off, 0), &b) || !st_get_u64(json_array_get(off, 1), &e)) {
		return ST_BAD(path, "tensor \"%s\": \"data_offsets\" is not [begin, end]", name);
	}
	if (b > e) {
		return ST_BAD(path,
			      "tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] end before "
			      "they begin",
			      name, b, e);
	}
	if (e - b != bits / 8) {
		return ST_BAD(path,
			      "tensor \"%s\": shape %s of %s is %" PRIu64
			      " bytes, but data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64,
			      name, stx, st_dtypes[d].name, bits / 8, b, e, e - b);
	}
	if (e > data_len) {
		return ST_BAD(path,
			      "tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] outside the "
			      "data section of %" PRIu64 " bytes",
			      name, b, e, data_len);
	}
	struct st_tensor *x;
	int rc = st_push(st, &x);
	if (rc) {
		return rc;
	}
	x->name = zc_strdup(name);
	if (!x->name) {
		return -ENOMEM;
	}
	st->n++;
	x->file = fi;
	x->dt = d;
	x->ndim = (uint32_t)ndim;
	memcpy(x->shape, shape, sizeof(shape));
	x->numel = numel;
	x->begin = b;
	x->end = e;
	return 0;
}

static int
st_cmp_offset(const void *a, const void *b)
{
	const struct st_tensor *x = a, *y = b;
	if (x->begin != y->begin) {
		return x->begin < y->begin ? -1 : 1;
	}
	if (x->end != y->end) {
		return x->end < y->end ? -1 : 1;
	}
	return strcmp(x->name, y->name);
}

/* The data section of file fi tiled by its tensors t[first..n) (sorted here by offset). */
static int
st_check_tiling(struct zinf_safetensors *st, uint32_t fi, uint32_t first)
{
	const struct st_file *f = &st->files[fi];
	struct st_tensor *t = st->t + first;
	uint32_t n = st->n - first;
	if (n > 1) { /* (a file of no tensor has no table: qsort takes no NULL) */
		qsort(t, n, sizeof(*t), st_cmp_offset);
	}
	uint64_t at = 0, data_len = f->size - f->data_off;
	for (uint32_t k = 0; k < n; k++) {
		if (t[k].begin < at) {
			return ST_BAD(f->path,
				      "tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64
				      "] overlap tensor \"%s\"'s, which end at %" PRIu64,
				      t[k].name, t[k].begin, t[k].end, t[k - 1].name, at);
		}
		if (t[k].begin > at) {
			return ST_BAD(
				f->path,
				"tensor \"%s\": data_offsets [%" PRIu64 ", %" PRIu64 "] leave "
				"bytes [%" PRIu64 ", %" PRIu64 ") of the data section unused (a "
				"hole, which the format forbids)",
				t[k].name, t[k].begin, t[k].end, at, t[k].begin);
		}
		at = t[k].end;
	}
	if (at != data_len) {
		return ST_BAD(f->path,
			      "the data section has %" PRIu64
			      " bytes but its tensors end at %" PRIu64
			      " (bytes past the last tensor, which the format forbids)",
			      data_len, at);
	}
	return 0;
}

/* Open file fi, read and check its header, append its tensors. */
static int
st_parse_file(struct zinf_safetensors *st, uint32_t fi)
{
	struct st_file *f = &st->files[fi];
	int rc = st_open_regular(f->path, &f->fd, &f->size);
	if (rc) {
		return rc;
	}
	if (f->size < 8) {
		return ST_BAD(f->path, "%" PRIu64 " bytes: shorter than the 8-byte header length",
			      f->size);
	}
	uint8_t le[8];
	if ((rc = st_pread_full(f->fd, f->path, le, 8, 0))) {
		return rc;
	}
	uint64_t hl = 0;
	for (int k = 0; k < 8; k++) {
		hl |= (uint64_t)le[k] << (8 * k);
	}
	if (hl > ZINF_SAFETENSORS_MAX_HEADER) {
		return ST_BAD(f->path, "header length %" PRIu64 " above the cap of %llu bytes", hl,
			      ZINF_SAFETENSORS_MAX_HEADER);
	}
	if (hl > f->size - 8) {
		return ST_BAD(f->path,
			      "header length %" PRIu64 " past the end of the file (%" PRIu64
			      " bytes)",
			      hl, f->size);
	}
	f->data_off = 8 + hl;
	json_t *h = NULL;
	if ((rc = st_load_json(f->fd, f->path, 8, hl, "the header", &h))) {
		return rc;
	}
	uint32_t first = st->n;
	const char *key;
	json_t *val;
	json_object_foreach(h, key, val)
	{
		if (strcmp(key, "__metadata__") == 0) {
			const char *mk;
			json_t *mv;
			if (!json_is_object(val)) {
				rc = ST_BAD(f->path, "\"__metadata__\" is not an object");
				break;
			}
			json_object_foreach(val, mk, mv)
			{
				if (!json_is_string(mv)) {
					rc = ST_BAD(f->path,
						    "\"__metadata__\": \"%s\" is not a string", mk);
					break;
				}
			}
		} else {
			rc = st_parse_tensor(st, fi, key, val, f->size - f->data_off);
		}
		if (rc) {
			break;
		}
	}
	json_decref(h);
	return rc ? rc : st_check_tiling(st, fi, first);
}

/* ---- lookups by name ------------------------------------------------------------------------- */

/* qsort_r's context: the table whose indices are sorted. */
static int
st_cmp_name(const void *a, const void *b, void *ctx)
{
	const struct st_tensor *t = ctx;
	return strcmp(t[*(const uint32_t *)a].name, t[*(const uint32_t *)b].name);
}

static void
st_sort_names(struct zinf_safetensors *st)
{
	for (uint32_t i = 0; i < st->n; i++) {
		st->by_name[i] = i;
	}
	if (st->n > 1) {
		qsort_r(st->by_name, st->n, sizeof(*st->by_name), st_cmp_name, st->t);
	}
}

static int
st_find(const struct zinf_safetensors *st, const char *name)
{
	uint32_t lo = 0, hi = st->n;
	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		int c = strcmp(name, st->t[st->by_name[mid]].name);
		if (c == 0) {
			return (int)st->by_name[mid];
		}
		if (c < 0) {
			hi = mid;
		} else {
			lo = mid + 1;
		}
	}
	return -ENOENT;
}

/* ---- the index ---------------------------------------------------------------------------- */

static int
st_cmp_str(const void *a, const void *b)
{
	return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The shards the index at `path` names, sorted and each once, as st->files. */
static int
st_index_files(struct zinf_safetensors *st, const char *path, const json_t *wm)
{
	size_t n = json_object_size(wm);
	const char **names = zc_calloc(n ? n : 1, sizeof(*names));
	if (!names) {
		return -ENOMEM;
	}
	int rc = 0;
	size_t k = 0;
	const char *key;
	json_t *val;
	json_object_foreach((json_t *)wm, key, val)
	{
		const char *s = json_string_value(val);
		if (!s) {
			rc = ST_BAD(path, "weight_map: \"%s\" maps to no file name", key);
			break;
		}
		if (!s[0] || strchr(s, '/') || !strcmp(s, ".") || !strcmp(s, "..")) {
			rc = ST_BAD(path,
				    "weight_map: \"%s\" maps to \"%s\", not a file of the index's "
				    "directory",
				    key, s);
			break;
		}
		names[k++] = s;
	}
	uint32_t u = 0;
	if (!rc) {
		qsort(names, k, sizeof(*names), st_cmp_str);
		for (size_t j = 0; j < k; j++) {
			u += j == 0 || strcmp(names[j], names[j - 1]) != 0;
		}
		st->files = zc_calloc(u ? u : 1, sizeof(*st->files));
		rc = st->files ? 0 : -ENOMEM;
	}
	char *dir = NULL;
	if (!rc) {
		const char *slash = strrchr(path, '/');
		/* "/x.index.json": files in "/" (joined as "" + "/" + name) */
		dir = zc_strdup(slash ? path : ".");
		rc = dir ? 0 : -ENOMEM;
		if (dir && slash) {
			dir[slash - path] = '\0';
		}
	}
	for (size_t j = 0; !rc && j < k; j++) {
		if (j > 0 && strcmp(names[j], names[j - 1]) == 0) {
			continue;
		}
		struct st_file *f = &st->files[st->n_files];
		f->fd = -1;
		f->path = ckpt_join_alloc(dir, names[j]);
		if (!f->path) {
			rc = -ENOMEM;
			break;
		}
		f->shard = f->path + strlen(dir) + 1;
		st->n_files++;
	}
	zc_free(dir);
	zc_free(names);
	return rc;
}

/* One tensor that the index maps to shard `name` (for messages). */
static const char *
st_some_tensor_of(const json_t *wm, const char *name)
{
	const char *key;
	json_t *val;
	json_object_foreach((json_t *)wm, key, val)
	{
		if (strcmp(json_string_value(val), name) == 0) {
			return key;
		}
	}
	return "?";
}

/* The index's mappings against what the shards hold. */
static int
st_check_index(const struct zinf_safetensors *st, const char *path, const json_t *wm)
{
	for (uint32_t k = 1; k < st->n; k++) {
		const struct st_tensor *a = &st->t[st->by_name[k - 1]], *b = &st->t[st->by_name[k]];
		if (strcmp(a->name, b->name) == 0) {
			return ST_BAD(path, "tensor \"%s\" is in two shards: %s and %s", a->name,
				      st->files[a->file].path, st->files[b->file].path);
		}
	}
	const char *key;
	json_t *val;
	json_object_foreach((json_t *)wm, key, val)
	{
		int i = st_find(st, key);
		if (i < 0) {
			return ST_BAD(path, "weight_map: tensor \"%s\" is absent from its shard %s",
				      key, json_string_value(val));
		}
		const struct st_file *f = &st->files[st->t[i].file];
		if (strcmp(f->shard, json_string_value(val)) != 0) {
			return ST_BAD(
				path,
				"weight_map: tensor \"%s\" is absent from its shard %s (it is "
				"in %s)",
				key, json_string_value(val), f->shard);
		}
	}
	for (uint32_t i = 0; i < st->n; i++) {
		if (!json_object_get(wm, st->t[i].name)) {
			return ST_BAD(path, "shard %s holds tensor \"%s\", which weight_map omits",
				      st->files[st->t[i].file].shard, st->t[i].name);
		}
	}
	return 0;
}

static int
st_open_index(struct zinf_safetensors *st, const char *path)
{
	int fd = -1;
	uint64_t size = 0;
	int rc = st_open_regular(path, &fd, &size);
	if (rc) {
		return rc;
	}
	json_t *root = NULL;
	if (size > ZINF_SAFETENSORS_MAX_HEADER) {
		rc = ST_BAD(path, "%" PRIu64 " bytes: larger than the cap of %llu for an index",
			    size, ZINF_SAFETENSORS_MAX_HEADER);
	} else {
		rc = st_load_json(fd, path, 0, size, "the index", &root);
	}
	close(fd);
	if (rc) {
		return rc;
	}
	const json_t *wm = json_object_get(root, "weight_map");
	const json_t *meta = json_object_get(root, "metadata");
	if (!json_is_object(wm)) {
		rc = ST_BAD(path, "no \"weight_map\" object");
	} else if (meta && !json_is_object(meta)) {
		rc = ST_BAD(path, "\"metadata\" is not an object");
	}
	if (!rc) {
		rc = st_index_files(st, path, wm);
	}
	for (uint32_t fi = 0; !rc && fi < st->n_files; fi++) {
		struct stat sb;
		const struct st_file *f = &st->files[fi];
		if (stat(f->path, &sb) != 0 && errno == ENOENT) {
			rc = ZINF_OBJ_FAIL(path, -ENOENT,
					   "names shard %s (tensor \"%s\"), which is missing",
					   f->path, st_some_tensor_of(wm, f->shard));
		} else {
			rc = st_parse_file(st, fi);
		}
	}
	st->by_name = rc ? NULL : zc_calloc(st->n ? st->n : 1, sizeof(*st->by_name));
	if (!rc && !st->by_name) {
		rc = -ENOMEM;
	}
	if (!rc) {
		st_sort_names(st); /* first: the checks find tensors by name */
		rc = st_check_index(st, path, wm);
	}
	json_decref(root);
	return rc;
}

/* ---- the handle --------------------------------------------------------------------------- */

/* A single file: its header, and the lookup table (a file's names are unique: jansson). */
static int
st_open_file(struct zinf_safetensors *st, const char *path)
{
	st->files = zc_calloc(1, sizeof(*st->files));
	if (!st->files) {
		return -ENOMEM;
	}
	st->files[0].fd = -1;
	st->files[0].path = zc_strdup(path);
	if (!st->files[0].path) {
		return -ENOMEM;
	}
	st->n_files = 1;
	int rc = st_parse_file(st, 0);
	if (rc) {
		return rc;
	}
	st->by_name = zc_calloc(st->n ? st->n : 1, sizeof(*st->by_name));
	if (!st->by_name) {
		return -ENOMEM;
	}
	st_sort_names(st);
	return 0;
}

static bool
st_ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), m = strlen(suffix);
	return n >= m && strcmp(s + n - m, suffix) == 0;
}

int
zinf_safetensors_open(const char *path, struct zinf_safetensors **out)
{
	if (!path || !out) {
		return ZINF_FAIL(-EINVAL, "zinf_safetensors_open: NULL %s", path ? "out" : "path");
	}
	struct stat sb;
	if (stat(path, &sb) != 0) {
		int err = -errno;
		return ZINF_OBJ_FAIL(path, err, "cannot open: %s", zinf_strerror(err));
	}
	struct zinf_safetensors *st = zc_calloc(1, sizeof(*st));
	if (!st) {
		return -ENOMEM;
	}
	bool index = false;
	int rc = 0;
	if (S_ISDIR(sb.st_mode)) { /* transformers' order: the single file, else the index */
		st->path = ckpt_join_alloc(path, ST_FILE_NAME);
		if (st->path && stat(st->path, &sb) != 0) {
			zc_free(st->path);
			st->path = ckpt_join_alloc(path, ST_INDEX_NAME);
			index = true;
			if (st->path && stat(st->path, &sb) != 0) {
				rc = ZINF_OBJ_FAIL(path, -ENOENT,
						   "a directory holding neither " ST_FILE_NAME
						   " nor " ST_INDEX_NAME);
			}
		}
	} else {
		st->path = zc_strdup(path);
		index = st_ends_with(path, ".index.json");
	}
	if (!rc && !st->path) {
		rc = -ENOMEM;
	}
	if (!rc) {
		rc = index ? st_open_index(st, st->path) : st_open_file(st, st->path);
	}
	if (rc) {
		zinf_safetensors_close(st);
		return rc;
	}
	*out = st;
	return 0;
}

void
zinf_safetensors_close(struct zinf_safetensors *st)
{
	if (!st) {
		return;
	}
	for (uint32_t k = 0; k < st->n_files; k++) {
		if (st->files[k].fd >= 0) {
			close(st->files[k].fd);
		}
		zc_free(st->files[k].path);
	}
	for (uint32_t i = 0; i < st->n; i++) {
		zc_free(st->t[i].name);
	}
	zc_free(st->files);
	free(st->t);
	zc_free(st->by_name);
	zc_free(st->path);
	zc_free(st);
}

uint32_t
zinf_safetensors_count(const struct zinf_safetensors *st)
{
	return st ? st->n : 0;
}

const char *
zinf_safetensors_path(const struct zinf_safetensors *st)
{
	return st ? st->path : NULL;
}

ZINF_OPTS_NO_TAIL_PAD(struct zinf_safetensors_info, offset);

int
zinf_safetensors_info(const struct zinf_safetensors *st, uint32_t i,
		      struct zinf_safetensors_info *out)
{
	if (!st || i >= st->n) {
		return ZINF_FAIL(-EINVAL, "zinf_safetensors_info: %s",
				 !st ? "NULL handle" : "no such tensor");
	}
	const struct st_tensor *x = &st->t[i];
	const struct st_file *f = &st->files[x->file];
	struct zinf_safetensors_info in = {
		.size = sizeof(in),
		.name = x->name,
		.dtype_name = st_dtypes[x->dt].name,
		.dtype = st_dtypes[x->dt].dt,
		.ndim = x->ndim,
		.numel = x->numel,
		.bytes = x->end - x->begin,
		.file = f->path,
		.offset = f->data_off + x->begin,
	};
	memcpy(in.shape, x->shape, sizeof(in.shape)); /* [ndim..) are 0 */
	return zc_stats_give(out, &in, sizeof(in), "zinf_safetensors_info");
}

int
zinf_safetensors_find(const struct zinf_safetensors *st, const char *name)
{
	if (!st || !name) {
		return ZINF_FAIL(-EINVAL, "zinf_safetensors_find: NULL %s", st ? "name" : "handle");
	}
	return st_find(st, name);
}

/* The type a read delivers: a zinf_dtype, or double (zinf_safetensors_read_f64). */
#define ST_TO_F64 (-1)

/* n elements of stored type `from` at src into dst as `to` (a zinf_dtype or ST_TO_F64). */
static void
st_convert(void *dst, int to, const void *src, enum zinf_safetensors_dtype from, size_t n)
{
	static const enum zinf_dtype zd[] = {
		[ZINF_SAFETENSORS_F32] = ZINF_F32,
		[ZINF_SAFETENSORS_F16] = ZINF_F16,
		[ZINF_SAFETENSORS_BF16] = ZINF_BF16,
	};
	if (to == ST_TO_F64) {
		double *d = dst;
		for (size_t k = 0; k < n; k++) {
			d[k] = from == ZINF_SAFETENSORS_F64 ? ((const double *)src)[k]
							    : (double)dt_load(src, zd[from], k);
		}
	} else if (from != ZINF_SAFETENSORS_F64) {
		/* checked types: cannot fail */
		zinf_dtype_convert(dst, (enum zinf_dtype)to, src, zd[from], n);
	} else {
		for (size_t k = 0; k < n; k++) {
			dt_store(dst, (enum zinf_dtype)to, k, (float)((const double *)src)[k]);
		}
	}
}

static int
st_read(const struct zinf_safetensors *st, const char *fn, uint32_t i, uint64_t first,
	uint64_t count, int to, void *out)
{
	size_t osz = to == ST_TO_F64 ? sizeof(double) : zinf_dtype_size((enum zinf_dtype)to);
	if (!st || i >= st->n || !osz || (count && !out)) {
		return ZINF_FAIL(-EINVAL, "%s: %s", fn,
				 !st	      ? "NULL handle"
				 : i >= st->n ? "no such tensor"
				 : !osz	      ? "unknown dtype"
					      : "NULL out");
	}
	const struct st_tensor *x = &st->t[i];
	const struct st_file *f = &st->files[x->file];
	const struct st_dtype_def *d = &st_dtypes[x->dt];
	if (first > x->numel || count > x->numel - first) {
		return ZINF_OBJ_FAIL(f->path, -EINVAL,
				     "tensor \"%s\": elements [%" PRIu64 ", %" PRIu64 " + %" PRIu64
				     ") past its %" PRIu64,
				     x->name, first, first, count, x->numel);
	}
	if (d->dt == ZINF_SAFETENSORS_OTHER) {
		return ZINF_OBJ_FAIL(f->path, -EOPNOTSUPP,
				     "tensor \"%s\" is stored as %s; zinf reads F32, F16, BF16 and "
				     "F64",
				     x->name, d->name);
	}
	if (count == 0) {
		return 0;
	}
	size_t ssz = d->bits / 8;
	uint64_t pos = f->data_off + x->begin + first * ssz;
	bool same = (d->dt == ZINF_SAFETENSORS_F32 && to == ZINF_F32) ||
		    (d->dt == ZINF_SAFETENSORS_F16 && to == ZINF_F16) ||
		    (d->dt == ZINF_SAFETENSORS_BF16 && to == ZINF_BF16) ||
		    (d->dt == ZINF_SAFETENSORS_F64 && to == ST_TO_F64);
	if (same) {
		return st_pread_full(f->fd, f->path, out, count * ssz, pos);
	}
	uint64_t per = ST_BOUNCE_BYTES / ssz;
	size_t cap = (size_t)ZINF_MIN(count, per);
	void *buf = zc_malloc(cap * ssz);
	if (!buf) {
		return -ENOMEM;
	}
	int rc = 0;
	for (uint64_t done = 0; done < count && !rc; done += cap) {
		size_t k = (size_t)ZINF_MIN((uint64_t)cap, count - done);
		rc = st_pread_full(f->fd, f->path, buf, (uint64_t)k * ssz, pos + done * ssz);
		if (!rc) {
			st_convert((char *)out + done * osz, to, buf, d->dt, k);
		}
	}
	zc_free(buf);
	return rc;
}

int
zinf_safetensors_read(const struct zinf_safetensors *st, uint32_t i, uint64_t first, uint64_t count,
		      enum zinf_dtype dtype, void *out)
{
	if (!zinf_dtype_size(dtype)) {
		return ZINF_FAIL(-EINVAL, "zinf_safetensors_read: unknown dtype %d", (int)dtype);
	}
	return st_read(st, __func__, i, first, count, (int)dtype, out);
}

int
zinf_safetensors_read_f64(const struct zinf_safetensors *st, uint32_t i, uint64_t first,
			  uint64_t count, double *out)
{
	return st_read(st, __func__, i, first, count, ST_TO_F64, out);
}
