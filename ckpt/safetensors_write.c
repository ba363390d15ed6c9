/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ckpt/safetensors_write.c: writing safetensors checkpoints (zinf/safetensors.h): tensors are
 * declared, then the first write lays the files out (shards cut as transformers cuts them, in
 * the order declared; each file's JSON header built with jansson, keys in that order,
 * padded with spaces to a multiple of 8) and creates every file under a temporary name with its
 * header; the caller's ranges are converted and written in place with pwrite (any tensor order,
 * each tensor's ranges in order, so that one counter per tensor proves it whole); finish fsyncs
 * the shards, removes an old index (overwriting shards), renames the shards, then writes the
 * index, fsyncs the directory and, when overwriting, removes the files of an older layout. One
 * descriptor is open at a time (the last shard written). Little-endian hosts only. Not here:
 * reading (safetensors_read.c), what the tensors are (the checkpoint export, ckpt_export.c; the
 * Hugging Face export above).
 */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_fs.h"
#include "common/opts.h"
#include "common/util.h"
#include "zinf/safetensors.h"

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors files are little-endian: zinf writes them on little-endian hosts only"
#endif

#define ST_EXT	       ".safetensors"
#define ST_DEFAULT     "model" ST_EXT
#define ST_MAX_SHARDS  99999u
#define ST_WBUF_BYTES  (4u << 20) /* the conversion buffer */
#define ST_PWRITE_MAX  (1u << 30)
#define ST_SHARD_SFX_N 27 /* "-00001-of-00003.safetensors" */

struct st_wtensor {
	char *name;
	enum zinf_dtype dtype;
	uint32_t ndim;
	uint64_t shape[ZINF_SAFETENSORS_MAX_DIMS];
	uint64_t numel;
	uint64_t written; /* elements written so far: [0, written) */
	uint32_t shard;
	uint64_t pos; /* its first byte in its shard's file */
};

struct st_shard {
	char *path; /* final */
	char *tmp;  /* ".<base>.tmp<pid>" beside it */
	bool created, renamed;
};

struct zinf_safetensors_writer {
	char *dir;  /* the directory ("." when the path has none) */
	char *stem; /* "model" */
	char *path; /* dir/stem.safetensors */
	char *index;
	uint64_t shard_bytes;
	bool overwrite;
	struct st_wtensor *t;
	uint32_t n, cap;
	json_t *names; /* the names declared, a set */
	struct st_shard *sh;
	uint32_t n_sh;
	bool planned, finished;
	int err;	/* a failed writer's error */
	int fd;		/* the shard last written, open; -1: none */
	uint32_t fd_sh; /* which */
	void *buf;	/* ST_WBUF_BYTES, allocated on the first converting write */
};

/* ---- names -------------------------------------------------------------------------------- */

static char *st_fmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static char *
st_fmt(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n < 0) {
		return NULL;
	}
	char *s = zc_malloc((size_t)n + 1);
	if (s) {
		va_start(ap, fmt);
		vsnprintf(s, (size_t)n + 1, fmt, ap);
		va_end(ap);
	}
	return s;
}

/* "<stem>-NNNNN-of-NNNNN.safetensors", five digits each. */
static bool
st_is_shard_of(const char *name, const char *stem)
{
	size_t sl = strlen(stem);
	if (strncmp(name, stem, sl) != 0 || strlen(name + sl) != ST_SHARD_SFX_N) {
		return false;
	}
	const char *r = name + sl;
	static const char pat[] = "-#####-of-#####" ST_EXT;
	for (size_t k = 0; k < ST_SHARD_SFX_N; k++) {
		bool ok = pat[k] == '#' ? (r[k] >= '0' && r[k] <= '9') : r[k] == pat[k];
		if (!ok) {
			return false;
		}
	}
	return true;
}

/* The first file of the checkpoint's names that exists (path, the index, a shard of the
 * stem), as -EEXIST naming it; 0 when none. */
