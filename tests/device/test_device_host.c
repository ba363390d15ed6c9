/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/device/test_device_host.c: the device handle (choosing a backend by name or the best,
 * its errors, the device count) and what only the host backend has: streams that run on their
 * own threads, ordered only by events. A copy stream held back by the test gate shows,
 * deterministically, that a kernel on another stream reads the old bytes without an event wait
 * and the new ones with it; the synchronous mode runs work as it is queued; an error while
 * queued work runs comes back from zinf_stream_sync.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/test_util.h"
#include "device/dev_internal.h"
#include "zinf/device.h"

static struct zinf_device *
open_host(bool sync)
{
	zt_log_to_stderr();
	struct zinf_device_opts o;
	zinf_device_opts_init(&o);
	o.backend = "host";
	o.host_sync = sync;
	struct zinf_device *d = NULL;
	cr_assert_eq(zinf_device_create(&o, &d), 0, "%s", zinf_last_error());
	return d;
}

static void
sleep_ms(int ms)
{
	struct timespec ts = {.tv_sec = 0, .tv_nsec = ms * 1000000L};
	nanosleep(&ts, NULL);
}

Test(device_host, create_by_name_best_and_errors)
{
	zt_log_to_stderr();
	struct zinf_device *d = open_host(false);
	cr_assert_str_eq(zinf_device_backend(d), "host");
	cr_assert_eq(zinf_device_index(d), 0);
	zinf_device_destroy(d);

	struct zinf_device_opts o;
	zinf_device_opts_init(&o);
	o.backend = "nonesuch";
	cr_assert_eq(zinf_device_create(&o, &d), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "\"nonesuch\": unknown"), "%s", zinf_last_error());
	o.backend = "host";
	o.index = 1;
	cr_assert_eq(zinf_device_create(&o, &d), -ENODEV);
	cr_assert(strstr(zinf_last_error(), "no device 1"), "%s", zinf_last_error());
	o.index = -1;
	cr_assert_eq(zinf_device_create(&o, &d), -EINVAL);
	o.index = 0;
	o.reserved[1] = 1;
	cr_assert_eq(zinf_device_create(&o, &d), -EINVAL);
	o.reserved[1] = 0;
	o.size = sizeof(o) + 8;
	cr_assert_eq(zinf_device_create(&o, &d), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "newer zinf"), "%s", zinf_last_error());

	/* NULL: cuda when it has a device, else host; "cuda" alone says why it is not there */
	o.backend = "cuda";
	o.size = sizeof(o);
	struct zinf_device *cuda = NULL;
	int rc = zinf_device_create(&o, &cuda);
	const char *why = zinf_last_error();
	cr_assert(rc == 0 ||
			  (rc == -ENODEV && (strstr(why, "not built") || strstr(why, "no device"))),
		  "%d %s", rc, why);
	cr_assert_eq(zinf_device_create(NULL, &d), 0);
	cr_assert_str_eq(zinf_device_backend(d), rc == 0 ? "cuda" : "host");
	zinf_device_destroy(d);
	zinf_device_destroy(cuda);

	/* the host has no native streams to wrap */
	d = open_host(false);
	struct zinf_stream *s = NULL;
	int x;
	cr_assert_eq(zinf_stream_wrap(d, &x, "trainer", &s), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "\"trainer\""), "%s", zinf_last_error());
	cr_assert_eq(zinf_stream_wrap(d, NULL, "trainer", &s), 0);
	cr_assert_null(zinf_stream_native(s));
	zinf_stream_destroy(s);
	zinf_device_destroy(d);
}

/* The engine takes the device of its local rank modulo zinf_device_count(): "host" counts one,
 * a backend that does not exist a negative errno. */
Test(device_host, device_count)
{
	cr_expect_eq(zinf_device_count("host"), 1);
	cr_expect_lt(zinf_device_count("no-such-backend"), 0);
}

/* The rig of the ordering tests: a copy stream (gated) and a compute stream. */
struct rig {
	struct zinf_device *d;
	struct zinf_stream *copy, *compute;
	struct zinf_event *landed, *done;
	float *src, *dbuf, *dacc;
	size_t n;
};

static void
rig_open(struct rig *r)
{
	r->d = open_host(false);
	r->n = 4096;
	cr_assert_eq(zinf_stream_create(r->d, "copy", &r->copy), 0);
	cr_assert_eq(zinf_stream_wrap(r->d, NULL, "compute", &r->compute), 0);
	cr_assert_eq(zinf_event_create(r->d, &r->landed), 0);
	cr_assert_eq(zinf_event_create(r->d, &r->done), 0);
	r->src = malloc(r->n * 4);
	for (size_t i = 0; i < r->n; i++) {
		r->src[i] = 7.0f;
	}
	cr_assert_eq(zinf_device_alloc(r->d, r->n * 4, (void **)&r->dbuf), 0);
	cr_assert_eq(zinf_device_alloc(r->d, r->n * 4, (void **)&r->dacc), 0);
	memset(r->dbuf, 0, r->n * 4); /* host memory: the host may touch it while idle */
	memset(r->dacc, 0, r->n * 4);
}

