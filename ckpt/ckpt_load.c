/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ckpt/ckpt_load.c: zinf_engine_load (zinf/checkpoint.h). Every rank opens the checkpoint
 * (zinf_ckpt_open: the manifest and the files' sizes), checks that it matches the engine (the
 * parameters by id, name and numel; the optimizer and its parts), verifies the CRCs of its
 * share of the files, and the ranks agree before anything is written. Then each rank fills its
 * own partition sub-group by sub-group (eng_state_visit), each parameter's range read from the
 * stored ranks' files that hold it (zinf_ckpt_read), so that a checkpoint of any world size
 * loads into any other; the 16-bit parameters are the masters rounded, written to their homes
 * as init writes its initial values. Not here: the file format (ckpt_read.c), save.
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/opts.h"
#include "ckpt/ckpt_fs.h"
#include "ckpt/ckpt_internal.h"
#include "engine/engine_module.h"

struct load_ctx {
	struct zinf_engine *e;
	struct eng_view v;
	struct zinf_ckpt *c;
	void *copy;			 /* ZINF_STEP_CHUNK elements of opts.dtype */
	void *bounce;			 /* eng_state_bounce_bytes() */
	float *q8[ZINF_OPTIM_MAX_PARTS]; /* q8 state: a piece of a sub-group's moments read as
					    f32 (q8_piece() floats), then encoded into the part
					    (the files hold it decoded) */
};

/* Elements of a sub-group filled at once when it holds q8 state: ZINF_STEP_CHUNK (a multiple of
 * ZINF_Q8_BLOCK, so a sub-group's q8 array is cut at its blocks), or the longest sub-group when
 * shorter. */
static uint64_t
q8_piece(const struct eng_view *v)
{
	uint64_t m = 0;
	for (uint32_t k = 0; k < v->n_sg; k++) {
		m = ZINF_MAX(m, v->sg_end[k] - (k ? v->sg_end[k - 1] : 0));
	}
	return ZINF_MIN(m, (uint64_t)ZINF_STEP_CHUNK);
}

/* Elements [off + c0, off + c0 + cn) of every part from the checkpoint (q8 parts: into x->q8,
 * then encoded into the part from its element c0, a multiple of ZINF_Q8_BLOCK). */
static int
load_piece(struct load_ctx *x, uint64_t off, uint64_t c0, uint64_t cn, void *const parts[])
{
	struct zinf_engine *e = x->e;
	const struct eng_view *v = &x->v;
	uint64_t pos = c0, end = c0 + cn;
	int ret = 0;
	for (uint32_t i = eng_flat_find(e, off + c0); i < v->n_params && pos < end && !ret; i++) {
		struct eng_param p;
		eng_param_get(e, eng_flat_param(e, i), &p);
		uint64_t j0 = off + pos - p.flat_off, len = ZINF_MIN(end - pos, p.part.part - j0);
		uint64_t g0 = p.part.offset + j0;
		uint64_t valid = g0 < p.numel ? ZINF_MIN(len, p.numel - g0) : 0;
		for (uint32_t k = 0; k < v->nparts && !ret; k++) {
			size_t pb = zinf_optimizer_part_bytes(v->opt, k);
			char *dst = (char *)parts[k] + pos * pb;
			if (x->q8[k]) { /* f32 here, encoded below */
				pb = 4;
				dst = (char *)(x->q8[k] + (pos - c0));
			}
			if (valid) {
				ret = zinf_ckpt_read(x->c, p.id, k, g0, valid,
						     zinf_optimizer_part_dtype(v->opt, k), dst);
			}
			memset(dst + valid * pb, 0, (len - valid) * pb); /* the padding */
		}
		if (ret) {
			ret = ENG_FAIL(e, ret,
				       "load: parameter \"%s\" elements %" PRIu64 "..%" PRIu64,
				       p.name, g0, g0 + valid);
		}
		pos += len;
	}
	/* q8 state: the visit hands a whole sub-group (cpu and nvme tiers), a q8 array of its own
	 */
	for (uint32_t k = 0; k < v->nparts && !ret; k++) {
		if (x->q8[k]) {
			ret = zinf_q8_encode(x->q8[k], cn,
					     k == 1 ? ZINF_Q8_EXP_AVG : ZINF_Q8_EXP_AVG_SQ,
					     (uint8_t *)parts[k] + zinf_q8_bytes(c0), NULL);
		}
	}
	return ret;
}

/* Flat elements [off, off + n) of every part from the checkpoint, then their 16-bit copy home;
 * in pieces of q8_piece() elements when the state is q8 (a bounded decode buffer). */
