/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ckpt/ckpt_save.c: zinf_engine_save (zinf/checkpoint.h, docs/CHECKPOINT.md). It reads the
 * state through the engine's state visitor (eng_state_visit, engine/engine_module.h: a
 * sub-group's master and optimizer parts as host memory, wherever they live: the pinned CPU
 * tier in place, NVMe through one of the optimizer pool's buffers, the GPU in pieces through a
 * bounce buffer), as ckpt_load.c writes through it.
 *
 * A save: rank 0 takes DIR's lock and makes DIR/.TAG.tmp; every rank that stores files (all,
 * or rank 0 at stage 0 where the state is replicated) streams its flat partition of each part
 * into r<rank>.<part> through the I/O engine, fsyncs them and leaves a small sidecar with their
 * sizes, CRCs and its parameter offsets; rank 0 folds the sidecars into manifest.json, writes
 * client.bin and the optional model.safetensors, fsyncs, and publishes (ckpt_fs.c). Each phase
 * ends with eng_agree, so every rank returns the same result, and a failed save leaves the
 * engine and the previous checkpoints as they were. A background save is the engine's job
 * (engine_module.h): it publishes when the core finishes it, before the state changes. Through
 * engine_module.h only. Not here: load (ckpt_load.c).
 */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "common/opts.h"
#include "ckpt/ckpt_fs.h"
#include "engine/engine_module.h"
#include "zinf/config.h"

ZINF_OPTS_NO_TAIL_PAD(struct zinf_ckpt_opts, progress_ctx);

/* A save between zinf_engine_save and its publication: what the manifest records (taken when
 * the save was asked for), where it goes, and, in the background, the thread writing this
 * rank's files. */
struct ckpt_save {
	struct zinf_engine *e;
	struct eng_view v;
	char dir[CKPT_PATH], tmp[CKPT_PATH], tag[ZINF_CKPT_MAX_TAG + 1];
	int fw;
	bool gather;
	int lockfd;		 /* rank 0 */
	struct eng_counters cnt; /* when the save was asked for */
	void *client;		 /* a copy */
	uint64_t client_bytes;
	uint32_t client_crc;
	struct zinf_stream *stream; /* the GPU tier's copies (background: its own) */
	bool own_stream;
	pthread_t th;
	bool thread;
	int result;		 /* the rank-local writing's */
	struct ckpt_progress pr; /* the caller's progress hook and sv->tag */
};

void
zinf_ckpt_opts_init(struct zinf_ckpt_opts *o)
{
	if (!o) {
		return;
	}
	memset(o, 0, sizeof(*o));
	o->size = sizeof(*o);
	o->gather_16bit = -1;
	o->verify = true;
}

/* ---- this rank's files ---------------------------------------------------------------------- */

struct save_rank {
	const struct eng_view *v;
	struct ckpt_writer w[ZINF_OPTIM_MAX_PARTS];
	float *q8; /* q8 state or a bf16 master: a piece of a sub-group's part as f32 (q8_piece()
		      floats) */
};

/* Elements of q8 state decoded (or of a bf16 master widened) at once: ZINF_STEP_CHUNK (a
 * multiple of ZINF_Q8_BLOCK, so a sub-group's q8 array is cut at its blocks), or the longest
 * sub-group when shorter. */
static uint64_t
q8_piece(const struct eng_view *v)
{
	uint64_t m = 0;
	for (uint32_t k = 0; k < v->n_sg; k++) {
		m = ZINF_MAX(m, v->sg_end[k] - (k ? v->sg_end[k - 1] : 0));
	}
	return ZINF_MIN(m, (uint64_t)ZINF_STEP_CHUNK);
}

/* Whether part i is written as f32 whatever it is in memory: q8 state (decoded) and the master
 * (a bf16 master widened, exactly), so that a checkpoint's master and moments load into an
 * engine of either master dtype and either of fp32 and q8 moments. */
static bool
file_as_f32(const struct eng_view *v, uint32_t i)
{
	return i == 0 || zinf_optimizer_part_align(v->opt, i) > 1;
}

