/* dpc-outer - DiPaCo's outer step per module, and the run directory around it: print a
 * topology, create a run, write its task graph, collect its metrics. See dpc-outer(1).
 * Thin: options here; the work is in lib/dipaco. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "cli/cli.h"
#include "cli/opt.h"
#include "common/err.h"
#include "common/progress.h"
#include "dipaco/module.h"
#include "dipaco/outer.h"
#include "dipaco/outertask.h"
#include "dipaco/plan.h"
#include "dipaco/rundir.h"
#include "dist/dist.h"
#include "common/jsonfmt.h"
#include "io/atomicio.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "common/banned.h"

static const char prog[] = "dpc-outer";

static int cmd_step(int argc, char **argv);
static int cmd_init(int argc, char **argv);
static int cmd_topology(int argc, char **argv);
static int cmd_makefile(int argc, char **argv);
static int cmd_tasks(int argc, char **argv);
static int cmd_metrics(int argc, char **argv);

static const struct cli_command commands[] = {
	{"step", "the outer step of phase T for some or all modules of a run", cmd_step},
	{"init", "create a run directory: config, phase-0 modules, Makefile", cmd_init},
	{"topology", "print a config's paths and modules, with parameter counts", cmd_topology},
	{"makefile", "write the run's task graph as RUNDIR/Makefile", cmd_makefile},
	{"tasks", "print the run's task graph, one task per line, in dependency order", cmd_tasks},
	{"metrics", "collect every phase's metrics into RUNDIR/metrics.jsonl", cmd_metrics},
};

#define NCOMMANDS ((int)(sizeof commands / sizeof commands[0]))
#define JSON_LINE (JSON_COMPACT | CORE_JSON_REAL)

/* Every command's last option. */
static const struct cli_opt help_opts[] = {
	{"help", 'h', 'h', CLI_FLAG, NULL, "show this help and exit"},
	CLI_OPT_END,
};

/* cli_parser_init for one command: 0, or the exit status after the report (a table
 * refused, the program's own error). */
static int parser_init(struct cli_parser *p, const char *cmd, const struct cli_opt *const *tables)
{
	int rc = cli_parser_init(p, prog, cmd, tables);

	return rc < 0 ? cli_report(prog, rc) : 0;
}

/* ---- topology ----------------------------------------------------------------------------- */

static const struct cli_opt topology_opts[] = {
	{"config", 'c', 'c', CLI_ARG, "FILE", "YAML config (see dpc-config(5); default: defaults)"},
	{"set", 's', 's', CLI_ARG, "SECTION.KEY=V", "override one config value (repeatable)"},
	{"json", 'j', 0, CLI_FLAG, NULL, "one JSON object instead of the table"},
	CLI_OPT_END,
};
static const struct cli_opt *const topology_tables[] = {topology_opts, help_opts, NULL};

static void topology_usage(FILE *fp)
{
	fprintf(fp,
		"usage: %s topology [-c CONFIG] [-s SECTION.KEY=V]... [--json]\n"
		"Print the paths and modules a config describes: which modules each path\n"
		"uses, and the parameters per module, per path and in total.\n\n"
		"options:\n", prog);
	cli_print_opts(fp, topology_tables);
}

static json_t *topology_json(const struct topology *t)
{
	json_t *mods = json_array(), *paths = json_array();

	for (int m = 0; m < t->nmodules; m++) {
		const struct topo_module *md = &t->modules[m];
		json_t *users = json_array();
		for (int k = 0; k < md->npaths; k++)
			json_array_append_new(users, json_integer(md->paths[k]));
		json_array_append_new(mods, json_pack("{s:s, s:s, s:i, s:I, s:o}", "name", md->name,
						      "level", t->levels[md->level].name, "index",
						      md->index, "params", (json_int_t)md->nparams,
						      "paths", users));
	}
	for (int p = 0; p < t->npaths; p++) {
		json_t *ms = json_array();
		for (int l = 0; l < t->nlevels; l++)
			json_array_append_new(ms, json_string(t->modules[topo_module_of(t, p, l)].name));
		json_array_append_new(paths, ms);
	}
	return json_pack("{s:i, s:i, s:i, s:I, s:I, s:o, s:o}", "levels", t->nlevels, "paths",
			 t->npaths, "modules", t->nmodules, "params_per_path",
			 (json_int_t)t->layout.nparams, "params_total",
			 (json_int_t)t->total_params, "module_list", mods, "path_modules", paths);
}

