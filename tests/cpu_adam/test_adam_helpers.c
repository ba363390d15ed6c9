/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/cpu_adam/test_adam_helpers.c: the parts of cpu_adam that are exact rather than within
 * a tolerance: RNE conversions (against a float64 model and, for f16, the F16C instruction),
 * independence from the thread count (bitwise), argument checks (nothing modified), the gradient
 * sum of squares (against float64/long double) and inf/NaN positions, the bf16-state step, and
 * the options themselves: the SIMD path option (unknown name -EINVAL, unavailable path -ENODEV,
 * with their messages; the zinf_simd_* queries) and the size rule (older smaller structs get the
 * defaults; larger or field-cutting sizes are refused). Runs on the SIMD path named by
 * ZINF_TEST_VARIANT, as test_adam.c; the path-independent tests run in the scalar variant only.
 */
#include <criterion/criterion.h>
#include <float.h>
#include <immintrin.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "common/util.h"
#include "cpu_adam/adam_internal.h"
#include "cpu_adam/adam_bench.h"
#include "zinf/blocks/adam.h"

/* Gradient-helper options: the variant's SIMD path and `threads`. */
static struct zinf_grad_opts
grad_opts(int threads)
{
	struct zinf_grad_opts o;
	zinf_grad_opts_init(&o);
	o.simd = zt_simd_variant();
	o.threads = threads;
	return o;
}

/* Tests that do not depend on the SIMD path run once, in the scalar variant, so that a path's
 * variant is all skipped (ctest: skipped) where the CPU lacks it. */
static void
path_independent(void)
{
	const char *v = zt_variant();
	if (v && strcmp(v, "scalar") != 0) {
		cr_skip_test("independent of the SIMD path: runs in the scalar variant");
	}
}

/* ---- RNE conversions ------------------------------------------------------------------------ */

/* Float64 model of round-to-nearest-even into a format with `mbits` fraction bits, minimum
 * normal exponent emin and largest finite value maxv: returns the rounded value (inf on
 * overflow). */
static double
model_round(double x, int mbits, int emin, double maxv)
{
	if (x == 0 || isinf(x)) {
		return x;
	}
	int e;
	frexp(fabs(x), &e); /* |x| = f * 2^e, f in [0.5, 1) */
	e -= 1;
	if (e < emin) {
		e = emin;
	}
	double ulp = ldexp(1.0, e - mbits);
	double r = nearbyint(x / ulp) * ulp; /* default rounding mode: to nearest even */
	if (fabs(r) > maxv) {
		return copysign(INFINITY, x);
	}
	return r;
}

static void
check_conv(uint32_t bits, uint16_t b16, uint16_t h16)
{
	float f;
	memcpy(&f, &bits, 4);
	if (isnan(f)) {
		cr_assert(isnan(dt_bf16_to_f32(b16)), "bf16 of NaN %08x is %04x", bits, b16);
		cr_assert(isnan(dt_f16_to_f32(h16)), "f16 of NaN %08x is %04x", bits, h16);
		cr_assert_eq(b16 >> 15, bits >> 31);
		return;
	}
	double rb = model_round(f, 7, -126, 0x1.fep127);
	double rh = model_round(f, 10, -14, 65504.0);
	double gb = dt_bf16_to_f32(b16), gh = dt_f16_to_f32(h16);
	cr_assert(gb == rb && !signbit(gb) == !signbit(f), "bf16(%a = %08x) = %04x (%a), want %a",
		  f, bits, b16, gb, rb);
	cr_assert(gh == rh && !signbit(gh) == !signbit(f), "f16(%a = %08x) = %04x (%a), want %a", f,
		  bits, h16, gh, rh);
}

static const uint32_t special_bits[] = {
	0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x00007fff, 0x00008000, 0x00018000,
	0x007fffff, 0x00800000, 0x3f800000, 0x3f808000, 0x3f818000, 0x3f807fff, 0x3f808001,
	0x7f7fffff, 0xff7fffff, 0x7f7f8000, 0x7f7f7fff, 0x7f800000, 0xff800000, 0x7f800001,
	0x7fc00000, 0xffc00000, 0x7fffffff, 0xff800001, 0x7f80ffff, 0x477fe000, 0x477fefff,
	0x477ff000, 0x477ff001, 0x38800000, 0x387fffff, 0x387fe000, 0x387ff000, 0x33000000,
	0x33000001, 0x33800000, 0x33c00000, 0x34000000, 0x35000000, 0x38000000, 0xb3000001,
	0x3c000000, 0x3c001000, 0x3c003000, 0x3c002fff, 0x3c003001, 0x47000000, 0xc77ff000,
};

Test(cpu_adam, rne_scalar_matches_float64_model)
{
	path_independent();
	uint64_t rng = zt_seed() + 10;
	for (size_t k = 0; k < ZINF_ARRAY_SIZE(special_bits); k++) {
		float f;
		memcpy(&f, &special_bits[k], 4);
		check_conv(special_bits[k], dt_f32_to_bf16_rne(f), dt_f32_to_f16_rne(f));
	}
	for (int k = 0; k < (1 << 20); k++) {
		uint32_t b = (uint32_t)zt_rand(&rng);
		if (k & 1) { /* concentrate on the f16 range, subnormals included */
			b = (b & 0x80ffffffu) | ((uint32_t)(100 + zt_rand(&rng) % 45) << 23);
		}
		float f;
		memcpy(&f, &b, 4);
		check_conv(b, dt_f32_to_bf16_rne(f), dt_f32_to_f16_rne(f));
	}
	/* widening is exact for every 16-bit pattern */
	for (uint32_t h = 0; h < 0x10000; h++) {
		float f = dt_f16_to_f32((uint16_t)h);
		if (!isnan(f)) {
			cr_assert_eq(dt_f32_to_f16_rne(f), h, "f16 %04x round trip", h);
			cr_assert_eq(dt_f32_to_bf16_rne(dt_bf16_to_f32((uint16_t)h)), h);
		}
	}
}

