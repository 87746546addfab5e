/* corpus.c - document readers, tokenizers, split and the prepare pipeline; see corpus.h.
 *
 * JSON is parsed with jansson, one line at a time, so a line's number is known for the error
 * message and memory stays bounded by the longest line. Tokens stream into the token files as
 * documents arrive (tokfile.h), so the corpus itself never has to fit in memory.
 */
#include "io/corpus.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/atomicio.h"
#include "common/err.h"
#include "common/rng.h"
#include "io/tokfile.h"
#include "common/banned.h"

/* ---- readers ------------------------------------------------------------------------------ */

struct corpus_reader {
	char *path;
	int is_dir;
	uint64_t ndocs;
	/* JSONL */
	FILE *fp;
	char *line;
	size_t line_cap;
	uint64_t lineno, size;
	uint64_t pos; /* bytes read so far: the progress, without an lseek per document */
	json_t *obj;
	char *meta;
	/* directory */
	struct dirent **names;
	int nnames, next;
	char *file; /* path of the current file */
	char *buf;  /* its contents */
};

static int name_filter(const struct dirent *e)
{
	return e->d_name[0] != '.';
}

/* strcmp, not strcoll: the order (and so the split) must not depend on the locale. */
static int name_cmp(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*a)->d_name, (*b)->d_name);
}

int corpus_open(struct corpus_reader **out, const char *path)
{
	struct corpus_reader *r;
	struct stat st;

	*out = NULL;
	if (stat(path, &st) != 0)
		return err_errno(CORE_EIO, path, "cannot open", errno);
	r = calloc(1, sizeof *r);
	if (!r || !(r->path = strdup(path))) {
		free(r);
		return err_set(CORE_ENOMEM, path, "out of memory");
	}
	if (S_ISDIR(st.st_mode)) {
		r->is_dir = 1;
		r->nnames = scandir(path, &r->names, name_filter, name_cmp);
		if (r->nnames < 0) {
			int e = errno;
			r->nnames = 0;
			corpus_close(r);
			return err_errno(CORE_EIO, path, "cannot list directory", e);
		}
	} else {
		r->fp = fopen(path, "rb");
		if (!r->fp) {
			int e = errno;
			corpus_close(r);
			return err_errno(CORE_EIO, path, "cannot open", e);
		}
		r->size = (uint64_t)st.st_size;
	}
	*out = r;
	return 0;
}

void corpus_close(struct corpus_reader *r)
{
	if (!r)
		return;
	if (r->fp)
		fclose(r->fp);
	free(r->line);
	json_decref(r->obj);
	free(r->meta);
	for (int i = 0; i < r->nnames; i++)
		free(r->names[i]);
	free(r->names);
	free(r->file);
	free(r->buf);
	free(r->path);
	free(r);
}

void corpus_progress(const struct corpus_reader *r, uint64_t *done, uint64_t *total)
{
	if (r->is_dir) {
		*done = (uint64_t)r->next;
		*total = (uint64_t)r->nnames;
	} else {
		*done = r->pos;
		*total = r->size;
	}
}

static int blank(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n')
			return 0;
	return 1;
}

static int next_jsonl(struct corpus_reader *r, struct corpus_doc *doc)
{
	ssize_t n;
	json_error_t jerr;
	json_t *text;
	unsigned long long ln;

	json_decref(r->obj);
	r->obj = NULL;
	free(r->meta);
	r->meta = NULL;
	do {
		errno = 0;
		n = getline(&r->line, &r->line_cap, r->fp);
		if (n < 0) {
			if (ferror(r->fp))
				return err_errno(CORE_EIO, r->path, "read failed", errno);
			return 0;
		}
		r->lineno++;
		r->pos += (uint64_t)n;
	} while (blank(r->line, (size_t)n));
	ln = (unsigned long long)r->lineno;

	r->obj = json_loadb(r->line, (size_t)n, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &jerr);
	if (!r->obj)
		return err_set(CORE_EFORMAT, r->path, "line %llu, column %d: %s", ln, jerr.column,
			       jerr.text);
	if (!json_is_object(r->obj))
		return err_set(CORE_EFORMAT, r->path, "line %llu: not a JSON object", ln);
	text = json_object_get(r->obj, "text");
	if (!text)
		return err_set(CORE_EFORMAT, r->path, "line %llu: no \"text\" field", ln);
	if (!json_is_string(text))
		return err_set(CORE_EFORMAT, r->path, "line %llu: \"text\" is not a string", ln);
	doc->text = json_string_value(text);
	doc->len = json_string_length(text);
	/* The text stays alive while the object holds it; deleting the key drops that reference,
	 * so take one of our own until the next call. */
	json_incref(text);
	json_object_del(r->obj, "text");
	r->meta = json_dumps(r->obj, JSON_COMPACT);
	json_decref(r->obj);
	r->obj = text;
	if (!r->meta)
		return err_set(CORE_ENOMEM, r->path, "line %llu: cannot encode metadata", ln);
	doc->meta = r->meta;
	doc->meta_len = strlen(r->meta);
	return 1;
}

