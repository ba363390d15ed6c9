/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/gpt/test_gpt_cuda_emu.c: the GPU layers (examples/gpt/gpt_cuda.cu) against the CPU
 * layers (gpt_cpu.c, llama_cpu.c), both fp32, on a machine without a GPU: gpt_cuda.cu is
 * compiled as C++ against tests/gpt/cuda_emu/ (its kernels run as coroutines on the CPU with real
 * barriers and warp shuffles, its cuBLAS calls as the column-major sgemm of their definition).
 * What this checks: every kernel's indexing, which thread writes what, the reductions, the
 * causal mask, the transposes of the sgemm calls, and that each gradient is set or accumulated
 * as the CPU sets or accumulates it (every gradient and activation buffer starts as NaN, so a
 * kernel that adds to a buffer it should set, or leaves an element unwritten, gives a NaN). Not
 * checked: anything about real GPUs (memory ordering, launch limits, cuBLAS itself, speed):
 * tests/gpt/check_gpt.sh's case cuda (label gpu) runs the trainer on one.
 *
 * GPT-2, three shapes: a block of 128 threads meets rows longer than itself (V = 200; T = 130
 * and C = 160 in the second) and shorter (C = 24, hs = 8); the third has a context past 1024
 * threads (T = 1025), C = 20 and V = 300.
 * Llama, four shapes: grouped-query attention (6 query heads over 2 key-value heads, B = 3, two
 * blocks, MLP 100) with its own head, rope theta 10 (the pairs turn by up to 6 rad) and eps 1e-6;
 * one key-value head for 4 query heads of 40 with a tied head, MLP 37 and rows of 160 and 130;
 * as many key-value heads as query heads, every default (theta 10000, MLP 4C, eps 1e-5), B = 2;
 * and a context past 1024 (T = 1025: the attention's rows past a block's threads, positions up
 * to 1024 in the rotations) with 2 query heads over 1, MLP 50 and its own head.
 * One forward and backward of each.
 * Pass: every element of the losses, of every gradient (each block tensor, wte with the tied
 * head's part and the lookup's, or the untied head's and wte's apart, GPT-2's wpe, the final
 * norm's), of the logits' gradient, of the last block's output and (Llama) of every block's
 * rotated queries and keys within 2e-5 x the largest magnitude of that tensor on the CPU (fp32
 * in another summation order: ~1e-6 of it; an indexing error is of the order of the values), no
 * NaN; and the emulated run again with the threads of every block, and the blocks of every
 * launch, scheduled in reverse order is bit-identical (a read of another thread's or block's
 * write without a barrier, or two threads or blocks writing one element, would show). The
 * emulator also aborts on work queued on any stream but gpt_cuda_ops.open's (the default
 * stream) and on a launch past CUDA's limits. Before the first forward, the thread's last-error
 * slot holds a cudaErrorNotReady, as an event query leaves it: the layers must not take it for
 * their own launch's failure (gpt_cuda_ops.status stays 0). The shapes of T = 1025 are run in
 * forward order only (their time). Plain program (exit 0 / 1), label gpt.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_model.h"

void emu_set_reverse_c(int reverse); /* cuda_emu/gpt_cuda_emu.cpp */
void emu_leave_not_ready_c(void);

struct net {
	struct gpt_dims d;
	float *wte, *wpe, *lnfw, *lnfb, *head, *blocks; /* head: Llama's untied lm_head */
	float *dwte, *dwpe, *dlnf, *dhead, *dblocks;
	int *tokens, *targets;
	struct gpt_acts a;
	float *acts;
};

static uint64_t rng;

static float
urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (float)((double)(rng >> 11) * 0x1.0p-53);
}

static float *
alloc_nan(size_t n)
{
	float *x = malloc((n ? n : 1) * sizeof(float));
	for (size_t i = 0; i < n; i++) {
		x[i] = NAN;
	}
	return x;
}

static float *
fill(size_t n, float scale, float offset)
{
	float *x = malloc((n ? n : 1) * sizeof(float));
	for (size_t i = 0; i < n; i++) {
		x[i] = offset + scale * (2 * urand() - 1);
	}
	return x;
}

