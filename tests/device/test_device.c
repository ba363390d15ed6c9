/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/device/test_device.c: the device contract, run once per backend (ZINF_TEST_VARIANT:
 * host, host_sync, cuda; cuda skips visibly without a GPU or without CUDA in the build). Every
 * operation goes through device memory and a stream, and is compared with its C reference:
 * casts bit for bit (NaN payloads, infinities, subnormals, ties, every 16-bit pattern widened),
 * scale and accumulate over every dtype bit for bit, the sum of squares against a long double
 * sum within the stated (n - 1) * 2^-53 bound, the non-finite flag, fill, and Adam equal to each
 * of cpu_adam's vector paths this CPU runs (avx2, avx512) bit for bit, so that a sub-group
 * stepped on the device and one stepped by the CPU tier agree.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "common/quant.h"
#include "common/test_util.h"
#include "zinf/device.h"

static struct zinf_device *dev;
static struct zinf_stream *st;

static void
open_dev(void)
{
	zt_log_to_stderr();
	const char *v = zt_variant() ? zt_variant() : "host";
	struct zinf_device_opts o;
	zinf_device_opts_init(&o);
	o.backend = strcmp(v, "host_sync") == 0 ? "host" : v;
	o.host_sync = strcmp(v, "host_sync") == 0;
	int rc = zinf_device_create(&o, &dev);
	if (rc == -ENODEV) {
		cr_skip_test("device %s: %s", v, zinf_last_error());
	}
	cr_assert_eq(rc, 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_stream_create(dev, "test", &st), 0, "%s", zinf_last_error());
}

static void
close_dev(void)
{
	zinf_stream_destroy(st);
	zinf_device_destroy(dev);
}

TestSuite(device, .init = open_dev, .fini = close_dev);

/* Device memory holding a copy of host[0, bytes) (host may be NULL: left unset). */
static void *
to_dev(const void *host, size_t bytes)
{
	void *d = NULL;
	cr_assert_eq(zinf_device_alloc(dev, bytes, &d), 0, "%s", zinf_last_error());
	if (host) {
		cr_assert_eq(zinf_device_copy(st, d, host, bytes, ZINF_COPY_H2D), 0);
	}
	return d;
}

/* dev_ptr's bytes into a fresh malloc'ed buffer, after everything queued on st. */
static void *
from_dev(const void *dev_ptr, size_t bytes)
{
	void *h = malloc(bytes ? bytes : 1);
	cr_assert_eq(zinf_device_copy(st, h, dev_ptr, bytes, ZINF_COPY_D2H), 0);
	cr_assert_eq(zinf_stream_sync(st), 0, "%s", zinf_last_error());
	return h;
}

/* Random floats spread over magnitudes 2^-30 .. 2^15 (finite in f16), both signs. */
static void
rand_floats(float *x, size_t n, uint64_t *rng)
{
	for (size_t i = 0; i < n; i++) {
		double m = zt_uniform(rng, 1.0, 2.0) * ldexp(1.0, (int)(zt_rand(rng) % 45) - 30);
		x[i] = (float)((zt_rand(rng) & 1) ? -m : m);
	}
}

/* Floats that exercise every rounding case of the 16-bit conversions. */
static const uint32_t special[] = {
	0x00000000, 0x80000000, 0x7f800000, 0xff800000, /* zeros, infinities */
	0x7fc00000, 0xffc00001, 0x7f800001, 0x7fa5a5a5, /* NaNs: quiet, signalling, payloads */
	0x00000001, 0x807fffff, 0x00400000,		/* float subnormals */
	0x3f800000, 0x3f808000, 0x3f818000, 0x3f808001, /* 1, bf16 ties to even, above */
	0x477fe000, 0x477fefff, 0x477ff000, 0x7f7fffff, /* f16 max, below/at overflow, FLT_MAX */
	0x33800000, 0x33000000, 0x33400000, 0x387fc000, /* f16 subnormal 2^-24, 2^-25 tie, 1.5 */
	0x38800000, 0x3a001000, 0x3a003000, 0xc0490fdb, /* f16 min normal, subnormal ties, -pi */
};

