/* trace.h - a capacity trace: the per-step capacity settings moe-bench replays.
 *
 * One setting (a number in [-TRACE_SETTING_MAX, TRACE_SETTING_MAX], see moe.h for its
 * meaning) per line; blank lines and lines starting with '#' are skipped. Strict: a line
 * that is not exactly one such number, or a NUL byte anywhere, is an error naming the file
 * and the line, so a typo never silently becomes another workload. The file is read as a
 * stream, once, so a pipe will do (--trace=<(cmd)); a FIFO nobody writes to blocks, as cat.
 */
#ifndef CORE_TRACE_H
#define CORE_TRACE_H

#include <stddef.h>

/* The largest magnitude of a setting: moe-bench's bound on --capacity too. A factor of a
 * million is beyond any real capacity; far beyond it the capacity's arithmetic overflows. */
#define TRACE_SETTING_MAX 1e6

/* *out (malloc'd, caller frees) gets *n >= 1 values. CORE_EIO if unreadable, CORE_ECONFIG
 * naming the file and the line if malformed or empty. */
int trace_read(const char *path, double **out, size_t *n);

#endif
