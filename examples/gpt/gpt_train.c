/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt_train.c: the trainer's side of zinf: the model's tensors registered with the
 * engine under Hugging Face's names and with their shapes (GPT-2's or Llama's initialisation as
 * a function of seed, tensor and element, so every rank and tier starts from the same values), the
 * trainer's buffers, and one micro-batch of forward and backward in which every layer is fetched
 * before its use and released after, and every gradient is handed to the engine as soon as it is
 * final. Not here: the loop over steps, the configuration, the output (gpt.c); the layers
 * themselves (gpt_cpu.c on the host device, gpt_cuda.cu on cuda). Nothing here reads device memory
 * from the host: the losses come back by a copy on the compute stream, the bf16 engines' f32 copies
 * are device casts, and the CPU layers (which do read device memory, the host device's) run after a
 * sync of that stream.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zinf/device.h>
#include <zinf/engine.h>

#include "gpt.h"

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

/* The standard deviation of tensor `param`'s initial values, or 0 and its constant (the
 * norms' weights 1, biases 0): GPT-2's (llm.c: 0.02, wpe 0.01, residual projections scaled by
 * 1 / sqrt(2L)) or Llama's (transformers: every matrix N(0, 0.02)). */
static double
init_std(const struct gpt_model *m, uint32_t param, double *constant)
{
	const struct gpt_dims *d = &m->d;
	int nbt = gpt_block_tensors(d);
	*constant = 0;
	if (param == m->wte || param == m->head) {
		return 0.02;
	}
	if (param == m->wpe) {
		return 0.01;
	}
	if (param == m->lnfw) {
		*constant = 1;
		return 0;
	}
	if (param < m->block0 || param >= m->block0 + (uint32_t)(d->L * nbt)) {
		return 0; /* lnf bias */
	}
	int t = (int)((param - m->block0) % (uint32_t)nbt);
	if (d->arch == GPT_ARCH_LLAMA) {
		if (t == LLAMA_ATTN_NORM || t == LLAMA_MLP_NORM) {
			*constant = 1;
			return 0;
		}
		return 0.02;
	}
	if (t == GPT_LN1W || t == GPT_LN2W) {
		*constant = 1;
	} else if (t == GPT_QKVW || t == GPT_FCW) {
		return 0.02;
	} else if (t == GPT_ATTPROJW || t == GPT_FCPROJW) {
		return 0.02 / sqrt(2.0 * d->L); /* residual projections, GPT-2 */
	}
	return 0;
}

static int
init_fn(void *ctx, uint32_t param, uint64_t first, uint64_t count, float *out)
{
	const struct gpt_model *m = ctx;
	double constant, stdv = init_std(m, param, &constant);
	for (uint64_t i = 0; i < count; i++) {
		out[i] = stdv ? (float)(stdv * normal_at(m->seed, param, first + i))
			      : (float)constant;
	}
	return 0;
}

static int
add(struct zinf_engine *e, struct gpt_model *m, uint32_t id)
{
	const struct gpt_tensor *t = &m->tensors[id];
	struct zinf_param_desc pd;
	zinf_param_desc_init(&pd);
	pd.name = t->name;
	pd.numel = (t->rows ? t->rows : 1) * t->cols;
	pd.layer = t->layer;
	pd.ndim = t->rows ? 2 : 1;
	pd.shape[0] = t->rows ? t->rows : t->cols;
	pd.shape[1] = t->cols;
	pd.init_fn = m->init ? m->init : init_fn;
	pd.init_ctx = m->init ? m->init_ctx : m;
	pd.flags = t->no_decay ? ZINF_PARAM_NO_DECAY : 0;
	int r = zinf_engine_add_param(e, &pd);
	if (r < 0) {
		fprintf(stderr, "zinf_gpt: add_param %s: %s\n", t->name, zinf_strerror(r));
		return r;
	}
	if ((uint32_t)r != id) { /* the engine numbers them in order, from 0 */
		fprintf(stderr, "zinf_gpt: add_param %s: id %d, not %u\n", t->name, r, id);
		return -EINVAL;
	}
	return 0;
}

int
gpt_register(struct gpt_trainer *t)
{
	int r = gpt_model_layout(&t->m);
	for (uint32_t id = 0; id < t->m.n_tensors && !r; id++) {
		r = add(t->e, &t->m, id);
	}
	return r;
}

/* ---- one layer's tensors ------------------------------------------------------------------- */

/*
 * The fp32 view of parameter id: its engine buffer when the engine computes in f32, else a
 * cast (on the compute stream) into `scratch`. The caller synchronises the compute stream
 * before the CPU reads it.
 */
static int
param_f32(struct gpt_trainer *t, uint32_t id, size_t numel, gpt_real *scratch, const gpt_real **out)
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

/* fetch(layer): its tensors are valid for work queued on the compute stream after this */
static int
fetch(struct gpt_trainer *t, int layer)
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
release(struct gpt_trainer *t, int layer)
{
	int r = zinf_engine_release(t->e, layer);
	if (r) {
		fprintf(stderr, "zinf_gpt: rank %d: release layer %d: %s\n", t->rank, layer,
			zinf_strerror(r));
	}
	return r;
}

static int
sync_cs(struct gpt_trainer *t)
{
	double t0 = zinf_now_s();
	int r = zinf_stream_sync(t->cs);
	t->tm.fetch += zinf_now_s() - t0;
	return r;
}

/*
 * Hand parameter id's gradient (numel elements, already times the loss scale). With fp16 it is
 * first cast to f16 on the compute stream, as DeepSpeed's fp16 backward produces it (round to
 * nearest even; past 65504 an infinity, which the engine's overflow check sees): the engine
 * copies it before anything queued after this call, so one buffer serves every gradient. bf16
 * and f32 hand the f32 gradient (bf16 has f32's range: no overflow is lost).
 */
static int
grad(struct gpt_trainer *t, uint32_t id, const gpt_real *g, size_t numel)
{
	double t0 = zinf_now_s();
	const void *h = g;
	enum zinf_dtype dt = ZINF_F32;
	int r = 0;
	if (t->dtype == ZINF_F16) {
		r = zinf_device_cast(t->cs, t->b.grad16, ZINF_F16, g, ZINF_F32, numel);
		h = t->b.grad16;
		dt = ZINF_F16;
	}
	r = r ?: zinf_engine_grad(t->e, id, h, dt);
	t->tm.grad += zinf_now_s() - t0;
	if (r) {
		fprintf(stderr, "zinf_gpt: rank %d: grad %u: %s\n", t->rank, id, zinf_strerror(r));
	}
	return r;
}

/* Before layers that run on the host thread read what was queued (casts, copies): a sync.
 * Layers queued on the compute stream themselves (cuda) are ordered after it already. */
static int
layers_sync(struct gpt_trainer *t)
{
	return t->host_layers ? sync_cs(t) : 0;
}

static int
block_params(struct gpt_trainer *t, int l, const gpt_real **p)
{
	int nbt = gpt_block_tensors(&t->m.d), r = 0;
	uint32_t id0 = t->m.block0 + (uint32_t)(l * nbt);
	for (int k = 0; k < nbt && !r; k++) {
		r = param_f32(t, id0 + (uint32_t)k, gpt_block_numel(&t->m.d, k),
			      t->b.f32_block + gpt_block_offset(&t->m.d, k), &p[k]);
	}
	return r ?: layers_sync(t);
}

static int
embed_params(struct gpt_trainer *t, const gpt_real **wte, const gpt_real **wpe)
{
	const struct gpt_dims *d = &t->m.d;
	size_t nwte = (size_t)d->V * d->C;
	int r = param_f32(t, t->m.wte, nwte, t->b.f32_embed, wte);
	*wpe = NULL;
	if (t->m.wpe != GPT_NO_TENSOR) {
		r = r
			    ?: param_f32(t, t->m.wpe, (size_t)gpt_positions(d) * d->C,
					 t->b.f32_embed + nwte, wpe);
	}
	return r ?: layers_sync(t);
}

/* Micro-batch k's buffers in a pass: t->b's for k = 0, else t->vmb[k - 1]'s (what they lack,
 * the gradients but a tied embedding's, t->b's: handed before the next micro-batch writes). */
struct mbv {
	struct gpt_acts *a;
	int *tokens, *targets;
	gpt_real *host_losses, *dwte;
};

static struct mbv
mb_view(struct gpt_trainer *t, int k)
{
	if (k == 0) {
		return (struct mbv){&t->b.acts, t->b.tokens, t->b.targets, t->b.host_losses,
				    t->b.dwte};
	}
	struct gpt_mbuf *v = &t->vmb[k - 1];
	return (struct mbv){&v->acts, v->tokens, v->targets, v->host_losses,
			    v->dwte ? v->dwte : t->b.dwte};
}

void
gpt_mb_tokens(struct gpt_trainer *t, int k, int **tokens, int **targets)
{
	struct mbv v = mb_view(t, k);
	*tokens = v.tokens;
	*targets = v.targets;
}

/*
 * One pass of n micro-batches: forward and backward, every layer fetched before and released
 * after its use (once for all n: the vertical order), each gradient handed as soon as it is
 * final, each parameter's in micro-batch order. The fetch order is the same every pass
 * (embeddings, blocks, final LayerNorm, embeddings again for the tied head; backward: blocks last
 * to first, embeddings), so zinf's trace prefetches along it. Returns 0 and the sum of the
 * passes' per-position losses in *loss_sum.
 */
int
gpt_pass(struct gpt_trainer *t, int n, double *loss_sum)
{
	const struct gpt_dims *d = &t->m.d;
	struct gpt_bufs *b = &t->b;
	const struct gpt_ops *ops = t->ops;
	const gpt_real *wte, *wpe, *lnfw, *lnfb = NULL, *head, *bp[GPT_MAX_BLOCK_TENSORS];
	gpt_real *bg[GPT_MAX_BLOCK_TENSORS];
	int N = d->B * d->T, nbt = gpt_block_tensors(d), tied = gpt_tied(d), r;
	size_t C = (size_t)d->C;
	double t0;

	if (n < 1 || n > (t->vertical > 1 ? t->vertical : 1)) {
		fprintf(stderr, "zinf_gpt: a pass of %d micro-batches (buffers for %d)\n", n,
			t->vertical > 1 ? t->vertical : 1);
		return -EINVAL;
	}
	/* forward */
	if ((r = fetch(t, GPT_LAYER_EMBED)) || (r = embed_params(t, &wte, &wpe))) {
		return r;
	}
	t0 = zinf_now_s();
	for (int k = 0; k < n; k++) {
		struct mbv v = mb_view(t, k);
		ops->encoder_forward(d, v.a, v.tokens, wte, wpe);
	}
	t->tm.compute += zinf_now_s() - t0;
	if ((r = release(t, GPT_LAYER_EMBED))) {
		return r;
	}
	for (int l = 0; l < d->L; l++) {
		if ((r = fetch(t, GPT_LAYER_BLOCK(d, l))) || (r = block_params(t, l, bp))) {
			return r;
		}
		t0 = zinf_now_s();
		for (int k = 0; k < n; k++) {
			ops->block_forward(d, mb_view(t, k).a, l, bp);
		}
		t->tm.compute += zinf_now_s() - t0;
		if ((r = release(t, GPT_LAYER_BLOCK(d, l)))) {
			return r;
		}
	}
	/* the head: the final norm and the output matrix (the tied embedding, fetched again, or
	   an untied lm_head of the final layer), forward and backward at once */
	if ((r = fetch(t, GPT_LAYER_LNF(d))) || (tied && (r = fetch(t, GPT_LAYER_EMBED)))) {
		return r;
	}
	r = param_f32(t, t->m.lnfw, C, b->f32_lnf, &lnfw);
	if (t->m.lnfb != GPT_NO_TENSOR) {
		r = r ?: param_f32(t, t->m.lnfb, C, b->f32_lnf + C, &lnfb);
	}
	if (tied) {
		r = r ?: embed_params(t, &head, &wpe);
	} else {
		r = r ?: param_f32(t, t->m.head, (size_t)d->V * C, b->f32_lnf + 2 * C, &head);
		r = r ?: layers_sync(t);
	}
	if (r) {
		return r;
	}
	/* the mean over the global batch's positions, times the fp16 loss scale (1 without
	   fp16; the engine divides it out at the step) */
	gpt_real dloss = (gpt_real)(zinf_engine_loss_scale(t->e) / ((double)N * t->gas));
	for (int k = 0; k < n; k++) {
		struct mbv v = mb_view(t, k);
		/* host layers: the engine's copies of the last micro-batch's gradients (ordered
		   before the compute stream's later work, not before the host thread's) first */
		if (k > 0 && (r = layers_sync(t))) {
			return r;
		}
		t0 = zinf_now_s();
		ops->head_forward_backward(d, v.a, v.targets, head, lnfw, lnfb, dloss,
					   tied ? v.dwte : b->dhead, b->dlnf,
					   lnfb ? b->dlnf + C : NULL);
		t->tm.compute += zinf_now_s() - t0;
		/* the losses come back to the host on the compute stream; read after a later
		   sync */
		if ((r = zinf_device_copy(t->cs, v.host_losses, v.a->losses,
					  (size_t)N * sizeof(gpt_real), ZINF_COPY_D2H))) {
			return r;
		}
		/* this micro-batch's gradients before the next one's head overwrites them */
		if ((tied && k == n - 1 && (r = release(t, GPT_LAYER_EMBED))) ||
		    (!tied && (r = grad(t, t->m.head, b->dhead, (size_t)d->V * C))) ||
		    (r = grad(t, t->m.lnfw, b->dlnf, C)) ||
		    (lnfb && (r = grad(t, t->m.lnfb, b->dlnf + C, C)))) {
			return r;
		}
	}
	if ((r = release(t, GPT_LAYER_LNF(d)))) {
		return r;
	}
	/* backward through the blocks; their gradient buffers alternate so that a GPU backend
	 * computes the next block (or micro-batch) while zinf copies this one's */
	for (int l = d->L - 1; l >= 0; l--) {
		if ((r = fetch(t, GPT_LAYER_BLOCK(d, l))) || (r = block_params(t, l, bp))) {
			return r;
		}
		uint32_t id0 = t->m.block0 + (uint32_t)(l * nbt);
		for (int k = 0; k < n && !r; k++) {
			gpt_real *slot = b->dblock[(l * n + k) & 1];
			if (k > 0 && (r = layers_sync(t))) {
				break; /* (as in the head) */
			}
			for (int j = 0; j < nbt; j++) {
				bg[j] = slot + gpt_block_offset(d, j);
			}
			t0 = zinf_now_s();
			ops->block_backward(d, mb_view(t, k).a, l, bp, bg);
			t->tm.compute += zinf_now_s() - t0;
			for (int j = nbt - 1; j >= 0 && !r; j--) {
				r = grad(t, id0 + (uint32_t)j, bg[j], gpt_block_numel(d, j));
			}
		}
		if (r || (r = release(t, GPT_LAYER_BLOCK(d, l)))) {
			return r;
		}
	}
	/* the embeddings: a tied wte's gradient is the head's plus the lookup's, handed once */
	if ((r = fetch(t, GPT_LAYER_EMBED)) || (r = sync_cs(t))) {
		return r;
	}
	double s = 0; /* each micro-batch's sum, then their sum: the horizontal run's additions */
	for (int k = 0; k < n; k++) {
		const gpt_real *hl = mb_view(t, k).host_losses;
		double sk = 0;
		for (int i = 0; i < N; i++) {
			sk += hl[i];
		}
		s += sk;
	}
	*loss_sum = s;
	bool has_wpe = t->m.wpe != GPT_NO_TENSOR;
	for (int k = 0; k < n; k++) {
		struct mbv v = mb_view(t, k);
		if (k > 0 && (r = layers_sync(t))) {
			return r; /* (as in the head) */
		}
		t0 = zinf_now_s();
		ops->encoder_backward(d, v.a, v.tokens, v.dwte, has_wpe ? b->dwpe : NULL);
		t->tm.compute += zinf_now_s() - t0;
		if ((has_wpe && (r = grad(t, t->m.wpe, b->dwpe, (size_t)gpt_positions(d) * C))) ||
		    (r = grad(t, t->m.wte, v.dwte, (size_t)d->V * C))) {
			return r;
		}
	}
	/* a layer backend that queues its work (cuda) reports a launch or cuBLAS error here;
	   an error of the work itself comes from the next sync of the compute stream */
	if (ops->status && (r = ops->status(b->acts.ctx))) {
		return r;
	}
	return release(t, GPT_LAYER_EMBED);
}

int
gpt_micro_batch(struct gpt_trainer *t, double *loss_sum)
{
	return gpt_pass(t, 1, loss_sum);
}

/* ---- buffers ------------------------------------------------------------------------------- */

static int
dalloc(struct gpt_trainer *t, size_t bytes, void *out)
{
	int r = zinf_device_alloc(t->dev, bytes ? bytes : 1, (void **)out);
	if (r) {
		fprintf(stderr, "zinf_gpt: device allocation of %zu bytes: %s\n", bytes,
			zinf_strerror(r));
	}
	return r;
}

/* A vertical pass's micro-batches 1 .. vertical - 1: their own activations, tokens, targets,
 * losses and (tied head) embedding gradient. */
static int
vmb_alloc(struct gpt_trainer *t)
{
	const struct gpt_dims *d = &t->m.d;
	size_t N = (size_t)d->B * d->T, g = sizeof(gpt_real);
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	int r = 0;
	if (t->vertical <= 1) {
		return 0;
	}
	if (!(t->vmb = calloc((size_t)t->vertical - 1, sizeof(*t->vmb)))) {
		fprintf(stderr, "zinf_gpt: out of memory for %d micro-batches\n", t->vertical);
		return -ENOMEM;
	}
	for (int k = 0; k + 1 < t->vertical && !r; k++) {
		struct gpt_mbuf *v = &t->vmb[k];
		r = dalloc(t, gpt_acts_numel(d) * g, &v->acts_base);
		r = r ?: dalloc(t, N * sizeof(int), &v->tokens);
		r = r ?: dalloc(t, N * sizeof(int), &v->targets);
		r = r ?: (gpt_tied(d) ? dalloc(t, (size_t)d->V * d->C * g, &v->dwte) : 0);
		if (!r && !(v->host_losses = zinf_alloc_aligned(page, N * g))) {
			r = -ENOMEM;
		}
		if (!r && (r = zinf_device_host_register(t->dev, v->host_losses, N * g))) {
			zinf_free_aligned(v->host_losses);
			v->host_losses = NULL;
		}
		if (r) {
			fprintf(stderr, "zinf_gpt: micro-batch %d's buffers: %s\n", k + 1,
				zinf_strerror(r));
		} else {
			gpt_acts_carve(d, v->acts_base, &v->acts);
			v->acts.ctx = t->ops_ctx;
		}
	}
	return r;
}

static void
vmb_free(struct gpt_trainer *t)
{
	for (int k = 0; t->vmb && k + 1 < t->vertical; k++) {
		struct gpt_mbuf *v = &t->vmb[k];
		void *all[] = {v->acts_base, v->tokens, v->targets, v->dwte};
		for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
			if (all[i]) {
				zinf_device_free(t->dev, all[i]);
			}
		}
		if (v->host_losses) {
			zinf_device_host_unregister(t->dev, v->host_losses);
			zinf_free_aligned(v->host_losses);
		}
	}
	free(t->vmb);
	t->vmb = NULL;
}

