/* SPDX-License-Identifier: Apache-2.0 */
/*
 * offload/step_pipe.c: the step's slots, where its I/O overlaps the optimizer. The step owns B
 * pool buffers ("slots"), each holding one sub-group's optimizer parts (and the parameter copy
 * when it goes to the parameter tier). A slot is FREE, READING (its parts' reads in flight),
 * LOADED, or WRITING. For each sub-group made ready (NVMe tier):
 *
 *   make sure its slot is LOADED (reading it now if it was not prefetched), top up the
 *   read-ahead with every free slot, run the optimizer on it in chunks (between chunks: reap
 *   finished writes and turn their slots into new reads, so the disk never waits for the
 *   optimizer), start its writes.
 *
 * A slot becomes free only when its writes are acknowledged. Depth is B, not one. The
 * DEEPSPEED schedule reproduces PipelinedOptimizerSwapper (pipeline_read + pipeline_write):
 * one read ahead, and the previous sub-group's write waited for before the next one starts.
 * The CPU tier with param_swap or copy_fn uses the same slots for the copy alone (no reads;
 * written to the parameter files with param_swap). before_fn sees the state in the slot once
 * its reads completed and before the optimizer runs (CPU tier: in place); copy_fn gets the copy
 * from the slot after the optimizer ran and before the writes start. External parts
 * (opts.external_parts) have room in a slot but no I/O: fill_fn fills them just before
 * before_fn.
 *
 * Errors: the swap space logs an operation's failure (naming the tensor and the file) when it
 * is reaped, which may be long before the step looks at that part again; the slot keeps the
 * first failed part and its message from that moment, so the step's error names one tensor.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "offload/step_internal.h"

static struct zinf_swap *
part_swap(const struct zinf_step *st, uint32_t part)
{
	return part < st->nopt ? st->o.swap : st->o.param_swap;
}

/* After a start, poll or wait of part p: keep the first failure's message, from now. */
static void
op_note(struct slot *s, uint32_t p, int r)
{
	if (s->epart < 0 && (r < 0 || s->ops[p].result < 0)) {
		s->epart = (int)p;
		snprintf(s->emsg, sizeof(s->emsg), "%s", zinf_last_error());
	}
}

static int
op_wait(struct zinf_step *st, struct slot *s, uint32_t p)
{
	int r = zinf_swap_wait(part_swap(st, p), &s->ops[p]);
	op_note(s, p, r);
	return r;
}

static bool
op_poll(struct zinf_step *st, struct slot *s, uint32_t p)
{
	int r = zinf_swap_poll(part_swap(st, p), &s->ops[p]);
	op_note(s, p, r);
	return r != 0;
}

/* The step's error from slot s's first failed operation ("read"/"write" of its part). */
static int
slot_err(struct zinf_step *st, struct slot *s, int rc, const char *verb)
{
	char what[80];
	snprintf(what, sizeof(what), "%s of %s[%" PRId64 "]", verb, st->kind[s->epart], s->sg);
	return step_note_err(st, rc, (uint32_t)s->sg, what, s->emsg);
}

