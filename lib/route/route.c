/* route.c - features, scores, router fitting and routed evaluation; see route.h. */
#include "route/route.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/progress.h"
#include "common/rng.h"
#include "route/kmeans.h"
#include "route/logreg.h"
#include "route/wrouter.h"

#include "common/banned.h"

#define FEATURE_BATCH_TOKENS 4096

int route_features(struct lm *base, const struct tokfile *tf, int prefix, int layer,
		   struct features *out, void (*progress)(void *ctx, uint64_t done), void *ctx)
{
	const int C = base->g.cfg.n_embd;
	memset(out, 0, sizeof *out);
	out->x = malloc((size_t)tf->ndocs * (size_t)C * sizeof(float) + 1);
	out->checkpoint = strdup(base->path);
	out->corpus = strdup(tf->path);
	if (!out->x || !out->checkpoint || !out->corpus) {
		features_free(out);
		return err_set(CORE_ENOMEM, tf->path, "cannot allocate %llu features of %d",
			       (unsigned long long)tf->ndocs, C);
	}
	memcpy(out->r.digest, base->digest, sizeof out->r.digest);
	out->r.layer = layer;
	out->r.prefix = prefix;
	out->corpus_crc = tf->crc;
	out->docs = tf->ndocs;
	out->dim = C;
	int rc = lm_prefix_features(base, tf, 0, tf->ndocs, prefix, layer, out->x, progress, ctx);
	if (rc)
		features_free(out);
	return rc;
}

int route_check_recipe(const struct recipe *want, const char *path, const struct recipe *have,
		       const char *what)
{
	if (strcmp(want->digest, have->digest) || want->layer != have->layer ||
	    want->prefix != have->prefix)
		return err_set(CORE_EFORMAT, path, "made from checkpoint %s (block %d, prefix %d), "
			       "but %s is checkpoint %s (block %d, prefix %d)", want->digest,
			       want->layer, want->prefix, what, have->digest, have->layer,
			       have->prefix);
	return 0;
}

static uint64_t max_doc_len(const struct tokfile *tf)
{
	uint64_t m = 1;
	for (uint64_t d = 0; d < tf->ndocs; d++)
		if (tf->offsets[d + 1] - tf->offsets[d] > m)
			m = tf->offsets[d + 1] - tf->offsets[d];
	return m;
}

int route_score(struct lm *paths, int npaths, const struct tokfile *tf, int prefix,
		struct scores *out, void (*progress)(void *ctx, uint64_t done), void *ctx)
{
	const size_t P = (size_t)npaths;
	float *lp = malloc(max_doc_len(tf) * sizeof *lp);
	double *sum = calloc(tf->ndocs * P + 1, sizeof *sum);
	int rc = 0;

	memset(out, 0, sizeof *out);
	out->logprob = calloc(tf->ntokens * P + 1, sizeof(float));
	out->doc = calloc(tf->ndocs * P + 1, sizeof(float));
	out->corpus = strdup(tf->path);
	if (!lp || !sum || !out->logprob || !out->doc || !out->corpus) {
		rc = err_set(CORE_ENOMEM, tf->path, "cannot allocate the scores of %d paths",
			     npaths);
		goto out;
	}
	out->corpus_crc = tf->crc;
	out->docs = tf->ndocs;
	out->tokens = tf->ntokens;
	out->paths = npaths;
	out->prefix = prefix;
	for (size_t p = 0; p < P && !rc; p++) {
		for (uint64_t d = 0; d < tf->ndocs && !rc; d++) {
			const uint64_t s0 = tf->offsets[d], len = tf->offsets[d + 1] - s0;
			if (!len)
				continue;
			if ((rc = lm_doc_logprobs(&paths[p], tf, d, NULL, lp, NULL)) < 0)
				break;
			for (uint64_t j = 0; j < len; j++) {
				out->logprob[(s0 + j) * P + p] = lp[j];
				if (j >= (uint64_t)prefix)
					sum[d * P + p] += lp[j];
			}
			if (progress)
				progress(ctx, p * tf->ndocs + d + 1);
		}
	}
	for (uint64_t i = 0; i < tf->ndocs * P; i++)
		out->doc[i] = (float)sum[i];
out:
	free(lp);
	free(sum);
	if (rc)
		scores_free(out);
	return rc;
}