Test(device, cast_f32_to_16bit_bit_exact)
{
	uint64_t rng = zt_seed();
	size_t ns = sizeof(special) / 4, n = ns + 4096;
	float *x = malloc(n * 4);
	memcpy(x, special, sizeof(special));
	rand_floats(x + ns, n - ns, &rng);
	for (int k = 0; k < 2; k++) {
		enum zinf_dtype t = k ? ZINF_F16 : ZINF_BF16;
		void *dx = to_dev(x, n * 4), *dy = to_dev(NULL, n * 2);
		cr_assert_eq(zinf_device_cast(st, dy, t, dx, ZINF_F32, n), 0, "%s",
			     zinf_last_error());
		uint16_t *y = from_dev(dy, n * 2);
		for (size_t i = 0; i < n; i++) {
			uint16_t ref =
				t == ZINF_F16 ? dt_f32_to_f16_rne(x[i]) : dt_f32_to_bf16_rne(x[i]);
			cr_assert_eq(y[i], ref, "%s: element %zu (0x%08x): 0x%04x, expected 0x%04x",
				     zinf_dtype_name(t), i, dt_f2u(x[i]), y[i], ref);
		}
		/* a few worked by hand */
		cr_assert_eq(y[0], 0x0000);
		cr_assert_eq(y[2], 0x7c00 * (t == ZINF_F16) + 0x7f80 * (t == ZINF_BF16));
		if (t == ZINF_BF16) {
			cr_assert_eq(y[6], 0x7fc0, "signalling NaN quieted, not turned into inf");
			cr_assert_eq(y[12], 0x3f80, "1 + 2^-8 ties to even (down)");
			cr_assert_eq(y[13], 0x3f82, "1 + 3 * 2^-8 ties to even (up)");
		} else {
			cr_assert_eq(y[16], 0x7bff, "65519.996 rounds down to f16 max");
			cr_assert_eq(y[17], 0x7c00, "65520 overflows to infinity");
			cr_assert_eq(y[19], 0x0001, "2^-24 is the smallest f16 subnormal");
			cr_assert_eq(y[20], 0x0000, "2^-25 ties to even: zero");
			cr_assert_eq(y[21], 0x0001, "1.5 * 2^-25 rounds up");
		}
		free(y);
		zinf_device_free(dev, dx);
		zinf_device_free(dev, dy);
	}
	free(x);
}

Test(device, cast_every_16bit_pattern_to_f32_exact)
{
	size_t n = 65536;
	uint16_t *h = malloc(n * 2);
	for (size_t i = 0; i < n; i++) {
		h[i] = (uint16_t)i;
	}
	for (int k = 0; k < 2; k++) {
		enum zinf_dtype t = k ? ZINF_F16 : ZINF_BF16;
		void *dh = to_dev(h, n * 2), *dy = to_dev(NULL, n * 4);
		cr_assert_eq(zinf_device_cast(st, dy, ZINF_F32, dh, t, n), 0);
		uint32_t *y = from_dev(dy, n * 4);
		for (size_t i = 0; i < n; i++) {
			float ref = t == ZINF_F16 ? dt_f16_to_f32(h[i]) : dt_bf16_to_f32(h[i]);
			cr_assert_eq(y[i], dt_f2u(ref), "%s 0x%04zx: 0x%08x, expected 0x%08x",
				     zinf_dtype_name(t), i, y[i], dt_f2u(ref));
		}
		size_t nan = t == ZINF_F16 ? 0x7e01 : 0x7fc1; /* a quiet NaN with payload */
		cr_assert_eq(y[nan], t == ZINF_F16 ? 0x7fc02000u : 0x7fc10000u, "NaN payload");
		free(y);
		zinf_device_free(dev, dh);
		zinf_device_free(dev, dy);
	}
	free(h);
}

Test(device, cast_refuses_16bit_to_16bit)
{
	char buf[8] = {0};
	cr_assert_eq(zinf_device_cast(st, buf, ZINF_F16, buf, ZINF_BF16, 2), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "one side must be f32"), "%s", zinf_last_error());
	cr_assert_eq(zinf_device_cast(st, NULL, ZINF_F16, buf, ZINF_F32, 2), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "stream \"test\""), "%s", zinf_last_error());
}

/* n values of dtype t from random floats (16-bit types rounded). */
static void *
rand_array(enum zinf_dtype t, size_t n, uint64_t *rng)
{
	float *f = malloc(n * 4);
	rand_floats(f, n, rng);
	void *x = malloc(n * zinf_dtype_size(t));
	cr_assert_eq(zinf_dtype_convert(x, t, f, ZINF_F32, n), 0);
	free(f);
	return x;
}

static float
load(const void *x, enum zinf_dtype t, size_t i)
{
	float f;
	cr_assert_eq(
		zinf_dtype_convert(&f, ZINF_F32, (const char *)x + i * zinf_dtype_size(t), t, 1),
		0);
	return f;
}

Test(device, scale_in_place_every_dtype)
{
	uint64_t rng = zt_seed() + 1;
	size_t n = 5000;
	for (int t = 0; t < 3; t++) {
		size_t es = zinf_dtype_size(t);
		void *x = rand_array(t, n, &rng);
		void *dx = to_dev(x, n * es);
		cr_assert_eq(zinf_device_scale(st, dx, t, 0.37f, n), 0);
		void *y = from_dev(dx, n * es);
		for (size_t i = 0; i < n; i++) {
			char ref[4];
			float r = load(x, t, i) * 0.37f;
			zinf_dtype_convert(ref, t, &r, ZINF_F32, 1);
			cr_assert_eq(memcmp((char *)y + i * es, ref, es), 0, "%s element %zu",
				     zinf_dtype_name(t), i);
		}
		free(x);
		free(y);
		zinf_device_free(dev, dx);
	}
}