static void
slot_start(struct zinf_step *st, struct slot *s, uint32_t k, enum slot_state state, uint32_t p0,
	   uint32_t p1)
{
	s->sg = k;
	s->state = state;
	s->p0 = p0;
	s->p1 = p1;
	s->epart = -1;
	st->sg_slot[k] = (int32_t)(s - st->slots);
	/* A failed start leaves op->result set: the error surfaces when the slot is completed. */
	for (uint32_t p = p0; p < p1; p++) {
		if (!step_part_io(st, p)) {
			continue; /* external: no I/O (filled before the optimizer) */
		}
		int r = state == SLOT_READING
				? zinf_swap_read_async(part_swap(st, p), step_swap_id(st, k, p),
						       s->buf + st->part_off[p], &s->ops[p])
				: zinf_swap_write_async(part_swap(st, p), step_swap_id(st, k, p),
							s->buf + st->part_off[p], &s->ops[p]);
		op_note(s, p, r);
	}
	if (state == SLOT_WRITING) {
		s->seq = st->wseq++;
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
	s->p0 = s->p1 = 0;
}

/* Wait for a READING slot's reads. keep_err: a failure fails the step (else it is dropped). */
static int
complete_read(struct zinf_step *st, struct slot *s, bool keep_err)
{
	uint64_t len = zinf_step_sub_group_len(st, (uint32_t)s->sg);
	int rc = 0;
	double t0 = zinf_now_s();
	for (uint32_t p = s->p0; p < s->p1; p++) {
		if (!step_part_io(st, p)) {
			continue;
		}
		int r = op_wait(st, s, p);
		if (r == 0) {
			st->stats.read_bytes += step_bytes(st, p, len);
		}
		rc = rc ? rc : r;
	}
	st->stats.wait_read_s += zinf_now_s() - t0;
	if (rc && keep_err) {
		slot_err(st, s, rc, "read");
	}
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
	for (uint32_t p = s->p0; p < s->p1 && !block; p++) {
		if (step_part_io(st, p) && !op_poll(st, s, p)) {
			return 0;
		}
	}
	uint32_t k = (uint32_t)s->sg;
	int rc = 0;
	double t0 = zinf_now_s();
	for (uint32_t p = s->p0; p < s->p1; p++) {
		if (!step_part_io(st, p)) {
			continue;
		}
		int r = op_wait(st, s, p);
		if (r == 0) {
			st->stats.write_bytes +=
				zinf_swap_bytes(part_swap(st, p), step_swap_id(st, k, p));
		}
		rc = rc ? rc : r;
	}
	if (block) {
		st->stats.wait_write_s += zinf_now_s() - t0;
	}
	if (rc) {
		slot_err(st, s, rc, "write");
	}
	/* A failed write may have torn the files: the previous step's state is not whole there
	 * either, so no step counts as written. */
	st->written[k] = rc ? 0 : st->t;
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

/* The next sub-group in processing order that needs a read, advancing pf_pos; -1 if none. */
static int64_t
next_to_read(struct zinf_step *st, int64_t cur)
{
	while (st->pf_pos < st->nsg) {
		uint32_t k = order_sg(st, st->pf_pos);
		if (!st->done[k] && st->sg_slot[k] < 0 && (int64_t)k != cur) {
			return k;
		}
		st->pf_pos++;
	}
	return -1;
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
	int64_t k;
	while ((k = next_to_read(st, cur)) >= 0) {
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
		slot_start(st, s, (uint32_t)k, SLOT_READING, 0, st->nopt);
		st->pf_pos++;
		st->stats.max_reads_in_flight =
			ZINF_MAX(st->stats.max_reads_in_flight, reads_ahead(st));
	}
}

static void
pump_between(struct zinf_step *st, uint32_t k)
{
	pump(st, k);
}

static void
reap_between(struct zinf_step *st, uint32_t k)
{
	reap_writes(st);
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
		for (uint32_t p = s->p0; p < s->p1 && all; p++) {
			all = !step_part_io(st, p) || op_poll(st, s, p);
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

void
step_drop_slot(struct zinf_step *st, uint32_t k)
{
	if (st->sg_slot[k] < 0) {
		return;
	}
	struct slot *s = &st->slots[st->sg_slot[k]];
	if (s->state == SLOT_READING) {
		(void)complete_read(st, s, false);
	}
	slot_free(st, s);
}

int
step_abort_slots(struct zinf_step *st)
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
	zc_free(st->slots);
	st->slots = NULL;
	st->nslots = 0;
	st->in_step = false;
	return st->err;
}

/*
 * Begin: take the slots' buffers. The first is waited for; the rest: those the budget gives now
 * (or as many as `buffers` asks for, waited for). Then start the first reads.
 */
int
step_take_buffers(struct zinf_step *st)
{
	uint32_t want = st->o.buffers ? st->o.buffers : zinf_pool_buffer_count(st->o.pool);
	want = ZINF_MIN(want, st->nsg + 1); /* more than one per sub-group never helps */
	st->slots = zc_calloc(want, sizeof(*st->slots));
	if (!st->slots) {
		return STEP_FAIL(st, -ENOMEM, "out of memory for %u slots", want);
	}
	for (uint32_t i = 0; i < want; i++) {
		void *b = NULL;
		bool wait = i == 0 || st->o.buffers;
		if (!wait && zinf_pool_free_count(st->o.pool) == 0) {
			break; /* the budget gives no more now: run with what we have */
		}
		int rc = zinf_pool_acquire(st->o.pool, wait ? st->o.timeout_ms : 0, &b);
		if (rc < 0 && i > 0 && !st->o.buffers) {
			break;
		}
		if (rc < 0) {
			step_abort_slots(st);
			return STEP_FAIL(st, rc,
					 "step %" PRId64 ": cannot take %u buffers from the "
					 "pool (%s)",
					 st->t, want, zinf_strerror(rc));
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

/*
 * State on the CPU tier, the 16-bit copy to the parameter tier's files (or copy_fn): the
 * optimizer writes
 * sub-group k's copy into a pool buffer (and the caller's host buffer), whose write to
 * (param_kind, k) runs while the optimizer goes on with the next sub-groups. The buffer frees
 * when the write is acknowledged; with all of them writing, the oldest is waited for.
 */
int
step_ready_cpu_swap(struct zinf_step *st, uint32_t k, const char *grad, enum zinf_dtype gdt,
		    char *host)
{
	uint64_t len = zinf_step_sub_group_len(st, k);
	struct slot *s = slot_for(st, k);
	if (st->err) {
		return st->err; /* the write waited for failed */
	}
	s->sg = k;
	s->state = SLOT_LOADED;
	st->sg_slot[k] = (int32_t)(s - st->slots);
	char *copy = s->buf + st->part_off[st->nopt];
	char *base[ZINF_OPTIM_MAX_PARTS];
	for (uint32_t p = 0; p < st->nopt; p++) {
		base[p] = st->cpu[p] + step_cpu_off(st, p, k);
	}
	int rc = step_before(st, k, base);
	if (rc) {
		slot_free(st, s);
		return rc;
	}
	rc = step_optim_sub_group(st, k, base, grad, gdt, copy, reap_between);
	if (rc) {
		slot_free(st, s);
		return rc;
	}
	if (host) {
		memcpy(host, copy, len * st->esz[st->nopt]);
	}
	rc = step_give_copy(st, k, copy);
	if (rc) {
		slot_free(st, s);
		return rc;
	}
	st->done[k] = 1;
	if (st->o.param_swap) {
		slot_start(st, s, k, SLOT_WRITING, st->nopt, st->nparts);
	} else {
		st->written[k] = st->t; /* the state is in memory; the copy went to copy_fn */
		slot_free(st, s);
	}
	reap_writes(st);
	return st->err;
}

/* NVMe: sub-group k's state into a slot (prefetched, or read now), the read-ahead kept going. */
static int
load_slot(struct zinf_step *st, uint32_t k, struct slot **out)
{
	if (st->sg_slot[k] < 0) {
		slot_start(st, slot_for(st, k), k, SLOT_READING, 0, st->nopt);
	}
	struct slot *s = &st->slots[st->sg_slot[k]];
	if (s->state == SLOT_READING) {
		/* Queue the read-ahead first: its reads go behind this one, not after the
		 * optimizer. (DeepSpeed issues the next read only once this one is in, and
		 * blocks.) */
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
	*out = s;
	return 0;
}

int
step_ready_nvme(struct zinf_step *st, uint32_t k, const char *grad, enum zinf_dtype gdt, char *host)
{
	struct slot *s = NULL;
	int rc = load_slot(st, k, &s);
	if (rc) {
		return rc;
	}
	char *base[ZINF_OPTIM_MAX_PARTS];
	for (uint32_t p = 0; p < st->nopt; p++) {
		base[p] = s->buf + st->part_off[p];
	}
	char *copy = step_opts_slot_copy(&st->o) ? s->buf + st->part_off[st->nopt] : host;
	/* The external parts from their keeper, once k's reads are in: a failure fails k as a
	   failed read does. */
	if (st->o.external_parts && (rc = step_fill(st, k, base))) {
		char why[512];
		snprintf(why, sizeof(why), "%s", zinf_last_error());
		step_note_err(st, rc, k, "fill_fn", why);
		slot_free(st, s);
		return rc;
	}
	/* The state as read, before the optimizer: a failure here fails k as a failed read. */
	rc = step_before(st, k, base);
	if (rc) {
		slot_free(st, s);
		return rc;
	}
	/* Between chunks: finished writes become reads, so the disk does not idle. */
	rc = step_optim_sub_group(st, k, base, grad, gdt, copy, pump_between);
	if (rc) {
		slot_free(st, s);
		return rc;
	}
	if (step_opts_slot_copy(&st->o) && host) {
		memcpy(host, copy, zinf_step_sub_group_len(st, k) * st->esz[st->nopt]);
	}
	/* Before the writes start: copy_fn may fail the step, and then nothing of k is written. */
	rc = step_give_copy(st, k, copy);
	if (rc) {
		slot_free(st, s);
		return rc;
	}
	st->done[k] = 1;
	if (st->o.schedule == ZINF_SCHEDULE_DEEPSPEED) {
		/* pipeline_write: the previous write is waited for before this one starts. */
		struct slot *w;
		while ((w = oldest_writing(st)) != NULL) {
			complete_write(st, w, true);
		}
	}
	slot_start(st, s, k, SLOT_WRITING, 0, st->nparts);
	pump(st, -1);
	return st->err;
}
