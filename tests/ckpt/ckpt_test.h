/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/ckpt/ckpt_test.h: what the engine's checkpoint tests (test_ckpt.c, test_ckpt_resume.c,
 * test_ckpt_fs.c) share: an engine of the test model (ckpt_make), training it through
 * engine_drive.h, reading every master weight, comparing them bit for bit, a save that must
 * succeed. Criterion asserts; the including file defines QUANTUM and GAS (engine_ref.h's
 * gradient grid and the micro-batches per step) first.
 */
#ifndef ZINF_TEST_CKPT_TEST_H
#define ZINF_TEST_CKPT_TEST_H

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_drive.h"
#include "engine/engine_ref.h"
#include "zinf/checkpoint.h"
#include "zinf/engine.h"

/* `steps` optimizer steps from step index `first`. */
static inline void
run(struct zinf_engine *e, enum zinf_dtype dtype, int64_t first, int steps)
{
	struct edrive d;
	int rc = edrive_init(&d, e, dtype, QUANTUM);
	cr_assert_eq(rc, 0, "edrive_init: %d", rc);
	rc = edrive_run(&d, first, steps, GAS, -1);
	cr_assert_eq(rc, 0, "steps %lld..: %s (%s)", (long long)first, d.why, zinf_last_error());
	edrive_fini(&d);
}

struct master {
	float *p[EREF_NPARAMS];
};

/* Every parameter's master weights (zinf_engine_read_master), allocated. */
static inline void
read_all(struct zinf_engine *e, struct master *m)
{
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		m->p[id] = calloc(eref_numel(id), sizeof(float));
		cr_assert_not_null(m->p[id]);
	}
	int rc = edrive_read_master(e, m->p);
	cr_assert_eq(rc, 0, "read_master: %d %s", rc, zinf_last_error());
}

static inline void
free_all(struct master *m)
{
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		free(m->p[id]);
	}
}

static inline void
assert_same(float *const a[], float *const b[], const char *what)
{
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		for (uint64_t i = 0; i < eref_numel(id); i++) {
			cr_assert(memcmp(&a[id][i], &b[id][i], 4) == 0,
				  "%s: %s[%llu] = %.9g, expected %.9g", what, eref_params[id].name,
				  (unsigned long long)i, a[id][i], b[id][i]);
		}
	}
}

static inline void
save_ok(struct zinf_engine *e, const char *dir, const char *tag)
{
	int rc = zinf_engine_save(e, dir, tag, NULL);
	cr_assert_eq(rc, 0, "save %s/%s: %d %s", dir, tag ? tag : "(step)", rc, zinf_last_error());
}

/* An engine of the test model on one process (single comm, host device), initialised. */
struct ckpt_cfg {
	int stage;
	enum zinf_offload_device opt, param;
	enum zinf_dtype dtype;
	bool caches; /* stage 3: layers stay gathered after release, partitions cached in CPU */
};

static inline struct zinf_engine *
ckpt_make(const struct ckpt_cfg *c, const char *nvme)
{
	struct zinf_engine_opts o;
	edrive_opts(&o, "single", c->stage, c->opt, c->param, nvme, c->dtype, GAS);
	if (c->caches) {
		o.stage3_max_reuse_distance = 1000000;
		o.stage3_param_persistence_threshold = 40; /* the biases are persistent */
		o.offload_param.max_in_cpu = 1000000;
	}
	struct zinf_engine *e = NULL;
	int rc = zinf_engine_create(&o, &e);
	cr_assert_eq(rc, 0, "create: %d %s", rc, zinf_last_error());
	rc = edrive_add_params(e);
	cr_assert_eq(rc, 0, "add_params: %d %s", rc, zinf_last_error());
	rc = zinf_engine_init(e);
	cr_assert_eq(rc, 0, "init: %d %s", rc, zinf_last_error());
	return e;
}

#endif
