/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/nvme/test_io.c: the I/O engine's contract, run once per backend (ZINF_TEST_VARIANT =
 * io_uring | libaio | psync), through real files: random round trips, many requests over many
 * files on several workers, registered buffers, misaligned arguments, tmpfs, the fault backend
 * (wrapping the variant) failing and shortening ops, and independence of waits.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <linux/magic.h>

#include "common/test_util.h"
#include "common/util.h"
#include "zinf/blocks/io.h"
#include "nvme/io_internal.h" /* io_test_refuse */

struct fixture {
	char *dir;
	struct zinf_io *io;
	uint64_t rng;
};

static void
setup(void)
{
	zt_log_to_stderr();
}

TestSuite(nvme_io, .init = setup);

/* A context of the variant's backend (or "fault" wrapping it); skips only where io_uring or
 * libaio is absent (zt_io_open): psync and fault over psync always run. */
static struct zinf_io *
io_open(uint32_t qd, uint32_t bs, uint32_t threads, bool fault)
{
	struct zinf_io_opts o;
	struct zinf_io *io = NULL;
	zinf_io_opts_init(&o);
	o.queue_depth = qd;
	o.block_size = bs;
	o.threads = threads;
	if (fault) {
		o.backend = "fault";
		o.fault_inner = zt_variant();
	} else {
		o.backend = zt_variant();
	}
	io = zt_io_open(&o);
	if (!fault && zt_variant()) {
		cr_assert_str_eq(zinf_io_backend(io), zt_variant());
	}
	return io;
}

static struct zinf_io_file *
file_open(struct zinf_io *io, const char *dir, const char *name, unsigned extra)
{
	char path[4096];
	struct zinf_io_file *f = NULL;
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	int rc = zinf_io_file_open(io, path, ZINF_IO_RDWR | ZINF_IO_CREATE | extra, &f);
	cr_assert_eq(rc, 0, "open %s: %d %s", path, rc, zinf_last_error());
	cr_assert_str_eq(zinf_io_file_path(f), path);
	return f;
}

static void *
xalloc(size_t len)
{
	void *p = zinf_alloc_aligned(4096, len ? len : 4096);
	cr_assert_not_null(p);
	return p;
}

static uint64_t
rnd(uint64_t *s, uint64_t n)
{
	return zt_rand(s) % n;
}

/* Random aligned writes, then reads into other buffers: the bytes must match exactly. */
Test(nvme_io, random_round_trips)
{
	uint64_t rng = zt_seed();
	char *dir = zt_mkdtemp(NULL);
	struct zinf_io *io = io_open(8, 64 << 10, 2, false);
	struct zinf_io_file *f = file_open(io, dir, "rt", 0);
	uint32_t a = zinf_io_file_align(f);
	cr_assert(a >= 512 && a <= 4096 && ZINF_IS_POW2(a), "alignment %u", a);
	size_t file_len = 8 << 20;
	cr_assert_eq(ftruncate(zinf_io_file_fd(f), (off_t)file_len), 0);
	char *ref = calloc(1, file_len);
	char *wbuf = xalloc(2 << 20), *rbuf = xalloc(2 << 20);
	/* Lengths that are not multiples of the block size but are of the alignment. */
	for (int it = 0; it < 40; it++) {
		size_t len = (1 + rnd(&rng, (2 << 20) / a)) * a;
		uint64_t off = rnd(&rng, (file_len - len) / a + 1) * a;
		zt_rand_fill(wbuf, len, &rng);
		memcpy(ref + off, wbuf, len);
		cr_assert_eq(zinf_io_pwrite(io, f, wbuf, len, off), 0, "write %zu@%llu", len,
			     (unsigned long long)off);
	}
	for (int it = 0; it < 40; it++) {
		size_t len = (1 + rnd(&rng, (2 << 20) / a)) * a;
		uint64_t off = rnd(&rng, (file_len - len) / a + 1) * a;
		memset(rbuf, 0xa5, len);
		struct zinf_io_req r;
		cr_assert_eq(zinf_io_read_async(io, &r, f, rbuf, len, off), 0);
		cr_assert_eq(zinf_io_wait(io, &r), 0);
		cr_assert_eq(r.result, (int64_t)len);
		cr_assert(memcmp(rbuf, ref + off, len) == 0, "data differs at %zu@%llu", len,
			  (unsigned long long)off);
	}
	struct zinf_io_stats st = {.size = sizeof(st)};
	zinf_io_get_stats(io, &st);
	cr_assert_eq(st.errors, 0);
	cr_assert_eq(st.reqs, 80);
	zinf_io_destroy(io);
	zinf_free_aligned(wbuf);
	zinf_free_aligned(rbuf);
	free(ref);
	zt_rmtree(dir);
	free(dir);
}

/* Buffered files: any buffer, offset and length. */
Test(nvme_io, buffered_arbitrary_lengths)
{
	uint64_t rng = zt_seed();
	char *dir = zt_mkdtemp(NULL);
	struct zinf_io *io = io_open(4, 4096, 1, false);
	struct zinf_io_file *f = file_open(io, dir, "buf", ZINF_IO_BUFFERED);
	cr_assert_eq(zinf_io_file_align(f), 1);
	size_t file_len = 1 << 20;
	cr_assert_eq(ftruncate(zinf_io_file_fd(f), (off_t)file_len), 0);
	char *ref = calloc(1, file_len);
	char *w = malloc(100001), *r = malloc(100001);
	for (int it = 0; it < 60; it++) {
		size_t len = 1 + rnd(&rng, 100000);
		uint64_t off = rnd(&rng, file_len - len);
		size_t skew = rnd(&rng, 2); /* odd buffer addresses too */
		zt_rand_fill(w + skew, len, &rng);
		memcpy(ref + off, w + skew, len);
		cr_assert_eq(zinf_io_pwrite(io, f, w + skew, len, off), 0);
	}
	for (int it = 0; it < 60; it++) {
		size_t len = 1 + rnd(&rng, 100000);
		uint64_t off = rnd(&rng, file_len - len);
		cr_assert_eq(zinf_io_pread(io, f, r + 1, len, off), 0);
		cr_assert(memcmp(r + 1, ref + off, len) == 0, "%zu@%llu", len,
			  (unsigned long long)off);
	}
	zinf_io_destroy(io);
	free(w);
	free(r);
	free(ref);
	zt_rmtree(dir);
	free(dir);
}

struct counter {
	uint64_t calls;
};

static void
count_done(struct zinf_io_req *r, void *arg)
{
	struct counter *c = arg;
	__atomic_add_fetch(&c->calls, 1, __ATOMIC_RELAXED);
}

