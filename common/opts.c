/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common/opts.c: the size-versioned struct rule (common/opts.h) in one place, for options and
 * statistics alike.
 */
#include <string.h>

#include "common/opts.h"
#include "common/util.h"

int
zc_opts_take(void *dst, size_t dst_size, const void *src, const char *type)
{
	if (src) {
		size_t n;
		memcpy(&n, src, sizeof(n));
		if (n < sizeof(size_t)) {
			return ZINF_FAIL(
				-EINVAL,
				"struct %s: size %zu is too small (call %s_init to set it)", type,
				n, type);
		}
		if (n > dst_size) {
			return ZINF_FAIL(-EINVAL,
					 "struct %s: size %zu is larger than this library's (%zu "
					 "bytes): the caller was built against a newer zinf",
					 type, n, dst_size);
		}
		if (n % sizeof(size_t) != 0) {
			/* Every version starts with size_t and ends without tail padding, so its
			 * sizeof is a multiple of sizeof(size_t): any other size would copy part of
			 * a field (half a pointer, which the library would then follow). */
			return ZINF_FAIL(
				-EINVAL,
				"struct %s: size %zu is not a multiple of %zu: ends inside "
				"a field (call %s_init to set it)",
				type, n, sizeof(size_t), type);
		}
		memcpy(dst, src, n);
	}
	memcpy(dst, &dst_size, sizeof(size_t));
	return 0;
}

int
zc_stats_give(void *dst, const void *src, size_t src_size, const char *type)
{
	if (!dst) {
		return ZINF_FAIL(-EINVAL, "struct %s: NULL output", type);
	}
	size_t n;
	memcpy(&n, dst, sizeof(n));
	if (n < sizeof(size_t)) {
		return ZINF_FAIL(-EINVAL,
				 "struct %s: size %zu is too small (set it to sizeof(struct %s))",
				 type, n, type);
	}
	size_t copy = ZINF_MIN(n, src_size);
	memcpy((char *)dst + sizeof(size_t), (const char *)src + sizeof(size_t),
	       copy - sizeof(size_t));
	return 0;
}
