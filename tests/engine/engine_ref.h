/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/engine_ref.h: the engine tests' model and its single-process reference.
 *
 * The model: a chain of three linear layers (15 -> 16 -> 7 -> 3, no activation) with a squared
 * loss, on data that depends on the rank, the step and the micro-batch; six parameters of uneven
 * sizes (240, 16, 112, 7, 21, 3 elements) so that every world size 2..4 pads some of them. Its
 * forward and backward are plain C in float, used both by the tests' trainer (on the engine's
 * fetched parameters) and by the reference, so that the two compute the same gradients from the
 * same parameter values bit for bit.
 *
 * The reference trains the model as the engine's contract says, in one process: per micro-batch
 * every rank's gradient, handed in the engine's dtype, is averaged as the mpi collective does
 * (fp32 sum in rank order, then one division by the world size), accumulated in fp32 over the
 * micro-batches of the window, and stepped by the library's optimizer kernel (zinf_optimizer_step
 * over whole tensors: for fp32 state each element's result depends on its inputs only, however
 * the engine cuts its sub-groups). With 16-bit training the forward uses the master weights
 * rounded to the dtype, as the engine's parameter copies are.
 *
 * Not here: the engine (engine_drive.h drives it), any tolerance (the tests state theirs).
 */
#ifndef ZINF_TEST_ENGINE_REF_H
#define ZINF_TEST_ENGINE_REF_H

#include <stdbool.h>
#include <stdint.h>

#include "zinf/common.h"
#include "zinf/blocks/optimizer.h"

#define EREF_NPARAMS 6
#define EREF_NLAYERS 3
#define EREF_BATCH   2 /* samples per rank and micro-batch */

struct eref_param {
	const char *name;
	uint32_t rows, cols; /* numel = rows * cols */
	int32_t layer;
};

/* The six parameters in registration order: W0 b0 (layer 0), W1 b1 (layer 1), W2 b2 (layer 2). */
extern const struct eref_param eref_params[EREF_NPARAMS];

static inline uint64_t
eref_numel(uint32_t id)
{
	return (uint64_t)eref_params[id].rows * eref_params[id].cols;
}

/* Initial value of element i of parameter id: a multiple of 2^-7 in [-0.25, 0.25) (exact in
 * bf16 and f16). */
float eref_init_value(uint32_t id, uint64_t i);
/* zinf_param_init_fn over eref_init_value (ctx unused). */
int eref_init_fn(void *ctx, uint32_t param, uint64_t first, uint64_t count, float *out);

/*
 * Gradients of the loss of rank `rank`'s micro-batch (step, micro) at parameters p (fp32 values,
 * p[id] has eref_numel(id) elements) into g. With quantum > 0 every gradient is rounded to a
 * multiple of quantum (a power of two): this model's gradients stay far below 2^6, and values of
 * magnitude below 2^6 on the grid 2^-14 (at most 2^20 units each) sum exactly in fp32 (24-bit
 * significand) over up to 8 ranks, in any order. Returns the loss (float64, for messages).
 */
double eref_grad(const float *const p[EREF_NPARAMS], int rank, int64_t step, uint32_t micro,
		 float quantum, float *const g[EREF_NPARAMS]);

/* Round x[0..n) through dtype and back (f32: unchanged). */
void eref_round(float *x, uint64_t n, enum zinf_dtype dtype);

struct eref_opts {
	int world;
	int steps;	       /* optimizer steps */
	uint32_t gas;	       /* micro-batches per step */
	enum zinf_dtype dtype; /* parameters seen by the forward, gradients handed */
	float quantum;	       /* eref_grad's */
	struct zinf_optimizer_opts opt;
	/* after step `lr_step` (1-based; 0: never), the learning rate becomes lr_after */
	int lr_step;
	float lr_after;
	/* after step `betas_step` (0: never), the betas become beta1_after, beta2_after */
	int betas_step;
	float beta1_after, beta2_after;
};

struct eref_result {
	float *master[EREF_NPARAMS]; /* fp32 master weights after the run (malloc'ed) */
	/* per step t (1-based, up to 64): the largest element of sum over micro-batches of
	   mean over ranks of |g_r| (for tolerances) */
	double abs_grad[65];
};

/* Train as described above. Returns 0 or a negative errno. Free with eref_result_free(). */
int eref_train(const struct eref_opts *o, struct eref_result *out);
void eref_result_free(struct eref_result *r);

#endif
