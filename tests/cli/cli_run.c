/* SPDX-License-Identifier: Apache-2.0 */
/* tests/cli/cli_run.c: see cli_run.h. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli_run.h"
#include "common/test_util.h"

const char *
zc_cli(void)
{
	const char *p = getenv("ZINF_CLI");
	if (!p || access(p, X_OK) != 0) {
		cr_skip_test("ZINF_CLI not set or not executable (run through ctest)");
	}
	return p;
}

static void
redirect(const char *path, int fd)
{
	int f = open(path ? path : "/dev/null", O_CREAT | O_TRUNC | O_WRONLY, 0600);
	if (f < 0) {
		_exit(121);
	}
	dup2(f, fd);
	close(f);
}

pid_t
zc_spawn(const char *cwd, char *const argv[], const char *out_path, const char *err_path)
{
	const char *z = zc_cli();
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		if (cwd && chdir(cwd) != 0) {
			_exit(120);
		}
		redirect(out_path, 1);
		redirect(err_path, 2);
		execv(z, argv);
		_exit(122);
	}
	return pid;
}

int
zc_status(pid_t pid)
{
	int st = 0;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 1000 + WTERMSIG(st);
}

int
zc_run(const char *cwd, char *const argv[], const char *out_path, const char *err_path)
{
	return zc_status(zc_spawn(cwd, argv, out_path, err_path));
}

json_t *
zc_json(const char *path)
{
	json_error_t e;
	json_t *j = json_load_file(path, 0, &e);
	cr_assert_not_null(j, "%s: not JSON: %s (line %d)", path, e.text, e.line);
	return j;
}

char *
zc_text(const char *path)
{
	FILE *f = fopen(path, "r");
	cr_assert_not_null(f, "%s", path);
	char *buf = calloc(1, 1 << 16);
	size_t n = fread(buf, 1, (1 << 16) - 1, f);
	buf[n] = '\0';
	fclose(f);
	return buf;
}

int
zc_count(const char *dir)
{
	DIR *d = opendir(dir);
	cr_assert_not_null(d, "%s", dir);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	}
	closedir(d);
	return n;
}

double
zc_num(json_t *j, const char *key)
{
	json_t *v = json_object_get(j, key);
	cr_assert(json_is_number(v), "%s is not a number", key);
	return json_number_value(v);
}

void
zc_scratch_init(struct zc_scratch *s)
{
	s->dir = zt_mkdtemp(NULL);
	snprintf(s->out, sizeof(s->out), "%s.out", s->dir);
	snprintf(s->err, sizeof(s->err), "%s.err", s->dir);
}

void
zc_scratch_fini(struct zc_scratch *s)
{
	unlink(s->out);
	unlink(s->err);
	zt_rmtree(s->dir);
	free(s->dir);
}

char *
zc_tmpfs_dir(void)
{
	struct statfs fs;
	if (statfs("/dev/shm", &fs) != 0 || fs.f_type != 0x01021994 /* TMPFS_MAGIC */) {
		cr_skip_test("no tmpfs at /dev/shm");
	}
	return zt_mkdtemp("/dev/shm");
}

size_t
zc_count_substr(const char *hay, const char *needle)
{
	size_t n = 0;
	for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle)) {
		n++;
	}
	return n;
}

int
zc_run_sh(const struct zc_scratch *s, const char *pre, const char *wrap, const char *fmt, ...)
{
	char args[4096], cmd[16384];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(args, sizeof(args), fmt, ap);
	va_end(ap);
	snprintf(cmd, sizeof(cmd), "%s%s exec %s '%s' %s >'%s' 2>'%s'", pre, pre[0] ? ";" : "",
		 wrap, zc_cli(), args, s->out, s->err);
	int st = system(cmd);
	cr_assert(WIFEXITED(st), "%s: killed by signal %d", cmd,
		  WIFSIGNALED(st) ? WTERMSIG(st) : 0);
	return WEXITSTATUS(st);
}

void
zc_need_variant(const char *v)
{
	const char *cur = zt_variant();
	if (!cur || strcmp(cur, v) != 0) {
		cr_skip_test("variant %s only", v);
	}
}

int
zc_mpirun(int n, const char *const *args, const char *out_path, const char *err_path)
{
	const char *mpi = getenv("ZINF_MPIRUN");
	if (!mpi || !*mpi) {
		cr_skip_test("no mpirun (MPI not built)");
	}
	char np[16];
	snprintf(np, sizeof(np), "%d", n);
	const char *argv[48] = {mpi, "--oversubscribe", "--bind-to", "none", "-np", np, zc_cli()};
	int k = 7;
	for (int i = 0; args[i]; i++) {
		cr_assert_lt(k, 47, "too many arguments for mpirun");
		argv[k++] = args[i];
	}
	argv[k] = NULL;
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		int fo = open(out_path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
		int fe = open(err_path, O_CREAT | O_TRUNC | O_WRONLY, 0600);
		if (fo < 0 || fe < 0) {
			_exit(121);
		}
		dup2(fo, 1);
		dup2(fe, 2);
		execv(mpi, (char *const *)argv);
		_exit(122);
	}
	return zc_status(pid);
}

void
zc_refused(char *const argv[], const char *want)
{
	char *d = zt_mkdtemp(NULL);
	char err[4200];
	snprintf(err, sizeof(err), "%s.err", d);
	cr_assert_eq(zc_run(d, argv, NULL, err), 2);
	char *t = zc_text(err);
	cr_assert(strstr(t, want), "want '%s' in:\n%s", want, t);
	free(t);
	cr_assert_eq(zc_count(d), 0, "nothing created");
	unlink(err);
	zt_rmtree(d);
	free(d);
}