/* Bytes a part's element takes in the files. */
static uint32_t
file_elem_bytes(const struct eng_view *v, uint32_t i)
{
	return file_as_f32(v, i) ? 4 : zinf_optimizer_part_bytes(v->opt, i);
}

/* One visit: a whole sub-group on the tiers that hold q8 state (cpu, nvme), which is written
 * decoded (a load encodes it back, bit for bit at the same sub-groups: cpu_adam/README.md), one
 * piece of q8_piece() elements at a time (its blocks from the sub-group's start). */
static int
save_put(void *ctx, uint64_t off, uint64_t n, void *const parts[])
{
	struct save_rank *s = ctx;
	(void)off;
	int ret = 0;
	for (uint32_t i = 0; i < s->v->nparts && !ret; i++) {
		if (zinf_optimizer_part_align(s->v->opt, i) > 1) {
			uint64_t piece = q8_piece(s->v);
			for (uint64_t j = 0; j < n && !ret; j += piece) {
				uint64_t len = ZINF_MIN(n - j, piece);
				ret = zinf_q8_decode(
					(const uint8_t *)parts[i] + zinf_q8_bytes(j), len,
					i == 1 ? ZINF_Q8_EXP_AVG : ZINF_Q8_EXP_AVG_SQ, s->q8);
				ret = ret ? ret : ckpt_writer_put(&s->w[i], s->q8, len * 4);
			}
			continue;
		}
		if (i == 0 && zinf_optimizer_part_dtype(s->v->opt, 0) == ZINF_BF16) {
			uint64_t piece = q8_piece(s->v);
			for (uint64_t j = 0; j < n && !ret; j += piece) {
				uint64_t len = ZINF_MIN(n - j, piece);
				ret = zinf_dtype_convert(s->q8, ZINF_F32,
							 (const uint16_t *)parts[0] + j, ZINF_BF16,
							 len);
				ret = ret ? ret : ckpt_writer_put(&s->w[0], s->q8, len * 4);
			}
			continue;
		}
		ret = ckpt_writer_put(&s->w[i], parts[i],
				      n * zinf_optimizer_part_bytes(s->v->opt, i));
	}
	return ret;
}

static const char *
part_dtype(const struct eng_view *v, uint32_t i)
{
	return zinf_dtype_name(file_as_f32(v, i) ? ZINF_F32 : zinf_optimizer_part_dtype(v->opt, i));
}

/* The sidecar rank 0 folds into the manifest: this rank's flat size, parameter offsets, files. */
static int
write_sidecar(struct zinf_engine *e, const char *tmp, const struct save_rank *s)
{
	const struct eng_view *v = s->v;
	json_t *o = json_object(), *offs = json_array(), *files = json_array();
	json_object_set_new(o, "rank", json_integer(v->rank));
	json_object_set_new(o, "flat", json_integer((json_int_t)v->flat_n));
	for (uint32_t i = 0; i < v->n_params; i++) {
		struct eng_param p;
		eng_param_get(e, i, &p);
		json_array_append_new(offs, json_integer((json_int_t)p.flat_off));
	}
	for (uint32_t i = 0; i < v->nparts; i++) {
		json_t *f = json_object();
		const char *slash = strrchr(s->w[i].path, '/');
		json_object_set_new(f, "name", json_string(slash ? slash + 1 : s->w[i].path));
		json_object_set_new(f, "bytes", json_integer((json_int_t)s->w[i].bytes));
		json_object_set_new(f, "crc32c", json_integer(s->w[i].crc));
		json_array_append_new(files, f);
	}
	json_object_set_new(o, "flat_off", offs);
	json_object_set_new(o, "files", files);
	char *text = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	if (!text) {
		return ENG_FAIL(e, -ENOMEM, "save: out of memory for the sidecar");
	}
	char p[CKPT_PATH];
	ckpt_join(p, tmp, ".r%05d.json", v->rank);
	int ret = ckpt_write_small(p, text, strlen(text));
	free(text);
	return ret;
}

