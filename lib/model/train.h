/* train.h - training and evaluating one path (or a dense model) on a token file.
 *
 * The semantics every independent implementation must reproduce (batch sampling, learning
 * rate schedule, clipping, AdamW) are stated in dpc-train-path(1) and here:
 *   batch row b of step index s starts at rng_below(seed, RNG_STREAM_BATCH, s*B + b, N - T)
 *   in the concatenated token stream of N tokens; inputs are T tokens from there, targets the
 *   T tokens one further on. The state of a run is (parameters, moments, step): sampling is
 *   stateless, so a resumed run is bit-identical to a straight one.
 */
#ifndef CORE_TRAIN_H
#define CORE_TRAIN_H

#include <stdint.h>

#include "backend/backend.h"
#include "io/config.h"
#include "io/tokfile.h"
#include "model/gpt2.h"

struct train_opts {
	const struct run_config *cfg;
	struct backend *be;       /* where the model lives and runs */
	const char *data_path;    /* training tokens (required) */
	const char *val_path;     /* validation tokens for periodic evaluation, or NULL */
	const char *out_path;     /* checkpoint written every checkpoint_every and at the end */
	const char *init_path;    /* start from this checkpoint's parameters, moments and step,
				   * or NULL */
	int resuming;             /* init_path is the run's own checkpoint, continued: its
				   * optimisation settings must be the config's */
	const char *weights_path; /* start at step 0 from this checkpoint's parameters alone
				   * (fine-tuning; fresh moments), or NULL */
	const char *metrics_path; /* JSON Lines, or NULL */
	long until;               /* stop after this global step; 0 means cfg->train.steps */
	int progress;             /* draw a progress line (only shown on a terminal) */
	/* Training on several ranks (gpt2_distribute), or NULL: every rank runs the same
	 * options; rank 0 alone writes the checkpoint, the metrics and the progress line. */
	struct dist *dist;
	const struct moe_plan *moe_plan; /* NULL: r = 1, d = 1, linear */
	const struct moe_dict *moe_dict; /* NULL: moe_plan for every step */
};

struct train_result {
	long start_step, final_step;
	double loss;         /* training loss of the last step */
	double val_loss;     /* last periodic evaluation, NaN if none */
	double tokens_per_s; /* over the steps after the first, excluding eval and I/O */
	double matmul_frac;  /* share of step time in matrix products, NaN if not measured */
};

/* Learning rate of step index s (0-based): linear warmup over warmup_steps, then cosine to
 * lr*min_lr_frac at steps; with restart_step R > 0, steps [0, R) and [R, steps) each have
 * that schedule in full (the second's step index counted from R). */
double train_lr(const struct train_config *t, long s);
/* Fill inputs/targets [B*T] for step index s from stream (RNG_STREAM_BATCH for training).
 * The targets are the next tokens, or with labels (one per token of tf) the labels of the
 * next positions: a model that classifies each position (a window router). */
void train_sample_batch(const struct tokfile *tf, const int32_t *labels, uint64_t seed,
			uint64_t stream, long s, int B, int T, int32_t *inputs, int32_t *targets);
/* Mean loss (nats/token) over consecutive windows starting at 0, T, 2T, ... while
 * start + T + 1 <= ntokens, at most max_tokens predicted tokens (0 = all). */
int train_evaluate(struct gpt2 *g, const struct tokfile *tf, long max_tokens, double *loss,
		   long *ntokens);
/* The tokens of tf fit the model: the model's vocabulary V, made by the tokenizer the model
 * was trained on (m->tokenizer, when known). One line on tf->path when not: CORE_ESHAPE
 * (vocabulary), CORE_EUSAGE (tokenizer). */
int train_check_tokens(const struct tokfile *tf, const struct model_config *m);
/* train_check_tokens, and at least seq_len + 1 tokens (CORE_EFORMAT). */
int train_check_data(const struct tokfile *tf, const struct model_config *m);
/* Training step index st (0-based, global) on data: batch (seed, st), forward, backward,
 * clipping by global norm, AdamW with bias correction for step t0 + st + 1 and the learning
 * rate of train_lr(tc, st). t0: the steps the moments had taken before step index 0 (0 for
 * moments that start at zero; a fork's source step when they came with it). in and tg hold
 * B x T tokens; labels: as train_sample_batch. */
int train_step_on(struct gpt2 *g, const struct train_config *tc, const struct tokfile *data,
		  const int32_t *labels, long st, long t0, int32_t *in, int32_t *tg, float *loss,
		  float *norm, double *lr);
/* Train as the options say: from a fresh init or o->init_path, to step `until`, writing
 * checkpoints and metrics. */
int train_path_run(const struct train_opts *o, struct train_result *r);

struct eval_result {
	long step;   /* the checkpoint's step */
	long tokens; /* predicted tokens evaluated */
	double loss; /* mean, nats/token */
};
/* Evaluate the checkpoint ckpt on the token file data (train_evaluate's windows, at most
 * max_tokens predicted tokens, 0 = all) with the model on be. */
int train_eval_checkpoint(struct backend *be, const char *ckpt, const char *data,
			  long max_tokens, struct eval_result *r);

#endif
