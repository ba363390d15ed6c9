/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tests/ckpt/test_ckpt_fs.c: the checkpoint directory on the file system (ckpt/ckpt_fs.c,
 * through zinf_engine_save / zinf_engine_load), one process (comm "single", device "host"):
 * a tag saved again over a directory with more in it, or over a file; tmpfs (no O_DIRECT);
 * the streaming writer across its buffers; a file system without renameat2's flags (NFS,
 * Lustre); the order of the syncs that make a new checkpoint durable, its new directory's
 * entry included; a directory without room, refused before anything is written. renameat2,
 * rename, fsync and statvfs are interposed (this program's own, forwarding to the system
 * calls) so that those file systems and the order of the syncs can be tested.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "common/test_util.h"
#include "ckpt/ckpt_fs.h"
#include "engine/engine_drive.h"
#include "engine/engine_ref.h"
#include "zinf/checkpoint.h"
#include "zinf/engine.h"
#include "zinf/blocks/io.h"
#include "zinf/blocks/swap.h"

#define QUANTUM 0x1p-14f
#define GAS	2

#include "ckpt/ckpt_test.h"

static bool
exists(const char *dir, const char *name)
{
	char p[8192];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	struct stat st;
	return lstat(p, &st) == 0;
}

static void
put_file(const char *path)
{
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f, "%s", path);
	fputs("the user's\n", f);
	fclose(f);
}

/* ---- replacing a tag ----------------------------------------------------------------------- */

/*
 * A tag saved again whose directory holds more than a save writes (a subdirectory the trainer
 * put there, as Hugging Face trainers put a tokenizer beside the weights): the old directory is
 * swapped out and must be removed whole, or its leftover DIR/.TAG.tmp makes every later save
 * into DIR fail (the next save's clean-up cannot remove it; the same tag cannot make its
 * temporary directory).
 */
