/* logreg.h - the discriminative router of DiPaCo (Douillard et al., "DiPaCo: Distributed
 * Path Composition", 2024, section 2.4.2): a multinomial logistic regression from document
 * features to shards, and the extra bias that makes its argmax fill every shard as wanted.
 *
 * Model. Features x (d floats) are standardised with the training rows' mean and standard
 * deviation, z_j = (x_j - mu_j) / sd_j (sd_j = 1 for a feature constant on the training rows
 * to float precision, sd_j <= 1e-6 |mu_j|), and class c gets the logit
 *     s_c(x) = b_c + sum_j w_cj z_j
 * (in double: z_j = ((double)x_j - mu_j) / sd_j, the sum in eight interleaved partial sums
 * j mod 8 added pairwise at the end, so the bits follow from this text, not the compiler).
 * The decision value, what logreg_scores returns and what logreg_predict ranks, adds the
 * extra bias of the correction:
 *     v_c(x) = (double)(float)s_c(x) + bias_c            (bias zero until logreg_fit_bias)
 * so a row's ranking is the same wherever it is computed.
 *
 * Fit. With theta = [w (k * d, row c at c * d) | b (k)], the objective over n rows (x_i, y_i)
 *     L(theta) = (1/n) sum_i [ log sum_c exp s_c(x_i) - s_{y_i}(x_i) ] + (l2/2) ||w||^2
 * (the biases are not penalised) is convex; it is minimised by L-BFGS (liblbfgs, More-Thuente
 * line search) from theta = 0 until ||grad|| < 1e-6 max(1, ||theta||) or max_iter
 * iterations. Its gradient
 *     dL/dw_cj = (1/n) sum_i (p_ic - [y_i = c]) z_ij + l2 w_cj
 *     dL/db_c  = (1/n) sum_i (p_ic - [y_i = c])
 * (p_i = softmax s(x_i)) is computed in double over blocks of rows, each sum over rows in row
 * order, so the fit is the same bits whatever the OpenMP thread count.
 *
 * Bias correction (logreg_fit_bias). Given rows x_1..x_n and target counts t_c (sum n), find
 * bias so that t_c rows have class c as their argmax. This is the dual of the transportation
 * problem
 *     maximise sum_i s_{i,a(i)} over assignments a with |a^-1(c)| = t_c,
 * where s_ic = (double)(float)s_c(x_i): a bias vector makes argmax_c (s_ic + bias_c) an
 * assignment with those counts exactly when that assignment is optimal and the bias its dual
 * solution (complementary slackness). Three steps:
 *  1. an optimal assignment, by Bertsekas' auction for the transportation problem (Bertsekas
 *     and Castanon, 1989): class c is t_c identical slots with prices; unassigned rows, in
 *     first-in first-out order, bid for the cheapest slot of their best class, raising its
 *     price by (best value - second best value + eps) and evicting its holder; eps-scaling
 *     from C/4 down to 1e-6 C by factors of 8 (C: the largest spread of a row's logits).
 *     Each phase ends, since every bid raises a price by eps or more and n rows meet n
 *     slots, with every row within eps of its best class. What eps leaves over is removed
 *     by cancelling negative cycles: with
 *         w(c, c') = min over rows i in c of (s_ic - s_ic')
 *     (the smallest gain of a row of c over c'), a cycle of classes with negative total
 *     weight means moving each edge's minimising row one class on raises the total score
 *     at unchanged counts; the cycle of minimum mean weight (Karp, 1978) is cancelled until
 *     that mean is no longer below -1e-12 C. Each cancellation raises the total score, so
 *     the loop ends (and is capped at n cancellations all the same).
 *  2. the biases that realise it with the largest margin: every row of c must beat every
 *     c' by at least g, i.e. bias_c' - bias_c <= w(c, c') - g, a system of difference
 *     constraints that is feasible exactly when every cycle's mean weight is at least g.
 *     So g = mu*, the minimum cycle mean of step 1, and the biases are shortest-path
 *     distances (Bellman-Ford from a virtual source) under the weights w - mu*. A class
 *     with t_c = 0 gets a bias every row's class beats by mu* too. With fewer than two
 *     non-empty classes there is no cycle and the margin is C (at least 1).
 *  3. the mean bias is subtracted (argmax is blind to it) and the biases are rounded to
 *     float.
 * Every row's argmax is then its class in the optimal assignment with a margin of mu* (less
 * the rounding of the biases to float, about 6e-8 |bias|), so the counts are met exactly
 * when mu* > 0, which holds unless two assignments with the targets' counts have the same
 * total score, e.g. identical rows split between classes: then mu* = 0, rows tied between
 * classes go to the lower class, and a class is off by as many rows as are tied to it
 * (one row per class in the usual case of one tie). For two classes the bias difference is
 * the midpoint of the interval of differences that give the counts. Work: the logits
 * (O(n k d), parallel), then O(k + log n) per bid, about ten bids per row and eps phase in
 * practice, and O(n k + k^3) per cancellation (rarely more than a few); memory 4 n k bytes
 * for the logits plus O(n + k^2). Deterministic: the auction and the cycle steps run on one
 * thread in a fixed order, the logits in parallel row by row.
 */
