/* test_err.c - the error contract: whatever a detail or a file name quotes, err_format gives
 * one line (control characters escaped, long details truncated, never inside an escape), and
 * re-recording a saved detail changes nothing. */
#include <criterion/criterion.h>
#include <string.h>

#include "common/err.h"
#include "common/banned.h"

TestSuite(err, .timeout = 10);

Test(err, newline_in_detail_and_file_is_escaped)
{
	char msg[1200];

	err_set(CORE_ECONFIG, "a\nb.yaml", "line 2: train.lr: '%s' is not a number", "1\nx");
	err_format(msg, sizeof msg, CORE_ECONFIG);
	cr_assert_str_eq(msg, "'a\\nb.yaml': line 2: train.lr: '1\\nx' is not a number");
	cr_assert_str_eq(err_file(), "a\\nb.yaml");
}

Test(err, every_control_character_is_escaped)
{
	char msg[1200], want[64];

	err_set(CORE_EFORMAT, NULL, "%s", "t\tr\rz\x1b[1m\x7f\\n");
	err_format(msg, sizeof msg, CORE_EFORMAT);
	cr_assert_str_eq(msg, "t\\tr\\x0dz\\x1b[1m\\x7f\\n");
	for (int c = 1; c < 256; c++) {
		want[0] = (char)c;
		want[1] = '\0';
		err_set(CORE_EFORMAT, want, "%s", want);
		err_format(msg, sizeof msg, CORE_EFORMAT);
		for (const unsigned char *p = (const unsigned char *)msg; *p; p++)
			cr_assert(*p >= 0x20 && *p != 0x7f, "byte %#x leaves %#x in '%s'", c, *p,
				  msg);
	}
	/* UTF-8 stays as it is. */
	err_set(CORE_EFORMAT, NULL, "caf\xc3\xa9");
	cr_assert_str_eq(err_detail(), "caf\xc3\xa9");
}

Test(err, long_detail_is_truncated_on_one_line)
{
	char big[4000], msg[1200];

	for (size_t i = 0; i < sizeof big - 1; i++)
		big[i] = (i % 3 == 0) ? '\n' : 'a';
	big[sizeof big - 1] = '\0';
	err_set(CORE_EFORMAT, big, "value '%s'", big);
	err_format(msg, sizeof msg, CORE_EFORMAT);
	cr_assert_null(strchr(msg, '\n'));
	cr_assert(strlen(msg) > 400, "'%s' is too short", msg);
	/* Truncated between escapes, never inside one: no lone backslash at the end. */
	size_t n = strlen(err_detail()), bs = 0;
	while (bs < n && err_detail()[n - 1 - bs] == '\\')
		bs++;
	cr_assert_eq(bs % 2, 0, "detail ends inside an escape: '%s'", err_detail());
	err_format(msg, 40, CORE_EFORMAT);
	cr_assert_null(strchr(msg, '\n'));
	cr_assert_eq(strlen(msg), 39);
}

Test(err, re_recording_a_saved_detail_changes_nothing)
{
	char msg[1200];

	err_set(CORE_ECHECKSUM, "x\ny", "dtype '%s'", "F\n32");
	/* Its own buffers as arguments, as callers that forward an error do. */
	err_set(CORE_ECHECKSUM, err_file(), "%s", err_detail());
	err_format(msg, sizeof msg, CORE_ECHECKSUM);
	cr_assert_str_eq(msg, "'x\\ny': dtype 'F\\n32'");
}

Test(err, escape_truncates_to_the_buffer)
{
	char out[5];

	err_escape(out, sizeof out, "ab\ncd");
	cr_assert_str_eq(out, "ab\\n");
	err_escape(out, sizeof out, "abc\n");
	cr_assert_str_eq(out, "abc");
	err_escape(out, 1, "abc");
	cr_assert_str_eq(out, "");
}
