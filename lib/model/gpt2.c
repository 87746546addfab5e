/* gpt2.c - GPT-2 forward, backward and AdamW, written straight through like llm.c's
 * train_gpt2.c, every operation a call into the backend table (backend.h).
 *
 * Layer l (pre-LN):  a = LN1(x); qkv = a Wqkv + b; y = attn(qkv); x2 = x + y Wo + bo;
 *                    f = gelu(LN2(x2) Wfc + bfc); x' = x2 + f Wp + bp.
 * Final: logits = LNf(x_L) lm_head^T; loss = mean_n -log softmax(logits_n)[target_n].
 *
 * Memory: every activation the backward needs is kept once (no separate copy of the branch
 * outputs: the residual add is fused into the LayerNorm that follows, and the bias of the
 * projection with it). The backward runs on three reusable buffers: the residual-stream
 * gradient [N,C], one [N,C] and one [N,4C] scratch, plus the attention workspace.
 */
#include "model/gpt2.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "common/err.h"
#include "common/rng.h"

#include "common/banned.h"

/* Parameter tensors of one block, in Hugging Face order. */
enum {
	P_LN1_W, P_LN1_B, P_ATTN_W, P_ATTN_B, P_APROJ_W, P_APROJ_B,
	P_LN2_W, P_LN2_B, P_FC_W, P_FC_B, P_MPROJ_W, P_MPROJ_B, P_PER_LAYER
};
/* Views: wte, wpe, blocks, ln_f.weight, ln_f.bias, lm_head.weight. */
#define V_WTE 0
#define V_WPE 1
#define V_LAYER(l, p) (2 + (l) * P_PER_LAYER + (p))

struct layer_acts {
	float *ln1, *ln1_mean, *ln1_rstd; /* [N,C], [N], [N] */
	float *qkv;                       /* [N,3C] */
	float *atty;                      /* [N,C] attention output before c_proj */
	float *att;                       /* [B,NH,T,T] probabilities */
	float *res2;                      /* [N,C] x + attention branch */
	float *ln2, *ln2_mean, *ln2_rstd;
	float *fch, *fch_gelu; /* [N,4C] pre- and post-GELU */
	float *res3;           /* [N,C] block output */
};

struct gpt2_acts {
	float *mem; /* one allocation for everything below */
	size_t nfloats;
	float *encoded; /* [N,C] */
	struct layer_acts *layer;
	float *lnf, *lnf_mean, *lnf_rstd;
	float *probs;  /* [N,V] softmax probabilities, dlogits during backward */
	float *losses; /* [N] */
	/* backward scratch */
	float *dres, *dbuf, *dbig, *ln_partials;
	float *att_ws;
	size_t att_ws_floats;
	int32_t *inputs, *targets; /* copies of the last forward's batch */
	/* AdamW: runs of consecutive views with the same decay flag */
	struct backend_segment *segs;
	unsigned char *seg_decays;
	int nsegs;
	int B, T, have_targets;
};

static float *P(struct gpt2 *g, int view) { return g->views[view].data; }
static float *G(struct gpt2 *g, int view)
{
	return g->grads + ((float *)g->views[view].data - g->params);
}

static void free_acts(struct gpt2_acts *a)
{
	if (!a)
		return;
	free(a->mem);
	free(a->layer);
	free(a->att_ws);
	free(a->inputs);
	free(a->targets);
	free(a->segs);
	free(a->seg_decays);
	free(a);
}

/* Carve the activation buffers out of one block; with mem == NULL only count. Each piece
 * starts on a 64-byte boundary. */