static int print_topology(const struct topology *t)
{
	printf("%d level%s, %d module%s, %d path%s\n\n", t->nlevels, t->nlevels == 1 ? "" : "s",
	       t->nmodules, t->nmodules == 1 ? "" : "s", t->npaths, t->npaths == 1 ? "" : "s");
	printf("%-20s %12s  %s\n", "module", "parameters", "used by paths");
	for (int m = 0; m < t->nmodules; m++) {
		const struct topo_module *md = &t->modules[m];
		printf("%-20s %12zu  ", md->name, md->nparams);
		for (int k = 0; k < md->npaths; k++) {
			if (k == 8 && md->npaths > 10) {
				printf(" ... (%d paths)", md->npaths);
				break;
			}
			printf("%s%d", k ? "," : "", md->paths[k]);
		}
		printf("\n");
	}
	printf("\n%-8s %s\n", "path", "modules");
	for (int p = 0; p < t->npaths; p++) {
		printf("%-8d", p);
		for (int l = 0; l < t->nlevels; l++)
			printf(" %s", t->modules[topo_module_of(t, p, l)].name);
		printf("\n");
	}
	printf("\nparameters: %zu per path, %zu in total (%.2fx a path)\n", t->layout.nparams,
	       t->total_params, (double)t->total_params / (double)t->layout.nparams);
	if (fflush(stdout) != 0)
		return cli_report(prog, err_errno(CORE_EIO, "<stdout>", "cannot write", errno));
	return 0;
}

static int cmd_topology(int argc, char **argv)
{
	const char *config = NULL, **sets = calloc((size_t)argc + 1, sizeof *sets);
	int nsets = 0, json = 0, c, rc;
	struct cli_parser p;
	struct run_config cfg;
	struct topology t;

	if (!sets)
		return cli_report(prog, err_set(CORE_ENOMEM, NULL, "out of memory"));
	if ((rc = parser_init(&p, "topology", topology_tables)) != 0) {
		free(sets);
		return rc;
	}
	while ((c = cli_next(&p, argc, argv)) != -1) {
		switch (c) {
		case 'c': config = optarg; break;
		case 's': sets[nsets++] = optarg; break;
		case 'j': json = 1; break;
		case 'h': topology_usage(stdout); free(sets); return 0;
		default: free(sets); return 2; /* CLI_BAD, reported */
		}
	}
	if (optind < argc) {
		free(sets);
		return cli_usage_error(prog, "topology: unexpected argument '%s'", argv[optind]);
	}
	rc = config_load_with(&cfg, config, sets, nsets);
	free(sets);
	if (!rc)
		rc = topo_build(&t, &cfg);
	if (rc)
		return cli_report(prog, rc);
	if (json)
		rc = cli_print_json(topology_json(&t), JSON_INDENT(2)) ? 1 : 0;
	else
		rc = print_topology(&t);
	topo_free(&t);
	return rc;
}

/* ---- init and makefile -------------------------------------------------------------------- */

/* The folder holding this program: the default BIN of the Makefile. */
static void self_dir(char *buf, size_t n)
{
	ssize_t k = readlink("/proc/self/exe", buf, n - 1);
	if (k <= 0) {
		snprintf(buf, n, ".");
		return;
	}
	buf[k] = '\0';
	char *slash = strrchr(buf, '/');
	if (slash)
		*slash = '\0';
}

