/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/offload/test_pool.c: the pinned pool. Budgets are checked before anything is allocated
 * (physical memory; RLIMIT_MEMLOCK as a process without CAP_IPC_LOCK, dropped with capset(2)
 * in Criterion's forked test process); a real mlock failure; unpinned mode; buffers: waiting,
 * timeouts, the self-deadlock check; the CPU region; I/O through registered buffers; the device
 * handle it registers with (host here; CUDA registration is test_pool_cuda.c, label gpu).
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <linux/capability.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/test_util.h"
#include "common/util.h"
#include "zinf/blocks/offload.h"

/* ASan intercepts mlock and makes it a no-op: VmLck stays 0 and mlock cannot fail. */
#if defined(__SANITIZE_ADDRESS__)
#define MLOCK_REAL 0
#else
#define MLOCK_REAL 1
#endif

static uint64_t
vm_kb(const char *key)
{
	FILE *f = fopen("/proc/self/status", "re");
	char line[256];
	uint64_t v = 0;
	size_t kl = strlen(key);
	while (f && fgets(line, sizeof(line), f)) {
		if (strncmp(line, key, kl) == 0 && line[kl] == ':') {
			sscanf(line + kl + 1, "%" SCNu64, &v);
		}
	}
	if (f) {
		fclose(f);
	}
	return v;
}

/* This (forked) test process stops being privileged for memory locking. */
static void
drop_ipc_lock(uint64_t memlock)
{
	struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
	struct __user_cap_data_struct d[2];
	cr_assert_eq(syscall(SYS_capget, &h, d), 0);
	int i = CAP_TO_INDEX(CAP_IPC_LOCK);
	d[i].effective &= ~CAP_TO_MASK(CAP_IPC_LOCK);
	d[i].permitted &= ~CAP_TO_MASK(CAP_IPC_LOCK);
	d[i].inheritable &= ~CAP_TO_MASK(CAP_IPC_LOCK);
	cr_assert_eq(syscall(SYS_capset, &h, d), 0, "capset: %s", strerror(errno));
	struct rlimit rl = {.rlim_cur = memlock, .rlim_max = memlock};
	cr_assert_eq(setrlimit(RLIMIT_MEMLOCK, &rl), 0);
	struct zinf_pool_budget b;
	struct zinf_pool_opts o;
	zinf_pool_opts_init(&o);
	o.cpu_bytes = 4096;
	o.pin_memory = false;
	cr_assert_eq(zinf_pool_check(&o, &b), 0);
	cr_assert(b.memlock_binding, "the limit should bind once CAP_IPC_LOCK is dropped");
	cr_assert_eq(b.memlock_limit, memlock);
}

static void
opts(struct zinf_pool_opts *o, uint32_t count, uint64_t bytes)
{
	zinf_pool_opts_init(o);
	o->buffer_count = count;
	o->buffer_bytes = bytes;
}

Test(pool, buffers_acquire_release_and_backpressure)
{
	zt_log_to_stderr();
	struct zinf_pool_opts o;
	opts(&o, 4, 65536 + 100);
	o.numa_node = 0;
	o.cpu_bytes = 1 << 20;
	struct zinf_pool *p = NULL;
	cr_assert_eq(zinf_pool_create(&o, &p), 0);
	cr_assert(zinf_pool_pinned(p)); /* root: CAP_IPC_LOCK */
	cr_assert_eq(zinf_pool_numa_node(p), 0);
	cr_assert_eq(zinf_pool_buffer_bytes(p), 65536 + 4096);
	cr_assert_eq(zinf_pool_buffer_count(p), 4);
	cr_assert_geq(zinf_pool_bytes(p), 4 * (65536 + 4096) + (1 << 20));
	cr_assert(!MLOCK_REAL || vm_kb("VmLck") * 1024 >= zinf_pool_bytes(p));
	void *b[4];
	for (int i = 0; i < 4; i++) {
		int idx = zinf_pool_acquire(p, 0, &b[i]);
		cr_assert_geq(idx, 0);
		cr_assert(ZINF_IS_ALIGNED((uintptr_t)b[i], 4096));
		memset(b[i], i + 1, zinf_pool_buffer_bytes(p));
		for (int j = 0; j < i; j++) {
			cr_assert_neq(b[i], b[j]);
		}
	}
	for (int i = 0; i < 4; i++) {
		cr_assert_eq(((unsigned char *)b[i])[zinf_pool_buffer_bytes(p) - 1], i + 1,
			     "buffers overlap");
	}
	void *x = NULL;
	cr_assert_eq(zinf_pool_acquire(p, 0, &x), -EAGAIN);
	cr_assert(strstr(zinf_last_error(), "offload_optimizer.buffer_count"), "%s",
		  zinf_last_error());
	/* Every buffer is ours: waiting would never end. */
	cr_assert_eq(zinf_pool_acquire(p, -1, &x), -EDEADLK);
	cr_assert(strstr(zinf_last_error(), "buffer_count"));
	cr_assert_eq(zinf_pool_free_count(p), 0);
	cr_assert_eq(zinf_pool_release(p, (char *)b[1] + 8), -EINVAL);
	cr_assert_eq(zinf_pool_release(p, b[1]), 0);
	cr_assert_eq(zinf_pool_release(p, b[1]), -EINVAL);
	cr_assert_eq(zinf_pool_acquire(p, 0, &x), 1 /* index of b[1] */);
	cr_assert_eq(x, b[1]);
	for (int i = 0; i < 4; i++) {
		cr_assert_eq(zinf_pool_release(p, b[i]), 0);
	}
	cr_assert_eq(zinf_pool_free_count(p), 4);

	void *c1, *c2, *c3;
	cr_assert_eq(zinf_pool_cpu_alloc(p, 1000, &c1), 0);
	cr_assert_eq(zinf_pool_cpu_alloc(p, (1 << 20) - 4096, &c2), 0);
	cr_assert_eq((char *)c2 - (char *)c1, 4096);
	cr_assert_eq(zinf_pool_cpu_alloc(p, 1, &c3), -ENOMEM);
	cr_assert(strstr(zinf_last_error(), "cpu_bytes"), "%s", zinf_last_error());
	zinf_pool_destroy(p);
	cr_assert_eq(vm_kb("VmLck"), 0);
}

struct waiter {
	struct zinf_pool *p;
	int rc;
	void *buf;
	int timeout;
};

static void *
wait_for_buffer(void *arg)
{
	struct waiter *w = arg;
	w->rc = zinf_pool_acquire(w->p, w->timeout, &w->buf);
	return NULL;
}

Test(pool, waiting_and_timeouts_across_threads)
{
	struct zinf_pool_opts o;
	opts(&o, 2, 8192);
	struct zinf_pool *p = NULL;
	cr_assert_eq(zinf_pool_create(&o, &p), 0);
	void *a, *b;
	cr_assert_eq(zinf_pool_acquire(p, 0, &a), 0);
	cr_assert_eq(zinf_pool_acquire(p, 0, &b), 1);
	/* Another thread times out... */
	struct waiter w = {.p = p, .timeout = 50};
	pthread_t th;
	double t0 = zinf_now_s();
	pthread_create(&th, NULL, wait_for_buffer, &w);
	pthread_join(th, NULL);
	cr_assert_eq(w.rc, -ETIMEDOUT);
	cr_assert_geq(zinf_now_s() - t0, 0.045);
	/* ...or waits until this one releases. */
	w.timeout = -1;
	w.rc = 1234;
	pthread_create(&th, NULL, wait_for_buffer, &w);
	usleep(50 * 1000);
	cr_assert_eq(w.rc, 1234, "the waiter must still be waiting");
	cr_assert_eq(zinf_pool_release(p, b), 0);
	pthread_join(th, NULL);
	cr_assert_eq(w.rc, 1);
	cr_assert_eq(w.buf, b);
	zinf_pool_release(p, a);
	zinf_pool_release(p, w.buf);
	zinf_pool_destroy(p);
}

/* An explicit node must be honoured or refused, never ignored: a node the machine does not
 * have is an error naming the option, and nothing stays allocated. */
Test(pool, numa_node_out_of_range_is_an_error)
{
	struct zinf_topo *t = NULL;
	cr_assert_eq(zinf_topo_create(&t), 0);
	int nodes = zinf_topo_numa_nodes(t);
	zinf_topo_destroy(t);
	struct zinf_pool_opts o;
	opts(&o, 2, 65536);
	o.numa_node = nodes;
	struct zinf_pool *p = (void *)0x1;
	cr_assert_eq(zinf_pool_create(&o, &p), -EINVAL);
	cr_assert_eq(p, (void *)0x1, "*out untouched");
	const char *e = zinf_last_error();
	cr_assert(strstr(e, "numa_node"), "%s", e);
	o.numa_node = nodes - 1; /* the last node exists */
	cr_assert_eq(zinf_pool_create(&o, &p), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_pool_numa_node(p), nodes - 1);
	zinf_pool_destroy(p);
}

Test(pool, larger_than_physical_memory_fails_before_allocating)
{
	struct zinf_pool_opts o;
	opts(&o, 1000, 1ULL << 30);
	struct zinf_pool_budget b;
	uint64_t rss = vm_kb("VmRSS");
	cr_assert_eq(zinf_pool_check(&o, &b), -ENOMEM);
	cr_assert_eq(b.bytes, 1000ULL << 30);
	struct zinf_pool *p = (void *)0x1;
	cr_assert_eq(zinf_pool_create(&o, &p), -ENOMEM);
	cr_assert_eq(p, (void *)0x1, "*out untouched");
	const char *e = zinf_last_error();
	cr_assert(strstr(e, "physical memory") && strstr(e, "1000.00 GiB") &&
			  strstr(e, "offload_optimizer.buffer_count"),
		  "%s", e);
	cr_assert_lt(vm_kb("VmRSS"), rss + 1024, "nothing allocated");
	/* Unpinned too: an OOM later is what the check prevents. */
	o.pin_memory = false;
	cr_assert_eq(zinf_pool_create(&o, &p), -ENOMEM);
}

Test(pool, over_memlock_without_cap_ipc_lock)
{
	drop_ipc_lock(1 << 20);
	struct zinf_pool_opts o;
	opts(&o, 4, 1 << 20);
	o.what = "offload_param";
	struct zinf_pool *p = NULL;
	cr_assert_eq(zinf_pool_create(&o, &p), -ENOMEM);
	const char *e = zinf_last_error();
	cr_assert(strstr(e, "RLIMIT_MEMLOCK") && strstr(e, "ulimit -l") && strstr(e, "4.00 MiB") &&
			  strstr(e, "1.00 MiB") && strstr(e, "offload_param.buffer_count") &&
			  strstr(e, "offload_param.pin_memory: false"),
		  "%s", e);
	cr_assert_null(p);
	cr_assert_eq(vm_kb("VmLck"), 0, "nothing locked");
	/* Within the limit, it works (pinned). */
	opts(&o, 3, 256 << 10);
	cr_assert_eq(zinf_pool_create(&o, &p), 0);
	cr_assert(zinf_pool_pinned(p));
	cr_assert(!MLOCK_REAL || vm_kb("VmLck") == 768);
	zinf_pool_destroy(p);
	/* pin_memory false, or pin_fallback: unpinned and usable. */
	opts(&o, 4, 1 << 20);
	o.pin_memory = false;
	cr_assert_eq(zinf_pool_create(&o, &p), 0);
	cr_assert_not(zinf_pool_pinned(p));
	void *b;
	cr_assert_eq(zinf_pool_acquire(p, 0, &b), 0);
	memset(b, 0x5a, 1 << 20);
	zinf_pool_release(p, b);
	zinf_pool_destroy(p);
	opts(&o, 4, 1 << 20);
	o.pin_fallback = true;
	cr_assert_eq(zinf_pool_create(&o, &p), 0);
	cr_assert(!MLOCK_REAL || !zinf_pool_pinned(p));
	zinf_pool_destroy(p);
	cr_assert_eq(vm_kb("VmLck"), 0);
}

/*
 * A pool whose CPU region is sized by a setting (the engine's parameter cache: cpu_key
 * "max_in_cpu") names that setting among the ones to lower when it exceeds RLIMIT_MEMLOCK; one
 * without cpu_key names only buffer_count.
 */
Test(pool, over_memlock_names_the_setting_that_sized_the_cpu_region)
{
	drop_ipc_lock(1 << 20);
	struct zinf_pool_opts o;
	opts(&o, 1, 256 << 10);
	o.cpu_bytes = 4 << 20;
	o.what = "offload_param";
	struct zinf_pool *p = NULL;
	cr_assert_eq(zinf_pool_create(&o, &p), -ENOMEM);
	cr_assert_null(strstr(zinf_last_error(), "max_in_cpu"), "%s", zinf_last_error());
	o.cpu_key = "max_in_cpu";
	cr_assert_eq(zinf_pool_create(&o, &p), -ENOMEM);
	const char *e = zinf_last_error();
	cr_assert(strstr(e, "RLIMIT_MEMLOCK") &&
			  strstr(e, "lower offload_param.buffer_count or offload_param.max_in_cpu"),
		  "%s", e);
	cr_assert_null(p);
}

static int error_lines;

static void
count_errors(void *ctx, enum zinf_log_level level, const char *file, int line, const char *func,
	     const char *msg)
{
	if (level == ZINF_LOG_ERROR) {
		error_lines++;
		fprintf(stderr, "unexpected error line: %s\n", msg);
	}
}

/*
 * A real user under a small `ulimit -l` with pin_fallback and io_uring: the pool runs
 * unpinned, is not registered (registration would be charged to the same limit and fail),
 * logs no error for this handled case, and I/O through its buffers works.
 */
Test(pool, fallback_over_memlock_skips_registration_without_errors)
{
	drop_ipc_lock(1 << 20);
	struct zinf_io_opts io_o;
	zinf_io_opts_init(&io_o);
	io_o.backend = "io_uring";
	struct zinf_io *io = zt_io_open(&io_o);
	struct zinf_pool_opts o;
	opts(&o, 4, 1 << 20);
	o.pin_fallback = true;
	o.io = io;
	if (!MLOCK_REAL) {
		o.pin_memory = false; /* ASan's mlock always succeeds: take the unpinned path */
	}
	zinf_log_set_callback(count_errors, NULL);
	error_lines = 0;
	struct zinf_pool *p = NULL;
	cr_assert_eq(zinf_pool_create(&o, &p), 0);
	cr_assert_not(zinf_pool_pinned(p));
	char *dir = zt_mkdtemp(NULL);
	char path[512];
	snprintf(path, sizeof(path), "%s/f", dir);
	struct zinf_io_file *f = NULL;
	cr_assert_eq(zinf_io_file_open(io, path, ZINF_IO_RDWR | ZINF_IO_CREATE, &f), 0);
	void *b;
	cr_assert_geq(zinf_pool_acquire(p, 0, &b), 0);
	memset(b, 0x6b, 1 << 20);
	cr_assert_eq(zinf_io_pwrite(io, f, b, 1 << 20, 0), 0, "%s", zinf_last_error());
	memset(b, 0, 1 << 20);
	cr_assert_eq(zinf_io_pread(io, f, b, 1 << 20, 0), 0, "%s", zinf_last_error());
	cr_assert_eq(((unsigned char *)b)[12345], 0x6b);
	zinf_pool_release(p, b);
	cr_assert_eq(error_lines, 0, "a handled fallback must not log errors");
	zinf_log_set_callback(NULL, NULL);
	zinf_pool_destroy(p);
	zinf_io_file_close(io, f);
	zinf_io_destroy(io);
	zt_rmtree(dir);
	free(dir);
}

Test(pool, memlock_zero_without_cap_is_eperm)
{
	drop_ipc_lock(0);
	struct zinf_pool_opts o;
	opts(&o, 1, 4096);
	struct zinf_pool *p = NULL;
	cr_assert_eq(zinf_pool_create(&o, &p), -EPERM);
	cr_assert(strstr(zinf_last_error(), "pin_memory: false"), "%s", zinf_last_error());
}

Test(pool, mlock_that_really_fails_is_reported_and_unwound)
{
	if (!MLOCK_REAL) {
		cr_skip_test("built with AddressSanitizer, whose mlock does nothing");
	}
	drop_ipc_lock(1 << 20);
	/* A first pool loads what topology probing loads, so VmSize below sees only the pool. */
	struct zinf_pool_opts o;
	opts(&o, 2, 256 << 10);
	struct zinf_pool *p = NULL;
	cr_assert_eq(zinf_pool_create(&o, &p), 0);
	zinf_pool_destroy(p);
	p = NULL;
	/* Lock 768 KiB ourselves: the pool alone fits the limit, but mlock will not. */
	size_t own = 768 << 10;
	void *mine = mmap(NULL, own, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(mine, MAP_FAILED);
	cr_assert_eq(mlock(mine, own), 0);
	cr_assert_eq(vm_kb("VmLck"), 768);
	uint64_t vm = vm_kb("VmSize");
	cr_assert_eq(zinf_pool_check(&o, NULL), 0);
	cr_assert_eq(zinf_pool_create(&o, &p), -ENOMEM);
	const char *e = zinf_last_error();
	cr_assert(strstr(e, "mlock") && strstr(e, "already locked by this process") &&
			  strstr(e, "ulimit -l"),
		  "%s", e);
	cr_assert_null(p);
	cr_assert_eq(vm_kb("VmLck"), 768, "the failed pool left nothing locked");
	cr_assert_lt(vm_kb("VmSize"), vm + 256,
		     "and nothing mapped: %" PRIu64 " -> %" PRIu64 " KiB", vm, vm_kb("VmSize"));
	munlock(mine, own);
	munmap(mine, own);
}

Test(pool, io_through_registered_buffers)
{
	zt_log_to_stderr();
	struct zinf_io_opts io_o;
	zinf_io_opts_init(&io_o);
	struct zinf_io *io = zt_io_open(&io_o);
	struct zinf_pool_opts o;
	opts(&o, 2, 1 << 20);
	o.io = io;
	struct zinf_pool *p = NULL;
	cr_assert_eq(zinf_pool_create(&o, &p), 0);
	char *dir = zt_mkdtemp(NULL);
	char path[4096];
	snprintf(path, sizeof(path), "%s/f", dir);
	struct zinf_io_file *f = NULL;
	cr_assert_eq(zinf_io_file_open(io, path, ZINF_IO_RDWR | ZINF_IO_CREATE, &f), 0);
	void *a, *b;
	zinf_pool_acquire(p, 0, &a);
	zinf_pool_acquire(p, 0, &b);
	uint64_t seed = zt_seed();
	zt_rand_fill(a, 1 << 20, &seed);
	cr_assert_eq(zinf_io_pwrite(io, f, a, 1 << 20, 0), 0);
	memset(b, 0, 1 << 20);
	cr_assert_eq(zinf_io_pread(io, f, b, 1 << 20, 0), 0);
	cr_assert_eq(memcmp(a, b, 1 << 20), 0);
	zinf_pool_release(p, a);
	zinf_pool_release(p, b);
	zinf_io_file_close(io, f);
	zinf_pool_destroy(p);
	zinf_io_destroy(io);
	zt_rmtree(dir);
	free(dir);
}

Test(pool, device_handle_given_or_opened_by_the_pool)
{
	zt_log_to_stderr();
	struct zinf_device_opts dopts;
	zinf_device_opts_init(&dopts);
	dopts.backend = "host";
	struct zinf_device *host = NULL;
	cr_assert_eq(zinf_device_create(&dopts, &host), 0, "%s", zinf_last_error());
	struct zinf_pool_opts o;
	opts(&o, 2, 1 << 20);
	o.device = host;
	struct zinf_pool *p = NULL;
	cr_assert_eq(zinf_pool_create(&o, &p), 0, "%s", zinf_last_error());
	cr_assert_str_eq(zinf_pool_device(p), "host");
	zinf_pool_destroy(p);
	/* the handle is the caller's: still usable after the pool is gone */
	void *m = NULL;
	cr_assert_eq(zinf_device_alloc(host, 64, &m), 0);
	zinf_device_free(host, m);
	zinf_device_destroy(host);

	/* NULL: the pool opens the best device itself, as zinf_device_create(NULL) picks it */
	struct zinf_device *best = NULL;
	cr_assert_eq(zinf_device_create(NULL, &best), 0);
	o.device = NULL;
	cr_assert_eq(zinf_pool_create(&o, &p), 0, "%s", zinf_last_error());
	cr_assert_str_eq(zinf_pool_device(p), zinf_device_backend(best));
	zinf_pool_destroy(p);
	zinf_device_destroy(best);
}

/* The transparent-huge-page mode in brackets ("always", "madvise", "never"), or "" unknown. */
static void
thp_mode(char *out, size_t len)
{
	out[0] = '\0';
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "re");
	char line[128];
	if (f && fgets(line, sizeof(line), f)) {
		char *a = strchr(line, '['), *b = a ? strchr(a, ']') : NULL;
		if (a && b) {
			snprintf(out, len, "%.*s", (int)(b - a - 1), a + 1);
		}
	}
	if (f) {
		fclose(f);
	}
}

/* AnonHugePages (KiB) of the mappings that overlap [lo, hi), from /proc/self/smaps. */
static uint64_t
anon_huge_kb(uintptr_t lo, uintptr_t hi)
{
	FILE *f = fopen("/proc/self/smaps", "re");
	cr_assert_not_null(f);
	char line[512];
	bool in = false;
	uint64_t kb = 0, v;
	uintptr_t s, e;
	while (fgets(line, sizeof(line), f)) {
		if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " ", &s, &e) == 2 && strchr(line, '-') &&
		    line[0] != ' ') {
			in = s < hi && e > lo;
		} else if (in && sscanf(line, "AnonHugePages: %" SCNu64, &v) == 1) {
			kb += v;
		}
	}
	fclose(f);
	return kb;
}

