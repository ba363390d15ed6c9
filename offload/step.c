// SPDX-License-Identifier: Apache-2.0
/*
 * offload/step.c: the pipelined optimizer step. A rank's flat partition of n fp32 elements is
 * cut into sub-groups; with state on NVMe each sub-group's master, m and v are three swap
 * tensors. The step owns B pool buffers ("slots"), each holding one sub-group's master|m|v
 * (and the 16-bit copy when it goes to the parameter tier). A slot is FREE, READING (its three
 * reads in flight), LOADED, or WRITING. For each sub-group made ready:
 *
 *   make sure its slot is LOADED (reading it now if it was not prefetched), top up the
 *   read-ahead with every free slot, run CPU-Adam on it in chunks (between chunks: reap finished
 *   writes and turn their slots into new reads, so the disk never waits for Adam), start its
 *   writes.
 *
 * A slot becomes free only when its writes are acknowledged. Depth is B, not one. The
 * DEEPSPEED schedule reproduces PipelinedOptimizerSwapper (pipeline_read + pipeline_write):
 * one read ahead, and the previous sub-group's write waited for before the next one starts.
 *
 * With state on the CPU tier the same calls run Adam on arrays in memory (no slots, no I/O).
 * This file does not reduce gradients, compute norms or decide loss scales: the caller passes
 * grad_scale.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "zinf/offload.h"

_Static_assert(sizeof(struct zinf_step_opts) == 136, "zinf_step_opts layout changed");

enum { PART_MASTER = 0, PART_M = 1, PART_V = 2, PART_P16 = 3, NPARTS = 4 };
static const char *const part_kind[3] = {"fp32", "exp_avg", "exp_avg_sq"};

/* Elements of Adam between two looks at the I/O (a multiple of every vector width). */
#define ADAM_CHUNK (1u << 20)

enum slot_state { SLOT_FREE = 0, SLOT_READING, SLOT_LOADED, SLOT_WRITING };

struct slot {
	char *buf; /* pool buffer, zinf_step_buffer_bytes() */
	enum slot_state state;
	int64_t sg;   /* sub-group held, -1 when FREE */
	uint64_t seq; /* order in which writes started (oldest completes first) */
	int p0, nops; /* parts [p0, nops) in flight: 0..2 reads, 0..3 NVMe writes, P16 (CPU) */
	struct zinf_swap_op ops[NPARTS];
};

struct zinf_step {
	struct zinf_step_opts o;
	char param_kind[32];
	uint64_t n, sgsize;
	uint32_t nsg;
	uint32_t align;
	size_t copy_esz;	   /* bytes per element of the 16-bit copy */
	uint64_t part_off[NPARTS]; /* offsets inside a slot buffer */
	uint64_t buf_bytes;
	int *ids;	  /* NVMe: swap ids, NPARTS per sub-group (-1: none) */
	int64_t *written; /* per sub-group: last step durably written */

	/* CPU tier */
	float *cpu[3];
	bool cpu_owned;

	/* the step in progress */
	bool in_step;
	int64_t t;
	float grad_scale;
	char *copy_host;
	bool reverse;
	uint8_t *done;	  /* per sub-group: Adam ran this step */
	int32_t *sg_slot; /* per sub-group: slot index or -1 */
	struct slot *slots;
	uint32_t nslots;
	uint32_t pf_pos; /* next position (in processing order) to consider for a read */
	uint64_t wseq;
	int err;
	char errmsg[512];
	struct zinf_step_stats stats;
};

void
zinf_step_opts_init(struct zinf_step_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	o->tier = ZINF_TIER_NVME;
	o->schedule = ZINF_SCHEDULE_PIPELINED;
	zinf_adam_opts_init(&o->adam);
	o->copy_dtype = ZINF_F16;
	o->param_kind = "param16";
	o->timeout_ms = -1;
}

uint64_t
zinf_step_buffer_bytes(const struct zinf_step_opts *o, uint32_t align)
{
	uint64_t a = align ? align : 4096;
	uint64_t sg = ZINF_MIN(o->sub_group_size, o->n);
	uint64_t b = o->tier == ZINF_TIER_CPU ? 0 : 3 * ZINF_ALIGN_UP(sg * 4, a);
	if (o->param_swap) {
		b += ZINF_ALIGN_UP(sg * zinf_dtype_size(o->copy_dtype), a);
	}
	return b;
}

uint32_t
zinf_step_sub_groups(const struct zinf_step *st)
{
	return st->nsg;
}

uint64_t
zinf_step_sub_group_start(const struct zinf_step *st, uint32_t k)
{
	return (uint64_t)k * st->sgsize;
}

