/* SPDX-License-Identifier: Apache-2.0 */
/* tests/common/test_common.c: logging, allocation hook, alignment, CPU features, topology. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/test_util.h"
#include "common/dtype.h"
#include "common/opts.h"
#include "common/util.h"

struct captured {
	int calls;
	enum zinf_log_level level;
	int line;
	char msg[256];
};

static void
capture(void *ctx, enum zinf_log_level level, const char *file, int line, const char *func,
	const char *msg)
{
	struct captured *c = ctx;
	c->calls++;
	c->level = level;
	c->line = line;
	snprintf(c->msg, sizeof(c->msg), "%s", msg);
}

Test(common, fail_logs_returns_and_keeps_last_error)
{
	struct captured c = {0};
	zinf_log_set_callback(capture, &c);
	zinf_log_set_level(ZINF_LOG_WARN);
	int line = __LINE__ + 1;
	int r = ZINF_FAIL(-ENOSPC, "file %s needs %d bytes", "/x/y", 4096);
	cr_assert_eq(r, -ENOSPC);
	cr_assert_eq(c.calls, 1);
	cr_assert_eq(c.level, ZINF_LOG_ERROR);
	cr_assert_eq(c.line, line);
	cr_assert_str_eq(c.msg, "file /x/y needs 4096 bytes");
	cr_assert_str_eq(zinf_last_error(), "file /x/y needs 4096 bytes");

	/* Below the level: not passed to the sink, and not the last error either. */
	ZINF_INFO("quiet %d", 1);
	cr_assert_eq(c.calls, 1);
	ZINF_WARN("loud %d", 2);
	cr_assert_eq(c.calls, 2);
	cr_assert_str_eq(c.msg, "loud 2");
	cr_assert_str_eq(zinf_last_error(), "file /x/y needs 4096 bytes");
	zinf_log_set_level(ZINF_LOG_DEBUG);
	ZINF_DEBUG("now %d", 3);
	cr_assert_eq(c.calls, 3);
	zinf_log_set_callback(NULL, NULL);
	cr_assert_eq(ZINF_FAIL(-EIO, "kept without a sink"), -EIO);
	cr_assert_eq(c.calls, 3);
	cr_assert_str_eq(zinf_last_error(), "kept without a sink");
}

Test(common, strerror_and_version)
{
	cr_assert_str_eq(zinf_strerror(-ENOSPC), "No space left on device");
	cr_assert_str_eq(zinf_strerror(0), "success");
	cr_assert_str_eq(zinf_strerror(-100000), "unknown error");
	cr_assert_str_eq(zinf_strerror(5), "success");
	cr_assert_str_eq(zinf_version(), ZINF_VERSION);
}

Test(common, align_macros)
{
	cr_assert_eq(ZINF_ALIGN_UP(1, 4096), 4096);
	cr_assert_eq(ZINF_ALIGN_UP(4096, 4096), 4096);
	cr_assert_eq(ZINF_ALIGN_UP(4097, 512), 4608);
	cr_assert_eq(ZINF_ALIGN_DOWN(4097, 512), 4096);
	cr_assert(ZINF_IS_ALIGNED(8192, 4096));
	cr_assert_not(ZINF_IS_ALIGNED(8193, 4096));
	cr_assert_eq(ZINF_DIV_ROUND_UP(10, 3), 4);
	cr_assert(ZINF_IS_POW2(1u << 20));
	cr_assert_not(ZINF_IS_POW2(3u));
	cr_assert_not(ZINF_IS_POW2(0u));
}

Test(common, aligned_alloc_and_failure_hook)
{
	for (size_t a = 8; a <= (1u << 16); a <<= 1) {
		void *p = zinf_alloc_aligned(a, 12345);
		cr_assert_not_null(p);
		cr_assert(((uintptr_t)p % a) == 0, "alignment %zu", a);
		memset(p, 0xab, 12345);
		zinf_free_aligned(p);
	}
	cr_assert_null(zinf_alloc_aligned(24, 64), "non power of two");
	cr_assert_null(zinf_alloc_aligned(2, 64), "below pointer size");

	zc_test_alloc_fail_nth(2);
	void *a = zc_malloc(16);
	void *b = zc_malloc(16);
	void *c = zc_malloc(16);
	cr_assert_not_null(a);
	cr_assert_null(b, "the 2nd allocation must fail");
	cr_assert_not_null(c, "the hook fires once");
	zc_free(a);
	zc_free(c);
	zc_test_alloc_fail_nth(1);
	cr_assert_null(zinf_alloc_aligned(64, 64));
	zc_test_alloc_fail_nth(0);
}

