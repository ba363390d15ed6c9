/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/cli/test_checkpoint.c: `zinf checkpoint inspect` and `zinf checkpoint export` as a user
 * runs them, on the hand-written checkpoint of tests/ckpt/ckpt_fixture.c: inspect --json's
 * fields (step, world, stage, parts, shapes, every file ok) and the text report; one corrupted
 * byte: exit 1 naming the file; a manifest missing a field: exit 2 naming it; export: a
 * safetensors file whose header parses with the expected tensors, the dtype chosen (the
 * checkpoint's by default), shards with --shard-size, a corrupted master file refused with
 * nothing written, an existing output (file, index, shard) not replaced without --force; DIR
 * found among the options ("--tag T DIR").
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ckpt/ckpt_fixture.h"
#include "cli_run.h"

static struct zc_scratch sc;
static char ck[4300];

static void
setup(void)
{
	zc_scratch_init(&sc);
	snprintf(ck, sizeof(ck), "%s/ckpt", sc.dir);
}

static void
teardown(void)
{
	zc_scratch_fini(&sc);
}

TestSuite(checkpoint, .init = setup, .fini = teardown);

static void
write_fixture(void (*edit)(json_t *m))
{
	struct fx_opts o;
	fx_opts_init(&o);
	o.edit = edit;
	fx_write(ck, "step120", &o);
}

static void
flip(const char *name, off_t at)
{
	char p[4400];
	fx_path(p, sizeof(p), ck, "step120", name);
	int fd = open(p, O_RDWR);
	cr_assert_geq(fd, 0);
	unsigned char b;
	cr_assert_eq(pread(fd, &b, 1, at), 1);
	b ^= 1;
	cr_assert_eq(pwrite(fd, &b, 1, at), 1);
	close(fd);
}

Test(checkpoint, inspect_json)
{
	write_fixture(NULL);
	cr_assert_eq(zc_run_sh(&sc, "", "", "checkpoint inspect %s --json", ck), 0, "%s",
		     zc_text(sc.err));
	json_t *o = zc_json(sc.out);
	cr_expect_str_eq(json_string_value(json_object_get(o, "tag")), "step120");
	cr_expect_eq(zc_num(o, "steps"), 120);
	cr_expect_eq(zc_num(o, "world"), 2);
	cr_expect_eq(zc_num(o, "stage"), 3);
	cr_expect_str_eq(json_string_value(json_object_get(o, "dtype")), "bf16");
	cr_expect_str_eq(json_string_value(json_object_get(o, "optimizer")), "adamw");
	cr_expect(json_is_true(json_object_get(o, "ok")));
	cr_expect_eq(zc_num(o, "numel"), 300001 + 1 + 12);
	json_t *parts = json_object_get(o, "parts");
	cr_assert_eq(json_array_size(parts), 3);
	cr_expect_str_eq(json_string_value(json_object_get(json_array_get(parts, 2), "name")),
			 "exp_avg_sq");
	json_t *p2 = json_array_get(json_object_get(o, "params"), 2);
	cr_expect_str_eq(json_string_value(json_object_get(p2, "name")), "h.0.attn.w");
	json_t *sh = json_object_get(p2, "shape");
	cr_assert_eq(json_array_size(sh), 2);
	cr_expect_eq(json_integer_value(json_array_get(sh, 0)), 3);
	cr_expect_eq(json_integer_value(json_array_get(sh, 1)), 4);
	cr_expect_eq(zc_num(p2, "state_bytes"), 12 * 12); /* 3 f32 parts */
	json_t *files = json_object_get(o, "files");
	cr_assert_eq(json_array_size(files), 7);
	for (size_t k = 0; k < 7; k++) {
		cr_expect(json_is_true(json_object_get(json_array_get(files, k), "ok")), "file %zu",
			  k);
	}
	json_decref(o);
	/* the text report, DIR after an option's value */
	cr_assert_eq(zc_run_sh(&sc, "", "", "checkpoint inspect --tag step120 %s", ck), 0);
	char *t = zc_text(sc.out);
	cr_expect(strstr(t, "step 120") != NULL, "%s", t);
	cr_expect(strstr(t, "h.0.attn.w") != NULL && strstr(t, "[3, 4]") != NULL, "%s", t);
	cr_expect(strstr(t, "ok: every file matches") != NULL, "%s", t);
	free(t);
}

Test(checkpoint, inspect_corrupted_file_exit_1)
{
	write_fixture(NULL);
	flip("r00000.exp_avg_sq", 12345);
	cr_assert_eq(zc_run_sh(&sc, "", "", "checkpoint inspect %s --json", ck), 1);
	json_t *o = zc_json(sc.out);
	cr_expect(json_is_false(json_object_get(o, "ok")));
	json_t *bad = json_object_get(o, "bad_files");
	cr_assert_eq(json_array_size(bad), 1);
	cr_expect_str_eq(json_string_value(json_array_get(bad, 0)), "r00000.exp_avg_sq");
	json_decref(o);
	char *e = zc_text(sc.err);
	cr_expect(strstr(e, "r00000.exp_avg_sq") != NULL && strstr(e, "CRC32C") != NULL, "%s", e);
	free(e);
	cr_assert_eq(zc_run_sh(&sc, "", "", "checkpoint inspect %s", ck), 1);
	char *t = zc_text(sc.out);
	cr_expect(strstr(t, "BAD") != NULL && strstr(t, "1 file corrupted") != NULL, "%s", t);
	free(t);
	/* --no-verify does not read the data: the flipped byte goes unseen */
	cr_assert_eq(zc_run_sh(&sc, "", "", "checkpoint inspect %s --no-verify --json", ck), 0);
	o = zc_json(sc.out);
	cr_expect(json_is_false(json_object_get(o, "verified")));
	cr_expect(json_is_null(
		json_object_get(json_array_get(json_object_get(o, "files"), 0), "ok")));
	json_decref(o);
}

static void
no_stage(json_t *m)
{
	json_object_del(m, "stage");
}

Test(checkpoint, inspect_bad_manifest_exit_2)
{
	write_fixture(no_stage);
	cr_assert_eq(zc_run_sh(&sc, "", "", "checkpoint inspect %s", ck), 2);
	char *e = zc_text(sc.err);
	cr_expect(strstr(e, "manifest.json: stage:") != NULL, "%s", e);
	free(e);
	cr_assert_eq(zc_run_sh(&sc, "", "", "checkpoint inspect"), 2);
	e = zc_text(sc.err);
	cr_expect(strstr(e, "DIR is required") != NULL, "%s", e);
	free(e);
	cr_assert_eq(zc_run_sh(&sc, "", "", "checkpoint inspect %s/nothing", sc.dir), 2);
}

/* The safetensors header of path: its JSON (asserts the framing holds). */
static json_t *
st_header(const char *path, long *data_len)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "%s", path);
	unsigned char le[8];
	cr_assert_eq(fread(le, 1, 8, f), 8);
	uint64_t n = 0;
	for (int b = 0; b < 8; b++) {
		n |= (uint64_t)le[b] << (8 * b);
	}
	char *h = malloc(n);
	cr_assert_eq(fread(h, 1, n, f), n);
	fseek(f, 0, SEEK_END);
	*data_len = ftell(f) - 8 - (long)n;
	fclose(f);
	json_error_t err;
	json_t *j = json_loadb(h, n, 0, &err);
	free(h);
	cr_assert_not_null(j, "%s: %s", path, err.text);
	return j;
}

