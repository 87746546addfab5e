/* gpt2.h - the GPT-2 model of DESIGN.md: forward, backward, AdamW, on any backend.
 *
 * The model holds its backend and allocates everything through it: parameters, gradients,
 * the AdamW moments and the activations live in backend memory, and every step is a
 * sequence of backend ops (backend.h). Tokens come in from the host; the loss, the gradient
 * norm and per-position losses go out to the host when the caller asks for them.
 *
 * Parameters live in one contiguous float buffer; each has a named tensor view with the
 * Hugging Face GPT-2 name and shape (wte.weight [V,C], wpe.weight [T,C], h.{i}.ln_1.weight [C],
 * h.{i}.ln_1.bias, h.{i}.attn.c_attn.weight [C,3C] (Conv1D layout: y = x W + b),
 * h.{i}.attn.c_attn.bias [3C], h.{i}.attn.c_proj.weight [C,C], h.{i}.attn.c_proj.bias,
 * h.{i}.ln_2.*, h.{i}.mlp.c_fc.weight [C,4C], h.{i}.mlp.c_fc.bias [4C],
 * h.{i}.mlp.c_proj.weight [4C,C], h.{i}.mlp.c_proj.bias [C], ln_f.weight, ln_f.bias,
 * lm_head.weight [V,C] (untied; logits = x lm_head^T)). Gradients and the two AdamW moments
 * are buffers of the same layout, so checkpoint I/O is a loop over the views.
 *
 * Mixture-of-Experts blocks (cfg->moe, dpc-config(5) MOE): in a block whose MLP is MoE the four
 * mlp.* views give way to h.{i}.moe.gate.weight [C,E], h.{i}.moe.fc1.weight [E,C,4C],
 * h.{i}.moe.fc1.bias [E,4C], h.{i}.moe.fc2.weight [E,4C,C], h.{i}.moe.fc2.bias [E,C] (lib/moe's
 * wg, w1, b1, w2, b2), and the block computes x' = x2 + MoE(LN2(x2)) with GELU experts, all
 * B x T tokens of the batch gated together (moe.h). The forward's loss stays the mean
 * cross-entropy; the auxiliary losses' sum over MoE blocks goes to g->aux_loss, and the
 * backward's objective is loss + moe.aux_weight * aux_loss. A training step sets
 * g->gate_step >= 0: the gates draw their noise and the capacity is moe.capacity_factor's.
 * Otherwise (-1, the default: evaluation, features, decoding) there is no noise and nothing
 * is dropped (capacity setting 0), so that a loss does not depend on how windows are batched
 * and decoding one token at a time gives the full forward's logits.
 */
#ifndef CORE_GPT2_H
#define CORE_GPT2_H

#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "common/tensor.h"
#include "io/config.h"

/* Doubles, like the Python floats torch.optim.AdamW is given: 0.9 and 0.9f differ, and the
 * update is computed from these values exactly as torch computes it. */
struct adamw_config {
	double beta1, beta2, eps, weight_decay;
};

struct gpt2_acts; /* activation buffers, private to gpt2.c */
struct gpt2_moe;  /* the MoE blocks' layers, private to gpt2.c */

struct gpt2 {
	struct model_config cfg;
	struct backend *be;            /* the caller's; outlives the model */
	size_t nparams;
	float *params, *grads, *m, *v; /* each nparams floats, backend memory */
	int nviews;
	struct tensor *views;      /* named views into params, HF order (t->be = be) */
	unsigned char *decay_mask; /* per view: 1 if weight decay applies (matrices) */
	int B, T;                  /* activation capacity */
	int forward_only;          /* gpt2_create_forward: no grads, moments or backward */
	struct gpt2_acts *acts;
	int *layer_view;           /* [n_layer + 1]: block l's first view; [n_layer]: ln_f's */
	struct gpt2_moe *moe;      /* NULL for a dense model */
	int64_t gate_step;         /* >= 0: the training step whose gate noise the MoE blocks
				    * draw; -1 (the default): evaluation, no noise */
	float aux_loss;            /* the MoE blocks' auxiliary losses at the last forward, summed */
	int acts_bf16;             /* the activations that feed only products kept in bfloat16
				    * (gpt2_bf16_activations) */
	struct gpt2_dist *dist;    /* training on several ranks (gpt2_distribute), or NULL */
};

