/* SPDX-License-Identifier: Apache-2.0 */
/*
 * examples/gpt/gpt_data.c: the Markov source of gpt_data.h: the chain (successors drawn
 * without repetition, probabilities from exponential draws normalised; successor 0 of token i
 * is i + 1 mod V so that the chain is irreducible), its stationary distribution by power
 * iteration on the lazy chain (P + I) / 2 (aperiodic, same stationary distribution) to a change
 * below 1e-15, its entropy rate in float64, and the samples (splitmix64 of (seed, step,
 * index)). Not here: batching (gpt.c).
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gpt_data.h"

static uint64_t
splitmix64(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static double
uniform(uint64_t *s)
{
	return (double)(splitmix64(s) >> 11) * 0x1.0p-53;
}

void
gpt_data_fini(struct gpt_data *g)
{
	free(g->next);
	free(g->prob);
	free(g->cum);
	free(g->pi);
	free(g->pi_cum);
	memset(g, 0, sizeof(*g));
}

int
gpt_data_init(struct gpt_data *g, int V, int fanout, uint64_t seed)
{
	memset(g, 0, sizeof(*g));
	if (V < 2 || fanout < 1 || fanout > V) {
		return -EINVAL;
	}
	g->V = V;
	g->fanout = fanout;
	g->seed = seed;
	size_t n = (size_t)V * fanout;
	g->next = malloc(n * sizeof(int));
	g->prob = malloc(n * sizeof(double));
	g->cum = malloc(n * sizeof(double));
	g->pi = malloc((size_t)V * sizeof(double));
	g->pi_cum = malloc((size_t)V * sizeof(double));
	double *tmp = malloc((size_t)V * sizeof(double));
	if (!g->next || !g->prob || !g->cum || !g->pi || !g->pi_cum || !tmp) {
		free(tmp);
		gpt_data_fini(g);
		return -ENOMEM;
	}
	uint64_t s = seed ^ 0x5eedc4a1ull;
	for (int i = 0; i < V; i++) {
		int *nx = g->next + (size_t)i * fanout;
		double *p = g->prob + (size_t)i * fanout, sum = 0;
		nx[0] = (i + 1) % V;
		for (int k = 1; k < fanout; k++) {
			int j, dup;
			do {
				j = (int)(splitmix64(&s) % (uint64_t)V);
				dup = 0;
				for (int m = 0; m < k; m++) {
					dup |= nx[m] == j;
				}
			} while (dup);
			nx[k] = j;
		}
		for (int k = 0; k < fanout; k++) {
			p[k] = -log(1.0 - uniform(&s)) + 0.05; /* no successor vanishingly rare */
			sum += p[k];
		}
		double c = 0;
		for (int k = 0; k < fanout; k++) {
			p[k] /= sum;
			c += p[k];
			g->cum[(size_t)i * fanout + k] = c;
		}
		g->cum[(size_t)i * fanout + fanout - 1] = 1.0;
	}
	for (int i = 0; i < V; i++) {
		g->pi[i] = 1.0 / V;
	}
	for (int it = 0; it < 1000000; it++) {
		for (int j = 0; j < V; j++) {
			tmp[j] = 0.5 * g->pi[j];
		}
		for (int i = 0; i < V; i++) {
			for (int k = 0; k < fanout; k++) {
				tmp[g->next[(size_t)i * fanout + k]] +=
					0.5 * g->pi[i] * g->prob[(size_t)i * fanout + k];
			}
		}
		double diff = 0, sum = 0;
		for (int j = 0; j < V; j++) {
			sum += tmp[j];
		}
		for (int j = 0; j < V; j++) {
			tmp[j] /= sum;
			diff += fabs(tmp[j] - g->pi[j]);
			g->pi[j] = tmp[j];
		}
		if (diff < 1e-15) {
			break;
		}
	}
	free(tmp);
	double c = 0, h = 0;
	for (int i = 0; i < V; i++) {
		c += g->pi[i];
		g->pi_cum[i] = c;
		for (int k = 0; k < fanout; k++) {
			double p = g->prob[(size_t)i * fanout + k];
			h -= g->pi[i] * p * log(p);
		}
	}
	g->pi_cum[V - 1] = 1.0;
	g->entropy = h;
	return 0;
}

static int
draw(const double *cum, int n, double u)
{
	int k = 0;
	while (k < n - 1 && u >= cum[k]) {
		k++;
	}
	return k;
}

void
gpt_data_sample(const struct gpt_data *g, int64_t step, int64_t index, int T, int *out)
{
	uint64_t s = g->seed * 0x2545f4914f6cdd1dull ^ (uint64_t)step * 0x9e3779b97f4a7c15ull ^
		     (uint64_t)index * 0xd1b54a32d192ed03ull;
	splitmix64(&s);
	int tok = draw(g->pi_cum, g->V, uniform(&s));
	out[0] = tok;
	for (int t = 1; t <= T; t++) {
		size_t row = (size_t)tok * g->fanout;
		tok = g->next[row + draw(g->cum + row, g->fanout, uniform(&s))];
		out[t] = tok;
	}
}
