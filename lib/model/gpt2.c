/* gpt2.c - GPT-2 forward, backward and AdamW, written straight through like llm.c's
 * train_gpt2.c, every operation a call into the model's backend (backend.h).
 *
 * Layer l (pre-LN):  a = LN1(x); qkv = a Wqkv + b; y = attn(qkv); x2 = x + y Wo + bo;
 *                    f = gelu(LN2(x2) Wfc + bfc); x' = x2 + f Wp + bp.
 * Final: logits = LNf(x_L) lm_head^T; loss = mean_n -log softmax(logits_n)[target_n].
 *
 * An MoE block (cfg.moe) replaces the MLP: x' = x2 + MoE(LN2(x2)), lib/moe's layer over the
 * N = B T rows of LN2's output, its parameters views of the flat buffer like any other.
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

#include "common/crc.h"
#include "common/err.h"
#include "common/rng.h"
#include "dist/dist.h"
#include "moe/moe.h"
#include "moe/moe_dict.h"
#include "moe/moe_dist.h"

#include "common/banned.h"

/* Parameter tensors of one block, in Hugging Face order; an MoE block has the first eight
 * and then its MoE layer's five. */
enum {
	P_LN1_W, P_LN1_B, P_ATTN_W, P_ATTN_B, P_APROJ_W, P_APROJ_B,
	P_LN2_W, P_LN2_B, P_FC_W, P_FC_B, P_MPROJ_W, P_MPROJ_B, P_PER_LAYER
};
enum { P_GATE_W = P_FC_W, P_E1_W, P_E1_B, P_E2_W, P_E2_B, P_PER_MOE };
/* Views: wte, wpe, blocks, ln_f.weight, ln_f.bias, lm_head.weight. */
#define V_WTE 0
#define V_WPE 1
#define V_LAYER(l, p) (g->layer_view[(l)] + (p))

/* One MoE block: its layer (its own in a training model; one shared by every block in a
 * forward-only model) and its parameters and gradients as views of the flat buffers. */
struct moe_block {
	struct moe_layer *layer;
	struct moe_params p, gr;
	int ran; /* a forward has routed through it */
	struct gpt2_moe_step last;
};

struct gpt2_moe {
	unsigned char *is;        /* [L]: 1 for an MoE block */
	struct moe_block *blk;    /* [L] */
	struct moe_layer *shared; /* forward-only models: every block's */
	struct moe_layer *dec;    /* decoding: one token at a time, every block's */
	struct moe_config cfg;    /* T = B x T, M = C, H = 4C */
};

/* Training on W ranks (gpt2_distribute): an MoE block's distributed layer, its placement and
 * this rank's shards of the parameters and of their gradients. */
struct dist_block {
	struct moe_dist_layer *dl;
	struct moe_config cfg; /* T = this rank's B x T */
	struct moe_dist_place pl;
	struct moe_params ps, gs;
	float *gather; /* moe_dist_gather_floats of host scratch for the gradients */
	int ran; /* the last forward went through dl, so the backward must */
};

struct gpt2_dist {
	struct dist *d;
	int W, q;
	struct moe_plan plan;
	const struct moe_dict *dict; /* the plan per step's capacity, or NULL */
	struct dist_block *blk;      /* [L] (MoE blocks only), or NULL */
	struct backend_segment *runs; /* the gradients summed over ranks: all but the MoE layers' */
	int nruns;
};

struct layer_acts {
	float *ln1, *ln1_mean, *ln1_rstd; /* [N,C], [N], [N] */
	float *qkv;                       /* [N,3C] */
	float *atty;                      /* [N,C] attention output before c_proj */
	float *att;                       /* [B,NH,T,T] the backend's attention scratch */
	float *res2;                      /* [N,C] x + attention branch */
	float *ln2, *ln2_mean, *ln2_rstd;
	float *fch, *fch_gelu; /* [N,4C] pre- and post-GELU */
	float *res3;           /* [N,C] block output */
};

struct gpt2_acts {
	float *mem; /* one backend allocation for everything below */
	size_t nfloats;
	float *encoded; /* [N,C] */
	struct layer_acts *layer;
	float *lnf, *lnf_mean, *lnf_rstd;
	float *probs;  /* [N,V] softmax probabilities, dlogits during backward */
	float *losses; /* [N] */
	/* backward scratch */
	float *dres, *dbuf, *dbig;
	int32_t *inputs, *targets; /* the last forward's batch, backend memory */
	double *sums;              /* [2] backend memory: loss sum, gradient sum of squares */
	/* AdamW: runs of consecutive views with the same decay flag (host) */
	struct backend_segment *segs;
	unsigned char *seg_decays;
	int nsegs;
	int B, T, have_targets;
	int dist; /* the last forward was a distributed training step (its backward is too) */
	int nla; /* layer_acts sets: n_layer, or 2 (used in turn) for a forward-only model */
};

/* Layer l's activations: its own set, or one of two in turn when the model is forward only
 * (block l reads the output of l - 1 and writes the input LayerNorm of l + 1, so two sets
 * suffice when nothing is kept for a backward). */
static struct layer_acts *LA(struct gpt2_acts *a, int l)
{
	return &a->layer[a->nla == 2 ? l % 2 : l];
}

static float *P(struct gpt2 *g, int view) { return g->views[view].data; }
static float *G(struct gpt2 *g, int view)
{
	return g->grads + ((float *)g->views[view].data - g->params);
}

/* ---- the MoE blocks ------------------------------------------------------------------------ */

static int moe_is(const struct gpt2 *g, int l) { return g->moe && g->moe->is[l]; }

int gpt2_block_is_moe(const struct gpt2 *g, int l)
{
	return l >= 0 && l < g->cfg.n_layer && moe_is(g, l);
}

static void moe_close(struct gpt2 *g)
{
	struct gpt2_moe *m = g->moe;
	if (!m)
		return;
	for (int l = 0; m->blk && l < g->cfg.n_layer; l++)
		moe_layer_free(m->blk[l].layer);
	moe_layer_free(m->shared);
	moe_layer_free(m->dec);
	free(m->blk);
	free(m->is);
	free(m);
	g->moe = NULL;
}

/* The MoE blocks' layers (each its own in a training model, which keeps every block's
 * routing for the backward; one for all in a forward-only model) and their parameters and
 * gradients as views; N: the most tokens of one call. Block l draws its gate noise from key l
 * (moe_config.seed), so the noise does not depend on the other blocks. */
static int moe_open(struct gpt2 *g, int N)
{
	const struct model_config *c = &g->cfg;
	const int L = c->n_layer;
	struct gpt2_moe *m = calloc(1, sizeof *m);

	if (!(g->moe = m) || !(m->is = calloc((size_t)L, 1)) ||
	    !(m->blk = calloc((size_t)L, sizeof *m->blk)))
		return CORE_ENOMEM;
	ERR_FORWARD(model_moe_blocks(c, m->is));
	moe_config_default(&m->cfg, N, c->n_embd, 4 * (int64_t)c->n_embd, c->moe.experts);
	m->cfg.k = c->moe.top_k;
	m->cfg.capacity_setting = c->moe.capacity_factor;
	m->cfg.bpr = c->moe.bpr;
	m->cfg.gate_noise = (float)c->moe.gate_noise;
	m->cfg.act = MOE_ACT_GELU;
	m->cfg.loss = c->moe.aux_loss ? MOE_LOSS_LOAD_IMPORTANCE : MOE_LOSS_GSHARD;
	for (int l = 0; l < L; l++) {
		struct moe_block *b = &m->blk[l];
		if (!m->is[l])
			continue;
		b->p = (struct moe_params){g->be, P(g, V_LAYER(l, P_GATE_W)),
					   P(g, V_LAYER(l, P_E1_W)), P(g, V_LAYER(l, P_E1_B)),
					   P(g, V_LAYER(l, P_E2_W)), P(g, V_LAYER(l, P_E2_B))};
		if (g->forward_only)
			continue;
		b->gr = (struct moe_params){g->be, G(g, V_LAYER(l, P_GATE_W)),
					    G(g, V_LAYER(l, P_E1_W)), G(g, V_LAYER(l, P_E1_B)),
					    G(g, V_LAYER(l, P_E2_W)), G(g, V_LAYER(l, P_E2_B))};
		struct moe_config bc = m->cfg;
		bc.seed = (uint64_t)l;
		ERR_FORWARD(moe_layer_init(&b->layer, &bc, g->be));
	}
	if (g->forward_only)
		ERR_FORWARD(moe_layer_init(&m->shared, &m->cfg, g->be));
	return 0;
}

