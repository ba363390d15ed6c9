/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/gpt/test_gpt_gradcheck.c: the example GPT's backward (examples/gpt/gpt_cpu.c, compiled
 * here with GPT_REAL=double) against central finite differences of its loss, for every element
 * of every tensor of tiny models: a GPT-2 (2 blocks, hidden 8, 2 heads, context 5, vocabulary
 * 7, batch 2) and two Llamas (grouped-query attention, rotary embeddings, SwiGLU, RMSNorm; one
 * with its own head, one tied): a tied wte's gradient is the head's plus the embedding
 * lookup's, summed as the trainer sums them. In a build with a BLAS the layers' products are
 * cblas_dgemm (gpt_matmul.c) and the attention's per-head products cut the context into causal
 * blocks of 2 rows (GPT_ATT_ROWS, set by CMakeLists.txt), so the context of 5 covers whole
 * blocks and a remainder. Step h = 1e-5: truncation ~h^2 and rounding ~1e-16 / h leave errors
 * near 1e-10; a wrong term in any backward is of the size of the gradient itself (1e-3 .. 1e-1).
 * Pass: |numeric - analytic| <= 1e-7 + 1e-5 |analytic| for every element. Plain program
 * (exit 0 / 1), label gpt.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_model.h"

_Static_assert(sizeof(gpt_real) == sizeof(double), "compile with GPT_REAL=double");

struct net {
	struct gpt_dims d;
	double *wte, *wpe, *lnfw, *lnfb, *head, *blocks[2];
	double *dwte, *dwpe, *dlnfw, *dlnfb, *dhead, *dblocks[2];
	int *tokens, *targets;
	struct gpt_acts a;
	double *acts;
};

static uint64_t rng = 0x1234567ull;

static double
urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) * 0x1.0p-53;
}

static void
ptrs(const struct net *n, double *base, double **p)
{
	for (int k = 0; k < gpt_block_tensors(&n->d); k++) {
		p[k] = base + gpt_block_offset(&n->d, k);
	}
}

/* Forward and backward; returns the mean loss. */
static double
run(struct net *n)
{
	const struct gpt_ops *o = &gpt_cpu_ops;
	const struct gpt_dims *d = &n->d;
	int N = d->B * d->T;
	double *p[GPT_MAX_BLOCK_TENSORS], *g[GPT_MAX_BLOCK_TENSORS];
	o->encoder_forward(d, &n->a, n->tokens, n->wte, n->wpe);
	for (int l = 0; l < d->L; l++) {
		ptrs(n, n->blocks[l], p);
		o->block_forward(d, &n->a, l, (const double *const *)p);
	}
	o->head_forward_backward(d, &n->a, n->targets, n->head ? n->head : n->wte, n->lnfw, n->lnfb,
				 1.0 / N, n->head ? n->dhead : n->dwte, n->dlnfw, n->dlnfb);
	double loss = 0;
	for (int i = 0; i < N; i++) {
		loss += n->a.losses[i];
	}
	for (int l = d->L - 1; l >= 0; l--) {
		ptrs(n, n->blocks[l], p);
		ptrs(n, n->dblocks[l], g);
		o->block_backward(d, &n->a, l, (const double *const *)p, g);
	}
	o->encoder_backward(d, &n->a, n->tokens, n->dwte, n->dwpe);
	return loss / N;
}

static double *
fill(size_t count, double scale, double offset)
{
	double *x = malloc(count * sizeof(double));
	for (size_t i = 0; i < count; i++) {
		x[i] = offset + scale * (2 * urand() - 1);
	}
	return x;
}

static const char *const gpt2_names[GPT_BLOCK_TENSORS] = {
	"ln1.w", "ln1.b", "qkv.w", "qkv.b", "proj.w",	"proj.b",
	"ln2.w", "ln2.b", "fc.w",  "fc.b",  "fcproj.w", "fcproj.b"};
static const char *const llama_names[LLAMA_BLOCK_TENSORS] = {"attn_norm", "q",	  "k",	"v",   "o",
							     "mlp_norm",  "gate", "up", "down"};

