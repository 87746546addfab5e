/* dist_model.h - an alpha-beta model of the two All-to-All algorithms (Tutel, arXiv
 * 2206.03382, sec. 3.4.5, fig. 18), for predicting where 2DH overtakes Linear at scales no
 * one can measure on one host.
 *
 * A link level (within a node, across nodes) costs alpha seconds per message plus beta
 * seconds per byte: a message of s bytes takes alpha + s beta, so its bandwidth is
 * s / (alpha + s beta) of the peak 1 / beta: small messages waste the link, the efficiency
 * curve of Tutel's fig. 16. With n ranks in nodes of m, S bytes per rank in total:
 *
 *   Linear: n - 1 messages of S/n bytes, m - 1 of them within the node and n - m across;
 *           all are posted at once, so the two levels run side by side:
 *           max((m - 1)(a_in + S/n b_in), (n - m)(a_out + S/n b_out))
 *   2DH:    a stride copy of S bytes, m - 1 messages of S/m within the node, a second
 *           stride copy, n/m - 1 messages of S m/n across nodes, one phase after another:
 *           2 S c + (m - 1)(a_in + S/m b_in) + (n/m - 1)(a_out + S m/n b_out)
 *
 * where c is seconds per byte of a stride copy. The model ignores contention inside the
 * network (a fat tree at full bisection), the overlap of the phases that MSCCL's fused
 * schedule allows, and congestion from n - m concurrent messages beyond what a_out covers.
 */
#ifndef CORE_DIST_MODEL_H
#define CORE_DIST_MODEL_H

struct dist_link {
	double alpha; /* seconds per message */
	double beta;  /* seconds per byte */
};

struct dist_net {
	struct dist_link intra, inter;
	double copy;  /* seconds per byte of a stride copy */
	int m;        /* ranks per node */
};

/* Predicted seconds of one exchange of S bytes per rank on n ranks (n a multiple of m). */
double dist_model_linear(const struct dist_net *net, int n, double S);
double dist_model_2dh(const struct dist_net *net, int n, double S);

/* Least-squares fit of one link level from exchanges measured on n ranks of one level
 * (every peer alike): t_i = (n - 1)(alpha + S_i/n beta) for k >= 2 sizes S_i, in the
 * relative error (each residual over t_i: sizes spanning decades weigh alike, so that alpha
 * comes from the small messages and beta from the large ones, instead of both from the
 * largest). Returns -1 (and leaves *out) when the sizes do not determine both (fewer than
 * two distinct sizes with t_i > 0, n < 2), else 0; a negative alpha or beta from noisy data
 * is clamped at 0. */
int dist_model_fit(const double *S, const double *t, int k, int n, struct dist_link *out);

/* The smallest n = m * 2^j <= nmax at which 2DH is predicted faster than Linear for S bytes
 * per rank, or 0 when it never is up to nmax. */
int dist_model_crossover(const struct dist_net *net, double S, int nmax);

#endif
