/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/nvme/test_swap.c: swap files through real files on the scratch file system (ext4,
 * O_DIRECT), once per I/O backend (ZINF_TEST_VARIANT: io_uring, libaio, psync; a backend the
 * machine lacks skips visibly): round trips of random tensors, the striped layout checked
 * byte by byte behind the engine's back, stable names, failing directories, too little space
 * (the free-space hook and RLIMIT_FSIZE), CRC mismatches, and failed writes (fault backend).
 * The CRC32C function itself is tested apart (test_crc.c), so that a variant whose backend is
 * absent has every test skipped and shows as skipped.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <linux/magic.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/test_util.h"
#include "common/util.h"
#include "nvme/swap_internal.h"
#include "zinf/blocks/swap.h"

static const char *
backend(void)
{
	const char *v = zt_variant();
	return v ? v : "psync";
}

/* An I/O context on the variant's backend (or "fault" wrapping it); skips only where io_uring or
 * libaio is absent (zt_io_open). */
static struct zinf_io *
open_io(bool fault)
{
	struct zinf_io_opts o;
	zinf_io_opts_init(&o);
	o.queue_depth = 16;
	o.block_size = 64 * 1024; /* small blocks: many per tensor */
	if (fault) {
		o.backend = "fault";
		o.fault_inner = backend();
	} else {
		o.backend = backend();
	}
	return zt_io_open(&o);
}

static struct zinf_swap *
open_swap(struct zinf_io *io, const char *const *dirs, unsigned n, uint64_t su, bool crc)
{
	struct zinf_swap_opts so;
	zinf_swap_opts_init(&so);
	so.dirs = dirs;
	so.n_dirs = n;
	so.stripe_unit = su;
	so.crc = crc;
	so.rank = 2;
	so.prefix = "t";
	struct zinf_swap *s = NULL;
	int ret = zinf_swap_create(io, &so, &s);
	cr_assert_eq(ret, 0, "zinf_swap_create: %d %s", ret, zinf_last_error());
	return s;
}

static void
init(void)
{
	zt_log_to_stderr();
	swap_test_set_free_bytes(UINT64_MAX);
}

TestSuite(swap, .init = init);

/* ---- round trips -------------------------------------------------------------------------- */

struct tens {
	int id;
	uint64_t bytes;
	unsigned char *data, *back;
};

static void
roundtrip(const char *const *dirs, unsigned n_dirs, uint64_t su, bool crc, int count,
	  uint64_t max_bytes)
{
	uint64_t st = zt_seed();
	struct zinf_io *io = open_io(false);
	struct zinf_swap *s = open_swap(io, dirs, n_dirs, su, crc);
	uint32_t al = zinf_swap_align(s);
	cr_assert(al >= 512 && ZINF_IS_POW2(al), "alignment %u", al);
	struct tens *t = calloc(count, sizeof(*t));
	const char *kinds[] = {"fp32", "exp_avg", "exp_avg_sq"};
	for (int i = 0; i < count; i++) {
		/* Sizes: tiny, a few aligned ones, most not a multiple of anything. */
		uint64_t b = zt_rand(&st) % max_bytes;
		if (i % 7 == 0) {
			b = ZINF_ALIGN_UP(b, al);
		}
		if (i == 1) {
			b = 1;
		}
		t[i].bytes = b;
		t[i].id = zinf_swap_add(s, kinds[i % 3], (uint32_t)(i / 3), b);
		cr_assert_eq(t[i].id, i, "add %d: %d", i, t[i].id);
	}
	int ret = zinf_swap_reserve(s);
	cr_assert_eq(ret, 0, "reserve: %d %s", ret, zinf_last_error());
	uint64_t total = 0;
	for (int i = 0; i < count; i++) {
		uint64_t cap = zinf_swap_buf_bytes(s, t[i].id);
		cr_assert_eq(cap, ZINF_ALIGN_UP(t[i].bytes, al));
		cr_assert_eq(zinf_swap_bytes(s, t[i].id), t[i].bytes);
		total += cap;
		t[i].data = zinf_alloc_aligned(al, cap ? cap : al);
		t[i].back = zinf_alloc_aligned(al, cap ? cap : al);
		zt_rand_fill(t[i].data, cap, &st); /* pad bytes too: the write must zero them */
		memset(t[i].back, 0xa5, cap);
	}
	cr_assert_eq(zinf_swap_total_bytes(s), total);

	/* All writes in flight together, then all reads. */
	struct zinf_swap_op *ops = calloc(count, sizeof(*ops));
	for (int i = 0; i < count; i++) {
		ret = zinf_swap_write_async(s, t[i].id, t[i].data, &ops[i]);
		cr_assert_eq(ret, 0, "write_async %d: %d %s", i, ret, zinf_last_error());
	}
	for (int i = 0; i < count; i++) {
		ret = (i % 2) ? zinf_swap_wait(s, &ops[i]) : 0;
		while (!(i % 2) && zinf_swap_poll(s, &ops[i]) == 0) {
			ret = 0;
		}
		cr_assert_eq(ret, 0, "write %d: %d %s", i, ret, zinf_last_error());
		cr_assert_eq(ops[i].result, 0, "write %d result %lld", i, (long long)ops[i].result);
		cr_assert_null(ops[i].reqs, "requests freed at completion");
	}
	for (int i = 0; i < count; i++) {
		ret = zinf_swap_read_async(s, t[i].id, t[i].back, &ops[i]);
		cr_assert_eq(ret, 0, "read_async %d: %d %s", i, ret, zinf_last_error());
	}
	for (int i = count - 1; i >= 0; i--) {
		ret = zinf_swap_wait(s, &ops[i]);
		cr_assert_eq(ret, 0, "read %d: %d %s", i, ret, zinf_last_error());
		cr_assert(memcmp(t[i].back, t[i].data, t[i].bytes) == 0, "tensor %d (%llu bytes)",
			  i, (unsigned long long)t[i].bytes);
		uint64_t cap = zinf_swap_buf_bytes(s, t[i].id);
		for (uint64_t k = t[i].bytes; k < cap; k++) {
			cr_assert_eq(t[i].back[k], 0, "pad byte %llu of tensor %d",
				     (unsigned long long)k, i);
		}
	}
	for (int i = 0; i < count; i++) {
		zinf_free_aligned(t[i].data);
		zinf_free_aligned(t[i].back);
	}
	free(ops);
	free(t);
	zinf_swap_destroy(s);
	zinf_io_destroy(io);
}

Test(swap, roundtrip_one_dir)
{
	char *d = zt_mkdtemp(NULL);
	const char *dirs[] = {d};
	roundtrip(dirs, 1, 0, false, 60, 3u << 20);
	zt_rmtree(d);
	free(d);
}

