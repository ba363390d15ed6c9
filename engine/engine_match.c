/* SPDX-License-Identifier: Apache-2.0 */
/*
 * engine/engine_match.c: the ranks match before they talk. At init (and a load in its place),
 * before any collective whose shape depends on them, every rank shows the others what must be
 * alike everywhere: the options that shape the layout, the collectives and the results (stage,
 * tiers, sizes, dtype, the optimizer and its hyper-parameters, clipping, loss scaling,
 * accumulation, the switches that add collectives) and the parameter table (names, sizes,
 * layers, shapes, order). What only sizes this rank's own memory or schedules its own work
 * (buffer counts and sizes, max_in_cpu, step_during_backward, the NVMe schedule) may differ:
 * a rank short of device memory for the speculation's reserve runs without it. One all-gather
 * of a few hundred bytes per rank; every rank compares the same bytes, so every rank returns
 * the same error, naming the first field (its
 * ds_config.json key) or parameter that differs and two ranks' values. Without it a rank at
 * another stage or with another model joins collectives of other sizes: truncation, then heap
 * corruption.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "engine/engine_internal.h"

enum fkind { F_INT, F_UINT, F_BOOL, F_FLOAT, F_DOUBLE, F_DTYPE, F_TIER, F_OPTIM, F_TABLE };

struct field {
	const char *key;
	enum fkind kind;
};

/* The fields, in the order they are compared (the first that differs is named). */
static const struct field fields[] = {
	{"zero_optimization.stage", F_INT},
	{"the parameters' dtype (bf16.enabled, fp16.enabled)", F_DTYPE},
	{"gradient_accumulation_steps", F_UINT},
	{"zero_optimization.offload_param.device", F_TIER},
	{"zero_optimization.offload_optimizer.device", F_TIER},
	{"zero_optimization.sub_group_size", F_UINT},
	{"zero_optimization.reduce_bucket_size", F_UINT},
	{"zero_optimization.allgather_bucket_size", F_UINT},
	{"zero_optimization.overlap_comm", F_BOOL},
	{"zero_optimization.stage3_prefetch_bucket_size", F_UINT},
	{"zero_optimization.stage3_max_live_parameters", F_UINT},
	{"zero_optimization.stage3_max_reuse_distance", F_UINT},
	{"zero_optimization.stage3_param_persistence_threshold", F_UINT},
	{"zero_optimization.stage3_model_persistence_threshold", F_UINT},
	{"zero_optimization.stage3_gather_16bit_weights_on_model_save", F_BOOL},
	{"optimizer.type", F_OPTIM},
	{"optimizer.params.lr", F_FLOAT},
	{"optimizer.params.betas[0]", F_FLOAT},
	{"optimizer.params.betas[1]", F_FLOAT},
	{"optimizer.params.eps", F_FLOAT},
	{"optimizer.params.weight_decay", F_FLOAT},
	{"optimizer.params.lr_decay", F_FLOAT},
	{"optimizer.params.bias_correction", F_BOOL},
	{"the optimizer state's dtype", F_DTYPE},
	{"the optimizer state's rounding", F_UINT},
	{"the optimizer's seed", F_UINT},
	{"optimizer.params.zinf_master_weights (the master's dtype)", F_DTYPE},
	{"gradient_clipping", F_DOUBLE},
	{"fp16.enabled", F_BOOL},
	{"fp16.loss_scale", F_DOUBLE},
	{"fp16.initial_scale_power", F_UINT},
	{"fp16.loss_scale_window", F_UINT},
	{"fp16.hysteresis", F_UINT},
	{"fp16.consecutive_hysteresis", F_BOOL},
	{"fp16.min_loss_scale", F_DOUBLE},
	{"comm_check (every collective compared)", F_BOOL},
	{"record_trace (stage 3 prefetch)", F_BOOL},
	{"the number of parameters registered", F_UINT},
	{"the parameter table", F_TABLE},
};
#define NF (sizeof(fields) / sizeof(fields[0]))

static uint64_t
fbits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static uint64_t
dbits(double d)
{
	uint64_t u;
	memcpy(&u, &d, 8);
	return u;
}

/* FNV-1a over bytes, continuing h. */
static uint64_t
fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *b = p;
	for (size_t i = 0; i < n; i++) {
		h = (h ^ b[i]) * 0x100000001b3ull;
	}
	return h;
}

/* What identifies a parameter: its name (with its end), size, layer and shape. */
static uint64_t
param_hash(const struct eparam *p)
{
	uint64_t h = fnv(0xcbf29ce484222325ull, p->name, strlen(p->name) + 1);
	h = fnv(h, &p->numel, sizeof(p->numel));
	h = fnv(h, &p->layer, sizeof(p->layer));
	h = fnv(h, &p->ndim, sizeof(p->ndim));
	return fnv(h, p->shape, p->ndim * sizeof(p->shape[0]));
}

