/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ckpt/ckpt_export.c: zinf_ckpt_export: a checkpoint's fp32 master weights, converted to f32,
 * bf16 or f16, as safetensors (safetensors.c), each tensor streamed through zinf_ckpt_read in
 * bounded pieces. Above shard_bytes the tensors are cut, in order and never one across two
 * files, into shards named as Hugging Face names them ("<stem>-00001-of-00003.safetensors"
 * beside `out`), and "<out>.index.json" maps every tensor to its shard ({"metadata":
 * {"total_size": data bytes}, "weight_map": {...}}), written last. Not here: optimizer state
 * (not exported), reading the manifest (ckpt_read.c).
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "ckpt/safetensors_internal.h"
#include "zinf/checkpoint.h"

static_assert(ST_MAX_DIMS == ZINF_CKPT_MAX_DIMS, "a checkpoint's shapes fit a tensor's");

struct export_ctx {
	struct zinf_ckpt *c;
	uint32_t first; /* parameter index of the shard's tensor 0 */
	enum zinf_dtype dtype;
};

static int
fill_master(void *ctx, uint32_t i, uint64_t first, uint64_t count, void *out)
{
	struct export_ctx *x = ctx;
	return zinf_ckpt_read(x->c, x->first + i, 0, first, count, x->dtype, out);
}

static int
write_index(const char *path, const struct st_tensor *t, uint32_t n, const uint32_t *shard,
	    char *const *shard_names, uint64_t total)
{
	json_t *wm = json_object();
	json_t *o = json_pack("{s:{s:I}, s:o}", "metadata", "total_size", (json_int_t)total,
			      "weight_map", wm);
	if (!o) {
		return -ENOMEM;
	}
	int rc = 0;
	for (uint32_t i = 0; i < n && !rc; i++) {
		if (json_object_set_new(wm, t[i].name, json_string(shard_names[shard[i]]))) {
			rc = -ENOMEM;
		}
	}
	char *s = rc ? NULL : json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(o);
	if (!rc && !s) {
		rc = -ENOMEM;
	}
	if (!rc) {
		size_t l = strlen(s);
		char *p = realloc(s, l + 2);
		if (!p) {
			rc = -ENOMEM;
		} else {
			s = p;
			s[l] = '\n';
			s[l + 1] = '\0';
			rc = st_write_small(path, s, l + 1);
		}
	}
	free(s);
	return rc;
}

int
zinf_ckpt_export(struct zinf_ckpt *c, const char *out, enum zinf_dtype dtype, uint64_t shard_bytes)
{
	static const char ext[] = ".safetensors";
	size_t ol = out ? strlen(out) : 0, el = sizeof(ext) - 1;
	if (!c || !out || ol <= el || strcmp(out + ol - el, ext) != 0 || out[ol - el - 1] == '/' ||
	    zinf_dtype_size(dtype) == 0) {
		return ZINF_FAIL(-EINVAL, "zinf_ckpt_export: %s",
				 !c	? "NULL checkpoint"
				 : !out ? "NULL out"
				 : zinf_dtype_size(dtype) == 0
					 ? "unknown dtype"
					 : "out must name a file ending in \".safetensors\"");
	}
	struct zinf_ckpt_info info = {.size = sizeof(info)};
	int rc = zinf_ckpt_get_info(c, &info);
	if (rc) {
		return rc;
	}
	uint32_t n = info.n_params;
	struct st_tensor *t = zc_calloc(n ? n : 1, sizeof(*t));
	uint32_t *shard = zc_calloc(n ? n : 1, sizeof(*shard));
	char **names = NULL;
	uint32_t n_shards = 0;
	if (!t || !shard) {
		rc = -ENOMEM;
		goto out;
	}
	/* Cut greedily, as Hugging Face does: a tensor opens a new shard when the current one is
	   not empty and would grow past shard_bytes (a tensor larger than that is alone). */
	uint64_t total = 0, cur = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct zinf_ckpt_param p = {.size = sizeof(p)};
		if ((rc = zinf_ckpt_param(c, i, &p))) {
			goto out;
		}
		t[i] = (struct st_tensor){
			.name = p.name, .dtype = dtype, .ndim = p.ndim, .numel = p.numel};
		memcpy(t[i].shape, p.shape, sizeof(uint64_t) * p.ndim);
		uint64_t b = st_tensor_bytes(&t[i]);
		if (n_shards == 0 || (shard_bytes > 0 && cur > 0 && cur + b > shard_bytes)) {
			n_shards++;
			cur = 0;
		}
		shard[i] = n_shards - 1;
		cur += b;
		total += b;
	}
	struct export_ctx x = {.c = c, .dtype = dtype};
	if (shard_bytes == 0 || total <= shard_bytes || n_shards <= 1) {
		rc = st_write(out, t, n, fill_master, &x);
		goto out;
	}
	if (n_shards > 99999) {
		rc = ZINF_OBJ_FAIL(out, -EINVAL, "%u shards of %" PRIu64 " bytes: more than 99999",
				   n_shards, shard_bytes);
		goto out;
	}
	names = zc_calloc(n_shards, sizeof(*names));
	if (!names) {
		rc = -ENOMEM;
		goto out;
	}
	/* "<dir>/<stem>-00001-of-00003.safetensors": the index holds the base names */
	const char *slash = strrchr(out, '/');
	size_t dl = slash ? (size_t)(slash - out + 1) : 0;
	int stem = (int)(ol - el - dl);
	char path[4352];
	for (uint32_t s = 0; s < n_shards; s++) {
		char base[512];
		int bl = snprintf(base, sizeof(base), "%.*s-%05u-of-%05u.safetensors", stem,
				  out + dl, s + 1, n_shards);
		if (bl < 0 || (size_t)bl >= sizeof(base) ||
		    snprintf(path, sizeof(path), "%.*s%s", (int)dl, out, base) >=
			    (int)sizeof(path)) {
			rc = ZINF_OBJ_FAIL(out, -ENAMETOOLONG, "shard name too long");
			goto out;
		}
		names[s] = zc_strdup(base);
		if (!names[s]) {
			rc = -ENOMEM;
			goto out;
		}
	}
	for (uint32_t i = 0, s = 0; s < n_shards; s++) {
		uint32_t j = i;
		while (j < n && shard[j] == s) {
			j++;
		}
		snprintf(path, sizeof(path), "%.*s%s", (int)dl, out, names[s]);
		x.first = i;
		if ((rc = st_write(path, t + i, j - i, fill_master, &x))) {
			goto out;
		}
		i = j;
	}
	if (snprintf(path, sizeof(path), "%s.index.json", out) >= (int)sizeof(path)) {
		rc = ZINF_OBJ_FAIL(out, -ENAMETOOLONG, "index name too long");
		goto out;
	}
	rc = write_index(path, t, n, shard, names, total);
out:
	for (uint32_t s = 0; names && s < n_shards; s++) {
		zc_free(names[s]);
	}
	zc_free(names);
	zc_free(shard);
	zc_free(t);
	return rc;
}
