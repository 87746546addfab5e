/* test_sample.c - sample_token against hand-computed answers: greedy picks (ties to the lower
 * index), the inverse-CDF boundaries of a known distribution with and without temperature,
 * top-k and top-p cuts (the nucleus of probabilities 0.5, 0.3, 0.15, 0.05 at p = 0.7 is the
 * first two), and the frequencies over a fine grid of u equal to the probabilities.
 */
#include <criterion/criterion.h>
#include <math.h>

#include "model/sample.h"

TestSuite(sample, .timeout = 10);

static int work[16];

/* logits whose softmax at temperature 1 is p (p[i] > 0) */
static void logits_of(const double *p, int V, float *l)
{
	for (int v = 0; v < V; v++)
		l[v] = (float)log(p[v]);
}

Test(sample, greedy_takes_the_largest_logit_and_the_lower_index_on_ties)
{
	float l[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
	struct sample_opts o = {.temperature = 0.0, .top_k = 0, .top_p = 1.0};
	for (double u = 0.0; u < 1.0; u += 0.1)
		cr_assert_eq(sample_token(l, 5, &o, u, work), 1);
	o = (struct sample_opts){.temperature = 1.0, .top_k = 1, .top_p = 1.0};
	cr_assert_eq(sample_token(l, 5, &o, 0.99, work), 1);
}

Test(sample, inverse_cdf_of_a_known_distribution)
{
	/* tokens in index order 2, 0, 3, 1 by probability: 0.5, 0.3, 0.15, 0.05 */
	const double p[4] = {0.3, 0.05, 0.5, 0.15};
	float l[4];
	logits_of(p, 4, l);
	struct sample_opts o = {.temperature = 1.0, .top_k = 0, .top_p = 1.0};
	cr_assert_eq(sample_token(l, 4, &o, 0.0, work), 2);
	cr_assert_eq(sample_token(l, 4, &o, 0.4999, work), 2);
	cr_assert_eq(sample_token(l, 4, &o, 0.5001, work), 0);
	cr_assert_eq(sample_token(l, 4, &o, 0.7999, work), 0);
	cr_assert_eq(sample_token(l, 4, &o, 0.8001, work), 3);
	cr_assert_eq(sample_token(l, 4, &o, 0.9499, work), 3);
	cr_assert_eq(sample_token(l, 4, &o, 0.9501, work), 1);
	/* temperature 2: p_i ~ sqrt(p_i) */
	double s = 0.0, q[4];
	for (int i = 0; i < 4; i++)
		s += sqrt(p[i]);
	for (int i = 0; i < 4; i++)
		q[i] = sqrt(p[i]) / s;
	o.temperature = 2.0;
	cr_assert_eq(sample_token(l, 4, &o, q[2] - 1e-4, work), 2);
	cr_assert_eq(sample_token(l, 4, &o, q[2] + 1e-4, work), 0);
	cr_assert_eq(sample_token(l, 4, &o, q[2] + q[0] + 1e-4, work), 3);
}

Test(sample, top_k_and_top_p_cut_and_renormalise)
{
	const double p[4] = {0.3, 0.05, 0.5, 0.15};
	float l[4];
	logits_of(p, 4, l);
	/* top-k 2: tokens 2 and 0, renormalised to 0.5/0.8 and 0.3/0.8 */
	struct sample_opts o = {.temperature = 1.0, .top_k = 2, .top_p = 1.0};
	cr_assert_eq(sample_token(l, 4, &o, 0.6249, work), 2);
	cr_assert_eq(sample_token(l, 4, &o, 0.6251, work), 0);
	cr_assert_eq(sample_token(l, 4, &o, 0.9999, work), 0);
	/* top-p 0.7: 0.5 < 0.7 <= 0.8, the nucleus is the same two */
	o = (struct sample_opts){.temperature = 1.0, .top_k = 0, .top_p = 0.7};
	cr_assert_eq(sample_token(l, 4, &o, 0.6249, work), 2);
	cr_assert_eq(sample_token(l, 4, &o, 0.6251, work), 0);
	cr_assert_eq(sample_token(l, 4, &o, 0.9999, work), 0);
	/* top-p 0.5: exactly the first token's mass: it alone */
	o.top_p = 0.5;
	cr_assert_eq(sample_token(l, 4, &o, 0.9999, work), 2);
	/* top-k 3 then top-p 0.9 of the kept 0.95: 0.9 * 0.95 = 0.855 > 0.8, all three */
	o = (struct sample_opts){.temperature = 1.0, .top_k = 3, .top_p = 0.9};
	cr_assert_eq(sample_token(l, 4, &o, 0.9999, work), 3);
}

Test(sample, frequencies_follow_the_probabilities)
{
	const double p[6] = {0.1, 0.25, 0.05, 0.3, 0.2, 0.1};
	float l[6];
	logits_of(p, 6, l);
	struct sample_opts o = {.temperature = 1.0, .top_k = 0, .top_p = 1.0};
	int count[6] = {0};
	const int n = 100000;
	for (int i = 0; i < n; i++)
		count[sample_token(l, 6, &o, (i + 0.5) / n, work)]++;
	for (int v = 0; v < 6; v++)
		cr_assert(fabs((double)count[v] / n - p[v]) < 1e-4, "token %d: %d of %d, p %g", v,
			  count[v], n, p[v]);
}
