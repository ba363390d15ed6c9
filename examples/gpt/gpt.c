/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt.c: zinf_gpt, a GPT trained through zinf's public API, as a user's trainer
 * would be written: the parameters live in the ZeRO engine (zinf/engine.h), in the tiers a
 * DeepSpeed configuration names (by default ZeRO-3 with parameters and optimizer state on NVMe
 * under a scratch directory this program creates and removes); each layer is fetched before
 * its forward and again before its backward and released after; each gradient is handed to
 * zinf as backward produces it; zinf_engine_step() ends every micro-batch. Runs alone or under
 * `mpirun -np N` (the collectives are chosen by zinf: mpi under a launcher, else single).
 *
 *   zinf_gpt [--config FILE] [--steps N] [--layers L] [--heads H] [--hidden C] [--context T]
 *            [--vocab V] [--batch B] [--grad-accum G] [--lr LR] [--fanout K] [--seed S]
 *            [--json FILE] [--nvme-path DIR] [--scratch-parent DIR] [--steps-per-print N]
 *            [--step-after-backward] [--no-progress] [--quiet]
 *
 * The data (gpt_data.h) is a Markov source with a known entropy rate, printed as the loss's
 * floor. The layers run on the CPU (gpt_cpu.c, OpenMP) on zinf's "host" device; see
 * gpt_model.h for where a GPU backend goes. Not here: checkpoints, fp16 loss scaling (refused),
 * gradient clipping (the engine has none yet: a configured value is warned about and not
 * applied).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <ftw.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zinf/comm.h>
#include <zinf/config.h>
#include <zinf/device.h>
#include <zinf/engine.h>
#include <zinf/schedule.h>

#include "gpt_data.h"
#include "gpt_model.h"

#ifndef GPT_DEFAULT_CONFIG
#define GPT_DEFAULT_CONFIG "examples/gpt/configs/zero3_nvme.json"
#endif
/* A configuration's nvme_path with this value is replaced by the scratch directory. */
#define GPT_SCRATCH_PATH "scratch"

struct args {
	const char *config, *json, *nvme_path, *scratch_parent;
	int steps, layers, heads, hidden, context, vocab, batch, grad_accum, fanout;
	double lr;
	uint64_t seed;
	int steps_per_print;
	bool step_after_backward, no_progress, quiet;
};

/* The model as the engine sees it: ids of every tensor. */
struct model {
	struct gpt_dims d;
	uint32_t wte, wpe, lnfw, lnfb;
	uint32_t block0; /* block l tensor t: block0 + l * GPT_BLOCK_TENSORS + t */
	uint64_t seed, n_params;
};

/* The trainer's device buffers (the engine's device; host memory on "host"). */
struct bufs {
	struct gpt_acts acts;
	gpt_real *acts_base;
	int *tokens, *targets;	      /* [N] */
	int *host_io;		      /* [2N] tokens then targets, host memory (registered) */
	gpt_real *host_losses;	      /* [N] per-position losses, host memory (registered) */
	gpt_real *dblock[2];	      /* two block gradients, alternated */
	gpt_real *dwte, *dwpe, *dlnf; /* dlnf: [2C] weight then bias */
	gpt_real *f32_embed, *f32_block, *f32_lnf; /* bf16 engines: f32 copies */
};

struct timers {
	double compute, fetch, grad, step, data;
};

static volatile sig_atomic_t g_stop;

static void
on_signal(int sig)
{
	(void)sig;
	g_stop = 1;
}

static void
usage(FILE *f)
{
	fprintf(f,
		"usage: zinf_gpt [options]\n"
		"  --config FILE        DeepSpeed config (default %s)\n"
		"  --steps N            optimizer steps (default 300)\n"
		"  --layers L           transformer blocks (default 4)\n"
		"  --heads H            attention heads (default 4)\n"
		"  --hidden C           hidden size (default 64)\n"
		"  --context T          sequence length (default 32)\n"
		"  --vocab V            vocabulary (default 64)\n"
		"  --batch B            micro-batch per rank, the config's \"auto\" (default 16)\n"
		"  --grad-accum G       gradient accumulation, the config's \"auto\" (default 1)\n"
		"  --lr LR              learning rate for an \"auto\" lr\n"
		"  --fanout K           successors per token in the Markov source (default 4)\n"
		"  --seed S             model and data seed (default 1)\n"
		"  --json FILE          per-step records, JSON lines (rank 0)\n"
		"  --nvme-path DIR      every nvme_path of the config becomes DIR\n"
		"  --scratch-parent DIR where the scratch directory is made (default .)\n"
		"  --steps-per-print N  override the config's steps_per_print\n"
		"  --step-after-backward  no optimizer step during backward\n"
		"  --no-progress        no progress bar\n"
		"  --quiet              only the summary\n",
		GPT_DEFAULT_CONFIG);
}

static int
parse_int(const char *opt, const char *s, int lo, int hi, int *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || *end || v < lo || v > hi) {
		fprintf(stderr, "zinf_gpt: %s %s: expected an integer in [%d, %d]\n", opt, s, lo,
			hi);
		return -1;
	}
	*out = (int)v;
	return 0;
}

