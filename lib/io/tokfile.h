/* tokfile.h - token files: a corpus or a shard, documents kept whole.
 *
 * Layout (little-endian), documented byte by byte in dpc-tokens(5):
 *   header, 64 bytes:
 *      0  u8[8]  magic "DPCTOKS\0"
 *      8  u32    version (2; version 1 is read too)
 *     12  u32    vocab size (>= 1); every token is < vocab
 *     16  u64    document count (ndocs)
 *     24  u64    token count (ntokens)
 *     32  u32    token width in bytes: 2 when vocab <= 65536, else 4
 *     36  u32    crc32 (zlib) of every byte after the header, to the end of the file
 *     40  u64    metadata bytes (meta_bytes)
 *     48  u32    tokenizer kind (enum tokenizer_kind: 0 unknown, 1 byte, 2 SentencePiece);
 *                in version 1 these 12 bytes are reserved and zero (read as unknown)
 *     52  u64    tokenizer digest (tokenizer.h: 0 unless SentencePiece)
 *     60  u32    crc32 of header bytes 0..59
 *   body, starting at byte 64:
 *     tokens[ntokens]            u16 or u32, then zero bytes up to a multiple of 8
 *     u64 offsets[ndocs + 1]      token index where each document starts; [0] = 0,
 *                                 non-decreasing, last = ntokens
 *     u64 meta_offsets[ndocs + 1] byte offset of each document's metadata in the metadata
 *                                 area; [0] = 0, non-decreasing, last = meta_bytes
 *     metadata[meta_bytes]        per document a JSON object text (the fields of the source
 *                                 other than "text"), no separators, no NUL
 *   The file ends there: its length is exactly
 *     64 + round_up(ntokens * width, 8) + 16 * (ndocs + 1) + meta_bytes.
 * Tokens come first so that the writer can stream them to disk as documents arrive (corpora
 * of several GB) and append the offsets, known only at the end, after them.
 * Readers map the file and verify sizes and crc32 before handing out a single token.
 */
#ifndef CORE_TOKFILE_H
#define CORE_TOKFILE_H

#include <stddef.h>
#include <stdint.h>

#include "io/atomicio.h"
#include "io/tokenizer.h"

#define TOKFILE_VERSION 2 /* written; 1 is read as well */
#define TOKFILE_HEADER_BYTES 64

struct tokfile {
	char *path;
	uint32_t vocab;
	uint32_t width; /* 2 or 4 */
	uint64_t ndocs, ntokens;
	const uint64_t *offsets; /* ndocs + 1 */
	const void *tokens;      /* uint16_t or uint32_t per width */
	const uint64_t *meta_offsets;
	const char *meta;
	uint32_t crc; /* body crc32 from the header, verified by tokfile_open */
	uint32_t version;
	/* the tokenizer that made the tokens, as recorded; a version 1 file (nothing recorded)
	 * of vocabulary 256 reads as the byte tokenizer (tokenizer_id_known) */
	struct tokenizer_id tokenizer;
	void *map;
	size_t maplen;
};

/* Map path read-only and verify it all: magic (CORE_EFORMAT "not a token file"), version
 * (CORE_EVERSION), sizes against the file length (CORE_ETRUNC when shorter), header and body
 * crc32 (CORE_ECHECKSUM), offsets (monotone, last = ntokens), every token < vocab
 * (CORE_EFORMAT), a tokenizer record that is not one (CORE_EFORMAT). On failure tf is left
 * closed (tokfile_close on it is harmless). */
int tokfile_open(struct tokfile *tf, const char *path);
void tokfile_close(struct tokfile *tf);
static inline uint32_t tokfile_token(const struct tokfile *tf, uint64_t i)
{
	return tf->width == 2 ? ((const uint16_t *)tf->tokens)[i] : ((const uint32_t *)tf->tokens)[i];
}
/* Document d's metadata JSON text (not NUL-terminated) and its length. */
const char *tokfile_doc_meta(const struct tokfile *tf, uint64_t d, size_t *len);

/* Writer: documents are appended one at a time; tokens go straight to a temporary file next
 * to path, offsets and metadata stay in memory (16 bytes per document plus the metadata) until
 * commit appends them and patches the header. commit renames the file into place atomically.
 * After a failed tokw_add_doc the writer must be aborted. */
struct tokfile_writer;
int tokw_open(struct tokfile_writer **w, const char *path, uint32_t vocab);
/* Record the tokenizer that made the tokens (unknown until set). */
void tokw_set_tokenizer(struct tokfile_writer *w, struct tokenizer_id id);
int tokw_add_doc(struct tokfile_writer *w, const uint32_t *tokens, uint64_t n,
		 const char *meta_json, size_t meta_len);
/* Write the offsets, metadata and header and sync the file under its temporary name (see
 * afile_prepare); then only tokw_commit or tokw_abort. On failure w must be aborted. */
int tokw_prepare(struct tokfile_writer *w);
int tokw_commit(struct tokfile_writer *w); /* prepares if not yet done; frees w */
void tokw_abort(struct tokfile_writer *w); /* frees w, removes the temporary file */

#endif
