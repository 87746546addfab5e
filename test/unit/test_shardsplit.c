/* test_shardsplit.c - `dpc-shard split` in the library: shards checked document by document
 * against the generator's draw computed here and against the arrays the input was written
 * from (not against the input as read back), the manifest parsed with jansson against counts
 * derived here, the file names, the refusals (empty or too small shards, an existing split)
 * and the all-or-nothing write under a full disk. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <jansson.h>
#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/rng.h"
#include "io/shardsplit.h"
#include "io/tokfile.h"
#include "testutil.h"
#include "common/banned.h"

static char dir[256];

static void setup(void)
{
	tu_mkdtemp(dir, sizeof dir, "shardsplit");
}

static void teardown(void)
{
	tu_rm_tree(dir);
}

TestSuite(shardsplit, .init = setup, .fini = teardown, .timeout = 20);

/* ---- the input, kept as arrays ------------------------------------------------------------ */

#define MAXDOCS 200

struct corpus {
	int ndocs;
	uint32_t vocab;
	uint32_t *tok[MAXDOCS];
	uint64_t len[MAXDOCS];
	char meta[MAXDOCS][64];
	char path[320];
};

/* Document d: length len_of(d) (all distinct), tokens a function of (d, j), metadata naming
 * d, empty for every fifth document. Written with the tokfile writer. */
static void make_corpus(struct corpus *c, const char *name, int ndocs, uint32_t vocab,
			uint64_t (*len_of)(int))
{
	struct tokfile_writer *w;

	cr_assert(ndocs <= MAXDOCS);
	memset(c, 0, sizeof *c);
	c->ndocs = ndocs;
	c->vocab = vocab;
	snprintf(c->path, sizeof c->path, "%s/%s", dir, name);
	cr_assert_eq(tokw_open(&w, c->path, vocab), 0, "%s", err_detail());
	/* as prepare records it: the byte tokenizer for 256, else none known */
	tokw_set_tokenizer(w, tokenizer_id_known((struct tokenizer_id){0}, vocab));
	for (int d = 0; d < ndocs; d++) {
		c->len[d] = len_of(d);
		c->tok[d] = malloc((c->len[d] + 1) * sizeof *c->tok[d]);
		for (uint64_t j = 0; j < c->len[d]; j++)
			c->tok[d][j] = (uint32_t)((d * 7919u + j * 104729u + j * j) % vocab);
		if (d % 5 != 4)
			snprintf(c->meta[d], sizeof c->meta[d], "{\"id\":%d,\"len\":%llu}", d,
				 (unsigned long long)c->len[d]);
		cr_assert_eq(tokw_add_doc(w, c->tok[d], c->len[d], c->meta[d], strlen(c->meta[d])),
			     0, "%s", err_detail());
	}
	cr_assert_eq(tokw_commit(w), 0, "%s", err_detail());
}

static void free_corpus(struct corpus *c)
{
	for (int d = 0; d < c->ndocs; d++)
		free(c->tok[d]);
}

static uint64_t len_plus_two(int d) { return (uint64_t)d + 2; }
static uint64_t len_one(int d) { return d == 1 ? 1 : (uint64_t)d * 3 + 5; }
/* 2000 tokens for the documents that seed 4 sends to shard 2 of 3, few for the others (and
 * not as many as len_plus_two: every shard differs from the old split's). */
static uint64_t len_big_last(int d)
{
	return rng_below(4, RNG_STREAM_SHARD, (uint64_t)d, 3) == 2 ? 2000 + (uint64_t)d
								   : (uint64_t)d + 3;
}

static void count_progress(void *ctx, uint64_t done, uint64_t total)
{
	uint64_t *last = ctx;

	cr_assert_leq(done, total);
	cr_assert_geq(done, last[0], "progress went back from %llu to %llu",
		      (unsigned long long)last[0], (unsigned long long)done);
	last[0] = done;
	last[1] = total;
}

