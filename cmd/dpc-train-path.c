/* dpc-train-path - train one path (or a dense GPT-2) on a token file, train phase t of path
 * p of a DiPaCo run, evaluate a checkpoint, or export one for Hugging Face transformers.
 * Options here; the loops in lib/model/train.c and lib/dipaco/pathtrain.c. See
 * dpc-train-path(1). */
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
#include "io/safetensors.h"
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
	"       dpc-train-path --info CKPT | -c CONFIG [-s ...] --print-config\n"
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
	"      --precision P        matrix products in fp32 (default), tf32 (cuda) or\n"
	"                           bf16 (cuda; cpu with oneDNN and AVX512_BF16);\n"
	"                           parameters and optimiser state stay fp32\n"
	"      --run RUNDIR         train one path of a DiPaCo run (dpc-rundir(5)): the\n"
	"                           config, shard and inputs come from RUNDIR\n"
	"      --phase T            with --run: the phase to train (1 .. dipaco.phases)\n"
	"      --path P             with --run: the path to train (0 .. paths-1)\n"
	"  -e, --eval CKPT          evaluate CKPT on --data; print JSON on stdout\n"
	"  -n, --max-tokens N       evaluate at most N predicted tokens (default all)\n"
	"      --info CKPT          verify CKPT and print its metadata and tensor table as JSON\n"
	"      --print-config       print the config (-c, with -s overrides and defaults\n"
	"                           filled in) as the checkpoints store it, and exit\n"
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
static const size_t json_flags = JSON_COMPACT;

static int run_eval(struct backend *be, const char *ckpt, const char *data, long max_tokens)
{
	struct eval_result r;

	ERR_FORWARD(train_eval_checkpoint(be, ckpt, data, max_tokens, &r));
	struct ckpt_info info;
	ERR_FORWARD(ckpt_info(ckpt, &info));
	/* bits per token; with the byte tokenizer a token is a byte, so also bits per byte, the
	 * figure byte-level language models are compared by */
	json_t *j = json_pack("{s:s, s:s, s:I, s:I, s:o, s:o, s:o}", "checkpoint", ckpt, "data",
			      data, "step", (json_int_t)r.step, "tokens", (json_int_t)r.tokens,
			      "loss", num(r.loss), "perplexity", num(exp(r.loss)), "bits_per_token",
			      num(r.loss / M_LN2));
	if (info.model.vocab_size == 256)
		json_object_set_new(j, "bits_per_byte", num(r.loss / M_LN2));
	return cli_print_json(j, json_flags);
}

/* The defaults, the file, the -s overrides in order, then the checks. */
static int load_config(struct run_config *cfg, const char *path, const char *const *sets,
		       int nsets)
{
	config_defaults(cfg);
	int rc = config_load(cfg, path);
	for (int i = 0; !rc && i < nsets; i++)
		rc = config_set(cfg, sets[i]);
	return rc ? rc : config_validate(cfg, path);
}

/* config_dump's canonical lines ("section.key: value", "levels.N: name=X modules=M owns=...")
 * as the YAML a config file is written in, so that --print-config's output is a config. */
static void print_yaml(const char *dump)
{
	char section[32] = "";
	int in_levels = 0;
	for (const char *p = dump; *p;) {
		const char *nl = strchr(p, '\n'), *end = nl ? nl : p + strlen(p);
		const char *dot = memchr(p, '.', (size_t)(end - p));
		const char *colon = memchr(p, ':', (size_t)(end - p));
		if (dot && colon && dot < colon) {
			size_t sl = (size_t)(dot - p);
			if (sl == 6 && strncmp(p, "levels", 6) == 0) {
				if (!in_levels)
					printf("levels:\n");
				in_levels = 1;
				/* name=X modules=M owns=A B ...: owns takes the rest of the line */
				const char *q = colon + 2, *ow = strstr(q, "owns=");
				int first = 1;
				while (q < end && (!ow || q < ow)) {
					const char *sp = memchr(q, ' ', (size_t)(end - q));
					const char *e = sp && (!ow || sp < ow) ? sp : (ow ? ow : end);
					const char *eq = memchr(q, '=', (size_t)(e - q));
					if (eq)
						printf("  %s%.*s: %.*s\n", first ? "- " : "  ", (int)(eq - q), q,
						       (int)(e - eq - 1 > 0 && e[-1] == ' ' ? e - eq - 2 : e - eq - 1),
						       eq + 1);
					first = 0;
					q = e + (e < end && *e == ' ');
				}
				if (ow && ow < end)
					printf("  %sowns: %.*s\n", first ? "- " : "  ", (int)(end - ow - 5),
					       ow + 5);
			} else {
				if (sl != strlen(section) || strncmp(section, p, sl) != 0) {
					snprintf(section, sizeof section, "%.*s", (int)sl, p);
					printf("%s:\n", section);
				}
				printf("  %.*s\n", (int)(end - dot - 1), dot + 1);
			}
		}
		p = nl ? nl + 1 : end;
	}
}

/* --info: a checkpoint's metadata and tensor table as JSON, after verifying every tensor's
 * checksum. Returns the exit status. */
