/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/cpu_adam/test_adam_q8.c: Adam with 8-bit blockwise state (zinf_adam_step_q8state, the
 * codec zinf_q8_encode/decode), on the SIMD path named by ZINF_TEST_VARIANT (a path this CPU
 * lacks is a visible skip): the codec's error bounds against float64 (wide dynamic range, zero
 * blocks, one huge element, non-finite values), the step against float64 and bit for bit
 * against the float32 kernel on the decoded state, weight decay per element inside a block,
 * non-finite gradients, independence from the cuts at block multiples and from the threads.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/test_util.h"
#include "cpu_adam/adam_bench.h"
#include "zinf/blocks/adam.h"

#define B ZINF_Q8_BLOCK
/* zinf_q8_bytes(n) as a constant expression, for arrays */
#define QB(n) ((n) + 4 * (((n) + B - 1) / B))

static uint64_t rng_state;

static double
urand(void)
{
	rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
	return (double)(rng_state >> 11) * 0x1p-53;
}

static void
seed_rng(uint64_t s)
{
	rng_state = s;
	printf("seed %llu\n", (unsigned long long)s);
}

/* A random m (signed) or v (> 0) spanning `decades` decades below 1. */
static float
wide(bool v, double decades)
{
	double x = pow(10.0, -decades * urand());
	return (float)(v ? x : (urand() < 0.5 ? -x : x));
}

/* The stated worst case (zinf/blocks/adam.h) of one element, for block scale s, factor k (1:
 * round to nearest, 2: stochastic), checked in float64 with a float rounding allowance: below
 * the smallest code (s / 240) m is that code or 0 at random, so the error is less than it. */
static void
check_m(double got, double x, double s, int k, size_t i)
{
	double bound = fmax(k * 0x1p-5 * fabs(x), 0x1p-7 * s / 1.875) * (1 + 0x1p-18);
	cr_assert(fabs(got - x) <= bound, "m[%zu] = %.9g decodes as %.9g: error %.3g > %.3g", i, x,
		  got, fabs(got - x), bound);
}

static void
check_v(double got, double x, double s, int k, size_t i)
{
	double w = sqrt(x), gw = sqrt(got), small = 0x1p-15 * s / 1.8125;
	if (x > 0) {
		cr_assert(got > 0, "v[%zu] = %.9g > 0 decodes as 0", i, x);
	}
	if (w >= small) {
		double bound = k * 0x1p-5 * w * (1 + 0x1p-18);
		cr_assert(fabs(gw - w) <= bound, "sqrt v[%zu] = %.9g decodes as %.9g: > %.3g", i, w,
			  gw, bound);
	} else {
		cr_assert(fabs(gw - small) <= small * 0x1p-18,
			  "sqrt v[%zu] = %.9g below the smallest code: decodes as %.9g, not %.9g",
			  i, w, gw, small);
	}
}

static float
block_scale(const uint8_t *part, size_t j)
{
	float s;
	memcpy(&s, part + zinf_q8_bytes(j * B), 4);
	return s;
}

/* Encode x of moment which, decode, and check every element against the bound. */
static void
codec_check(const float *x, size_t n, enum zinf_q8_moment which, enum zinf_rounding rnd)
{
	uint8_t *part = malloc(zinf_q8_bytes(n));
	float *y = malloc(n * sizeof(float));
	struct zinf_q8_opts q;
	zinf_q8_opts_init(&q);
	q.rounding = rnd;
	q.seed = 7;
	cr_assert_eq(zinf_q8_encode(x, n, which, part, &q), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_q8_decode(part, n, which, y), 0);
	int k = rnd == ZINF_ROUND_STOCHASTIC ? 2 : 1;
	for (size_t i = 0; i < n; i++) {
		double s = block_scale(part, i / B);
		/* the scale is the block's largest finite |m| or sqrt(v) */
		double want = 0;
		for (size_t j = i / B * B; j < n && j < (i / B + 1) * B; j++) {
			double a = which == ZINF_Q8_EXP_AVG ? fabs(x[j]) : sqrt(x[j]);
			want = isfinite(a) && a > want ? a : want;
		}
		cr_assert_eq(s, (float)want, "block %zu: scale %.9g, want %.9g", i / B, s, want);
		if (!isfinite(x[i])) {
			cr_assert(isnan(y[i]), "element %zu: %g decodes as %g, not NaN", i, x[i],
				  y[i]);
		} else if (which == ZINF_Q8_EXP_AVG) {
			check_m(y[i], x[i], s, k, i);
		} else {
			check_v(y[i], x[i], s, k, i);
		}
	}
	free(part);
	free(y);
}

Test(cpu_adam_q8, codec_error_is_within_the_stated_bound)
{
	seed_rng(0x5eed0001);
	size_t n = 7 * B + 77;
	float *x = malloc(n * sizeof(float));
	for (int rnd = 0; rnd < 2; rnd++) {
		for (int which = 0; which < 2; which++) {
			for (size_t i = 0; i < n; i++) {
				x[i] = wide(which == ZINF_Q8_EXP_AVG_SQ, 12);
			}
			codec_check(x, n, which, rnd);
		}
	}
	free(x);
}

