/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/ckpt/test_ckpt_read.c: the offline reader (zinf_ckpt_open/read/verify) on the
 * hand-written checkpoint of ckpt_fixture.c: the manifest's values; every parameter and part
 * read whole and in random ranges (crossing the boundary between the stored ranks) equal to the
 * known values; bf16/f16 conversion against a rounding worked in double and by hand; bf16 state
 * widened; files_world 1 (stage 0); DIR/latest, an explicit tag and the TAG directory itself;
 * the CRC check of every file, then one corrupted byte; truncated, missing and unlisted files;
 * malformed manifests, each refusal naming the field; partitions that overlap or leave a hole
 * in a rank's files, refused naming both parameters and the rank; the manifest's size bound
 * (directory entries shorter than a rank file's name not read past their end) and the count of
 * "params" bounded by its text before anything is allocated for it; unknown keys
 * ignored; fewer descriptors than files (the fixture's, and a hand-made checkpoint of 300 ranks
 * read, verified and exported under a limit of 64).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "ckpt/ckpt_fixture.h"
#include "ckpt/ckpt_internal.h"
#include "common/test_util.h"
#include "zinf/checkpoint.h"
#include "zinf/blocks/swap.h"

ZT_TMPDIR_SUITE(ckpt_read);

static struct zinf_ckpt *
fx_open(const struct fx_opts *o)
{
	fx_write(dir, "step120", o);
	struct zinf_ckpt *c = NULL;
	int rc = zinf_ckpt_open(dir, NULL, &c);
	cr_assert_eq(rc, 0, "open: %d %s", rc, zinf_last_error());
	return c;
}

static struct zinf_ckpt *
fx_open_default(void)
{
	struct fx_opts o;
	fx_opts_init(&o);
	return fx_open(&o);
}

/* Read parameter i, part p, [first, +count) as f32 and compare with the known values
 * (rounded to bf16 where the state is bf16). */
static void
check_range(struct zinf_ckpt *c, int i, int p, uint64_t first, uint64_t count, bool bf16)
{
	float *v = malloc((count ? count : 1) * sizeof(float));
	cr_assert_not_null(v);
	int rc = zinf_ckpt_read(c, (uint32_t)i, (uint32_t)p, first, count, ZINF_F32, v);
	cr_assert_eq(rc, 0, "read %d/%d [%lu, +%lu]: %d %s", i, p, (unsigned long)first,
		     (unsigned long)count, rc, zinf_last_error());
	for (uint64_t k = 0; k < count; k++) {
		double want = fx_value(i, p, first + k);
		if (bf16) {
			int e;
			frexp(want, &e);
			double sp = ldexp(1.0, e - 8);
			want = nearbyint(want / sp) * sp;
		}
		if ((double)v[k] != want) {
			cr_assert_fail("param %d part %d element %lu: %.9g, expected %.9g", i, p,
				       (unsigned long)(first + k), (double)v[k], want);
		}
	}
	free(v);
}

Test(ckpt_read, info_params_parts_files)
{
	struct zinf_ckpt *c = fx_open_default();
	struct zinf_ckpt_info in = {.size = sizeof(in)};
	cr_assert_eq(zinf_ckpt_get_info(c, &in), 0);
	cr_expect_str_eq(in.tag, "step120");
	cr_expect_eq(in.steps, 120);
	cr_expect_eq(in.micro_steps, 480);
	cr_expect_eq(in.world, 2);
	cr_expect_eq(in.stage, 3);
	cr_expect_eq(in.dtype, ZINF_BF16);
	cr_expect_eq(in.n_params, 3);
	cr_expect_eq(in.n_parts, 3);
	cr_expect_eq(in.n_files, 7); /* 2 ranks x 3 parts + client.bin */
	cr_expect_str_eq(in.optimizer, "adamw");
	cr_expect(strstr(in.path, "step120") != NULL);
	/* rank 0: partitions at 0, 150001, 150002 (part 150001, 1, 6); rank 1 in reverse: 7, 6,
	   0; both tile flat 150008 elements */
	struct zinf_ckpt_file f = {.size = sizeof(f)};
	uint64_t total = 0;
	for (uint32_t k = 0; k < zinf_ckpt_file_count(c); k++) {
		cr_assert_eq(zinf_ckpt_file(c, k, &f), 0);
		total += f.bytes;
		if (strcmp(f.name, "r00001.exp_avg") == 0) {
			cr_expect_eq(f.bytes, 150008 * 4);
		}
	}
	cr_expect_eq(total, 6 * 150008 * 4 + 16);
	cr_expect_eq(in.bytes, total);
	for (int i = 0; i < FX_PARAMS; i++) {
		struct zinf_ckpt_param p = {.size = sizeof(p)};
		cr_assert_eq(zinf_ckpt_param(c, (uint32_t)i, &p), 0);
		cr_expect_str_eq(p.name, fx_name[i]);
		cr_expect_eq(p.numel, fx_numel[i]);
		cr_expect_eq(p.layer, i);
		cr_expect_eq(p.ndim, fx_ndim[i]);
		for (uint32_t d = 0; d < p.ndim; d++) {
			cr_expect_eq(p.shape[d], fx_shape[i][d], "param %d dim %u", i, d);
		}
	}
	for (int p = 0; p < FX_PARTS; p++) {
		struct zinf_ckpt_part q = {.size = sizeof(q)};
		cr_assert_eq(zinf_ckpt_part(c, (uint32_t)p, &q), 0);
		cr_expect_str_eq(q.name, fx_part[p]);
		cr_expect_eq(q.dtype, ZINF_F32);
	}
	struct zinf_ckpt_param p = {.size = sizeof(p)};
	cr_expect_eq(zinf_ckpt_param(c, 3, &p), -EINVAL);
	struct zinf_ckpt_part q = {.size = sizeof(q)};
	cr_expect_eq(zinf_ckpt_part(c, 3, &q), -EINVAL);
	cr_expect_eq(zinf_ckpt_file(c, 7, &f), -EINVAL);
	zinf_ckpt_close(c);
}

Test(ckpt_read, every_param_and_part_whole_and_random_ranges)
{
	struct zinf_ckpt *c = fx_open_default();
	for (int i = 0; i < FX_PARAMS; i++) {
		for (int p = 0; p < FX_PARTS; p++) {
			check_range(c, i, p, 0, fx_numel[i], false);
		}
	}
	/* across the rank boundary: parameter 0's part is 150001; parameter 2's is 6 */
	check_range(c, 0, 0, 150001 - 5, 10, false);
	check_range(c, 0, 1, 150000, 2, false);
	check_range(c, 0, 2, 150001, 1, false);
	check_range(c, 2, 0, 3, 6, false);
	check_range(c, 2, 1, 5, 2, false);
	check_range(c, 1, 2, 0, 1, false);
	check_range(c, 0, 0, 300000, 1, false);
	check_range(c, 0, 0, 17, 0, false);
	uint64_t seed = zt_seed(), st = seed;
	for (int t = 0; t < 200; t++) {
		int i = (int)(zt_rand(&st) % FX_PARAMS), p = (int)(zt_rand(&st) % FX_PARTS);
		uint64_t first = zt_rand(&st) % fx_numel[i];
		uint64_t count = zt_rand(&st) % (fx_numel[i] - first + 1);
		if (i == 0 && t % 2) { /* short ranges near the boundary */
			first = 150001 - 1 - zt_rand(&st) % 50;
			count = zt_rand(&st) % 100;
		}
		check_range(c, i, p, first, count, false);
	}
	float x;
	cr_expect_eq(zinf_ckpt_read(c, 1, 0, 1, 1, ZINF_F32, &x), -EINVAL);
	cr_expect_eq(zinf_ckpt_read(c, 2, 0, 12, 0, ZINF_F32, &x), 0);
	cr_expect_eq(zinf_ckpt_read(c, 2, 0, 13, 0, ZINF_F32, &x), -EINVAL);
	cr_expect_eq(zinf_ckpt_read(c, 2, 0, 11, UINT64_MAX, ZINF_F32, &x), -EINVAL);
	cr_expect_eq(zinf_ckpt_read(c, 3, 0, 0, 1, ZINF_F32, &x), -EINVAL);
	cr_expect_eq(zinf_ckpt_read(c, 0, 3, 0, 1, ZINF_F32, &x), -EINVAL);
	cr_expect_eq(zinf_ckpt_read(c, 0, 0, 0, 1, (enum zinf_dtype)7, &x), -EINVAL);
	cr_expect_eq(zinf_ckpt_read(c, 0, 0, 0, 1, ZINF_F32, NULL), -EINVAL);
	zinf_ckpt_close(c);
}

/* x rounded to nearest even with `bits` significant bits, in double. */
static double
ref_round(double x, int bits)
{
	int e;
	frexp(x, &e);
	double sp = ldexp(1.0, e - bits);
	return nearbyint(x / sp) * sp;
}

static uint16_t
ref_bf16(double x)
{
	float f = (float)ref_round(x, 8);
	uint32_t u;
	memcpy(&u, &f, 4);
	return (uint16_t)(u >> 16);
}

/* positive normal half-precision values only */
static uint16_t
ref_f16(double x)
{
	double r = ref_round(x, 11);
	int e;
	double m = frexp(r, &e); /* r = m 2^e, m in [0.5, 1) */
	return (uint16_t)(((e - 1 + 15) << 10) | (int)((m * 2 - 1) * 1024));
}

Test(ckpt_read, convert_to_bf16_and_f16)
{
	struct zinf_ckpt *c = fx_open_default();
	uint64_t n = fx_numel[0];
	uint16_t *h = malloc(n * 2);
	cr_assert_not_null(h);
	/* by hand: parameter 1 element 0 = 1000.25 = 0x447a1000 in f32: bf16 keeps 0x447a (the
	   dropped 0x1000 is below half); f16: 1000.25 lies halfway between 1000 and 1000.5
	   (spacing 0.5 in [512, 1024)), even mantissa 976 -> 1000 = 0x6000 | 976 = 0x63d0 */
	cr_assert_eq(zinf_ckpt_read(c, 1, 0, 0, 1, ZINF_BF16, h), 0);
	cr_expect_eq(h[0], 0x447a, "%#x", h[0]);
	cr_assert_eq(zinf_ckpt_read(c, 1, 0, 0, 1, ZINF_F16, h), 0);
	cr_expect_eq(h[0], 0x63d0, "%#x", h[0]);
	/* parameter 0 whole (crosses the rank boundary and the 256K-element bounce buffer) */
	cr_assert_eq(zinf_ckpt_read(c, 0, 0, 0, n, ZINF_BF16, h), 0);
	for (uint64_t j = 0; j < n; j++) {
		if (h[j] != ref_bf16(fx_value(0, 0, j))) {
			cr_assert_fail("bf16 element %lu: %#x, expected %#x", (unsigned long)j,
				       h[j], ref_bf16(fx_value(0, 0, j)));
		}
	}
	/* f16 up to 65504: elements below 60000 */
	cr_assert_eq(zinf_ckpt_read(c, 0, 0, 100, 59000, ZINF_F16, h), 0);
	for (uint64_t j = 0; j < 59000; j++) {
		if (h[j] != ref_f16(fx_value(0, 0, 100 + j))) {
			cr_assert_fail("f16 element %lu: %#x, expected %#x",
				       (unsigned long)(100 + j), h[j],
				       ref_f16(fx_value(0, 0, 100 + j)));
		}
	}
	/* exp_avg is negative: the sign survives (parameter 2 element 7 = -(2007.25)) */
	cr_assert_eq(zinf_ckpt_read(c, 2, 1, 7, 1, ZINF_BF16, h), 0);
	cr_expect_eq(h[0], 0x8000 | ref_bf16(2007.25), "%#x", h[0]);
	free(h);
	zinf_ckpt_close(c);
}

Test(ckpt_read, bf16_state_widened)
{
	struct fx_opts o;
	fx_opts_init(&o);
	o.state = ZINF_BF16;
	struct zinf_ckpt *c = fx_open(&o);
	struct zinf_ckpt_part q = {.size = sizeof(q)};
	cr_assert_eq(zinf_ckpt_part(c, 1, &q), 0);
	cr_expect_eq(q.dtype, ZINF_BF16);
	for (int i = 0; i < FX_PARAMS; i++) {
		check_range(c, i, 0, 0, fx_numel[i], false);
		check_range(c, i, 1, 0, fx_numel[i], true);
		check_range(c, i, 2, 0, fx_numel[i], true);
	}
	check_range(c, 0, 2, 150000, 3, true);
	/* bf16 to bf16: the stored bits, copied */
	uint16_t h[4];
	cr_assert_eq(zinf_ckpt_read(c, 0, 1, 149999, 4, ZINF_BF16, h), 0);
	for (int k = 0; k < 4; k++) {
		cr_expect_eq(h[k], 0x8000 | ref_bf16(-fx_value(0, 1, 149999 + (uint64_t)k)));
	}
	zinf_ckpt_close(c);
}

Test(ckpt_read, files_world_1)
{
	struct fx_opts o;
	fx_opts_init(&o);
	o.files_world = 1;
	struct zinf_ckpt *c = fx_open(&o);
	struct zinf_ckpt_info in = {.size = sizeof(in)};
	cr_assert_eq(zinf_ckpt_get_info(c, &in), 0);
	cr_expect_eq(in.world, 2);
	cr_expect_eq(in.stage, 0);
	cr_expect_eq(in.n_files, 4); /* rank 0's parts + client.bin */
	for (int i = 0; i < FX_PARAMS; i++) {
		for (int p = 0; p < FX_PARTS; p++) {
			check_range(c, i, p, 0, fx_numel[i], false);
		}
	}
	check_range(c, 0, 1, 150000, 5, false);
	for (uint32_t k = 0; k < in.n_files; k++) {
		cr_expect_eq(zinf_ckpt_verify_file(c, k), 0);
	}
	zinf_ckpt_close(c);
}

Test(ckpt_read, latest_tag_and_tag_dir)
{
	struct fx_opts o;
	fx_opts_init(&o);
	fx_write(dir, "step100", &o); /* latest -> step100 */
	o.latest = false;
	o.files_world = 1;
	fx_write(dir, "step120", &o); /* not latest */
	struct zinf_ckpt *c = NULL;
	struct zinf_ckpt_info in = {.size = sizeof(in)};
	cr_assert_eq(zinf_ckpt_open(dir, NULL, &c), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_ckpt_get_info(c, &in), 0);
	cr_expect_str_eq(in.tag, "step100");
	cr_expect_eq(in.n_files, 7);
	zinf_ckpt_close(c);
	cr_assert_eq(zinf_ckpt_open(dir, "step120", &c), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_ckpt_get_info(c, &in), 0);
	cr_expect_str_eq(in.tag, "step120");
	cr_expect_eq(in.n_files, 4);
	zinf_ckpt_close(c);
	char tagdir[4200];
	snprintf(tagdir, sizeof(tagdir), "%s/step120", dir);
	cr_assert_eq(zinf_ckpt_open(tagdir, NULL, &c), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_ckpt_get_info(c, &in), 0);
	cr_expect_eq(in.n_files, 4);
	check_range(c, 2, 2, 0, 12, false);
	zinf_ckpt_close(c);

	cr_expect_eq(zinf_ckpt_open(dir, "step7", &c), -ENOENT);
	cr_expect(strstr(zinf_last_error(), "step7/manifest.json") != NULL, "%s",
		  zinf_last_error());
	cr_expect_eq(zinf_ckpt_open(dir, "../x", &c), -EINVAL);
	cr_expect_eq(zinf_ckpt_open(dir, ".hidden", &c), -EINVAL);
	cr_expect_eq(zinf_ckpt_open(NULL, NULL, &c), -EINVAL);
	/* latest naming a missing tag, a bad one, or absent */
	char p[4200];
	snprintf(p, sizeof(p), "%s/latest", dir);
	FILE *f = fopen(p, "w");
	fputs("step999\n", f);
	fclose(f);
	cr_expect_eq(zinf_ckpt_open(dir, NULL, &c), -ENOENT);
	cr_expect(strstr(zinf_last_error(), "step999") != NULL, "%s", zinf_last_error());
	f = fopen(p, "w");
	fputs("../etc\n", f);
	fclose(f);
	cr_expect_eq(zinf_ckpt_open(dir, NULL, &c), -EBADMSG);
	cr_expect(strstr(zinf_last_error(), "latest") != NULL, "%s", zinf_last_error());
	unlink(p);
	cr_expect_eq(zinf_ckpt_open(dir, NULL, &c), -ENOENT);
	cr_expect(strstr(zinf_last_error(), "no checkpoint") != NULL, "%s", zinf_last_error());
}

/* Flip one bit of byte `at` of file name. */
static void
corrupt(const char *name, off_t at)
{
	char p[4200];
	fx_path(p, sizeof(p), dir, "step120", name);
	int fd = open(p, O_RDWR);
	cr_assert_geq(fd, 0);
	unsigned char b;
	cr_assert_eq(pread(fd, &b, 1, at), 1);
	b ^= 0x10;
	cr_assert_eq(pwrite(fd, &b, 1, at), 1);
	close(fd);
}

static int
file_index(struct zinf_ckpt *c, const char *name)
{
	struct zinf_ckpt_file f = {.size = sizeof(f)};
	for (uint32_t k = 0; k < zinf_ckpt_file_count(c); k++) {
		cr_assert_eq(zinf_ckpt_file(c, k, &f), 0);
		if (strcmp(f.name, name) == 0) {
			return (int)k;
		}
	}
	cr_assert_fail("%s not listed", name);
	return -1;
}

Test(ckpt_read, verify_then_corrupt_one_byte)
{
	struct zinf_ckpt *c = fx_open_default();
	for (uint32_t k = 0; k < zinf_ckpt_file_count(c); k++) {
		cr_expect_eq(zinf_ckpt_verify_file(c, k), 0, "file %u: %s", k, zinf_last_error());
	}
	/* past the first 4 MiB chunk? files are 600032 bytes: one chunk; byte 400001 */
	corrupt("r00001.exp_avg", 400001);
	int bad = file_index(c, "r00001.exp_avg");
	for (uint32_t k = 0; k < zinf_ckpt_file_count(c); k++) {
		int rc = zinf_ckpt_verify_file(c, k);
		if ((int)k == bad) {
			cr_expect_eq(rc, -EBADMSG);
			cr_expect(strstr(zinf_last_error(), "r00001.exp_avg") != NULL, "%s",
				  zinf_last_error());
			cr_expect(strstr(zinf_last_error(), "CRC32C") != NULL, "%s",
				  zinf_last_error());
		} else {
			cr_expect_eq(rc, 0, "file %u", k);
		}
	}
	cr_expect_eq(zinf_ckpt_verify_file(c, 99), -EINVAL);
	zinf_ckpt_close(c);
}

Test(ckpt_read, truncated_file_refused)
{
	struct fx_opts o;
	fx_opts_init(&o);
	fx_write(dir, "step120", &o);
	char p[4200];
	fx_path(p, sizeof(p), dir, "step120", "r00001.exp_avg_sq");
	cr_assert_eq(truncate(p, 1000), 0);
	struct zinf_ckpt *c = NULL;
	cr_expect_eq(zinf_ckpt_open(dir, NULL, &c), -EBADMSG);
	cr_expect_null(c);
	cr_expect(strstr(zinf_last_error(), "r00001.exp_avg_sq") != NULL, "%s", zinf_last_error());
	cr_expect(strstr(zinf_last_error(), "truncated") != NULL, "%s", zinf_last_error());
}

Test(ckpt_read, truncated_after_open_read_fails)
{
	struct zinf_ckpt *c = fx_open_default();
	char p[4200];
	fx_path(p, sizeof(p), dir, "step120", "r00000.fp32");
	cr_assert_eq(truncate(p, 4000), 0);
	float v[4];
	cr_expect_eq(zinf_ckpt_read(c, 0, 0, 2000, 4, ZINF_F32, v), -EBADMSG);
	cr_expect(strstr(zinf_last_error(), "r00000.fp32") != NULL, "%s", zinf_last_error());
	cr_expect_eq(zinf_ckpt_verify_file(c, (uint32_t)file_index(c, "r00000.fp32")), -EBADMSG);
	zinf_ckpt_close(c);
}

Test(ckpt_read, missing_file_refused)
{
	struct fx_opts o;
	fx_opts_init(&o);
	fx_write(dir, "step120", &o);
	char p[4200];
	fx_path(p, sizeof(p), dir, "step120", "client.bin");
	cr_assert_eq(unlink(p), 0);
	struct zinf_ckpt *c = NULL;
	cr_expect_eq(zinf_ckpt_open(dir, NULL, &c), -EBADMSG);
	cr_expect(strstr(zinf_last_error(), "client.bin") != NULL, "%s", zinf_last_error());
	cr_expect(strstr(zinf_last_error(), "missing") != NULL, "%s", zinf_last_error());
}

/* ---- files that are not the checkpoint's own --------------------------------------------- */

/* Move DIR/TAG/name to OUT/name and leave a symbolic link to it in its place: the same bytes
 * (size and CRC32C as listed), outside DIR. */
static void
link_out(const char *tag, const char *name, const char *out)
{
	char from[4200], to[4400];
	fx_path(from, sizeof(from), dir, tag, name);
	snprintf(to, sizeof(to), "%s/%s.%s", out, tag, name);
	cr_assert_eq(rename(from, to), 0, "%s -> %s", from, to);
	cr_assert_eq(symlink(to, from), 0, "%s", from);
}

static void
expect_refused(const char *tag, int want, const char *name, const char *why)
{
	struct zinf_ckpt *c = NULL;
	int rc = zinf_ckpt_open(dir, tag, &c);
	cr_expect_eq(rc, want, "%s/%s: open returned %d", tag, name, rc);
	cr_expect_null(c);
	zinf_ckpt_close(c);
	char where[128]; /* "TAG/name: ", or "/TAG: " for the TAG directory itself (name "") */
	if (name[0]) {
		snprintf(where, sizeof(where), "%s/%s: ", tag, name);
	} else {
		snprintf(where, sizeof(where), "/%s: ", tag);
	}
	const char *msg = zinf_last_error();
	cr_expect(strstr(msg, where) != NULL, "\"%s\" not in: %s", where, msg);
	cr_expect(strstr(msg, why) != NULL, "\"%s\" not in: %s", why, msg);
}

/*
 * A checkpoint's files are its own: every file is opened in the TAG directory with no symbolic
 * link followed and must be a regular file. A data file, client.bin, manifest.json or
 * manifest.crc32c that is a link to a file outside DIR (the same bytes: sizes and CRCs as
 * listed) is refused naming it; so are a TAG directory or `latest` that are links, and a FIFO
 * (which would block the open) or a directory where a file is listed. A file swapped for a link
 * after the open is refused by the read and the verification.
 */
Test(ckpt_read, symbolic_links_and_special_files_refused)
{
	char *out = zt_mkdtemp(NULL);
	static const char *const linked[] = {"r00000.exp_avg", "client.bin", "manifest.json",
					     "manifest.crc32c"};
	struct fx_opts o;
	fx_opts_init(&o);
	o.latest = false;
	char tag[32], p[4400];
	for (size_t k = 0; k < sizeof(linked) / sizeof(linked[0]); k++) {
		snprintf(tag, sizeof(tag), "link%zu", k);
		fx_write(dir, tag, &o);
		link_out(tag, linked[k], out);
		expect_refused(tag, -EBADMSG, linked[k], "symbolic link");
	}
	/* a FIFO as the manifest, a directory as a data file */
	fx_write(dir, "fifo", &o);
	fx_path(p, sizeof(p), dir, "fifo", "manifest.json");
	cr_assert_eq(unlink(p), 0);
	cr_assert_eq(mkfifo(p, 0644), 0);
	expect_refused("fifo", -EBADMSG, "manifest.json", "a FIFO, expected a regular file");
	fx_write(dir, "sub", &o);
	fx_path(p, sizeof(p), dir, "sub", "r00001.fp32");
	cr_assert_eq(unlink(p), 0);
	cr_assert_eq(mkdir(p, 0755), 0);
	expect_refused("sub", -EBADMSG, "r00001.fp32", "not a regular file");
	/* the TAG directory a link (to a good checkpoint outside DIR), by tag and through latest */
	char real[4400], lnk[4400];
	o.latest = true;
	fx_write(out, "real", &o);
	snprintf(real, sizeof(real), "%s/real", out);
	snprintf(lnk, sizeof(lnk), "%s/step9", dir);
	cr_assert_eq(symlink(real, lnk), 0);
	struct zinf_ckpt *c = NULL;
	cr_assert_eq(zinf_ckpt_open(out, "real", &c), 0, "%s", zinf_last_error());
	zinf_ckpt_close(c);
	c = NULL;
	expect_refused("step9", -EBADMSG, "", "symbolic link");
	snprintf(p, sizeof(p), "%s/latest", dir);
	FILE *f = fopen(p, "w");
	fputs("step9\n", f);
	fclose(f);
	cr_expect_eq(zinf_ckpt_open(dir, NULL, &c), -EBADMSG);
	cr_expect(strstr(zinf_last_error(), "/step9: a symbolic link") != NULL, "%s",
		  zinf_last_error());
	/* latest itself a link (to out/latest, naming "real") */
	cr_assert_eq(unlink(p), 0);
	snprintf(real, sizeof(real), "%s/latest", out);
	cr_assert_eq(symlink(real, p), 0);
	cr_expect_eq(zinf_ckpt_open(dir, NULL, &c), -EBADMSG);
	cr_expect(strstr(zinf_last_error(), "/latest: a symbolic link") != NULL, "%s",
		  zinf_last_error());
	cr_expect_null(c);
	/* swapped for a link after the open: the read and the verification refuse it */
	o.latest = false;
	fx_write(dir, "late", &o);
	cr_assert_eq(zinf_ckpt_open(dir, "late", &c), 0, "%s", zinf_last_error());
	link_out("late", "r00001.fp32", out);
	float v[4];
	cr_expect_eq(zinf_ckpt_read(c, 0, 0, 150000, 4, ZINF_F32, v), -EBADMSG);
	cr_expect(strstr(zinf_last_error(), "late/r00001.fp32: a symbolic link") != NULL, "%s",
		  zinf_last_error());
	cr_expect_eq(zinf_ckpt_verify_file(c, (uint32_t)file_index(c, "r00001.fp32")), -EBADMSG);
	check_range(c, 2, 0, 0, 6, false); /* rank 0's files still read */
	zinf_ckpt_close(c);
	zt_rmtree(out);
	free(out);
}

/* ---- manifest.crc32c ---------------------------------------------------------------------- */

/*
 * manifest.crc32c holds exactly what the save writes: the manifest's CRC32C as 8 lowercase
 * hexadecimal digits and a newline, 9 bytes. The right digits followed by anything (another
 * newline, more text), without their newline, in capitals, with a carriage return, a "0x" or a
 * leading space are refused naming the file; the exact content opens.
 */
Test(ckpt_read, manifest_crc32c_exact_content)
{
	static const char *const forms[] = {
		"%08x\n\n", "%08x\nextra bytes\n", "%08x", "%08X\n", "%08x\r\n", "0x%08x\n",
		" %08x\n",  "%08x\n%08x\n"};
	struct fx_opts o;
	fx_opts_init(&o);
	o.latest = false;
	char tag[32], p[4400];
	uint32_t crc = 0;
	for (size_t k = 0; k <= sizeof(forms) / sizeof(forms[0]); k++) {
		snprintf(tag, sizeof(tag), "crc%zu", k);
		fx_write(dir, tag, &o); /* manifest.crc32c: "%08x\n" */
		fx_path(p, sizeof(p), dir, tag, "manifest.crc32c");
		FILE *f = fopen(p, "r");
		cr_assert_not_null(f);
		cr_assert_eq(fscanf(f, "%8x", &crc), 1);
		fclose(f);
		struct zinf_ckpt *c = NULL;
		if (k == sizeof(forms) / sizeof(forms[0])) { /* as written: opens */
			cr_assert_eq(zinf_ckpt_open(dir, tag, &c), 0, "%s", zinf_last_error());
			zinf_ckpt_close(c);
			break;
		}
		f = fopen(p, "w");
		cr_assert_not_null(f);
		fprintf(f, forms[k], crc, crc);
		fclose(f);
		int rc = zinf_ckpt_open(dir, tag, &c);
		cr_expect_eq(rc, -EBADMSG, "form %zu (\"%s\"): open returned %d", k, forms[k], rc);
		cr_expect_null(c);
		zinf_ckpt_close(c);
		char want[64];
		snprintf(want, sizeof(want), "%s/manifest.crc32c: ", tag);
		cr_expect(strstr(zinf_last_error(), want) != NULL, "form %zu: %s", k,
			  zinf_last_error());
		cr_expect(strstr(zinf_last_error(), "expected exactly 8 lowercase") != NULL,
			  "form %zu: %s", k, zinf_last_error());
	}
}

/* ---- malformed manifests ------------------------------------------------------------------ */

static json_t *
param(json_t *m, size_t i)
{
	return json_array_get(json_object_get(m, "params"), i);
}

static void
e_no_steps(json_t *m)
{
	json_object_del(m, "steps");
}
static void
e_world_string(json_t *m)
{
	json_object_set_new(m, "world", json_string("2"));
}
static void
e_version_2(json_t *m)
{
	json_object_set_new(m, "version", json_integer(2));
}
static void
e_format(json_t *m)
{
	json_object_set_new(m, "format", json_string("deepspeed"));
}
static void
e_part_wrong(json_t *m)
{
	json_object_set_new(param(m, 2), "part", json_integer(7));
}
static void
e_flat_off_past(json_t *m)
{
	json_array_set_new(json_object_get(param(m, 0), "flat_off"), 1, json_integer(100));
}
static void
e_flat_off_short(json_t *m)
{
	json_array_remove(json_object_get(param(m, 1), "flat_off"), 1);
}
static void
e_shape_product(json_t *m)
{
	json_object_set_new(param(m, 2), "shape", json_pack("[i, i]", 3, 5));
}
static void
e_shape_zero(json_t *m)
{
	json_object_set_new(param(m, 2), "shape", json_pack("[i, i]", 0, 12));
}
static void
e_numel_real(json_t *m)
{
	json_object_set_new(param(m, 1), "numel", json_real(1.0));
}
static void
e_dup_name(json_t *m)
{
	json_object_set_new(param(m, 2), "name", json_string("tiny.bias"));
}
static void
e_file_unlisted(json_t *m)
{
	json_array_remove(json_object_get(m, "files"), 3); /* r00001.fp32 */
}
static void
e_file_bytes(json_t *m)
{
	json_t *f = json_array_get(json_object_get(m, "files"), 0);
	json_object_set_new(f, "bytes",
			    json_integer(json_integer_value(json_object_get(f, "bytes")) + 4));
}
static void
e_crc_negative(json_t *m)
{
	json_object_set_new(json_array_get(json_object_get(m, "files"), 2), "crc32c",
			    json_integer(-1));
}
static void
e_file_name_path(json_t *m)
{
	json_object_set_new(json_array_get(json_object_get(m, "files"), 6), "name",
			    json_string("../client.bin"));
}
static void
e_ranks_flat(json_t *m)
{
	json_object_set_new(json_array_get(json_object_get(m, "ranks"), 1), "flat",
			    json_integer(100));
}
static void
e_part_dtype(json_t *m)
{
	json_object_set_new(json_array_get(json_object_get(m, "parts"), 1), "dtype",
			    json_string("f64"));
}
static void
e_loss_scale(json_t *m)
{
	json_object_set_new(json_object_get(m, "loss_scaler"), "scale", json_string("big"));
}
static void
e_optimizer_kind(json_t *m)
{
	json_object_del(json_object_get(m, "optimizer"), "kind");
}
static void
e_client_bytes(json_t *m)
{
	json_object_set_new(m, "client_bytes", json_integer(17));
}
static void
e_stage(json_t *m)
{
	json_object_set_new(m, "stage", json_integer(4));
}
static void
e_files_world(json_t *m)
{
	json_object_set_new(m, "files_world", json_integer(3));
}
static void
e_safetensors_unlisted(json_t *m)
{
	json_object_set_new(m, "safetensors", json_string("model.safetensors"));
}
static void
e_betas(json_t *m)
{
	json_object_set_new(m, "betas", json_pack("[f]", 0.9));
}
static void
e_last_overflow(json_t *m)
{
	json_object_set_new(json_object_get(m, "loss_scaler"), "last_overflow", json_integer(-2));
}
static void
e_not_object(json_t *m)
{
	json_object_set_new(m, "params", json_object());
}

struct bad_case {
	void (*edit)(json_t *m);
	const char *field; /* the message names it */
	const char *what;  /* and says this */
};

static const struct bad_case bad_cases[] = {
	{e_no_steps, "steps", "missing"},
	{e_world_string, "world", "a string"},
	{e_version_2, "version", "version 1"},
	{e_format, "format", "deepspeed"},
	{e_part_wrong, "params[2].part", "ceil"},
	{e_flat_off_past, "params[0].flat_off", "past the rank's flat"},
	{e_flat_off_short, "params[1].flat_off", "entries"},
	{e_shape_product, "params[2].shape", "product 15"},
	{e_shape_zero, "params[2].shape", "dimension 0"},
	{e_numel_real, "params[1].numel", "a number"},
	{e_dup_name, "params[2].name", "twice"},
	{e_file_unlisted, "files", "r00001.fp32"},
	{e_file_bytes, "files", "r00000.fp32"},
	{e_crc_negative, "files[2].crc32c", "out of range"},
	{e_file_name_path, "files[6].name", "../client.bin"},
	{e_ranks_flat, "params[0].flat_off", "past the rank's flat"},
	{e_part_dtype, "parts[1].dtype", "f64"},
	{e_loss_scale, "loss_scaler.scale", "a string"},
	{e_optimizer_kind, "optimizer.kind", "missing"},
	{e_client_bytes, "client_bytes", "17"},
	{e_stage, "stage", "out of range"},
	{e_files_world, "files_world", "out of range"},
	{e_safetensors_unlisted, "safetensors", "not listed"},
	{e_not_object, "params", "an object"},
	{e_betas, "betas", "2 numbers"},
	{e_last_overflow, "loss_scaler.last_overflow", "out of range"},
};

Test(ckpt_read, malformed_manifests_refused_naming_the_field)
{
	for (size_t k = 0; k < sizeof(bad_cases) / sizeof(bad_cases[0]); k++) {
		const struct bad_case *b = &bad_cases[k];
		char tag[32];
		snprintf(tag, sizeof(tag), "bad%zu", k);
		struct fx_opts o;
		fx_opts_init(&o);
		o.latest = false;
		o.edit = b->edit;
		fx_write(dir, tag, &o);
		struct zinf_ckpt *c = NULL;
		int rc = zinf_ckpt_open(dir, tag, &c);
		cr_expect_eq(rc, -EBADMSG, "case %zu (%s): %d", k, b->field, rc);
		cr_expect_null(c);
		const char *msg = zinf_last_error();
		char want[64];
		snprintf(want, sizeof(want), "manifest.json: %s:", b->field);
		cr_expect(strstr(msg, want) != NULL, "case %zu: \"%s\" not in: %s", k, want, msg);
		cr_expect(strstr(msg, b->what) != NULL, "case %zu: \"%s\" not in: %s", k, b->what,
			  msg);
		zinf_ckpt_close(c);
	}
}

/* ---- partitions that do not tile their rank's files --------------------------------------- */

/* params[i].flat_off[r] = v */
static void
set_off(json_t *m, size_t i, size_t r, json_int_t v)
{
	json_array_set_new(json_object_get(param(m, i), "flat_off"), r, json_integer(v));
}
/* rank 0: "tiny.bias" [150001, +1) moved into "embed.weight" [0, 150001) */
static void
e_overlap_inside(json_t *m)
{
	set_off(m, 1, 0, 100);
}
/* rank 1 (reversed: h.0.attn.w 0, tiny.bias 6, embed.weight 7): two at the same offset */
static void
e_overlap_same_start(json_t *m)
{
	set_off(m, 1, 1, 0);
}
/* rank 0: a 2-element hole before "h.0.attn.w", its end within the rank's flat (grown by 2) */
static void
e_gap_between(json_t *m)
{
	set_off(m, 2, 0, 150004);
	json_object_set_new(json_array_get(json_object_get(m, "ranks"), 0), "flat",
			    json_integer(150010));
}
/* rank 1: the partitions start at 3 */
static void
e_gap_first(json_t *m)
{
	set_off(m, 2, 1, 3);
	set_off(m, 1, 1, 9);
	set_off(m, 0, 1, 10);
	json_object_set_new(json_array_get(json_object_get(m, "ranks"), 1), "flat",
			    json_integer(150011));
}
/* rank 0: 2 elements past the last partition */
static void
e_gap_last(json_t *m)
{
	json_object_set_new(json_array_get(json_object_get(m, "ranks"), 0), "flat",
			    json_integer(150010));
}

/*
 * Every stored rank's partitions must tile its files exactly: two parameters at overlapping
 * offsets would share state (a resumed run trains on the wrong values), a hole holds state of
 * no parameter. Each manifest is resealed (a valid CRC32C), its files are the fixture's; the
 * open is refused naming both parameters, the rank and its files, and the elements.
 */
Test(ckpt_read, partitions_must_tile_each_rank)
{
	static const struct {
		void (*edit)(json_t *m);
		const char *field, *need[4];
	} cases[] = {
		{e_overlap_inside,
		 "params[1].flat_off",
		 {"rank 0 (r00000.fp32, r00000.exp_avg, r00000.exp_avg_sq)",
		  "\"tiny.bias\" [100, 101) overlaps \"embed.weight\" (params[0]) [0, 150001)",
		  "share state", NULL}},
		{e_overlap_same_start,
		 "params[2].flat_off",
		 {"rank 1 (r00001.fp32", "\"h.0.attn.w\" [0, 6) overlaps \"tiny.bias\" (params[1])",
		  "[0, 1)", NULL}},
		{e_gap_between,
		 "params[2].flat_off",
		 {"rank 0 (r00000.fp32",
		  "elements [150002, 150004) between \"tiny.bias\" (params[1]) and \"h.0.attn.w\"",
		  "belong to no parameter", NULL}},
		{e_gap_first,
		 "params[2].flat_off",
		 {"rank 1 (r00001.fp32", "\"h.0.attn.w\" starts at 3",
		  "[0, 3) belong to no parameter", NULL}},
		{e_gap_last,
		 "ranks[0].flat",
		 {"rank 0 (r00000.fp32", "150010 elements, the partitions end at 150008",
		  "\"h.0.attn.w\", params[2]", "[150008, 150010) belong to no parameter"}},
	};
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		char tag[32];
		snprintf(tag, sizeof(tag), "tile%zu", k);
		struct fx_opts o;
		fx_opts_init(&o);
		o.latest = false;
		o.edit = cases[k].edit;
		fx_write(dir, tag, &o);
		struct zinf_ckpt *c = NULL;
		int rc = zinf_ckpt_open(dir, tag, &c);
		cr_expect_eq(rc, -EBADMSG, "case %zu: %d", k, rc);
		cr_expect_null(c);
		const char *msg = zinf_last_error();
		char want[64];
		snprintf(want, sizeof(want), "manifest.json: %s: ", cases[k].field);
		cr_expect(strstr(msg, want) != NULL, "case %zu: \"%s\" not in: %s", k, want, msg);
		for (int j = 0; j < 4 && cases[k].need[j]; j++) {
			cr_expect(strstr(msg, cases[k].need[j]) != NULL,
				  "case %zu: \"%s\" not in: %s", k, cases[k].need[j], msg);
		}
		zinf_ckpt_close(c);
	}
}

