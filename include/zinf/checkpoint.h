/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zinf/checkpoint.h: checkpoints of the engine's training state, and reading them offline.
 * The trainer's API (zinf/zinf.h includes it).
 *
 * A checkpoint is a directory DIR/TAG holding the complete training state of every rank: the
 * fp32 master weights and the optimizer state (wherever they live: GPU, pinned CPU memory,
 * NVMe swap files, which are copied through the I/O engine in bounded pieces, never whole
 * through host memory), the step counts, the loss scaler, the learning rate, the resolved
 * options, the parameter table and the trainer's own state (an opaque blob). The 16-bit
 * parameters are not stored: they are the master weights rounded to opts.dtype, regenerated
 * bit for bit at load (the engine keeps that invariant after every step).
 *
 * On disk (format version 1; docs/CHECKPOINT.md has every field):
 *   DIR/latest                   the tag of the newest complete checkpoint, one line
 *   DIR/TAG/manifest.json        what is in it: format, version, step, world, options,
 *                                parameters and their partitions, every file with its bytes
 *                                and CRC32C
 *   DIR/TAG/manifest.crc32c      manifest.json's own CRC32C
 *   DIR/TAG/r<rank>.<part>       rank's flat partition of one state part ("fp32", "exp_avg",
 *                                "exp_avg_sq", ...), raw little-endian elements
 *   DIR/TAG/client.bin           the trainer's blob (when given)
 *   DIR/TAG/model.safetensors    consolidated 16-bit weights (gather_16bit), optional
 *
 * Crash safety: a save writes DIR/.TAG.tmp, fsyncs every file and the directory, then renames
 * it into place (an existing TAG is swapped out atomically with RENAME_EXCHANGE and removed;
 * where the file system has no RENAME_EXCHANGE, NFS and Lustre, a new tag is renamed in and an
 * existing one is kept: -EOPNOTSUPP),
 * fsyncs DIR, and replaces `latest` the same way (write, fsync, rename, fsync). A process
 * killed at any moment leaves the previous checkpoint loadable. Saves into one DIR are
 * serialised by a lock (DIR/.zinf-ckpt.lock): two saves never race.
 *
 * DIR must be one directory that every rank sees (a local disk for ranks of one node, a shared
 * file system across nodes): rank 0 makes the temporary directory and every rank writes its
 * files into it; a rank that cannot is an error on every rank.
 */
#ifndef ZINF_CHECKPOINT_H
#define ZINF_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zinf/common.h"
#include "zinf/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Format version this library writes and reads. */
#define ZINF_CKPT_VERSION 1
/** Longest tag (bytes, without the terminating NUL): letters, digits, '.', '_', '-'; not
 * starting with '.'. */
#define ZINF_CKPT_MAX_TAG 128

/* ---- save and load (the engine; collective: every rank calls them) ------------------------- */

/*
 * A save's progress (zinf_ckpt_opts.progress): called with the save's tag at each named point it
 * passes, in this order:
 *   "files"      every rank: every stored rank's files are written and fsynced (all agreed)
 *   "manifest"   rank 0: manifest.json, client.bin and model.safetensors are in DIR/.TAG.tmp
 *   "tmp_synced" rank 0: DIR/.TAG.tmp is fsynced
 *   "swapped"    rank 0, only when DIR/TAG existed: the new TAG swapped in, the old one at
 *                DIR/.TAG.tmp (removed next)
 *   "renamed"    rank 0: DIR/TAG is the new checkpoint and DIR is fsynced
 *   "latest_tmp" rank 0: DIR/.latest.tmp names TAG
 *   "latest"     rank 0: DIR/latest names TAG (the save is complete)
 * A save that fails stops calling it. It runs on the thread that publishes the save: the one in
 * zinf_engine_save, or for a background save the zinf_engine_* call that publishes it (never
 * the thread writing the files); the engine waits for it, so it should return soon. Useful for
 * logging a save's progress, and for crash tests (a trainer that kills itself at a point: every
 * point leaves `latest` naming a complete checkpoint). The library itself never kills.
 */
typedef void (*zinf_ckpt_progress_cb)(void *ctx, const char *point, const char *tag);

