/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/ckpt/test_safetensors.c: zinf/safetensors.h. The reader on files written by hand here
 * (every refusal of a header, an index and a read, each test named by what it refuses and
 * checking that the message names the file, the tensor and the value), on a file written by the
 * Python safetensors library (tests/fixtures/safetensors/dtypes.safetensors, its values listed
 * below); the writer read back by the reader: every stored, source and read dtype with values
 * that every type holds exactly, rounding to bf16 and f16 at ties against bit patterns worked by
 * hand, a tensor larger than the bounce buffers in ragged ranges, shards cut as transformers
 * cuts them and opened through the index, the format's layout byte by byte, what is refused
 * and what is left on disk (nothing, after a failed or abandoned write; no stale layout after
 * an overwrite); reads of one handle from several threads; and every allocation failing in
 * turn.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/test_util.h"
#include "common/util.h"
#include "zinf/safetensors.h"

static char *dir;

static void
setup(void)
{
	dir = zt_mkdtemp(NULL);
	cr_assert_not_null(dir);
}

static void
teardown(void)
{
	zt_rmtree(dir);
	free(dir);
}

TestSuite(safetensors, .init = setup, .fini = teardown);

/* ---- helpers ------------------------------------------------------------------------------ */

/* DIR/name into out (4200 bytes). */
static char *
at(char *out, const char *name)
{
	snprintf(out, 4200, "%s/%s", dir, name);
	return out;
}

/* Write DIR/name: the 8-byte length hl (UINT64_MAX: the header's own length), the header text,
 * then dlen bytes of data. */
static void
put_file(const char *name, uint64_t hl, const char *hdr, const void *data, size_t dlen)
{
	char p[4200];
	FILE *f = fopen(at(p, name), "wb");
	cr_assert_not_null(f);
	uint64_t n = hl == UINT64_MAX ? strlen(hdr) : hl;
	uint8_t le[8];
	for (int k = 0; k < 8; k++) {
		le[k] = (uint8_t)(n >> (8 * k));
	}
	cr_assert_eq(fwrite(le, 1, 8, f), 8);
	cr_assert_eq(fwrite(hdr, 1, strlen(hdr), f), strlen(hdr));
	if (dlen) {
		cr_assert_eq(fwrite(data, 1, dlen, f), dlen);
	}
	fclose(f);
}

static void
put_text(const char *name, const char *text)
{
	char p[4200];
	FILE *f = fopen(at(p, name), "w");
	cr_assert_not_null(f);
	fputs(text, f);
	fclose(f);
}

/* The last error names each of the strings given (NULL-terminated). */
static void
says(const char *first, ...)
{
	const char *msg = zinf_last_error();
	va_list ap;
	va_start(ap, first);
	for (const char *s = first; s; s = va_arg(ap, const char *)) {
		cr_expect(strstr(msg, s), "the message \"%s\" does not name \"%s\"", msg, s);
	}
	va_end(ap);
}

/* Opening DIR/name is refused with want. */
static void
refused(const char *name, int want)
{
	char p[4200];
	struct zinf_safetensors *st = (void *)0x1;
	int rc = zinf_safetensors_open(at(p, name), &st);
	cr_assert_eq(rc, want, "open %s: %d (%s), expected %d", name, rc, zinf_last_error(), want);
	cr_assert_eq(st, (void *)0x1, "*out changed by a refused open");
}

static struct zinf_safetensors *
open_ok(const char *path)
{
	struct zinf_safetensors *st = NULL;
	int rc = zinf_safetensors_open(path, &st);
	cr_assert_eq(rc, 0, "open %s: %d %s", path, rc, zinf_last_error());
	return st;
}

static struct zinf_safetensors_info
info_of(const struct zinf_safetensors *st, const char *name)
{
	int i = zinf_safetensors_find(st, name);
	cr_assert_geq(i, 0, "tensor %s not found", name);
	struct zinf_safetensors_info in = {.size = sizeof(in)};
	cr_assert_eq(zinf_safetensors_info(st, (uint32_t)i, &in), 0);
	return in;
}

static float
f32_of_bits(uint32_t u)
{
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* A value every dtype holds exactly (f16 normal range, 7 significant bits): m * 2^e. */
static float
exact_value(uint64_t *rng)
{
	int m = (int)(zt_rand(rng) % 255) - 127;
	int e = (int)(zt_rand(rng) % 16) - 10;
	return ldexpf((float)m, e);
}

/* Values to f16 and bf16 exactly (the values are exact in both), by hand: sign, exponent,
 * mantissa. */
static uint16_t
bf16_exact(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	cr_assert_eq(u & 0xffffu, 0, "%g is not a bf16", f);
	return (uint16_t)(u >> 16);
}

static uint16_t
f16_exact(float f)
{
	if (f == 0) {
		return signbit(f) ? 0x8000 : 0;
	}
	int e;
	float m = frexpf(fabsf(f), &e); /* [0.5, 1) * 2^e */
	uint32_t mant = (uint32_t)ldexpf(m, 11);
	cr_assert_eq(ldexpf((float)mant, e - 11), fabsf(f), "%g is not an f16", f);
	return (uint16_t)((f < 0 ? 0x8000 : 0) | ((uint32_t)(e - 1 + 15) << 10) | (mant & 0x3ff));
}

static void
store_exact(void *out, enum zinf_dtype dt, size_t i, float f)
{
	if (dt == ZINF_F32) {
		((float *)out)[i] = f;
	} else {
		((uint16_t *)out)[i] = dt == ZINF_BF16 ? bf16_exact(f) : f16_exact(f);
	}
}

static size_t
count_files(void)
{
	DIR *d = opendir(dir);
	cr_assert_not_null(d);
	size_t n = 0;
	struct dirent *de;
	while ((de = readdir(d))) {
		n += strcmp(de->d_name, ".") && strcmp(de->d_name, "..");
	}
	closedir(d);
	return n;
}

static bool
exists(const char *name)
{
	char p[4200];
	struct stat sb;
	return stat(at(p, name), &sb) == 0;
}

/* ---- refusals of a file's header ---------------------------------------------------------- */

Test(safetensors, file_shorter_than_the_header_length)
{
	char p[4200];
	FILE *f = fopen(at(p, "short.safetensors"), "wb");
	fwrite("\x02\0\0\0\0", 1, 5, f);
	fclose(f);
	refused("short.safetensors", -EBADMSG);
	says(p, "5 bytes", "shorter than the 8-byte header length", NULL);
}

Test(safetensors, header_length_past_the_end_of_the_file)
{
	put_file("past.safetensors", 1000, "{}", NULL, 0);
	refused("past.safetensors", -EBADMSG);
	says("past.safetensors", "header length 1000", "past the end", "(10 bytes)", NULL);
}

Test(safetensors, header_length_above_the_cap)
{
	put_file("cap.safetensors", 100000001ull, "{}", NULL, 0);
	refused("cap.safetensors", -EBADMSG);
	says("cap.safetensors", "header length 100000001", "above the cap of 100000000", NULL);
}

Test(safetensors, header_that_is_not_json)
{
	put_file("json.safetensors", UINT64_MAX, "{\"a\": [1, ", NULL, 0);
	refused("json.safetensors", -EBADMSG);
	says("json.safetensors", "the header is not JSON", NULL);
	put_file("trail.safetensors", UINT64_MAX, "{} x", NULL, 0);
	refused("trail.safetensors", -EBADMSG);
	says("trail.safetensors", "not JSON", NULL);
}

Test(safetensors, header_that_does_not_start_with_a_brace)
{
	put_file("array.safetensors", UINT64_MAX, "[1, 2]  ", NULL, 0);
	refused("array.safetensors", -EBADMSG);
	says("array.safetensors", "does not start with '{'", NULL);
	put_file("empty.safetensors", UINT64_MAX, "", NULL, 0);
	refused("empty.safetensors", -EBADMSG);
	says("empty.safetensors", "does not start with '{'", NULL);
}

Test(safetensors, header_with_a_name_twice)
{
	const char *h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
			"\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}";
	put_file("dup.safetensors", UINT64_MAX, h, "\0\0\0\0\0\0\0\0", 8);
	refused("dup.safetensors", -EBADMSG);
	says("dup.safetensors", "duplicate", NULL);
}

Test(safetensors, unknown_dtype)
{
	const char *h = "{\"w\":{\"dtype\":\"F33\",\"shape\":[1],\"data_offsets\":[0,4]}}";
	put_file("dt.safetensors", UINT64_MAX, h, "\0\0\0\0", 4);
	refused("dt.safetensors", -EBADMSG);
	says("dt.safetensors", "tensor \"w\"", "unknown dtype \"F33\"", NULL);
}

Test(safetensors, more_dimensions_than_zinf_reads)
{
	const char *h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],"
			"\"data_offsets\":[0,4]}}";
	put_file("dims.safetensors", UINT64_MAX, h, "\0\0\0\0", 4);
	refused("dims.safetensors", -EBADMSG);
	says("dims.safetensors", "tensor \"w\"", "9 dimensions", "up to 8", NULL);
}

