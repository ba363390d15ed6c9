/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt_cuda.cu: the layers of both architectures on a GPU (the "cuda" device),
 * forward and backward, the same math as the CPU layers in fp32: GPT-2's as gpt_cpu.c's,
 * Llama's (RMSNorm, rotary embeddings, grouped-query attention, SwiGLU, a tied or own head) as
 * llama_cpu.c's; the causal attention kernels serve both (GPT-2 is the case of as many
 * key-value heads as query heads). cuBLAS sgemm for the matrix products (the default math mode:
 * fp32, no TF32), kernels for the rest, everything queued on the trainer's compute stream (the
 * cudaStream_t it gives the engine as compute_stream; cublasSetStream).
 *
 * Deterministic: no atomics. Every output element is written by one thread; a sum over a row
 * is a fixed tree (warp shuffles, then the warps in order) for a fixed block size, and a sum
 * over rows (bias, LayerNorm and RMSNorm weight gradients, the attention's key and value
 * gradients, summed over the query heads that share them, the embedding gradients) is one
 * thread's loop in the CPU's order. cuBLAS gives the same bits on every run on the same GPU
 * model and toolkit. The results differ from the CPU's in rounding (summation order, fused
 * multiply-add): tests/gpt/check_gpt.sh (case cuda) states the tolerance.
 *
 * The gradients are set or accumulated exactly as the CPU layers' (gpt_model.h says which).
 * Errors of a launch or a cuBLAS call are kept in the context (the first one) and returned by
 * gpt_cuda_ops.status; an error of running work is returned by the next zinf_stream_sync() of
 * the compute stream. Not here: the training loop (gpt_train.c, gpt.c).
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpt_model.h"

static_assert(sizeof(gpt_real) == sizeof(float), "the cuda layers are fp32");

/* A kernel launch on a stream (no dynamic shared memory). tests/gpt/test_gpt_cuda_emu.c
 * compiles this file on the CPU with its own KERNEL_CALL (tests/gpt/cuda_emu/). */
#ifndef KERNEL_CALL
#define KERNEL_CALL(kernel, blocks, threads, stream) kernel<<<(blocks), (threads), 0, (stream)>>>
#endif
/* LAUNCH(...)(args); then check_launch: the thread's last-error slot is cleared first, so that
 * check_launch sees this launch's status only (a cudaErrorNotReady that an event query of the
 * engine or NCCL left on this thread is not a failed launch). */
#define LAUNCH(kernel, blocks, threads, stream)                                                    \
	(void)cudaGetLastError(), KERNEL_CALL(kernel, blocks, threads, stream)

/* The backend's state: the trainer's stream and the cuBLAS handle on it. */
struct gpt_cuda {
	cudaStream_t s;
	cublasHandle_t h;
	int dev;
	int err; /* 0, or the first error (-EIO), said once on stderr */
};

static void
cuda_fail(struct gpt_cuda *g, const char *what, const char *detail)
{
	if (!g->err) {
		fprintf(stderr, "zinf_gpt: cuda layers: %s: %s\n", what, detail);
		g->err = -EIO;
	}
}

static void
check_launch(struct gpt_cuda *g, const char *kernel)
{
	cudaError_t e = cudaGetLastError();
	if (e != cudaSuccess) {
		cuda_fail(g, kernel, cudaGetErrorString(e));
	}
}

static void
check_blas(struct gpt_cuda *g, cublasStatus_t st, const char *what)
{
	if (st != CUBLAS_STATUS_SUCCESS) {
		cuda_fail(g, what, cublasGetStatusString(st));
	}
}

/* ---- launch shapes ------------------------------------------------------------------------- */

#define ROW_THREADS 128 /* a block per row: a multiple of 32 (full warps for the shuffles) */
#define EW_THREADS  256

/* blocks for a grid-stride loop over n elements */
static unsigned
ew_blocks(size_t n)
{
	size_t b = (n + EW_THREADS - 1) / EW_THREADS;
	return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

/* ---- block reductions (a fixed tree for a fixed blockDim.x, a multiple of 32) --------------- */

struct op_sum {
	__device__ static float
	apply(float a, float b)
	{
		return a + b;
	}
};
struct op_max {
	__device__ static float
	apply(float a, float b)
	{
		return fmaxf(a, b);
	}
};

/*
 * Every thread's v combined; every thread gets the result. sh: 33 floats of shared memory.
 * Each warp reduces by xor butterfly (every lane ends with the same value: a + b == b + a),
 * then warp 0 reduces the warps' results the same way; the order depends only on blockDim.x.
 * Starts with a barrier, so that a previous call's readers are done with sh.
 */
template <class Op>
__device__ float
block_reduce(float v, float *sh, float identity)
{
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = (int)(blockDim.x >> 5);
	for (int o = 16; o > 0; o >>= 1) {
		v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, o));
	}
	__syncthreads();
	if (lane == 0) {
		sh[w] = v;
	}
	__syncthreads();
	if (w == 0) {
		v = lane < nw ? sh[lane] : identity;
		for (int o = 16; o > 0; o >>= 1) {
			v = Op::apply(v, __shfl_xor_sync(0xffffffffu, v, o));
		}
		if (lane == 0) {
			sh[32] = v;
		}
	}
	__syncthreads();
	return sh[32];
}

/* ---- kernels ------------------------------------------------------------------------------- */

#define LN_EPS	   1e-5f
#define GELU_SCALE 0.7978845608028654f /* sqrt(2 / pi) */

/* o = wte[tokens[i]] + wpe[i % T] (wpe NULL, Llama: wte[tokens[i]]), one thread per element */
__global__ void
k_encoder_forward(float *out, const int *tokens, const float *wte, const float *wpe, int N, int T,
		  int C)
{
	size_t n = (size_t)N * C;
	for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
	     e += (size_t)gridDim.x * blockDim.x) {
		size_t i = e / C, c = e % C;
		float we = wte[(size_t)tokens[i] * C + c];
		out[e] = wpe ? we + wpe[(i % T) * C + c] : we;
	}
}

/* dwpe[t][c] = (set) sum over b in b order; one thread per (t, c) */
__global__ void
k_encoder_backward_wpe(float *dwpe, const float *dres, int B, int T, int C)
{
	size_t n = (size_t)T * C;
	for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
	     e += (size_t)gridDim.x * blockDim.x) {
		float s = 0;
		for (int b = 0; b < B; b++) {
			s += dres[(size_t)b * n + e];
		}
		dwpe[e] = s;
	}
}

