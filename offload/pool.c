/* SPDX-License-Identifier: Apache-2.0 */
/*
 * offload/pool.c: the pinned pool. One mapping, sized from the options and checked against
 * RLIMIT_MEMLOCK and physical memory before it is made, 2 MiB-aligned and advised for huge
 * pages before the first touch, bound to a NUMA node, locked, carved
 * into equal aligned buffers (a free stack under a mutex, waiters on a condition variable) and
 * one CPU-tier region (a bump allocator), registered once with io_uring and the device table.
 * It does not know what the buffers hold: the store and the step decide that.
 */
#include <inttypes.h>
#include <linux/capability.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "common/opts.h"
#include "common/util.h"
#include "offload/offload_internal.h"
#include "zinf/device.h"
#include "zinf/blocks/io.h"
#include "zinf/blocks/offload.h"

ZINF_OPTS_NO_TAIL_PAD(struct zinf_pool_opts, cpu_key);

#define IOV_MAX_BYTES (1ULL << 30) /* io_uring caps one fixed buffer at 1 GiB */
#define POOL_HUGE     (2ULL << 20) /* zinf_alloc_huge() aligns to a 2 MiB huge page */

struct pool_buf {
	bool in_use;
	pthread_t owner; /* thread that acquired it (for -EDEADLK) */
};

struct zinf_pool {
	struct zinf_pool_opts o;
	char what[64];
	char cpu_key[64]; /* opts.cpu_key, or "" */
	char *map;	  /* the mapping as made (zinf_free_huge) */
	size_t map_len;
	char *base;	    /* aligned start of the buffers */
	uint64_t bytes;	    /* buffers + CPU region */
	uint64_t buf_bytes; /* one buffer */
	uint32_t count;
	char *cpu; /* CPU-tier region */
	uint64_t cpu_bytes, cpu_used;
	bool pinned;
	int node;
	struct zinf_device *dev; /* opts.device, or the pool's own (dev_owned) */
	bool dev_owned;
	bool dev_registered;
	struct zinf_io *io;
	bool io_registered;

	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct pool_buf *bufs;
	uint32_t *free_stack;
	uint32_t nfree;
};

void
zinf_pool_opts_init(struct zinf_pool_opts *o)
{
	if (!o) {
		return;
	}
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	o->align = 4096;
	o->pin_memory = true;
	o->numa_node = -1;
	o->what = "offload_optimizer";
}

/* CAP_IPC_LOCK in the effective set: RLIMIT_MEMLOCK does not bind. */
static bool
has_ipc_lock(void)
{
	struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
	struct __user_cap_data_struct data[2];
	memset(data, 0, sizeof(data));
	if (syscall(SYS_capget, &hdr, data) != 0) {
		return false;
	}
	return (data[CAP_TO_INDEX(CAP_IPC_LOCK)].effective & CAP_TO_MASK(CAP_IPC_LOCK)) != 0;
}

/* Bytes this process has locked already (VmLck), 0 if unknown. */
static uint64_t
locked_now(void)
{
	FILE *f = fopen("/proc/self/status", "re");
	if (!f) {
		return 0;
	}
	char line[256];
	uint64_t kb = 0;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "VmLck: %" SCNu64, &kb) == 1) {
			break;
		}
	}
	fclose(f);
	return kb * 1024;
}

static uint64_t
page_size(void)
{
	long p = sysconf(_SC_PAGESIZE);
	return p > 0 ? (uint64_t)p : 4096;
}

static void
fmt_bytes(char *out, size_t len, uint64_t b)
{
	if (b == UINT64_MAX) {
		snprintf(out, len, "unlimited");
	} else if (b >= (1ULL << 30)) {
		snprintf(out, len, "%.2f GiB (%" PRIu64 " bytes)", b / 1073741824.0, b);
	} else if (b >= (1ULL << 20)) {
		snprintf(out, len, "%.2f MiB (%" PRIu64 " bytes)", b / 1048576.0, b);
	} else {
		snprintf(out, len, "%" PRIu64 " bytes", b);
	}
}

