/* test_trace.c - the capacity trace reader: every malformed line is refused naming the file
 * and the line, NUL bytes and out-of-range values included, and a FIFO is read as a stream. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/err.h"
#include "io/trace.h"
#include "common/banned.h"

TestSuite(trace, .timeout = 20);

/* A fresh temporary path (at least 64 bytes) holding len bytes of text. */
static void write_temp(const char *text, size_t len, char *path)
{
	const char *dir = getenv("TMPDIR");

	snprintf(path, 64, "%.40s/tracetestXXXXXX", dir && *dir ? dir : "/tmp");
	int fd = mkstemp(path);
	cr_assert(fd >= 0, "mkstemp %s failed", path);
	cr_assert_eq(write(fd, text, len), (ssize_t)len);
	close(fd);
}

/* trace_read of text fails with code and a message containing want. */
static void refused(const char *text, size_t len, int code, const char *want)
{
	char path[64], msg[1200];
	double *v = NULL;
	size_t n = 7;

	write_temp(text, len, path);
	int rc = trace_read(path, &v, &n);
	err_format(msg, sizeof msg, rc);
	unlink(path);
	cr_assert_eq(rc, code, "rc %d: %s", rc, msg);
	cr_assert_null(v);
	cr_assert_eq(n, 0);
	cr_assert(strncmp(msg, "'", 1) == 0 && strstr(msg, path + 1), "no file in '%s'", msg);
	cr_assert(strstr(msg, want), "'%s' does not say '%s'", msg, want);
	cr_assert_null(strchr(msg, '\n'));
}

Test(trace, reads_settings_comments_and_blanks)
{
	static const char text[] = "# settings\n1.0\n\n  -0.5  \n0\n1e6\n";
	char path[64];
	double *v;
	size_t n;

	write_temp(text, sizeof text - 1, path);
	cr_assert_eq(trace_read(path, &v, &n), 0, "%s", err_detail());
	unlink(path);
	cr_assert_eq(n, 4);
	cr_assert(v[0] == 1.0 && v[1] == -0.5 && v[2] == 0.0 && v[3] == 1e6);
	free(v);
}

Test(trace, nul_bytes_are_refused)
{
	static const char mid[] = "1.0\0 garbage\n", first[] = "1\n\0\n2\n";
	refused(mid, sizeof mid - 1, CORE_ECONFIG, "line 1: NUL byte");
	refused(first, sizeof first - 1, CORE_ECONFIG, "line 2: NUL byte");
	refused("1\n2\0", 4, CORE_ECONFIG, "line 2: NUL byte");
}

Test(trace, out_of_range_values_are_refused)
{
	refused("1\n1e300\n", 8, CORE_ECONFIG, "line 2: capacity setting 1e+300 is outside");
	refused("-1000001\n", 9, CORE_ECONFIG, "line 1: capacity setting -1e+06 is outside");
	refused("1e999\n", 6, CORE_ECONFIG, "line 1: '1e999' is not a capacity setting");
	refused("nan\n", 4, CORE_ECONFIG, "line 1: 'nan' is not a capacity setting");
}

Test(trace, malformed_lines_are_quoted_on_one_line)
{
	refused("1\n2 3\n", 6, CORE_ECONFIG, "line 2: '2 3' is not a capacity setting");
	refused("1\x1b[2J\n", 7, CORE_ECONFIG, "line 1: '1\\x1b[2J' is not");
	refused("", 0, CORE_ECONFIG, "no capacity settings");
	refused("# only\n\n", 8, CORE_ECONFIG, "no capacity settings");
}

Test(trace, a_directory_is_an_io_error)
{
	double *v;
	size_t n;

	cr_assert_eq(trace_read("/", &v, &n), CORE_EIO);
	cr_assert_str_eq(err_file(), "/");
}

Test(trace, a_fifo_is_read_as_a_stream)
{
	char path[64];
	double *v;
	size_t n;

	write_temp("", 0, path);
	unlink(path);
	cr_assert_eq(mkfifo(path, 0600), 0);
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		FILE *f = fopen(path, "w");
		/* Written in two pieces: the reader must not stop at the first. */
		int ok = f && fputs("0.5\n", f) >= 0 && fflush(f) == 0 && usleep(100000) == 0 &&
			 fputs("2\n", f) >= 0 && fclose(f) == 0;
		_exit(ok ? 0 : 1);
	}
	int rc = trace_read(path, &v, &n), st;
	waitpid(pid, &st, 0);
	unlink(path);
	cr_assert_eq(rc, 0, "%s", err_detail());
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	cr_assert_eq(n, 2);
	cr_assert(v[0] == 0.5 && v[1] == 2.0);
	free(v);
}
