/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/ckpt/ckpt_fixture.c: the hand-written checkpoint of ckpt_fixture.h. The layout of a
 * stored rank's flat partition: the partitions tile it exactly (as the engine lays them out),
 * rank 0 in registration order, rank 1 in reverse (so flat_off differs between ranks and a
 * wrong offset reads a neighbour's known values); the padding past numel is zero. bf16 state
 * is rounded to nearest even here, in double arithmetic, independently of the library. CRC32C
 * through zinf_crc32c (its own test checks it against the published vectors).
 */
#include "ckpt/ckpt_fixture.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "zinf/blocks/swap.h"

const char *const fx_name[FX_PARAMS] = {"embed.weight", "tiny.bias", "h.0.attn.w"};
const uint64_t fx_numel[FX_PARAMS] = {300001, 1, 12};
const uint32_t fx_ndim[FX_PARAMS] = {1, 1, 2};
const uint64_t fx_shape[FX_PARAMS][2] = {{300001, 0}, {1, 0}, {3, 4}};
const char *const fx_part[FX_PARTS] = {"fp32", "exp_avg", "exp_avg_sq"};

void
fx_opts_init(struct fx_opts *o)
{
	*o = (struct fx_opts){.files_world = 2, .state = ZINF_F32, .latest = true};
}

double
fx_value(int i, int p, uint64_t j)
{
	double v = (double)i * 1000 + (double)j;
	return p == 0 ? v + 0.25 : p == 1 ? -(v + 0.25) : v + 0.75;
}

/* x rounded to nearest even with `bits` significant bits (normal range). */
static double
round_bits(double x, int bits)
{
	if (x == 0) {
		return 0;
	}
	int e;
	frexp(x, &e); /* |x| in [2^(e-1), 2^e) */
	double spacing = ldexp(1.0, e - bits);
	return nearbyint(x / spacing) * spacing;
}

static uint16_t
bf16_bits(double x)
{
	float f = (float)round_bits(x, 8);
	uint32_t u;
	memcpy(&u, &f, 4);
	cr_assert_eq(u & 0xffff, 0, "bf16 rounding left low bits");
	return (uint16_t)(u >> 16);
}

void
fx_path(char *buf, size_t len, const char *dir, const char *tag, const char *name)
{
	snprintf(buf, len, "%s/%s/%s", dir, tag, name);
}

static void
write_file(const char *path, const void *data, size_t len, json_t *files, const char *name)
{
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	cr_assert_eq(fwrite(data, 1, len, f), len);
	cr_assert_eq(fclose(f), 0);
	json_array_append_new(files,
			      json_pack("{s:s, s:I, s:I}", "name", name, "bytes", (json_int_t)len,
					"crc32c", (json_int_t)zinf_crc32c(0, data, len)));
}

void
fx_write(const char *dir, const char *tag, const struct fx_opts *o)
{
	int W = o->files_world;
	char path[4096];
	mkdir(dir, 0755);
	snprintf(path, sizeof(path), "%s/%s", dir, tag);
	cr_assert_eq(mkdir(path, 0755), 0, "%s: %s", path, strerror(errno));

	/* layout: offsets per rank and parameter */
	uint64_t part[FX_PARAMS], off[2][FX_PARAMS], flat[2];
	for (int r = 0; r < W; r++) {
		uint64_t at = 0;
		for (int k = 0; k < FX_PARAMS; k++) {
			int i = r == 1 ? FX_PARAMS - 1 - k : k;
			part[i] = (fx_numel[i] + (uint64_t)W - 1) / (uint64_t)W;
			off[r][i] = at;
			at += part[i];
		}
		flat[r] = at;
	}

	json_t *files = json_array();
	for (int r = 0; r < W; r++) {
		for (int p = 0; p < FX_PARTS; p++) {
			enum zinf_dtype dt = p == 0 ? ZINF_F32 : o->state;
			size_t es = dt == ZINF_F32 ? 4 : 2;
			unsigned char *buf = malloc(flat[r] * es);
			cr_assert_not_null(buf);
			for (int i = 0; i < FX_PARAMS; i++) {
				for (uint64_t l = 0; l < part[i]; l++) {
					uint64_t j = (uint64_t)r * part[i] + l;
					double v = j < fx_numel[i] ? fx_value(i, p, j) : 0.0;
					uint64_t k = off[r][i] + l;
					if (es == 4) {
						((float *)buf)[k] = (float)v;
					} else {
						((uint16_t *)buf)[k] = bf16_bits(v);
					}
				}
			}
			char name[64];
			snprintf(name, sizeof(name), "r%05d.%s", r, fx_part[p]);
			fx_path(path, sizeof(path), dir, tag, name);
			write_file(path, buf, flat[r] * es, files, name);
			free(buf);
		}
	}
	static const char client[] = "trainer state 16";
	fx_path(path, sizeof(path), dir, tag, "client.bin");
	write_file(path, client, 16, files, "client.bin");

	json_t *params = json_array();
	for (int i = 0; i < FX_PARAMS; i++) {
		json_t *fo = json_array();
		for (int r = 0; r < W; r++) {
			json_array_append_new(fo, json_integer((json_int_t)off[r][i]));
		}
		json_t *q = json_pack("{s:s, s:I, s:i, s:I, s:o}", "name", fx_name[i], "numel",
				      (json_int_t)fx_numel[i], "layer", i, "part",
				      (json_int_t)part[i], "flat_off", fo);
		if (i > 0) { /* parameter 0 without "shape": ndim 1 */
			json_t *sh = json_array();
			for (uint32_t d = 0; d < fx_ndim[i]; d++) {
				json_array_append_new(sh, json_integer((json_int_t)fx_shape[i][d]));
			}
			json_object_set_new(q, "shape", sh);
		}
		json_array_append_new(params, q);
	}
	json_t *ranks = json_array();
	for (int r = 0; r < W; r++) {
		json_array_append_new(
			ranks, json_pack("{s:i, s:I}", "rank", r, "flat", (json_int_t)flat[r]));
	}
	json_t *parts = json_array();
	for (int p = 0; p < FX_PARTS; p++) {
		json_array_append_new(parts, json_pack("{s:s, s:s}", "name", fx_part[p], "dtype",
						       p == 0 ? "f32" : zinf_dtype_name(o->state)));
	}
	json_t *m = json_pack("{s:s, s:i, s:s, s:s, s:i, s:i, s:i, s:s, s:i, s:i, s:i, s:f,"
			      " s:[f, f], s:{s:f, s:i, s:i, s:i, s:i, s:i},"
			      " s:{s:s, s:s, s:f, s:f, s:f, s:f, s:f, s:b},"
			      " s:o, s:{s:i}, s:o, s:o, s:o, s:i}",
			      "format", "zinf-checkpoint", "version", 1, "tag", tag, "created",
			      "2026-11-23T15:40:02Z", "world", 2, "files_world", W, "stage",
			      W == 1 ? 0 : 3, "dtype", "bf16", "steps", 120, "micro_steps", 480,
			      "skipped_steps", 1, "lr", 3e-4, "betas", 0.9, 0.999, "loss_scaler",
			      "scale", 65536.0, "good_steps", 12, "hysteresis_left", 2, "overflows",
			      0, "iter", 40, "last_overflow", 27, "optimizer", "kind", "adamw",
			      "state_dtype", zinf_dtype_name(o->state), "lr", 1e-3, "beta1", 0.9,
			      "beta2", 0.999, "eps", 1e-8, "weight_decay", 0.01, "bias_correction",
			      1, "parts", parts, "options", "stage", W == 1 ? 0 : 3, "params",
			      params, "ranks", ranks, "files", files, "client_bytes", 16);
	cr_assert_not_null(m);
	if (o->edit) {
		o->edit(m);
	}
	fx_path(path, sizeof(path), dir, tag, "manifest.json");
	cr_assert_eq(json_dump_file(m, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER), 0);
	json_decref(m);
	fx_manifest_crc(dir, tag);
	if (o->latest) {
		snprintf(path, sizeof(path), "%s/latest", dir);
		FILE *f = fopen(path, "w");
		cr_assert_not_null(f);
		fprintf(f, "%s\n", tag);
		cr_assert_eq(fclose(f), 0);
	}
}

void
fx_manifest_crc(const char *dir, const char *tag)
{
	char tagdir[4200];
	snprintf(tagdir, sizeof(tagdir), "%s/%s", dir, tag);
	fx_reseal(tagdir);
}

void
fx_reseal(const char *tagdir)
{
	char path[4300];
	snprintf(path, sizeof(path), "%s/manifest.json", tagdir);
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "%s", path);
	uint32_t crc = 0;
	char buf[4096];
	size_t n;
	while ((n = fread(buf, 1, sizeof(buf), f)) > 0) {
		crc = zinf_crc32c(crc, buf, n);
	}
	fclose(f);
	snprintf(path, sizeof(path), "%s/manifest.crc32c", tagdir);
	f = fopen(path, "w");
	cr_assert_not_null(f, "%s", path);
	fprintf(f, "%08x\n", crc);
	cr_assert_eq(fclose(f), 0);
}