static int
load_fill(void *ctx, uint64_t off, uint64_t n, void *const parts[])
{
	struct load_ctx *x = ctx;
	struct zinf_engine *e = x->e;
	uint64_t piece = n;
	for (uint32_t k = 0; k < x->v.nparts; k++) {
		piece = x->q8[k] ? q8_piece(&x->v) : piece;
	}
	int ret = 0;
	for (uint64_t c0 = 0; c0 < n && !ret; c0 += piece) {
		ret = load_piece(x, off, c0, ZINF_MIN(n - c0, piece), parts);
	}
	if (!ret) {
		ret = eng_param_home_from_master(
			e, off, parts[0], zinf_optimizer_part_dtype(x->v.opt, 0), n, x->copy);
	}
	return ret;
}

static int
load_write(struct zinf_engine *e, void *ctx)
{
	struct load_ctx *x = ctx;
	size_t bb = eng_state_bounce_bytes(e);
	eng_view(e, &x->v); /* the layout init just built */
	x->copy = zc_calloc(ZINF_STEP_CHUNK, zinf_dtype_size(x->v.o->dtype));
	x->bounce = bb ? zinf_alloc_huge(bb) : NULL;
	int ret = 0;
	if (!x->copy || (bb && !x->bounce)) {
		ret = ENG_FAIL(e, -ENOMEM, "load: out of memory for its buffers");
	}
	for (uint32_t k = 1; k < x->v.nparts && !ret; k++) {
		if (zinf_optimizer_part_align(x->v.opt, k) > 1 &&
		    !(x->q8[k] = zc_calloc(q8_piece(&x->v), sizeof(float)))) {
			ret = ENG_FAIL(e, -ENOMEM,
				       "load: out of memory for q8 state (%" PRIu64 " floats)",
				       q8_piece(&x->v));
		}
	}
	for (uint32_t k = 0; k < x->v.n_sg && !ret; k++) {
		ret = eng_state_visit(e, k, true, load_fill, x, x->bounce, NULL);
		if (ret) {
			ret = ENG_FAIL(e, ret, "load: sub-group %u", k);
		}
	}
	zc_free(x->copy);
	zinf_free_huge(x->bounce, bb);
	x->copy = x->bounce = NULL;
	for (uint32_t k = 0; k < ZINF_OPTIM_MAX_PARTS; k++) {
		zc_free(x->q8[k]);
		x->q8[k] = NULL;
	}
	return ret;
}

/* The checkpoint matches this engine: parameters, optimizer, parts. */
static int
check_match(struct zinf_engine *e, const struct eng_view *v, struct zinf_ckpt *c,
	    const struct zinf_ckpt_info *in)
{
	if (in->n_params != v->n_params) {
		return ENG_FAIL(e, -EINVAL,
				"load: %s holds %u parameters, this engine has %u registered",
				in->path, in->n_params, v->n_params);
	}
	for (uint32_t i = 0; i < v->n_params; i++) {
		struct zinf_ckpt_param cp = {.size = sizeof(cp)};
		int ret = zinf_ckpt_param(c, i, &cp);
		if (ret) {
			return ret;
		}
		struct eng_param p;
		eng_param_get(e, i, &p);
		if (strcmp(cp.name, p.name) != 0 || cp.numel != p.numel) {
			return ENG_FAIL(e, -EINVAL,
					"load: parameter %u is \"%s\" of %" PRIu64
					" elements in %s, \"%s\" of %" PRIu64 " here",
					i, cp.name, cp.numel, in->path, p.name, p.numel);
		}
	}
	if (strcmp(in->optimizer, zinf_optimizer_name(v->opt)) != 0 || in->n_parts != v->nparts) {
		return ENG_FAIL(
			e, -EINVAL,
			"load: %s holds %s state (%u parts), this engine runs %s (%u parts)",
			in->path, in->optimizer, in->n_parts, zinf_optimizer_name(v->opt),
			v->nparts);
	}
	for (uint32_t k = 0; k < v->nparts; k++) {
		struct zinf_ckpt_part cp = {.size = sizeof(cp)};
		int ret = zinf_ckpt_part(c, k, &cp);
		if (ret) {
			return ret;
		}
		/* the master is in the files as f32 whatever its dtype here (a bf16 master is
		   rounded to nearest as it is read: exact for one saved from a bf16 master) */
		enum zinf_dtype here = k == 0 ? ZINF_F32 : zinf_optimizer_part_dtype(v->opt, k);
		if (strcmp(cp.name, zinf_optimizer_part_name(v->opt, k)) != 0 || cp.dtype != here) {
			return ENG_FAIL(e, -EINVAL,
					"load: state part %u is %s (%s) in %s, %s (%s) here: the "
					"optimizer's state dtype differs",
					k, cp.name, zinf_dtype_name(cp.dtype), in->path,
					zinf_optimizer_part_name(v->opt, k), zinf_dtype_name(here));
		}
	}
	return 0;
}

