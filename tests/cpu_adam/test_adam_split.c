/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/cpu_adam/test_adam_split.c: an element's result does not depend on where it sits.
 * On the SIMD path named by ZINF_TEST_VARIANT, for every optimizer, grad dtype and copy dtype:
 * one call over n elements must equal, bit for bit (param, m, v, copy), the same step done as
 * calls over random consecutive pieces of the same arrays (lengths 1 .. 17 and longer, so pieces
 * start and end at every lane position of an 8- or 16-float vector; in one round n spans more
 * than two tiles, the whole call runs on two threads and pieces reach 5000 elements), and the
 * same call with each array's pointer offset by 1 .. 7 elements. The offload engine steps
 * sub-groups whose boundaries are not multiples of the vector width and must match an in-memory
 * step exactly. Stochastic rounding of bf16 state hashes the element's index within the call, so
 * only the pointer-offset half applies to it. The gradient conversions (unscale in place, fp32 ->
 * 16-bit copy) are checked the same way.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "common/util.h"
#include "cpu_adam/adam_internal.h"
#include "cpu_adam/adam_bench.h"
#include "zinf/blocks/adam.h"

enum opt { OPT_ADAM, OPT_ADAMW, OPT_BF16_RNE, OPT_BF16_SR, OPT_ADAGRAD, OPT_LION, OPT_N };

static const char *const opt_name[OPT_N] = {"adam-l2",		 "adamw",   "adam-bf16state-rne",
					    "adam-bf16state-sr", "adagrad", "lion"};

#define NONE (-1)
#define PAD  8 /* elements of slack after each array, for the pointer offsets */

/* One step's arrays: a pointer per array (NULL where the optimizer has none). */
struct arrs {
	float *p;
	void *g, *m, *v, *c;
};

static size_t
state_size(int opt)
{
	return opt == OPT_BF16_RNE || opt == OPT_BF16_SR ? 2 : 4;
}

static bool
has_m(int opt)
{
	return opt != OPT_ADAGRAD;
}

static bool
has_v(int opt)
{
	return opt != OPT_LION;
}

/* Elements [i0, i0 + n) of x, as the arrays of a call. */
static struct arrs
piece(const struct arrs *x, int opt, int gdt, int cdt, size_t i0)
{
	size_t ss = state_size(opt);
	struct arrs r = {
		.p = x->p + i0,
		.g = (char *)x->g + i0 * zinf_dtype_size(gdt),
		.m = x->m ? (char *)x->m + i0 * ss : NULL,
		.v = x->v ? (char *)x->v + i0 * ss : NULL,
		.c = cdt == NONE ? NULL : (char *)x->c + i0 * zinf_dtype_size(cdt),
	};
	return r;
}

static int g_threads = 1; /* threads of the next step() */

static void
step(int opt, const struct arrs *x, int gdt, int cdt, size_t n, int64_t t)
{
	int r;
	enum zinf_dtype cd = cdt == NONE ? ZINF_F32 : (enum zinf_dtype)cdt;
	if (opt <= OPT_BF16_SR) {
		struct zinf_adam_opts o;
		zinf_adam_opts_init(&o);
		o.simd = zt_simd_variant();
		o.lr = 1e-2f;
		o.weight_decay = 0.05f;
		o.adamw_mode = opt != OPT_ADAM;
		o.threads = g_threads;
		if (opt <= OPT_ADAMW) {
			r = zinf_adam_step(&o, t, 0.75f, x->p, x->g, gdt, x->m, x->v, n, x->c, cd);
		} else {
			r = zinf_adam_step_bf16state(&o, t, 0.75f, x->p, x->g, gdt, x->m, x->v, n,
						     x->c, cd,
						     opt == OPT_BF16_SR ? ZINF_ROUND_STOCHASTIC
									: ZINF_ROUND_NEAREST_EVEN,
						     99);
		}
	} else if (opt == OPT_ADAGRAD) {
		struct zinf_adagrad_opts o;
		zinf_adagrad_opts_init(&o);
		o.simd = zt_simd_variant();
		o.weight_decay = 0.05f;
		o.lr_decay = 0.01f;
		o.threads = g_threads;
		r = zinf_adagrad_step(&o, t, 0.75f, x->p, x->g, gdt, x->v, n, x->c, cd);
	} else {
		struct zinf_lion_opts o;
		zinf_lion_opts_init(&o);
		o.simd = zt_simd_variant();
		o.weight_decay = 0.05f;
		o.threads = g_threads;
		r = zinf_lion_step(&o, t, 0.75f, x->p, x->g, gdt, x->m, n, x->c, cd);
	}
	cr_assert_eq(r, 0, "%s step: %s", opt_name[opt], zinf_last_error());
}

