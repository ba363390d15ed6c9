/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_fetch.c: zinf_engine_fetch, release and param. Stages 0-2 keep every tensor
 * gathered, so fetch and release only record the order. Stage 3: a fetch gathers the layer
 * (engine_gather.c: each partition from its home into a gathered buffer, all-gathered in place)
 * and waits for it; release gives the buffers back after an event on the compute stream. With
 * comm_check every rank first agrees on the layer. Along a valid trace (engine_trace.c) a fetch
 * then gathers the following layers ahead, and a release keeps a layer that is fetched again
 * within stage3_max_reuse_distance elements. Gathered copies not fetched are dropped after
 * each optimizer step (eng_fetch_drop_all).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/engine_internal.h"

/*
 * comm_check: every rank fetches the same layer, or every rank fails naming it. The id goes as
 * two 16-bit halves (exact in fp32, which an id above 2^24 is not) with their negations: the
 * MAX of each equals this rank's only if every rank sent the same. Through device memory
 * (eng_all_max), so that it runs on "nccl" too.
 */
static int
check_layer(struct zinf_engine *e, int32_t layer)
{
	uint32_t hi = (uint32_t)layer >> 16, lo = (uint32_t)layer & 0xffffu;
	float v[4] = {(float)hi, -(float)hi, (float)lo, -(float)lo};
	int ret = eng_all_max(e, v, 4);
	if (ret) {
		return ENG_FAIL(e, ret, "fetch: layer %d, step %" PRId64, layer, e->steps + 1);
	}
	if (v[0] != (float)hi || -v[1] != (float)hi || v[2] != (float)lo || -v[3] != (float)lo) {
		int64_t top = (int64_t)v[0] * 65536 + (int64_t)v[2];
		int64_t bot = (int64_t)-v[1] * 65536 + (int64_t)-v[3];
		/* every rank compared the same MAX: every rank fails here, no notice */
		return eng_known(e,
				 ENG_FAIL(e, -EPROTO,
					  "fetch: ranks fetched different layers at step %" PRId64
					  ": this rank layer %d, others' halves up to %" PRId64
					  " and down to %" PRId64,
					  e->steps + 1, layer, top, bot));
	}
	return 0;
}

void
eng_fetch_start(struct zinf_engine *e)
{
	for (uint32_t i = 0; i < e->n_params; i++) {
		if (e->params[i].persistent) {
			e->fx.persistent_elems += e->params[i].part.padded;
		}
	}
	e->fx.tr_state = e->o.record_trace ? TRACE_RECORDING : TRACE_NONE;
	e->fx.live_elems = e->fx.persistent_elems;
	e->fx.peak_live = e->fx.live_elems;
}

/* After an optimizer step every gathered copy is stale: drop those not fetched. */
int
eng_fetch_drop_all(struct zinf_engine *e)
{
	int ret = 0;
	for (uint32_t i = 0; i < e->n_layers; i++) {
		struct elayer *l = &e->layers[i];
		if (l->gathered && !l->fetched) {
			int r2 = eng_gather_drop(e, l);
			ret = ret ? ret : r2;
		}
	}
	eng_gather_trim(e);
	return ret;
}

