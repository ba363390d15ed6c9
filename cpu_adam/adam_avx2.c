/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_adam/adam_avx2.c: the AVX2 + FMA + F16C path, 8 floats at a time: the width layer of
 * adam_simd_body.h for __m256 (unaligned loads and stores, the bf16 conversions by integer
 * rounding), then the body, which holds the kernels and the table zinf_adam_avx2_ops. Compiled
 * with -mavx2 -mfma -mf16c -ffp-contract=off (FMA only where zv_fmadd is written):
 * adam_registry.c hands it out only when the CPU reports all three. FMA makes results differ from
 * the scalar path by float rounding.
 */
#include <immintrin.h>

#include "cpu_adam/adam_internal.h"

static const char *
avx2_missing(const struct zinf_cpu_features *f)
{
	return !f->avx2	  ? "this CPU lacks AVX2"
	       : !f->fma  ? "this CPU lacks FMA"
	       : !f->f16c ? "this CPU lacks F16C"
			  : NULL;
}

/* The width layer that adam_simd_body.h needs (its first comment lists it). */
#define ZV_ISA	       avx2
#define ZV_WIDTH       8
#define ZV_PS	       __m256
#define ZV_EPI32       __m256i
#define ZV_PD	       __m256d
#define ZV_HALF	       __m128i
#define ZV_ANY	       __m256i
#define ZVD_HSUM(s)    (((s)[0] + (s)[1]) + ((s)[2] + (s)[3]))
#define zvi_srli(x, n) _mm256_srli_epi32((x), (n))

/* ---- f32 ---- */

ZINF_ALWAYS_INLINE __m256
zv_loadu(const float *p)
{
	return _mm256_loadu_ps(p);
}

ZINF_ALWAYS_INLINE void
zv_storeu(float *p, __m256 x)
{
	_mm256_storeu_ps(p, x);
}

ZINF_ALWAYS_INLINE __m256
zv_set1(float x)
{
	return _mm256_set1_ps(x);
}

ZINF_ALWAYS_INLINE __m256
zv_add(__m256 a, __m256 b)
{
	return _mm256_add_ps(a, b);
}

ZINF_ALWAYS_INLINE __m256
zv_mul(__m256 a, __m256 b)
{
	return _mm256_mul_ps(a, b);
}

ZINF_ALWAYS_INLINE __m256
zv_div(__m256 a, __m256 b)
{
	return _mm256_div_ps(a, b);
}

ZINF_ALWAYS_INLINE __m256
zv_sqrt(__m256 a)
{
	return _mm256_sqrt_ps(a);
}

ZINF_ALWAYS_INLINE __m256
zv_fmadd(__m256 a, __m256 b, __m256 c)
{
	return _mm256_fmadd_ps(a, b, c);
}

/* 1 where c > 0, -1 where c < 0, else 0: the compares as masks, anded with the constants */
ZINF_ALWAYS_INLINE __m256
zv_sign(__m256 c)
{
	const __m256 zero = _mm256_setzero_ps();
	return _mm256_or_ps(
		_mm256_and_ps(_mm256_cmp_ps(c, zero, _CMP_GT_OQ), _mm256_set1_ps(1.0f)),
		_mm256_and_ps(_mm256_cmp_ps(c, zero, _CMP_LT_OQ), _mm256_set1_ps(-1.0f)));
}

/* ---- int32 ---- */

ZINF_ALWAYS_INLINE __m256i
zvi_set1(int x)
{
	return _mm256_set1_epi32(x);
}

ZINF_ALWAYS_INLINE __m256i
zvi_set1_16(short x)
{
	return _mm256_set1_epi16(x);
}

ZINF_ALWAYS_INLINE __m256i
zvi_iota(void)
{
	return _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
}

ZINF_ALWAYS_INLINE __m256i
zvi_add(__m256i a, __m256i b)
{
	return _mm256_add_epi32(a, b);
}

ZINF_ALWAYS_INLINE __m256i
zvi_xor(__m256i a, __m256i b)
{
	return _mm256_xor_si256(a, b);
}

