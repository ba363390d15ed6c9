/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli/config_check.c: `zinf config check FILE`: read a ds_config.json as the trainer will
 * (zinf/config.h, "auto" through the library's one resolver, what only the trainer knows listed
 * as unresolved with the flag that gives it), print the resolved configuration, run the engine's
 * own checks on its options (zinf_engine_opts_check, on the paths zinf_gpt would use) and, given
 * the model's size, the memory plan of each rank: GPU bytes (16-bit parameters, gradient buckets
 * and the fp32 gradient partition, optimizer state, gathered parameters), pinned host bytes (the
 * swap buffers and CPU-tier partitions, against RLIMIT_MEMLOCK and physical memory) and NVMe
 * bytes per path (against the free space of each path). Exit 0 when the file reads, the engine
 * accepts it and the plan fits this machine; 1 when the plan does not fit (each resource over
 * named); 2 when the file has errors or the engine refuses it (every one printed, by the
 * library).
 *
 * The plan's model is layers shaped as zinf bench engine's; zinf_engine_plan lays it out with
 * the engine's code and sizes the engine's pinned pools with the engine's code (the pinned total
 * is the run's host_pool_bytes); GPU and NVMe bytes are estimated from that layout.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>

#include "cli/cli.h"
#include "zinf/config.h"
#include "zinf/blocks/offload.h"

#define PROG "zinf config check"

/* Most layers the plan registers (each a zinf_engine_add_param per tensor). */
#define PLAN_MAX_LAYERS 4096

struct cfg {
	int world;
	uint64_t params, hidden, layers;
	bool json;
	const char *nvme_path, *scratch_parent, *hf_config;
	bool given_hidden, given_params;
	/* the trainer's values for "auto"; an option not given leaves its input "not given", which
	   the library's resolver takes as Hugging Face's TrainingArguments default */
	int64_t micro_batch, grad_accum, warmup_steps, total_steps;
	double lr, beta1, beta2, eps, weight_decay, max_grad_norm;
	int precision;
	bool given_world, given_micro, given_accum, given_warmup, given_total, given_lr,
		given_beta1, given_beta2, given_eps, given_wd, given_clip, given_precision;
};

static struct cfg cfg;

static const char synopsis[] =
	"FILE [--world N] [--hidden H] [--params N | --layers L] [--hf-config FILE]\n"
	"       [--total-steps N] [--json]";
static const char description[] =
	"Read a DeepSpeed ds_config.json as zinf will, print it resolved (each \"auto\" with its\n"
	"value, as the Hugging Face Trainer resolves it: from the options below, else from\n"
	"TrainingArguments' defaults), run the engine's checks on its options and, with --hidden\n"
	"and --params or --layers, the memory plan of each rank: GPU, pinned host memory (the\n"
	"engine's own sizes; against RLIMIT_MEMLOCK and physical memory) and NVMe per path\n"
	"(against its free space). An \"auto\" that needs what only the trainer knows (its steps,\n"
	"the model's hidden size, the world size) is listed as unresolved with the option that\n"
	"gives it, and the check goes on. Exit 0: it reads and fits (unresolved values are the\n"
	"trainer's to give); 1: the plan does not fit (what is over is named); 2: the file has\n"
	"errors or the engine refuses it (all are printed).\n";

