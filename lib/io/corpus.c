/* corpus.c - document readers, tokenizers, split, chunks and the prepare pipeline; see
 * corpus.h.
 *
 * JSON is parsed with jansson, one line at a time, so a line's number is known for the error
 * message and memory stays bounded by the longest line. Tokens stream into the token files as
 * documents arrive (tokfile.h), so the corpus itself never has to fit in memory; only one
 * document's tokens are held at a time, which is what cutting it into pieces needs.
 */
#include "io/corpus.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/atomicio.h"
#include "common/err.h"
#include "common/rng.h"
#include "io/tokenizer.h"
#include "io/tokfile.h"
#include "common/banned.h"

/* ---- readers ------------------------------------------------------------------------------ */

struct corpus_reader {
	char *path;
	int is_dir;
	int is_txt; /* a .txt file: one document */
	uint64_t ndocs;
	/* JSONL (and .txt: size, pos, meta, buf) */
	FILE *fp;
	char *line;
	size_t line_cap;
	uint64_t lineno, size;
	int started; /* a non-blank line was seen: the first one's first byte was checked */
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

static int has_txt_suffix(const char *path)
{
	size_t n = strlen(path);

	return n >= 4 && strcmp(path + n - 4, ".txt") == 0;
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
	} else if (S_ISREG(st.st_mode) && has_txt_suffix(path)) {
		r->is_txt = 1;
		r->size = (uint64_t)st.st_size;
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
	if (!r->started) {
		/* Plain text given as JSONL would otherwise fail with jansson's "'[' or '{'
		 * expected near 'The'", which does not say what is wrong with the input. */
		size_t i = 0;
		while (r->line[i] == ' ' || r->line[i] == '\t' || r->line[i] == '\r')
			i++;
		if (r->line[i] != '{')
			return err_set(CORE_EFORMAT, r->path, "not JSON Lines (one {\"text\": ...} "
				       "object per line); for plain text name the file *.txt or "
				       "pass a directory of text files");
		r->started = 1;
	}

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

/* metadata {"file":"name"} of the file name into r->meta; file names the error */
static int file_meta(struct corpus_reader *r, const char *file, const char *name)
{
	json_t *m = json_pack("{s:s}", "file", name);

	free(r->meta);
	r->meta = m ? json_dumps(m, JSON_COMPACT) : NULL;
	json_decref(m);
	if (!r->meta)
		return err_set(CORE_EFORMAT, file, "file name is not valid UTF-8");
	return 0;
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
		ERR_FORWARD(file_meta(r, r->file, name));
		doc->text = r->buf;
		doc->len = len;
		doc->meta = r->meta;
		doc->meta_len = strlen(r->meta);
		return 1;
	}
}

static int next_txt(struct corpus_reader *r, struct corpus_doc *doc)
{
	const char *slash = strrchr(r->path, '/');
	size_t len = 0;

	if (r->ndocs > 0)
		return 0;
	free(r->buf);
	r->buf = NULL;
	ERR_FORWARD(file_read_regular(r->path, 0, &r->buf, &len));
	ERR_FORWARD(file_meta(r, r->path, slash ? slash + 1 : r->path));
	r->pos = r->size = len;
	doc->text = r->buf;
	doc->len = len;
	doc->meta = r->meta;
	doc->meta_len = strlen(r->meta);
	return 1;
}

int corpus_next(struct corpus_reader *r, struct corpus_doc *doc)
{
	int rc = r->is_dir ? next_file(r, doc) : r->is_txt ? next_txt(r, doc) : next_jsonl(r, doc);

	if (rc == 1)
		doc->index = r->ndocs++;
	return rc;
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

/* ---- chunks ------------------------------------------------------------------------------- */

uint64_t corpus_chunk_pieces(uint64_t ntokens, uint64_t chunk)
{
	if (chunk == 0 || ntokens < chunk)
		return 1;
	/* chunk - chunk / 2 is chunk / 2 rounded up: "at least half a chunk" without 2 * r,
	 * which could overflow */
	return ntokens / chunk + (ntokens % chunk >= chunk - chunk / 2);
}

int corpus_chunk_meta(const char *file, const char *meta, size_t len, uint64_t doc,
		      uint64_t chunk, char **out, size_t *out_len)
{
	json_error_t jerr;
	json_t *obj = json_loadb(meta, len, JSON_ALLOW_NUL | JSON_REJECT_DUPLICATES, &jerr);
	const char *clash = NULL;
	unsigned long long d = (unsigned long long)doc;
	int rc = 0;

	*out = NULL;
	*out_len = 0;
	if (!json_is_object(obj)) {
		rc = err_set(CORE_EFORMAT, file, "document %llu: metadata is not a JSON object", d);
		goto out;
	}
	/* Replacing a field of the source would lose it silently, and keeping both would give
	 * duplicate keys; the user renames the field instead. */
	if (json_object_get(obj, "doc"))
		clash = "doc";
	else if (json_object_get(obj, "chunk"))
		clash = "chunk";
	if (clash) {
		rc = err_set(CORE_EFORMAT, file, "document %llu (counted from 0): has a \"%s\" "
			     "field, which cutting into pieces adds to the metadata", d, clash);
		goto out;
	}
	/* doc and chunk count things read into memory: far below 2^63, json_int_t's limit */
	if (json_object_set_new(obj, "doc", json_integer((json_int_t)doc)) != 0 ||
	    json_object_set_new(obj, "chunk", json_integer((json_int_t)chunk)) != 0 ||
	    !(*out = json_dumps(obj, JSON_COMPACT))) {
		rc = err_set(CORE_ENOMEM, file, "document %llu: cannot encode the metadata of "
			     "piece %llu", d, (unsigned long long)chunk);
		goto out;
	}
	*out_len = strlen(*out);
out:
	json_decref(obj);
	return rc;
}

/* ---- prepare ------------------------------------------------------------------------------ */

/* Append a tokenized source document to its split's file: whole, or cut into pieces. */
static int add_doc(struct tokfile_writer *w, const struct corpus_prepare_opts *o,
		   const struct corpus_doc *doc, const struct token_buf *t,
		   struct corpus_split_stats *st)
{
	uint64_t npieces = corpus_chunk_pieces(t->n, o->chunk);

	if (o->chunk == 0) {
		ERR_FORWARD(tokw_add_doc(w, t->tok, t->n, doc->meta, doc->meta_len));
	} else {
		for (uint64_t k = 0; k < npieces; k++) {
			uint64_t a = k * o->chunk, b = k + 1 == npieces ? t->n : a + o->chunk;
			char *meta;
			size_t ml;
			ERR_FORWARD(corpus_chunk_meta(o->input, doc->meta, doc->meta_len,
						      doc->index, k, &meta, &ml));
			int rc = tokw_add_doc(w, t->tok ? t->tok + a : NULL, b - a, meta, ml);
			free(meta);
			if (rc < 0)
				return rc;
		}
	}
	st->docs += npieces;
	st->sources++;
	st->tokens += t->n;
	return 0;
}

/* A split asked for (fraction > 0) that no source document went to is refused: a dataset
 * without validation or router documents would only fail later, or silently measure nothing.
 * With few long documents the fix is more documents or a larger fraction; --chunk does not
 * help, since the split is drawn per source document. */
static int check_splits(const struct corpus_prepare_opts *o,
			const struct corpus_prepare_result *res, uint64_t ndocs)
{
	int ev = o->val_frac > 0 && res->split[CORPUS_SPLIT_VAL].sources == 0;
	int er = o->router_frac > 0 && res->split[CORPUS_SPLIT_ROUTER].sources == 0;
	unsigned long long n = (unsigned long long)ndocs;
	const char *docs = ndocs == 1 ? "document" : "documents";

	if (ev && er)
		return err_set(CORE_EFORMAT, o->input,
			       "val and router splits are empty: the input has %llu %s and none "
			       "went to them (--val-frac %g, --router-frac %g); use more "
			       "documents or larger fractions, or 0 for no such split (--chunk "
			       "cuts documents after the split and cannot fill one)", n, docs,
			       o->val_frac, o->router_frac);
	if (ev || er) {
		const char *name = ev ? "val" : "router";
		return err_set(CORE_EFORMAT, o->input,
			       "%s split is empty: the input has %llu %s and none went to it "
			       "(--%s-frac %g); use more documents or a larger --%s-frac, or "
			       "--%s-frac 0 for no %s split (--chunk cuts documents after the "
			       "split and cannot fill it)", name, n, docs, name,
			       ev ? o->val_frac : o->router_frac, name, name, name);
	}
	return 0;
}

int corpus_prepare(const struct corpus_prepare_opts *o, struct corpus_prepare_result *res)
{
	struct tokenizer *tk = NULL;
	struct corpus_reader *r = NULL;
	struct tokfile_writer *w[CORPUS_NSPLITS] = { NULL };
	struct token_buf toks = { 0 };
	struct corpus_doc doc;
	char path[4096];
	int rc, s;
	char made[PATH_MAX] = "";

	memset(res, 0, sizeof *res);
	rc = corpus_split_check(o->val_frac, o->router_frac);
	if (rc < 0)
		return rc;
	if (o->chunk == 1)
		return err_set(CORE_EUSAGE, NULL, "pieces of 1 token: cutting into pieces needs a "
			       "size of at least 2 tokens (0 for none)");
	rc = tokenizer_open(&tk, o->tokenizer);
	if (rc < 0)
		return rc;
	res->vocab = tokenizer_vocab(tk);
	res->tokenizer = tokenizer_get_id(tk);
	rc = corpus_open(&r, o->input);
	if (rc < 0)
		goto out;
	rc = dir_make(o->outdir, made, sizeof made);
	if (rc < 0)
		goto out;
	for (s = 0; s < CORPUS_NSPLITS; s++) {
		rc = corpus_split_path(path, sizeof path, o->outdir, (enum corpus_split)s);
		if (rc < 0)
			goto out;
		rc = tokw_open(&w[s], path, tokenizer_vocab(tk));
		if (rc < 0)
			goto out;
		tokw_set_tokenizer(w[s], tokenizer_get_id(tk));
	}
	while ((rc = corpus_next(r, &doc)) == 1) {
		s = corpus_split_of(o->seed, doc.index, o->val_frac, o->router_frac);
		toks.n = 0;
		rc = tokenizer_encode(tk, doc.text, doc.len, &toks);
		if (rc < 0)
			goto out;
		rc = add_doc(w[s], o, &doc, &toks, &res->split[s]);
		if (rc < 0)
			goto out;
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
	if ((rc = check_splits(o, res, r->ndocs)) < 0)
		goto out;
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
	/* Folders made for outputs that never came are removed again (if still empty). */
	if (rc < 0)
		dir_unmake(o->outdir, made);
	token_buf_free(&toks);
	corpus_close(r);
	tokenizer_close(tk);
	return rc;
}

/* ---- tokenizer ---------------------------------------------------------------------------- */

struct train_feed {
	const struct corpus_tokenizer_opts *o;
	struct corpus_reader *r;
	struct corpus_tokenizer_result *res;
	int read_rc; /* corpus_next's last: 0 once the input is read to its end */
};

static int feed_next(void *arg, const char **text, size_t *len)
{
	struct train_feed *f = arg;
	const struct corpus_tokenizer_opts *o = f->o;
	struct corpus_doc doc;
	int rc;

	while ((rc = corpus_next(f->r, &doc)) == 1) {
		if (o->progress) {
			uint64_t done, total;
			corpus_progress(f->r, &done, &total);
			o->progress(o->progress_ctx, done, total);
		}
		if (o->train_split && corpus_split_of(o->seed, doc.index, o->val_frac,
						      o->router_frac) != CORPUS_SPLIT_TRAIN)
			continue;
		f->res->docs++;
		f->res->bytes += doc.len;
		*text = doc.text;
		*len = doc.len;
		return 1;
	}
	f->read_rc = rc;
	return rc;
}

int corpus_train_tokenizer(const char *out, const struct corpus_tokenizer_opts *o,
			   struct corpus_tokenizer_result *res)
{
	struct train_feed f = {.o = o, .res = res, .read_rc = 1};
	int rc;

	memset(res, 0, sizeof *res);
	if (o->train_split && (rc = corpus_split_check(o->val_frac, o->router_frac)) < 0)
		return rc;
	if ((rc = corpus_open(&f.r, o->input)) < 0)
		return rc;
	rc = tokenizer_train(out, &o->train, feed_next, &f, &res->id);
	/* the trainer's complaint about no text at all, said as prepare says it */
	if (rc < 0 && f.read_rc == 0 && res->docs == 0)
		rc = err_set(CORE_EFORMAT, o->input, o->train_split ? "holds no documents for "
			     "train.tok (with this --seed and these fractions)" : "holds no "
			     "documents");
	corpus_close(f.r);
	return rc;
}
