/* fuzz_corpus.c - the JSON Lines reader of raw corpora (lib/io/corpus.c, what `dpc-shard
 * prepare` reads): one JSON object per line with a string "text", the other fields kept as
 * compact JSON metadata, blank lines skipped.
 *
 * A failure must keep the error contract naming the input file. Every document handed out
 * is checked: its metadata is a JSON object whose text holds no NUL byte (token files forbid
 * them, dpc-tokens(5)) and is meta_len long, and documents are numbered 0, 1, 2, ... in
 * order. What `prepare --chunk` makes of each document is checked too: the metadata of a
 * piece (corpus_chunk_meta) is the document's object with "doc" and "chunk" appended, or an
 * error under the contract when the document already has such a field; and the pieces of
 * corpus_chunk_pieces for a few sizes cover the document with lengths between N/2 and 1.5N.
 * A file whose first non-blank byte is not '{' is refused ("not JSON Lines"). Seeds:
 * corpus/corpus. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "harness.h"
#include "common/err.h"
#include "io/corpus.h"
#include "common/banned.h"

static void check_pieces(uint64_t n)
{
	static const uint64_t sizes[] = { 2, 3, 7, 64 };

	for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
		uint64_t N = sizes[i], k = corpus_chunk_pieces(n, N);
		unsigned long long un = n, uN = N, uk = k;
		if (k == 0 || (k - 1) * N > n)
			fuzz_fail("%llu tokens in pieces of %llu: %llu pieces", un, uN, uk);
		uint64_t last = n - (k - 1) * N; /* the others hold N each */
		if (n >= N && (2 * last < N || 2 * last >= 3 * N))
			fuzz_fail("%llu tokens in pieces of %llu: a last piece of %llu", un, uN,
				  (unsigned long long)last);
		if (n < N && k != 1)
			fuzz_fail("%llu tokens, fewer than %llu, in %llu pieces", un, uN, uk);
	}
}

/* The metadata of piece 3 of doc: the source object with "doc" and "chunk" at the end. */
static void check_piece_meta(const char *path, const struct corpus_doc *doc, json_t *src)
{
	char *m;
	size_t n;
	json_error_t je;
	int rc = corpus_chunk_meta(path, doc->meta, doc->meta_len, doc->index, 3, &m, &n);
	int clash = json_object_get(src, "doc") || json_object_get(src, "chunk");

	if (rc != 0) {
		if (!clash || rc != CORE_EFORMAT)
			fuzz_fail("metadata of document %llu refused for its pieces: %s",
				  (unsigned long long)doc->index, err_detail());
		fuzz_check_error("corpus_chunk_meta", rc, path);
		return;
	}
	if (clash)
		fuzz_fail("document %llu has a \"doc\" or \"chunk\" field and its pieces' "
			  "metadata was made anyway", (unsigned long long)doc->index);
	if (strlen(m) != n)
		fuzz_fail("piece metadata of document %llu is not %zu bytes without NUL",
			  (unsigned long long)doc->index, n);
	json_t *p = json_loadb(m, n, JSON_ALLOW_NUL, &je);
	json_t *want = json_deep_copy(src);
	json_object_set_new(want, "doc", json_integer((json_int_t)doc->index));
	json_object_set_new(want, "chunk", json_integer(3));
	/* equal as objects, and the two fields last, in that order */
	void *it = p ? json_object_iter(p) : NULL;
	const char *k1 = NULL, *k2 = NULL;
	for (; it; it = json_object_iter_next(p, it)) {
		k1 = k2;
		k2 = json_object_iter_key(it);
	}
	if (!json_equal(p, want) || !k1 || strcmp(k1, "doc") || strcmp(k2, "chunk"))
		fuzz_fail("piece metadata of document %llu is wrong: %.80s",
			  (unsigned long long)doc->index, m);
	json_decref(want);
	json_decref(p);
	free(m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *path = fuzz_write("corpus.jsonl", data, size);
	struct corpus_reader *r;
	struct corpus_doc doc;
	uint64_t ndocs = 0;
	int rc;

	if ((rc = corpus_open(&r, path)) != 0) {
		fuzz_check_error("corpus_open", rc, path);
		return 0;
	}
	while ((rc = corpus_next(r, &doc)) == 1) {
		json_error_t je;
		if (doc.index != ndocs++)
			fuzz_fail("document %llu handed out as number %llu",
				  (unsigned long long)(ndocs - 1), (unsigned long long)doc.index);
		if (!doc.meta || strlen(doc.meta) != doc.meta_len)
			fuzz_fail("metadata of document %llu is not %zu bytes without NUL",
				  (unsigned long long)doc.index, doc.meta_len);
		json_t *m = json_loadb(doc.meta, doc.meta_len, JSON_ALLOW_NUL, &je);
		if (!json_is_object(m))
			fuzz_fail("metadata of document %llu is not a JSON object: %.80s",
				  (unsigned long long)doc.index, doc.meta);
		if (doc.len && !doc.text)
			fuzz_fail("document %llu has %zu bytes and no text",
				  (unsigned long long)doc.index, doc.len);
		check_piece_meta(path, &doc, m);
		json_decref(m);
		check_pieces(doc.len);
	}
	if (rc != 0)
		fuzz_check_error("corpus_next", rc, path);
	else
		fuzz_ok();
	corpus_close(r);
	return 0;
}