Test(ckpt_read, not_json_refused)
{
	struct fx_opts o;
	fx_opts_init(&o);
	fx_write(dir, "step120", &o);
	char p[4200];
	fx_path(p, sizeof(p), dir, "step120", "manifest.json");
	FILE *f = fopen(p, "w");
	fputs("{\"format\": \"zinf-checkpoint\",\n \"version\": 1,,}\n", f);
	fclose(f);
	struct zinf_ckpt *c = NULL;
	cr_expect_eq(zinf_ckpt_open(dir, NULL, &c), -EBADMSG);
	cr_expect(strstr(zinf_last_error(), "manifest.json: line 2") != NULL, "%s",
		  zinf_last_error());
}

/* The fixture's manifest.json with `from` (first occurrence) replaced by `to` (NULL: the text
 * cut there), resealed. Returns the line of the edit (1-based). */
static int
edit_text(const char *tag, const char *from, const char *to)
{
	char p[4200];
	fx_path(p, sizeof(p), dir, tag, "manifest.json");
	FILE *f = fopen(p, "rb");
	cr_assert_not_null(f);
	static char text[1 << 16], out[(1 << 16) + 64];
	size_t n = fread(text, 1, sizeof(text) - 1, f);
	fclose(f);
	text[n] = '\0';
	char *at = strstr(text, from);
	cr_assert_not_null(at, "\"%s\" not in the manifest", from);
	int line = 1;
	for (char *k = text; k < at; k++) {
		line += *k == '\n';
	}
	snprintf(out, sizeof(out), "%.*s%s%s", (int)(at - text), text, to ? to : "",
		 to ? at + strlen(from) : "");
	f = fopen(p, "wb");
	cr_assert_not_null(f);
	fputs(out, f);
	fclose(f);
	char tagdir[4300];
	snprintf(tagdir, sizeof(tagdir), "%s/%s", dir, tag);
	fx_reseal(tagdir);
	return line;
}

