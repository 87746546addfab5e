/* err.c - thread-local error detail; see err.h.
 *
 * The detail and the file name are escaped here, as they are recorded, and nowhere else: a
 * value quoted from a config, an option or a file header may hold a newline or an escape
 * sequence, and one message must stay one line whoever quotes what. */
#include "common/err.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/banned.h"

static _Thread_local int last_code;
static _Thread_local char last_file[512];
static _Thread_local char last_detail[512];

void err_escape(char *dst, size_t n, const char *src)
{
	size_t o = 0;

	if (n == 0)
		return;
	for (const unsigned char *p = (const unsigned char *)src; *p; p++) {
		char esc[5];
		size_t len = 1;
		if (*p == '\n')
			memcpy(esc, "\\n", len = 2);
		else if (*p == '\t')
			memcpy(esc, "\\t", len = 2);
		else if (*p < 0x20 || *p == 0x7f)
			len = (size_t)snprintf(esc, sizeof esc, "\\x%02x", *p);
		else
			esc[0] = (char)*p;
		if (o + len >= n) /* truncate, but never inside an escape */
			break;
		memcpy(dst + o, esc, len);
		o += len;
	}
	dst[o] = '\0';
}

int err_set(int code, const char *file, const char *fmt, ...)
{
	/* Formatted apart first: callers re-record a saved err_file() or err_detail(), which
	 * must not be both the source and the destination of one snprintf. */
	char raw[sizeof last_detail];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(raw, sizeof raw, fmt, ap);
	va_end(ap);
	last_code = code;
	err_escape(last_detail, sizeof last_detail, raw);
	snprintf(raw, sizeof raw, "%s", file ? file : "");
	err_escape(last_file, sizeof last_file, raw);
	return code;
}

int err_errno(int code, const char *file, const char *what, int errnum)
{
	char text[128];

	snprintf(text, sizeof text, "%s", strerror(errnum));
	text[0] = (char)tolower((unsigned char)text[0]);
	return err_set(code, file, "%s: %s", what, text);
}

const char *err_file(void) { return last_file; }
const char *err_detail(void) { return last_detail; }

void err_clear(void)
{
	last_code = 0;
	last_file[0] = last_detail[0] = '\0';
}

const char *err_name(int code)
{
	switch (code) {
	case CORE_OK: return "success";
	case CORE_EIO: return "i/o error";
	case CORE_ENOMEM: return "out of memory";
	case CORE_EFORMAT: return "malformed file";
	case CORE_ECHECKSUM: return "checksum mismatch";
	case CORE_EVERSION: return "unsupported version";
	case CORE_ESHAPE: return "wrong shape";
	case CORE_ECONFIG: return "config error";
	case CORE_EUSAGE: return "usage error";
	case CORE_ENAN: return "not a finite number";
	case CORE_ENOTFOUND: return "not found";
	case CORE_ETRUNC: return "truncated file";
	case CORE_EUNSUPPORTED: return "not supported by this build";
	default: return "unknown error";
	}
}

void err_format(char *buf, size_t n, int code)
{
	const char *what = last_detail[0] ? last_detail : err_name(code);

	if (last_code != code || !last_file[0])
		snprintf(buf, n, "%s", last_code == code ? what : err_name(code));
	else
		snprintf(buf, n, "'%s': %s", last_file, what);
}

int err_exit_status(int code)
{
	if (code == CORE_OK)
		return 0;
	return (code == CORE_ECONFIG || code == CORE_EUSAGE) ? 2 : 1;
}
