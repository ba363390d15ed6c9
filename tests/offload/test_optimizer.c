/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/offload/test_optimizer.c: the optimizer descriptor (zinf/blocks/optimizer.h). Each kind's
 * parts (names, bytes), its step equal bit for bit to the kernel of zinf/blocks/adam.h it maps to
 * with the hyper-parameters mapped by hand (so a mix-up of, say, AdamW's decoupled decay with
 * Adam's L2 fails), bf16 stochastic rounding reproducible from (seed, step, index0) and
 * different for a different index0, refused options and NULL handles; the no-decay ranges
 * (zinf_optimizer_set_no_decay): elements in them stepped as with weight_decay 0, the others with
 * it, runs by hand, refused sets.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "common/test_util.h"
#include "common/util.h"
#include "zinf/blocks/optimizer.h"

#define N 1037

static struct zinf_optimizer *
make(struct zinf_optimizer_opts *o)
{
	struct zinf_optimizer *z = NULL;
	cr_assert_eq(zinf_optimizer_create(o, &z), 0, "%s", zinf_last_error());
	return z;
}

struct data {
	float p[N], m[N], v[N], g[N];
	uint16_t copy[N];
};

static void
fill(struct data *d, uint64_t *seed)
{
	for (int i = 0; i < N; i++) {
		d->p[i] = (float)zt_uniform(seed, -1, 1);
		d->m[i] = (float)zt_uniform(seed, -0.01, 0.01);
		d->v[i] = (float)zt_uniform(seed, 0, 1e-4);
		d->g[i] = (float)zt_uniform(seed, -2, 2);
	}
}

Test(optimizer, parts_of_every_kind)
{
	static const struct {
		enum zinf_optim_kind kind;
		const char *name;
		uint32_t n;
		const char *part[3];
	} want[] = {
		{ZINF_OPTIM_ADAM, "adam", 3, {"fp32", "exp_avg", "exp_avg_sq"}},
		{ZINF_OPTIM_ADAMW, "adamw", 3, {"fp32", "exp_avg", "exp_avg_sq"}},
		{ZINF_OPTIM_ADAGRAD, "adagrad", 2, {"fp32", "state_sum"}},
		{ZINF_OPTIM_LION, "lion", 2, {"fp32", "exp_avg"}},
	};
	for (size_t k = 0; k < ZINF_ARRAY_SIZE(want); k++) {
		struct zinf_optimizer_opts o;
		zinf_optimizer_opts_init(&o, want[k].kind);
		struct zinf_optimizer *z = make(&o);
		cr_assert_str_eq(zinf_optimizer_name(z), want[k].name);
		cr_assert_eq(zinf_optimizer_part_count(z), want[k].n);
		for (uint32_t i = 0; i < want[k].n; i++) {
			cr_assert_str_eq(zinf_optimizer_part_name(z, i), want[k].part[i]);
			cr_assert_eq(zinf_optimizer_part_bytes(z, i), 4);
		}
		cr_assert_null(zinf_optimizer_part_name(z, want[k].n));
		cr_assert_eq(zinf_optimizer_part_bytes(z, want[k].n), 0);
		cr_assert_eq(zinf_optimizer_state_bytes(z), 4 * want[k].n);
		zinf_optimizer_destroy(z);
	}
	struct zinf_optimizer_opts o;
	zinf_optimizer_opts_init(&o, ZINF_OPTIM_ADAM);
	o.state_dtype = ZINF_BF16;
	struct zinf_optimizer *z = make(&o);
	cr_assert_eq(zinf_optimizer_part_bytes(z, 0), 4, "the master stays fp32");
	cr_assert_eq(zinf_optimizer_part_bytes(z, 1), 2);
	cr_assert_eq(zinf_optimizer_part_bytes(z, 2), 2);
	cr_assert_eq(zinf_optimizer_state_bytes(z), 8);
	zinf_optimizer_destroy(z);
}

/* Each kind against its kernel with hand-mapped options. */
Test(optimizer, each_kind_is_its_kernel)
{
	uint64_t seed = zt_seed();
	static struct data a, b;
	fill(&a, &seed);
	for (int kind = 0; kind < 4; kind++) {
		struct zinf_optimizer_opts o;
		zinf_optimizer_opts_init(&o, kind);
		o.lr = 3e-3f, o.beta1 = 0.8f, o.beta2 = 0.95f, o.eps = 1e-6f;
		o.weight_decay = 0.05f, o.lr_decay = 0.1f;
		struct zinf_optimizer *z = make(&o);
		b = a;
		void *parts[] = {b.p, b.m, b.v};
		cr_assert_eq(zinf_optimizer_step(z, 3, 0.5f, parts, b.g, ZINF_F32, 0, N, b.copy,
						 ZINF_BF16),
			     0, "%s", zinf_last_error());
		struct data c = a;
		int rc;
		if (kind == ZINF_OPTIM_ADAGRAD) {
			struct zinf_adagrad_opts k;
			zinf_adagrad_opts_init(&k);
			k.lr = 3e-3f, k.lr_decay = 0.1f, k.eps = 1e-6f, k.weight_decay = 0.05f;
			rc = zinf_adagrad_step(&k, 3, 0.5f, c.p, c.g, ZINF_F32, c.m, N, c.copy,
					       ZINF_BF16);
		} else if (kind == ZINF_OPTIM_LION) {
			struct zinf_lion_opts k;
			zinf_lion_opts_init(&k);
			k.lr = 3e-3f, k.beta1 = 0.8f, k.beta2 = 0.95f, k.weight_decay = 0.05f;
			rc = zinf_lion_step(&k, 3, 0.5f, c.p, c.g, ZINF_F32, c.m, N, c.copy,
					    ZINF_BF16);
		} else {
			struct zinf_adam_opts k;
			zinf_adam_opts_init(&k);
			k.lr = 3e-3f, k.beta1 = 0.8f, k.beta2 = 0.95f, k.eps = 1e-6f;
			k.weight_decay = 0.05f, k.adamw_mode = kind == ZINF_OPTIM_ADAMW;
			rc = zinf_adam_step(&k, 3, 0.5f, c.p, c.g, ZINF_F32, c.m, c.v, N, c.copy,
					    ZINF_BF16);
		}
		cr_assert_eq(rc, 0);
		cr_assert_eq(memcmp(&b, &c, sizeof(b)), 0, "%s differs from its kernel",
			     zinf_optimizer_name(z));
		cr_assert_neq(memcmp(&b.p, &a.p, sizeof(a.p)), 0, "the step changed nothing");
		zinf_optimizer_destroy(z);
	}
}

/* bf16 state: RNE and SR as zinf_adam_step_bf16state, SR's seed from (seed, index0). */
Test(optimizer, bf16_state_rounding_reproducible_from_index0)
{
	uint64_t seed = zt_seed();
	static struct data a;
	fill(&a, &seed);
	static uint16_t m0[N], v0[N];
	cr_assert_eq(zinf_dtype_convert(m0, ZINF_BF16, a.m, ZINF_F32, N), 0);
	cr_assert_eq(zinf_dtype_convert(v0, ZINF_BF16, a.v, ZINF_F32, N), 0);
	struct zinf_optimizer_opts o;
	zinf_optimizer_opts_init(&o, ZINF_OPTIM_ADAMW);
	o.state_dtype = ZINF_BF16;
	o.seed = 42;
	static float p[3][N];
	static uint16_t m[3][N], v[3][N];
	uint64_t index0[3] = {1000, 1000, 1001};
	struct zinf_optimizer *z = make(&o);
	for (int r = 0; r < 3; r++) {
		memcpy(p[r], a.p, sizeof(a.p)), memcpy(m[r], m0, sizeof(m0));
		memcpy(v[r], v0, sizeof(v0));
		void *parts[] = {p[r], m[r], v[r]};
		cr_assert_eq(zinf_optimizer_step(z, 2, 1.0f, parts, a.g, ZINF_F32, index0[r], N,
						 NULL, ZINF_F16),
			     0);
	}
	cr_assert_eq(memcmp(m[0], m[1], sizeof(m[0])), 0, "same (seed, step, index0): same bits");
	cr_assert_neq(memcmp(m[0], m[2], sizeof(m[0])), 0, "another index0 draws other bits");
	/* Nearest even does not depend on index0, and is the kernel's. */
	zinf_optimizer_destroy(z);
	o.rounding = ZINF_ROUND_NEAREST_EVEN;
	z = make(&o);
	struct zinf_adam_opts k;
	zinf_adam_opts_init(&k);
	for (int r = 0; r < 3; r++) {
		memcpy(p[r], a.p, sizeof(a.p)), memcpy(m[r], m0, sizeof(m0));
		memcpy(v[r], v0, sizeof(v0));
		void *parts[] = {p[r], m[r], v[r]};
		if (r < 2) {
			cr_assert_eq(zinf_optimizer_step(z, 2, 1.0f, parts, a.g, ZINF_F32,
							 index0[2 * r], N, NULL, ZINF_F16),
				     0);
		} else {
			cr_assert_eq(zinf_adam_step_bf16state(&k, 2, 1.0f, p[r], a.g, ZINF_F32,
							      m[r], v[r], N, NULL, ZINF_F16,
							      ZINF_ROUND_NEAREST_EVEN, 0),
				     0);
		}
	}
	cr_assert_eq(memcmp(m[0], m[1], sizeof(m[0])), 0);
	cr_assert_eq(memcmp(v[0], v[2], sizeof(v[0])), 0);
	cr_assert_eq(memcmp(p[0], p[2], sizeof(p[0])), 0);
	zinf_optimizer_destroy(z);
}

/* zinf_optimizer_set_no_decay: the elements in the ranges are stepped as by an optimizer
 * created with weight_decay 0, the others as by one with the decay, for every kind (fp32 state:
 * each element's result is its own, so whole-array references compare bit for bit); the call
 * starts at index0 50, so the ranges are in index0's space, not the array's. */
Test(optimizer, no_decay_ranges_step_without_weight_decay)
{
	/* elements 70..349, 350..359 (adjacent), 900.. past the end; index0 50 */
	static const uint64_t ranges[] = {120, 400, 400, 410, 950, 5000};
	uint64_t seed = zt_seed();
	static struct data a, got, dec, none;
	fill(&a, &seed);
	for (int kind = 0; kind < 4; kind++) {
		struct zinf_optimizer_opts o;
		zinf_optimizer_opts_init(&o, kind);
		o.lr = 3e-2f, o.weight_decay = 0.5f;
		struct zinf_optimizer *z = make(&o), *zd = make(&o);
		o.weight_decay = 0;
		struct zinf_optimizer *z0 = make(&o);
		cr_assert_eq(zinf_optimizer_set_no_decay(z, ranges, 3), 0, "%s", zinf_last_error());
		struct data *d[3] = {&got, &dec, &none};
		struct zinf_optimizer *opts[3] = {z, zd, z0};
		for (int r = 0; r < 3; r++) {
			*d[r] = a;
			void *parts[] = {d[r]->p, d[r]->m, d[r]->v};
			cr_assert_eq(zinf_optimizer_step(opts[r], 2, 1.0f, parts, d[r]->g, ZINF_F32,
							 50, N, d[r]->copy, ZINF_BF16),
				     0, "%s", zinf_last_error());
		}
		for (int i = 0; i < N; i++) {
			uint64_t x = 50 + (uint64_t)i;
			bool nd = (x >= 120 && x < 410) || x >= 950;
			const struct data *want = nd ? &none : &dec;
			/* bits: Adagrad's state_sum from fill() may be negative (NaN alike) */
			cr_assert(!memcmp(&got.p[i], &want->p[i], 4) &&
					  !memcmp(&got.m[i], &want->m[i], 4) &&
					  !memcmp(&got.v[i], &want->v[i], 4) &&
					  got.copy[i] == want->copy[i],
				  "%s: element %d (index %llu, %s): %.9g, want %.9g",
				  zinf_optimizer_name(z), i, (unsigned long long)x,
				  nd ? "no decay" : "decay", got.p[i], want->p[i]);
		}
		/* the references differ where it matters (so the comparison can fail) */
		int differ = 0;
		for (int i = 0; i < N; i++) {
			differ += memcmp(&dec.p[i], &none.p[i], 4) != 0;
		}
		cr_assert_gt(differ, N / 2, "%s: weight decay changed %d elements",
			     zinf_optimizer_name(z), differ);
		/* cleared: every element decays again */
		cr_assert_eq(zinf_optimizer_set_no_decay(z, NULL, 0), 0);
		got = a;
		void *parts[] = {got.p, got.m, got.v};
		cr_assert_eq(zinf_optimizer_step(z, 2, 1.0f, parts, got.g, ZINF_F32, 50, N,
						 got.copy, ZINF_BF16),
			     0);
		cr_assert_eq(memcmp(&got, &dec, sizeof(got)), 0, "%s: cleared ranges",
			     zinf_optimizer_name(z));
		zinf_optimizer_destroy(z);
		zinf_optimizer_destroy(zd);
		zinf_optimizer_destroy(z0);
	}
}

/* bf16 state with stochastic rounding: a call over ranges equals, bit for bit, one call per
 * run of elements alike at that run's index0 (each run's rounding seeded from its own start). */
Test(optimizer, no_decay_ranges_bf16_state_runs)
{
	static const uint64_t ranges[] = {1100, 1500};
	uint64_t seed = zt_seed();
	static struct data a;
	fill(&a, &seed);
	static uint16_t m0[N], v0[N], m[2][N], v[2][N];
	static float p[2][N];
	cr_assert_eq(zinf_dtype_convert(m0, ZINF_BF16, a.m, ZINF_F32, N), 0);
	cr_assert_eq(zinf_dtype_convert(v0, ZINF_BF16, a.v, ZINF_F32, N), 0);
	struct zinf_optimizer_opts o;
	zinf_optimizer_opts_init(&o, ZINF_OPTIM_ADAMW);
	o.state_dtype = ZINF_BF16;
	o.seed = 7;
	o.weight_decay = 0.5f;
	struct zinf_optimizer *z = make(&o), *zd = make(&o);
	o.weight_decay = 0;
	struct zinf_optimizer *z0 = make(&o);
	cr_assert_eq(zinf_optimizer_set_no_decay(z, ranges, 1), 0);
	for (int r = 0; r < 2; r++) {
		memcpy(p[r], a.p, sizeof(a.p)), memcpy(m[r], m0, sizeof(m0));
		memcpy(v[r], v0, sizeof(v0));
	}
	void *parts[] = {p[0], m[0], v[0]};
	cr_assert_eq(zinf_optimizer_step(z, 2, 1.0f, parts, a.g, ZINF_F32, 1000, N, NULL, ZINF_F16),
		     0);
	/* the runs: [1000, 1100) decays, [1100, 1500) not, [1500, 2037) decays */
	static const struct {
		int from, n;
		bool decays;
	} run[] = {{0, 100, true}, {100, 400, false}, {500, N - 500, true}};
	for (int k = 0; k < 3; k++) {
		int f = run[k].from;
		void *pp[] = {p[1] + f, m[1] + f, v[1] + f};
		cr_assert_eq(zinf_optimizer_step(run[k].decays ? zd : z0, 2, 1.0f, pp, a.g + f,
						 ZINF_F32, 1000 + (uint64_t)f, (size_t)run[k].n,
						 NULL, ZINF_F16),
			     0);
	}
	cr_assert_eq(memcmp(p[0], p[1], sizeof(p[0])), 0);
	cr_assert_eq(memcmp(m[0], m[1], sizeof(m[0])), 0);
	cr_assert_eq(memcmp(v[0], v[1], sizeof(v[0])), 0);
	zinf_optimizer_destroy(z);
	zinf_optimizer_destroy(zd);
	zinf_optimizer_destroy(z0);
}

/* zinf_optimizer_decay_run by hand, and the refused range sets (which change nothing). */
Test(optimizer, no_decay_runs_and_refusals)
{
	struct zinf_optimizer_opts o;
	zinf_optimizer_opts_init(&o, ZINF_OPTIM_ADAMW);
	o.weight_decay = 0.1f;
	struct zinf_optimizer *z = make(&o);
	static const uint64_t ranges[] = {10, 20, 20, 25, 40, 50};
	cr_assert_eq(zinf_optimizer_set_no_decay(z, ranges, 3), 0);
	static const struct {
		uint64_t index0;
		size_t n, run;
		bool decays;
	} want[] = {
		{0, 100, 10, true},  {5, 3, 3, true},	  {10, 100, 10, false},
		{15, 2, 2, false},   {19, 100, 1, false}, {20, 100, 5, false},
		{25, 100, 15, true}, {45, 100, 5, false}, {50, 100, 100, true},
		{1000, 7, 7, true},  {0, 0, 0, true},
	};
	for (size_t i = 0; i < ZINF_ARRAY_SIZE(want); i++) {
		bool d = !want[i].decays;
		size_t r = zinf_optimizer_decay_run(z, want[i].index0, want[i].n, &d);
		cr_assert(r == want[i].run && d == want[i].decays,
			  "index0 %llu n %zu: run %zu %s, want %zu %s",
			  (unsigned long long)want[i].index0, want[i].n, r, d ? "decays" : "not",
			  want[i].run, want[i].decays ? "decays" : "not");
	}
	/* refusals keep the ranges set before */
	static const uint64_t empty[] = {5, 5}, unsorted[] = {30, 35, 10, 12},
			      overlap[] = {10, 20, 15, 30};
	cr_assert_eq(zinf_optimizer_set_no_decay(z, empty, 1), -EINVAL);
	cr_assert_eq(zinf_optimizer_set_no_decay(z, unsorted, 2), -EINVAL);
	cr_assert_eq(zinf_optimizer_set_no_decay(z, overlap, 2), -EINVAL);
	cr_assert_eq(zinf_optimizer_set_no_decay(z, NULL, 1), -EINVAL);
	cr_assert_eq(zinf_optimizer_set_no_decay(NULL, ranges, 1), -EINVAL);
	bool d = true;
	cr_assert_eq(zinf_optimizer_decay_run(z, 12, 100, &d), 8);
	cr_assert(!d, "a refused set replaced the ranges");
	zinf_optimizer_destroy(z);
	/* weight_decay 0: nothing to split */
	o.weight_decay = 0;
	z = make(&o);
	cr_assert_eq(zinf_optimizer_set_no_decay(z, ranges, 3), 0);
	cr_assert_eq(zinf_optimizer_decay_run(z, 12, 100, &d), 100);
	cr_assert(d);
	zinf_optimizer_destroy(z);
}

Test(optimizer, refused_options_and_null_handles)
{
	zt_log_to_stderr();
	struct zinf_optimizer_opts o;
	struct zinf_optimizer *z = (void *)0x1;
	zinf_optimizer_opts_init(&o, ZINF_OPTIM_ADAGRAD);
	o.state_dtype = ZINF_BF16;
	cr_assert_eq(zinf_optimizer_create(&o, &z), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "optimizer adagrad: state_dtype bf16"), "%s",
		  zinf_last_error());
	zinf_optimizer_opts_init(&o, ZINF_OPTIM_LION);
	o.state_dtype = ZINF_F16;
	cr_assert_eq(zinf_optimizer_create(&o, &z), -EINVAL);
	zinf_optimizer_opts_init(&o, ZINF_OPTIM_ADAM);
	o.kind = 9;
	cr_assert_eq(zinf_optimizer_create(&o, &z), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "unknown kind 9"), "%s", zinf_last_error());
	zinf_optimizer_opts_init(&o, ZINF_OPTIM_ADAM);
	o.rounding = 7;
	cr_assert_eq(zinf_optimizer_create(&o, &z), -EINVAL);
	zinf_optimizer_opts_init(&o, ZINF_OPTIM_ADAM);
	o.threads = -1;
	cr_assert_eq(zinf_optimizer_create(&o, &z), -EINVAL);
	o.threads = 0;
	o.size = sizeof(o) + 8;
	cr_assert_eq(zinf_optimizer_create(&o, &z), -EINVAL);
	cr_assert_eq(zinf_optimizer_create(NULL, NULL), -EINVAL);
	cr_assert_eq(z, (void *)0x1, "*out untouched");
	/* A size no version of the struct has (it ends inside the simd pointer): refused before
	 * half a pointer is copied over the default and resolved. */
	zinf_optimizer_opts_init(&o, ZINF_OPTIM_ADAMW);
	o.simd = "scalar";
	o.size = offsetof(struct zinf_optimizer_opts, simd) + sizeof(o.simd) / 2;
	cr_assert_eq(zinf_optimizer_create(&o, &z), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "zinf_optimizer_opts: size") &&
			  strstr(zinf_last_error(), "not a multiple of"),
		  "%s", zinf_last_error());
	cr_assert_eq(z, (void *)0x1, "*out untouched");
	/* An older caller without seed and the rest: their defaults. */
	zinf_optimizer_opts_init(&o, ZINF_OPTIM_ADAMW);
	o.size = offsetof(struct zinf_optimizer_opts, seed);
	cr_assert_eq(zinf_optimizer_create(&o, &z), 0, "%s", zinf_last_error());
	cr_assert_str_eq(zinf_optimizer_name(z), "adamw");
	/* The step's own checks. */
	static float p[4], g[4];
	void *parts[3] = {p, p + 1, NULL};
	cr_assert_eq(zinf_optimizer_step(z, 1, 1.0f, parts, g, ZINF_F32, 0, 1, NULL, ZINF_F16),
		     -EINVAL);
	cr_assert(strstr(zinf_last_error(), "part 2 (exp_avg_sq) is NULL"), "%s",
		  zinf_last_error());
	cr_assert_eq(zinf_optimizer_step(z, 1, 1.0f, NULL, g, ZINF_F32, 0, 1, NULL, ZINF_F16),
		     -EINVAL);
	parts[2] = p + 2;
	cr_assert_eq(zinf_optimizer_step(z, 0, 1.0f, parts, g, ZINF_F32, 0, 1, NULL, ZINF_F16),
		     -EINVAL, "step 0: the kernel's check");
	zinf_optimizer_destroy(z);
	cr_assert_eq(zinf_optimizer_step(NULL, 1, 1.0f, parts, g, ZINF_F32, 0, 1, NULL, ZINF_F16),
		     -EINVAL);
	cr_assert_str_eq(zinf_optimizer_name(NULL), "?");
	cr_assert_eq(zinf_optimizer_part_count(NULL), 0);
	cr_assert_null(zinf_optimizer_part_name(NULL, 0));
	cr_assert_eq(zinf_optimizer_part_bytes(NULL, 0), 0);
	cr_assert_eq(zinf_optimizer_state_bytes(NULL), 0);
	zinf_optimizer_destroy(NULL);
	zinf_optimizer_opts_init(NULL, ZINF_OPTIM_ADAM);
}

