/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zinf/blocks/optimizer.h: an optimizer described by its state and its kernel, so that whoever
 * moves the state (the pipelined step in zinf/blocks/offload.h, a checkpoint writer, the CLI) needs
 * no knowledge of which optimizer it is. An optimizer's state per parameter is a list of parts,
 * each an array of one element per parameter: part 0 is always the fp32 master weight ("fp32"),
 * the others are the optimizer's own ("exp_avg", "exp_avg_sq", "state_sum", ...), each with its
 * bytes per element. One step function runs the optimizer over a range of every part.
 * A building block (zinf/blocks/): for tools and engines made of zinf's parts; a trainer
 * needs none of it beyond the option types zinf/engine.h takes from it.
 *
 * The kernels are those of zinf/blocks/adam.h (zinf_adam_step, zinf_adam_step_bf16state,
 * zinf_adagrad_step, zinf_lion_step); this header adds no arithmetic.
 */
#ifndef ZINF_OPTIMIZER_H
#define ZINF_OPTIMIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zinf/blocks/adam.h"
#include "zinf/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Most parts any optimizer has (master included); arrays of parts may be sized with it. */
#define ZINF_OPTIM_MAX_PARTS 4

enum zinf_optim_kind {
	ZINF_OPTIM_ADAM = 0,	/* Adam, L2 weight decay added to the gradient; parts fp32,
				   exp_avg, exp_avg_sq */
	ZINF_OPTIM_ADAMW = 1,	/* Adam with decoupled weight decay; the same parts */
	ZINF_OPTIM_ADAGRAD = 2, /* parts fp32, state_sum */
	ZINF_OPTIM_LION = 3,	/* parts fp32, exp_avg */
};

struct zinf_optimizer; /* opaque */

/* How the moments are stored (zinf_optimizer_opts.state_format). */
enum zinf_state_format {
	ZINF_STATE_PLAIN = 0, /* one state_dtype value per element */
	ZINF_STATE_Q8 = 1,    /* Adam/AdamW: m and v as 8-bit blockwise codes with one fp32 scale
				 per ZINF_Q8_BLOCK elements (zinf/blocks/adam.h) */
};

struct zinf_optimizer_opts {
	size_t size;		     /* sizeof(struct zinf_optimizer_opts); set by _opts_init() */
	enum zinf_optim_kind kind;   /* set by zinf_optimizer_opts_init() */
	enum zinf_dtype state_dtype; /* of the parts after the master: ZINF_F32 (default), or
					ZINF_BF16 for Adam/AdamW (2 bytes per element) */
	enum zinf_rounding rounding; /* bf16 and q8 state: ZINF_ROUND_STOCHASTIC (default) or
					ZINF_ROUND_NEAREST_EVEN */
	int threads;		     /* 0 (default): OpenMP's default */
	uint64_t seed;		     /* bf16, q8 state with stochastic rounding; default 0 */
	float lr, beta1, beta2, eps; /* beta1/beta2/eps as the kind uses them (Adagrad: none of
					the betas; Lion: no eps) */
	float weight_decay;	     /* L2 for Adam and Adagrad, decoupled for AdamW and Lion */
	float lr_decay;		     /* Adagrad only */
	bool bias_correction;	     /* Adam/AdamW only; default true */
	/* an enum zinf_state_format, in a byte that was reserved (the struct keeps its size and
	 * every field its offset: it is embedded in struct zinf_engine_opts): ZINF_STATE_PLAIN
	 * (0, default); ZINF_STATE_Q8 (Adam/AdamW, state_dtype ZINF_F32): parts exp_avg and
	 * exp_avg_sq are q8 arrays (zinf_optimizer_part_size), 2.03 bytes per parameter for both
	 * instead of 8, their codes rounded as `rounding` says (stochastic by default) */
	uint8_t state_format;
	/* an enum zinf_dtype, in a byte that was reserved as well: the master weight (part 0):
	 * ZINF_F32 (0, default, 4 bytes), or ZINF_BF16 for Adam/AdamW (2 bytes, rounded
	 * stochastically at every step: zinf_adam_step_bf16master), with any of the moments'
	 * formats above; part 0 keeps its name "fp32" (the master's state kind) */
	uint8_t master_dtype;
	uint8_t reserved[5]; /* zero */
	const char *simd;    /* SIMD path of the kernels: NULL (default) or "avx512" | "avx2"
				| "scalar" (zinf/blocks/adam.h); resolved once at create, so a
				path this CPU cannot run is refused there */
};

