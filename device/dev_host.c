/* SPDX-License-Identifier: Apache-2.0 */
/*
 * device/dev_host.c: the "host" device. Device memory is host memory, copies are memcpy, host
 * registration is a no-op (the pool does its own mlock), and the kernels are the C references of
 * kernels/ (*.cu): common/dtype.h's exact conversions, cpu_adam's zinf_adam_step, zinf_grad_sumsq
 * and zinf_grad_has_inf_nan.
 *
 * Each stream is a thread working through a FIFO of operations; streams are ordered only by
 * events, as CUDA streams are, so that an engine that forgets an event wait reads a buffer before
 * its copy landed here too. Each record is a mark (refcounted, under the device's mutex) that the
 * event points at until the next record; a wait captures the mark the event points at when the
 * wait is queued and blocks its stream's thread until that mark is done, so recording the event
 * again later does not release it (CUDA's rule). With opts.host_sync every operation runs on the
 * calling thread when it is queued.
 *
 * Host registration pins nothing (the pool does its own mlock) but keeps CUDA's rule, so that a
 * trainer tested on "host" does not fail on a GPU: a range that overlaps one already registered
 * is refused (-EEXIST here, as cudaErrorHostMemoryAlreadyRegistered is on "cuda"), and
 * unregistering takes the pointer that was registered. Seen on an H200 (CUDA 13.0, driver 580):
 * two ranges that share a page but no byte both register; a range inside another is refused.
 */
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "common/dtype.h"
#include "common/quant.h"
#include "common/util.h"
#include "device/dev_internal.h"

/* A registered host range [first, end). */
struct host_reg {
	struct host_reg *next;
	void *p; /* as given: the key of host_unregister */
	uintptr_t first, end;
};

struct host_dev {
	pthread_mutex_t lock;  /* every event and mark, the registrations */
	pthread_cond_t cond;   /* a mark is done */
	struct host_reg *regs; /* under lock */
};

/* One record of an event: done when the stream reaches it. Under host_dev.lock. */
struct mark {
	int refs; /* the event while it points here, the record op, each wait on it */
	bool done;
};

struct host_event {
	struct mark *last; /* the latest record, NULL if never recorded; under host_dev.lock */
};

enum hop_kind { HOP_COPY, HOP_KERNEL, HOP_RECORD, HOP_WAIT };

struct hop {
	enum hop_kind kind;
	struct hop *next;
	void *dst; /* copy */
	const void *src;
	size_t len;
	struct mark *mark; /* record, wait: holds a reference */
	struct zinf_kop k; /* kernel */
};

struct host_stream {
	struct zinf_stream *s;
	pthread_t thread;
	pthread_mutex_t lock;
	pthread_cond_t cond; /* work queued, work finished, gate opened, stop */
	struct hop *head, *tail;
	bool busy, stop, gate_closed, sync_mode;
	int err;	 /* first error since the last sync */
	int fail_next;	 /* test hook: the next op fails with this instead of running */
	unsigned lag_us; /* test hook: every copy or kernel starts this late */
};

static struct host_dev *
hdev(const struct zinf_device *d)
{
	return d->priv;
}

static int
host_probe(void)
{
	return 1;
}

static int
host_open(struct zinf_device *d)
{
	if (d->o.index != 0) {
		return ZINF_FAIL(-ENODEV, "device \"host\": no device %d (only 0)", d->o.index);
	}
	struct host_dev *h = zc_calloc(1, sizeof(*h));
	if (!h) {
		return ZINF_FAIL(-ENOMEM, "device %s: out of memory", d->name);
	}
	pthread_mutex_init(&h->lock, NULL);
	pthread_cond_init(&h->cond, NULL);
	d->priv = h;
	return 0;
}

static void
host_close(struct zinf_device *d)
{
	struct host_dev *h = hdev(d);
	while (h->regs) {
		struct host_reg *r = h->regs;
		h->regs = r->next;
		zc_free(r);
	}
	pthread_cond_destroy(&h->cond);
	pthread_mutex_destroy(&h->lock);
	zc_free(h);
}

