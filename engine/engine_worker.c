/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_worker.c: the step worker of the step during backward. At the accumulation
 * boundary, engine_grad.c hands each sub-group whose gradient became final (eng_step_final,
 * after an event on the engine stream); the worker waits for that event and steps it with
 * its tier's step (engine_otier.c) on its own stream and counters while backward goes on;
 * zinf_engine_step() waits for it (eng_worker_wait). The stepping itself is the tier's, the
 * same function as the step after backward, so that the results are the same bits. With the
 * optimizer on NVMe a handed sub-group's gradient stays in its gradient-window slot until the
 * worker has finished it (queue position < finished: engine_gwin.c takes the slot back then).
 * With gradient clipping or fp16 (e->cl.gate) the step's grad_scale depends on the global norm,
 * known only after every gradient: the worker steps speculatively (engine_spec.c) the
 * sub-groups that found a slot in the reserve (eng_spec_claim when handed), each keeping its
 * previous state there first (eng_spec_save); the others wait for the norm.
 */
#include <errno.h>
#include <string.h>

#include "engine/engine_internal.h"

static void *
worker_main(void *arg)
{
	struct zinf_engine *e = arg;
	struct eworker *w = &e->w;
	pthread_mutex_lock(&w->mu);
	for (;;) {
		while (!w->stop && w->head == w->tail && !w->prime) {
			pthread_cond_wait(&w->cv, &w->mu);
		}
		if (w->stop) {
			break;
		}
		if (w->prime && w->head == w->tail) {
			/* eng_worker_prime: start the step's reads with the backward */
			bool go = !w->began && !w->err;
			pthread_mutex_unlock(&w->mu);
			int ret = go ? e->ot->begin(e) : 0;
			pthread_mutex_lock(&w->mu);
			w->began |= go && ret == 0;
			if (ret && !w->err) {
				w->err = ret;
			}
			w->prime = false;
			pthread_cond_broadcast(&w->done);
			continue;
		}
		w->prime = false; /* a sub-group came first: it begins the step itself */
		uint32_t k = w->queue[w->head++];
		bool skip = w->err != 0;
		pthread_mutex_unlock(&w->mu);
		int ret = 0;
		if (!skip) {
			/* the accumulations of k were queued on cs before this event */
			ret = zinf_event_sync(e->w.sg_ev[k]);
			if (!ret && !w->began) {
				ret = e->ot->begin(e);
				w->began = ret == 0;
			}
			if (!ret && e->sp.sg_slot && e->sp.sg_slot[k] >= 0) {
				ret = eng_spec_save(e, &w->x, k); /* speculated: keep what it was */
			}
			if (!ret) {
				ret = e->ot->step(e, &w->x, k, eng_grad_of(e, k));
			}
			if (ret) {
				eng_param_write_abort(e); /* the store mutex, if it holds it */
			}
		}
		pthread_mutex_lock(&w->mu);
		if (ret && !w->err) {
			w->err = ret;
		}
		w->finished++;
		pthread_cond_broadcast(&w->done);
	}
	pthread_mutex_unlock(&w->mu);
	return NULL;
}

int
eng_worker_start(struct zinf_engine *e)
{
	struct eworker *w = &e->w;
	int ret;
	w->queue = zc_calloc(e->n_sg, sizeof(uint32_t));
	e->w.sg_ev = zc_calloc(e->n_sg, sizeof(*e->w.sg_ev));
	e->w.sg_handed = zc_calloc(e->n_sg, 1);
	if (!w->queue || !e->w.sg_ev || !e->w.sg_handed) {
		return ENG_FAIL(e, -ENOMEM, "init: out of memory for the step worker");
	}
	for (uint32_t k = 0; k < e->n_sg; k++) {
		if ((ret = zinf_event_create(e->dev, &e->w.sg_ev[k]))) {
			return ENG_FAIL(e, ret, "init: events of the step worker");
		}
	}
	if ((ret = zinf_stream_create(e->dev, "zinf-step", &w->ws))) {
		return ENG_FAIL(e, ret, "init: the step worker's stream");
	}
	w->x.s = w->ws;
	w->x.st = &w->st;
	pthread_mutex_init(&w->mu, NULL);
	pthread_cond_init(&w->cv, NULL);
	pthread_cond_init(&w->done, NULL);
	if ((ret = pthread_create(&w->th, NULL, worker_main, e))) {
		pthread_cond_destroy(&w->done);
		pthread_cond_destroy(&w->cv);
		pthread_mutex_destroy(&w->mu);
		return ENG_FAIL(e, -ret, "init: cannot start the step worker thread");
	}
	w->started = true;
	return 0;
}

