/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli/bench/bench_engine.c: `zinf bench engine`, the ZeRO engine (zinf/engine.h) driven by a
 * synthetic transformer: --layers blocks of 12 H^2 parameters (qkv 3 H^2, proj H^2, fc1 4 H^2,
 * fc2 4 H^2) plus six vectors of H elements (two norms' weight and bias, the proj and fc2
 * biases: small enough to stay persistent at stage 3 by default). Every optimizer step runs
 * --micro-batches micro-batches of
 *
 *   forward:  for each layer:          fetch, compute, release
 *   backward: for each layer reversed: fetch, compute x 2, grad of each parameter, release
 *   zinf_engine_step()
 *
 * Compute is simulated by a CPU loop of --compute-ms per layer forward (twice that backward) on
 * the calling thread, on every device: no GPU kernel runs, so on "cuda" the compute stream stays
 * empty and the engine's device work overlaps the loop as it would overlap a kernel of that
 * length. Gradients come from one fixed device buffer of small values (1e-3).
 *
 * Per timed step it reports the step's wall time (first fetch to the step's return), the
 * simulated compute, the exposed fetch and step times, the optimizer's time and the bytes per
 * tier (the engine's statistics of the step's window), and
 *
 *   efficiency = max(compute, io_bound) / step,   io_bound = NVMe bytes of the step / disk rate
 *
 * where the disk rate is measured in the same run, after the timed steps, on the same
 * directories: a file of half the step's NVMe bytes (the largest step's) written, then read
 * back, sequentially through zinf_swap (its stripes over the --nvme-path directories, O_DIRECT,
 * 4 requests of up to 64 MiB in flight, the engine's aio block size and queue depth); rate =
 * bytes moved / (write time + read time). Without an NVMe tier io_bound is 0. Medians over the
 * timed steps are reported. --compare also builds the same model with step_during_backward off
 * and runs the two interleaved, step by step, in the same run (same device, same disk rate).
 * --clip sets gradient_clipping, so that the step during backward is the speculative one
 * (stepped assuming no clipping, rolled back when the norm exceeds it; the gradients of 1e-3
 * have a norm of 1e-3 sqrt(params)): each step's stepped_during_backward and rolled_back are
 * reported with the rest.
 *
 * Under mpirun every rank runs the same calls; each measures its own disk rate at the same point
 * (the ranks of a node share the disk as they do in the step); rank 0 prints its own figures.
 * Files are removed at the end, also on SIGINT/SIGTERM/SIGHUP/SIGPIPE (between steps); a killed
 * run's files are removed by the next run in the same directory.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/bench/bench.h"
#include "common/util.h"
#include "zinf/checkpoint.h"
#include "zinf/engine.h"
#include "zinf/blocks/swap.h"

#define PROG	     "zinf bench engine"
#define DEFAULT_DIR  "./zinf-bench-engine"
#define SCRATCH_STEM "zinf-bench-engine"
#define NPARAM	     10 /* parameters per layer */
#define GRAD_VALUE   1e-3f

/* In enum zinf_offload_device's order. */
static const char *const tiers[] = {"none", "cpu", "nvme", NULL};
/* In zinf_optim_kind's order. */
static const char *const optimizers[] = {"adam", "adamw", "adagrad", "lion", NULL};
static const char *const dtypes[] = {"bf16", "f16", "f32", NULL};
static const enum zinf_dtype dtype_of[] = {ZINF_BF16, ZINF_F16, ZINF_F32};
static const char *const devices[] = {"auto", "host", "cuda", NULL};
static const char *const schedules[] = {"zinf", "deepspeed", NULL}; /* zinf_step_schedule's */
static const char *const opt_states[] = {"f32", "bf16", "q8", NULL};
static const char *const masters[] = {"f32", "bf16", NULL};

struct cfg {
	uint32_t layers, micro_batches, steps, warmup;
	uint64_t hidden, sub_group, bucket, param_buffer, max_live;
	double compute_ms, clip, weight_decay;
	int stage, off_param, off_optim, optimizer, dtype, device, schedule;
	int state;  /* --optimizer-state: opt_states[] */
	int master; /* --master: masters[] */
	struct cli_list paths;
	const char *checkpoint;
	bool no_sdb, compare, pin, json, no_decay_1d;
	bool vertical;	     /* every micro-batch of a step in one pass (zinf_engine_vertical) */
	uint64_t max_in_cpu; /* offload_param.max_in_cpu: the NVMe parameter cache, elements */
};

static struct cfg cfg;

static const char synopsis[] =
	"[--layers L] [--hidden H] [--compute-ms MS] [--stage 0-3]\n"
	"       [--offload-param none|cpu|nvme] [--offload-optimizer none|cpu|nvme] "
	"[--nvme-path DIR]...\n"
	"       [--micro-batches N] [--steps N] [--clip MAX_NORM] [--compare] [--json] "
	"[--vertical]\n"
	"       (alone or under mpirun)";
static const char description[] =
	"Drive the ZeRO engine with a synthetic transformer of L layers of 12 H^2 parameters\n"
	"(qkv, proj, fc1, fc2; plus norms and biases of H elements): per micro-batch, fetch /\n"
	"compute / release forward, fetch / compute x 2 / grad / release backward, then\n"
	"zinf_engine_step. Compute is a CPU loop of --compute-ms per layer forward.\n"
	"\n"
	"efficiency = max(compute, io_bound) / step per step, median of the timed steps; io_bound\n"
	"= the step's NVMe bytes / the disk rate measured in the same run on the same directories\n"
	"(a file of half the step's NVMe bytes written then read through zinf_swap). 1.0: the\n"
	"step takes no longer than the slower of its compute and its disk traffic.\n"
	"--compare runs the same model with step_during_backward off, interleaved step by step.\n"
	"--clip MAX_NORM turns gradient clipping on: the step during backward speculates.\n"
	"--vertical runs a step's micro-batches in one pass (zinf_engine_vertical): each layer\n"
	"fetched once forward and once backward for all of them.\n";

static const struct cli_opt opts[] = {
	{"layers", CLI_U32, &cfg.layers, "4", "L", "transformer blocks", .min = 1, .max = 100000},
	{"hidden", CLI_COUNT, &cfg.hidden, "1024", "H",
	 "hidden size: 12 H^2 + 6 H parameters per layer", .min = 1, .max = 1 << 20},
	{"compute-ms", CLI_DOUBLE, &cfg.compute_ms, "1", "MS",
	 "simulated compute per layer forward (backward: twice that)", .min = 0, .max = 60000},
	{"stage", CLI_INT, &cfg.stage, "3", "N", "ZeRO stage", .min = 0, .max = 3},
	{"offload-param", CLI_ENUM, &cfg.off_param, "none", NULL,
	 "where the 16-bit parameters live (stage 3)", .choices = tiers},
	{"offload-optimizer", CLI_ENUM, &cfg.off_optim, "none", NULL,
	 "where the fp32 master and optimizer state live (stages 1-3)", .choices = tiers},
	{"nvme-path", CLI_LIST, &cfg.paths, DEFAULT_DIR, "DIR",
	 "directory for the swap files of the nvme tiers; repeat to stripe",
	 .max = ZINF_ENGINE_MAX_PATHS},
	{"optimizer", CLI_ENUM, &cfg.optimizer, "adamw", NULL, "optimizer", .choices = optimizers},
	{"dtype", CLI_ENUM, &cfg.dtype, "bf16", NULL, "dtype of the parameters and gradients",
	 .choices = dtypes},
	{"device", CLI_ENUM, &cfg.device, "auto", NULL, "compute device (auto: cuda when present)",
	 .choices = devices},
	{"micro-batches", CLI_U32, &cfg.micro_batches, "1", "N",
	 "micro-batches per optimizer step (gradient_accumulation_steps)", .min = 1, .max = 10000},
	{"steps", CLI_U32, &cfg.steps, "5", "N", "timed optimizer steps; medians reported",
	 .min = 1, .max = 100000},
	{"warmup", CLI_U32, &cfg.warmup, "1", "N", "untimed optimizer steps first", .min = 0,
	 .max = 10000},
	{"sub-group-size", CLI_COUNT, &cfg.sub_group, "1e9", "N",
	 "elements per optimizer sub-group (sub_group_size)", .min = 1},
	{"bucket", CLI_COUNT, &cfg.bucket, "5e8", "N",
	 "elements per gradient bucket (reduce_bucket_size)", .min = 1},
	{"max-live", CLI_COUNT, &cfg.max_live, "1e9", "N",
	 "gathered elements at most, cached ones included (stage3_max_live_parameters)", .min = 1},
	{"param-buffer-size", CLI_COUNT, &cfg.param_buffer, "1e8", "N",
	 "elements per offload_param buffer (buffer_size; nvme: 5 of them)", .min = 1},
	{"clip", CLI_DOUBLE, &cfg.clip, "0", "MAX_NORM",
	 "gradient_clipping (0: off); on, the step during backward\n"
	 "speculates (no clipping assumed; rolled back above MAX_NORM)",
	 .min = 0, .max = 1e300},
	{"weight-decay", CLI_DOUBLE, &cfg.weight_decay, "0", "WD", "the optimizer's weight_decay",
	 .min = 0, .max = 1e30},
	{"no-decay-1d", CLI_FLAG, &cfg.no_decay_1d, NULL, NULL,
	 "register the norms and biases with ZINF_PARAM_NO_DECAY (Hugging Face's\n"
	 "no-decay group): the step cuts its optimizer calls at their boundaries"},
	{"no-step-during-backward", CLI_FLAG, &cfg.no_sdb, NULL, NULL,
	 "step every sub-group in zinf_engine_step, none during backward"},
	{"compare", CLI_FLAG, &cfg.compare, NULL, NULL,
	 "also run step_during_backward off, interleaved step by step"},
	{"pin-memory", CLI_FLAG, &cfg.pin, NULL, NULL, "page-lock the offload buffers"},
	{"schedule", CLI_ENUM, &cfg.schedule, "zinf", NULL,
	 "the optimizer's NVMe schedule (deepspeed: one read ahead, one write behind, as "
	 "DeepSpeed's swapper)",
	 .choices = schedules},
	{"checkpoint", CLI_STR, &cfg.checkpoint, NULL, "DIR",
	 "after the steps, time zinf_engine_save and zinf_engine_load into DIR (interleaved "
	 "rounds with a write and a read of as many bytes there)"},
	{"json", CLI_FLAG, &cfg.json, NULL, NULL, "one JSON object on stdout (rank 0)"},
	{"vertical", CLI_FLAG, &cfg.vertical, NULL, NULL,
	 "every micro-batch of a step in one pass (zinf_engine_vertical): per layer\n"
	 "fetch, compute each micro-batch, release; backward each parameter's\n"
	 "gradients in micro-batch order"},
	{"max-in-cpu", CLI_COUNT, &cfg.max_in_cpu, "1e9", "N",
	 "elements of 16-bit parameters cached in host memory with --offload-param nvme\n"
	 "(offload_param.max_in_cpu; capped at the partitions; 0: every fetch reads NVMe)",
	 .min = 0},
	{"optimizer-state", CLI_ENUM, &cfg.state, "f32", NULL,
	 "Adam's m and v: f32, bf16 (stochastic rounding) or q8 (8-bit blockwise, one fp32 "
	 "scale per 256; the cpu and nvme tiers)",
	 .choices = opt_states},
	{"master", CLI_ENUM, &cfg.master, "f32", NULL,
	 "the master weight: f32 or bf16 (stochastic rounding; adam and adamw on the cpu and "
	 "nvme tiers)",
	 .choices = masters},
	{NULL},
};

/* ---- the model ----------------------------------------------------------------------------- */

/* A layer's parameters: name and size in units of H^2 (big) or H (small). */
static const struct {
	const char *name;
	uint32_t h2, h;
} layer_params[NPARAM] = {
	{"ln1.weight", 0, 1},	  {"ln1.bias", 0, 1},	  {"attn.qkv", 3, 0}, {"attn.proj", 1, 0},
	{"attn.proj.bias", 0, 1}, {"ln2.weight", 0, 1},	  {"ln2.bias", 0, 1}, {"mlp.fc1", 4, 0},
	{"mlp.fc2", 4, 0},	  {"mlp.fc2.bias", 0, 1},
};

static uint64_t
param_numel(const struct cfg *c, uint32_t j)
{
	return layer_params[j].h2 * c->hidden * c->hidden + layer_params[j].h * c->hidden;
}

/* Initial values: small, deterministic, per (parameter, element); no whole tensor on the host. */
static int
init_values(void *ctx, uint32_t param, uint64_t first, uint64_t count, float *out)
{
	(void)ctx;
	for (uint64_t i = 0; i < count; i++) {
		uint64_t x = (first + i) * 0x9e3779b97f4a7c15ull ^ ((uint64_t)param << 40);
		x ^= x >> 29;
		x *= 0xbf58476d1ce4e5b9ull;
		x ^= x >> 32;
		out[i] = ((float)(x & 0xffff) / 65536.0f - 0.5f) * 0.04f;
	}
	return 0;
}

/* ---- one arm: an engine over the model ----------------------------------------------------- */

struct sample {
	double step_s, compute_s, io_bound_s, eff;
	struct zinf_engine_stats es;
};

struct arm {
	const char *label; /* "step during backward" / "step after backward" */
	bool sdb;
	char prefix[CLI_PREFIX_MAX + 2]; /* the scratch prefix, "-b" for the second arm */
	struct zinf_engine *e;
	uint32_t *ids; /* layers x NPARAM */
	struct sample *s;
};

struct run {
	const struct cfg *c;
	int rank, world;
	struct arm arm[2];
	uint32_t narms;
	void *dev_grad; /* 4 H^2 elements of the dtype, on arm 0's device */
	struct zinf_device *dev;
	bool made_dir[ZINF_ENGINE_MAX_PATHS];
	bool nvme;
	/* the disk rate (NVMe tiers only) */
	uint64_t disk_bytes;
	double disk_read_s, disk_write_s, disk_rate;
	/* --checkpoint: medians of the rounds; this rank's state bytes; the reference's */
	uint64_t ck_bytes, ck_ref_bytes;
	double ck_save_s, ck_load_s, ck_ref_write_s, ck_ref_read_s, ck_bound_s;
	/* a background save: its call, the step after it (which publishes it), a plain step */
	double ck_bg_call_s, ck_bg_step_s, ck_plain_step_s, ck_hidden_s;
};

static int
fail_call(const struct run *r, const char *call, int rc)
{
	fprintf(stderr, PROG ": rank %d: %s failed: %s\n", r->rank, call, zinf_strerror(rc));
	return rc;
}

static void
offload(const struct cfg *c, int tier, struct zinf_offload_opts *o)
{
	o->device = (enum zinf_offload_device)tier;
	o->pin_memory = c->pin;
	if (tier == ZINF_OFFLOAD_NVME) {
		o->n_paths = c->paths.n;
		for (unsigned i = 0; i < c->paths.n; i++) {
			o->nvme_path[i] = c->paths.v[i];
		}
	}
}

static uint64_t
model_params(const struct cfg *c)
{
	uint64_t per = 0;
	for (uint32_t j = 0; j < NPARAM; j++) {
		per += param_numel(c, j);
	}
	return per * c->layers;
}

/*
 * At least the host memory this rank's model state takes, checked once the device is known and
 * before anything is registered (--hidden 1e5 asks for terabytes): the 16-bit parameters, and
 * the fp32 master, optimizer state and gradient partition, each where it lives in host memory
 * (a cpu tier, or a device tier on the host device; an nvme tier's buffers are bounded by their
 * sizes; the nvme parameter tier's cache, --max-in-cpu, is not). Buckets and gathered layers
 * come on top. Times the arms (--compare runs two).
 */
static int
check_host_memory(const struct run *r, struct zinf_engine *e)
{
	const struct cfg *c = r->c;
	const char *be = zinf_device_backend(zinf_engine_device(e));
	bool host = be && strcmp(be, "host") == 0;
	double P = (double)model_params(c), w = (double)zinf_engine_world(e);
	double ds = (double)zinf_dtype_size(dtype_of[c->dtype]);
	double sb = c->optimizer == ZINF_OPTIM_ADAGRAD || c->optimizer == ZINF_OPTIM_LION ? 8 : 12;
	double need = 0;
	if (c->stage < 3 || c->off_param == ZINF_OFFLOAD_NONE) { /* on the device */
		need += host ? P / (c->stage == 3 ? w : 1) * ds : 0;
	} else if (c->off_param == ZINF_OFFLOAD_CPU) {
		need += P / w * ds;
	} else { /* nvme: the parameter cache (--max-in-cpu, capped at the partitions) */
		need += fmin((double)c->max_in_cpu, P / w) * ds;
	}
	if (c->off_optim == ZINF_OFFLOAD_CPU || (c->off_optim == ZINF_OFFLOAD_NONE && host)) {
		need += P / (c->stage >= 1 ? w : 1) * (sb + 4);
	}
	return cli_check_memory(
		PROG, "the model's state in host memory (at least)", need * (c->compare ? 2 : 1),
		"--hidden or --layers, or put the state on NVMe (--offload-optimizer "
		"nvme, and --offload-param nvme at stage 3)");
}

/* Create arm a's engine (on dev when not NULL), register the model and init. */
static int
arm_open(struct run *r, struct arm *a, struct zinf_device *dev)
{
	const struct cfg *c = r->c;
	struct zinf_engine_opts eo;
	zinf_engine_opts_init(&eo);
	eo.stage = c->stage;
	offload(c, c->off_param, &eo.offload_param);
	eo.offload_param.buffer_size = c->param_buffer;
	eo.stage3_max_live_parameters = c->max_live;
	eo.offload_param.max_in_cpu = c->max_in_cpu;
	offload(c, c->off_optim, &eo.offload_optimizer);
	eo.optimizer_schedule = (uint8_t)c->schedule;
	eo.sub_group_size = c->sub_group;
	eo.reduce_bucket_size = c->bucket;
	eo.gradient_accumulation_steps = c->micro_batches;
	zinf_optimizer_opts_init(&eo.optimizer, (enum zinf_optim_kind)c->optimizer);
	eo.optimizer.weight_decay = (float)c->weight_decay;
	eo.optimizer.state_dtype = c->state == 1 ? ZINF_BF16 : ZINF_F32;
	eo.optimizer.state_format = c->state == 2 ? ZINF_STATE_Q8 : ZINF_STATE_PLAIN;
	eo.optimizer.master_dtype = c->master == 1 ? ZINF_BF16 : ZINF_F32;
	eo.dtype = dtype_of[c->dtype];
	eo.device_backend = c->device ? devices[c->device] : NULL;
	eo.device = dev;
	eo.swap_prefix = a->prefix;
	eo.step_during_backward = a->sdb;
	eo.gradient_clipping = c->clip;
	int rc = zinf_engine_create(&eo, &a->e);
	if (rc) {
		return fail_call(r, "zinf_engine_create", rc);
	}
	if (check_host_memory(r, a->e) < 0) {
		return -ENOMEM;
	}
	a->ids = calloc((size_t)c->layers * NPARAM, sizeof(*a->ids));
	a->s = calloc(c->steps, sizeof(*a->s));
	if (!a->ids || !a->s) {
		return fail_call(r, "allocating the model's tables", -ENOMEM);
	}
	for (uint32_t l = 0; l < c->layers; l++) {
		for (uint32_t j = 0; j < NPARAM; j++) {
			char name[64];
			snprintf(name, sizeof(name), "layer%u.%s", l, layer_params[j].name);
			struct zinf_param_desc d;
			zinf_param_desc_init(&d);
			d.name = name;
			d.numel = param_numel(c, j);
			d.layer = (int32_t)l;
			d.init_fn = init_values;
			if (c->no_decay_1d && layer_params[j].h2 == 0) {
				d.flags = ZINF_PARAM_NO_DECAY;
			}
			rc = zinf_engine_add_param(a->e, &d);
			if (rc < 0) {
				return fail_call(r, "zinf_engine_add_param", rc);
			}
			a->ids[l * NPARAM + j] = (uint32_t)rc;
		}
	}
	rc = zinf_engine_init(a->e);
	return rc ? fail_call(r, "zinf_engine_init", rc) : 0;
}

/* A real CPU loop of `ms` milliseconds (simulated compute). Returns the seconds it took. */
static double
spin(double ms)
{
	double t0 = zinf_now_s(), end = t0 + ms / 1e3, t = t0;
	volatile double x = 1.0;
	while (t < end) {
		for (int i = 0; i < 256; i++) {
			x = x * 1.0000001 + 1e-9;
		}
		t = zinf_now_s();
	}
	return t - t0;
}

/* One optimizer step: every micro-batch's forward, backward and zinf_engine_step; with
 * --vertical one pass of them all (each layer's compute once per micro-batch, each parameter's
 * gradients in micro-batch order). */
static int
arm_step(struct run *r, struct arm *a, struct sample *s)
{
	const struct cfg *c = r->c;
	enum zinf_dtype dt = dtype_of[c->dtype];
	double t0 = zinf_now_s(), compute = 0;
	int rc = 0;
	char call[96];
	uint32_t per = c->vertical ? c->micro_batches : 1; /* micro-batches per pass */
	for (uint32_t mb = 0; mb < c->micro_batches; mb += per) {
		if (c->vertical && (rc = zinf_engine_vertical(a->e, per))) {
			return fail_call(r, "zinf_engine_vertical", rc);
		}
		for (uint32_t l = 0; l < c->layers; l++) {
			if ((rc = zinf_engine_fetch(a->e, (int32_t)l))) {
				snprintf(call, sizeof(call), "forward: zinf_engine_fetch(layer %u)",
					 l);
				return fail_call(r, call, rc);
			}
			for (uint32_t k = 0; k < per; k++) {
				compute += spin(c->compute_ms);
			}
			if ((rc = zinf_engine_release(a->e, (int32_t)l))) {
				snprintf(call, sizeof(call), "zinf_engine_release(layer %u)", l);
				return fail_call(r, call, rc);
			}
		}
		for (uint32_t l = c->layers; l-- > 0;) {
			if ((rc = zinf_engine_fetch(a->e, (int32_t)l))) {
				snprintf(call, sizeof(call),
					 "backward: zinf_engine_fetch(layer %u)", l);
				return fail_call(r, call, rc);
			}
			for (uint32_t k = 0; k < per; k++) {
				compute += spin(2 * c->compute_ms);
			}
			for (uint32_t j = NPARAM; j-- > 0;) {
				uint32_t id = a->ids[l * NPARAM + j];
				for (uint32_t k = 0; k < per; k++) {
					if ((rc = zinf_engine_grad(a->e, id, r->dev_grad, dt))) {
						snprintf(call, sizeof(call),
							 "zinf_engine_grad(layer%u.%s)", l,
							 layer_params[j].name);
						return fail_call(r, call, rc);
					}
				}
			}
			if ((rc = zinf_engine_release(a->e, (int32_t)l))) {
				snprintf(call, sizeof(call), "zinf_engine_release(layer %u)", l);
				return fail_call(r, call, rc);
			}
		}
		rc = zinf_engine_step(a->e);
		if (rc < 0) {
			return fail_call(r, "zinf_engine_step", rc);
		}
		if (rc != (mb + per == c->micro_batches)) {
			fprintf(stderr,
				PROG ": rank %d: zinf_engine_step returned %d after micro-batch "
				     "%u of %u\n",
				r->rank, rc, mb + per, c->micro_batches);
			return -EPROTO;
		}
	}
	s->step_s = zinf_now_s() - t0;
	s->compute_s = compute;
	s->es.size = sizeof(s->es);
	rc = zinf_engine_get_stats(a->e, &s->es);
	return rc ? fail_call(r, "zinf_engine_get_stats", rc) : 0;
}

/* ---- the disk rate ------------------------------------------------------------------------- */

#define DISK_SLOTS 4
#define DISK_CHUNK (64ull << 20)

/* Write (or read) the n tensors `ids` in order, DISK_SLOTS in flight; the seconds it took. */
static int
disk_pass(struct zinf_swap *sw, const int *ids, int n, char **buf, bool write, double *secs)
{
	struct zinf_swap_op op[DISK_SLOTS];
	bool busy[DISK_SLOTS] = {false};
	int rc = 0;
	double t0 = zinf_now_s();
	for (int i = 0; i < n && rc == 0; i++) {
		int k = i % DISK_SLOTS;
		if (busy[k]) {
			rc = zinf_swap_wait(sw, &op[k]);
			busy[k] = false;
		}
		if (rc == 0) {
			rc = write ? zinf_swap_write_async(sw, ids[i], buf[k], &op[k])
				   : zinf_swap_read_async(sw, ids[i], buf[k], &op[k]);
			busy[k] = rc == 0;
		}
	}
	for (int k = 0; k < DISK_SLOTS; k++) {
		if (busy[k]) {
			int w = zinf_swap_wait(sw, &op[k]);
			rc = rc ? rc : w;
		}
	}
	*secs = zinf_now_s() - t0;
	return rc;
}

/*
 * Sequential write then read of `bytes` (rounded up to whole chunks) in the --nvme-path
 * directories through zinf_swap, with the I/O options the engine's aio defaults give.
 */
static int
disk_rw(struct run *r, const char *const *dirs, unsigned n_dirs, const char *tag, uint64_t bytes,
	uint64_t *moved, double *write_s, double *read_s)
{
	struct zinf_engine_opts eo;
	zinf_engine_opts_init(&eo);
	struct zinf_io_opts io_o;
	zinf_io_opts_init(&io_o);
	io_o.block_size = eo.aio.block_size;
	io_o.queue_depth = eo.aio.queue_depth;
	io_o.threads = eo.aio.intra_op_parallelism;
	struct zinf_io *io = NULL;
	struct zinf_swap *sw = NULL;
	char *buf[DISK_SLOTS] = {NULL};
	int *ids = NULL;
	int rc = zinf_io_create(&io_o, &io);
	if (rc) {
		return fail_call(r, "measuring the disk: zinf_io_create", rc);
	}
	char prefix[CLI_PREFIX_MAX + 16];
	snprintf(prefix, sizeof(prefix), "%s-%s", r->arm[0].prefix, tag);
	struct zinf_swap_opts so;
	zinf_swap_opts_init(&so);
	so.dirs = dirs;
	so.n_dirs = n_dirs;
	so.prefix = prefix;
	so.rank = r->rank;
	if ((rc = cli_swap_create(PROG, io, &so, &sw))) {
		goto out;
	}
	uint64_t chunk = bytes < DISK_CHUNK ? ZINF_ALIGN_UP(bytes ? bytes : 1, 4096) : DISK_CHUNK;
	int n = (int)((bytes + chunk - 1) / chunk);
	n = n ? n : 1;
	if (!(ids = calloc((size_t)n, sizeof(*ids)))) {
		rc = -ENOMEM;
		goto out;
	}
	for (int i = 0; i < n; i++) {
		if ((rc = ids[i] = zinf_swap_add(sw, "disk", (uint32_t)i, chunk)) < 0) {
			goto out;
		}
	}
	if ((rc = zinf_swap_reserve(sw))) {
		goto out;
	}
	for (int k = 0; k < DISK_SLOTS; k++) {
		buf[k] = zinf_alloc_aligned(ZINF_MAX(zinf_swap_align(sw), 4096u),
					    zinf_swap_buf_bytes(sw, ids[0]));
		if (!buf[k]) {
			rc = -ENOMEM;
			goto out;
		}
		memset(buf[k], 0x5a + k, zinf_swap_buf_bytes(sw, ids[0]));
	}
	if ((rc = disk_pass(sw, ids, n, buf, true, write_s)) ||
	    (rc = disk_pass(sw, ids, n, buf, false, read_s))) {
		goto out;
	}
	*moved = (uint64_t)n * chunk;
out:
	if (rc) {
		fail_call(r, "measuring the disk rate", rc);
	}
	for (int k = 0; k < DISK_SLOTS; k++) {
		zinf_free_aligned(buf[k]);
	}
	free(ids);
	zinf_swap_destroy(sw); /* removes the file */
	zinf_io_destroy(io);
	return rc;
}

/* The --nvme-path directories' rate: a write then a read of `bytes` through zinf_swap. */
static int
measure_disk(struct run *r, uint64_t bytes)
{
	int rc = disk_rw(r, (const char *const *)r->c->paths.v, r->c->paths.n, "disk", bytes,
			 &r->disk_bytes, &r->disk_write_s, &r->disk_read_s);
	if (rc == 0) {
		r->disk_rate = 2.0 * (double)r->disk_bytes / (r->disk_write_s + r->disk_read_s);
	}
	return rc;
}

static double
median3(double *v, int n)
{
	for (int i = 1; i < n; i++) {
		for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
			double t = v[j];
			v[j] = v[j - 1];
			v[j - 1] = t;
		}
	}
	return n ? v[n / 2] : 0;
}

