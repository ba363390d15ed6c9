/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli/checkpoint.c: `zinf checkpoint inspect DIR` and `zinf checkpoint export DIR --out
 * FILE.safetensors | --hf OUT`, over the offline reader (zinf/checkpoint.h): no engine, no
 * device, no MPI.
 * inspect prints what the manifest says (step, world, stage, dtype, optimizer, the parts and
 * their dtypes, every parameter with its shape and bytes) and checks the CRC32C of every file:
 * exit 0 when all match, 1 naming each bad file, 2 when the checkpoint cannot be opened (the
 * reader's message names the file and field) or the command line is wrong. export refuses to
 * replace an existing output (the file, its index or a shard of it) unless --force, checks the
 * master weights' files first (--no-verify skips it), then writes the safetensors file or its
 * shards and index. With --hf it writes a Hugging Face model directory (zinf_ckpt_export_hf):
 * the config.json it finds (--hf-config, else the one a trainer wrote beside the checkpoints)
 * and the weights under Hugging Face's names and shapes; --shard-size reads transformers'
 * max_shard_size forms ("500MB", "2GB").
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "zinf/checkpoint.h"

static int
open_ckpt(const char *prog, const char *dir, const char *tag, struct zinf_ckpt **c)
{
	int rc = zinf_ckpt_open(dir, tag, c);
	if (rc) {
		/* the reader logged the file and what is wrong */
		fprintf(stderr, "%s: %s: cannot open the checkpoint (%s)\n", prog, dir,
			strerror(-rc));
	}
	return rc;
}

/* ---- inspect ------------------------------------------------------------------------------ */

#define INSPECT "zinf checkpoint inspect"

static struct {
	const char *tag;
	bool json, no_verify;
} ins;

static const struct cli_opt inspect_opts[] = {
	{"tag", CLI_STR, &ins.tag, NULL, "TAG", "the checkpoint DIR/TAG (default: DIR/latest's)"},
	{"no-verify", CLI_FLAG, &ins.no_verify, NULL, NULL,
	 "do not read the files to check their CRC32C (the manifest and the sizes only)"},
	{"json", CLI_FLAG, &ins.json, NULL, NULL, "one JSON object on stdout"},
	{NULL},
};

static const char inspect_synopsis[] = "DIR [--tag TAG] [--no-verify] [--json]";
static const char inspect_description[] =
	"Print a checkpoint's manifest (step, world size, ZeRO stage, dtype, optimizer, state\n"
	"parts, parameters with their shapes) and check the CRC32C of every file. DIR is the\n"
	"directory zinf_engine_save wrote (its `latest` names the checkpoint) or a TAG directory.\n"
	"Exit 0: every file matches; 1: a file is corrupted (named); 2: it cannot be opened.\n"
	"--no-verify reads only the manifest and the files' sizes.\n";

static void
shape_str(char *buf, size_t len, const struct zinf_ckpt_param *p)
{
	size_t at = 0;
	at += (size_t)snprintf(buf + at, len - at, "[");
	for (uint32_t d = 0; d < p->ndim && at < len; d++) {
		at += (size_t)snprintf(buf + at, len - at, "%s%" PRIu64, d ? ", " : "",
				       p->shape[d]);
	}
	if (at < len) {
		snprintf(buf + at, len - at, "]");
	}
}

static int
cli_checkpoint_inspect(int argc, char **argv)
{
	char *rest[CLI_MAX_ARGS + 1];
	int n;
	const char *dir = cli_take_positional(inspect_opts, argc, argv, rest, &n);
	if (n < 0) {
		fprintf(stderr, INSPECT ": more than %d arguments\n", CLI_MAX_ARGS);
		return 2;
	}
	int rc = cli_opts_main(INSPECT, inspect_synopsis, inspect_description, inspect_opts, n,
			       rest);
	if (rc >= 0) {
		return rc;
	}
	if (!dir) {
		fprintf(stderr, INSPECT ": DIR is required\nrun `" INSPECT " --help`\n");
		return 2;
	}
	struct zinf_ckpt *c = NULL;
	if (open_ckpt(INSPECT, dir, ins.tag, &c)) {
		return 2;
	}
	struct zinf_ckpt_info in = {.size = sizeof(in)};
	zinf_ckpt_get_info(c, &in);
	json_t *o = json_object();
	json_object_set_new(o, "path", json_string(in.path));
	json_object_set_new(o, "tag", json_string(in.tag));
	json_object_set_new(o, "steps", json_integer(in.steps));
	json_object_set_new(o, "micro_steps", json_integer((json_int_t)in.micro_steps));
	json_object_set_new(o, "world", json_integer(in.world));
	json_object_set_new(o, "stage", json_integer(in.stage));
	json_object_set_new(o, "dtype", json_string(zinf_dtype_name(in.dtype)));
	json_object_set_new(o, "optimizer", json_string(in.optimizer));
	json_t *parts = json_array();
	size_t elem_bytes = 0; /* state bytes per element, every part */
	for (uint32_t p = 0; p < in.n_parts; p++) {
		struct zinf_ckpt_part q = {.size = sizeof(q)};
		zinf_ckpt_part(c, p, &q);
		elem_bytes += zinf_dtype_size(q.dtype);
		json_array_append_new(parts, json_pack("{s:s, s:s}", "name", q.name, "dtype",
						       zinf_dtype_name(q.dtype)));
	}
	json_object_set_new(o, "parts", parts);
	json_t *params = json_array();
	uint64_t numel = 0;
	for (uint32_t i = 0; i < in.n_params; i++) {
		struct zinf_ckpt_param p = {.size = sizeof(p)};
		zinf_ckpt_param(c, i, &p);
		json_t *sh = json_array();
		for (uint32_t d = 0; d < p.ndim; d++) {
			json_array_append_new(sh, json_integer((json_int_t)p.shape[d]));
		}
		json_array_append_new(params, json_pack("{s:s, s:I, s:i, s:o, s:I}", "name", p.name,
							"numel", (json_int_t)p.numel, "layer",
							p.layer, "shape", sh, "state_bytes",
							(json_int_t)(p.numel * elem_bytes)));
		numel += p.numel;
	}
	json_object_set_new(o, "numel", json_integer((json_int_t)numel));
	json_object_set_new(o, "params", params);
	json_t *files = json_array(), *bad = json_array();
	for (uint32_t k = 0; k < in.n_files; k++) {
		struct zinf_ckpt_file f = {.size = sizeof(f)};
		zinf_ckpt_file(c, k, &f);
		int v = 0;
		if (!ins.no_verify) {
			cli_quiet_errors(true); /* printed below, once, with the verdict */
			v = zinf_ckpt_verify_file(c, k);
			cli_quiet_errors(false);
		}
		json_t *e = json_pack("{s:s, s:I, s:I, s:o}", "name", f.name, "bytes",
				      (json_int_t)f.bytes, "crc32c", (json_int_t)f.crc32c, "ok",
				      ins.no_verify ? json_null() : json_boolean(v == 0));
		if (v) {
			json_object_set_new(e, "error", json_string(zinf_last_error()));
			json_array_append_new(bad, json_string(f.name));
			fprintf(stderr, INSPECT ": %s: %s\n", f.name, zinf_last_error());
		}
		json_array_append_new(files, e);
	}
	json_object_set_new(o, "files", files);
	json_object_set_new(o, "bytes", json_integer((json_int_t)in.bytes));
	size_t n_bad = json_array_size(bad);
	json_object_set_new(o, "ok", json_boolean(n_bad == 0));
	json_object_set_new(o, "verified", json_boolean(!ins.no_verify));
	json_object_set_new(o, "bad_files", bad);
	if (ins.json) {
		cli_json_print(o, 2);
	} else {
		char sz[32], line[256];
		printf("%s: checkpoint \"%s\"\n", in.path, in.tag);
		printf("  step %" PRId64 " (%" PRIu64
		       " micro-steps), saved by %d rank%s, ZeRO stage "
		       "%d, dtype %s, optimizer %s\n",
		       in.steps, in.micro_steps, in.world, in.world == 1 ? "" : "s", in.stage,
		       zinf_dtype_name(in.dtype), in.optimizer);
		printf("  state parts:");
		size_t i;
		json_t *e;
		json_array_foreach(json_object_get(o, "parts"), i, e)
		{
			printf("%s %s (%s)", i ? "," : "",
			       json_string_value(json_object_get(e, "name")),
			       json_string_value(json_object_get(e, "dtype")));
		}
		printf("\n  %u parameters, %" PRIu64 " elements:\n", in.n_params, numel);
		for (uint32_t k = 0; k < in.n_params; k++) {
			struct zinf_ckpt_param p = {.size = sizeof(p)};
			zinf_ckpt_param(c, k, &p);
			shape_str(line, sizeof(line), &p);
			cli_size_str(sz, sizeof(sz), p.numel * elem_bytes);
			printf("    %-40s %-20s layer %-4d %s of state\n", p.name, line, p.layer,
			       sz);
		}
		cli_size_str(sz, sizeof(sz), in.bytes);
		printf("  %u files, %s:\n", in.n_files, sz);
		json_array_foreach(json_object_get(o, "files"), i, e)
		{
			cli_size_str(sz, sizeof(sz),
				     (uint64_t)json_integer_value(json_object_get(e, "bytes")));
			json_t *ok = json_object_get(e, "ok");
			printf("    %-24s %12s  crc32c %08" PRIx64 "  %s\n",
			       json_string_value(json_object_get(e, "name")), sz,
			       (uint64_t)json_integer_value(json_object_get(e, "crc32c")),
			       json_is_null(ok)	  ? "not checked"
			       : json_is_true(ok) ? "ok"
						  : "BAD");
		}
		if (ins.no_verify) {
			printf("the files' sizes match the manifest; their CRC32C not checked\n");
		} else if (n_bad) {
			printf("%zu file%s corrupted (see above)\n", n_bad, n_bad == 1 ? "" : "s");
		} else {
			printf("ok: every file matches its CRC32C\n");
		}
		json_decref(o);
	}
	zinf_ckpt_close(c);
	return n_bad ? 1 : 0;
}

/* ---- export ------------------------------------------------------------------------------- */

/*
 * What an export to `out` would replace: out itself, out.index.json, or a shard of out
 * (<stem>-NNNNN-of-NNNNN.safetensors in its directory). Its path into found; false when none.
 */
static bool
export_target_exists(const char *out, char *found, size_t len)
{
	struct stat st;
	if (lstat(out, &st) == 0) {
		snprintf(found, len, "%s", out);
		return true;
	}
	snprintf(found, len, "%s.index.json", out);
	if (lstat(found, &st) == 0) {
		return true;
	}
	const char *slash = strrchr(out, '/');
	size_t dl = slash ? (size_t)(slash - out + 1) : 0, sl = strlen(out + dl) - 12;
	char dir[4096];
	snprintf(dir, sizeof(dir), "%.*s", dl ? (int)dl : 1, dl ? out : ".");
	DIR *d = opendir(dir);
	struct dirent *de;
	bool hit = false;
	while (d && !hit && (de = readdir(d))) {
		/* <stem>-00001-of-00003.safetensors */
		const char *n = de->d_name, *r = n + sl;
		unsigned a, b;
		int used = 0;
		hit = strncmp(n, out + dl, sl) == 0 && strlen(r) == 27 &&
		      sscanf(r, "-%5u-of-%5u.safetensors%n", &a, &b, &used) == 2 && used == 27;
		if (hit) {
			snprintf(found, len, "%.*s%s", (int)dl, out, n);
		}
	}
	if (d) {
		closedir(d);
	}
	return hit;
}

#define EXPORT "zinf checkpoint export"

static struct {
	const char *out, *hf, *hf_config, *tag, *shard;
	int dtype;
	bool no_verify, force;
} ex;

static const char *const export_dtypes[] = {"auto", "fp32", "bf16", "fp16", NULL};

static const struct cli_opt export_opts[] = {
	{"out", CLI_STR, &ex.out, NULL, "FILE",
	 "the .safetensors file (sharded: shards beside it and FILE.index.json), under the\n"
	 "checkpoint's names and shapes"},
	{"hf", CLI_STR, &ex.hf, NULL, "DIR",
	 "instead, a Hugging Face model directory (made if missing): config.json and\n"
	 "model.safetensors, or shards and model.safetensors.index.json, for transformers'\n"
	 "from_pretrained"},
	{"hf-config", CLI_STR, &ex.hf_config, NULL, "FILE",
	 "with --hf: the model's config.json (default: the one beside the checkpoints,\n"
	 "DIR/config.json, which zinf_gpt --save writes)"},
	{"tag", CLI_STR, &ex.tag, NULL, "TAG", "the checkpoint DIR/TAG (default: DIR/latest's)"},
	{"dtype", CLI_ENUM, &ex.dtype, "auto", "auto|fp32|bf16|fp16",
	 "dtype of the weights written (auto: the one the model trained in)",
	 .choices = export_dtypes},
	{"shard-size", CLI_STR, &ex.shard, NULL, "SIZE",
	 "above this, shards (0: one file); default 5G with --out, 50GB with --hf\n"
	 "(transformers 5's save_pretrained). \"500MB\", \"2GB\", \"1GiB\" as transformers'\n"
	 "max_shard_size (KB, MB, GB: powers of 1000; KiB, MiB, GiB: of 1024); \"5G\", \"64K\":\n"
	 "powers of 1024; or bytes"},
	{"no-verify", CLI_FLAG, &ex.no_verify, NULL, NULL,
	 "do not check the CRC32C of the master weights' files first"},
	{"force", CLI_FLAG, &ex.force, NULL, NULL,
	 "replace an existing FILE, FILE.index.json or shards of FILE (--hf: DIR's config.json,\n"
	 "model.safetensors, its index or shards)"},
	{NULL},
};

static const char export_synopsis[] =
	"DIR (--out FILE.safetensors | --hf OUT [--hf-config FILE]) [--tag TAG]\n"
	"    [--dtype auto|fp32|bf16|fp16] [--shard-size SIZE] [--no-verify] [--force]";
static const char export_description[] =
	"Write a checkpoint's fp32 master weights as safetensors, for Hugging Face and PyTorch:\n"
	"gathered from every rank's partition and converted to --dtype (to bf16 and fp16 by round\n"
	"to nearest even), one tensor at a time in bounded pieces.\n"
	"--out FILE: one file of the checkpoint's tensors, names and shapes as registered.\n"
	"--hf OUT: a Hugging Face model directory: config.json (--hf-config FILE, else DIR's\n"
	"config.json; its dtype set to the one written) and the weights under Hugging Face's\n"
	"names and shapes (GPT-2's Conv1D weights, held as [out, in], written as [in, out]),\n"
	"loadable by transformers' from_pretrained. The checkpoint's tensors must be exactly\n"
	"those of the config's model (gpt2, llama, mistral, qwen2): checked first, a difference\n"
	"named. Above --shard-size the tensors are cut into shards named as Hugging Face names\n"
	"them, with an index mapping each tensor to its shard. Files are written under a\n"
	"temporary name and renamed when complete. The master weights' files are checked against\n"
	"their CRC32C first (--no-verify skips it). An existing output file is not replaced\n"
	"unless --force is given.\n"
	"Exit 0: written; 1: a master file is corrupted, or writing failed; 2: refused, nothing\n"
	"written (the command line, an output that exists, the checkpoint or the config missing,\n"
	"a config of another model).\n";

/*
 * --shard-size: transformers' max_shard_size forms first ("500MB", "2GB": powers of 1000, a
 * last letter "b" in lower case meaning bits, as there; "1GiB", "512MiB": of 1024), then the
 * command's other sizes ("5G", "64K": powers of 1024; "1e9"; bytes). 0 or -EINVAL.
 */
static int
parse_shard_size(const char *s, uint64_t *out)
{
	static const struct {
		const char *sfx;
		double mult;
	} hf[] = {{"GiB", 0x1p30}, {"MiB", 0x1p20}, {"KiB", 0x1p10},
		  {"GB", 1e9},	   {"MB", 1e6},	    {"KB", 1e3}};
	size_t n = strlen(s);
	for (size_t k = 0; k < sizeof(hf) / sizeof(hf[0]); k++) {
		size_t l = strlen(hf[k].sfx);
		if (n <= l || strcasecmp(s + n - l, hf[k].sfx) != 0) {
			continue;
		}
		char num[64], *end;
		if (n - l >= sizeof(num) || !(isdigit((unsigned char)s[0]) || s[0] == '.')) {
			return -EINVAL;
		}
		memcpy(num, s, n - l);
		num[n - l] = '\0';
		errno = 0;
		double v = strtod(num, &end) * hf[k].mult;
		if (errno || *end || !(v >= 0) || v >= 0x1p64) {
			return -EINVAL;
		}
		*out = (uint64_t)v;
		if (l == 2 && s[n - 1] == 'b') {
			*out /= 8; /* transformers: "5Gb" is 5e9 bits */
		}
		return 0;
	}
	return cli_parse_size(s, out);
}

/* The master weights' files (r<rank>.fp32) against their CRC32C: 0, or 1 naming each bad one. */
static int
verify_masters(struct zinf_ckpt *c, const struct zinf_ckpt_info *in)
{
	int status = 0;
	for (uint32_t k = 0; k < in->n_files; k++) {
		struct zinf_ckpt_file f = {.size = sizeof(f)};
		zinf_ckpt_file(c, k, &f);
		size_t l = strlen(f.name);
		if (f.name[0] != 'r' || l < 5 || strcmp(f.name + l - 5, ".fp32") != 0) {
			continue;
		}
		if (zinf_ckpt_verify_file(c, k)) {
			fprintf(stderr, EXPORT ": %s is corrupted: nothing written\n", f.name);
			status = 1;
		}
	}
	return status;
}

/* What an export to OUT as a Hugging Face directory would replace: OUT/config.json, or the
 * weights' files (export_target_exists of OUT/model.safetensors). */
static bool
hf_target_exists(const char *out, char *found, size_t len)
{
	struct stat st;
	char p[4200];
	snprintf(found, len, "%s/config.json", out);
	if (lstat(found, &st) == 0) {
		return true;
	}
	snprintf(p, sizeof(p), "%s/model.safetensors", out);
	return export_target_exists(p, found, len);
}

/* With --hf: the config.json to use into cfg: --hf-config, else DIR's, else the one beside the
 * TAG directory opened (DIR named a TAG directory). 0, or 2 after a message naming them. */
static int
find_config(const char *dir, const struct zinf_ckpt_info *in, char *cfg, size_t len)
{
	if (ex.hf_config) {
		snprintf(cfg, len, "%s", ex.hf_config);
		if (access(cfg, R_OK) != 0) {
			fprintf(stderr, EXPORT ": --hf-config %s: %s\n", cfg, strerror(errno));
			return 2;
		}
		return 0;
	}
	char other[4200];
	snprintf(cfg, len, "%s/config.json", dir);
	const char *slash = strrchr(in->path, '/');
	snprintf(other, sizeof(other), "%.*s/config.json", slash ? (int)(slash - in->path) : 1,
		 slash ? in->path : ".");
	if (access(cfg, R_OK) == 0) {
		return 0;
	}
	if (access(other, R_OK) == 0) { /* DIR named the TAG directory: its parent's */
		snprintf(cfg, len, "%s", other);
		return 0;
	}
	fprintf(stderr,
		EXPORT ": --hf %s: no config.json: none beside the checkpoint (%s%s%s) and no "
		       "--hf-config FILE given (a trainer writes its model's Hugging Face config "
		       "beside its checkpoints: zinf_gpt --save does); nothing written\n",
		ex.hf, cfg, strcmp(cfg, other) ? ", " : "", strcmp(cfg, other) ? other : "");
	return 2;
}

static int
export_hf(const char *dir, struct zinf_ckpt *c, const struct zinf_ckpt_info *in, enum zinf_dtype dt,
	  uint64_t shard)
{
	char cfg[4200];
	int rc = find_config(dir, in, cfg, sizeof(cfg));
	if (rc || (!ex.no_verify && (rc = verify_masters(c, in)))) {
		return rc;
	}
	struct zinf_ckpt_hf_opts o;
	zinf_ckpt_hf_opts_init(&o);
	o.config = cfg;
	o.dtype = (int32_t)dt;
	o.shard_bytes = shard;
	o.overwrite = ex.force;
	int files = zinf_ckpt_export_hf(c, ex.hf, &o);
	if (files < 0) {
		/* the library said which tensor, key or file. A model that does not match is
		   refused before anything is written; a later failure may leave the shards that
		   were renamed in before it, but no index or config.json naming them whole */
		bool refused = files == -EINVAL || files == -EEXIST;
		fprintf(stderr, EXPORT ": --hf %s: %s (%s)%s\n", ex.hf,
			refused ? "refused" : "export failed", strerror(-files),
			files == -EINVAL ? ": nothing written"
					 : ": no complete export under that name (files renamed in "
					   "before the failure may stay; run again with --force)");
		return refused ? 2 : 1;
	}
	uint64_t total = 0;
	for (uint32_t i = 0; i < in->n_params; i++) {
		struct zinf_ckpt_param p = {.size = sizeof(p)};
		zinf_ckpt_param(c, i, &p);
		total += p.numel * zinf_dtype_size(dt);
	}
	char sz[32];
	cli_size_str(sz, sizeof(sz), total);
	if (files == 1) {
		printf("%s: config.json (from %s) and model.safetensors: %u tensors, %s of %s "
		       "(step %" PRId64 ")\n",
		       ex.hf, cfg, in->n_params, sz, zinf_dtype_name(dt), in->steps);
	} else {
		printf("%s: config.json (from %s), %d shards of at most %" PRIu64
		       " bytes and model.safetensors.index.json: %u tensors, %s of %s (step "
		       "%" PRId64 ")\n",
		       ex.hf, cfg, files, shard, in->n_params, sz, zinf_dtype_name(dt), in->steps);
	}
	return 0;
}

static int
cli_checkpoint_export(int argc, char **argv)
{
	char *rest[CLI_MAX_ARGS + 1];
	int n;
	const char *dir = cli_take_positional(export_opts, argc, argv, rest, &n);
	if (n < 0) {
		fprintf(stderr, EXPORT ": more than %d arguments\n", CLI_MAX_ARGS);
		return 2;
	}
	int rc = cli_opts_main(EXPORT, export_synopsis, export_description, export_opts, n, rest);
	if (rc >= 0) {
		return rc;
	}
	if (!dir) {
		fprintf(stderr, EXPORT ": DIR is required\nrun `" EXPORT " --help`\n");
		return 2;
	}
	if (!ex.out == !ex.hf || (ex.hf_config && !ex.hf)) {
		fprintf(stderr, EXPORT ": %s\nrun `" EXPORT " --help`\n",
			ex.hf_config && !ex.hf ? "--hf-config goes with --hf"
			: ex.out	       ? "--out and --hf: one or the other"
					       : "--out FILE or --hf DIR is required");
		return 2;
	}
	uint64_t shard;
	const char *ss = ex.shard ? ex.shard : ex.hf ? "50GB" : "5G";
	if (parse_shard_size(ss, &shard)) {
		fprintf(stderr,
			EXPORT ": --shard-size %s: not a size (500MB, 2GB, 1GiB, 5G, bytes)\n", ss);
		return 2;
	}
	char found[4400];
	struct stat st;
	if (ex.hf && stat(ex.hf, &st) == 0 && !S_ISDIR(st.st_mode)) {
		fprintf(stderr, EXPORT ": --hf %s: not a directory; nothing read or written\n",
			ex.hf);
		return 2;
	}
	size_t ol = ex.out ? strlen(ex.out) : 0;
	if (ex.out && (ol <= 12 || strcmp(ex.out + ol - 12, ".safetensors") != 0)) {
		fprintf(stderr, EXPORT ": --out %s: must end in .safetensors\n", ex.out);
		return 2;
	}
	if (!ex.force && (ex.out ? export_target_exists(ex.out, found, sizeof(found))
				 : hf_target_exists(ex.hf, found, sizeof(found)))) {
		fprintf(stderr,
			EXPORT ": %s exists: not replaced (--force replaces it); nothing read or "
			       "written\n",
			found);
		return 2;
	}
	struct zinf_ckpt *c = NULL;
	if (open_ckpt(EXPORT, dir, ex.tag, &c)) {
		return 2;
	}
	struct zinf_ckpt_info in = {.size = sizeof(in)};
	zinf_ckpt_get_info(c, &in);
	static const enum zinf_dtype dts[] = {ZINF_F32, ZINF_F32, ZINF_BF16, ZINF_F16};
	enum zinf_dtype dt = ex.dtype == 0 ? in.dtype : dts[ex.dtype];
	if (ex.hf) {
		int status = export_hf(dir, c, &in, dt, shard);
		zinf_ckpt_close(c);
		return status;
	}
	int status = ex.no_verify ? 0 : verify_masters(c, &in);
	if (status) {
		zinf_ckpt_close(c);
		return status;
	}
	uint64_t total = 0;
	for (uint32_t i = 0; i < in.n_params; i++) {
		struct zinf_ckpt_param p = {.size = sizeof(p)};
		zinf_ckpt_param(c, i, &p);
		total += p.numel * zinf_dtype_size(dt);
	}
	rc = zinf_ckpt_export(c, ex.out, dt, shard);
	if (rc) {
		fprintf(stderr,
			EXPORT ": %s: export failed (%s): no complete export under that name "
			       "(shards renamed in before the failure may stay)\n",
			ex.out, strerror(-rc));
		zinf_ckpt_close(c);
		return 1;
	}
	char sz[32];
	cli_size_str(sz, sizeof(sz), total);
	if (shard == 0 || total <= shard || in.n_params <= 1) {
		printf("%s: %u tensors, %s of %s (step %" PRId64 ")\n", ex.out, in.n_params, sz,
		       zinf_dtype_name(dt), in.steps);
	} else {
		printf("%s.index.json: %u tensors, %s of %s in shards of at most %" PRIu64
		       " bytes beside it (step %" PRId64 ")\n",
		       ex.out, in.n_params, sz, zinf_dtype_name(dt), shard, in.steps);
	}
	zinf_ckpt_close(c);
	return 0;
}

const struct cli_cmd cli_checkpoint_cmds[] = {
	{"inspect", "print a checkpoint's manifest and check every file's CRC32C",
	 cli_checkpoint_inspect},
	{"export", "write a checkpoint's weights as (sharded) safetensors, or a Hugging Face model",
	 cli_checkpoint_export},
	{NULL},
};
