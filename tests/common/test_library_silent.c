/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/common/test_library_silent.c: "the library never prints, exits or aborts" (DESIGN.md,
 * docs/ARCHITECTURE.md "Errors"). Each test runs its work in a forked child whose file
 * descriptors 1 and 2 are files (dup2), and which ends with a code of its own only after the
 * last call: the parent asserts that the child got there (no exit(), no abort(), no signal),
 * that every call answered what it should, that both files are empty, and that the log callback
 * the child installed received the messages (every error path: at least one ERROR line per
 * failing call, and the calls' zinf_last_error() set). The same work runs once more with no
 * callback (the default sink): still nothing on 1 or 2.
 *
 * The work: an engine cycle (create, register, init, steps, a checkpoint save and load,
 * read_master) on the NVMe tiers; the engine's error paths (bad options, calls in the wrong
 * order, an I/O fault through the "fault" backend, a load of no checkpoint); the building
 * blocks' error paths (io, swap, store, comm "single"); safetensors files written in shards and
 * read back, and the refusals of both sides.
 *
 * Not here: what each message says (the modules' tests check that); third-party libraries'
 * own output (Open MPI is not started: comm "single").
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/test_util.h"
#include "engine/engine_drive.h"
#include "engine/engine_ref.h"
#include "zinf/blocks/comm.h"
#include "zinf/blocks/io.h"
#include "zinf/blocks/offload.h"
#include "zinf/blocks/swap.h"
#include "zinf/checkpoint.h"
#include "zinf/engine.h"
#include "zinf/safetensors.h"

#define QUANTUM	  0x1p-14f
#define GAS	  2
#define REACHED	  42 /* the child's exit code once its last call returned */
#define WHY_BYTES 1024

/* What the child sends back through its pipe. */
struct report {
	int failed;	      /* a call answered something else (why says which) */
	unsigned lines[4];    /* log lines received, by level */
	char why[WHY_BYTES];  /* the first unexpected answer */
	char last[WHY_BYTES]; /* the last ERROR line received */
};

/* The child's state: its report, and whether the log callback is installed. */
static struct report rep;
static bool with_callback;
static pthread_mutex_t rep_lock = PTHREAD_MUTEX_INITIALIZER;

static void
keep_line(void *ctx, enum zinf_log_level level, const char *file, int line, const char *func,
	  const char *msg)
{
	(void)ctx;
	(void)file;
	(void)line;
	(void)func;
	pthread_mutex_lock(&rep_lock);
	if ((unsigned)level < 4) {
		rep.lines[level]++;
	}
	if (level == ZINF_LOG_ERROR) {
		snprintf(rep.last, sizeof(rep.last), "%s", msg);
	}
	pthread_mutex_unlock(&rep_lock);
}

static unsigned
errors_logged(void)
{
	pthread_mutex_lock(&rep_lock);
	unsigned n = rep.lines[ZINF_LOG_ERROR];
	pthread_mutex_unlock(&rep_lock);
	return n;
}

/* Record the first unexpected answer; the work goes on (a later call may print too). */
static bool
fail(const char *fmt, ...)
{
	if (!rep.failed) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(rep.why, sizeof(rep.why), fmt, ap);
		va_end(ap);
	}
	rep.failed = 1;
	return false;
}

