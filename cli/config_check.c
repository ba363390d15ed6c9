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
 * The plan is the engine's layout (engine/README.md; docs/ARCHITECTURE.md, "Where state
 * lives") in closed form: every tensor is partitioned alone, so a rank holds ceil(P / W)
 * elements of each kind plus at most W - 1 elements of padding per tensor, which the plan does
 * not count. Swap buffers are
 * sized as the engine sizes them (zinf_step_buffer_bytes for the optimizer's sub-groups).
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

struct cfg {
	int world;
	uint64_t params, hidden;
	bool json;
	const char *nvme_path, *scratch_parent;
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
	"FILE [--world N] [--params N] [--hidden H] [--total-steps N] [--json]";
static const char description[] =
	"Read a DeepSpeed ds_config.json as zinf will, print it resolved (each \"auto\" with its\n"
	"value, as the Hugging Face Trainer resolves it: from the options below, else from\n"
	"TrainingArguments' defaults) and, with --params, the memory plan of each rank: GPU,\n"
	"pinned host memory (against RLIMIT_MEMLOCK and physical memory) and NVMe per path\n"
	"(against its free space). An \"auto\" that needs what only the trainer knows (its steps,\n"
	"the model's hidden size, the world size) is listed as unresolved with the option that\n"
	"gives it, and the check goes on. Exit 0: it reads and fits (unresolved values are the\n"
	"trainer's to give); 1: the plan does not fit (what is over is named); 2: the file has\n"
	"errors (all are printed).\n";

static const struct cli_opt opts[] = {
	{"world", CLI_INT, &cfg.world, NULL, "N",
	 "data-parallel ranks (GPUs in all); not given: derived from the batch keys where they\n"
	 "fix it, else unresolved (and the plan is for one rank)",
	 .min = 1, .max = 1 << 24, .given = &cfg.given_world},
	{"params", CLI_COUNT, &cfg.params, "0", "N", "model parameters (for the memory plan)",
	 .max = 1e15},
	{"hidden", CLI_COUNT, &cfg.hidden, "0", "H",
	 "\"auto\": the model's hidden size (bucket sizes; 0: not given)", .max = 1e7},
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

/* Never called: it only marks the options as the engine's (the copy goes through copy_fn). */
static int
plan_copy_fn(void *ctx, uint32_t k, const void *copy, uint64_t n)
{
	(void)ctx, (void)k, (void)copy, (void)n;
	return 0;
}

/* Bytes a pool buffer of the optimizer's swapper holds: one sub-group, as the engine sizes it
 * (its step routes the new 16-bit values through the pool's buffers to copy_fn). */
static double
step_buffer_bytes(const struct zinf_engine_opts *e, const struct zinf_optimizer *opt, uint64_t part,
		  bool nvme)
{
	struct zinf_step_opts so;
	zinf_step_opts_init(&so);
	so.n = part;
	so.sub_group_size = e->sub_group_size;
	so.tier = nvme ? ZINF_TIER_NVME : ZINF_TIER_CPU;
	so.optimizer = opt;
	so.copy_dtype = e->dtype;
	so.copy_fn = plan_copy_fn;
	return (double)zinf_step_buffer_bytes(&so, 4096);
}

static int
make_plan(const struct zinf_engine_opts *e, const struct cfg *c, struct plan *p)
{
	struct zinf_optimizer *opt = NULL;
	int rc = zinf_optimizer_create(&e->optimizer, &opt);
	if (rc) {
		fprintf(stderr, PROG ": the optimizer section: %s\n", strerror(-rc));
		return rc;
	}
	double P = (double)c->params, W = e->stage >= 1 ? c->world : 1;
	double part = ceil(P / W), b16 = (double)zinf_dtype_size(e->dtype);
	double K = zinf_optimizer_state_bytes(opt);
	enum zinf_offload_device od = e->offload_optimizer.device;
	enum zinf_offload_device pd = e->stage == 3 ? e->offload_param.device : ZINF_OFFLOAD_NONE;
	memset(p, 0, sizeof(*p));

	/* GPU */
	if (e->stage <= 2) {
		add(p, "gpu", "16-bit parameters (all)", P * b16, NULL);
	} else {
		if (pd == ZINF_OFFLOAD_NONE) {
			add(p, "gpu", "16-bit parameter partitions", part * b16, NULL);
		}
		add(p, "gpu", "gathered parameters (stage3_max_live_parameters)",
		    fmin((double)e->stage3_max_live_parameters, P) * b16, NULL);
	}
	add(p, "gpu", "gradient buckets (2 x reduce_bucket_size, fp32)",
	    2 * fmin((double)e->reduce_bucket_size, P) * 4, NULL);
	if (e->stage >= 2 && W > 1) {
		add(p, "gpu",
		    "reduce-scatter receive buffers (2 x reduce_bucket_size / world, fp32)",
		    2 * floor(fmin((double)e->reduce_bucket_size, P) / W) * 4, NULL);
	}
	if (od == ZINF_OFFLOAD_NONE) {
		add(p, "gpu", "fp32 gradient partition", part * 4, NULL);
		add(p, "gpu", "optimizer state (fp32 master and moments)", part * K, NULL);
	}

	/* pinned host memory */
	double sgb = 0;
	if (od == ZINF_OFFLOAD_CPU) {
		add(p, "pinned", "optimizer state (fp32 master and moments)", part * K, NULL);
		add(p, "pinned", "fp32 gradient partition", part * 4, NULL);
		sgb = step_buffer_bytes(e, opt, (uint64_t)part, false);
	} else if (od == ZINF_OFFLOAD_NVME) {
		add(p, "pinned", "fp32 gradient partition", part * 4, NULL);
		sgb = step_buffer_bytes(e, opt, (uint64_t)part, true);
	}
	if (sgb > 0) {
		add(p, "pinned", "optimizer swap buffers (buffer_count x one sub-group)",
		    e->offload_optimizer.buffer_count * sgb, NULL);
		p->pinned_locked |= e->offload_optimizer.pin_memory;
	}
	if ((e->gradient_clipping > 0 || e->fp16.enabled) && e->step_during_backward) {
		/* the speculative step's reserve (engine/engine_spec.c): buffer_count sub-groups'
		   state and 16-bit values, at most one per sub-group but the last */
		double sg = fmin((double)e->sub_group_size, part);
		double nsg = ceil(part / fmax(sg, 1.0));
		double slots = fmin(fmax((double)e->offload_optimizer.buffer_count, 1.0), nsg - 1);
		if (slots > 0) {
			add(p, od == ZINF_OFFLOAD_NONE ? "gpu" : "pinned",
			    "speculative step reserve (buffer_count x one sub-group's state)",
			    slots * sg * (K + b16), NULL);
		}
	}
	if (pd == ZINF_OFFLOAD_CPU) {
		add(p, "pinned", "16-bit parameter partitions", part * b16, NULL);
		p->pinned_locked |= e->offload_param.pin_memory;
	} else if (pd == ZINF_OFFLOAD_NVME) {
		add(p, "pinned", "parameter swap buffers (buffer_count x buffer_size)",
		    (double)e->offload_param.buffer_count * (double)e->offload_param.buffer_size *
			    b16,
		    NULL);
		p->pinned_locked |= e->offload_param.pin_memory;
	}

	/* NVMe, striped over each section's paths */
	if (od == ZINF_OFFLOAD_NVME) {
		for (uint32_t i = 0; i < e->offload_optimizer.n_paths; i++) {
			add(p, "nvme", "optimizer state", part * K / e->offload_optimizer.n_paths,
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
	printf("memory plan per rank (%" PRIu64 " parameters, %d rank(s)):\n", c->params, c->world);
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
	const char *file = NULL;
	char *rest[64];
	int n = 0;
	for (int i = 0; i < argc && n < 63; i++) {
		if (i > 0 && !file && argv[i][0] != '-') {
			file = argv[i];
			continue;
		}
		rest[n++] = argv[i];
	}
	rest[n] = NULL;
	int rc = cli_opts_main(PROG, synopsis, description, opts, n, rest);
	if (rc >= 0) {
		return rc;
	}
	if (!file) {
		fprintf(stderr, PROG ": FILE is required\nrun `" PROG " --help`\n");
		return 2;
	}
	struct cfg c = cfg;
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
	bool planned = c.params > 0;
	if (planned) {
		rc = make_plan(&eo, &c, &plan);
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
			json_object_set_new(o, "plan",
					    json_pack("{s:i, s:I, s:f, s:f, s:o, s:o}", "world",
						      c.world, "params", (json_int_t)c.params,
						      "gpu_bytes", plan.gpu, "pinned_bytes",
						      plan.pinned, "items", items, "checks",
						      checks));
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