Test(ckpt_fs, retagging_a_directory_with_a_subdirectory)
{
	struct ckpt_cfg c = {2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, ZINF_F32, false};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = ckpt_make(&c, nvme);
	run(e, c.dtype, 0, 1);
	save_ok(e, ck, "t");
	char p[8192];
	snprintf(p, sizeof(p), "%s/t/tokenizer", ck);
	cr_assert_eq(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/t/tokenizer/vocab.json", ck);
	put_file(p);
	run(e, c.dtype, 1, 1);
	save_ok(e, ck, "t"); /* t replaced */
	cr_assert(!exists(ck, ".t.tmp"), "the swapped-out t is left as .t.tmp");
	run(e, c.dtype, 2, 1);
	save_ok(e, ck, "u"); /* another tag */
	run(e, c.dtype, 3, 1);
	save_ok(e, ck, "t"); /* and t once more */
	zinf_engine_destroy(e);
	e = ckpt_make(&c, nvme);
	cr_assert_eq(zinf_engine_load(e, ck, NULL, NULL), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_steps(e), 4);
	zinf_engine_destroy(e);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
	free(ck);
}

static char *
read_text(const char *dir, const char *name)
{
	char p[8192];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	FILE *f = fopen(p, "rb");
	cr_assert_not_null(f, "%s", p);
	char *buf = calloc(1, 4096);
	cr_assert_not_null(buf);
	cr_assert_geq(fread(buf, 1, 4095, f), 0);
	fclose(f);
	return buf;
}

/*
 * A file (not a directory) named like the tag: a save to that tag replaces whatever DIR/TAG is
 * (ckpt_publish swaps the new directory in with RENAME_EXCHANGE, whatever the old entry's
 * type, and removes what it swapped out, a file too: ckpt_rm_dir). So the save succeeds, TAG
 * is the checkpoint's directory, latest names it, nothing is left behind, it loads, and later
 * saves work.
 */
Test(ckpt_fs, retagging_over_a_file)
{
	struct ckpt_cfg c = {2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, ZINF_F32, false};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = ckpt_make(&c, nvme);
	run(e, c.dtype, 0, 1);
	char p[8192];
	snprintf(p, sizeof(p), "%s/t", ck);
	put_file(p);
	int rc = zinf_engine_save(e, ck, "t", NULL);
	cr_assert_eq(rc, 0, "save over the file %s: %d %s", p, rc, zinf_last_error());
	struct stat st;
	cr_assert_eq(lstat(p, &st), 0);
	cr_assert(S_ISDIR(st.st_mode), "%s is not the checkpoint's directory (mode %o)", p,
		  (unsigned)st.st_mode);
	cr_assert(exists(ck, "t/manifest.json") && exists(ck, "t/r00000.fp32"),
		  "%s: not a checkpoint", p);
	cr_assert(!exists(ck, ".t.tmp"), "the swapped-out file is left as .t.tmp");
	char *latest = read_text(ck, "latest");
	cr_assert_str_eq(latest, "t\n");
	free(latest);
	run(e, c.dtype, 1, 1);
	save_ok(e, ck, "u");
	save_ok(e, ck, "u");
	zinf_engine_destroy(e);
	e = ckpt_make(&c, nvme);
	rc = zinf_engine_load(e, ck, "t", NULL);
	cr_assert_eq(rc, 0, "load t: %d %s", rc, zinf_last_error());
	cr_assert_eq(zinf_engine_steps(e), 1);
	cr_assert_eq(zinf_engine_load(e, ck, NULL, NULL), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_steps(e), 2, "latest is u, saved after 2 steps");
	zinf_engine_destroy(e);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
	free(ck);
}

/* ---- file systems -------------------------------------------------------------------------- */

/*
 * tmpfs refuses O_DIRECT: the writer falls back to buffered I/O, the sizes stay exact. Every
 * file the manifest lists has on disk the bytes it lists, and each rank file's are the rank's
 * flat partition (the sum of the parameters' partitions, here one rank: their numels) times its
 * part's element size, worked from the model, not from the writer.
 */
static void
assert_sizes_exact(const char *ck)
{
	char *tag = read_text(ck, "latest"), tagdir[8192], p[8400];
	tag[strcspn(tag, "\n")] = '\0';
	snprintf(tagdir, sizeof(tagdir), "%s/%s", ck, tag);
	free(tag);
	snprintf(p, sizeof(p), "%s/manifest.json", tagdir);
	json_error_t jerr;
	json_t *m = json_load_file(p, 0, &jerr);
	cr_assert_not_null(m, "%s: %s", p, jerr.text);
	uint64_t flat = 0;
	for (uint32_t id = 0; id < EREF_NPARAMS; id++) {
		flat += eref_numel(id); /* one rank: each partition is the whole parameter */
	}
	json_t *ranks = json_object_get(m, "ranks"), *parts = json_object_get(m, "parts");
	cr_assert_eq(json_array_size(ranks), 1);
	cr_assert_eq(json_integer_value(json_object_get(json_array_get(ranks, 0), "flat")),
		     (json_int_t)flat);
	size_t i, rank_files = 0;
	json_t *f;
	json_array_foreach(json_object_get(m, "files"), i, f)
	{
		const char *name = json_string_value(json_object_get(f, "name"));
		json_int_t bytes = json_integer_value(json_object_get(f, "bytes"));
		struct stat st;
		snprintf(p, sizeof(p), "%s/%s", tagdir, name);
		cr_assert_eq(stat(p, &st), 0, "%s", p);
		cr_expect_eq((json_int_t)st.st_size, bytes,
			     "%s: %lld bytes, the manifest lists %lld", p, (long long)st.st_size,
			     (long long)bytes);
		size_t k;
		json_t *q;
		json_array_foreach(parts, k, q)
		{
			char rf[64];
			snprintf(rf, sizeof(rf), "r00000.%s",
				 json_string_value(json_object_get(q, "name")));
			if (strcmp(name, rf) == 0) {
				enum zinf_dtype dt;
				cr_assert_geq(zinf_dtype_parse(json_string_value(
								       json_object_get(q, "dtype")),
							       &dt),
					      0);
				json_int_t want = (json_int_t)(flat * zinf_dtype_size(dt));
				cr_expect_eq(bytes, want,
					     "%s: %lld bytes listed, %lld elements x %zu", name,
					     (long long)bytes, (long long)flat,
					     zinf_dtype_size(dt));
				cr_expect_eq((json_int_t)st.st_size, want, "%s: %lld bytes on disk",
					     name, (long long)st.st_size);
				rank_files++;
			}
		}
	}
	cr_assert_eq(rank_files, json_array_size(parts), "%zu rank files of %zu parts", rank_files,
		     json_array_size(parts));
	json_decref(m);
}

Test(ckpt_fs, save_and_load_on_tmpfs)
{
	struct stat st;
	if (stat("/dev/shm", &st) != 0 || !S_ISDIR(st.st_mode)) {
		cr_skip_test("no /dev/shm");
	}
	char tmpl[] = "/dev/shm/zinf-ckpt-shm-XXXXXX";
	char *ck = mkdtemp(tmpl);
	cr_assert_not_null(ck);
	struct ckpt_cfg c = {3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_NONE, ZINF_BF16, false};
	char *nvme = zt_mkdtemp(NULL);
	struct zinf_engine *e = ckpt_make(&c, nvme);
	run(e, c.dtype, 0, 2);
	int rc = zinf_engine_save(e, ck, NULL, NULL);
	struct master a;
	read_all(e, &a);
	zinf_engine_destroy(e);
	cr_assert_eq(rc, 0, "save into %s: %d %s", ck, rc, zinf_last_error());
	assert_sizes_exact(ck);
	e = ckpt_make(&c, nvme);
	rc = zinf_engine_load(e, ck, NULL, NULL);
	cr_assert_eq(rc, 0, "load: %d %s", rc, zinf_last_error());
	struct master b;
	read_all(e, &b);
	zinf_engine_destroy(e);
	assert_same(b.p, a.p, "tmpfs");
	free_all(&a);
	free_all(&b);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
}

/* ---- the streaming writer ------------------------------------------------------------------ */

/*
 * ckpt_writer on more than two of its buffers (both alternate, each waited for before it is
 * refilled) and a last partial block, put in odd-sized pieces: the file holds exactly the bytes
 * put, and the CRC32C is theirs. On the test scratch (O_DIRECT) and on tmpfs (buffered).
 */
static void
writer_one(const char *dir)
{
	struct zinf_io_opts io_o;
	zinf_io_opts_init(&io_o);
	struct zinf_io *io = NULL;
	cr_assert_eq(zinf_io_create(&io_o, &io), 0, "%s", zinf_last_error());
	size_t total = 2 * (size_t)CKPT_WBUF + (CKPT_WBUF / 2) + 4099;
	unsigned char *data = malloc(total);
	cr_assert_not_null(data);
	uint64_t s = 0x9e3779b97f4a7c15ull;
	for (size_t i = 0; i < total; i++) {
		s ^= s << 13, s ^= s >> 7, s ^= s << 17;
		data[i] = (unsigned char)s;
	}
	char p[8192];
	snprintf(p, sizeof(p), "%s/w.bin", dir);
	struct ckpt_writer w;
	cr_assert_eq(ckpt_writer_open(&w, io, p), 0, "%s", zinf_last_error());
	size_t off = 0, piece = 1;
	while (off < total) {
		size_t n = piece < total - off ? piece : total - off;
		cr_assert_eq(ckpt_writer_put(&w, data + off, n), 0, "%s", zinf_last_error());
		off += n;
		piece = piece * 3 + 1; /* 1, 4, 13, ... bytes: across the buffers' edges */
	}
	cr_assert_eq(ckpt_writer_finish(&w), 0, "%s", zinf_last_error());
	cr_assert_eq(w.bytes, total);
	cr_assert_eq(w.crc, zinf_crc32c(0, data, total));
	ckpt_writer_close(&w);
	FILE *f = fopen(p, "rb");
	cr_assert_not_null(f);
	unsigned char *back = malloc(total + 1);
	cr_assert_eq(fread(back, 1, total + 1, f), total, "%s: not %zu bytes", p, total);
	fclose(f);
	cr_assert(memcmp(back, data, total) == 0, "%s: the bytes differ", p);
	free(back);
	free(data);
	zinf_io_destroy(io);
}

Test(ckpt_fs, writer_buffers_and_last_block)
{
	char *d = zt_mkdtemp(NULL);
	writer_one(d);
	zt_rmtree(d);
	free(d);
	struct stat st;
	if (stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode)) {
		char tmpl[] = "/dev/shm/zinf-ckpt-writer-XXXXXX";
		char *t = mkdtemp(tmpl);
		cr_assert_not_null(t);
		writer_one(t);
		zt_rmtree(t);
	}
}