/* A call that must succeed (rc >= 0). */
#define OK(call)                                                                                   \
	do {                                                                                       \
		int ok_rc_ = (call);                                                               \
		if (ok_rc_ < 0) {                                                                  \
			fail("line %d: %s: %d %s", __LINE__, #call, ok_rc_, zinf_last_error());    \
		}                                                                                  \
	} while (0)

/*
 * A call that must fail with `want` (0: any negative errno) and say why: an ERROR line to the
 * callback (when installed) and zinf_last_error() set. `logs` false for a call that returns an
 * error logged earlier (a failed engine's later calls).
 */
static int
refused(int rc, int want, bool logs, unsigned before, const char *what, int line)
{
	if (want ? rc != want : rc >= 0) {
		fail("line %d: %s: %d, expected %d (%s)", line, what, rc, want, zinf_last_error());
	} else if (logs && !zinf_last_error()[0]) {
		fail("line %d: %s: %d but zinf_last_error() is empty", line, what, rc);
	} else if (logs && with_callback && errors_logged() == before) {
		fail("line %d: %s: %d but no ERROR line reached the callback", line, what, rc);
	}
	return rc;
}

#define REFUSED(call, want)                                                                        \
	do {                                                                                       \
		unsigned ref_before_ = errors_logged();                                            \
		refused((call), (want), true, ref_before_, #call, __LINE__);                       \
	} while (0)
#define REFUSED_AGAIN(call, want) refused((call), (want), false, 0, #call, __LINE__)

/* ---- the work ----------------------------------------------------------------------------- */

static struct zinf_engine *
model(struct zinf_engine_opts *o)
{
	struct zinf_engine *e = NULL;
	OK(zinf_engine_create(o, &e));
	if (e) {
		OK(edrive_add_params(e));
	}
	return e;
}

/* create, register, init, 2 steps, save, 1 step, load (back to step 2), 1 step, read_master */
static void
engine_cycle(const char *dir)
{
	char nvme[4096], ck[4096];
	snprintf(nvme, sizeof(nvme), "%s/nvme", dir);
	snprintf(ck, sizeof(ck), "%s/ckpt", dir);
	if (mkdir(nvme, 0700) != 0) {
		fail("mkdir %s: %s", nvme, strerror(errno));
		return;
	}
	struct zinf_engine_opts o;
	edrive_opts(&o, "single", 3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, nvme, ZINF_F32, GAS);
	struct zinf_engine *e = model(&o);
	if (!e) {
		return;
	}
	OK(zinf_engine_init(e));
	struct edrive d;
	OK(edrive_init(&d, e, ZINF_F32, QUANTUM));
	int rc = edrive_run(&d, 0, 2, GAS, -1);
	if (rc < 0) {
		fail("steps 0-1: %s", d.why);
	}
	OK(zinf_engine_save(e, ck, "two", NULL));
	if ((rc = edrive_run(&d, 2, 1, GAS, -1)) < 0) {
		fail("step 2: %s", d.why);
	}
	OK(zinf_engine_load(e, ck, "two", NULL));
	if (zinf_engine_steps(e) != 2) {
		fail("steps after the load: %lld, expected 2", (long long)zinf_engine_steps(e));
	}
	if ((rc = edrive_run(&d, 2, 1, GAS, -1)) < 0) {
		fail("step 2 again: %s", d.why);
	}
	float *m[EREF_NPARAMS];
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		m[id] = calloc(eref_numel(id), sizeof(float));
	}
	OK(edrive_read_master(e, m));
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		free(m[id]);
	}
	edrive_fini(&d);
	zinf_engine_destroy(e);
}

