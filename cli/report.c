/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cli/report.c: what every subcommand's report is made of: the JSON writer (jansson; a number
 * that is not finite becomes null, never `nan`), medians, sizes as a person reads them, and the
 * progress bar. It computes no benchmark figure itself.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

json_t *
cli_json_real(double v)
{
	return isfinite(v) ? json_real(v) : json_null();
}

double
cli_json_num(const json_t *o, const char *key)
{
	json_t *v = o ? json_object_get(o, key) : NULL;
	return json_is_number(v) ? json_number_value(v) : NAN;
}

int
cli_json_print(json_t *o, int indent)
{
	char *s = json_dumps(o, JSON_PRESERVE_ORDER | (indent ? JSON_INDENT(indent) : 0));
	json_decref(o);
	if (!s) {
		return -ENOMEM;
	}
	int rc = printf("%s\n", s) < 0 || fflush(stdout) ? -EIO : 0;
	free(s);
	return rc;
}

static int
cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

double
cli_median(const double *v, size_t n)
{
	if (n == 0) {
		return NAN;
	}
	double *s = malloc(n * sizeof(*s));
	if (!s) {
		return NAN;
	}
	memcpy(s, v, n * sizeof(*s));
	qsort(s, n, sizeof(*s), cmp_double);
	double m = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
	free(s);
	return m;
}

void
cli_size_str(char *out, size_t n, uint64_t b)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	int k = 0;
	while (k < 5 && b >= (1ull << (10 * (k + 1)))) {
		k++;
	}
	uint64_t u = 1ull << (10 * k);
	if (b % u == 0) {
		snprintf(out, n, "%llu %s", (unsigned long long)(b / u), unit[k]);
	} else {
		snprintf(out, n, "%.1f %s", (double)b / (double)u, unit[k]);
	}
}

void
cli_progress_init(struct cli_progress *p, const char *label, uint64_t total)
{
	p->tty = isatty(STDERR_FILENO);
	p->label = label;
	p->total = total ? total : 1;
	p->done = 0;
	p->last_pct = -1;
}

void
cli_progress_add(struct cli_progress *p, uint64_t n)
{
	p->done += n;
	if (!p->tty) {
		return;
	}
	int pct = (int)(100.0 * (double)p->done / (double)p->total);
	pct = pct > 100 ? 100 : pct;
	if (pct == p->last_pct) {
		return;
	}
	p->last_pct = pct;
	char bar[41];
	int fill = pct * 40 / 100;
	memset(bar, '#', fill);
	memset(bar + fill, '.', 40 - fill);
	bar[40] = '\0';
	fprintf(stderr, "\r%-24s [%s] %3d%%", p->label, bar, pct);
	fflush(stderr);
}

void
cli_progress_done(struct cli_progress *p)
{
	if (p->tty && p->last_pct >= 0) {
		fprintf(stderr, "\r%*s\r", 80, "");
		fflush(stderr);
	}
}
