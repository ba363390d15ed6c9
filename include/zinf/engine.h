/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zinf/engine.h: the ZeRO engine, what a C trainer links zinf for. The trainer registers its
 * parameters, fetches each layer before computing it (forward and backward), hands each
 * parameter's gradient over during backward, and calls zinf_engine_step() after every
 * micro-batch; the engine partitions parameters, gradients and optimizer state across the
 * data-parallel ranks as the ZeRO stage says, keeps each in the tier the options name (GPU,
 * pinned CPU memory, NVMe), reduces gradients in buckets while backward goes on and runs the
 * optimizer step per sub-group, during backward where that is exact.
 * The trainer's API (zinf/zinf.h includes it).
 *
 *   stage 0  nothing partitioned; gradients all-reduced (averaged); every rank steps all
 *   stage 1  fp32 master and optimizer state partitioned; after the step the updated 16-bit
 *            parameters are all-gathered
 *   stage 2  gradients partitioned too (reduce-scatter)
 *   stage 3  16-bit parameters partitioned too: zinf_engine_fetch() all-gathers a layer into
 *            transient device buffers, zinf_engine_release() gives them back
 *
 * Every tensor is partitioned on its own (zinf_comm_partition: padded to a multiple of the
 * world size; the padding is never visible to the trainer; the statistics of device buffers and
 * collectives count it, as memory and bytes moved, see struct zinf_engine_stats). A rank's
 * partitions, concatenated in backward order (layers last to first), form its flat partition,
 * which the optimizer steps in sub-groups of whole parameters of at most sub_group_size
 * elements (a larger parameter is a sub-group alone).
 *
 * One training step (every rank the same calls, in the same order):
 *     for each micro-batch (gradient_accumulation_steps of them):
 *         forward:  for layer in order:    fetch(layer); compute; release(layer)
 *         backward: for layer reversed:    fetch(layer); compute; grad(p) for each p of
 *                                          the layer; release(layer)
 *         zinf_engine_step()   (returns 1 when the optimizer stepped: the last micro-batch)
 *
 * Or "vertical" (zinf_engine_vertical; every micro-batch through a layer while it is fetched, so
 * that the parameters are fetched, and with offload_param on NVMe read, twice per pass instead
 * of twice per micro-batch; the trainer keeps n micro-batches' activations):
 *     zinf_engine_vertical(n)      (n <= the micro-batches left in the window)
 *     forward:  for layer in order:    fetch(layer); compute micro-batches 0..n-1; release
 *     backward: for layer reversed:    fetch(layer); for each p of the layer: compute and
 *                                      grad(p) for micro-batches 0..n-1 in order; release
 *     zinf_engine_step()           (ends the n micro-batches)
 * The results are the bits of the same micro-batches run one by one.
 *
 * Ordering with the device (zinf/device.h): the engine's work is ordered after what the
 * trainer queued on its compute stream (opts.compute_stream) before each call, and work the
 * trainer queues on that stream after a call is ordered after the engine's: the pointers of
 * zinf_engine_param() are valid for work queued on the compute stream after zinf_engine_fetch()
 * and until zinf_engine_release(); a gradient buffer handed to zinf_engine_grad() may be
 * overwritten by work queued on the compute stream after the call. On the "host" device, code
 * that reads or writes those buffers from the host thread synchronises the compute stream
 * first (zinf_stream_sync), as it would with cudaStreamSynchronize.
 *
 * Errors: every function returns 0 (or a count, or an id) or a negative errno with a message
 * through the log naming the parameter, layer, sub-group, file or option. A call in the wrong
 * order (a gradient twice in a micro-batch, a step before every gradient arrived, a fetch of an
 * unknown layer) is -EINVAL and leaves the engine as it was (with several ranks the others may
 * then wait for this rank in a collective: a trainer that gives up instead of making the call
 * right calls zinf_engine_abort(), which tells them). An I/O error or a collective
 * error (-ETIMEDOUT, -EPROTO: see zinf/blocks/comm.h) fails the engine: every later call returns
 * that error; the process should report it and exit. A failure during the optimizer step on one
 * rank reaches every rank at once: the others' zinf_engine_step() returns the same errno, with a
 * message naming the failing rank, rather than waiting for it until comm_timeout_s. A failure
 * on one rank outside the step (an NVMe read in a fetch, a gradient written out in
 * zinf_engine_grad) is sent to the others at once (zinf_comm_notify_failure): the call of
 * theirs that waits on a collective returns -ECONNABORTED, with a message naming the failing
 * rank and its reason, and fails their engine. A failed zinf_engine_init() fails the engine
 * too (see there).
 *
 * An engine is used by one thread at a time (it runs its own worker threads inside).
 */
#ifndef ZINF_ENGINE_H
#define ZINF_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zinf/blocks/comm.h"
#include "zinf/common.h"
#include "zinf/device.h"
#include "zinf/blocks/io.h"
#include "zinf/blocks/loss_scale.h"
#include "zinf/blocks/optimizer.h"

#ifdef __cplusplus
extern "C" {
#endif

struct zinf_engine; /* opaque */

/** Where offloaded state lives (DeepSpeed's offload_param/offload_optimizer "device"). */
enum zinf_offload_device {
	ZINF_OFFLOAD_NONE = 0, /* on the GPU (the compute device) */
	ZINF_OFFLOAD_CPU = 1,  /* pinned CPU memory (the pool's CPU region) */
	ZINF_OFFLOAD_NVME = 2, /* files under nvme_path (pinned buffers in between) */
};

/** Most NVMe directories one offload section stripes over. */
#define ZINF_ENGINE_MAX_PATHS 8

/** zero_optimization.offload_param / offload_optimizer, DeepSpeed's keys and defaults. */
struct zinf_offload_opts {
	enum zinf_offload_device device; /* default ZINF_OFFLOAD_NONE */
	uint32_t n_paths;		 /* entries of nvme_path used; 0 unless device is nvme */
	const char *nvme_path[ZINF_ENGINE_MAX_PATHS]; /* directories (copied); several are
							 striped */
	uint32_t buffer_count; /* pinned swap buffers; default 5 (param) / 4 (optimizer);
				  optimizer on nvme: also the sub-groups the gradient window holds
				  in pinned memory (the others' gradients go to the swap space) */
	bool pin_memory;       /* page-lock the buffers; default false (DeepSpeed's) */
	bool pipeline_read;    /* optimizer: accepted; zinf always reads ahead and writes behind
				  (ZINF_SCHEDULE_PIPELINED); default false */
	bool pipeline_write;   /* optimizer: accepted, as pipeline_read; default false */
	bool fast_init;	       /* accepted, no effect: zinf always initialises sub-group by
				  sub-group; default false */
	uint64_t buffer_size;  /* param: elements per buffer (a partition larger is refused,
				  naming this key); default 1e8. Optimizer: unused (sized from
				  sub_group_size) */
	uint64_t max_in_cpu;   /* param, nvme: elements of partitions kept cached in the
				  parameter pool (pinned with pin_memory), capped at this rank's
				  partitions, least recently used evicted; default 1e9 */
	double ratio;	       /* optimizer: fraction offloaded; only 1.0 is supported
				  (default 1.0; other values are -EINVAL naming the key) */
};

/** aio: DeepSpeed's keys and defaults. */
struct zinf_aio_opts {
	uint32_t block_size;	       /* bytes per request; default 1048576 */
	uint32_t queue_depth;	       /* default 8 */
	uint32_t intra_op_parallelism; /* I/O threads (older name thread_count); default 1 */
	bool single_submit;	       /* accepted (zinf batches submissions either way); false */
	bool overlap_events;	       /* accepted (zinf always overlaps); default true */
	bool use_gds;		       /* GPUDirect Storage: not supported, true is -EINVAL */
	uint8_t reserved[1];	       /* zero */
};

struct zinf_engine_opts {
	size_t size; /* sizeof(struct zinf_engine_opts); set by zinf_engine_opts_init() */

	/* zero_optimization */
	int32_t stage;				    /* 0..3; default 0 */
	uint32_t reserved0;			    /* zero */
	struct zinf_offload_opts offload_param;	    /* stage 3 only (else none) */
	struct zinf_offload_opts offload_optimizer; /* stages 1-3 (else none) */
	/* the sizes below take 0 as DeepSpeed's schema does (ge=0), with its meaning */
	uint64_t sub_group_size;	/* elements; default 1e9; 0: a sub-group per parameter */
	uint64_t reduce_bucket_size;	/* elements per gradient bucket (a bucket is reduced before
					   a gradient would take it past this); default 5e8; 0: a
					   bucket per parameter */
	uint64_t allgather_bucket_size; /* elements in flight in the all-gathers after the step
					   (stages 1-2; one at least); default 5e8; 0: one
					   parameter at a time */
	bool overlap_comm;	   /* reduce while backward goes on; default false (DeepSpeed's;
				      stage 3 behaves as true) */
	bool contiguous_gradients; /* accepted (gradients always go to one contiguous buffer);
				      default true */
	uint8_t reserved1[6];	   /* zero */
	uint64_t stage3_prefetch_bucket_size;	     /* elements in flight ahead; default 5e7; 0:
							no prefetch */
	uint64_t stage3_max_live_parameters;	     /* gathered elements at most (a layer larger
							is fetched anyway, warned once); default
							1e9 */
	uint64_t stage3_max_reuse_distance;	     /* elements; default 1e9 */
	uint64_t stage3_param_persistence_threshold; /* elements; default 1e5 */
	uint64_t stage3_model_persistence_threshold; /* elements; default UINT64_MAX */

	/* batch */
	uint32_t gradient_accumulation_steps; /* micro-batches per optimizer step; default 1 */
	uint32_t reserved2;		      /* zero */

	/* optimizer: kind, hyper-parameters, state dtype, SIMD path (zinf/blocks/optimizer.h);
	   default AdamW with zinf_optimizer_opts_init()'s values */
	struct zinf_optimizer_opts optimizer;

	/* precision: the dtype of the parameters the trainer computes with (and hands gradients
	   in, usually): ZINF_BF16, ZINF_F16, or ZINF_F32 (fp32 training); default ZINF_F32, as
	   zinf_config_init() and DeepSpeed with neither fp16 nor bf16 enabled (a trainer reading
	   16-bit parameters sets it). Gradients are widened exactly to fp32 in the buckets and
	   reduced in fp32 whatever this is (twice the bytes of a 16-bit reduction, no 16-bit
	   rounding of the sum) */
	enum zinf_dtype dtype;
	uint32_t reserved3; /* zero */

	struct zinf_aio_opts aio;

	/* devices and collectives */
	const char *device_backend; /* zinf_device_opts.backend: NULL: the best present */
	int32_t device_index;	    /* -1 (default): local rank modulo the devices present */
	bool host_sync;		    /* host device: run streams synchronously (debugging) */
	bool comm_check;	    /* zinf_comm_opts.check; default false */
	uint8_t reserved4[2];	    /* zero */
	const char *comm_backend;   /* zinf_comm_opts.backend: NULL: nccl on a cuda device; on the
				       host device mpi under mpirun, else single */
	double comm_timeout_s;	    /* deadline of every collective; default $ZINF_COMM_TIMEOUT_S
				       (seconds) when set, else 1800 */
	struct zinf_device *device; /* use this device (not owned; outlives the engine) instead of
				       opening one; NULL (default): open device_backend */
	struct zinf_comm *comm;	    /* use this communicator (not owned) instead of creating
				       one; NULL (default): create comm_backend */
	void *compute_stream;	    /* the trainer's stream: cudaStream_t on "cuda" (NULL: the
				       legacy default stream); NULL on "host", where the engine
				       creates a host stream that stands for it
				       (zinf_engine_compute_stream()) */
	const char *io_backend;	    /* zinf_io_opts.backend for the NVMe tiers: NULL: best that
				       works; "fault" in tests (zinf_engine_io() arms it) */
	const char *swap_prefix;    /* swap file name prefix; default "zinf" */
	bool step_during_backward;  /* at the accumulation boundary, step each sub-group as soon
				       as its gradient is final (exact; default true); with
				       clipping or fp16: speculatively (zinf_engine_step) */
	bool record_trace;	    /* stage 3: record the fetch order and prefetch along it;
				       default true */
	uint8_t reserved5[6];	    /* zero */

	/* training semantics (ds_config.json's gradient_clipping and fp16 blocks) */
	double gradient_clipping;   /* max global L2 norm of the averaged (unscaled) gradient over
				       every rank and partition; 0 (default): no clipping; < 0 or
				       not finite: -EINVAL naming the key */
	struct zinf_fp16_opts fp16; /* loss scaling (zinf/blocks/loss_scale.h): enabled only with
				       dtype ZINF_F16 (else -EINVAL naming fp16.enabled); default:
				       zinf_fp16_opts_init() (disabled) */

	/* checkpoints (zinf/checkpoint.h) */
	bool stage3_gather_16bit_weights_on_model_save; /* zinf_engine_save() also writes the
							   consolidated 16-bit weights
							   (model.safetensors); default false */
	/* the optimizer on NVMe: enum zinf_step_schedule (zinf/blocks/offload.h):
	   ZINF_SCHEDULE_PIPELINED (default: read ahead with every free buffer), or
	   ZINF_SCHEDULE_DEEPSPEED (DeepSpeed's one read ahead and one write behind, for
	   comparisons: `zinf bench engine --schedule`) */
	uint8_t optimizer_schedule;
	uint8_t reserved6[6]; /* zero */
};

/** Fill *o with the defaults above (and o->size). */
ZINF_API void zinf_engine_opts_init(struct zinf_engine_opts *o);

/**
 * Create an engine: open (or take) the device and the communicator (collective: every rank
 * calls it). Checks the options; combinations DeepSpeed refuses are -EINVAL naming the key:
 * offload_param below stage 3, offload_optimizer at stage 0, device nvme without nvme_path,
 * fp16 or bf16 state for an optimizer that has none, use_gds, ratio other than 1. Returns 0 and
 * sets *out; -EINVAL; -ENODEV (device or collective backend); -ENOMEM. Free with
 * zinf_engine_destroy().
 */
ZINF_API int zinf_engine_create(const struct zinf_engine_opts *opts, struct zinf_engine **out);
/**
 * Check options as the engine will, before any engine exists (zinf config check): the option
 * checks of zinf_engine_create() (the same function: every combination listed there; not the
 * loss scaler's and the optimizer's own checks, nor those that depend on the communicator, which
 * create still makes), then, for a tier on NVMe, what zinf_engine_init()
 * will refuse: the I/O context opened as init opens it (aio.block_size a power of two in
 * [4096, 1 GiB], queue_depth at most 4096, intra_op_parallelism at most 64) and every nvme_path
 * opened as the swap space opens it (exists, is a directory, writable: a read-only mount is
 * -EROFS; a file opens there with O_DIRECT: tmpfs is -EINVAL). Creates and removes a probe file
 * in each directory; opens nothing else. Each problem is logged naming the key, the value and
 * the path (the I/O checks report every path, create's stop at the first). Returns 0, or the
 * first problem's negative errno.
 */
ZINF_API int zinf_engine_opts_check(const struct zinf_engine_opts *opts);
/**
 * Wait for work in flight, free every buffer, remove the swap files, close what the engine
 * opened. With a communicator of its own (opts.comm NULL) the other ranks are told that this
 * one left after step S (zinf_comm_leave), so a rank still training fails its next collective
 * at once, naming it; with the caller's communicator that is the caller's to say (its
 * zinf_comm_leave or zinf_comm_destroy). Waits for no other rank. NULL is a no-op.
 */
ZINF_API void zinf_engine_destroy(struct zinf_engine *e);

/** This rank and the world size (of the communicator). */
ZINF_API int zinf_engine_rank(const struct zinf_engine *e);
ZINF_API int zinf_engine_world(const struct zinf_engine *e);
/** The device (for the trainer's own buffers and kernels) and the compute stream. */
ZINF_API struct zinf_device *zinf_engine_device(const struct zinf_engine *e);
ZINF_API struct zinf_stream *zinf_engine_compute_stream(const struct zinf_engine *e);
/** The I/O context of the NVMe tiers (NULL without one): tests arm faults on it. */
ZINF_API struct zinf_io *zinf_engine_io(const struct zinf_engine *e);

/* ---- parameters ---------------------------------------------------------------------------- */

/**
 * Initial values of elements [first, first + count) of a parameter, as fp32, into out. Called
 * only for the ranges this rank owns (and, for stages 0-2, never for more than this rank's
 * partition at a time), so that no rank ever holds the whole model. Returns 0 or a negative
 * errno (passed back by zinf_engine_init).
 */
typedef int (*zinf_param_init_fn)(void *ctx, uint32_t param, uint64_t first, uint64_t count,
				  float *out);

/** Most dimensions of a parameter's shape. */
#define ZINF_PARAM_MAX_DIMS 8
/**
 * The most elements one parameter, and all parameters of an engine together, may have (2^48,
 * about 2.8e14: 4000 times a 70B model), so that every byte count and file offset derived from
 * them fits 64 bits. Element-count options above it (a "no limit" of 1e20, UINT64_MAX) are
 * read as it: no model reaches it.
 */
#define ZINF_ENGINE_MAX_ELEMS (1ull << 48)

struct zinf_param_desc {
	size_t size;	  /* sizeof(struct zinf_param_desc); set by zinf_param_desc_init() */
	const char *name; /* unique (copied) */
	uint64_t numel;	  /* elements, >= 1 */
	int32_t layer;	  /* the layer it belongs to, >= 0; layers are fetched as units */
	enum zinf_dtype init_dtype; /* dtype of `init` */
	const void *init;	    /* the whole tensor's initial values on the host, or NULL */
	zinf_param_init_fn init_fn; /* or a callback; neither: zeros */
	void *init_ctx;
	/* the tensor's shape (informative: checkpoints and exported weights carry it); ndim 0
	   (default): one dimension of numel; else the product of shape[0..ndim) must be numel */
	uint32_t ndim;
	uint32_t flags; /* ZINF_PARAM_*; 0 (default): none. Was a reserved zero: a caller built
			   before it passes 0 */
	uint64_t shape[ZINF_PARAM_MAX_DIMS];
};

/**
 * zinf_param_desc.flags: the optimizer's weight decay does not apply to this parameter (it is
 * stepped with weight_decay 0, whatever the optimizer: Adam's L2 as AdamW's and Lion's decoupled
 * decay). Hugging Face's Trainer puts biases and the weights of LayerNorm and RMSNorm layers in
 * such a group (get_decay_parameter_names: every parameter whose name has "bias", or that
 * belongs to a norm layer) when it makes the optimizer itself; its weight matrices and
 * embeddings decay. (Given a DeepSpeed config with an optimizer, the Trainer passes DeepSpeed
 * one group, and every parameter decays: register none with this flag for that.) The engine cuts
 * each optimizer call at the boundaries between parameters that decay and parameters that do not
 * (zinf_optimizer_set_no_decay over this rank's flat partition), so a sub-group may mix them; a
 * run without this flag anywhere, or with weight_decay 0, steps exactly as before. Checkpoints
 * record it per parameter ("no_decay" in the manifest's params), for readers; a load takes the
 * loading engine's registration, as it takes the loading engine's weight_decay.
 */
#define ZINF_PARAM_NO_DECAY (1u << 0)

ZINF_API void zinf_param_desc_init(struct zinf_param_desc *d);

/**
 * Register a parameter (before zinf_engine_init; every rank the same parameters in the same
 * order). Returns its id (0, 1, ... in order); -EINVAL (NULL, numel 0, layer < 0, a name
 * already registered, an unknown flag, after init), -ENOMEM.
 */
ZINF_API int zinf_engine_add_param(struct zinf_engine *e, const struct zinf_param_desc *d);

/**
 * Lay out the partitions, check and allocate every tier (pinned pool against RLIMIT_MEMLOCK,
 * NVMe free space), and write every parameter's initial values into its tiers (collective).
 * Returns 0; -EINVAL (no parameter; a partition larger than offload_param.buffer_size, named),
 * -ENOMEM, -ENOSPC (the path, bytes needed and free), an init callback's error, I/O errors.
 * Initial values are asked for (init_fn) and written in pieces of at most ZINF_STEP_CHUNK
 * elements: host memory does not grow with the model. -EINVAL for a second call, or with no
 * parameter, changes nothing; any other failure, -EINVAL included, fails the engine for good:
 * every later call (init, add_param, ...) returns that error; destroy it.
 */
ZINF_API int zinf_engine_init(struct zinf_engine *e);

/** Parameters registered; a parameter's id by name (-ENOENT when none). */
ZINF_API int zinf_engine_param_count(const struct zinf_engine *e);
ZINF_API int zinf_engine_param_find(const struct zinf_engine *e, const char *name);

/* ---- forward and backward ------------------------------------------------------------------ */

/**
 * Make every parameter of `layer` available on the device in opts.dtype (stage 3: all-gathered;
 * stages 0-2: always there, this only records the order). Returns 0; -EINVAL (unknown layer,
 * layer already fetched, before init; with step_during_backward, a layer fetched again at the
 * boundary micro-batch after one of its parameters' sub-groups went to the step, e.g. tied
 * weights fetched twice in backward: its values are being stepped); -EPROTO (comm_check: the ranks
 * fetched different layers; the message names the layer and step), -ETIMEDOUT, I/O errors naming
 * the parameter and file.
 */
ZINF_API int zinf_engine_fetch(struct zinf_engine *e, int32_t layer);
/** Done with `layer` for now (stage 3: its gathered buffers may be freed). -EINVAL when not
 * fetched. */
ZINF_API int zinf_engine_release(struct zinf_engine *e, int32_t layer);
/**
 * Device pointer to parameter `id`'s numel elements of opts.dtype, valid while its layer is
 * fetched (stages 0-2: always after init). Read-only for the trainer at every stage: the values
 * are the engine's (stages 0-2: this rank's slice is where a bf16 master shared with the
 * parameters is read from), so a write into them (a clamp, a zeroed row) is undefined; change
 * weights through the optimizer or a checkpoint. Returns 0 and sets *dev; -EINVAL (unknown id,
 * layer not fetched at stage 3).
 */
ZINF_API int zinf_engine_param(struct zinf_engine *e, uint32_t id, void **dev);

/**
 * Parameter `id`'s gradient for this micro-batch: numel elements of `dtype` (f32, bf16, f16) in
 * device memory. Copied into a reduction bucket (ordered after the compute stream's work queued
 * so far); the bucket is reduced across ranks when full (averaged: the result is the mean over
 * ranks of the gradients handed) and this rank's partition accumulated in fp32. Returns 0;
 * -EINVAL (unknown id, a second gradient for id in this micro-batch, an (n+1)-th in a vertical
 * pass of n, before init), collective errors.
 */
ZINF_API int zinf_engine_grad(struct zinf_engine *e, uint32_t id, const void *dev_grad,
			      enum zinf_dtype dtype);

/**
 * The next pass (forward, backward, zinf_engine_step) carries n micro-batches of the window
 * (n 1: the default, one): zinf_engine_grad() then takes n gradients per parameter, its n
 * micro-batches' in order (a parameter's next before the following parameter's first is not
 * required: any interleaving of parameters, each in micro-batch order), and
 * zinf_engine_step() ends them all, counting n micro-steps (it returns 1 when they end the
 * window). Every stage and tier; the results (master weights, optimizer state, 16-bit
 * parameters, the norm, fp16's skip) are the bits of the n micro-batches run one per pass. Every
 * rank calls it with the same n (one small all-reduce). Call it before the pass's first fetch;
 * it holds for that pass only. Returns 0; -EINVAL, the engine unchanged (n 0 or more than the
 * micro-batches left in the window; mid-pass: a gradient handed since the last
 * zinf_engine_step, or a layer fetched; another rank's n differs or another rank refused its
 * call, named, on every rank; before init); collective errors.
 */
ZINF_API int zinf_engine_vertical(struct zinf_engine *e, uint32_t n);

/**
 * End the micro-batch: reduce what is left in the buckets; at the accumulation boundary (every
 * gradient_accumulation_steps-th call) finish the optimizer step (the sub-groups not stepped
 * during backward, then the all-gather of stages 1-2) and return 1; otherwise return 0.
 * -EINVAL (a registered parameter's gradient missing, named with its micro-batch: in a vertical
 * pass every one of the n micro-batches' gradients is needed; a layer still fetched); I/O and
 * collective errors naming the sub-group or the call.
 *
 * With gradient_clipping or fp16 enabled, at the boundary the engine computes the global L2
 * norm of the averaged gradient (each sub-group's sum of squares in float64 when its gradient
 * is final, summed over the sub-groups and over the ranks in rank order) and whether any
 * element is an infinity or a NaN. With fp16 the gradients carry the loss scale S the trainer
 * multiplied its loss by (zinf_engine_loss_scale): norm = sqrt(sum of squares) / S. The step
 * multiplies the gradients by grad_scale = 1 / (S * c), c = (norm + 1e-6) / gradient_clipping
 * when that is > 1, else c = 1 (DeepSpeed's unscale_and_clip_grads; no extra pass over the
 * gradients). fp16 and a non-finite gradient: the step is skipped on every rank (master
 * weights, optimizer state and 16-bit parameters unchanged, zinf_engine_steps() not advanced),
 * the loss scaler is updated (zinf_loss_scaler_update: halved after `hysteresis` overflows;
 * doubled after loss_scale_window clean steps; a static scale is never changed) and the call
 * returns 2. The scaler reaching min_loss_scale on an overflow is -ERANGE and fails the engine
 * (DeepSpeed stops the run there). Without fp16 a non-finite gradient is stepped as it is.
 * With step_during_backward the sub-groups are nevertheless stepped during backward, on the
 * assumption of no clipping and no overflow (grad_scale 1/S), each keeping its previous state
 * (optimizer state and 16-bit values) in a reserve of offload_optimizer.buffer_count
 * sub-groups (device memory for the optimizer tier none, else the optimizer's pinned pool;
 * none for the last sub-group to become final; a device without room for it: a warning at
 * init and no speculation); once the reserve is full the others wait for the norm. With the
 * optimizer on NVMe a speculated sub-group's previous state is read once more from its files.
 * In this call, once the norm is
 * known: if the assumption held, nothing is undone; if clipping applies, the speculated
 * sub-groups get their previous state back and are stepped again with the right grad_scale;
 * on an fp16 overflow they get their previous state back (stats.rolled_back counts them).
 * The results are the bits of the step after backward (step_during_backward false: the
 * sub-groups are all stepped in this call, after the exchange).
 * Returns 1: the optimizer stepped; 2: the boundary was reached and the step skipped; 0: not
 * a boundary.
 */
ZINF_API int zinf_engine_step(struct zinf_engine *e);

/**
 * The scale the trainer multiplies its loss by before backward: the fp16 loss scaler's
 * current value (it changes only inside zinf_engine_step), 1 without fp16; NaN for NULL.
 */
ZINF_API double zinf_engine_loss_scale(const struct zinf_engine *e);

/**
 * Learning rate of the following optimizer steps (schedules): a step uses the value set before
 * the first gradient of its last micro-batch (from there on it may run during backward); a
 * value set later applies from the next step. -EINVAL for lr < 0, NaN or infinite.
 */
ZINF_API int zinf_engine_set_lr(struct zinf_engine *e, float lr);
/**
 * beta1 and beta2 of the following optimizer steps (OneCycle's momentum cycling: the trainer
 * passes zinf_schedule_step_momentum() and ZINF_SCHEDULE_MOM_BETA2), taken as set_lr's value
 * is, on every tier (Adam/AdamW's, Lion's betas). -EINVAL for a value outside [0, 1) or NaN;
 * -EOPNOTSUPP for Adagrad, which has no betas (nothing logged). The engine goes on with its
 * previous betas after an error.
 */
ZINF_API int zinf_engine_set_betas(struct zinf_engine *e, float beta1, float beta2);
/** Optimizer steps taken. */
ZINF_API int64_t zinf_engine_steps(const struct zinf_engine *e);

/**
 * Read parameter `id`'s fp32 master weights, all numel elements, into host memory `out`
 * (collective: every rank calls it with the same id and receives the whole tensor). Between
 * steps only. Returns 0; -EINVAL; I/O and collective errors. With several ranks, a failure
 * reading this rank's part fails the engine and is sent to the others (their call returns
 * -ECONNABORTED naming this rank), who would otherwise wait for it in the all-gather.
 */
ZINF_API int zinf_engine_read_master(struct zinf_engine *e, uint32_t id, float *out);

/**
 * Give up on this engine, for a trainer that stops after an error the engine did not count as
 * a failure (an -EINVAL of a call in the wrong order, which leaves the engine usable so that
 * the call can be made right) or after an error of its own: the engine fails with -ECANCELED
 * (every later call returns it) and, with several ranks, every other rank is told at once, as
 * after an I/O failure: their call that waits on a collective returns -ECONNABORTED with a
 * message naming this rank and `why` (NULL: none given), instead of waiting until
 * comm_timeout_s. Not collective; any time after zinf_engine_create(). Returns -ECANCELED, or
 * the error an engine that had failed already failed with (nobody is told again); -EINVAL
 * for NULL.
 */
ZINF_API int zinf_engine_abort(struct zinf_engine *e, const char *why);

/* ---- the plan ------------------------------------------------------------------------------ */

/**
 * What an engine of given options and parameters allocates on each rank (zinf_engine_plan),
 * computed by the engine's own code: its layout and the functions its tiers size their pools
 * by, so that the plan and the run cannot disagree.
 */
struct zinf_engine_plan {
	size_t size; /* set by the caller: sizeof(struct zinf_engine_plan) */
	/* host memory of the engine's pools (page-locked when the section's pin_memory), bytes as
	   the pools total them: host_pool_bytes is zinf_engine_stats.host_pool_bytes after
	   zinf_engine_init (swap directories of a direct-I/O alignment of at most `align`) */
	uint64_t host_pool_bytes;
	uint64_t param_pool_bytes;  /* offload_param: the CPU partitions (cpu), or buffer_count
				       buffers of the largest partition (nvme) */
	uint64_t optim_pool_bytes;  /* offload_optimizer: state, gradient partition and staging
				       (cpu), or buffer_count buffers of a sub-group's state and
				       staging (nvme); both: the speculation's reserve */
	uint64_t grad_window_bytes; /* the optimizer on NVMe: the gradient window's slots */
	uint64_t param_buffer_bytes, optim_buffer_bytes; /* one swap buffer, aligned (0: none) */
	uint32_t param_buffers, optim_buffers, grad_window_slots;
	uint32_t sub_groups;	      /* this rank's */
	uint64_t partition_elems;     /* this rank's flat partition, padding included */
	uint64_t max_sub_group_elems; /* the largest sub-group */
	uint64_t bucket_elems;	      /* one gradient bucket (the engine keeps two on the device) */
	uint64_t speculation_bytes;   /* the speculative step's reserve (clipping or fp16 with
					 step_during_backward): in the optimizer pool for cpu and
					 nvme, device memory for none; 0 without */
	uint64_t optim_nvme_state_bytes; /* the optimizer on NVMe: this rank's state in its swap
					    files, every sub-group's parts before alignment (a bf16
					    master shared with bf16 parameters is not there: it is
					    the 16-bit parameters' bits, in their home); 0 else */
};

/**
 * Plan an engine of `opts` (zinf_engine_create's checks) on `world` ranks with the n parameters
 * of `params` as zinf_engine_add_param would take them (names, numel, layers; init values are
 * not read), as rank 0 lays them out (every rank's partitions are the same size). `align`: the
 * swap directories' direct-I/O alignment (0: 4096, the least the swap space uses). Opens no
 * device, communicator or file. Returns 0 and fills *out (up to out->size); -EINVAL (bad
 * options or parameters, named as create and add_param name them; out->size unknown), -ENOMEM.
 */
ZINF_API int zinf_engine_plan(const struct zinf_engine_opts *opts, int world, uint32_t align,
			      const struct zinf_param_desc *params, uint32_t n,
			      struct zinf_engine_plan *out);

/* ---- statistics ---------------------------------------------------------------------------- */

struct zinf_engine_stats {
	size_t size; /* set by the caller: sizeof(struct zinf_engine_stats) */
	/* counters since create */
	uint64_t steps, micro_steps;
	/* the three below count device buffer elements, padding included (at most world - 1 per
	   parameter beyond its numel): memory, compared with stage3_max_live_parameters */
	uint64_t peak_live_elems;  /* most gathered elements at once (stage 3; persistent ones
				      included) */
	uint64_t live_elems;	   /* gathered now */
	uint64_t persistent_elems; /* parameters never partitioned (persistence thresholds) */
	uint64_t trace_hits, trace_misses, trace_invalidations;
	/* the last accumulation window (from the end of the previous optimizer step to the end
	   of the last): bytes per tier and direction, reduced and gathered bytes, times */
	uint64_t nvme_read_bytes, nvme_write_bytes; /* swap files, parameters and optimizer: bytes
						       the files moved (a partition served from
						       the cache is no read) */
	uint64_t h2d_bytes, d2h_bytes;		    /* host <-> device copies */
	uint64_t reduced_bytes;			    /* gradients handed to collectives */
	uint64_t gathered_bytes;		    /* parameters all-gathered (padding
						       included: the bytes the collective moves) */
	double step_s;				    /* first fetch to the end of the step */
	double exposed_fetch_s; /* time the trainer waited inside fetch (the prefetch it starts
				   included) */
	double exposed_step_s;	/* optimizer time left after the last gradient: the time the
				   final zinf_engine_step() call waited */
	double optimizer_s;	/* time in the optimizer's kernel */
	uint32_t sub_groups;	/* this rank's sub-groups */
	uint32_t stepped_during_backward; /* of them, stepped before the final call */
	/* the optimizer on NVMe: of nvme_read_bytes and nvme_write_bytes, the fp32 gradients of
	   sub-groups that left the gradient window (read back, written out) in the last window */
	uint64_t grad_nvme_read_bytes, grad_nvme_write_bytes;
	/* bytes of the engine's host pools (the offload sections' buffers and CPU regions,
	   pinned when pin_memory), since init */
	uint64_t host_pool_bytes;
	/* clipping and fp16 (zinf_engine_step) */
	double grad_norm;  /* the last window's global norm of the unscaled averaged gradient
			      (non-finite on an overflow); 0 when not computed (neither
			      clipping nor fp16) */
	double loss_scale; /* zinf_engine_loss_scale() now */
	uint64_t
		skipped_steps; /* boundaries whose step was skipped (fp16 overflow), since create */
	bool overflow;	       /* the last window's gradient had an infinity or a NaN */
	uint8_t reserved6[7];
	/* the speculative step (clipping or fp16 with step_during_backward): of the sub-groups
	   stepped during backward in the last window, those rolled back (redone with the
	   decided grad_scale, or restored on a skipped step) */
	uint32_t rolled_back;
	uint32_t reserved7;
	/* nvme_read_bytes and nvme_write_bytes of the last window by kind of state: the 16-bit
	   parameters' store (a partition served from its cache is no read) and the optimizer's
	   state (the master and the optimizer's parts; the speculative step's restores
	   included; a bf16 master that shares the parameters' home is not optimizer state: its
	   reads are parameter reads where the cache misses, its writes the parameter writes);
	   grad_nvme_* above are the third kind, so the three add up to the totals */
	uint64_t param_nvme_read_bytes, param_nvme_write_bytes;
	uint64_t optim_nvme_read_bytes, optim_nvme_write_bytes;
};

/** Copy the statistics (common size rule). Returns 0; -EINVAL (NULL, bad out->size). */
ZINF_API int zinf_engine_get_stats(const struct zinf_engine *e, struct zinf_engine_stats *out);

#ifdef __cplusplus
}
#endif
#endif
