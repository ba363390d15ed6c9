/* SPDX-License-Identifier: Apache-2.0 */
/*
 * offload/store.c: tensor residency. Each tensor has a home tier and a state:
 *
 *   ABSENT --swap_in--> READING --wait--> RESIDENT --release (dirty)--> WRITING --> ABSENT
 *                                          |  ^--- swap_in during a write: wait, keep buffer
 *                                          +--release (clean)--> cached (still RESIDENT) or ABSENT
 *   WRITING --done--> cached (still RESIDENT, clean) under max_in_cpu, else ABSENT
 *
 * An NVMe-homed tensor holds a pool buffer while READING, RESIDENT or WRITING; CPU-homed ones
 * live in the pool's CPU region and are always RESIDENT. Every tensor has its own swap op, so
 * waiting for one waits for nothing else. When no buffer is free a request reaps finished
 * writes, evicts the least recently released cached tensor (or an unclaimed prefetch), waits
 * for the oldest write, and only then waits on the pool (timeout_ms) or fails with a message
 * naming the budget. A prefetch never waits; it evicts a cached tensor only with
 * prefetch_evicts. zinf_store_ready() says, without waiting, whether a wait would block.
 * A failed write keeps the data resident and dirty: nothing is dropped.
 *
 * The cache region (cache_bytes, carved from the pool's CPU region at create): an NVMe-homed
 * tensor that becomes resident takes an extent there first (its swap size, aligned; first fit
 * over a free list kept sorted by offset and merged on free), else the contiguous run of
 * released tensors whose most recent use is the oldest is evicted (region_take); it is read
 * into, used, written from and kept in that extent, so a cached tensor costs its own bytes, not
 * a buffer of the largest. One that finds no extent (the region held by tensors in use or in
 * flight, or smaller than it) uses a pool buffer as without a region, and moves into the region
 * when released clean if room can be made then (region_adopt).
 * Not thread-safe: one thread drives a store (the I/O runs on the engine's threads).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/opts.h"
#include "offload/offload_internal.h"

ZINF_OPTS_NO_TAIL_PAD(struct zinf_store_opts, cache_bytes);
ZINF_OPTS_NO_TAIL_PAD(struct zinf_store_stats, cache_peak_bytes);

struct tensor {
	char kind[32];
	uint32_t index;
	uint64_t elems, bytes;
	enum zinf_tier home;
	int swap_id;
	enum zinf_tensor_state state;
	void *data;	     /* pool buffer or cache extent (NVMe), or CPU region */
	bool in_region;	     /* data is the extent [roff, roff + rlen) of the cache region */
	uint64_t roff, rlen; /* bytes */
	bool written;	     /* the files hold its data */
	bool dirty;
	int werr;	 /* its last write failed (kept resident and dirty), for the next flush */
	char *werr_why;	 /* that failure's cause (the swap space's message, naming the file) */
	bool in_use;	 /* between swap_in and release */
	bool cached;	 /* released clean, kept resident (region, or under max_in_cpu) */
	bool prefetched; /* started by the prefetcher, not claimed yet */
	bool queued;	 /* in the prefetch queue */
	bool read_start_failed;	 /* the swap space refused the read (its message logged then) */
	bool write_start_failed; /* the swap space refused the write (its message logged then) */
	uint64_t lru;		 /* release order of cached tensors */
	uint64_t wseq;		 /* start order of writes */
	struct zinf_swap_op op;
};

struct zinf_store {
	struct zinf_store_opts o;
	char name[80]; /* "store (offload_param)": the pool's configuration, for messages */
	struct tensor *t;
	int nt, cap;
	uint64_t clock;
	uint64_t buf_bytes;
	int *pq; /* prefetch queue: ids, FIFO */
	int pq_head, pq_len, pq_cap;
	uint64_t pf_bytes; /* prefetch bytes started and not claimed */
	uint64_t cached_elems;
	uint64_t buf_cached_elems; /* of them, in pool buffers (bounded by max_in_cpu) */
	/* the cache region: cache_bytes at region, free extents in holes (sorted by offset,
	   none adjacent), at most one per tensor + 1 */
	char *region;
	uint32_t ralign;
	struct hole {
		uint64_t off, len;
	} * holes;
	int nholes, holes_cap;
	/* region_take's scratch: the region's holes and extents by offset (holes_cap x 2 + 4) */
	struct ritem {
		uint64_t off, len, used; /* used: last use of a candidate (0: a hole) */
		int id;			 /* the tensor, or -1: a hole */
		bool blocked;		 /* an extent that may not be evicted now */
	} * items;
	uint64_t region_used;
	struct zinf_store_stats stats;
};

void
zinf_store_opts_init(struct zinf_store_opts *o)
{
	if (!o) {
		return;
	}
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	o->timeout_ms = -1;
}