static size_t layout_acts(struct gpt2_acts *a, const struct gpt2_config *c, int B, int T,
			  float *mem)
{
	size_t off = 0, N = (size_t)B * T, C = (size_t)c->n_embd;
#define TAKE(ptr, n)                                                                               \
	do {                                                                                       \
		if (mem)                                                                           \
			(ptr) = mem + off;                                                         \
		off += ((size_t)(n) + 15) / 16 * 16;                                               \
	} while (0)
	TAKE(a->encoded, N * C);
	for (int l = 0; l < c->n_layer; l++) {
		struct layer_acts *la = &a->layer[l];
		TAKE(la->ln1, N * C);
		TAKE(la->ln1_mean, N);
		TAKE(la->ln1_rstd, N);
		TAKE(la->qkv, N * 3 * C);
		TAKE(la->atty, N * C);
		TAKE(la->att, (size_t)B * c->n_head * T * T);
		TAKE(la->res2, N * C);
		TAKE(la->ln2, N * C);
		TAKE(la->ln2_mean, N);
		TAKE(la->ln2_rstd, N);
		TAKE(la->fch, N * 4 * C);
		TAKE(la->fch_gelu, N * 4 * C);
		TAKE(la->res3, N * C);
	}
	TAKE(a->lnf, N * C);
	TAKE(a->lnf_mean, N);
	TAKE(a->lnf_rstd, N);
	TAKE(a->probs, N * c->vocab_size);
	TAKE(a->losses, N);
	TAKE(a->dres, N * C);
	TAKE(a->dbuf, N * C);
	TAKE(a->dbig, N * 4 * C);
	TAKE(a->ln_partials, (size_t)BACKEND_CHUNKS * 2 * C);
#undef TAKE
	return off;
}

static int check_config(const struct gpt2_config *c, int B, int T)
{
	if (c->n_layer < 1 || c->n_embd < 1 || c->n_head < 1 || c->seq_len < 1 || c->vocab_size < 1)
		return err_set(CORE_ECONFIG, NULL,
			       "model sizes must be positive (n_layer %d, n_embd %d, n_head %d, "
			       "seq_len %d, vocab_size %d)",
			       c->n_layer, c->n_embd, c->n_head, c->seq_len, c->vocab_size);
	if (c->n_embd % c->n_head)
		return err_set(CORE_ECONFIG, NULL, "n_embd %d is not divisible by n_head %d",
			       c->n_embd, c->n_head);
	if (B < 1 || T < 1 || T > c->seq_len)
		return err_set(CORE_EUSAGE, NULL, "batch %d x %d outside 1..seq_len %d", B, T,
			       c->seq_len);
	return 0;
}