/*
 * --checkpoint DIR: CK_ROUNDS rounds of zinf_engine_save (tag "bench", replaced each round)
 * interleaved with the reference, a write then a read of as many bytes as this rank's state
 * through zinf_swap in DIR; then zinf_engine_load of it into the running engine. The bound of a
 * save is one write of the state, plus one read of it when it is on NVMe (the swap files).
 */
#define CK_ROUNDS 3
static int
measure_checkpoint(struct run *r)
{
	const struct cfg *c = r->c;
	struct zinf_engine *e = r->arm[0].e;
	double save[CK_ROUNDS], w[CK_ROUNDS], rd[CK_ROUNDS];
	int rc = 0;
	uint64_t elems = 0; /* the model's elements (padding aside) */
	for (uint32_t j = 0; j < NPARAM; j++) {
		elems += param_numel(c, j) * c->layers;
	}
	uint32_t sb =
		c->optimizer == ZINF_OPTIM_ADAGRAD || c->optimizer == ZINF_OPTIM_LION ? 8 : 12;
	int fw = c->stage == 0 ? 1 : r->world;
	r->ck_bytes = (r->rank < fw ? elems / (uint64_t)fw : 0) * sb;
	if (mkdir(c->checkpoint, 0755) != 0 && errno != EEXIST) {
		return fail_call(r, "creating the --checkpoint directory", -errno);
	}
	const char *dirs[1] = {c->checkpoint};
	for (int k = 0; k < CK_ROUNDS && rc == 0 && !cli_interrupted; k++) {
		double t0 = zinf_now_s();
		rc = zinf_engine_save(e, c->checkpoint, "bench", NULL);
		save[k] = zinf_now_s() - t0;
		if (rc) {
			return fail_call(r, "zinf_engine_save", rc);
		}
		rc = disk_rw(r, dirs, 1, "ckref", ZINF_MAX(r->ck_bytes, 1), &r->ck_ref_bytes, &w[k],
			     &rd[k]);
	}
	if (rc == 0) {
		double t0 = zinf_now_s();
		rc = zinf_engine_load(e, c->checkpoint, "bench", NULL);
		r->ck_load_s = zinf_now_s() - t0;
		if (rc) {
			return fail_call(r, "zinf_engine_load", rc);
		}
	}
	if (rc == 0) { /* a background save, then the step that publishes it, then a plain one */
		struct zinf_ckpt_opts so;
		zinf_ckpt_opts_init(&so);
		so.background = true;
		struct sample bg, plain;
		double t0 = zinf_now_s();
		rc = zinf_engine_save(e, c->checkpoint, "bench", &so);
		r->ck_bg_call_s = zinf_now_s() - t0;
		if (rc == 0 && (rc = arm_step(r, &r->arm[0], &bg)) == 0) {
			rc = zinf_engine_save_wait(e);
		}
		if (rc == 0) {
			rc = arm_step(r, &r->arm[0], &plain);
		}
		if (rc) {
			return fail_call(r, "the background save", rc);
		}
		r->ck_bg_step_s = bg.step_s;
		r->ck_plain_step_s = plain.step_s;
	}
	if (rc == 0) {
		r->ck_save_s = median3(save, CK_ROUNDS);
		double cost = r->ck_bg_call_s + ZINF_MAX(r->ck_bg_step_s - r->ck_plain_step_s, 0.0);
		r->ck_hidden_s = ZINF_MAX(r->ck_save_s - cost, 0.0);
		r->ck_ref_write_s = median3(w, CK_ROUNDS);
		r->ck_ref_read_s = median3(rd, CK_ROUNDS);
		double scale = r->ck_ref_bytes ? (double)r->ck_bytes / (double)r->ck_ref_bytes : 0;
		r->ck_bound_s =
			scale * (r->ck_ref_write_s +
				 (c->off_optim == ZINF_OFFLOAD_NVME ? r->ck_ref_read_s : 0));
	}
	return rc;
}