/* Names in directory p other than "." and "..", sorted, joined by spaces. */
static void listing(const char *p, char *out, size_t n)
{
	struct dirent **e;
	int k = scandir(p, &e, NULL, alphasort);
	size_t used = 0;

	out[0] = '\0';
	cr_assert(k >= 0, "cannot list %s", p);
	for (int i = 0; i < k; i++) {
		if (strcmp(e[i]->d_name, ".") && strcmp(e[i]->d_name, ".."))
			used += (size_t)snprintf(out + used, n - used, "%s%s", used ? " " : "",
						 e[i]->d_name);
		free(e[i]);
	}
	free(e);
}

/* ---- the check of a split against the draw computed here ------------------------------- */

/* Split c into P shards with seed into outdir and check everything against an independent
 * computation: the shard of d is rng_below(seed, RNG_STREAM_SHARD, d, P). */
static void check_split(const struct corpus *c, uint32_t P, uint64_t seed, const char *outdir,
			int force)
{
	uint64_t progress[2] = { 0, 0 };
	struct shard_split_opts o = { .outdir = outdir, .paths = P, .seed = seed, .force = force,
				      .progress = count_progress, .progress_ctx = progress };
	struct shard_split_result r;
	uint64_t docs[16] = { 0 }, toks[16] = { 0 };
	int seen[MAXDOCS] = { 0 };
	struct tokfile in, tf;
	char p[512], want[2048], got[2048], crc[16];

	cr_assert(P <= 16);
	for (int d = 0; d < c->ndocs; d++) {
		uint64_t s = rng_below(seed, RNG_STREAM_SHARD, (uint64_t)d, P);
		docs[s]++;
		toks[s] += c->len[d];
	}
	for (uint32_t s = 0; s < P; s++)
		cr_assert(docs[s] > 0, "test corpus leaves shard %u of %u empty: pick another seed",
			  s, P);

	cr_assert_eq(shard_split_random(c->path, &o, &r), 0, "P=%u: %s", P, err_detail());
	cr_assert_eq(r.paths, P);
	cr_assert_eq(r.docs, (uint64_t)c->ndocs);
	cr_assert(progress[0] == (uint64_t)c->ndocs && progress[1] == (uint64_t)c->ndocs,
		  "progress ended at %llu of %llu", (unsigned long long)progress[0],
		  (unsigned long long)progress[1]);
	for (uint32_t s = 0; s < P; s++) {
		cr_assert_eq(r.shard[s].docs, docs[s], "P=%u shard %u: result docs", P, s);
		cr_assert_eq(r.shard[s].tokens, toks[s], "P=%u shard %u: result tokens", P, s);
	}
	shard_split_result_free(&r);

	/* Exactly the expected files, no temporary ones. */
	int k = 0;
	for (uint32_t s = 0; s < P; s++)
		k += snprintf(want + k, sizeof want - (size_t)k, "shard-%03u.tok ", s);
	snprintf(want + k, sizeof want - (size_t)k, "shards.json");
	listing(outdir, got, sizeof got);
	cr_assert_str_eq(got, want, "P=%u", P);

	/* Each shard: the documents of its draw, in input order, tokens and metadata intact. */
	for (uint32_t s = 0; s < P; s++) {
		snprintf(p, sizeof p, "%s/shard-%03u.tok", outdir, s);
		cr_assert_eq(tokfile_open(&tf, p), 0, "%s", err_detail());
		cr_assert_eq(tf.vocab, c->vocab);
		cr_assert_eq(tf.ndocs, docs[s], "P=%u shard %u: %llu docs", P, s,
			     (unsigned long long)tf.ndocs);
		cr_assert_eq(tf.ntokens, toks[s], "P=%u shard %u: tokens", P, s);
		uint64_t i = 0;
		for (int d = 0; d < c->ndocs; d++) {
			if (rng_below(seed, RNG_STREAM_SHARD, (uint64_t)d, P) != s)
				continue;
			seen[d]++;
			cr_assert_eq(tf.offsets[i + 1] - tf.offsets[i], c->len[d],
				     "P=%u shard %u doc %llu is not input doc %d", P, s,
				     (unsigned long long)i, d);
			for (uint64_t j = 0; j < c->len[d]; j++)
				cr_assert_eq(tokfile_token(&tf, tf.offsets[i] + j), c->tok[d][j],
					     "P=%u shard %u doc %d token %llu", P, s, d,
					     (unsigned long long)j);
			size_t ml;
			const char *m = tokfile_doc_meta(&tf, i, &ml);
			cr_assert(ml == strlen(c->meta[d]) && !memcmp(m, c->meta[d], ml),
				  "P=%u shard %u doc %d: metadata '%.*s'", P, s, d, (int)ml, m);
			i++;
		}
		tokfile_close(&tf);
	}
	/* The union of the shards is the input: every document exactly once. */
	for (int d = 0; d < c->ndocs; d++)
		cr_assert_eq(seen[d], 1, "P=%u: document %d in %d shards", P, d, seen[d]);

	/* The manifest, parsed back, against the counts above. */
	json_error_t je;
	snprintf(p, sizeof p, "%s/shards.json", outdir);
	json_t *j = json_load_file(p, 0, &je);
	cr_assert(j, "shards.json: %s", je.text);
	cr_assert(tokfile_open(&in, c->path) == 0);
	snprintf(crc, sizeof crc, "%08x", in.crc);
	tokfile_close(&in);
	cr_assert_eq(json_object_size(j), 6, "shards.json has %zu keys", json_object_size(j));
	cr_assert_str_eq(json_string_value(json_object_get(j, "source")), c->path);
	cr_assert_str_eq(json_string_value(json_object_get(j, "source_crc")), crc);
	cr_assert_str_eq(json_string_value(json_object_get(j, "method")), "random");
	cr_assert_eq(json_integer_value(json_object_get(j, "seed")), (json_int_t)seed);
	cr_assert_eq(json_integer_value(json_object_get(j, "paths")), (json_int_t)P);
	json_t *a = json_object_get(j, "shards");
	cr_assert(json_is_array(a) && json_array_size(a) == P);
	for (uint32_t s = 0; s < P; s++) {
		json_t *e = json_array_get(a, s);
		char name[32];
		snprintf(name, sizeof name, "shard-%03u.tok", s);
		cr_assert_eq(json_object_size(e), 3);
		cr_assert_str_eq(json_string_value(json_object_get(e, "file")), name);
		cr_assert_eq(json_integer_value(json_object_get(e, "docs")), (json_int_t)docs[s]);
		cr_assert_eq(json_integer_value(json_object_get(e, "tokens")), (json_int_t)toks[s]);
	}
	json_decref(j);
}

