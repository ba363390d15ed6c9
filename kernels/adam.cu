// SPDX-License-Identifier: Apache-2.0
/*
 * kernels/adam.cu: fused Adam/AdamW on device memory, one element per thread (grid-stride).
 * The formula and the order of operations are cpu_adam's scalar path (zinf_adam_elem in
 * cpu_adam/adam_internal.h), every operation rounded once with the _rn intrinsics, so nvcc
 * cannot contract a multiply and an add into an FMA; with the step's scalars computed on the host
 * in float64 (device/device.c), IEEE division and square root (nvcc's defaults, no fast math),
 * the result equals the scalar path bit for bit.
 */
#include "kernels/kernels_internal.cuh"

static __global__ void
adam_kernel(struct zinf_k_adam a, float *param, const void *grad, enum zinf_dtype gdt, float *mp,
	    float *vp, void *copy, enum zinf_dtype cdt, size_t n)
{
	ZINF_K_FOR(i, n)
	{
		float p = param[i];
		float g = __fmul_rn(zinf_dtype_load(grad, gdt, i), a.grad_scale);
		if (a.l2) {
			g = __fadd_rn(g, __fmul_rn(a.wd, p));
		}
		p = __fmul_rn(p, a.decay);
		float m = __fadd_rn(__fmul_rn(a.b1, mp[i]), __fmul_rn(a.omb1, g));
		float v = __fadd_rn(__fmul_rn(a.b2, vp[i]), __fmul_rn(a.omb2, __fmul_rn(g, g)));
		float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), a.bc2_sqrt), a.eps);
		p = __fadd_rn(p, __fmul_rn(a.nstep, __fdiv_rn(m, denom)));
		mp[i] = m;
		vp[i] = v;
		param[i] = p;
		if (copy) {
			zinf_dtype_store(copy, cdt, i, p);
		}
	}
}

extern "C" int
zinf_k_adam(void *stream, const struct zinf_k_adam *a, float *param, const void *grad,
	    enum zinf_dtype grad_dtype, float *m, float *v, void *copy, enum zinf_dtype copy_dtype,
	    size_t n)
{
	adam_kernel<<<zinf_k_blocks(n, ZINF_K_MAX_BLOCKS), ZINF_K_THREADS, 0,
		      (cudaStream_t)stream>>>(*a, param, grad, grad_dtype, m, v, copy, copy_dtype,
					      n);
	return (int)cudaGetLastError();
}
