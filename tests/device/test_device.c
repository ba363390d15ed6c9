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
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
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
