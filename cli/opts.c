/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli/opts.c: the option engine of the `zinf` command (see opts.h): one table per subcommand
 * drives getopt_long, the defaults, the value checks and the --help text; and the subcommand
 * dispatch. Errors are written into the caller's buffer, so that tests read them; only
 * cli_opts_main() and cli_dispatch() print. Long options must be spelt out: getopt_long's
 * abbreviations are refused (an abbreviation that works today breaks when an option is added).
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli/opts.h"

#define TWO_64 18446744073709551616.0 /* 2^64 */

static int fail(char *err, size_t errlen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static int
fail(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
	return -EINVAL;
}

/* ---- values ------------------------------------------------------------------------------- */

/* A double that must be a whole number in [0, 2^64). */
static int
whole(double v, uint64_t *out)
{
	if (!isfinite(v) || v < 0 || v >= TWO_64 || v != floor(v)) {
		return -EINVAL;
	}
	*out = (uint64_t)v;
	return 0;
}

int
cli_parse_count(const char *s, uint64_t *out)
{
	if (!s || !isdigit((unsigned char)s[0])) {
		return -EINVAL; /* no sign, no blank, no empty string */
	}
	char *end = NULL;
	errno = 0;
	unsigned long long u = strtoull(s, &end, 10);
	if (*end == '\0') {
		if (errno) {
			return -EINVAL; /* over 2^64 - 1 */
		}
		*out = u;
		return 0;
	}
	/* "2e8", "1.5e3": exact only where the value is a whole number. */
	errno = 0;
	double v = strtod(s, &end);
	if (errno || *end != '\0') {
		return -EINVAL;
	}
	return whole(v, out);
}

int
cli_parse_size(const char *s, uint64_t *out)
{
	if (!s || !(isdigit((unsigned char)s[0]) || s[0] == '.')) {
		return -EINVAL;
	}
	size_t n = strlen(s);
	static const char suf[] = "KMGT";
	const char *p = NULL;
	size_t num_len = n;
	/* Suffix: K, KB, KiB (case-insensitive), powers of 1024. */
	for (size_t cut = 1; cut <= 3 && cut < n && !p; cut++) {
		const char *tail = s + n - cut;
		const char *at = strchr(suf, toupper((unsigned char)tail[0]));
		if (!at || !tail[0]) {
			continue;
		}
		if (cut == 1 || strcasecmp(tail + 1, "B") == 0 || strcasecmp(tail + 1, "iB") == 0) {
			p = at;
			num_len = n - cut;
		}
	}
	if (!p) {
		return cli_parse_count(s, out);
	}
	char num[64];
	if (num_len == 0 || num_len >= sizeof(num)) {
		return -EINVAL;
	}
	memcpy(num, s, num_len);
	num[num_len] = '\0';
	char *end = NULL;
	errno = 0;
	double v = strtod(num, &end);
	if (errno || *end != '\0') {
		return -EINVAL;
	}
	return whole(ldexp(v, 10 * (int)(p - suf + 1)), out);
}

unsigned
cli_edit_distance(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	if (la > 64 || lb > 64) {
		return UINT_MAX;
	}
	unsigned row[65];
	for (size_t j = 0; j <= lb; j++) {
		row[j] = (unsigned)j;
	}
	for (size_t i = 1; i <= la; i++) {
		unsigned diag = row[0];
		row[0] = (unsigned)i;
		for (size_t j = 1; j <= lb; j++) {
			unsigned up = row[j];
			unsigned best = diag + (a[i - 1] != b[j - 1]);
			best = up + 1 < best ? up + 1 : best;
			best = row[j - 1] + 1 < best ? row[j - 1] + 1 : best;
			row[j] = best;
			diag = up;
		}
	}
	return row[lb];
}

const char *
cli_nearest(const char *word, const char *const *names)
{
	const char *best = NULL;
	unsigned bd = UINT_MAX;
	for (size_t i = 0; names[i]; i++) {
		unsigned d = cli_edit_distance(word, names[i]);
		if (d < bd) {
			bd = d;
			best = names[i];
		}
	}
	size_t len = strlen(word);
	unsigned limit = len / 3 > 2 ? (unsigned)(len / 3) : 2;
	if (bd <= limit) {
		return best;
	}
	/* An abbreviation: the one name it begins. */
	const char *pre = NULL;
	for (size_t i = 0; names[i] && len; i++) {
		if (strncmp(names[i], word, len) == 0) {
			if (pre) {
				return NULL;
			}
			pre = names[i];
		}
	}
	return pre;
}

/* ---- one option --------------------------------------------------------------------------- */

/* A bound as the user writes it: sizes with their suffix where exact. */
static void
fmt_bound(char *out, size_t n, const struct cli_opt *o, double v)
{
	if (o->type == CLI_DOUBLE) {
		snprintf(out, n, "%g", v);
		return;
	}
	uint64_t u = (uint64_t)v;
	if (o->type == CLI_SIZE && u) {
		static const char suf[] = "KMGT";
		for (int k = 4; k >= 1; k--) {
			uint64_t unit = 1ull << (10 * k);
			if (u >= unit && u % unit == 0) {
				snprintf(out, n, "%llu%c", (unsigned long long)(u / unit),
					 suf[k - 1]);
				return;
			}
		}
	}
	snprintf(out, n, "%llu", (unsigned long long)u);
}

/* The range an option's values must lie in: its own, else the type's. */
static void
opt_range(const struct cli_opt *o, double *lo, double *hi)
{
	*lo = o->min;
	*hi = o->max;
	if (o->max != 0) {
		return;
	}
	switch (o->type) { /* no upper bound given: the type's */
	case CLI_U32:
		*hi = UINT32_MAX;
		break;
	case CLI_INT:
		*hi = INT_MAX;
		break;
	case CLI_DOUBLE:
		*lo = o->min != 0 ? o->min : -HUGE_VAL;
		*hi = HUGE_VAL;
		break;
	default:
		*hi = TWO_64; /* every uint64_t */
		break;
	}
}

static bool
has_range(const struct cli_opt *o)
{
	return o->min != 0 || o->max != 0;
}

/* "in [1, 4096]", or "at least 1" for an option with no upper bound but its type's 2^64. */
static void
fmt_range(char *out, size_t n, const struct cli_opt *o)
{
	double lo, hi;
	opt_range(o, &lo, &hi);
	char a[32], b[32];
	fmt_bound(a, sizeof(a), o, lo);
	if (hi >= TWO_64) {
		snprintf(out, n, "at least %s", a);
		return;
	}
	fmt_bound(b, sizeof(b), o, hi);
	snprintf(out, n, "in [%s, %s]", a, b);
}

/* "expected a, b or c" into out. */
static void
fmt_choices(char *out, size_t n, const char *const *choices, const char *last_sep)
{
	size_t len = 0;
	out[0] = '\0';
	for (size_t i = 0; choices[i] && len < n; i++) {
		const char *sep = i == 0 ? "" : choices[i + 1] ? ", " : last_sep;
		len += (size_t)snprintf(out + len, n - len, "%s%s", sep, choices[i]);
	}
}

static int
store_number(const struct cli_opt *o, const char *val, char *err, size_t errlen)
{
	const char *name = o->name;
	double lo, hi, d = 0;
	uint64_t u = 0;
	opt_range(o, &lo, &hi);
	if (o->type == CLI_DOUBLE) {
		char *end = NULL;
		errno = 0;
		d = strtod(val, &end);
		if (errno || end == val || *end || !isfinite(d)) {
			return fail(err, errlen, "--%s %s: not a number", name, val);
		}
	} else {
		int r = o->type == CLI_SIZE ? cli_parse_size(val, &u) : cli_parse_count(val, &u);
		if (r < 0) {
			return fail(err, errlen, "--%s %s: not a %s", name, val,
				    o->type == CLI_SIZE ? "size (4096, 64K, 1M, 1.5G, 1e9)"
							: "whole number (42, 2e8)");
		}
		d = (double)u;
	}
	/* u is exact; d may round above 2^53, which only matters against a bound that large. */
	bool below = o->type == CLI_DOUBLE ? d < lo : d < lo && u < (uint64_t)lo;
	bool above = o->type == CLI_DOUBLE ? d > hi : hi < TWO_64 && u > (uint64_t)hi;
	if (below || above) {
		char rng[80];
		fmt_range(rng, sizeof(rng), o);
		return fail(err, errlen, "--%s %s: must be %s", name, val, rng);
	}
	if ((o->flags & CLI_POW2) && (u == 0 || (u & (u - 1)))) {
		return fail(err, errlen, "--%s %s: must be a power of two", name, val);
	}
	switch (o->type) {
	case CLI_SIZE:
	case CLI_COUNT:
		*(uint64_t *)o->dest = u;
		break;
	case CLI_U32:
		*(uint32_t *)o->dest = (uint32_t)u;
		break;
	case CLI_INT:
		*(int *)o->dest = (int)u;
		break;
	default:
		*(double *)o->dest = d;
		break;
	}
	return 0;
}

/* Store one occurrence of o's value (NULL for a flag). */
static int
store(const struct cli_opt *o, const char *val, char *err, size_t errlen)
{
	switch (o->type) {
	case CLI_FLAG:
		*(bool *)o->dest = true;
		return 0;
	case CLI_STR:
		*(const char **)o->dest = val;
		return 0;
	case CLI_ENUM:
		for (int i = 0; o->choices[i]; i++) {
			if (strcmp(val, o->choices[i]) == 0) {
				*(int *)o->dest = i;
				return 0;
			}
		}
		char list[256];
		fmt_choices(list, sizeof(list), o->choices, " or ");
		return fail(err, errlen, "--%s %s: expected %s", o->name, val, list);
	case CLI_LIST: {
		struct cli_list *l = o->dest;
		unsigned most =
			o->max > 0 && o->max < CLI_LIST_MAX ? (unsigned)o->max : CLI_LIST_MAX;
		if (l->n >= most) {
			return fail(err, errlen, "--%s %s: at most %u --%s", o->name, val, most,
				    o->name);
		}
		l->v[l->n++] = val;
		return 0;
	}
	default:
		return store_number(o, val, err, errlen);
	}
}

static void
reset(const struct cli_opt *o)
{
	static const size_t sz[] = {
		[CLI_FLAG] = sizeof(bool),
		[CLI_SIZE] = sizeof(uint64_t),
		[CLI_COUNT] = sizeof(uint64_t),
		[CLI_U32] = sizeof(uint32_t),
		[CLI_INT] = sizeof(int),
		[CLI_DOUBLE] = sizeof(double),
		[CLI_STR] = sizeof(char *),
		[CLI_ENUM] = sizeof(int),
		[CLI_LIST] = sizeof(struct cli_list),
	};
	memset(o->dest, 0, sz[o->type]);
	if (o->given) {
		*o->given = false;
	}
}

/* ---- the table ---------------------------------------------------------------------------- */

static size_t
count_opts(const struct cli_opt *opts)
{
	size_t n = 0;
	while (opts[n].name) {
		n++;
	}
	return n;
}

static const struct cli_opt *
find(const struct cli_opt *opts, const char *name, size_t len)
{
	for (size_t i = 0; opts[i].name; i++) {
		if (strlen(opts[i].name) == len && strncmp(opts[i].name, name, len) == 0) {
			return &opts[i];
		}
	}
	return NULL;
}

/* "--x: unknown option; did you mean --y?" */
static int
unknown(const struct cli_opt *opts, const char *tok, size_t len, char *err, size_t errlen)
{
	size_t n = count_opts(opts);
	const char **names = calloc(n + 2, sizeof(*names));
	char word[128];
	snprintf(word, sizeof(word), "%.*s", (int)(len < 127 ? len : 127), tok);
	if (!names) {
		return fail(err, errlen, "--%s: unknown option", word);
	}
	for (size_t i = 0; i < n; i++) {
		names[i] = opts[i].name;
	}
	names[n] = "help";
	const char *near = cli_nearest(word, names);
	free(names);
	if (near) {
		return fail(err, errlen, "--%s: unknown option; did you mean --%s?", word, near);
	}
	return fail(err, errlen, "--%s: unknown option", word);
}

/*
 * Every "--name" must name an option exactly (getopt_long would take a unique prefix). The
 * token after an option that takes a value is that value, whatever it looks like.
 */
static int
check_names(const struct cli_opt *opts, int argc, char **argv, char *err, size_t errlen)
{
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		if (strcmp(a, "--") == 0) {
			break;
		}
		if (strncmp(a, "--", 2) != 0) {
			continue;
		}
		const char *name = a + 2, *eq = strchr(name, '=');
		size_t len = eq ? (size_t)(eq - name) : strlen(name);
		if (len == 4 && strncmp(name, "help", 4) == 0) {
			if (eq) { /* getopt_long would name it "-h" */
				return fail(err, errlen, "--help: takes no value (given '%s')",
					    eq + 1);
			}
			continue;
		}
		const struct cli_opt *o = find(opts, name, len);
		if (!o) {
			return unknown(opts, name, len, err, errlen);
		}
		if (o->type == CLI_FLAG && eq) {
			return fail(err, errlen, "--%s: takes no value (given '%s')", o->name,
				    eq + 1);
		}
		if (o->type != CLI_FLAG && !eq) {
			i++; /* its value */
		}
	}
	return 0;
}

