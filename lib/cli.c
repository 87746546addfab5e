/* cli.c - checked number parsing and error reporting for programs; see cli.h. */
#include "cli.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "err.h"
#include "banned.h"

int cli_parse_long(const char *opt, const char *s, long lo, long hi, long *out)
{
	char *end;

	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end != '\0')
		return err_set(CORE_EUSAGE, NULL, "option '%s': '%s' is not an integer", opt, s);
	if (v < lo || v > hi)
		return err_set(CORE_EUSAGE, NULL, "option '%s': %ld is outside [%ld, %ld]", opt, v,
			       lo, hi);
	*out = v;
	return 0;
}

int cli_parse_double(const char *opt, const char *s, double lo, double hi, double *out)
{
	char *end;

	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end != '\0' || !isfinite(v))
		return err_set(CORE_EUSAGE, NULL, "option '%s': '%s' is not a number", opt, s);
	if (v < lo || v > hi)
		return err_set(CORE_EUSAGE, NULL, "option '%s': %g is outside [%g, %g]", opt, v, lo,
			       hi);
	*out = v;
	return 0;
}

int cli_report(const char *prog, int code)
{
	char msg[1200];

	err_format(msg, sizeof msg, code);
	fprintf(stderr, "%s: %s\n", prog, msg);
	return err_exit_status(code);
}

int cli_usage_error(const char *prog, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	return 2;
}

int cli_bad_option(const char *prog, const char *help, char **argv, int c)
{
	const char *what = argv[optind - 1];

	if (c == ':')
		return cli_usage_error(prog, "option '%s' requires an argument (see %s --help)",
				       what, help);
	if (optopt && optopt != '?')
		return cli_usage_error(prog, "unknown option '-%c' (see %s --help)", optopt, help);
	return cli_usage_error(prog, "unknown option '%s' (see %s --help)", what, help);
}