/* This rank's values of fields[], in their order. */
static void
values(const struct zinf_engine *e, uint64_t v[NF])
{
	const struct zinf_engine_opts *o = &e->o;
	const struct zinf_optimizer_opts *op = &o->optimizer;
	uint64_t table = 0xcbf29ce484222325ull;
	for (uint32_t i = 0; i < e->n_params; i++) {
		uint64_t h = param_hash(&e->params[i]);
		table = fnv(table, &h, sizeof(h));
	}
	const uint64_t x[] = {
		(uint64_t)(int64_t)o->stage,
		o->dtype,
		o->gradient_accumulation_steps,
		o->offload_param.device,
		o->offload_optimizer.device,
		o->sub_group_size,
		o->reduce_bucket_size,
		o->allgather_bucket_size,
		o->overlap_comm,
		o->stage3_prefetch_bucket_size,
		o->stage3_max_live_parameters,
		o->stage3_max_reuse_distance,
		o->stage3_param_persistence_threshold,
		o->stage3_model_persistence_threshold,
		o->stage3_gather_16bit_weights_on_model_save,
		op->kind,
		fbits(op->lr),
		fbits(op->beta1),
		fbits(op->beta2),
		fbits(op->eps),
		fbits(op->weight_decay),
		fbits(op->lr_decay),
		op->bias_correction,
		op->state_dtype,
		op->rounding,
		op->seed,
		op->master_dtype,
		dbits(o->gradient_clipping),
		o->fp16.enabled,
		dbits(o->fp16.loss_scale),
		o->fp16.initial_scale_power,
		o->fp16.loss_scale_window,
		o->fp16.hysteresis,
		o->fp16.consecutive_hysteresis,
		dbits(o->fp16.min_loss_scale),
		o->comm_check,
		o->record_trace,
		e->n_params,
		table,
	};
	_Static_assert(sizeof(x) / sizeof(x[0]) == NF, "a value for every field");
	memcpy(v, x, sizeof(x));
}

static const char *
tier_name(uint64_t t)
{
	return t == ZINF_OFFLOAD_NONE ? "none" : t == ZINF_OFFLOAD_CPU ? "cpu" : "nvme";
}

static const char *
optim_name(uint64_t k)
{
	static const char *const n[] = {"Adam", "AdamW", "Adagrad", "Lion"};
	return k < sizeof(n) / sizeof(n[0]) ? n[k] : "?";
}

/* A field's value as a person reads it. */
static void
show(char *out, size_t len, enum fkind kind, uint64_t v)
{
	float f;
	double d;
	switch (kind) {
	case F_INT:
		snprintf(out, len, "%" PRId64, (int64_t)v);
		break;
	case F_BOOL:
		snprintf(out, len, "%s", v ? "true" : "false");
		break;
	case F_FLOAT: {
		uint32_t u = (uint32_t)v;
		memcpy(&f, &u, 4);
		snprintf(out, len, "%.9g", (double)f);
		break;
	}
	case F_DOUBLE:
		memcpy(&d, &v, 8);
		snprintf(out, len, "%.17g", d);
		break;
	case F_DTYPE:
		snprintf(out, len, "%s", zinf_dtype_name((enum zinf_dtype)v));
		break;
	case F_TIER:
		snprintf(out, len, "%s", tier_name(v));
		break;
	case F_OPTIM:
		snprintf(out, len, "%s", optim_name(v));
		break;
	default:
		snprintf(out, len, "%" PRIu64, v);
	}
}

/*
 * All-gather `bytes` (a multiple of 4) from every rank into all (world x bytes, host memory),
 * through device memory so that "nccl" can carry it.
 */
static int
gather(struct zinf_engine *e, const void *mine, size_t bytes, void *all)
{
	void *dev = NULL;
	size_t words = bytes / 4;
	int ret = eng_comm_buf_alloc(e, bytes * (size_t)e->world, &dev);
	if (ret) {
		return ENG_FAIL(e, ret, "init: %zu bytes of device memory to compare the ranks",
				bytes * (size_t)e->world);
	}
	char *slot = (char *)dev + bytes * (size_t)e->rank;
	if (!(ret = zinf_device_copy(e->cs, slot, mine, bytes, ZINF_COPY_H2D)) &&
	    !(ret = zinf_stream_sync(e->cs)) &&
	    !(ret = zinf_comm_all_gather(e->comm, slot, dev, words, ZINF_F32, NULL)) &&
	    !(ret = zinf_device_copy(e->cs, all, dev, bytes * (size_t)e->world, ZINF_COPY_D2H))) {
		ret = zinf_stream_sync(e->cs);
	}
	eng_comm_buf_free(e, dev);
	return ret ? ENG_FAIL(e, ret, "init: comparing the ranks' options: %s", eng_cause(e)) : 0;
}

