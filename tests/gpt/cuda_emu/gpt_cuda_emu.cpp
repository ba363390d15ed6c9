/* SPDX-License-Identifier: Apache-2.0 */
// tests/gpt/cuda_emu/gpt_cuda_emu.cpp: examples/gpt/gpt_cuda.cu compiled as C++ on the CPU,
// its <cuda_runtime.h> and <cublas_v2.h> this directory's (see cuda_runtime.h), for
// test_gpt_cuda_emu.c; and the switch of the emulator's thread order and its last-error slot,
// for C.
#include "gpt_cuda.cu"

extern "C" void emu_set_reverse_c(int reverse);
extern "C" void emu_leave_not_ready_c(void);

extern "C" void
emu_set_reverse_c(int reverse)
{
	emu_set_reverse(reverse != 0);
}

// what an event query that found its work unfinished leaves in the thread's last-error slot
extern "C" void
emu_leave_not_ready_c(void)
{
	emu_last_error() = cudaErrorNotReady;
}
