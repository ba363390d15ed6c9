/* SPDX-License-Identifier: Apache-2.0 */
/*
 * comm/comm_single.c: the collectives of a one-rank job, on host buffers, with no
 * dependency. Every call completes when it is posted: an all-gather or reduce-scatter of one
 * rank is a copy, an all-reduce and a broadcast leave the buffer as it is. A 16-bit AVG over
 * one rank is the value itself (the fp32 sum of one exactly widened term, divided by 1,
 * rounds back to it), so no arithmetic is needed to match the contract of zinf/blocks/comm.h.
 */
#include <string.h>

#include "comm/comm_internal.h"

static int
single_open(struct zinf_comm *c)
{
	c->rank = 0;
	c->world = 1;
	c->local_rank = 0;
	c->local_world = 1;
	return 0;
}

static void
single_close(struct zinf_comm *c)
{
}

static int
single_start(struct zinf_comm *c, struct zinf_comm_req *r)
{
	if ((r->d.kind == ZINF_COMM_ALL_GATHER || r->d.kind == ZINF_COMM_REDUCE_SCATTER ||
	     r->d.kind == ZINF_COMM_ALL_TO_ALL) &&
	    r->bytes && r->send != r->recv) {
		memmove(r->recv, r->send, r->bytes);
	}
	return 0;
}

static int
single_poll(struct zinf_comm *c, struct zinf_comm_req *r)
{
	return 1;
}

static void
single_abandon(struct zinf_comm *c, struct zinf_comm_req *r)
{
}

static int
single_exchange(struct zinf_comm *c, const struct zinf_comm_desc *mine, struct zinf_comm_desc *all,
		uint64_t deadline_ns)
{
	all[0] = *mine;
	return 0;
}

const struct zinf_comm_ops zinf_comm_single_ops = {
	.name = "single",
	.open = single_open,
	.close = single_close,
	.start = single_start,
	.poll = single_poll,
	.abandon = single_abandon,
	.exchange = single_exchange,
};
