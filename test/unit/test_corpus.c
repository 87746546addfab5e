/* test_corpus.c - JSONL, .txt and directory readers (escapes, UTF-8, metadata, bad lines, plain
 * text given as JSONL, FIFOs), the byte tokenizer, the deterministic split, the cutting into
 * pieces (rule against a greedy reference, metadata), and corpus_prepare end to end: chunked
 * output against the unchunked one, empty input and empty splits refused, nothing written. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/corpus.h"
#include "common/err.h"
#include "common/rng.h"
#include "io/tokfile.h"
#include "testutil.h"
#include "common/banned.h"

static char dir[256];

static void setup(void)
{
	tu_mkdtemp(dir, sizeof dir, "corpus");
}

static void teardown(void)
{
	tu_rm_tree(dir);
}

TestSuite(corpus, .init = setup, .fini = teardown, .timeout = 10);

static const char *put(const char *name, const char *content, size_t n)
{
	static char p[8][320];
	static int k;
	char *q = p[k++ % 8];
	snprintf(q, 320, "%s/%s", dir, name);
	FILE *f = fopen(q, "wb");
	cr_assert(f);
	cr_assert(fwrite(content, 1, n, f) == n);
	fclose(f);
	return q;
}

#define PUTS(name, s) put(name, s, sizeof(s) - 1)

/* ---- JSONL -------------------------------------------------------------------------------- */

Test(corpus, jsonl_escapes_unicode_and_metadata)
{
	const char *p = PUTS("a.jsonl",
			     "{\"id\":\"x1\",\"text\":\"a\\\"b\\\\c\\n\\t/\","
			     "\"n\":[1,{\"k\":null}]}\n"
			     "\n"
			     "  \r\n"
			     "{\"text\":\"caf\\u00e9 \\ud83d\\ude00 \\u0000!\"}\r\n"
			     "{\"text\":\"\",\"lang\":\"\xc3\xa9\"}");
	/* expected bytes, written out by hand */
	static const char t0[] = "a\"b\\c\n\t/";
	static const char t1[] = "caf\xc3\xa9 \xf0\x9f\x98\x80 \0!";
	struct corpus_reader *r;
	struct corpus_doc d;

	cr_assert_eq(corpus_open(&r, p), 0, "%s", err_detail());
	cr_assert_eq(corpus_next(r, &d), 1, "%s", err_detail());
	cr_assert_eq(d.index, 0);
	cr_assert_eq(d.len, sizeof t0 - 1, "len %zu", d.len);
	cr_assert(memcmp(d.text, t0, d.len) == 0);
	cr_assert_str_eq(d.meta, "{\"id\":\"x1\",\"n\":[1,{\"k\":null}]}");
	cr_assert_eq(d.meta_len, strlen(d.meta));

	cr_assert_eq(corpus_next(r, &d), 1, "%s", err_detail());
	cr_assert_eq(d.index, 1);
	cr_assert_eq(d.len, sizeof t1 - 1, "len %zu", d.len);
	cr_assert(memcmp(d.text, t1, d.len) == 0, "unicode escapes decode to UTF-8");
	cr_assert_str_eq(d.meta, "{}");

	cr_assert_eq(corpus_next(r, &d), 1, "%s", err_detail());
	cr_assert_eq(d.len, 0);
	cr_assert_str_eq(d.meta, "{\"lang\":\"\xc3\xa9\"}");
	cr_assert_eq(corpus_next(r, &d), 0);
	corpus_close(r);
}

Test(corpus, jsonl_progress_counts_bytes_read)
{
	static const char l0[] = "{\"text\":\"ab\"}\n", l1[] = "\n  \r\n",
			  l2[] = "{\"text\":\"c\",\"id\":1}\r\n", l3[] = "{\"text\":\"\"}";
	char all[128];
	struct corpus_reader *r;
	struct corpus_doc d;
	uint64_t done, total;

	snprintf(all, sizeof all, "%s%s%s%s", l0, l1, l2, l3);
	const char *p = put("p.jsonl", all, strlen(all));
	cr_assert_eq(corpus_open(&r, p), 0, "%s", err_detail());
	corpus_progress(r, &done, &total);
	cr_assert_eq(done, 0);
	cr_assert_eq(total, strlen(all));
	cr_assert_eq(corpus_next(r, &d), 1, "%s", err_detail());
	corpus_progress(r, &done, &total);
	cr_assert_eq(done, strlen(l0), "after the first line: %llu", (unsigned long long)done);
	/* blank lines are read past on the way to the next document */
	cr_assert_eq(corpus_next(r, &d), 1, "%s", err_detail());
	corpus_progress(r, &done, &total);
	cr_assert_eq(done, strlen(l0) + strlen(l1) + strlen(l2), "%llu", (unsigned long long)done);
	cr_assert_eq(corpus_next(r, &d), 1, "%s", err_detail());
	cr_assert_eq(corpus_next(r, &d), 0);
	corpus_progress(r, &done, &total);
	cr_assert_eq(done, total, "at the end %llu of %llu", (unsigned long long)done,
		     (unsigned long long)total);
	corpus_close(r);
}

struct bad_case {
	const char *content;
	const char *detail; /* a substring of the expected detail */
};

