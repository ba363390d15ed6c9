/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ckpt/safetensors.c: writing one safetensors file (safetensors_internal.h): the JSON header
 * (built with jansson, keys in the tensors' order, padded with spaces to a multiple of 8 so that
 * the data starts aligned), then each tensor's bytes streamed from the caller's callback in
 * pieces of ST_PIECE_ELEMS elements, under a temporary name that is fsynced and renamed into
 * place (ckpt_atomic_open/close in ckpt_fs.c). Elements are written as they are in memory:
 * little-endian hosts only (x86-64, arm64), like the rest of zinf's files. Not here: sharding
 * and the index (ckpt_export.c), reading.
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
#include "common/util.h"
#include "ckpt/safetensors_internal.h"

static const char *
st_dtype(enum zinf_dtype d)
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

uint64_t
st_tensor_bytes(const struct st_tensor *t)
{
	return t->numel * zinf_dtype_size(t->dtype);
}

/* The header, padded: *out (malloc'ed by jansson's allocator: free()) and its length. */
static int
make_header(const char *path, const struct st_tensor *t, uint32_t n, char **out, size_t *len)
{
	json_t *h = json_object();
	if (!h) {
		return -ENOMEM;
	}
	int rc = 0;
	uint64_t off = 0;
	for (uint32_t i = 0; i < n && !rc; i++) {
		const struct st_tensor *x = &t[i];
		uint64_t prod = 1;
		if (!x->name || !x->name[0] || !st_dtype(x->dtype) || x->ndim < 1 ||
		    x->ndim > ST_MAX_DIMS || strcmp(x->name, "__metadata__") == 0) {
			rc = ZINF_OBJ_FAIL(path, -EINVAL,
					   "tensor %u \"%s\": bad name, dtype or ndim", i,
					   x->name ? x->name : "(null)");
			break;
		}
		json_t *shape = json_array();
		for (uint32_t d = 0; d < x->ndim; d++) {
			prod *= x->shape[d];
			json_array_append_new(shape, json_integer((json_int_t)x->shape[d]));
		}
		if (prod != x->numel) {
			json_decref(shape);
			rc = ZINF_OBJ_FAIL(path, -EINVAL,
					   "tensor \"%s\": shape's product %" PRIu64
					   " differs from numel %" PRIu64,
					   x->name, prod, x->numel);
			break;
		}
		if (json_object_get(h, x->name)) {
			json_decref(shape);
			rc = ZINF_OBJ_FAIL(path, -EINVAL, "tensor \"%s\" given twice", x->name);
			break;
		}
		uint64_t b = st_tensor_bytes(x);
		json_t *e =
			json_pack("{s:s, s:o, s:[I, I]}", "dtype", st_dtype(x->dtype), "shape",
				  shape, "data_offsets", (json_int_t)off, (json_int_t)(off + b));
		if (!e) {
			rc = -ENOMEM;
		} else if (json_object_set_new(h, x->name, e)) {
			rc = ZINF_OBJ_FAIL(path, -EINVAL, "tensor %u: name is not valid UTF-8", i);
		}
		off += b;
	}
	if (!rc && json_object_set_new(h, "__metadata__", json_pack("{s:s}", "format", "pt"))) {
		rc = -ENOMEM;
	}
	char *s = NULL;
	if (!rc) {
		s = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
		if (!s) {
			rc = -ENOMEM;
		}
	}
	json_decref(h);
	if (rc) {
		return rc;
	}
	size_t l = strlen(s), padded = ZINF_ALIGN_UP(l, 8);
	char *p = realloc(s, padded + 1);
	if (!p) {
		free(s);
		return -ENOMEM;
	}
	memset(p + l, ' ', padded - l);
	p[padded] = '\0';
	*out = p;
	*len = padded;
	return 0;
}

int
st_write(const char *path, const struct st_tensor *t, uint32_t n, st_fill_fn fill, void *ctx)
{
	char *hdr = NULL;
	size_t hlen = 0;
	int rc = make_header(path, t, n, &hdr, &hlen);
	if (rc) {
		return rc;
	}
	size_t cap = 0;
	for (uint32_t i = 0; i < n; i++) {
		size_t piece = (size_t)ZINF_MIN(t[i].numel, (uint64_t)ST_PIECE_ELEMS);
		cap = ZINF_MAX(cap, piece * zinf_dtype_size(t[i].dtype));
	}
	void *buf = zc_malloc(cap ? cap : 1);
	if (!buf) {
		free(hdr);
		return -ENOMEM;
	}
	char tmp[CKPT_PATH];
	int fd = -1;
	rc = ckpt_atomic_open(path, tmp, &fd);
	if (rc) {
		goto out;
	}
	uint8_t le[8];
	for (int b = 0; b < 8; b++) {
		le[b] = (uint8_t)((uint64_t)hlen >> (8 * b));
	}
	rc = ckpt_write_full(fd, tmp, le, 8);
	if (!rc) {
		rc = ckpt_write_full(fd, tmp, hdr, hlen);
	}
	for (uint32_t i = 0; i < n && !rc; i++) {
		size_t es = zinf_dtype_size(t[i].dtype);
		for (uint64_t e = 0; e < t[i].numel && !rc; e += ST_PIECE_ELEMS) {
			uint64_t cnt = ZINF_MIN((uint64_t)ST_PIECE_ELEMS, t[i].numel - e);
			rc = fill(ctx, i, e, cnt, buf);
			if (!rc) {
				rc = ckpt_write_full(fd, tmp, buf, (size_t)cnt * es);
			}
		}
	}
	rc = ckpt_atomic_close(fd, tmp, path, rc);
out:
	zc_free(buf);
	free(hdr);
	return rc;
}

int
st_write_small(const char *path, const void *text, size_t len)
{
	char tmp[CKPT_PATH];
	int fd = -1;
	int rc = ckpt_atomic_open(path, tmp, &fd);
	if (rc) {
		return rc;
	}
	rc = ckpt_write_full(fd, tmp, text, len);
	return ckpt_atomic_close(fd, tmp, path, rc);
}