/* ---- summary and report -------------------------------------------------------------------- */

static uint64_t
nvme_bytes(const struct sample *s)
{
	return s->es.nvme_read_bytes + s->es.nvme_write_bytes;
}

/* io_bound and efficiency of every sample, from the disk rate. */
static void
finish_samples(struct run *r, struct arm *a)
{
	for (uint32_t i = 0; i < r->c->steps; i++) {
		struct sample *s = &a->s[i];
		s->io_bound_s = r->disk_rate > 0 ? (double)nvme_bytes(s) / r->disk_rate : 0;
		s->eff = fmax(s->compute_s, s->io_bound_s) / s->step_s;
	}
}

/* Median over the timed steps of the double at `off` in struct sample. */
static double
med_at(const struct run *r, const struct arm *a, size_t off)
{
	uint32_t n = r->c->steps;
	double *v = calloc(n, sizeof(*v));
	if (!v) {
		return NAN;
	}
	for (uint32_t i = 0; i < n; i++) {
		v[i] = *(const double *)((const char *)&a->s[i] + off);
	}
	double m = cli_median(v, n);
	free(v);
	return m;
}

/* Median of a uint64_t counter at `off` in struct zinf_engine_stats. */
static double
med_u64(const struct run *r, const struct arm *a, size_t off)
{
	uint32_t n = r->c->steps;
	double *v = calloc(n, sizeof(*v));
	if (!v) {
		return NAN;
	}
	for (uint32_t i = 0; i < n; i++) {
		v[i] = (double)*(const uint64_t *)((const char *)&a->s[i].es + off);
	}
	double m = cli_median(v, n);
	free(v);
	return m;
}