Test(cpu_adam_q8, zero_block_is_all_zero_bytes_and_zero_state_decodes_as_zero)
{
	float x[B + 3] = {0};
	uint8_t part[QB(B + 3)], zero[sizeof(part)];
	memset(part, 0x5a, sizeof(part));
	memset(zero, 0, sizeof(zero));
	for (int which = 0; which < 2; which++) {
		cr_assert_eq(zinf_q8_encode(x, B + 3, which, part, NULL), 0);
		cr_assert(!memcmp(part, zero, sizeof(part)), "zeros are not stored as zero bytes");
		float y[B + 3];
		memset(y, 0x5a, sizeof(y));
		cr_assert_eq(zinf_q8_decode(zero, B + 3, which, y), 0);
		for (size_t i = 0; i < B + 3; i++) {
			cr_assert(y[i] == 0.0f && !signbit(y[i]), "element %zu: %g", i, y[i]);
		}
	}
}

Test(cpu_adam_q8, one_huge_element_and_non_finite_values_keep_the_others_within_bound)
{
	seed_rng(0x5eed0002);
	float x[2 * B];
	for (int which = 0; which < 2; which++) {
		bool sq = which == ZINF_Q8_EXP_AVG_SQ;
		for (size_t i = 0; i < 2 * B; i++) {
			x[i] = wide(sq, 3);
		}
		x[17] = sq ? 1e30f : -1e15f; /* one huge element: the others fall under it */
		x[B + 3] = NAN;		     /* not in the scale; its block otherwise as usual */
		x[B + 4] = sq ? INFINITY : -INFINITY;
		codec_check(x, 2 * B, which, ZINF_ROUND_NEAREST_EVEN);
	}
}

/* ---- the step ------------------------------------------------------------------------------ */

struct fix {
	size_t n;
	float *p, *p0, *g;
	float *m0, *v0; /* the state before the step, as decoded */
	uint8_t *mq, *vq;
	uint16_t *copy;
};

static void
fix_make(struct fix *f, size_t n, double decades)
{
	f->n = n;
	f->p = malloc(n * 4);
	f->p0 = malloc(n * 4);
	f->g = malloc(n * 4);
	f->m0 = malloc(n * 4);
	f->v0 = malloc(n * 4);
	f->mq = malloc(zinf_q8_bytes(n));
	f->vq = malloc(zinf_q8_bytes(n));
	f->copy = malloc(n * 2);
	float *m = malloc(n * 4), *v = malloc(n * 4);
	for (size_t i = 0; i < n; i++) {
		f->p0[i] = f->p[i] = (float)(urand() * 2 - 1);
		f->g[i] = wide(false, decades);
		m[i] = wide(false, decades);
		v[i] = wide(true, 2 * decades);
	}
	cr_assert_eq(zinf_q8_encode(m, n, ZINF_Q8_EXP_AVG, f->mq, NULL), 0);
	cr_assert_eq(zinf_q8_encode(v, n, ZINF_Q8_EXP_AVG_SQ, f->vq, NULL), 0);
	zinf_q8_decode(f->mq, n, ZINF_Q8_EXP_AVG, f->m0);
	zinf_q8_decode(f->vq, n, ZINF_Q8_EXP_AVG_SQ, f->v0);
	free(m);
	free(v);
}

static void
fix_free(struct fix *f)
{
	free(f->p), free(f->p0), free(f->g), free(f->m0), free(f->v0);
	free(f->mq), free(f->vq), free(f->copy);
}

static struct zinf_adam_opts
adam_opts(bool adamw, float wd)
{
	struct zinf_adam_opts o;
	zinf_adam_opts_init(&o);
	o.lr = 1e-2f;
	o.weight_decay = wd;
	o.adamw_mode = adamw;
	o.simd = zt_simd_variant();
	return o;
}

/* Whether element idx lies in one of the n ranges nd. */
static bool
in_ranges(const uint64_t *nd, uint32_t n, uint64_t idx)
{
	for (uint32_t k = 0; k < n; k++) {
		if (idx >= nd[2 * k] && idx < nd[2 * k + 1]) {
			return true;
		}
	}
	return false;
}

/*
 * The step against float64: from the decoded old state, each element's new p within float32
 * rounding of the float64 step (2^-20 of |p| + |update|: a wrong formula is off by a good part
 * of lr), and its new m and v within the codec's bound of float64's.
 */
