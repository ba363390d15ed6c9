/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bench/gpt_layers.c: one forward and backward of the example trainer's CPU layers
 * (examples/gpt/gpt_cpu.c through gpt_cpu_ops, in the order gpt_train.c calls them: encoder,
 * blocks, head forward and backward, blocks backward, encoder backward), timed, without zinf:
 * parameters, gradients and activations are plain allocations here. What bench/gpt_layers.py
 * does in PyTorch for the same model, shapes and threads; bench/gpt_layers.sh runs both in
 * interleaved rounds.
 *
 *   bench_gpt_layers [--arch gpt2|llama] [--layers L] [--heads H] [--hidden C] [--context T]
 *                    [--vocab V] [--batch B] [--kv-heads KVH] [--ffn FF] [--rope-theta THETA]
 *                    [--reps R] [--warmup W]
 *
 * Defaults: zinf_gpt's (4 layers, 4 heads, hidden 64, context 32, vocabulary 64, batch 16).
 * --arch llama: Llama's blocks (RMSNorm, rotary embeddings, grouped-query attention of KVH
 * key-value heads, a SwiGLU MLP of FF: --kv-heads and --ffn, default the heads and 4C; --rope-theta
 * default 10000) and an untied head (lm_head), as LlamaForCausalLM with tie_word_embeddings false.
 * Threads: OMP_NUM_THREADS. Prints one JSON line: the median and every rep's seconds of a whole
 * forward and backward, the medians of its parts, the products' implementation and, for
 * OpenBLAS, its configuration and kernel.
 *
 * Built a second time, with GPT_LAYERS_BENCH_LIB, as libgpt_layers_bench.so without main():
 * gpt_layers_bench_open/step/close for bench/gpt_layers.py --c-lib, which alternates one C step
 * and one PyTorch step in one process (one libgomp, one OpenBLAS), so that a machine whose load
 * changes from second to second slows both alike.
 */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gpt_matmul.h"
#include "gpt_model.h"

/* OpenBLAS's own, when the products are OpenBLAS's (weak: any other CBLAS, or none) */
extern char *openblas_get_config(void) __attribute__((weak));
extern char *openblas_get_corename(void) __attribute__((weak));

static double
now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng = 0x2545f4914f6cdd1dull;

static double
urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) * 0x1.0p-53;
}

/* n values of N(0, std) (Box-Muller), or all `value` when std is 0 */
static float *
tensor(size_t n, double std, float value)
{
	float *p = malloc(n * sizeof(float));
	for (size_t i = 0; p && i < n; i++) {
		p[i] = std > 0 ? (float)(std * sqrt(-2 * log(1 - urand())) *
					 cos(6.283185307179586 * urand()))
			       : value;
	}
	return p;
}

/* The model, its parameters, gradients and activations (plain allocations). */
struct gpt_layers_bench {
	struct gpt_dims d;
	size_t bs; /* elements of one block */
	float *wte, *wpe, *lnfw, *lnfb, *dwte, *dwpe, *dlnfw, *dlnfb, *blocks, *dblocks, *acts;
	float *head, *dhead; /* llama: the untied head (lm_head) and its gradient */
	int *tokens, *targets;
	struct gpt_acts a;
	float loss; /* of the last step */
};

void
gpt_layers_bench_close(struct gpt_layers_bench *b)
{
	if (!b) {
		return;
	}
	float *f[] = {b->wte,	b->wpe,	   b->lnfw,    b->lnfb, b->dwte, b->dwpe, b->dlnfw,
		      b->dlnfb, b->blocks, b->dblocks, b->acts, b->head, b->dhead};
	for (size_t i = 0; i < sizeof(f) / sizeof(f[0]); i++) {
		free(f[i]);
	}
	free(b->tokens), free(b->targets), free(b);
}

/* GPT-2's initialisation (N(0, 0.02), LayerNorm weights 1, biases 0), or Llama's (N(0, 0.02),
   RMSNorm weights 1), random tokens and targets. *d's fields past B as struct gpt_dims' (0: the
   default). NULL when out of memory. */