/* 200 requests over 16 files in flight at once, on 3 workers; callbacks and wait_all. */
Test(nvme_io, many_requests_many_files)
{
	enum { NF = 16, NR = 200, SLOT = 96 << 10 };
	uint64_t rng = zt_seed();
	char *dir = zt_mkdtemp(NULL);
	struct zinf_io *io = io_open(4, 32 << 10, 3, false);
	struct zinf_io_file *f[NF];
	for (int i = 0; i < NF; i++) {
		char name[32];
		snprintf(name, sizeof(name), "f%02d", i);
		f[i] = file_open(io, dir, name, 0);
	}
	uint32_t a = zinf_io_file_align(f[0]);
	char *wb = xalloc((size_t)NR * SLOT), *rb = xalloc((size_t)NR * SLOT);
	struct zinf_io_req *req = calloc(NR, sizeof(*req));
	struct zinf_io_req *ptr[NR];
	size_t len[NR];
	struct counter c = {0};
	zt_rand_fill(wb, (size_t)NR * SLOT, &rng);
	/* Request i writes slot i / NF of file i % NF: disjoint extents. */
	for (int i = 0; i < NR; i++) {
		len[i] = (1 + rnd(&rng, SLOT / a)) * a;
		req[i] = (struct zinf_io_req){.op = ZINF_IO_WRITE,
					      .file = f[i % NF],
					      .buf = wb + (size_t)i * SLOT,
					      .len = len[i],
					      .offset = (uint64_t)(i / NF) * SLOT,
					      .done = count_done,
					      .arg = &c};
		ptr[i] = &req[i];
		cr_assert_eq(zinf_io_submit(io, &req[i]), 0);
	}
	cr_assert_eq(zinf_io_wait_all(io, ptr, NR), 0);
	for (int i = 0; i < NR; i++) {
		cr_assert_eq(req[i].result, (int64_t)len[i]);
	}
	for (int i = 0; i < NR; i++) {
		req[i].op = ZINF_IO_READ;
		req[i].buf = rb + (size_t)i * SLOT;
		cr_assert_eq(zinf_io_submit(io, &req[i]), 0);
	}
	cr_assert_eq(zinf_io_wait_all(io, ptr, NR), 0);
	/* Callbacks run before wait returns only for requests reported complete: by now all. */
	uint64_t calls = 0;
	for (int spin = 0;
	     spin < 1000 && (calls = __atomic_load_n(&c.calls, __ATOMIC_RELAXED)) < 2 * NR;
	     spin++) {
		usleep(1000);
	}
	cr_assert_eq(calls, 2 * NR);
	uint64_t total = 0;
	for (int i = 0; i < NR; i++) {
		cr_assert_eq(zinf_io_poll(io, &req[i]), 1);
		cr_assert(memcmp(rb + (size_t)i * SLOT, wb + (size_t)i * SLOT, len[i]) == 0,
			  "request %d", i);
		total += len[i];
	}
	struct zinf_io_stats st = {.size = sizeof(st)};
	zinf_io_get_stats(io, &st);
	cr_assert_eq(st.bytes_written, total);
	cr_assert_eq(st.bytes_read, total);
	cr_assert_eq(st.reqs, 2 * NR);
	/* Requests of 1 to 3 blocks filled a worker's depth of 4: depth holds across requests. */
	cr_assert(st.max_inflight >= 4 && st.max_inflight <= 12, "max in flight %llu",
		  (unsigned long long)st.max_inflight);
	for (int i = 0; i < NF; i += 2) {
		zinf_io_file_close(io, f[i]); /* the rest are closed by destroy */
	}
	zinf_io_destroy(io);
	zinf_free_aligned(wb);
	zinf_free_aligned(rb);
	free(req);
	zt_rmtree(dir);
	free(dir);
}

/* I/O through registered buffers (fixed buffers on io_uring), then unregistered. */
Test(nvme_io, registered_buffers)
{
	uint64_t rng = zt_seed();
	char *dir = zt_mkdtemp(NULL);
	struct zinf_io *io = io_open(8, 64 << 10, 2, false);
	struct zinf_io_file *f = file_open(io, dir, "reg", 0);
	size_t n = 4 << 20;
	char *big = xalloc(n), *other = xalloc(n);
	struct iovec iov = {big, n};
	cr_assert_eq(zinf_io_register_buffers(io, &iov, 1), 0, "%s", zinf_last_error());
	zt_rand_fill(big, n, &rng);
	memcpy(other, big, n);
	cr_assert_eq(zinf_io_pwrite(io, f, big, n, 0), 0);
	memset(big, 0, n);
	/* Sub-ranges of the registered buffer, several in flight. */
	struct zinf_io_req r[4];
	for (int i = 0; i < 4; i++) {
		cr_assert_eq(zinf_io_read_async(io, &r[i], f, big + i * (n / 4), n / 4,
						(uint64_t)i * (n / 4)),
			     0);
	}
	for (int i = 0; i < 4; i++) {
		cr_assert_eq(zinf_io_wait(io, &r[i]), 0);
	}
	cr_assert(memcmp(big, other, n) == 0);
	cr_assert_eq(zinf_io_register_buffers(io, NULL, 0), 0);
	memset(big, 0, n);
	cr_assert_eq(zinf_io_pread(io, f, big, n, 0), 0);
	cr_assert(memcmp(big, other, n) == 0);
	zinf_io_destroy(io);
	zinf_free_aligned(big);
	zinf_free_aligned(other);
	zt_rmtree(dir);
	free(dir);
}

/* Misaligned buffer, offset or length: -EINVAL and nothing submitted. */
Test(nvme_io, misaligned_is_einval_before_submission)
{
	char *dir = zt_mkdtemp(NULL);
	struct zinf_io *io = io_open(4, 64 << 10, 1, false);
	struct zinf_io_file *f = file_open(io, dir, "mis", 0);
	uint32_t a = zinf_io_file_align(f);
	char *buf = xalloc(1 << 20);
	struct zinf_io_req r;
	cr_assert_eq(zinf_io_write_async(io, &r, f, buf + 1, a, 0), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "multiples of") != NULL, "%s", zinf_last_error());
	cr_assert_eq(zinf_io_write_async(io, &r, f, buf, a, a / 2), -EINVAL);
	cr_assert_eq(zinf_io_read_async(io, &r, f, buf, a + 1, 0), -EINVAL);
	cr_assert_eq(zinf_io_read_async(io, &r, f, NULL, a, 0), -EINVAL);
	cr_assert_eq(zinf_io_read_async(io, &r, NULL, buf, a, 0), -EINVAL);
	struct zinf_io_stats st = {.size = sizeof(st)};
	zinf_io_get_stats(io, &st);
	cr_assert_eq(st.reqs, 0);
	cr_assert_eq(st.blocks, 0);
	/* Read-only file: a write is refused, a read goes. */
	struct zinf_io_file *ro = NULL;
	char path[4096];
	snprintf(path, sizeof(path), "%s/mis", dir);
	cr_assert_eq(zinf_io_pwrite(io, f, buf, a, 0), 0);
	cr_assert_eq(zinf_io_file_open(io, path, ZINF_IO_RDONLY, &ro), 0);
	cr_assert_eq(zinf_io_pwrite(io, ro, buf, a, 0), -EBADF);
	cr_assert_eq(zinf_io_pread(io, ro, buf, a, 0), 0);
	/* Reading past the end of the file is an error, not zeros. */
	cr_assert_eq(zinf_io_pread(io, ro, buf, a, 64 * (uint64_t)a), -ENODATA);
	/* Missing file without CREATE. */
	struct zinf_io_file *missing = NULL;
	snprintf(path, sizeof(path), "%s/nope/x", dir);
	cr_assert_eq(zinf_io_file_open(io, path, ZINF_IO_RDWR, &missing), -ENOENT);
	cr_assert_null(missing);
	zinf_io_destroy(io);
	zinf_free_aligned(buf);
	zt_rmtree(dir);
	free(dir);
}

/* tmpfs has no real direct I/O: refused with a clear error, fine when buffered. */
Test(nvme_io, tmpfs_needs_buffered)
{
	struct statfs sf;
	if (statfs("/dev/shm", &sf) != 0 || sf.f_type != TMPFS_MAGIC) {
		cr_skip_test("/dev/shm is not a tmpfs here");
	}
	uint64_t rng = zt_seed();
	char *dir = zt_mkdtemp("/dev/shm");
	struct zinf_io *io = io_open(4, 64 << 10, 1, false);
	char path[4096];
	snprintf(path, sizeof(path), "%s/t", dir);
	struct zinf_io_file *f = NULL;
	cr_assert_eq(zinf_io_file_open(io, path, ZINF_IO_RDWR | ZINF_IO_CREATE, &f), -EINVAL);
	cr_assert_null(f);
	/* It names the three ways to ask for buffered I/O: the flag, swap's option, the CLI's. */
	const char *m = zinf_last_error();
	cr_assert(strstr(m, path) && strstr(m, "tmpfs") && strstr(m, "ZINF_IO_BUFFERED") &&
			  strstr(m, "zinf_swap_opts.buffered") && strstr(m, "--buffered"),
		  "%s", m);
	f = file_open(io, dir, "t", ZINF_IO_BUFFERED);
	char w[10000], r[10000];
	zt_rand_fill(w, sizeof(w), &rng);
	cr_assert_eq(zinf_io_pwrite(io, f, w, sizeof(w), 3), 0);
	cr_assert_eq(zinf_io_pread(io, f, r, sizeof(r), 3), 0);
	cr_assert(memcmp(w, r, sizeof(w)) == 0);
	zinf_io_destroy(io);
	zt_rmtree(dir);
	free(dir);
}

static int io_error_lines;

static void
count_io_errors(void *ctx, enum zinf_log_level level, const char *file, int line, const char *func,
		const char *msg)
{
	if (level == ZINF_LOG_ERROR) {
		io_error_lines++;
		fprintf(stderr, "unexpected error line: %s\n", msg);
	}
}

/* ZINF_IO_DIRECT_OR_BUFFERED: direct on a disk file system, buffered on tmpfs, and no error
 * logged for the fallback the caller asked for. */