static const struct cli_opt opts[] = {
	{"world", CLI_INT, &cfg.world, NULL, "N",
	 "data-parallel ranks (GPUs in all); not given: derived from the batch keys where they\n"
	 "fix it, else unresolved (and the plan is for one rank)",
	 .min = 1, .max = 1 << 24, .given = &cfg.given_world},
	{"params", CLI_COUNT, &cfg.params, "0", "N",
	 "the memory plan for a model of N parameters: layers of hidden --hidden, shaped as\n"
	 "zinf bench engine's (12 H^2 + 6 H parameters each)",
	 .max = 1e15, .given = &cfg.given_params},
	{"hf-config", CLI_STR, &cfg.hf_config, NULL, "FILE",
	 "a Hugging Face config.json (or its directory): its hidden size for \"auto\" and its\n"
	 "parameter count for the plan (gpt2, llama, mistral, qwen2)"},
	{"layers", CLI_COUNT, &cfg.layers, "0", "L",
	 "the memory plan for L such layers (instead of --params)", .max = PLAN_MAX_LAYERS},
	{"hidden", CLI_COUNT, &cfg.hidden, "0", "H",
	 "the model's hidden size: \"auto\" bucket sizes, and the plan's layers (0: not given)",
	 .max = 1e7, .given = &cfg.given_hidden},
	{"total-steps", CLI_COUNT, &cfg.total_steps, "0", "N",
	 "\"auto\": the trainer's training steps (scheduler total_num_steps; 0: not given)",
	 .max = 1e12, .given = &cfg.given_total},
	{"micro-batch", CLI_COUNT, &cfg.micro_batch, NULL, "N",
	 "\"auto\": the trainer's per_device_train_batch_size (default: Hugging Face's)", .min = 1,
	 .max = 1e9, .given = &cfg.given_micro},
	{"grad-accum", CLI_COUNT, &cfg.grad_accum, NULL, "N",
	 "\"auto\": the trainer's gradient_accumulation_steps (default: Hugging Face's)", .min = 1,
	 .max = 1e9, .given = &cfg.given_accum},
	{"lr", CLI_DOUBLE, &cfg.lr, NULL, "LR",
	 "\"auto\": the trainer's learning_rate (default: Hugging Face's)", .min = 0, .max = 1e3,
	 .given = &cfg.given_lr},
	{"beta1", CLI_DOUBLE, &cfg.beta1, NULL, "B1",
	 "\"auto\": the trainer's adam_beta1 (default: Hugging Face's)", .min = 0, .max = 1,
	 .given = &cfg.given_beta1},
	{"beta2", CLI_DOUBLE, &cfg.beta2, NULL, "B2",
	 "\"auto\": the trainer's adam_beta2 (default: Hugging Face's)", .min = 0, .max = 1,
	 .given = &cfg.given_beta2},
	{"eps", CLI_DOUBLE, &cfg.eps, NULL, "E",
	 "\"auto\": the trainer's adam_epsilon (default: Hugging Face's)", .min = 0, .max = 1,
	 .given = &cfg.given_eps},
	{"weight-decay", CLI_DOUBLE, &cfg.weight_decay, NULL, "WD",
	 "\"auto\": the trainer's weight_decay (default: Hugging Face's)", .min = 0, .max = 1e3,
	 .given = &cfg.given_wd},
	{"max-grad-norm", CLI_DOUBLE, &cfg.max_grad_norm, NULL, "N",
	 "\"auto\": the trainer's max_grad_norm, gradient_clipping (default: Hugging Face's)",
	 .min = 0, .max = 1e9, .given = &cfg.given_clip},
	{"precision", CLI_ENUM, &cfg.precision, NULL, "fp32|fp16|bf16",
	 "\"auto\": the trainer's fp16/bf16 flags (default: Hugging Face's, fp32)",
	 .choices = (const char *const[]){"fp32", "fp16", "bf16", NULL},
	 .given = &cfg.given_precision},
	{"warmup-steps", CLI_COUNT, &cfg.warmup_steps, NULL, "N",
	 "\"auto\": the trainer's warmup_steps (default: Hugging Face's)", .max = 1e12,
	 .given = &cfg.given_warmup},
	{"nvme-path", CLI_STR, &cfg.nvme_path, NULL, "DIR",
	 "check DIR for every nvme_path (as zinf_gpt --nvme-path runs it)"},
	{"scratch-parent", CLI_STR, &cfg.scratch_parent, ".", "DIR",
	 "an nvme_path \"scratch\" is zinf_gpt's scratch directory, made under DIR: DIR is\n"
	 "checked (as zinf_gpt --scratch-parent)"},
	{"json", CLI_FLAG, &cfg.json, NULL, NULL, "one JSON object on stdout"},
	{NULL},
};

/* A configuration's nvme_path with this value is zinf_gpt's scratch directory, which it makes
   under --scratch-parent (examples/gpt/gpt.c). */
#define GPT_SCRATCH_PATH "scratch"