#ifndef CORE_LOGREG_H
#define CORE_LOGREG_H

#include <stddef.h>
#include <stdint.h>

struct logreg {
	int k, d;
	float *mu, *sd;  /* [d] feature standardisation, fitted on the training rows */
	float *w;        /* [k * d] weights on the standardised features */
	float *b;        /* [k] */
	float *bias;     /* [k] the extra bias of the correction, zero until fitted */
};

struct logreg_fit_report {
	double loss;             /* L(theta) at the parameters returned (before their rounding to
				  * float) */
	int iterations;          /* L-BFGS iterations */
	int evaluations;         /* loss and gradient evaluations */
	int status;              /* liblbfgs's return code: 0 converged, 2 already minimal, < 0 it
				  * stopped early (iterations, line search) */
	const char *status_text; /* that code in words, a static string */
};

/* Parameters in theta: k * d weights and k biases. */
static inline size_t logreg_nparam(int k, int d)
{
	return (size_t)k * (size_t)d + (size_t)k;
}

/* A zero model (mu 0, sd 1, w b bias 0) of k classes over d features; k >= 1, d >= 1.
 * CORE_EUSAGE or CORE_ENOMEM; m is zeroed on failure. */
int logreg_init(struct logreg *m, int k, int d);
void logreg_free(struct logreg *m);

/* Fit m (uninitialised or zeroed on entry; logreg_init'ed inside) on n rows x[n * d] with
 * labels y[n] in [0, k): standardisation from these rows, then L(theta) minimised with at
 * most max_iter L-BFGS iterations. rep may be NULL. An L-BFGS stop short of convergence (the
 * iteration limit, a line search that can go no further) is not an error: rep says which,
 * and the parameters are the last ones accepted. Errors: CORE_EUSAGE for k < 2, d < 1,
 * n < 1, a label out of range, l2 negative or not finite, max_iter < 1; CORE_ENAN for a
 * feature that is not finite; CORE_ENOMEM. m is zeroed on failure. */
int logreg_fit(struct logreg *m, const float *x, const uint32_t *y, size_t n, int d, int k,
	       double l2, int max_iter, struct logreg_fit_report *rep);

/* L(theta) into *loss and, when grad is not NULL, its gradient grad[logreg_nparam(k, d)],
 * over n rows x, y, with m's k, d, mu and sd (its w, b and bias are not read): the function
 * logreg_fit minimises, exposed for tests. Errors: CORE_EUSAGE for a label out of range,
 * CORE_ENOMEM. */
int logreg_loss_grad(const struct logreg *m, const float *x, const uint32_t *y, size_t n,
		     double l2, const double *theta, double *loss, double *grad);

/* out[k]: the decision values v_c(row), rounded to float. */
void logreg_scores(const struct logreg *m, const float *row, float *out);
/* p[k]: softmax of the decision values (bias included), computed in double. */
void logreg_proba(const struct logreg *m, const float *row, float *p);
/* idx[topn]: the topn classes of highest decision value (in double), best first, ties to the
 * lower index; 1 <= topn <= k. */
void logreg_predict(const struct logreg *m, const float *row, int topn, uint32_t *idx);

/* Set m->bias so that target_counts[c] of the n rows x[n * m->d] have argmax c (the
 * algorithm and what "exactly" means with ties are above). target_counts must sum to n.
 * The current bias is not read. Errors: CORE_EUSAGE for n < 1, n >= 2^32 or counts that do
 * not sum to n; CORE_ENAN for a feature that is not finite; CORE_ENOMEM. m->bias is left
 * unchanged on failure. */
int logreg_fit_bias(struct logreg *m, const float *x, size_t n, const uint64_t *target_counts);

/* Step 1 alone, on values given: cls[n] an assignment of the n rows to k classes with
 * target_counts[c] rows in class c that maximises sum_i score[i * k + cls[i]] (to within
 * 1e-12 of the largest spread of a row's scores, as above; ties broken by the auction's
 * order, deterministically). The router's fit uses it to give a path that no row prefers its
 * share of the rows that lose least by going to it. Errors: as logreg_fit_bias, CORE_ENAN
 * naming the first score that is not finite. */
int logreg_assign(const float *score, size_t n, int k, const uint64_t *target_counts,
		  uint32_t *cls);

#endif