/* bad options, calls in the wrong order, a load of nothing, an NVMe read that fails */
static void
engine_errors(const char *dir)
{
	struct zinf_engine_opts o;
	struct zinf_engine *e = NULL;
	char nvme[4096], none[4096];
	snprintf(nvme, sizeof(nvme), "%s/nvme", dir);
	snprintf(none, sizeof(none), "%s/no-checkpoint", dir);
	if (mkdir(nvme, 0700) != 0) {
		fail("mkdir %s: %s", nvme, strerror(errno));
		return;
	}

	edrive_opts(&o, "single", 3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, nvme, ZINF_F32, GAS);
	o.stage = 9;
	REFUSED(zinf_engine_create(&o, &e), -EINVAL);
	edrive_opts(&o, "single", 3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, nvme, ZINF_F32, GAS);
	o.dtype = (enum zinf_dtype)99;
	REFUSED(zinf_engine_create(&o, &e), -EINVAL);
	edrive_opts(&o, "no-such-comm", 3, ZINF_OFFLOAD_NONE, ZINF_OFFLOAD_NONE, NULL, ZINF_F32,
		    GAS);
	REFUSED(zinf_engine_create(&o, &e), 0);
	REFUSED(zinf_engine_create(&o, NULL), -EINVAL);

	/* the wrong order: before init, then a registration after it */
	edrive_opts(&o, "single", 3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NVME, nvme, ZINF_F32, GAS);
	o.io_backend = "fault";
	o.step_during_backward = false;
	e = model(&o);
	if (!e) {
		return;
	}
	REFUSED(zinf_engine_fetch(e, 0), -EINVAL);
	REFUSED(zinf_engine_step(e), -EINVAL);
	float out[16];
	REFUSED(zinf_engine_read_master(e, 0, out), -EINVAL);
	REFUSED(zinf_engine_save(e, dir, "early", NULL), -EINVAL);
	REFUSED(zinf_engine_load(e, none, NULL, NULL), -ENOENT);
	OK(zinf_engine_init(e));
	struct zinf_param_desc pd;
	zinf_param_desc_init(&pd);
	pd.name = "late";
	pd.numel = 4;
	pd.layer = 0;
	REFUSED(zinf_engine_add_param(e, &pd), -EINVAL);
	REFUSED(zinf_engine_release(e, 0), -EINVAL); /* never fetched */
	REFUSED(zinf_engine_read_master(e, 999, out), -EINVAL);

	/* an NVMe read that fails (EIO from the first read on): the engine fails, says so once,
	   and every later call returns that error */
	struct zinf_io_fault f = {.kind = ZINF_IO_FAULT_FAIL,
				  .op = ZINF_IO_READ,
				  .nth = 1,
				  .count = 1000,
				  .err = EIO};
	OK(zinf_io_fault_add(zinf_engine_io(e), &f));
	struct edrive d;
	OK(edrive_init(&d, e, ZINF_F32, QUANTUM));
	unsigned before = errors_logged();
	int rc = edrive_run(&d, 0, 1, GAS, -1);
	refused(rc, -EIO, true, before, "a step over a failing NVMe read", __LINE__);
	REFUSED_AGAIN(zinf_engine_step(e), -EIO);
	REFUSED_AGAIN(zinf_engine_fetch(e, 0), -EIO);
	edrive_fini(&d);
	zinf_engine_destroy(e);
}