static int run_info(const char *ckpt)
{
	struct st_file f;
	struct ckpt_info info;
	int rc = ckpt_info(ckpt, &info);

	if (rc == 0)
		rc = st_open(&f, ckpt, 1);
	if (rc < 0)
		return cli_report(prog, rc);
	json_t *meta = json_object(), *tensors = json_array();
	const char *config = NULL;
	for (int i = 0; i < f.nmeta; i++) {
		if (strcmp(f.meta_keys[i], "config") == 0)
			config = f.meta_values[i];
		else if (strncmp(f.meta_keys[i], "crc32", 5) != 0)
			json_object_set_new(meta, f.meta_keys[i], json_string(f.meta_values[i]));
	}
	json_int_t params = 0, moments = 0;
	for (int i = 0; i < f.n; i++) {
		const struct st_entry *e = &f.entries[i];
		json_t *shape = json_array();
		json_int_t numel = 1;
		for (int d = 0; d < e->ndim; d++) {
			json_array_append_new(shape, json_integer(e->ne[d]));
			numel *= e->ne[d];
		}
		if (strncmp(e->name, "optim.", 6) == 0)
			moments += numel;
		else
			params += numel;
		json_array_append_new(tensors, json_pack("{s:s,s:s,s:o,s:I}", "name", e->name,
							 "dtype", dtype_name(e->type), "shape",
							 shape, "numel", numel));
	}
	json_t *j = json_pack("{s:s,s:I,s:o,s:I,s:I,s:o,s:s?,s:o}", "checkpoint", ckpt, "step",
			      (json_int_t)info.step, "metadata", meta, "params", params,
			      "optimizer_floats", moments, "model",
			      json_pack("{s:i,s:i,s:i,s:i,s:i}", "n_layer", info.model.n_layer,
					"n_embd", info.model.n_embd, "n_head", info.model.n_head,
					"seq_len", info.model.seq_len, "vocab_size",
					info.model.vocab_size), "config", config, "tensors", tensors);
	st_close(&f);
	rc = cli_print_json(j, JSON_INDENT(1));
	return rc ? cli_report(prog, rc) : 0;
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
	return cli_print_json(json_pack("{s:I, s:I, s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:s, "
					"s:s}", "phase", (json_int_t)phase, "path", (json_int_t)path,
					"step", (json_int_t)res.last_step, "best_step",
					(json_int_t)res.best_step, "loss", num(res.train_loss),
					"heldout_loss", num(res.heldout_loss), "val_loss",
					num(res.val_loss), "tokens_per_s", num(res.tokens_per_s),
					"seconds", num(res.seconds), "train_seconds",
					num(res.train_seconds), "eval_seconds", num(res.eval_seconds),
					"checkpoint", out, "gemm_kernel", be->gemm_kernel), json_flags);
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
		{"info", required_argument, NULL, 'I'},   {"print-config", no_argument, NULL, 'C'},
		{"precision", required_argument, NULL, 'X'},
		{NULL, 0, NULL, 0},
	};
	const char *config_path = NULL, *eval_path = NULL, *device = "cpu", *run_dir = NULL;
	const char *export_path = NULL, *info_path = NULL;
	int print_config = 0, precision = BACKEND_FP32;
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
		case 'I': info_path = optarg; break;
		case 'C': print_config = 1; break;
		case 'r': resume = 1; break;
		case 'f': force = 1; break;
		case 'u': rc = cli_parse_long("--until", optarg, 1, 1L << 50, &until); break;
		case 'm': o.metrics_path = optarg; break;
		case 't': rc = cli_parse_long("--threads", optarg, 1, 4096, &threads); break;
		case 'e': eval_path = optarg; break;
		case 'n': rc = cli_parse_long("--max-tokens", optarg, 1, 1L << 50, &max_tokens); break;
		case 'q': quiet = 1; break;
		case 'D': device = optarg; break;
		case 'X': rc = cli_parse_precision("--precision", optarg, &precision); break;
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
			"--metrics" : eval_path ? "--eval" : export_path ? "--export" : info_path ? "--info" :
			print_config ? "--print-config" : max_tokens ? "--max-tokens" : NULL;
		if (clash) {
			rc = cli_usage_error(prog, "--run takes its config, data and outputs from the "
					     "run directory: %s does not go with it (only --phase, "
					     "--path, --threads, --device, --precision and --quiet do)", clash);
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
	rc = backend_open(&be, device, &(struct backend_params){
		.threads = (int)threads, .precision = (enum backend_precision)precision});
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
	if (info_path) {
		rc = run_info(info_path);
		goto out;
	}
	if (print_config) {
		if (!config_path) {
			rc = cli_usage_error(prog, "--print-config needs --config FILE");
			goto out;
		}
		rc = load_config(&cfg, config_path, sets, nsets);
		size_t n = rc ? 0 : config_dump(&cfg, NULL, 0) + 1;
		char *text = n ? malloc(n) : NULL;
		if (!rc && !text)
			rc = err_set(CORE_ENOMEM, NULL, "out of memory");
		if (!rc) {
			config_dump(&cfg, text, n);
			print_yaml(text);
			if (fflush(stdout) != 0 || ferror(stdout))
				rc = err_errno(CORE_EIO, "<stdout>", "cannot write", errno);
		}
		free(text);
		rc = rc ? cli_report(prog, rc) : 0;
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
	rc = load_config(&cfg, config_path, sets, nsets);
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
	rc = cli_print_json(json_pack("{s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:s, s:s, s:s, s:s}",
				      "steps",
				      (json_int_t)(r.final_step - r.start_step), "step",
				      (json_int_t)r.final_step, "loss",
				      num(r.final_step > r.start_step ? r.loss : NAN), "val_loss",
				      num(r.val_loss), "tokens_per_s",
				      num(r.final_step > r.start_step && r.tokens_per_s > 0
					  ? r.tokens_per_s : NAN),
				      "peak_rss_mb", num(rss_mb), "matmul_frac",
				      num(r.matmul_frac), "checkpoint", o.out_path, "device",
				      be->name, "gemm_kernel", be->gemm_kernel, "precision",
				      backend_precision_name(be->precision)),
			    json_flags);
	if (rc)
		rc = cli_report(prog, rc);
out:
	backend_close(be);
	free(sets);
	return rc;
}
