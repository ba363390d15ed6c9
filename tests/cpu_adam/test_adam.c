/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/cpu_adam/test_adam.c: the CPU optimizers against float64 references, on the SIMD path
 * named by ZINF_TEST_VARIANT (scalar | avx2 | avx512; passed in opts.simd; a path this CPU lacks
 * is a visible skip).
 *
 * Tolerance. The reference runs the same formulas in float64 and, beside each value, carries a
 * first-order bound on the error that float32 arithmetic may have accumulated: every float op
 * contributes at most 4u relative (u = 2^-24; covers FMA-vs-separate rounding and the grad
 * conversion), and the errors of m, v, h, g and p are propagated through the step's formulas
 * (sqrt's sensitivity bounded by min(sqrt(e), e / (2 sqrt(x)))). A kernel passes when every
 * |float32 - float64| <= 2 x that bound. A wrong formula (bias correction, eps placement, decay
 * order) is off by a large fraction of the update, i.e. ~1e5-1e7 times the bound.
 * 16-bit copies are compared bit for bit with the round-to-nearest-even of the float32 result.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "common/util.h"
#include "cpu_adam/adam_internal.h"
#include "zinf/blocks/adam.h"

#define U (0x1p-24)

/* The name of a copy dtype, -1 meaning no copy. */
static const char *
copy_name(int cdt)
{
	return cdt < 0 ? "none" : zinf_dtype_name(cdt);
}

/* Store x in dtype (RNE) at g[i]; return the exact value stored. */
static double
put_grad(void *g, int dt, size_t i, float x)
{
	switch (dt) {
	case ZINF_F16:
		((uint16_t *)g)[i] = dt_f32_to_f16_rne(x);
		return dt_f16_to_f32(((uint16_t *)g)[i]);
	case ZINF_BF16:
		((uint16_t *)g)[i] = dt_f32_to_bf16_rne(x);
		return dt_bf16_to_f32(((uint16_t *)g)[i]);
	default:
		((float *)g)[i] = x;
		return x;
	}
}

static double
sqrt_err(double x, double e)
{
	double a = sqrt(e);
	if (x > 0) {
		double b = e / (2 * sqrt(x));
		a = b < a ? b : a;
	}
	return a;
}

/* A float buffer offset by one float from an aligned allocation: unaligned for every vector. */
struct ubuf {
	void *base;
	void *p;
};

static void *
ualloc(struct ubuf *b, size_t bytes, bool unaligned)
{
	b->base = zinf_alloc_aligned(64, bytes + 64);
	cr_assert_not_null(b->base);
	b->p = (char *)b->base + (unaligned ? 4 : 0);
	return b->p;
}

static void
ufree(struct ubuf *b)
{
	zinf_free_aligned(b->base);
}

/* The copy must be the RNE of the float32 parameters, bit for bit. */
static void
check_copy(const float *p, const void *copy, int cdt, size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++) {
		bool ok;
		if (cdt == ZINF_F32) {
			ok = memcmp(&((const float *)copy)[i], &p[i], 4) == 0;
		} else if (cdt == ZINF_F16) {
			ok = ((const uint16_t *)copy)[i] == dt_f32_to_f16_rne(p[i]);
		} else {
			ok = ((const uint16_t *)copy)[i] == dt_f32_to_bf16_rne(p[i]);
		}
		if (!ok) {
			cr_assert_fail("%s: copy (%s) of element %zu (p = %a) is not its RNE", what,
				       copy_name(cdt), i, p[i]);
		}
	}
}

/* ---- Adam ---------------------------------------------------------------------------------- */

struct adam_case {
	size_t n;
	int gdt, cdt; /* cdt -1: no copy */
	bool bias, adamw;
	float wd, grad_scale;
	int steps, threads;
	bool unaligned;
};