/* The descriptor carries the SIMD path: resolved and checked at create, the caller's string not
 * kept, and the step runs on that path (scalar here: equal to the scalar kernel bit for bit). */
#define SN 1000

Test(optimizer, simd_path_resolved_at_create)
{
	zt_log_to_stderr();
	struct zinf_optimizer_opts o;
	struct zinf_optimizer *z = NULL;
	zinf_optimizer_opts_init(&o, ZINF_OPTIM_ADAMW);
	o.simd = "sse9";
	cr_assert_eq(zinf_optimizer_create(&o, &z), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "sse9"), "%s", zinf_last_error());
	if (zinf_simd_resolve("avx512", NULL) == -ENODEV) {
		o.simd = "avx512";
		cr_assert_eq(zinf_optimizer_create(&o, &z), -ENODEV);
	}
	o.simd = "";
	zinf_optimizer_opts_init(&o, ZINF_OPTIM_ADAMW);
	o.reserved[3] = 1;
	cr_assert_eq(zinf_optimizer_create(&o, &z), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "reserved[3] is not zero"), "%s", zinf_last_error());
	o.reserved[3] = 0;
	char name[16] = "scalar";
	o.simd = name;
	cr_assert_eq(zinf_optimizer_create(&o, &z), 0, "%s", zinf_last_error());
	memset(name, 'x', sizeof(name) - 1); /* the descriptor must not read it again */

	static float p[SN], m[SN], v[SN], g[SN], rp[SN], rm[SN], rv[SN];
	for (int i = 0; i < SN; i++) {
		p[i] = rp[i] = 0.01f * (float)(i % 97) - 0.4f;
		g[i] = 0.003f * (float)(i % 31) - 0.05f;
	}
	struct zinf_adam_opts ao;
	zinf_adam_opts_init(&ao);
	ao.simd = "scalar";
	void *parts[3] = {p, m, v};
	for (int t = 1; t <= 3; t++) {
		cr_assert_eq(
			zinf_optimizer_step(z, t, 0.5f, parts, g, ZINF_F32, 0, SN, NULL, ZINF_F16),
			0, "%s", zinf_last_error());
		cr_assert_eq(
			zinf_adam_step(&ao, t, 0.5f, rp, g, ZINF_F32, rm, rv, SN, NULL, ZINF_F16),
			0);
	}
	cr_assert_eq(memcmp(p, rp, sizeof(p)), 0, "master differs from the scalar kernel");
	cr_assert_eq(memcmp(v, rv, sizeof(v)), 0, "v differs from the scalar kernel");
	zinf_optimizer_destroy(z);
}

