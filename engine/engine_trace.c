/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_trace.c: stage 3's fetch trace and prefetch. The first micro-batch records the
 * order of fetches; later ones follow it (hits); a difference invalidates it (counted, warned
 * once per engine, recorded again from the next micro-batch). Along a valid trace, after each
 * fetch the following layers are gathered ahead (all-gathers left in flight) within
 * stage3_prefetch_bucket_size elements in flight and stage3_max_live_parameters live (one rank
 * with the parameters on NVMe: only layers whose partitions are read, so that the trainer
 * never waits for a prefetch's reads), and with the parameters on NVMe the partitions of the
 * layers after those are queued as store prefetches. With several ranks every rank makes the
 * same decisions: they depend only on the trainer's calls. The gathers themselves are
 * engine_fetch.c's.
 */
#include <errno.h>
#include <string.h>

#include "engine/engine_internal.h"

static int
trace_push(struct zinf_engine *e, int32_t layer)
{
	if (e->fx.trace_n == e->fx.trace_cap) {
		uint32_t cap = e->fx.trace_cap ? e->fx.trace_cap * 2 : 64;
		int32_t *t = zc_calloc(cap, sizeof(*t));
		if (!t) {
			return ENG_FAIL(e, -ENOMEM, "fetch: out of memory for the trace");
		}
		if (e->fx.trace_n) {
			memcpy(t, e->fx.trace, e->fx.trace_n * sizeof(*t));
		}
		zc_free(e->fx.trace);
		e->fx.trace = t;
		e->fx.trace_cap = cap;
	}
	e->fx.trace[e->fx.trace_n++] = layer;
	return 0;
}

/* Follow (or record) the trace at a fetch of `layer`. */
int
eng_trace_fetch(struct zinf_engine *e, int32_t layer)
{
	if (!e->o.record_trace) {
		return 0;
	}
	if (e->fx.tr_state == TRACE_RECORDING) {
		return trace_push(e, layer);
	}
	if (e->fx.tr_state != TRACE_VALID) {
		return 0;
	}
	if (e->fx.cursor < e->fx.trace_n && e->fx.trace[e->fx.cursor] == layer) {
		e->fx.cursor++;
		e->fx.trace_hits++;
		return 0;
	}
	e->fx.trace_misses++;
	e->fx.trace_invalidations++;
	if (!e->fx.warned_trace) {
		e->fx.warned_trace = true;
		ENG_WARN(e,
			 "fetch: layer %d at position %u differs from the recorded trace (%d): "
			 "trace invalidated, recorded again from the next micro-batch (warned "
			 "once)",
			 layer, e->fx.cursor,
			 e->fx.cursor < e->fx.trace_n ? e->fx.trace[e->fx.cursor] : -1);
	}
	e->fx.tr_state = TRACE_INVALID;
	return 0;
}

/* End of a micro-batch (zinf_engine_step). */
void
eng_trace_micro_end(struct zinf_engine *e)
{
	if (!e->o.record_trace) {
		return;
	}
	if (e->fx.tr_state == TRACE_RECORDING && e->fx.trace_n > 0) {
		e->fx.tr_state = TRACE_VALID;
	} else if (e->fx.tr_state == TRACE_INVALID) {
		e->fx.trace_n = 0;
		e->fx.tr_state = TRACE_RECORDING;
	}
	e->fx.cursor = 0;
}

/* Elements fetched in the trace from position `from` until `layer` comes again, or UINT64_MAX. */
uint64_t
eng_reuse_distance(struct zinf_engine *e, uint32_t from, int32_t layer)
{
	uint64_t d = 0;
	for (uint32_t i = from; i < e->fx.trace_n; i++) {
		if (e->fx.trace[i] == layer) {
			return d;
		}
		d += eng_layer(e, e->fx.trace[i])->gather_elems;
	}
	return UINT64_MAX;
}

/*
 * NVMe: queue reads of the partitions of the layers that follow in the trace and are not
 * gathered, stage3_prefetch_bucket_size partition elements ahead (the store starts them within
 * its byte budget and gives an unclaimed one's buffer up when it needs it).
 */
static int
prefetch_reads(struct zinf_engine *e)
{
	if (!e->pt->reads) {
		return 0;
	}
	uint64_t queued = 0;
	eng_store_lock(e);
	for (uint32_t i = e->fx.cursor; i < e->fx.trace_n; i++) {
		struct elayer *l = eng_layer(e, e->fx.trace[i]);
		if (l->gathered || l->fetched || eng_layer_handed(e, l)) {
			continue;
		}
		for (uint32_t j = 0; j < l->n; j++) {
			struct eparam *p = &e->params[l->params[j]];
			if (p->persistent) {
				continue;
			}
			if (queued + p->part.part > e->o.stage3_prefetch_bucket_size) {
				goto out;
			}
			queued += p->part.part;
			/* refused (larger than the budget alone): it is read at its fetch */
			e->pt->prefetch(e, p);
		}
	}
out:
	eng_store_unlock(e);
	return 0;
}

/* Whether every NVMe partition of layer l is read (or being written and done): gathering it
 * then waits for no read. */
static bool
layer_read(struct zinf_engine *e, const struct elayer *l)
{
	bool ready = true;
	eng_store_lock(e);
	for (uint32_t j = 0; j < l->n && ready; j++) {
		const struct eparam *p = &e->params[l->params[j]];
		ready = p->persistent || e->pt->read_done(e, p);
	}
	eng_store_unlock(e);
	return ready;
}

/*
 * Gather the layers that follow in the trace, within the prefetch and live budgets. One rank
 * with the parameters on NVMe: only while the next one's partitions are read (queued by
 * prefetch_reads at an earlier fetch), so that the trainer waits for no prefetch's reads; a
 * layer not gathered ahead is gathered at its fetch. Several ranks gather what the budgets
 * allow, reads or not: their all-gathers are posted at the same calls on every rank.
 */
int
eng_prefetch(struct zinf_engine *e)
{
	if (e->fx.tr_state != TRACE_VALID) {
		return 0;
	}
	int ret = 0;
	for (uint32_t i = e->fx.cursor; i < e->fx.trace_n && !ret; i++) {
		struct elayer *l = eng_layer(e, e->fx.trace[i]);
		if (l->gathered || l->fetched || l->gather_elems == 0 || eng_layer_handed(e, l)) {
			continue;
		}
		if (e->fx.pf_inflight + l->gather_elems > e->o.stage3_prefetch_bucket_size ||
		    e->fx.live_elems + l->gather_elems > e->o.stage3_max_live_parameters) {
			break;
		}
		if (e->W == 1 && e->pt->reads && !layer_read(e, l)) {
			break;
		}
		ret = eng_gather_start(e, l);
		l->prefetched = true;
		e->fx.pf_inflight += l->gather_elems;
	}
	return ret ? ret : prefetch_reads(e);
}
