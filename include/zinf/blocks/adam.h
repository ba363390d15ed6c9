/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zinf/blocks/adam.h: CPU optimizers (Adam/AdamW, Adam with bf16 or 8-bit blockwise state, Adam
 * with a bf16 master weight, Adagrad, Lion) in one fused pass: unscale the gradient, update
 * master and moments, write the 16-bit parameter copy; and the gradient helpers (sum of squares,
 * inf/NaN check).
 * Vectorised (AVX-512, AVX2+FMA, scalar: the SIMD paths, see "SIMD paths" below) and threaded
 * with OpenMP over cache-sized tiles.
 * A building block (zinf/blocks/): for tools and engines made of zinf's parts; a trainer
 * needs none of it beyond the option types zinf/engine.h takes from it.
 */
#ifndef ZINF_ADAM_H
#define ZINF_ADAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zinf/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- SIMD paths --------------------------------------------------------------------------- */

/*
 * Every function of this header runs on one SIMD path: "avx512", "avx2" or "scalar" (best
 * first). Which one: the `simd` field of the call's options when it is not NULL; else the
 * environment variable ZINF_SIMD, read once per process (at the first call that chooses a path;
 * later changes of the environment are not seen), when it is set and not empty; else the best
 * path this CPU and this build run. The option wins over the environment: a caller that names a
 * path gets that path, and ZINF_SIMD only changes the default of callers that did not choose
 * (a way to force a path on a program without rebuilding it).
 * A name that is not a path is -EINVAL, with a message that lists the paths; a path that this
 * build did not compile or this CPU cannot run is -ENODEV, with a message that names the path
 * and what is missing. A bad ZINF_SIMD fails (the same way) every call that does not set `simd`.
 * The paths give the same results up to float rounding (see zinf_adam_step()).
 */

/** The i-th SIMD path, best first, whether or not it runs here; NULL for i past the last. */
ZINF_API const char *zinf_simd_path(unsigned i);

/** The best path this CPU and build run ("scalar" at worst); ZINF_SIMD is not consulted. */
ZINF_API const char *zinf_simd_best(void);

/**
 * The path a call whose options have `simd` would run on (NULL: the default, as above). Returns
 * 0 and sets *out (when out is not NULL) to the path's name (a constant string); -EINVAL or
 * -ENODEV as the optimizers do.
 */
ZINF_API int zinf_simd_resolve(const char *simd, const char **out);

/* ---- Adam / AdamW ------------------------------------------------------------------------- */

struct zinf_adam_opts {
	size_t size; /* sizeof(struct zinf_adam_opts) */
	float lr, beta1, beta2, eps, weight_decay;
	bool adamw_mode; /* true: decoupled weight decay (AdamW); false: L2 added to the gradient */
	bool bias_correction;
	int threads;	  /* 0: OpenMP's default */
	const char *simd; /* NULL: the default path; else "avx512" | "avx2" | "scalar" (see above);
			     read during the call only */
};

/** DeepSpeed's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0, AdamW, bias
 * correction on, threads 0, simd NULL. */
ZINF_API void zinf_adam_opts_init(struct zinf_adam_opts *o);