static int
st_check_free(const struct zinf_safetensors_writer *w)
{
	struct stat sb;
	const char *found = NULL;
	if (lstat(w->path, &sb) == 0) {
		found = w->path;
	} else if (lstat(w->index, &sb) == 0) {
		found = w->index;
	}
	if (found) {
		return ZINF_OBJ_FAIL(found, -EEXIST, "exists: not replaced (overwrite not asked)");
	}
	DIR *d = opendir(w->dir);
	if (!d) {
		int err = -errno;
		return ZINF_OBJ_FAIL(w->dir, err, "cannot list the directory: %s",
				     zinf_strerror(err));
	}
	int rc = 0;
	struct dirent *de;
	while (!rc && (de = readdir(d))) {
		if (st_is_shard_of(de->d_name, w->stem)) {
			rc = ZINF_OBJ_FAIL(w->dir, -EEXIST,
					   "holds %s, a shard of %s" ST_EXT
					   ": not replaced (overwrite not asked)",
					   de->d_name, w->stem);
		}
	}
	closedir(d);
	return rc;
}

ZINF_OPTS_NO_TAIL_PAD(struct zinf_safetensors_writer_opts, reserved);

void
zinf_safetensors_writer_opts_init(struct zinf_safetensors_writer_opts *o)
{
	if (o) {
		memset(o, 0, sizeof(*o));
		o->size = sizeof(*o);
	}
}

int
zinf_safetensors_writer_create(const char *path, const struct zinf_safetensors_writer_opts *opts,
			       struct zinf_safetensors_writer **out)
{
	struct zinf_safetensors_writer_opts o;
	zinf_safetensors_writer_opts_init(&o);
	if (!path || !path[0] || !out) {
		return ZINF_FAIL(-EINVAL, "zinf_safetensors_writer_create: %s",
				 !out ? "NULL out" : "no path");
	}
	int rc = zc_opts_take(&o, sizeof(o), opts, "zinf_safetensors_writer_opts");
	if (rc) {
		return rc;
	}
	size_t pl = strlen(path), el = strlen(ST_EXT);
	struct zinf_safetensors_writer *w = zc_calloc(1, sizeof(*w));
	if (!w) {
		return -ENOMEM;
	}
	w->fd = -1;
	w->shard_bytes = o.shard_bytes;
	w->overwrite = o.overwrite;
	struct stat sb;
	if (pl > el && strcmp(path + pl - el, ST_EXT) == 0 && path[pl - el - 1] != '/') {
		const char *slash = strrchr(path, '/');
		w->dir = slash ? st_fmt("%.*s", slash == path ? 1 : (int)(slash - path), path)
			       : zc_strdup(".");
		const char *base = slash ? slash + 1 : path;
		w->stem = st_fmt("%.*s", (int)(strlen(base) - el), base);
		w->path = zc_strdup(path);
		if (w->dir && stat(w->dir, &sb) != 0) {
			rc = ZINF_OBJ_FAIL(w->dir, -ENOENT, "no such directory (for %s)", path);
		} else if (w->dir && !S_ISDIR(sb.st_mode)) {
			rc = ZINF_OBJ_FAIL(w->dir, -ENOTDIR, "not a directory (for %s)", path);
		}
	} else if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
		w->dir = zc_strdup(path);
		w->stem = zc_strdup("model");
		w->path = st_fmt("%s%s" ST_DEFAULT, path, path[pl - 1] == '/' ? "" : "/");
	} else {
		bool missing = lstat(path, &sb) != 0;
		rc = ZINF_OBJ_FAIL(path, missing ? -ENOENT : -EINVAL,
				   "%s, and not a file name ending in " ST_EXT,
				   missing ? "no such directory" : "not a directory");
	}
	if (!rc && (!w->dir || !w->stem || !w->path)) {
		rc = -ENOMEM;
	}
	if (!rc) {
		/* the temporary names (".<base>.tmp<pid>") and the shards' must fit a path */
		w->index = st_fmt("%s.index.json", w->path);
		w->names = json_object();
		if (!w->index || !w->names) {
			rc = -ENOMEM;
		} else if (strlen(w->path) + 48 >= CKPT_PATH) {
			rc = ZINF_OBJ_FAIL(w->path, -ENAMETOOLONG, "path too long");
		}
	}
	if (!rc && !w->overwrite) {
		rc = st_check_free(w);
	}
	if (rc) {
		zinf_safetensors_writer_destroy(w);
		return rc;
	}
	*out = w;
	return 0;
}

