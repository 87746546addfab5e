/* test_dist_model.c - the alpha-beta model of Linear and 2DH (lib/dist/dist_model.c) against
 * times computed by hand from its definition in dist_model.h, and its fit against the
 * parameters that generated exact and perturbed data.
 */
#include <criterion/criterion.h>
#include <math.h>

#include "dist/dist_model.h"
#include "common/banned.h"

TestSuite(dist_model, .timeout = 10);

/* nodes of 4; 10 us and 1 GB/s within, 100 us and 0.1 GB/s across; copies at 10 GB/s */
static const struct dist_net net = {
	.intra = {.alpha = 10e-6, .beta = 1e-9},
	.inter = {.alpha = 100e-6, .beta = 1e-8},
	.copy = 1e-10,
	.m = 4,
};

static void near(double got, double want, const char *what)
{
	cr_assert(fabs(got - want) <= 1e-12 + 1e-9 * fabs(want), "%s: %.12g, by hand %.12g", what,
		  got, want);
}

Test(dist_model, linear_by_hand)
{
	/* n = 16, S = 1.6 MB: 3 messages of 0.1 MB within (3 * (10 us + 100 us) = 330 us), 12
	 * across (12 * (100 us + 1000 us) = 13.2 ms): the slower level */
	near(dist_model_linear(&net, 16, 1.6e6), 13.2e-3, "linear, n 16");
	/* one node (n = m = 4): 3 messages of 0.4 MB within, nothing across */
	near(dist_model_linear(&net, 4, 1.6e6), 3 * (10e-6 + 0.4e6 * 1e-9), "linear, one node");
	/* n < m: the node is the world */
	near(dist_model_linear(&net, 2, 1e6), 1 * (10e-6 + 0.5e6 * 1e-9), "linear, n 2 < m");
}

Test(dist_model, twodh_by_hand)
{
	/* n = 16, S = 1.6 MB: copies 2 * 1.6e6 * 1e-10 = 320 us; 3 messages of S/m = 0.4 MB
	 * within = 3 * 410 us = 1.23 ms; 3 messages of S m / n = 0.4 MB across = 3 * 4.1 ms */
	near(dist_model_2dh(&net, 16, 1.6e6), 320e-6 + 1.23e-3 + 12.3e-3, "2dh, n 16");
	/* one node: the exchange within it, no copies */
	near(dist_model_2dh(&net, 4, 1.6e6), 3 * (10e-6 + 0.4e6 * 1e-9), "2dh, one node");
	/* nodes of one rank: Linear across */
	struct dist_net one = net;
	one.m = 1;
	near(dist_model_2dh(&one, 8, 8e5), 7 * (100e-6 + 1e5 * 1e-8), "2dh, nodes of 1");
}

Test(dist_model, crossover)
{
	/* small messages: alpha dominates across nodes, so aggregating wins at the first point
	 * (n = 8: Linear 4 * (100 us + 8 KB * 1e-8) = 720 us; 2DH 12.8 us copies + 3 * 26 us +
	 * 1 * (100 us + 32 KB * 1e-8 = 420 us): 510.8 us) */
	near(dist_model_linear(&net, 8, 64e3), 720e-6, "linear at the crossover");
	near(dist_model_2dh(&net, 8, 64e3), 12.8e-6 + 78e-6 + 420e-6, "2dh at the crossover");
	cr_assert_eq(dist_model_crossover(&net, 64e3, 4096), 8);
	/* a free network across nodes and slow copies: 2DH never pays */
	struct dist_net fast = net;
	fast.inter = (struct dist_link){.alpha = 0, .beta = 1e-12};
	fast.copy = 1e-8;
	cr_assert_eq(dist_model_crossover(&fast, 64e3, 4096), 0);
}

Test(dist_model, fit_recovers_exact_parameters)
{
	const double S[] = {4096, 65536, 1048576, 16777216};
	const int n = 4;
	double t[4];
	for (int i = 0; i < 4; i++)
		t[i] = (n - 1) * (25e-6 + S[i] / n * 2e-9);
	struct dist_link l = {-1, -1};
	cr_assert_eq(dist_model_fit(S, t, 4, n, &l), 0);
	near(l.alpha, 25e-6, "alpha");
	near(l.beta, 2e-9, "beta");
}

Test(dist_model, fit_weighs_relative_error)
{
	/* 3% noise on the two largest sizes (+6 ms of 201 ms, -0.2 ms of 3.2 ms) must not
	 * swamp a 50 us alpha, as an unweighted fit's does (its alpha comes out at 0.84 us) */
	const double S[] = {4096, 16384, 65536, 1048576, 16777216 * 4.0};
	const int n = 2;
	double t[5];
	for (int i = 0; i < 5; i++)
		t[i] = (n - 1) * (50e-6 + S[i] / n * 6e-9);
	t[4] *= 1.03;
	t[3] *= 0.97;
	struct dist_link l;
	cr_assert_eq(dist_model_fit(S, t, 5, n, &l), 0);
	cr_assert(fabs(l.alpha - 50e-6) < 2e-6, "alpha %.3g us, want 50 +- 2", 1e6 * l.alpha);
	cr_assert(fabs(l.beta - 6e-9) < 0.01 * 6e-9, "beta %.4g, want 6e-9 within 1%%", l.beta);
}

Test(dist_model, fit_refuses_and_clamps)
{
	const double same[] = {1e6, 1e6, 1e6}, t3[] = {1e-3, 1.1e-3, 0.9e-3};
	struct dist_link l = {7, 7};
	cr_assert_eq(dist_model_fit(same, t3, 3, 4, &l), -1, "one distinct size determines nothing");
	cr_assert(l.alpha == 7 && l.beta == 7, "a refused fit left the link alone");
	cr_assert_eq(dist_model_fit(same, t3, 3, 1, &l), -1, "one rank has no messages");
	/* times that fall with size: a negative beta, clamped at 0 */
	const double S[] = {1e3, 1e6}, t[] = {2e-3, 1e-3};
	cr_assert_eq(dist_model_fit(S, t, 2, 2, &l), 0);
	cr_assert(l.beta == 0 && l.alpha > 0, "alpha %g beta %g", l.alpha, l.beta);
}