/* ---- training on several ranks ------------------------------------------------------------ */

static void dist_free(struct gpt2 *g)
{
	struct gpt2_dist *D = g->dist;
	if (!D)
		return;
	for (int l = 0; D->blk && l < g->cfg.n_layer; l++) {
		moe_dist_layer_free(D->blk[l].dl);
		moe_params_free(&D->blk[l].ps);
		moe_params_free(&D->blk[l].gs);
		free(D->blk[l].gather);
	}
	free(D->blk);
	free(D->runs);
	free(D);
	g->dist = NULL;
}

void gpt2_dist_rows(const struct gpt2 *g, int B, int *row0, int *rows)
{
	const int W = g->dist ? g->dist->W : 1, q = g->dist ? g->dist->q : 0;
	*rows = B / W;
	*row0 = q * *rows;
}

int gpt2_dist_agree(struct gpt2 *g)
{
	if (!g->dist)
		return 0;
	const size_t bytes = g->nparams * sizeof(float);
	int64_t v[3] = {crc32_update(0, g->params, bytes), crc32_update(0, g->m, bytes),
			crc32_update(0, g->v, bytes)};
	static const char *const names[3] = {"the parameters' crc32", "AdamW's first moments' "
					     "crc32", "AdamW's second moments' crc32"};
	int rc = dist_agree(g->dist->d, v, 3, names);
	char why[256];
	if (!rc)
		return 0;
	snprintf(why, sizeof why, "%s", err_detail());
	return err_set(CORE_EIO, NULL, "the model is no longer the same on every rank: %s", why);
}

/* The gradient runs summed over ranks: the flat buffer but each MoE block's gate and experts
 * (moe_dist reduces those itself). */
static int dist_runs(struct gpt2 *g)
{
	struct gpt2_dist *D = g->dist;
	const int L = g->cfg.n_layer;
	if (!(D->runs = calloc((size_t)L + 1, sizeof *D->runs)))
		return CORE_ENOMEM;
	size_t from = 0;
	for (int l = 0; l < L; l++) {
		if (!moe_is(g, l))
			continue;
		const size_t o0 = (size_t)(P(g, V_LAYER(l, P_GATE_W)) - g->params);
		const size_t o1 = (size_t)(P(g, V_LAYER(l, P_E2_B)) - g->params) +
				  (size_t)tensor_numel(&g->views[V_LAYER(l, P_E2_B)]);
		if (o0 > from)
			D->runs[D->nruns++] = (struct backend_segment){from, o0 - from, 0.0};
		from = o1;
	}
	if (g->nparams > from)
		D->runs[D->nruns++] = (struct backend_segment){from, g->nparams - from, 0.0};
	return 0;
}

int gpt2_distribute(struct gpt2 *g, struct dist *d, const struct moe_plan *plan,
		    const struct moe_dict *dict)
{
	const int W = dist_size(d), q = dist_rank(d), L = g->cfg.n_layer;
	if (W == 1)
		return 0;
	if (g->dist)
		return err_set(CORE_EUSAGE, NULL, "the model is distributed already");
	if (g->forward_only)
		return err_set(CORE_EUSAGE, NULL, "a forward-only model is not trained on ranks");
	if (!g->be->host_visible)
		return err_set(CORE_EUNSUPPORTED, NULL, "training across ranks needs a host-memory "
			       "device (cpu, ref), not '%s'", g->be->name);
	struct gpt2_dist *D = calloc(1, sizeof *D);
	if (!(g->dist = D))
		return CORE_ENOMEM;
	D->d = d, D->W = W, D->q = q, D->dict = dict;
	D->plan = plan ? *plan : (struct moe_plan){.r = 1, .d = 1, .a = DIST_A2A_LINEAR};
	ERR_FORWARD(dist_runs(g));
	if (!g->moe)
		return 0;
	if (!(D->blk = calloc((size_t)L, sizeof *D->blk)))
		return CORE_ENOMEM;
	for (int l = 0; l < L; l++) {
		struct dist_block *db = &D->blk[l];
		if (!moe_is(g, l))
			continue;
		db->cfg = g->moe->cfg;
		db->cfg.seed = (uint64_t)l; /* the block's noise key, as moe_open's layers */
		char why[256];
		int rc = moe_dist_place(&db->pl, &db->cfg, W, q);
		if (rc < 0) { /* the config's key first: the layer's detail says the rest */
			snprintf(why, sizeof why, "%s", err_detail());
			return err_set(rc, NULL, "moe.experts = %d on %d ranks: %s", db->cfg.E, W,
				       why);
		}
		if (!dict && (rc = moe_plan_check(&D->plan, &db->pl)) < 0) {
			snprintf(why, sizeof why, "%s", err_detail());
			return err_set(rc, NULL, "the MoE plan: %s", why);
		}
		ERR_FORWARD(moe_dist_params_alloc(&db->ps, &db->cfg, &db->pl, g->be));
		ERR_FORWARD(moe_dist_params_alloc(&db->gs, &db->cfg, &db->pl, g->be));
		ERR_FORWARD(moe_dist_layer_init(&db->dl, &db->cfg, g->be, d));
		if (!(db->gather = malloc(sizeof(float) * moe_dist_gather_floats(&db->cfg,
										 &db->pl))))
			return err_set(CORE_ENOMEM, NULL, "cannot allocate the gradients' gathering");
	}
	return 0;
}

/* y = MoE_l(x) over N rows on layer (the block's, the shared one or the decoder's) with the
 * capacity setting; the step's routing is kept for gpt2_moe_step and its aux loss summed. */
/* Whether this forward is a distributed training step (gpt2_distribute) */
static int dist_step(const struct gpt2 *g) { return g->dist && g->gate_step >= 0; }

/* moe_block_forward of a distributed training step: this rank's shard of the block's
 * parameters taken from the whole ones, the route, the plan (the static one, or the
 * dictionary's for the step's capacity), the rest of the forward. */
