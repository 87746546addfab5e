/* cli.h - pieces every program's option parsing shares: checked number parsing, the
 * one-line error report and the JSON result. The library never prints; these are the
 * exception programs call: the reports write only to stderr, cli_print_json to stdout. */
#ifndef CORE_CLI_H
#define CORE_CLI_H

#include <stddef.h>
#include <stdint.h>

struct json_t;
struct option;

/* Parse a whole string as a number in [lo, hi], without white space before or after it;
 * CORE_EUSAGE naming opt and quoting s otherwise. */
int cli_parse_long(const char *opt, const char *s, long lo, long hi, long *out);
int cli_parse_double(const char *opt, const char *s, double lo, double hi, double *out);
/* *out = the precision named s ("fp32", "tf32", "bf16": backend.h), or CORE_EUSAGE naming
 * opt and the choices. */
int cli_parse_precision(const char *opt, const char *s, int *out);
/* Print "prog: <message of code>" on stderr; returns err_exit_status(code). */
int cli_report(const char *prog, int code);
/* One stderr line for an option getopt_long rejected, and 2. Call with opterr = 0 and an
 * optstring starting with ':'; c is getopt's return value ('?' or ':'); longopts is the
 * table given to getopt_long; help names what to run for help ("dpc-shard prepare"). */
int cli_bad_option(const char *prog, const char *help, const struct option *longopts,
		   char **argv, int c);
/* Print j on stdout as json_dumpf() flags say, numbers always in the one format of
 * common/jsonfmt.h (any precision in flags is replaced), then a newline, and flush; takes
 * the reference (j may be NULL: a failed json_pack, CORE_ENOMEM). CORE_EIO naming
 * "<stdout>" when the write or the flush fails. */
int cli_print_json(struct json_t *j, size_t flags);
/* Print "prog: <printf message>" on stderr, its control characters escaped as err_escape
 * does (one line whatever it quotes), and return 2 (usage error). */
int cli_usage_error(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* mkdir -p of the directory part of path (nothing when it has none): an output may name a
 * directory that does not exist yet. CORE_EIO naming the directory on failure. */
int cli_make_parents(const char *path);

#endif
