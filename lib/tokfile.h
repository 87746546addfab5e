/* tokfile.h - token files: a corpus or a shard, documents kept whole.
 *
 * Layout (little-endian), documented in dpc-tokens(5):
 *   header, 64 bytes: magic "DPCTOKS\0", u32 version (1), u32 vocab size, u64 document count,
 *     u64 token count, u32 token width in bytes (2 when vocab <= 65536, else 4),
 *     u32 crc32 of everything after the header, u64 metadata bytes, u32 crc32 of the first
 *     60 header bytes... (exact layout fixed in tokfile.c and dpc-tokens(5))
 *   u64 offsets[ndocs + 1]          token index where each document starts; last = ntokens
 *   tokens[ntokens]                 u16 or u32
 *   metadata: per document a JSON object text (fields of the source other than "text"),
 *     as u64 meta_offsets[ndocs + 1] then the bytes.
 * Readers map the file and verify sizes and crc32 before handing out a single token.
 */
#ifndef CORE_TOKFILE_H
#define CORE_TOKFILE_H

#include <stddef.h>
#include <stdint.h>

#include "atomicio.h"

#define TOKFILE_VERSION 1

struct tokfile {
	char *path;
	uint32_t vocab;
	uint32_t width; /* 2 or 4 */
	uint64_t ndocs, ntokens;
	const uint64_t *offsets; /* ndocs + 1 */
	const void *tokens;      /* uint16_t or uint32_t per width */
	const uint64_t *meta_offsets;
	const char *meta;
	void *map;
	size_t maplen;
};

int tokfile_open(struct tokfile *tf, const char *path);
void tokfile_close(struct tokfile *tf);
static inline uint32_t tokfile_token(const struct tokfile *tf, uint64_t i)
{
	return tf->width == 2 ? ((const uint16_t *)tf->tokens)[i] : ((const uint32_t *)tf->tokens)[i];
}
/* Document d's metadata JSON text (not NUL-terminated) and its length. */
const char *tokfile_doc_meta(const struct tokfile *tf, uint64_t d, size_t *len);

/* Writer: documents are appended one at a time; commit writes the file atomically. */
struct tokfile_writer;
int tokw_open(struct tokfile_writer **w, const char *path, uint32_t vocab);
int tokw_add_doc(struct tokfile_writer *w, const uint32_t *tokens, uint64_t n,
		 const char *meta_json, size_t meta_len);
int tokw_commit(struct tokfile_writer *w); /* frees w */
void tokw_abort(struct tokfile_writer *w); /* frees w, removes the temporary file */

#endif
