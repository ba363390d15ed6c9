/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_adam/adam_scalars_internal.h: Adam's per-step scalars, computed in one place for every
 * kernel that runs the step: cpu_adam's own (adam.c) and the CUDA kernel, whose launcher's block
 * device/device.c fills from them (device sits above cpu_adam and may include this). Both must
 * see the same floats, or the GPU tier and the CPU tier stop being bit-identical. Nothing here
 * validates the options: the caller has (zinf_adam_step's checks).
 */
#ifndef ZINF_ADAM_SCALARS_INTERNAL_H
#define ZINF_ADAM_SCALARS_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "zinf/blocks/adam.h"

/* One Adam/AdamW step's scalars, each computed in float64 and rounded to float once. */
struct zinf_adam_scalars {
	bool l2;	/* add wd * p to the gradient (Adam with weight decay, not AdamW) */
	float wd;	/* L2 coefficient (used when l2) */
	float decay;	/* p *= decay first (AdamW: 1 - lr * wd; else 1) */
	float b1, omb1; /* beta1, 1 - beta1 */
	float b2, omb2; /* beta2, 1 - beta2 */
	float eps;
	float nstep;	    /* -lr / (1 - beta1^step), or -lr without bias correction */
	float bc2_sqrt;	    /* sqrt(1 - beta2^step), or 1 (the scalar path divides by it) */
	float inv_bc2_sqrt; /* 1 / sqrt(1 - beta2^step) from float64, or 1 (the vector paths and
			       the CUDA kernel multiply by it) */
};

/* The scalars of step `step` (>= 1) under the options *o (already taken and checked). */
void adam_scalars_get(const struct zinf_adam_opts *o, int64_t step, struct zinf_adam_scalars *out);

#endif