/**
 * One step (step >= 1) over n elements. Gradients are multiplied by grad_scale before use
 * (the caller passes 1 / (loss_scale * clip_factor)). When param_copy is not NULL the updated
 * parameters are also written there as copy_dtype (round to nearest even).
 * Returns 0; -EINVAL on bad arguments (NULL pointers with n > 0, step < 1, non-finite
 * hyper-parameters, unknown dtype), with a message, modifying nothing.
 *
 * The options are read once, into a copy, at the start of the call (common/opts.h's rule: a
 * caller built against an older, smaller struct gets the defaults of the fields it does not
 * know). Also -EINVAL: o NULL, o->size larger than this library's struct or smaller than its
 * size field or ending inside the simd pointer, lr or weight_decay or eps negative, beta1 or
 * beta2 outside [0, 1), grad_scale not finite, threads < 0, an unknown SIMD path. -ENODEV: the
 * SIMD path (o->simd, else ZINF_SIMD) is not built or this CPU cannot run it.
 * copy_dtype may be ZINF_F32, ZINF_F16 or ZINF_BF16; it is ignored when param_copy is NULL.
 * The arrays must not overlap; any alignment is accepted. The arithmetic follows
 * torch.optim.Adam/AdamW: g = grad * grad_scale (+ wd * p when !adamw_mode); p *= 1 - lr * wd
 * when adamw_mode; m = b1 * m + (1 - b1) * g; v = b2 * v + (1 - b2) * g * g;
 * p -= step_size * m / (sqrt(v) / bc2_sqrt + eps) with step_size = lr / (1 - b1^step),
 * bc2_sqrt = sqrt(1 - b2^step) (lr and 1 without bias correction), the step's scalars
 * computed once in float64. On a given SIMD path each element's result depends only on that
 * element's inputs and the step's scalars: it is bit-identical for any thread count, pointer
 * alignment, n, build type, and whether the arrays are stepped in one call or as consecutive
 * pieces cut anywhere (the vector paths run their tails through the vector code). The SIMD paths
 * differ from each other by float rounding only (the vector paths use FMA and multiply by
 * 1 / bc2_sqrt).
 */
ZINF_API int zinf_adam_step(const struct zinf_adam_opts *o, int64_t step, float grad_scale,
			    float *param, const void *grad, enum zinf_dtype grad_dtype,
			    float *exp_avg, float *exp_avg_sq, size_t n, void *param_copy,
			    enum zinf_dtype copy_dtype);

/**
 * The same step with the moments m (exp_avg) and v (exp_avg_sq) kept in bfloat16 (uint16_t bit
 * patterns): they are widened to float, updated in float exactly as zinf_adam_step() does, and
 * rounded back with `rounding`. ZINF_ROUND_STOCHASTIC draws its random bits from a counter-based
 * hash of (seed, step, element index) (low 16 bits round m, high 16 bits v), so the result does
 * not depend on the thread count or SIMD tiling and a run repeats bit for bit with the same seed;
 * the index counts from the start of the call, so stepping the arrays as pieces rounds
 * differently from one call (ZINF_ROUND_NEAREST_EVEN has no such dependence);
 * pass a different seed per tensor. The master parameter stays float32. Halves the bytes of m
 * and v (12 -> 8 bytes of state per parameter). Prefer ZINF_ROUND_STOCHASTIC: with RNE, an
 * update of v smaller than half a bf16 ulp (2^-9 relative; beta2 = 0.999 decays v by 1e-3 a step)
 * is lost, so v cannot decay and the trajectory drifts from fp32 state; stochastic rounding is
 * unbiased. Accuracy against float32 state is recorded in bench/RESULTS.md.
 * Returns 0; -EINVAL as zinf_adam_step() or an unknown rounding; -ENODEV as zinf_adam_step().
 */
enum zinf_rounding { ZINF_ROUND_NEAREST_EVEN = 0, ZINF_ROUND_STOCHASTIC = 1 };

ZINF_API int zinf_adam_step_bf16state(const struct zinf_adam_opts *o, int64_t step,
				      float grad_scale, float *param, const void *grad,
				      enum zinf_dtype grad_dtype, uint16_t *exp_avg,
				      uint16_t *exp_avg_sq, size_t n, void *param_copy,
				      enum zinf_dtype copy_dtype, enum zinf_rounding rounding,
				      uint64_t seed);

/* ---- Adam with 8-bit blockwise state ------------------------------------------------------ */

