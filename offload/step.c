/* SPDX-License-Identifier: Apache-2.0 */
/*
 * offload/step.c: the pipelined optimizer step's object: options, the optimizer's parts and
 * their layout in a pool buffer, the swap tensors it declares, initial state and read-back,
 * the step's begin / ready / finish (with the before_fn and copy_fn hooks around the optimizer),
 * and the CPU tier, where the same calls run the optimizer on arrays in memory. The slots, whose
 * I/O overlaps the optimizer, are in step_pipe.c.
 *
 * The step knows an optimizer only through zinf/blocks/optimizer.h: part i of sub-group k is the
 * swap tensor (zinf_optimizer_part_name(i), k) of zinf_optimizer_part_size(i, len(k)) bytes, and
 * one zinf_optimizer_step call per ZINF_STEP_CHUNK piece updates every part. This file does not
 * reduce gradients, compute norms or decide loss scales: the caller passes grad_scale.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "common/opts.h"
#include "offload/step_internal.h"

ZINF_OPTS_NO_TAIL_PAD(struct zinf_step_opts, fill_ctx);
ZINF_OPTS_NO_TAIL_PAD(struct zinf_step_stats, max_reads_in_flight);
ZINF_OPTS_NO_TAIL_PAD(struct zinf_step_part_info, reserved);

static const uint32_t default_esz[] = {4, 4, 4}; /* AdamW, fp32 state (opts.optimizer NULL) */

void
zinf_step_opts_init(struct zinf_step_opts *o)
{
	if (!o) {
		return;
	}
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	o->tier = ZINF_TIER_NVME;
	o->schedule = ZINF_SCHEDULE_PIPELINED;
	o->copy_dtype = ZINF_F16;
	o->param_kind = "param16";
	o->timeout_ms = -1;
	o->rank = -1;
}

/* a * b rounded up to align, false when it overflows 64 bits. */
static bool
span(uint64_t elems, uint64_t esz, uint64_t align, uint64_t *out)
{
	uint64_t b;
	if (__builtin_mul_overflow(elems, esz, &b) || b > UINT64_MAX - align) {
		return false;
	}
	*out = ZINF_ALIGN_UP(b, align);
	return true;
}

/*
 * Elements of the largest sub-group options o cut: the largest gap between sub_group_ends, or
 * sub_group_size (at most n). 0 when the ends are not strictly increasing up to n (validate()
 * names the fault).
 */
static uint64_t
opts_sg_max(const struct zinf_step_opts *o)
{
	if (!o->sub_group_ends) {
		return ZINF_MIN(o->sub_group_size, o->n);
	}
	uint64_t prev = 0, max = 0;
	for (uint32_t k = 0; k < o->n_sub_groups; k++) {
		if (o->sub_group_ends[k] <= prev) {
			return 0;
		}
		max = ZINF_MAX(max, o->sub_group_ends[k] - prev);
		prev = o->sub_group_ends[k];
	}
	return prev == o->n ? max : 0;
}

/*
 * A slot buffer's layout for options o and sub-groups of at most sg elements: NVMe, every
 * optimizer part then (param_swap, copy_fn) the copy; CPU tier, the copy alone. Sets off[] (may
 * be NULL) and *total. -EOVERFLOW when it wraps.
 */
static int
layout(const struct zinf_step_opts *o, uint64_t sg, uint64_t align, uint64_t *off, uint64_t *total)
{
	uint32_t np = o->optimizer ? zinf_optimizer_part_count(o->optimizer) : 3;
	uint64_t at = 0, b = 0;
	if (o->tier != ZINF_TIER_CPU) {
		for (uint32_t p = 0; p < np; p++) {
			uint64_t esz = o->optimizer ? zinf_optimizer_part_bytes(o->optimizer, p)
						    : default_esz[p];
			uint64_t elems = sg;
			if (o->optimizer && zinf_optimizer_part_align(o->optimizer, p) > 1) {
				elems = zinf_optimizer_part_size(o->optimizer, p, sg); /* q8 */
				esz = 1;
			}
			if (off) {
				off[p] = at;
			}
			if (!span(elems, esz, align, &b) || __builtin_add_overflow(at, b, &at)) {
				return -EOVERFLOW;
			}
		}
	}
	if (step_opts_slot_copy(o)) {
		if (off) {
			off[np] = at;
		}
		if (!span(sg, zinf_dtype_size(o->copy_dtype), align, &b) ||
		    __builtin_add_overflow(at, b, &at)) {
			return -EOVERFLOW;
		}
	}
	*total = at;
	return 0;
}

uint64_t
zinf_step_buffer_bytes(const struct zinf_step_opts *opts, uint32_t align)
{
	struct zinf_step_opts o;
	zinf_step_opts_init(&o);
	uint64_t total = 0, sg;
	if (!opts || zc_opts_take(&o, sizeof(o), opts, "zinf_step_opts") ||
	    (sg = opts_sg_max(&o)) == 0 || layout(&o, sg, align ? align : 4096, NULL, &total)) {
		return 0;
	}
	return total;
}

