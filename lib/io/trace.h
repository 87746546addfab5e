/* trace.h - a capacity trace: the per-step capacity settings moe-bench replays.
 *
 * One setting (a finite number, see moe.h for its meaning) per line; blank lines and lines
 * starting with '#' are skipped. Strict: a line that is not exactly one finite number is an
 * error naming the file and the line, so a typo never silently becomes another workload.
 */
#ifndef CORE_TRACE_H
#define CORE_TRACE_H

#include <stddef.h>

/* *out (malloc'd, caller frees) gets *n >= 1 values. CORE_EIO if unreadable, CORE_ECONFIG
 * naming the file and the line if malformed or empty. */
int trace_read(const char *path, double **out, size_t *n);

#endif
