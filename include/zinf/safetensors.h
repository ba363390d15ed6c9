/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zinf/safetensors.h: reading and writing Hugging Face safetensors checkpoints: one
 * .safetensors file, or shards with their model.safetensors.index.json. The trainer's API
 * (zinf/zinf.h includes it).
 *
 * The format (https://github.com/huggingface/safetensors): an 8-byte little-endian header length
 * N, N bytes of JSON ({"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]},
 * ..., "__metadata__": {"format": "pt"}}, padded with spaces), then the data section: every
 * tensor's elements, little-endian, row-major, at [begin, end) of the section, the tensors
 * tiling it without hole or overlap. A sharded checkpoint is several such files plus an index,
 * {"metadata": {"total_size": ...}, "weight_map": {"name": "model-00001-of-00003.safetensors",
 * ...}}, the shards in the index's directory.
 *
 * Memory is bounded by the caller: the reader holds the tensor table (names, shapes, offsets),
 * never the data, and reads a range of elements with pread into the caller's buffer (converting
 * through a bounce buffer of at most 1 MiB); the writer streams the caller's ranges into place.
 * A checkpoint of 140 GB is read and written with a few MB of memory. Little-endian hosts only.
 */
#ifndef ZINF_SAFETENSORS_H
#define ZINF_SAFETENSORS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zinf/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Dimensions a tensor may have (a scalar has 0). */
#define ZINF_SAFETENSORS_MAX_DIMS 8
/** Largest JSON header read or written, bytes (the Rust crate's MAX_HEADER_SIZE). */
#define ZINF_SAFETENSORS_MAX_HEADER 100000000ull

/** A stored element type, as far as zinf reads it. */
enum zinf_safetensors_dtype {
	ZINF_SAFETENSORS_OTHER = 0, /* a type of the format zinf does not read (I64, U8, F8_E4M3,
				       ...): listed with its name, refused by the read */
	ZINF_SAFETENSORS_F32 = 1,
	ZINF_SAFETENSORS_F16 = 2,
	ZINF_SAFETENSORS_BF16 = 3,
	ZINF_SAFETENSORS_F64 = 4, /* read as f32 (rounded to nearest even), then as asked */
};

/* ---- reading ------------------------------------------------------------------------------ */

struct zinf_safetensors; /* an opened checkpoint: every header parsed and checked */

/**
 * Open a checkpoint: `path` is a .safetensors file, an index (a file whose name ends in
 * ".index.json", whose weight_map names shard files in its own directory), or a directory
 * holding model.safetensors or, when it has none, model.safetensors.index.json (transformers'
 * from_pretrained order: both there, the single file is read). Symbolic links are
 * followed (the Hugging Face cache is made of them); only regular files are read. Every file's
 * header is read and checked, no data is read; one descriptor per file stays open until
 * zinf_safetensors_close().
 *
 * Checked, each refusal naming the file, the tensor and the value:
 *  - the header length (past the file, or above ZINF_SAFETENSORS_MAX_HEADER), that the header
 *    is a JSON object (jansson; duplicate keys refused) starting with '{';
 *  - each tensor: dtype one of the format's (BOOL, U8, I8, I16, U16, I32, U32, I64, U64, F16,
 *    BF16, F32, F64, C64, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ, F4, F6_E2M3,
 *    F6_E3M2), at most ZINF_SAFETENSORS_MAX_DIMS dimensions, shape product x dtype size equal
 *    to the span of data_offsets, offsets inside the data section; the tensors tiling the data
 *    section exactly (no overlap, no hole, nothing after the last), as the format requires;
 *  - an index: weight_map an object of shard names (one component: no '/', not "." or ".."),
 *    every shard present, every tensor it maps held by that shard, every tensor of a shard
 *    mapped to it, and no name in two shards.
 *
 * Returns 0 and sets *out (free with zinf_safetensors_close()), or a negative errno, leaving *out
 * untouched: -EINVAL NULL argument; -ENOENT a missing file, shard or directory entry (named);
 * -EBADMSG a file or index that breaks a rule above; -ENOMEM; -errno of open, fstat or pread.
 */
ZINF_API int zinf_safetensors_open(const char *path, struct zinf_safetensors **out);
ZINF_API void zinf_safetensors_close(struct zinf_safetensors *st); /* NULL is a no-op */

