/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt_args.c: zinf_gpt's flags (one table: name, what it sets, range, help; a
 * flag without help is the tests' and is not listed) and ZINF_LOG_LEVEL. Not here: the
 * configuration file (gpt.c reads it with zinf_config).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpt.h"
#include "gpt_tokens.h"

#ifndef GPT_DEFAULT_CONFIG
#define GPT_DEFAULT_CONFIG "examples/gpt/configs/zero3_nvme.json"
#endif

enum kind { K_INT, K_STR, K_FLAG, K_LR, K_SECS, K_SEED, K_HELP };

struct flag {
	const char *name, *meta, *help;
	enum kind kind;
	size_t off; /* in struct gpt_args */
	long lo, hi;
};

#define A(f) offsetof(struct gpt_args, f)
static const struct flag flags[] = {
	{"config", "FILE", "DeepSpeed config (default " GPT_DEFAULT_CONFIG ")", K_STR, A(config), 0,
	 0},
	{"device", "D",
	 "where the layers run: auto (cuda when a GPU is present, else host), host (the CPU "
	 "layers) or cuda (the GPU layers; exit 3 when there is no GPU)",
	 K_STR, A(device), 0, 0},
	{"steps", "N", "optimizer steps (default 300)", K_INT, A(steps), 1, 100000000},
	{"arch", "A",
	 "gpt2 (default: learned positions, LayerNorm, GELU MLP of 4C, tied head) or llama "
	 "(rotary positions, RMSNorm, SwiGLU MLP, grouped-query attention, no biases)",
	 K_STR, A(arch), 0, 0},
	{"layers", "L", "transformer blocks (default 4)", K_INT, A(layers), 1, 1024},
	{"heads", "H", "attention heads (default 4)", K_INT, A(heads), 1, 1024},
	{"hidden", "C", "hidden size (default 64)", K_INT, A(hidden), 1, 65536},
	{"kv-heads", "H", "llama: key-value heads, dividing --heads (default --heads)", K_INT,
	 A(kv_heads), 1, 1024},
	{"ffn", "F", "llama: the MLP's hidden size, intermediate_size (default 4 x --hidden)",
	 K_INT, A(ffn), 1, 1 << 20},
	{"rope-theta", "X", "llama: the rotary embeddings' base (default 10000)", K_LR,
	 A(rope_theta), 0, 0},
	{"untied", NULL, "llama: an output head of its own (lm_head), not the embedding", K_FLAG,
	 A(untied), 0, 0},
	{"from-hf", "DIR",
	 "start from a Hugging Face model directory (config.json and safetensors weights, one "
	 "file or shards): its shape and weights (gpt2, llama, mistral; in place of --arch, "
	 "--layers, --heads, --kv-heads, --hidden, --ffn, --vocab, --rope-theta, --untied)",
	 K_STR, A(from_hf), 0, 0},
	{"context", "T", "sequence length (default 32)", K_INT, A(context), 1, 65536},
	{"vocab", "V", "vocabulary (default 64)", K_INT, A(vocab), 2, 1 << 24},
	{"batch", "B", "micro-batch per rank, the config's \"auto\" (default 16)", K_INT, A(batch),
	 1, GPT_MAX_BATCH},
	{"grad-accum", "G", "gradient accumulation, the config's \"auto\" (default 1)", K_INT,
	 A(grad_accum), 1, GPT_MAX_GRAD_ACCUM},
	{"lr", "LR", "learning rate for an \"auto\" lr", K_LR, A(lr), 0, 0},
	{"fanout", "K", "successors per token in the Markov source (default 4)", K_INT, A(fanout),
	 1, 1 << 24},
	{"data", "FILE",
	 "train on a token file instead of the Markov source: llm.c's .bin (header: magic "
	 "20240520 with uint16 tokens, or 20240801 with uint32), or raw tokens with "
	 "--data-dtype; every token must be below --vocab. Row b of micro-batch m of step s "
	 "on rank r is the T+1 tokens from ((((s-1) gas + m) world + r) B + b) T mod the "
	 "file's tokens, going on from token 0 past the end; inputs its first T, targets its "
	 "last T",
	 K_STR, A(data), 0, 0},
	{"data-dtype", "D",
	 "--data's format: llmc (default: llm.c's header, then its tokens), uint16 or uint32 "
	 "(raw little-endian tokens, no header)",
	 K_STR, A(data_dtype_name), 0, 0},
	{"seed", "S", "model and data seed (default 1)", K_SEED, A(seed), 0, 0},
	{"json", "FILE", "per-step records, JSON lines (rank 0)", K_STR, A(json), 0, 0},
	{"nvme-path", "DIR", "every nvme_path of the config becomes DIR", K_STR, A(nvme_path), 0,
	 0},
	{"scratch-parent", "DIR",
	 "where the scratch directory is made (default .); what killed runs on this machine "
	 "left there is removed",
	 K_STR, A(scratch_parent), 0, 0},
	{"steps-per-print", "N", "override the config's steps_per_print", K_INT, A(steps_per_print),
	 1, GPT_MAX_SPP},
	{"save", "DIR",
	 "save checkpoints into DIR (at the end, every --save-every steps, and on "
	 "Ctrl-C); DIR is made if missing and must be writable before the first step",
	 K_STR, A(save), 0, 0},
	{"save-every", "N", "steps between checkpoints (needs --save; default 0: at the end only)",
	 K_INT, A(save_every), 0, 100000000},
	{"keep", "N",
	 "keep the newest N checkpoints in --save's directory (needs --save; default 0: all)",
	 K_INT, A(keep), 0, 100000000},
	{"resume", "DIR", "continue from DIR's latest checkpoint (to --steps in all)", K_STR,
	 A(resume), 0, 0},
	{"comm-timeout", "S",
	 "deadline of every collective, seconds (default $ZINF_COMM_TIMEOUT_S, else 1800): a rank "
	 "that stops answering is an error on the others after S seconds",
	 K_SECS, A(comm_timeout), 0, GPT_MAX_COMM_TIMEOUT},
	{"decay-all", NULL,
	 "weight decay on every tensor (default: not on biases and norm weights)", K_FLAG,
	 A(decay_all), 0, 0},
	{"step-after-backward", NULL, "no optimizer step during backward", K_FLAG,
	 A(step_after_backward), 0, 0},
	{"no-progress", NULL, "no progress bar", K_FLAG, A(no_progress), 0, 0},
	{"vertical", NULL,
	 "a step's micro-batches in one pass (zinf_engine_vertical): each layer fetched once "
	 "forward and once backward for all of them, which keeps every micro-batch's activations "
	 "(the same losses and weights, bit for bit)",
	 K_FLAG, A(vertical), 0, 0},
	{"quiet", NULL, "only the summary", K_FLAG, A(quiet), 0, 0},
	/* not listed (no help): the crash tests' (tests/gpt/check_gpt.sh kill_in_save) */
	{"test-kill-in-save", "POINT:TAG", NULL, K_STR, A(test_kill_in_save), 0, 0},
	{"help", NULL, "this text", K_HELP, 0, 0, 0},
};
#define N_FLAGS (sizeof(flags) / sizeof(flags[0]))