static void
run_adam(const struct adam_case *c, uint64_t *rng)
{
	char what[160];
	snprintf(what, sizeof(what),
		 "adam n=%zu grad=%s copy=%s bias=%d adamw=%d wd=%g scale=%g steps=%d", c->n,
		 zinf_dtype_name(c->gdt), copy_name(c->cdt), c->bias, c->adamw, c->wd,
		 c->grad_scale, c->steps);
	size_t n = c->n;
	struct ubuf bp, bm, bv, bg, bc;
	float *p = ualloc(&bp, n * 4, c->unaligned);
	float *m = ualloc(&bm, n * 4, c->unaligned);
	float *v = ualloc(&bv, n * 4, c->unaligned);
	void *g = ualloc(&bg, n * zinf_dtype_size(c->gdt), c->unaligned);
	void *cp = c->cdt >= 0 ? ualloc(&bc, n * zinf_dtype_size(c->cdt), c->unaligned) : NULL;
	double *rp = malloc(n * sizeof(double) * 6);
	cr_assert_not_null(rp);
	double *rm = rp + n, *rv = rp + 2 * n, *ep = rp + 3 * n, *em = rp + 4 * n, *ev = rp + 5 * n;
	for (size_t i = 0; i < n; i++) {
		p[i] = (float)zt_uniform(rng, -1, 1);
		m[i] = 0;
		v[i] = 0;
		rp[i] = p[i];
		rm[i] = rv[i] = ep[i] = em[i] = ev[i] = 0;
	}
	struct zinf_adam_opts o;
	zinf_adam_opts_init(&o);
	o.simd = zt_simd_variant();
	o.lr = 1e-2f;
	o.weight_decay = c->wd;
	o.adamw_mode = c->adamw;
	o.bias_correction = c->bias;
	o.threads = c->threads;
	double lr = o.lr, b1 = o.beta1, b2 = o.beta2, eps = o.eps, wd = o.weight_decay;
	double gs = c->grad_scale;
	for (int t = 1; t <= c->steps; t++) {
		/* Gradients of varied magnitude, some exactly zero. */
		for (size_t i = 0; i < n; i++) {
			double mag = ldexp(1.0, (int)(zt_rand(rng) % 12) - 6);
			float x = (zt_rand(rng) % 16 == 0)
					  ? 0.0f
					  : (float)(zt_uniform(rng, -1, 1) * mag / gs);
			double gv = put_grad(g, c->gdt, i, x);
			/* reference step, float64, with its error bound */
			double gg = gv * gs, eg = 4 * U * fabs(gg);
			if (!c->adamw && wd != 0) {
				gg += wd * rp[i];
				eg += wd * ep[i] + 4 * U * fabs(gg);
			}
			double pp = rp[i], epp = ep[i];
			if (c->adamw) {
				pp *= 1.0 - lr * wd;
				epp = epp * (1.0 - lr * wd) + 4 * U * fabs(pp);
			}
			double mm = b1 * rm[i] + (1 - b1) * gg;
			em[i] = b1 * em[i] + (1 - b1) * eg +
				4 * U * (fabs(b1 * rm[i]) + fabs((1 - b1) * gg));
			double vv = b2 * rv[i] + (1 - b2) * gg * gg;
			ev[i] = b2 * ev[i] + (1 - b2) * 2 * fabs(gg) * eg + (1 - b2) * eg * eg +
				4 * U * (b2 * rv[i] + (1 - b2) * gg * gg);
			double step_size = lr, bc2s = 1;
			if (c->bias) {
				step_size = lr / (1 - pow(b1, t));
				bc2s = sqrt(1 - pow(b2, t));
			}
			double denom = sqrt(vv) / bc2s + eps;
			double edenom = sqrt_err(vv, ev[i]) / bc2s + 4 * U * denom;
			double upd = step_size * mm / denom;
			double eupd =
				step_size * (em[i] / denom + fabs(mm) * edenom / (denom * denom)) +
				4 * U * fabs(upd) + 4 * U * step_size * fabs(mm) / denom;
			rp[i] = pp - upd;
			ep[i] = epp + eupd + 4 * U * fabs(rp[i]);
			rm[i] = mm;
			rv[i] = vv;
		}
		int r = zinf_adam_step(&o, t, c->grad_scale, p, g, c->gdt, m, v, n, cp,
				       c->cdt >= 0 ? c->cdt : ZINF_BF16);
		cr_assert_eq(r, 0, "%s: step %d returned %d (%s)", what, t, r, zinf_last_error());
		if (cp) {
			check_copy(p, cp, c->cdt, n, what);
		}
	}
	for (size_t i = 0; i < n; i++) {
		if (!(fabs(p[i] - rp[i]) <= 2 * ep[i]) || !(fabs(m[i] - rm[i]) <= 2 * em[i]) ||
		    !(fabs(v[i] - rv[i]) <= 2 * ev[i])) {
			cr_assert_fail(
				"%s: element %zu: p %.9g ref %.9g (bound %.3g) m %.9g ref %.9g "
				"(bound %.3g) v %.9g ref %.9g (bound %.3g)",
				what, i, p[i], rp[i], 2 * ep[i], m[i], rm[i], 2 * em[i], v[i],
				rv[i], 2 * ev[i]);
		}
	}
	free(rp);
	ufree(&bp);
	ufree(&bm);
	ufree(&bv);
	ufree(&bg);
	if (cp) {
		ufree(&bc);
	}
}