static int
parse_args(int argc, char **argv, struct args *a)
{
	*a = (struct args){.config = GPT_DEFAULT_CONFIG,
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
			   .seed = 1,
			   .steps_per_print = -1};
	enum {
		O_STEPS = 256,
		O_LAYERS,
		O_HEADS,
		O_HIDDEN,
		O_CONTEXT,
		O_VOCAB,
		O_BATCH,
		O_GA,
		O_LR,
		O_FANOUT,
		O_SEED,
		O_JSON,
		O_NVME,
		O_SCRATCH,
		O_SPP,
		O_SAB,
		O_NOPROG,
		O_QUIET,
		O_CONFIG,
		O_HELP
	};
	static const struct option opts[] = {{"config", 1, 0, O_CONFIG},
					     {"steps", 1, 0, O_STEPS},
					     {"layers", 1, 0, O_LAYERS},
					     {"heads", 1, 0, O_HEADS},
					     {"hidden", 1, 0, O_HIDDEN},
					     {"context", 1, 0, O_CONTEXT},
					     {"vocab", 1, 0, O_VOCAB},
					     {"batch", 1, 0, O_BATCH},
					     {"grad-accum", 1, 0, O_GA},
					     {"lr", 1, 0, O_LR},
					     {"fanout", 1, 0, O_FANOUT},
					     {"seed", 1, 0, O_SEED},
					     {"json", 1, 0, O_JSON},
					     {"nvme-path", 1, 0, O_NVME},
					     {"scratch-parent", 1, 0, O_SCRATCH},
					     {"steps-per-print", 1, 0, O_SPP},
					     {"step-after-backward", 0, 0, O_SAB},
					     {"no-progress", 0, 0, O_NOPROG},
					     {"quiet", 0, 0, O_QUIET},
					     {"help", 0, 0, O_HELP},
					     {0, 0, 0, 0}};
	int c, r = 0;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1 && !r) {
		switch (c) {
		case O_CONFIG:
			a->config = optarg;
			break;
		case O_STEPS:
			r = parse_int("--steps", optarg, 1, 100000000, &a->steps);
			break;
		case O_LAYERS:
			r = parse_int("--layers", optarg, 1, 1024, &a->layers);
			break;
		case O_HEADS:
			r = parse_int("--heads", optarg, 1, 1024, &a->heads);
			break;
		case O_HIDDEN:
			r = parse_int("--hidden", optarg, 1, 65536, &a->hidden);
			break;
		case O_CONTEXT:
			r = parse_int("--context", optarg, 1, 65536, &a->context);
			break;
		case O_VOCAB:
			r = parse_int("--vocab", optarg, 2, 1 << 24, &a->vocab);
			break;
		case O_BATCH:
			r = parse_int("--batch", optarg, 1, 1 << 20, &a->batch);
			break;
		case O_GA:
			r = parse_int("--grad-accum", optarg, 1, 1 << 20, &a->grad_accum);
			break;
		case O_FANOUT:
			r = parse_int("--fanout", optarg, 1, 1 << 24, &a->fanout);
			break;
		case O_SPP:
			r = parse_int("--steps-per-print", optarg, 1, 1 << 30, &a->steps_per_print);
			break;
		case O_LR: {
			char *end;
			a->lr = strtod(optarg, &end);
			if (*end || !(a->lr >= 0)) {
				fprintf(stderr, "zinf_gpt: --lr %s: expected a number >= 0\n",
					optarg);
				r = -1;
			}
			break;
		}
		case O_SEED: {
			char *end;
			errno = 0;
			a->seed = strtoull(optarg, &end, 0);
			if (errno || *end || optarg[0] == '-') {
				fprintf(stderr, "zinf_gpt: --seed %s: expected an integer >= 0\n",
					optarg);
				r = -1;
			}
			break;
		}
		case O_JSON:
			a->json = optarg;
			break;
		case O_NVME:
			a->nvme_path = optarg;
			break;
		case O_SCRATCH:
			a->scratch_parent = optarg;
			break;
		case O_SAB:
			a->step_after_backward = true;
			break;
		case O_NOPROG:
			a->no_progress = true;
			break;
		case O_QUIET:
			a->quiet = true;
			break;
		case O_HELP:
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			return -1;
		}
	}
	if (!r && optind < argc) {
		fprintf(stderr, "zinf_gpt: unexpected argument %s\n", argv[optind]);
		r = -1;
	}
	if (!r && a->hidden % a->heads) {
		fprintf(stderr, "zinf_gpt: --hidden %d is not a multiple of --heads %d\n",
			a->hidden, a->heads);
		r = -1;
	}
	if (!r && a->fanout > a->vocab) {
		fprintf(stderr, "zinf_gpt: --fanout %d is larger than --vocab %d\n", a->fanout,
			a->vocab);
		r = -1;
	}
	return r;
}

/* ---- parameters: registration and initial values (llm.c's GPT-2 initialisation) ---------- */