/*
 * Both pools, pinned and not, sit on 2 MiB-aligned memory advised MADV_HUGEPAGE before the
 * first touch: the pinned pool used to be advised never (mlock faulted it in on 4 KiB pages,
 * which stay 4 KiB once locked), and blocks on 4 KiB pages cost the disk twice the time
 * (bench/RESULTS.md, "Buffer patterns").
 */
Test(pool, buffers_on_huge_pages_pinned_or_not)
{
	zt_log_to_stderr();
	char mode[32];
	thp_mode(mode, sizeof(mode));
	if (strcmp(mode, "always") != 0 && strcmp(mode, "madvise") != 0) {
		cr_skip_test("transparent huge pages are \"%s\" here "
			     "(/sys/kernel/mm/transparent_hugepage/enabled): nothing to check",
			     mode);
	}
	for (int pinned = 1; pinned >= 0; pinned--) {
		struct zinf_pool_opts o;
		opts(&o, 4, 2 << 20);
		o.pin_memory = pinned;
		struct zinf_pool *p = NULL;
		cr_assert_eq(zinf_pool_create(&o, &p), 0, "%s", zinf_last_error());
		cr_assert_eq(zinf_pool_pinned(p), (bool)pinned);
		void *b0 = NULL;
		cr_assert_eq(zinf_pool_acquire(p, 0, &b0), 0);
		cr_assert(ZINF_IS_ALIGNED((uintptr_t)b0, 2u << 20), "pool at %p: not 2 MiB-aligned",
			  b0);
		uintptr_t lo = (uintptr_t)b0, hi = lo + 4 * zinf_pool_buffer_bytes(p);
		if (!pinned || !MLOCK_REAL) {
			memset(b0, 1, hi - lo); /* nothing faulted it in yet */
		}
		/* Pinned with a real mlock: measured as mlock left it, untouched since. */
		uint64_t kb = anon_huge_kb(lo, hi);
		cr_assert_gt(kb, 0,
			     "%s pool: AnonHugePages 0 kB over its %" PRIu64 " KiB (THP \"%s\")",
			     pinned ? "pinned" : "unpinned", (uint64_t)(hi - lo) / 1024, mode);
		cr_log_info("%s pool: AnonHugePages %" PRIu64 " of %" PRIu64 " kB",
			    pinned ? "pinned" : "unpinned", kb, (uint64_t)(hi - lo) / 1024);
		zinf_pool_release(p, b0);
		zinf_pool_destroy(p);
	}
}