/*
 * The manifest is parsed member by member and its parameters one at a time: what jansson
 * refused in the whole text is still refused, with the line: a syntax error inside a
 * parameter, elements not separated, the array cut short, text after the object, a duplicate
 * key at the top and inside a parameter, a top level that is not an object.
 */
Test(ckpt_read, manifest_syntax_refused_with_the_line)
{
	static const struct {
		const char *from, *to, *says;
		int line; /* the message gives the edit's line + this (-1: not checked) */
	} cases[] = {
		{"\"numel\": 300001,", "\"numel\": 300001,,", "line", 0},
		/* jansson names the second "layer", on the next line */
		{"\"numel\": 1,", "\"numel\": 1, \"layer\": 5,", "duplicate", 1},
		{"\"format\": \"zinf-checkpoint\",",
		 "\"format\": \"zinf-checkpoint\", \"steps\": 5,", "duplicate object key \"steps\"",
		 -1},
		{"},\n    {\n      \"name\": \"tiny.bias\"",
		 "}\n    {\n      \"name\": \"tiny.bias\"", "expected ',' or ']'", -1},
		{"\"name\": \"tiny.bias\"", NULL, "params: the array does not end", -1},
		{"\"client_bytes\": 16\n}", "\"client_bytes\": 16\n}\nx", "end of file expected",
		 -1},
		{"{\n  \"format\"", "[\n  \"format\"", "expected a JSON object, found an array",
		 -1},
	};
	for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
		char tag[32];
		snprintf(tag, sizeof(tag), "syn%zu", k);
		struct fx_opts o;
		fx_opts_init(&o);
		o.latest = false;
		fx_write(dir, tag, &o);
		int line = edit_text(tag, cases[k].from, cases[k].to);
		struct zinf_ckpt *c = NULL;
		int rc = zinf_ckpt_open(dir, tag, &c);
		cr_expect_eq(rc, -EBADMSG, "case %zu: %d", k, rc);
		cr_expect_null(c);
		const char *msg = zinf_last_error();
		cr_expect(strstr(msg, "manifest.json: ") != NULL, "case %zu: %s", k, msg);
		cr_expect(strstr(msg, cases[k].says) != NULL, "case %zu: \"%s\" not in %s", k,
			  cases[k].says, msg);
		char want[64];
		snprintf(want, sizeof(want), "manifest.json: line %d column", line + cases[k].line);
		cr_expect(cases[k].line < 0 || strstr(msg, want) != NULL,
			  "case %zu: \"%s\" not in %s", k, want, msg);
		zinf_ckpt_close(c);
	}
}