/* Buffers for n elements (+ PAD), filled from the same seed for every call with that seed. */
struct bufs {
	float *p;
	void *g, *m, *v, *c;
};

static void *
xalloc(size_t bytes)
{
	void *p = zinf_alloc_aligned(64, bytes);
	cr_assert_not_null(p);
	return p;
}

static void
bufs_alloc(struct bufs *b, size_t n)
{
	b->p = xalloc((n + PAD) * 4);
	b->g = xalloc((n + PAD) * 4);
	b->m = xalloc((n + PAD) * 4);
	b->v = xalloc((n + PAD) * 4);
	b->c = xalloc((n + PAD) * 4);
}

static void
bufs_free(struct bufs *b)
{
	zinf_free_aligned(b->p);
	zinf_free_aligned(b->g);
	zinf_free_aligned(b->m);
	zinf_free_aligned(b->v);
	zinf_free_aligned(b->c);
}

/* The arrays at element offsets off[0..4] into b, filled with the values of `seed`. */
static struct arrs
fill(struct bufs *b, int opt, int gdt, int cdt, size_t n, const size_t off[5], uint64_t seed)
{
	uint64_t st = seed;
	size_t ss = state_size(opt);
	struct arrs x = {
		.p = b->p + off[0],
		.g = (char *)b->g + off[1] * zinf_dtype_size(gdt),
		.m = has_m(opt) ? (char *)b->m + off[2] * ss : NULL,
		.v = has_v(opt) ? (char *)b->v + off[3] * ss : NULL,
		.c = cdt == NONE ? NULL : (char *)b->c + off[4] * zinf_dtype_size(cdt),
	};
	for (size_t i = 0; i < n; i++) {
		x.p[i] = (float)zt_uniform(&st, -1, 1);
		float g = (float)zt_uniform(&st, -2, 2);
		/* a few exact zeros and tiny values: sign(0) in Lion, subnormal copies */
		if (i % 29 == 3) {
			g = 0;
		}
		if (gdt == ZINF_F32) {
			((float *)x.g)[i] = g;
		} else if (gdt == ZINF_F16) {
			((uint16_t *)x.g)[i] = dt_f32_to_f16_rne(g);
		} else {
			((uint16_t *)x.g)[i] = dt_f32_to_bf16_rne(g);
		}
		float m = (float)zt_uniform(&st, -0.2, 0.2);
		float v = (float)zt_uniform(&st, 0, 0.05);
		if (ss == 2) {
			((uint16_t *)x.m)[i] = dt_f32_to_bf16_rne(m);
			((uint16_t *)x.v)[i] = dt_f32_to_bf16_rne(v);
		} else {
			if (x.m) {
				((float *)x.m)[i] = m;
			}
			if (x.v) {
				((float *)x.v)[i] = v;
			}
		}
		if (x.c) {
			memset((char *)x.c + i * zinf_dtype_size(cdt), 0xa5, zinf_dtype_size(cdt));
		}
	}
	return x;
}

static void
same(const char *what, const void *a, const void *b, size_t n, size_t es, const char *ctx)
{
	if (!a) {
		return;
	}
	for (size_t i = 0; i < n; i++) {
		if (memcmp((const char *)a + i * es, (const char *)b + i * es, es) != 0) {
			uint32_t x = 0, y = 0;
			memcpy(&x, (const char *)a + i * es, es);
			memcpy(&y, (const char *)b + i * es, es);
			cr_assert_fail("%s: %s differs at element %zu of %zu: 0x%08x vs 0x%08x",
				       ctx, what, i, n, x, y);
			return;
		}
	}
}

