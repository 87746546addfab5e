/* test_tokenizer.c - lib/io/tokenizer.h: the byte tokenizer by hand; ids and their text;
 * and, in a build with SentencePiece, models trained here on a generated corpus: decoding
 * gives back every byte of any UTF-8 text (characters never seen in training included, as
 * bytes), the digest is zlib's crc32 and adler32 of the file computed here, training is
 * deterministic, and failures (the caller's, the trainer's, bad files) say what and where.
 * That the pieces are SentencePiece's own is checked against spm_encode in t-tokenizer.sh. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "common/err.h"
#include "common/rng.h"
#include "io/spm_shim.h"
#include "io/tokenizer.h"
#include "testutil.h"
#include "common/banned.h"

static char dir[256];

static void setup(void) { tu_mkdtemp(dir, sizeof dir, "tokenizer"); }
static void teardown(void) { tu_rm_tree(dir); }

TestSuite(tokenizer, .init = setup, .fini = teardown, .timeout = 60);

static const char *in_dir(const char *name)
{
	static char p[4][320];
	static int k;
	char *s = p[k++ % 4];
	snprintf(s, 320, "%s/%s", dir, name);
	return s;
}

Test(tokenizer, byte)
{
	struct tokenizer *tk;
	struct token_buf t = {0};
	static const char s[] = "A\xc3\xa9\0\xff";

	cr_assert_eq(tokenizer_open(&tk, "byte"), 0);
	cr_assert_eq(tokenizer_vocab(tk), 256);
	cr_assert_eq(tokenizer_get_id(tk).kind, TOKENIZER_BYTE);
	cr_assert_eq(tokenizer_encode(tk, s, 5, &t), 0);
	cr_assert_eq(tokenizer_encode(tk, "z", 1, &t), 0);
	static const uint32_t want[] = {65, 195, 169, 0, 255, 122};
	cr_assert_eq(t.n, 6);
	for (int i = 0; i < 6; i++)
		cr_assert_eq(t.tok[i], want[i], "token %d: %u", i, t.tok[i]);
	char *text;
	size_t len;
	cr_assert_eq(tokenizer_decode(tk, t.tok, t.n, &text, &len), 0);
	cr_assert_eq(len, 6);
	cr_assert(memcmp(text, "A\xc3\xa9\0\xffz", 6) == 0);
	free(text);
	const uint32_t bad = 256;
	cr_assert_eq(tokenizer_decode(tk, &bad, 1, &text, &len), CORE_EFORMAT);
	cr_assert_null(text);
	token_buf_free(&t);
	tokenizer_close(tk);
	cr_assert_eq(tokenizer_open(&tk, "bpe"), CORE_EUSAGE);
	cr_assert_null(tk);
	cr_assert(strstr(err_detail(), "unknown tokenizer 'bpe'"), "%s", err_detail());
	cr_assert_eq(tokenizer_open(&tk, "spm:"), CORE_EUSAGE);
}

Test(tokenizer, ids)
{
	struct tokenizer_id a = {TOKENIZER_SPM, 0x0123456789abcdefULL}, b;
	char s[TOKENIZER_ID_LEN];
	tokenizer_id_str(&a, s);
	cr_assert_str_eq(s, "spm-0123456789abcdef");
	cr_assert_eq(tokenizer_id_parse(s, &b), 0);
	cr_assert(b.kind == a.kind && b.digest == a.digest);
	cr_assert_eq(tokenizer_id_parse("byte", &b), 0);
	cr_assert_eq(b.kind, TOKENIZER_BYTE);
	tokenizer_id_str(&b, s);
	cr_assert_str_eq(s, "byte");
	const char *bad[] = {"spm-0123456789abcde", "spm-0123456789ABCDEF", "spm-0123456789abcdef0",
			     "spm-", "bytes", "", "spm-0123456789abcdeg"};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
		cr_assert_eq(tokenizer_id_parse(bad[i], &b), CORE_EFORMAT, "'%s'", bad[i]);
	const struct tokenizer_id none = {0}, byte = {TOKENIZER_BYTE, 0};
	cr_assert_eq(tokenizer_id_known(none, 256).kind, TOKENIZER_BYTE);
	cr_assert_eq(tokenizer_id_known(none, 4096).kind, TOKENIZER_NONE);
	cr_assert(tokenizer_id_differ(a, byte));
	cr_assert(!tokenizer_id_differ(a, none));
	cr_assert(!tokenizer_id_differ(a, a));
	struct tokenizer_id c = a;
	c.digest ^= 1;
	cr_assert(tokenizer_id_differ(a, c));
	tokenizer_id_str(&none, s);
	cr_assert_str_eq(s, "unknown");
}

/* A generated corpus: sentences of words from a small lexicon with accented ones, numbers
 * and punctuation, drawn from rng.h's stream (the same on every machine). */