ZINF_ALWAYS_INLINE __m256i
zvi_and(__m256i a, __m256i b)
{
	return _mm256_and_si256(a, b);
}

ZINF_ALWAYS_INLINE __m256i
zvi_mullo(__m256i a, __m256i b)
{
	return _mm256_mullo_epi32(a, b);
}

ZINF_ALWAYS_INLINE __m256i
zvi_loadu(const uint32_t *p)
{
	return _mm256_loadu_si256((const __m256i *)p);
}

/* ---- 16-bit values and the conversions ---- */

ZINF_ALWAYS_INLINE __m128i
zh_loadu(const uint16_t *p)
{
	return _mm_loadu_si128((const __m128i *)p);
}

ZINF_ALWAYS_INLINE void
zh_storeu(uint16_t *p, __m128i h)
{
	_mm_storeu_si128((__m128i *)p, h);
}

ZINF_ALWAYS_INLINE void
zh_stream(uint16_t *p, __m128i h)
{
	_mm_stream_si128((__m128i *)p, h);
}

ZINF_ALWAYS_INLINE __m256
zv_from_f16(__m128i h)
{
	return _mm256_cvtph_ps(h);
}

ZINF_ALWAYS_INLINE __m256
zv_from_bf16(__m128i h)
{
	__m256i w = _mm256_cvtepu16_epi32(h);
	return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

ZINF_ALWAYS_INLINE __m128i
zv_to_f16(__m256 x)
{
	return _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT);
}

/* The high 16 bits of each 32-bit lane, packed: one byte shuffle and one qword permute. */
ZINF_ALWAYS_INLINE __m128i
high_halves8(__m256i t)
{
	const __m256i sel =
		_mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1, 2, 3,
				 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1);
	return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_shuffle_epi8(t, sel), 0x08));
}

/* The round-to-nearest-even increment of each lane: 0x7fff + the lsb of its bf16. */
ZINF_ALWAYS_INLINE __m256i
rne_increment8(__m256i u)
{
	__m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
	return _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff));
}

/* bf16 of x, round to nearest even, exactly as dt_f32_to_bf16_rne(). A NaN is quieted, keeping
 * sign and top payload bits; NaNs are rare, so they cost a test, not a blend, per vector. No
 * hardware conversion in this path: hw is ignored. */
ZINF_ALWAYS_INLINE __m128i
zv_to_bf16(__m256 x, bool hw)
{
	__m256i u = _mm256_castps_si256(x);
	__m256i t = _mm256_add_epi32(u, rne_increment8(u));
	__m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
	if (__builtin_expect(_mm256_movemask_ps(nan) != 0, 0)) {
		__m256i q = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
		t = _mm256_blendv_epi8(t, q, _mm256_castps_si256(nan));
	}
	(void)hw;
	return high_halves8(t);
}

/* Stochastic rounding with the 16 random bits r of each lane, saturating: adam_bf16_sr_sat() per
 * lane. The lanes it treats apart (|x| above the largest finite bf16: a finite one saturates, a
 * NaN is quieted) are rare, so they cost one test per vector. */
ZINF_ALWAYS_INLINE __m128i
zv_bf16_sr_sat(__m256 x, __m256i r)
{
	__m256i u = _mm256_castps_si256(x);
	__m256i t = _mm256_add_epi32(u, r);
	__m256i ax = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
	__m256i big = _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x7f7f0000));
	if (__builtin_expect(_mm256_movemask_ps(_mm256_castsi256_ps(big)) != 0, 0)) {
		__m256i fin = _mm256_cmpgt_epi32(_mm256_set1_epi32(0x7f800000), ax);
		__m256i nan = _mm256_cmpgt_epi32(ax, _mm256_set1_epi32(0x7f800000));
		__m256i sat =
			_mm256_or_si256(_mm256_and_si256(u, _mm256_set1_epi32((int)0x80000000u)),
					_mm256_set1_epi32(0x7f7f0000));
		t = _mm256_blendv_epi8(t, sat, _mm256_and_si256(big, fin));
		t = _mm256_blendv_epi8(t, _mm256_or_si256(u, _mm256_set1_epi32(0x00400000)), nan);
	}
	return high_halves8(t);
}

