/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_adam/adam_bf16m_internal.h: Adam with a bf16 master weight (zinf_adam_step_bf16master in
 * zinf/blocks/adam.h): the driver that each SIMD path's table entry runs with its own bf16-master
 * kernel (one pass per element: the master widened, the Adam arithmetic of the path's float32 or
 * bf16-state kernel, bit for bit, the master rounded back; adam_bf16master_elem() on the scalar
 * path, bf16master_loop in adam_simd_body.h). The driver cuts a range into runs of elements alike
 * in weight decay and, with q8 moments, into blocks of ZINF_Q8_BLOCK decoded into L1-resident
 * float arrays before the runs and encoded after them. Included by adam_scalar.c and
 * adam_simd_body.h. Not here: argument checks (adam.c) and the arithmetic (the kernels).
 */
#ifndef ZINF_ADAM_BF16M_INTERNAL_H
#define ZINF_ADAM_BF16M_INTERNAL_H

#include "cpu_adam/adam_internal.h"
#include "cpu_adam/adam_q8_internal.h"

/*
 * Elements [e0, e1) through the kernel k, one call per run of elements alike in weight decay,
 * each call's arrays from the run's first element e: the master, the gradient, the copy, m and
 * v (mf, vf: q8's decoded floats of the block that starts at e0; NULL: a->m, a->v themselves),
 * hbase + e the run's first hash index (the master's and bf16 moments' random bits).
 */
static inline void
bf16m_runs(const struct zinf_opt_args *a, size_t e0, size_t e1, zinf_opt_kernel_fn k, float *mf,
	   float *vf)
{
	size_t gs = zinf_dtype_size(a->gdt);
	size_t ss = a->mv == ZINF_MOMENTS_BF16 ? 2 : 4;
	size_t cs = a->ck == ZINF_COPY_F32 ? 4 : a->ck == ZINF_COPY_NONE ? 0 : 2;
	bool split = a->n_nd > 0 && (a->decay != 1.0f || a->l2);
	for (size_t e = e0, run; e < e1; e += run) {
		bool decays = true;
		run = split ? q8_decay_run(a, a->index0 + e, e1 - e, &decays) : e1 - e;
		struct zinf_opt_args u = *a;
		u.master = a->master + e;
		u.grad = (const char *)a->grad + e * gs;
		u.copy = cs ? (char *)a->copy + e * cs : NULL;
		u.m = mf ? (void *)(mf + (e - e0)) : (char *)a->m + e * ss;
		u.v = vf ? (void *)(vf + (e - e0)) : (char *)a->v + e * ss;
		u.hbase = a->hbase + e;
		if (!decays) { /* what adam_scalars_get gives for weight decay 0 */
			u.decay = 1.0f;
			u.l2 = false;
		}
		k(&u, 0, run);
	}
}

/*
 * Elements [i0, i1) of a bf16-master step (i0 a multiple of ZINF_Q8_BLOCK: tiles are) by the
 * path's bf16-master kernel k: f32 and bf16 moments in place, q8 moments block by block (decode
 * m and v, the runs, encode once).
 */
static inline void
bf16m_step(const struct zinf_opt_args *a, size_t i0, size_t i1, zinf_opt_kernel_fn k)
{
	if (a->mv != ZINF_MOMENTS_Q8) {
		bf16m_runs(a, i0, i1, k, NULL, NULL);
		return;
	}
	_Alignas(64) float mf[ZINF_Q8_BLOCK];
	_Alignas(64) float vf[ZINF_Q8_BLOCK];
	bool sr = a->rounding == ZINF_ROUND_STOCHASTIC;
	for (size_t b0 = i0; b0 < i1; b0 += ZINF_Q8_BLOCK) {
		size_t n = i1 - b0 < ZINF_Q8_BLOCK ? i1 - b0 : ZINF_Q8_BLOCK;
		uint8_t *mq = (uint8_t *)a->m + zinf_q8_bytes(b0);
		uint8_t *vq = (uint8_t *)a->v + zinf_q8_bytes(b0);
		q8_decode_block(mq, n, false, mf);
		q8_decode_block(vq, n, true, vf);
		bf16m_runs(a, b0, b0 + n, k, mf, vf);
		q8_encode_block(mf, n, false, mq, sr, a->sr_key, a->index0 + b0);
		q8_encode_block(vf, n, true, vq, sr, a->sr_key, a->index0 + b0);
	}
}

#endif