static uint64_t
mix(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* N(0, 1) as a function of (seed, param, index): the same on every rank and tier. */
static double
normal_at(uint64_t seed, uint32_t param, uint64_t i)
{
	uint64_t h = mix(seed * 0x9e3779b97f4a7c15ull + param * 0xd1b54a32d192ed03ull + i);
	double u1 = ((double)(h >> 11) + 0.5) * 0x1.0p-53;
	double u2 = (double)(mix(h + 1) >> 11) * 0x1.0p-53;
	return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}

static int
init_fn(void *ctx, uint32_t param, uint64_t first, uint64_t count, float *out)
{
	const struct model *m = ctx;
	double stdv = 0, constant = 0;
	if (param == m->wte) {
		stdv = 0.02;
	} else if (param == m->wpe) {
		stdv = 0.01;
	} else if (param == m->lnfw) {
		constant = 1;
	} else if (param >= m->block0 && param < m->lnfw) {
		int t = (int)((param - m->block0) % GPT_BLOCK_TENSORS);
		if (t == GPT_LN1W || t == GPT_LN2W) {
			constant = 1;
		} else if (t == GPT_QKVW || t == GPT_FCW) {
			stdv = 0.02;
		} else if (t == GPT_ATTPROJW || t == GPT_FCPROJW) {
			stdv = 0.02 / sqrt(2.0 * m->d.L); /* residual projections, GPT-2 */
		}
	}
	for (uint64_t i = 0; i < count; i++) {
		out[i] = stdv ? (float)(stdv * normal_at(m->seed, param, first + i))
			      : (float)constant;
	}
	return 0;
}

static const char *const block_names[GPT_BLOCK_TENSORS] = {
	"ln1.w", "ln1.b", "attn.qkv.w", "attn.qkv.b", "attn.proj.w", "attn.proj.b",
	"ln2.w", "ln2.b", "mlp.fc.w",	"mlp.fc.b",   "mlp.proj.w",  "mlp.proj.b"};

static int
add(struct zinf_engine *e, struct model *m, const char *name, uint64_t numel, int layer,
    uint32_t *id)
{
	struct zinf_param_desc pd;
	zinf_param_desc_init(&pd);
	pd.name = name;
	pd.numel = numel;
	pd.layer = layer;
	pd.init_fn = init_fn;
	pd.init_ctx = m;
	int r = zinf_engine_add_param(e, &pd);
	if (r < 0) {
		fprintf(stderr, "zinf_gpt: add_param %s: %s\n", name, zinf_strerror(r));
		return r;
	}
	*id = (uint32_t)r;
	m->n_params += numel;
	return 0;
}

static int
register_model(struct zinf_engine *e, struct model *m)
{
	const struct gpt_dims *d = &m->d;
	size_t C = (size_t)d->C;
	char name[64];
	int r = add(e, m, "wte", (size_t)d->V * C, GPT_LAYER_EMBED, &m->wte);
	r = r ?: add(e, m, "wpe", (size_t)d->T * C, GPT_LAYER_EMBED, &m->wpe);
	for (int l = 0; l < d->L && !r; l++) {
		for (int t = 0; t < GPT_BLOCK_TENSORS && !r; t++) {
			uint32_t id;
			snprintf(name, sizeof(name), "h%d.%s", l, block_names[t]);
			r = add(e, m, name, gpt_block_numel(d, t), GPT_LAYER_BLOCK(d, l), &id);
			if (!r && l == 0 && t == 0) {
				m->block0 = id;
			}
		}
	}
	r = r ?: add(e, m, "lnf.w", C, GPT_LAYER_LNF(d), &m->lnfw);
	r = r ?: add(e, m, "lnf.b", C, GPT_LAYER_LNF(d), &m->lnfb);
	return r;
}

/* ---- one layer's tensors ------------------------------------------------------------------- */

struct trainer {
	struct zinf_engine *e;
	struct zinf_device *dev;
	struct zinf_stream *cs;
	enum zinf_dtype dtype;
	const struct gpt_ops *ops;
	struct model m;
	struct bufs b;
	struct timers tm;
	int rank, world, gas;
};

/*
 * The fp32 view of parameter id: its engine buffer when the engine computes in f32, else a
 * cast (on the compute stream) into `scratch`. The caller synchronises the compute stream
 * before the CPU reads it.
 */
static int
param_f32(struct trainer *t, uint32_t id, size_t numel, gpt_real *scratch, const gpt_real **out)
{
	void *p;
	int r = zinf_engine_param(t->e, id, &p);
	if (r) {
		return r;
	}
	if (t->dtype == ZINF_F32) {
		*out = p;
		return 0;
	}
	r = zinf_device_cast(t->cs, scratch, ZINF_F32, p, t->dtype, numel);
	*out = scratch;
	return r;
}

/* fetch(layer), then wait for it on the compute stream: the CPU reads it next */
static int
fetch(struct trainer *t, int layer)
{
	double t0 = zinf_now_s();
	int r = zinf_engine_fetch(t->e, layer);
	t->tm.fetch += zinf_now_s() - t0;
	if (r) {
		fprintf(stderr, "zinf_gpt: rank %d: fetch layer %d: %s\n", t->rank, layer,
			zinf_strerror(r));
	}
	return r;
}

static int
release(struct trainer *t, int layer)
{
	int r = zinf_engine_release(t->e, layer);
	if (r) {
		fprintf(stderr, "zinf_gpt: rank %d: release layer %d: %s\n", t->rank, layer,
			zinf_strerror(r));
	}
	return r;
}

static int
sync_cs(struct trainer *t)
{
	double t0 = zinf_now_s();
	int r = zinf_stream_sync(t->cs);
	t->tm.fetch += zinf_now_s() - t0;
	return r;
}

static int
grad(struct trainer *t, uint32_t id, const gpt_real *g)
{
	double t0 = zinf_now_s();
	int r = zinf_engine_grad(t->e, id, g, ZINF_F32);
	t->tm.grad += zinf_now_s() - t0;
	if (r) {
		fprintf(stderr, "zinf_gpt: rank %d: grad %u: %s\n", t->rank, id, zinf_strerror(r));
	}
	return r;
}

static int
block_params(struct trainer *t, int l, const gpt_real **p)
{
	uint32_t id0 = t->m.block0 + (uint32_t)(l * GPT_BLOCK_TENSORS);
	int r = 0;
	for (int k = 0; k < GPT_BLOCK_TENSORS && !r; k++) {
		r = param_f32(t, id0 + (uint32_t)k, gpt_block_numel(&t->m.d, k),
			      t->b.f32_block + gpt_block_offset(&t->m.d, k), &p[k]);
	}
	return r ?: sync_cs(t);
}

static int
embed_params(struct trainer *t, const gpt_real **wte, const gpt_real **wpe)
{
	const struct gpt_dims *d = &t->m.d;
	size_t nwte = (size_t)d->V * d->C;
	int r = param_f32(t, t->m.wte, nwte, t->b.f32_embed, wte);
	r = r ?: param_f32(t, t->m.wpe, (size_t)d->T * d->C, t->b.f32_embed + nwte, wpe);
	return r ?: sync_cs(t);
}

/*
 * One micro-batch: forward and backward, every layer fetched before and released after its
 * use, each gradient handed as soon as it is final. The fetch order is the same every
 * micro-batch (embeddings, blocks, final LayerNorm, embeddings again for the tied head;
 * backward: blocks last to first, embeddings), so zinf's trace prefetches along it.
 * Returns 0 and the sum of this micro-batch's per-position losses in *loss_sum.
 */
static int
micro_batch(struct trainer *t, double *loss_sum)
{
	const struct gpt_dims *d = &t->m.d;
	struct bufs *b = &t->b;
	struct gpt_acts *a = &b->acts;
	const struct gpt_ops *ops = t->ops;
	const gpt_real *wte, *wpe, *lnfw, *lnfb, *bp[GPT_BLOCK_TENSORS];
	gpt_real *bg[GPT_BLOCK_TENSORS];
	int N = d->B * d->T, r;
	double t0;

	/* forward */
	if ((r = fetch(t, GPT_LAYER_EMBED)) || (r = embed_params(t, &wte, &wpe))) {
		return r;
	}
	t0 = zinf_now_s();
	ops->encoder_forward(d, a, b->tokens, wte, wpe);
	t->tm.compute += zinf_now_s() - t0;
	if ((r = release(t, GPT_LAYER_EMBED))) {
		return r;
	}
	for (int l = 0; l < d->L; l++) {
		if ((r = fetch(t, GPT_LAYER_BLOCK(d, l))) || (r = block_params(t, l, bp))) {
			return r;
		}
		t0 = zinf_now_s();
		ops->block_forward(d, a, l, bp);
		t->tm.compute += zinf_now_s() - t0;
		if ((r = release(t, GPT_LAYER_BLOCK(d, l)))) {
			return r;
		}
	}
	/* the head: final LayerNorm and the tied embedding, forward and backward at once */
	if ((r = fetch(t, GPT_LAYER_LNF(d))) || (r = fetch(t, GPT_LAYER_EMBED))) {
		return r;
	}
	r = param_f32(t, t->m.lnfw, (size_t)d->C, b->f32_lnf, &lnfw);
	r = r ?: param_f32(t, t->m.lnfb, (size_t)d->C, b->f32_lnf + d->C, &lnfb);
	r = r ?: embed_params(t, &wte, &wpe);
	if (r) {
		return r;
	}
	t0 = zinf_now_s();
	gpt_real dloss = (gpt_real)(1.0 / ((double)N * t->gas));
	ops->head_forward_backward(d, a, b->targets, wte, lnfw, lnfb, dloss, b->dwte, b->dlnf,
				   b->dlnf + d->C);
	t->tm.compute += zinf_now_s() - t0;
	/* the losses come back to the host on the compute stream; read after a later sync */
	if ((r = zinf_device_copy(t->cs, b->host_losses, a->losses, (size_t)N * sizeof(gpt_real),
				  ZINF_COPY_D2H))) {
		return r;
	}
	if ((r = release(t, GPT_LAYER_EMBED)) || (r = grad(t, t->m.lnfw, b->dlnf)) ||
	    (r = grad(t, t->m.lnfb, b->dlnf + d->C)) || (r = release(t, GPT_LAYER_LNF(d)))) {
		return r;
	}
	/* backward through the blocks; their gradient buffers alternate so that a GPU backend
	 * computes block l - 1 while zinf copies block l's */
	for (int l = d->L - 1; l >= 0; l--) {
		if ((r = fetch(t, GPT_LAYER_BLOCK(d, l))) || (r = block_params(t, l, bp))) {
			return r;
		}
		gpt_real *slot = b->dblock[l & 1];
		for (int k = 0; k < GPT_BLOCK_TENSORS; k++) {
			bg[k] = slot + gpt_block_offset(d, k);
		}
		t0 = zinf_now_s();
		ops->block_backward(d, a, l, bp, bg);
		t->tm.compute += zinf_now_s() - t0;
		uint32_t id0 = t->m.block0 + (uint32_t)(l * GPT_BLOCK_TENSORS);
		for (int k = GPT_BLOCK_TENSORS - 1; k >= 0 && !r; k--) {
			r = grad(t, id0 + (uint32_t)k, bg[k]);
		}
		if (r || (r = release(t, GPT_LAYER_BLOCK(d, l)))) {
			return r;
		}
	}
	/* the embeddings: wte's gradient is the head's plus the lookup's, handed once */
	if ((r = fetch(t, GPT_LAYER_EMBED)) || (r = sync_cs(t))) {
		return r;
	}
	double s = 0;
	for (int i = 0; i < N; i++) {
		s += b->host_losses[i];
	}
	*loss_sum = s;
	t0 = zinf_now_s();
	ops->encoder_backward(d, a, b->tokens, b->dwte, b->dwpe);
	t->tm.compute += zinf_now_s() - t0;
	if ((r = grad(t, t->m.wpe, b->dwpe)) || (r = grad(t, t->m.wte, b->dwte))) {
		return r;
	}
	return release(t, GPT_LAYER_EMBED);
}

/* ---- buffers ------------------------------------------------------------------------------- */

static int
dalloc(struct trainer *t, size_t bytes, void *out)
{
	int r = zinf_device_alloc(t->dev, bytes ? bytes : 1, (void **)out);
	if (r) {
		fprintf(stderr, "zinf_gpt: device allocation of %zu bytes: %s\n", bytes,
			zinf_strerror(r));
	}
	return r;
}

static int
bufs_alloc(struct trainer *t)
{
	const struct gpt_dims *d = &t->m.d;
	struct bufs *b = &t->b;
	size_t N = (size_t)d->B * d->T, C = (size_t)d->C, g = sizeof(gpt_real);
	size_t blk = gpt_block_size(d), emb = ((size_t)d->V + d->T) * C;
	int r = dalloc(t, gpt_acts_numel(d) * g, &b->acts_base);
	r = r ?: dalloc(t, N * sizeof(int), &b->tokens);
	r = r ?: dalloc(t, N * sizeof(int), &b->targets);
	r = r ?: dalloc(t, blk * g, &b->dblock[0]);
	r = r ?: dalloc(t, blk * g, &b->dblock[1]);
	r = r ?: dalloc(t, (size_t)d->V * C * g, &b->dwte);
	r = r ?: dalloc(t, (size_t)d->T * C * g, &b->dwpe);
	r = r ?: dalloc(t, 2 * C * g, &b->dlnf);
	if (!r && !(b->host_io = malloc(2 * N * sizeof(int)))) {
		r = -ENOMEM;
	}
	if (!r && !(b->host_losses = malloc(N * g))) {
		r = -ENOMEM;
	}
	r = r ?: zinf_device_host_register(t->dev, b->host_io, 2 * N * sizeof(int));
	if (!r && (r = zinf_device_host_register(t->dev, b->host_losses, N * g))) {
		zinf_device_host_unregister(t->dev, b->host_io);
	}
	if (r) {
		free(b->host_io);
		free(b->host_losses);
		b->host_io = NULL;
		b->host_losses = NULL;
		fprintf(stderr, "zinf_gpt: host staging buffers: %s\n", zinf_strerror(r));
	}
	if (!r && t->dtype != ZINF_F32) {
		r = dalloc(t, emb * g, &b->f32_embed);
		r = r ?: dalloc(t, blk * g, &b->f32_block);
		r = r ?: dalloc(t, 2 * C * g, &b->f32_lnf);
	}
	if (!r) {
		gpt_acts_carve(d, b->acts_base, &b->acts);
	}
	return r;
}

static void
bufs_free(struct trainer *t)
{
	struct bufs *b = &t->b;
	void *all[] = {b->acts_base, b->tokens, b->targets,   b->dblock[0], b->dblock[1], b->dwte,
		       b->dwpe,	     b->dlnf,	b->f32_embed, b->f32_block, b->f32_lnf};
	if (!t->dev) {
		return;
	}
	if (b->host_io) {
		zinf_device_host_unregister(t->dev, b->host_io);
		zinf_device_host_unregister(t->dev, b->host_losses);
		free(b->host_io);
		free(b->host_losses);
	}
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		if (all[i]) {
			zinf_device_free(t->dev, all[i]);
		}
	}
}