/** A tensor as its file lists it. Strings are the handle's, valid until close. */
struct zinf_safetensors_info {
	size_t size;			   /* sizeof(struct zinf_safetensors_info); set by caller */
	const char *name;		   /* "model.layers.0.self_attn.q_proj.weight" */
	const char *dtype_name;		   /* as stored: "F32", "BF16", "I64", ... */
	enum zinf_safetensors_dtype dtype; /* ZINF_SAFETENSORS_OTHER: not readable */
	uint32_t ndim;			   /* 0 (a scalar) to ZINF_SAFETENSORS_MAX_DIMS */
	uint64_t shape[ZINF_SAFETENSORS_MAX_DIMS]; /* [ndim..) are 0 */
	uint64_t numel;				   /* the product of shape (1 for a scalar) */
	uint64_t bytes;				   /* bytes of data */
	const char *file;			   /* the path of the file holding it */
	uint64_t offset; /* its first byte in that file: 8 + header + data_offsets[0] */
};

/**
 * Tensors in the checkpoint. They are numbered 0..count-1 in the order of the files (an
 * index's shards sorted by name) and, within a file, of their offsets.
 */
ZINF_API uint32_t zinf_safetensors_count(const struct zinf_safetensors *st);
/**
 * Tensor i's description into *out: the first out->size bytes of it (the caller sets out->size
 * to sizeof(struct zinf_safetensors_info)). Returns 0; -EINVAL (NULL, i out of range, a size
 * smaller than the size field).
 */
ZINF_API int zinf_safetensors_info(const struct zinf_safetensors *st, uint32_t i,
				   struct zinf_safetensors_info *out);
/**
 * The number of the tensor called `name`: >= 0; -ENOENT when there is none, nothing logged (the
 * caller says what a missing tensor means); -EINVAL NULL argument (logged).
 */
ZINF_API int zinf_safetensors_find(const struct zinf_safetensors *st, const char *name);
/** The path opened (the file or the index; a directory resolved to the file inside it). */
ZINF_API const char *zinf_safetensors_path(const struct zinf_safetensors *st);

/**
 * Read elements [first, first + count) of tensor i (row-major, as stored) into out as `dtype`
 * (count elements of zinf_dtype_size(dtype) bytes): stored F32, F16, BF16 or F64 converted as
 * zinf_dtype_convert() does (widening exact; to bf16 and f16 round to nearest even; F64 to f32
 * by round to nearest even first). With pread in bounded pieces, straight into out when the
 * types match, else through a bounce buffer of at most 1 MiB; nothing else is allocated. Reads
 * of one handle may run concurrently from several threads.
 * Returns 0; -EINVAL (NULL, i out of range, a range past the tensor's end, an unknown dtype);
 * -EOPNOTSUPP a stored type zinf does not read (the tensor, file and type named); -EIO a file
 * shorter than its header says (changed since open); -ENOMEM; -errno of pread.
 */
ZINF_API int zinf_safetensors_read(const struct zinf_safetensors *st, uint32_t i, uint64_t first,
				   uint64_t count, enum zinf_dtype dtype, void *out);
/**
 * The same range as double: exact for every type read (F32, F16 and BF16 widen exactly; F64 as
 * stored), for references kept in F64. Returns as zinf_safetensors_read().
 */
ZINF_API int zinf_safetensors_read_f64(const struct zinf_safetensors *st, uint32_t i,
				       uint64_t first, uint64_t count, double *out);

/* ---- writing ------------------------------------------------------------------------------ */

struct zinf_safetensors_writer; /* a checkpoint being written */

struct zinf_safetensors_writer_opts {
	size_t size;	      /* sizeof(struct zinf_safetensors_writer_opts); set by _init() */
	uint64_t shard_bytes; /* data bytes per shard at most (a larger tensor takes a shard of
				 its own); 0: one file, whatever its size */
	bool overwrite;	      /* replace what is there (see zinf_safetensors_writer_create) */
	uint8_t reserved[7];  /* zero */
};

/** Defaults: one file, no overwriting. */
ZINF_API void zinf_safetensors_writer_opts_init(struct zinf_safetensors_writer_opts *o);

