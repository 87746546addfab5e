/* progress.h - a one-line progress display on stderr, only when stderr is a terminal, and
 * the clock and memory figures programs report. The line is redrawn at most ten times a
 * second; progress_done() ends it. */
#ifndef CORE_PROGRESS_H
#define CORE_PROGRESS_H

#include <stdint.h>

struct progress {
	const char *label;
	int64_t total;
	int enabled;
	double start, last_draw;
};

void progress_init(struct progress *p, const char *label, int64_t total);
/* Draw "label  done/total  pct  rate/s  eta  extra" (extra may be NULL). */
void progress_update(struct progress *p, int64_t done, const char *extra);
void progress_done(struct progress *p);
/* Monotonic seconds. */
double now_seconds(void);
/* The process's peak resident set size in bytes (getrusage ru_maxrss); 0 if unknown. */
uint64_t peak_rss_bytes(void);
/* The machine's physical memory in bytes; 0 if unknown. */
uint64_t phys_memory_bytes(void);

#endif
