/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_plan.c: zinf_engine_plan, what an engine of given options and parameters will
 * allocate on each rank, computed by the engine's own code on an engine that never opens a
 * device, a communicator or a file: create's option checks and tier choice, registration,
 * init's layout (engine_param.c: partitions, persistence, the flat partition, sub-groups), the
 * buckets' capacity (engine_init.c) and each pool's sizes from the function its tier's setup
 * sizes it by (the tiers' pool op, eng_gwin_pool), totalled by zinf_pool_size as
 * zinf_pool_create totals them. What it does not hold: device memory (the plan's caller
 * estimates it), swap file bytes.
 */
#include <errno.h>
#include <string.h>

#include "common/opts.h"
#include "engine/engine_internal.h"

ZINF_OPTS_NO_TAIL_PAD(struct zinf_engine_plan, optim_nvme_state_bytes);

/* One pool's sizes as zinf_pool_create will total them. */
static int
pool_size(const struct zinf_pool_opts *po, uint64_t *bytes, uint64_t *buffer_bytes,
	  uint32_t *buffers)
{
	struct zinf_pool_budget b;
	int ret = zinf_pool_size(po, &b); /* not judged against this machine: the caller does */
	if (ret) {
		return ret;
	}
	*bytes = b.bytes;
	*buffer_bytes = po->buffer_count ? b.buffer_bytes : 0;
	*buffers = po->buffer_count;
	return 0;
}

static int
plan(struct zinf_engine *e, const struct zinf_param_desc *params, uint32_t n, uint32_t align,
     struct zinf_engine_plan *p)
{
	int ret = zinf_optimizer_create(&e->o.optimizer, &e->opt);
	if (ret) {
		return ret;
	}
	e->nparts = zinf_optimizer_part_count(e->opt);
	for (uint32_t i = 0; i < n; i++) {
		if ((ret = zinf_engine_add_param(e, &params[i])) < 0) {
			return ret;
		}
	}
	if ((ret = eng_build_layers(e)) || (ret = eng_build_partitions(e)) ||
	    (ret = eng_param_fit(e))) {
		return ret;
	}
	e->gr.bucket_cap = eng_bucket_cap(e);
	struct zinf_pool_opts po;
	if (e->pt->pool(e, align, &po) &&
	    (ret = pool_size(&po, &p->param_pool_bytes, &p->param_buffer_bytes,
			     &p->param_buffers))) {
		return ret;
	}
	if (e->ot->pool(e, &eng_step_needs, align, &po) &&
	    (ret = pool_size(&po, &p->optim_pool_bytes, &p->optim_buffer_bytes,
			     &p->optim_buffers))) {
		return ret;
	}
	uint64_t unused;
	if (eng_gwin_pool(e, align, &po) &&
	    (ret = pool_size(&po, &p->grad_window_bytes, &unused, &p->grad_window_slots))) {
		return ret;
	}
	p->host_pool_bytes = p->param_pool_bytes + p->optim_pool_bytes + p->grad_window_bytes;
	p->partition_elems = e->flat_n;
	p->sub_groups = e->n_sg;
	p->max_sub_group_elems = e->max_sg;
	p->bucket_elems = e->gr.bucket_cap;
	/* the reserve's alignment: the swap space's on NVMe, else 4096 (engine_spec.c) */
	p->speculation_bytes = eng_spec_bytes(e, e->ot->window ? align : 4096);
	/* as zinf_step_create declares them: each sub-group's parts, a shared master excluded */
	for (uint32_t k = 0; e->ot == &eng_otier_nvme && k < e->n_sg; k++) {
		for (uint32_t i = eng_master_shared(e) ? 1 : 0; i < e->nparts; i++) {
			p->optim_nvme_state_bytes += zinf_optimizer_part_size(
				e->opt, i, e->sg_end[k] - eng_sg_start(e, k));
		}
	}
	return 0;
}

int
zinf_engine_plan(const struct zinf_engine_opts *opts, int world, uint32_t align,
		 const struct zinf_param_desc *params, uint32_t n, struct zinf_engine_plan *out)
{
	if (!opts || !out || (n && !params) || world < 1 || (align & (align - 1))) {
		return ZINF_FAIL(
			-EINVAL,
			"engine plan: NULL options or out, world %d (at least 1), align %u "
			"(a power of two or 0)",
			world, align);
	}
	struct zinf_engine *e = zc_calloc(1, sizeof(*e));
	if (!e) {
		return ZINF_FAIL(-ENOMEM, "engine plan: out of memory");
	}
	e->ps.nv_open = -1;
	zinf_engine_opts_init(&e->o);
	struct zinf_engine_plan p;
	memset(&p, 0, sizeof(p));
	p.size = sizeof(p);
	int ret = zc_opts_take(&e->o, sizeof(e->o), opts, "zinf_engine_opts");
	if (!ret && !(ret = eng_check_opts(&e->o)) && !(ret = eng_clip_init(e))) {
		/* rank 0 of `world`: every rank's partitions are padded to the same size */
		e->world = world;
		e->W = e->o.stage == 0 ? 1 : world;
		eng_choose_tiers(e);
		ret = plan(e, params, n, align ? ZINF_MAX(align, 4096u) : 4096, &p);
	}
	zinf_engine_destroy(e); /* opened nothing: frees what the layout made */
	return ret ? ret : zc_stats_give(out, &p, sizeof(p), "zinf_engine_plan");
}