Test(nvme_io, direct_or_buffered_falls_back_silently)
{
	struct statfs sf;
	if (statfs("/dev/shm", &sf) != 0 || sf.f_type != TMPFS_MAGIC) {
		cr_skip_test("/dev/shm is not a tmpfs here");
	}
	char *shm = zt_mkdtemp("/dev/shm"), *disk = zt_mkdtemp(NULL);
	struct zinf_io *io = io_open(4, 64 << 10, 1, false);
	zinf_log_set_callback(count_io_errors, NULL);
	io_error_lines = 0;
	unsigned fl = ZINF_IO_RDWR | ZINF_IO_CREATE | ZINF_IO_DIRECT_OR_BUFFERED;
	struct zinf_io_file *a = file_open(io, shm, "t", fl);
	struct zinf_io_file *b = file_open(io, disk, "t", fl);
	cr_assert_not(zinf_io_file_direct(a), "tmpfs: buffered");
	cr_assert_eq(zinf_io_file_align(a), 1);
	cr_assert(zinf_io_file_direct(b), "ext4 scratch: direct");
	cr_assert_gt(zinf_io_file_align(b), 1);
	char w[5000] = {1, 2, 3}, r[5000];
	cr_assert_eq(zinf_io_pwrite(io, a, w, sizeof(w), 7), 0);
	cr_assert_eq(zinf_io_pread(io, a, r, sizeof(r), 7), 0);
	cr_assert(memcmp(w, r, sizeof(w)) == 0);
	cr_assert_eq(io_error_lines, 0);
	zinf_log_set_callback(NULL, NULL);
	zinf_io_destroy(io);
	zt_rmtree(shm);
	zt_rmtree(disk);
	free(shm);
	free(disk);
}

/*
 * The fault backend fails one block op: exactly that request fails with -EIO, the others
 * complete with the right bytes, and a failed write is never reported as written.
 */
Test(nvme_io, fault_fails_one_request)
{
	enum { NR = 12, LEN = 256 << 10 };
	uint64_t rng = zt_seed();
	char *dir = zt_mkdtemp(NULL);
	struct zinf_io *io = io_open(4, 64 << 10, 2, true);
	cr_assert_str_eq(zinf_io_backend(io), "fault");
	struct zinf_io_file *f = file_open(io, dir, "fault", 0);
	char *a = xalloc(NR * LEN), *b = xalloc(NR * LEN), *rd = xalloc(NR * LEN);
	zt_rand_fill(a, NR * LEN, &rng);
	zt_rand_fill(b, NR * LEN, &rng);
	cr_assert_eq(zinf_io_pwrite(io, f, a, NR * LEN, 0), 0);
	uint64_t w0 = zinf_io_fault_ops(io, ZINF_IO_WRITE);
	cr_assert_eq(w0, NR * LEN / (64 << 10));

	/* Overwrite a with b in NR requests; the 7th write op fails. */
	struct zinf_io_fault rule = {
		.kind = ZINF_IO_FAULT_FAIL, .op = ZINF_IO_WRITE, .nth = 7, .err = EIO};
	cr_assert_eq(zinf_io_fault_add(io, &rule), 0);
	struct zinf_io_req req[NR], *ptr[NR];
	for (int i = 0; i < NR; i++) {
		ptr[i] = &req[i];
		cr_assert_eq(
			zinf_io_write_async(io, &req[i], f, b + i * LEN, LEN, (uint64_t)i * LEN),
			0);
	}
	cr_assert_eq(zinf_io_wait_all(io, ptr, NR), -EIO);
	int failed = -1, nfailed = 0;
	for (int i = 0; i < NR; i++) {
		if (req[i].result < 0) {
			cr_assert_eq(req[i].result, -EIO);
			failed = i;
			nfailed++;
		} else {
			cr_assert_eq(req[i].result, LEN);
		}
	}
	cr_assert_eq(nfailed, 1);
	cr_assert_eq(zinf_io_fault_ops(io, ZINF_IO_WRITE) - w0, NR * LEN / (64 << 10));
	struct zinf_io_stats st = {.size = sizeof(st)};
	zinf_io_get_stats(io, &st);
	cr_assert_eq(st.errors, 1);
	/* Counted per block: the failed request's other blocks were written. */
	cr_assert_eq(st.bytes_written, 2 * (uint64_t)NR * LEN - (64 << 10));

	/* A failing read: the 3rd read op. Read everything back in NR requests. */
	rule = (struct zinf_io_fault){
		.kind = ZINF_IO_FAULT_FAIL, .op = ZINF_IO_READ, .nth = 3, .err = EIO};
	cr_assert_eq(zinf_io_fault_add(io, &rule), 0);
	for (int i = 0; i < NR; i++) {
		cr_assert_eq(
			zinf_io_read_async(io, &req[i], f, rd + i * LEN, LEN, (uint64_t)i * LEN),
			0);
	}
	cr_assert_eq(zinf_io_wait_all(io, ptr, NR), -EIO);
	nfailed = 0;
	for (int i = 0; i < NR; i++) {
		if (req[i].result < 0) {
			nfailed++;
			continue;
		}
		/* The failed write's request left its extent partly old, never fully new. */
		if (i == failed) {
			cr_assert(memcmp(rd + i * LEN, b + i * LEN, LEN) != 0);
		} else {
			cr_assert(memcmp(rd + i * LEN, b + i * LEN, LEN) == 0, "request %d", i);
		}
	}
	cr_assert_eq(nfailed, 1);
	zinf_io_destroy(io);
	zinf_free_aligned(a);
	zinf_free_aligned(b);
	zinf_free_aligned(rd);
	zt_rmtree(dir);
	free(dir);
}

/* Shortened ops are resubmitted for the remainder: data intact, short_retries counted. */
Test(nvme_io, fault_short_ops_resubmitted)
{
	enum { LEN = 1 << 20 };
	uint64_t rng = zt_seed();
	char *dir = zt_mkdtemp(NULL);
	struct zinf_io *io = io_open(4, 128 << 10, 1, true);
	struct zinf_io_file *f = file_open(io, dir, "short", 0);
	char *w = xalloc(LEN), *r = xalloc(LEN);
	zt_rand_fill(w, LEN, &rng);
	struct zinf_io_fault rule = {.kind = ZINF_IO_FAULT_SHORT,
				     .op = ZINF_IO_WRITE,
				     .nth = 2,
				     .count = 3,
				     .short_bytes = 5000};
	cr_assert_eq(zinf_io_fault_add(io, &rule), 0);
	rule.op = ZINF_IO_READ;
	rule.nth = 1;
	rule.count = 4;
	cr_assert_eq(zinf_io_fault_add(io, &rule), 0);
	cr_assert_eq(zinf_io_pwrite(io, f, w, LEN, 0), 0);
	struct zinf_io_stats st = {.size = sizeof(st)};
	zinf_io_get_stats(io, &st);
	cr_assert_eq(st.short_retries, 3);
	cr_assert_eq(zinf_io_fault_ops(io, ZINF_IO_WRITE), LEN / (128 << 10) + 3);
	cr_assert_eq(zinf_io_pread(io, f, r, LEN, 0), 0);
	cr_assert(memcmp(w, r, LEN) == 0);
	zinf_io_get_stats(io, &st);
	cr_assert_eq(st.short_retries, 7);
	cr_assert_eq(st.errors, 0);
	cr_assert_eq(st.bytes_read, LEN);
	zinf_io_destroy(io);
	zinf_free_aligned(w);
	zinf_free_aligned(r);
	zt_rmtree(dir);
	free(dir);
}

/* Waiting on a small request does not wait for a large one submitted before it. */
Test(nvme_io, wait_is_per_request)
{
	char *dir = zt_mkdtemp(NULL);
	struct zinf_io *io = io_open(1, 4096, 1, false);
	struct zinf_io_file *f = file_open(io, dir, "wait", 0);
	size_t big = 128 << 20; /* 32768 single-page ops through one worker at depth 1 */
	cr_assert_eq(ftruncate(zinf_io_file_fd(f), (off_t)big + 4096), 0);
	char *lb = xalloc(big), *sb = xalloc(4096);
	struct zinf_io_req large, small;
	struct counter c = {0};
	cr_assert_eq(zinf_io_read_async(io, &large, f, lb, big, 0), 0);
	cr_assert_eq(zinf_io_read_async(io, &small, f, sb, 4096, big), 0);
	cr_assert_eq(zinf_io_wait(io, &small), 0);
	cr_assert_eq(zinf_io_poll(io, &large), 0, "the large request finished first");
	cr_assert_eq(zinf_io_wait(io, &large), 0);
	cr_assert_eq(large.result, (int64_t)big);
	(void)c;
	zinf_io_destroy(io);
	zinf_free_aligned(lb);
	zinf_free_aligned(sb);
	zt_rmtree(dir);
	free(dir);
}

