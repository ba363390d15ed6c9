/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/rank_check.h: the multi-rank test programs' check (tests/comm/test_comm_ranks.c,
 * test_engine_ranks.c, tests/ckpt/test_ckpt_ranks.c): CHECK prints the failed condition with
 * the rank (a file-scope `rank`) and counts it in the case's local `fails`, and goes on; SKIP is
 * a case's "skipped" result. No MPI here: the programs reduce the counts themselves.
 */
#ifndef ZINF_TESTS_RANK_CHECK_H
#define ZINF_TESTS_RANK_CHECK_H

#include <stdio.h>

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "rank %d: %s:%d: %s: ", rank, __func__, __LINE__, #cond);  \
			fprintf(stderr, __VA_ARGS__);                                              \
			fprintf(stderr, "\n");                                                     \
			fails++;                                                                   \
		}                                                                                  \
	} while (0)
#define SKIP 1000 /* a case's return value: skipped */

#endif