Test(swap, roundtrip_one_dir_crc)
{
	char *d = zt_mkdtemp(NULL);
	const char *dirs[] = {d};
	roundtrip(dirs, 1, 0, true, 30, 2u << 20);
	zt_rmtree(d);
	free(d);
}

Test(swap, roundtrip_three_dirs_crc)
{
	char *d[3] = {zt_mkdtemp(NULL), zt_mkdtemp(NULL), zt_mkdtemp(NULL)};
	roundtrip((const char *const *)d, 3, 64 * 1024, true, 40, 1u << 20);
	for (int i = 0; i < 3; i++) {
		zt_rmtree(d[i]);
		free(d[i]);
	}
}

/*
 * Striping: the layout recomputed here independently, and every byte of every tensor found
 * in the file and at the offset where RAID-0 puts it, read with plain pread. Two kinds,
 * declared interleaved; the first directory rotates per tensor (kind index + the kind's
 * earlier units), so tensors smaller than a stripe unit spread over all three directories.
 */
Test(swap, striping_three_dirs_layout)
{
	uint64_t st = zt_seed();
	char *d[3] = {zt_mkdtemp(NULL), zt_mkdtemp(NULL), zt_mkdtemp(NULL)};
	struct zinf_io *io = open_io(false);
	const uint64_t su = 128 * 1024;
	struct zinf_swap *s = open_swap(io, (const char *const *)d, 3, su, false);
	uint32_t al = zinf_swap_align(s);
	enum { N = 9, K = 2 };
	static const char *const kind[K] = {"param16", "exp_avg"};
	/* exp_avg: all smaller than a stripe unit (one unit each). */
	const uint64_t bytes[K][N] = {{5 * su + 1000, 3 * su, 100, su - 1, 7 * su + su / 2, 1,
				       2 * su + al, 0, 4 * su + 17},
				      {100, su / 2, 1, su - 1, 4096, 3000, su / 4, 7, su / 3}};
	unsigned char *data[K][N];
	for (int i = 0; i < N; i++) {
		for (int k = 0; k < K; k++) {
			cr_assert_eq(zinf_swap_add(s, kind[k], (uint32_t)i, bytes[k][i]),
				     i * K + k);
		}
	}
	cr_assert_eq(zinf_swap_reserve(s), 0, "%s", zinf_last_error());
	/* Expected layout: tensor (k, i) starts on dir0 = (k + units of kind k before it) % 3;
	 * its unit u -> dir (dir0 + u) % 3, packed per (kind, dir) in declaration order. */
	uint64_t fsize[K][3] = {{0}}, units[K] = {0};
	uint64_t ext[K][N][3];
	unsigned dir0[K][N], first_units[K][3] = {{0}};
	uint64_t total = 0;
	for (int i = 0; i < N; i++) {
		for (int k = 0; k < K; k++) {
			uint64_t cap = ZINF_ALIGN_UP(bytes[k][i], al);
			uint64_t per[3] = {0, 0, 0};
			dir0[k][i] = (unsigned)((k + units[k]) % 3);
			for (uint64_t u = 0; u * su < cap; u++) {
				per[(dir0[k][i] + u) % 3] += ZINF_MIN(su, cap - u * su);
			}
			if (cap) {
				first_units[k][dir0[k][i]]++;
			}
			units[k] += ZINF_DIV_ROUND_UP(cap, su);
			for (int j = 0; j < 3; j++) {
				ext[k][i][j] = fsize[k][j];
				fsize[k][j] += per[j];
				total += per[j];
			}
			data[k][i] = zinf_alloc_aligned(al, cap ? cap : al);
			zt_rand_fill(data[k][i], cap, &st);
			cr_assert_eq(zinf_swap_write(s, i * K + k, data[k][i]), 0,
				     "write %s[%d]: %s", kind[k], i, zinf_last_error());
		}
	}
	cr_assert_eq(zinf_swap_total_bytes(s), total);
	/* The small tensors went round the directories (not all to directory 0). */
	for (int j = 0; j < 3; j++) {
		cr_assert_eq(first_units[1][j], N / 3, "exp_avg: %u tensors start on dir %d",
			     first_units[1][j], j);
	}
	for (int k = 0; k < K; k++) {
		for (int j = 0; j < 3; j++) {
			char path[4096];
			snprintf(path, sizeof(path), "%s/t-r2-%s.%d.swp", d[j], kind[k], j);
			struct stat sb;
			cr_assert_eq(stat(path, &sb), 0, "%s missing", path);
			cr_assert_eq((uint64_t)sb.st_size, fsize[k][j],
				     "%s: size %lld, expected %llu", path, (long long)sb.st_size,
				     (unsigned long long)fsize[k][j]);
			cr_assert((uint64_t)sb.st_blocks * 512 >= fsize[k][j],
				  "%s not preallocated", path);
			int fd = open(path, O_RDONLY);
			cr_assert(fd >= 0);
			for (int i = 0; i < N; i++) {
				uint64_t cap = ZINF_ALIGN_UP(bytes[k][i], al);
				uint64_t b0 = bytes[k][i];
				/* Units u of this tensor in dir j: u = r, r + 3, ... */
				for (uint64_t u = (j + 3 - dir0[k][i]) % 3; u * su < cap; u += 3) {
					uint64_t len = ZINF_MIN(su, cap - u * su);
					uint64_t off = ext[k][i][j] + (u / 3) * su;
					unsigned char *b = malloc(len);
					cr_assert_eq(pread(fd, b, len, (off_t)off), (ssize_t)len);
					uint64_t cmp =
						u * su >= b0 ? 0 : ZINF_MIN(len, b0 - u * su);
					cr_assert(memcmp(b, data[k][i] + u * su, cmp) == 0,
						  "%s[%d] unit %llu not at %s:%llu", kind[k], i,
						  (unsigned long long)u, path,
						  (unsigned long long)off);
					for (uint64_t z = cmp; z < len; z++) {
						cr_assert_eq(b[z], 0, "pad of %s[%d]", kind[k], i);
					}
					free(b);
				}
			}
			close(fd);
		}
	}
	/* And through the swap: every tensor reads back exactly. */
	for (int i = 0; i < N; i++) {
		for (int k = 0; k < K; k++) {
			uint64_t cap = ZINF_ALIGN_UP(bytes[k][i], al);
			unsigned char *r = zinf_alloc_aligned(al, cap ? cap : al);
			cr_assert_eq(zinf_swap_read(s, i * K + k, r), 0, "%s", zinf_last_error());
			cr_assert(memcmp(r, data[k][i], bytes[k][i]) == 0, "%s[%d]", kind[k], i);
			zinf_free_aligned(r);
			zinf_free_aligned(data[k][i]);
		}
	}
	zinf_swap_destroy(s);
	zinf_io_destroy(io);
	for (int k = 0; k < 3; k++) {
		zt_rmtree(d[k]);
		free(d[k]);
	}
}

