// SPDX-License-Identifier: Apache-2.0
/*
 * cpu_adam/adam_avx2.c: the AVX2 + FMA + F16C kernels, 8 floats at a time, unaligned loads
 * and stores; the last (i1 - i0) % 8 elements of a range go through the same vector code on
 * zero-padded stack buffers (zinf_tail_in/out), so an element's result does not depend on where
 * it sits. Compiled with -mavx2 -mfma -mf16c -ffp-contract=off (FMA only where an fmadd
 * intrinsic is written): adam_registry.c hands it out only when the CPU reports all three. FMA
 * makes results differ from the scalar path by float rounding.
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

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE __m256
load_bf16x8(const uint16_t *p)
{
	__m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
	return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
}

ALWAYS_INLINE __m256
load_grad8(const void *g, enum zinf_dtype dt, size_t i)
{
	switch (dt) {
	case ZINF_F16:
		return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)g + i)));
	case ZINF_BF16:
		return load_bf16x8((const uint16_t *)g + i);
	default:
		return _mm256_loadu_ps((const float *)g + i);
	}
}

/* The high 16 bits of each 32-bit lane, packed: one byte shuffle and one qword permute. */
ALWAYS_INLINE __m128i
high_halves8(__m256i t)
{
	const __m256i sel =
		_mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1, 2, 3,
				 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1);
	return _mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_shuffle_epi8(t, sel), 0x08));
}

/* bf16 of x with rounding increment `add` per lane: 0x7fff + lsb (round to nearest even,
 * exactly as zinf_f32_to_bf16_rne()) or 16 random bits (stochastic). A NaN is quieted, keeping
 * sign and top payload bits; NaNs are rare, so they cost a test, not a blend, per vector. */
ALWAYS_INLINE __m128i
bf16_round8(__m256 x, __m256i add)
{
	__m256i u = _mm256_castps_si256(x);
	__m256i t = _mm256_add_epi32(u, add);
	__m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
	if (__builtin_expect(_mm256_movemask_ps(nan) != 0, 0)) {
		__m256i q = _mm256_or_si256(u, _mm256_set1_epi32(0x00400000));
		t = _mm256_blendv_epi8(t, q, _mm256_castps_si256(nan));
	}
	return high_halves8(t);
}

ALWAYS_INLINE __m128i
bf16_rne8(__m256 x)
{
	__m256i u = _mm256_castps_si256(x);
	return bf16_round8(x, _mm256_add_epi32(_mm256_and_si256(_mm256_srli_epi32(u, 16),
								_mm256_set1_epi32(1)),
					       _mm256_set1_epi32(0x7fff)));
}

/* Store 8 copies. nt: the 16-bit copy is 16-byte aligned and is written with streaming
 * stores: it is write-only here, so this saves the read-for-ownership of its lines. */
ALWAYS_INLINE void
store_copy8(void *c, enum zinf_copy_kind ck, size_t i, __m256 p, bool nt)
{
	__m128i h;
	switch (ck) {
	case ZINF_COPY_F32:
		_mm256_storeu_ps((float *)c + i, p);
		return;
	case ZINF_COPY_F16:
		h = _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT);
		break;
	case ZINF_COPY_BF16:
		h = bf16_rne8(p);
		break;
	default:
		return;
	}
	if (nt) {
		_mm_stream_si128((__m128i *)((uint16_t *)c + i), h);
	} else {
		_mm_storeu_si128((__m128i *)((uint16_t *)c + i), h);
	}
}

ALWAYS_INLINE bool
copy_nt(const struct zinf_opt_args *a, enum zinf_copy_kind ck)
{
	return (ck == ZINF_COPY_F16 || ck == ZINF_COPY_BF16) && ((uintptr_t)a->copy & 15) == 0;
}

/* zinf_sr_bits() for elements i .. i + 7 (i a multiple of 8, so i >> 32 is common). */
ALWAYS_INLINE __m256i
sr_bits8(uint32_t key, size_t i)
{
	uint32_t k = key ^ (uint32_t)((uint64_t)i >> 32) * 0x85ebca77u;
	__m256i idx = _mm256_add_epi32(_mm256_set1_epi32((int)(uint32_t)i),
				       _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
	__m256i h = _mm256_xor_si256(idx, _mm256_set1_epi32((int)k));
	h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
	h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0x7feb352du));
	h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 15));
	h = _mm256_mullo_epi32(h, _mm256_set1_epi32((int)0x846ca68bu));
	h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
	return h;
}

