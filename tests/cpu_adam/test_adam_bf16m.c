/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/cpu_adam/test_adam_bf16m.c: Adam with a bf16 master weight (zinf_adam_step_bf16master) on
 * the SIMD path named by ZINF_TEST_VARIANT (a path this CPU lacks is a visible skip), with each
 * moments format (f32, bf16, q8): the step is the path's own kernel on the widened master (the
 * moments and the f16 copy bit for bit, the new master one of the two bf16 neighbours of the
 * float update), each element within one bf16 ulp of float64 Adam, the stochastically rounded
 * master unbiased over many seeds, tiny updates that round to nearest loses still moving the
 * weight, weight decay per element, independence from the cuts and the threads (2 and 3 of
 * them), the same bytes on every path across a multiple of 2^32 of the index, the saturation at
 * the top of bf16's range, the master's random bits unrelated to the moments', a bf16 copy that
 * is the master itself, refused arguments.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/test_util.h"
#include "cpu_adam/adam_bench.h" /* ZINF_ADAM_TILE */
#include "zinf/blocks/adam.h"

#define B ZINF_Q8_BLOCK

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

static const enum zinf_moments formats[] = {ZINF_MOMENTS_F32, ZINF_MOMENTS_BF16, ZINF_MOMENTS_Q8};
static const char *const format_name[] = {"f32", "bf16", "q8"};

/* Bytes of n elements of a moment in format f. */
static size_t
mbytes(enum zinf_moments f, size_t n)
{
	return f == ZINF_MOMENTS_Q8 ? zinf_q8_bytes(n) : n * (f == ZINF_MOMENTS_BF16 ? 2 : 4);
}

/* A problem of n elements: a bf16 master, gradients, and float m, v after a few steps' worth. */
struct fix {
	size_t n;
	uint16_t *w; /* bf16 master */
	float *g;
	float *m, *v; /* the moments as floats (exactly representable in every format below) */
};

static void
fix_make(struct fix *f, size_t n)
{
	f->n = n;
	f->w = malloc(n * 2);
	f->g = malloc(n * 4);
	f->m = malloc(n * 4);
	f->v = malloc(n * 4);
	for (size_t i = 0; i < n; i++) {
		f->w[i] = dt_f32_to_bf16_rne((float)((urand() * 2 - 1) * pow(2, 4 * urand() - 2)));
		f->g[i] = (float)((urand() * 2 - 1) * 0.1);
		float g = (float)((urand() * 2 - 1) * 0.1);
		/* bf16 values, so that f32 and bf16 moments hold the same numbers */
		f->m[i] = dt_bf16_to_f32(dt_f32_to_bf16_rne(0.1f * g));
		f->v[i] = dt_bf16_to_f32(dt_f32_to_bf16_rne(0.001f * g * g + 1e-6f));
	}
}

static void
fix_free(struct fix *f)
{
	free(f->w), free(f->g), free(f->m), free(f->v);
}

/* The moments of f in format fmt, newly allocated (q8: encoded, then f's floats replaced by the
 * decoded values, so that every reference starts from the same numbers). */
