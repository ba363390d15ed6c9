/* SPDX-License-Identifier: Apache-2.0 */
/*
 * config/config.c: reading ds_config.json (zinf/config.h): DeepSpeed's defaults, the file or
 * string read through jansson, the walk (config_parse.c), then what spans several keys: the
 * batch keys derived and checked as DeepSpeed's config.py does, fp16 against bf16, offload
 * against the stage, nvme without nvme_path, the schedule's required parameters. Not here:
 * the per-key checks (config_parse.c), the text scans (config_text.c), the dump
 * (config_dump.c).
 */
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/opts.h"
#include "config/config_internal.h"

ZINF_OPTS_NO_TAIL_PAD(struct zinf_config_inputs, max_grad_norm);

void
zinf_config_inputs_init(struct zinf_config_inputs *in)
{
	if (!in) {
		return;
	}
	memset(in, 0, sizeof(*in));
	in->size = sizeof(*in);
	in->world_size = 1;
	in->fp16 = in->bf16 = -1;
	in->total_num_steps = in->warmup_num_steps = -1;
	in->lr = in->beta1 = in->beta2 = in->eps = in->weight_decay = in->max_grad_norm = NAN;
}

/* The engine options as DeepSpeed's defaults and zinf/engine.h's for the rest (fp32 training:
   DeepSpeed trains in fp32 unless fp16 or bf16 is enabled). */
static void
engine_defaults(struct zinf_engine_opts *e)
{
	zinf_engine_opts_init(e);
	e->dtype = ZINF_F32; /* DeepSpeed trains fp32 unless fp16 or bf16 is enabled */
}

void
zinf_config_init(struct zinf_train_config *c)
{
	if (!c) {
		return;
	}
	memset(c, 0, sizeof(*c));
	c->size = sizeof(*c);
	engine_defaults(&c->engine);
	c->train_batch_size = 1;
	c->train_micro_batch_size_per_gpu = 1;
	c->world_size = 1;
	c->steps_per_print = 10;
	c->gradient_predivide_factor = 1.0;
	c->reduce_scatter = true;
	c->allgather_partitions = true;
	c->load_from_fp32_weights = true;
	c->ignore_unused_parameters = true;
	zinf_fp16_opts_init(&c->fp16);
	zinf_schedule_opts_init(&c->scheduler, ZINF_SCHED_NONE, c->engine.optimizer.lr);
}

static void
free_paths(struct zinf_offload_opts *o)
{
	for (uint32_t i = 0; i < o->n_paths && i < ZINF_ENGINE_MAX_PATHS; i++) {
		zc_free((char *)o->nvme_path[i]);
		o->nvme_path[i] = NULL;
	}
	o->n_paths = 0;
}

void
zinf_config_fini(struct zinf_train_config *c)
{
	if (!c) {
		return;
	}
	free_paths(&c->engine.offload_param);
	free_paths(&c->engine.offload_optimizer);
	zinf_config_init(c);
}

/* *out = a x b x c; false when it does not fit a long long */
static bool
batch_product(long long a, long long b, long long c, long long *out)
{
	return !__builtin_mul_overflow(a, b, out) && !__builtin_mul_overflow(*out, c, out);
}

/* DeepSpeed's _set_batch_related_parameters and _batch_assertion; a product past 2^63 - 1 is
   an error, never a wrapped batch size. */
