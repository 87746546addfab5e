/* generate.c - sampling text from a model or a routed DiPaCo (generate.h). */
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/progress.h"
#include "common/rng.h"
#include "route/generate.h"
#include "route/route.h"
#include "route/wrouter.h"

#include "common/banned.h"

/* Whether the path is decided again before drawing the token at position n (n0: the
 * prompt's length). */
static int route_due(const struct gen_route *rt, uint64_t n, uint64_t n0)
{
	const uint64_t prefix = (uint64_t)rt->doc->r.prefix;
	const uint64_t W = rt->win ? (uint64_t)rt->win->window : 0;
	return n == n0 || n == prefix || (W && n >= prefix + W && (n - prefix) % W == 0);
}

/* The decoder state: the text, the context window [base, n) and how much of it the current
 * path's cache holds. */
struct gen {
	struct lm *paths;
	int npaths, nocache, V, T;
	struct gpt2_decoder *dec;
	int32_t *hist;
	uint32_t *text; /* hist as the routers read it */
	float *logits, *all;
	int *work;
	size_t n, base, fed;
	int cur;
	struct gpt2_decoder rdec; /* a transformer window router's cache (not with nocache; its
				   * g NULL when there is none) */
};

/* Decide the path for the token at position n; a new path starts with an empty cache. */
static int gen_route_step(struct gen *g, const struct gen_route *rt, size_t plen,
			  const struct gen_sink *sink, long *switches)
{
	uint32_t path;
	uint64_t at;
	const uint64_t b = router_last_boundary(g->n, rt->doc->r.prefix,
						 rt->win ? rt->win->window : 0);
	int rc;
	if (g->rdec.g && b && b <= (uint64_t)g->rdec.g->cfg.seq_len &&
	    (uint64_t)g->rdec.pos < b) {
		/* the transformer router from its cache: one position per token of the text */
		rc = wrouter_cached_path(rt->win->tr, &g->rdec, g->hist, b, &path);
		at = b;
	} else {
		for (size_t j = 0; j < g->n; j++)
			g->text[j] = (uint32_t)g->hist[j];
		rc = route_text_path(rt->base, rt->doc, rt->win, g->text, g->n, &path, &at);
	}
	if (rc < 0)
		return rc;
	if (path >= (uint32_t)g->npaths)
		return err_set(CORE_ESHAPE, NULL, "the router chose path %u of %d", path,
			       g->npaths);
	if (g->n == plen || (int)path != g->cur) {
		*switches += g->n != plen;
		g->cur = (int)path;
		g->fed = 0;
		if (!g->nocache)
			gpt2_decoder_reset(&g->dec[g->cur]);
		if (sink && sink->path)
			sink->path(sink->ctx, g->cur, g->n);
	}
	return 0;
}

/* The logits after hist [0, n) from the current path, the context cut to its last T. */
static int gen_logits(struct gen *g)
{
	if (g->n - g->base > (size_t)g->T || (!g->nocache && g->fed == (size_t)g->T)) {
		g->base = g->n - (size_t)g->T / 2;
		g->fed = 0;
		if (!g->nocache)
			gpt2_decoder_reset(&g->dec[g->cur]);
	}
	struct gpt2 *m = &g->paths[g->cur].g;
	if (g->nocache) {
		const int w = (int)(g->n - g->base);
		int rc = gpt2_forward_logits(m, g->hist + g->base, 1, w, g->all);
		if (rc == 0)
			memcpy(g->logits, g->all + (size_t)(w - 1) * g->V,
			       sizeof *g->logits * (size_t)g->V);
		return rc;
	}
	int rc = 0;
	while (rc == 0 && g->base + g->fed < g->n) {
		rc = gpt2_decoder_step(&g->dec[g->cur], g->hist[g->base + g->fed],
				       g->base + g->fed + 1 == g->n ? g->logits : NULL);
		g->fed++;
	}
	return rc;
}

static void gen_free(struct gen *g)
{
	for (int p = 0; g->dec && !g->nocache && p < g->npaths; p++)
		gpt2_decoder_close(&g->dec[p]);
	gpt2_decoder_close(&g->rdec);
	free(g->dec);
	free(g->hist);
	free(g->text);
	free(g->logits);
	free(g->all);
	free(g->work);
}