/* Option validation and backend names. */
Test(nvme_io, options)
{
	struct zinf_io_opts o;
	struct zinf_io *io = NULL;
	zinf_io_opts_init(&o);
	o.block_size = 3000;
	cr_assert_eq(zinf_io_create(&o, &io), -EINVAL);
	zinf_io_opts_init(&o);
	o.backend = "nosuch";
	cr_assert_eq(zinf_io_create(&o, &io), -EINVAL);
	cr_assert_null(io);
	io = io_open(0, 0, 0, false);
	zinf_io_get_opts(io, &o);
	cr_assert_eq(o.queue_depth, 32);
	cr_assert_eq(o.block_size, 1u << 20);
	cr_assert_eq(o.threads, 1);
	struct zinf_io_fault rule = {.kind = ZINF_IO_FAULT_FAIL, .op = -1, .nth = 1, .err = EIO};
	cr_assert_eq(zinf_io_fault_add(io, &rule), -EINVAL);
	zinf_io_destroy(io);
	zinf_io_destroy(NULL);
}

struct warn_capture {
	int warnings;
	char msg[512];
};

static void
capture_warn(void *ctx, enum zinf_log_level level, const char *file, int line, const char *func,
	     const char *msg)
{
	struct warn_capture *c = ctx;
	if (level == ZINF_LOG_WARN) {
		c->warnings++;
		snprintf(c->msg, sizeof(c->msg), "%s", msg);
	}
}

/* A backend the kernel refuses (EPERM, as under many containers' seccomp filters) is passed
 * over by the default choice with one warning that says why; asked for by name, -ENODEV. */
Test(nvme_io, refused_backend_falls_back_with_one_warning)
{
	const char *v = zt_variant() ? zt_variant() : "io_uring";
	if (strcmp(v, "psync") == 0) {
		cr_skip_test("psync is the last resort: nothing to fall back to");
	}
	struct warn_capture c = {0};
	struct zinf_io_opts o;
	struct zinf_io *io = NULL;
	zinf_io_opts_init(&o);
	o.backend = v;
	io = zt_io_open(&o);
	zinf_io_destroy(io);
	io = NULL;
	zinf_log_set_callback(capture_warn, &c);
	zinf_log_set_level(ZINF_LOG_WARN);
	io_test_refuse("io_uring", -EPERM);
	if (strcmp(v, "libaio") == 0) {
		io_test_refuse("libaio", -ENOSYS);
	}
	cr_assert_eq(zinf_io_create(&o, &io), -ENODEV);
	cr_assert_null(io);
	zinf_io_opts_init(&o);
	cr_assert_eq(zinf_io_create(&o, &io), 0);
	cr_assert_str_neq(zinf_io_backend(io), v);
	cr_assert_eq(c.warnings, 1, "%d warnings", c.warnings);
	cr_assert(strstr(c.msg, zinf_io_backend(io)), "%s", c.msg);
	/* A second context says nothing more. */
	struct zinf_io *io2 = NULL;
	cr_assert_eq(zinf_io_create(&o, &io2), 0);
	cr_assert_eq(c.warnings, 1, "%d warnings", c.warnings);
	zinf_io_destroy(io2);
	/* The warning names the first backend refused and why. */
	cr_assert(strstr(c.msg, "io_uring") && strstr(c.msg, "not permitted"), "%s", c.msg);
	zinf_io_destroy(io);
	io_test_refuse(NULL, 0);
}

/* Whether zinf_io_create(backend, fault_inner) answers `want` with `words` in its message. */
static void
assert_create_fails(const char *backend, const char *inner, int want, const char *words)
{
	struct zinf_io_opts o;
	struct zinf_io *io = NULL;
	zinf_io_opts_init(&o);
	o.backend = backend;
	o.fault_inner = inner;
	int rc = zinf_io_create(&o, &io);
	cr_assert_eq(rc, want, "%s over %s: %d, not %d: %s", backend, inner ? inner : "-", rc, want,
		     zinf_last_error());
	cr_assert_null(io);
	const char *m = zinf_last_error();
	cr_assert(strstr(m, inner ? inner : backend) && strstr(m, words), "%s", m);
}

/*
 * A named backend is absent (-ENODEV) only when it was not built or the kernel refuses it
 * (EPERM, ENOSYS); any other failure of its set-up keeps its errno and says what it was, so a
 * broken backend is an error and never looks like one this machine lacks (which tests skip).
 * Every variant, psync included, through the test hook that fails the backend's set-up.
 */
Test(nvme_io, named_backend_absent_only_when_not_built_or_refused)
{
	const char *v = zt_variant() ? zt_variant() : "psync";
	struct zinf_io_opts o;
	zinf_io_opts_init(&o);
	o.backend = v;
	zinf_io_destroy(zt_io_open(&o));
	io_test_refuse(v, -EPERM);
	assert_create_fails(v, NULL, -ENODEV, "refused by the kernel");
	assert_create_fails("fault", v, -ENODEV, "refused by the kernel");
	cr_assert(strstr(zinf_last_error(), strerror(EPERM)), "%s", zinf_last_error());
	io_test_refuse(NULL, 0);
	io_test_refuse(v, -ENOSYS);
	assert_create_fails(v, NULL, -ENODEV, "refused by the kernel");
	io_test_refuse(NULL, 0);
	io_test_refuse(v, -EIO);
	assert_create_fails(v, NULL, -EIO, strerror(EIO));
	assert_create_fails("fault", v, -EIO, "failed to start");
	io_test_refuse(NULL, 0);
	io_test_refuse(v, -EINVAL);
	assert_create_fails(v, NULL, -EINVAL, "failed to start");
	io_test_refuse(NULL, 0);
	io_test_refuse(v, -ENOMEM);
	assert_create_fails(v, NULL, -ENOMEM, strerror(ENOMEM));
	io_test_refuse(NULL, 0);
#if !ZINF_HAVE_LIBURING
	assert_create_fails("io_uring", NULL, -ENODEV, "not built");
#endif
#if !ZINF_HAVE_LIBAIO
	assert_create_fails("libaio", NULL, -ENODEV, "not built");
#endif
}

/* io_uring with a kernel submission thread (SQPOLL): same bytes. */
Test(nvme_io, sqpoll_round_trip)
{
	if (!zt_variant() || strcmp(zt_variant(), "io_uring") != 0) {
		cr_skip_test("SQPOLL is an io_uring option (variant %s)",
			     zt_variant() ? zt_variant() : "none");
	}
	uint64_t rng = zt_seed();
	struct zinf_io_opts o;
	struct zinf_io *io = NULL;
	zinf_io_opts_init(&o);
	o.backend = "io_uring";
	o.sqpoll = true;
	o.threads = 2;
	o.block_size = 128 << 10;
	io = zt_io_open(&o);
	char *dir = zt_mkdtemp(NULL);
	struct zinf_io_file *f = file_open(io, dir, "sq", 0);
	size_t n = 3 << 20;
	char *w = xalloc(n), *r = xalloc(n);
	zt_rand_fill(w, n, &rng);
	struct iovec iov = {r, n};
	cr_assert_eq(zinf_io_register_buffers(io, &iov, 1), 0);
	cr_assert_eq(zinf_io_pwrite(io, f, w, n, 4096), 0);
	cr_assert_eq(zinf_io_pread(io, f, r, n, 4096), 0);
	cr_assert(memcmp(w, r, n) == 0);
	zinf_io_destroy(io);
	zinf_free_aligned(w);
	zinf_free_aligned(r);
	zt_rmtree(dir);
	free(dir);
}

