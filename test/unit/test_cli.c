/* test_cli.c - checked number parsing refuses what strtol and strtod would let through
 * (white space around the number), naming the option and quoting the value on one line; the
 * stderr reports are one line whatever they quote. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "common/err.h"
#include "common/banned.h"

TestSuite(cli, .timeout = 10);

Test(cli, numbers_with_white_space_are_refused)
{
	static const char *const bad[] = {" 5", "\t5", "\n5", "5 ", "5\n", " 5 ", "", " ", "5x",
					  "--5"};
	long l = -1;
	double d = -1.0;

	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		cr_assert_eq(cli_parse_long("--tokens", bad[i], 0, 100, &l), CORE_EUSAGE,
			     "'%s' taken as an integer", bad[i]);
		cr_assert_null(strchr(err_detail(), '\n'));
		cr_assert(strstr(err_detail(), "option '--tokens': '"), "%s", err_detail());
		cr_assert_eq(cli_parse_double("--capacity", bad[i], -100, 100, &d), CORE_EUSAGE,
			     "'%s' taken as a number", bad[i]);
		cr_assert_null(strchr(err_detail(), '\n'));
	}
	cr_assert_eq(l, -1);
	cr_assert_eq(d, -1.0);
	cli_parse_long("-u", " 5", 0, 100, &l);
	cr_assert_str_eq(err_detail(), "option '-u': ' 5' is not an integer");
	cli_parse_double("-c", "\n5", 0, 100, &d);
	cr_assert_str_eq(err_detail(), "option '-c': '\\n5' is not a number");
}

Test(cli, good_numbers_parse)
{
	long l;
	double d;

	cr_assert_eq(cli_parse_long("-n", "42", 0, 100, &l), 0);
	cr_assert_eq(l, 42);
	cr_assert_eq(cli_parse_long("-n", "-7", -10, 100, &l), 0);
	cr_assert_eq(l, -7);
	cr_assert_eq(cli_parse_double("-c", "1.5e-1", 0, 1, &d), 0);
	cr_assert_float_eq(d, 0.15, 1e-12);
	cr_assert_eq(cli_parse_long("-n", "101", 0, 100, &l), CORE_EUSAGE);
	cr_assert_str_eq(err_detail(), "option '-n': 101 is outside [0, 100]");
}

Test(cli, reports_are_one_line, .init = cr_redirect_stderr)
{
	cr_assert_eq(cli_usage_error("prog", "unexpected argument '%s'", "a\nb"), 2);
	err_set(CORE_ECONFIG, "c\n.yaml", "key '%s'", "x\ny");
	cr_assert_eq(cli_report("prog", CORE_ECONFIG), 2);
	fflush(stderr);
	cr_assert_stderr_eq_str("prog: unexpected argument 'a\\nb'\n"
				"prog: 'c\\n.yaml': key 'x\\ny'\n");
}
