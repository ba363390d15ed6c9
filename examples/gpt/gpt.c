/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt.c: zinf_gpt, a GPT trained through zinf's public API, as a user's trainer
 * would be written: the parameters live in the ZeRO engine (zinf/engine.h), in the tiers a
 * DeepSpeed configuration names (by default ZeRO-3 with parameters and optimizer state on NVMe
 * under a scratch directory this program creates and removes, and which the next run on this
 * machine removes when this one is killed). Runs alone or under `mpirun -np N` (the collectives
 * are chosen by zinf: mpi under a launcher, else single).
 * `zinf_gpt --help` lists the flags (gpt_args.c).
 *
 * This file: the configuration ("auto" from the flags; a nvme_path "scratch" becomes the
 * scratch directory), the engine, the loop over optimizer steps (the lr schedule, the
 * micro-batches of gpt_train.c, the step), the output (a line every steps_per_print steps, a
 * progress bar on a terminal, --json records, the summary). The data (gpt_data.h) is a Markov
 * source with a known entropy rate, printed as the loss's floor, or a token file (--data,
 * gpt_tokens.h) in a fixed order. gradient_clipping and fp16
 * loss scaling are the engine's: the trainer multiplies dL/dlogits by zinf_engine_loss_scale
 * and hands fp16 gradients as f16 (gpt_train.c), and takes zinf_engine_step's 2 (a step
 * skipped on an fp16 overflow) as DeepSpeed's engine does: the step is counted and reported
 * ("skipped"), the lr schedule is not advanced (DeepSpeed calls lr_scheduler.step() only for
 * an applied step). OneCycle with cycle_momentum also sets the betas each step
 * (zinf_engine_set_betas: the momentum and 0.99, as DeepSpeed's scheduler writes them).
 *
 * --device picks the layers at run time: host (gpt_cpu.c on zinf's "host" device, collectives
 * mpi or single) or cuda (gpt_cuda.cu, built with CUDA, on the "cuda" device: the trainer's own
 * cudaStream_t is the engine's compute stream, the collectives are nccl's, so the loss
 * all-gather goes through device memory); auto takes cuda when zinf opens a CUDA device. Not
 * here: the checkpoint format (zinf's; the trainer's blob below).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zinf/blocks/comm.h>
#include <zinf/blocks/swap.h>
#include <zinf/config.h>
#include <zinf/device.h>
#include <zinf/engine.h>
#include <zinf/schedule.h>

#include "gpt.h"
#include "gpt_data.h"
#include "gpt_tokens.h"
#include "zinf/checkpoint.h"

/* A configuration's nvme_path with this value is replaced by the scratch directory. */
#define GPT_SCRATCH_PATH "scratch"

static volatile sig_atomic_t g_stop;

static void
on_signal(int sig)
{
	(void)sig;
	g_stop = 1;
}

/*
 * SIGINT, SIGTERM, SIGHUP (the terminal or the ssh session went away) and SIGPIPE (stdout's
 * reader went away: `zinf_gpt | head`) set the stop flag: every rank stops after the same step,
 * saves (--save) and removes its scratch directory. SIGXFSZ is ignored: a write past
 * `ulimit -f` then fails with EFBIG, which the engine reports, instead of killing the process
 * with its swap files left behind.
 */
static void
catch_signals(void)
{
	static const int sigs[] = {SIGINT, SIGTERM, SIGHUP, SIGPIPE};
	struct sigaction sa = {.sa_handler = on_signal, .sa_flags = SA_RESTART};
	sigemptyset(&sa.sa_mask);
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
		sigaction(sigs[i], &sa, NULL);
	}
	signal(SIGXFSZ, SIG_IGN);
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

/* Everything one run holds; run_fini() frees what is set. */
struct run {
	struct gpt_args a;
	struct gpt_trainer t;
	struct zinf_train_config cfg;
	struct zinf_comm *comm;
	struct gpt_data data;	  /* the Markov source (without --data) */
	struct gpt_tokens tokens; /* --data's token file (not opened without) */
	double floor_;		  /* the loss's floor: the source's entropy rate; NaN for --data */
	FILE *json;
	struct zinf_scratch_dir *scratch; /* NULL when none was made */
	int log_rank, spp;
	bool lead, bar;
	int *host_tok;	  /* [T + 1] one sample */
	float *rank_loss; /* [3 x world]: loss (two floats), stop flag */
	bool stop;	  /* a rank was interrupted: every rank stops after this step */
	bool all_know;	  /* an error every rank saw (no notice to send on the way out) */
	double *losses;	  /* [steps] */
	int sched_step;	  /* the lr schedule's step: applied (not skipped) steps + 1 */
	bool no_momentum; /* OneCycle's cycle_momentum off: the optimizer has no betas */
	double beta1;	  /* this step's OneCycle momentum; NaN without */
	/* sums over the steps run, from the engine's per-step statistics */
	double exposed_fetch_s, exposed_step_s, optimizer_s;
	uint64_t nvme_read, nvme_write;
	int steps_done;
	int resumed_at;	   /* --resume: the checkpoint's step (0: from scratch) */
	float *dev_loss;   /* nccl collectives: [3 + 3 x world] device floats for the loss gather */
	struct gpt_hf *hf; /* --from-hf: the checkpoint the initial values come from */
	int vocab, hidden; /* the model's: the flags', or --from-hf's config.json */
};

/* ---- the scratch directory ----------------------------------------------------------------- */

/* The scratch directories' names under --scratch-parent: zinf-gpt-<host>-<pid>-r<rank>-XXXXXX,
   each under the lock zinf-gpt-<host>-<pid>-r<rank>.lock that its run holds
   (zinf/blocks/swap.h). */
#define GPT_SCRATCH_STEM "zinf-gpt"

static void
reclaimed(void *ctx, const char *path, int64_t pid, int status)
{
	(void)ctx;
	if (status == ZINF_SCRATCH_REMOVED) {
		fprintf(stderr, "zinf_gpt: removed %s, left by pid %lld, which no longer runs\n",
			path, (long long)pid);
	} else if (status == ZINF_SCRATCH_KEPT_NO_LOCK) {
		fprintf(stderr,
			"zinf_gpt: left %s alone: named like the scratch of pid %lld, which no "
			"longer runs, but its lock file is missing (not known to be zinf's)\n",
			path, (long long)pid);
	} else if (status < 0) {
		fprintf(stderr, "zinf_gpt: could not remove %s, left by pid %lld: %s\n", path,
			(long long)pid, zinf_strerror(status));
	}
	/* kept: a live run's (or one whose lock is held), or another host's: nothing to say */
}

/*
 * Every nvme_path "scratch" (or all of them with --nvme-path) of the engine options. Before its
 * own directory is made, each machine's first rank removes what runs on this machine that are
 * gone (kill -9, the OOM killer, an MPI abort) left under --scratch-parent: directories whose
 * run no longer runs, under their lock file, which must be there and free; the directories of
 * live runs (this job's other ranks, other jobs), of other machines (their first rank reclaims
 * them) and whatever else the directory holds stay.
 */
static int
scratch_setup(struct run *R, struct zinf_engine_opts *eo)
{
	struct zinf_offload_opts *sec[2] = {&eo->offload_param, &eo->offload_optimizer};
	bool need = false;
	for (int s = 0; s < 2; s++) {
		for (uint32_t i = 0; i < sec[s]->n_paths; i++) {
			need |= !R->a.nvme_path && !strcmp(sec[s]->nvme_path[i], GPT_SCRATCH_PATH);
		}
	}
	if (need) {
		const char *parent = R->a.scratch_parent;
		char tag[32];
		if (zinf_comm_local_rank(R->comm) == 0) {
			(void)zinf_scratch_reclaim(parent, GPT_SCRATCH_STEM, reclaimed, NULL);
		}
		snprintf(tag, sizeof(tag), "r%d", R->t.rank);
		int r = zinf_scratch_dir_create(parent, GPT_SCRATCH_STEM, tag, &R->scratch);
		if (r) {
			fprintf(stderr,
				"zinf_gpt: scratch directory under --scratch-parent %s: %s\n",
				parent, zinf_strerror(r));
			return r;
		}
	}
	for (int s = 0; s < 2; s++) {
		for (uint32_t i = 0; i < sec[s]->n_paths; i++) {
			if (R->a.nvme_path) {
				sec[s]->nvme_path[i] = R->a.nvme_path;
			} else if (!strcmp(sec[s]->nvme_path[i], GPT_SCRATCH_PATH)) {
				sec[s]->nvme_path[i] = zinf_scratch_dir_path(R->scratch);
			}
		}
	}
	return 0;
}

/* ---- set-up -------------------------------------------------------------------------------- */

/* A configuration integer that lands in an int of the trainer: 0 when in [lo, hi], else -EINVAL
   after a message naming the key, the value and the range (`what`: where the range is from). */
static int
config_int(const struct run *R, const char *key, long long v, long long lo, long long hi,
	   const char *what)
{
	if (v >= lo && v <= hi) {
		return 0;
	}
	fprintf(stderr, "zinf_gpt: %s: %s %lld is out of range: zinf_gpt takes [%lld, %lld] (%s)\n",
		R->a.config, key, v, lo, hi, what);
	return -EINVAL;
}

/* The configuration, "auto" resolved from the flags as Hugging Face's integration does. */
static int
read_config(struct run *R)
{
	const struct gpt_args *a = &R->a;
	struct zinf_config_inputs in;
	zinf_config_inputs_init(&in);
	in.world_size = R->t.world;
	in.fp16 = 0;
	in.bf16 = 0;
	in.micro_batch = a->batch;
	in.grad_accum = a->grad_accum;
	in.hidden_size = (uint64_t)R->hidden;
	/* WarmupCosineLR needs more steps than its warmup (at least 2): runs of 1 or 2 steps
	   use the start of a 3-step schedule */
	in.total_num_steps = a->steps < 3 ? 3 : a->steps;
	in.warmup_num_steps = a->steps / 10;
	in.lr = a->lr;
	int r = zinf_config_read_file(a->config, &in, &R->cfg);
	if (r) {
		fprintf(stderr, "zinf_gpt: %s: %s\n", a->config, zinf_strerror(r));
		return r;
	}
	/* gradient_clipping and fp16 loss scaling: applied by the engine (cfg.engine carries
	   them). The integers kept in ints: within their flags' ranges (the library takes up to
	   2^63 - 1); the global batch is an int32 of the checkpoint, and the positions of a
	   micro-batch (B x T) an int of the layers. */
	const struct zinf_train_config *c = &R->cfg;
	r = config_int(R, "train_micro_batch_size_per_gpu", c->train_micro_batch_size_per_gpu, 1,
		       GPT_MAX_BATCH, "the range of --batch");
	r = r
		    ?: config_int(R, "gradient_accumulation_steps",
				  c->engine.gradient_accumulation_steps, 1, GPT_MAX_GRAD_ACCUM,
				  "the range of --grad-accum");
	r = r
		    ?: config_int(R, "train_batch_size", c->train_batch_size, 1, INT32_MAX,
				  "a checkpoint holds it as an int32");
	r = r
		    ?: config_int(R, "train_micro_batch_size_per_gpu x --context",
				  c->train_micro_batch_size_per_gpu * a->context, 1, INT32_MAX,
				  "the positions of a micro-batch, an int of the layers");
	if (!r && a->steps_per_print <= 0) {
		r = config_int(R, "steps_per_print", c->steps_per_print, 1, GPT_MAX_SPP,
			       "the range of --steps-per-print");
	}
	if (r) {
		return r;
	}
	R->spp = a->steps_per_print > 0 ? a->steps_per_print : (int)c->steps_per_print;
	return 0;
}

/* The engine over the configuration, the model registered and initialised, the buffers. */
static int
make_engine(struct run *R)
{
	struct gpt_trainer *t = &R->t;
	struct zinf_engine_opts eo = R->cfg.engine; /* its paths stay owned by cfg */
	eo.device_backend = t->ops->device;	    /* the device whose memory the layers take */
	eo.comm = R->comm;
	if (!isnan(R->a.comm_timeout)) {
		eo.comm_timeout_s = R->a.comm_timeout; /* as the comm's (the engine may read it) */
	}
	if (R->a.step_after_backward) {
		eo.step_during_backward = false;
	}
	int r = scratch_setup(R, &eo);
	if (r) {
		return r;
	}
	t->gas = (int)eo.gradient_accumulation_steps;
	t->vertical = R->a.vertical ? t->gas : 0; /* a step's micro-batches in one pass */
	t->dtype = eo.dtype;
	t->m.d = (struct gpt_dims){.V = R->a.vocab,
				   .T = R->a.context,
				   .C = R->a.hidden,
				   .NH = R->a.heads,
				   .L = R->a.layers,
				   .B = (int)R->cfg.train_micro_batch_size_per_gpu,
				   .arch = strcmp(R->a.arch, "llama") ? GPT_ARCH_GPT2
								      : GPT_ARCH_LLAMA,
				   .KVH = R->a.kv_heads,
				   .FF = R->a.ffn,
				   .untied = R->a.untied,
				   .rope_theta = R->a.rope_theta};
	t->m.seed = R->a.seed;
	t->m.decay_all = R->a.decay_all;
	if (R->a.from_hf) { /* the shape and the initial values from the checkpoint */
		if (gpt_hf_open(R->a.from_hf, &t->m.d, &R->hf)) {
			return -EINVAL;
		}
		t->m.init = gpt_hf_init;
		t->m.init_ctx = R->hf;
	}
	if (t->ops->open) {
		/* a GPU: this rank's device (the local rank modulo the devices, as the engine and
		   nccl pick it), the trainer's stream on it */
		int n = zinf_device_count(t->ops->device);
		eo.device_index = n > 0 ? zinf_comm_local_rank(R->comm) % n : 0;
		if ((r = t->ops->open(eo.device_index, &t->ops_ctx, &eo.compute_stream))) {
			return r;
		}
	}
	if ((r = zinf_engine_create(&eo, &t->e))) {
		fprintf(stderr, "zinf_gpt: engine: %s\n", zinf_strerror(r));
		return r;
	}
	t->dev = zinf_engine_device(t->e);
	t->cs = zinf_engine_compute_stream(t->e);
	if (strcmp(zinf_device_backend(t->dev), t->ops->device)) {
		fprintf(stderr, "zinf_gpt: the %s layers need the %s device, not %s\n",
			t->ops->name, t->ops->device, zinf_device_backend(t->dev));
		return -ENODEV;
	}
	if ((r = gpt_register(t))) {
		return r;
	}
	if (R->hf && !R->a.resume && gpt_hf_bind(R->hf, &t->m)) {
		return -EINVAL;
	}
	if (!R->a.resume && (r = zinf_engine_init(t->e))) { /* --resume: the load inits */
		fprintf(stderr, "zinf_gpt: engine init: %s\n", zinf_strerror(r));
		return r;
	}
	if (R->lead && !R->a.quiet) {
		static const char *const tier[] = {"device", "cpu", "nvme"};
		printf("zinf_gpt: %s, ZeRO-%d, params %s, optimizer %s, %s, %d rank%s, comm %s, "
		       "layers %s\n",
		       R->a.config, eo.stage, tier[eo.offload_param.device],
		       tier[eo.offload_optimizer.device], zinf_dtype_name(eo.dtype), t->world,
		       t->world > 1 ? "s" : "", zinf_comm_backend(R->comm), t->ops->name);
	}
	if (!strcmp(zinf_comm_backend(R->comm), "nccl") &&
	    (r = zinf_device_alloc(t->dev, (size_t)(3 + 3 * t->world) * sizeof(float),
				   (void **)&R->dev_loss))) {
		fprintf(stderr, "zinf_gpt: device buffer for the loss: %s\n", zinf_strerror(r));
		return r;
	}
	return gpt_bufs_alloc(t);
}

/*
 * --device into t->ops: host, cuda, or auto (cuda when zinf's cuda backend has a device).
 * 0; 2 for --device cuda in a build without gpt_cuda.cu; GPT_EXIT_NO_GPU for --device cuda
 * without a CUDA device.
 */
static int
pick_layers(struct run *R)
{
	const char *want = R->a.device;
	R->t.ops = &gpt_cpu_ops;
	if (!strcmp(want, "host")) {
		return 0;
	}
#ifdef GPT_HAVE_CUDA
	int n = zinf_device_count("cuda");
	if (n > 0) {
		R->t.ops = &gpt_cuda_ops;
		return 0;
	}
	if (!strcmp(want, "auto")) {
		return 0;
	}
	fprintf(stderr,
		"zinf_gpt: --device cuda: no GPU: zinf opens no CUDA device (%s; is the library "
		"built with CUDA, the driver loaded, CUDA_VISIBLE_DEVICES set?)\n",
		zinf_strerror(n));
	return GPT_EXIT_NO_GPU;
#else
	if (!strcmp(want, "auto")) {
		return 0;
	}
	fprintf(stderr, "zinf_gpt: --device cuda: this zinf_gpt was built without the CUDA layers "
			"(gpt_cuda.cu; configure with CUDA and NCCL)\n");
	return 2;
#endif
}

static int check_save_dir(struct run *R);

static int
run_init(struct run *R, int argc, char **argv)
{
	struct gpt_trainer *t = &R->t;
	int r;
	if (gpt_args_parse(argc, argv, &R->a) || gpt_log_level_from_env()) {
		return 2;
	}
	/* the vocabulary (the data's range) and the hidden size (the configuration's "auto"s)
	   before the engine: --from-hf's config.json, whose sizes the import checks again */
	R->vocab = R->a.vocab;
	R->hidden = R->a.hidden;
	struct zinf_hf_model hf = {.size = sizeof(hf)};
	if (R->a.from_hf) { /* (the sizes are at most 2^24 and 2^20: they fit an int) */
		if (zinf_hf_model_read(R->a.from_hf, &hf)) {
			fprintf(stderr, "zinf_gpt: --from-hf %s: %s\n", R->a.from_hf,
				zinf_last_error());
			return 1;
		}
		R->vocab = (int)hf.vocab;
		R->hidden = (int)hf.hidden;
	}
	if ((r = pick_layers(R))) {
		return r;
	}
	t->host_layers = t->ops->open == NULL;
	zinf_log_set_callback(logcb, &R->log_rank);
	catch_signals();
	struct zinf_comm_opts co;
	zinf_comm_opts_init(&co);
	if (!t->host_layers) {
		co.backend = "nccl"; /* the engine on a GPU takes nccl's collectives only */
	}
	if (!isnan(R->a.comm_timeout)) {
		co.timeout_s = R->a.comm_timeout; /* the engine's collectives are this comm's */
	}
	if ((r = zinf_comm_create(&co, &R->comm))) {
		fprintf(stderr, "zinf_gpt: collectives%s: %s\n",
			t->host_layers ? "" : " (nccl, for the cuda layers)", zinf_strerror(r));
		return 1;
	}
	t->rank = R->log_rank = zinf_comm_rank(R->comm);
	t->world = zinf_comm_world(R->comm);
	R->lead = t->rank == 0;
	/* the data first: a token file's fault stops the run before the engine exists */
	if (R->a.data) {
		char err[1024];
		if (gpt_tokens_open(&R->tokens, R->a.data, (enum gpt_tokens_format)R->a.data_dtype,
				    R->vocab, R->a.from_hf ? "config.json's vocab_size" : NULL,
				    R->a.context, err, sizeof(err))) {
			fprintf(stderr, "zinf_gpt: --data %s\n", err);
			return 1;
		}
		R->floor_ = NAN;
	} else if ((r = gpt_data_init(&R->data, R->vocab, R->a.fanout, R->a.seed))) {
		fprintf(stderr, "zinf_gpt: data: %s\n", zinf_strerror(r));
		return 1;
	} else {
		R->floor_ = R->data.entropy;
	}
	if (read_config(R) || make_engine(R)) {
		return 1;
	}
	R->host_tok = malloc((size_t)(t->m.d.T + 1) * sizeof(int));
	R->rank_loss = malloc((size_t)t->world * 3 * sizeof(float));
	R->losses = malloc((size_t)R->a.steps * sizeof(double));
	if (!R->host_tok || !R->rank_loss || !R->losses) {
		fprintf(stderr, "zinf_gpt: out of memory\n");
		return 1;
	}
	if (R->a.save && check_save_dir(R)) {
		return 1;
	}
	if (R->lead && R->a.json && !(R->json = fopen(R->a.json, "w"))) {
		fprintf(stderr, "zinf_gpt: %s: %s\n", R->a.json, strerror(errno));
		return 1;
	}
	R->bar = R->lead && !R->a.no_progress && !R->a.quiet && isatty(STDERR_FILENO);
	if (R->lead && !R->a.quiet) {
		const struct gpt_dims *d = &t->m.d;
		char kv[96] = "";
		if (d->arch == GPT_ARCH_LLAMA) {
			snprintf(kv, sizeof(kv), " (%d key-value), MLP %d, rope theta %g, %s head",
				 gpt_kvh(d), gpt_ff(d), gpt_rope_theta(d),
				 gpt_tied(d) ? "tied" : "own");
		}
		printf("model: %s%s%s, %d layers, %d heads%s, hidden %d, context %d, vocab %d: "
		       "%llu "
		       "parameters; batch %d x %d x %d ranks = %lld sequences per step\n",
		       d->arch == GPT_ARCH_LLAMA ? "llama" : "gpt2", R->a.from_hf ? " from " : "",
		       R->a.from_hf ? R->a.from_hf : "", d->L, d->NH, kv, d->C, d->T, d->V,
		       (unsigned long long)t->m.n_params, d->B, t->gas, t->world,
		       (long long)R->cfg.train_batch_size);
		if (R->a.data) {
			const struct gpt_tokens *tk = &R->tokens;
			printf("data: %s, %s, %llu tokens (largest %u; uniform loss %.4f); row G "
			       "of a step is the %d + 1 tokens from G x %d mod %llu%s%s\n",
			       R->a.data, tk->what, (unsigned long long)tk->n, tk->max_token,
			       log((double)d->V), d->T, d->T, (unsigned long long)tk->n,
			       R->scratch ? "; scratch " : "", zinf_scratch_dir_path(R->scratch));
		} else {
			printf("data: Markov source, %d successors per token; entropy floor %.4f "
			       "nats (uniform %.4f)%s%s\n",
			       R->a.fanout, R->data.entropy, log((double)d->V),
			       R->scratch ? "; scratch " : "", zinf_scratch_dir_path(R->scratch));
		}
		const struct zinf_train_config *c = &R->cfg;
		printf("training: lr %g, %s; weight decay %g on %u of %u tensors (%llu "
		       "parameters%s)\n",
		       (double)c->engine.optimizer.lr,
		       c->scheduler.type == ZINF_SCHED_NONE ? "constant (no scheduler)"
							    : zinf_schedule_name(c->scheduler.type),
		       (double)c->engine.optimizer.weight_decay, t->m.n_tensors - t->m.t_no_decay,
		       t->m.n_tensors, (unsigned long long)(t->m.n_params - t->m.n_no_decay),
		       t->m.decay_all
			       ? ": all, --decay-all"
			       : ": weight matrices and embeddings; not biases and norm weights, "
				 "as Hugging Face's Trainer groups them");
		fflush(stdout);
	}
	return 0;
}

static void
run_fini(struct run *R)
{
	if (R->json) {
		fclose(R->json);
	}
	free(R->host_tok);
	free(R->rank_loss);
	free(R->losses);
	gpt_bufs_free(&R->t);
	if (R->dev_loss) {
		zinf_device_free(R->t.dev, R->dev_loss);
	}
	zinf_engine_destroy(R->t.e);
	if (R->comm) { /* a rank still training fails its next collective naming this step */
		char why[64];
		snprintf(why, sizeof(why), "zinf_gpt after step %d", R->steps_done);
		(void)zinf_comm_leave(R->comm, why);
	}
	zinf_comm_destroy(R->comm);
	if (R->t.ops && R->t.ops->close) { /* the stream the engine wrapped: after the engine */
		R->t.ops->close(R->t.ops_ctx);
	}
	gpt_data_fini(&R->data);
	gpt_tokens_close(&R->tokens);
	gpt_hf_close(R->hf);
	gpt_model_free(&R->t.m);
	zinf_config_fini(&R->cfg);
	zinf_scratch_dir_destroy(R->scratch); /* after the engine, which wrote into it */
}

/* ---- checkpoints (--save, --resume) -------------------------------------------------------- */

/* The trainer's own state, the checkpoint's client blob: where the loop is, the schedule's
 * position, what the data and model were made from, and the losses so far (for the summary).
 * The data of a step is a function of (seed, step) only, so nothing else is needed to go on
 * exactly where the run stopped. */
struct gpt_ckpt_head {
	char magic[8]; /* "zgptck2" */
	int32_t step;  /* loop steps done */
	int32_t sched_step;
	uint64_t seed;
	/* V T C NH L, the global batch (sequences per step), fanout, arch, key-value heads, MLP
	   width, untied head */
	int32_t dims[11];
	double rope_theta;
	int32_t gas; /* informative: a resumed run may cut the global batch otherwise */
};

static void
ckpt_dims(const struct run *R, int32_t out[11])
{
	const struct gpt_dims *d = &R->t.m.d;
	/* the samples of a step depend on the global batch only (gpt_data.h): another split over
	   ranks and micro-batches (another world size) continues the same run */
	/* fanout: the Markov source's, 0 for --data (a run of the other source is refused; the
	   token file itself is not identified) */
	int32_t v[11] = {d->V,
			 d->T,
			 d->C,
			 d->NH,
			 d->L,
			 d->B * R->t.gas * R->t.world,
			 R->a.data ? 0 : R->a.fanout,
			 d->arch,
			 gpt_kvh(d),
			 gpt_ff(d),
			 !gpt_tied(d)};
	memcpy(out, v, sizeof(v));
}

static int
step_of_tag(const char *name)
{
	int n = -1, len = 0;
	return sscanf(name, "step%d%n", &n, &len) == 1 && name[len] == '\0' && n >= 0 ? n : -1;
}

static int
cmp_desc(const void *a, const void *b)
{
	return *(const int *)b - *(const int *)a;
}

static int
rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb, (void)flag, (void)ftw;
	return remove(path);
}

