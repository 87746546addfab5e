/* test_moe_search.c - moe-profile's plan search (moe/moe_search.h) on cost functions given
 * here instead of timings: for strictly unimodal costs over the r values (the minimum at
 * either end or anywhere between, for 1 to 12 values of r), with d and a adding their own
 * cost, the plan found is the brute-force minimum over every {r, d, a}; no plan is timed
 * twice; fewer trials than brute force once there are enough r values; the trial table
 * holds every trial as written by hand.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/rng.h"
#include "moe/moe_search.h"
#include "testutil.h"

TestSuite(moe_search, .timeout = 30);

/* cost(r index i, d, a) = (i - c)^2 + dw[d] + aw[a]: strictly unimodal in i at fixed d, a
 * (c is not a half-integer, so no two i tie), and the best d and a are the same at every r. */
struct cost {
	const int *rs;
	int nr;
	double c, dw[16], aw[2];
	int calls;
};

static int index_of(const struct cost *k, int r)
{
	for (int i = 0; i < k->nr; i++)
		if (k->rs[i] == r)
			return i;
	cr_assert_fail("r = %d is not one of the search's", r);
	return -1;
}

static double cost_of(const struct cost *k, const struct moe_plan *p)
{
	const int i = index_of(k, p->r);
	return (i - k->c) * (i - k->c) + (p->r ? k->dw[p->d] + k->aw[p->a] : 0.0);
}

static int measure(void *ctx, int64_t C, const struct moe_plan *p, double *md, double *mn,
		   double *mx)
{
	struct cost *k = ctx;
	cr_assert_eq(C, 77);
	k->calls++;
	*md = cost_of(k, p);
	*mn = *md - 0.5;
	*mx = *md + 0.5;
	return 0;
}

static void check_search(const int *rs, int nr, double c, uint64_t seed)
{
	struct cost k = {.rs = rs, .nr = nr, .c = c};
	struct moe_search s = {.nd = 3, .dlist = {1, 2, 8}, .na = 2, .alist = {0, 1},
			       .measure = measure, .ctx = &k, .nr = nr};
	memcpy(s.rs, rs, sizeof *rs * (size_t)nr);
	for (int d = 0; d < 16; d++)
		k.dw[d] = 0.3 * rng_uniform(seed, RNG_STREAM_TEST, (uint64_t)d);
	k.aw[0] = 0.3 * rng_uniform(seed, RNG_STREAM_TEST, 100);
	k.aw[1] = 0.3 * rng_uniform(seed, RNG_STREAM_TEST, 101);

	/* brute force */
	struct moe_plan best = {0};
	double bv = INFINITY;
	int brute = 0;
	for (int i = 0; i < nr; i++)
		for (int di = 0; di < (rs[i] ? s.nd : 1); di++)
			for (int ai = 0; ai < (rs[i] ? s.na : 1); ai++) {
				struct moe_plan p = {.r = rs[i], .d = rs[i] ? s.dlist[di] : 1,
						     .a = rs[i] ? (enum dist_a2a)s.alist[ai] :
							 DIST_A2A_LINEAR};
				double v = cost_of(&k, &p);
				brute++;
				if (v < bv)
					bv = v, best = p;
			}

	struct moe_dict_entry e;
	int trials;
	cr_assert_eq(moe_search_bucket(&s, 5, 77, &e, &trials), 0, "%s", err_detail());
	cr_expect(e.plan.r == best.r && e.plan.d == best.d && e.plan.a == best.a,
		  "nr %d, c %.2f: found r=%d d=%d a=%d (%g), brute force r=%d d=%d a=%d (%g)", nr, c,
		  e.plan.r, e.plan.d, e.plan.a, e.seconds, best.r, best.d, best.a, bv);
	cr_expect_eq(e.seconds, bv);
	cr_expect_eq(e.key, 5);
	cr_expect_eq((size_t)trials, s.nt);
	cr_expect_eq(trials, k.calls);
	for (size_t i = 0; i < s.nt; i++)
		for (size_t j = 0; j < i; j++)
			cr_expect(memcmp(&s.t[i].plan, &s.t[j].plan, sizeof s.t[i].plan) != 0,
				  "nr %d: r=%d d=%d a=%d timed twice", nr, s.t[i].plan.r,
				  s.t[i].plan.d, s.t[i].plan.a);
	if (nr >= 8)
		cr_expect_lt(trials, brute, "nr %d: %d trials, brute force %d", nr, trials, brute);
	moe_search_free(&s);
}

Test(moe_search, finds_the_brute_force_minimum)
{
	int rs[12] = {0};
	for (int nr = 1; nr <= 12; nr++) {
		for (int i = 1; i < nr; i++)
			rs[i] = 1 << (i - 1);
		/* the minimum at r = 0, at r = s, and at every index between (c off the grid) */
		for (int j = 0; j <= 2 * nr; j++)
			check_search(rs, nr, -0.7 + 0.5 * j + 0.05, 1000u * (unsigned)nr + (unsigned)j);
	}
}

