/* test_generate.c - route_generate (dpc-route sample's loop) against a naive generator
 * written here: for every token, a full forward over the context window of the path in use,
 * the path decided by route_text_path at the positions the routing rule names, the context
 * cut by dropping the oldest half once the text outgrows it. With the key/value cache and
 * without, one model and two routed paths (a window router of 4 tokens, so the path switches
 * and the new path is fed the context again), past the context twice: the same tokens, the
 * same paths at the same positions, the same switch count. Bad arguments are refused.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "common/err.h"
#include "common/rng.h"
#include "io/config.h"
#include "model/checkpoint.h"
#include "model/gpt2.h"
#include "route/generate.h"
#include "route/route.h"
#include "testutil.h"

TestSuite(generate, .timeout = 120);

#define T_CTX 24
#define PREFIX 8
#define WINDOW 4
#define NTOK 60
#define MAXLOG 64

static const struct model_config cfg = {.n_layer = 2, .n_embd = 16, .n_head = 2,
					.seq_len = T_CTX, .vocab_size = 256};

struct fx {
	char dir[256];
	struct backend *be;
	struct lm paths[2], base;
	struct router doc, win;
};

/* A checkpoint of cfg with the seeded initialisation, its weights scaled so that the
 * logits (and the routers' features) vary from token to token. */
static void write_model(struct fx *f, const char *name, uint64_t seed, char *path, size_t n)
{
	struct gpt2 g;
	struct run_config c;
	config_defaults(&c);
	c.model = cfg;
	snprintf(path, n, "%s/%s.safetensors", f->dir, name);
	cr_assert_eq(gpt2_create_forward(&g, &cfg, 1, T_CTX, f->be), 0, "%s", err_detail());
	cr_assert_eq(gpt2_init_params(&g, seed), 0);
	for (size_t k = 0; k < g.nparams; k++)
		g.params[k] *= 8.0f;
	cr_assert_eq(ckpt_save(path, &g, &c, 0, 0, NULL, 0), 0, "%s", err_detail());
	gpt2_free(&g);
}

static float *normal_floats(size_t n, uint64_t seed, double sd)
{
	float *x = malloc(n * sizeof *x);
	cr_assert(x);
	for (size_t i = 0; i < n; i++)
		x[i] = (float)(sd * rng_normal(seed, RNG_STREAM_TEST, i));
	return x;
}

/* A logistic-regression router over dim features with random weights. */
static void random_logreg(struct router *r, enum router_kind kind, int dim, uint64_t seed)
{
	*r = (struct router){.kind = kind, .paths = 2, .dim = dim,
			     .r = {.layer = cfg.n_layer - 1, .prefix = PREFIX}};
	r->lr = (struct logreg){.k = 2, .d = dim};
	r->lr.mu = calloc((size_t)dim, sizeof(float));
	r->lr.sd = malloc((size_t)dim * sizeof(float));
	r->lr.w = normal_floats(2 * (size_t)dim, seed, 3.0);
	r->lr.b = calloc(2, sizeof(float));
	r->lr.bias = calloc(2, sizeof(float));
	cr_assert(r->lr.mu && r->lr.sd && r->lr.b && r->lr.bias);
	for (int i = 0; i < dim; i++)
		r->lr.sd[i] = 1.0f;
	if (kind == ROUTER_WINDOW) {
		r->window = WINDOW;
		r->context = WINDOW;
	}
}

static void fx_open(struct fx *f)
{
	char p0[512], p1[512], pb[512];
	tu_mkdtemp(f->dir, sizeof f->dir, "generate");
	cr_assert_eq(backend_open(&f->be, "cpu", &(struct backend_params){.threads = 1}), 0);
	write_model(f, "path0", 11, p0, sizeof p0);
	write_model(f, "path1", 12, p1, sizeof p1);
	write_model(f, "base", 13, pb, sizeof pb);
	cr_assert_eq(lm_open(&f->paths[0], p0, f->be, 1), 0, "%s", err_detail());
	cr_assert_eq(lm_open(&f->paths[1], p1, f->be, 1), 0, "%s", err_detail());
	cr_assert_eq(lm_open(&f->base, pb, f->be, 1), 0, "%s", err_detail());
	random_logreg(&f->doc, ROUTER_LOGREG, cfg.n_embd, 21);
	random_logreg(&f->win, ROUTER_WINDOW, 2 * cfg.n_embd, 22);
}

static void fx_close(struct fx *f)
{
	lm_close(&f->paths[0]);
	lm_close(&f->paths[1]);
	lm_close(&f->base);
	router_free(&f->doc);
	router_free(&f->win);
	backend_close(f->be);
	tu_rm_tree(f->dir);
}

/* What a generation gave: the tokens, and the paths started (path, position). */
struct record {
	int32_t tok[NTOK];
	int ntok;
	int path[MAXLOG];
	uint64_t at[MAXLOG];
	int npath;
};

static int rec_emit(void *ctx, int32_t t)
{
	struct record *r = ctx;
	cr_assert(r->ntok < NTOK);
	r->tok[r->ntok++] = t;
	return 0;
}

static void rec_path(void *ctx, int p, uint64_t at)
{
	struct record *r = ctx;
	cr_assert(r->npath < MAXLOG);
	r->path[r->npath] = p;
	r->at[r->npath++] = at;
}