__attribute__((target("f16c"))) static uint16_t
hw_f16(float f)
{
	return (uint16_t)_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT),
					   0);
}

Test(cpu_adam, f16_scalar_matches_f16c_bit_for_bit)
{
	path_independent();
	struct zinf_cpu_features f;
	zinf_cpu_features_get(&f);
	if (!f.f16c) {
		cr_skip_test("no F16C on this CPU");
	}
	uint64_t rng = zt_seed() + 11;
	for (size_t k = 0; k < ZINF_ARRAY_SIZE(special_bits); k++) {
		float x;
		memcpy(&x, &special_bits[k], 4);
		cr_assert_eq(dt_f32_to_f16_rne(x), hw_f16(x), "%08x", special_bits[k]);
	}
	for (int k = 0; k < (1 << 21); k++) {
		uint32_t b = (uint32_t)zt_rand(&rng);
		if (k & 1) {
			b = (b & 0x80ffffffu) | ((uint32_t)(100 + zt_rand(&rng) % 45) << 23);
		}
		float x;
		memcpy(&x, &b, 4);
		uint16_t s = dt_f32_to_f16_rne(x), h = hw_f16(x);
		cr_assert_eq(s, h, "f32 %08x: scalar %04x, F16C %04x", b, s, h);
	}
}

/* The selected path's vector conversion (the three-pass copy) equals the scalar RNE. */
Test(cpu_adam, path_conversion_equals_scalar_rne)
{
	zt_simd_variant(); /* skips where the path cannot run */
	uint64_t rng = zt_seed() + 12;
	size_t n = 4099;
	float *src = malloc(n * 4);
	uint16_t *dst = malloc(n * 2);
	for (size_t i = 0; i < n; i++) {
		uint32_t b = i < ZINF_ARRAY_SIZE(special_bits) ? special_bits[i]
							       : (uint32_t)zt_rand(&rng);
		if (i % 3 == 1) {
			b = (b & 0x80ffffffu) | ((uint32_t)(100 + zt_rand(&rng) % 45) << 23);
		}
		memcpy(&src[i], &b, 4);
	}
	struct zinf_grad_opts go = grad_opts(2);
	for (int dt = ZINF_F16; dt <= ZINF_BF16; dt++) {
		cr_assert_eq(adam_convert(src, dst, dt, n, &go), 0);
		for (size_t i = 0; i < n; i++) {
			uint16_t want = dt == ZINF_F16 ? dt_f32_to_f16_rne(src[i])
						       : dt_f32_to_bf16_rne(src[i]);
			cr_assert_eq(dst[i], want, "dtype %d element %zu (%08x): %04x want %04x",
				     dt, i, dt_f2u(src[i]), dst[i], want);
		}
	}
	free(src);
	free(dst);
}

/* ---- thread-count independence -------------------------------------------------------------- */

struct state {
	float *p, *m, *v;
	uint16_t *mb, *vb, *c;
	float *g;
};

static void
state_init(struct state *s, size_t n, uint64_t seed)
{
	uint64_t rng = seed;
	s->p = malloc(n * 4);
	s->m = malloc(n * 4);
	s->v = malloc(n * 4);
	s->g = malloc(n * 4);
	s->mb = malloc(n * 2);
	s->vb = malloc(n * 2);
	s->c = malloc(n * 2);
	for (size_t i = 0; i < n; i++) {
		s->p[i] = (float)zt_uniform(&rng, -1, 1);
		s->m[i] = (float)zt_uniform(&rng, -0.1, 0.1);
		s->v[i] = (float)zt_uniform(&rng, 0, 0.01);
		s->g[i] = (float)zt_uniform(&rng, -1, 1);
		s->mb[i] = dt_f32_to_bf16_rne(s->m[i]);
		s->vb[i] = dt_f32_to_bf16_rne(s->v[i]);
	}
	memset(s->c, 0, n * 2);
}

static void
state_free(struct state *s)
{
	free(s->p);
	free(s->m);
	free(s->v);
	free(s->g);
	free(s->mb);
	free(s->vb);
	free(s->c);
}

static void
state_eq(const struct state *a, const struct state *b, size_t n, int threads)
{
	cr_assert(memcmp(a->p, b->p, n * 4) == 0, "param differs with %d threads", threads);
	cr_assert(memcmp(a->m, b->m, n * 4) == 0, "m differs with %d threads", threads);
	cr_assert(memcmp(a->v, b->v, n * 4) == 0, "v differs with %d threads", threads);
	cr_assert(memcmp(a->mb, b->mb, n * 2) == 0, "bf16 m differs with %d threads", threads);
	cr_assert(memcmp(a->vb, b->vb, n * 2) == 0, "bf16 v differs with %d threads", threads);
	cr_assert(memcmp(a->c, b->c, n * 2) == 0, "copy differs with %d threads", threads);
}

