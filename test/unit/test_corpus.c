/* test_corpus.c - JSONL and directory readers (escapes, UTF-8, metadata, bad lines, FIFOs), the
 * byte tokenizer, the deterministic split, and corpus_prepare end to end, empty input refused. */
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
#include "common/banned.h"

static char dir[64];

static void rm_tree(const char *p)
{
	DIR *d = opendir(p);
	struct dirent *e;
	char q[512];
	struct stat st;

	while (d && (e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(q, sizeof q, "%s/%s", p, e->d_name);
		if (lstat(q, &st) == 0 && S_ISDIR(st.st_mode))
			rm_tree(q);
		else
			unlink(q);
	}
	if (d)
		closedir(d);
	rmdir(p);
}

static void setup(void)
{
	snprintf(dir, sizeof dir, "/tmp/test_corpus.XXXXXX");
	cr_assert(mkdtemp(dir) != NULL);
}

static void teardown(void)
{
	rm_tree(dir);
}

TestSuite(corpus, .init = setup, .fini = teardown, .timeout = 10);

static const char *put(const char *name, const char *content, size_t n)
{
	static char p[8][256];
	static int k;
	char *q = p[k++ % 8];
	snprintf(q, 256, "%s/%s", dir, name);
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
	char p[128];

	snprintf(p, sizeof p, "%s/none.jsonl", dir);
	cr_assert_eq(corpus_open(&r, p), CORE_EIO);
	cr_assert_null(r);
}

/* ---- directory ---------------------------------------------------------------------------- */

Test(corpus, directory_sorted_by_name_with_metadata)
{
	char sub[128], p[160];
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

/* ---- tokenizer ---------------------------------------------------------------------------- */

Test(corpus, byte_tokenizer)
{
	struct corpus_tokenizer tk;
	struct corpus_tokens t = { 0 };
	static const char s[] = "A\xc3\xa9\0\xff";

	cr_assert_eq(corpus_tokenizer_open(&tk, "byte"), 0);
	cr_assert_eq(tk.vocab, 256);
	cr_assert_eq(tk.encode(&tk, s, 5, &t), 0);
	cr_assert_eq(tk.encode(&tk, "z", 1, &t), 0);
	static const uint32_t want[] = { 65, 195, 169, 0, 255, 122 };
	cr_assert_eq(t.n, 6);
	for (int i = 0; i < 6; i++)
		cr_assert_eq(t.tok[i], want[i], "token %d: %u", i, t.tok[i]);
	corpus_tokens_free(&t);
	corpus_tokenizer_close(&tk);
	cr_assert_eq(corpus_tokenizer_open(&tk, "bpe"), CORE_EUSAGE);
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
	char buf[2048], out[160], p[200];
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
	char out[160];
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

static char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	cr_assert(f, "%s", path);
	char *b = malloc(1 << 16);
	*n = fread(b, 1, 1 << 16, f);
	cr_assert(feof(f), "%s is larger than expected", path);
	fclose(f);
	return b;
}

Test(corpus, prepare_write_failure_keeps_every_old_output)
{
	/* A token file's tail (offsets, metadata, header) is written after the whole input.
	 * Here val's tail cannot be written (its documents carry 6 KB of metadata each, over a
	 * 16 KiB file-size limit) while train's can: train must not be replaced either, nor
	 * router, and no temporary file may be left. */
	enum { N = 40, SEED = 9 };
	const double vf = 0.25, rf = 0.1;
	char out[160], p[200], *buf = malloc(1 << 17);
	size_t k = 0;
	int nval = 0;

	/* Old outputs, from a small first corpus. */
	snprintf(out, sizeof out, "%s/out", dir);
	const char *in0 = PUTS("old.jsonl", "{\"text\":\"one\"}\n{\"text\":\"two\"}\n"
				     "{\"text\":\"three\"}\n{\"text\":\"four\"}\n");
	struct corpus_prepare_opts o = { .input = in0, .outdir = out, .tokenizer = "byte",
					 .seed = SEED, .val_frac = vf, .router_frac = rf };
	struct corpus_prepare_result res;
	cr_assert_eq(corpus_prepare(&o, &res), 0, "%s", err_detail());
	char *old[CORPUS_NSPLITS];
	size_t oldn[CORPUS_NSPLITS];
	for (int s = 0; s < CORPUS_NSPLITS; s++) {
		cr_assert_eq(corpus_split_path(p, sizeof p, out, (enum corpus_split)s), 0);
		old[s] = slurp(p, &oldn[s]);
	}

	/* The new corpus: small train documents, val documents with big metadata. */
	for (int i = 0; i < N; i++) {
		int v = corpus_split_of(SEED, (uint64_t)i, vf, rf) == CORPUS_SPLIT_VAL;
		k += (size_t)snprintf(buf + k, (1 << 17) - k, "{\"text\":\"doc %d\",\"m\":\"", i);
		for (int j = 0; v && j < 6000; j++)
			buf[k++] = 'x';
		k += (size_t)snprintf(buf + k, (1 << 17) - k, "\"}\n");
		nval += v;
	}
	cr_assert(nval >= 3, "only %d val documents: the limit would not be reached", nval);
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
		char *now = slurp(p, &n);
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
	char empty[128], out[160];
	const char *inputs[5];
	struct corpus_prepare_result res;
	struct stat st;

	snprintf(empty, sizeof empty, "%s/emptydir", dir);
	cr_assert_eq(mkdir(empty, 0777), 0);
	inputs[0] = empty;
	inputs[1] = "/dev/null";
	inputs[2] = PUTS("empty.jsonl", "");
	inputs[3] = PUTS("blank.jsonl", "\n  \r\n\t\n");
	char sub[160];
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
	char fifo[128];
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
	char sub[128], p[160];
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