/* The detection must agree with what the kernel reports in /proc/cpuinfo. */
static bool
cpuinfo_has(const char *flag)
{
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[8192];
	bool found = false;
	if (!f) {
		return false;
	}
	while (fgets(line, sizeof(line), f)) {
		if (strncmp(line, "flags", 5) == 0) {
			char *tok = strtok(strchr(line, ':') + 1, " \n");
			for (; tok; tok = strtok(NULL, " \n")) {
				if (strcmp(tok, flag) == 0) {
					found = true;
				}
			}
			break;
		}
	}
	fclose(f);
	return found;
}

Test(common, cpu_features_match_proc_cpuinfo)
{
	if (access("/proc/cpuinfo", R_OK) != 0) {
		cr_skip_test("no /proc/cpuinfo to compare with");
	}
	struct zinf_cpu_features f;
	zinf_cpu_features_get(&f);
	cr_assert_eq(f.avx2, cpuinfo_has("avx2"));
	cr_assert_eq(f.fma, cpuinfo_has("fma"));
	cr_assert_eq(f.f16c, cpuinfo_has("f16c"));
	cr_assert_eq(f.sse42, cpuinfo_has("sse4_2"));
	cr_assert_eq(f.avx512f, cpuinfo_has("avx512f"));
	cr_assert_eq(f.avx512bw, cpuinfo_has("avx512bw"));
	cr_assert_eq(f.avx512bf16, cpuinfo_has("avx512_bf16"));
}

Test(common, topology)
{
	struct zinf_topo *t = NULL;
	cr_assert_eq(zinf_topo_create(&t), 0);
	cr_assert_geq(zinf_topo_numa_nodes(t), 1);
	cr_assert_geq(zinf_topo_cores(t), 1);
	cr_assert_geq(zinf_topo_pus(t), zinf_topo_cores(t));
	cr_assert_eq(zinf_topo_pus(t), (int)sysconf(_SC_NPROCESSORS_ONLN));
	cr_assert_gt(zinf_topo_memory(t), 1ull << 26);
	cr_assert_eq(zinf_topo_bind_area(t, NULL, 0, zinf_topo_numa_nodes(t)), -EINVAL);
	size_t len = 1u << 20;
	void *p = zinf_alloc_aligned(4096, len);
	memset(p, 0, len);
	int r = zinf_topo_bind_area(t, p, len, 0);
	zinf_free_aligned(p);
	zinf_topo_destroy(t);
	zinf_topo_destroy(NULL);
	if (r == -ENODEV) {
		cr_skip_test("built without hwloc: no memory binding");
	}
	/* Binding can be refused in containers (seccomp on mbind): that is an error, not 0. */
	cr_assert(r == 0 || r == -EPERM || r == -ENOSYS, "bind returned %d", r);
}

Test(common, monotonic_time)
{
	uint64_t a = zinf_now_ns();
	usleep(2000);
	uint64_t b = zinf_now_ns();
	cr_assert_geq(b - a, 2000000u);
	cr_assert_lt(b - a, 2000000000u);
}

Test(common, dtype_sizes_names_parse)
{
	cr_assert_eq(zinf_dtype_size(ZINF_F32), 4);
	cr_assert_eq(zinf_dtype_size(ZINF_F16), 2);
	cr_assert_eq(zinf_dtype_size(ZINF_BF16), 2);
	cr_assert_eq(zinf_dtype_size((enum zinf_dtype)7), 0);
	cr_assert_str_eq(zinf_dtype_name(ZINF_BF16), "bf16");
	cr_assert_str_eq(zinf_dtype_name((enum zinf_dtype) - 1), "?");
	enum zinf_dtype d = ZINF_F32;
	cr_assert_eq(zinf_dtype_parse("BFloat16", &d), 0);
	cr_assert_eq(d, ZINF_BF16);
	cr_assert_eq(zinf_dtype_parse("fp16", &d), 0);
	cr_assert_eq(d, ZINF_F16);
	cr_assert_eq(zinf_dtype_parse("float", &d), 0);
	cr_assert_eq(d, ZINF_F32);
	cr_assert_eq(zinf_dtype_parse("f8", &d), -EINVAL);
	cr_assert_eq(d, ZINF_F32, "a refused name leaves *out alone");
}

/* Values worked by hand from the formats: bf16 keeps the top 16 bits rounded to nearest even;
 * f16 has 10 mantissa bits, max 65504, smallest subnormal 2^-24. */