/* ---- tests -------------------------------------------------------------------------------- */

Test(shardsplit, random_1_3_7_shards_u16)
{
	struct corpus c;
	char out[320];
	const uint32_t Ps[] = { 1, 3, 7 };

	make_corpus(&c, "in.tok", 60, 300, len_plus_two);
	for (size_t i = 0; i < sizeof Ps / sizeof Ps[0]; i++) {
		snprintf(out, sizeof out, "%s/p%u", dir, Ps[i]);
		check_split(&c, Ps[i], 11, out, 0);
	}
	free_corpus(&c);
}

Test(shardsplit, random_shards_u32_tokens)
{
	struct corpus c;
	char out[320];

	make_corpus(&c, "wide.tok", 40, 70000, len_plus_two);
	snprintf(out, sizeof out, "%s/wide", dir);
	check_split(&c, 3, 5, out, 0);
	free_corpus(&c);
}

Test(shardsplit, one_shard_is_a_copy)
{
	struct corpus c;
	struct shard_split_opts o = { .paths = 1, .seed = 99 };
	struct shard_split_result r;
	char out[320], p[512];
	size_t n1, n2;

	make_corpus(&c, "in.tok", 9, 256, len_plus_two);
	snprintf(out, sizeof out, "%s/one", dir);
	o.outdir = out;
	cr_assert_eq(shard_split_random(c.path, &o, &r), 0, "%s", err_detail());
	shard_split_result_free(&r);
	snprintf(p, sizeof p, "%s/shard-000.tok", out);
	unsigned char *a = tu_slurp(c.path, &n1), *b = tu_slurp(p, &n2);
	cr_assert(n1 == n2 && !memcmp(a, b, n1), "shard-000.tok is not a copy of the input");
	free(a);
	free(b);
	free_corpus(&c);
}

