/* outer.h - the outer step of one module (DESIGN.md, "DiPaCo topology"; dpc-outer(1)).
 *
 * For module (l, e) and the paths i that use it, with weights a_i (shard tokens n_i / sum n,
 * or 1 / P_le) and scale s (sqrt(P_le) when rescaling, else 1):
 *     g     = s * sum_i a_i (prev - theta_i)      the outer gradient
 *     buf   = mu * buf + g                        (buf is 0 before the first phase)
 *     theta = prev - lr * (g + mu * buf)          Nesterov, as torch.optim.SGD(nesterov=True,
 *                                                 dampening=0) with g as the gradient
 *     theta = prev - lr * buf                     heavy ball (nesterov off)
 * in double from float inputs, each stored result rounded to float once. With lr 1 and mu 0
 * the step returns sum_i a_i theta_i; with one path it returns theta_1 bit for bit.
 *
 * When a phase trains only some paths (dipaco.paths_per_phase), i runs over the paths of
 * the module that it trained, P_le counts those and the caller's a_i are renormalised over
 * them; with none, the module keeps its parameters and its momentum: phase t's file holds
 * phase t-1's tensors byte for byte (only the metadata's phase differs), not a step with a
 * zero gradient, which would still decay buf and move theta by lr mu^2 buf.
 *
 * Paths are folded into the sum one at a time in the order given, so the result does not
 * depend on when each path checkpoint appeared (--wait), on the thread count or on how the
 * inputs are read. With every path present (and descriptors for all of them), each tensor is
 * read in pieces of 64 KiB, all the paths' copies of a piece folded while it sits in cache,
 * and the threads write their pieces of the output in place: memory is a few pieces per
 * thread, whatever the number of paths. Otherwise (--wait, or more paths than open files
 * allowed) the paths are folded one after another, each as soon as it and the ones before
 * it exist, into sums over the whole module (16 bytes per parameter, plus one tensor).
 * Every input tensor's crc32 is checked before the output is committed.
 *
 * Diagnostics: each path's delta norm, the outer gradient's norm before and after rescaling,
 * the update's norm, and the paths' mean pairwise cosine weighted by the norm products,
 * sum_{i != j} d_i . d_j / sum_{i != j} |d_i| |d_j| (the plain mean when the paths moved
 * equally far), which needs no second pass: sum_{i != j} d_i . d_j = |sum d_i|^2 - sum |d_i|^2.
 */
#ifndef CORE_OUTER_H
#define CORE_OUTER_H

#include <stddef.h>
#include <stdint.h>

#include "dipaco/topology.h"

struct outer_params {
	double lr, momentum;
	int nesterov, rescale, reweight;
};

/* a[i] = tokens[i] / sum(tokens) when reweight (and every tokens[i] > 0), else 1 / n. */
void outer_weights(double *a, const double *tokens, int n, int reweight);
/* acc[k] += a * ((double)prev[k] - (double)theta[k]) for k < n. */
void outer_accumulate(double *acc, const float *prev, const float *theta, double a, size_t n);
/* The update of n parameters from the summed delta acc: g = scale * acc, buf and theta as
 * above; theta_out may not alias prev or buf. */
void outer_apply(float *theta_out, float *buf, const float *prev, const double *acc, size_t n,
		 double scale, const struct outer_params *o);

/* One module's step, from files. */
struct outer_diag;

struct outer_job {
	const struct topology *topo;
	int module;                     /* module id in topo */
	long phase;                     /* t: averages phase t's paths into phase t's module */
	const char *prev_path;          /* the module's checkpoint of phase t - 1 */
	const int *paths;               /* the paths folded, ascending, some of the module's
					 * (dipaco.paths_per_phase); NULL: all of them */
	int npaths;                     /* with paths: how many (0: the module is kept) */
	const char *const *path_ckpts;  /* one per path folded, in that order */
	const double *weights;          /* a_i, same order */
	const char *out_path;           /* the module's checkpoint of phase t */
	const char *config_hash;        /* every input must carry this config_hash */
	struct outer_params params;
	double wait_seconds;            /* 0: inputs must exist; > 0: wait up to this long for
					 * each missing path checkpoint; < 0: wait forever */
	int threads;                    /* pieces read and folded in parallel (without waiting;
					 * 0: OpenMP's default); the bits do not depend on it */
	/* Called, when not NULL, with the diagnostics once the output is written and before it
	 * is committed (renamed into place); an error from it aborts the step. */
	int (*before_commit)(void *ctx, const struct outer_diag *d);
	void *ctx;
};

struct outer_diag {
	int npaths;
	double *delta_norm;      /* [npaths] ||prev - theta_i|| */
	double grad_norm;        /* ||sum a_i (prev - theta_i)|| before rescaling */
	double grad_norm_scaled; /* after */
	double update_norm;      /* ||theta_new - prev|| */
	double mean_cosine;      /* mean over pairs i != j of cos(delta_i, delta_j) weighted by
				  * |delta_i| |delta_j|; NaN with fewer than 2 paths */
	double seconds;      /* the whole step, committing the output aside */
	double wait_seconds; /* of which waiting for path checkpoints to appear */
	double read_seconds; /* reading and folding the inputs, waits excluded */
	uint64_t bytes_read;
};

/* Read, average, update and write one module (atomically: on any error nothing is
 * written). d->delta_norm is allocated here; outer_diag_free releases it. */
int outer_step_module(const struct outer_job *j, struct outer_diag *d);
void outer_diag_free(struct outer_diag *d);

#endif
