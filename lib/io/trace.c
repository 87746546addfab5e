/* trace.c - read a capacity trace; see trace.h. */
#include "io/trace.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/banned.h"

int trace_read(const char *path, double **out, size_t *n)
{
	FILE *f = fopen(path, "r");
	char *line = NULL;
	size_t cap = 0, len = 0, alloc = 0;
	double *v = NULL;
	long lineno = 0;
	ssize_t got;
	int rc = 0;

	*out = NULL;
	*n = 0;
	if (!f)
		return err_errno(CORE_EIO, path, "cannot open", errno);
	errno = 0;
	while ((got = getline(&line, &cap, f)) >= 0) {
		char *s = line, *end;
		lineno++;
		/* C strings would stop at a NUL and take the rest of the line for unread. */
		if (memchr(line, '\0', (size_t)got)) {
			rc = err_set(CORE_ECONFIG, path, "line %ld: NUL byte in the trace", lineno);
			goto out;
		}
		while (isspace((unsigned char)*s))
			s++;
		if (*s == '\0' || *s == '#')
			continue;
		errno = 0;
		double x = strtod(s, &end);
		char *rest = end;
		while (isspace((unsigned char)*rest))
			rest++;
		if (end == s || *rest != '\0' || errno || !isfinite(x)) {
			s[strcspn(s, "\r\n")] = '\0';
			rc = err_set(CORE_ECONFIG, path, "line %ld: '%.40s' is not a capacity setting",
				     lineno, s);
			goto out;
		}
		if (fabs(x) > TRACE_SETTING_MAX) {
			rc = err_set(CORE_ECONFIG, path, "line %ld: capacity setting %g is outside "
				     "[%g, %g]", lineno, x, -TRACE_SETTING_MAX, TRACE_SETTING_MAX);
			goto out;
		}
		if (len == alloc) {
			alloc = alloc ? 2 * alloc : 64;
			double *nv = realloc(v, sizeof(double) * alloc);
			if (!nv) {
				rc = err_set(CORE_ENOMEM, path, "cannot allocate the trace");
				goto out;
			}
			v = nv;
		}
		v[len++] = x;
		errno = 0;
	}
	if (ferror(f)) {
		char what[64];
		snprintf(what, sizeof what, "read error at line %ld", lineno + 1);
		rc = errno ? err_errno(CORE_EIO, path, what, errno)
			   : err_set(CORE_EIO, path, "%s", what);
		goto out;
	}
	if (len == 0)
		rc = err_set(CORE_ECONFIG, path, "no capacity settings in the trace");
out:
	free(line);
	fclose(f);
	if (rc < 0) {
		free(v);
		return rc;
	}
	*out = v;
	*n = len;
	return 0;
}
