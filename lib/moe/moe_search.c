/* moe_search.c - the plan search of a capacity bucket (moe_search.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/err.h"
#include "io/atomicio.h"
#include "moe/moe_search.h"

#include "common/banned.h"

static int add_trial(struct moe_search *s, const struct moe_trial *t)
{
	if (s->nt == s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 256;
		struct moe_trial *n = realloc(s->t, cap * sizeof *n);
		if (!n)
			return err_set(CORE_ENOMEM, NULL, "cannot allocate the trial table");
		s->t = n;
		s->cap = cap;
	}
	s->t[s->nt++] = *t;
	return 0;
}

/* One trial of plan at C, kept; *sec = its median. */
static int trial(struct moe_search *s, int64_t key, int64_t C, const struct moe_plan *plan,
		 double *sec)
{
	double md, mn, mx;
	ERR_FORWARD(s->measure(s->ctx, C, plan, &md, &mn, &mx));
	*sec = md;
	return add_trial(s, &(struct moe_trial){.key = key, .C = C, .plan = *plan, .median = md,
						.min = mn, .max = mx});
}

/* The best of every d and a at parallelism r (r = 0: one trial, nothing moves). */
static int best_at(struct moe_search *s, int64_t key, int64_t C, int r, struct moe_plan *best,
		   double *sec)
{
	*sec = INFINITY;
	for (int i = 0; i < (r ? s->nd : 1); i++)
		for (int j = 0; j < (r ? s->na : 1); j++) {
			struct moe_plan p = {.r = r, .d = r ? s->dlist[i] : 1,
					     .a = r ? (enum dist_a2a)s->alist[j] :
						   DIST_A2A_LINEAR};
			double t;
			ERR_FORWARD(trial(s, key, C, &p, &t));
			if (t < *sec) {
				*sec = t;
				*best = p;
			}
		}
	return 0;
}

static int same_plan(const struct moe_plan *a, const struct moe_plan *b)
{
	return a->r == b->r && a->d == b->d && a->a == b->a;
}

