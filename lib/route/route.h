/* route.h - DiPaCo's routing (paper section 2.4) on top of the files of routefile.h: features
 * of documents and of windows, scoring paths, fitting routers, and evaluating a DiPaCo with
 * test-time routing.
 *
 * Window routing (section 2.4.3). A document is scored from position prefix on, in windows of
 * W tokens: window 0 is [prefix, prefix + W), window m is [prefix + m W, prefix + (m + 1) W).
 * Window 0 goes to the document router's path (so W larger than every document is routing
 * once per document); window m >= 1 goes to the path a window router predicts from the text
 * before it, [0, b) with b = prefix + m W. Its features are two means of the base model's
 * block-`layer` output: over the last `context` tokens [b - context, b) and over the whole
 * [0, b), concatenated (2 C values). It is fitted on the router split: the target at b is the
 * path with the highest log-likelihood of the window's tokens (the paper's transduction
 * target with L = W).
 */
#ifndef CORE_ROUTE_ROUTE_H
#define CORE_ROUTE_ROUTE_H

#include <stdint.h>

#include "io/tokfile.h"
#include "route/lm.h"
#include "route/routefile.h"

/* Prefix features of every document of tf with the base model (progress may be NULL). */
int route_features(struct lm *base, const struct tokfile *tf, int prefix, int layer,
		   struct features *out, void (*progress)(void *ctx, uint64_t done), void *ctx);

struct kmeans_opts;
/* The k-means router of f (dpc-route kmeans): o->k centroids fitted by kmeans_fit, f's
 * recipe, and in r->report the fit's JSON (features: name, docs, restarts, inertia,
 * iterations, best_restart, sizes: documents per cluster). CORE_ESHAPE naming name when f
 * has fewer documents than clusters. r is overwritten; router_free releases it, also on
 * error. */
int route_kmeans(const struct features *f, const char *name, const struct kmeans_opts *o,
		 struct router *r);

/* CORE_EFORMAT on the router's file unless its recipe is the features' / base's. */
int route_check_recipe(const struct recipe *want, const char *path, const struct recipe *have,
		       const char *what);

/* Score every document of tf under every path: out->logprob and out->doc (routefile.h). */
int route_score(struct lm *paths, int npaths, const struct tokfile *tf, int prefix,
		struct scores *out, void (*progress)(void *ctx, uint64_t done), void *ctx);

/* The window features at every boundary b = prefix + m W (m >= 1, b < length) of document d:
 * nb rows of 2 C into out (room for (length - prefix) / W + 1 rows); hidden is scratch of
 * length x C floats. */
int route_window_features(struct lm *base, const struct tokfile *tf, uint64_t d, int layer,
			  int prefix, int context, int W, float *hidden, float *out, int *nb);

/* The path route_evaluate would give the token at position n of a text tok[0..n) (n >= 1;
 * vocab of the base model): the document router on the first min(n, prefix) tokens (before
 * the prefix is complete, on the tokens there are: for sampling from a short prompt), then,
 * with a window router win (may be NULL) and n >= prefix + W, the window router on the
 * window features of the last boundary prefix + m W <= n. *boundary gets the position the
 * decision was made at (min(n, prefix) or the boundary). */
int route_text_path(struct lm *base, const struct router *doc, const struct router *win,
		    const uint32_t *tok, uint64_t n, uint32_t *path, uint64_t *boundary);

/* The rows a document router is fitted on: each document with a token past the scores'
 * prefix, its feature row and, as label, its best path (the largest doc_logprob; ties to
 * the lower path). *x [n, f->dim], *y [n] and *score [n, paths] (each row's doc_logprob
 * under every path) are allocated (caller frees, also on error). */
int route_doc_rows(const struct scores *s, const struct features *f, const struct tokfile *tf,
		   float **x, uint32_t **y, float **score, uint64_t *n);