static void
rig_close(struct rig *r)
{
	zinf_device_free(r->d, r->dbuf);
	zinf_device_free(r->d, r->dacc);
	zinf_event_destroy(r->landed);
	zinf_event_destroy(r->done);
	zinf_stream_destroy(r->copy);
	zinf_stream_destroy(r->compute);
	zinf_device_destroy(r->d);
	free(r->src);
}

Test(device_host, without_the_event_the_kernel_reads_before_the_copy_lands)
{
	struct rig r;
	rig_open(&r);
	cr_assert_eq(dev_test_gate(r.copy, true), 0); /* the copy stream is "slow" */
	cr_assert_eq(zinf_device_copy(r.copy, r.dbuf, r.src, r.n * 4, ZINF_COPY_H2D), 0);
	/* no zinf_stream_wait_event: the engine bug this backend exists to catch */
	cr_assert_eq(zinf_device_accumulate(r.compute, r.dacc, r.dbuf, ZINF_F32, r.n), 0);
	cr_assert_eq(zinf_stream_sync(r.compute), 0);
	cr_assert_eq(r.dacc[0], 0.0f, "the kernel ran on the buffer before the copy: stale zeros");
	cr_assert_eq(r.dacc[r.n - 1], 0.0f);
	cr_assert_eq(dev_test_gate(r.copy, false), 0);
	cr_assert_eq(zinf_stream_sync(r.copy), 0);
	cr_assert_eq(r.dbuf[0], 7.0f, "the copy itself landed, later");
	rig_close(&r);
}

Test(device_host, with_the_event_the_kernel_waits_for_the_copy)
{
	struct rig r;
	rig_open(&r);
	cr_assert_eq(dev_test_gate(r.copy, true), 0);
	cr_assert_eq(zinf_device_copy(r.copy, r.dbuf, r.src, r.n * 4, ZINF_COPY_H2D), 0);
	cr_assert_eq(zinf_event_record(r.landed, r.copy), 0);
	cr_assert_eq(zinf_stream_wait_event(r.compute, r.landed), 0);
	cr_assert_eq(zinf_device_accumulate(r.compute, r.dacc, r.dbuf, ZINF_F32, r.n), 0);
	cr_assert_eq(zinf_event_record(r.done, r.compute), 0);
	sleep_ms(20); /* the compute stream would have run by now if nothing held it */
	cr_assert_eq(zinf_event_query(r.landed), 0, "the copy is held: its event is not done");
	cr_assert_eq(zinf_event_query(r.done), 0, "the kernel waits on the copy's event");
	cr_assert_eq(r.dacc[0], 0.0f);
	cr_assert_eq(dev_test_gate(r.copy, false), 0);
	cr_assert_eq(zinf_event_sync(r.done), 0);
	cr_assert_eq(zinf_event_query(r.landed), 1);
	for (size_t i = 0; i < r.n; i++) {
		cr_assert_eq(r.dacc[i], 7.0f, "element %zu: %g", i, r.dacc[i]);
	}
	rig_close(&r);
}

Test(device_host, a_wait_keeps_the_record_it_was_given)
{
	struct rig r;
	rig_open(&r);
	/* recorded on the held copy stream, waited on, then recorded again on the free compute
	 * stream: the wait queued before still needs the first record */
	cr_assert_eq(dev_test_gate(r.copy, true), 0);
	cr_assert_eq(zinf_event_record(r.landed, r.copy), 0);
	struct zinf_stream *third = NULL;
	cr_assert_eq(zinf_stream_create(r.d, "third", &third), 0);
	cr_assert_eq(zinf_stream_wait_event(third, r.landed), 0);
	cr_assert_eq(zinf_event_record(r.landed, r.compute), 0);
	cr_assert_eq(zinf_stream_sync(r.compute), 0);
	cr_assert_eq(zinf_event_query(r.landed), 1, "its latest record is done");
	cr_assert_eq(zinf_device_fill(third, r.dacc, ZINF_F32, 3.0f, r.n), 0);
	cr_assert_eq(zinf_event_record(r.done, third), 0);
	sleep_ms(20);
	cr_assert_eq(zinf_event_query(r.done), 0);
	cr_assert_eq(dev_test_gate(r.copy, false), 0);
	cr_assert_eq(zinf_stream_sync(third), 0);
	cr_assert_eq(r.dacc[5], 3.0f);
	zinf_stream_destroy(third);
	rig_close(&r);
}

