/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/gpt/test_gpt_matmul.c: the CPU layers' matrix products (examples/gpt/gpt_matmul.c, float)
 * as the trainer calls them (gpt_matmul_forward/backward: cblas_sgemm in a build with a BLAS)
 * and the plain C reference (gpt_matmul_*_ref), each against the exact product computed here in
 * float64, on shapes (N, C, OC) = rows, inputs, outputs: N = 1, C = 1, odd C and OC, OC past and
 * not a multiple of the 64-column blocks of db, a square one (where a transposed weight still has
 * the right shape), the default trainer's (N 512, C 64) and the model's (C 512, 4C 2048;
 * N cut to 256, enough for the BLAS to use its threads). Every output of the BLAS path runs at one
 * and at two OpenMP threads, and two calls at two threads must give the same bits. Outputs start
 * as NaN, so an output accumulated into instead of set, or an element left unwritten, fails.
 *
 * The bound. Each output is a sum of K products of floats (plus the bias: K + 1 terms); the
 * products of two floats are exact in float64, and float64's own summation error is below
 * K 2^-53 sum|terms|. In float32, any order of the additions, with or without fused
 * multiply-adds, errs by at most gamma_K sum|terms|, gamma_K = K u / (1 - K u), u = 2^-24
 * (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 3.1; an FMA only
 * removes roundings). So every element must satisfy
 *   |got - exact| <= (gamma_K + K 2^-52) sum_k |x_k y_k|   (K: OC for dinp, N for dw and db).
 * A wrong transpose flag, leading dimension or offset makes an element wrong by about its own
 * size, ~ sum|terms| / sqrt(K) for these random inputs, past the bound by a factor of at least
 * 1 / (sqrt(K) gamma_K) > 100 here.
 *
 * Randomised inputs in [-1, 1] with a printed seed (ZINF_TEST_SEED replays one). Plain program
 * (exit 0 / 1), label gpt.
 */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpt_matmul.h"

_Static_assert(sizeof(gpt_real) == sizeof(float), "the trainer's float products");

static uint64_t rng;

static float
urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((double)(rng >> 40) * 0x1.0p-23 - 1.0); /* [-1, 1), 24 bits */
}

static float *
randoms(size_t n)
{
	float *p = malloc(n * sizeof(float));
	for (size_t i = 0; p && i < n; i++) {
		p[i] = urand();
	}
	return p;
}

static float *
nans(size_t n)
{
	float *p = malloc(n * sizeof(float));
	for (size_t i = 0; p && i < n; i++) {
		p[i] = NAN;
	}
	return p;
}

/* The exact values (float64) and each one's sum of |terms|. */
struct exact {
	double *v, *abs;
	int K; /* terms per element (the bias counts as one) */
};

static int failures;

/* Every element within the bound; returns the largest error as a fraction of its bound. */
static double
check(const char *what, const char *path, int N, int C, int OC, const float *got,
      const struct exact *e, size_t n)
{
	double K = e->K, u = 0x1.0p-24;
	double gamma = K * u / (1 - K * u) + K * 0x1.0p-52;
	double worst = 0;
	size_t bad = 0, at = 0;
	for (size_t i = 0; i < n; i++) {
		double err = fabs((double)got[i] - e->v[i]), bound = gamma * e->abs[i];
		/* !(err <= bound) so that a NaN fails */
		if (!(err <= bound)) {
			if (!bad++) {
				at = i;
			}
		}
		double r = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0);
		worst = r > worst || isnan(r) ? r : worst;
	}
	if (bad) {
		printf("FAIL: %s %s (N %d, C %d, OC %d): %zu of %zu elements past the bound; first "
		       "[%zu]: %.9g, exact %.17g, bound %.3g\n",
		       path, what, N, C, OC, bad, n, at, got[at], e->v[at], gamma * e->abs[at]);
		failures++;
	}
	return worst;
}

static void
bits_equal(const char *what, const float *a, const float *b, size_t n, int N, int C, int OC)
{
	if (memcmp(a, b, n * sizeof(float))) {
		printf("FAIL: %s (N %d, C %d, OC %d): two calls at 2 threads differ\n", what, N, C,
		       OC);
		failures++;
	}
}