static void
check_batch(struct cfg_ctx *x)
{
	struct zinf_train_config *c = x->c;
	bool t = x->given & (1u << A_TRAIN_BATCH), m = x->given & (1u << A_MICRO),
	     g = x->given & (1u << A_GAS);
	long long tb = c->train_batch_size, mb = c->train_micro_batch_size_per_gpu;
	long long gas = c->engine.gradient_accumulation_steps, w = c->world_size;
	char how[160] = "";
	if (w == 0) {
		/* the world size is not known: the three keys fix it, or nothing more is checked */
		if (x->unresolved & (1u << A_TRAIN_BATCH)) {
			return; /* listed already */
		}
		if (!(t && m && g)) {
			/* the key not given is the one the world size derives (listed under its
			   own name; the keys the file gave keep their values) */
			const char *derived = !t   ? "train_batch_size"
					      : !g ? "gradient_accumulation_steps"
						   : "train_micro_batch_size_per_gpu";
			if (!(x->in->flags & ZINF_CONFIG_UNRESOLVED_OK)) {
				CERR(x, derived,
				     "not given: DeepSpeed derives it from the world size, which "
				     "was "
				     "not given either (train_batch_size = "
				     "train_micro_batch_size_per_gpu x gradient_accumulation_steps "
				     "x "
				     "world size)");
				return;
			}
			cfg_unresolved(x, derived, ZINF_CONFIG_IN_WORLD_SIZE, A_TRAIN_BATCH);
			return;
		}
		long long mg = 0;
		if (mb < 1 || gas < 1 || !batch_product(mb, gas, 1, &mg) || tb % mg != 0 ||
		    tb / mg > INT32_MAX) {
			CERR(x, "train_batch_size",
			     "train_batch_size %lld is not train_micro_batch_size_per_gpu %lld x "
			     "gradient_accumulation_steps %lld x any world size",
			     tb, mb, gas);
			return;
		}
		c->world_size = (int32_t)(tb / mg);
		c->world_derived = true;
		ZINF_INFO("%s: world size %d: train_batch_size %lld / (%lld x %lld)", x->name,
			  c->world_size, tb, mb, gas);
		return;
	}
	if (t && m && !g) {
		gas = tb / mb / w;
		snprintf(how, sizeof(how),
			 "; gradient_accumulation_steps derived as %lld / %lld / %lld = %lld", tb,
			 mb, w, gas);
	} else if (t && g && !m) {
		mb = tb / w / gas;
		snprintf(how, sizeof(how),
			 "; train_micro_batch_size_per_gpu derived as %lld / %lld / %lld = %lld",
			 tb, w, gas, mb);
	} else if (m && g && !t) {
		tb = -1; /* set below */
	} else if (t && !m && !g) {
		gas = 1;
		mb = tb / w;
		snprintf(how, sizeof(how),
			 "; train_micro_batch_size_per_gpu derived as %lld / %lld = %lld", tb, w,
			 mb);
	} else if (m && !t && !g) {
		gas = 1;
		tb = -1; /* set below */
	} else if (!t && !m) {
		CERR(x, "train_batch_size",
		     "neither train_batch_size nor train_micro_batch_size_per_gpu is given "
		     "(DeepSpeed needs at least one)");
		return;
	}
	long long prod = 0; /* 0 when mb or gas is 0 */
	if (mb >= 1 && gas >= 1 && !batch_product(mb, gas, w, &prod)) {
		CERR(x, t ? "train_batch_size" : "train_micro_batch_size_per_gpu",
		     "train_micro_batch_size_per_gpu %lld x gradient_accumulation_steps %lld x "
		     "world size %lld is past %lld%s",
		     mb, gas, w, LLONG_MAX, how);
		return;
	}
	if (!t) {
		tb = prod;
	}
	if (mb < 1 || gas < 1 || gas > UINT32_MAX || tb != prod) {
		CERR(x, t ? "train_batch_size" : "train_micro_batch_size_per_gpu",
		     "train_batch_size %lld != train_micro_batch_size_per_gpu %lld x "
		     "gradient_accumulation_steps %lld x world size %lld (= %lld)%s",
		     tb, mb, gas, w, prod, how);
		return;
	}
	c->train_batch_size = tb;
	c->train_micro_batch_size_per_gpu = mb;
	c->engine.gradient_accumulation_steps = (uint32_t)gas;
}

static const char *const dev_names[] = {"none", "cpu", "nvme"};

static void
check_offload(struct cfg_ctx *x, struct zinf_offload_opts *o, const char *path, bool param)
{
	char p[128];
	int stage = x->c->engine.stage;
	if (o->device != ZINF_OFFLOAD_NONE && param && stage < 3) {
		snprintf(p, sizeof(p), "%s.device", path);
		CERR(x, p,
		     "parameter offload (device \"%s\") needs zero_optimization.stage 3; the stage "
		     "is %d",
		     dev_names[o->device], stage);
	}
	if (o->device != ZINF_OFFLOAD_NONE && !param && stage == 0) {
		snprintf(p, sizeof(p), "%s.device", path);
		CERR(x, p,
		     "optimizer offload (device \"%s\") needs zero_optimization.stage 1, 2 or 3; "
		     "the stage is 0",
		     dev_names[o->device]);
	}
	if (o->device == ZINF_OFFLOAD_NVME && o->n_paths == 0) {
		snprintf(p, sizeof(p), "%s.nvme_path", path);
		CERR(x, p,
		     "device is \"nvme\" but nvme_path is not given: name the directory (or a list "
		     "of directories) on the NVMe drive(s) for the swap files");
	}
	if (o->device != ZINF_OFFLOAD_NVME) {
		free_paths(o); /* DeepSpeed ignores nvme_path then */
	}
	if (o->ratio != 1.0) {
		snprintf(p, sizeof(p), "%s.ratio", path);
		CERR(x, p, "%g: zinf offloads all of the optimizer state (only 1.0 is supported)",
		     o->ratio);
	}
}