/* Per MoE block, what its last forward routed (for the capacity trace): N tokens, C slots,
 * the largest expert count max_e n_e and the dropped choices. CORE_EUSAGE when block is not
 * an MoE block or no forward has run. */
struct gpt2_moe_step {
	int64_t tokens, C, need, dropped;
	int k, E;
	float aux_loss;
	/* on several ranks (gpt2_distribute): W and the step's plan (r, d, the All-to-All's
	 * name); tokens, C and need are then this rank's, need the largest over the ranks,
	 * dropped and aux_loss over all ranks. ranks = 0 on one process. */
	int ranks, r, d;
	const char *a2a;
};
int gpt2_moe_step(const struct gpt2 *g, int block, struct gpt2_moe_step *out);
/* A digest (FNV-1a 64) of block's last routing: every choice's expert and slot, so that two
 * forwards routed the same way have the same digest (a test of finite differences skips a
 * perturbation that changed the routing: the loss is not differentiable there). */
int gpt2_moe_route_digest(const struct gpt2 *g, int block, uint64_t *out);
/* 1 when block l's MLP is an MoE layer. */
int gpt2_block_is_moe(const struct gpt2 *g, int l);

/* Keep the activations that feed nothing but matrix products (ln_1's, ln_2's before a dense
 * MLP, attention's output, GELU's, ln_f's) in bfloat16, through the backend's _bf16 ops
 * (backend.h): on by default where the backend runs BACKEND_BF16 products and has those ops,
 * off otherwise; on (1) is then refused, CORE_EUSAGE. With them or without, training gives the
 * same bits: they only spare the float copies the products would round. */
int gpt2_bf16_activations(struct gpt2 *g, int on);

struct dist;
struct moe_plan;
struct moe_dict;
/* Train on the W ranks of d (lib/dist), collectively: every rank calls it once, after
 * gpt2_create with B its share of the batch (train.batch_size / W) and before the first
 * forward, with the same model, plan and dictionary. Then a training step (gate_step >= 0)
 * runs this rank's rows of the batch (gpt2_dist_rows): data parallel for the dense
 * parameters (their gradients summed over the ranks, the loss the mean over all tokens) and
 * expert parallel for the MoE blocks, through lib/moe's distributed layer (moe_dist.h:
 * experts spread over the ranks, tokens exchanged by All-to-All) under plan, or under the
 * plan dict names for each step's capacity (dict may be NULL; moe_dict_check it first).
 * Parameters, gradients and moments stay whole, and the same bits, on every rank, so a
 * checkpoint is one rank's and evaluation runs on each rank alone. Without drops the steps
 * are those of one process on the whole batch, to float rounding; with drops (a capacity
 * factor) each rank drops its own tokens, and the auxiliary loss is the mean of the ranks'
 * own (Tutel's semantics, moe_dist.h). CORE_EUSAGE naming the config key for what does not
 * fit: the MoE layer's placement (moe.experts and the ranks), the plan. A host-memory
 * backend only (cpu, ref): CORE_EUNSUPPORTED otherwise. W = 1 leaves the model as it is. */
int gpt2_distribute(struct gpt2 *g, struct dist *d, const struct moe_plan *plan,
		    const struct moe_dict *dict);
/* This rank's rows [*row0, *row0 + *rows) of a batch of B rows (all of them, undistributed). */
void gpt2_dist_rows(const struct gpt2 *g, int B, int *row0, int *rows);
/* Collective on a distributed model (0 at once otherwise): every rank's parameters and AdamW
 * moments are the same bits (a crc32 of each, compared), else CORE_EIO on every rank saying
 * which differ: what writing rank 0's checkpoint for all of them rests on. */
int gpt2_dist_agree(struct gpt2 *g);

/* Allocate, on be, parameters, grads, moments (zeroed) and activations for batches up to
 * B x T. */
int gpt2_create(struct gpt2 *g, const struct model_config *cfg, int B, int T,
		struct backend *be);
/* A model for evaluation and features: parameters and the forward's activations only (grads,
 * m and v are NULL; two layers' activations reused in turn), so B x T batches cost about
 * 2/L of a training model's activation memory. gpt2_backward, gpt2_grad_norm and
 * gpt2_adamw_step refuse it (CORE_EUSAGE); ckpt_load reads parameters into it. */
int gpt2_create_forward(struct gpt2 *g, const struct model_config *cfg, int B, int T,
			struct backend *be);