int route_window_features(struct lm *base, const struct tokfile *tf, uint64_t d, int layer,
			  int prefix, int context, int W, float *hidden, float *out, int *nb)
{
	const uint64_t len = tf->offsets[d + 1] - tf->offsets[d];
	const size_t C = (size_t)base->g.cfg.n_embd;
	*nb = 0;
	if (!router_boundaries(len, prefix, W))
		return 0;
	ERR_FORWARD(lm_doc_hidden(base, tf, d, layer, hidden, NULL));
	/* running sums: cum over [0, done), lag over [0, lagged); each position added once to
	 * each, so a boundary costs O(C) whatever the context */
	double *cum = calloc(2 * C, sizeof *cum), *lag = cum + C;
	if (!cum)
		return err_set(CORE_ENOMEM, tf->path, "out of memory");
	uint64_t done = 0, lagged = 0;
	for (uint64_t b = (uint64_t)prefix + (uint64_t)W; b < len; b += (uint64_t)W) {
		const uint64_t a = b > (uint64_t)context ? b - (uint64_t)context : 0;
		for (; done < b; done++)
			for (size_t c = 0; c < C; c++)
				cum[c] += hidden[done * C + c];
		for (; lagged < a; lagged++)
			for (size_t c = 0; c < C; c++)
				lag[c] += hidden[lagged * C + c];
		float *o = out + (size_t)*nb * 2 * C;
		for (size_t c = 0; c < C; c++) {
			o[c] = (float)((cum[c] - lag[c]) / (double)(b - a));
			o[C + c] = (float)(cum[c] / (double)b);
		}
		(*nb)++;
	}
	free(cum);
	return 0;
}

int route_text_path(struct lm *base, const struct router *doc, const struct router *win,
		    const uint32_t *tok, uint64_t n, uint32_t *path, uint64_t *boundary)
{
	const int prefix = doc->r.prefix, C = base->g.cfg.n_embd;
	const int W = win ? win->window : 0;
	if (W && win->kind == ROUTER_TRANSFORMER && n >= (uint64_t)prefix + (uint64_t)W) {
		*boundary = router_last_boundary(n, prefix, W);
		return wrouter_text_path(win->tr, tok, *boundary, path);
	}
	/* One document in memory: the text, and one more (placeholder) token so that the
	 * boundary at n itself is inside it (a boundary's features read positions before it
	 * only: the placeholder changes nothing). */
	uint32_t *t = malloc((size_t)(n + 1) * sizeof *t);
	uint64_t off[2] = {0, n + 1};
	const uint64_t nb_max = W ? (n + 1) / (uint64_t)W + 1 : 1;
	float *hidden = W && n >= (uint64_t)prefix + (uint64_t)W ?
				malloc((size_t)(n + 1) * (size_t)C * sizeof(float)) : NULL;
	float *feat = malloc((size_t)nb_max * 2 * (size_t)C * sizeof(float));
	int rc = 0;

	if (!t || !feat || (W && n >= (uint64_t)prefix + (uint64_t)W && !hidden)) {
		rc = err_set(CORE_ENOMEM, NULL, "out of memory for routing");
		goto out;
	}
	memcpy(t, tok, (size_t)n * sizeof *t);
	t[n] = 0;
	struct tokfile tf = {.path = "<text>", .vocab = (uint32_t)base->g.cfg.vocab_size,
			     .width = 4, .ndocs = 1, .ntokens = n + 1, .offsets = off,
			     .tokens = t};
	if (hidden) {
		int nb = 0;
		rc = route_window_features(base, &tf, 0, win->r.layer, prefix, win->context, W,
					   hidden, feat, &nb);
		if (rc == 0 && nb > 0) {
			router_route(win, feat + (size_t)(nb - 1) * 2 * (size_t)C, 1, path);
			*boundary = router_boundary(prefix, W, (uint64_t)nb - 1);
			goto out;
		}
		if (rc < 0)
			goto out;
	}
	/* The document router reads the first min(n, prefix) tokens: the text, not the
	 * placeholder. */
	off[1] = n;
	tf.ntokens = n;
	rc = lm_prefix_features(base, &tf, 0, 1, prefix, doc->r.layer, feat, NULL, NULL);
	if (rc == 0) {
		router_route(doc, feat, 1, path);
		*boundary = n < (uint64_t)prefix ? n : (uint64_t)prefix;
	}
out:
	free(t);
	free(hidden);
	free(feat);
	return rc;
}