Test(cpu_adam_q8, step_matches_float64_within_the_codec_bound)
{
	seed_rng(0x5eed0003);
	for (int mode = 0; mode < 2; mode++) {
		struct fix f;
		fix_make(&f, 5 * B + 31, 6);
		struct zinf_adam_opts o = adam_opts(mode == 0, 0.1f);
		const uint64_t nd[] = {100, 300, 700, 705};
		struct zinf_q8_opts q;
		zinf_q8_opts_init(&q);
		q.index0 = 50;
		q.no_decay = nd;
		q.n_no_decay = 2;
		int64_t step = 3;
		cr_assert_eq(zinf_adam_step_q8state(&o, step, 0.5f, f.p, f.g, ZINF_F32, f.mq, f.vq,
						    f.n, f.copy, ZINF_BF16, &q),
			     0, "%s", zinf_last_error());
		float *m1 = malloc(f.n * 4), *v1 = malloc(f.n * 4);
		zinf_q8_decode(f.mq, f.n, ZINF_Q8_EXP_AVG, m1);
		zinf_q8_decode(f.vq, f.n, ZINF_Q8_EXP_AVG_SQ, v1);
		double b1 = o.beta1, b2 = o.beta2, lr = o.lr;
		double bc1 = 1 - pow(b1, step), bc2 = 1 - pow(b2, step);
		for (size_t i = 0; i < f.n; i++) {
			double wd = in_ranges(nd, 2, 50 + i) ? 0 : (double)o.weight_decay;
			double p = f.p0[i], g = (double)f.g[i] * 0.5;
			if (mode == 1) {
				g += wd * p;
			} else {
				p *= 1 - lr * wd;
			}
			double m = b1 * f.m0[i] + (1 - b1) * g;
			double v = b2 * f.v0[i] + (1 - b2) * g * g;
			double upd = lr / bc1 * m / (sqrt(v) / sqrt(bc2) + o.eps);
			double want = p - upd;
			double tol = 0x1p-20 * (fabs(want) + fabs(upd));
			cr_assert(fabs(f.p[i] - want) <= tol, "mode %d p[%zu] %.9g want %.9g", mode,
				  i, f.p[i], want);
			cr_assert_eq(f.copy[i], dt_f32_to_bf16_rne(f.p[i]), "copy[%zu]", i);
			/* the stored state: the bound around float64's m and v, scaled by the
			 * block's stored scale (float32 m, v differ from float64's by ~2^-22) */
			double sm = block_scale(f.mq, i / B), sw = block_scale(f.vq, i / B);
			double em = fabs(m1[i] - m),
			       bm = fmax(0x1p-5 * fabs(m), 0x1p-7 * sm / 1.875);
			cr_assert(em <= bm * (1 + 0x1p-12) + 0x1p-20 * fabs(m),
				  "mode %d m[%zu] %.9g want %.9g", mode, i, m1[i], m);
			double w = sqrt(v), small = 0x1p-15 * sw / 1.8125;
			double ew = fabs(sqrt(v1[i]) - (w >= small ? w : small));
			cr_assert(ew <= 0x1p-5 * fmax(w, small) * (1 + 0x1p-12),
				  "mode %d v[%zu] %.9g want %.9g", mode, i, v1[i], v);
		}
		free(m1), free(v1);
		fix_free(&f);
	}
}

/*
 * The step is this path's float32 kernel on the decoded state, run per weight-decay run, then
 * encoded once: bit for bit, with no-decay ranges that start and end inside blocks.
 */