Test(safetensors, shape_and_dtype_that_do_not_fill_the_byte_span)
{
	static const char data[24];
	const char *h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}";
	put_file("span.safetensors", UINT64_MAX, h, data, 20);
	refused("span.safetensors", -EBADMSG);
	says("span.safetensors", "tensor \"w\"", "shape [2, 3] of F32 is 24 bytes",
	     "data_offsets [0, 20] span 20", NULL);
}

Test(safetensors, shape_that_is_not_counts)
{
	const char *h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,-1],\"data_offsets\":[0,8]}}";
	put_file("neg.safetensors", UINT64_MAX, h, "\0\0\0\0\0\0\0\0", 8);
	refused("neg.safetensors", -EBADMSG);
	says("neg.safetensors", "tensor \"w\"", "shape[1] is not a non-negative integer", NULL);
	h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,16],"
	    "\"data_offsets\":[0,8]}}";
	put_file("big.safetensors", UINT64_MAX, h, "\0\0\0\0\0\0\0\0", 8);
	refused("big.safetensors", -EBADMSG);
	says("big.safetensors", "tensor \"w\"", "overflows 64 bits", NULL);
}

Test(safetensors, sub_byte_dtype_of_a_fractional_byte_count)
{
	const char *h = "{\"w\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}";
	put_file("f4.safetensors", UINT64_MAX, h, "\0\0", 2);
	refused("f4.safetensors", -EBADMSG);
	says("f4.safetensors", "tensor \"w\"", "shape [3] of F4", "not a whole number of bytes",
	     NULL);
}

Test(safetensors, data_offsets_that_are_not_a_range)
{
	const char *h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}";
	put_file("one.safetensors", UINT64_MAX, h, "\0\0\0\0", 4);
	refused("one.safetensors", -EBADMSG);
	says("one.safetensors", "tensor \"w\"", "\"data_offsets\" is not [begin, end]", NULL);
	h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}";
	put_file("back.safetensors", UINT64_MAX, h, "\0\0\0\0", 4);
	refused("back.safetensors", -EBADMSG);
	says("back.safetensors", "tensor \"w\"", "data_offsets [4, 0] end before they begin", NULL);
}

Test(safetensors, data_offsets_outside_the_data_section)
{
	const char *h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
	put_file("out.safetensors", UINT64_MAX, h, "\0\0\0\0", 4);
	refused("out.safetensors", -EBADMSG);
	says("out.safetensors", "tensor \"w\"", "[0, 8] outside the data section of 4 bytes", NULL);
}

Test(safetensors, tensors_that_overlap)
{
	static const char data[12];
	const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
			"\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}";
	put_file("lap.safetensors", UINT64_MAX, h, data, 12);
	refused("lap.safetensors", -EBADMSG);
	says("lap.safetensors", "tensor \"b\"", "[4, 12] overlap tensor \"a\"", "end at 8", NULL);
}

Test(safetensors, hole_between_tensors)
{
	static const char data[20];
	const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
			"\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}";
	put_file("hole.safetensors", UINT64_MAX, h, data, 20);
	refused("hole.safetensors", -EBADMSG);
	says("hole.safetensors", "tensor \"b\"", "bytes [8, 12)", "hole", NULL);
}

Test(safetensors, bytes_past_the_last_tensor)
{
	static const char data[12];
	const char *h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
	put_file("tail.safetensors", UINT64_MAX, h, data, 12);
	refused("tail.safetensors", -EBADMSG);
	says("tail.safetensors", "12 bytes", "end at 8", NULL);
}

Test(safetensors, metadata_that_is_not_text)
{
	put_file("meta.safetensors", UINT64_MAX, "{\"__metadata__\":{\"format\":\"pt\",\"n\":1}}",
		 NULL, 0);
	refused("meta.safetensors", -EBADMSG);
	says("meta.safetensors", "\"__metadata__\": \"n\" is not a string", NULL);
	put_file("entry.safetensors", UINT64_MAX, "{\"w\":[1]}", NULL, 0);
	refused("entry.safetensors", -EBADMSG);
	says("entry.safetensors", "tensor \"w\"", "not an object", NULL);
}

Test(safetensors, missing_file_and_directory_holding_neither_layout)
{
	refused("none.safetensors", -ENOENT);
	says("none.safetensors", NULL);
	char p[4200];
	cr_assert_eq(mkdir(at(p, "empty"), 0755), 0);
	refused("empty", -ENOENT);
	says(p, "neither model.safetensors nor model.safetensors.index.json", NULL);
}

/* ---- refusals of an index ----------------------------------------------------------------- */

/* Shard `name` holding F32 tensors [1] named by the NULL-terminated list. */
static void
put_shard(const char *name, ...)
{
	char h[1024];
	size_t at_ = (size_t)snprintf(h, sizeof(h), "{");
	va_list ap;
	va_start(ap, name);
	int k = 0;
	for (const char *t = va_arg(ap, const char *); t; t = va_arg(ap, const char *), k++) {
		at_ += (size_t)snprintf(h + at_, sizeof(h) - at_,
					"%s\"%s\":{\"dtype\":\"F32\",\"shape\":[1],"
					"\"data_offsets\":[%d,%d]}",
					k ? "," : "", t, 4 * k, 4 * k + 4);
	}
	va_end(ap);
	snprintf(h + at_, sizeof(h) - at_, "}");
	float data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
	put_file(name, UINT64_MAX, h, data, 4 * (size_t)k);
}

Test(safetensors, index_naming_a_missing_shard)
{
	put_shard("a.safetensors", "w", NULL);
	put_text("m.index.json", "{\"weight_map\": {\"w\": \"a.safetensors\", "
				 "\"v\": \"nope.safetensors\"}}");
	refused("m.index.json", -ENOENT);
	says("m.index.json", "nope.safetensors", "tensor \"v\"", "missing", NULL);
}

Test(safetensors, index_mapping_a_tensor_its_shard_lacks)
{
	put_shard("a.safetensors", "w", NULL);
	put_text("m.index.json", "{\"weight_map\": {\"w\": \"a.safetensors\", "
				 "\"x\": \"a.safetensors\"}}");
	refused("m.index.json", -EBADMSG);
	says("m.index.json", "tensor \"x\"", "absent from its shard a.safetensors", NULL);
}

Test(safetensors, index_mapping_a_tensor_to_the_wrong_shard)
{
	put_shard("a.safetensors", "w", NULL);
	put_shard("b.safetensors", "v", NULL);
	put_text("m.index.json", "{\"weight_map\": {\"w\": \"b.safetensors\", "
				 "\"v\": \"a.safetensors\"}}");
	refused("m.index.json", -EBADMSG);
	says("m.index.json", "tensor \"w\"", "absent from its shard b.safetensors",
	     "in a.safetensors", NULL);
}

Test(safetensors, tensor_in_two_shards)
{
	put_shard("a.safetensors", "w", "u", NULL);
	put_shard("b.safetensors", "v", "w", NULL);
	put_text("m.index.json", "{\"weight_map\": {\"w\": \"a.safetensors\", \"u\": "
				 "\"a.safetensors\", \"v\": \"b.safetensors\"}}");
	refused("m.index.json", -EBADMSG);
	says("m.index.json", "tensor \"w\" is in two shards", "a.safetensors", "b.safetensors",
	     NULL);
}

Test(safetensors, shard_holding_a_tensor_the_index_omits)
{
	put_shard("a.safetensors", "w", "extra", NULL);
	put_text("m.index.json", "{\"weight_map\": {\"w\": \"a.safetensors\"}}");
	refused("m.index.json", -EBADMSG);
	says("m.index.json", "shard a.safetensors holds tensor \"extra\"", "omits", NULL);
}

Test(safetensors, index_naming_a_file_outside_its_directory)
{
	put_shard("a.safetensors", "w", NULL);
	put_text("m.index.json", "{\"weight_map\": {\"w\": \"../a.safetensors\"}}");
	refused("m.index.json", -EBADMSG);
	says("m.index.json", "\"w\" maps to \"../a.safetensors\"", NULL);
	put_text("n.index.json", "{\"weight_map\": {\"w\": 3}}");
	refused("n.index.json", -EBADMSG);
	says("n.index.json", "\"w\" maps to no file name", NULL);
}