static int write_makefile(const struct rundir *r, const char *bin)
{
	char path[RUNDIR_PATH_MAX], *text;

	/* The graph follows the draw of paths: its record first. */
	ERR_FORWARD(rundir_write_sample(r));
	ERR_FORWARD(rundir_file(r, "Makefile", path, sizeof path));
	ERR_FORWARD(plan_makefile(r, bin, &text));
	int rc = file_write_atomic(path, text, strlen(text));
	free(text);
	return rc;
}

static const struct cli_opt init_opts[] = {
	{"config", 'c', 'c', CLI_ARG, "FILE", "YAML config (see dpc-config(5))"},
	{"set", 's', 's', CLI_ARG, "SECTION.KEY=V", "override one config value (repeatable)"},
	CLI_OPT_END,
};
static const struct cli_opt init_from_opts[] = {
	{"from", 'F', 0, CLI_ARG, "CKPT", "every module starts from this model's tensors (a\n"
	 "dpc-train-path checkpoint of the config's shape: the\n"
	 "paper's pretrained start), outer momentum zero; the\n"
	 "paths' AdamW state and step start afresh"},
	{"moments", 'M', 0, CLI_FLAG, NULL,
	 "with --from: the paths of phase 1 also start from its\n"
	 "AdamW moments (bias correction counting on from its\n"
	 "step); the learning rate still follows the run's schedule"},
	CLI_OPT_END,
};
static const struct cli_opt init_bin_opts[] = {
	{"bin", 'b', 0, CLI_ARG, "DIR", "where the Makefile finds the programs (default: the\n"
	 "folder of this dpc-outer)"},
	CLI_OPT_END,
};
static const struct cli_opt *const init_tables[] = {
	init_opts, init_from_opts, init_bin_opts, help_opts, NULL,
};

static void init_usage(FILE *fp)
{
	fprintf(fp,
		"usage: %s init -c CONFIG [-s SECTION.KEY=V]... [--from CKPT [--moments]] "
		"RUNDIR\n"
		"Create the run directory RUNDIR: config.yaml, phase-0000/modules (the seeded\n"
		"initialisation, or --from's model, identical for every path) and the Makefile of\n"
		"the task graph. Running it again on the same config and source keeps what\n"
		"exists; another config or source is refused. The shards go to RUNDIR/shards\n"
		"(dpc-shard split ... RUNDIR/shards).\n\n"
		"options:\n", prog);
	cli_print_opts(fp, init_tables);
}

