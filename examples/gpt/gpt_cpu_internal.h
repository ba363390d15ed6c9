/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt_cpu_internal.h: what the CPU layers' files share: the kernels of gpt_cpu.c
 * that Llama's layers (llama_cpu.c) use too, and Llama's block and head, which gpt_cpu.c's ops
 * table calls for GPT_ARCH_LLAMA.
 */
#ifndef ZINF_EXAMPLE_GPT_CPU_INTERNAL_H
#define ZINF_EXAMPLE_GPT_CPU_INTERNAL_H

#include "gpt_model.h"

/* An element loop's function compiled twice on x86-64, for the baseline (SSE2) and for
   x86-64-v3 (AVX2 and FMA); the loader picks one for the machine once (target_clones: an
   ifunc), so the bits are the same for the whole run. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(GPT_NO_CLONES)
#define GPT_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define GPT_CLONES
#endif

/* Block l's input: a->encoded for l = 0, else block l - 1's output (l = L: the head's). */
const gpt_real *gpt_cpu_block_input(const struct gpt_dims *d, const struct gpt_acts *a, int l);

/* Causal attention (gpt_cpu.c says the layout): out [B, T, NH x hs], att [B, NH, T, T]. */
void gpt_cpu_attention_forward(gpt_real *out, gpt_real *att, const gpt_real *q, const gpt_real *k,
			       const gpt_real *v, int qs, int kvs, int B, int T, int NH, int KVH,
			       int hs);
/* dq, dk, dv = (set); datt, dpreatt scratch [B, NH, T, T]. */
void gpt_cpu_attention_backward(gpt_real *dq, gpt_real *dk, gpt_real *dv, int qs, int kvs,
				gpt_real *datt, gpt_real *dpreatt, const gpt_real *dout,
				const gpt_real *q, const gpt_real *k, const gpt_real *v,
				const gpt_real *att, int B, int T, int NH, int KVH, int hs);
/* a->probs: the logits in, the logits' gradient (times dloss) out; a->losses per position. */
void gpt_cpu_xent(const struct gpt_dims *d, struct gpt_acts *a, const int *targets, gpt_real dloss);

/* Llama (llama_cpu.c), with gpt_ops' meaning. */
void llama_cpu_block_forward(const struct gpt_dims *d, struct gpt_acts *a, int l,
			     const gpt_real *const *params);
void llama_cpu_block_backward(const struct gpt_dims *d, struct gpt_acts *a, int l,
			      const gpt_real *const *params, gpt_real *const *grads);
void llama_cpu_head_forward_backward(const struct gpt_dims *d, struct gpt_acts *a,
				     const int *targets, const gpt_real *head,
				     const gpt_real *normw, gpt_real dloss, gpt_real *dhead,
				     gpt_real *dnormw);

#endif
