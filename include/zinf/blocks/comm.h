/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zinf/blocks/comm.h: collectives across data-parallel ranks (all-gather, reduce-scatter,
 * all-reduce, broadcast, barrier), asynchronous, each under a deadline. A building block
 * (zinf/blocks/): for tools and engines made of zinf's parts; a trainer needs none of it beyond the
 * option types zinf/engine.h takes from it.
 *
 * Backends: "mpi" (host buffers), "nccl" (device buffers, ordered on a CUDA stream; MPI shares
 * its unique id) and "single" (one rank, no dependency). A backend that was not built answers
 * -ENODEV. Rank, world size and local rank come from MPI when the process was started by
 * mpirun or srun; a process started alone is one rank. zinf has no launcher of its own.
 *
 * Every collective returns a request that is waited on (zinf_comm_wait) or tested
 * (zinf_comm_test), so that several collectives and computation overlap. Collectives must be
 * called in the same order on every rank; their requests may be completed in any order.
 *
 * Never a silent hang: a collective that has not completed timeout_s after it was called
 * returns -ETIMEDOUT, with a message naming the operation, its sequence number on this rank
 * and its bytes. With opts.check, ranks first compare each call (sequence number, operation,
 * element count, dtype, reduction, root): a rank that called something else makes the call
 * fail with -EPROTO on every rank, naming both calls. After a timeout or a mismatch the
 * communicator is failed: every later call returns the same error. A rank that fails outside
 * a collective tells the others at once (zinf_comm_notify_failure): their collectives return
 * -ECONNABORTED naming it instead of waiting out timeout_s. A collective cannot be
 * cancelled (MPI has no way to), so the buffers of the failed call must stay valid; the
 * process should report the error and exit with a non-zero status (zinf never aborts it).
 *
 * A communicator is used by one thread at a time.
 */
#ifndef ZINF_COMM_H
#define ZINF_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zinf/common.h"