/* io, swap, store, comm "single": bad arguments, missing files, failing I/O */
static void
blocks_errors(const char *dir)
{
	/* io */
	struct zinf_io_opts io_o;
	struct zinf_io *io = NULL;
	zinf_io_opts_init(&io_o);
	io_o.block_size = 1000;
	REFUSED(zinf_io_create(&io_o, &io), -EINVAL);
	zinf_io_opts_init(&io_o);
	io_o.backend = "no-such-backend";
	REFUSED(zinf_io_create(&io_o, &io), -EINVAL);
	zinf_io_opts_init(&io_o);
	io_o.backend = "fault";
	io_o.fault_inner = "psync";
	io_o.block_size = 16384;
	OK(zinf_io_create(&io_o, &io));
	if (!io) {
		return;
	}
	char path[4096];
	struct zinf_io_file *file = NULL;
	snprintf(path, sizeof(path), "%s/missing/file", dir);
	REFUSED(zinf_io_file_open(io, path, ZINF_IO_RDWR, &file), -ENOENT);
	snprintf(path, sizeof(path), "%s/data", dir);
	OK(zinf_io_file_open(io, path, ZINF_IO_RDWR | ZINF_IO_CREATE, &file));
	char *buf = zinf_alloc_aligned(4096, 1 << 16);
	if (!file || !buf) {
		fail("no file or buffer");
		return;
	}
	memset(buf, 7, 1 << 16);
	REFUSED(zinf_io_pwrite(io, file, buf + 1, 4096, 0), -EINVAL); /* misaligned */
	OK(zinf_io_pwrite(io, file, buf, 1 << 16, 0));
	REFUSED(zinf_io_pread(io, file, buf, 4096, 1 << 20), -ENODATA); /* past the end */
	struct zinf_io_fault f = {.kind = ZINF_IO_FAULT_FAIL,
				  .op = ZINF_IO_READ,
				  .nth = 1,
				  .count = 1000,
				  .err = EIO};
	OK(zinf_io_fault_add(io, &f));
	REFUSED(zinf_io_pread(io, file, buf, 1 << 16, 0), -EIO);
	zinf_io_file_close(io, file);
	REFUSED(zinf_io_submit(NULL, NULL), -EINVAL);

	/* swap and store: a missing directory, a bad kind, an unwritten tensor read, writes that
	   fail (the swap's own, and the store's write-back of a dirty tensor) */
	struct zinf_swap_opts so;
	struct zinf_swap *s = NULL;
	zinf_swap_opts_init(&so);
	snprintf(path, sizeof(path), "%s/no-such-dir", dir);
	const char *dirs[1] = {path};
	so.dirs = dirs;
	so.n_dirs = 1;
	REFUSED(zinf_swap_create(io, &so, &s), -ENOENT);
	dirs[0] = dir;
	OK(zinf_swap_create(io, &so, &s));
	struct zinf_pool_opts po;
	struct zinf_pool *pool = NULL;
	zinf_pool_opts_init(&po);
	po.buffer_count = 1;
	po.buffer_bytes = 1 << 16;
	po.io = io;
	po.pin_memory = false;
	po.what = "silent";
	OK(zinf_pool_create(&po, &pool));
	struct zinf_store_opts sto;
	struct zinf_store *st = NULL;
	zinf_store_opts_init(&sto);
	REFUSED(zinf_store_create(&sto, &st), -EINVAL); /* no pool */
	sto.pool = pool;
	sto.swap = s;
	OK(zinf_store_create(&sto, &st));
	if (!s || !pool || !st) {
		fail("no swap space, pool or store");
		return;
	}
	int m0 = zinf_swap_add(s, "m", 0, 1 << 16);
	OK(m0);
	REFUSED(zinf_swap_add(s, "bad kind!", 0, 4096), -EINVAL);
	int p0 = zinf_store_add(st, "p", 0, (1 << 16) / 4, 4, ZINF_TIER_NVME);
	OK(p0);
	OK(zinf_swap_reserve(s));
	REFUSED(zinf_swap_read(s, m0, buf), -ENODATA);
	struct zinf_io_fault fw = {
		.kind = ZINF_IO_FAULT_FAIL, .op = ZINF_IO_WRITE, .nth = 1, .count = 1, .err = EIO};
	OK(zinf_io_fault_add(io, &fw));
	REFUSED(zinf_swap_write(s, m0, buf), -EIO);
	REFUSED(zinf_store_swap_in(st, 5, 0), -EINVAL); /* no such tensor */
	OK(zinf_store_swap_in(st, p0, ZINF_STORE_NEW));
	void *data = NULL;
	OK(zinf_store_wait(st, p0, &data));
	OK(zinf_store_mark_dirty(st, p0));
	OK(zinf_io_fault_add(io, &fw));
	OK(zinf_store_release(st, p0));
	REFUSED(zinf_store_flush(st), -EIO);
	zinf_store_destroy(st);
	zinf_pool_destroy(pool);
	zinf_swap_destroy(s);
	zinf_io_destroy(io);
	zinf_free_aligned(buf);

	/* comm "single": an unknown backend, bad arguments */
	struct zinf_comm_opts co;
	struct zinf_comm *c = NULL;
	zinf_comm_opts_init(&co);
	co.backend = "no-such-comm";
	REFUSED(zinf_comm_create(&co, &c), -EINVAL);
	co.backend = "single";
	OK(zinf_comm_create(&co, &c));
	if (!c) {
		return;
	}
	float v[4] = {1, 2, 3, 4};
	REFUSED(zinf_comm_all_reduce(c, NULL, 4, ZINF_F32, ZINF_COMM_SUM, NULL), -EINVAL);
	REFUSED(zinf_comm_broadcast(c, v, 4, ZINF_F32, 3, NULL), -EINVAL); /* root 3 of 1 */
	struct zinf_comm_part part;
	REFUSED(zinf_comm_partition(10, 0, 0, &part), -EINVAL);
	REFUSED(zinf_comm_all_reduce(c, v, 4, (enum zinf_dtype)99, ZINF_COMM_SUM, NULL), 0);
	REFUSED(zinf_comm_reduce_scatter(c, v, v, 4, ZINF_F32, (enum zinf_comm_red)9, NULL), 0);
	REFUSED(zinf_comm_wait(c, NULL), 0);
	zinf_comm_destroy(c);
}

