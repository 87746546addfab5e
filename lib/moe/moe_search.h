/* moe_search.h - moe-profile's search for the fastest plan {r, d, a} of a capacity bucket
 * (the Tutel paper's section 3.2 dictionary): the two ends r = 0 (no token moves) and r = s
 * (all of an expert's ranks) first, then a ternary search over the divisors of s between,
 * each r at its best d and a; every trial kept for the trial table. Then, with confirm
 * rounds, the finalists (the MOE_SEARCH_FINALISTS plans of lowest median among the bucket's
 * trials) are timed again, interleaved: each round times every finalist once, in an order
 * that rotates from round to round, and the plan of the lowest median over its rounds
 * wins. A first pass times each plan once, one after the other, so a slow spell of the
 * machine (another process, an oversubscribed core) lands on whichever plan ran then; the
 * rounds spread it over all of them, as moe-profile --simulate's pairs do.
 *
 * The measurement is the caller's (moe-profile times the distributed layer; a test gives a
 * cost function), so the search itself runs, and is tested, anywhere.
 */
#ifndef CORE_MOE_SEARCH_H
#define CORE_MOE_SEARCH_H

#include <stddef.h>
#include <stdint.h>

#include "moe/moe_dict.h"
#include "moe/moe_dist.h"

struct moe_trial {
	int64_t key, C;
	struct moe_plan plan;
	double median, min, max; /* seconds per step */
};

#define MOE_SEARCH_FINALISTS 4

struct moe_search {
	int rs[64], nr;           /* the r values, moe_plan_rs's: 0, then the divisors of s */
	int confirm;              /* rounds of interleaved trials of the finalists (0: none) */
	int dlist[4], nd;         /* the d tried at r > 0 */
	int alist[2], na;         /* the a tried at r > 0 (enum dist_a2a) */
	/* One trial: the layer at capacity C under plan, its median (and min, max) step. */
	int (*measure)(void *ctx, int64_t C, const struct moe_plan *plan, double *median,
		       double *min, double *max);
	void *ctx;
	struct moe_trial *t;      /* every trial so far, in order */
	size_t nt, cap;
};

/* The fastest plan for bucket key, measured at capacity C, into *out; *trials: how many
 * this bucket took. */
int moe_search_bucket(struct moe_search *s, int64_t key, int64_t C, struct moe_dict_entry *out,
		      int *trials);
/* The trial table (moe-profile --trials): a header line, then one tab-separated line per
 * trial: bucket, C, r, d, a, median, min and max in milliseconds. Written atomically. */
int moe_search_write_trials(const char *path, const struct moe_search *s);
void moe_search_free(struct moe_search *s);

#endif
