/* fuzz_corpus.c - the JSON Lines reader of raw corpora (lib/io/corpus.c, what `dpc-shard
 * prepare` reads): one JSON object per line with a string "text", the other fields kept as
 * compact JSON metadata, blank lines skipped.
 *
 * A failure must keep the error contract naming the input file. Every document handed out
 * is checked: its metadata is a JSON object whose text holds no NUL byte (token files forbid
 * them, dpc-tokens(5)) and is meta_len long, and documents are numbered 0, 1, 2, ... in
 * order. Seeds: corpus/corpus. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "harness.h"
#include "io/corpus.h"
#include "common/banned.h"

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
		int ok = json_is_object(m);
		json_decref(m);
		if (!ok)
			fuzz_fail("metadata of document %llu is not a JSON object: %.80s",
				  (unsigned long long)doc.index, doc.meta);
		if (doc.len && !doc.text)
			fuzz_fail("document %llu has %zu bytes and no text",
				  (unsigned long long)doc.index, doc.len);
	}
	if (rc != 0)
		fuzz_check_error("corpus_next", rc, path);
	else
		fuzz_ok();
	corpus_close(r);
	return 0;
}