static int
save_rank_files(struct zinf_engine *e, const struct eng_view *v, struct zinf_io *io,
		const char *tmp, struct zinf_stream *cs)
{
	struct save_rank s = {.v = v};
	size_t bb = eng_state_bounce_bytes(e);
	void *bounce = bb ? zinf_alloc_huge(bb) : NULL;
	int ret = bb && !bounce ? ENG_FAIL(e, -ENOMEM, "save: out of memory (%zu bytes)", bb) : 0;
	if (!ret &&
	    (zinf_optimizer_state_format(v->opt) == ZINF_STATE_Q8 ||
	     zinf_optimizer_part_dtype(v->opt, 0) == ZINF_BF16) &&
	    !(s.q8 = zc_calloc(q8_piece(v), sizeof(float)))) {
		ret = ENG_FAIL(e, -ENOMEM,
			       "save: out of memory for q8 state or a bf16 master as f32 (%" PRIu64
			       " floats)",
			       q8_piece(v));
	}
	uint32_t opened = 0;
	for (uint32_t i = 0; i < v->nparts && !ret; i++, opened++) {
		char p[CKPT_PATH];
		ckpt_join(p, tmp, "r%05d.%s", v->rank, zinf_optimizer_part_name(v->opt, i));
		ret = ckpt_writer_open(&s.w[i], io, p);
	}
	for (uint32_t k = 0; k < v->n_sg && !ret; k++) {
		ret = eng_state_visit(e, k, false, save_put, &s, bounce, cs);
		if (ret) {
			ret = ENG_FAIL(e, ret, "save: sub-group %u", k);
		}
	}
	for (uint32_t i = 0; i < opened && !ret; i++) {
		ret = ckpt_writer_finish(&s.w[i]);
	}
	if (!ret) {
		ret = write_sidecar(e, tmp, &s);
	}
	for (uint32_t i = 0; i < opened; i++) {
		ckpt_writer_close(&s.w[i]);
	}
	zc_free(s.q8);
	zinf_free_huge(bounce, bb);
	return ret;
}

/* ---- the manifest (rank 0) ------------------------------------------------------------------ */

static json_t *
scaler_json(const struct zinf_loss_scaler *ls)
{
	json_t *o = json_object();
	int64_t good = ls->last_overflow >= 0 ? ls->iter - ls->last_overflow - 1 : ls->iter;
	json_object_set_new(o, "scale", json_real(ls->scale));
	json_object_set_new(o, "good_steps", json_integer(good > 0 ? good : 0));
	json_object_set_new(o, "hysteresis_left", json_integer(ls->cur_hysteresis));
	json_object_set_new(o, "overflows", json_integer((json_int_t)ls->overflows));
	json_object_set_new(o, "iter", json_integer(ls->iter));
	json_object_set_new(o, "last_overflow", json_integer(ls->last_overflow));
	return o;
}

static json_t *
optimizer_json(const struct eng_view *v)
{
	const struct zinf_optimizer_opts *o = &v->o->optimizer;
	json_t *j = json_object();
	json_object_set_new(j, "kind", json_string(zinf_optimizer_name(v->opt)));
	json_object_set_new(j, "state_dtype", json_string(part_dtype(v, v->nparts - 1)));
	json_object_set_new(j, "lr", json_real(o->lr));
	json_object_set_new(j, "beta1", json_real(o->beta1));
	json_object_set_new(j, "beta2", json_real(o->beta2));
	json_object_set_new(j, "eps", json_real(o->eps));
	json_object_set_new(j, "weight_decay", json_real(o->weight_decay));
	json_object_set_new(j, "bias_correction", json_boolean(o->bias_correction));
	return j;
}

/* The engine's options as ds_config.json (zinf_config_dump); NULL when it cannot be made. */
static json_t *
options_json(const struct eng_view *v)
{
	const struct zinf_engine_opts *eo = v->o;
	struct zinf_train_config c;
	zinf_config_init(&c);
	c.engine = *eo; /* read only: the dump does not free the borrowed strings */
	c.optimizer_given = true;
	c.gradient_clipping = eo->gradient_clipping;
	c.fp16 = eo->fp16;
	c.bf16_enabled = eo->dtype == ZINF_BF16;
	c.stage3_gather_16bit_weights_on_model_save = eo->stage3_gather_16bit_weights_on_model_save;
	c.train_batch_size = eo->gradient_accumulation_steps * (int64_t)v->world;
	c.world_size = v->world;
	char *text = NULL;
	json_t *j = NULL;
	if (zinf_config_dump(&c, &text) == 0 && text) {
		j = json_loads(text, 0, NULL);
	}
	free(text);
	return j;
}