struct zinf_ckpt_opts {
	size_t size; /* sizeof(struct zinf_ckpt_opts); set by zinf_ckpt_opts_init() */
	/* save: the trainer's state (data position, RNG, ...), stored as client.bin (rank 0's) */
	const void *client;
	uint64_t client_bytes;
	/* load: receives client.bin (up to client_cap bytes); client_len is set to its size
	   (larger than client_cap: -ENOSPC, nothing loaded) */
	void *client_out;
	uint64_t client_cap;
	uint64_t client_len;
	/* save: also write the consolidated 16-bit weights (opts.dtype; f32 for fp32 training) as
	   model.safetensors: -1 (default): the engine option
	   stage3_gather_16bit_weights_on_model_save; 0 no; 1 yes */
	int32_t gather_16bit;
	/* load: check every file's CRC32C before anything is loaded (default true); without it a
	   corrupted byte is found only while loading, which then fails the engine */
	bool verify;
	/* save: write the files while training goes on (default false). zinf_engine_save then
	   returns once the directory is prepared; a thread writes this rank's files; the save is
	   published (manifest, rename, `latest`) by the first of these collective calls on every
	   rank: the first zinf_engine_grad of the next step's last micro-batch (before the
	   optimizer may change the state being copied: the step waits there for the copy),
	   zinf_engine_step, zinf_engine_save, zinf_engine_load, zinf_engine_read_master or
	   zinf_engine_save_wait. zinf_engine_destroy abandons one not yet published. */
	bool background;
	uint8_t reserved[2]; /* zero */
	/* save: called at each named point of the save (NULL, the default: not called); ctx is
	   passed back and must stay valid until the save is published (a background save: until
	   the call that publishes it returns) */
	zinf_ckpt_progress_cb progress;
	void *progress_ctx;
};

ZINF_API void zinf_ckpt_opts_init(struct zinf_ckpt_opts *o);

/**
 * Save the training state into DIR/TAG (tag NULL: "step<steps>", e.g. "step120") and point
 * DIR/latest at it. Between optimizer steps (not inside an accumulation window). DIR is
 * created if missing (its parent must exist). Every rank returns the same result. Returns 0;
 * -EINVAL (NULL engine or dir, bad tag naming it, inside a window, before init, rank 0's
 * client_bytes with a NULL client; the other ranks' client fields are not read); -EBUSY
 * (another process holds DIR's lock, naming its pid); -ENOSPC (bytes needed and free);
 * -EOPNOTSUPP (TAG exists on a file system without RENAME_EXCHANGE);
 * I/O errors naming the file. A failure before the rename into DIR/TAG leaves the previous
 * checkpoints and `latest` untouched; one after it (the fsync of DIR, writing `latest`) leaves
 * TAG holding the new, complete checkpoint and `latest` naming the old or the new one, both
 * loadable. Either way the engine goes on as it was (a save never fails the engine).
 */
ZINF_API int zinf_engine_save(struct zinf_engine *e, const char *dir, const char *tag,
			      const struct zinf_ckpt_opts *opts);

/**
 * Publish the background save in flight (collective; waits for every rank's files) and return
 * its result; with none in flight, the result of the last background save published
 * implicitly (then 0). A background save's errors are reported here: the implicit publication
 * inside a training call logs them and lets training go on.
 */
ZINF_API int zinf_engine_save_wait(struct zinf_engine *e);

/**
 * Load DIR/TAG (tag NULL: the one DIR/latest names) into the engine. Called in place of
 * zinf_engine_init() (the engine is initialised from the checkpoint: no initial value is
 * written), or after it between optimizer steps with no layer fetched. The parameters
 * registered must be those
 * saved (names, element counts, in the same order); the world size and the ZeRO stage, the
 * sub-group size, the tiers may differ (the partitions are re-cut; host memory stays bounded,
 * a sub-group at a time). The optimizer kind and its state dtype must match. Restores the
 * step count, the loss scaler (an fp16 engine keeps its own when the checkpoint's run did not
 * scale its loss: scale 0), the learning rate, and the client blob (opts). Returns 0;
 * -ENOENT (no checkpoint, naming the path); -EBADMSG (a file corrupted, truncated or missing,
 * named with what is wrong; nothing loaded); -EINVAL (a parameter or option that differs,
 * named; NULL arguments; a layer still fetched); I/O errors. Refusals before anything is loaded
 * leave the engine as it was; a failure while loading fails it (its state is half loaded).
 */
