// SPDX-License-Identifier: Apache-2.0
/*
 * tests/common/test_main.c: Criterion's entry point, except that a run in which every test
 * skipped exits 77, so ctest reports it as skipped rather than passed.
 */
#include <criterion/criterion.h>
#include <criterion/hooks.h>

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