struct gen {
	int n, i;
	char buf[4096];
};

static int gen_next(void *arg, const char **text, size_t *len)
{
	static const char *const words[] = {
		"the", "of", "and", "jury", "said", "election", "county", "café", "naïve",
		"Fulton", "Atlanta", "primary", "evidence", "city", "committee", "über", "1961",
		"report", "—", "said,", "it.", "Mr.", "over-all", "charge", "deserves", "praise"};
	struct gen *g = arg;
	if (g->i == g->n)
		return 0;
	size_t k = 0;
	const int nw = 20 + (int)(rng_u64(7, 1, (uint64_t)g->i) % 60);
	for (int w = 0; w < nw; w++) {
		const char *s = words[rng_u64(7, 2, (uint64_t)g->i * 1000 + (uint64_t)w) %
				      (sizeof words / sizeof words[0])];
		k += (size_t)snprintf(g->buf + k, sizeof g->buf - k, "%s%s", w ? " " : "", s);
	}
	k += (size_t)snprintf(g->buf + k, sizeof g->buf - k, "\n");
	g->i++;
	*text = g->buf;
	*len = k;
	return 1;
}

static int fail_next(void *arg, const char **text, size_t *len)
{
	struct gen *g = arg;
	if (g->i == 50)
		return err_set(CORE_EIO, "corpus.jsonl", "read failed: input/output error");
	return gen_next(arg, text, len);
}

static const struct tokenizer_train_opts opts = {
	.type = "unigram", .vocab = 320, .seed = 1, .threads = 1, .max_len = 4096,
	.coverage = 1.0};

/* Train opts into path; skip the test in a build without SentencePiece. */
static void train(const char *path, const struct tokenizer_train_opts *o, struct tokenizer_id *id)
{
	struct gen g = {.n = 2000};
	int rc = tokenizer_train(path, o, gen_next, &g, id);
	if (rc == CORE_EUNSUPPORTED)
		cr_skip_test("no SentencePiece in this build: %s", err_detail());
	cr_assert_eq(rc, 0, "%s", err_detail());
}

static void round_trip(const struct tokenizer *tk, const char *s)
{
	struct token_buf t = {0};
	char *text;
	size_t len;
	cr_assert_eq(tokenizer_encode(tk, s, strlen(s), &t), 0, "%s", err_detail());
	for (uint64_t i = 0; i < t.n; i++)
		cr_assert_lt(t.tok[i], tokenizer_vocab(tk));
	cr_assert_eq(tokenizer_decode(tk, t.tok, t.n, &text, &len), 0, "%s", err_detail());
	cr_assert_eq(len, strlen(s), "'%s' came back as '%s'", s, text);
	cr_assert(memcmp(text, s, len) == 0, "'%s' came back as '%s'", s, text);
	/* token by token, as sampling writes them: the same bytes */
	char *cat = malloc(len + TOKENIZER_TOKEN_MAX), piece[TOKENIZER_TOKEN_MAX];
	size_t k = 0;
	for (uint64_t i = 0; i < t.n && k <= len; i++) {
		size_t n = tokenizer_token_bytes(tk, t.tok[i], piece);
		memcpy(cat + k, piece, n);
		k += n;
	}
	cr_assert(k == len && memcmp(cat, s, len) == 0, "token by token: '%.*s', not '%s'",
		  (int)k, cat, s);
	free(cat);
	free(text);
	token_buf_free(&t);
}