int
gpt_bufs_alloc(struct gpt_trainer *t)
{
	const struct gpt_dims *d = &t->m.d;
	struct gpt_bufs *b = &t->b;
	size_t N = (size_t)d->B * d->T, C = (size_t)d->C, g = sizeof(gpt_real);
	size_t PC = (size_t)gpt_positions(d) * C;
	size_t blk = gpt_block_size(d), VC = (size_t)d->V * C, emb = VC + PC;
	size_t head = gpt_tied(d) ? 0 : VC; /* an untied head's gradient and f32 copy */
	int r = dalloc(t, gpt_acts_numel(d) * g, &b->acts_base);
	r = r ?: dalloc(t, N * sizeof(int), &b->tokens);
	r = r ?: dalloc(t, N * sizeof(int), &b->targets);
	r = r ?: dalloc(t, blk * g, &b->dblock[0]);
	r = r ?: dalloc(t, blk * g, &b->dblock[1]);
	r = r ?: dalloc(t, (size_t)d->V * C * g, &b->dwte);
	r = r ?: dalloc(t, PC * g, &b->dwpe);
	/* wpe's rows past the context get no gradient from the layers: zeros, once */
	r = r ?: zinf_device_fill(t->cs, b->dwpe, ZINF_F32, 0, PC);
	r = r ?: dalloc(t, 2 * C * g, &b->dlnf);
	r = r ?: (head ? dalloc(t, head * g, &b->dhead) : 0);
	/* each staging buffer registered on pages of its own (cudaHostRegister pins whole pages;
	   page-aligned, the copies start on a page) */
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	if (!r && !(b->host_io = zinf_alloc_aligned(page, 2 * N * sizeof(int)))) {
		r = -ENOMEM;
	}
	if (!r && !(b->host_losses = zinf_alloc_aligned(page, N * g))) {
		r = -ENOMEM;
	}
	r = r ?: zinf_device_host_register(t->dev, b->host_io, 2 * N * sizeof(int));
	if (!r && (r = zinf_device_host_register(t->dev, b->host_losses, N * g))) {
		zinf_device_host_unregister(t->dev, b->host_io);
	}
	if (r) {
		zinf_free_aligned(b->host_io);
		zinf_free_aligned(b->host_losses);
		b->host_io = NULL;
		b->host_losses = NULL;
		fprintf(stderr, "zinf_gpt: host staging buffers: %s\n", zinf_strerror(r));
	}
	if (!r && t->dtype != ZINF_F32) {
		r = dalloc(t, emb * g, &b->f32_embed);
		r = r ?: dalloc(t, blk * g, &b->f32_block);
		r = r ?: dalloc(t, (2 * C + head) * g, &b->f32_lnf);
	}
	if (!r && t->dtype == ZINF_F16) {
		size_t most = VC > blk ? VC : blk; /* any tensor's */
		r = dalloc(t, (most > PC ? most : PC) * 2, &b->grad16);
	}
	if (!r) {
		gpt_acts_carve(d, b->acts_base, &b->acts);
		b->acts.ctx = t->ops_ctx;
	}
	return r ?: vmb_alloc(t);
}

void
gpt_bufs_free(struct gpt_trainer *t)
{
	struct gpt_bufs *b = &t->b;
	void *all[] = {b->acts_base, b->tokens,	 b->targets, b->dblock[0], b->dblock[1],
		       b->dwte,	     b->dwpe,	 b->dlnf,    b->dhead,	   b->f32_embed,
		       b->f32_block, b->f32_lnf, b->grad16};
	if (!t->dev) {
		return;
	}
	/* work queued on the compute stream may still use these (a copy into host_losses, the
	   engine's casts of a gradient: the compute stream waits for cs after each grad) when a
	   call failed in the middle of a micro-batch */
	if (t->cs) {
		(void)zinf_stream_sync(t->cs);
	}
	if (b->host_io) {
		zinf_device_host_unregister(t->dev, b->host_io);
		zinf_device_host_unregister(t->dev, b->host_losses);
		zinf_free_aligned(b->host_io);
		zinf_free_aligned(b->host_losses);
	}
	for (size_t i = 0; i < sizeof(all) / sizeof(all[0]); i++) {
		if (all[i]) {
			zinf_device_free(t->dev, all[i]);
		}
	}
	vmb_free(t);
}