static void
e_unknown_keys(json_t *m)
{
	json_object_set_new(m, "future_field", json_pack("{s:i}", "x", 1));
	json_object_set_new(param(m, 0), "future", json_string("y"));
	json_object_set_new(json_array_get(json_object_get(m, "files"), 0), "sha256",
			    json_string("abc"));
	json_object_set_new(json_object_get(m, "optimizer"), "momentum", json_real(0.5));
	json_object_del(m, "created");
	json_object_del(m, "betas");
	json_object_del(json_object_get(m, "loss_scaler"), "iter");
	json_object_del(json_object_get(m, "loss_scaler"), "last_overflow");
	json_object_del(m, "options");
}

Test(ckpt_read, unknown_keys_ignored)
{
	struct fx_opts o;
	fx_opts_init(&o);
	o.edit = e_unknown_keys;
	struct zinf_ckpt *c = fx_open(&o);
	check_range(c, 0, 0, 149990, 20, false);
	zinf_ckpt_close(c);
}

static int
open_fds(void)
{
	int n = 0;
	for (int fd = 0; fd < 4096; fd++) {
		n += fcntl(fd, F_GETFD) >= 0;
	}
	return n;
}

/* Fewer descriptors than files: the reader closes the ones it keeps and goes on. */
Test(ckpt_read, more_files_than_descriptors)
{
	struct zinf_ckpt *c = fx_open_default();
	int hi = 0;
	for (int fd = 0; fd < 4096; fd++) {
		hi = fcntl(fd, F_GETFD) >= 0 ? fd : hi;
	}
	/* fill the holes below hi (Criterion's own descriptors leave some) */
	for (;;) {
		int fd = open("/dev/null", O_RDONLY);
		cr_assert_geq(fd, 0);
		if (fd > hi) {
			close(fd);
			break;
		}
	}
	cr_assert_eq(open_fds(), hi + 1);
	struct rlimit rl;
	cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	rl.rlim_cur = (rlim_t)hi + 3; /* two more than now: 6 rank files to read */
	cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	for (int i = 0; i < FX_PARAMS; i++) {
		for (int p = 0; p < FX_PARTS; p++) {
			check_range(c, i, p, 0, fx_numel[i], false);
		}
	}
	for (uint32_t k = 0; k < zinf_ckpt_file_count(c); k++) {
		cr_expect_eq(zinf_ckpt_verify_file(c, k), 0, "%s", zinf_last_error());
	}
	check_range(c, 0, 2, 149000, 2000, false);
	zinf_ckpt_close(c);
	/* the handle's files and the TAG directory it holds open from zinf_ckpt_open */
	cr_expect_eq(open_fds(), hi, "every descriptor closed");
}

