/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ckpt/ckpt_fs.h: what the checkpoint files share (ckpt_fs.c: tags, lock, opening a
 * checkpoint's own file, fsync, whole and atomic writes, publication, the streaming writer;
 * used by ckpt_save.c, ckpt_load.c, ckpt_read.c, safetensors_write.c).
 */
#ifndef ZINF_CKPT_FS_H
#define ZINF_CKPT_FS_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "common/util.h"
#include "zinf/checkpoint.h"
#include "zinf/blocks/io.h"

#define CKPT_PATH 4096
#define CKPT_WBUF (8u << 20) /* bytes per writer buffer */
#define CKPT_NBUF 4	     /* buffers per file: CKPT_NBUF - 1 writes in flight while one fills */

/* out (CKPT_PATH bytes) = dir/<fmt...>; callers bound dir's length first */
void ckpt_join(char *out, const char *dir, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* dir/name, allocated (zc_malloc; free()), any length; NULL: no memory */
char *ckpt_join_alloc(const char *dir, const char *name);
bool ckpt_tag_ok(const char *tag);

/* A save's progress hook (zinf_ckpt_opts.progress, zinf/checkpoint.h) and the tag it names. */
struct ckpt_progress {
	zinf_ckpt_progress_cb cb; /* NULL: none */
	void *ctx;
	const char *tag;
};
/* The save has reached `point` ("files", "manifest", "tmp_synced", "swapped", "renamed",
 * "latest_tmp", "latest"): the caller's hook hears of it. */
static inline void
ckpt_point(const struct ckpt_progress *pr, const char *point)
{
	if (pr && pr->cb) {
		pr->cb(pr->ctx, point, pr->tag);
	}
}
/*
 * A checkpoint's own file or directory `name` (one component: no '/', not "." or "..") in the
 * directory open as dirfd (dirpath names it in messages), opened read-only without following a
 * symbolic link (O_NOFOLLOW; a name of one component has no intermediate one) and only when it
 * is a regular file, or a directory when `dir` (fstat on the descriptor; O_NONBLOCK while
 * opening, so that a FIFO cannot block). Returns the descriptor (its fstat in *st when st is
 * not NULL), or a negative errno having logged "<dirpath>/<name>: <why>": -EBADMSG a symbolic
 * link or another kind of file, -EINVAL a name of more than one component; -ENOENT (missing),
 * -EMFILE and -ENFILE are returned without a message (the caller says what a missing file
 * means, or closes descriptors and tries again).
 */
int ckpt_open_in(int dirfd, const char *dirpath, const char *name, bool dir, struct stat *st);
int ckpt_fsync_path(const char *path, bool dir);
int ckpt_fsync_parent(const char *path); /* the directory holding path's entry */
int ckpt_rm_dir(const char *path);	 /* a directory and all it holds (or a file) */
int ckpt_clean_tmp(const char *dir);	 /* every DIR/.*.tmp a dead save left (lock held) */
int ckpt_lock(const char *dir, int *fd_out);
void ckpt_unlock(int fd);
/* all len bytes at fd's offset (EINTR and short writes retried); path names it in errors */
int ckpt_write_full(int fd, const char *path, const void *data, size_t len);
int ckpt_write_small(const char *path, const void *data, size_t len); /* create, write, fsync */
/* A file that appears whole or not at all: ckpt_atomic_open creates tmp = ".<base>.tmp<pid>"
 * beside path; ckpt_atomic_close(fd, tmp, path, rc) fsyncs, closes and renames it over path and
 * fsyncs the directory when rc is 0, and removes tmp otherwise (or when a step fails): it
 * returns rc or the first error. */
int ckpt_atomic_open(const char *path, char tmp[CKPT_PATH], int *fd);
int ckpt_atomic_close(int fd, const char *tmp, const char *path, int rc);
/* rename tmp to dir/<pr->tag> (swapping out an existing one), fsync dir, point dir/latest at
 * the tag; pr hears of each point passed ("tmp_synced" to "latest") */
int ckpt_publish(const char *dir, const char *tmp, const struct ckpt_progress *pr);

/* A file written sequentially through the I/O engine: CKPT_NBUF aligned buffers, the others
 * written while one fills; the CRC32C and size of what was put. */
struct ckpt_writer {
	struct zinf_io *io;
	struct zinf_io_file *f;
	char path[CKPT_PATH];
	char *buf[CKPT_NBUF];
	struct zinf_io_req req[CKPT_NBUF];
	bool busy[CKPT_NBUF];
	int cur;
	size_t fill;
	uint32_t align;
	uint64_t off;	/* bytes submitted */
	uint64_t bytes; /* bytes put */
	uint32_t crc;
};
int ckpt_writer_open(struct ckpt_writer *w, struct zinf_io *io, const char *path);
int ckpt_writer_put(struct ckpt_writer *w, const void *data, size_t len);
int ckpt_writer_finish(struct ckpt_writer *w); /* the last bytes, exact size, fsync */
void ckpt_writer_close(struct ckpt_writer *w);

#endif
