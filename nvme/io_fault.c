/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvme/io_fault.c: the fault-injection backend, the tests' way to make I/O fail. It wraps
 * another backend (opts.fault_inner, or the best that works), counts block ops per direction
 * and applies the rules armed with zinf_io_fault_add(): FAIL completes the n-th op with -err
 * and transfers nothing; SHORT asks the inner backend for fewer bytes (rounded to the file's
 * alignment), so the core's resubmission path runs on a real transfer. Resubmissions are ops
 * too and are counted.
 */
#include <string.h>

#include "nvme/io_internal.h"

#define FAULT_RULES_MAX 64

struct fault_rule {
	struct zinf_io_fault r;
	uint64_t first; /* absolute op number (1-based) of the first hit */
	uint64_t last;	/* ... and of the last */
};

struct fault_ctx {
	const struct zinf_io_ops *inner;
	pthread_mutex_t lock;
	uint64_t ops[2]; /* block ops seen, by direction */
	struct fault_rule rules[FAULT_RULES_MAX];
	unsigned nrules;
};

struct fault_worker {
	struct zinf_io_worker w;
	struct zinf_io_worker *inner;
	struct zinf_io_blk **failed; /* [depth]: completed by the fault itself */
	unsigned nfailed;
};

static struct fault_ctx *
fault_ctx(struct zinf_io *io)
{
	return io->be;
}

static int
fault_init(struct zinf_io *io, const struct zinf_io_ops *inner)
{
	struct fault_ctx *c = zc_calloc(1, sizeof(*c));
	if (!c) {
		return IO_FAIL(io, -ENOMEM, "fault backend: out of memory");
	}
	c->inner = inner;
	pthread_mutex_init(&c->lock, NULL);
	io->be = c;
	return 0;
}

static void
fault_fini(struct zinf_io *io)
{
	struct fault_ctx *c = fault_ctx(io);
	if (c) {
		pthread_mutex_destroy(&c->lock);
		zc_free(c);
	}
}

static int
fault_worker_create(struct zinf_io *io, unsigned id, unsigned depth, struct zinf_io_worker **out)
{
	struct fault_ctx *c = fault_ctx(io);
	struct fault_worker *fw = zc_calloc(1, sizeof(*fw));
	int rc;

	if (!fw) {
		return IO_FAIL(io, -ENOMEM, "fault worker %u: out of memory", id);
	}
	fw->failed = zc_calloc(depth, sizeof(*fw->failed));
	if (!fw->failed) {
		rc = -ENOMEM;
		goto fail_free;
	}
	rc = io_worker_init(&fw->w, io, id, depth);
	if (rc < 0) {
		goto fail_failed;
	}
	rc = c->inner->worker_create(io, id, depth, &fw->inner);
	if (rc < 0) {
		goto fail_worker;
	}
	/* The core wakes this worker; the inner backend waits: share its wake_fd (it owns it). */
	fw->w.wake_fd = fw->inner->wake_fd;
	*out = &fw->w;
	return 0;

fail_worker:
	io_worker_fini(&fw->w);
fail_failed:
	zc_free(fw->failed);
fail_free:
	zc_free(fw);
	return rc;
}

static void
fault_worker_destroy(struct zinf_io_worker *w)
{
	struct fault_worker *fw = zinf_container_of(w, struct fault_worker, w);
	fault_ctx(w->io)->inner->worker_destroy(fw->inner);
	io_worker_fini(w);
	zc_free(fw->failed);
	zc_free(fw);
}

static int
fault_queue(struct zinf_io_worker *w, struct zinf_io_blk *b)
{
	struct fault_worker *fw = zinf_container_of(w, struct fault_worker, w);
	struct fault_ctx *c = fault_ctx(w->io);
	const struct zinf_io_fault *hit = NULL;

	pthread_mutex_lock(&c->lock);
	uint64_t n = ++c->ops[b->op];
	uint64_t total = c->ops[0] + c->ops[1];
	for (unsigned i = 0; i < c->nrules && !hit; i++) {
		struct fault_rule *fr = &c->rules[i];
		uint64_t k = fr->r.op < 0 ? total : (fr->r.op == b->op ? n : 0);
		if (k >= fr->first && k <= fr->last) {
			hit = &fr->r;
		}
	}
	pthread_mutex_unlock(&c->lock);

	if (hit && hit->kind == ZINF_IO_FAULT_FAIL) {
		b->res = -hit->err;
		fw->failed[fw->nfailed++] = b;
		return 0;
	}
	if (hit && hit->kind == ZINF_IO_FAULT_SHORT) {
		uint32_t a = b->file->align;
		uint32_t cut = (uint32_t)ZINF_ALIGN_UP((uint64_t)ZINF_MAX(hit->short_bytes, 1u), a);
		if (b->xfer > cut) {
			b->xfer -= cut;
		} else if (b->xfer > a) {
			b->xfer = (uint32_t)ZINF_ALIGN_DOWN(b->xfer / 2, a);
		} /* else one aligned unit: nothing shorter is possible */
	}
	return c->inner->queue(fw->inner, b);
}

static int
fault_submit(struct zinf_io_worker *w)
{
	struct fault_worker *fw = zinf_container_of(w, struct fault_worker, w);
	return fault_ctx(w->io)->inner->submit(fw->inner);
}

