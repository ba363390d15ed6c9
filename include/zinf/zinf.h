/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zinf/zinf.h: everything a C trainer includes. zinf's installed headers come in two kinds:
 *
 *  - the trainer's API, here: the engine (zinf/engine.h: create from options or from a
 *    ds_config.json, register parameters, init, then per micro-batch fetch / param / release
 *    in forward and backward, grad, step; read_master, the lr and betas, statistics, abort),
 *    DeepSpeed's configuration (zinf/config.h), checkpoints (zinf/checkpoint.h), Hugging Face
 *    safetensors files read and written (zinf/safetensors.h), the lr schedules
 *    (zinf/schedule.h), the device the trainer computes on (zinf/device.h: device memory,
 *    streams, events, copies and casts) and the shared status, logging and dtypes
 *    (zinf/common.h);
 *  - the building blocks (zinf/blocks/): the I/O engine, swap files, the pinned pool, the
 *    tensor store and the pipelined optimizer step, the CPU optimizers, the collectives and the
 *    loss scaler, for tools and engines made of zinf's parts (the zinf command's benchmarks use
 *    them). zinf/engine.h includes those whose option types its options embed.
 *
 * Everything returns 0 (or a count) or a negative errno with a message (zinf_last_error); the
 * library never prints, exits or aborts.
 */
#ifndef ZINF_ZINF_H
#define ZINF_ZINF_H

#include "zinf/checkpoint.h"
#include "zinf/common.h"
#include "zinf/config.h"
#include "zinf/device.h"
#include "zinf/engine.h"
#include "zinf/safetensors.h"
#include "zinf/schedule.h"

#endif