/* The paths the trainer will use: --nvme-path for all, "scratch" as the directory it is made
   in. The strings stay the caller's (argv, the config). */
static void
trainer_paths(struct zinf_engine_opts *eo, const struct cfg *c)
{
	struct zinf_offload_opts *sec[2] = {&eo->offload_param, &eo->offload_optimizer};
	for (int k = 0; k < 2; k++) {
		for (uint32_t i = 0; i < sec[k]->n_paths; i++) {
			if (c->nvme_path) {
				sec[k]->nvme_path[i] = c->nvme_path;
			} else if (strcmp(sec[k]->nvme_path[i], GPT_SCRATCH_PATH) == 0) {
				sec[k]->nvme_path[i] = c->scratch_parent;
			}
		}
	}
}

/* The option that gives an input the resolver found missing. */
static const char *
input_flag(enum zinf_config_input in)
{
	switch (in) {
	case ZINF_CONFIG_IN_WORLD_SIZE:
		return "--world N (the number of data-parallel ranks)";
	case ZINF_CONFIG_IN_HIDDEN_SIZE:
		return "--hidden H (the model's hidden size)";
	case ZINF_CONFIG_IN_TOTAL_STEPS:
		return "--total-steps N (the trainer's training steps)";
	}
	return "?";
}

/* One line of the plan: what, where, bytes. */
struct item {
	const char *tier; /* "gpu", "pinned", "nvme" */
	const char *what;
	double bytes;
	const char *path; /* nvme: the directory */
};

struct plan {
	struct item it[24];
	int n;
	double gpu, pinned, host;
	bool pinned_locked; /* some pinned memory is page-locked (pin_memory) */
	uint64_t params, layers;
	struct zinf_engine_plan engine; /* the engine's own sizes (zinf_engine_plan) */
};

static void
add(struct plan *p, const char *tier, const char *what, double bytes, const char *path)
{
	if (bytes <= 0 || p->n >= (int)(sizeof(p->it) / sizeof(p->it[0]))) {
		return;
	}
	p->it[p->n++] = (struct item){tier, what, bytes, path};
	if (strcmp(tier, "gpu") == 0) {
		p->gpu += bytes;
	} else if (strcmp(tier, "pinned") == 0) {
		p->pinned += bytes;
	}
}

/* The model the plan lays out: the synthetic transformer `zinf bench engine` drives (per layer
 * qkv 3 H^2, proj H^2, fc1 4 H^2, fc2 4 H^2 and six vectors of H: two norms' weight and bias,
 * the proj and fc2 biases), in its registration order. */
static const struct {
	const char *name;
	uint32_t h2, h;
} layer_params[] = {
	{"ln1.weight", 0, 1},	  {"ln1.bias", 0, 1},	  {"attn.qkv", 3, 0}, {"attn.proj", 1, 0},
	{"attn.proj.bias", 0, 1}, {"ln2.weight", 0, 1},	  {"ln2.bias", 0, 1}, {"mlp.fc1", 4, 0},
	{"mlp.fc2", 4, 0},	  {"mlp.fc2.bias", 0, 1},
};
#define NLAYER_PARAMS (sizeof(layer_params) / sizeof(layer_params[0]))

static uint64_t
layer_numel(uint64_t h)
{
	return 12 * h * h + 6 * h;
}

/* The model's tensors (names in *names, NLAYER_PARAMS x layers of 48 bytes), or NULL. */
static struct zinf_param_desc *
model_descs(uint64_t layers, uint64_t h, char **names)
{
	uint32_t n = (uint32_t)(layers * NLAYER_PARAMS);
	struct zinf_param_desc *d = calloc(n, sizeof(*d));
	*names = calloc(n, 48);
	if (!d || !*names) {
		free(d);
		free(*names);
		*names = NULL;
		return NULL;
	}
	for (uint32_t i = 0; i < n; i++) {
		uint32_t l = i / NLAYER_PARAMS, j = i % NLAYER_PARAMS;
		zinf_param_desc_init(&d[i]);
		snprintf(*names + 48 * (size_t)i, 48, "layer%u.%s", l, layer_params[j].name);
		d[i].name = *names + 48 * (size_t)i;
		d[i].numel = layer_params[j].h2 * h * h + layer_params[j].h * h;
		d[i].layer = (int32_t)l;
	}
	return d;
}

