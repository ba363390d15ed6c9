/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kernels/kernels_internal.cuh: what the .cu files share: the launch shape (grid-stride loops
 * over size_t indices). Elements are loaded and stored with common/dtype.h's dt_load/store,
 * compiled for the device (ZINF_HD): the same code the host device runs.
 */
#ifndef ZINF_KERNELS_INTERNAL_CUH
#define ZINF_KERNELS_INTERNAL_CUH

#include <cuda_runtime.h>

#include "common/dtype.h"
#include "kernels/kernels.h"

#define ZINF_K_THREADS	  256
#define ZINF_K_MAX_BLOCKS 4096

/* Blocks for n elements, one per ZINF_K_THREADS up to ZINF_K_MAX_BLOCKS (grid-stride after). */
static inline unsigned
kern_blocks(size_t n, unsigned max)
{
	size_t b = (n + ZINF_K_THREADS - 1) / ZINF_K_THREADS;
	return (unsigned)(b < max ? (b ? b : 1) : max);
}

/*
 * ZINF_K_LAUNCH(kernel, blocks, threads, stream, args...): queue kernel and evaluate to the
 * status of this launch alone, as an int (0: cudaSuccess). The thread's last-error slot is
 * cleared first: a cudaErrorNotReady left by an event or stream query, or an error that its own
 * call already returned, must not be taken for this launch's failure. A sticky error (a broken
 * context) survives the clearing and fails the launch, as it should.
 */
#define ZINF_K_LAUNCH(kernel, blocks, threads, stream, ...)                                        \
	((void)cudaGetLastError(), kernel<<<(blocks), (threads), 0, (stream)>>>(__VA_ARGS__),      \
	 (int)cudaGetLastError())

#define ZINF_K_FOR(i, n)                                                                           \
	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                    \
	     i += (size_t)gridDim.x * blockDim.x)

#endif