Test(cpu_adam, adam_matches_float64_small_sizes)
{
	zt_simd_variant(); /* skips where the path cannot run */
	uint64_t rng = zt_seed();
	static const size_t sizes[] = {1, 15, 17, 100};
	for (size_t si = 0; si < ZINF_ARRAY_SIZE(sizes); si++) {
		for (int gdt = 0; gdt < 3; gdt++) {
			for (int cdt = -1; cdt < 3; cdt++) {
				for (int k = 0; k < 8; k++) {
					struct adam_case c = {
						.n = sizes[si],
						.gdt = gdt,
						.cdt = cdt,
						.bias = k & 1,
						.adamw = k & 2,
						.wd = (k & 4) ? 0.05f : 0.0f,
						.grad_scale = (k & 1) ? 1.0f : 1.0f / 1024,
						.steps = 40,
						.threads = 2,
						.unaligned = si & 1,
					};
					run_adam(&c, &rng);
				}
			}
		}
	}
}

Test(cpu_adam, adam_matches_float64_large_unaligned)
{
	zt_simd_variant(); /* skips where the path cannot run */
	uint64_t rng = zt_seed() + 1;
	/* 1000003 elements, pointers offset by one float, a few steps per configuration. */
	for (int gdt = 0; gdt < 3; gdt++) {
		struct adam_case c = {
			.n = 1000003,
			.gdt = gdt,
			.cdt = gdt == ZINF_F32 ? ZINF_BF16 : gdt,
			.bias = true,
			.adamw = gdt != ZINF_F16,
			.wd = 0.01f,
			.grad_scale = 1.0f / 256,
			.steps = 2,
			.threads = 2,
			.unaligned = true,
		};
		run_adam(&c, &rng);
	}
	struct adam_case c = {
		.n = 1000003,
		.gdt = ZINF_F32,
		.cdt = -1,
		.bias = false,
		.adamw = false,
		.wd = 0,
		.grad_scale = 3.0f,
		.steps = 2,
		.threads = 0,
		.unaligned = true,
	};
	run_adam(&c, &rng);
}

/* ---- Adagrad ------------------------------------------------------------------------------- */

