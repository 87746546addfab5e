/* metrics.c - JSON Lines metrics; see metrics.h.
 *
 * Each event is formatted completely in memory (jansson does the string escaping), then
 * written with one write(2) on an O_APPEND descriptor, so a crash or a second writer cannot
 * interleave half lines. A write can still stop short (ENOSPC, EFBIG under a file-size limit):
 * the partial line is then truncated away, because a later line appended after it would be
 * glued onto it and both would be lost to a JSON Lines reader. JSON has no NaN or infinity,
 * so those are written as null rather than as text no parser accepts.
 */
#include "io/metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/err.h"
#include "common/jsonfmt.h"
#include "common/banned.h"

int metrics_open(struct metrics *m, const char *path)
{
	memset(m, 0, sizeof *m);
	if (!path)
		return 0;
	m->path = strdup(path);
	if (!m->path)
		return err_set(CORE_ENOMEM, path, "cannot allocate");
	/* Read access is for the check of the last byte below; a FIFO opened for reading too
	 * would be its own reader and fill up, so it is opened for writing only. */
	struct stat st;
	int acc = stat(path, &st) == 0 && S_ISFIFO(st.st_mode) ? O_WRONLY : O_RDWR;
	int fd = open(path, acc | O_APPEND | O_CREAT | O_CLOEXEC, 0666);
	if (fd < 0) {
		int e = errno;
		free(m->path);
		m->path = NULL;
		return err_errno(CORE_EIO, path, "cannot open for appending", e);
	}
	/* A run killed mid-line leaves a last line without its newline; start on a fresh line
	 * so that the first new event is not glued onto the broken one. */
	char last = '\n';
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 && pread(fd, &last, 1, st.st_size - 1) == 1 &&
	    last != '\n' && write(fd, "\n", 1) != 1) {
		int e = errno;
		close(fd);
		free(m->path);
		m->path = NULL;
		return err_errno(CORE_EIO, path, "cannot write", e);
	}
	m->fd = fd;
	return 0;
}

/* json_string() refuses invalid UTF-8; keep the event and replace bytes outside ASCII. */
static json_t *string_value(const char *s)
{
	json_t *v = json_string(s ? s : "");
	if (v)
		return v;
	char *c = strdup(s);
	if (!c)
		return NULL;
	for (char *p = c; *p; p++)
		if ((unsigned char)*p >= 0x80)
			*p = '?';
	v = json_string(c);
	free(c);
	return v;
}

/* The whole line or nothing: see the top of the file. */
static int write_line(struct metrics *m, const char *s, size_t n)
{
	struct stat st;
	int have_size = fstat(m->fd, &st) == 0 && S_ISREG(st.st_mode);
	size_t done = 0;
	int e = 0;

	while (done < n) {
		ssize_t w = write(m->fd, s + done, n - done);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			e = w < 0 ? errno : EIO;
			break;
		}
		/* A short write is followed by one more, which says why (ENOSPC, EFBIG). */
		done += (size_t)w;
	}
	if (!e)
		return 0;
	if (done > 0 && have_size && ftruncate(m->fd, st.st_size) != 0)
		return err_errno(CORE_EIO, m->path, "cannot write, nor cut off a partial line",
				 errno);
	return err_errno(CORE_EIO, m->path, "cannot write", e);
}

int metrics_event(struct metrics *m, const char *event, ...)
{
	va_list ap;
	json_t *o;
	int rc = 0;

	if (!m->path)
		return 0;
	o = json_object();
	if (!o || json_object_set_new(o, "event", string_value(event)))
		goto nomem;
	va_start(ap, event);
	for (;;) {
		const char *key = va_arg(ap, const char *);
		if (!key)
			break;
		int type = va_arg(ap, int);
		json_t *v;
		if (type == 'i') {
			v = json_integer(va_arg(ap, long long));
		} else if (type == 'f') {
			double d = va_arg(ap, double);
			v = isfinite(d) ? json_real(d) : json_null();
		} else if (type == 's') {
			v = string_value(va_arg(ap, const char *));
		} else {
			/* The rest of the list cannot be read without knowing this type. */
			va_end(ap);
			json_decref(o);
			return err_set(CORE_EUSAGE, m->path, "metrics key '%s': unknown type '%c'",
				       key, type);
		}
		if (!v || json_object_set_new(o, key, v)) {
			va_end(ap);
			goto nomem;
		}
	}
	va_end(ap);

	char *s = json_dumps(o, JSON_COMPACT | CORE_JSON_REAL);
	json_decref(o);
	if (!s)
		return err_set(CORE_ENOMEM, m->path, "cannot format event");
	size_t n = strlen(s);
	s[n] = '\n'; /* replaces the NUL; the buffer is not used as a string again */
	rc = write_line(m, s, n + 1);
	free(s);
	return rc;
nomem:
	json_decref(o);
	return err_set(CORE_ENOMEM, m->path, "cannot format event");
}

void metrics_close(struct metrics *m)
{
	if (m->path)
		close(m->fd);
	free(m->path);
	memset(m, 0, sizeof *m);
}