Test(corpus, jsonl_bad_lines)
{
	static const struct bad_case cases[] = {
		{ "{\"text\":\"ok\"}\n{\"text\":\"ok\"}\nnot json\n", "line 3, column" },
		{ "{\"text\":\"ok\"}\n\n[\"text\"]\n", "line 3: not a JSON object" },
		{ "{\"text\":\"ok\"}\n\"text\"\n", "line 2" },
		{ "{\"body\":\"ok\"}\n", "line 1: no \"text\" field" },
		{ "{\"text\":42}\n", "line 1: \"text\" is not a string" },
		{ "{\"text\":\"ok\"}\n{\"text\":\"cut", "line 2, column" },
		{ "{\"text\":\"ok\"} {\"text\":\"two\"}\n", "line 1, column" },
		{ "{\"text\":\"\\ud800\"}\n", "line 1, column" },
		{ "{\"text\":\"\xff\"}\n", "line 1, column" },
		{ "{\"text\":\"a\",\"text\":\"b\"}\n", "line 1, column" },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		const char *p = put("bad.jsonl", cases[i].content, strlen(cases[i].content));
		struct corpus_reader *r;
		struct corpus_doc d;
		int rc;

		cr_assert_eq(corpus_open(&r, p), 0);
		while ((rc = corpus_next(r, &d)) == 1)
			;
		cr_assert_eq(rc, CORE_EFORMAT, "case %zu (%s): rc %d", i, cases[i].content, rc);
		cr_assert(strstr(err_detail(), cases[i].detail), "case %zu: detail '%s' lacks '%s'",
			  i, err_detail(), cases[i].detail);
		cr_assert_str_eq(err_file(), p, "case %zu names the file", i);
		corpus_close(r);
	}
}

Test(corpus, missing_input)
{
	struct corpus_reader *r;
	char p[320];

	snprintf(p, sizeof p, "%s/none.jsonl", dir);
	cr_assert_eq(corpus_open(&r, p), CORE_EIO);
	cr_assert_null(r);
}

/* ---- directory ---------------------------------------------------------------------------- */

Test(corpus, directory_sorted_by_name_with_metadata)
{
	char sub[320], p[384];
	struct corpus_reader *r;
	struct corpus_doc d;

	snprintf(sub, sizeof sub, "%s/docs", dir);
	mkdir(sub, 0777);
	snprintf(p, sizeof p, "%s/nested", sub);
	mkdir(p, 0777);
	PUTS("docs/b.txt", "bee\n");
	PUTS("docs/B.txt", "upper");
	PUTS("docs/a.txt", "a\0b");
	PUTS("docs/.hidden", "no");
	PUTS("docs/nested/x", "no");

	/* strcmp order: "B.txt" < "a.txt" < "b.txt" */
	static const char *const names[] = { "B.txt", "a.txt", "b.txt" };
	static const char *const texts[] = { "upper", "a\0b", "bee\n" };
	static const size_t lens[] = { 5, 3, 4 };
	cr_assert_eq(corpus_open(&r, sub), 0, "%s", err_detail());
	for (int i = 0; i < 3; i++) {
		char meta[64];
		cr_assert_eq(corpus_next(r, &d), 1, "doc %d: %s", i, err_detail());
		cr_assert_eq(d.index, (uint64_t)i);
		cr_assert_eq(d.len, lens[i], "doc %d len %zu", i, d.len);
		cr_assert(memcmp(d.text, texts[i], lens[i]) == 0, "doc %d text", i);
		snprintf(meta, sizeof meta, "{\"file\":\"%s\"}", names[i]);
		cr_assert_str_eq(d.meta, meta, "doc %d", i);
	}
	cr_assert_eq(corpus_next(r, &d), 0);
	corpus_close(r);
}

/* ---- split -------------------------------------------------------------------------------- */

#define NDOC 10000

Test(corpus, split_fractions_close_to_requested)
{
	static const double fr[][2] = { { 0.02, 0.005 }, { 0.1, 0.2 }, { 0.5, 0.0 } };
	for (size_t c = 0; c < 3; c++) {
		for (uint64_t seed = 0; seed < 3; seed++) {
			int n[CORPUS_NSPLITS] = { 0 };
			for (uint64_t d = 0; d < NDOC; d++)
				n[corpus_split_of(seed, d, fr[c][0], fr[c][1])]++;
			double p[3] = { 1 - fr[c][0] - fr[c][1], fr[c][0], fr[c][1] };
			for (int s = 0; s < 3; s++) {
				/* within 5 binomial standard deviations (+1 for p = 0) */
				double mean = NDOC * p[s], sd = sqrt(NDOC * p[s] * (1 - p[s]));
				cr_assert(fabs(n[s] - mean) <= 5 * sd + 1,
					  "fracs (%g, %g) seed %llu: %s got %d docs, "
					  "expected %g +- %g", fr[c][0], fr[c][1],
					  (unsigned long long)seed,
					  corpus_split_name((enum corpus_split)s), n[s], mean,
					  5 * sd);
			}
		}
	}
}

Test(corpus, split_reproducible_and_order_independent)
{
	static unsigned char fwd[NDOC], rev[NDOC], other[NDOC];
	int differ = 0;

	for (uint64_t d = 0; d < NDOC; d++)
		fwd[d] = (unsigned char)corpus_split_of(42, d, 0.2, 0.1);
	for (uint64_t d = NDOC; d-- > 0;)
		rev[d] = (unsigned char)corpus_split_of(42, d, 0.2, 0.1);
	/* a scrambled order: d -> d * 7919 mod NDOC is a permutation (7919 is prime to 10000) */
	for (uint64_t i = 0; i < NDOC; i++) {
		uint64_t d = i * 7919 % NDOC;
		cr_assert_eq(corpus_split_of(42, d, 0.2, 0.1), fwd[d], "doc %llu scrambled",
			     (unsigned long long)d);
	}
	cr_assert(memcmp(fwd, rev, NDOC) == 0, "reverse order differs");
	for (uint64_t d = 0; d < NDOC; d++) {
		other[d] = (unsigned char)corpus_split_of(43, d, 0.2, 0.1);
		differ += other[d] != fwd[d];
	}
	cr_assert(differ > NDOC / 10, "seed 43 should reshuffle; only %d docs moved", differ);
	/* the definition: u = rng_uniform(seed, RNG_STREAM_SPLIT, d), val below 0.2, router below
	 * 0.3, else train */
	for (uint64_t d = 0; d < 100; d++) {
		float u = rng_uniform(42, RNG_STREAM_SPLIT, d);
		int want = u < 0.2 ? CORPUS_SPLIT_VAL : u < 0.3 ? CORPUS_SPLIT_ROUTER :
				     CORPUS_SPLIT_TRAIN;
		cr_assert_eq(fwd[d], want, "doc %llu u %g", (unsigned long long)d, u);
	}
}