/* The cache region from the pool's CPU region: one hole of cache_bytes. */
static int
region_create(struct zinf_store *s)
{
	if (!s->o.swap) {
		return STORE_FAIL(s, -EINVAL,
				  "cache_bytes %" PRIu64 " without a swap space: the cache holds "
				  "NVMe-homed tensors only",
				  s->o.cache_bytes);
	}
	s->ralign = zinf_swap_align(s->o.swap);
	void *r = NULL;
	int rc = zinf_pool_cpu_alloc(s->o.pool, s->o.cache_bytes, &r);
	if (rc) {
		return STORE_FAIL(s, rc,
				  "its cache of %" PRIu64 " bytes (max_in_cpu) does not fit the "
				  "pool's CPU region: %s",
				  s->o.cache_bytes, zinf_last_error());
	}
	if ((uintptr_t)r % s->ralign) {
		return STORE_FAIL(s, -EINVAL,
				  "cache region at %p is not aligned to the swap space's %u bytes: "
				  "create the pool with align %u",
				  r, s->ralign, s->ralign);
	}
	s->region = r;
	s->holes = zc_calloc(16, sizeof(*s->holes));
	s->items = zc_calloc(2 * 16 + 4, sizeof(*s->items));
	if (!s->holes || !s->items) {
		return STORE_FAIL(s, -ENOMEM, "out of memory");
	}
	s->holes_cap = 16;
	s->holes[0] = (struct hole){0, ZINF_ALIGN_DOWN(s->o.cache_bytes, (uint64_t)s->ralign)};
	s->nholes = s->holes[0].len ? 1 : 0;
	s->stats.cache_bytes = s->holes[0].len;
	return 0;
}

int
zinf_store_create(const struct zinf_store_opts *opts, struct zinf_store **out)
{
	if (!out) {
		return OFFLOAD_NULL("output");
	}
	struct zinf_store_opts o;
	zinf_store_opts_init(&o);
	int rc = zc_opts_take(&o, sizeof(o), opts, "zinf_store_opts");
	if (rc) {
		return rc;
	}
	if (!o.pool) {
		return ZINF_FAIL(-EINVAL, "store: needs a pool (zinf_store_opts.pool)");
	}
	struct zinf_store *s = zc_calloc(1, sizeof(*s));
	if (!s) {
		return ZINF_FAIL(-ENOMEM, "store (%s): out of memory", offload_pool_what(o.pool));
	}
	s->o = o;
	snprintf(s->name, sizeof(s->name), "store (%s)", offload_pool_what(o.pool));
	s->buf_bytes = zinf_pool_buffer_bytes(o.pool);
	if (o.cache_bytes && (rc = region_create(s))) {
		zc_free(s->items);
		zc_free(s->holes);
		zc_free(s);
		return rc;
	}
	*out = s;
	return 0;
}

static struct tensor *
get(const struct zinf_store *s, int id)
{
	return (s && id >= 0 && id < s->nt) ? &s->t[id] : NULL;
}

/* First fit of len bytes in the region's holes: the offset, or UINT64_MAX. */
static uint64_t
hole_take(struct zinf_store *s, uint64_t len)
{
	for (int i = 0; i < s->nholes; i++) {
		struct hole *h = &s->holes[i];
		if (h->len >= len) {
			uint64_t off = h->off;
			h->off += len;
			h->len -= len;
			if (h->len == 0) {
				memmove(h, h + 1, (size_t)(s->nholes - i - 1) * sizeof(*h));
				s->nholes--;
			}
			return off;
		}
	}
	return UINT64_MAX;
}

/* An extent back into the holes, merged with its neighbours. Never fails: holes_cap exceeds
 * the tensors (zinf_store_add), and holes are never more than extents + 1. */
static void
hole_put(struct zinf_store *s, uint64_t off, uint64_t len)
{
	int i = 0;
	while (i < s->nholes && s->holes[i].off < off) {
		i++;
	}
	bool left = i > 0 && s->holes[i - 1].off + s->holes[i - 1].len == off;
	bool right = i < s->nholes && off + len == s->holes[i].off;
	if (left && right) {
		s->holes[i - 1].len += len + s->holes[i].len;
		memmove(&s->holes[i], &s->holes[i + 1],
			(size_t)(s->nholes - i - 1) * sizeof(*s->holes));
		s->nholes--;
	} else if (left) {
		s->holes[i - 1].len += len;
	} else if (right) {
		s->holes[i].off = off;
		s->holes[i].len += len;
	} else {
		memmove(&s->holes[i + 1], &s->holes[i],
			(size_t)(s->nholes - i) * sizeof(*s->holes));
		s->holes[i] = (struct hole){off, len};
		s->nholes++;
	}
}