Test(safetensors, index_without_a_weight_map)
{
	put_text("m.index.json", "{\"metadata\": {\"total_size\": 4}}");
	refused("m.index.json", -EBADMSG);
	says("m.index.json", "no \"weight_map\" object", NULL);
	put_text("n.index.json", "{\"weight_map\": {}, \"metadata\": 3}");
	refused("n.index.json", -EBADMSG);
	says("n.index.json", "\"metadata\" is not an object", NULL);
}

/* ---- reads -------------------------------------------------------------------------------- */

#define PY_FILE ZINF_TEST_FIXTURES "/safetensors/dtypes.safetensors"

/* The file the Python safetensors library wrote (tests/fixtures/safetensors/make_files.py). */
Test(safetensors, file_of_the_python_library_read_back)
{
	struct zinf_safetensors *st = open_ok(PY_FILE);
	cr_assert_eq(zinf_safetensors_count(st), 10);
	/* listed by offset, as the crate laid them out (alignment, then name) */
	static const char *order[] = {"i64",  "f64", "empty", "f32", "scalar",
				      "bf16", "f16", "f8",    "u8",  "bool"};
	static const char *dtn[] = {"I64",  "F64", "F32",     "F32", "F32",
				    "BF16", "F16", "F8_E4M3", "U8",  "BOOL"};
	uint64_t prev_end = 0;
	for (uint32_t i = 0; i < 10; i++) {
		struct zinf_safetensors_info in = {.size = sizeof(in)};
		cr_assert_eq(zinf_safetensors_info(st, i, &in), 0);
		cr_expect_str_eq(in.name, order[i]);
		cr_expect_str_eq(in.dtype_name, dtn[i]);
		cr_expect_str_eq(in.file, PY_FILE);
		cr_expect_eq(zinf_safetensors_find(st, order[i]), (int)i);
		/* the data section starts at 8 + 616 (the crate's header, padded) */
		cr_expect_eq(in.offset, i == 0 ? 624 : prev_end, "%s at %llu", in.name,
			     (unsigned long long)in.offset);
		prev_end = in.offset + in.bytes;
	}
	struct zinf_safetensors_info in = info_of(st, "f32");
	cr_expect_eq(in.dtype, ZINF_SAFETENSORS_F32);
	cr_expect_eq(in.ndim, 2);
	cr_expect_eq(in.shape[0], 2);
	cr_expect_eq(in.shape[1], 3);
	cr_expect_eq(in.shape[2], 0);
	cr_expect_eq(in.numel, 6);
	cr_expect_eq(in.bytes, 24);
	float f[6];
	cr_assert_eq(zinf_safetensors_read(st, (uint32_t)zinf_safetensors_find(st, "f32"), 0, 6,
					   ZINF_F32, f),
		     0);
	const float want32[6] = {0.0f, 1.0f, -2.5f, 3.25f, 1e-30f, -7.0f};
	for (int k = 0; k < 6; k++) {
		cr_expect_eq(f[k], want32[k], "f32[%d] = %g", k, f[k]);
	}
	in = info_of(st, "f16");
	cr_expect_eq(in.dtype, ZINF_SAFETENSORS_F16);
	cr_assert_eq(zinf_safetensors_read(st, (uint32_t)zinf_safetensors_find(st, "f16"), 0, 5,
					   ZINF_F32, f),
		     0);
	const float want16[5] = {1.0f, -2.0f, 0.5f, 65504.0f, 0x1p-24f};
	for (int k = 0; k < 5; k++) {
		cr_expect_eq(f[k], want16[k], "f16[%d] = %g", k, f[k]);
	}
	in = info_of(st, "bf16");
	cr_expect_eq(in.dtype, ZINF_SAFETENSORS_BF16);
	cr_assert_eq(zinf_safetensors_read(st, (uint32_t)zinf_safetensors_find(st, "bf16"), 0, 4,
					   ZINF_F32, f),
		     0);
	const float wantb[4] = {1.0f, -1.5f, 3.140625f, 0x1p100f};
	for (int k = 0; k < 4; k++) {
		cr_expect_eq(f[k], wantb[k], "bf16[%d] = %g", k, f[k]);
	}
	/* F64: exact as double, rounded to nearest as f32 */
	int i64 = zinf_safetensors_find(st, "f64");
	in = info_of(st, "f64");
	cr_expect_eq(in.dtype, ZINF_SAFETENSORS_F64);
	double d[3];
	cr_assert_eq(zinf_safetensors_read_f64(st, (uint32_t)i64, 0, 3, d), 0);
	cr_expect_eq(d[0], 1.0 / 3.0);
	cr_expect_eq(d[1], -2.5);
	cr_expect_eq(d[2], 0.1);
	cr_assert_eq(zinf_safetensors_read(st, (uint32_t)i64, 1, 2, ZINF_F32, f), 0);
	cr_expect_eq(f[0], -2.5f);
	cr_expect_eq(f[1], 0.1f);
	/* a scalar and an empty tensor */
	in = info_of(st, "scalar");
	cr_expect_eq(in.ndim, 0);
	cr_expect_eq(in.numel, 1);
	cr_assert_eq(zinf_safetensors_read(st, (uint32_t)zinf_safetensors_find(st, "scalar"), 0, 1,
					   ZINF_F32, f),
		     0);
	cr_expect_eq(f[0], 7.0f);
	in = info_of(st, "empty");
	cr_expect_eq(in.ndim, 2);
	cr_expect_eq(in.shape[0], 0);
	cr_expect_eq(in.shape[1], 4);
	cr_expect_eq(in.numel, 0);
	cr_expect_eq(in.bytes, 0);
	cr_expect_eq(zinf_safetensors_read(st, (uint32_t)zinf_safetensors_find(st, "empty"), 0, 0,
					   ZINF_F32, NULL),
		     0);
	/* the types zinf does not read are listed with their names */
	const char *other[] = {"i64", "u8", "bool", "f8"};
	const uint64_t other_bytes[] = {24, 2, 3, 2};
	for (int k = 0; k < 4; k++) {
		in = info_of(st, other[k]);
		cr_expect_eq(in.dtype, ZINF_SAFETENSORS_OTHER, "%s", other[k]);
		cr_expect_eq(in.bytes, other_bytes[k], "%s", other[k]);
	}
	zinf_safetensors_close(st);
}

Test(safetensors, read_of_a_type_zinf_does_not_read)
{
	struct zinf_safetensors *st = open_ok(PY_FILE);
	float f[3];
	int i = zinf_safetensors_find(st, "i64");
	cr_assert_eq(zinf_safetensors_read(st, (uint32_t)i, 0, 3, ZINF_F32, f), -EOPNOTSUPP);
	says(PY_FILE, "tensor \"i64\"", "stored as I64", NULL);
	double d[3];
	cr_assert_eq(zinf_safetensors_read_f64(st, (uint32_t)i, 0, 3, d), -EOPNOTSUPP);
	zinf_safetensors_close(st);
}

Test(safetensors, read_past_the_end_and_bad_arguments)
{
	struct zinf_safetensors *st = open_ok(PY_FILE);
	float f[8];
	uint32_t i = (uint32_t)zinf_safetensors_find(st, "f32");
	cr_expect_eq(zinf_safetensors_read(st, i, 4, 3, ZINF_F32, f), -EINVAL);
	says(PY_FILE, "tensor \"f32\"", "[4, 4 + 3) past its 6", NULL);
	cr_expect_eq(zinf_safetensors_read(st, i, 7, 0, ZINF_F32, f), -EINVAL);
	cr_expect_eq(zinf_safetensors_read(st, i, UINT64_MAX, 2, ZINF_F32, f), -EINVAL);
	cr_expect_eq(zinf_safetensors_read(st, 10, 0, 1, ZINF_F32, f), -EINVAL);
	cr_expect_eq(zinf_safetensors_read(st, i, 0, 1, (enum zinf_dtype)7, f), -EINVAL);
	cr_expect_eq(zinf_safetensors_read(st, i, 0, 1, ZINF_F32, NULL), -EINVAL);
	cr_expect_eq(zinf_safetensors_read(NULL, 0, 0, 1, ZINF_F32, f), -EINVAL);
	struct zinf_safetensors_info in = {.size = 4};
	cr_expect_eq(zinf_safetensors_info(st, 0, &in), -EINVAL);
	in.size = offsetof(struct zinf_safetensors_info, dtype_name); /* an older, smaller one */
	cr_expect_eq(zinf_safetensors_info(st, 0, &in), 0);
	cr_expect_str_eq(in.name, "i64");
	cr_expect_null(in.dtype_name, "written past the caller's size");
	in.size = sizeof(in);
	cr_expect_eq(zinf_safetensors_info(st, 10, &in), -EINVAL);
	cr_expect_eq(zinf_safetensors_open(NULL, &st), -EINVAL);
	zinf_safetensors_close(st);
	zinf_safetensors_close(NULL);
}

