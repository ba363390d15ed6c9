/* SPDX-License-Identifier: Apache-2.0 */
/*
 * nvme/io_psync.c: the pread/pwrite backend. Each worker executes one op at a time, so the
 * core runs threads x queue_depth workers (at most 64) of depth 1 instead: the queue depth
 * seen by the disk is the same. Works on every file system, with or without O_DIRECT.
 */
#include "nvme/io_internal.h"

struct psync_worker {
	struct zinf_io_worker w;
	struct zinf_io_blk *queued[]; /* [depth] */
};

static int
psync_worker_create(struct zinf_io *io, unsigned id, unsigned depth, struct zinf_io_worker **out)
{
	struct psync_worker *p = zc_calloc(1, sizeof(*p) + depth * sizeof(p->queued[0]));
	if (!p) {
		return IO_FAIL(io, -ENOMEM, "psync worker %u: out of memory", id);
	}
	int rc = io_worker_init(&p->w, io, id, depth);
	if (rc < 0) {
		zc_free(p);
		return rc;
	}
	*out = &p->w;
	return 0;
}

static void
psync_worker_destroy(struct zinf_io_worker *w)
{
	io_worker_fini(w);
	zc_free(zinf_container_of(w, struct psync_worker, w));
}

static int
psync_queue(struct zinf_io_worker *w, struct zinf_io_blk *b)
{
	struct psync_worker *p = zinf_container_of(w, struct psync_worker, w);
	p->queued[b->idx] = b;
	return 0;
}

static int
psync_submit(struct zinf_io_worker *w)
{
	return 0;
}

/* Execute every queued op; the results go back to the core, which checks them. */
static int
psync_reap(struct zinf_io_worker *w, struct zinf_io_blk **out, unsigned min, unsigned max)
{
	struct psync_worker *p = zinf_container_of(w, struct psync_worker, w);
	unsigned n = 0;
	for (unsigned i = 0; i < w->depth && n < max; i++) {
		struct zinf_io_blk *b = p->queued[i];
		if (b) {
			p->queued[i] = NULL;
			b->res = io_blk_sync(b);
			out[n++] = b;
		}
	}
	return (int)n;
}

const struct zinf_io_ops zinf_io_psync_ops = {
	.name = "psync",
	.flags = ZINF_IO_F_SYNC,
	.worker_create = psync_worker_create,
	.worker_destroy = psync_worker_destroy,
	.queue = psync_queue,
	.submit = psync_submit,
	.reap = psync_reap,
};