static int cmp_double(const void *a, const void *b)
{
	const double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* The confirmation rounds (moe_search.h) over the finalists among trials nt0.. of the
 * bucket: *out becomes the winner, its seconds the median of its rounds. */
static int confirm(struct moe_search *s, int64_t key, int64_t C, size_t nt0,
		   struct moe_dict_entry *out)
{
	struct moe_plan fin[MOE_SEARCH_FINALISTS];
	double best[MOE_SEARCH_FINALISTS];
	int nf = 0;
	/* the distinct plans of lowest median, at most MOE_SEARCH_FINALISTS */
	for (size_t i = nt0; i < s->nt; i++) {
		const struct moe_trial *t = &s->t[i];
		int at = -1;
		for (int j = 0; j < nf; j++)
			if (same_plan(&fin[j], &t->plan))
				at = j;
		if (at >= 0) {
			best[at] = t->median < best[at] ? t->median : best[at];
			continue;
		}
		if (nf < MOE_SEARCH_FINALISTS) {
			fin[nf] = t->plan;
			best[nf++] = t->median;
			continue;
		}
		int worst = 0;
		for (int j = 1; j < nf; j++)
			worst = best[j] > best[worst] ? j : worst;
		if (t->median < best[worst]) {
			fin[worst] = t->plan;
			best[worst] = t->median;
		}
	}
	if (nf < 2)
		return 0;
	double *r = malloc(sizeof *r * (size_t)nf * (size_t)s->confirm);
	if (!r)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the confirmation rounds");
	int rc = 0;
	for (int k = 0; k < s->confirm && !rc; k++)
		for (int j = 0; j < nf && !rc; j++) {
			const int i = (j + k) % nf; /* the order rotates round by round */
			rc = trial(s, key, C, &fin[i], &r[(size_t)i * (size_t)s->confirm + (size_t)k]);
		}
	int w = -1;
	double wv = INFINITY;
	for (int i = 0; i < nf && !rc; i++) {
		double *v = r + (size_t)i * (size_t)s->confirm;
		qsort(v, (size_t)s->confirm, sizeof *v, cmp_double);
		const int n = s->confirm;
		const double med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
		if (med < wv) {
			wv = med;
			w = i;
		}
	}
	if (!rc)
		*out = (struct moe_dict_entry){.key = key, .plan = fin[w], .seconds = wv};
	free(r);
	return rc;
}

int moe_search_bucket(struct moe_search *s, int64_t key, int64_t C, struct moe_dict_entry *out,
		      int *trials)
{
	const int nr = s->nr;
	double f[64];
	struct moe_plan p[64];
	const size_t nt0 = s->nt;

	if (nr < 1 || nr > 64 || s->rs[0] != 0 || (nr > 1 && (s->nd < 1 || s->na < 1)))
		return err_set(CORE_EUSAGE, NULL, "moe_search_bucket: %d values of r (r = 0 first), "
			       "%d of d, %d of a", nr, s->nd, s->na);
	for (int i = 0; i < nr; i++)
		f[i] = NAN;
	/* rs[0] = 0, rs[1..nr-1] the divisors of s ascending; search over indices 1..nr-1. */
	ERR_FORWARD(best_at(s, key, C, 0, &p[0], &f[0]));
	if (nr > 1)
		ERR_FORWARD(best_at(s, key, C, s->rs[nr - 1], &p[nr - 1], &f[nr - 1]));
	int lo = nr > 1 ? 1 : 0, hi = nr - 1;
	while (hi - lo > 2) {
		int m1 = lo + (hi - lo) / 3, m2 = hi - (hi - lo) / 3;
		if (isnan(f[m1]))
			ERR_FORWARD(best_at(s, key, C, s->rs[m1], &p[m1], &f[m1]));
		if (isnan(f[m2]))
			ERR_FORWARD(best_at(s, key, C, s->rs[m2], &p[m2], &f[m2]));
		if (f[m1] < f[m2])
			hi = m2;
		else
			lo = m1;
	}
	for (int i = lo; i <= hi; i++)
		if (isnan(f[i]))
			ERR_FORWARD(best_at(s, key, C, s->rs[i], &p[i], &f[i]));
	int b = -1;
	for (int i = 0; i < nr; i++)
		if (!isnan(f[i]) && (b < 0 || f[i] < f[b]))
			b = i;
	*out = (struct moe_dict_entry){.key = key, .plan = p[b], .seconds = f[b]};
	if (s->confirm > 0)
		ERR_FORWARD(confirm(s, key, C, nt0, out));
	*trials = (int)(s->nt - nt0);
	return 0;
}

int moe_search_write_trials(const char *path, const struct moe_search *s)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&buf, &len);
	if (!f)
		return err_set(CORE_ENOMEM, path, "cannot allocate the trial table");
	fprintf(f, "# bucket\tC\tr\td\ta\tmedian_ms\tmin_ms\tmax_ms\n");
	for (size_t i = 0; i < s->nt; i++) {
		const struct moe_trial *t = &s->t[i];
		fprintf(f, "%lld\t%lld\t%d\t%d\t%s\t%.4f\t%.4f\t%.4f\n", (long long)t->key,
			(long long)t->C, t->plan.r, t->plan.d, dist_a2a_name(t->plan.a),
			1e3 * t->median, 1e3 * t->min, 1e3 * t->max);
	}
	int rc = ferror(f) ? err_set(CORE_ENOMEM, path, "cannot build the trial table") : 0;
	fclose(f);
	if (rc == 0)
		rc = file_write_atomic(path, buf, len);
	free(buf);
	return rc;
}

void moe_search_free(struct moe_search *s)
{
	free(s->t);
	s->t = NULL;
	s->nt = s->cap = 0;
}
