/* SPDX-License-Identifier: Apache-2.0 */
/* common/time.c: the monotonic clock. */
#include <time.h>

#include "common/util.h"

uint64_t
zinf_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double
zinf_now_s(void)
{
	return (double)zinf_now_ns() * 1e-9;
}
