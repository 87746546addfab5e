/* dpc-train-path - train one path (or a dense GPT-2) on a token file, evaluate a checkpoint,
 * or export one for Hugging Face transformers. Thin: options here, the loop in lib/train.c. See dpc-train-path(1). */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "common/err.h"
#include "common/progress.h"
#include "io/config.h"
#include "model/checkpoint.h"
#include "model/train.h"
#include "dipaco/pathtrain.h"
#include "dipaco/rundir.h"
#include "common/banned.h"

static const char *prog = "dpc-train-path";

static const char usage[] =
	"usage: dpc-train-path -c CONFIG -d TRAIN.tok -o OUT.safetensors [options]\n"
	"       dpc-train-path --run RUNDIR --phase T --path P [options]\n"
	"       dpc-train-path --eval CKPT -d TOKENS [--max-tokens N]\n"
	"       dpc-train-path --export CKPT -o DIR\n"
	"\n"
	"Train a GPT-2 path on a token file and write its checkpoint, or evaluate a checkpoint.\n"
	"\n"
	"  -c, --config FILE        YAML config (see dpc-config(5))\n"
	"  -s, --set SECTION.KEY=V  override one config value (repeatable)\n"
	"  -d, --data FILE          training tokens, or the tokens to evaluate\n"
	"  -v, --val FILE           validation tokens for periodic evaluation\n"
	"  -o, --out FILE           checkpoint to write (atomically, every train.checkpoint_every\n"
	"                           steps and at the end)\n"
	"  -i, --init CKPT          start from this checkpoint's parameters, AdamW state and\n"
	"                           step (a branch: any train settings)\n"
	"  -w, --weights CKPT       start at step 0 from this checkpoint's parameters alone\n"
	"                           (fine-tuning: fresh AdamW state, any train settings)\n"
	"  -r, --resume             continue from --out if it exists (and append to --metrics),\n"
	"                           with the optimisation settings it was trained with\n"
	"  -f, --force              replace an existing --out, start an existing --metrics afresh\n"
	"  -u, --until STEP         stop after global step STEP (default train.steps)\n"
	"  -m, --metrics FILE       write JSON Lines metrics to FILE\n"
	"  -t, --threads N          OpenMP threads (default: OMP_NUM_THREADS or all cores)\n"
	"      --device NAME        where the model runs: cpu (default), ref (the slow\n"
	"                           reference backend), cuda (when built)\n"
	"      --run RUNDIR         train one path of a DiPaCo run (dpc-rundir(5)): the\n"
	"                           config, shard and inputs come from RUNDIR\n"
	"      --phase T            with --run: the phase to train (1 .. dipaco.phases)\n"
	"      --path P             with --run: the path to train (0 .. paths-1)\n"
	"  -e, --eval CKPT          evaluate CKPT on --data; print JSON on stdout\n"
	"  -n, --max-tokens N       evaluate at most N predicted tokens (default all)\n"
	"  -x, --export CKPT        write CKPT for Hugging Face transformers into the\n"
	"                           directory --out: model.safetensors (GPT2LMHeadModel's\n"
	"                           names) and config.json\n"
	"  -q, --quiet              no progress line\n"
	"  -h, --help               show this help and exit\n"
	"  -V, --version            show the version and exit\n";

/* A finite number, or JSON null (NaN: not measured). */
static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

/* path names a regular file (through links): an output that is replaced, not written to as a
 * device or a FIFO is. */
