/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt_cpu.c: the layers on the CPU (the "host" device), forward and backward,
 * OpenMP over independent rows, after llm.c's train_gpt2.c: GPT-2's, the kernels both
 * architectures share (causal grouped-query attention, the cross-entropy), and the ops table,
 * which hands Llama's blocks and head to llama_cpu.c. Deterministic for any thread count: every
 * output element is written by one thread, summing in a fixed order (no atomics, no reduction
 * clauses), so two runs with the same parameters give the same bits.
 *
 * Also the shapes of gpt_model.h (layer layout, activations). Not here: the training loop
 * (gpt.c), the GPU backend (gpt_cuda.cu: the same gpt_ops on the "cuda" device).
 */
#include <math.h>
#include <string.h>
#include <tgmath.h>

#include "gpt_cpu_internal.h"
#include "gpt_matmul.h"
#include "gpt_model.h"
#include "gpt_vmath.h"

/* ---- shapes -------------------------------------------------------------------------------- */

int
gpt_block_tensors(const struct gpt_dims *d)
{
	return d->arch == GPT_ARCH_LLAMA ? LLAMA_BLOCK_TENSORS : GPT_BLOCK_TENSORS;
}

void
gpt_block_shape(const struct gpt_dims *d, int tensor, size_t *rows, size_t *cols)
{
	size_t C = (size_t)d->C, FF = (size_t)gpt_ff(d), KVD = (size_t)gpt_kvd(d);
	*rows = 0;
	*cols = C;
	if (d->arch == GPT_ARCH_LLAMA) {
		switch (tensor) {
		case LLAMA_Q:
		case LLAMA_O:
			*rows = C;
			break;
		case LLAMA_K:
		case LLAMA_V:
			*rows = KVD;
			break;
		case LLAMA_GATE:
		case LLAMA_UP:
			*rows = FF;
			break;
		case LLAMA_DOWN:
			*rows = C;
			*cols = FF;
			break;
		default: /* the RMSNorms' weights */
			break;
		}
		return;
	}
	switch (tensor) {
	case GPT_QKVW:
		*rows = 3 * C;
		break;
	case GPT_QKVB:
		*cols = 3 * C;
		break;
	case GPT_ATTPROJW:
		*rows = C;
		break;
	case GPT_FCW:
		*rows = FF;
		break;
	case GPT_FCPROJW:
		*rows = C;
		*cols = FF;
		break;
	case GPT_FCB:
		*cols = FF;
		break;
	default: /* the LayerNorms' weights and biases, attproj and fcproj biases */
		break;
	}
}

size_t
gpt_block_numel(const struct gpt_dims *d, int tensor)
{
	size_t rows, cols;
	gpt_block_shape(d, tensor, &rows, &cols);
	return (rows ? rows : 1) * cols;
}

size_t
gpt_block_offset(const struct gpt_dims *d, int tensor)
{
	size_t off = 0;
	for (int i = 0; i < tensor; i++) {
		off += gpt_block_numel(d, i);
	}
	return off;
}

size_t
gpt_block_size(const struct gpt_dims *d)
{
	return gpt_block_offset(d, gpt_block_tensors(d));
}

/* The fields of struct gpt_acts in order, with their sizes (0: not used by this architecture). */
static size_t
acts_sizes(const struct gpt_dims *d, size_t *s)
{
	size_t N = (size_t)d->B * (size_t)d->T, C = (size_t)d->C, L = (size_t)d->L;
	size_t att = (size_t)d->B * (size_t)d->NH * (size_t)d->T * (size_t)d->T;
	size_t FF = (size_t)gpt_ff(d), KVD = (size_t)gpt_kvd(d);
	int llama = d->arch == GPT_ARCH_LLAMA, gpt2 = !llama;
	size_t i = 0;
	s[i++] = N * C;		       /* encoded */
	s[i++] = L * N * C;	       /* ln1 */
	s[i++] = gpt2 * L * N;	       /* ln1_mean */
	s[i++] = L * N;		       /* ln1_rstd */
	s[i++] = gpt2 * L * N * 3 * C; /* qkv */
	s[i++] = llama * L * N * C;    /* q */
	s[i++] = llama * L * N * KVD;  /* k */
	s[i++] = llama * L * N * KVD;  /* v */
	s[i++] = L * N * C;	       /* atty */
	s[i++] = L * att;	       /* att */
	s[i++] = L * N * C;	       /* res2 */
	s[i++] = L * N * C;	       /* ln2 */
	s[i++] = gpt2 * L * N;	       /* ln2_mean */
	s[i++] = L * N;		       /* ln2_rstd */
	s[i++] = L * N * FF;	       /* fch */
	s[i++] = L * N * FF;	       /* fch_gelu */
	s[i++] = llama * L * N * FF;   /* mlp */
	s[i++] = L * N * C;	       /* res3 */
	s[i++] = N * C;		       /* lnf */
	s[i++] = gpt2 * N;	       /* lnf_mean */
	s[i++] = N;		       /* lnf_rstd */
	s[i++] = N * (size_t)d->V;     /* probs */
	s[i++] = N;		       /* losses */
	s[i++] = N * C;		       /* dres */
	s[i++] = N * C;		       /* dres_b */
	s[i++] = N * FF;	       /* dbig */
	s[i++] = N * FF;	       /* dbig2 */
	s[i++] = att;		       /* datt */
	s[i++] = att;		       /* dpreatt */
	s[i++] = N * C;		       /* dsmall */
	s[i++] = N * C;		       /* dsmall2 */
	s[i++] = llama * N * C;	       /* dsmall3 */
	s[i++] = llama * N * FF;       /* dbig3 */
	s[i++] = llama * N * C;	       /* dq */
	s[i++] = llama * N * KVD;      /* dk */
	s[i++] = llama * N * KVD;      /* dv */
	return i;
}