Test(corpus, split_check)
{
	cr_assert_eq(corpus_split_check(0.02, 0.005), 0);
	cr_assert_eq(corpus_split_check(0, 0), 0);
	cr_assert_eq(corpus_split_check(0.5, 0.5), 0);
	cr_assert_eq(corpus_split_check(-0.1, 0), CORE_EUSAGE);
	cr_assert_eq(corpus_split_check(0, 1.5), CORE_EUSAGE);
	cr_assert_eq(corpus_split_check(0.7, 0.4), CORE_EUSAGE);
	cr_assert_eq(corpus_split_check(NAN, 0), CORE_EUSAGE);
}

/* ---- prepare ------------------------------------------------------------------------------ */

Test(corpus, prepare_end_to_end)
{
	static const char *const texts[] = { "alpha", "", "gamma\xc3\xa9", "d", "epsilon zeta",
					     "eta", "theta", "iota" };
	enum { N = 8 };
	char buf[2048], out[320], p[384];
	size_t k = 0;

	for (int i = 0; i < N; i++)
		k += (size_t)snprintf(buf + k, sizeof buf - k, "{\"text\":\"%s\",\"i\":%d}\n",
				      texts[i], i);
	const char *in = put("in.jsonl", buf, k);
	snprintf(out, sizeof out, "%s/out", dir);
	struct corpus_prepare_opts o = { .input = in, .outdir = out, .tokenizer = "byte",
					 .seed = 5, .val_frac = 0.3, .router_frac = 0.3 };
	struct corpus_prepare_result res;
	cr_assert_eq(corpus_prepare(&o, &res), 0, "%s", err_detail());
	cr_assert_eq(res.vocab, 256);

	uint64_t seen = 0;
	for (int s = 0; s < CORPUS_NSPLITS; s++) {
		struct tokfile tf;
		uint64_t doc = 0, toks = 0;
		cr_assert_eq(corpus_split_path(p, sizeof p, out, (enum corpus_split)s), 0);
		cr_assert_eq(tokfile_open(&tf, p), 0, "%s: %s", p, err_detail());
		/* the documents of this split, in input order, byte for byte */
		for (int i = 0; i < N; i++) {
			if ((int)corpus_split_of(5, (uint64_t)i, 0.3, 0.3) != s)
				continue;
			size_t len = strlen(texts[i]), ml;
			cr_assert(doc < tf.ndocs, "split %d lacks doc %d", s, i);
			cr_assert_eq(tf.offsets[doc + 1] - tf.offsets[doc], len, "doc %d", i);
			for (size_t j = 0; j < len; j++)
				cr_assert_eq(tokfile_token(&tf, tf.offsets[doc] + j),
					     (unsigned char)texts[i][j], "doc %d byte %zu", i, j);
			char meta[32];
			snprintf(meta, sizeof meta, "{\"i\":%d}", i);
			const char *m = tokfile_doc_meta(&tf, doc, &ml);
			cr_assert(ml == strlen(meta) && !memcmp(m, meta, ml), "doc %d meta", i);
			doc++;
			toks += len;
		}
		cr_assert_eq(doc, tf.ndocs, "split %d has extra docs", s);
		cr_assert_eq(res.split[s].docs, doc);
		cr_assert_eq(res.split[s].tokens, toks);
		seen += doc;
		tokfile_close(&tf);
	}
	cr_assert_eq(seen, N);
}

Test(corpus, prepare_failure_leaves_nothing)
{
	char out[320];
	const char *in = PUTS("bad.jsonl", "{\"text\":\"a\"}\n{\"text\":\"b\"}\n{oops}\n");

	snprintf(out, sizeof out, "%s/out", dir);
	struct corpus_prepare_opts o = { .input = in, .outdir = out, .tokenizer = "byte",
					 .val_frac = 0.02, .router_frac = 0.005 };
	struct corpus_prepare_result res;
	cr_assert_eq(corpus_prepare(&o, &res), CORE_EFORMAT);
	cr_assert(strstr(err_detail(), "line 3"), "%s", err_detail());
	struct stat st;
	cr_assert_neq(stat(out, &st), 0, "output directory left behind");

	/* an existing directory with old outputs keeps them untouched */
	mkdir(out, 0777);
	const char *old = PUTS("out/train.tok", "old");
	cr_assert_eq(corpus_prepare(&o, &res), CORE_EFORMAT);
	DIR *d = opendir(out);
	struct dirent *e;
	int n = 0;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	cr_assert_eq(n, 1, "%d entries in the output directory", n);
	cr_assert_eq(stat(old, &st), 0);
	cr_assert_eq(st.st_size, 3);
}

