/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt_vmath.h: exp and tanh for the CPU layers' float loops (the GELU, the
 * attention's softmax), written so that the compiler vectorises them inside `#pragma omp simd`
 * loops at the baseline x86-64 ISA (SSE2), where a call to libm's expf or tanhf keeps a loop
 * scalar: no branch, no library call, selects as bit masks (a `c ? a : b` whose arms compute is
 * moved into a branch, and a loop with a branch is not vectorised without -ffast-math).
 *
 * Accuracy (tests/gpt/test_gpt_vmath.c checks it against libm's double): gpt_vexpf within 1.5 ulp
 * on [-87, 88] (Cody-Waite reduction by ln 2, Cephes' degree-6 polynomial, 2^n from its bits;
 * clamped to [-87.3, 88.3], so below -87.3 it returns about 1.2e-38 instead of less, above 88.3
 * about 2.2e38 instead of more or infinity); gpt_vtanhf within 2 ulp everywhere (Cephes' odd
 * polynomial below 0.625, 1 - 2 / (e^2|x| + 1) above). NaN in, NaN out.
 *
 * GPT_EXP and GPT_TANH pick these for float and libm's for double (the gradient check's
 * GPT_REAL=double keeps libm's precision).
 */
#ifndef ZINF_EXAMPLE_GPT_VMATH_H
#define ZINF_EXAMPLE_GPT_VMATH_H

#include <math.h>
#include <stdint.h>

/* c ? a : b with both computed, as bit masks (vectorises without branches) */
static inline float
gpt_vsel(int c, float a, float b)
{
	union {
		float f;
		int32_t i;
	} A = {a}, B = {b}, R;
	int32_t m = -c;
	R.i = (A.i & m) | (B.i & ~m);
	return R.f;
}

static inline float
gpt_vexpf(float x)
{
	x = gpt_vsel(x < -87.3f, -87.3f, x);
	x = gpt_vsel(x > 88.3f, 88.3f, x);
	/* n = round(x / ln 2) in [-126, 127]: adding 1.5 * 2^23 rounds to an integer in
	   round-to-nearest; a NaN's n is 0 (no undefined conversion), and p stays NaN */
	float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
	n = gpt_vsel(n == n, n, 0.0f);
	/* r = x - n ln 2 in two steps (ln 2's first 9 bits are exact in the product) */
	float r = x - n * 0.693359375f;
	r = r - n * -2.12194440e-4f;
	float p = 1.9875691500e-4f;
	p = p * r + 1.3981999507e-3f;
	p = p * r + 8.3334519073e-3f;
	p = p * r + 4.1665795894e-2f;
	p = p * r + 1.6666665459e-1f;
	p = p * r + 5.0000001201e-1f;
	p = p * (r * r) + r + 1.0f;
	union {
		int32_t i;
		float f;
	} s;
	s.i = ((int32_t)n + 127) << 23; /* 2^n, a normal float */
	return p * s.f;
}

static inline float
gpt_vtanhf(float x)
{
	/* on |x|, x's sign bit put back at the end (so tanh(-0) = -0) */
	union {
		float f;
		uint32_t u;
	} X = {x}, R;
	float a = fabsf(x), s = a * a;
	float small = ((((-5.70498872745e-3f * s + 2.06390887954e-2f) * s - 5.37397155531e-2f) * s +
			1.33314422036e-1f) *
			       s -
		       3.33332819422e-1f) *
			      s * a +
		      a;
	float big = 1.0f - 2.0f / (gpt_vexpf(2.0f * a) + 1.0f);
	R.f = gpt_vsel(a < 0.625f, small, big);
	R.u |= X.u & 0x80000000u;
	return R.f;
}

#define GPT_EXP(x)  _Generic((x), float : gpt_vexpf, default : exp)(x)
#define GPT_TANH(x) _Generic((x), float : gpt_vtanhf, default : tanh)(x)

#endif