/* ---- the reader and many files ------------------------------------------------------------- */

/*
 * A checkpoint by hand (docs/CHECKPOINT.md) of a world of W ranks: one part (the master), one
 * parameter "w" of W elements, rank r's file r<r>.fp32 holding element r (= r + 0.5).
 */
static void
many_ranks_checkpoint(const char *tagdir, int W)
{
	cr_assert_eq(mkdir(tagdir, 0755), 0, "%s", tagdir);
	json_t *m = json_pack("{s:s, s:i, s:s, s:i, s:i, s:i, s:s, s:i, s:i, s:i, s:f, "
			      "s:{s:f, s:i, s:i, s:i}, s:{s:s, s:s}, s:[{s:s, s:s}], s:i}",
			      "format", "zinf-checkpoint", "version", 1, "tag", "many", "world", W,
			      "files_world", W, "stage", 3, "dtype", "f32", "steps", 1,
			      "micro_steps", 1, "skipped_steps", 0, "lr", 0.01, "loss_scaler",
			      "scale", 1.0, "good_steps", 0, "hysteresis_left", 2, "overflows", 0,
			      "optimizer", "kind", "sgd", "state_dtype", "f32", "parts", "name",
			      "fp32", "dtype", "f32", "client_bytes", 0);
	cr_assert_not_null(m);
	json_t *offs = json_array(), *ranks = json_array(), *files = json_array();
	char p[8192], name[32];
	for (int r = 0; r < W; r++) {
		float v = (float)r + 0.5f;
		snprintf(name, sizeof(name), "r%05d.fp32", r);
		snprintf(p, sizeof(p), "%s/%s", tagdir, name);
		FILE *f = fopen(p, "wb");
		cr_assert_not_null(f, "%s", p);
		cr_assert_eq(fwrite(&v, 4, 1, f), 1);
		fclose(f);
		json_array_append_new(offs, json_integer(0));
		json_array_append_new(ranks, json_pack("{s:i, s:i}", "rank", r, "flat", 1));
		json_array_append_new(files,
				      json_pack("{s:s, s:i, s:I}", "name", name, "bytes", 4,
						"crc32c", (json_int_t)zinf_crc32c(0, &v, 4)));
	}
	json_object_set_new(m, "params",
			    json_pack("[{s:s, s:i, s:i, s:i, s:o}]", "name", "w", "numel", W,
				      "layer", 0, "part", 1, "flat_off", offs));
	json_object_set_new(m, "ranks", ranks);
	json_object_set_new(m, "files", files);
	snprintf(p, sizeof(p), "%s/manifest.json", tagdir);
	cr_assert_eq(json_dump_file(m, p, JSON_INDENT(1)), 0);
	fx_reseal(tagdir); /* as a writer would: the reader's checks of the values are seen */
	json_decref(m);
}