Test(corpus, prepare_write_failure_keeps_every_old_output)
{
	/* A token file's tail (offsets, metadata, header) is written after the whole input.
	 * Here val's tail cannot be written (its documents carry 6 KB of metadata each, over a
	 * 16 KiB file-size limit) while train's can: train must not be replaced either, nor
	 * router, and no temporary file may be left. */
	enum { N = 40, SEED = 9 };
	const double vf = 0.25, rf = 0.1;
	char out[320], p[384], *buf = malloc(1 << 17);
	size_t k = 0;
	int nval = 0, nrouter = 0;

	/* Old outputs, from a first corpus of small documents (as many as the new one, so that
	 * no split it asks for is empty: that would be refused before anything is written). */
	snprintf(out, sizeof out, "%s/out", dir);
	for (int i = 0; i < N; i++)
		k += (size_t)snprintf(buf + k, (1 << 17) - k, "{\"text\":\"old %d\"}\n", i);
	const char *in0 = put("old.jsonl", buf, k);
	k = 0;
	struct corpus_prepare_opts o = { .input = in0, .outdir = out, .tokenizer = "byte",
					 .seed = SEED, .val_frac = vf, .router_frac = rf };
	struct corpus_prepare_result res;
	cr_assert_eq(corpus_prepare(&o, &res), 0, "%s", err_detail());
	char *old[CORPUS_NSPLITS];
	size_t oldn[CORPUS_NSPLITS];
	for (int s = 0; s < CORPUS_NSPLITS; s++) {
		cr_assert_eq(corpus_split_path(p, sizeof p, out, (enum corpus_split)s), 0);
		old[s] = tu_slurp(p, &oldn[s]);
	}

	/* The new corpus: small train documents, val documents with big metadata. */
	for (int i = 0; i < N; i++) {
		int v = corpus_split_of(SEED, (uint64_t)i, vf, rf) == CORPUS_SPLIT_VAL;
		k += (size_t)snprintf(buf + k, (1 << 17) - k, "{\"text\":\"doc %d\",\"m\":\"", i);
		for (int j = 0; v && j < 6000; j++)
			buf[k++] = 'x';
		k += (size_t)snprintf(buf + k, (1 << 17) - k, "\"}\n");
		nval += v;
		nrouter += corpus_split_of(SEED, (uint64_t)i, vf, rf) == CORPUS_SPLIT_ROUTER;
	}
	cr_assert(nval >= 3, "only %d val documents: the limit would not be reached", nval);
	cr_assert(nrouter >= 1, "no router document: prepare would refuse before writing");
	o.input = put("new.jsonl", buf, k);

	signal(SIGXFSZ, SIG_IGN); /* a write past the limit fails with EFBIG instead */
	struct rlimit rl = { 16384, 16384 };
	cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
	int rc = corpus_prepare(&o, &res);
	cr_assert_lt(rc, 0, "prepare did not fail");
	cr_assert(err_file() && strstr(err_file(), "val.tok"), "the error names %s: %s",
		  err_file() ? err_file() : "no file", err_detail());

	for (int s = 0; s < CORPUS_NSPLITS; s++) {
		size_t n;
		cr_assert_eq(corpus_split_path(p, sizeof p, out, (enum corpus_split)s), 0);
		char *now = tu_slurp(p, &n);
		cr_assert(n == oldn[s] && !memcmp(now, old[s], n), "%s was replaced", p);
		free(now);
		free(old[s]);
	}
	DIR *d = opendir(out);
	struct dirent *e;
	int entries = 0;
	while ((e = readdir(d)))
		entries += e->d_name[0] != '.';
	closedir(d);
	cr_assert_eq(entries, CORPUS_NSPLITS, "%d entries in the output directory", entries);
	free(buf);
}

/* ---- edges: empty inputs, FIFOs ----------------------------------------------------------- */

/* An input without a single document is an error naming it, and makes no dataset. */
Test(corpus, prepare_of_nothing_is_an_error)
{
	char empty[320], out[320];
	const char *inputs[5];
	struct corpus_prepare_result res;
	struct stat st;

	snprintf(empty, sizeof empty, "%s/emptydir", dir);
	cr_assert_eq(mkdir(empty, 0777), 0);
	inputs[0] = empty;
	inputs[1] = "/dev/null";
	inputs[2] = PUTS("empty.jsonl", "");
	inputs[3] = PUTS("blank.jsonl", "\n  \r\n\t\n");
	char sub[320];
	snprintf(sub, sizeof sub, "%s/emptydir/nested", dir); /* only a subdirectory inside */
	inputs[4] = empty;
	snprintf(out, sizeof out, "%s/out", dir);
	for (int i = 0; i < 5; i++) {
		if (i == 4)
			cr_assert_eq(mkdir(sub, 0777), 0);
		struct corpus_prepare_opts o = { .input = inputs[i], .outdir = out,
						 .tokenizer = "byte" };
		cr_assert_eq(corpus_prepare(&o, &res), CORE_EFORMAT, "'%s': %s", inputs[i],
			     err_detail());
		cr_assert_str_eq(err_file(), inputs[i]);
		cr_assert_str_eq(err_detail(), "holds no documents");
		cr_assert_neq(stat(out, &st), 0, "'%s': output directory made", inputs[i]);
	}
}

/* JSON Lines from a FIFO are read as a stream. */
Test(corpus, jsonl_from_a_fifo)
{
	char fifo[320];
	struct corpus_reader *r;
	struct corpus_doc d;

	snprintf(fifo, sizeof fifo, "%s/in.fifo", dir);
	cr_assert_eq(mkfifo(fifo, 0600), 0);
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		alarm(20); /* never outlive a failed test */
		FILE *f = fopen(fifo, "w");
		for (int i = 0; f && i < 3000; i++)
			fprintf(f, "{\"text\":\"document %d\",\"i\":%d}\n", i, i);
		_exit(f && fclose(f) == 0 ? 0 : 1);
	}
	cr_assert_eq(corpus_open(&r, fifo), 0, "%s", err_detail());
	int n = 0, rc;
	while ((rc = corpus_next(r, &d)) == 1)
		n++;
	cr_assert_eq(rc, 0, "%s", err_detail());
	cr_assert_eq(n, 3000);
	cr_assert(d.len > 0);
	corpus_close(r);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* In a directory of documents a FIFO is passed over, never opened (it has no writer). */