/* ---- rows to fit routers on --------------------------------------------------------------- */

int route_doc_rows(const struct scores *s, const struct features *f, const struct tokfile *tf,
		   float **x, uint32_t **y, float **score, uint64_t *n)
{
	const size_t P = (size_t)s->paths;
	*x = malloc(f->docs * (size_t)f->dim * sizeof **x + 1);
	*y = malloc(f->docs * sizeof **y + 1);
	*score = malloc(f->docs * P * sizeof **score + 1);
	*n = 0;
	if (!*x || !*y || !*score)
		return err_set(CORE_ENOMEM, NULL, "out of memory for %llu rows",
			       (unsigned long long)f->docs);
	for (uint64_t d = 0; d < f->docs; d++) {
		if (tf->offsets[d + 1] - tf->offsets[d] <= (uint64_t)s->prefix)
			continue;
		const float *sc = s->doc + d * (uint64_t)s->paths;
		uint32_t b = 0;
		for (int p = 1; p < s->paths; p++)
			if (sc[p] > sc[b])
				b = (uint32_t)p;
		memcpy(*x + *n * (uint64_t)f->dim, f->x + d * (uint64_t)f->dim,
		       sizeof **x * (size_t)f->dim);
		memcpy(*score + *n * P, sc, sizeof **score * P);
		(*y)[(*n)++] = b;
	}
	return 0;
}

uint64_t route_window_count(const struct tokfile *tf, int prefix, int W)
{
	uint64_t rows = 0;
	for (uint64_t d = 0; d < tf->ndocs; d++)
		rows += router_boundaries(tf->offsets[d + 1] - tf->offsets[d], prefix, W);
	return rows;
}

/* The labels of document d's boundaries into y, and (score not NULL) each window's
 * log-likelihood under every path into score [boundaries, paths]. */
static void doc_window_labels(const struct scores *s, const struct tokfile *tf, uint64_t d,
			      int W, uint32_t *y, float *score)
{
	const uint64_t s0 = tf->offsets[d], len = tf->offsets[d + 1] - s0;
	const uint64_t nb = router_boundaries(len, s->prefix, W);
	for (uint64_t m = 0; m < nb; m++) {
		const uint64_t b = router_boundary(s->prefix, W, m);
		const uint64_t e = b + (uint64_t)W < len ? b + (uint64_t)W : len;
		y[m] = scores_best_path(s, s0 + b, s0 + e, score ? score + m * (size_t)s->paths : NULL);
	}
}

void route_window_labels(const struct scores *s, const struct tokfile *tf, int W, uint32_t *y)
{
	for (uint64_t d = 0, n = 0; d < tf->ndocs; d++) {
		doc_window_labels(s, tf, d, W, y + n, NULL);
		n += router_boundaries(tf->offsets[d + 1] - tf->offsets[d], s->prefix, W);
	}
}

int route_window_rows(const struct scores *s, struct lm *base, const struct tokfile *tf,
		      int layer, int context, int W, float **x, uint32_t **y, float **score,
		      uint64_t *n, void (*progress)(void *ctx, uint64_t done), void *ctx)
{
	const size_t C = (size_t)base->g.cfg.n_embd;
	const uint64_t rows = route_window_count(tf, s->prefix, W);
	uint64_t maxlen = 1;
	for (uint64_t d = 0; d < tf->ndocs; d++) {
		uint64_t len = tf->offsets[d + 1] - tf->offsets[d];
		maxlen = len > maxlen ? len : maxlen;
	}
	*n = 0;
	*x = malloc(rows * 2 * C * sizeof **x + 1);
	*y = malloc(rows * sizeof **y + 1);
	*score = malloc(rows * (size_t)s->paths * sizeof **score + 1);
	float *hidden = malloc(maxlen * C * sizeof *hidden);
	int rc = 0;
	if (!*x || !*y || !*score || !hidden)
		rc = err_set(CORE_ENOMEM, NULL, "cannot allocate %llu rows of %zu",
			     (unsigned long long)rows, 2 * C);
	for (uint64_t d = 0; rc == 0 && d < tf->ndocs; d++) {
		int nb;
		rc = route_window_features(base, tf, d, layer, s->prefix, context, W, hidden,
					   *x + *n * 2 * C, &nb);
		if (rc < 0)
			break;
		doc_window_labels(s, tf, d, W, *y + *n, *score + *n * (size_t)s->paths);
		*n += (uint64_t)nb;
		if (progress)
			progress(ctx, d + 1);
	}
	free(hidden);
	return rc;
}