uint64_t
zinf_step_sub_group_len(const struct zinf_step *st, uint32_t k)
{
	if (k >= st->nsg) {
		return 0;
	}
	uint64_t s = (uint64_t)k * st->sgsize;
	return ZINF_MIN(st->sgsize, st->n - s);
}

int64_t
zinf_step_sub_group_written(const struct zinf_step *st, uint32_t k)
{
	return k < st->nsg ? st->written[k] : 0;
}

void
zinf_step_get_stats(const struct zinf_step *st, struct zinf_step_stats *out)
{
	*out = st->stats;
}

static int
validate(const struct zinf_step_opts *o)
{
	if (!o || o->size != sizeof(*o)) {
		return ZINF_FAIL(-EINVAL, "optimizer step: options not initialised with "
					  "zinf_step_opts_init()");
	}
	if (o->n == 0 || o->sub_group_size == 0) {
		return ZINF_FAIL(-EINVAL,
				 "optimizer step: n %" PRIu64 " and sub_group_size %" PRIu64
				 " must be > 0",
				 o->n, o->sub_group_size);
	}
	if (ZINF_DIV_ROUND_UP(o->n, o->sub_group_size) > INT32_MAX / NPARTS) {
		return ZINF_FAIL(-EINVAL,
				 "optimizer step: %" PRIu64 " sub-groups are too many: "
				 "raise sub_group_size",
				 ZINF_DIV_ROUND_UP(o->n, o->sub_group_size));
	}
	if (o->copy_dtype != ZINF_F16 && o->copy_dtype != ZINF_BF16 && o->copy_dtype != ZINF_F32) {
		return ZINF_FAIL(-EINVAL, "optimizer step: unknown copy dtype %d", o->copy_dtype);
	}
	if (o->tier == ZINF_TIER_NVME && (!o->swap || !o->pool)) {
		return ZINF_FAIL(-EINVAL, "optimizer step: state on NVMe needs a swap space and a "
					  "pinned pool");
	}
	if (o->tier == ZINF_TIER_CPU && o->param_swap && !o->pool) {
		return ZINF_FAIL(
			-EINVAL,
			"optimizer step: state on the CPU tier with the 16-bit copy to the "
			"parameter tier's files needs a pinned pool (its buffers carry the "
			"copy to the files)");
	}
	if (o->tier != ZINF_TIER_NVME && o->tier != ZINF_TIER_CPU) {
		return ZINF_FAIL(-EINVAL, "optimizer step: unknown tier %d", o->tier);
	}
	return 0;
}

