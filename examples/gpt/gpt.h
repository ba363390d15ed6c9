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
	int steps_per_print; /* -1: the config's */
	double lr;	     /* NaN: not given */
	double comm_timeout; /* --comm-timeout, seconds; NaN: the library's default */
	uint64_t seed;
	bool step_after_backward, no_progress, quiet;
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

/* ---- the trainer (gpt_train.c) ------------------------------------------------------------- */

/* The model as the engine holds it: every tensor's id. */
struct gpt_model {
	struct gpt_dims d;
	uint32_t wte, wpe, lnfw, lnfb;
	uint32_t block0; /* block l tensor t: block0 + l * GPT_BLOCK_TENSORS + t */
	uint64_t seed, n_params;
	/* the optimizer's weight decay skips biases and norm weights (ZINF_PARAM_NO_DECAY, as
	   Hugging Face's Trainer groups them): their elements and tensors; all tensors */
	uint64_t n_no_decay;
	uint32_t t_no_decay, tensors;
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
	gpt_real *f32_embed, *f32_block, *f32_lnf; /* bf16 engines: f32 copies */
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
};

/* Register every tensor of t->m (dims and seed set) with t->e; 0 or a negative errno. */
int gpt_register(struct gpt_trainer *t);
/* Allocate / free t->b (after zinf_engine_init). */
int gpt_bufs_alloc(struct gpt_trainer *t);
void gpt_bufs_free(struct gpt_trainer *t);
/*
 * One micro-batch on t->b.tokens / t->b.targets (copied in on the compute stream): forward and
 * backward, each layer fetched and released around its use, each gradient handed to the engine;
 * not zinf_engine_step(). Returns 0 and the sum of the per-position losses in *loss_sum.
 */
int gpt_micro_batch(struct gpt_trainer *t, double *loss_sum);

#endif