/* The naive generator: everything recomputed for every token. */
static void naive(struct fx *f, const struct gen_route *rt, const int32_t *prompt, size_t plen,
		  const struct gen_opts *o, struct record *out, long *switches)
{
	const int V = cfg.vocab_size;
	int32_t hist[NTOK + 16];
	uint32_t text[NTOK + 16];
	float *logits = malloc(sizeof(float) * T_CTX * (size_t)V);
	int work[256];
	size_t n = plen, base = 0;
	int cur = 0;
	cr_assert(logits && plen < 16);
	memcpy(hist, prompt, plen * sizeof *hist);
	*out = (struct record){0};
	*switches = 0;
	for (long i = 0; i < o->tokens; i++) {
		const int due = n == plen || n == PREFIX ||
				(rt && rt->win && n >= PREFIX + WINDOW && (n - PREFIX) % WINDOW == 0);
		if (rt && due) {
			uint32_t p;
			uint64_t at;
			for (size_t j = 0; j < n; j++)
				text[j] = (uint32_t)hist[j];
			cr_assert_eq(route_text_path(rt->base, rt->doc, rt->win, text, n, &p, &at), 0);
			if (n == plen || (int)p != cur) {
				*switches += n != plen;
				cur = (int)p;
				rec_path(out, cur, n);
			}
		}
		if (n - base > T_CTX)
			base = n - T_CTX / 2;
		const int w = (int)(n - base);
		cr_assert_eq(gpt2_forward_logits(&f->paths[cur].g, hist + base, 1, w, logits), 0);
		const double u = rng_uniform(o->seed, RNG_STREAM_SAMPLE, (uint64_t)i);
		hist[n] = sample_token(logits + (size_t)(w - 1) * V, V, &o->so, u, work);
		rec_emit(out, hist[n++]);
	}
	free(logits);
}

static void same(const struct record *a, const struct record *b, const char *what)
{
	cr_assert_eq(a->ntok, b->ntok, "%s: %d tokens, the naive generator %d", what, a->ntok,
		     b->ntok);
	for (int i = 0; i < a->ntok; i++)
		cr_assert_eq(a->tok[i], b->tok[i], "%s: token %d is %d, the naive generator's %d",
			     what, i, a->tok[i], b->tok[i]);
	cr_assert_eq(a->npath, b->npath, "%s: %d path decisions, the naive generator %d", what,
		     a->npath, b->npath);
	for (int i = 0; i < a->npath; i++)
		cr_assert(a->path[i] == b->path[i] && a->at[i] == b->at[i],
			  "%s: decision %d: path %d at %llu, the naive generator's %d at %llu",
			  what, i, a->path[i], (unsigned long long)a->at[i], b->path[i],
			  (unsigned long long)b->at[i]);
}

static void check(struct fx *f, const struct gen_route *rt, int npaths, const char *what)
{
	const int32_t prompt[5] = {'T', 'h', 'e', ' ', 'c'};
	struct record want, got;
	long want_sw;
	for (int nocache = 0; nocache <= 1; nocache++) {
		const struct gen_opts o = {.so = {.temperature = 1.0, .top_k = 0, .top_p = 1.0},
					   .seed = 7, .tokens = NTOK, .nocache = nocache};
		naive(f, rt, prompt, 5, &o, &want, &want_sw);
		got = (struct record){0};
		struct gen_stats st;
		const struct gen_sink sink = {.emit = rec_emit, .path = rec_path, .ctx = &got};
		cr_assert_eq(route_generate(f->paths, npaths, rt, prompt, 5, &o, &sink, &st), 0,
			     "%s: %s", what, err_detail());
		same(&got, &want, what);
		cr_assert_eq(st.switches, want_sw, "%s: %ld switches, the naive generator %ld",
			     what, st.switches, want_sw);
		cr_assert(st.t_prompt >= 0 && st.t_total >= st.t_prompt);
		if (rt)
			cr_log_info("%s (%s): %d decisions, %ld switches", what,
				    nocache ? "no cache" : "cache", got.npath, st.switches);
	}
}

Test(generate, one_model_past_the_context_as_the_naive_generator)
{
	struct fx f;
	fx_open(&f);
	check(&f, NULL, 1, "one model");
	fx_close(&f);
}

Test(generate, routed_paths_switch_as_the_naive_generator)
{
	struct fx f;
	fx_open(&f);
	const struct gen_route doc_only = {.base = &f.base, .doc = &f.doc};
	check(&f, &doc_only, 2, "document router");
	const struct gen_route rt = {.base = &f.base, .doc = &f.doc, .win = &f.win};
	check(&f, &rt, 2, "window router");
	/* the window router must have switched paths, or the refeed is untested */
	struct record want;
	long sw;
	const struct gen_opts o = {.so = {.temperature = 1.0, .top_p = 1.0}, .seed = 7,
				   .tokens = NTOK};
	naive(&f, &rt, (const int32_t[5]){'T', 'h', 'e', ' ', 'c'}, 5, &o, &want, &sw);
	cr_assert(sw >= 2, "the window router switched %ld times: pick other weights", sw);
	fx_close(&f);
}

Test(generate, errors)
{
	struct fx f;
	fx_open(&f);
	const int32_t bad[2] = {'a', 256}, ok[1] = {'a'};
	const struct gen_opts o = {.so = {.temperature = 1.0, .top_p = 1.0}, .seed = 1,
				   .tokens = 4};
	cr_expect_eq(route_generate(f.paths, 1, NULL, bad, 2, &o, NULL, NULL), CORE_EUSAGE);
	cr_expect(strstr(err_detail(), "prompt token 1 is 256"), "%s", err_detail());
	cr_expect_eq(route_generate(f.paths, 2, NULL, ok, 1, &o, NULL, NULL), CORE_EUSAGE,
		     "two paths and no routers");
	cr_expect_eq(route_generate(f.paths, 1, NULL, ok, 0, &o, NULL, NULL), CORE_EUSAGE,
		     "an empty prompt");
	cr_expect_eq(route_generate(f.paths, 1, NULL, ok, 1, &o, NULL, NULL), 0, "no sink: %s",
		     err_detail());
	fx_close(&f);
}
