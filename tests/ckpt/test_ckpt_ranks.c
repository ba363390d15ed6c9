/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/ckpt/test_ckpt_ranks.c: checkpoints over several ranks, a plain program that ctest runs
 * under mpirun with 1 to 4 ranks (tests/engine/engine_ranks.h: the runner, the test model, the
 * reference), on the "host" device with asynchronous streams and the "mpi" collectives, or on
 * one GPU with nccl (ZINF_TEST_DEVICE=cuda). Cases: resume exact over several ranks, through a
 * save and through a background save (ckpt_resume); another world size: a save by 4 ranks or
 * by 1 (ckpt_save) loaded by 2, 3 and 4 ranks into another stage and tiers (ckpt_reshard; both
 * run only when named, $ZINF_CKPT_DIR between them); stage 0's files (rank 0's alone) loaded
 * into stage 3 and a stage-3 save into stage 0 (ckpt_stage0_stage3); the trainer's blob taken
 * from rank 0 alone, a bad one refused on every rank (ckpt_client_rank0); a load whose writes
 * fail on one rank, the error agreed on every rank and the engine failed (ckpt_load_fault).
 * One process: test_ckpt.c, test_ckpt_resume.c, test_ckpt_fs.c.
 *
 * Usage: test_ckpt_ranks [CASE]: only the case of that name (every case without one); an unknown
 * name is an error (exit 1, the known names listed).
 */
#include "engine/engine_ranks.h"
#include "zinf/checkpoint.h"

#define QUANTUM 0x1p-14f
#define GAS	2

/* ---- checkpoints ---------------------------------------------------------------------------- */

/* A directory every rank sees: rank 0's path under its scratch directory, broadcast. */
static void
shared_dir(const char *name, char *out, size_t n)
{
	if (rank == 0) {
		snprintf(out, n, "%s/%s", scratch, name);
	}
	MPI_Bcast(out, (int)n, MPI_CHAR, 0, MPI_COMM_WORLD);
}

/* `steps` steps from step index `first`; every rank hands rank 0's data when same_data (so that
 * the run is that of one rank, whatever the world size: the mean of W equal quantised gradients
 * is exact). Loaded from load_dir instead of init when it is set; saved into save_dir after the
 * steps: with bg_after > 0 in the background, then bg_after more steps (the first of which
 * publishes it) and zinf_engine_save_wait. Masters into m. */
static int
ckpt_train_bg(const struct config *c, enum zinf_dtype dtype, int64_t first, int steps,
	      bool same_data, const char *load_dir, const char *save_dir, int bg_after,
	      struct master *m, const char *what)
{
	struct zinf_engine_opts o;
	int fails = 0;
	edrive_opts(&o, "mpi", c->stage, c->opt, c->param, scratch, dtype, GAS);
	struct zinf_engine *e = NULL;
	int rc = zinf_engine_create(&o, &e);
	CHECK(rc == 0, "%s: create: %d %s", what, rc, zinf_last_error());
	if (rc == 0) {
		rc = edrive_add_params(e);
		CHECK(rc == 0, "%s: add_params: %d", what, rc);
	}
	if (rc == 0) {
		rc = load_dir ? zinf_engine_load(e, load_dir, NULL, NULL) : zinf_engine_init(e);
		CHECK(rc == 0, "%s: %s: %d %s", what, load_dir ? "load" : "init", rc,
		      zinf_last_error());
	}
	if (rc == 0 && load_dir) {
		CHECK(zinf_engine_steps(e) == first, "%s: %lld steps after load, expected %lld",
		      what, (long long)zinf_engine_steps(e), (long long)first);
	}
	struct edrive d;
	bool d_ok = false;
	if (rc == 0) {
		rc = edrive_init(&d, e, dtype, QUANTUM);
		d_ok = rc == 0;
		CHECK(rc == 0, "%s: edrive_init", what);
	}
	if (rc == 0) {
		if (same_data) {
			d.rank = 0;
		}
		rc = edrive_run(&d, first, steps, GAS, -1);
		CHECK(rc == 0, "%s: %s", what, d.why);
	}
	if (rc == 0 && save_dir) {
		struct zinf_ckpt_opts so;
		zinf_ckpt_opts_init(&so);
		so.background = bg_after > 0;
		rc = zinf_engine_save(e, save_dir, NULL, &so);
		CHECK(rc == 0, "%s: save: %d %s", what, rc, zinf_last_error());
	}
	if (rc == 0 && bg_after > 0) {
		rc = edrive_run(&d, first + steps, bg_after, GAS, -1);
		CHECK(rc == 0, "%s: after the background save: %s", what, d.why);
		int w = zinf_engine_save_wait(e);
		CHECK(w == 0, "%s: save_wait: %d %s", what, w, zinf_last_error());
		rc = rc ? rc : w;
	}
	if (rc == 0 && m) {
		rc = edrive_read_master(e, m->p);
		CHECK(rc == 0, "%s: read_master: %d", what, rc);
	}
	if (d_ok) {
		edrive_fini(&d);
	}
	zinf_engine_destroy(e);
	return fails + (rc != 0 && fails == 0);
}