ALWAYS_INLINE __m256i
rne_increment8(__m256i u)
{
	__m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
	return _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff));
}

/* Round the new m and v to bf16 (RNE, or stochastic with one hash per element: low half for m,
 * high half for v, as zinf_adam_bf16state_elem()). One NaN test covers both: an unordered
 * compare of m with v is true when either is NaN. */
ALWAYS_INLINE void
state_round8(const struct zinf_opt_args *a, __m256 m, __m256 v, __m128i *mo, __m128i *vo, size_t i)
{
	__m256i um = _mm256_castps_si256(m), uv = _mm256_castps_si256(v), tm, tv;
	if (a->rounding == ZINF_ROUND_STOCHASTIC) {
		__m256i h = sr_bits8(a->sr_key, i);
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

/* g * grad_scale (+ wd * p) */
ALWAYS_INLINE __m256
grad_in8(const struct zinf_opt_args *a, enum zinf_dtype gdt, size_t i, __m256 p)
{
	__m256 g = _mm256_mul_ps(load_grad8(a->grad, gdt, i), _mm256_set1_ps(a->grad_scale));
	if (a->l2) {
		g = _mm256_fmadd_ps(_mm256_set1_ps(a->wd), p, g);
	}
	return g;
}

/* The Adam update of 8 elements given m and v as floats; returns p and the new m, v. */
ALWAYS_INLINE __m256
adam_math8(const struct zinf_opt_args *a, __m256 p, __m256 g, __m256 *m, __m256 *v)
{
	p = _mm256_mul_ps(p, _mm256_set1_ps(a->decay));
	*m = _mm256_fmadd_ps(_mm256_set1_ps(a->b1), *m, _mm256_mul_ps(_mm256_set1_ps(a->omb1), g));
	*v = _mm256_fmadd_ps(_mm256_set1_ps(a->b2), *v,
			     _mm256_mul_ps(_mm256_set1_ps(a->omb2), _mm256_mul_ps(g, g)));
	__m256 denom =
		_mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(*v), _mm256_set1_ps(a->inv_bc2_sqrt)),
			      _mm256_set1_ps(a->eps));
	return _mm256_fmadd_ps(_mm256_set1_ps(a->nstep), _mm256_div_ps(*m, denom), p);
}

ALWAYS_INLINE void
adam_loop(const struct zinf_opt_args *args, size_t i0, size_t i1, enum zinf_dtype gdt,
	  enum zinf_copy_kind ck, bool nt, size_t hoff)
{
	/* A local copy: the stores below could alias *args as far as the compiler knows, which
	 * would reload and re-broadcast every scalar in every iteration. */
	const struct zinf_opt_args la = *args, *a = &la;
	float *P = a->param, *M = a->m, *V = a->v;
	size_t i = i0;
	for (; i + 8 <= i1; i += 8) {
		__m256 p = _mm256_loadu_ps(P + i);
		__m256 g = grad_in8(a, gdt, i, p);
		__m256 m = _mm256_loadu_ps(M + i), v = _mm256_loadu_ps(V + i);
		p = adam_math8(a, p, g, &m, &v);
		_mm256_storeu_ps(M + i, m);
		_mm256_storeu_ps(V + i, v);
		_mm256_storeu_ps(P + i, p);
		store_copy8(a->copy, ck, i, p, nt);
	}
	if (nt) {
		_mm_sfence();
	}
	(void)hoff;
}

ZINF_VEC_KERNEL(avx2, adam, 8, 4)