static struct gpt_layers_bench *
bench_open(const struct gpt_dims *dims)
{
	struct gpt_layers_bench *b = calloc(1, sizeof(*b));
	if (!b) {
		return NULL;
	}
	struct gpt_dims *d = &b->d;
	*d = *dims;
	int llama = d->arch == GPT_ARCH_LLAMA, V = d->V, T = d->T;
	size_t N = (size_t)d->B * T, c = (size_t)d->C, bs = b->bs = gpt_block_size(d);
	b->wte = tensor((size_t)V * c, 0.02, 0), b->dwte = tensor((size_t)V * c, 0, 0);
	b->lnfw = tensor(c, 0, 1), b->dlnfw = tensor(c, 0, 0);
	if (llama) {
		b->head = tensor((size_t)V * c, 0.02, 0), b->dhead = tensor((size_t)V * c, 0, 0);
	} else {
		b->wpe = tensor((size_t)T * c, 0.02, 0), b->dwpe = tensor((size_t)T * c, 0, 0);
		b->lnfb = tensor(c, 0, 0), b->dlnfb = tensor(c, 0, 0);
	}
	b->blocks = tensor((size_t)d->L * bs, 0.02, 0), b->dblocks = tensor(bs, 0, 0);
	b->acts = tensor(gpt_acts_numel(d), 0, 0);
	b->tokens = malloc(N * sizeof(int)), b->targets = malloc(N * sizeof(int));
	if (!b->wte || !b->lnfw || !b->dwte || !b->dlnfw || !b->blocks || !b->dblocks || !b->acts ||
	    !b->tokens || !b->targets || (llama && (!b->head || !b->dhead)) ||
	    (!llama && (!b->wpe || !b->lnfb || !b->dwpe || !b->dlnfb))) {
		gpt_layers_bench_close(b);
		return NULL;
	}
	static const int gpt2_ones[] = {GPT_LN1W, GPT_LN2W},
			 gpt2_zeros[] = {GPT_LN1B, GPT_QKVB, GPT_ATTPROJB,
					 GPT_LN2B, GPT_FCB,  GPT_FCPROJB},
			 llama_ones[] = {LLAMA_ATTN_NORM, LLAMA_MLP_NORM};
	const int *ones = llama ? llama_ones : gpt2_ones, nzeros = llama ? 0 : 6;
	for (int l = 0; l < d->L; l++) {
		float *w = b->blocks + (size_t)l * bs;
		for (int k = 0; k < 2; k++) {
			for (size_t i = 0; i < c; i++) {
				w[gpt_block_offset(d, ones[k]) + i] = 1;
			}
		}
		for (int k = 0; k < nzeros; k++) {
			memset(w + gpt_block_offset(d, gpt2_zeros[k]), 0,
			       gpt_block_numel(d, gpt2_zeros[k]) * sizeof(float));
		}
	}
	for (size_t i = 0; i < N; i++) {
		b->tokens[i] = (int)(urand() * V);
		b->targets[i] = (int)(urand() * V);
	}
	gpt_acts_carve(d, b->acts, &b->a);
	return b;
}

/* A GPT-2 (bench/gpt_layers.py --c-lib's call before --arch) */
struct gpt_layers_bench *
gpt_layers_bench_open(int L, int NH, int C, int T, int V, int B)
{
	return bench_open(&(struct gpt_dims){.V = V, .T = T, .C = C, .NH = NH, .L = L, .B = B});
}

/* arch 0 GPT-2, 1 Llama (kvh, ff and theta: 0 for the defaults; untied head) */
struct gpt_layers_bench *
gpt_layers_bench_open_arch(int arch, int L, int NH, int C, int T, int V, int B, int kvh, int ff,
			   double theta)
{
	return bench_open(&(struct gpt_dims){.V = V,
					     .T = T,
					     .C = C,
					     .NH = NH,
					     .L = L,
					     .B = B,
					     .arch = arch,
					     .KVH = kvh,
					     .FF = ff,
					     .untied = arch == GPT_ARCH_LLAMA,
					     .rope_theta = theta});
}

/* One forward and backward in gpt_train.c's order; returns its seconds, and its parts' in
   part[3] (encoder and blocks forward, the head forward and backward, the blocks and encoder
   backward) when part is not NULL. */