/* ---- file systems without renameat2's flags (NFS, Lustre) ---------------------------------- */

/*
 * This program's renameat2 (the library's calls resolve to it: the test links libzinf
 * statically): with no_rename_flags, any flag is refused with EINVAL, as the NFS client and
 * Lustre refuse RENAME_NOREPLACE and RENAME_EXCHANGE; otherwise the system call.
 */
static bool no_rename_flags;
static void ev_rename(const char *from, const char *to); /* the event log below */

int
renameat2(int olddirfd, const char *oldpath, int newdirfd, const char *newpath, unsigned int flags)
{
	if (no_rename_flags && flags) {
		errno = EINVAL;
		return -1;
	}
	ev_rename(oldpath, newpath);
	return (int)syscall(SYS_renameat2, olddirfd, oldpath, newdirfd, newpath, flags);
}

/*
 * A checkpoint directory on such a file system (the shared file system a multi-node save
 * needs): a new tag is published with a plain rename (the lock keeps other savers out), and
 * saving over an existing tag, which cannot be swapped in one step there, is refused naming
 * the reason, the previous checkpoints and latest untouched.
 */
Test(ckpt_fs, publish_without_rename_flags)
{
	struct ckpt_cfg c = {2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, ZINF_F32, false};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = ckpt_make(&c, nvme);
	run(e, c.dtype, 0, 1);
	no_rename_flags = true;
	save_ok(e, ck, "a");
	run(e, c.dtype, 1, 1);
	save_ok(e, ck, "b");
	int rc = zinf_engine_save(e, ck, "b", NULL);
	cr_expect_eq(rc, -EOPNOTSUPP, "saving over tag b: %d %s", rc, zinf_last_error());
	cr_expect(strstr(zinf_last_error(), "RENAME_EXCHANGE") != NULL, "%s", zinf_last_error());
	cr_assert(!exists(ck, ".b.tmp"), "the refused save left .b.tmp");
	no_rename_flags = false;
	zinf_engine_destroy(e);
	e = ckpt_make(&c, nvme);
	rc = zinf_engine_load(e, ck, NULL, NULL);
	cr_assert_eq(rc, 0, "load: %d %s", rc, zinf_last_error());
	cr_assert_eq(zinf_engine_steps(e), 2);
	cr_assert_eq(zinf_engine_load(e, ck, "a", NULL), 0, "%s", zinf_last_error());
	cr_assert_eq(zinf_engine_steps(e), 1);
	zinf_engine_destroy(e);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
	free(ck);
}