Test(cpu_adam_q8, step_is_the_float32_kernel_on_decoded_state_then_encoded)
{
	seed_rng(0x5eed0004);
	for (int mode = 0; mode < 2; mode++) {
		struct fix f;
		fix_make(&f, 4 * B + 100, 5);
		struct zinf_adam_opts o = adam_opts(mode == 0, 0.05f);
		struct zinf_adam_opts o_nd = o;
		o_nd.weight_decay = 0;
		const uint64_t nd[] = {1000 + 10, 1000 + 200, 1000 + 250, 1000 + 600};
		struct zinf_q8_opts q;
		zinf_q8_opts_init(&q);
		q.index0 = 1000;
		q.no_decay = nd;
		q.n_no_decay = 2;
		/* the reference: float32 kernel over runs [0,10) [10,200) [200,250) [250,600) ...
		 */
		float *p = malloc(f.n * 4), *m = malloc(f.n * 4), *v = malloc(f.n * 4);
		uint16_t *copy = malloc(f.n * 2);
		memcpy(p, f.p0, f.n * 4), memcpy(m, f.m0, f.n * 4), memcpy(v, f.v0, f.n * 4);
		const size_t cuts[] = {0, 10, 200, 250, 600, f.n};
		for (int k = 0; k < 5; k++) {
			size_t a = cuts[k], e = cuts[k + 1];
			cr_assert_eq(zinf_adam_step(k % 2 ? &o_nd : &o, 2, 1.0f, p + a, f.g + a,
						    ZINF_F32, m + a, v + a, e - a, copy + a,
						    ZINF_F16),
				     0);
		}
		uint8_t *mq = malloc(zinf_q8_bytes(f.n)), *vq = malloc(zinf_q8_bytes(f.n));
		/* encoded with the step's random bits (an m below the smallest code is 0 or
		 * that code at random): step 2 of seed 0 is the encoder's seed 2 x the key */
		struct zinf_q8_opts qe;
		zinf_q8_opts_init(&qe);
		qe.seed = 2 * ZINF_Q8_STEP_SEED;
		qe.index0 = q.index0;
		zinf_q8_encode(m, f.n, ZINF_Q8_EXP_AVG, mq, &qe);
		zinf_q8_encode(v, f.n, ZINF_Q8_EXP_AVG_SQ, vq, &qe);
		cr_assert_eq(zinf_adam_step_q8state(&o, 2, 1.0f, f.p, f.g, ZINF_F32, f.mq, f.vq,
						    f.n, f.copy, ZINF_F16, &q),
			     0, "%s", zinf_last_error());
		cr_assert(!memcmp(p, f.p, f.n * 4), "mode %d: params differ", mode);
		cr_assert(!memcmp(copy, f.copy, f.n * 2), "mode %d: copies differ", mode);
		cr_assert(!memcmp(mq, f.mq, zinf_q8_bytes(f.n)), "mode %d: m differs", mode);
		cr_assert(!memcmp(vq, f.vq, zinf_q8_bytes(f.n)), "mode %d: v differs", mode);
		/* and the ranges mattered: without them the params differ */
		memcpy(f.p, f.p0, f.n * 4);
		struct zinf_q8_opts q0 = q;
		q0.n_no_decay = 0;
		uint8_t *mq2 = malloc(zinf_q8_bytes(f.n)), *vq2 = malloc(zinf_q8_bytes(f.n));
		zinf_q8_encode(f.m0, f.n, ZINF_Q8_EXP_AVG, mq2, NULL);
		zinf_q8_encode(f.v0, f.n, ZINF_Q8_EXP_AVG_SQ, vq2, NULL);
		zinf_adam_step_q8state(&o, 2, 1.0f, f.p, f.g, ZINF_F32, mq2, vq2, f.n, NULL,
				       ZINF_F16, &q0);
		cr_assert(memcmp(p + 10, f.p + 10, 190 * 4) != 0, "no-decay ranges ignored");
		free(p), free(m), free(v), free(copy), free(mq), free(vq), free(mq2), free(vq2);
		fix_free(&f);
	}
}

/* A NaN or infinite gradient makes its element's p NaN (as the float32 kernel does) and its m
 * and v NaN codes; the other elements of its block get the bytes they get without it. */
Test(cpu_adam_q8, non_finite_gradients_poison_only_their_element)
{
	seed_rng(0x5eed0005);
	struct fix f, h;
	fix_make(&f, 2 * B, 3);
	struct zinf_adam_opts o = adam_opts(true, 0.01f);
	/* elements 5 and 9: zero state, so that without them they would not enter the scales */
	float m[2 * B], v[2 * B];
	memcpy(m, f.m0, sizeof(m)), memcpy(v, f.v0, sizeof(v));
	m[5] = m[9] = v[5] = v[9] = 0;
	zinf_q8_encode(m, 2 * B, ZINF_Q8_EXP_AVG, f.mq, NULL);
	zinf_q8_encode(v, 2 * B, ZINF_Q8_EXP_AVG_SQ, f.vq, NULL);
	h = f;
	h.p = malloc(2 * B * 4), h.g = malloc(2 * B * 4);
	h.mq = malloc(zinf_q8_bytes(2 * B)), h.vq = malloc(zinf_q8_bytes(2 * B));
	memcpy(h.p, f.p, 2 * B * 4), memcpy(h.g, f.g, 2 * B * 4);
	memcpy(h.mq, f.mq, zinf_q8_bytes(2 * B)), memcpy(h.vq, f.vq, zinf_q8_bytes(2 * B));
	f.g[5] = NAN;
	f.g[9] = -INFINITY;
	h.g[5] = h.g[9] = 0;
	cr_assert_eq(zinf_adam_step_q8state(&o, 1, 1.0f, f.p, f.g, ZINF_F32, f.mq, f.vq, 2 * B,
					    NULL, ZINF_F32, NULL),
		     0);
	cr_assert_eq(zinf_adam_step_q8state(&o, 1, 1.0f, h.p, h.g, ZINF_F32, h.mq, h.vq, 2 * B,
					    NULL, ZINF_F32, NULL),
		     0);
	/* the float32 kernel on the same element */
	float p32[2] = {f.p0[5], f.p0[9]}, g32[2] = {NAN, -INFINITY}, m32[2] = {0}, v32[2] = {0};
	cr_assert_eq(zinf_adam_step(&o, 1, 1.0f, p32, g32, ZINF_F32, m32, v32, 2, NULL, ZINF_F32),
		     0);
	float md[2 * B], vd[2 * B];
	zinf_q8_decode(f.mq, 2 * B, ZINF_Q8_EXP_AVG, md);
	zinf_q8_decode(f.vq, 2 * B, ZINF_Q8_EXP_AVG_SQ, vd);
	for (int k = 0; k < 2; k++) {
		size_t i = k ? 9 : 5;
		cr_assert(isnan(p32[k]) && isnan(f.p[i]), "p[%zu]: %g (float32 kernel %g)", i,
			  f.p[i], p32[k]);
		cr_assert(isnan(md[i]) && isnan(vd[i]), "state[%zu]: m %g v %g", i, md[i], vd[i]);
	}
	for (size_t i = 0; i < 2 * B; i++) {
		if (i != 5 && i != 9) {
			cr_assert_eq(dt_f2u(f.p[i]), dt_f2u(h.p[i]), "p[%zu]", i);
			cr_assert_eq(f.mq[zinf_q8_bytes(i / B * B) + 4 + i % B],
				     h.mq[zinf_q8_bytes(i / B * B) + 4 + i % B], "m code %zu", i);
			cr_assert_eq(f.vq[zinf_q8_bytes(i / B * B) + 4 + i % B],
				     h.vq[zinf_q8_bytes(i / B * B) + 4 + i % B], "v code %zu", i);
		}
	}
	cr_assert_eq(block_scale(f.mq, 0), block_scale(h.mq, 0));
	cr_assert_eq(block_scale(f.vq, 0), block_scale(h.vq, 0));
	free(h.p), free(h.g), free(h.mq), free(h.vq);
	fix_free(&f);
}

