/* metrics.h - JSON Lines metrics: one object per event, flushed per line, so a crashed run
 * still leaves every complete line readable. */
#ifndef CORE_METRICS_H
#define CORE_METRICS_H

#include <stdio.h>

struct metrics {
	FILE *fp;
	char *path;
};

/* Open path for appending (a resumed run continues the same file); NULL path = disabled. */
int metrics_open(struct metrics *m, const char *path);
/* One event. The variadic list is (key, type, value) triples ended by NULL, where type is
 * 'i' (long long: cast, 12 alone is an int), 'f' (double, written with %.9g; NaN/inf as null), 's' (const char *). */
int metrics_event(struct metrics *m, const char *event, ...);
void metrics_close(struct metrics *m);

#endif