Test(device, accumulate_every_source_dtype)
{
	uint64_t rng = zt_seed() + 2;
	size_t n = 5001;
	for (int t = 0; t < 3; t++) {
		float *acc = rand_array(ZINF_F32, n, &rng);
		void *src = rand_array(t, n, &rng);
		float *dacc = to_dev(acc, n * 4);
		void *dsrc = to_dev(src, n * zinf_dtype_size(t));
		/* twice: accumulation over micro-batches */
		cr_assert_eq(zinf_device_accumulate(st, dacc, dsrc, t, n), 0);
		cr_assert_eq(zinf_device_accumulate(st, dacc, dsrc, t, n), 0);
		float *y = from_dev(dacc, n * 4);
		for (size_t i = 0; i < n; i++) {
			float r = acc[i] + load(src, t, i);
			r = r + load(src, t, i);
			cr_assert_eq(dt_f2u(y[i]), dt_f2u(r), "%s element %zu: %a, expected %a",
				     zinf_dtype_name(t), i, y[i], r);
		}
		free(acc);
		free(src);
		free(y);
		zinf_device_free(dev, dacc);
		zinf_device_free(dev, dsrc);
	}
}

Test(device, sumsq_within_the_stated_bound)
{
	uint64_t rng = zt_seed() + 3;
	size_t n = 300007; /* not a multiple of any block size */
	double *dout = to_dev(NULL, 3 * sizeof(double));
	for (int t = 0; t < 3; t++) {
		void *x = rand_array(t, n, &rng);
		void *dx = to_dev(x, n * zinf_dtype_size(t));
		cr_assert_eq(zinf_device_sumsq(st, dx, t, n, dout + t), 0);
		double *got = from_dev(dout + t, sizeof(double));
		long double ref = 0; /* 64-bit mantissa: its own error is far below the bound */
		for (size_t i = 0; i < n; i++) {
			long double v = load(x, t, i);
			ref += v * v;
		}
		long double bound = (long double)(n - 1) * 0x1p-53L * ref;
		cr_assert(fabsl(*got - ref) <= bound, "%s: %.17g, reference %.17Lg, bound %.3Lg",
			  zinf_dtype_name(t), *got, ref, bound);
		cr_assert(*got > 0);
		free(got);
		free(x);
		zinf_device_free(dev, dx);
	}
	/* n = 0 writes a zero sum */
	double one = 1.0;
	cr_assert_eq(zinf_device_copy(st, dout, &one, 8, ZINF_COPY_H2D), 0);
	cr_assert_eq(zinf_device_sumsq(st, dout, ZINF_F32, 0, dout), 0);
	double *z = from_dev(dout, 8);
	cr_assert_eq(*z, 0.0);
	free(z);
	zinf_device_free(dev, dout);
}

Test(device, nonfinite_sets_a_shared_flag)
{
	size_t n = 7777;
	static const uint32_t bad[3][2] = {
		{0x7f800000, 0x7fc00000}, /* f32 inf, NaN */
		{0xfc00, 0x7e00},	  /* f16 -inf, NaN */
		{0x7f80, 0xffc1},	  /* bf16 inf, NaN */
	};
	uint32_t *dflag = to_dev(NULL, 4);
	for (int t = 0; t < 3; t++) {
		size_t es = zinf_dtype_size(t);
		float one = 1.0f;
		char *x = calloc(n, es);
		for (size_t i = 0; i < n; i++) { /* all finite, the largest finite values too */
			float v = (i % 2) ? 65504.0f : -one;
			zinf_dtype_convert(x + i * es, t, &v, ZINF_F32, 1);
		}
		void *dx = to_dev(x, n * es);
		/* clean; then an infinity in the middle; then only a NaN at the end */
		for (int w = -1; w < 2; w++) {
			size_t at = w ? n - 1 : n / 2;
			if (w >= 0) {
				cr_assert_eq(zinf_device_copy(st, dx, x, n * es, ZINF_COPY_H2D), 0);
				cr_assert_eq(zinf_device_copy(st, (char *)dx + at * es, &bad[t][w],
							      es, ZINF_COPY_H2D),
					     0);
			}
			cr_assert_eq(zinf_device_fill(st, dflag, ZINF_F32, 0.0f, 1), 0);
			cr_assert_eq(zinf_device_nonfinite(st, dx, t, n, dflag), 0);
			uint32_t *f = from_dev(dflag, 4);
			cr_assert_eq(*f, w >= 0, "%s, non-finite at %d: flag %u",
				     zinf_dtype_name(t), w, *f);
			free(f);
		}
		/* a later clean tensor leaves the flag set */
		float clean = 2.0f;
		void *dc = to_dev(NULL, 4);
		cr_assert_eq(zinf_device_fill(st, dc, ZINF_F32, clean, 1), 0);
		cr_assert_eq(zinf_device_nonfinite(st, dc, ZINF_F32, 1, dflag), 0);
		uint32_t *f = from_dev(dflag, 4);
		cr_assert_eq(*f, 1);
		free(f);
		zinf_device_free(dev, dc);
		zinf_device_free(dev, dx);
		free(x);
	}
	zinf_device_free(dev, dflag);
}