/* AnonHugePages (kB) of the mapping that starts at p, from /proc/self/smaps; -1 if not found. */
static long
anon_huge_kb(const void *p)
{
	FILE *fp = fopen("/proc/self/smaps", "r");
	char line[512];
	bool in = false;
	long kb = -1;
	while (fp && fgets(line, sizeof(line), fp)) {
		unsigned long lo, hi;
		if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2 &&
		    strchr(line, '-') < strchr(line, ' ')) {
			in = lo <= (uintptr_t)p && (uintptr_t)p < hi;
		} else if (in && sscanf(line, "AnonHugePages: %ld kB", &kb) == 1) {
			break;
		}
	}
	if (fp) {
		fclose(fp);
	}
	return kb;
}

/* zinf_alloc_huge (common/alloc.c): 2 MiB aligned, zeroed, huge pages, usable for I/O. Where
 * transparent huge pages are off the test skips: the pages could not be checked. */
Test(nvme_io, alloc_huge_pages)
{
	char thp[128] = "";
	FILE *fp = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
	if (fp) {
		if (!fgets(thp, sizeof(thp), fp)) {
			thp[0] = 0;
		}
		fclose(fp);
	}
	if (!thp[0] || strstr(thp, "[never]")) {
		cr_skip_test("transparent huge pages are off here (%s): huge pages not checked",
			     thp[0] ? thp : "no /sys/kernel/mm/transparent_hugepage/enabled");
	}
	uint64_t rng = zt_seed();
	size_t n = (8 << 20) + 4096;
	char *b = zinf_alloc_huge(n);
	cr_assert_not_null(b);
	cr_assert(ZINF_IS_ALIGNED((uintptr_t)b, 2u << 20));
	for (size_t i = 0; i < n; i += 4096) {
		cr_assert_eq(b[i], 0);
	}
	zt_rand_fill(b, n, &rng);
	/* Memory pressure may deny some; most of the 8 MiB should be huge. */
	long kb = anon_huge_kb(b);
	cr_assert(kb >= 4096, "AnonHugePages %ld kB for an 8 MiB buffer (THP: %s)", kb, thp);
	char *dir = zt_mkdtemp(NULL);
	struct zinf_io *io = io_open(8, 1 << 20, 1, false);
	struct zinf_io_file *f = file_open(io, dir, "hp", 0);
	char *r = zinf_alloc_huge(n);
	cr_assert_eq(zinf_io_pwrite(io, f, b, n, 0), 0);
	cr_assert_eq(zinf_io_pread(io, f, r, n, 0), 0);
	cr_assert(memcmp(b, r, n) == 0);
	zinf_io_destroy(io);
	zinf_free_huge(b, n);
	zinf_free_huge(r, n);
	zinf_free_huge(NULL, 0);
	cr_assert_null(zinf_alloc_huge(0));
	zt_rmtree(dir);
	free(dir);
}

/* Every allocation failing in turn: create and open fail with -ENOMEM and leak nothing
 * (ASan checks), or succeed and work. */
Test(nvme_io, allocation_failures_unwind)
{
	char *dir = zt_mkdtemp(NULL);
	char path[4096];
	snprintf(path, sizeof(path), "%s/oom", dir);
	const char *v = zt_variant();
	int failed = 0;
	for (long n = 1; n < 200; n++) {
		struct zinf_io_opts o;
		struct zinf_io *io = NULL;
		struct zinf_io_file *f = NULL;
		zinf_io_opts_init(&o);
		o.backend = v;
		o.threads = 2;
		o.queue_depth = 4;
		cr_assert_eq(zinf_io_submit(NULL, NULL), -EINVAL); /* the sentinel message */
		zc_test_alloc_fail_nth(n);
		int rc = zinf_io_create(&o, &io);
		if (rc == -ENODEV && zt_io_may_be_absent(v)) {
			zc_test_alloc_fail_nth(0);
			cr_skip_test("I/O backend %s absent here: %s", v, zinf_last_error());
		}
		if (rc == 0) {
			rc = zinf_io_file_open(io, path, ZINF_IO_RDWR | ZINF_IO_CREATE, &f);
			cr_assert(rc == 0 || rc == -ENOMEM, "open: %d", rc);
		} else {
			cr_assert_eq(rc, -ENOMEM, "create with allocation %ld failing: %d", n, rc);
			cr_assert_null(io);
		}
		zc_test_alloc_fail_nth(0);
		/* the failure says so itself: not an earlier, unrelated message (the sentinel) */
		cr_assert(rc == 0 || (!strstr(zinf_last_error(), "NULL request") &&
				      (strstr(zinf_last_error(), "out of memory") ||
				       strstr(zinf_last_error(), strerror(ENOMEM)))),
			  "allocation %ld: %s", n, zinf_last_error());
		if (rc < 0) {
			failed++;
		} else {
			char *b = zinf_alloc_huge(4096);
			cr_assert_eq(zinf_io_pwrite(io, f, b, 4096, 0), 0);
			zinf_free_huge(b, 4096);
		}
		zinf_io_destroy(io);
		if (rc == 0 && failed > 0) {
			break; /* past the last allocation */
		}
	}
	cr_assert(failed >= 5, "only %d allocations could fail", failed);
	zt_rmtree(dir);
	free(dir);
}

/* More files than the registered-file table holds: the rest go by descriptor, and destroy
 * closes them all (ASan's leak check would see one it missed). */