static int
apply_defaults(const struct cli_opt *opts, char *err, size_t errlen)
{
	for (size_t i = 0; opts[i].name; i++) {
		reset(&opts[i]);
		if (opts[i].def && opts[i].type != CLI_LIST &&
		    store(&opts[i], opts[i].def, err, errlen) < 0) {
			return -EINVAL; /* a bad table: the message names the option */
		}
	}
	return 0;
}

int
cli_opts_parse(const struct cli_opt *opts, int argc, char **argv, char *err, size_t errlen)
{
	err[0] = '\0';
	size_t n = count_opts(opts);
	if (apply_defaults(opts, err, errlen) < 0 || check_names(opts, argc, argv, err, errlen)) {
		return -EINVAL;
	}
	struct option *lo = calloc(n + 2, sizeof(*lo));
	bool *seen = calloc(n + 1, sizeof(*seen));
	if (!lo || !seen) {
		free(lo);
		free(seen);
		return fail(err, errlen, "out of memory");
	}
	for (size_t i = 0; i < n; i++) {
		lo[i].name = opts[i].name;
		lo[i].has_arg = opts[i].type == CLI_FLAG ? no_argument : required_argument;
		lo[i].val = 256 + (int)i;
	}
	lo[n].name = "help";
	lo[n].val = 'h';
	int rc = CLI_PARSE_OK, ch;
	optind = 0; /* GNU getopt: start over (another subcommand may have parsed before) */
	opterr = 0;
	while (rc == CLI_PARSE_OK && (ch = getopt_long(argc, argv, "+:h", lo, NULL)) != -1) {
		if (ch == 'h') {
			rc = CLI_PARSE_HELP;
		} else if (ch == ':') {
			rc = fail(err, errlen, "%s: needs a value", argv[optind - 1]);
		} else if (ch == '?') {
			rc = optopt ? fail(err, errlen,
					   "-%c: unknown option (long options: --name)", optopt)
				    : fail(err, errlen, "%s: unknown option", argv[optind - 1]);
		} else {
			const struct cli_opt *o = &opts[ch - 256];
			if (seen[ch - 256] && o->type != CLI_LIST) {
				/* the last of two values would win silently: say so instead */
				rc = fail(err, errlen,
					  "--%s: given more than once (it takes one value; only "
					  "list options repeat)",
					  o->name);
			} else if (store(o, optarg, err, errlen) < 0) {
				rc = -EINVAL;
			} else if (o->given) {
				*o->given = true;
			}
			seen[ch - 256] = true;
		}
	}
	if (rc == CLI_PARSE_OK && optind < argc) {
		rc = fail(err, errlen, "unexpected argument '%s'", argv[optind]);
	}
	for (size_t i = 0; rc == CLI_PARSE_OK && i < n; i++) {
		if ((opts[i].flags & CLI_REQUIRED) && !seen[i]) {
			rc = fail(err, errlen, "--%s is required", opts[i].name);
		}
	}
	for (size_t i = 0; rc == CLI_PARSE_OK && i < n; i++) {
		struct cli_list *l = opts[i].dest;
		if (opts[i].type == CLI_LIST && opts[i].def && l->n == 0) {
			l->v[l->n++] = opts[i].def;
		}
	}
	free(lo);
	free(seen);
	return rc;
}