Test(common, dtype_convert_known_values)
{
	float in[] = {1.0f,
		      1.00390625f /* 1 + 2^-8: tie, even stays */,
		      1.01171875f /* 1 + 3*2^-8 */,
		      65504.0f,
		      65520.0f,
		      0x1p-24f,
		      0x1p-26f,
		      -0.0f,
		      __builtin_inff(),
		      __builtin_nanf("")};
	uint16_t bf[10], hf[10];
	cr_assert_eq(zinf_dtype_convert(bf, ZINF_BF16, in, ZINF_F32, 10), 0);
	cr_assert_eq(zinf_dtype_convert(hf, ZINF_F16, in, ZINF_F32, 10), 0);
	cr_assert_eq(bf[0], 0x3f80);
	cr_assert_eq(bf[1], 0x3f80, "tie rounds to even: 0x%04x", bf[1]);
	cr_assert_eq(bf[2], 0x3f82, "tie rounds up to even: 0x%04x", bf[2]);
	cr_assert_eq(bf[7], 0x8000);
	cr_assert_eq(bf[8], 0x7f80);
	cr_assert((bf[9] & 0x7f80) == 0x7f80 && (bf[9] & 0x7f), "NaN stays NaN: 0x%04x", bf[9]);
	cr_assert_eq(hf[0], 0x3c00);
	cr_assert_eq(hf[3], 0x7bff, "65504 is the largest half");
	cr_assert_eq(hf[4], 0x7c00, "65520 overflows to infinity");
	cr_assert_eq(hf[5], 0x0001, "2^-24 is the smallest subnormal");
	cr_assert_eq(hf[6], 0x0000, "2^-26 rounds to zero");
	cr_assert_eq(hf[7], 0x8000);
	cr_assert_eq(hf[8], 0x7c00);
	cr_assert((hf[9] & 0x7c00) == 0x7c00 && (hf[9] & 0x3ff), "NaN stays NaN: 0x%04x", hf[9]);
	float back[10];
	cr_assert_eq(zinf_dtype_convert(back, ZINF_F32, hf, ZINF_F16, 10), 0);
	cr_assert_eq(back[3], 65504.0f);
	cr_assert_eq(back[5], 0x1p-24f);
	cr_assert_eq(zinf_dtype_convert(back, ZINF_F32, bf, ZINF_BF16, 3), 0);
	cr_assert_eq(back[2], 1.015625f, "1 + 3 * 2^-8 ties to the even 1 + 2^-6");
	cr_assert_eq(zinf_dtype_convert(NULL, ZINF_F32, bf, ZINF_BF16, 3), -EINVAL);
	cr_assert_eq(zinf_dtype_convert(back, (enum zinf_dtype)9, bf, ZINF_BF16, 3), -EINVAL);
	cr_assert_eq(zinf_dtype_convert(NULL, ZINF_F32, NULL, ZINF_BF16, 0), 0);
}

/* Every 16-bit pattern widens and narrows back to itself (NaNs: to a NaN). */
Test(common, dtype_roundtrip_all_16bit_patterns)
{
	for (uint32_t u = 0; u < 65536; u++) {
		uint16_t h = (uint16_t)u;
		float f;
		uint16_t b;
		cr_assert_eq(zinf_dtype_convert(&f, ZINF_F32, &h, ZINF_F16, 1), 0);
		cr_assert_eq(zinf_dtype_convert(&b, ZINF_F16, &f, ZINF_F32, 1), 0);
		bool nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
		cr_assert(nan ? ((b & 0x7c00) == 0x7c00 && (b & 0x3ff)) : b == h,
			  "f16 0x%04x -> 0x%04x", h, b);
		cr_assert_eq(zinf_dtype_convert(&f, ZINF_F32, &h, ZINF_BF16, 1), 0);
		cr_assert_eq(zinf_dtype_convert(&b, ZINF_BF16, &f, ZINF_F32, 1), 0);
		nan = (h & 0x7f80) == 0x7f80 && (h & 0x7f);
		cr_assert(nan ? ((b & 0x7f80) == 0x7f80 && (b & 0x7f)) : b == h,
			  "bf16 0x%04x -> 0x%04x", h, b);
	}
}

/* A version 1 and a version 2 of the same options struct, as an old and a new caller see it. */
struct t_opts_v1 {
	size_t size;
	uint32_t a;
	uint32_t b;
};
struct t_opts_v2 {
	size_t size;
	uint32_t a;
	uint32_t b;
	uint64_t c; /* appended in v2 */
};
ZINF_OPTS_NO_TAIL_PAD(struct t_opts_v1, b);
ZINF_OPTS_NO_TAIL_PAD(struct t_opts_v2, c);

