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
	int rc = 0;

	*out = NULL;
	*n = 0;
	if (!f)
		return err_errno(CORE_EIO, path, "cannot open", errno);
	while (getline(&line, &cap, f) >= 0) {
		char *s = line, *end;
		lineno++;
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
	}
	if (ferror(f)) {
		rc = err_set(CORE_EIO, path, "read error at line %ld", lineno + 1);
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