/* q8 state: parts sized in blocks, refused for other kinds and dtypes, and a step that is one
 * kernel call with index0, the no-decay ranges, the rounding and the seed passed along (a range
 * that starts inside a block: the kernel, given the same ranges, writes the same bytes; without
 * them, others). */
Test(optimizer, q8_state_parts_and_step)
{
	struct zinf_optimizer_opts o;
	zinf_optimizer_opts_init(&o, ZINF_OPTIM_ADAMW);
	o.state_format = ZINF_STATE_Q8;
	o.weight_decay = 0.1f;
	o.lr = 1e-2f;
	struct zinf_optimizer *z = make(&o);
	cr_assert_eq(zinf_optimizer_state_format(z), ZINF_STATE_Q8);
	cr_assert_eq(zinf_optimizer_part_size(z, 0, N), 4 * N);
	/* 1037 codes and 5 scales (blocks of 256, the last of 13) */
	cr_assert_eq(zinf_optimizer_part_size(z, 1, N), N + 4 * 5);
	cr_assert_eq(zinf_optimizer_part_size(z, 2, N), N + 4 * 5);
	cr_assert_eq(zinf_optimizer_part_align(z, 0), 1);
	cr_assert_eq(zinf_optimizer_part_align(z, 2), ZINF_Q8_BLOCK);
	cr_assert_eq(zinf_optimizer_state_size(z, 1 << 20), (4 + 2 * (1 + 4.0 / 256)) * (1 << 20));
	cr_assert_eq(zinf_optimizer_part_size(z, 3, N), 0);
	uint64_t seed = 42;
	struct data d, e;
	fill(&d, &seed);
	uint8_t mq[2][N + 20] = {{0}}, vq[2][N + 20] = {{0}};
	zinf_q8_encode(d.m, N, ZINF_Q8_EXP_AVG, mq[0], NULL);
	zinf_q8_encode(d.v, N, ZINF_Q8_EXP_AVG_SQ, vq[0], NULL);
	memcpy(mq[1], mq[0], sizeof(mq[0])), memcpy(vq[1], vq[0], sizeof(vq[0]));
	e = d;
	const uint64_t nd[] = {1000 + 100, 1000 + 300};
	cr_assert_eq(zinf_optimizer_set_no_decay(z, nd, 1), 0);
	void *parts[] = {d.p, mq[0], vq[0]};
	cr_assert_eq(
		zinf_optimizer_step(z, 2, 1.0f, parts, d.g, ZINF_F32, 1000, N, d.copy, ZINF_BF16),
		0, "%s", zinf_last_error());
	struct zinf_adam_opts a;
	zinf_adam_opts_init(&a);
	a.lr = 1e-2f, a.weight_decay = 0.1f;
	struct zinf_q8_opts q;
	zinf_q8_opts_init(&q);
	q.index0 = 1000, q.no_decay = nd, q.n_no_decay = 1;
	/* the options' rounding (stochastic by default: a decaying m and v must reach their
	 * values in expectation, cpu_adam/README.md) and seed go to the kernel */
	q.rounding = ZINF_ROUND_STOCHASTIC, q.seed = o.seed;
	cr_assert_eq(zinf_adam_step_q8state(&a, 2, 1.0f, e.p, e.g, ZINF_F32, mq[1], vq[1], N,
					    e.copy, ZINF_BF16, &q),
		     0);
	cr_assert(!memcmp(d.p, e.p, sizeof(d.p)) && !memcmp(mq[0], mq[1], sizeof(mq[0])) &&
			  !memcmp(vq[0], vq[1], sizeof(vq[0])) &&
			  !memcmp(d.copy, e.copy, sizeof(d.copy)),
		  "the descriptor's q8 step is not the kernel's");
	float p100 = d.p[150];
	q.index0 = 0; /* the ranges now miss: element 150 decays */
	memcpy(e.p, d.p, sizeof(d.p));
	zinf_adam_step_q8state(&a, 3, 1.0f, e.p, e.g, ZINF_F32, mq[1], vq[1], N, NULL, 0, &q);
	parts[1] = mq[0], parts[2] = vq[0];
	zinf_optimizer_step(z, 3, 1.0f, parts, d.g, ZINF_F32, 1000, N, NULL, 0);
	cr_assert(d.p[150] != e.p[150], "element 150 (in the range) stepped with decay: %g %g",
		  d.p[150], p100);
	zinf_optimizer_destroy(z);
	o.state_dtype = ZINF_BF16;
	cr_assert_eq(zinf_optimizer_create(&o, &z), -EINVAL);
	cr_assert(
		strstr(zinf_last_error(), "state_format q8 is for Adam/AdamW with state_dtype f32"),
		"%s", zinf_last_error());
	zinf_optimizer_opts_init(&o, ZINF_OPTIM_LION);
	o.state_format = ZINF_STATE_Q8;
	cr_assert_eq(zinf_optimizer_create(&o, &z), -EINVAL);
	o.state_format = 5;
	cr_assert_eq(zinf_optimizer_create(&o, &z), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "unknown state_format 5"), "%s", zinf_last_error());
}

