/* fuzz_tokfile.c - the token file reader (lib/io/tokfile.c, dpc-tokens(5)): magic, version,
 * header crc, sizes against the file length, body crc, offsets, padding, tokens < vocab.
 *
 * A failure must keep the error contract naming the input file. An accepted file is checked
 * here against dpc-tokens(5) independently of the reader: the width fits the vocabulary, the
 * length is exactly 64 + round_up(ntokens * width, 8) + 16 * (ndocs + 1) + meta_bytes, both
 * offset arrays start at 0, never decrease and end at ntokens and meta_bytes, every token is
 * below vocab, and each document's metadata is a JSON object without NUL bytes (or empty,
 * which the writer allows).
 *
 * Built with FUZZ_FIX_CRC (fuzz_tokfile_crc.c), the harness first recomputes the body crc
 * and then the header crc of any input of at least 64 bytes (zlib's crc32), so that mutations
 * reach the checks behind them. Seeds: corpus/tokfile. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#ifdef FUZZ_FIX_CRC
#include <zlib.h>
#endif

#include "harness.h"
#include "io/tokfile.h"
#include "common/banned.h"

#ifdef FUZZ_FIX_CRC
static void put_u32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}
#endif

static void check_accepted(const struct tokfile *tf)
{
	uint64_t nd = tf->ndocs, meta_bytes = tf->meta_offsets[nd];

	if (tf->vocab == 0 || tf->width != (tf->vocab <= 65536 ? 2u : 4u))
		fuzz_fail("accepted width %u for vocabulary %u", tf->width, tf->vocab);
	/* Each term is at most the file length (the map is in memory): no overflow below. */
	uint64_t want = 64 + ((tf->ntokens * tf->width + 7) & ~(uint64_t)7) + 16 * (nd + 1) +
			meta_bytes;
	if (want != (uint64_t)tf->maplen)
		fuzz_fail("accepted a file of %zu bytes whose header says %llu", tf->maplen,
			  (unsigned long long)want);
	if (tf->offsets[0] != 0 || tf->offsets[nd] != tf->ntokens || tf->meta_offsets[0] != 0)
		fuzz_fail("accepted offsets that do not span the tokens and metadata");
	for (uint64_t d = 0; d < nd; d++) {
		if (tf->offsets[d + 1] < tf->offsets[d] ||
		    tf->meta_offsets[d + 1] < tf->meta_offsets[d])
			fuzz_fail("accepted decreasing offsets at document %llu",
				  (unsigned long long)d);
		size_t len;
		const char *meta = tokfile_doc_meta(tf, d, &len);
		if (len == 0)
			continue;
		if (memchr(meta, '\0', len))
			fuzz_fail("accepted a NUL byte in the metadata of document %llu",
				  (unsigned long long)d);
		json_error_t je;
		json_t *obj = json_loadb(meta, len, JSON_ALLOW_NUL, &je);
		int ok = json_is_object(obj);
		json_decref(obj);
		if (!ok)
			fuzz_fail("accepted metadata of document %llu that is not a JSON object: "
				  "%.*s", (unsigned long long)d, (int)(len < 80 ? len : 80), meta);
	}
	for (uint64_t i = 0; i < tf->ntokens; i++)
		if (tokfile_token(tf, i) >= tf->vocab)
			fuzz_fail("accepted token %u at %llu, vocabulary %u", tokfile_token(tf, i),
				  (unsigned long long)i, tf->vocab);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct tokfile tf;
	uint8_t *fixed = NULL;
	int rc;

#ifdef FUZZ_FIX_CRC
	if (size >= TOKFILE_HEADER_BYTES) {
		fixed = malloc(size);
		if (!fixed)
			fuzz_fail("out of memory");
		memcpy(fixed, data, size);
		put_u32(fixed + 36, (uint32_t)crc32(0, fixed + TOKFILE_HEADER_BYTES,
						    (uInt)(size - TOKFILE_HEADER_BYTES)));
		put_u32(fixed + 60, (uint32_t)crc32(0, fixed, 60));
		data = fixed;
	}
#endif
	const char *path = fuzz_write("input.tok", data, size);
	free(fixed);
	if ((rc = tokfile_open(&tf, path)) != 0) {
		fuzz_check_error("tokfile_open", rc, path);
		tokfile_close(&tf); /* harmless after a failure, says tokfile.h */
		return 0;
	}
	check_accepted(&tf);
	tokfile_close(&tf);
	fuzz_ok();
	return 0;
}