/*
 * The plan of each rank. Host memory is the engine's own: zinf_engine_plan lays the model out
 * and sizes every pool with the code the engine allocates them with (what the run's
 * host_pool_bytes will be). GPU and NVMe bytes are estimated from that layout (partitions,
 * buckets, sub-groups) in closed form.
 */
static int
make_plan(const struct zinf_engine_opts *e, const struct cfg *c, struct plan *p)
{
	struct zinf_optimizer *opt = NULL;
	struct zinf_engine_plan ep = {.size = sizeof(ep)};
	char *names = NULL;
	uint64_t h = c->hidden, layers = c->layers;
	if (!layers) {
		layers = (c->params + layer_numel(h) - 1) / layer_numel(h);
	}
	if (layers > PLAN_MAX_LAYERS) {
		fprintf(stderr,
			PROG ": the plan's model: %" PRIu64 " layers of hidden %" PRIu64
			     " (more than %d): give the model's real --hidden\n",
			layers, h, PLAN_MAX_LAYERS);
		return -EINVAL;
	}
	struct zinf_param_desc *d = model_descs(layers, h, &names);
	int rc = d ? zinf_engine_plan(e, c->world, 0, d, (uint32_t)(layers * NLAYER_PARAMS), &ep)
		   : -ENOMEM;
	free(d);
	free(names);
	if (!rc) {
		rc = zinf_optimizer_create(&e->optimizer, &opt);
	}
	if (rc) {
		fprintf(stderr, PROG ": the plan: %s\n", zinf_strerror(rc));
		return rc;
	}
	double P = (double)(layers * layer_numel(h)), W = e->stage >= 1 ? c->world : 1;
	double part = (double)ep.partition_elems, b16 = (double)zinf_dtype_size(e->dtype);
	/* the state's bytes per element: q8's scales (a fraction of a byte) included */
	double K = part > 0 ? (double)zinf_optimizer_state_size(opt, (uint64_t)part) / part
			    : zinf_optimizer_state_bytes(opt);
	enum zinf_offload_device od = e->offload_optimizer.device;
	enum zinf_offload_device pd = e->stage == 3 ? e->offload_param.device : ZINF_OFFLOAD_NONE;
	memset(p, 0, sizeof(*p));
	p->params = (uint64_t)P;
	p->layers = layers;
	p->engine = ep;

	/* GPU, estimated from the engine's layout */
	if (e->stage <= 2) {
		add(p, "gpu", "16-bit parameters (all)", P * b16, NULL);
	} else {
		if (pd == ZINF_OFFLOAD_NONE) {
			add(p, "gpu", "16-bit parameter partitions", part * b16, NULL);
		}
		add(p, "gpu", "gathered parameters (stage3_max_live_parameters)",
		    fmin((double)e->stage3_max_live_parameters, P) * b16, NULL);
	}
	add(p, "gpu", "gradient buckets (2 x the engine's bucket, fp32)",
	    2 * (double)ep.bucket_elems * 4, NULL);
	if (e->stage >= 2 && W > 1) {
		add(p, "gpu", "reduce-scatter receive buffers (2 x bucket / world, fp32)",
		    2 * floor((double)ep.bucket_elems / W) * 4, NULL);
	}
	if (od == ZINF_OFFLOAD_NONE) {
		add(p, "gpu", "fp32 gradient partition", part * 4, NULL);
		add(p, "gpu", "optimizer state (fp32 master and moments)", part * K, NULL);
		add(p, "gpu", "speculative step reserve (buffer_count x one sub-group's state)",
		    (double)ep.speculation_bytes, NULL);
	}

	/* pinned host memory: the engine's pools, sized by the engine's code */
	if (ep.param_pool_bytes) {
		/* nvme: the buffers, and the cache in the pool's CPU region (max_in_cpu) */
		double bufs = (double)ep.param_buffers * (double)ep.param_buffer_bytes;
		bool nv = pd == ZINF_OFFLOAD_NVME;
		add(p, "pinned",
		    nv ? "parameter swap buffers (offload_param pool: buffer_count x the largest "
			 "partition)"
		       : "16-bit parameter partitions (offload_param pool)",
		    nv ? bufs : (double)ep.param_pool_bytes, NULL);
		if (nv) {
			add(p, "pinned",
			    "16-bit parameter cache (offload_param pool: max_in_cpu elements, at "
			    "most the partitions)",
			    (double)ep.param_pool_bytes - bufs, NULL);
		}
		p->pinned_locked |= e->offload_param.pin_memory;
	}
	if (ep.optim_pool_bytes) {
		add(p, "pinned",
		    od == ZINF_OFFLOAD_NVME
			    ? "optimizer swap buffers (offload_optimizer pool: buffer_count x one "
			      "sub-group, staging, speculative step reserve)"
			    : "optimizer state and fp32 gradient partition (offload_optimizer "
			      "pool, "
			      "with staging and speculative step reserve)",
		    (double)ep.optim_pool_bytes, NULL);
		p->pinned_locked |= e->offload_optimizer.pin_memory;
	}
	if (ep.grad_window_bytes) {
		add(p, "pinned", "gradient window (offload_optimizer: one sub-group per slot)",
		    (double)ep.grad_window_bytes, NULL);
		p->pinned_locked |= e->offload_optimizer.pin_memory;
	}
	/* NVMe, striped over each section's paths (the optimizer's swap space also holds the
	   gradients that leave the window) */
	if (od == ZINF_OFFLOAD_NVME) {
		for (uint32_t i = 0; i < e->offload_optimizer.n_paths; i++) {
			/* the state as the engine declares it (a shared bf16 master is in the
			   parameters' home) */
			add(p, "nvme", "optimizer state and gradients",
			    ((double)ep.optim_nvme_state_bytes + part * 4) /
				    e->offload_optimizer.n_paths,
			    e->offload_optimizer.nvme_path[i]);
		}
	}
	if (pd == ZINF_OFFLOAD_NVME) {
		for (uint32_t i = 0; i < e->offload_param.n_paths; i++) {
			add(p, "nvme", "16-bit parameter partitions",
			    part * b16 / e->offload_param.n_paths, e->offload_param.nvme_path[i]);
		}
	}
	zinf_optimizer_destroy(opt);
	return 0;
}

