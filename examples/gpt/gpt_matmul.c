/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt_matmul.c: the matrix products of the CPU layers (gpt_cpu.c), row-major
 * tensors. With GPT_HAVE_BLAS (the build found a CBLAS: OpenBLAS's OpenMP build, see
 * CMakeLists.txt) each product is one cblas_sgemm (cblas_dgemm for GPT_REAL=double), threaded
 * by the BLAS on the layers' own OpenMP threads; the bias and db are loops here. The plain C
 * kernels (OpenMP over rows, each output element one thread's sum in a fixed order) are always
 * built as gpt_matmul_*_ref, the reference the tests compare against, and are the layers'
 * products in a build without a BLAS.
 *
 * Determinism: the reference gives the same bits for any thread count. OpenBLAS picks how to
 * cut and block a product from its shape and the thread count alone (no atomics, no dynamic
 * scheduling), so the BLAS path gives the same bits for a fixed count; another count may change
 * the last bits (its single- and multi-threaded drivers differ), which OpenBLAS does not promise.
 */
#include "gpt_matmul.h"

#ifdef GPT_HAVE_BLAS
#include <cblas.h>
const char gpt_matmul_impl[] = "cblas";
#else
const char gpt_matmul_impl[] = "reference";
#endif

/* x . y in eight interleaved partial sums, added in a fixed order at the end: the compiler
 * vectorises it without -ffast-math, and the bits do not depend on threads or on the SIMD
 * width chosen. */
static inline gpt_real
dot(const gpt_real *x, const gpt_real *y, int n)
{
	gpt_real acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
	int c = 0;
	for (; c + 8 <= n; c += 8) {
#pragma omp simd
		for (int k = 0; k < 8; k++) {
			acc[k] += x[c + k] * y[c + k];
		}
	}
	for (int k = 0; c < n; c++, k++) {
		acc[k] += x[c] * y[c];
	}
	return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* out[N, OC] = inp[N, C] @ w[OC, C]^T + b[OC] (b may be NULL) */
void
gpt_matmul_forward_ref(gpt_real *out, const gpt_real *inp, const gpt_real *w, const gpt_real *b,
		       int N, int C, int OC)
{
#pragma omp parallel for
	for (int i = 0; i < N; i++) {
		const gpt_real *x = inp + (size_t)i * C;
		gpt_real *o = out + (size_t)i * OC;
		for (int j = 0; j < OC; j++) {
			o[j] = (b ? b[j] : 0) + dot(x, w + (size_t)j * C, C);
		}
	}
}

/* dinp = (set) dout @ w; dw = (set) dout^T @ inp; db = (set) column sums (db may be NULL) */
void
gpt_matmul_backward_ref(gpt_real *dinp, gpt_real *dw, gpt_real *db, const gpt_real *dout,
			const gpt_real *inp, const gpt_real *w, int N, int C, int OC)
{
#pragma omp parallel for
	for (int i = 0; i < N; i++) {
		gpt_real *dx = dinp + (size_t)i * C;
		const gpt_real *g = dout + (size_t)i * OC;
		for (int c = 0; c < C; c++) {
			dx[c] = 0;
		}
		for (int j = 0; j < OC; j++) {
			const gpt_real *wr = w + (size_t)j * C;
			gpt_real gj = g[j];
#pragma omp simd
			for (int c = 0; c < C; c++) {
				dx[c] += gj * wr[c];
			}
		}
	}
#pragma omp parallel for
	for (int j = 0; j < OC; j++) {
		gpt_real *dwr = dw + (size_t)j * C;
		gpt_real sb = 0;
		for (int c = 0; c < C; c++) {
			dwr[c] = 0;
		}
		for (int i = 0; i < N; i++) {
			gpt_real gj = dout[(size_t)i * OC + j];
			const gpt_real *x = inp + (size_t)i * C;
#pragma omp simd
			for (int c = 0; c < C; c++) {
				dwr[c] += gj * x[c];
			}
			sb += gj;
		}
		if (db) {
			db[j] = sb;
		}
	}
}

#ifdef GPT_HAVE_BLAS

/* cblas_sgemm or cblas_dgemm, by gpt_real */
#define GEMM _Generic((gpt_real)0, float : cblas_sgemm, double : cblas_dgemm)

void
gpt_gemm(int ta, int tb, int M, int N, int K, gpt_real alpha, const gpt_real *A, int lda,
	 const gpt_real *B, int ldb, gpt_real beta, gpt_real *C, int ldc)
{
	GEMM(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N, K,
	     alpha, A, lda, B, ldb, beta, C, ldc);
}

/* Columns per thread's share of db: rows are added in order, a block of columns at a time, so
   each db element is one thread's sum over rows in row order (the reference's bits). */
#define DB_COLS 64

void
gpt_matmul_forward(gpt_real *out, const gpt_real *inp, const gpt_real *w, const gpt_real *b, int N,
		   int C, int OC)
{
	/* as PyTorch's addmm: out = b broadcast, then out += inp @ w^T */
	if (b) {
#pragma omp parallel for
		for (int i = 0; i < N; i++) {
			gpt_real *o = out + (size_t)i * OC;
			for (int j = 0; j < OC; j++) {
				o[j] = b[j];
			}
		}
	}
	GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1, inp, C, w, C, b ? 1 : 0, out,
	     OC);
}

void
gpt_matmul_backward(gpt_real *dinp, gpt_real *dw, gpt_real *db, const gpt_real *dout,
		    const gpt_real *inp, const gpt_real *w, int N, int C, int OC)
{
	/* dinp[N, C] = dout[N, OC] @ w[OC, C] */
	GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1, dout, OC, w, C, 0, dinp, C);
	/* dw[OC, C] = dout^T @ inp[N, C] */
	GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1, dout, OC, inp, C, 0, dw, C);
	if (db) {
#pragma omp parallel for
		for (int j0 = 0; j0 < OC; j0 += DB_COLS) {
			int n = OC - j0 < DB_COLS ? OC - j0 : DB_COLS;
			gpt_real *s = db + j0;
			for (int j = 0; j < n; j++) {
				s[j] = 0;
			}
			for (int i = 0; i < N; i++) {
				const gpt_real *g = dout + (size_t)i * OC + j0;
#pragma omp simd
				for (int j = 0; j < n; j++) {
					s[j] += g[j];
				}
			}
		}
	}
}

#else

void
gpt_matmul_forward(gpt_real *out, const gpt_real *inp, const gpt_real *w, const gpt_real *b, int N,
		   int C, int OC)
{
	gpt_matmul_forward_ref(out, inp, w, b, N, C, OC);
}

void
gpt_matmul_backward(gpt_real *dinp, gpt_real *dw, gpt_real *db, const gpt_real *dout,
		    const gpt_real *inp, const gpt_real *w, int N, int C, int OC)
{
	gpt_matmul_backward_ref(dinp, dw, db, dout, inp, w, N, C, OC);
}

#endif