static int
host_register(struct zinf_device *d, void *p, size_t len)
{
	struct host_dev *h = hdev(d);
	uintptr_t a = (uintptr_t)p;
	if (len > UINTPTR_MAX - a) {
		return ZINF_FAIL(-EINVAL,
				 "device %s: host registration of %p, %zu bytes: past the "
				 "address space",
				 d->name, p, len);
	}
	struct host_reg *r = zc_calloc(1, sizeof(*r));
	if (!r) {
		return ZINF_FAIL(-ENOMEM, "device %s: out of memory", d->name);
	}
	r->p = p;
	r->first = a;
	r->end = a + len;
	int rc = 0;
	pthread_mutex_lock(&h->lock);
	for (struct host_reg *o = h->regs; o; o = o->next) {
		if (r->first < o->end && o->first < r->end) {
			rc = ZINF_FAIL(-EEXIST,
				       "device %s: host registration of %p, %zu bytes overlaps the "
				       "range registered at %p (%zu bytes)",
				       d->name, p, len, o->p, (size_t)(o->end - o->first));
			break;
		}
	}
	if (rc == 0) {
		r->next = h->regs;
		h->regs = r;
	}
	pthread_mutex_unlock(&h->lock);
	if (rc) {
		zc_free(r);
	}
	return rc;
}

static void
host_unregister(struct zinf_device *d, void *p)
{
	struct host_dev *h = hdev(d);
	struct host_reg *gone = NULL;
	pthread_mutex_lock(&h->lock);
	for (struct host_reg **o = &h->regs; *o; o = &(*o)->next) {
		if ((*o)->p == p) {
			gone = *o;
			*o = gone->next;
			break;
		}
	}
	pthread_mutex_unlock(&h->lock);
	zc_free(gone);
}

static int
host_alloc(struct zinf_device *d, size_t len, void **out)
{
	void *p = zinf_alloc_aligned(4096, len ? len : 1);
	if (!p) {
		return ZINF_FAIL(-ENOMEM, "device %s: cannot allocate %zu bytes", d->name, len);
	}
	*out = p;
	return 0;
}

static void
host_free(struct zinf_device *d, void *p)
{
	zinf_free_aligned(p);
}

/* ---- the C reference kernels ---------------------------------------------------------------- */

/* Run one checked kernel; 0 or the negative errno of a cpu_adam call (logged by it). */
static int
run_kernel(const struct zinf_kop *k)
{
	/* One thread: a host stream is one thread of its own, as a CUDA stream is one queue. */
	struct zinf_grad_opts one_thread;
	zinf_grad_opts_init(&one_thread);
	one_thread.threads = 1;
	size_t n = k->n;
	switch (k->kind) {
	case ZINF_KOP_CAST:
		return zinf_dtype_convert(k->dst, k->dst_dtype, k->src, k->src_dtype, n);
	case ZINF_KOP_SCALE:
		for (size_t i = 0; i < n; i++) {
			dt_store(k->dst, k->dst_dtype, i,
				 dt_load(k->dst, k->dst_dtype, i) * k->value);
		}
		return 0;
	case ZINF_KOP_ACCUMULATE:
		for (size_t i = 0; i < n; i++) {
			((float *)k->dst)[i] += dt_load(k->src, k->src_dtype, i);
		}
		return 0;
	case ZINF_KOP_SUMSQ:
		return zinf_grad_sumsq(k->src, k->src_dtype, n, &one_thread, k->out);
	case ZINF_KOP_NONFINITE: {
		int r = zinf_grad_has_inf_nan(k->src, k->src_dtype, n, &one_thread);
		if (r == 1) {
			*k->flag = 1;
		}
		return r < 0 ? r : 0;
	}
	case ZINF_KOP_FILL:
		for (size_t i = 0; i < n; i++) {
			dt_store(k->dst, k->dst_dtype, i, k->value);
		}
		return 0;
	case ZINF_KOP_ADAM:
		return zinf_adam_step(&k->adam, k->step, k->grad_scale, k->param, k->grad,
				      k->grad_dtype, k->m, k->v, n, k->copy, k->copy_dtype);
	case ZINF_KOP_QUANTIZE:
		qz_quantize(k->codes, k->scales, k->src, k->src_dtype, n, k->block, k->bits, k->err,
			    k->value);
		return 0;
	case ZINF_KOP_DEQUANTIZE:
		if (k->acc) {
			qz_dequantize_add(k->dst, k->codes, k->scales, n, k->block, k->bits);
		} else {
			qz_dequantize(k->dst, k->dst_dtype, k->codes, k->scales, n, k->block,
				      k->bits);
		}
		return 0;
	}
	return -EINVAL;
}