Test(device, fill_converts_the_value)
{
	size_t n = 1000;
	const float vals[] = {1.0f / 3.0f, -0.0f, 1e-7f, 70000.0f};
	for (int t = 0; t < 3; t++) {
		size_t es = zinf_dtype_size(t);
		void *d = to_dev(NULL, n * es);
		for (size_t k = 0; k < 4; k++) {
			cr_assert_eq(zinf_device_fill(st, d, t, vals[k], n), 0);
			char *y = from_dev(d, n * es), ref[4];
			zinf_dtype_convert(ref, t, &vals[k], ZINF_F32, 1);
			for (size_t i = 0; i < n; i++) {
				cr_assert_eq(memcmp(y + i * es, ref, es), 0, "%s %g element %zu",
					     zinf_dtype_name(t), vals[k], i);
			}
			free(y);
		}
		zinf_device_free(dev, d);
	}
}

/* One configuration of the Adam comparison: stepped on the device and with zinf_adam_step's
 * path `simd` on host copies, three steps, then every array compared bit for bit. */
static void
adam_case(const char *simd, bool adamw, float wd, enum zinf_dtype gdt, int copy, uint64_t *rng)
{
	size_t n = 10007;
	struct zinf_adam_opts o;
	zinf_adam_opts_init(&o);
	o.lr = 1e-2f;
	o.adamw_mode = adamw;
	o.weight_decay = wd;
	o.threads = 1;
	o.simd = simd;
	enum zinf_dtype cdt = copy == 1 ? ZINF_BF16 : ZINF_F16;
	float *p = rand_array(ZINF_F32, n, rng), *m = calloc(n, 4), *v = calloc(n, 4);
	float *dp = to_dev(p, n * 4), *dm = to_dev(m, n * 4), *dv = to_dev(v, n * 4);
	void *dg = to_dev(NULL, n * zinf_dtype_size(gdt));
	void *dc = copy ? to_dev(NULL, n * 2) : NULL;
	uint16_t *c = copy ? calloc(n, 2) : NULL;
	cr_assert_eq(zinf_stream_sync(st), 0); /* the host arrays change next */
	for (int step = 1; step <= 3; step++) {
		void *g = rand_array(gdt, n, rng);
		cr_assert_eq(zinf_device_copy(st, dg, g, n * zinf_dtype_size(gdt), ZINF_COPY_H2D),
			     0);
		cr_assert_eq(zinf_device_adam(st, &o, step, 0.5f, dp, dg, gdt, dm, dv, n, dc, cdt),
			     0, "%s", zinf_last_error());
		cr_assert_eq(zinf_adam_step(&o, step, 0.5f, p, g, gdt, m, v, n, c, cdt), 0);
		cr_assert_eq(zinf_stream_sync(st), 0); /* g is freed next */
		free(g);
	}
	const float *want[] = {p, m, v};
	const float *dgot[] = {dp, dm, dv};
	for (int a = 0; a < 3; a++) {
		uint32_t *got = from_dev(dgot[a], n * 4);
		for (size_t i = 0; i < n; i++) {
			cr_assert_eq(
				got[i], dt_f2u(want[a][i]),
				"%s: adamw %d wd %g grad %s: array %d element %zu: %a, expected %a",
				simd, adamw, wd, zinf_dtype_name(gdt), a, i, dt_u2f(got[i]),
				want[a][i]);
		}
		free(got);
	}
	if (copy) {
		uint16_t *got = from_dev(dc, n * 2);
		cr_assert_eq(memcmp(got, c, n * 2), 0, "%s: 16-bit parameter copy differs", simd);
		free(got);
	}
	zinf_device_free(dev, dp);
	zinf_device_free(dev, dm);
	zinf_device_free(dev, dv);
	zinf_device_free(dev, dg);
	zinf_device_free(dev, dc);
	free(p);
	free(m);
	free(v);
	free(c);
}

Test(device, adam_equals_cpu_adam_vector_paths)
{
	static const char *const paths[] = {"avx2", "avx512"};
	int ran = 0;
	for (int k = 0; k < 2; k++) {
		const char *resolved = NULL;
		if (zinf_simd_resolve(paths[k], &resolved) != 0) {
			continue; /* not built, or this CPU cannot run it */
		}
		uint64_t rng = zt_seed() + 4;
		for (int gdt = 0; gdt < 3; gdt++) {
			adam_case(paths[k], true, 0.01f, gdt, gdt, &rng);
			adam_case(paths[k], false, 0.01f, gdt, 2 - gdt, &rng);
		}
		adam_case(paths[k], true, 0.0f, ZINF_F32, 0, &rng);
		ran++;
	}
	if (!ran) {
		cr_skip_test("this CPU runs none of cpu_adam's vector paths (avx2, avx512)");
	}
}

