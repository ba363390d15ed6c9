/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/common/test_main.c: Criterion's entry point, except that a run in which every test
 * skipped exits 77, so ctest reports it as skipped rather than passed; and the helpers of
 * tests/common/test_util.h that need Criterion (zt_simd_variant, zt_io_open) (test_util.c stays
 * free of it, for the plain programs run under mpirun).
 */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <errno.h>
#include <string.h>

#include "common/test_util.h"
#include "zinf/blocks/adam.h"
#include "zinf/blocks/io.h"

static size_t n_tests, n_skipped;

ReportHook(POST_ALL)(struct criterion_global_stats *stats)
{
	n_tests = stats->nb_tests;
	n_skipped = stats->tests_skipped;
}

int
main(int argc, char *argv[])
{
	struct criterion_test_set *tests = criterion_initialize();
	int rc = 0;
	if (criterion_handle_args(argc, argv, true)) {
		rc = !criterion_run_all_tests(tests);
	}
	criterion_finalize(tests);
	if (rc == 0 && n_tests > 0 && n_skipped == n_tests) {
		return 77;
	}
	return rc;
}

const char *
zt_simd_variant(void)
{
	const char *v = zt_variant();
	int r = zinf_simd_resolve(v, NULL);
	if (r == -ENODEV) {
		cr_skip_test("SIMD path %s not available on this CPU/build: %s", v,
			     zinf_last_error());
	}
	cr_assert_eq(r, 0, "SIMD path %s: %s", v ? v : "(default)", zinf_last_error());
	return v;
}

struct zinf_io *
zt_io_open(const struct zinf_io_opts *o)
{
	struct zinf_io *io = NULL;
	const char *b = o ? o->backend : NULL;
	const char *engine = b && strcmp(b, "fault") == 0 ? o->fault_inner : b;
	int rc = zinf_io_create(o, &io);
	if (rc == -ENODEV && zt_io_may_be_absent(engine)) {
		cr_skip_test("I/O backend %s absent here: %s", engine, zinf_last_error());
	}
	cr_assert_eq(rc, 0, "zinf_io_create(backend %s, fault_inner %s): %d %s", b ? b : "(best)",
		     b && engine != b && engine ? engine : "-", rc, zinf_last_error());
	cr_assert_not_null(io);
	return io;
}