static void
give_back(struct zinf_store *s, struct tensor *t)
{
	if (t->cached) {
		s->cached_elems -= t->elems;
		if (!t->in_region) {
			s->buf_cached_elems -= t->elems;
		}
		t->cached = false;
	}
	if (t->in_region) {
		hole_put(s, t->roff, t->rlen);
		s->region_used -= t->rlen;
		t->in_region = false;
		t->data = NULL;
	} else if (t->home == ZINF_TIER_NVME && t->data) {
		(void)zinf_pool_release(s->o.pool, t->data);
		t->data = NULL;
	}
	if (t->prefetched) {
		s->pf_bytes -= t->bytes;
		t->prefetched = false;
	}
	t->state = ZINF_TENSOR_ABSENT;
}

/* A clean resident tensor into the cache, last used at `used` (the store's clock: its release,
 * or its write's start). In the region it stays until its bytes are wanted (region_take); in
 * pool buffers the least recently released ones go while those hold more than max_in_cpu
 * elements. */
static void
cache_put(struct zinf_store *s, struct tensor *t, uint64_t used)
{
	t->cached = true;
	t->lru = used;
	s->cached_elems += t->elems;
	if (t->in_region) {
		return;
	}
	s->buf_cached_elems += t->elems;
	while (s->buf_cached_elems > s->o.max_in_cpu) {
		struct tensor *v = NULL;
		for (int i = 0; i < s->nt; i++) {
			struct tensor *c = &s->t[i];
			if (c->cached && !c->in_region && (!v || c->lru < v->lru)) {
				v = c;
			}
		}
		give_back(s, v);
		s->stats.evictions++;
	}
}

/* Whether the tensor's data may be given up for another's room: resident, clean, released and
 * not an unclaimed prefetch (about to be claimed). */
static bool
evictable(const struct tensor *t)
{
	return t->state == ZINF_TENSOR_RESIDENT && t->cached && !t->dirty && !t->in_use &&
	       !t->prefetched;
}

static int write_done(struct zinf_store *s, struct tensor *t, int rc, bool keep);

static int
ritem_cmp(const void *a, const void *b)
{
	const struct ritem *x = a, *y = b;
	return x->off < y->off ? -1 : x->off > y->off;
}

/*
 * An extent of the region for t: a hole that fits, else (only with evict) the contiguous run of
 * holes and candidates whose most recent use is the oldest, evicted. Candidates are the
 * evictable tensors (last used at their release) and the released ones whose write is in flight
 * (last used when it started; waited for, only with may_wait, else only when complete), so the
 * order is LRU's whatever the disk's speed, and a run never evicts more than the bytes it needs
 * beyond its oldest members: evicting the least recently used one by one until a hole fits would
 * evict every small tensor between two large ones (norm vectors spread over the region).
 * Returns true and sets t's data, or false (no region, t larger than it, no run of candidates
 * large enough): the caller uses a pool buffer.
 */
static bool
region_take(struct zinf_store *s, struct tensor *t, bool evict, bool may_wait)
{
	if (!s->region) {
		return false;
	}
	/* the swap space's capacity for it (its bytes, aligned): a read fills it whole */
	uint64_t len =
		ZINF_ALIGN_UP(zinf_swap_buf_bytes(s->o.swap, t->swap_id), (uint64_t)s->ralign);
	len = len ? len : s->ralign;
	if (len > s->stats.cache_bytes) {
		return false;
	}
	uint64_t off = hole_take(s, len);
	if (off == UINT64_MAX && evict) {
		/* the region by offset: holes and extents tile it */
		int n = 0;
		for (int i = 0; i < s->nholes; i++) {
			s->items[n++] =
				(struct ritem){s->holes[i].off, s->holes[i].len, 0, -1, false};
		}
		for (int i = 0; i < s->nt; i++) {
			struct tensor *c = &s->t[i];
			if (!c->in_region) {
				continue;
			}
			struct ritem it = {c->roff, c->rlen, 0, i, false};
			if (evictable(c)) {
				it.used = c->lru;
			} else if (c->state == ZINF_TENSOR_WRITING && !c->in_use &&
				   (may_wait || zinf_swap_poll(s->o.swap, &c->op) == 1)) {
				it.used = c->wseq;
			} else {
				it.blocked = true;
			}
			s->items[n++] = it;
		}
		qsort(s->items, (size_t)n, sizeof(*s->items), ritem_cmp);
		int best = -1, best_end = -1;
		uint64_t best_used = UINT64_MAX, best_got = 0;
		for (int a = 0; a < n; a++) {
			uint64_t got = 0, newest = 0;
			int b = a;
			for (; b < n && !s->items[b].blocked && got < len; b++) {
				got += s->items[b].len;
				newest = ZINF_MAX(newest, s->items[b].used);
			}
			/* the oldest newest member; of those, the fewest bytes given up */
			if (got >= len &&
			    (newest < best_used || (newest == best_used && got < best_got))) {
				best = a;
				best_end = b;
				best_used = newest;
				best_got = got;
			}
		}
		for (int k = best; best >= 0 && k < best_end; k++) {
			struct tensor *v = s->items[k].id >= 0 ? &s->t[s->items[k].id] : NULL;
			if (v && v->state == ZINF_TENSOR_WRITING &&
			    write_done(s, v, zinf_swap_wait(s->o.swap, &v->op), false)) {
				return false; /* failed: kept resident and dirty, the run is broken
					       */
			}
			if (v) {
				give_back(s, v);
				s->stats.evictions++;
			}
		}
		off = best >= 0 ? hole_take(s, len) : UINT64_MAX;
	}
	if (off == UINT64_MAX) {
		return false;
	}
	t->in_region = true;
	t->roff = off;
	t->rlen = len;
	t->data = s->region + off;
	s->region_used += len;
	s->stats.cache_peak_bytes = ZINF_MAX(s->stats.cache_peak_bytes, s->region_used);
	return true;
}