/* The flags that set the model's shape, which --from-hf takes from config.json */
static const char *const shape_flags[] = {"arch", "layers", "heads",	  "kv-heads", "hidden",
					  "ffn",  "vocab",  "rope-theta", "untied"};

static void
usage(FILE *f)
{
	fprintf(f, "usage: zinf_gpt [options]\n");
	for (size_t i = 0; i < N_FLAGS; i++) {
		if (!flags[i].help) {
			continue;
		}
		char left[40];
		snprintf(left, sizeof(left), "--%s%s%s", flags[i].name, flags[i].meta ? " " : "",
			 flags[i].meta ? flags[i].meta : "");
		fprintf(f, "  %-24s %s\n", left, flags[i].help);
	}
	fputs("\nTraining as a Hugging Face user expects: the config's optimizer and\n"
	      "scheduler (\"auto\" resolved from these flags as the Trainer resolves it);\n"
	      "without a \"scheduler\" block the learning rate is constant (the optimizer's\n"
	      "lr, --lr for an \"auto\" one; DeepSpeed's behaviour: the Trainer would make\n"
	      "its own linear schedule). The optimizer's weight_decay applies to the weight\n"
	      "matrices and the embeddings only, not to biases and norm weights, as the\n"
	      "Trainer groups them when it makes the optimizer; --decay-all decays every\n"
	      "tensor, as DeepSpeed does when the Trainer hands it a config's optimizer.\n",
	      f);
}