#define MED(r, a, f)	 med_at((r), (a), offsetof(struct sample, f))
#define MED_ES(r, a, f)	 med_at((r), (a), offsetof(struct sample, es.f))
#define MED_U64(r, a, f) med_u64((r), (a), offsetof(struct zinf_engine_stats, f))

static const char *const u64_fields[] = {"nvme_read_bytes",
					 "nvme_write_bytes",
					 "h2d_bytes",
					 "d2h_bytes",
					 "reduced_bytes",
					 "gathered_bytes",
					 "param_nvme_read_bytes",
					 "param_nvme_write_bytes",
					 "optim_nvme_read_bytes",
					 "optim_nvme_write_bytes",
					 "grad_nvme_read_bytes",
					 "grad_nvme_write_bytes"};
static const size_t u64_offs[] = {
	offsetof(struct zinf_engine_stats, nvme_read_bytes),
	offsetof(struct zinf_engine_stats, nvme_write_bytes),
	offsetof(struct zinf_engine_stats, h2d_bytes),
	offsetof(struct zinf_engine_stats, d2h_bytes),
	offsetof(struct zinf_engine_stats, reduced_bytes),
	offsetof(struct zinf_engine_stats, gathered_bytes),
	offsetof(struct zinf_engine_stats, param_nvme_read_bytes),
	offsetof(struct zinf_engine_stats, param_nvme_write_bytes),
	offsetof(struct zinf_engine_stats, optim_nvme_read_bytes),
	offsetof(struct zinf_engine_stats, optim_nvme_write_bytes),
	offsetof(struct zinf_engine_stats, grad_nvme_read_bytes),
	offsetof(struct zinf_engine_stats, grad_nvme_write_bytes),
};
_Static_assert(ZINF_ARRAY_SIZE(u64_fields) == ZINF_ARRAY_SIZE(u64_offs), "one offset per name");