/* ---- the routers of an evaluation --------------------------------------------------------- */

int route_check_routers(struct router *doc, int *have_doc, const char *doc_path,
			const struct router *win, const char *const *wpaths, int nw,
			const struct lm *base, const char *model, int npaths, int prefix,
			const char *cmd)
{
	if (!*have_doc && npaths > 1)
		return err_set(CORE_EUSAGE, NULL, "%s: %d paths need a --router", cmd, npaths);
	if (!*have_doc) {
		/* one path: a router that sends everything to it */
		*doc = (struct router){.kind = ROUTER_KMEANS, .paths = 1,
				       .dim = base->g.cfg.n_embd,
				       .r = {.layer = base->g.cfg.n_layer - 1, .prefix = prefix}};
		memcpy(doc->r.digest, base->digest, sizeof doc->r.digest);
		doc->centroids = calloc((size_t)doc->dim, sizeof(float));
		*have_doc = 1;
		if (!doc->centroids)
			return err_set(CORE_ENOMEM, NULL, "out of memory");
	}
	if (doc->paths != npaths)
		return err_set(CORE_ESHAPE, doc_path, "routes to %d paths, the model has %d",
			       doc->paths, npaths);
	/* the routers' features come from the base given */
	if (strcmp(doc->r.digest, base->digest))
		return err_set(CORE_EFORMAT, doc_path, "was fitted on features of checkpoint %s, "
			       "but --model '%s' is %s", doc->r.digest, model, base->digest);
	if (doc->dim != base->g.cfg.n_embd)
		return err_set(CORE_ESHAPE, doc_path, "has %d features, the base model %d",
			       doc->dim, base->g.cfg.n_embd);
	for (int i = 0; i < nw; i++) {
		if (win[i].paths != npaths)
			return err_set(CORE_ESHAPE, wpaths[i], "routes to %d paths, the model has "
				       "%d", win[i].paths, npaths);
		if (win[i].kind == ROUTER_TRANSFORMER && strcmp(win[i].r.digest, base->digest))
			return err_set(CORE_EFORMAT, wpaths[i], "was fine-tuned from checkpoint %s, "
				       "but --model '%s' is %s", win[i].r.digest, model,
				       base->digest);
		if (win[i].kind != ROUTER_TRANSFORMER && (strcmp(win[i].r.digest, base->digest) ||
							  win[i].dim != 2 * base->g.cfg.n_embd))
			return err_set(CORE_EFORMAT, wpaths[i], "was fitted on features of "
				       "checkpoint %s (%d values), but --model '%s' is %s (%d)",
				       win[i].r.digest, win[i].dim, model, base->digest,
				       2 * base->g.cfg.n_embd);
		if (win[i].r.prefix != doc->r.prefix)
			return err_set(CORE_EFORMAT, wpaths[i], "has windows from token %d, the "
				       "document router's prefix is %d", win[i].r.prefix,
				       doc->r.prefix);
	}
	if (doc->r.prefix > base->g.cfg.seq_len)
		return err_set(CORE_EFORMAT, doc_path, "prefix %d is longer than the context %d",
			       doc->r.prefix, base->g.cfg.seq_len);
	return 0;
}

/* ---- fitting ------------------------------------------------------------------------------ */

static json_t *counts_json(const uint64_t *c, int k)
{
	json_t *a = json_array();
	for (int i = 0; a && i < k; i++)
		json_array_append_new(a, json_integer((json_int_t)c[i]));
	return a;
}

/* Accuracy of m on rows idx[0..n) and its per-path prediction counts (added to counts). */
static double accuracy(const struct logreg *m, const float *x, const uint32_t *y,
		       const uint64_t *idx, uint64_t n, int dim, uint64_t *counts)
{
	uint64_t ok = 0;
	for (uint64_t i = 0; i < n; i++) {
		uint32_t p;
		logreg_predict(m, x + idx[i] * (uint64_t)dim, 1, &p);
		ok += p == y[idx[i]];
		if (counts)
			counts[p]++;
	}
	return n ? (double)ok / (double)n : NAN;
}

