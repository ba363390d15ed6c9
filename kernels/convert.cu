/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kernels/convert.cu: the element-wise kernels: cast between f32 and the 16-bit types, scale in
 * place, accumulate into f32, fill. Each rounds exactly as its C reference in device/dev_host.c
 * (the conversions are common/dtype.h's, compiled for the device; every float operation is one
 * IEEE operation, nothing to contract). Each launcher returns the status of its own launch
 * (ZINF_K_LAUNCH).
 */
#include "kernels/kernels_internal.cuh"

static __global__ void
cast_kernel(void *dst, enum zinf_dtype dt, const void *src, enum zinf_dtype st, size_t n)
{
	ZINF_K_FOR(i, n)
	{
		dt_store(dst, dt, i, dt_load(src, st, i));
	}
}

static __global__ void
scale_kernel(void *x, enum zinf_dtype t, float s, size_t n)
{
	ZINF_K_FOR(i, n)
	{
		dt_store(x, t, i, __fmul_rn(dt_load(x, t, i), s));
	}
}

static __global__ void
accumulate_kernel(float *dst, const void *src, enum zinf_dtype st, size_t n)
{
	ZINF_K_FOR(i, n)
	{
		dst[i] = __fadd_rn(dst[i], dt_load(src, st, i));
	}
}

static __global__ void
fill16_kernel(uint16_t *dst, uint16_t bits, size_t n)
{
	ZINF_K_FOR(i, n)
	{
		dst[i] = bits;
	}
}

static __global__ void
fill32_kernel(uint32_t *dst, uint32_t bits, size_t n)
{
	ZINF_K_FOR(i, n)
	{
		dst[i] = bits;
	}
}

extern "C" int
kern_cast(void *stream, void *dst, enum zinf_dtype dst_dtype, const void *src,
	  enum zinf_dtype src_dtype, size_t n)
{
	return ZINF_K_LAUNCH(cast_kernel, kern_blocks(n, ZINF_K_MAX_BLOCKS), ZINF_K_THREADS,
			     (cudaStream_t)stream, dst, dst_dtype, src, src_dtype, n);
}

extern "C" int
kern_scale(void *stream, void *x, enum zinf_dtype dtype, float scale, size_t n)
{
	return ZINF_K_LAUNCH(scale_kernel, kern_blocks(n, ZINF_K_MAX_BLOCKS), ZINF_K_THREADS,
			     (cudaStream_t)stream, x, dtype, scale, n);
}

extern "C" int
kern_accumulate(void *stream, float *dst, const void *src, enum zinf_dtype src_dtype, size_t n)
{
	return ZINF_K_LAUNCH(accumulate_kernel, kern_blocks(n, ZINF_K_MAX_BLOCKS), ZINF_K_THREADS,
			     (cudaStream_t)stream, dst, src, src_dtype, n);
}

extern "C" int
kern_fill(void *stream, void *dst, enum zinf_dtype dtype, uint32_t bits, size_t n)
{
	unsigned nb = kern_blocks(n, ZINF_K_MAX_BLOCKS);
	if (zinf_dtype_size(dtype) == 2) {
		return ZINF_K_LAUNCH(fill16_kernel, nb, ZINF_K_THREADS, (cudaStream_t)stream,
				     (uint16_t *)dst, (uint16_t)bits, n);
	}
	return ZINF_K_LAUNCH(fill32_kernel, nb, ZINF_K_THREADS, (cudaStream_t)stream,
			     (uint32_t *)dst, bits, n);
}