void gpt2_free(struct gpt2 *g);
/* GPT-2 initialisation: N(0, 0.02) for matrices and embeddings, residual projections
 * (attn.c_proj, mlp.c_proj) N(0, 0.02/sqrt(2L)), biases 0, LayerNorm weights 1. Counter-based:
 * element i of the flat buffer uses draw i of RNG_STREAM_INIT. */
int gpt2_init_params(struct gpt2 *g, uint64_t seed);
/* The parameter layout of a model without allocating it: its views (HF order, shapes and
 * names; data NULL) and each one's offset, in floats, in the flat parameter buffer. */
struct gpt2_layout {
	int n;
	struct tensor *views;
	size_t *offs;
	size_t nparams;
	int n_layer;
};
int gpt2_layout(const struct model_config *cfg, struct gpt2_layout *out);
void gpt2_layout_free(struct gpt2_layout *l);
/* View i's initial values into x (numel floats of be's memory), bit for bit what
 * gpt2_init_params gives that view of the whole model. */
int gpt2_init_view(const struct gpt2_layout *l, int i, struct backend *be, float *x,
		   uint64_t seed);
/* Forward over host tokens [B,T] (int32 in [0,V)); with targets, the mean cross-entropy
 * (nats/token) goes to *loss when loss is not NULL (CORE_ENAN when it is not finite), and
 * what backward needs is kept. B <= g->B, T <= g->T. */
int gpt2_forward(struct gpt2 *g, const int32_t *inputs, const int32_t *targets, int B, int T,
		 float *loss);
/* Forward over host tokens [B,T] through blocks 0..layer only, and the output of block
 * `layer` (the residual stream after it; for the last block, before ln_f) into host out
 * [B,T,C]. */
int gpt2_forward_hidden(struct gpt2 *g, const int32_t *inputs, int B, int T, int layer,
			float *out);
/* Forward over host tokens [B,T] and the logits [B,T,V] (before the softmax) into host out. */
int gpt2_forward_logits(struct gpt2 *g, const int32_t *inputs, int B, int T, float *out);

/* Incremental decoding with a key/value cache: each step feeds one token at the next
 * position and costs one position's work (the attention reads the cached q/k/v rows of the
 * earlier positions), where a full forward would redo the whole prefix. Over g's parameters
 * and backend (g is the caller's and outlives the decoder); batch 1, up to g->cfg.seq_len
 * positions. */
struct gpt2_decoder {
	struct gpt2 *g;
	int pos;           /* positions in the cache */
	float *qkv;        /* [L, seq_len, 3C]: the c_attn output of every position so far */
	float *x, *res, *ln, *atty, *fch, *fch_act, *scores, *logits, *stat; /* one row each */
	int32_t *tok;
};
int gpt2_decoder_open(struct gpt2_decoder *d, struct gpt2 *g);
/* Feed token at position d->pos (< seq_len; CORE_EUSAGE beyond) and write the logits [V] for
 * the next token into host logits (may be NULL while feeding a prompt). */
int gpt2_decoder_step(struct gpt2_decoder *d, int32_t token, float *logits);
/* Forget every position (the next step is position 0). */
void gpt2_decoder_reset(struct gpt2_decoder *d);
void gpt2_decoder_close(struct gpt2_decoder *d);

/* The per-position losses of the last forward with targets, [B*T] floats, into host out. */
int gpt2_losses(const struct gpt2 *g, float *out);
/* Gradient of the mean loss of the last forward into g->grads (overwrites). */
int gpt2_backward(struct gpt2 *g);
/* L2 norm of g->grads, into *norm (host). */
int gpt2_grad_norm(struct gpt2 *g, float *norm);
/* One AdamW step (t is the 1-based step count for bias correction); grads are multiplied
 * by grad_scale first (global-norm clipping passes clip/norm or 1). */
int gpt2_adamw_step(struct gpt2 *g, const struct adamw_config *opt, double lr, long t,
		    float grad_scale);
/* Time the matrix products from now on (enable = 1; clears the total) or stop timing. */
void gpt2_profile(struct gpt2 *g, int enable);
/* Wall-clock seconds spent in matrix products since gpt2_profile(g, 1). */
double gpt2_gemm_seconds(const struct gpt2 *g);
/* The view with this name, or NULL. */
struct tensor *gpt2_find(struct gpt2 *g, const char *name);

#endif