/* ---- help --------------------------------------------------------------------------------- */

#define HELP_COL 24

/* " (default 32, in [1, 4096])" for o, or "" */
static void
help_suffix(char *out, size_t n, const struct cli_opt *o)
{
	char rng[80] = "";
	if (has_range(o) && o->type != CLI_LIST) {
		fmt_range(rng, sizeof(rng), o);
	}
	const char *dflt = o->def && o->type != CLI_FLAG ? o->def : NULL;
	const char *rep = o->type == CLI_LIST	      ? "repeatable"
			  : (o->flags & CLI_REQUIRED) ? "required"
						      : NULL;
	const char *parts[3] = {rep, NULL, rng[0] ? rng : NULL};
	char dbuf[96];
	if (dflt) {
		snprintf(dbuf, sizeof(dbuf), "default %s", dflt);
		parts[1] = dbuf;
	}
	size_t len = 0;
	out[0] = '\0';
	for (int i = 0; i < 3; i++) {
		if (parts[i]) {
			len += (size_t)snprintf(out + len, n - len, "%s%s", len ? ", " : " (",
						parts[i]);
		}
	}
	if (len) {
		snprintf(out + len, n - len, ")");
	}
}

static void
help_entry(FILE *f, const struct cli_opt *o)
{
	char left[320], choices[256], suffix[256];
	const char *meta = o->meta;
	if (!meta && o->type == CLI_ENUM) {
		fmt_choices(choices, sizeof(choices), o->choices, "|");
		for (char *c = choices; *c; c++) {
			if (*c == ',') {
				memmove(c, c + 1, strlen(c)); /* "a, b|c" -> "a b|c" */
				*c = '|';
			}
		}
		meta = choices;
	}
	if (!meta && o->type != CLI_FLAG) {
		meta = o->type == CLI_SIZE			   ? "N"
		       : o->type == CLI_STR || o->type == CLI_LIST ? "S"
								   : "N";
	}
	snprintf(left, sizeof(left), "  --%s%s%s", o->name, meta ? " " : "", meta ? meta : "");
	help_suffix(suffix, sizeof(suffix), o);
	size_t col = strlen(left);
	fputs(left, f);
	if (col >= HELP_COL) {
		fprintf(f, "\n%*s", HELP_COL, "");
	} else {
		fprintf(f, "%*s", (int)(HELP_COL - col), "");
	}
	const char *h = o->help ? o->help : "";
	for (;;) {
		const char *nl = strchr(h, '\n');
		size_t len = nl ? (size_t)(nl - h) : strlen(h);
		if (nl) {
			fprintf(f, "%.*s\n%*s", (int)len, h, HELP_COL, "");
			h = nl + 1;
			continue;
		}
		if (HELP_COL + len + strlen(suffix) > 100 && suffix[0]) {
			fprintf(f, "%.*s\n%*s%s\n", (int)len, h, HELP_COL, "", suffix + 1);
		} else {
			fprintf(f, "%.*s%s\n", (int)len, h, suffix);
		}
		break;
	}
}