Test(device, adam_refuses_what_cpu_adam_refuses)
{
	struct zinf_adam_opts o;
	zinf_adam_opts_init(&o);
	o.lr = -1.0f;
	float x[1];
	cr_assert_eq(zinf_device_adam(st, &o, 1, 1.0f, x, x, ZINF_F32, x, x, 1, NULL, ZINF_F32),
		     -EINVAL);
	cr_assert(strstr(zinf_last_error(), "lr"), "%s", zinf_last_error());
	cr_assert(strstr(zinf_last_error(), "stream \"test\""), "%s", zinf_last_error());
	zinf_adam_opts_init(&o);
	cr_assert_eq(zinf_device_adam(st, &o, 1, 1.0f, x, NULL, ZINF_F32, x, x, 1, NULL, ZINF_F32),
		     -EINVAL);
	cr_assert_eq(zinf_device_adam(st, &o, 0, 1.0f, x, x, ZINF_F32, x, x, 1, NULL, ZINF_F32),
		     -EINVAL);
}

Test(device, copies_h2d_d2d_d2h_round_trip)
{
	uint64_t rng = zt_seed() + 5;
	size_t bytes = (1 << 20) + 3;
	char *h = malloc(bytes);
	zt_rand_fill(h, bytes, &rng);
	void *a = to_dev(h, bytes), *b = to_dev(NULL, bytes);
	cr_assert_eq(zinf_device_copy(st, b, a, bytes, ZINF_COPY_D2D), 0);
	char *back = from_dev(b, bytes);
	cr_assert_eq(memcmp(back, h, bytes), 0);
	cr_assert_eq(zinf_device_copy(st, b, a, 0, ZINF_COPY_D2D), 0, "zero bytes is a no-op");
	cr_assert_eq(zinf_device_copy(st, b, a, 8, (enum zinf_copy_dir)7), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "direction 7"), "%s", zinf_last_error());
	cr_assert_eq(zinf_device_copy(st, NULL, a, 8, ZINF_COPY_D2D), -EINVAL);
	cr_assert_eq(zinf_device_copy(NULL, b, a, 8, ZINF_COPY_D2D), -EINVAL);
	free(back);
	free(h);
	zinf_device_free(dev, a);
	zinf_device_free(dev, b);
}

Test(device, events_order_two_streams)
{
	struct zinf_stream *s2 = NULL;
	struct zinf_event *e = NULL;
	cr_assert_eq(zinf_stream_create(dev, "second", &s2), 0);
	cr_assert_eq(zinf_event_create(dev, &e), 0);
	cr_assert_eq(zinf_event_query(e), 1, "an event never recorded is complete");
	size_t n = 1 << 16;
	float *x = malloc(n * 4);
	for (size_t i = 0; i < n; i++) {
		x[i] = (float)i;
	}
	float *dx = to_dev(NULL, n * 4);
	cr_assert_eq(zinf_device_copy(st, dx, x, n * 4, ZINF_COPY_H2D), 0);
	cr_assert_eq(zinf_event_record(e, st), 0);
	cr_assert_eq(zinf_stream_wait_event(s2, e), 0);
	cr_assert_eq(zinf_device_scale(s2, dx, ZINF_F32, 2.0f, n), 0);
	cr_assert_eq(zinf_event_record(e, s2), 0);
	cr_assert_eq(zinf_event_sync(e), 0);
	cr_assert_eq(zinf_event_query(e), 1);
	float *y = from_dev(dx, n * 4);
	for (size_t i = 0; i < n; i++) {
		cr_assert_eq(y[i], 2.0f * i, "element %zu: %g", i, y[i]);
	}
	cr_assert_eq(zinf_event_record(NULL, st), -EINVAL);
	cr_assert_eq(zinf_stream_wait_event(NULL, e), -EINVAL);
	free(x);
	free(y);
	zinf_device_free(dev, dx);
	zinf_event_destroy(e);
	zinf_stream_destroy(s2);
}

/* ---- the blockwise int8/int4 codec (common/quant.h) ------------------------------------------ */

struct qrun {
	void *codes;   /* host copies of what the device wrote */
	float *scales; /* one per block */
	float *deq;    /* dequantized, as f32 */
};