static unsigned log_lines;

static void
count_line(void *ctx, enum zinf_log_level level, const char *file, int line, const char *func,
	   const char *msg)
{
	log_lines++;
}

Test(safetensors, find_of_a_missing_name_logs_nothing)
{
	struct zinf_safetensors *st = open_ok(PY_FILE);
	zinf_log_set_callback(count_line, NULL);
	cr_expect_eq(zinf_safetensors_find(st, "nope"), -ENOENT);
	cr_expect_eq(zinf_safetensors_find(st, ""), -ENOENT);
	cr_expect_eq(log_lines, 0, "a missing name was logged");
	cr_expect_eq(zinf_safetensors_find(st, NULL), -EINVAL);
	cr_expect_eq(log_lines, 1, "a NULL name was not logged");
	zinf_log_set_callback(NULL, NULL);
	zinf_safetensors_close(st);
}

Test(safetensors, file_truncated_after_open_is_an_io_error)
{
	char p[4200];
	float data[4] = {1, 2, 3, 4};
	const char *h = "{\"w\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
	put_file("t.safetensors", UINT64_MAX, h, data, 16);
	struct zinf_safetensors *st = open_ok(at(p, "t.safetensors"));
	cr_assert_eq(truncate(p, (off_t)(8 + strlen(h) + 8)), 0);
	float f[4];
	cr_expect_eq(zinf_safetensors_read(st, 0, 0, 4, ZINF_F32, f), -EIO);
	says(p, "changed since it was opened", NULL);
	zinf_safetensors_close(st);
}

/* A file written by hand: the header's key order is not the data's, padded with spaces; the
 * listing follows the offsets and the lookup the names. */
Test(safetensors, hand_made_file_listed_by_offset)
{
	char p[4200];
	const char *h = "{\"z\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[8,12]},"
			"\"__metadata__\":{\"format\":\"pt\"},"
			"\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
			"\"s\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[12,14]}}   ";
	unsigned char data[14];
	float a[2] = {1.5f, -3.0f};
	uint16_t z[2] = {0x3f80, 0xc040}, s = 0x4200; /* bf16 1, -3; f16 3 */
	memcpy(data, a, 8);
	memcpy(data + 8, z, 4);
	memcpy(data + 12, &s, 2);
	put_file("h.safetensors", UINT64_MAX, h, data, 14);
	struct zinf_safetensors *st = open_ok(at(p, "h.safetensors"));
	cr_assert_eq(zinf_safetensors_count(st), 3);
	const char *order[] = {"a", "z", "s"};
	for (uint32_t i = 0; i < 3; i++) {
		struct zinf_safetensors_info in = {.size = sizeof(in)};
		cr_assert_eq(zinf_safetensors_info(st, i, &in), 0);
		cr_expect_str_eq(in.name, order[i]);
	}
	cr_expect_str_eq(zinf_safetensors_path(st), p);
	struct zinf_safetensors_info in = info_of(st, "s");
	cr_expect_eq(in.offset, 8 + strlen(h) + 12);
	float f[2];
	cr_assert_eq(zinf_safetensors_read(st, 1, 0, 2, ZINF_F32, f), 0);
	cr_expect_eq(f[0], 1.0f);
	cr_expect_eq(f[1], -3.0f);
	uint16_t hbits;
	cr_assert_eq(zinf_safetensors_read(st, 2, 0, 1, ZINF_BF16, &hbits), 0);
	cr_expect_eq(hbits, 0x4040, "f16 3.0 as bf16: 0x%04x", hbits);
	cr_assert_eq(zinf_safetensors_read(st, 0, 1, 1, ZINF_F16, &hbits), 0);
	cr_expect_eq(hbits, 0xc200, "f32 -3.0 as f16: 0x%04x", hbits);
	zinf_safetensors_close(st);
}

/* ---- the writer, read back ---------------------------------------------------------------- */

static struct zinf_safetensors_writer *
writer(const char *path, uint64_t shard_bytes, bool overwrite)
{
	struct zinf_safetensors_writer_opts o;
	zinf_safetensors_writer_opts_init(&o);
	o.shard_bytes = shard_bytes;
	o.overwrite = overwrite;
	struct zinf_safetensors_writer *w = NULL;
	int rc = zinf_safetensors_writer_create(path, &o, &w);
	cr_assert_eq(rc, 0, "create %s: %d %s", path, rc, zinf_last_error());
	return w;
}

static const enum zinf_dtype all_dt[3] = {ZINF_F32, ZINF_F16, ZINF_BF16};

/* Every stored x source x read dtype, values that every type holds: all exact. Ranges of
 * random lengths on both sides. */
Test(safetensors, round_trip_every_dtype_pair)
{
	uint64_t rng = zt_seed();
	enum { N = 1000 };
	float val[9][N];
	char p[4200];
	struct zinf_safetensors_writer *w = writer(at(p, "rt.safetensors"), 0, false);
	for (int k = 0; k < 9; k++) {
		char name[32];
		snprintf(name, sizeof(name), "t%d.%s.from_%s", k, zinf_dtype_name(all_dt[k / 3]),
			 zinf_dtype_name(all_dt[k % 3]));
		uint64_t shape[2] = {N / 10, 10};
		cr_assert_eq(zinf_safetensors_writer_add(w, name, all_dt[k / 3], 2, shape), k);
		for (int e = 0; e < N; e++) {
			val[k][e] = exact_value(&rng);
		}
	}
	/* tensors out of order (8 first), each in ragged ranges from its source dtype */
	for (int kk = 0; kk < 9; kk++) {
		int k = 8 - kk;
		enum zinf_dtype src = all_dt[k % 3];
		char buf[N * 4];
		for (int e = 0; e < N; e++) {
			store_exact(buf, src, (size_t)e, val[k][e]);
		}
		for (uint64_t e = 0; e < N;) {
			uint64_t len = 1 + zt_rand(&rng) % 300, n = ZINF_MIN(len, N - e);
			int rc = zinf_safetensors_writer_write(w, (uint32_t)k, e, n, src,
							       buf + e * zinf_dtype_size(src));
			cr_assert_eq(rc, 0, "%d %s", rc, zinf_last_error());
			e += n;
		}
	}
	cr_assert_eq(zinf_safetensors_writer_finish(w), 1);
	zinf_safetensors_writer_destroy(w);
	struct zinf_safetensors *st = open_ok(p);
	cr_assert_eq(zinf_safetensors_count(st), 9);
	for (uint32_t k = 0; k < 9; k++) {
		struct zinf_safetensors_info in = {.size = sizeof(in)};
		cr_assert_eq(zinf_safetensors_info(st, k, &in), 0);
		static const char *stored[] = {"F32", "F16", "BF16"};
		cr_expect_str_eq(in.dtype_name, stored[k / 3]);
		cr_expect_eq(in.ndim, 2);
		cr_expect_eq(in.shape[0], N / 10);
		for (int r = 0; r < 3; r++) {
			char got[N * 4], want[N * 4];
			for (uint64_t e = 0; e < N;) {
				uint64_t len = 1 + zt_rand(&rng) % 400, n = ZINF_MIN(len, N - e);
				cr_assert_eq(
					zinf_safetensors_read(st, k, e, n, all_dt[r],
							      got + e * zinf_dtype_size(all_dt[r])),
					0);
				e += n;
			}
			for (int e = 0; e < N; e++) {
				store_exact(want, all_dt[r], (size_t)e, val[k][e]);
			}
			cr_expect_eq(memcmp(got, want, N * zinf_dtype_size(all_dt[r])), 0,
				     "tensor %s read as %s differs", in.name,
				     zinf_dtype_name(all_dt[r]));
		}
		double d[N];
		cr_assert_eq(zinf_safetensors_read_f64(st, k, 0, N, d), 0);
		for (int e = 0; e < N; e++) {
			cr_assert_eq(d[e], (double)val[k][e], "%s[%d] as f64", in.name, e);
		}
	}
	zinf_safetensors_close(st);
}