static json_t *
params_json(const struct zinf_engine *e, const struct eng_view *v, json_t *const side[], int fw)
{
	json_t *a = json_array();
	for (uint32_t i = 0; i < v->n_params; i++) {
		struct eng_param p;
		eng_param_get(e, i, &p);
		json_t *o = json_object(), *shape = json_array(), *offs = json_array();
		json_object_set_new(o, "name", json_string(p.name));
		json_object_set_new(o, "numel", json_integer((json_int_t)p.numel));
		json_object_set_new(o, "layer", json_integer(p.layer));
		for (uint32_t d = 0; d < p.ndim; d++) {
			json_array_append_new(shape, json_integer((json_int_t)p.shape[d]));
		}
		json_object_set_new(o, "shape", shape);
		json_object_set_new(o, "part", json_integer((json_int_t)p.part.part));
		for (int r = 0; r < fw; r++) {
			json_t *f = json_array_get(json_object_get(side[r], "flat_off"), i);
			json_array_append_new(offs, f ? json_incref(f) : json_integer(-1));
		}
		json_object_set_new(o, "flat_off", offs);
		if (p.no_decay) { /* for readers: a load takes the loading engine's flags */
			json_object_set_new(o, "no_decay", json_true());
		}
		json_array_append_new(a, o);
	}
	return a;
}

