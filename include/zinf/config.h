/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zinf/config.h: DeepSpeed's ds_config.json read with DeepSpeed's meaning into the engine's
 * options (zinf/engine.h) plus the training semantics the engine options do not carry (batch
 * sizes, clipping, fp16 loss scaling, the lr schedule), with "auto" resolved as the Hugging
 * Face integration resolves it.
 * The trainer's API (zinf/zinf.h includes it).
 *
 * Keys and defaults follow deepspeed/runtime/config.py, runtime/zero/config.py,
 * runtime/zero/offload_config.py, the aio block, runtime/lr_schedules.py and the fp16 block;
 * DeepSpeed's deprecated spellings are accepted with a warning naming the new one. Keys of
 * DeepSpeed features zinf does not implement (activation_checkpointing, flops_profiler,
 * tensorboard, ...) are accepted with one warning each.
 *
 * Errors. Every problem found is counted and the first 20 are logged (at ERROR, through the log
 * callback of zinf/common.h), then "NAME: N errors (the first 20 shown)"; each as
 * "NAME:LINE: PATH: what is wrong; what is allowed", NAME the file (or the name given for a
 * string), LINE the line of the key, PATH its full path
 * (zero_optimization.offload_optimizer.nvme_path). Classes: malformed JSON (line and column; a
 * non-ASCII space or quote outside strings, such as U+00A0 NO-BREAK SPACE copied from a web
 * page, is named with its line and column); an unknown key (the nearest valid key is
 * suggested); a key in the wrong section (where it belongs is named); a wrong type or a value
 * out of range (what is allowed); inconsistent batch keys; device nvme without nvme_path;
 * offload_param below stage 3; fp16 and bf16 both enabled; optimizers and schedules zinf does
 * not implement (named).
 *
 * Not here: memory planning (zinf config check, zinf estimate).
 */
#ifndef ZINF_TRAIN_CONFIG_H
#define ZINF_TRAIN_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zinf/common.h"
#include "zinf/engine.h"
#include "zinf/blocks/loss_scale.h"
#include "zinf/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

/**
 * What "auto" is resolved from, as the Hugging Face Trainer resolves it (transformers'
 * HfTrainerDeepSpeedConfig): the trainer's values (its TrainingArguments) and the model's hidden
 * size. One resolver (config/config_auto.c) decides every "auto" for every caller: a value left
 * at its "not given" mark takes TrainingArguments' default, as the Trainer of a user who gave
 * nothing would: per_device_train_batch_size 8, gradient_accumulation_steps 1, learning_rate
 * 5e-5, adam_beta1 0.9, adam_beta2 0.999, adam_epsilon 1e-8, weight_decay 0, max_grad_norm 1,
 * warmup 0 steps, fp16 and bf16 off (ZINF_CONFIG_HF_* below). Three inputs have no default: the
 * number of training steps (the Trainer computes it from the data), the model's hidden size and,
 * when given as 0, the world size; an "auto" that needs one of them is an error naming the key
 * and what it needs, or, with ZINF_CONFIG_UNRESOLVED_OK, is listed as unresolved.
 */
struct zinf_config_inputs {
	size_t size;		  /* sizeof(struct zinf_config_inputs); set by _inputs_init() */
	int32_t world_size;	  /* data-parallel ranks; default 1 (used, auto or not); 0: not
				     known (derived from the batch keys where they fix it, as
				     train_batch_size / (micro x accumulation); else unresolved) */
	int32_t fp16;		  /* fp16.enabled "auto": 0 or 1; -1 (default): not given */
	int32_t bf16;		  /* bf16.enabled "auto": 0 or 1; -1: not given */
	uint32_t flags;		  /* ZINF_CONFIG_UNRESOLVED_OK; default 0 */
	int64_t micro_batch;	  /* per_device_train_batch_size; 0: not given */
	int64_t grad_accum;	  /* gradient_accumulation_steps; 0: not given */
	uint64_t hidden_size;	  /* the model's hidden size; 0: not given (no default) */
	int64_t total_num_steps;  /* training steps (scheduler total_num_steps); -1: not given
				     (no default) */
	int64_t warmup_num_steps; /* warmup steps; -1: not given */
	double lr;		  /* learning_rate; NaN: not given (so are the next five) */
	double beta1, beta2;	  /* adam_beta1, adam_beta2 */
	double eps;		  /* adam_epsilon */
	double weight_decay;
	double max_grad_norm; /* gradient_clipping */
};