static int cmd_init(int argc, char **argv)
{
	const char *config = NULL, *from = NULL, **sets = calloc((size_t)argc + 1, sizeof *sets);
	char bin[RUNDIR_PATH_MAX];
	int nsets = 0, c, rc, written = 0, moments = 0;
	struct cli_parser p;
	struct run_config cfg;
	struct rundir r;

	if (!sets)
		return cli_report(prog, err_set(CORE_ENOMEM, NULL, "out of memory"));
	if ((rc = parser_init(&p, "init", init_tables)) != 0) {
		free(sets);
		return rc;
	}
	self_dir(bin, sizeof bin);
	while ((c = cli_next(&p, argc, argv)) != -1) {
		switch (c) {
		case 'c': config = optarg; break;
		case 's': sets[nsets++] = optarg; break;
		case 'b': snprintf(bin, sizeof bin, "%s", optarg); break;
		case 'F': from = optarg; break;
		case 'M': moments = 1; break;
		case 'h': init_usage(stdout); free(sets); return 0;
		default: free(sets); return 2; /* CLI_BAD, reported */
		}
	}
	if (argc - optind != 1 || !config) {
		free(sets);
		return cli_usage_error(prog, "init: expected -c CONFIG and one RUNDIR (see %s init "
				       "--help)", prog);
	}
	if (moments && !from) {
		free(sets);
		return cli_usage_error(prog, "init: --moments takes the AdamW moments of --from's "
				       "checkpoint: give --from CKPT");
	}
	const char *dir = argv[optind];
	rc = config_load_with(&cfg, config, sets, nsets);
	free(sets);
	if (!rc && config_inner_steps(&cfg) < 1)
		rc = err_set(CORE_ECONFIG, config, "the config gives 0 inner steps per phase "
			     "(dipaco.inner_steps, or train.steps / dipaco.phases)");
	struct module_init src = {.seed = cfg.train.seed, .from = from, .moments = moments};
	char label[MODULE_INIT_MAX];
	if (!rc)
		rc = module_init_label(&src, &cfg.model, label);
	if (!rc)
		rc = rundir_create(dir, &cfg);
	if (!rc)
		rc = rundir_open(&r, dir, 0);
	if (rc)
		return cli_report(prog, rc);
	rc = outertask_init(&r, &src, label, &written);
	char mpath[RUNDIR_PATH_MAX];
	if (!rc)
		rc = rundir_file(&r, RUNDIR_FORK_MOMENTS, mpath, sizeof mpath);
	if (!rc)
		rc = module_write_fork_moments(mpath, &src, label);
	if (!rc)
		rc = write_makefile(&r, bin);
	if (!rc)
		rc = cli_print_json(json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:I, s:I, s:i}",
					      "rundir", dir, "config_hash", r.config_hash, "init",
					      label, "paths",
					      r.topo.npaths, "modules", r.topo.nmodules,
					      "modules_written", written, "phases",
					      (json_int_t)r.cfg.dipaco.phases, "inner_steps",
					      (json_int_t)r.tau, "shards", r.have_shards),
				    JSON_LINE);
	rundir_close(&r);
	return rc ? cli_report(prog, rc) : 0;
}

static const struct cli_opt rundir_opts[] = {
	{"bin", 'b', 0, CLI_ARG, "DIR", "where the programs are (default: the folder of this\n"
	 "dpc-outer)"},
	CLI_OPT_END,
};
static const struct cli_opt *const rundir_tables[] = {rundir_opts, help_opts, NULL};

static int simple_rundir_command(int argc, char **argv, const char *name, const char *text,
				 int (*fn)(struct rundir *r, const char *bin))
{
	char bin[RUNDIR_PATH_MAX];
	struct cli_parser p;
	struct rundir r;
	int c, rc;

	if ((rc = parser_init(&p, name, rundir_tables)) != 0)
		return rc;
	self_dir(bin, sizeof bin);
	while ((c = cli_next(&p, argc, argv)) != -1) {
		switch (c) {
		case 'b': snprintf(bin, sizeof bin, "%s", optarg); break;
		case 'h':
			printf("usage: %s %s [--bin DIR] RUNDIR\n%s\n\noptions:\n", prog, name,
			       text);
			cli_print_opts(stdout, rundir_tables);
			return 0;
		default: return 2; /* CLI_BAD, reported */
		}
	}
	if (argc - optind != 1)
		return cli_usage_error(prog, "%s: expected one RUNDIR (see %s %s --help)", name,
				       prog, name);
	rc = rundir_open(&r, argv[optind], 0);
	if (!rc) {
		rc = fn(&r, bin);
		rundir_close(&r);
	}
	return rc ? cli_report(prog, rc) : 0;
}

static int do_makefile(struct rundir *r, const char *bin) { return write_makefile(r, bin); }

static int cmd_makefile(int argc, char **argv)
{
	return simple_rundir_command(argc, argv, "makefile",
				     "Write RUNDIR/Makefile, the task graph for make -C RUNDIR -j N.",
				     do_makefile);
}

static int do_tasks(struct rundir *r, const char *bin)
{
	char *text;

	(void)bin;
	ERR_FORWARD(rundir_write_sample(r));
	ERR_FORWARD(plan_tasks(r, &text));
	int bad = fputs(text, stdout) == EOF || fflush(stdout) != 0;
	free(text);
	return bad ? err_errno(CORE_EIO, "<stdout>", "cannot write", errno) : 0;
}