/*
 * An m that survives in a block whose v rounds up: the update is never larger than float32
 * state's (v > 0 is never stored as 0, which would make the update m / eps).
 */
Test(cpu_adam_q8, a_small_v_rounds_up_and_the_update_stays_bounded)
{
	float m[B] = {0}, v[B] = {0}, p[B] = {0}, g[B] = {0};
	m[0] = 1.0f, v[0] = 1.0f;    /* the block's largest */
	m[1] = 0.02f, v[1] = 1e-14f; /* sqrt(v) 1e-7: below the smallest code (1.7e-5) */
	uint8_t mq[QB(B)], vq[QB(B)];
	zinf_q8_encode(m, B, ZINF_Q8_EXP_AVG, mq, NULL);
	zinf_q8_encode(v, B, ZINF_Q8_EXP_AVG_SQ, vq, NULL);
	cr_assert_eq(vq[4 + 1], 1, "v code %u, not the smallest", vq[4 + 1]);
	struct zinf_adam_opts o = adam_opts(true, 0);
	o.bias_correction = false;
	float p32[B] = {0};
	cr_assert_eq(zinf_adam_step(&o, 5, 1.0f, p32, g, ZINF_F32, m, v, B, NULL, ZINF_F32), 0);
	cr_assert_eq(zinf_adam_step_q8state(&o, 5, 1.0f, p, g, ZINF_F32, mq, vq, B, NULL, ZINF_F32,
					    NULL),
		     0);
	cr_assert(fabsf(p[1]) > 0 && fabsf(p[1]) < fabsf(p32[1]),
		  "update %g (float32 state %g, lr %g)", p[1], p32[1], o.lr);
}

/* Cuts at multiples of the block (pointers advanced by zinf_q8_bytes, index0 with them) and the
 * thread count change no byte, with stochastic rounding and no-decay ranges: one call on one
 * thread against calls of up to three tiles (ZINF_ADAM_TILE, 8192 elements) on three threads,
 * and against one call on four threads (five tiles and a tail). */
Test(cpu_adam_q8, cuts_at_block_multiples_and_threads_change_no_byte)
{
	seed_rng(0x5eed0006);
	size_t n = 5 * ZINF_ADAM_TILE + 123;
	struct fix a, b, c;
	fix_make(&a, n, 4);
	rng_state = 0x5eed0006;
	fix_make(&b, n, 4);
	rng_state = 0x5eed0006;
	fix_make(&c, n, 4);
	struct zinf_adam_opts o = adam_opts(true, 0.1f);
	const uint64_t nd[] = {5000 + 3, 5000 + 1000, 5000 + 5000, 5000 + 5001};
	struct zinf_q8_opts q;
	zinf_q8_opts_init(&q);
	q.rounding = ZINF_ROUND_STOCHASTIC;
	q.seed = 99;
	q.index0 = 5000;
	q.no_decay = nd;
	q.n_no_decay = 2;
	o.threads = 1;
	for (int64_t step = 1; step <= 3; step++) {
		cr_assert_eq(zinf_adam_step_q8state(&o, step, 1.0f, a.p, a.g, ZINF_F32, a.mq, a.vq,
						    n, a.copy, ZINF_BF16, &q),
			     0);
	}
	struct zinf_adam_opts o2 = o, o4 = o;
	o2.threads = 3;
	o4.threads = 4;
	for (int64_t step = 1; step <= 3; step++) {
		cr_assert_eq(zinf_adam_step_q8state(&o4, step, 1.0f, c.p, c.g, ZINF_F32, c.mq, c.vq,
						    n, c.copy, ZINF_BF16, &q),
			     0);
		size_t at = 0;
		while (at < n) {
			size_t len = (size_t)(urand() * 3 * ZINF_ADAM_TILE / B + 1) * B;
			len = len > n - at ? n - at : len;
			struct zinf_q8_opts qc = q;
			qc.index0 = q.index0 + at;
			cr_assert_eq(zinf_adam_step_q8state(&o2, step, 1.0f, b.p + at, b.g + at,
							    ZINF_F32, b.mq + zinf_q8_bytes(at),
							    b.vq + zinf_q8_bytes(at), len,
							    b.copy + at, ZINF_BF16, &qc),
				     0);
			at += len;
		}
	}
	cr_assert(!memcmp(a.p, b.p, n * 4), "params differ");
	cr_assert(!memcmp(a.copy, b.copy, n * 2), "copies differ");
	cr_assert(!memcmp(a.mq, b.mq, zinf_q8_bytes(n)), "m differs");
	cr_assert(!memcmp(a.vq, b.vq, zinf_q8_bytes(n)), "v differs");
	cr_assert(!memcmp(a.p, c.p, n * 4), "params differ (4 threads)");
	cr_assert(!memcmp(a.mq, c.mq, zinf_q8_bytes(n)), "m differs (4 threads)");
	cr_assert(!memcmp(a.vq, c.vq, zinf_q8_bytes(n)), "v differs (4 threads)");
	fix_free(&a);
	fix_free(&b);
	fix_free(&c);
}