/* ---- declaring ---------------------------------------------------------------------------- */

static const char *
st_dtype_name(enum zinf_dtype d)
{
	switch (d) {
	case ZINF_F32:
		return "F32";
	case ZINF_F16:
		return "F16";
	case ZINF_BF16:
		return "BF16";
	}
	return NULL;
}

static uint64_t
st_bytes(const struct st_wtensor *x)
{
	return x->numel * zinf_dtype_size(x->dtype);
}

int
zinf_safetensors_writer_add(struct zinf_safetensors_writer *w, const char *name,
			    enum zinf_dtype dtype, uint32_t ndim, const uint64_t *shape)
{
	if (!w || !name) {
		return ZINF_FAIL(-EINVAL, "zinf_safetensors_writer_add: NULL %s",
				 w ? "name" : "writer");
	}
	const char *p = w->path;
	if (w->err) {
		return ZINF_OBJ_FAIL(p, w->err, "tensor \"%s\": the writer failed earlier", name);
	}
	if (w->planned) {
		return ZINF_OBJ_FAIL(p, -EINVAL,
				     "tensor \"%s\": declared after the first write or finish",
				     name);
	}
	if (strcmp(name, "__metadata__") == 0) {
		return ZINF_OBJ_FAIL(p, -EINVAL, "\"__metadata__\" is not a tensor name");
	}
	if (!st_dtype_name(dtype)) {
		return ZINF_OBJ_FAIL(p, -EINVAL, "tensor \"%s\": unknown dtype %d", name,
				     (int)dtype);
	}
	if (ndim > ZINF_SAFETENSORS_MAX_DIMS || (ndim && !shape)) {
		return ZINF_OBJ_FAIL(p, -EINVAL, "tensor \"%s\": %u dimensions%s (at most %d)",
				     name, ndim, ndim && !shape ? " and no shape" : "",
				     ZINF_SAFETENSORS_MAX_DIMS);
	}
	uint64_t numel = 1, bytes;
	bool overflow = false;
	for (uint32_t d = 0; d < ndim; d++) {
		overflow |= __builtin_mul_overflow(numel, shape[d], &numel);
	}
	overflow |= __builtin_mul_overflow(numel, (uint64_t)zinf_dtype_size(dtype), &bytes);
	overflow |= bytes > (uint64_t)INT64_MAX; /* the offsets are JSON integers */
	if (overflow) {
		return ZINF_OBJ_FAIL(p, -EINVAL, "tensor \"%s\": its shape overflows 64 bits",
				     name);
	}
	if (json_object_get(w->names, name)) {
		return ZINF_OBJ_FAIL(p, -EINVAL, "tensor \"%s\" declared twice", name);
	}
	if (w->n == INT32_MAX) {
		return ZINF_OBJ_FAIL(p, -EINVAL, "more than %d tensors", INT32_MAX);
	}
	if (w->n == w->cap) {
		uint32_t cap = w->cap ? w->cap * 2 : 64;
		struct st_wtensor *t = zc_realloc(w->t, (size_t)cap * sizeof(*t));
		if (!t) {
			return -ENOMEM;
		}
		w->t = t;
		w->cap = cap;
	}
	/* a name that is not UTF-8 is refused by jansson here */
	if (json_object_set_new(w->names, name, json_true())) {
		return ZINF_OBJ_FAIL(p, -EINVAL, "tensor name \"%s\" is not valid UTF-8", name);
	}
	struct st_wtensor *x = &w->t[w->n];
	memset(x, 0, sizeof(*x));
	x->name = zc_strdup(name);
	if (!x->name) {
		json_object_del(w->names, name);
		return -ENOMEM;
	}
	x->dtype = dtype;
	x->ndim = ndim;
	if (ndim) {
		memcpy(x->shape, shape, ndim * sizeof(*shape));
	}
	x->numel = numel;
	return (int)w->n++;
}

/* ---- the layout --------------------------------------------------------------------------- */

/* Shard s's header (its tensors in the order they were added), padded to 8 bytes: *out (free())
 * and its length. Sets each of its tensors' pos. */