/* f32 to bf16 and f16, rounded to nearest, ties to even: bit patterns worked by hand. */
Test(safetensors, rounding_to_bf16_and_f16_is_to_nearest_even)
{
	const float in[] = {
		1.0f + 0x1p-8f,		   /* bf16 tie between 0x3f80 and 0x3f81: even 0x3f80 */
		1.0f + 3 * 0x1p-8f,	   /* tie between 0x3f81 and 0x3f82: 0x3f82 */
		1.0f + 0x1p-8f + 0x1p-20f, /* above the tie: 0x3f81 */
		-(1.0f + 0x1p-8f),	   /* 0xbf80 */
		f32_of_bits(0x7f7fffffu),  /* FLT_MAX: rounds up to infinity 0x7f80 */
		INFINITY,		   /* 0x7f80 */
		1.0f + 0x1p-11f,	   /* f16 tie between 0x3c00 and 0x3c01: 0x3c00 */
		1.0f + 3 * 0x1p-11f,	   /* tie between 0x3c01 and 0x3c02: 0x3c02 */
		65520.0f,		   /* f16: overflows to infinity 0x7c00 */
		65519.0f,		   /* f16: 65504, 0x7bff */
		0x1p-25f,		   /* f16: half the smallest subnormal, tie to 0 */
		3 * 0x1p-26f,		   /* f16: 0.75 of the smallest subnormal: 0x0001 */
	};
	const uint16_t bf[] = {0x3f80, 0x3f82, 0x3f81, 0xbf80, 0x7f80, 0x7f80,
			       0x3f80, 0x3f80, 0x4780, 0x4780, 0x3300, 0x3340};
	const uint16_t hf[] = {0x3c04, 0x3c0c, 0x3c04, 0xbc04, 0x7c00, 0x7c00,
			       0x3c00, 0x3c02, 0x7c00, 0x7bff, 0x0000, 0x0001};
	enum { N = sizeof(in) / sizeof(in[0]) };
	char p[4200];
	struct zinf_safetensors_writer *w = writer(at(p, "r.safetensors"), 0, false);
	uint64_t shape[1] = {N};
	cr_assert_eq(zinf_safetensors_writer_add(w, "bf", ZINF_BF16, 1, shape), 0);
	cr_assert_eq(zinf_safetensors_writer_add(w, "hf", ZINF_F16, 1, shape), 1);
	cr_assert_eq(zinf_safetensors_writer_add(w, "nan", ZINF_BF16, 0, NULL), 2);
	cr_assert_eq(zinf_safetensors_writer_write(w, 0, 0, N, ZINF_F32, in), 0);
	cr_assert_eq(zinf_safetensors_writer_write(w, 1, 0, N, ZINF_F32, in), 0);
	float nan = NAN;
	cr_assert_eq(zinf_safetensors_writer_write(w, 2, 0, 1, ZINF_F32, &nan), 0);
	cr_assert_eq(zinf_safetensors_writer_finish(w), 1);
	zinf_safetensors_writer_destroy(w);
	struct zinf_safetensors *st = open_ok(p);
	uint16_t got[N];
	cr_assert_eq(zinf_safetensors_read(st, 0, 0, N, ZINF_BF16, got), 0);
	for (int k = 0; k < N; k++) {
		cr_expect_eq(got[k], bf[k], "bf16 of %a: 0x%04x, expected 0x%04x", in[k], got[k],
			     bf[k]);
	}
	cr_assert_eq(zinf_safetensors_read(st, 1, 0, N, ZINF_F16, got), 0);
	for (int k = 0; k < N; k++) {
		cr_expect_eq(got[k], hf[k], "f16 of %a: 0x%04x, expected 0x%04x", in[k], got[k],
			     hf[k]);
	}
	float f;
	cr_assert_eq(zinf_safetensors_read(st, 2, 0, 1, ZINF_F32, &f), 0);
	cr_expect(isnan(f), "NaN stored as bf16 reads %g", f);
	zinf_safetensors_close(st);
}

/* A tensor of 700001 elements: more than the writer's 4 MiB conversion buffer in f32 and the
 * reader's 1 MiB bounce buffer, written and read in ragged ranges with conversions. */
Test(safetensors, large_tensor_through_the_bounce_buffers)
{
	enum { N = 700001 };
	uint64_t rng = zt_seed();
	float *v = malloc(N * sizeof(float)), *got = malloc(N * sizeof(float));
	uint16_t *h = malloc(N * 2);
	double *d = malloc(N * sizeof(double));
	for (int e = 0; e < N; e++) {
		v[e] = exact_value(&rng);
	}
	char p[4200];
	struct zinf_safetensors_writer *w = writer(at(p, "big.safetensors"), 0, false);
	uint64_t s1[1] = {N}, s2[3] = {7, 1, 100000};
	cr_assert_eq(zinf_safetensors_writer_add(w, "big", ZINF_BF16, 1, s1), 0);
	cr_assert_eq(zinf_safetensors_writer_add(w, "f32", ZINF_F32, 3, s2), 1);
	for (uint64_t e = 0; e < N; e += 123457) {
		uint64_t n = ZINF_MIN(123457u, N - e);
		cr_assert_eq(zinf_safetensors_writer_write(w, 0, e, n, ZINF_F32, v + e), 0);
	}
	cr_assert_eq(zinf_safetensors_writer_write(w, 1, 0, 700000, ZINF_F32, v), 0);
	cr_assert_eq(zinf_safetensors_writer_finish(w), 1);
	zinf_safetensors_writer_destroy(w);
	struct zinf_safetensors *st = open_ok(p);
	for (uint64_t e = 0; e < N; e += 300001) {
		uint64_t n = ZINF_MIN(300001u, N - e);
		cr_assert_eq(zinf_safetensors_read(st, 0, e, n, ZINF_F32, got + e), 0);
	}
	cr_expect_eq(memcmp(got, v, N * sizeof(float)), 0, "bf16 read as f32 differs");
	cr_assert_eq(zinf_safetensors_read(st, 0, 0, N, ZINF_F16, h), 0);
	for (int e = 0; e < N; e++) {
		cr_assert_eq(h[e], f16_exact(v[e]), "bf16 read as f16 at %d", e);
	}
	cr_assert_eq(zinf_safetensors_read_f64(st, 1, 0, 700000, d), 0);
	for (int e = 0; e < 700000; e++) {
		cr_assert_eq(d[e], (double)v[e], "f32 read as f64 at %d", e);
	}
	zinf_safetensors_close(st);
	free(v);
	free(got);
	free(h);
	free(d);
}

/* Reads of one handle from several threads at once (pread, a buffer per call): each thread
 * reads its own ragged ranges of one tensor, converting, and gets the values. */
struct reader_arg {
	const struct zinf_safetensors *st;
	const float *want;
	uint64_t n, first;
	int rc, bad;
};

static void *
reader_thread(void *p)
{
	struct reader_arg *a = p;
	float *got = malloc(a->n * sizeof(float));
	for (int round = 0; round < 20 && !a->rc; round++) {
		for (uint64_t e = 0; e < a->n && !a->rc; e += 7919) {
			uint64_t k = ZINF_MIN(7919u, a->n - e);
			a->rc = zinf_safetensors_read(a->st, 0, a->first + e, k, ZINF_F32, got + e);
		}
		a->bad += memcmp(got, a->want + a->first, a->n * sizeof(float)) != 0;
	}
	free(got);
	return NULL;
}

Test(safetensors, concurrent_reads_of_one_handle)
{
	enum { N = 1 << 18, THREADS = 4 };
	uint64_t rng = zt_seed();
	float *v = malloc(N * sizeof(float));
	for (int e = 0; e < N; e++) {
		v[e] = exact_value(&rng);
	}
	char p[4200];
	struct zinf_safetensors_writer *w = writer(at(p, "c.safetensors"), 0, false);
	uint64_t n = N;
	cr_assert_eq(zinf_safetensors_writer_add(w, "w", ZINF_BF16, 1, &n), 0);
	cr_assert_eq(zinf_safetensors_writer_write(w, 0, 0, N, ZINF_F32, v), 0);
	cr_assert_eq(zinf_safetensors_writer_finish(w), 1);
	zinf_safetensors_writer_destroy(w);
	struct zinf_safetensors *st = open_ok(p);
	pthread_t th[THREADS];
	struct reader_arg a[THREADS];
	for (int k = 0; k < THREADS; k++) {
		a[k] = (struct reader_arg){.st = st,
					   .want = v,
					   .n = N / THREADS,
					   .first = (uint64_t)k * (N / THREADS)};
		cr_assert_eq(pthread_create(&th[k], NULL, reader_thread, &a[k]), 0);
	}
	for (int k = 0; k < THREADS; k++) {
		pthread_join(th[k], NULL);
		cr_expect_eq(a[k].rc, 0, "thread %d: %d", k, a[k].rc);
		cr_expect_eq(a[k].bad, 0, "thread %d read wrong values %d times", k, a[k].bad);
	}
	zinf_safetensors_close(st);
	free(v);
}

