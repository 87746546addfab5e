/* config.h - YAML run configs, validated against a schema.
 *
 * A config is a YAML mapping of sections (model:, train:) holding scalar keys. The schema
 * (config.c) lists every key with its type, range and default; an unknown key, a value of
 * the wrong type or out of range, a duplicate key or malformed YAML is CORE_ECONFIG with a
 * detail that names the line ("line 7: train.lr: -1 is outside (0, 10]"). Command-line
 * overrides use the same schema ("train.steps=100"). New sections (dipaco:, moe:) are added
 * by extending the schema table, not the parser.
 */
#ifndef CORE_CONFIG_H
#define CORE_CONFIG_H

#include <stddef.h>
#include <stdint.h>

struct model_config {
	int n_layer, n_embd, n_head;
	int seq_len;    /* T: context length, also the size of wpe */
	int vocab_size; /* V */
};

struct train_config {
	int batch_size;          /* B */
	long steps;              /* total steps of the schedule */
	double lr;               /* peak learning rate */
	long warmup_steps;       /* linear warmup from 0 */
	double min_lr_frac;      /* cosine decays to lr * min_lr_frac at `steps` */
	double weight_decay;     /* AdamW decoupled, on matrices only */
	double beta1, beta2, eps;
	double grad_clip;        /* global-norm clip; 0 disables */
	long eval_every;         /* 0 disables periodic evaluation */
	long eval_batches;
	long checkpoint_every;   /* 0: only at the end */
	uint64_t seed;
};

struct run_config {
	struct model_config model;
	struct train_config train;
};

void config_defaults(struct run_config *c);
/* 1 when both describe the same model (every field equal). */
int config_model_equal(const struct model_config *a, const struct model_config *b);
/* Load path over the defaults; CORE_ECONFIG (detail names path and line) or CORE_EIO. */
int config_load(struct run_config *c, const char *path);
/* Apply "section.key=value" from the command line with the same checks. */
int config_set(struct run_config *c, const char *assignment);
/* Cross-field checks (n_embd divisible by n_head, ...); run after load and overrides. */
int config_validate(const struct run_config *c, const char *path);
/* Canonical text of every key (table order, fixed formatting): what the hash covers, and what
 * a run directory saves. Returns bytes needed (like snprintf). */
size_t config_dump(const struct run_config *c, char *buf, size_t n);
/* 16 hex digits: FNV-1a 64 of the model section's canonical text (what must match to resume
 * or load a checkpoint) and of the whole dump. */
void config_hash_model(const struct run_config *c, char out[17]);
void config_hash_all(const struct run_config *c, char out[17]);

#endif
