// SPDX-License-Identifier: Apache-2.0
/*
 * cpu_adam/adam_avx512.c: the AVX-512 kernels (F, BW, VL; FMA, F16C), 16 floats at a time,
 * unaligned loads and stores; the last (i1 - i0) % 16 elements of a range go through the same
 * vector code on zero-padded stack buffers (zinf_tail_in/out), as in adam_avx2.c. The bf16 copy
 * and bf16 state use vcvtneps2bf16 when the CPU has AVX512-BF16 (a->hw_bf16), patched for
 * subnormal inputs, which the instruction flushes to zero while round-to-nearest-even keeps
 * them; otherwise the integer rounding of the AVX2 path. Compiled with -mavx512f -mavx512bw
 * -mavx512vl -mavx512bf16 -mfma -mf16c -ffp-contract=off (only this file); adam_registry.c hands
 * it out only when the CPU reports F, BW, VL, FMA and F16C, and it uses the BF16 instruction only
 * when the CPU reports AVX512-BF16.
 */
#include <immintrin.h>

#include "cpu_adam/adam_internal.h"

static const char *
avx512_missing(const struct zinf_cpu_features *f)
{
	return !f->avx512f    ? "this CPU (or its OS) lacks AVX512F"
	       : !f->avx512bw ? "this CPU lacks AVX512BW"
	       : !f->avx512vl ? "this CPU lacks AVX512VL"
	       : !f->fma      ? "this CPU lacks FMA"
	       : !f->f16c     ? "this CPU lacks F16C"
			      : NULL;
}

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE __m512
load_bf16x16(const uint16_t *p)
{
	__m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
	return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

ALWAYS_INLINE __m512
load_grad16(const void *g, enum zinf_dtype dt, size_t i)
{
	switch (dt) {
	case ZINF_F16:
		return _mm512_cvtph_ps(
			_mm256_loadu_si256((const __m256i *)((const uint16_t *)g + i)));
	case ZINF_BF16:
		return load_bf16x16((const uint16_t *)g + i);
	default:
		return _mm512_loadu_ps((const float *)g + i);
	}
}

/* bf16 with rounding increment `add` per lane (0x7fff + lsb: RNE; 16 random bits: stochastic);
 * NaN quieted, exactly as the scalar helpers. */
ALWAYS_INLINE __m256i
bf16_round16(__m512 x, __m512i add)
{
	__m512i u = _mm512_castps_si512(x);
	__m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, add), 16);
	__mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
	__m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
	return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, q));
}

ALWAYS_INLINE __m256i
bf16_rne16_int(__m512 x)
{
	__m512i u = _mm512_castps_si512(x);
	__m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
	return bf16_round16(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
}

/* Round to nearest even. With AVX512-BF16, vcvtneps2bf16 (NaN handling identical); lanes whose
 * input is subnormal (the instruction flushes them) are redone with the integer rounding. */
ALWAYS_INLINE __m256i
bf16_rne16(__m512 x, bool hw)
{
	if (!hw) {
		return bf16_rne16_int(x);
	}
	__m256i r = (__m256i)_mm512_cvtneps_pbh(x);
	__m512i u = _mm512_castps_si512(x);
	__mmask16 sub = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7f800000)) &
			_mm512_test_epi32_mask(u, _mm512_set1_epi32(0x007fffff));
	if (__builtin_expect(sub != 0, 0)) {
		r = _mm256_mask_blend_epi16(sub, r, bf16_rne16_int(x));
	}
	return r;
}

/* Store 16 copies; nt: streaming stores for a 32-byte aligned 16-bit copy (write-only here, so
 * this saves the read-for-ownership of its lines). */
ALWAYS_INLINE void
store_copy16(void *c, enum zinf_copy_kind ck, size_t i, __m512 p, bool nt, bool hw)
{
	__m256i h;
	switch (ck) {
	case ZINF_COPY_F32:
		_mm512_storeu_ps((float *)c + i, p);
		return;
	case ZINF_COPY_F16:
		h = _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT);
		break;
	case ZINF_COPY_BF16:
		h = bf16_rne16(p, hw);
		break;
	default:
		return;
	}
	if (nt) {
		_mm256_stream_si256((__m256i *)((uint16_t *)c + i), h);
	} else {
		_mm256_storeu_si256((__m256i *)((uint16_t *)c + i), h);
	}
}

