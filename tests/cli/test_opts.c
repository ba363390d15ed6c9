/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/cli/test_opts.c: the option engine of the `zinf` command (cli/opts.c) and the report
 * helpers (cli/report.c) as units: value parsers (sizes, exact 64-bit counts), a table of every
 * type parsed with defaults, ranges, enumerations, repeated options, the nearest-name
 * suggestion, refused abbreviations, and the --help text generated from the table.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

static uint64_t
size_of(const char *s)
{
	uint64_t v = 12345;
	cr_assert_eq(cli_parse_size(s, &v), 0, "'%s' refused", s);
	return v;
}

static void
size_bad(const char *s)
{
	uint64_t v = 12345;
	cr_assert_eq(cli_parse_size(s, &v), -EINVAL, "'%s' taken as %llu", s,
		     (unsigned long long)v);
	cr_assert_eq(v, 12345, "'%s': output touched on error", s);
}

Test(opts, sizes)
{
	cr_assert_eq(size_of("4096"), 4096);
	cr_assert_eq(size_of("64K"), 65536);
	cr_assert_eq(size_of("64k"), 65536);
	cr_assert_eq(size_of("1M"), 1048576);
	cr_assert_eq(size_of("1.5G"), 1610612736ull);
	cr_assert_eq(size_of("2GiB"), 2147483648ull);
	cr_assert_eq(size_of("3KB"), 3072);
	cr_assert_eq(size_of("1T"), 1ull << 40);
	cr_assert_eq(size_of("1e9"), 1000000000ull);
	cr_assert_eq(size_of("16777215T"), 16777215ull << 40);
	size_bad("");
	size_bad("-1");
	size_bad("1X");
	size_bad("0.3K"); /* 307.2 bytes */
	size_bad("1.5");
	size_bad("16777216T"); /* 2^64 */
	size_bad("K");
	size_bad(" 1M");
	size_bad("1MM");
}

Test(opts, counts_exact_64_bit)
{
	uint64_t v = 0;
	cr_assert_eq(cli_parse_count("18446744073709551615", &v), 0);
	cr_assert_eq(v, UINT64_MAX, "no rounding through double");
	cr_assert_eq(cli_parse_count("18446744073709551616", &v), -EINVAL);
	cr_assert_eq(cli_parse_count("2e8", &v), 0);
	cr_assert_eq(v, 200000000);
	cr_assert_eq(cli_parse_count("1.5e3", &v), 0);
	cr_assert_eq(v, 1500);
	cr_assert_eq(cli_parse_count("5000000000", &v), 0);
	cr_assert_eq(v, 5000000000ull, "not truncated to 32 bits");
	cr_assert_eq(cli_parse_count("1.5", &v), -EINVAL);
	cr_assert_eq(cli_parse_count("+1", &v), -EINVAL);
	cr_assert_eq(cli_parse_count("1K", &v), -EINVAL, "a count has no size suffix");
}

Test(opts, edit_distance_and_nearest)
{
	cr_assert_eq(cli_edit_distance("kitten", "sitting"), 3);
	cr_assert_eq(cli_edit_distance("", "abc"), 3);
	cr_assert_eq(cli_edit_distance("same", "same"), 0);
	const char *names[] = {"queue-depth", "threads", "block-size", "backend", NULL};
	cr_assert_str_eq(cli_nearest("queu-depth", names), "queue-depth");
	cr_assert_str_eq(cli_nearest("thread", names), "threads");
	cr_assert_str_eq(cli_nearest("queue", names), "queue-depth", "an abbreviation");
	cr_assert_null(cli_nearest("b", names), "ambiguous prefix, far from all");
	cr_assert_null(cli_nearest("zzzzzzzz", names));
}

/* ---- a table of every type ---------------------------------------------------------------- */

static const char *const colours[] = {"red", "green", "blue", NULL};

static struct {
	bool flag, size_given;
	uint64_t size, count;
	uint32_t qd;
	int n, colour;
	double ratio;
	const char *name;
	struct cli_list paths;
} v;

