/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/ckpt/test_ckpt_export.c: zinf_ckpt_export on the hand-written checkpoint of
 * ckpt_fixture.c. Each file written is parsed back here by the safetensors format's rules (an
 * 8-byte little-endian header length, a JSON header padded with spaces, every tensor's dtype,
 * shape and data_offsets, contiguous, covering the data to the end of the file) and its bytes
 * compared with the known values converted by a rounding worked in double: f32, bf16 and f16
 * (overflowing to infinity past 65504). Sharded: Hugging Face's shard names, a tensor never
 * split, the index mapping every tensor with the total size worked by hand. A failed export
 * leaves no file, not even a temporary one.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ckpt/ckpt_fixture.h"
#include "common/test_util.h"
#include "zinf/checkpoint.h"

ZT_TMPDIR_SUITE(ckpt_export);

static struct zinf_ckpt *
fx_open_default(void)
{
	struct fx_opts o;
	fx_opts_init(&o);
	fx_write(dir, "step120", &o);
	struct zinf_ckpt *c = NULL;
	cr_assert_eq(zinf_ckpt_open(dir, NULL, &c), 0, "%s", zinf_last_error());
	return c;
}

/* ---- the reference conversions ------------------------------------------------------------ */

static double
ref_round(double x, int bits)
{
	int e;
	frexp(x, &e);
	double sp = ldexp(1.0, e - bits);
	return nearbyint(x / sp) * sp;
}

/* x (normal, |x| >= 2^-14) as the 2 or 4 bytes of dtype */
static void
ref_bytes(double x, enum zinf_dtype dt, unsigned char *out)
{
	if (dt == ZINF_F32) {
		float f = (float)x;
		memcpy(out, &f, 4);
		return;
	}
	uint16_t h, sign = x < 0 ? 0x8000 : 0;
	if (dt == ZINF_BF16) {
		float f = (float)ref_round(x, 8);
		uint32_t u;
		memcpy(&u, &f, 4);
		h = (uint16_t)(u >> 16);
	} else {
		double r = fabs(ref_round(x, 11));
		if (r >= 65536) {
			h = sign | 0x7c00;
		} else {
			int e;
			double m = frexp(r, &e);
			h = (uint16_t)(sign | ((e - 1 + 15) << 10) | (int)((m * 2 - 1) * 1024));
		}
	}
	memcpy(out, &h, 2);
}

/* ---- a safetensors reader, by the format's rules ------------------------------------------ */

struct st_file {
	unsigned char *buf;
	size_t len;
	json_t *hdr;
	const unsigned char *data;
	uint64_t data_len, next; /* next: where the next tensor must begin */
	size_t n_seen;
};

static void
st_load(const char *path, struct st_file *f)
{
	memset(f, 0, sizeof(*f));
	FILE *fp = fopen(path, "rb");
	cr_assert_not_null(fp, "%s: %s", path, strerror(errno));
	fseek(fp, 0, SEEK_END);
	f->len = (size_t)ftell(fp);
	fseek(fp, 0, SEEK_SET);
	f->buf = malloc(f->len);
	cr_assert_eq(fread(f->buf, 1, f->len, fp), f->len);
	fclose(fp);
	cr_assert_geq(f->len, 8);
	uint64_t n = 0;
	for (int b = 0; b < 8; b++) {
		n |= (uint64_t)f->buf[b] << (8 * b);
	}
	cr_assert_leq(8 + n, f->len, "%s: header length %lu past the file", path, (unsigned long)n);
	cr_expect_eq(n % 8, 0, "header padded to 8");
	cr_assert_eq(f->buf[8], '{');
	json_error_t err;
	f->hdr = json_loadb((const char *)f->buf + 8, n, 0, &err);
	cr_assert_not_null(f->hdr, "%s: header: %s", path, err.text);
	for (uint64_t k = n; k > 0 && f->buf[8 + k - 1] != '}'; k--) {
		cr_assert_eq(f->buf[8 + k - 1], ' ', "padding is spaces");
	}
	json_t *meta = json_object_get(f->hdr, "__metadata__");
	cr_assert(json_is_object(meta));
	cr_expect_str_eq(json_string_value(json_object_get(meta, "format")), "pt");
	f->data = f->buf + 8 + n;
	f->data_len = f->len - 8 - n;
}