static void
now_iso(char *buf, size_t n)
{
	time_t t = time(NULL);
	struct tm tm;
	gmtime_r(&t, &tm);
	strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

/* A file of the checkpoint other than the ranks' (client.bin, model.safetensors). */
struct extra_file {
	const char *name;
	uint64_t bytes;
	uint32_t crc;
};

static int
write_manifest(struct zinf_engine *e, const struct ckpt_save *sv, const char *tmp, const char *tag,
	       int fw, const struct extra_file *client, const struct extra_file *st)
{
	json_t *side[fw];
	memset(side, 0, sizeof(side));
	int ret = 0;
	for (int r = 0; r < fw && !ret; r++) {
		char p[CKPT_PATH];
		json_error_t jerr;
		ckpt_join(p, tmp, ".r%05d.json", r);
		side[r] = json_load_file(p, 0, &jerr);
		if (!side[r]) {
			ret = ENG_FAIL(e, -EIO, "save: reading rank %d's sidecar %s: %s", r, p,
				       jerr.text);
		}
	}
	json_t *m = NULL;
	if (!ret) {
		char when[32];
		now_iso(when, sizeof(when));
		m = json_object();
		json_object_set_new(m, "format", json_string("zinf-checkpoint"));
		json_object_set_new(m, "version", json_integer(ZINF_CKPT_VERSION));
		json_object_set_new(m, "tag", json_string(tag));
		json_object_set_new(m, "created", json_string(when));
		const struct eng_view *v = &sv->v;
		json_object_set_new(m, "world", json_integer(v->world));
		json_object_set_new(m, "files_world", json_integer(fw));
		json_object_set_new(m, "stage", json_integer(v->o->stage));
		json_object_set_new(m, "dtype", json_string(zinf_dtype_name(v->o->dtype)));
		json_object_set_new(m, "steps", json_integer(sv->cnt.steps));
		json_object_set_new(m, "micro_steps",
				    json_integer((json_int_t)sv->cnt.micro_steps));
		json_object_set_new(m, "skipped_steps", json_integer((json_int_t)sv->cnt.skipped));
		json_object_set_new(m, "lr", json_real(sv->cnt.lr));
		json_t *betas = json_array(); /* zinf_engine_set_betas's (OneCycle's momentum) */
		json_array_append_new(betas, json_real(sv->cnt.beta1));
		json_array_append_new(betas, json_real(sv->cnt.beta2));
		json_object_set_new(m, "betas", betas);
		json_object_set_new(m, "loss_scaler", scaler_json(&sv->cnt.ls));
		json_object_set_new(m, "optimizer", optimizer_json(v));
		json_t *parts = json_array();
		for (uint32_t i = 0; i < v->nparts; i++) {
			json_t *o = json_object();
			json_object_set_new(o, "name",
					    json_string(zinf_optimizer_part_name(v->opt, i)));
			json_object_set_new(o, "dtype", json_string(part_dtype(v, i)));
			json_array_append_new(parts, o);
		}
		json_object_set_new(m, "parts", parts);
		json_t *opts = options_json(v);
		if (opts) {
			json_object_set_new(m, "options", opts);
		}
		json_object_set_new(m, "params", params_json(e, v, side, fw));
		json_t *ranks = json_array(), *files = json_array();
		for (int r = 0; r < fw; r++) {
			json_t *o = json_object();
			json_object_set_new(o, "rank", json_integer(r));
			json_object_set(o, "flat", json_object_get(side[r], "flat"));
			json_array_append_new(ranks, o);
			json_array_extend(files, json_object_get(side[r], "files"));
		}
		const struct extra_file *ex[2] = {client, st};
		for (int x = 0; x < 2; x++) {
			if (!ex[x]) {
				continue;
			}
			json_t *f = json_object();
			json_object_set_new(f, "name", json_string(ex[x]->name));
			json_object_set_new(f, "bytes", json_integer((json_int_t)ex[x]->bytes));
			json_object_set_new(f, "crc32c", json_integer(ex[x]->crc));
			json_array_append_new(files, f);
		}
		if (st) {
			json_object_set_new(m, "safetensors", json_string(st->name));
		}
		json_object_set_new(m, "ranks", ranks);
		json_object_set_new(m, "files", files);
		json_object_set_new(m, "client_bytes",
				    json_integer(client ? (json_int_t)client->bytes : 0));
	}
	for (int r = 0; r < fw; r++) {
		json_decref(side[r]);
	}
	if (ret) {
		return ret;
	}
	char *text = json_dumps(m, JSON_INDENT(1) | JSON_REAL_PRECISION(17));
	json_decref(m);
	if (!text) {
		return ENG_FAIL(e, -ENOMEM, "save: out of memory for the manifest");
	}
	char p[CKPT_PATH], crc[16];
	ckpt_join(p, tmp, "manifest.json");
	ret = ckpt_write_small(p, text, strlen(text));
	/* the manifest's own checksum beside it (it cannot list itself) */
	int n = snprintf(crc, sizeof(crc), "%08x\n", zinf_crc32c(0, text, strlen(text)));
	free(text);
	if (!ret) {
		ckpt_join(p, tmp, "manifest.crc32c");
		ret = ckpt_write_small(p, crc, (size_t)n);
	}
	return ret;
}

/* CRC32C and size of a whole file, read in bounded pieces. */
static int
file_crc(const char *path, uint64_t *bytes, uint32_t *crc)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		return ZINF_FAIL(-errno, "checkpoint: opening %s: %s", path, zinf_strerror(-errno));
	}
	enum { B = 1 << 20 };
	char *buf = zc_malloc(B);
	size_t n;
	*bytes = 0;
	*crc = 0;
	while (buf && (n = fread(buf, 1, B, f)) > 0) {
		*crc = zinf_crc32c(*crc, buf, n);
		*bytes += n;
	}
	int ret = !buf ? -ENOMEM : ferror(f) ? -EIO : 0;
	zc_free(buf);
	fclose(f);
	return ret ? ZINF_FAIL(ret, "checkpoint: reading %s back", path) : 0;
}

/* Rank 0: the manifest, the consolidated weights (which the export reads from the manifest
 * and the rank files just written), the manifest again listing them. */
