/* opt.h - a program's options declared once: each entry of a table gives getopt_long its
 * long option (and short letter) and --help its line, so the parser, the help text and the
 * man page test (t-man-options.sh) cannot drift apart. git's parse-options is the model; the
 * parsing itself stays getopt_long's, so the command lines accepted are those of before.
 *
 *	static const struct cli_opt opts[] = {
 *		{"model", 'm', 'm', CLI_ARG, "FILE", "the checkpoint (required)"},
 *		{"top-k", 'K', 0, CLI_ARG, "K", "draw among the K most likely tokens only\n"
 *		 "(default 0: all)"},
 *		{"no-cache", 'N', 0, CLI_FLAG, NULL, "a full forward for every token"},
 *		CLI_OPT_END,
 *	};
 *	struct cli_parser p;
 *	cli_parser_init(&p, "dpc-route", "sample", (const struct cli_opt *const[]){opts, NULL});
 *	while ((c = cli_next(&p, argc, argv)) != -1) switch (c) { ... case CLI_BAD: return 2; }
 *
 * Several tables make one parser (a program's common options, then a subcommand's), listed
 * in --help in their order.
 */
#ifndef CORE_CLI_OPT_H
#define CORE_CLI_OPT_H

#include <getopt.h>
#include <stdio.h>

enum { CLI_FLAG = no_argument, CLI_ARG = required_argument, CLI_OPTARG = optional_argument };

struct cli_opt {
	const char *name;  /* the long option, without "--" */
	int key;           /* what cli_next returns for it (any value but -1 and CLI_BAD) */
	char letter;       /* the short option, or 0 for none */
	int arg;           /* CLI_FLAG, CLI_ARG or CLI_OPTARG (given as --name=VALUE) */
	const char *meta;  /* the value's name in --help ("FILE"), NULL for a flag */
	const char *help;  /* the --help text, lines separated by '\n'; NULL: an alias, accepted
			    * but not listed (say so in the program's own text) */
};
#define CLI_OPT_END { NULL, 0, 0, 0, NULL, NULL }

#define CLI_MAX_OPTS 96
#define CLI_BAD (-2)     /* cli_next: an option rejected and reported; exit status 2 */

struct cli_parser {
	const char *prog, *cmd;             /* for error lines: "dpc-route", "sample" or NULL */
	const struct cli_opt *const *tables; /* NULL-terminated */
	struct option lo[CLI_MAX_OPTS + 1];
	char so[3 * CLI_MAX_OPTS + 2];
};

/* Build getopt_long's tables from tables (NULL-terminated list of CLI_OPT_END-terminated
 * tables) and reset getopt (optind = 1, opterr = 0). CORE_EUSAGE when there are more than
 * CLI_MAX_OPTS options, a name or letter declared twice, or a letter whose key is another
 * (aliases share a key; a reserved key: -1, CLI_BAD, ? and :): a program's own error,
 * which its test catches. */
int cli_parser_init(struct cli_parser *p, const char *prog, const char *cmd,
		    const struct cli_opt *const *tables);
/* The key of the next option (its value in optarg), -1 after the last; CLI_BAD once an
 * unknown option, a missing value or a value given to a flag has been reported on stderr
 * (cli_bad_option's line, naming "prog cmd --help"). */
int cli_next(struct cli_parser *p, int argc, char **argv);
/* The options of tables as --help lists them, one entry per line or more:
 *   "  -m, --model FILE      the checkpoint"  (text from column 24, continuation lines
 *   "      --top-k K         ..."              indented to it; a longer left part gets
 *                                              two spaces) */
void cli_print_opts(FILE *fp, const struct cli_opt *const *tables);
/* cli_print_opts, where says (CLI_OPT_END-terminated, only names and help read) has an
 * entry of the same name: its help instead, NULL to leave the option out. What an option
 * shared by several commands does in one of them. */
void cli_print_opts_saying(FILE *fp, const struct cli_opt *const *tables,
			   const struct cli_opt *says);

/* A program of subcommands (dpc-shard, dpc-outer, dpc-route): its commands in --help order. */
struct cli_command {
	const char *name;
	const char *summary; /* one line of --help */
	int (*run)(int argc, char **argv); /* argv[0] is the command's name; the exit status */
};

/* The program's --help: usage lines, "commands:" and each command's summary (the list
 * scripts/dpc-completion.bash and t-man-options.sh read), then tail. */
void cli_print_commands(FILE *fp, const char *prog, const struct cli_command *cmds, int n,
			const char *tail);
/* main of such a program: -h/--help prints cli_print_commands on stdout, -V/--version
 * "prog version"; a command runs with argv from its name on; no command, an option, or an
 * unknown command is one line on stderr and 2 (the nearest command suggested). */
int cli_dispatch(const char *prog, const char *version, const struct cli_command *cmds, int n,
		 const char *tail, int argc, char **argv);

#endif