int
zinf_step_create(const struct zinf_step_opts *opts, struct zinf_step **out)
{
	int rc = validate(opts);
	if (rc) {
		return rc;
	}
	struct zinf_step *st = zinf_calloc(1, sizeof(*st));
	if (!st) {
		return ZINF_FAIL(-ENOMEM, "optimizer step: out of memory");
	}
	st->o = *opts;
	snprintf(st->param_kind, sizeof(st->param_kind), "%s",
		 opts->param_kind ? opts->param_kind : "param16");
	st->o.param_kind = st->param_kind;
	st->n = opts->n;
	st->sgsize = ZINF_MIN(opts->sub_group_size, opts->n);
	st->nsg = (uint32_t)ZINF_DIV_ROUND_UP(st->n, st->sgsize);
	st->copy_esz = zinf_dtype_size(opts->copy_dtype);
	rc = -ENOMEM;
	st->written = zinf_calloc(st->nsg, sizeof(*st->written));
	st->done = zinf_calloc(st->nsg, 1);
	st->sg_slot = zinf_calloc(st->nsg, sizeof(*st->sg_slot));
	if (!st->written || !st->done || !st->sg_slot) {
		rc = ZINF_FAIL(-ENOMEM, "optimizer step: out of memory");
		goto err;
	}
	for (uint32_t k = 0; k < st->nsg; k++) {
		st->sg_slot[k] = -1;
	}

	if (opts->tier == ZINF_TIER_CPU) {
		for (int p = 0; p < 3; p++) {
			uint64_t bytes = ZINF_ALIGN_UP(st->n * 4, 64);
			if (opts->pool) {
				rc = zinf_pool_cpu_alloc(opts->pool, bytes, (void **)&st->cpu[p]);
				if (rc) {
					goto err;
				}
			} else {
				st->cpu[p] = zinf_alloc_aligned(64, bytes);
				if (!st->cpu[p]) {
					rc = ZINF_FAIL(-ENOMEM,
						       "optimizer step: cannot allocate %" PRIu64
						       " bytes of CPU-tier state",
						       bytes);
					goto err;
				}
				st->cpu_owned = true;
			}
			memset(st->cpu[p], 0, bytes);
		}
		if (!opts->param_swap) {
			*out = st;
			return 0;
		}
	}

	/* Lay out a slot, check the pool can hold one sub-group, declare the tensors. NVMe: a
	 * slot holds master|m|v(|copy); CPU tier with param_swap: the copy only. */
	bool nvme = opts->tier == ZINF_TIER_NVME;
	st->align = nvme ? zinf_swap_align(opts->swap) : 0;
	if (opts->param_swap) {
		st->align = ZINF_MAX(st->align, zinf_swap_align(opts->param_swap));
	}
	if (st->align == 0) {
		st->align = 4096;
	}
	uint64_t part = ZINF_ALIGN_UP(st->sgsize * 4, (uint64_t)st->align);
	for (int p = 0; p < 3; p++) {
		st->part_off[p] = p * part;
	}
	st->part_off[PART_P16] = nvme ? 3 * part : 0;
	st->buf_bytes = zinf_step_buffer_bytes(opts, st->align);
	uint64_t have = zinf_pool_buffer_bytes(opts->pool);
	uint32_t count = zinf_pool_buffer_count(opts->pool);
	if (count == 0 || have < st->buf_bytes) {
		rc = ZINF_FAIL(-ENOMEM,
			       "optimizer step: too few buffers for one sub-group: a sub-group of "
			       "%" PRIu64 " elements needs a buffer of %" PRIu64
			       " bytes (%s), the pool has %u of %" PRIu64 " bytes: raise the "
			       "pool's buffer size or lower sub_group_size",
			       st->sgsize, st->buf_bytes,
			       !nvme		  ? "16-bit copy"
			       : opts->param_swap ? "master, m, v, 16-bit copy"
						  : "master, m, v",
			       count, have);
		goto err;
	}
	/* Buffers start at the pool's (2 MiB-aligned) base plus multiples of their size. */
	if (have % st->align != 0) {
		rc = ZINF_FAIL(-EINVAL,
			       "optimizer step: pool buffers of %" PRIu64
			       " bytes are not a multiple "
			       "of the swap space's direct-I/O alignment (%u bytes), so their I/O "
			       "would be refused: create the pool with align = %u",
			       have, st->align, st->align);
		goto err;
	}
	int nparts = opts->param_swap ? NPARTS : 3;
	st->ids = zinf_calloc((size_t)st->nsg * NPARTS, sizeof(*st->ids));
	if (!st->ids) {
		rc = ZINF_FAIL(-ENOMEM, "optimizer step: out of memory");
		goto err;
	}
	for (uint32_t k = 0; k < st->nsg; k++) {
		uint64_t len = zinf_step_sub_group_len(st, k);
		for (int p = 0; p < NPARTS; p++) {
			int id = -1;
			if (p < 3 && nvme) {
				id = zinf_swap_add(opts->swap, part_kind[p], k, len * 4);
			} else if (p == PART_P16 && p < nparts) {
				id = zinf_swap_add(opts->param_swap, st->param_kind, k,
						   len * st->copy_esz);
			}
			if (p < nparts && (nvme || p == PART_P16) && id < 0) {
				rc = ZINF_FAIL(id,
					       "optimizer step: declaring %s[%u] in the swap "
					       "space failed",
					       p < 3 ? part_kind[p] : st->param_kind, k);
				goto err;
			}
			st->ids[(size_t)k * NPARTS + p] = id;
		}
	}
	*out = st;
	return 0;

err:
	if (st->cpu_owned) {
		for (int p = 0; p < 3; p++) {
			zinf_free_aligned(st->cpu[p]);
		}
	}
	zinf_free(st->ids);
	zinf_free(st->sg_slot);
	zinf_free(st->done);
	zinf_free(st->written);
	zinf_free(st);
	return rc;
}

static int abort_slots(struct zinf_step *st);

void
zinf_step_destroy(struct zinf_step *st)
{
	if (!st) {
		return;
	}
	if (st->in_step) {
		(void)abort_slots(st);
	}
	if (st->cpu_owned) {
		for (int p = 0; p < 3; p++) {
			zinf_free_aligned(st->cpu[p]);
		}
	}
	zinf_free(st->ids);
	zinf_free(st->sg_slot);
	zinf_free(st->done);
	zinf_free(st->written);
	zinf_free(st);
}

/* ---- error bookkeeping ------------------------------------------------------------------- */