/** inputs.flags: an "auto" whose input has no default and was not given is not an error: it is
 * listed in the config's unresolved[] (and logged at INFO), its key keeps DeepSpeed's default,
 * and the checks that need its value are left out (a configuration checked before the trainer
 * knows its steps or its model: zinf config check). */
#define ZINF_CONFIG_UNRESOLVED_OK (1u << 0)

/** transformers' TrainingArguments defaults, which a "not given" input takes. */
#define ZINF_CONFIG_HF_MICRO_BATCH   8
#define ZINF_CONFIG_HF_GRAD_ACCUM    1
#define ZINF_CONFIG_HF_LR	     5e-5
#define ZINF_CONFIG_HF_BETA1	     0.9
#define ZINF_CONFIG_HF_BETA2	     0.999
#define ZINF_CONFIG_HF_EPS	     1e-8
#define ZINF_CONFIG_HF_WEIGHT_DECAY  0.0
#define ZINF_CONFIG_HF_MAX_GRAD_NORM 1.0
#define ZINF_CONFIG_HF_WARMUP_STEPS  0

/** Fill *in with "nothing given" and world_size 1. */
ZINF_API void zinf_config_inputs_init(struct zinf_config_inputs *in);

/** Most "auto" values one configuration reports (resolved, and unresolved). */
#define ZINF_CONFIG_MAX_RESOLVED 32

/** One "auto" resolved: the key's full path, the value (JSON text), and what it came from. */
struct zinf_config_resolved {
	char path[80];
	char value[48];
	char input[40];	     /* TrainingArguments' name of the input (learning_rate,
				adam_beta1+adam_beta2, per_device_train_batch_size, train_batch_size
				(calculated), ...), or hidden_size, num_training_steps */
	bool defaulted;	     /* the input was not given: TrainingArguments' default */
	uint8_t reserved[7]; /* zero */
};

/** An input that an "auto" needs and that has no default. */
enum zinf_config_input {
	ZINF_CONFIG_IN_WORLD_SIZE = 1,	/* world_size given as 0 */
	ZINF_CONFIG_IN_HIDDEN_SIZE = 2, /* hidden_size */
	ZINF_CONFIG_IN_TOTAL_STEPS = 3, /* total_num_steps */
};

/** One "auto" left unresolved (ZINF_CONFIG_UNRESOLVED_OK): its path and what it needs. */
struct zinf_config_unresolved {
	char path[80];
	enum zinf_config_input input;
	uint32_t reserved; /* zero */
};

/** A whole ds_config.json, read. Caller-owned: zinf_config_init() / zinf_config_fini(). */
struct zinf_train_config {
	size_t size; /* sizeof(struct zinf_train_config); set by zinf_config_init() */

	/* zero_optimization, offload_*, aio, optimizer, precision, gradient_accumulation_steps;
	   nvme_path strings are owned by this struct (freed by zinf_config_fini) */
	struct zinf_engine_opts engine;

	/* batch: train_batch_size = micro x gradient_accumulation_steps x world_size */
	int64_t train_batch_size;
	int64_t train_micro_batch_size_per_gpu;
	int32_t world_size; /* the inputs'; derived from the batch keys when the inputs' is 0 (then
			       world_derived), 0 when still unknown */
	bool world_derived; /* world_size = train_batch_size / (micro x accumulation) */
	uint8_t reserved0[3]; /* zero */

	double gradient_clipping;	  /* max global norm; 0 (default): none (also in engine) */
	int64_t steps_per_print;	  /* default 10 */
	double gradient_predivide_factor; /* default 1.0 */
	bool wall_clock_breakdown;	  /* default false */
	bool prescale_gradients;	  /* default false */
	bool bf16_enabled;		  /* bf16.enabled (or the older "bfloat16" block) */
	bool optimizer_given;		  /* the file has an optimizer block */
	bool scheduler_given;		  /* ... a scheduler block */
	/* zero_optimization keys the engine options lack (DeepSpeed's defaults) */
	bool reduce_scatter;				/* true */
	bool allgather_partitions;			/* true */
	bool round_robin_gradients;			/* false */
	bool stage3_gather_16bit_weights_on_model_save; /* false */
	bool load_from_fp32_weights;			/* true */
	bool elastic_checkpoint;			/* false */
	bool ignore_unused_parameters;			/* true */
	uint8_t reserved1[4];				/* zero */