static void
arrs_same(const struct arrs *a, const struct arrs *b, int opt, int gdt, int cdt, size_t n,
	  const char *ctx)
{
	(void)gdt;
	same("param", a->p, b->p, n, 4, ctx);
	same("m", a->m, b->m, n, state_size(opt), ctx);
	same("v", a->v, b->v, n, state_size(opt), ctx);
	if (cdt != NONE) {
		same("copy", a->c, b->c, n, zinf_dtype_size(cdt), ctx);
	}
}

/* One optimizer x grad dtype x copy dtype: the whole call vs pieces vs pointer offsets. */
static void
check_case(int round, int opt, int gdt, int cdt, uint64_t *rs, struct bufs *whole,
	   struct bufs *other)
{
	const size_t zero[5] = {0, 0, 0, 0, 0};
	size_t n = 300 + zt_rand(rs) % 400 + (round == 2 ? 2 * ZINF_ADAM_TILE : 0);
	size_t maxlen = round == 2 ? 5000 : 100;
	uint64_t vs = zt_rand(rs);
	int64_t t = 1 + (int64_t)(zt_rand(rs) % 5);
	char ctx[160];
	struct arrs w = fill(whole, opt, gdt, cdt, n, zero, vs);
	g_threads = round == 2 ? 2 : 1;
	step(opt, &w, gdt, cdt, n, t);
	g_threads = 1;

	/* the same step over random consecutive pieces */
	if (opt != OPT_BF16_SR) {
		struct arrs s = fill(other, opt, gdt, cdt, n, zero, vs);
		size_t i = 0, npieces = 0;
		while (i < n) {
			size_t len = zt_rand(rs) % 4 == 0 ? 18 + zt_rand(rs) % maxlen
							  : 1 + zt_rand(rs) % 17;
			len = ZINF_MIN(len, n - i);
			struct arrs p = piece(&s, opt, gdt, cdt, i);
			step(opt, &p, gdt, cdt, len, t);
			i += len;
			npieces++;
		}
		snprintf(ctx, sizeof(ctx),
			 "round %d %s grad %d copy %d n %zu step %lld: %zu pieces", round,
			 opt_name[opt], gdt, cdt, n, (long long)t, npieces);
		arrs_same(&w, &s, opt, gdt, cdt, n, ctx);
	}

	/* the same call with every pointer moved by 1..7 elements */
	for (size_t k = 1; k <= 7; k++) {
		size_t off[5];
		for (int j = 0; j < 5; j++) {
			off[j] = 1 + (k - 1 + 3 * (size_t)j) % 7;
		}
		struct arrs o = fill(other, opt, gdt, cdt, n, off, vs);
		step(opt, &o, gdt, cdt, n, t);
		snprintf(ctx, sizeof(ctx),
			 "round %d %s grad %d copy %d n %zu step %lld: offsets %zu,%zu,%zu,%zu,%zu",
			 round, opt_name[opt], gdt, cdt, n, (long long)t, off[0], off[1], off[2],
			 off[3], off[4]);
		arrs_same(&w, &o, opt, gdt, cdt, n, ctx);
	}
}

Test(cpu_adam, element_result_does_not_depend_on_cuts_or_alignment)
{
	zt_simd_variant(); /* skips where the path cannot run */
	uint64_t rs = zt_seed() ^ 0x5b17u;
	const int cdts[4] = {NONE, ZINF_F32, ZINF_F16, ZINF_BF16};
	struct bufs whole, other;
	bufs_alloc(&whole, 2 * ZINF_ADAM_TILE + 700);
	bufs_alloc(&other, 2 * ZINF_ADAM_TILE + 700);
	/* rounds 0, 1: n in [300, 700), one thread; round 2: n > 2 tiles, the whole call on two
	 * threads, pieces of 1..17 and up to 5000 elements across tile boundaries */
	for (int round = 0; round < 3; round++) {
		for (int opt = 0; opt < OPT_N; opt++) {
			for (int gdt = ZINF_F32; gdt <= ZINF_BF16; gdt++) {
				for (int ci = 0; ci < 4; ci++) {
					check_case(round, opt, gdt, cdts[ci], &rs, &whole, &other);
				}
			}
		}
	}
	bufs_free(&whole);
	bufs_free(&other);
}