void
eng_worker_stop(struct zinf_engine *e)
{
	struct eworker *w = &e->w;
	if (w->started) {
		pthread_mutex_lock(&w->mu);
		w->stop = true;
		pthread_cond_broadcast(&w->cv);
		pthread_mutex_unlock(&w->mu);
		pthread_join(w->th, NULL);
		pthread_cond_destroy(&w->done);
		pthread_cond_destroy(&w->cv);
		pthread_mutex_destroy(&w->mu);
		w->started = false;
	}
	zinf_stream_destroy(w->ws);
	w->ws = NULL;
	for (uint32_t k = 0; e->w.sg_ev && k < e->n_sg; k++) {
		zinf_event_destroy(e->w.sg_ev[k]);
	}
	zc_free(e->w.sg_ev);
	e->w.sg_ev = NULL;
	zc_free(w->queue);
	w->queue = NULL;
	zc_free(e->w.sg_handed);
	e->w.sg_handed = NULL;
}

/* Hand sub-group k to the worker, after the engine stream's work so far (its accumulations,
 * and through the wait below, the compute stream's work queued so far: every use of its
 * parameters, whose layers were released). */
static int
hand(struct zinf_engine *e, uint32_t k)
{
	struct eworker *w = &e->w;
	int ret = eng_order(e, e->compute, e->cs);
	if (!ret) {
		ret = zinf_event_record(e->w.sg_ev[k], e->cs);
	}
	if (!ret && e->gr.gw.n) {
		/* the gradient window: k's gradient in a slot, the worker's until it is done */
		if ((ret = eng_gwin_load(e, k)) == 0) {
			eng_gwin_hand(e, k, w->tail);
		}
	}
	e->w.sg_handed[k] = 1;
	pthread_mutex_lock(&w->mu);
	if (ret && !w->err) {
		w->err = ret;
	}
	w->queue[w->tail++] = k;
	pthread_cond_signal(&w->cv);
	pthread_mutex_unlock(&w->mu);
	return ret;
}

int
eng_worker_hand(struct zinf_engine *e, uint32_t k)
{
	return hand(e, k);
}

/* Whether sub-group k may go to the worker now: always without clipping or fp16; with them,
 * when speculation is on and the reserve has a slot for k (taken here). */
static bool
may_hand(struct zinf_engine *e, uint32_t k)
{
	return !e->cl.gate || eng_spec_claim(e, k);
}

/* Whether no layer holding a parameter of sub-group k is fetched. */
static bool
released(struct zinf_engine *e, uint32_t k)
{
	for (uint32_t i = e->sg_first[k]; i < e->n_params && e->params[e->order[i]].sg == k; i++) {
		if (eng_layer(e, e->params[e->order[i]].layer)->fetched) {
			return false;
		}
	}
	return true;
}

/*
 * Hand the sub-groups that are final (every gradient accumulated at the boundary micro-batch)
 * and whose layers are all released: the worker writes new values where the trainer may still
 * read them (stages 0-2: the device tensors) only after the trainer is done with the layer.
 */
