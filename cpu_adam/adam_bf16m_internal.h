/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_adam/adam_bf16m_internal.h: Adam with a bf16 master weight (zinf_adam_step_bf16master in
 * zinf/blocks/adam.h): the block driver that each SIMD path's table entry runs with its own Adam
 * kernels. A block of ZINF_Q8_BLOCK elements of the master is widened into an L1-resident float
 * array (q8 moments decoded beside it), stepped by the path's float32 Adam kernel (f32 or q8
 * moments) or its bf16-state kernel (bf16 moments), so the arithmetic is theirs bit for bit, and
 * rounded back to bf16 (and q8 moments encoded). Included by adam_scalar.c and adam_simd_body.h;
 * the rounding loop is integer arithmetic, so every path rounds the same float to the same bits.
 * Not here: argument checks (adam.c) and the Adam arithmetic (the kernels).
 */
#ifndef ZINF_ADAM_BF16M_INTERNAL_H
#define ZINF_ADAM_BF16M_INTERNAL_H

#include "cpu_adam/adam_internal.h"
#include "cpu_adam/adam_q8_internal.h"

/* Element e's new master from its float update x (and its bf16 or f32 copy): stochastic rounding
 * with the master's bits of index0 + e (adam_bf16_sr_sat: saturating), or round to nearest. */
static inline void
bf16m_round1(const struct zinf_opt_args *a, float x, size_t e)
{
	uint16_t r = a->mrounding == ZINF_ROUND_STOCHASTIC
			     ? adam_bf16_sr_sat(x, adam_sr_bits2(a->mkey, a->mkey1, a->index0 + e))
			     : dt_f32_to_bf16_rne(x);
	a->master[e] = r;
	if (a->ck == ZINF_COPY_BF16) {
		((uint16_t *)a->copy)[e] = r;
	} else if (a->ck == ZINF_COPY_F32) {
		((float *)a->copy)[e] = dt_bf16_to_f32(r);
	}
}

/* The portable widening and rounding of a block (the scalar path's; the vector paths have their
 * own, with the same results). */
static inline void
bf16m_widen1(const uint16_t *w, float *pf, size_t n)
{
	for (size_t j = 0; j < n; j++) {
		pf[j] = dt_bf16_to_f32(w[j]);
	}
}

static inline void
bf16m_round_n(const struct zinf_opt_args *a, const float *pf, size_t b0, size_t n)
{
	for (size_t j = 0; j < n; j++) {
		bf16m_round1(a, pf[j], b0 + j);
	}
}

typedef void (*bf16m_widen_fn)(const uint16_t *w, float *pf, size_t n);
typedef void (*bf16m_round_fn)(const struct zinf_opt_args *a, const float *pf, size_t b0, size_t n);

/*
 * Elements [i0, i1) of a bf16-master step (i0 a multiple of ZINF_Q8_BLOCK: tiles are), block by
 * block: widen the master (q8 moments: decode m and v), run f32 (f32 and q8 moments) or bf16s
 * (bf16 moments) over each run of elements alike in weight decay, round the master back (q8:
 * encode the moments once). The f16 copy is the kernel's (the float update rounded to nearest);
 * the bf16 and f32 copies are the rounded master's.
 */
static inline void
bf16m_step(const struct zinf_opt_args *a, size_t i0, size_t i1, zinf_opt_kernel_fn f32,
	   zinf_opt_kernel_fn bf16s, bf16m_widen_fn widen, bf16m_round_fn round)
{
	_Alignas(64) float pf[ZINF_Q8_BLOCK];
	_Alignas(64) float mf[ZINF_Q8_BLOCK];
	_Alignas(64) float vf[ZINF_Q8_BLOCK];
	size_t gs = zinf_dtype_size(a->gdt);
	bool q8 = a->mv == ZINF_MOMENTS_Q8;
	size_t ss = a->mv == ZINF_MOMENTS_BF16 ? 2 : 4;
	zinf_opt_kernel_fn f = a->mv == ZINF_MOMENTS_BF16 ? bf16s : f32;
	bool split = a->n_nd > 0 && (a->decay != 1.0f || a->l2);
	bool sr = a->rounding == ZINF_ROUND_STOCHASTIC;
	for (size_t b0 = i0; b0 < i1; b0 += ZINF_Q8_BLOCK) {
		size_t n = i1 - b0 < ZINF_Q8_BLOCK ? i1 - b0 : ZINF_Q8_BLOCK;
		widen(a->master + b0, pf, n);
		uint8_t *mq = NULL, *vq = NULL;
		if (q8) {
			mq = (uint8_t *)a->m + zinf_q8_bytes(b0);
			vq = (uint8_t *)a->v + zinf_q8_bytes(b0);
			q8_decode_block(mq, n, false, mf);
			q8_decode_block(vq, n, true, vf);
		}
		for (size_t i = 0, run; i < n; i += run) {
			bool decays = true;
			run = split ? q8_decay_run(a, a->index0 + b0 + i, n - i, &decays) : n - i;
			size_t e = b0 + i;
			struct zinf_opt_args u = *a;
			u.param = pf + i;
			u.grad = (const char *)a->grad + e * gs;
			/* only the f16 copy is the kernel's; the others are the rounded master's */
			u.ck = a->ck == ZINF_COPY_F16 ? ZINF_COPY_F16 : ZINF_COPY_NONE;
			u.copy = u.ck == ZINF_COPY_F16 ? (uint16_t *)a->copy + e : NULL;
			u.m = q8 ? (void *)(mf + i) : (char *)a->m + e * ss;
			u.v = q8 ? (void *)(vf + i) : (char *)a->v + e * ss;
			u.hbase =
				a->hbase + e; /* bf16 moments: the hash index of the run's start */
			if (!decays) {	      /* what adam_scalars_get gives for weight decay 0 */
				u.decay = 1.0f;
				u.l2 = false;
			}
			f(&u, 0, run);
		}
		if (q8) {
			q8_encode_block(mf, n, false, mq, sr, a->sr_key, a->index0 + b0);
			q8_encode_block(vf, n, true, vq, sr, a->sr_key, a->index0 + b0);
		}
		round(a, pf, b0, n);
	}
}

#endif