/* NVMe bytes per parameter of the model per step: this rank's bytes (a median over the timed
 * steps) times the ranks (each moves its own partitions, alike) over the parameters. */
static double
per_param(const struct run *r, const struct arm *a, size_t off)
{
	return med_u64(r, a, off) * r->world / (double)model_params(r->c);
}

#define PER_PARAM(r, a, f) per_param((r), (a), offsetof(struct zinf_engine_stats, f))

static uint64_t
rss_peak_bytes(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (uint64_t)ru.ru_maxrss * 1024;
}

static json_t *
sample_json(const struct sample *s)
{
	json_t *o = json_object();
	json_object_set_new(o, "step_s", cli_json_real(s->step_s));
	json_object_set_new(o, "compute_s", cli_json_real(s->compute_s));
	json_object_set_new(o, "io_bound_s", cli_json_real(s->io_bound_s));
	json_object_set_new(o, "exposed_fetch_s", cli_json_real(s->es.exposed_fetch_s));
	json_object_set_new(o, "exposed_step_s", cli_json_real(s->es.exposed_step_s));
	json_object_set_new(o, "optimizer_s", cli_json_real(s->es.optimizer_s));
	json_object_set_new(o, "engine_step_s", cli_json_real(s->es.step_s));
	json_object_set_new(o, "efficiency", cli_json_real(s->eff));
	for (size_t i = 0; i < ZINF_ARRAY_SIZE(u64_fields); i++) {
		json_object_set_new(
			o, u64_fields[i],
			json_integer((json_int_t) *
				     (const uint64_t *)((const char *)&s->es + u64_offs[i])));
	}
	json_object_set_new(o, "stepped_during_backward",
			    json_integer(s->es.stepped_during_backward));
	json_object_set_new(o, "rolled_back", json_integer(s->es.rolled_back));
	return o;
}