/*
 * A checkpoint of more ranks than the process may hold descriptors (RLIMIT_NOFILE; 1024 by
 * default, a 1024-rank save at stage 3 lists 3072 files): reading a tensor across every rank's
 * file, verifying every file and exporting must not keep a descriptor per file open.
 */
Test(ckpt_read, more_rank_files_than_descriptors_read_verify_export)
{
	enum { W = 300 };
	char *dir = zt_mkdtemp(NULL);
	char tagdir[4200];
	snprintf(tagdir, sizeof(tagdir), "%s/many", dir);
	many_ranks_checkpoint(tagdir, W);
	struct rlimit rl;
	cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
	rl.rlim_cur = 64;
	cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
	struct zinf_ckpt *c = NULL;
	int rc = zinf_ckpt_open(dir, "many", &c);
	cr_assert_eq(rc, 0, "open: %d %s", rc, zinf_last_error());
	float out[W];
	rc = zinf_ckpt_read(c, 0, 0, 0, W, ZINF_F32, out);
	cr_assert_eq(rc, 0, "read across %d files: %d %s", W, rc, zinf_last_error());
	for (int r = 0; r < W; r++) {
		cr_assert_eq(out[r], (float)r + 0.5f, "element %d: %g", r, out[r]);
	}
	for (uint32_t i = 0; i < zinf_ckpt_file_count(c); i++) {
		rc = zinf_ckpt_verify_file(c, i);
		cr_assert_eq(rc, 0, "verify file %u: %d %s", i, rc, zinf_last_error());
	}
	char st[4300];
	snprintf(st, sizeof(st), "%s/w.safetensors", dir);
	rc = zinf_ckpt_export(c, st, ZINF_F32, 0);
	cr_assert_eq(rc, 0, "export: %d %s", rc, zinf_last_error());
	zinf_ckpt_close(c);
	zt_rmtree(dir);
	free(dir);
}