/*
 * 8-bit blockwise optimizer state ("q8"). A moment array of n elements is cut into blocks of
 * ZINF_Q8_BLOCK elements from its element 0 (the last block may be shorter); each block is
 * stored as its fp32 scale followed by one 8-bit code per element, so n elements take
 * zinf_q8_bytes(n) = n + 4 * ceil(n / ZINF_Q8_BLOCK) bytes (1.015625 bytes per element) and
 * element j * ZINF_Q8_BLOCK starts at byte zinf_q8_bytes(j * ZINF_Q8_BLOCK). All bytes zero is
 * the all-zero state. The codes are small floats relative to the block's largest finite value:
 *   m (exp_avg, signed): sign bit + 3 exponent bits + 4 mantissa bits of |m| / S_m * 1.875,
 *     S_m the block's largest finite |m| (the scale); 8 binades, |m| down to S_m / 240.
 *   v (exp_avg_sq, >= 0): sqrt(v) is coded, 4 exponent bits + 4 mantissa bits of
 *     sqrt(v) / S_w * 1.8125, S_w the block's largest finite sqrt(v) (the scale); 16 binades of
 *     sqrt(v), i.e. 32 of v (9.6 decades).
 * Rounding (zinf_q8_opts.rounding): stochastic rounding (the optimizer descriptor's default)
 * takes one of a value's two neighbouring codes with the probabilities that keep its expectation;
 * round to nearest (ties away from zero) the nearer. Below m's smallest code (S_m / 240) both
 * take 0 or that code at random, keeping the expectation (the nearer of the two would hold a
 * decaying m on the smallest code for ever); from 63/64 of it up, the smallest code.
 * Per element, the expectation and the worst case (+ float rounding, about 2^-22 of the value):
 *   m, |m| >= S_m / 240: stochastic E[m'] = m, |m' - m| < 2^-4 |m|; nearest |m' - m| <= 2^-5 |m|;
 *   m, |m| < S_m / 240: E[m'] = m (nearest: within S_m / 15360), |m' - m| < S_m / 240;
 *   sqrt(v) >= 2^-15 S_w / 1.8125 (S_w / 59392): stochastic E[sqrt(v')] = sqrt(v), |sqrt(v') -
 *     sqrt(v)| < 2^-4 sqrt(v); nearest <= 2^-5 sqrt(v);
 *   below that sqrt(v') is that smallest value: v rounds up, and a v > 0 never becomes 0, so
 *   m / sqrt(v) cannot explode where the m of the same element survives quantization; a finite v
 *   that is not > 0 (-0.0, v < 0) is 0.
 * Over steps (cpu_adam/README.md): with stochastic rounding a moment's decay happens in
 * expectation (an element whose gradient stops: m reaches 0 and stays there, v decays as fp32
 * state's); round to nearest holds a v whose change is under half a code (beta2 = 0.999 moves
 * sqrt(v) by 0.05% a step, half a code is 1.6-3.1%) at its ratio to the block's largest v.
 * A non-finite m or v is stored as a NaN code (0x80 for m, 0xff for v) and decodes as NaN; it
 * does not enter the scale, so the other elements of its block are unaffected. A block whose
 * scale is 0 or below FLT_MIN is stored as zeros: for m, every |m| 0 or below 1.2e-38; for v,
 * every v 0 (the scale is the largest sqrt(v), at least 3.7e-23 for any v > 0).
 * cpu_adam/README.md says why this code (and not a dynamic-tree map).
 */
#define ZINF_Q8_BLOCK 256

/** Bytes of n elements of q8 state: n + 4 * ceil(n / ZINF_Q8_BLOCK). */
static inline uint64_t
zinf_q8_bytes(uint64_t n)
{
	return n + 4 * ((n + ZINF_Q8_BLOCK - 1) / ZINF_Q8_BLOCK);
}

/** Which moment a q8 array holds: the codes differ (signed m; sqrt-coded v). */
enum zinf_q8_moment { ZINF_Q8_EXP_AVG = 0, ZINF_Q8_EXP_AVG_SQ = 1 };

/* The q8 step's options beyond Adam's (zinf_adam_step_q8state). */
struct zinf_q8_opts {
	size_t size;		     /* sizeof(struct zinf_q8_opts); set by zinf_q8_opts_init() */
	enum zinf_rounding rounding; /* of the codes: ZINF_ROUND_NEAREST_EVEN (default; ties away
					from zero) or ZINF_ROUND_STOCHASTIC */
	uint32_t n_no_decay;	     /* pairs in no_decay */
	uint64_t seed;		     /* stochastic rounding */
	uint64_t index0;	     /* the index of element 0 of the call in the index space of
					no_decay and of the stochastic rounding's hash */
	const uint64_t *no_decay;    /* n_no_decay ranges [no_decay[2i], no_decay[2i + 1]) of
					index0's space, sorted, disjoint, non-empty: elements in
					them get weight decay 0; read during the call only */
};