/* ---- create / destroy -------------------------------------------------------------------- */

/* sub_group_ends: n_sub_groups ends, strictly increasing from above 0, the last equal to n. */
static int
validate_ends(struct zinf_step *st)
{
	const struct zinf_step_opts *o = &st->o;
	if (o->n_sub_groups == 0) {
		return STEP_FAIL(st, -EINVAL, "sub_group_ends given with n_sub_groups 0");
	}
	if (o->n_sub_groups > INT32_MAX / STEP_MAXP) {
		return STEP_FAIL(st, -EINVAL, "n_sub_groups %u is too many", o->n_sub_groups);
	}
	uint64_t prev = 0;
	for (uint32_t k = 0; k < o->n_sub_groups; k++) {
		if (o->sub_group_ends[k] <= prev) {
			return STEP_FAIL(st, -EINVAL,
					 "sub_group_ends[%u] = %" PRIu64 " is not above %" PRIu64
					 " (%s): the ends must be strictly increasing (no empty "
					 "sub-group)",
					 k, o->sub_group_ends[k], prev,
					 k ? "the previous end" : "the start, 0");
		}
		prev = o->sub_group_ends[k];
	}
	if (prev != o->n) {
		return STEP_FAIL(st, -EINVAL,
				 "sub_group_ends[%u] = %" PRIu64
				 ", the last end, must equal n %" PRIu64,
				 o->n_sub_groups - 1, prev, o->n);
	}
	return 0;
}

static int
validate(struct zinf_step *st)
{
	const struct zinf_step_opts *o = &st->o;
	if (!o->sub_group_ends && o->n_sub_groups) {
		return STEP_FAIL(st, -EINVAL,
				 "n_sub_groups %u without sub_group_ends (NULL: sub-groups of "
				 "sub_group_size elements; n_sub_groups must then be 0)",
				 o->n_sub_groups);
	}
	if (o->n == 0 || (!o->sub_group_ends && o->sub_group_size == 0)) {
		return STEP_FAIL(st, -EINVAL,
				 "n %" PRIu64 " and sub_group_size %" PRIu64 " must be > 0", o->n,
				 o->sub_group_size);
	}
	if (o->sub_group_ends) {
		int rc = validate_ends(st);
		if (rc) {
			return rc;
		}
	} else if (ZINF_DIV_ROUND_UP(o->n, o->sub_group_size) > INT32_MAX / STEP_MAXP) {
		return STEP_FAIL(st, -EINVAL,
				 "%" PRIu64 " sub-groups are too many: raise "
				 "sub_group_size",
				 ZINF_DIV_ROUND_UP(o->n, o->sub_group_size));
	}
	if (o->copy_dtype != ZINF_F16 && o->copy_dtype != ZINF_BF16 && o->copy_dtype != ZINF_F32) {
		return STEP_FAIL(st, -EINVAL, "unknown copy_dtype %d", (int)o->copy_dtype);
	}
	if (o->tier != ZINF_TIER_NVME && o->tier != ZINF_TIER_CPU) {
		return STEP_FAIL(st, -EINVAL, "unknown tier %d", (int)o->tier);
	}
	if (o->schedule != ZINF_SCHEDULE_PIPELINED && o->schedule != ZINF_SCHEDULE_DEEPSPEED) {
		return STEP_FAIL(st, -EINVAL, "unknown schedule %d", (int)o->schedule);
	}
	if (o->tier == ZINF_TIER_NVME && (!o->swap || !o->pool)) {
		return STEP_FAIL(st, -EINVAL, "state on NVMe needs a swap space and a pinned pool");
	}
	if (o->tier == ZINF_TIER_CPU && o->param_swap && !o->pool) {
		return STEP_FAIL(st, -EINVAL,
				 "state on the CPU tier with the 16-bit copy to the parameter "
				 "tier's files needs a pinned pool (its buffers carry the copy to "
				 "the files)");
	}
	if (o->tier == ZINF_TIER_CPU && o->copy_fn && !o->pool) {
		return STEP_FAIL(st, -EINVAL,
				 "state on the CPU tier with a copy_fn needs a pinned pool (its "
				 "buffers carry the copy to copy_fn)");
	}
	uint32_t np = o->optimizer ? zinf_optimizer_part_count(o->optimizer) : 3;
	if (o->external_parts &&
	    (o->tier != ZINF_TIER_NVME || !o->fill_fn || (np < 32 && o->external_parts >> np))) {
		return STEP_FAIL(st, -EINVAL, "external_parts 0x%x: %s", o->external_parts,
				 o->tier != ZINF_TIER_NVME ? "only with the state on NVMe"
				 : !o->fill_fn		   ? "needs a fill_fn"
							   : "names a part the optimizer lacks");
	}
	uint64_t total;
	if (layout(o, opts_sg_max(o), 4096, NULL, &total) || o->n > (UINT64_MAX - 64) / 4) {
		return STEP_FAIL(st, -EINVAL,
				 "n %" PRIu64 " with sub-groups of up to %" PRIu64
				 " elements: the state's bytes overflow 64 bits",
				 o->n, opts_sg_max(o));
	}
	return 0;
}