/* One flag's value into *a; 0 or -1 after a message. */
static int
set(const struct flag *fl, const char *v, struct gpt_args *a)
{
	char *p = (char *)a + fl->off, *end;
	errno = 0;
	for (size_t i = 0; i < sizeof(shape_flags) / sizeof(shape_flags[0]); i++) {
		if (!strcmp(fl->name, shape_flags[i])) {
			a->shape_flag = fl->name;
		}
	}
	switch (fl->kind) {
	case K_STR:
		*(const char **)p = v;
		return 0;
	case K_FLAG:
		*(bool *)p = true;
		return 0;
	case K_INT: {
		long x = strtol(v, &end, 10);
		if (errno || *end || !*v || x < fl->lo || x > fl->hi) {
			fprintf(stderr, "zinf_gpt: --%s %s: expected an integer in [%ld, %ld]\n",
				fl->name, v, fl->lo, fl->hi);
			return -1;
		}
		*(int *)p = (int)x;
		return 0;
	}
	case K_LR: {
		double x = strtod(v, &end);
		if (errno || *end || !*v || !(x >= 0) || !isfinite(x)) {
			fprintf(stderr, "zinf_gpt: --%s %s: expected a number >= 0\n", fl->name, v);
			return -1;
		}
		*(double *)p = x;
		return 0;
	}
	case K_SECS: {
		double x = strtod(v, &end);
		if (errno || *end || !*v || !(x > fl->lo && x <= fl->hi)) {
			fprintf(stderr, "zinf_gpt: --%s %s: expected seconds in (%ld, %ld]\n",
				fl->name, v, fl->lo, fl->hi);
			return -1;
		}
		*(double *)p = x;
		return 0;
	}
	case K_SEED: {
		unsigned long long x = strtoull(v, &end, 0);
		if (errno || *end || !*v || v[0] == '-') {
			fprintf(stderr, "zinf_gpt: --%s %s: expected an integer >= 0\n", fl->name,
				v);
			return -1;
		}
		*(uint64_t *)p = x;
		return 0;
	}
	case K_HELP:
		usage(stdout);
		exit(0);
	}
	return -1;
}