/* Record the step's first error, with the sub-group, its elements and the I/O message. */
static int
note_err(struct zinf_step *st, int rc, uint32_t k, const char *what)
{
	if (st->err == 0) {
		uint64_t s = zinf_step_sub_group_start(st, k);
		st->err = rc;
		snprintf(st->errmsg, sizeof(st->errmsg),
			 "optimizer step %" PRId64 ": sub-group %u (elements %" PRIu64 "..%" PRIu64
			 "): %s failed: %s",
			 st->t, k, s, s + zinf_step_sub_group_len(st, k), what, zinf_last_error());
		ZINF_ERR("%s", st->errmsg);
	}
	return rc;
}

/* ---- slots (NVMe) ------------------------------------------------------------------------ */

static int
swap_id(const struct zinf_step *st, uint32_t k, int part)
{
	return st->ids[(size_t)k * NPARTS + part];
}

static struct zinf_swap *
part_swap(const struct zinf_step *st, int part)
{
	return part == PART_P16 ? st->o.param_swap : st->o.swap;
}

static const char *
part_name(const struct zinf_step *st, int part)
{
	return part == PART_P16 ? st->param_kind : part_kind[part];
}

static void
start_read(struct zinf_step *st, struct slot *s, uint32_t k)
{
	s->sg = k;
	s->state = SLOT_READING;
	s->p0 = 0;
	s->nops = 3;
	st->sg_slot[k] = (int32_t)(s - st->slots);
	/* A failed start leaves op->result set: the error surfaces when the slot is completed. */
	for (int p = 0; p < 3; p++) {
		(void)zinf_swap_read_async(st->o.swap, swap_id(st, k, p), s->buf + st->part_off[p],
					   &s->ops[p]);
	}
}

static void
slot_free(struct zinf_step *st, struct slot *s)
{
	if (s->sg >= 0 && st->sg_slot[s->sg] == (int32_t)(s - st->slots)) {
		st->sg_slot[s->sg] = -1;
	}
	s->sg = -1;
	s->state = SLOT_FREE;
	s->p0 = 0;
	s->nops = 0;
}

/* Wait for a READING slot's reads. keep_err: a failure fails the step (else it is dropped). */
static int
complete_read(struct zinf_step *st, struct slot *s, bool keep_err)
{
	uint32_t k = (uint32_t)s->sg;
	int rc = 0;
	double t0 = zinf_now_s();
	for (int p = 0; p < s->nops; p++) {
		int r = zinf_swap_wait(st->o.swap, &s->ops[p]);
		if (r == 0) {
			st->stats.read_bytes += zinf_step_sub_group_len(st, k) * 4;
		} else if (rc == 0) {
			rc = r;
			if (keep_err) {
				char what[64];
				snprintf(what, sizeof(what), "read of %s", part_kind[p]);
				note_err(st, r, k, what);
			}
		}
	}
	st->stats.wait_read_s += zinf_now_s() - t0;
	if (rc) {
		slot_free(st, s);
	} else {
		s->state = SLOT_LOADED;
	}
	return rc;
}

/* Complete a WRITING slot: block, or (block false) only if every write is done. 1 if freed. */
static int
complete_write(struct zinf_step *st, struct slot *s, bool block)
{
	if (!block) {
		for (int p = s->p0; p < s->nops; p++) {
			if (!zinf_swap_poll(part_swap(st, p), &s->ops[p])) {
				return 0;
			}
		}
	}
	uint32_t k = (uint32_t)s->sg;
	bool ok = true;
	double t0 = zinf_now_s();
	for (int p = s->p0; p < s->nops; p++) {
		int r = zinf_swap_wait(part_swap(st, p), &s->ops[p]);
		if (r == 0) {
			st->stats.write_bytes +=
				zinf_swap_bytes(part_swap(st, p), swap_id(st, k, p));
		} else {
			char what[64];
			snprintf(what, sizeof(what), "write of %s", part_name(st, p));
			note_err(st, r, k, what);
			ok = false;
		}
	}
	if (block) {
		st->stats.wait_write_s += zinf_now_s() - t0;
	}
	/* A failed write may have torn the files: the previous step's state is not whole there
	 * either, so no step counts as written. */
	st->written[k] = ok ? st->t : 0;
	slot_free(st, s);
	return 1;
}

static void
reap_writes(struct zinf_step *st)
{
	for (uint32_t i = 0; i < st->nslots; i++) {
		if (st->slots[i].state == SLOT_WRITING) {
			(void)complete_write(st, &st->slots[i], false);
		}
	}
}

static struct slot *
free_slot(struct zinf_step *st)
{
	for (uint32_t i = 0; i < st->nslots; i++) {
		if (st->slots[i].state == SLOT_FREE) {
			return &st->slots[i];
		}
	}
	return NULL;
}

