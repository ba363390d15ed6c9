/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kernels/reduce.cu: the reductions over a gradient: sum of squares and the non-finite check.
 *
 * Sum of squares, in two passes so that the result repeats bit for bit (no atomics): each thread
 * sums its grid-stride elements' squares in float64 (a float squared is exact in float64), each
 * block sums its threads' partials by a fixed float64 tree into scratch[block], and one more
 * block sums the block partials the same way into *out. Every term is exact and non-negative, so
 * in any order the relative error is at most (n - 1) * 2^-53, the bound of the host reference
 * (zinf_grad_sumsq) too.
 */
#include "kernels/kernels_internal.cuh"

/* The block's sum of x (one value per thread) by a fixed tree; valid in thread 0. */
static __device__ double
block_sum(double x)
{
	__shared__ double sh[ZINF_K_THREADS];
	sh[threadIdx.x] = x;
	__syncthreads();
	for (unsigned w = ZINF_K_THREADS / 2; w > 0; w /= 2) {
		if (threadIdx.x < w) {
			sh[threadIdx.x] += sh[threadIdx.x + w];
		}
		__syncthreads();
	}
	return sh[0];
}

static __global__ void
sumsq_partial(const void *x, enum zinf_dtype t, size_t n, double *partial)
{
	double s = 0.0;
	ZINF_K_FOR(i, n)
	{
		double v = dt_load(x, t, i);
		s += v * v;
	}
	double b = block_sum(s);
	if (threadIdx.x == 0) {
		partial[blockIdx.x] = b;
	}
}

static __global__ void
sumsq_final(const double *partial, unsigned count, double *out)
{
	double s = 0.0;
	for (unsigned i = threadIdx.x; i < count; i += blockDim.x) {
		s += partial[i];
	}
	double b = block_sum(s);
	if (threadIdx.x == 0) {
		*out = b;
	}
}

static __global__ void
nonfinite_kernel(const void *x, enum zinf_dtype t, size_t n, uint32_t *flag)
{
	bool found = false;
	ZINF_K_FOR(i, n)
	{
		found |= !isfinite(dt_load(x, t, i));
	}
	if (found) {
		*flag = 1; /* every writer writes the same value */
	}
}

extern "C" int
kern_sumsq(void *stream, const void *x, enum zinf_dtype dtype, size_t n, double *scratch,
	   double *out)
{
	cudaStream_t st = (cudaStream_t)stream;
	unsigned nb = n ? kern_blocks(n, ZINF_K_SUMSQ_BLOCKS) : 0;
	if (nb) {
		int e = ZINF_K_LAUNCH(sumsq_partial, nb, ZINF_K_THREADS, st, x, dtype, n, scratch);
		if (e != 0) {
			return e;
		}
	}
	return ZINF_K_LAUNCH(sumsq_final, 1, ZINF_K_THREADS, st, scratch, nb, out);
}

extern "C" int
kern_nonfinite(void *stream, const void *x, enum zinf_dtype dtype, size_t n, uint32_t *flag)
{
	return ZINF_K_LAUNCH(nonfinite_kernel, kern_blocks(n, ZINF_K_MAX_BLOCKS), ZINF_K_THREADS,
			     (cudaStream_t)stream, x, dtype, n, flag);
}
