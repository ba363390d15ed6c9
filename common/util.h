/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common/util.h: private helpers every module uses: alignment macros, container_of, the
 * logging macros that carry file/line/function, and small arithmetic. Not installed.
 */
#ifndef ZINF_UTIL_H
#define ZINF_UTIL_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "zinf/common.h"
#include "zinf_config.h"

#define ZINF_ALIGN_UP(x, a)	((((x) + (a)-1) / (a)) * (a))
#define ZINF_ALIGN_DOWN(x, a)	(((x) / (a)) * (a))
#define ZINF_IS_ALIGNED(x, a)	(((x) % (a)) == 0)
#define ZINF_DIV_ROUND_UP(x, d) (((x) + (d)-1) / (d))
#define ZINF_IS_POW2(x)		((x) != 0 && (((x) & ((x)-1)) == 0))
#define ZINF_MIN(a, b)		((a) < (b) ? (a) : (b))
#define ZINF_MAX(a, b)		((a) > (b) ? (a) : (b))
#define ZINF_ARRAY_SIZE(a)	(sizeof(a) / sizeof((a)[0]))

/* splitmix64's finaliser: a 64-bit value's bits spread over all 64 (seeds of hash streams). */
static inline uint64_t
zc_mix64(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

#define zinf_container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

/* Emit a message; returns `ret` so that error paths read `return ZINF_FAIL(-EINVAL, ...)`. */
int zc_log_emit(int ret, enum zinf_log_level level, const char *file, int line, const char *func,
		const char *fmt, ...) __attribute__((format(printf, 6, 7)));
int zc_log_vemit(int ret, enum zinf_log_level level, const char *file, int line, const char *func,
		 const char *fmt, va_list ap);

#define ZINF_LOG(level, ...) zc_log_emit(0, (level), __FILE__, __LINE__, __func__, __VA_ARGS__)
#define ZINF_ERR(...)	     ZINF_LOG(ZINF_LOG_ERROR, __VA_ARGS__)
#define ZINF_WARN(...)	     ZINF_LOG(ZINF_LOG_WARN, __VA_ARGS__)
#define ZINF_INFO(...)	     ZINF_LOG(ZINF_LOG_INFO, __VA_ARGS__)
#define ZINF_DEBUG(...)	     ZINF_LOG(ZINF_LOG_DEBUG, __VA_ARGS__)
/* Log at ERROR and evaluate to err (a negative errno). */
#define ZINF_FAIL(err, ...)                                                                        \
	zc_log_emit((err), ZINF_LOG_ERROR, __FILE__, __LINE__, __func__, __VA_ARGS__)

/*
 * Messages that name their object, as SPDK's URING_ERRLOG(uring, ...): `name` (a string that
 * identifies the object: "swap /mnt/a,/mnt/b rank 0", "io_uring I/O context", a path) goes
 * first, then ": " and the message. A module wraps them once for its object:
 *   #define SWAP_FAIL(s, err, ...) ZINF_OBJ_FAIL(swap_name(s), err, __VA_ARGS__)
 * ZINF_OBJ_FAIL logs at ERROR and evaluates to err, as ZINF_FAIL.
 */
#define ZINF_OBJ_LOG(level, name, fmt, ...)                                                        \
	zc_log_emit(0, (level), __FILE__, __LINE__, __func__, "%s: " fmt, (name), ##__VA_ARGS__)
#define ZINF_OBJ_FAIL(name, err, fmt, ...)                                                         \
	zc_log_emit((err), ZINF_LOG_ERROR, __FILE__, __LINE__, __func__, "%s: " fmt, (name),       \
		    ##__VA_ARGS__)

/* Allocation that tests can make fail (the failing allocator hook). */
void *zc_malloc(size_t len);
void *zc_calloc(size_t n, size_t len);
void *zc_realloc(void *p, size_t len); /* NULL: p is left as it was */
void zc_free(void *p);
char *zc_strdup(const char *s);
/*
 * Memory given away on purpose rather than freed: a buffer an abandoned MPI call may still
 * read or write (a failed communicator's). Under LeakSanitizer it is marked as no leak (p: the
 * start of a zc_malloc/zc_calloc/zinf_alloc_aligned block; anything else is ignored), so
 * that the sanitizer still reports every buffer of the same kind that a healthy run loses.
 */
void zc_leave(void *p);
/*
 * Test hook: make the n-th zc_malloc/zc_calloc/zinf_alloc_aligned call from now fail
 * (n >= 1); n = 0 disarms it. Process-wide; only tests call it.
 */
void zc_test_alloc_fail_nth(long n);

/* The alignment zinf_alloc_huge() gives: one x86-64 transparent huge page. */
#define ZINF_HUGE_PAGE (2u << 20)

#endif