int gpt2_create(struct gpt2 *g, const struct gpt2_config *cfg, int B, int T)
{
	memset(g, 0, sizeof *g);
	ERR_FORWARD(check_config(cfg, B, T));
	g->cfg = *cfg;
	g->B = B;
	g->T = T;
	const int L = cfg->n_layer;
	const int64_t C = cfg->n_embd, V = cfg->vocab_size, S = cfg->seq_len;

	g->nviews = 2 + L * P_PER_LAYER + 3;
	g->views = calloc((size_t)g->nviews, sizeof *g->views);
	g->decay_mask = calloc((size_t)g->nviews, 1);
	if (!g->views || !g->decay_mask)
		goto nomem;

	/* Shapes and names first (data pointers are offsets until the buffer exists). */
	struct {
		const char *name;
		int ndim;
		int64_t ne[2];
	} block[P_PER_LAYER] = {
		[P_LN1_W] = {"ln_1.weight", 1, {C, 0}},
		[P_LN1_B] = {"ln_1.bias", 1, {C, 0}},
		[P_ATTN_W] = {"attn.c_attn.weight", 2, {C, 3 * C}},
		[P_ATTN_B] = {"attn.c_attn.bias", 1, {3 * C, 0}},
		[P_APROJ_W] = {"attn.c_proj.weight", 2, {C, C}},
		[P_APROJ_B] = {"attn.c_proj.bias", 1, {C, 0}},
		[P_LN2_W] = {"ln_2.weight", 1, {C, 0}},
		[P_LN2_B] = {"ln_2.bias", 1, {C, 0}},
		[P_FC_W] = {"mlp.c_fc.weight", 2, {C, 4 * C}},
		[P_FC_B] = {"mlp.c_fc.bias", 1, {4 * C, 0}},
		[P_MPROJ_W] = {"mlp.c_proj.weight", 2, {4 * C, C}},
		[P_MPROJ_B] = {"mlp.c_proj.bias", 1, {C, 0}},
	};
	size_t *offs = calloc((size_t)g->nviews, sizeof *offs);
	if (!offs)
		goto nomem;
	size_t off = 0;
	char name[TENSOR_NAME_MAX];
#define ADD_VIEW(idx, nm, nd, e0, e1)                                                              \
	do {                                                                                       \
		int64_t ne_[2] = {(e0), (e1)};                                                     \
		tensor_view(&g->views[idx], DT_F32, (nd), ne_, NULL, (nm));                        \
		offs[idx] = off;                                                                   \
		off += (size_t)tensor_numel(&g->views[idx]);                                       \
		g->decay_mask[idx] = (nd) == 2;                                                    \
	} while (0)
	ADD_VIEW(V_WTE, "wte.weight", 2, V, C);
	ADD_VIEW(V_WPE, "wpe.weight", 2, S, C);
	for (int l = 0; l < L; l++)
		for (int p = 0; p < P_PER_LAYER; p++) {
			snprintf(name, sizeof name, "h.%d.%s", l, block[p].name);
			ADD_VIEW(V_LAYER(l, p), name, block[p].ndim, block[p].ne[0],
				 block[p].ne[1]);
		}
	int vf = V_LAYER(L, 0);
	ADD_VIEW(vf, "ln_f.weight", 1, C, 0);
	ADD_VIEW(vf + 1, "ln_f.bias", 1, C, 0);
	ADD_VIEW(vf + 2, "lm_head.weight", 2, V, C);
#undef ADD_VIEW
	g->nparams = off;

	size_t bytes = (g->nparams * sizeof(float) + 63) / 64 * 64;
	g->params = aligned_alloc(64, bytes);
	g->grads = aligned_alloc(64, bytes);
	g->m = aligned_alloc(64, bytes);
	g->v = aligned_alloc(64, bytes);
	if (!g->params || !g->grads || !g->m || !g->v) {
		free(offs);
		goto nomem;
	}
	memset(g->params, 0, bytes);
	memset(g->grads, 0, bytes);
	memset(g->m, 0, bytes);
	memset(g->v, 0, bytes);
	for (int i = 0; i < g->nviews; i++)
		g->views[i].data = g->params + offs[i];
	free(offs);

	struct gpt2_acts *a = calloc(1, sizeof *a);
	if (!a)
		goto nomem;
	g->acts = a;
	a->layer = calloc((size_t)L, sizeof *a->layer);
	a->segs = calloc((size_t)g->nviews, sizeof *a->segs);
	a->seg_decays = calloc((size_t)g->nviews, 1);
	a->inputs = malloc(sizeof(int32_t) * (size_t)B * T);
	a->targets = malloc(sizeof(int32_t) * (size_t)B * T);
	if (!a->layer || !a->inputs || !a->targets || !a->segs || !a->seg_decays)
		goto nomem;
	for (int i = 0; i < g->nviews;) {
		int j = i + 1;
		while (j < g->nviews && g->decay_mask[j] == g->decay_mask[i])
			j++;
		size_t o0 = (size_t)((float *)g->views[i].data - g->params);
		size_t o1 = (size_t)((float *)g->views[j - 1].data - g->params) +
			    (size_t)tensor_numel(&g->views[j - 1]);
		a->segs[a->nsegs] = (struct backend_segment){o0, o1 - o0, 0.0};
		a->seg_decays[a->nsegs++] = g->decay_mask[i];
		i = j;
	}
	a->nfloats = layout_acts(a, cfg, B, T, NULL);
	a->mem = aligned_alloc(64, a->nfloats * sizeof(float));
	if (!a->mem)
		goto nomem;
	layout_acts(a, cfg, B, T, a->mem);
	/* Touch the pages once so the first step does not pay for faulting them in, and so
	 * that nothing uninitialised is ever read. */
	memset(a->mem, 0, a->nfloats * sizeof(float));
	return 0;
nomem:
	gpt2_free(g);
	return err_set(CORE_ENOMEM, NULL, "cannot allocate the model (%d layers, %d channels)",
		       cfg->n_layer, cfg->n_embd);
}

