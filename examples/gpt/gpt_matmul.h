/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt_matmul.h: the CPU layers' matrix products (gpt_matmul.c), row-major, in
 * gpt_real (float for the trainer, double for the gradient check).
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

#endif