/* safetensors: a sharded write read back; refusals of the writer, the reader and the index */
static void
safetensors_work(const char *dir)
{
	char path[4096];
	struct zinf_safetensors_writer_opts o;
	zinf_safetensors_writer_opts_init(&o);
	o.shard_bytes = 64;
	struct zinf_safetensors_writer *w = NULL;
	snprintf(path, sizeof(path), "%s/model.safetensors", dir);
	OK(zinf_safetensors_writer_create(path, &o, &w));
	if (!w) {
		return;
	}
	uint64_t n = 32;
	float v[32] = {0};
	OK(zinf_safetensors_writer_add(w, "a", ZINF_BF16, 1, &n));
	OK(zinf_safetensors_writer_add(w, "b", ZINF_F32, 1, &n));
	REFUSED(zinf_safetensors_writer_add(w, "a", ZINF_F32, 1, &n), -EINVAL);
	OK(zinf_safetensors_writer_write(w, 0, 0, n, ZINF_F32, v));
	OK(zinf_safetensors_writer_write(w, 1, 0, n, ZINF_F32, v));
	REFUSED(zinf_safetensors_writer_write(w, 1, 0, 1, ZINF_F32, v), -EINVAL);
	OK(zinf_safetensors_writer_finish(w));
	zinf_safetensors_writer_destroy(w);
	REFUSED(zinf_safetensors_writer_create(path, NULL, &w), -EEXIST);
	struct zinf_safetensors *st = NULL;
	OK(zinf_safetensors_open(dir, &st));
	if (st) {
		OK(zinf_safetensors_read(st, 0, 0, n, ZINF_F16, v));
		REFUSED(zinf_safetensors_read(st, 1, 1, n, ZINF_F32, v), -EINVAL);
		zinf_safetensors_close(st);
	}
	snprintf(path, sizeof(path), "%s/missing.safetensors", dir);
	REFUSED(zinf_safetensors_open(path, &st), -ENOENT);
	snprintf(path, sizeof(path), "%s/bad.safetensors", dir);
	FILE *f = fopen(path, "wb");
	if (f) {
		fwrite("\xff\0\0\0\0\0\0\0{}", 1, 10, f); /* a header past the file */
		fclose(f);
	}
	REFUSED(zinf_safetensors_open(path, &st), -EBADMSG);
	snprintf(path, sizeof(path), "%s/x.index.json", dir);
	f = fopen(path, "w");
	if (f) {
		fputs("{\"weight_map\": {\"w\": \"gone.safetensors\"}}", f);
		fclose(f);
	}
	REFUSED(zinf_safetensors_open(path, &st), -ENOENT);
}

/* ---- the child and the parent ------------------------------------------------------------- */

/* Read a file whole (at most 4 KiB shown), for a failure's message. */
static void
head(const char *path, char *out, size_t n)
{
	out[0] = 0;
	FILE *f = fopen(path, "r");
	if (f) {
		size_t k = fread(out, 1, n - 1, f);
		out[k] = 0;
		fclose(f);
	}
}

static off_t
file_size(const char *path)
{
	struct stat sb;
	return stat(path, &sb) == 0 ? sb.st_size : -1;
}

