/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kernels/quant.cu: the blockwise int8/int4 codec (common/quant.h) on the device: one CUDA block
 * per quantization block. The block's max |x| is order-free (a max is exact), the scale one IEEE
 * division, each code one division rounded to nearest even, so the codes and scales equal the C
 * reference's (common/quant.c) bit for bit; so do the dequantized values (one product, the
 * output type's rounding) and the accumulation (one addition per element).
 */
#include "common/quant.h"
#include "kernels/kernels_internal.cuh"

/* Element i as quantized: x, plus the error kept from the last call when err is given. */
static __device__ float
q_in(const void *x, enum zinf_dtype t, const float *err, size_t i)
{
	float v = dt_load(x, t, i);
	return err ? __fadd_rn(v, err[i]) : v;
}

static __global__ void
quantize_kernel(uint8_t *codes, float *scales, const void *x, enum zinf_dtype t, size_t n,
		size_t block, unsigned bits, float *err, float beta)
{
	__shared__ float part[ZINF_K_THREADS];
	size_t lo = (size_t)blockIdx.x * block;
	size_t hi = lo + block < n ? lo + block : n;
	float m = 0.0f;
	for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
		float a = qz_mag(q_in(x, t, err, i));
		m = a > m ? a : m;
	}
	part[threadIdx.x] = m;
	__syncthreads();
	for (unsigned w = blockDim.x / 2; w > 0; w /= 2) {
		if (threadIdx.x < w && part[threadIdx.x + w] > part[threadIdx.x]) {
			part[threadIdx.x] = part[threadIdx.x + w];
		}
		__syncthreads();
	}
	float s = qz_scale(part[0], bits);
	if (threadIdx.x == 0) {
		scales[blockIdx.x] = s;
	}
	if (bits == 4) {
		/* one thread per byte: elements 2j and 2j + 1 (block is even: a byte never
		   straddles two blocks) */
		for (size_t j = lo / 2 + threadIdx.x; 2 * j < hi; j += blockDim.x) {
			int q[2] = {0, 0};
			for (int k = 0; k < 2 && 2 * j + k < hi; k++) {
				size_t i = 2 * j + k;
				float v = q_in(x, t, err, i);
				q[k] = qz_code(v, s, bits);
				if (err) {
					err[i] = s == s ? __fmul_rn(beta,
								    __fsub_rn(v, qz_deq(q[k], s)))
							: 0.0f;
				}
			}
			codes[j] = (uint8_t)((q[0] & 0xf) | ((q[1] & 0xf) << 4));
		}
		return;
	}
	for (size_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
		float v = q_in(x, t, err, i);
		int q = qz_code(v, s, bits);
		codes[i] = (uint8_t)(int8_t)q;
		if (err) {
			err[i] = s == s ? __fmul_rn(beta, __fsub_rn(v, qz_deq(q, s))) : 0.0f;
		}
	}
}

static __global__ void
dequantize_kernel(void *y, enum zinf_dtype t, const void *codes, const float *scales, size_t n,
		  size_t block, unsigned bits, int acc)
{
	ZINF_K_FOR(i, n)
	{
		float d = qz_deq(qz_get(codes, i, bits), scales[i / block]);
		if (acc) {
			float *f = (float *)y;
			f[i] = __fadd_rn(f[i], d);
		} else {
			dt_store(y, t, i, d);
		}
	}
}

extern "C" int
kern_quantize(void *stream, void *codes, float *scales, const void *x, enum zinf_dtype dtype,
	      size_t n, size_t block, unsigned bits, float *err, float beta)
{
	size_t nb = qz_blocks(n, block);
	if (nb == 0) {
		return 0; /* nothing to do; a grid of no blocks is cudaErrorInvalidConfiguration */
	}
	if (nb > 0x7fffffffu) {
		return (int)cudaErrorInvalidConfiguration;
	}
	return ZINF_K_LAUNCH(quantize_kernel, (unsigned)nb, ZINF_K_THREADS, (cudaStream_t)stream,
			     (uint8_t *)codes, scales, x, dtype, n, block, bits, err, beta);
}

extern "C" int
kern_dequantize(void *stream, void *y, enum zinf_dtype dtype, const void *codes,
		const float *scales, size_t n, size_t block, unsigned bits, int accumulate)
{
	return ZINF_K_LAUNCH(dequantize_kernel, kern_blocks(n, ZINF_K_MAX_BLOCKS), ZINF_K_THREADS,
			     (cudaStream_t)stream, y, dtype, codes, scales, n, block, bits,
			     accumulate);
}
