/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ckpt/safetensors_internal.h: the safetensors writer (safetensors.c), shared by the offline
 * export (ckpt_export.c) and the engine's save (model.safetensors). The caller streams each
 * tensor's elements through a callback in bounded pieces; nothing holds a whole tensor. Not
 * installed.
 */
#ifndef ZINF_ENGINE_SAFETENSORS_INTERNAL_H
#define ZINF_ENGINE_SAFETENSORS_INTERNAL_H

#include <stdint.h>

#include "zinf/common.h"

/* Elements per fill call (the writer's buffer: 4 MiB of f32). */
#define ST_PIECE_ELEMS (1u << 20)
/* Dimensions a tensor may have. */
#define ST_MAX_DIMS 8

struct st_tensor {
	const char *name;      /* the key in the header; unique within a file */
	enum zinf_dtype dtype; /* F32, F16 or BF16 on disk */
	uint32_t ndim;	       /* 1 to ST_MAX_DIMS */
	uint64_t shape[ST_MAX_DIMS];
	uint64_t numel; /* the product of shape */
};

/*
 * Fill out (count elements of tensor i's dtype) with tensor i's elements [first, first + count);
 * count <= ST_PIECE_ELEMS. Returns 0 or a negative errno (logged by the callee).
 */
typedef int (*st_fill_fn)(void *ctx, uint32_t i, uint64_t first, uint64_t count, void *out);

/* Bytes of tensor t's data. */
uint64_t st_tensor_bytes(const struct st_tensor *t);

/*
 * Write tensors t[0..n) as the safetensors file `path`: an 8-byte little-endian header length
 * N, N bytes of JSON ({"name": {"dtype", "shape", "data_offsets"}, ..., "__metadata__":
 * {"format": "pt"}}, padded with spaces to a multiple of 8), then the data, tensors in order
 * and contiguous. Written as ".<name>.tmp<pid>" in the same directory, fsynced, renamed over
 * `path`, the directory fsynced: `path` is never a half file. Returns 0; -EINVAL (a bad tensor,
 * named); I/O errors naming the file; the callback's errors.
 */
int st_write(const char *path, const struct st_tensor *t, uint32_t n, st_fill_fn fill, void *ctx);

/*
 * Write `text` (len bytes) as `path` the same way (temporary name, fsync, rename, fsync of the
 * directory). Returns 0 or an I/O error naming the file.
 */
int st_write_small(const char *path, const void *text, size_t len);

#endif
