/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_adam/adam_avx512.c: the AVX-512 path (F, BW, VL; FMA, F16C), 16 floats at a time: the
 * width layer of adam_simd_body.h for __m512, then the body, which holds the kernels and the table
 * zinf_adam_avx512_ops. What differs from adam_avx2.c is here, in the layer: masks instead of
 * vector compares (Lion's sign, the NaN blends, the inf/NaN check), and the bf16 rounding uses
 * vcvtneps2bf16 when the CPU has AVX512-BF16 (hw), patched for subnormal inputs, which the
 * instruction flushes to zero while round-to-nearest-even keeps them; otherwise the integer
 * rounding. Compiled with -mavx512f -mavx512bw -mavx512vl -mavx512bf16 -mfma -mf16c
 * -ffp-contract=off (only this file); adam_registry.c hands it out only when the CPU reports F,
 * BW, VL, FMA and F16C, and it uses the BF16 instruction only when the CPU reports AVX512-BF16.
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

/* The width layer that adam_simd_body.h needs (its first comment lists it). */
#define ZV_ISA	 avx512
#define ZV_WIDTH 16
#define ZV_PS	 __m512
#define ZV_EPI32 __m512i
#define ZV_PD	 __m512d
#define ZV_HALF	 __m256i
#define ZV_ANY	 __mmask32
#define ZVD_HSUM(s)                                                                                \
	((((s)[0] + (s)[1]) + ((s)[2] + (s)[3])) + (((s)[4] + (s)[5]) + ((s)[6] + (s)[7])))
#define zvi_srli(x, n) _mm512_srli_epi32((x), (n))

/* ---- f32 ---- */

ZINF_ALWAYS_INLINE __m512
zv_loadu(const float *p)
{
	return _mm512_loadu_ps(p);
}

ZINF_ALWAYS_INLINE void
zv_storeu(float *p, __m512 x)
{
	_mm512_storeu_ps(p, x);
}

ZINF_ALWAYS_INLINE __m512
zv_set1(float x)
{
	return _mm512_set1_ps(x);
}

ZINF_ALWAYS_INLINE __m512
zv_add(__m512 a, __m512 b)
{
	return _mm512_add_ps(a, b);
}

ZINF_ALWAYS_INLINE __m512
zv_mul(__m512 a, __m512 b)
{
	return _mm512_mul_ps(a, b);
}

ZINF_ALWAYS_INLINE __m512
zv_div(__m512 a, __m512 b)
{
	return _mm512_div_ps(a, b);
}

ZINF_ALWAYS_INLINE __m512
zv_sqrt(__m512 a)
{
	return _mm512_sqrt_ps(a);
}

ZINF_ALWAYS_INLINE __m512
zv_fmadd(__m512 a, __m512 b, __m512 c)
{
	return _mm512_fmadd_ps(a, b, c);
}

/* 1 where c > 0, -1 where c < 0, else 0: two compare masks and two blends */
ZINF_ALWAYS_INLINE __m512
zv_sign(__m512 c)
{
	const __m512 zero = _mm512_setzero_ps();
	__mmask16 gt = _mm512_cmp_ps_mask(c, zero, _CMP_GT_OQ);
	__mmask16 lt = _mm512_cmp_ps_mask(c, zero, _CMP_LT_OQ);
	__m512 s = _mm512_mask_blend_ps(lt, zero, _mm512_set1_ps(-1.0f));
	return _mm512_mask_blend_ps(gt, s, _mm512_set1_ps(1.0f));
}

/* ---- int32 ---- */

ZINF_ALWAYS_INLINE __m512i
zvi_set1(int x)
{
	return _mm512_set1_epi32(x);
}

ZINF_ALWAYS_INLINE __m512i
zvi_set1_16(short x)
{
	return _mm512_set1_epi16(x);
}

ZINF_ALWAYS_INLINE __m512i
zvi_iota(void)
{
	return _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}

ZINF_ALWAYS_INLINE __m512i
zvi_add(__m512i a, __m512i b)
{
	return _mm512_add_epi32(a, b);
}

ZINF_ALWAYS_INLINE __m512i
zvi_xor(__m512i a, __m512i b)
{
	return _mm512_xor_si512(a, b);
}

ZINF_ALWAYS_INLINE __m512i
zvi_and(__m512i a, __m512i b)
{
	return _mm512_and_si512(a, b);
}

ZINF_ALWAYS_INLINE __m512i
zvi_mullo(__m512i a, __m512i b)
{
	return _mm512_mullo_epi32(a, b);
}

ZINF_ALWAYS_INLINE __m512i
zvi_loadu(const uint32_t *p)
{
	return _mm512_loadu_si512(p);
}

/* ---- 16-bit values and the conversions ---- */

ZINF_ALWAYS_INLINE __m256i
zh_loadu(const uint16_t *p)
{
	return _mm256_loadu_si256((const __m256i *)p);
}

ZINF_ALWAYS_INLINE void
zh_storeu(uint16_t *p, __m256i h)
{
	_mm256_storeu_si256((__m256i *)p, h);
}

ZINF_ALWAYS_INLINE void
zh_stream(uint16_t *p, __m256i h)
{
	_mm256_stream_si256((__m256i *)p, h);
}

ZINF_ALWAYS_INLINE __m512
zv_from_f16(__m256i h)
{
	return _mm512_cvtph_ps(h);
}

ZINF_ALWAYS_INLINE __m512
zv_from_bf16(__m256i h)
{
	__m512i w = _mm512_cvtepu16_epi32(h);
	return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}

ZINF_ALWAYS_INLINE __m256i
zv_to_f16(__m512 x)
{
	return _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
}

/* bf16 with rounding increment `add` per lane (0x7fff + lsb: RNE; 16 random bits: stochastic);
 * NaN quieted, exactly as the scalar helpers. */
ZINF_ALWAYS_INLINE __m256i
bf16_round16(__m512 x, __m512i add)
{
	__m512i u = _mm512_castps_si512(x);
	__m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, add), 16);
	__mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
	__m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
	return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, r, q));
}