/* ---- names and directories ---------------------------------------------------------------- */

static bool
exists(const char *dir, const char *name)
{
	char p[4096];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return access(p, F_OK) == 0;
}

/* Entries of dir whose names match the grep pattern `re`. */
static int
count_matching(const char *dir, const char *re)
{
	char cmd[4200];
	snprintf(cmd, sizeof(cmd), "ls -A '%s' | grep -c '%s'", dir, re);
	FILE *f = popen(cmd, "r");
	int n = -1;
	cr_assert(f && fscanf(f, "%d", &n) == 1);
	pclose(f);
	return n;
}

static int
count_entries(const char *dir)
{
	return count_matching(dir, "");
}

/* Swap files (*.swp) in dir: the lock files a live swap space holds are not counted. */
static int
count_swp(const char *dir)
{
	return count_matching(dir, "\\.swp$");
}

static int swap_error_lines;

static void
count_swap_errors(void *ctx, enum zinf_log_level level, const char *file, int line,
		  const char *func, const char *msg)
{
	if (level == ZINF_LOG_ERROR) {
		swap_error_lines++;
		fprintf(stderr, "unexpected error line: %s\n", msg);
	}
}

/* tmpfs does no direct I/O: refused with a message naming the directory unless opts.buffered,
 * and then a round trip works with no error logged for the fallback that was asked for. */
Test(swap, tmpfs_refused_unless_buffered)
{
	struct statfs sf;
	if (statfs("/dev/shm", &sf) != 0 || sf.f_type != TMPFS_MAGIC) {
		cr_skip_test("/dev/shm is not a tmpfs here");
	}
	char *dir = zt_mkdtemp("/dev/shm");
	struct zinf_io *io = open_io(false);
	const char *dirs[1] = {dir};
	struct zinf_swap_opts so;
	zinf_swap_opts_init(&so);
	so.dirs = dirs;
	so.n_dirs = 1;
	struct zinf_swap *s = NULL;
	cr_assert_eq(zinf_swap_create(io, &so, &s), -EINVAL);
	cr_assert(strstr(zinf_last_error(), dir) && strstr(zinf_last_error(), "buffered"), "%s",
		  zinf_last_error());
	cr_assert_null(s);
	so.buffered = true;
	zinf_log_set_callback(count_swap_errors, NULL);
	swap_error_lines = 0;
	cr_assert_eq(zinf_swap_create(io, &so, &s), 0, "%s", zinf_last_error());
	int id = zinf_swap_add(s, "fp32", 0, 10001);
	cr_assert_geq(id, 0);
	cr_assert_eq(zinf_swap_reserve(s), 0, "%s", zinf_last_error());
	uint64_t cap = zinf_swap_buf_bytes(s, id);
	unsigned char *w = zinf_alloc_aligned(zinf_swap_align(s), cap);
	unsigned char *r = zinf_alloc_aligned(zinf_swap_align(s), cap);
	uint64_t st = zt_seed();
	zt_rand_fill(w, cap, &st);
	cr_assert_eq(zinf_swap_write(s, id, w), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_swap_read(s, id, r), 0, "%s", zinf_last_error());
	cr_assert(memcmp(w, r, 10001) == 0);
	cr_assert_eq(swap_error_lines, 0);
	zt_log_to_stderr();
	zinf_free_aligned(w);
	zinf_free_aligned(r);
	zinf_swap_destroy(s);
	zinf_io_destroy(io);
	zt_rmtree(dir);
	free(dir);
}

Test(swap, stable_names_and_cleanup)
{
	char *d = zt_mkdtemp(NULL);
	struct zinf_io *io = open_io(false);
	for (int keep = 0; keep < 2; keep++) {
		struct zinf_swap_opts so;
		zinf_swap_opts_init(&so);
		const char *dirs[] = {d};
		so.dirs = dirs;
		so.n_dirs = 1;
		so.rank = 7;
		so.prefix = "run";
		so.keep_files = keep;
		struct zinf_swap *s = NULL;
		cr_assert_eq(zinf_swap_create(io, &so, &s), 0, "%s", zinf_last_error());
		cr_assert_eq(count_entries(d), 1, "create leaves only its lock (probe removed)");
		cr_assert(exists(d, "run-r7.0.lock"));
		cr_assert_eq(zinf_swap_add(s, "exp_avg", 0, 10000), 0);
		cr_assert_eq(zinf_swap_add(s, "exp_avg", 1, 3), 1);
		cr_assert_eq(zinf_swap_add(s, "fp32", 0, 5), 2);
		cr_assert_eq(zinf_swap_add(s, "fp32", 0, 5), -EEXIST);
		cr_assert_eq(zinf_swap_add(s, "fp-32", 1, 5), -EINVAL);
		cr_assert_eq(zinf_swap_add(s, "", 1, 5), -EINVAL);
		cr_assert_eq(zinf_swap_find(s, "exp_avg", 1), 1);
		cr_assert_eq(zinf_swap_find(s, "fp32", 0), 2);
		cr_assert_eq(zinf_swap_find(s, "fp32", 1), -ENOENT);
		cr_assert_eq(zinf_swap_find(s, "m", 0), -ENOENT);
		unsigned char *b = zinf_alloc_aligned(4096, 16384);
		struct zinf_swap_op op;
		cr_assert_eq(zinf_swap_write_async(s, 0, b, &op), -EBUSY, "write before reserve");
		cr_assert_eq(zinf_swap_reserve(s), 0, "%s", zinf_last_error());
		cr_assert_eq(zinf_swap_add(s, "fp32", 9, 5), -EBUSY);
		cr_assert(exists(d, "run-r7-exp_avg.0.swp"));
		cr_assert(exists(d, "run-r7-fp32.0.swp"));
		cr_assert_eq(count_entries(d), 3);
		cr_assert_eq(zinf_swap_read(s, 1, b), -ENODATA, "read of a never-written tensor");
		uint32_t al = zinf_swap_align(s);
		cr_assert_eq(zinf_swap_write(s, 0, b + al / 2), -EINVAL, "misaligned buffer");
		cr_assert_eq(zinf_swap_write(s, 0, b), 0);
		cr_assert_eq(zinf_swap_read(s, 0, b), 0);
		zinf_swap_destroy(s);
		cr_assert_eq(exists(d, "run-r7-exp_avg.0.swp"), keep, "keep_files=%d", keep);
		cr_assert_eq(exists(d, "run-r7-fp32.0.swp"), keep);
		cr_assert_not(exists(d, "run-r7.0.lock"), "the lock goes with the swap space");
		zinf_free_aligned(b);
	}
	zinf_io_destroy(io);
	zt_rmtree(d);
	free(d);
}