/* The boundaries b = prefix + m W (m >= 1, b < the document's length) of every document of
 * tf, and each one's label in order into y [route_window_count]: the path of the highest
 * log-likelihood of the window's tokens [b, min(b + W, length)) (ties to the lower path). */
uint64_t route_window_count(const struct tokfile *tf, int prefix, int W);
void route_window_labels(const struct scores *s, const struct tokfile *tf, int W, uint32_t *y);
/* The rows a window router is fitted on: every boundary's window features (from base, with
 * layer and context), label and *score [n, paths] (the window's log-likelihood under each
 * path). *x [n, 2 C], *y [n], *score allocated (caller frees, also on error); progress (may
 * be NULL) after every document. */
int route_window_rows(const struct scores *s, struct lm *base, const struct tokfile *tf,
		      int layer, int context, int W, float **x, uint32_t **y, float **score,
		      uint64_t *n, void (*progress)(void *ctx, uint64_t done), void *ctx);

/* Whether the routers of an evaluation fit the base model and the paths: doc (read from
 * doc_path) and win [nw] (from wpaths) route to npaths paths, were fitted on base's features
 * (its digest and width), the windows from the document router's prefix, a prefix within
 * the context. Without a document router (*have_doc 0) and one path, doc becomes one that
 * sends everything to it, with the given prefix (*have_doc 1); with more paths that is
 * CORE_EUSAGE naming cmd. model: the base as the user named it. */
int route_check_routers(struct router *doc, int *have_doc, const char *doc_path,
			const struct router *win, const char *const *wpaths, int nw,
			const struct lm *base, const char *model, int npaths, int prefix,
			const char *cmd);

/* Fit a logistic-regression router on rows x [n, dim] with labels y (each row's best path),
 * with the bias correction to the labels' counts raised to o->min_share of an even share.
 * When that floor raises a path's count and score [n, paths] (the rows' scores under each
 * path, higher better; may be NULL) is given, the labels fitted are first the assignment of
 * the largest total score with the floored counts (logreg_assign), so that every path has
 * rows to be told apart by. report (JSON text, caller frees) gets train and held-out
 * accuracy (holdout fraction of the rows, chosen by a hash of the row index and seed), the
 * rows relabelled, and per-path counts of the best paths, of the labels fitted and of the
 * predictions before and after the correction ("predicted_after": of the router returned).
 * The router returned is refitted on all rows. */
struct route_fit_opts {
	double l2, holdout;
	double min_share; /* each path's bias-correction target is at least this fraction of an
			   * even share n / paths (taken from the largest): no starved path */
	int correct;      /* 1: the router returned has the correction; 0: plain argmax (the
			   * report still shows what the correction does on the split) */
	int max_iter;
	uint64_t seed;
};
int route_fit_logreg(const float *x, const uint32_t *y, const float *score, uint64_t n,
		     int dim, int paths, const struct route_fit_opts *o, struct logreg *out,
		     char **report);

/* Evaluation: perplexity over every token from position score_from on (0: the document
 * router's prefix; never before it, CORE_EUSAGE) of each document of tf, routing once per
 * document (doc router) and every W tokens (window routers, whose windows still start at
 * the prefix). A document of score_from tokens or fewer is not scored. */
struct route_eval_mode {
	int window;       /* 0 for once per document */
	int transformer;  /* the window router is a transformer (wrouter.h), not a logreg */
	double nll;       /* summed over the tokens scored, nats */
	uint64_t tokens;  /* tokens scored */
	uint64_t forwarded; /* tokens run through path models (each switch recomputes context) */
	uint64_t base_tokens; /* tokens run through the base model (or a transformer window
			       * router) for routing */
	uint64_t switches;  /* windows whose path differs from the previous window's */
	double seconds;
};
int route_evaluate(struct lm *paths, int npaths, struct lm *base, const struct router *doc,
		   const struct router *const *windows, int nwindows, const struct tokfile *tf,
		   int score_from, struct route_eval_mode *modes,
		   void (*progress)(void *ctx, uint64_t done), void *ctx);

#endif