ZINF_ALWAYS_INLINE __m256i
bf16_rne16_int(__m512 x)
{
	__m512i u = _mm512_castps_si512(x);
	__m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
	return bf16_round16(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
}

/* Round to nearest even. With AVX512-BF16 (hw), vcvtneps2bf16 (NaN handling identical); lanes
 * whose input is subnormal (the instruction flushes them) are redone with the integer rounding. */
ZINF_ALWAYS_INLINE __m256i
zv_to_bf16(__m512 x, bool hw)
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

/* Stochastic rounding with the 16 random bits r of each lane, saturating: adam_bf16_sr_sat() per
 * lane (a finite |x| above the largest finite bf16 gives it with x's sign; NaN quieted). */
ZINF_ALWAYS_INLINE __m256i
zv_bf16_sr_sat(__m512 x, __m512i r)
{
	__m512i u = _mm512_castps_si512(x);
	__m512i ax = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
	__mmask16 sat = _mm512_cmpgt_epi32_mask(ax, _mm512_set1_epi32(0x7f7f0000)) &
			_mm512_cmplt_epi32_mask(ax, _mm512_set1_epi32(0x7f800000));
	__m512i s = _mm512_or_si512(_mm512_and_si512(u, _mm512_set1_epi32((int)0x80000000u)),
				    _mm512_set1_epi32(0x7f7f0000));
	return bf16_round16(_mm512_castsi512_ps(_mm512_mask_blend_epi32(sat, u, s)),
			    _mm512_maskz_mov_epi32((__mmask16)~sat, r));
}

/* the stochastic-rounding hash of elements i.., defined in adam_simd_body.h */
ZINF_ALWAYS_INLINE __m512i sr_bits(uint32_t key, uint64_t i);

/* Round the new m and v to bf16 (RNE, or stochastic with one hash per element: low half for m,
 * high half for v, as adam_bf16state_elem()). */
ZINF_ALWAYS_INLINE void
zv_state_round(const struct zinf_opt_args *a, __m512 m, __m512 v, __m256i *mo, __m256i *vo,
	       size_t i)
{
	if (a->rounding == ZINF_ROUND_STOCHASTIC) {
		__m512i h = sr_bits(a->sr_key, i);
		*mo = bf16_round16(m, _mm512_and_si512(h, _mm512_set1_epi32(0xffff)));
		*vo = bf16_round16(v, _mm512_srli_epi32(h, 16));
	} else {
		*mo = zv_to_bf16(m, a->hw_bf16);
		*vo = zv_to_bf16(v, a->hw_bf16);
	}
}

/* ---- float64, for the sum of squares ---- */

ZINF_ALWAYS_INLINE __m512d
zvd_zero(void)
{
	return _mm512_setzero_pd();
}

ZINF_ALWAYS_INLINE __m512d
zvd_lo(__m512 x)
{
	return _mm512_cvtps_pd(_mm512_castps512_ps256(x));
}

ZINF_ALWAYS_INLINE __m512d
zvd_hi(__m512 x)
{
	return _mm512_cvtps_pd(
		_mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(x), 1)));
}

ZINF_ALWAYS_INLINE __m512d
zvd_fmadd(__m512d a, __m512d b, __m512d c)
{
	return _mm512_fmadd_pd(a, b, c);
}

ZINF_ALWAYS_INLINE __m512d
zvd_add(__m512d a, __m512d b)
{
	return _mm512_add_pd(a, b);
}

ZINF_ALWAYS_INLINE void
zvd_storeu(double *p, __m512d x)
{
	_mm512_storeu_pd(p, x);
}

/* ---- the inf/NaN check: an OR of compare masks ---- */

ZINF_ALWAYS_INLINE __mmask32
zv_any_none(void)
{
	return 0;
}

ZINF_ALWAYS_INLINE __mmask32
zv_any_allset32(__mmask32 any, const void *p, __m512i e)
{
	__m512i x = _mm512_loadu_si512(p);
	return any | _mm512_cmpeq_epi32_mask(_mm512_and_si512(x, e), e);
}

ZINF_ALWAYS_INLINE __mmask32
zv_any_allset16(__mmask32 any, const void *p, __m512i e)
{
	__m512i x = _mm512_loadu_si512(p);
	return any | _mm512_cmpeq_epi16_mask(_mm512_and_si512(x, e), e);
}

ZINF_ALWAYS_INLINE bool
zv_any_found(__mmask32 any)
{
	return any != 0;
}

#include "cpu_adam/adam_simd_body.h"