/* ---- the scratch directory ----------------------------------------------------------------- */

static int
rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb, (void)flag, (void)ftw;
	return remove(path);
}

static void
scratch_remove(const char *dir)
{
	if (dir[0]) {
		nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
	}
}

/* Locked (pinned) memory of this process, bytes, from /proc/self/status; -1 if unknown. */
static long long
locked_bytes(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long long kb = -1;
	if (!f) {
		return -1;
	}
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "VmLck: %lld kB", &kb) == 1) {
			break;
		}
	}
	fclose(f);
	return kb < 0 ? -1 : kb * 1024;
}

static void
progress(int step, int steps, double loss, double floor_)
{
	int w = 30, fill = (int)((double)step / steps * w);
	char bar[64];
	for (int i = 0; i < w; i++) {
		bar[i] = i < fill ? '=' : i == fill ? '>' : ' ';
	}
	bar[w] = 0;
	fprintf(stderr, "\r[%s] %d/%d loss %.4f (floor %.4f)", bar, step, steps, loss, floor_);
	fflush(stderr);
}

static void
logcb(void *ctx, enum zinf_log_level l, const char *file, int line, const char *fn, const char *msg)
{
	(void)file, (void)line, (void)fn;
	const int *rank = ctx;
	fprintf(stderr, "zinf %s (rank %d): %s\n",
		l == ZINF_LOG_ERROR  ? "error"
		: l == ZINF_LOG_WARN ? "warning"
				     : "info",
		*rank, msg);
}

