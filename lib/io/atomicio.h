/* atomicio.h - write a file so that a crash leaves the old file or the new one, never half.
 *
 * afile_open() creates an unnamed file in the target's directory (Linux's O_TMPFILE; where the
 * file system lacks it, a file named TARGET.tmp.XXXXXX instead); afile_commit() flushes,
 * fsyncs, gives the data a temporary name TARGET.tmp.XXXXXX (linkat), renames it over the
 * target and fsyncs the directory. afile_abort() drops the temporary file; the target is
 * untouched. A process killed before afile_commit() therefore leaves nothing behind (with
 * O_TMPFILE), and one killed inside it at most a TARGET.tmp.* file, which is what a cleanup of
 * stale temporaries (rundir_clean_stale) looks for. Every output file of every program goes
 * through here.
 *
 * afile_prepare() is the first half of afile_commit(): flush and fsync, leaving the complete
 * file on disk, unnamed or under its temporary name, for a later afile_commit() (the rename)
 * or afile_abort(). A writer of several files prepares them all before it commits any, so
 * that a failure to write (a full disk) leaves every target as it was; only a failing link or
 * rename(2) at commit can still leave some targets new and others old. On failure both
 * functions abort the file.
 *
 * Targets that are not regular files. When the target exists and is not a regular file nor a
 * directory (a character device such as /dev/null, a FIFO, a socket, a terminal), nothing is
 * renamed over it: it is opened for writing (O_WRONLY, no O_TRUNC; a FIFO's open waits for a
 * reader, as a shell's redirection does) and written to, as zstd and gzip do, and never
 * fsynced. A target that can seek (/dev/null, a block device) is written in place, pwrite
 * included. One that cannot (a FIFO, a terminal) gets the bytes at afile_prepare(), copied from
 * an unnamed spool file in /tmp, because writers patch their headers at the end
 * (afile_pwrite). Bytes written to a device cannot be taken back: afile_abort() only closes it.
 *
 * Symbolic links are followed: a link to a regular file keeps pointing at it, and the file it
 * names is replaced (the temporary file goes next to that file); a link to a device or a FIFO
 * writes to it. A dangling link is replaced by the new file.
 */
#ifndef CORE_ATOMICIO_H
#define CORE_ATOMICIO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct afile {
	FILE *fp;        /* write through this or afile_write(); NULL once prepared */
	char *path;      /* final name as given (messages name it), NULL when not open */
	char *tmp;       /* the temporary name while the data has one, else NULL */
	uint64_t nbytes; /* bytes written through afile_write() */
	int failed;      /* a write failed; commit will refuse */
	/* private to atomicio.c */
	int kind;        /* how the data reaches path: a temporary file, or straight */
	FILE *held;      /* a prepared file kept open until commit */
	int out;         /* the target's descriptor when writing straight to it */
	char *target;    /* what the rename replaces: path, or the file a link names */
};

int afile_open(struct afile *a, const char *path);
int afile_write(struct afile *a, const void *buf, size_t n);
/* Overwrite bytes already written at offset (for headers patched at the end); does not
 * change nbytes. */
int afile_pwrite(struct afile *a, const void *buf, size_t n, uint64_t offset);
int afile_prepare(struct afile *a);
int afile_commit(struct afile *a);
void afile_abort(struct afile *a);

/* Whole small file into a malloc'd, NUL-terminated buffer (for configs and headers), read as
 * a stream until end of file: a pipe or a FIFO works (a FIFO with no writer waits for one, as
 * cat(1) does), and so do /proc files. CORE_ENOTFOUND when it does not exist; CORE_EFORMAT
 * when it is longer than max bytes (max 0: no limit). */
int file_read_all(const char *path, size_t max, char **out, size_t *len);
/* The same for an input that must be a regular file (see file_open_regular). */
int file_read_regular(const char *path, size_t max, char **out, size_t *len);
/* Write a whole buffer atomically. */
int file_write_atomic(const char *path, const void *buf, size_t n);

struct stat;
/* Open an input that must be a regular file (a token file, a checkpoint) read-only into *fd.
 * Anything else is refused before a byte is read, CORE_EIO "is a FIFO, not a regular file"
 * (or a directory, a character device, ...): the open uses O_NONBLOCK, so a FIFO without a
 * writer does not block, and *fd is made blocking again after the check. CORE_ENOTFOUND "no
 * such file" when path does not exist; CORE_EIO for other failures. st (may be NULL) gets
 * fstat's answer. */
int file_open_regular(const char *path, int *fd, struct stat *st);

/* An output folder, as `mkdir -p` makes it: dir and every missing parent (mode 0777 less the
 * umask). made (made_len bytes, may be NULL) gets the outermost folder this call created, or ""
 * when dir was there already; dir_unmake(dir, made) then removes what the call made, from dir
 * up to made, each folder only if it is empty: a refused run leaves no folder behind. CORE_EIO
 * "cannot create directory" naming the folder that failed (a parent that is a file, say), or
 * "not a directory" when dir itself is something else. */
int dir_make(const char *dir, char *made, size_t made_len);
void dir_unmake(const char *dir, const char *made);

#endif