/* The counters and the scaler from the manifest. */
struct counters {
	int64_t steps;
	uint64_t micro_steps, skipped;
	double lr;
	double beta1, beta2; /* NaN: not in the manifest (the options' betas stay) */
	struct zinf_loss_scaler ls;
	bool has_ls;
};

static int
read_counters(struct zinf_engine *e, const struct eng_view *v, const struct zinf_ckpt *c,
	      const char *tagdir, struct counters *out)
{
	char p[CKPT_PATH]; /* for messages: the manifest zinf_ckpt_open read and checked */
	ckpt_join(p, tagdir, "manifest.json");
	const json_t *m = ckpt_manifest(c);
	json_t *steps = json_object_get(m, "steps"), *micro = json_object_get(m, "micro_steps");
	json_t *skipped = json_object_get(m, "skipped_steps"), *lr = json_object_get(m, "lr");
	json_t *ls = json_object_get(m, "loss_scaler");
	/* their presence and types: checked by zinf_ckpt_open (ckpt_internal.h) */
	int ret = 0;
	out->steps = json_integer_value(steps);
	out->micro_steps = (uint64_t)json_integer_value(micro);
	out->skipped = (uint64_t)json_integer_value(skipped);
	out->lr = json_number_value(lr);
	json_t *b = json_object_get(m, "betas");
	json_t *b1 = json_array_get(b, 0), *b2 = json_array_get(b, 1);
	out->beta1 = json_is_number(b1) ? json_number_value(b1) : NAN;
	out->beta2 = json_is_number(b2) ? json_number_value(b2) : NAN;
	json_t *sc = json_object_get(ls, "scale"), *h = json_object_get(ls, "hysteresis_left");
	json_t *it = json_object_get(ls, "iter"), *lo = json_object_get(ls, "last_overflow");
	json_t *ov = json_object_get(ls, "overflows");
	out->has_ls = json_is_number(sc) && json_is_integer(h) && json_is_integer(it) &&
		      json_is_integer(lo) && json_is_integer(ov);
	if (out->has_ls) {
		out->ls.scale = json_number_value(sc);
		out->ls.cur_hysteresis = (uint32_t)json_integer_value(h);
		out->ls.iter = json_integer_value(it);
		out->ls.last_overflow = json_integer_value(lo);
		out->ls.overflows = (uint64_t)json_integer_value(ov);
	}
	/* scale 0: the saving engine did not scale its loss (no fp16); an fp16 engine
	   keeps its own initial scaler */
	bool unscaled = out->has_ls && out->ls.scale == 0;
	if (out->has_ls && !(isfinite(out->ls.scale) && out->ls.scale >= 0 && out->ls.iter >= 0 &&
			     out->ls.last_overflow >= -1)) {
		ret = ENG_FAIL(e, -EBADMSG,
			       "load: %s: loss_scaler.scale %g, iter %" PRId64
			       " or last_overflow %" PRId64 " invalid",
			       p, out->ls.scale, out->ls.iter, out->ls.last_overflow);
	} else if (!out->has_ls && v->o->fp16.enabled) {
		ret = ENG_FAIL(e, -EBADMSG,
			       "load: %s: loss_scaler lacks scale, hysteresis_left, iter, "
			       "last_overflow or overflows, which fp16 training needs",
			       p);
	} else if (out->steps < 0 || !(out->lr >= 0)) {
		ret = ENG_FAIL(e, -EBADMSG, "load: %s: steps %" PRId64 " or lr %g invalid", p,
			       out->steps, out->lr);
	}
	out->has_ls = out->has_ls && !unscaled;
	return ret;
}

/* client.bin's size into o->client_len (0 when the manifest lists none: zinf_ckpt_open checked
 * that it is there with that size); above client_cap: -ENOSPC. Its bytes are read only once the
 * load has succeeded (read_client_bytes): a refused load leaves the caller's buffer as it was. */
static int
size_client(struct zinf_engine *e, struct zinf_ckpt *c, const char *tagdir,
	    struct zinf_ckpt_opts *o)
{
	int k = ckpt_file_find(c, "client.bin");
	struct zinf_ckpt_file f = {.size = sizeof(f)};
	o->client_len = 0;
	if (k < 0) {
		return 0;
	}
	int ret = zinf_ckpt_file(c, (uint32_t)k, &f);
	if (ret) {
		return ret;
	}
	o->client_len = f.bytes;
	if (o->client_len > o->client_cap && (o->client_out || o->client_cap)) {
		char p[CKPT_PATH];
		ckpt_join(p, tagdir, "client.bin");
		return ENG_FAIL(e, -ENOSPC,
				"load: %s holds %" PRIu64 " bytes, client_cap is %" PRIu64, p,
				o->client_len, o->client_cap);
	}
	return 0;
}

