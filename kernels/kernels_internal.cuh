/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kernels/kernels_internal.cuh: what the .cu files share: the launch shape (grid-stride loops
 * over size_t indices) and the element load/store by dtype, through common/dtype.h's exact
 * conversions compiled for the device (the same code the host device and cpu_adam run).
 */
#ifndef ZINF_KERNELS_INTERNAL_CUH
#define ZINF_KERNELS_INTERNAL_CUH

#include <cuda_runtime.h>

#include "common/dtype.h"
#include "kernels/kernels.h"

#define ZINF_K_THREADS	  256
#define ZINF_K_MAX_BLOCKS 4096

/* Blocks for n elements, one per ZINF_K_THREADS up to ZINF_K_MAX_BLOCKS (grid-stride after). */
static inline unsigned
zinf_k_blocks(size_t n, unsigned max)
{
	size_t b = (n + ZINF_K_THREADS - 1) / ZINF_K_THREADS;
	return (unsigned)(b < max ? (b ? b : 1) : max);
}

#define ZINF_K_FOR(i, n)                                                                           \
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                    \
	     i += (size_t)gridDim.x * blockDim.x)

static __device__ __forceinline__ float
zinf_k_load(const void *x, enum zinf_dtype t, size_t i)
{
	switch (t) {
	case ZINF_F16:
		return zinf_f16_to_f32(((const uint16_t *)x)[i]);
	case ZINF_BF16:
		return zinf_bf16_to_f32(((const uint16_t *)x)[i]);
	default:
		return ((const float *)x)[i];
	}
}

static __device__ __forceinline__ void
zinf_k_store(void *x, enum zinf_dtype t, size_t i, float f)
{
	switch (t) {
	case ZINF_F16:
		((uint16_t *)x)[i] = zinf_f32_to_f16_rne(f);
		break;
	case ZINF_BF16:
		((uint16_t *)x)[i] = zinf_f32_to_bf16_rne(f);
		break;
	default:
		((float *)x)[i] = f;
		break;
	}
}

#endif