/* An arm's medians and per-step figures, into o. */
static void
arm_json(const struct run *r, const struct arm *a, json_t *o)
{
	const struct sample *last = &a->s[r->c->steps - 1];
	json_object_set_new(o, "step_during_backward", json_boolean(a->sdb));
	json_object_set_new(o, "step_s", cli_json_real(MED(r, a, step_s)));
	json_object_set_new(o, "compute_s", cli_json_real(MED(r, a, compute_s)));
	json_object_set_new(o, "io_bound_s", cli_json_real(MED(r, a, io_bound_s)));
	json_object_set_new(o, "exposed_fetch_s", cli_json_real(MED_ES(r, a, exposed_fetch_s)));
	json_object_set_new(o, "exposed_step_s", cli_json_real(MED_ES(r, a, exposed_step_s)));
	json_object_set_new(o, "optimizer_s", cli_json_real(MED_ES(r, a, optimizer_s)));
	json_object_set_new(o, "engine_step_s", cli_json_real(MED_ES(r, a, step_s)));
	json_object_set_new(o, "efficiency", cli_json_real(MED(r, a, eff)));
	for (size_t i = 0; i < ZINF_ARRAY_SIZE(u64_fields); i++) {
		json_object_set_new(o, u64_fields[i],
				    json_integer((json_int_t)llround(med_u64(r, a, u64_offs[i]))));
	}
	json_t *pp = json_object();
	static const char *const kinds[] = {"total", "param", "optim", "grad"};
	const size_t offs[][2] = {
		{offsetof(struct zinf_engine_stats, nvme_read_bytes),
		 offsetof(struct zinf_engine_stats, nvme_write_bytes)},
		{offsetof(struct zinf_engine_stats, param_nvme_read_bytes),
		 offsetof(struct zinf_engine_stats, param_nvme_write_bytes)},
		{offsetof(struct zinf_engine_stats, optim_nvme_read_bytes),
		 offsetof(struct zinf_engine_stats, optim_nvme_write_bytes)},
		{offsetof(struct zinf_engine_stats, grad_nvme_read_bytes),
		 offsetof(struct zinf_engine_stats, grad_nvme_write_bytes)},
	};
	for (size_t k = 0; k < ZINF_ARRAY_SIZE(kinds); k++) {
		json_t *rw = json_object();
		json_object_set_new(rw, "read", cli_json_real(per_param(r, a, offs[k][0])));
		json_object_set_new(rw, "written", cli_json_real(per_param(r, a, offs[k][1])));
		json_object_set_new(pp, kinds[k], rw);
	}
	json_object_set_new(o, "nvme_bytes_per_param", pp);
	json_object_set_new(o, "sub_groups", json_integer(last->es.sub_groups));
	json_object_set_new(o, "stepped_during_backward",
			    json_integer(last->es.stepped_during_backward));
	json_object_set_new(o, "rolled_back", json_integer(last->es.rolled_back));
	json_object_set_new(o, "peak_live_elems",
			    json_integer((json_int_t)last->es.peak_live_elems));
	json_object_set_new(o, "persistent_elems",
			    json_integer((json_int_t)last->es.persistent_elems));
	json_t *per = json_array();
	for (uint32_t i = 0; i < r->c->steps; i++) {
		json_array_append_new(per, sample_json(&a->s[i]));
	}
	json_object_set_new(o, "per_step", per);
}