ZINF_API int zinf_engine_load(struct zinf_engine *e, const char *dir, const char *tag,
			      struct zinf_ckpt_opts *opts);

/* ---- reading a checkpoint offline (no engine, no device: export, inspect) ------------------ */

struct zinf_ckpt; /* an opened checkpoint: its manifest parsed and checked */

/**
 * Open DIR/TAG (tag NULL: DIR/latest's; dir may also name the TAG directory itself, holding
 * manifest.json). Checks the manifest (format, version, fields, partitions tiling each rank's
 * files) and that every file it lists exists with its size; does not read the data. `latest`,
 * the TAG directory and every file in it are opened relative to DIR and TAG with no symbolic
 * link followed, regular files only. Returns 0 and sets *out; -ENOENT, -EBADMSG (naming the
 * file and what is wrong: a symbolic link or special file among them), -ENOMEM.
 */
ZINF_API int zinf_ckpt_open(const char *dir, const char *tag, struct zinf_ckpt **out);
ZINF_API void zinf_ckpt_close(struct zinf_ckpt *c);

struct zinf_ckpt_info {
	size_t size;	  /* set by the caller */
	const char *path; /* the TAG directory */
	const char *tag;
	int64_t steps; /* optimizer steps taken */
	uint64_t micro_steps;
	int32_t world; /* ranks that saved it */
	int32_t stage;
	enum zinf_dtype dtype; /* the 16-bit dtype (or f32) */
	uint32_t n_params;
	uint32_t n_parts; /* state parts per element, master included */
	uint32_t n_files;
	uint64_t bytes;	       /* all files */
	const char *optimizer; /* "adamw", ... */
};
ZINF_API int zinf_ckpt_get_info(const struct zinf_ckpt *c, struct zinf_ckpt_info *out);

#define ZINF_CKPT_MAX_DIMS 8

struct zinf_ckpt_param {
	size_t size; /* set by the caller */
	const char *name;
	uint64_t numel;
	int32_t layer;
	uint32_t ndim; /* 1 and shape {numel} unless the trainer gave a shape */
	uint64_t shape[ZINF_CKPT_MAX_DIMS];
};
ZINF_API int zinf_ckpt_param(const struct zinf_ckpt *c, uint32_t i, struct zinf_ckpt_param *out);

struct zinf_ckpt_part {
	size_t size;	       /* set by the caller */
	const char *name;      /* "fp32", "exp_avg", ... */
	enum zinf_dtype dtype; /* of its elements */
	uint32_t reserved;
};
ZINF_API int zinf_ckpt_part(const struct zinf_ckpt *c, uint32_t part, struct zinf_ckpt_part *out);

/**
 * Elements [first, first + count) of parameter i's state part `part` (0: the fp32 master),
 * converted to `dtype` into out, gathered from the ranks' files that hold them (pread; no
 * other memory). Returns 0; -EINVAL (out of range); I/O errors naming the file.
 */
ZINF_API int zinf_ckpt_read(struct zinf_ckpt *c, uint32_t i, uint32_t part, uint64_t first,
			    uint64_t count, enum zinf_dtype dtype, void *out);

struct zinf_ckpt_file {
	size_t size; /* set by the caller */
	const char *name;
	uint64_t bytes;
	uint32_t crc32c; /* from the manifest */
	uint32_t reserved;
};
ZINF_API uint32_t zinf_ckpt_file_count(const struct zinf_ckpt *c);
ZINF_API int zinf_ckpt_file(const struct zinf_ckpt *c, uint32_t i, struct zinf_ckpt_file *out);
/**
 * Read file i whole and compare its CRC32C and size with the manifest. Returns 0 when they
 * match; -EBADMSG naming the file and what differs; I/O errors.
 */
ZINF_API int zinf_ckpt_verify_file(struct zinf_ckpt *c, uint32_t i);

/**
 * Write the consolidated weights (the fp32 masters, converted to dtype: f32, bf16 or f16) as
 * safetensors: one file `out`, or above shard_bytes (0: no limit) shards named as Hugging Face
 * names them (model-00001-of-00003.safetensors next to out) plus out's ".index.json"
 * (out must end in ".safetensors"). Streams a parameter at a time in bounded pieces. What is
 * there is replaced: out, and the index and shards of an earlier export to the same name (of
 * any shard count), which are removed once the new files are in (zinf_safetensors_writer with
 * overwrite; the zinf command asks for --force first). Returns 0, -EINVAL, I/O errors naming
 * the file.
 */