ALWAYS_INLINE void
adam_bf16state_loop(const struct zinf_opt_args *args, size_t i0, size_t i1, enum zinf_dtype gdt,
		    enum zinf_copy_kind ck, bool nt, size_t hoff)
{
	const struct zinf_opt_args la = *args, *a = &la;
	float *P = a->param;
	uint16_t *M = a->m, *V = a->v;
	size_t i = i0;
	for (; i + 8 <= i1; i += 8) {
		__m256 p = _mm256_loadu_ps(P + i);
		__m256 g = grad_in8(a, gdt, i, p);
		__m256 m = load_bf16x8(M + i), v = load_bf16x8(V + i);
		p = adam_math8(a, p, g, &m, &v);
		__m128i mo, vo;
		state_round8(a, m, v, &mo, &vo, i + hoff);
		_mm_storeu_si128((__m128i *)(M + i), mo);
		_mm_storeu_si128((__m128i *)(V + i), vo);
		_mm256_storeu_ps(P + i, p);
		store_copy8(a->copy, ck, i, p, nt);
	}
	if (nt) {
		_mm_sfence();
	}
	(void)hoff;
}

ZINF_VEC_KERNEL(avx2, adam_bf16state, 8, 2)

ALWAYS_INLINE void
adagrad_loop(const struct zinf_opt_args *args, size_t i0, size_t i1, enum zinf_dtype gdt,
	     enum zinf_copy_kind ck, bool nt, size_t hoff)
{
	const struct zinf_opt_args la = *args, *a = &la;
	float *P = a->param, *H = a->v;
	size_t i = i0;
	for (; i + 8 <= i1; i += 8) {
		__m256 p = _mm256_loadu_ps(P + i);
		__m256 g = grad_in8(a, gdt, i, p);
		__m256 h = _mm256_fmadd_ps(g, g, _mm256_loadu_ps(H + i));
		__m256 std = _mm256_add_ps(_mm256_sqrt_ps(h), _mm256_set1_ps(a->eps));
		p = _mm256_fmadd_ps(_mm256_set1_ps(a->nstep), _mm256_div_ps(g, std), p);
		_mm256_storeu_ps(H + i, h);
		_mm256_storeu_ps(P + i, p);
		store_copy8(a->copy, ck, i, p, nt);
	}
	if (nt) {
		_mm_sfence();
	}
	(void)hoff;
}

ZINF_VEC_KERNEL(avx2, adagrad, 8, 4)

ALWAYS_INLINE void
lion_loop(const struct zinf_opt_args *args, size_t i0, size_t i1, enum zinf_dtype gdt,
	  enum zinf_copy_kind ck, bool nt, size_t hoff)
{
	const struct zinf_opt_args la = *args, *a = &la;
	float *P = a->param, *M = a->m;
	const __m256 zero = _mm256_setzero_ps();
	size_t i = i0;
	for (; i + 8 <= i1; i += 8) {
		__m256 p = _mm256_mul_ps(_mm256_loadu_ps(P + i), _mm256_set1_ps(a->decay));
		__m256 g =
			_mm256_mul_ps(load_grad8(a->grad, gdt, i), _mm256_set1_ps(a->grad_scale));
		__m256 m = _mm256_loadu_ps(M + i);
		__m256 c = _mm256_fmadd_ps(_mm256_set1_ps(a->b1), m,
					   _mm256_mul_ps(_mm256_set1_ps(a->omb1), g));
		__m256 s = _mm256_or_ps(
			_mm256_and_ps(_mm256_cmp_ps(c, zero, _CMP_GT_OQ), _mm256_set1_ps(1.0f)),
			_mm256_and_ps(_mm256_cmp_ps(c, zero, _CMP_LT_OQ), _mm256_set1_ps(-1.0f)));
		p = _mm256_fmadd_ps(_mm256_set1_ps(a->nstep), s, p);
		m = _mm256_fmadd_ps(_mm256_set1_ps(a->b2), m,
				    _mm256_mul_ps(_mm256_set1_ps(a->omb2), g));
		_mm256_storeu_ps(M + i, m);
		_mm256_storeu_ps(P + i, p);
		store_copy8(a->copy, ck, i, p, nt);
	}
	if (nt) {
		_mm_sfence();
	}
	(void)hoff;
}

ZINF_VEC_KERNEL(avx2, lion, 8, 4)

/* acc0/acc1 += the squares of x's 8 lanes, in float64. Squares of float32 values are exact in
 * float64, so each FMA adds exactly one rounding. */