/* One parameter as the message shows it. */
struct pshow {
	uint64_t numel;
	int32_t layer;
	uint32_t ndim;
	char name[112];
};

static void
pshow_str(char *out, size_t len, const struct pshow *s)
{
	snprintf(out, len, "\"%.*s\" (%" PRIu64 " elements, layer %" PRId32 ")",
		 (int)sizeof(s->name), s->name, s->numel, s->layer);
}

/*
 * The parameter tables differ: find the first parameter (of the n every rank has) that does, and
 * name it with two ranks' views; when the first n are alike, the rank with more.
 */
static int
table_differs(struct zinf_engine *e, const uint64_t *all)
{
	uint32_t n = e->n_params, fi = NF - 2; /* the count's field */
	for (int r = 0; r < e->world; r++) {
		n = ZINF_MIN(n, (uint32_t)all[(size_t)r * NF + fi]);
	}
	uint64_t *h = zc_calloc((size_t)n + 1, sizeof(*h));
	uint64_t *hall = zc_calloc(((size_t)n + 1) * (size_t)e->world, sizeof(*hall));
	int ret = h && hall ? 0 : -ENOMEM;
	for (uint32_t i = 0; !ret && i < n; i++) {
		h[i] = param_hash(&e->params[i]);
	}
	if (!ret) {
		ret = gather(e, h, ((size_t)n + 1) * sizeof(*h), hall);
	}
	uint32_t at = n;
	int other = 0;
	for (uint32_t i = 0; !ret && i < n && at == n; i++) {
		for (int r = 1; r < e->world; r++) {
			if (hall[(size_t)r * (n + 1) + i] != hall[i]) {
				at = i;
				other = r;
				break;
			}
		}
	}
	zc_free(h);
	zc_free(hall);
	if (ret) {
		return ret == -ENOMEM ? ENG_FAIL(e, ret, "init: comparing the parameter tables")
				      : ret;
	}
	/* at == n: the first n are alike; the tables differ past them (counts, reported before) */
	struct pshow mine = {0}, *shown = zc_calloc((size_t)e->world, sizeof(*shown));
	if (!shown) {
		return ENG_FAIL(e, -ENOMEM, "init: comparing the parameter tables");
	}
	if (at < e->n_params) {
		const struct eparam *p = &e->params[at];
		mine = (struct pshow){p->numel, p->layer, p->ndim, ""};
		snprintf(mine.name, sizeof(mine.name), "%s", p->name);
	}
	if ((ret = gather(e, &mine, sizeof(mine), shown)) == 0) {
		char a[192], b[192];
		pshow_str(a, sizeof(a), &shown[0]);
		pshow_str(b, sizeof(b), &shown[other]);
		ret = ENG_FAIL(e, -EINVAL,
			       "init: the ranks registered different parameters: parameter %" PRIu32
			       " is %s on rank 0 and %s on rank %d (every rank registers the same "
			       "parameters in the same order)",
			       at, a, b, other);
	}
	zc_free(shown);
	return ret;
}

int
eng_ranks_match(struct zinf_engine *e)
{
	if (e->world == 1) {
		return 0;
	}
	uint64_t mine[NF];
	values(e, mine);
	uint64_t *all = zc_calloc((size_t)e->world * NF, sizeof(*all));
	if (!all) {
		return ENG_FAIL(e, -ENOMEM, "init: comparing the ranks' options");
	}
	int ret = gather(e, mine, sizeof(mine), all);
	for (size_t f = 0; !ret && f < NF; f++) {
		for (int r = 1; r < e->world; r++) {
			uint64_t v0 = all[f], vr = all[(size_t)r * NF + f];
			if (vr == v0) {
				continue;
			}
			if (fields[f].kind == F_TABLE) {
				ret = table_differs(e, all);
			} else {
				char a[64], b[64];
				show(a, sizeof(a), fields[f].kind, v0);
				show(b, sizeof(b), fields[f].kind, vr);
				ret = ENG_FAIL(
					e, -EINVAL,
					"init: the ranks' configurations differ: %s is %s on "
					"rank 0 and %s on rank %d (every rank must be given the "
					"same configuration and model)",
					fields[f].key, a, b, r);
			}
			break;
		}
	}
	zc_free(all);
	/* every rank compared the same bytes: every rank returns this error, no notice */
	return ret == -EINVAL ? eng_known(e, ret) : ret;
}
