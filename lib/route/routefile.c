/* routefile.c - features, router and scores files; see routefile.h. */
#include "route/routefile.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "io/safetensors.h"
#include "route/kmeans.h"

#include "common/banned.h"

#define FEATURES_FORMAT "dpc-features"
#define ROUTER_FORMAT "dpc-router"
#define SCORES_FORMAT "dpc-scores"
#define FORMAT_VERSION "1"

/* ---- helpers ------------------------------------------------------------------------------ */

static int check_format(const struct st_file *f, const char *format, const char *what)
{
	const char *fmt = st_meta(f, "format"), *v = st_meta(f, "version");
	if (!fmt || strcmp(fmt, format))
		return err_set(CORE_EFORMAT, f->path, "not a %s file (format '%.40s', expected "
			       "'%s')", what, fmt ? fmt : "none", format);
	if (!v || strcmp(v, FORMAT_VERSION))
		return err_set(CORE_EVERSION, f->path, "%s version '%.20s', this program reads "
			       "version %s", what, v ? v : "none", FORMAT_VERSION);
	return 0;
}

static int meta_hex32(const struct st_file *f, const char *key, uint32_t *out)
{
	const char *s = st_meta(f, key);
	char *end;
	if (!s)
		return err_set(CORE_EFORMAT, f->path, "metadata key '%s' missing", key);
	errno = 0;
	unsigned long v = strtoul(s, &end, 16);
	if (errno || strlen(s) != 8 || *end || v > 0xffffffffUL)
		return err_set(CORE_EFORMAT, f->path, "metadata '%s' = '%.20s' is not 8 hex digits",
			       key, s);
	*out = (uint32_t)v;
	return 0;
}

static int meta_dup(const struct st_file *f, const char *key, char **out)
{
	const char *s = st_meta(f, key);
	if (!s)
		return err_set(CORE_EFORMAT, f->path, "metadata key '%s' missing", key);
	if (!(*out = strdup(s)))
		return CORE_ENOMEM;
	return 0;
}

static int read_recipe(const struct st_file *f, struct recipe *r)
{
	const char *d = st_meta(f, "checkpoint_digest");
	long v;
	if (!d || strlen(d) != LM_DIGEST_CHARS || strspn(d, "0123456789abcdef") != LM_DIGEST_CHARS)
		return err_set(CORE_EFORMAT, f->path, "metadata 'checkpoint_digest' missing or not "
			       "8 hex digits");
	memcpy(r->digest, d, LM_DIGEST_CHARS + 1);
	ERR_FORWARD(st_meta_long(f, "layer", 0, INT_MAX, &v));
	r->layer = (int)v;
	ERR_FORWARD(st_meta_long(f, "prefix", 1, INT_MAX, &v));
	r->prefix = (int)v;
	return 0;
}

/* Read tensor name of dtype F32 and shape [n0] or [n0, n1] (n1 = 0) into a new buffer. */
static int read_f32(struct st_file *f, const char *name, int64_t n0, int64_t n1, float **out)
{
	const int64_t ne[2] = {n0, n1};
	const struct st_entry *e;
	struct tensor t;

	ERR_FORWARD(st_lookup(f, name, DT_F32, n1 ? 2 : 1, ne, &e));
	const size_t n = (size_t)n0 * (size_t)(n1 ? n1 : 1);
	if (!(*out = malloc(n ? n * sizeof(float) : 1)))
		return err_set(CORE_ENOMEM, f->path, "cannot allocate '%s'", name);
	tensor_view(&t, DT_F32, n1 ? 2 : 1, ne, *out, name);
	return st_read(f, name, &t);
}

/* Every value finite, so that a router never compares NaNs. */
static int check_finite(const struct st_file *f, const char *name, const float *x, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!(x[i] - x[i] == 0.0f))
			return err_set(CORE_EFORMAT, f->path, "tensor '%s' holds a non-finite value "
				       "at element %zu", name, i);
	return 0;
}

static int open_checked(struct st_file *f, const char *path, const char *format,
			const char *what)
{
	ERR_FORWARD(st_open(f, path, 1));
	int rc = check_format(f, format, what);
	if (rc)
		st_close(f);
	return rc;
}

/* ---- features ----------------------------------------------------------------------------- */