/* The parameters (same seed: the same values), tokens, targets; NaN everywhere else. */
static void
net_init(struct net *n, struct gpt_dims d, uint64_t seed)
{
	size_t C = (size_t)d.C, N = (size_t)d.B * d.T, blk = gpt_block_size(&d);
	memset(n, 0, sizeof(*n));
	n->d = d;
	rng = seed;
	n->wte = fill((size_t)d.V * C, 0.5f, 0);
	n->wpe = fill((size_t)d.T * C, 0.3f, 0);
	n->lnfw = fill(C, 0.2f, 1);
	n->lnfb = fill(C, 0.2f, 0);
	n->blocks = fill(blk * d.L, 0.3f, 0);
	/* the norms' weights about 1 */
	int llama = d.arch == GPT_ARCH_LLAMA;
	int n1 = llama ? LLAMA_ATTN_NORM : GPT_LN1W, n2 = llama ? LLAMA_MLP_NORM : GPT_LN2W;
	for (int l = 0; l < d.L; l++) {
		for (size_t i = 0; i < C; i++) {
			n->blocks[l * blk + gpt_block_offset(&d, n1) + i] += 1;
			n->blocks[l * blk + gpt_block_offset(&d, n2) + i] += 1;
		}
	}
	n->tokens = malloc(N * sizeof(int));
	n->targets = malloc(N * sizeof(int));
	for (size_t i = 0; i < N; i++) {
		n->tokens[i] = (int)(urand() * d.V) % d.V;
		n->targets[i] = (int)(urand() * d.V) % d.V;
	}
	n->head = fill((size_t)d.V * C, 0.5f, 0); /* after the rest: GPT-2's values as before */
	n->dwte = alloc_nan((size_t)d.V * C);
	n->dwpe = alloc_nan((size_t)d.T * C);
	n->dlnf = alloc_nan(2 * C);
	n->dhead = alloc_nan((size_t)d.V * C);
	n->dblocks = alloc_nan(blk * d.L);
	n->acts = alloc_nan(gpt_acts_numel(&d));
	gpt_acts_carve(&d, n->acts, &n->a);
}

static void
net_fini(struct net *n)
{
	free(n->wte), free(n->wpe), free(n->lnfw), free(n->lnfb), free(n->head), free(n->blocks);
	free(n->dwte), free(n->dwpe), free(n->dlnf), free(n->dhead), free(n->dblocks);
	free(n->tokens), free(n->targets), free(n->acts);
}

/* One micro-batch as gpt_train.c calls the operations: Llama without wpe and the final norm's
 * bias; its head the embedding (tied: the head sets dwte, the lookup adds) or its own. */
static void
run(const struct gpt_ops *o, struct net *n)
{
	const struct gpt_dims *d = &n->d;
	size_t blk = gpt_block_size(d);
	int nbt = gpt_block_tensors(d), llama = d->arch == GPT_ARCH_LLAMA, tied = gpt_tied(d);
	const float *p[GPT_MAX_BLOCK_TENSORS];
	float *g[GPT_MAX_BLOCK_TENSORS];
	o->encoder_forward(d, &n->a, n->tokens, n->wte, llama ? NULL : n->wpe);
	for (int l = 0; l < d->L; l++) {
		for (int k = 0; k < nbt; k++) {
			p[k] = n->blocks + l * blk + gpt_block_offset(d, k);
		}
		o->block_forward(d, &n->a, l, p);
	}
	o->head_forward_backward(d, &n->a, n->targets, tied ? n->wte : n->head, n->lnfw,
				 llama ? NULL : n->lnfb, 1.0f / (float)(d->B * d->T),
				 tied ? n->dwte : n->dhead, n->dlnf, llama ? NULL : n->dlnf + d->C);
	for (int l = d->L - 1; l >= 0; l--) {
		for (int k = 0; k < nbt; k++) {
			p[k] = n->blocks + l * blk + gpt_block_offset(d, k);
			g[k] = n->dblocks + l * blk + gpt_block_offset(d, k);
		}
		o->block_backward(d, &n->a, l, p, g);
	}
	o->encoder_backward(d, &n->a, n->tokens, n->dwte, llama ? NULL : n->dwpe);
}

/* The outputs compared: name, the CPU's, the GPU's, count. */
struct out {
	char name[48];
	const float *cpu, *gpu;
	size_t n;
};

