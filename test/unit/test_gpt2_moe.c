/* test_gpt2_moe.c - the GPT-2 whose MLPs are Mixture-of-Experts layers (cfg.moe), on cpu and
 * on the reference backend ref:
 *
 *  - the layout: an MoE block's views, their names, shapes and weight decay, and the dense
 *    model's layout untouched by the moe section's defaults;
 *  - the whole gradient of the training objective (mean cross-entropy + aux_weight x the
 *    blocks' summed auxiliary losses) against fourth-order finite differences, with drops
 *    (capacity 1) and without (capacity 0), at a training step's forward (gate_step 0),
 *    skipping a perturbation that changes the routing (the objective is not differentiable
 *    there; the routing's digest tells);
 *  - the auxiliary loss's own path: the gradient at aux_weight 0.5 minus the one at 0 is 0.5
 *    times the finite difference of the auxiliary loss alone;
 *  - one expert, top-1, capacity 1 (every token kept, score 1) is the dense MLP: the same loss
 *    and gradients as the dense model whose mlp.* hold that expert's weights;
 *  - decoding one token at a time gives the logits of the full forward (capacity 0: nothing
 *    dropped either way), and forward-only models route as the training model does;
 * The same bits at any thread count: test_gpt2_grad's moe_bit_identical_at_any_thread_count.
 * The model's loss and every gradient against PyTorch are in test/sh/t-torch-moe.sh.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "common/err.h"
#include "common/rng.h"
#include "model/gpt2.h"

static struct backend *be;

static void on_backend(const char *name, int threads, void (*body)(void))
{
	cr_assert_eq(backend_open(&be, name, &(struct backend_params){.threads = threads}), 0,
		     "%s", name);
	body();
	backend_close(be);
	be = NULL;
}

static void each_backend(void (*body)(void))
{
	on_backend("cpu", 2, body);
	on_backend("ref", 0, body);
}

TestSuite(gpt2_moe, .timeout = 120);

enum { TB = 2, TT = 8 };

/* L=2 C=16 NH=2 T=8 V=32, both blocks MoE: E=4, top-2. */
static struct model_config moe_cfg(double capacity, double aux_weight)
{
	struct model_config c = {.n_layer = 2, .n_embd = 16, .n_head = 2, .seq_len = 8,
				 .vocab_size = 32};
	c.moe = (struct model_moe){.experts = 4, .top_k = 2, .every = 1,
				   .capacity_factor = capacity, .aux_weight = aux_weight};
	return c;
}

/* Weights N(0, 0.15) (LayerNorm weights 1 + that), so gradients stand clear of rounding;
 * the gates' N(0, 1.2), so that the gate values of a token lie far apart and a perturbation
 * of a finite difference seldom changes which experts it chooses. */
static void tiny(struct gpt2 *g, const struct model_config *c, int32_t *x, int32_t *y)
{
	cr_assert_eq(gpt2_create(g, c, TB, TT, be), 0, "%s", err_detail());
	for (size_t i = 0; i < g->nparams; i++)
		g->params[i] = 0.15f * rng_normal(3, RNG_STREAM_TEST, i);
	for (int v = 0; v < g->nviews; v++) {
		float *w = g->views[v].data;
		const int ln = strstr(g->views[v].name, "ln_") && strstr(g->views[v].name, ".weight");
		const int gate = strstr(g->views[v].name, "moe.gate.weight") != NULL;
		for (int64_t i = 0; (ln || gate) && i < tensor_numel(&g->views[v]); i++)
			w[i] = ln ? w[i] + 1.0f : 8.0f * w[i];
	}
	for (int n = 0; n < TB * TT; n++) {
		x[n] = (int32_t)rng_below(3, RNG_STREAM_TEST, 100000 + n, 32);
		y[n] = (int32_t)rng_below(3, RNG_STREAM_TEST, 200000 + n, 32);
	}
}

/* The objective the backward differentiates (the cross-entropies summed in double, so that
 * the small steps below are not lost in the mean's rounding), and the routing digest of both
 * blocks. */