/* " or <what>.<cpu_key>" when the CPU region is sized by a setting (opts.cpu_key), else "": the
 * messages' other setting to lower. */
static const char *
or_cpu_key(char *out, size_t len, const struct zinf_pool_opts *o)
{
	if (o->cpu_key && *o->cpu_key) {
		snprintf(out, len, " or %s.%s", o->what, o->cpu_key);
	} else {
		out[0] = 0;
	}
	return out;
}

/* Take the caller's options over the defaults (common/opts.h) into *o, and check them. */
static int
take_opts(const struct zinf_pool_opts *in, struct zinf_pool_opts *o)
{
	zinf_pool_opts_init(o);
	int rc = zc_opts_take(o, sizeof(*o), in, "zinf_pool_opts");
	if (rc) {
		return rc;
	}
	if (!o->what) {
		o->what = "offload_optimizer";
	}
	if (!ZINF_IS_POW2(o->align) || o->align < 64) {
		return POOL_FAIL(o, -EINVAL, "align %u is not a power of two >= 64", o->align);
	}
	if ((o->buffer_count == 0) != (o->buffer_bytes == 0)) {
		return POOL_FAIL(o, -EINVAL,
				 "buffer_count %u with buffer_bytes %" PRIu64
				 ": both or neither must be 0",
				 o->buffer_count, o->buffer_bytes);
	}
	if (o->buffer_count == 0 && o->cpu_bytes == 0) {
		return POOL_FAIL(o, -EINVAL, "empty (no buffers, no CPU bytes)");
	}
	return 0;
}

/* The pool's sizes and this machine's limits from checked options into *b (every step checked
 * for wrapping: a wrapped size would pass the budget as a small pool whose buffers lie outside
 * the mapping). Logs and returns -ENOMEM when the sizes overflow 64 bits. */
