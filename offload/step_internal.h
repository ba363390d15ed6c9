/* SPDX-License-Identifier: Apache-2.0 */
/*
 * offload/step_internal.h: the step object shared by step.c (the object, its parts, load and
 * save, the CPU tier) and step_pipe.c (the pool-buffer slots and their I/O: the NVMe tier, and
 * the CPU tier's copy to the parameter files). Not installed.
 */
#ifndef ZINF_STEP_INTERNAL_H
#define ZINF_STEP_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "offload/offload_internal.h"
#include "zinf/blocks/offload.h"
#include "zinf/blocks/optimizer.h"

/* Parts a sub-group may move: the optimizer's, plus the parameter copy. */
#define STEP_MAXP (ZINF_OPTIM_MAX_PARTS + 1)

enum slot_state { SLOT_FREE = 0, SLOT_READING, SLOT_LOADED, SLOT_WRITING };

struct slot {
	char *buf; /* pool buffer, st->buf_bytes used */
	enum slot_state state;
	int64_t sg;	 /* sub-group held, -1 when FREE */
	uint64_t seq;	 /* order in which writes started (oldest completes first) */
	uint32_t p0, p1; /* parts [p0, p1) in flight */
	int epart;	 /* first part whose operation failed (-1: none) */
	char emsg[384];	 /* that operation's message, taken when the swap space logged it */
	struct zinf_swap_op ops[STEP_MAXP];
};

struct zinf_step {
	struct zinf_step_opts o;
	char name[64]; /* "optimizer step (rank 3, 10 sub-groups)", for messages */
	char param_kind[32];
	const struct zinf_optimizer *opt;
	struct zinf_optimizer *own_opt; /* opts.optimizer NULL: the default, freed with the step */
	uint32_t nopt;			/* optimizer parts; the copy (param_swap) is part nopt */
	uint32_t nparts;		/* nopt, + 1 with param_swap */
	uint32_t esz[STEP_MAXP];	/* bytes per element of each part (q8: 1, the codes; sizes
					   and offsets come from step_bytes and step_cpu_off) */
	const char *kind[STEP_MAXP];	/* state kind of each part */
	uint64_t n, sgsize;		/* sgsize: elements of the largest sub-group */
	uint32_t nsg;
	uint64_t *ends; /* per sub-group: its end (copied from opts, or cut from sub_group_size) */
	uint32_t align;
	uint64_t part_off[STEP_MAXP]; /* offsets inside a slot buffer */
	uint64_t buf_bytes;
	int *ids;	  /* swap ids, STEP_MAXP per sub-group (-1: none) */
	uint64_t *q8_off; /* q8 state: nsg + 1 byte offsets of the sub-groups in a CPU-tier q8 part
			     (each sub-group is its own q8 array, its blocks from its start);
			     NULL without q8 */
	int64_t *written; /* per sub-group: last step durably written */

	/* CPU tier: each optimizer part for the whole partition */
	char *cpu[ZINF_OPTIM_MAX_PARTS];
	bool cpu_owned;

	/* the step in progress */
	bool in_step;
	int64_t t;
	float grad_scale;
	char *copy_host;
	bool reverse;
	uint8_t *done;	  /* per sub-group: the optimizer ran this step */
	int32_t *sg_slot; /* per sub-group: slot index or -1 */
	struct slot *slots;
	uint32_t nslots;
	uint32_t pf_pos; /* next position (in processing order) to consider for a read */
	uint64_t wseq;
	int err;
	char errmsg[640];
	struct zinf_step_stats stats;
};

/* The copy goes through the slot buffers: to the parameter tier's files, or to copy_fn. */
static inline bool
step_opts_slot_copy(const struct zinf_step_opts *o)
{
	return o->param_swap || o->copy_fn;
}

/* Part p is moved by the step's I/O: not an external part (opts.external_parts), which the
 * caller keeps and fill_fn fills. */
static inline bool
step_part_io(const struct zinf_step *st, uint32_t p)
{
	return p >= st->nopt || !(st->o.external_parts & (1u << p));
}

/* Fill sub-group k's external parts (base[i]: part i) through opts.fill_fn; its failure is
 * returned (and logged naming the part), not recorded as the step's error. */
int step_fill(struct zinf_step *st, uint32_t k, char *const base[]);

/* The step moves data through pool-buffer slots: state on NVMe, or the copy leaves the step. */
static inline bool
step_uses_slots(const struct zinf_step *st)
{
	return st->o.tier == ZINF_TIER_NVME || step_opts_slot_copy(&st->o);
}

/* Called between two optimizer calls on sub-group k (look at the I/O). */
typedef void (*step_between_fn)(struct zinf_step *st, uint32_t k);

/*
 * Run the optimizer over sub-group k in ZINF_STEP_CHUNK pieces: base[i] points at the sub-group's
 * first element of part i, copy (may be NULL) at its copy. Returns 0 or the kernel's error.
 */
int step_optim_sub_group(struct zinf_step *st, uint32_t k, char *const base[], const char *grad,
			 enum zinf_dtype gdt, char *copy, step_between_fn between);
/* Record the step's first error: the sub-group, its elements, what failed and why. */
int step_note_err(struct zinf_step *st, int rc, uint32_t k, const char *what, const char *why);
int step_swap_id(const struct zinf_step *st, uint32_t k, uint32_t part);
/* Show sub-group k's state (base[i]: part i) to opts.before_fn (if any), before the optimizer
 * runs on it; its failure is the step's error. */
int step_before(struct zinf_step *st, uint32_t k, char *const base[]);
/* Hand sub-group k's copy to opts.copy_fn (if any); its failure is the step's error. */
int step_give_copy(struct zinf_step *st, uint32_t k, const char *copy);

/* step_pipe.c */
int step_take_buffers(struct zinf_step *st);
int step_abort_slots(struct zinf_step *st);
/* Sub-group k (not made ready) gives up the slot a read ahead took for it. */
void step_drop_slot(struct zinf_step *st, uint32_t k);
int step_ready_nvme(struct zinf_step *st, uint32_t k, const char *grad, enum zinf_dtype gdt,
		    char *host);
int step_ready_cpu_swap(struct zinf_step *st, uint32_t k, const char *grad, enum zinf_dtype gdt,
			char *host);

/* Bytes that n elements of part p take (the copy: n * its element size; a q8 part: its blocks,
 * zinf_optimizer_part_size). Inside a sub-group, element i0 (a multiple of ZINF_STEP_CHUNK, so of
 * ZINF_Q8_BLOCK) starts at step_bytes(st, p, i0). */
static inline uint64_t
step_bytes(const struct zinf_step *st, uint32_t p, uint64_t n)
{
	return p < st->nopt ? zinf_optimizer_part_size(st->opt, p, n) : n * st->esz[p];
}

/* The byte offset of sub-group k in the CPU-tier array of optimizer part p. */
static inline uint64_t
step_cpu_off(const struct zinf_step *st, uint32_t p, uint32_t k)
{
	return st->q8_off && zinf_optimizer_part_align(st->opt, p) > 1
		       ? st->q8_off[k]
		       : zinf_step_sub_group_start(st, k) * st->esz[p];
}

#endif
