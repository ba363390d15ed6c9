// SPDX-License-Identifier: Apache-2.0
/*
 * offload/dev_cuda.c: the "cuda" device through the CUDA runtime: host registration with
 * cudaHostRegister, cudaMalloc, synchronous cudaMemcpy. Compiled only with ZINF_HAVE_CUDA; the
 * only file of offload/ that includes cuda_runtime.h. Every CUDA status goes through cuda_check,
 * which logs the call, file and line and returns a negative errno (never exits).
 */
#include <cuda_runtime.h>

#include "common/util.h"
#include "offload/dev_internal.h"

static int
cuda_check_at(cudaError_t e, const char *call, const char *file, int line)
{
	if (e == cudaSuccess) {
		return 0;
	}
	int err = -EIO;
	switch (e) {
	case cudaErrorMemoryAllocation:
		err = -ENOMEM;
		break;
	case cudaErrorInvalidValue:
		err = -EINVAL;
		break;
	case cudaErrorNoDevice:
	case cudaErrorInsufficientDriver:
		err = -ENODEV;
		break;
	case cudaErrorHostMemoryAlreadyRegistered:
		err = -EEXIST;
		break;
	default:
		break;
	}
	(void)cudaGetLastError(); /* clear the sticky-free error state */
	return zinf_log_emit(err, ZINF_LOG_ERROR, file, line, __func__, "%s: %s (%s)", call,
			     cudaGetErrorString(e), cudaGetErrorName(e));
}
#define cuda_check(call) cuda_check_at((call), #call, __FILE__, __LINE__)

static int
cuda_probe(void)
{
	int n = 0;
	/* No GPU, no driver, a driver too old: every error means "no device" here. */
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess) {
		(void)cudaGetLastError();
		ZINF_DEBUG("cuda: no device: %s", cudaGetErrorString(e));
		return -ENODEV;
	}
	return n > 0 ? n : -ENODEV;
}

static int
cuda_host_register(void *p, size_t len)
{
	return cuda_check(cudaHostRegister(p, len, cudaHostRegisterDefault));
}

static void
cuda_host_unregister(void *p)
{
	(void)cuda_check(cudaHostUnregister(p));
}

static int
cuda_alloc(size_t len, void **out)
{
	return cuda_check(cudaMalloc(out, len ? len : 1));
}

static void
cuda_free(void *p)
{
	if (p) {
		(void)cuda_check(cudaFree(p));
	}
}

static int
cuda_copy(void *dst, const void *src, size_t len, enum zinf_dev_copy dir)
{
	return cuda_check(
		cudaMemcpy(dst, src, len,
			   dir == ZINF_DEV_H2D ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost));
}

const struct zinf_dev_ops zinf_dev_cuda_ops = {
	.name = "cuda",
	.probe = cuda_probe,
	.host_register = cuda_host_register,
	.host_unregister = cuda_host_unregister,
	.alloc = cuda_alloc,
	.free = cuda_free,
	.copy = cuda_copy,
};
