/* pathtrain.h - phase t of path p of a run directory (dpc-train-path --run).
 *
 * The path is assembled from phase t-1's module checkpoints (phase 0: the initialisation),
 * takes its AdamW moments and step from its own checkpoint of phase t-1 (zero at t = 1),
 * trains global steps (t-1)*tau .. t*tau-1 on its shard exactly as a dense run would train
 * those steps (batches and learning rate indexed by the global step), and writes
 * phase-t/paths/path-p.safetensors: a complete GPT-2 checkpoint with its moments and step
 * t*tau, plus metadata phase, path, shard_tokens.
 *
 * With dipaco.paths_per_phase (pathsample.h) only the paths phase t draws train (another is
 * CORE_EUSAGE naming RUNDIR/sampled.json), and a path that sat phases out takes its moments
 * from its own latest checkpoint, of phase s = pathsample_last (the fork's moments or zero
 * when s = 0), still with phase t-1's modules; AdamW's bias correction then counts the
 * steps those moments took: step (t-1)*tau + 1 + i is bias-corrected as step
 * s*tau + 1 + i (plus the fork's step), while batches and learning rate stay those of the
 * global step.
 *
 * The path's validation set (config_holds_out: dipaco.holdout, or early_stop_every > 0):
 * the last holdout_frac of the shard's tokens are not trained on; the parameters written are
 * evaluated on them (heldout_loss). Within-phase early stopping (dipaco.early_stop_every >
 * 0): every early_stop_every steps and at the end the path is evaluated on them, and the
 * parameters of the best evaluation are the ones written. The moments and the
 * step written are those of the last step (the optimizer ran to the end; only the published
 * parameters go back), so the next phase continues the same AdamW trajectory.
 */
#ifndef CORE_PATHTRAIN_H
#define CORE_PATHTRAIN_H

#include "backend/backend.h"
#include "dipaco/rundir.h"

struct path_task_result {
	int skipped;          /* the output existed and verified: nothing done */
	long first_step, last_step; /* global steps trained: first_step+1 .. last_step */
	long best_step;       /* the step whose parameters were written */
	double train_loss;    /* of the last step */
	double heldout_loss;  /* of the written parameters; NaN without a validation set */
	double val_loss;      /* on RUNDIR/val.tok when it exists; else NaN */
	double tokens_per_s;
	double seconds;       /* the whole task, assembly and I/O included */
	double train_seconds; /* the steps alone */
	double eval_seconds;  /* evaluations: held-out slice and RUNDIR/val.tok */
};

/* Path p's modules after phase `phase`'s outer step (phase 0: the initialisation) into g's
 * parameters (g has the run's model shape), each module file verified; g->cfg.tokenizer
 * becomes the one they were trained on (unknown for seeded ones, but for a vocabulary of 256:
 * bytes), CORE_EFORMAT when they disagree. */
int pathtrain_assemble(const struct rundir *r, long phase, int p, struct gpt2 *g);

int pathtrain_run(const struct rundir *r, long phase, int p, struct backend *be, int progress,
		  struct path_task_result *res);

/* Early stopping as the paper does it (section 2.7): path p's loss after each phase t =
 * 1..last (its modules after phase t's outer step) on the path's own validation set, the
 * held-out tail of the shard it trained on in phase `last` (the last dipaco.holdout_frac of
 * its tokens, which training never read: the run must hold it out, config_holds_out, else
 * CORE_EUSAGE), over at most train.eval_batches batches; losses[t - 1] gets each, *best the
 * phase of the lowest (the earliest of equals). */
int pathtrain_best_phase(const struct rundir *r, long last, int p, struct backend *be,
			 double *losses, long *best);

#endif