/* The optimizer (the caller's or a default AdamW) and its parts. */
static int
setup_parts(struct zinf_step *st)
{
	st->opt = st->o.optimizer;
	if (!st->opt) {
		int rc = zinf_optimizer_create(NULL, &st->own_opt);
		if (rc) {
			return rc;
		}
		st->opt = st->own_opt;
	}
	st->nopt = zinf_optimizer_part_count(st->opt);
	st->nparts = st->nopt + (st->o.param_swap ? 1 : 0);
	for (uint32_t p = 0; p < st->nopt; p++) {
		st->esz[p] = zinf_optimizer_part_bytes(st->opt, p);
		st->kind[p] = zinf_optimizer_part_name(st->opt, p);
	}
	st->esz[st->nopt] = (uint32_t)zinf_dtype_size(st->o.copy_dtype);
	st->kind[st->nopt] = st->param_kind;
	if (zinf_optimizer_state_format(st->opt) == ZINF_STATE_Q8) {
		/* each sub-group a q8 array of its own: its blocks from its start */
		st->q8_off = zc_calloc((size_t)st->nsg + 1, sizeof(*st->q8_off));
		if (!st->q8_off) {
			return STEP_FAIL(st, -ENOMEM, "out of memory for %u sub-groups", st->nsg);
		}
		for (uint32_t k = 0; k < st->nsg; k++) {
			st->q8_off[k + 1] =
				st->q8_off[k] + zinf_q8_bytes(zinf_step_sub_group_len(st, k));
		}
	}
	return 0;
}

/* Everything both tiers need: name, optimizer, sub-groups, bookkeeping arrays. */
static int
setup_common(struct zinf_step *st)
{
	struct zinf_step_opts *o = &st->o;
	snprintf(st->param_kind, sizeof(st->param_kind), "%s",
		 o->param_kind ? o->param_kind : "param16");
	o->param_kind = st->param_kind;
	st->n = o->n;
	st->sgsize = opts_sg_max(o);
	st->nsg = o->sub_group_ends ? o->n_sub_groups
				    : (uint32_t)ZINF_DIV_ROUND_UP(st->n, st->sgsize);
	st->ends = zc_calloc(st->nsg, sizeof(*st->ends));
	if (!st->ends) {
		return STEP_FAIL(st, -ENOMEM, "out of memory for %u sub-groups", st->nsg);
	}
	for (uint32_t k = 0; k < st->nsg; k++) {
		st->ends[k] = o->sub_group_ends ? o->sub_group_ends[k]
						: ZINF_MIN((uint64_t)(k + 1) * st->sgsize, st->n);
	}
	o->sub_group_ends = st->ends; /* the caller's array need not outlive create */
	if (o->rank >= 0) {
		snprintf(st->name, sizeof(st->name), "optimizer step (rank %d, %u sub-groups)",
			 o->rank, st->nsg);
	} else {
		snprintf(st->name, sizeof(st->name), "optimizer step (%u sub-groups)", st->nsg);
	}
	int rc = setup_parts(st);
	if (rc) {
		return rc;
	}
	st->written = zc_calloc(st->nsg, sizeof(*st->written));
	st->done = zc_calloc(st->nsg, 1);
	st->sg_slot = zc_calloc(st->nsg, sizeof(*st->sg_slot));
	st->ids = zc_calloc((size_t)st->nsg * STEP_MAXP, sizeof(*st->ids));
	if (!st->written || !st->done || !st->sg_slot || !st->ids) {
		return STEP_FAIL(st, -ENOMEM, "out of memory for %u sub-groups", st->nsg);
	}
	for (size_t i = 0; i < (size_t)st->nsg * STEP_MAXP; i++) {
		st->ids[i] = -1;
	}
	for (uint32_t k = 0; k < st->nsg; k++) {
		st->sg_slot[k] = -1;
	}
	return 0;
}

/* CPU tier: every optimizer part for the whole partition, zero-filled. */
static int
create_cpu_state(struct zinf_step *st)
{
	for (uint32_t p = 0; p < st->nopt; p++) {
		uint64_t bytes = ZINF_ALIGN_UP(
			st->q8_off && p > 0 ? st->q8_off[st->nsg] : st->n * st->esz[p], 64);
		if (st->o.pool) {
			int rc = zinf_pool_cpu_alloc(st->o.pool, bytes, (void **)&st->cpu[p]);
			if (rc) {
				return rc;
			}
		} else {
			st->cpu[p] = zinf_alloc_aligned(64, bytes);
			if (!st->cpu[p]) {
				return STEP_FAIL(st, -ENOMEM,
						 "cannot allocate %" PRIu64 " bytes of CPU-tier %s",
						 bytes, st->kind[p]);
			}
			st->cpu_owned = true;
		}
		memset(st->cpu[p], 0, bytes);
	}
	return 0;
}