/* The entry point a router-based split will use: any assignment, any method name. */
Test(shardsplit, write_given_assignment)
{
	struct corpus c;
	struct tokfile tf;
	struct shard_split_opts o = { .paths = 4, .seed = 3 };
	struct shard_split_result r;
	uint32_t assign[12];
	char out[320], p[512];

	make_corpus(&c, "in.tok", 12, 256, len_plus_two);
	snprintf(out, sizeof out, "%s/given", dir);
	o.outdir = out;
	for (int d = 0; d < 12; d++)
		assign[d] = (uint32_t)(3 - d % 4); /* shard 3 gets documents 0, 4, 8 */
	cr_assert_eq(tokfile_open(&tf, c.path), 0);
	cr_assert_eq(shard_split_write(&tf, assign, "test", &o, &r), 0, "%s", err_detail());
	shard_split_result_free(&r);
	snprintf(p, sizeof p, "%s/shard-003.tok", out);
	struct tokfile s3;
	cr_assert_eq(tokfile_open(&s3, p), 0, "%s", err_detail());
	cr_assert_eq(s3.ndocs, 3);
	for (uint64_t i = 0; i < 3; i++)
		cr_assert_eq(s3.offsets[i + 1] - s3.offsets[i], c.len[4 * i]);
	tokfile_close(&s3);
	snprintf(p, sizeof p, "%s/shards.json", out);
	json_t *j = json_load_file(p, 0, NULL);
	cr_assert_str_eq(json_string_value(json_object_get(j, "method")), "test");
	json_decref(j);

	/* An index outside [0, P) is the caller's mistake, refused before writing. */
	assign[5] = 4;
	snprintf(out, sizeof out, "%s/bad", dir);
	o.outdir = out;
	cr_assert_eq(shard_split_write(&tf, assign, "test", &o, &r), CORE_EUSAGE);
	cr_assert(strstr(err_detail(), "document 5 assigned to shard 4 of 4"), "%s", err_detail());
	cr_assert_eq(access(out, F_OK), -1, "outdir created by a refused split");
	tokfile_close(&tf);
	free_corpus(&c);
}

Test(shardsplit, file_names)
{
	const struct { uint32_t s, P; const char *name; } t[] = {
		{ 0, 1, "shard-000.tok" },     { 7, 8, "shard-007.tok" },
		{ 999, 1000, "shard-999.tok" }, { 5, 1001, "shard-0005.tok" },
		{ 1000, 1001, "shard-1000.tok" }, { 42, 65536, "shard-00042.tok" },
		{ 65535, 65536, "shard-65535.tok" },
	};
	char b[64];

	for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
		cr_assert_eq(shard_file_name(b, sizeof b, t[i].s, t[i].P), 0);
		cr_assert_str_eq(b, t[i].name, "shard %u of %u", t[i].s, t[i].P);
	}
	cr_assert_eq(shard_file_name(b, 10, 0, 1), CORE_EUSAGE);
}

/* The draw does not depend on how OpenMP divides the loop. */
Test(shardsplit, assignment_independent_of_threads)
{
	const uint64_t n = 200000;
	uint32_t *a = malloc(n * sizeof *a);

	for (int threads = 1; threads <= 4; threads += 3) {
		omp_set_num_threads(threads);
		shard_assign_random(17, 64, n, a);
		for (uint64_t d = 0; d < n; d++)
			cr_assert_eq(a[d], rng_below(17, RNG_STREAM_SHARD, d, 64),
				     "%d threads: document %llu", threads, (unsigned long long)d);
	}
	free(a);
}

