/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt_layout.c: the model's tensors in the order the engine numbers them, each
 * with Hugging Face's name (GPT2LMHeadModel's transformer.*, LlamaForCausalLM's model.* and
 * lm_head), its shape here and its zinf layer (gpt_model_layout). The trainer registers them
 * (gpt_train.c), the import matches them to a checkpoint (gpt_hf.c), and the tests that load a
 * checkpoint without an engine list them the same way.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "gpt.h"

/* Block tensors' names after "transformer.h.<l>." and "model.layers.<l>.". GPT-2's Conv1D
 * weights are held here as [out, in] (transposed from Hugging Face's [in, out]: the import and
 * the export turn them). */
static const char *const gpt2_block_names[GPT_BLOCK_TENSORS] = {
	"ln_1.weight",	      "ln_1.bias",	  "attn.c_attn.weight", "attn.c_attn.bias",
	"attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight",	"ln_2.bias",
	"mlp.c_fc.weight",    "mlp.c_fc.bias",	  "mlp.c_proj.weight",	"mlp.c_proj.bias"};
static const char *const llama_block_names[LLAMA_BLOCK_TENSORS] = {
	"input_layernorm.weight",  "self_attn.q_proj.weight", "self_attn.k_proj.weight",
	"self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
	"mlp.gate_proj.weight",	   "mlp.up_proj.weight",      "mlp.down_proj.weight"};

int
gpt_tensor_name(const struct gpt_dims *d, int l, int t, char *buf, size_t size)
{
	int llama = d->arch == GPT_ARCH_LLAMA;
	return snprintf(buf, size, "%s.%d.%s", llama ? "model.layers" : "transformer.h", l,
			llama ? llama_block_names[t] : gpt2_block_names[t]);
}

/* Append a tensor; its id into *id. */
static int
push(struct gpt_model *m, const char *name, size_t rows, size_t cols, int layer, uint32_t *id)
{
	struct gpt_tensor *tt = realloc(m->tensors, (m->n_tensors + 1) * sizeof(*tt));
	if (!tt) {
		fprintf(stderr, "zinf_gpt: out of memory\n");
		return -ENOMEM;
	}
	m->tensors = tt;
	tt += m->n_tensors;
	snprintf(tt->name, sizeof(tt->name), "%s", name);
	tt->rows = rows;
	tt->cols = cols;
	tt->layer = layer;
	/* Hugging Face's Trainer decays every parameter but biases and the norms' weights
	   (get_decay_parameter_names); in GPT-2 and Llama those are exactly the 1-D tensors, and
	   the matrices and embeddings (2-D) decay */
	tt->no_decay = rows == 0 && !m->decay_all;
	*id = m->n_tensors++;
	m->n_params += (rows ? rows : 1) * cols;
	m->n_no_decay += tt->no_decay ? cols : 0;
	m->t_no_decay += tt->no_decay ? 1 : 0;
	return 0;
}

int
gpt_model_layout(struct gpt_model *m)
{
	const struct gpt_dims *d = &m->d;
	size_t C = (size_t)d->C, V = (size_t)d->V;
	int llama = d->arch == GPT_ARCH_LLAMA, nbt = gpt_block_tensors(d), r;
	char name[96];
	gpt_model_free(m);
	m->n_params = m->n_no_decay = 0;
	m->t_no_decay = 0;
	m->wpe = m->lnfb = m->head = GPT_NO_TENSOR;
	if (llama) {
		r = push(m, "model.embed_tokens.weight", V, C, GPT_LAYER_EMBED, &m->wte);
	} else {
		r = push(m, "transformer.wte.weight", V, C, GPT_LAYER_EMBED, &m->wte);
		r = r
			    ?: push(m, "transformer.wpe.weight", (size_t)gpt_positions(d), C,
				    GPT_LAYER_EMBED, &m->wpe);
	}
	for (int l = 0; l < d->L && !r; l++) {
		for (int k = 0; k < nbt && !r; k++) {
			uint32_t id;
			size_t rows, cols;
			gpt_tensor_name(d, l, k, name, sizeof(name));
			gpt_block_shape(d, k, &rows, &cols);
			r = push(m, name, rows, cols, GPT_LAYER_BLOCK(d, l), &id);
			if (!r && l == 0 && k == 0) {
				m->block0 = id;
			}
		}
	}
	if (llama) {
		r = r ?: push(m, "model.norm.weight", 0, C, GPT_LAYER_LNF(d), &m->lnfw);
		if (!gpt_tied(d)) {
			r = r ?: push(m, "lm_head.weight", V, C, GPT_LAYER_LNF(d), &m->head);
		}
	} else {
		r = r ?: push(m, "transformer.ln_f.weight", 0, C, GPT_LAYER_LNF(d), &m->lnfw);
		r = r ?: push(m, "transformer.ln_f.bias", 0, C, GPT_LAYER_LNF(d), &m->lnfb);
	}
	return r;
}

void
gpt_model_free(struct gpt_model *m)
{
	free(m->tensors);
	m->tensors = NULL;
	m->n_tensors = 0;
}
