/* test_metrics.c - JSON Lines metrics parse back with jansson and hold the values written, and a
 * line that does not fit on the disk leaves no half line behind. */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/err.h"
#include "io/metrics.h"
#include "testutil.h"
#include "common/banned.h"

static char dir[256], path[320];

static void setup(void)
{
	tu_mkdtemp(dir, sizeof dir, "metrics");
	snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
}

static void teardown(void)
{
	tu_rm_tree(dir);
}

TestSuite(metrics, .init = setup, .fini = teardown, .timeout = 20);

/* The file's lines, each parsed on its own; returns the count. */
static int load_lines(json_t **out, int max, char *raw, size_t rawmax)
{
	FILE *fp = fopen(path, "rb");
	cr_assert(fp, "cannot open '%s'", path);
	size_t n = fread(raw, 1, rawmax - 1, fp);
	raw[n] = '\0';
	fclose(fp);
	cr_assert(n == 0 || raw[n - 1] == '\n', "file does not end with a newline");
	int k = 0;
	char *save = NULL, *copy = strdup(raw);
	for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		json_error_t je;
		cr_assert(k < max);
		out[k] = json_loads(line, 0, &je);
		cr_assert(out[k], "line %d '%s' is not json: %s", k + 1, line, je.text);
		cr_assert(json_is_object(out[k]), "line %d is not an object", k + 1);
		k++;
	}
	free(copy);
	return k;
}

Test(metrics, lines_parse_back_with_their_values)
{
	struct metrics m;
	json_t *l[8];
	char raw[4096];

	cr_assert(metrics_open(&m, path) == 0, "%s", err_detail());
	cr_assert(metrics_event(&m, "step", "step", 'i', 12LL, "loss", 'f', 2.5,
				"lr", 'f', 3e-4, "phase", 's', "inner", NULL) == 0, "%s",
		  err_detail());
	cr_assert(metrics_event(&m, "bad", "loss", 'f', (double)NAN, "up", 'f', (double)INFINITY,
				"down", 'f', -(double)INFINITY, "big", 'i', -9007199254740993LL,
				NULL) == 0);
	cr_assert(metrics_event(&m, "text", "path", 's', "dir/with \"quotes\"\\\n\ttab",
				"utf8", 's', "caf\xc3\xa9", "third", 'f', 1.0 / 3.0, NULL) == 0);
	cr_assert(metrics_event(&m, "empty", NULL) == 0);
	metrics_close(&m);

	int n = load_lines(l, 8, raw, sizeof raw);
	cr_assert_eq(n, 4, "%d lines in:\n%s", n, raw);

	cr_assert_str_eq(json_string_value(json_object_get(l[0], "event")), "step");
	cr_assert_eq(json_integer_value(json_object_get(l[0], "step")), 12);
	cr_assert(json_is_real(json_object_get(l[0], "loss")));
	cr_assert(json_real_value(json_object_get(l[0], "loss")) == 2.5);
	cr_assert(json_real_value(json_object_get(l[0], "lr")) == 3e-4, "lr %.17g",
		  json_real_value(json_object_get(l[0], "lr")));
	cr_assert_str_eq(json_string_value(json_object_get(l[0], "phase")), "inner");

	cr_assert(json_is_null(json_object_get(l[1], "loss")), "NaN not written as null");
	cr_assert(json_is_null(json_object_get(l[1], "up")), "inf not written as null");
	cr_assert(json_is_null(json_object_get(l[1], "down")), "-inf not written as null");
	cr_assert_eq(json_integer_value(json_object_get(l[1], "big")), -9007199254740993LL,
		     "64-bit integer not exact");

	cr_assert_str_eq(json_string_value(json_object_get(l[2], "path")),
			 "dir/with \"quotes\"\\\n\ttab");
	cr_assert_str_eq(json_string_value(json_object_get(l[2], "utf8")), "caf\xc3\xa9");
	/* %.9g: nine significant digits. */
	double third = json_real_value(json_object_get(l[2], "third"));
	cr_assert(fabs(third - 1.0 / 3.0) < 1e-9 && third != 1.0 / 3.0, "1/3 written as %.17g",
		  third);
	cr_assert(strstr(raw, "0.333333333"), "raw text:\n%s", raw);

	cr_assert_eq(json_object_size(l[3]), 1);
	for (int i = 0; i < n; i++)
		json_decref(l[i]);
}