void
cli_opts_help(FILE *f, const char *prog, const char *synopsis, const char *description,
	      const struct cli_opt *opts)
{
	fprintf(f, "usage: %s %s\n", prog, synopsis ? synopsis : "[options]");
	if (description) {
		fprintf(f, "\n%s", description);
		if (description[0] && description[strlen(description) - 1] != '\n') {
			fputc('\n', f);
		}
	}
	fputs("\n", f);
	for (size_t i = 0; opts[i].name; i++) {
		help_entry(f, &opts[i]);
	}
	fprintf(f, "  -h, --help%*sthis text\n", HELP_COL - 12, "");
}

int
cli_opts_main(const char *prog, const char *synopsis, const char *description,
	      const struct cli_opt *opts, int argc, char **argv)
{
	char err[512];
	int rc = cli_opts_parse(opts, argc, argv, err, sizeof(err));
	if (rc == CLI_PARSE_HELP) {
		cli_opts_help(stdout, prog, synopsis, description, opts);
		return 0;
	}
	if (rc < 0) {
		fprintf(stderr, "%s: %s\nRun `%s --help` for the options.\n", prog, err, prog);
		return 2;
	}
	return -1;
}

const char *
cli_take_positional(const struct cli_opt *opts, int argc, char **argv, char **rest, int *n_rest)
{
	const char *pos = NULL;
	int n = 0;
	if (argc > CLI_MAX_ARGS) {
		*n_rest = -1;
		return NULL;
	}
	for (int i = 0; i < argc; i++) {
		const char *a = argv[i];
		if (i > 0 && a[0] == '-' && a[1] == '-' && !strchr(a, '=')) {
			for (const struct cli_opt *o = opts; o->name; o++) {
				if (strcmp(a + 2, o->name) == 0 && o->type != CLI_FLAG &&
				    i + 1 < argc) {
					rest[n++] = argv[i++]; /* the option; its value below */
					break;
				}
			}
		} else if (i > 0 && !pos && a[0] != '-') {
			pos = a;
			continue;
		}
		rest[n++] = argv[i];
	}
	rest[n] = NULL;
	*n_rest = n;
	return pos;
}