static int
create_err(struct zinf_io *io, const char *dir)
{
	struct zinf_swap_opts so;
	zinf_swap_opts_init(&so);
	const char *dirs[] = {dir};
	so.dirs = dirs;
	so.n_dirs = 1;
	struct zinf_swap *s = NULL;
	int ret = zinf_swap_create(io, &so, &s);
	cr_assert_null(s, "no handle on failure");
	return ret;
}

Test(swap, missing_directory)
{
	char *d = zt_mkdtemp(NULL);
	struct zinf_io *io = open_io(false);
	char p[4096];
	snprintf(p, sizeof(p), "%s/not-there", d);
	cr_assert_eq(create_err(io, p), -ENOENT);
	cr_assert(strstr(zinf_last_error(), p), "message names the path: %s", zinf_last_error());
	zinf_io_destroy(io);
	zt_rmtree(d);
	free(d);
}

/*
 * An unwritable directory. The tests run as root, for whom mode 0500 changes nothing, so the
 * directory is made unusable another way: a path whose parent is a regular file (ENOTDIR),
 * and a regular file given as the directory.
 */
Test(swap, unusable_directory)
{
	char *d = zt_mkdtemp(NULL);
	struct zinf_io *io = open_io(false);
	char file[4096], sub[4200];
	snprintf(file, sizeof(file), "%s/plain", d);
	int fd = open(file, O_CREAT | O_WRONLY, 0600);
	cr_assert(fd >= 0);
	close(fd);
	snprintf(sub, sizeof(sub), "%s/dir", file);
	cr_assert_eq(create_err(io, sub), -ENOTDIR);
	cr_assert(strstr(zinf_last_error(), sub), "%s", zinf_last_error());
	cr_assert_eq(create_err(io, file), -ENOTDIR);
	cr_assert(strstr(zinf_last_error(), file), "%s", zinf_last_error());
	if (geteuid() != 0) {
		char ro[4096];
		snprintf(ro, sizeof(ro), "%s/ro", d);
		cr_assert_eq(mkdir(ro, 0500), 0);
		cr_assert_eq(create_err(io, ro), -EACCES);
	}
	zinf_io_destroy(io);
	zt_rmtree(d);
	free(d);
}

/*
 * zinf_swap_check_dir: the same checks as create's, without taking names: a scratch directory
 * passes and keeps nothing (its probe is removed); a file, a missing path and tmpfs (no O_DIRECT)
 * fail as create fails, naming the path; a read-only bind mount is -EROFS (where this process
 * may mount).
 */
Test(swap, check_dir_as_create_checks)
{
	char *d = zt_mkdtemp(NULL);
	struct zinf_io *io = open_io(false);
	char file[4096], missing[4096];
	snprintf(file, sizeof(file), "%s/plain", d);
	snprintf(missing, sizeof(missing), "%s/not-there", d);
	int fd = open(file, O_CREAT | O_WRONLY, 0600);
	cr_assert(fd >= 0);
	close(fd);
	cr_assert_eq(zinf_swap_check_dir(io, d, false), 0, "%s", zinf_last_error());
	DIR *dh = opendir(d);
	int n = 0;
	for (struct dirent *e; (e = readdir(dh));) {
		n += e->d_name[0] != '.';
		cr_expect(strstr(e->d_name, "probe") == NULL, "left behind: %s", e->d_name);
	}
	closedir(dh);
	cr_expect_eq(n, 1, "only the file made here");
	cr_assert_eq(zinf_swap_check_dir(io, file, false), create_err(io, file));
	cr_assert_eq(zinf_swap_check_dir(io, file, false), -ENOTDIR);
	cr_assert(strstr(zinf_last_error(), file), "%s", zinf_last_error());
	cr_assert_eq(zinf_swap_check_dir(io, missing, false), -ENOENT);
	cr_assert_eq(zinf_swap_check_dir(NULL, d, false), -EINVAL);
	struct statfs sf;
	if (statfs("/dev/shm", &sf) == 0 && sf.f_type == TMPFS_MAGIC) {
		char *shm = zt_mkdtemp("/dev/shm");
		cr_assert_eq(zinf_swap_check_dir(io, shm, false), -EINVAL);
		cr_assert(strstr(zinf_last_error(), shm), "%s", zinf_last_error());
		cr_assert_eq(zinf_swap_check_dir(io, shm, true), 0, "buffered allowed");
		zt_rmtree(shm);
		free(shm);
	}
	int rc = zt_readonly_bind(d);
	if (rc == 0) {
		cr_assert_eq(zinf_swap_check_dir(io, d, false), -EROFS);
		cr_assert(strstr(zinf_last_error(), "not writable"), "%s", zinf_last_error());
		zt_readonly_unbind(d);
	}
	zinf_io_destroy(io);
	zt_rmtree(d);
	free(d);
	if (rc) {
		cr_skip_test("read-only mount: %s (the rest passed)", strerror(-rc));
	}
}

/* ---- too little space --------------------------------------------------------------------- */

Test(swap, too_little_space_statvfs)
{
	char *d = zt_mkdtemp(NULL);
	struct zinf_io *io = open_io(false);
	const char *dirs[] = {d};
	struct zinf_swap *s = open_swap(io, dirs, 1, 0, false);
	cr_assert_eq(zinf_swap_add(s, "fp32", 0, 8u << 20), 0);
	cr_assert_eq(zinf_swap_add(s, "exp_avg", 0, 4u << 20), 1);
	swap_test_set_free_bytes(1u << 20);
	int ret = zinf_swap_reserve(s);
	swap_test_set_free_bytes(UINT64_MAX);
	cr_assert_eq(ret, -ENOSPC);
	const char *m = zinf_last_error();
	cr_assert(strstr(m, d) && strstr(m, "12582912") && strstr(m, "1048576"),
		  "message names path, bytes needed, bytes free: %s", m);
	cr_assert_eq(count_swp(d), 0, "nothing created before the check");
	/* The same declarations fit once there is room. */
	cr_assert_eq(zinf_swap_reserve(s), 0, "%s", zinf_last_error());
	unsigned char *b = zinf_alloc_aligned(4096, 8u << 20);
	memset(b, 1, 8u << 20);
	cr_assert_eq(zinf_swap_write(s, 0, b), 0);
	zinf_free_aligned(b);
	zinf_swap_destroy(s);
	zinf_io_destroy(io);
	zt_rmtree(d);
	free(d);
}

/*
 * The file size limit as the small disk: in a child process with RLIMIT_FSIZE = 1 MiB (and
 * SIGXFSZ ignored, else the kernel kills the process), fallocate fails with EFBIG.
 */