/* dwte[tokens[i]][c] += dres[i][c] over the positions i in order; one thread per channel c (as
 * the CPU's loop: no two threads write the same element) */
__global__ void
k_encoder_backward_wte(float *dwte, const float *dres, const int *tokens, int N, int C)
{
	for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
		for (int i = 0; i < N; i++) {
			dwte[(size_t)tokens[i] * C + c] += dres[(size_t)i * C + c];
		}
	}
}

/* one block per row: mean, then the variance about it (two passes, as the CPU) */
__global__ void
k_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w,
		    const float *b, int C)
{
	__shared__ float sh[33];
	size_t i = blockIdx.x;
	const float *x = inp + i * C;
	float s = 0;
	for (int c = threadIdx.x; c < C; c += blockDim.x) {
		s += x[c];
	}
	float m = block_reduce<op_sum>(s, sh, 0.0f) / (float)C;
	float v = 0;
	for (int c = threadIdx.x; c < C; c += blockDim.x) {
		float dx = x[c] - m;
		v += dx * dx;
	}
	v = block_reduce<op_sum>(v, sh, 0.0f) / (float)C;
	float r = 1.0f / sqrtf(v + LN_EPS);
	float *o = out + i * C;
	for (int c = threadIdx.x; c < C; c += blockDim.x) {
		o[c] = (x[c] - m) * r * w[c] + b[c];
	}
	if (threadIdx.x == 0) {
		mean[i] = m;
		rstd[i] = r;
	}
}

/* dw[c], db[c] = (set) sums over the rows in order; one thread per channel */
__global__ void
k_layernorm_backward_wb(float *dw, float *db, const float *dout, const float *inp,
			const float *mean, const float *rstd, int N, int C)
{
	for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
		float sw = 0, sb = 0;
		for (int i = 0; i < N; i++) {
			float n = (inp[(size_t)i * C + c] - mean[i]) * rstd[i];
			sw += n * dout[(size_t)i * C + c];
			sb += dout[(size_t)i * C + c];
		}
		dw[c] = sw;
		db[c] = sb;
	}
}

/* dinp += d(LN)/dinp; one block per row */
__global__ void
k_layernorm_backward_x(float *dinp, const float *dout, const float *inp, const float *w,
		       const float *mean, const float *rstd, int C)
{
	__shared__ float sh[33];
	size_t i = blockIdx.x;
	const float *x = inp + i * C, *g = dout + i * C;
	float *dx = dinp + i * C;
	float m = mean[i], r = rstd[i];
	float dm = 0, dnm = 0;
	for (int c = threadIdx.x; c < C; c += blockDim.x) {
		float n = (x[c] - m) * r;
		float dn = w[c] * g[c];
		dm += dn;
		dnm += dn * n;
	}
	dm = block_reduce<op_sum>(dm, sh, 0.0f) / (float)C;
	dnm = block_reduce<op_sum>(dnm, sh, 0.0f) / (float)C;
	for (int c = threadIdx.x; c < C; c += blockDim.x) {
		float n = (x[c] - m) * r;
		float dn = w[c] * g[c];
		dx[c] += (dn - dm - n * dnm) * r;
	}
}

/* out[i][j] += b[j] */
__global__ void
k_add_bias(float *out, const float *b, int N, int OC)
{
	size_t n = (size_t)N * OC;
	for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
	     e += (size_t)gridDim.x * blockDim.x) {
		out[e] += b[e % OC];
	}
}

/* db[j] = (set) sum over the rows of dout[i][j], in row order; one thread per column */
__global__ void
k_bias_backward(float *db, const float *dout, int N, int OC)
{
	for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < OC; j += gridDim.x * blockDim.x) {
		float s = 0;
		for (int i = 0; i < N; i++) {
			s += dout[(size_t)i * OC + j];
		}
		db[j] = s;
	}
}

/* x += y */
__global__ void
k_add(float *x, const float *y, size_t n)
{
	for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
	     e += (size_t)gridDim.x * blockDim.x) {
		x[e] += y[e];
	}
}

__global__ void
k_gelu_forward(float *out, const float *inp, size_t n)
{
	for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
	     e += (size_t)gridDim.x * blockDim.x) {
		float x = inp[e];
		float cube = 0.044715f * x * x * x;
		out[e] = 0.5f * x * (1.0f + tanhf(GELU_SCALE * (x + cube)));
	}
}

/* dinp = (set) gelu'(inp) dout */
__global__ void
k_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n)
{
	for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
	     e += (size_t)gridDim.x * blockDim.x) {
		float x = inp[e];
		float cube = 0.044715f * x * x * x;
		float arg = GELU_SCALE * (x + cube);
		float th = tanhf(arg);
		float ch = coshf(arg);
		float sech2 = 1.0f / (ch * ch);
		float g = 0.5f * (1.0f + th) +
			  x * 0.5f * sech2 * GELU_SCALE * (1.0f + 3.0f * 0.044715f * x * x);
		dinp[e] = g * dout[e];
	}
}

/* ---- Llama's kernels (llama_cpu.c's math) ---------------------------------------------------- */

/* out = w x r, r = 1 / sqrt(mean(x^2) + eps) (transformers' LlamaRMSNorm); one block per row */
__global__ void
k_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int C, float eps)
{
	__shared__ float sh[33];
	size_t i = blockIdx.x;
	const float *x = inp + i * C;
	float ss = 0;
	for (int c = threadIdx.x; c < C; c += blockDim.x) {
		ss += x[c] * x[c];
	}
	ss = block_reduce<op_sum>(ss, sh, 0.0f);
	float r = 1.0f / sqrtf(ss / (float)C + eps);
	float *o = out + i * C;
	for (int c = threadIdx.x; c < C; c += blockDim.x) {
		o[c] = w[c] * (x[c] * r);
	}
	if (threadIdx.x == 0) {
		rstd[i] = r;
	}
}

/* dw[c] = (set) sum over the rows in order of dout x rstd; one thread per channel */
__global__ void
k_rmsnorm_backward_w(float *dw, const float *dout, const float *inp, const float *rstd, int N,
		     int C)
{
	for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
		float s = 0;
		for (int i = 0; i < N; i++) {
			s += dout[(size_t)i * C + c] * inp[(size_t)i * C + c] * rstd[i];
		}
		dw[c] = s;
	}
}

