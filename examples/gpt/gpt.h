/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt.h: what zinf_gpt's files share: the flags (gpt_args.c), and the trainer
 * (gpt_train.c): the model as zinf holds it, the trainer's device buffers, and one micro-batch
 * of forward and backward through the engine. The loop, the configuration and the output are
 * gpt.c's.
 */
#ifndef ZINF_EXAMPLE_GPT_H
#define ZINF_EXAMPLE_GPT_H

#include <stdbool.h>
#include <stdint.h>

#include <zinf/engine.h>

#include "gpt_model.h"

/* ---- flags (gpt_args.c) ------------------------------------------------------------------- */

struct gpt_args {
	const char *config, *json, *nvme_path, *scratch_parent;
	const char *save, *resume;   /* checkpoint directories (NULL: none) */
	const char *device;	     /* --device: "auto", "host" or "cuda" */
	const char *data;	     /* --data: a token file (NULL: the Markov source) */
	const char *data_dtype_name; /* --data-dtype as given (NULL: llmc) */
	int data_dtype;		     /* enum gpt_tokens_format of it */
	int save_every; /* steps between checkpoints into `save` (0: at the end only) */
	int keep;	/* checkpoints kept in `save` (0: all) */
	int steps, layers, heads, hidden, context, vocab, batch, grad_accum, fanout;
	const char *arch;	/* --arch: "gpt2" or "llama" */
	const char *from_hf;	/* --from-hf DIR: the model's shape and initial values */
	const char *shape_flag; /* the last model-shape flag given (--from-hf refuses them) */
	int kv_heads, ffn;	/* llama: --kv-heads, --ffn (0: --heads, 4 x --hidden) */
	double rope_theta;	/* llama: --rope-theta */
	bool untied;		/* llama: --untied (an lm_head of its own) */
	int steps_per_print;	/* -1: the config's */
	double lr;		/* NaN: not given */
	double comm_timeout;	/* --comm-timeout, seconds; NaN: the library's default */
	uint64_t seed;
	bool step_after_backward, no_progress, quiet;
	bool decay_all; /* --decay-all: weight decay on biases and norm weights too */
	bool vertical;	/* --vertical: a step's micro-batches in one pass (zinf_engine_vertical) */
	/* --test-kill-in-save POINT:TAG (not listed): the crash tests' request that this process
	   kill itself (SIGKILL) when a save of TAG reaches POINT (zinf_ckpt_opts.progress) */
	const char *test_kill_in_save;
};

/* The ranges of the flags that the configuration can also set (gpt_args.c; gpt.c holds the
 * configuration's values to them): micro-batch, accumulation steps, steps between lines. */
#define GPT_MAX_BATCH	   (1 << 20)
#define GPT_MAX_GRAD_ACCUM (1 << 20)
#define GPT_MAX_SPP	   (1 << 30)
/* --comm-timeout's largest, seconds (the library takes less than 1e9) */
#define GPT_MAX_COMM_TIMEOUT 1000000

/* Exit status of --device cuda where no CUDA device can be opened (tests skip on it); a bad
 * flag, or --device cuda in a build without the CUDA layers, exits 2. */
#define GPT_EXIT_NO_GPU 3

/* Parse argv (--help prints and exits 0). 0, or -1 after a message on stderr. */
int gpt_args_parse(int argc, char **argv, struct gpt_args *a);
/* ZINF_LOG_LEVEL (error, warn, info, debug or 0-3) into the library. 0, or -1 after a message. */
int gpt_log_level_from_env(void);

/* ---- Hugging Face checkpoints (gpt_hf.c) ------------------------------------------------ */

struct gpt_hf;
struct gpt_model;
/*
 * Open a Hugging Face model directory (config.json and safetensors weights, one file or shards
 * with their index): the model's shape into *d (every field but T and B, which are the
 * caller's and set before the call: T at most the model's positions). What the layers cannot
 * compute is refused naming config.json's key. 0, or -1 after a message on stderr.
 */