Test(swap, too_little_space_rlimit_fsize)
{
	char *d = zt_mkdtemp(NULL);
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		signal(SIGXFSZ, SIG_IGN);
		struct rlimit rl = {1u << 20, 1u << 20};
		setrlimit(RLIMIT_FSIZE, &rl);
		struct zinf_io_opts o;
		zinf_io_opts_init(&o);
		o.backend = backend();
		struct zinf_io *io = NULL;
		int rc = zinf_io_create(&o, &io);
		if (rc != 0) {
			_exit(rc == -ENODEV && zt_io_may_be_absent(backend()) ? 77 : 5);
		}
		struct zinf_swap_opts so;
		zinf_swap_opts_init(&so);
		const char *dirs[] = {d};
		so.dirs = dirs;
		so.n_dirs = 1;
		struct zinf_swap *s = NULL;
		if (zinf_swap_create(io, &so, &s) != 0) {
			_exit(2);
		}
		zinf_swap_add(s, "fp32", 0, 4u << 20);
		int ret = zinf_swap_reserve(s);
		const char *m = zinf_last_error();
		bool named = strstr(m, d) && strstr(m, "4194304") && strstr(m, "limit");
		zinf_swap_destroy(s);
		zinf_io_destroy(io);
		_exit(ret == -EFBIG ? (named ? 0 : 3) : 4);
	}
	int status = 0;
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	cr_assert(WIFEXITED(status), "child died of signal %d", WTERMSIG(status));
	if (WEXITSTATUS(status) == 77) {
		cr_skip_test("backend %s not available here", backend());
	}
	cr_assert_eq(WEXITSTATUS(status), 0,
		     "child: 2 create failed, 3 message lacks path/bytes, 4 not -EFBIG, "
		     "5 zinf_io_create failed");
	cr_assert_eq(count_entries(d), 0, "the failed reservation removed its file");
	zt_rmtree(d);
	free(d);
}

/* ---- corruption and failed writes --------------------------------------------------------- */

Test(swap, crc_mismatch_detected)
{
	uint64_t st = zt_seed();
	char *d[2] = {zt_mkdtemp(NULL), zt_mkdtemp(NULL)};
	for (unsigned nd = 1; nd <= 2; nd++) {
		struct zinf_io *io = open_io(false);
		struct zinf_swap *s = open_swap(io, (const char *const *)d, nd, 64 * 1024, true);
		uint32_t al = zinf_swap_align(s);
		uint64_t bytes = 300000;
		cr_assert_eq(zinf_swap_add(s, "exp_avg_sq", 3, 4096), 0);
		cr_assert_eq(zinf_swap_add(s, "exp_avg_sq", 4, bytes), 1);
		cr_assert_eq(zinf_swap_reserve(s), 0, "%s", zinf_last_error());
		uint64_t cap = zinf_swap_buf_bytes(s, 1);
		unsigned char *b = zinf_alloc_aligned(al, cap), *r = zinf_alloc_aligned(al, cap);
		zt_rand_fill(b, cap, &st);
		cr_assert_eq(zinf_swap_write(s, 0, b), 0);
		cr_assert_eq(zinf_swap_write(s, 1, b), 0);
		cr_assert_eq(zinf_swap_read(s, 1, r), 0, "clean read: %s", zinf_last_error());
		cr_assert(memcmp(r, b, bytes) == 0);
		/* Flip one byte of tensor 1 in the last file it uses, behind the engine's back. */
		char path[4096];
		unsigned fd_dir = nd - 1;
		snprintf(path, sizeof(path), "%s/t-r2-exp_avg_sq.%u.swp", d[fd_dir], fd_dir);
		int fd = open(path, O_RDWR);
		cr_assert(fd >= 0, "%s", path);
		/* Tensor 0 takes one aligned extent in dir 0 only; tensor 1 follows it there. */
		off_t off = (off_t)(nd == 1 ? 4096 + 12345 : 1000);
		unsigned char c;
		cr_assert_eq(pread(fd, &c, 1, off), 1);
		c ^= 0x40;
		cr_assert_eq(pwrite(fd, &c, 1, off), 1);
		fsync(fd);
		close(fd);
		memset(r, 0, cap);
		int ret = zinf_swap_read(s, 1, r);
		cr_assert_eq(ret, -EBADMSG, "corrupt read returned %d", ret);
		const char *m = zinf_last_error();
		cr_assert(strstr(m, "exp_avg_sq[4]") && strstr(m, path),
			  "message names tensor and file: %s", m);
		/* Tensor 0 was not touched and still reads. */
		cr_assert_eq(zinf_swap_read(s, 0, r), 0, "%s", zinf_last_error());
		cr_assert(memcmp(r, b, 4096) == 0);
		/* A new write replaces the data and the checksum. */
		cr_assert_eq(zinf_swap_write(s, 1, b), 0);
		cr_assert_eq(zinf_swap_read(s, 1, r), 0, "%s", zinf_last_error());
		cr_assert(memcmp(r, b, bytes) == 0);
		zinf_free_aligned(b);
		zinf_free_aligned(r);
		zinf_swap_destroy(s);
		zinf_io_destroy(io);
	}
	for (int k = 0; k < 2; k++) {
		zt_rmtree(d[k]);
		free(d[k]);
	}
}

Test(swap, failed_write_reads_enodata)
{
	uint64_t st = zt_seed();
	char *d[3] = {zt_mkdtemp(NULL), zt_mkdtemp(NULL), zt_mkdtemp(NULL)};
	struct zinf_io *io = open_io(true);
	struct zinf_swap *s = open_swap(io, (const char *const *)d, 3, 64 * 1024, false);
	uint32_t al = zinf_swap_align(s);
	uint64_t bytes = 1000000; /* 16 stripe units, 16 blocks of 64 KiB */
	cr_assert_eq(zinf_swap_add(s, "fp32", 0, bytes), 0);
	cr_assert_eq(zinf_swap_add(s, "fp32", 1, bytes), 1);
	cr_assert_eq(zinf_swap_reserve(s), 0, "%s", zinf_last_error());
	uint64_t cap = zinf_swap_buf_bytes(s, 0);
	unsigned char *a = zinf_alloc_aligned(al, cap), *b = zinf_alloc_aligned(al, cap);
	unsigned char *r = zinf_alloc_aligned(al, cap);
	zt_rand_fill(a, cap, &st);
	zt_rand_fill(b, cap, &st);
	/* Tensor 0 written once, then a rewrite whose 5th block fails. */
	cr_assert_eq(zinf_swap_write(s, 0, a), 0, "%s", zinf_last_error());
	struct zinf_io_fault f = {
		.kind = ZINF_IO_FAULT_FAIL, .op = ZINF_IO_WRITE, .nth = 5, .err = EIO};
	cr_assert_eq(zinf_io_fault_add(io, &f), 0);
	int ret = zinf_swap_write(s, 0, b);
	cr_assert_eq(ret, -EIO, "failed write returned %d", ret);
	cr_assert_eq(zinf_swap_read(s, 0, r), -ENODATA, "neither old nor torn data is returned");
	/* The other tensor is unaffected; a new write of tensor 0 makes it readable again. */
	cr_assert_eq(zinf_swap_write(s, 1, a), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_swap_read(s, 1, r), 0, "%s", zinf_last_error());
	cr_assert(memcmp(r, a, bytes) == 0);
	cr_assert_eq(zinf_swap_write(s, 0, b), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_swap_read(s, 0, r), 0, "%s", zinf_last_error());
	cr_assert(memcmp(r, b, bytes) == 0);
	/* A short write is resubmitted by the engine: the data arrives intact. */
	struct zinf_io_fault sh = {.kind = ZINF_IO_FAULT_SHORT,
				   .op = ZINF_IO_WRITE,
				   .nth = 2,
				   .count = 3,
				   .short_bytes = 8192};
	cr_assert_eq(zinf_io_fault_add(io, &sh), 0);
	cr_assert_eq(zinf_swap_write(s, 1, b), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_swap_read(s, 1, r), 0, "%s", zinf_last_error());
	cr_assert(memcmp(r, b, bytes) == 0);
	/* A failed read reports the error, and the tensor's data stays readable. */
	struct zinf_io_fault fr = {
		.kind = ZINF_IO_FAULT_FAIL, .op = ZINF_IO_READ, .nth = 1, .err = EIO};
	cr_assert_eq(zinf_io_fault_add(io, &fr), 0);
	cr_assert_eq(zinf_swap_read(s, 1, r), -EIO);
	cr_assert_eq(zinf_swap_read(s, 1, r), 0, "%s", zinf_last_error());
	cr_assert(memcmp(r, b, bytes) == 0);
	zinf_free_aligned(a);
	zinf_free_aligned(b);
	zinf_free_aligned(r);
	zinf_swap_destroy(s);
	zinf_io_destroy(io);
	for (int k = 0; k < 3; k++) {
		zt_rmtree(d[k]);
		free(d[k]);
	}
}

