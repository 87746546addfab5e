/* atomicio.h - write a file so that a crash leaves the old file or the new one, never half.
 *
 * afile_open() creates a temporary file next to the target (same directory, so rename(2) is
 * atomic); afile_commit() flushes, fsyncs, renames over the target and fsyncs the directory.
 * afile_abort() removes the temporary file; the target is untouched. Every output file of
 * every program goes through here.
 *
 * afile_prepare() is the first half of afile_commit(): flush, fsync and close, leaving the
 * complete file under its temporary name for a later afile_commit() or afile_abort(). A
 * writer of several files prepares them all before it commits any, so that a failure to
 * write (a full disk) leaves every target as it was; only a failing rename(2) can still
 * leave some targets new and others old. On failure both functions abort the file.
 */
#ifndef CORE_ATOMICIO_H
#define CORE_ATOMICIO_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

struct afile {
	FILE *fp;        /* write through this or afile_write() */
	char *path;      /* final name */
	char *tmp;       /* temporary name, NULL after commit/abort */
	uint64_t nbytes; /* bytes written through afile_write() */
	int failed;      /* a write failed; commit will refuse */
};

int afile_open(struct afile *a, const char *path);
int afile_write(struct afile *a, const void *buf, size_t n);
/* Overwrite bytes already written at offset (for headers patched at the end); does not
 * change nbytes. */
int afile_pwrite(struct afile *a, const void *buf, size_t n, uint64_t offset);
int afile_prepare(struct afile *a);
int afile_commit(struct afile *a);
void afile_abort(struct afile *a);

/* Whole small file into a malloc'd, NUL-terminated buffer (for configs and headers).
 * CORE_ENOTFOUND when it does not exist; CORE_EFORMAT when it is longer than max bytes
 * (max 0: no limit). */
int file_read_all(const char *path, size_t max, char **out, size_t *len);
/* Write a whole buffer atomically. */
int file_write_atomic(const char *path, const void *buf, size_t n);

#endif