/* ---- subcommands -------------------------------------------------------------------------- */

static void
list_cmds(FILE *f, const char *prog, const struct cli_cmd *cmds)
{
	int w = 0; /* the widest name, so that a summary never runs into it */
	for (int pass = 0; pass < 2; pass++) {
		if (pass == 1) {
			fprintf(f, "usage: %s <command> [options]\n\ncommands:\n", prog);
		}
		for (size_t i = 0; cmds[i].name; i++) {
			const struct cli_cmd *s = cmds[i].sub;
			do {
				char name[300];
				snprintf(name, sizeof(name), "%s%s%s", cmds[i].name, s ? " " : "",
					 s ? s->name : "");
				int n = (int)strlen(name);
				if (pass == 0) {
					w = n > w ? n : w;
				} else {
					fprintf(f, "  %-*s  %s\n", w, name,
						s ? s->summary : cmds[i].summary);
				}
			} while (s && (++s)->name);
		}
	}
	fprintf(f, "\nRun `%s <command> --help` for the options of each.\n", prog);
}

int
cli_dispatch(const char *prog, const struct cli_cmd *cmds, int argc, char **argv)
{
	if (argc < 2) {
		list_cmds(stderr, prog, cmds);
		return 2;
	}
	const char *want = argv[1];
	if (!strcmp(want, "--help") || !strcmp(want, "-h") || !strcmp(want, "help")) {
		list_cmds(stdout, prog, cmds);
		return 0;
	}
	size_t n = 0;
	while (cmds[n].name) {
		n++;
	}
	const char *names[64];
	for (size_t i = 0; i < n; i++) {
		if (strcmp(cmds[i].name, want) != 0) {
			if (i < 63) {
				names[i] = cmds[i].name;
			}
			continue;
		}
		if (cmds[i].sub) {
			char sub[128];
			snprintf(sub, sizeof(sub), "%s %s", prog, cmds[i].name);
			return cli_dispatch(sub, cmds[i].sub, argc - 1, argv + 1);
		}
		return cmds[i].run(argc - 1, argv + 1);
	}
	names[n < 63 ? n : 63] = NULL;
	const char *near = cli_nearest(want, names);
	if (near) {
		fprintf(stderr, "%s %s: unknown command; did you mean `%s %s`?\n", prog, want, prog,
			near);
	} else {
		fprintf(stderr, "%s %s: unknown command\n", prog, want);
		list_cmds(stderr, prog, cmds);
	}
	return 2;
}