static int moe_block_forward_dist(struct gpt2 *g, int l, const float *x, float *y, int N,
				  double setting)
{
	struct gpt2_dist *D = g->dist;
	struct dist_block *db = &D->blk[l];
	struct moe_block *b = &g->moe->blk[l];

	ERR_FORWARD(moe_dist_params_from_full(&db->ps, &db->cfg, &db->pl, &b->p));
	ERR_FORWARD(moe_dist_route(db->dl, &db->ps, x, N, 0, setting, (uint64_t)g->gate_step));
	struct moe_plan plan = D->plan;
	const struct moe_dict_entry *e =
		D->dict ? moe_dict_lookup(D->dict, moe_dist_layer_last(db->dl)->C, NULL) : NULL;
	if (e)
		plan = e->plan;
	ERR_FORWARD(moe_plan_check(&plan, &db->pl));
	ERR_FORWARD(moe_dist_forward_routed(db->dl, &db->ps, x, y, &plan));
	const struct moe_dist_step *st = moe_dist_layer_last(db->dl);
	b->last = (struct gpt2_moe_step){.tokens = N, .C = st->C, .need = st->need,
					 .dropped = st->dropped, .k = db->cfg.k,
					 .E = db->cfg.E, .aux_loss = st->aux_loss,
					 .ranks = D->W, .r = st->plan.r, .d = st->plan.d,
					 .a2a = dist_a2a_name(st->plan.a)};
	b->ran = db->ran = 1;
	g->aux_loss += st->aux_loss;
	return 0;
}

static int moe_block_forward(struct gpt2 *g, int l, struct moe_layer *layer, const float *x,
			     float *y, int N, double setting)
{
	struct moe_block *b = &g->moe->blk[l];
	const uint64_t step = g->gate_step >= 0 ? (uint64_t)g->gate_step : MOE_STEP_EVAL;

	if (dist_step(g) && layer == b->layer)
		return moe_block_forward_dist(g, l, x, y, N, setting);
	if (g->dist && g->dist->blk)
		g->dist->blk[l].ran = 0;

	ERR_FORWARD(moe_forward(layer, &b->p, x, y, N, 0, setting, step));
	const struct moe_routing *r = moe_layer_routing(layer);
	int64_t need = 0;
	for (int e = 0; e < r->E; e++)
		need = r->count[e] > need ? r->count[e] : need;
	b->last = (struct gpt2_moe_step){.tokens = N, .C = r->C, .need = need,
					 .dropped = r->dropped, .k = r->k, .E = r->E,
					 .aux_loss = r->aux_loss};
	b->ran = 1;
	g->aux_loss += r->aux_loss;
	return 0;
}

int gpt2_moe_step(const struct gpt2 *g, int block, struct gpt2_moe_step *out)
{
	if (!gpt2_block_is_moe(g, block))
		return err_set(CORE_EUSAGE, NULL, "block %d is not an MoE block", block);
	if (!g->moe->blk[block].ran)
		return err_set(CORE_EUSAGE, NULL, "block %d has not routed a batch yet", block);
	*out = g->moe->blk[block].last;
	return 0;
}

int gpt2_moe_route_digest(const struct gpt2 *g, int block, uint64_t *out)
{
	struct gpt2_moe_step st;
	ERR_FORWARD(gpt2_moe_step(g, block, &st));
	const struct gpt2_moe *m = g->moe;
	const struct moe_routing *r =
		moe_layer_routing(m->shared ? m->shared : m->blk[block].layer);
	const size_t n = (size_t)r->k * (size_t)r->T;
	int32_t *h = malloc(2 * n * sizeof *h);
	if (!h)
		return err_set(CORE_ENOMEM, NULL, "out of memory");
	int rc = g->be->op->download(g->be, h, r->idx, n * sizeof *h);
	if (rc == 0)
		rc = g->be->op->download(g->be, h + n, r->loc, n * sizeof *h);
	uint64_t x = 0xcbf29ce484222325ull;
	for (size_t i = 0; rc == 0 && i < 2 * n; i++) {
		x ^= (uint32_t)h[i];
		x *= 0x100000001b3ull;
	}
	free(h);
	*out = x;
	return rc;
}

static void free_acts(struct gpt2_acts *a, struct backend *be)
{
	if (!a)
		return;
	be->op->free(be, a->mem);
	be->op->free(be, a->inputs);
	be->op->free(be, a->targets);
	be->op->free(be, a->sums);
	free(a->layer);
	free(a->segs);
	free(a->seg_decays);
	free(a);
}

/* Carve the activation buffers out of one block; with mem == NULL only count. Each piece
 * starts on a 64-byte boundary. */