ALWAYS_INLINE bool
copy_nt(const struct zinf_opt_args *a, enum zinf_copy_kind ck)
{
	return (ck == ZINF_COPY_F16 || ck == ZINF_COPY_BF16) && ((uintptr_t)a->copy & 31) == 0;
}

/* zinf_sr_bits() for elements i .. i + 15 (i a multiple of 16, so i >> 32 is common). */
ALWAYS_INLINE __m512i
sr_bits16(uint32_t key, size_t i)
{
	uint32_t k = key ^ (uint32_t)((uint64_t)i >> 32) * 0x85ebca77u;
	__m512i idx = _mm512_add_epi32(
		_mm512_set1_epi32((int)(uint32_t)i),
		_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
	__m512i h = _mm512_xor_si512(idx, _mm512_set1_epi32((int)k));
	h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
	h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0x7feb352du));
	h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 15));
	h = _mm512_mullo_epi32(h, _mm512_set1_epi32((int)0x846ca68bu));
	h = _mm512_xor_si512(h, _mm512_srli_epi32(h, 16));
	return h;
}

/* Round the new m and v to bf16 (RNE, or stochastic with one hash per element: low half for m,
 * high half for v, as zinf_adam_bf16state_elem()). */
ALWAYS_INLINE void
state_round16(const struct zinf_opt_args *a, __m512 m, __m512 v, __m256i *mo, __m256i *vo, size_t i)
{
	if (a->rounding == ZINF_ROUND_STOCHASTIC) {
		__m512i h = sr_bits16(a->sr_key, i);
		*mo = bf16_round16(m, _mm512_and_si512(h, _mm512_set1_epi32(0xffff)));
		*vo = bf16_round16(v, _mm512_srli_epi32(h, 16));
	} else {
		*mo = bf16_rne16(m, a->hw_bf16);
		*vo = bf16_rne16(v, a->hw_bf16);
	}
}

ALWAYS_INLINE __m512
grad_in16(const struct zinf_opt_args *a, enum zinf_dtype gdt, size_t i, __m512 p)
{
	__m512 g = _mm512_mul_ps(load_grad16(a->grad, gdt, i), _mm512_set1_ps(a->grad_scale));
	if (a->l2) {
		g = _mm512_fmadd_ps(_mm512_set1_ps(a->wd), p, g);
	}
	return g;
}

ALWAYS_INLINE __m512
adam_math16(const struct zinf_opt_args *a, __m512 p, __m512 g, __m512 *m, __m512 *v)
{
	p = _mm512_mul_ps(p, _mm512_set1_ps(a->decay));
	*m = _mm512_fmadd_ps(_mm512_set1_ps(a->b1), *m, _mm512_mul_ps(_mm512_set1_ps(a->omb1), g));
	*v = _mm512_fmadd_ps(_mm512_set1_ps(a->b2), *v,
			     _mm512_mul_ps(_mm512_set1_ps(a->omb2), _mm512_mul_ps(g, g)));
	__m512 denom =
		_mm512_add_ps(_mm512_mul_ps(_mm512_sqrt_ps(*v), _mm512_set1_ps(a->inv_bc2_sqrt)),
			      _mm512_set1_ps(a->eps));
	return _mm512_fmadd_ps(_mm512_set1_ps(a->nstep), _mm512_div_ps(*m, denom), p);
}

ALWAYS_INLINE void
adam_loop(const struct zinf_opt_args *args, size_t i0, size_t i1, enum zinf_dtype gdt,
	  enum zinf_copy_kind ck, bool nt, size_t hoff)
{
	/* A local copy, so the stores cannot alias the scalars (see adam_avx2.c). */
	const struct zinf_opt_args la = *args, *a = &la;
	float *P = a->param, *M = a->m, *V = a->v;
	size_t i = i0;
	for (; i + 16 <= i1; i += 16) {
		__m512 p = _mm512_loadu_ps(P + i);
		__m512 g = grad_in16(a, gdt, i, p);
		__m512 m = _mm512_loadu_ps(M + i), v = _mm512_loadu_ps(V + i);
		p = adam_math16(a, p, g, &m, &v);
		_mm512_storeu_ps(M + i, m);
		_mm512_storeu_ps(V + i, v);
		_mm512_storeu_ps(P + i, p);
		store_copy16(a->copy, ck, i, p, nt, a->hw_bf16);
	}
	if (nt) {
		_mm_sfence();
	}
	(void)hoff;
}