void gpt2_free(struct gpt2 *g)
{
	free(g->params);
	free(g->grads);
	free(g->m);
	free(g->v);
	free(g->views);
	free(g->decay_mask);
	free_acts(g->acts);
	memset(g, 0, sizeof *g);
}

void gpt2_init_params(struct gpt2 *g, uint64_t seed)
{
	const int L = g->cfg.n_layer;
	const float res_std = 0.02f / sqrtf(2.0f * (float)L);
	for (int i = 0; i < g->nviews; i++) {
		struct tensor *t = &g->views[i];
		float *x = t->data;
		int64_t n = tensor_numel(t);
		uint64_t base = (uint64_t)(x - g->params);
		const char *nm = t->name;
		size_t len = strlen(nm);
#define ENDS(s) (len >= strlen(s) && strcmp(nm + len - strlen(s), (s)) == 0)
		if (ENDS("ln_1.weight") || ENDS("ln_2.weight") || ENDS("ln_f.weight")) {
			for (int64_t j = 0; j < n; j++)
				x[j] = 1.0f;
		} else if (t->ndim == 1) {
			memset(x, 0, sizeof(float) * (size_t)n);
		} else if (ENDS("attn.c_proj.weight") || ENDS("mlp.c_proj.weight")) {
			rng_fill_normal(x, n, 0.0f, res_std, seed, RNG_STREAM_INIT, base);
		} else {
			rng_fill_normal(x, n, 0.0f, 0.02f, seed, RNG_STREAM_INIT, base);
		}
#undef ENDS
	}
}

/* The attention workspace scales with the thread count, which the caller may raise between
 * steps (omp_set_num_threads): grow it then, never per step otherwise. */
static int ensure_att_ws(struct gpt2 *g, const struct backend_ops *be, int T)
{
	struct gpt2_acts *a = g->acts;
	size_t ws = be->attention_ws_floats(T, g->cfg.n_embd / g->cfg.n_head);
	if (ws <= a->att_ws_floats)
		return 0;
	free(a->att_ws);
	a->att_ws = aligned_alloc(64, (ws * sizeof(float) + 63) / 64 * 64);
	a->att_ws_floats = a->att_ws ? ws : 0;
	if (!a->att_ws)
		return err_set(CORE_ENOMEM, NULL,
			       "cannot allocate %zu bytes of attention workspace",
			       ws * sizeof(float));
	return 0;
}

