/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zinf/adam.h: CPU optimizers (Adam/AdamW; Adagrad and Lion follow in this header) in one fused
 * pass: unscale the gradient, update master and moments, write the 16-bit parameter copy.
 * Vectorised (AVX-512, AVX2+FMA, scalar; chosen once by CPU detection, overridable with
 * ZINF_SIMD=scalar|avx2|avx512) and threaded with OpenMP over cache-sized tiles.
 */
#ifndef ZINF_ADAM_H
#define ZINF_ADAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zinf/common.h"

#ifdef __cplusplus
extern "C" {
#endif

enum zinf_dtype { ZINF_F32 = 0, ZINF_F16 = 1, ZINF_BF16 = 2 };

struct zinf_adam_opts {
	size_t size; /* sizeof(struct zinf_adam_opts) */
	float lr, beta1, beta2, eps, weight_decay;
	bool adamw_mode; /* true: decoupled weight decay (AdamW); false: L2 added to the gradient */
	bool bias_correction;
	int threads; /* 0: OpenMP's default */
};

/** DeepSpeed's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0, AdamW, bias
 * correction on, threads 0. */
ZINF_API void zinf_adam_opts_init(struct zinf_adam_opts *o);

/**
 * One step (step >= 1) over n elements. Gradients are multiplied by grad_scale before use
 * (the caller passes 1 / (loss_scale * clip_factor)). When param_copy is not NULL the updated
 * parameters are also written there as copy_dtype (round to nearest even).
 * Returns 0; -EINVAL on bad arguments (NULL pointers with n > 0, step < 1, non-finite
 * hyper-parameters, unknown dtype), with a message, modifying nothing.
 */
ZINF_API int zinf_adam_step(const struct zinf_adam_opts *o, int64_t step, float grad_scale,
			    float *param, const void *grad, enum zinf_dtype grad_dtype,
			    float *exp_avg, float *exp_avg_sq, size_t n, void *param_copy,
			    enum zinf_dtype copy_dtype);

#ifdef __cplusplus
}
#endif
#endif