/* The next tensor: its header entry checked, its data returned. */
static const unsigned char *
st_next(struct st_file *f, const char *name, const char *dtype, size_t esz, uint32_t ndim,
	const uint64_t *shape, uint64_t numel)
{
	json_t *e = json_object_get(f->hdr, name);
	cr_assert(json_is_object(e), "tensor %s missing", name);
	cr_expect_str_eq(json_string_value(json_object_get(e, "dtype")), dtype);
	json_t *sh = json_object_get(e, "shape");
	cr_assert_eq(json_array_size(sh), ndim, "%s ndim", name);
	for (uint32_t d = 0; d < ndim; d++) {
		cr_expect_eq((uint64_t)json_integer_value(json_array_get(sh, d)), shape[d]);
	}
	json_t *off = json_object_get(e, "data_offsets");
	cr_assert_eq(json_array_size(off), 2);
	uint64_t b = (uint64_t)json_integer_value(json_array_get(off, 0));
	uint64_t end = (uint64_t)json_integer_value(json_array_get(off, 1));
	cr_assert_eq(b, f->next, "%s begins at %lu, expected %lu (contiguous)", name,
		     (unsigned long)b, (unsigned long)f->next);
	cr_assert_eq(end - b, numel * esz, "%s bytes", name);
	cr_assert_leq(end, f->data_len);
	f->next = end;
	f->n_seen++;
	return f->data + b;
}

static void
st_done(struct st_file *f)
{
	cr_expect_eq(f->next, f->data_len, "the tensors cover the data to the end of the file");
	cr_expect_eq(json_object_size(f->hdr), f->n_seen + 1, "no other entries");
	json_decref(f->hdr);
	free(f->buf);
}

static void
check_tensor(struct st_file *f, int i, enum zinf_dtype dt)
{
	static const char *const names[] = {"F32", "F16", "BF16"};
	size_t esz = zinf_dtype_size(dt);
	const unsigned char *d =
		st_next(f, fx_name[i], names[dt], esz, fx_ndim[i], fx_shape[i], fx_numel[i]);
	unsigned char want[4];
	for (uint64_t j = 0; j < fx_numel[i]; j++) {
		ref_bytes(fx_value(i, 0, j), dt, want);
		if (memcmp(d + j * esz, want, esz) != 0) {
			cr_assert_fail("%s %s element %lu differs", fx_name[i], names[dt],
				       (unsigned long)j);
		}
	}
}

static int
entries(const char *d)
{
	DIR *dp = opendir(d);
	cr_assert_not_null(dp);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(dp))) {
		n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
	}
	closedir(dp);
	return n;
}

static char *
outdir(void)
{
	char *o = malloc(4200);
	snprintf(o, 4200, "%s/out", dir);
	cr_assert_eq(mkdir(o, 0755), 0);
	return o;
}

Test(ckpt_export, single_file_each_dtype)
{
	struct zinf_ckpt *c = fx_open_default();
	char *od = outdir(), path[4300];
	const enum zinf_dtype dts[] = {ZINF_F32, ZINF_BF16, ZINF_F16};
	for (int k = 0; k < 3; k++) {
		snprintf(path, sizeof(path), "%s/model-%s.safetensors", od,
			 zinf_dtype_name(dts[k]));
		/* shard_bytes above the total: one file all the same */
		int rc = zinf_ckpt_export(c, path, dts[k], k == 1 ? (5ull << 30) : 0);
		cr_assert_eq(rc, 0, "%s: %s", path, zinf_last_error());
		struct st_file f;
		st_load(path, &f);
		for (int i = 0; i < FX_PARAMS; i++) {
			check_tensor(&f, i, dts[k]);
		}
		st_done(&f);
	}
	cr_expect_eq(entries(od), 3, "no temporary file left");
	/* by hand: embed.weight element 65520 (65520.25) overflows f16 to +inf (0x7c00) and
	   element 65519 (65519.25) rounds down to 65504 (0x7bff) */
	snprintf(path, sizeof(path), "%s/model-f16.safetensors", od);
	struct st_file f;
	st_load(path, &f);
	const unsigned char *d = st_next(&f, fx_name[0], "F16", 2, 1, fx_shape[0], fx_numel[0]);
	uint16_t h;
	memcpy(&h, d + 2 * 65520, 2);
	cr_expect_eq(h, 0x7c00, "%#x", h);
	memcpy(&h, d + 2 * 65519, 2);
	cr_expect_eq(h, 0x7bff, "%#x", h);
	json_decref(f.hdr);
	free(f.buf);
	free(od);
	zinf_ckpt_close(c);
}