/* Targets for the bias correction: the labels' counts, with every path raised to at least
 * min_share of an even share (taken from the largest), so that no path is starved. */
static void bias_targets(const uint32_t *y, const uint64_t *idx, uint64_t n, int k,
			 double min_share, uint64_t *t)
{
	memset(t, 0, sizeof *t * (size_t)k);
	for (uint64_t i = 0; i < n; i++)
		t[y[idx[i]]]++;
	const uint64_t floor_n = (uint64_t)floor((double)n * min_share / k);
	for (int p = 0; p < k; p++)
		while (t[p] < floor_n) {
			int big = 0;
			for (int q = 1; q < k; q++)
				if (t[q] > t[big])
					big = q;
			if (t[big] <= floor_n)
				break;
			t[big]--;
			t[p]++;
		}
}

/* Fit on rows idx[0..n) and correct the bias to targets. */
static int fit_rows(const float *x, const uint32_t *y, const uint64_t *idx, uint64_t n, int dim,
		    int k, const struct route_fit_opts *o, const uint64_t *targets,
		    struct logreg *m, struct logreg_fit_report *rep)
{
	float *xs = malloc((size_t)n * (size_t)dim * sizeof *xs + 1);
	uint32_t *ys = malloc((size_t)n * sizeof *ys + 1);
	int rc;
	if (!xs || !ys) {
		free(xs);
		free(ys);
		return err_set(CORE_ENOMEM, NULL, "cannot copy %llu rows",
			       (unsigned long long)n);
	}
	for (uint64_t i = 0; i < n; i++) {
		memcpy(xs + i * (uint64_t)dim, x + idx[i] * (uint64_t)dim, sizeof *xs * (size_t)dim);
		ys[i] = y[idx[i]];
	}
	rc = logreg_fit(m, xs, ys, (size_t)n, dim, k, o->l2, o->max_iter, rep);
	if (!rc && targets)
		rc = logreg_fit_bias(m, xs, (size_t)n, targets);
	free(xs);
	free(ys);
	return rc;
}

/* The labels fitted on into *yl: y itself, or, when score is given and the floor of
 * min_share raises some path's count, the assignment of the largest total score with the
 * floored counts (*yl then allocated, *moved the rows whose label it changed). A path that
 * no row prefers gets the rows that lose least by going to it, so the paths fitted are
 * told apart: two such paths left without rows would get equal weights and equal logits,
 * and no bias could then share rows between them. */
static int floor_labels(const uint32_t *y, const float *score, uint64_t n, int k,
			const uint64_t *all, double min_share, const uint64_t *counts,
			uint64_t *tg, uint32_t **yl, uint64_t *moved)
{
	*yl = (uint32_t *)y;
	*moved = 0;
	if (!score || !(min_share > 0))
		return 0;
	bias_targets(y, all, n, k, min_share, tg);
	if (!memcmp(tg, counts, sizeof *tg * (size_t)k))
		return 0;
	uint32_t *a = malloc(n * sizeof *a + 1);
	if (!a)
		return err_set(CORE_ENOMEM, NULL, "out of memory for %llu labels",
			       (unsigned long long)n);
	int rc = logreg_assign(score, (size_t)n, k, tg, a);
	if (rc < 0) {
		free(a);
		return rc;
	}
	for (uint64_t i = 0; i < n; i++)
		*moved += a[i] != y[i];
	*yl = a;
	return 0;
}