static int
shape(int N, int C, int OC)
{
	size_t nx = (size_t)N * C, nw = (size_t)OC * C, no = (size_t)N * OC;
	float *inp = randoms(nx), *w = randoms(nw), *b = randoms((size_t)OC), *dout = randoms(no);
	struct exact out = {malloc(no * sizeof(double)), malloc(no * sizeof(double)), C + 1};
	struct exact out0 = {malloc(no * sizeof(double)), malloc(no * sizeof(double)), C};
	struct exact dinp = {malloc(nx * sizeof(double)), malloc(nx * sizeof(double)), OC};
	struct exact dw = {malloc(nw * sizeof(double)), malloc(nw * sizeof(double)), N};
	struct exact db = {malloc(OC * sizeof(double)), malloc(OC * sizeof(double)), N};
	float *o = nans(no), *o2 = nans(no), *dx = nans(nx), *dx2 = nans(nx), *g = nans(nw),
	      *g2 = nans(nw), *gb = nans((size_t)OC), *gb2 = nans((size_t)OC);
	if (!inp || !w || !b || !dout || !out.v || !out.abs || !out0.v || !out0.abs || !dinp.v ||
	    !dinp.abs || !dw.v || !dw.abs || !db.v || !db.abs || !o || !o2 || !dx || !dx2 || !g ||
	    !g2 || !gb || !gb2) {
		printf("FAIL: out of memory\n");
		return -1;
	}

	/* the exact products, in float64 */
	for (int i = 0; i < N; i++) {
		for (int j = 0; j < OC; j++) {
			double s = 0, a = 0;
			for (int c = 0; c < C; c++) {
				double t = (double)inp[(size_t)i * C + c] * w[(size_t)j * C + c];
				s += t;
				a += fabs(t);
			}
			out0.v[(size_t)i * OC + j] = s;
			out0.abs[(size_t)i * OC + j] = a;
			out.v[(size_t)i * OC + j] = s + b[j];
			out.abs[(size_t)i * OC + j] = a + fabs(b[j]);
		}
	}
	for (int i = 0; i < N; i++) {
		for (int c = 0; c < C; c++) {
			double s = 0, a = 0;
			for (int j = 0; j < OC; j++) {
				double t = (double)dout[(size_t)i * OC + j] * w[(size_t)j * C + c];
				s += t;
				a += fabs(t);
			}
			dinp.v[(size_t)i * C + c] = s;
			dinp.abs[(size_t)i * C + c] = a;
		}
	}
	for (int j = 0; j < OC; j++) {
		double sb = 0, ab = 0;
		for (int c = 0; c < C; c++) {
			double s = 0, a = 0;
			for (int i = 0; i < N; i++) {
				double t =
					(double)dout[(size_t)i * OC + j] * inp[(size_t)i * C + c];
				s += t;
				a += fabs(t);
			}
			dw.v[(size_t)j * C + c] = s;
			dw.abs[(size_t)j * C + c] = a;
		}
		for (int i = 0; i < N; i++) {
			sb += dout[(size_t)i * OC + j];
			ab += fabs(dout[(size_t)i * OC + j]);
		}
		db.v[j] = sb;
		db.abs[j] = ab;
	}

	/* the reference */
	double r[6];
	gpt_matmul_forward_ref(o, inp, w, b, N, C, OC);
	r[0] = check("out", "reference", N, C, OC, o, &out, no);
	gpt_matmul_backward_ref(dx, g, gb, dout, inp, w, N, C, OC);
	r[1] = check("dinp", "reference", N, C, OC, dx, &dinp, nx);
	r[2] = check("dw", "reference", N, C, OC, g, &dw, nw);
	r[3] = check("db", "reference", N, C, OC, gb, &db, (size_t)OC);
	printf("  N %3d C %4d OC %4d %-9s max |err| / bound: out %.2g dinp %.2g dw %.2g db %.2g\n",
	       N, C, OC, "reference", r[0], r[1], r[2], r[3]);

	/* the layers' path (the BLAS where built), at 1 and 2 threads, outputs NaN again */
	for (int threads = 1; threads <= 2; threads++) {
		char path[16];
		snprintf(path, sizeof(path), "%s/%dt",
			 strcmp(gpt_matmul_impl, "cblas") ? "ref" : "cblas", threads);
		omp_set_num_threads(threads);
		for (size_t i = 0; i < no; i++) {
			o[i] = NAN;
		}
		for (size_t i = 0; i < nx; i++) {
			dx[i] = NAN;
		}
		for (size_t i = 0; i < nw; i++) {
			g[i] = NAN;
		}
		for (int i = 0; i < OC; i++) {
			gb[i] = NAN;
		}
		gpt_matmul_forward(o, inp, w, b, N, C, OC);
		r[0] = check("out", path, N, C, OC, o, &out, no);
		gpt_matmul_backward(dx, g, gb, dout, inp, w, N, C, OC);
		r[1] = check("dinp", path, N, C, OC, dx, &dinp, nx);
		r[2] = check("dw", path, N, C, OC, g, &dw, nw);
		r[3] = check("db", path, N, C, OC, gb, &db, (size_t)OC);
		/* without a bias (the head's logits) and without db (the head's backward) */
		for (size_t i = 0; i < no; i++) {
			o2[i] = NAN;
		}
		gpt_matmul_forward(o2, inp, w, NULL, N, C, OC);
		r[4] = check("out (b=0)", path, N, C, OC, o2, &out0, no);
		for (size_t i = 0; i < nw; i++) {
			g2[i] = NAN;
		}
		gpt_matmul_backward(dx2, g2, NULL, dout, inp, w, N, C, OC);
		r[5] = check("dw (db=0)", path, N, C, OC, g2, &dw, nw);
		printf("  N %3d C %4d OC %4d %-9s max |err| / bound: out %.2g dinp %.2g dw %.2g db "
		       "%.2g "
		       "(no b: out %.2g, no db: dw %.2g)\n",
		       N, C, OC, path, r[0], r[1], r[2], r[3], r[4], r[5]);
	}
	/* two calls with the same thread count: the same bits */
	gpt_matmul_forward(o2, inp, w, b, N, C, OC);
	bits_equal("out", o, o2, no, N, C, OC);
	gpt_matmul_backward(dx2, g2, gb2, dout, inp, w, N, C, OC);
	bits_equal("dinp", dx, dx2, nx, N, C, OC);
	bits_equal("dw", g, g2, nw, N, C, OC);
	bits_equal("db", gb, gb2, (size_t)OC, N, C, OC);

	free(inp), free(w), free(b), free(dout), free(o), free(o2), free(dx), free(dx2), free(g);
	free(g2), free(gb), free(gb2);
	struct exact *all[] = {&out, &out0, &dinp, &dw, &db};
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		free(all[i]->v), free(all[i]->abs);
	}
	return 0;
}