/** Round to nearest, seed 0, index0 0, no ranges. */
ZINF_API void zinf_q8_opts_init(struct zinf_q8_opts *o);

/**
 * The Adam/AdamW step of zinf_adam_step() with m (exp_avg) and v (exp_avg_sq) stored as q8 state
 * (above): exp_avg and exp_avg_sq point at zinf_q8_bytes(n) bytes each, laid out in blocks from
 * element 0. Each block is stepped in one pass that stays in L1: its codes are decoded to float,
 * the elements are updated by this SIMD path's float32 Adam kernel (the same arithmetic, bit for
 * bit, as zinf_adam_step() on the decoded values, weight decay per element: an element inside a
 * q->no_decay range gets weight decay 0), and the block is encoded once with its new scales.
 * The encoding is the same on every SIMD path. An element's result depends only on its block's
 * inputs and (stochastic rounding) on (seed, step, q->index0 + its index): stepping an array as
 * one call or as calls cut at multiples of ZINF_Q8_BLOCK (with index0 and the pointers advanced:
 * zinf_q8_bytes() of the cut) gives the same bytes.
 * q: NULL for the defaults. Returns 0; -EINVAL as zinf_adam_step(), an unknown rounding, a bad
 * q (size, NULL ranges with n_no_decay > 0, an empty, unsorted or overlapping range) with a
 * message, nothing written; -ENODEV as zinf_adam_step().
 */
ZINF_API int zinf_adam_step_q8state(const struct zinf_adam_opts *o, int64_t step, float grad_scale,
				    float *param, const void *grad, enum zinf_dtype grad_dtype,
				    void *exp_avg, void *exp_avg_sq, size_t n, void *param_copy,
				    enum zinf_dtype copy_dtype, const struct zinf_q8_opts *q);

/*
 * The random bits of step t of zinf_adam_step_q8state with seed s are those of zinf_q8_encode
 * with seed s + t * ZINF_Q8_STEP_SEED (the same index0): a reference can encode as a step does.
 */
#define ZINF_Q8_STEP_SEED 0x9e3779b97f4a7c15ull

/**
 * Encode n floats x as q8 state of moment `which` into out (zinf_q8_bytes(n) bytes), as the
 * step encodes (q: rounding, seed, index0; its no_decay is ignored; NULL: round to nearest; the
 * random bits: ZINF_Q8_STEP_SEED). For v, x holds v (not its square root). Returns 0; -EINVAL
 * (NULL pointer with n > 0, unknown moment or rounding, a bad q) with a message.
 */
ZINF_API int zinf_q8_encode(const float *x, size_t n, enum zinf_q8_moment which, void *out,
			    const struct zinf_q8_opts *q);
/**
 * Decode n elements of q8 state of moment `which` into out (v: the decoded v). Returns 0;
 * -EINVAL (NULL pointer with n > 0, unknown moment) with a message.
 */
ZINF_API int zinf_q8_decode(const void *in, size_t n, enum zinf_q8_moment which, float *out);

/* ---- Adam with a bf16 master weight ------------------------------------------------------- */

/* How Adam's m and v are stored beside a bf16 master (zinf_bf16master_opts.moments). */
enum zinf_moments {
	ZINF_MOMENTS_F32 = 0,  /* float arrays, as zinf_adam_step() */
	ZINF_MOMENTS_BF16 = 1, /* bf16 arrays, as zinf_adam_step_bf16state() */
	ZINF_MOMENTS_Q8 = 2,   /* q8 arrays, as zinf_adam_step_q8state() */
};

/* The bf16-master step's options beyond Adam's (zinf_adam_step_bf16master). */
struct zinf_bf16master_opts {
	size_t size;			   /* sizeof(struct zinf_bf16master_opts); set by
					      zinf_bf16master_opts_init() */
	enum zinf_moments moments;	   /* default ZINF_MOMENTS_F32 */
	enum zinf_rounding rounding;	   /* of the master: ZINF_ROUND_STOCHASTIC (default) or
					      ZINF_ROUND_NEAREST_EVEN */
	enum zinf_rounding state_rounding; /* of bf16 or q8 moments (default stochastic, which
					      q8 needs: cpu_adam/README.md "Rounding") */
	uint32_t n_no_decay;		   /* pairs in no_decay */
	uint64_t seed;			   /* stochastic rounding of the master and the moments */
	uint64_t index0;	  /* the index of element 0 of the call: in no_decay's space and the
				     stochastic rounding's hash; a multiple of ZINF_Q8_BLOCK from the q8
				     arrays' element 0 with q8 moments */
	const uint64_t *no_decay; /* n_no_decay ranges [no_decay[2i], no_decay[2i + 1]) of
				     index0's space, sorted, disjoint, non-empty: elements in them
				     get weight decay 0; read during the call only */
};