size_t
gpt_acts_numel(const struct gpt_dims *d)
{
	size_t s[48], n = acts_sizes(d, s), all = 0;
	for (size_t i = 0; i < n; i++) {
		all += s[i];
	}
	return all;
}

void
gpt_acts_carve(const struct gpt_dims *d, gpt_real *base, struct gpt_acts *a)
{
	size_t s[48], n = acts_sizes(d, s);
	gpt_real **f[] = {
		&a->encoded,  &a->ln1,	    &a->ln1_mean, &a->ln1_rstd, &a->qkv,     &a->q,
		&a->k,	      &a->v,	    &a->atty,	  &a->att,	&a->res2,    &a->ln2,
		&a->ln2_mean, &a->ln2_rstd, &a->fch,	  &a->fch_gelu, &a->mlp,     &a->res3,
		&a->lnf,      &a->lnf_mean, &a->lnf_rstd, &a->probs,	&a->losses,  &a->dres,
		&a->dres_b,   &a->dbig,	    &a->dbig2,	  &a->datt,	&a->dpreatt, &a->dsmall,
		&a->dsmall2,  &a->dsmall3,  &a->dbig3,	  &a->dq,	&a->dk,	     &a->dv};
	_Static_assert(sizeof(f) / sizeof(f[0]) == 36, "struct gpt_acts fields");
	for (size_t i = 0; i < n; i++) {
		*f[i] = s[i] ? base : NULL;
		base += s[i];
	}
}

/* ---- kernels (llm.c's, each output written by one thread) -------------------------------- */

#define LN_EPS 1e-5

static void
layernorm_forward(gpt_real *out, gpt_real *mean, gpt_real *rstd, const gpt_real *inp,
		  const gpt_real *w, const gpt_real *b, int N, int C)
{
#pragma omp parallel for
	for (int i = 0; i < N; i++) {
		const gpt_real *x = inp + (size_t)i * C;
		gpt_real m = 0, v = 0;
		for (int c = 0; c < C; c++) {
			m += x[c];
		}
		m /= C;
		for (int c = 0; c < C; c++) {
			gpt_real dx = x[c] - m;
			v += dx * dx;
		}
		v /= C;
		gpt_real s = 1 / sqrt(v + (gpt_real)LN_EPS);
		gpt_real *o = out + (size_t)i * C;
		for (int c = 0; c < C; c++) {
			o[c] = (x[c] - m) * s * w[c] + b[c];
		}
		mean[i] = m;
		rstd[i] = s;
	}
}

/* Columns per thread's share of a sum over rows: the rows are read in order, LN_COLS columns of
   each at a time (vectorised), so every sum is one thread's, in row order. */
#define LN_COLS 32