void
eng_worker_pump(struct zinf_engine *e)
{
	if (!e->w.started || (e->cl.gate && !eng_spec_on(e))) {
		return;
	}
	for (uint32_t k = 0; k < e->n_sg; k++) {
		if (e->gr.sg_pending[k] == 0 && !e->w.sg_handed[k] && released(e, k) &&
		    may_hand(e, k)) {
			hand(e, k);
		}
	}
}

/* Sub-group k's gradient is final (the boundary micro-batch). */
void
eng_step_final(struct zinf_engine *e, uint32_t k)
{
	if (e->w.started && (!e->cl.gate || eng_spec_on(e)) && released(e, k) && may_hand(e, k)) {
		hand(e, k);
	}
	/* else: stepped after backward (eng_step_run), or handed at its layers' release */
}

/*
 * At the boundary micro-batch's first gradient: with the optimizer state on NVMe, have the
 * worker begin the step now, so that the reads of the first sub-groups' state (which do not
 * depend on the gradients) start with the backward, not only once the first sub-group is
 * final. Not at the first fetch: a forward alone (an evaluation) must leave the step object
 * idle, for zinf_engine_read_master between steps. The step's arithmetic is unchanged
 * (zinf_step_ready runs where it did); only the reads move.
 */
void
eng_worker_prime(struct zinf_engine *e)
{
	struct eworker *w = &e->w;
	if (!w->started || (e->cl.gate && !eng_spec_on(e)) || !e->ot->reads_ahead ||
	    !eng_pass_last(e)) {
		return;
	}
	pthread_mutex_lock(&w->mu);
	if (!w->began && w->head == w->tail && w->tail == 0) {
		w->prime = true;
		pthread_cond_signal(&w->cv);
	}
	pthread_mutex_unlock(&w->mu);
}

/* Wait for every sub-group handed to the worker (and a prime asked for); its error, if any. */
int
eng_worker_wait(struct zinf_engine *e)
{
	struct eworker *w = &e->w;
	pthread_mutex_lock(&w->mu);
	while (w->finished < w->tail || w->prime) {
		pthread_cond_wait(&w->done, &w->mu);
	}
	int ret = w->err;
	pthread_mutex_unlock(&w->mu);
	return ret;
}

/*
 * The worker's part of the step: wait for it, end its pass over the optimizer's NVMe state
 * (partial: the sub-groups not handed are left out of it, zinf_step_skip; its I/O counted now,
 * as another pass follows), take back the gradient-window slots it read, fold its counters
 * into the window's and reset it for the next step.
 */
int
eng_worker_end(struct zinf_engine *e, bool partial)
{
	struct eworker *w = &e->w;
	int ret = eng_worker_wait(e);
	if (!ret && !partial && w->tail < e->n_sg) {
		ret = ENG_FAIL(e, -EPROTO, "step: %u of %u sub-groups final", w->tail, e->n_sg);
	}
	int r2 = zinf_stream_sync(w->ws);
	ret = ret ? ret : r2;
	if (e->gr.gw.n) {
		eng_gwin_reclaim(e); /* before `finished` goes back to 0 */
	}
	bool began = w->began;
	w->head = w->tail = w->finished = 0;
	w->err = 0;
	w->began = false;
	if (began) {
		for (uint32_t k = 0; partial && k < e->n_sg; k++) {
			if (!e->w.sg_handed[k] && (r2 = e->ot->skip(e, k))) {
				ret = ret ? ret : r2;
			}
		}
		r2 = e->ot->finish(e, partial);
		ret = ret ? ret : r2;
	}
	e->win.h2d_bytes += w->st.h2d_bytes;
	e->win.d2h_bytes += w->st.d2h_bytes;
	e->win.nvme_read_bytes += w->st.nvme_read_bytes;
	e->win.nvme_write_bytes += w->st.nvme_write_bytes;
	e->win.param_nvme_write_bytes += w->st.param_nvme_write_bytes;
	e->win.optimizer_s += w->st.optimizer_s;
	memset(&w->st, 0, sizeof(w->st));
	return ret;
}