double
gpt_layers_bench_step(struct gpt_layers_bench *b, double *part)
{
	const struct gpt_ops *o = &gpt_cpu_ops;
	const struct gpt_dims *d = &b->d;
	size_t N = (size_t)d->B * d->T;
	const float *p[GPT_MAX_BLOCK_TENSORS];
	float *g[GPT_MAX_BLOCK_TENSORS];
	int nt = gpt_block_tensors(d);
	double t0 = now();
	int llama = d->arch == GPT_ARCH_LLAMA;
	o->encoder_forward(d, &b->a, b->tokens, b->wte, b->wpe);
	for (int l = 0; l < d->L; l++) {
		for (int k = 0; k < nt; k++) {
			p[k] = b->blocks + (size_t)l * b->bs + gpt_block_offset(d, k);
		}
		o->block_forward(d, &b->a, l, p);
	}
	double t1 = now();
	o->head_forward_backward(d, &b->a, b->targets, llama ? b->head : b->wte, b->lnfw, b->lnfb,
				 1.0f / (float)N, llama ? b->dhead : b->dwte, b->dlnfw, b->dlnfb);
	double t2 = now();
	for (int l = d->L - 1; l >= 0; l--) {
		for (int k = 0; k < nt; k++) {
			p[k] = b->blocks + (size_t)l * b->bs + gpt_block_offset(d, k);
			g[k] = b->dblocks + gpt_block_offset(d, k); /* the trainer hands them on */
		}
		o->block_backward(d, &b->a, l, p, g);
	}
	o->encoder_backward(d, &b->a, b->tokens, b->dwte, b->dwpe);
	double t3 = now();
	if (part) {
		part[0] = t1 - t0, part[1] = t2 - t1, part[2] = t3 - t2;
	}
	b->loss = 0;
	for (size_t i = 0; i < N; i++) {
		b->loss += b->a.losses[i];
	}
	b->loss /= (float)N;
	return t3 - t0;
}

/* the products' implementation and OpenBLAS's configuration and kernel ("" for another CBLAS) */
const char *
gpt_layers_bench_products(void)
{
	return gpt_matmul_impl;
}

const char *
gpt_layers_bench_blas(void)
{
	return openblas_get_config ? openblas_get_config() : "";
}

const char *
gpt_layers_bench_core(void)
{
	return openblas_get_corename ? openblas_get_corename() : "";
}

#ifndef GPT_LAYERS_BENCH_LIB

static int
cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

static double
median(double *v, int n)
{
	double *s = malloc((size_t)n * sizeof(double));
	memcpy(s, v, (size_t)n * sizeof(double));
	qsort(s, (size_t)n, sizeof(double), cmp);
	double m = n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
	free(s);
	return m;
}

/* the model's parameters: the blocks, the embedding, the final norm, and wpe and the final
   LayerNorm's bias (GPT-2) or the untied head (Llama) */
static size_t
params(const struct gpt_dims *d, size_t bs)
{
	size_t C = (size_t)d->C, V = (size_t)d->V;
	return (size_t)d->L * bs + V * C + C +
	       (d->arch == GPT_ARCH_LLAMA ? V * C : ((size_t)d->T + 1) * C);
}

static int
arg(int argc, char **argv, int *i, const char *name, int *v)
{
	int min = strcmp(name, "--warmup") ? 1 : 0;
	if (strcmp(argv[*i], name)) {
		return 0;
	}
	if (*i + 1 >= argc || (*v = atoi(argv[*i + 1])) < min) {
		fprintf(stderr, "bench_gpt_layers: %s needs an integer >= %d\n", name, min);
		exit(2);
	}
	++*i;
	return 1;
}