static void
run_adagrad(size_t n, int gdt, int cdt, float wd, float lr_decay, float gs_f, int steps,
	    uint64_t *rng)
{
	char what[128];
	snprintf(what, sizeof(what), "adagrad n=%zu grad=%s copy=%s wd=%g lr_decay=%g scale=%g", n,
		 zinf_dtype_name(gdt), copy_name(cdt), wd, lr_decay, gs_f);
	struct ubuf bp, bh, bg, bc;
	float *p = ualloc(&bp, n * 4, true), *h = ualloc(&bh, n * 4, true);
	void *g = ualloc(&bg, n * zinf_dtype_size(gdt), true);
	void *cp = cdt >= 0 ? ualloc(&bc, n * zinf_dtype_size(cdt), true) : NULL;
	double *rp = malloc(n * sizeof(double) * 4);
	cr_assert_not_null(rp);
	double *rh = rp + n, *ep = rp + 2 * n, *eh = rp + 3 * n;
	for (size_t i = 0; i < n; i++) {
		p[i] = (float)zt_uniform(rng, -1, 1);
		h[i] = (float)zt_uniform(rng, 0, 0.1); /* initial accumulator value */
		rp[i] = p[i];
		rh[i] = h[i];
		ep[i] = eh[i] = 0;
	}
	struct zinf_adagrad_opts o;
	zinf_adagrad_opts_init(&o);
	o.simd = zt_simd_variant();
	o.weight_decay = wd;
	o.lr_decay = lr_decay;
	o.threads = 2;
	double gs = gs_f;
	for (int t = 1; t <= steps; t++) {
		double clr = (double)o.lr / (1 + (t - 1) * (double)o.lr_decay);
		for (size_t i = 0; i < n; i++) {
			float x = (float)(zt_uniform(rng, -1, 1) / gs);
			double gg = put_grad(g, gdt, i, x) * gs, eg = 4 * U * fabs(gg);
			if (wd != 0) {
				gg += (double)o.weight_decay * rp[i];
				eg += o.weight_decay * ep[i] + 4 * U * fabs(gg);
			}
			double hh = rh[i] + gg * gg;
			eh[i] += 2 * fabs(gg) * eg + eg * eg + 4 * U * hh;
			double std = sqrt(hh) + o.eps;
			double estd = sqrt_err(hh, eh[i]) + 4 * U * std;
			double upd = clr * gg / std;
			double eupd = clr * (eg / std + fabs(gg) * estd / (std * std)) +
				      8 * U * fabs(upd);
			rp[i] -= upd;
			ep[i] += eupd + 4 * U * fabs(rp[i]);
			rh[i] = hh;
		}
		int r = zinf_adagrad_step(&o, t, gs_f, p, g, gdt, h, n, cp, cdt >= 0 ? cdt : 0);
		cr_assert_eq(r, 0, "%s: %s", what, zinf_last_error());
		if (cp) {
			check_copy(p, cp, cdt, n, what);
		}
	}
	for (size_t i = 0; i < n; i++) {
		if (!(fabs(p[i] - rp[i]) <= 2 * ep[i]) || !(fabs(h[i] - rh[i]) <= 2 * eh[i])) {
			cr_assert_fail(
				"%s: element %zu: p %.9g ref %.9g (bound %.3g) h %.9g ref %.9g "
				"(bound %.3g)",
				what, i, p[i], rp[i], 2 * ep[i], h[i], rh[i], 2 * eh[i]);
		}
	}
	free(rp);
	ufree(&bp);
	ufree(&bh);
	ufree(&bg);
	if (cp) {
		ufree(&bc);
	}
}

Test(cpu_adam, adagrad_matches_float64)
{
	zt_simd_variant(); /* skips where the path cannot run */
	uint64_t rng = zt_seed() + 2;
	static const size_t sizes[] = {1, 15, 17, 1000};
	for (size_t si = 0; si < ZINF_ARRAY_SIZE(sizes); si++) {
		for (int gdt = 0; gdt < 3; gdt++) {
			for (int cdt = -1; cdt < 3; cdt++) {
				run_adagrad(sizes[si], gdt, cdt, (cdt & 1) ? 0.01f : 0,
					    si & 1 ? 0.1f : 0, gdt == ZINF_F32 ? 0.5f : 1.0f, 30,
					    &rng);
			}
		}
	}
	run_adagrad(1000003, ZINF_F16, ZINF_BF16, 0.01f, 0.01f, 1.0f / 256, 2, &rng);
}

/* ---- Lion ---------------------------------------------------------------------------------- */