/* Quantize x (dtype t, n elements) on the device and dequantize it back to f32 there. */
static struct qrun
quant_round_trip(const void *x, enum zinf_dtype t, size_t n, size_t block, unsigned bits)
{
	size_t cb = qz_code_bytes(n, bits), nb = qz_blocks(n, block);
	void *dx = to_dev(x, n * zinf_dtype_size(t)), *dc = to_dev(NULL, cb);
	float *ds = to_dev(NULL, nb * 4), *dy = to_dev(NULL, n * 4);
	cr_assert_eq(zinf_device_quantize(st, dc, ds, dx, t, n, block, bits, NULL, 0.0f), 0, "%s",
		     zinf_last_error());
	cr_assert_eq(zinf_device_dequantize(st, dy, ZINF_F32, dc, ds, n, block, bits, false), 0,
		     "%s", zinf_last_error());
	struct qrun r = {from_dev(dc, cb), from_dev(ds, nb * 4), from_dev(dy, n * 4)};
	zinf_device_free(dev, dx);
	zinf_device_free(dev, dc);
	zinf_device_free(dev, ds);
	zinf_device_free(dev, dy);
	return r;
}

static void
qrun_free(struct qrun *r)
{
	free(r->codes);
	free(r->scales);
	free(r->deq);
}

Test(device, quantize_within_the_stated_bound_of_a_float64_reference)
{
	uint64_t rng = zt_seed() + 11;
	size_t n = 3 * 256 + 77; /* a short last block */
	for (unsigned bits = 8; bits >= 4; bits -= 4) {
		for (int t = 0; t < 3; t++) {
			void *x = rand_array(t, n, &rng);
			struct qrun r = quant_round_trip(x, t, n, 256, bits);
			/* the C reference writes the same codes and scales, bit for bit */
			size_t cb = qz_code_bytes(n, bits), nb = qz_blocks(n, 256);
			void *rc = malloc(cb);
			float *rs = malloc(nb * 4);
			qz_quantize(rc, rs, x, t, n, 256, bits, NULL, 0.0f);
			cr_assert_eq(memcmp(rc, r.codes, cb), 0, "%u-bit %s codes", bits,
				     zinf_dtype_name(t));
			cr_assert_eq(memcmp(rs, r.scales, nb * 4), 0, "%u-bit %s scales", bits,
				     zinf_dtype_name(t));
			double q = bits == 8 ? 127.0 : 7.0;
			for (size_t b = 0; b < nb; b++) {
				size_t lo = b * 256, hi = lo + 256 < n ? lo + 256 : n;
				double m = 0.0;
				for (size_t i = lo; i < hi; i++) {
					m = fmax(m, fabs((double)load(x, t, i)));
				}
				/* one correctly rounded fp32 division of M by Q */
				cr_assert_eq(dt_f2u(r.scales[b]), dt_f2u((float)(m / q)),
					     "block %zu scale %a, expected %a", b, r.scales[b],
					     (float)(m / q));
				double bound = m / (2.0 * q) + ldexp(m, -22);
				for (size_t i = lo; i < hi; i++) {
					double e = fabs((double)load(x, t, i) - (double)r.deq[i]);
					cr_assert_leq(e, bound,
						      "%u-bit %s element %zu: |x - deq| %g > %g",
						      bits, zinf_dtype_name(t), i, e, bound);
				}
			}
			free(rc);
			free(rs);
			free(x);
			qrun_free(&r);
		}
	}
}

Test(device, quantize_worked_by_hand_rounds_to_nearest_even)
{
	/* block 4, M = 127: scale 1, codes are x rounded to nearest, ties to even */
	float x[8] = {2.5f, -3.5f, 1.5f, 127.0f, 7.0f, -7.0f, 3.5f, 0.25f};
	struct qrun r = quant_round_trip(x, ZINF_F32, 8, 4, 8);
	const int8_t *c = r.codes;
	cr_assert_eq(r.scales[0], 1.0f);
	cr_assert(c[0] == 2 && c[1] == -4 && c[2] == 2 && c[3] == 127, "%d %d %d %d", c[0], c[1],
		  c[2], c[3]);
	cr_assert_eq(r.scales[1], 7.0f / 127.0f);
	qrun_free(&r);
	/* 4 bits: M = 127 -> scale 127 / 7; M = 7 -> scale 1: 7, -7, 3.5 -> 4, 0.25 -> 0 */
	r = quant_round_trip(x + 4, ZINF_F32, 4, 4, 4);
	const uint8_t *b = r.codes;
	cr_assert_eq(r.scales[0], 1.0f);
	cr_assert_eq(b[0], 0x97, "7 low, -7 (0x9) high: 0x%02x", b[0]);
	cr_assert_eq(b[1], 0x04, "4 low, 0 high: 0x%02x", b[1]);
	cr_assert(r.deq[0] == 7.0f && r.deq[1] == -7.0f && r.deq[2] == 4.0f && r.deq[3] == 0.0f);
	qrun_free(&r);
	/* an odd count with 4 bits: the last byte's high nibble is 0 */
	float y[3] = {-7.0f, 1.0f, 2.0f};
	r = quant_round_trip(y, ZINF_F32, 3, 4, 4);
	b = r.codes;
	cr_assert_eq(b[0], 0x19, "-7 (0x9) low, 1 high: 0x%02x", b[0]);
	cr_assert_eq(b[1], 0x02, "2 low, nothing high: 0x%02x", b[1]);
	qrun_free(&r);
}