static int
finish_rank0(struct zinf_engine *e, const struct ckpt_save *sv, const char *tmp, const char *tag,
	     int fw, const struct extra_file *client, bool gather)
{
	int ret = write_manifest(e, sv, tmp, tag, fw, client, NULL);
	if (ret || !gather) {
		return ret;
	}
	struct zinf_ckpt *c = NULL;
	char out[CKPT_PATH];
	ckpt_join(out, tmp, "model.safetensors");
	enum zinf_dtype dt = sv->v.o->dtype;
	struct extra_file st = {"model.safetensors", 0, 0};
	if ((ret = zinf_ckpt_open(tmp, NULL, &c)) == 0) {
		ret = zinf_ckpt_export(c, out, dt, 0);
		zinf_ckpt_close(c);
	}
	if (!ret) {
		ret = file_crc(out, &st.bytes, &st.crc);
	}
	if (!ret) {
		ret = write_manifest(e, sv, tmp, tag, fw, client, &st);
	}
	return ret ? ENG_FAIL(e, ret, "save: the consolidated 16-bit weights") : 0;
}

static int
prepare_rank0(struct zinf_engine *e, const char *dir, const char *tmp, int *lockfd)
{
	if (mkdir(dir, 0755) == 0) {
		int err = ckpt_fsync_parent(dir); /* the new DIR's entry, durable */
		if (err) {
			return ENG_FAIL(e, err, "save: syncing the directory holding %s", dir);
		}
	} else if (errno != EEXIST) {
		int err = -errno;
		return ENG_FAIL(e, err, "save: creating %s: %s", dir, zinf_strerror(err));
	}
	int ret = ckpt_lock(dir, lockfd);
	if (!ret) {
		ret = ckpt_clean_tmp(dir); /* what saves that died before publishing left */
	}
	if (!ret && mkdir(tmp, 0755) != 0) {
		ret = ENG_FAIL(e, -errno, "save: creating %s: %s", tmp, zinf_strerror(-errno));
	}
	return ret;
}

/* DIR holds every stored rank's files: fw x this rank's state (every rank's flat partition has
 * the same length: each tensor's partition is ceil(numel / W) on every rank), the optional
 * consolidated 16-bit weights, and a margin for the manifest and the blob. Rank 0, before
 * anything is written; the files a previous save of the same tag holds are not counted free. */
static int
check_space(struct zinf_engine *e, const struct eng_view *v, const char *dir, int fw, bool gather,
	    uint64_t client)
{
	struct statvfs sv;
	uint64_t mine = 0;
	for (uint32_t i = 0; i < v->nparts; i++) {
		mine += v->flat_n * file_elem_bytes(v, i);
	}
	uint64_t need = (uint64_t)fw * mine + client + (64u << 20);
	if (gather) {
		need += v->flat_n * (uint64_t)v->W * zinf_dtype_size(v->o->dtype);
	}
	if (statvfs(dir, &sv) != 0) {
		return ENG_FAIL(e, -errno, "save: statvfs %s: %s", dir, zinf_strerror(-errno));
	}
	uint64_t have = (uint64_t)sv.f_bavail * sv.f_frsize;
	if (have < need) {
		return ENG_FAIL(e, -ENOSPC,
				"save: %s has %" PRIu64 " bytes free, the checkpoint needs %" PRIu64
				" (%d rank%s x %" PRIu64 " bytes of state%s)",
				dir, have, need, fw, fw > 1 ? "s" : "", mine,
				gather ? ", the 16-bit weights" : "");
	}
	return 0;
}

/* This rank's files (and rank 0's client.bin): the part of a save that needs no other rank. */
static int
save_write(struct zinf_engine *e, struct ckpt_save *sv)
{
	int ret = 0;
	if (sv->v.rank < sv->fw) {
		struct zinf_io *io = sv->v.io;
		if (!io) {
			struct zinf_io_opts io_o;
			zinf_io_opts_init(&io_o);
			ret = zinf_io_create(&io_o, &io);
		}
		if (!ret) {
			ret = save_rank_files(e, &sv->v, io, sv->tmp, sv->stream);
		}
		if (io != sv->v.io) {
			zinf_io_destroy(io);
		}
	}
	if (!ret && sv->v.rank == 0 && sv->client_bytes) {
		char p[CKPT_PATH];
		ckpt_join(p, sv->tmp, "client.bin");
		ret = ckpt_write_small(p, sv->client, sv->client_bytes);
	}
	return ret;
}

