/* opt.c - options declared once (opt.h). */
#include <string.h>

#include "cli/cli.h"
#include "cli/opt.h"
#include "common/editdist.h"
#include "common/err.h"

#include "common/banned.h"

#define HELP_COLUMN 24

int cli_parser_init(struct cli_parser *p, const char *prog, const char *cmd,
		    const struct cli_opt *const *tables)
{
	int n = 0;
	size_t s = 0;

	memset(p, 0, sizeof *p);
	p->prog = prog;
	p->cmd = cmd;
	p->tables = tables;
	p->so[s++] = ':'; /* a missing value returns ':', not '?' */
	for (int t = 0; tables[t]; t++)
		for (const struct cli_opt *o = tables[t]; o->name; o++) {
			if (n == CLI_MAX_OPTS)
				return err_set(CORE_EUSAGE, NULL, "%s: more than %d options", prog,
					       CLI_MAX_OPTS);
			if (o->key == -1 || o->key == CLI_BAD || o->key == '?' || o->key == ':')
				return err_set(CORE_EUSAGE, NULL, "%s: option --%s has the reserved "
					       "key %d", prog, o->name, o->key);
			for (int i = 0; i < n; i++)
				if (!strcmp(p->lo[i].name, o->name))
					return err_set(CORE_EUSAGE, NULL, "%s: option --%s declared "
						       "twice", prog, o->name);
			if (o->letter && memchr(p->so, o->letter, s))
				return err_set(CORE_EUSAGE, NULL, "%s: option -%c declared twice",
					       prog, o->letter);
			if (o->letter && o->letter != o->key)
				return err_set(CORE_EUSAGE, NULL, "%s: option -%c returns another key "
					       "than its letter", prog, o->letter);
			p->lo[n++] = (struct option){o->name, o->arg, NULL, o->key};
			if (o->letter) {
				p->so[s++] = o->letter;
				if (o->arg != CLI_FLAG)
					p->so[s++] = ':';
				if (o->arg == CLI_OPTARG)
					p->so[s++] = ':';
			}
		}
	p->lo[n] = (struct option){NULL, 0, NULL, 0};
	p->so[s] = '\0';
	optind = 1;
	opterr = 0;
	return 0;
}

int cli_next(struct cli_parser *p, int argc, char **argv)
{
	int c = getopt_long(argc, argv, p->so, p->lo, NULL);
	if (c != '?' && c != ':')
		return c;
	char help[160];
	snprintf(help, sizeof help, "%s%s%s", p->prog, p->cmd ? " " : "", p->cmd ? p->cmd : "");
	cli_bad_option(p->prog, help, p->lo, argv, c);
	return CLI_BAD;
}

/* One entry of --help, with help as its text. */
static void print_opt(FILE *fp, const struct cli_opt *o, const char *help)
{
	char left[128];
	int n = o->letter ? snprintf(left, sizeof left, "  -%c, --%s", o->letter, o->name)
			  : snprintf(left, sizeof left, "      --%s", o->name);

	if (o->meta && n > 0 && (size_t)n < sizeof left)
		snprintf(left + n, sizeof left - (size_t)n, o->arg == CLI_OPTARG ? "[=%s]" : " %s",
			 o->meta);
	int w = (int)strlen(left);
	fprintf(fp, "%s%*s", left, w <= HELP_COLUMN - 2 ? HELP_COLUMN - w : 2, "");
	for (;;) {
		size_t k = strcspn(help, "\n");
		fprintf(fp, "%.*s\n", (int)k, help);
		if (!help[k])
			break;
		help += k + 1;
		fprintf(fp, "%*s", HELP_COLUMN, "");
	}
}

void cli_print_opts_saying(FILE *fp, const struct cli_opt *const *tables,
			   const struct cli_opt *says)
{
	for (int t = 0; tables[t]; t++)
		for (const struct cli_opt *o = tables[t]; o->name; o++) {
			const char *help = o->help;
			for (const struct cli_opt *s = says; s && s->name; s++)
				if (!strcmp(s->name, o->name))
					help = s->help;
			if (help)
				print_opt(fp, o, help);
		}
}

void cli_print_opts(FILE *fp, const struct cli_opt *const *tables)
{
	cli_print_opts_saying(fp, tables, NULL);
}

void cli_print_commands(FILE *fp, const char *prog, const struct cli_command *cmds, int n,
			const char *tail)
{
	fprintf(fp, "usage: %s COMMAND [options] ARGS...\n"
		    "       %s -h | --help | -V | --version\n\ncommands:\n", prog, prog);
	for (int i = 0; i < n; i++)
		fprintf(fp, "  %-9s %s\n", cmds[i].name, cmds[i].summary);
	fprintf(fp, "\n%s", tail);
}

int cli_dispatch(const char *prog, const char *version, const struct cli_command *cmds, int n,
		 const char *tail, int argc, char **argv)
{
	const char *cmd = argc > 1 ? argv[1] : NULL;

	opterr = 0;
	if (!cmd)
		return cli_usage_error(prog, "missing command (see %s --help)", prog);
	if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help")) {
		cli_print_commands(stdout, prog, cmds, n, tail);
		return fflush(stdout) == 0 ? 0 : 1;
	}
	if (!strcmp(cmd, "-V") || !strcmp(cmd, "--version")) {
		printf("%s %s\n", prog, version);
		return fflush(stdout) == 0 ? 0 : 1;
	}
	if (cmd[0] == '-')
		return cli_usage_error(prog, "unknown option '%s' (see %s --help)", cmd, prog);
	const char *near = NULL;
	size_t nd = 3;
	for (int i = 0; i < n; i++) {
		if (!strcmp(cmd, cmds[i].name))
			return cmds[i].run(argc - 1, argv + 1);
		size_t d = edit_distance(cmd, cmds[i].name);
		if (d < nd)
			nd = d, near = cmds[i].name;
	}
	if (near)
		return cli_usage_error(prog, "unknown command '%s' (did you mean '%s'? see %s "
				       "--help)", cmd, near, prog);
	return cli_usage_error(prog, "unknown command '%s' (see %s --help)", cmd, prog);
}