/* The slot layout, and the pool's buffers checked against it (NVMe; CPU tier with param_swap). */
static int
check_pool(struct zinf_step *st)
{
	const struct zinf_step_opts *o = &st->o;
	bool nvme = o->tier == ZINF_TIER_NVME;
	st->align = nvme ? zinf_swap_align(o->swap) : 0;
	if (o->param_swap) {
		st->align = ZINF_MAX(st->align, zinf_swap_align(o->param_swap));
	}
	st->align = st->align ? st->align : 4096;
	if (layout(o, st->sgsize, st->align, st->part_off, &st->buf_bytes)) {
		return STEP_FAIL(st, -EINVAL,
				 "a sub-group of %" PRIu64
				 " elements aligned to %u bytes overflows "
				 "64 bits",
				 st->sgsize, st->align);
	}
	uint64_t have = zinf_pool_buffer_bytes(o->pool);
	uint32_t count = zinf_pool_buffer_count(o->pool);
	if (count == 0 || have < st->buf_bytes) {
		return STEP_FAIL(
			st, -ENOMEM,
			"too few buffers for one sub-group: the largest sub-group, of %" PRIu64
			" elements needs a buffer of %" PRIu64 " bytes (%s%s), the pool "
			"has %u of %" PRIu64 " bytes: raise the pool's buffer size or "
			"lower sub_group_size",
			st->sgsize, st->buf_bytes, nvme ? zinf_optimizer_name(st->opt) : "",
			nvme ? " state" : "", count, have);
	}
	/* Buffers start at the pool's (2 MiB-aligned) base plus multiples of their size. */
	if (have % st->align != 0) {
		return STEP_FAIL(st, -EINVAL,
				 "pool buffers of %" PRIu64 " bytes are not a multiple of the swap "
				 "space's direct-I/O alignment (%u bytes), so their I/O would be "
				 "refused: create the pool with align = %u",
				 have, st->align, st->align);
	}
	return 0;
}

/* Declare (part, k) in the swap spaces: the state on NVMe, the copy with param_swap. */
static int
declare_swap(struct zinf_step *st)
{
	bool nvme = st->o.tier == ZINF_TIER_NVME;
	for (uint32_t k = 0; k < st->nsg; k++) {
		uint64_t len = zinf_step_sub_group_len(st, k);
		for (uint32_t p = nvme ? 0 : st->nopt; p < st->nparts; p++) {
			if (!step_part_io(st, p)) {
				continue; /* external: the caller keeps it */
			}
			struct zinf_swap *sw = p < st->nopt ? st->o.swap : st->o.param_swap;
			int id = zinf_swap_add(sw, st->kind[p], k, step_bytes(st, p, len));
			if (id < 0) {
				return STEP_FAIL(st, id,
						 "declaring %s[%u] in the swap space failed",
						 st->kind[p], k);
			}
			st->ids[(size_t)k * STEP_MAXP + p] = id;
		}
	}
	return 0;
}

/* The one teardown (create's failures and destroy). */
static void
step_free(struct zinf_step *st)
{
	if (st->cpu_owned) {
		for (uint32_t p = 0; p < ZINF_OPTIM_MAX_PARTS; p++) {
			zinf_free_aligned(st->cpu[p]);
		}
	}
	zinf_optimizer_destroy(st->own_opt);
	zc_free(st->ids);
	zc_free(st->q8_off);
	zc_free(st->ends);
	zc_free(st->sg_slot);
	zc_free(st->done);
	zc_free(st->written);
	zc_free(st);
}

int
zinf_step_create(const struct zinf_step_opts *opts, struct zinf_step **out)
{
	if (!out) {
		return OFFLOAD_NULL("output");
	}
	struct zinf_step *st = zc_calloc(1, sizeof(*st));
	if (!st) {
		return ZINF_FAIL(-ENOMEM, "optimizer step: out of memory");
	}
	snprintf(st->name, sizeof(st->name), "optimizer step");
	zinf_step_opts_init(&st->o);
	int rc = zc_opts_take(&st->o, sizeof(st->o), opts, "zinf_step_opts");
	if (rc == 0) {
		rc = validate(st);
	}
	if (rc == 0) {
		rc = setup_common(st);
	}
	if (rc == 0 && st->o.tier == ZINF_TIER_CPU) {
		rc = create_cpu_state(st);
	}
	if (rc == 0 && step_uses_slots(st)) {
		rc = check_pool(st);
		rc = rc ? rc : declare_swap(st);
	}
	if (rc) {
		step_free(st);
		return rc;
	}
	*out = st;
	return 0;
}