static int cmd_tasks(int argc, char **argv)
{
	return simple_rundir_command(argc, argv, "tasks",
				     "Print the task graph: 'train T P OUT DEPS...' and 'outer T "
				     "MODULE OUT DEPS...',\none task per line, each after the tasks "
				     "it depends on.", do_tasks);
}

/* ---- metrics ------------------------------------------------------------------------------ */

/* Append a whole small file to fp, if it exists. */
static int append_file(FILE *fp, const char *path, int *count)
{
	char *text;
	size_t len;
	int rc = file_read_all(path, 0, &text, &len);

	if (rc == CORE_ENOTFOUND)
		return 0;
	ERR_FORWARD(rc);
	fwrite(text, 1, len, fp);
	if (len && text[len - 1] != '\n')
		fputc('\n', fp);
	free(text);
	(*count)++;
	return 0;
}

/* Per phase: what its paths and its outer steps reported. */
struct phase_sum {
	int paths, modules, vals;
	double val_min, val_max, val_sum, train_sum, tps_sum, cos_sum, grad_sum;
	int coss, grads; /* grads: the modules stepped (not kept by path sampling) */
};

static double jnum(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	return json_is_number(v) ? json_number_value(v) : NAN;
}

static void tally(struct phase_sum *ps, long T, const char *text, size_t len)
{
	const char *p = text, *end = text + len;

	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
		json_t *o = json_loadb(p, n, 0, NULL);
		p += n + 1;
		if (!o)
			continue;
		const char *ev = json_string_value(json_object_get(o, "event"));
		long t = (long)jnum(o, "phase");
		if (ev && t >= 1 && t <= T) {
			struct phase_sum *s = &ps[t - 1];
			if (!strcmp(ev, "path")) {
				double v = jnum(o, "val_loss");
				s->paths++;
				s->train_sum += jnum(o, "train_loss");
				s->tps_sum += jnum(o, "tokens_per_s");
				if (isfinite(v)) {
					s->val_min = s->vals ? fmin(s->val_min, v) : v;
					s->val_max = s->vals ? fmax(s->val_max, v) : v;
					s->val_sum += v;
					s->vals++;
				}
			} else if (!strcmp(ev, "outer")) {
				double c = jnum(o, "mean_pairwise_cosine");
				s->modules++;
				/* a module no sampled path used was kept, not stepped: no gradient */
				if (json_array_size(json_object_get(o, "paths")) > 0) {
					s->grad_sum += jnum(o, "outer_grad_norm_rescaled");
					s->grads++;
				}
				if (isfinite(c)) {
					s->cos_sum += c;
					s->coss++;
				}
			}
		}
		json_decref(o);
	}
}

static void print_table(const struct rundir *r, const struct phase_sum *ps)
{
	printf("%5s %7s %9s %9s %9s %10s %11s %8s %10s %10s\n", "phase", "paths", "val min",
	       "val mean", "val max", "train mean", "tokens/s", "modules", "mean cos",
	       "mean |g|");
	for (long t = 1; t <= r->cfg.dipaco.phases; t++) {
		const struct phase_sum *s = &ps[t - 1];
		if (!s->paths && !s->modules)
			continue;
		/* of the paths the phase trains (dipaco.paths_per_phase) */
		printf("%5ld %3d/%-3d", t, s->paths, r->sample.N);
		if (s->vals)
			printf(" %9.4f %9.4f %9.4f", s->val_min, s->val_sum / s->vals, s->val_max);
		else
			printf(" %9s %9s %9s", "-", "-", "-");
		printf(" %10.4f %11.0f %4d/%-3d", s->paths ? s->train_sum / s->paths : NAN,
		       s->paths ? s->tps_sum / s->paths : NAN, s->modules, r->topo.nmodules);
		if (s->coss)
			printf(" %10.4f", s->cos_sum / s->coss);
		else
			printf(" %10s", "-");
		printf(" %10.4f\n", s->grads ? s->grad_sum / s->grads : NAN);
	}
}