/*
 * A bf16 master (master_dtype): part 0 takes 2 bytes with each moments format (fp32 12 -> 10
 * bytes, bf16 8 -> 6, q8 6.03 -> 4.03), its dtype is bf16, and the step is one
 * zinf_adam_step_bf16master call with the moments' format, seed, index0 and the no-decay ranges
 * passed along (the same bytes); other kinds and dtypes are refused.
 */
Test(optimizer, bf16_master_parts_and_step)
{
	static const struct {
		enum zinf_dtype sd;
		enum zinf_state_format sf;
		enum zinf_moments mv;
		uint64_t bytes; /* of 2^20 elements' state */
	} fmt[] = {
		{ZINF_F32, ZINF_STATE_PLAIN, ZINF_MOMENTS_F32, 10u << 20},
		{ZINF_BF16, ZINF_STATE_PLAIN, ZINF_MOMENTS_BF16, 6u << 20},
		{ZINF_F32, ZINF_STATE_Q8, ZINF_MOMENTS_Q8,
		 (2u << 20) + 2 * ((1u << 20) + 4 * 4096)},
	};
	for (int f = 0; f < 3; f++) {
		struct zinf_optimizer_opts o;
		zinf_optimizer_opts_init(&o, ZINF_OPTIM_ADAMW);
		o.master_dtype = ZINF_BF16;
		o.state_dtype = fmt[f].sd;
		o.state_format = fmt[f].sf;
		o.weight_decay = 0.1f;
		o.lr = 1e-2f;
		o.seed = 77;
		struct zinf_optimizer *z = make(&o);
		cr_assert_eq(zinf_optimizer_part_bytes(z, 0), 2);
		cr_assert_eq(zinf_optimizer_part_dtype(z, 0), ZINF_BF16);
		cr_assert_eq(zinf_optimizer_part_size(z, 0, N), 2 * N);
		cr_assert_eq(zinf_optimizer_state_size(z, 1 << 20), fmt[f].bytes, "format %d: %llu",
			     f, (unsigned long long)zinf_optimizer_state_size(z, 1 << 20));
		uint64_t seed = 42;
		struct data d;
		fill(&d, &seed);
		size_t mb = zinf_optimizer_part_size(z, 1, N);
		uint16_t w[2][N];
		char *m[2], *v[2];
		for (int k = 0; k < 2; k++) {
			m[k] = calloc(1, mb);
			v[k] = calloc(1, mb);
			cr_assert_eq(zinf_dtype_convert(w[k], ZINF_BF16, d.p, ZINF_F32, N), 0);
		}
		const uint64_t nd[] = {1000 + 100, 1000 + 300};
		cr_assert_eq(zinf_optimizer_set_no_decay(z, nd, 1), 0);
		uint16_t copy[2][N];
		void *parts[] = {w[0], m[0], v[0]};
		cr_assert_eq(zinf_optimizer_step(z, 2, 1.0f, parts, d.g, ZINF_F32, 1000, N, copy[0],
						 ZINF_BF16),
			     0, "%s", zinf_last_error());
		struct zinf_adam_opts a;
		zinf_adam_opts_init(&a);
		a.lr = 1e-2f, a.weight_decay = 0.1f;
		struct zinf_bf16master_opts b;
		zinf_bf16master_opts_init(&b);
		b.moments = fmt[f].mv;
		b.state_rounding = ZINF_ROUND_STOCHASTIC; /* the optimizer's default, q8 too */
		b.seed = 77, b.index0 = 1000, b.no_decay = nd, b.n_no_decay = 1;
		cr_assert_eq(zinf_adam_step_bf16master(&a, 2, 1.0f, w[1], d.g, ZINF_F32, m[1], v[1],
						       N, copy[1], ZINF_BF16, &b),
			     0, "%s", zinf_last_error());
		cr_assert(!memcmp(w[0], w[1], sizeof(w[0])) && !memcmp(m[0], m[1], mb) &&
				  !memcmp(v[0], v[1], mb) &&
				  !memcmp(copy[0], copy[1], sizeof(copy[0])),
			  "format %d: the descriptor's bf16-master step is not the kernel's", f);
		cr_assert(!memcmp(copy[0], w[0], sizeof(w[0])), "the bf16 copy is not the master");
		for (int k = 0; k < 2; k++) {
			free(m[k]), free(v[k]);
		}
		zinf_optimizer_destroy(z);
	}
	struct zinf_optimizer_opts o;
	struct zinf_optimizer *z = NULL;
	zinf_optimizer_opts_init(&o, ZINF_OPTIM_LION);
	o.master_dtype = ZINF_BF16;
	cr_assert_eq(zinf_optimizer_create(&o, &z), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "master_dtype bf16 is not supported (f32 only)"), "%s",
		  zinf_last_error());
	zinf_optimizer_opts_init(&o, ZINF_OPTIM_ADAM);
	o.master_dtype = ZINF_F16;
	cr_assert_eq(zinf_optimizer_create(&o, &z), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "master_dtype f16 is not supported (f32, or bf16)"),
		  "%s", zinf_last_error());
}
