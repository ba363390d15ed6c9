/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli/opts.h: the option tables of the `zinf` command. Each subcommand declares one table of
 * struct cli_opt (name, type, destination, default, help); the engine builds getopt_long's
 * table from it, applies the defaults, checks every value (sizes, ranges, enumerations, repeated
 * options), names the nearest option for a typo, and writes the --help text. Adding an option
 * is one line in a table. Also the subcommand tables that `zinf` dispatches through.
 */
#ifndef ZINF_CLI_OPTS_H
#define ZINF_CLI_OPTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum cli_opt_type {
	CLI_FLAG,   /* bool; no value */
	CLI_SIZE,   /* uint64_t bytes: "4096", "64K", "1.5G", "2GiB", "1e9" */
	CLI_COUNT,  /* uint64_t count: "200000000", "2e8" (an exact integer) */
	CLI_U32,    /* uint32_t count, as CLI_COUNT; the range must fit 32 bits */
	CLI_INT,    /* int count, as CLI_COUNT; the range must fit an int */
	CLI_DOUBLE, /* double, finite */
	CLI_STR,    /* const char * (points into argv) */
	CLI_ENUM,   /* int: index into choices */
	CLI_LIST,   /* struct cli_list: every occurrence appended (--path A --path B) */
};

enum cli_opt_flags {
	CLI_POW2 = 1 << 0,     /* CLI_SIZE/CLI_COUNT/CLI_U32: a power of two */
	CLI_REQUIRED = 1 << 1, /* must be given ("--params is required") */
};

#define CLI_LIST_MAX 16

struct cli_list {
	const char *v[CLI_LIST_MAX];
	unsigned n;
};

struct cli_opt {
	const char *name; /* long name without "--" */
	enum cli_opt_type type;
	void *dest;		    /* typed as the type above says */
	const char *def;	    /* default, parsed like a value (NULL: zero / empty / NULL) */
	const char *meta;	    /* value's name in --help ("N", "DIR"); enums: the choices */
	const char *help;	    /* may hold '\n' for further lines */
	double min, max;	    /* numbers: inclusive range; both 0: the type's whole range */
	const char *const *choices; /* CLI_ENUM: NULL-terminated */
	unsigned flags;		    /* enum cli_opt_flags */
	bool *given;		    /* set true when the option appears (may be NULL) */
};

/* A subcommand, or a group of them (`bench`). */
struct cli_cmd {
	const char *name;
	const char *summary; /* one line for the parent's list */
	int (*run)(int argc, char **argv);
	const struct cli_cmd *sub; /* a group: its subcommands, ended by {NULL} */
};

/* What a parse ended with. */
enum { CLI_PARSE_OK = 0, CLI_PARSE_HELP = 1 };

/*
 * Parse argv[1..] (argv[0] is the subcommand) against opts, ended by {NULL}: defaults first,
 * then every option. Returns CLI_PARSE_OK, CLI_PARSE_HELP (--help/-h seen), or -EINVAL with
 * one line in err ("--queue-depth 0: must be in [1, 4096]"). Positional arguments are errors.
 */
int cli_opts_parse(const struct cli_opt *opts, int argc, char **argv, char *err, size_t errlen);

/*
 * The help text: "usage: <prog> <synopsis>", the description, then one entry per option with its
 * metavariable, help, default and range, generated from the table.
 */
void cli_opts_help(FILE *f, const char *prog, const char *synopsis, const char *description,
		   const struct cli_opt *opts);

/*
 * A subcommand's usual front: parse; on --help print the help to stdout and return 0; on an
 * error print "<prog>: <err>" and "run `<prog> --help`" to stderr and return 2. Returns -1 when
 * the command should go on.
 */
int cli_opts_main(const char *prog, const char *synopsis, const char *description,
		  const struct cli_opt *opts, int argc, char **argv);

/*
 * A command's one positional argument (FILE, DIR) taken out of argv: rest (CLI_MAX_ARGS + 1
 * entries) gets the others, argv[0] first, NULL-ended, for cli_opts_main; an option's separate
 * value ("--world 2") is never taken for it. Returns it, or NULL (none), and sets *n_rest; with
 * more than CLI_MAX_ARGS arguments *n_rest is -1 (the caller refuses them).
 */
#define CLI_MAX_ARGS 256
const char *cli_take_positional(const struct cli_opt *opts, int argc, char **argv, char **rest,
				int *n_rest);

/* Parse a value of one type (the engine's own parsers). Return 0 or -EINVAL. */
int cli_parse_size(const char *s, uint64_t *out);
int cli_parse_count(const char *s, uint64_t *out);

/* Levenshtein distance of a and b (bytes), and the nearest of names (NULL-ended) if close. */
unsigned cli_edit_distance(const char *a, const char *b);
const char *cli_nearest(const char *word, const char *const *names);

/*
 * Run a group: argv[0] is the group's name, argv[1] the subcommand. --help/-h/help lists the
 * subcommands and returns 0; an unknown one is an error naming the nearest (exit 2).
 */
int cli_dispatch(const char *prog, const struct cli_cmd *cmds, int argc, char **argv);

#endif
