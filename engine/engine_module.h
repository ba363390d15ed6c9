/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_module.h: what the modules built over the engine core (ckpt/ today) may use of
 * it, and nothing more (as SPDK's bdev_module.h beside bdev.h): the error boundary of a public
 * call, a read-only view of the layout and of the parameters, the counters a checkpoint records,
 * the state visitor (a sub-group's optimizer state as host memory, wherever its tier keeps it),
 * the slot of a background job that must end before the optimizer state changes, and the two
 * ways of writing a whole new state (in place of init, or into a running engine). The core's
 * own files include engine_internal.h, which includes this. Not installed.
 */
#ifndef ZINF_ENGINE_MODULE_H
#define ZINF_ENGINE_MODULE_H

#include <stdbool.h>
#include <stdint.h>

#include "common/util.h"
#include "zinf/blocks/comm.h"
#include "zinf/engine.h"
#include "zinf/blocks/loss_scale.h"
#include "zinf/blocks/offload.h"

/* A message naming this rank; returns err. */
#define ENG_FAIL(e, err, fmt, ...)                                                                 \
	zc_log_emit((err), ZINF_LOG_ERROR, __FILE__, __LINE__, __func__, "engine rank %d: " fmt,   \
		    zinf_engine_rank(e), ##__VA_ARGS__)
#define ENG_WARN(e, fmt, ...)                                                                      \
	zc_log_emit(0, ZINF_LOG_WARN, __FILE__, __LINE__, __func__, "engine rank %d: " fmt,        \
		    zinf_engine_rank(e), ##__VA_ARGS__)

/* ---- the error boundary (engine_call.c) --------------------------------------------------------
 * Every public call that can fail runs between eng_begin and eng_return; inside, functions log
 * what failed (ENG_FAIL) and return the -errno, and decide nothing. eng_return alone decides
 * what the error does:
 *  - before eng_commit the call's rule applies: ENG_FAILS (fetch, release, param, grad, step: the
 *    other ranks are in the layer's or the window's collectives) fails the engine on any error
 *    but -EINVAL, which is the caller's mistake and leaves the engine as it was; ENG_KEEPS
 *    (init's checks, read_master, save, load's checks) leaves it usable;
 *  - after eng_commit (the call changed the engine's state, or this rank entered a sequence of
 *    collectives the others are in), every error fails the engine for good;
 *  - a failure is sent to the other ranks at once (zinf_comm_notify_failure), who may be waiting
 *    for this rank in a collective, unless every rank knows it already: eng_agree exchanged it,
 *    or eng_known marks it as computed by every rank from one collective.
 * eng_begin returns 0, or the engine's failure, or -EINVAL (a NULL engine; not initialised when
 * `inited`): a call returns that as it is, without eng_return.
 */
enum eng_rule {
	ENG_FAILS, /* an error other than -EINVAL fails the engine */
	ENG_KEEPS, /* an error before eng_commit leaves the engine usable */
};
int eng_begin(struct zinf_engine *e, const char *what, enum eng_rule rule, bool inited);
void eng_commit(struct zinf_engine *e);
int eng_known(struct zinf_engine *e, int err); /* returns err */
int eng_return(struct zinf_engine *e, int rc); /* returns rc */
/* Every rank learns whether some rank's `what` failed (err < 0 here), before the collectives
 * that follow, so that no rank waits for a failed one until the deadline: returns err on a
 * failed rank; on the others 0, or the failing rank's error with a message naming that rank.
 * The error it returns is known to every rank. */
int eng_agree(struct zinf_engine *e, int err, const char *what);
/* The same at the end of a step, also comparing the lr and betas it ran with: different values
 * on different ranks are -EINVAL on every rank, naming the range. */
int eng_agree_step(struct zinf_engine *e, int err, const char *what);
/* The error just logged on this thread (zinf_last_error()) without its "engine rank N: ". */
const char *eng_cause(const struct zinf_engine *e);
/* Queue on `to` a wait for everything queued on `from` so far. */
int eng_order(struct zinf_engine *e, struct zinf_stream *from, struct zinf_stream *to);

/* ---- the layout, read only ----------------------------------------------------------------- */

struct eng_view {
	const struct zinf_engine_opts *o; /* the engine's options (its own copy) */
	const struct zinf_optimizer *opt;
	uint32_t nparts;	     /* optimizer parts, master first */
	uint32_t n_params, n_layers; /* registered */
	uint32_t n_sg;		     /* sub-groups of this rank's flat partition */
	const uint64_t *sg_end;	     /* their exclusive ends */
	uint64_t flat_n;	     /* elements of this rank's flat partition */
	int rank, world, W;	     /* W: the partition count (1 at stage 0) */
	struct zinf_device *dev;
	struct zinf_io *io;	     /* NULL without an NVMe tier */
	struct zinf_stream *cs;	     /* the engine's stream */
	struct zinf_stream *compute; /* the trainer's */
	bool inited;
	bool in_window;	       /* a micro-batch of the window begun (micro or a gradient) */
	uint32_t micro;	       /* the window's micro-batch (0 .. gradient_accumulation - 1) */
	bool state_on_device;  /* the optimizer state lives in device memory */
	int32_t fetched_layer; /* a layer between fetch and release, or INT32_MIN */
};
void eng_view(const struct zinf_engine *e, struct eng_view *v);

/* One parameter as the layout holds it. */
struct eng_param {
	uint32_t id;
	const char *name;
	uint64_t numel;
	int32_t layer;
	uint32_t ndim;
	const uint64_t *shape;
	struct zinf_comm_part part; /* its W-partition */
	uint64_t flat_off;	    /* this rank's partition in the flat partition */
	uint32_t sg;		    /* the sub-group holding it */
	bool persistent;
	bool no_decay; /* ZINF_PARAM_NO_DECAY */
};
void eng_param_get(const struct zinf_engine *e, uint32_t id, struct eng_param *out);
/* The parameter at position i of the flat (backward) order, and the position of the one that
 * holds flat element x (n_params past the end). */
uint32_t eng_flat_param(const struct zinf_engine *e, uint32_t i);
uint32_t eng_flat_find(const struct zinf_engine *e, uint64_t x);

/* ---- the counters a checkpoint records and restores ---------------------------------------- */

struct eng_counters {
	int64_t steps;
	uint64_t micro_steps, skipped;
	float lr, beta1, beta2;
	struct zinf_loss_scaler ls;
};
void eng_counters_get(const struct zinf_engine *e, struct eng_counters *out);
/* Restores steps, micro_steps, skipped and lr; the betas where `betas` (and the optimizer has
 * them); the scaler's state (scale, hysteresis left, iter, last overflow, overflows; not its
 * settings) where `ls` (and fp16 is on). */
void eng_counters_set(struct zinf_engine *e, const struct eng_counters *c, bool betas, bool ls);

/* ---- the optimizer state of a sub-group as host memory ------------------------------------- */

/* fn gets flat elements [off, off + n) of every part (parts[i], optimizer part i); when writing
 * it fills them and they go back to the tier. A master that shares the 16-bit parameters' home
 * (the optimizer on NVMe, a bf16 master, bf16 parameters) is read from that home, and a write
 * does not keep part 0: the writer puts the master home as the 16-bit values
 * (eng_param_home_from_master, which a load calls for every tier). */
typedef int (*eng_visit_fn)(void *ctx, uint64_t off, uint64_t n, void *const parts[]);
/* Host memory a visit needs as a bounce buffer (the GPU tier), else 0. */
size_t eng_state_bounce_bytes(const struct zinf_engine *e);
/* bounce: eng_state_bounce_bytes() bytes or NULL; cs: the stream of the GPU tier's copies
 * (NULL: the engine's) */
int eng_state_visit(struct zinf_engine *e, uint32_t k, bool write, eng_visit_fn fn, void *ctx,
		    void *bounce, struct zinf_stream *cs);
/* Flat elements [off, off + n) of the master (host, of dtype mdt: f32, or bf16 with a bf16
 * master) into the 16-bit parameters' homes (copy: ZINF_STEP_CHUNK elements of the options'
 * dtype). */
int eng_param_home_from_master(struct zinf_engine *e, uint64_t off, const void *m,
			       enum zinf_dtype mdt, uint64_t n, void *copy);

/* ---- a background job: ends (collectively) before the optimizer state changes --------------
 * At most one: a checkpoint's save writing while training goes on. The core finishes it on
 * every rank at the same place, before anything changes the state it reads: at the first
 * gradient of the window's last micro-batch, and before a step, read_master or a load; it
 * abandons it at destroy. finish is collective and returns the job's result, kept for
 * eng_job_take_result; abandon joins it without publishing. */
struct eng_job_ops {
	int (*finish)(struct zinf_engine *e, void *ctx);
	void (*abandon)(struct zinf_engine *e, void *ctx);
};
void eng_job_start(struct zinf_engine *e, const struct eng_job_ops *ops, void *ctx);
bool eng_job_pending(const struct zinf_engine *e);
int eng_job_finish(struct zinf_engine *e);	/* 0 without one */
int eng_job_take_result(struct zinf_engine *e); /* the last finished job's, then 0 */

/* ---- writing a whole new state ------------------------------------------------------------- */

/* zinf_engine_init with `write` filling every tier's values (init: the initial values; a load: a
 * checkpoint's), then the gathers init does. Commits: a failure fails the engine. */
int eng_init_with(struct zinf_engine *e, int (*write)(struct zinf_engine *e, void *ctx), void *ctx);
/* The same into a running engine: the gathered copies dropped, `write`, the ranks agree, the
 * gathers again; the NVMe bytes it moved are not the window's. */
int eng_rewrite_with(struct zinf_engine *e, const char *what,
		     int (*write)(struct zinf_engine *e, void *ctx), void *ctx);

#endif
