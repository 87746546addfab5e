/* err.c - thread-local error detail; see err.h. */
#include "common/err.h"

#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "common/banned.h"

static _Thread_local int last_code;
static _Thread_local char last_file[512];
static _Thread_local char last_detail[512];

int err_set(int code, const char *file, const char *fmt, ...)
{
	va_list ap;

	last_code = code;
	snprintf(last_file, sizeof last_file, "%s", file ? file : "");
	va_start(ap, fmt);
	vsnprintf(last_detail, sizeof last_detail, fmt, ap);
	va_end(ap);
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