static long
tensor_end(json_t *h, const char *name, const char *dtype)
{
	json_t *e = json_object_get(h, name);
	cr_assert_not_null(e, "%s", name);
	cr_expect_str_eq(json_string_value(json_object_get(e, "dtype")), dtype);
	return (long)json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 1));
}

Test(checkpoint, export_single_and_sharded)
{
	write_fixture(NULL);
	/* default dtype: the checkpoint's (bf16) */
	cr_assert_eq(
		zc_run_sh(&sc, "", "", "checkpoint export %s --out %s/m.safetensors", ck, sc.dir),
		0, "%s", zc_text(sc.err));
	char p[4400];
	snprintf(p, sizeof(p), "%s/m.safetensors", sc.dir);
	long dl;
	json_t *h = st_header(p, &dl);
	cr_expect_eq(tensor_end(h, "embed.weight", "BF16"), 300001 * 2);
	cr_expect_eq(tensor_end(h, "h.0.attn.w", "BF16"), dl);
	cr_expect_eq(dl, (300001 + 1 + 12) * 2);
	json_decref(h);
	/* fp32, sharded at 1M: embed.weight (1.2 MB) alone, then the two small ones */
	cr_assert_eq(zc_run_sh(&sc, "", "",
			       "checkpoint export --dtype fp32 --shard-size 1M %s --out "
			       "%s/s.safetensors --tag step120",
			       ck, sc.dir),
		     0, "%s", zc_text(sc.err));
	snprintf(p, sizeof(p), "%s/s.safetensors.index.json", sc.dir);
	json_t *idx = zc_json(p);
	json_t *wm = json_object_get(idx, "weight_map");
	cr_expect_str_eq(json_string_value(json_object_get(wm, "embed.weight")),
			 "s-00001-of-00002.safetensors");
	cr_expect_str_eq(json_string_value(json_object_get(wm, "tiny.bias")),
			 "s-00002-of-00002.safetensors");
	cr_expect_eq(zc_num(json_object_get(idx, "metadata"), "total_size"), (300001 + 1 + 12) * 4);
	json_decref(idx);
	snprintf(p, sizeof(p), "%s/s-00002-of-00002.safetensors", sc.dir);
	h = st_header(p, &dl);
	cr_expect_eq(tensor_end(h, "tiny.bias", "F32"), 4);
	cr_expect_eq(tensor_end(h, "h.0.attn.w", "F32"), dl);
	json_decref(h);
}