/*
 * A clean released tensor in a pool buffer (it found no extent when it became resident: the
 * region was held by tensors in use) into an extent now, evicting the least recently used (no
 * waiting): it is the most recently used, so LRU keeps it. Returns true when moved (the buffer is
 * back in the pool).
 */
static bool
region_adopt(struct zinf_store *s, struct tensor *t)
{
	void *buf = t->data;
	if (t->in_region || !buf || !region_take(s, t, true, false)) {
		return false;
	}
	memcpy(t->data, buf, t->bytes);
	(void)zinf_pool_release(s->o.pool, buf);
	return true;
}

/* A write is complete: keep the clean data cached (the region; max_in_cpu in a buffer) or free
 * the buffer; on failure keep the data resident and dirty. */
static int
write_done(struct zinf_store *s, struct tensor *t, int rc, bool keep)
{
	if (rc) {
		t->state = ZINF_TENSOR_RESIDENT;
		t->dirty = true;
		/* the swap space's message names the file, when this wait logged it (as swap-in) */
		zc_free(t->werr_why);
		t->werr_why =
			zc_strdup(t->write_start_failed ? zinf_strerror(rc) : zinf_last_error());
		STORE_ERR(s, "write of %s[%u] failed: kept resident and dirty: %s", t->kind,
			  t->index, t->werr_why ? t->werr_why : zinf_strerror(rc));
		t->werr = rc;
		return rc;
	}
	t->written = true;
	t->werr = 0; /* an earlier failure is repaired: its data is on disk now */
	zc_free(t->werr_why);
	t->werr_why = NULL;
	s->stats.writes++;
	s->stats.write_bytes += t->bytes;
	if (keep) {
		t->state = ZINF_TENSOR_RESIDENT;
	} else if (t->in_region || region_adopt(s, t) || t->elems <= s->o.max_in_cpu) {
		/* clean now: the data stays cached like a clean release's (the next swap-in
		   reads nothing) */
		t->state = ZINF_TENSOR_RESIDENT;
		cache_put(s, t, t->wseq); /* last used when released: its write's start */
	} else {
		give_back(s, t);
	}
	return 0;
}

static void
reap_writes(struct zinf_store *s)
{
	for (int i = 0; i < s->nt; i++) {
		struct tensor *t = &s->t[i];
		if (t->state == ZINF_TENSOR_WRITING && zinf_swap_poll(s->o.swap, &t->op) == 1) {
			(void)write_done(s, t, zinf_swap_wait(s->o.swap, &t->op), false);
		}
	}
}

/* Free one buffer without waiting on the pool: evict a cached or unclaimed tensor, or wait for
 * the oldest write. Returns true if one was freed. */
static bool
make_room(struct zinf_store *s)
{
	struct tensor *victim = NULL;
	for (int i = 0; i < s->nt; i++) {
		struct tensor *t = &s->t[i];
		if (t->state == ZINF_TENSOR_RESIDENT && t->cached && !t->dirty && !t->in_region &&
		    (!victim || t->lru < victim->lru)) {
			victim = t;
		}
	}
	if (!victim) {
		/* an unclaimed prefetch, furthest back in the queue order: the oldest started */
		for (int i = 0; i < s->nt && !victim; i++) {
			struct tensor *t = &s->t[i];
			if (t->prefetched && !t->in_use && !t->dirty && !t->in_region &&
			    (t->state == ZINF_TENSOR_RESIDENT || t->state == ZINF_TENSOR_READING)) {
				victim = t;
			}
		}
		if (victim && victim->state == ZINF_TENSOR_READING) {
			(void)zinf_swap_wait(s->o.swap, &victim->op);
		}
	}
	if (victim) {
		give_back(s, victim);
		s->stats.evictions++;
		return true;
	}
	/* The oldest write from a buffer; if it fails (its data stays resident), the next one may
	 * still free a buffer. */
	for (;;) {
		struct tensor *w = NULL;
		for (int i = 0; i < s->nt; i++) {
			struct tensor *t = &s->t[i];
			if (t->state == ZINF_TENSOR_WRITING && !t->in_region &&
			    (!w || t->wseq < w->wseq)) {
				w = t;
			}
		}
		if (!w) {
			return false;
		}
		s->stats.buffer_waits++;
		if (write_done(s, w, zinf_swap_wait(s->o.swap, &w->op), false) == 0) {
			return true;
		}
	}
}