/* The separate passes of the three-pass flow: unscale in place and fp32 -> 16-bit conversion. */
Test(cpu_adam, conversions_do_not_depend_on_cuts_or_alignment)
{
	struct zinf_grad_opts go;
	zinf_grad_opts_init(&go);
	go.simd = zt_simd_variant();
	go.threads = 1;
	uint64_t seed = zt_seed() + 7;
	uint64_t rs = seed;
	const size_t n = 517;
	for (int dt = ZINF_F32; dt <= ZINF_BF16; dt++) {
		size_t es = zinf_dtype_size(dt);
		char *g0 = xalloc((n + PAD) * 4), *g1 = xalloc((n + PAD) * 4);
		float *src = xalloc((n + PAD) * 4);
		char *d0 = xalloc((n + PAD) * 4), *d1 = xalloc((n + PAD) * 4);
		for (size_t i = 0; i < n; i++) {
			float x = (float)zt_uniform(&rs, -70000, 70000);
			if (i % 13 == 5) {
				x *= 0x1p-130f; /* subnormal */
			}
			src[i] = x;
			float y = x * 0x1p-20f;
			if (dt == ZINF_F32) {
				((float *)g0)[i] = y;
			} else if (dt == ZINF_F16) {
				((uint16_t *)g0)[i] = dt_f32_to_f16_rne(y);
			} else {
				((uint16_t *)g0)[i] = dt_f32_to_bf16_rne(y);
			}
		}
		for (size_t k = 0; k <= 7; k++) {
			/* whole (k == 0) or cut into pieces of 1..17 at offset k */
			memcpy(g1 + k * es, g0, n * es);
			if (k == 0) {
				cr_assert_eq(adam_unscale(g1, dt, n, 0.3f, &go), 0);
				cr_assert_eq(adam_convert(src, d0, dt, n, &go), 0);
				memcpy(d1, g1, n * es); /* d1: the whole-call unscale */
				continue;
			}
			size_t i = 0;
			while (i < n) {
				size_t len = 1 + zt_rand(&rs) % 17; /* ZINF_MIN evaluates twice */
				len = ZINF_MIN(len, n - i);
				cr_assert_eq(adam_unscale(g1 + (k + i) * es, dt, len, 0.3f, &go),
					     0);
				i += len;
			}
			cr_assert(memcmp(g1 + k * es, d1, n * es) == 0,
				  "unscale dtype %d offset %zu: pieces differ from one call", dt,
				  k);
			float *s1 = src; /* convert: destination offset k, pieces */
			char *out = xalloc((n + PAD) * 4);
			i = 0;
			while (i < n) {
				size_t len = 1 + zt_rand(&rs) % 17; /* ZINF_MIN evaluates twice */
				len = ZINF_MIN(len, n - i);
				cr_assert_eq(adam_convert(s1 + i, out + (k + i) * es, dt, len, &go),
					     0);
				i += len;
			}
			cr_assert(memcmp(out + k * es, d0, n * es) == 0,
				  "convert dtype %d offset %zu: pieces differ from one call", dt,
				  k);
			zinf_free_aligned(out);
		}
		zinf_free_aligned(g0);
		zinf_free_aligned(g1);
		zinf_free_aligned(src);
		zinf_free_aligned(d0);
		zinf_free_aligned(d1);
	}
}

/* ---- known answer: the same bits in every build type ---------------------------------------- */

static uint64_t
fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *c = p;
	for (size_t i = 0; i < n; i++) {
		h ^= c[i];
		h *= 1099511628211ull;
	}
	return h;
}

static float
lcg(uint64_t *st)
{
	*st = *st * 6364136223846793005ull + 1442695040888963407ull;
	return (float)((*st >> 40) / 16777216.0) * 2 - 1;
}