Test(nvme_io, more_files_than_the_fixed_table)
{
	struct rlimit rl;
	cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	if (rl.rlim_cur < 1200) {
		rl.rlim_cur = rl.rlim_max < 1200 ? rl.rlim_max : 1200;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	if (rl.rlim_cur < 1200) {
		cr_skip_test("RLIMIT_NOFILE %llu < 1200", (unsigned long long)rl.rlim_cur);
	}
	uint64_t rng = zt_seed();
	char *dir = zt_mkdtemp(NULL);
	struct zinf_io *io = io_open(4, 64 << 10, 2, false);
	enum { NF = 1040 };
	struct zinf_io_file **f = calloc(NF, sizeof(*f));
	for (int i = 0; i < NF; i++) {
		char name[32];
		snprintf(name, sizeof(name), "m%04d", i);
		f[i] = file_open(io, dir, name, 0);
	}
	char *w = xalloc(64 << 10), *r = xalloc(64 << 10);
	for (int i = 0; i < NF; i += 37) {
		zt_rand_fill(w, 64 << 10, &rng);
		cr_assert_eq(zinf_io_pwrite(io, f[i], w, 64 << 10, 0), 0);
		cr_assert_eq(zinf_io_pread(io, f[i], r, 64 << 10, 0), 0);
		cr_assert(memcmp(w, r, 64 << 10) == 0, "file %d", i);
	}
	/* A slot freed by a close is reused by the next open, with the right file in it. */
	zinf_io_file_close(io, f[5]);
	f[5] = file_open(io, dir, "reuse", 0);
	zt_rand_fill(w, 64 << 10, &rng);
	cr_assert_eq(zinf_io_pwrite(io, f[5], w, 64 << 10, 0), 0);
	cr_assert_eq(zinf_io_pread(io, f[6], r, 64 << 10, 0), -ENODATA); /* f[6] still empty */
	cr_assert_eq(zinf_io_pread(io, f[5], r, 64 << 10, 0), 0);
	cr_assert(memcmp(w, r, 64 << 10) == 0);
	zinf_io_destroy(io);
	free(f);
	zinf_free_aligned(w);
	zinf_free_aligned(r);
	zt_rmtree(dir);
	free(dir);
}

/* ---- queue depth while a worker sleeps ---------------------------------------------------- */

/* Blocks the context has handed to its backend and not yet reaped (the core's own count). */
static uint64_t
inflight_blocks(struct zinf_io *io)
{
	return __atomic_load_n(&io->inflight_blocks, __ATOMIC_ACQUIRE);
}

/* Wait (10 s at most) until `want` blocks are in flight; the count reached. */
static uint64_t
await_inflight(struct zinf_io *io, uint64_t want)
{
	uint64_t n = 0;
	for (int spin = 0; spin < 10000 && (n = inflight_blocks(io)) != want; spin++) {
		usleep(1000);
	}
	return n;
}

/*
 * The small-buffer cycling pattern (queue_depth buffers; submit; wait for one; resubmit it)
 * with requests that stay in flight until the test lets them finish: reads of a FIFO, which
 * io_uring parks in the kernel until bytes arrive. Every request submitted while the worker
 * sleeps in the backend with free slots must be in flight at once, not after the next
 * completion: after each resubmission all queue_depth blocks are in flight, although
 * nothing completes until the test writes the next chunk. Deterministic: no timing decides
 * the outcome (a lost wake-up leaves the count below queue_depth for good; the 10 s wait is
 * only a bound). Plain and fault-wrapped (the wrapper passes the wake-up through).
 */
static void
depth_refilled(bool fault)
{
	enum { Q = 8, CHUNK = 4096, CYCLES = 3 * Q };
	if (!zt_variant() || strcmp(zt_variant(), "io_uring") != 0) {
		cr_skip_test("needs requests that stay in flight until the test releases them "
			     "(FIFO reads parked by io_uring); %s would block in the submitting "
			     "thread on a FIFO",
			     zt_variant() ? zt_variant() : "(best)");
	}
	char *dir = zt_mkdtemp(NULL);
	char path[4096];
	snprintf(path, sizeof(path), "%s/fifo", dir);
	cr_assert_eq(mkfifo(path, 0600), 0, "mkfifo %s: %s", path, strerror(errno));
	struct zinf_io *io = io_open(Q, CHUNK, 1, fault);
	struct zinf_io_file *f = NULL;
	cr_assert_eq(zinf_io_file_open(io, path, ZINF_IO_RDWR | ZINF_IO_BUFFERED, &f), 0, "%s",
		     zinf_last_error());
	int wfd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
	cr_assert(wfd >= 0, "open %s for writing: %s", path, strerror(errno));
	struct zinf_io_req req[Q];
	uint64_t *buf[Q];
	for (int i = 0; i < Q; i++) {
		buf[i] = xalloc(CHUNK);
	}

	/* One request first, in flight with the worker asleep in the backend... */
	cr_assert_eq(zinf_io_read_async(io, &req[0], f, buf[0], CHUNK, 0), 0);
	cr_assert_eq(await_inflight(io, 1), 1);
	/* ...then the rest arrive while it sleeps: all of them must go in flight. */
	for (int i = 1; i < Q; i++) {
		cr_assert_eq(zinf_io_read_async(io, &req[i], f, buf[i], CHUNK, 0), 0);
	}
	uint64_t n = await_inflight(io, Q);
	cr_assert_eq(n, Q,
		     "%llu of %d blocks in flight: requests queued while the worker slept "
		     "waited for a completion",
		     (unsigned long long)n, Q);

	/* Cycle: release one chunk, find the request it completed, resubmit it. */
	uint64_t chunk[CHUNK / 8];
	bool seen[CYCLES] = {false};
	for (uint64_t c = 0; c < CYCLES; c++) {
		for (size_t k = 0; k < CHUNK / 8; k++) {
			chunk[k] = c;
		}
		cr_assert_eq(write(wfd, chunk, CHUNK), CHUNK);
		int done = -1;
		for (int spin = 0; spin < 10000 && done < 0; spin++) {
			for (int i = 0; i < Q && done < 0; i++) {
				done = zinf_io_poll(io, &req[i]) ? i : -1;
			}
			if (done < 0) {
				usleep(1000);
			}
		}
		cr_assert(done >= 0, "cycle %llu: no request completed", (unsigned long long)c);
		cr_assert_eq(zinf_io_wait(io, &req[done]), 0);
		cr_assert_eq(req[done].result, CHUNK);
		uint64_t stamp = buf[done][0];
		cr_assert(stamp <= c && !seen[stamp], "cycle %llu: chunk %llu read twice or early",
			  (unsigned long long)c, (unsigned long long)stamp);
		seen[stamp] = true;
		for (size_t k = 0; k < CHUNK / 8; k++) {
			cr_assert_eq(buf[done][k], stamp, "chunk %llu torn",
				     (unsigned long long)stamp);
		}
		cr_assert_eq(zinf_io_read_async(io, &req[done], f, buf[done], CHUNK, 0), 0);
		n = await_inflight(io, Q);
		cr_assert_eq(n, Q,
			     "cycle %llu: %llu of %d blocks in flight after the resubmission (it "
			     "waited for the next completion)",
			     (unsigned long long)c, (unsigned long long)n, Q);
	}
	struct zinf_io_stats st = {.size = sizeof(st)};
	zinf_io_get_stats(io, &st);
	cr_assert_eq(st.max_inflight, Q);

	/* Drain: one chunk per request still parked. */
	for (uint64_t c = 0; c < Q; c++) {
		cr_assert_eq(write(wfd, chunk, CHUNK), CHUNK);
	}
	for (int i = 0; i < Q; i++) {
		cr_assert_eq(zinf_io_wait(io, &req[i]), 0);
		zinf_free_aligned(buf[i]);
	}
	close(wfd);
	zinf_io_destroy(io);
	zt_rmtree(dir);
	free(dir);
}

Test(nvme_io, depth_refilled_while_worker_sleeps)
{
	depth_refilled(false);
}

Test(nvme_io, depth_refilled_while_worker_sleeps_fault)
{
	depth_refilled(true);
}

/* ---- a waiting worker sleeps -------------------------------------------------------------- */

static double
cpu_seconds(void)
{
	struct rusage ru;
	cr_assert_eq(getrusage(RUSAGE_SELF, &ru), 0);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/*
 * While blocks are in flight and the caller waits, the workers sleep in their backend: the
 * process burns little CPU over a large O_DIRECT read. Plain and fault-wrapped: the wrapper
 * must leave its inner backend able to block (libaio waits only for what the kernel holds,
 * counted from the worker's blocks in flight). A worker that polls instead uses a core for
 * the whole wait.
 */
static void
worker_sleeps(bool fault)
{
	enum { BS = 32 << 20, Q = 2 };
	const size_t len = (size_t)256 << 20;
	char *dir = zt_mkdtemp(NULL);
	struct zinf_io *io = io_open(Q, BS, 1, fault);
	struct zinf_io_file *f = file_open(io, dir, "sleep", 0);
	char *buf = zinf_alloc_huge(len);
	cr_assert_not_null(buf);
	memset(buf, 0x5a, len);
	cr_assert_eq(zinf_io_pwrite(io, f, buf, len, 0), 0, "%s", zinf_last_error());
	cr_assert_eq(fdatasync(zinf_io_file_fd(f)), 0);
	double best = 1e9, wall_best = 0;
	for (int round = 0; round < 3; round++) {
		double t0 = zinf_now_s(), c0 = cpu_seconds();
		cr_assert_eq(zinf_io_pread(io, f, buf, len, 0), 0, "%s", zinf_last_error());
		double wall = zinf_now_s() - t0, cpu = cpu_seconds() - c0;
		if (cpu / wall < best) {
			best = cpu / wall;
			wall_best = wall;
		}
	}
	struct zinf_io_opts o;
	zinf_io_get_opts(io, &o);
	cr_log_info("%s%s: %.0f%% of a core over a %.3f s wait", fault ? "fault/" : "",
		    fault ? o.fault_inner : o.backend, 100 * best, wall_best);
	cr_assert(best < 0.25, "workers used %.0f%% of a core while waiting for the disk",
		  100 * best);
	zinf_io_destroy(io);
	zinf_free_huge(buf, len);
	zt_rmtree(dir);
	free(dir);
}

Test(nvme_io, worker_sleeps_while_waiting)
{
	worker_sleeps(false);
}

Test(nvme_io, worker_sleeps_while_waiting_fault)
{
	worker_sleeps(true);
}

/* ---- a submission refused during destroy -------------------------------------------------- */

struct resubmit {
	struct zinf_io *io;
	int rc;			   /* the resubmission's result */
	uint64_t reqs0, reqs1;	   /* stats.reqs around it */
	uint64_t blocks0, blocks1; /* stats.blocks around it */
};

/* Waits (on the worker) until zinf_io_destroy() has begun, then resubmits its request: that is
 * -ESHUTDOWN, nothing was submitted, so the statistics must not count it. */
static void
resubmit_done(struct zinf_io_req *r, void *arg)
{
	struct resubmit *s = arg;
	struct zinf_io_stats st = {.size = sizeof(st)};
	for (int i = 0; i < 10000 && !__atomic_load_n(&s->io->stopping, __ATOMIC_ACQUIRE); i++) {
		usleep(1000);
	}
	zinf_io_get_stats(s->io, &st);
	s->reqs0 = st.reqs;
	s->blocks0 = st.blocks;
	s->rc = zinf_io_submit(s->io, r);
	zinf_io_get_stats(s->io, &st);
	s->reqs1 = st.reqs;
	s->blocks1 = st.blocks;
}

Test(nvme_io, refused_submission_not_counted)
{
	char *dir = zt_mkdtemp(NULL);
	struct zinf_io *io = io_open(2, 64 << 10, 1, false);
	struct zinf_io_file *f = file_open(io, dir, "shut", 0);
	char *buf = xalloc(1 << 20);
	memset(buf, 7, 1 << 20);
	struct resubmit s = {.io = io, .rc = 1};
	struct zinf_io_req r = {.op = ZINF_IO_WRITE,
				.file = f,
				.buf = buf,
				.len = 1 << 20,
				.offset = 0,
				.done = resubmit_done,
				.arg = &s};
	cr_assert_eq(zinf_io_submit(io, &r), 0);
	zinf_io_destroy(io); /* its callback resubmits while the context stops */
	cr_assert_eq(s.rc, -ESHUTDOWN);
	cr_assert_eq(s.reqs1, s.reqs0, "a refused request counted in stats.reqs");
	cr_assert_eq(s.blocks1, s.blocks0, "a refused request counted in stats.blocks");
	zinf_free_aligned(buf);
	zt_rmtree(dir);
	free(dir);
}

/* An offset past what a file offset (off_t, signed 64-bit) can hold is refused at submission,
 * before anything is queued, like any other bad argument. */
Test(nvme_io, offset_beyond_off_t_is_einval_before_submission)
{
	char *dir = zt_mkdtemp(NULL);
	struct zinf_io *io = io_open(4, 64 << 10, 1, false);
	struct zinf_io_file *f = file_open(io, dir, "big", 0);
	uint32_t a = zinf_io_file_align(f);
	char *buf = xalloc(1 << 20);
	struct zinf_io_req r;
	uint64_t top = (uint64_t)INT64_MAX + 1; /* aligned to any power of two up to 2^63 */
	cr_assert_eq(zinf_io_write_async(io, &r, f, buf, a, top), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "offset") != NULL, "%s", zinf_last_error());
	cr_assert_eq(zinf_io_read_async(io, &r, f, buf, a, top - a), -EINVAL);
	struct zinf_io_stats st = {.size = sizeof(st)};
	zinf_io_get_stats(io, &st);
	cr_assert_eq(st.reqs, 0);
	cr_assert_eq(st.errors, 0);
	/*
	 * The last aligned block below the limit is a valid request: it is submitted (counted)
	 * and reaches the kernel, which finds no data there (the file is empty, and the offset is
	 * past the largest file ext4 holds): 0 bytes, which is -ENODATA for a read, with the
	 * error counted. A refusal at submission (-EINVAL, nothing counted) would fail here.
	 */
	uint64_t last = ((uint64_t)INT64_MAX - (1 << 20)) / (1 << 20) * (1 << 20);
	int rc = zinf_io_pread(io, f, buf, a, last);
	cr_assert_eq(rc, -ENODATA, "read at %llu: %d %s", (unsigned long long)last, rc,
		     zinf_last_error());
	zinf_io_get_stats(io, &st);
	cr_assert_eq(st.reqs, 1);
	cr_assert_eq(st.errors, 1);
	zinf_io_destroy(io);
	zinf_free_aligned(buf);
	zt_rmtree(dir);
	free(dir);
}

/* ---- refused requests, NULL handles, wrap-around ------------------------------------------- */

/* A request whose submission was refused is complete with that error: waiting on it returns
 * the error at once (it used to wait forever on a futex word nobody would change). */
Test(nvme_io, wait_on_refused_request_returns_its_error)
{
	char *dir = zt_mkdtemp(NULL);
	struct zinf_io *io = io_open(4, 64 << 10, 1, false);
	struct zinf_io_file *f = file_open(io, dir, "ref", 0);
	uint32_t a = zinf_io_file_align(f);
	char *buf = xalloc(1 << 20);
	struct zinf_io_req r;
	memset(&r, 0xab, sizeof(r)); /* whatever the caller's stack held */
	cr_assert_eq(zinf_io_write_async(io, &r, f, buf + a / 2, a, 0), -EINVAL);
	cr_assert_eq(zinf_io_poll(io, &r), 1);
	cr_assert_eq(zinf_io_wait(io, &r), -EINVAL);
	cr_assert_eq(r.result, -EINVAL);
	/* The same for a refusal of another kind: a write to a read-only file. */
	char path[4096];
	snprintf(path, sizeof(path), "%s/ref", dir);
	struct zinf_io_file *ro = NULL;
	cr_assert_eq(zinf_io_file_open(io, path, ZINF_IO_RDONLY, &ro), 0);
	memset(&r, 0xcd, sizeof(r));
	cr_assert_eq(zinf_io_write_async(io, &r, ro, buf, a, 0), -EBADF);
	cr_assert_eq(zinf_io_wait(io, &r), -EBADF);
	struct zinf_io_req *rs[] = {&r};
	cr_assert_eq(zinf_io_wait_all(io, rs, 1), -EBADF);
	struct zinf_io_stats st = {.size = sizeof(st)};
	cr_assert_eq(zinf_io_get_stats(io, &st), 0);
	cr_assert_eq(st.reqs, 0, "refused requests are not counted");
	zinf_io_destroy(io);
	zinf_free_aligned(buf);
	zt_rmtree(dir);
	free(dir);
}

/* Every public function given a NULL handle: -EINVAL with a message naming the function, or a
 * neutral value from a getter; never a crash. */
Test(nvme_io, null_handles_are_einval)
{
	char *dir = zt_mkdtemp(NULL);
	struct zinf_io *io = io_open(4, 64 << 10, 1, false);
	struct zinf_io_file *f = file_open(io, dir, "n", 0);
	char *buf = xalloc(4096);
	struct zinf_io_req r;
	memset(&r, 0, sizeof(r));

	cr_assert_eq(zinf_io_create(NULL, NULL), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "zinf_io_create"), "%s", zinf_last_error());
	cr_assert_eq(zinf_io_submit(io, NULL), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "NULL request"), "%s", zinf_last_error());
	cr_assert_eq(zinf_io_read_async(NULL, &r, f, buf, 4096, 0), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "NULL context"), "%s", zinf_last_error());
	cr_assert_eq(zinf_io_wait(NULL, &r), -EINVAL, "a refused request, waited on with NULL");
	cr_assert_eq(zinf_io_read_async(io, NULL, f, buf, 4096, 0), -EINVAL);
	cr_assert_eq(zinf_io_write_async(io, &r, NULL, buf, 4096, 0), -EINVAL);
	cr_assert_eq(zinf_io_pread(io, NULL, buf, 4096, 0), -EINVAL);
	cr_assert_eq(zinf_io_pwrite(NULL, f, buf, 4096, 0), -EINVAL);
	cr_assert_eq(zinf_io_wait(io, NULL), -EINVAL);
	cr_assert_eq(zinf_io_poll(io, NULL), -EINVAL);
	cr_assert_eq(zinf_io_wait_all(io, NULL, 2), -EINVAL);
	/* A request never submitted to this context (zeroed) is refused, not waited on. */
	struct zinf_io_req z;
	memset(&z, 0, sizeof(z));
	cr_assert_eq(zinf_io_wait(io, &z), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "not submitted to this context"), "%s",
		  zinf_last_error());
	struct zinf_io_file *g = NULL;
	cr_assert_eq(zinf_io_file_open(NULL, "/tmp/x", ZINF_IO_RDWR, &g), -EINVAL);
	cr_assert_eq(zinf_io_file_open(io, NULL, ZINF_IO_RDWR, &g), -EINVAL);
	cr_assert_eq(zinf_io_file_open(io, "/tmp/x", ZINF_IO_RDWR, NULL), -EINVAL);
	cr_assert_null(g);
	struct iovec iov = {buf, 4096};
	cr_assert_eq(zinf_io_register_buffers(NULL, &iov, 1), -EINVAL);
	cr_assert_eq(zinf_io_register_buffers(io, NULL, 1), -EINVAL);
	struct zinf_io_stats st = {.size = sizeof(st)};
	cr_assert_eq(zinf_io_get_stats(NULL, &st), -EINVAL);
	cr_assert_eq(zinf_io_get_stats(io, NULL), -EINVAL);
	struct zinf_io_fault rule = {.kind = ZINF_IO_FAULT_FAIL, .op = -1, .nth = 1, .err = EIO};
	cr_assert_eq(zinf_io_fault_add(NULL, &rule), -EINVAL);
	cr_assert_eq(zinf_io_fault_ops(NULL, 0), 0);
	/* Getters and void functions: a neutral value, no crash. */
	cr_assert_str_eq(zinf_io_backend(NULL), "");
	cr_assert_eq(zinf_io_buffers_registered(NULL), 0);
	cr_assert_not(zinf_io_file_direct(NULL));
	cr_assert_eq(zinf_io_file_align(NULL), 0);
	cr_assert_str_eq(zinf_io_file_path(NULL), "");
	cr_assert_eq(zinf_io_file_fd(NULL), -EBADF);
	struct zinf_io_opts o;
	zinf_io_get_opts(NULL, &o);
	cr_assert_eq(o.queue_depth, 32);
	zinf_io_get_opts(io, NULL);
	zinf_io_opts_init(NULL);
	zinf_io_file_close(io, NULL);
	zinf_io_file_close(NULL, f); /* closed through its own context, with a warning */
	zinf_io_destroy(io);
	zinf_free_aligned(buf);
	zt_rmtree(dir);
	free(dir);
}

