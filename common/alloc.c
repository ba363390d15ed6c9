// SPDX-License-Identifier: Apache-2.0
/*
 * common/alloc.c: the library's allocation entry points, with a failing-allocator hook so
 * that tests reach every out-of-memory path without mocks.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

static atomic_long fail_countdown; /* 0: disarmed; n: the n-th allocation from now fails */

void
zinf_test_alloc_fail_nth(long n)
{
	atomic_store(&fail_countdown, n > 0 ? n : 0);
}

static bool
should_fail(void)
{
	long c = atomic_load(&fail_countdown);
	while (c > 0) {
		if (atomic_compare_exchange_weak(&fail_countdown, &c, c - 1)) {
			return c == 1;
		}
	}
	return false;
}

void *
zinf_malloc(size_t len)
{
	return should_fail() ? NULL : malloc(len ? len : 1);
}

void *
zinf_calloc(size_t n, size_t len)
{
	return should_fail() ? NULL : calloc(n ? n : 1, len ? len : 1);
}

void
zinf_free(void *p)
{
	free(p);
}

char *
zinf_strdup(const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = zinf_malloc(n);
	if (d) {
		memcpy(d, s, n);
	}
	return d;
}

void *
zinf_alloc_aligned(size_t align, size_t len)
{
	void *p = NULL;
	if (!ZINF_IS_POW2(align) || align < sizeof(void *) || should_fail()) {
		return NULL;
	}
	if (posix_memalign(&p, align, len ? len : align) != 0) {
		return NULL;
	}
	return p;
}

void
zinf_free_aligned(void *p)
{
	free(p);
}