Test(metrics, appends_and_repairs_a_broken_last_line)
{
	struct metrics m;
	char raw[4096];

	/* A previous run killed in the middle of a line. */
	FILE *fp = fopen(path, "wb");
	fputs("{\"event\":\"step\",\"step\":1}\n{\"event\":\"st", fp);
	fclose(fp);
	cr_assert(metrics_open(&m, path) == 0, "%s", err_detail());
	cr_assert(metrics_event(&m, "resume", "step", 'i', 2LL, NULL) == 0);
	metrics_close(&m);

	fp = fopen(path, "rb");
	size_t n = fread(raw, 1, sizeof raw - 1, fp);
	raw[n] = '\0';
	fclose(fp);
	cr_assert_str_eq(raw, "{\"event\":\"step\",\"step\":1}\n{\"event\":\"st\n"
			      "{\"event\":\"resume\",\"step\":2}\n");
	/* Reopened again: plain append. */
	cr_assert(metrics_open(&m, path) == 0);
	cr_assert(metrics_event(&m, "again", NULL) == 0);
	metrics_close(&m);
	fp = fopen(path, "rb");
	n = fread(raw, 1, sizeof raw - 1, fp);
	raw[n] = '\0';
	fclose(fp);
	cr_assert(strstr(raw, "\"step\":2}\n{\"event\":\"again\"}\n"), "raw:\n%s", raw);
}

Test(metrics, flushed_after_each_line)
{
	struct metrics m;
	char raw[256];

	cr_assert(metrics_open(&m, path) == 0);
	cr_assert(metrics_event(&m, "one", "x", 'i', 1LL, NULL) == 0);
	/* Read while still open: the line must be on disk already. */
	FILE *fp = fopen(path, "rb");
	size_t n = fread(raw, 1, sizeof raw - 1, fp);
	raw[n] = '\0';
	fclose(fp);
	cr_assert_str_eq(raw, "{\"event\":\"one\",\"x\":1}\n");
	metrics_close(&m);
}

Test(metrics, disabled_and_errors)
{
	struct metrics m;
	char bad[320];

	cr_assert(metrics_open(&m, NULL) == 0);
	cr_assert(metrics_event(&m, "x", "a", 'i', 1LL, NULL) == 0);
	metrics_close(&m);
	cr_assert(access(path, F_OK) != 0, "disabled metrics created a file");

	snprintf(bad, sizeof bad, "%s/no/such/dir.jsonl", dir);
	cr_assert_eq(metrics_open(&m, bad), CORE_EIO);
	cr_assert_str_eq(err_file(), bad);

	cr_assert(metrics_open(&m, path) == 0);
	cr_assert_eq(metrics_event(&m, "x", "a", 'q', 1LL, NULL), CORE_EUSAGE);
	metrics_close(&m);
}

/* A full disk, played by a file-size limit: a line that does not fit is not written at all
 * (the bytes that fit are cut off again), the error says why, and later lines that fit are
 * whole lines after the last whole line. */
Test(metrics, a_line_that_does_not_fit_leaves_nothing)
{
	struct metrics m;
	struct rlimit rl;
	char raw[4096], big[600];
	json_t *l[8];

	memset(big, 'x', sizeof big - 1);
	big[sizeof big - 1] = '\0';
	cr_assert(metrics_open(&m, path) == 0, "%s", err_detail());
	cr_assert(metrics_event(&m, "first", "step", 'i', 1LL, NULL) == 0, "%s", err_detail());
	signal(SIGXFSZ, SIG_IGN); /* a write past the limit fails with EFBIG instead */
	cr_assert(getrlimit(RLIMIT_FSIZE, &rl) == 0);
	rl.rlim_cur = 512;
	cr_assert(setrlimit(RLIMIT_FSIZE, &rl) == 0, "setrlimit: %s", strerror(errno));
	int rc = metrics_event(&m, "big", "text", 's', big, NULL);
	cr_assert_eq(rc, CORE_EIO, "an event past the limit returned %d", rc);
	cr_assert_str_eq(err_file(), path);
	cr_assert(strstr(err_detail(), "cannot write: file too large"), "detail '%s'",
		  err_detail());
	cr_assert(metrics_event(&m, "after", "step", 'i', 2LL, NULL) == 0, "%s", err_detail());
	metrics_close(&m);

	int n = load_lines(l, 8, raw, sizeof raw);
	cr_assert_eq(n, 2, "%d lines in:\n%s", n, raw);
	cr_assert_str_eq(raw, "{\"event\":\"first\",\"step\":1}\n"
			      "{\"event\":\"after\",\"step\":2}\n");
	for (int i = 0; i < n; i++)
		json_decref(l[i]);
}