int
main(void)
{
	const char *s = getenv("ZINF_TEST_SEED");
	rng = s ? strtoull(s, NULL, 0) : 0x9e3779b97f4a7c15ull ^ (uint64_t)time(NULL);
	rng = rng ? rng : 1;
	printf("test_gpt_matmul: seed %#llx (ZINF_TEST_SEED replays it); products: %s\n",
	       (unsigned long long)rng, gpt_matmul_impl);
#ifdef GPT_HAVE_BLAS
	if (strcmp(gpt_matmul_impl, "cblas")) {
		printf("FAIL: built with a BLAS, but the products are the %s\n", gpt_matmul_impl);
		return 1;
	}
#endif
	static const int shapes[][3] = {
		{1, 7, 5},	   /* one row */
		{3, 1, 9},	   /* C = 1 */
		{13, 33, 17},	   /* odd everything */
		{37, 67, 129},	   /* OC past two db blocks, not a multiple of 64 */
		{64, 96, 96},	   /* square weight: a transposed one has the right shape */
		{512, 64, 192},	   /* the default trainer (B 16, T 32, C 64): qkv */
		{512, 256, 64},	   /* its fcproj */
		{256, 512, 1536},  /* the model (C 512): qkv */
		{256, 2048, 512},  /* its fcproj */
		{256, 512, 1024}}; /* its head (V 1024) */
	for (size_t i = 0; i < sizeof(shapes) / sizeof(shapes[0]); i++) {
		if (shape(shapes[i][0], shapes[i][1], shapes[i][2])) {
			return 1;
		}
	}
	printf("%s\n", failures ? "FAIL" : "PASS");
	return failures ? 1 : 0;
}