int route_fit_logreg(const float *x, const uint32_t *y0, const float *score, uint64_t n,
		     int dim, int paths, const struct route_fit_opts *o, struct logreg *out,
		     char **report)
{
	uint32_t *y = NULL;
	uint64_t moved = 0;
	uint64_t *tr = malloc(n * sizeof *tr + 1), *ho = malloc(n * sizeof *ho + 1), *all = NULL;
	uint64_t ntr = 0, nho = 0, *c = calloc(6 * (size_t)paths, sizeof *c), *tg;
	struct logreg m = {0};
	struct logreg_fit_report rep = {0};
	json_t *j = NULL;
	int rc = 0;

	memset(out, 0, sizeof *out);
	*report = NULL;
	all = malloc(n * sizeof *all + 1);
	if (!tr || !ho || !c || !all) {
		rc = err_set(CORE_ENOMEM, NULL, "out of memory");
		goto out;
	}
	tg = c + 5 * (size_t)paths;
	for (uint64_t i = 0; i < n; i++) {
		all[i] = i;
		if (rng_uniform(o->seed, RNG_STREAM_HOLDOUT, i) < o->holdout)
			ho[nho++] = i;
		else
			tr[ntr++] = i;
	}
	if (ntr < 2) {
		rc = err_set(CORE_EUSAGE, NULL, "%llu rows leave %llu to fit on",
			     (unsigned long long)n, (unsigned long long)ntr);
		goto out;
	}
	/* c[0]: labels fitted, c[1]: predictions before the correction, c[2]: after (all
	 * rows), c[3]: the best paths (the labels given) */
	uint64_t *best = c + 3 * (size_t)paths;
	for (uint64_t i = 0; i < n; i++)
		best[y0[i]]++;
	if ((rc = floor_labels(y0, score, n, paths, all, o->min_share, best, tg, &y, &moved)) < 0)
		goto out;
	for (uint64_t i = 0; i < n; i++)
		c[y[i]]++;
	/* One fit on the training rows serves both sides of the report: the correction only sets
	 * m.bias, so with it zeroed the model is the uncorrected one. */
	bias_targets(y, tr, ntr, paths, o->min_share, tg);
	if ((rc = fit_rows(x, y, tr, ntr, dim, paths, o, tg, &m, &rep)) < 0)
		goto out;
	const double acc_tr1 = accuracy(&m, x, y, tr, ntr, dim, NULL);
	const double acc_ho1 = accuracy(&m, x, y, ho, nho, dim, NULL);
	memset(m.bias, 0, sizeof *m.bias * (size_t)paths);
	const double acc_tr0 = accuracy(&m, x, y, tr, ntr, dim, NULL);
	const double acc_ho0 = accuracy(&m, x, y, ho, nho, dim, NULL);
	accuracy(&m, x, y, all, n, dim, c + paths);
	logreg_free(&m);
	/* the router kept: all rows, corrected to all rows' targets (or not) */
	bias_targets(y, all, n, paths, o->min_share, tg);
	if ((rc = fit_rows(x, y, all, n, dim, paths, o, o->correct ? tg : NULL, out, &rep)) < 0)
		goto out;
	accuracy(out, x, y, all, n, dim, c + 2 * (size_t)paths);
	j = json_pack("{s:I,s:I,s:I,s:f,s:b,s:f,s:f,s:i,s:{s:f,s:f},s:{s:f,s:f},s:o,s:o,s:I,s:o,"
		      "s:o,s:o}",
		      "rows", (json_int_t)n, "train_rows", (json_int_t)ntr, "heldout_rows",
		      (json_int_t)nho, "l2", o->l2, "corrected", o->correct, "min_share",
		      o->min_share, "loss", rep.loss, "iterations",
		      rep.iterations, "before_correction", "train_accuracy", acc_tr0,
		      "heldout_accuracy", nho ? acc_ho0 : -1.0, "after_correction",
		      "train_accuracy", acc_tr1, "heldout_accuracy", nho ? acc_ho1 : -1.0,
		      "best_path_counts", counts_json(best, paths), "label_counts",
		      counts_json(c, paths), "relabelled", (json_int_t)moved, "target_counts",
		      counts_json(tg, paths), "predicted_before", counts_json(c + paths, paths),
		      "predicted_after", counts_json(c + 2 * (size_t)paths, paths));
	if (!j || !(*report = json_dumps(j, JSON_COMPACT)))
		rc = err_set(CORE_ENOMEM, NULL, "cannot build the report");
out:
	json_decref(j);
	logreg_free(&m);
	if (rc)
		logreg_free(out);
	if (y != y0)
		free(y);
	free(tr);
	free(ho);
	free(all);
	free(c);
	return rc;
}

/* ---- evaluation --------------------------------------------------------------------------- */

struct eval_ctx {
	struct lm *paths, *base;
	int npaths, prefix, from, layer, S, C; /* from: the first position scored, >= prefix */
	const struct tokfile *tf;
	float **lp;           /* [npaths][maxlen] */
	unsigned char **need; /* [npaths][windows] */
	uint32_t *win_path;   /* per scored window */
	float *hidden, *wfeat, *dfeat;
};