/* --keep N: the newest N "step<k>" checkpoints of --save's directory stay (and the one `latest`
 * names, whatever its age); each older one is renamed to a temporary name first (a crash leaves
 * no half checkpoint under a tag: zinf's next save removes such names), then removed. Rank 0,
 * after a save was published. */
static void
prune_checkpoints(struct run *R)
{
	if (!R->lead || R->a.keep <= 0) {
		return;
	}
	DIR *d = opendir(R->a.save);
	if (!d) {
		return;
	}
	int *steps = NULL, n = 0, cap = 0, latest = -1;
	char p[4096];
	snprintf(p, sizeof(p), "%s/latest", R->a.save);
	FILE *f = fopen(p, "r");
	char line[160] = "";
	if (f) {
		if (fgets(line, sizeof(line), f)) {
			line[strcspn(line, "\n")] = '\0';
			latest = step_of_tag(line);
		}
		fclose(f);
	}
	struct dirent *de;
	while ((de = readdir(d))) {
		int k = step_of_tag(de->d_name);
		if (k < 0) {
			continue;
		}
		if (n == cap) {
			int *g = realloc(steps, (size_t)(cap = cap ? 2 * cap : 16) * sizeof(int));
			if (!g) {
				break;
			}
			steps = g;
		}
		steps[n++] = k;
	}
	closedir(d);
	qsort(steps, (size_t)n, sizeof(int), cmp_desc);
	for (int i = R->a.keep; i < n; i++) {
		if (steps[i] == latest) {
			continue;
		}
		char from[4096], to[4096];
		snprintf(from, sizeof(from), "%s/step%d", R->a.save, steps[i]);
		snprintf(to, sizeof(to), "%s/.step%d.tmp", R->a.save, steps[i]);
		if (rename(from, to) == 0) {
			nftw(to, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
		}
	}
	free(steps);
}

/*
 * --test-kill-in-save POINT:TAG (the crash tests'): a save's progress hook
 * (zinf_ckpt_opts.progress) that kills this process as a kill -9 would, when a save of TAG reaches
 * POINT. The trainer kills itself; the library never does.
 */
static void
kill_in_save(void *ctx, const char *point, const char *tag)
{
	const char *want = ctx; /* "POINT:TAG" */
	size_t n = strlen(point);
	if (strncmp(want, point, n) == 0 && want[n] == ':' && strcmp(want + n + 1, tag) == 0) {
		raise(SIGKILL);
	}
}

static int
save_checkpoint(struct run *R, int step, bool background)
{
	size_t n = sizeof(struct gpt_ckpt_head) + (size_t)step * sizeof(double);
	char *buf = calloc(1, n);
	if (!buf) {
		return -ENOMEM;
	}
	struct gpt_ckpt_head h = {.magic = "zgptck2",
				  .rope_theta = gpt_rope_theta(&R->t.m.d),
				  .step = step,
				  .sched_step = R->sched_step,
				  .seed = R->a.seed,
				  .gas = R->t.gas};
	ckpt_dims(R, h.dims);
	memcpy(buf, &h, sizeof(h));
	memcpy(buf + sizeof(h), R->losses, (size_t)step * sizeof(double));
	struct zinf_ckpt_opts o;
	zinf_ckpt_opts_init(&o);
	o.client = buf;
	o.client_bytes = n;
	o.background = background; /* published by the next step, which waits for its copy */
	if (R->a.test_kill_in_save) {
		o.progress = kill_in_save;
		o.progress_ctx = (void *)R->a.test_kill_in_save;
	}
	char tag[32];
	snprintf(tag, sizeof(tag), "step%d", step);
	double t0 = zinf_now_s();
	int r = zinf_engine_save(R->t.e, R->a.save, tag, &o);
	free(buf);
	if (!r) { /* every earlier save is published now (a background one before this one) */
		prune_checkpoints(R);
	}
	if (r) {
		fprintf(stderr, "zinf_gpt: saving %s/%s: %s\n", R->a.save, tag, zinf_strerror(r));
	} else if (R->lead && !R->a.quiet) {
		if (R->bar) {
			fprintf(stderr, "\r\033[K");
		}
		printf("checkpoint: step %d %s %s/%s in %.2f s\n", step,
		       background ? "being saved (in the background) into" : "saved into",
		       R->a.save, tag, zinf_now_s() - t0);
		fflush(stdout);
	}
	return r;
}

/* Load --resume's latest checkpoint in place of the engine's init; the loop goes on from the
 * step after it. */
static int
resume_checkpoint(struct run *R, int *first_step)
{
	size_t cap = sizeof(struct gpt_ckpt_head) + (size_t)R->a.steps * sizeof(double);
	char *buf = calloc(1, cap);
	if (!buf) {
		return -ENOMEM;
	}
	struct zinf_ckpt_opts o;
	zinf_ckpt_opts_init(&o);
	o.client_out = buf;
	o.client_cap = cap;
	int r = zinf_engine_load(R->t.e, R->a.resume, NULL, &o);
	struct gpt_ckpt_head h;
	int32_t dims[11];
	ckpt_dims(R, dims);
	if (r == -ENOSPC) {
		fprintf(stderr, "zinf_gpt: %s: its run went past --steps %d: nothing to do\n",
			R->a.resume, R->a.steps);
	} else if (r) {
		fprintf(stderr, "zinf_gpt: resuming from %s: %s\n", R->a.resume, zinf_strerror(r));
	} else if (o.client_len < sizeof(h) ||
		   (memcpy(&h, buf, sizeof(h)), memcmp(h.magic, "zgptck2", 8) != 0) ||
		   o.client_len != sizeof(h) + (size_t)h.step * sizeof(double)) {
		fprintf(stderr,
			"zinf_gpt: %s: not a zinf_gpt checkpoint (its trainer state is %llu "
			"bytes)\n",
			R->a.resume, (unsigned long long)o.client_len);
		r = -EINVAL;
	} else if (h.seed != R->a.seed || memcmp(h.dims, dims, sizeof(dims)) != 0 ||
		   h.rope_theta != gpt_rope_theta(&R->t.m.d)) {
		fprintf(stderr,
			"zinf_gpt: %s was trained with another model, data or global batch (seed "
			"%llu, V T C NH L %d %d %d %d %d, %d sequences per step, fanout %d, arch "
			"%s, key-value heads %d, MLP %d, %s head, rope theta %g; here %d sequences "
			"per step): give the same flags (micro-batch x accumulation x ranks may be "
			"cut otherwise)\n",
			R->a.resume, (unsigned long long)h.seed, h.dims[0], h.dims[1], h.dims[2],
			h.dims[3], h.dims[4], h.dims[5], h.dims[6], h.dims[7] ? "llama" : "gpt2",
			h.dims[8], h.dims[9], h.dims[10] ? "untied" : "tied", h.rope_theta,
			dims[5]);
		r = -EINVAL;
	} else {
		R->sched_step = h.sched_step;
		memcpy(R->losses, buf + sizeof(h), (size_t)h.step * sizeof(double));
		R->steps_done = R->resumed_at = h.step;
		*first_step = h.step + 1;
		if (R->lead && !R->a.quiet) {
			printf("checkpoint: resumed from %s at step %d\n", R->a.resume, h.step);
			fflush(stdout);
		}
	}
	free(buf);
	return r;
}

/* ---- one optimizer step -------------------------------------------------------------------- */

/*
 * This rank's sequences of micro-batch `micro`: global sample (micro x world + rank) x B + b,
 * so that every split of the global batch sees the same samples (--data: the window of global
 * row ((step - 1) gas + micro) world + rank) B + b, gpt_tokens.h). Copied to the device on the
 * compute stream (after a sync: the previous copy out of host_io is done).
 */
static int
load_batch(struct run *R, int step, int micro, int slot)
{
	struct gpt_trainer *t = &R->t;
	int *tokens, *targets; /* slot: the pass's micro-batch (gpt_mb_tokens) */
	gpt_mb_tokens(t, slot, &tokens, &targets);
	const struct gpt_dims *d = &t->m.d;
	size_t T = (size_t)d->T, N = (size_t)d->B * T;
	double t0 = zinf_now_s();
	int r = zinf_stream_sync(t->cs);
	if (r) {
		return r;
	}
	for (int b = 0; b < d->B; b++) {
		if (R->a.data) {
			uint64_t s = gpt_tokens_start(&R->tokens, step, t->gas, micro, t->world,
						      t->rank, d->B, b, d->T);
			char err[512];
			if (gpt_tokens_window(&R->tokens, s, R->host_tok, err, sizeof(err))) {
				fprintf(stderr, "zinf_gpt: rank %d: step %d: --data %s\n", t->rank,
					step, err);
				return -EIO;
			}
		} else {
			int64_t gi = ((int64_t)micro * t->world + t->rank) * d->B + b;
			gpt_data_sample(&R->data, step, gi, d->T, R->host_tok);
		}
		memcpy(t->b.host_io + b * T, R->host_tok, T * sizeof(int));
		memcpy(t->b.host_io + N + b * T, R->host_tok + 1, T * sizeof(int));
	}
	r = zinf_device_copy(t->cs, tokens, t->b.host_io, N * sizeof(int), ZINF_COPY_H2D);
	r = r ?: zinf_device_copy(t->cs, targets, t->b.host_io + N, N * sizeof(int), ZINF_COPY_H2D);
	t->tm.data += zinf_now_s() - t0;
	return r;
}

/*
 * Every rank's three floats into R->rank_loss: on host buffers for mpi and single, through
 * R->dev_loss for nccl (device buffers; copies on the compute stream, then a sync).
 */
static int
gather_loss(struct run *R, const float mine[3])
{
	struct gpt_trainer *t = &R->t;
	if (!R->dev_loss) {
		return zinf_comm_all_gather(R->comm, mine, R->rank_loss, 3, ZINF_F32, NULL);
	}
	size_t all = (size_t)t->world * 3 * sizeof(float);
	int r = zinf_device_copy(t->cs, R->dev_loss, mine, 3 * sizeof(float), ZINF_COPY_H2D);
	r = r ?: zinf_stream_sync(t->cs);
	r = r ?: zinf_comm_all_gather(R->comm, R->dev_loss, R->dev_loss + 3, 3, ZINF_F32, NULL);
	r = r ?: zinf_device_copy(t->cs, R->rank_loss, R->dev_loss + 3, all, ZINF_COPY_D2H);
	return r ?: zinf_stream_sync(t->cs);
}

/*
 * --save's directory, before the first step rather than at the first save, after the training
 * time is spent: made when missing as the save makes it (one level, mode 0755, its entry in the
 * parent synced, since the save's mkdir then finds it and syncs nothing), and a file created,
 * written and removed in it, on every rank (each writes its own files there); rank 0 writes the
 * model's config.json there, once for every save of the run (gpt_hf_save_config). The ranks agree
 * on the outcome through the loss all-gather, so that all stop when one cannot write. 0, or -1
 * after each failing rank named the directory and the errno.
 */
static int
check_save_dir(struct run *R)
{
	const char *dir = R->a.save, *what = NULL;
	char p[4096];
	int err = 0, fd;
	if (mkdir(dir, 0755) == 0) {
		what = "syncing the directory holding it";
		snprintf(p, sizeof(p), "%s", dir);
		for (size_t n = strlen(p); n > 1 && p[n - 1] == '/'; n--) {
			p[n - 1] = '\0'; /* "ck/": the parent is the one holding ck */
		}
		char *slash = strrchr(p, '/');
		if (slash == p) {
			slash[1] = '\0';
		} else if (slash) {
			*slash = '\0';
		} else {
			snprintf(p, sizeof(p), ".");
		}
		if ((fd = open(p, O_RDONLY | O_DIRECTORY)) < 0 || fsync(fd) != 0) {
			err = errno;
		}
		if (fd >= 0) {
			close(fd);
		}
	} else if (errno != EEXIST) {
		what = "creating it";
		err = errno;
	}
	if (!err) {
		what = "creating a file in it";
		if (snprintf(p, sizeof(p), "%s/.zinf_gpt-r%d-XXXXXX", dir, R->t.rank) >=
		    (int)sizeof(p)) {
			err = ENAMETOOLONG;
		} else if ((fd = mkstemp(p)) < 0) {
			err = errno;
		} else {
			what = "writing a file in it";
			errno = 0;
			if (write(fd, "zinf_gpt\n", 9) != 9 || fsync(fd) != 0) {
				err = errno ? errno : EIO;
			}
			close(fd);
			unlink(p);
		}
	}
	if (!err && R->lead) { /* what `zinf checkpoint export --hf` takes */
		what = "writing the model's config.json in it";
		err = gpt_hf_save_config(dir, &R->t.m.d, R->t.dtype, R->a.from_hf);
	}
	if (err && R->t.world > 1) {
		fprintf(stderr, "zinf_gpt: rank %d: --save %s: %s: %s\n", R->t.rank, dir, what,
			strerror(err));
	} else if (err) {
		fprintf(stderr, "zinf_gpt: --save %s: %s: %s\n", dir, what, strerror(err));
	}
	float mine[3] = {err ? 1.0f : 0.0f, 0, 0};
	int r = gather_loss(R, mine);
	if (r) {
		fprintf(stderr, "zinf_gpt: checking --save %s with the other ranks: %s\n", dir,
			zinf_strerror(r));
		return -1;
	}
	for (int i = 0; i < R->t.world; i++) {
		if (R->rank_loss[3 * i] != 0) {
			if (R->lead && !err) {
				fprintf(stderr,
					"zinf_gpt: rank %d cannot write --save %s: nothing "
					"trained\n",
					i, dir);
			}
			R->all_know = true;
			return -1;
		}
	}
	return 0;
}

/*
 * Optimizer step `step`: its learning rate, every micro-batch and zinf_engine_step() after
 * each. Returns 0 and the step's loss (the mean over the global batch: each rank's mean sent
 * as two floats, 48 bits, summed in rank order). The same all-gather carries each rank's
 * stop flag (catch_signals), so that all ranks stop after the same step (one alone would leave the
 * others waiting in a collective).
 */
static int
train_step(struct run *R, int step, double *lr_out, double *loss_out, bool *skipped)
{
	struct gpt_trainer *t = &R->t;
	double lr = zinf_schedule_step_lr(&R->cfg.scheduler, R->sched_step), loss_sum = 0, t0;
	if (!isfinite(lr)) {
		lr = R->cfg.engine.optimizer.lr;
	}
	int r = zinf_engine_set_lr(t->e, (float)lr);
	if (r) {
		fprintf(stderr, "zinf_gpt: set_lr %g: %s\n", lr, zinf_strerror(r));
		return r;
	}
	/* OneCycle's cycle_momentum: betas (momentum, 0.99) as DeepSpeed's scheduler writes them;
	   an optimizer without betas (Adagrad) turns it off with a warning, as DeepSpeed does */
	double mom = zinf_schedule_step_momentum(&R->cfg.scheduler, R->sched_step);
	if (!R->no_momentum && !isnan(mom)) {
		r = zinf_engine_set_betas(t->e, (float)mom, (float)ZINF_SCHEDULE_MOM_BETA2);
		if (r == -EOPNOTSUPP) {
			if (R->lead) {
				fprintf(stderr,
					"zinf_gpt: warning: cycle_momentum is disabled: the "
					"optimizer has no betas\n");
			}
			R->no_momentum = true;
		} else if (r) {
			fprintf(stderr, "zinf_gpt: OneCycle momentum %g at step %d: %s\n", mom,
				R->sched_step, zinf_strerror(r));
			return r;
		}
	}
	R->beta1 = R->no_momentum || isnan(mom) ? NAN : mom;
	/* --vertical: one pass of every micro-batch (zinf_engine_vertical), else one each */
	int per = t->vertical > 1 ? t->vertical : 1;
	for (int micro = 0; micro < t->gas; micro += per) {
		double ls;
		if (per > 1 && (r = zinf_engine_vertical(t->e, (uint32_t)per))) {
			fprintf(stderr,
				"zinf_gpt: rank %d: step %d: zinf_engine_vertical(%d): %s\n",
				t->rank, step, per, zinf_strerror(r));
			return r;
		}
		r = 0; /* (a refused momentum above left its errno here) */
		for (int k = 0; k < per && !r; k++) {
			r = load_batch(R, step, micro + k, k);
		}
		if (r || (r = gpt_pass(t, per, &ls))) {
			return r;
		}
		loss_sum += ls;
		t0 = zinf_now_s();
		r = zinf_engine_step(t->e);
		t->tm.step += zinf_now_s() - t0;
		/* 1 (stepped) or 2 (skipped: fp16 overflow) at the boundary, 0 before */
		bool last = micro + per == t->gas;
		if (last ? r != 1 && r != 2 : r != 0) {
			fprintf(stderr, "zinf_gpt: rank %d: step %d, micro-batch %d: %s\n", t->rank,
				step, micro, r < 0 ? zinf_strerror(r) : "unexpected return");
			return r < 0 ? r : -EPROTO;
		}
		*skipped = r == 2;
	}
	/* as DeepSpeed: the schedule advances only with an applied step */
	if (!*skipped) {
		R->sched_step++;
	}
	double mean = loss_sum / ((double)t->m.d.B * t->m.d.T * t->gas);
	float mine[3] = {(float)mean, (float)(mean - (double)(float)mean), g_stop ? 1.0f : 0.0f};
	if ((r = gather_loss(R, mine))) {
		fprintf(stderr, "zinf_gpt: loss all-gather: %s\n", zinf_strerror(r));
		return r;
	}
	double loss = 0;
	for (int i = 0; i < t->world; i++) {
		loss += (double)R->rank_loss[3 * i] + (double)R->rank_loss[3 * i + 1];
		R->stop |= R->rank_loss[3 * i + 2] != 0;
	}
	*loss_out = loss / t->world;
	*lr_out = lr;
	return 0;
}

/* ---- output -------------------------------------------------------------------------------- */

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

/* " (floor F)" beside a loss, or nothing when there is none (--data) */
static const char *
floor_text(char *buf, size_t n, double floor_)
{
	if (isnan(floor_)) {
		return "";
	}
	snprintf(buf, n, " (floor %.4f)", floor_);
	return buf;
}

static void
progress(int step, int steps, double loss, double floor_)
{
	char ft[32];
	int w = 30, fill = (int)((double)step / steps * w);
	char bar[64];
	for (int i = 0; i < w; i++) {
		bar[i] = i < fill ? '=' : i == fill ? '>' : ' ';
	}
	bar[w] = 0;
	fprintf(stderr, "\r[%s] %d/%d loss %.4f%s", bar, step, steps, loss,
		floor_text(ft, sizeof(ft), floor_));
	fflush(stderr);
}

/* The step's record: statistics summed, a JSON line, a printed line every spp steps and on
   every skipped step. */
static void
report_step(struct run *R, int step, double lr, double loss, bool skipped, double wall)
{
	struct gpt_trainer *t = &R->t;
	const struct gpt_dims *d = &t->m.d;
	struct zinf_engine_stats es = {.size = sizeof(es)};
	zinf_engine_get_stats(t->e, &es);
	R->exposed_fetch_s += es.exposed_fetch_s;
	R->exposed_step_s += es.exposed_step_s;
	R->optimizer_s += es.optimizer_s;
	R->nvme_read += es.nvme_read_bytes;
	R->nvme_write += es.nvme_write_bytes;
	R->losses[step - 1] = loss;
	R->steps_done = step;
	long long lk = locked_bytes();
	double toks = (double)d->B * d->T * t->gas * t->world / wall;
	double rd = es.nvme_read_bytes / wall / 1e9, wr = es.nvme_write_bytes / wall / 1e9;
	/* the engine computes the norm for clipping and fp16 only (else its 0 means nothing) */
	bool has_norm = R->cfg.engine.gradient_clipping > 0 || R->cfg.engine.fp16.enabled;
	char norm[32] = "-"; /* the step line's */
	if (has_norm) {
		snprintf(norm, sizeof(norm), "%.4g", es.grad_norm);
	}
	if (R->json) {
		/* JSON has no infinity or NaN: an overflowed step's norm is null, as is one not
		   computed */
		char gnorm[32] = "null", beta1[32] = "null", fl[32] = "null";
		if (has_norm && isfinite(es.grad_norm)) {
			snprintf(gnorm, sizeof(gnorm), "%.9g", es.grad_norm);
		}
		if (!isnan(R->beta1)) {
			snprintf(beta1, sizeof(beta1), "%.9g", R->beta1);
		}
		if (!isnan(R->floor_)) { /* --data: none */
			snprintf(fl, sizeof(fl), "%.17g", R->floor_);
		}
		fprintf(R->json,
			"{\"step\": %d, \"loss\": %.17g, \"floor\": %s, \"lr\": %.9g, "
			"\"step_s\": %.6f, \"tokens_per_s\": %.1f, \"nvme_read_bytes\": %llu, "
			"\"nvme_write_bytes\": %llu, \"nvme_read_GBps\": %.6f, "
			"\"nvme_write_GBps\": %.6f, \"pinned_bytes\": %lld, "
			"\"exposed_fetch_s\": %.6f, \"exposed_step_s\": %.6f, \"optimizer_s\": "
			"%.6f, "
			"\"stepped_during_backward\": %u, \"sub_groups\": %u, \"trace_hits\": "
			"%llu, "
			"\"trace_misses\": %llu, \"peak_live_elems\": %llu, \"grad_norm\": %s, "
			"\"loss_scale\": %.17g, \"skipped\": %s, \"skipped_steps\": %llu, "
			"\"rolled_back\": %u, \"beta1\": %s}\n",
			step, loss, fl, lr, wall, toks, (unsigned long long)es.nvme_read_bytes,
			(unsigned long long)es.nvme_write_bytes, rd, wr, lk, es.exposed_fetch_s,
			es.exposed_step_s, es.optimizer_s, es.stepped_during_backward,
			es.sub_groups, (unsigned long long)es.trace_hits,
			(unsigned long long)es.trace_misses, (unsigned long long)es.peak_live_elems,
			gnorm, es.loss_scale, skipped ? "true" : "false",
			(unsigned long long)es.skipped_steps, es.rolled_back, beta1);
		fflush(R->json); /* a run killed later keeps every step it finished */
	}
	if (R->lead && !R->a.quiet &&
	    (skipped || step % R->spp == 0 || step == 1 || step == R->a.steps)) {
		if (R->bar) {
			fprintf(stderr, "\r\033[K");
		}
		char ft[32];
		printf("step %5d/%d | loss %.4f%s | lr %.3e | %7.0f tok/s | nvme r %.3f "
		       "w %.3f GB/s | pinned %.1f MiB | exposed fetch %.1f ms step %.1f ms | "
		       "grad norm %s | loss scale %g%s\n",
		       step, R->a.steps, loss, floor_text(ft, sizeof(ft), R->floor_), lr, toks, rd,
		       wr, lk < 0 ? 0.0 : (double)lk / (1 << 20), es.exposed_fetch_s * 1e3,
		       es.exposed_step_s * 1e3, norm, es.loss_scale,
		       skipped ? " | skipped (fp16 overflow)" : "");
		fflush(stdout);
	}
	if (R->bar) {
		progress(step, R->a.steps, loss, R->floor_);
	}
}

/* Loss from the first step to the mean of the last tenth of the steps run; time split. */
static void
summary(const struct run *R, double total)
{
	const struct gpt_trainer *t = &R->t;
	const struct gpt_timers *tm = &t->tm;
	int n = R->steps_done, tail = n / 10 > 0 ? n / 10 : 1;
	double to = 0, from = n ? R->losses[0] : NAN, uni = log((double)t->m.d.V);
	double floor_ = R->floor_;
	for (int i = n - tail; i < n; i++) {
		to += i >= 0 ? R->losses[i] / tail : NAN;
	}
	double other = total - tm->compute - tm->fetch - tm->grad - tm->step;
	int ran = n - R->resumed_at; /* steps this process ran */
	char way[96];
	if (isnan(floor_)) { /* --data: no floor known */
		snprintf(way, sizeof(way), "uniform %.4f", uni);
	} else {
		snprintf(way, sizeof(way), "floor %.4f: %.0f%% of the way from %.4f (uniform)",
			 floor_, 100.0 * (uni - to) / (uni - floor_), uni);
	}
	printf("summary: %d steps in %.1f s (%.0f tokens/s)%s; loss %.4f -> %.4f (mean of the "
	       "last %d steps), %s\n",
	       ran, total, (double)t->m.d.B * t->m.d.T * t->gas * t->world * ran / total,
	       R->resumed_at ? " after resuming" : "", from, to, tail, way);
	printf("time (rank 0): compute %.1f s (%.0f%%), waiting for parameters %.1f s (%.0f%%; "
	       "engine's exposed fetch %.1f s), optimizer %.1f s (%.0f%%; exposed step %.1f s, "
	       "optimizer kernel %.1f s in all), gradient hand-off %.1f s, data and other %.1f s\n",
	       tm->compute, 100 * tm->compute / total, tm->fetch, 100 * tm->fetch / total,
	       R->exposed_fetch_s, tm->step, 100 * tm->step / total, R->exposed_step_s,
	       R->optimizer_s, tm->grad, other);
	printf("nvme (rank 0): %.1f MB read, %.1f MB written\n", R->nvme_read / 1e6,
	       R->nvme_write / 1e6);
	fflush(stdout);
}

int
main(int argc, char **argv)
{
	struct run R = {.log_rank = -1, .sched_step = 1, .beta1 = NAN};
	zinf_config_init(&R.cfg);
	int rc = run_init(&R, argc, argv);
	if (rc) {
		goto out;
	}
	int first = 1, step;
	rc = 1;
	if (R.a.resume && resume_checkpoint(&R, &first)) {
		goto out;
	}
	double t_start = zinf_now_s();
	for (step = first; step <= R.a.steps && !R.stop; step++) {
		double lr, loss, t0 = zinf_now_s();
		bool skipped = false;
		if (train_step(&R, step, &lr, &loss, &skipped)) {
			goto out;
		}
		report_step(&R, step, lr, loss, skipped, zinf_now_s() - t0);
		if (R.a.save && R.a.save_every > 0 && step % R.a.save_every == 0 &&
		    step < R.a.steps && !R.stop && save_checkpoint(&R, step, true)) {
			goto out;
		}
	}
	/* the end, or a Ctrl-C (every rank stops after the same step): the last state saved */
	if (R.a.save && R.steps_done >= first && save_checkpoint(&R, R.steps_done, false)) {
		goto out;
	}
	if (R.a.save && !(rc = zinf_engine_save_wait(R.t.e))) {
		prune_checkpoints(&R);
	}
	if (R.a.save && rc) { /* a background save's error */
		fprintf(stderr, "zinf_gpt: a background checkpoint failed: %s\n",
			zinf_strerror(rc));
		rc = 1;
		goto out;
	}
	if (R.bar) {
		fprintf(stderr, "\r\033[K");
	}
	if (R.lead) {
		summary(&R, zinf_now_s() - t_start);
	}
	rc = R.stop ? 130 : 0;
out:
	if (rc && rc != 130 && R.t.e && !R.all_know) {
		/* the other ranks may wait for this one in a collective: tell them (an engine that
		   failed already told them, or every rank knows) */
		(void)zinf_engine_abort(R.t.e, "zinf_gpt stopped after an error on this rank");
	}
	run_fini(&R);
	return rc;
}