Test(tokenizer, spm_train_open_round_trip)
{
	const char *path = in_dir("u.model");
	struct tokenizer_id id;
	train(path, &opts, &id);

	/* the digest: zlib's crc32 and adler32 of the file's bytes, computed here */
	size_t n;
	unsigned char *bytes = tu_slurp(path, &n);
	const uint64_t want = (uint64_t)crc32(0, bytes, (uInt)n) << 32 | adler32(1, bytes, (uInt)n);
	cr_assert_eq(id.kind, TOKENIZER_SPM);
	cr_assert_eq(id.digest, want, "%016llx, want %016llx", (unsigned long long)id.digest,
		     (unsigned long long)want);

	char spec[400];
	snprintf(spec, sizeof spec, "spm:%s", path);
	struct tokenizer *tk;
	cr_assert_eq(tokenizer_open(&tk, spec), 0, "%s", err_detail());
	cr_assert_eq(tokenizer_vocab(tk), 320);
	cr_assert_eq(tokenizer_get_id(tk).digest, want);
	cr_assert_str_eq(tokenizer_spec(tk), spec);
	round_trip(tk, "the jury said the election of Fulton county deserves praise\n");
	round_trip(tk, "  two spaces,\ttabs\tand\nnew lines\n\n");
	round_trip(tk, "never seen: 日本語, Ωμέγα, emoji \xf0\x9f\x98\x80 and \\x00-free bytes ~^`|");
	round_trip(tk, "");
	/* fewer tokens than bytes on text like the corpus: it learnt pieces */
	struct token_buf t = {0};
	const char *s = "the election committee said the jury deserves praise";
	cr_assert_eq(tokenizer_encode(tk, s, strlen(s), &t), 0);
	cr_assert_lt(t.n, strlen(s) / 3, "%llu tokens for %zu bytes", (unsigned long long)t.n,
		     strlen(s));
	token_buf_free(&t);
	tokenizer_close(tk);
	free(bytes);

	/* the same options again: the same file, byte for byte; BPE is another model */
	const char *again = in_dir("u2.model");
	train(again, &opts, NULL);
	size_t n2;
	unsigned char *b2 = tu_slurp(again, &n2);
	bytes = tu_slurp(path, &n);
	cr_assert(n == n2 && memcmp(bytes, b2, n) == 0, "training twice gave different models");
	free(b2);
	struct tokenizer_train_opts bo = opts;
	bo.type = "bpe";
	struct tokenizer_id bid;
	train(in_dir("b.model"), &bo, &bid);
	cr_assert(tokenizer_id_differ(id, bid));
	free(bytes);
}

/* A text longer than TOKENIZER_ENCODE_PIECE goes to SentencePiece in pieces; the tokens are
 * those SentencePiece gives the whole text at once (through the shim directly). */
Test(tokenizer, spm_long_text_in_pieces, .timeout = 60)
{
#ifdef CORE_HAVE_SPM_TEST
	const char *path = in_dir("long.model");
	train(path, &opts, NULL);
	char spec[400];
	snprintf(spec, sizeof spec, "spm:%s", path);
	struct tokenizer *tk;
	cr_assert_eq(tokenizer_open(&tk, spec), 0, "%s", err_detail());

	/* 2.5 pieces of the corpus's sentences, and a run without spaces across a cut */
	const size_t want = TOKENIZER_ENCODE_PIECE * 5 / 2;
	char *text = malloc(want + 8192);
	size_t n = 0;
	struct gen g = {.n = 1u << 30};
	const char *t;
	size_t len;
	while (n < want && gen_next(&g, &t, &len) == 1) {
		memcpy(text + n, t, len);
		n += len;
		if (n > TOKENIZER_ENCODE_PIECE * 2 - 4000 && n < TOKENIZER_ENCODE_PIECE * 2)
			for (int k = 0; k < 6000; k++)
				text[n++] = (char)('a' + k % 26);
	}
	struct token_buf cut = {0};
	cr_assert_eq(tokenizer_encode(tk, text, n, &cut), 0, "%s", err_detail());
	size_t mlen;
	const void *bytes = tokenizer_model_file(tk, &mlen);
	struct spm_model *m;
	char msg[256];
	cr_assert_eq(spm_shim_load(&m, bytes, mlen, msg, sizeof msg), 0, "%s", msg);
	uint32_t *whole = NULL;
	uint64_t wn = 0, wcap = 0;
	cr_assert_eq(spm_shim_encode(m, text, n, &whole, &wn, &wcap, msg, sizeof msg), 0);
	cr_assert_gt(n, 2 * TOKENIZER_ENCODE_PIECE);
	cr_assert_eq(cut.n, wn, "%llu tokens in pieces, %llu whole", (unsigned long long)cut.n,
		     (unsigned long long)wn);
	cr_assert(memcmp(cut.tok, whole, sizeof *whole * wn) == 0, "the tokens differ");
	free(whole);
	spm_shim_free(m);
	token_buf_free(&cut);
	free(text);
	tokenizer_close(tk);
#else
	cr_skip_test("no SentencePiece in this build");
#endif
}