Test(cpu_adam, results_do_not_depend_on_thread_count)
{
	zt_simd_variant(); /* skips where the path cannot run */
	uint64_t seed = zt_seed() + 13;
	size_t n = 5 * ZINF_ADAM_TILE + 13;
	struct state ref, s;
	double ss_ref = 0;
	for (int threads = 1; threads <= 3; threads++) {
		struct state *x = threads == 1 ? &ref : &s;
		state_init(x, n, seed);
		struct zinf_adam_opts o;
		zinf_adam_opts_init(&o);
		o.threads = threads;
		o.weight_decay = 0.01f;
		o.simd = zt_simd_variant();
		struct zinf_adagrad_opts ao;
		zinf_adagrad_opts_init(&ao);
		ao.threads = threads;
		ao.simd = o.simd;
		struct zinf_lion_opts lo;
		zinf_lion_opts_init(&lo);
		lo.threads = threads;
		lo.simd = o.simd;
		for (int t = 1; t <= 3; t++) {
			cr_assert_eq(zinf_adam_step(&o, t, 0.5f, x->p, x->g, ZINF_F32, x->m, x->v,
						    n, x->c, ZINF_BF16),
				     0);
			cr_assert_eq(zinf_adam_step_bf16state(&o, t, 0.5f, x->p, x->g, ZINF_F32,
							      x->mb, x->vb, n, x->c, ZINF_F16,
							      ZINF_ROUND_STOCHASTIC, 42),
				     0);
			cr_assert_eq(zinf_adagrad_step(&ao, t, 1.0f, x->p, x->g, ZINF_F32, x->v, n,
						       x->c, ZINF_BF16),
				     0);
			cr_assert_eq(zinf_lion_step(&lo, t, 1.0f, x->p, x->g, ZINF_F32, x->m, n,
						    x->c, ZINF_F16),
				     0);
		}
		double ss;
		struct zinf_grad_opts go = grad_opts(threads);
		cr_assert_eq(zinf_grad_sumsq(x->p, ZINF_F32, n, &go, &ss), 0);
		if (threads == 1) {
			ss_ref = ss;
			continue;
		}
		cr_assert(memcmp(&ss, &ss_ref, sizeof(ss)) == 0, "sumsq %a vs %a with %d threads",
			  ss, ss_ref, threads);
		state_eq(&ref, &s, n, threads);
		state_free(&s);
	}
	state_free(&ref);
}

/* ---- argument checks ------------------------------------------------------------------------ */