/* Sizes that overflow 64 bits are refused by the check, never wrapped into a small pool whose
 * buffers would lie outside the mapping (4 x 2^62 bytes wrapped to 0 plus the CPU bytes). */
Test(pool, sizes_that_overflow_are_refused)
{
	struct zinf_pool_opts o;
	opts(&o, 4, 1ULL << 62);
	o.cpu_bytes = 4096;
	o.pin_memory = false;
	struct zinf_pool_budget b;
	cr_assert_eq(zinf_pool_check(&o, &b), -ENOMEM);
	struct zinf_pool *p = (void *)0x1;
	cr_assert_eq(zinf_pool_create(&o, &p), -ENOMEM);
	cr_assert_eq(p, (void *)0x1, "*out untouched");
	opts(&o, 1, UINT64_MAX - 100); /* aligning the buffer wraps to 0 */
	o.pin_memory = false;
	cr_assert_eq(zinf_pool_check(&o, &b), -ENOMEM);
	opts(&o, 1, 4096);
	o.cpu_bytes = UINT64_MAX - 4096; /* buffers + CPU bytes wrap */
	o.pin_memory = false;
	cr_assert_eq(zinf_pool_check(&o, &b), -ENOMEM);
	/* The CPU region: a request whose aligned size wraps is refused. */
	opts(&o, 1, 4096);
	o.cpu_bytes = 1 << 20;
	cr_assert_eq(zinf_pool_create(&o, &p), 0);
	void *c = NULL;
	cr_assert_eq(zinf_pool_cpu_alloc(p, UINT64_MAX - 100, &c), -ENOMEM);
	cr_assert_eq(zinf_pool_cpu_alloc(p, 4096, &c), 0);
	cr_assert_eq(zinf_pool_cpu_alloc(p, UINT64_MAX - 100, &c), -ENOMEM);
	zinf_pool_destroy(p);
}