static int
get_buffer(struct zinf_store *s, struct tensor *t, bool may_wait)
{
	void *b = NULL;
	reap_writes(s);
	if (region_take(s, t, true, may_wait)) {
		return 0;
	}
	for (;;) {
		/* Probe quietly: an empty pool here is not an error yet. */
		if (zinf_pool_free_count(s->o.pool) > 0 &&
		    zinf_pool_acquire(s->o.pool, 0, &b) >= 0) {
			t->data = b;
			return 0;
		}
		if (!make_room(s)) {
			break;
		}
	}
	if (!may_wait) {
		return STORE_FAIL(s, -EAGAIN,
				  "no free buffer for %s[%u] (%u buffers of %" PRIu64
				  " bytes, all held by tensors in use): raise the pool's "
				  "buffer_count, or release tensors first",
				  t->kind, t->index, zinf_pool_buffer_count(s->o.pool),
				  s->buf_bytes);
	}
	s->stats.buffer_waits++;
	int rc = zinf_pool_acquire(s->o.pool, s->o.timeout_ms, &b);
	if (rc < 0) {
		return STORE_FAIL(s, rc,
				  "no buffer for %s[%u] (every buffer holds a tensor in "
				  "use): %s",
				  t->kind, t->index, zinf_last_error());
	}
	t->data = b;
	return 0;
}

int
zinf_store_add(struct zinf_store *s, const char *kind, uint32_t index, uint64_t elems,
	       uint32_t elem_bytes, enum zinf_tier home)
{
	if (!s) {
		return OFFLOAD_NULL("store");
	}
	if (!kind || strlen(kind) >= sizeof(s->t[0].kind) || elem_bytes == 0) {
		return STORE_FAIL(s, -EINVAL, "bad tensor (kind \"%s\", element bytes %u)",
				  kind ? kind : "(null)", elem_bytes);
	}
	uint64_t bytes = 0;
	if (__builtin_mul_overflow(elems, (uint64_t)elem_bytes, &bytes)) {
		return STORE_FAIL(s, -EINVAL,
				  "%s[%u]: %" PRIu64 " elements of %u bytes overflow 64 bits", kind,
				  index, elems, elem_bytes);
	}
	if (home == ZINF_TIER_NVME) {
		if (!s->o.swap) {
			return STORE_FAIL(s, -EINVAL,
					  "%s[%u] homed on NVMe, but the store has no "
					  "swap space",
					  kind, index);
		}
		if (bytes > s->buf_bytes) {
			return STORE_FAIL(s, -EINVAL,
					  "%s[%u] needs %" PRIu64 " bytes, more than one pool "
					  "buffer (%" PRIu64 "): raise the pool's buffer size",
					  kind, index, bytes, s->buf_bytes);
		}
	} else if (home != ZINF_TIER_CPU) {
		return STORE_FAIL(s, -EINVAL, "unknown tier %d", home);
	}
	if (s->nt == s->cap) {
		if (s->cap > INT32_MAX / 2 / (int)sizeof(struct tensor)) {
			return STORE_FAIL(s, -ENOMEM, "%d tensors: too many", s->nt);
		}
		int cap = s->cap ? 2 * s->cap : 16;
		struct tensor *n = zc_calloc(cap, sizeof(*n));
		int *q = zc_calloc(cap, sizeof(*q));
		if (!n || !q) {
			zc_free(n);
			zc_free(q);
			return STORE_FAIL(s, -ENOMEM, "out of memory");
		}
		if (s->nt) {
			memcpy(n, s->t, s->nt * sizeof(*n));
			for (int i = 0; i < s->pq_len; i++) {
				q[i] = s->pq[(s->pq_head + i) % s->pq_cap];
			}
		}
		zc_free(s->t);
		zc_free(s->pq);
		s->t = n;
		s->cap = cap;
		s->pq = q;
		s->pq_cap = cap;
		s->pq_head = 0;
	}
	if (s->region && s->holes_cap < s->nt + 2) {
		/* holes: at most one more than the extents, which are at most the tensors */
		int hc = s->cap + 2;
		struct hole *h = zc_calloc(hc, sizeof(*h));
		struct ritem *it = zc_calloc(2 * (size_t)hc + 4, sizeof(*it));
		if (!h || !it) {
			zc_free(h);
			zc_free(it);
			return STORE_FAIL(s, -ENOMEM, "out of memory");
		}
		memcpy(h, s->holes, (size_t)s->nholes * sizeof(*h));
		zc_free(s->holes);
		zc_free(s->items);
		s->holes = h;
		s->items = it;
		s->holes_cap = hc;
	}
	struct tensor *t = &s->t[s->nt];
	memset(t, 0, sizeof(*t));
	snprintf(t->kind, sizeof(t->kind), "%s", kind);
	t->index = index;
	t->elems = elems;
	t->bytes = bytes;
	t->home = home;
	t->swap_id = -1;
	if (home == ZINF_TIER_NVME) {
		int id = zinf_swap_add(s->o.swap, kind, index, bytes);
		if (id < 0) {
			return id;
		}
		t->swap_id = id;
		t->state = ZINF_TENSOR_ABSENT;
	} else {
		int rc = zinf_pool_cpu_alloc(s->o.pool, bytes ? bytes : 1, &t->data);
		if (rc) {
			return rc;
		}
		memset(t->data, 0, bytes);
		t->state = ZINF_TENSOR_RESIDENT;
	}
	return s->nt++;
}

