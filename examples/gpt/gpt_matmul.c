/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt_matmul.c: the matrix products of the CPU layers (gpt_cpu.c), row-major
 * tensors, OpenMP over rows. Deterministic for any thread count: each output element is one
 * thread's sum in a fixed order.
 */
#include "gpt_matmul.h"

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
gpt_matmul_forward(gpt_real *out, const gpt_real *inp, const gpt_real *w, const gpt_real *b, int N,
		   int C, int OC)
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
gpt_matmul_backward(gpt_real *dinp, gpt_real *dw, gpt_real *db, const gpt_real *dout,
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