/* dinp += r g - x r^3 mean(g x), g = w dout; one block per row */
__global__ void
k_rmsnorm_backward_x(float *dinp, const float *dout, const float *inp, const float *w,
		     const float *rstd, int C)
{
	__shared__ float sh[33];
	size_t i = blockIdx.x;
	const float *x = inp + i * C, *g = dout + i * C;
	float *dx = dinp + i * C;
	float r = rstd[i], gx = 0;
	for (int c = threadIdx.x; c < C; c += blockDim.x) {
		gx += w[c] * g[c] * x[c];
	}
	gx = block_reduce<op_sum>(gx, sh, 0.0f);
	float k = r * r * r * gx / (float)C;
	for (int c = threadIdx.x; c < C; c += blockDim.x) {
		dx[c] += r * w[c] * g[c] - x[c] * k;
	}
}

/*
 * Rotary position embedding in place on x [N rows of stride `stride`, `heads` heads of hs], row
 * i at position i % T, as llama_cpu.c's rope(): element j < hs/2 of a head pairs with j + hs/2
 * and the pair turns by pos x theta^(-2j / hs), the angle, its cosine and sine in double and
 * then rounded to float as the CPU does; sign -1 turns back (the backward). One thread per
 * (row, j), over the heads.
 */
__global__ void
k_rope(float *x, int N, int T, int heads, int hs, int stride, double theta, int sign)
{
	int half = hs / 2;
	size_t n = (size_t)N * half;
	for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
	     e += (size_t)gridDim.x * blockDim.x) {
		size_t i = e / half;
		int j = (int)(e % half);
		double ang = (double)(i % T) * pow(theta, -2.0 * j / hs);
		float cs = (float)cos(ang), sn = (float)(sign * sin(ang));
		float *row = x + i * stride;
		for (int h = 0; h < heads; h++) {
			float *p = row + (size_t)h * hs;
			float x1 = p[j], x2 = p[j + half];
			p[j] = x1 * cs - x2 * sn;
			p[j + half] = x2 * cs + x1 * sn;
		}
	}
}

__device__ static float
sigmoid(float x)
{
	return 1.0f / (1.0f + expf(-x));
}

/* m = silu(gate) up */
__global__ void
k_swiglu_forward(float *m, const float *gate, const float *up, size_t n)
{
	for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
	     e += (size_t)gridDim.x * blockDim.x) {
		float g = gate[e];
		m[e] = g * sigmoid(g) * up[e];
	}
}

/* dgate = (set) dm up silu'(gate), dup = (set) dm silu(gate) */
__global__ void
k_swiglu_backward(float *dgate, float *dup, const float *dm, const float *gate, const float *up,
		  size_t n)
{
	for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < n;
	     e += (size_t)gridDim.x * blockDim.x) {
		float g = gate[e], sg = sigmoid(g), d = dm[e];
		dgate[e] = d * up[e] * sg * (1.0f + g * (1.0f - sg));
		dup[e] = d * g * sg;
	}
}

/*
 * The attention kernels take gpt_cpu.c's layout: NH query heads over KVH key-value heads (head h
 * reads key-value head h / (NH / KVH); GPT-2 is KVH = NH), each hs wide; row r = b T + t of q
 * starts at q + r qs, of k and v at k + r kvs, v + r kvs (GPT-2: slices of one qkv buffer,
 * qs = kvs = 3C); att and dpreatt [B, NH, T, T]; out and dout [B, T, NH hs].
 *
 * Forward, one block per (b, h, t) row (blockIdx.x = (b * NH + h) * T + t): scores scale
 * q_t . k_t2 for t2 <= t (each thread its own t2, the dot in i order as the CPU), the softmax
 * over them (entries above the diagonal 0), then out_t = sum over t2 in order of att[t2] v_t2
 * (each thread its own i).
 */
__global__ void
k_attention_forward(float *out, float *att, const float *q, const float *k, const float *v, int qs,
		    int kvs, int T, int NH, int KVH, int hs, float scale)
{
	__shared__ float sh[33];
	int row = blockIdx.x, t = row % T, bh = row / T, h = bh % NH, b = bh / NH;
	size_t kvo = (size_t)(h / (NH / KVH)) * hs;
	const float *qt = q + ((size_t)b * T + t) * qs + (size_t)h * hs;
	const float *kb = k + (size_t)b * T * kvs + kvo, *vb = v + (size_t)b * T * kvs + kvo;
	float *a = att + (size_t)row * T;
	float mx = -INFINITY;
	for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
		const float *kt = kb + (size_t)t2 * kvs;
		float s = 0;
		for (int i = 0; i < hs; i++) {
			s += qt[i] * kt[i];
		}
		s *= scale;
		a[t2] = s;
		mx = fmaxf(mx, s);
	}
	mx = block_reduce<op_max>(mx, sh, -INFINITY);
	float sum = 0;
	for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
		float e = expf(a[t2] - mx);
		a[t2] = e;
		sum += e;
	}
	sum = block_reduce<op_sum>(sum, sh, 0.0f);
	for (int t2 = threadIdx.x; t2 < T; t2 += blockDim.x) {
		a[t2] = t2 <= t ? a[t2] / sum : 0.0f;
	}
	__syncthreads(); /* every a[t2] written (global memory, this block) before it is read */
	float *o = out + ((size_t)b * T + t) * ((size_t)NH * hs) + (size_t)h * hs;
	for (int i = threadIdx.x; i < hs; i += blockDim.x) {
		float s = 0;
		for (int t2 = 0; t2 <= t; t2++) {
			s += a[t2] * vb[(size_t)t2 * kvs + i];
		}
		o[i] = s;
	}
}

/*
 * Attention backward, part 1, one block per (b, h, t) row: datt[t2] = v_t2 . dout_t, then the
 * softmax's backward dpreatt[t2] = att[t2] (datt[t2] - sum_t2' att[t2'] datt[t2']) for
 * t2 <= t (0 above the diagonal).
 */
__global__ void
k_attention_backward_scores(float *datt, float *dpreatt, const float *dout, const float *v, int kvs,
			    const float *att, int T, int NH, int KVH, int hs)
{
	__shared__ float sh[33];
	int row = blockIdx.x, t = row % T, bh = row / T, h = bh % NH, b = bh / NH;
	const float *vb = v + (size_t)b * T * kvs + (size_t)(h / (NH / KVH)) * hs;
	const float *g = dout + ((size_t)b * T + t) * ((size_t)NH * hs) + (size_t)h * hs;
	const float *a = att + (size_t)row * T;
	float *da = datt + (size_t)row * T, *dp = dpreatt + (size_t)row * T;
	float dot = 0;
	for (int t2 = threadIdx.x; t2 <= t; t2 += blockDim.x) {
		const float *vt = vb + (size_t)t2 * kvs;
		float s = 0;
		for (int i = 0; i < hs; i++) {
			s += vt[i] * g[i];
		}
		da[t2] = s;
		dot += a[t2] * s;
	}
	dot = block_reduce<op_sum>(dot, sh, 0.0f);
	for (int t2 = threadIdx.x; t2 < T; t2 += blockDim.x) {
		dp[t2] = t2 <= t ? a[t2] * (da[t2] - dot) : 0.0f;
	}
}

