/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_adam/adam_registry.c: the SIMD paths, best first, and the choice of one for a call (the
 * rule is in zinf/blocks/adam.h: the option, else $ZINF_SIMD read once, else the best path here).
 * The only file in cpu_adam/ that knows which paths were built (ZINF_ADAM_HAVE_*): a path that was
 * not is a stub table whose missing() says so, and asking for it is -ENODEV. Tables are listed
 * here, never registered from constructors (a static library would drop them). Also the
 * public zinf_simd_* queries. Not here: the kernels (adam_<isa>.c) and their use (adam.c).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "cpu_adam/adam_internal.h"

__attribute__((unused)) static const char *
not_built(const struct zinf_cpu_features *f)
{
	return "not built into this library (the compiler did not take the path's -m flags)";
}

#if ZINF_ADAM_HAVE_AVX512
extern const struct zinf_adam_ops zinf_adam_avx512_ops;
#else
static const struct zinf_adam_ops zinf_adam_avx512_ops = {
	.name = "avx512",
	.missing = not_built,
};
#endif

#if ZINF_ADAM_HAVE_AVX2
extern const struct zinf_adam_ops zinf_adam_avx2_ops;
#else
static const struct zinf_adam_ops zinf_adam_avx2_ops = {
	.name = "avx2",
	.missing = not_built,
};
#endif

const struct zinf_adam_ops *const zinf_adam_registry[] = {
	&zinf_adam_avx512_ops,
	&zinf_adam_avx2_ops,
	&zinf_adam_scalar_ops,
};
const unsigned zinf_adam_registry_len = ZINF_ARRAY_SIZE(zinf_adam_registry);

/*
 * What the choice rests on, computed once per process (pthread_once) and never written after:
 * a constant computed late, not mutable state. cpuid traps to the hypervisor in a VM (about
 * 50 us for the whole probe on the development VM, more than a small step takes), and the
 * environment is read once so that a step never calls getenv (not thread-safe against setenv)
 * and a process keeps one default path.
 */
static struct {
	struct zinf_cpu_features cpu;
	const struct zinf_adam_ops *best;    /* the best path this CPU runs */
	const struct zinf_adam_ops *env_ops; /* the path $ZINF_SIMD names, if it runs here */
	char env[32];			     /* $ZINF_SIMD ("" when unset or empty), truncated */
	char names[64];			     /* "avx512, avx2 or scalar", for messages */
} proc;
static pthread_once_t proc_once = PTHREAD_ONCE_INIT;

static const struct zinf_adam_ops *
find(const char *name)
{
	for (unsigned k = 0; k < zinf_adam_registry_len; k++) {
		if (strcmp(zinf_adam_registry[k]->name, name) == 0) {
			return zinf_adam_registry[k];
		}
	}
	return NULL;
}

static void
proc_probe(void)
{
	zinf_cpu_features_get(&proc.cpu);
	proc.best = &zinf_adam_scalar_ops;
	for (unsigned k = 0; k < zinf_adam_registry_len; k++) {
		if (!zinf_adam_registry[k]->missing(&proc.cpu)) {
			proc.best = zinf_adam_registry[k];
			break;
		}
	}
	const char *env = getenv("ZINF_SIMD");
	snprintf(proc.env, sizeof(proc.env), "%s", env ? env : "");
	const struct zinf_adam_ops *ops = proc.env[0] ? find(proc.env) : NULL;
	proc.env_ops = ops && !ops->missing(&proc.cpu) ? ops : NULL;
	size_t len = 0;
	for (unsigned k = 0; k < zinf_adam_registry_len; k++) {
		const char *sep = k == 0 ? "" : k + 1 < zinf_adam_registry_len ? ", " : " or ";
		len += (size_t)snprintf(proc.names + len, sizeof(proc.names) - len, "%s%s", sep,
					zinf_adam_registry[k]->name);
	}
}

const struct zinf_cpu_features *
adam_cpu_features(void)
{
	pthread_once(&proc_once, proc_probe);
	return &proc.cpu;
}

/* The table named `name`, or -EINVAL / -ENODEV naming the caller and where the name came from. */
static int
lookup(const char *name, const char *from, const char *who, const struct zinf_adam_ops **out)
{
	const struct zinf_adam_ops *ops = find(name);
	if (!ops) {
		return ZINF_FAIL(-EINVAL, "%s: SIMD path \"%s\" (%s) is unknown: expected %s", who,
				 name, from, proc.names);
	}
	const char *why = ops->missing(&proc.cpu);
	if (why) {
		return ZINF_FAIL(-ENODEV, "%s: SIMD path %s (%s): %s", who, name, from, why);
	}
	*out = ops;
	return 0;
}

int
adam_select(const char *simd, const char *who, const struct zinf_adam_ops **out)
{
	pthread_once(&proc_once, proc_probe);
	if (simd) {
		return lookup(simd, "opts.simd", who, out);
	}
	if (!proc.env[0]) {
		*out = proc.best;
		return 0;
	}
	if (proc.env_ops) {
		*out = proc.env_ops;
		return 0;
	}
	return lookup(proc.env, "ZINF_SIMD, read once per process", who, out);
}

const char *
zinf_simd_path(unsigned i)
{
	return i < zinf_adam_registry_len ? zinf_adam_registry[i]->name : NULL;
}

const char *
zinf_simd_best(void)
{
	pthread_once(&proc_once, proc_probe);
	return proc.best->name;
}

int
zinf_simd_resolve(const char *simd, const char **out)
{
	const struct zinf_adam_ops *ops;
	int r = adam_select(simd, __func__, &ops);
	if (r == 0 && out) {
		*out = ops->name;
	}
	return r;
}