/* ---- the manifest's size ------------------------------------------------------------------- */

/*
 * DIR/TAG by hand, one stored rank, one part (the master): n parameters "p<i>" of one element
 * each at offsets 0..n-1 (they tile), the master file r00000.fp32 of `elems` elements (sparse
 * zeros; at least n for a valid checkpoint), and `pad` bytes of an unknown key. Written with
 * stdio, so that writing it costs no memory to speak of. Returns the manifest's size.
 */
static long plain_checkpoint_of(const char *tag, size_t n, uint64_t elems, size_t pad, bool ones);

static long
plain_checkpoint(const char *tag, size_t n, uint64_t elems, size_t pad)
{
	return plain_checkpoint_of(tag, n, elems, pad, false);
}

/* The same with `ones`: "params" is [1,1,...,1] (n entries of 2 bytes, none of them valid). */
static long
plain_checkpoint_of(const char *tag, size_t n, uint64_t elems, size_t pad, bool ones)
{
	char p[4400];
	snprintf(p, sizeof(p), "%s/%s", dir, tag);
	cr_assert_eq(mkdir(p, 0755), 0, "%s", p);
	fx_path(p, sizeof(p), dir, tag, "r00000.fp32");
	int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	cr_assert_geq(fd, 0, "%s", p);
	cr_assert_eq(ftruncate(fd, (off_t)(elems * 4)), 0);
	close(fd);
	fx_path(p, sizeof(p), dir, tag, "manifest.json");
	FILE *f = fopen(p, "w");
	cr_assert_not_null(f, "%s", p);
	fprintf(f,
		"{\"format\": \"zinf-checkpoint\", \"version\": 1, \"tag\": \"%s\", \"world\": 1,"
		" \"files_world\": 1, \"stage\": 3, \"dtype\": \"f32\", \"steps\": 1,"
		" \"micro_steps\": 1, \"skipped_steps\": 0, \"lr\": 0.01,"
		" \"loss_scaler\": {\"scale\": 1.0, \"good_steps\": 0, \"hysteresis_left\": 2,"
		" \"overflows\": 0}, \"optimizer\": {\"kind\": \"sgd\", \"state_dtype\": \"f32\"},"
		" \"parts\": [{\"name\": \"fp32\", \"dtype\": \"f32\"}],\n \"params\": [\n",
		tag);
	for (size_t i = 0; i < n && ones; i++) {
		fputs(i + 1 < n ? "1," : "1", f);
	}
	for (size_t i = 0; i < n && !ones; i++) {
		fprintf(f,
			"  {\"name\": \"p%zu\", \"numel\": 1, \"layer\": 0, \"shape\": [1],"
			" \"part\": 1, \"flat_off\": [%zu]}%s\n",
			i, i, i + 1 < n ? "," : "");
	}
	fprintf(f,
		" ],\n \"ranks\": [{\"rank\": 0, \"flat\": %llu}],\n \"files\": [{\"name\":"
		" \"r00000.fp32\", \"bytes\": %llu, \"crc32c\": 0}],\n \"client_bytes\": 0,\n"
		" \"padding\": \"",
		(unsigned long long)elems, (unsigned long long)elems * 4);
	for (size_t k = 0; k < pad; k++) {
		fputc('x', f);
	}
	fputs("\"\n}\n", f);
	long size = ftell(f);
	cr_assert_eq(fclose(f), 0);
	char tagdir[4300];
	snprintf(tagdir, sizeof(tagdir), "%s/%s", dir, tag);
	fx_reseal(tagdir);
	return size;
}

/*
 * A manifest larger than its data files can need is refused before it is read, with the
 * numbers: 2 MiB of manifest over one parameter of one element (the bound: 1 MiB + 256 bytes
 * per rank file + 4096 per element of the master files = 1052928 bytes). The same manifest
 * over 512 parameters of one element each opens (unknown keys are ignored).
 */