#ifdef __cplusplus
extern "C" {
#endif

struct zinf_comm;     /* opaque: one communicator over all ranks of the job */
struct zinf_comm_req; /* opaque: one collective in flight */

/** Reductions. ZINF_COMM_AVG is the sum divided by the world size. */
enum zinf_comm_red { ZINF_COMM_SUM = 0, ZINF_COMM_AVG = 1, ZINF_COMM_MAX = 2 };

struct zinf_comm_opts {
	size_t size;	     /* sizeof(struct zinf_comm_opts); set by zinf_comm_opts_init() */
	const char *backend; /* "mpi" | "nccl" | "single" | NULL: "mpi" when MPI is initialised or
				the process was started by mpirun/srun, else "single" */
	double timeout_s;    /* comm_timeout_s: deadline of every collective, seconds from the
				call; default $ZINF_COMM_TIMEOUT_S when set (a value this
				cannot read is refused at create, naming it), else 1800 */
	void *stream;	     /* nccl: the cudaStream_t collectives are ordered on; NULL: the
				communicator creates its own. Ignored by mpi and single. */
	int32_t device;	     /* nccl: CUDA device ordinal; -1 (default): local rank modulo the
				number of devices */
	bool check;	     /* compare every call across ranks before it runs (every rank must
				ask the same: create refuses a difference); default false
				(true in tests and debug runs: it costs a small exchange per call) */
	uint8_t reserved[3]; /* zero */
};

/** Fill *o with the defaults above (and o->size). */
ZINF_API void zinf_comm_opts_init(struct zinf_comm_opts *o);

/**
 * Join the job's communicator: every rank calls it (it is collective). The "mpi" and "nccl"
 * backends initialise MPI (MPI_Init_thread, MPI_THREAD_MULTIPLE) when the program has not;
 * the communicator that did so finalises MPI when it is destroyed (destroy it last; MPI cannot
 * be initialised twice in a process). A program that initialises MPI itself keeps ownership;
 * with MPI_THREAD_MULTIPLE the "mpi" backend runs reduce-scatter, all-reduce, broadcast and
 * barrier as the blocking MPI call on a progress thread of its own (faster: Open MPI's blocking
 * algorithms) and all-gather as a non-blocking call; with a lower level every collective is a
 * non-blocking MPI call (said once at INFO); below MPI_THREAD_SERIALIZED it warns (zinf calls
 * MPI from the thread that calls zinf). ZINF_COMM_MPI_PROGRESS=0 in the environment turns the
 * progress thread off, =all runs all-gather on it too.
 * opts may be NULL (defaults). Free with zinf_comm_destroy().
 * Returns 0 and sets *out, or a negative errno and leaves *out untouched:
 *   -EINVAL  bad option  -ENODEV  backend not built, no CUDA device, or MPI finalised already
 *   -ENOMEM  -EIO  the MPI, CUDA or NCCL call that failed is named in the message
 */
ZINF_API int zinf_comm_create(const struct zinf_comm_opts *opts, struct zinf_comm **out);
/**
 * Complete the requests still in flight (each within its deadline), tell the other ranks that
 * this one left (zinf_comm_leave), free the communicator, and finalise MPI if this
 * communicator initialised it. Waits for no other rank. A failed communicator skips every call
 * that could wait on another rank (MPI_Comm_free, MPI_Finalize, ncclCommDestroy: it aborts
 * NCCL's instead) and leaks the requests that never completed; a progress thread stuck in a
 * blocking MPI call is left running, not joined (it exits if the call ever returns): destroy
 * returns, and the process should exit. NULL is a no-op.
 */
ZINF_API void zinf_comm_destroy(struct zinf_comm *c);

ZINF_API int zinf_comm_rank(const struct zinf_comm *c);	      /* 0-based; -EINVAL for NULL */
ZINF_API int zinf_comm_world(const struct zinf_comm *c);      /* ranks in the job */
ZINF_API int zinf_comm_local_rank(const struct zinf_comm *c); /* rank among this node's */
/** "mpi", "nccl" or "single"; NULL for NULL. */
ZINF_API const char *zinf_comm_backend(const struct zinf_comm *c);
/** The options in effect (defaults filled in); NULL for NULL. */
ZINF_API const struct zinf_comm_opts *zinf_comm_get_opts(const struct zinf_comm *c);
/**
 * The backend's own communicator, for calls zinf does not wrap over the same ranks (a
 * trainer's own collective; `zinf bench comm` timing the raw call on the same buffers): for
 * "mpi" a pointer to its MPI_Comm, for "nccl" the ncclComm_t; NULL for "single" or NULL c. It
 * stays the communicator's: valid until zinf_comm_destroy(), never freed by the caller. Calls
 * on it are ordered against zinf's by the caller (wait for zinf's requests first).
 */
ZINF_API void *zinf_comm_native(struct zinf_comm *c);
/** 0, or the error that failed the communicator (-ETIMEDOUT, -EPROTO, -EIO, -ECONNABORTED). */
ZINF_API int zinf_comm_failed(const struct zinf_comm *c);
/**
 * Tell every other rank at once that this rank failed (err, a negative errno, and why, a text
 * of up to 487 bytes), for a failure outside a collective that the other ranks would otherwise
 * wait out until timeout_s in their next collective (an I/O error on one rank). The notice is
 * posted without waiting (mpi and nccl: a message to every rank on a duplicate of
 * MPI_COMM_WORLD of its own) and c is failed here (err, unless it failed earlier): later calls
 * are refused. The notice says up to which collective this rank completed (every one before
 * the first it lost or still has in flight). Every other rank sees it while it waits on a
 * collective (within about 10 ms: waits look for notices at most every millisecond) or when it
 * starts one: a collective the failed rank completed runs on (it completes here too), the
 * first one after fails with -ECONNABORTED and fails that communicator, with a message naming
 * the rank and its reason ("rank 1 failed (Input/output error): ..."); so every rank fails at
 * the same collective. A failed communicator looks for no notices. Sent once per
 * communicator; a no-op (0) with one rank, on "single", once sent, and on a communicator failed
 * by another rank's notice or by a mismatch of the check (every rank knows those). Not for
 * failures every rank learns from a collective anyway (nothing breaks, it is only redundant).
 * The collectives the failed rank never joins stay posted on the others, as after a timeout.
 * Returns 0; -EINVAL (NULL c); -EIO or -ENOMEM when the notice could not be posted (c is
 * failed all the same).
 */
ZINF_API int zinf_comm_notify_failure(struct zinf_comm *c, int err, const char *why);
/**
 * This rank leaves: tell the other ranks, as a failure notice does, that it completed every
 * collective it called and will call no more (err -ESHUTDOWN; why: up to 487 bytes, e.g. "after
 * step 12"). A rank that goes on calling collectives fails at the first one this rank will never
 * join with -ECONNABORTED, "rank 1 left: after step 12; this rank called a collective it will
 * never join", instead of waiting out timeout_s; ranks that end at the same collective see
 * nothing. Later collectives here are refused (-ESHUTDOWN). zinf_comm_destroy() leaves with a
 * reason of its own when the caller did not. A no-op (0) with one rank, on "single", once this
 * rank sent a notice (a failure's, or left) and on a failed communicator. Returns 0; -EINVAL
 * (NULL c); -EBUSY while requests of c are in flight (wait for them first: their handles stay
 * the caller's); -EIO or -ENOMEM when the notice could not be posted.
 */
ZINF_API int zinf_comm_leave(struct zinf_comm *c, const char *why);

/* ---- partitions --------------------------------------------------------------------------- */

/**
 * How a tensor of numel elements is split into world partitions of equal size `part`
 * (the last ones padded): rank r owns elements [offset, offset + count) of the tensor, held in
 * a partition buffer of `part` elements whose tail part - count is padding (zeros by
 * convention). An all-gather of the partitions fills a buffer of `padded` elements whose first
 * numel are the tensor.
 */
struct zinf_comm_part {
	size_t numel;  /* elements of the whole tensor */
	size_t part;   /* elements per partition: ceil(numel / world) */
	size_t padded; /* part * world >= numel */
	size_t offset; /* first element of this rank's partition: rank * part (may be >= numel) */
	size_t count;  /* elements of the tensor in this rank's partition, 0..part */
};

/**
 * Fill *out for a tensor of numel elements, rank of world. Returns 0; -EINVAL (world < 1,
 * rank outside [0, world), out NULL, part * world wraps) with a message.
 */
ZINF_API int zinf_comm_partition(size_t numel, int world, int rank, struct zinf_comm_part *out);

/* ---- collectives -------------------------------------------------------------------------- */
/*
 * Common to every collective below. Buffers are host memory for mpi and single, device memory
 * for nccl; they must stay valid and unmodified (recv: untouched) until the request completes.
 * With req NULL the call waits for completion itself. Otherwise *req is set and the caller
 * completes it with zinf_comm_wait() or zinf_comm_test() (which free it).
 * Returns 0 (sets *req), or a negative errno and sets no request:
 *   -EINVAL     NULL communicator or buffer with count > 0, unknown dtype or reduction,
 *               count x world x element size wraps, send and recv overlap where not allowed
 *   -EPROTO     (check on) the ranks called different collectives: the message names both
 *   -ETIMEDOUT  (req NULL or check on) not complete within timeout_s
 *   -ECONNABORTED (req NULL or check on) another rank failed and said so (the message names
 *               it and its reason; zinf_comm_notify_failure)
 *   -ENOMEM     -EIO (the backend call named in the message)
 *   the communicator's error when it failed earlier
 * 16-bit reductions accumulate in fp32 where the backend allows it (mpi, single): inputs are
 * widened exactly, summed in fp32 in the backend's order, (divided by world for AVG, in fp32)
 * and rounded once to the 16-bit type, to nearest even. nccl reduces 16-bit inputs in their own
 * type (NCCL's kernels); widen to fp32 before the call where that matters.
 */

/**
 * All-gather: every rank's partition of count elements (send) into recv, which holds
 * count x world elements, rank r's at [r x count, (r + 1) x count). send may be recv + rank x
 * count (in place).
 */
ZINF_API int zinf_comm_all_gather(struct zinf_comm *c, const void *send, void *recv, size_t count,
				  enum zinf_dtype dtype, struct zinf_comm_req **req);
/**
 * Reduce-scatter: send holds count x world elements on every rank; recv (count elements)
 * receives the reduction (SUM, AVG or MAX) of every rank's elements
 * [rank x count, (rank + 1) x count).
 */
ZINF_API int zinf_comm_reduce_scatter(struct zinf_comm *c, const void *send, void *recv,
				      size_t count, enum zinf_dtype dtype, enum zinf_comm_red red,
				      struct zinf_comm_req **req);
/** All-reduce of count elements (SUM, AVG or MAX), in place in buf. */
ZINF_API int zinf_comm_all_reduce(struct zinf_comm *c, void *buf, size_t count,
				  enum zinf_dtype dtype, enum zinf_comm_red red,
				  struct zinf_comm_req **req);
/** Broadcast count elements of buf from rank root to every rank's buf. */
ZINF_API int zinf_comm_broadcast(struct zinf_comm *c, void *buf, size_t count,
				 enum zinf_dtype dtype, int root, struct zinf_comm_req **req);
/** Barrier: completes once every rank has called it. */
ZINF_API int zinf_comm_barrier(struct zinf_comm *c, struct zinf_comm_req **req);

/**
 * Wait for req (from a collective on c) until it completes or its deadline passes, and free
 * it. Returns 0; -ETIMEDOUT (the message names the operation, its sequence number and bytes;
 * c is failed, req is freed but its buffers stay in the backend's hands); -ECONNABORTED
 * (another rank's failure notice came: the message names that rank and its reason; c is
 * failed, req freed as after a timeout); -EIO; -EINVAL for a NULL argument.
 */
ZINF_API int zinf_comm_wait(struct zinf_comm *c, struct zinf_comm_req *req);
/**
 * Test req once without blocking: returns 1 and frees req when it completed, 0 while it is in
 * flight (req stays valid), or a negative errno as zinf_comm_wait (req freed).
 */
ZINF_API int zinf_comm_test(struct zinf_comm *c, struct zinf_comm_req *req);

/* ---- quantized collectives (ZeRO++: qwZ's all-gather, qgZ's reduce-scatter) -----------------
 * Data moves as blockwise symmetric codes with one fp32 scale per block (zinf_device_quantize's
 * format: int8, or int4 two per byte; blocks cut from each rank's segment's start): per element
 * |x - deq| <= max|block| / 254 (8 bits), / 14 (4 bits), plus 2^-22 max|block| of fp32 rounding.
 * A block holding a NaN or an infinity arrives as NaN in every element. Each call is made of the
 * collectives above (all_gather, and an all_to_all within groups of ranks, moving bytes): each
 * has the deadline, the call check and the failure notices of every collective, and the call
 * waits for them (there is no request). Buffers as the collectives'; the codec runs where they
 * live: on the calling thread (mpi, single) or on the communicator's stream (nccl: kernels).
 * Each step has its own deadline: a call can take up to 2 x timeout_s (qreduce_scatter's two
 * all_to_alls). A failure of this rank alone (memory, the codec) fails c and notifies the other
 * ranks. Returns 0, or the errors of the collectives, and -EINVAL (bad option, nonzero
 * reserved, count > 0 with a NULL buffer, MAX, the group not dividing the world, error state of
 * another call, a call above the backend's byte limit: mpi, one rank's codes and scales for
 * qall_gather, world x them for qreduce_scatter, at most INT_MAX bytes), -ENOMEM.
 */
struct zinf_comm_quant_opts {
	size_t size; /* sizeof(struct zinf_comm_quant_opts); set by zinf_comm_quant_opts_init() */
	uint32_t block;	   /* elements per fp32 scale; default 256; even with 4 bits */
	uint32_t bits;	   /* 8 (default) or 4 */
	int32_t group;	   /* reduce-scatter: ranks per group, consecutive (ZeRO++: a node's);
			      0 (default): a node's ranks when every node holds as many,
			      consecutive, and they divide the world (agreed at create), else
			      the world */
	uint32_t reserved; /* zero */
};

/** Fill *o with the defaults above (and o->size). */
ZINF_API void zinf_comm_quant_opts_init(struct zinf_comm_quant_opts *o);

/**
 * Quantized all-gather (qwZ): each rank quantizes its count elements of send, the codes and
 * scales are all-gathered, and every rank dequantizes every rank's into recv (count x world
 * elements, dtype): the same bits on every rank, this rank's partition included. send may be
 * recv + rank x count. q NULL: defaults.
 */
ZINF_API int zinf_comm_qall_gather(struct zinf_comm *c, const struct zinf_comm_quant_opts *q,
				   const void *send, void *recv, size_t count,
				   enum zinf_dtype dtype);

struct zinf_comm_qerr; /* opaque: a rank's error feedback for one reduce-scatter's shape */

/**
 * Error feedback for zinf_comm_qreduce_scatter of count elements per rank on c (LoCo): the
 * quantization error of each call, times err_beta, is added to the next call's input before it
 * is quantized (both quantizations: this rank's gradient, and its group's partial sums); every
 * reset_T calls (0: never) it is cleared first. Free with zinf_comm_qerr_destroy() before c.
 * Returns 0 and sets *out; -EINVAL (NULL, count 0, err_beta not in [0, 1]), -ENOMEM.
 */
ZINF_API int zinf_comm_qerr_create(struct zinf_comm *c, size_t count, float err_beta,
				   uint32_t reset_T, struct zinf_comm_qerr **out);
ZINF_API void zinf_comm_qerr_destroy(struct zinf_comm_qerr *e); /* NULL is a no-op */

/**
 * Quantized reduce-scatter (qgZ), send (count x world elements) to recv (count), SUM or AVG,
 * over groups of q->group consecutive ranks: each rank quantizes its gradient, an all_to_all
 * within the group gives every rank its share of the group's, which it dequantizes and sums in
 * fp32 (peers in rank order); with more than one group these partial sums are quantized again,
 * exchanged with the ranks of the same place in the other groups (all_to_all) and summed (groups
 * in order), then AVG multiplies by 1 / world in fp32 and the result is rounded once to dtype.
 * One group: one exchange; groups of one rank: only the second. err: NULL, or this rank's error
 * feedback (zinf_comm_qerr_create with this count on c). send and recv may not overlap at all
 * (no in-place form: -EINVAL). The result is deterministic: the same inputs give the same bits.
 * Error bound: comm/README.md.
 */
ZINF_API int zinf_comm_qreduce_scatter(struct zinf_comm *c, const struct zinf_comm_quant_opts *q,
				       const void *send, void *recv, size_t count,
				       enum zinf_dtype dtype, enum zinf_comm_red red,
				       struct zinf_comm_qerr *err);

/* ---- statistics --------------------------------------------------------------------------- */

struct zinf_comm_stats {
	size_t size;	   /* set by the caller: sizeof(struct zinf_comm_stats) */
	uint64_t calls;	   /* collectives started (barriers included) */
	uint64_t bytes;	   /* their bytes: the full tensor of each call (see the message) */
	uint64_t wait_ns;  /* time spent in zinf_comm_wait/test, and in blocking calls */
	uint64_t check_ns; /* time spent comparing calls across ranks (opts.check) */
	uint64_t timeouts; /* collectives past their deadline (0 or 1: the first fails c) */
};

/** Copy the statistics (zc_stats_give). Returns 0; -EINVAL (NULL, bad out->size). */
ZINF_API int zinf_comm_get_stats(const struct zinf_comm *c, struct zinf_comm_stats *out);

#ifdef __cplusplus
}
#endif
#endif