/* ---- durability of a new checkpoint directory ---------------------------------------------- */

/* This program's fsync and rename (as renameat2 above): with fsync_log set, every fsync (the
 * descriptor's path) and every rename, renameat2 included, is remembered in order. */
static bool fsync_log;
static struct {
	char what; /* 's' fsync, 'r' rename */
	char a[512], b[512];
} ev[256];
static int n_ev;

static void
ev_rename(const char *from, const char *to)
{
	if (fsync_log && n_ev < 256) {
		ev[n_ev].what = 'r';
		snprintf(ev[n_ev].a, sizeof(ev[0].a), "%s", from);
		snprintf(ev[n_ev].b, sizeof(ev[0].b), "%s", to);
		n_ev++;
	}
}

int
fsync(int fd)
{
	if (fsync_log && n_ev < 256) {
		char l[64];
		snprintf(l, sizeof(l), "/proc/self/fd/%d", fd);
		ssize_t n = readlink(l, ev[n_ev].a, sizeof(ev[0].a) - 1);
		ev[n_ev].a[n > 0 ? n : 0] = '\0';
		ev[n_ev].what = 's';
		n_ev++;
	}
	return (int)syscall(SYS_fsync, fd);
}

int
rename(const char *from, const char *to)
{
	ev_rename(from, to);
	return (int)syscall(SYS_renameat2, AT_FDCWD, from, AT_FDCWD, to, 0);
}

