/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/cli/cli_run.h: run the built `zinf` ($ZINF_CLI, set by CMake) as a user does: in a
 * directory, with stdout and stderr to files, optionally under a shell prefix (ulimit), and read
 * what it left: its exit status, its JSON, its messages, the files in a directory.
 */
#ifndef ZINF_TESTS_CLI_RUN_H
#define ZINF_TESTS_CLI_RUN_H

#include <jansson.h>
#include <sys/types.h>

/* $ZINF_CLI, or skip the test. */
const char *zc_cli(void);
/*
 * Start the CLI in cwd (NULL: here) with argv (argv[0] is replaced by $ZINF_CLI), stdout to
 * out_path and stderr to err_path (either NULL: /dev/null). Returns the pid.
 */
pid_t zc_spawn(const char *cwd, char *const argv[], const char *out_path, const char *err_path);
/* Wait for pid: its exit code, or 1000 + the signal that killed it. */
int zc_status(pid_t pid);
/* Run to the end: zc_spawn + zc_status. */
int zc_run(const char *cwd, char *const argv[], const char *out_path, const char *err_path);
/* The file's JSON (asserts it parses). */
json_t *zc_json(const char *path);
/* The file's text, malloc'ed (asserts it reads). */
char *zc_text(const char *path);
/* Entries in dir, hidden ones included. */
int zc_count(const char *dir);
/* A fresh directory on tmpfs (/dev/shm; zt_rmtree it), or skip the test. */
char *zc_tmpfs_dir(void);
/* The number j[key] (asserts it is one). */
double zc_num(json_t *j, const char *key);
/* Occurrences of needle in hay (not overlapping). */
size_t zc_count_substr(const char *hay, const char *needle);

/* A scratch directory (zt_mkdtemp) and the names of files for a run's stdout and stderr. */
struct zc_scratch {
	char *dir;
	char out[4200], err[4200];
};
void zc_scratch_init(struct zc_scratch *s);
/* Remove the directory tree and the two files. */
void zc_scratch_fini(struct zc_scratch *s);
/*
 * Run the CLI through the shell, as `<pre>; exec <wrap> zinf <args>` (pre: "ulimit -v 400000",
 * wrap: "valgrind -q"; either may be ""), stdout and stderr to s's files; args is a printf
 * format. Asserts no signal killed it; returns its exit code.
 */
int zc_run_sh(const struct zc_scratch *s, const char *pre, const char *wrap, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

/*
 * Run the CLI with argv in a fresh directory; assert exit 2, `want` in its stderr and nothing
 * created in the directory.
 */
void zc_refused(char *const argv[], const char *want);
/* Skip the test unless this run is variant v ("alone" or "mpi", $ZINF_VARIANT). */
void zc_need_variant(const char *v);
/*
 * Run `$ZINF_MPIRUN --oversubscribe --bind-to none -np n <zinf> args...` (args NULL-ended, at
 * most 40), stdout and stderr to out_path and err_path; its exit status (zc_status). Skips the
 * test when MPI was not built.
 */
int zc_mpirun(int n, const char *const *args, const char *out_path, const char *err_path);

#endif