int gpt2_forward(struct gpt2 *g, const int32_t *inputs, const int32_t *targets, int B, int T,
		 float *loss)
{
	const struct backend_ops *be = backend_cpu();
	struct gpt2_acts *a = g->acts;
	const int L = g->cfg.n_layer, C = g->cfg.n_embd, NH = g->cfg.n_head, V = g->cfg.vocab_size;
	if (B < 1 || T < 1 || B > g->B || T > g->T)
		return err_set(CORE_EUSAGE, NULL, "batch %d x %d exceeds the model's %d x %d", B, T,
			       g->B, g->T);
	const int N = B * T;
	for (int n = 0; n < N; n++) {
		if (inputs[n] < 0 || inputs[n] >= V)
			return err_set(CORE_EUSAGE, NULL, "token %d at position %d outside 0..%d",
				       inputs[n], n, V - 1);
		if (targets && (targets[n] < 0 || targets[n] >= V))
			return err_set(CORE_EUSAGE, NULL, "target %d at position %d outside 0..%d",
				       targets[n], n, V - 1);
	}
	ERR_FORWARD(ensure_att_ws(g, be, T));
	memcpy(a->inputs, inputs, sizeof(int32_t) * (size_t)N);
	if (targets)
		memcpy(a->targets, targets, sizeof(int32_t) * (size_t)N);
	a->B = B;
	a->T = T;
	a->have_targets = targets != NULL;

	be->encoder_forward(a->encoded, a->inputs, P(g, V_WTE), P(g, V_WPE), B, T, C);
	be->layernorm_forward(a->layer[0].ln1, a->layer[0].ln1_mean, a->layer[0].ln1_rstd,
			      a->encoded, P(g, V_LAYER(0, P_LN1_W)), P(g, V_LAYER(0, P_LN1_B)), N,
			      C);
	for (int l = 0; l < L; l++) {
		struct layer_acts *la = &a->layer[l];
		const float *x = l == 0 ? a->encoded : a->layer[l - 1].res3;
#define W(p) P(g, V_LAYER(l, p))
		be->matmul_forward(la->qkv, la->ln1, W(P_ATTN_W), W(P_ATTN_B), N, C, 3 * C,
				   BACKEND_W_IO);
		be->attention_forward(la->atty, la->att, a->att_ws, la->qkv, B, T, C, NH);
		be->matmul_forward(la->res2, la->atty, W(P_APROJ_W), NULL, N, C, C, BACKEND_W_IO);
		be->residual_layernorm_forward(la->res2, la->ln2, la->ln2_mean, la->ln2_rstd, x,
					       W(P_APROJ_B), W(P_LN2_W), W(P_LN2_B), N, C);
		be->matmul_forward(la->fch, la->ln2, W(P_FC_W), NULL, N, C, 4 * C, BACKEND_W_IO);
		be->bias_gelu_forward(la->fch, la->fch_gelu, W(P_FC_B), N, 4 * C);
		be->matmul_forward(la->res3, la->fch_gelu, W(P_MPROJ_W), NULL, N, 4 * C, C,
				   BACKEND_W_IO);
		/* x' = x2 + mlp, fused with the next LayerNorm (ln_1 of l+1, or ln_f) */
		if (l + 1 < L) {
			struct layer_acts *nx = &a->layer[l + 1];
			be->residual_layernorm_forward(la->res3, nx->ln1, nx->ln1_mean,
						       nx->ln1_rstd, la->res2, W(P_MPROJ_B),
						       P(g, V_LAYER(l + 1, P_LN1_W)),
						       P(g, V_LAYER(l + 1, P_LN1_B)), N, C);
		} else {
			be->residual_layernorm_forward(la->res3, a->lnf, a->lnf_mean, a->lnf_rstd,
						       la->res2, W(P_MPROJ_B), P(g, V_LAYER(L, 0)),
						       P(g, V_LAYER(L, 1)), N, C);
		}
#undef W
	}
	be->matmul_forward(a->probs, a->lnf, P(g, V_LAYER(L, 2)), NULL, N, C, V, BACKEND_W_OI);
	be->crossentropy_forward(a->probs, a->losses, targets ? a->targets : NULL, N, V);
	if (targets) {
		double s = 0.0;
		for (int n = 0; n < N; n++)
			s += a->losses[n];
		g->loss = (float)(s / N);
		if (loss)
			*loss = g->loss;
		if (!isfinite(g->loss))
			return err_set(CORE_ENAN, NULL, "loss is %g", (double)g->loss);
	}
	return 0;
}

const float *gpt2_losses(const struct gpt2 *g) { return g->acts->losses; }

void gpt2_profile(struct gpt2 *g, int enable)
{
	(void)g;
	backend_cpu()->profile(enable);
}

double gpt2_gemm_seconds(const struct gpt2 *g)
{
	(void)g;
	return backend_cpu()->gemm_seconds();
}

const float *gpt2_probs(const struct gpt2 *g) { return g->acts->probs; }