static int
fault_reap(struct zinf_io_worker *w, struct zinf_io_blk **out, unsigned min, unsigned max)
{
	struct fault_worker *fw = zinf_container_of(w, struct fault_worker, w);
	unsigned n = 0;

	while (fw->nfailed && n < max) {
		out[n++] = fw->failed[--fw->nfailed];
	}
	if (n == max || w->inflight == n) {
		/* Nothing else in flight in the inner backend (or no room). */
		return (int)n;
	}
	/* The inner backend's own count of its ops in flight (libaio waits only for what the
	 * kernel holds): the core counts on this worker, and the faulted ops never reached it. */
	fw->inner->inflight = w->inflight - n - fw->nfailed;
	int rc = fault_ctx(w->io)->inner->reap(fw->inner, out + n, n >= min ? 0 : min - n, max - n);
	if (rc < 0) {
		return n ? (int)n : rc;
	}
	return (int)(n + (unsigned)rc);
}

static int
fault_file_add(struct zinf_io_worker *w, struct zinf_io_file *f)
{
	struct fault_worker *fw = zinf_container_of(w, struct fault_worker, w);
	const struct zinf_io_ops *in = fault_ctx(w->io)->inner;
	return in->file_add ? in->file_add(fw->inner, f) : -EOPNOTSUPP;
}

static void
fault_file_remove(struct zinf_io_worker *w, struct zinf_io_file *f)
{
	struct fault_worker *fw = zinf_container_of(w, struct fault_worker, w);
	const struct zinf_io_ops *in = fault_ctx(w->io)->inner;
	if (in->file_remove) {
		in->file_remove(fw->inner, f);
	}
}

static int
fault_register_buffers(struct zinf_io_worker *w, const struct iovec *iov, unsigned n)
{
	struct fault_worker *fw = zinf_container_of(w, struct fault_worker, w);
	const struct zinf_io_ops *in = fault_ctx(w->io)->inner;
	return in->register_buffers ? in->register_buffers(fw->inner, iov, n)
				    : (n ? -EOPNOTSUPP : 0);
}

const struct zinf_io_ops zinf_io_fault_ops_table = {
	.name = "fault",
	.flags = ZINF_IO_F_WRAPPER,
	.init = fault_init,
	.fini = fault_fini,
	.worker_create = fault_worker_create,
	.worker_destroy = fault_worker_destroy,
	.queue = fault_queue,
	.submit = fault_submit,
	.reap = fault_reap,
	.file_add = fault_file_add,
	.file_remove = fault_file_remove,
	.register_buffers = fault_register_buffers,
};

int
zinf_io_fault_add(struct zinf_io *io, const struct zinf_io_fault *rule)
{
	if (!io || !rule || io->ops != &zinf_io_fault_ops_table) {
		return IO_FAIL(io, -EINVAL, "zinf_io_fault_add: %s",
			       !rule ? "NULL rule" : "not a \"fault\" I/O context");
	}
	if (rule->nth == 0 || rule->op < -1 || rule->op > 1 ||
	    (rule->kind == ZINF_IO_FAULT_FAIL && rule->err <= 0) ||
	    (rule->kind != ZINF_IO_FAULT_FAIL && rule->kind != ZINF_IO_FAULT_SHORT)) {
		return ZINF_FAIL(-EINVAL,
				 "zinf_io_fault_add: bad rule (kind %d, op %d, nth %llu, "
				 "err %d)",
				 (int)rule->kind, rule->op, (unsigned long long)rule->nth,
				 rule->err);
	}
	struct fault_ctx *c = fault_ctx(io);
	uint64_t count = rule->count ? rule->count : 1;
	int rc = 0;
	pthread_mutex_lock(&c->lock);
	/* "n-th op of that direction from now"; for either direction, counted on the sum of
	 * both. The last op hit must be a number the counter can reach. */
	uint64_t base = rule->op < 0 ? c->ops[0] + c->ops[1] : c->ops[rule->op];
	if (c->nrules == FAULT_RULES_MAX) {
		rc = -ENOSPC;
	} else if (rule->nth > UINT64_MAX - base || count - 1 > UINT64_MAX - base - rule->nth) {
		rc = -EOVERFLOW;
	} else {
		struct fault_rule *fr = &c->rules[c->nrules++];
		fr->r = *rule;
		fr->first = base + rule->nth;
		fr->last = fr->first + count - 1;
	}
	pthread_mutex_unlock(&c->lock);
	if (rc == -EOVERFLOW) {
		return IO_FAIL(io, rc,
			       "zinf_io_fault_add: nth %llu + count %llu wraps the op counter (at "
			       "%llu)",
			       (unsigned long long)rule->nth, (unsigned long long)rule->count,
			       (unsigned long long)base);
	}
	return rc < 0 ? IO_FAIL(io, rc, "zinf_io_fault_add: %d rules at most", FAULT_RULES_MAX) : 0;
}

uint64_t
zinf_io_fault_ops(const struct zinf_io *io, int op)
{
	if (!io || io->ops != &zinf_io_fault_ops_table || op < -1 || op > 1) {
		return 0;
	}
	struct fault_ctx *c = io->be;
	pthread_mutex_lock(&c->lock);
	uint64_t n = op < 0 ? c->ops[0] + c->ops[1] : c->ops[op];
	pthread_mutex_unlock(&c->lock);
	return n;
}