/* dinp += d(LN)/dinp; dw, db = (set) */
static void
layernorm_backward(gpt_real *dinp, gpt_real *dw, gpt_real *db, const gpt_real *dout,
		   const gpt_real *inp, const gpt_real *w, const gpt_real *mean,
		   const gpt_real *rstd, int N, int C)
{
#pragma omp parallel for
	for (int c0 = 0; c0 < C; c0 += LN_COLS) {
		int nc = C - c0 < LN_COLS ? C - c0 : LN_COLS;
		gpt_real *sw = dw + c0, *sb = db + c0;
		for (int c = 0; c < nc; c++) {
			sw[c] = sb[c] = 0;
		}
		for (int i = 0; i < N; i++) {
			const gpt_real *x = inp + (size_t)i * C + c0,
				       *g = dout + (size_t)i * C + c0;
			gpt_real m = mean[i], r = rstd[i];
#pragma omp simd
			for (int c = 0; c < nc; c++) {
				sw[c] += (x[c] - m) * r * g[c];
				sb[c] += g[c];
			}
		}
	}
#pragma omp parallel for
	for (int i = 0; i < N; i++) {
		const gpt_real *x = inp + (size_t)i * C, *g = dout + (size_t)i * C;
		gpt_real *dx = dinp + (size_t)i * C;
		gpt_real dnorm_mean = 0, dnorm_norm_mean = 0;
		for (int c = 0; c < C; c++) {
			gpt_real n = (x[c] - mean[i]) * rstd[i];
			gpt_real dn = w[c] * g[c];
			dnorm_mean += dn;
			dnorm_norm_mean += dn * n;
		}
		dnorm_mean /= C;
		dnorm_norm_mean /= C;
		for (int c = 0; c < C; c++) {
			gpt_real n = (x[c] - mean[i]) * rstd[i];
			gpt_real dn = w[c] * g[c];
			dx[c] += (dn - dnorm_mean - n * dnorm_norm_mean) * rstd[i];
		}
	}
}

/*
 * Causal self-attention of NH query heads over KVH key-value heads (head h reads key-value head
 * h / (NH / KVH); GPT-2 has KVH = NH), each hs wide. Row i = b x T + t of q starts at q + i x qs,
 * of k and v at k + i x kvs, v + i x kvs (GPT-2: one qkv buffer, qs = kvs = 3C); att [B, NH, T, T]
 * the softmax (entries above the diagonal 0); out [B, T, NH x hs].
 *
 * With a BLAS, each (batch, head) is three products on its own thread (the BLAS runs one thread
 * inside a parallel region): scores = scale q k^T for the rows' causal blocks, the softmax in
 * place, out = att v; the backward is four more per head (datt = dout v^T, dv = att^T dout,
 * dq = scale dpreatt k, dk = scale dpreatt^T q), the heads of a key-value head on one thread in
 * order, the first setting its dk and dv and the others adding to them. Without one, the plain
 * loops below them (llm.c's).
 */
#ifdef GPT_HAVE_BLAS

/* Rows of the score matrix per product: rows [r, r + ATT_ROWS) need the columns [0, r +
   ATT_ROWS) only, so the products skip most of what the causal mask drops. The gradient check
   sets 2, so that its context of 5 is cut into blocks too. */
#ifdef GPT_ATT_ROWS
#define ATT_ROWS GPT_ATT_ROWS
#else
#define ATT_ROWS 32
#endif

void
gpt_cpu_attention_forward(gpt_real *out, gpt_real *att, const gpt_real *q, const gpt_real *k,
			  const gpt_real *v, int qs, int kvs, int B, int T, int NH, int KVH, int hs)
{
	int C = NH * hs, group = NH / KVH;
	gpt_real scale = 1 / sqrt((gpt_real)hs);
#pragma omp parallel for collapse(2)
	for (int b = 0; b < B; b++) {
		for (int h = 0; h < NH; h++) {
			size_t kvo = (size_t)b * T * kvs + (size_t)(h / group) * hs;
			const gpt_real *qh = q + (size_t)b * T * qs + (size_t)h * hs, *kh = k + kvo,
				       *vh = v + kvo;
			gpt_real *a = att + ((size_t)b * NH + h) * T * T;
			for (int r = 0; r < T; r += ATT_ROWS) {
				int n = T - r < ATT_ROWS ? T - r : ATT_ROWS;
				gpt_gemm(0, 1, n, r + n, hs, scale, qh + (size_t)r * qs, qs, kh,
					 kvs, 0, a + (size_t)r * T, T);
			}
			for (int t = 0; t < T; t++) {
				gpt_real *p = a + (size_t)t * T, maxv = -INFINITY, sum = 0;
#pragma omp simd reduction(max : maxv)
				for (int t2 = 0; t2 <= t; t2++) {
					maxv = p[t2] > maxv ? p[t2] : maxv;
				}
#pragma omp simd reduction(+ : sum)
				for (int t2 = 0; t2 <= t; t2++) {
					p[t2] = GPT_EXP(p[t2] - maxv);
					sum += p[t2];
				}
#pragma omp simd
				for (int t2 = 0; t2 <= t; t2++) {
					p[t2] /= sum;
				}
				for (int t2 = t + 1; t2 < T; t2++) {
					p[t2] = 0;
				}
			}
			for (int r = 0; r < T; r += ATT_ROWS) {
				int n = T - r < ATT_ROWS ? T - r : ATT_ROWS;
				gpt_gemm(0, 0, n, hs, r + n, 1, a + (size_t)r * T, T, vh, kvs, 0,
					 out + ((size_t)b * T + r) * C + (size_t)h * hs, C);
			}
		}
	}
}

