/* test_schedule.c - the learning-rate schedule (train_lr) against values worked out by hand
 * from dpc-config(5)'s formula, with and without train.restart_step, and the config rules
 * of the restart.
 */
#include <criterion/criterion.h>
#include <math.h>

#include "common/err.h"
#include "io/config.h"
#include "model/train.h"

/* lr 1, warmup 2, 10 steps, cosine to 0.1. */
static struct train_config sched(long restart)
{
	struct run_config c;
	config_defaults(&c);
	c.train.lr = 1.0;
	c.train.warmup_steps = 2;
	c.train.steps = 10;
	c.train.min_lr_frac = 0.1;
	c.train.restart_step = restart;
	return c.train;
}

/* 0.1 + 0.9 * (1 + cos(pi p)) / 2 at p = 1/4, 1/2, 3/4 */
#define AT_QUARTER 0.86819805153394640
#define AT_HALF 0.55
#define AT_3QUARTERS 0.23180194846605362

static void expect_lrs(const struct train_config *t, const double *want, int n)
{
	for (int s = 0; s < n; s++)
		cr_expect(fabs(train_lr(t, s) - want[s]) < 1e-12, "step %d: lr %.17g, expected %.17g",
			  s, train_lr(t, s), want[s]);
}

/* One segment: warmup over steps 0-1, then the cosine over steps 2..10 (span 8). */
Test(schedule, one_segment_by_hand)
{
	const struct train_config t = sched(0);
	const double cos8[] = {0.5, 1.0, 1.0, 0.1 + 0.45 * (1 + cos(M_PI / 8)), AT_QUARTER,
			       0.1 + 0.45 * (1 + cos(3 * M_PI / 8)), AT_HALF,
			       0.1 + 0.45 * (1 + cos(5 * M_PI / 8)), AT_3QUARTERS,
			       0.1 + 0.45 * (1 + cos(7 * M_PI / 8))};
	expect_lrs(&t, cos8, 10);
}

/* Restart at 6: steps 0-5 warm up and decay over [2, 6) (span 4), steps 6-9 warm up again
 * (6, 7) and decay over [8, 10) (span 2). */
Test(schedule, restart_by_hand)
{
	const struct train_config t = sched(6);
	const double want[] = {0.5, 1.0, 1.0, AT_QUARTER, AT_HALF, AT_3QUARTERS,
			       0.5, 1.0, 1.0, AT_HALF};
	expect_lrs(&t, want, 10);
}

/* The restart must fall inside the steps; a dump carries it. */
Test(schedule, restart_rules)
{
	struct run_config c;
	char buf[4096];

	config_defaults(&c);
	c.train.steps = 100;
	c.train.restart_step = 100;
	cr_expect_eq(config_validate(&c, "test"), CORE_ECONFIG);
	cr_expect(strstr(err_detail(), "train.restart_step (100) must be before train.steps (100)"),
		  "%s", err_detail());
	c.train.restart_step = 99;
	cr_expect_eq(config_validate(&c, "test"), 0, "%s", err_detail());
	cr_expect_eq(config_set(&c, "train.restart_step=-1"), CORE_ECONFIG);
	cr_expect_eq(config_set(&c, "train.restart_step=40"), 0);
	config_dump(&c, buf, sizeof buf);
	cr_expect(strstr(buf, "train.restart_step: 40\n"), "%s", buf);
}
