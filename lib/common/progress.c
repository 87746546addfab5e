/* progress.c - progress on stderr; see progress.h.
 *
 * On a terminal the line is redrawn in place with \r and cleared to its end, at most ten
 * times a second, so that the display costs nothing measurable inside a training loop. When
 * stderr is a file or a pipe (logs, batch jobs) a plain newline-ended line is written every
 * interval instead, without escapes, so a log stays one line per event and a run shorter
 * than the interval writes nothing.
 */
#include "common/progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "common/banned.h"


double now_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t peak_rss_bytes(void)
{
	struct rusage ru;

	if (getrusage(RUSAGE_SELF, &ru) != 0)
		return 0;
	return (uint64_t)ru.ru_maxrss * 1024; /* Linux counts ru_maxrss in KiB */
}

uint64_t phys_memory_bytes(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);
	return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size : 0;
}

void progress_init(struct progress *p, const char *label, int64_t total)
{
	memset(p, 0, sizeof *p);
	p->label = label ? label : "";
	p->unit = "";
	p->total = total;
	p->enabled = isatty(2) ? PROGRESS_TTY : PROGRESS_LOG;
	p->interval = 0.1;
	if (p->enabled == PROGRESS_LOG) {
		const char *e = getenv("DPC_PROGRESS_SECONDS");
		char *end;
		double v = e ? strtod(e, &end) : 0.0;
		p->interval = e && end != e && *end == '\0' && v >= 0.0 ? v : PROGRESS_LOG_SECONDS;
	}
	p->start = now_seconds();
	p->last_draw = -1.0; /* nothing drawn yet */
}

/* 1234567 -> "1.23M": rates span from a few steps to millions of tokens a second. */
static void human(char *buf, size_t n, double v)
{
	if (v >= 1e9)
		snprintf(buf, n, "%.2fG", v / 1e9);
	else if (v >= 1e6)
		snprintf(buf, n, "%.2fM", v / 1e6);
	else if (v >= 1e3)
		snprintf(buf, n, "%.2fk", v / 1e3);
	else
		snprintf(buf, n, "%.1f", v);
}

static void duration(char *buf, size_t n, double s)
{
	if (!(s >= 0) || s > 360000.0) {
		snprintf(buf, n, "--:--");
		return;
	}
	long t = (long)(s + 0.5);
	if (t >= 3600)
		snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
	else
		snprintf(buf, n, "%02ld:%02ld", t / 60, t % 60);
}

void progress_update(struct progress *p, int64_t done, const char *extra)
{
	char line[512], rate[32], eta[32];

	if (!p->enabled)
		return;
	double now = now_seconds();
	int finished = p->total > 0 && done >= p->total;
	if (p->enabled == PROGRESS_LOG) { /* a line per interval, the first one interval in */
		if (now - (p->last_draw >= 0 ? p->last_draw : p->start) < p->interval)
			return;
	} else if (p->last_draw >= 0 && now - p->last_draw < p->interval && !finished) {
		return;
	}
	p->last_draw = now;
	const int tty = p->enabled == PROGRESS_TTY;
	double el = now - p->start;
	double r = el > 0 ? (double)done / el : 0.0;
	char num[24];
	human(num, sizeof num, r);
	snprintf(rate, sizeof rate, "%s%s%s", num, *p->unit ? " " : "", p->unit);
	if (p->total > 0) {
		duration(eta, sizeof eta, r > 0 ? (double)(p->total - done) / r : -1.0);
		snprintf(line, sizeof line, "%s%s  %lld/%lld  %5.1f%%  %s/s  eta %s%s%s%s",
			 tty ? "\r" : "", p->label, (long long)done, (long long)p->total,
			 100.0 * (double)done / (double)p->total, rate, eta,
			 extra ? "  " : "", extra ? extra : "", tty ? "\033[K" : "\n");
	} else {
		snprintf(line, sizeof line, "%s%s  %lld  %s/s%s%s%s", tty ? "\r" : "", p->label,
			 (long long)done, rate, extra ? "  " : "", extra ? extra : "",
			 tty ? "\033[K" : "\n");
	}
	/* stderr is unbuffered: one fwrite keeps the redraw a single write(2). */
	fwrite(line, 1, strlen(line), stderr);
}

void progress_done(struct progress *p)
{
	if (p->enabled == PROGRESS_TTY && p->last_draw >= 0)
		fputc('\n', stderr);
	p->enabled = 0;
}