	struct zinf_fp16_opts fp16;	     /* also copied into engine.fp16 */
	struct zinf_schedule_opts scheduler; /* type NONE without a scheduler block */

	/* every "auto" resolved, in the order met */
	uint32_t n_resolved;
	uint32_t n_unresolved; /* ZINF_CONFIG_UNRESOLVED_OK: those left, in the order met */
	struct zinf_config_resolved resolved[ZINF_CONFIG_MAX_RESOLVED];
	struct zinf_config_unresolved unresolved[ZINF_CONFIG_MAX_RESOLVED];
	/* bf16.bf16_optimizer_states (DeepSpeed: Adam's moments in bf16): engine.optimizer's
	   state_dtype becomes ZINF_BF16 (zinf's rounding of it, stochastic by default); taken with
	   bf16 training, ZeRO stage 1-3, bf16_master_weights_and_grads true and Adam/AdamW only
	   (DeepSpeed's conditions), else the read is -EINVAL naming it (config/README.md) */
	bool bf16_optimizer_states;
	/* bf16.bf16_master_weights_and_grads (DeepSpeed: the master weights and gradients in bf16):
	   engine.optimizer's master_dtype becomes ZINF_BF16 (zinf's: stochastic rounding; the
	   gradient partitions stay fp32) */
	bool bf16_master_weights_and_grads;
	uint8_t reserved2[6]; /* zero */
};

/**
 * Fill *c with DeepSpeed's defaults (what an empty "{}" with train_batch_size 1 reads as): stage
 * 0, no offload, AdamW (zinf_optimizer_opts_init), fp32 (engine.dtype ZINF_F32), no schedule,
 * batch 1 x 1 x 1. Owns nothing yet.
 */
ZINF_API void zinf_config_init(struct zinf_train_config *c);
/** Free what *c owns (the nvme_path strings) and leave it as zinf_config_init() does. NULL: no-op.
 */
ZINF_API void zinf_config_fini(struct zinf_train_config *c);

/**
 * Read ds_config.json text; `name` (the file name, or NULL: "<string>") starts every message.
 * *c must have been zinf_config_init()'ed (its size is checked); it is filled on success and
 * left at the defaults on failure. inputs may be NULL (nothing given, world size 1).
 * Returns 0; -EINVAL (every error logged, see above; also NULL arguments, a bad size);
 * -ENOMEM.
 */
ZINF_API int zinf_config_read_string(const char *text, const char *name,
				     const struct zinf_config_inputs *inputs,
				     struct zinf_train_config *c);
/** zinf_config_read_string() on a file's contents. Also -errno of open/read (path logged). */
ZINF_API int zinf_config_read_file(const char *path, const struct zinf_config_inputs *inputs,
				   struct zinf_train_config *c);

/**
 * The resolved configuration as ds_config.json text (every key zinf uses, with its value, "auto"
 * replaced; 4-space indent), in *out, malloc'ed: free() it. Returns 0; -EINVAL; -ENOMEM.
 */
ZINF_API int zinf_config_dump(const struct zinf_train_config *c, char **out);

/**
 * Create an engine from a ds_config.json in one call: zinf_config_read_file(path, inputs), then
 * zinf_engine_create() with its engine options (collective: every rank calls it); the engine
 * applies gradient_clipping and the fp16 block (copied into the engine options). What the
 * engine options do not hold (batch sizes, the schedule) is the trainer's to apply: read the
 * file with zinf_config_read_file() for those. inputs may be NULL.
 * Returns 0 and sets *out; the reader's errors (-EINVAL, every one logged, -errno of the file)
 * or zinf_engine_create()'s, leaving *out untouched. Free with zinf_engine_destroy().
 */