Test(corpus, directory_passes_over_a_fifo)
{
	char sub[320], p[384];
	struct corpus_reader *r;
	struct corpus_doc d;

	snprintf(sub, sizeof sub, "%s/docs", dir);
	cr_assert_eq(mkdir(sub, 0777), 0);
	PUTS("docs/a.txt", "one");
	snprintf(p, sizeof p, "%s/b.fifo", sub);
	cr_assert_eq(mkfifo(p, 0600), 0);
	PUTS("docs/c.txt", "two");
	cr_assert_eq(corpus_open(&r, sub), 0, "%s", err_detail());
	cr_assert_eq(corpus_next(r, &d), 1, "%s", err_detail());
	cr_assert_str_eq(d.meta, "{\"file\":\"a.txt\"}");
	cr_assert_eq(corpus_next(r, &d), 1, "%s", err_detail());
	cr_assert_str_eq(d.meta, "{\"file\":\"c.txt\"}");
	cr_assert_eq(corpus_next(r, &d), 0);
	corpus_close(r);
}

/* ---- plain text: .txt files, and plain text given as JSON Lines ---------------------------- */

Test(corpus, txt_file_is_one_document)
{
	char sub[320], p[384];
	struct corpus_reader *r;
	struct corpus_doc d;
	uint64_t done, total;
	static const char text[] = "first line\n{\"text\":\"not json here\"}\n\0after a NUL\n";

	snprintf(sub, sizeof sub, "%s/sub", dir);
	cr_assert_eq(mkdir(sub, 0777), 0);
	snprintf(p, sizeof p, "%s/story.txt", sub);
	put("sub/story.txt", text, sizeof text - 1);
	cr_assert_eq(corpus_open(&r, p), 0, "%s", err_detail());
	corpus_progress(r, &done, &total);
	cr_assert_eq(done, 0);
	cr_assert_eq(total, sizeof text - 1);
	cr_assert_eq(corpus_next(r, &d), 1, "%s", err_detail());
	cr_assert_eq(d.index, 0);
	cr_assert_eq(d.len, sizeof text - 1, "len %zu", d.len);
	cr_assert(memcmp(d.text, text, d.len) == 0, "bytes verbatim, NUL included");
	cr_assert_str_eq(d.meta, "{\"file\":\"story.txt\"}", "the name without directories");
	cr_assert_eq(d.meta_len, strlen(d.meta));
	corpus_progress(r, &done, &total);
	cr_assert_eq(done, total);
	cr_assert_eq(corpus_next(r, &d), 0, "a .txt file is one document");
	cr_assert_eq(corpus_next(r, &d), 0);
	corpus_close(r);

	/* a FIFO named *.txt is read as JSON Lines, as a stream (here: one line) */
	char fifo[320];
	snprintf(fifo, sizeof fifo, "%s/pipe.txt", dir);
	cr_assert_eq(mkfifo(fifo, 0600), 0);
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		alarm(20);
		FILE *f = fopen(fifo, "w");
		_exit(f && fputs("{\"text\":\"x\",\"k\":1}\n", f) >= 0 && fclose(f) == 0 ? 0 : 1);
	}
	cr_assert_eq(corpus_open(&r, fifo), 0, "%s", err_detail());
	cr_assert_eq(corpus_next(r, &d), 1, "%s", err_detail());
	cr_assert_str_eq(d.meta, "{\"k\":1}");
	cr_assert_eq(corpus_next(r, &d), 0);
	corpus_close(r);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
}

Test(corpus, plain_text_as_jsonl_says_so)
{
	static const char *const plain[] = {
		"The quick brown fox.\n{\"text\":\"a\"}\n",
		"\n  \r\n\tplain after blank lines\n",
		"[\"text\", \"an array\"]\n",
		"\xef\xbb\xbf{\"text\":\"a byte order mark\"}\n",
	};
	static const char want[] = "not JSON Lines (one {\"text\": ...} object per line); for "
				   "plain text name the file *.txt or pass a directory of text "
				   "files";
	for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++) {
		const char *p = put("plain.md", plain[i], strlen(plain[i]));
		struct corpus_reader *r;
		struct corpus_doc d;
		cr_assert_eq(corpus_open(&r, p), 0);
		cr_assert_eq(corpus_next(r, &d), CORE_EFORMAT, "case %zu", i);
		cr_assert_str_eq(err_detail(), want, "case %zu", i);
		cr_assert_str_eq(err_file(), p);
		corpus_close(r);
	}
	/* JSON Lines after blank lines, or indented, are still JSON Lines; a later line that
	 * is not an object keeps its own message with its line number */
	const char *p = PUTS("ok.jsonl", "\n \t{\"text\":\"a\"}\nplain\n");
	struct corpus_reader *r;
	struct corpus_doc d;
	cr_assert_eq(corpus_open(&r, p), 0);
	cr_assert_eq(corpus_next(r, &d), 1, "%s", err_detail());
	cr_assert_eq(corpus_next(r, &d), CORE_EFORMAT);
	cr_assert(strstr(err_detail(), "line 3, column"), "%s", err_detail());
	corpus_close(r);
}

/* ---- chunks ------------------------------------------------------------------------------- */