Test(device, quantize_edge_blocks_zero_huge_subnormal_nan_inf)
{
	size_t n = 6 * 8;
	float x[48] = {0};
	/* block 0: zeros; 1: one huge value among ones; 2: subnormals only; 3: a NaN;
	   4: an infinity; 5: ordinary values (blocks 3-4 must not touch it) */
	for (int i = 8; i < 16; i++) {
		x[i] = 1.0f;
	}
	x[12] = 1e30f;
	for (int i = 16; i < 24; i++) {
		x[i] = dt_u2f(0x00000100u * (uint32_t)(i - 15));
	}
	for (int i = 24; i < 40; i++) {
		x[i] = 0.5f;
	}
	x[27] = NAN;
	x[33] = -INFINITY;
	for (int i = 40; i < 48; i++) {
		x[i] = (float)(i - 44);
	}
	struct qrun r = quant_round_trip(x, ZINF_F32, n, 8, 8);
	cr_assert_eq(r.scales[0], 0.0f, "a zero block has scale 0");
	for (int i = 0; i < 8; i++) {
		cr_assert_eq(dt_f2u(r.deq[i]), 0u, "zero block element %d: %a", i, r.deq[i]);
	}
	cr_assert_eq(r.scales[1], 1e30f / 127.0f);
	cr_assert_eq(r.deq[12], 127.0f * (1e30f / 127.0f), "the huge value comes back");
	cr_assert_eq(r.deq[8], 0.0f,
		     "1 is below half a step of 1e30 / 127: lost, within the bound");
	cr_assert_eq(r.scales[2], 0.0f, "a subnormal block is flushed");
	for (int i = 16; i < 24; i++) {
		cr_assert_leq(fabs((double)x[i] - r.deq[i]), ldexp(1.0, -126));
	}
	cr_assert(isnan(r.scales[3]) && isnan(r.scales[4]), "NaN and inf blocks: scale NaN");
	for (int i = 24; i < 40; i++) {
		cr_assert(isnan(r.deq[i]), "element %d of a NaN/inf block: %a, expected NaN", i,
			  r.deq[i]);
	}
	cr_assert_eq(r.scales[5], 4.0f / 127.0f);
	for (int i = 40; i < 48; i++) {
		cr_assert_leq(fabs((double)x[i] - r.deq[i]), 4.0 / 254.0 + ldexp(4.0, -22),
			      "element %d", i);
	}
	qrun_free(&r);
}

Test(device, quantize_error_feedback_keeps_the_residual)
{
	uint64_t rng = zt_seed() + 12;
	size_t n = 1000;
	float *x = rand_array(ZINF_F32, n, &rng), *e0 = rand_array(ZINF_F32, n, &rng);
	for (size_t i = 0; i < n; i++) {
		e0[i] *= 0x1p-10f;
	}
	size_t cb = qz_code_bytes(n, 4), nb = qz_blocks(n, 64);
	void *dx = to_dev(x, n * 4), *dc = to_dev(NULL, cb);
	float *ds = to_dev(NULL, nb * 4), *de = to_dev(e0, n * 4), *dy = to_dev(NULL, n * 4);
	cr_assert_eq(zinf_device_fill(st, dy, ZINF_F32, 0.5f, n), 0);
	cr_assert_eq(zinf_device_quantize(st, dc, ds, dx, ZINF_F32, n, 64, 4, de, 0.75f), 0, "%s",
		     zinf_last_error());
	cr_assert_eq(zinf_device_dequantize(st, dy, ZINF_F32, dc, ds, n, 64, 4, true), 0, "%s",
		     zinf_last_error());
	float *e = from_dev(de, n * 4), *y = from_dev(dy, n * 4);
	/* the C reference on the same inputs: codes, then err = 0.75 (x + e0 - deq) */
	float *re = malloc(n * 4), *ry = malloc(n * 4), *rs = malloc(nb * 4);
	void *rc = malloc(cb);
	memcpy(re, e0, n * 4);
	qz_quantize(rc, rs, x, ZINF_F32, n, 64, 4, re, 0.75f);
	for (size_t i = 0; i < n; i++) {
		ry[i] = 0.5f;
	}
	qz_dequantize_add(ry, rc, rs, n, 64, 4);
	for (size_t i = 0; i < n; i++) {
		float c = x[i] + e0[i];
		double deq = (double)qz_deq(qz_get(rc, i, 4), rs[i / 64]);
		/* worked here in float64: the kept error is 0.75 x the residual, to fp32 rounding
		 */
		cr_assert_leq(fabs((double)e[i] - 0.75 * ((double)c - deq)),
			      ldexp(fabs((double)c) + fabs(deq), -22), "element %zu", i);
		cr_assert_eq(dt_f2u(e[i]), dt_f2u(re[i]), "element %zu: err %a, reference %a", i,
			     e[i], re[i]);
		cr_assert_eq(dt_f2u(y[i]), dt_f2u(ry[i]), "element %zu: y %a, reference %a", i,
			     y[i], ry[i]);
	}
	free(re);
	free(ry);
	free(rs);
	free(rc);
	free(x);
	free(e0);
	free(e);
	free(y);
	zinf_device_free(dev, dx);
	zinf_device_free(dev, dc);
	zinf_device_free(dev, ds);
	zinf_device_free(dev, de);
	zinf_device_free(dev, dy);
}