Test(device_host, sync_mode_runs_work_as_it_is_queued)
{
	struct zinf_device *d = open_host(true);
	struct zinf_stream *s = NULL;
	cr_assert_eq(zinf_stream_create(d, "inline", &s), 0);
	float *x = NULL, src[4] = {1, 2, 3, 4};
	cr_assert_eq(zinf_device_alloc(d, sizeof(src), (void **)&x), 0);
	cr_assert_eq(zinf_device_copy(s, x, src, sizeof(src), ZINF_COPY_H2D), 0);
	cr_assert_eq(x[3], 4.0f, "copied before zinf_device_copy returned");
	cr_assert_eq(zinf_device_scale(s, x, ZINF_F32, -1.0f, 4), 0);
	cr_assert_eq(x[2], -3.0f);
	cr_assert_eq(dev_test_gate(s, true), 0); /* no thread to hold: ignored */
	cr_assert_eq(zinf_device_fill(s, x, ZINF_F32, 9.0f, 4), 0);
	cr_assert_eq(x[0], 9.0f);
	zinf_device_free(d, x);
	zinf_stream_destroy(s);
	zinf_device_destroy(d);
}

Test(device_host, an_error_while_running_comes_back_from_sync)
{
	struct zinf_device *d = open_host(false);
	struct zinf_stream *s = NULL;
	cr_assert_eq(zinf_stream_create(d, "adam", &s), 0);
	struct zinf_adam_opts o;
	zinf_adam_opts_init(&o);
	float p[4] = {1, 1, 1, 1}, g[4] = {1, 1, 1, 1}, m[4] = {0}, v[4] = {0};
	cr_assert_eq(dev_test_gate(s, true), 0);
	cr_assert_eq(zinf_device_adam(s, &o, 1, 1.0f, p, g, ZINF_F32, m, v, 4, NULL, ZINF_F32), 0);
	/* valid when queued; it fails when it runs */
	cr_assert_eq(dev_test_fail_next(s, -EIO), 0);
	cr_assert_eq(dev_test_gate(s, false), 0);
	cr_assert_eq(zinf_stream_sync(s), -EIO);
	cr_assert_eq(p[0], 1.0f, "nothing stepped");
	cr_assert_eq(zinf_stream_sync(s), 0, "the error is reported once");
	cr_assert_eq(zinf_device_adam(s, &o, 1, 1.0f, p, g, ZINF_F32, m, v, 4, NULL, ZINF_F32), 0);
	cr_assert_eq(zinf_stream_sync(s), 0);
	cr_assert_neq(p[0], 1.0f, "the stream runs on after an error");
	/* an unrunnable SIMD path is refused when queued, naming it */
	o.simd = "nonesuch";
	cr_assert_eq(zinf_device_adam(s, &o, 1, 1.0f, p, g, ZINF_F32, m, v, 4, NULL, ZINF_F32),
		     -EINVAL);
	cr_assert(strstr(zinf_last_error(), "nonesuch"), "%s", zinf_last_error());
	zinf_stream_destroy(s);
	zinf_device_destroy(d);
}

Test(device_host, null_handles_are_refused)
{
	zt_log_to_stderr();
	void *p = NULL;
	cr_assert_eq(zinf_device_alloc(NULL, 8, &p), -EINVAL);
	cr_assert_eq(zinf_stream_create(NULL, "x", NULL), -EINVAL);
	cr_assert_eq(zinf_event_create(NULL, NULL), -EINVAL);
	cr_assert_eq(zinf_stream_sync(NULL), -EINVAL);
	cr_assert_eq(zinf_event_query(NULL), -EINVAL);
	cr_assert_eq(zinf_event_sync(NULL), -EINVAL);
	cr_assert_eq(zinf_device_fill(NULL, &p, ZINF_F32, 0, 1), -EINVAL);
	cr_assert_eq(zinf_device_host_register(NULL, &p, 8), -EINVAL);
	cr_assert_eq(dev_test_gate(NULL, true), -EINVAL);
	zinf_device_destroy(NULL);
	zinf_stream_destroy(NULL);
	zinf_event_destroy(NULL);
	struct zinf_device *d = open_host(false);
	struct zinf_stream *s = NULL;
	cr_assert_eq(zinf_stream_create(d, "k", &s), 0);
	cr_assert_eq(zinf_device_accumulate(s, NULL, &p, ZINF_F32, 1), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "stream \"k\": NULL array"), "%s", zinf_last_error());
	cr_assert_eq(zinf_device_scale(s, &p, (enum zinf_dtype)9, 1.0f, 1), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "unknown dtype 9"), "%s", zinf_last_error());
	cr_assert_eq(zinf_device_sumsq(s, &p, ZINF_F32, 1, NULL), -EINVAL);
	cr_assert_eq(zinf_device_nonfinite(s, &p, ZINF_F32, 1, NULL), -EINVAL);
	zinf_stream_destroy(s);
	zinf_device_destroy(d);
}