static int
st_header(struct zinf_safetensors_writer *w, uint32_t s, char **out, size_t *len)
{
	json_t *h = json_object();
	int rc = h ? 0 : -ENOMEM;
	uint64_t off = 0;
	for (uint32_t i = 0; i < w->n && !rc; i++) {
		struct st_wtensor *x = &w->t[i];
		if (x->shard != s) {
			continue;
		}
		json_t *shape = json_array();
		for (uint32_t d = 0; shape && d < x->ndim; d++) {
			if (json_array_append_new(shape, json_integer((json_int_t)x->shape[d]))) {
				json_decref(shape);
				shape = NULL;
			}
		}
		uint64_t nb = st_bytes(x);
		json_t *e =
			shape ? json_pack("{s:s, s:o, s:[I, I]}", "dtype", st_dtype_name(x->dtype),
					  "shape", shape, "data_offsets", (json_int_t)off,
					  (json_int_t)(off + nb))
			      : NULL;
		if (!e || json_object_set_new(h, x->name, e)) {
			rc = -ENOMEM;
		}
		x->pos = off; /* relative to the data section until the header's length is known */
		off += nb;
	}
	if (!rc && json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"))) {
		rc = -ENOMEM;
	}
	char *text = rc ? NULL : json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(h);
	if (!rc && !text) {
		rc = -ENOMEM;
	}
	if (rc) {
		return rc;
	}
	size_t l = strlen(text), padded = ZINF_ALIGN_UP(l, 8);
	if (padded > ZINF_SAFETENSORS_MAX_HEADER) {
		free(text);
		return ZINF_OBJ_FAIL(w->sh[s].path, -EINVAL,
				     "header of %zu bytes: above the cap of %llu that readers take",
				     padded, ZINF_SAFETENSORS_MAX_HEADER);
	}
	char *p = realloc(text, padded + 1);
	if (!p) {
		free(text);
		return -ENOMEM;
	}
	memset(p + l, ' ', padded - l);
	p[padded] = '\0';
	for (uint32_t i = 0; i < w->n; i++) {
		w->t[i].pos += w->t[i].shard == s ? 8 + padded : 0;
	}
	*out = p;
	*len = padded;
	return 0;
}

static int
st_pwrite_full(int fd, const char *path, const void *data, uint64_t len, uint64_t off)
{
	const char *s = data;
	uint64_t done = 0;
	while (done < len) {
		size_t want = (size_t)ZINF_MIN(len - done, (uint64_t)ST_PWRITE_MAX);
		ssize_t r = pwrite(fd, s + done, want, (off_t)(off + done));
		if (r < 0 && errno == EINTR) {
			continue;
		}
		if (r <= 0) {
			int err = r < 0 ? -errno : -EIO;
			return ZINF_OBJ_FAIL(path, err,
					     "writing %" PRIu64 " bytes at offset %" PRIu64 ": %s",
					     len, off, zinf_strerror(err));
		}
		done += (uint64_t)r;
	}
	return 0;
}

/* Shard s's temporary file, created with its header. */
static int
st_create_shard(struct zinf_safetensors_writer *w, uint32_t s)
{
	struct st_shard *sh = &w->sh[s];
	char *hdr = NULL;
	size_t hl = 0;
	int rc = st_header(w, s, &hdr, &hl);
	if (rc) {
		return rc;
	}
	int fd = open(sh->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		free(hdr);
		return ZINF_OBJ_FAIL(sh->tmp, rc, "cannot create: %s", zinf_strerror(rc));
	}
	sh->created = true;
	uint8_t le[8];
	for (int k = 0; k < 8; k++) {
		le[k] = (uint8_t)((uint64_t)hl >> (8 * k));
	}
	rc = st_pwrite_full(fd, sh->tmp, le, 8, 0);
	if (!rc) {
		rc = st_pwrite_full(fd, sh->tmp, hdr, hl, 8);
	}
	free(hdr);
	if (close(fd) != 0 && !rc) {
		rc = -errno;
		ZINF_OBJ_FAIL(sh->tmp, rc, "close: %s", zinf_strerror(rc));
	}
	return rc;
}