enum zinf_tensor_state
zinf_store_state(const struct zinf_store *s, int id)
{
	const struct tensor *t = get(s, id);
	return t ? t->state : ZINF_TENSOR_ABSENT;
}

uint64_t
zinf_store_bytes(const struct zinf_store *s, int id)
{
	const struct tensor *t = get(s, id);
	return t ? t->bytes : 0;
}

/* Start the read of an ABSENT tensor that has a buffer. */
/* flags: ZINF_STORE_NEW, ZINF_STORE_OVERWRITE or 0 (read what was written, else zeros) */
static void
start_read(struct zinf_store *s, struct tensor *t, unsigned flags)
{
	if (flags & ZINF_STORE_OVERWRITE) {
		t->state = ZINF_TENSOR_RESIDENT;
		return;
	}
	if ((flags & ZINF_STORE_NEW) || !t->written) {
		memset(t->data, 0, t->bytes);
		t->state = ZINF_TENSOR_RESIDENT;
		return;
	}
	t->state = ZINF_TENSOR_READING;
	/* A refused start leaves op.result set: zinf_store_wait reports it. */
	t->read_start_failed = zinf_swap_read_async(s->o.swap, t->swap_id, t->data, &t->op) < 0;
}

/* Give the least recently released clean cached tensor's buffer back (none: nothing). */
static void
evict_cached(struct zinf_store *s)
{
	struct tensor *v = NULL;
	for (int i = 0; i < s->nt; i++) {
		struct tensor *t = &s->t[i];
		if (t->state == ZINF_TENSOR_RESIDENT && t->cached && !t->dirty && !t->in_region &&
		    (!v || t->lru < v->lru)) {
			v = t;
		}
	}
	if (v) {
		give_back(s, v);
		s->stats.evictions++;
	}
}

static void
pump_prefetch(struct zinf_store *s)
{
	reap_writes(s);
	while (s->pq_len) {
		struct tensor *t = &s->t[s->pq[s->pq_head]];
		if (t->state != ZINF_TENSOR_ABSENT) {
			t->queued = false;
			s->pq_head = (s->pq_head + 1) % s->pq_cap;
			s->pq_len--;
			continue;
		}
		if (s->pf_bytes + t->bytes > s->o.prefetch_bytes) {
			break;
		}
		void *b = NULL;
		if (!region_take(s, t, s->o.prefetch_evicts != 0, false)) {
			if (zinf_pool_free_count(s->o.pool) == 0 && s->o.prefetch_evicts) {
				evict_cached(s);
			}
			if (zinf_pool_free_count(s->o.pool) == 0 ||
			    zinf_pool_acquire(s->o.pool, 0, &b) < 0) {
				break; /* never waits; evicts the cache only with
					  prefetch_evicts */
			}
			t->data = b;
		}
		t->queued = false;
		s->pq_head = (s->pq_head + 1) % s->pq_cap;
		s->pq_len--;
		t->prefetched = true;
		s->pf_bytes += t->bytes;
		s->stats.prefetch_started++;
		start_read(s, t, 0);
	}
}

int
zinf_store_swap_in(struct zinf_store *s, int id, unsigned flags)
{
	if (!s) {
		return OFFLOAD_NULL("store");
	}
	struct tensor *t = get(s, id);
	if (!t) {
		return STORE_FAIL(s, -EINVAL, "unknown tensor id %d", id);
	}
	if (t->home == ZINF_TIER_CPU) {
		t->in_use = true;
		return 0;
	}
	if (t->state == ZINF_TENSOR_WRITING) {
		/* The buffer still holds the data: wait for the write and keep it. */
		int rc = write_done(s, t, zinf_swap_wait(s->o.swap, &t->op), true);
		(void)rc; /* failed: kept resident and dirty, which is what swap-in wants */
	}
	if (t->state == ZINF_TENSOR_RESIDENT || t->state == ZINF_TENSOR_READING) {
		if (t->cached) {
			s->cached_elems -= t->elems;
			if (!t->in_region) {
				s->buf_cached_elems -= t->elems;
			}
			t->cached = false;
			s->stats.cache_hits++;
		}
		if (t->prefetched) {
			s->pf_bytes -= t->bytes;
			t->prefetched = false;
		}
		t->in_use = true;
		pump_prefetch(s);
		return 0;
	}
	int rc = get_buffer(s, t, !(flags & ZINF_STORE_NOWAIT));
	if (rc) {
		return rc;
	}
	t->in_use = true;
	start_read(s, t, flags);
	pump_prefetch(s);
	return 0;
}