static struct slot *
oldest_writing(struct zinf_step *st)
{
	struct slot *o = NULL;
	for (uint32_t i = 0; i < st->nslots; i++) {
		struct slot *s = &st->slots[i];
		if (s->state == SLOT_WRITING && (!o || s->seq < o->seq)) {
			o = s;
		}
	}
	return o;
}

static uint32_t
order_sg(const struct zinf_step *st, uint32_t pos)
{
	return st->reverse ? st->nsg - 1 - pos : pos;
}

static uint32_t
order_pos(const struct zinf_step *st, uint32_t k)
{
	return st->reverse ? st->nsg - 1 - k : k;
}

/* Slots holding (or reading) sub-groups not processed yet. */
static uint32_t
reads_ahead(const struct zinf_step *st)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < st->nslots; i++) {
		const struct slot *s = &st->slots[i];
		if (s->state == SLOT_READING || (s->state == SLOT_LOADED && !st->done[s->sg])) {
			n++;
		}
	}
	return n;
}

/*
 * Reap finished writes and turn every free slot into a read of the next sub-group in order.
 * `cur` (or -1): the sub-group being processed, whose slot does not count as read-ahead.
 * DEEPSPEED: at most one read ahead, issued only when no read is in flight.
 */
static void
pump(struct zinf_step *st, int64_t cur)
{
	if (st->err) {
		return;
	}
	reap_writes(st);
	if (st->o.tier == ZINF_TIER_CPU) {
		return; /* nothing to read */
	}
	for (;;) {
		while (st->pf_pos < st->nsg) {
			uint32_t k = order_sg(st, st->pf_pos);
			if (!st->done[k] && st->sg_slot[k] < 0 && (int64_t)k != cur) {
				break;
			}
			st->pf_pos++;
		}
		if (st->pf_pos >= st->nsg) {
			break;
		}
		if (st->o.schedule == ZINF_SCHEDULE_DEEPSPEED) {
			uint32_t ahead = reads_ahead(st);
			if (cur >= 0 && st->sg_slot[cur] >= 0) {
				ahead--; /* the current one */
			}
			if (ahead >= 1) {
				break;
			}
		}
		struct slot *s = free_slot(st);
		if (!s) {
			break;
		}
		start_read(st, s, order_sg(st, st->pf_pos));
		st->pf_pos++;
		uint32_t ahead = reads_ahead(st);
		if (ahead > st->stats.max_reads_in_flight) {
			st->stats.max_reads_in_flight = ahead;
		}
	}
}

/*
 * Wait for slot s's operations while keeping the disk fed: every write that completes in the
 * meantime turns its slot into the next read at once, instead of after s is in. A short sleep
 * between looks, not a spin (the I/O threads need the cores).
 */
static void
wait_pumping(struct zinf_step *st, struct slot *s, int64_t cur)
{
	double t0 = zinf_now_s();
	for (;;) {
		bool all = true;
		for (int p = s->p0; p < s->nops && all; p++) {
			all = zinf_swap_poll(part_swap(st, p), &s->ops[p]) != 0;
		}
		if (all) {
			break;
		}
		pump(st, cur);
		usleep(50);
	}
	st->stats.wait_read_s += zinf_now_s() - t0;
}

/*
 * A slot for sub-group k, which has none: a free one; else the oldest write's (waited for);
 * else every slot holds a prefetched sub-group that is not ready: give up the one furthest
 * ahead in the order (its read is waited for and dropped; it is read again when needed).
 */
static struct slot *
slot_for(struct zinf_step *st, uint32_t k)
{
	reap_writes(st);
	struct slot *s = free_slot(st);
	if (s) {
		return s;
	}
	s = oldest_writing(st);
	if (s) {
		complete_write(st, s, true);
		return s;
	}
	struct slot *far = NULL;
	for (uint32_t i = 0; i < st->nslots; i++) {
		struct slot *c = &st->slots[i];
		if (!far || order_pos(st, (uint32_t)c->sg) > order_pos(st, (uint32_t)far->sg)) {
			far = c;
		}
	}
	if (far->state == SLOT_READING) {
		(void)complete_read(st, far, false);
	}
	uint32_t pos = order_pos(st, (uint32_t)far->sg);
	if (pos < st->pf_pos) {
		st->pf_pos = pos; /* read it again when its turn comes */
	}
	slot_free(st, far);
	return far;
}

static int
abort_slots(struct zinf_step *st)
{
	for (uint32_t i = 0; i < st->nslots; i++) {
		struct slot *s = &st->slots[i];
		if (s->state == SLOT_WRITING) {
			complete_write(st, s, true);
		} else if (s->state == SLOT_READING) {
			(void)complete_read(st, s, false);
		}
		slot_free(st, s);
		if (s->buf) {
			(void)zinf_pool_release(st->o.pool, s->buf);
			s->buf = NULL;
		}
	}
	zinf_free(st->slots);
	st->slots = NULL;
	st->nslots = 0;
	st->in_step = false;
	return st->err;
}