/*
 * Three steps of each optimizer over fixed data (a fixed LCG, no seed), two threads, arrays at
 * odd offsets, hashed. The hash was recorded from the RelWithDebInfo build and reproduced by the
 * Debug+ASan build; before commit 7f63c9e the avx2 path gave different hashes in the two builds
 * (FMA contraction of the scalar tail and of mul+add intrinsics at -O2 only). Every operation
 * here is correctly rounded IEEE (no fast-math), so any compiler that honours -ffp-contract=off
 * gives these bits; a deliberate change of a kernel's arithmetic must update them.
 *
 * avx2 and avx512 have one hash: both are adam_simd_body.h over a width layer, with FMA at the
 * same places, the same 1 / bc2_sqrt and the same element-wise rounding (bf16 round-to-nearest-
 * even by the integers or by vcvtneps2bf16 patched for subnormals, stochastic rounding hashed on
 * the element index), so an element's bits do not depend on the vector width (cpu_adam/README.md,
 * "Threads and rounding"). The avx512 value was computed on a CPU with AVX512-BF16 (the
 * instruction's path) and equals avx2's. A path with no recorded hash fails: record it.
 */
#define KNOWN_ANSWER_VECTOR 0x7ac08b61c79fb942ull

Test(cpu_adam, known_answer_is_the_same_in_every_build)
{
	const char *simd = zt_simd_variant(), *path;
	cr_assert_eq(zinf_simd_resolve(simd, &path), 0);
	uint64_t want = 0;
	if (strcmp(path, "avx2") == 0 || strcmp(path, "avx512") == 0) {
		want = KNOWN_ANSWER_VECTOR;
	} else if (strcmp(path, "scalar") == 0) {
		want = 0x8e33c2bf7bdbdba6ull;
	} else {
		cr_assert_fail("no known answer recorded for the SIMD path %s: record it here",
			       path);
	}
	size_t n = 100003;
	uint64_t st = 12345;
	float *p = malloc(4 * n), *g = malloc(4 * n), *m = malloc(4 * n), *v = malloc(4 * n);
	uint16_t *c = malloc(2 * n), *mb = calloc(n, 2), *vb = calloc(n, 2);
	cr_assert(p && g && m && v && c && mb && vb);
	for (size_t i = 0; i < n; i++) {
		p[i] = lcg(&st);
		g[i] = lcg(&st);
		m[i] = lcg(&st) * 0.1f;
		v[i] = (lcg(&st) + 1) * 0.01f;
	}
	memset(c, 0, 2 * n);
	struct zinf_adam_opts o;
	zinf_adam_opts_init(&o);
	o.weight_decay = 0.01f;
	o.threads = 2;
	o.simd = simd;
	struct zinf_adagrad_opts ao;
	zinf_adagrad_opts_init(&ao);
	ao.weight_decay = 0.1f;
	ao.simd = simd;
	struct zinf_lion_opts lo;
	zinf_lion_opts_init(&lo);
	lo.weight_decay = 0.1f;
	lo.simd = simd;
	for (int t = 1; t <= 3; t++) {
		o.adamw_mode = t & 1;
		cr_assert_eq(zinf_adam_step(&o, t, 0.7f, p + 1, g + 3, ZINF_F32, m + 2, v + 5,
					    n - 7, c + 1, ZINF_BF16),
			     0);
		cr_assert_eq(zinf_adam_step_bf16state(&o, t, 0.7f, p, g, ZINF_F32, mb + 1, vb + 1,
						      n - 3, c, ZINF_F16, ZINF_ROUND_STOCHASTIC, 7),
			     0);
		cr_assert_eq(zinf_adagrad_step(&ao, t, 0.7f, p + 3, g, ZINF_F32, v + 1, n - 5, c,
					       ZINF_BF16),
			     0);
		cr_assert_eq(zinf_lion_step(&lo, t, 0.7f, p, g + 1, ZINF_F32, m + 3, n - 9, c + 3,
					    ZINF_F16),
			     0);
	}
	uint64_t h = 1469598103934665603ull;
	h = fnv(h, p, 4 * n);
	h = fnv(h, m, 4 * n);
	h = fnv(h, v, 4 * n);
	h = fnv(h, c, 2 * n);
	h = fnv(h, mb, 2 * n);
	h = fnv(h, vb, 2 * n);
	free(p);
	free(g);
	free(m);
	free(v);
	free(c);
	free(mb);
	free(vb);
	cr_assert_eq(h, want, "%s: hash 0x%016llx, recorded 0x%016llx", path, (unsigned long long)h,
		     (unsigned long long)want);
}