static int
report_json(const struct run *r)
{
	const struct cfg *c = r->c;
	json_t *o = json_object();
	json_object_set_new(o, "layers", json_integer(c->layers));
	json_object_set_new(o, "hidden", json_integer((json_int_t)c->hidden));
	json_object_set_new(o, "params", json_integer((json_int_t)model_params(c)));
	json_object_set_new(o, "stage", json_integer(c->stage));
	json_object_set_new(o, "offload_param", json_string(tiers[c->off_param]));
	json_object_set_new(o, "offload_optimizer", json_string(tiers[c->off_optim]));
	json_t *paths = json_array();
	for (unsigned i = 0; r->nvme && i < c->paths.n; i++) {
		json_array_append_new(paths, json_string(c->paths.v[i]));
	}
	json_object_set_new(o, "nvme_path", paths);
	json_object_set_new(o, "optimizer", json_string(optimizers[c->optimizer]));
	json_object_set_new(o, "dtype", json_string(dtypes[c->dtype]));
	json_object_set_new(o, "device", json_string(zinf_device_backend(r->dev)));
	json_object_set_new(o, "world", json_integer(r->world));
	json_object_set_new(o, "micro_batches", json_integer(c->micro_batches));
	json_object_set_new(o, "vertical", json_boolean(c->vertical));
	json_object_set_new(o, "steps", json_integer(c->steps));
	json_object_set_new(o, "warmup", json_integer(c->warmup));
	json_object_set_new(o, "sub_group_size", json_integer((json_int_t)c->sub_group));
	json_object_set_new(o, "bucket", json_integer((json_int_t)c->bucket));
	json_object_set_new(o, "compute_ms", cli_json_real(c->compute_ms));
	json_object_set_new(o, "schedule", json_string(schedules[c->schedule]));
	json_object_set_new(o, "weight_decay", cli_json_real(c->weight_decay));
	json_object_set_new(o, "no_decay_1d", json_boolean(c->no_decay_1d));
	json_object_set_new(o, "gradient_clipping", cli_json_real(c->clip));
	json_object_set_new(o, "max_in_cpu", json_integer((json_int_t)c->max_in_cpu));
	json_object_set_new(o, "optimizer_state", json_string(opt_states[c->state]));
	json_object_set_new(o, "master", json_string(masters[c->master]));
	arm_json(r, &r->arm[0], o);
	if (r->nvme) {
		json_t *d = json_object();
		json_object_set_new(d, "method",
				    json_string("zinf_swap: sequential write then read of a "
						"file of half the step's NVMe bytes"));
		json_object_set_new(d, "bytes", json_integer((json_int_t)r->disk_bytes));
		json_object_set_new(d, "write_s", cli_json_real(r->disk_write_s));
		json_object_set_new(d, "read_s", cli_json_real(r->disk_read_s));
		json_object_set_new(d, "GBps", cli_json_real(r->disk_rate / 1e9));
		json_object_set_new(o, "disk", d);
	} else {
		json_object_set_new(o, "disk", json_null());
	}
	if (r->narms > 1) {
		json_t *cmp = json_object();
		arm_json(r, &r->arm[1], cmp);
		json_object_set_new(o, "compare", cmp);
	}
	if (c->checkpoint) {
		json_t *k = json_object();
		json_object_set_new(k, "dir", json_string(c->checkpoint));
		json_object_set_new(k, "state_bytes", json_integer((json_int_t)r->ck_bytes));
		json_object_set_new(k, "save_s", cli_json_real(r->ck_save_s));
		json_object_set_new(k, "load_s", cli_json_real(r->ck_load_s));
		json_object_set_new(k, "ref_bytes", json_integer((json_int_t)r->ck_ref_bytes));
		json_object_set_new(k, "ref_write_s", cli_json_real(r->ck_ref_write_s));
		json_object_set_new(k, "ref_read_s", cli_json_real(r->ck_ref_read_s));
		json_object_set_new(k, "bound_s", cli_json_real(r->ck_bound_s));
		json_object_set_new(
			k, "save_efficiency",
			cli_json_real(r->ck_save_s > 0 ? r->ck_bound_s / r->ck_save_s : 0));
		json_object_set_new(k, "background_call_s", cli_json_real(r->ck_bg_call_s));
		json_object_set_new(k, "background_step_s", cli_json_real(r->ck_bg_step_s));
		json_object_set_new(k, "plain_step_s", cli_json_real(r->ck_plain_step_s));
		json_object_set_new(k, "background_hidden_s", cli_json_real(r->ck_hidden_s));
		json_object_set_new(o, "checkpoint", k);
	}
	json_object_set_new(o, "rss_peak_bytes", json_integer((json_int_t)rss_peak_bytes()));
	return cli_json_print(o, 2);
}

static void
report_human(const struct run *r)
{
	const struct cfg *c = r->c;
	char sz[32];
	printf(PROG ": %u layers, hidden %llu: %llu params; stage %d, params on %s, optimizer "
		    "state on %s; %s, %s, %u micro-batch(es), %d rank(s), device %s\n",
	       c->layers, (unsigned long long)c->hidden, (unsigned long long)model_params(c),
	       c->stage, tiers[c->off_param], tiers[c->off_optim], optimizers[c->optimizer],
	       dtypes[c->dtype], c->micro_batches, r->world, zinf_device_backend(r->dev));
	if (c->clip > 0) {
		printf("  gradient_clipping %g\n", c->clip);
	}
	if (c->weight_decay > 0 || c->no_decay_1d) {
		printf("  weight_decay %g%s\n", c->weight_decay,
		       c->no_decay_1d ? ", not on the norms and biases (ZINF_PARAM_NO_DECAY)" : "");
	}
	if (r->nvme) {
		cli_size_str(sz, sizeof(sz), r->disk_bytes);
		printf("  disk: %.2f GB/s (write then read of %s through zinf_swap)\n",
		       r->disk_rate / 1e9, sz);
	}
	for (uint32_t k = 0; k < r->narms; k++) {
		const struct arm *a = &r->arm[k];
		printf("  %s:\n", a->label);
		printf("    %4s %9s %9s %9s %9s %9s %9s %10s %10s %10s %6s\n", "step", "time_s",
		       "compute", "io_bound", "exp_fetch", "exp_step", "optim", "nvme_rd",
		       "nvme_wr", "h2d", "eff");
		for (uint32_t i = 0; i < c->steps; i++) {
			const struct sample *s = &a->s[i];
			char rd[16], wr[16], hd[16];
			cli_size_str(rd, sizeof(rd), s->es.nvme_read_bytes);
			cli_size_str(wr, sizeof(wr), s->es.nvme_write_bytes);
			cli_size_str(hd, sizeof(hd), s->es.h2d_bytes);
			printf("    %4u %9.4f %9.4f %9.4f %9.4f %9.4f %9.4f %10s %10s %10s %6.3f\n",
			       i + 1, s->step_s, s->compute_s, s->io_bound_s, s->es.exposed_fetch_s,
			       s->es.exposed_step_s, s->es.optimizer_s, rd, wr, hd, s->eff);
		}
		printf("    median: step %.4f s, compute %.4f s, io_bound %.4f s, exposed fetch "
		       "%.4f s, exposed step %.4f s, efficiency %.3f\n",
		       MED(r, a, step_s), MED(r, a, compute_s), MED(r, a, io_bound_s),
		       MED_ES(r, a, exposed_fetch_s), MED_ES(r, a, exposed_step_s), MED(r, a, eff));
		if (r->nvme) {
			printf("    NVMe bytes per parameter per step (medians): read %.2f (params "
			       "%.2f, optimizer %.2f, gradients %.2f), written %.2f (params %.2f, "
			       "optimizer %.2f, gradients %.2f)\n",
			       PER_PARAM(r, a, nvme_read_bytes),
			       PER_PARAM(r, a, param_nvme_read_bytes),
			       PER_PARAM(r, a, optim_nvme_read_bytes),
			       PER_PARAM(r, a, grad_nvme_read_bytes),
			       PER_PARAM(r, a, nvme_write_bytes),
			       PER_PARAM(r, a, param_nvme_write_bytes),
			       PER_PARAM(r, a, optim_nvme_write_bytes),
			       PER_PARAM(r, a, grad_nvme_write_bytes));
		}
		if (c->clip > 0) {
			const struct sample *l = &a->s[c->steps - 1];
			printf("    last step: %u of %u sub-groups stepped during backward, %u "
			       "rolled "
			       "back\n",
			       l->es.stepped_during_backward, l->es.sub_groups, l->es.rolled_back);
		}
	}
	if (c->checkpoint) {
		cli_size_str(sz, sizeof(sz), r->ck_bytes);
		printf("  checkpoint (%s, rank 0's %s): save %.3f s (median of %d), load %.3f s; "
		       "bound %.3f s (one write%s of the state at the rate measured there); "
		       "efficiency %.3f\n",
		       c->checkpoint, sz, r->ck_save_s, CK_ROUNDS, r->ck_load_s, r->ck_bound_s,
		       c->off_optim == ZINF_OFFLOAD_NVME ? " and one read" : "",
		       r->ck_save_s > 0 ? r->ck_bound_s / r->ck_save_s : 0);
		printf("  background save: the call %.3f s, the step after it %.3f s (a plain step "
		       "%.3f s): %.3f s of the %.3f s save hidden\n",
		       r->ck_bg_call_s, r->ck_bg_step_s, r->ck_plain_step_s, r->ck_hidden_s,
		       r->ck_save_s);
	}
	cli_size_str(sz, sizeof(sz), rss_peak_bytes());
	printf("  peak RSS %s\n", sz);
}