static int next_file(struct corpus_reader *r, struct corpus_doc *doc)
{
	struct stat st;
	size_t len = 0;

	for (;;) {
		if (r->next >= r->nnames)
			return 0;
		const char *name = r->names[r->next++]->d_name;
		size_t n = strlen(r->path) + strlen(name) + 2;
		free(r->file);
		r->file = malloc(n);
		if (!r->file)
			return err_set(CORE_ENOMEM, r->path, "out of memory");
		snprintf(r->file, n, "%s/%s", r->path, name);
		if (stat(r->file, &st) != 0)
			return err_errno(CORE_EIO, r->file, "cannot stat", errno);
		if (!S_ISREG(st.st_mode))
			continue;
		free(r->buf);
		r->buf = NULL;
		/* Not file_read_all: a file turned into a FIFO since the stat must not block. */
		ERR_FORWARD(file_read_regular(r->file, 0, &r->buf, &len));
		json_t *m = json_pack("{s:s}", "file", name);
		free(r->meta);
		r->meta = m ? json_dumps(m, JSON_COMPACT) : NULL;
		json_decref(m);
		if (!r->meta)
			return err_set(CORE_EFORMAT, r->file, "file name is not valid UTF-8");
		doc->text = r->buf;
		doc->len = len;
		doc->meta = r->meta;
		doc->meta_len = strlen(r->meta);
		return 1;
	}
}

int corpus_next(struct corpus_reader *r, struct corpus_doc *doc)
{
	int rc = r->is_dir ? next_file(r, doc) : next_jsonl(r, doc);

	if (rc == 1)
		doc->index = r->ndocs++;
	return rc;
}

/* ---- tokenizers --------------------------------------------------------------------------- */

int corpus_tokens_reserve(struct corpus_tokens *t, uint64_t cap)
{
	if (cap <= t->cap)
		return 0;
	uint64_t c = t->cap ? t->cap : 4096;
	while (c < cap)
		c *= 2;
	if (c > SIZE_MAX / sizeof *t->tok)
		return err_set(CORE_ENOMEM, NULL, "%llu tokens do not fit in memory",
			       (unsigned long long)c);
	uint32_t *p = realloc(t->tok, (size_t)c * sizeof *p);
	if (!p)
		return err_set(CORE_ENOMEM, NULL, "out of memory for %llu tokens",
			       (unsigned long long)c);
	t->tok = p;
	t->cap = c;
	return 0;
}

void corpus_tokens_free(struct corpus_tokens *t)
{
	free(t->tok);
	memset(t, 0, sizeof *t);
}

static int byte_encode(const struct corpus_tokenizer *tk, const char *text, size_t len,
		       struct corpus_tokens *out)
{
	ERR_FORWARD(corpus_tokens_reserve(out, out->n + len));
	const unsigned char *s = (const unsigned char *)text;
	for (size_t i = 0; i < len; i++)
		out->tok[out->n + i] = s[i];
	out->n += len;
	return 0;
}

static const struct corpus_tokenizer byte_tokenizer = {
	.name = "byte",
	.vocab = 256,
	.encode = byte_encode,
};

int corpus_tokenizer_open(struct corpus_tokenizer *tk, const char *spec)
{
	if (strcmp(spec, "byte") == 0) {
		*tk = byte_tokenizer;
		return 0;
	}
	memset(tk, 0, sizeof *tk);
	return err_set(CORE_EUSAGE, NULL, "unknown tokenizer '%s' (this build knows: byte)", spec);
}

void corpus_tokenizer_close(struct corpus_tokenizer *tk)
{
	if (tk->release)
		tk->release(tk);
	memset(tk, 0, sizeof *tk);
}

/* ---- split -------------------------------------------------------------------------------- */

enum corpus_split corpus_split_of(uint64_t seed, uint64_t doc, double val_frac,
				  double router_frac)
{
	double u = rng_uniform(seed, RNG_STREAM_SPLIT, doc);

	if (u < val_frac)
		return CORPUS_SPLIT_VAL;
	if (u < val_frac + router_frac)
		return CORPUS_SPLIT_ROUTER;
	return CORPUS_SPLIT_TRAIN;
}