/* ---- the step ---------------------------------------------------------------------------- */

int
zinf_step_begin(struct zinf_step *st, int64_t step, float grad_scale, void *copy_host, bool reverse)
{
	if (st->in_step) {
		return ZINF_FAIL(-EBUSY,
				 "optimizer step %" PRId64 " is still in progress (finish it "
				 "first)",
				 st->t);
	}
	if (step < 1) {
		return ZINF_FAIL(-EINVAL, "optimizer step: step %" PRId64 " < 1", step);
	}
	st->t = step;
	st->grad_scale = grad_scale;
	st->copy_host = copy_host;
	st->reverse = reverse;
	st->err = 0;
	st->errmsg[0] = '\0';
	st->pf_pos = 0;
	st->wseq = 0;
	memset(st->done, 0, st->nsg);
	memset(&st->stats, 0, sizeof(st->stats));
	if (st->o.tier == ZINF_TIER_CPU && !st->o.param_swap) {
		st->in_step = true;
		return 0;
	}

	uint32_t want = st->o.buffers ? st->o.buffers : zinf_pool_buffer_count(st->o.pool);
	want = ZINF_MIN(want, st->nsg + 1); /* more than one per sub-group never helps */
	st->slots = zinf_calloc(want, sizeof(*st->slots));
	if (!st->slots) {
		return ZINF_FAIL(-ENOMEM, "optimizer step: out of memory");
	}
	/* The first buffer is waited for; the rest: those the budget gives now (or as many as
	 * asked for, waited for). */
	for (uint32_t i = 0; i < want; i++) {
		void *b = NULL;
		bool wait = i == 0 || st->o.buffers;
		if (!wait && zinf_pool_free_count(st->o.pool) == 0) {
			break; /* the budget gives no more now: run with what we have */
		}
		int rc = zinf_pool_acquire(st->o.pool, wait ? st->o.timeout_ms : 0, &b);
		if (rc < 0) {
			if (i > 0 && !st->o.buffers) {
				break;
			}
			st->nslots = i;
			abort_slots(st);
			return ZINF_FAIL(rc,
					 "optimizer step %" PRId64 ": cannot take %u buffers "
					 "from the pool (%s)",
					 step, want, zinf_strerror(rc));
		}
		st->slots[i].buf = b;
		st->slots[i].sg = -1;
		st->nslots = i + 1;
	}
	st->stats.buffers = st->nslots;
	st->in_step = true;
	pump(st, -1);
	return 0;
}

/* Adam on [i0, i1) of sub-group k, with state at master/m/v (sub-group relative). */
static int
adam_range(struct zinf_step *st, uint32_t k, float *master, float *m, float *v, const char *grad,
	   enum zinf_dtype gdt, char *copy, uint64_t i0, uint64_t i1)
{
	size_t gsz = zinf_dtype_size(gdt);
	double t0 = zinf_now_s();
	int rc = zinf_adam_step(&st->o.adam, st->t, st->grad_scale, master + i0, grad + i0 * gsz,
				gdt, m + i0, v + i0, i1 - i0,
				copy ? copy + i0 * st->copy_esz : NULL, st->o.copy_dtype);
	st->stats.adam_s += zinf_now_s() - t0;
	return rc;
}

/*
 * State on the CPU tier, the 16-bit copy to the parameter tier's files: Adam writes sub-group
 * k's copy into a pool buffer (and the caller's host buffer), whose write to (param_kind, k)
 * runs while Adam goes on with the next sub-groups. The buffer frees when the write is
 * acknowledged; with all of them writing, the oldest is waited for.
 */
static int
ready_cpu_param_swap(struct zinf_step *st, uint32_t k, const char *grad, enum zinf_dtype gdt,
		     char *host)
{
	uint64_t len = zinf_step_sub_group_len(st, k);
	uint64_t start = zinf_step_sub_group_start(st, k);
	struct slot *s = slot_for(st, k);
	if (st->err) {
		return st->err; /* the write waited for failed */
	}
	s->sg = k;
	s->state = SLOT_LOADED;
	st->sg_slot[k] = (int32_t)(s - st->slots);
	char *copy = s->buf + st->part_off[PART_P16];
	for (uint64_t i0 = 0; i0 < len; i0 += ADAM_CHUNK) {
		uint64_t i1 = ZINF_MIN(len, i0 + ADAM_CHUNK);
		int rc = adam_range(st, k, st->cpu[0] + start, st->cpu[1] + start,
				    st->cpu[2] + start, grad, gdt, copy, i0, i1);
		if (rc) {
			slot_free(st, s);
			return note_err(st, rc, k, "Adam");
		}
		reap_writes(st); /* between chunks: free the buffers of finished writes */
	}
	if (host) {
		memcpy(host, copy, len * st->copy_esz);
	}
	st->done[k] = 1;
	s->state = SLOT_WRITING;
	s->seq = st->wseq++;
	s->p0 = PART_P16;
	s->nops = NPARTS;
	(void)zinf_swap_write_async(st->o.param_swap, swap_id(st, k, PART_P16), copy,
				    &s->ops[PART_P16]);
	reap_writes(st);
	return st->err;
}