int features_write(const char *path, const struct features *f)
{
	char layer[16], prefix[16], crc[16], docs[24], dim[16];
	const int64_t ne[2] = {(int64_t)f->docs, f->dim};
	struct tensor t;
	const struct tensor *ts[] = {&t};

	snprintf(layer, sizeof layer, "%d", f->r.layer);
	snprintf(prefix, sizeof prefix, "%d", f->r.prefix);
	snprintf(crc, sizeof crc, "%08x", (unsigned)f->corpus_crc);
	snprintf(docs, sizeof docs, "%llu", (unsigned long long)f->docs);
	snprintf(dim, sizeof dim, "%d", f->dim);
	const struct st_kv meta[] = {
		{"format", FEATURES_FORMAT}, {"version", FORMAT_VERSION},
		{"checkpoint", f->checkpoint}, {"checkpoint_digest", f->r.digest},
		{"layer", layer}, {"prefix", prefix}, {"corpus", f->corpus},
		{"corpus_crc", crc}, {"docs", docs}, {"dim", dim},
	};
	tensor_view(&t, DT_F32, 2, ne, f->x, "features");
	return st_write(path, ts, 1, meta, (int)(sizeof meta / sizeof meta[0]));
}

void features_free(struct features *f)
{
	free(f->checkpoint);
	free(f->corpus);
	free(f->x);
	memset(f, 0, sizeof *f);
}

int features_read(const char *path, struct features *f)
{
	struct st_file sf;
	long v;
	int rc;

	memset(f, 0, sizeof *f);
	ERR_FORWARD(open_checked(&sf, path, FEATURES_FORMAT, "features"));
	rc = read_recipe(&sf, &f->r);
	if (!rc)
		rc = meta_dup(&sf, "checkpoint", &f->checkpoint);
	if (!rc)
		rc = meta_dup(&sf, "corpus", &f->corpus);
	if (!rc)
		rc = meta_hex32(&sf, "corpus_crc", &f->corpus_crc);
	if (!rc && !(rc = st_meta_long(&sf, "docs", 1, LONG_MAX, &v)))
		f->docs = (uint64_t)v;
	if (!rc && !(rc = st_meta_long(&sf, "dim", 1, 1 << 20, &v)))
		f->dim = (int)v;
	if (!rc)
		rc = read_f32(&sf, "features", (int64_t)f->docs, f->dim, &f->x);
	if (!rc)
		rc = check_finite(&sf, "features", f->x, (size_t)f->docs * (size_t)f->dim);
	st_close(&sf);
	if (rc)
		features_free(f);
	return rc;
}

int features_check_corpus(const struct features *f, const char *fpath,
			  const struct tokfile *tf)
{
	if (f->corpus_crc != tf->crc || f->docs != tf->ndocs)
		return err_set(CORE_EFORMAT, fpath, "was made from '%.200s' (%llu documents, crc32 "
			       "%08x), not from '%.200s' (%llu documents, crc32 %08x)", f->corpus,
			       (unsigned long long)f->docs, (unsigned)f->corpus_crc, tf->path,
			       (unsigned long long)tf->ndocs, (unsigned)tf->crc);
	return 0;
}

/* ---- routers ------------------------------------------------------------------------------ */

static const char *const kind_names[] = {"kmeans", "logreg", "window", "transformer"};

const char *router_kind_name(enum router_kind k)
{
	return kind_names[k];
}

int router_write(const char *path, const struct router *r)
{
	char paths[16], dim[16], layer[16], prefix[16], window[16], context[16];
	const int64_t K = r->paths, D = r->dim;
	struct tensor t[5];
	const struct tensor *ts[5];
	int n = 0;

	snprintf(paths, sizeof paths, "%d", r->paths);
	snprintf(dim, sizeof dim, "%d", r->dim);
	snprintf(layer, sizeof layer, "%d", r->r.layer);
	snprintf(prefix, sizeof prefix, "%d", r->r.prefix);
	snprintf(window, sizeof window, "%d", r->window);
	snprintf(context, sizeof context, "%d", r->context);
	struct st_kv meta[] = {
		{"format", ROUTER_FORMAT}, {"version", FORMAT_VERSION},
		{"kind", kind_names[r->kind]}, {"paths", paths}, {"dim", dim},
		{"checkpoint_digest", r->r.digest}, {"layer", layer}, {"prefix", prefix},
		{"report", r->report ? r->report : "{}"}, {"window", window}, {"context", context},
	};
	const int nmeta = (int)(sizeof meta / sizeof meta[0]) - (r->kind == ROUTER_WINDOW ? 0 : 2);
	if (r->kind == ROUTER_KMEANS) {
		const int64_t ne[2] = {K, D};
		tensor_view(&t[n++], DT_F32, 2, ne, r->centroids, "centroids");
	} else {
		const int64_t nw[2] = {K, D};
		tensor_view(&t[n++], DT_F32, 1, &D, r->lr.mu, "mean");
		tensor_view(&t[n++], DT_F32, 1, &D, r->lr.sd, "std");
		tensor_view(&t[n++], DT_F32, 2, nw, r->lr.w, "weight");
		tensor_view(&t[n++], DT_F32, 1, &K, r->lr.b, "bias");
		tensor_view(&t[n++], DT_F32, 1, &K, r->lr.bias, "correction");
	}
	for (int i = 0; i < n; i++)
		ts[i] = &t[i];
	return st_write(path, ts, n, meta, nmeta);
}