/* Sizes that wrap: a buffer running off the end of the address space (in a request and in a
 * registration) and a fault rule past the op counter are refused with a message. */
Test(nvme_io, wrapping_sizes_are_refused)
{
	char *dir = zt_mkdtemp(NULL);
	struct zinf_io *io = io_open(4, 64 << 10, 1, true);
	struct zinf_io_file *f = file_open(io, dir, "w", ZINF_IO_BUFFERED);
	void *top = (void *)(UINTPTR_MAX - 4095); /* page-aligned, 4 KiB below the end */
	struct zinf_io_req r;
	cr_assert_eq(zinf_io_read_async(io, &r, f, top, 8192, 0), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "wraps the address space"), "%s", zinf_last_error());
	cr_assert_eq(zinf_io_wait(io, &r), -EINVAL);
	struct iovec iov = {top, 8192};
	cr_assert_eq(zinf_io_register_buffers(io, &iov, 1), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "wraps the address space"), "%s", zinf_last_error());
	struct zinf_io_fault rule = {
		.kind = ZINF_IO_FAULT_FAIL, .op = ZINF_IO_READ, .nth = UINT64_MAX, .err = EIO};
	cr_assert_eq(zinf_io_fault_add(io, &rule), 0, "the last op the counter reaches");
	rule.count = 2;
	cr_assert_eq(zinf_io_fault_add(io, &rule), -EOVERFLOW);
	cr_assert(strstr(zinf_last_error(), "wraps the op counter"), "%s", zinf_last_error());
	struct zinf_io_stats st = {.size = sizeof(st)};
	zinf_io_get_stats(io, &st);
	cr_assert_eq(st.reqs, 0);
	zinf_io_destroy(io);
	zt_rmtree(dir);
	free(dir);
}

