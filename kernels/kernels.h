/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kernels/kernels.h: the CUDA kernels' plain-C launchers (no CUDA type here: a stream is a
 * cudaStream_t passed as void *). Each launcher queues its kernel on `stream` and returns the
 * cudaError_t of its own launch, as an int (0: cudaSuccess; never an error left by an earlier
 * call or query on the thread); the
 * caller (device/dev_cuda.c) maps it to a negative errno with a message. Pointers are device
 * memory, n elements each. The C references of these kernels are the "host" device's
 * (device/dev_host.c): the tests compare the two.
 */
#ifndef ZINF_KERNELS_H
#define ZINF_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "zinf/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One Adam step's scalars, computed once in float64 and rounded to float: device/device.c copies
 * them from cpu_adam's adam_scalars_get, the same function cpu_adam's kernels use. */
struct zinf_k_adam {
	float grad_scale;
	float wd;	/* L2 coefficient, used when l2 */
	float decay;	/* p *= decay first (AdamW: 1 - lr * wd; else 1) */
	float b1, omb1; /* beta1, 1 - beta1 */
	float b2, omb2; /* beta2, 1 - beta2 */
	float eps;
	float nstep;	    /* -lr / (1 - beta1^step), or -lr */
	float inv_bc2_sqrt; /* 1 / sqrt(1 - beta2^step) from float64, or 1 */
	int l2;		    /* add wd * p to the gradient (Adam, not AdamW) */
};

/* Blocks of the first sum-of-squares pass: the scratch the caller passes holds this many
 * doubles. */
#define ZINF_K_SUMSQ_BLOCKS 1024

int kern_cast(void *stream, void *dst, enum zinf_dtype dst_dtype, const void *src,
	      enum zinf_dtype src_dtype, size_t n);
int kern_scale(void *stream, void *x, enum zinf_dtype dtype, float scale, size_t n);
int kern_accumulate(void *stream, float *dst, const void *src, enum zinf_dtype src_dtype, size_t n);
/* scratch: ZINF_K_SUMSQ_BLOCKS doubles of device memory, private to the stream. */
int kern_sumsq(void *stream, const void *x, enum zinf_dtype dtype, size_t n, double *scratch,
	       double *out);
int kern_nonfinite(void *stream, const void *x, enum zinf_dtype dtype, size_t n, uint32_t *flag);
/* bits: the fill value's bit pattern in dtype (converted by the caller). */
int kern_fill(void *stream, void *dst, enum zinf_dtype dtype, uint32_t bits, size_t n);
/*
 * The blockwise codec of common/quant.h: codes (qz_code_bytes(n, bits) bytes) and scales
 * (qz_blocks(n, block) floats) from x; err (optional, n floats): error feedback, as qz_quantize.
 * Dequantize: y = deq as dtype, or with accumulate y (f32) += deq.
 */
int kern_quantize(void *stream, void *codes, float *scales, const void *x, enum zinf_dtype dtype,
		  size_t n, size_t block, unsigned bits, float *err, float beta);
int kern_dequantize(void *stream, void *y, enum zinf_dtype dtype, const void *codes,
		    const float *scales, size_t n, size_t block, unsigned bits, int accumulate);
int kern_adam(void *stream, const struct zinf_k_adam *a, float *param, const void *grad,
	      enum zinf_dtype grad_dtype, float *m, float *v, void *copy,
	      enum zinf_dtype copy_dtype, size_t n);

#ifdef __cplusplus
}
#endif
#endif