static void
check_schedule(struct cfg_ctx *x)
{
	struct zinf_schedule_opts *s = &x->c->scheduler;
	s->base_lr = x->c->engine.optimizer.lr;
	if (!x->c->scheduler_given) {
		return;
	}
	const char *name = zinf_schedule_name(s->type);
	if (s->type == ZINF_SCHED_WARMUP_LR && !(x->given & (1u << A_WARMUP_MAX_LR))) {
		s->warmup_max_lr = s->base_lr; /* DeepSpeed: the optimizer's lr */
	}
	bool total = x->given & (1u << A_TOTAL_STEPS);
	if ((s->type == ZINF_SCHED_WARMUP_DECAY || s->type == ZINF_SCHED_WARMUP_COSINE) && !total &&
	    !(x->unresolved & (1u << A_TOTAL_STEPS))) {
		CERR(x, "scheduler.params.total_num_steps", "required by %s (no default)", name);
	}
	int64_t warm = s->warmup_num_steps < 2 ? 2 : s->warmup_num_steps;
	if (s->type == ZINF_SCHED_WARMUP_COSINE && total && s->total_num_steps <= warm) {
		CERR(x, "scheduler.params.total_num_steps",
		     "%lld must be greater than warmup_num_steps %lld for WarmupCosineLR (the "
		     "cosine "
		     "phase would have no steps)",
		     (long long)s->total_num_steps, (long long)warm);
	}
	if (s->type == ZINF_SCHED_WARMUP_DECAY && total && s->total_num_steps < warm) {
		CWARN(x, "scheduler.params.total_num_steps",
		      "%lld is less than warmup_num_steps %lld", (long long)s->total_num_steps,
		      (long long)warm);
	}
	json_t *params = json_object_get(json_object_get(x->root, "scheduler"), "params");
	if (s->type == ZINF_SCHED_ONE_CYCLE) {
		static const char *const req[] = {"cycle_min_lr", "cycle_max_lr"};
		for (int i = 0; i < 2; i++) {
			char p[64];
			snprintf(p, sizeof(p), "scheduler.params.%s", req[i]);
			if (!json_object_get(params, req[i])) {
				CERR(x, p, "required by OneCycle (no default)");
			}
		}
	}
}

/*
 * What DeepSpeed's bf16.<key> and zinf's optimizer.params.<zkey> for the same thing share: bf16
 * training (else `instead`, zkey "bf16", is the way), Adam or AdamW (`adam_why` says why), and
 * zkey absent or "bf16" (else choose `one`). Each failure an error naming key; false when one
 * failed.
 */
static bool
bf16_key_ok(struct cfg_ctx *x, const char *key, const char *zkey, const char *instead,
	    const char *adam_why, const char *one)
{
	const struct zinf_engine_opts *e = &x->c->engine;
	json_t *opt = json_object_get(x->root, "optimizer");
	json_t *given = json_object_get(json_object_get(opt, "params"), zkey);
	const char *type = json_string_value(json_object_get(opt, "type"));
	bool ok = true;
	if (!x->c->bf16_enabled) {
		CERR(x, key,
		     "true without bf16.enabled: DeepSpeed takes it with bf16 training only %s",
		     instead);
		ok = false;
	}
	if (e->optimizer.kind != ZINF_OPTIM_ADAM && e->optimizer.kind != ZINF_OPTIM_ADAMW) {
		CERR(x, key, "true with optimizer %s: %s", type ? type : "(not Adam/AdamW)",
		     adam_why);
		ok = false;
	}
	const char *g = json_string_value(given);
	if (given && (!g || strcmp(g, "bf16") != 0)) {
		char b[64];
		CERR(x, key, "true with optimizer.params.%s %s: choose one %s", zkey,
		     cfg_describe(given, b, sizeof(b)), one);
		ok = false;
	}
	return ok;
}