/* Index of the first event (what, a[, b]) at or after `from`; -1 when none. */
static int
ev_find(int from, char what, const char *a, const char *b)
{
	for (int i = from; i < n_ev; i++) {
		if (ev[i].what == what && strcmp(ev[i].a, a) == 0 &&
		    (!b || strcmp(ev[i].b, b) == 0)) {
			return i;
		}
	}
	return -1;
}

static bool
was_fsynced(const char *path)
{
	char real[4096];
	cr_assert_not_null(realpath(path, real), "%s", path);
	return ev_find(0, 's', real, NULL) >= 0;
}

/*
 * The first save into a DIR it creates: DIR's entry in its parent is made durable too (the
 * parent fsynced), or a power cut after the save returned can take DIR, and the checkpoint in
 * it, away.
 */
Test(ckpt_fs, new_directory_entry_is_synced)
{
	struct ckpt_cfg c = {2, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, ZINF_F32, false};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	char dir[4200];
	snprintf(dir, sizeof(dir), "%s/run1", ck);
	struct zinf_engine *e = ckpt_make(&c, nvme);
	run(e, c.dtype, 0, 1);
	fsync_log = true;
	save_ok(e, dir, "a");
	fsync_log = false;
	cr_assert(was_fsynced(dir), "%s was not fsynced", dir);
	cr_assert(was_fsynced(ck), "%s (the parent of the new %s) was not fsynced", ck, dir);
	zinf_engine_destroy(e);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
	free(ck);
}

/*
 * The order of a save's durable steps (a tag saved again, with model.safetensors and a client
 * blob): every file of the new TAG fsynced (under its temporary name when it was renamed
 * inside the temporary directory) before the temporary directory is; that before it is swapped
 * into place; DIR fsynced after; then latest written, fsynced, renamed, and DIR fsynced again.
 */
Test(ckpt_fs, save_syncs_in_order)
{
	struct ckpt_cfg c = {3, ZINF_OFFLOAD_NVME, ZINF_OFFLOAD_CPU, ZINF_BF16, false};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	char real[4096];
	cr_assert_not_null(realpath(ck, real));
	struct zinf_engine *e = ckpt_make(&c, nvme);
	run(e, c.dtype, 0, 1);
	save_ok(e, real, "a");
	run(e, c.dtype, 1, 1);
	struct zinf_ckpt_opts so;
	zinf_ckpt_opts_init(&so);
	so.client = "blob";
	so.client_bytes = 4;
	so.gather_16bit = 1;
	fsync_log = true;
	n_ev = 0;
	int rc = zinf_engine_save(e, real, "a", &so);
	fsync_log = false;
	cr_assert_eq(rc, 0, "%d %s", rc, zinf_last_error());
	zinf_engine_destroy(e);
	char tmp[4200], fin[4200], lt[4200], ltmp[4200], p[8400];
	snprintf(tmp, sizeof(tmp), "%s/.a.tmp", real);
	snprintf(fin, sizeof(fin), "%s/a", real);
	snprintf(lt, sizeof(lt), "%s/latest", real);
	snprintf(ltmp, sizeof(ltmp), "%s/.latest.tmp", real);
	int t_sync = ev_find(0, 's', tmp, NULL);
	cr_assert_geq(t_sync, 0, "%s never fsynced", tmp);
	int swap = ev_find(t_sync, 'r', tmp, fin);
	cr_assert_geq(swap, 0, "%s not renamed to %s after its fsync", tmp, fin);
	int d_sync = ev_find(swap, 's', real, NULL);
	cr_assert_geq(d_sync, 0, "%s not fsynced after the rename", real);
	int l_sync = ev_find(d_sync, 's', ltmp, NULL);
	cr_assert_geq(l_sync, 0, "%s not fsynced after DIR", ltmp);
	int l_ren = ev_find(l_sync, 'r', ltmp, lt);
	cr_assert_geq(l_ren, 0, "latest not renamed into place after its fsync");
	cr_assert_geq(ev_find(l_ren, 's', real, NULL), 0, "DIR not fsynced after latest");
	DIR *d = opendir(fin);
	cr_assert_not_null(d);
	struct dirent *de;
	int files = 0;
	while ((de = readdir(d))) {
		if (de->d_name[0] == '.') {
			continue;
		}
		files++;
		snprintf(p, sizeof(p), "%s/%s", tmp, de->d_name);
		int at = ev_find(0, 's', p, NULL);
		for (int i = 0; at < 0 && i < n_ev; i++) { /* fsynced, then renamed to p */
			if (ev[i].what == 'r' && strcmp(ev[i].b, p) == 0) {
				int s2 = ev_find(0, 's', ev[i].a, NULL);
				at = s2 >= 0 && s2 < i ? i : -1;
			}
		}
		cr_expect(at >= 0 && at < t_sync, "%s: not fsynced before %s", de->d_name, tmp);
	}
	closedir(d);
	cr_assert_geq(files, 6, "%d files in %s", files, fin);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
	free(ck);
}