Test(cpu_adam_q8, bad_arguments_are_refused_and_write_nothing)
{
	float p[4] = {1, 2, 3, 4}, g[4] = {1, 1, 1, 1};
	uint8_t mq[QB(4)] = {0}, vq[QB(4)] = {0};
	struct zinf_adam_opts o = adam_opts(true, 0.1f);
	struct zinf_q8_opts q;
	zinf_q8_opts_init(&q);
	q.rounding = 7;
	cr_assert_eq(zinf_adam_step_q8state(&o, 1, 1, p, g, ZINF_F32, mq, vq, 4, NULL, 0, &q),
		     -EINVAL);
	cr_assert(strstr(zinf_last_error(), "unknown rounding 7"), "%s", zinf_last_error());
	zinf_q8_opts_init(&q);
	q.n_no_decay = 1;
	cr_assert_eq(zinf_adam_step_q8state(&o, 1, 1, p, g, ZINF_F32, mq, vq, 4, NULL, 0, &q),
		     -EINVAL);
	cr_assert(strstr(zinf_last_error(), "NULL no_decay"), "%s", zinf_last_error());
	const uint64_t bad[] = {5, 9, 7, 12};
	q.no_decay = bad;
	q.n_no_decay = 2;
	cr_assert_eq(zinf_adam_step_q8state(&o, 1, 1, p, g, ZINF_F32, mq, vq, 4, NULL, 0, &q),
		     -EINVAL);
	cr_assert(strstr(zinf_last_error(), "range 1 [7, 12) is not after"), "%s",
		  zinf_last_error());
	cr_assert_eq(zinf_adam_step_q8state(&o, 0, 1, p, g, ZINF_F32, mq, vq, 4, NULL, 0, NULL),
		     -EINVAL);
	cr_assert(p[0] == 1 && p[3] == 4 && mq[0] == 0 && vq[4] == 0, "written on error");
	cr_assert_eq(zinf_q8_encode(p, 4, 3, mq, NULL), -EINVAL);
	cr_assert_eq(zinf_q8_decode(NULL, 4, ZINF_Q8_EXP_AVG, p), -EINVAL);
}

/* Decoding then encoding gives the same bytes (codes and scales), for m and v, wide ranges, a
 * zero block, a NaN, a small v rounded up: what a checkpoint of decoded floats relies on. */
Test(cpu_adam_q8, decode_then_encode_gives_the_same_bytes)
{
	seed_rng(0x5eed0007);
	size_t n = 9 * B + 100;
	float *x = malloc(n * 4), *y = malloc(n * 4);
	uint8_t *a = malloc(zinf_q8_bytes(n)), *b = malloc(zinf_q8_bytes(n));
	for (int which = 0; which < 2; which++) {
		for (int rnd = 0; rnd < 2; rnd++) {
			for (size_t i = 0; i < n; i++) {
				x[i] = wide(which == ZINF_Q8_EXP_AVG_SQ, 14);
			}
			memset(x + 2 * B, 0, B * 4); /* a zero block */
			x[5 * B + 7] = NAN;
			x[6 * B] = which ? 1e-30f : 1e-12f; /* below the smallest code */
			struct zinf_q8_opts q;
			zinf_q8_opts_init(&q);
			q.rounding = rnd;
			zinf_q8_encode(x, n, which, a, &q);
			zinf_q8_decode(a, n, which, y);
			zinf_q8_encode(y, n, which, b, NULL);
			for (size_t k = 0; k < zinf_q8_bytes(n); k++) {
				cr_assert_eq(a[k], b[k], "moment %d rounding %d: byte %zu", which,
					     rnd, k);
			}
		}
	}
	free(x), free(y), free(a), free(b);
}

