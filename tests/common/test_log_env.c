/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/common/test_log_env.c: the library's log level defaults to $ZINF_LOG_LEVEL, read at
 * the first message (ctest runs this binary as log_env.debug with ZINF_LOG_LEVEL=debug and as
 * log_env.bad with ZINF_LOG_LEVEL=loud); zinf_log_set_level overrides it. Each test runs in a
 * process of its own (Criterion forks), where nothing of zinf's ran before it.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"

struct seen {
	int debug, warn;
	char last[256];
};

static void
keep(void *ctx, enum zinf_log_level level, const char *file, int line, const char *func,
     const char *msg)
{
	(void)file, (void)line, (void)func;
	struct seen *s = ctx;
	s->debug += level == ZINF_LOG_DEBUG;
	s->warn += level == ZINF_LOG_WARN;
	snprintf(s->last, sizeof(s->last), "%s", msg);
}

static bool
env_is_debug(void)
{
	const char *v = getenv("ZINF_LOG_LEVEL");
	cr_assert(v, "run by ctest with ZINF_LOG_LEVEL set");
	return strcmp(v, "debug") == 0;
}

Test(log_env, default_level_from_the_environment)
{
	bool debug = env_is_debug();
	struct seen s = {0};
	zinf_log_set_callback(keep, &s);
	ZINF_LOG(ZINF_LOG_DEBUG, "a debug message");
	ZINF_LOG(ZINF_LOG_DEBUG, "another");
	if (debug) {
		cr_assert_eq(zinf_log_get_level(), ZINF_LOG_DEBUG);
		cr_assert_eq(s.debug, 2, "debug messages reach the sink");
		cr_assert_eq(s.warn, 0);
	} else {
		/* unreadable: the default level, said once as a warning naming the value */
		cr_assert_eq(zinf_log_get_level(), ZINF_LOG_WARN);
		cr_assert_eq(s.debug, 0);
		cr_assert_eq(s.warn, 1, "one warning, not one per message");
		cr_assert(strstr(s.last, "ZINF_LOG_LEVEL=loud"), "%s", s.last);
	}
	zinf_log_set_callback(NULL, NULL);
}

Test(log_env, set_level_overrides_the_environment)
{
	(void)env_is_debug();
	struct seen s = {0};
	zinf_log_set_level(ZINF_LOG_ERROR);
	zinf_log_set_callback(keep, &s);
	ZINF_LOG(ZINF_LOG_DEBUG, "dropped");
	ZINF_LOG(ZINF_LOG_WARN, "dropped too");
	cr_assert_eq(zinf_log_get_level(), ZINF_LOG_ERROR);
	cr_assert_eq(s.debug + s.warn, 0, "%s", s.last);
	zinf_log_set_callback(NULL, NULL);
}