static int
outputs(const struct net *c, const struct net *g, struct out *o)
{
	const struct gpt_dims *d = &c->d;
	size_t C = (size_t)d->C, N = (size_t)d->B * d->T, blk = gpt_block_size(d);
	size_t L = (size_t)d->L, KVD = (size_t)gpt_kvd(d);
	int llama = d->arch == GPT_ARCH_LLAMA;
	static const char *const nm[GPT_BLOCK_TENSORS] = {
		"ln1.w", "ln1.b", "qkv.w", "qkv.b", "proj.w",	"proj.b",
		"ln2.w", "ln2.b", "fc.w",  "fc.b",  "fcproj.w", "fcproj.b"};
	static const char *const lnm[LLAMA_BLOCK_TENSORS] = {"attn_norm", "q",	  "k",	"v",   "o",
							     "mlp_norm",  "gate", "up", "down"};
	int k = 0;
#define OUT(label, field, off, count)                                                              \
	do {                                                                                       \
		snprintf(o[k].name, sizeof(o[k].name), "%s", label);                               \
		o[k].cpu = c->field + (off);                                                       \
		o[k].gpu = g->field + (off);                                                       \
		o[k].n = (count);                                                                  \
		k++;                                                                               \
	} while (0)
	OUT("losses", a.losses, 0, N);
	OUT("dlogits", a.probs, 0, N * d->V);
	OUT("last block output", a.res3, (size_t)(d->L - 1) * N * C, N * C);
	OUT("dwte", dwte, 0, (size_t)d->V * C);
	if (llama) {
		OUT("q (rotated)", a.q, 0, L * N * C);
		OUT("k (rotated)", a.k, 0, L * N * KVD);
		if (!gpt_tied(d)) {
			OUT("dlm_head", dhead, 0, (size_t)d->V * C);
		}
		OUT("dnorm.w", dlnf, 0, C);
	} else {
		OUT("dwpe", dwpe, 0, (size_t)d->T * C);
		OUT("dlnf.w", dlnf, 0, C);
		OUT("dlnf.b", dlnf, C, C);
	}
	for (int l = 0; l < d->L; l++) {
		for (int t = 0; t < gpt_block_tensors(d); t++) {
			char label[48];
			snprintf(label, sizeof(label), "dh%d.%s", l, llama ? lnm[t] : nm[t]);
			OUT(label, dblocks, l * blk + gpt_block_offset(d, t),
			    gpt_block_numel(d, t));
		}
	}
#undef OUT
	return k;
}