/* ---- set-up and the run -------------------------------------------------------------------- */

/* Option combinations the engine would refuse, said in the CLI's terms (exit 2). */
static int
check_cfg(const struct cfg *c, char *err, size_t n)
{
	if (c->off_param != ZINF_OFFLOAD_NONE && c->stage != 3) {
		snprintf(err, n,
			 "--offload-param %s needs --stage 3 (only ZeRO-3 partitions the "
			 "parameters)",
			 tiers[c->off_param]);
		return -EINVAL;
	}
	if (c->off_optim != ZINF_OFFLOAD_NONE && c->stage == 0) {
		snprintf(err, n, "--offload-optimizer %s needs --stage 1 or above",
			 tiers[c->off_optim]);
		return -EINVAL;
	}
	if (c->compare && c->no_sdb) {
		snprintf(err, n,
			 "--compare runs step_during_backward off against on: drop "
			 "--no-step-during-backward");
		return -EINVAL;
	}
	return 0;
}

static int
setup(struct run *r)
{
	const struct cfg *c = r->c;
	char base[CLI_PREFIX_MAX];
	cli_scratch_prefix(base, sizeof(base), SCRATCH_STEM);
	r->narms = c->compare ? 2 : 1;
	r->arm[0].sdb = !c->no_sdb;
	r->arm[1].sdb = false;
	for (uint32_t k = 0; k < r->narms; k++) {
		struct arm *a = &r->arm[k];
		a->label = a->sdb ? "step during backward" : "step after backward";
		snprintf(a->prefix, sizeof(a->prefix), "%s%s", base, k ? "-b" : "");
	}
	int rc = arm_open(r, &r->arm[0], NULL);
	if (rc) {
		return rc;
	}
	r->dev = zinf_engine_device(r->arm[0].e);
	r->rank = zinf_engine_rank(r->arm[0].e);
	r->world = zinf_engine_world(r->arm[0].e);
	if (r->narms > 1 && (rc = arm_open(r, &r->arm[1], r->dev))) {
		return rc;
	}
	size_t bytes = 4 * c->hidden * c->hidden * zinf_dtype_size(dtype_of[c->dtype]);
	if ((rc = zinf_device_alloc(r->dev, bytes, &r->dev_grad))) {
		return fail_call(r, "allocating the gradient buffer", rc);
	}
	struct zinf_stream *cs = zinf_engine_compute_stream(r->arm[0].e);
	if ((rc = zinf_device_fill(cs, r->dev_grad, dtype_of[c->dtype], GRAD_VALUE,
				   4 * c->hidden * c->hidden)) ||
	    (rc = zinf_stream_sync(cs))) {
		return fail_call(r, "filling the gradient buffer", rc);
	}
	return 0;
}

static void
teardown(struct run *r)
{
	if (r->dev_grad) {
		zinf_device_free(r->dev, r->dev_grad);
	}
	/* The second arm runs on the first one's device (and, under MPI, the first one's comm
	 * joined MPI): it goes first. */
	for (uint32_t k = 2; k-- > 0;) {
		zinf_engine_destroy(r->arm[k].e);
		free(r->arm[k].ids);
		free(r->arm[k].s);
	}
}

/* Warm-up steps, then the timed ones, the arms interleaved step by step, then the disk. */
static int
bench(struct run *r)
{
	const struct cfg *c = r->c;
	int rc = setup(r);
	struct sample w;
	for (uint32_t i = 0; i < c->warmup && rc == 0 && !cli_interrupted; i++) {
		for (uint32_t k = 0; k < r->narms && rc == 0; k++) {
			rc = arm_step(r, &r->arm[k], &w);
		}
	}
	uint64_t most = 0;
	for (uint32_t i = 0; i < c->steps && rc == 0 && !cli_interrupted; i++) {
		for (uint32_t k = 0; k < r->narms && rc == 0; k++) {
			/* Alternate which arm goes first, so neither always follows the other. */
			struct arm *a = &r->arm[(k + i) % r->narms];
			rc = arm_step(r, a, &a->s[i]);
			most = rc == 0 ? ZINF_MAX(most, nvme_bytes(&a->s[i])) : most;
		}
	}
	if (rc == 0 && cli_interrupted) {
		rc = -EINTR;
	}
	if (rc == 0 && r->nvme) {
		rc = measure_disk(r, most / 2);
	}
	if (rc == 0 && c->checkpoint) {
		rc = measure_checkpoint(r);
	}
	for (uint32_t k = 0; k < r->narms && rc == 0; k++) {
		finish_samples(r, &r->arm[k]);
	}
	return rc;
}

int
cli_bench_engine(int argc, char **argv)
{
	bool quiet = cli_launcher_rank() != 0; /* under mpirun: one report of an option error */
	char err[512];
	int rc = cli_opts_parse(opts, argc, argv, err, sizeof(err));
	if (rc == CLI_PARSE_HELP) {
		if (!quiet) {
			cli_opts_help(stdout, PROG, synopsis, description, opts);
		}
		return 0;
	}
	struct cfg c = cfg;
	if (rc < 0 || check_cfg(&c, err, sizeof(err))) {
		if (!quiet) {
			fprintf(stderr, "%s: %s\nRun `%s --help` for the options.\n", PROG, err,
				PROG);
		}
		return 2;
	}
	struct run r = {.c = &c, .rank = cli_launcher_rank(), .world = 1};
	r.nvme = c.off_param == ZINF_OFFLOAD_NVME || c.off_optim == ZINF_OFFLOAD_NVME;
	cli_catch_signals();
	for (unsigned i = 0; r.nvme && i < c.paths.n; i++) {
		r.made_dir[i] = mkdir(c.paths.v[i], 0700) == 0;
		if (r.rank == 0) {
			(void)cli_reclaim_scratch(PROG, c.paths.v[i], SCRATCH_STEM);
		}
	}
	rc = bench(&r);
	if (rc == 0 && r.rank == 0) {
		if (c.json) {
			rc = report_json(&r);
		} else {
			report_human(&r);
		}
	}
	teardown(&r);
	for (unsigned i = 0; r.nvme && i < c.paths.n; i++) {
		if (r.made_dir[i]) {
			rmdir(c.paths.v[i]); /* empty unless another rank still has files there */
		}
	}
	if (cli_interrupted) {
		fprintf(stderr, PROG ": interrupted (signal %d); files removed\n",
			(int)cli_interrupted);
		return cli_interrupt_status();
	}
	return rc == 0 ? 0 : 1;
}