Test(cpu_adam, bad_arguments_are_einval_and_modify_nothing)
{
	zt_simd_variant(); /* skips where the path cannot run */
	zt_log_to_stderr();
	size_t n = 37;
	struct state s, keep;
	state_init(&s, n, 5);
	state_init(&keep, n, 5);
	struct zinf_adam_opts o, bad;
	zinf_adam_opts_init(&o);
	cr_assert_eq(o.size, sizeof(o));
	cr_assert_float_eq(o.lr, 1e-3f, 0);
	cr_assert(o.adamw_mode && o.bias_correction);
	cr_assert_null(o.simd);
	o.simd = zt_simd_variant();

#define EXPECT_EINVAL(call)                                                                        \
	do {                                                                                       \
		int r_ = (call);                                                                   \
		cr_assert_eq(r_, -EINVAL, "%s returned %d", #call, r_);                            \
		cr_assert_str_neq(zinf_last_error(), "", "no message for %s", #call);              \
		state_eq(&s, &keep, n, 0);                                                         \
	} while (0)

	EXPECT_EINVAL(zinf_adam_step(NULL, 1, 1, s.p, s.g, ZINF_F32, s.m, s.v, n, s.c, ZINF_BF16));
	EXPECT_EINVAL(zinf_adam_step(&o, 0, 1, s.p, s.g, ZINF_F32, s.m, s.v, n, s.c, ZINF_BF16));
	EXPECT_EINVAL(zinf_adam_step(&o, -5, 1, s.p, s.g, ZINF_F32, s.m, s.v, n, s.c, ZINF_BF16));
	EXPECT_EINVAL(zinf_adam_step(&o, 1, NAN, s.p, s.g, ZINF_F32, s.m, s.v, n, s.c, ZINF_BF16));
	EXPECT_EINVAL(zinf_adam_step(&o, 1, INFINITY, s.p, s.g, ZINF_F32, s.m, s.v, n, s.c, 2));
	EXPECT_EINVAL(zinf_adam_step(&o, 1, 1, NULL, s.g, ZINF_F32, s.m, s.v, n, s.c, ZINF_BF16));
	EXPECT_EINVAL(zinf_adam_step(&o, 1, 1, s.p, NULL, ZINF_F32, s.m, s.v, n, s.c, ZINF_BF16));
	EXPECT_EINVAL(zinf_adam_step(&o, 1, 1, s.p, s.g, ZINF_F32, NULL, s.v, n, s.c, ZINF_BF16));
	EXPECT_EINVAL(zinf_adam_step(&o, 1, 1, s.p, s.g, ZINF_F32, s.m, NULL, n, s.c, ZINF_BF16));
	EXPECT_EINVAL(zinf_adam_step(&o, 1, 1, s.p, s.g, (enum zinf_dtype)3, s.m, s.v, n, s.c, 2));
	EXPECT_EINVAL(
		zinf_adam_step(&o, 1, 1, s.p, s.g, (enum zinf_dtype) - 1, s.m, s.v, n, s.c, 2));
	EXPECT_EINVAL(
		zinf_adam_step(&o, 1, 1, s.p, s.g, ZINF_F32, s.m, s.v, n, s.c, (enum zinf_dtype)7));
	float bad_vals[] = {NAN, INFINITY, -INFINITY, -1e-3f};
	for (size_t k = 0; k < ZINF_ARRAY_SIZE(bad_vals); k++) {
		float x = bad_vals[k];
		bad = o, bad.lr = x;
		EXPECT_EINVAL(zinf_adam_step(&bad, 1, 1, s.p, s.g, 0, s.m, s.v, n, s.c, 2));
		bad = o, bad.beta1 = x;
		EXPECT_EINVAL(zinf_adam_step(&bad, 1, 1, s.p, s.g, 0, s.m, s.v, n, s.c, 2));
		bad = o, bad.beta2 = x;
		EXPECT_EINVAL(zinf_adam_step(&bad, 1, 1, s.p, s.g, 0, s.m, s.v, n, s.c, 2));
		bad = o, bad.eps = x;
		EXPECT_EINVAL(zinf_adam_step(&bad, 1, 1, s.p, s.g, 0, s.m, s.v, n, s.c, 2));
		bad = o, bad.weight_decay = x;
		EXPECT_EINVAL(zinf_adam_step(&bad, 1, 1, s.p, s.g, 0, s.m, s.v, n, s.c, 2));
	}
	bad = o, bad.beta1 = 1.0f;
	EXPECT_EINVAL(zinf_adam_step(&bad, 1, 1, s.p, s.g, 0, s.m, s.v, n, s.c, 2));
	bad = o, bad.size = sizeof(o) - 1;
	EXPECT_EINVAL(zinf_adam_step(&bad, 1, 1, s.p, s.g, 0, s.m, s.v, n, s.c, 2));
	bad = o, bad.threads = -1;
	EXPECT_EINVAL(zinf_adam_step(&bad, 1, 1, s.p, s.g, 0, s.m, s.v, n, s.c, 2));
	EXPECT_EINVAL(zinf_adam_step_bf16state(&o, 1, 1, s.p, s.g, 0, s.mb, s.vb, n, s.c, 2,
					       (enum zinf_rounding)2, 0));
	EXPECT_EINVAL(zinf_adam_step_bf16state(&o, 1, 1, s.p, s.g, 0, NULL, s.vb, n, s.c, 2, 0, 0));
	EXPECT_EINVAL(zinf_adam_step_bf16state(&o, 0, 1, s.p, s.g, 0, s.mb, s.vb, n, s.c, 2, 0, 0));

	struct zinf_adagrad_opts ao, abad;
	zinf_adagrad_opts_init(&ao);
	ao.simd = o.simd;
	EXPECT_EINVAL(zinf_adagrad_step(NULL, 1, 1, s.p, s.g, 0, s.v, n, s.c, 2));
	EXPECT_EINVAL(zinf_adagrad_step(&ao, 0, 1, s.p, s.g, 0, s.v, n, s.c, 2));
	EXPECT_EINVAL(zinf_adagrad_step(&ao, 1, 1, s.p, s.g, 0, NULL, n, s.c, 2));
	abad = ao, abad.lr_decay = -1;
	EXPECT_EINVAL(zinf_adagrad_step(&abad, 1, 1, s.p, s.g, 0, s.v, n, s.c, 2));
	abad = ao, abad.eps = NAN;
	EXPECT_EINVAL(zinf_adagrad_step(&abad, 1, 1, s.p, s.g, 0, s.v, n, s.c, 2));

	struct zinf_lion_opts lo, lbad;
	zinf_lion_opts_init(&lo);
	lo.simd = o.simd;
	EXPECT_EINVAL(zinf_lion_step(&lo, 1, 1, s.p, s.g, 5, s.m, n, s.c, 2));
	EXPECT_EINVAL(zinf_lion_step(&lo, 1, 1, s.p, s.g, 0, NULL, n, s.c, 2));
	lbad = lo, lbad.beta2 = 1.5f;
	EXPECT_EINVAL(zinf_lion_step(&lbad, 1, 1, s.p, s.g, 0, s.m, n, s.c, 2));
	lbad = lo, lbad.lr = INFINITY;
	EXPECT_EINVAL(zinf_lion_step(&lbad, 1, 1, s.p, s.g, 0, s.m, n, s.c, 2));

	double out = 7;
	struct zinf_grad_opts go = grad_opts(0), gbad = grad_opts(-2);
	EXPECT_EINVAL(zinf_grad_sumsq(NULL, ZINF_F32, n, &go, &out));
	EXPECT_EINVAL(zinf_grad_sumsq(s.g, (enum zinf_dtype)3, n, &go, &out));
	EXPECT_EINVAL(zinf_grad_sumsq(s.g, ZINF_F32, n, &go, NULL));
	EXPECT_EINVAL(zinf_grad_has_inf_nan(NULL, ZINF_F16, n, &go));
	EXPECT_EINVAL(zinf_grad_has_inf_nan(s.g, ZINF_F16, n, &gbad));
	gbad = go, gbad.reserved = 1;
	EXPECT_EINVAL(zinf_grad_has_inf_nan(s.g, ZINF_F16, n, &gbad));
	cr_assert_str_eq(zinf_last_error(), "zinf_grad_has_inf_nan: opts.reserved 1: must be 0");
	cr_assert_eq(out, 7);
#undef EXPECT_EINVAL

	/* n == 0 with NULL arrays is a no-op, not an error. */
	cr_assert_eq(zinf_adam_step(&o, 1, 1, NULL, NULL, 0, NULL, NULL, 0, NULL, 0), 0);
	cr_assert_eq(zinf_grad_sumsq(NULL, ZINF_BF16, 0, NULL, &out), 0);
	cr_assert_eq(out, 0);
	state_free(&s);
	state_free(&keep);
}

/* ---- the SIMD path option ------------------------------------------------------------------- */

/* Every entry point with options `simd` (the optimizers, the bf16-state step, the gradient
 * helpers, the three-pass passes, zinf_simd_resolve) must return `want` and modify nothing.
 * zinf_simd_resolve runs last: its message is then in zinf_last_error(). */
static void
expect_simd_refused(const char *simd, int want, const char *what)
{
	size_t n = 37;
	struct state s, keep;
	state_init(&s, n, 9);
	state_init(&keep, n, 9);
	struct zinf_adam_opts o;
	zinf_adam_opts_init(&o);
	o.simd = simd;
	struct zinf_adagrad_opts ao;
	zinf_adagrad_opts_init(&ao);
	ao.simd = simd;
	struct zinf_lion_opts lo;
	zinf_lion_opts_init(&lo);
	lo.simd = simd;
	struct zinf_grad_opts go;
	zinf_grad_opts_init(&go);
	go.simd = simd;
	double out = 7;
	const char *path = "untouched";
	struct {
		const char *fn;
		int r;
	} calls[] = {
		{"zinf_adam_step",
		 zinf_adam_step(&o, 1, 1, s.p, s.g, ZINF_F32, s.m, s.v, n, s.c, ZINF_BF16)},
		{"zinf_adam_step_bf16state",
		 zinf_adam_step_bf16state(&o, 1, 1, s.p, s.g, ZINF_F32, s.mb, s.vb, n, s.c,
					  ZINF_BF16, ZINF_ROUND_STOCHASTIC, 1)},
		{"zinf_adagrad_step",
		 zinf_adagrad_step(&ao, 1, 1, s.p, s.g, ZINF_F32, s.v, n, s.c, ZINF_F16)},
		{"zinf_lion_step", zinf_lion_step(&lo, 1, 1, s.p, s.g, ZINF_F32, s.m, n, NULL, 0)},
		{"zinf_grad_sumsq", zinf_grad_sumsq(s.g, ZINF_F32, n, &go, &out)},
		{"zinf_grad_has_inf_nan", zinf_grad_has_inf_nan(s.g, ZINF_BF16, n, &go)},
		{"adam_unscale", adam_unscale(s.g, ZINF_F32, n, 2.0f, &go)},
		{"adam_convert", adam_convert(s.p, s.c, ZINF_BF16, n, &go)},
	};
	for (size_t k = 0; k < ZINF_ARRAY_SIZE(calls); k++) {
		cr_assert_eq(calls[k].r, want, "%s with simd \"%s\" (%s) returned %d", calls[k].fn,
			     simd, what, calls[k].r);
	}
	cr_assert_eq(zinf_simd_resolve(simd, &path), want, "resolve \"%s\" (%s)", simd, what);
	state_eq(&s, &keep, n, 0);
	cr_assert_eq(out, 7);
	cr_assert_str_eq(path, "untouched");
	state_free(&s);
	state_free(&keep);
}

Test(cpu_adam, unknown_simd_name_is_einval_naming_the_paths)
{
	path_independent();
	static const char *const bad[] = {"sse9", "", "AVX2", "avx2 ", "avx"};
	for (size_t k = 0; k < ZINF_ARRAY_SIZE(bad); k++) {
		expect_simd_refused(bad[k], -EINVAL, "unknown");
		char want[160];
		snprintf(want, sizeof(want),
			 "zinf_simd_resolve: SIMD path \"%s\" (opts.simd) is unknown: expected "
			 "avx512, avx2 or scalar",
			 bad[k]);
		cr_assert_str_eq(zinf_last_error(), want);
	}
	float p = 1, g = 1, m = 0, v = 0;
	struct zinf_adam_opts o;
	zinf_adam_opts_init(&o);
	o.simd = "sse9";
	cr_assert_eq(zinf_adam_step(&o, 1, 1, &p, &g, ZINF_F32, &m, &v, 1, NULL, 0), -EINVAL);
	cr_assert_str_eq(zinf_last_error(), "zinf_adam_step: SIMD path \"sse9\" (opts.simd) is "
					    "unknown: expected avx512, avx2 or scalar");
}

Test(cpu_adam, unavailable_simd_path_is_enodev_naming_it)
{
	path_independent();
	if (zinf_simd_resolve("avx512", NULL) == 0) {
		cr_skip_test("this CPU and build run every path; nothing to refuse");
	}
	expect_simd_refused("avx512", -ENODEV, "unavailable");
	const char *msg = zinf_last_error();
	const char *head = "zinf_simd_resolve: SIMD path avx512 (opts.simd): ";
	cr_assert(strncmp(msg, head, strlen(head)) == 0, "%s", msg);
	struct zinf_cpu_features f;
	zinf_cpu_features_get(&f);
	if (!f.avx512f) {
		cr_assert_str_eq(msg + strlen(head), "this CPU (or its OS) lacks AVX512F");
	} else {
		cr_assert(strstr(msg, "lacks") || strstr(msg, "not built into this library"), "%s",
			  msg);
	}
}

Test(cpu_adam, simd_queries_list_and_choose_paths)
{
	path_independent();
	cr_assert_str_eq(zinf_simd_path(0), "avx512");
	cr_assert_str_eq(zinf_simd_path(1), "avx2");
	cr_assert_str_eq(zinf_simd_path(2), "scalar");
	cr_assert_null(zinf_simd_path(3));
	cr_assert_null(zinf_simd_path(~0u));
	/* the best path: the first that resolves, and what the CPU's features allow */
	const char *first = NULL, *got;
	for (unsigned i = 0; zinf_simd_path(i); i++) {
		if (zinf_simd_resolve(zinf_simd_path(i), &got) == 0) {
			cr_assert_str_eq(got, zinf_simd_path(i));
			first = first ? first : got;
		}
	}
	cr_assert_str_eq(zinf_simd_best(), first);
	struct zinf_cpu_features f;
	zinf_cpu_features_get(&f);
	bool avx2 = f.avx2 && f.fma && f.f16c;
	bool avx512 = f.avx512f && f.avx512bw && f.avx512vl && f.fma && f.f16c;
	if (!avx512) {
		cr_assert_str_eq(zinf_simd_best(), avx2 ? "avx2" : "scalar");
	}
	cr_assert_eq(zinf_simd_resolve("scalar", NULL), 0);
	/* NULL: the default, which is the best path unless ZINF_SIMD says otherwise */
	const char *env = getenv("ZINF_SIMD");
	cr_assert_eq(zinf_simd_resolve(NULL, &got), 0);
	cr_assert_str_eq(got, env && *env ? env : zinf_simd_best());
}

/* ---- options structs: the size rule (common/opts.h) ----------------------------------------- */

/* A caller built before the simd field (its sizeof was offsetof(simd)) gets the default path:
 * the bytes after its size are never read, whatever they hold. Results equal a current caller's
 * with the same values, bit for bit. */
Test(cpu_adam, older_smaller_options_get_the_defaults)
{
	path_independent();
	size_t n = 45;
	struct state a, b;
	state_init(&a, n, 21);
	state_init(&b, n, 21);
	struct zinf_adam_opts o, old;
	zinf_adam_opts_init(&o);
	o.lr = 1e-2f;
	o.weight_decay = 0.1f;
	old = o;
	old.size = offsetof(struct zinf_adam_opts, simd);
	old.simd = "sse9"; /* beyond the old caller's struct: must not be read */
	cr_assert_eq(offsetof(struct zinf_adam_opts, simd), 40, "the layout before simd");
	cr_assert_eq(zinf_adam_step(&o, 2, 1, a.p, a.g, ZINF_F32, a.m, a.v, n, a.c, ZINF_BF16), 0);
	cr_assert_eq(zinf_adam_step(&old, 2, 1, b.p, b.g, ZINF_F32, b.m, b.v, n, b.c, ZINF_BF16), 0,
		     "%s", zinf_last_error());
	cr_assert_eq(zinf_adam_step_bf16state(&old, 2, 1, b.p, b.g, ZINF_F32, b.mb, b.vb, n, b.c,
					      ZINF_BF16, ZINF_ROUND_NEAREST_EVEN, 0),
		     0);
	cr_assert_eq(zinf_adam_step_bf16state(&o, 2, 1, a.p, a.g, ZINF_F32, a.mb, a.vb, n, a.c,
					      ZINF_BF16, ZINF_ROUND_NEAREST_EVEN, 0),
		     0);
	/* even older: no threads field either (a bad value there is not read) */
	old.size = offsetof(struct zinf_adam_opts, threads);
	old.threads = -1;
	cr_assert_eq(zinf_adam_step(&old, 3, 1, b.p, b.g, ZINF_F32, b.m, b.v, n, b.c, ZINF_BF16), 0,
		     "%s", zinf_last_error());
	cr_assert_eq(zinf_adam_step(&o, 3, 1, a.p, a.g, ZINF_F32, a.m, a.v, n, a.c, ZINF_BF16), 0);

	struct zinf_adagrad_opts ao, aold;
	zinf_adagrad_opts_init(&ao);
	ao.lr_decay = 0.5f;
	aold = ao;
	aold.size = offsetof(struct zinf_adagrad_opts, simd);
	aold.simd = "sse9";
	cr_assert_eq(aold.size, 32, "the layout before simd");
	cr_assert_eq(zinf_adagrad_step(&ao, 2, 1, a.p, a.g, ZINF_F32, a.v, n, a.c, ZINF_F16), 0);
	cr_assert_eq(zinf_adagrad_step(&aold, 2, 1, b.p, b.g, ZINF_F32, b.v, n, b.c, ZINF_F16), 0,
		     "%s", zinf_last_error());

	struct zinf_lion_opts lo, lold;
	zinf_lion_opts_init(&lo);
	lo.weight_decay = 0.2f;
	lold = lo;
	lold.size = offsetof(struct zinf_lion_opts, simd);
	lold.simd = "sse9";
	cr_assert_eq(zinf_lion_step(&lo, 2, 1, a.p, a.g, ZINF_F32, a.m, n, a.c, ZINF_F16), 0);
	cr_assert_eq(zinf_lion_step(&lold, 2, 1, b.p, b.g, ZINF_F32, b.m, n, b.c, ZINF_F16), 0,
		     "%s", zinf_last_error());
	state_eq(&a, &b, n, 0);

	/* the gradient helpers: a struct of only its size field, and NULL, mean the defaults */
	struct zinf_grad_opts go;
	zinf_grad_opts_init(&go);
	go.size = offsetof(struct zinf_grad_opts, simd);
	go.simd = "sse9";
	go.threads = -1;
	double s1 = -1, s2 = -2;
	cr_assert_eq(zinf_grad_sumsq(a.p, ZINF_F32, n, &go, &s1), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_grad_sumsq(a.p, ZINF_F32, n, NULL, &s2), 0);
	cr_assert(s1 == s2 && s1 > 0, "%g vs %g", s1, s2);
	state_free(&a);
	state_free(&b);
}

/* Sizes the rule refuses, each with a message naming the struct and the sizes. */
Test(cpu_adam, bad_options_sizes_are_einval)
{
	path_independent();
	float p = 1, g = 1, m = 0, v = 0;
	struct zinf_adam_opts o;
	zinf_adam_opts_init(&o);
	char want[200];
	/* larger: a caller built against a newer zinf */
	o.size = sizeof(o) + 8;
	cr_assert_eq(zinf_adam_step(&o, 1, 1, &p, &g, ZINF_F32, &m, &v, 1, NULL, 0), -EINVAL);
	snprintf(want, sizeof(want),
		 "struct zinf_adam_opts: size %zu is larger than this library's (%zu bytes): the "
		 "caller was built against a newer zinf",
		 sizeof(o) + 8, sizeof(o));
	cr_assert_str_eq(zinf_last_error(), want);
	/* too small to hold the size field */
	o.size = 4;
	cr_assert_eq(zinf_adam_step(&o, 1, 1, &p, &g, ZINF_F32, &m, &v, 1, NULL, 0), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "zinf_adam_opts: size 4 is too small"), "%s",
		  zinf_last_error());
	/* ending inside the simd pointer: half a pointer would be taken */
	size_t off = offsetof(struct zinf_adam_opts, simd);
	for (size_t cut = off + 1; cut < off + sizeof(char *); cut += 3) {
		o.size = cut;
		cr_assert_eq(zinf_adam_step(&o, 1, 1, &p, &g, ZINF_F32, &m, &v, 1, NULL, 0),
			     -EINVAL);
		snprintf(want, sizeof(want),
			 "zinf_adam_step: struct zinf_adam_opts: size %zu ends inside the field "
			 "simd (bytes %zu..%zu)",
			 cut, off, off + sizeof(char *));
		cr_assert_str_eq(zinf_last_error(), want);
	}
	struct zinf_lion_opts lo;
	zinf_lion_opts_init(&lo);
	lo.size = offsetof(struct zinf_lion_opts, simd) + 2;
	cr_assert_eq(zinf_lion_step(&lo, 1, 1, &p, &g, ZINF_F32, &m, 1, NULL, 0), -EINVAL);
	struct zinf_grad_opts go;
	zinf_grad_opts_init(&go);
	go.size = sizeof(go) + 1;
	cr_assert_eq(zinf_grad_has_inf_nan(&g, ZINF_F32, 1, &go), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "struct zinf_grad_opts: size 25 is larger"), "%s",
		  zinf_last_error());
	cr_assert_eq(p, 1);
	cr_assert_eq(m, 0);
}

