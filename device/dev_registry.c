/* SPDX-License-Identifier: Apache-2.0 */
/*
 * device/dev_registry.c: the device tables, best first, and lookup by name. The only file of
 * device/ that knows which backends were built: one that was not is a stub whose probe answers
 * -ENODEV. Tables are listed here, never registered from constructors (a static library would
 * drop them).
 */
#include <string.h>

#include "common/util.h"
#include "device/dev_internal.h"

#if !ZINF_HAVE_CUDA
static int
not_built(void)
{
	return -ENODEV;
}

const struct zinf_dev_ops zinf_dev_cuda_ops = {
	.name = "cuda",
	.probe = not_built,
};
#endif

static const struct zinf_dev_ops *const registry[] = {
	&zinf_dev_cuda_ops,
	&zinf_dev_host_ops,
};

/* Whether the table is a stub for a backend this library was built without. */
static bool
built(const struct zinf_dev_ops *ops)
{
	return ops->open != NULL;
}

int
dev_get(const char *name, const struct zinf_dev_ops **out)
{
	bool known = name == NULL;
	for (size_t i = 0; i < ZINF_ARRAY_SIZE(registry); i++) {
		const struct zinf_dev_ops *ops = registry[i];
		if (name && strcmp(name, ops->name) != 0) {
			continue;
		}
		known = true;
		if (!built(ops)) {
			if (name) {
				return ZINF_FAIL(-ENODEV,
						 "device \"%s\": not built into this library",
						 name);
			}
			continue;
		}
		int n = ops->probe();
		if (n <= 0) {
			if (name) {
				return ZINF_FAIL(-ENODEV, "device \"%s\": no device (%s)", name,
						 zinf_strerror(n < 0 ? n : -ENODEV));
			}
			ZINF_DEBUG("device \"%s\" not usable, trying the next", ops->name);
			continue;
		}
		*out = ops;
		return 0;
	}
	if (!known) {
		return ZINF_FAIL(-EINVAL, "device \"%s\": unknown (expected \"cuda\" or \"host\")",
				 name);
	}
	return ZINF_FAIL(-ENODEV, "device: none usable");
}