ZINF_VEC_KERNEL(avx512, adam, 16, 4)

ALWAYS_INLINE void
adam_bf16state_loop(const struct zinf_opt_args *args, size_t i0, size_t i1, enum zinf_dtype gdt,
		    enum zinf_copy_kind ck, bool nt, size_t hoff)
{
	const struct zinf_opt_args la = *args, *a = &la;
	float *P = a->param;
	uint16_t *M = a->m, *V = a->v;
	size_t i = i0;
	for (; i + 16 <= i1; i += 16) {
		__m512 p = _mm512_loadu_ps(P + i);
		__m512 g = grad_in16(a, gdt, i, p);
		__m512 m = load_bf16x16(M + i), v = load_bf16x16(V + i);
		p = adam_math16(a, p, g, &m, &v);
		__m256i mo, vo;
		state_round16(a, m, v, &mo, &vo, i + hoff);
		_mm256_storeu_si256((__m256i *)(M + i), mo);
		_mm256_storeu_si256((__m256i *)(V + i), vo);
		_mm512_storeu_ps(P + i, p);
		store_copy16(a->copy, ck, i, p, nt, a->hw_bf16);
	}
	if (nt) {
		_mm_sfence();
	}
	(void)hoff;
}

ZINF_VEC_KERNEL(avx512, adam_bf16state, 16, 2)

ALWAYS_INLINE void
adagrad_loop(const struct zinf_opt_args *args, size_t i0, size_t i1, enum zinf_dtype gdt,
	     enum zinf_copy_kind ck, bool nt, size_t hoff)
{
	const struct zinf_opt_args la = *args, *a = &la;
	float *P = a->param, *H = a->v;
	size_t i = i0;
	for (; i + 16 <= i1; i += 16) {
		__m512 p = _mm512_loadu_ps(P + i);
		__m512 g = grad_in16(a, gdt, i, p);
		__m512 h = _mm512_fmadd_ps(g, g, _mm512_loadu_ps(H + i));
		__m512 std = _mm512_add_ps(_mm512_sqrt_ps(h), _mm512_set1_ps(a->eps));
		p = _mm512_fmadd_ps(_mm512_set1_ps(a->nstep), _mm512_div_ps(g, std), p);
		_mm512_storeu_ps(H + i, h);
		_mm512_storeu_ps(P + i, p);
		store_copy16(a->copy, ck, i, p, nt, a->hw_bf16);
	}
	if (nt) {
		_mm_sfence();
	}
	(void)hoff;
}

ZINF_VEC_KERNEL(avx512, adagrad, 16, 4)

ALWAYS_INLINE void
lion_loop(const struct zinf_opt_args *args, size_t i0, size_t i1, enum zinf_dtype gdt,
	  enum zinf_copy_kind ck, bool nt, size_t hoff)
{
	const struct zinf_opt_args la = *args, *a = &la;
	float *P = a->param, *M = a->m;
	const __m512 zero = _mm512_setzero_ps();
	size_t i = i0;
	for (; i + 16 <= i1; i += 16) {
		__m512 p = _mm512_mul_ps(_mm512_loadu_ps(P + i), _mm512_set1_ps(a->decay));
		__m512 g =
			_mm512_mul_ps(load_grad16(a->grad, gdt, i), _mm512_set1_ps(a->grad_scale));
		__m512 m = _mm512_loadu_ps(M + i);
		__m512 c = _mm512_fmadd_ps(_mm512_set1_ps(a->b1), m,
					   _mm512_mul_ps(_mm512_set1_ps(a->omb1), g));
		__mmask16 gt = _mm512_cmp_ps_mask(c, zero, _CMP_GT_OQ);
		__mmask16 lt = _mm512_cmp_ps_mask(c, zero, _CMP_LT_OQ);
		__m512 s = _mm512_mask_blend_ps(lt, zero, _mm512_set1_ps(-1.0f));
		s = _mm512_mask_blend_ps(gt, s, _mm512_set1_ps(1.0f));
		p = _mm512_fmadd_ps(_mm512_set1_ps(a->nstep), s, p);
		m = _mm512_fmadd_ps(_mm512_set1_ps(a->b2), m,
				    _mm512_mul_ps(_mm512_set1_ps(a->omb2), g));
		_mm512_storeu_ps(M + i, m);
		_mm512_storeu_ps(P + i, p);
		store_copy16(a->copy, ck, i, p, nt, a->hw_bf16);
	}
	if (nt) {
		_mm_sfence();
	}
	(void)hoff;
}

