/* safetensors.h - checkpoints in the safetensors format (8-byte little-endian header length,
 * JSON header, raw little-endian tensor data), readable by PyTorch and Hugging Face tools.
 *
 * Our files add integrity data in "__metadata__" (all values are strings, as the format
 * requires): "crc32" = zlib crc32 of the whole data section as 8 lower-case hex digits, and
 * "crc32.<tensor name>" for each tensor's own bytes, so one tensor can be read and verified
 * without reading the rest. Any other metadata the caller gives is written as is.
 * Tensors are written in the order given, 64-byte aligned offsets are not required by the
 * format and not used. Files without our crc keys (written by other tools) are readable;
 * verification then only checks structure.
 */
#ifndef CORE_SAFETENSORS_H
#define CORE_SAFETENSORS_H

#include <stdint.h>
#include <stdio.h>

#include "common/tensor.h"

struct st_kv {
	const char *key;
	const char *value;
};

/* Write n host tensors (contiguous) and nmeta metadata pairs atomically to path. */
int st_write(const char *path, const struct tensor *const *ts, int n, const struct st_kv *meta,
	     int nmeta);

/* Streaming writer, for files larger than the memory a writer may hold: the header is
 * written first from the tensors' names, dtypes and shapes (their data pointers are not
 * read), then every tensor's bytes in the order given, in pieces of any size, then commit
 * patches the checksums into the header and renames the file into place (afile_commit).
 * On any failure the writer must be aborted, which removes the temporary file. */
struct st_writer;
int st_writer_open(struct st_writer **w, const char *path, const struct tensor *const *specs,
		   int n, const struct st_kv *meta, int nmeta);
int st_writer_put(struct st_writer *w, const void *data, size_t nbytes);
/* Out of order, for writers with several threads: bytes [off, off + nbytes) of tensor i at
 * their place in the file (pwrite(2); safe from several threads at once). A writer uses
 * either st_writer_put or this; with this, each tensor's crc32 (crc32_update over its bytes
 * in order, 0 to start) is given with st_writer_set_crc, from one thread, before commit,
 * which checks that as many bytes were written as the tensors hold (not which: a piece
 * written twice and one missed would pass here, and fail every reader's crc check). */
int st_writer_pwrite(struct st_writer *w, int i, uint64_t off, const void *data, size_t nbytes);
void st_writer_set_crc(struct st_writer *w, int i, uint32_t crc);
int st_writer_commit(struct st_writer *w); /* frees w */
void st_writer_abort(struct st_writer *w); /* frees w; NULL is harmless */

struct st_entry {
	char name[TENSOR_NAME_MAX];
	enum dtype type;
	int ndim;
	int64_t ne[TENSOR_MAX_DIMS];
	uint64_t begin, end; /* byte range within the data section */
	uint32_t crc;        /* from "crc32.<name>" */
	int has_crc;
};

struct st_file {
	char *path;
	FILE *fp;
	uint64_t data_offset; /* 8 + header length */
	uint64_t data_size;
	int n;
	struct st_entry *entries;
	int nmeta;
	char **meta_keys, **meta_values;
};

/* Parse and check the header: JSON well-formed, dtypes and shapes known, byte ranges inside
 * the file, non-overlapping and covering the data section, file size consistent (truncation
 * is CORE_ETRUNC). verify=1 also checks the whole-data crc32 (reads every byte once). */
int st_open(struct st_file *f, const char *path, int verify);
void st_close(struct st_file *f);
const struct st_entry *st_find(const struct st_file *f, const char *name);
const char *st_meta(const struct st_file *f, const char *key); /* NULL if absent */
/* Metadata key as a decimal integer in [lo, hi] into *out: CORE_EFORMAT on f->path when it is
 * missing ("metadata key 'K' missing") or not such a number. */
int st_meta_long(const struct st_file *f, const char *key, long lo, long hi, long *out);
/* The entry named name, checked to have this dtype and shape (CORE_ESHAPE naming both
 * shapes otherwise; CORE_ENOTFOUND if absent). */
int st_lookup(const struct st_file *f, const char *name, enum dtype type, int ndim,
	      const int64_t *ne, const struct st_entry **e);
/* Bytes [off, off + n) of tensor e into dst, unchecked: a reader streaming a tensor in pieces
 * checks e->crc (when e->has_crc) over the pieces itself. Safe from several threads. */
int st_read_raw(struct st_file *f, const struct st_entry *e, uint64_t off, void *dst, size_t n);
/* Read the named tensor into dst, which must already have the file's dtype and shape
 * (CORE_ESHAPE naming both shapes otherwise; CORE_ENOTFOUND if absent). Checks the tensor's
 * own crc32 when the file has one. */
int st_read(struct st_file *f, const char *name, struct tensor *dst);

#endif
