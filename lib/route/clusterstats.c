/* clusterstats.c - contingency table, purity, NMI and ARI; the definitions are in
 * clusterstats.h.
 *
 * Why integers: the counts and the pair counts C(x, 2) are exact in 64 bits, and ARI's
 * numerator and denominator scaled by C(n, 2) are exact in 128, so ARI is one rounding away
 * from its true value for any n this code will meet (up to about 2^31 items).
 */
#include "route/clusterstats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/banned.h"

int clusterstats_table(const uint32_t *assign, const uint32_t *labels, size_t n, int K, int G,
		       uint64_t *table)
{
	if (G < 1 || K < 1)
		return err_set(CORE_EUSAGE, NULL, "a contingency table needs G >= 1 labels and "
			       "K >= 1 shards, not %d and %d", G, K);
	memset(table, 0, sizeof *table * (size_t)G * (size_t)K);
	for (size_t i = 0; i < n; i++) {
		if (assign[i] >= (uint32_t)K)
			return err_set(CORE_EUSAGE, NULL, "shard %u of row %zu is not below %d", assign[i],
				       i, K);
		if (labels[i] >= (uint32_t)G)
			return err_set(CORE_EUSAGE, NULL, "label %u of row %zu is not below %d", labels[i],
				       i, G);
		table[(size_t)labels[i] * (size_t)K + assign[i]]++;
	}
	return 0;
}

static uint64_t table_total(const uint64_t *t, int G, int K)
{
	uint64_t n = 0;

	for (size_t q = 0; q < (size_t)G * (size_t)K; q++)
		n += t[q];
	return n;
}

double clusterstats_purity(const uint64_t *table, int G, int K)
{
	uint64_t n = table_total(table, G, K), hit = 0;

	for (int k = 0; k < K; k++) {
		uint64_t mx = 0;
		for (int g = 0; g < G; g++)
			if (table[(size_t)g * K + k] > mx)
				mx = table[(size_t)g * K + k];
		hit += mx;
	}
	return n ? (double)hit / (double)n : 0.0;
}

/* Row sums a_g and column sums b_k; the number of non-empty rows and columns. */
static int margins(const uint64_t *t, int G, int K, uint64_t **a, uint64_t **b, int *ng, int *nk)
{
	*a = calloc((size_t)G, sizeof **a);
	*b = calloc((size_t)K, sizeof **b);
	if (!*a || !*b) {
		free(*a);
		free(*b);
		return -1;
	}
	for (int g = 0; g < G; g++)
		for (int k = 0; k < K; k++) {
			(*a)[g] += t[(size_t)g * K + k];
			(*b)[k] += t[(size_t)g * K + k];
		}
	*ng = *nk = 0;
	for (int g = 0; g < G; g++)
		*ng += (*a)[g] > 0;
	for (int k = 0; k < K; k++)
		*nk += (*b)[k] > 0;
	return 0;
}

static double entropy(const uint64_t *c, int m, double n)
{
	double h = 0.0;

	for (int q = 0; q < m; q++)
		if (c[q]) {
			double p = (double)c[q] / n;
			h -= p * log(p);
		}
	return h;
}

double clusterstats_nmi(const uint64_t *table, int G, int K)
{
	uint64_t *a, *b;
	int ng, nk;

	if (margins(table, G, K, &a, &b, &ng, &nk))
		return NAN;
	const double n = (double)table_total(table, G, K);
	double nmi;
	if (ng <= 1 && nk <= 1) {
		nmi = 1.0;
	} else if (ng <= 1 || nk <= 1) {
		nmi = 0.0;
	} else {
		double I = 0.0;
		for (int g = 0; g < G; g++)
			for (int k = 0; k < K; k++) {
				uint64_t c = table[(size_t)g * K + k];
				if (c)
					I += ((double)c / n) *
					     log(n * (double)c / ((double)a[g] * (double)b[k]));
			}
		nmi = I / sqrt(entropy(a, G, n) * entropy(b, K, n));
		/* I <= min(H(U), H(V)), so NMI <= 1 but for rounding. */
		if (nmi > 1.0)
			nmi = 1.0;
		if (nmi < 0.0)
			nmi = 0.0;
	}
	free(a);
	free(b);
	return nmi;
}

static uint64_t pairs(uint64_t x)
{
	return x * (x - (x > 0)) / 2;
}

double clusterstats_ari(const uint64_t *table, int G, int K)
{
	uint64_t *a, *b;
	int ng, nk;

	if (margins(table, G, K, &a, &b, &ng, &nk))
		return NAN;
	uint64_t idx = 0, sa = 0, sb = 0;
	for (size_t q = 0; q < (size_t)G * (size_t)K; q++)
		idx += pairs(table[q]);
	for (int g = 0; g < G; g++)
		sa += pairs(a[g]);
	for (int k = 0; k < K; k++)
		sb += pairs(b[k]);
	const uint64_t np = pairs(table_total(table, G, K));
	free(a);
	free(b);
	/* (idx - sa sb / np) / ((sa + sb) / 2 - sa sb / np), times 2 np above and below. */
	__int128 num = 2 * ((__int128)idx * np - (__int128)sa * sb);
	__int128 den = ((__int128)sa + sb) * np - 2 * (__int128)sa * sb;
	if (den == 0)
		return 1.0;
	return (double)((long double)num / (long double)den);
}

int clusterstats_compute(const uint32_t *assign, const uint32_t *labels, size_t n, int K, int G,
			 struct cluster_stats *s)
{
	int rc;

	memset(s, 0, sizeof *s);
	if (n == 0)
		return err_set(CORE_EUSAGE, NULL, "no items to compare");
	if (G < 1 || K < 1)
		return clusterstats_table(assign, labels, n, K, G, NULL);
	s->table = malloc(sizeof *s->table * (size_t)G * (size_t)K);
	if (!s->table)
		return err_set(CORE_ENOMEM, NULL, "out of memory for a %d by %d table", G, K);
	if ((rc = clusterstats_table(assign, labels, n, K, G, s->table))) {
		clusterstats_free(s);
		return rc;
	}
	s->G = G;
	s->K = K;
	s->n = n;
	s->purity = clusterstats_purity(s->table, G, K);
	s->nmi = clusterstats_nmi(s->table, G, K);
	s->ari = clusterstats_ari(s->table, G, K);
	if (isnan(s->nmi) || isnan(s->ari)) {
		clusterstats_free(s);
		return err_set(CORE_ENOMEM, NULL, "out of memory for a %d by %d table", G, K);
	}
	return 0;
}

void clusterstats_free(struct cluster_stats *s)
{
	free(s->table);
	memset(s, 0, sizeof *s);
}