/* dq, dk, dv = (set), with q's and kv's strides; datt, dpreatt scratch [B, NH, T, T]. Each
 * (b, key-value head) writes only its own heads' slices. */
void
gpt_cpu_attention_backward(gpt_real *dq, gpt_real *dk, gpt_real *dv, int qs, int kvs,
			   gpt_real *datt, gpt_real *dpreatt, const gpt_real *dout,
			   const gpt_real *q, const gpt_real *k, const gpt_real *v,
			   const gpt_real *att, int B, int T, int NH, int KVH, int hs)
{
	int C = NH * hs, group = NH / KVH;
	gpt_real scale = 1 / sqrt((gpt_real)hs);
#pragma omp parallel for collapse(2)
	for (int b = 0; b < B; b++) {
		for (int kh = 0; kh < KVH; kh++) {
			size_t kvo = (size_t)b * T * kvs + (size_t)kh * hs;
			const gpt_real *kk = k + kvo, *vv = v + kvo;
			gpt_real *dkk = dk + kvo, *dvv = dv + kvo;
			for (int h = kh * group; h < (kh + 1) * group; h++) {
				size_t bh = ((size_t)b * NH + h) * T * T;
				gpt_real acc = h == kh * group ? 0 : 1; /* the group's first sets */
				const gpt_real *qh = q + (size_t)b * T * qs + (size_t)h * hs,
					       *a = att + bh;
				const gpt_real *g = dout + (size_t)b * T * C + (size_t)h * hs;
				gpt_real *dqh = dq + (size_t)b * T * qs + (size_t)h * hs,
					 *da = datt + bh, *dp = dpreatt + bh;
				/* out = att v: datt = dout v^T (the causal blocks); dv = att^T
				   dout, whose rows [r, r + n) take att's rows from r on only */
				for (int r = 0; r < T; r += ATT_ROWS) {
					int n = T - r < ATT_ROWS ? T - r : ATT_ROWS;
					gpt_gemm(0, 1, n, r + n, hs, 1, g + (size_t)r * C, C, vv,
						 kvs, 0, da + (size_t)r * T, T);
					gpt_gemm(1, 0, n, hs, T - r, 1, a + (size_t)r * T + r, T,
						 g + (size_t)r * C, C, acc, dvv + (size_t)r * kvs,
						 kvs);
				}
				/* the softmax */
				for (int t = 0; t < T; t++) {
					const gpt_real *pa = a + (size_t)t * T,
						       *pd = da + (size_t)t * T;
					gpt_real *pp = dp + (size_t)t * T, dot = 0;
#pragma omp simd reduction(+ : dot)
					for (int t2 = 0; t2 <= t; t2++) {
						dot += pa[t2] * pd[t2];
					}
#pragma omp simd
					for (int t2 = 0; t2 <= t; t2++) {
						pp[t2] = pa[t2] * (pd[t2] - dot);
					}
					for (int t2 = t + 1; t2 < T; t2++) {
						pp[t2] = 0;
					}
				}
				/* scores = scale q k^T: dq = scale dpreatt k, dk = scale dpreatt^T
				 * q */
				for (int r = 0; r < T; r += ATT_ROWS) {
					int n = T - r < ATT_ROWS ? T - r : ATT_ROWS;
					gpt_gemm(0, 0, n, hs, r + n, scale, dp + (size_t)r * T, T,
						 kk, kvs, 0, dqh + (size_t)r * qs, qs);
					gpt_gemm(1, 0, n, hs, T - r, scale, dp + (size_t)r * T + r,
						 T, qh + (size_t)r * qs, qs, acc,
						 dkk + (size_t)r * kvs, kvs);
				}
			}
		}
	}
}

#else