/**
 * Fill *o with `kind`'s defaults (and o->size): Adam/AdamW DeepSpeed's (lr 1e-3, betas 0.9,
 * 0.999, eps 1e-8, wd 0, bias correction), Adagrad torch's (lr 1e-2, lr_decay 0, eps 1e-10),
 * Lion's published (lr 1e-4, betas 0.9, 0.99); fp32 state, stochastic rounding, seed 0.
 */
ZINF_API void zinf_optimizer_opts_init(struct zinf_optimizer_opts *o, enum zinf_optim_kind kind);

/**
 * Create an optimizer (the options are copied). Returns 0 and sets *out, or -EINVAL (NULL out,
 * unknown kind or dtype or rounding or state format, bf16 or q8 state or a bf16 master for a kind
 * other than Adam/AdamW, q8 with a state_dtype other than f32, a master_dtype other than f32 or
 * bf16, a reserved byte not zero, a size larger than this library's) with a message naming the
 * field; -ENOMEM. The hyper-parameters are checked by the kernel at each step. Free with
 * zinf_optimizer_destroy().
 */
ZINF_API int zinf_optimizer_create(const struct zinf_optimizer_opts *opts,
				   struct zinf_optimizer **out);
/** NULL is a no-op. */
ZINF_API void zinf_optimizer_destroy(struct zinf_optimizer *opt);

/**
 * Set the learning rate of the following steps (schedules). Not to be called while another
 * thread runs zinf_optimizer_step() with opt. Returns 0; -EINVAL (NULL, lr < 0, NaN or
 * infinite) with a message.
 */
ZINF_API int zinf_optimizer_set_lr(struct zinf_optimizer *opt, float lr);
/**
 * Set beta1 and beta2 of the following steps (OneCycle's momentum cycling), as set_lr. Returns
 * 0; -EINVAL (NULL, a value outside [0, 1) or NaN) with a message; -EOPNOTSUPP for Adagrad,
 * which has no betas (nothing logged: the caller decides, as DeepSpeed's OneCycle warns and
 * stops cycling).
 */
ZINF_API int zinf_optimizer_set_betas(struct zinf_optimizer *opt, float beta1, float beta2);

/**
 * Ranges of the index space of zinf_optimizer_step's index0 whose elements get no weight decay
 * (Hugging Face's no_decay group: biases and norm weights): n pairs [ranges[2i],
 * ranges[2i + 1]), each non-empty, sorted and disjoint (a range may end where the next starts).
 * Copied; replaces the previous set; n 0 (ranges may then be NULL) clears it: every element
 * decays. A step over a range that crosses their boundaries runs the kernel once per run of
 * elements alike, with weight_decay or 0 (for every kind: Adam's L2 and AdamW's and Lion's
 * decoupled decay alike), so an element's result is that of a call with its own weight decay.
 * Not to be called while another thread runs zinf_optimizer_step() with opt. Returns 0; -EINVAL
 * (NULL optimizer, NULL ranges with n > 0, an empty, unsorted or overlapping range, named) with
 * a message; -ENOMEM.
 */
ZINF_API int zinf_optimizer_set_no_decay(struct zinf_optimizer *opt, const uint64_t *ranges,
					 uint32_t n);
/**
 * The elements from index0 on (at most n) that share index0's weight decay, and in *decays
 * whether it decays (zinf_optimizer_set_no_decay): the run a caller with its own kernel (the
 * engine's device Adam) steps with weight_decay or 0. n, and *decays true, for n 0, a NULL
 * optimizer, no ranges set or a weight_decay of 0 (nothing to split).
 */
ZINF_API size_t zinf_optimizer_decay_run(const struct zinf_optimizer *opt, uint64_t index0,
					 size_t n, bool *decays);

/** "adam", "adamw", "adagrad" or "lion"; "?" for NULL. */
ZINF_API const char *zinf_optimizer_name(const struct zinf_optimizer *opt);
/** Parts of the state per parameter (master included): 3 Adam/AdamW, 2 Adagrad and Lion; 0 for
 * NULL. */
ZINF_API uint32_t zinf_optimizer_part_count(const struct zinf_optimizer *opt);
/** Part i's name ("fp32" for part 0): the state kind under which it is swapped; NULL for a
 * NULL optimizer or i out of range. */
ZINF_API const char *zinf_optimizer_part_name(const struct zinf_optimizer *opt, uint32_t i);
/** Part i's bytes per element (4, or 2 for bf16 state or a bf16 master, or 1 for q8 state: its
 * codes, not counting the block scales: size arrays with zinf_optimizer_part_size()); 0 for NULL
 * or i out of range. */
ZINF_API uint32_t zinf_optimizer_part_bytes(const struct zinf_optimizer *opt, uint32_t i);
/** Its dtype: ZINF_F32 (4 bytes) or ZINF_BF16 (2 bytes: bf16 state, or part 0 with a bf16
 * master); ZINF_F32 out of range and for a q8 part, which has no element dtype
 * (zinf_optimizer_part_align() > 1 tells it). */