/** F32 moments, stochastic rounding of the master and the moments, seed 0, index0 0, no
 * ranges. */
ZINF_API void zinf_bf16master_opts_init(struct zinf_bf16master_opts *o);

/**
 * The Adam/AdamW step of zinf_adam_step() with the master weight stored in bfloat16 (uint16_t bit
 * patterns: 2 bytes per parameter instead of 4) and m, v as b->moments says (float, bf16 or q8
 * arrays, with the same layouts as the three steps above). The master is widened to float
 * (exactly), updated in float by this SIMD path's own Adam kernel (the arithmetic of
 * zinf_adam_step(), bit for bit, on the widened master: unscale, weight decay per element, the
 * bias corrections), and the new float master is rounded to bf16, stochastically by default:
 * it rounds up with probability (dropped bits) / 2^16, so its expected value is the float
 * update, and an update smaller than half a bf16 ulp of the weight, which round to nearest would
 * lose every step, still moves the weight on average; a finite master never rounds to infinity
 * (above the largest finite bf16 it saturates to it; round to nearest overflows from the midpoint
 * up, as IEEE). The random bits of element i are a counter-based hash of (seed, step, the 64-bit
 * index0 + i), the same on every path, and the moments' (bf16 and q8) of the same with keys of
 * their own (the master's stream is not the moments' at other indices): an element's result
 * depends only on its inputs and its index, so stepping an array as one call or as calls cut
 * anywhere (at multiples of ZINF_Q8_BLOCK with q8 moments), with index0 and the pointers
 * advanced, on any number of threads, gives the same bytes.
 * The 16-bit copy: with copy_dtype bf16 it is the new master itself (the same bits); with f16 the
 * float update rounded to nearest even (as zinf_adam_step()); with f32 the new master widened.
 * param_copy may be the master array itself (bf16). The moments step exactly as in their own
 * steps, apart from the bf16 moments' hash index (index0 + i here, the index within the call
 * there).
 * b: NULL for the defaults. Returns 0; -EINVAL as zinf_adam_step(), an unknown moments format or
 * rounding, a bad b (size, NULL ranges with n_no_decay > 0, an empty, unsorted or overlapping
 * range) with a message, nothing written; -ENODEV as zinf_adam_step().
 */
ZINF_API int zinf_adam_step_bf16master(const struct zinf_adam_opts *o, int64_t step,
				       float grad_scale, uint16_t *master, const void *grad,
				       enum zinf_dtype grad_dtype, void *exp_avg, void *exp_avg_sq,
				       size_t n, void *param_copy, enum zinf_dtype copy_dtype,
				       const struct zinf_bf16master_opts *b);

/* ---- Adagrad ------------------------------------------------------------------------------ */

struct zinf_adagrad_opts {
	size_t size;			       /* sizeof(struct zinf_adagrad_opts) */
	float lr, lr_decay, eps, weight_decay; /* weight decay is L2 (added to the gradient) */
	int threads;			       /* 0: OpenMP's default */
	const char *simd;		       /* as zinf_adam_opts.simd */
};

/** torch.optim.Adagrad's defaults: lr 1e-2, lr_decay 0, eps 1e-10, weight_decay 0, threads 0,
 * simd NULL. */
ZINF_API void zinf_adagrad_opts_init(struct zinf_adagrad_opts *o);

