/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/gpt/cuda_emu/cuda_runtime.h: just enough of the CUDA runtime and of the kernel
 * language for examples/gpt/gpt_cuda.cu to compile as C++ and run on the CPU, so that its
 * kernels are checked against gpt_cpu.c in a build without a GPU (test_gpt_cuda_emu.c).
 *
 * A launch runs its blocks one after another; the threads of a block are coroutines
 * (ucontext) on one OS thread, each run until it finishes or reaches a barrier:
 * __syncthreads() waits for every thread of the block, __shfl_xor_sync() for the 32 lanes of
 * the warp (values written, barrier, partner's value read, barrier). A barrier that not all
 * of its threads reach is reported (divergent __syncthreads) and aborts. The order in which
 * threads run between barriers, and the order of the blocks, is forward or backward
 * (emu_set_reverse): a kernel that reads another thread's (or block's) write without a barrier
 * between them, or whose threads (or blocks) write the same element, gives different results
 * in the two orders. __shared__ is `static`: blocks run one at a time. A launch checks
 * blockDim.x <= 1024 and 0 < gridDim.x < 2^31. "Device memory" is host memory; the device is a
 * name only; a stream is a name too, but every launch, async copy or memset and cuBLAS call
 * must name a live stream of cudaStreamCreateWithFlags (never the default stream), else the
 * emulator aborts saying which. Work runs at once, in the order queued: a host read of device
 * memory before a stream synchronisation is not caught.
 *
 * Not emulated: memory ordering beyond the barriers, dynamic shared memory, atomics, more than
 * one dimension. The lanes of a warp are independent threads here (as on Volta and later):
 * warp-synchronous code that relies on lockstep without __shfl_xor_sync or a barrier shows as
 * a race in the two orders rather than working by accident.
 */
#ifndef GPT_CUDA_EMU_RUNTIME_H
#define GPT_CUDA_EMU_RUNTIME_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#include <functional>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __shared__ static

struct emu_dim3 {
	unsigned x;
};

namespace emu
{
enum wait_kind { RUNNABLE, AT_BLOCK, AT_WARP, DONE };

struct thread {
	ucontext_t ctx;
	std::vector<char> stack;
	emu_dim3 idx;
	wait_kind state;
};

struct state {
	ucontext_t sched;
	std::vector<thread> th;
	thread *cur = nullptr;
	emu_dim3 block{0}, bdim{0}, gdim{0};
	std::function<void()> body;
	float warp_slot[1024];
	bool reverse = false;
	unsigned long launches = 0;
	std::vector<void *> streams; /* created and not yet destroyed */
};

inline state &
st()
{
	static state s;
	return s;
}

inline void
entry()
{
	st().body();
	st().cur->state = DONE;
	/* returns to uc_link: the scheduler */
}

inline void
wait(wait_kind k)
{
	state &s = st();
	thread *me = s.cur;
	me->state = k;
	swapcontext(&me->ctx, &s.sched);
}

/* Run the block's threads until every one is done; barriers as said above. */
inline void
run_block(unsigned nthreads)
{
	state &s = st();
	for (unsigned t = 0; t < nthreads; t++) {
		thread &th = s.th[t];
		getcontext(&th.ctx);
		th.ctx.uc_stack.ss_sp = th.stack.data();
		th.ctx.uc_stack.ss_size = th.stack.size();
		th.ctx.uc_link = &s.sched;
		th.idx.x = t;
		th.state = RUNNABLE;
		makecontext(&th.ctx, entry, 0);
	}
	for (;;) {
		bool ran = false;
		for (unsigned i = 0; i < nthreads; i++) {
			unsigned t = s.reverse ? nthreads - 1 - i : i;
			thread &th = s.th[t];
			if (th.state != RUNNABLE) {
				continue;
			}
			s.cur = &th;
			swapcontext(&s.sched, &th.ctx);
			s.cur = nullptr;
			ran = true;
		}
		if (ran) {
			continue;
		}
		/* nothing runnable: release a complete barrier, or it is over */
		unsigned done = 0, at_block = 0;
		for (unsigned t = 0; t < nthreads; t++) {
			done += s.th[t].state == DONE;
			at_block += s.th[t].state == AT_BLOCK;
		}
		if (done == nthreads) {
			return;
		}
		bool released = false;
		if (at_block == nthreads) {
			for (unsigned t = 0; t < nthreads; t++) {
				s.th[t].state = RUNNABLE;
			}
			released = true;
		}
		for (unsigned w = 0; w * 32 < nthreads && !released; w++) {
			unsigned at = 0;
			for (unsigned l = 0; l < 32 && w * 32 + l < nthreads; l++) {
				at += s.th[w * 32 + l].state == AT_WARP;
			}
			if (at == 32) {
				for (unsigned l = 0; l < 32; l++) {
					s.th[w * 32 + l].state = RUNNABLE;
				}
				released = true;
			}
		}
		if (!released) {
			fprintf(stderr,
				"cuda_emu: launch %lu, block %u: deadlock: %u of %u threads done, "
				"%u "
				"at __syncthreads, the rest at a warp shuffle (a divergent "
				"barrier)\n",
				s.launches, s.block.x, done, nthreads, at_block);
			abort();
		}
	}
}

/* Work queued on stream `str` by `what`: it must be a stream of cudaStreamCreateWithFlags not
 * yet destroyed (never the default stream, NULL), as gpt_cuda.cu queues everything on the
 * trainer's stream. */
inline void
check_stream(const void *str, const char *what)
{
	state &s = st();
	for (void *x : s.streams) {
		if (x == str) {
			return;
		}
	}
	fprintf(stderr,
		"cuda_emu: %s (after launch %lu) on stream %p: not a live stream of "
		"cudaStreamCreateWithFlags (the default stream?)\n",
		what, s.launches, str);
	abort();
}

inline void
launch(size_t blocks, unsigned threads, std::function<void()> body)
{
	state &s = st();
	s.launches++;
	/* the limits of a one-dimensional launch: blockDim.x <= 1024, gridDim.x < 2^31 (a
	   negative int count arrives here huge) */
	if (threads == 0 || threads > 1024 || blocks == 0 || blocks > 0x7fffffffu) {
		fprintf(stderr, "cuda_emu: launch %lu: bad shape %zu x %u\n", s.launches, blocks,
			threads);
		abort();
	}
	if (s.th.size() < threads) {
		s.th.resize(threads);
		for (auto &t : s.th) {
			t.stack.resize(256 * 1024);
		}
	}
	s.body = std::move(body);
	s.bdim.x = threads;
	s.gdim.x = (unsigned)blocks;
	/* blocks one after another, in reverse order too (emu_set_reverse): a block that reads
	   another block's write of the same launch, or two blocks writing one element, give
	   different results in the two orders */
	for (size_t i = 0; i < blocks; i++) {
		s.block.x = (unsigned)(s.reverse ? blocks - 1 - i : i);
		run_block(threads);
	}
}

template <class K> struct launcher {
	K k;
	size_t blocks;
	unsigned threads;
	template <class... A>
	void
	operator()(A... args) const
	{
		K kk = k;
		launch(blocks, threads, [=]() { kk(args...); });
	}
};

template <class K>
launcher<K *>
make_launcher(K *k, size_t blocks, unsigned threads)
{
	return launcher<K *>{k, blocks, threads};
}
} // namespace emu

