/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt_model.h: the models' shapes and their layer operations. Two architectures,
 * as Hugging Face's transformers defines them:
 * - GPT-2 (llm.c's structure, GPT2LMHeadModel): token + position embeddings, pre-LayerNorm
 *   blocks of causal multi-head attention and a tanh-GELU MLP of 4C, a final LayerNorm, the
 *   output head tied to the token embedding;
 * - Llama (LlamaForCausalLM): token embedding, pre-RMSNorm blocks of causal grouped-query
 *   attention (KVH key-value heads shared by NH / KVH query heads each) with rotary position
 *   embeddings (rope_theta, transformers' rotate-half pairing) and a SwiGLU MLP of FF
 *   (down(silu(gate(x)) * up(x))), a final RMSNorm, the head tied to the embedding or its own
 *   lm_head; no biases.
 * Both end in the mean cross-entropy of the next token.
 *
 * The trainer (gpt.c) holds no model: zinf does. It fetches one layer at a time, passes the
 * layer's tensors (zinf_engine_param pointers, or f32 copies when the engine keeps bf16) and
 * its gradient buffers to one operation of struct gpt_ops per layer. Every pointer
 * an operation gets is device memory of the engine's device (zinf_engine_device()): the CPU
 * backend (gpt_cpu.c and llama_cpu.c, OpenMP) runs on the "host" device, whose memory is host
 * memory; the GPU backend (gpt_cuda.cu, built with CUDA: cuBLAS for the matrix products,
 * kernels for the rest) on the "cuda" device, queued on the trainer's compute stream. The
 * trainer is the same for both.
 *
 * gpt_real is float for the trainer; the gradient check (tests/gpt/test_gpt_gradcheck.c)
 * compiles the same CPU backend with GPT_REAL=double.
 */
#ifndef ZINF_EXAMPLE_GPT_MODEL_H
#define ZINF_EXAMPLE_GPT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#ifndef GPT_REAL
#define GPT_REAL float
#endif
typedef GPT_REAL gpt_real;

enum gpt_arch {
	GPT_ARCH_GPT2 = 0,
	GPT_ARCH_LLAMA = 1,
};

/* A zero field past B takes its default, so {.V, .T, .C, .NH, .L, .B} is a GPT-2. */
struct gpt_dims {
	int V;		   /* vocabulary */
	int T;		   /* context (sequence length) */
	int C;		   /* hidden size */
	int NH;		   /* attention heads; C % NH == 0 */
	int L;		   /* transformer blocks */
	int B;		   /* sequences per micro-batch */
	int arch;	   /* enum gpt_arch */
	int KVH;	   /* llama: key-value heads, NH % KVH == 0 (0: NH) */
	int FF;		   /* llama: the MLP's hidden size, intermediate_size (0: 4C) */
	int untied;	   /* llama: the head is its own tensor (lm_head), not the embedding */
	double rope_theta; /* llama: rotary base (0: 10000) */
	double eps;	   /* the norms' epsilon (0: 1e-5) */
	int P;		   /* GPT-2: rows of wpe, the positions it holds, >= T (0: T) */
};

/* The defaults applied: key-value heads, the MLP's width, each head's size, the key-value
 * width (KVH x head size), rotary base, the norms' epsilon. */
static inline int
gpt_kvh(const struct gpt_dims *d)
{
	return d->arch == GPT_ARCH_LLAMA && d->KVH ? d->KVH : d->NH;
}
static inline int
gpt_ff(const struct gpt_dims *d)
{
	return d->arch == GPT_ARCH_LLAMA && d->FF ? d->FF : 4 * d->C;
}
static inline int
gpt_hs(const struct gpt_dims *d)
{
	return d->C / d->NH;
}
static inline int
gpt_kvd(const struct gpt_dims *d)
{
	return gpt_kvh(d) * gpt_hs(d);
}
static inline double
gpt_rope_theta(const struct gpt_dims *d)
{
	return d->rope_theta > 0 ? d->rope_theta : 10000.0;
}
static inline double
gpt_eps(const struct gpt_dims *d)
{
	return d->eps > 0 ? d->eps : 1e-5;
}
static inline int
gpt_positions(const struct gpt_dims *d)
{
	return d->P > d->T ? d->P : d->T;
}
static inline int
gpt_tied(const struct gpt_dims *d)
{
	return d->arch != GPT_ARCH_LLAMA || !d->untied;
}

/* Tensors of one block, in their order inside the block's layer (and their zinf ids). */
enum gpt_block_tensor {
	GPT_LN1W,
	GPT_LN1B,
	GPT_QKVW,
	GPT_QKVB,
	GPT_ATTPROJW,
	GPT_ATTPROJB,
	GPT_LN2W,
	GPT_LN2B,
	GPT_FCW,
	GPT_FCB,
	GPT_FCPROJW,
	GPT_FCPROJB,
	GPT_BLOCK_TENSORS
};

/* Llama's block: no biases; q [C, C], k and v [KVD, C], o [C, C], gate and up [FF, C], down
 * [C, FF] (rows are output features, as nn.Linear stores them). */
enum llama_block_tensor {
	LLAMA_ATTN_NORM,
	LLAMA_Q,
	LLAMA_K,
	LLAMA_V,
	LLAMA_O,
	LLAMA_MLP_NORM,
	LLAMA_GATE,
	LLAMA_UP,
	LLAMA_DOWN,
	LLAMA_BLOCK_TENSORS
};

#define GPT_MAX_BLOCK_TENSORS GPT_BLOCK_TENSORS /* the most of either architecture */

/* zinf layers: 0 the embeddings (wte, wpe), 1..L the blocks, L + 1 the final LayerNorm. */
#define GPT_LAYER_EMBED	      0
#define GPT_LAYER_BLOCK(d, l) (1 + (l))
#define GPT_LAYER_LNF(d)      ((d)->L + 1)

/* Tensors of a block (GPT_BLOCK_TENSORS or LLAMA_BLOCK_TENSORS); each one's elements, its
 * shape as [rows, columns] (1-D: rows 0) and its offset in a contiguous copy of the block. */
int gpt_block_tensors(const struct gpt_dims *d);
size_t gpt_block_numel(const struct gpt_dims *d, int tensor);
void gpt_block_shape(const struct gpt_dims *d, int tensor, size_t *rows, size_t *cols);
size_t gpt_block_offset(const struct gpt_dims *d, int tensor);
size_t gpt_block_size(const struct gpt_dims *d); /* all of a block's elements */

/* The activations of one micro-batch (N = B x T positions), device memory. */
struct gpt_acts {
	gpt_real *encoded; /* [N, C] */
	/* per block l, each [L][...] */
	gpt_real *ln1, *ln1_mean, *ln1_rstd; /* [L][N, C], [L][N], [L][N] (llama: no mean) */
	gpt_real *qkv;			     /* [L][N, 3C] (GPT-2) */
	gpt_real *q, *k, *v;		     /* llama: [L][N, C], [L][N, KVD] x 2, rotated */
	gpt_real *atty;			     /* [L][N, C] */
	gpt_real *att;			     /* [L][B, NH, T, T] softmax */
	gpt_real *res2;			     /* [L][N, C] x + attention */
	gpt_real *ln2, *ln2_mean, *ln2_rstd; /* [L][N, C], [L][N], [L][N] */
	gpt_real *fch, *fch_gelu;	     /* [L][N, FF]: fc, gelu (llama: gate, up) */
	gpt_real *mlp;			     /* llama: [L][N, FF] silu(gate) * up */
	gpt_real *res3;			     /* [L][N, C] block output */
	gpt_real *lnf, *lnf_mean, *lnf_rstd; /* [N, C], [N], [N] */
	gpt_real *probs;		     /* [N, V] softmax, then the logits' gradient */
	gpt_real *losses;		     /* [N] */
	/* backward scratch */
	gpt_real *dres;	   /* [N, C] the gradient flowing down the residual stream */
	gpt_real *dres_b;  /* [N, C] */
	gpt_real *dbig;	   /* [N, FF] */
	gpt_real *dbig2;   /* [N, FF] */
	gpt_real *datt;	   /* [B, NH, T, T] */
	gpt_real *dpreatt; /* [B, NH, T, T] */
	gpt_real *dsmall;  /* [N, C] */
	gpt_real *dsmall2; /* [N, C] */
	gpt_real *dsmall3; /* llama: [N, C] */
	gpt_real *dbig3;   /* llama: [N, FF] */
	gpt_real *dq;	   /* llama: [N, C] */
	gpt_real *dk, *dv; /* llama: [N, KVD] */
	void *ctx;	   /* the backend's state (gpt_ops.open); NULL on the CPU */
};

/* Element count of the whole gpt_acts (one allocation carved by gpt_acts_carve). */
size_t gpt_acts_numel(const struct gpt_dims *d);
void gpt_acts_carve(const struct gpt_dims *d, gpt_real *base, struct gpt_acts *a);

/*
 * The operations, per layer. A block's parameters and gradients are gpt_block_tensors(d)
 * pointers (each tensor its own zinf buffer; gpt_block_numel elements each); `tokens` and
 * `targets` are [N] ints (device memory).
 * - encoder_forward: a->encoded = wte[tokens] + wpe[t] (wpe NULL for llama: none);
 * - block_forward: block l on x (a->encoded for l = 0, else block l-1's res3);
 * - head_forward_backward: the final norm of the last block's output (GPT-2 LayerNorm lnfw,
 *   lnfb; llama RMSNorm lnfw, lnfb and dlnfb NULL), logits = lnf @ head^T (head: wte, or
 *   llama's lm_head when untied), per-position loss into a->losses; then backward: dhead = (=)
 *   dlogits^T lnf, dlnfw, dlnfb (=), a->dres = d(last block output); dloss is the loss gradient
 *   of every position (1 / positions averaged);
 * - block_backward: from a->dres (d of block l's output) to a->dres (d of its input) and the
 *   block's parameter gradients (=);
 * - encoder_backward: dwte += scatter of a->dres where the head is tied (it set dwte), = where
 *   not; dwpe rows 0..T-1 = (=) its sum over the batch (GPT-2; NULL for llama; rows T..P-1,
 *   positions the context does not reach, are not written: the trainer zeroes them once).
 */
struct gpt_ops {
	const char *name;
	const char *device; /* the zinf device backend whose memory the operations take */
	/* Optional (NULL on the CPU), before the engine: the backend's state on device index
	   `device` into *ctx (for gpt_acts.ctx) and the native stream it queues on, for
	   zinf_engine_opts.compute_stream; 0 or a negative errno after a message on stderr.
	   close (after the engine is destroyed) frees both; status is 0 or the first error
	   of queueing work (a launch, a cuBLAS call), said on stderr when it happened. */
	int (*open)(int device, void **ctx, void **native_stream);
	void (*close)(void *ctx);
	int (*status)(void *ctx);
	void (*encoder_forward)(const struct gpt_dims *d, struct gpt_acts *a, const int *tokens,
				const gpt_real *wte, const gpt_real *wpe);
	void (*block_forward)(const struct gpt_dims *d, struct gpt_acts *a, int l,
			      const gpt_real *const *params);
	void (*head_forward_backward)(const struct gpt_dims *d, struct gpt_acts *a,
				      const int *targets, const gpt_real *head,
				      const gpt_real *lnfw, const gpt_real *lnfb, gpt_real dloss,
				      gpt_real *dhead, gpt_real *dlnfw, gpt_real *dlnfb);
	void (*block_backward)(const struct gpt_dims *d, struct gpt_acts *a, int l,
			       const gpt_real *const *params, gpt_real *const *grads);
	void (*encoder_backward)(const struct gpt_dims *d, struct gpt_acts *a, const int *tokens,
				 gpt_real *dwte, gpt_real *dwpe);
};

#ifdef __cplusplus
extern "C" {
#endif
extern const struct gpt_ops gpt_cpu_ops;
#ifdef GPT_HAVE_CUDA
extern const struct gpt_ops gpt_cuda_ops; /* gpt_cuda.cu */
#endif
#ifdef __cplusplus
}
#endif

#endif