static int
budget(const struct zinf_pool_opts *o, struct zinf_pool_budget *b)
{
	uint64_t pg = page_size();
	uint64_t gran = ZINF_MAX(pg, (uint64_t)o->align);
	uint64_t bufs = 0, total = 0;
	bool wraps = o->buffer_bytes > UINT64_MAX - o->align;
	if (!wraps) {
		b->buffer_bytes = ZINF_ALIGN_UP(o->buffer_bytes, (uint64_t)o->align);
		wraps = __builtin_mul_overflow(b->buffer_bytes, (uint64_t)o->buffer_count, &bufs) ||
			__builtin_add_overflow(bufs, o->cpu_bytes, &total) ||
			total > UINT64_MAX - gran;
	}
	b->bytes = wraps ? UINT64_MAX : ZINF_ALIGN_UP(total, gran);
	struct rlimit rl;
	b->memlock_limit = (getrlimit(RLIMIT_MEMLOCK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
				   ? (uint64_t)rl.rlim_cur
				   : UINT64_MAX;
	b->memlock_binding = !has_ipc_lock() && b->memlock_limit != UINT64_MAX;
	long pages = sysconf(_SC_PHYS_PAGES);
	b->phys_bytes = pages > 0 ? (uint64_t)pages * pg : 0;
	if (wraps) {
		char ck[96];
		return POOL_FAIL(o, -ENOMEM,
				 "%u buffers of %" PRIu64 " bytes + %" PRIu64
				 " CPU-tier bytes overflow 64 bits: lower %s.buffer_count or "
				 "buffer_size%s",
				 o->buffer_count, o->buffer_bytes, o->cpu_bytes, o->what,
				 or_cpu_key(ck, sizeof(ck), o));
	}
	return 0;
}

int
zinf_pool_size(const struct zinf_pool_opts *opts, struct zinf_pool_budget *out)
{
	struct zinf_pool_budget b = {0};
	struct zinf_pool_opts oo;
	int rc = take_opts(opts, &oo);
	if (!rc) {
		rc = budget(&oo, &b);
	}
	if (out) {
		*out = b;
	}
	return rc;
}

int
zinf_pool_check(const struct zinf_pool_opts *opts, struct zinf_pool_budget *out)
{
	struct zinf_pool_budget b = {0};
	struct zinf_pool_opts oo, *o = &oo;
	int rc = take_opts(opts, o);
	if (rc) {
		if (out) {
			*out = b;
		}
		return rc;
	}
	const char *what = o->what;
	rc = budget(o, &b);
	if (out) {
		*out = b;
	}
	if (rc) {
		return rc;
	}
	char asked[64], lim[64], phys[64], ck[96];
	or_cpu_key(ck, sizeof(ck), o);
	fmt_bytes(asked, sizeof(asked), b.bytes);
	fmt_bytes(lim, sizeof(lim), b.memlock_limit);
	fmt_bytes(phys, sizeof(phys), b.phys_bytes);
	if (b.phys_bytes && b.bytes > b.phys_bytes / 10 * 9) {
		return POOL_FAIL(o, -ENOMEM,
				 "%s asked for (%u buffers of %" PRIu64 " bytes + %" PRIu64
				 " CPU-tier bytes) exceeds 90%% of physical "
				 "memory %s: lower %s.buffer_count or buffer_size%s, or move state "
				 "to NVMe",
				 asked, o->buffer_count, b.buffer_bytes, o->cpu_bytes, phys, what,
				 ck);
	}
	if (o->pin_memory && b.memlock_binding && !o->pin_fallback) {
		if (b.memlock_limit == 0) {
			return POOL_FAIL(o, -EPERM,
					 "%s asked for, but RLIMIT_MEMLOCK is 0 and "
					 "the process lacks CAP_IPC_LOCK: raise it (ulimit -l) or "
					 "set %s.pin_memory: false",
					 asked, what);
		}
		if (b.bytes > b.memlock_limit) {
			return POOL_FAIL(
				o, -ENOMEM,
				"%s asked for (%u buffers of %" PRIu64 " bytes + %" PRIu64
				" CPU-tier bytes) exceeds RLIMIT_MEMLOCK "
				"%s: raise it (ulimit -l, or memlock in "
				"/etc/security/limits.conf), lower %s.buffer_count%s, or set "
				"%s.pin_memory: false",
				asked, o->buffer_count, b.buffer_bytes, o->cpu_bytes, lim, what, ck,
				what);
		}
	}
	return 0;
}

/* The NUMA node to bind to: the option, else the caller's node when there are several. */
static int
choose_node(const struct zinf_pool_opts *o, struct zinf_topo *topo)
{
	if (o->numa_node >= 0) {
		return o->numa_node;
	}
	if (!topo || zinf_topo_numa_nodes(topo) <= 1) {
		return -1;
	}
	unsigned cpu = 0, node = 0;
	if (getcpu(&cpu, &node) != 0) {
		return -1;
	}
	return (int)node;
}

static void
unregister_io(struct zinf_pool *p)
{
	if (p->io_registered) {
		(void)zinf_io_register_buffers(p->io, NULL, 0);
		p->io_registered = false;
	}
}

static void
register_io(struct zinf_pool *p)
{
	if (!p->io || p->count == 0) {
		return;
	}
	uint64_t per = ZINF_DIV_ROUND_UP(p->buf_bytes, IOV_MAX_BYTES);
	unsigned n = (unsigned)(per * p->count);
	struct iovec *iov = zc_calloc(n, sizeof(*iov));
	if (!iov) {
		POOL_WARN(p, "out of memory for %u iovecs: buffers not registered", n);
		return;
	}
	unsigned k = 0;
	for (uint32_t i = 0; i < p->count; i++) {
		char *b = p->base + (uint64_t)i * p->buf_bytes;
		for (uint64_t off = 0; off < p->buf_bytes; off += IOV_MAX_BYTES) {
			iov[k].iov_base = b + off;
			iov[k].iov_len = ZINF_MIN(IOV_MAX_BYTES, p->buf_bytes - off);
			k++;
		}
	}
	int rc = zinf_io_register_buffers(p->io, iov, k);
	/* 0 also when the kernel refused to pin them (a warning, logged by the I/O engine): ask. */
	if (rc == 0 && zinf_io_buffers_registered(p->io) > 0) {
		p->io_registered = true;
	} else if (rc) {
		POOL_WARN(p,
			  "registering %u buffers with the I/O context failed (%s): requests use "
			  "unregistered buffers",
			  k, zinf_strerror(rc));
	}
	zc_free(iov);
}

/* Bind the pool's pages to its NUMA node (the option's, or the caller's with several). An
 * explicit numa_node that cannot be bound is an error; a chosen one is only skipped. */
static int
bind_node(struct zinf_pool *p, const struct zinf_pool_opts *o)
{
	struct zinf_topo *topo = NULL;
	if (zinf_topo_create(&topo) != 0) {
		return 0;
	}
	int rc = 0, node = choose_node(o, topo);
	if (node >= 0) {
		int brc = zinf_topo_bind_area(topo, p->base, p->bytes, node);
		if (brc == -ENODEV && node == 0 && zinf_topo_numa_nodes(topo) == 1) {
			brc = 0; /* no hwloc, one node: the memory is on node 0 anyway */
		}
		if (brc == 0) {
			p->node = node;
		} else if (o->numa_node >= 0) {
			rc = POOL_FAIL(p, brc, "binding to NUMA node %d (numa_node) failed: %s%s",
				       node, zinf_strerror(brc),
				       brc == -ENODEV ? " (zinf was built without hwloc)" : "");
		} else {
			POOL_DEBUG(p, "not bound to node %d (%s)", node, zinf_strerror(brc));
		}
	}
	zinf_topo_destroy(topo);
	return rc;
}

/* mlock the pool (pin_memory). A failure is an error naming the limit and what to change, or
 * with pin_fallback a warning that says the same, and the pool runs unpinned. */
static int
lock_pages(struct zinf_pool *p, const struct zinf_pool_opts *o, const struct zinf_pool_budget *b)
{
	if (!o->pin_memory) {
		return 0;
	}
	if (mlock(p->base, b->bytes) == 0) {
		p->pinned = true;
		return 0;
	}
	int e = errno;
	char asked[64], lim[64], had[64], ck[96];
	or_cpu_key(ck, sizeof(ck), &p->o);
	fmt_bytes(asked, sizeof(asked), b->bytes);
	fmt_bytes(lim, sizeof(lim), b->memlock_limit);
	fmt_bytes(had, sizeof(had), locked_now());
	if (!o->pin_fallback) {
		return POOL_FAIL(
			p, e == EPERM ? -EPERM : -ENOMEM,
			"mlock of %s failed: %s (RLIMIT_MEMLOCK %s%s, already locked by "
			"this process %s): raise ulimit -l, lower %s.buffer_count%s, or set "
			"%s.pin_memory: false",
			asked, strerror(e), lim, b->memlock_binding ? "" : ", not binding", had,
			p->what, ck, p->what);
	}
	POOL_WARN(p,
		  "mlock of %s failed (%s; RLIMIT_MEMLOCK %s): running unpinned (raise ulimit -l "
		  "to pin it%s%s)",
		  asked, strerror(e), lim, ck[0] ? ", or lower" : "", ck[0] ? ck + 3 : "");
	return 0;
}

/* The free stack (buffer 0 handed out first), its lock and the waiters' condition. */
static void
init_free_list(struct zinf_pool *p)
{
	pthread_mutex_init(&p->lock, NULL);
	pthread_condattr_t ca;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&p->cond, &ca);
	pthread_condattr_destroy(&ca);
	for (uint32_t i = 0; i < p->count; i++) {
		p->free_stack[i] = p->count - 1 - i;
	}
	p->nfree = p->count;
}

/* The device the pool registers with: the caller's, or the best present (owned). */
static int
open_device(struct zinf_pool *p, const struct zinf_pool_opts *o)
{
	p->dev = o->device;
	if (p->dev) {
		return 0;
	}
	int rc = zinf_device_create(NULL, &p->dev); /* the best present: cuda, else host */
	p->dev_owned = rc == 0;
	return rc;
}

/*
 * Register the locked pages with the device (an error: the pool exists for it) and the
 * buffers with the I/O context (a refusal is a warning: requests then use plain buffers).
 */
static int
register_all(struct zinf_pool *p, const struct zinf_pool_budget *b)
{
	if (p->pinned && strcmp(zinf_device_backend(p->dev), "host") != 0) {
		int rc = zinf_device_host_register(p->dev, p->base, b->bytes);
		if (rc) {
			return POOL_FAIL(p, rc, "%s host registration of %" PRIu64 " bytes failed",
					 zinf_device_backend(p->dev), b->bytes);
		}
		p->dev_registered = true;
	}
	/*
	 * io_uring pins registered buffers and charges them to RLIMIT_MEMLOCK (without
	 * CAP_IPC_LOCK): an unpinned pool over that limit would only fail to register, with an
	 * error for a case that is handled, so it is not tried.
	 */
	if (p->pinned || !b->memlock_binding || b->bytes <= b->memlock_limit) {
		register_io(p);
	} else if (p->io) {
		POOL_INFO(p,
			  "unpinned and over RLIMIT_MEMLOCK: buffers not registered with the I/O "
			  "context");
	}
	return 0;
}

/* Set-up in the order the pages need it (map, bind, lock, register), one unwind chain. */
int
zinf_pool_create(const struct zinf_pool_opts *opts, struct zinf_pool **out)
{
	if (!out) {
		return OFFLOAD_NULL("output");
	}
	struct zinf_pool_budget b;
	int rc = zinf_pool_check(opts, &b);
	if (rc) {
		return rc;
	}
	struct zinf_pool_opts oo, *o = &oo;
	(void)take_opts(opts, o); /* checked by zinf_pool_check */
	struct zinf_pool *p = zc_calloc(1, sizeof(*p));
	if (!p) {
		return POOL_FAIL(o, -ENOMEM, "out of memory");
	}
	p->o = *o;
	snprintf(p->what, sizeof(p->what), "%s", o->what);
	p->o.what = p->what;
	snprintf(p->cpu_key, sizeof(p->cpu_key), "%s", o->cpu_key ? o->cpu_key : "");
	p->o.cpu_key = p->cpu_key;
	p->io = o->io;
	p->count = o->buffer_count;
	p->buf_bytes = b.buffer_bytes;
	p->bytes = b.bytes;
	p->node = -1;
	rc = -ENOMEM;
	p->bufs = zc_calloc(p->count ? p->count : 1, sizeof(*p->bufs));
	p->free_stack = zc_calloc(p->count ? p->count : 1, sizeof(*p->free_stack));
	if (!p->bufs || !p->free_stack) {
		rc = POOL_FAIL(p, -ENOMEM, "out of memory");
		goto err_free;
	}
	rc = open_device(p, o);
	if (rc) {
		goto err_free;
	}

	/*
	 * 2 MiB-aligned and advised MADV_HUGEPAGE before the first touch (zinf_alloc_huge), in
	 * both branches: pages faulted in before the advice (mlock faults them) stay 4 KiB, and a
	 * block on 4 KiB pages costs the disk more DMA segments. An alignment above 2 MiB
	 * over-maps by that alignment.
	 */
	uint64_t align = ZINF_MAX((uint64_t)o->align, page_size());
	p->map_len = b.bytes + (align > POOL_HUGE ? align : 0);
	p->map = zinf_alloc_huge(p->map_len);
	if (!p->map) {
		char asked[64];
		fmt_bytes(asked, sizeof(asked), b.bytes);
		rc = POOL_FAIL(p, -ENOMEM, "mmap of %s failed: %s", asked, strerror(errno));
		goto err_free;
	}
	p->base = (char *)ZINF_ALIGN_UP((uintptr_t)p->map, (uintptr_t)align);
	p->cpu = p->base + ZINF_ALIGN_UP(p->buf_bytes * p->count, (uint64_t)o->align);
	p->cpu_bytes = o->cpu_bytes;

	/* Bind before the pages are touched (mlock faults them in), so they land on the node. */
	rc = bind_node(p, o);
	if (rc) {
		goto err_unmap;
	}
	rc = lock_pages(p, o, &b);
	if (rc) {
		goto err_unmap;
	}

	rc = register_all(p, &b);
	if (rc) {
		goto err_unlock;
	}

	init_free_list(p);
	POOL_INFO(p,
		  "%u buffers of %" PRIu64 " bytes + %" PRIu64 " CPU bytes, %s, node %d, device %s",
		  p->count, p->buf_bytes, p->cpu_bytes, p->pinned ? "pinned" : "unpinned", p->node,
		  zinf_device_backend(p->dev));
	*out = p;
	return 0;

err_unlock:
	if (p->pinned) {
		munlock(p->base, b.bytes);
	}
err_unmap:
	zinf_free_huge(p->map, p->map_len);
err_free:
	if (p->dev_owned) {
		zinf_device_destroy(p->dev);
	}
	zc_free(p->free_stack);
	zc_free(p->bufs);
	zc_free(p);
	return rc;
}

void
zinf_pool_destroy(struct zinf_pool *p)
{
	if (!p) {
		return;
	}
	if (p->nfree != p->count) {
		POOL_ERR(p, "destroyed with %u of %u buffers still acquired", p->count - p->nfree,
			 p->count);
	}
	unregister_io(p);
	if (p->dev_registered) {
		zinf_device_host_unregister(p->dev, p->base);
	}
	if (p->pinned) {
		munlock(p->base, p->bytes);
	}
	zinf_free_huge(p->map, p->map_len);
	if (p->dev_owned) {
		zinf_device_destroy(p->dev);
	}
	pthread_cond_destroy(&p->cond);
	pthread_mutex_destroy(&p->lock);
	zc_free(p->free_stack);
	zc_free(p->bufs);
	zc_free(p);
}

/* Getters: a NULL pool reads as an empty one. */
uint64_t
zinf_pool_buffer_bytes(const struct zinf_pool *p)
{
	return p ? p->buf_bytes : 0;
}

uint32_t
zinf_pool_buffer_count(const struct zinf_pool *p)
{
	return p ? p->count : 0;
}

uint64_t
zinf_pool_bytes(const struct zinf_pool *p)
{
	return p ? p->bytes : 0;
}

bool
zinf_pool_pinned(const struct zinf_pool *p)
{
	return p ? p->pinned : false;
}

int
zinf_pool_numa_node(const struct zinf_pool *p)
{
	return p ? p->node : -1;
}

const char *
zinf_pool_device(const struct zinf_pool *p)
{
	return p ? zinf_device_backend(p->dev) : NULL;
}

const char *
offload_pool_what(const struct zinf_pool *p)
{
	return p->what;
}

uint32_t
zinf_pool_free_count(struct zinf_pool *p)
{
	if (!p) {
		return 0;
	}
	pthread_mutex_lock(&p->lock);
	uint32_t n = p->nfree;
	pthread_mutex_unlock(&p->lock);
	return n;
}

/* Called with the lock held: does the calling thread hold every buffer? */
static bool
all_held_by_me(const struct zinf_pool *p)
{
	pthread_t me = pthread_self();
	for (uint32_t i = 0; i < p->count; i++) {
		if (!p->bufs[i].in_use || !pthread_equal(p->bufs[i].owner, me)) {
			return false;
		}
	}
	return true;
}

int
zinf_pool_acquire(struct zinf_pool *p, int timeout_ms, void **buf)
{
	if (!p || !buf) {
		return OFFLOAD_NULL(p ? "buffer output" : "pool");
	}
	if (p->count == 0) {
		return POOL_FAIL(p, -ENOMEM, "has no buffers: set %s.buffer_count", p->what);
	}
	struct timespec deadline;
	if (timeout_ms > 0) {
		clock_gettime(CLOCK_MONOTONIC, &deadline);
		deadline.tv_sec += timeout_ms / 1000;
		deadline.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
		if (deadline.tv_nsec >= 1000000000L) {
			deadline.tv_sec++;
			deadline.tv_nsec -= 1000000000L;
		}
	}
	int rc = 0;
	pthread_mutex_lock(&p->lock);
	while (p->nfree == 0) {
		if (timeout_ms == 0) {
			rc = -EAGAIN;
			break;
		}
		if (all_held_by_me(p)) {
			rc = -EDEADLK;
			break;
		}
		if (timeout_ms < 0) {
			pthread_cond_wait(&p->cond, &p->lock);
		} else if (pthread_cond_timedwait(&p->cond, &p->lock, &deadline) == ETIMEDOUT &&
			   p->nfree == 0) {
			rc = -ETIMEDOUT;
			break;
		}
	}
	if (rc == 0) {
		uint32_t i = p->free_stack[--p->nfree];
		p->bufs[i].in_use = true;
		p->bufs[i].owner = pthread_self();
		*buf = p->base + (uint64_t)i * p->buf_bytes;
		rc = (int)i;
	}
	pthread_mutex_unlock(&p->lock);
	if (rc == -EAGAIN || rc == -ETIMEDOUT) {
		return POOL_FAIL(p, rc,
				 "all %u buffers of %" PRIu64
				 " bytes in use%s: raise %s.buffer_count",
				 p->count, p->buf_bytes,
				 rc == -ETIMEDOUT ? " (waited the timeout)" : "", p->what);
	}
	if (rc == -EDEADLK) {
		return POOL_FAIL(p, rc,
				 "all %u buffers are held by this thread; "
				 "waiting would never end: raise %s.buffer_count",
				 p->count, p->what);
	}
	return rc;
}

int
zinf_pool_release(struct zinf_pool *p, void *buf)
{
	if (!p) {
		return OFFLOAD_NULL("pool");
	}
	char *c = buf;
	if (!c || c < p->base || c >= p->base + p->buf_bytes * p->count ||
	    (uint64_t)(c - p->base) % p->buf_bytes != 0) {
		return POOL_FAIL(p, -EINVAL, "%p is not one of its buffers", buf);
	}
	uint32_t i = (uint32_t)((uint64_t)(c - p->base) / p->buf_bytes);
	pthread_mutex_lock(&p->lock);
	if (!p->bufs[i].in_use) {
		pthread_mutex_unlock(&p->lock);
		return POOL_FAIL(p, -EINVAL, "buffer %u released twice", i);
	}
	p->bufs[i].in_use = false;
	p->free_stack[p->nfree++] = i;
	pthread_cond_signal(&p->cond);
	pthread_mutex_unlock(&p->lock);
	return 0;
}

int
zinf_pool_cpu_alloc(struct zinf_pool *p, uint64_t bytes, void **out)
{
	if (!p || !out) {
		return OFFLOAD_NULL(p ? "output" : "pool");
	}
	pthread_mutex_lock(&p->lock);
	uint64_t left = p->cpu_bytes - p->cpu_used;
	uint64_t need = bytes > left ? left + 1 : ZINF_ALIGN_UP(bytes, (uint64_t)p->o.align);
	if (need > left) {
		uint64_t used = p->cpu_used;
		pthread_mutex_unlock(&p->lock);
		return POOL_FAIL(p, -ENOMEM,
				 "CPU-tier region exhausted: %" PRIu64 " bytes asked, %" PRIu64
				 " of %" PRIu64 " used: raise the pool's cpu_bytes",
				 bytes, used, p->cpu_bytes);
	}
	*out = p->cpu + p->cpu_used;
	p->cpu_used += need;
	pthread_mutex_unlock(&p->lock);
	return 0;
}
