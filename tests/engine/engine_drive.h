/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/engine_drive.h: the tests' trainer: engine options for the test model, its
 * registration, and micro-batches driven through the engine exactly as engine.h's loop says
 * (forward: fetch, read the parameters after zinf_stream_sync of the compute stream, release;
 * backward in reverse: fetch, check the parameters are those of the forward, hand every
 * gradient, release; then zinf_engine_step), computing on the host with engine_ref.h's model.
 * Used by the single-process Criterion tests and by the multi-rank program alike. Not here:
 * assertions (the callers make them) and the reference.
 */
#ifndef ZINF_TEST_ENGINE_DRIVE_H
#define ZINF_TEST_ENGINE_DRIVE_H

#include "engine/engine_ref.h"
#include "zinf/engine.h"

/* The tests' Adam: AdamW, lr 0.01, eps 0.05 (large, so that the update depends on the gradient's
 * size and not only its sign), weight decay 0.01. */
void edrive_optimizer(struct zinf_optimizer_opts *o);

/*
 * The device the tests run on: ZINF_TEST_DEVICE ("host", the default, or "cuda"). With "cuda"
 * the collectives are "nccl" wherever a test asks for "mpi".
 */
const char *edrive_device(void);

/*
 * Options for the test model: edrive_device() (host: asynchronous streams), the comm backend,
 * stage, tiers (nvme_dir for both NVMe tiers, one directory), dtype and accumulation; tiny
 * buckets and sub-groups (64 elements: several per rank), no persistent parameters, reuse
 * distance 0 (release frees), nothing cached after release, swap prefix "etest".
 */
void edrive_opts(struct zinf_engine_opts *o, const char *comm_backend, int stage,
		 enum zinf_offload_device opt_tier, enum zinf_offload_device param_tier,
		 const char *nvme_dir, enum zinf_dtype dtype, uint32_t gas);

/* Register the six parameters (weights by init_fn, biases by an fp32 init array). 0 or the
 * first error. */
int edrive_add_params(struct zinf_engine *e);

enum edrive_order {
	EDRIVE_ORDER_NORMAL = 0,  /* forward 0,1,2 (each released before the next) */
	EDRIVE_ORDER_CHANGED = 1, /* forward 2,0,1, all three live together */
};

struct edrive {
	struct zinf_engine *e;
	int rank;
	enum zinf_dtype dtype;	       /* of the parameters and of the gradients handed */
	float quantum;		       /* eref_grad's */
	float *grad_dev[EREF_NPARAMS]; /* gradient buffers in device memory (engine's device) */
	void *stage[EREF_NPARAMS];     /* host staging of a gradient's bytes (copied to grad_dev on
					  the compute stream) */
	void *rd;		       /* host staging of a parameter's bytes (copied from the
					  device on the compute stream) */
	float *host[EREF_NPARAMS];     /* fp32 parameters read in the forward */
	float *g[EREF_NPARAMS];	       /* fp32 gradients */
	char why[256];		       /* what failed, for the caller's message */
	/* 1 + the step index whose micro-batch inf_micro hands W0's first gradient element as an
	   infinity (an fp16 overflow in that micro-batch); 0: none */
	int64_t inf_step1;
	uint32_t inf_micro;
};

/* Allocate the buffers for engine e (after zinf_engine_init). 0 or -ENOMEM. */
int edrive_init(struct edrive *d, struct zinf_engine *e, enum zinf_dtype dtype, float quantum);
void edrive_fini(struct edrive *d);

/* Read parameter id (fetched) into dst as fp32, after syncing the compute stream. */
int edrive_read_param(struct edrive *d, uint32_t id, float *dst);

/*
 * One micro-batch (step index `step` from 0, micro index `micro`) in the given fetch order.
 * Returns zinf_engine_step()'s value (1: the optimizer stepped), or the first negative errno of
 * any call (d->why says which call); -EILSEQ when a parameter fetched in backward differs from
 * the forward's.
 */
int edrive_micro(struct edrive *d, int64_t step, uint32_t micro, enum edrive_order order);

/*
 * `steps` optimizer steps of `gas` micro-batches, starting at step index first_step; from step
 * index change_at on (-1: never) the forward uses EDRIVE_ORDER_CHANGED. Checks that
 * zinf_engine_step returns 1 (2 where d->inf_step1 says the step is skipped) exactly at the end of
 * each window (-EPROTO otherwise, d->why).
 */
int edrive_run(struct edrive *d, int64_t first_step, int steps, uint32_t gas, int change_at);

/*
 * One vertical pass (zinf_engine_vertical(n)): micro-batches micro..micro+n-1 of step index
 * `step`, each layer fetched once in the forward (its parameters read once: every micro-batch's
 * gradients are computed from them, as edrive_micro computes each micro-batch's) and once in the
 * backward (checked equal to the forward's), every parameter's n gradients handed one after the
 * other in micro-batch order, then zinf_engine_step. Returns zinf_engine_step()'s value or the
 * first negative errno (d->why says which call).
 */
int edrive_vertical(struct edrive *d, int64_t step, uint32_t micro, uint32_t n);

/*
 * edrive_run's steps in vertical passes of at most `pass` micro-batches (the window's last pass
 * takes what is left: gas 3, pass 2: passes of 2 and 1). Checks that zinf_engine_step returns 1
 * (2 where the step is skipped: only where d->inf_step1 says) exactly at each window's end.
 */
int edrive_run_vertical(struct edrive *d, int64_t first_step, int steps, uint32_t gas,
			uint32_t pass);

/* zinf_engine_read_master of every parameter into out[id] (eref_numel(id) floats each). */
int edrive_read_master(struct zinf_engine *e, float *const out[EREF_NPARAMS]);

#endif