/* ---- out of memory ------------------------------------------------------------------------ */

/*
 * The n-th allocation fails, for every n that create, add, reserve, write and read make: each
 * call either succeeds or returns -ENOMEM and leaves nothing behind (ASan's leak check in CI),
 * and a failed reserve leaves no file.
 */
Test(swap, allocation_failures_unwind)
{
	char *d = zt_mkdtemp(NULL);
	struct zinf_io *io = open_io(false);
	const char *dirs[] = {d, d};
	bool completed = false;
	for (long n = 1; n < 200 && !completed; n++) {
		cr_assert_eq(zinf_swap_reserve(NULL), -EINVAL); /* the sentinel message */
		zc_test_alloc_fail_nth(n);
		struct zinf_swap_opts so;
		zinf_swap_opts_init(&so);
		so.dirs = dirs;
		so.n_dirs = 2;
		so.crc = true;
		struct zinf_swap *s = NULL;
		int ret = zinf_swap_create(io, &so, &s);
		if (ret == 0) {
			for (int i = 0; i < 70 && ret >= 0; i++) {
				ret = zinf_swap_add(s, i % 2 ? "m" : "v", (uint32_t)i, 5000 + i);
			}
			if (ret >= 0) {
				ret = zinf_swap_reserve(s);
				if (ret < 0) {
					cr_assert_eq(count_swp(d), 0, "n=%ld: files left", n);
				}
			}
			if (ret >= 0) {
				unsigned char *b = zinf_alloc_aligned(4096, 8192);
				if (!b) {
					ret = -ENOMEM;
				} else {
					memset(b, 3, 8192);
					ret = zinf_swap_write(s, 5, b);
					if (ret == 0) {
						memset(b, 0, 8192);
						ret = zinf_swap_read(s, 5, b);
						cr_assert(ret < 0 || b[4999] == 3, "n=%ld", n);
					}
					zinf_free_aligned(b);
				}
				completed = ret == 0;
			}
			zinf_swap_destroy(s);
		}
		zc_test_alloc_fail_nth(0);
		cr_assert(ret >= 0 || ret == -ENOMEM, "n=%ld: %d %s", n, ret, zinf_last_error());
		/* the failure says so itself: not an earlier, unrelated message (the sentinel) */
		cr_assert(ret >= 0 || (!strstr(zinf_last_error(), "NULL swap space") &&
				       (strstr(zinf_last_error(), "out of memory") ||
					strstr(zinf_last_error(), strerror(ENOMEM)))),
			  "n=%ld: %s", n, zinf_last_error());
		cr_assert_eq(count_entries(d), 0, "n=%ld: files left after destroy", n);
	}
	cr_assert(completed, "never ran to the end without a failure");
	zinf_io_destroy(io);
	zt_rmtree(d);
	free(d);
}

/* ---- ownership of the file names ---------------------------------------------------------- */

static struct zinf_swap *
try_swap(struct zinf_io *io, const char *dir, const char *prefix, int rank, int *ret)
{
	struct zinf_swap_opts so;
	zinf_swap_opts_init(&so);
	const char *dirs[] = {dir};
	so.dirs = dirs;
	so.n_dirs = 1;
	so.prefix = prefix;
	so.rank = rank;
	struct zinf_swap *s = NULL;
	*ret = zinf_swap_create(io, &so, &s);
	return s;
}

static struct {
	int warnings;
	char warn[1024];
} swap_log;

static void
capture_swap_warn(void *ctx, enum zinf_log_level level, const char *file, int line,
		  const char *func, const char *msg)
{
	if (level == ZINF_LOG_WARN) {
		swap_log.warnings++;
		snprintf(swap_log.warn, sizeof(swap_log.warn), "%s", msg);
	}
}

/*
 * Two swap spaces of one process on the same directory, prefix and rank: the second is refused
 * with -EBUSY naming the files and this process, and the first one's data is intact (the
 * second used to truncate its files). Another rank there is fine; once the first is destroyed
 * the names are free again.
 */