/*
 * Cut the tensors into shards as transformers cuts them (huggingface_hub's
 * split_state_dict_into_shards_factory), in the order added: a tensor larger than shard_bytes
 * is a shard of its own, numbered then; another closes the current shard (numbered then) when
 * it would take it past shard_bytes, and joins the next. So [400, 1200, 200, 800, 40] at 1000
 * bytes is 1: [1200], 2: [400, 200], 3: [800, 40]. Then name the shards and create every file
 * with its header.
 */
static int
st_plan(struct zinf_safetensors_writer *w)
{
	const uint32_t OPEN = UINT32_MAX; /* in the shard being filled, not numbered yet */
	uint32_t n_sh = 0;
	uint64_t cur = 0;
	bool any = false; /* the current shard holds a tensor */
	for (uint32_t i = 0; i < w->n; i++) {
		uint64_t b = st_bytes(&w->t[i]);
		if (w->shard_bytes && b > w->shard_bytes) {
			w->t[i].shard = n_sh++;
			continue;
		}
		if (w->shard_bytes && any && cur + b > w->shard_bytes) {
			for (uint32_t j = 0; j < i; j++) {
				w->t[j].shard = w->t[j].shard == OPEN ? n_sh : w->t[j].shard;
			}
			n_sh++;
			cur = 0;
		}
		w->t[i].shard = OPEN;
		cur += b;
		any = true;
	}
	if (any || n_sh == 0) { /* the last shard; no tensor: one file of none */
		for (uint32_t j = 0; j < w->n; j++) {
			w->t[j].shard = w->t[j].shard == OPEN ? n_sh : w->t[j].shard;
		}
		n_sh++;
	}
	if (n_sh > ST_MAX_SHARDS) {
		return ZINF_OBJ_FAIL(w->path, -EINVAL,
				     "%u shards of at most %" PRIu64 " bytes: more than %u", n_sh,
				     w->shard_bytes, ST_MAX_SHARDS);
	}
	if (!w->overwrite) {
		int rc = st_check_free(w);
		if (rc) {
			return rc;
		}
	}
	w->sh = zc_calloc(n_sh, sizeof(*w->sh));
	if (!w->sh) {
		return -ENOMEM;
	}
	w->n_sh = n_sh;
	const char *sep = strcmp(w->dir, "/") == 0 ? "" : "/";
	for (uint32_t s = 0; s < n_sh; s++) {
		struct st_shard *sh = &w->sh[s];
		char *base = n_sh == 1 ? st_fmt("%s" ST_EXT, w->stem)
				       : st_fmt("%s-%05u-of-%05u" ST_EXT, w->stem, s + 1, n_sh);
		if (base) {
			sh->path = st_fmt("%s%s%s", w->dir, sep, base);
			sh->tmp = st_fmt("%s%s.%s.tmp%ld", w->dir, sep, base, (long)getpid());
		}
		zc_free(base);
		if (!sh->path || !sh->tmp) {
			return -ENOMEM;
		}
	}
	w->planned = true;
	for (uint32_t s = 0; s < n_sh; s++) {
		int rc = st_create_shard(w, s);
		if (rc) {
			return rc;
		}
	}
	return 0;
}

/* ---- writing ------------------------------------------------------------------------------ */

/* An error after which the files are in an unknown state: every later call returns it. */
static int
st_fail(struct zinf_safetensors_writer *w, int rc)
{
	w->err = rc;
	return rc;
}

/* The descriptor of shard s's temporary file (the one open is closed first). */
static int
st_shard_fd(struct zinf_safetensors_writer *w, uint32_t s)
{
	if (w->fd >= 0 && w->fd_sh == s) {
		return w->fd;
	}
	if (w->fd >= 0) {
		close(w->fd);
		w->fd = -1;
	}
	int fd = open(w->sh[s].tmp, O_WRONLY | O_CLOEXEC);
	if (fd < 0) {
		int err = -errno;
		return ZINF_OBJ_FAIL(w->sh[s].tmp, err, "cannot open: %s", zinf_strerror(err));
	}
	w->fd = fd;
	w->fd_sh = s;
	return fd;
}

