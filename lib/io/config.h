/* config.h - YAML run configs, validated against a schema.
 *
 * A config is a YAML mapping of sections (model:, train:, dipaco:) holding scalar keys, plus
 * one section that is a sequence, levels: (the DiPaCo topology, dpc-config(5) LEVELS). The
 * schema (config.c) lists every scalar key with its type, range and default; an unknown key,
 * a value of the wrong type or out of range, a duplicate key or malformed YAML is
 * CORE_ECONFIG with a detail that names the line ("line 7: train.lr: -1 is outside (0, 10]").
 * Command-line overrides use the same schema ("train.steps=100"); levels can be set only in
 * a file. New scalar sections (moe:) are added by extending the schema table, not the parser.
 */
#ifndef CORE_CONFIG_H
#define CORE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "io/tokenizer.h"

/* The Mixture-of-Experts blocks of the model (dpc-config(5), MOE): the MLP of each such block
 * is an MoE layer (lib/moe/moe.h) of `experts` GELU experts of hidden size 4C, gated from the
 * block's ln_2 output over all B x T tokens of the batch at once. experts = 0: none, the dense
 * GPT-2 (no moe key is then written in a config's dump or counted in its hashes). */
#define MOE_BLOCKS_CHARS 128 /* moe.blocks, with its nul */
struct model_moe {
	int experts;            /* E; 0: no MoE block */
	int top_k;              /* k in 1..E */
	int every;              /* blocks b with (b + 1) % every == 0 (1: all), unless blocks */
	char blocks[MOE_BLOCKS_CHARS]; /* "1,3" or "0-3,6": the MoE blocks; "": from every */
	double capacity_factor; /* Tutel's capacity setting (moe.h, 4.): > 0, 0, < 0 */
	int bpr;                /* batch-prioritized routing */
	double gate_noise;      /* s >= 0, training steps only */
	int aux_loss;           /* 0 gshard, 1 load-importance (moe.h's enum moe_loss) */
	double aux_weight;      /* the auxiliary losses' weight in the training objective */
};

struct model_config {
	int n_layer, n_embd, n_head;
	int seq_len;    /* T: context length, also the size of wpe */
	int vocab_size; /* V */
	int n_out;      /* rows of lm_head, the classes of the output; 0: vocab_size (a language
			 * model). Not a config key: a window router (dpc-route fit --transformer)
			 * is the base model with a head over the P paths, and its checkpoint
			 * says so in its metadata (dpc-checkpoint(5)). */
	struct model_moe moe;
	/* The tokenizer of the tokens the model was trained on (token files record it,
	 * dpc-tokens(5)). Not a config key: what dpc-train-path, a DiPaCo path or the outer step
	 * trained on, written to a checkpoint's metadata "tokenizer" (dpc-checkpoint(5)) and
	 * checked against every token file the model meets; TOKENIZER_NONE (a model not trained
	 * yet, a checkpoint written before the key) checks the vocabulary alone. */
	struct tokenizer_id tokenizer;
};

/* Which blocks are MoE: mask[b] = 1 for each (mask has n_layer entries; NULL: only count).
 * Returns their number (0 for a dense model), or CORE_ECONFIG when moe.blocks is malformed
 * or names a block outside 0..n_layer-1 (the detail says which). */
int model_moe_blocks(const struct model_config *c, unsigned char *mask);

/* The classes of the model's output: n_out, or vocab_size for a language model. */
static inline int model_n_out(const struct model_config *c)
{
	return c->n_out > 0 ? c->n_out : c->vocab_size;
}

struct train_config {
	int batch_size;          /* B */
	long steps;              /* total steps of the schedule */
	double lr;               /* peak learning rate */
	long warmup_steps;       /* linear warmup from 0 */
	double min_lr_frac;      /* cosine decays to lr * min_lr_frac at `steps` */
	long restart_step;       /* > 0: steps [0, R) and [R, steps) each get the schedule */
	double weight_decay;     /* AdamW decoupled, on matrices only */
	double beta1, beta2, eps;
	double grad_clip;        /* global-norm clip; 0 disables */
	long eval_every;         /* 0 disables periodic evaluation */
	long eval_batches;
	long checkpoint_every;   /* 0: only at the end */
	uint64_t seed;
};