/* Every public pool function given a NULL handle: -EINVAL with a message; getters neutral. */
Test(pool, null_handles_are_einval_not_a_crash)
{
	void *b = NULL;
	cr_assert_eq(zinf_pool_acquire(NULL, 0, &b), -EINVAL);
	cr_assert_eq(zinf_pool_release(NULL, b), -EINVAL);
	cr_assert_eq(zinf_pool_cpu_alloc(NULL, 64, &b), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "zinf_pool_cpu_alloc: NULL pool"), "%s",
		  zinf_last_error());
	cr_assert_eq(zinf_pool_buffer_bytes(NULL), 0);
	cr_assert_eq(zinf_pool_buffer_count(NULL), 0);
	cr_assert_eq(zinf_pool_bytes(NULL), 0);
	cr_assert_not(zinf_pool_pinned(NULL));
	cr_assert_eq(zinf_pool_numa_node(NULL), -1);
	cr_assert_null(zinf_pool_device(NULL));
	cr_assert_eq(zinf_pool_free_count(NULL), 0);
	cr_assert_eq(zinf_pool_check(NULL, NULL), -EINVAL); /* defaults: empty */
	cr_assert(strstr(zinf_last_error(), "pinned pool (offload_optimizer): empty"), "%s",
		  zinf_last_error());
	struct zinf_pool_opts o;
	opts(&o, 1, 4096);
	cr_assert_eq(zinf_pool_create(&o, NULL), -EINVAL);
	struct zinf_pool *p = NULL;
	cr_assert_eq(zinf_pool_create(&o, &p), 0);
	cr_assert_eq(zinf_pool_acquire(p, 0, NULL), -EINVAL);
	cr_assert_eq(zinf_pool_cpu_alloc(p, 64, NULL), -EINVAL);
	cr_assert_eq(zinf_pool_free_count(p), 1, "nothing taken by the refused calls");
	zinf_pool_destroy(p);
	zinf_pool_destroy(NULL);
}