int
zinf_step_ready(struct zinf_step *st, uint32_t k, const void *grad, enum zinf_dtype grad_dtype)
{
	if (!st->in_step) {
		return ZINF_FAIL(-EINVAL,
				 "optimizer step: sub-group %u ready outside a step "
				 "(zinf_step_begin first)",
				 k);
	}
	if (k >= st->nsg) {
		return ZINF_FAIL(-EINVAL, "optimizer step: sub-group %u of %u", k, st->nsg);
	}
	if (st->err) {
		return st->err; /* the step already failed; finish reports it */
	}
	if (st->done[k]) {
		return ZINF_FAIL(-EINVAL,
				 "optimizer step %" PRId64 ": sub-group %u made ready twice", st->t,
				 k);
	}
	if (!grad) {
		return note_err(st, ZINF_FAIL(-EINVAL, "NULL gradient"), k, "gradient");
	}
	uint64_t len = zinf_step_sub_group_len(st, k);
	uint64_t start = zinf_step_sub_group_start(st, k);
	char *host = st->copy_host ? st->copy_host + start * st->copy_esz : NULL;

	if (st->o.tier == ZINF_TIER_CPU && !st->o.param_swap) {
		int rc = adam_range(st, k, st->cpu[0] + start, st->cpu[1] + start,
				    st->cpu[2] + start, grad, grad_dtype, host, 0, len);
		if (rc) {
			return note_err(st, rc, k, "Adam");
		}
		st->done[k] = 1;
		st->written[k] = st->t;
		return 0;
	}
	if (st->o.tier == ZINF_TIER_CPU) {
		return ready_cpu_param_swap(st, k, grad, grad_dtype, host);
	}

	/* Its state in: read now if it was not prefetched. */
	if (st->sg_slot[k] < 0) {
		struct slot *s = slot_for(st, k);
		start_read(st, s, k);
	}
	struct slot *s = &st->slots[st->sg_slot[k]];
	if (s->state == SLOT_READING) {
		/* Queue the read-ahead first: its reads go behind this one, not after Adam.
		 * (DeepSpeed issues the next read only once this one is in, and blocks.) */
		if (st->o.schedule != ZINF_SCHEDULE_DEEPSPEED) {
			pump(st, k);
			wait_pumping(st, s, k);
		}
		int rc = complete_read(st, s, true);
		if (rc) {
			return rc;
		}
	}
	pump(st, k);

	float *master = (float *)(s->buf + st->part_off[PART_MASTER]);
	float *m = (float *)(s->buf + st->part_off[PART_M]);
	float *v = (float *)(s->buf + st->part_off[PART_V]);
	char *copy = st->o.param_swap ? s->buf + st->part_off[PART_P16] : host;
	for (uint64_t i0 = 0; i0 < len; i0 += ADAM_CHUNK) {
		uint64_t i1 = ZINF_MIN(len, i0 + ADAM_CHUNK);
		int rc = adam_range(st, k, master, m, v, grad, grad_dtype, copy, i0, i1);
		if (rc) {
			slot_free(st, s);
			return note_err(st, rc, k, "Adam");
		}
		/* Between chunks: finished writes become reads, so the disk does not idle. */
		pump(st, k);
	}
	if (st->o.param_swap && host) {
		memcpy(host, copy, len * st->copy_esz);
	}
	st->done[k] = 1;

	if (st->o.schedule == ZINF_SCHEDULE_DEEPSPEED) {
		/* pipeline_write: the previous write is waited for before this one starts. */
		struct slot *w;
		while ((w = oldest_writing(st)) != NULL) {
			complete_write(st, w, true);
		}
	}
	s->state = SLOT_WRITING;
	s->seq = st->wseq++;
	s->p0 = 0;
	s->nops = st->o.param_swap ? NPARTS : 3;
	for (int p = 0; p < s->nops; p++) {
		(void)zinf_swap_write_async(part_swap(st, p), swap_id(st, k, p),
					    s->buf + st->part_off[p], &s->ops[p]);
	}
	pump(st, -1);
	return st->err;
}

