/* sample.c - see sample.h. */
#include "model/sample.h"

#include <math.h>
#include <stdlib.h>

#include "common/banned.h"

/* Decreasing logit, then increasing index (qsort_r: the logits come as the context). */
static int by_logit(const void *a, const void *b, void *ctx)
{
	const float *l = ctx;
	int i = *(const int *)a, j = *(const int *)b;
	float x = l[i], y = l[j];
	if (x != y)
		return x > y ? -1 : 1;
	return (i > j) - (i < j);
}

int sample_token(const float *logits, int V, const struct sample_opts *o, double u, int *work)
{
	int best = 0;
	for (int v = 1; v < V; v++)
		best = logits[v] > logits[best] ? v : best;
	if (o->temperature <= 0.0 || o->top_k == 1)
		return best;

	for (int v = 0; v < V; v++)
		work[v] = v;
	qsort_r(work, (size_t)V, sizeof *work, by_logit, (void *)logits);
	int n = o->top_k > 0 && o->top_k < V ? o->top_k : V;
	/* the kept mass, then the nucleus within it */
	double total = 0.0, mx = logits[work[0]];
	for (int i = 0; i < n; i++)
		total += exp(((double)logits[work[i]] - mx) / o->temperature);
	if (o->top_p < 1.0) {
		double cum = 0.0;
		for (int i = 0; i < n; i++) {
			cum += exp(((double)logits[work[i]] - mx) / o->temperature);
			if (cum >= o->top_p * total) {
				n = i + 1;
				total = cum;
				break;
			}
		}
	}
	double target = u * total, cum = 0.0;
	for (int i = 0; i < n; i++) {
		cum += exp(((double)logits[work[i]] - mx) / o->temperature);
		if (cum > target)
			return work[i];
	}
	return work[n - 1]; /* u * total rounded up to the whole mass */
}