static const struct cli_opt table[] = {
	{"flag", CLI_FLAG, &v.flag, NULL, NULL, "a flag"},
	{"size", CLI_SIZE, &v.size, "1M", "N", "bytes", .min = 4096, .max = 1 << 30,
	 .flags = CLI_POW2, .given = &v.size_given},
	{"count", CLI_COUNT, &v.count, "2e8", "N", "elements", .min = 1},
	{"queue-depth", CLI_U32, &v.qd, "32", "N", "blocks in flight", .min = 1, .max = 4096},
	{"n", CLI_INT, &v.n, NULL, NULL, "an int", .flags = CLI_REQUIRED},
	{"colour", CLI_ENUM, &v.colour, "green", NULL, "a colour", .choices = colours},
	{"ratio", CLI_DOUBLE, &v.ratio, "0.5", "R", "a ratio", .min = 0.25, .max = 1},
	{"name", CLI_STR, &v.name, "x", "S", "a string"},
	{"path", CLI_LIST, &v.paths, "./d", "DIR", "a directory", .max = 3},
	{NULL},
};

static int
parse(char *err, size_t n, ...)
{
	char *argv[32] = {"sub"};
	int argc = 1;
	va_list ap;
	va_start(ap, n);
	for (char *a; argc < 31 && (a = va_arg(ap, char *)) != NULL;) {
		argv[argc++] = a;
	}
	va_end(ap);
	argv[argc] = NULL;
	memset(&v, 0x55, sizeof(v)); /* the engine must set every field */
	return cli_opts_parse(table, argc, argv, err, n);
}

Test(opts, defaults_applied)
{
	char err[256];
	cr_assert_eq(parse(err, sizeof(err), "--n", "0", NULL), CLI_PARSE_OK, "%s", err);
	cr_assert_eq(v.flag, false);
	cr_assert_eq(v.size_given, false);
	cr_assert_eq(v.size, 1 << 20);
	cr_assert_eq(v.count, 200000000);
	cr_assert_eq(v.qd, 32);
	cr_assert_eq(v.n, 0);
	cr_assert_eq(v.colour, 1);
	cr_assert_eq(v.ratio, 0.5);
	cr_assert_str_eq(v.name, "x");
	cr_assert_eq(v.paths.n, 1);
	cr_assert_str_eq(v.paths.v[0], "./d");
}

Test(opts, values_parsed)
{
	char err[256];
	cr_assert_eq(parse(err, sizeof(err), "--flag", "--size", "64K", "--count=5000000000",
			   "--queue-depth", "4096", "--n", "7", "--colour", "blue", "--ratio",
			   "0.25", "--name", "y", "--path", "a", "--path", "--b", NULL),
		     CLI_PARSE_OK, "%s", err);
	cr_assert(v.flag && v.size_given);
	cr_assert_eq(v.size, 65536);
	cr_assert_eq(v.count, 5000000000ull);
	cr_assert_eq(v.qd, 4096);
	cr_assert_eq(v.n, 7);
	cr_assert_eq(v.colour, 2);
	cr_assert_eq(v.ratio, 0.25);
	cr_assert_str_eq(v.name, "y");
	cr_assert_eq(v.paths.n, 2, "repeated, the default replaced");
	cr_assert_str_eq(v.paths.v[0], "a");
	cr_assert_str_eq(v.paths.v[1], "--b", "the value of --path, whatever it looks like");
}

static void
error_is(const char *want, int rc, const char *err)
{
	cr_assert_eq(rc, -EINVAL);
	cr_assert_str_eq(err, want);
}

/* A scalar given twice is an error naming it (the second value would win silently); a list
 * repeats. */
Test(opts, repeated_scalar_refused)
{
	char e[256];
	error_is("--n: given more than once (it takes one value; only list options repeat)",
		 parse(e, sizeof(e), "--n", "1", "--n", "2", NULL), e);
	error_is("--size: given more than once (it takes one value; only list options repeat)",
		 parse(e, sizeof(e), "--size", "4K", "--flag", "--size=8K", NULL), e);
	error_is("--flag: given more than once (it takes one value; only list options repeat)",
		 parse(e, sizeof(e), "--flag", "--flag", NULL), e);
	cr_assert_eq(
		parse(e, sizeof(e), "--n", "1", "--path", "a", "--path", "b", "--path", "c", NULL),
		CLI_PARSE_OK, "%s", e);
	cr_assert_eq(v.paths.n, 3);
	cr_assert_str_eq(v.paths.v[2], "c");
}

