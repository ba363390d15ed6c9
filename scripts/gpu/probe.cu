/* SPDX-License-Identifier: Apache-2.0 */
// scripts/gpu/probe.cu: the GPU kit's first check (bin/probe): the device, the runtime and the
// driver, then the CUDA runtime behaviours zinf's code is written against, each answered on
// the machine at hand (they are not promises of the CUDA documentation):
//   notready  an event or stream query's cudaErrorNotReady: is it kept as the thread's last
//             error? (zinf consumes it where it queries and clears before each launch anyway)
//   register  cudaHostRegister: two ranges sharing a page but no byte; a range inside a
//             registered one (the host device's twin refuses overlap with -EEXIST, as here)
//   pageable  an async H2D then D2H from pageable memory on a non-blocking stream: the source
//             taken at the call (zinf's staging relies on it)
// Exit 0 when every answer is what zinf assumes, 1 when one is not (the line says which), 77
// without a CUDA device.
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static __global__ void
spin(long long cycles)
{
	long long t0 = clock64();
	while (clock64() - t0 < cycles) {
	}
}

static int bad;

static void
expect(const char *what, cudaError_t got, cudaError_t want)
{
	bool ok = got == want;
	printf("  %-52s %-40s %s\n", what, cudaGetErrorName(got),
	       ok ? "as assumed" : "NOT AS ASSUMED");
	bad |= !ok;
}

int
main(void)
{
	int n = 0, rt = 0, drv = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n < 1) {
		printf("no CUDA device: %s (count %d)\n", cudaGetErrorName(e), n);
		return 77;
	}
	cudaDeviceProp p;
	cudaGetDeviceProperties(&p, 0);
	cudaRuntimeGetVersion(&rt);
	cudaDriverGetVersion(&drv);
	printf("device 0 of %d: %s, compute capability %d.%d, %d SMs, %.1f GiB; runtime %d, driver "
	       "%d\n",
	       n, p.name, p.major, p.minor, p.multiProcessorCount, p.totalGlobalMem / 1073741824.0,
	       rt, drv);
	int khz = 0;
	if (cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0) != cudaSuccess || khz <= 0) {
		khz = 1500000;
	}
	cudaStream_t s;
	if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
		printf("cudaStreamCreateWithFlags failed\n");
		return 1;
	}

	printf("notready:\n");
	cudaEvent_t ev;
	cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
	spin<<<1, 1, 0, s>>>((long long)khz * 200); // 0.2 s
	cudaEventRecord(ev, s);
	expect("cudaEventQuery while the kernel runs", cudaEventQuery(ev), cudaErrorNotReady);
	cudaError_t kept = cudaGetLastError();
	printf("  the thread's last error after it: %s (%s)\n", cudaGetErrorName(kept),
	       kept == cudaSuccess ? "not kept"
				   : "kept: a launch check without clearing would fail");
	expect("cudaStreamQuery while the kernel runs", cudaStreamQuery(s), cudaErrorNotReady);
	(void)cudaGetLastError();
	expect("cudaStreamSynchronize", cudaStreamSynchronize(s), cudaSuccess);

	printf("register:\n");
	char *page = (char *)aligned_alloc(4096, 8192);
	expect("cudaHostRegister(page, 768)", cudaHostRegister(page, 768, cudaHostRegisterDefault),
	       cudaSuccess);
	expect("cudaHostRegister(page + 768, 384): same page, no byte",
	       cudaHostRegister(page + 768, 384, cudaHostRegisterDefault), cudaSuccess);
	expect("cudaHostRegister(page + 100, 100): inside the first",
	       cudaHostRegister(page + 100, 100, cudaHostRegisterDefault),
	       cudaErrorHostMemoryAlreadyRegistered);
	(void)cudaGetLastError();
	cudaHostUnregister(page);
	cudaHostUnregister(page + 768);
	free(page);

	printf("pageable:\n");
	int host[4] = {1, 2, 3, 4}, back[4] = {0}, *dev = NULL;
	cudaMalloc((void **)&dev, sizeof(host));
	spin<<<1, 1, 0, s>>>((long long)khz * 50);
	cudaMemcpyAsync(dev, host, sizeof(host), cudaMemcpyHostToDevice, s);
	memset(host, 0, sizeof(host)); // after the call, before the copy could have run
	cudaMemcpyAsync(back, dev, sizeof(back), cudaMemcpyDeviceToHost, s);
	cudaStreamSynchronize(s);
	bool taken = back[0] == 1 && back[1] == 2 && back[2] == 3 && back[3] == 4;
	printf("  H2D source taken at the call: %s (read back %d %d %d %d)\n",
	       taken ? "yes, as assumed" : "NO: NOT AS ASSUMED", back[0], back[1], back[2],
	       back[3]);
	bad |= !taken;
	cudaFree(dev);
	cudaEventDestroy(ev);
	cudaStreamDestroy(s);
	e = cudaGetLastError();
	printf("last error at the end: %s\n", cudaGetErrorName(e));
	printf("probe: %s\n", bad ? "a behaviour differs from what zinf assumes (above)"
				  : "every behaviour as zinf assumes");
	return bad ? 1 : 0;
}
