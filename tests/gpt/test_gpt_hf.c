/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/gpt/test_gpt_hf.c: zinf_gpt's Hugging Face import (examples/gpt/gpt_hf.c, the layout of
 * gpt_layout.c) and its layers (gpt_cpu.c, llama_cpu.c, compiled with GPT_REAL=double) against
 * what transformers and PyTorch computed for the same checkpoints (tests/fixtures/hf/: a 2-layer
 * GPT-2, a 2-layer Llama with grouped-query attention and its own head, the same Llama stored in
 * bf16 and in f16 shards with an index, a tied 1-layer Llama; references in float64 by
 * make_fixtures.py):
 *  - every tensor the import hands the engine equals the checkpoint's value at that place (read
 *    here on its own, GPT-2's Conv1D weights transposed by this test's own indexing);
 *  - the forward on step 1's windows of tokens.bin (row b = tokens[b T .. b T + T]) gives the
 *    reference logits and mean loss, and the backward every parameter's reference gradient
 *    (a tied head's: the head's plus the lookup's), under Hugging Face's name and shape;
 *  - bf16 and f16 shards import to the f32 checkpoint's values rounded as stored, and their
 *    loss is within what that rounding allows of the f32 one.
 * Tolerances: the layers run in float64 here, so what is left is the reference's own error.
 * GPT-2: the loss to 1e-12 relative (float64 both sides: seen 2e-16), gradients to 1e-7 of each
 * tensor's largest value (they were stored as float32: 2^-24 = 6e-8 relative; seen 4.6e-8).
 * Llama: transformers computes the rotary cos and sin in float32 even in a float64 model
 * (relative ~6e-8 of the rotated values), so the loss to 1e-8 (seen 1.4e-10), the logits and
 * gradients to 1e-6 of the largest (seen 1e-7 and 2.5e-7). bf16 and f16 copies: the loss moves
 * by the storage's rounding (seen 4.5e-6 and 4.6e-7): 1e-4 and 1e-5. A wrong term is of the size of
 * the values themselves: the rotary pairs taken as (2j, 2j + 1), GPT-J's, instead of (j, j + hs/2)
 * moves the loss by 6e-6 and fails 26 checks. Plain program (exit 0 / 1) taking the fixture
 * directory; label gpt.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <zinf/safetensors.h>

#include "gpt.h"

_Static_assert(sizeof(gpt_real) == sizeof(double), "compile with GPT_REAL=double");

#define NB 2  /* rows */
#define NT 16 /* tokens per row */

static int failures;

#define CHECK(cond, ...)                                                                           \
	do {                                                                                       \
		if (!(cond)) {                                                                     \
			fprintf(stderr, "FAIL: " __VA_ARGS__);                                     \
			fputc('\n', stderr);                                                       \
			failures++;                                                                \
		}                                                                                  \
	} while (0)

/* tokens.bin (llm.c's format), read here on its own */
static int
read_tokens(const char *dir, int *tok, int n)
{
	char path[4200];
	snprintf(path, sizeof(path), "%s/tokens.bin", dir);
	FILE *f = fopen(path, "rb");
	int32_t head[256];
	uint16_t t16;
	if (!f || fread(head, sizeof(head), 1, f) != 1 || head[0] != 20240520 || head[2] < n) {
		fprintf(stderr, "FAIL: %s: not the fixture's token file\n", path);
		if (f) {
			fclose(f);
		}
		return -1;
	}
	for (int i = 0; i < n; i++) {
		if (fread(&t16, 2, 1, f) != 1) {
			fclose(f);
			return -1;
		}
		tok[i] = t16;
	}
	fclose(f);
	return 0;
}

/* The reference tensor `name` of refs/<model>.safetensors as doubles (NULL: not there). */
static double *
ref(struct zinf_safetensors *rs, const char *name, uint64_t *numel)
{
	int i = zinf_safetensors_find(rs, name);
	struct zinf_safetensors_info in = {.size = sizeof(in)};
	if (i < 0 || zinf_safetensors_info(rs, (uint32_t)i, &in)) {
		return NULL;
	}
	double *x = malloc(in.numel * sizeof(double));
	if (x && zinf_safetensors_read_f64(rs, (uint32_t)i, 0, in.numel, x)) {
		free(x);
		return NULL;
	}
	*numel = in.numel;
	return x;
}

/* The checkpoint's name of registered tensor t (GPT2Model's files have no "transformer.") */
static int
ckpt_index(struct zinf_safetensors *st, const char *name)
{
	int i = zinf_safetensors_find(st, name);
	if (i < 0 && !strncmp(name, "transformer.", 12)) {
		i = zinf_safetensors_find(st, name + 12);
	}
	return i;
}

static bool
is_conv1d(const struct gpt_dims *d, const char *name)
{
	return d->arch == GPT_ARCH_GPT2 &&
	       (strstr(name, "c_attn.weight") || strstr(name, "c_proj.weight") ||
		strstr(name, "c_fc.weight"));
}

struct net {
	struct gpt_model m;
	double **p, **g; /* by tensor id */
	struct gpt_acts a;
	double *acts;
	int tokens[NB * NT], targets[NB * NT];
};

static double *
P(struct net *n, uint32_t id)
{
	return id == GPT_NO_TENSOR ? NULL : n->p[id];
}

/* forward and backward of step 1's windows; the mean loss */
static double
run(struct net *n)
{
	const struct gpt_ops *o = &gpt_cpu_ops;
	const struct gpt_dims *d = &n->m.d;
	struct gpt_model *m = &n->m;
	int nbt = gpt_block_tensors(d), tied = gpt_tied(d);
	double *bp[GPT_MAX_BLOCK_TENSORS], *bg[GPT_MAX_BLOCK_TENSORS];
	o->encoder_forward(d, &n->a, n->tokens, P(n, m->wte), P(n, m->wpe));
	for (int l = 0; l < d->L; l++) {
		for (int k = 0; k < nbt; k++) {
			bp[k] = n->p[m->block0 + (uint32_t)(l * nbt + k)];
		}
		o->block_forward(d, &n->a, l, (const double *const *)bp);
	}
	o->head_forward_backward(d, &n->a, n->targets, tied ? n->p[m->wte] : n->p[m->head],
				 n->p[m->lnfw], P(n, m->lnfb), 1.0 / (NB * NT),
				 tied ? n->g[m->wte] : n->g[m->head], n->g[m->lnfw],
				 m->lnfb == GPT_NO_TENSOR ? NULL : n->g[m->lnfb]);
	double loss = 0;
	for (int i = 0; i < NB * NT; i++) {
		loss += n->a.losses[i];
	}
	for (int l = d->L - 1; l >= 0; l--) {
		for (int k = 0; k < nbt; k++) {
			bp[k] = n->p[m->block0 + (uint32_t)(l * nbt + k)];
			bg[k] = n->g[m->block0 + (uint32_t)(l * nbt + k)];
		}
		o->block_backward(d, &n->a, l, (const double *const *)bp, bg);
	}
	o->encoder_backward(d, &n->a, n->tokens, n->g[m->wte],
			    m->wpe == GPT_NO_TENSOR ? NULL : n->g[m->wpe]);
	return loss / (NB * NT);
}

/* Largest |x| */
static double
amax(const double *x, uint64_t n)
{
	double a = 0;
	for (uint64_t i = 0; i < n; i++) {
		a = fmax(a, fabs(x[i]));
	}
	return a;
}

/* Relative tolerances: the loss; the logits and the gradients, of their largest (0: not
 * compared). */
struct tol {
	double loss, logits, grad;
};

/*
 * One fixture: import `model` (a directory under fix), check the imported values (exactly the
 * file's), and against refs/<refname> the loss, logits and gradients; *loss_out the loss.
 */
static void
check_model(const char *fix, const char *model, const char *model_dir, const char *refname,
	    double *loss_out, struct tol tol)
{
	char dir[4200], path[4300];
	snprintf(dir, sizeof(dir), "%s/%s", model_dir ? model_dir : fix, model_dir ? "" : model);
	struct net n = {0};
	n.m.d = (struct gpt_dims){.T = NT, .B = NB};
	struct gpt_hf *h = NULL;
	if (gpt_hf_open(dir, &n.m.d, &h) || gpt_model_layout(&n.m) || gpt_hf_bind(h, &n.m)) {
		CHECK(0, "%s: import refused", model);
		gpt_hf_close(h);
		return;
	}
	const struct gpt_dims *d = &n.m.d;
	struct zinf_safetensors *st = NULL;
	CHECK(zinf_safetensors_open(dir, &st) == 0, "%s: open", model);
	n.p = calloc(n.m.n_tensors, sizeof(double *));
	n.g = calloc(n.m.n_tensors, sizeof(double *));
	/* every imported value against the checkpoint's at its place */
	for (uint32_t id = 0; id < n.m.n_tensors; id++) {
		const struct gpt_tensor *t = &n.m.tensors[id];
		uint64_t numel = (t->rows ? t->rows : 1) * t->cols;
		float *f = malloc(numel * sizeof(float));
		double *want = malloc(numel * sizeof(double));
		n.p[id] = malloc(numel * sizeof(double));
		n.g[id] = calloc(numel, sizeof(double));
		/* in two ranges, as the engine asks for a partition's pieces */
		int r = gpt_hf_init(h, id, 0, numel / 2, f);
		r = r ?: gpt_hf_init(h, id, numel / 2, numel - numel / 2, f + numel / 2);
		int ci = ckpt_index(st, t->name);
		CHECK(!r && ci >= 0, "%s: %s: init %d, in the checkpoint %d", model, t->name, r,
		      ci);
		if (r || ci < 0 ||
		    zinf_safetensors_read_f64(st, (uint32_t)ci, 0, numel, want) != 0) {
			free(f), free(want);
			continue;
		}
		bool tr = is_conv1d(d, t->name);
		uint64_t bad = 0;
		for (uint64_t e = 0; e < numel; e++) {
			uint64_t o = t->rows ? e / t->cols : 0, c = t->rows ? e % t->cols : e;
			double w = tr ? want[c * t->rows + o] : want[e];
			n.p[id][e] = f[e];
			bad += (double)f[e] != w;
		}
		CHECK(bad == 0, "%s: %s: %llu of %llu imported values differ from the file's",
		      model, t->name, (unsigned long long)bad, (unsigned long long)numel);
		free(f), free(want);
	}
	zinf_safetensors_close(st);
	n.acts = calloc(gpt_acts_numel(d), sizeof(double));
	gpt_acts_carve(d, n.acts, &n.a);
	int tok[NB * NT + 1];
	if (read_tokens(fix, tok, NB * NT + 1)) {
		failures++;
		goto out;
	}
	for (int b = 0; b < NB; b++) {
		for (int t = 0; t < NT; t++) {
			n.tokens[b * NT + t] = tok[b * NT + t];
			n.targets[b * NT + t] = tok[b * NT + t + 1];
		}
	}
	double loss = run(&n);
	*loss_out = loss;
	snprintf(path, sizeof(path), "%s/refs/%s.safetensors", fix, refname);
	struct zinf_safetensors *rs = NULL;
	if (zinf_safetensors_open(path, &rs)) {
		CHECK(0, "%s: %s", path, zinf_last_error());
		goto out;
	}
	uint64_t k;
	double *rl = ref(rs, "loss", &k);
	CHECK(rl && fabs(loss - rl[0]) <= tol.loss * fabs(rl[0]),
	      "%s: loss %.12g, transformers %.12g", model, loss, rl ? rl[0] : NAN);
	printf("%-20s loss %.12f, transformers %.12f: relative %.2e\n", model, loss,
	       rl ? rl[0] : NAN, rl ? fabs(loss - rl[0]) / rl[0] : NAN);
	free(rl);
	/* the logits: the final norm's output times the head, as the layers left them */
	double *rlog = ref(rs, "logits", &k);
	if (tol.logits == 0) {
		/* not compared */
	} else if (rlog && k == (uint64_t)NB * NT * d->V) {
		const double *head = gpt_tied(d) ? n.p[n.m.wte] : n.p[n.m.head];
		double worst = 0, big = amax(rlog, k);
		for (int i = 0; i < NB * NT; i++) {
			for (int v = 0; v < d->V; v++) {
				double s = 0;
				for (int c = 0; c < d->C; c++) {
					s += n.a.lnf[(size_t)i * d->C + c] *
					     head[(size_t)v * d->C + c];
				}
				worst = fmax(worst, fabs(s - rlog[(size_t)i * d->V + v]));
			}
		}
		CHECK(worst <= tol.logits * big, "%s: logits off by %.3g of %.3g", model, worst,
		      big);
		printf("%-20s logits: worst error %.2e of the largest\n", model, worst / big);
	} else {
		CHECK(0, "%s: no reference logits of %d x %d", model, NB * NT, d->V);
	}
	free(rlog);
	double gworst = 0; /* the largest gradient error relative to its tensor's largest value */
	for (uint32_t id = 0; tol.grad > 0 && id < n.m.n_tensors; id++) {
		const struct gpt_tensor *t = &n.m.tensors[id];
		char gname[128];
		snprintf(gname, sizeof(gname), "grad.%s", t->name);
		uint64_t numel = (t->rows ? t->rows : 1) * t->cols;
		double *rg = ref(rs, gname, &k);
		if (!rg || k != numel) {
			CHECK(0, "%s: no reference %s of %llu", model, gname,
			      (unsigned long long)numel);
			free(rg);
			continue;
		}
		bool tr = is_conv1d(d, t->name);
		double big = amax(rg, numel), worst = 0;
		for (uint64_t e = 0; e < numel; e++) {
			uint64_t o = t->rows ? e / t->cols : 0, c = t->rows ? e % t->cols : e;
			double w = tr ? rg[c * t->rows + o] : rg[e];
			worst = fmax(worst, fabs(n.g[id][e] - w));
		}
		CHECK(worst <= tol.grad * big, "%s: gradient of %s off by %.3g (largest %.3g)",
		      model, t->name, worst, big);
		gworst = fmax(gworst, worst / big);
		free(rg);
	}
	if (tol.grad > 0) {
		printf("%-20s gradients: worst error %.2e of the tensor's largest\n", model,
		       gworst);
	}
	zinf_safetensors_close(rs);
out:
	for (uint32_t id = 0; id < n.m.n_tensors; id++) {
		free(n.p[id]);
		free(n.g[id]);
	}
	free(n.p), free(n.g), free(n.acts);
	gpt_model_free(&n.m);
	gpt_hf_close(h);
}

/* Copy fixture `model` into a temporary directory with `edit` applied to tensor `name`:
 * 'd' dropped, 's' stored with its first dimension halved, 'x' an extra tensor "<name>.extra";
 * 'h' (every tensor): GPT-2 as the Hub ships it, names without "transformer." and each block's
 * attn.bias buffer;
 * config.json copied, edited by the sed script `config` when given. Returns the directory. */
static char *
edited(const char *fix, const char *model, char edit, const char *name, const char *config)
{
	static char out[4200];
	char src[4200], path[4300], cmd[9000];
	snprintf(src, sizeof(src), "%s/%s", fix, model);
	const char *tmp = getenv("TMPDIR");
	snprintf(out, sizeof(out), "%s/zinf-gpt-hf-XXXXXX", tmp && *tmp ? tmp : "/tmp");
	if (!mkdtemp(out)) {
		return NULL;
	}
	snprintf(cmd, sizeof(cmd), "cp '%s/config.json' '%s/'", src, out);
	if (system(cmd)) {
		return NULL;
	}
	if (config) {
		snprintf(cmd, sizeof(cmd), "sed -i '%s' '%s/config.json'", config, out);
		if (system(cmd)) {
			return NULL;
		}
	}
	struct zinf_safetensors *st;
	struct zinf_safetensors_writer *w;
	snprintf(path, sizeof(path), "%s/model.safetensors", out);
	if (zinf_safetensors_open(src, &st) || zinf_safetensors_writer_create(path, NULL, &w)) {
		return NULL;
	}
	uint32_t n = zinf_safetensors_count(st);
	int *slot = calloc(n, sizeof(int));
	for (uint32_t i = 0; i < n; i++) {
		struct zinf_safetensors_info in = {.size = sizeof(in)};
		zinf_safetensors_info(st, i, &in);
		uint64_t shape[8];
		memcpy(shape, in.shape, sizeof(shape));
		bool it = !strcmp(in.name, name);
		slot[i] = -1;
		if (it && edit == 'd') {
			continue;
		}
		if (it && edit == 's') {
			shape[0] /= 2;
		}
		/* 'h': as the Hub's GPT-2 files are, names without "transformer." and each
		   block's causal-mask buffer attn.bias */
		const char *nm = edit == 'h' && !strncmp(in.name, "transformer.", 12) ? in.name + 12
										      : in.name;
		slot[i] = zinf_safetensors_writer_add(w, nm, ZINF_F32, in.ndim, shape);
		bool mask = edit == 'h' && strstr(nm, ".attn.c_attn.bias");
		if ((it && edit == 'x') || mask) {
			char extra[200];
			if (mask) {
				snprintf(extra, sizeof(extra), "%.*s.bias",
					 (int)(strstr(nm, ".c_attn.bias") - nm), nm);
			} else {
				snprintf(extra, sizeof(extra), "%s.extra", in.name);
			}
			zinf_safetensors_writer_add(w, extra, ZINF_F32, mask ? 4 : 1,
						    mask ? (uint64_t[]){1, 1, 2, 2}
							 : (uint64_t[]){4});
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		struct zinf_safetensors_info in = {.size = sizeof(in)};
		zinf_safetensors_info(st, i, &in);
		if (slot[i] < 0) {
			continue;
		}
		uint64_t numel = !strcmp(in.name, name) && edit == 's' ? in.numel / 2 : in.numel;
		float *x = malloc(in.numel * sizeof(float));
		zinf_safetensors_read(st, i, 0, in.numel, ZINF_F32, x);
		zinf_safetensors_writer_write(w, (uint32_t)slot[i], 0, numel, ZINF_F32, x);
		if ((!strcmp(in.name, name) && edit == 'x') ||
		    (edit == 'h' && strstr(in.name, ".attn.c_attn.bias"))) {
			zinf_safetensors_writer_write(w, (uint32_t)slot[i] + 1, 0, 4, ZINF_F32, x);
		}
		free(x);
	}
	free(slot);
	int r = zinf_safetensors_writer_finish(w);
	zinf_safetensors_writer_destroy(w);
	zinf_safetensors_close(st);
	return r >= 0 ? out : NULL;
}

/* gpt_hf_open and gpt_hf_bind on dir refuse it, and what they said on stderr holds each of
 * `want` (NULL-terminated). */
static void
refused(const char *what, const char *dir, const char *const *want)
{
	char log[4300];
	snprintf(log, sizeof(log), "%s/stderr.txt", dir);
	fflush(stderr);
	int saved = dup(2);
	FILE *f = fopen(log, "w");
	dup2(fileno(f), 2);
	struct gpt_model m = {.d = {.T = NT, .B = NB}};
	struct gpt_hf *h = NULL;
	int r = gpt_hf_open(dir, &m.d, &h);
	r = r ?: gpt_model_layout(&m);
	r = r ?: gpt_hf_bind(h, &m);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	fclose(f);
	gpt_hf_close(h);
	gpt_model_free(&m);
	char text[4096] = "";
	f = fopen(log, "r");
	size_t got = fread(text, 1, sizeof(text) - 1, f);
	text[got] = 0;
	fclose(f);
	CHECK(r != 0, "%s: accepted", what);
	for (; *want; want++) {
		CHECK(strstr(text, *want), "%s: the message does not say \"%s\": %s", what, *want,
		      text);
	}
	printf("%-20s refused: %s", what, text);
	char cmd[4400];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	if (system(cmd)) {
		failures++;
	}
}

/* A missing, extra or mis-shaped tensor, and config.json keys the layers cannot compute, are
 * refused naming the tensor and the file, or the key. */
static void
check_refusals(const char *fix)
{
	char *d;
	d = edited(fix, "llama-tiny", 'd', "model.layers.1.mlp.up_proj.weight", NULL);
	CHECK(d, "edited copy");
	if (d) {
		refused("missing tensor", d,
			(const char *[]){"no tensor model.layers.1.mlp.up_proj.weight",
					 "model.safetensors", NULL});
	}
	d = edited(fix, "llama-tiny", 'x', "model.layers.0.self_attn.q_proj.weight", NULL);
	if (d) {
		refused("extra tensor", d,
			(const char *[]){"model.layers.0.self_attn.q_proj.weight.extra is no "
					 "parameter of this llama model",
					 "model.safetensors", NULL});
	}
	d = edited(fix, "llama-tiny", 's', "model.layers.0.self_attn.k_proj.weight", NULL);
	if (d) {
		refused("mis-shaped tensor", d,
			(const char *[]){"model.layers.0.self_attn.k_proj.weight is [8, 32], the "
					 "model needs [16, 32]",
					 "model.safetensors", NULL});
	}
	/* GPT-2's Conv1D weights are stored [in, out]: the expected shape says so */
	d = edited(fix, "gpt2-tiny", 's', "transformer.h.0.mlp.c_fc.weight", NULL);
	if (d) {
		refused("mis-shaped conv1d", d,
			(const char *[]){"transformer.h.0.mlp.c_fc.weight is [16, 128], the model "
					 "needs [32, 128]",
					 NULL});
	}
	d = edited(fix, "llama-tiny", 'k', "",
		   "s/\"rope_type\": \"default\"/\"rope_type\": \"linear\", \"factor\": 2.0/");
	if (d) {
		refused("rope_scaling", d, (const char *[]){"config.json: rope_scaling", NULL});
	}
	d = edited(fix, "gpt2-tiny", 'k', "",
		   "s/\"tie_word_embeddings\": true/\"tie_word_embeddings\": false/");
	if (d) {
		refused("untied gpt2", d,
			(const char *[]){"config.json: tie_word_embeddings false", NULL});
	}
	d = edited(fix, "gpt2-tiny", 'k', "",
		   "s/\"scale_attn_weights\": true/\"scale_attn_weights\": false/");
	if (d) {
		refused("unscaled attention", d,
			(const char *[]){"config.json: scale_attn_weights false", NULL});
	}
	d = edited(fix, "llama-tiny", 'k', "", "s/\"mlp_bias\": false/\"mlp_bias\": true/");
	if (d) {
		refused("mlp_bias", d, (const char *[]){"config.json: mlp_bias", NULL});
	}
}

int
main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: test_gpt_hf FIXTURE_DIR\n");
		return 2;
	}
	const char *fix = argv[1];
	double l_gpt2, l_llama, l_bf16, l_f16, l_tied;
	check_model(fix, "gpt2-tiny", NULL, "gpt2-tiny", &l_gpt2, (struct tol){1e-12, 1e-12, 1e-7});
	check_model(fix, "llama-tiny", NULL, "llama-tiny", &l_llama,
		    (struct tol){1e-8, 1e-6, 1e-6});
	check_model(fix, "llama-tiny-tied", NULL, "llama-tiny-tied", &l_tied,
		    (struct tol){1e-8, 1e-6, 0});
	/* the same Llama stored in bf16 (8 bits of mantissa) and f16 shards (11): the values
	   are the f32 ones rounded, checked against their own files above; the loss moves by
	   about the rounding's relative size */
	check_model(fix, "llama-tiny-bf16", NULL, "llama-tiny", &l_bf16, (struct tol){1e-4, 0, 0});
	check_model(fix, "llama-tiny-sharded", NULL, "llama-tiny", &l_f16,
		    (struct tol){1e-5, 0, 0});
	/* GPT-2 as the Hub ships it: the same model, the same loss and gradients */
	char *hub = edited(fix, "gpt2-tiny", 'h', "", NULL);
	CHECK(hub, "edited copy");
	struct zinf_safetensors *hs = NULL;
	if (hub && zinf_safetensors_open(hub, &hs) == 0) {
		CHECK(zinf_safetensors_find(hs, "h.1.attn.bias") >= 0 &&
			      zinf_safetensors_find(hs, "wte.weight") >= 0 &&
			      zinf_safetensors_find(hs, "transformer.wte.weight") < 0,
		      "the Hub's layout: names without transformer., attn.bias buffers");
		zinf_safetensors_close(hs);
	}
	if (hub) {
		double l_hub;
		check_model(fix, "gpt2-hub", hub, "gpt2-tiny", &l_hub,
			    (struct tol){1e-12, 1e-12, 1e-7});
		CHECK(l_hub == l_gpt2, "the Hub's GPT-2 layout: loss %.17g, not %.17g", l_hub,
		      l_gpt2);
		char cmd[4300];
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", hub);
		failures += system(cmd) != 0;
	}
	check_refusals(fix);
	printf("%d failure%s\n", failures, failures == 1 ? "" : "s");
	return failures ? 1 : 0;
}
