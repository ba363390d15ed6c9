/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ckpt/ckpt_export.c: zinf_ckpt_export: a checkpoint's fp32 master weights, converted to f32,
 * bf16 or f16, as safetensors through the writer of zinf/safetensors.h (safetensors_write.c:
 * above shard_bytes, shards named as Hugging Face names them, "<stem>-00001-of-00003.safetensors"
 * beside `out`, and "<out>.index.json" written last), each tensor streamed through
 * zinf_ckpt_read in pieces of EXPORT_PIECE elements. Not here: optimizer state (not exported),
 * reading the manifest (ckpt_read.c), the file format (safetensors_write.c).
 */
#include <assert.h>
#include <errno.h>
#include <string.h>

#include "common/util.h"
#include "zinf/checkpoint.h"
#include "zinf/safetensors.h"

static_assert(ZINF_SAFETENSORS_MAX_DIMS == ZINF_CKPT_MAX_DIMS,
	      "a checkpoint's shapes fit a file's");

/* Elements per read and write (the buffer: 4 MiB of f32). */
#define EXPORT_PIECE (1u << 20)

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
	/* the command line asks before replacing (zinf checkpoint export --force); the engine's
	   save writes into its own temporary directory */
	struct zinf_safetensors_writer_opts o;
	zinf_safetensors_writer_opts_init(&o);
	o.shard_bytes = shard_bytes;
	o.overwrite = true;
	struct zinf_safetensors_writer *w = NULL;
	if ((rc = zinf_safetensors_writer_create(out, &o, &w))) {
		return rc;
	}
	uint64_t most = 0;
	for (uint32_t i = 0; i < info.n_params && rc >= 0; i++) {
		struct zinf_ckpt_param p = {.size = sizeof(p)};
		rc = zinf_ckpt_param(c, i, &p);
		if (!rc) {
			rc = zinf_safetensors_writer_add(w, p.name, dtype, p.ndim, p.shape);
		}
		most = ZINF_MAX(most, p.numel);
	}
	size_t piece = (size_t)ZINF_MIN(most, (uint64_t)EXPORT_PIECE);
	void *buf = rc < 0 ? NULL : zc_malloc((piece ? piece : 1) * zinf_dtype_size(dtype));
	if (rc >= 0 && !buf) {
		rc = -ENOMEM;
	}
	for (uint32_t i = 0; i < info.n_params && rc >= 0; i++) {
		struct zinf_ckpt_param p = {.size = sizeof(p)};
		rc = zinf_ckpt_param(c, i, &p);
		for (uint64_t e = 0; rc >= 0 && e < p.numel; e += piece) {
			uint64_t n = ZINF_MIN((uint64_t)piece, p.numel - e);
			rc = zinf_ckpt_read(c, i, 0, e, n, dtype, buf);
			if (!rc) {
				rc = zinf_safetensors_writer_write(w, i, e, n, dtype, buf);
			}
		}
	}
	if (rc >= 0) {
		rc = zinf_safetensors_writer_finish(w);
	}
	zc_free(buf);
	zinf_safetensors_writer_destroy(w);
	return rc < 0 ? rc : 0;
}