int gpt_hf_open(const char *dir, struct gpt_dims *d, struct gpt_hf **out);
/*
 * After gpt_register (with m->init = gpt_hf_init, m->init_ctx = h), before zinf_engine_init:
 * every registered tensor found in the checkpoint under its name (GPT-2's also without
 * "transformer.", as GPT2Model saves them), of its shape (GPT-2's Conv1D weights transposed)
 * and a readable dtype, nothing else in it but known buffers (GPT-2's attention masks, rotary
 * frequencies, a tied model's lm_head). 0, or -1 after a message naming the tensor and the
 * file.
 */
int gpt_hf_bind(struct gpt_hf *h, struct gpt_model *m);
/* The engine's init callback (ctx: the gpt_hf): the range converted to f32 from the file. */
int gpt_hf_init(void *ctx, uint32_t param, uint64_t first, uint64_t count, float *out);
void gpt_hf_close(struct gpt_hf *h);
/*
 * The model's Hugging Face config.json into dir (--save's directory), for `zinf checkpoint
 * export --hf`: with from_hf (--from-hf's directory) its config.json byte for byte, else one
 * made from d (GPT2Config or LlamaConfig: the fields the layers compute with, "dtype" the
 * engine's; a GPT-2's n_positions is its wpe rows). Written as .config.json.tmp<pid>, fsynced,
 * renamed, the directory fsynced. 0, or a positive errno (nothing printed).
 */
int gpt_hf_save_config(const char *dir, const struct gpt_dims *d, enum zinf_dtype dtype,
		       const char *from_hf);

/* ---- the trainer (gpt_train.c) ------------------------------------------------------------- */

/* No such tensor in this architecture (GPT-2's wpe and lnf bias, Llama's untied lm_head). */
#define GPT_NO_TENSOR UINT32_MAX

/* A registered tensor: its Hugging Face name and its shape here ([rows, cols]; 1-D: rows 0). */
struct gpt_tensor {
	char name[96];
	size_t rows, cols;
	int layer;
	bool no_decay; /* no weight decay (a bias or a norm's weight: the 1-D tensors) */
};

/* The model as the engine holds it: every tensor's id, named as Hugging Face names it. */
struct gpt_model {
	struct gpt_dims d;
	uint32_t wte, wpe, lnfw, lnfb, head; /* head: lm_head (untied), else GPT_NO_TENSOR */
	uint32_t block0; /* block l tensor t: block0 + l * gpt_block_tensors(&d) + t */
	uint64_t seed, n_params;
	struct gpt_tensor *tensors; /* by id (gpt_model_layout; freed by gpt_model_free) */
	uint32_t n_tensors;
	/* the optimizer's weight decay skips biases and norm weights (ZINF_PARAM_NO_DECAY, as
	   Hugging Face's Trainer groups them): their elements and tensors */
	uint64_t n_no_decay;
	uint32_t t_no_decay;
	bool decay_all; /* set before the layout: every tensor decays (--decay-all) */
	/* where the initial values come from: NULL, the seeded initialisation; else this
	   callback (a Hugging Face checkpoint: gpt_hf_init) */
	zinf_param_init_fn init;
	void *init_ctx;
};

/* The trainer's buffers: device memory of the engine's device unless named host_. */
struct gpt_bufs {
	struct gpt_acts acts;
	gpt_real *acts_base;
	int *tokens, *targets;	      /* [N] */
	int *host_io;		      /* [2N] tokens then targets (registered host memory) */
	gpt_real *host_losses;	      /* [N] per-position losses (registered host memory) */
	gpt_real *dblock[2];	      /* two block gradients, alternated */
	gpt_real *dwte, *dwpe, *dlnf; /* dlnf: [2C] weight then bias */
	gpt_real *dhead;	      /* [V, C] an untied head's */
	gpt_real *f32_embed, *f32_block, *f32_lnf; /* bf16 engines: f32 copies (lnf: then head) */
	void *grad16; /* fp16 engines: one gradient as f16 (the largest tensor's numel) */
};