void
zinf_step_destroy(struct zinf_step *st)
{
	if (!st) {
		return;
	}
	if (st->in_step) {
		(void)step_abort_slots(st);
	}
	step_free(st);
}

/* ---- accessors and parts ----------------------------------------------------------------- */

uint32_t
zinf_step_sub_groups(const struct zinf_step *st)
{
	return st ? st->nsg : 0;
}

uint64_t
zinf_step_sub_group_start(const struct zinf_step *st, uint32_t k)
{
	return st && k < st->nsg && k > 0 ? st->ends[k - 1] : 0;
}

uint64_t
zinf_step_sub_group_len(const struct zinf_step *st, uint32_t k)
{
	if (!st || k >= st->nsg) {
		return 0;
	}
	return st->ends[k] - zinf_step_sub_group_start(st, k);
}

int64_t
zinf_step_sub_group_written(const struct zinf_step *st, uint32_t k)
{
	return st && k < st->nsg ? st->written[k] : 0;
}

int
zinf_step_get_stats(const struct zinf_step *st, struct zinf_step_stats *out)
{
	if (!st) {
		return OFFLOAD_NULL("step");
	}
	return zc_stats_give(out, &st->stats, sizeof(st->stats), "zinf_step_stats");
}

uint32_t
zinf_step_part_count(const struct zinf_step *st)
{
	return st ? st->nparts : 0;
}

int
zinf_step_part_info(const struct zinf_step *st, uint32_t part, struct zinf_step_part_info *out)
{
	if (!st) {
		return OFFLOAD_NULL("step");
	}
	if (part >= st->nparts) {
		return STEP_FAIL(st, -EINVAL, "part %u of %u", part, st->nparts);
	}
	struct zinf_step_part_info i = {.size = sizeof(i)};
	i.kind = st->kind[part];
	i.elem_bytes = st->esz[part];
	i.copy = part == st->nopt;
	i.external = !step_part_io(st, part);
	i.swap = i.copy				? st->o.param_swap
		 : i.external			? NULL
		 : st->o.tier == ZINF_TIER_NVME ? st->o.swap
						: NULL;
	return zc_stats_give(out, &i, sizeof(i), "zinf_step_part_info");
}

int
step_swap_id(const struct zinf_step *st, uint32_t k, uint32_t part)
{
	return st->ids[(size_t)k * STEP_MAXP + part];
}

int
zinf_step_swap_id(const struct zinf_step *st, uint32_t k, uint32_t part)
{
	if (!st) {
		return OFFLOAD_NULL("step");
	}
	if (k >= st->nsg || part >= st->nparts) {
		return STEP_FAIL(st, -EINVAL, "sub-group %u of %u, part %u of %u", k, st->nsg, part,
				 st->nparts);
	}
	int id = step_swap_id(st, k, part);
	return id >= 0 ? id : -ENOENT;
}

/* ---- errors and the optimizer ------------------------------------------------------------ */

int
step_note_err(struct zinf_step *st, int rc, uint32_t k, const char *what, const char *why)
{
	if (st->err == 0) {
		uint64_t s = zinf_step_sub_group_start(st, k);
		st->err = rc;
		snprintf(st->errmsg, sizeof(st->errmsg),
			 "%s: step %" PRId64 ": sub-group %u (elements %" PRIu64 "..%" PRIu64
			 "): %s failed: %s",
			 st->name, st->t, k, s, s + zinf_step_sub_group_len(st, k), what, why);
		ZINF_ERR("%s", st->errmsg);
	}
	return rc;
}

int
step_optim_sub_group(struct zinf_step *st, uint32_t k, char *const base[], const char *grad,
		     enum zinf_dtype gdt, char *copy, step_between_fn between)
{
	uint64_t len = zinf_step_sub_group_len(st, k);
	uint64_t start = zinf_step_sub_group_start(st, k);
	size_t gsz = zinf_dtype_size(gdt);
	size_t csz = zinf_dtype_size(st->o.copy_dtype);
	for (uint64_t i0 = 0, n; (n = zinf_step_piece(i0, len)) > 0; i0 += n) {
		void *parts[ZINF_OPTIM_MAX_PARTS];
		for (uint32_t p = 0; p < st->nopt; p++) {
			parts[p] = base[p] + step_bytes(st, p, i0);
		}
		double t0 = zinf_now_s();
		int rc = zinf_optimizer_step(st->opt, st->t, st->grad_scale, parts, grad + i0 * gsz,
					     gdt, start + i0, n, copy ? copy + i0 * csz : NULL,
					     st->o.copy_dtype);
		st->stats.optim_s += zinf_now_s() - t0;
		if (rc) {
			return step_note_err(st, rc, k, zinf_optimizer_name(st->opt),
					     zinf_last_error());
		}
		if (between) {
			between(st, k);
		}
	}
	return 0;
}

