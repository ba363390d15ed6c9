/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt_data.h: training data with a known floor, generated, never downloaded: a
 * sparse random Markov chain over the vocabulary (each token has `fanout` successors with
 * random probabilities), sequences started from its stationary distribution, so that the best
 * possible cross-entropy per predicted token is exactly the chain's entropy rate
 * H = -sum_i pi_i sum_j P_ij ln P_ij (nats), computed here (pi by power iteration).
 *
 * Sequence s of optimizer step t is a function of (seed, t, s) only, s the sample's index in
 * the global batch: so one rank with micro-batch B x N and N ranks with B each (or gradient
 * accumulation) see the same samples.
 */
#ifndef ZINF_EXAMPLE_GPT_DATA_H
#define ZINF_EXAMPLE_GPT_DATA_H

#include <stdint.h>

struct gpt_data {
	int V, fanout;
	uint64_t seed;
	int *next;	/* [V][fanout] successors */
	double *prob;	/* [V][fanout] their probabilities */
	double *cum;	/* [V][fanout] cumulative */
	double *pi;	/* [V] stationary distribution */
	double *pi_cum; /* [V] */
	double entropy; /* entropy rate, nats per token */
};

/* Build the chain; 0 or -ENOMEM / -EINVAL. */
int gpt_data_init(struct gpt_data *g, int V, int fanout, uint64_t seed);
void gpt_data_fini(struct gpt_data *g);
/* The T + 1 tokens of sample `index` of step `step` into out. */
void gpt_data_sample(const struct gpt_data *g, int64_t step, int64_t index, int T, int *out);

#endif