/* Score document d from position e->from on with window_path[m] the path of window m
 * (windows of W tokens from prefix; W = 0: one window): each path runs only the lm windows
 * holding its positions. */
static int score_doc(struct eval_ctx *e, uint64_t d, int W, int nwin, struct route_eval_mode *r)
{
	const uint64_t len = e->tf->offsets[d + 1] - e->tf->offsets[d];
	const uint64_t S = (uint64_t)e->S, nlm = (len - 1 + S - 1) / S;
	for (int p = 0; p < e->npaths; p++)
		memset(e->need[p], 0, nlm);
	/* target j is predicted by lm window (j - 1) / S */
	for (uint64_t j = (uint64_t)e->from; j < len; j++) {
		const uint64_t m = W ? (j - (uint64_t)e->prefix) / (uint64_t)W : 0;
		e->need[e->win_path[m < (uint64_t)nwin ? m : (uint64_t)nwin - 1]][(j - 1) / S] = 1;
	}
	for (int p = 0; p < e->npaths; p++) {
		int any = 0;
		for (uint64_t w = 0; w < nlm; w++)
			any |= e->need[p][w];
		if (any)
			ERR_FORWARD(lm_doc_logprobs(&e->paths[p], e->tf, d, e->need[p], e->lp[p],
						    &r->forwarded));
	}
	for (uint64_t j = (uint64_t)e->from; j < len; j++) {
		const uint64_t m = W ? (j - (uint64_t)e->prefix) / (uint64_t)W : 0;
		r->nll -= e->lp[e->win_path[m < (uint64_t)nwin ? m : (uint64_t)nwin - 1]][j];
		r->tokens++;
	}
	for (int m = 1; m < nwin; m++)
		r->switches += e->win_path[m] != e->win_path[m - 1];
	return 0;
}

static int eval_mode(struct eval_ctx *e, const struct router *doc, const struct router *wr,
		     struct route_eval_mode *r, void (*progress)(void *ctx, uint64_t done),
		     void *ctx, uint64_t *done)
{
	const struct tokfile *tf = e->tf;
	const double t0 = now_seconds();
	const int W = wr ? wr->window : 0;

	for (uint64_t d = 0; d < tf->ndocs; d++) {
		const uint64_t len = tf->offsets[d + 1] - tf->offsets[d];
		if (len > (uint64_t)e->from) {
			ERR_FORWARD(lm_prefix_features(e->base, tf, d, 1, e->prefix, e->layer,
						       e->dfeat, NULL, NULL));
			r->base_tokens += (uint64_t)e->prefix;
			router_route(doc, e->dfeat, 1, &e->win_path[0]);
			int nwin = 1, nb = 0;
			if (W && wr->kind == ROUTER_TRANSFORMER) {
				uint64_t fwd = 0;
				ERR_FORWARD(wrouter_doc_paths(wr->tr, tf, d, e->prefix, W,
							      &e->win_path[1], &fwd));
				r->base_tokens += fwd;
				nwin = (int)router_boundaries(len, e->prefix, W) + 1;
			} else if (W) {
				ERR_FORWARD(route_window_features(e->base, tf, d, wr->r.layer,
								  e->prefix, wr->context, W,
								  e->hidden, e->wfeat, &nb));
				if (nb)
					r->base_tokens += len;
				for (int m = 0; m < nb; m++)
					router_route(wr, e->wfeat + (size_t)m * 2 * (size_t)e->C, 1,
						     &e->win_path[m + 1]);
				nwin = nb + 1;
			}
			ERR_FORWARD(score_doc(e, d, W, nwin, r));
		}
		if (progress)
			progress(ctx, ++*done);
	}
	r->seconds = now_seconds() - t0;
	return 0;
}

