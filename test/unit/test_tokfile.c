/* test_tokfile.c - token files: round trip against the arrays written, the byte layout of
 * dpc-tokens(5) decoded by hand, and every kind of damage the reader must refuse. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "common/err.h"
#include "io/tokfile.h"
#include "testutil.h"
#include "common/banned.h"

static char dir[256];
static char path[320];

static void setup(void)
{
	tu_mkdtemp(dir, sizeof dir, "tokfile");
	snprintf(path, sizeof path, "%s/t.tok", dir);
}

static void teardown(void)
{
	tu_rm_tree(dir);
}

TestSuite(tokfile, .init = setup, .fini = teardown, .timeout = 10);

/* ---- helpers ------------------------------------------------------------------------------ */

static void spill(const char *p, const unsigned char *b, size_t n)
{
	FILE *f = fopen(p, "wb");
	cr_assert(f);
	cr_assert(fwrite(b, 1, n, f) == n);
	fclose(f);
}

static uint64_t rd64(const unsigned char *p)
{
	uint64_t v = 0;
	for (int i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

static uint32_t rd32(const unsigned char *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void wr32(unsigned char *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (unsigned char)(v >> (8 * i));
}

/* Recompute both crc32s after a deliberate edit, as dpc-tokens(5) defines them. */
static void reseal(unsigned char *b, size_t n)
{
	wr32(b + 36, (uint32_t)crc32(0, b + 64, (uInt)(n - 64)));
	wr32(b + 60, (uint32_t)crc32(0, b, 60));
}

/* Three documents (one empty) with metadata; vocab chosen by the caller. */
static const uint32_t doc0[] = { 1, 2, 3, 255 };
static const uint32_t doc2[] = { 0, 7, 7 };
static const char *meta[] = { "{\"id\":\"a\"}", "", "{\"id\":\"c\",\"n\":[1,2]}" };

static void write_sample(const char *p, uint32_t vocab)
{
	struct tokfile_writer *w;
	cr_assert_eq(tokw_open(&w, p, vocab), 0, "%s", err_detail());
	cr_assert_eq(tokw_add_doc(w, doc0, 4, meta[0], strlen(meta[0])), 0);
	cr_assert_eq(tokw_add_doc(w, NULL, 0, meta[1], 0), 0);
	cr_assert_eq(tokw_add_doc(w, doc2, 3, meta[2], strlen(meta[2])), 0);
	cr_assert_eq(tokw_commit(w), 0, "%s", err_detail());
}

static void expect_open_fails(const char *p, int code, const char *detail_part, const char *what)
{
	struct tokfile tf;
	int rc = tokfile_open(&tf, p);
	cr_assert_eq(rc, code, "%s: tokfile_open returned %d (%s), expected %d", what, rc,
		     err_detail(), code);
	cr_assert(strstr(err_detail(), detail_part), "%s: detail '%s' lacks '%s'", what,
		  err_detail(), detail_part);
	cr_assert_str_eq(err_file(), p, "%s: error names '%s', not the file", what, err_file());
	cr_assert_null(tf.map, "%s: failed open left a mapping", what);
	tokfile_close(&tf);
}

/* ---- round trip --------------------------------------------------------------------------- */

Test(tokfile, round_trip_u16)
{
	struct tokfile tf;
	size_t len;

	write_sample(path, 256);
	cr_assert_eq(tokfile_open(&tf, path), 0, "%s", err_detail());
	cr_assert_eq(tf.vocab, 256);
	cr_assert_eq(tf.width, 2);
	cr_assert_eq(tf.ndocs, 3);
	cr_assert_eq(tf.ntokens, 7);
	uint64_t want_off[] = { 0, 4, 4, 7 };
	for (int d = 0; d <= 3; d++)
		cr_assert_eq(tf.offsets[d], want_off[d], "offset %d: %llu", d,
			     (unsigned long long)tf.offsets[d]);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(tokfile_token(&tf, (uint64_t)i), doc0[i], "token %d", i);
	for (int i = 0; i < 3; i++)
		cr_assert_eq(tokfile_token(&tf, (uint64_t)(4 + i)), doc2[i], "token %d", 4 + i);
	for (int d = 0; d < 3; d++) {
		const char *m = tokfile_doc_meta(&tf, (uint64_t)d, &len);
		cr_assert_eq(len, strlen(meta[d]), "meta %d length %zu", d, len);
		cr_assert(memcmp(m, meta[d], len) == 0, "meta %d", d);
	}
	tokfile_close(&tf);
}

Test(tokfile, round_trip_u32)
{
	struct tokfile tf;
	struct tokfile_writer *w;
	uint32_t big[] = { 0, 65536, 99999, 123 };

	cr_assert_eq(tokw_open(&w, path, 100000), 0);
	cr_assert_eq(tokw_add_doc(w, big, 4, "{}", 2), 0);
	cr_assert_eq(tokw_commit(w), 0);
	cr_assert_eq(tokfile_open(&tf, path), 0, "%s", err_detail());
	cr_assert_eq(tf.width, 4);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(tokfile_token(&tf, (uint64_t)i), big[i], "token %d", i);
	tokfile_close(&tf);
}

/* A document longer than the writer's conversion chunk. */
Test(tokfile, long_document)
{
	struct tokfile tf;
	struct tokfile_writer *w;
	uint64_t n = 200003;
	uint32_t *t = malloc(n * sizeof *t);

	for (uint64_t i = 0; i < n; i++)
		t[i] = (uint32_t)((i * 2654435761u) % 50000);
	cr_assert_eq(tokw_open(&w, path, 50000), 0);
	cr_assert_eq(tokw_add_doc(w, t, n, "{}", 2), 0);
	cr_assert_eq(tokw_add_doc(w, t, 5, "{}", 2), 0);
	cr_assert_eq(tokw_commit(w), 0);
	cr_assert_eq(tokfile_open(&tf, path), 0, "%s", err_detail());
	cr_assert_eq(tf.ntokens, n + 5);
	for (uint64_t i = 0; i < n; i++)
		cr_assert_eq(tokfile_token(&tf, i), t[i], "token %llu", (unsigned long long)i);
	tokfile_close(&tf);
	free(t);
}

/* The bytes on disk follow dpc-tokens(5), decoded here without the reader. */
Test(tokfile, layout_by_hand)
{
	size_t n;

	write_sample(path, 256);
	unsigned char *b = tu_slurp(path, &n);
	size_t meta_bytes = strlen(meta[0]) + strlen(meta[2]);
	size_t want = 64 + 16 /* 7 u16 = 14, padded to 16 */ + 2 * 8 * 4 + meta_bytes;
	cr_assert_eq(n, want, "file is %zu bytes, expected %zu", n, want);
	cr_assert(memcmp(b, "DPCTOKS\0", 8) == 0);
	cr_assert_eq(rd32(b + 8), 2);
	cr_assert_eq(rd32(b + 12), 256);
	cr_assert_eq(rd64(b + 16), 3);
	cr_assert_eq(rd64(b + 24), 7);
	cr_assert_eq(rd32(b + 32), 2);
	cr_assert_eq(rd32(b + 36), (uint32_t)crc32(0, b + 64, (uInt)(n - 64)));
	cr_assert_eq(rd64(b + 40), meta_bytes);
	for (int i = 48; i < 60; i++) /* no tokenizer recorded: kind 0, digest 0 */
		cr_assert_eq(b[i], 0, "tokenizer byte %d", i);
	cr_assert_eq(rd32(b + 60), (uint32_t)crc32(0, b, 60));
	const uint32_t all[] = { 1, 2, 3, 255, 0, 7, 7 };
	for (int i = 0; i < 7; i++)
		cr_assert_eq(b[64 + 2 * i] | b[65 + 2 * i] << 8, all[i], "token %d", i);
	cr_assert_eq(b[78], 0);
	cr_assert_eq(b[79], 0);
	const uint64_t off[] = { 0, 4, 4, 7 };
	const uint64_t moff[] = { 0, strlen(meta[0]), strlen(meta[0]), meta_bytes };
	for (int d = 0; d < 4; d++) {
		cr_assert_eq(rd64(b + 80 + 8 * d), off[d], "offset %d", d);
		cr_assert_eq(rd64(b + 112 + 8 * d), moff[d], "meta offset %d", d);
	}
	cr_assert(memcmp(b + 144, meta[0], strlen(meta[0])) == 0);
	cr_assert(memcmp(b + 144 + strlen(meta[0]), meta[2], strlen(meta[2])) == 0);
	free(b);
}

Test(tokfile, empty_corpus_is_allowed)
{
	struct tokfile tf;
	struct tokfile_writer *w;
	size_t n;

	cr_assert_eq(tokw_open(&w, path, 256), 0);
	cr_assert_eq(tokw_commit(w), 0);
	unsigned char *b = tu_slurp(path, &n);
	cr_assert_eq(n, 64 + 16, "empty corpus file is %zu bytes", n);
	free(b);
	cr_assert_eq(tokfile_open(&tf, path), 0, "%s", err_detail());
	cr_assert_eq(tf.ndocs, 0);
	cr_assert_eq(tf.ntokens, 0);
	tokfile_close(&tf);
}

/* ---- the writer --------------------------------------------------------------------------- */

static int count_entries(void)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

Test(tokfile, writer_rejects_token_outside_vocab)
{
	struct tokfile_writer *w;
	uint32_t t[] = { 5, 256 };

	cr_assert_eq(tokw_open(&w, path, 256), 0);
	cr_assert_eq(tokw_add_doc(w, t, 2, "{}", 2), CORE_EUSAGE);
	tokw_abort(w);
	cr_assert_eq(count_entries(), 0, "abort left files behind");
}

Test(tokfile, abort_keeps_old_file)
{
	struct tokfile_writer *w;
	struct tokfile tf;

	write_sample(path, 256);
	cr_assert_eq(tokw_open(&w, path, 256), 0);
	cr_assert_eq(tokw_add_doc(w, doc2, 3, "{}", 2), 0);
	tokw_abort(w);
	cr_assert_eq(count_entries(), 1, "abort left a temporary file");
	cr_assert_eq(tokfile_open(&tf, path), 0);
	cr_assert_eq(tf.ndocs, 3, "old file was touched");
	tokfile_close(&tf);
}

/* ---- damage ------------------------------------------------------------------------------- */

Test(tokfile, truncation_at_every_kind_of_length)
{
	size_t n;
	char p[320];

	write_sample(path, 256);
	unsigned char *b = tu_slurp(path, &n);
	size_t lens[] = { 0, 5, 8, 40, 63, 64, 70, 79, 80, 100, n - 8, n - 1 };
	for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++) {
		snprintf(p, sizeof p, "%s/trunc%zu.tok", dir, lens[i]);
		spill(p, b, lens[i]);
		char what[64];
		snprintf(what, sizeof what, "truncated to %zu of %zu bytes", lens[i], n);
		expect_open_fails(p, CORE_ETRUNC, "bytes", what);
		unlink(p);
	}
	free(b);
}

Test(tokfile, bit_flips_are_checksum_errors)
{
	size_t n;

	write_sample(path, 256);
	unsigned char *b = tu_slurp(path, &n);
	/* every byte after the header, one bit each */
	for (size_t at = 64; at < n; at++) {
		b[at] ^= (unsigned char)(1u << (at % 8));
		spill(path, b, n);
		char what[64];
		snprintf(what, sizeof what, "bit flip at byte %zu", at);
		expect_open_fails(path, CORE_ECHECKSUM, "body checksum", what);
		b[at] ^= (unsigned char)(1u << (at % 8));
	}
	/* header fields after the version (counts, width, crc, reserved, header crc) */
	for (size_t at = 12; at < 64; at++) {
		b[at] ^= 0x10;
		spill(path, b, n);
		char what[64];
		snprintf(what, sizeof what, "bit flip at header byte %zu", at);
		expect_open_fails(path, CORE_ECHECKSUM, "checksum", what);
		b[at] ^= 0x10;
	}
	free(b);
}

Test(tokfile, bad_magic)
{
	size_t n;

	write_sample(path, 256);
	unsigned char *b = tu_slurp(path, &n);
	b[0] = 'X';
	spill(path, b, n);
	expect_open_fails(path, CORE_EFORMAT, "not a token file", "bad magic");
	spill(path, (const unsigned char *)"{\"text\": \"hello\"}\n", 18);
	expect_open_fails(path, CORE_EFORMAT, "not a token file", "a JSON file");
	free(b);
}

Test(tokfile, bad_version)
{
	size_t n;

	write_sample(path, 256);
	unsigned char *b = tu_slurp(path, &n);
	wr32(b + 8, 7);
	spill(path, b, n);
	expect_open_fails(path, CORE_EVERSION, "version 7 not supported (this build reads 1 to 2)",
			  "version 7");
	free(b);
}

/* Header bytes 48..59 of version 2: the tokenizer's kind (u32) and digest (u64), by hand. */
Test(tokfile, tokenizer_record)
{
	struct tokfile_writer *w;
	struct tokfile tf;
	size_t n;
	const struct tokenizer_id spm = {TOKENIZER_SPM, 0x0123456789abcdefull};

	cr_assert_eq(tokw_open(&w, path, 4096), 0);
	tokw_set_tokenizer(w, spm);
	cr_assert_eq(tokw_add_doc(w, doc0, 4, meta[0], strlen(meta[0])), 0);
	cr_assert_eq(tokw_commit(w), 0, "%s", err_detail());
	unsigned char *b = tu_slurp(path, &n);
	cr_assert_eq(rd32(b + 48), 2);
	cr_assert_eq(rd64(b + 52), 0x0123456789abcdefull);
	cr_assert_eq(tokfile_open(&tf, path), 0, "%s", err_detail());
	cr_assert_eq(tf.version, 2);
	cr_assert_eq(tf.tokenizer.kind, TOKENIZER_SPM);
	cr_assert_eq(tf.tokenizer.digest, spm.digest);
	tokfile_close(&tf);

	/* damage that the checksums do not catch (resealed): no such kind; a digest without
	 * SentencePiece; the byte tokenizer with another vocabulary */
	wr32(b + 48, 3);
	reseal(b, n);
	spill(path, b, n);
	expect_open_fails(path, CORE_EFORMAT, "unknown tokenizer kind 3", "kind 3");
	wr32(b + 48, 1);
	reseal(b, n);
	spill(path, b, n);
	expect_open_fails(path, CORE_EFORMAT, "a tokenizer digest without", "byte + digest");
	memset(b + 52, 0, 8);
	reseal(b, n);
	spill(path, b, n);
	expect_open_fails(path, CORE_EFORMAT, "the byte tokenizer with a vocabulary of 4096",
			  "byte, 4096");
	free(b);

	/* the writer refuses the last one too, and writes nothing */
	cr_assert_eq(tokw_open(&w, path, 300), 0);
	tokw_set_tokenizer(w, (struct tokenizer_id){TOKENIZER_BYTE, 0});
	cr_assert_eq(tokw_commit(w), CORE_EUSAGE);

	/* the byte tokenizer recorded */
	cr_assert_eq(tokw_open(&w, path, 256), 0);
	tokw_set_tokenizer(w, (struct tokenizer_id){TOKENIZER_BYTE, 0});
	cr_assert_eq(tokw_commit(w), 0, "%s", err_detail());
	cr_assert_eq(tokfile_open(&tf, path), 0, "%s", err_detail());
	cr_assert_eq(tf.tokenizer.kind, TOKENIZER_BYTE);
	tokfile_close(&tf);
}

/* Version 1 (before the record): still read; vocabulary 256 means the byte tokenizer, any
 * other is unknown; its bytes 48..59 must be zero. */
Test(tokfile, version_1_still_reads)
{
	size_t n;
	struct tokfile tf;

	for (uint32_t vocab = 256; vocab <= 257; vocab++) {
		write_sample(path, vocab);
		unsigned char *b = tu_slurp(path, &n);
		wr32(b + 8, 1);
		reseal(b, n);
		spill(path, b, n);
		cr_assert_eq(tokfile_open(&tf, path), 0, "%s", err_detail());
		cr_assert_eq(tf.version, 1);
		cr_assert_eq(tf.tokenizer.kind, vocab == 256 ? TOKENIZER_BYTE : TOKENIZER_NONE);
		cr_assert_eq(tf.ntokens, 7);
		cr_assert_eq(tokfile_token(&tf, 3), 255);
		tokfile_close(&tf);
		b[50] = 1;
		reseal(b, n);
		spill(path, b, n);
		expect_open_fails(path, CORE_EFORMAT, "reserved header bytes are not zero", "v1");
		free(b);
	}
}

Test(tokfile, token_outside_vocab)
{
	size_t n;

	write_sample(path, 256);
	unsigned char *b = tu_slurp(path, &n);
	b[64 + 2 * 5 + 1] = 1; /* token 5: 7 -> 263 */
	reseal(b, n);
	spill(path, b, n);
	expect_open_fails(path, CORE_EFORMAT, "token 263 at position 5", "token >= vocab");
	/* the same file with a vocabulary that admits 263 is fine */
	wr32(b + 12, 264);
	reseal(b, n);
	spill(path, b, n);
	struct tokfile tf;
	cr_assert_eq(tokfile_open(&tf, path), 0, "%s", err_detail());
	tokfile_close(&tf);
	free(b);
}

Test(tokfile, offsets_must_be_monotone_and_end_at_ntokens)
{
	size_t n;

	write_sample(path, 256);
	unsigned char *b = tu_slurp(path, &n);
	b[80 + 8 * 2] = 3; /* offsets 0 4 3 7 */
	reseal(b, n);
	spill(path, b, n);
	expect_open_fails(path, CORE_EFORMAT, "negative length", "offsets not monotone");
	b[80 + 8 * 2] = 4;
	b[80 + 8 * 3] = 6; /* last offset 6 != 7 tokens */
	reseal(b, n);
	spill(path, b, n);
	expect_open_fails(path, CORE_EFORMAT, "offsets span", "last offset != ntokens");
	free(b);
}

Test(tokfile, trailing_bytes_and_width)
{
	size_t n;

	write_sample(path, 256);
	unsigned char *b = tu_slurp(path, &n);
	unsigned char *c = calloc(n + 8, 1);
	memcpy(c, b, n);
	reseal(c, n + 8);
	spill(path, c, n + 8);
	expect_open_fails(path, CORE_EFORMAT, "trailing", "8 extra bytes");
	wr32(b + 32, 4);
	reseal(b, n);
	spill(path, b, n);
	expect_open_fails(path, CORE_EFORMAT, "width", "width 4 with vocab 256");
	free(b);
	free(c);
}

Test(tokfile, missing_file_is_io_error)
{
	char p[320];

	snprintf(p, sizeof p, "%s/none.tok", dir);
	expect_open_fails(p, CORE_EIO, "cannot open", "missing file");
}

/* dpc-tokens(5): each document's metadata is a JSON object without NUL bytes, or nothing.
 * The sample's third document holds {"id":"c","n":[1,2]} (20 bytes); each case replaces it
 * with text of the same length and reseals both crcs, so only the metadata rule can catch it. */
Test(tokfile, metadata_must_be_json_objects)
{
	static const struct {
		const char meta[21];
		const char *detail;
	} bad[] = {
		{ "{\"id\":\"c\",\"n\":[1,\0]}", "metadata of document 2 contains a NUL byte" },
		{ "{\"id\":\"c\",\"n\":[1,2]]", "metadata of document 2 is not valid JSON" },
		{ "not json, 20 bytes!!", "metadata of document 2 is not valid JSON" },
		{ "[\"id\",\"c\",\"n\",1,2,3]", "metadata of document 2 is not a JSON object" },
		{ "{\"id\":\"c\",\"id\":1234}", "metadata of document 2 is not valid JSON" },
		{ "\xff\"id\":\"c\",\"n\":[1,2]}", "metadata of document 2 is not valid JSON" },
		{ "{\"id\":\"c\"}          ", NULL }, /* white space around it is JSON */
	};
	size_t n;

	write_sample(path, 256);
	unsigned char *b = tu_slurp(path, &n);
	size_t at = n - strlen(meta[2]);
	cr_assert_eq(strlen(meta[2]), 20);
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		cr_assert(i == 0 || strlen(bad[i].meta) == 20, "case %zu is not 20 bytes", i);
		memcpy(b + at, bad[i].meta, 20);
		reseal(b, n);
		spill(path, b, n);
		if (bad[i].detail) {
			expect_open_fails(path, CORE_EFORMAT, bad[i].detail, bad[i].detail);
		} else {
			struct tokfile tf;
			cr_assert_eq(tokfile_open(&tf, path), 0, "case %zu: %s", i, err_detail());
			tokfile_close(&tf);
		}
	}
	free(b);
}

Test(tokfile, writer_refuses_bad_metadata)
{
	static const char *const bad[] = { "{\"a\":1}\0", "not json", "[1]", "\"text\"", "{" };
	static const size_t len[] = { 8, 8, 3, 6, 1 };
	struct tokfile_writer *w;
	uint32_t t[] = { 1, 2 };

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		cr_assert_eq(tokw_open(&w, path, 256), 0);
		cr_assert_eq(tokw_add_doc(w, t, 2, "{\"ok\":true}", 11), 0);
		int rc = tokw_add_doc(w, t, 2, bad[i], len[i]);
		cr_assert_eq(rc, CORE_EUSAGE, "metadata '%.*s' returned %d", (int)len[i], bad[i],
			     rc);
		cr_assert(strstr(err_detail(), "metadata of document 1 "), "detail '%s'",
			  err_detail());
		cr_assert_str_eq(err_file(), path);
		tokw_abort(w);
	}
	cr_assert_eq(count_entries(), 0, "abort left files behind");
}

/* A token file must be a regular file: a FIFO is refused at once, not read (nor waited on). */
Test(tokfile, fifo_is_refused_at_once)
{
	char p[320];

	snprintf(p, sizeof p, "%s/in.fifo", dir);
	cr_assert_eq(mkfifo(p, 0600), 0);
	expect_open_fails(p, CORE_EIO, "is a FIFO, not a regular file", "a FIFO");
	expect_open_fails(dir, CORE_EIO, "is a directory, not a regular file", "a directory");
}