static double objective(struct gpt2 *g, const int32_t *x, const int32_t *y, double aux_weight,
			uint64_t *route)
{
	float ls[TB * TT];
	cr_assert_eq(gpt2_forward(g, x, y, TB, TT, NULL), 0, "%s", err_detail());
	cr_assert_eq(gpt2_losses(g, ls), 0);
	double loss = 0;
	for (int n = 0; n < TB * TT; n++)
		loss += ls[n];
	loss /= TB * TT;
	uint64_t d0, d1;
	cr_assert_eq(gpt2_moe_route_digest(g, 0, &d0), 0);
	cr_assert_eq(gpt2_moe_route_digest(g, 1, &d1), 0);
	*route = d0 * 31 + d1;
	return loss + aux_weight * g->aux_loss;
}

/* A step small enough that most perturbations keep the routing (a token's first and second
 * choices can lie within 1e-2 of a swap), large enough for float rounding. */
#define FD_STEP 2e-3f

/* Fourth-order central difference of the objective (or of aux alone) in *p; NAN when one
 * of the four points routes otherwise than route0. */
static double fd(struct gpt2 *g, const int32_t *x, const int32_t *y, float *p, float h,
		 double aux_weight, int aux_only, uint64_t route0)
{
	const float s = *p;
	const float at[4] = {s + 2 * h, s + h, s - h, s - 2 * h};
	double v[4];
	int same = 1;
	for (int k = 0; k < 4; k++) {
		uint64_t r;
		*p = at[k];
		v[k] = objective(g, x, y, aux_weight, &r);
		if (aux_only)
			v[k] = g->aux_loss;
		same &= r == route0;
	}
	*p = s;
	return same ? (-v[0] + 8 * v[1] - 8 * v[2] + v[3]) / (12.0 * h) : NAN;
}

static void layout_on(void)
{
	struct model_config c = moe_cfg(1.0, 0.01);
	c.moe.every = 2; /* block 1 only */
	struct gpt2 g;
	int32_t x[TB * TT], y[TB * TT];
	tiny(&g, &c, x, y);
	cr_assert(gpt2_find(&g, "h.0.mlp.c_fc.weight") && !gpt2_find(&g, "h.1.mlp.c_fc.weight"));
	cr_assert(!gpt2_block_is_moe(&g, 0) && gpt2_block_is_moe(&g, 1));
	static const struct {
		const char *name;
		int ndim;
		int64_t ne[3];
	} want[] = {{"h.1.moe.gate.weight", 2, {16, 4}},  {"h.1.moe.fc1.weight", 3, {4, 16, 64}},
		    {"h.1.moe.fc1.bias", 2, {4, 64}},     {"h.1.moe.fc2.weight", 3, {4, 64, 16}},
		    {"h.1.moe.fc2.bias", 2, {4, 16}}};
	for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
		const struct tensor *t = gpt2_find(&g, want[i].name);
		cr_assert(t, "no view %s", want[i].name);
		cr_assert_eq(t->ndim, want[i].ndim, "%s", want[i].name);
		for (int d = 0; d < t->ndim; d++)
			cr_assert_eq(t->ne[d], want[i].ne[d], "%s dim %d", want[i].name, d);
		const int v = (int)(t - g.views);
		cr_assert_eq(g.decay_mask[v], strstr(want[i].name, ".bias") == NULL,
			     "%s: weight decay %d", want[i].name, g.decay_mask[v]);
	}
	/* the views tile the flat buffer in order */
	size_t off = 0;
	for (int v = 0; v < g.nviews; v++) {
		cr_assert_eq((size_t)((float *)g.views[v].data - g.params), off, "%s",
			     g.views[v].name);
		off += (size_t)tensor_numel(&g.views[v]);
	}
	cr_assert_eq(off, g.nparams);
	struct gpt2_moe_step st;
	cr_assert_lt(gpt2_moe_step(&g, 1, &st), 0, "a step before any forward");
	cr_assert_lt(gpt2_moe_step(&g, 0, &st), 0, "block 0 is dense");
	gpt2_free(&g);
	/* a dense config with the moe section's defaults is the dense model's layout */
	struct model_config d = c;
	d.moe.experts = 0;
	cr_assert_eq(gpt2_create(&g, &d, TB, TT, be), 0);
	cr_assert_eq(g.nviews, 2 + 2 * 12 + 3);
	cr_assert(g.moe == NULL);
	gpt2_free(&g);
}