ZINF_API enum zinf_dtype zinf_optimizer_part_dtype(const struct zinf_optimizer *opt, uint32_t i);
/** Sum of the parts' bytes per element (12 for fp32 Adam, 8 for bf16-state Adam, 6 for q8: use
 * zinf_optimizer_state_size() for sizes); 0 for NULL. */
ZINF_API uint32_t zinf_optimizer_state_bytes(const struct zinf_optimizer *opt);

/**
 * Bytes that n elements of part i take: n * zinf_optimizer_part_bytes(); for a q8 part
 * zinf_q8_bytes(n) (its blocks start at the part array's element 0). The byte offset of element
 * j in a part array, j a multiple of zinf_optimizer_part_align(), is part_size(opt, i, j).
 * 0 for NULL or i out of range.
 */
ZINF_API uint64_t zinf_optimizer_part_size(const struct zinf_optimizer *opt, uint32_t i,
					   uint64_t n);
/** Elements a part array may be cut at (a step's range starts at a multiple of it, counted from
 * the array's element 0): 1, or ZINF_Q8_BLOCK for a q8 part; 0 for NULL or i out of range. */
ZINF_API uint32_t zinf_optimizer_part_align(const struct zinf_optimizer *opt, uint32_t i);
/** The sum of zinf_optimizer_part_size() over the parts; 0 for NULL. */
ZINF_API uint64_t zinf_optimizer_state_size(const struct zinf_optimizer *opt, uint64_t n);
/** opts.state_format; ZINF_STATE_PLAIN for NULL. */
ZINF_API enum zinf_state_format zinf_optimizer_state_format(const struct zinf_optimizer *opt);

/**
 * One optimizer step (step >= 1) over elements [index0, index0 + n) of a tensor: parts[i]
 * points at element index0 of part i (zinf_optimizer_part_count() arrays; part 0 is the fp32
 * master), grad at n gradients of grad_dtype, copy (may be NULL) receives the updated
 * parameters as copy_dtype. grad_scale multiplies the gradients (1 / (loss_scale * clip)).
 *
 * Reproducibility: every kind except bf16 state with stochastic rounding gives each element a
 * result that depends on its inputs only, however a tensor is cut into calls. Stochastic
 * rounding hashes (seed, step, index within the call) (zinf_adam_step_bf16state); this
 * function passes the kernel seed ^ splitmix64(index0), so a call is reproducible from
 * (seed, step, index0, n): the same range cut at the same places rounds bit for bit the same,
 * and different ranges of a tensor draw different bits. (The pipelined step cuts sub-group k at
 * its start and every ZINF_STEP_CHUNK elements after it; see zinf/blocks/offload.h.)
 *
 * Elements in a range of zinf_optimizer_set_no_decay() are stepped with weight decay 0: the call
 * runs the kernel once per run of elements alike (zinf_optimizer_decay_run), each run's stochastic
 * rounding seeded from its own first index (a call that crosses no boundary is one kernel call,
 * as without ranges).
 *
 * bf16 master (master_dtype): parts[0] holds bf16 values; one kernel call
 * (zinf_adam_step_bf16master) steps the range with the moments' format, the seed, index0 and the
 * no-decay ranges passed along: every element's rounding bits (the master's and bf16 moments')
 * come from (seed, step, its index), so the result does not depend on the cuts (q8 moments: cut at
 * their block multiples as below). bf16 and q8 moments are rounded as `rounding` says.
 *
 * q8 state: parts 1 and 2 point at a block boundary of their q8 arrays (the range's start is a
 * multiple of ZINF_Q8_BLOCK from the array's element 0; cut a range only there); one kernel call
 * (zinf_adam_step_q8state) steps the range with the no-decay ranges, index0, opts.rounding and
 * opts.seed passed along, so a block holding elements with and without weight decay is encoded
 * once; the result does not depend on the cuts (stochastic rounding hashes index0 + i).
 *
 * Returns 0, or -EINVAL (NULL optimizer or parts, a NULL part with n > 0, and the kernel's
 * checks: step < 1, bad hyper-parameters, unknown dtypes) with a message; -ENODEV as the kernel.
 */
ZINF_API int zinf_optimizer_step(const struct zinf_optimizer *opt, int64_t step, float grad_scale,
				 void *const parts[], const void *grad, enum zinf_dtype grad_dtype,
				 uint64_t index0, size_t n, void *copy, enum zinf_dtype copy_dtype);

#ifdef __cplusplus
}
#endif
#endif