/* ---- streams -------------------------------------------------------------------------------- */

static struct host_stream *
hs(const struct zinf_stream *s)
{
	return s->priv;
}

/* Drop a reference to m (called with host_dev.lock held). */
static void
mark_put(struct mark *m)
{
	if (m && --m->refs == 0) {
		zc_free(m);
	}
}

static int
run_op(struct host_stream *h, struct hop *op)
{
	struct host_dev *d = hdev(h->s->dev);
	switch (op->kind) {
	case HOP_COPY:
		memcpy(op->dst, op->src, op->len);
		return 0;
	case HOP_KERNEL:
		return run_kernel(&op->k);
	case HOP_RECORD:
		pthread_mutex_lock(&d->lock);
		op->mark->done = true;
		pthread_cond_broadcast(&d->cond);
		mark_put(op->mark);
		pthread_mutex_unlock(&d->lock);
		return 0;
	case HOP_WAIT:
		pthread_mutex_lock(&d->lock);
		while (!op->mark->done) {
			pthread_cond_wait(&d->cond, &d->lock);
		}
		mark_put(op->mark);
		pthread_mutex_unlock(&d->lock);
		return 0;
	}
	return -EINVAL;
}

static void *
stream_main(void *arg)
{
	struct host_stream *h = arg;
	pthread_mutex_lock(&h->lock);
	for (;;) {
		while ((!h->head || h->gate_closed) && !h->stop) {
			pthread_cond_wait(&h->cond, &h->lock);
		}
		if (!h->head) {
			break; /* stop, and nothing left */
		}
		struct hop *op = h->head;
		h->head = op->next;
		if (!h->head) {
			h->tail = NULL;
		}
		h->busy = true;
		int rc = h->fail_next;
		unsigned lag = h->lag_us;
		h->fail_next = 0;
		pthread_mutex_unlock(&h->lock);
		if (lag && (op->kind == HOP_COPY || op->kind == HOP_KERNEL)) {
			struct timespec ts = {.tv_sec = lag / 1000000,
					      .tv_nsec = (long)(lag % 1000000) * 1000};
			nanosleep(&ts, NULL);
		}
		if (rc == 0) {
			rc = run_op(h, op);
		} else if (op->kind == HOP_RECORD || op->kind == HOP_WAIT) {
			run_op(h, op); /* an event still completes: only work fails */
		}
		zc_free(op);
		pthread_mutex_lock(&h->lock);
		if (rc && !h->err) {
			h->err = rc;
		}
		h->busy = false;
		pthread_cond_broadcast(&h->cond);
	}
	pthread_mutex_unlock(&h->lock);
	return NULL;
}

/* Queue op on s (taking it), or in sync mode run it now. */
static int
submit(struct zinf_stream *s, struct hop *op)
{
	struct host_stream *h = hs(s);
	if (h->sync_mode) {
		int rc = run_op(h, op);
		zc_free(op);
		if (rc && !h->err) {
			h->err = rc;
		}
		return 0;
	}
	pthread_mutex_lock(&h->lock);
	op->next = NULL;
	if (h->tail) {
		h->tail->next = op;
	} else {
		h->head = op;
	}
	h->tail = op;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
	return 0;
}

static struct hop *
new_op(struct zinf_stream *s, enum hop_kind kind)
{
	struct hop *op = zc_calloc(1, sizeof(*op));
	if (op) {
		op->kind = kind;
	}
	return op;
}