ZINF_API int zinf_engine_create_from_file(const char *path, const struct zinf_config_inputs *inputs,
					  struct zinf_engine **out);

/* ---- a Hugging Face model's shape ---------------------------------------------------------- */

/** The families zinf_hf_model_read knows (config.json's model_type). */
enum zinf_hf_arch {
	ZINF_HF_GPT2 = 1,  /* "gpt2": learned positions, LayerNorm, Conv1D linears, tied head */
	ZINF_HF_LLAMA = 2, /* "llama", "mistral", "qwen2": RMSNorm, rotary, SwiGLU, GQA */
};

/** A Hugging Face model's shape and parameter counts, from its config.json. */
struct zinf_hf_model {
	size_t size; /* sizeof(struct zinf_hf_model); set by the caller */
	enum zinf_hf_arch arch;
	char model_type[32];   /* as the file says it */
	uint64_t vocab;	       /* vocab_size */
	uint64_t hidden;       /* hidden_size (gpt2: n_embd) */
	uint64_t layers;       /* num_hidden_layers (gpt2: n_layer) */
	uint64_t intermediate; /* intermediate_size (gpt2: n_inner, or 4 x hidden) */
	uint64_t heads;	       /* num_attention_heads (gpt2: n_head) */
	uint64_t kv_heads;     /* num_key_value_heads (default heads; gpt2: heads) */
	uint64_t head_dim;     /* head_dim, or hidden / heads */
	uint64_t positions;    /* gpt2: n_positions (learned); 0 for rotary families */
	bool tied;	       /* the head shares the token embedding (tie_word_embeddings) */
	bool attention_bias;   /* biases of q, k, v (and o: llama's attention_bias; qwen2: not o) */
	bool mlp_bias;	       /* biases of the MLP's projections (llama's mlp_bias) */
	uint8_t reserved[5];   /* zero */
	uint64_t params;       /* every parameter, a tied head counted once */
	uint64_t layer_params; /* one decoder block */
	uint64_t largest_layer; /* the largest of a block, the token embedding, an untied head */
	/* what training the model needs beyond its sizes (a trainer refuses what it lacks) */
	double rope_theta;	 /* rope_theta, or transformers 5's rope_parameters.rope_theta
				    (default 10000); 0 for gpt2 */
	double norm_eps;	 /* rms_norm_eps (default 1e-6); gpt2: layer_norm_epsilon (1e-5) */
	char act[24];		 /* hidden_act (default "silu"); gpt2: activation_function
				    (default "gelu_new") */
	uint64_t max_positions;	 /* max_position_embeddings (default 2048); gpt2: n_positions */
	uint64_t sliding_window; /* mistral (default 4096; null: none), qwen2 with
				    use_sliding_window: the window; 0: none */
	bool rope_scaling;	/* rope_scaling is given (not null), or rope_parameters.rope_type is
				   not "default" */
	bool attn_unscaled;	/* gpt2: scale_attn_weights false */
	bool attn_layer_scaled; /* gpt2: scale_attn_by_inverse_layer_idx true */
	uint8_t reserved2[5];	/* zero */
};

/**
 * Read a Hugging Face config.json (path: the file, or the model directory holding it) into *out
 * (out->size set by the caller): the family from model_type ("gpt2"; "llama", "mistral",
 * "qwen2"), the sizes above, and the parameter counts as transformers builds the model
 * (GPT2LMHeadModel, LlamaForCausalLM and the like: Llama-2-7B 6738415616, GPT-2 124439808).
 * Also the settings a trainer needs (rope_theta, the norms' epsilon, the activation, the
 * positions, a sliding window, whether rope_scaling is set), with transformers' defaults.
 * Returns 0; -EINVAL naming the file and the key (another model_type, a missing or non-integer
 * size, a rope_theta or epsilon that is not a positive number, an activation that is not a
 * string, heads that do not divide the hidden size, a size past what zinf counts: hidden and
 * head_dim x heads 2^20, vocab 2^24, layers 2^16, intermediate 2^22); -errno of the file.
 */
ZINF_API int zinf_hf_model_read(const char *path, struct zinf_hf_model *out);

#ifdef __cplusplus
}
#endif
#endif