/* the stochastic-rounding hash of elements i.., defined in adam_simd_body.h */
ZINF_ALWAYS_INLINE __m256i sr_bits(uint32_t key, uint64_t i);

/* Round the new m and v to bf16 (RNE, or stochastic with one hash per element: low half for m,
 * high half for v, as adam_bf16state_elem()). One NaN test covers both: an unordered
 * compare of m with v is true when either is NaN. */
ZINF_ALWAYS_INLINE void
zv_state_round(const struct zinf_opt_args *a, __m256 m, __m256 v, __m128i *mo, __m128i *vo,
	       size_t i)
{
	__m256i um = _mm256_castps_si256(m), uv = _mm256_castps_si256(v), tm, tv;
	if (a->rounding == ZINF_ROUND_STOCHASTIC) {
		__m256i h = sr_bits(a->sr_key, i);
		tm = _mm256_add_epi32(um, _mm256_and_si256(h, _mm256_set1_epi32(0xffff)));
		tv = _mm256_add_epi32(uv, _mm256_srli_epi32(h, 16));
	} else {
		tm = _mm256_add_epi32(um, rne_increment8(um));
		tv = _mm256_add_epi32(uv, rne_increment8(uv));
	}
	if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(m, v, _CMP_UNORD_Q)) != 0, 0)) {
		const __m256i quiet = _mm256_set1_epi32(0x00400000);
		tm = _mm256_blendv_epi8(tm, _mm256_or_si256(um, quiet),
					_mm256_castps_si256(_mm256_cmp_ps(m, m, _CMP_UNORD_Q)));
		tv = _mm256_blendv_epi8(tv, _mm256_or_si256(uv, quiet),
					_mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
	}
	*mo = high_halves8(tm);
	*vo = high_halves8(tv);
}

/* ---- float64, for the sum of squares ---- */

ZINF_ALWAYS_INLINE __m256d
zvd_zero(void)
{
	return _mm256_setzero_pd();
}

ZINF_ALWAYS_INLINE __m256d
zvd_lo(__m256 x)
{
	return _mm256_cvtps_pd(_mm256_castps256_ps128(x));
}

ZINF_ALWAYS_INLINE __m256d
zvd_hi(__m256 x)
{
	return _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
}

ZINF_ALWAYS_INLINE __m256d
zvd_fmadd(__m256d a, __m256d b, __m256d c)
{
	return _mm256_fmadd_pd(a, b, c);
}

ZINF_ALWAYS_INLINE __m256d
zvd_add(__m256d a, __m256d b)
{
	return _mm256_add_pd(a, b);
}

ZINF_ALWAYS_INLINE void
zvd_storeu(double *p, __m256d x)
{
	_mm256_storeu_pd(p, x);
}

/* ---- the inf/NaN check: an OR of compare results ---- */

ZINF_ALWAYS_INLINE __m256i
zv_any_none(void)
{
	return _mm256_setzero_si256();
}

ZINF_ALWAYS_INLINE __m256i
zv_any_allset32(__m256i any, const void *p, __m256i e)
{
	__m256i x = _mm256_loadu_si256((const __m256i *)p);
	return _mm256_or_si256(any, _mm256_cmpeq_epi32(_mm256_and_si256(x, e), e));
}

ZINF_ALWAYS_INLINE __m256i
zv_any_allset16(__m256i any, const void *p, __m256i e)
{
	__m256i x = _mm256_loadu_si256((const __m256i *)p);
	return _mm256_or_si256(any, _mm256_cmpeq_epi16(_mm256_and_si256(x, e), e));
}

ZINF_ALWAYS_INLINE bool
zv_any_found(__m256i any)
{
	return !_mm256_testz_si256(any, any);
}

#include "cpu_adam/adam_simd_body.h"