/*
 * Attention backward, part 2: the query gradient of position t (set), one block per (b, h, t),
 * each thread its own i of the head, a loop in the CPU's order:
 *   dq_t = sum over t2 <= t of k_t2 (dpreatt[t][t2] scale)
 */
__global__ void
k_attention_backward_dq(float *dq, int qs, const float *dpreatt, const float *k, int kvs, int T,
			int NH, int KVH, int hs, float scale)
{
	int row = blockIdx.x, t = row % T, bh = row / T, h = bh % NH, b = bh / NH;
	const float *kb = k + (size_t)b * T * kvs + (size_t)(h / (NH / KVH)) * hs;
	const float *dpt = dpreatt + (size_t)row * T;
	float *dqt = dq + ((size_t)b * T + t) * qs + (size_t)h * hs;
	for (int i = threadIdx.x; i < hs; i += blockDim.x) {
		float s = 0;
		for (int t2 = 0; t2 <= t; t2++) {
			s += kb[(size_t)t2 * kvs + i] * (dpt[t2] * scale);
		}
		dqt[i] = s;
	}
}

/*
 * Attention backward, part 3: the key and value gradients of position t (set), one block per
 * (b, key-value head kh, t) (blockIdx.x = (b * KVH + kh) * T + t), each thread its own i. Every
 * query head h of kh's group adds in, in head order, and within a head in query order, as the
 * CPU (no atomics: this thread is the only writer of the element):
 *   dk_t = sum over h, then over t' >= t, of q_t'(h) (dpreatt[h][t'][t] scale)
 *   dv_t = sum over h, then over t' >= t, of att[h][t'][t] dout_t'(h)
 */
__global__ void
k_attention_backward_dkv(float *dk, float *dv, int kvs, const float *dpreatt, const float *dout,
			 const float *q, int qs, const float *att, int T, int NH, int KVH, int hs,
			 float scale)
{
	int row = blockIdx.x, t = row % T, bk = row / T, kh = bk % KVH, b = bk / KVH;
	int group = NH / KVH, C = NH * hs;
	const float *qb = q + (size_t)b * T * qs, *gb = dout + (size_t)b * T * C;
	size_t o = ((size_t)b * T + t) * kvs + (size_t)kh * hs;
	for (int i = threadIdx.x; i < hs; i += blockDim.x) {
		float sk = 0, sv = 0;
		for (int h = kh * group; h < (kh + 1) * group; h++) {
			size_t ho = (size_t)h * hs + i, bh = (size_t)b * NH + h;
			const float *dpb = dpreatt + bh * T * T, *ab = att + bh * T * T;
			for (int t1 = t; t1 < T; t1++) {
				sk += qb[(size_t)t1 * qs + ho] * (dpb[(size_t)t1 * T + t] * scale);
				sv += ab[(size_t)t1 * T + t] * gb[(size_t)t1 * C + ho];
			}
		}
		dk[o + i] = sk;
		dv[o + i] = sv;
	}
}

/*
 * The head's softmax and cross-entropy, one block per position i: probs row (the logits on
 * entry) becomes the logits' gradient (softmax - one-hot(target)) * dloss; losses[i] =
 * -log(softmax[target]). Each thread reads and writes only its own entries after the two
 * reductions.
 */
__global__ void
k_softmax_xent(float *probs, float *losses, const int *targets, int V, float dloss)
{
	__shared__ float sh[33];
	size_t i = blockIdx.x;
	float *p = probs + i * V;
	int tgt = targets[i];
	float mx = -INFINITY;
	for (int v = threadIdx.x; v < V; v += blockDim.x) {
		mx = fmaxf(mx, p[v]);
	}
	mx = block_reduce<op_max>(mx, sh, -INFINITY);
	float sum = 0;
	for (int v = threadIdx.x; v < V; v += blockDim.x) {
		float e = expf(p[v] - mx);
		p[v] = e;
		sum += e;
	}
	sum = block_reduce<op_sum>(sum, sh, 0.0f);
	for (int v = threadIdx.x; v < V; v += blockDim.x) {
		float q = p[v] / sum;
		if (v == tgt) {
			losses[i] = -logf(q);
		}
		p[v] = (q - (v == tgt ? 1.0f : 0.0f)) * dloss;
	}
}

/* ---- the matrix products (row-major, as gpt_cpu.c; cuBLAS is column-major) ---------------- */

/* out[N, OC] = inp[N, C] @ w[OC, C]^T + b[OC] (b may be NULL) */
static void
matmul_forward(struct gpt_cuda *g, float *out, const float *inp, const float *w, const float *b,
	       int N, int C, int OC)
{
	const float one = 1.0f, zero = 0.0f;
	/* column-major: out^T [OC x N] = (w^T [C x OC])^T inp^T [C x N] */
	check_blas(g,
		   cublasSgemm(g->h, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, C, &one, w, C, inp, C, &zero,
			       out, OC),
		   "matmul forward (cublasSgemm)");
	if (b) {
		LAUNCH(k_add_bias, ew_blocks((size_t)N * OC), EW_THREADS, g->s)(out, b, N, OC);
		check_launch(g, "add_bias");
	}
}

/* dinp = (set) dout @ w; dw = (set) dout^T @ inp; db = (set) column sums (db may be NULL) */
static void
matmul_backward(struct gpt_cuda *g, float *dinp, float *dw, float *db, const float *dout,
		const float *inp, const float *w, int N, int C, int OC)
{
	const float one = 1.0f, zero = 0.0f;
	/* dinp^T [C x N] = w^T [C x OC] dout^T [OC x N] */
	check_blas(g,
		   cublasSgemm(g->h, CUBLAS_OP_N, CUBLAS_OP_N, C, N, OC, &one, w, C, dout, OC,
			       &zero, dinp, C),
		   "matmul backward dinp (cublasSgemm)");
	/* dw^T [C x OC] = inp^T [C x N] (dout^T [OC x N])^T */
	check_blas(g,
		   cublasSgemm(g->h, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, N, &one, inp, C, dout, OC,
			       &zero, dw, C),
		   "matmul backward dw (cublasSgemm)");
	if (db) {
		LAUNCH(k_bias_backward, (OC + EW_THREADS - 1) / EW_THREADS, EW_THREADS, g->s)
		(db, dout, N, OC);
		check_launch(g, "bias_backward");
	}
}