static size_t layout_acts(struct gpt2_acts *a, const struct model_config *c, int B, int T,
			  int forward_only, float *mem)
{
	size_t off = 0, N = (size_t)B * T, C = (size_t)c->n_embd;
#define TAKE(ptr, n)                                                                               \
	do {                                                                                       \
		if (mem)                                                                           \
			(ptr) = mem + off;                                                         \
		off += ((size_t)(n) + 15) / 16 * 16;                                               \
	} while (0)
	TAKE(a->encoded, N * C);
	for (int l = 0; l < a->nla; l++) {
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
	TAKE(a->probs, N * model_n_out(c));
	TAKE(a->losses, N);
	if (a->nla == c->n_layer && !forward_only) {
		TAKE(a->dres, N * C);
		TAKE(a->dbuf, N * C);
		TAKE(a->dbig, N * 4 * C);
	}
#undef TAKE
	return off;
}

static int check_config(const struct model_config *c, int B, int T)
{
	if (c->n_layer < 1 || c->n_embd < 1 || c->n_head < 1 || c->seq_len < 1 ||
	    c->vocab_size < 1 || c->n_out < 0)
		return err_set(CORE_ECONFIG, NULL,
			       "model sizes must be positive (n_layer %d, n_embd %d, n_head %d, "
			       "seq_len %d, vocab_size %d, n_out %d)",
			       c->n_layer, c->n_embd, c->n_head, c->seq_len, c->vocab_size,
			       c->n_out);
	if (c->n_embd % c->n_head)
		return err_set(CORE_ECONFIG, NULL, "n_embd %d is not divisible by n_head %d",
			       c->n_embd, c->n_head);
	if (B < 1 || T < 1 || T > c->seq_len)
		return err_set(CORE_EUSAGE, NULL, "batch %d x %d outside 1..seq_len %d", B, T,
			       c->seq_len);
	return 0;
}

/* Names, shapes and offsets (*offs, allocated) of the views (HF order), which get weight decay
 * (matrices, not biases), and each block's first view (g->layer_view). */
static int define_views(struct gpt2 *g, size_t **offsp)
{
	const int L = g->cfg.n_layer;
	const int64_t C = g->cfg.n_embd, V = g->cfg.vocab_size, S = g->cfg.seq_len;
	const int64_t Vo = model_n_out(&g->cfg), E = g->cfg.moe.experts;
	static const struct {
		const char *name;
		int ndim, mult[2]; /* shape in units of C (0: none) */
	} block[P_PER_LAYER] = {
		[P_LN1_W] = {"ln_1.weight", 1, {1, 0}},
		[P_LN1_B] = {"ln_1.bias", 1, {1, 0}},
		[P_ATTN_W] = {"attn.c_attn.weight", 2, {1, 3}},
		[P_ATTN_B] = {"attn.c_attn.bias", 1, {3, 0}},
		[P_APROJ_W] = {"attn.c_proj.weight", 2, {1, 1}},
		[P_APROJ_B] = {"attn.c_proj.bias", 1, {1, 0}},
		[P_LN2_W] = {"ln_2.weight", 1, {1, 0}},
		[P_LN2_B] = {"ln_2.bias", 1, {1, 0}},
		[P_FC_W] = {"mlp.c_fc.weight", 2, {1, 4}},
		[P_FC_B] = {"mlp.c_fc.bias", 1, {4, 0}},
		[P_MPROJ_W] = {"mlp.c_proj.weight", 2, {4, 1}},
		[P_MPROJ_B] = {"mlp.c_proj.bias", 1, {1, 0}},
	};
	/* an MoE block's MoE layer, after the block's first eight (moe.h's wg, w1, b1, w2, b2) */
	static const struct {
		const char *name;
		int ndim;
	} moe[P_PER_MOE - P_GATE_W] = {
		{"moe.gate.weight", 2}, {"moe.fc1.weight", 3}, {"moe.fc1.bias", 2},
		{"moe.fc2.weight", 3}, {"moe.fc2.bias", 2},
	};
	const int64_t moe_ne[P_PER_MOE - P_GATE_W][3] = {
		{C, E, 0}, {E, C, 4 * C}, {E, 4 * C, 0}, {E, 4 * C, C}, {E, C, 0},
	};
	size_t off = 0, *offs;
	char name[TENSOR_NAME_MAX];
	unsigned char *is = calloc((size_t)L, 1);
	int nmoe = is ? model_moe_blocks(&g->cfg, is) : CORE_ENOMEM;

	if (nmoe < 0) {
		free(is);
		return nmoe;
	}
	g->nviews = 2 + L * P_PER_LAYER + nmoe * (P_PER_MOE - P_PER_LAYER) + 3;
	g->views = calloc((size_t)g->nviews, sizeof *g->views);
	g->decay_mask = calloc((size_t)g->nviews, 1);
	g->layer_view = calloc((size_t)L + 1, sizeof *g->layer_view);
	offs = *offsp = calloc((size_t)g->nviews, sizeof *offs);
	if (!g->views || !g->decay_mask || !g->layer_view || !offs) {
		free(is);
		return CORE_ENOMEM;
	}
#define ADD_VIEW(idx, nm, nd, e0, e1, e2)                                                      \
	do {                                                                                   \
		int64_t ne_[3] = {(e0), (e1), (e2)};                                           \
		size_t len_ = strlen(nm);                                                      \
		tensor_view(&g->views[idx], DT_F32, (nd), ne_, NULL, (nm));                    \
		offs[idx] = off;                                                               \
		off += (size_t)tensor_numel(&g->views[idx]);                                   \
		/* weight decay on matrices only (an MoE block's biases are [E, n]) */         \
		g->decay_mask[idx] = (nd) >= 2 && !(len_ > 5 && !strcmp(nm + len_ - 5, ".bias")); \
	} while (0)
	ADD_VIEW(V_WTE, "wte.weight", 2, V, C, 0);
	ADD_VIEW(V_WPE, "wpe.weight", 2, S, C, 0);
	int v = 2;
	for (int l = 0; l < L; l++) {
		g->layer_view[l] = v;
		for (int p = 0; p < (is[l] ? P_GATE_W : P_PER_LAYER); p++) {
			snprintf(name, sizeof name, "h.%d.%s", l, block[p].name);
			ADD_VIEW(v, name, block[p].ndim, block[p].mult[0] * C, block[p].mult[1] * C,
				 0);
			v++;
		}
		for (int p = 0; is[l] && p < P_PER_MOE - P_GATE_W; p++) {
			snprintf(name, sizeof name, "h.%d.%s", l, moe[p].name);
			ADD_VIEW(v, name, moe[p].ndim, moe_ne[p][0], moe_ne[p][1], moe_ne[p][2]);
			v++;
		}
	}
	g->layer_view[L] = v;
	ADD_VIEW(v, "ln_f.weight", 1, C, 0, 0);
	ADD_VIEW(v + 1, "ln_f.bias", 1, C, 0, 0);
	ADD_VIEW(v + 2, "lm_head.weight", 2, Vo, C, 0);
#undef ADD_VIEW
	g->nparams = off;
	free(is);
	return 0;
}

/* AdamW's segments: runs of consecutive views with the same decay flag. */
static void build_segments(struct gpt2 *g)
{
	struct gpt2_acts *a = g->acts;
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
}

/* Parameters, gradients, moments and activations in backend memory, all zeroed: nothing
 * uninitialised is ever read, and the pages are touched before the first step. */
static int alloc_buffers(struct gpt2 *g, int B, int T)
{
	struct backend *be = g->be;
	struct gpt2_acts *a = g->acts;
	const size_t pbytes = g->nparams * sizeof(float), N = (size_t)B * T;
	float **bufs[] = {&g->params, &g->grads, &g->m, &g->v};

	for (size_t i = 0; i < (g->forward_only ? 1 : sizeof bufs / sizeof bufs[0]); i++)
		ERR_FORWARD(backend_alloc_zero(be, (void **)bufs[i], pbytes));
	a->nfloats = layout_acts(a, &g->cfg, B, T, g->forward_only, NULL);
	ERR_FORWARD(backend_alloc_zero(be, (void **)&a->mem, a->nfloats * sizeof(float)));
	layout_acts(a, &g->cfg, B, T, g->forward_only, a->mem);
	ERR_FORWARD(backend_alloc_zero(be, (void **)&a->inputs, N * sizeof(int32_t)));
	ERR_FORWARD(backend_alloc_zero(be, (void **)&a->targets, N * sizeof(int32_t)));
	ERR_FORWARD(backend_alloc_zero(be, (void **)&a->sums, 2 * sizeof(double)));
	return 0;
}

/* Whether be keeps bfloat16 activations (gpt2_bf16_activations' default) */
static int bf16_acts_here(const struct backend *be)
{
	const struct backend_ops *o = be->op;
	return be->precision == BACKEND_BF16 && o->layernorm_forward_bf16 &&
	       o->residual_layernorm_forward_bf16 && o->bias_act_forward_bf16 &&
	       o->attention_forward_bf16 && o->matmul_forward_bf16 && o->matmul_backward_bf16;
}

int gpt2_bf16_activations(struct gpt2 *g, int on)
{
	if (on && !bf16_acts_here(g->be))
		return err_set(CORE_EUSAGE, NULL, "backend '%s' in %s keeps no bfloat16 "
			       "activations", g->be->name,
			       backend_precision_name(g->be->precision));
	g->acts_bf16 = on != 0;
	return 0;
}

static int create(struct gpt2 *g, const struct model_config *cfg, int B, int T,
		  struct backend *be, int forward_only)
{
	size_t *offs = NULL;
	int rc;

	memset(g, 0, sizeof *g);
	ERR_FORWARD(check_config(cfg, B, T));
	g->cfg = *cfg;
	g->be = be;
	g->B = B;
	g->T = T;
	g->forward_only = forward_only;
	g->gate_step = -1;
	g->acts_bf16 = bf16_acts_here(be);
	g->acts = calloc(1, sizeof *g->acts);
	if (!g->acts)
		goto nomem;
	if ((rc = define_views(g, &offs)) < 0)
		goto fail;
	struct gpt2_acts *a = g->acts;
	const size_t nv = (size_t)g->nviews;
	a->nla = forward_only && cfg->n_layer > 2 ? 2 : cfg->n_layer;
	a->layer = calloc((size_t)a->nla, sizeof *a->layer);
	a->segs = calloc(nv, sizeof *a->segs);
	a->seg_decays = calloc(nv, 1);
	if (!a->layer || !a->segs || !a->seg_decays)
		goto nomem;
	rc = alloc_buffers(g, B, T);
	if (rc < 0)
		goto fail;
	for (int i = 0; i < g->nviews; i++) {
		g->views[i].data = g->params + offs[i];
		g->views[i].be = be;
	}
	build_segments(g);
	if (cfg->moe.experts > 0 && (rc = moe_open(g, B * T)) < 0)
		goto fail;
	free(offs);
	return 0;
nomem:
	rc = CORE_ENOMEM;
fail:
	free(offs);
	gpt2_free(g);
	return rc == CORE_ENOMEM ? err_set(CORE_ENOMEM, NULL, "cannot allocate the model (%d "
					   "layers, %d channels) on '%s'", cfg->n_layer,
					   cfg->n_embd, be->name)
				 : rc;
}

int gpt2_create(struct gpt2 *g, const struct model_config *cfg, int B, int T,
		struct backend *be)
{
	return create(g, cfg, B, T, be, 0);
}

int gpt2_create_forward(struct gpt2 *g, const struct model_config *cfg, int B, int T,
			struct backend *be)
{
	return create(g, cfg, B, T, be, 1);
}

void gpt2_free(struct gpt2 *g)
{
	struct backend *be = g->be;
	if (be) {
		be->op->free(be, g->params);
		be->op->free(be, g->grads);
		be->op->free(be, g->m);
		be->op->free(be, g->v);
		free_acts(g->acts, be);
	}
	dist_free(g);
	moe_close(g);
	free(g->views);
	free(g->decay_mask);
	free(g->layer_view);
	memset(g, 0, sizeof *g);
}

/* One tensor's initial values: what gpt2_init_params gives the view `name` (ndim dims, n
 * floats at flat offset base) of a model of L layers. */
static int init_tensor(struct backend *be, int L, const char *nm, int ndim, float *x, size_t n,
		       uint64_t base, uint64_t seed)
{
	const float res_std = 0.02f / sqrtf(2.0f * (float)L);
	size_t len = strlen(nm);
#define ENDS(s) (len >= strlen(s) && strcmp(nm + len - strlen(s), (s)) == 0)
	if (ENDS("ln_1.weight") || ENDS("ln_2.weight") || ENDS("ln_f.weight"))
		return be->op->fill(be, x, n, 1.0f);
	if (ndim == 1 || ENDS(".bias")) /* an MoE block's biases are [E, n] */
		return be->op->memset(be, x, 0, sizeof(float) * n);
	if (ENDS("attn.c_proj.weight") || ENDS("mlp.c_proj.weight") || ENDS("moe.fc2.weight"))
		return be->op->fill_normal(be, x, n, 0.0f, res_std, seed, RNG_STREAM_INIT, base);
	return be->op->fill_normal(be, x, n, 0.0f, 0.02f, seed, RNG_STREAM_INIT, base);
#undef ENDS
}

int gpt2_init_params(struct gpt2 *g, uint64_t seed)
{
	for (int i = 0; i < g->nviews; i++) {
		struct tensor *t = &g->views[i];
		float *x = t->data;
		ERR_FORWARD(init_tensor(g->be, g->cfg.n_layer, t->name, t->ndim, x,
					(size_t)tensor_numel(t), (uint64_t)(x - g->params), seed));
	}
	return 0;
}

int gpt2_layout(const struct model_config *cfg, struct gpt2_layout *out)
{
	struct gpt2 g;

	memset(out, 0, sizeof *out);
	memset(&g, 0, sizeof g);
	ERR_FORWARD(check_config(cfg, 1, 1));
	g.cfg = *cfg;
	int rc = define_views(&g, &out->offs);
	if (rc < 0) {
		free(out->offs);
		free(g.views);
		free(g.decay_mask);
		free(g.layer_view);
		memset(out, 0, sizeof *out);
		return rc == CORE_ENOMEM ? err_set(CORE_ENOMEM, NULL, "cannot describe the model")
					 : rc;
	}
	free(g.decay_mask);
	free(g.layer_view);
	out->views = g.views;
	out->n = g.nviews;
	out->nparams = g.nparams;
	out->n_layer = cfg->n_layer;
	return 0;
}

void gpt2_layout_free(struct gpt2_layout *l)
{
	free(l->views);
	free(l->offs);
	memset(l, 0, sizeof *l);
}

int gpt2_init_view(const struct gpt2_layout *l, int i, struct backend *be, float *x,
		   uint64_t seed)
{
	const struct tensor *t = &l->views[i];
	return init_tensor(be, l->n_layer, t->name, t->ndim, x, (size_t)tensor_numel(t),
			   (uint64_t)l->offs[i], seed);
}

/* Tokens of a batch outside [0, V) are the caller's error, caught on the host. */
static int check_tokens(const struct gpt2 *g, const int32_t *inputs, const int32_t *targets,
			int N)
{
	const int V = g->cfg.vocab_size, Vo = model_n_out(&g->cfg);
	for (int n = 0; n < N; n++) {
		if (inputs[n] < 0 || inputs[n] >= V)
			return err_set(CORE_EUSAGE, NULL, "token %d at position %d outside 0..%d",
				       inputs[n], n, V - 1);
		if (targets && (targets[n] < 0 || targets[n] >= Vo))
			return err_set(CORE_EUSAGE, NULL, "target %d at position %d outside 0..%d",
				       targets[n], n, Vo - 1);
	}
	return 0;
}

/* The ops that write or read an activation which feeds only products: in its float form,
 * or, when h (g->acts_bf16, and for ln_2 a dense MLP), in bfloat16 in the first half of the
 * same buffer (backend.h: the same bits either way). */
static int mm_forward(struct gpt2 *g, int h, float *y, const float *x, const float *w,
		      const float *bias, int N, int IC, int OC, enum backend_wlayout lay)
{
	struct backend *be = g->be;
	return h ? be->op->matmul_forward_bf16(be, y, (const uint16_t *)(const void *)x, w, bias,
					       N, IC, OC, lay)
		 : be->op->matmul_forward(be, y, x, w, bias, N, IC, OC, lay);
}

static int mm_backward(struct gpt2 *g, int h, float *dx, float *dw, float *dbias,
		       const float *dy, const float *x, const float *w, int N, int IC, int OC,
		       enum backend_wlayout lay)
{
	struct backend *be = g->be;
	return h ? be->op->matmul_backward_bf16(be, dx, dw, dbias, dy,
						(const uint16_t *)(const void *)x, w, N, IC, OC,
						lay, 0)
		 : be->op->matmul_backward(be, dx, dw, dbias, dy, x, w, N, IC, OC, lay, 0);
}

static int res_layernorm(struct gpt2 *g, int h, float *res, float *out, float *mean,
			 float *rstd, const float *skip, const float *bias, const float *w,
			 const float *b, int N, int C)
{
	struct backend *be = g->be;
	return h ? be->op->residual_layernorm_forward_bf16(be, res, (uint16_t *)(void *)out, mean,
							   rstd, skip, bias, w, b, N, C)
		 : be->op->residual_layernorm_forward(be, res, out, mean, rstd, skip, bias, w, b,
						      N, C);
}

/* The blocks: layer l's attention and MLP, each residual add fused with the LayerNorm that
 * follows (ln_2, then ln_1 of l+1 or ln_f). */
/* Blocks 0..last (last = L - 1 for the whole model). */
static int forward_blocks(struct gpt2 *g, int B, int T, int last)
{
	struct backend *be = g->be;
	struct gpt2_acts *a = g->acts;
	const int L = g->cfg.n_layer, C = g->cfg.n_embd, NH = g->cfg.n_head, N = B * T;
	const int h = g->acts_bf16;

	for (int l = 0; l <= last; l++) {
		struct layer_acts *la = LA(a, l);
		const float *x = l == 0 ? a->encoded : LA(a, l - 1)->res3;
		/* the LayerNorm after this block: ln_1 of l+1, or ln_f */
		float *nw = P(g, l + 1 < L ? V_LAYER(l + 1, P_LN1_W) : V_LAYER(L, 0));
		float *nb = P(g, l + 1 < L ? V_LAYER(l + 1, P_LN1_B) : V_LAYER(L, 1));
		float *nout = l + 1 < L ? LA(a, l + 1)->ln1 : a->lnf;
		float *nmean = l + 1 < L ? LA(a, l + 1)->ln1_mean : a->lnf_mean;
		float *nrstd = l + 1 < L ? LA(a, l + 1)->ln1_rstd : a->lnf_rstd;
#define W(p) P(g, V_LAYER(l, p))
		/* ln_2 feeds the MoE layer in float */
		const int h2 = h && !moe_is(g, l);
		ERR_FORWARD(mm_forward(g, h, la->qkv, la->ln1, W(P_ATTN_W), W(P_ATTN_B), N, C,
				       3 * C, BACKEND_W_IO));
		ERR_FORWARD(h ? be->op->attention_forward_bf16(be, (uint16_t *)(void *)la->atty,
							       la->att, la->qkv, B, T, C, NH)
			      : be->op->attention_forward(be, la->atty, la->att, la->qkv, B, T, C,
							  NH));
		ERR_FORWARD(mm_forward(g, h, la->res2, la->atty, W(P_APROJ_W), NULL, N, C, C,
				       BACKEND_W_IO));
		ERR_FORWARD(res_layernorm(g, h2, la->res2, la->ln2, la->ln2_mean, la->ln2_rstd, x,
					  W(P_APROJ_B), W(P_LN2_W), W(P_LN2_B), N, C));
		if (moe_is(g, l)) {
			struct gpt2_moe *m = g->moe;
			/* evaluation drops nothing (setting 0), so that its loss does not depend on
			 * how the windows are batched; training uses the configured capacity */
			ERR_FORWARD(moe_block_forward(g, l, m->shared ? m->shared : m->blk[l].layer,
						      la->ln2, la->res3, N,
						      g->gate_step >= 0 ? m->cfg.capacity_setting
									: 0.0));
			/* x' = x2 + moe (its biases inside), fused with the next LayerNorm */
			ERR_FORWARD(res_layernorm(g, h, la->res3, nout, nmean, nrstd, la->res2,
						  NULL, nw, nb, N, C));
			continue;
		}
		ERR_FORWARD(mm_forward(g, h, la->fch, la->ln2, W(P_FC_W), NULL, N, C, 4 * C,
				       BACKEND_W_IO));
		ERR_FORWARD(h ? be->op->bias_act_forward_bf16(be, la->fch,
							      (uint16_t *)(void *)la->fch_gelu,
							      W(P_FC_B), N, 4 * C, BACKEND_ACT_GELU)
			      : be->op->bias_act_forward(be, la->fch, la->fch_gelu, W(P_FC_B), N,
							 4 * C, BACKEND_ACT_GELU));
		ERR_FORWARD(mm_forward(g, h, la->res3, la->fch_gelu, W(P_MPROJ_W), NULL, N, 4 * C,
				       C, BACKEND_W_IO));
		/* x' = x2 + mlp, fused with the next LayerNorm */
		ERR_FORWARD(res_layernorm(g, h, la->res3, nout, nmean, nrstd, la->res2,
					  W(P_MPROJ_B), nw, nb, N, C));
#undef W
	}
	return 0;
}

/* The batch in, then the embedding and blocks 0..last. */
static int forward_to(struct gpt2 *g, const int32_t *inputs, const int32_t *targets, int B,
		      int T, int last)
{
	struct backend *be = g->be;
	struct gpt2_acts *a = g->acts;
	const int C = g->cfg.n_embd;
	if (B < 1 || T < 1 || B > g->B || T > g->T)
		return err_set(CORE_EUSAGE, NULL, "batch %d x %d exceeds the model's %d x %d", B, T,
			       g->B, g->T);
	const int N = B * T;
	ERR_FORWARD(check_tokens(g, inputs, targets, N));
	a->have_targets = 0;
	g->aux_loss = 0.0f;
	ERR_FORWARD(be->op->upload(be, a->inputs, inputs, sizeof(int32_t) * (size_t)N));
	if (targets)
		ERR_FORWARD(be->op->upload(be, a->targets, targets, sizeof(int32_t) * (size_t)N));
	a->B = B;
	a->T = T;

	ERR_FORWARD(be->op->encoder_forward(be, a->encoded, a->inputs, P(g, V_WTE), P(g, V_WPE),
					    B, T, C));
	struct layer_acts *l0 = LA(a, 0);
	const float *w0 = P(g, V_LAYER(0, P_LN1_W)), *b0 = P(g, V_LAYER(0, P_LN1_B));
	ERR_FORWARD(g->acts_bf16
			    ? be->op->layernorm_forward_bf16(be, (uint16_t *)(void *)l0->ln1,
							     l0->ln1_mean, l0->ln1_rstd,
							     a->encoded, w0, b0, N, C)
			    : be->op->layernorm_forward(be, l0->ln1, l0->ln1_mean, l0->ln1_rstd,
							a->encoded, w0, b0, N, C));
	return forward_blocks(g, B, T, last);
}

int gpt2_forward_hidden(struct gpt2 *g, const int32_t *inputs, int B, int T, int layer,
			float *out)
{
	if (layer < 0 || layer >= g->cfg.n_layer)
		return err_set(CORE_EUSAGE, NULL, "layer %d outside 0..%d", layer,
			       g->cfg.n_layer - 1);
	ERR_FORWARD(forward_to(g, inputs, NULL, B, T, layer));
	return g->be->op->download(g->be, out, LA(g->acts, layer)->res3,
				   sizeof(float) * (size_t)B * T * g->cfg.n_embd);
}

int gpt2_forward(struct gpt2 *g, const int32_t *inputs, const int32_t *targets, int B, int T,
		 float *loss)
{
	struct backend *be = g->be;
	struct gpt2_acts *a = g->acts;
	const int L = g->cfg.n_layer, C = g->cfg.n_embd, V = model_n_out(&g->cfg);
	a->dist = dist_step(g);
	ERR_FORWARD(forward_to(g, inputs, targets, B, T, L - 1));
	const int N = B * T;
	ERR_FORWARD(mm_forward(g, g->acts_bf16, a->probs, a->lnf, P(g, V_LAYER(L, 2)), NULL, N,
			       C, V, BACKEND_W_OI));
	ERR_FORWARD(be->op->crossentropy_forward(be, a->probs, a->losses,
						 targets ? a->targets : NULL, N, V));
	a->have_targets = targets != NULL;
	if (targets && loss) {
		double s;
		ERR_FORWARD(be->op->sum(be, &a->sums[0], a->losses, (size_t)N, 0));
		ERR_FORWARD(be->op->download(be, &s, &a->sums[0], sizeof s));
		if (dist_step(g)) /* the mean over every rank's tokens */
			ERR_FORWARD(dist_allreduce_f64(g->dist->d, &s, 1, DIST_SUM));
		*loss = (float)(s / ((double)N * (dist_step(g) ? g->dist->W : 1)));
		if (!isfinite(*loss))
			return err_set(CORE_ENAN, NULL, "loss is %g", (double)*loss);
	}
	return 0;
}

int gpt2_forward_logits(struct gpt2 *g, const int32_t *inputs, int B, int T, float *out)
{
	struct backend *be = g->be;
	struct gpt2_acts *a = g->acts;
	const int L = g->cfg.n_layer, C = g->cfg.n_embd, V = model_n_out(&g->cfg);
	ERR_FORWARD(forward_to(g, inputs, NULL, B, T, L - 1));
	ERR_FORWARD(mm_forward(g, g->acts_bf16, a->probs, a->lnf, P(g, V_LAYER(L, 2)), NULL,
			       B * T, C, V, BACKEND_W_OI));
	return be->op->download(be, out, a->probs, sizeof(float) * (size_t)B * T * V);
}

/* ---- incremental decoding ------------------------------------------------------------------ */

int gpt2_decoder_open(struct gpt2_decoder *d, struct gpt2 *g)
{
	struct backend *be = g->be;
	const size_t L = (size_t)g->cfg.n_layer, T = (size_t)g->cfg.seq_len;
	const size_t C = (size_t)g->cfg.n_embd, V = (size_t)model_n_out(&g->cfg);
	struct {
		float **p;
		size_t n;
	} b[] = {{&d->qkv, L * T * 3 * C}, {&d->x, C}, {&d->res, C}, {&d->ln, C}, {&d->atty, C},
		 {&d->fch, 4 * C}, {&d->fch_act, 4 * C}, {&d->scores, T}, {&d->logits, V},
		 {&d->stat, 2}};

	memset(d, 0, sizeof *d);
	d->g = g;
	if (g->moe && !g->moe->dec) {
		struct moe_config dc = g->moe->cfg;
		dc.T = 1;
		ERR_FORWARD(moe_layer_init(&g->moe->dec, &dc, be));
	}
	for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
		if (backend_alloc_zero(be, (void **)b[i].p, sizeof(float) * b[i].n) < 0) {
			gpt2_decoder_close(d);
			return err_set(CORE_ENOMEM, NULL, "cannot allocate the decoding cache");
		}
	if (backend_alloc_zero(be, (void **)&d->tok, sizeof(int32_t)) < 0) {
		gpt2_decoder_close(d);
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the decoding cache");
	}
	return 0;
}

void gpt2_decoder_close(struct gpt2_decoder *d)
{
	struct backend *be = d->g ? d->g->be : NULL;
	if (be) {
		float *b[] = {d->qkv, d->x, d->res, d->ln, d->atty, d->fch, d->fch_act, d->scores,
			      d->logits, d->stat};
		for (size_t i = 0; i < sizeof b / sizeof b[0]; i++)
			be->op->free(be, b[i]);
		be->op->free(be, d->tok);
	}
	memset(d, 0, sizeof *d);
}

void gpt2_decoder_reset(struct gpt2_decoder *d)
{
	d->pos = 0;
}

/* The same operations as forward_blocks on one row, with the attention over the cache: per
 * head, scores = q K^T / sqrt(hs) over positions 0..t (a row of gemm against the cached k
 * rows, stride 3C), their softmax (the cross-entropy op without targets), then P V. */
int gpt2_decoder_step(struct gpt2_decoder *d, int32_t token, float *logits)
{
	struct gpt2 *g = d->g;
	struct backend *be = g->be;
	const int L = g->cfg.n_layer, C = g->cfg.n_embd, NH = g->cfg.n_head, hs = C / NH;
	const int T = g->cfg.seq_len, V = g->cfg.vocab_size, Vo = model_n_out(&g->cfg);
	const int t = d->pos;
	if (t >= T)
		return err_set(CORE_EUSAGE, NULL, "the decoding cache is full: %d positions", T);
	if (token < 0 || token >= V)
		return err_set(CORE_EUSAGE, NULL, "token %d outside the vocabulary [0, %d)",
			       (int)token, V);
	ERR_FORWARD(be->op->upload(be, d->tok, &token, sizeof token));
	/* position t: the encoder op adds wpe row n % T of what it is given, here row 0 of
	 * wpe + t C */
	ERR_FORWARD(be->op->encoder_forward(be, d->x, d->tok, P(g, V_WTE),
					    P(g, V_WPE) + (size_t)t * C, 1, 1, C));
	ERR_FORWARD(be->op->layernorm_forward(be, d->ln, d->stat, d->stat + 1, d->x,
					      P(g, V_LAYER(0, P_LN1_W)), P(g, V_LAYER(0, P_LN1_B)),
					      1, C));
	const float scale = 1.0f / sqrtf((float)hs);
	float *x = d->x, *res = d->res;
	for (int l = 0; l < L; l++) {
		float *cache = d->qkv + (size_t)l * T * 3 * C, *row = cache + (size_t)t * 3 * C;
		float *nw = P(g, l + 1 < L ? V_LAYER(l + 1, P_LN1_W) : V_LAYER(L, 0));
		float *nb = P(g, l + 1 < L ? V_LAYER(l + 1, P_LN1_B) : V_LAYER(L, 1));
#define W(p) P(g, V_LAYER(l, p))
		ERR_FORWARD(be->op->matmul_forward(be, row, d->ln, W(P_ATTN_W), W(P_ATTN_B), 1, C,
						   3 * C, BACKEND_W_IO));
		for (int h = 0; h < NH; h++) {
			const float *q = row + (size_t)h * hs, *k = cache + C + (size_t)h * hs;
			ERR_FORWARD(be->op->gemm(be, 0, 1, 1, t + 1, hs, scale, q, 3 * C, k, 3 * C,
						 0.0f, d->scores, t + 1));
			ERR_FORWARD(be->op->crossentropy_forward(be, d->scores, NULL, NULL, 1,
								 t + 1));
			ERR_FORWARD(be->op->gemm(be, 0, 0, 1, hs, t + 1, 1.0f, d->scores, t + 1,
						 k + C, 3 * C, 0.0f, d->atty + (size_t)h * hs, C));
		}
		ERR_FORWARD(be->op->matmul_forward(be, res, d->atty, W(P_APROJ_W), NULL, 1, C, C,
						   BACKEND_W_IO));
		ERR_FORWARD(be->op->residual_layernorm_forward(be, res, d->ln, d->stat, d->stat + 1,
							       x, W(P_APROJ_B), W(P_LN2_W),
							       W(P_LN2_B), 1, C));
		if (moe_is(g, l)) {
			/* one token routed alone: setting 0, so none of its choices is dropped */
			ERR_FORWARD(moe_forward(g->moe->dec, &g->moe->blk[l].p, d->ln, x, 1, 0, 0.0,
						MOE_STEP_EVAL));
			ERR_FORWARD(be->op->residual_layernorm_forward(be, x, d->ln, d->stat,
								       d->stat + 1, res, NULL, nw,
								       nb, 1, C));
			continue;
		}
		ERR_FORWARD(be->op->matmul_forward(be, d->fch, d->ln, W(P_FC_W), NULL, 1, C, 4 * C,
						   BACKEND_W_IO));
		ERR_FORWARD(be->op->bias_act_forward(be, d->fch, d->fch_act, W(P_FC_B), 1, 4 * C,
						     BACKEND_ACT_GELU));
		/* the block's output goes to x (its input is no longer needed): x = res + mlp */
		ERR_FORWARD(be->op->matmul_forward(be, x, d->fch_act, W(P_MPROJ_W), NULL, 1, 4 * C,
						   C, BACKEND_W_IO));
		ERR_FORWARD(be->op->residual_layernorm_forward(be, x, d->ln, d->stat, d->stat + 1,
							       res, W(P_MPROJ_B), nw, nb, 1, C));
#undef W
	}
	d->pos = t + 1;
	if (!logits)
		return 0;
	ERR_FORWARD(be->op->matmul_forward(be, d->logits, d->ln, P(g, V_LAYER(L, 2)), NULL, 1, C,
					   Vo, BACKEND_W_OI));
	return be->op->download(be, logits, d->logits, sizeof(float) * (size_t)Vo);
}

int gpt2_losses(const struct gpt2 *g, float *out)
{
	const struct gpt2_acts *a = g->acts;
	if (!a->have_targets)
		return err_set(CORE_EUSAGE, NULL, "no forward with targets to take losses from");
	return g->be->op->download(g->be, out, a->losses, sizeof(float) * (size_t)a->B * a->T);
}

void gpt2_profile(struct gpt2 *g, int enable)
{
	g->be->op->profile(g->be, enable);
}

double gpt2_gemm_seconds(const struct gpt2 *g)
{
	return g->be->op->gemm_seconds(g->be);
}

/* Layer l's backward: dres holds dL/d(block output) on entry and dL/d(block input) on
 * return (the residual stream accumulates). */
static int backward_block(struct gpt2 *g, int l, int B, int T)
{
	struct backend *be = g->be;
	struct gpt2_acts *a = g->acts;
	const int C = g->cfg.n_embd, NH = g->cfg.n_head, N = B * T;
	struct layer_acts *la = &a->layer[l];
	const float *x = l == 0 ? a->encoded : a->layer[l - 1].res3;
	const int h = g->acts_bf16;
#define W(p) P(g, V_LAYER(l, p))
#define DW(p) G(g, V_LAYER(l, p))
	if (moe_is(g, l)) {
		/* x' = x2 + moe(ln2): the layer's backward from dres, with the auxiliary loss's
		 * gradient at its weight */
		struct moe_block *b = &g->moe->blk[l];
		struct dist_block *db = g->dist && g->dist->blk ? &g->dist->blk[l] : NULL;
		if (db && db->ran) {
			/* the shard's gradients (summed over the ranks' tokens), put together */
			ERR_FORWARD(moe_dist_backward(db->dl, &db->ps, la->ln2, a->dres, a->dbuf,
						      &db->gs, (float)g->cfg.moe.aux_weight));
			ERR_FORWARD(moe_dist_params_to_full_buf(&b->gr, &db->cfg, &db->pl, &db->gs,
								g->dist->d, db->gather));
			db->ran = 0;
		} else {
			ERR_FORWARD(moe_backward(b->layer, &b->p, la->ln2, a->dres, a->dbuf,
						 &b->gr, (float)g->cfg.moe.aux_weight));
		}
	} else {
		/* x' = x2 + gelu(fch) Wp + bp: dres flows to x2 unchanged */
		ERR_FORWARD(mm_backward(g, h, a->dbig, DW(P_MPROJ_W), DW(P_MPROJ_B), a->dres,
					la->fch_gelu, W(P_MPROJ_W), N, 4 * C, C, BACKEND_W_IO));
		ERR_FORWARD(be->op->act_backward(be, a->dbig, DW(P_FC_B), la->fch, N, 4 * C,
						 BACKEND_ACT_GELU));
		ERR_FORWARD(mm_backward(g, h, a->dbuf, DW(P_FC_W), NULL, a->dbig, la->ln2,
					W(P_FC_W), N, C, 4 * C, BACKEND_W_IO));
	}
	ERR_FORWARD(be->op->layernorm_backward(be, a->dres, DW(P_LN2_W), DW(P_LN2_B), a->dbuf,
					       la->res2, W(P_LN2_W), la->ln2_mean, la->ln2_rstd,
					       N, C, 1));
	/* x2 = x + y Wo + bo */
	ERR_FORWARD(mm_backward(g, h, a->dbuf, DW(P_APROJ_W), DW(P_APROJ_B), a->dres, la->atty,
				W(P_APROJ_W), N, C, C, BACKEND_W_IO));
	ERR_FORWARD(be->op->attention_backward(be, a->dbig, a->dbuf, la->qkv, la->att, B, T, C,
					       NH));
	ERR_FORWARD(mm_backward(g, h, a->dbuf, DW(P_ATTN_W), DW(P_ATTN_B), a->dbig, la->ln1,
				W(P_ATTN_W), N, C, 3 * C, BACKEND_W_IO));
	ERR_FORWARD(be->op->layernorm_backward(be, a->dres, DW(P_LN1_W), DW(P_LN1_B), a->dbuf,
					       x, W(P_LN1_W), la->ln1_mean, la->ln1_rstd, N, C,
					       1));
#undef W
#undef DW
	return 0;
}

int gpt2_backward(struct gpt2 *g)
{
	struct backend *be = g->be;
	struct gpt2_acts *a = g->acts;
	const int L = g->cfg.n_layer, C = g->cfg.n_embd, V = g->cfg.vocab_size;
	const int Vo = model_n_out(&g->cfg);
	const int B = a->B, T = a->T, N = B * T;
	if (g->forward_only)
		return err_set(CORE_EUSAGE, NULL, "backward on a forward-only model");
	if (!a->have_targets)
		return err_set(CORE_EUSAGE, NULL, "backward needs a forward with targets");
	a->have_targets = 0; /* probs become dlogits below */

	/* loss = mean of N cross-entropies: dlogits = (p - onehot) / N, in place */
	ERR_FORWARD(be->op->crossentropy_backward(be, a->probs, a->targets, N, Vo,
						  1.0f / ((float)N * (a->dist ? g->dist->W : 1))));
	ERR_FORWARD(mm_backward(g, g->acts_bf16, a->dbuf, G(g, V_LAYER(L, 2)), NULL, a->probs,
				a->lnf, P(g, V_LAYER(L, 2)), N, C, Vo, BACKEND_W_OI));
	ERR_FORWARD(be->op->layernorm_backward(be, a->dres, G(g, V_LAYER(L, 0)),
					       G(g, V_LAYER(L, 1)), a->dbuf,
					       a->layer[L - 1].res3, P(g, V_LAYER(L, 0)),
					       a->lnf_mean, a->lnf_rstd, N, C, 0));
	for (int l = L - 1; l >= 0; l--)
		ERR_FORWARD(backward_block(g, l, B, T));
	ERR_FORWARD(be->op->encoder_backward(be, G(g, V_WTE), G(g, V_WPE), a->dres, a->inputs, B,
					     T, C, V));
	if (T < g->cfg.seq_len) /* positions the batch did not reach get no gradient */
		ERR_FORWARD(be->op->memset(be, G(g, V_WPE) + (size_t)T * C, 0,
					   sizeof(float) * (size_t)(g->cfg.seq_len - T) * C));
	/* data parallel: the ranks' gradients summed (the MoE layers' are already whole) */
	for (int i = 0; a->dist && i < g->dist->nruns; i++)
		ERR_FORWARD(dist_allreduce_f32(g->dist->d, g->grads + g->dist->runs[i].offset,
					       g->dist->runs[i].n));
	return 0;
}

int gpt2_grad_norm(struct gpt2 *g, float *norm)
{
	struct backend *be = g->be;
	double ss;
	if (g->forward_only)
		return err_set(CORE_EUSAGE, NULL, "gradient norm of a forward-only model");
	ERR_FORWARD(be->op->sum(be, &g->acts->sums[1], g->grads, g->nparams, 1));
	ERR_FORWARD(be->op->download(be, &ss, &g->acts->sums[1], sizeof ss));
	*norm = (float)sqrt(ss);
	return 0;
}

int gpt2_adamw_step(struct gpt2 *g, const struct adamw_config *opt, double lr, long t,
		    float grad_scale)
{
	struct gpt2_acts *a = g->acts;
	if (g->forward_only)
		return err_set(CORE_EUSAGE, NULL, "optimizer step on a forward-only model");
	for (int i = 0; i < a->nsegs; i++)
		a->segs[i].weight_decay = a->seg_decays[i] ? opt->weight_decay : 0.0;
	return g->be->op->adamw_update(g->be, g->params, g->grads, g->m, g->v, a->segs,
				       a->nsegs, lr, opt->beta1, opt->beta2, opt->eps, t,
				       grad_scale);
}

struct tensor *gpt2_find(struct gpt2 *g, const char *name)
{
	for (int i = 0; i < g->nviews; i++)
		if (strcmp(g->views[i].name, name) == 0)
			return &g->views[i];
	return NULL;
}
