/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt_train.c: the trainer's side of zinf: the GPT's tensors registered with the
 * engine (GPT-2's initialisation as a function of seed, tensor and element, so every rank and
 * tier starts from the same values), the trainer's buffers, and one micro-batch of forward and
 * backward in which every layer is fetched before its use and released after, and every
 * gradient is handed to the engine as soon as it is final. Not here: the loop over steps, the
 * configuration, the output (gpt.c); the layers themselves (gpt_cpu.c on the host device,
 * gpt_cuda.cu on cuda). Nothing here reads device memory from the host: the losses come back
 * by a copy on the compute stream, the bf16 engines' f32 copies are device casts, and the CPU
 * layers (which do read device memory, the host device's) run after a sync of that stream.
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

static int
init_fn(void *ctx, uint32_t param, uint64_t first, uint64_t count, float *out)
{
	const struct gpt_model *m = ctx;
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

/*
 * Hugging Face's Trainer's no-decay group (get_decay_parameter_names) on this trainer's names:
 * biases (a last component "b" or "bias") and the parameters of norm layers (a component that
 * starts with "ln" or "norm", or has "layernorm", "rmsnorm" or "_norm" in it). The weight
 * matrices and the embeddings (wte, wpe) decay, as in Hugging Face's GPT-2.
 */
static bool
no_decay(const char *name)
{
	const char *last = strrchr(name, '.');
	last = last ? last + 1 : name;
	if (!strcmp(last, "b") || !strcmp(last, "bias") || strstr(name, "layernorm") ||
	    strstr(name, "rmsnorm") || strstr(name, "_norm")) {
		return true;
	}
	for (const char *c = name; c; c = strchr(c, '.') ? strchr(c, '.') + 1 : NULL) {
		if (!strncmp(c, "ln", 2) || !strncmp(c, "norm", 4)) {
			return true;
		}
	}
	return false;
}

static int
add(struct zinf_engine *e, struct gpt_model *m, const char *name, uint64_t numel, int layer,
    uint32_t *id)
{
	struct zinf_param_desc pd;
	zinf_param_desc_init(&pd);
	pd.name = name;
	pd.numel = numel;
	pd.layer = layer;
	pd.init_fn = init_fn;
	pd.init_ctx = m;
	pd.flags = no_decay(name) ? ZINF_PARAM_NO_DECAY : 0;
	m->n_no_decay += pd.flags ? numel : 0;
	m->t_no_decay += pd.flags ? 1 : 0;
	m->tensors++;
	int r = zinf_engine_add_param(e, &pd);
	if (r < 0) {
		fprintf(stderr, "zinf_gpt: add_param %s: %s\n", name, zinf_strerror(r));
		return r;
	}
	*id = (uint32_t)r;
	m->n_params += numel;
	return 0;
}

int
gpt_register(struct gpt_trainer *t)
{
	struct zinf_engine *e = t->e;
	struct gpt_model *m = &t->m;
	const struct gpt_dims *d = &m->d;
	size_t C = (size_t)d->C;
	char name[64];
	int r = add(e, m, "wte", (size_t)d->V * C, GPT_LAYER_EMBED, &m->wte);
	r = r ?: add(e, m, "wpe", (size_t)d->T * C, GPT_LAYER_EMBED, &m->wpe);
	for (int l = 0; l < d->L && !r; l++) {
		for (int k = 0; k < GPT_BLOCK_TENSORS && !r; k++) {
			uint32_t id;
			snprintf(name, sizeof(name), "h%d.%s", l, block_names[k]);
			r = add(e, m, name, gpt_block_numel(d, k), GPT_LAYER_BLOCK(d, l), &id);
			if (!r && l == 0 && k == 0) {
				m->block0 = id;
			}
		}
	}
	r = r ?: add(e, m, "lnf.w", C, GPT_LAYER_LNF(d), &m->lnfw);
	r = r ?: add(e, m, "lnf.b", C, GPT_LAYER_LNF(d), &m->lnfb);
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
	uint32_t id0 = t->m.block0 + (uint32_t)(l * GPT_BLOCK_TENSORS);
	int r = 0;
	for (int k = 0; k < GPT_BLOCK_TENSORS && !r; k++) {
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
	r = r ?: param_f32(t, t->m.wpe, (size_t)d->T * d->C, t->b.f32_embed + nwte, wpe);
	return r ?: layers_sync(t);
}

/*
 * One micro-batch: forward and backward, every layer fetched before and released after its
 * use, each gradient handed as soon as it is final. The fetch order is the same every
 * micro-batch (embeddings, blocks, final LayerNorm, embeddings again for the tied head;
 * backward: blocks last to first, embeddings), so zinf's trace prefetches along it.
 * Returns 0 and the sum of this micro-batch's per-position losses in *loss_sum.
 */
int
gpt_micro_batch(struct gpt_trainer *t, double *loss_sum)
{
	const struct gpt_dims *d = &t->m.d;
	struct gpt_bufs *b = &t->b;
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
	/* the mean over the global batch's positions, times the fp16 loss scale (1 without
	   fp16; the engine divides it out at the step) */
	gpt_real dloss = (gpt_real)(zinf_engine_loss_scale(t->e) / ((double)N * t->gas));
	ops->head_forward_backward(d, a, b->targets, wte, lnfw, lnfb, dloss, b->dwte, b->dlnf,
				   b->dlnf + d->C);
	t->tm.compute += zinf_now_s() - t0;
	/* the losses come back to the host on the compute stream; read after a later sync */
	if ((r = zinf_device_copy(t->cs, b->host_losses, a->losses, (size_t)N * sizeof(gpt_real),
				  ZINF_COPY_D2H))) {
		return r;
	}
	if ((r = release(t, GPT_LAYER_EMBED)) || (r = grad(t, t->m.lnfw, b->dlnf, (size_t)d->C)) ||
	    (r = grad(t, t->m.lnfb, b->dlnf + d->C, (size_t)d->C)) ||
	    (r = release(t, GPT_LAYER_LNF(d)))) {
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
			r = grad(t, id0 + (uint32_t)k, bg[k], gpt_block_numel(d, k));
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
	if ((r = grad(t, t->m.wpe, b->dwpe, (size_t)d->T * d->C)) ||
	    (r = grad(t, t->m.wte, b->dwte, (size_t)d->V * d->C))) {
		return r;
	}
	/* a layer backend that queues its work (cuda) reports a launch or cuBLAS error here;
	   an error of the work itself comes from the next sync of the compute stream */
	if (ops->status && (r = ops->status(a->ctx))) {
		return r;
	}
	return release(t, GPT_LAYER_EMBED);
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

int
gpt_bufs_alloc(struct gpt_trainer *t)
{
	const struct gpt_dims *d = &t->m.d;
	struct gpt_bufs *b = &t->b;
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
		r = r ?: dalloc(t, 2 * C * g, &b->f32_lnf);
	}
	if (!r && t->dtype == ZINF_F16) {
		size_t most = (size_t)d->V * C > blk ? (size_t)d->V * C : blk; /* any tensor's */
		r = dalloc(t, (most > (size_t)d->T * C ? most : (size_t)d->T * C) * 2, &b->grad16);
	}
	if (!r) {
		gpt_acts_carve(d, b->acts_base, &b->acts);
		b->acts.ctx = t->ops_ctx;
	}
	return r;
}

void
gpt_bufs_free(struct gpt_trainer *t)
{
	struct gpt_bufs *b = &t->b;
	void *all[] = {b->acts_base, b->tokens,	   b->targets, b->dblock[0],
		       b->dblock[1], b->dwte,	   b->dwpe,    b->dlnf,
		       b->f32_embed, b->f32_block, b->f32_lnf, b->grad16};
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
}