Test(tokenizer, spm_failures)
{
	struct tokenizer_id id;
	train(in_dir("ok.model"), &opts, &id); /* skips without SentencePiece */

	/* the caller's error comes back as it is, and nothing is written */
	struct gen g = {.n = 2000};
	const char *out = in_dir("never.model");
	cr_assert_eq(tokenizer_train(out, &opts, fail_next, &g, NULL), CORE_EIO);
	cr_assert_str_eq(err_file(), "corpus.jsonl");
	cr_assert_eq(access(out, F_OK), -1, "a failed training left '%s'", out);

	/* more pieces than the texts allow: the trainer's refusal, quoted */
	struct tokenizer_train_opts big = opts;
	big.vocab = 100000;
	g = (struct gen){.n = 50};
	cr_assert_eq(tokenizer_train(out, &big, gen_next, &g, NULL), CORE_EFORMAT);
	cr_assert(strstr(err_detail(), "SentencePiece training failed"), "%s", err_detail());
	cr_assert_eq(access(out, F_OK), -1);

	/* options */
	struct tokenizer_train_opts o = opts;
	o.type = "wordpiece";
	cr_assert_eq(tokenizer_train(out, &o, gen_next, &g, NULL), CORE_EUSAGE);
	o = opts;
	o.vocab = 259;
	cr_assert_eq(tokenizer_train(out, &o, gen_next, &g, NULL), CORE_EUSAGE);

	/* files that are no model */
	struct tokenizer *tk;
	char spec[400];
	snprintf(spec, sizeof spec, "spm:%s", in_dir("missing.model"));
	cr_assert_eq(tokenizer_open(&tk, spec), CORE_ENOTFOUND);
	FILE *f = fopen(in_dir("junk.model"), "w");
	cr_assert_not_null(f);
	fputs("this is not a protocol buffer\n", f);
	fclose(f);
	snprintf(spec, sizeof spec, "spm:%s", in_dir("junk.model"));
	cr_assert_eq(tokenizer_open(&tk, spec), CORE_EFORMAT);
	cr_assert(strstr(err_file(), "junk.model"), "%s", err_file());
	cr_assert_null(tk);
}

Test(tokenizer, check)
{
	struct tokenizer *tk;
	cr_assert_eq(tokenizer_open(&tk, "byte"), 0);
	const struct tokenizer_id none = {0}, spm = {TOKENIZER_SPM, 42}, byte = {TOKENIZER_BYTE, 0};
	cr_assert_eq(tokenizer_check(tk, none, 256, "old.tok"), 0);
	cr_assert_eq(tokenizer_check(tk, byte, 256, "new.tok"), 0);
	cr_assert_eq(tokenizer_check(tk, spm, 4096, "s.tok"), CORE_EUSAGE);
	cr_assert_str_eq(err_file(), "s.tok");
	cr_assert_str_eq(err_detail(), "tokenizer spm-000000000000002a, not the one given (byte)");
	cr_assert_eq(tokenizer_check(tk, none, 4096, "v.tok"), CORE_EUSAGE);
	cr_assert_str_eq(err_detail(), "a vocabulary of 4096, the tokenizer given (byte) has 256");
	tokenizer_close(tk);

	/* tokenizer_for: the spec given, checked; else bytes for bytes; else none or a refusal */
	cr_assert_eq(tokenizer_for(NULL, byte, 256, "b.tok", 1, &tk), 0);
	cr_assert_eq(tokenizer_get_id(tk).kind, TOKENIZER_BYTE);
	tokenizer_close(tk);
	cr_assert_eq(tokenizer_for(NULL, none, 256, "old.tok", 1, &tk), 0); /* version 1 */
	cr_assert_eq(tokenizer_get_id(tk).kind, TOKENIZER_BYTE);
	tokenizer_close(tk);
	cr_assert_eq(tokenizer_for(NULL, spm, 4096, "s.tok", 0, &tk), 0);
	cr_assert_null(tk);
	cr_assert_eq(tokenizer_for(NULL, spm, 4096, "s.tok", 1, &tk), CORE_EUSAGE);
	cr_assert_null(tk);
	cr_assert_str_eq(err_detail(), "made with tokenizer spm-000000000000002a, a vocabulary of "
				       "4096: give its model with --tokenizer spm:MODEL");
	cr_assert_eq(tokenizer_for(NULL, none, 300, "u.st", 1, &tk), CORE_EUSAGE);
	cr_assert_str_eq(err_detail(), "made with an unknown tokenizer, a vocabulary of 300: give "
				       "its model with --tokenizer spm:MODEL");
	cr_assert_eq(tokenizer_for("byte", spm, 4096, "s.tok", 1, &tk), CORE_EUSAGE);
	cr_assert_null(tk);
	cr_assert_str_eq(err_file(), "s.tok");
}