/* ---- gradient helpers ----------------------------------------------------------------------- */

static void
fill_grad(void *g, int dt, size_t n, uint64_t *rng)
{
	for (size_t i = 0; i < n; i++) {
		float x = (float)(zt_uniform(rng, -1, 1) * ldexp(1, (int)(zt_rand(rng) % 16) - 8));
		if (dt == ZINF_F32) {
			((float *)g)[i] = x;
		} else if (dt == ZINF_F16) {
			((uint16_t *)g)[i] = dt_f32_to_f16_rne(x);
		} else {
			((uint16_t *)g)[i] = dt_f32_to_bf16_rne(x);
		}
	}
}

Test(cpu_adam, grad_sumsq_matches_float64)
{
	zt_simd_variant(); /* skips where the path cannot run */
	uint64_t rng = zt_seed() + 14;
	static const size_t sizes[] = {1, 15, 17, 1000, 1000003};
	for (int dt = 0; dt < 3; dt++) {
		for (size_t si = 0; si < ZINF_ARRAY_SIZE(sizes); si++) {
			size_t n = sizes[si];
			char *buf = malloc(n * 4 + 4);
			void *g = buf + (si & 1 ? zinf_dtype_size(dt) : 0); /* unaligned too */
			fill_grad(g, dt, n, &rng);
			long double ref = 0;
			for (size_t i = 0; i < n; i++) {
				long double x = adam_load_grad(g, dt, i);
				ref += x * x;
			}
			for (int threads = 1; threads <= 2; threads++) {
				double s = -1;
				struct zinf_grad_opts go = grad_opts(threads);
				cr_assert_eq(zinf_grad_sumsq(g, dt, n, &go, &s), 0);
				/* n additions of positive terms in float64: relative error <= n u64
				 */
				double tol = (double)ref * 1e-16 * (double)(n / 64 + 4);
				cr_assert(fabs(s - (double)ref) <= tol,
					  "sumsq dtype %d n %zu threads %d: %.17g, want %.17Lg", dt,
					  n, threads, s, ref);
			}
			free(buf);
		}
	}
}