Test(gpt2_moe, layout)
{
	each_backend(layout_on);
}

static void gradient_check(double capacity)
{
	const double w = 0.5;
	struct model_config c = moe_cfg(capacity, w);
	struct gpt2 g;
	int32_t x[TB * TT], y[TB * TT];
	tiny(&g, &c, x, y);
	g.gate_step = 0; /* a training step's forward: the configured capacity */
	uint64_t route0;
	objective(&g, x, y, w, &route0);
	struct gpt2_moe_step st;
	cr_assert_eq(gpt2_moe_step(&g, 0, &st), 0);
	if (capacity == 0)
		cr_assert_eq(st.dropped, 0, "capacity 0 dropped %lld", (long long)st.dropped);
	else
		cr_assert_gt(st.dropped, 0, "capacity %g dropped nothing: the case is not tested",
			     capacity);
	cr_assert_eq(gpt2_backward(&g), 0, "%s", err_detail());
	float *grad = malloc(sizeof(float) * g.nparams);
	memcpy(grad, g.grads, sizeof(float) * g.nparams);
	int checked = 0, skipped = 0;
	double num = 0, den = 0;
	for (int v = 0; v < g.nviews; v++) {
		struct tensor *t = &g.views[v];
		size_t base = (size_t)((float *)t->data - g.params), n = (size_t)tensor_numel(t);
		int here = 0;
		for (int k = 0; k < 8 && here < 3; k++) {
			size_t i = base + rng_below(5, RNG_STREAM_TEST, (uint64_t)v * 16 + k, n);
			double want = fd(&g, x, y, &g.params[i], FD_STEP, w, 0, route0);
			if (isnan(want)) {
				skipped++;
				continue;
			}
			double d = fabs(grad[i] - want);
			cr_assert(d <= 3e-4 + 2e-2 * fabs(want),
				  "MoE model, capacity %g: %s[%zu]: backward %.7g, finite "
				  "difference %.7g", capacity, t->name, i - base, (double)grad[i],
				  want);
			num += (grad[i] - want) * (grad[i] - want);
			den += want * want;
			checked++;
			here++;
		}
		if (strstr(t->name, ".moe."))
			cr_assert_gt(here, 0, "%s: every perturbation changed the routing", t->name);
	}
	cr_assert(sqrt(num / den) < 5e-3, "MoE model gradient: relative error %.3g over %d "
		  "parameters", sqrt(num / den), checked);
	/* a token whose two choices lie near a swap makes every perturbation upstream of its
	 * gate a skip: many are, but enough must remain */
	cr_assert(checked >= 40, "%d perturbations checked (%d skipped: the routing changed)",
		  checked, skipped);
	free(grad);
	gpt2_free(&g);
}

static void gradient_with_drops_on(void) { gradient_check(1.0); }
static void gradient_without_drops_on(void) { gradient_check(0.0); }

Test(gpt2_moe, gradient_with_drops)
{
	each_backend(gradient_with_drops_on);
}

Test(gpt2_moe, gradient_without_drops)
{
	each_backend(gradient_without_drops_on);
}

/* The auxiliary loss reaches the gate (and everything below it) with its weight: the
 * gradient at weight 0.5 less the gradient at 0 is 0.5 d(aux), here by finite differences of
 * the auxiliary loss alone in gate and attention parameters. */
