/* generate.h - text from a model, or from the paths of a DiPaCo routed as route_evaluate
 * routes them (dpc-route sample).
 *
 * Each token is drawn (sample.h) from the logits of the path in use, with the uniform draw
 * rng_uniform(seed, RNG_STREAM_SAMPLE, i) for the i-th generated token, so a seed fixes the
 * text. The path is decided before the token at position n is drawn when n is the prompt's
 * length, when n reaches the document router's prefix, and at every window boundary
 * prefix + m W of a window router (route_text_path on the text so far; a transformer window
 * router from a key/value cache on its model while the boundary lies within its context,
 * one forward over the seq_len tokens before the boundary beyond, so that re-routing costs
 * one router position per token, not a pass over the whole text); a decision that changes
 * the path feeds the context to the new one. The context is the last seq_len tokens:
 * when the text outgrows it, the oldest half is dropped and the rest fed again.
 */
#ifndef CORE_ROUTE_GENERATE_H
#define CORE_ROUTE_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "model/sample.h"
#include "route/lm.h"
#include "route/routefile.h"

/* Routing among the paths: the base model the routers read, the document router, and a
 * window router or NULL. */
struct gen_route {
	struct lm *base;
	const struct router *doc, *win;
};

struct gen_opts {
	struct sample_opts so;
	uint64_t seed;
	long tokens;  /* tokens to generate */
	int nocache;  /* 1: a full forward over the context for every token (no key/value cache) */
};

/* What generation reports back: each token as it is drawn, and each path decision that
 * starts a path (the first, and every switch). Either may be NULL; a nonzero return from
 * emit stops generation with that code. */
struct gen_sink {
	int (*emit)(void *ctx, int32_t token);
	void (*path)(void *ctx, int path, uint64_t position);
	void *ctx;
};

struct gen_stats {
	long switches;    /* path changes after the first decision */
	double t_prompt;  /* seconds until the first token's logits (the prompt fed) */
	double t_total;   /* seconds for everything */
};

/* Generate o->tokens tokens after prompt [plen >= 1] from paths [npaths] (one model: npaths
 * 1 and rt NULL; else rt routes among them, its routers for npaths paths, the base of the
 * paths' vocabulary). Tokens must lie in the vocabulary. st may be NULL. */
int route_generate(struct lm *paths, int npaths, const struct gen_route *rt,
		   const int32_t *prompt, size_t plen, const struct gen_opts *o,
		   const struct gen_sink *sink, struct gen_stats *st);

#endif