/**
 * One Adagrad step (step >= 1) as torch.optim.Adagrad: g = grad * grad_scale (+ wd * p),
 * clr = lr / (1 + (step - 1) * lr_decay), h += g * g, p -= clr * g / (sqrt(h) + eps).
 * state_sum (h) starts at the caller's initial accumulator value (torch's default: 0).
 * param_copy/copy_dtype as zinf_adam_step().
 * Returns 0; -EINVAL on bad arguments (as zinf_adam_step()); -ENODEV as zinf_adam_step().
 */
ZINF_API int zinf_adagrad_step(const struct zinf_adagrad_opts *o, int64_t step, float grad_scale,
			       float *param, const void *grad, enum zinf_dtype grad_dtype,
			       float *state_sum, size_t n, void *param_copy,
			       enum zinf_dtype copy_dtype);

/* ---- Lion --------------------------------------------------------------------------------- */

struct zinf_lion_opts {
	size_t size;			      /* sizeof(struct zinf_lion_opts) */
	float lr, beta1, beta2, weight_decay; /* weight decay is decoupled, as AdamW */
	int threads;			      /* 0: OpenMP's default */
	const char *simd;		      /* as zinf_adam_opts.simd */
};

/** Lion's published defaults (as DeepSpeed's FusedLion): lr 1e-4, betas (0.9, 0.99), wd 0,
 * threads 0, simd NULL. */
ZINF_API void zinf_lion_opts_init(struct zinf_lion_opts *o);

/**
 * One Lion step (Chen et al. 2023; DeepSpeed's CPU Lion): g = grad * grad_scale,
 * p *= 1 - lr * wd, c = beta1 * m + (1 - beta1) * g, p -= lr * sign(c) (sign(0) = 0),
 * m = beta2 * m + (1 - beta2) * g. step (>= 1) is validated and otherwise unused: Lion has no
 * bias correction; it is kept so that every optimizer takes the same arguments. A NaN in c gives
 * sign 0 here (PyTorch's sign gives NaN); m becomes NaN either way.
 * Returns 0; -EINVAL on bad arguments (as zinf_adam_step()); -ENODEV as zinf_adam_step().
 */
ZINF_API int zinf_lion_step(const struct zinf_lion_opts *o, int64_t step, float grad_scale,
			    float *param, const void *grad, enum zinf_dtype grad_dtype,
			    float *exp_avg, size_t n, void *param_copy, enum zinf_dtype copy_dtype);

/* ---- gradient helpers --------------------------------------------------------------------- */

/*
 * The helpers' thread count and SIMD path, per call like the optimizers' (no process-wide
 * setting: two callers in one process may want different paths, and a mutable global would be
 * shared state). A struct rather than two arguments, so that both helpers grow together under
 * the size rule; NULL means the defaults.
 */
struct zinf_grad_opts {
	size_t size;	   /* sizeof(struct zinf_grad_opts); set by zinf_grad_opts_init() */
	const char *simd;  /* as zinf_adam_opts.simd */
	int threads;	   /* 0: OpenMP's default */
	uint32_t reserved; /* 0 (a later field, whose 0 will mean its default) */
};

/** threads 0, simd NULL. */
ZINF_API void zinf_grad_opts_init(struct zinf_grad_opts *o);

/**
 * Sum of squares of n gradient values of dtype `dtype`, accumulated in float64 (each square is
 * exact in float64; the additions are in a fixed order per SIMD path, so the result does not
 * depend on the thread count). o: NULL for the defaults. The caller multiplies by
 * grad_scale^2 to unscale. Returns 0 and sets *out; -EINVAL (NULL pointer with n > 0, unknown
 * dtype, a bad o as zinf_adam_step(), threads < 0, reserved not 0, an unknown SIMD path);
 * -ENODEV as zinf_adam_step().
 */
ZINF_API int zinf_grad_sumsq(const void *grad, enum zinf_dtype dtype, size_t n,
			     const struct zinf_grad_opts *o, double *out);

/**
 * Whether any of n gradient values is an infinity or a NaN (fp16 overflow detection).
 * Returns 1 if one is, 0 if none is; -EINVAL or -ENODEV as zinf_grad_sumsq().
 */
ZINF_API int zinf_grad_has_inf_nan(const void *grad, enum zinf_dtype dtype, size_t n,
				   const struct zinf_grad_opts *o);

#ifdef __cplusplus
}
#endif
#endif