static void *
save_thread(void *arg)
{
	struct ckpt_save *sv = arg;
	sv->result = save_write(sv->e, sv);
	return NULL;
}

static void
save_free(struct ckpt_save *sv, int ret)
{
	if (sv->v.rank == 0) {
		if (ret && sv->lockfd >= 0) {
			(void)ckpt_rm_dir(sv->tmp);
		}
		ckpt_unlock(sv->lockfd);
	}
	if (sv->own_stream) {
		zinf_stream_destroy(sv->stream);
	}
	zc_free(sv->client);
	zc_free(sv);
}

/* After every rank wrote its files: rank 0 writes the manifest and publishes; every rank returns
 * the same result. Frees sv. */
static int
save_publish(struct zinf_engine *e, struct ckpt_save *sv, int ret)
{
	if (!(ret = eng_agree(e, ret, "save: writing the state"))) {
		ckpt_point(&sv->pr, "files");
		if (sv->v.rank == 0) {
			struct extra_file client = {"client.bin", sv->client_bytes, sv->client_crc};
			ret = finish_rank0(e, sv, sv->tmp, sv->tag, sv->fw,
					   sv->client_bytes ? &client : NULL, sv->gather);
			for (int r = 0; r < sv->fw && !ret; r++) {
				char p[CKPT_PATH];
				ckpt_join(p, sv->tmp, ".r%05d.json", r);
				if (unlink(p) != 0) {
					ret = ENG_FAIL(e, -errno, "save: removing %s", p);
				}
			}
			if (!ret) {
				ckpt_point(&sv->pr, "manifest");
				ret = ckpt_publish(sv->dir, sv->tmp, &sv->pr);
			}
		}
		ret = eng_agree(e, ret, "save: publishing");
	}
	save_free(sv, ret);
	return ret;
}

/* The engine's background job (engine_module.h): published by the collective call the core
 * finishes it in, on every rank at the same place. */
static int
bg_finish(struct zinf_engine *e, void *ctx)
{
	struct ckpt_save *sv = ctx;
	if (sv->thread) {
		pthread_join(sv->th, NULL);
	}
	return save_publish(e, sv, sv->result);
}

static void
bg_abandon(struct zinf_engine *e, void *ctx)
{
	struct ckpt_save *sv = ctx;
	(void)e;
	if (sv->thread) {
		pthread_join(sv->th, NULL);
	}
	save_free(sv, -ECANCELED);
}

static const struct eng_job_ops bg_ops = {.finish = bg_finish, .abandon = bg_abandon};

static int
save_wait_call(struct zinf_engine *e)
{
	return eng_job_pending(e) ? eng_job_finish(e) : eng_job_take_result(e);
}

int
zinf_engine_save_wait(struct zinf_engine *e)
{
	int ret = eng_begin(e, "save_wait", ENG_KEEPS, true);
	return ret ? ret : eng_return(e, save_wait_call(e));
}

static int
save_args(struct zinf_engine *e, const struct eng_view *v, const char *dir, const char *tag,
	  const struct zinf_ckpt_opts *o)
{
	if (!dir || !dir[0] || strlen(dir) > CKPT_PATH - ZINF_CKPT_MAX_TAG - 64) {
		return ENG_FAIL(e, -EINVAL, "save: %s",
				dir ? "directory path too long or empty" : "NULL directory");
	}
	if (!ckpt_tag_ok(tag)) {
		return ENG_FAIL(e, -EINVAL,
				"save: tag \"%s\": use 1-%d letters, digits, '.', '_' or '-', not "
				"starting with '.', and not \"latest\"",
				tag, ZINF_CKPT_MAX_TAG);
	}
	if (v->in_window) {
		return ENG_FAIL(e, -EINVAL,
				"save: inside an accumulation window (micro-batch %u of %u): save "
				"after the step",
				v->micro + 1, v->o->gradient_accumulation_steps);
	}
	if (o->reserved[0] || o->reserved[1]) {
		return ENG_FAIL(e, -EINVAL, "save: reserved option bytes are not zero");
	}
	return 0;
}