static int do_metrics(struct rundir *r, int table)
{
	char path[RUNDIR_PATH_MAX], *text = NULL;
	size_t len = 0;
	int files = 0, rc = 0;
	FILE *fp = open_memstream(&text, &len);
	struct phase_sum *ps = calloc((size_t)r->cfg.dipaco.phases, sizeof *ps);

	if (!fp || !ps) {
		if (fp)
			fclose(fp);
		free(text);
		free(ps);
		return err_set(CORE_ENOMEM, NULL, "out of memory");
	}
	for (long t = 1; t <= r->cfg.dipaco.phases && !rc; t++) {
		for (int p = 0; p < r->topo.npaths && !rc; p++) {
			rc = rundir_path_ckpt(r, t, p, ".jsonl", path, sizeof path);
			if (!rc)
				rc = append_file(fp, path, &files);
		}
		for (int m = 0; m < r->topo.nmodules && !rc; m++) {
			rc = rundir_module(r, t, m, ".json", path, sizeof path);
			if (!rc)
				rc = append_file(fp, path, &files);
		}
	}
	if (fclose(fp) != 0 && !rc)
		rc = err_set(CORE_ENOMEM, NULL, "out of memory");
	if (!rc)
		rc = rundir_file(r, "metrics.jsonl", path, sizeof path);
	if (!rc) {
		rundir_clean_stale(path);
		rc = file_write_atomic(path, text, len);
	}
	if (!rc && table) {
		tally(ps, r->cfg.dipaco.phases, text, len);
		print_table(r, ps);
		if (fflush(stdout) != 0)
			rc = err_errno(CORE_EIO, "<stdout>", "cannot write", errno);
	} else if (!rc) {
		rc = cli_print_json(json_pack("{s:s, s:i, s:I}", "metrics", path, "files", files,
					      "bytes", (json_int_t)len), JSON_LINE);
	}
	free(text);
	free(ps);
	return rc;
}

static const struct cli_opt metrics_opts[] = {
	{"table", 'T', 0, CLI_FLAG, NULL, "the table instead of the JSON summary"},
	CLI_OPT_END,
};
static const struct cli_opt *const metrics_tables[] = {metrics_opts, help_opts, NULL};

static int cmd_metrics(int argc, char **argv)
{
	struct cli_parser p;
	struct rundir r;
	int c, rc, table = 0;

	if ((rc = parser_init(&p, "metrics", metrics_tables)) != 0)
		return rc;
	while ((c = cli_next(&p, argc, argv)) != -1) {
		switch (c) {
		case 'T': table = 1; break;
		case 'h':
			printf("usage: %s metrics [--table] RUNDIR\n"
			       "Collect the metrics of every task that has run (path training, outer\n"
			       "steps), phase by phase, into RUNDIR/metrics.jsonl; print a JSON summary,\n"
			       "or with --table one line per phase: the paths' validation loss (min,\n"
			       "mean, max), their mean training loss and tokens/s, and the outer steps'\n"
			       "mean pairwise cosine and mean rescaled outer gradient norm.\n\n"
			       "options:\n", prog);
			cli_print_opts(stdout, metrics_tables);
			return 0;
		default: return 2; /* CLI_BAD, reported */
		}
	}
	if (argc - optind != 1)
		return cli_usage_error(prog, "metrics: expected one RUNDIR (see %s metrics --help)",
				       prog);
	rc = rundir_open(&r, argv[optind], 0);
	if (!rc) {
		rc = do_metrics(&r, table);
		rundir_close(&r);
	}
	return rc ? cli_report(prog, rc) : 0;
}

/* ---- step --------------------------------------------------------------------------------- */

