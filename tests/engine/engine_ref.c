/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/engine/engine_ref.c: the engine tests' model (three linear layers, squared loss) and the
 * single-process fp32 reference that trains it as the engine's contract says (see
 * engine_ref.h). Plain C in float, one fixed order of every sum, so that the trainer and the
 * reference get the same gradients from the same parameters bit for bit. Not here: the engine.
 */
#include "engine/engine_ref.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"

static const uint32_t dims[EREF_NLAYERS + 1] = {15, 16, 7, 3};

const struct eref_param eref_params[EREF_NPARAMS] = {
	{"layer0.weight", 16, 15, 0}, {"layer0.bias", 16, 1, 0},  {"layer1.weight", 7, 16, 1},
	{"layer1.bias", 7, 1, 1},     {"layer2.weight", 3, 7, 2}, {"layer2.bias", 3, 1, 2},
};

static uint64_t
mix(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* A multiple of 2^-bits in [-1, 1) drawn from the key. */
static float
draw(uint64_t key, int bits)
{
	int64_t k = (int64_t)(mix(key) >> (64 - bits - 1)) - ((int64_t)1 << bits);
	return ldexpf((float)k, -bits);
}

float
eref_init_value(uint32_t id, uint64_t i)
{
	return 0.25f * draw(((uint64_t)id << 32) ^ i ^ 0x1234567ull, 5);
}

int
eref_init_fn(void *ctx, uint32_t param, uint64_t first, uint64_t count, float *out)
{
	(void)ctx;
	if (param >= EREF_NPARAMS || first + count > eref_numel(param)) {
		return -EINVAL;
	}
	for (uint64_t i = 0; i < count; i++) {
		out[i] = eref_init_value(param, first + i);
	}
	return 0;
}

static float
datum(int rank, int64_t step, uint32_t micro, uint32_t b, uint32_t j, uint32_t salt)
{
	uint64_t key = ((uint64_t)(uint32_t)rank << 56) ^ ((uint64_t)step << 36) ^
		       ((uint64_t)micro << 28) ^ ((uint64_t)b << 20) ^ ((uint64_t)salt << 16) ^ j;
	return draw(key, 8);
}

double
eref_grad(const float *const p[EREF_NPARAMS], int rank, int64_t step, uint32_t micro, float quantum,
	  float *const g[EREF_NPARAMS])
{
	float act[EREF_NLAYERS + 1][16], delta[EREF_NLAYERS + 1][16];
	double loss = 0;

	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		memset(g[id], 0, eref_numel(id) * sizeof(float));
	}
	for (uint32_t b = 0; b < EREF_BATCH; b++) {
		for (uint32_t j = 0; j < dims[0]; j++) {
			act[0][j] = datum(rank, step, micro, b, j, 1);
		}
		for (uint32_t l = 0; l < EREF_NLAYERS; l++) {
			const float *w = p[2 * l], *bias = p[2 * l + 1];
			for (uint32_t o = 0; o < dims[l + 1]; o++) {
				float s = bias[o];
				for (uint32_t i = 0; i < dims[l]; i++) {
					s += w[o * dims[l] + i] * act[l][i];
				}
				act[l + 1][o] = s;
			}
		}
		for (uint32_t k = 0; k < dims[EREF_NLAYERS]; k++) {
			float r = act[EREF_NLAYERS][k] - datum(rank, step, micro, b, k, 2);
			loss += 0.5 * (double)r * r / EREF_BATCH;
			delta[EREF_NLAYERS][k] = r / (float)EREF_BATCH;
		}
		for (uint32_t l = EREF_NLAYERS; l-- > 0;) {
			const float *w = p[2 * l];
			float *gw = g[2 * l], *gb = g[2 * l + 1];
			for (uint32_t o = 0; o < dims[l + 1]; o++) {
				gb[o] += delta[l + 1][o];
				for (uint32_t i = 0; i < dims[l]; i++) {
					gw[o * dims[l] + i] += delta[l + 1][o] * act[l][i];
				}
			}
			for (uint32_t i = 0; i < dims[l]; i++) {
				float s = 0;
				for (uint32_t o = 0; o < dims[l + 1]; o++) {
					s += w[o * dims[l] + i] * delta[l + 1][o];
				}
				delta[l][i] = s;
			}
		}
	}
	if (quantum > 0) {
		for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
			for (uint64_t i = 0; i < eref_numel(id); i++) {
				g[id][i] = quantum * rintf(g[id][i] / quantum);
			}
		}
	}
	return loss;
}

void
eref_round(float *x, uint64_t n, enum zinf_dtype dtype)
{
	for (uint64_t i = 0; i < n && dtype != ZINF_F32; i++) {
		x[i] = dtype == ZINF_BF16 ? dt_bf16_to_f32(dt_f32_to_bf16_rne(x[i]))
					  : dt_f16_to_f32(dt_f32_to_f16_rne(x[i]));
	}
}