/* The rule, written another way: cut N tokens while at least N are left; what is left (r)
 * becomes a piece of its own when 2r >= N or nothing was cut, else joins the last piece. */
static uint64_t ref_pieces(uint64_t n, uint64_t N, uint64_t *len)
{
	uint64_t k = 0, left = n;

	while (left >= N) {
		len[k++] = N;
		left -= N;
	}
	if (k == 0 || (left > 0 && 2 * left >= N))
		len[k++] = left;
	else
		len[k - 1] += left;
	return k;
}

Test(corpus, chunk_pieces_rule)
{
	uint64_t len[64];

	for (uint64_t N = 2; N <= 11; N++) {
		for (uint64_t n = 0; n <= 5 * N + 3; n++) {
			uint64_t k = ref_pieces(n, N, len);
			cr_assert_eq(corpus_chunk_pieces(n, N), k, "n %llu N %llu: %llu pieces, "
				     "expected %llu", (unsigned long long)n, (unsigned long long)N,
				     (unsigned long long)corpus_chunk_pieces(n, N),
				     (unsigned long long)k);
			/* the bounds the documentation promises */
			for (uint64_t i = 0; i < k && n >= N; i++) {
				cr_assert(2 * len[i] >= N && 2 * len[i] < 3 * N,
					  "n %llu N %llu: piece %llu of %llu tokens",
					  (unsigned long long)n, (unsigned long long)N,
					  (unsigned long long)i, (unsigned long long)len[i]);
				cr_assert(i + 1 == k || len[i] == N);
			}
		}
	}
	cr_assert_eq(corpus_chunk_pieces(0, 4), 1, "an empty document stays one piece");
	cr_assert_eq(corpus_chunk_pieces(3, 4), 1, "shorter than a chunk: one piece");
	cr_assert_eq(corpus_chunk_pieces(1, 4), 1);
	cr_assert_eq(corpus_chunk_pieces(9, 4), 2, "4 + 5: a remainder of 1 joins");
	cr_assert_eq(corpus_chunk_pieces(10, 4), 3, "4 + 4 + 2: a remainder of N/2 stays");
	cr_assert_eq(corpus_chunk_pieces(7, 5), 1, "5 + 2: 2 < 2.5 joins");
	cr_assert_eq(corpus_chunk_pieces(8, 5), 2, "5 + 3: 3 >= 2.5 stays");
	cr_assert_eq(corpus_chunk_pieces(1000, 0), 1, "0: no cutting");
	/* no overflow near the top of the range */
	cr_assert_eq(corpus_chunk_pieces(UINT64_MAX, (UINT64_MAX >> 1) + 1), 2);
	cr_assert_eq(corpus_chunk_pieces(UINT64_MAX, UINT64_MAX), 1);
	cr_assert_eq(corpus_chunk_pieces(UINT64_MAX, 2), UINT64_MAX / 2 + 1, "a last 1 = N/2");
}

Test(corpus, chunk_meta)
{
	char *m;
	size_t n;
	static const char src[] = "{\"id\":\"ca01\",\"genre\":\"a\",\"n\":[1,{\"k\":null}],"
				  "\"z\":\"a\\u0000b\"}";

	cr_assert_eq(corpus_chunk_meta("f", src, sizeof src - 1, 7, 12, &m, &n), 0, "%s",
		     err_detail());
	cr_assert_str_eq(m, "{\"id\":\"ca01\",\"genre\":\"a\",\"n\":[1,{\"k\":null}],"
			    "\"z\":\"a\\u0000b\",\"doc\":7,\"chunk\":12}");
	cr_assert_eq(n, strlen(m));
	free(m);
	cr_assert_eq(corpus_chunk_meta("f", "{}", 2, 0, 0, &m, &n), 0, "%s", err_detail());
	cr_assert_str_eq(m, "{\"doc\":0,\"chunk\":0}");
	free(m);
	cr_assert_eq(corpus_chunk_meta("f", "{\"file\":\"a b.txt\"}", 18, 3, 1, &m, &n), 0);
	cr_assert_str_eq(m, "{\"file\":\"a b.txt\",\"doc\":3,\"chunk\":1}");
	free(m);

	/* a field of the source that the pieces' metadata would overwrite is refused */
	static const char *const clash[] = { "{\"doc\":\"x\"}", "{\"id\":1,\"chunk\":2}" };
	static const char *const field[] = { "\"doc\"", "\"chunk\"" };
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(corpus_chunk_meta("in.jsonl", clash[i], strlen(clash[i]), 5, 0, &m,
					       &n), CORE_EFORMAT, "%s", clash[i]);
		cr_assert_null(m);
		cr_assert_str_eq(err_file(), "in.jsonl");
		cr_assert(strstr(err_detail(), "document 5") && strstr(err_detail(), field[i]),
			  "%s", err_detail());
	}
	cr_assert_eq(corpus_chunk_meta(NULL, "[1]", 3, 0, 0, &m, &n), CORE_EFORMAT);
	cr_assert_eq(corpus_chunk_meta(NULL, "{", 1, 0, 0, &m, &n), CORE_EFORMAT);
	cr_assert_null(m);
}

/* One split's token file, read back. */
struct split_file {
	struct tokfile tf;
	uint64_t next; /* next document to look at */
};

static void open_split(struct split_file *f, const char *outdir, int s)
{
	char p[384];
	cr_assert_eq(corpus_split_path(p, sizeof p, outdir, (enum corpus_split)s), 0);
	cr_assert_eq(tokfile_open(&f->tf, p), 0, "%s: %s", p, err_detail());
	f->next = 0;
}

