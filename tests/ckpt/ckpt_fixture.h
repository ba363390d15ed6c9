/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/ckpt/ckpt_fixture.h: a checkpoint written by hand, following docs/CHECKPOINT.md to the
 * letter (not through the engine): 3 parameters of uneven sizes (one smaller than the world),
 * Adam parts fp32/exp_avg/exp_avg_sq, known values, padding zero, the partitions of the two
 * stored ranks in opposite orders so that a wrong offset reads a wrong value. Shared by the
 * reader's tests and the CLI's.
 */
#ifndef ZINF_TESTS_CKPT_FIXTURE_H
#define ZINF_TESTS_CKPT_FIXTURE_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "zinf/common.h"

#define FX_PARAMS 3
#define FX_PARTS  3

struct fx_opts {
	int files_world;	 /* 2 (stage 3) or 1 (stage 0, world 2) */
	enum zinf_dtype state;	 /* dtype of exp_avg and exp_avg_sq: ZINF_F32 or ZINF_BF16 */
	bool latest;		 /* write DIR/latest */
	void (*edit)(json_t *m); /* change the manifest before it is written (NULL: none) */
};
void fx_opts_init(struct fx_opts *o);

/* Parameter i's name, numel, ndim and shape (ndim 1 with no "shape" key for parameter 0). */
extern const char *const fx_name[FX_PARAMS];
extern const uint64_t fx_numel[FX_PARAMS];
extern const uint32_t fx_ndim[FX_PARAMS];
extern const uint64_t fx_shape[FX_PARAMS][2];
extern const char *const fx_part[FX_PARTS];

/* The value of parameter i, part p, element j, as written before any rounding to the part's
 * dtype: i*1000 + j + 0.25 for the master, negated for exp_avg, + 0.75 for exp_avg_sq. */
double fx_value(int i, int p, uint64_t j);

/* Write DIR/TAG (and DIR/latest when asked). Asserts on failure. */
void fx_write(const char *dir, const char *tag, const struct fx_opts *o);

/* Write DIR/TAG/manifest.crc32c for the manifest.json there (after a test edits it). */
void fx_manifest_crc(const char *dir, const char *tag);
/* The same for the tag directory TAGDIR (DIR/TAG). */
void fx_reseal(const char *tagdir);
/* "DIR/TAG/name" into buf. */
void fx_path(char *buf, size_t len, const char *dir, const char *tag, const char *name);

#endif