Test(ckpt_read, manifest_larger_than_its_data_refused)
{
	long size = plain_checkpoint("big", 1, 1, 2u << 20);
	struct zinf_ckpt *c = NULL;
	int rc = zinf_ckpt_open(dir, "big", &c);
	cr_expect_eq(rc, -EBADMSG, "open: %d", rc);
	cr_expect_null(c);
	char want[128];
	snprintf(want, sizeof(want), "big/manifest.json: %ld bytes, more than the 1052928 ", size);
	const char *msg = zinf_last_error();
	cr_expect(strstr(msg, want) != NULL, "\"%s\" not in: %s", want, msg);
	cr_expect(strstr(msg, "here 1 rank files, 1 elements") != NULL, "%s", msg);
	zinf_ckpt_close(c);
	plain_checkpoint("fits", 512, 512, 2u << 20); /* 1 MiB + 256 + 512 x 4096 bytes */
	rc = zinf_ckpt_open(dir, "fits", &c);
	cr_assert_eq(rc, 0, "%s", zinf_last_error());
	zinf_ckpt_close(c);
}

/*
 * The rank files the manifest's bound counts are named r<5 digits>.<part>; a shorter name is
 * looked at no further than its end. Each name sits at the very end of a page followed by one
 * that may not be read (a read past the name's NUL faults), then in a TAG directory beside a
 * manifest large enough to be bounded (the directory is read): "r", "rX", "r1", "r0000.fp32"
 * (4 digits), "r00000" and "r00000." are not rank files and add nothing to the bound.
 */
Test(ckpt_read, short_entry_names_not_read_past_their_end)
{
	static const char *const names[] = {"r", "rX", "r1", "r0000.fp32", "r00000", "r00000.", ""};
	long pg = sysconf(_SC_PAGESIZE);
	char *m = mmap(NULL, 2 * (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		       -1, 0);
	cr_assert_neq(m, MAP_FAILED);
	cr_assert_eq(mprotect(m + pg, (size_t)pg, PROT_NONE), 0);
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		size_t n = strlen(names[i]) + 1;
		char *s = m + pg - n;
		memcpy(s, names[i], n);
		cr_expect_not(ckpt_rank_file_name(s), "\"%s\" taken for a rank file", names[i]);
	}
	char *s = m + pg - sizeof("r00003.exp_avg");
	memcpy(s, "r00003.exp_avg", sizeof("r00003.exp_avg"));
	cr_expect(ckpt_rank_file_name(s));
	munmap(m, 2 * (size_t)pg);
	/* in a TAG directory: the bound counts the one rank file and its one element only */
	long size = plain_checkpoint("short", 1, 1, 2u << 20);
	for (size_t i = 0; names[i][0]; i++) {
		char p[4400];
		fx_path(p, sizeof(p), dir, "short", names[i]);
		int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0644);
		cr_assert_geq(fd, 0, "%s", p);
		cr_assert_eq(ftruncate(fd, 1 << 20), 0);
		close(fd);
	}
	struct zinf_ckpt *c = NULL;
	cr_expect_eq(zinf_ckpt_open(dir, "short", &c), -EBADMSG);
	cr_expect_null(c);
	char want[128];
	snprintf(want, sizeof(want), "short/manifest.json: %ld bytes, more than the 1052928 ",
		 size);
	const char *msg = zinf_last_error();
	cr_expect(strstr(msg, want) != NULL, "\"%s\" not in: %s", want, msg);
	cr_expect(strstr(msg, "here 1 rank files, 1 elements") != NULL, "%s", msg);
}

/* More parameters than the ranks' files hold (each takes at least one element of every stored
 * rank): refused with the numbers before anything is kept of them. */
Test(ckpt_read, more_parameters_than_the_files_hold_refused)
{
	plain_checkpoint("many", 1000, 10, 0);
	struct zinf_ckpt *c = NULL;
	int rc = zinf_ckpt_open(dir, "many", &c);
	cr_expect_eq(rc, -EBADMSG, "open: %d", rc);
	cr_expect_null(c);
	const char *msg = zinf_last_error();
	cr_expect(strstr(msg, "manifest.json: params: 1000 entries, but rank 0's files hold 10 "
			      "elements (ranks[0].flat; r00000.fp32: 40 bytes)") != NULL,
		  "%s", msg);
	zinf_ckpt_close(c);
}

/* The process's address space, bytes (/proc/self/statm's first field). */
static size_t
vm_bytes(void)
{
	FILE *f = fopen("/proc/self/statm", "r");
	unsigned long pages = 0;
	cr_assert_not_null(f);
	cr_assert_eq(fscanf(f, "%lu", &pages), 1);
	fclose(f);
	return pages * (size_t)sysconf(_SC_PAGESIZE);
}

/*
 * "params" counted from its commas is bounded by its text before anything is allocated for it:
 * every valid entry takes at least 56 bytes ({"name":"a","numel":1,"layer":0,"part":1,
 * "flat_off":[0]}, 2 more per stored rank past the first). A manifest of 4M entries "1" (8 MB,
 * within the size bound: its master file holds 4M elements) is refused naming the counts, and
 * in a child whose address space may grow by 96 MiB only, the refusal is the same (the parameter
 * table for 4M entries, 224 MB, was once allocated from the count: -ENOMEM there).
 */
Test(ckpt_read, params_counted_from_commas_bounded_by_their_text)
{
	enum { N = 4000000 };
	plain_checkpoint_of("ones", N, N, 0, true);
	struct zinf_ckpt *c = NULL;
	cr_expect_eq(zinf_ckpt_open(dir, "ones", &c), -EBADMSG);
	cr_expect_null(c);
	const char *msg = zinf_last_error();
	cr_expect(strstr(msg, "ones/manifest.json: params: 4000000 entries in 8000001 bytes, but "
			      "an entry takes at least 56") != NULL,
		  "%s", msg);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	cr_skip_test("a sanitizer build: its shadow memory does not fit a bounded address space");
#endif
	int fds[2];
	cr_assert_eq(pipe(fds), 0);
	size_t limit = vm_bytes() + (96u << 20);
	pid_t pid = fork();
	cr_assert_geq(pid, 0);
	if (pid == 0) {
		struct rlimit rl = {limit, limit};
		int rc = setrlimit(RLIMIT_AS, &rl) ? -1000 : zinf_ckpt_open(dir, "ones", &c);
		_exit(write(fds[1], &rc, sizeof(rc)) == sizeof(rc) ? 0 : 1);
	}
	int rc = 0;
	cr_assert_eq(read(fds[0], &rc, sizeof(rc)), (ssize_t)sizeof(rc));
	int status = 0;
	cr_assert_eq(waitpid(pid, &status, 0), pid);
	close(fds[0]);
	close(fds[1]);
	cr_expect_eq(rc, -EBADMSG,
		     "open under a %zu-byte address space: %d (-ENOMEM: the "
		     "parameter table was allocated from the count)",
		     limit, rc);
}

/*
 * Memory proportional to the manifest: opening one of 200000 parameters (about 22 MB; the same
 * number of elements in its file, so every bound admits it) raises the process's peak resident
 * memory by less than 3 times the file's size (1.8 here; a jansson tree of it took 15.6).
 */
Test(ckpt_read, memory_proportional_to_the_manifest)
{
	enum { N = 200000 };
	long size = plain_checkpoint("wide", N, N, 0);
	struct rusage ru;
	cr_assert_eq(getrusage(RUSAGE_SELF, &ru), 0);
	long before = ru.ru_maxrss; /* KiB */
	struct zinf_ckpt *c = NULL;
	int rc = zinf_ckpt_open(dir, "wide", &c);
	cr_assert_eq(rc, 0, "%s", zinf_last_error());
	cr_assert_eq(getrusage(RUSAGE_SELF, &ru), 0);
	long grew = (ru.ru_maxrss - before) * 1024;
	struct zinf_ckpt_param q = {.size = sizeof(q)};
	cr_assert_eq(zinf_ckpt_param(c, N - 1, &q), 0);
	cr_expect_str_eq(q.name, "p199999");
	zinf_ckpt_close(c);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	cr_skip_test("a sanitizer build: its redzones and quarantine inflate the resident memory");
#endif
	cr_expect_lt(grew, 3 * size, "opening a %ld-byte manifest took %ld bytes (%.1f x)", size,
		     grew, (double)grew / (double)size);
}