/* Chunked output against the unchunked output of the same input and seed: per split, the
 * documents of the unchunked file, each in its pieces, in the same order; the pieces of a
 * document concatenated are its tokens, their lengths follow the rule (against ref_pieces),
 * their metadata is the document's with doc and chunk, and no document is in two splits. */
Test(corpus, prepare_chunked_against_unchunked)
{
	enum { N = 60, SEED = 11, CHUNK = 8 };
	const double vf = 0.2, rf = 0.2;
	char *buf = malloc(1 << 16), whole[320], cut[320];
	size_t k = 0;
	uint64_t len[64];

	/* lengths around the multiples of CHUNK and its half, with an empty document */
	for (int i = 0; i < N; i++) {
		int n = i == 3 ? 0 : (i * 7) % 45;
		k += (size_t)snprintf(buf + k, (1 << 16) - k, "{\"text\":\"");
		for (int j = 0; j < n; j++)
			buf[k++] = (char)('a' + (i + j * 3) % 26);
		k += (size_t)snprintf(buf + k, (1 << 16) - k, "\",\"i\":%d}\n", i);
	}
	const char *in = put("in.jsonl", buf, k);
	snprintf(whole, sizeof whole, "%s/whole", dir);
	snprintf(cut, sizeof cut, "%s/cut", dir);
	struct corpus_prepare_opts o = { .input = in, .outdir = whole, .tokenizer = "byte",
					 .seed = SEED, .val_frac = vf, .router_frac = rf };
	struct corpus_prepare_result r0, r1;
	cr_assert_eq(corpus_prepare(&o, &r0), 0, "%s", err_detail());
	o.outdir = cut;
	o.chunk = CHUNK;
	cr_assert_eq(corpus_prepare(&o, &r1), 0, "%s", err_detail());

	int split_of[N];
	for (int i = 0; i < N; i++)
		split_of[i] = -1;
	uint64_t pieces_total = 0, cut_docs = 0;
	for (int s = 0; s < CORPUS_NSPLITS; s++) {
		struct split_file a, b;
		open_split(&a, whole, s);
		open_split(&b, cut, s);
		cr_assert_gt(a.tf.ndocs, 0, "split %d empty: the test needs all three", s);
		cr_assert_eq(b.tf.ntokens, a.tf.ntokens, "split %d: tokens differ", s);
		cr_assert_eq(r1.split[s].sources, a.tf.ndocs);
		cr_assert_eq(r0.split[s].sources, a.tf.ndocs);
		cr_assert_eq(r0.split[s].docs, a.tf.ndocs);
		cr_assert_eq(r1.split[s].docs, b.tf.ndocs);
		cr_assert_eq(r1.split[s].tokens, r0.split[s].tokens);
		for (a.next = 0; a.next < a.tf.ndocs; a.next++) {
			uint64_t d0 = a.tf.offsets[a.next], n = a.tf.offsets[a.next + 1] - d0;
			size_t ml;
			const char *m = tokfile_doc_meta(&a.tf, a.next, &ml);
			int i;
			cr_assert_eq(sscanf(m, "{\"i\":%d}", &i), 1);
			cr_assert(i >= 0 && i < N && split_of[i] == -1, "doc %d seen twice", i);
			split_of[i] = s;
			cr_assert_eq((int)corpus_split_of(SEED, (uint64_t)i, vf, rf), s);
			uint64_t np = ref_pieces(n, CHUNK, len), at = d0;
			for (uint64_t p = 0; p < np; p++, b.next++) {
				char want[64];
				cr_assert_lt(b.next, b.tf.ndocs, "split %d: doc %d lacks "
					     "piece %llu", s, i, (unsigned long long)p);
				uint64_t e0 = b.tf.offsets[b.next];
				uint64_t pn = b.tf.offsets[b.next + 1] - e0;
				cr_assert_eq(pn, len[p], "doc %d (%llu tokens) piece %llu: %llu "
					     "tokens, expected %llu", i, (unsigned long long)n,
					     (unsigned long long)p, (unsigned long long)pn,
					     (unsigned long long)len[p]);
				for (uint64_t t = 0; t < pn; t++)
					cr_assert_eq(tokfile_token(&b.tf, e0 + t),
						     tokfile_token(&a.tf, at + t),
						     "doc %d piece %llu token %llu", i,
						     (unsigned long long)p, (unsigned long long)t);
				at += pn;
				snprintf(want, sizeof want,
					 "{\"i\":%d,\"doc\":%d,\"chunk\":%llu}", i, i,
					 (unsigned long long)p);
				m = tokfile_doc_meta(&b.tf, b.next, &ml);
				cr_assert(ml == strlen(want) && !memcmp(m, want, ml),
					  "doc %d piece %llu: meta %.*s, expected %s", i,
					  (unsigned long long)p, (int)ml, m, want);
			}
			cr_assert_eq(at, d0 + n, "doc %d: pieces do not cover it", i);
			pieces_total += np;
		}
		cr_assert_eq(b.next, b.tf.ndocs, "split %d: extra pieces", s);
		cut_docs += b.tf.ndocs;
		tokfile_close(&a.tf);
		tokfile_close(&b.tf);
	}
	for (int i = 0; i < N; i++)
		cr_assert_neq(split_of[i], -1, "doc %d in no split", i);
	cr_assert_eq(cut_docs, pieces_total);
	cr_assert_gt(pieces_total, 2 * N, "the test should cut documents: %llu pieces",
		     (unsigned long long)pieces_total);
	free(buf);
}

static int entries_in(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *e;
	int n = 0;

	cr_assert(d, "%s", path);
	while ((e = readdir(d)))
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return n;
}