Test(cpu_adam, grad_has_inf_nan_finds_every_position)
{
	zt_simd_variant(); /* skips where the path cannot run */
	uint64_t rng = zt_seed() + 15;
	static const size_t sizes[] = {1, 15, 17, 3 * 8 * ZINF_ADAM_TILE + 5};
	for (int dt = 0; dt < 3; dt++) {
		size_t es = zinf_dtype_size(dt);
		for (size_t si = 0; si < ZINF_ARRAY_SIZE(sizes); si++) {
			size_t n = sizes[si];
			char *buf = malloc(n * es + es);
			void *g = buf + es; /* unaligned */
			fill_grad(g, dt, n, &rng);
			/* the largest finite values are not infinities */
			if (dt == ZINF_F32) {
				((float *)g)[n - 1] = -FLT_MAX;
			} else {
				((uint16_t *)g)[n - 1] = dt == ZINF_F16 ? 0xfbff : 0xff7f;
			}
			struct zinf_grad_opts go2 = grad_opts(2);
			cr_assert_eq(zinf_grad_has_inf_nan(g, dt, n, &go2), 0,
				     "dtype %d n %zu clean", dt, n);
			size_t pos[] = {0, n / 2, n - 1};
			for (size_t k = 0; k < 3; k++) {
				for (int kind = 0; kind < 3; kind++) { /* +inf, -inf, NaN */
					char save[4];
					char *at = (char *)g + pos[k] * es;
					memcpy(save, at, es);
					if (dt == ZINF_F32) {
						float x = kind == 0   ? INFINITY
							  : kind == 1 ? -INFINITY
								      : NAN;
						memcpy(at, &x, 4);
					} else {
						uint16_t x = dt == ZINF_F16
								     ? (kind == 0   ? 0x7c00
									: kind == 1 ? 0xfc00
										    : 0x7e01)
								     : (kind == 0   ? 0x7f80
									: kind == 1 ? 0xff80
										    : 0x7f81);
						memcpy(at, &x, 2);
					}
					for (int threads = 1; threads <= 3; threads += 2) {
						struct zinf_grad_opts gt = grad_opts(threads);
						cr_assert_eq(
							zinf_grad_has_inf_nan(g, dt, n, &gt), 1,
							"dtype %d n %zu pos %zu kind %d threads %d",
							dt, n, pos[k], kind, threads);
					}
					memcpy(at, save, es);
				}
			}
			cr_assert_eq(zinf_grad_has_inf_nan(g, dt, n, &go2), 0);
			free(buf);
		}
	}
}