static int
host_stream_open(struct zinf_stream *s)
{
	if (s->native) {
		return ZINF_FAIL(-EINVAL,
				 "stream \"%s\": the host device has no native streams "
				 "(native must be NULL)",
				 s->name);
	}
	struct host_stream *h = zc_calloc(1, sizeof(*h));
	if (!h) {
		return ZINF_FAIL(-ENOMEM, "stream \"%s\": out of memory", s->name);
	}
	h->s = s;
	h->sync_mode = s->dev->o.host_sync;
	pthread_mutex_init(&h->lock, NULL);
	pthread_cond_init(&h->cond, NULL);
	s->priv = h;
	if (!h->sync_mode) {
		int e = pthread_create(&h->thread, NULL, stream_main, h);
		if (e) {
			pthread_cond_destroy(&h->cond);
			pthread_mutex_destroy(&h->lock);
			zc_free(h);
			return ZINF_FAIL(-e, "stream \"%s\": cannot start its thread: %s", s->name,
					 strerror(e));
		}
	}
	return 0;
}

static void
host_stream_close(struct zinf_stream *s)
{
	struct host_stream *h = hs(s);
	if (!h->sync_mode) {
		pthread_mutex_lock(&h->lock);
		h->stop = true;
		h->gate_closed = false;
		pthread_cond_broadcast(&h->cond);
		pthread_mutex_unlock(&h->lock);
		pthread_join(h->thread, NULL);
	}
	pthread_cond_destroy(&h->cond);
	pthread_mutex_destroy(&h->lock);
	zc_free(h);
}

static int
host_stream_sync(struct zinf_stream *s)
{
	struct host_stream *h = hs(s);
	pthread_mutex_lock(&h->lock);
	while (h->head || h->busy) {
		pthread_cond_wait(&h->cond, &h->lock);
	}
	int rc = h->err;
	h->err = 0;
	pthread_mutex_unlock(&h->lock);
	return rc;
}

static struct host_stream *
test_stream(struct zinf_stream *s, const char *hook)
{
	if (!s) {
		ZINF_ERR("%s: NULL stream", hook);
		return NULL;
	}
	if (s->dev->ops != &zinf_dev_host_ops) {
		ZINF_ERR("%s: stream \"%s\" is on %s, not host", hook, s->name, s->dev->name);
		return NULL;
	}
	return hs(s);
}

int
dev_test_fail_next(struct zinf_stream *s, int err)
{
	struct host_stream *h = test_stream(s, "test fail_next");
	if (!h || err >= 0) {
		return -EINVAL;
	}
	pthread_mutex_lock(&h->lock);
	h->fail_next = err;
	pthread_mutex_unlock(&h->lock);
	return 0;
}

int
dev_test_lag(struct zinf_stream *s, unsigned usec)
{
	struct host_stream *h = test_stream(s, "test lag");
	if (!h) {
		return -EINVAL;
	}
	if (h->sync_mode) { /* work runs on the caller's thread: nothing can be late */
		return ZINF_FAIL(-ENOTSUP, "test lag: stream \"%s\" runs in host_sync mode",
				 s->name);
	}
	pthread_mutex_lock(&h->lock);
	h->lag_us = usec;
	pthread_mutex_unlock(&h->lock);
	return 0;
}

int
dev_test_gate(struct zinf_stream *s, bool closed)
{
	if (!s) {
		return ZINF_FAIL(-EINVAL, "test gate: NULL stream");
	}
	if (s->dev->ops != &zinf_dev_host_ops) {
		return ZINF_FAIL(-ENOTSUP, "test gate: stream \"%s\" is on %s, not host", s->name,
				 s->dev->name);
	}
	struct host_stream *h = hs(s);
	pthread_mutex_lock(&h->lock);
	h->gate_closed = closed;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
	return 0;
}

/* ---- events --------------------------------------------------------------------------------- */

static int
host_event_open(struct zinf_event *e)
{
	struct host_event *h = zc_calloc(1, sizeof(*h));
	if (!h) {
		return ZINF_FAIL(-ENOMEM, "device %s: out of memory for an event", e->dev->name);
	}
	e->priv = h;
	return 0;
}

static void
host_event_close(struct zinf_event *e)
{
	struct host_dev *d = hdev(e->dev);
	struct host_event *ev = e->priv;
	pthread_mutex_lock(&d->lock);
	mark_put(ev->last); /* queued records and waits keep their own references */
	pthread_mutex_unlock(&d->lock);
	zc_free(ev);
}

