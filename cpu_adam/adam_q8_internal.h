/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_adam/adam_q8_internal.h: Adam with 8-bit blockwise state (q8; the format is in
 * zinf/blocks/adam.h): the codec (encode and decode one block) and the block driver that each
 * SIMD path's table entry runs with its own float32 Adam kernel. Included by adam_scalar.c,
 * adam_avx2.c and adam_avx512.c (each compiles the codec with its own flags; the codec is integer
 * and exact float arithmetic, so every path encodes the same bytes) and by adam.c (the public
 * encode and decode). Not here: argument checks (adam.c) and the Adam arithmetic (the kernels).
 */
#ifndef ZINF_ADAM_Q8_INTERNAL_H
#define ZINF_ADAM_Q8_INTERNAL_H

#include <float.h>

#include "cpu_adam/adam_internal.h"

/*
 * A code's magnitude c >= 1 is the float whose bits are (c + base) << 19: 4 mantissa bits and
 * the exponent counted from base. m: 7 bits, c = 1 is 2^-7, c = 127 is 1.875 (TOP); v: 8 bits,
 * c = 1 is 2^-15, c = 254 is 1.8125 (TOP); c = 255 is v's NaN, 0x80 (negative zero) m's.
 */
#define Q8_M_BASE 1919u /* ((128 - 8) << 4) - 1 */
#define Q8_V_BASE 1791u /* ((128 - 16) << 4) - 1 */
#define Q8_M_MAX  127u
#define Q8_V_MAX  254u
#define Q8_M_TOP  1.875f
#define Q8_V_TOP  1.8125f
#define Q8_M_NAN  0x80u
#define Q8_V_NAN  0xffu
/* Bits added before the mantissa is cut to 4 bits: round half away from zero. */
#define Q8_HALF 0x40000u
#define Q8_MASK 0x7ffffu
/* m's values below this are 0 or the smallest code at random (q8_encode_block); from it up to the
 * smallest code, 2^-7, the smallest code: a decoded code 1 (2^-7 within float rounding) encodes
 * back to code 1. */
#define Q8_M_GAP 0x1.f8p-8f
/* The hash key of v's stochastic rounding, from m's (independent bits for the two). */
#define Q8_V_KEY 0x9e3779b9u

static inline float
q8_val(uint32_t c, uint32_t base)
{
	return dt_u2f((c + base) << 19);
}

/* The magnitude code of y >= 0 (y <= TOP up to rounding), rounding bits radd: 0 below the
 * smallest code's binade, at most cmax. */
static inline uint32_t
q8_mag(float y, uint32_t base, uint32_t cmax, uint32_t radd)
{
	int32_t c = (int32_t)((dt_f2u(y) + radd) >> 19) - (int32_t)base;
	return c < 1 ? 0 : (uint32_t)c > cmax ? cmax : (uint32_t)c;
}

/* The largest finite |x[i]| of n (0 when none): NaN and infinities do not compare <= FLT_MAX.
 * A max reduction (exact in any order): vectorised. */
static inline float
q8_absmax(const float *x, size_t n)
{
	float s = 0.0f;
#pragma omp simd reduction(max : s)
	for (size_t i = 0; i < n; i++) {
		float a = fabsf(x[i]);
		a = a <= FLT_MAX ? a : 0.0f;
		s = a > s ? a : s;
	}
	return s;
}

/*
 * Encode one block of n <= ZINF_Q8_BLOCK values x (m, or v when sq) into out: the scale, then
 * n codes. sr: stochastic rounding with key, element i's bits from index idx0 + i. x is used as
 * scratch (v: replaced by sqrt(v)).
 */
static inline void
q8_encode_block(float *x, size_t n, bool sq, uint8_t *out, bool sr, uint32_t key, uint64_t idx0)
{
	/* The loops are branch-free (every element's hash computed, the rounding chosen by a
	 * select) and marked omp simd, so each path's compiler flags vectorise them: the same
	 * operations per element, the same bytes as one at a time (the scalar path). */
	if (sq) {
#pragma omp simd
		for (size_t i = 0; i < n; i++) {
			/* a finite v that is not > 0 (-0.0, whose sqrtf is -0.0, or v < 0, never
			 * produced by Adam) is 0; NaN and infinities stay non-finite */
			float v = x[i];
			x[i] = v > 0.0f ? sqrtf(v) : fabsf(v) <= FLT_MAX ? 0.0f : NAN;
		}
	}
	float s = q8_absmax(x, n);
	if (s < FLT_MIN) {
		s = 0.0f; /* TOP / s would overflow: the block is stored as zeros */
	}
	memcpy(out, &s, sizeof(s));
	uint8_t *c = out + sizeof(s);
	float top = sq ? Q8_V_TOP : Q8_M_TOP;
	float inv = s > 0.0f ? top / s : 0.0f;
	if (sq) {
		uint32_t k = key ^ Q8_V_KEY;
#pragma omp simd
		for (size_t i = 0; i < n; i++) {
			float w = x[i];
			uint32_t h = adam_sr_bits(k, idx0 + i);
			uint32_t r = sr ? h & Q8_MASK : Q8_HALF;
			uint32_t q = q8_mag(w * inv, Q8_V_BASE, Q8_V_MAX, r);
			/* a v > 0 never becomes 0: below the smallest code it rounds up to it */
			q = q == 0 && w > 0.0f && s > 0.0f ? 1 : q;
			c[i] = (uint8_t)(w <= FLT_MAX ? q : Q8_V_NAN);
		}
	} else {
#pragma omp simd
		for (size_t i = 0; i < n; i++) {
			float a = fabsf(x[i]), y = a * inv;
			uint32_t h = adam_sr_bits(key, idx0 + i);
			uint32_t q = q8_mag(y, Q8_M_BASE, Q8_M_MAX, sr ? h & Q8_MASK : Q8_HALF);
			/* below the smallest code (2^-7): 0 or that code with probability y / 2^-7,
			 * in either rounding. The nearer of the two would keep a decaying m (0.9 *
			 * 2^-7 > 2^-8) on the smallest code forever; this keeps m's expectation,
			 * and 0 is where a stopped m ends. (y converted only where it is below the
			 * gap: a NaN or a huge y never reaches the conversion.) */
			bool gap = y < Q8_M_GAP;
			uint32_t lo = (h >> 8) < (uint32_t)((gap ? y : 0.0f) * 0x1p31f) ? 1u : 0u;
			q = gap ? lo : q ? q : 1u;
			q = q ? q | (dt_f2u(x[i]) >> 31) << 7 : 0;
			c[i] = (uint8_t)(a <= FLT_MAX ? q : Q8_M_NAN);
		}
	}
}