/* The bytes of a written file, by the format's rules. */
Test(safetensors, written_file_has_the_formats_layout)
{
	char p[4200];
	struct zinf_safetensors_writer *w = writer(dir, 0, false); /* a directory */
	uint64_t s[2] = {2, 3};
	cr_assert_eq(zinf_safetensors_writer_add(w, "b", ZINF_F32, 2, s), 0);
	cr_assert_eq(zinf_safetensors_writer_add(w, "a", ZINF_BF16, 1, s), 1);
	float x[6] = {1, 2, 3, 4, 5, 6};
	cr_assert_eq(zinf_safetensors_writer_write(w, 1, 0, 2, ZINF_F32, x), 0);
	cr_assert_eq(zinf_safetensors_writer_write(w, 0, 0, 6, ZINF_F32, x), 0);
	cr_assert_eq(zinf_safetensors_writer_finish(w), 1);
	zinf_safetensors_writer_destroy(w);
	cr_expect_eq(count_files(), 1, "a temporary file left beside model.safetensors");
	FILE *f = fopen(at(p, "model.safetensors"), "rb");
	cr_assert_not_null(f, "a directory means DIR/model.safetensors");
	unsigned char buf[512];
	size_t len = fread(buf, 1, sizeof(buf), f);
	fclose(f);
	uint64_t n = 0;
	for (int k = 0; k < 8; k++) {
		n |= (uint64_t)buf[k] << (8 * k);
	}
	cr_assert_eq(n % 8, 0, "header length %llu not a multiple of 8", (unsigned long long)n);
	cr_assert_eq(len, 8 + n + 24 + 4);
	const char *want = "{\"b\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
			   "\"a\":{\"dtype\":\"BF16\",\"shape\":[2],\"data_offsets\":[24,28]},"
			   "\"__metadata__\":{\"format\":\"pt\"}}";
	size_t wl = strlen(want);
	cr_assert_eq(memcmp(buf + 8, want, wl), 0, "header: %.*s", (int)n, buf + 8);
	cr_expect_eq(ZINF_ALIGN_UP(wl, 8), n, "padded to the next multiple of 8 only");
	for (size_t k = wl; k < n; k++) {
		cr_expect_eq(buf[8 + k], ' ', "padding byte %zu", k);
	}
	cr_expect_eq(memcmp(buf + 8 + n, x, 24), 0, "F32 data in place");
	const unsigned char a[4] = {0x80, 0x3f, 0x00, 0x40}; /* bf16 1, 2 little-endian */
	cr_expect_eq(memcmp(buf + 8 + n + 24, a, 4), 0, "BF16 data in place");
}

/* Five tensors of 400, 1200, 200, 800 and 40 bytes at 1000 bytes a shard, cut as
 * huggingface_hub's split_state_dict_into_shards_factory cuts them (worked by hand from it): the
 * 1200 is a shard of its own, numbered when it comes, before the shard being filled, which the
 * 800 closes: 1: [1200], 2: [400 200], 3: [800 40] (a cut that closed the shard at the big
 * tensor would make 4: [400] [1200] [200 800] [40]). */
Test(safetensors, sharded_write_opened_through_the_index)
{
	char p[4200];
	struct zinf_safetensors_writer *w = writer(at(p, "model.safetensors"), 1000, false);
	const uint64_t n[5] = {100, 300, 50, 200, 10};
	const char *names[5] = {"model.embed.weight", "model.layers.0.w", "model.layers.0.b",
				"model.layers.1.w", "lm_head.weight"};
	for (int k = 0; k < 5; k++) {
		cr_assert_eq(zinf_safetensors_writer_add(w, names[k], ZINF_F32, 1, &n[k]), k);
	}
	float v[300];
	for (int k = 4; k >= 0; k--) {
		for (uint64_t e = 0; e < n[k]; e++) {
			v[e] = (float)(k * 1000 + (int)e);
		}
		cr_assert_eq(zinf_safetensors_writer_write(w, (uint32_t)k, 0, n[k], ZINF_F32, v), 0,
			     "%s", zinf_last_error());
	}
	cr_assert_eq(zinf_safetensors_writer_finish(w), 3);
	zinf_safetensors_writer_destroy(w);
	cr_expect_not(exists("model.safetensors"), "a single file beside the shards");
	cr_expect_eq(count_files(), 4, "3 shards and the index, no temporary left");
	/* the index */
	json_error_t je;
	json_t *ix = json_load_file(at(p, "model.safetensors.index.json"), 0, &je);
	cr_assert_not_null(ix, "%s", je.text);
	cr_expect_eq(
		json_integer_value(json_object_get(json_object_get(ix, "metadata"), "total_size")),
		2640);
	const json_t *wm = json_object_get(ix, "weight_map");
	const int want_shard[5] = {2, 1, 2, 3, 3};
	cr_assert_eq(json_object_size(wm), 5);
	for (int k = 0; k < 5; k++) {
		char sh[64];
		snprintf(sh, sizeof(sh), "model-%05d-of-00003.safetensors", want_shard[k]);
		cr_expect_str_eq(json_string_value(json_object_get(wm, names[k])), sh, "%s",
				 names[k]);
	}
	json_decref(ix);
	/* the directory, the index and one shard alone */
	char ip[4200];
	const char *via[2] = {dir, at(ip, "model.safetensors.index.json")};
	for (int k = 0; k < 2; k++) {
		struct zinf_safetensors *st = open_ok(via[k]);
		cr_expect_str_eq(zinf_safetensors_path(st), ip);
		cr_assert_eq(zinf_safetensors_count(st), 5);
		for (int t = 0; t < 5; t++) {
			struct zinf_safetensors_info in = info_of(st, names[t]);
			char sh[64];
			snprintf(sh, sizeof(sh), "/model-%05d-of-00003.safetensors", want_shard[t]);
			cr_expect(strstr(in.file, sh), "%s in %s", names[t], in.file);
			cr_expect_eq(in.numel, n[t]);
			float got[300];
			uint32_t i = (uint32_t)zinf_safetensors_find(st, names[t]);
			cr_assert_eq(zinf_safetensors_read(st, i, 0, n[t], ZINF_F32, got), 0);
			for (uint64_t e = 0; e < n[t]; e++) {
				cr_assert_eq(got[e], (float)(t * 1000 + (int)e), "%s[%llu]",
					     names[t], (unsigned long long)e);
			}
		}
		zinf_safetensors_close(st);
	}
	struct zinf_safetensors *st = open_ok(at(p, "model-00003-of-00003.safetensors"));
	cr_expect_eq(zinf_safetensors_count(st), 2);
	cr_expect_geq(zinf_safetensors_find(st, "model.layers.1.w"), 0);
	zinf_safetensors_close(st);
}

/* A directory holding both layouts is read as transformers' from_pretrained reads it: the
 * single file first (a stale index beside it is not taken). */
Test(safetensors, directory_with_both_layouts_reads_the_single_file)
{
	char p[4200];
	uint64_t n = 4;
	float one[4] = {1, 1, 1, 1}, two[4] = {2, 2, 2, 2};
	/* shards of "old" (two tensors over two shards), then a single file of "new" */
	struct zinf_safetensors_writer *w = writer(at(p, "model.safetensors"), 16, false);
	cr_assert_eq(zinf_safetensors_writer_add(w, "old.a", ZINF_F32, 1, &n), 0);
	cr_assert_eq(zinf_safetensors_writer_add(w, "old.b", ZINF_F32, 1, &n), 1);
	cr_assert_eq(zinf_safetensors_writer_write(w, 0, 0, n, ZINF_F32, one), 0);
	cr_assert_eq(zinf_safetensors_writer_write(w, 1, 0, n, ZINF_F32, one), 0);
	cr_assert_eq(zinf_safetensors_writer_finish(w), 2);
	zinf_safetensors_writer_destroy(w);
	/* (the writer refuses to lay a single file beside an index: made aside, renamed in) */
	char q[4200];
	w = writer(at(q, "other.safetensors"), 0, false);
	cr_assert_eq(zinf_safetensors_writer_add(w, "new", ZINF_F32, 1, &n), 0);
	cr_assert_eq(zinf_safetensors_writer_write(w, 0, 0, n, ZINF_F32, two), 0, "%s",
		     zinf_last_error());
	cr_assert_eq(zinf_safetensors_writer_finish(w), 1, "%s", zinf_last_error());
	zinf_safetensors_writer_destroy(w);
	cr_assert_eq(rename(q, at(p, "model.safetensors")), 0);
	cr_assert(exists("model.safetensors.index.json"));
	struct zinf_safetensors *st = open_ok(dir);
	cr_expect_str_eq(zinf_safetensors_path(st), at(p, "model.safetensors"));
	cr_expect_eq(zinf_safetensors_count(st), 1);
	cr_expect_geq(zinf_safetensors_find(st, "new"), 0);
	zinf_safetensors_close(st);
}

