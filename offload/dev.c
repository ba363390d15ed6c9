// SPDX-License-Identifier: Apache-2.0
/*
 * offload/dev.c: the registry of device tables, best first. The only file that knows which
 * device backends were built.
 */
#include <string.h>

#include "common/util.h"
#include "offload/dev_internal.h"

static const struct zinf_dev_ops *const registry[] = {
#if ZINF_HAVE_CUDA
	&zinf_dev_cuda_ops,
#endif
	&zinf_dev_host_ops,
};

int
zinf_dev_get(const char *name, const struct zinf_dev_ops **out)
{
	for (size_t i = 0; i < ZINF_ARRAY_SIZE(registry); i++) {
		const struct zinf_dev_ops *ops = registry[i];
		if (name && strcmp(name, ops->name) != 0) {
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
	return ZINF_FAIL(-ENODEV, "device \"%s\" not built", name ? name : "(any)");
}