/* Check the plan against this machine; print one line per resource over. Returns 0 or 1. */
static int
check_plan(const struct plan *p, const struct cfg *c, json_t *checks)
{
	int over = 0;
	double phys = (double)cli_phys_memory();
	/* the pool's own rule: RLIMIT_MEMLOCK binds unless the process may lock memory anyway */
	struct zinf_pool_opts po;
	zinf_pool_opts_init(&po);
	po.cpu_bytes = 4096;
	struct zinf_pool_budget bud;
	zinf_pool_check(&po, &bud);
	double memlock = !bud.memlock_binding || bud.memlock_limit == UINT64_MAX
				 ? INFINITY
				 : (double)bud.memlock_limit;
	/* every rank of this node pins its own: count the ranks as if all were here */
	double ranks_here = c->world;
	char a[32], b[32];
	if (p->pinned_locked && p->pinned > memlock) {
		cli_size_str(a, sizeof(a), (uint64_t)p->pinned);
		cli_size_str(b, sizeof(b), (uint64_t)memlock);
		fprintf(stderr,
			PROG
			": pinned memory: %s per rank, over RLIMIT_MEMLOCK (%s): raise `ulimit "
			"-l`, or set pin_memory false, or lower buffer_count\n",
			a, b);
		over = 1;
	}
	json_array_append_new(checks,
			      json_pack("{s:s, s:f, s:o, s:b}", "what", "pinned_vs_memlock",
					"bytes", p->pinned, "limit", cli_json_real(memlock), "fits",
					!(p->pinned_locked && p->pinned > memlock)));
	if (p->pinned * ranks_here > 0.9 * phys) {
		cli_size_str(a, sizeof(a), (uint64_t)(p->pinned * ranks_here));
		cli_size_str(b, sizeof(b), (uint64_t)phys);
		fprintf(stderr,
			PROG ": pinned memory: %s for %d rank(s), more than 90%% of this machine's "
			     "%s\n",
			a, c->world, b);
		over = 1;
	}
	json_array_append_new(checks,
			      json_pack("{s:s, s:f, s:f, s:b}", "what", "pinned_vs_physical",
					"bytes", p->pinned * ranks_here, "limit", 0.9 * phys,
					"fits", p->pinned * ranks_here <= 0.9 * phys));
	for (int i = 0; i < p->n; i++) {
		const struct item *it = &p->it[i];
		bool first = strcmp(it->tier, "nvme") == 0;
		for (int k = 0; first && k < i; k++) {
			first = !(strcmp(p->it[k].tier, "nvme") == 0 &&
				  strcmp(p->it[k].path, it->path) == 0);
		}
		if (!first) {
			continue;
		}
		/* what every rank of this node writes under the path (each its own files) */
		double need = 0;
		for (int k = i; k < p->n; k++) {
			if (strcmp(p->it[k].tier, "nvme") == 0 &&
			    strcmp(p->it[k].path, it->path) == 0) {
				need += p->it[k].bytes * ranks_here;
			}
		}
		struct statvfs v;
		json_t *j = json_pack("{s:s, s:s, s:f}", "what", "nvme_free_space", "path",
				      it->path, "bytes", need);
		if (statvfs(it->path, &v) != 0) {
			fprintf(stderr,
				PROG ": %s: %s (the plan needs it on the machines that run)\n",
				it->path, strerror(errno));
			json_object_set_new(j, "error", json_string(strerror(errno)));
			json_object_set_new(j, "fits", json_false());
			over = 1;
		} else {
			double avail = (double)v.f_bavail * (double)v.f_frsize;
			json_object_set_new(j, "limit", json_real(avail));
			json_object_set_new(j, "fits", json_boolean(need <= avail));
			if (need > avail) {
				cli_size_str(a, sizeof(a), (uint64_t)need);
				cli_size_str(b, sizeof(b), (uint64_t)avail);
				fprintf(stderr, PROG ": %s: %s needed for %d rank(s), %s free\n",
					it->path, a, c->world, b);
				over = 1;
			}
		}
		json_array_append_new(checks, j);
	}
	return over;
}

