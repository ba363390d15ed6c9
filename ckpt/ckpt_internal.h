/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ckpt/ckpt_internal.h: what the engine's load (and save) use of the offline reader
 * (ckpt_read.c) beyond the public zinf_ckpt_* calls: the parsed manifest itself (every field
 * docs/CHECKPOINT.md lists has been checked for presence and type by zinf_ckpt_open, so its
 * values can be read without further checks) and the path of a listed file. Not installed.
 */
#ifndef ZINF_ENGINE_CKPT_INTERNAL_H
#define ZINF_ENGINE_CKPT_INTERNAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "zinf/checkpoint.h"

/*
 * The manifest as parsed (borrowed: valid until zinf_ckpt_close), without "params": the
 * parameters are read from its text one at a time and kept in the handle (zinf_ckpt_param).
 * Checked by zinf_ckpt_open:
 * format, version, tag, world, files_world, stage, dtype, steps, micro_steps, skipped_steps,
 * lr (a number), betas (2 numbers, where present), loss_scaler {scale number, good_steps,
 * hysteresis_left, overflows integers >= 0; iter >= 0 and last_overflow >= -1 where present},
 * optimizer {kind, state_dtype strings; lr, beta1, beta2, eps, weight_decay numbers and
 * bias_correction a boolean where present}, parts, ranks, files, client_bytes (with
 * client.bin listed when > 0), safetensors (listed when present); created and options, when
 * present, a string and an object.
 */
const json_t *ckpt_manifest(const struct zinf_ckpt *c);
/* Stored ranks (1 at stage 0, else the world that saved it). */
int32_t ckpt_files_world(const struct zinf_ckpt *c);
/* "<TAG dir>/<name>" into buf (len bytes). Returns 0, or -ENAMETOOLONG. */
int ckpt_path(const struct zinf_ckpt *c, const char *name, char *buf, size_t len);
/* Index of the listed file `name`, or -ENOENT. */
int ckpt_file_find(const struct zinf_ckpt *c, const char *name);
/* len bytes at off of listed file k, whole, through the handle's descriptor (opened as every
 * file of the checkpoint is: in its directory, no symbolic link, a regular file). Returns 0, or
 * a negative errno naming the file (-EBADMSG: it ends before off + len). */
int ckpt_read_file(struct zinf_ckpt *c, uint32_t k, void *buf, size_t len, uint64_t off);
/* Whether a directory entry's name is r<5 digits>.<part> (a rank's file of a part; the part's
 * name [A-Za-z0-9_-], 1-64 bytes): what the manifest's size bound counts. Any NUL-terminated
 * string, however short. */
bool ckpt_rank_file_name(const char *s);

#endif