int
step_before(struct zinf_step *st, uint32_t k, char *const base[])
{
	if (!st->o.before_fn) {
		return 0;
	}
	const void *parts[ZINF_OPTIM_MAX_PARTS] = {NULL};
	for (uint32_t p = 0; p < st->nopt; p++) {
		parts[p] = base[p];
	}
	int rc = st->o.before_fn(st->o.before_ctx, k, parts, zinf_step_sub_group_len(st, k));
	if (rc) {
		char why[64];
		snprintf(why, sizeof(why), "returned %d (%s)", rc, zinf_strerror(rc));
		return step_note_err(st, rc < 0 ? rc : -EINVAL, k, "before_fn", why);
	}
	return 0;
}

int
step_fill(struct zinf_step *st, uint32_t k, char *const base[])
{
	uint64_t len = zinf_step_sub_group_len(st, k);
	for (uint32_t p = 0; p < st->nopt; p++) {
		if (step_part_io(st, p) || !base[p]) {
			continue;
		}
		int rc = st->o.fill_fn(st->o.fill_ctx, k, p, base[p], len);
		if (rc) {
			rc = rc < 0 ? rc : -EINVAL; /* a positive value is no success either */
			return STEP_FAIL(st, rc,
					 "step %" PRId64 ": sub-group %u: fill_fn of %s[%u] "
					 "returned %d (%s)",
					 st->t, k, st->kind[p], k, rc, zinf_strerror(rc));
		}
	}
	return 0;
}

int
step_give_copy(struct zinf_step *st, uint32_t k, const char *copy)
{
	if (!st->o.copy_fn) {
		return 0;
	}
	int rc = st->o.copy_fn(st->o.copy_ctx, k, copy, zinf_step_sub_group_len(st, k));
	if (rc) { /* a positive value is no success either (as before_fn's) */
		char why[64];
		snprintf(why, sizeof(why), "returned %d (%s)", rc, zinf_strerror(rc));
		return step_note_err(st, rc < 0 ? rc : -EINVAL, k, "copy_fn", why);
	}
	return 0;
}

/* ---- the step ---------------------------------------------------------------------------- */