Test(shardsplit, refuses_empty_and_tiny_shards)
{
	struct corpus c;
	struct shard_split_opts o = { .paths = 8 };
	struct shard_split_result r;
	char out[320];

	snprintf(out, sizeof out, "%s/out", dir);
	o.outdir = out;
	/* Fewer documents than shards. */
	make_corpus(&c, "five.tok", 5, 256, len_plus_two);
	cr_assert_eq(shard_split_random(c.path, &o, &r), CORE_ESHAPE);
	cr_assert(strstr(err_detail(), "of 8 would be empty: the file has only 5 documents"),
		  "%s", err_detail());
	cr_assert_str_eq(err_file(), c.path);
	cr_assert_eq(access(out, F_OK), -1, "outdir created by a refused split");
	cr_assert_null(r.shard);
	free_corpus(&c);

	/* Enough documents, but the draw leaves a shard empty: find a seed that does. */
	make_corpus(&c, "ten.tok", 10, 256, len_plus_two);
	o.paths = 5;
	uint64_t seed = 0;
	for (;; seed++) {
		int hit[5] = { 0 }, empty = -1;
		for (int d = 0; d < 10; d++)
			hit[rng_below(seed, RNG_STREAM_SHARD, (uint64_t)d, 5)] = 1;
		for (int s = 4; s >= 0; s--)
			if (!hit[s])
				empty = s;
		if (empty >= 0) {
			char want[64];
			o.seed = seed;
			cr_assert_eq(shard_split_random(c.path, &o, &r), CORE_ESHAPE);
			snprintf(want, sizeof want, "shard %d of 5 would be empty", empty);
			cr_assert(strstr(err_detail(), want), "seed %llu: %s",
				  (unsigned long long)seed, err_detail());
			break;
		}
	}
	cr_assert_eq(access(out, F_OK), -1, "outdir created by a refused split");
	free_corpus(&c);

	/* One document of one token: a shard needs two. */
	make_corpus(&c, "tiny.tok", 3, 256, len_one);
	o.paths = 1;
	cr_assert_eq(shard_split_random(c.path, &o, &r), 0, "%s", err_detail());
	shard_split_result_free(&r);
	struct tokfile tf;
	uint32_t assign[3] = { 0, 1, 0 };
	cr_assert_eq(tokfile_open(&tf, c.path), 0);
	o.paths = 2;
	o.force = 1;
	cr_assert_eq(shard_split_write(&tf, assign, "test", &o, &r), CORE_ESHAPE);
	cr_assert(strstr(err_detail(), "shard 1 of 2 would hold 1 token, fewer than 2"), "%s",
		  err_detail());
	tokfile_close(&tf);
	free_corpus(&c);

	/* P outside [1, 65536]. */
	o.paths = 0;
	cr_assert_eq(shard_split_random("whatever.tok", &o, &r), CORE_EUSAGE);
	o.paths = SHARD_MAX_PATHS + 1;
	cr_assert_eq(shard_split_random("whatever.tok", &o, &r), CORE_EUSAGE);
	o.paths = 2;
	cr_assert_eq(shard_split_random("missing.tok", &o, &r), CORE_EIO);
	cr_assert_str_eq(err_file(), "missing.tok");
}

/* An existing split is refused without force and left byte for byte; with force it is
 * replaced, and the shards of a split with another P go. */
