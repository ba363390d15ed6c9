/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kernels/adam.cu: fused Adam/AdamW on device memory, one element per thread (grid-stride).
 * The arithmetic is cpu_adam's vector paths' (grad_in and adam_math in cpu_adam/adam_simd_body.h,
 * the body of the avx2 and avx512 paths, which every CPU with AVX2 and FMA runs), operation for
 * operation: the L2 term, the moments and the update are fused multiply-adds (__fmaf_rn), the
 * square root is multiplied by 1 / bc2_sqrt, and every other operation is rounded once with the _rn
 * intrinsics, so nvcc can neither contract nor split anything. With the step's scalars computed on
 * the host by cpu_adam's own function (adam_scalars_get, via device/device.c), IEEE division
 * and square root, the result equals those paths bit for bit: a sub-group stepped here and one
 * stepped by the CPU tier agree (measured on an H200: tests/engine's matrix on cuda). cpu_adam's
 * scalar path (CPUs without AVX2) rounds the unfused products separately and differs by float
 * rounding.
 */
#include "kernels/kernels_internal.cuh"

static __global__ void
adam_kernel(struct zinf_k_adam a, float *param, const void *grad, enum zinf_dtype gdt, float *mp,
	    float *vp, void *copy, enum zinf_dtype cdt, size_t n)
{
	ZINF_K_FOR(i, n)
	{
		float p = param[i];
		float g = __fmul_rn(dt_load(grad, gdt, i), a.grad_scale);
		if (a.l2) {
			g = __fmaf_rn(a.wd, p, g);
		}
		p = __fmul_rn(p, a.decay);
		float m = __fmaf_rn(a.b1, mp[i], __fmul_rn(a.omb1, g));
		float v = __fmaf_rn(a.b2, vp[i], __fmul_rn(a.omb2, __fmul_rn(g, g)));
		float denom = __fadd_rn(__fmul_rn(__fsqrt_rn(v), a.inv_bc2_sqrt), a.eps);
		p = __fmaf_rn(a.nstep, __fdiv_rn(m, denom), p);
		mp[i] = m;
		vp[i] = v;
		param[i] = p;
		if (copy) {
			dt_store(copy, cdt, i, p);
		}
	}
}

extern "C" int
kern_adam(void *stream, const struct zinf_k_adam *a, float *param, const void *grad,
	  enum zinf_dtype grad_dtype, float *m, float *v, void *copy, enum zinf_dtype copy_dtype,
	  size_t n)
{
	return ZINF_K_LAUNCH(adam_kernel, kern_blocks(n, ZINF_K_MAX_BLOCKS), ZINF_K_THREADS,
			     (cudaStream_t)stream, *a, param, grad, grad_dtype, m, v, copy,
			     copy_dtype, n);
}
