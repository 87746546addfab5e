/* stats.c - medians of measurements; see stats.h. */
#include "common/stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/banned.h"

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

double stats_median(const double *v, long n, double *min, double *max)
{
	double *c = n > 0 ? malloc(sizeof(double) * (size_t)n) : NULL, m;

	if (!c) {
		if (min)
			*min = NAN;
		if (max)
			*max = NAN;
		return NAN;
	}
	memcpy(c, v, sizeof(double) * (size_t)n);
	qsort(c, (size_t)n, sizeof(double), cmp_double);
	m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
	if (min)
		*min = c[0];
	if (max)
		*max = c[n - 1];
	free(c);
	return m;
}
