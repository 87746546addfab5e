/* clusterstats.h - how well an assignment of documents to K shards agrees with G reference
 * labels (topics, sources, true clusters): the contingency table and three scores.
 *
 * With n_gk the documents of label g in shard k, a_g = sum_k n_gk, b_k = sum_g n_gk and n the
 * total (logs natural; the base cancels):
 *   purity  sum_k max_g n_gk / n: the fraction of documents in their shard's majority label
 *           (1 when every shard is pure, however many shards there are);
 *   NMI     I(U; V) / sqrt(H(U) H(V)), the geometric normalisation (Strehl and Ghosh, 2002;
 *           scikit-learn's average_method="geometric"), with
 *               I = sum_gk (n_gk / n) log(n n_gk / (a_g b_k)),
 *               H(U) = -sum_g (a_g / n) log(a_g / n), H(V) likewise over b_k;
 *           defined as 1 when both partitions are a single cluster and 0 when only one is;
 *   ARI     the adjusted Rand index of Hubert and Arabie (1985):
 *               (sum_gk C(n_gk, 2) - E) / ((sum_g C(a_g, 2) + sum_k C(b_k, 2)) / 2 - E),
 *               E = sum_g C(a_g, 2) sum_k C(b_k, 2) / C(n, 2);
 *           numerator and denominator are formed exactly in 128-bit integers (times C(n, 2))
 *           and divided once; 1 when the denominator is 0 (both partitions a single cluster, or
 *           both all singletons: scikit-learn's convention), 0 for independent labellings in
 *           expectation, negative below chance.
 * Rows of the table with no document (labels never used) and empty shards change nothing.
 * For top-2 routing pass one (document, shard) pair per row: the pairs are then the items.
 */
#ifndef CORE_CLUSTERSTATS_H
#define CORE_CLUSTERSTATS_H

#include <stddef.h>
#include <stdint.h>

struct cluster_stats {
	int G, K;
	uint64_t *table;  /* [G * K], table[g * K + k] = n_gk */
	uint64_t n;
	double purity, nmi, ari;
};

/* table[G * K] from assign[n] in [0, K) and labels[n] in [0, G). CORE_EUSAGE for G < 1,
 * K < 1 or a value out of range (naming the row). */
int clusterstats_table(const uint32_t *assign, const uint32_t *labels, size_t n, int K, int G,
		       uint64_t *table);

/* The scores of a table (G rows of labels by K columns of shards) holding n >= 1 items. */
double clusterstats_purity(const uint64_t *table, int G, int K);
double clusterstats_nmi(const uint64_t *table, int G, int K);
double clusterstats_ari(const uint64_t *table, int G, int K);

/* All of it: the table (allocated; clusterstats_free) and the three scores. CORE_EUSAGE as
 * clusterstats_table and for n = 0; CORE_ENOMEM. s is zeroed on failure. */
int clusterstats_compute(const uint32_t *assign, const uint32_t *labels, size_t n, int K, int G,
			 struct cluster_stats *s);
void clusterstats_free(struct cluster_stats *s);

#endif