static int
host_event_record(struct zinf_event *e, struct zinf_stream *s)
{
	struct hop *op = new_op(s, HOP_RECORD);
	struct mark *m = zc_calloc(1, sizeof(*m));
	if (!op || !m) {
		zc_free(op);
		zc_free(m);
		return ZINF_FAIL(-ENOMEM, "stream \"%s\": out of memory for an event record",
				 s->name);
	}
	struct host_dev *d = hdev(s->dev);
	struct host_event *ev = e->priv;
	m->refs = 2; /* the event and the record op */
	pthread_mutex_lock(&d->lock);
	mark_put(ev->last);
	ev->last = m;
	pthread_mutex_unlock(&d->lock);
	op->mark = m;
	return submit(s, op);
}

/* The event's latest mark with a reference taken, or NULL when there is none or it is done. */
static struct mark *
pending_mark(struct host_dev *d, struct host_event *ev)
{
	pthread_mutex_lock(&d->lock);
	struct mark *m = ev->last;
	if (m && !m->done) {
		m->refs++;
	} else {
		m = NULL;
	}
	pthread_mutex_unlock(&d->lock);
	return m;
}

static int
host_stream_wait(struct zinf_stream *s, struct zinf_event *e)
{
	struct host_dev *d = hdev(s->dev);
	struct mark *m = pending_mark(d, e->priv);
	if (!m) {
		return 0; /* nothing to wait for */
	}
	struct hop *op = new_op(s, HOP_WAIT);
	if (!op) {
		pthread_mutex_lock(&d->lock);
		mark_put(m);
		pthread_mutex_unlock(&d->lock);
		return ZINF_FAIL(-ENOMEM, "stream \"%s\": out of memory for an event wait",
				 s->name);
	}
	op->mark = m;
	return submit(s, op);
}

static int
host_event_query(struct zinf_event *e)
{
	struct host_dev *d = hdev(e->dev);
	struct host_event *ev = e->priv;
	pthread_mutex_lock(&d->lock);
	int r = !ev->last || ev->last->done;
	pthread_mutex_unlock(&d->lock);
	return r;
}

static int
host_event_sync(struct zinf_event *e)
{
	struct host_dev *d = hdev(e->dev);
	struct mark *m = pending_mark(d, e->priv);
	if (!m) {
		return 0;
	}
	pthread_mutex_lock(&d->lock);
	while (!m->done) {
		pthread_cond_wait(&d->cond, &d->lock);
	}
	mark_put(m);
	pthread_mutex_unlock(&d->lock);
	return 0;
}

/* ---- copies and kernels --------------------------------------------------------------------- */

static int
host_copy(struct zinf_stream *s, void *dst, const void *src, size_t len, enum zinf_copy_dir dir)
{
	struct hop *op = new_op(s, HOP_COPY);
	if (!op) {
		return ZINF_FAIL(-ENOMEM, "stream \"%s\": out of memory for a copy", s->name);
	}
	op->dst = dst;
	op->src = src;
	op->len = len;
	return submit(s, op);
}

static int
host_kernel(struct zinf_stream *s, const struct zinf_kop *k)
{
	struct hop *op = new_op(s, HOP_KERNEL);
	if (!op) {
		return ZINF_FAIL(-ENOMEM, "stream \"%s\": out of memory for a kernel", s->name);
	}
	op->k = *k;
	return submit(s, op);
}

const struct zinf_dev_ops zinf_dev_host_ops = {
	.name = "host",
	.probe = host_probe,
	.open = host_open,
	.close = host_close,
	.host_register = host_register,
	.host_unregister = host_unregister,
	.alloc = host_alloc,
	.free = host_free,
	.stream_open = host_stream_open,
	.stream_close = host_stream_close,
	.stream_sync = host_stream_sync,
	.event_open = host_event_open,
	.event_close = host_event_close,
	.event_record = host_event_record,
	.stream_wait = host_stream_wait,
	.event_query = host_event_query,
	.event_sync = host_event_sync,
	.copy = host_copy,
	.kernel = host_kernel,
};