Test(opts, errors_name_the_problem)
{
	char e[256];
	error_is("--queue-depth 0: must be in [1, 4096]",
		 parse(e, sizeof(e), "--queue-depth", "0", NULL), e);
	error_is("--queue-depth 4294967297: must be in [1, 4096]",
		 parse(e, sizeof(e), "--queue-depth", "4294967297", NULL), e);
	error_is("--size 2G: must be in [4K, 1G]", parse(e, sizeof(e), "--size", "2G", NULL), e);
	error_is("--size 12K: must be a power of two", parse(e, sizeof(e), "--size", "12K", NULL),
		 e);
	error_is("--size big: not a size (4096, 64K, 1M, 1.5G, 1e9)",
		 parse(e, sizeof(e), "--size", "big", NULL), e);
	error_is("--count 0: must be at least 1", parse(e, sizeof(e), "--count", "0", NULL), e);
	error_is("--n 2147483648: must be in [0, 2147483647]",
		 parse(e, sizeof(e), "--n", "2147483648", NULL), e);
	error_is("--colour pink: expected red, green or blue",
		 parse(e, sizeof(e), "--colour", "pink", NULL), e);
	error_is("--ratio 2: must be in [0.25, 1]", parse(e, sizeof(e), "--ratio", "2", NULL), e);
	error_is("--ratio nan: not a number", parse(e, sizeof(e), "--ratio", "nan", NULL), e);
	error_is("--queu-depth: unknown option; did you mean --queue-depth?",
		 parse(e, sizeof(e), "--queu-depth", "3", NULL), e);
	error_is("--queue: unknown option; did you mean --queue-depth?",
		 parse(e, sizeof(e), "--queue", "3", NULL), e);
	error_is("--zzzzzz: unknown option", parse(e, sizeof(e), "--zzzzzz", NULL), e);
	error_is("--flag: takes no value (given '1')", parse(e, sizeof(e), "--flag=1", NULL), e);
	error_is("--help: takes no value (given 'x')", parse(e, sizeof(e), "--help=x", NULL), e);
	error_is("--size: needs a value", parse(e, sizeof(e), "--size", NULL), e);
	error_is("unexpected argument 'extra'", parse(e, sizeof(e), "extra", NULL), e);
	error_is("--n is required", parse(e, sizeof(e), "--flag", NULL), e);
	error_is("--path d: at most 3 --path",
		 parse(e, sizeof(e), "--path", "a", "--path", "b", "--path", "c", "--path", "d",
		       NULL),
		 e);
	cr_assert_eq(parse(e, sizeof(e), "--size", "64K", "--help", NULL), CLI_PARSE_HELP);
	cr_assert_eq(parse(e, sizeof(e), "-h", NULL), CLI_PARSE_HELP);
}

Test(opts, help_from_the_table)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	cli_opts_help(f, "zinf sub", "[options]", "What it does.\n", table);
	fclose(f);
	const char *want = "usage: zinf sub [options]\n"
			   "\n"
			   "What it does.\n"
			   "\n"
			   "  --flag                a flag\n"
			   "  --size N              bytes (default 1M, in [4K, 1G])\n"
			   "  --count N             elements (default 2e8, at least 1)\n"
			   "  --queue-depth N       blocks in flight (default 32, in [1, 4096])\n"
			   "  --n N                 an int (required)\n"
			   "  --colour red|green|blue\n"
			   "                        a colour (default green)\n"
			   "  --ratio R             a ratio (default 0.5, in [0.25, 1])\n"
			   "  --name S              a string (default x)\n"
			   "  --path DIR            a directory (repeatable, default ./d)\n"
			   "  -h, --help            this text\n";
	cr_assert_str_eq(buf, want);
	free(buf);
}

/* The positional argument is the first word that is neither an option nor an option's value:
 * "--n 2 ds.json" takes ds.json, not 2; a flag's neighbour is positional; "--name=x" holds its
 * value; past CLI_MAX_ARGS arguments the caller is told (never dropped silently). */