static void
print_plan(const struct plan *p, const struct cfg *c)
{
	char s[32];
	printf("memory plan per rank (%" PRIu64 " parameters: %" PRIu64 " layers of hidden %" PRIu64
	       ", %d rank(s); host memory: the engine's own sizes):\n",
	       p->params, p->layers, c->hidden, c->world);
	for (int i = 0; i < p->n; i++) {
		cli_size_str(s, sizeof(s), (uint64_t)p->it[i].bytes);
		printf("  %-7s %12s  %s%s%s\n", p->it[i].tier, s, p->it[i].what,
		       p->it[i].path ? " in " : "", p->it[i].path ? p->it[i].path : "");
	}
	cli_size_str(s, sizeof(s), (uint64_t)p->gpu);
	printf("  GPU total %s", s);
	cli_size_str(s, sizeof(s), (uint64_t)p->pinned);
	printf(", pinned host total %s\n", s);
}

static int
cli_config_check(int argc, char **argv)
{
	/* FILE is the one positional argument: take it out, parse the options around it. */
	char *rest[CLI_MAX_ARGS + 1];
	int n;
	const char *file = cli_take_positional(opts, argc, argv, rest, &n);
	if (n < 0) {
		fprintf(stderr, PROG ": more than %d arguments\n", CLI_MAX_ARGS);
		return 2;
	}
	int rc = cli_opts_main(PROG, synopsis, description, opts, n, rest);
	if (rc >= 0) {
		return rc;
	}
	if (!file) {
		fprintf(stderr, PROG ": FILE is required\nrun `" PROG " --help`\n");
		return 2;
	}
	struct cfg c = cfg;
	if (c.hf_config) { /* the model's hidden size and parameters; a flag given wins */
		struct zinf_hf_model m = {.size = sizeof(m)};
		if (zinf_hf_model_read(c.hf_config, &m) < 0) {
			fprintf(stderr, PROG ": --hf-config %s: %s\n", c.hf_config,
				zinf_last_error());
			return 2;
		}
		c.hidden = c.given_hidden ? c.hidden : m.hidden;
		c.params = c.given_params || c.layers ? c.params : m.params;
		if (!c.json) {
			printf("%s (%s): hidden %llu, %llu parameters\n", c.hf_config, m.model_type,
			       (unsigned long long)m.hidden, (unsigned long long)m.params);
		}
	}
	struct zinf_config_inputs in;
	zinf_config_inputs_init(&in); /* what is not given below stays "not given" */
	in.flags = ZINF_CONFIG_UNRESOLVED_OK;
	in.world_size = c.given_world ? c.world : 0;
	in.hidden_size = c.hidden;
	in.total_num_steps = c.total_steps > 0 ? c.total_steps : -1;
	in.micro_batch = c.given_micro ? c.micro_batch : 0;
	in.grad_accum = c.given_accum ? c.grad_accum : 0;
	in.warmup_num_steps = c.given_warmup ? c.warmup_steps : -1;
	in.lr = c.given_lr ? c.lr : NAN;
	in.beta1 = c.given_beta1 ? c.beta1 : NAN;
	in.beta2 = c.given_beta2 ? c.beta2 : NAN;
	in.eps = c.given_eps ? c.eps : NAN;
	in.weight_decay = c.given_wd ? c.weight_decay : NAN;
	in.max_grad_norm = c.given_clip ? c.max_grad_norm : NAN;
	in.fp16 = c.given_precision ? c.precision == 1 : -1;
	in.bf16 = c.given_precision ? c.precision == 2 : -1;
	struct zinf_train_config tc;
	zinf_config_init(&tc);
	rc = zinf_config_read_file(file, &in, &tc);
	if (rc) {
		/* the reader printed every error through the log */
		if (c.json) {
			cli_json_print(json_pack("{s:s, s:b, s:s}", "file", file, "ok", 0, "error",
						 strerror(-rc)),
				       0);
		}
		return 2;
	}
	char *dump = NULL;
	rc = zinf_config_dump(&tc, &dump);
	if (rc) {
		fprintf(stderr, PROG ": %s: %s\n", file, strerror(-rc));
		zinf_config_fini(&tc);
		return 2;
	}
	/* the world size the plan is for: given, derived from the batch keys, else one rank */
	bool world_known = tc.world_size > 0;
	c.world = world_known ? tc.world_size : 1;
	json_t *resolved = json_array(), *unresolved = json_array();
	for (uint32_t i = 0; i < tc.n_resolved; i++) {
		const struct zinf_config_resolved *r = &tc.resolved[i];
		json_array_append_new(resolved, json_pack("{s:s, s:s, s:s, s:b}", "path", r->path,
							  "value", r->value, "from", r->input,
							  "default", r->defaulted));
	}
	for (uint32_t i = 0; i < tc.n_unresolved; i++) {
		const struct zinf_config_unresolved *u = &tc.unresolved[i];
		json_array_append_new(unresolved, json_pack("{s:s, s:s}", "path", u->path, "give",
							    input_flag(u->input)));
	}
	/* the engine's own checks, as zinf_engine_create and zinf_engine_init will make them
	   (the I/O options, every nvme_path): each problem logged by the library */
	struct zinf_engine_opts eo = tc.engine;
	trainer_paths(&eo, &c);
	int refused = zinf_engine_opts_check(&eo);
	struct plan plan;
	json_t *checks = json_array();
	int over = 0;
	bool planned = c.params > 0 || c.layers > 0;
	if (planned) {
		if (c.hidden == 0) {
			fprintf(stderr, PROG ": the memory plan needs --hidden H (the shape of the "
					     "model's layers)\n");
		}
		rc = c.hidden ? make_plan(&eo, &c, &plan) : -EINVAL;
		if (rc) {
			free(dump);
			json_decref(resolved);
			json_decref(unresolved);
			json_decref(checks);
			zinf_config_fini(&tc);
			return 2;
		}
		over = check_plan(&plan, &c, checks);
	}
	if (c.json) {
		json_error_t jerr;
		json_t *o = json_object();
		json_object_set_new(o, "file", json_string(file));
		json_object_set_new(o, "ok", json_boolean(!over && !refused));
		json_object_set_new(o, "engine_check",
				    json_string(refused ? zinf_strerror(refused) : "ok"));
		json_object_set_new(o, "config", json_loads(dump, 0, &jerr));
		json_object_set_new(o, "resolved", resolved);
		json_object_set_new(o, "unresolved", unresolved);
		json_object_set_new(o, "world", world_known ? json_integer(c.world) : json_null());
		if (planned) {
			json_t *items = json_array();
			for (int i = 0; i < plan.n; i++) {
				json_t *it = json_pack("{s:s, s:s, s:f}", "tier", plan.it[i].tier,
						       "what", plan.it[i].what, "bytes",
						       plan.it[i].bytes);
				if (plan.it[i].path) {
					json_object_set_new(it, "path",
							    json_string(plan.it[i].path));
				}
				json_array_append_new(items, it);
			}
			const struct zinf_engine_plan *ep = &plan.engine;
			json_t *eng =
				json_pack("{s:I, s:I, s:I, s:I, s:i, s:I, s:I, s:I, s:I}",
					  "host_pool_bytes", (json_int_t)ep->host_pool_bytes,
					  "param_pool_bytes", (json_int_t)ep->param_pool_bytes,
					  "optim_pool_bytes", (json_int_t)ep->optim_pool_bytes,
					  "grad_window_bytes", (json_int_t)ep->grad_window_bytes,
					  "sub_groups", (int)ep->sub_groups, "partition_elems",
					  (json_int_t)ep->partition_elems, "max_sub_group_elems",
					  (json_int_t)ep->max_sub_group_elems, "bucket_elems",
					  (json_int_t)ep->bucket_elems, "speculation_bytes",
					  (json_int_t)ep->speculation_bytes);
			json_object_set_new(
				o, "plan",
				json_pack("{s:i, s:I, s:I, s:I, s:f, s:f, s:o, s:o, s:o}", "world",
					  c.world, "params", (json_int_t)plan.params, "layers",
					  (json_int_t)plan.layers, "hidden", (json_int_t)c.hidden,
					  "gpu_bytes", plan.gpu, "pinned_bytes", plan.pinned,
					  "engine", eng, "items", items, "checks", checks));
		} else {
			json_decref(checks);
		}
		cli_json_print(o, 2);
	} else {
		printf("%s: resolved configuration:\n%s\n", file, dump);
		uint32_t i;
		for (i = 0; i < tc.n_resolved; i++) {
			const struct zinf_config_resolved *rv = &tc.resolved[i];
			printf("auto: %s = %s (%s%s)\n", rv->path, rv->value, rv->input,
			       rv->defaulted ? ": Hugging Face's default" : "");
		}
		for (i = 0; i < tc.n_unresolved; i++) {
			printf("auto: %s unresolved: the trainer gives it; to check it here, give "
			       "%s\n",
			       tc.unresolved[i].path, input_flag(tc.unresolved[i].input));
		}
		if (tc.world_derived) {
			printf("world size %d (train_batch_size / (micro batch x accumulation))\n",
			       tc.world_size);
		}
		json_decref(resolved);
		json_decref(unresolved);
		json_decref(checks);
		if (planned) {
			print_plan(&plan, &c);
			if (!world_known) {
				printf("  (the world size is not known: the plan is for one rank; "
				       "give --world N)\n");
			}
			if (tc.n_unresolved) {
				printf("  (values left \"auto\" are planned at DeepSpeed's "
				       "defaults)\n");
			}
		} else {
			printf("(give --params N for the memory plan)\n");
		}
		printf("%s\n", refused ? "REFUSED: the engine's checks fail (see above)"
			       : over  ? "does NOT fit this machine (see above)"
				       : "ok");
	}
	free(dump);
	zinf_config_fini(&tc);
	return refused ? 2 : over;
}

const struct cli_cmd cli_config_cmds[] = {
	{"check", "read a ds_config.json, print it resolved and the memory plan per rank",
	 cli_config_check},
	{NULL},
};