Test(device, quantize_refuses_bad_bits_and_blocks)
{
	float x[4] = {1, 2, 3, 4}, s[4];
	int8_t c[4];
	cr_assert_eq(zinf_device_quantize(st, c, s, x, ZINF_F32, 4, 4, 5, NULL, 0), -EINVAL);
	cr_assert_eq(zinf_device_quantize(st, c, s, x, ZINF_F32, 4, 0, 8, NULL, 0), -EINVAL);
	cr_assert_eq(zinf_device_quantize(st, c, s, x, ZINF_F32, 4, 3, 4, NULL, 0), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "even for 4-bit"), "%s", zinf_last_error());
	cr_assert_eq(zinf_device_dequantize(st, x, ZINF_BF16, c, s, 4, 4, 8, true), -EINVAL);
}

/*
 * A finite block whose max is FLT_MAX: Q x fl(M / Q) rounds past FLT_MAX, so code Q would
 * dequantize to an infinity (and, with error feedback, err = x - inf = -inf would poison the
 * next call). Every element comes back finite, within the stated bound of the float64 value;
 * the kept error is finite and is beta x (c - deq) worked here in float64.
 */
Test(device, quantize_block_at_flt_max_stays_finite_with_and_without_feedback)
{
	const float x[4] = {FLT_MAX, -FLT_MAX, 1.0f, 3e38f};
	for (unsigned bits = 8; bits >= 4; bits -= 4) {
		for (int fb = 0; fb < 2; fb++) {
			const float e0[4] = {0};
			void *dx = to_dev(x, sizeof(x)), *dc = to_dev(NULL, 4);
			float *ds = to_dev(NULL, 4), *dy = to_dev(NULL, sizeof(x));
			float *de = fb ? to_dev(e0, sizeof(e0)) : NULL;
			cr_assert_eq(zinf_device_quantize(st, dc, ds, dx, ZINF_F32, 4, 4, bits, de,
							  1.0f),
				     0, "%s", zinf_last_error());
			cr_assert_eq(
				zinf_device_dequantize(st, dy, ZINF_F32, dc, ds, 4, 4, bits, false),
				0, "%s", zinf_last_error());
			float *y = from_dev(dy, sizeof(x)), *s = from_dev(ds, 4);
			float *e = fb ? from_dev(de, sizeof(x)) : NULL;
			double q = bits == 8 ? 127.0 : 7.0, m = FLT_MAX;
			double bound = (double)s[0] / 2 + ldexp(m, -22);
			cr_assert(isfinite(s[0]) && s[0] > 0, "%u bits: scale %a", bits, s[0]);
			cr_assert_leq(q * (double)s[0], m, "%u bits: Q x scale %a beyond FLT_MAX",
				      bits, q * (double)s[0]);
			for (int i = 0; i < 4; i++) {
				cr_assert(isfinite(y[i]), "%u bits, feedback %d: element %d is %a",
					  bits, fb, i, y[i]);
				cr_assert_leq(fabs((double)y[i] - (double)x[i]), bound,
					      "%u bits element %d: %a for %a (bound %a)", bits, i,
					      y[i], x[i], bound);
				if (fb) {
					cr_assert(isfinite(e[i]), "%u bits: err[%d] %a", bits, i,
						  e[i]);
					cr_assert_eq((double)e[i], (double)x[i] - (double)y[i],
						     "%u bits: err[%d] %a, x - deq %a", bits, i,
						     e[i], (double)x[i] - (double)y[i]);
				}
			}
			free(y);
			free(s);
			free(e);
			zinf_device_free(dev, dx);
			zinf_device_free(dev, dc);
			zinf_device_free(dev, ds);
			zinf_device_free(dev, dy);
			zinf_device_free(dev, de);
		}
	}
}

/* A bad block or bit width names the call and the stream, not the stream alone. */
Test(device, quantize_refusal_names_the_function_and_the_stream)
{
	float x[4] = {1, 2, 3, 4}, s[4];
	int8_t c[4];
	cr_assert_eq(zinf_device_quantize(st, c, s, x, ZINF_F32, 4, 3, 4, NULL, 0), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "zinf_device_quantize on stream \"test\": block of 3"),
		  "%s", zinf_last_error());
	cr_assert_eq(zinf_device_dequantize(st, x, ZINF_F32, c, s, 4, 4, 5, false), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "zinf_device_dequantize on stream \"test\": 5-bit"),
		  "%s", zinf_last_error());
}