Test(shardsplit, existing_split_needs_force)
{
	struct corpus c;
	struct shard_split_opts o = { .paths = 3, .seed = 1 };
	struct shard_split_result r;
	char out[320], p[512], names[1024];
	unsigned char *old[4];
	size_t oldn[4];
	const char *files[4] = { "shard-000.tok", "shard-001.tok", "shard-002.tok", "shards.json" };

	make_corpus(&c, "in.tok", 30, 256, len_plus_two);
	snprintf(out, sizeof out, "%s/out", dir);
	o.outdir = out;
	cr_assert_eq(shard_split_random(c.path, &o, &r), 0, "%s", err_detail());
	shard_split_result_free(&r);
	for (int i = 0; i < 4; i++) {
		snprintf(p, sizeof p, "%s/%s", out, files[i]);
		old[i] = tu_slurp(p, &oldn[i]);
	}

	o.seed = 2;
	cr_assert_eq(shard_split_random(c.path, &o, &r), CORE_EIO);
	snprintf(p, sizeof p, "%s/shard-000.tok", out);
	cr_assert_str_eq(err_file(), p);
	cr_assert_str_eq(err_detail(), "exists (use --force to replace it)");
	/* Another P writes other names, but the old split is there all the same. */
	o.paths = 2;
	cr_assert_eq(shard_split_random(c.path, &o, &r), CORE_EIO);
	for (int i = 0; i < 4; i++) {
		size_t n;
		snprintf(p, sizeof p, "%s/%s", out, files[i]);
		unsigned char *now = tu_slurp(p, &n);
		cr_assert(n == oldn[i] && !memcmp(now, old[i], n), "%s changed", files[i]);
		free(now);
	}
	listing(out, names, sizeof names);
	cr_assert_str_eq(names, "shard-000.tok shard-001.tok shard-002.tok shards.json");

	/* A manifest alone, or a shard file of any width, is a split too. */
	char lone[320];
	snprintf(lone, sizeof lone, "%s/lone", dir);
	mkdir(lone, 0777);
	snprintf(p, sizeof p, "%s/shard-0017.tok", lone);
	fclose(fopen(p, "w"));
	snprintf(p, sizeof p, "%s/shard-x.tok", lone); /* not a shard name: ignored */
	fclose(fopen(p, "w"));
	o.outdir = lone;
	cr_assert_eq(shard_split_random(c.path, &o, &r), CORE_EIO);
	snprintf(p, sizeof p, "%s/shard-0017.tok", lone);
	cr_assert_str_eq(err_file(), p);

	/* With force: replaced, and shard-002.tok of the 3-way split is gone (check_split
	 * wants exactly the files of the new split). */
	check_split(&c, 2, 2, out, 1);
	for (int i = 0; i < 4; i++)
		free(old[i]);
	free_corpus(&c);
}

/* A write that fails half way (a full disk, here a file size limit) leaves the old split. */
Test(shardsplit, failed_write_leaves_old_split)
{
	struct corpus c, big;
	struct shard_split_opts o = { .paths = 3, .seed = 4 };
	struct shard_split_result r;
	char out[320], p[512], names[1024], before[1024];
	unsigned char *old[4];
	size_t oldn[4];
	const char *files[4] = { "shard-000.tok", "shard-001.tok", "shard-002.tok", "shards.json" };

	make_corpus(&c, "in.tok", 30, 256, len_plus_two);
	snprintf(out, sizeof out, "%s/out", dir);
	o.outdir = out;
	cr_assert_eq(shard_split_random(c.path, &o, &r), 0, "%s", err_detail());
	shard_split_result_free(&r);
	for (int i = 0; i < 4; i++) {
		snprintf(p, sizeof p, "%s/%s", out, files[i]);
		old[i] = tu_slurp(p, &oldn[i]);
	}
	listing(out, before, sizeof before);

	/* The new input: shard 2 gets documents of 2000 tokens (4000 bytes each) and passes the
	 * limit after shards 0 and 1, small, were prepared. */
	make_corpus(&big, "big.tok", 30, 256, len_big_last);
	uint64_t last = 0;
	for (int d = 0; d < 30; d++)
		if (rng_below(4, RNG_STREAM_SHARD, (uint64_t)d, 3) == 2)
			last += big.len[d] * 2;
	cr_assert_gt(last, 8192, "shard 2 too small (%llu bytes) to pass the limit",
		     (unsigned long long)last);

	signal(SIGXFSZ, SIG_IGN); /* a write past the limit fails with EFBIG instead */
	struct rlimit rl = { 4096, 4096 };
	cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
	o.force = 1;
	int rc = shard_split_random(big.path, &o, &r);
	cr_assert_lt(rc, 0, "split did not fail");
	cr_assert(strstr(err_file(), "shard-002.tok"), "the error names %s: %s", err_file(),
		  err_detail());
	for (int i = 0; i < 4; i++) {
		size_t n;
		snprintf(p, sizeof p, "%s/%s", out, files[i]);
		unsigned char *now = tu_slurp(p, &n);
		cr_assert(n == oldn[i] && !memcmp(now, old[i], n), "%s was replaced", files[i]);
		free(now);
		free(old[i]);
	}
	listing(out, names, sizeof names);
	cr_assert_str_eq(names, before, "temporary files left behind");
	free_corpus(&c);
	free_corpus(&big);
}