/* ---- bf16 optimizer state ------------------------------------------------------------------- */

/* One bf16-state step equals the float32-state step started from the widened bf16 moments,
 * bit for bit for the parameter and copy, and the stored moments are the RNE (or one of the two
 * neighbours, unbiased, for stochastic rounding) of the float32 moments. */
Test(cpu_adam, bf16_state_step_is_the_fp32_step_rounded)
{
	zt_simd_variant(); /* skips where the path cannot run */
	uint64_t seed = zt_seed() + 16;
	size_t n = 2 * ZINF_ADAM_TILE + 7;
	for (int rounding = 0; rounding < 2; rounding++) {
		for (int gdt = 0; gdt < 3; gdt++) {
			struct state a, b;
			state_init(&a, n, seed);
			state_init(&b, n, seed);
			if (gdt != ZINF_F32) {
				for (size_t i = 0; i < n; i++) {
					((uint16_t *)a.g)[i] = ((uint16_t *)b.g)[i] =
						dt_f32_to_bf16_rne(a.g[i]); /* bf16 or f16 bits */
				}
			}
			for (size_t i = 0; i < n; i++) {
				a.m[i] = dt_bf16_to_f32(b.mb[i]);
				a.v[i] = dt_bf16_to_f32(b.vb[i]);
			}
			struct zinf_adam_opts o;
			zinf_adam_opts_init(&o);
			o.weight_decay = 0.1f;
			o.threads = 2;
			cr_assert_eq(zinf_adam_step(&o, 3, 0.25f, a.p, a.g, gdt, a.m, a.v, n, a.c,
						    ZINF_BF16),
				     0);
			cr_assert_eq(zinf_adam_step_bf16state(&o, 3, 0.25f, b.p, b.g, gdt, b.mb,
							      b.vb, n, b.c, ZINF_BF16, rounding,
							      99),
				     0);
			cr_assert(memcmp(a.p, b.p, n * 4) == 0,
				  "param differs from the fp32-state step");
			cr_assert(memcmp(a.c, b.c, n * 2) == 0,
				  "copy differs from the fp32-state step");
			size_t up = 0, inexact = 0;
			for (size_t i = 0; i < n; i++) {
				float mv[2] = {a.m[i], a.v[i]};
				uint16_t got[2] = {b.mb[i], b.vb[i]};
				for (int k = 0; k < 2; k++) {
					uint16_t lo = (uint16_t)(dt_f2u(mv[k]) >> 16);
					bool exact = (dt_f2u(mv[k]) & 0xffff) == 0;
					if (rounding == ZINF_ROUND_NEAREST_EVEN) {
						cr_assert_eq(got[k], dt_f32_to_bf16_rne(mv[k]),
							     "element %zu moment %d", i, k);
					} else {
						cr_assert(got[k] == lo ||
								  (!exact && got[k] == lo + 1),
							  "element %zu moment %d: %04x not a "
							  "neighbour of %a",
							  i, k, got[k], mv[k]);
						inexact += !exact;
						up += got[k] == lo + 1;
					}
				}
			}
			if (rounding == ZINF_ROUND_STOCHASTIC) {
				/* The fraction rounded up is near the mean dropped fraction (~1/2).
				 */
				double frac = (double)up / (double)inexact;
				cr_assert(frac > 0.45 && frac < 0.55, "stochastic rounding up %.3f",
					  frac);
			}
			state_free(&a);
			state_free(&b);
		}
	}
}