/*
 * zinf_device_adam takes the caller's options by cpu_adam's rule: a size that ends inside the
 * simd pointer is refused (half a pointer copied over the default would be dereferenced).
 */
Test(device_host, adam_refuses_a_size_inside_the_simd_pointer)
{
	zt_log_to_stderr();
	struct zinf_device *d = open_host(false);
	struct zinf_stream *s = NULL;
	cr_assert_eq(zinf_stream_create(d, "adam", &s), 0);
	struct zinf_adam_opts o;
	zinf_adam_opts_init(&o);
	o.simd = "scalar";
	o.size = offsetof(struct zinf_adam_opts, simd) + sizeof(o.simd) / 2;
	float p[4] = {1, 1, 1, 1}, g[4] = {1, 1, 1, 1}, m[4] = {0}, v[4] = {0};
	cr_assert_eq(zinf_device_adam(s, &o, 1, 1.0f, p, g, ZINF_F32, m, v, 4, NULL, ZINF_F32),
		     -EINVAL);
	cr_assert(strstr(zinf_last_error(), "ends inside the field simd"), "%s", zinf_last_error());
	cr_assert(strstr(zinf_last_error(), "stream \"adam\""), "%s", zinf_last_error());
	/* an older caller without simd at all keeps the default path */
	o.size = offsetof(struct zinf_adam_opts, simd);
	cr_assert_eq(zinf_device_adam(s, &o, 1, 1.0f, p, g, ZINF_F32, m, v, 4, NULL, ZINF_F32), 0,
		     "%s", zinf_last_error());
	cr_assert_eq(zinf_stream_sync(s), 0);
	cr_assert_neq(p[0], 1.0f);
	zinf_stream_destroy(s);
	zinf_device_destroy(d);
}

/*
 * Destroying the device before its streams and events is a caller bug, logged; the stream's
 * thread and the event's marks still use the device's state, so it stays open until the last
 * of them is destroyed (before: freed under them; ASan saw the use after free).
 */
Test(device_host, a_device_destroyed_first_outlives_its_streams_and_events)
{
	zt_log_to_stderr();
	struct zinf_device *d = open_host(false);
	struct zinf_stream *s = NULL;
	struct zinf_event *e = NULL;
	cr_assert_eq(zinf_stream_create(d, "late", &s), 0);
	cr_assert_eq(zinf_event_create(d, &e), 0);
	float *x = NULL, src[4] = {1, 2, 3, 4};
	cr_assert_eq(zinf_device_alloc(d, sizeof(src), (void **)&x), 0);
	zinf_device_destroy(d);
	cr_assert(strstr(zinf_last_error(), "device host:0: destroyed with 1 streams and 1 events "
					    "alive: closed when the last of them is destroyed"),
		  "%s", zinf_last_error());
	cr_assert_eq(zinf_device_copy(s, x, src, sizeof(src), ZINF_COPY_H2D), 0);
	cr_assert_eq(zinf_event_record(e, s), 0);
	cr_assert_eq(zinf_event_sync(e), 0);
	cr_assert_eq(x[3], 4.0f);
	zinf_device_free(d, x); /* d is still open */
	zinf_event_destroy(e);
	zinf_stream_destroy(s);
}

/* CUDA's rule, kept by the host twin (seen on an H200, CUDA 13.0): a range overlapping a
   registered one is refused with -EEXIST, two ranges sharing a page but no byte both register,
   and a range unregistered may be registered again. */
Test(device_host, host_registration_refuses_overlap_as_cuda_does)
{
	struct zinf_device *d = open_host(false);
	char *buf = zinf_alloc_aligned(4096, 8192);
	cr_assert_not_null(buf);
	cr_assert_eq(zinf_device_host_register(d, buf, 768), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_device_host_register(d, buf + 768, 384), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_device_host_register(d, buf + 100, 100), -EEXIST);
	cr_assert(strstr(zinf_last_error(), "overlaps"), "%s", zinf_last_error());
	cr_assert_eq(zinf_device_host_register(d, buf + 1000, 4096), -EEXIST); /* straddles */
	zinf_device_host_unregister(d, buf);
	cr_assert_eq(zinf_device_host_register(d, buf + 100, 100), 0, "%s", zinf_last_error());
	zinf_device_host_unregister(d, buf + 100);
	zinf_device_host_unregister(d, buf + 768);
	zinf_device_destroy(d); /* nothing left registered: no leak under ASan */
	zinf_free_aligned(buf);
}