void
gpt_cpu_attention_forward(gpt_real *out, gpt_real *att, const gpt_real *q, const gpt_real *k,
			  const gpt_real *v, int qs, int kvs, int B, int T, int NH, int KVH, int hs)
{
	int C = NH * hs, group = NH / KVH;
	gpt_real scale = 1 / sqrt((gpt_real)hs);
#pragma omp parallel for collapse(2)
	for (int b = 0; b < B; b++) {
		for (int h = 0; h < NH; h++) {
			size_t kvo = (size_t)(h / group) * hs;
			for (int t = 0; t < T; t++) {
				const gpt_real *qt = q + ((size_t)b * T + t) * qs + (size_t)h * hs;
				gpt_real *a = att + (((size_t)b * NH + h) * T + t) * T;
				gpt_real maxv = -INFINITY;
				for (int t2 = 0; t2 <= t; t2++) {
					const gpt_real *kt = k + ((size_t)b * T + t2) * kvs + kvo;
					gpt_real s = 0;
					for (int i = 0; i < hs; i++) {
						s += qt[i] * kt[i];
					}
					s *= scale;
					a[t2] = s;
					maxv = s > maxv ? s : maxv;
				}
				gpt_real sum = 0;
				for (int t2 = 0; t2 <= t; t2++) {
					a[t2] = exp(a[t2] - maxv);
					sum += a[t2];
				}
				for (int t2 = 0; t2 < T; t2++) {
					a[t2] = t2 <= t ? a[t2] / sum : 0;
				}
				gpt_real *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
				for (int i = 0; i < hs; i++) {
					o[i] = 0;
				}
				for (int t2 = 0; t2 <= t; t2++) {
					const gpt_real *vt = v + ((size_t)b * T + t2) * kvs + kvo;
					for (int i = 0; i < hs; i++) {
						o[i] += a[t2] * vt[i];
					}
				}
			}
		}
	}
}

/* dq, dk, dv = (set), with q's and kv's strides (they may be slices of one buffer, as GPT-2's
 * dqkv); datt, dpreatt scratch [B, NH, T, T]. Each (b, key-value head) writes only its own
 * heads' slices, its query heads in order, so the loops in parallel never write the same
 * element and the sums' order does not depend on threads. */
void
gpt_cpu_attention_backward(gpt_real *dq, gpt_real *dk, gpt_real *dv, int qs, int kvs,
			   gpt_real *datt, gpt_real *dpreatt, const gpt_real *dout,
			   const gpt_real *q, const gpt_real *k, const gpt_real *v,
			   const gpt_real *att, int B, int T, int NH, int KVH, int hs)
{
	int C = NH * hs, group = NH / KVH;
	gpt_real scale = 1 / sqrt((gpt_real)hs);
#pragma omp parallel for collapse(2)
	for (int b = 0; b < B; b++) {
		for (int kh = 0; kh < KVH; kh++) {
			size_t kvo = (size_t)kh * hs;
			for (int t = 0; t < T; t++) {
				size_t r = (size_t)b * T + t;
				for (int i = 0; i < hs; i++) {
					dk[r * kvs + kvo + i] = dv[r * kvs + kvo + i] = 0;
				}
				for (int h = kh * group; h < (kh + 1) * group; h++) {
					for (int i = 0; i < hs; i++) {
						dq[r * qs + (size_t)h * hs + i] = 0;
					}
				}
			}
			for (int h = kh * group; h < (kh + 1) * group; h++) {
				for (int t = 0; t < T; t++) {
					size_t r = (size_t)b * T + t, ho = (size_t)h * hs;
					const gpt_real *a =
						att + (((size_t)b * NH + h) * T + t) * T;
					gpt_real *da = datt + (((size_t)b * NH + h) * T + t) * T;
					gpt_real *dp = dpreatt + (((size_t)b * NH + h) * T + t) * T;
					const gpt_real *g = dout + r * C + ho;
					const gpt_real *qt = q + r * qs + ho;
					gpt_real *dqt = dq + r * qs + ho;
					/* out = sum att * v */
					for (int t2 = 0; t2 <= t; t2++) {
						size_t r2 = (size_t)b * T + t2;
						const gpt_real *vt = v + r2 * kvs + kvo;
						gpt_real *dvt = dv + r2 * kvs + kvo;
						gpt_real s = 0;
						for (int i = 0; i < hs; i++) {
							s += vt[i] * g[i];
							dvt[i] += a[t2] * g[i];
						}
						da[t2] = s;
					}
					/* softmax */
					gpt_real dot = 0;
					for (int t2 = 0; t2 <= t; t2++) {
						dot += a[t2] * da[t2];
					}
					for (int t2 = 0; t2 <= t; t2++) {
						dp[t2] = a[t2] * (da[t2] - dot);
					}
					/* preatt = scale q . k */
					for (int t2 = 0; t2 <= t; t2++) {
						size_t r2 = (size_t)b * T + t2;
						const gpt_real *kt = k + r2 * kvs + kvo;
						gpt_real *dkt = dk + r2 * kvs + kvo;
						gpt_real ds = dp[t2] * scale;
						for (int i = 0; i < hs; i++) {
							dqt[i] += kt[i] * ds;
							dkt[i] += qt[i] * ds;
						}
					}
				}
			}
		}
	}
}