/* Stochastic rounding is unbiased: the same value x rounded in many elements averages to x. */
Test(cpu_adam, bf16_stochastic_rounding_is_unbiased)
{
	zt_simd_variant(); /* skips where the path cannot run */
	size_t n = 1 << 16;
	float *p = calloc(n, 4), *g = calloc(n, 4);
	uint16_t *m = calloc(n, 2), *v = calloc(n, 2);
	struct zinf_adam_opts o;
	zinf_adam_opts_init(&o);
	o.beta1 = 0.0f; /* m = g exactly */
	o.threads = 2;
	const float x = 1.0f + 0x1p-9f + 0x1p-11f; /* 1 + 0.3125 of a bf16 ulp (2^-7) */
	for (size_t i = 0; i < n; i++) {
		g[i] = x;
	}
	cr_assert_eq(zinf_adam_step_bf16state(&o, 1, 1, p, g, ZINF_F32, m, v, n, NULL, 0,
					      ZINF_ROUND_STOCHASTIC, 7),
		     0);
	double mean = 0;
	for (size_t i = 0; i < n; i++) {
		mean += dt_bf16_to_f32(m[i]);
	}
	mean /= (double)n;
	/* sd of the mean: ulp * sqrt(p(1-p)/n) ~ 2^-7 * 0.48 / 256 */
	cr_assert(fabs(mean - x) < 6 * 0x1p-7 * 0.5 / 256, "mean %.9g want %.9g", mean, x);
	free(p);
	free(g);
	free(m);
	free(v);
}

/* A NaN or inf gradient poisons only its own element, in every vector lane position; NaN moments
 * stay NaN in bf16 (not infinity), and the copy of a NaN parameter is a NaN. */
Test(cpu_adam, nonfinite_gradient_stays_in_its_element)
{
	zt_simd_variant(); /* skips where the path cannot run */
	size_t n = 40;
	for (int rounding = 0; rounding < 2; rounding++) {
		for (size_t bad = 0; bad < 16; bad += 5) {
			struct state a, b;
			state_init(&a, n, 77);
			state_init(&b, n, 77);
			a.g[bad] = NAN;
			a.g[bad + 17] = INFINITY;
			struct zinf_adam_opts o;
			zinf_adam_opts_init(&o);
			o.threads = 1;
			cr_assert_eq(zinf_adam_step_bf16state(&o, 2, 1, a.p, a.g, ZINF_F32, a.mb,
							      a.vb, n, a.c, ZINF_BF16, rounding, 3),
				     0);
			cr_assert_eq(zinf_adam_step_bf16state(&o, 2, 1, b.p, b.g, ZINF_F32, b.mb,
							      b.vb, n, b.c, ZINF_BF16, rounding, 3),
				     0);
			for (size_t i = 0; i < n; i++) {
				if (i == bad || i == bad + 17) {
					cr_assert(isnan(a.p[i]), "p[%zu] = %g", i, a.p[i]);
					cr_assert(isnan(dt_bf16_to_f32(a.c[i])), "copy[%zu] %04x",
						  i, a.c[i]);
					cr_assert(isnan(dt_bf16_to_f32(a.mb[i])) || i == bad + 17,
						  "m[%zu] %04x", i, a.mb[i]);
					cr_assert(isnan(dt_bf16_to_f32(a.vb[i])) || i == bad + 17,
						  "v[%zu] %04x", i, a.vb[i]);
					continue;
				}
				cr_assert(a.p[i] == b.p[i] && a.mb[i] == b.mb[i] &&
						  a.vb[i] == b.vb[i] && a.c[i] == b.c[i],
					  "element %zu changed by a non-finite neighbour", i);
			}
			state_free(&a);
			state_free(&b);
		}
	}
}