static void aux_path_on(void)
{
	struct model_config c = moe_cfg(1.0, 0.0);
	struct gpt2 g;
	int32_t x[TB * TT], y[TB * TT];
	tiny(&g, &c, x, y);
	g.gate_step = 0;
	uint64_t route0;
	objective(&g, x, y, 0.0, &route0);
	cr_assert_eq(gpt2_backward(&g), 0);
	float *g0 = malloc(sizeof(float) * g.nparams);
	memcpy(g0, g.grads, sizeof(float) * g.nparams);
	g.cfg.moe.aux_weight = 0.5;
	objective(&g, x, y, 0.5, &route0);
	cr_assert_eq(gpt2_backward(&g), 0);
	static const char *const names[] = {"h.1.moe.gate.weight", "h.0.moe.gate.weight",
					    "h.0.attn.c_attn.weight", "h.0.ln_2.weight"};
	int checked = 0;
	for (size_t j = 0; j < sizeof names / sizeof names[0]; j++) {
		struct tensor *t = gpt2_find(&g, names[j]);
		cr_assert(t);
		size_t base = (size_t)((float *)t->data - g.params), n = (size_t)tensor_numel(t);
		for (int k = 0; k < 12; k++) {
			size_t i = base + rng_below(7, RNG_STREAM_TEST, j * 16 + (size_t)k, n);
			double want = fd(&g, x, y, &g.params[i], FD_STEP, 0.5, 1, route0);
			if (isnan(want))
				continue;
			double got = (double)(g.grads[i] - g0[i]) / 0.5;
			cr_assert(fabs(got - want) <= 3e-4 + 2e-2 * fabs(want),
				  "%s[%zu]: the auxiliary loss's gradient %.7g, its finite difference "
				  "%.7g", names[j], i - base, got, want);
			checked++;
		}
	}
	cr_assert_geq(checked, 16, "only %d auxiliary-loss gradients checked", checked);
	/* and it is not zero: the path exists */
	struct tensor *t = gpt2_find(&g, "h.1.moe.gate.weight");
	size_t base = (size_t)((float *)t->data - g.params);
	double diff = 0;
	for (int64_t i = 0; i < tensor_numel(t); i++)
		diff += fabs(g.grads[base + (size_t)i] - g0[base + (size_t)i]);
	cr_assert_gt(diff, 1e-4, "aux_weight changes no gate gradient");
	free(g0);
	gpt2_free(&g);
}

Test(gpt2_moe, aux_loss_path)
{
	each_backend(aux_path_on);
}

/* E = 1, k = 1, capacity 1: C = N, every token kept with score 1, so the block is the dense
 * MLP; the dense model with the expert's weights in its mlp.* gives the same loss and
 * gradients (to float rounding: the products run over other shapes). */