/* ---- a directory without room for the checkpoint ------------------------------------------- */

/* This program's statvfs (as renameat2 above): with fake_free set, the free space it reports. */
static uint64_t fake_free;

int
statvfs(const char *path, struct statvfs *out)
{
	struct statfs fs;
	int rc = (int)syscall(SYS_statfs, path, &fs);
	if (rc != 0) {
		return -1;
	}
	memset(out, 0, sizeof(*out));
	out->f_bsize = (unsigned long)fs.f_bsize;
	out->f_frsize = (unsigned long)(fs.f_frsize ? fs.f_frsize : fs.f_bsize);
	out->f_blocks = fs.f_blocks;
	out->f_bfree = fs.f_bfree;
	out->f_bavail = fs.f_bavail;
	if (fake_free) {
		out->f_bavail = fake_free / out->f_frsize;
	}
	return 0;
}

/* The checkpoint needs every stored rank's state: refused by rank 0 with the bytes free and
 * needed before anything is written; the previous checkpoint and `latest` stay, the engine goes
 * on. */
Test(ckpt_fs, save_refused_without_room)
{
	struct ckpt_cfg c = {3, ZINF_OFFLOAD_CPU, ZINF_OFFLOAD_NONE, ZINF_F32, false};
	char *nvme = zt_mkdtemp(NULL), *ck = zt_mkdtemp(NULL);
	struct zinf_engine *e = ckpt_make(&c, nvme);
	run(e, c.dtype, 0, 1);
	save_ok(e, ck, "a");
	fake_free = 1 << 20; /* less than the 64 MiB margin alone */
	int rc = zinf_engine_save(e, ck, "b", NULL);
	fake_free = 0;
	cr_assert_eq(rc, -ENOSPC, "%d %s", rc, zinf_last_error());
	cr_assert(strstr(zinf_last_error(), "bytes free") && strstr(zinf_last_error(), "needs"),
		  "%s", zinf_last_error());
	char p[8300];
	snprintf(p, sizeof(p), "%s/.b.tmp", ck);
	cr_assert(access(p, F_OK) != 0, "the temporary directory is left");
	snprintf(p, sizeof(p), "%s/b", ck);
	cr_assert(access(p, F_OK) != 0, "a refused save was published");
	run(e, c.dtype, 1, 1); /* the engine goes on */
	save_ok(e, ck, "b");
	zinf_engine_destroy(e);
	zt_rmtree(nvme);
	zt_rmtree(ck);
	free(nvme);
	free(ck);
}
