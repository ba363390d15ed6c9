/* SPDX-License-Identifier: Apache-2.0 */
/*
 * offload/dev_internal.h: the device ops table (private). A minimal table for what the tiered
 * store needs from a device: probe, host-memory registration (cudaHostRegister) and plain
 * copies. "host" is ordinary memory; "cuda" is compiled only with ZINF_HAVE_CUDA. The engine's
 * fuller table (streams, events, kernels) grows from this one.
 */
#ifndef ZINF_OFFLOAD_DEV_INTERNAL_H
#define ZINF_OFFLOAD_DEV_INTERNAL_H

#include <stddef.h>

#include "zinf_config.h"

enum zinf_dev_copy { ZINF_DEV_H2D = 0, ZINF_DEV_D2H = 1 };

struct zinf_dev_ops {
	const char *name;
	/* Devices present (>= 1), or a negative errno (-ENODEV: none, or the driver failed). */
	int (*probe)(void);
	/* Page-lock [p, p + len) for the device's DMA; 0 or -errno (message logged). */
	int (*host_register)(void *p, size_t len);
	void (*host_unregister)(void *p);
	int (*alloc)(size_t len, void **out); /* device memory */
	void (*free)(void *p);
	int (*copy)(void *dst, const void *src, size_t len, enum zinf_dev_copy dir); /* sync */
};

extern const struct zinf_dev_ops zinf_dev_host_ops;
#if ZINF_HAVE_CUDA
extern const struct zinf_dev_ops zinf_dev_cuda_ops;
#endif

/*
 * The device table named `name` ("cuda", "host"), or with NULL the best that works: "cuda" when
 * it probes at least one device (any CUDA error counts as no device), else "host". Returns 0
 * and sets *out; -ENODEV when the named table is not built or finds no device.
 */
int zinf_dev_get(const char *name, const struct zinf_dev_ops **out);

#endif