int gpt2_backward(struct gpt2 *g)
{
	const struct backend_ops *be = backend_cpu();
	struct gpt2_acts *a = g->acts;
	const int L = g->cfg.n_layer, C = g->cfg.n_embd, NH = g->cfg.n_head, V = g->cfg.vocab_size;
	const int B = a->B, T = a->T, N = B * T;
	if (!a->have_targets)
		return err_set(CORE_EUSAGE, NULL, "backward needs a forward with targets");
	ERR_FORWARD(ensure_att_ws(g, be, T)); /* the thread count may have changed */
	a->have_targets = 0;                  /* probs become dlogits below */

	/* loss = mean of N cross-entropies: dlogits = (p - onehot) / N, in place */
	be->crossentropy_backward(a->probs, a->targets, N, V, 1.0f / (float)N);
	be->matmul_backward(a->dbuf, G(g, V_LAYER(L, 2)), NULL, a->probs, a->lnf,
			    P(g, V_LAYER(L, 2)), N, C, V, BACKEND_W_OI, 0);
	be->layernorm_backward(a->dres, G(g, V_LAYER(L, 0)), G(g, V_LAYER(L, 1)), a->ln_partials,
			       a->dbuf, a->layer[L - 1].res3, P(g, V_LAYER(L, 0)), a->lnf_mean,
			       a->lnf_rstd, N, C, 0);
	for (int l = L - 1; l >= 0; l--) {
		struct layer_acts *la = &a->layer[l];
		const float *x = l == 0 ? a->encoded : a->layer[l - 1].res3;
#define W(p) P(g, V_LAYER(l, p))
#define DW(p) G(g, V_LAYER(l, p))
		/* x' = x2 + gelu(fch) Wp + bp: dres flows to x2 unchanged */
		be->matmul_backward(a->dbig, DW(P_MPROJ_W), DW(P_MPROJ_B), a->dres, la->fch_gelu,
				    W(P_MPROJ_W), N, 4 * C, C, BACKEND_W_IO, 0);
		be->gelu_backward(a->dbig, DW(P_FC_B), la->fch, N, 4 * C);
		be->matmul_backward(a->dbuf, DW(P_FC_W), NULL, a->dbig, la->ln2, W(P_FC_W), N, C,
				    4 * C, BACKEND_W_IO, 0);
		be->layernorm_backward(a->dres, DW(P_LN2_W), DW(P_LN2_B), a->ln_partials, a->dbuf,
				       la->res2, W(P_LN2_W), la->ln2_mean, la->ln2_rstd, N, C, 1);
		/* x2 = x + y Wo + bo */
		be->matmul_backward(a->dbuf, DW(P_APROJ_W), DW(P_APROJ_B), a->dres, la->atty,
				    W(P_APROJ_W), N, C, C, BACKEND_W_IO, 0);
		be->attention_backward(a->dbig, a->att_ws, a->dbuf, la->qkv, la->att, B, T, C, NH);
		be->matmul_backward(a->dbuf, DW(P_ATTN_W), DW(P_ATTN_B), a->dbig, la->ln1,
				    W(P_ATTN_W), N, C, 3 * C, BACKEND_W_IO, 0);
		be->layernorm_backward(a->dres, DW(P_LN1_W), DW(P_LN1_B), a->ln_partials, a->dbuf,
				       x, W(P_LN1_W), la->ln1_mean, la->ln1_rstd, N, C, 1);
#undef W
#undef DW
	}
	be->encoder_backward(G(g, V_WTE), G(g, V_WPE), a->dres, a->inputs, B, T, C, V);
	if (T < g->cfg.seq_len) /* positions the batch did not reach get no gradient */
		memset(G(g, V_WPE) + (size_t)T * C, 0,
		       sizeof(float) * (size_t)(g->cfg.seq_len - T) * C);
	return 0;
}

float gpt2_grad_norm(const struct gpt2 *g)
{
	return (float)sqrt(backend_cpu()->sum_squares(g->grads, g->nparams));
}

void gpt2_adamw_step(struct gpt2 *g, const struct adamw_config *opt, double lr, long t,
		     float grad_scale)
{
	struct gpt2_acts *a = g->acts;
	for (int i = 0; i < a->nsegs; i++)
		a->segs[i].weight_decay = a->seg_decays[i] ? opt->weight_decay : 0.0;
	backend_cpu()->adamw_update(g->params, g->grads, g->m, g->v, a->segs, a->nsegs, lr,
				    opt->beta1, opt->beta2, opt->eps, t, grad_scale);
}

size_t gpt2_activation_bytes(const struct gpt2 *g)
{
	const struct gpt2_acts *a = g->acts;
	return (a->nfloats + a->att_ws_floats) * sizeof(float) +
	       2 * sizeof(int32_t) * (size_t)g->B * g->T;
}

struct tensor *gpt2_find(struct gpt2 *g, const char *name)
{
	for (int i = 0; i < g->nviews; i++)
		if (strcmp(g->views[i].name, name) == 0)
			return &g->views[i];
	return NULL;
}