ZINF_VEC_KERNEL(avx512, lion, 16, 4)

/* acc0/acc1 += the squares of x's 16 lanes, in float64. Squares of float32 values are exact in
 * float64, so each FMA adds exactly one rounding. */
ALWAYS_INLINE void
sumsq_acc16(__m512 x, __m512d *acc0, __m512d *acc1)
{
	__m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
	__m512d hi = _mm512_cvtps_pd(
		_mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(x), 1)));
	*acc0 = _mm512_fmadd_pd(lo, lo, *acc0);
	*acc1 = _mm512_fmadd_pd(hi, hi, *acc1);
}

static double
avx512_sumsq(const void *g, enum zinf_dtype dt, size_t i0, size_t i1)
{
	__m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
	size_t i = i0;
	for (; i + 16 <= i1; i += 16) {
		sumsq_acc16(load_grad16(g, dt, i), &acc0, &acc1);
	}
	if (i < i1) { /* the tail zero-padded through the same accumulators (adds exact zeros) */
		_Alignas(64) uint32_t b[16] = {0};
		size_t es = zinf_dtype_size(dt);
		memcpy(b, (const char *)g + i * es, (i1 - i) * es);
		sumsq_acc16(load_grad16(b, dt, 0), &acc0, &acc1);
	}
	double s[8];
	_mm512_storeu_pd(s, _mm512_add_pd(acc0, acc1));
	return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

static bool
avx512_has_inf_nan(const void *g, enum zinf_dtype dt, size_t i0, size_t i1)
{
	size_t i = i0;
	if (dt == ZINF_F32) {
		const __m512i e = _mm512_set1_epi32(0x7f800000);
		__mmask16 any = 0;
		for (; i + 16 <= i1; i += 16) {
			__m512i x = _mm512_loadu_si512((const float *)g + i);
			any |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(x, e), e);
		}
		if (any) {
			return true;
		}
	} else {
		const __m512i e = _mm512_set1_epi16(dt == ZINF_F16 ? 0x7c00 : 0x7f80);
		__mmask32 any = 0;
		for (; i + 32 <= i1; i += 32) {
			__m512i x = _mm512_loadu_si512((const uint16_t *)g + i);
			any |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(x, e), e);
		}
		if (any) {
			return true;
		}
	}
	return zinf_nonfinite_range(g, dt, i, i1);
}

ALWAYS_INLINE void
scale_loop(void *g, enum zinf_dtype dt, float s, size_t i0, size_t i1)
{
	const __m512 vs = _mm512_set1_ps(s);
	size_t i = i0;
	for (; i + 16 <= i1; i += 16) {
		__m512 x = _mm512_mul_ps(load_grad16(g, dt, i), vs);
		switch (dt) {
		case ZINF_F16:
			_mm256_storeu_si256((__m256i *)((uint16_t *)g + i),
					    _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
			break;
		case ZINF_BF16:
			_mm256_storeu_si256((__m256i *)((uint16_t *)g + i), bf16_rne16_int(x));
			break;
		default:
			_mm512_storeu_ps((float *)g + i, x);
			break;
		}
	}
}

ALWAYS_INLINE void
convert_loop(const float *src, void *dst, enum zinf_copy_kind ck, size_t i0, size_t i1)
{
	for (size_t i = i0; i + 16 <= i1; i += 16) {
		store_copy16(dst, ck, i, _mm512_loadu_ps(src + i), false, false);
	}
}

ZINF_VEC_PASSES(avx512, 16)

const struct zinf_adam_ops zinf_adam_avx512_ops = {
	.name = "avx512",
	.missing = avx512_missing,
	.step =
		{
			[ZINF_OPT_ADAM] = avx512_adam,
			[ZINF_OPT_ADAM_BF16STATE] = avx512_adam_bf16state,
			[ZINF_OPT_ADAGRAD] = avx512_adagrad,
			[ZINF_OPT_LION] = avx512_lion,
		},
	.sumsq = avx512_sumsq,
	.has_inf_nan = avx512_has_inf_nan,
	.scale = avx512_scale,
	.convert = avx512_convert,
};