int
main(int argc, char **argv)
{
	struct args a;
	struct trainer t = {.ops = &gpt_cpu_ops};
	struct zinf_train_config cfg;
	struct zinf_comm *comm = NULL;
	struct gpt_data data = {0};
	FILE *json = NULL;
	char scratch[4096] = "";
	int rc = 1, r, log_rank = -1;
	int *host_tok = NULL;
	float *rank_loss = NULL;
	double *losses = NULL;

	if (parse_args(argc, argv, &a)) {
		return 2;
	}
	zinf_log_set_callback(logcb, &log_rank);
	/* ZINF_LOG_LEVEL as the zinf command takes it: error, warn, info, debug or 0-3 */
	const char *lvl = getenv("ZINF_LOG_LEVEL");
	if (lvl && *lvl) {
		static const char *const names[] = {"error", "warn", "info", "debug"};
		int l = -1;
		for (int i = 0; i < 4; i++) {
			if (!strcmp(lvl, names[i]) || (lvl[0] == '0' + i && !lvl[1])) {
				l = i;
			}
		}
		if (l < 0) {
			fprintf(stderr,
				"zinf_gpt: ZINF_LOG_LEVEL=%s: expected error, warn, info or "
				"debug (or 0-3)\n",
				lvl);
			return 2;
		}
		zinf_log_set_level((enum zinf_log_level)l);
	}
	zinf_config_init(&cfg);
	signal(SIGINT, on_signal);
	signal(SIGTERM, on_signal);

	struct zinf_comm_opts co;
	zinf_comm_opts_init(&co);
	if ((r = zinf_comm_create(&co, &comm))) {
		fprintf(stderr, "zinf_gpt: collectives: %s\n", zinf_strerror(r));
		goto out;
	}
	t.rank = log_rank = zinf_comm_rank(comm);
	t.world = zinf_comm_world(comm);
	bool lead = t.rank == 0;

	/* the configuration; "auto" from the flags, as Hugging Face's integration does */
	struct zinf_config_inputs in;
	zinf_config_inputs_init(&in);
	in.world_size = t.world;
	in.fp16 = 0;
	in.bf16 = 0;
	in.micro_batch = a.batch;
	in.grad_accum = a.grad_accum;
	in.hidden_size = (uint64_t)a.hidden;
	/* WarmupCosineLR needs more steps than its warmup (at least 2): runs of 1 or 2 steps
	   use the start of a 3-step schedule */
	in.total_num_steps = a.steps < 3 ? 3 : a.steps;
	in.warmup_num_steps = a.steps / 10;
	in.lr = a.lr;
	if ((r = zinf_config_read_file(a.config, &in, &cfg))) {
		fprintf(stderr, "zinf_gpt: %s: %s\n", a.config, zinf_strerror(r));
		goto out;
	}
	if (cfg.fp16.enabled) {
		fprintf(stderr,
			"zinf_gpt: %s: fp16 needs loss scaling, which this example does not "
			"do yet: use bf16 or fp32\n",
			a.config);
		goto out;
	}
	if (cfg.gradient_clipping > 0 && lead) {
		fprintf(stderr,
			"zinf_gpt: warning: gradient_clipping %g is not applied (the engine "
			"has no clipping yet)\n",
			cfg.gradient_clipping);
	}
	struct zinf_engine_opts eo = cfg.engine; /* paths still owned by cfg */
	eo.device_backend = "host";		 /* the CPU layers read device memory */
	eo.comm = comm;
	if (a.step_after_backward) {
		eo.step_during_backward = false;
	}
	struct zinf_offload_opts *sec[2] = {&eo.offload_param, &eo.offload_optimizer};
	bool need_scratch = false;
	for (int s = 0; s < 2; s++) {
		for (uint32_t i = 0; i < sec[s]->n_paths; i++) {
			need_scratch |=
				!a.nvme_path && !strcmp(sec[s]->nvme_path[i], GPT_SCRATCH_PATH);
		}
	}
	if (need_scratch) {
		snprintf(scratch, sizeof(scratch), "%s/zinf-gpt-r%d-XXXXXX", a.scratch_parent,
			 t.rank);
		if (!mkdtemp(scratch)) {
			fprintf(stderr, "zinf_gpt: scratch directory under %s: %s\n",
				a.scratch_parent, strerror(errno));
			scratch[0] = 0;
			goto out;
		}
	}
	for (int s = 0; s < 2; s++) {
		for (uint32_t i = 0; i < sec[s]->n_paths; i++) {
			if (a.nvme_path) {
				sec[s]->nvme_path[i] = a.nvme_path;
			} else if (!strcmp(sec[s]->nvme_path[i], GPT_SCRATCH_PATH)) {
				sec[s]->nvme_path[i] = scratch;
			}
		}
	}
	t.gas = (int)eo.gradient_accumulation_steps;
	t.dtype = eo.dtype;
	t.m.d = (struct gpt_dims){.V = a.vocab,
				  .T = a.context,
				  .C = a.hidden,
				  .NH = a.heads,
				  .L = a.layers,
				  .B = (int)cfg.train_micro_batch_size_per_gpu};
	t.m.seed = a.seed;
	int spp = a.steps_per_print > 0 ? a.steps_per_print : (int)cfg.steps_per_print;
	if (spp < 1) {
		spp = 10;
	}

	if ((r = zinf_engine_create(&eo, &t.e))) {
		fprintf(stderr, "zinf_gpt: engine: %s\n", zinf_strerror(r));
		goto out;
	}
	t.dev = zinf_engine_device(t.e);
	t.cs = zinf_engine_compute_stream(t.e);
	if (strcmp(zinf_device_backend(t.dev), "host")) {
		fprintf(stderr, "zinf_gpt: the %s layers need the host device, not %s\n",
			t.ops->name, zinf_device_backend(t.dev));
		goto out;
	}
	if ((r = register_model(t.e, &t.m))) {
		goto out;
	}
	if ((r = zinf_engine_init(t.e))) {
		fprintf(stderr, "zinf_gpt: engine init: %s\n", zinf_strerror(r));
		goto out;
	}
	if ((r = bufs_alloc(&t))) {
		goto out;
	}
	if ((r = gpt_data_init(&data, a.vocab, a.fanout, a.seed))) {
		fprintf(stderr, "zinf_gpt: data: %s\n", zinf_strerror(r));
		goto out;
	}
	const struct gpt_dims *d = &t.m.d;
	int N = d->B * d->T;
	host_tok = malloc((size_t)(d->T + 1) * sizeof(int));
	if (!host_tok) {
		goto out;
	}
	if (lead && a.json && !(json = fopen(a.json, "w"))) {
		fprintf(stderr, "zinf_gpt: %s: %s\n", a.json, strerror(errno));
		goto out;
	}
	bool bar = lead && !a.no_progress && !a.quiet && isatty(STDERR_FILENO);
	const char *pt[] = {"device", "cpu", "nvme"};
	if (lead && !a.quiet) {
		printf("zinf_gpt: %s, ZeRO-%d, params %s, optimizer %s, %s, %d rank%s, comm %s\n",
		       a.config, eo.stage, pt[eo.offload_param.device],
		       pt[eo.offload_optimizer.device], zinf_dtype_name(eo.dtype), t.world,
		       t.world > 1 ? "s" : "", zinf_comm_backend(comm));
		printf("model: %d layers, %d heads, hidden %d, context %d, vocab %d: %llu "
		       "parameters; batch %d x %d x %d ranks = %lld sequences per step\n",
		       d->L, d->NH, d->C, d->T, d->V, (unsigned long long)t.m.n_params, d->B, t.gas,
		       t.world, (long long)cfg.train_batch_size);
		printf("data: Markov source, %d successors per token; entropy floor %.4f nats "
		       "(uniform %.4f)%s%s\n",
		       a.fanout, data.entropy, log((double)a.vocab), scratch[0] ? "; scratch " : "",
		       scratch);
		fflush(stdout);
	}

	double t_start = zinf_now_s(), win_t0 = t_start;
	double sum_exp_fetch = 0, sum_exp_step = 0, sum_opt = 0;
	uint64_t sum_rd = 0, sum_wr = 0;
	int steps_done = 0;
	losses = malloc((size_t)a.steps * sizeof(double));
	if (!losses) {
		goto out;
	}
	rank_loss = malloc((size_t)t.world * 2 * sizeof(float));
	if (!rank_loss) {
		goto out;
	}
	for (int step = 1; step <= a.steps && !g_stop; step++) {
		double lr = zinf_schedule_step_lr(&cfg.scheduler, step);
		if (!isfinite(lr)) {
			lr = cfg.engine.optimizer.lr;
		}
		if ((r = zinf_engine_set_lr(t.e, (float)lr))) {
			fprintf(stderr, "zinf_gpt: set_lr %g: %s\n", lr, zinf_strerror(r));
			goto out;
		}
		double loss_sum = 0, st0 = zinf_now_s();
		for (int micro = 0; micro < t.gas; micro++) {
			/* this rank's sequences: global sample indices (micro x world + rank) x B +
			   b, so every split of the global batch sees the same samples */
			double t0 = zinf_now_s();
			if ((r = zinf_stream_sync(t.cs))) {
				goto out;
			}
			for (int bi = 0; bi < d->B; bi++) {
				int64_t gi = ((int64_t)micro * t.world + t.rank) * d->B + bi;
				gpt_data_sample(&data, step, gi, d->T, host_tok);
				memcpy(t.b.host_io + (size_t)bi * d->T, host_tok,
				       (size_t)d->T * sizeof(int));
				memcpy(t.b.host_io + (size_t)(d->B + bi) * d->T, host_tok + 1,
				       (size_t)d->T * sizeof(int));
			}
			size_t nb = (size_t)N * sizeof(int);
			if ((r = zinf_device_copy(t.cs, t.b.tokens, t.b.host_io, nb,
						  ZINF_COPY_H2D)) ||
			    (r = zinf_device_copy(t.cs, t.b.targets, t.b.host_io + N, nb,
						  ZINF_COPY_H2D))) {
				goto out;
			}
			t.tm.data += zinf_now_s() - t0;
			double ls;
			if ((r = micro_batch(&t, &ls))) {
				goto out;
			}
			loss_sum += ls;
			t0 = zinf_now_s();
			r = zinf_engine_step(t.e);
			t.tm.step += zinf_now_s() - t0;
			if (r < 0) {
				fprintf(stderr, "zinf_gpt: rank %d: step %d: %s\n", t.rank, step,
					zinf_strerror(r));
				goto out;
			}
			if (r != (micro == t.gas - 1)) {
				fprintf(stderr,
					"zinf_gpt: step %d micro-batch %d: step returned %d\n",
					step, micro, r);
				goto out;
			}
		}
		/* the step's loss: mean over the global batch, summed in rank order; each rank's
		   mean travels as two floats (high part and remainder: 48 bits of the double) */
		double mean = loss_sum / ((double)N * t.gas);
		float mine[2] = {(float)mean, (float)(mean - (double)(float)mean)};
		if ((r = zinf_comm_all_gather(comm, mine, rank_loss, 2, ZINF_F32, NULL))) {
			fprintf(stderr, "zinf_gpt: loss all-gather: %s\n", zinf_strerror(r));
			goto out;
		}
		double loss = 0;
		for (int i = 0; i < t.world; i++) {
			loss += (double)rank_loss[2 * i] + (double)rank_loss[2 * i + 1];
		}
		loss /= t.world;
		double step_wall = zinf_now_s() - st0;
		struct zinf_engine_stats es = {.size = sizeof(es)};
		zinf_engine_get_stats(t.e, &es);
		sum_exp_fetch += es.exposed_fetch_s;
		sum_exp_step += es.exposed_step_s;
		sum_opt += es.optimizer_s;
		sum_rd += es.nvme_read_bytes;
		sum_wr += es.nvme_write_bytes;
		long long lk = locked_bytes();
		double toks = (double)N * t.gas * t.world / step_wall;
		steps_done = step;
		losses[step - 1] = loss;
		if (json) {
			fprintf(json,
				"{\"step\": %d, \"loss\": %.17g, \"floor\": %.17g, \"lr\": %.9g, "
				"\"step_s\": %.6f, \"tokens_per_s\": %.1f, \"nvme_read_bytes\": "
				"%llu, "
				"\"nvme_write_bytes\": %llu, \"nvme_read_GBps\": %.6f, "
				"\"nvme_write_GBps\": %.6f, \"pinned_bytes\": %lld, "
				"\"exposed_fetch_s\": %.6f, \"exposed_step_s\": %.6f, "
				"\"optimizer_s\": %.6f, \"stepped_during_backward\": %u, "
				"\"sub_groups\": %u, \"trace_hits\": %llu, \"trace_misses\": %llu, "
				"\"peak_live_elems\": %llu}\n",
				step, loss, data.entropy, lr, step_wall, toks,
				(unsigned long long)es.nvme_read_bytes,
				(unsigned long long)es.nvme_write_bytes,
				es.nvme_read_bytes / step_wall / 1e9,
				es.nvme_write_bytes / step_wall / 1e9, lk, es.exposed_fetch_s,
				es.exposed_step_s, es.optimizer_s, es.stepped_during_backward,
				es.sub_groups, (unsigned long long)es.trace_hits,
				(unsigned long long)es.trace_misses,
				(unsigned long long)es.peak_live_elems);
		}
		if (lead && !a.quiet && (step % spp == 0 || step == 1 || step == a.steps)) {
			double wall = zinf_now_s() - win_t0;
			if (bar) {
				fprintf(stderr, "\r\033[K");
			}
			printf("step %5d/%d | loss %.4f (floor %.4f) | lr %.3e | %7.0f tok/s | "
			       "nvme r %.3f w %.3f GB/s | pinned %.1f MiB | exposed fetch %.1f ms "
			       "step %.1f ms\n",
			       step, a.steps, loss, data.entropy, lr, toks,
			       es.nvme_read_bytes / step_wall / 1e9,
			       es.nvme_write_bytes / step_wall / 1e9,
			       lk < 0 ? 0.0 : (double)lk / (1 << 20), es.exposed_fetch_s * 1e3,
			       es.exposed_step_s * 1e3);
			fflush(stdout);
			(void)wall;
			win_t0 = zinf_now_s();
		}
		if (bar) {
			progress(step, a.steps, loss, data.entropy);
		}
	}
	if (bar) {
		fprintf(stderr, "\r\033[K");
	}
	double total = zinf_now_s() - t_start;
	if (lead) {
		/* from the first step's loss to the mean of the last tenth of the steps run */
		int tail_n = steps_done / 10 > 0 ? steps_done / 10 : 1;
		double to = 0, first_loss = steps_done ? losses[0] : NAN;
		for (int i = steps_done - tail_n; i < steps_done; i++) {
			to += i >= 0 ? losses[i] / tail_n : NAN;
		}
		double other = total - t.tm.compute - t.tm.fetch - t.tm.grad - t.tm.step;
		printf("summary: %d steps in %.1f s (%.0f tokens/s); loss %.4f -> %.4f (mean of "
		       "the "
		       "last %d steps), floor %.4f: %.0f%% of the way from %.4f (uniform)\n",
		       steps_done, total, (double)N * t.gas * t.world * steps_done / total,
		       first_loss, to, tail_n, data.entropy,
		       100.0 * (log((double)d->V) - to) / (log((double)d->V) - data.entropy),
		       log((double)d->V));
		printf("time (rank 0): compute %.1f s (%.0f%%), waiting for parameters %.1f s "
		       "(%.0f%%; engine's exposed fetch %.1f s), optimizer %.1f s (%.0f%%; "
		       "exposed step %.1f s, optimizer kernel %.1f s in all), gradient hand-off "
		       "%.1f s, data and other %.1f s\n",
		       t.tm.compute, 100 * t.tm.compute / total, t.tm.fetch,
		       100 * t.tm.fetch / total, sum_exp_fetch, t.tm.step, 100 * t.tm.step / total,
		       sum_exp_step, sum_opt, t.tm.grad, other);
		printf("nvme (rank 0): %.1f MB read, %.1f MB written\n", sum_rd / 1e6,
		       sum_wr / 1e6);
		fflush(stdout);
	}
	rc = g_stop ? 130 : 0;
out:
	free(rank_loss);
	free(losses);
	if (json) {
		fclose(json);
	}
	free(host_tok);
	bufs_free(&t);
	zinf_engine_destroy(t.e);
	zinf_comm_destroy(comm);
	gpt_data_fini(&data);
	zinf_config_fini(&cfg);
	scratch_remove(scratch);
	return rc;
}
