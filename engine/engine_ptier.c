/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_ptier.c: the home of the 16-bit parameters, one table per place (struct
 * eng_ptier), chosen once at init:
 *  - full (stages 0-2): every rank keeps every tensor gathered in device memory (dev_full);
 *    its partition is the slice at part.offset;
 *  - stage 3, zero_optimization.offload_param.device none (gpu): this rank's partition in
 *    device memory (dev_part); cpu: in the parameter pool's pinned CPU region (cpu_part);
 *    nvme: a tensor of the parameter store (offload/store.c) over the parameters' swap space,
 *    read into one of the pool's buffers for a fetch and written back after a step.
 * Each table writes new values into the home (after a step, at init and load), reads a
 * partition back (the speculative step's reserve) and puts it at its place in a gathered
 * buffer (a fetch; engine_fetch.c all-gathers from there).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "engine/engine_internal.h"

static size_t
dsize(const struct zinf_engine *e)
{
	return eng_dsize(e);
}

/* A piece of p's partition from src (device or host memory) into device memory dst, on x->s.
 * A host source is synchronised by the caller (eng_param_home_write). */
static int
write_device(const struct ectx *x, char *dst, const char *src, bool src_dev, size_t bytes)
{
	if (!src_dev) {
		x->st->h2d_bytes += bytes;
	}
	return zinf_device_copy(x->s, dst, src, bytes, src_dev ? ZINF_COPY_D2D : ZINF_COPY_H2D);
}

static int
read_device(const struct ectx *x, char *dst, const char *src, bool dst_dev, size_t bytes)
{
	if (!dst_dev) {
		x->st->d2h_bytes += bytes;
	}
	return zinf_device_copy(x->s, dst, src, bytes, dst_dev ? ZINF_COPY_D2D : ZINF_COPY_D2H);
}

static int
reads_none(struct zinf_engine *e, struct eparam *p)
{
	(void)e, (void)p;
	return 0;
}

static int
pool_none(const struct zinf_engine *e, uint32_t align, struct zinf_pool_opts *po)
{
	(void)e, (void)align;
	zinf_pool_opts_init(po);
	return 0;
}

static void
free_none(struct zinf_engine *e)
{
	(void)e;
}

/* ---- full (stages 0-2) ---------------------------------------------------------------------- */

static int
full_setup(struct zinf_engine *e)
{
	(void)e; /* dev_full, which every stage-0-2 parameter has (param_homes) */
	return 0;
}

static int
full_write(struct zinf_engine *e, const struct ectx *x, struct eparam *p, uint64_t off,
	   const char *src, bool src_dev, uint64_t len)
{
	size_t ds = dsize(e);
	return write_device(x, (char *)p->dev_full + (p->part.offset + off) * ds, src, src_dev,
			    len * ds);
}

static int
full_read(struct zinf_engine *e, const struct ectx *x, struct eparam *p, char *dst, bool dst_dev)
{
	size_t ds = dsize(e);
	return read_device(x, dst, (char *)p->dev_full + p->part.offset * ds, dst_dev,
			   p->part.part * ds);
}

static int
full_put(struct zinf_engine *e, struct eparam *p)
{
	(void)e, (void)p; /* always in place */
	return 0;
}

const struct eng_ptier eng_ptier_full = {
	.name = "full",
	.queues = true,
	.setup = full_setup,
	.pool = pool_none,
	.free = free_none,
	.write = full_write,
	.read = full_read,
	.read_begin = reads_none,
	.put = full_put,
	.read_end = reads_none,
};

/* ---- gpu (stage 3, offload_param none) ------------------------------------------------------ */

static int
gpu_setup(struct zinf_engine *e)
{
	for (uint32_t i = 0; i < e->n_params; i++) {
		struct eparam *p = &e->params[i];
		int ret = zinf_device_alloc(e->dev, p->part.part * dsize(e), &p->dev_part);
		if (ret) {
			return ENG_FAIL(e, ret, "init: parameter \"%s\": device partition",
					p->name);
		}
	}
	return 0;
}

static int
gpu_write(struct zinf_engine *e, const struct ectx *x, struct eparam *p, uint64_t off,
	  const char *src, bool src_dev, uint64_t len)
{
	size_t ds = dsize(e);
	return write_device(x, (char *)p->dev_part + off * ds, src, src_dev, len * ds);
}

static int
gpu_read(struct zinf_engine *e, const struct ectx *x, struct eparam *p, char *dst, bool dst_dev)
{
	return read_device(x, dst, p->dev_part, dst_dev, p->part.part * dsize(e));
}

static int
gpu_put(struct zinf_engine *e, struct eparam *p)
{
	size_t ds = dsize(e);
	return zinf_device_copy(e->cs, (char *)p->dev_full + p->part.offset * ds, p->dev_part,
				p->part.part * ds, ZINF_COPY_D2D);
}

const struct eng_ptier eng_ptier_gpu = {
	.name = "gpu",
	.queues = true,
	.setup = gpu_setup,
	.pool = pool_none,
	.free = free_none, /* dev_part: eng_param_free */
	.write = gpu_write,
	.read = gpu_read,
	.read_begin = reads_none,
	.put = gpu_put,
	.read_end = reads_none,
};

/* ---- cpu ------------------------------------------------------------------------------------ */

/* The parameter pool's options but for its sizes and its device. */
static struct zinf_pool_opts
pool_opts(const struct zinf_engine *e)
{
	struct zinf_pool_opts po;
	zinf_pool_opts_init(&po);
	po.pin_memory = e->o.offload_param.pin_memory;
	po.pin_fallback = true;
	po.what = "offload_param";
	return po;
}

/* cpu: a CPU region of every partition, each page-aligned */
static int
cpu_pool(const struct zinf_engine *e, uint32_t align, struct zinf_pool_opts *po)
{
	(void)align;
	size_t ds = dsize(e);
	*po = pool_opts(e);
	for (uint32_t i = 0; i < e->n_params; i++) {
		po->cpu_bytes += ZINF_ALIGN_UP(e->params[i].part.part * ds, 4096);
	}
	return 1;
}

static int
cpu_setup(struct zinf_engine *e)
{
	size_t ds = dsize(e);
	struct zinf_pool_opts po;
	cpu_pool(e, 4096, &po);
	po.device = e->dev;
	int ret = zinf_pool_create(&po, &e->ps.ppool);
	if (ret) {
		return ENG_FAIL(e, ret, "init: pinned pool for offload_param");
	}
	for (uint32_t i = 0; i < e->n_params; i++) {
		struct eparam *p = &e->params[i];
		if ((ret = zinf_pool_cpu_alloc(e->ps.ppool, p->part.part * ds, &p->cpu_part))) {
			return ENG_FAIL(e, ret, "init: parameter \"%s\": CPU partition", p->name);
		}
		memset(p->cpu_part, 0, p->part.part * ds);
	}
	return 0;
}

static int
cpu_write(struct zinf_engine *e, const struct ectx *x, struct eparam *p, uint64_t off,
	  const char *src, bool src_dev, uint64_t len)
{
	size_t ds = dsize(e);
	char *dst = (char *)p->cpu_part + off * ds;
	if (!src_dev) {
		memcpy(dst, src, len * ds);
		return 0;
	}
	x->st->d2h_bytes += len * ds;
	return zinf_device_copy(x->s, dst, src, len * ds, ZINF_COPY_D2H);
}

static int
cpu_read(struct zinf_engine *e, const struct ectx *x, struct eparam *p, char *dst, bool dst_dev)
{
	size_t bytes = p->part.part * dsize(e);
	if (!dst_dev) {
		memcpy(dst, p->cpu_part, bytes);
		return 0;
	}
	x->st->h2d_bytes += bytes;
	return zinf_device_copy(x->s, dst, p->cpu_part, bytes, ZINF_COPY_H2D);
}

static int
cpu_put(struct zinf_engine *e, struct eparam *p)
{
	size_t ds = dsize(e), bytes = p->part.part * ds;
	e->win.h2d_bytes += bytes;
	return zinf_device_copy(e->cs, (char *)p->dev_full + p->part.offset * ds, p->cpu_part,
				bytes, ZINF_COPY_H2D);
}

const struct eng_ptier eng_ptier_cpu = {
	.name = "cpu",
	.setup = cpu_setup,
	.pool = cpu_pool,
	.free = free_none, /* the pool: eng_param_free */
	.write = cpu_write,
	.read = cpu_read,
	.read_begin = reads_none,
	.put = cpu_put,
	.read_end = reads_none,
};

/* ---- nvme ----------------------------------------------------------------------------------- */

/*
 * The store's cache region (offload_param.max_in_cpu elements of the 16-bit type), capped at
 * what this rank's partitions take there (each its swap extent: its bytes aligned, at least one
 * alignment unit), so a small model's cache costs its partitions and no more.
 */
static uint64_t
nvme_cache_bytes(const struct zinf_engine *e, uint32_t align)
{
	size_t ds = dsize(e);
	uint64_t need = 0, want = 0;
	for (uint32_t i = 0; i < e->n_params; i++) {
		uint64_t b = e->params[i].part.part * ds;
		need += ZINF_ALIGN_UP(b ? b : 1, (uint64_t)align);
	}
	if (__builtin_mul_overflow(e->o.offload_param.max_in_cpu, (uint64_t)ds, &want) ||
	    want > need) {
		return need;
	}
	return ZINF_ALIGN_UP(want, (uint64_t)align);
}

/* nvme: buffer_count buffers of the largest partition, and the cache region in the CPU region */
static int
nvme_pool(const struct zinf_engine *e, uint32_t align, struct zinf_pool_opts *po)
{
	uint64_t max_part = 0;
	for (uint32_t i = 0; i < e->n_params; i++) {
		max_part = ZINF_MAX(max_part, e->params[i].part.part);
	}
	*po = pool_opts(e);
	po->align = align;
	po->buffer_bytes = ZINF_ALIGN_UP(max_part * dsize(e), po->align);
	po->buffer_count = e->o.offload_param.buffer_count;
	po->cpu_bytes = nvme_cache_bytes(e, align);
	po->cpu_key = "max_in_cpu";
	return 1;
}

static int
nvme_setup(struct zinf_engine *e)
{
	size_t ds = dsize(e);
	struct zinf_pool_opts po;
	int ret = eng_open_swap(e, &e->o.offload_param, "param", &e->ps.pswap);
	if (ret) {
		return ret;
	}
	nvme_pool(e, zinf_swap_align(e->ps.pswap), &po);
	po.io = e->io;
	po.device = e->dev;
	if ((ret = zinf_pool_create(&po, &e->ps.ppool))) {
		return ENG_FAIL(e, ret, "init: pinned pool for offload_param");
	}
	struct zinf_store_opts so;
	zinf_store_opts_init(&so);
	so.pool = e->ps.ppool;
	so.swap = e->ps.pswap;
	so.cache_bytes = po.cpu_bytes; /* max_in_cpu: the region, never the buffers */
	so.prefetch_bytes = e->o.stage3_prefetch_bucket_size * ds;
	so.prefetch_evicts = 1; /* prefetches follow the trace: the cache gives way */
	if ((ret = zinf_store_create(&so, &e->ps.store))) {
		return ENG_FAIL(e, ret, "init: parameter store");
	}
	for (uint32_t i = 0; i < e->n_params; i++) {
		struct eparam *p = &e->params[i];
		ret = zinf_store_add(e->ps.store, "param16", i, p->part.part, (uint32_t)ds,
				     ZINF_TIER_NVME);
		if (ret < 0) {
			return ENG_FAIL(e, ret, "init: parameter \"%s\": NVMe tensor", p->name);
		}
		p->store_id = ret;
	}
	if ((ret = zinf_swap_reserve(e->ps.pswap))) {
		return ENG_FAIL(e, ret, "init: reserving the parameters' swap files");
	}
	return 0;
}

static void
nvme_free(struct zinf_engine *e)
{
	zinf_store_destroy(e->ps.store);
	e->ps.store = NULL;
}

/*
 * The pieces of one partition arrive in order, from one context (the step's pieces of its
 * sub-group, init's): the first swaps the partition in without reading it (ZINF_STORE_NEW:
 * every element is about to be written), the last marks it dirty and releases it, which writes
 * it once. Between pieces the store keeps it in use (e->ps.nv_open), and the writer holds
 * store_mu (eng_param_home_write): fetch, under the same mutex, never waits for a buffer the
 * writer holds.
 */
static int
nvme_write(struct zinf_engine *e, const struct ectx *x, struct eparam *p, uint64_t off,
	   const char *src, bool src_dev, uint64_t len)
{
	size_t ds = dsize(e);
	int ret = 0;
	if (off == 0 && e->ps.nv_open < 0) {
		ret = zinf_store_swap_in(e->ps.store, p->store_id, ZINF_STORE_NEW);
		if (!ret) {
			ret = zinf_store_wait(e->ps.store, p->store_id, &e->ps.nv_buf);
		}
		if (ret) {
			return ENG_FAIL(e, ret, "parameter \"%s\": a buffer for its NVMe partition",
					p->name);
		}
		e->ps.nv_open = (int64_t)p->id;
		e->ps.nv_next = 0;
	} else if (e->ps.nv_open != (int64_t)p->id || off != e->ps.nv_next) {
		return ENG_FAIL(e, -EPROTO,
				"parameter \"%s\": new values at %" PRIu64
				" out of order (partition open: %" PRId64 ", next %" PRIu64 ")",
				p->name, off, e->ps.nv_open, e->ps.nv_next);
	}
	char *dst = (char *)e->ps.nv_buf + off * ds;
	if (src_dev) {
		ret = zinf_device_copy(x->s, dst, src, len * ds, ZINF_COPY_D2H);
		if (!ret) {
			ret = zinf_stream_sync(x->s);
		}
	} else {
		memcpy(dst, src, len * ds);
	}
	e->ps.nv_next = off + len;
	if (ret || e->ps.nv_next == p->part.part) {
		if (!ret) {
			ret = zinf_store_mark_dirty(e->ps.store, p->store_id);
		}
		/* a failed piece leaves the buffer partly new: dropped, not cached as clean */
		int r2 = ret ? zinf_store_drop(e->ps.store, p->store_id)
			     : zinf_store_release(e->ps.store, p->store_id);
		ret = ret ? ret : r2;
		if (!ret) {
			/* counted as the write starts: the step that caused it, not the window
			   in which it completes */
			uint64_t bytes = zinf_store_bytes(e->ps.store, p->store_id);
			x->st->nvme_write_bytes += bytes;
			x->st->param_nvme_write_bytes += bytes;
		}
		e->ps.nv_open = -1;
		e->ps.nv_buf = NULL;
	}
	return ret ? ENG_FAIL(e, ret, "parameter \"%s\": writing its NVMe partition", p->name) : 0;
}

/* The parameter store's bytes read so far (completed reads; under store_mu with a second thread
 * about). */
static uint64_t
store_read_bytes(struct zinf_engine *e)
{
	struct zinf_store_stats st = {.size = sizeof(st)};
	return zinf_store_get_stats(e->ps.store, &st) ? 0 : st.read_bytes;
}

/* The partition read into a store buffer (store_mu: the step worker writes new values into
 * the store during backward), then copied. */
static int
nvme_read(struct zinf_engine *e, const struct ectx *x, struct eparam *p, char *dst, bool dst_dev)
{
	size_t bytes = p->part.part * dsize(e);
	void *buf = NULL;
	pthread_mutex_lock(&e->ps.store_mu);
	uint64_t rd0 = x->outside_window ? store_read_bytes(e) : 0;
	int ret = zinf_store_swap_in(e->ps.store, p->store_id, 0);
	if (!ret) {
		ret = zinf_store_wait(e->ps.store, p->store_id, &buf);
	}
	if (x->outside_window) {
		/* the store counts a read as its wait completes it, and every wait is under
		   store_mu: the difference is this partition's read (0 from the cache) */
		e->ps.store_read0 += store_read_bytes(e) - rd0;
	}
	if (!ret && dst_dev) {
		ret = zinf_device_copy(x->s, dst, buf, bytes, ZINF_COPY_H2D);
		ret = ret ? ret : zinf_stream_sync(x->s);
		x->st->h2d_bytes += bytes;
	} else if (!ret) {
		memcpy(dst, buf, bytes);
	}
	if (buf) {
		int r2 = zinf_store_release(e->ps.store, p->store_id);
		ret = ret ? ret : r2;
	}
	pthread_mutex_unlock(&e->ps.store_mu);
	return ret;
}

static int
nvme_read_begin(struct zinf_engine *e, struct eparam *p)
{
	return zinf_store_swap_in(e->ps.store, p->store_id, 0);
}

static int
nvme_put(struct zinf_engine *e, struct eparam *p)
{
	size_t ds = dsize(e), bytes = p->part.part * ds;
	void *buf = NULL;
	int ret = zinf_store_wait(e->ps.store, p->store_id, &buf);
	if (ret) {
		return ENG_FAIL(e, ret, "fetch: parameter \"%s\": reading its NVMe partition: %s",
				p->name, zinf_last_error());
	}
	/* NVMe bytes are the store's own count (eng_param_io_stats): a partition served from its
	   cache is read from no file */
	e->win.h2d_bytes += bytes;
	return zinf_device_copy(e->cs, (char *)p->dev_full + p->part.offset * ds, buf, bytes,
				ZINF_COPY_H2D);
}

static int
nvme_read_end(struct zinf_engine *e, struct eparam *p)
{
	return zinf_store_release(e->ps.store, p->store_id);
}

static void
nvme_prefetch(struct zinf_engine *e, struct eparam *p)
{
	(void)zinf_store_prefetch(e->ps.store, p->store_id); /* -ENOSPC: over the budget alone */
}

static bool
nvme_read_done(struct zinf_engine *e, const struct eparam *p)
{
	return zinf_store_ready(e->ps.store, p->store_id) == 1;
}

const struct eng_ptier eng_ptier_nvme = {
	.name = "nvme",
	.reads = true,
	.setup = nvme_setup,
	.pool = nvme_pool,
	.free = nvme_free,
	.write = nvme_write,
	.read = nvme_read,
	.read_begin = nvme_read_begin,
	.put = nvme_put,
	.read_end = nvme_read_end,
	.prefetch = nvme_prefetch,
	.read_done = nvme_read_done,
};

/* ---- the tier's state, for the files beside it ---------------------------------------------- */

void
eng_store_lock(struct zinf_engine *e)
{
	pthread_mutex_lock(&e->ps.store_mu);
}

void
eng_store_unlock(struct zinf_engine *e)
{
	pthread_mutex_unlock(&e->ps.store_mu);
}

/* A piece of p's new values home. A partition read into a store buffer is held from its first
 * piece to its last (e->ps.nv_open) with the store's mutex: fetch never waits for a buffer the
 * writer holds. */
int
eng_param_write(struct zinf_engine *e, const struct ectx *x, struct eparam *p, uint64_t off,
		const char *src, bool src_dev, uint64_t len)
{
	if (e->pt->reads && e->ps.nv_open < 0) {
		pthread_mutex_lock(&e->ps.store_mu);
	}
	int ret = e->pt->write(e, x, p, off, src, src_dev, len);
	if (e->pt->reads && e->ps.nv_open < 0) {
		pthread_mutex_unlock(&e->ps.store_mu);
	}
	return ret;
}

/* A writer that failed between the pieces of a partition: give the partition (unchanged on
 * NVMe; its buffer, partly new, dropped rather than cached) and the store back. On the thread
 * that wrote the pieces. */
void
eng_param_write_abort(struct zinf_engine *e)
{
	if (e->ps.nv_open < 0) {
		return;
	}
	zinf_store_drop(e->ps.store, e->params[e->ps.nv_open].store_id);
	e->ps.nv_open = -1;
	e->ps.nv_buf = NULL;
	pthread_mutex_unlock(&e->ps.store_mu);
}

/* The window's NVMe reads of the parameter store (cache hits not counted), folded into the
 * window's counters; called at the window's end and after init. Its writes are counted as
 * nvme_write starts them. */
void
eng_param_io_stats(struct zinf_engine *e)
{
	struct zinf_store_stats st = {.size = sizeof(st)};
	if (!e->ps.store) {
		return;
	}
	/* store_mu: a background save's reads advance store_read0 (nvme_read); a partition left
	   open by this thread's failed write holds the mutex already (eng_param_write) */
	bool lock = e->ps.nv_open < 0;
	if (lock) {
		pthread_mutex_lock(&e->ps.store_mu);
	}
	if (!zinf_store_get_stats(e->ps.store, &st)) {
		uint64_t rd = st.read_bytes - e->ps.store_read0;
		e->win.nvme_read_bytes += rd;
		e->win.param_nvme_read_bytes += rd;
		e->ps.store_read0 = st.read_bytes;
	}
	if (lock) {
		pthread_mutex_unlock(&e->ps.store_mu);
	}
}

void
eng_ptier_destroy(struct zinf_engine *e)
{
	if (e->pt) { /* NULL: create failed before choosing it */
		e->pt->free(e);
	}
	zinf_pool_destroy(e->ps.ppool);
	e->ps.ppool = NULL;
	zinf_swap_destroy(e->ps.pswap);
	e->ps.pswap = NULL;
}

/* The NVMe tiers' I/O context options from the engine's (init and the options check). */
static void
io_opts(const struct zinf_engine_opts *o, struct zinf_io_opts *io)
{
	zinf_io_opts_init(io);
	io->backend = o->io_backend;
	io->queue_depth = o->aio.queue_depth;
	io->block_size = o->aio.block_size;
	io->threads = o->aio.intra_op_parallelism;
}

static int
open_io(struct zinf_engine *e)
{
	if (e->io) {
		return 0;
	}
	struct zinf_io_opts io;
	io_opts(&e->o, &io);
	int ret = zinf_io_create(&io, &e->io);
	return ret ? ENG_FAIL(e, ret, "init: cannot open the I/O context for the NVMe tiers") : 0;
}

int
eng_check_io(const struct zinf_engine_opts *o)
{
	const struct zinf_offload_opts *sec[2] = {&o->offload_param, &o->offload_optimizer};
	static const char *const key[2] = {"zero_optimization.offload_param",
					   "zero_optimization.offload_optimizer"};
	bool nvme[2] = {o->stage == 3 && sec[0]->device == ZINF_OFFLOAD_NVME,
			sec[1]->device == ZINF_OFFLOAD_NVME};
	if (!nvme[0] && !nvme[1]) {
		return 0; /* init opens no I/O context */
	}
	struct zinf_io_opts io;
	struct zinf_io *ctx = NULL;
	io_opts(o, &io);
	int ret = zinf_io_create(&io, &ctx);
	if (ret) {
		return ZINF_FAIL(ret,
				 "engine: aio: block_size %u, queue_depth %u, intra_op_parallelism "
				 "%u: the I/O engine refuses them (%s)",
				 o->aio.block_size, o->aio.queue_depth, o->aio.intra_op_parallelism,
				 zinf_strerror(ret));
	}
	/* every path as the swap space opens it (swap files are opened with O_DIRECT) */
	for (int k = 0; k < 2; k++) {
		for (uint32_t i = 0; nvme[k] && i < sec[k]->n_paths; i++) {
			bool seen = false; /* a path both sections name: checked once */
			for (uint32_t j = 0; k == 1 && nvme[0] && j < sec[0]->n_paths; j++) {
				seen |= strcmp(sec[0]->nvme_path[j], sec[1]->nvme_path[i]) == 0;
			}
			int r = seen ? 0 : zinf_swap_check_dir(ctx, sec[k]->nvme_path[i], false);
			if (r) {
				ZINF_FAIL(
					r,
					"engine: %s.nvme_path \"%s\": cannot hold swap files (%s)",
					key[k], sec[k]->nvme_path[i], zinf_strerror(r));
				ret = ret ? ret : r;
			}
		}
	}
	zinf_io_destroy(ctx);
	return ret;
}

int
eng_open_swap(struct zinf_engine *e, const struct zinf_offload_opts *s, const char *what,
	      struct zinf_swap **out)
{
	int ret = open_io(e);
	if (ret) {
		return ret;
	}
	char prefix[256];
	snprintf(prefix, sizeof(prefix), "%s-%s", e->o.swap_prefix, what);
	struct zinf_swap_opts so;
	zinf_swap_opts_init(&so);
	so.dirs = s->nvme_path;
	so.n_dirs = s->n_paths;
	so.rank = e->rank;
	so.prefix = prefix;
	ret = zinf_swap_create(e->io, &so, out);
	return ret ? ENG_FAIL(e, ret, "init: swap space for %s under %s", what, s->nvme_path[0])
		   : 0;
}

/* ---- the 16-bit tiers ---------------------------------------------------------------------- */