/* Every element of every tensor of the model d; returns the elements over the tolerance. */
static int
check(const char *what, struct gpt_dims dims)
{
	struct net n = {.d = dims};
	const struct gpt_dims *d = &n.d;
	int llama = d->arch == GPT_ARCH_LLAMA, nbt = gpt_block_tensors(d);
	size_t C = (size_t)d->C, N = (size_t)d->B * d->T, blk = gpt_block_size(d);
	size_t VC = (size_t)d->V * C;
	n.wte = fill(VC, 0.5, 0);
	n.wpe = llama ? NULL : fill((size_t)d->T * C, 0.3, 0);
	n.lnfw = fill(C, 0.2, 1);
	n.lnfb = llama ? NULL : fill(C, 0.2, 0);
	n.head = gpt_tied(d) ? NULL : fill(VC, 0.5, 0);
	for (int l = 0; l < d->L; l++) {
		n.blocks[l] = fill(blk, 0.3, 0);
		/* the norms' weights near 1 */
		int w1 = llama ? LLAMA_ATTN_NORM : GPT_LN1W, w2 = llama ? LLAMA_MLP_NORM : GPT_LN2W;
		for (size_t i = 0; i < C; i++) {
			n.blocks[l][gpt_block_offset(d, w1) + i] += 1;
			n.blocks[l][gpt_block_offset(d, w2) + i] += 1;
		}
		n.dblocks[l] = calloc(blk, sizeof(double));
	}
	n.dwte = calloc(VC, sizeof(double));
	n.dwpe = llama ? NULL : calloc((size_t)d->T * C, sizeof(double));
	n.dlnfw = calloc(C, sizeof(double));
	n.dlnfb = llama ? NULL : calloc(C, sizeof(double));
	n.dhead = n.head ? calloc(VC, sizeof(double)) : NULL;
	n.tokens = malloc(N * sizeof(int));
	n.targets = malloc(N * sizeof(int));
	for (size_t i = 0; i < N; i++) {
		n.tokens[i] = (int)(urand() * d->V);
		n.targets[i] = (int)(urand() * d->V);
	}
	n.acts = calloc(gpt_acts_numel(d), sizeof(double));
	gpt_acts_carve(d, n.acts, &n.a);

	run(&n);
	/* keep the analytic gradients */
	struct {
		const char *name;
		double *x, *g, *src;
		size_t count;
		int block;
	} t[8];
	int nt = 0;
	t[nt++] = (typeof(t[0])){"wte", n.wte, NULL, n.dwte, VC, 0};
	if (n.wpe) {
		t[nt++] = (typeof(t[0])){"wpe", n.wpe, NULL, n.dwpe, (size_t)d->T * C, 0};
	}
	t[nt++] = (typeof(t[0])){"lnf.w", n.lnfw, NULL, n.dlnfw, C, 0};
	if (n.lnfb) {
		t[nt++] = (typeof(t[0])){"lnf.b", n.lnfb, NULL, n.dlnfb, C, 0};
	}
	if (n.head) {
		t[nt++] = (typeof(t[0])){"lm_head", n.head, NULL, n.dhead, VC, 0};
	}
	for (int l = 0; l < d->L; l++) {
		t[nt++] = (typeof(t[0])){l ? "h1" : "h0", n.blocks[l], NULL, n.dblocks[l], blk, 1};
	}
	for (int k = 0; k < nt; k++) {
		t[k].g = malloc(t[k].count * sizeof(double));
		memcpy(t[k].g, t[k].src, t[k].count * sizeof(double));
	}
	const double h = 1e-5;
	int bad = 0;
	size_t checked = 0;
	double worst = 0, gmax = 0;
	for (int k = 0; k < nt; k++) {
		for (size_t i = 0; i < t[k].count; i++) {
			double x0 = t[k].x[i];
			t[k].x[i] = x0 + h;
			double lp = run(&n);
			t[k].x[i] = x0 - h;
			double lm = run(&n);
			t[k].x[i] = x0;
			double num = (lp - lm) / (2 * h), ana = t[k].g[i];
			double err = fabs(num - ana);
			checked++;
			gmax = fmax(gmax, fabs(ana));
			worst = fmax(worst, err / (1e-7 + 1e-5 * fabs(ana)));
			if (err > 1e-7 + 1e-5 * fabs(ana) && bad++ < 10) {
				const char *tn = "";
				for (int q = nbt - 1; t[k].block && q >= 0; q--) {
					if (i >= gpt_block_offset(d, q)) {
						tn = llama ? llama_names[q] : gpt2_names[q];
						break;
					}
				}
				fprintf(stderr,
					"FAIL %s: %s%s%s[%zu]: analytic %.12g numeric %.12g\n",
					what, t[k].name, tn[0] ? "." : "", tn, i, ana, num);
			}
		}
	}
	printf("gradcheck %s: %zu elements, largest |gradient| %.3g, worst error / tolerance "
	       "%.3g, %d over\n",
	       what, checked, gmax, worst, bad);
	for (int k = 0; k < nt; k++) {
		free(t[k].g);
	}
	for (int l = 0; l < d->L; l++) {
		free(n.blocks[l]);
		free(n.dblocks[l]);
	}
	free(n.wte), free(n.wpe), free(n.lnfw), free(n.lnfb), free(n.head);
	free(n.dwte), free(n.dwpe), free(n.dlnfw), free(n.dlnfb), free(n.dhead);
	free(n.tokens), free(n.targets), free(n.acts);
	return bad;
}

int
main(void)
{
	int bad = check("gpt2", (struct gpt_dims){.V = 7, .T = 5, .C = 8, .NH = 2, .L = 2, .B = 2});
	/* grouped-query attention (2 query heads per key-value head), heads of 4 (two rotary
	   pairs each), an MLP width that is no multiple of C, its own head; rope_theta 10 turns
	   the pairs by up to 1.3 rad over 5 positions (10000 would barely turn them) */
	bad += check("llama", (struct gpt_dims){.V = 7,
						.T = 5,
						.C = 16,
						.NH = 4,
						.L = 2,
						.B = 2,
						.arch = GPT_ARCH_LLAMA,
						.KVH = 2,
						.FF = 20,
						.untied = 1,
						.rope_theta = 10,
						.eps = 1e-6});
	/* tied head (dwte = head's + lookup's), one key-value head for all query heads */
	bad += check("llama_tied", (struct gpt_dims){.V = 7,
						     .T = 5,
						     .C = 12,
						     .NH = 3,
						     .L = 1,
						     .B = 2,
						     .arch = GPT_ARCH_LLAMA,
						     .KVH = 1,
						     .FF = 10,
						     .rope_theta = 10});
	return bad ? 1 : 0;
}