/* Seconds spent, this rank, since the start. */
struct gpt_timers {
	double compute; /* the layers */
	double fetch;	/* zinf_engine_fetch and compute stream synchronisations */
	double grad;	/* zinf_engine_grad */
	double step;	/* zinf_engine_step */
	double data;	/* making the batch */
};

/* Micro-batch k >= 1's own buffers in a vertical pass (micro-batch 0 uses gpt_bufs'): its
 * activations (every layer's, kept from its forward to its backward), tokens and targets, losses
 * and, with a tied head, the embedding's gradient (the head's part waits for the lookup's). */
struct gpt_mbuf {
	struct gpt_acts acts;
	gpt_real *acts_base;
	int *tokens, *targets; /* [N] */
	gpt_real *host_losses; /* [N] (registered host memory) */
	gpt_real *dwte;	       /* [V, C] tied head only, else NULL (gpt_bufs' dwte serves) */
};

struct gpt_trainer {
	struct zinf_engine *e;
	struct zinf_device *dev;
	struct zinf_stream *cs; /* the compute stream */
	enum zinf_dtype dtype;	/* the engine's parameters */
	const struct gpt_ops *ops;
	void *ops_ctx;	  /* ops->open's state (NULL on the CPU): becomes b.acts.ctx */
	bool host_layers; /* ops run on the host thread (they read device memory after a sync) */
	struct gpt_model m;
	struct gpt_bufs b;
	struct gpt_timers tm;
	int rank, world, gas;
	int vertical;	      /* micro-batches per pass (zinf_engine_vertical); 0 or 1: one */
	struct gpt_mbuf *vmb; /* vertical - 1 of them: micro-batches 1 .. vertical - 1 */
};

/* The model's tensors (gpt_layout.c): m->tensors and the ids from m->d, in the order the
 * engine numbers them; 0 or -ENOMEM after a message. gpt_model_free frees the table. */
int gpt_model_layout(struct gpt_model *m);
void gpt_model_free(struct gpt_model *m);
/* Register every tensor of t->m (dims and seed set, init when not the seeded values) with t->e
 * (gpt_model_layout first); 0 or a negative errno. */
int gpt_register(struct gpt_trainer *t);
/* Block l's tensor t's name, Hugging Face's ("transformer.h.0.ln_1.weight",
 * "model.layers.0.input_layernorm.weight"); snprintf's return. */
int gpt_tensor_name(const struct gpt_dims *d, int l, int t, char *buf, size_t size);
/* Allocate / free t->b (after zinf_engine_init). */
int gpt_bufs_alloc(struct gpt_trainer *t);
void gpt_bufs_free(struct gpt_trainer *t);
/*
 * One micro-batch on t->b.tokens / t->b.targets (copied in on the compute stream): forward and
 * backward, each layer fetched and released around its use, each gradient handed to the engine;
 * not zinf_engine_step(). Returns 0 and the sum of the per-position losses in *loss_sum.
 */
int gpt_micro_batch(struct gpt_trainer *t, double *loss_sum);
/*
 * A vertical pass of n micro-batches (n <= t->vertical, after zinf_engine_vertical(n)): micro-batch
 * k's tokens and targets in gpt_mb_tokens(t, k); each layer fetched once forward and once backward,
 * every micro-batch computed through it while it is fetched, each parameter's gradients handed in
 * micro-batch order; not zinf_engine_step(). n = 1 is gpt_micro_batch. Returns 0 and the sum of
 * the n micro-batches' per-position losses in *loss_sum.
 */
int gpt_pass(struct gpt_trainer *t, int n, double *loss_sum);
/* Micro-batch k's device buffers for its tokens and targets (k = 0: t->b's). */
void gpt_mb_tokens(struct gpt_trainer *t, int k, int **tokens, int **targets);

#endif
