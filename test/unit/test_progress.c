/* test_progress.c - the progress display writes plain lines, one per interval, when stderr
 * is not a terminal (nothing within the first), and on a terminal (a pseudo-terminal here)
 * redraws at most ten times a second and ends its line. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/progress.h"
#include "common/banned.h"

TestSuite(progress, .timeout = 20);

Test(progress, a_log_gets_nothing_within_the_first_interval, .init = cr_redirect_stderr)
{
	struct progress p;

	progress_init(&p, "train", 100);
	cr_assert_eq(p.enabled, PROGRESS_LOG);
	cr_assert_eq(p.interval, PROGRESS_LOG_SECONDS, "interval %g", p.interval);
	for (int i = 0; i <= 100; i++) /* far under 10 s: a short run leaves no trace */
		progress_update(&p, i, "loss 1.0");
	progress_done(&p);
	fflush(stderr);
	cr_assert_stderr_eq_str("");
}

/* In a log (stderr not a terminal) each line is plain text ended by a newline: no carriage
 * return, no escape; one per interval (0 here: one per update), with the unit on the rate. */
Test(progress, a_log_gets_plain_lines, .init = cr_redirect_stderr)
{
	struct progress p;

	progress_init(&p, "train", 4);
	p.unit = "steps";
	p.interval = 0.0;
	for (int i = 1; i <= 4; i++)
		progress_update(&p, i, "loss 2.5");
	progress_done(&p);
	fflush(stderr);
	char buf[1024] = {0};
	FILE *f = cr_get_redirected_stderr();
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	int lines = 0;
	for (size_t i = 0; i < n; i++) {
		cr_assert(buf[i] != '\r' && buf[i] != '\033', "a control character in '%s'", buf);
		lines += buf[i] == '\n';
	}
	cr_assert_eq(lines, 4, "expected 4 lines, got '%s'", buf);
	cr_assert(strstr(buf, "train  1/4   25.0%  ") == buf, "first line: '%s'", buf);
	cr_assert(strstr(buf, " steps/s  eta ") && strstr(buf, "  loss 2.5\ntrain  2/4"),
		  "lines: '%s'", buf);
}

/* DPC_PROGRESS_SECONDS sets the log interval; a value that is not a number >= 0 is ignored */
Test(progress, the_environment_sets_the_log_interval, .init = cr_redirect_stderr)
{
	struct progress p;

	setenv("DPC_PROGRESS_SECONDS", "2.5", 1);
	progress_init(&p, "x", 1);
	cr_assert_eq(p.interval, 2.5);
	setenv("DPC_PROGRESS_SECONDS", "soon", 1);
	progress_init(&p, "x", 1);
	cr_assert_eq(p.interval, PROGRESS_LOG_SECONDS);
	setenv("DPC_PROGRESS_SECONDS", "-1", 1);
	progress_init(&p, "x", 1);
	cr_assert_eq(p.interval, PROGRESS_LOG_SECONDS);
	unsetenv("DPC_PROGRESS_SECONDS");
}

Test(progress, redraws_on_a_terminal_at_most_ten_hertz)
{
	int mfd = posix_openpt(O_RDWR | O_NOCTTY);
	cr_assert(mfd >= 0 && grantpt(mfd) == 0 && unlockpt(mfd) == 0);
	int sfd = open(ptsname(mfd), O_RDWR | O_NOCTTY);
	cr_assert(sfd >= 0);
	int saved = dup(2);
	cr_assert(dup2(sfd, 2) == 2);

	struct progress p;
	progress_init(&p, "train", 1000);
	int enabled = p.enabled;
	double t0 = now_seconds();
	for (int i = 0; i < 1000; i++)
		progress_update(&p, i, NULL); /* a tight loop: far under 0.1 s */
	double spent = now_seconds() - t0;
	progress_update(&p, 1000, "done"); /* the final state is always drawn */
	progress_done(&p);
	dup2(saved, 2);
	close(sfd);

	/* One read may return only part of what the pty holds: read until it is drained
	 * (EIO or 0 once the slave side is closed and the buffer empty). */
	char buf[8192];
	ssize_t n = 0, r;
	while (n < (ssize_t)sizeof buf - 1 && (r = read(mfd, buf + n, sizeof buf - 1 - n)) > 0)
		n += r;
	close(mfd);
	cr_assert(enabled, "a terminal on fd 2 was not detected");
	cr_assert(n > 0);
	buf[n] = '\0';
	int draws = 0;
	for (ssize_t i = 0; i < n; i++)
		draws += buf[i] == '\r';
	/* ptys turn "\n" into "\r\n", so the final newline adds one \r. */
	int allowed = 2 + (int)(spent / 0.1) + 1;
	cr_assert(draws >= 2 && draws <= allowed, "%d redraws in %.3f s:\n%s", draws, spent, buf);
	cr_assert(strstr(buf, "1000/1000") && strstr(buf, "100.0%") && strstr(buf, "done"),
		  "final line:\n%s", buf);
	cr_assert(strstr(buf, "train  0/1000"), "first line:\n%s", buf);
}

Test(progress, now_seconds_is_monotonic)
{
	double a = now_seconds();
	usleep(20000);
	double b = now_seconds();
	cr_assert(b - a >= 0.019 && b - a < 1.0, "slept 20 ms, clock moved %.6f s", b - a);
}

Test(progress, peak_rss_counts_touched_memory_in_bytes)
{
	size_t n = (size_t)64 << 20;
	unsigned char *b = malloc(n);

	cr_assert_not_null(b);
	volatile unsigned char *v = b; /* every page written: no store the compiler may drop */
	for (size_t i = 0; i < n; i += 4096)
		v[i] = 1;
	uint64_t rss = peak_rss_bytes();
	free(b);
	cr_assert(rss >= n, "peak RSS %llu bytes after touching %zu", (unsigned long long)rss, n);
	cr_assert_eq(rss % 1024, 0, "peak RSS %llu is not whole KiB", (unsigned long long)rss);
}