Test(ckpt_export, sharded_with_index)
{
	struct zinf_ckpt *c = fx_open_default();
	char *od = outdir(), path[4300];
	snprintf(path, sizeof(path), "%s/model.safetensors", od);
	/* bf16: embed.weight 600002 bytes, tiny.bias 2, h.0.attn.w 24. With 600004 bytes a shard:
	   shard 1 takes embed.weight and tiny.bias (600004, not over), shard 2 h.0.attn.w. */
	cr_assert_eq(zinf_ckpt_export(c, path, ZINF_BF16, 600004), 0, "%s", zinf_last_error());
	cr_expect_eq(access(path, F_OK), -1, "no single file when sharded");
	cr_expect_eq(entries(od), 3, "2 shards + the index, nothing else");
	snprintf(path, sizeof(path), "%s/model.safetensors.index.json", od);
	json_error_t err;
	json_t *idx = json_load_file(path, 0, &err);
	cr_assert_not_null(idx, "%s: %s", path, err.text);
	cr_expect_eq(
		json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_size")),
		600028);
	json_t *wm = json_object_get(idx, "weight_map");
	cr_assert_eq(json_object_size(wm), 3);
	const char *want[] = {"model-00001-of-00002.safetensors",
			      "model-00001-of-00002.safetensors",
			      "model-00002-of-00002.safetensors"};
	for (int i = 0; i < FX_PARAMS; i++) {
		cr_expect_str_eq(json_string_value(json_object_get(wm, fx_name[i])), want[i]);
	}
	struct st_file f;
	snprintf(path, sizeof(path), "%s/model-00001-of-00002.safetensors", od);
	st_load(path, &f);
	check_tensor(&f, 0, ZINF_BF16);
	check_tensor(&f, 1, ZINF_BF16);
	st_done(&f);
	snprintf(path, sizeof(path), "%s/model-00002-of-00002.safetensors", od);
	st_load(path, &f);
	check_tensor(&f, 2, ZINF_BF16);
	st_done(&f);
	json_decref(idx);

	/* every tensor alone: a shard size below the smallest (2 bytes of tiny.bias... 1 byte) */
	snprintf(path, sizeof(path), "%s/w.safetensors", od);
	cr_assert_eq(zinf_ckpt_export(c, path, ZINF_F32, 1), 0, "%s", zinf_last_error());
	for (int i = 0; i < FX_PARAMS; i++) {
		snprintf(path, sizeof(path), "%s/w-%05d-of-00003.safetensors", od, i + 1);
		st_load(path, &f);
		check_tensor(&f, i, ZINF_F32);
		st_done(&f);
	}
	snprintf(path, sizeof(path), "%s/w.safetensors.index.json", od);
	idx = json_load_file(path, 0, &err);
	cr_assert_not_null(idx);
	cr_expect_eq(
		json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_size")),
		(300001 + 1 + 12) * 4);
	cr_expect_str_eq(json_string_value(
				 json_object_get(json_object_get(idx, "weight_map"), "h.0.attn.w")),
			 "w-00003-of-00003.safetensors");
	json_decref(idx);
	free(od);
	zinf_ckpt_close(c);
}

Test(ckpt_export, refusals_leave_no_file)
{
	struct zinf_ckpt *c = fx_open_default();
	char *od = outdir(), path[4300];
	snprintf(path, sizeof(path), "%s/model.bin", od);
	cr_expect_eq(zinf_ckpt_export(c, path, ZINF_F32, 0), -EINVAL);
	snprintf(path, sizeof(path), "%s/.safetensors", od);
	cr_expect_eq(zinf_ckpt_export(c, path, ZINF_F32, 0), -EINVAL);
	snprintf(path, sizeof(path), "%s/model.safetensors", od);
	cr_expect_eq(zinf_ckpt_export(c, path, (enum zinf_dtype)9, 0), -EINVAL);
	cr_expect_eq(zinf_ckpt_export(NULL, path, ZINF_F32, 0), -EINVAL);
	snprintf(path, sizeof(path), "%s/nodir/model.safetensors", od);
	cr_expect_eq(zinf_ckpt_export(c, path, ZINF_F32, 0), -ENOENT);
	cr_expect(strstr(zinf_last_error(), "nodir") != NULL, "%s", zinf_last_error());
	/* a rank file truncated after open: the export fails part way, leaving nothing */
	char rf[4300];
	fx_path(rf, sizeof(rf), dir, "step120", "r00001.fp32");
	cr_assert_eq(truncate(rf, 4096), 0);
	snprintf(path, sizeof(path), "%s/model.safetensors", od);
	cr_expect_eq(zinf_ckpt_export(c, path, ZINF_BF16, 0), -EBADMSG);
	cr_expect(strstr(zinf_last_error(), "r00001.fp32") != NULL, "%s", zinf_last_error());
	cr_expect_eq(entries(od), 0, "no file, no temporary");
	free(od);
	zinf_ckpt_close(c);
}
