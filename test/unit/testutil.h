/* testutil.h - what the unit tests share: a scratch directory under $TMPDIR, its removal
 * (never following a symlink out of it), and a whole file read into memory. Each function is
 * static inline, so that a test using only some of them gets no unused-function warning. */
#ifndef TEST_UNIT_TESTUTIL_H
#define TEST_UNIT_TESTUTIL_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Make $TMPDIR/test_TAG.XXXXXX (/tmp when TMPDIR is unset or empty) into dir, n bytes. */
static inline void tu_mkdtemp(char *dir, size_t n, const char *tag)
{
	const char *tmp = getenv("TMPDIR");
	int k = snprintf(dir, n, "%s/test_%s.XXXXXX", tmp && *tmp ? tmp : "/tmp", tag);

	cr_assert(k > 0 && (size_t)k < n, "scratch directory name over %zu bytes (TMPDIR '%s')", n,
		  tmp ? tmp : "");
	cr_assert(mkdtemp(dir), "mkdtemp '%s': %s", dir, strerror(errno));
}

/* Remove path and, if it is a directory, everything in it. Entries are looked at with lstat:
 * a symlink is unlinked, never followed. Errors are ignored (teardown's best effort); a name
 * too long for the buffer is left alone rather than cut to a different one. */
static inline void tu_rm_tree(const char *path)
{
	struct stat st;

	if (lstat(path, &st) != 0)
		return;
	if (S_ISDIR(st.st_mode)) {
		DIR *d = opendir(path);
		struct dirent *e;
		char q[4096];

		while (d && (e = readdir(d))) {
			if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
				continue;
			int k = snprintf(q, sizeof q, "%s/%s", path, e->d_name);
			if (k > 0 && (size_t)k < sizeof q)
				tu_rm_tree(q);
		}
		if (d)
			closedir(d);
		rmdir(path);
	} else {
		unlink(path);
	}
}

/* The whole file at path, read with stdio, NUL-terminated (*len excludes the NUL); the caller
 * frees it. A file that cannot be opened or read fails the test, naming the path. */
static inline void *tu_slurp(const char *path, size_t *len)
{
	FILE *fp = fopen(path, "rb");
	cr_assert(fp, "cannot open '%s': %s", path, strerror(errno));

	size_t cap = 4096, n = 0;
	char *b = malloc(cap);
	cr_assert(b, "out of memory reading '%s'", path);
	for (;;) {
		n += fread(b + n, 1, cap - 1 - n, fp);
		if (n < cap - 1)
			break;
		cap *= 2;
		b = realloc(b, cap);
		cr_assert(b, "out of memory reading '%s'", path);
	}
	cr_assert(!ferror(fp), "cannot read '%s'", path);
	fclose(fp);
	b[n] = '\0';
	*len = n;
	return b;
}

#endif