Test(checkpoint, export_refuses_corrupted_master)
{
	write_fixture(NULL);
	flip("r00001.fp32", 100);
	cr_assert_eq(
		zc_run_sh(&sc, "", "", "checkpoint export %s --out %s/m.safetensors", ck, sc.dir),
		1);
	char *e = zc_text(sc.err);
	cr_expect(strstr(e, "r00001.fp32") != NULL, "%s", e);
	free(e);
	char p[4400];
	snprintf(p, sizeof(p), "%s/m.safetensors", sc.dir);
	cr_expect_eq(access(p, F_OK), -1, "nothing written");
	/* --no-verify exports what is there; a bad --out is refused before anything */
	cr_assert_eq(zc_run_sh(&sc, "", "",
			       "checkpoint export %s --no-verify --out %s/m.safetensors", ck,
			       sc.dir),
		     0);
	cr_assert_eq(zc_run_sh(&sc, "", "", "checkpoint export %s --out %s/m.bin", ck, sc.dir), 2);
	cr_assert_eq(zc_run_sh(&sc, "", "", "checkpoint export %s", ck), 2);
	e = zc_text(sc.err);
	cr_expect(strstr(e, "--out") != NULL, "%s", e);
	free(e);
}

/* The bytes of path (NUL-terminated), or NULL when it cannot be read. */
static char *
slurp(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		return NULL;
	}
	char *buf = calloc(1, 1 << 20);
	cr_assert_not_null(buf);
	fread(buf, 1, (1 << 20) - 1, f);
	fclose(f);
	return buf;
}

static void
put(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f, "%s", path);
	fputs(text, f);
	cr_assert_eq(fclose(f), 0);
}

/*
 * export never replaces what is there unless --force: an existing --out, its index or a shard
 * of it (an earlier sharded export) is refused with exit 2 naming it, the file left as it was
 * and nothing written; --force replaces it.
 */
Test(checkpoint, export_refuses_to_replace_without_force)
{
	write_fixture(NULL);
	char out[4400], p[4500];
	snprintf(out, sizeof(out), "%s/m.safetensors", sc.dir);
	put(out, "the user's file\n");
	cr_assert_eq(zc_run_sh(&sc, "", "", "checkpoint export %s --out %s", ck, out), 2);
	char *e = zc_text(sc.err);
	cr_expect(strstr(e, out) != NULL && strstr(e, "exists: not replaced (--force") != NULL,
		  "%s", e);
	free(e);
	char *now = slurp(out);
	cr_expect_str_eq(now, "the user's file\n", "the refused export changed %s", out);
	free(now);
	cr_assert_eq(zc_run_sh(&sc, "", "", "checkpoint export %s --out %s --force", ck, out), 0,
		     "%s", zc_text(sc.err));
	long dl;
	json_t *h = st_header(out, &dl);
	cr_expect_eq(dl, (300001 + 1 + 12) * 2, "--force wrote the export over it");
	json_decref(h);
	/* sharded: the index, then a shard alone, each refused by name */
	snprintf(out, sizeof(out), "%s/s.safetensors", sc.dir);
	cr_assert_eq(zc_run_sh(&sc, "", "",
			       "checkpoint export %s --dtype fp32 --shard-size 1M --out %s", ck,
			       out),
		     0, "%s", zc_text(sc.err));
	snprintf(p, sizeof(p), "%s.index.json", out);
	char *index = slurp(p);
	cr_assert_not_null(index);
	cr_assert_eq(zc_run_sh(&sc, "", "",
			       "checkpoint export %s --dtype fp32 --shard-size 1M --out %s", ck,
			       out),
		     2);
	e = zc_text(sc.err);
	cr_expect(strstr(e, "s.safetensors.index.json exists: not replaced") != NULL, "%s", e);
	free(e);
	cr_assert_eq(unlink(p), 0);
	cr_assert_eq(zc_run_sh(&sc, "", "", "checkpoint export %s --out %s", ck, out), 2);
	e = zc_text(sc.err);
	cr_expect(strstr(e, "/s-0000") != NULL && strstr(e, "-of-00002.safetensors exists") != NULL,
		  "%s", e);
	free(e);
	snprintf(p, sizeof(p), "%s", out);
	cr_expect_eq(access(p, F_OK), -1, "a refused export wrote %s", p);
	cr_assert_eq(zc_run_sh(&sc, "", "",
			       "checkpoint export %s --dtype fp32 --shard-size 1M --out %s --force",
			       ck, out),
		     0, "%s", zc_text(sc.err));
	snprintf(p, sizeof(p), "%s.index.json", out);
	char *again = slurp(p);
	cr_expect_str_eq(again, index, "--force wrote the same index again");
	free(again);
	free(index);
}
