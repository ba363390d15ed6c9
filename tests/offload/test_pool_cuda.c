/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/offload/test_pool_cuda.c: a pinned pool registered with a CUDA device
 * (cudaHostRegister), its buffers copied to device memory and back. Its own binary (label gpu)
 * so that without a GPU, or without CUDA in the build, ctest shows it skipped.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "common/test_util.h"
#include "zinf/blocks/offload.h"

Test(pool_cuda, registers_the_pool_and_copies_through_it)
{
	zt_log_to_stderr();
	struct zinf_device_opts dopts;
	zinf_device_opts_init(&dopts);
	dopts.backend = "cuda";
	struct zinf_device *d = NULL;
	int rc = zinf_device_create(&dopts, &d);
	if (rc == -ENODEV) {
		cr_skip_test("no CUDA device (or zinf built without CUDA): %s", zinf_last_error());
	}
	cr_assert_eq(rc, 0, "%s", zinf_last_error());
	struct zinf_pool_opts o;
	zinf_pool_opts_init(&o);
	o.buffer_count = 2;
	o.buffer_bytes = 1 << 20;
	o.device = d;
	struct zinf_pool *p = NULL;
	cr_assert_eq(zinf_pool_create(&o, &p), 0, "%s", zinf_last_error());
	cr_assert_str_eq(zinf_pool_device(p), "cuda");
	void *b = NULL, *dm = NULL;
	cr_assert_geq(zinf_pool_acquire(p, 0, &b), 0);
	memset(b, 3, 1 << 20);
	struct zinf_stream *s = NULL;
	cr_assert_eq(zinf_stream_create(d, "copy", &s), 0);
	cr_assert_eq(zinf_device_alloc(d, 1 << 20, &dm), 0);
	cr_assert_eq(zinf_device_copy(s, dm, b, 1 << 20, ZINF_COPY_H2D), 0);
	cr_assert_eq(zinf_stream_sync(s), 0);
	memset(b, 0, 1 << 20);
	cr_assert_eq(zinf_device_copy(s, b, dm, 1 << 20, ZINF_COPY_D2H), 0);
	cr_assert_eq(zinf_stream_sync(s), 0);
	cr_assert_eq(((unsigned char *)b)[12345], 3);
	zinf_device_free(d, dm);
	zinf_stream_destroy(s);
	zinf_pool_release(p, b);
	zinf_pool_destroy(p);
	zinf_device_destroy(d);
}