/*
 * bf16.bf16_optimizer_states: true. DeepSpeed takes it (Adam's moments in bf16) only with bf16
 * training, ZeRO stage 1-3 and bf16.bf16_master_weights_and_grads true (which makes zinf's master
 * bf16 too: check_bf16_master); zinf accepts the key where DeepSpeed does and the moments mean
 * the same: Adam or AdamW, and no other format asked for in
 * optimizer.params.zinf_optimizer_states (zinf's key for bf16 moments anywhere else, named in
 * each refusal). Every refusal names the key.
 */
static void
check_bf16_states(struct cfg_ctx *x)
{
	static const char *const key = "bf16.bf16_optimizer_states";
	static const char *const instead =
		"(optimizer.params.zinf_optimizer_states \"bf16\" keeps Adam's moments in bf16 "
		"without it)";
	struct zinf_engine_opts *e = &x->c->engine;
	json_t *master =
		json_object_get(json_object_get(x->root, "bf16"), "bf16_master_weights_and_grads");
	bool ok = bf16_key_ok(x, key, "zinf_optimizer_states", instead,
			      "it is for Adam's and AdamW's moments",
			      "format of the optimizer states");
	if (e->stage < 1 || e->stage > 3) {
		CERR(x, key,
		     "true at zero_optimization.stage %d: DeepSpeed takes it at stages 1-3 %s",
		     e->stage, instead);
		ok = false;
	}
	if (!json_is_true(master)) {
		CERR(x, key,
		     "true without bf16.bf16_master_weights_and_grads true: DeepSpeed requires "
		     "both %s",
		     instead);
		ok = false;
	}
	if (ok) {
		e->optimizer.state_dtype = ZINF_BF16;
	}
}

/*
 * bf16.bf16_master_weights_and_grads: true. DeepSpeed takes it with bf16 training (its BF16
 * optimizer); zinf takes it there for Adam or AdamW (a bf16 master, stochastic rounding) when
 * optimizer.params.zinf_master_weights does not ask for another master. Every refusal names the
 * key.
 */
static void
check_bf16_master(struct cfg_ctx *x)
{
	if (bf16_key_ok(
		    x, "bf16.bf16_master_weights_and_grads", "zinf_master_weights",
		    "(optimizer.params.zinf_master_weights \"bf16\" keeps a bf16 master without "
		    "it)",
		    "zinf's bf16 master is Adam's and AdamW's", "master weight")) {
		x->c->engine.optimizer.master_dtype = ZINF_BF16;
	}
}

/* What spans several keys, after the walk. */
static void
check_all(struct cfg_ctx *x)
{
	struct zinf_train_config *c = x->c;
	struct zinf_engine_opts *e = &c->engine;
	check_batch(x);
	if (c->fp16.enabled && c->bf16_enabled) {
		CERR(x, json_object_get(x->root, "bf16") ? "bf16.enabled" : "bfloat16.enabled",
		     "fp16.enabled and bf16.enabled are both true: enable one of them");
	}
	e->dtype = c->fp16.enabled ? ZINF_F16 : c->bf16_enabled ? ZINF_BF16 : ZINF_F32;
	if (c->bf16_optimizer_states) {
		check_bf16_states(x);
	}
	if (c->bf16_master_weights_and_grads) {
		check_bf16_master(x);
	}
	/* the engine clips and scales: it carries the same values as tc's own fields */
	e->gradient_clipping = c->gradient_clipping;
	e->fp16 = c->fp16;
	e->stage3_gather_16bit_weights_on_model_save = c->stage3_gather_16bit_weights_on_model_save;
	json_t *zero = json_object_get(x->root, "zero_optimization");
	json_t *oc = json_object_get(zero, "overlap_comm");
	if (!oc || json_is_null(oc)) {
		e->overlap_comm = e->stage == 3; /* DeepSpeed's overlap_comm_valid */
	}
	check_offload(x, &e->offload_param, "zero_optimization.offload_param", true);
	check_offload(x, &e->offload_optimizer, "zero_optimization.offload_optimizer", false);
	check_schedule(x);
}

