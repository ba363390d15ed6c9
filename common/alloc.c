/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common/alloc.c: the library's allocation entry points, with a failing-allocator hook so
 * that tests reach every out-of-memory path without mocks, and the huge-page allocator for I/O
 * and pinned buffers (zinf_alloc_huge; mmap, outside the hook: its callers' out-of-memory
 * paths are tested through their own allocations).
 */
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#endif
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "common/util.h"

static atomic_long fail_countdown; /* 0: disarmed; n: the n-th allocation from now fails */

void
zc_test_alloc_fail_nth(long n)
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

void
zc_leave(void *p)
{
#if defined(__SANITIZE_ADDRESS__)
	if (p) {
		__lsan_ignore_object(p);
	}
#else
	(void)p;
#endif
}

void *
zc_malloc(size_t len)
{
	return should_fail() ? NULL : malloc(len ? len : 1);
}

void *
zc_calloc(size_t n, size_t len)
{
	return should_fail() ? NULL : calloc(n ? n : 1, len ? len : 1);
}

void *
zc_realloc(void *p, size_t len)
{
	return should_fail() ? NULL : realloc(p, len ? len : 1);
}

void
zc_free(void *p)
{
	free(p);
}

char *
zc_strdup(const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = zc_malloc(n);
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

void *
zinf_alloc_huge(size_t len)
{
	const size_t huge = ZINF_HUGE_PAGE;
	if (len == 0 || len > SIZE_MAX - 2 * huge) {
		return NULL;
	}
	size_t map_len = ZINF_ALIGN_UP(len, huge);
	/* Over-map by one huge page, then trim, so that the buffer starts on a boundary. */
	char *m = mmap(NULL, map_len + huge, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (m == MAP_FAILED) {
		return NULL;
	}
	char *p = (char *)ZINF_ALIGN_UP((uintptr_t)m, (uintptr_t)huge);
	if (p > m) {
		munmap(m, (size_t)(p - m));
	}
	if (p + map_len < m + map_len + huge) {
		munmap(p + map_len, (size_t)(m + map_len + huge - (p + map_len)));
	}
	/* Before the first touch: pages faulted in earlier stay 4 KiB. */
	(void)madvise(p, map_len, MADV_HUGEPAGE);
	return p;
}

void
zinf_free_huge(void *p, size_t len)
{
	if (p) {
		munmap(p, ZINF_ALIGN_UP(len, (size_t)ZINF_HUGE_PAGE));
	}
}