void router_free(struct router *r)
{
	free(r->centroids);
	free(r->report);
	if (r->kind == ROUTER_LOGREG || r->kind == ROUTER_WINDOW)
		logreg_free(&r->lr);
	if (r->tr) {
		if (r->tr_close)
			r->tr_close(r->tr);
		free(r->tr);
	}
	memset(r, 0, sizeof *r);
}

int router_read(const char *path, struct router *r)
{
	struct st_file f;
	const char *kind;
	long v;
	int rc;

	memset(r, 0, sizeof *r);
	ERR_FORWARD(open_checked(&f, path, ROUTER_FORMAT, "router"));
	kind = st_meta(&f, "kind");
	rc = read_recipe(&f, &r->r);
	if (!rc) {
		/* the kinds a router file holds: a transformer router is a checkpoint */
		enum { FILE_KINDS = ROUTER_WINDOW + 1 };
		int k = 0;
		while (k < FILE_KINDS && !(kind && strcmp(kind, kind_names[k]) == 0))
			k++;
		if (k == FILE_KINDS)
			rc = err_set(CORE_EFORMAT, path, "router kind '%.20s' unknown (kmeans, logreg, "
				     "window)", kind ? kind : "none");
		r->kind = (enum router_kind)(k % FILE_KINDS);
	}
	if (!rc && !(rc = st_meta_long(&f, "paths", 1, ROUTE_MAX_PATHS, &v)))
		r->paths = (int)v;
	if (!rc && !(rc = st_meta_long(&f, "dim", 1, 1 << 20, &v)))
		r->dim = (int)v;
	if (!rc && r->kind == ROUTER_WINDOW) {
		if (!(rc = st_meta_long(&f, "window", 1, INT_MAX, &v)))
			r->window = (int)v;
		if (!rc && !(rc = st_meta_long(&f, "context", 1, INT_MAX, &v)))
			r->context = (int)v;
	}
	if (!rc && st_meta(&f, "report"))
		rc = meta_dup(&f, "report", &r->report);
	const size_t K = (size_t)r->paths, D = (size_t)r->dim;
	if (!rc && r->kind == ROUTER_KMEANS) {
		rc = read_f32(&f, "centroids", r->paths, r->dim, &r->centroids);
		if (!rc)
			rc = check_finite(&f, "centroids", r->centroids, K * D);
	} else if (!rc) {
		struct logreg *m = &r->lr;
		m->k = r->paths;
		m->d = r->dim;
		rc = read_f32(&f, "mean", r->dim, 0, &m->mu);
		if (!rc)
			rc = read_f32(&f, "std", r->dim, 0, &m->sd);
		if (!rc)
			rc = read_f32(&f, "weight", r->paths, r->dim, &m->w);
		if (!rc)
			rc = read_f32(&f, "bias", r->paths, 0, &m->b);
		if (!rc)
			rc = read_f32(&f, "correction", r->paths, 0, &m->bias);
		if (!rc)
			rc = check_finite(&f, "mean", m->mu, D);
		if (!rc)
			rc = check_finite(&f, "weight", m->w, K * D);
		if (!rc)
			rc = check_finite(&f, "bias", m->b, K);
		if (!rc)
			rc = check_finite(&f, "correction", m->bias, K);
		for (size_t i = 0; !rc && i < D; i++)
			if (!(m->sd[i] > 0.0f) || m->sd[i] - m->sd[i] != 0.0f)
				rc = err_set(CORE_EFORMAT, path, "tensor 'std' element %zu is not a "
					     "positive number", i);
	}
	st_close(&f);
	if (rc)
		router_free(r);
	return rc;
}

void router_route(const struct router *r, const float *x, int topn, uint32_t *out)
{
	if (r->kind == ROUTER_KMEANS) {
		float d2[2];
		kmeans_nearest(r->centroids, r->paths, r->dim, x, topn, out, d2);
	} else {
		logreg_predict(&r->lr, x, topn, out);
	}
}

/* ---- scores ------------------------------------------------------------------------------- */

uint64_t router_boundaries(uint64_t len, int prefix, int W)
{
	return len > (uint64_t)prefix + (uint64_t)W ? (len - (uint64_t)prefix - 1) / (uint64_t)W
						    : 0;
}

uint64_t router_boundary(int prefix, int W, uint64_t m)
{
	return (uint64_t)prefix + (m + 1) * (uint64_t)W;
}