Test(common, opts_rule_older_caller_keeps_defaults_newer_refused)
{
	struct t_opts_v2 lib = {.size = 0, .a = 1, .b = 2, .c = 3}; /* library defaults */
	struct t_opts_v1 old = {.size = sizeof(old), .a = 10, .b = 20};
	cr_assert_eq(zc_opts_take(&lib, sizeof(lib), &old, "t_opts"), 0);
	cr_assert_eq(lib.size, sizeof(lib));
	cr_assert_eq(lib.a, 10);
	cr_assert_eq(lib.b, 20);
	cr_assert_eq(lib.c, 3, "a field the caller did not know keeps its default");

	struct t_opts_v1 mine = {.a = 1, .b = 2};
	struct t_opts_v2 newer = {.size = sizeof(newer), .a = 7, .b = 8, .c = 9};
	cr_assert_eq(zc_opts_take(&mine, sizeof(mine), &newer, "t_opts"), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "size 24 is larger than this library's (16 bytes)"),
		  "%s", zinf_last_error());
	cr_assert_eq(mine.a, 1, "a refused struct changes nothing");
	struct t_opts_v1 zero = {.size = 0, .a = 5};
	cr_assert_eq(zc_opts_take(&mine, sizeof(mine), &zero, "t_opts"), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "t_opts: size 0 is too small"), "%s",
		  zinf_last_error());
	cr_assert_eq(zc_opts_take(&mine, sizeof(mine), NULL, "t_opts"), 0);
	cr_assert_eq(mine.size, sizeof(mine));
	cr_assert_eq(mine.a, 1);
	/* Every version starts with size_t and has no tail padding, so its size is a multiple of
	 * sizeof(size_t): any other size would copy part of a field (half a pointer) */
	struct t_opts_v2 odd = {.size = sizeof(struct t_opts_v1) + 4, .a = 5, .b = 6, .c = 7};
	cr_assert_eq(zc_opts_take(&lib, sizeof(lib), &odd, "t_opts"), -EINVAL);
	cr_assert(strstr(zinf_last_error(),
			 "struct t_opts: size 20 is not a multiple of 8: ends inside a field"),
		  "%s", zinf_last_error());
	cr_assert_eq(lib.a, 10, "a refused struct changes nothing");
}

Test(common, stats_rule_older_caller_gets_its_prefix)
{
	struct t_opts_v2 lib = {.size = sizeof(lib), .a = 1, .b = 2, .c = 3};
	struct {
		struct t_opts_v1 v1;
		uint64_t canary;
	} old = {.v1 = {.size = sizeof(struct t_opts_v1)}, .canary = 0xdeadbeef};
	cr_assert_eq(zc_stats_give(&old.v1, &lib, sizeof(lib), "t_stats"), 0);
	cr_assert_eq(old.v1.size, sizeof(struct t_opts_v1));
	cr_assert_eq(old.v1.a, 1);
	cr_assert_eq(old.v1.b, 2);
	cr_assert_eq(old.canary, 0xdeadbeef, "nothing written past the caller's size");
	struct t_opts_v2 newer = {.size = sizeof(newer) + 64};
	cr_assert_eq(zc_stats_give(&newer, &lib, sizeof(lib), "t_stats"), 0);
	cr_assert_eq(newer.c, 3);
	struct t_opts_v1 bad = {.size = 3};
	cr_assert_eq(zc_stats_give(&bad, &lib, sizeof(lib), "t_stats"), -EINVAL);
	cr_assert_eq(zc_stats_give(NULL, &lib, sizeof(lib), "t_stats"), -EINVAL);
}

/* $ZINF_LOG_LEVEL's spellings: names in any case, "warning", digits 0-3; nothing else. */
Test(common, log_level_parse)
{
	enum zinf_log_level l;
	static const struct {
		const char *s;
		int want;
	} cases[] = {
		{"error", ZINF_LOG_ERROR},
		{"WARN", ZINF_LOG_WARN},
		{"warning", ZINF_LOG_WARN},
		{"Info", ZINF_LOG_INFO},
		{"debug", ZINF_LOG_DEBUG},
		{"0", ZINF_LOG_ERROR},
		{"3", ZINF_LOG_DEBUG},
		{"4", -EINVAL},
		{"", -EINVAL},
		{"debugx", -EINVAL},
		{"-1", -EINVAL},
		{NULL, -EINVAL},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int rc = zinf_log_level_parse(cases[i].s, &l);
		if (cases[i].want < 0) {
			cr_assert_eq(rc, cases[i].want, "\"%s\"", cases[i].s ? cases[i].s : "NULL");
		} else {
			cr_assert_eq(rc, 0, "\"%s\"", cases[i].s);
			cr_assert_eq((int)l, cases[i].want, "\"%s\"", cases[i].s);
		}
	}
}