static int gen_open(struct gen *g, struct lm *paths, int npaths, const struct gen_route *rt,
		    size_t plen, const struct gen_opts *o)
{
	const int routed = rt != NULL;
	*g = (struct gen){.paths = paths, .npaths = npaths, .nocache = o->nocache,
			  .V = paths[0].g.cfg.vocab_size, .T = paths[0].g.cfg.seq_len};
	const size_t cap = plen + (size_t)o->tokens + 1;
	g->hist = malloc(sizeof *g->hist * cap);
	g->text = routed ? malloc(sizeof *g->text * cap) : NULL;
	g->logits = malloc(sizeof *g->logits * (size_t)g->V);
	g->all = g->nocache ? malloc(sizeof *g->all * (size_t)g->T * g->V) : NULL;
	g->work = malloc(sizeof *g->work * (size_t)g->V);
	g->dec = g->nocache ? NULL : calloc((size_t)npaths, sizeof *g->dec);
	if (!g->hist || (routed && !g->text) || !g->logits || (g->nocache && !g->all) ||
	    !g->work || (!g->nocache && !g->dec)) {
		gen_free(g);
		return err_set(CORE_ENOMEM, NULL, "out of memory for %ld tokens", o->tokens);
	}
	for (int p = 0; !g->nocache && p < npaths; p++) {
		int rc = gpt2_decoder_open(&g->dec[p], &paths[p].g);
		if (rc < 0) {
			g->npaths = p; /* close the ones opened */
			gen_free(g);
			return rc;
		}
	}
	if (!g->nocache && rt && rt->win && rt->win->kind == ROUTER_TRANSFORMER) {
		int rc = gpt2_decoder_open(&g->rdec, &rt->win->tr->g);
		if (rc < 0) {
			gen_free(g);
			return rc;
		}
	}
	return 0;
}

int route_generate(struct lm *paths, int npaths, const struct gen_route *rt,
		   const int32_t *prompt, size_t plen, const struct gen_opts *o,
		   const struct gen_sink *sink, struct gen_stats *st)
{
	if (npaths < 1 || (!rt && npaths != 1) || plen < 1 || o->tokens < 0)
		return err_set(CORE_EUSAGE, NULL, "route_generate: %d paths, %s, a prompt of %zu "
			       "tokens, %ld to generate", npaths, rt ? "routed" : "not routed",
			       plen, o->tokens);
	for (int p = 1; p < npaths; p++)
		if (paths[p].g.cfg.vocab_size != paths[0].g.cfg.vocab_size ||
		    paths[p].g.cfg.seq_len != paths[0].g.cfg.seq_len)
			return err_set(CORE_ESHAPE, paths[p].path, "has a vocabulary of %d and a "
				       "context of %d, path 0 %d and %d",
				       paths[p].g.cfg.vocab_size, paths[p].g.cfg.seq_len,
				       paths[0].g.cfg.vocab_size, paths[0].g.cfg.seq_len);
	struct gen g;
	int rc = gen_open(&g, paths, npaths, rt, plen, o);
	if (rc < 0)
		return rc;
	for (size_t i = 0; i < plen && rc == 0; i++)
		if (prompt[i] < 0 || prompt[i] >= g.V)
			rc = err_set(CORE_EUSAGE, NULL, "prompt token %zu is %d, outside the "
				     "vocabulary of %d", i, prompt[i], g.V);
	memcpy(g.hist, prompt, sizeof *prompt * plen);
	g.n = plen;
	long switches = 0;
	const double t0 = now_seconds();
	double tprompt = t0;
	for (long i = 0; rc == 0 && i < o->tokens; i++) {
		if (rt && route_due(rt, g.n, plen) &&
		    (rc = gen_route_step(&g, rt, plen, sink, &switches)) < 0)
			break;
		if ((rc = gen_logits(&g)) < 0)
			break;
		if (i == 0)
			tprompt = now_seconds();
		const double u = rng_uniform(o->seed, RNG_STREAM_SAMPLE, (uint64_t)i);
		const int tok = sample_token(g.logits, g.V, &o->so, u, g.work);
		g.hist[g.n++] = tok;
		if (sink && sink->emit)
			rc = sink->emit(sink->ctx, tok);
	}
	if (st)
		*st = (struct gen_stats){.switches = switches, .t_prompt = tprompt - t0,
					 .t_total = now_seconds() - t0};
	gen_free(&g);
	return rc;
}