/* A split asked for that gets no document: an error naming the input, the split and the
 * document count, and nothing written, old outputs kept; with a fraction of 0, no error. */
#define ONE_TEXT "a single document, long enough to be cut into a few pieces"

Test(corpus, prepare_empty_split_refused)
{
	char out[320], p[384];
	struct corpus_prepare_result res;
	struct stat st;
	const char *in = PUTS("one.jsonl", "{\"text\":\"" ONE_TEXT "\",\"id\":1}\n");
	const uint64_t ntok = sizeof ONE_TEXT - 1;

	snprintf(out, sizeof out, "%s/out", dir);
	struct corpus_prepare_opts o = { .input = in, .outdir = out, .tokenizer = "byte",
					 .val_frac = CORPUS_VAL_FRAC,
					 .router_frac = CORPUS_ROUTER_FRAC };
	/* both empty (one document can fill one split at most), with and without chunking */
	for (int c = 0; c < 2; c++) {
		o.chunk = c ? 4 : 0;
		cr_assert_eq(corpus_prepare(&o, &res), CORE_EFORMAT, "chunk %d", c);
		cr_assert_str_eq(err_file(), in);
		cr_assert(strstr(err_detail(), "val and router splits are empty: the input has 1 "
				 "document and none went to them"), "%s", err_detail());
		cr_assert_neq(stat(out, &st), 0, "output directory made");
	}
	/* one of the two: find seeds whose draw for document 0 puts it in train and in val */
	uint64_t to_train = 0, to_val = 0;
	while (corpus_split_of(to_train, 0, 0.5, 0) != CORPUS_SPLIT_TRAIN)
		to_train++;
	while (corpus_split_of(to_val, 0, 0.5, 0) != CORPUS_SPLIT_VAL)
		to_val++;
	o.chunk = 4;
	o.val_frac = 0.5;
	o.router_frac = 0;
	o.seed = to_train;
	cr_assert_eq(corpus_prepare(&o, &res), CORE_EFORMAT);
	cr_assert(strstr(err_detail(), "val split is empty: the input has 1 document and none "
			 "went to it (--val-frac 0.5)"), "%s", err_detail());
	o.val_frac = 0;
	o.router_frac = 0.5;
	cr_assert_eq(corpus_prepare(&o, &res), CORE_EFORMAT);
	cr_assert(strstr(err_detail(), "router split is empty"), "%s", err_detail());

	/* old outputs stay, byte for byte, and nothing is added beside them */
	cr_assert_eq(mkdir(out, 0777), 0);
	for (int s = 0; s < CORPUS_NSPLITS; s++) {
		char name[32];
		snprintf(name, sizeof name, "out/%s.tok", corpus_split_name((enum corpus_split)s));
		put(name, "old", 3);
	}
	o.val_frac = 0.5;
	o.router_frac = 0;
	cr_assert_eq(corpus_prepare(&o, &res), CORE_EFORMAT);
	cr_assert_eq(entries_in(out), CORPUS_NSPLITS, "files added to the output directory");
	for (int s = 0; s < CORPUS_NSPLITS; s++) {
		cr_assert_eq(corpus_split_path(p, sizeof p, out, (enum corpus_split)s), 0);
		cr_assert_eq(stat(p, &st), 0);
		cr_assert_eq(st.st_size, 3, "%s replaced", p);
	}

	/* the seed that sends the document to val: no split is empty */
	o.seed = to_val;
	cr_assert_eq(corpus_prepare(&o, &res), 0, "%s", err_detail());
	cr_assert_eq(res.split[CORPUS_SPLIT_VAL].sources, 1);
	cr_assert_eq(res.split[CORPUS_SPLIT_VAL].docs, (ntok + 2) / 4, "%llu tokens",
		     (unsigned long long)ntok);
	cr_assert_eq(res.split[CORPUS_SPLIT_TRAIN].docs, 0, "train may be empty");
	/* fractions of 0 ask for empty splits: no error */
	o.val_frac = 0;
	o.seed = to_train;
	cr_assert_eq(corpus_prepare(&o, &res), 0, "%s", err_detail());
	cr_assert_eq(res.split[CORPUS_SPLIT_TRAIN].sources, 1);
	cr_assert_eq(res.split[CORPUS_SPLIT_TRAIN].docs, (ntok + 2) / 4);
	cr_assert_eq(res.split[CORPUS_SPLIT_VAL].docs + res.split[CORPUS_SPLIT_ROUTER].docs, 0);

	/* pieces of 1 token are refused before anything is read */
	o.chunk = 1;
	cr_assert_eq(corpus_prepare(&o, &res), CORE_EUSAGE);
}

/* With chunking, a source field named like one that the pieces get is refused. */
Test(corpus, prepare_chunk_field_clash)
{
	char out[320];
	struct corpus_prepare_result res;
	struct stat st;
	const char *in = PUTS("clash.jsonl",
			      "{\"text\":\"abcdef\"}\n{\"text\":\"ghij\",\"doc\":9}\n");

	snprintf(out, sizeof out, "%s/out", dir);
	struct corpus_prepare_opts o = { .input = in, .outdir = out, .tokenizer = "byte",
					 .chunk = 2 };
	cr_assert_eq(corpus_prepare(&o, &res), CORE_EFORMAT);
	cr_assert_str_eq(err_file(), in);
	cr_assert(strstr(err_detail(), "document 1 (counted from 0): has a \"doc\" field"), "%s",
		  err_detail());
	cr_assert_neq(stat(out, &st), 0, "output directory made");
	o.chunk = 0; /* whole documents keep their metadata as it is */
	cr_assert_eq(corpus_prepare(&o, &res), 0, "%s", err_detail());
}
