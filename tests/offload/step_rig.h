/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/offload/step_rig.h: a zinf_step for the offload tests of its sub-group calls
 * (test_step_skip.c, test_step_visit.c, test_step_before.c): an I/O context, a swap space in a
 * scratch directory, AdamW (lr 0.01), two pool buffers of one sub-group each (none on the CPU
 * tier, which needs none, unless a copy_fn is given), n elements in sub-groups of sgs, the
 * callbacks of rig_init_hooks. rig_fini checks that every buffer is back.
 */
#ifndef ZINF_TEST_STEP_RIG_H
#define ZINF_TEST_STEP_RIG_H

#include <criterion/criterion.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "common/util.h"
#include "offload/swap_rig.h"
#include "zinf/blocks/offload.h"

struct rig {
	char *dir;
	struct zinf_io *io;
	struct zinf_swap *swap;
	struct zinf_pool *pool;
	struct zinf_step *st;
	struct zinf_optimizer *opt;
};

/* The step's callbacks (test_step_before.c); NULL: none. With copy_fn the CPU tier gets two
 * pool buffers too (they carry the copy). */
struct rig_hooks {
	zinf_step_before_fn before_fn;
	void *before_ctx;
	zinf_step_copy_fn copy_fn;
	void *copy_ctx;
	bool before_size; /* options of the size before before_fn (an older caller's) */
	bool deepspeed;	  /* schedule ZINF_SCHEDULE_DEEPSPEED */
	bool fault;	  /* the "fault" I/O backend (zinf_io_fault_add on r->io) */
};

static inline void
rig_init_hooks(struct rig *r, enum zinf_tier tier, uint64_t n, uint64_t sgs,
	       const struct rig_hooks *h)
{
	memset(r, 0, sizeof(*r));
	swap_rig_open(0, h && h->fault, &r->dir, &r->io, &r->swap);
	struct zinf_optimizer_opts oo;
	zinf_optimizer_opts_init(&oo, ZINF_OPTIM_ADAMW);
	oo.lr = 0.01f;
	cr_assert_eq(zinf_optimizer_create(&oo, &r->opt), 0, "%s", zinf_last_error());
	struct zinf_step_opts so;
	zinf_step_opts_init(&so);
	so.n = n;
	so.sub_group_size = sgs;
	so.tier = tier;
	so.swap = r->swap;
	so.optimizer = r->opt;
	if (h) {
		so.before_fn = h->before_fn;
		so.before_ctx = h->before_ctx;
		so.copy_fn = h->copy_fn;
		so.copy_ctx = h->copy_ctx;
		if (h->before_size) {
			so.size = offsetof(struct zinf_step_opts, before_fn);
		}
		if (h->deepspeed) {
			so.schedule = ZINF_SCHEDULE_DEEPSPEED;
		}
	}
	struct zinf_pool_opts po;
	zinf_pool_opts_init(&po);
	po.buffer_bytes = zinf_step_buffer_bytes(&so, zinf_swap_align(r->swap));
	po.buffer_count = po.buffer_bytes ? 2 : 0; /* the CPU tier needs none */
	if (tier == ZINF_TIER_CPU) {
		po.cpu_bytes = 3 * ZINF_ALIGN_UP(n * 4, 4096);
	}
	po.io = r->io;
	cr_assert_eq(zinf_pool_create(&po, &r->pool), 0, "%s", zinf_last_error());
	so.pool = r->pool;
	cr_assert_eq(zinf_step_create(&so, &r->st), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_swap_reserve(r->swap), 0, "%s", zinf_last_error());
}

static inline void
rig_init(struct rig *r, enum zinf_tier tier, uint64_t n, uint64_t sgs)
{
	rig_init_hooks(r, tier, n, sgs, NULL);
}

static inline void
rig_fini(struct rig *r)
{
	cr_assert_eq(zinf_pool_free_count(r->pool), zinf_pool_buffer_count(r->pool),
		     "a buffer leaked");
	zinf_step_destroy(r->st);
	zinf_optimizer_destroy(r->opt);
	zinf_pool_destroy(r->pool);
	zinf_swap_destroy(r->swap);
	zinf_io_destroy(r->io);
	zt_rmtree(r->dir);
	free(r->dir);
}

#endif
