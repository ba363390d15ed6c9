/* SPDX-License-Identifier: Apache-2.0 */
/* tests/common/test_util.c: helpers shared by the tests; see test_util.h. */
#include <errno.h>
#include <ftw.h>
#include <linux/capability.h>
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "common/test_util.h"
#include "zinf/blocks/adam.h"
#include "zinf/common.h"
#include "zinf/safetensors.h"

uint64_t
zt_seed(void)
{
	static uint64_t seed;
	if (seed) {
		return seed;
	}
	const char *s = getenv("ZINF_TEST_SEED");
	if (s && *s) {
		seed = strtoull(s, NULL, 0);
	} else {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		seed = ((uint64_t)ts.tv_sec * 1000003u) ^ (uint64_t)ts.tv_nsec ^
		       ((uint64_t)getpid() << 20);
	}
	if (!seed) {
		seed = 1;
	}
	fprintf(stderr, "seed=%llu (set ZINF_TEST_SEED to repeat)\n", (unsigned long long)seed);
	return seed;
}

uint64_t
zt_rand(uint64_t *state)
{
	uint64_t x = *state ? *state : 0x9e3779b97f4a7c15ull;
	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	*state = x;
	return x * 0x2545f4914f6cdd1dull;
}

double
zt_uniform(uint64_t *state, double lo, double hi)
{
	return lo + (hi - lo) * ((double)(zt_rand(state) >> 11) * 0x1.0p-53);
}

void
zt_rand_fill(void *p, size_t n, uint64_t *state)
{
	unsigned char *c = p;
	while (n >= 8) {
		uint64_t v = zt_rand(state);
		memcpy(c, &v, 8);
		c += 8;
		n -= 8;
	}
	if (n) {
		uint64_t v = zt_rand(state);
		memcpy(c, &v, n);
	}
}

char *
zt_mkdtemp(const char *base)
{
	if (!base) {
		base = getenv("ZINF_TEST_SCRATCH");
	}
	if (!base) {
		base = "/tmp";
	}
	char *path = NULL;
	if (asprintf(&path, "%s/zt-XXXXXX", base) < 0) {
		return NULL;
	}
	if (!mkdtemp(path)) {
		free(path);
		return NULL;
	}
	return path;
}

static int
rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	return remove(path);
}

void
zt_rmtree(const char *path)
{
	if (path) {
		nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	}
}

int
zt_copytree(const char *from, const char *to)
{
	char cmd[16500];
	int n = snprintf(cmd, sizeof(cmd), "rm -rf '%s' && cp -a '%s' '%s'", to, from, to);
	return n < 0 || (size_t)n >= sizeof(cmd) ? -1 : system(cmd);
}

const char *
zt_variant(void)
{
	const char *v = getenv("ZINF_TEST_VARIANT");
	return (v && *v) ? v : NULL;
}

bool
zt_io_may_be_absent(const char *backend)
{
	return backend && (strcmp(backend, "io_uring") == 0 || strcmp(backend, "libaio") == 0);
}

void
zt_log_to_stderr(void)
{
	zinf_log_set_callback(zinf_log_to_file, stderr);
	zinf_log_set_level(ZINF_LOG_WARN);
}

int
zt_readonly_bind(const char *dir)
{
	if (unshare(CLONE_NEWNS) != 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) != 0 ||
	    mount(dir, dir, NULL, MS_BIND, NULL) != 0 ||
	    mount(NULL, dir, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL) != 0) {
		return -errno;
	}
	return 0;
}

void
zt_readonly_unbind(const char *dir)
{
	umount2(dir, MNT_DETACH);
}

int
zt_drop_ipc_lock(uint64_t memlock)
{
	struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
	struct __user_cap_data_struct d[2];
	if (syscall(SYS_capget, &h, d) != 0) {
		return -errno;
	}
	int i = CAP_TO_INDEX(CAP_IPC_LOCK);
	d[i].effective &= ~CAP_TO_MASK(CAP_IPC_LOCK);
	d[i].permitted &= ~CAP_TO_MASK(CAP_IPC_LOCK);
	d[i].inheritable &= ~CAP_TO_MASK(CAP_IPC_LOCK);
	if (syscall(SYS_capset, &h, d) != 0) {
		return -errno;
	}
	struct rlimit rl = {.rlim_cur = memlock, .rlim_max = memlock};
	return setrlimit(RLIMIT_MEMLOCK, &rl) == 0 ? 0 : -errno;
}

int
zt_safetensors_diff(const char *a_path, const char *b_path, char *why, size_t len)
{
	struct zinf_safetensors *a = NULL, *b = NULL;
	int rc = -1;
	if (zinf_safetensors_open(a_path, &a) || zinf_safetensors_open(b_path, &b)) {
		snprintf(why, len, "%s", zinf_last_error());
		goto out;
	}
	uint32_t n = zinf_safetensors_count(a);
	if (zinf_safetensors_count(b) != n) {
		snprintf(why, len, "%s: %u tensors, %s: %u", a_path, n, b_path,
			 zinf_safetensors_count(b));
		goto out;
	}
	for (uint32_t i = 0; i < n; i++) {
		struct zinf_safetensors_info x = {.size = sizeof(x)}, y = {.size = sizeof(y)};
		zinf_safetensors_info(a, i, &x);
		int j = zinf_safetensors_find(b, x.name);
		if (j < 0) {
			snprintf(why, len, "%s has no %s", b_path, x.name);
			goto out;
		}
		zinf_safetensors_info(b, (uint32_t)j, &y);
		bool same = !strcmp(x.dtype_name, y.dtype_name) && x.ndim == y.ndim &&
			    x.bytes == y.bytes;
		for (uint32_t d = 0; same && d < x.ndim; d++) {
			same = x.shape[d] == y.shape[d];
		}
		if (!same) {
			snprintf(why, len, "%s: %s of %u dims, %llu bytes; %s of %u, %llu", x.name,
				 x.dtype_name, x.ndim, (unsigned long long)x.bytes, y.dtype_name,
				 y.ndim, (unsigned long long)y.bytes);
			goto out;
		}
		unsigned char *u = malloc(x.bytes ? x.bytes : 1),
			      *v = malloc(y.bytes ? y.bytes : 1);
		FILE *f = fopen(x.file, "rb"), *g = fopen(y.file, "rb");
		bool read = u && v && f && g && fseek(f, (long)x.offset, SEEK_SET) == 0 &&
			    fseek(g, (long)y.offset, SEEK_SET) == 0 &&
			    fread(u, 1, x.bytes, f) == x.bytes &&
			    fread(v, 1, y.bytes, g) == y.bytes;
		same = read && memcmp(u, v, x.bytes) == 0;
		if (f) {
			fclose(f);
		}
		if (g) {
			fclose(g);
		}
		free(u);
		free(v);
		if (!same) {
			float p = 0, q = 0;
			uint64_t k = 0;
			for (; read && k < x.numel; k++) {
				zinf_safetensors_read(a, i, k, 1, ZINF_F32, &p);
				zinf_safetensors_read(b, (uint32_t)j, k, 1, ZINF_F32, &q);
				if (memcmp(&p, &q, sizeof(p))) {
					break;
				}
			}
			snprintf(why, len,
				 read ? "%s[%llu]: %.9g, expected %.9g" : "%s: unreadable", x.name,
				 (unsigned long long)k, p, q);
			goto out;
		}
	}
	rc = 0;
out:
	zinf_safetensors_close(a);
	zinf_safetensors_close(b);
	return rc;
}