/* ---- the manifest's one reader ------------------------------------------------------------ */

/* shard_manifest_read against the corpus itself: each shard's token count is the sum of the
 * lengths of the documents the generator sends there (counted here from the same draw), and
 * a manifest that names another file, lacks tokens or is missing is refused naming it. */
Test(shardsplit, manifest_read)
{
	struct shard_split_opts o = { .paths = 3, .seed = 7 };
	struct shard_split_result r;
	struct corpus c;
	char out[320], p[512];
	uint64_t want[3] = { 0 }, *tokens = NULL;
	uint32_t P = 0;

	make_corpus(&c, "in.tok", 40, 256, len_plus_two);
	for (int d = 0; d < 40; d++)
		want[rng_below(7, RNG_STREAM_SHARD, (uint64_t)d, 3)] += c.len[d];
	snprintf(out, sizeof out, "%s/m", dir);
	o.outdir = out;
	cr_assert_eq(shard_split_random(c.path, &o, &r), 0, "%s", err_detail());
	shard_split_result_free(&r);
	cr_assert_eq(shard_manifest_read(out, &P, &tokens), 0, "%s", err_detail());
	cr_assert_eq(P, 3);
	for (int s = 0; s < 3; s++)
		cr_expect_eq(tokens[s], want[s], "shard %d: %llu tokens, %llu drawn", s,
			     (unsigned long long)tokens[s], (unsigned long long)want[s]);
	free(tokens);

	static const struct {
		const char *text, *detail;
	} bad[] = {
		{ "{\"paths\": 2, \"shards\": [{\"file\": \"shard-000.tok\", \"tokens\": 5}, "
		  "{\"file\": \"shard-01.tok\", \"tokens\": 5}]}",
		  "shard 1 is 'shard-01.tok', not 'shard-001.tok'" },
		{ "{\"paths\": 2, \"shards\": [{\"file\": \"shard-000.tok\", \"tokens\": 5}, "
		  "{\"file\": \"shard-001.tok\", \"tokens\": 1}]}",
		  "shard 1 has no valid 'tokens'" },
		{ "{\"paths\": 3, \"shards\": [{\"file\": \"shard-000.tok\", \"tokens\": 5}]}",
		  "not a shard manifest (no 'paths' and 'shards' of that length)" },
		{ "{\"paths\": 0, \"shards\": []}",
		  "not a shard manifest (no 'paths' and 'shards' of that length)" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		snprintf(p, sizeof p, "%s/shards.json", out);
		FILE *f = fopen(p, "w");
		cr_assert(f);
		fputs(bad[i].text, f);
		fclose(f);
		P = 9;
		tokens = (uint64_t *)1;
		cr_expect_eq(shard_manifest_read(out, &P, &tokens), CORE_EFORMAT, "case %zu", i);
		cr_expect_str_eq(err_detail(), bad[i].detail, "case %zu", i);
		cr_expect(strstr(err_file(), "shards.json"), "case %zu: %s", i, err_file());
		cr_expect(P == 0 && tokens == NULL, "case %zu: outputs not cleared", i);
	}
	snprintf(out, sizeof out, "%s/none", dir);
	cr_expect_eq(shard_manifest_read(out, &P, &tokens), CORE_ENOTFOUND);
	free_corpus(&c);
}
