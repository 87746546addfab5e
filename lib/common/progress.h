/* progress.h - progress on stderr, and the clock and memory figures programs report.
 *
 * On a terminal, one line redrawn in place at most ten times a second; progress_done() ends
 * it. Elsewhere (a log file, a pipe, a batch job), a plain line every `interval` seconds
 * (PROGRESS_LOG_SECONDS, or the environment's DPC_PROGRESS_SECONDS), so a run shorter than
 * that writes nothing and a long one leaves a readable trail, as llm.c's and PyTorch scripts'
 * logs do. */
#ifndef CORE_PROGRESS_H
#define CORE_PROGRESS_H

#include <stdint.h>

struct progress {
	const char *label;
	const char *unit;  /* what `done` counts, for the rate ("steps/s"); "" by default */
	int64_t total;
	int enabled;       /* 0 off, PROGRESS_TTY, PROGRESS_LOG */
	double interval;   /* seconds between lines */
	double start, last_draw;
};

enum { PROGRESS_TTY = 1, PROGRESS_LOG = 2 };
#define PROGRESS_LOG_SECONDS 10.0

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