Test(opts, positional_argument_is_not_an_options_value)
{
	char *rest[CLI_MAX_ARGS + 1];
	int n = 0;
	char *a1[] = {"check", "--n", "2", "--flag", "ds.json", "--name=x", "--path", "p", NULL};
	const char *pos = cli_take_positional(table, 8, a1, rest, &n);
	cr_assert_str_eq(pos, "ds.json");
	cr_assert_eq(n, 7);
	const char *want[] = {"check", "--n", "2", "--flag", "--name=x", "--path", "p"};
	for (int i = 0; i < n; i++) {
		cr_assert_str_eq(rest[i], want[i], "rest[%d]", i);
	}
	cr_assert_null(rest[n]);
	char *a2[] = {"check", "--n", "2", NULL};
	cr_assert_null(cli_take_positional(table, 3, a2, rest, &n));
	static char *many[CLI_MAX_ARGS + 2];
	for (int i = 0; i <= CLI_MAX_ARGS; i++) {
		many[i] = "--flag";
	}
	cr_assert_null(cli_take_positional(table, CLI_MAX_ARGS + 1, many, rest, &n));
	cr_assert_eq(n, -1);
}

/* The command list: names padded to the widest, so "checkpoint inspect" (18 characters) never
 * runs into its summary (it did with a fixed 14-column field). */
static const struct cli_cmd sub_cmds[] = {
	{"inspect", "print a manifest", NULL, NULL},
	{"export", "write safetensors", NULL, NULL},
	{NULL},
};
static const struct cli_cmd top_cmds[] = {
	{"checkpoint", "checkpoints", NULL, sub_cmds},
	{"version", "the version", NULL, NULL},
	{NULL},
};

Test(opts, command_list_pads_to_the_widest_name)
{
	char *argv[] = {"zinf", "--help", NULL};
	fflush(stdout);
	FILE *t = tmpfile();
	int saved = dup(1);
	cr_assert(t && saved >= 0);
	dup2(fileno(t), 1);
	int rc = cli_dispatch("zinf", top_cmds, 2, argv);
	fflush(stdout);
	dup2(saved, 1);
	close(saved);
	char buf[1024] = {0};
	rewind(t);
	size_t n = fread(buf, 1, sizeof(buf) - 1, t);
	fclose(t);
	cr_assert_eq(rc, 0);
	const char *want = "usage: zinf <command> [options]\n"
			   "\n"
			   "commands:\n"
			   "  checkpoint inspect  print a manifest\n"
			   "  checkpoint export   write safetensors\n"
			   "  version             the version\n"
			   "\n"
			   "Run `zinf <command> --help` for the options of each.\n";
	cr_assert_str_eq(buf, want, "%zu bytes:\n%s", n, buf);
}

/* ---- report helpers ----------------------------------------------------------------------- */

Test(report, json_non_finite_is_null)
{
	json_t *a = json_array();
	json_array_append_new(a, cli_json_real(NAN));
	json_array_append_new(a, cli_json_real(INFINITY));
	json_array_append_new(a, cli_json_real(1.5));
	char *s = json_dumps(a, 0);
	cr_assert_str_eq(s, "[null, null, 1.5]");
	free(s);
	json_decref(a);
}

Test(report, median_and_sizes)
{
	const double odd[] = {3, 1, 2}, even[] = {4, 1, 3, 2};
	cr_assert_eq(cli_median(odd, 3), 2);
	cr_assert_eq(cli_median(even, 4), 2.5);
	cr_assert_eq(odd[0], 3, "input left as it was");
	cr_assert(isnan(cli_median(odd, 0)));
	char s[32];
	cli_size_str(s, sizeof(s), 1ull << 30);
	cr_assert_str_eq(s, "1 GiB");
	cli_size_str(s, sizeof(s), 3ull << 29);
	cr_assert_str_eq(s, "1.5 GiB");
	cli_size_str(s, sizeof(s), 256 << 10);
	cr_assert_str_eq(s, "256 KiB");
	cli_size_str(s, sizeof(s), 123);
	cr_assert_str_eq(s, "123 B");
	cli_size_str(s, sizeof(s), 1ull << 40);
	cr_assert_str_eq(s, "1 TiB");
}