uint64_t router_last_boundary(uint64_t n, int prefix, int W)
{
	const uint64_t nb = W ? router_boundaries(n + 1, prefix, W) : 0;
	return nb ? router_boundary(prefix, W, nb - 1) : 0;
}

uint32_t scores_best_path(const struct scores *s, uint64_t j0, uint64_t j1, float *score)
{
	const size_t P = (size_t)s->paths;
	uint32_t best = 0;
	double bv = -INFINITY;
	for (size_t p = 0; p < P; p++) {
		double v = 0;
		for (uint64_t j = j0; j < j1; j++)
			v += s->logprob[j * P + p];
		if (score)
			score[p] = (float)v;
		if (v > bv)
			bv = v, best = (uint32_t)p;
	}
	return best;
}

int scores_write(const char *path, const struct scores *s)
{
	char crc[16], docs[24], tokens[24], paths[16], prefix[16];
	const int64_t nl[2] = {(int64_t)s->tokens, s->paths}, nd[2] = {(int64_t)s->docs, s->paths};
	struct tensor t[2];
	const struct tensor *ts[] = {&t[0], &t[1]};

	snprintf(crc, sizeof crc, "%08x", (unsigned)s->corpus_crc);
	snprintf(docs, sizeof docs, "%llu", (unsigned long long)s->docs);
	snprintf(tokens, sizeof tokens, "%llu", (unsigned long long)s->tokens);
	snprintf(paths, sizeof paths, "%d", s->paths);
	snprintf(prefix, sizeof prefix, "%d", s->prefix);
	const struct st_kv meta[] = {
		{"format", SCORES_FORMAT}, {"version", FORMAT_VERSION}, {"corpus", s->corpus},
		{"corpus_crc", crc}, {"docs", docs}, {"tokens", tokens}, {"paths", paths},
		{"prefix", prefix}, {"path_digests", s->digests}, {"source", s->source},
	};
	tensor_view(&t[0], DT_F32, 2, nl, s->logprob, "logprob");
	tensor_view(&t[1], DT_F32, 2, nd, s->doc, "doc_logprob");
	return st_write(path, ts, 2, meta, (int)(sizeof meta / sizeof meta[0]));
}

void scores_free(struct scores *s)
{
	free(s->corpus);
	free(s->source);
	free(s->digests);
	free(s->logprob);
	free(s->doc);
	memset(s, 0, sizeof *s);
}

int scores_read(const char *path, struct scores *s)
{
	struct st_file f;
	long v;
	int rc;

	memset(s, 0, sizeof *s);
	ERR_FORWARD(open_checked(&f, path, SCORES_FORMAT, "scores"));
	rc = meta_dup(&f, "corpus", &s->corpus);
	if (!rc)
		rc = meta_dup(&f, "source", &s->source);
	if (!rc)
		rc = meta_dup(&f, "path_digests", &s->digests);
	if (!rc)
		rc = meta_hex32(&f, "corpus_crc", &s->corpus_crc);
	if (!rc && !(rc = st_meta_long(&f, "docs", 1, LONG_MAX, &v)))
		s->docs = (uint64_t)v;
	if (!rc && !(rc = st_meta_long(&f, "tokens", 0, LONG_MAX, &v)))
		s->tokens = (uint64_t)v;
	if (!rc && !(rc = st_meta_long(&f, "paths", 1, ROUTE_MAX_PATHS, &v)))
		s->paths = (int)v;
	if (!rc && !(rc = st_meta_long(&f, "prefix", 0, INT_MAX, &v)))
		s->prefix = (int)v;
	if (!rc)
		rc = read_f32(&f, "logprob", (int64_t)s->tokens, s->paths, &s->logprob);
	if (!rc)
		rc = read_f32(&f, "doc_logprob", (int64_t)s->docs, s->paths, &s->doc);
	if (!rc)
		rc = check_finite(&f, "doc_logprob", s->doc, (size_t)s->docs * (size_t)s->paths);
	if (!rc)
		rc = check_finite(&f, "logprob", s->logprob, (size_t)s->tokens * (size_t)s->paths);
	st_close(&f);
	if (rc)
		scores_free(s);
	return rc;
}

int scores_check_corpus(const struct scores *s, const char *spath, const struct tokfile *tf)
{
	if (s->corpus_crc != tf->crc || s->docs != tf->ndocs || s->tokens != tf->ntokens)
		return err_set(CORE_EFORMAT, spath, "scores '%.200s' (%llu documents, crc32 %08x), "
			       "not '%.200s' (%llu documents, crc32 %08x)", s->corpus,
			       (unsigned long long)s->docs, (unsigned)s->corpus_crc, tf->path,
			       (unsigned long long)tf->ndocs, (unsigned)tf->crc);
	return 0;
}