static int
fetch_layer(struct zinf_engine *e, int32_t layer)
{
	int ret = 0;
	struct elayer *l = eng_layer(e, layer);
	if (!l || l->fetched) {
		return ENG_FAIL(e, -EINVAL, "fetch: layer %d %s", layer,
				l ? "is already fetched" : "is unknown");
	}
	for (uint32_t i = 0; e->w.sg_handed && i < l->n; i++) {
		struct eparam *p = &e->params[l->params[i]];
		if (e->w.sg_handed[p->sg]) {
			return ENG_FAIL(
				e, -EINVAL,
				"fetch: layer %d again after its gradients: parameter \"%s\" "
				"(sub-group %u) is being stepped; a layer is fetched once in "
				"backward (tied weights belong to one layer)",
				layer, p->name, p->sg);
		}
	}
	double t0 = zinf_now_s();
	if (e->window_t0 < 0) {
		e->window_t0 = t0;
	}
	if (e->o.stage < 3) {
		l->fetched = true;
		return 0;
	}
	if (e->o.comm_check && (ret = check_layer(e, layer))) {
		return ret;
	}
	if ((ret = eng_trace_fetch(e, layer))) {
		return ret; /* the others gather this layer: they are told */
	}
	if (!l->gathered && l->gather_elems > 0) {
		/* make room: drop layers kept or prefetched but not fetched */
		for (uint32_t i = 0; i < e->n_layers && !ret; i++) {
			struct elayer *k = &e->layers[i];
			if (e->fx.live_elems + l->gather_elems <= e->o.stage3_max_live_parameters) {
				break;
			}
			if (k->gathered && !k->fetched && k != l) {
				ret = eng_gather_drop(e, k);
			}
		}
		if (ret) {
			return ENG_FAIL(e, ret, "fetch: layer %d: %s", layer, eng_cause(e));
		}
		if (e->fx.live_elems + l->gather_elems > e->o.stage3_max_live_parameters &&
		    !e->fx.warned_live) {
			e->fx.warned_live = true;
			ENG_WARN(e,
				 "fetch: layer %d (%" PRIu64 " elements) with %" PRIu64
				 " live passes stage3_max_live_parameters (%" PRIu64
				 "); fetched anyway (warned once)",
				 layer, l->gather_elems, e->fx.live_elems,
				 e->o.stage3_max_live_parameters);
		}
		ret = eng_gather_start(e, l);
	}
	if (!ret) {
		ret = eng_gather_finish(e, l);
	}
	if (l->prefetched) {
		e->fx.pf_inflight -= l->gather_elems;
		l->prefetched = false;
	}
	if (ret) {
		char why[512]; /* the cause, before eng_gather_drop() may log something else */
		snprintf(why, sizeof(why), "%s", eng_cause(e));
		eng_gather_drop(e, l);
		return ENG_FAIL(e, ret, "fetch: layer %d: %s", layer, why);
	}
	l->fetched = true;
	ret = eng_prefetch(e); /* synchronous parts of the prefetch: the trainer waits too */
	e->win.exposed_fetch_s += zinf_now_s() - t0;
	if (ret) {
		return ENG_FAIL(e, ret, "prefetch after layer %d: %s", layer, eng_cause(e));
	}
	return 0;
}

int
zinf_engine_fetch(struct zinf_engine *e, int32_t layer)
{
	int ret = eng_begin(e, "fetch", ENG_FAILS, true);
	return ret ? ret : eng_return(e, fetch_layer(e, layer));
}

static int
release_layer(struct zinf_engine *e, int32_t layer)
{
	struct elayer *l = eng_layer(e, layer);
	if (!l || !l->fetched) {
		return ENG_FAIL(e, -EINVAL, "release: layer %d %s", layer,
				l ? "is not fetched" : "is unknown");
	}
	l->fetched = false;
	if (eng_pass_last(e)) {
		eng_worker_pump(e); /* sub-groups of this layer may be final */
	}
	if (e->o.stage < 3 || !l->gathered) {
		return 0;
	}
	/* kept when the trace fetches it again soon and the live bound allows */
	if (e->fx.tr_state == TRACE_VALID &&
	    eng_reuse_distance(e, e->fx.cursor, layer) <= e->o.stage3_max_reuse_distance &&
	    e->fx.live_elems <= e->o.stage3_max_live_parameters) {
		return 0;
	}
	return eng_gather_drop(e, l);
}

int
zinf_engine_release(struct zinf_engine *e, int32_t layer)
{
	int ret = eng_begin(e, "release", ENG_FAILS, true);
	return ret ? ret : eng_return(e, release_layer(e, layer));
}

static int
param_ptr(struct zinf_engine *e, uint32_t id, void **dev)
{
	if (id >= e->n_params || !dev) {
		return ENG_FAIL(e, -EINVAL, "param: %s", dev ? "unknown parameter id" : "NULL dev");
	}
	struct eparam *p = &e->params[id];
	if (!p->dev_full ||
	    (e->o.stage == 3 && !p->persistent && !eng_layer(e, p->layer)->fetched)) {
		return ENG_FAIL(e, -EINVAL, "param: parameter \"%s\": layer %d is not fetched",
				p->name, p->layer);
	}
	*dev = p->dev_full;
	return 0;
}

int
zinf_engine_param(struct zinf_engine *e, uint32_t id, void **dev)
{
	int ret = eng_begin(e, "param", ENG_FAILS, true);
	return ret ? ret : eng_return(e, param_ptr(e, id, dev));
}
