/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common/opts.h: the one rule for every size-versioned struct of the public API (options and
 * statistics), as SPDK's opts_size. Not installed.
 *
 * Options: the caller's struct starts with `size_t size` (sizeof of the struct it was compiled
 * against, set by the *_opts_init() it called). A caller built against an older, smaller struct
 * still works: the library starts from its own defaults and copies the caller's `size` bytes over
 * them, so the fields that caller did not know keep their defaults. A larger struct (a newer
 * caller than this library) is refused, as is a size too small to hold the size field, and a
 * size that is not a multiple of sizeof(size_t) (no version has one: see below; it would end
 * inside a field, such as half a pointer).
 * Fields are only ever appended, and no struct may end in tail padding (an older caller's
 * padding would otherwise be copied into the first field appended after it): each struct's .c
 * file pins that with ZINF_OPTS_NO_TAIL_PAD.
 *
 * Statistics: the caller sets out->size; the library writes the first min(out->size, its own
 * size) bytes and leaves out->size as it was.
 */
#ifndef ZINF_COMMON_OPTS_H
#define ZINF_COMMON_OPTS_H

#include <assert.h>
#include <stddef.h>

/*
 * Take the caller's options: *dst already holds the defaults (the type's _opts_init), dst_size
 * is sizeof(*dst); src may be NULL (defaults). On success dst->size is set to dst_size.
 * Returns 0, or -EINVAL with a message naming `type`, the caller's size and the library's.
 */
int zc_opts_take(void *dst, size_t dst_size, const void *src, const char *type);

/*
 * Give statistics: copy min(dst->size, src_size) bytes of src into dst, keeping dst->size.
 * Returns 0, or -EINVAL (dst NULL, or dst->size smaller than the size field) with a message.
 */
int zc_stats_give(void *dst, const void *src, size_t src_size, const char *type);

/* Pin that `type` ends with `last` and no tail padding (see the rule above). */
#define ZINF_OPTS_NO_TAIL_PAD(type, last)                                                          \
	static_assert(sizeof(type) == offsetof(type, last) + sizeof(((type *)0)->last),            \
		      #type " ends in tail padding: add explicit reserved bytes after " #last)

#endif