/*
 * m below the smallest code (S / 240) is 0 or that code, with the probability that keeps its
 * expectation, in either rounding: 4096 elements of |m| = 0.3 S / 240 beside one of S give
 * code 1 for 0.3 of them (binomial: within 4 standard deviations, 0.029), the sign kept.
 */
Test(cpu_adam_q8, m_below_the_smallest_code_keeps_its_expectation)
{
	size_t n = 16 * B;
	float *x = malloc(n * 4);
	uint8_t *q8 = malloc(zinf_q8_bytes(n));
	for (int rnd = 0; rnd < 2; rnd++) {
		for (size_t i = 0; i < n; i++) {
			x[i] = i % B == 0 ? 1.0f : (i % 2 ? -0.3f : 0.3f) / 240;
		}
		struct zinf_q8_opts q;
		zinf_q8_opts_init(&q);
		q.rounding = rnd;
		q.seed = 11;
		cr_assert_eq(zinf_q8_encode(x, n, ZINF_Q8_EXP_AVG, q8, &q), 0);
		size_t ones = 0, small = 0;
		for (size_t i = 0; i < n; i++) {
			uint8_t c = q8[zinf_q8_bytes(i / B * B) + 4 + i % B];
			if (i % B == 0) {
				continue;
			}
			small++;
			cr_assert((c & 0x7f) <= 1, "element %zu: code %u", i, c);
			if (c & 0x7f) {
				ones++;
				cr_assert_eq(c >> 7, i % 2, "element %zu: code %u, sign lost", i,
					     c);
			}
		}
		double frac = (double)ones / (double)small;
		double sd = sqrt(0.3 * 0.7 / (double)small);
		cr_assert(fabs(frac - 0.3) <= 4 * sd, "rounding %d: %zu of %zu at code 1 (%.4f)",
			  rnd, ones, small, frac);
	}
	free(x), free(q8);
}

/* A v that is not > 0 but finite (-0.0, whose sqrtf is -0.0; a negative v) is code 0, like 0;
 * NaN and infinities are the NaN code. */
Test(cpu_adam_q8, a_v_that_is_not_positive_but_finite_is_code_0)
{
	float v[7] = {1.0f, -0.0f, 0.0f, 0.25f, -1e-30f, -INFINITY, NAN};
	uint8_t q[QB(7)];
	float y[7];
	cr_assert_eq(zinf_q8_encode(v, 7, ZINF_Q8_EXP_AVG_SQ, q, NULL), 0);
	cr_assert_eq(block_scale(q, 0), 1.0f);
	/* 0.25: sqrt(v) 0.5 codes 0.5 x 1.8125 = 2^-1 x 1.8125: binade 14, mantissa 13, 238 */
	const uint8_t want[7] = {254, 0, 0, 238, 0, 255, 255};
	for (int i = 0; i < 7; i++) {
		cr_assert_eq(q[4 + i], want[i], "v[%d] = %g: code %u, not %u", i, v[i], q[4 + i],
			     want[i]);
	}
	zinf_q8_decode(q, 7, ZINF_Q8_EXP_AVG_SQ, y);
	cr_assert(y[1] == 0.0f && y[4] == 0.0f && isnan(y[5]), "decoded %g %g %g", y[1], y[4],
		  y[5]);
}

static double
gauss(void)
{
	return sqrt(-2 * log(urand() + 0x1p-60)) * cos(2 * M_PI * urand());
}

/*
 * An element whose gradient stops while others of its block go on: its parameter moves as with
 * float32 state and then stops. 32 blocks, the odd elements' gradients stop after step T0 = 100
 * (gradients sd_i (0.3 + N(0, 1)), sd_i log-normal with sigma 0.5), 1200 steps, lr 1e-3.
 * After the stop float32 state moves an element by lr sum_k m_k / sqrt(v_k) ~ 10 lr m / sqrt(v)
 * (m decays by beta1 = 0.9, v by 0.999) and then by nothing that float32 shows.
 * - Each q8 m is rounded so that its expectation is beta1 times the last one's (stochastic
 *   rounding; below the smallest code, in either rounding, 0 or that code), so it reaches 0 (a
 *   code-1 m survives a step with probability 0.9: 300 steps with ~1e-14) and stays there: from
 *   T0 + 300 on, no stopped parameter moves and every stopped m is code 0 (before the fix a
 *   decaying m stayed on code 1, 0.9 x 2^-7 being nearer to 2^-7 than to 0, and the parameter
 *   moved lr / 240 x S / sqrt(v) a step for ever).
 * - Stochastic rounding (the descriptor's): the expected movement is float32's within the
 *   second-order effect of v's rounding (E[1 / w] for w = sqrt(v) with a relative error of ~10%:
 *   ~1%); the mean over the 4096 stopped elements, each within ~20% (the m at the stop within
 *   2^-4, w within ~10%), has a sampling error of ~0.3%: |mean q8 / mean float32 - 1| <= 0.05.
 *   v decays as float32's does: the mean of sqrt(v_q8 / v_f32) over the stopped elements at
 *   the end is within 0.1 of 1 (round to nearest kept v at its ratio to the block's largest:
 *   sqrt(1 / 0.999^1100) = 1.73).
 * - Round to nearest: each code of the decay is within 2^-5 of 0.9 m, so m_k <= (0.9 (1 +
 *   2^-5))^k m_0 and the sum is at most 1 / (1 - 0.928) = 13.9 instead of 10 m_0; v at most its
 *   rounding above float32's: the mean movement is at most 1.5 times float32's.
 */