static void
layernorm_forward(struct gpt_cuda *g, float *out, float *mean, float *rstd, const float *inp,
		  const float *w, const float *b, int N, int C)
{
	LAUNCH(k_layernorm_forward, N, ROW_THREADS, g->s)(out, mean, rstd, inp, w, b, C);
	check_launch(g, "layernorm_forward");
}

/* dinp += d(LN)/dinp; dw, db = (set) */
static void
layernorm_backward(struct gpt_cuda *g, float *dinp, float *dw, float *db, const float *dout,
		   const float *inp, const float *w, const float *mean, const float *rstd, int N,
		   int C)
{
	LAUNCH(k_layernorm_backward_wb, (C + EW_THREADS - 1) / EW_THREADS, EW_THREADS, g->s)
	(dw, db, dout, inp, mean, rstd, N, C);
	check_launch(g, "layernorm_backward_wb");
	LAUNCH(k_layernorm_backward_x, N, ROW_THREADS, g->s)(dinp, dout, inp, w, mean, rstd, C);
	check_launch(g, "layernorm_backward_x");
}

static void
add(struct gpt_cuda *g, float *x, const float *y, size_t n)
{
	LAUNCH(k_add, ew_blocks(n), EW_THREADS, g->s)(x, y, n);
	check_launch(g, "add");
}

static void
copy(struct gpt_cuda *g, float *dst, const float *src, size_t n)
{
	cudaError_t e =
		cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToDevice, g->s);
	if (e != cudaSuccess) {
		cuda_fail(g, "cudaMemcpyAsync", cudaGetErrorString(e));
	}
}

static void
zero(struct gpt_cuda *g, float *dst, size_t n)
{
	cudaError_t e = cudaMemsetAsync(dst, 0, n * sizeof(float), g->s);
	if (e != cudaSuccess) {
		cuda_fail(g, "cudaMemsetAsync", cudaGetErrorString(e));
	}
}

/* Causal attention (the kernels' comment says the layout): out [B, T, NH hs], att the softmax */
static void
attention_forward(struct gpt_cuda *g, float *out, float *att, const float *q, const float *k,
		  const float *v, int qs, int kvs, int B, int T, int NH, int KVH, int hs)
{
	LAUNCH(k_attention_forward, B * NH * T, ROW_THREADS, g->s)
	(out, att, q, k, v, qs, kvs, T, NH, KVH, hs, 1.0f / sqrtf((float)hs));
	check_launch(g, "attention_forward");
}

/* dq, dk, dv = (set), with q's and kv's strides; datt, dpreatt scratch [B, NH, T, T] */
static void
attention_backward(struct gpt_cuda *g, float *dq, float *dk, float *dv, int qs, int kvs,
		   float *datt, float *dpreatt, const float *dout, const float *q, const float *k,
		   const float *v, const float *att, int B, int T, int NH, int KVH, int hs)
{
	float scale = 1.0f / sqrtf((float)hs);
	LAUNCH(k_attention_backward_scores, B * NH * T, ROW_THREADS, g->s)
	(datt, dpreatt, dout, v, kvs, att, T, NH, KVH, hs);
	check_launch(g, "attention_backward_scores");
	LAUNCH(k_attention_backward_dq, B * NH * T, 64, g->s)
	(dq, qs, dpreatt, k, kvs, T, NH, KVH, hs, scale);
	check_launch(g, "attention_backward_dq");
	LAUNCH(k_attention_backward_dkv, B * KVH * T, 64, g->s)
	(dk, dv, kvs, dpreatt, dout, q, qs, att, T, NH, KVH, hs, scale);
	check_launch(g, "attention_backward_dkv");
}

static void
rmsnorm_forward(struct gpt_cuda *g, float *out, float *rstd, const float *inp, const float *w,
		int N, int C, double eps)
{
	LAUNCH(k_rmsnorm_forward, N, ROW_THREADS, g->s)(out, rstd, inp, w, C, (float)eps);
	check_launch(g, "rmsnorm_forward");
}

/* dinp += d(RMSNorm)/dinp; dw = (set) */
static void
rmsnorm_backward(struct gpt_cuda *g, float *dinp, float *dw, const float *dout, const float *inp,
		 const float *w, const float *rstd, int N, int C)
{
	LAUNCH(k_rmsnorm_backward_w, (C + EW_THREADS - 1) / EW_THREADS, EW_THREADS, g->s)
	(dw, dout, inp, rstd, N, C);
	check_launch(g, "rmsnorm_backward_w");
	LAUNCH(k_rmsnorm_backward_x, N, ROW_THREADS, g->s)(dinp, dout, inp, w, rstd, C);
	check_launch(g, "rmsnorm_backward_x");
}

static void
rope(struct gpt_cuda *g, float *x, int N, int T, int heads, int hs, int stride, double theta,
     int sign)
{
	LAUNCH(k_rope, ew_blocks((size_t)N * (hs / 2)), EW_THREADS, g->s)
	(x, N, T, heads, hs, stride, theta, sign);
	check_launch(g, "rope");
}

/* ---- the layers (gpt_model.h's struct gpt_ops) -------------------------------------------- */

static struct gpt_cuda *
ctx_of(const struct gpt_acts *a)
{
	return (struct gpt_cuda *)a->ctx;
}

static void
cuda_encoder_forward(const struct gpt_dims *d, struct gpt_acts *a, const int *tokens,
		     const gpt_real *wte, const gpt_real *wpe)
{
	struct gpt_cuda *g = ctx_of(a);
	int N = d->B * d->T;
	LAUNCH(k_encoder_forward, ew_blocks((size_t)N * d->C), EW_THREADS, g->s)
	(a->encoded, tokens, wte, wpe, N, d->T, d->C);
	check_launch(g, "encoder_forward");
}

static const gpt_real *
block_input(const struct gpt_dims *d, const struct gpt_acts *a, int l)
{
	size_t NC = (size_t)d->B * d->T * d->C;
	return l == 0 ? a->encoded : a->res3 + (size_t)(l - 1) * NC;
}

#define P(t) (params[(t)])
#define G(t) (grads[(t)])

/* ---- Llama's block and head (llama_cpu.c's, step for step) ----------------------------------- */

