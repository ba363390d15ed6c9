/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zinf/blocks/offload.h: the tiered store. Three objects:
 * A building block (zinf/blocks/): for tools and engines made of zinf's parts; a trainer
 * needs none of it beyond the option types zinf/engine.h takes from it.
 *
 *  - zinf_pool: all pinned host memory of a process, from one allocation whose size is computed
 *    from the configuration and checked against RLIMIT_MEMLOCK and physical memory BEFORE
 *    anything is allocated. Carved into `buffer_count` equal, aligned swap buffers plus one
 *    region for CPU-tier partitions. Registered once with io_uring (fixed buffers) and, when
 *    there is a GPU, with CUDA. Also usable unpinned (pin_memory false).
 *  - zinf_store: tensors (partitions) with a home tier (CPU or NVMe) and a residency state;
 *    asynchronous swap-in/out with per-tensor completion, a prefetch queue with a byte budget,
 *    an in-CPU cache for NVMe-homed tensors (a region of cache_bytes with one extent per tensor,
 *    least recently used evicted; or pool buffers bounded by max_in_cpu), and back-pressure
 *    (wait for a buffer or fail with a message naming the budget) instead of asserts.
 *  - zinf_step: the pipelined optimizer step over a rank's flat partition cut into sub-groups,
 *    with the optimizer's state parts (zinf/blocks/optimizer.h: fp32 master plus m and v for Adam,
 *    state_sum for Adagrad, ...) on NVMe (or on the CPU tier): reads of later sub-groups, the
 *    optimizer on the current one and writes of earlier ones overlap, as deep as the pool's
 *    buffers allow.
 *
 * Every function given a NULL handle returns -EINVAL with a message (getters: 0, false or
 * NULL); sizes (elements x bytes, buffers x bytes) are checked for overflow.
 *
 * Thread safety: a pool may be used from any thread. A store and a step are used by one thread
 * at a time (the I/O they start runs on the I/O engine's threads).
 */
#ifndef ZINF_OFFLOAD_H
#define ZINF_OFFLOAD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zinf/blocks/adam.h"
#include "zinf/blocks/optimizer.h"
#include "zinf/common.h"
#include "zinf/device.h"
#include "zinf/blocks/io.h"
#include "zinf/blocks/swap.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ==== pinned pool ============================================================================ */

struct zinf_pool; /* opaque */

struct zinf_pool_opts {
	size_t size;	       /* sizeof(struct zinf_pool_opts); set by zinf_pool_opts_init() */
	uint64_t buffer_bytes; /* bytes per swap buffer, rounded up to `align` */
	uint32_t buffer_count; /* swap buffers (offload_optimizer/offload_param.buffer_count) */
	uint64_t cpu_bytes;    /* bytes for CPU-tier partitions (zinf_pool_cpu_alloc); default 0 */
	uint32_t align;	       /* buffer alignment, power of two >= 64; default 4096 */
	bool pin_memory;       /* mlock the pool (and register it); default true */
	bool pin_fallback;     /* pinning not allowed: warn and run unpinned instead of failing;
				  default false */
	int numa_node;	       /* node to bind the pool to; -1 (default): the node of the
				  calling thread's CPU when the machine has several, else none */
	struct zinf_io *io;    /* register the buffers with this I/O context (may be NULL) */
	struct zinf_device *device; /* device to register the pool with (zinf/device.h; not
				  owned: it must outlive the pool), or NULL: the pool opens its
				  own, the best present ("cuda" with a GPU, else "host") */
	const char *what;	    /* name of the configuration the pool serves, used in messages;
				       default "offload_optimizer" */
	const char *cpu_key; /* the key of `what` that sizes cpu_bytes (the engine's parameter
				cache: "max_in_cpu"), named in the budget messages as a setting
				to lower; NULL (default): none */
};

/** Fill *o with the defaults above (and o->size). */
ZINF_API void zinf_pool_opts_init(struct zinf_pool_opts *o);

/** The budget of a pool, computed from its options alone (nothing allocated). */
struct zinf_pool_budget {
	uint64_t bytes;		/* the whole allocation: buffers + CPU region, page-rounded */
	uint64_t buffer_bytes;	/* one buffer, aligned */
	uint64_t memlock_limit; /* RLIMIT_MEMLOCK soft limit (UINT64_MAX: unlimited) */
	bool memlock_binding;	/* false when the process has CAP_IPC_LOCK (limit ignored) */
	uint64_t phys_bytes;	/* physical memory of the machine */
};

/**
 * Compute the pool's size from *opts and check it: pinned, it must fit RLIMIT_MEMLOCK (unless
 * the process has CAP_IPC_LOCK) and, pinned or not, it must leave 10% of physical memory free.
 * Fills *out (may be NULL) in every case. Returns 0, or:
 *   -EINVAL  bad option (buffer_count or buffer_bytes 0 with no CPU bytes, bad align)
 *   -ENOMEM  over RLIMIT_MEMLOCK or physical memory; the message names the limit, the bytes
 *            asked for and the setting to change (ulimit -l, buffer_count, cpu_key when set,
 *            pin_memory: false)
 *   -EPERM   pinning asked for, the limit is 0 and the process may not lock memory
 * With pin_fallback, a memlock failure is not an error (the pool would be unpinned; create
 * warns, naming ulimit -l).
 */
ZINF_API int zinf_pool_check(const struct zinf_pool_opts *opts, struct zinf_pool_budget *out);
/**
 * The pool's sizes as zinf_pool_check() and zinf_pool_create() compute them (the same code),
 * and this machine's limits, into *out, without judging them against the limits (a plan of
 * another machine's pools: zinf_engine_plan). Returns 0; -EINVAL (bad option, logged);
 * -ENOMEM (the sizes overflow 64 bits, logged).
 */
ZINF_API int zinf_pool_size(const struct zinf_pool_opts *opts, struct zinf_pool_budget *out);

/**
 * Check (zinf_pool_check), then allocate the pool in one mapping, bind it to its NUMA node,
 * lock it (pin_memory) and register it (opts->io; the device table). Errors as
 * zinf_pool_check, plus -ENOMEM when mmap or mlock fails (mlock's message names the limit,
 * the bytes and what the process had locked already). Nothing stays allocated on failure.
 * Free with zinf_pool_destroy() after every buffer was released.
 */
ZINF_API int zinf_pool_create(const struct zinf_pool_opts *opts, struct zinf_pool **out);
/** Unregister, unlock and unmap. Buffers still acquired are a caller bug (logged). NULL: no-op. */
ZINF_API void zinf_pool_destroy(struct zinf_pool *p);

/** Bytes of each buffer (aligned), count of buffers, total bytes, and whether it is locked.
 * Getters of a NULL pool: 0, false, -1 (NUMA node), NULL (device); -EINVAL from the others. */
ZINF_API uint64_t zinf_pool_buffer_bytes(const struct zinf_pool *p);
ZINF_API uint32_t zinf_pool_buffer_count(const struct zinf_pool *p);
ZINF_API uint64_t zinf_pool_bytes(const struct zinf_pool *p);
ZINF_API bool zinf_pool_pinned(const struct zinf_pool *p);
/** NUMA node the pool was bound to, or -1 when it was not bound. */
ZINF_API int zinf_pool_numa_node(const struct zinf_pool *p);
/** Backend of the pool's device ("cuda" or "host"): opts.device's, or the one it opened. */
ZINF_API const char *zinf_pool_device(const struct zinf_pool *p);
/** Buffers free right now. */
ZINF_API uint32_t zinf_pool_free_count(struct zinf_pool *p);

/**
 * Take a buffer. timeout_ms: -1 waits until one is released, 0 fails at once, > 0 waits that
 * long. Sets *buf (aligned, zinf_pool_buffer_bytes() bytes) and returns its index; or
 *   -EAGAIN     none free and timeout_ms 0     -ETIMEDOUT  none freed in time
 *   -EDEADLK    every buffer is held by the calling thread: waiting would never end
 * each with a message that names the budget to raise (<what>.buffer_count).
 */
ZINF_API int zinf_pool_acquire(struct zinf_pool *p, int timeout_ms, void **buf);
/** Give a buffer back (wakes one waiter). -EINVAL for a pointer that is not an acquired buffer. */
ZINF_API int zinf_pool_release(struct zinf_pool *p, void *buf);

/**
 * Carve `bytes` (aligned to the pool's align) from the CPU-tier region; freed with the pool.
 * Returns 0 and sets *out; -ENOMEM naming cpu_bytes when the region is exhausted.
 */
ZINF_API int zinf_pool_cpu_alloc(struct zinf_pool *p, uint64_t bytes, void **out);

/* ==== tensor store =========================================================================== */

enum zinf_tier { ZINF_TIER_CPU = 0, ZINF_TIER_NVME = 1 };

enum zinf_tensor_state {
	ZINF_TENSOR_ABSENT = 0,	  /* on NVMe only */
	ZINF_TENSOR_READING = 1,  /* swap-in in flight */
	ZINF_TENSOR_RESIDENT = 2, /* in a CPU buffer, usable */
	ZINF_TENSOR_WRITING = 3,  /* swap-out in flight (the buffer returns to the pool after) */
};

struct zinf_store; /* opaque */

struct zinf_store_opts {
	size_t size;		 /* sizeof(struct zinf_store_opts); set by zinf_store_opts_init() */
	struct zinf_pool *pool;	 /* buffers for NVMe-homed tensors, CPU region for CPU-homed ones */
	struct zinf_swap *swap;	 /* the NVMe tier (NULL: CPU-homed tensors only) */
	uint64_t prefetch_bytes; /* prefetch queue byte budget (stage3_prefetch_bucket_size);
				    default 0: prefetch disabled */
	uint64_t max_in_cpu;	 /* elements of released NVMe-homed tensors kept resident in pool
				    buffers (the cache without a region, see cache_bytes);
				    default 0: none */
	int timeout_ms;		 /* waiting for a free buffer: -1 (default) until one frees, 0 fail
				    at once, > 0 at most that long */
	uint32_t prefetch_evicts; /* nonzero: a prefetch with no free buffer evicts the least
				     recently released cached tensor (the caller's prefetches
				     follow a known order); default 0: it stays queued until a
				     buffer frees (a prefetch never waits) */
	uint64_t cache_bytes;	  /* bytes of the pool's CPU region (zinf_pool_cpu_alloc) the store
				     takes at create as its cache of NVMe-homed tensors (the engine:
				     offload_param.max_in_cpu x the element size, capped at the
				     partitions): a tensor is read into, written from and kept in its
				     own extent there (its swap size, aligned), the least recently
				     used clean ones evicted when an extent does not fit; a tensor
				     that finds no extent uses a pool buffer as without it. Needs a
				     swap space; default 0: none */
};

ZINF_API void zinf_store_opts_init(struct zinf_store_opts *o);
/**
 * Create a store. -EINVAL (no pool; cache_bytes without a swap space), -ENOMEM (out of memory;
 * the pool's CPU region has less than cache_bytes left, naming both). Free with
 * zinf_store_destroy().
 */
ZINF_API int zinf_store_create(const struct zinf_store_opts *opts, struct zinf_store **out);
/**
 * Wait for all I/O in flight, give every buffer back to the pool, free the store. Resident
 * dirty tensors are NOT written back (call zinf_store_flush first). NULL is a no-op.
 */
ZINF_API void zinf_store_destroy(struct zinf_store *s);

/**
 * Declare a tensor of `elems` elements of `elem_bytes` bytes, named (kind, index), homed on
 * `home`. NVMe-homed tensors are declared in the swap space (before zinf_swap_reserve(), which
 * the caller runs once all tensors are declared); CPU-homed ones take pool CPU-region memory
 * and are always resident. Returns the tensor id (>= 0), or -EINVAL (a tensor larger than one
 * pool buffer, named with the sizes), -ENOMEM (CPU region exhausted), errors of zinf_swap_add.
 */
ZINF_API int zinf_store_add(struct zinf_store *s, const char *kind, uint32_t index, uint64_t elems,
			    uint32_t elem_bytes, enum zinf_tier home);

ZINF_API enum zinf_tensor_state zinf_store_state(const struct zinf_store *s, int id);
/** Bytes of the tensor (elems * elem_bytes). */
ZINF_API uint64_t zinf_store_bytes(const struct zinf_store *s, int id);

enum zinf_store_flags {
	ZINF_STORE_NOWAIT = 1 << 0,    /* fail with -EAGAIN instead of waiting for a buffer */
	ZINF_STORE_NEW = 1 << 1,       /* swap-in of a tensor never written: no read, zero-filled */
	ZINF_STORE_OVERWRITE = 1 << 2, /* swap-in of a tensor the caller overwrites whole before
					  reading it: no read, no zero-fill (its bytes are
					  whatever the buffer held) */
};

/**
 * Start making tensor `id` resident. A resident or reading tensor is left as it is; a tensor
 * being written is waited for first. Needs an extent of the cache region (cache_bytes: the
 * least recently used clean cached tensors there evicted until one fits), else a pool buffer:
 * evicts a clean cached tensor if none is free, else waits (timeout_ms) or fails
 * (-EAGAIN/-ETIMEDOUT/-EDEADLK with a message naming the budget to raise). Returns 0 when started
 * (or already resident).
 */
ZINF_API int zinf_store_swap_in(struct zinf_store *s, int id, unsigned flags);
/**
 * Wait for tensor `id` (and nothing else) to finish its swap-in or swap-out. After a swap-in,
 * sets *data (may be NULL) to its bytes. Returns 0 or the I/O error (naming tensor and file);
 * a failed swap-in leaves the tensor ABSENT and its buffer back in the pool. A released
 * tensor whose swap-out failed returns that error, whether this wait or an earlier store call
 * found the failure (its data stays resident and dirty until a flush writes it).
 */
ZINF_API int zinf_store_wait(struct zinf_store *s, int id, void **data);
/**
 * Whether tensor `id` is ready without waiting: 1 when resident, or when its swap-in or
 * swap-out is complete (zinf_store_wait and zinf_store_swap_in then do not block; a failed read
 * is reported by the wait), 0 when absent or its I/O is in flight, -EINVAL for an unknown id.
 * Never blocks. CPU-homed tensors: 1.
 */
ZINF_API int zinf_store_ready(struct zinf_store *s, int id);
/** Mark a resident tensor modified: the next release or flush writes it. */
ZINF_API int zinf_store_mark_dirty(struct zinf_store *s, int id);
/**
 * The caller is done with tensor `id` for now. Dirty: a swap-out starts (asynchronously; when
 * it completes the clean data is cached as below, or the buffer returns to the pool). Clean: in
 * the cache region (cache_bytes) it stays cached until an extent needs its bytes (least recently
 * used first); in a pool buffer it stays cached while those hold at most max_in_cpu elements
 * (least recently released evicted first), else it becomes ABSENT. CPU-homed tensors stay
 * resident.
 */
ZINF_API int zinf_store_release(struct zinf_store *s, int id);
/**
 * The caller is done with tensor `id` and its resident bytes are not its value (a writer that
 * failed between the pieces of a new value): they are discarded, dirty or not, the buffer or
 * extent goes back, and the next swap-in reads what the files hold (the last completed write).
 * A read in flight is waited for first. CPU-homed tensors: their memory is their home, nothing
 * is discarded. Returns 0, -EINVAL (NULL store, unknown id), or the read's error.
 */
ZINF_API int zinf_store_drop(struct zinf_store *s, int id);
/**
 * Queue a prefetch (swap-in) of `id`. It starts at once if the bytes in flight for prefetch
 * stay within prefetch_bytes and a buffer is free (never waits); otherwise it stays queued and
 * starts from later store calls. A cached tensor counts as the most recently released (the
 * last one a prefetch or swap-in evicts). Returns 0 (queued or started), -ENOSPC when the tensor
 * alone exceeds prefetch_bytes (message names the budget).
 */
ZINF_API int zinf_store_prefetch(struct zinf_store *s, int id);
/** Write every dirty resident tensor and wait for all I/O. Returns 0 or the first error. */
ZINF_API int zinf_store_flush(struct zinf_store *s);

struct zinf_store_stats {
	size_t size; /* set by the caller: sizeof(struct zinf_store_stats) */
	uint64_t reads, writes, read_bytes, write_bytes;
	uint64_t cache_hits, evictions, buffer_waits, prefetch_started;
	uint64_t cached_elems;	   /* elements resident in the cache now */
	uint64_t cache_bytes;	   /* the cache region's bytes (cache_bytes; 0: none) */
	uint64_t cache_used_bytes; /* of them, held by extents now (cached, in use, in flight) */
	uint64_t cache_peak_bytes; /* the most held at once, since create */
};
/** Statistics (common size rule). Returns 0; -EINVAL NULL store or out. */
ZINF_API int zinf_store_get_stats(const struct zinf_store *s, struct zinf_store_stats *out);

/* ==== pipelined optimizer step =============================================================== */

struct zinf_step; /* opaque */

enum zinf_step_schedule {
	ZINF_SCHEDULE_PIPELINED = 0, /* read ahead with every free buffer; writes never waited for
					until their buffer is needed */
	ZINF_SCHEDULE_DEEPSPEED =
		1, /* DeepSpeed's PipelinedOptimizerSwapper with pipeline_read and
		      pipeline_write: one read ahead, one write behind (depth 1) */
};

/**
 * Elements of a sub-group the step hands the optimizer per call (between calls it looks at the
 * I/O): sub-group k is stepped as [start + j * ZINF_STEP_CHUNK, ...) pieces, each with index0
 * its first element's index in the partition (zinf_optimizer_step). A reference in memory
 * that cuts the same way is bit-identical for every optimizer, bf16 stochastic rounding
 * included.
 */
#define ZINF_STEP_CHUNK (1u << 20)

/**
 * Elements of the piece of [off, end) that starts at off (0 past the end): the one way a
 * sub-group is cut into the optimizer's pieces, used by every loop over optimizer state (the
 * step's, the engine's tiers in memory, checkpoints' copies), so that an element's result never
 * depends on which of them stepped it:
 *
 *     for (uint64_t off = start, n; (n = zinf_step_piece(off, end)) > 0; off += n)
 */
static inline uint64_t
zinf_step_piece(uint64_t off, uint64_t end)
{
	return off >= end ? 0 : end - off < ZINF_STEP_CHUNK ? end - off : ZINF_STEP_CHUNK;
}

/**
 * Called after the optimizer ran on sub-group k: copy holds its n = zinf_step_sub_group_len(k)
 * updated parameters as copy_dtype, valid during the call only. Called on the thread that
 * called zinf_step_ready() or zinf_step_run(), before the sub-group's state is written back.
 * Returns 0, or a negative errno that fails the step (named with the sub-group; a positive
 * value fails it with -EINVAL).
 */
typedef int (*zinf_step_copy_fn)(void *ctx, uint32_t k, const void *copy, uint64_t n);

/**
 * Called for sub-group k of the step in progress, once its state is in memory and before the
 * optimizer touches it: parts[i] holds the len = zinf_step_sub_group_len(k) elements of
 * optimizer part i (zinf_step_part_count() - (param_swap ? 1 : 0) parts, as zinf_step_visit_fn
 * gets them), the previous step's state. NVMe: after its reads completed, in the step's pool
 * buffer (exactly what the files held); CPU tier: in place, in the tier's arrays. Valid during
 * the call only; read only (the optimizer runs over these bytes next). Once per sub-group made
 * ready (never for one left out with zinf_step_skip, nor for one whose read failed), on the
 * thread that called zinf_step_ready() or zinf_step_run(). Returns 0, or a negative errno that
 * fails the sub-group's step as a failed read does (named with the sub-group; nothing of it is
 * stepped or written). A caller keeps a copy of the state it may have to restore (the engine's
 * speculative step) without reading it from the files again.
 */
typedef int (*zinf_step_before_fn)(void *ctx, uint32_t k, const void *const parts[], uint64_t len);

/**
 * Fills external part `part` (zinf_step_opts.external_parts) of sub-group k: buf receives its
 * len = zinf_step_sub_group_len(k) elements (zinf_optimizer_part_size(opt, part, len) bytes)
 * from where the caller keeps that part (the engine: a bf16 master that is the 16-bit
 * parameters' own bits, read from their home). Called on the thread that called the step's
 * function: zinf_step_ready() (after k's reads completed, before before_fn and the optimizer),
 * zinf_step_save() (for a part asked for) and zinf_step_visit() in ZINF_STEP_VISIT_READ mode
 * (before fn). Returns 0, or a negative errno that fails the call (zinf_step_ready(): the step,
 * as a failed read does).
 */
typedef int (*zinf_step_fill_fn)(void *ctx, uint32_t k, uint32_t part, void *buf, uint64_t len);

struct zinf_step_opts {
	size_t size;			  /* sizeof(struct zinf_step_opts); zinf_step_opts_init() */
	uint64_t n;			  /* elements in this rank's flat partition */
	uint64_t sub_group_size;	  /* elements per sub-group; the last one may be shorter */
	enum zinf_tier tier;		  /* where the optimizer state lives */
	enum zinf_step_schedule schedule; /* default ZINF_SCHEDULE_PIPELINED */
	struct zinf_swap *swap;		  /* NVMe tier: each optimizer part i of sub-group k is
					     declared here as (zinf_optimizer_part_name(i), k) by
					     zinf_step_create(); the caller runs
					     zinf_swap_reserve() afterwards */
	struct zinf_pool *pool;		  /* NVMe: buffers (each >= zinf_step_buffer_bytes()); CPU:
					     the state comes from its CPU region (NULL: plain host
					     memory), and with param_swap its buffers carry the
					     copy (required) */
	const struct zinf_optimizer *optimizer; /* the optimizer and its state parts (caller's;
						   must outlive the step); NULL (default):
						   AdamW with zinf_optimizer_opts_init()'s
						   defaults and fp32 state, owned by the step */
	struct zinf_swap *param_swap; /* if not NULL: the copy of sub-group k is also written to
					 tensor (param_kind, k) there, declared by create; either
					 tier (CPU: through pool buffers while the optimizer goes
					 on) */
	const char *param_kind;	      /* default "param16" (copied) */
	uint32_t buffers;	      /* buffers the step takes from the pool at begin; 0 (default):
					 every buffer free at that moment */
	enum zinf_dtype copy_dtype;   /* dtype of the parameter copy; default ZINF_F16 */
	int timeout_ms;		      /* waiting for pool buffers at begin; default -1 */
	int rank;		      /* named in messages; -1 (default): unknown, not named */
	/* Sub-groups of different sizes (the engine cuts at parameter boundaries): NULL (default):
	   sub_group_size elements each. Otherwise n_sub_groups strictly increasing ends, the last
	   equal to n: sub-group k is [ends[k - 1] (0 for k = 0), ends[k]); copied at create,
	   sub_group_size is then ignored. */
	const uint64_t *sub_group_ends;
	uint32_t n_sub_groups;
	/* Bit i set: optimizer part i is external (NVMe tier only): the caller keeps it, the step
	   neither declares it in the swap space nor reads or writes it (step, load, save, visit);
	   a slot still holds it while the optimizer runs, filled by fill_fn (required). The
	   engine's bf16 master shared with the 16-bit parameters is part 0 this way. 0: none. */
	uint32_t external_parts;
	zinf_step_copy_fn copy_fn; /* if not NULL: receives each sub-group's copy (see the type);
				      the pool's buffers carry it as with param_swap (required) */
	void *copy_ctx;		   /* passed to copy_fn */
	zinf_step_before_fn before_fn; /* if not NULL: sees each sub-group's state before the
					  optimizer runs on it (see the type) */
	void *before_ctx;	       /* passed to before_fn */
	zinf_step_fill_fn fill_fn;     /* fills the external parts (see the type) */
	void *fill_ctx;		       /* passed to fill_fn */
};

ZINF_API void zinf_step_opts_init(struct zinf_step_opts *o);

/**
 * Bytes a pool buffer needs to hold the largest sub-group: every optimizer part (NVMe tier)
 * and, with param_swap or copy_fn, the 16-bit copy, each aligned to `align` (the swap space's
 * alignment; 0: 4096). CPU tier: the copy only (0 without param_swap and copy_fn). 0 for NULL
 * options, invalid sub_group_ends or sizes that overflow 64 bits (zinf_step_create() names
 * them).
 */
ZINF_API uint64_t zinf_step_buffer_bytes(const struct zinf_step_opts *opts, uint32_t align);

/**
 * Create a step. NVMe: declares the state in opts->swap and checks the pool: -ENOMEM "too few
 * buffers" when a pool buffer cannot hold one sub-group or the pool has none, naming the bytes
 * needed. CPU: allocates every optimizer part (pool CPU region or host memory), zero-filled.
 * Returns 0 and sets *out; -EINVAL bad option (named), sizes that overflow. Free with
 * zinf_step_destroy().
 */
ZINF_API int zinf_step_create(const struct zinf_step_opts *opts, struct zinf_step **out);
/** Waits for anything in flight, releases buffers. NULL is a no-op. */
ZINF_API void zinf_step_destroy(struct zinf_step *st);

/** Sub-groups (0 for NULL). */
ZINF_API uint32_t zinf_step_sub_groups(const struct zinf_step *st);
/** Elements of sub-group k and its first element's index in the partition (0 out of range). */
ZINF_API uint64_t zinf_step_sub_group_len(const struct zinf_step *st, uint32_t k);
ZINF_API uint64_t zinf_step_sub_group_start(const struct zinf_step *st, uint32_t k);

/*
 * The parts a sub-group moves, for checkpoints and tools: the optimizer's parts
 * (0 .. zinf_optimizer_part_count() - 1, in its order, master first) and, with param_swap, the
 * parameter copy last.
 */
struct zinf_step_part_info {
	size_t size;	  /* set by the caller: sizeof(struct zinf_step_part_info) */
	const char *kind; /* state kind the part is declared under (valid while the step is) */
	struct zinf_swap *swap; /* swap space holding it; NULL: state on the CPU tier */
	uint32_t elem_bytes;	/* bytes per element (q8 state: 1, its codes; a sub-group's part
				   takes zinf_optimizer_part_size(opt, i, len(k)) bytes) */
	bool copy;		/* the parameter copy (param_swap), not optimizer state */
	bool external;		/* in external_parts: kept by the caller (swap NULL) */
	uint8_t reserved[2];
};
/** Parts per sub-group: the optimizer's, plus one with param_swap; 0 for NULL. */
ZINF_API uint32_t zinf_step_part_count(const struct zinf_step *st);
/** Fill *out for part `part`. Returns 0; -EINVAL (NULL, part out of range, out->size too
 * small) with a message. */
ZINF_API int zinf_step_part_info(const struct zinf_step *st, uint32_t part,
				 struct zinf_step_part_info *out);
/**
 * Id of (part, sub-group k) in the part's swap space (zinf_swap_bytes() gives its bytes,
 * len(k) * elem_bytes, or zinf_optimizer_part_size() for a q8 part). Returns the id (>= 0); -ENOENT
 * for state on the CPU tier and for an external part (no swap tensor); -EINVAL (NULL, k or part out
 * of range) with a message.
 */
ZINF_API int zinf_step_swap_id(const struct zinf_step *st, uint32_t k, uint32_t part);

/**
 * Write the initial state of sub-group k: state[i] holds zinf_step_sub_group_len(k) elements of
 * optimizer part i (its elem_bytes each; a q8 part: zinf_optimizer_part_size(opt, i,
 * len(k)) bytes, the sub-group a q8 array of its own, blocks from its start); state NULL, or
 * state[i] NULL: zeros. One sub-group at a time, so that loading a model never needs host memory
 * for the whole partition. NVMe: after zinf_swap_reserve(). An external part is not written (its
 * keeper writes it). Returns 0 or the I/O error naming the sub-group and part; -EBUSY during a
 * step; -EINVAL (NULL step, k out of range).
 */
ZINF_API int zinf_step_load(struct zinf_step *st, uint32_t k, const void *const state[]);
/** Read sub-group k's state back: state[i] (NULL: not read) receives optimizer part i (an
 * external part from fill_fn). Errors as zinf_step_load() and fill_fn's, and -EINVAL for a NULL
 * state array. */
ZINF_API int zinf_step_save(struct zinf_step *st, uint32_t k, void *const state[]);

enum zinf_step_visit_mode {
	ZINF_STEP_VISIT_READ = 0,  /* parts hold sub-group k's state for fn to read */
	ZINF_STEP_VISIT_WRITE = 1, /* fn fills every part (contents unspecified before), which is
				      then written to the tier */
};
/** fn receives part i's len elements at parts[i] (zinf_step_part_count() - (param_swap ? 1 :
 * 0) parts: the optimizer's); returns 0 or a negative errno. */
typedef int (*zinf_step_visit_fn)(void *ctx, uint32_t k, void *const parts[], uint64_t len);
/**
 * Sub-group k's state in place, without a copy of it in the caller's memory: on the CPU tier
 * parts point into the tier itself; on NVMe into one of the pool's buffers (read before fn, or
 * written after it; an external part filled by fill_fn before fn reads it, and not written
 * after fn wrote it). A checkpoint streams a partition through this at disk speed with no
 * memory beyond the pool's. Between steps. Returns 0, fn's error, or errors as
 * zinf_step_load() (I/O errors naming the sub-group and part); when fn fails, NVMe is not
 * written (on the CPU tier fn wrote in place whatever it wrote).
 */
ZINF_API int zinf_step_visit(struct zinf_step *st, uint32_t k, enum zinf_step_visit_mode mode,
			     zinf_step_visit_fn fn, void *ctx);

/**
 * Begin optimizer step `step` (>= 1): takes buffers from the pool and starts reading the first
 * sub-groups (in ascending order, or descending with `reverse`, the order in which backward
 * makes gradients final). copy_host: n elements of copy_dtype receiving the 16-bit copy (NULL:
 * none besides param_swap). Returns 0; -EBUSY inside a step; pool errors (no buffer in time);
 * -EINVAL NULL step.
 */
ZINF_API int zinf_step_begin(struct zinf_step *st, int64_t step, float grad_scale, void *copy_host,
			     bool reverse);
/**
 * The gradient of sub-group k is final: `grad` holds its zinf_step_sub_group_len() elements of
 * grad_dtype (pinned host memory; read during this call only). Runs the optimizer on k as soon
 * as its state is in, starts writing it back, and keeps the reads of later sub-groups going.
 * Sub-groups may arrive in any order; a sub-group not prefetched is read now (a prefetched one
 * that is not ready yet gives up its buffer if needed, so this never deadlocks). Returns 0, or
 * an error naming the sub-group and the file (the step is then failed: finish reports it
 * again).
 */
ZINF_API int zinf_step_ready(struct zinf_step *st, uint32_t k, const void *grad,
			     enum zinf_dtype grad_dtype);
/**
 * Leave sub-group k out of the step in progress: its state is neither stepped nor written (a
 * read ahead of it is waited for and dropped), and finish does not count it as missing. For a
 * caller that steps only some sub-groups with this grad_scale (the engine's speculative step).
 * Returns 0; -EINVAL (NULL step, outside a step, k out of range, k already made ready).
 */
ZINF_API int zinf_step_skip(struct zinf_step *st, uint32_t k);
/**
 * Wait for every write, give the buffers back, end the step. Returns 0 only if every sub-group
 * was processed and written; else the first error (-EINVAL naming a sub-group never made
 * ready; the I/O error naming the sub-group and file). The step object stays usable.
 */
ZINF_API int zinf_step_finish(struct zinf_step *st);
/**
 * A whole step: begin, ready for every sub-group in order (grad: n elements), finish. On
 * failure, everything in flight is waited for and the buffers are back in the pool.
 */
ZINF_API int zinf_step_run(struct zinf_step *st, int64_t step, float grad_scale, const void *grad,
			   enum zinf_dtype grad_dtype, void *copy_host);

/**
 * The last optimizer step whose update of sub-group k is completely on its tier (written and
 * acknowledged, for NVMe), 0 if none (or NULL, k out of range): a failed write never counts,
 * and leaves 0 (it may have torn the earlier state).
 */
ZINF_API int64_t zinf_step_sub_group_written(const struct zinf_step *st, uint32_t k);

struct zinf_step_stats {
	size_t size;			  /* set by the caller: sizeof(struct zinf_step_stats) */
	uint64_t read_bytes, write_bytes; /* by the last step: the parts' bytes moved */
	double optim_s;			  /* time in the optimizer's kernel during the last step */
	double wait_read_s;		  /* time the step waited for reads */
	double wait_write_s;		  /* time waiting for writes to free buffers */
	uint32_t buffers;		  /* buffers used by the last step */
	uint32_t max_reads_in_flight;	  /* deepest read-ahead reached */
};
/** Statistics of the last step (common size rule). Returns 0; -EINVAL NULL step or out. */
ZINF_API int zinf_step_get_stats(const struct zinf_step *st, struct zinf_step_stats *out);

#ifdef __cplusplus
}
#endif
#endif