static void
run_lion(size_t n, int gdt, int cdt, float wd, float gs_f, int steps, uint64_t *rng)
{
	char what[128];
	snprintf(what, sizeof(what), "lion n=%zu grad=%s copy=%s wd=%g scale=%g", n,
		 zinf_dtype_name(gdt), copy_name(cdt), wd, gs_f);
	struct ubuf bp, bm, bg, bc;
	float *p = ualloc(&bp, n * 4, true), *m = ualloc(&bm, n * 4, true);
	void *g = ualloc(&bg, n * zinf_dtype_size(gdt), true);
	void *cp = cdt >= 0 ? ualloc(&bc, n * zinf_dtype_size(cdt), true) : NULL;
	double *rp = malloc(n * sizeof(double) * 4);
	cr_assert_not_null(rp);
	double *rm = rp + n, *ep = rp + 2 * n, *em = rp + 3 * n;
	for (size_t i = 0; i < n; i++) {
		p[i] = (float)zt_uniform(rng, -1, 1);
		m[i] = (float)zt_uniform(rng, -0.01, 0.01);
		rp[i] = p[i];
		rm[i] = m[i];
		ep[i] = em[i] = 0;
	}
	struct zinf_lion_opts o;
	zinf_lion_opts_init(&o);
	o.simd = zt_simd_variant();
	o.lr = 1e-3f;
	o.weight_decay = wd;
	o.threads = 2;
	double lr = o.lr, b1 = o.beta1, b2 = o.beta2, gs = gs_f;
	for (int t = 1; t <= steps; t++) {
		for (size_t i = 0; i < n; i++) {
			float x = (zt_rand(rng) % 16 == 0) ? 0.0f
							   : (float)(zt_uniform(rng, -1, 1) / gs);
			double gg = put_grad(g, gdt, i, x) * gs, eg = 4 * U * fabs(gg);
			double pp = rp[i] * (1 - lr * (double)o.weight_decay);
			double epp = ep[i] + 4 * U * fabs(pp);
			double cc = b1 * rm[i] + (1 - b1) * gg;
			double ec = b1 * em[i] + (1 - b1) * eg +
				    4 * U * (fabs(b1 * rm[i]) + fabs((1 - b1) * gg));
			double s = cc > 0 ? 1 : cc < 0 ? -1 : 0;
			if (fabs(cc) <= 2 * ec && ec > 0) {
				epp += 2 *
				       lr; /* sign within rounding of 0: either answer is right */
			}
			rp[i] = pp - lr * s;
			ep[i] = epp + 4 * U * (fabs(rp[i]) + lr);
			double mm = b2 * rm[i] + (1 - b2) * gg;
			em[i] = b2 * em[i] + (1 - b2) * eg +
				4 * U * (fabs(b2 * rm[i]) + fabs((1 - b2) * gg));
			rm[i] = mm;
		}
		int r = zinf_lion_step(&o, t, gs_f, p, g, gdt, m, n, cp, cdt >= 0 ? cdt : 0);
		cr_assert_eq(r, 0, "%s: %s", what, zinf_last_error());
		if (cp) {
			check_copy(p, cp, cdt, n, what);
		}
	}
	for (size_t i = 0; i < n; i++) {
		if (!(fabs(p[i] - rp[i]) <= 2 * ep[i]) || !(fabs(m[i] - rm[i]) <= 2 * em[i])) {
			cr_assert_fail(
				"%s: element %zu: p %.9g ref %.9g (bound %.3g) m %.9g ref %.9g "
				"(bound %.3g)",
				what, i, p[i], rp[i], 2 * ep[i], m[i], rm[i], 2 * em[i]);
		}
	}
	free(rp);
	ufree(&bp);
	ufree(&bm);
	ufree(&bg);
	if (cp) {
		ufree(&bc);
	}
}

Test(cpu_adam, lion_matches_float64)
{
	zt_simd_variant(); /* skips where the path cannot run */
	uint64_t rng = zt_seed() + 3;
	static const size_t sizes[] = {1, 15, 17, 1000};
	for (size_t si = 0; si < ZINF_ARRAY_SIZE(sizes); si++) {
		for (int gdt = 0; gdt < 3; gdt++) {
			for (int cdt = -1; cdt < 3; cdt++) {
				run_lion(sizes[si], gdt, cdt, (cdt & 1) ? 0.1f : 0,
					 gdt == ZINF_F32 ? 0.25f : 1.0f, 30, &rng);
			}
		}
	}
	run_lion(1000003, ZINF_BF16, ZINF_F16, 0.1f, 1.0f / 128, 2, &rng);
}