static int
save_call(struct zinf_engine *e, const char *dir, const char *tag,
	  const struct zinf_ckpt_opts *opts)
{
	int ret = 0;
	struct zinf_ckpt_opts o;
	zinf_ckpt_opts_init(&o);
	if (opts && (ret = zc_opts_take(&o, sizeof(o), opts, "zinf_ckpt_opts"))) {
		return ret;
	}
	struct eng_view v;
	struct eng_counters cnt;
	eng_view(e, &v);
	eng_counters_get(e, &cnt);
	char tagbuf[32];
	if (!tag) {
		snprintf(tagbuf, sizeof(tagbuf), "step%" PRId64, cnt.steps);
		tag = tagbuf;
	}
	if ((ret = save_args(e, &v, dir, tag, &o))) {
		return ret;
	}
	/* a background save still in flight is published first (its directory lock is ours) */
	(void)eng_job_finish(e);
	struct ckpt_save *sv = zc_calloc(1, sizeof(*sv));
	bool blob = v.rank == 0 && o.client_bytes && o.client; /* rank 0's alone */
	if (!sv || (blob && !(sv->client = zc_malloc(o.client_bytes)))) {
		zc_free(sv);
		return ENG_FAIL(e, -ENOMEM, "save: out of memory");
	}
	snprintf(sv->dir, sizeof(sv->dir), "%s", dir);
	snprintf(sv->tag, sizeof(sv->tag), "%s", tag);
	sv->pr = (struct ckpt_progress){o.progress, o.progress_ctx, sv->tag};
	ckpt_join(sv->tmp, dir, ".%s.tmp", tag);
	sv->e = e;
	sv->v = v;
	sv->cnt = cnt;
	sv->fw = v.o->stage == 0 ? 1 : v.world;
	sv->gather = o.gather_16bit < 0 ? v.o->stage3_gather_16bit_weights_on_model_save
					: o.gather_16bit != 0;
	sv->lockfd = -1;
	sv->stream = v.cs;
	if (v.rank == 0 && o.client_bytes && !o.client) { /* the blob is rank 0's alone */
		ret = ENG_FAIL(e, -EINVAL, "save: client_bytes %" PRIu64 " with a NULL client",
			       o.client_bytes);
	} else if (v.rank == 0 && o.client_bytes) {
		memcpy(sv->client, o.client, o.client_bytes);
		sv->client_bytes = o.client_bytes;
		sv->client_crc = zinf_crc32c(0, o.client, o.client_bytes);
	}
	if (v.rank == 0 && !ret) {
		ret = prepare_rank0(e, dir, sv->tmp, &sv->lockfd);
	}
	if (v.rank == 0 && !ret) {
		ret = check_space(e, &v, dir, sv->fw, sv->gather, sv->client_bytes);
	}
	if (!ret && o.background && v.state_on_device) {
		/* the GPU tier's copies on a stream of their own: cs goes on with the training */
		ret = zinf_stream_create(v.dev, "zinf-save", &sv->stream);
		sv->own_stream = ret == 0;
		/* after what cs has queued: the step's Adam kernels may still be writing the
		   state the save copies (zinf_engine_step returns without waiting for them) */
		ret = ret ? ret : eng_order(e, v.cs, sv->stream);
	}
	if ((ret = eng_agree(e, ret, "save: preparing the directory"))) {
		save_free(sv, ret);
		return ret;
	}
	if (o.background) {
		/* published when the engine finishes its job (bg_finish), on every rank at the
		   same place; without a thread the files are written now instead */
		eng_job_start(e, &bg_ops, sv);
		sv->thread = pthread_create(&sv->th, NULL, save_thread, sv) == 0;
		if (!sv->thread) {
			ENG_WARN(e, "save: no thread for a background save: writing it now");
			sv->result = save_write(e, sv);
		}
		return 0;
	}
	return save_publish(e, sv, save_write(e, sv));
}

int
zinf_engine_save(struct zinf_engine *e, const char *dir, const char *tag,
		 const struct zinf_ckpt_opts *opts)
{
	int ret = eng_begin(e, "save", ENG_KEEPS, true);
	return ret ? ret : eng_return(e, save_call(e, dir, tag, opts));
}