int
zinf_config_read_string(const char *text, const char *name, const struct zinf_config_inputs *inputs,
			struct zinf_train_config *c)
{
	struct zinf_config_inputs in;
	struct cfg_keyline *kl = NULL;
	json_error_t je;
	int n_kl = 0, rc;

	if (!text || !c || c->size != sizeof(*c)) {
		return ZINF_FAIL(-EINVAL, "config: NULL text or config, or config not initialised "
					  "with zinf_config_init()");
	}
	zinf_config_inputs_init(&in);
	rc = zc_opts_take(&in, sizeof(in), inputs, "struct zinf_config_inputs");
	if (rc < 0) {
		return rc;
	}
	if (in.world_size < 0) {
		return ZINF_FAIL(-EINVAL,
				 "config: world_size %d: must be at least 1, or 0 (not known)",
				 in.world_size);
	}
	if (in.flags & ~ZINF_CONFIG_UNRESOLVED_OK) {
		return ZINF_FAIL(-EINVAL, "config: unknown inputs flags 0x%x", in.flags);
	}
	name = name ? name : "<string>";
	zinf_config_fini(c);
	c->world_size = in.world_size;

	int bad = cfg_prescan(text, name);
	json_t *root = json_loads(text, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
	if (!root) {
		if (!bad) { /* else the characters named above are what jansson stopped at */
			ZINF_ERR("%s:%d:%d: malformed JSON: %s", name, je.line, je.column, je.text);
		}
		return -EINVAL;
	}
	if (bad) {
		json_decref(root);
		return -EINVAL;
	}
	struct cfg_ctx x = {.name = name, .in = &in, .c = c, .root = root};
	if (!json_is_object(root)) {
		ZINF_ERR("%s: the top level must be an object ({...})", name);
		rc = -EINVAL;
		goto out;
	}
	n_kl = cfg_keylines_scan(text, &kl);
	if (n_kl < 0) {
		rc = ZINF_FAIL(n_kl, "%s: out of memory", name);
		n_kl = 0;
		goto out;
	}
	x.kl = kl;
	x.n_kl = (size_t)n_kl;
	cfg_parse_section(&x, root, &cfg_top, c, "", 0, NULL);
	if (!x.fatal) {
		check_all(&x);
	}
	rc = x.fatal ? ZINF_FAIL(x.fatal, "%s: out of memory", name) : x.errors ? -EINVAL : 0;
	if (x.warnings > CFG_SHOWN) {
		ZINF_WARN("%s: %d warnings (the first %d shown)", name, x.warnings, CFG_SHOWN);
	}
	if (x.errors) {
		if (x.errors > CFG_SHOWN) {
			ZINF_ERR("%s: %d errors (the first %d shown)", name, x.errors, CFG_SHOWN);
		} else {
			ZINF_ERR("%s: %d error%s", name, x.errors, x.errors == 1 ? "" : "s");
		}
	}
out:
	if (rc < 0) {
		zinf_config_fini(c);
	}
	cfg_keylines_free(kl, (size_t)n_kl);
	json_decref(root);
	return rc;
}

int
zinf_config_read_file(const char *path, const struct zinf_config_inputs *inputs,
		      struct zinf_train_config *c)
{
	struct stat st;
	int rc;
	if (!path) {
		return ZINF_FAIL(-EINVAL, "config: NULL path");
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		return ZINF_FAIL(-errno, "%s: cannot open: %s", path, zinf_strerror(-errno));
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > (64 << 20)) {
		rc = ZINF_FAIL(-EINVAL, "%s: not a regular file of at most 64 MiB", path);
		goto out;
	}
	char *text = zc_malloc((size_t)st.st_size + 1);
	if (!text) {
		rc = ZINF_FAIL(-ENOMEM, "%s: out of memory", path);
		goto out;
	}
	size_t got = 0;
	while (got < (size_t)st.st_size) {
		ssize_t r = read(fd, text + got, (size_t)st.st_size - got);
		if (r <= 0) {
			rc = ZINF_FAIL(r < 0 ? -errno : -EIO, "%s: read failed", path);
			zc_free(text);
			goto out;
		}
		got += (size_t)r;
	}
	text[got] = '\0';
	if (strlen(text) != got) {
		rc = ZINF_FAIL(-EINVAL, "%s: contains a NUL byte: not a JSON text file", path);
	} else {
		rc = zinf_config_read_string(text, path, inputs, c);
	}
	zc_free(text);
out:
	close(fd);
	return rc;
}