/* DiPaCo topology (dpc-config(5), "LEVELS"): the model's parameter groups (embed = wte + wpe,
 * the blocks h.0 .. h.{L-1}, head = ln_f + lm_head) are split among levels; each level has
 * K modules, or one module per path. Paths are the mixed-radix product of the routed levels
 * (K >= 1), repeated when dipaco.paths asks for more (DiLoCo: every K = 1, P paths). */
#define CONFIG_MAX_LEVELS 16
#define LEVEL_NAME_MAX 32   /* [a-z][a-z0-9_]*, with its nul */
#define LEVEL_MAX_RANGES 16 /* block ranges per level */
#define LEVEL_PER_PATH 0    /* level_config.modules: one module per path */

struct level_config {
	char name[LEVEL_NAME_MAX];
	int modules;   /* K >= 1, or LEVEL_PER_PATH */
	int embed;     /* owns wte.weight and wpe.weight */
	int head;      /* owns ln_f.* and lm_head.weight */
	int nranges;   /* owns blocks range[i].lo .. range[i].hi (inclusive) */
	struct { int lo, hi; } range[LEVEL_MAX_RANGES];
};

struct dipaco_config {
	long phases;          /* T: outer phases */
	long inner_steps;     /* tau; 0 means train.steps / phases */
	int paths;            /* P; 0 means the product of the routed levels' K */
	double outer_lr;      /* Nesterov learning rate (0.7) */
	double outer_momentum;/* mu (0.9); 0 is plain averaging with outer_lr 1 */
	int nesterov;         /* 1: Nesterov update; 0: heavy ball (theta -= lr * buf) */
	int rescale;          /* multiply the averaged delta by sqrt(P_le) */
	int reweight;         /* weight paths by shard tokens (else uniformly) */
	int holdout;          /* hold out holdout_frac of each shard: the path's validation set */
	long early_stop_every;/* evaluate the held-out slice every this many inner steps and
			       * publish the best (implies holdout); 0 off */
	double holdout_frac;  /* share of a shard's tokens held out */
	int paths_per_phase;  /* N: paths trained per phase (pathsample.h); 0: absent, every
			       * path */
	int nlevels;          /* 0 in the struct after config_defaults; see config_levels */
	struct level_config levels[CONFIG_MAX_LEVELS];
};

struct run_config {
	struct model_config model;
	struct train_config train;
	struct dipaco_config dipaco;
};

/* The levels in effect, copied into out[CONFIG_MAX_LEVELS]: c->dipaco.levels when the config
 * names any, else one level "all" owning embed, every block and head with one module (a
 * dense model). Returns the count. */
int config_levels(const struct run_config *c, struct level_config *out);
/* tau in effect: dipaco.inner_steps, or train.steps / dipaco.phases when that is 0. */
long config_inner_steps(const struct run_config *c);
/* Whether every shard keeps its last holdout_frac out of training: dipaco.holdout, or
 * dipaco.early_stop_every > 0. */
int config_holds_out(const struct run_config *c);
/* Loadable YAML text of every key and the levels (config_load of it gives back c exactly).
 * Returns bytes needed (like snprintf). */
size_t config_yaml(const struct run_config *c, char *buf, size_t n);

void config_defaults(struct run_config *c);
/* 1 when both describe the same model (every field equal). */
int config_model_equal(const struct model_config *a, const struct model_config *b);
/* Load path over the defaults; CORE_ECONFIG (detail names path and line) or CORE_EIO. The
 * file is read as a stream, so a pipe works; a file that sets no key (empty, comments only)
 * is CORE_ECONFIG. */
int config_load(struct run_config *c, const char *path);
/* Apply "section.key=value" from the command line with the same checks. */
int config_set(struct run_config *c, const char *assignment);
/* Cross-field checks (n_embd divisible by n_head, ...); run after load and overrides. */
int config_validate(const struct run_config *c, const char *path);
/* What every program does with -c and -s: the defaults, then path (when not NULL), then the
 * nsets "section.key=value" overrides in order, then config_validate; the first error. */
int config_load_with(struct run_config *c, const char *path, const char *const *sets,
		     int nsets);
/* Canonical text of every key (table order, fixed formatting): what the hash covers, and what
 * a run directory saves. Returns bytes needed (like snprintf). */
size_t config_dump(const struct run_config *c, char *buf, size_t n);
/* 16 hex digits: FNV-1a 64 of the model section's canonical text (what must match to resume
 * or load a checkpoint) and of the whole dump. */
void config_hash_model(const struct run_config *c, char out[17]);
void config_hash_all(const struct run_config *c, char out[17]);

#endif