int
zinf_store_wait(struct zinf_store *s, int id, void **data)
{
	if (!s) {
		return OFFLOAD_NULL("store");
	}
	struct tensor *t = get(s, id);
	if (!t) {
		return STORE_FAIL(s, -EINVAL, "unknown tensor id %d", id);
	}
	int rc = 0;
	if (t->state == ZINF_TENSOR_READING) {
		rc = zinf_swap_wait(s->o.swap, &t->op);
		if (rc) {
			/* The swap space's message names this tensor and its file only if it was
			 * logged by this wait: a refused start was logged long ago (see above). */
			rc = STORE_FAIL(s, rc, "swap-in of %s[%u] failed: %s", t->kind, t->index,
					t->read_start_failed ? zinf_strerror(rc)
							     : zinf_last_error());
			t->in_use = false;
			give_back(s, t);
		} else {
			t->state = ZINF_TENSOR_RESIDENT;
			s->stats.reads++;
			s->stats.read_bytes += t->bytes;
		}
	} else if (t->state == ZINF_TENSOR_WRITING) {
		rc = write_done(s, t, zinf_swap_wait(s->o.swap, &t->op), false);
	} else if (t->werr && !t->in_use && t->state == ZINF_TENSOR_RESIDENT && t->dirty) {
		/* its swap-out failed, reaped before this wait (by a release or a swap-in): the
		   same answer as when this wait reaps it */
		rc = STORE_FAIL(s, t->werr, "write of %s[%u] failed: kept resident and dirty: %s",
				t->kind, t->index,
				t->werr_why ? t->werr_why : zinf_strerror(t->werr));
	}
	if (data) {
		*data = t->state == ZINF_TENSOR_RESIDENT ? t->data : NULL;
	}
	pump_prefetch(s);
	return rc;
}

int
zinf_store_ready(struct zinf_store *s, int id)
{
	if (!s) {
		return OFFLOAD_NULL("store");
	}
	struct tensor *t = get(s, id);
	if (!t) {
		return STORE_FAIL(s, -EINVAL, "unknown tensor id %d", id);
	}
	switch (t->state) {
	case ZINF_TENSOR_RESIDENT:
		return 1;
	case ZINF_TENSOR_READING:
	case ZINF_TENSOR_WRITING:
		/* complete (a refused start at once): the next wait or swap-in does not block */
		return zinf_swap_poll(s->o.swap, &t->op) == 1;
	default:
		return 0;
	}
}

int
zinf_store_mark_dirty(struct zinf_store *s, int id)
{
	if (!s) {
		return OFFLOAD_NULL("store");
	}
	struct tensor *t = get(s, id);
	if (!t || t->state != ZINF_TENSOR_RESIDENT) {
		return STORE_FAIL(s, -EINVAL, "mark_dirty of tensor %d, which is not resident", id);
	}
	if (t->home == ZINF_TIER_NVME) {
		t->dirty = true;
		if (t->cached) {
			/* Out of the cache, whose evictions drop data: held until written. */
			s->cached_elems -= t->elems;
			if (!t->in_region) {
				s->buf_cached_elems -= t->elems;
			}
			t->cached = false;
		}
	}
	return 0;
}

static void
start_write(struct zinf_store *s, struct tensor *t)
{
	t->state = ZINF_TENSOR_WRITING;
	t->dirty = false;
	t->wseq = s->clock++;
	/* A refused start leaves op.result set: the wait reports it. */
	t->write_start_failed = zinf_swap_write_async(s->o.swap, t->swap_id, t->data, &t->op) < 0;
}

/* The caller is done with `id`: its bytes kept (release: a dirty tensor written, a clean one
 * cached) or dropped (its bytes are not its value: the files' are). */
