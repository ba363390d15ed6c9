// SPDX-License-Identifier: Apache-2.0
/* tests/common/test_common.c: logging, allocation hook, alignment, CPU features, topology. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/test_util.h"
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
	cr_assert_not_null(zinf_strerror(-100000));
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

	zinf_test_alloc_fail_nth(2);
	void *a = zinf_malloc(16);
	void *b = zinf_malloc(16);
	void *c = zinf_malloc(16);
	cr_assert_not_null(a);
	cr_assert_null(b, "the 2nd allocation must fail");
	cr_assert_not_null(c, "the hook fires once");
	zinf_free(a);
	zinf_free(c);
	zinf_test_alloc_fail_nth(1);
	cr_assert_null(zinf_alloc_aligned(64, 64));
	zinf_test_alloc_fail_nth(0);
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
