/* moe-bench.c - run and time one Mixture-of-Experts layer on the CPU; see man/moe-bench.1.
 *
 * Thin: parse options, build a layer with libcore (lib/moe.h), time it, print a table on
 * stderr and one JSON object per measured formulation on stdout. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "err.h"
#include "moe.h"
#include "banned.h"

static const char *prog = "moe-bench";

static void usage(FILE *f)
{
	fprintf(f,
"Usage: moe-bench [OPTION]...\n"
"Run and time one Mixture-of-Experts layer (forward and backward) on the CPU and print\n"
"a table on stderr and one JSON object per measured run on stdout.\n"
"\n"
"Shape:\n"
"  -T, --tokens=N           tokens per step T (default 4096)\n"
"  -M, --model-dim=N        model dimension M (default 1024)\n"
"  -H, --hidden-dim=N       expert hidden dimension H (default 4096)\n"
"  -E, --experts=N          number of experts E, >= 1 (default 16)\n"
"  -k, --top-k=N            experts per token, 1..E (default 2)\n"
"Routing:\n"
"  -c, --capacity=X         capacity setting: X > 0 fixed factor, C = ceil(k*T*X/E);\n"
"                           0: smallest C that drops nothing; X < 0: that, capped at\n"
"                           ceil(k*T*|X|/E) (default 1.0)\n"
"      --capacity-align=N   round C up to a multiple of N (default 1)\n"
"      --bpr                batch-prioritized routing (Tutel default: off)\n"
"      --no-bpr             route tokens in their order (default)\n"
"      --gate-noise=S       add S/E * N(0,1) to the gate logits (default 0)\n"
"      --aux-loss=NAME      gshard (default) or load-importance (needs --gate-noise)\n"
"      --activation=NAME    expert activation: relu (default) or gelu\n"
"      --trace=FILE         capacity settings, one per line, one per step, replayed\n"
"                           cyclically ('#' comments and blank lines ignored)\n"
"Measurement:\n"
"      --forward-only       time the forward pass only\n"
"      --only=PART          layer (default: the whole layer) or encode-decode (the\n"
"                           encode and decode kernels alone, next to a plain copy of\n"
"                           the same bytes)\n"
"      --baseline=KIND      sparse (default): the sparse layer alone; dense: also run\n"
"                           the dense GShard formulation on the same inputs\n"
"      --dense-tokens=N     run the dense baseline with N tokens instead of T (its\n"
"                           [T,E,C] tensors grow as T^2; the JSON says so)\n"
"      --dry-run            print the memory each formulation would need and exit\n"
"  -n, --iterations=N       timed steps (default 10)\n"
"  -w, --warmup=N           untimed steps first (default 2)\n"
"  -s, --seed=N             seed for parameters, inputs and gate noise (default 1)\n"
"  -t, --threads=N          OpenMP and BLAS threads (default: OMP_NUM_THREADS or all)\n"
"  -h, --help               print this help and exit\n"
"  -V, --version            print the version and exit\n"
"\n"
"Exit status: 0 success, 1 runtime failure, 2 usage error (inconsistent sizes,\n"
"k > E, E < 1, malformed trace file).\n");
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "tokens", required_argument, NULL, 'T' },
		{ "model-dim", required_argument, NULL, 'M' },
		{ "hidden-dim", required_argument, NULL, 'H' },
		{ "experts", required_argument, NULL, 'E' },
		{ "top-k", required_argument, NULL, 'k' },
		{ "capacity", required_argument, NULL, 'c' },
		{ "capacity-align", required_argument, NULL, 1001 },
		{ "bpr", no_argument, NULL, 1002 },
		{ "no-bpr", no_argument, NULL, 1003 },
		{ "gate-noise", required_argument, NULL, 1004 },
		{ "aux-loss", required_argument, NULL, 1005 },
		{ "activation", required_argument, NULL, 1006 },
		{ "trace", required_argument, NULL, 1007 },
		{ "forward-only", no_argument, NULL, 1008 },
		{ "only", required_argument, NULL, 1009 },
		{ "baseline", required_argument, NULL, 1010 },
		{ "dense-tokens", required_argument, NULL, 1011 },
		{ "dry-run", no_argument, NULL, 1012 },
		{ "iterations", required_argument, NULL, 'n' },
		{ "warmup", required_argument, NULL, 'w' },
		{ "seed", required_argument, NULL, 's' },
		{ "threads", required_argument, NULL, 't' },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'V' },
		{ NULL, 0, NULL, 0 }
	};
	int c;

	while ((c = getopt_long(argc, argv, "T:M:H:E:k:c:n:w:s:t:hV", opts, NULL)) != -1) {
		switch (c) {
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			printf("moe-bench %s\n", CORE_VERSION);
			return 0;
		case '?':
			return cli_usage_error(prog, "try 'moe-bench --help'");
		default:
			break;
		}
	}
	return cli_usage_error(prog, "not implemented yet");
}