/* Statistics follow the size rule: an older caller's smaller struct gets the fields it knows,
 * nothing past them; a size too small for the size field is -EINVAL. */
Test(nvme_io, stats_size_versioned)
{
	char *dir = zt_mkdtemp(NULL);
	struct zinf_io *io = io_open(4, 64 << 10, 1, false);
	struct zinf_io_file *f = file_open(io, dir, "s", 0);
	char *buf = xalloc(1 << 16);
	memset(buf, 5, 1 << 16);
	cr_assert_eq(zinf_io_pwrite(io, f, buf, 1 << 16, 0), 0);
	struct zinf_io_stats st;
	memset(&st, 0x77, sizeof(st));
	st.size = offsetof(struct zinf_io_stats, reqs); /* knows bytes_read and bytes_written */
	cr_assert_eq(zinf_io_get_stats(io, &st), 0);
	cr_assert_eq(st.size, offsetof(struct zinf_io_stats, reqs), "size left as the caller set");
	cr_assert_eq(st.bytes_written, 1 << 16);
	cr_assert_eq(st.bytes_read, 0);
	cr_assert_eq(st.reqs, 0x7777777777777777ull, "a field the caller does not know written");
	st.size = 4;
	cr_assert_eq(zinf_io_get_stats(io, &st), -EINVAL);
	st.size = sizeof(st);
	cr_assert_eq(zinf_io_get_stats(io, &st), 0);
	cr_assert_eq(st.reqs, 1);
	cr_assert_eq(st.blocks, 1);
	/* Options: a larger struct than the library's (a newer caller) is refused. */
	struct {
		struct zinf_io_opts o;
		char more[8];
	} big;
	memset(&big, 0, sizeof(big));
	zinf_io_opts_init(&big.o);
	big.o.size = sizeof(big);
	struct zinf_io *io2 = NULL;
	cr_assert_eq(zinf_io_create(&big.o, &io2), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "zinf_io_opts") && strstr(zinf_last_error(), "newer"),
		  "%s", zinf_last_error());
	zinf_io_destroy(io);
	zinf_free_aligned(buf);
	zt_rmtree(dir);
	free(dir);
}

static struct {
	int warnings, errors;
	char warn[1024];
} reg_log;

static void
capture_reg_log(void *ctx, enum zinf_log_level level, const char *file, int line, const char *func,
		const char *msg)
{
	if (level == ZINF_LOG_WARN) {
		reg_log.warnings++;
		snprintf(reg_log.warn, sizeof(reg_log.warn), "%s", msg);
	} else if (level == ZINF_LOG_ERROR) {
		reg_log.errors++;
	}
}

/*
 * Registration as a process without CAP_IPC_LOCK over RLIMIT_MEMLOCK (the capability dropped
 * with capset(2) in Criterion's forked test process, before the ring is made: io_uring decides
 * at setup whether to account pinned pages): the kernel refuses to pin the buffers, which is a
 * handled fallback: one WARN that says how to raise the limit, no ERROR, 0 returned,
 * zinf_io_buffers_registered() = 0, and I/O works with the buffers unregistered. As root the
 * same buffer registers (io_uring) or is not registered at all (libaio, psync).
 */
Test(nvme_io, registration_over_memlock_is_a_warning)
{
	char *dir = zt_mkdtemp(NULL);
	size_t n = 1 << 20;
	char *buf = zinf_alloc_huge(n);
	struct iovec iov = {buf, n};
	struct zinf_io *io = io_open(4, 64 << 10, 1, false);
	bool uring = strcmp(zinf_io_backend(io), "io_uring") == 0;
	cr_assert_eq(zinf_io_register_buffers(io, &iov, 1), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_io_buffers_registered(io), uring ? 1u : 0u);
	zinf_io_destroy(io);

	int rc = zt_drop_ipc_lock(64 << 10);
	cr_assert_eq(rc, 0, "dropping CAP_IPC_LOCK: %s", strerror(-rc));

	io = io_open(4, 64 << 10, 1, false);
	struct zinf_io_file *f = file_open(io, dir, "reg", 0);
	zinf_log_set_callback(capture_reg_log, NULL);
	memset(&reg_log, 0, sizeof(reg_log));
	cr_assert_eq(zinf_io_register_buffers(io, &iov, 1), 0, "%s", zinf_last_error());
	zinf_log_set_callback(NULL, NULL);
	cr_assert_eq(zinf_io_buffers_registered(io), 0);
	cr_assert_eq(reg_log.errors, 0, "a handled fallback logged an ERROR");
	if (uring) {
		cr_assert_eq(reg_log.warnings, 1, "one warning for the refusal");
		cr_assert(strstr(reg_log.warn, "io_uring I/O context") &&
				  strstr(reg_log.warn, "ulimit -l") &&
				  strstr(reg_log.warn, "RLIMIT_MEMLOCK") &&
				  strstr(reg_log.warn, "65536 bytes") &&
				  strstr(reg_log.warn, "1048576 bytes"),
			  "%s", reg_log.warn);
	} else {
		cr_assert_eq(reg_log.warnings, 0, "no registration to refuse: %s", reg_log.warn);
	}
	uint64_t rng = zt_seed();
	zt_rand_fill(buf, n, &rng);
	char *r = xalloc(n);
	cr_assert_eq(zinf_io_pwrite(io, f, buf, n, 0), 0);
	cr_assert_eq(zinf_io_pread(io, f, r, n, 0), 0);
	cr_assert(memcmp(buf, r, n) == 0);
	zinf_io_destroy(io);
	zinf_free_huge(buf, n);
	zinf_free_aligned(r);
	zt_rmtree(dir);
	free(dir);
}
