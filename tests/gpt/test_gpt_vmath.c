/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/gpt/test_gpt_vmath.c: the CPU layers' vectorisable exp and tanh (examples/gpt/
 * gpt_vmath.h: the GELU's tanh, the attention softmax's exp) against libm's double, in ulps of
 * the float result: every 61st float bit pattern over exp's range [-87, 88] and over all finite
 * floats for tanh (about 35 and 70 million inputs, both signs), run through the same vectorised
 * loops the layers use (`#pragma omp simd`), compiled for the baseline ISA and, where the CPU has
 * AVX2 and FMA, again for x86-64-v3 (the GELU's other clone, gpt_cpu.c). Bounds: exp within 1.5
 * ulp, tanh within 2 ulp (what gpt_vmath.h promises; measured: 0.96, 1.00 with FMA, and 1.27). A
 * wrong coefficient, a wrong reduction constant or a select the wrong way round is thousands of
 * ulps. Also the edges: NaN gives NaN, tanh(+-inf) = +-1 and tanh(-0) = -0, exp clamped below -87.3
 * to a positive normal, and above 88.3 to a finite value, and GPT_EXP / GPT_TANH are these for
 * float and libm's for double. Plain program (exit 0 / 1), label gpt.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_vmath.h"

static int failures;

#define CHUNK 4096

static float
from_bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, sizeof(f));
	return f;
}

/* ulps between got and the exact value, in units of the float spacing at the exact value */
static double
ulps(float got, double exact)
{
	float e = (float)exact;
	double spacing = (double)nextafterf(fabsf(e), INFINITY) - fabsf(e);
	return fabs((double)got - exact) / spacing;
}

static void
vexp(float *y, const float *x, int n)
{
#pragma omp simd
	for (int i = 0; i < n; i++) {
		y[i] = gpt_vexpf(x[i]);
	}
}

static void
vtanh(float *y, const float *x, int n)
{
#pragma omp simd
	for (int i = 0; i < n; i++) {
		y[i] = gpt_vtanhf(x[i]);
	}
}

#if defined(__x86_64__) && defined(__GNUC__)
/* the same loops for x86-64-v3 (AVX2, FMA): the GELU's clone on such a machine (gpt_cpu.c) */
#define V3 __attribute__((target("arch=x86-64-v3")))

V3 static void
vexp_v3(float *y, const float *x, int n)
{
#pragma omp simd
	for (int i = 0; i < n; i++) {
		y[i] = gpt_vexpf(x[i]);
	}
}

V3 static void
vtanh_v3(float *y, const float *x, int n)
{
#pragma omp simd
	for (int i = 0; i < n; i++) {
		y[i] = gpt_vtanhf(x[i]);
	}
}
#endif

/* Every stride-th bit pattern in [lo, hi) of both signs, through f, the worst ulps vs ref. */
static void
sweep(const char *name, void (*f)(float *, const float *, int), double (*ref)(double), float lo,
      float hi, double bound)
{
	static float x[CHUNK], y[CHUNK];
	double worst = 0;
	float at = 0;
	long n = 0;
	for (int sign = 0; sign < 2; sign++) {
		uint32_t u = 0;
		for (;;) {
			int k = 0;
			for (; k < CHUNK && u < 0x7f800000u; u += 61) {
				float v = from_bits(u | (sign ? 0x80000000u : 0));
				if (v >= lo && v < hi) {
					x[k++] = v;
				}
			}
			if (!k) {
				break;
			}
			f(y, x, k);
			for (int i = 0; i < k; i++) {
				double e = ulps(y[i], ref(x[i]));
				if (!(e <= worst)) {
					worst = e, at = x[i];
				}
			}
			n += k;
		}
	}
	printf("  %s: %ld inputs in [%g, %g), max %.3f ulp at %.9g\n", name, n, (double)lo,
	       (double)hi, worst, (double)at);
	if (!(worst <= bound)) {
		printf("FAIL: %s: %.3f ulp at %.9g (bound %g)\n", name, worst, (double)at, bound);
		failures++;
	}
}

static void
expect(int ok, const char *what)
{
	if (!ok) {
		printf("FAIL: %s\n", what);
		failures++;
	}
}

int
main(void)
{
	printf("test_gpt_vmath: gpt_vexpf and gpt_vtanhf against libm's double\n");
	sweep("exp", vexp, exp, -87.0f, 88.0f, 1.5);
	sweep("tanh", vtanh, tanh, -INFINITY, INFINITY, 2.0);
#if defined(__x86_64__) && defined(__GNUC__)
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
		sweep("exp (x86-64-v3)", vexp_v3, exp, -87.0f, 88.0f, 1.5);
		sweep("tanh (x86-64-v3)", vtanh_v3, tanh, -INFINITY, INFINITY, 2.0);
	} else {
		printf("  no AVX2 and FMA here: the x86-64-v3 loops not run\n");
	}
#endif

	float x[8] = {NAN, INFINITY, -INFINITY, -0.0f, -100.0f, 100.0f, 88.3f, -87.3f}, y[8], z[8];
	vexp(y, x, 8);
	vtanh(z, x, 8);
	expect(isnan(y[0]) && isnan(z[0]), "NaN in gives NaN out");
	expect(z[1] == 1.0f && z[2] == -1.0f, "tanh(+-inf) = +-1");
	expect(z[3] == 0.0f && signbit(z[3]), "tanh(-0) = -0");
	expect(z[4] == -1.0f && z[5] == 1.0f, "tanh(+-100) = +-1");
	expect(y[4] > 0 && isnormal(y[4]) && y[4] <= 1.25e-38f,
	       "exp(-100) clamped: normal, <= 1.25e-38");
	expect(y[5] == y[6] && isfinite(y[5]) && y[5] > 1e38f, "exp(100) = exp(88.3), finite");
	expect(ulps(y[6], exp(88.3f)) <= 2 && ulps(y[7], exp(-87.3f)) <= 2, "exp at the clamps");
	float f = 0.5f;
	double d = 0.5;
	expect(GPT_EXP(f) == gpt_vexpf(f) && GPT_TANH(f) == gpt_vtanhf(f),
	       "GPT_EXP, GPT_TANH of a float");
	expect(GPT_EXP(d) == exp(d) && GPT_TANH(d) == tanh(d), "GPT_EXP, GPT_TANH of a double");
	printf("%s\n", failures ? "FAIL" : "PASS");
	return failures ? 1 : 0;
}