Test(moe_search, trial_table_by_hand)
{
	char dir[256], path[300];
	const int rs[2] = {0, 4};
	struct cost k = {.rs = rs, .nr = 2, .c = 0.2, .dw = {[1] = 0.25, [2] = 0.125}};
	struct moe_search s = {.rs = {0, 4}, .nr = 2, .nd = 2, .dlist = {1, 2}, .na = 1,
			       .alist = {1}, .measure = measure, .ctx = &k};
	struct moe_dict_entry e;
	int trials;
	tu_mkdtemp(dir, sizeof dir, "moe_search");
	snprintf(path, sizeof path, "%s/trials.tsv", dir);
	cr_assert_eq(moe_search_bucket(&s, 3, 77, &e, &trials), 0, "%s", err_detail());
	cr_assert_eq(trials, 3);
	cr_assert_eq(moe_search_write_trials(path, &s), 0, "%s", err_detail());
	size_t n;
	char *text = tu_slurp(path, &n);
	/* r = 0: (0 - 0.2)^2 = 0.04 s; r = 4 (index 1): 0.64 plus d's 0.25 or 0.125 */
	const char *want = "# bucket\tC\tr\td\ta\tmedian_ms\tmin_ms\tmax_ms\n"
			   "3\t77\t0\t1\tlinear\t40.0000\t-460.0000\t540.0000\n"
			   "3\t77\t4\t1\t2dh\t890.0000\t390.0000\t1390.0000\n"
			   "3\t77\t4\t2\t2dh\t765.0000\t265.0000\t1265.0000\n";
	cr_expect_str_eq(text, want);
	cr_expect_eq(e.plan.r, 0);
	free(text);
	moe_search_free(&s);
	tu_rm_tree(dir);
}

Test(moe_search, errors)
{
	struct cost k = {0};
	struct moe_search s = {.nr = 0, .measure = measure, .ctx = &k};
	struct moe_dict_entry e;
	int trials;
	cr_expect_eq(moe_search_bucket(&s, 0, 77, &e, &trials), CORE_EUSAGE);
	s = (struct moe_search){.rs = {1, 2}, .nr = 2, .nd = 1, .dlist = {1}, .na = 1,
				.measure = measure, .ctx = &k};
	cr_expect_eq(moe_search_bucket(&s, 0, 77, &e, &trials), CORE_EUSAGE, "r = 0 not first");
}

/* The confirmation rounds (moe_search.h): the plan that is truly fastest but was timed during
 * a slow spell in the first pass (here: its first trial 1.35 s against a true 1.0) loses the
 * first pass and wins the rounds, which time the four finalists again, interleaved; without
 * rounds the first pass decides, wrongly. Each finalist is timed once per round. */
struct spell {
	int calls[8];
};

static int plan_id(const struct moe_plan *p)
{
	return p->r == 0 ? 0 : 1 + 2 * (p->r - 1) + (p->d == 2);
}

static int measure_spell(void *ctx, int64_t C, const struct moe_plan *p, double *md, double *mn,
			 double *mx)
{
	struct spell *k = ctx;
	/* r0 1.4; r1 d1 1.1, r1 d2 1.0 (the fastest, slow on its first trial); r2 d1 1.2,
	 * r2 d2 1.3 */
	static const double truth[5] = {1.4, 1.1, 1.0, 1.2, 1.3};
	const int i = plan_id(p);
	cr_assert(i >= 0 && i < 5 && C == 50);
	*md = truth[i] * (i == 2 && k->calls[i] == 0 ? 1.35 : 1.0);
	k->calls[i]++;
	*mn = *mx = *md;
	return 0;
}

Test(moe_search, confirmation_rounds_undo_a_slow_spell)
{
	for (int rounds = 0; rounds <= 3; rounds += 3) {
		struct spell k = {{0}};
		struct moe_search s = {.nr = 3, .rs = {0, 1, 2}, .nd = 2, .dlist = {1, 2}, .na = 1,
				       .alist = {0}, .measure = measure_spell, .ctx = &k,
				       .confirm = rounds};
		struct moe_dict_entry e;
		int trials = 0;
		cr_assert_eq(moe_search_bucket(&s, 3, 50, &e, &trials), 0, "%s", err_detail());
		if (rounds == 0) {
			cr_assert(e.plan.r == 1 && e.plan.d == 1, "without rounds the first pass "
				  "picks r=1 d=1, got r=%d d=%d", e.plan.r, e.plan.d);
			cr_assert_eq(trials, 5);
		} else {
			cr_assert(e.plan.r == 1 && e.plan.d == 2, "the rounds pick r=1 d=2, got r=%d "
				  "d=%d", e.plan.r, e.plan.d);
			cr_assert_float_eq(e.seconds, 1.0, 1e-12);
			cr_assert_eq(trials, 5 + 3 * 4, "%d trials", trials);
			/* the four finalists timed once a round; r = 0, the slowest, not again */
			cr_assert_eq(k.calls[0], 1);
			for (int i = 1; i < 5; i++)
				cr_assert_eq(k.calls[i], 1 + 3, "plan %d timed %d times", i, k.calls[i]);
		}
		moe_search_free(&s);
	}
}