int
main(int argc, char **argv)
{
	struct gpt_dims d = {.V = 64, .T = 32, .C = 64, .NH = 4, .L = 4, .B = 16};
	int reps = 10, warmup = 2;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--arch") && i + 1 < argc &&
		    (!strcmp(argv[i + 1], "gpt2") || !strcmp(argv[i + 1], "llama"))) {
			d.arch = strcmp(argv[++i], "llama") ? GPT_ARCH_GPT2 : GPT_ARCH_LLAMA;
			d.untied = d.arch == GPT_ARCH_LLAMA;
		} else if (!strcmp(argv[i], "--rope-theta") && i + 1 < argc &&
			   atof(argv[i + 1]) > 0) {
			d.rope_theta = atof(argv[++i]);
		} else if (!(arg(argc, argv, &i, "--layers", &d.L) ||
			     arg(argc, argv, &i, "--heads", &d.NH) ||
			     arg(argc, argv, &i, "--hidden", &d.C) ||
			     arg(argc, argv, &i, "--context", &d.T) ||
			     arg(argc, argv, &i, "--vocab", &d.V) ||
			     arg(argc, argv, &i, "--batch", &d.B) ||
			     arg(argc, argv, &i, "--kv-heads", &d.KVH) ||
			     arg(argc, argv, &i, "--ffn", &d.FF) ||
			     arg(argc, argv, &i, "--reps", &reps) ||
			     arg(argc, argv, &i, "--warmup", &warmup))) {
			fprintf(stderr,
				"usage: bench_gpt_layers [--arch gpt2|llama] [--layers L] "
				"[--heads H] [--hidden C] [--context T] [--vocab V] [--batch B] "
				"[--kv-heads KVH] [--ffn FF] [--rope-theta THETA] [--reps R] "
				"[--warmup W]\n");
			return 2;
		}
	}
	if (d.C % d.NH || d.NH % gpt_kvh(&d) || (d.arch == GPT_ARCH_LLAMA && (d.C / d.NH) % 2)) {
		fprintf(stderr,
			"bench_gpt_layers: the heads (%d) must divide the hidden size (%d) (Llama: "
			"into heads of an even size), and the key-value heads (%d) the heads\n",
			d.NH, d.C, gpt_kvh(&d));
		return 2;
	}
	if (d.arch != GPT_ARCH_LLAMA && (d.KVH || d.FF || d.rope_theta > 0)) {
		fprintf(stderr,
			"bench_gpt_layers: --kv-heads, --ffn and --rope-theta are Llama's\n");
		return 2;
	}
	struct gpt_layers_bench *b = bench_open(&d);
	int n = warmup + reps;
	double *all = malloc((size_t)n * sizeof(double)), *fwd = malloc((size_t)n * sizeof(double)),
	       *head = malloc((size_t)n * sizeof(double)),
	       *bwd = malloc((size_t)n * sizeof(double));
	if (!b || !all || !fwd || !head || !bwd) {
		fprintf(stderr, "bench_gpt_layers: out of memory\n");
		return 1;
	}
	for (int r = 0; r < n; r++) {
		double part[3];
		all[r] = gpt_layers_bench_step(b, part);
		fwd[r] = part[0], head[r] = part[1], bwd[r] = part[2];
	}
	printf("{\"bench\": \"gpt_layers\", \"impl\": \"c\", \"products\": \"%s\", \"blas\": "
	       "\"%s\", \"core\": \"%s\", \"threads\": %d, \"arch\": \"%s\", \"layers\": %d, "
	       "\"heads\": %d, \"kv_heads\": %d, \"ffn\": %d, \"hidden\": %d, \"context\": %d, "
	       "\"vocab\": %d, \"batch\": %d, \"params\": %zu, "
	       "\"loss\": %.6f, \"reps\": %d, \"median_s\": %.6f, \"forward_s\": %.6f, "
	       "\"head_s\": %.6f, \"backward_s\": %.6f, \"all_s\": [",
	       gpt_matmul_impl, gpt_layers_bench_blas(), gpt_layers_bench_core(),
	       omp_get_max_threads(), d.arch == GPT_ARCH_LLAMA ? "llama" : "gpt2", d.L, d.NH,
	       gpt_kvh(&d), gpt_ff(&d), d.C, d.T, d.V, d.B, params(&d, b->bs), (double)b->loss,
	       reps, median(all + warmup, reps), median(fwd + warmup, reps),
	       median(head + warmup, reps), median(bwd + warmup, reps));
	for (int r = warmup; r < n; r++) {
		printf("%s%.6f", r > warmup ? ", " : "", all[r]);
	}
	printf("]}\n");
	free(all), free(fwd), free(head), free(bwd);
	gpt_layers_bench_close(b);
	return 0;
}

#endif