static void one_expert_is_dense_on(void)
{
	struct model_config c = moe_cfg(1.0, 0.0);
	c.moe.experts = 1;
	c.moe.top_k = 1;
	struct model_config d = c;
	d.moe.experts = 0;
	struct gpt2 gm, gd;
	int32_t x[TB * TT], y[TB * TT];
	tiny(&gm, &c, x, y);
	tiny(&gd, &d, x, y);
	/* the same values by name; the dense mlp.* from the expert */
	static const char *const map[][2] = {{"mlp.c_fc.weight", "moe.fc1.weight"},
					     {"mlp.c_fc.bias", "moe.fc1.bias"},
					     {"mlp.c_proj.weight", "moe.fc2.weight"},
					     {"mlp.c_proj.bias", "moe.fc2.bias"}};
	for (int v = 0; v < gd.nviews; v++) {
		const struct tensor *t = &gd.views[v];
		char name[TENSOR_NAME_MAX];
		snprintf(name, sizeof name, "%s", t->name);
		for (size_t j = 0; j < 4; j++) {
			char *at = strstr(name, map[j][0]);
			if (at && !at[strlen(map[j][0])])
				snprintf(at, sizeof name - (size_t)(at - name), "%s", map[j][1]);
		}
		const struct tensor *s = gpt2_find(&gm, name);
		cr_assert(s && tensor_numel(s) == tensor_numel(t), "%s -> %s", t->name, name);
		memcpy(t->data, s->data, sizeof(float) * (size_t)tensor_numel(t));
	}
	float lm, ld;
	cr_assert_eq(gpt2_forward(&gm, x, y, TB, TT, &lm), 0);
	cr_assert_eq(gpt2_forward(&gd, x, y, TB, TT, &ld), 0);
	cr_assert(fabsf(lm - ld) <= 1e-6f * fabsf(ld), "loss: MoE %.9g, dense %.9g", (double)lm,
		  (double)ld);
	cr_assert_eq(gpt2_backward(&gm), 0);
	cr_assert_eq(gpt2_backward(&gd), 0);
	for (int v = 0; v < gd.nviews; v++) {
		const struct tensor *t = &gd.views[v];
		const struct tensor *s = gpt2_find(&gm, t->name);
		if (!s) /* mlp.*: compare with the expert's (the gate's gradient stays 0: p = 1) */
			continue;
		const float *a = gm.grads + ((float *)s->data - gm.params);
		const float *b = gd.grads + ((float *)t->data - gd.params);
		for (int64_t i = 0; i < tensor_numel(t); i++)
			cr_assert(fabsf(a[i] - b[i]) <= 1e-6f + 1e-4f * fabsf(b[i]),
				  "%s[%lld]: MoE %.7g, dense %.7g", t->name, (long long)i,
				  (double)a[i], (double)b[i]);
	}
	gpt2_free(&gm);
	gpt2_free(&gd);
}

Test(gpt2_moe, one_expert_is_the_dense_mlp)
{
	each_backend(one_expert_is_dense_on);
}

/* Decoding token by token (each routed alone) gives the full forward's logits, since neither
 * drops anything at evaluation (capacity setting 0, whatever the config's: 0.5 here), and a
 * forward-only model gives them too; a training step's forward with that capacity does drop
 * and gives other logits. */
static void decode_and_forward_only_on(void)
{
	struct model_config c = moe_cfg(0.5, 0.01);
	struct gpt2 g, f;
	int32_t x[TB * TT], y[TB * TT];
	tiny(&g, &c, x, y);
	const int V = 32;
	float full[TT * 32], fo[TT * 32], step[32];
	cr_assert_eq(gpt2_forward_logits(&g, x, 1, TT, full), 0);
	cr_assert_eq(gpt2_create_forward(&f, &c, 1, TT, be), 0);
	memcpy(f.params, g.params, sizeof(float) * g.nparams);
	cr_assert_eq(gpt2_forward_logits(&f, x, 1, TT, fo), 0);
	cr_assert(memcmp(full, fo, sizeof full) == 0, "the forward-only model's logits differ");
	float trained[TT * 32];
	g.gate_step = 0;
	cr_assert_eq(gpt2_forward_logits(&g, x, 1, TT, trained), 0);
	g.gate_step = -1;
	struct gpt2_moe_step st;
	cr_assert_eq(gpt2_moe_step(&g, 0, &st), 0);
	cr_assert(st.dropped > 0 && memcmp(full, trained, sizeof full) != 0,
		  "capacity 0.5 at a training step dropped %lld choices", (long long)st.dropped);
	struct gpt2_decoder d;
	cr_assert_eq(gpt2_decoder_open(&d, &g), 0, "%s", err_detail());
	for (int t = 0; t < TT; t++) {
		cr_assert_eq(gpt2_decoder_step(&d, x[t], step), 0, "%s", err_detail());
		for (int v = 0; v < V; v++)
			cr_assert(fabsf(step[v] - full[t * V + v]) <= 1e-5f + 1e-4f *
				  fabsf(full[t * V + v]), "position %d logit %d: decoder %.7g, "
				  "forward %.7g", t, v, (double)step[v], (double)full[t * V + v]);
	}
	gpt2_decoder_close(&d);
	gpt2_free(&f);
	gpt2_free(&g);
}

Test(gpt2_moe, decoder_and_forward_only)
{
	each_backend(decode_and_forward_only_on);
}
