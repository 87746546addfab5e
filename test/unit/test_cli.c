/* test_cli.c - checked number parsing refuses what strtol and strtod would let through
 * (white space around the number), naming the option and quoting the value on one line; the
 * stderr reports are one line whatever they quote. */
#include <criterion/criterion.h>
#include <criterion/redirect.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/opt.h"
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

/* ---- options declared once (cli/opt.h) ----------------------------------------------------- */

static const struct cli_opt common_opts[] = {
	{"output", 'o', 'o', CLI_ARG, "FILE", "where the result goes"},
	{"quiet", 'q', 'q', CLI_FLAG, NULL, "no progress on stderr"},
	CLI_OPT_END,
};
static const struct cli_opt sub_opts[] = {
	{"top-k", 'K', 0, CLI_ARG, "K", "draw among the K most likely tokens only\n"
	 "(default 0: all)"},
	{"wait", 'w', 'w', CLI_OPTARG, "S", "wait for the inputs, up to S seconds"},
	{"window-router", 'W', 0, CLI_ARG, "FILE", "a window router"},
	{"num-tokens", 'K', 0, CLI_ARG, "N", NULL}, /* an alias of --top-k, not listed */
	CLI_OPT_END,
};

/* Parse argv (NULL-terminated) with both tables into keys / values (at most 16). */
static int parse(char **argv, int *keys, const char **vals)
{
	struct cli_parser p;
	int argc = 0, n = 0, c;
	while (argv[argc])
		argc++;
	cr_assert_eq(cli_parser_init(&p, "prog", "sub",
				     (const struct cli_opt *const[]){common_opts, sub_opts, NULL}),
		     0, "%s", err_detail());
	while ((c = cli_next(&p, argc, argv)) != -1 && n < 16) {
		keys[n] = c;
		vals[n++] = optarg;
		if (c == CLI_BAD)
			break;
	}
	return n;
}

Test(cli, options_from_a_table_parse_as_getopt_long)
{
	char *argv[] = {"prog", "-qo", "out.bin", "--top-k=5", "--num-tokens", "7", "--wait",
			"-w3", "--window", "w.bin", "--output=o2", "rest", NULL};
	int keys[16];
	const char *vals[16];
	int n = parse(argv, keys, vals);
	const int want_k[] = {'q', 'o', 'K', 'K', 'w', 'w', 'W', 'o'};
	const char *want_v[] = {NULL, "out.bin", "5", "7", NULL, "3", "w.bin", "o2"};
	cr_assert_eq(n, 8);
	for (int i = 0; i < n; i++) {
		cr_expect_eq(keys[i], want_k[i], "option %d: key %d, want %d", i, keys[i], want_k[i]);
		if (want_v[i])
			cr_expect_str_eq(vals[i], want_v[i], "option %d", i);
		else
			cr_expect_null(vals[i], "option %d: '%s'", i, vals[i]);
	}
	cr_expect_str_eq(argv[optind], "rest", "getopt_long moves the operand last");
}

Test(cli, options_rejected_as_before, .init = cr_redirect_stderr)
{
	int keys[16];
	const char *vals[16];
	char *a1[] = {"prog", "--top-kk=3", NULL}, *a2[] = {"prog", "-o", NULL},
	     *a3[] = {"prog", "--quiet=1", NULL}, *a4[] = {"prog", "-x", NULL};
	cr_assert_eq(keys[parse(a1, keys, vals) - 1], CLI_BAD);
	cr_assert_eq(keys[parse(a2, keys, vals) - 1], CLI_BAD);
	cr_assert_eq(keys[parse(a3, keys, vals) - 1], CLI_BAD);
	cr_assert_eq(keys[parse(a4, keys, vals) - 1], CLI_BAD);
	fflush(stderr);
	cr_assert_stderr_eq_str(
		"prog: unknown option '--top-kk=3' (did you mean '--top-k'? see prog sub --help)\n"
		"prog: option '-o' requires an argument (see prog sub --help)\n"
		"prog: option '--quiet' takes no argument (see prog sub --help)\n"
		"prog: unknown option '-x' (see prog sub --help)\n");
}

Test(cli, help_lines_from_the_table)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *fp = open_memstream(&buf, &len);
	cr_assert(fp);
	cli_print_opts(fp, (const struct cli_opt *const[]){common_opts, sub_opts, NULL});
	fclose(fp);
	/* by hand: the text from column 24, a longer left part followed by two spaces */
	cr_expect_str_eq(buf,
			 "  -o, --output FILE     where the result goes\n"
			 "  -q, --quiet           no progress on stderr\n"
			 "      --top-k K         draw among the K most likely tokens only\n"
			 "                        (default 0: all)\n"
			 "  -w, --wait[=S]        wait for the inputs, up to S seconds\n"
			 "      --window-router FILE  a window router\n");
	free(buf);
}