static int
ckpt_train(const struct config *c, enum zinf_dtype dtype, int64_t first, int steps, bool same_data,
	   const char *load_dir, const char *save_dir, struct master *m, const char *what)
{
	return ckpt_train_bg(c, dtype, first, steps, same_data, load_dir, save_dir, 0, m, what);
}

/*
 * Resume over several ranks: 4 steps straight, and 2 steps + save + a new engine loaded from
 * it + 2 steps: bit for bit the same masters, and the reference's (quantised gradients).
 */
static int
case_ckpt_resume(void)
{
	const struct {
		struct config c;
		enum zinf_dtype dtype;
	} cfgs[] = {{{3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, true}, ZINF_BF16},
		    {{3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, true}, ZINF_F32},
		    {{2, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, true}, ZINF_F32},
		    {{1, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, true}, ZINF_BF16},
		    {{0, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, true}, ZINF_F32}};
	int fails = 0;
	char dir[4096];
	shared_dir("ckpt_resume", dir, sizeof(dir));
	for (size_t i = 0; i < sizeof(cfgs) / sizeof(cfgs[0]); i++) {
		const struct config *c = &cfgs[i].c;
		char what[96];
		snprintf(what, sizeof(what), "resume, %d ranks, stage %d, %s/%s, %s", world,
			 c->stage, tier_names[c->opt], tier_names[c->param],
			 zinf_dtype_name(cfgs[i].dtype));
		struct master a = {{0}}, b = {{0}};
		struct eref_result ref;
		if (master_alloc(&a) || master_alloc(&b) ||
		    reference(&ref, cfgs[i].dtype, QUANTUM, 4, GAS) < 0) {
			return fails + 1;
		}
		int f = ckpt_train(c, cfgs[i].dtype, 0, 4, false, NULL, NULL, &a, what);
		f += ckpt_train(c, cfgs[i].dtype, 0, 2, false, NULL, dir, NULL, what);
		f += ckpt_train(c, cfgs[i].dtype, 2, 2, false, dir, NULL, &b, what);
		fails += f;
		if (f == 0) {
			fails += compare(what, b.p, a.p, 0, NULL);
			fails += compare(what, b.p, ref.master, 0, NULL);
		}
		/* the same through a background save published by the following step */
		char bgw[128];
		snprintf(bgw, sizeof(bgw), "%s, background save", what);
		f = ckpt_train_bg(c, cfgs[i].dtype, 0, 2, false, NULL, dir, 2, &b, bgw);
		fails += f;
		if (f == 0) {
			fails += compare(bgw, b.p, a.p, 0, NULL);
			f = ckpt_train(c, cfgs[i].dtype, 2, 2, false, dir, NULL, &b, bgw);
			fails += f;
			fails += f ? 0 : compare(bgw, b.p, a.p, 0, NULL);
		}
		eref_result_free(&ref);
		master_free(&a);
		master_free(&b);
	}
	return fails;
}

/*
 * Another world size (ctest runs ckpt_save under mpirun -np 4 and -np 1, then ckpt_reshard
 * under -np 2, 3 and 4 against them): ckpt_save trains 2 steps with every rank handing rank
 * 0's data (stage 3, both tiers on NVMe) and saves into $ZINF_CKPT_DIR; ckpt_reshard loads
 * $ZINF_CKPT_DIR into another stage and tiers (the partitions re-cut), trains 2 more and must
 * equal the one-rank reference of 4 steps bit for bit: the optimizer state, not only the
 * masters, came over right (a moment off in any element moves the next steps).
 */