/* Block l's activations in a (as llama_cpu.c's: ln1 / ln1_rstd the attention's RMSNorm, ln2 /
 * ln2_rstd the MLP's, fch the gate, fch_gelu the up projection, mlp silu(gate) x up). */
struct llama_slices {
	const gpt_real *x;
	gpt_real *h1, *r1, *q, *k, *v, *atty, *att, *res2, *h2, *r2, *gate, *up, *m, *res3;
};

static struct llama_slices
llama_block_slices(const struct gpt_dims *d, const struct gpt_acts *a, int l)
{
	size_t N = (size_t)d->B * d->T, C = (size_t)d->C, KVD = (size_t)gpt_kvd(d);
	size_t FF = (size_t)gpt_ff(d), att = (size_t)d->B * d->NH * d->T * d->T, L = (size_t)l;
	struct llama_slices s;
	s.x = block_input(d, a, l);
	s.h1 = a->ln1 + L * N * C;
	s.r1 = a->ln1_rstd + L * N;
	s.q = a->q + L * N * C;
	s.k = a->k + L * N * KVD;
	s.v = a->v + L * N * KVD;
	s.atty = a->atty + L * N * C;
	s.att = a->att + L * att;
	s.res2 = a->res2 + L * N * C;
	s.h2 = a->ln2 + L * N * C;
	s.r2 = a->ln2_rstd + L * N;
	s.gate = a->fch + L * N * FF;
	s.up = a->fch_gelu + L * N * FF;
	s.m = a->mlp + L * N * FF;
	s.res3 = a->res3 + L * N * C;
	return s;
}

static void
llama_block_forward(const struct gpt_dims *d, struct gpt_acts *a, int l,
		    const gpt_real *const *params)
{
	struct gpt_cuda *g = ctx_of(a);
	int N = d->B * d->T, C = d->C, KVD = gpt_kvd(d), KVH = gpt_kvh(d), FF = gpt_ff(d);
	int hs = gpt_hs(d);
	size_t NC = (size_t)N * C, NF = (size_t)N * FF;
	double theta = gpt_rope_theta(d);
	struct llama_slices s = llama_block_slices(d, a, l);

	/* res2 = x + o(attention(rope(q(h1)), rope(k(h1)), v(h1))), h1 = RMSNorm(x) */
	rmsnorm_forward(g, s.h1, s.r1, s.x, P(LLAMA_ATTN_NORM), N, C, gpt_eps(d));
	matmul_forward(g, s.q, s.h1, P(LLAMA_Q), NULL, N, C, C);
	matmul_forward(g, s.k, s.h1, P(LLAMA_K), NULL, N, C, KVD);
	matmul_forward(g, s.v, s.h1, P(LLAMA_V), NULL, N, C, KVD);
	rope(g, s.q, N, d->T, d->NH, hs, C, theta, 1);
	rope(g, s.k, N, d->T, KVH, hs, KVD, theta, 1);
	attention_forward(g, s.atty, s.att, s.q, s.k, s.v, C, KVD, d->B, d->T, d->NH, KVH, hs);
	matmul_forward(g, s.res2, s.atty, P(LLAMA_O), NULL, N, C, C);
	add(g, s.res2, s.x, NC);
	/* res3 = res2 + down(silu(gate(h2)) * up(h2)), h2 = RMSNorm(res2) */
	rmsnorm_forward(g, s.h2, s.r2, s.res2, P(LLAMA_MLP_NORM), N, C, gpt_eps(d));
	matmul_forward(g, s.gate, s.h2, P(LLAMA_GATE), NULL, N, C, FF);
	matmul_forward(g, s.up, s.h2, P(LLAMA_UP), NULL, N, C, FF);
	LAUNCH(k_swiglu_forward, ew_blocks(NF), EW_THREADS, g->s)(s.m, s.gate, s.up, NF);
	check_launch(g, "swiglu_forward");
	matmul_forward(g, s.res3, s.m, P(LLAMA_DOWN), NULL, N, FF, C);
	add(g, s.res3, s.res2, NC);
}

static void
llama_block_backward(const struct gpt_dims *d, struct gpt_acts *a, int l,
		     const gpt_real *const *params, gpt_real *const *grads)
{
	struct gpt_cuda *g = ctx_of(a);
	int N = d->B * d->T, C = d->C, KVD = gpt_kvd(d), KVH = gpt_kvh(d), FF = gpt_ff(d);
	int hs = gpt_hs(d);
	size_t NC = (size_t)N * C, NF = (size_t)N * FF;
	double theta = gpt_rope_theta(d);
	struct llama_slices s = llama_block_slices(d, a, l);
	gpt_real *dout = a->dres; /* d res3 on entry; d x on return */
	gpt_real *dres2 = a->dres_b;

	/* the MLP: dm, then dgate = dm up silu'(gate), dup = dm silu(gate) */
	matmul_backward(g, a->dbig, G(LLAMA_DOWN), NULL, dout, s.m, P(LLAMA_DOWN), N, FF, C);
	LAUNCH(k_swiglu_backward, ew_blocks(NF), EW_THREADS, g->s)
	(a->dbig2, a->dbig3, a->dbig, s.gate, s.up, NF);
	check_launch(g, "swiglu_backward");
	matmul_backward(g, a->dsmall, G(LLAMA_GATE), NULL, a->dbig2, s.h2, P(LLAMA_GATE), N, C, FF);
	matmul_backward(g, a->dsmall2, G(LLAMA_UP), NULL, a->dbig3, s.h2, P(LLAMA_UP), N, C, FF);
	add(g, a->dsmall, a->dsmall2, NC);
	copy(g, dres2, dout, NC);
	rmsnorm_backward(g, dres2, G(LLAMA_MLP_NORM), a->dsmall, s.res2, P(LLAMA_MLP_NORM), s.r2, N,
			 C);
	/* the attention: dq, dk (summed over each key-value head's query heads), dv; the
	   rotations turned back; the three projections' input gradients summed as the CPU's
	   (dq + dk) + dv */
	matmul_backward(g, a->dsmall, G(LLAMA_O), NULL, dres2, s.atty, P(LLAMA_O), N, C, C);
	attention_backward(g, a->dq, a->dk, a->dv, C, KVD, a->datt, a->dpreatt, a->dsmall, s.q, s.k,
			   s.v, s.att, d->B, d->T, d->NH, KVH, hs);
	rope(g, a->dq, N, d->T, d->NH, hs, C, theta, -1);
	rope(g, a->dk, N, d->T, KVH, hs, KVD, theta, -1);
	matmul_backward(g, a->dsmall, G(LLAMA_Q), NULL, a->dq, s.h1, P(LLAMA_Q), N, C, C);
	matmul_backward(g, a->dsmall2, G(LLAMA_K), NULL, a->dk, s.h1, P(LLAMA_K), N, C, KVD);
	matmul_backward(g, a->dsmall3, G(LLAMA_V), NULL, a->dv, s.h1, P(LLAMA_V), N, C, KVD);
	add(g, a->dsmall, a->dsmall2, NC);
	add(g, a->dsmall, a->dsmall3, NC);
	copy(g, dout, dres2, NC);
	rmsnorm_backward(g, dout, G(LLAMA_ATTN_NORM), a->dsmall, s.x, P(LLAMA_ATTN_NORM), s.r1, N,
			 C);
}

