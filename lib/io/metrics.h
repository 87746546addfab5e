/* metrics.h - JSON Lines metrics: one object per event, each line written whole or not at all,
 * so a crashed run or a full disk still leaves a file of complete lines. */
#ifndef CORE_METRICS_H
#define CORE_METRICS_H

struct metrics {
	int fd;    /* O_APPEND; meaningful only while path is set */
	char *path;
};

/* Open path for appending (a resumed run continues the same file); NULL path = disabled. */
int metrics_open(struct metrics *m, const char *path);
/* One event, as one line written with one write(2). When the line cannot be written whole (a
 * full disk, a file-size limit), the bytes that did get written are cut off again
 * (ftruncate to the size before) and CORE_EIO says why; the file keeps only whole lines.
 * The variadic list is (key, type, value) triples ended by NULL, where type is
 * 'i' (long long: cast, 12 alone is an int), 'f' (double, written with %.9g; NaN/inf as null), 's' (const char *). */
int metrics_event(struct metrics *m, const char *event, ...);
void metrics_close(struct metrics *m);

#endif