int
gpt_args_parse(int argc, char **argv, struct gpt_args *a)
{
	*a = (struct gpt_args){.config = GPT_DEFAULT_CONFIG,
			       .device = "auto",
			       .arch = "gpt2",
			       .rope_theta = 10000,
			       .scratch_parent = ".",
			       .steps = 300,
			       .layers = 4,
			       .heads = 4,
			       .hidden = 64,
			       .context = 32,
			       .vocab = 64,
			       .batch = 16,
			       .grad_accum = 1,
			       .fanout = 4,
			       .lr = NAN,
			       .comm_timeout = NAN,
			       .seed = 1,
			       .steps_per_print = -1};
	struct option opts[N_FLAGS + 1];
	for (size_t i = 0; i < N_FLAGS; i++) {
		opts[i] = (struct option){flags[i].name,
					  flags[i].meta ? required_argument : no_argument, NULL,
					  256 + (int)i};
	}
	opts[N_FLAGS] = (struct option){0};
	int c;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c < 256 || c >= 256 + (int)N_FLAGS) {
			usage(stderr);
			return -1;
		}
		if (set(&flags[c - 256], optarg, a)) {
			return -1;
		}
	}
	if (optind < argc) {
		fprintf(stderr, "zinf_gpt: unexpected argument %s\n", argv[optind]);
		return -1;
	}
	if (strcmp(a->device, "auto") && strcmp(a->device, "host") && strcmp(a->device, "cuda")) {
		fprintf(stderr, "zinf_gpt: --device %s: expected auto, host or cuda\n", a->device);
		return -1;
	}
	if (a->from_hf && a->shape_flag) {
		fprintf(stderr,
			"zinf_gpt: --%s with --from-hf %s: the model's shape comes from its "
			"config.json\n",
			a->shape_flag, a->from_hf);
		return -1;
	}
	bool llama = !strcmp(a->arch, "llama");
	if (!llama && strcmp(a->arch, "gpt2")) {
		fprintf(stderr, "zinf_gpt: --arch %s: expected gpt2 or llama\n", a->arch);
		return -1;
	}
	if (!llama && (a->kv_heads || a->ffn || a->untied || a->rope_theta != 10000)) {
		fprintf(stderr, "zinf_gpt: %s is llama's (--arch llama); GPT-2 has %s\n",
			a->kv_heads ? "--kv-heads"
			: a->ffn    ? "--ffn"
			: a->untied ? "--untied"
				    : "--rope-theta",
			a->kv_heads ? "as many key-value heads as heads"
			: a->ffn    ? "an MLP of 4 x --hidden"
			: a->untied ? "its head tied to the embedding"
				    : "learned positions");
		return -1;
	}
	if (a->kv_heads && a->heads % a->kv_heads) {
		fprintf(stderr, "zinf_gpt: --heads %d is not a multiple of --kv-heads %d\n",
			a->heads, a->kv_heads);
		return -1;
	}
	if (!(a->rope_theta > 0)) {
		fprintf(stderr, "zinf_gpt: --rope-theta %g: expected a number > 0\n",
			a->rope_theta);
		return -1;
	}
	if (a->hidden % a->heads) {
		fprintf(stderr, "zinf_gpt: --hidden %d is not a multiple of --heads %d\n",
			a->hidden, a->heads);
		return -1;
	}
	if (llama && (a->hidden / a->heads) % 2) {
		fprintf(stderr,
			"zinf_gpt: --hidden %d / --heads %d = %d: llama's rotary embeddings need "
			"an even head size\n",
			a->hidden, a->heads, a->hidden / a->heads);
		return -1;
	}
	if (!a->save && (a->save_every || a->keep)) {
		fprintf(stderr,
			"zinf_gpt: %s without --save DIR: nothing would be saved (--save names "
			"where the checkpoints go)\n",
			a->save_every && a->keep ? "--save-every and --keep"
			: a->save_every		 ? "--save-every"
						 : "--keep");
		return -1;
	}
	if (a->test_kill_in_save && !strchr(a->test_kill_in_save, ':')) {
		fprintf(stderr, "zinf_gpt: --test-kill-in-save %s: expected POINT:TAG\n",
			a->test_kill_in_save);
		return -1;
	}
	enum gpt_tokens_format fmt = GPT_TOKENS_LLMC;
	if (a->data_dtype_name && gpt_tokens_format_parse(a->data_dtype_name, &fmt)) {
		fprintf(stderr, "zinf_gpt: --data-dtype %s: expected llmc, uint16 or uint32\n",
			a->data_dtype_name);
		return -1;
	}
	a->data_dtype = (int)fmt;
	if (a->data_dtype_name && !a->data) {
		fprintf(stderr,
			"zinf_gpt: --data-dtype without --data FILE: no token file to read\n");
		return -1;
	}
	if (a->fanout > a->vocab) {
		fprintf(stderr, "zinf_gpt: --fanout %d is larger than --vocab %d\n", a->fanout,
			a->vocab);
		return -1;
	}
	return 0;
}

int
gpt_log_level_from_env(void)
{
	const char *v = getenv("ZINF_LOG_LEVEL");
	enum zinf_log_level lvl;
	if (!v || !*v) {
		return 0;
	}
	if (zinf_log_level_parse(v, &lvl) == 0) {
		zinf_log_set_level(lvl);
		return 0;
	}
	fprintf(stderr,
		"zinf_gpt: ZINF_LOG_LEVEL=%s: expected error, warn, info or debug (or 0-3)\n", v);
	return -1;
}