/**
 * Start writing a checkpoint at `path`: a file name ending in ".safetensors"
 * ("OUT/model.safetensors"), or an existing directory, which means DIR/model.safetensors. When
 * the data is at most opts->shard_bytes (or that is 0) it is that one file; otherwise shards
 * named as transformers names them, "<stem>-00001-of-00003.safetensors" beside it, and
 * "<path>.index.json" ({"metadata": {"total_size": data bytes}, "weight_map": {...}}),
 * written after the shards. Tensors are cut as huggingface_hub cuts them
 * (split_state_dict_into_shards_factory), never one across two files: in the order added, a
 * tensor larger than shard_bytes is a shard of its own, numbered when it comes; another closes
 * the shard being filled when it would take it past shard_bytes. Every file has "__metadata__":
 * {"format": "pt"}, its header padded with spaces to a multiple of 8 bytes (the data aligned, as
 * the Rust crate writes it).
 *
 * Each file is written as ".<name>.tmp<pid>" in the same directory, fsynced and renamed into
 * place, and the directory fsynced: a crash leaves whole files or none (the index last; when
 * overwriting shards the old index is removed first, so that no index names a mix of old and
 * new shards: until the new index is in, the directory holds no loadable sharded checkpoint).
 * Without opts->overwrite the writer refuses (here, and again at each rename) when `path`, its
 * index or any shard of its stem ("<stem>-NNNNN-of-NNNNN.safetensors") exists; with it, they are
 * replaced, and what the new checkpoint does not use (an index beside a new single file, a
 * single file beside new shards, shards of another count) is removed once the new files are in
 * place, so that a loader cannot pick up stale files.
 *
 * opts may be NULL (the defaults). Returns 0 and sets *out (free with
 * zinf_safetensors_writer_destroy()); -EINVAL (NULL, a bad opts->size, a path that is neither a
 * directory nor a name ending in ".safetensors"); -ENOENT the directory does not exist;
 * -ENOTDIR it is a file; -EEXIST a file would be replaced (named); -ENAMETOOLONG; -ENOMEM.
 */
ZINF_API int zinf_safetensors_writer_create(const char *path,
					    const struct zinf_safetensors_writer_opts *opts,
					    struct zinf_safetensors_writer **out);
/**
 * Declare the next tensor: its name (unique, not "__metadata__", copied), the dtype it is stored
 * in (ZINF_F32, ZINF_F16, ZINF_BF16) and its shape (ndim 0 to ZINF_SAFETENSORS_MAX_DIMS; a
 * dimension may be 0). Every tensor is declared before the first write.
 * Returns the tensor's number (0, 1, ... in the order added); -EINVAL (a bad or duplicate name,
 * dtype or shape, a declaration after the first write, the writer failed); -ENOMEM.
 */
ZINF_API int zinf_safetensors_writer_add(struct zinf_safetensors_writer *w, const char *name,
					 enum zinf_dtype dtype, uint32_t ndim,
					 const uint64_t *shape);
/**
 * Write elements [first, first + count) of tensor i from src, whose elements are `src_dtype`
 * (converted to the stored dtype as zinf_dtype_convert() does: to bf16 and f16 round to nearest
 * even). Tensors may come in any order; within a tensor the ranges come in order (first is
 * what was written of it so far), and a range may be of any length. The first write lays the
 * files out (the header of each is written then). Memory: a conversion buffer of at most
 * 4 MiB.
 * Returns 0; -EINVAL (i out of range, a range that is not the next or goes past the end, NULL
 * src with count > 0, an unknown dtype); -ENOMEM (the conversion buffer: nothing written);
 * then errors that fail the writer (every later call returns the error, and destroy removes
 * the temporary files): laying the files out (-EEXIST: no overwrite, and a file appeared since
 * create; -EINVAL a header above ZINF_SAFETENSORS_MAX_HEADER or more than 99999 shards;
 * -ENOMEM) and I/O errors naming the file.
 */
ZINF_API int zinf_safetensors_writer_write(struct zinf_safetensors_writer *w, uint32_t i,
					   uint64_t first, uint64_t count,
					   enum zinf_dtype src_dtype, const void *src);
/**
 * Check that every tensor was written whole, fsync and rename the files into place (shards, then
 * the index), fsync the directory, and remove stale files (with overwrite). A writer with no
 * tensor writes a file of no tensor. Returns the number of data files written (1, or the
 * shards'); -EINVAL a tensor not written whole (named, with how much of it was: the writer goes
 * on), or finished already; then errors that fail the writer: -EEXIST a file appeared since
 * create (no overwrite), the layout's errors (as _write), I/O errors naming the file. After it
 * succeeds, only destroy.
 */
ZINF_API int zinf_safetensors_writer_finish(struct zinf_safetensors_writer *w);
/** Free the writer; one not finished has its temporary files removed. NULL is a no-op. */
ZINF_API void zinf_safetensors_writer_destroy(struct zinf_safetensors_writer *w);

#ifdef __cplusplus
}
#endif
#endif