Test(swap, same_names_in_one_process_refused)
{
	char *d = zt_mkdtemp(NULL);
	struct zinf_io *io = open_io(false);
	int ret;
	struct zinf_swap *a = try_swap(io, d, "job", 0, &ret);
	cr_assert_eq(ret, 0, "%s", zinf_last_error());
	int id = zinf_swap_add(a, "fp32", 0, 1 << 20);
	cr_assert_eq(zinf_swap_reserve(a), 0, "%s", zinf_last_error());
	unsigned char *w = zinf_alloc_aligned(4096, 1 << 20),
		      *r = zinf_alloc_aligned(4096, 1 << 20);
	uint64_t rng = zt_seed();
	zt_rand_fill(w, 1 << 20, &rng);
	cr_assert_eq(zinf_swap_write(a, id, w), 0, "%s", zinf_last_error());

	struct zinf_swap *b = try_swap(io, d, "job", 0, &ret);
	cr_assert_eq(ret, -EBUSY);
	cr_assert_null(b);
	const char *m = zinf_last_error();
	char files[4200], pid[64];
	snprintf(files, sizeof(files), "%s/job-r0-*.0.swp", d);
	snprintf(pid, sizeof(pid), "this process, pid %d", (int)getpid());
	cr_assert(strstr(m, files) && strstr(m, pid) && strstr(m, "swap job-r0 in "), "%s", m);

	struct zinf_swap *c = try_swap(io, d, "job", 1, &ret);
	cr_assert_eq(ret, 0, "another rank: %s", zinf_last_error());
	zinf_swap_destroy(c);

	cr_assert_eq(zinf_swap_read(a, id, r), 0, "%s", zinf_last_error());
	cr_assert(memcmp(w, r, 1 << 20) == 0, "the refused swap space touched the files");
	zinf_swap_destroy(a);
	b = try_swap(io, d, "job", 0, &ret);
	cr_assert_eq(ret, 0, "names free again: %s", zinf_last_error());
	zinf_swap_destroy(b);
	cr_assert_eq(count_entries(d), 0);
	zinf_free_aligned(w);
	zinf_free_aligned(r);
	zinf_io_destroy(io);
	zt_rmtree(d);
	free(d);
}

/*
 * Another process holds the names: refused with its pid. Then it dies without destroying its
 * swap space (an abnormal exit): its file is left behind with no one holding the lock, and the
 * next swap space of those names reclaims it with one warning that names it and its size.
 */
Test(swap, other_process_then_its_leftovers)
{
	char *d = zt_mkdtemp(NULL);
	int ready[2], go[2];
	cr_assert_eq(pipe(ready), 0);
	cr_assert_eq(pipe(go), 0);
	pid_t child = fork();
	cr_assert_geq(child, 0);
	if (child == 0) {
		/* Only the parent's end of `go`: if the parent fails, the read sees EOF and the
		 * child exits, instead of waiting forever (and ctest with it). */
		close(go[1]);
		close(ready[0]);
		struct zinf_io_opts o;
		zinf_io_opts_init(&o);
		o.backend = "psync";
		struct zinf_io *io = NULL;
		int ret;
		char c = 'x';
		struct zinf_swap *s = NULL;
		if (zinf_io_create(&o, &io) == 0 && (s = try_swap(io, d, "job", 3, &ret)) &&
		    zinf_swap_add(s, "exp_avg", 0, 3 << 20) == 0 && zinf_swap_reserve(s) == 0) {
			c = 'r';
		}
		if (write(ready[1], &c, 1) != 1 || read(go[0], &c, 1) != 1) {
			_exit(2);
		}
		_exit(0); /* dies holding everything: no destroy */
	}
	close(ready[1]);
	close(go[0]);
	char c = 0;
	cr_assert_eq(read(ready[0], &c, 1), 1);
	cr_assert_eq(c, 'r', "the child could not set up its swap space");
	struct zinf_io *io = open_io(false);
	int ret;
	cr_assert_null(try_swap(io, d, "job", 3, &ret));
	cr_assert_eq(ret, -EBUSY);
	char who[64];
	snprintf(who, sizeof(who), "process %d;", (int)child);
	cr_assert(strstr(zinf_last_error(), who), "names the other pid: %s", zinf_last_error());
	cr_assert_eq(write(go[1], "g", 1), 1);
	close(go[1]);
	close(ready[0]);
	int status;
	cr_assert_eq(waitpid(child, &status, 0), child);
	cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
	cr_assert(exists(d, "job-r3-exp_avg.0.swp"), "the dead process's file is left");

	struct zinf_swap *s = try_swap(io, d, "job", 3, &ret);
	cr_assert_eq(ret, 0, "a dead process's lock is free: %s", zinf_last_error());
	cr_assert_eq(zinf_swap_add(s, "fp32", 0, 4096), 0);
	zinf_log_set_callback(capture_swap_warn, NULL);
	memset(&swap_log, 0, sizeof(swap_log));
	ret = zinf_swap_reserve(s);
	zt_log_to_stderr();
	cr_assert_eq(ret, 0, "%s", zinf_last_error());
	cr_assert_eq(swap_log.warnings, 1);
	char named[4200];
	snprintf(named, sizeof(named), "%s/job-r3-exp_avg.0.swp (3145728 bytes)", d);
	cr_assert(strstr(swap_log.warn, named) && strstr(swap_log.warn, "leftover"), "%s",
		  swap_log.warn);
	cr_assert_not(exists(d, "job-r3-exp_avg.0.swp"), "reclaimed");
	cr_assert(exists(d, "job-r3-fp32.0.swp"));
	zinf_swap_destroy(s);
	zinf_io_destroy(io);
	zt_rmtree(d);
	free(d);
}

/* Write a fake leftover of `bytes` allocated bytes. */
static void
leftover(const char *dir, const char *name, off_t bytes)
{
	char p[4200];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	int fd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0600);
	cr_assert_geq(fd, 0);
	cr_assert(bytes == 0 || fallocate(fd, 0, 0, bytes) == 0, "%s", strerror(errno));
	close(fd);
}

/*
 * The free-space check counts what leftovers of this swap space's names give back: 4 MiB needed,
 * 1 MiB free plus a 4 MiB leftover is enough (it used to be -ENOSPC); 8 MiB needed is not, and
 * the message says how much the leftovers would give. Files of other names stay untouched.
 */
Test(swap, leftover_space_counted)
{
	char *d = zt_mkdtemp(NULL);
	struct zinf_io *io = open_io(false);
	leftover(d, "t-r2-fp32.0.swp", 4 << 20);
	leftover(d, "t-r2-old_kind.0.swp", 0);
	leftover(d, "t-r3-fp32.0.swp", 4096);  /* another rank */
	leftover(d, "t-r2-fp32.1.swp", 4096);  /* another directory index */
	leftover(d, "tt-r2-fp32.0.swp", 4096); /* another prefix */
	const char *dirs[] = {d};
	struct zinf_swap *s = open_swap(io, dirs, 1, 0, false);
	cr_assert_eq(zinf_swap_add(s, "fp32", 0, 8 << 20), 0);
	swap_test_set_free_bytes(1 << 20);
	int ret = zinf_swap_reserve(s);
	cr_assert_eq(ret, -ENOSPC);
	cr_assert(strstr(zinf_last_error(), "+ 4194304 bytes in leftover files"), "%s",
		  zinf_last_error());
	cr_assert(exists(d, "t-r2-fp32.0.swp"), "a failed reserve removes nothing");
	zinf_swap_destroy(s);

	s = open_swap(io, dirs, 1, 0, false);
	cr_assert_eq(zinf_swap_add(s, "fp32", 0, 4 << 20), 0);
	zinf_log_set_callback(capture_swap_warn, NULL);
	memset(&swap_log, 0, sizeof(swap_log));
	ret = zinf_swap_reserve(s);
	zt_log_to_stderr();
	swap_test_set_free_bytes(UINT64_MAX);
	cr_assert_eq(ret, 0, "the leftover's 4 MiB count as free: %s", zinf_last_error());
	cr_assert_eq(swap_log.warnings, 1);
	cr_assert(strstr(swap_log.warn, "2 leftover") && strstr(swap_log.warn, "4194304 bytes") &&
			  strstr(swap_log.warn, "t-r2-old_kind.0.swp (0 bytes)"),
		  "%s", swap_log.warn);
	cr_assert_not(exists(d, "t-r2-old_kind.0.swp"));
	cr_assert(exists(d, "t-r3-fp32.0.swp") && exists(d, "t-r2-fp32.1.swp") &&
		  exists(d, "tt-r2-fp32.0.swp"));
	struct stat st;
	char p[4200];
	snprintf(p, sizeof(p), "%s/t-r2-fp32.0.swp", d);
	cr_assert_eq(stat(p, &st), 0);
	cr_assert_eq(st.st_size, 4 << 20);
	zinf_swap_destroy(s);
	zinf_io_destroy(io);
	zt_rmtree(d);
	free(d);
}

