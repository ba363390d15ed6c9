/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/cpu_adam/test_adam_env.c: the ZINF_SIMD environment override (zinf/blocks/adam.h). ctest
 * runs this binary with ZINF_SIMD set before the process starts (tests/cpu_adam/CMakeLists.txt): to
 * "scalar" in the variant `scalar`, to the unknown "sse9" in the variant `sse9`. Checked: the
 * default path (opts.simd NULL) follows the environment; an option wins over it; a bad value
 * fails only the calls that use the default, with a message naming ZINF_SIMD; the variable is
 * read once per process (a later setenv changes nothing).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "common/util.h"
#include "zinf/blocks/adam.h"

#define N 203

/* The variant, checked against the environment ctest gave the process. */
static const char *
env_variant(void)
{
	const char *v = zt_variant(), *env = getenv("ZINF_SIMD");
	cr_assert(v && env, "run by ctest as cpu_adam_env.<variant>, with ZINF_SIMD set");
	cr_assert_str_eq(env, v, "ZINF_SIMD is not the variant's value");
	return v;
}

/* Three Adam steps on path `simd` (NULL: the default) over fixed data; returns 0 or -errno and
 * leaves the parameters in p. */
static int
adam_on(const char *simd, float *p)
{
	float g[N], m[N] = {0}, v[N] = {0};
	uint64_t st = 77;
	for (size_t i = 0; i < N; i++) {
		p[i] = (float)zt_uniform(&st, -1, 1);
		g[i] = (float)zt_uniform(&st, -1, 1);
	}
	struct zinf_adam_opts o;
	zinf_adam_opts_init(&o);
	o.lr = 0.1f;
	o.threads = 1;
	o.simd = simd;
	for (int t = 1; t <= 3; t++) {
		int r = zinf_adam_step(&o, t, 0.7f, p, g, ZINF_F32, m, v, N, NULL, 0);
		if (r) {
			return r;
		}
	}
	return 0;
}

Test(cpu_adam_env, default_path_follows_the_environment)
{
	const char *env = env_variant();
	const char *got = "untouched";
	float p0[N], p1[N];
	if (strcmp(env, "scalar") == 0) {
		cr_assert_eq(zinf_simd_resolve(NULL, &got), 0, "%s", zinf_last_error());
		cr_assert_str_eq(got, "scalar");
		/* the step with no option is the scalar step, bit for bit ... */
		cr_assert_eq(adam_on(NULL, p0), 0);
		cr_assert_eq(adam_on("scalar", p1), 0);
		cr_assert(memcmp(p0, p1, sizeof(p0)) == 0, "default step is not the scalar step");
		/* ... and not the best path's, where that is another (FMA changes some bits) */
		if (strcmp(zinf_simd_best(), "scalar") != 0) {
			cr_assert_eq(adam_on(zinf_simd_best(), p1), 0);
			cr_assert(memcmp(p0, p1, sizeof(p0)) != 0,
				  "the default step equals the %s step", zinf_simd_best());
		}
		return;
	}
	cr_assert_eq(zinf_simd_resolve(NULL, &got), -EINVAL);
	cr_assert_str_eq(got, "untouched");
	cr_assert_str_eq(zinf_last_error(),
			 "zinf_simd_resolve: SIMD path \"sse9\" (ZINF_SIMD, read once per process) "
			 "is unknown: expected avx512, avx2 or scalar");
	cr_assert_eq(adam_on(NULL, p0), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "zinf_adam_step: SIMD path \"sse9\" (ZINF_SIMD"), "%s",
		  zinf_last_error());
	double s;
	cr_assert_eq(zinf_grad_sumsq(p0, ZINF_F32, N, NULL, &s), -EINVAL);
	/* zinf_simd_best() does not consult the environment */
	cr_assert_str_neq(zinf_simd_best(), "sse9");
}

Test(cpu_adam_env, option_wins_over_the_environment)
{
	env_variant();
	float p0[N], p1[N];
	for (unsigned i = 0; zinf_simd_path(i); i++) {
		const char *path = zinf_simd_path(i), *got;
		if (zinf_simd_resolve(path, &got) != 0) {
			continue; /* not runnable here: -ENODEV, tested elsewhere */
		}
		cr_assert_str_eq(got, path);
		cr_assert_eq(adam_on(path, p0), 0, "%s: %s", path, zinf_last_error());
		struct zinf_grad_opts go;
		zinf_grad_opts_init(&go);
		go.simd = path;
		double s;
		cr_assert_eq(zinf_grad_sumsq(p0, ZINF_F32, N, &go, &s), 0, "%s", zinf_last_error());
		cr_assert_eq(zinf_grad_has_inf_nan(p0, ZINF_F32, N, &go), 0);
	}
	/* the option's path is the one that ran: scalar and the best path differ in some bits */
	if (strcmp(zinf_simd_best(), "scalar") != 0) {
		cr_assert_eq(adam_on(zinf_simd_best(), p0), 0);
		cr_assert_eq(adam_on("scalar", p1), 0);
		cr_assert(memcmp(p0, p1, sizeof(p0)) != 0, "%s and scalar steps are equal",
			  zinf_simd_best());
	}
}

Test(cpu_adam_env, environment_is_read_once)
{
	const char *env = env_variant();
	const char *before, *after;
	int r0 = zinf_simd_resolve(NULL, &before); /* the first choice: ZINF_SIMD read now */
	setenv("ZINF_SIMD", strcmp(env, "scalar") == 0 ? "sse9" : "scalar", 1);
	int r1 = zinf_simd_resolve(NULL, &after);
	cr_assert_eq(r1, r0, "the result changed after setenv: %d then %d", r0, r1);
	if (r0 == 0) {
		cr_assert_str_eq(after, before);
		cr_assert_str_eq(after, "scalar");
	} else {
		cr_assert(strstr(zinf_last_error(), "\"sse9\" (ZINF_SIMD"), "%s",
			  zinf_last_error());
	}
	setenv("ZINF_SIMD", env, 1);
}