/*
 * The size rule: a caller built before `what` existed keeps its default ("offload_optimizer",
 * named in the messages); a NULL `what` too; a newer, larger struct is refused with both sizes.
 */
Test(pool, options_size_rule_and_the_name_in_messages)
{
	struct zinf_pool_opts o;
	opts(&o, 1, 4096);
	o.what = "offload_param";
	o.size = offsetof(struct zinf_pool_opts, what);
	struct zinf_pool *p = NULL;
	cr_assert_eq(zinf_pool_create(&o, &p), 0, "%s", zinf_last_error());
	void *b[2];
	cr_assert_geq(zinf_pool_acquire(p, 0, &b[0]), 0);
	cr_assert_eq(zinf_pool_acquire(p, 0, &b[1]), -EAGAIN);
	cr_assert(strstr(zinf_last_error(), "pinned pool (offload_optimizer): all 1 buffers") &&
			  strstr(zinf_last_error(), "raise offload_optimizer.buffer_count"),
		  "%s", zinf_last_error());
	cr_assert_eq(zinf_pool_release(p, b[0]), 0);
	zinf_pool_destroy(p);
	opts(&o, 1, 4096);
	o.what = "offload_param";
	o.align = 100;
	cr_assert_eq(zinf_pool_check(&o, NULL), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "pinned pool (offload_param): align 100"), "%s",
		  zinf_last_error());
	o.what = NULL;
	cr_assert_eq(zinf_pool_check(&o, NULL), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "pinned pool (offload_optimizer): align 100"), "%s",
		  zinf_last_error());
	struct {
		struct zinf_pool_opts o;
		uint64_t more;
	} big = {.o = o};
	big.o.align = 4096;
	big.o.size = sizeof(big);
	cr_assert_eq(zinf_pool_create(&big.o, &p), -EINVAL);
	cr_assert(strstr(zinf_last_error(), "zinf_pool_opts") &&
			  strstr(zinf_last_error(), "newer zinf"),
		  "%s", zinf_last_error());
}