#endif

#define GELU_SCALE 0.7978845608028654 /* sqrt(2 / pi) */

/*
 * The GELU, in chunks of GELU_CHUNK elements (the same cut for any thread count). Its element
 * loops are compiled twice on x86-64, for the baseline (SSE2) and for x86-64-v3 (AVX2 and FMA),
 * and the loader picks one for the machine once (GPT_CLONES: GCC's and clang's target_clones, an
 * ifunc), as PyTorch picks its AVX2 kernels; the tanh is GPT_TANH (gpt_vmath.h) for float,
 * libm's for double. The chosen clone is the same for the whole run, so the bits stay fixed.
 */
#define GELU_CHUNK 4096

GPT_CLONES static void
gelu_forward_chunk(gpt_real *out, const gpt_real *inp, size_t n)
{
#pragma omp simd
	for (size_t i = 0; i < n; i++) {
		gpt_real x = inp[i];
		gpt_real cube = (gpt_real)0.044715 * x * x * x;
		out[i] = (gpt_real)0.5 * x * (1 + GPT_TANH((gpt_real)GELU_SCALE * (x + cube)));
	}
}

/* dinp = (set); sech^2 as 1 - tanh^2 (as PyTorch's), one transcendental per element */
GPT_CLONES static void
gelu_backward_chunk(gpt_real *dinp, const gpt_real *inp, const gpt_real *dout, size_t n)
{
#pragma omp simd
	for (size_t i = 0; i < n; i++) {
		gpt_real x = inp[i];
		gpt_real cube = (gpt_real)0.044715 * x * x * x;
		gpt_real arg = (gpt_real)GELU_SCALE * (x + cube);
		gpt_real th = GPT_TANH(arg);
		gpt_real sech2 = 1 - th * th;
		gpt_real g = (gpt_real)0.5 * (1 + th) +
			     x * (gpt_real)0.5 * sech2 * (gpt_real)GELU_SCALE *
				     (1 + 3 * (gpt_real)0.044715 * x * x);
		dinp[i] = g * dout[i];
	}
}

static void
gelu_forward(gpt_real *out, const gpt_real *inp, size_t n)
{
#pragma omp parallel for
	for (size_t i = 0; i < n; i += GELU_CHUNK) {
		gelu_forward_chunk(out + i, inp + i, n - i < GELU_CHUNK ? n - i : GELU_CHUNK);
	}
}

static void
gelu_backward(gpt_real *dinp, const gpt_real *inp, const gpt_real *dout, size_t n)
{
#pragma omp parallel for
	for (size_t i = 0; i < n; i += GELU_CHUNK) {
		gelu_backward_chunk(dinp + i, inp + i, dout + i,
				    n - i < GELU_CHUNK ? n - i : GELU_CHUNK);
	}
}

/* ---- the layers ---------------------------------------------------------------------------- */

static void
cpu_encoder_forward(const struct gpt_dims *d, struct gpt_acts *a, const int *tokens,
		    const gpt_real *wte, const gpt_real *wpe)
{
	int N = d->B * d->T, C = d->C;
#pragma omp parallel for
	for (int i = 0; i < N; i++) {
		const gpt_real *we = wte + (size_t)tokens[i] * C;
		gpt_real *o = a->encoded + (size_t)i * C;
		if (!wpe) {
			memcpy(o, we, (size_t)C * sizeof(gpt_real));
			continue;
		}
		const gpt_real *pe = wpe + (size_t)(i % d->T) * C;
		for (int c = 0; c < C; c++) {
			o[c] = we[c] + pe[c];
		}
	}
}

const gpt_real *
gpt_cpu_block_input(const struct gpt_dims *d, const struct gpt_acts *a, int l)
{
	size_t NC = (size_t)d->B * d->T * d->C;
	return l == 0 ? a->encoded : a->res3 + (size_t)(l - 1) * NC;
}

#define P(t) (params[(t)])
#define G(t) (grads[(t)])