/* The final RMSNorm (normw), logits = lnf head^T, the loss, and at once the backward: dhead,
 * dnormw = (set), a->dres = d(last block output) */
static void
llama_head_forward_backward(const struct gpt_dims *d, struct gpt_acts *a, const int *targets,
			    const gpt_real *head, const gpt_real *normw, gpt_real dloss,
			    gpt_real *dhead, gpt_real *dnormw)
{
	struct gpt_cuda *g = ctx_of(a);
	int N = d->B * d->T, C = d->C, V = d->V;
	const gpt_real *x = block_input(d, a, d->L);
	rmsnorm_forward(g, a->lnf, a->lnf_rstd, x, normw, N, C, gpt_eps(d));
	matmul_forward(g, a->probs, a->lnf, head, NULL, N, C, V);
	LAUNCH(k_softmax_xent, N, ROW_THREADS, g->s)(a->probs, a->losses, targets, V, dloss);
	check_launch(g, "softmax_xent");
	matmul_backward(g, a->dsmall, dhead, NULL, a->probs, a->lnf, head, N, C, V);
	zero(g, a->dres, (size_t)N * C);
	rmsnorm_backward(g, a->dres, dnormw, a->dsmall, x, normw, a->lnf_rstd, N, C);
}

/* ---- the ops: GPT-2's here, Llama's above ---------------------------------------------------- */

static void
cuda_block_forward(const struct gpt_dims *d, struct gpt_acts *a, int l,
		   const gpt_real *const *params)
{
	if (d->arch == GPT_ARCH_LLAMA) {
		llama_block_forward(d, a, l, params);
		return;
	}
	struct gpt_cuda *g = ctx_of(a);
	int N = d->B * d->T, C = d->C;
	size_t NC = (size_t)N * C, att = (size_t)d->B * d->NH * d->T * d->T;
	const gpt_real *x = block_input(d, a, l);
	gpt_real *ln1 = a->ln1 + l * NC, *ln1m = a->ln1_mean + (size_t)l * N,
		 *ln1r = a->ln1_rstd + (size_t)l * N, *qkv = a->qkv + l * 3 * NC,
		 *atty = a->atty + l * NC, *attm = a->att + l * att, *res2 = a->res2 + l * NC,
		 *ln2 = a->ln2 + l * NC, *ln2m = a->ln2_mean + (size_t)l * N,
		 *ln2r = a->ln2_rstd + (size_t)l * N, *fch = a->fch + l * 4 * NC,
		 *fchg = a->fch_gelu + l * 4 * NC, *res3 = a->res3 + l * NC;

	layernorm_forward(g, ln1, ln1m, ln1r, x, P(GPT_LN1W), P(GPT_LN1B), N, C);
	matmul_forward(g, qkv, ln1, P(GPT_QKVW), P(GPT_QKVB), N, C, 3 * C);
	attention_forward(g, atty, attm, qkv, qkv + C, qkv + 2 * C, 3 * C, 3 * C, d->B, d->T, d->NH,
			  d->NH, C / d->NH);
	matmul_forward(g, res2, atty, P(GPT_ATTPROJW), P(GPT_ATTPROJB), N, C, C);
	add(g, res2, x, NC);
	layernorm_forward(g, ln2, ln2m, ln2r, res2, P(GPT_LN2W), P(GPT_LN2B), N, C);
	matmul_forward(g, fch, ln2, P(GPT_FCW), P(GPT_FCB), N, C, 4 * C);
	LAUNCH(k_gelu_forward, ew_blocks(4 * NC), EW_THREADS, g->s)(fchg, fch, 4 * NC);
	check_launch(g, "gelu_forward");
	matmul_forward(g, res3, fchg, P(GPT_FCPROJW), P(GPT_FCPROJB), N, 4 * C, C);
	add(g, res3, res2, NC);
}

static void
cuda_head_forward_backward(const struct gpt_dims *d, struct gpt_acts *a, const int *targets,
			   const gpt_real *head, const gpt_real *lnfw, const gpt_real *lnfb,
			   gpt_real dloss, gpt_real *dhead, gpt_real *dlnfw, gpt_real *dlnfb)
{
	if (d->arch == GPT_ARCH_LLAMA) {
		llama_head_forward_backward(d, a, targets, head, lnfw, dloss, dhead, dlnfw);
		return;
	}
	struct gpt_cuda *g = ctx_of(a);
	int N = d->B * d->T, C = d->C, V = d->V;
	const gpt_real *x = block_input(d, a, d->L);
	layernorm_forward(g, a->lnf, a->lnf_mean, a->lnf_rstd, x, lnfw, lnfb, N, C);
	matmul_forward(g, a->probs, a->lnf, head, NULL, N, C, V);
	LAUNCH(k_softmax_xent, N, ROW_THREADS, g->s)(a->probs, a->losses, targets, V, dloss);
	check_launch(g, "softmax_xent");
	matmul_backward(g, a->dsmall, dhead, NULL, a->probs, a->lnf, head, N, C, V);
	zero(g, a->dres, (size_t)N * C);
	layernorm_backward(g, a->dres, dlnfw, dlnfb, a->dsmall, x, lnfw, a->lnf_mean, a->lnf_rstd,
			   N, C);
}

