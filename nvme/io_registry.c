/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvme/io_registry.c: the I/O backends, best first, and lookup by name. The only file in nvme/
 * that knows which backends were built: one that was not answers -ENODEV when a context asks
 * for a worker. Tables are listed here, never registered from constructors (a static library
 * would drop them).
 */
#include <string.h>

#include "nvme/io_internal.h"

static int __attribute__((unused))
not_built(struct zinf_io *io, unsigned id, unsigned depth, struct zinf_io_worker **out)
{
	return -ENODEV;
}

#if ZINF_HAVE_LIBURING
extern const struct zinf_io_ops zinf_io_uring_ops;
#else
static const struct zinf_io_ops zinf_io_uring_ops = {
	.name = "io_uring",
	.worker_create = not_built,
};
#endif

#if ZINF_HAVE_LIBAIO
extern const struct zinf_io_ops zinf_io_libaio_ops;
#else
static const struct zinf_io_ops zinf_io_libaio_ops = {
	.name = "libaio",
	.worker_create = not_built,
};
#endif

const struct zinf_io_ops *const zinf_io_registry[] = {
	&zinf_io_uring_ops,
	&zinf_io_libaio_ops,
	&zinf_io_psync_ops,
	&zinf_io_fault_ops_table,
};
const unsigned zinf_io_registry_len = ZINF_ARRAY_SIZE(zinf_io_registry);

const struct zinf_io_ops *
io_ops_find(const char *name)
{
	for (unsigned i = 0; i < zinf_io_registry_len; i++) {
		if (strcmp(zinf_io_registry[i]->name, name) == 0) {
			return zinf_io_registry[i];
		}
	}
	return NULL;
}