int
zinf_step_finish(struct zinf_step *st)
{
	if (!st->in_step) {
		return ZINF_FAIL(-EINVAL, "optimizer step: finish without begin");
	}
	if (st->o.tier == ZINF_TIER_NVME || st->o.param_swap) {
		abort_slots(st); /* waits for every write; a failed one is the step's error */
	}
	st->in_step = false;
	if (st->err) {
		return ZINF_FAIL(st->err, "%s", st->errmsg);
	}
	for (uint32_t k = 0; k < st->nsg; k++) {
		if (!st->done[k]) {
			st->err = -EINVAL;
			return ZINF_FAIL(-EINVAL,
					 "optimizer step %" PRId64 ": sub-group %u was never "
					 "made ready (its state was not updated)",
					 st->t, k);
		}
	}
	return 0;
}

int
zinf_step_run(struct zinf_step *st, int64_t step, float grad_scale, const void *grad,
	      enum zinf_dtype grad_dtype, void *copy_host)
{
	int rc = zinf_step_begin(st, step, grad_scale, copy_host, false);
	if (rc) {
		return rc;
	}
	size_t gsz = zinf_dtype_size(grad_dtype);
	for (uint32_t k = 0; k < st->nsg; k++) {
		const char *g = (const char *)grad + zinf_step_sub_group_start(st, k) * gsz;
		if (zinf_step_ready(st, k, grad ? g : NULL, grad_dtype)) {
			break;
		}
	}
	return zinf_step_finish(st);
}

/* ---- initial state and read-back --------------------------------------------------------- */

static int
load_save(struct zinf_step *st, uint32_t k, float *const arr[3], bool save)
{
	if (k >= st->nsg) {
		return ZINF_FAIL(-EINVAL, "optimizer step: sub-group %u of %u", k, st->nsg);
	}
	if (st->in_step) {
		return ZINF_FAIL(-EBUSY, "optimizer step: load/save during a step");
	}
	uint64_t len = zinf_step_sub_group_len(st, k);
	uint64_t start = zinf_step_sub_group_start(st, k);
	if (st->o.tier == ZINF_TIER_CPU) {
		for (int p = 0; p < 3; p++) {
			float *c = st->cpu[p] + start;
			if (save && arr[p]) {
				memcpy(arr[p], c, len * 4);
			} else if (!save) {
				if (arr[p]) {
					memcpy(c, arr[p], len * 4);
				} else {
					memset(c, 0, len * 4);
				}
			}
		}
		return 0;
	}
	char *buf = NULL;
	int rc = zinf_pool_acquire(st->o.pool, st->o.timeout_ms, (void **)&buf);
	if (rc < 0) {
		return rc;
	}
	rc = 0;
	struct zinf_swap_op ops[3];
	int nops = 0;
	for (int p = 0; p < 3; p++) {
		float *b = (float *)(buf + st->part_off[p]);
		if (save) {
			if (!arr[p]) {
				continue;
			}
			(void)zinf_swap_read_async(st->o.swap, swap_id(st, k, p), b, &ops[p]);
		} else {
			if (arr[p]) {
				memcpy(b, arr[p], len * 4);
			} else {
				memset(b, 0, len * 4);
			}
			(void)zinf_swap_write_async(st->o.swap, swap_id(st, k, p), b, &ops[p]);
		}
		nops = p + 1;
		(void)nops;
	}
	for (int p = 0; p < 3; p++) {
		if (save && !arr[p]) {
			continue;
		}
		int r = zinf_swap_wait(st->o.swap, &ops[p]);
		if (r && !rc) {
			rc = ZINF_FAIL(r, "optimizer step: %s sub-group %u: %s of %s failed",
				       save ? "reading back" : "loading", k,
				       save ? "read" : "write", part_kind[p]);
		}
		if (r == 0 && save) {
			memcpy(arr[p], buf + st->part_off[p], len * 4);
		}
	}
	if (!save && rc == 0) {
		st->written[k] = 0;
	}
	(void)zinf_pool_release(st->o.pool, buf);
	return rc;
}

int
zinf_step_load(struct zinf_step *st, uint32_t k, const float *master, const float *m,
	       const float *v)
{
	float *const arr[3] = {(float *)master, (float *)m, (float *)v};
	return load_save(st, k, arr, false);
}

int
zinf_step_save(struct zinf_step *st, uint32_t k, float *master, float *m, float *v)
{
	float *const arr[3] = {master, m, v};
	return load_save(st, k, arr, true);
}