static int
end_use(struct zinf_store *s, int id, bool keep)
{
	if (!s) {
		return OFFLOAD_NULL("store");
	}
	struct tensor *t = get(s, id);
	if (!t) {
		return STORE_FAIL(s, -EINVAL, "unknown tensor id %d", id);
	}
	t->in_use = false;
	if (t->home == ZINF_TIER_CPU) {
		return 0;
	}
	if (t->state == ZINF_TENSOR_READING) {
		int rc = zinf_store_wait(s, id, NULL);
		if (rc) {
			return rc;
		}
	}
	if (t->state != ZINF_TENSOR_RESIDENT) {
		return 0;
	}
	if (!keep) {
		t->dirty = false;
		give_back(s, t);
	} else if (t->dirty) {
		start_write(s, t);
	} else if (t->in_region || region_adopt(s, t) || t->elems <= s->o.max_in_cpu) {
		cache_put(s, t, s->clock++);
	} else {
		give_back(s, t);
	}
	pump_prefetch(s);
	return 0;
}

int
zinf_store_release(struct zinf_store *s, int id)
{
	return end_use(s, id, true);
}

int
zinf_store_drop(struct zinf_store *s, int id)
{
	return end_use(s, id, false);
}

int
zinf_store_prefetch(struct zinf_store *s, int id)
{
	if (!s) {
		return OFFLOAD_NULL("store");
	}
	struct tensor *t = get(s, id);
	if (!t) {
		return STORE_FAIL(s, -EINVAL, "unknown tensor id %d", id);
	}
	if (t->cached) {
		t->lru = s->clock++; /* wanted soon: the last a prefetch evicts */
	}
	if (t->home == ZINF_TIER_CPU || t->state != ZINF_TENSOR_ABSENT || t->queued) {
		return 0;
	}
	if (t->bytes > s->o.prefetch_bytes) {
		return STORE_FAIL(s, -ENOSPC,
				  "prefetch of %s[%u] (%" PRIu64 " bytes) exceeds the "
				  "prefetch budget of %" PRIu64 " bytes: raise "
				  "stage3_prefetch_bucket_size",
				  t->kind, t->index, t->bytes, s->o.prefetch_bytes);
	}
	s->pq[(s->pq_head + s->pq_len) % s->pq_cap] = id;
	s->pq_len++;
	t->queued = true;
	pump_prefetch(s);
	return 0;
}

/*
 * A flush reports every write that failed since the previous flush and whose data is still
 * only in memory, whether the failure was reaped in the background (a release, a swap-in) or
 * while this flush waited, and does not retry those writes in the same call: their data stays
 * resident and dirty, and the next flush retries. So the result and the states after a flush
 * do not depend on when the engine completed a write.
 */
int
zinf_store_flush(struct zinf_store *s)
{
	if (!s) {
		return OFFLOAD_NULL("store");
	}
	int rc = 0;
	reap_writes(s);
	for (int i = 0; i < s->nt; i++) {
		struct tensor *t = &s->t[i];
		if (t->state == ZINF_TENSOR_RESIDENT && t->dirty && t->werr) {
			/* reaped before this flush (by a release or a swap-in): said as when this
			   flush reaps it */
			int r = STORE_FAIL(s, t->werr,
					   "write of %s[%u] failed: kept resident and dirty: %s",
					   t->kind, t->index,
					   t->werr_why ? t->werr_why : zinf_strerror(t->werr));
			rc = rc ? rc : r;
			t->werr = 0;
		} else if (t->state == ZINF_TENSOR_RESIDENT && t->dirty) {
			start_write(s, t);
		}
	}
	for (int i = 0; i < s->nt; i++) {
		struct tensor *t = &s->t[i];
		if (t->state == ZINF_TENSOR_WRITING) {
			/* In use or cached: keep it resident after the write. */
			bool keep = t->in_use || t->cached;
			int r = write_done(s, t, zinf_swap_wait(s->o.swap, &t->op), keep);
			t->werr = 0; /* reported by this flush */
			rc = rc ? rc : r;
		} else if (t->state == ZINF_TENSOR_READING) {
			int r = zinf_store_wait(s, i, NULL);
			rc = rc ? rc : r;
		}
	}
	return rc;
}

int
zinf_store_get_stats(const struct zinf_store *s, struct zinf_store_stats *out)
{
	if (!s) {
		return OFFLOAD_NULL("store");
	}
	struct zinf_store_stats st = s->stats;
	st.size = sizeof(st);
	st.cached_elems = s->cached_elems;
	st.cache_used_bytes = s->region_used;
	return zc_stats_give(out, &st, sizeof(st), "zinf_store_stats");
}

void
zinf_store_destroy(struct zinf_store *s)
{
	if (!s) {
		return;
	}
	for (int i = 0; i < s->nt; i++) {
		struct tensor *t = &s->t[i];
		if (t->state == ZINF_TENSOR_READING || t->state == ZINF_TENSOR_WRITING) {
			(void)zinf_swap_wait(s->o.swap, &t->op);
		}
		zc_free(t->werr_why);
		if (t->home == ZINF_TIER_NVME) {
			give_back(s, t);
		}
	}
	zc_free(s->holes);
	zc_free(s->items);
	zc_free(s->pq);
	zc_free(s->t);
	zc_free(s);
}