static const struct cli_opt step_opts[] = {
	{"phase", 'p', 'p', CLI_ARG, "T",
	 "the phase whose paths are averaged (1 .. dipaco.phases)"},
	{"module", 'm', 'm', CLI_ARG, "NAME", "this module (repeatable)"},
	{"slice", 'S', 0, CLI_ARG, "I/N", "modules I, I+N, I+2N, ... (0 <= I < N)"},
	{"wait", 'w', 'w', CLI_OPTARG, "SECS",
	 "wait for path checkpoints still being trained, folding\n"
	 "each in as it appears (default: forever; without\n"
	 "--wait a missing one is an error)"},
	{"threads", 't', 't', CLI_ARG, "N",
	 "threads reading and folding (default: OMP_NUM_THREADS or\n"
	 "all cores); the module written does not depend on it"},
	{"quiet", 'q', 'q', CLI_FLAG, NULL, "no progress line"},
	CLI_OPT_END,
};
static const struct cli_opt *const step_tables[] = {step_opts, help_opts, NULL};

static void step_usage(FILE *fp)
{
	fprintf(fp,
		"usage: %s step RUNDIR --phase T [--module NAME]... [--slice I/N] [options]\n"
		"The outer step of phase T: for each selected module, average what phase T's\n"
		"paths did to it and apply Nesterov momentum (dipaco.outer_lr, outer_momentum,\n"
		"rescale, reweight), reading one module at a time, tensor by tensor; write\n"
		"phase-T/modules/NAME.safetensors and its diagnostics NAME.json, and print the\n"
		"diagnostics as JSON Lines on stdout. A module whose output exists and verifies\n"
		"is skipped. With no --module or --slice, every module; under mpirun, rank I of\n"
		"N takes slice I/N.\n\n"
		"options:\n", prog);
	cli_print_opts(fp, step_tables);
}


static int parse_slice(const char *s, long *i, long *n)
{
	char a[32], b[32];
	const char *slash = strchr(s, '/');

	if (!slash || slash - s >= 31 || strlen(slash + 1) >= 31)
		return err_set(CORE_EUSAGE, NULL, "--slice '%.40s' is not I/N", s);
	snprintf(a, sizeof a, "%.*s", (int)(slash - s), s);
	snprintf(b, sizeof b, "%s", slash + 1);
	ERR_FORWARD(cli_parse_long("--slice N", b, 1, INT_MAX, n));
	ERR_FORWARD(cli_parse_long("--slice I", a, 0, *n - 1, i));
	return 0;
}

/* step's options and argument. */
struct step_args {
	const char **names; /* --module's, nnames of them (room for argc) */
	const char *dir;
	long phase, si, sn, threads;
	double wait;
	int nnames, have_slice, quiet;
};

/* Parse into *a: the exit status when the command ends here (--help, a usage error), or -1
 * to run it. */
static int step_parse(int argc, char **argv, struct step_args *a)
{
	struct cli_parser p;
	int c, rc;

	if ((rc = parser_init(&p, "step", step_tables)) != 0)
		return rc;
	while ((c = cli_next(&p, argc, argv)) != -1) {
		switch (c) {
		case 'p': rc = cli_parse_long("--phase", optarg, 1, 1L << 40, &a->phase); break;
		case 'm': a->names[a->nnames++] = optarg; break;
		case 'S': rc = parse_slice(optarg, &a->si, &a->sn); a->have_slice = 1; break;
		case 'w':
			a->wait = -1;
			if (optarg)
				rc = cli_parse_double("--wait", optarg, 0.001, 1e9, &a->wait);
			break;
		case 'q': a->quiet = 1; break;
		case 't': rc = cli_parse_long("--threads", optarg, 1, 4096, &a->threads); break;
		case 'h': step_usage(stdout); return 0;
		default: return 2; /* CLI_BAD, reported */
		}
		if (rc)
			return cli_report(prog, rc);
	}
	if (argc - optind != 1 || a->phase == 0)
		return cli_usage_error(prog, "step: expected RUNDIR and --phase T (see %s step "
				       "--help)", prog);
	if (a->nnames && a->have_slice)
		return cli_usage_error(prog, "step: --module and --slice exclude each other");
	if (!a->nnames && !a->have_slice)
		dist_launcher(&a->si, &a->sn); /* every module, or this rank's share under mpirun */
	a->dir = argv[optind];
	return -1;
}