int
zinf_safetensors_writer_write(struct zinf_safetensors_writer *w, uint32_t i, uint64_t first,
			      uint64_t count, enum zinf_dtype src_dtype, const void *src)
{
	size_t ssz = zinf_dtype_size(src_dtype);
	if (!w || (count && !src) || !ssz) {
		return ZINF_FAIL(-EINVAL, "zinf_safetensors_writer_write: %s",
				 !w	? "NULL writer"
				 : !ssz ? "unknown source dtype"
					: "NULL src");
	}
	if (w->err) {
		return ZINF_OBJ_FAIL(w->path, w->err, "the writer failed earlier");
	}
	if (w->finished || i >= w->n) {
		return ZINF_OBJ_FAIL(w->path, -EINVAL, "write of tensor %u: %s", i,
				     w->finished ? "after finish" : "no such tensor");
	}
	struct st_wtensor *x = &w->t[i];
	if (first != x->written || count > x->numel - first) {
		return ZINF_OBJ_FAIL(w->path, -EINVAL,
				     "tensor \"%s\": elements [%" PRIu64 ", %" PRIu64 " + %" PRIu64
				     ") are not the next of its %" PRIu64 " (%" PRIu64
				     " written; ranges come in order)",
				     x->name, first, first, count, x->numel, x->written);
	}
	int rc = w->planned ? 0 : st_plan(w);
	if (rc) {
		return st_fail(w, rc);
	}
	if (count == 0) {
		return 0;
	}
	int fd = st_shard_fd(w, x->shard);
	if (fd < 0) {
		return st_fail(w, fd);
	}
	const char *tmp = w->sh[x->shard].tmp;
	size_t dsz = zinf_dtype_size(x->dtype);
	uint64_t pos = x->pos + first * dsz;
	if (src_dtype == x->dtype) {
		rc = st_pwrite_full(fd, tmp, src, count * dsz, pos);
	} else {
		if (!w->buf && !(w->buf = zc_malloc(ST_WBUF_BYTES))) {
			return -ENOMEM; /* nothing written: the writer goes on */
		}
		uint64_t per = ST_WBUF_BYTES / dsz;
		for (uint64_t done = 0; done < count && !rc; done += per) {
			size_t k = (size_t)ZINF_MIN(per, count - done);
			rc = zinf_dtype_convert(w->buf, x->dtype, (const char *)src + done * ssz,
						src_dtype, k);
			if (!rc) {
				rc = st_pwrite_full(fd, tmp, w->buf, (uint64_t)k * dsz,
						    pos + done * dsz);
			}
		}
	}
	if (rc) {
		return st_fail(w, rc);
	}
	x->written += count;
	return 0;
}

/* ---- finishing ---------------------------------------------------------------------------- */

/* Rename tmp to path: replacing it when overwriting, else refusing an existing one. */
static int
st_rename(const char *tmp, const char *path, bool overwrite)
{
	int rc = overwrite ? rename(tmp, path)
			   : renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE);
	if (rc != 0 && !overwrite && (errno == EINVAL || errno == ENOSYS)) {
		/* no RENAME_NOREPLACE here (NFS, Lustre): a check, then a plain rename */
		struct stat sb;
		if (lstat(path, &sb) == 0) {
			errno = EEXIST;
		} else {
			rc = rename(tmp, path);
		}
	}
	if (rc != 0) {
		int err = -errno;
		if (err == -EEXIST) {
			return ZINF_OBJ_FAIL(path, err,
					     "appeared while it was written: not replaced "
					     "(overwrite not asked)");
		}
		return ZINF_OBJ_FAIL(path, err, "renaming %s to it: %s", tmp, zinf_strerror(err));
	}
	return 0;
}

static int
st_fsync_file(const char *path)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0) {
		int err = -errno;
		return ZINF_OBJ_FAIL(path, err, "cannot open: %s", zinf_strerror(err));
	}
	int rc = fsync(fd) == 0 ? 0 : -errno;
	if (rc) {
		ZINF_OBJ_FAIL(path, rc, "fsync: %s", zinf_strerror(rc));
	}
	if (close(fd) != 0 && !rc) {
		rc = -errno;
		ZINF_OBJ_FAIL(path, rc, "close: %s", zinf_strerror(rc));
	}
	return rc;
}