/*
 * Run work(dir) in a child with 1 and 2 on files and the log callback installed (or none), at
 * level DEBUG (every line the library makes goes to the callback). Assert as the file's comment
 * says; `errors` whether the work makes ERROR lines (the error paths) or none (the cycle).
 */
static void
run_silently(void (*work)(const char *dir), bool callback, bool errors)
{
	char *dir = zt_mkdtemp(NULL);
	cr_assert_not_null(dir);
	char out[4200], err[4200], work_dir[4200];
	snprintf(out, sizeof(out), "%s/stdout", dir);
	snprintf(err, sizeof(err), "%s/stderr", dir);
	snprintf(work_dir, sizeof(work_dir), "%s/work", dir);
	cr_assert_eq(mkdir(work_dir, 0700), 0);
	int pipefd[2];
	cr_assert_eq(pipe(pipefd), 0);
	fflush(NULL);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		close(pipefd[0]);
		int o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0) {
			_exit(3);
		}
		close(o);
		close(e);
		memset(&rep, 0, sizeof(rep));
		with_callback = callback;
		zinf_log_set_callback(callback ? keep_line : NULL, NULL);
		zinf_log_set_level(ZINF_LOG_DEBUG);
		work(work_dir);
		fflush(NULL); /* anything the library left in stdio's buffers reaches the files */
		pthread_mutex_lock(&rep_lock);
		ssize_t w = write(pipefd[1], &rep, sizeof(rep));
		pthread_mutex_unlock(&rep_lock);
		_exit(w == (ssize_t)sizeof(rep) ? REACHED : 4);
	}
	close(pipefd[1]);
	struct report r;
	memset(&r, 0, sizeof(r));
	ssize_t got = read(pipefd[0], &r, sizeof(r));
	close(pipefd[0]);
	int status = 0;
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	char shown[4096];
	head(err, shown, sizeof(shown));
	cr_assert(!WIFSIGNALED(status), "the work died of signal %d (abort: %d); stderr: %s",
		  WIFSIGNALED(status) ? WTERMSIG(status) : 0, SIGABRT, shown);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == REACHED,
		  "the work ended with exit status %d before its last call (the library exited?); "
		  "stderr: %s",
		  WIFEXITED(status) ? WEXITSTATUS(status) : -1, shown);
	cr_assert_eq(got, (ssize_t)sizeof(r), "no report from the work");
	cr_assert_not(r.failed, "%s", r.why);
	cr_assert_eq(file_size(err), 0, "the library wrote to fd 2: %s", shown);
	head(out, shown, sizeof(shown));
	cr_assert_eq(file_size(out), 0, "the library wrote to fd 1: %s", shown);
	unsigned lines = r.lines[0] + r.lines[1] + r.lines[2] + r.lines[3];
	if (callback) {
		cr_assert_gt(lines, 0, "the log callback received nothing");
		if (errors) {
			cr_assert_gt(r.lines[ZINF_LOG_ERROR], 0,
				     "no ERROR line reached the callback");
		} else {
			cr_assert_eq(r.lines[ZINF_LOG_ERROR], 0,
				     "an ERROR line in a clean cycle: %s", r.last);
		}
	} else {
		cr_assert_eq(lines, 0, "lines reached a callback that was not installed");
	}
	zt_rmtree(dir);
	free(dir);
}

TestSuite(library_silent);

Test(library_silent, engine_cycle_writes_nothing_to_stdout_or_stderr)
{
	run_silently(engine_cycle, true, false);
	run_silently(engine_cycle, false, false);
}

Test(library_silent, engine_errors_go_to_the_log_callback_only)
{
	run_silently(engine_errors, true, true);
	run_silently(engine_errors, false, true);
}

Test(library_silent, building_blocks_errors_go_to_the_log_callback_only)
{
	run_silently(blocks_errors, true, true);
	run_silently(blocks_errors, false, true);
}

Test(library_silent, safetensors_errors_go_to_the_log_callback_only)
{
	run_silently(safetensors_work, true, true);
	run_silently(safetensors_work, false, true);
}