Test(safetensors, tensor_larger_than_a_shard_takes_one_of_its_own)
{
	char p[4200];
	struct zinf_safetensors_writer *w = writer(at(p, "w.safetensors"), 100, false);
	const uint64_t n[3] = {10, 1000, 10};
	float v[1000] = {0};
	for (int k = 0; k < 3; k++) {
		char name[8];
		snprintf(name, sizeof(name), "t%d", k);
		cr_assert_eq(zinf_safetensors_writer_add(w, name, ZINF_F32, 1, &n[k]), k);
	}
	for (int k = 0; k < 3; k++) {
		cr_assert_eq(zinf_safetensors_writer_write(w, (uint32_t)k, 0, n[k], ZINF_F32, v),
			     0);
	}
	/* t1 (4000 bytes) is shard 1 when it comes; t0 and t2 (40 bytes each) fill shard 2 */
	cr_assert_eq(zinf_safetensors_writer_finish(w), 2);
	zinf_safetensors_writer_destroy(w);
	const uint32_t want_count[2] = {1, 2};
	const uint64_t want_first[2] = {1000, 10};
	for (int s = 1; s <= 2; s++) {
		char name[64];
		snprintf(name, sizeof(name), "w-%05d-of-00002.safetensors", s);
		struct zinf_safetensors *st = open_ok(at(p, name));
		cr_expect_eq(zinf_safetensors_count(st), want_count[s - 1], "%s", name);
		struct zinf_safetensors_info in = {.size = sizeof(in)};
		cr_assert_eq(zinf_safetensors_info(st, 0, &in), 0);
		cr_expect_eq(in.numel, want_first[s - 1], "%s", name);
		zinf_safetensors_close(st);
	}
	cr_expect(exists("w.safetensors.index.json"));
}

Test(safetensors, one_file_when_the_data_fits_a_shard)
{
	char p[4200];
	struct zinf_safetensors_writer *w = writer(at(p, "model.safetensors"), 1000, false);
	uint64_t n = 250; /* exactly 1000 bytes */
	float v[250] = {0};
	cr_assert_eq(zinf_safetensors_writer_add(w, "w", ZINF_F32, 1, &n), 0);
	cr_assert_eq(zinf_safetensors_writer_write(w, 0, 0, n, ZINF_F32, v), 0);
	cr_assert_eq(zinf_safetensors_writer_finish(w), 1);
	zinf_safetensors_writer_destroy(w);
	cr_expect(exists("model.safetensors"));
	cr_expect_not(exists("model.safetensors.index.json"));
	cr_expect_eq(count_files(), 1);
	/* and no tensor at all: one file of none */
	w = writer(at(p, "none.safetensors"), 0, false);
	cr_assert_eq(zinf_safetensors_writer_finish(w), 1);
	zinf_safetensors_writer_destroy(w);
	struct zinf_safetensors *st = open_ok(p);
	cr_expect_eq(zinf_safetensors_count(st), 0);
	zinf_safetensors_close(st);
}

/* ---- what the writer refuses, and what it leaves ------------------------------------------ */

static struct zinf_safetensors_writer *
writer_refused(const char *path, bool overwrite, int want)
{
	struct zinf_safetensors_writer_opts o;
	zinf_safetensors_writer_opts_init(&o);
	o.overwrite = overwrite;
	struct zinf_safetensors_writer *w = NULL;
	int rc = zinf_safetensors_writer_create(path, &o, &w);
	cr_assert_eq(rc, want, "create %s: %d (%s), expected %d", path, rc, zinf_last_error(),
		     want);
	cr_assert_null(w);
	return w;
}

Test(safetensors, existing_files_are_not_replaced_without_overwrite)
{
	char p[4200];
	put_text("model.safetensors", "old");
	writer_refused(at(p, "model.safetensors"), false, -EEXIST);
	says(p, "exists", "not replaced", NULL);
	writer_refused(dir, false, -EEXIST);
	unlink(p);
	put_text("model.safetensors.index.json", "old");
	writer_refused(at(p, "model.safetensors"), false, -EEXIST);
	says("model.safetensors.index.json", NULL);
	unlink(at(p, "model.safetensors.index.json"));
	put_text("model-00002-of-00003.safetensors", "old");
	writer_refused(at(p, "model.safetensors"), false, -EEXIST);
	says("model-00002-of-00003.safetensors", "a shard of model.safetensors", NULL);
	/* another stem's shards are not this checkpoint's */
	struct zinf_safetensors_writer *w = writer(at(p, "other.safetensors"), 0, false);
	uint64_t n = 1;
	float v = 1;
	cr_assert_eq(zinf_safetensors_writer_add(w, "w", ZINF_F32, 1, &n), 0);
	/* a file that appears after create is not replaced either */
	put_text("other.safetensors", "old");
	cr_assert_eq(zinf_safetensors_writer_write(w, 0, 0, 1, ZINF_F32, &v), -EEXIST);
	cr_assert_eq(zinf_safetensors_writer_finish(w), -EEXIST, "a failed writer stays failed");
	zinf_safetensors_writer_destroy(w);
	FILE *f = fopen(at(p, "other.safetensors"), "r");
	char text[8] = {0};
	cr_assert_eq(fread(text, 1, 7, f), 3);
	fclose(f);
	cr_expect_str_eq(text, "old", "the existing file was changed");
	cr_expect_eq(count_files(), 2, "a temporary file left");
}

Test(safetensors, file_appearing_before_the_rename_is_not_replaced)
{
	char p[4200];
	struct zinf_safetensors_writer *w = writer(at(p, "m.safetensors"), 0, false);
	uint64_t n = 1;
	float v = 1;
	cr_assert_eq(zinf_safetensors_writer_add(w, "w", ZINF_F32, 1, &n), 0);
	cr_assert_eq(zinf_safetensors_writer_write(w, 0, 0, 1, ZINF_F32, &v), 0);
	put_text("m.safetensors", "old");
	cr_assert_eq(zinf_safetensors_writer_finish(w), -EEXIST);
	says("m.safetensors", "appeared while it was written", NULL);
	zinf_safetensors_writer_destroy(w);
	cr_expect_eq(count_files(), 1, "the temporary file left beside the file that appeared");
}

/* Writes of the same tensors, as 3 shards, then one file, then 2 shards, each over the last. */
static int
write_layout(uint64_t shard_bytes, float base)
{
	char p[4200];
	struct zinf_safetensors_writer *w = writer(at(p, "model.safetensors"), shard_bytes, true);
	uint64_t n = 25;
	float v[25];
	for (int k = 0; k < 3; k++) {
		char name[8];
		snprintf(name, sizeof(name), "t%d", k);
		cr_assert_eq(zinf_safetensors_writer_add(w, name, ZINF_F32, 1, &n), k);
	}
	for (int k = 0; k < 3; k++) {
		for (int e = 0; e < 25; e++) {
			v[e] = base + (float)(k * 25 + e);
		}
		cr_assert_eq(zinf_safetensors_writer_write(w, (uint32_t)k, 0, n, ZINF_F32, v), 0);
	}
	int rc = zinf_safetensors_writer_finish(w);
	zinf_safetensors_writer_destroy(w);
	return rc;
}

static void
expect_values(float base)
{
	struct zinf_safetensors *st = open_ok(dir);
	cr_assert_eq(zinf_safetensors_count(st), 3);
	for (uint32_t k = 0; k < 3; k++) {
		float v[25];
		cr_assert_eq(zinf_safetensors_read(st, k, 0, 25, ZINF_F32, v), 0);
		cr_expect_eq(v[24], base + (float)(k * 25 + 24), "t%u from the old write", k);
	}
	zinf_safetensors_close(st);
}

Test(safetensors, overwrite_removes_the_stale_layout)
{
	cr_assert_eq(write_layout(100, 0), 3);
	cr_expect(exists("model-00003-of-00003.safetensors"));
	cr_expect_eq(count_files(), 4);
	expect_values(0);
	cr_assert_eq(write_layout(0, 1000), 1);
	cr_expect_eq(count_files(), 1, "the shards or the index of the last write are left");
	cr_expect(exists("model.safetensors"));
	expect_values(1000);
	cr_assert_eq(write_layout(200, 2000), 2);
	cr_expect_eq(count_files(), 3, "the single file of the last write is left");
	cr_expect(exists("model-00002-of-00002.safetensors"));
	expect_values(2000);
	cr_assert_eq(write_layout(100, 3000), 3);
	cr_expect_eq(count_files(), 4, "a shard of 2 is left among 3");
	cr_expect_not(exists("model-00001-of-00002.safetensors"));
	expect_values(3000);
}