static int
case_ckpt_save(void)
{
	const char *dir = getenv("ZINF_CKPT_DIR");
	int fails = 0;
	CHECK(dir != NULL, "ZINF_CKPT_DIR is not set");
	if (!dir) {
		return fails;
	}
	if (rank == 0) {
		zt_rmtree(dir);
	}
	MPI_Barrier(MPI_COMM_WORLD);
	struct config c = {3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, true};
	return ckpt_train(&c, ZINF_F32, 0, 2, true, NULL, dir, NULL, "save for reshard");
}

static int
case_ckpt_reshard(void)
{
	const char *dir = getenv("ZINF_CKPT_DIR");
	int fails = 0;
	CHECK(dir != NULL, "ZINF_CKPT_DIR is not set");
	if (!dir) {
		return fails;
	}
	/* a different stage and tiers for each world size */
	struct config c = world == 2 ? (struct config){3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, true}
			  : world == 3
				  ? (struct config){2, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, true}
				  : (struct config){1, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, true};
	char what[128];
	snprintf(what, sizeof(what), "reshard %s into %d ranks, stage %d %s/%s", dir, world,
		 c.stage, tier_names[c.opt], tier_names[c.param]);
	struct master m = {{0}};
	struct eref_result ref;
	struct eref_opts ro = {
		.world = 1, .steps = 4, .gas = GAS, .dtype = ZINF_F32, .quantum = QUANTUM};
	edrive_optimizer(&ro.opt);
	if (master_alloc(&m) || eref_train(&ro, &ref) < 0) {
		return 1;
	}
	fails += ckpt_train(&c, ZINF_F32, 2, 2, true, dir, NULL, &m, what);
	if (fails == 0) {
		fails += compare(what, m.p, ref.master, 0, NULL);
	}
	eref_result_free(&ref);
	master_free(&m);
	return fails;
}

/*
 * zinf_engine_load into a running engine (stage 2, the optimizer on NVMe through the "fault"
 * I/O backend) where the last rank's writes of the loaded state fail: every rank returns -EIO,
 * agreed before the all-gathers of the new parameters, and the engine stays failed.
 */
static int
case_ckpt_load_fault(void)
{
	if (world < 2) {
		return SKIP;
	}
	struct zinf_engine_opts o;
	struct edrive d;
	int fails = 0;
	char dir[4096];
	shared_dir("ckpt_fault", dir, sizeof(dir));
	edrive_opts(&o, "mpi", 2, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, scratch, ZINF_F32, 1);
	o.io_backend = "fault";
	o.comm_check = false;
	o.comm_timeout_s = 10;
	o.swap_prefix = "rvload";
	struct zinf_engine *e = make_model(&o, &fails);
	if (!e) {
		return fails + 1;
	}
	int rc = edrive_init(&d, e, ZINF_F32, QUANTUM);
	if (rc == 0) {
		rc = edrive_run(&d, 0, 2, 1, -1);
		CHECK(rc == 0, "two clean steps: %s", d.why);
		edrive_fini(&d);
	}
	if (rc == 0) {
		rc = zinf_engine_save(e, dir, NULL, NULL);
		CHECK(rc == 0, "save: %d %s", rc, zinf_last_error());
	}
	struct zinf_io *io = zinf_engine_io(e);
	if (rc == 0 && rank == world - 1) {
		rc = arm_eio(io, ZINF_IO_WRITE, 1);
		CHECK(rc == 0, "zinf_io_fault_add: %d %s", rc, zinf_last_error());
	}
	if (rc == 0) {
		rc = zinf_engine_load(e, dir, NULL, NULL);
		CHECK(rc == -EIO, "load with rank %d's NVMe writes failing: %d, expected -EIO",
		      world - 1, rc);
		int again = zinf_engine_step(e);
		CHECK(again == rc, "a later step returned %d after %d", again, rc);
	}
	zinf_engine_destroy(e);
	if (rank == 0) {
		zt_rmtree(dir);
	}
	return fails;
}

/*
 * The trainer's blob is rank 0's: the other ranks' client fields are not looked at (here NULL
 * with a size, as a trainer that builds the blob on rank 0 alone may pass), and a bad blob on
 * rank 0 is refused on every rank with the same error, not on rank 0 alone.
 */