/* Through the reader, as every file of the checkpoint: in its directory, not a link. */
static int
read_client_bytes(struct zinf_engine *e, struct zinf_ckpt *c, const struct zinf_ckpt_opts *o)
{
	if (!o->client_out || !o->client_len) {
		return 0;
	}
	int k = ckpt_file_find(c, "client.bin");
	int ret = k < 0 ? -ENOENT
			: ckpt_read_file(c, (uint32_t)k, o->client_out, (size_t)o->client_len, 0);
	return ret ? ENG_FAIL(e, ret, "load: reading the client blob (client.bin)") : 0;
}

static int
load_ckpt(struct zinf_engine *e, const char *dir, const char *tag, struct zinf_ckpt_opts *opts)
{
	struct eng_view v;
	eng_view(e, &v);
	if (v.n_params == 0) {
		return ENG_FAIL(e, -EINVAL, "load: no parameter registered");
	}
	if (!dir) {
		return ENG_FAIL(e, -EINVAL, "load: NULL directory");
	}
	if (v.inited && v.in_window) {
		return ENG_FAIL(e, -EINVAL, "load: inside an accumulation window");
	}
	if (v.fetched_layer != INT32_MIN) { /* as the step: its gathered copy is the trainer's */
		return ENG_FAIL(e, -EINVAL, "load: layer %d is still fetched (release it first)",
				v.fetched_layer);
	}
	struct zinf_ckpt_opts o;
	zinf_ckpt_opts_init(&o);
	int ret = opts ? zc_opts_take(&o, sizeof(o), opts, "zinf_ckpt_opts") : 0;
	if (ret) {
		return ret;
	}
	(void)eng_job_finish(e); /* a background save of this engine: published before the state
				    changes */
	/* every check before anything is written; the ranks agree on them */
	struct zinf_ckpt *c = NULL;
	struct zinf_ckpt_info in = {.size = sizeof(in)};
	struct counters cnt = {0};
	char tagdir[CKPT_PATH] = "";
	ret = zinf_ckpt_open(dir, tag, &c);
	if (!ret) {
		ret = zinf_ckpt_get_info(c, &in);
	}
	if (!ret) {
		snprintf(tagdir, sizeof(tagdir), "%s", in.path);
		ret = check_match(e, &v, c, &in);
	}
	if (!ret) {
		ret = read_counters(e, &v, c, tagdir, &cnt);
	}
	for (uint32_t i = (uint32_t)v.rank; !ret && o.verify && i < zinf_ckpt_file_count(c);
	     i += (uint32_t)v.world) {
		ret = zinf_ckpt_verify_file(c, i);
	}
	if (!ret) {
		ret = size_client(e, c, tagdir, &o);
	}
	if (opts) {
		opts->client_len = o.client_len;
	}
	if ((ret = eng_agree(e, ret, "load: checking the checkpoint"))) {
		zinf_ckpt_close(c);
		return ret;
	}
	struct load_ctx x = {.e = e, .c = c};
	eng_commit(e); /* from here the state is being written: a failure fails the engine */
	ret = !v.inited ? eng_init_with(e, load_write, &x)
			: eng_rewrite_with(e, "load", load_write, &x);
	if (!ret) {
		ret = read_client_bytes(e, c, &o);
	}
	zinf_ckpt_close(c);
	if (!ret) {
		struct eng_counters ec = {
			.steps = cnt.steps,
			.micro_steps = cnt.micro_steps,
			.skipped = cnt.skipped,
			.lr = (float)cnt.lr,
			.beta1 = (float)cnt.beta1,
			.beta2 = (float)cnt.beta2,
			.ls = cnt.ls,
		};
		bool betas = cnt.beta1 >= 0 && cnt.beta1 < 1 && cnt.beta2 >= 0 && cnt.beta2 < 1;
		eng_counters_set(e, &ec, betas, cnt.has_ls);
	}
	int agreed = eng_agree(e, ret, "load");
	return ret ? ret : agreed; /* another rank's state is half loaded */
}

int
zinf_engine_load(struct zinf_engine *e, const char *dir, const char *tag,
		 struct zinf_ckpt_opts *opts)
{
	int ret = eng_begin(e, "load", ENG_KEEPS, false);
	return ret ? ret : eng_return(e, load_ckpt(e, dir, tag, opts));
}
