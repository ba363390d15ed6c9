/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_internal.h: the ZeRO engine's private state (struct zinf_engine, struct eparam,
 * struct elayer, the gradient buckets) and the helpers its files share. Not installed.
 *
 * Files, by level (a file calls only files of a lower level: tests/engine/check_layers.sh):
 *  0 engine_call.c   the error boundary of every public call, the ranks' agreement, getters,
 *                    the lr latch, the module view of engine_module.h; loss_scale.c
 *  1 engine_match.c  every rank the same options and parameter table, checked at init
 *  1 engine_ptier.c  where 16-bit parameters live (struct eng_ptier: full, gpu, cpu, nvme)
 *    engine_gwin.c   the gradient window (optimizer on NVMe); where a sub-group's gradient is
 *  2 engine_param.c  registration, the layout (partitions, flat partition, sub-groups), homes
 *    engine_gather.c 16-bit partitions from their homes into gathered device buffers
 *  3 engine_otier.c  where optimizer state lives and how it is stepped (struct eng_otier)
 *    engine_trace.c  stage 3's fetch trace and prefetch
 *  4 engine_spec.c   the speculative step's reserve: keep, redo, restore
 *    engine_clip.c   clipping and fp16 loss scaling: the global norm, the skip decision
 *  5 engine_worker.c the step worker (step during backward)
 *  6 engine_grad.c   buckets, reduction, accumulation; where a step's window opens
 *    engine_fetch.c  stage 3 fetch/release, persistence, the live bound
 *  7 engine_step.c   zinf_engine_step, the step, read_master
 *    engine_init.c   zinf_engine_init: layout, homes, the step's side, initial values
 *  8 engine.c        options, create/destroy, statistics: the one file that sees every concern
 * Each concern keeps its state in its own struct inside struct zinf_engine (e->fx fetch, e->gr
 * gradients, e->cl clipping, e->w worker, e->os optimizer state, e->ps parameter store, e->sp
 * speculation). ckpt/ sits above the core and uses engine_module.h only; config/ fills the
 * public options (zinf/engine.h) and never sees the engine.
 *
 * Streams: the trainer's compute stream and one engine stream (`cs`) that runs every copy,
 * cast and accumulation of the engine in order; cross-stream order is by events only. Host
 * collectives ("mpi", "single") run on the calling thread after cs was synchronised; "nccl"
 * collectives are ordered on cs (its native handle is the communicator's stream).
 */
#ifndef ZINF_ENGINE_INTERNAL_H
#define ZINF_ENGINE_INTERNAL_H

#include <inttypes.h>
#include <stdbool.h>
#include <pthread.h>
#include <stdint.h>

#include "common/util.h"
#include "engine/engine_module.h"
#include "zinf/engine.h"
#include "zinf/blocks/loss_scale.h"
#include "zinf/blocks/offload.h"

/* Where a piece of work queues its copies and counts its bytes: the calling thread's (cs and
 * the window's counters) or the step worker's (its stream and counters). */
struct ectx {
	struct zinf_stream *s;
	struct zinf_engine_stats *st;
	/* a context outside the steps (a checkpoint's visit): the parameter store's reads it
	   causes are taken out of the window (e->ps.store_read0 advanced under store_mu,
	   nvme_read); false: the window's (eng_param_io_stats) */
	bool outside_window;
};

/* The step worker (step during backward): sub-groups handed in the order they become final. */
struct eworker {
	pthread_t th;
	bool started;
	pthread_mutex_t mu;
	pthread_cond_t cv;   /* work queued, or stop */
	pthread_cond_t done; /* a sub-group finished */
	uint32_t *queue;     /* n_sg entries */
	uint32_t head, tail; /* queued [head, tail) */
	uint32_t finished;   /* sub-groups done this step */
	bool stop;
	bool began; /* zinf_step_begin called for this step */
	bool prime; /* begin the step (its reads ahead) now, before any sub-group is final */
	int err;
	struct zinf_stream *ws;
	struct zinf_engine_stats st;
	struct ectx x;
	struct zinf_event **sg_ev; /* sub-group k's gradient is final (recorded on cs) */
	uint8_t *sg_handed;	   /* sub-group k handed to the worker in this step */
};

/*
 * The gradient window (optimizer on NVMe): a store of one "grad" tensor per sub-group over the
 * optimizer's swap space, whose pool's buffers are the window's slots. Used by the calling
 * thread only; a slot handed to the step worker comes back when the worker has finished queue
 * position qpos (w->finished > qpos).
 */
struct gslot {
	int32_t sg;    /* sub-group held, -1: free */
	bool dirty;    /* differs from its grad tensor */
	bool handed;   /* the step worker reads it */
	uint32_t qpos; /* the worker's queue position (handed) */
	uint64_t tick; /* last use (least recently used goes first) */
	float *mem;    /* the sub-group's gradient: its tensor's buffer */
};

enum { GW_NONE = 0, GW_HAS = 1, GW_STEPPED = 2, GW_SPEC = 3 };

struct gwin {
	uint32_t n;		  /* slots; 0: no window (tiers none and cpu: grad_part) */
	struct zinf_pool *pool;	  /* n buffers of max_sg floats: the slots */
	struct zinf_store *store; /* the grad tensors */
	struct gslot *slot;
	int32_t *sg_slot; /* per sub-group: its slot or -1 */
	uint8_t *sg_has;  /* per sub-group: GW_NONE, GW_HAS (an accumulation of this window, in
			     its slot or its file), GW_STEPPED (its gradient was stepped),
			     GW_SPEC (stepped speculatively: kept, in its slot or its file, until
			     the step is validated or redone) */
	int *sg_id;	  /* per sub-group: its "grad" tensor in the store */
	uint64_t tick;
};

/*
 * The speculative step (engine_spec.c): with clipping or fp16 (gate) and the step worker, the
 * boundary's sub-groups are stepped during backward with the assumed grad_scale 1/S; each one
 * keeps its previous state in a reserve slot until zinf_engine_step knows the norm. A slot:
 * every optimizer part of one sub-group (max_sg elements each), then its 16-bit values, each
 * aligned to `align`; device memory (tier none) or the optimizer pool's CPU region.
 */
struct espec {
	uint32_t n;				/* slots; 0: no speculation */
	uint32_t used;				/* slots taken this step (by hand(), main thread) */
	uint64_t stride;			/* bytes per slot */
	uint64_t off[ZINF_OPTIM_MAX_PARTS + 1]; /* part i's offset in a slot; [nparts]: 16-bit */
	char *mem;				/* n * stride bytes */
	bool dev;				/* mem is device memory (tier none) */
	int32_t *sg_slot;			/* per sub-group: its slot this step, or -1 */
	float scale0;				/* the assumed grad_scale of the step in progress */
	int err;				/* resolve's error, for eng_step_run to agree on */
	bool closed;				/* zinf_engine_step began: the norm is close, no
						   more speculation */
};

struct eparam;

/* What a tier's setup makes room for on behalf of the others (engine_init.c gives it). */
struct eng_tier_needs {
	/* bytes of the pool's pinned CPU region the others carve after setup, aligned to align */
	uint64_t (*pinned)(const struct zinf_engine *e, uint32_t align);
	/* the window tier: further tensors declared in the optimizer's swap space (the gradient
	   window's) before it is reserved */
	int (*declare)(struct zinf_engine *e);
};

/*
 * Where the optimizer state lives (engine_otier.c): one table per tier, chosen at create from
 * offload_optimizer.device: eng_otier_gpu (none), eng_otier_cpu, eng_otier_nvme.
 */
struct eng_otier {
	const char *name;
	bool dev;	  /* the state, the gradient partition and the speculation's reserve are
			     device memory (else host memory) */
	bool whole;	  /* init and load write a sub-group's master whole (else in pieces) */
	bool reads_ahead; /* a step may begin before its first sub-group is final (its reads) */
	bool window;	  /* the gradients go to the gradient window (engine_gwin.c), not to a
			     gradient partition */
	/* init: the state, the gradient partition, the copy and staging buffers; sets os.align,
	   the alignment of what the others carve from its pool */
	int (*setup)(struct zinf_engine *e, const struct eng_tier_needs *needs);
	/* the sizes of setup's pool (buffers, CPU region; align: its swap space's for nvme) into
	 *po, from the layout alone: setup and zinf_engine_plan size it by this. 0: no pool */
	int (*pool)(const struct zinf_engine *e, const struct eng_tier_needs *needs, uint32_t align,
		    struct zinf_pool_opts *po);
	void (*free)(struct zinf_engine *e);
	/* the master weights of sub-group k's flat elements [off, off + n) from host memory m
	   (whole: the sub-group), the moments left as they are (zero at init); a bf16 master is
	   rounded to nearest (m may be overwritten: nvme rounds it in place) */
	int (*write_master)(struct zinf_engine *e, uint32_t k, uint64_t off, float *m, uint64_t n);
	/* this rank's partition of p's master into mine (host, fp32: a bf16 master widened); sg:
	   host memory for the whole sub-group's master as float (whole tiers) */
	int (*read_master)(struct zinf_engine *e, const struct eparam *p, float *mine, float *sg);
	size_t (*bounce_bytes)(const struct zinf_engine *e);
	int (*visit)(struct zinf_engine *e, uint32_t k, bool write, eng_visit_fn fn, void *ctx,
		     void *bounce, struct zinf_stream *cs);
	/* a step's pass: begin, each sub-group (on the thread of x), a sub-group left out, the end
	   (its I/O counted into the window) */
	int (*begin)(struct zinf_engine *e);
	int (*step)(struct zinf_engine *e, struct ectx *x, uint32_t k, float *grad);
	int (*skip)(struct zinf_engine *e, uint32_t k);
	int (*finish)(struct zinf_engine *e, bool partial);
	/* the speculative step: sub-group k's state into its reserve slot before it is stepped
	   (nvme: zinf_step's before callback keeps it as read), and back on a roll-back */
	int (*keep)(struct zinf_engine *e, const struct ectx *x, uint32_t k, char *slot);
	int (*restore)(struct zinf_engine *e, uint32_t k, const char *slot);
};
extern const struct eng_otier eng_otier_gpu, eng_otier_cpu, eng_otier_nvme;
/* What the optimizer tier's pool holds for the others, and the window's declarations: the
 * needs init passes to its setup (engine_init.c). */
extern const struct eng_tier_needs eng_step_needs;

/*
 * The home of the 16-bit parameters (engine_ptier.c): eng_ptier_full at stages 0-2 (every
 * tensor gathered on the device), at stage 3 one table per offload_param.device:
 * eng_ptier_gpu (none), eng_ptier_cpu, eng_ptier_nvme.
 */
struct eng_ptier {
	const char *name;
	bool queues; /* write copies from a host source on x->s (the caller syncs before reusing
			the source) */
	bool reads;  /* a partition is read into a store buffer first: read_begin, put, then
			read_end once cs finished the copy, under store_mu */
	int (*setup)(struct zinf_engine *e); /* every parameter's home */
	/* the sizes of setup's pool into *po (align: nvme's swap space's), as otier's pool; 0:
	   no pool */
	int (*pool)(const struct zinf_engine *e, uint32_t align, struct zinf_pool_opts *po);
	void (*free)(struct zinf_engine *e);
	/* partition elements [off, off + len) of p from src (device memory when src_dev) */
	int (*write)(struct zinf_engine *e, const struct ectx *x, struct eparam *p, uint64_t off,
		     const char *src, bool src_dev, uint64_t len);
	/* p's whole partition into dst (device memory when dst_dev), on x->s */
	int (*read)(struct zinf_engine *e, const struct ectx *x, struct eparam *p, char *dst,
		    bool dst_dev);
	/* a fetch: p's partition at its place in p->dev_full, on cs */
	int (*read_begin)(struct zinf_engine *e, struct eparam *p);
	int (*put)(struct zinf_engine *e, struct eparam *p);
	int (*read_end)(struct zinf_engine *e, struct eparam *p);
	/* reads tiers, along the trace: start reading p ahead (refused: read at its fetch), and
	   whether its read is done (a gather then waits for none) */
	void (*prefetch)(struct zinf_engine *e, struct eparam *p);
	bool (*read_done)(struct zinf_engine *e, const struct eparam *p);
};
extern const struct eng_ptier eng_ptier_full, eng_ptier_gpu, eng_ptier_cpu, eng_ptier_nvme;
/* e->ot and e->pt from the options (create, zinf_engine_plan). engine_otier.c */
void eng_choose_tiers(struct zinf_engine *e);
/* create's checks of the options (engine.c), for zinf_engine_plan. */
int eng_check_opts(const struct zinf_engine_opts *o);

/* One registered parameter. */
struct eparam {
	char *name;
	uint64_t numel;
	int32_t layer;
	uint32_t id;
	enum zinf_dtype init_dtype;
	const void *init;
	zinf_param_init_fn init_fn;
	void *init_ctx;
	uint32_t ndim;
	uint64_t shape[ZINF_PARAM_MAX_DIMS];

	struct zinf_comm_part part; /* W-partition (W = 1 at stage 0) */
	uint64_t flat_off;	    /* offset of this rank's partition in the flat partition */
	uint32_t sg;		    /* sub-group holding it */
	bool persistent;	    /* stage 3: always gathered */
	bool no_decay;		    /* ZINF_PARAM_NO_DECAY: stepped with weight decay 0 */
	uint32_t grads;		    /* gradients handed in this pass (eng_pass_n of them) */

	/* 16-bit values (opts.dtype) */
	void *dev_full;	       /* stages 0-2 and persistent: padded elements, always valid;
				  stage 3: the gathered buffer while fetched (else NULL) */
	struct gbuf *gathered; /* stage 3, not persistent: the free-list entry of dev_full */
	void *dev_part;	       /* stage 3, param tier none: this rank's partition */
	void *cpu_part;	       /* stage 3, param tier cpu: pinned partition */
	int store_id;	       /* stage 3, param tier nvme: the store tensor */
};

/* A layer: the parameters fetched together. */
struct elayer {
	int32_t layer;
	uint32_t n;
	uint32_t *params;
	uint64_t gather_elems;	     /* padded elements of its non-persistent parameters */
	struct zinf_comm_req **reqs; /* n: all-gathers in flight (stage 3) */
	bool fetched;		     /* between fetch and release */
	bool gathered;		     /* its buffers hold the values (fetched, prefetched, kept) */
	bool prefetched;	     /* gathered ahead of its fetch */
};

/* A gathered device buffer (stage 3), on a size-keyed free list when not in use. */
struct gbuf {
	void *dev;
	size_t bytes;
	struct zinf_event *released; /* recorded on compute at release: reuse after it */
	struct gbuf *next;
};

/* A gradient bucket: fp32 on the device; the collective runs in place (all-reduce) or into
 * recv (reduce-scatter). */
struct bucket {
	float *dev;	 /* capacity elements */
	float *dev_recv; /* reduce-scatter: capacity / W elements */
	uint64_t used;	 /* elements (full tensors for all-reduce; per segment for
			    reduce-scatter) */
	uint32_t n;	 /* parameters in it */
	uint32_t *params;
	uint64_t *offs; /* parameter i's offset in the bucket (segment offset for RS) */
	struct zinf_comm_req *req;
	bool posted;
	uint32_t *mb; /* entry i's micro-batch index in the window (a vertical pass has several) */
};

/* Fetch and trace (engine_fetch.c, engine_trace.c): stage 3's gathered buffers, the live bound,
 * the fetch trace and the prefetch along it. */
struct efetch {
	struct gbuf *free_list;
	uint64_t free_bytes; /* on the free list */
	uint64_t gbuf_bytes; /* gathered buffers allocated: in use and on the free list */
	uint64_t live_elems, peak_live, persistent_elems; /* padded (device memory) */
	uint64_t pf_inflight;				  /* elements prefetched, not yet fetched */
	bool warned_live, warned_trace;
	enum { TRACE_NONE, TRACE_RECORDING, TRACE_VALID, TRACE_INVALID } tr_state;
	int32_t *trace;
	uint32_t trace_n, trace_cap, cursor;
	uint64_t trace_hits, trace_misses, trace_invalidations;
};

/* Gradients (engine_grad.c): the buckets, their reduction, the accumulation into the tier's
 * gradient partition or, with the optimizer on NVMe, into the gradient window. */
struct egrad {
	uint64_t bucket_cap; /* elements */
	struct bucket bk[2];
	int cur;	      /* bucket being filled */
	uint32_t *sg_pending; /* per sub-group: parameters whose gradient is not yet accumulated */
	struct gwin gw;	      /* nvme: the gradient window instead of the gradient partition */
	float *host_stage;    /* pinned: bucket_cap / W elements (cpu/nvme) */
};

/* Gradient clipping and fp16 loss scaling (engine_clip.c). */
struct eclip {
	bool gate;		    /* clipping or fp16: the step waits for the global norm */
	struct zinf_loss_scaler ls; /* fp16.enabled */
	double *sg_sumsq;	    /* host: per sub-group, its final gradient's sum of squares */
	double *dev_sumsq;	    /* tier gpu: the same in device memory */
	float *clip_dev;	    /* nccl, W > 1: 4 floats per rank, the norms' exchange */
	uint64_t skipped;	    /* skipped steps */
};

/* The optimizer tier's state (engine_otier.c). */
struct eostate {
	void *state[ZINF_OPTIM_MAX_PARTS]; /* flat arrays: device (gpu) or pinned (cpu) */
	float *grad_part;		   /* fp32 accumulation: device (gpu) or pinned (cpu) */
	void *dev_copy;			   /* device: ZINF_STEP_CHUNK elements of dtype */
	void *host_copy;		   /* host: ZINF_STEP_CHUNK elements of dtype */
	struct zinf_pool *opool;
	struct zinf_swap *oswap;
	struct zinf_step *step; /* nvme */
	uint32_t align;		/* of what the others carve from opool (0: no pool) */
	/* nvme: called with a sub-group's state as read, before the optimizer runs on it (the
	   speculative step keeps it: engine_spec.c sets it) */
	int (*keep_read)(struct zinf_engine *e, uint32_t k, const void *const parts[],
			 uint64_t len);
	/* cpu with q8 state: n_sg + 1 byte offsets of the sub-groups in a q8 part's array (each
	   sub-group a q8 array of its own, blocks from its start); NULL otherwise */
	uint64_t *q8_off;
};

/* The parameter tier's state (engine_ptier.c): its pool, and for nvme the store and the
 * partition being written. */
struct epstore {
	struct zinf_pool *ppool;
	struct zinf_swap *pswap;
	struct zinf_store *store;
	pthread_mutex_t store_mu; /* the store: fetch (caller) and the step worker */
	bool store_mu_init;
	int64_t nv_open;      /* param id whose NVMe partition is being written, or -1 */
	uint64_t nv_next;     /* its next element */
	void *nv_buf;	      /* its store buffer */
	uint64_t store_read0; /* the store's bytes read at the window's start */
};

struct zinf_engine {
	struct zinf_engine_opts o;
	char *device_backend, *comm_backend, *io_backend, *swap_prefix;
	char *param_paths[ZINF_ENGINE_MAX_PATHS], *optim_paths[ZINF_ENGINE_MAX_PATHS];
	struct zinf_device *dev;
	bool own_dev;
	bool dev_chosen;      /* the device index came from the environment (local_rank_env) */
	int dev_count;	      /* devices of its backend then */
	const char *dev_from; /* the variable it came from, NULL: none (device 0) */
	struct zinf_comm *comm;
	bool own_comm;
	bool host_comm; /* collectives on host buffers on the calling thread */
	int rank, world, W;
	struct zinf_stream *compute;
	struct zinf_stream *cs;
	struct zinf_event *ev_compute, *ev_cs;
	void *scratch;	    /* device: ENG_SCRATCH floats for eng_all_max */
	struct ectx main;   /* {cs, &win} */
	struct ectx *cb;    /* the context zinf_step's copy callback writes with */
	struct zinf_io *io; /* the NVMe tiers' I/O context */

	struct zinf_optimizer *opt;
	float lr;		      /* set by zinf_engine_set_lr */
	float step_lr;		      /* in the optimizer: latched for the step in progress */
	float beta1, beta2;	      /* set by zinf_engine_set_betas */
	float step_beta1, step_beta2; /* in the optimizer, latched as step_lr */
	uint32_t nparts;

	/* parameters and layers */
	uint32_t n_params, cap_params;
	uint64_t reg_elems; /* elements registered (at most ZINF_ENGINE_MAX_ELEMS) */
	struct eparam *params;
	uint32_t n_layers;
	struct elayer *layers; /* sorted by layer */
	uint32_t *order;       /* parameter ids in flat (backward) order */
	bool inited;
	int failed; /* the error that failed the engine for good (eng_return), 0 while usable */
	/* the public call in progress (eng_begin .. eng_return) */
	struct {
		const char *what; /* its name, for messages */
		enum eng_rule rule;
		bool committed; /* eng_commit: any error from here on fails the engine */
		int known;	/* an error every rank knows (eng_agree, eng_known): no notice */
	} call;

	/* flat partition and sub-groups */
	uint64_t flat_n;
	uint32_t n_sg;
	uint64_t *sg_end;    /* exclusive ends */
	uint32_t *sg_params; /* parameters per sub-group */
	uint32_t *sg_first;  /* index in order[] of its first parameter */
	uint64_t max_sg;     /* longest sub-group */

	/* where the state lives: the tables and their state */
	const struct eng_otier *ot;
	const struct eng_ptier *pt;
	struct eostate os;
	struct epstore ps;

	/* the window: its position, the step's scale, the concerns' own state */
	uint32_t micro;	     /* micro-batch index in the window */
	uint32_t grads_seen; /* gradients handed this micro-batch */
	float step_scale;    /* grad_scale of the step in progress (1 without gate; with gate: the
				assumed one during backward, then decided) */
	struct egrad gr;
	struct efetch fx;
	struct eclip cl;
	struct eworker w;
	struct espec sp; /* the speculative step's reserve (engine_spec.c) */

	/* statistics */
	int64_t steps;
	uint64_t micro_steps;
	struct zinf_engine_stats win; /* the current window's byte counters and times */
	struct zinf_engine_stats last;
	double window_t0;

	/* a background job (engine_module.h: a checkpoint's save) in flight, the last one's result
	 */
	struct {
		const struct eng_job_ops *ops;
		void *ctx;
		int last;
	} job;

	/* the pass in progress (zinf_engine_vertical): its micro-batches, 0 for one; whether the
	   window's last micro-batch's first gradient opened the optimizer window (eng_window_open)
	 */
	uint32_t vert_n;
	bool win_opened;
};

/* engine_call.c */
#define ENG_SCRATCH 8
int eng_all_max(struct zinf_engine *e, float *v, uint32_t n); /* MAX over ranks, in place */
/* the error boundary, eng_agree, eng_cause, eng_order: engine_module.h */
/*
 * Device memory that collectives use (gathered parameters, gradient buckets, the small
 * all-reduces' scratch). Once the communicator failed a collective given up on it may still
 * be written by MPI (another rank failed in the middle of it): eng_comm_buf_free then leaves
 * the buffer to it instead of freeing it (the process is told to exit; zc_leave tells
 * LeakSanitizer so, which still reports such a buffer a healthy run loses).
 */
int eng_comm_buf_alloc(struct zinf_engine *e, size_t bytes, void **out);
void eng_comm_buf_free(struct zinf_engine *e, void *p);
struct elayer *eng_layer(struct zinf_engine *e, int32_t layer);
bool eng_all_zero(const void *p, size_t n);    /* reserved option bytes */
void eng_win_io_zero(struct zinf_engine *e);   /* the window's NVMe byte counters to 0 */
size_t eng_dsize(const struct zinf_engine *e); /* bytes per 16-bit element (opts.dtype) */
int eng_latch_lr(struct zinf_engine *e);       /* the lr and betas set become the step's */

/* engine_param.c: the layout at init (layers sorted, partitions, sub-groups of whole
 * parameters, the homes) */
int eng_build_layers(struct zinf_engine *e);
int eng_build_partitions(struct zinf_engine *e);
int eng_param_homes(struct zinf_engine *e);
/* Every partition fits the parameter tier's buffers (offload_param.buffer_size, nvme): -EINVAL
 * naming the first that does not (init, zinf_engine_plan). */
int eng_param_fit(const struct zinf_engine *e);
int eng_param_home_write(struct zinf_engine *e, const struct ectx *x, uint64_t flat_start,
			 const void *src, bool src_dev, uint64_t n);
void eng_param_free(struct zinf_engine *e);
/* Sub-group k's 16-bit values from their homes into dst (device memory when dst_dev), on x->s,
 * finished before returning: the reverse of eng_param_home_write. */
int eng_param_home_read(struct zinf_engine *e, const struct ectx *x, uint32_t k, char *dst,
			bool dst_dev);

/* engine_match.c: every rank the same options and parameter table (init, before the layout's
 * collectives); -EINVAL on every rank naming the first difference */
int eng_ranks_match(struct zinf_engine *e);

/* engine_ptier.c: the parameter tier's state for the files beside it */
void eng_param_io_stats(struct zinf_engine *e);	   /* the store's NVMe bytes into the window */
void eng_param_write_abort(struct zinf_engine *e); /* a partition left open by a failed step */
int eng_param_write(struct zinf_engine *e, const struct ectx *x, struct eparam *p, uint64_t off,
		    const char *src, bool src_dev, uint64_t len); /* a piece of p home */
void eng_store_lock(struct zinf_engine *e); /* the store's mutex (fetch and the step worker) */
void eng_store_unlock(struct zinf_engine *e);
void eng_ptier_destroy(struct zinf_engine *e);
int eng_open_swap(struct zinf_engine *e, const struct zinf_offload_opts *s, const char *what,
		  struct zinf_swap **out);
/* What init's I/O set-up will refuse, checked ahead: the I/O context's options as init builds
 * them, and every nvme_path of a tier on NVMe as the swap space opens it (zinf_swap_check_dir).
 * Every problem logged; the first one's -errno. (zinf_engine_opts_check) */
int eng_check_io(const struct zinf_engine_opts *o);

/* engine_fetch.c */
void eng_fetch_start(struct zinf_engine *e); /* init's end: the persistent parameters live */
int eng_fetch_drop_all(struct zinf_engine *e);

/* engine_gather.c */
int eng_gather_full(struct zinf_engine *e, struct eparam *p); /* partition -> p->dev_full */
int eng_refresh_persistent(struct zinf_engine *e);
int eng_gather_after_step(struct zinf_engine *e);
int eng_gather_start(struct zinf_engine *e, struct elayer *l);	/* all-gathers left in flight */
int eng_gather_finish(struct zinf_engine *e, struct elayer *l); /* complete them */
int eng_gather_drop(struct zinf_engine *e, struct elayer *l);	/* its buffers back */
void eng_gather_free(struct zinf_engine *e);
void eng_gather_trim(struct zinf_engine *e); /* the buffer cache back within its budget */

/* engine_trace.c */
int eng_trace_fetch(struct zinf_engine *e, int32_t layer);
void eng_trace_micro_end(struct zinf_engine *e);
uint64_t eng_reuse_distance(struct zinf_engine *e, uint32_t from, int32_t layer);
int eng_prefetch(struct zinf_engine *e);

/* engine_grad.c */
int eng_grad_setup(struct zinf_engine *e);
int eng_grad_flush(struct zinf_engine *e); /* close the current bucket, complete every one */
void eng_grad_free(struct zinf_engine *e);
/* The optimizer window opens (the first gradient of its last micro-batch): a background job
 * ends, the lr and betas are latched, the speculative step assumes its grad_scale, the step
 * worker may begin reading ahead. */
int eng_window_open(struct zinf_engine *e);

/* engine_gwin.c: the gradient window: its pool and store, the grad tensors declared (before
 * zinf_swap_reserve); the pool's bytes (statistics) */
int eng_gwin_declare(struct zinf_engine *e);
uint64_t eng_gwin_pool_bytes(const struct zinf_engine *e);
/* The window's pool sizes (align: the optimizer's swap space's), as eng_gwin_declare makes it;
 * 0: no window (the optimizer is not on NVMe). */
int eng_gwin_pool(const struct zinf_engine *e, uint32_t align, struct zinf_pool_opts *po);
void eng_gwin_free(struct zinf_engine *e);
int eng_gwin_load(struct zinf_engine *e, uint32_t k); /* sub-group k resident in a slot */
/* the same; `fill`: a new slot is not zeroed (the caller writes every element first) */
int eng_gwin_load_fill(struct zinf_engine *e, uint32_t k, bool fill);
/* sub-group k's slot, loaded (as eng_gwin_load_fill) and marked changed; NULL and *ret */
float *eng_gwin_write(struct zinf_engine *e, uint32_t k, bool fill, int *ret);
void eng_gwin_hand(struct zinf_engine *e, uint32_t k, uint32_t qpos); /* to the worker */
void eng_gwin_drop(struct zinf_engine *e, uint32_t k); /* stepped: its slot is free */
void eng_gwin_reset(struct zinf_engine *e);	       /* the window's end: every slot free */
void eng_gwin_reclaim(struct zinf_engine *e);	       /* the slots of what the worker finished */
/* sub-group k's fp32 gradient (grad_part, or its slot: resident) */
float *eng_grad_of(struct zinf_engine *e, uint32_t k);

/* engine_init.c: the step's side set up at init, and freed */
int eng_step_setup(struct zinf_engine *e);
/* The gradient buckets' capacity in elements (at least the largest parameter, padded). */
uint64_t eng_bucket_cap(const struct zinf_engine *e);
void eng_step_free(struct zinf_engine *e);

/*
 * The master shares the 16-bit parameters' home: the optimizer on NVMe with a bf16 master and
 * bf16 parameters, where the step's 16-bit copy is the master's own bits. Part 0 is then no swap
 * tensor of the optimizer (zinf_step's external part): the step fills it from the parameters'
 * home before the optimizer runs and the copy it writes home is the new master; init, load,
 * read_master, checkpoints and the speculative step's roll-back go through the home likewise.
 * Not with the parameters on NVMe and no parameter cache (offload_param.max_in_cpu 0): every
 * fill would read its partitions from the files on the step worker, not ahead like the state's
 * parts, and the step measured 8-25% slower for its 2 fewer bytes per parameter (bench/RESULTS.md,
 * issue 23); there the master keeps its place in the optimizer's files.
 */
static inline bool
eng_master_shared(const struct zinf_engine *e)
{
	return e->ot == &eng_otier_nvme && e->o.optimizer.master_dtype == ZINF_BF16 &&
	       e->o.dtype == ZINF_BF16 &&
	       !(e->pt == &eng_ptier_nvme && e->o.offload_param.max_in_cpu == 0);
}

/* Micro-batches of the pass in progress: zinf_engine_vertical's n, else 1. */
static inline uint32_t
eng_pass_n(const struct zinf_engine *e)
{
	return e->vert_n ? e->vert_n : 1;
}

/* Whether the pass in progress holds the window's last micro-batch. */
static inline bool
eng_pass_last(const struct zinf_engine *e)
{
	return e->micro + eng_pass_n(e) == e->o.gradient_accumulation_steps;
}

static inline uint64_t
eng_sg_start(const struct zinf_engine *e, uint32_t k)
{
	return k ? e->sg_end[k - 1] : 0;
}

/* Whether a parameter of layer l is in a sub-group handed to the step worker this step (its
 * values are being stepped: neither fetched nor prefetched until the step ends). */
static inline bool
eng_layer_handed(const struct zinf_engine *e, const struct elayer *l)
{
	for (uint32_t i = 0; e->w.sg_handed && i < l->n; i++) {
		if (e->w.sg_handed[e->params[l->params[i]].sg]) {
			return true;
		}
	}
	return false;
}

/* engine_clip.c */
int eng_clip_init(struct zinf_engine *e);  /* create: check the options, set up the scaler */
int eng_clip_setup(struct zinf_engine *e); /* init: per sub-group buffers */
void eng_clip_free(struct zinf_engine *e);
int eng_clip_sg(struct zinf_engine *e, uint32_t k);    /* k's gradient is final: its sumsq */
int eng_clip_decide(struct zinf_engine *e, float *gs); /* boundary: 0 step with *gs, 1 skip */
void eng_clip_stats(const struct zinf_engine *e, struct zinf_engine_stats *s);

/* engine_spec.c */
uint64_t eng_spec_bytes(const struct zinf_engine *e, uint32_t align); /* reserve, host tiers */
int eng_spec_setup(struct zinf_engine *e, uint32_t align); /* after the pools: the reserve */
void eng_spec_free(struct zinf_engine *e);
bool eng_spec_on(const struct zinf_engine *e);		/* gate, worker and a reserve */
void eng_spec_begin(struct zinf_engine *e);		/* boundary's first gradient: assume 1/S */
bool eng_spec_claim(struct zinf_engine *e, uint32_t k); /* a slot for k (false: none free) */
int eng_spec_save(struct zinf_engine *e, const struct ectx *x, uint32_t k); /* worker, before */
/* speculated sub-group k's previous state back (params16: and its 16-bit values), on cs */
int eng_spec_restore(struct zinf_engine *e, uint32_t k, bool params16);

/* engine_worker.c */
int eng_worker_start(struct zinf_engine *e);
void eng_worker_stop(struct zinf_engine *e);
int eng_worker_wait(struct zinf_engine *e);
void eng_worker_prime(struct zinf_engine *e);		/* begin the step's reads ahead (nvme) */
void eng_step_final(struct zinf_engine *e, uint32_t k); /* sub-group k's gradient is final */
void eng_worker_pump(struct zinf_engine *e); /* hand final sub-groups whose layers are released */
int eng_worker_hand(struct zinf_engine *e, uint32_t k); /* hand k now (its layers released) */
/* wait for the worker, end its step pass (partial: the sub-groups not handed are left out of
   it), fold its counters, reset it for the next step */
int eng_worker_end(struct zinf_engine *e, bool partial);

/* engine_step.c */
int eng_step_run(struct zinf_engine *e); /* the whole step at the boundary */

#endif