/* ---- NULL handles and sizes that wrap ----------------------------------------------------- */

Test(swap, null_handles_are_einval)
{
	char *d = zt_mkdtemp(NULL);
	struct zinf_io *io = open_io(false);
	const char *dirs[] = {d};
	struct zinf_swap_opts so;
	zinf_swap_opts_init(&so);
	so.dirs = dirs;
	so.n_dirs = 1;
	struct zinf_swap *s = NULL;
	cr_assert_eq(zinf_swap_create(NULL, &so, &s), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "zinf_swap_create: NULL I/O context"), "%s",
		  zinf_last_error());
	cr_assert_eq(zinf_swap_create(io, NULL, &s), -EINVAL);
	cr_assert_eq(zinf_swap_create(io, &so, NULL), -EINVAL);
	so.size = sizeof(so) + 8;
	cr_assert_eq(zinf_swap_create(io, &so, &s), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "zinf_swap_opts"), "%s", zinf_last_error());
	cr_assert_null(s);
	cr_assert_eq(zinf_swap_add(NULL, "fp32", 0, 4096), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "zinf_swap_add: NULL swap space"), "%s",
		  zinf_last_error());
	cr_assert_eq(zinf_swap_find(NULL, "fp32", 0), -EINVAL);
	cr_assert_eq(zinf_swap_reserve(NULL), -EINVAL);
	unsigned char *b = zinf_alloc_aligned(4096, 4096);
	struct zinf_swap_op op;
	cr_assert_eq(zinf_swap_write_async(NULL, 0, b, &op), -EINVAL);
	cr_assert_eq(zinf_swap_read(NULL, 0, b), -EINVAL);
	cr_assert_eq(zinf_swap_wait(NULL, &op), -EINVAL);
	cr_assert_eq(zinf_swap_poll(NULL, &op), -EINVAL);
	s = open_swap(io, dirs, 1, 0, false);
	cr_assert_eq(zinf_swap_add(s, NULL, 0, 4096), -EINVAL);
	cr_assert_eq(zinf_swap_write_async(s, 0, b, NULL), -EINVAL);
	cr_assert_eq(zinf_swap_wait(s, NULL), -EINVAL);
	cr_assert_eq(zinf_swap_poll(s, NULL), -EINVAL);
	/* A refused start leaves the operation complete with its error. */
	cr_assert_eq(zinf_swap_write_async(s, 0, b, &op), -EBUSY);
	cr_assert_eq(zinf_swap_wait(s, &op), -EBUSY);
	cr_assert_eq(zinf_swap_align(NULL), 0);
	cr_assert_eq(zinf_swap_bytes(NULL, 0), 0);
	cr_assert_eq(zinf_swap_buf_bytes(NULL, 0), 0);
	cr_assert_eq(zinf_swap_total_bytes(NULL), 0);
	zinf_swap_opts_init(NULL);
	zinf_swap_destroy(NULL);
	zinf_swap_destroy(s);
	zinf_free_aligned(b);
	zinf_io_destroy(io);
	zt_rmtree(d);
	free(d);
}

/*
 * Sizes that wrap or pass the largest file offset: a tensor of elements x element size that
 * wrapped ((2^62 - 1) x 4 = 2^64 - 4: -EOVERFLOW at add, naming it; padding it to the
 * alignment used to wrap to 0), a kind's file past 2^63 - 1 and more stripe units than requests
 * can count (-EOVERFLOW at reserve, before any file is created).
 */
Test(swap, sizes_that_wrap_are_refused)
{
	char *d = zt_mkdtemp(NULL);
	struct zinf_io *io = open_io(false);
	const char *one[] = {d}, *two[] = {d, d};
	struct zinf_swap *s = open_swap(io, one, 1, 0, false);
	uint64_t al = zinf_swap_align(s);
	uint64_t elems = (1ull << 62) - 1;
	cr_assert_eq(zinf_swap_add(s, "fp32", 7, elems * 4), -EOVERFLOW);
	cr_assert(strstr(zinf_last_error(), "fp32[7]: 18446744073709551612 bytes") &&
			  strstr(zinf_last_error(), "swap t-r2 in "),
		  "%s", zinf_last_error());
	cr_assert_eq(zinf_swap_add(s, "fp32", 7, (uint64_t)INT64_MAX), -EOVERFLOW,
		     "INT64_MAX pads past INT64_MAX");
	uint64_t most = (uint64_t)INT64_MAX / al * al;
	cr_assert_eq(zinf_swap_add(s, "fp32", 7, most), 0, "the largest that fits one file");
	cr_assert_eq(zinf_swap_add(s, "fp32", 8, most), 1);
	cr_assert_eq(zinf_swap_total_bytes(s), 2 * most, "no wrap below 2^64");
	cr_assert_eq(zinf_swap_reserve(s), -EOVERFLOW);
	cr_assert(strstr(zinf_last_error(), "fp32[8]: the fp32 file in") &&
			  strstr(zinf_last_error(), "largest file offset"),
		  "%s", zinf_last_error());
	cr_assert_eq(count_swp(d), 0);
	zinf_swap_destroy(s);

	s = open_swap(io, two, 2, al, false);
	cr_assert_eq(zinf_swap_add(s, "m", 0, al << 32), 0);
	cr_assert_eq(zinf_swap_reserve(s), -EOVERFLOW);
	cr_assert(strstr(zinf_last_error(), "m[0]: 4294967296 stripe units") &&
			  strstr(zinf_last_error(), "larger stripe unit"),
		  "%s", zinf_last_error());
	cr_assert_eq(count_swp(d), 0);
	zinf_swap_destroy(s);
	zinf_io_destroy(io);
	zt_rmtree(d);
	free(d);
}
