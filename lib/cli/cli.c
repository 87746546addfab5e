/* cli.c - checked number parsing and error reporting for programs; see cli.h. */
#include "cli/cli.h"

#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "backend/backend.h"
#include "common/editdist.h"
#include "common/err.h"
#include "common/jsonfmt.h"
#include "io/atomicio.h"
#include "common/banned.h"

/* strtol and strtod skip leading white space, which no other malformed number gets past:
 * ' 5' is refused as '5x' is. */
static int starts_blank(const char *s)
{
	return isspace((unsigned char)s[0]);
}

int cli_parse_long(const char *opt, const char *s, long lo, long hi, long *out)
{
	char *end;

	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end != '\0' || starts_blank(s))
		return err_set(CORE_EUSAGE, NULL, "option '%s': '%s' is not an integer", opt, s);
	if (v < lo || v > hi)
		return err_set(CORE_EUSAGE, NULL, "option '%s': %ld is outside [%ld, %ld]", opt, v,
			       lo, hi);
	*out = v;
	return 0;
}

int cli_parse_precision(const char *opt, const char *s, int *out)
{
	int p = backend_precision_from_name(s);
	if (p < 0)
		return err_set(CORE_EUSAGE, NULL, "option '%s': unknown precision '%s' (fp32, tf32 "
			       "or bf16)", opt, s);
	*out = p;
	return 0;
}

int cli_parse_double(const char *opt, const char *s, double lo, double hi, double *out)
{
	char *end;

	errno = 0;
	double v = strtod(s, &end);
	if (errno || end == s || *end != '\0' || starts_blank(s) || !isfinite(v))
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

	/* err_set escaped the file and the detail: the line is one line. */
	err_format(msg, sizeof msg, code);
	fprintf(stderr, "%s: %s\n", prog, msg);
	return err_exit_status(code);
}

int cli_usage_error(const char *prog, const char *fmt, ...)
{
	char raw[1024], msg[1024];
	va_list ap;

	/* It quotes arguments as typed: escaped as err_set escapes, to stay one line. */
	va_start(ap, fmt);
	vsnprintf(raw, sizeof raw, fmt, ap);
	va_end(ap);
	err_escape(msg, sizeof msg, raw);
	fprintf(stderr, "%s: %s\n", prog, msg);
	return 2;
}

int cli_bad_option(const char *prog, const char *help, const struct option *longopts,
		   char **argv, int c)
{
	const char *what = argv[optind - 1];

	if (c == ':')
		return cli_usage_error(prog, "option '%s' requires an argument (see %s --help)",
				       what, help);
	/* A no-argument long option given "=VALUE": getopt sets optopt to the option's value
	 * (as 'f' for --force), which is no option the user typed. An error in the middle of a
	 * cluster of short options leaves optind on the cluster, so what may then be an
	 * earlier "--name=VALUE"; only a no-argument option's name makes it this error. */
	const char *eq = strchr(what, '=');
	if (strncmp(what, "--", 2) == 0 && eq && optopt) {
		size_t n = (size_t)(eq - what) - 2;
		for (const struct option *o = longopts; o && o->name; o++)
			if (o->has_arg == no_argument && o->val == optopt &&
			    strncmp(o->name, what + 2, n) == 0)
				return cli_usage_error(prog, "option '--%s' takes no argument "
						       "(see %s --help)", o->name, help);
	}
	if (optopt && optopt != '?')
		return cli_usage_error(prog, "unknown option '-%c' (see %s --help)", optopt, help);
	/* The nearest long option: underscores read as hyphens (Tutel's and argparse's
	 * --capacity_factor), then within 2 edits, or a third of the name's length. */
	if (strncmp(what, "--", 2) == 0) {
		char name[64];
		size_t n = strcspn(what + 2, "=");
		if (n < sizeof name) {
			memcpy(name, what + 2, n);
			name[n] = '\0';
			for (char *p = name; *p; p++)
				*p = *p == '_' ? '-' : *p;
			const char *best = NULL;
			size_t bd = n / 3 > 2 ? n / 3 : 2;
			for (const struct option *o = longopts; o && o->name; o++) {
				size_t d = edit_distance(name, o->name);
				if (d <= bd && (!best || d < edit_distance(name, best))) {
					best = o->name;
					bd = d;
				}
			}
			if (best)
				return cli_usage_error(prog, "unknown option '%s' (did you mean '--%s'? "
						       "see %s --help)", what, best, help);
		}
	}
	return cli_usage_error(prog, "unknown option '%s' (see %s --help)", what, help);
}

int cli_print_json(json_t *j, size_t flags)
{
	int rc, e;

	if (!j)
		return err_set(CORE_ENOMEM, NULL, "cannot build the JSON result");
	errno = 0;
	rc = json_dumpf(j, stdout, (flags & ~(size_t)JSON_REAL_PRECISION(31)) | CORE_JSON_REAL);
	json_decref(j);
	if (rc == 0)
		putchar('\n');
	if (rc != 0 || fflush(stdout) != 0 || ferror(stdout)) {
		e = errno;
		return e ? err_errno(CORE_EIO, "<stdout>", "write failed", e)
			 : err_set(CORE_EIO, "<stdout>", "write failed");
	}
	return 0;
}

int cli_make_parents(const char *path)
{
	char dir[4096];
	const char *slash = strrchr(path, '/');
	if (!slash || slash == path)
		return 0;
	size_t n = (size_t)(slash - path);
	if (n >= sizeof dir)
		return err_set(CORE_EIO, path, "path too long");
	memcpy(dir, path, n);
	dir[n] = '\0';
	return dir_make(dir, NULL, 0);
}