ALWAYS_INLINE void
sumsq_acc8(__m256 x, __m256d *acc0, __m256d *acc1)
{
	__m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
	__m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
	*acc0 = _mm256_fmadd_pd(lo, lo, *acc0);
	*acc1 = _mm256_fmadd_pd(hi, hi, *acc1);
}

static double
avx2_sumsq(const void *g, enum zinf_dtype dt, size_t i0, size_t i1)
{
	__m256d acc0 = _mm256_setzero_pd(), acc1 = _mm256_setzero_pd();
	size_t i = i0;
	for (; i + 8 <= i1; i += 8) {
		sumsq_acc8(load_grad8(g, dt, i), &acc0, &acc1);
	}
	if (i < i1) { /* the tail zero-padded through the same accumulators (adds exact zeros) */
		_Alignas(32) uint32_t b[8] = {0};
		size_t es = zinf_dtype_size(dt);
		memcpy(b, (const char *)g + i * es, (i1 - i) * es);
		sumsq_acc8(load_grad8(b, dt, 0), &acc0, &acc1);
	}
	double s[4];
	_mm256_storeu_pd(s, _mm256_add_pd(acc0, acc1));
	return (s[0] + s[1]) + (s[2] + s[3]);
}

static bool
avx2_has_inf_nan(const void *g, enum zinf_dtype dt, size_t i0, size_t i1)
{
	size_t i = i0;
	__m256i any = _mm256_setzero_si256();
	if (dt == ZINF_F32) {
		const __m256i e = _mm256_set1_epi32(0x7f800000);
		for (; i + 8 <= i1; i += 8) {
			__m256i x = _mm256_loadu_si256((const __m256i *)((const float *)g + i));
			any = _mm256_or_si256(any, _mm256_cmpeq_epi32(_mm256_and_si256(x, e), e));
		}
	} else {
		const __m256i e = _mm256_set1_epi16(dt == ZINF_F16 ? 0x7c00 : 0x7f80);
		for (; i + 16 <= i1; i += 16) {
			__m256i x = _mm256_loadu_si256((const __m256i *)((const uint16_t *)g + i));
			any = _mm256_or_si256(any, _mm256_cmpeq_epi16(_mm256_and_si256(x, e), e));
		}
	}
	if (!_mm256_testz_si256(any, any)) {
		return true;
	}
	return zinf_nonfinite_range(g, dt, i, i1);
}

ALWAYS_INLINE void
scale_loop(void *g, enum zinf_dtype dt, float s, size_t i0, size_t i1)
{
	const __m256 vs = _mm256_set1_ps(s);
	size_t i = i0;
	for (; i + 8 <= i1; i += 8) {
		__m256 x = _mm256_mul_ps(load_grad8(g, dt, i), vs);
		switch (dt) {
		case ZINF_F16:
			_mm_storeu_si128((__m128i *)((uint16_t *)g + i),
					 _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
			break;
		case ZINF_BF16:
			_mm_storeu_si128((__m128i *)((uint16_t *)g + i), bf16_rne8(x));
			break;
		default:
			_mm256_storeu_ps((float *)g + i, x);
			break;
		}
	}
}

ALWAYS_INLINE void
convert_loop(const float *src, void *dst, enum zinf_copy_kind ck, size_t i0, size_t i1)
{
	for (size_t i = i0; i + 8 <= i1; i += 8) {
		store_copy8(dst, ck, i, _mm256_loadu_ps(src + i), false);
	}
}

ZINF_VEC_PASSES(avx2, 8)

const struct zinf_adam_ops zinf_adam_avx2_ops = {
	.name = "avx2",
	.missing = avx2_missing,
	.step =
		{
			[ZINF_OPT_ADAM] = avx2_adam,
			[ZINF_OPT_ADAM_BF16STATE] = avx2_adam_bf16state,
			[ZINF_OPT_ADAGRAD] = avx2_adagrad,
			[ZINF_OPT_LION] = avx2_lion,
		},
	.sumsq = avx2_sumsq,
	.has_inf_nan = avx2_has_inf_nan,
	.scale = avx2_scale,
	.convert = avx2_convert,
};