int route_evaluate(struct lm *paths, int npaths, struct lm *base, const struct router *doc,
		   const struct router *const *windows, int nwindows, const struct tokfile *tf,
		   int score_from, struct route_eval_mode *modes,
		   void (*progress)(void *ctx, uint64_t done), void *ctx)
{
	const uint64_t maxlen = max_doc_len(tf);
	struct eval_ctx e = {
		.paths = paths, .base = base, .npaths = npaths, .prefix = doc->r.prefix,
		.from = score_from ? score_from : doc->r.prefix,
		.layer = doc->r.layer, .S = paths[0].g.cfg.seq_len, .C = base->g.cfg.n_embd,
		.tf = tf,
	};
	uint64_t done = 0;
	int rc = 0, minW = 0;

	if (e.from < e.prefix)
		return err_set(CORE_EUSAGE, tf->path, "scoring from token %d would score the %d "
			       "tokens the router reads", e.from, e.prefix);
	for (int i = 0; i < nwindows; i++)
		if (!minW || windows[i]->window < minW)
			minW = windows[i]->window;
	const uint64_t maxwin = minW ? maxlen / (uint64_t)minW + 2 : 1;
	e.lp = calloc((size_t)npaths, sizeof *e.lp);
	e.need = calloc((size_t)npaths, sizeof *e.need);
	e.win_path = malloc(maxwin * sizeof *e.win_path);
	e.hidden = malloc(maxlen * (size_t)e.C * sizeof(float));
	e.wfeat = malloc(maxwin * 2 * (size_t)e.C * sizeof(float));
	e.dfeat = malloc((size_t)e.C * sizeof(float));
	rc = !e.lp || !e.need || !e.win_path || !e.hidden || !e.wfeat || !e.dfeat;
	for (int p = 0; !rc && p < npaths; p++) {
		e.lp[p] = calloc(maxlen, sizeof(float));
		e.need[p] = calloc(maxlen / (uint64_t)e.S + 2, 1);
		rc = !e.lp[p] || !e.need[p];
	}
	if (rc) {
		rc = err_set(CORE_ENOMEM, tf->path, "cannot allocate the evaluation's buffers");
		goto out;
	}
	for (int i = 0; i <= nwindows && !rc; i++) {
		struct route_eval_mode *r = &modes[i];
		memset(r, 0, sizeof *r);
		r->window = i ? windows[i - 1]->window : 0;
		r->transformer = i && windows[i - 1]->kind == ROUTER_TRANSFORMER;
		rc = eval_mode(&e, doc, i ? windows[i - 1] : NULL, r, progress, ctx, &done);
	}
out:
	for (int p = 0; p < npaths && e.lp; p++)
		free(e.lp[p]);
	for (int p = 0; p < npaths && e.need; p++)
		free(e.need[p]);
	free(e.lp);
	free(e.need);
	free(e.win_path);
	free(e.hidden);
	free(e.wfeat);
	free(e.dfeat);
	return rc;
}

/* ---- the k-means router ------------------------------------------------------------------- */

int route_kmeans(const struct features *f, const char *name, const struct kmeans_opts *o,
		 struct router *r)
{
	struct kmeans_report rep = {0};
	uint32_t *assign = NULL;
	uint64_t *n = NULL;
	json_t *rj = NULL;
	int rc;

	*r = (struct router){.kind = ROUTER_KMEANS, .paths = o->k, .dim = f->dim, .r = f->r};
	if (f->docs < (uint64_t)o->k)
		return err_set(CORE_ESHAPE, name, "%llu documents cannot make %d clusters",
			       (unsigned long long)f->docs, o->k);
	r->centroids = malloc((size_t)o->k * (size_t)f->dim * sizeof(float));
	assign = malloc(f->docs * sizeof *assign);
	n = calloc((size_t)o->k, sizeof *n);
	if (!r->centroids || !assign || !n) {
		rc = err_set(CORE_ENOMEM, name, "out of memory");
		goto out;
	}
	rc = kmeans_fit(f->x, f->docs, f->dim, o, r->centroids, assign, &rep);
	if (rc)
		goto out;
	json_t *sizes = json_array();
	for (uint64_t d = 0; d < f->docs; d++)
		n[assign[d]]++;
	for (int i = 0; sizes && i < o->k; i++)
		json_array_append_new(sizes, json_integer((json_int_t)n[i]));
	rj = json_pack("{s:s,s:I,s:i,s:f,s:i,s:i,s:o}", "features", name, "docs",
		       (json_int_t)f->docs, "restarts", o->restarts, "inertia", rep.inertia,
		       "iterations", rep.iterations, "best_restart", rep.best_restart, "sizes",
		       sizes);
	if (!rj || !(r->report = json_dumps(rj, JSON_COMPACT)))
		rc = err_set(CORE_ENOMEM, name, "out of memory");
out:
	json_decref(rj);
	kmeans_report_free(&rep);
	free(assign);
	free(n);
	return rc;
}