/* The index's text, {"metadata": {"total_size": bytes}, "weight_map": {name: shard}}, keys
 * sorted and indented as transformers writes it, ending in a newline (*len bytes, no NUL), into
 * *text (free()), and its temporary name ".<base>.tmp<pid>" beside it into *tmp (zc_free()):
 * made before any shard is renamed into place, so that a failed allocation leaves no shard
 * without its index. */
static int
st_index_text(struct zinf_safetensors_writer *w, char **text, size_t *len, char **tmp)
{
	json_t *wm = json_object();
	uint64_t total = 0;
	int rc = wm ? 0 : -ENOMEM;
	for (uint32_t i = 0; i < w->n && !rc; i++) {
		const char *p = w->sh[w->t[i].shard].path, *slash = strrchr(p, '/');
		if (json_object_set_new(wm, w->t[i].name, json_string(slash ? slash + 1 : p))) {
			rc = -ENOMEM;
		}
		total += st_bytes(&w->t[i]);
	}
	json_t *o = rc ? NULL
		       : json_pack("{s:{s:I}, s:O}", "metadata", "total_size", (json_int_t)total,
				   "weight_map", wm);
	json_decref(wm);
	char *s = o ? json_dumps(o, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
	json_decref(o);
	const char *slash = strrchr(w->index, '/');
	size_t dl = slash ? (size_t)(slash - w->index + 1) : 0;
	char *t = s ? st_fmt("%.*s.%s.tmp%ld", (int)dl, w->index, w->index + dl, (long)getpid())
		    : NULL;
	if (!t) {
		free(s);
		return ZINF_OBJ_FAIL(w->index, -ENOMEM, "no memory for the index");
	}
	*len = strlen(s) + 1;
	s[*len - 1] = '\n'; /* over the NUL: the text's length is known */
	*text = s;
	*tmp = t;
	return 0;
}

/* The index written from its text (st_index_text; both freed here) and renamed into place. */
static int
st_write_index(struct zinf_safetensors_writer *w, char *s, size_t len, char *tmp)
{
	int rc, fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		rc = -errno;
		ZINF_OBJ_FAIL(tmp, rc, "cannot create: %s", zinf_strerror(rc));
	} else {
		rc = st_pwrite_full(fd, tmp, s, len, 0);
		if (!rc && fsync(fd) != 0) {
			rc = -errno;
			ZINF_OBJ_FAIL(tmp, rc, "fsync: %s", zinf_strerror(rc));
		}
		if (close(fd) != 0 && !rc) {
			rc = -errno;
			ZINF_OBJ_FAIL(tmp, rc, "close: %s", zinf_strerror(rc));
		}
		if (!rc) {
			rc = st_rename(tmp, w->index, w->overwrite);
		}
		if (rc) {
			unlink(tmp);
		}
	}
	zc_free(tmp);
	free(s);
	return rc;
}

/* Overwriting: the files of another layout that a loader could take for this one. */
static int
st_remove_stale(struct zinf_safetensors_writer *w)
{
	int rc = 0;
	if (w->n_sh == 1 && unlink(w->index) != 0 && errno != ENOENT) {
		rc = -errno;
		return ZINF_OBJ_FAIL(w->index, rc, "removing the stale index: %s",
				     zinf_strerror(rc));
	}
	if (w->n_sh > 1 && unlink(w->path) != 0 && errno != ENOENT) {
		rc = -errno;
		return ZINF_OBJ_FAIL(w->path, rc, "removing the stale file: %s", zinf_strerror(rc));
	}
	DIR *d = opendir(w->dir);
	if (!d) {
		rc = -errno;
		return ZINF_OBJ_FAIL(w->dir, rc, "cannot list the directory: %s",
				     zinf_strerror(rc));
	}
	struct dirent *de;
	char suffix[32];
	snprintf(suffix, sizeof(suffix), "-of-%05u" ST_EXT, w->n_sh);
	while (!rc && (de = readdir(d))) {
		const char *nm = de->d_name;
		if (!st_is_shard_of(nm, w->stem) ||
		    (w->n_sh > 1 && strcmp(nm + strlen(nm) - strlen(suffix), suffix) == 0)) {
			continue; /* not a shard, or one of the new set */
		}
		char *p = st_fmt("%s/%s", w->dir, nm);
		if (!p) {
			rc = -ENOMEM;
		} else if (unlink(p) != 0 && errno != ENOENT) {
			rc = -errno;
			ZINF_OBJ_FAIL(p, rc, "removing the stale shard: %s", zinf_strerror(rc));
		}
		zc_free(p);
	}
	closedir(d);
	return rc;
}