Test(cpu_adam_q8, a_stopped_gradient_stops_the_parameter_as_float32_state_does)
{
	seed_rng(0x5eed0008);
	const size_t n = 32 * B;
	const int64_t t0 = 100, t1 = t0 + 300, steps = 1200;
	float *sd = malloc(n * 4), *g = malloc(n * 4);
	for (size_t i = 0; i < n; i++) {
		sd[i] = (float)exp(0.5 * gauss());
	}
	for (int rnd = 0; rnd < 2; rnd++) {
		float *p32 = calloc(n, 4), *m32 = calloc(n, 4), *v32 = calloc(n, 4);
		float *pq = calloc(n, 4), *at0_32 = malloc(n * 4), *at0_q = malloc(n * 4);
		float *at1_q = malloc(n * 4), *md = malloc(n * 4), *vd = malloc(n * 4);
		uint8_t *mq = calloc(zinf_q8_bytes(n), 1), *vq = calloc(zinf_q8_bytes(n), 1);
		struct zinf_adam_opts o = adam_opts(true, 0);
		o.lr = 1e-3f;
		struct zinf_q8_opts q;
		zinf_q8_opts_init(&q);
		q.rounding = rnd ? ZINF_ROUND_STOCHASTIC : ZINF_ROUND_NEAREST_EVEN;
		q.seed = 5;
		rng_state = 0x5eed0009;
		for (int64_t t = 1; t <= steps; t++) {
			for (size_t i = 0; i < n; i++) {
				g[i] = i % 2 && t > t0 ? 0.0f : (float)(sd[i] * (0.3 + gauss()));
			}
			cr_assert_eq(zinf_adam_step(&o, t, 1.0f, p32, g, ZINF_F32, m32, v32, n,
						    NULL, ZINF_F32),
				     0);
			cr_assert_eq(zinf_adam_step_q8state(&o, t, 1.0f, pq, g, ZINF_F32, mq, vq, n,
							    NULL, ZINF_F32, &q),
				     0);
			if (t == t0) {
				memcpy(at0_32, p32, n * 4), memcpy(at0_q, pq, n * 4);
			}
			if (t == t1) {
				memcpy(at1_q, pq, n * 4);
			}
		}
		zinf_q8_decode(mq, n, ZINF_Q8_EXP_AVG, md);
		zinf_q8_decode(vq, n, ZINF_Q8_EXP_AVG_SQ, vd);
		double mv32 = 0, mvq = 0, wr = 0;
		size_t ns = 0;
		for (size_t i = 1; i < n; i += 2) {
			cr_assert_eq(dt_f2u(pq[i]), dt_f2u(at1_q[i]),
				     "rounding %d: stopped p[%zu] moved %.3g after step %lld", rnd,
				     i, pq[i] - at1_q[i], (long long)t1);
			cr_assert_eq(md[i], 0.0f, "rounding %d: stopped m[%zu] = %g", rnd, i,
				     md[i]);
			mv32 += fabs(p32[i] - at0_32[i]);
			mvq += fabs(pq[i] - at0_q[i]);
			wr += sqrt((double)vd[i] / v32[i]);
			ns++;
		}
		mv32 /= (double)ns, mvq /= (double)ns, wr /= (double)ns;
		printf("rounding %d: stopped elements' mean movement after step %lld: float32 "
		       "state "
		       "%.4g, q8 %.4g (ratio %.4f); mean sqrt(v_q8 / v_f32) %.4f\n",
		       rnd, (long long)t0, mv32, mvq, mvq / mv32, wr);
		if (rnd) {
			cr_assert(fabs(mvq / mv32 - 1) <= 0.05, "movement ratio %.4f", mvq / mv32);
			cr_assert(fabs(wr - 1) <= 0.1, "sqrt(v) ratio %.4f", wr);
		} else {
			cr_assert(mvq / mv32 <= 1.5, "movement ratio %.4f", mvq / mv32);
		}
		free(p32), free(m32), free(v32), free(pq), free(at0_32), free(at0_q), free(at1_q);
		free(md), free(vd), free(mq), free(vq);
	}
	free(sd), free(g);
}
