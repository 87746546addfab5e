/* stats.h - summaries of repeated measurements, for the benchmarks (moe-bench, and the
 * later moe-profile and dpc-outer throughput): medians, because one preempted run on a
 * shared machine must not move the figure. */
#ifndef CORE_STATS_H
#define CORE_STATS_H

/* Median of v[0..n) (the mean of the middle two when n is even), from a sorted copy; the
 * smallest and largest through min and max when not NULL. NaN when n < 1 or the copy cannot
 * be allocated. */
double stats_median(const double *v, long n, double *min, double *max);

#endif