void
eref_result_free(struct eref_result *r)
{
	for (int id = 0; r && id < EREF_NPARAMS; id++) {
		free(r->master[id]);
		r->master[id] = NULL;
	}
}

int
eref_train(const struct eref_opts *o, struct eref_result *out)
{
	float *pw[EREF_NPARAMS] = {0}, *g[EREF_NPARAMS] = {0}, *sum[EREF_NPARAMS] = {0};
	float *acc[EREF_NPARAMS] = {0};
	double *absg[EREF_NPARAMS] = {0};
	void *parts[EREF_NPARAMS][ZINF_OPTIM_MAX_PARTS] = {{0}};
	struct zinf_optimizer *opt = NULL;
	struct zinf_optimizer_opts oo = o->opt;
	int rc = zinf_optimizer_create(&oo, &opt);
	if (rc < 0) {
		return rc;
	}
	memset(out, 0, sizeof(*out));
	uint32_t np = zinf_optimizer_part_count(opt);
	rc = -ENOMEM;
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		uint64_t n = eref_numel(id);
		pw[id] = malloc(n * sizeof(float));
		g[id] = malloc(n * sizeof(float));
		sum[id] = malloc(n * sizeof(float));
		acc[id] = malloc(n * sizeof(float));
		absg[id] = malloc(n * sizeof(double));
		for (uint32_t k = 0; k < np; k++) {
			parts[id][k] = calloc(n, zinf_optimizer_part_bytes(opt, k));
			if (!parts[id][k]) {
				goto out;
			}
		}
		if (!pw[id] || !g[id] || !sum[id] || !acc[id] || !absg[id]) {
			goto out;
		}
		for (uint64_t i = 0; i < n; i++) {
			((float *)parts[id][0])[i] = eref_init_value(id, i);
		}
	}
	rc = 0;
	for (int t = 1; t <= o->steps && rc == 0; t++) {
		for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
			memset(absg[id], 0, eref_numel(id) * sizeof(double));
		}
		for (uint32_t mi = 0; mi < o->gas; mi++) {
			for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
				memcpy(pw[id], parts[id][0], eref_numel(id) * sizeof(float));
				eref_round(pw[id], eref_numel(id), o->dtype);
			}
			for (int r = 0; r < o->world; r++) {
				eref_grad((const float *const *)pw, r, t - 1, mi, o->quantum, g);
				for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
					uint64_t n = eref_numel(id);
					eref_round(g[id], n, o->dtype);
					for (uint64_t i = 0; i < n; i++) {
						sum[id][i] =
							r == 0 ? g[id][i] : sum[id][i] + g[id][i];
						absg[id][i] += fabs((double)g[id][i]) / o->world;
					}
				}
			}
			for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
				for (uint64_t i = 0; i < eref_numel(id); i++) {
					float mean = sum[id][i] / (float)o->world;
					acc[id][i] = mi == 0 ? mean : acc[id][i] + mean;
				}
			}
		}
		double amax = 0;
		for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
			for (uint64_t i = 0; i < eref_numel(id); i++) {
				amax = fmax(amax, absg[id][i]);
			}
		}
		if (t < 65) {
			out->abs_grad[t] = amax;
		}
		bool lr_now = o->lr_step > 0 && t == o->lr_step + 1;
		bool betas_now = o->betas_step > 0 && t == o->betas_step + 1;
		if (lr_now || betas_now) {
			/* a new optimizer created with the new values (not the setters) */
			zinf_optimizer_destroy(opt);
			opt = NULL;
			if (lr_now) {
				oo.lr = o->lr_after;
			}
			if (betas_now) {
				oo.beta1 = o->beta1_after;
				oo.beta2 = o->beta2_after;
			}
			rc = zinf_optimizer_create(&oo, &opt);
		}
		for (uint32_t id = 0; id < EREF_NPARAMS && rc == 0; id++) {
			rc = zinf_optimizer_step(opt, t, 1.0f, parts[id], acc[id], ZINF_F32, 0,
						 eref_numel(id), NULL, ZINF_F32);
		}
	}
	for (uint32_t id = 0; id < EREF_NPARAMS && rc == 0; id++) {
		out->master[id] = malloc(eref_numel(id) * sizeof(float));
		if (!out->master[id]) {
			rc = -ENOMEM;
			break;
		}
		memcpy(out->master[id], parts[id][0], eref_numel(id) * sizeof(float));
	}
out:
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		free(pw[id]);
		free(g[id]);
		free(sum[id]);
		free(acc[id]);
		free(absg[id]);
		for (uint32_t k = 0; k < ZINF_OPTIM_MAX_PARTS; k++) {
			free(parts[id][k]);
		}
	}
	zinf_optimizer_destroy(opt);
	if (rc < 0) {
		eref_result_free(out);
	}
	return rc;
}