static int
case_ckpt_client_rank0(void)
{
	struct zinf_engine_opts o;
	int fails = 0;
	char dir[4096];
	shared_dir("ckpt_client", dir, sizeof(dir));
	edrive_opts(&o, "mpi", 1, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, scratch, ZINF_F32, 1);
	o.comm_timeout_s = 10;
	struct zinf_engine *e = make_model(&o, &fails);
	if (!e) {
		return fails + 1;
	}
	char blob[40] = "rank 0's trainer state";
	struct zinf_ckpt_opts so;
	zinf_ckpt_opts_init(&so);
	so.client = rank == 0 ? blob : NULL;
	so.client_bytes = sizeof(blob);
	int rc = zinf_engine_save(e, dir, "c", &so);
	CHECK(rc == 0, "save with the blob on rank 0 only: %d %s", rc, zinf_last_error());
	so.client = NULL;
	so.client_bytes = rank == 0 ? sizeof(blob) : 0;
	rc = zinf_engine_save(e, dir, "d", &so);
	CHECK(rc == -EINVAL, "save with rank 0's blob NULL: %d, expected -EINVAL", rc);
	char out[64] = {0};
	struct zinf_ckpt_opts lo;
	zinf_ckpt_opts_init(&lo);
	lo.client_out = out;
	lo.client_cap = sizeof(out);
	rc = zinf_engine_load(e, dir, NULL, &lo);
	CHECK(rc == 0 && lo.client_len == sizeof(blob) && memcmp(out, blob, sizeof(blob)) == 0,
	      "load of c: %d, client_len %llu", rc, (unsigned long long)lo.client_len);
	zinf_engine_destroy(e);
	if (rank == 0) {
		zt_rmtree(dir);
	}
	return fails;
}

/*
 * Stage 0 saves rank 0's files alone (files_world 1): loaded by every rank into stage 3 (each
 * rank cutting its partition out of rank 0's files), and a stage-3 save (files_world = world)
 * loaded into stage 0 (every rank reading every rank's files); 2 steps, save, load, 2 steps
 * equal the reference of 4 steps bit for bit.
 */
static int
case_ckpt_stage0_stage3(void)
{
	const struct config from[] = {{0, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, true},
				      {3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, true}};
	const struct config to[] = {{3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_CPU, true},
				    {0, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, true}};
	int fails = 0;
	char dir[4096];
	shared_dir("ckpt_s0s3", dir, sizeof(dir));
	struct eref_result ref;
	if (reference(&ref, ZINF_BF16, QUANTUM, 4, GAS) < 0) {
		return 1;
	}
	for (int i = 0; i < 2; i++) {
		char what[96];
		snprintf(what, sizeof(what), "%d ranks: stage %d saved, stage %d loaded", world,
			 from[i].stage, to[i].stage);
		struct master m = {{0}};
		if (master_alloc(&m)) {
			return fails + 1;
		}
		if (rank == 0) {
			zt_rmtree(dir);
		}
		MPI_Barrier(MPI_COMM_WORLD);
		int f = ckpt_train(&from[i], ZINF_BF16, 0, 2, false, NULL, dir, NULL, what);
		f += ckpt_train(&to[i], ZINF_BF16, 2, 2, false, dir, NULL, &m, what);
		fails += f;
		if (f == 0) {
			fails += compare(what, m.p, ref.master, 0, NULL);
		}
		master_free(&m);
	}
	eref_result_free(&ref);
	if (rank == 0) {
		zt_rmtree(dir);
	}
	return fails;
}

static const struct ranks_case cases[] = {
	{"ckpt_resume", case_ckpt_resume, false},
	{"ckpt_save", case_ckpt_save, true},
	{"ckpt_reshard", case_ckpt_reshard, true},
	{"ckpt_stage0_stage3", case_ckpt_stage0_stage3, false},
	{"ckpt_client_rank0", case_ckpt_client_rank0, false},
	{"ckpt_load_fault", case_ckpt_load_fault, false},
};

int
main(int argc, char **argv)
{
	return ranks_main(argc, argv, "ckpt", cases, sizeof(cases) / sizeof(cases[0]));
}