/* The outer steps a selects; the exit status. */
static int step_run(const struct step_args *a)
{
	const long phase = a->phase;
	struct rundir r;
	int rc = rundir_open(&r, a->dir, 0);

	if (rc)
		return cli_report(prog, rc);
	if (phase > r.cfg.dipaco.phases)
		rc = err_set(CORE_EUSAGE, r.dir, "phase %ld is outside 1..%ld", phase,
			     r.cfg.dipaco.phases);
	/* the shard sizes this phase trained on (the run may have been re-sharded) */
	if (!rc)
		rc = rundir_read_shards(&r, phase, 0);
	/* The selection: named modules (each must exist), or a slice of all. */
	int *sel = calloc((size_t)r.topo.nmodules, sizeof *sel), nsel = 0;
	if (!rc && !sel)
		rc = err_set(CORE_ENOMEM, NULL, "out of memory");
	for (int i = 0; !rc && i < a->nnames; i++) {
		int m = topo_find(&r.topo, a->names[i]);
		if (m < 0)
			rc = err_set(CORE_EUSAGE, r.dir, "no module '%.64s' in this run (see %s "
				     "topology)", a->names[i], prog);
		else if (!sel[m])
			sel[m] = 1, nsel++;
	}
	for (int m = 0; !rc && !a->nnames && m < r.topo.nmodules; m++)
		if (m % a->sn == a->si)
			sel[m] = 1, nsel++;
	struct progress pr;
	char label[48];
	snprintf(label, sizeof label, "outer phase %ld", phase);
	progress_init(&pr, label, nsel);
	if (a->quiet)
		pr.enabled = 0;
	int done = 0, skipped_total = 0;
	for (int m = 0; !rc && m < r.topo.nmodules; m++) {
		struct outer_task_result res;
		if (!sel[m])
			continue;
		rc = outertask_step(&r, phase, m, a->wait, (int)a->threads, &res);
		if (!rc && res.line && (fputs(res.line, stdout) == EOF || fflush(stdout) != 0))
			rc = err_errno(CORE_EIO, "<stdout>", "cannot write", errno);
		free(res.line);
		skipped_total += res.skipped;
		progress_update(&pr, ++done, r.topo.modules[m].name);
	}
	progress_done(&pr);
	if (!rc && skipped_total && !a->quiet)
		fprintf(stderr, "%s: %d module%s already done\n", prog, skipped_total,
			skipped_total == 1 ? " was" : "s were");
	free(sel);
	rundir_close(&r);
	return rc ? cli_report(prog, rc) : 0;
}

static int cmd_step(int argc, char **argv)
{
	struct step_args a = {.names = calloc((size_t)argc + 1, sizeof *a.names), .sn = 1};
	int rc;

	if (!a.names)
		return cli_report(prog, err_set(CORE_ENOMEM, NULL, "out of memory"));
	if ((rc = step_parse(argc, argv, &a)) < 0)
		rc = step_run(&a);
	free(a.names);
	return rc;
}

int main(int argc, char **argv)
{
	struct rlimit nofile;

	/* An outer step holds every path checkpoint of its module open: as many descriptors
	 * as the hard limit allows (it falls back to folding path by path beyond them). */
	if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
		nofile.rlim_cur = nofile.rlim_max;
		(void)setrlimit(RLIMIT_NOFILE, &nofile);
	}
	return cli_dispatch(prog, CORE_VERSION, commands, NCOMMANDS,
			    "'dpc-outer COMMAND --help' describes one command. See dpc-outer(1).\n",
			    argc, argv);
}