static char warn_text[1024];

static void
keep_warning(void *ctx, enum zinf_log_level level, const char *file, int line, const char *func,
	     const char *msg)
{
	if (level == ZINF_LOG_WARN) {
		snprintf(warn_text, sizeof(warn_text), "%s", msg);
	}
}

/* An mlock that really fails with pin_fallback: a warning that says what to raise (ulimit -l),
 * and an unpinned, usable pool. */
Test(pool, mlock_failure_with_fallback_warns_with_ulimit)
{
	if (!MLOCK_REAL) {
		cr_skip_test("built with AddressSanitizer, whose mlock does nothing");
	}
	drop_ipc_lock(1 << 20);
	size_t own = 768 << 10;
	void *mine = mmap(NULL, own, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	cr_assert_neq(mine, MAP_FAILED);
	cr_assert_eq(mlock(mine, own), 0);
	struct zinf_pool_opts o;
	opts(&o, 2, 256 << 10);
	o.pin_fallback = true;
	o.what = "offload_param";
	zinf_log_set_callback(keep_warning, NULL);
	struct zinf_pool *p = NULL;
	cr_assert_eq(zinf_pool_create(&o, &p), 0, "%s", zinf_last_error());
	zinf_log_set_callback(NULL, NULL);
	cr_assert_not(zinf_pool_pinned(p));
	cr_assert(strstr(warn_text, "pinned pool (offload_param): mlock of") &&
			  strstr(warn_text, "running unpinned") && strstr(warn_text, "ulimit -l"),
		  "%s", warn_text);
	zinf_pool_destroy(p);
	munlock(mine, own);
	munmap(mine, own);
}
