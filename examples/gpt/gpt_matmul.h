/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt_matmul.h: the CPU layers' matrix products (gpt_matmul.c), row-major, in
 * gpt_real (float for the trainer, double for the gradient check).
 *
 * gpt_matmul_forward/backward are the layers' products: through a CBLAS when the build found one
 * (GPT_HAVE_BLAS: cblas_sgemm for float, cblas_dgemm for double), else the plain C kernels. The
 * plain C kernels are always built, as gpt_matmul_*_ref: the reference that the tests compare the
 * BLAS path with. Both set their outputs (never accumulate) and are deterministic for a fixed
 * number of OpenMP threads; the reference is the same bits for any number.
 */
#ifndef ZINF_EXAMPLE_GPT_MATMUL_H
#define ZINF_EXAMPLE_GPT_MATMUL_H

#include "gpt_model.h"

/* out[N, OC] = inp[N, C] @ w[OC, C]^T + b[OC] (b may be NULL) */
void gpt_matmul_forward(gpt_real *out, const gpt_real *inp, const gpt_real *w, const gpt_real *b,
			int N, int C, int OC);
/* dinp = (set) dout @ w; dw = (set) dout^T @ inp; db = (set) column sums (db may be NULL) */
void gpt_matmul_backward(gpt_real *dinp, gpt_real *dw, gpt_real *db, const gpt_real *dout,
			 const gpt_real *inp, const gpt_real *w, int N, int C, int OC);

/* The same, in plain C, whatever the build: each output element one thread's sum in a fixed
   order (the bits do not depend on the thread count). */
void gpt_matmul_forward_ref(gpt_real *out, const gpt_real *inp, const gpt_real *w,
			    const gpt_real *b, int N, int C, int OC);
void gpt_matmul_backward_ref(gpt_real *dinp, gpt_real *dw, gpt_real *db, const gpt_real *dout,
			     const gpt_real *inp, const gpt_real *w, int N, int C, int OC);

#ifdef GPT_HAVE_BLAS
/* C[M, N] = alpha op(A) op(B) + beta C, row-major, op(X) = X or X^T (ta, tb nonzero): one
   cblas_?gemm call (threaded by the BLAS outside a parallel region, one thread inside one).
   beta 0 sets C, whatever it held (NaN included). For the attention's per-head products. */
void gpt_gemm(int ta, int tb, int M, int N, int K, gpt_real alpha, const gpt_real *A, int lda,
	      const gpt_real *B, int ldb, gpt_real beta, gpt_real *C, int ldc);
#endif

/* "cblas" when gpt_matmul_forward/backward go through a BLAS, else "reference". */
extern const char gpt_matmul_impl[];

#endif
