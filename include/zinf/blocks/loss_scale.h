/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zinf/blocks/loss_scale.h: fp16 loss scaling as DeepSpeed's DynamicLossScaler and LossScaler
 * define it (deepspeed/runtime/fp16/loss_scaler.py), driven by the fp16 block of ds_config.json. A
 * building block (zinf/blocks/): for tools and engines made of zinf's parts; a trainer needs none
 * of it beyond the option types zinf/engine.h takes from it.
 *
 * Dynamic (fp16.loss_scale == 0): the scale starts at 2^initial_scale_power. An overflowed step
 * is skipped; the scale halves (never below min_loss_scale) when `hysteresis` overflows have
 * been seen (counted down per overflow, reset to `hysteresis` when the scale grows, or after
 * every clean step with consecutive_hysteresis). After loss_scale_window clean iterations since
 * the last overflow (or since the start) the scale doubles. An overflow when the scale is
 * already at min_loss_scale and would be lowered is an error, as DeepSpeed raises one.
 * Static (loss_scale > 0): the scale never changes; an overflowed step is still skipped (as
 * DeepSpeed's ZeRO optimizers do).
 *
 * Not here: detecting the overflow (the engine's), bf16 (no scaling).
 */
#ifndef ZINF_LOSS_SCALE_H
#define ZINF_LOSS_SCALE_H

#include <stdbool.h>
#include <stdint.h>

#include "zinf/common.h"

#ifdef __cplusplus
extern "C" {
#endif

/** ds_config.json's fp16 block, DeepSpeed's defaults. */
struct zinf_fp16_opts {
	bool enabled;		      /* default false */
	bool auto_cast;		      /* default false (read; the trainer casts its inputs) */
	bool consecutive_hysteresis;  /* default false */
	uint8_t reserved[5];	      /* zero */
	double loss_scale;	      /* 0 (default): dynamic; > 0: this static scale */
	uint32_t initial_scale_power; /* dynamic start 2^this; default 16 */
	uint32_t loss_scale_window;   /* clean iterations before doubling; default 1000 */
	uint32_t hysteresis;	      /* overflows before halving (delayed shift); default 2 */
	uint32_t reserved2;	      /* zero */
	double min_loss_scale;	      /* default 1 */
};

/** Fill *o with DeepSpeed's defaults. */
ZINF_API void zinf_fp16_opts_init(struct zinf_fp16_opts *o);

/** The scaler's state (caller-owned; zinf_loss_scaler_init fills it). */
struct zinf_loss_scaler {
	double scale;	  /* current loss scale */
	double min_scale; /* min_loss_scale */
	double factor;	  /* 2 */
	bool dynamic;	  /* false: static scale */
	bool consecutive_hysteresis;
	uint8_t reserved[6];
	uint32_t window;	 /* loss_scale_window */
	uint32_t hysteresis;	 /* delayed shift */
	uint32_t cur_hysteresis; /* overflows left before the next halving */
	uint32_t reserved2;
	int64_t iter;	       /* updates so far */
	int64_t last_overflow; /* iteration of the last overflow; -1: none */
	uint64_t overflows;    /* skipped steps so far */
};

/**
 * Set up *ls from an fp16 block (enabled or not: the caller decides whether to scale).
 * Returns 0, or -EINVAL (NULL, initial_scale_power > 1023, window 0, hysteresis 0,
 * min_loss_scale <= 0, loss_scale < 0 or not finite) with a message naming the key.
 */
ZINF_API int zinf_loss_scaler_init(struct zinf_loss_scaler *ls, const struct zinf_fp16_opts *fp16);
/**
 * Account for one optimizer step whose gradients did (overflow) or did not overflow. Returns 1:
 * skip this step (overflow); 0: take it; -ERANGE: overflow with the scale already at
 * min_loss_scale (DeepSpeed stops the run there; the state is left as it was); -EINVAL: NULL.
 */
ZINF_API int zinf_loss_scaler_update(struct zinf_loss_scaler *ls, bool overflow);
/** The current scale (the loss is multiplied by it; gradients are divided by it). */
ZINF_API double zinf_loss_scaler_scale(const struct zinf_loss_scaler *ls);

#ifdef __cplusplus
}
#endif
#endif
