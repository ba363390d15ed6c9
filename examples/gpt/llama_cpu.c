/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/llama_cpu.c: Llama's layers on the CPU (LlamaForCausalLM's math, fp32 or the
 * gradient check's double): RMSNorm, rotary position embeddings, the SwiGLU MLP, the block and
 * the head, forward and backward. The attention (grouped-query), the matrix products and the
 * cross-entropy are gpt_cpu.c's and gpt_matmul.c's; gpt_cpu.c's ops table calls these for
 * GPT_ARCH_LLAMA. Deterministic for a fixed thread count as gpt_cpu.c: every output element of
 * these loops is written by one thread in a fixed order (their bits are the same for any count;
 * the BLAS products' are for a fixed one).
 */
#include <math.h>
#include <string.h>
#include <tgmath.h>

#include "gpt_cpu_internal.h"
#include "gpt_matmul.h"
#include "gpt_vmath.h"

/* out = w * x / sqrt(mean(x^2) + eps) per row (transformers' LlamaRMSNorm); rstd per row */
static void
rmsnorm_forward(gpt_real *out, gpt_real *rstd, const gpt_real *inp, const gpt_real *w, int N, int C,
		double eps)
{
#pragma omp parallel for
	for (int i = 0; i < N; i++) {
		const gpt_real *x = inp + (size_t)i * C;
		gpt_real ss = 0;
		for (int c = 0; c < C; c++) {
			ss += x[c] * x[c];
		}
		gpt_real r = 1 / sqrt(ss / C + (gpt_real)eps);
		gpt_real *o = out + (size_t)i * C;
		for (int c = 0; c < C; c++) {
			o[c] = w[c] * (x[c] * r);
		}
		rstd[i] = r;
	}
}

/* Columns per thread's share of dw's sum over rows: the rows are read in order, RMS_COLS columns
   of each at a time (vectorised), so every column's sum is one thread's, in row order (the bits
   of a loop over the rows per column). */
#define RMS_COLS 32

/* dinp += d(RMSNorm)/dinp; dw = (set). With g = w * dout: dx = r g - x r^3 mean(g x). */
static void
rmsnorm_backward(gpt_real *dinp, gpt_real *dw, const gpt_real *dout, const gpt_real *inp,
		 const gpt_real *w, const gpt_real *rstd, int N, int C)
{
#pragma omp parallel for
	for (int c0 = 0; c0 < C; c0 += RMS_COLS) {
		int nc = C - c0 < RMS_COLS ? C - c0 : RMS_COLS;
		gpt_real *s = dw + c0;
		for (int c = 0; c < nc; c++) {
			s[c] = 0;
		}
		for (int i = 0; i < N; i++) {
			const gpt_real *g = dout + (size_t)i * C + c0,
				       *x = inp + (size_t)i * C + c0;
			gpt_real r = rstd[i];
#pragma omp simd
			for (int c = 0; c < nc; c++) {
				s[c] += g[c] * x[c] * r;
			}
		}
	}
#pragma omp parallel for
	for (int i = 0; i < N; i++) {
		const gpt_real *x = inp + (size_t)i * C, *g = dout + (size_t)i * C;
		gpt_real *dx = dinp + (size_t)i * C, r = rstd[i], gx = 0;
		for (int c = 0; c < C; c++) {
			gx += w[c] * g[c] * x[c];
		}
		gpt_real k = r * r * r * gx / C;
		for (int c = 0; c < C; c++) {
			dx[c] += r * w[c] * g[c] - x[c] * k;
		}
	}
}

/*
 * Rotary position embedding in place on x [B x T rows of stride `stride`, heads of hs], row i at
 * position i % T: within each head, element j < hs/2 pairs with j + hs/2 (transformers'
 * rotate_half) and the pair turns by the angle pos x theta^(-2j / hs). sign -1 turns back (the
 * transpose: the backward of the rotation).
 */
static void
rope(gpt_real *x, int B, int T, int heads, int hs, int stride, double theta, int sign)
{
	int half = hs / 2;
	double inv[half]; /* theta^(-2j / hs) */
	for (int j = 0; j < half; j++) {
		inv[j] = pow(theta, -2.0 * j / hs);
	}
	/* per position, its angles' cos and sin once for the batch's rows at that position */
#pragma omp parallel for
	for (int t = 0; t < T; t++) {
		gpt_real cs[half], sn[half];
		for (int j = 0; j < half; j++) {
			double ang = (double)t * inv[j];
			cs[j] = (gpt_real)cos(ang), sn[j] = (gpt_real)(sign * sin(ang));
		}
		for (int b = 0; b < B; b++) {
			gpt_real *row = x + ((size_t)b * T + t) * stride;
			for (int h = 0; h < heads; h++) {
				gpt_real *p = row + (size_t)h * hs;
#pragma omp simd
				for (int j = 0; j < half; j++) {
					gpt_real x1 = p[j], x2 = p[j + half];
					p[j] = x1 * cs[j] - x2 * sn[j];
					p[j + half] = x2 * cs[j] + x1 * sn[j];
				}
			}
		}
	}
}

/* the SwiGLU's element loops in chunks of SWIGLU_CHUNK (the same cut for any thread count),
   GPT_CLONES for the baseline and x86-64-v3 as the GELU's; the exp is GPT_EXP (gpt_vmath.h) for
   float, libm's for double */
#define SWIGLU_CHUNK 4096

static inline gpt_real
sigmoid(gpt_real x)
{
	return 1 / (1 + GPT_EXP(-x));
}

/* m = silu(gate) x up */
GPT_CLONES static void
swiglu_forward_chunk(gpt_real *m, const gpt_real *gate, const gpt_real *up, size_t n)
{
#pragma omp simd
	for (size_t i = 0; i < n; i++) {
		m[i] = gate[i] * sigmoid(gate[i]) * up[i];
	}
}

/* dgate = dm up silu'(gate), dup = dm silu(gate) (set) */
GPT_CLONES static void
swiglu_backward_chunk(gpt_real *dgate, gpt_real *dup, const gpt_real *dm, const gpt_real *gate,
		      const gpt_real *up, size_t n)
{
#pragma omp simd
	for (size_t i = 0; i < n; i++) {
		gpt_real g = gate[i], sg = sigmoid(g), d = dm[i];
		dgate[i] = d * up[i] * sg * (1 + g * (1 - sg));
		dup[i] = d * g * sg;
	}
}

static void
swiglu_forward(gpt_real *m, const gpt_real *gate, const gpt_real *up, size_t n)
{
#pragma omp parallel for
	for (size_t i = 0; i < n; i += SWIGLU_CHUNK) {
		swiglu_forward_chunk(m + i, gate + i, up + i,
				     n - i < SWIGLU_CHUNK ? n - i : SWIGLU_CHUNK);
	}
}

static void
swiglu_backward(gpt_real *dgate, gpt_real *dup, const gpt_real *dm, const gpt_real *gate,
		const gpt_real *up, size_t n)
{
#pragma omp parallel for
	for (size_t i = 0; i < n; i += SWIGLU_CHUNK) {
		swiglu_backward_chunk(dgate + i, dup + i, dm + i, gate + i, up + i,
				      n - i < SWIGLU_CHUNK ? n - i : SWIGLU_CHUNK);
	}
}

#define P(t) (params[(t)])
#define G(t) (grads[(t)])

/* Block l's activations in a (gpt_acts: ln1 / ln1_rstd the attention's RMSNorm, ln2 /
 * ln2_rstd the MLP's, fch the gate, fch_gelu the up projection, mlp silu(gate) x up). */
struct llama_slices {
	const gpt_real *x;
	gpt_real *h1, *r1, *q, *k, *v, *atty, *att, *res2, *h2, *r2, *gate, *up, *m, *res3;
};

static struct llama_slices
slices(const struct gpt_dims *d, const struct gpt_acts *a, int l)
{
	size_t N = (size_t)d->B * d->T, C = (size_t)d->C, KVD = (size_t)gpt_kvd(d);
	size_t FF = (size_t)gpt_ff(d), att = (size_t)d->B * d->NH * d->T * d->T, L = (size_t)l;
	return (struct llama_slices){
		.x = gpt_cpu_block_input(d, a, l),
		.h1 = a->ln1 + L * N * C,
		.r1 = a->ln1_rstd + L * N,
		.q = a->q + L * N * C,
		.k = a->k + L * N * KVD,
		.v = a->v + L * N * KVD,
		.atty = a->atty + L * N * C,
		.att = a->att + L * att,
		.res2 = a->res2 + L * N * C,
		.h2 = a->ln2 + L * N * C,
		.r2 = a->ln2_rstd + L * N,
		.gate = a->fch + L * N * FF,
		.up = a->fch_gelu + L * N * FF,
		.m = a->mlp + L * N * FF,
		.res3 = a->res3 + L * N * C,
	};
}

void
llama_cpu_block_forward(const struct gpt_dims *d, struct gpt_acts *a, int l,
			const gpt_real *const *params)
{
	int N = d->B * d->T, C = d->C, KVD = gpt_kvd(d), FF = gpt_ff(d), hs = gpt_hs(d);
	size_t NC = (size_t)N * C, NF = (size_t)N * FF;
	double theta = gpt_rope_theta(d);
	struct llama_slices s = slices(d, a, l);

	/* res2 = x + o(attention(rope(q(h1)), rope(k(h1)), v(h1))), h1 = RMSNorm(x) */
	rmsnorm_forward(s.h1, s.r1, s.x, P(LLAMA_ATTN_NORM), N, C, gpt_eps(d));
	gpt_matmul_forward(s.q, s.h1, P(LLAMA_Q), NULL, N, C, C);
	gpt_matmul_forward(s.k, s.h1, P(LLAMA_K), NULL, N, C, KVD);
	gpt_matmul_forward(s.v, s.h1, P(LLAMA_V), NULL, N, C, KVD);
	rope(s.q, d->B, d->T, d->NH, hs, C, theta, 1);
	rope(s.k, d->B, d->T, gpt_kvh(d), hs, KVD, theta, 1);
	gpt_cpu_attention_forward(s.atty, s.att, s.q, s.k, s.v, C, KVD, d->B, d->T, d->NH,
				  gpt_kvh(d), hs);
	gpt_matmul_forward(s.res2, s.atty, P(LLAMA_O), NULL, N, C, C);
#pragma omp parallel for simd
	for (size_t i = 0; i < NC; i++) {
		s.res2[i] += s.x[i];
	}
	/* res3 = res2 + down(silu(gate(h2)) * up(h2)), h2 = RMSNorm(res2) */
	rmsnorm_forward(s.h2, s.r2, s.res2, P(LLAMA_MLP_NORM), N, C, gpt_eps(d));
	gpt_matmul_forward(s.gate, s.h2, P(LLAMA_GATE), NULL, N, C, FF);
	gpt_matmul_forward(s.up, s.h2, P(LLAMA_UP), NULL, N, C, FF);
	swiglu_forward(s.m, s.gate, s.up, NF);
	gpt_matmul_forward(s.res3, s.m, P(LLAMA_DOWN), NULL, N, FF, C);
#pragma omp parallel for simd
	for (size_t i = 0; i < NC; i++) {
		s.res3[i] += s.res2[i];
	}
}

/* a += b (+ c when not NULL), element by element in that order */
static void
add_into(gpt_real *a, const gpt_real *b, const gpt_real *c, size_t n)
{
	if (c) {
#pragma omp parallel for simd
		for (size_t i = 0; i < n; i++) {
			a[i] = (a[i] + b[i]) + c[i];
		}
	} else {
#pragma omp parallel for simd
		for (size_t i = 0; i < n; i++) {
			a[i] = a[i] + b[i];
		}
	}
}

void
llama_cpu_block_backward(const struct gpt_dims *d, struct gpt_acts *a, int l,
			 const gpt_real *const *params, gpt_real *const *grads)
{
	int N = d->B * d->T, C = d->C, KVD = gpt_kvd(d), FF = gpt_ff(d), hs = gpt_hs(d);
	size_t NC = (size_t)N * C, NF = (size_t)N * FF;
	double theta = gpt_rope_theta(d);
	struct llama_slices s = slices(d, a, l);
	gpt_real *dout = a->dres; /* d res3 on entry; d x on return */
	gpt_real *dres2 = a->dres_b;

	/* the MLP: dm, then dgate = dm up silu'(gate), dup = dm silu(gate) */
	gpt_matmul_backward(a->dbig, G(LLAMA_DOWN), NULL, dout, s.m, P(LLAMA_DOWN), N, FF, C);
	swiglu_backward(a->dbig2, a->dbig3, a->dbig, s.gate, s.up, NF);
	gpt_matmul_backward(a->dsmall, G(LLAMA_GATE), NULL, a->dbig2, s.h2, P(LLAMA_GATE), N, C,
			    FF);
	gpt_matmul_backward(a->dsmall2, G(LLAMA_UP), NULL, a->dbig3, s.h2, P(LLAMA_UP), N, C, FF);
	add_into(a->dsmall, a->dsmall2, NULL, NC);
	memcpy(dres2, dout, NC * sizeof(gpt_real));
	rmsnorm_backward(dres2, G(LLAMA_MLP_NORM), a->dsmall, s.res2, P(LLAMA_MLP_NORM), s.r2, N,
			 C);
	/* the attention */
	gpt_matmul_backward(a->dsmall, G(LLAMA_O), NULL, dres2, s.atty, P(LLAMA_O), N, C, C);
	gpt_cpu_attention_backward(a->dq, a->dk, a->dv, C, KVD, a->datt, a->dpreatt, a->dsmall, s.q,
				   s.k, s.v, s.att, d->B, d->T, d->NH, gpt_kvh(d), hs);
	rope(a->dq, d->B, d->T, d->NH, hs, C, theta, -1);
	rope(a->dk, d->B, d->T, gpt_kvh(d), hs, KVD, theta, -1);
	gpt_matmul_backward(a->dsmall, G(LLAMA_Q), NULL, a->dq, s.h1, P(LLAMA_Q), N, C, C);
	gpt_matmul_backward(a->dsmall2, G(LLAMA_K), NULL, a->dk, s.h1, P(LLAMA_K), N, C, KVD);
	gpt_matmul_backward(a->dsmall3, G(LLAMA_V), NULL, a->dv, s.h1, P(LLAMA_V), N, C, KVD);
	add_into(a->dsmall, a->dsmall2, a->dsmall3, NC);
	memcpy(dout, dres2, NC * sizeof(gpt_real));
	rmsnorm_backward(dout, G(LLAMA_ATTN_NORM), a->dsmall, s.x, P(LLAMA_ATTN_NORM), s.r1, N, C);
}

void
llama_cpu_head_forward_backward(const struct gpt_dims *d, struct gpt_acts *a, const int *targets,
				const gpt_real *head, const gpt_real *normw, gpt_real dloss,
				gpt_real *dhead, gpt_real *dnormw)
{
	int N = d->B * d->T, C = d->C, V = d->V;
	const gpt_real *x = gpt_cpu_block_input(d, a, d->L);
	rmsnorm_forward(a->lnf, a->lnf_rstd, x, normw, N, C, gpt_eps(d));
	gpt_matmul_forward(a->probs, a->lnf, head, NULL, N, C, V);
	gpt_cpu_xent(d, a, targets, dloss);
	gpt_matmul_backward(a->dsmall, dhead, NULL, a->probs, a->lnf, head, N, C, V);
	memset(a->dres, 0, (size_t)N * C * sizeof(gpt_real));
	rmsnorm_backward(a->dres, dnormw, a->dsmall, x, normw, a->lnf_rstd, N, C);
}