int
zinf_step_begin(struct zinf_step *st, int64_t step, float grad_scale, void *copy_host, bool reverse)
{
	if (!st) {
		return OFFLOAD_NULL("step");
	}
	if (st->in_step) {
		return STEP_FAIL(st, -EBUSY,
				 "step %" PRId64 " is still in progress (finish it first)", st->t);
	}
	if (step < 1) {
		return STEP_FAIL(st, -EINVAL, "step %" PRId64 " < 1", step);
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
	st->stats.size = sizeof(st->stats);
	if (!step_uses_slots(st)) {
		st->in_step = true;
		return 0;
	}
	return step_take_buffers(st);
}

/* CPU tier, no copy to files: the optimizer on the arrays in memory. */
static int
ready_cpu(struct zinf_step *st, uint32_t k, const char *grad, enum zinf_dtype gdt, char *host)
{
	char *base[ZINF_OPTIM_MAX_PARTS];
	for (uint32_t p = 0; p < st->nopt; p++) {
		base[p] = st->cpu[p] + step_cpu_off(st, p, k);
	}
	int rc = step_before(st, k, base);
	if (rc) {
		return rc;
	}
	rc = step_optim_sub_group(st, k, base, grad, gdt, host, NULL);
	if (rc) {
		return rc;
	}
	st->done[k] = 1;
	st->written[k] = st->t;
	return 0;
}

int
zinf_step_ready(struct zinf_step *st, uint32_t k, const void *grad, enum zinf_dtype grad_dtype)
{
	if (!st) {
		return OFFLOAD_NULL("step");
	}
	if (!st->in_step) {
		return STEP_FAIL(st, -EINVAL,
				 "sub-group %u ready outside a step (zinf_step_begin "
				 "first)",
				 k);
	}
	if (k >= st->nsg) {
		return STEP_FAIL(st, -EINVAL, "sub-group %u of %u", k, st->nsg);
	}
	if (st->err) {
		return st->err; /* the step already failed; finish reports it */
	}
	if (st->done[k]) {
		return STEP_FAIL(st, -EINVAL, "step %" PRId64 ": sub-group %u made ready twice",
				 st->t, k);
	}
	if (!grad) {
		return step_note_err(st, -EINVAL, k, "gradient", "NULL gradient");
	}
	size_t csz = zinf_dtype_size(st->o.copy_dtype);
	char *host = st->copy_host ? st->copy_host + zinf_step_sub_group_start(st, k) * csz : NULL;
	if (!step_uses_slots(st)) {
		return ready_cpu(st, k, grad, grad_dtype, host);
	}
	if (st->o.tier == ZINF_TIER_CPU) {
		return step_ready_cpu_swap(st, k, grad, grad_dtype, host);
	}
	return step_ready_nvme(st, k, grad, grad_dtype, host);
}

int
zinf_step_skip(struct zinf_step *st, uint32_t k)
{
	if (!st) {
		return OFFLOAD_NULL("step");
	}
	if (!st->in_step) {
		return STEP_FAIL(st, -EINVAL,
				 "sub-group %u skipped outside a step (zinf_step_begin first)", k);
	}
	if (k >= st->nsg) {
		return STEP_FAIL(st, -EINVAL, "sub-group %u of %u", k, st->nsg);
	}
	if (st->done[k]) {
		return STEP_FAIL(st, -EINVAL,
				 "step %" PRId64 ": sub-group %u skipped after it was made ready",
				 st->t, k);
	}
	if (step_uses_slots(st)) {
		step_drop_slot(st, k); /* a read ahead of it: waited for, dropped */
	}
	st->done[k] = 1;
	return 0;
}

int
zinf_step_finish(struct zinf_step *st)
{
	if (!st) {
		return OFFLOAD_NULL("step");
	}
	if (!st->in_step) {
		return STEP_FAIL(st, -EINVAL, "finish without begin");
	}
	if (step_uses_slots(st)) {
		step_abort_slots(st); /* waits for every write; a failed one is the step's error */
	}
	st->in_step = false;
	if (st->err) {
		return ZINF_FAIL(st->err, "%s", st->errmsg);
	}
	for (uint32_t k = 0; k < st->nsg; k++) {
		if (!st->done[k]) {
			st->err = -EINVAL;
			return STEP_FAIL(st, -EINVAL,
					 "step %" PRId64 ": sub-group %u was never made ready (its "
					 "state was not updated)",
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
load_save_check(struct zinf_step *st, uint32_t k)
{
	if (!st) {
		return OFFLOAD_NULL("step");
	}
	if (k >= st->nsg) {
		return STEP_FAIL(st, -EINVAL, "sub-group %u of %u", k, st->nsg);
	}
	if (st->in_step) {
		return STEP_FAIL(st, -EBUSY, "load/save of sub-group %u during step %" PRId64, k,
				 st->t);
	}
	return 0;
}

/* CPU tier: copy part p of sub-group k in (load: from arr, NULL zeros) or out (save). */
static void
load_save_cpu(struct zinf_step *st, uint32_t k, uint32_t p, void *arr, bool save)
{
	uint64_t len = zinf_step_sub_group_len(st, k);
	char *c = st->cpu[p] + step_cpu_off(st, p, k);
	if (save && arr) {
		memcpy(arr, c, step_bytes(st, p, len));
	} else if (!save && arr) {
		memcpy(c, arr, step_bytes(st, p, len));
	} else if (!save) {
		memset(c, 0, step_bytes(st, p, len));
	}
}

/* NVMe: every part through one pool buffer, all parts' I/O in flight together. */
static int
load_save_nvme(struct zinf_step *st, uint32_t k, void *const arr[], bool save)
{
	char *buf = NULL;
	int rc = zinf_pool_acquire(st->o.pool, st->o.timeout_ms, (void **)&buf);
	if (rc < 0) {
		return rc;
	}
	uint64_t len = zinf_step_sub_group_len(st, k);
	struct zinf_swap_op ops[ZINF_OPTIM_MAX_PARTS];
	char why[ZINF_OPTIM_MAX_PARTS][256] = {{0}}; /* the swap's message, when it was logged */
	for (uint32_t p = 0; p < st->nopt; p++) {
		char *b = buf + st->part_off[p];
		int id = step_swap_id(st, k, p), r = 0;
		if (!step_part_io(st, p)) {
			continue; /* external: filled below (save), its keeper's (load) */
		}
		if (save && arr[p]) {
			r = zinf_swap_read_async(st->o.swap, id, b, &ops[p]);
		} else if (!save) {
			if (arr[p]) {
				memcpy(b, arr[p], step_bytes(st, p, len));
			} else {
				memset(b, 0, step_bytes(st, p, len));
			}
			r = zinf_swap_write_async(st->o.swap, id, b, &ops[p]);
		}
		if (r < 0) {
			snprintf(why[p], sizeof(why[p]), "%s", zinf_last_error());
		}
	}
	rc = 0;
	for (uint32_t p = 0; p < st->nopt; p++) {
		if ((save && !arr[p]) || !step_part_io(st, p)) {
			continue;
		}
		int r = zinf_swap_wait(st->o.swap, &ops[p]);
		if (r && !why[p][0]) {
			snprintf(why[p], sizeof(why[p]), "%s", zinf_last_error());
		}
		if (r && !rc) {
			rc = STEP_FAIL(st, r, "%s sub-group %u: %s of %s[%u] failed: %s",
				       save ? "reading back" : "loading", k,
				       save ? "read" : "write", st->kind[p], k, why[p]);
		}
		if (r == 0 && save) {
			memcpy(arr[p], buf + st->part_off[p], step_bytes(st, p, len));
		}
	}
	if (!rc && save && st->o.external_parts) {
		char *base[ZINF_OPTIM_MAX_PARTS] = {NULL};
		for (uint32_t p = 0; p < st->nopt; p++) {
			base[p] = arr[p]; /* only the parts asked for */
		}
		rc = step_fill(st, k, base);
	}
	(void)zinf_pool_release(st->o.pool, buf);
	return rc;
}

int
zinf_step_load(struct zinf_step *st, uint32_t k, const void *const state[])
{
	int rc = load_save_check(st, k);
	if (rc) {
		return rc;
	}
	void *arr[ZINF_OPTIM_MAX_PARTS] = {NULL};
	for (uint32_t p = 0; state && p < st->nopt; p++) {
		arr[p] = (void *)state[p];
	}
	if (st->o.tier == ZINF_TIER_CPU) {
		for (uint32_t p = 0; p < st->nopt; p++) {
			load_save_cpu(st, k, p, arr[p], false);
		}
		return 0;
	}
	rc = load_save_nvme(st, k, arr, false);
	if (rc == 0) {
		st->written[k] = 0;
	}
	return rc;
}

int
zinf_step_save(struct zinf_step *st, uint32_t k, void *const state[])
{
	int rc = load_save_check(st, k);
	if (rc) {
		return rc;
	}
	if (!state) {
		return STEP_FAIL(st, -EINVAL, "save of sub-group %u into a NULL state array", k);
	}
	if (st->o.tier == ZINF_TIER_CPU) {
		for (uint32_t p = 0; p < st->nopt; p++) {
			load_save_cpu(st, k, p, state[p], true);
		}
		return 0;
	}
	return load_save_nvme(st, k, state, true);
}

/* ---- sub-group state in place ------------------------------------------------------------- */

int
zinf_step_visit(struct zinf_step *st, uint32_t k, enum zinf_step_visit_mode mode,
		zinf_step_visit_fn fn, void *ctx)
{
	int rc = load_save_check(st, k);
	if (rc) {
		return rc;
	}
	if (!fn || (mode != ZINF_STEP_VISIT_READ && mode != ZINF_STEP_VISIT_WRITE)) {
		return STEP_FAIL(st, -EINVAL, "visit of sub-group %u: %s", k,
				 fn ? "unknown mode" : "NULL callback");
	}
	uint64_t len = zinf_step_sub_group_len(st, k);
	void *parts[ZINF_OPTIM_MAX_PARTS] = {NULL};
	if (st->o.tier == ZINF_TIER_CPU) {
		for (uint32_t p = 0; p < st->nopt; p++) {
			parts[p] = st->cpu[p] + step_cpu_off(st, p, k);
		}
		return fn(ctx, k, parts, len);
	}
	char *buf = NULL;
	rc = zinf_pool_acquire(st->o.pool, st->o.timeout_ms, (void **)&buf);
	if (rc < 0) {
		return rc;
	}
	rc = 0; /* the acquire's buffer index */
	struct zinf_swap_op ops[ZINF_OPTIM_MAX_PARTS];
	bool started[ZINF_OPTIM_MAX_PARTS] = {false};
	for (uint32_t p = 0; p < st->nopt; p++) {
		parts[p] = buf + st->part_off[p];
	}
	if (mode == ZINF_STEP_VISIT_READ) {
		for (uint32_t p = 0; p < st->nopt && !rc; p++) {
			if (!step_part_io(st, p)) {
				continue; /* external: filled once the reads are in */
			}
			int id = step_swap_id(st, k, p);
			rc = zinf_swap_read_async(st->o.swap, id, parts[p], &ops[p]);
			started[p] = rc == 0;
		}
	} else {
		rc = fn(ctx, k, parts, len);
		for (uint32_t p = 0; p < st->nopt && !rc; p++) {
			if (!step_part_io(st, p)) {
				continue; /* external: its keeper writes it */
			}
			int id = step_swap_id(st, k, p);
			rc = zinf_swap_write_async(st->o.swap, id, parts[p], &ops[p]);
			started[p] = rc == 0;
		}
	}
	for (uint32_t p = 0; p < st->nopt; p++) {
		if (!started[p]) {
			continue;
		}
		int r = zinf_swap_wait(st->o.swap, &ops[p]);
		if (r && !rc) {
			char why[256];
			snprintf(why, sizeof(why), "%s", zinf_last_error());
			rc = STEP_FAIL(st, r, "sub-group %u: %s of %s[%u] failed: %s", k,
				       mode == ZINF_STEP_VISIT_READ ? "read" : "write", st->kind[p],
				       k, why);
		}
	}
	if (!rc && mode == ZINF_STEP_VISIT_READ && st->o.external_parts) {
		rc = step_fill(st, k, (char *const *)parts);
	}
	if (!rc && mode == ZINF_STEP_VISIT_READ) {
		rc = fn(ctx, k, parts, len);
	}
	if (mode == ZINF_STEP_VISIT_WRITE) {
		st->written[k] = 0;
	}
	(void)zinf_pool_release(st->o.pool, buf);
	return rc;
}
