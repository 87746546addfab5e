/* routefile.h - the routing layer's files: features, routers and path scores. All three are
 * safetensors files (so numpy and PyTorch read them) with a "format" metadata key naming
 * which, and the recipe that made them, so that a mismatch is caught before it is used.
 * dpc-route(5) documents them byte by byte; in short:
 *
 * features (format "dpc-features"): tensor "features" F32 [docs, dim], one row per document
 *   of a token file in its order. Metadata: the recipe (checkpoint, checkpoint_digest (see
 *   ckpt_digest), layer, prefix), corpus (the token file as given), corpus_crc (its body crc32,
 *   8 hex digits), docs, dim.
 *
 * router (format "dpc-router"): kind "kmeans" (tensor "centroids" [paths, dim]: a document
 *   goes to the nearest centroid), "logreg" (tensors "mean" [dim], "std" [dim], "weight"
 *   [paths, dim], "bias" [paths], "correction" [paths]: a document goes to the largest of
 *   weight . (x - mean) / std + bias + correction) or "window" (a logreg over window
 *   features, see route.h, with metadata window and context). Metadata: paths, dim, the
 *   feature recipe (checkpoint_digest, layer, prefix), and "report": what fitting it
 *   printed, as JSON text.
 *
 * scores (format "dpc-scores"): tensors "logprob" F32 [tokens, paths] (log p of every token
 *   of the corpus under every path, lm.h's windows; a document's first token 0) and
 *   "doc_logprob" F32 [docs, paths] (each document's sum over its tokens from position prefix
 *   on: what the paths are compared by). Metadata: corpus, corpus_crc, docs, tokens, paths,
 *   prefix, path_digests (the checkpoints' digests, comma-separated), source (a run
 *   directory and phase, or the checkpoints).
 */
#ifndef CORE_ROUTE_ROUTEFILE_H
#define CORE_ROUTE_ROUTEFILE_H

#include <stddef.h>
#include <stdint.h>

#include "io/tokfile.h"
#include "route/lm.h"
#include "route/logreg.h"

#define ROUTE_MAX_PATHS 65536
#define ROUTE_PATH_MAX 4096

/* How features were made. */
struct recipe {
	char digest[LM_DIGEST_CHARS + 1]; /* the base checkpoint's (ckpt_digest) */
	int layer, prefix;
};

struct features {
	struct recipe r;
	char *checkpoint, *corpus; /* as recorded */
	uint32_t corpus_crc;
	uint64_t docs;
	int dim;
	float *x; /* [docs, dim] */
};

int features_write(const char *path, const struct features *f);
/* Read and verify path. */
int features_read(const char *path, struct features *f);
/* CORE_EFORMAT on f's file unless it was made from tf (same crc32 and document count). */
int features_check_corpus(const struct features *f, const char *fpath,
			  const struct tokfile *tf);
void features_free(struct features *f);

enum router_kind { ROUTER_KMEANS, ROUTER_LOGREG, ROUTER_WINDOW, ROUTER_TRANSFORMER };

struct wrouter; /* wrouter.h: a transformer window router, opened with a backend */

struct router {
	enum router_kind kind;
	int paths, dim;
	struct recipe r;
	int window, context; /* ROUTER_WINDOW: re-route every window tokens; context, see route.h */
	float *centroids;    /* ROUTER_KMEANS: [paths, dim] */
	struct logreg lr;    /* ROUTER_LOGREG and ROUTER_WINDOW */
	struct wrouter *tr;  /* ROUTER_TRANSFORMER (wrouter_open_window; r.digest is the base's
			      * it was fine-tuned from, dim 0); router_free closes it with
			      * tr_close, which wrouter.c sets (routefile.c needs no wrouter.h) */
	void (*tr_close)(struct wrouter *tr);
	char *report;        /* JSON text, or NULL */
};

const char *router_kind_name(enum router_kind k);
int router_write(const char *path, const struct router *r);
int router_read(const char *path, struct router *r);
void router_free(struct router *r);
/* The topn (1 or 2) best paths for a feature row, best first. */
void router_route(const struct router *r, const float *x, int topn, uint32_t *out);
/* A window router of window W decides at the boundaries b = prefix + m W (m >= 1) before a
 * document's end: how many a document of len tokens has; boundary m (from 0:
 * prefix + (m + 1) W); the last at or before position n (0 when none, or W = 0). */
uint64_t router_boundaries(uint64_t len, int prefix, int W);
uint64_t router_boundary(int prefix, int W, uint64_t m);
uint64_t router_last_boundary(uint64_t n, int prefix, int W);

struct scores {
	char *corpus, *source;
	uint32_t corpus_crc;
	uint64_t docs, tokens;
	int paths, prefix;
	char *digests;   /* comma-separated */
	float *logprob;  /* [tokens, paths] */
	float *doc;      /* [docs, paths] */
};

int scores_write(const char *path, const struct scores *s);
int scores_read(const char *path, struct scores *s);
int scores_check_corpus(const struct scores *s, const char *spath, const struct tokfile *tf);
void scores_free(struct scores *s);
/* The path of the highest log-likelihood of the scored tokens [j0, j1) of the corpus (ties
 * to the lower path); with score not NULL, each path's sum into score [paths]. */
uint32_t scores_best_path(const struct scores *s, uint64_t j0, uint64_t j1, float *score);

#endif
