/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_state.c: the optimizer state of a sub-group as host memory, wherever its tier
 * keeps it (engine_module.h's state visitor, which checkpoints use to save and load): the
 * pinned CPU tier in place, NVMe through one of the optimizer pool's buffers (zinf_step_visit),
 * the GPU in pieces through a bounce buffer.
 */
#include "engine/engine_internal.h"

struct visit_nvme {
	struct zinf_engine *e;
	eng_visit_fn fn;
	void *ctx;
};

static int
visit_nvme_cb(void *ctx, uint32_t k, void *const parts[], uint64_t len)
{
	struct visit_nvme *v = ctx;
	(void)len;
	return v->fn(v->ctx, eng_sg_start(v->e, k), v->e->sg_end[k] - eng_sg_start(v->e, k), parts);
}

size_t
eng_state_bounce_bytes(const struct zinf_engine *e)
{
	return e->otier == ZINF_OFFLOAD_NONE
		       ? (size_t)ZINF_STEP_CHUNK * zinf_optimizer_state_bytes(e->opt)
		       : 0;
}

int
eng_state_visit(struct zinf_engine *e, uint32_t k, bool write, eng_visit_fn fn, void *ctx,
		void *bounce, struct zinf_stream *cs)
{
	cs = cs ? cs : e->cs;
	uint64_t start = eng_sg_start(e, k), end = e->sg_end[k];
	void *parts[ZINF_OPTIM_MAX_PARTS] = {NULL};
	if (e->otier == ZINF_OFFLOAD_NVME) {
		struct visit_nvme v = {e, fn, ctx};
		return zinf_step_visit(e->step, k,
				       write ? ZINF_STEP_VISIT_WRITE : ZINF_STEP_VISIT_READ,
				       visit_nvme_cb, &v);
	}
	if (e->otier == ZINF_OFFLOAD_CPU) {
		for (uint32_t i = 0; i < e->nparts; i++) {
			parts[i] =
				(char *)e->state[i] + start * zinf_optimizer_part_bytes(e->opt, i);
		}
		return fn(ctx, start, end - start, parts);
	}
	/* the GPU: ZINF_STEP_CHUNK elements at a time through the bounce buffer */
	int ret = 0;
	for (uint64_t off = start; off < end && !ret; off += ZINF_STEP_CHUNK) {
		uint64_t n = ZINF_MIN((uint64_t)ZINF_STEP_CHUNK, end - off);
		char *b = bounce;
		for (uint32_t i = 0; i < e->nparts; i++) {
			parts[i] = b;
			b += (size_t)ZINF_STEP_CHUNK * zinf_optimizer_part_bytes(e->opt, i);
		}
		for (uint32_t i = 0; i < e->nparts && !write && !ret; i++) {
			size_t pb = zinf_optimizer_part_bytes(e->opt, i);
			ret = zinf_device_copy(cs, parts[i], (char *)e->state[i] + off * pb, n * pb,
					       ZINF_COPY_D2H);
		}
		if (!ret && !write) {
			ret = zinf_stream_sync(cs);
		}
		if (!ret) {
			ret = fn(ctx, off, n, parts);
		}
		for (uint32_t i = 0; i < e->nparts && write && !ret; i++) {
			size_t pb = zinf_optimizer_part_bytes(e->opt, i);
			ret = zinf_device_copy(cs, (char *)e->state[i] + off * pb, parts[i], n * pb,
					       ZINF_COPY_H2D);
		}
		if (!ret && write) {
			ret = zinf_stream_sync(cs);
		}
	}
	return ret;
}