static void
cpu_block_forward(const struct gpt_dims *d, struct gpt_acts *a, int l,
		  const gpt_real *const *params)
{
	if (d->arch == GPT_ARCH_LLAMA) {
		llama_cpu_block_forward(d, a, l, params);
		return;
	}
	int N = d->B * d->T, C = d->C;
	size_t NC = (size_t)N * C, att = (size_t)d->B * d->NH * d->T * d->T;
	const gpt_real *x = gpt_cpu_block_input(d, a, l);
	gpt_real *ln1 = a->ln1 + l * NC, *ln1m = a->ln1_mean + (size_t)l * N,
		 *ln1r = a->ln1_rstd + (size_t)l * N, *qkv = a->qkv + l * 3 * NC,
		 *atty = a->atty + l * NC, *attm = a->att + l * att, *res2 = a->res2 + l * NC,
		 *ln2 = a->ln2 + l * NC, *ln2m = a->ln2_mean + (size_t)l * N,
		 *ln2r = a->ln2_rstd + (size_t)l * N, *fch = a->fch + l * 4 * NC,
		 *fchg = a->fch_gelu + l * 4 * NC, *res3 = a->res3 + l * NC;

	layernorm_forward(ln1, ln1m, ln1r, x, P(GPT_LN1W), P(GPT_LN1B), N, C);
	gpt_matmul_forward(qkv, ln1, P(GPT_QKVW), P(GPT_QKVB), N, C, 3 * C);
	gpt_cpu_attention_forward(atty, attm, qkv, qkv + C, qkv + 2 * C, 3 * C, 3 * C, d->B, d->T,
				  d->NH, d->NH, C / d->NH);
	gpt_matmul_forward(res2, atty, P(GPT_ATTPROJW), P(GPT_ATTPROJB), N, C, C);
#pragma omp parallel for
	for (size_t i = 0; i < NC; i++) {
		res2[i] += x[i];
	}
	layernorm_forward(ln2, ln2m, ln2r, res2, P(GPT_LN2W), P(GPT_LN2B), N, C);
	gpt_matmul_forward(fch, ln2, P(GPT_FCW), P(GPT_FCB), N, C, 4 * C);
	gelu_forward(fchg, fch, 4 * NC);
	gpt_matmul_forward(res3, fchg, P(GPT_FCPROJW), P(GPT_FCPROJB), N, 4 * C, C);
#pragma omp parallel for
	for (size_t i = 0; i < NC; i++) {
		res3[i] += res2[i];
	}
}

/* a->probs holds the logits [N, V]: per-position loss into a->losses, and in a->probs the
 * logits' gradient, dloss x (softmax - one-hot of the target) */
void
gpt_cpu_xent(const struct gpt_dims *d, struct gpt_acts *a, const int *targets, gpt_real dloss)
{
	int N = d->B * d->T, V = d->V;
#pragma omp parallel for
	for (int i = 0; i < N; i++) {
		gpt_real *p = a->probs + (size_t)i * V;
		gpt_real maxv = -INFINITY, sum = 0;
		for (int v = 0; v < V; v++) {
			maxv = p[v] > maxv ? p[v] : maxv;
		}
		for (int v = 0; v < V; v++) {
			p[v] = exp(p[v] - maxv);
			sum += p[v];
		}
		for (int v = 0; v < V; v++) {
			p[v] /= sum;
		}
		a->losses[i] = -log(p[targets[i]]);
		/* now the logits' gradient */
		for (int v = 0; v < V; v++) {
			p[v] = (p[v] - (v == targets[i] ? 1 : 0)) * dloss;
		}
	}
}

static void
cpu_head_forward_backward(const struct gpt_dims *d, struct gpt_acts *a, const int *targets,
			  const gpt_real *head, const gpt_real *lnfw, const gpt_real *lnfb,
			  gpt_real dloss, gpt_real *dhead, gpt_real *dlnfw, gpt_real *dlnfb)
{
	int N = d->B * d->T, C = d->C, V = d->V;
	if (d->arch == GPT_ARCH_LLAMA) {
		llama_cpu_head_forward_backward(d, a, targets, head, lnfw, dloss, dhead, dlnfw);
		return;
	}
	const gpt_real *x = gpt_cpu_block_input(d, a, d->L);
	layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, x, lnfw, lnfb, N, C);
	gpt_matmul_forward(a->probs, a->lnf, head, NULL, N, C, V);
	gpt_cpu_xent(d, a, targets, dloss);
	gpt_matmul_backward(a->dsmall, dhead, NULL, a->probs, a->lnf, head, N, C, V);
	for (size_t i = 0; i < (size_t)N * C; i++) {
		a->dres[i] = 0;
	}
	layernorm_backward(a->dres, dlnfw, dlnfb, a->dsmall, x, lnfw, a->lnf_mean, a->lnf_rstd, N,
			   C);
}