static void
moments_make(struct fix *f, enum zinf_moments fmt, void **m, void **v)
{
	*m = malloc(mbytes(fmt, f->n));
	*v = malloc(mbytes(fmt, f->n));
	if (fmt == ZINF_MOMENTS_F32) {
		memcpy(*m, f->m, f->n * 4);
		memcpy(*v, f->v, f->n * 4);
	} else if (fmt == ZINF_MOMENTS_BF16) {
		for (size_t i = 0; i < f->n; i++) {
			((uint16_t *)*m)[i] = dt_f32_to_bf16_rne(f->m[i]);
			((uint16_t *)*v)[i] = dt_f32_to_bf16_rne(f->v[i]);
		}
	} else {
		cr_assert_eq(zinf_q8_encode(f->m, f->n, ZINF_Q8_EXP_AVG, *m, NULL), 0);
		cr_assert_eq(zinf_q8_encode(f->v, f->n, ZINF_Q8_EXP_AVG_SQ, *v, NULL), 0);
		zinf_q8_decode(*m, f->n, ZINF_Q8_EXP_AVG, f->m);
		zinf_q8_decode(*v, f->n, ZINF_Q8_EXP_AVG_SQ, f->v);
	}
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

/* The two bf16 values around x (equal when x is one). */
static void
bf16_around(float x, float *lo, float *hi)
{
	uint32_t u = dt_f2u(x) & 0xffff0000u;
	float t = dt_u2f(u); /* x truncated toward zero */
	float up = dt_u2f(u + 0x10000u);
	if (t == x) {
		*lo = *hi = x;
	} else if (x > 0) {
		*lo = t, *hi = up;
	} else {
		*lo = up, *hi = t;
	}
}

/* The value of one bf16 ulp at |x|. */
static double
bf16_ulp(double x)
{
	int e;
	frexp(x, &e);
	return ldexp(1.0, e - 8);
}

/*
 * One step with a bf16 master, against the path's own kernel of the moments' format on the
 * widened master (the same options, seed and index0 0 in one call, so the moments' random bits
 * are the same): the moments and the f16 copy the same bytes, the new master one of the two bf16
 * neighbours of the kernel's float update, the bf16 copy the master, the f32 copy the master
 * widened. And against float64 Adam (f32 moments): each new master within one bf16 ulp of the
 * exact update (plus float32 rounding).
 */
Test(cpu_adam_bf16m, step_is_the_float_kernel_on_the_widened_master_then_rounded)
{
	seed_rng(0x5eedb001);
	const size_t n = 9 * B + 77;
	const enum zinf_dtype copies[] = {ZINF_BF16, ZINF_F16, ZINF_F32};
	for (int fi = 0; fi < 3; fi++) {
		for (int ci = 0; ci < 3; ci++) {
			enum zinf_moments fmt = formats[fi];
			enum zinf_dtype cdt = copies[ci];
			struct fix f;
			fix_make(&f, n);
			void *m, *v, *mr, *vr;
			moments_make(&f, fmt, &m, &v);
			mr = malloc(mbytes(fmt, n));
			vr = malloc(mbytes(fmt, n));
			memcpy(mr, m, mbytes(fmt, n));
			memcpy(vr, v, mbytes(fmt, n));
			float *pr = malloc(n * 4);
			for (size_t i = 0; i < n; i++) {
				pr[i] = dt_bf16_to_f32(f.w[i]);
			}
			void *copy = calloc(n, 4), *copyr = calloc(n, 4);
			struct zinf_adam_opts o = adam_opts(ci != 1, 0.05f);
			const int64_t step = 3;
			struct zinf_bf16master_opts b;
			zinf_bf16master_opts_init(&b);
			b.moments = fmt;
			b.seed = 11;
			b.state_rounding = fmt == ZINF_MOMENTS_Q8 ? ZINF_ROUND_NEAREST_EVEN
								  : ZINF_ROUND_STOCHASTIC;
			cr_assert_eq(zinf_adam_step_bf16master(&o, step, 0.5f, f.w, f.g, ZINF_F32,
							       m, v, n, copy, cdt, &b),
				     0, "%s", zinf_last_error());
			int r;
			if (fmt == ZINF_MOMENTS_F32) {
				r = zinf_adam_step(&o, step, 0.5f, pr, f.g, ZINF_F32, mr, vr, n,
						   copyr, cdt);
			} else if (fmt == ZINF_MOMENTS_BF16) {
				r = zinf_adam_step_bf16state(&o, step, 0.5f, pr, f.g, ZINF_F32, mr,
							     vr, n, copyr, cdt,
							     ZINF_ROUND_STOCHASTIC, 11);
			} else {
				struct zinf_q8_opts q;
				zinf_q8_opts_init(&q);
				q.seed = 11;
				r = zinf_adam_step_q8state(&o, step, 0.5f, pr, f.g, ZINF_F32, mr,
							   vr, n, copyr, cdt, &q);
			}
			cr_assert_eq(r, 0, "%s", zinf_last_error());
			const char *fn = format_name[fi];
			cr_assert(!memcmp(m, mr, mbytes(fmt, n)), "%s: m differs", fn);
			cr_assert(!memcmp(v, vr, mbytes(fmt, n)), "%s: v differs", fn);
			size_t up = 0, down = 0;
			for (size_t i = 0; i < n; i++) {
				float w = dt_bf16_to_f32(f.w[i]), lo, hi;
				bf16_around(pr[i], &lo, &hi);
				cr_assert(w == lo || w == hi,
					  "%s: element %zu: master %.9g, float update %.9g "
					  "(between %.9g and %.9g)",
					  fn, i, w, pr[i], lo, hi);
				up += lo != hi && w == hi;
				down += lo != hi && w == lo;
				if (cdt == ZINF_BF16) {
					cr_assert_eq(((uint16_t *)copy)[i], f.w[i], "%s: copy %zu",
						     fn, i);
				} else if (cdt == ZINF_F32) {
					cr_assert_eq(((float *)copy)[i], w, "%s: copy %zu", fn, i);
				} else {
					cr_assert_eq(((uint16_t *)copy)[i], ((uint16_t *)copyr)[i],
						     "%s: f16 copy %zu is not the float update "
						     "rounded",
						     fn, i);
				}
			}
			/* stochastic: both directions happen (a rounding that always truncates or
			 * always rounds up would pass the neighbour check) */
			cr_assert(up > n / 8 && down > n / 8, "%s: %zu up, %zu down of %zu", fn, up,
				  down, n);
			free(m), free(v), free(mr), free(vr), free(pr), free(copy), free(copyr);
			fix_free(&f);
		}
	}
}

/* Float64 Adam of one element (torch's formula), for step t from p, m, v, gradient g. */
static double
adam64(const struct zinf_adam_opts *o, int64_t t, double p, double g, double *m, double *v)
{
	if (!o->adamw_mode) {
		g += o->weight_decay * p;
	} else {
		p *= 1.0 - (double)o->lr * o->weight_decay;
	}
	*m = o->beta1 * *m + (1.0 - o->beta1) * g;
	*v = o->beta2 * *v + (1.0 - o->beta2) * g * g;
	double bc1 = 1.0 - pow(o->beta1, (double)t), bc2 = 1.0 - pow(o->beta2, (double)t);
	return p - (double)o->lr / bc1 * *m / (sqrt(*v) / sqrt(bc2) + o->eps);
}

/*
 * Over S seeds, the mean of the stochastically rounded master is float64 Adam's update: each
 * draw is within one bf16 ulp (u) of it, a draw's rounding error has mean 0 and standard
 * deviation at most u / 2, so the mean of S draws is within 6 u / (2 sqrt(S)) of the exact value
 * for every element, and the mean error over all n elements within 6 u / (2 sqrt(S n)) (6 sigma;
 * the float32 arithmetic adds about 2^-16 u). A biased rounding (truncation: -u / 2 on average;
 * round to nearest on these random values: its error is not 0 per element) fails both.
 */
Test(cpu_adam_bf16m, rounded_master_is_unbiased_over_seeds_and_within_one_ulp)
{
	seed_rng(0x5eedb002);
	const size_t n = 512, S = 1024;
	struct fix f;
	fix_make(&f, n);
	struct zinf_adam_opts o = adam_opts(true, 0.05f);
	double *exact = malloc(n * 8), *sum = calloc(n, 8);
	for (size_t i = 0; i < n; i++) {
		double m = f.m[i], v = f.v[i];
		exact[i] = adam64(&o, 3, dt_bf16_to_f32(f.w[i]), f.g[i], &m, &v);
	}
	uint16_t *w = malloc(n * 2);
	float *m = malloc(n * 4), *v = malloc(n * 4);
	for (size_t s = 0; s < S; s++) {
		memcpy(w, f.w, n * 2);
		memcpy(m, f.m, n * 4);
		memcpy(v, f.v, n * 4);
		struct zinf_bf16master_opts b;
		zinf_bf16master_opts_init(&b);
		b.seed = 1000 + s;
		cr_assert_eq(zinf_adam_step_bf16master(&o, 3, 1.0f, w, f.g, ZINF_F32, m, v, n, NULL,
						       ZINF_BF16, &b),
			     0, "%s", zinf_last_error());
		for (size_t i = 0; i < n; i++) {
			double got = dt_bf16_to_f32(w[i]), u = bf16_ulp(exact[i]);
			cr_assert(
				fabs(got - exact[i]) <= u * (1 + 0x1p-10),
				"seed %zu element %zu: %.9g is more than one bf16 ulp (%.3g) from "
				"%.12g",
				s, i, got, u, exact[i]);
			sum[i] += got;
		}
	}
	double all = 0;
	for (size_t i = 0; i < n; i++) {
		double u = bf16_ulp(exact[i]), err = (sum[i] / S - exact[i]) / u;
		cr_assert(fabs(err) <= 6 * 0.5 / sqrt((double)S) + 0x1p-12,
			  "element %zu: mean %.12g vs exact %.12g: bias %.4f ulp", i, sum[i] / S,
			  exact[i], err);
		all += err;
	}
	all /= n;
	cr_assert(fabs(all) <= 6 * 0.5 / sqrt((double)S * n) + 0x1p-12,
		  "mean bias over elements %.5f ulp", all);
	printf("mean bias %.5f ulp (bound %.5f)\n", all, 6 * 0.5 / sqrt((double)S * n));
	free(exact), free(sum), free(w), free(m), free(v);
	fix_free(&f);
}

/*
 * A long run of tiny updates: weights 1.5 (a bf16 ulp of 2^-7, half of it 0.0039), a constant
 * gradient and lr 1e-5, so each step moves a weight by about 1e-5, 390 times less than half an
 * ulp. Round to nearest (the kernel's ZINF_ROUND_NEAREST_EVEN master) loses every update: no
 * weight moves in T steps. Stochastic rounding moves them by T * 1e-5 on average: the mean over
 * n elements (each with its own random bits) is float64's trajectory within 6 sigma (each step's
 * rounding has variance q (1 - q) u^2, q = update / u, so an element's final error has standard
 * deviation u sqrt(T q), the mean's u sqrt(T q / n)).
 */
Test(cpu_adam_bf16m, tiny_updates_move_the_weight_on_average_where_nearest_loses_them)
{
	const size_t n = 4096;
	const int64_t T = 2000;
	struct zinf_adam_opts o = adam_opts(true, 0.0f);
	o.lr = 1e-5f;
	float *g = malloc(n * 4);
	uint16_t *w[2];
	float *m[2], *v[2];
	for (int k = 0; k < 2; k++) {
		w[k] = malloc(n * 2);
		m[k] = calloc(n, 4);
		v[k] = calloc(n, 4);
		for (size_t i = 0; i < n; i++) {
			w[k][i] = dt_f32_to_bf16_rne(1.5f);
		}
	}
	for (size_t i = 0; i < n; i++) {
		g[i] = 0.01f;
	}
	double exact = 1.5, em = 0, ev = 0;
	for (int64_t t = 1; t <= T; t++) {
		exact = adam64(&o, t, exact, 0.01, &em, &ev);
		for (int k = 0; k < 2; k++) {
			struct zinf_bf16master_opts b;
			zinf_bf16master_opts_init(&b);
			b.seed = 5;
			b.rounding = k ? ZINF_ROUND_NEAREST_EVEN : ZINF_ROUND_STOCHASTIC;
			cr_assert_eq(zinf_adam_step_bf16master(&o, t, 1.0f, w[k], g, ZINF_F32, m[k],
							       v[k], n, NULL, ZINF_BF16, &b),
				     0, "%s", zinf_last_error());
		}
	}
	double u = 0x1p-7, q = (1.5 - exact) / T / u, mean = 0;
	for (size_t i = 0; i < n; i++) {
		cr_assert_eq(dt_bf16_to_f32(w[1][i]), 1.5f, "nearest: element %zu moved", i);
		mean += dt_bf16_to_f32(w[0][i]);
	}
	mean /= n;
	double sigma = u * sqrt(T * q / n);
	printf("moved %.6f (exact %.6f, %.2f ulp), sigma %.2g\n", 1.5 - mean, 1.5 - exact,
	       (1.5 - exact) / u, sigma);
	cr_assert(1.5 - exact > 2 * u, "the test's premise: the exact run moves %.4g", 1.5 - exact);
	cr_assert(fabs(mean - exact) <= 6 * sigma,
		  "stochastic: mean %.8f, exact %.8f (6 sigma %.3g)", mean, exact, 6 * sigma);
	free(g);
	for (int k = 0; k < 2; k++) {
		free(w[k]), free(m[k]), free(v[k]);
	}
}

/* Weight decay per element: a step with no-decay ranges equals, element by element, the step
 * with weight decay 0 inside them and the step with it outside (f32 and bf16 moments, whose
 * elements are independent; AdamW and Adam's L2). */
Test(cpu_adam_bf16m, no_decay_ranges_give_each_element_its_own_weight_decay)
{
	seed_rng(0x5eedb003);
	const size_t n = 3 * B + 50;
	const uint64_t nd[] = {100 + 7, 100 + 300, 100 + 500, 100 + 501};
	for (int fi = 0; fi < 2; fi++) {
		for (int adamw = 0; adamw < 2; adamw++) {
			struct fix f;
			fix_make(&f, n);
			void *m[3], *v[3];
			uint16_t *w[3];
			for (int k = 0; k < 3; k++) {
				moments_make(&f, formats[fi], &m[k], &v[k]);
				w[k] = malloc(n * 2);
				memcpy(w[k], f.w, n * 2);
			}
			struct zinf_bf16master_opts b;
			zinf_bf16master_opts_init(&b);
			b.moments = formats[fi];
			b.seed = 3;
			b.index0 = 100;
			for (int k = 0; k < 3; k++) {
				struct zinf_adam_opts o = adam_opts(adamw, k == 1 ? 0.0f : 0.2f);
				struct zinf_bf16master_opts bk = b;
				if (k == 0) {
					bk.no_decay = nd;
					bk.n_no_decay = 2;
				}
				cr_assert_eq(zinf_adam_step_bf16master(&o, 2, 1.0f, w[k], f.g,
								       ZINF_F32, m[k], v[k], n,
								       NULL, ZINF_BF16, &bk),
					     0, "%s", zinf_last_error());
			}
			size_t es = fi ? 2 : 4, differ = 0;
			for (size_t i = 0; i < n; i++) {
				bool in = (i + 100 >= nd[0] && i + 100 < nd[1]) ||
					  (i + 100 >= nd[2] && i + 100 < nd[3]);
				int k = in ? 1 : 2;
				cr_assert_eq(w[0][i], w[k][i], "%s adamw %d element %zu",
					     format_name[fi], adamw, i);
				cr_assert(
					!memcmp((char *)m[0] + i * es, (char *)m[k] + i * es, es) &&
						!memcmp((char *)v[0] + i * es,
							(char *)v[k] + i * es, es),
					"%s adamw %d element %zu: moments", format_name[fi], adamw,
					i);
				differ += w[1][i] != w[2][i];
			}
			cr_assert(differ > n / 4, "weight decay changed only %zu of %zu", differ,
				  n);
			for (int k = 0; k < 3; k++) {
				free(m[k]), free(v[k]), free(w[k]);
			}
			fix_free(&f);
		}
	}
}

/*
 * One call on one thread vs calls cut at random places (block multiples for q8) with index0
 * advanced, and vs one call on 2 and on 3 threads: the same bytes of master, moments and copy,
 * over three steps. The array is six tiles (ZINF_ADAM_TILE) long, so the threaded calls really
 * split it between threads (a call of one tile runs on one thread whatever opts.threads says: the
 * cut calls, each shorter than a tile, do). A step whose bits depended on the thread (its master
 * key xored with omp_get_thread_num(), tried by hand) fails the threaded comparison here.
 */
Test(cpu_adam_bf16m, cuts_and_threads_change_no_byte)
{
	seed_rng(0x5eedb004);
	const size_t n = 5 * ZINF_ADAM_TILE + 40 * B + 123;
	/* num_threads(k) gives k threads: OpenMP may not lower it (no dynamic adjustment) */
	omp_set_dynamic(0);
	cr_assert(omp_get_thread_limit() >= 3, "OMP_THREAD_LIMIT %d: cannot test 3 threads",
		  omp_get_thread_limit());
	for (int fi = 0; fi < 3; fi++) {
		enum zinf_moments fmt = formats[fi];
		struct fix f;
		fix_make(&f, n);
		enum { K = 4 }; /* one thread, cuts, 2 threads, 3 threads */
		void *m[K], *v[K];
		uint16_t *w[K], *c[K];
		for (int k = 0; k < K; k++) {
			moments_make(&f, fmt, &m[k], &v[k]);
			w[k] = malloc(n * 2);
			memcpy(w[k], f.w, n * 2);
			c[k] = calloc(n, 2);
		}
		struct zinf_adam_opts o = adam_opts(true, 0.1f);
		const uint64_t nd[] = {5000 + 3, 5000 + 1000};
		struct zinf_bf16master_opts b;
		zinf_bf16master_opts_init(&b);
		b.moments = fmt;
		b.seed = 99;
		b.index0 = 5000;
		b.no_decay = nd;
		b.n_no_decay = 1;
		const int threads[K] = {1, 1, 2, 3};
		for (int k = 0; k < K; k++) {
			if (k == 1) {
				continue;
			}
			struct zinf_adam_opts ok = o;
			ok.threads = threads[k];
			for (int64_t step = 1; step <= 3; step++) {
				cr_assert_eq(zinf_adam_step_bf16master(&ok, step, 1.0f, w[k], f.g,
								       ZINF_F32, m[k], v[k], n,
								       c[k], ZINF_F16, &b),
					     0, "%s", zinf_last_error());
			}
		}
		o.threads = 1;
		size_t unit = fmt == ZINF_MOMENTS_Q8 ? B : 1;
		for (int64_t step = 1; step <= 3; step++) {
			for (size_t at = 0, len; at < n; at += len) {
				len = (size_t)(urand() * 12 * B / unit + 1) * unit;
				len = len > n - at ? n - at : len;
				struct zinf_bf16master_opts bc = b;
				bc.index0 = b.index0 + at;
				size_t off = mbytes(fmt, at);
				cr_assert_eq(zinf_adam_step_bf16master(
						     &o, step, 1.0f, w[1] + at, f.g + at, ZINF_F32,
						     (char *)m[1] + off, (char *)v[1] + off, len,
						     c[1] + at, ZINF_F16, &bc),
					     0, "%s", zinf_last_error());
			}
		}
		const char *fn = format_name[fi];
		for (int k = 1; k < K; k++) {
			const char *how = k == 1 ? "cuts" : k == 2 ? "2 threads" : "3 threads";
			cr_assert(!memcmp(w[0], w[k], n * 2), "%s, %s: masters differ", fn, how);
			cr_assert(!memcmp(c[0], c[k], n * 2), "%s, %s: copies differ", fn, how);
			cr_assert(!memcmp(m[0], m[k], mbytes(fmt, n)), "%s, %s: m differs", fn,
				  how);
			cr_assert(!memcmp(v[0], v[k], mbytes(fmt, n)), "%s, %s: v differs", fn,
				  how);
		}
		for (int k = 0; k < K; k++) {
			free(m[k]), free(v[k]), free(w[k]), free(c[k]);
		}
		fix_free(&f);
	}
}

/*
 * Options under which every path computes the same floats: beta1 0.5 and beta2 0 from m = v = 0
 * make m = g / 2 (exact) and v = fl(g * g), whose square root is |g| exactly; with eps 0 and no
 * bias correction the ratio m / (sqrt(v) + eps) is +-0.5 exactly and the update
 * p - lr * (+-0.5) is rounded once on every path (the vector paths' FMA, the scalar path's
 * multiply, exact, then add). So the stochastic roundings see the same floats everywhere and
 * only their random bits can differ.
 */
static struct zinf_adam_opts
exact_opts(float lr, const char *simd)
{
	struct zinf_adam_opts o;
	zinf_adam_opts_init(&o);
	o.lr = lr;
	o.beta1 = 0.5f;
	o.beta2 = 0.0f;
	o.eps = 0.0f;
	o.weight_decay = 0.0f;
	o.bias_correction = false;
	o.simd = simd;
	return o;
}

/* Zero moments of n elements in format fmt (all-zero bytes are zeros in every format). */
static void
zero_moments(enum zinf_moments fmt, size_t n, void **m, void **v)
{
	*m = calloc(1, mbytes(fmt, n));
	*v = calloc(1, mbytes(fmt, n));
}

/*
 * A range of indices straddling 2^32 (index0 2^32 - 203, not a multiple of a vector's width, so
 * one vector of bf16 moments has lanes on both sides; q8: 2^32 - 256, a block multiple) stepped
 * by this path, by the scalar path, and one element at a time with index0 its own index: the same
 * bytes of master, moments and copy. The stochastic rounding's bits are a function of the 64-bit
 * index on every path (the vector hash took the high word once per vector: up to 15 elements
 * after each multiple of 2^32 got the bits of index - 2^32).
 */
Test(cpu_adam_bf16m, random_bits_follow_the_64_bit_index_across_2_to_the_32)
{
	seed_rng(0x5eedb005);
	const size_t n = 500;
	const float lr = 0.01234f; /* lr / 2: bits below every master's bf16 ulp */
	const enum zinf_dtype copies[] = {ZINF_F16, ZINF_F32, ZINF_BF16};
	const char *path = zt_simd_variant();
	for (int fi = 0; fi < 3; fi++) {
		enum zinf_moments fmt = formats[fi];
		const uint64_t index0 =
			fmt == ZINF_MOMENTS_Q8 ? (1ull << 32) - 256 : (1ull << 32) - 203;
		uint16_t *w0 = malloc(n * 2);
		float *g = malloc(n * 4);
		for (size_t i = 0; i < n; i++) {
			w0[i] = dt_f32_to_bf16_rne((float)(urand() * 2 - 1));
			g[i] = (float)((urand() * 2 - 1) * pow(2, 8 * urand() - 4));
		}
		enum { K = 3 }; /* this path, scalar, element by element */
		void *m[K], *v[K];
		uint16_t *w[K];
		float *c[K];
		for (int k = 0; k < K; k++) {
			zero_moments(fmt, n, &m[k], &v[k]);
			w[k] = malloc(n * 2);
			memcpy(w[k], w0, n * 2);
			c[k] = calloc(n, 4);
		}
		struct zinf_bf16master_opts b;
		zinf_bf16master_opts_init(&b);
		b.moments = fmt;
		b.seed = 7;
		b.index0 = index0;
		enum zinf_dtype cdt = copies[fi];
		for (int k = 0; k < 2; k++) {
			struct zinf_adam_opts o = exact_opts(lr, k ? "scalar" : path);
			cr_assert_eq(zinf_adam_step_bf16master(&o, 1, 1.0f, w[k], g, ZINF_F32, m[k],
							       v[k], n, c[k], cdt, &b),
				     0, "%s", zinf_last_error());
		}
		size_t cs = cdt == ZINF_F32 ? 4 : 2;
		struct zinf_adam_opts o = exact_opts(lr, path);
		for (size_t i = 0; fmt != ZINF_MOMENTS_Q8 && i < n; i++) {
			struct zinf_bf16master_opts bi = b;
			bi.index0 = index0 + i;
			size_t off = mbytes(fmt, i);
			cr_assert_eq(zinf_adam_step_bf16master(&o, 1, 1.0f, w[2] + i, g + i,
							       ZINF_F32, (char *)m[2] + off,
							       (char *)v[2] + off, 1,
							       (char *)c[2] + i * cs, cdt, &bi),
				     0, "%s", zinf_last_error());
		}
		const char *fn = format_name[fi];
		for (int k = 1; k < K; k++) {
			if (k == 2 && fmt == ZINF_MOMENTS_Q8) {
				continue;
			}
			const char *how = k == 1 ? "the scalar path" : "one element a call";
			for (size_t i = 0; i < n; i++) {
				size_t es = mbytes(fmt, 1) == 2 ? 2 : 4;
				cr_assert_eq(
					w[0][i], w[k][i],
					"%s: element %zu (index 2^32 %+lld): master 0x%04x, %s "
					"0x%04x",
					fn, i, (long long)(index0 + i - (1ull << 32)), w[0][i], how,
					w[k][i]);
				if (fmt != ZINF_MOMENTS_Q8) {
					cr_assert(!memcmp((char *)m[0] + i * es,
							  (char *)m[k] + i * es, es) &&
							  !memcmp((char *)v[0] + i * es,
								  (char *)v[k] + i * es, es),
						  "%s: element %zu (index 2^32 %+lld): moments "
						  "differ from %s",
						  fn, i, (long long)(index0 + i - (1ull << 32)),
						  how);
				}
				cr_assert(!memcmp((char *)c[0] + i * cs, (char *)c[k] + i * cs, cs),
					  "%s: element %zu: copy differs from %s", fn, i, how);
			}
		}
		if (fmt == ZINF_MOMENTS_Q8) {
			cr_assert(!memcmp(m[0], m[1], mbytes(fmt, n)) &&
					  !memcmp(v[0], v[1], mbytes(fmt, n)),
				  "q8: moments differ from the scalar path");
		}
		/* the premise: the floats are the exact options' (p -+ lr / 2, one rounding), and
		 * the masters rounded both ways, so the random bits decided */
		size_t up = 0, down = 0;
		for (size_t i = 0; i < n; i++) {
			float x = dt_bf16_to_f32(w0[i]) + (g[i] < 0 ? lr : -lr) * 0.5f, lo, hi;
			float got = dt_bf16_to_f32(w[0][i]);
			bf16_around(x, &lo, &hi);
			cr_assert(got == lo || got == hi,
				  "%s: element %zu: %.9g is not a neighbour "
				  "of %.9g",
				  fn, i, got, x);
			up += lo != hi && got == hi;
			down += lo != hi && got == lo;
		}
		cr_assert(up > n / 8 && down > n / 8, "%s: %zu up, %zu down of %zu", fn, up, down,
			  n);
		for (int k = 0; k < K; k++) {
			free(m[k]), free(v[k]), free(w[k]), free(c[k]);
		}
		free(w0), free(g);
	}
}

/*
 * Near the top of bf16's range: a finite master is never rounded up to infinity. The largest
 * finite bf16 is 0x7f7f (3.3895e38); floats above it up to FLT_MAX lie between it and infinity.
 * With the exact options, masters 0x7f7f and a gradient of sign -+ move by lr / 2 = d float ulps
 * (2^104 each) away from zero: floats 0x7f7f0000 + d. Stochastic rounding saturates: every one of
 * n elements gives +-0x7f7f for d = 1, 0x7fff, 0x8000 and 0xffff (FLT_MAX); without the saturation
 * about n d / 2^16 of them become infinity. Round to nearest overflows as IEEE does, from the
 * midpoint (d = 0x8000, a tie to the even infinity) up, not below. Below the top, 0x7f7e + lr / 2
 * still rounds both ways (the saturation touches nothing else); an infinite master stays infinite.
 */
Test(cpu_adam_bf16m, stochastic_rounding_saturates_at_the_largest_finite_bf16)
{
	const size_t n = 4096;
	const uint32_t ds[] = {1, 0x7fff, 0x8000, 0xffff};
	uint16_t *w = malloc(n * 2);
	float *g = malloc(n * 4), *m = malloc(n * 4), *v = malloc(n * 4);
	for (size_t i = 0; i < n; i++) {
		g[i] = i % 2 ? 0.25f : -3.0f; /* odd elements move down (the master is negative) */
	}
	for (int rnd = 0; rnd < 2; rnd++) {
		for (int di = 0; di < 4; di++) {
			uint32_t d = ds[di];
			for (size_t i = 0; i < n; i++) {
				w[i] = i % 2 ? 0xff7f : 0x7f7f;
			}
			memset(m, 0, n * 4), memset(v, 0, n * 4);
			struct zinf_adam_opts o =
				exact_opts(ldexpf((float)d, 105), zt_simd_variant());
			struct zinf_bf16master_opts b;
			zinf_bf16master_opts_init(&b);
			b.rounding = rnd ? ZINF_ROUND_NEAREST_EVEN : ZINF_ROUND_STOCHASTIC;
			b.seed = 3 + d;
			cr_assert_eq(zinf_adam_step_bf16master(&o, 1, 1.0f, w, g, ZINF_F32, m, v, n,
							       NULL, ZINF_BF16, &b),
				     0, "%s", zinf_last_error());
			uint16_t want = rnd && d >= 0x8000 ? 0x7f80 : 0x7f7f;
			for (size_t i = 0; i < n; i++) {
				cr_assert_eq(w[i], want | (i % 2 ? 0x8000 : 0),
					     "%s, float 0x%08x: element %zu gave 0x%04x",
					     rnd ? "nearest" : "stochastic",
					     (i % 2 ? 0xff7f0000u : 0x7f7f0000u) + d, i, w[i]);
			}
		}
	}
	/* one bf16 ulp below the top: 0x7f7e + half an ulp rounds up or down at random */
	for (size_t i = 0; i < n; i++) {
		w[i] = 0x7f7e;
		g[i] = -1.0f;
	}
	memset(m, 0, n * 4), memset(v, 0, n * 4);
	struct zinf_adam_opts o = exact_opts(0x1p120f, zt_simd_variant());
	cr_assert_eq(zinf_adam_step_bf16master(&o, 1, 1.0f, w, g, ZINF_F32, m, v, n, NULL,
					       ZINF_BF16, NULL),
		     0, "%s", zinf_last_error());
	size_t up = 0;
	for (size_t i = 0; i < n; i++) {
		cr_assert(w[i] == 0x7f7e || w[i] == 0x7f7f, "element %zu: 0x%04x", i, w[i]);
		up += w[i] == 0x7f7f;
	}
	cr_assert(up > n / 4 && up < 3 * n / 4, "0x7f7e + half an ulp: %zu of %zu up", up, n);
	/* infinities stay */
	for (size_t i = 0; i < n; i++) {
		w[i] = i % 2 ? 0xff80 : 0x7f80;
	}
	memset(m, 0, n * 4), memset(v, 0, n * 4);
	cr_assert_eq(zinf_adam_step_bf16master(&o, 1, 1.0f, w, g, ZINF_F32, m, v, n, NULL,
					       ZINF_BF16, NULL),
		     0, "%s", zinf_last_error());
	for (size_t i = 0; i < n; i++) {
		cr_assert_eq(w[i], i % 2 ? 0xff80 : 0x7f80, "element %zu: 0x%04x", i, w[i]);
	}
	free(w), free(g), free(m), free(v);
}

/*
 * The master's random bits and the bf16 moments' are independent streams: they were one hash
 * with keys that differ by an xor of a constant (0x632be5ab), i.e. the master's bits for index i
 * were the moments' for index i ^ 0x632be5ab. Read one bit of each stream per element: with the
 * exact options, lr 1 + 2^-8 and p = 0 make the master's float update +-(2^-1 + 2^-9), and
 * g = +-(1 + 2^-8) 2^k makes m = g / 2: both drop exactly 0x8000 of 2^16, so each rounds away
 * from zero exactly when bit 15 of its 16 random bits is set. Over 2^20 elements the master's
 * bit for i agrees with m's for i (same element) and for i ^ 0x632be5ab (a second call at that
 * index range) as often as chance: 1/2 within 6 sigma (sigma 0.5 / 2^10), where the old keys
 * agreed for every element of the second relation.
 */
Test(cpu_adam_bf16m, master_and_moment_random_bits_are_unrelated)
{
	const size_t n = (size_t)1 << 20;
	const uint64_t c = 0x632be5abull, A = 7ull << 20;
	const uint64_t starts[2] = {A, A ^ (c & ~(uint64_t)(n - 1))};
	uint8_t *mb[2], *wb[2];
	float *g = malloc(n * 4);
	for (size_t i = 0; i < n; i++) {
		g[i] = ldexpf(i % 2 ? -1.00390625f : 1.00390625f, (int)(i % 7) - 3);
	}
	uint16_t *w = malloc(n * 2), *m = malloc(n * 2), *v = malloc(n * 2);
	for (int k = 0; k < 2; k++) {
		memset(w, 0, n * 2), memset(m, 0, n * 2), memset(v, 0, n * 2);
		struct zinf_adam_opts o = exact_opts(1.00390625f, zt_simd_variant());
		struct zinf_bf16master_opts b;
		zinf_bf16master_opts_init(&b);
		b.moments = ZINF_MOMENTS_BF16;
		b.seed = 12345;
		b.index0 = starts[k];
		cr_assert_eq(zinf_adam_step_bf16master(&o, 1, 1.0f, w, g, ZINF_F32, m, v, n, NULL,
						       ZINF_BF16, &b),
			     0, "%s", zinf_last_error());
		mb[k] = malloc(n);
		wb[k] = malloc(n);
		for (size_t i = 0; i < n; i++) {
			uint16_t mt = (uint16_t)(dt_f2u(g[i] * 0.5f) >> 16); /* m truncated */
			cr_assert(w[i] == (g[i] < 0 ? 0x3f00 : 0xbf00) ||
					  w[i] == (g[i] < 0 ? 0x3f01 : 0xbf01),
				  "element %zu: master 0x%04x is not a neighbour of -+0.501953", i,
				  w[i]);
			cr_assert(m[i] == mt || m[i] == mt + 1, "element %zu: m 0x%04x", i, m[i]);
			wb[k][i] = (w[i] & 0x7fff) == 0x3f01;
			mb[k][i] = m[i] != mt;
		}
	}
	size_t same = 0, xored = 0, ones = 0;
	for (size_t i = 0; i < n; i++) {
		same += wb[0][i] == mb[0][i];
		xored += wb[0][i] == mb[1][i ^ (c & (n - 1))];
		ones += wb[0][i];
	}
	double sigma = 0.5 / sqrt((double)n), fs = (double)same / n, fx = (double)xored / n;
	cr_log_info("agreement: same element %.5f, index ^ 0x%llx %.5f, master bits set %.5f "
		    "(sigma %.5f)",
		    fs, (unsigned long long)c, fx, (double)ones / n, sigma);
	cr_assert(fabs((double)ones / n - 0.5) <= 6 * sigma, "master bit set in %zu of %zu", ones,
		  n);
	cr_assert(fabs(fs - 0.5) <= 6 * sigma, "same element: bits agree in %.5f", fs);
	cr_assert(fabs(fx - 0.5) <= 6 * sigma, "index ^ 0x%llx: bits agree in %.5f",
		  (unsigned long long)c, fx);
	for (int k = 0; k < 2; k++) {
		free(mb[k]), free(wb[k]);
	}
	free(g), free(w), free(m), free(v);
}

/* param_copy may be the master itself (bf16 parameters whose 16-bit copy is the master): the
 * same master, moments as with a copy of its own, which holds the master's bytes; each moments
 * format, a length with a tail (n % 16 != 0). */
Test(cpu_adam_bf16m, a_bf16_copy_that_is_the_master_holds_the_new_master)
{
	seed_rng(0x5eedb006);
	const size_t n = 3 * B + 29;
	for (int fi = 0; fi < 3; fi++) {
		enum zinf_moments fmt = formats[fi];
		struct fix f;
		fix_make(&f, n);
		void *m[2], *v[2];
		uint16_t *w[2];
		for (int k = 0; k < 2; k++) {
			moments_make(&f, fmt, &m[k], &v[k]);
			w[k] = malloc(n * 2);
			memcpy(w[k], f.w, n * 2);
		}
		uint16_t *c = calloc(n, 2);
		struct zinf_adam_opts o = adam_opts(true, 0.1f);
		struct zinf_bf16master_opts b;
		zinf_bf16master_opts_init(&b);
		b.moments = fmt;
		b.seed = 17;
		for (int64_t step = 1; step <= 2; step++) {
			cr_assert_eq(zinf_adam_step_bf16master(&o, step, 1.0f, w[0], f.g, ZINF_F32,
							       m[0], v[0], n, c, ZINF_BF16, &b),
				     0, "%s", zinf_last_error());
			cr_assert_eq(zinf_adam_step_bf16master(&o, step, 1.0f, w[1], f.g, ZINF_F32,
							       m[1], v[1], n, w[1], ZINF_BF16, &b),
				     0, "%s", zinf_last_error());
		}
		const char *fn = format_name[fi];
		cr_assert(!memcmp(c, w[0], n * 2), "%s: the copy is not the master", fn);
		cr_assert(!memcmp(w[0], w[1], n * 2), "%s: masters differ", fn);
		cr_assert(!memcmp(m[0], m[1], mbytes(fmt, n)) &&
				  !memcmp(v[0], v[1], mbytes(fmt, n)),
			  "%s: moments differ", fn);
		cr_assert(memcmp(w[0], f.w, n * 2), "%s: nothing moved", fn);
		for (int k = 0; k < 2; k++) {
			free(m[k]), free(v[k]), free(w[k]);
		}
		free(c);
		fix_free(&f);
	}
}

Test(cpu_adam_bf16m, bad_arguments_are_refused_and_write_nothing)
{
	uint16_t w[4] = {0x3f80, 0x3f80, 0x3f80, 0x3f80};
	float g[4] = {1, 1, 1, 1}, m[4] = {0}, v[4] = {0};
	struct zinf_adam_opts o = adam_opts(true, 0.1f);
	struct zinf_bf16master_opts b;
	zinf_bf16master_opts_init(&b);
	b.moments = 3;
	cr_assert_eq(zinf_adam_step_bf16master(&o, 1, 1, w, g, ZINF_F32, m, v, 4, NULL, 0, &b),
		     -EINVAL);
	cr_assert(strstr(zinf_last_error(), "unknown moments format 3"), "%s", zinf_last_error());
	zinf_bf16master_opts_init(&b);
	b.rounding = 5;
	cr_assert_eq(zinf_adam_step_bf16master(&o, 1, 1, w, g, ZINF_F32, m, v, 4, NULL, 0, &b),
		     -EINVAL);
	cr_assert(strstr(zinf_last_error(), "unknown master rounding 5"), "%s", zinf_last_error());
	zinf_bf16master_opts_init(&b);
	const uint64_t bad[] = {5, 9, 7, 12};
	b.no_decay = bad;
	b.n_no_decay = 2;
	cr_assert_eq(zinf_adam_step_bf16master(&o, 1, 1, w, g, ZINF_F32, m, v, 4, NULL, 0, &b),
		     -EINVAL);
	cr_assert(strstr(zinf_last_error(), "range 1 [7, 12) is not after"), "%s",
		  zinf_last_error());
	cr_assert_eq(zinf_adam_step_bf16master(&o, 1, 1, NULL, g, ZINF_F32, m, v, 4, NULL, 0, NULL),
		     -EINVAL);
	cr_assert_eq(zinf_adam_step_bf16master(&o, 0, 1, w, g, ZINF_F32, m, v, 4, NULL, 0, NULL),
		     -EINVAL);
	cr_assert(w[0] == 0x3f80 && w[3] == 0x3f80 && m[0] == 0 && v[3] == 0, "written on error");
}