int corpus_split_check(double val_frac, double router_frac)
{
	if (!(val_frac >= 0 && val_frac <= 1))
		return err_set(CORE_EUSAGE, NULL, "validation fraction %g is outside [0, 1]",
			       val_frac);
	if (!(router_frac >= 0 && router_frac <= 1))
		return err_set(CORE_EUSAGE, NULL, "router fraction %g is outside [0, 1]",
			       router_frac);
	if (val_frac + router_frac > 1)
		return err_set(CORE_EUSAGE, NULL,
			       "validation and router fractions add up to %g, more than 1",
			       val_frac + router_frac);
	return 0;
}

const char *corpus_split_name(enum corpus_split s)
{
	static const char *const names[CORPUS_NSPLITS] = { "train", "val", "router" };

	return (unsigned)s < CORPUS_NSPLITS ? names[s] : "?";
}

int corpus_split_path(char *buf, size_t n, const char *outdir, enum corpus_split s)
{
	int k = snprintf(buf, n, "%s/%s.tok", outdir, corpus_split_name(s));

	if (k < 0 || (size_t)k >= n)
		return err_set(CORE_EUSAGE, outdir, "output directory name too long");
	return 0;
}

/* ---- prepare ------------------------------------------------------------------------------ */

static int make_outdir(const char *dir, int *created)
{
	struct stat st;

	*created = 0;
	if (mkdir(dir, 0777) == 0) {
		*created = 1;
		return 0;
	}
	if (errno != EEXIST)
		return err_errno(CORE_EIO, dir, "cannot create directory", errno);
	if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
		return err_set(CORE_EIO, dir, "not a directory");
	return 0;
}

int corpus_prepare(const struct corpus_prepare_opts *o, struct corpus_prepare_result *res)
{
	struct corpus_tokenizer tk = { 0 };
	struct corpus_reader *r = NULL;
	struct tokfile_writer *w[CORPUS_NSPLITS] = { NULL };
	struct corpus_tokens toks = { 0 };
	struct corpus_doc doc;
	char path[4096];
	int rc, s, created = 0;

	memset(res, 0, sizeof *res);
	rc = corpus_split_check(o->val_frac, o->router_frac);
	if (rc < 0)
		return rc;
	rc = corpus_tokenizer_open(&tk, o->tokenizer);
	if (rc < 0)
		return rc;
	res->vocab = tk.vocab;
	rc = corpus_open(&r, o->input);
	if (rc < 0)
		goto out;
	rc = make_outdir(o->outdir, &created);
	if (rc < 0)
		goto out;
	for (s = 0; s < CORPUS_NSPLITS; s++) {
		rc = corpus_split_path(path, sizeof path, o->outdir, (enum corpus_split)s);
		if (rc < 0)
			goto out;
		rc = tokw_open(&w[s], path, tk.vocab);
		if (rc < 0)
			goto out;
	}
	while ((rc = corpus_next(r, &doc)) == 1) {
		s = corpus_split_of(o->seed, doc.index, o->val_frac, o->router_frac);
		toks.n = 0;
		rc = tk.encode(&tk, doc.text, doc.len, &toks);
		if (rc < 0)
			goto out;
		rc = tokw_add_doc(w[s], toks.tok, toks.n, doc.meta, doc.meta_len);
		if (rc < 0)
			goto out;
		res->split[s].docs++;
		res->split[s].tokens += toks.n;
		if (o->progress) {
			uint64_t done, total;
			corpus_progress(r, &done, &total);
			o->progress(o->progress_ctx, done, total);
		}
	}
	if (rc < 0)
		goto out;
	if (r->ndocs == 0) { /* an empty dataset is a mistake upstream, not a result */
		rc = err_set(CORE_EFORMAT, o->input, "holds no documents");
		goto out;
	}
	/* The whole input is in. Complete and sync all three files before renaming any, so that
	 * a failure to write the tail of one of them (a full disk) leaves all the old ones. */
	for (s = 0; s < CORPUS_NSPLITS; s++) {
		rc = tokw_prepare(w[s]);
		if (rc < 0)
			goto out;
	}
	for (s = 0; s < CORPUS_NSPLITS; s++) {
		rc = tokw_commit(w[s]);
		w[s] = NULL;
		if (rc < 0)
			goto out;
	}
out:
	for (s = 0; s < CORPUS_NSPLITS; s++)
		tokw_abort(w[s]);
	/* A directory made for outputs that never came is removed again (if still empty). */
	if (rc < 0 && created)
		rmdir(o->outdir);
	corpus_tokens_free(&toks);
	corpus_close(r);
	corpus_tokenizer_close(&tk);
	return rc;
}