static void
cpu_block_backward(const struct gpt_dims *d, struct gpt_acts *a, int l,
		   const gpt_real *const *params, gpt_real *const *grads)
{
	if (d->arch == GPT_ARCH_LLAMA) {
		llama_cpu_block_backward(d, a, l, params, grads);
		return;
	}
	int N = d->B * d->T, C = d->C;
	size_t NC = (size_t)N * C, att = (size_t)d->B * d->NH * d->T * d->T;
	const gpt_real *x = gpt_cpu_block_input(d, a, l);
	const gpt_real *ln1 = a->ln1 + l * NC, *ln1m = a->ln1_mean + (size_t)l * N,
		       *ln1r = a->ln1_rstd + (size_t)l * N, *qkv = a->qkv + l * 3 * NC,
		       *atty = a->atty + l * NC, *attm = a->att + l * att, *res2 = a->res2 + l * NC,
		       *ln2 = a->ln2 + l * NC, *ln2m = a->ln2_mean + (size_t)l * N,
		       *ln2r = a->ln2_rstd + (size_t)l * N, *fch = a->fch + l * 4 * NC,
		       *fchg = a->fch_gelu + l * 4 * NC;
	gpt_real *dout = a->dres; /* d res3 on entry; d x on return */
	gpt_real *dres2 = a->dres_b;

	/* res3 = res2 + fcproj(gelu(fc(ln2(res2)))) */
	gpt_matmul_backward(a->dbig, G(GPT_FCPROJW), G(GPT_FCPROJB), dout, fchg, P(GPT_FCPROJW), N,
			    4 * C, C);
	gelu_backward(a->dbig2, fch, a->dbig, 4 * NC);
	gpt_matmul_backward(a->dsmall, G(GPT_FCW), G(GPT_FCB), a->dbig2, ln2, P(GPT_FCW), N, C,
			    4 * C);
	memcpy(dres2, dout, NC * sizeof(gpt_real));
	layernorm_backward(dres2, G(GPT_LN2W), G(GPT_LN2B), a->dsmall, res2, P(GPT_LN2W), ln2m,
			   ln2r, N, C);
	/* res2 = x + attproj(attention(qkv(ln1(x)))) */
	gpt_matmul_backward(a->dsmall, G(GPT_ATTPROJW), G(GPT_ATTPROJB), dres2, atty,
			    P(GPT_ATTPROJW), N, C, C);
	gpt_cpu_attention_backward(a->dbig, a->dbig + C, a->dbig + 2 * C, 3 * C, 3 * C, a->datt,
				   a->dpreatt, a->dsmall, qkv, qkv + C, qkv + 2 * C, attm, d->B,
				   d->T, d->NH, d->NH, C / d->NH);
	gpt_matmul_backward(a->dsmall2, G(GPT_QKVW), G(GPT_QKVB), a->dbig, ln1, P(GPT_QKVW), N, C,
			    3 * C);
	memcpy(dout, dres2, NC * sizeof(gpt_real));
	layernorm_backward(dout, G(GPT_LN1W), G(GPT_LN1B), a->dsmall2, x, P(GPT_LN1W), ln1m, ln1r,
			   N, C);
}

static void
cpu_encoder_backward(const struct gpt_dims *d, struct gpt_acts *a, const int *tokens,
		     gpt_real *dwte, gpt_real *dwpe)
{
	int N = d->B * d->T, C = d->C, T = d->T;
	/* dwpe[t] = sum over b, in b order */
#pragma omp parallel for
	for (int t = 0; t < (dwpe ? T : 0); t++) {
		gpt_real *o = dwpe + (size_t)t * C;
		for (int c = 0; c < C; c++) {
			o[c] = 0;
		}
		for (int b = 0; b < d->B; b++) {
			const gpt_real *g = a->dres + ((size_t)b * T + t) * C;
			for (int c = 0; c < C; c++) {
				o[c] += g[c];
			}
		}
	}
	/* dwte[v] += positions with token v, in position order: each thread owns a range of
	 * channels, so no two threads write the same element. Untied, nothing set dwte before:
	 * zero first. */
	if (!gpt_tied(d)) {
		memset(dwte, 0, (size_t)d->V * C * sizeof(gpt_real));
	}
#pragma omp parallel for
	for (int c = 0; c < C; c++) {
		for (int i = 0; i < N; i++) {
			dwte[(size_t)tokens[i] * C + c] += a->dres[(size_t)i * C + c];
		}
	}
}

const struct gpt_ops gpt_cpu_ops = {
	.name = "cpu",
	.device = "host",
	.encoder_forward = cpu_encoder_forward,
	.block_forward = cpu_block_forward,
	.head_forward_backward = cpu_head_forward_backward,
	.block_backward = cpu_block_backward,
	.encoder_backward = cpu_encoder_backward,
};