Test(safetensors, writer_refuses_bad_declarations_and_ranges)
{
	char p[4200];
	struct zinf_safetensors_writer *w = writer(at(p, "m.safetensors"), 0, false);
	uint64_t s[9] = {2, 3, 1, 1, 1, 1, 1, 1, 1};
	cr_assert_eq(zinf_safetensors_writer_add(w, "w", ZINF_F32, 2, s), 0);
	cr_expect_eq(zinf_safetensors_writer_add(w, "w", ZINF_F32, 2, s), -EINVAL);
	says("m.safetensors", "tensor \"w\" declared twice", NULL);
	cr_expect_eq(zinf_safetensors_writer_add(w, "__metadata__", ZINF_F32, 1, s), -EINVAL);
	cr_expect_eq(zinf_safetensors_writer_add(w, "x", ZINF_F32, 9, s), -EINVAL);
	says("tensor \"x\"", "9 dimensions", NULL);
	cr_expect_eq(zinf_safetensors_writer_add(w, "x", (enum zinf_dtype)5, 1, s), -EINVAL);
	cr_expect_eq(zinf_safetensors_writer_add(w, "x", ZINF_F32, 1, NULL), -EINVAL);
	cr_expect_eq(zinf_safetensors_writer_add(w, "bad\xff", ZINF_F32, 1, s), -EINVAL);
	says("not valid UTF-8", NULL);
	uint64_t huge[2] = {1ull << 62, 4};
	cr_expect_eq(zinf_safetensors_writer_add(w, "x", ZINF_F32, 2, huge), -EINVAL);
	says("tensor \"x\"", "overflows", NULL);
	cr_assert_eq(zinf_safetensors_writer_add(w, "v", ZINF_BF16, 1, s), 1);
	float v[6] = {1, 2, 3, 4, 5, 6};
	cr_assert_eq(zinf_safetensors_writer_write(w, 0, 0, 3, ZINF_F32, v), 0);
	cr_expect_eq(zinf_safetensors_writer_add(w, "late", ZINF_F32, 1, s), -EINVAL);
	says("tensor \"late\"", "after the first write", NULL);
	cr_expect_eq(zinf_safetensors_writer_write(w, 0, 4, 2, ZINF_F32, v), -EINVAL);
	says("tensor \"w\"", "[4, 4 + 2)", "3 written", NULL);
	cr_expect_eq(zinf_safetensors_writer_write(w, 0, 3, 4, ZINF_F32, v), -EINVAL);
	cr_expect_eq(zinf_safetensors_writer_write(w, 2, 0, 1, ZINF_F32, v), -EINVAL);
	cr_expect_eq(zinf_safetensors_writer_write(w, 1, 0, 1, (enum zinf_dtype)5, v), -EINVAL);
	cr_expect_eq(zinf_safetensors_writer_write(w, 1, 0, 1, ZINF_F32, NULL), -EINVAL);
	cr_expect_eq(zinf_safetensors_writer_finish(w), -EINVAL);
	says("tensor \"w\": 3 of its 6 elements written", NULL);
	/* caller errors leave the writer going: the rest, then finish */
	cr_assert_eq(zinf_safetensors_writer_write(w, 0, 3, 3, ZINF_F32, v + 3), 0);
	cr_assert_eq(zinf_safetensors_writer_write(w, 1, 0, 2, ZINF_F32, v), 0);
	cr_assert_eq(zinf_safetensors_writer_finish(w), 1);
	cr_expect_eq(zinf_safetensors_writer_finish(w), -EINVAL);
	cr_expect_eq(zinf_safetensors_writer_write(w, 1, 2, 0, ZINF_F32, v), -EINVAL);
	zinf_safetensors_writer_destroy(w);
	struct zinf_safetensors *st = open_ok(p);
	float got[6];
	cr_assert_eq(zinf_safetensors_read(st, 0, 0, 6, ZINF_F32, got), 0);
	cr_expect_eq(memcmp(got, v, sizeof(got)), 0);
	zinf_safetensors_close(st);
	zinf_safetensors_writer_destroy(NULL);
}

Test(safetensors, writer_refuses_bad_paths)
{
	char p[4200];
	writer_refused(at(p, "nodir/model.safetensors"), false, -ENOENT);
	says("nodir", "no such directory", NULL);
	writer_refused(at(p, "nodir"), false, -ENOENT);
	put_text("file", "x");
	writer_refused(at(p, "file"), false, -EINVAL);
	says("not a directory", NULL);
	writer_refused(at(p, "file/model.safetensors"), false, -ENOTDIR);
	writer_refused("", false, -EINVAL);
	struct zinf_safetensors_writer *w = NULL;
	cr_expect_eq(zinf_safetensors_writer_create(at(p, "m.safetensors"), NULL, &w), 0,
		     "NULL opts: the defaults");
	zinf_safetensors_writer_destroy(w);
	struct zinf_safetensors_writer_opts o = {.size = 4};
	cr_expect_eq(zinf_safetensors_writer_create(at(p, "m.safetensors"), &o, &w), -EINVAL);
	cr_expect_eq(count_files(), 1, "only the plain file made above");
}

Test(safetensors, abandoned_write_leaves_no_file)
{
	char p[4200];
	struct zinf_safetensors_writer *w = writer(at(p, "model.safetensors"), 8, false);
	uint64_t n = 4;
	float v[4] = {0};
	for (int k = 0; k < 3; k++) {
		char name[8];
		snprintf(name, sizeof(name), "t%d", k);
		cr_assert_eq(zinf_safetensors_writer_add(w, name, ZINF_F32, 1, &n), k);
	}
	cr_assert_eq(zinf_safetensors_writer_write(w, 1, 0, 4, ZINF_F32, v), 0);
	cr_expect_eq(count_files(), 3, "the three shards' temporary files, while writing");
	zinf_safetensors_writer_destroy(w);
	cr_expect_eq(count_files(), 0, "files left after an abandoned write");
}

/* Every allocation of an open (index and shards) and of a sharded write fails in turn: each
 * answers -ENOMEM or succeeds, leaks nothing (under the sanitizers) and leaves no file. */
Test(safetensors, allocation_failures_are_errors)
{
	char p[4200];
	cr_assert_eq(write_layout(100, 0), 3);
	int failed = 0;
	for (long nth = 1; nth < 200; nth++) {
		struct zinf_safetensors *st = NULL;
		zc_test_alloc_fail_nth(nth);
		int rc = zinf_safetensors_open(dir, &st);
		zc_test_alloc_fail_nth(0);
		cr_assert(rc == 0 || rc == -ENOMEM, "open with allocation %ld failing: %d", nth,
			  rc);
		zinf_safetensors_close(st);
		if (rc == 0) {
			break;
		}
		failed++;
	}
	cr_expect_gt(failed, 3, "the open allocated less than expected");
	char sub[4200];
	cr_assert_eq(mkdir(at(sub, "w"), 0755), 0);
	at(p, "w/model.safetensors");
	for (long nth = 1; nth < 200; nth++) {
		struct zinf_safetensors_writer *w = NULL;
		uint64_t n = 25;
		float v[25] = {0};
		zc_test_alloc_fail_nth(nth);
		int rc = zinf_safetensors_writer_create(p, NULL, &w);
		for (int k = 0; k < 3 && rc >= 0; k++) {
			char name[8];
			snprintf(name, sizeof(name), "t%d", k);
			rc = zinf_safetensors_writer_add(w, name, ZINF_F16, 1, &n);
		}
		for (int k = 0; k < 3 && rc >= 0; k++) {
			rc = zinf_safetensors_writer_write(w, (uint32_t)k, 0, n, ZINF_F32, v);
		}
		if (rc >= 0) {
			rc = zinf_safetensors_writer_finish(w);
		}
		zc_test_alloc_fail_nth(0);
		zinf_safetensors_writer_destroy(w);
		cr_assert(rc >= 0 || rc == -ENOMEM, "write with allocation %ld failing: %d", nth,
			  rc);
		DIR *d = opendir(sub);
		struct dirent *de;
		int files = 0;
		while ((de = readdir(d))) {
			files += de->d_name[0] != '.' || strstr(de->d_name, ".tmp");
		}
		closedir(d);
		cr_assert_eq(files, rc >= 0 ? 1 : 0, "allocation %ld failing: %d files left", nth,
			     files);
		if (rc >= 0) {
			break;
		}
	}
}