#define threadIdx (emu::st().cur->idx)
#define blockIdx  (emu::st().block)
#define blockDim  (emu::st().bdim)
#define gridDim	  (emu::st().gdim)
#define KERNEL_CALL(kernel, blocks, threads, stream)                                               \
	(emu::check_stream((stream), #kernel),                                                     \
	 emu::make_launcher(kernel, (size_t)(blocks), (unsigned)(threads)))

static inline void
__syncthreads(void)
{
	emu::wait(emu::AT_BLOCK);
}

static inline float
__shfl_xor_sync(unsigned mask, float v, int lane_mask)
{
	(void)mask;
	emu::state &s = emu::st();
	unsigned t = s.cur->idx.x, base = t & ~31u;
	s.warp_slot[t] = v;
	emu::wait(emu::AT_WARP);
	float r = s.warp_slot[base + ((t & 31u) ^ (unsigned)lane_mask)];
	emu::wait(emu::AT_WARP);
	return r;
}

static inline void
emu_set_reverse(bool r)
{
	emu::st().reverse = r;
}

/* ---- the runtime ---------------------------------------------------------------------------- */

typedef void *cudaStream_t;
typedef enum { cudaSuccess = 0, cudaErrorInvalidValue = 1, cudaErrorNotReady = 600 } cudaError_t;
enum cudaMemcpyKind { cudaMemcpyDeviceToDevice = 3 };
#define cudaStreamNonBlocking 1u

/* The runtime's per-thread last error: returned and cleared by cudaGetLastError; set by a test
 * (emu_leave_not_ready_c) as a query's cudaErrorNotReady would leave it. */
static inline cudaError_t &
emu_last_error(void)
{
	static thread_local cudaError_t e = cudaSuccess;
	return e;
}
static inline cudaError_t
cudaGetLastError(void)
{
	cudaError_t e = emu_last_error();
	emu_last_error() = cudaSuccess;
	return e;
}
static inline const char *
cudaGetErrorString(cudaError_t e)
{
	return e == cudaSuccess		? "no error"
	       : e == cudaErrorNotReady ? "device not ready"
					: "invalid value";
}
static inline cudaError_t
cudaSetDevice(int d)
{
	return d == 0 ? cudaSuccess : cudaErrorInvalidValue;
}
static inline cudaError_t
cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
	(void)flags;
	*s = malloc(1); /* a name of its own */
	if (!*s) {
		return cudaErrorInvalidValue;
	}
	emu::st().streams.push_back(*s);
	return cudaSuccess;
}
static inline cudaError_t
cudaStreamSynchronize(cudaStream_t s)
{
	emu::check_stream(s, "cudaStreamSynchronize");
	return cudaSuccess;
}
static inline cudaError_t
cudaStreamDestroy(cudaStream_t s)
{
	emu::check_stream(s, "cudaStreamDestroy");
	std::vector<void *> &v = emu::st().streams;
	for (size_t i = 0; i < v.size(); i++) {
		if (v[i] == s) {
			v.erase(v.begin() + (long)i);
			break;
		}
	}
	free(s);
	return cudaSuccess;
}
static inline cudaError_t
cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s)
{
	(void)k;
	emu::check_stream(s, "cudaMemcpyAsync");
	memcpy(dst, src, n);
	return cudaSuccess;
}
static inline cudaError_t
cudaMemsetAsync(void *dst, int v, size_t n, cudaStream_t s)
{
	emu::check_stream(s, "cudaMemsetAsync");
	memset(dst, v, n);
	return cudaSuccess;
}

#endif