static int is_regular(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The results: one JSON object on a line of stdout (cli_print_json). */
static const size_t json_flags = JSON_COMPACT | JSON_REAL_PRECISION(9);

static int run_eval(struct backend *be, const char *ckpt, const char *data, long max_tokens)
{
	struct eval_result r;

	ERR_FORWARD(train_eval_checkpoint(be, ckpt, data, max_tokens, &r));
	return cli_print_json(json_pack("{s:s, s:s, s:I, s:I, s:o, s:o}", "checkpoint", ckpt,
					"data", data, "step", (json_int_t)r.step, "tokens",
					(json_int_t)r.tokens, "loss", num(r.loss), "perplexity",
					num(exp(r.loss))), json_flags);
}

/* --export: CKPT as a Hugging Face model directory. Returns the exit status. */
static int run_export(struct backend *be, const char *ckpt, const char *dir, int force)
{
	static const char *const files[] = {"model.safetensors", "config.json"};
	char path[4096];
	int rc;

	if (!dir)
		return cli_usage_error(prog, "--export needs --out DIR, the directory to write");
	for (size_t i = 0; i < 2; i++) {
		snprintf(path, sizeof path, "%s/%s", dir, files[i]);
		if (!force && access(path, F_OK) == 0)
			return cli_report(prog, err_set(CORE_EIO, path, "exists (use --force to "
							"replace it)"));
	}
	snprintf(path, sizeof path, "%s/%s", dir, files[0]);
	if ((rc = cli_make_parents(path)) < 0 || (rc = ckpt_export_hf(ckpt, dir, be)) < 0)
		return cli_report(prog, rc);
	struct ckpt_info info;
	if ((rc = ckpt_info(ckpt, &info)) < 0)
		return cli_report(prog, rc);
	rc = cli_print_json(json_pack("{s:s, s:s, s:I, s:[s,s]}", "checkpoint", ckpt, "out", dir,
				      "step", (json_int_t)info.step, "files", files[0], files[1]),
			    json_flags);
	return rc ? cli_report(prog, rc) : 0;
}

/* --run: one task of a DiPaCo run. */
static int run_task(struct backend *be, const char *dir, long phase, long path, int quiet)
{
	struct rundir r;
	struct path_task_result res;
	char out[RUNDIR_PATH_MAX];

	ERR_FORWARD(rundir_open(&r, dir, 0));
	/* the manifest of the shards this phase trains on (a re-sharding's), checked */
	int rc = phase >= 1 ? rundir_read_shards(&r, phase, 0) : 0;
	if (!rc)
		rc = pathtrain_run(&r, phase, (int)path, be, !quiet, &res);
	if (!rc)
		rc = rundir_path_ckpt(&r, phase, (int)path, ".safetensors", out, sizeof out);
	rundir_close(&r);
	ERR_FORWARD(rc);
	if (res.skipped)
		return cli_print_json(json_pack("{s:I, s:I, s:b, s:s}", "phase", (json_int_t)phase,
						"path", (json_int_t)path, "skipped", 1, "checkpoint",
						out), json_flags);
	return cli_print_json(json_pack("{s:I, s:I, s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:s}",
					"phase", (json_int_t)phase, "path", (json_int_t)path,
					"step", (json_int_t)res.last_step, "best_step",
					(json_int_t)res.best_step, "loss", num(res.train_loss),
					"heldout_loss", num(res.heldout_loss), "val_loss",
					num(res.val_loss), "tokens_per_s", num(res.tokens_per_s),
					"seconds", num(res.seconds), "train_seconds",
					num(res.train_seconds), "eval_seconds", num(res.eval_seconds),
					"checkpoint", out), json_flags);
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = {
		{"config", required_argument, NULL, 'c'}, {"set", required_argument, NULL, 's'},
		{"data", required_argument, NULL, 'd'},   {"val", required_argument, NULL, 'v'},
		{"out", required_argument, NULL, 'o'},    {"init", required_argument, NULL, 'i'},
		{"resume", no_argument, NULL, 'r'},       {"until", required_argument, NULL, 'u'},
		{"metrics", required_argument, NULL, 'm'}, {"threads", required_argument, NULL, 't'},
		{"eval", required_argument, NULL, 'e'},   {"max-tokens", required_argument, NULL, 'n'},
		{"quiet", no_argument, NULL, 'q'},        {"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},      {"device", required_argument, NULL, 'D'},
		{"run", required_argument, NULL, 'R'},    {"phase", required_argument, NULL, 'P'},
		{"path", required_argument, NULL, 'A'},   {"force", no_argument, NULL, 'f'},
		{"weights", required_argument, NULL, 'w'}, {"export", required_argument, NULL, 'x'},
		{NULL, 0, NULL, 0},
	};
	const char *config_path = NULL, *eval_path = NULL, *device = "cpu", *run_dir = NULL;
	const char *export_path = NULL;
	long phase = 0, path = -1;
	struct backend *be = NULL;
	const char **sets = calloc((size_t)argc, sizeof *sets);
	int nsets = 0, resume = 0, force = 0, quiet = 0, rc = 0, opt;
	long threads = 0, until = 0, max_tokens = 0;
	struct train_opts o = {0};
	struct run_config cfg;

	if (!sets)
		return cli_report(prog, err_set(CORE_ENOMEM, NULL, "out of memory"));
	opterr = 0;
	while ((opt = getopt_long(argc, argv, ":c:s:d:v:o:i:w:rfu:m:t:e:n:x:qhV", longopts, NULL)) != -1) {
		switch (opt) {
		case 'c': config_path = optarg; break;
		case 's': sets[nsets++] = optarg; break;
		case 'd': o.data_path = optarg; break;
		case 'v': o.val_path = optarg; break;
		case 'o': o.out_path = optarg; break;
		case 'i': o.init_path = optarg; break;
		case 'w': o.weights_path = optarg; break;
		case 'x': export_path = optarg; break;
		case 'r': resume = 1; break;
		case 'f': force = 1; break;
		case 'u': rc = cli_parse_long("--until", optarg, 1, 1L << 50, &until); break;
		case 'm': o.metrics_path = optarg; break;
		case 't': rc = cli_parse_long("--threads", optarg, 1, 4096, &threads); break;
		case 'e': eval_path = optarg; break;
		case 'n': rc = cli_parse_long("--max-tokens", optarg, 1, 1L << 50, &max_tokens); break;
		case 'q': quiet = 1; break;
		case 'D': device = optarg; break;
		case 'R': run_dir = optarg; break;
		case 'P': rc = cli_parse_long("--phase", optarg, 1, 1L << 40, &phase); break;
		case 'A': rc = cli_parse_long("--path", optarg, 0, 65535, &path); break;
		case 'h': fputs(usage, stdout); goto out;
		case 'V': printf("%s %s\n", prog, CORE_VERSION); goto out;
		default:
			rc = cli_bad_option(prog, prog, longopts, argv, opt);
			goto out;
		}
		if (rc) {
			rc = cli_report(prog, rc);
			goto out;
		}
	}
	if (optind < argc) {
		rc = cli_usage_error(prog, "unexpected argument '%s'", argv[optind]);
		goto out;
	}
	if (run_dir) {
		/* The first option --run excludes, by name. */
		const char *clash = config_path ? "--config" : nsets ? "--set" : o.data_path ?
			"--data" : o.val_path ? "--val" : o.out_path ? "--out" : o.init_path ?
			"--init" : o.weights_path ? "--weights" : resume ? "--resume" : force ? "--force" : until ? "--until" : o.metrics_path ?
			"--metrics" : eval_path ? "--eval" : export_path ? "--export" : max_tokens ? "--max-tokens" : NULL;
		if (clash) {
			rc = cli_usage_error(prog, "--run takes its config, data and outputs from the "
					     "run directory: %s does not go with it (only --phase, "
					     "--path, --threads, --device and --quiet do)", clash);
			goto out;
		}
	}
	if (run_dir && (phase == 0 || path < 0)) {
		rc = cli_usage_error(prog, "--run needs --phase T and --path P");
		goto out;
	}
	if (!run_dir && (phase || path >= 0)) {
		rc = cli_usage_error(prog, "--phase and --path go with --run");
		goto out;
	}
	rc = backend_open(&be, device, &(struct backend_params){.threads = (int)threads});
	if (rc) {
		rc = cli_report(prog, rc);
		goto out;
	}
	if (run_dir) {
		rc = run_task(be, run_dir, phase, path, quiet);
		if (rc)
			rc = cli_report(prog, rc);
		goto out;
	}
	if (export_path) {
		rc = run_export(be, export_path, o.out_path, force);
		goto out;
	}
	if (!o.data_path) {
		rc = cli_usage_error(prog, argc == 1 ? "no arguments: train with -c CONFIG -d TRAIN.tok "
				     "-o OUT.safetensors, or evaluate with --eval CKPT -d TOKENS (see "
				     "--help)" : "--data is required");
		goto out;
	}
	if (eval_path) {
		rc = run_eval(be, eval_path, o.data_path, max_tokens);
		if (rc)
			rc = cli_report(prog, rc);
		goto out;
	}
	if (!config_path || !o.out_path) {
		rc = cli_usage_error(prog, "--config and --out are required to train (see --help)");
		goto out;
	}
	config_defaults(&cfg);
	rc = config_load(&cfg, config_path);
	for (int i = 0; !rc && i < nsets; i++)
		rc = config_set(&cfg, sets[i]);
	if (!rc)
		rc = config_validate(&cfg, config_path);
	if (rc) {
		rc = cli_report(prog, rc);
		goto out;
	}
	if (o.weights_path && (o.init_path || resume)) {
		rc = cli_usage_error(prog, "--weights starts a new run from a checkpoint's "
				     "parameters: it does not go with %s, which continue one",
				     o.init_path ? "--init" : "--resume");
		goto out;
	}
	if (until > cfg.train.steps) {
		rc = cli_usage_error(prog, "--until %ld is past train.steps = %ld, where the "
				     "learning-rate schedule ends (raise it: -s train.steps=%ld)", until,
				     cfg.train.steps, until);
		goto out;
	}
	/* An existing output is continued (--resume) or replaced (--force), never silently
	 * overwritten; the metrics of a continued run go on in the same file, those of any other
	 * run would follow the old run's lines with repeated step numbers. */
	int continuing = resume && !o.init_path && is_regular(o.out_path);
	if (!force && !continuing && is_regular(o.out_path)) {
		rc = cli_report(prog, err_set(CORE_EIO, o.out_path, "exists (use --resume to "
					      "continue it or --force to replace it)"));
		goto out;
	}
	if (o.metrics_path && is_regular(o.metrics_path) && !continuing) {
		if (!force) {
			rc = cli_report(prog, err_set(CORE_EIO, o.metrics_path, "exists (a run "
						      "continued with --resume appends to it; use "
						      "--force to start it afresh)"));
			goto out;
		}
		if (truncate(o.metrics_path, 0) != 0) {
			rc = cli_report(prog, err_errno(CORE_EIO, o.metrics_path, "cannot truncate",
						       errno));
			goto out;
		}
	}
	if ((rc = cli_make_parents(o.out_path)) < 0 ||
	    (o.metrics_path && (rc = cli_make_parents(o.metrics_path)) < 0)) {
		rc = cli_report(prog, rc);
		goto out;
	}
	if (resume && !o.init_path && access(o.out_path, F_OK) == 0) {
		o.init_path = o.out_path;
		o.resuming = 1;
	}
	o.cfg = &cfg;
	o.be = be;
	o.until = until;
	o.progress = !quiet;

	struct train_result r;
	rc = train_path_run(&o, &r);
	if (rc) {
		rc = cli_report(prog, rc);
		goto out;
	}
	double rss_mb = (double)peak_rss_bytes() / 1048576.0;
	rc = cli_print_json(json_pack("{s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:s}", "steps",
				      (json_int_t)(r.final_step - r.start_step), "step",
				      (json_int_t)r.final_step, "loss",
				      num(r.final_step > r.start_step ? r.loss : NAN), "val_loss",
				      num(r.val_loss), "tokens_per_s",
				      num(r.final_step > r.start_step && r.tokens_per_s > 0
					  ? r.tokens_per_s : NAN),
				      "peak_rss_mb", num(rss_mb), "matmul_frac",
				      num(r.matmul_frac), "checkpoint", o.out_path),
			    json_flags);
	if (rc)
		rc = cli_report(prog, rc);
out:
	backend_close(be);
	free(sets);
	return rc;
}
