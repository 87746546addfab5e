/* err.h - library error codes and the detail that travels with them.
 *
 * Every libcore function that can fail returns 0 or a negative CORE_E* code. The function
 * that detects the failure records, with err_set(), the file it concerns and a short
 * lower-case detail; callers pass the code up unchanged (ERR_FORWARD). Programs turn the
 * code into one stderr line with err_format() and into an exit status with err_exit_status().
 * The detail is thread-local, so OpenMP workers cannot clobber each other's messages.
 */
#ifndef CORE_ERR_H
#define CORE_ERR_H

#include <stddef.h>

enum core_err {
	CORE_OK = 0,
	CORE_EIO = -1,          /* open/read/write/rename failed (errno in the detail) */
	CORE_ENOMEM = -2,       /* allocation failed */
	CORE_EFORMAT = -3,      /* malformed file: bad magic, bad header, bad JSON */
	CORE_ECHECKSUM = -4,    /* crc32 of the data does not match the header */
	CORE_EVERSION = -5,     /* a format version this build does not read */
	CORE_ESHAPE = -6,       /* a tensor or array of the wrong shape or type */
	CORE_ECONFIG = -7,      /* config error: unknown key, wrong type, out of range */
	CORE_EUSAGE = -8,       /* bad argument from the caller or the command line */
	CORE_ENAN = -9,         /* a NaN or infinity where a finite number is required */
	CORE_ENOTFOUND = -10,   /* a named tensor, key or file is missing */
	CORE_ETRUNC = -11,      /* file shorter than its header says */
	CORE_EUNSUPPORTED = -12 /* feature not built in (no CUDA, no MPI) */
};

/* Record code, file (may be NULL) and a printf-style detail; returns code. Both are recorded
 * escaped (err_escape), so that a message quoting any value stays on one line. */
int err_set(int code, const char *file, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* err_set(code, file, "what: <strerror(errnum)>"), the system's text with a lower-case first
 * letter as every detail is: the one way to report an errno. */
int err_errno(int code, const char *file, const char *what, int errnum);
/* The last recorded file ("" if none) and detail ("" if none), for this thread. */
const char *err_file(void);
const char *err_detail(void);
void err_clear(void);
/* src into dst (n bytes, always terminated) with its control characters escaped: newline as
 * \n, tab as \t, other bytes below 0x20 and 0x7f as \xHH; other bytes, backslash and UTF-8
 * included, as they are, so that escaping twice changes nothing. Truncated, never inside an
 * escape, when dst is too small. */
void err_escape(char *dst, size_t n, const char *src);
/* Short constant text for a code: "checksum mismatch", "config error", ... */
const char *err_name(int code);
/* One message "'file': detail" (without program name or newline) into buf; only the
 * detail when no file was recorded with this code. */
void err_format(char *buf, size_t n, int code);
/* 2 for usage and config errors, 1 for every other failure, 0 for CORE_OK. */
int err_exit_status(int code);

#define ERR_FORWARD(expr)                                                                  \
	do {                                                                                   \
		int err_fwd_rc_ = (expr);                                                          \
		if (err_fwd_rc_ < 0)                                                               \
			return err_fwd_rc_;                                                            \
	} while (0)

#endif