ZINF_API int zinf_ckpt_export(struct zinf_ckpt *c, const char *out, enum zinf_dtype dtype,
			      uint64_t shard_bytes);

/** zinf_ckpt_export_hf's default shard size: transformers 5's save_pretrained("50GB"). */
#define ZINF_CKPT_HF_SHARD_BYTES 50000000000ull
/** zinf_ckpt_export_hf's default buffer_bytes (8 MiB). */
#define ZINF_CKPT_HF_BUFFER_BYTES (8ull << 20)

struct zinf_ckpt_hf_opts {
	size_t size;	     /* sizeof(struct zinf_ckpt_hf_opts); set by zinf_ckpt_hf_opts_init() */
	const char *config;  /* the model's Hugging Face config.json (required) */
	int32_t dtype;	     /* an enum zinf_dtype, or -1 (default): the checkpoint's dtype */
	bool overwrite;	     /* replace what OUT holds (default false: -EEXIST) */
	uint8_t reserved[3]; /* zero */
	uint64_t shard_bytes;  /* data bytes per shard at most (0: one file); default
				  ZINF_CKPT_HF_SHARD_BYTES */
	uint64_t buffer_bytes; /* host memory for the reads and the transposition, bytes
				  (default ZINF_CKPT_HF_BUFFER_BYTES; see zinf_ckpt_export_hf) */
};

ZINF_API void zinf_ckpt_hf_opts_init(struct zinf_ckpt_hf_opts *o);

/**
 * Write the checkpoint as a Hugging Face model directory `out` (created when missing, one level:
 * its parent must exist): config.json and the weights, model.safetensors or, above
 * opts->shard_bytes, shards model-00001-of-0000N.safetensors with model.safetensors.index.json,
 * as transformers' save_pretrained lays them out, for its from_pretrained.
 *
 * The checkpoint's parameters must be exactly the tensors of the model that opts->config
 * describes (zinf_hf_model_read: gpt2 as GPT2LMHeadModel, "transformer.*"; llama, mistral and
 * qwen2 as LlamaForCausalLM and kin, "model.*" and an untied "lm_head.weight"), by name and
 * shape: a trainer registers them under Hugging Face's names with their shapes (zinf_gpt does).
 * GPT-2's Conv1D weights (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj) are held in a
 * checkpoint as [out, in], nn.Linear's layout, and written transposed, as Hugging Face stores
 * them ([in, out]). This is checked before anything is written.
 *
 * Values: the fp32 masters converted to opts->dtype (to bf16 and f16 by round to nearest even),
 * tensors in the checkpoint's order. config.json is opts->config's bytes, unless its "dtype"
 * (or transformers 4's "torch_dtype") names another type than the one written: then it is
 * rewritten with that key set ("float32", "bfloat16", "float16"), since transformers loads a
 * model in the type its config names. Every file is written under a temporary name, fsynced
 * and renamed (config.json last); without opts->overwrite an existing config.json,
 * model.safetensors, index or shard in `out` is refused (-EEXIST naming it) before anything is
 * written; with it they are replaced, and stale ones of another layout removed.
 *
 * Memory: the tensors stream in pieces of opts->buffer_bytes / 8 f32 elements; a Conv1D weight
 * is transposed in bands of columns (each band read as one short range per row) through two
 * buffers of that many elements (one column each when a column is longer), so host memory is
 * about opts->buffer_bytes, plus the safetensors writer's conversion buffer (at most 4 MiB).
 *
 * Returns the number of .safetensors files written (1, or the shards'); -EINVAL (NULL
 * argument, no config, a bad size or dtype, a tensor missing, extra or of another shape than
 * the config's model needs: named with both shapes), -EEXIST, -ENOENT (out's parent, the
 * config), errors of zinf_hf_model_read naming the key, I/O errors naming the file. On failure
 * no file of `out` is replaced by a partial one.
 */
ZINF_API int zinf_ckpt_export_hf(struct zinf_ckpt *c, const char *out,
				 const struct zinf_ckpt_hf_opts *opts);

#ifdef __cplusplus
}
#endif
#endif