Test(cli, help_lines_saying_what_one_command_does)
{
	static const struct cli_opt says[] = {
		{.name = "quiet"}, /* left out */
		{.name = "top-k", .help = "here: the K best paths"},
		CLI_OPT_END,
	};
	char *buf = NULL;
	size_t len = 0;
	FILE *fp = open_memstream(&buf, &len);
	cr_assert(fp);
	cli_print_opts_saying(fp, (const struct cli_opt *const[]){common_opts, sub_opts, NULL},
			      says);
	fclose(fp);
	cr_expect_str_eq(buf,
			 "  -o, --output FILE     where the result goes\n"
			 "      --top-k K         here: the K best paths\n"
			 "  -w, --wait[=S]        wait for the inputs, up to S seconds\n"
			 "      --window-router FILE  a window router\n");
	free(buf);
}

Test(cli, a_table_declaring_an_option_twice_is_refused)
{
	static const struct cli_opt twice[] = {
		{"quiet", 'Q', 0, CLI_FLAG, NULL, "again"}, CLI_OPT_END,
	};
	static const struct cli_opt letter[] = {
		{"query", 'q', 'q', CLI_FLAG, NULL, "-q again"}, CLI_OPT_END,
	};
	static const struct cli_opt mismatch[] = {
		{"xray", 'y', 'x', CLI_FLAG, NULL, "-x returning y"}, CLI_OPT_END,
	};
	static const struct cli_opt reserved[] = {
		{"what", '?', 0, CLI_FLAG, NULL, "a reserved key"}, CLI_OPT_END,
	};
	struct cli_parser p;
	cr_expect_eq(cli_parser_init(&p, "prog", NULL,
				     (const struct cli_opt *const[]){common_opts, twice, NULL}),
		     CORE_EUSAGE);
	cr_expect(strstr(err_detail(), "--quiet declared twice"), "%s", err_detail());
	cr_expect_eq(cli_parser_init(&p, "prog", NULL,
				     (const struct cli_opt *const[]){common_opts, letter, NULL}),
		     CORE_EUSAGE);
	cr_expect(strstr(err_detail(), "-q declared twice"), "%s", err_detail());
	cr_expect_eq(cli_parser_init(&p, "prog", NULL, (const struct cli_opt *const[]){mismatch, NULL}),
		     CORE_EUSAGE);
	cr_expect_eq(cli_parser_init(&p, "prog", NULL, (const struct cli_opt *const[]){reserved, NULL}),
		     CORE_EUSAGE);
}

static int ran_argc;
static const char *ran_argv0;
static int run_split(int argc, char **argv)
{
	ran_argc = argc;
	ran_argv0 = argv[0];
	return 7;
}

static const struct cli_command cmds[] = {
	{"split", "divide a token file", run_split},
	{"cat", "decode a token file", run_split},
};

Test(cli, dispatch_runs_a_command_and_refuses_the_rest, .init = cr_redirect_stderr)
{
	char *ok[] = {"prog", "split", "-x", "in.tok", NULL}, *none[] = {"prog", NULL},
	     *typo[] = {"prog", "spilt", NULL}, *far[] = {"prog", "frobnicate", NULL},
	     *opt[] = {"prog", "--frob", NULL};
	cr_assert_eq(cli_dispatch("prog", "1.0", cmds, 2, "tail\n", 4, ok), 7);
	cr_expect_eq(ran_argc, 3);
	cr_expect_str_eq(ran_argv0, "split");
	cr_expect_eq(cli_dispatch("prog", "1.0", cmds, 2, "tail\n", 1, none), 2);
	cr_expect_eq(cli_dispatch("prog", "1.0", cmds, 2, "tail\n", 2, typo), 2);
	cr_expect_eq(cli_dispatch("prog", "1.0", cmds, 2, "tail\n", 2, far), 2);
	cr_expect_eq(cli_dispatch("prog", "1.0", cmds, 2, "tail\n", 2, opt), 2);
	fflush(stderr);
	cr_assert_stderr_eq_str("prog: missing command (see prog --help)\n"
				"prog: unknown command 'spilt' (did you mean 'split'? see prog --help)\n"
				"prog: unknown command 'frobnicate' (see prog --help)\n"
				"prog: unknown option '--frob' (see prog --help)\n");
}

Test(cli, dispatch_help_lists_the_commands)
{
	char *buf = NULL;
	size_t len = 0;
	FILE *fp = open_memstream(&buf, &len);
	cr_assert(fp);
	cli_print_commands(fp, "prog", cmds, 2, "See prog(1).\n");
	fclose(fp);
	cr_expect_str_eq(buf, "usage: prog COMMAND [options] ARGS...\n"
			      "       prog -h | --help | -V | --version\n\n"
			      "commands:\n"
			      "  split     divide a token file\n"
			      "  cat       decode a token file\n\n"
			      "See prog(1).\n");
	free(buf);
}