/*
 * Decode one block of n elements (scale, codes) into x (v: the decoded v). A code's value is
 * s * (val / TOP): the largest code gives s exactly, so encoding the decoded block gives the same
 * scale and, every other value being within a few float ulps of its code's (far from the rounding
 * boundaries, half a code apart), the same codes: a checkpoint may store the decoded floats and a
 * load encode them back bit for bit (v too: sqrt(fl(w * w)) is w).
 */
static inline void
q8_decode_block(const uint8_t *in, size_t n, bool sq, float *x)
{
	float s;
	memcpy(&s, in, sizeof(s));
	const uint8_t *c = in + sizeof(s);
	if (sq) {
#pragma omp simd
		for (size_t i = 0; i < n; i++) {
			float w = s * (q8_val(c[i], Q8_V_BASE) / Q8_V_TOP);
			w = c[i] == 0 ? 0.0f : c[i] == Q8_V_NAN ? NAN : w;
			x[i] = w * w;
		}
	} else {
#pragma omp simd
		for (size_t i = 0; i < n; i++) {
			uint32_t q = c[i] & 0x7fu;
			float a = s * (q8_val(q, Q8_M_BASE) / Q8_M_TOP);
			a = q == 0 ? (c[i] == Q8_M_NAN ? NAN : 0.0f) : a;
			x[i] = c[i] & 0x80u ? -a : a;
		}
	}
}

/* The elements from idx (at most n) that share idx's weight decay, *decays whether they decay:
 * zinf_optimizer_decay_run() over the argument block's ranges. */
static inline size_t
q8_decay_run(const struct zinf_opt_args *a, uint64_t idx, size_t n, bool *decays)
{
	*decays = true;
	uint32_t lo = 0, hi = a->n_nd;
	while (lo < hi) { /* the first range that ends after idx */
		uint32_t mid = lo + (hi - lo) / 2;
		if (a->nd[2 * mid + 1] <= idx) {
			lo = mid + 1;
		} else {
			hi = mid;
		}
	}
	if (lo == a->n_nd) {
		return n;
	}
	uint64_t start = a->nd[2 * lo], end = a->nd[2 * lo + 1];
	if (start <= idx) {
		*decays = false;
		return (size_t)(end - idx < n ? end - idx : n);
	}
	return (size_t)(start - idx < n ? start - idx : n);
}

/*
 * Elements [i0, i1) of a q8 step (i0 a multiple of ZINF_Q8_BLOCK: tiles are), block by block:
 * decode m and v into two L1-resident float arrays, run the path's float32 Adam kernel f32 over
 * each run of elements alike in weight decay, encode the block once.
 */
static inline void
q8_step(const struct zinf_opt_args *a, size_t i0, size_t i1, zinf_opt_kernel_fn f32)
{
	_Alignas(64) float mf[ZINF_Q8_BLOCK];
	_Alignas(64) float vf[ZINF_Q8_BLOCK];
	size_t gs = zinf_dtype_size(a->gdt);
	size_t cs = a->ck == ZINF_COPY_F32 ? 4 : a->ck == ZINF_COPY_NONE ? 0 : 2;
	bool sr = a->rounding == ZINF_ROUND_STOCHASTIC;
	bool split = a->n_nd > 0 && (a->decay != 1.0f || a->l2);
	for (size_t b0 = i0; b0 < i1; b0 += ZINF_Q8_BLOCK) {
		size_t n = i1 - b0 < ZINF_Q8_BLOCK ? i1 - b0 : ZINF_Q8_BLOCK;
		uint8_t *mp = (uint8_t *)a->m + zinf_q8_bytes(b0);
		uint8_t *vp = (uint8_t *)a->v + zinf_q8_bytes(b0);
		q8_decode_block(mp, n, false, mf);
		q8_decode_block(vp, n, true, vf);
		for (size_t i = 0, run; i < n; i += run) {
			bool decays = true;
			run = split ? q8_decay_run(a, a->index0 + b0 + i, n - i, &decays) : n - i;
			/* the run's arrays from its first element: the kernel decides on streaming
			 * stores by the copy pointer's alignment */
			size_t e = b0 + i;
			struct zinf_opt_args u = *a;
			u.param = a->param + e;
			u.grad = (const char *)a->grad + e * gs;
			u.copy = cs ? (char *)a->copy + e * cs : NULL;
			u.m = mf + i;
			u.v = vf + i;
			if (!decays) { /* what adam_scalars_get gives for weight decay 0 */
				u.decay = 1.0f;
				u.l2 = false;
			}
			f32(&u, 0, run);
		}
		q8_encode_block(mf, n, false, mp, sr, a->sr_key, a->index0 + b0);
		q8_encode_block(vf, n, true, vp, sr, a->sr_key, a->index0 + b0);
	}
}

#endif