/* d's forward and backward on the CPU and emulated; `reverse`: emulated again in reverse order */
static int
check(struct gpt_dims d, int reverse)
{
	const struct gpt_ops *gpu = &gpt_cuda_ops;
	struct net c, g, r;
	void *ctx = NULL, *stream = NULL;
	int bad = 0;
	net_init(&c, d, 0x9e3779b97f4a7c15ull);
	net_init(&g, d, 0x9e3779b97f4a7c15ull);
	net_init(&r, d, 0x9e3779b97f4a7c15ull);
	if (gpu->open(0, &ctx, &stream) || !stream) {
		printf("FAIL: gpt_cuda_ops.open\n");
		return 1;
	}
	g.a.ctx = ctx;
	r.a.ctx = ctx;
	run(&gpt_cpu_ops, &c);
	emu_set_reverse_c(0);
	/* a cudaErrorNotReady left on the thread by an earlier query (the engine's, NCCL's) is
	   no launch's failure: status must stay 0 */
	emu_leave_not_ready_c();
	run(gpu, &g);
	if (reverse) {
		emu_set_reverse_c(1);
		run(gpu, &r);
		emu_set_reverse_c(0);
	}
	if (gpu->status(ctx)) {
		printf("FAIL: gpt_cuda_ops.status %d\n", gpu->status(ctx));
		bad = 1;
	}
	struct out o[64], o2[64];
	int no = outputs(&c, &g, o);
	outputs(&c, reverse ? &r : &g, o2);
	double worst = 0;
	const char *worst_name = "";
	for (int k = 0; k < no; k++) {
		double mx = 0;
		for (size_t i = 0; i < o[k].n; i++) {
			mx = fmax(mx, fabs(o[k].cpu[i]));
		}
		double tol = 2e-5 * mx;
		int shown = 0;
		for (size_t i = 0; i < o[k].n; i++) {
			double e = fabs((double)o[k].gpu[i] - o[k].cpu[i]);
			if (!(e <= tol) || isnan(o[k].cpu[i])) {
				if (shown++ < 3) {
					printf("FAIL: %s[%zu]: cpu %.9g gpu %.9g (tolerance "
					       "%.3g)\n",
					       o[k].name, i, o[k].cpu[i], o[k].gpu[i], tol);
				}
				bad = 1;
			} else if (mx > 0 && e / mx > worst) {
				worst = e / mx;
				worst_name = o[k].name;
			}
			if (memcmp(&o[k].gpu[i], &o2[k].gpu[i], sizeof(float)) != 0) {
				if (shown++ < 3) {
					printf("FAIL: %s[%zu]: %.9g, in reverse thread and block "
					       "order %.9g "
					       "(a race)\n",
					       o[k].name, i, o[k].gpu[i], o2[k].gpu[i]);
				}
				bad = 1;
			}
		}
	}
	char arch[96] = "gpt2";
	if (d.arch == GPT_ARCH_LLAMA) {
		snprintf(arch, sizeof(arch), "llama KVH %d FF %d theta %g eps %g %s head",
			 gpt_kvh(&d), gpt_ff(&d), gpt_rope_theta(&d), gpt_eps(&d),
			 gpt_tied(&d) ? "tied" : "own");
	}
	printf("%s V %d T %d C %d NH %d L %d B %d: %d outputs, worst difference %.3g of the "
	       "tensor's largest magnitude (%s)%s%s\n",
	       arch, d.V, d.T, d.C, d.NH, d.L, d.B, no, worst, worst_name,
	       reverse ? "; reverse thread and block order bit-identical" : "",
	       bad ? " (FAILED)" : "");
	gpu->close(ctx);
	net_fini(&c);
	net_fini(&g);
	net_fini(&r);
	return bad;
}

int
main(void)
{
	int bad = check((struct gpt_dims){.V = 200, .T = 7, .C = 24, .NH = 3, .L = 2, .B = 3}, 1);
	bad |= check((struct gpt_dims){.V = 40, .T = 130, .C = 160, .NH = 2, .L = 1, .B = 1}, 1);
	/* a context past 1024 (the most threads of a block), C not a multiple of 32, V past
	   the 256 threads of the element-wise kernels; forward order only (the emulator's ~10 s) */
	bad |= check((struct gpt_dims){.V = 300, .T = 1025, .C = 20, .NH = 1, .L = 1, .B = 1}, 0);

	/* grouped-query (3 query heads per key-value head), its own head, B > 1, two blocks;
	   theta 10 so that the rotations turn far (pos 6 x theta^0 = 6 rad) */
	struct gpt_dims d = {.V = 200, .T = 7, .C = 48, .NH = 6, .L = 2, .B = 3};
	d.arch = GPT_ARCH_LLAMA, d.KVH = 2, d.FF = 100, d.untied = 1, d.rope_theta = 10;
	d.eps = 1e-6;
	bad |= check(d, 1);
	/* one key-value head for all 4 query heads (hs 40), tied, an MLP of 37 (a prime below a
	   block's threads), rows of C = 160 and T = 130 past the 128 threads of a block */
	d = (struct gpt_dims){.V = 40, .T = 130, .C = 160, .NH = 4, .L = 1, .B = 1};
	d.arch = GPT_ARCH_LLAMA, d.KVH = 1, d.FF = 37;
	bad |= check(d, 1);
	/* as many key-value heads as query heads, every default (theta, MLP 4C, eps), tied */
	d = (struct gpt_dims){.V = 64, .T = 9, .C = 32, .NH = 4, .L = 1, .B = 2};
	d.arch = GPT_ARCH_LLAMA;
	bad |= check(d, 1);
	/* a context past 1024: the attention's rows longer than a block, positions to 1024 in
	   the rotations; 2 query heads over 1, its own head; forward order only (its time) */
	d = (struct gpt_dims){.V = 300, .T = 1025, .C = 20, .NH = 2, .L = 1, .B = 1};
	d.arch = GPT_ARCH_LLAMA, d.KVH = 1, d.FF = 50, d.untied = 1;
	bad |= check(d, 0);
	return bad ? 1 : 0;
}
