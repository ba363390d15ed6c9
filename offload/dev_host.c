// SPDX-License-Identifier: Apache-2.0
/*
 * offload/dev_host.c: the "host" device: device memory is host memory, copies are memcpy and
 * host registration is a no-op (the pool does its own mlock). Lets everything above the device
 * table run without a GPU.
 */
#include <string.h>

#include "common/util.h"
#include "offload/dev_internal.h"

static int
host_probe(void)
{
	return 1;
}

static int
host_register(void *p, size_t len)
{
	return 0;
}

static void
host_unregister(void *p)
{
}

static int
host_alloc(size_t len, void **out)
{
	void *p = zinf_alloc_aligned(4096, len ? len : 1);
	if (!p) {
		return ZINF_FAIL(-ENOMEM, "host device: cannot allocate %zu bytes", len);
	}
	*out = p;
	return 0;
}

static void
host_free(void *p)
{
	zinf_free_aligned(p);
}

static int
host_copy(void *dst, const void *src, size_t len, enum zinf_dev_copy dir)
{
	memcpy(dst, src, len);
	return 0;
}

const struct zinf_dev_ops zinf_dev_host_ops = {
	.name = "host",
	.probe = host_probe,
	.host_register = host_register,
	.host_unregister = host_unregister,
	.alloc = host_alloc,
	.free = host_free,
	.copy = host_copy,
};
