/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/gpt/cuda_emu/cublas_v2.h: the cuBLAS calls of examples/gpt/gpt_cuda.cu on the CPU for
 * test_gpt_cuda_emu.c: cublasSgemm from its definition (column-major: element (i, j) of a
 * matrix X with leading dimension ld is X[i + j ld]; C = alpha op(A) op(B) + beta C, op(X) = X
 * or X^T; beta 0 does not read C), summing in double. The handle's settings are checked for
 * the values gpt_cuda.cu must set, not emulated.
 */
#ifndef GPT_CUDA_EMU_CUBLAS_H
#define GPT_CUDA_EMU_CUBLAS_H

#include "cuda_runtime.h"

typedef enum {
	CUBLAS_STATUS_SUCCESS = 0,
	CUBLAS_STATUS_INVALID_VALUE = 7,
} cublasStatus_t;
typedef enum { CUBLAS_OP_N = 0, CUBLAS_OP_T = 1 } cublasOperation_t;
typedef enum { CUBLAS_DEFAULT_MATH = 0, CUBLAS_TF32_TENSOR_OP_MATH = 3 } cublasMath_t;
typedef enum { CUBLAS_POINTER_MODE_HOST = 0, CUBLAS_POINTER_MODE_DEVICE = 1 } cublasPointerMode_t;

struct emu_cublas {
	cudaStream_t stream;
	int math, pointer_mode;
};
typedef struct emu_cublas *cublasHandle_t;

static inline cublasStatus_t
cublasCreate(cublasHandle_t *h)
{
	*h = (cublasHandle_t)calloc(1, sizeof(struct emu_cublas));
	return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_INVALID_VALUE;
}
static inline cublasStatus_t
cublasDestroy(cublasHandle_t h)
{
	free(h);
	return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t
cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
	h->stream = s;
	return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t
cublasSetMathMode(cublasHandle_t h, cublasMath_t m)
{
	h->math = m;
	return CUBLAS_STATUS_SUCCESS;
}
static inline cublasStatus_t
cublasSetPointerMode(cublasHandle_t h, cublasPointerMode_t m)
{
	h->pointer_mode = m;
	return CUBLAS_STATUS_SUCCESS;
}
static inline const char *
cublasGetStatusString(cublasStatus_t s)
{
	return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "CUBLAS_STATUS_INVALID_VALUE";
}

static inline cublasStatus_t
cublasSgemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
	    const float *alpha, const float *A, int lda, const float *B, int ldb, const float *beta,
	    float *C, int ldc)
{
	if (h) {
		emu::check_stream(h->stream, "cublasSgemm");
	}
	/* the leading dimensions cuBLAS checks: lda >= rows of A as stored, etc. */
	int arows = ta == CUBLAS_OP_N ? m : k, brows = tb == CUBLAS_OP_N ? k : n;
	if (!h || h->stream == NULL || h->math != CUBLAS_DEFAULT_MATH ||
	    h->pointer_mode != CUBLAS_POINTER_MODE_HOST || m < 0 || n < 0 || k < 0 ||
	    lda < (arows > 1 ? arows : 1) || ldb < (brows > 1 ? brows : 1) ||
	    ldc < (m > 1 ? m : 1)) {
		return CUBLAS_STATUS_INVALID_VALUE;
	}
	for (int j = 0; j < n; j++) {
		for (int i = 0; i < m; i++) {
			double s = 0;
			for (int p = 0; p < k; p++) {
				float a = ta == CUBLAS_OP_N ? A[i + (size_t)p * lda]
							    : A[p + (size_t)i * lda];
				float b = tb == CUBLAS_OP_N ? B[p + (size_t)j * ldb]
							    : B[j + (size_t)p * ldb];
				s += (double)a * b;
			}
			float r = (float)(*alpha * s);
			C[i + (size_t)j * ldc] =
				*beta == 0.0f ? r : r + *beta * C[i + (size_t)j * ldc];
		}
	}
	return CUBLAS_STATUS_SUCCESS;
}

#endif