static void
cuda_block_backward(const struct gpt_dims *d, struct gpt_acts *a, int l,
		    const gpt_real *const *params, gpt_real *const *grads)
{
	if (d->arch == GPT_ARCH_LLAMA) {
		llama_block_backward(d, a, l, params, grads);
		return;
	}
	struct gpt_cuda *g = ctx_of(a);
	int N = d->B * d->T, C = d->C;
	size_t NC = (size_t)N * C, att = (size_t)d->B * d->NH * d->T * d->T;
	const gpt_real *x = block_input(d, a, l);
	const gpt_real *ln1 = a->ln1 + l * NC, *ln1m = a->ln1_mean + (size_t)l * N,
		       *ln1r = a->ln1_rstd + (size_t)l * N, *qkv = a->qkv + l * 3 * NC,
		       *atty = a->atty + l * NC, *attm = a->att + l * att, *res2 = a->res2 + l * NC,
		       *ln2 = a->ln2 + l * NC, *ln2m = a->ln2_mean + (size_t)l * N,
		       *ln2r = a->ln2_rstd + (size_t)l * N, *fch = a->fch + l * 4 * NC,
		       *fchg = a->fch_gelu + l * 4 * NC;
	gpt_real *dout = a->dres; /* d res3 on entry; d x on return */
	gpt_real *dres2 = a->dres_b;

	/* res3 = res2 + fcproj(gelu(fc(ln2(res2)))) */
	matmul_backward(g, a->dbig, G(GPT_FCPROJW), G(GPT_FCPROJB), dout, fchg, P(GPT_FCPROJW), N,
			4 * C, C);
	LAUNCH(k_gelu_backward, ew_blocks(4 * NC), EW_THREADS, g->s)
	(a->dbig2, fch, a->dbig, 4 * NC);
	check_launch(g, "gelu_backward");
	matmul_backward(g, a->dsmall, G(GPT_FCW), G(GPT_FCB), a->dbig2, ln2, P(GPT_FCW), N, C,
			4 * C);
	copy(g, dres2, dout, NC);
	layernorm_backward(g, dres2, G(GPT_LN2W), G(GPT_LN2B), a->dsmall, res2, P(GPT_LN2W), ln2m,
			   ln2r, N, C);
	/* res2 = x + attproj(attention(qkv(ln1(x)))) */
	matmul_backward(g, a->dsmall, G(GPT_ATTPROJW), G(GPT_ATTPROJB), dres2, atty,
			P(GPT_ATTPROJW), N, C, C);
	attention_backward(g, a->dbig, a->dbig + C, a->dbig + 2 * C, 3 * C, 3 * C, a->datt,
			   a->dpreatt, a->dsmall, qkv, qkv + C, qkv + 2 * C, attm, d->B, d->T,
			   d->NH, d->NH, C / d->NH);
	matmul_backward(g, a->dsmall2, G(GPT_QKVW), G(GPT_QKVB), a->dbig, ln1, P(GPT_QKVW), N, C,
			3 * C);
	copy(g, dout, dres2, NC);
	layernorm_backward(g, dout, G(GPT_LN1W), G(GPT_LN1B), a->dsmall2, x, P(GPT_LN1W), ln1m,
			   ln1r, N, C);
}

static void
cuda_encoder_backward(const struct gpt_dims *d, struct gpt_acts *a, const int *tokens,
		      gpt_real *dwte, gpt_real *dwpe)
{
	struct gpt_cuda *g = ctx_of(a);
	int N = d->B * d->T, C = d->C, T = d->T;
	if (dwpe) {
		LAUNCH(k_encoder_backward_wpe, ew_blocks((size_t)T * C), EW_THREADS, g->s)
		(dwpe, a->dres, d->B, T, C);
		check_launch(g, "encoder_backward_wpe");
	}
	/* tied, the head set dwte and the lookup adds to it; untied, nothing did: zero first */
	if (!gpt_tied(d)) {
		zero(g, dwte, (size_t)d->V * C);
	}
	LAUNCH(k_encoder_backward_wte, (C + EW_THREADS - 1) / EW_THREADS, EW_THREADS, g->s)
	(dwte, a->dres, tokens, N, C);
	check_launch(g, "encoder_backward_wte");
}

/* ---- the backend's state ------------------------------------------------------------------- */

static void
cuda_close(void *ctx)
{
	struct gpt_cuda *g = (struct gpt_cuda *)ctx;
	if (!g) {
		return;
	}
	if (g->h) {
		cublasDestroy(g->h);
	}
	if (g->s) {
		cudaStreamSynchronize(g->s);
		cudaStreamDestroy(g->s);
	}
	free(g);
}

/* CUDA device `device`: a non-blocking stream (the trainer's compute stream) and a cuBLAS handle
 * on it, fp32 math (no TF32). */
static int
cuda_open(int device, void **ctx, void **native_stream)
{
	struct gpt_cuda *g = (struct gpt_cuda *)calloc(1, sizeof(*g));
	if (!g) {
		return -ENOMEM;
	}
	g->dev = device;
	cudaError_t e = cudaSetDevice(device);
	if (e == cudaSuccess) {
		e = cudaStreamCreateWithFlags(&g->s, cudaStreamNonBlocking);
	}
	if (e != cudaSuccess) {
		fprintf(stderr, "zinf_gpt: cuda layers: device %d: %s\n", device,
			cudaGetErrorString(e));
		cuda_close(g);
		return -ENODEV;
	}
	cublasStatus_t st = cublasCreate(&g->h);
	if (st != CUBLAS_STATUS_SUCCESS) {
		g->h = NULL;
	}
	if (st == CUBLAS_STATUS_SUCCESS) {
		st = cublasSetStream(g->h, g->s);
	}
	if (st == CUBLAS_STATUS_SUCCESS) {
		st = cublasSetMathMode(g->h, CUBLAS_DEFAULT_MATH);
	}
	if (st == CUBLAS_STATUS_SUCCESS) {
		st = cublasSetPointerMode(g->h, CUBLAS_POINTER_MODE_HOST);
	}
	if (st != CUBLAS_STATUS_SUCCESS) {
		fprintf(stderr, "zinf_gpt: cuda layers: cuBLAS: %s\n", cublasGetStatusString(st));
		cuda_close(g);
		return -EIO;
	}
	*ctx = g;
	*native_stream = g->s;
	return 0;
}

static int
cuda_status(void *ctx)
{
	struct gpt_cuda *g = (struct gpt_cuda *)ctx;
	return g ? g->err : 0;
}

/* In declaration order (struct gpt_ops, gpt_model.h). */
extern "C" const struct gpt_ops gpt_cuda_ops = {
	"cuda",			    /* name */
	"cuda",			    /* device */
	cuda_open,		    /* open */
	cuda_close,		    /* close */
	cuda_status,		    /* status */
	cuda_encoder_forward,	    /* encoder_forward */
	cuda_block_forward,	    /* block_forward */
	cuda_head_forward_backward, /* head_forward_backward */
	cuda_block_backward,	    /* block_backward */
	cuda_encoder_backward,	    /* encoder_backward */
};