int
zinf_safetensors_writer_finish(struct zinf_safetensors_writer *w)
{
	if (!w) {
		return ZINF_FAIL(-EINVAL, "zinf_safetensors_writer_finish: NULL writer");
	}
	if (w->err) {
		return ZINF_OBJ_FAIL(w->path, w->err, "the writer failed earlier");
	}
	if (w->finished) {
		return ZINF_OBJ_FAIL(w->path, -EINVAL, "finished already");
	}
	for (uint32_t i = 0; i < w->n; i++) {
		if (w->t[i].written != w->t[i].numel) {
			return ZINF_OBJ_FAIL(w->path, -EINVAL,
					     "tensor \"%s\": %" PRIu64 " of its %" PRIu64
					     " elements written",
					     w->t[i].name, w->t[i].written, w->t[i].numel);
		}
	}
	int rc = w->planned ? 0 : st_plan(w);
	if (w->fd >= 0) {
		close(w->fd);
		w->fd = -1;
	}
	for (uint32_t s = 0; s < w->n_sh && !rc; s++) {
		rc = st_fsync_file(w->sh[s].tmp);
	}
	char *index = NULL, *index_tmp = NULL;
	size_t index_len = 0;
	if (!rc && w->n_sh > 1) {
		rc = st_index_text(w, &index, &index_len, &index_tmp);
	}
	/* Overwriting shards: the old index goes first, so that until the new one is in no index
	   names a mix of new and old shards (a loader finds nothing, rather than a mixed model; a
	   single file there is the old model, whole, which loaders take before an index) */
	if (!rc && w->overwrite && w->n_sh > 1 && unlink(w->index) != 0 && errno != ENOENT) {
		rc = -errno;
		ZINF_OBJ_FAIL(w->index, rc, "cannot remove the old index: %s", zinf_strerror(rc));
	}
	if (!rc && w->overwrite && w->n_sh > 1) {
		rc = ckpt_fsync_path(w->dir, true);
	}
	for (uint32_t s = 0; s < w->n_sh && !rc; s++) {
		rc = st_rename(w->sh[s].tmp, w->sh[s].path, w->overwrite);
		w->sh[s].renamed = rc == 0;
	}
	if (index && !rc) {
		rc = st_write_index(w, index, index_len, index_tmp);
	} else if (index) {
		free(index);
		zc_free(index_tmp);
	}
	if (!rc) {
		rc = ckpt_fsync_path(w->dir, true);
	}
	if (!rc && w->overwrite) {
		rc = st_remove_stale(w);
		if (!rc) {
			rc = ckpt_fsync_path(w->dir, true);
		}
	}
	if (rc) {
		return st_fail(w, rc);
	}
	w->finished = true;
	return (int)w->n_sh;
}

void
zinf_safetensors_writer_destroy(struct zinf_safetensors_writer *w)
{
	if (!w) {
		return;
	}
	if (w->fd >= 0) {
		close(w->fd);
	}
	for (uint32_t s = 0; s < w->n_sh; s++) {
		if (w->sh[s].created && !w->sh[s].renamed) {
			unlink(w->sh[s].tmp);
		}
		zc_free(w->sh[s].path);
		zc_free(w->sh[s].tmp);
	}
	for (uint32_t i = 0; i < w->n; i++) {
		zc_free(w->t[i].name);
	}
	free(w->t);
	zc_free(w->sh);
	zc_free(w->buf);
	json_decref(w->names);
	zc_free(w->index);
	zc_free(w->path);
	zc_free(w->stem);
	zc_free(w->dir);
	zc_free(w);
}
