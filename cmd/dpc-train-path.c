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
#include "cli/opt.h"
#include "common/err.h"
#include "common/progress.h"
#include "dist/dist.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "io/tokenizer_hf.h"
#include "model/checkpoint.h"
#include "model/train.h"
#include "moe/moe_dict.h"
#include "moe/moe_dist.h"
#include "dipaco/pathtrain.h"
#include "dipaco/rundir.h"
#include "common/banned.h"

static const char *prog = "dpc-train-path";

enum {
	OPT_DEVICE = 256, OPT_PRECISION, OPT_RUN, OPT_PHASE, OPT_PATH_INDEX, OPT_INFO,
	OPT_PRINT_CONFIG, OPT_MOE_PLAN, OPT_MOE_DICT, OPT_TOKENIZER,
};

static const struct cli_opt opts[] = {
	{"config", 'c', 'c', CLI_ARG, "FILE", "YAML config (see dpc-config(5))"},
	{"set", 's', 's', CLI_ARG, "SECTION.KEY=V", "override one config value (repeatable)"},
	{"data", 'd', 'd', CLI_ARG, "FILE", "training tokens, or the tokens to evaluate"},
	{"val", 'v', 'v', CLI_ARG, "FILE", "validation tokens for periodic evaluation"},
	{"output", 'o', 'o', CLI_ARG, "FILE", "checkpoint to write (atomically, every\n"
	 "train.checkpoint_every steps and at the end)"},
	{"init", 'i', 'i', CLI_ARG, "CKPT", "start from this checkpoint's parameters, AdamW state\n"
	 "and step (a branch: any train settings)"},
	{"weights", 'w', 'w', CLI_ARG, "CKPT", "start at step 0 from this checkpoint's parameters\n"
	 "alone (fine-tuning: fresh AdamW state, any train\n"
	 "settings)"},
	{"resume", 'r', 'r', CLI_FLAG, NULL, "continue from --output if it exists (and append to\n"
	 "--metrics), with the optimisation settings it was\n"
	 "trained with"},
	{"force", 'f', 'f', CLI_FLAG, NULL, "replace an existing --output, start an existing\n"
	 "--metrics afresh"},
	{"until", 'u', 'u', CLI_ARG, "STEP", "stop after global step STEP (default train.steps)"},
	{"metrics", 'm', 'm', CLI_ARG, "FILE", "write JSON Lines metrics to FILE"},
	{"threads", 't', 't', CLI_ARG, "N", "OpenMP threads (default: OMP_NUM_THREADS or all cores)"},
	{"device", OPT_DEVICE, 0, CLI_ARG, "NAME", "where the model runs: cpu (default), ref (the slow\n"
	 "reference backend), cuda (when built)"},
	{"precision", OPT_PRECISION, 0, CLI_ARG, "P", "matrix products in fp32 (default), tf32 (cuda) or\n"
	 "bf16 (cuda; cpu with oneDNN and AVX512_BF16);\n"
	 "parameters and optimiser state stay fp32"},
	{"moe-plan", OPT_MOE_PLAN, 0, CLI_ARG, "R,D,A", "under mpirun, how the MoE blocks run across the\n"
	 "ranks: parallelism R (0: data parallel, 1: expert\n"
	 "parallel, or a divisor of ranks/experts), pipelining\n"
	 "D (1, 2, 4, 8), All-to-All A (linear, 2dh, mpi);\n"
	 "default 1,1,linear"},
	{"moe-dict", OPT_MOE_DICT, 0, CLI_ARG, "FILE", "under mpirun, each step's MoE plan from this\n"
	 "moe-profile dictionary (moe-dict(5)), looked up by\n"
	 "the step's capacity"},
	{"run", OPT_RUN, 0, CLI_ARG, "RUNDIR", "train one path of a DiPaCo run (dpc-rundir(5)): the\n"
	 "config, shard and inputs come from RUNDIR"},
	{"phase", OPT_PHASE, 0, CLI_ARG, "T", "with --run: the phase to train (1 .. dipaco.phases)"},
	{"path-index", OPT_PATH_INDEX, 0, CLI_ARG, "P", "with --run: the path to train (0 .. paths-1)"},
	{"path", OPT_PATH_INDEX, 0, CLI_ARG, "P", NULL}, /* its earlier name */
	{"eval", 'e', 'e', CLI_ARG, "CKPT", "evaluate CKPT on --data; print JSON on stdout"},
	{"max-tokens", 'n', 'n', CLI_ARG, "N", "evaluate at most N predicted tokens (default all)"},
	{"info", OPT_INFO, 0, CLI_ARG, "CKPT", "verify CKPT and print its metadata and tensor table\n"
	 "as JSON"},
	{"print-config", OPT_PRINT_CONFIG, 0, CLI_FLAG, NULL,
	 "print the config (-c, with -s overrides and defaults\n"
	 "filled in) as YAML that loads back, and exit"},
	{"export", 'x', 'x', CLI_ARG, "CKPT", "write CKPT for Hugging Face transformers into the\n"
	 "directory --output: model.safetensors\n"
	 "(GPT2LMHeadModel's names), config.json and its\n"
	 "tokenizer (tokenizer.json, tokenizer_config.json)"},
	{"tokenizer", OPT_TOKENIZER, 0, CLI_ARG, "SPEC", "with --export: the checkpoint's tokenizer, spm:MODEL\n"
	 "for one trained on SentencePiece tokens (checked;\n"
	 "default byte, for a model of bytes)"},
	{"quiet", 'q', 'q', CLI_FLAG, NULL, "no progress line"},
	{"help", 'h', 'h', CLI_FLAG, NULL, "show this help and exit"},
	{"version", 'V', 'V', CLI_FLAG, NULL, "show the version and exit"},
	CLI_OPT_END,
};
static const struct cli_opt *const tables[] = {opts, NULL};

static void usage(FILE *fp)
{
	fputs("usage: dpc-train-path -c CONFIG -d TRAIN.tok -o OUT.safetensors [options]\n"
	      "       dpc-train-path --run RUNDIR --phase T --path-index P [options]\n"
	      "       dpc-train-path --eval CKPT -d TOKENS [--max-tokens N]\n"
	      "       dpc-train-path --export CKPT -o DIR [--tokenizer spm:MODEL]\n"
	      "       dpc-train-path --info CKPT | -c CONFIG [-s ...] --print-config\n"
	      "\n"
	      "Train a GPT-2 path on a token file and write its checkpoint, or evaluate a\n"
	      "checkpoint.\n"
	      "\n", fp);
	cli_print_opts(fp, tables);
	fputs("\n--out and --path, the names of earlier versions, are accepted for --output and\n"
	      "--path-index.\n", fp);
}

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
	json_t *model = json_pack("{s:i,s:i,s:i,s:i,s:i}", "n_layer", info.model.n_layer,
				  "n_embd", info.model.n_embd, "n_head", info.model.n_head,
				  "seq_len", info.model.seq_len, "vocab_size", info.model.vocab_size);
	const struct model_moe *mo = &info.model.moe;
	unsigned char *is = mo->experts ? calloc((size_t)info.model.n_layer, 1) : NULL;
	if (is && model_moe_blocks(&info.model, is) >= 0) {
		/* an MoE model: its MoE blocks and routing (dpc-config(5), "Section moe") */
		json_t *blocks = json_array();
		for (int b = 0; b < info.model.n_layer; b++)
			if (is[b])
				json_array_append_new(blocks, json_integer(b));
		json_object_set_new(model, "moe",
				    json_pack("{s:i,s:i,s:o,s:f,s:b,s:f,s:s,s:f}", "experts",
					      mo->experts, "top_k", mo->top_k, "blocks", blocks,
					      "capacity_factor", mo->capacity_factor, "bpr", mo->bpr,
					      "gate_noise", mo->gate_noise, "aux_loss",
					      mo->aux_loss ? "load-importance" : "gshard",
					      "aux_weight", mo->aux_weight));
	}
	free(is);
	json_t *j = json_pack("{s:s,s:I,s:o,s:I,s:I,s:o,s:s?,s:o}", "checkpoint", ckpt, "step",
			      (json_int_t)info.step, "metadata", meta, "params", params,
			      "optimizer_floats", moments, "model", model, "config", config,
			      "tensors", tensors);
	st_close(&f);
	rc = cli_print_json(j, JSON_INDENT(1));
	return rc ? cli_report(prog, rc) : 0;
}

/* --export: CKPT as a Hugging Face model directory, with its tokenizer. Returns the exit
 * status. */
static int run_export(struct backend *be, const char *ckpt, const char *dir, const char *spec,
		      int force)
{
	const char *files[2 + TOKENIZER_HF_MAX_FILES] = {"model.safetensors", "config.json"};
	struct tokenizer *tk = NULL;
	struct ckpt_info info;
	char path[4096];
	int rc;

	if (!dir)
		return cli_usage_error(prog, "--export needs --output DIR, the directory to write");
	if ((rc = ckpt_info(ckpt, &info)) < 0 ||
	    (rc = tokenizer_for(spec, info.model.tokenizer, (uint32_t)info.model.vocab_size, ckpt,
				1, &tk)) < 0) {
		tokenizer_close(tk);
		return cli_report(prog, rc);
	}
	const int n = 2 + tokenizer_hf_files(tk, files + 2);
	for (int i = 0; i < n && !rc; i++) {
		snprintf(path, sizeof path, "%s/%s", dir, files[i]);
		if (!force && access(path, F_OK) == 0)
			rc = err_set(CORE_EIO, path, "exists (use --force to replace it)");
	}
	snprintf(path, sizeof path, "%s/%s", dir, files[0]);
	if (!rc && (rc = cli_make_parents(path)) == 0 &&
	    (rc = ckpt_export_hf(ckpt, dir, be)) == 0)
		rc = tokenizer_hf_write(tk, dir, info.model.seq_len);
	tokenizer_close(tk);
	if (rc < 0)
		return cli_report(prog, rc);
	json_t *list = json_array();
	for (int i = 0; i < n; i++)
		json_array_append_new(list, json_string(files[i]));
	rc = cli_print_json(json_pack("{s:s, s:s, s:I, s:o}", "checkpoint", ckpt, "out", dir,
				      "step", (json_int_t)info.step, "files", list),
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

/* The command line. */
struct options {
	const char *config, *eval, *device, *run, *export, *info, *moe_dict, *tokenizer;
	struct moe_plan moe_plan;
	int have_plan;
	const char **sets;
	int nsets, print_config, precision, resume, force, quiet;
	long phase, path, threads, until, max_tokens;
	struct train_opts t; /* data, val, out, init, weights and metrics */
};

/* --moe-plan R,D,A: the numbers and the algorithm's name; whether they fit the placement is
 * the model's check (gpt2_distribute). */
static int parse_plan(const char *arg, struct moe_plan *p)
{
	char a[16];
	long r, d;
	int n = 0;
	if (sscanf(arg, "%ld,%ld,%15[a-z0-9]%n", &r, &d, a, &n) != 3 || arg[n] || r < 0 ||
	    r > 1 << 20 || d < 1 || d > 8 || dist_a2a_from_name(a) < 0)
		return err_set(CORE_EUSAGE, NULL, "option '--moe-plan': '%s' is not R,D,A (R >= 0, "
			       "D in 1, 2, 4, 8, A linear, 2dh or mpi; e.g. 1,2,linear)", arg);
	*p = (struct moe_plan){.r = (int)r, .d = (int)d, .a = (enum dist_a2a)dist_a2a_from_name(a)};
	return 0;
}

/* The options into *o: the exit status when the program ends here (--help, --version, a
 * usage error), or -1 to run. */
static int parse(int argc, char **argv, struct options *o)
{
	struct cli_parser p;
	int c, rc = cli_parser_init(&p, prog, NULL, tables);

	if (rc < 0)
		return cli_report(prog, rc);
	while ((c = cli_next(&p, argc, argv)) != -1) {
		switch (c) {
		case 'c': o->config = optarg; break;
		case 's': o->sets[o->nsets++] = optarg; break;
		case 'd': o->t.data_path = optarg; break;
		case 'v': o->t.val_path = optarg; break;
		case 'o': o->t.out_path = optarg; break;
		case 'i': o->t.init_path = optarg; break;
		case 'w': o->t.weights_path = optarg; break;
		case 'x': o->export = optarg; break;
		case OPT_INFO: o->info = optarg; break;
		case OPT_PRINT_CONFIG: o->print_config = 1; break;
		case 'r': o->resume = 1; break;
		case 'f': o->force = 1; break;
		case 'u': rc = cli_parse_long("--until", optarg, 1, 1L << 50, &o->until); break;
		case 'm': o->t.metrics_path = optarg; break;
		case 't': rc = cli_parse_long("--threads", optarg, 1, 4096, &o->threads); break;
		case 'e': o->eval = optarg; break;
		case 'n':
			rc = cli_parse_long("--max-tokens", optarg, 1, 1L << 50, &o->max_tokens);
			break;
		case 'q': o->quiet = 1; break;
		case OPT_DEVICE: o->device = optarg; break;
		case OPT_PRECISION:
			rc = cli_parse_precision("--precision", optarg, &o->precision);
			break;
		case OPT_MOE_PLAN: rc = parse_plan(optarg, &o->moe_plan); o->have_plan = 1; break;
		case OPT_MOE_DICT: o->moe_dict = optarg; break;
		case OPT_TOKENIZER: o->tokenizer = optarg; break;
		case OPT_RUN: o->run = optarg; break;
		case OPT_PHASE: rc = cli_parse_long("--phase", optarg, 1, 1L << 40, &o->phase); break;
		case OPT_PATH_INDEX:
			rc = cli_parse_long("--path-index", optarg, 0, 65535, &o->path);
			break;
		case 'h': usage(stdout); return 0;
		case 'V': printf("%s %s\n", prog, CORE_VERSION); return 0;
		default: return 2; /* CLI_BAD, reported */
		}
		if (rc)
			return cli_report(prog, rc);
	}
	if (optind < argc)
		return cli_usage_error(prog, "unexpected argument '%s'", argv[optind]);
	if (o->tokenizer && !o->export)
		return cli_usage_error(prog, "--tokenizer goes with --export (training reads the "
				       "tokenizer from the token files)");
	return -1;
}

/* The combinations refused before anything opens: the exit status, or -1. */
static int check_modes(const struct options *o)
{
	const struct train_opts *t = &o->t;

	if (o->run) {
		/* The first option --run excludes, by name. */
		const char *clash = o->config ? "--config" : o->nsets ? "--set" : t->data_path ?
			"--data" : t->val_path ? "--val" : t->out_path ? "--output" : t->init_path ?
			"--init" : t->weights_path ? "--weights" : o->resume ? "--resume" :
			o->force ? "--force" : o->until ? "--until" : t->metrics_path ?
			"--metrics" : o->eval ? "--eval" : o->export ? "--export" : o->info ?
			"--info" : o->print_config ? "--print-config" : o->max_tokens ?
			"--max-tokens" : NULL;
		if (clash)
			return cli_usage_error(prog, "--run takes its config, data and outputs from "
					       "the run directory: %s does not go with it (only "
					       "--phase, --path-index, --threads, --device, "
					       "--precision and --quiet do)", clash);
		if (o->phase == 0 || o->path < 0)
			return cli_usage_error(prog, "--run needs --phase T and --path-index P");
	} else if (o->phase || o->path >= 0) {
		return cli_usage_error(prog, "--phase and --path-index go with --run");
	}
	return -1;
}

/* --print-config: the config with the overrides and defaults, as YAML that loads back. */
static int run_print_config(const struct options *o)
{
	struct run_config cfg;
	char *text = NULL;

	if (!o->config)
		return cli_usage_error(prog, "--print-config needs --config FILE");
	int rc = config_load_with(&cfg, o->config, o->sets, o->nsets);
	size_t n = rc ? 0 : config_yaml(&cfg, NULL, 0) + 1;
	if (!rc && !(text = malloc(n)))
		rc = err_set(CORE_ENOMEM, NULL, "out of memory");
	if (!rc) {
		config_yaml(&cfg, text, n);
		if (fputs(text, stdout) == EOF || fflush(stdout) != 0 || ferror(stdout))
			rc = err_errno(CORE_EIO, "<stdout>", "cannot write", errno);
	}
	free(text);
	return rc ? cli_report(prog, rc) : 0;
}

/* Training's refusals: an existing output is continued (--resume) or replaced (--force),
 * never silently overwritten; the metrics of a continued run go on in the same file, those
 * of any other run would follow the old run's lines with repeated step numbers. Then the
 * outputs' directories. The exit status, or -1. */
static int prepare_outputs(struct options *o, const struct run_config *cfg)
{
	struct train_opts *t = &o->t;
	int rc;

	if (t->weights_path && (t->init_path || o->resume))
		return cli_usage_error(prog, "--weights starts a new run from a checkpoint's "
				       "parameters: it does not go with %s, which continue one",
				       t->init_path ? "--init" : "--resume");
	if (o->until > cfg->train.steps)
		return cli_usage_error(prog, "--until %ld is past train.steps = %ld, where the "
				       "learning-rate schedule ends (raise it: -s train.steps=%ld)",
				       o->until, cfg->train.steps, o->until);
	int continuing = o->resume && !t->init_path && is_regular(t->out_path);
	if (!o->force && !continuing && is_regular(t->out_path))
		return cli_report(prog, err_set(CORE_EIO, t->out_path, "exists (use --resume to "
						"continue it or --force to replace it)"));
	if (t->metrics_path && is_regular(t->metrics_path) && !continuing) {
		if (!o->force)
			return cli_report(prog, err_set(CORE_EIO, t->metrics_path, "exists (a run "
							"continued with --resume appends to it; "
							"use --force to start it afresh)"));
		if (truncate(t->metrics_path, 0) != 0)
			return cli_report(prog, err_errno(CORE_EIO, t->metrics_path,
							  "cannot truncate", errno));
	}
	if ((rc = cli_make_parents(t->out_path)) < 0 ||
	    (t->metrics_path && (rc = cli_make_parents(t->metrics_path)) < 0))
		return cli_report(prog, rc);
	return -1;
}

/* --resume of an existing --output: it is the run's start (every rank decides alike). */
static void resolve_resume(struct options *o)
{
	struct train_opts *t = &o->t;
	if (o->resume && !t->init_path && access(t->out_path, F_OK) == 0) {
		t->init_path = t->out_path;
		t->resuming = 1;
	}
}

/* Under mpirun with more than one rank (dist_launcher): the ranks of one training run, and
 * the MoE plan or dictionary; *d stays NULL for one process, where --moe-plan and --moe-dict
 * have nothing to choose. The exit status, or -1. */
static int open_ranks(struct options *o, const struct run_config *cfg, struct dist **d,
		      struct moe_dict *dict)
{
	long rank, size;
	int rc;
	*d = NULL;
	if (!dist_launcher(&rank, &size) || size < 2) {
		if (o->have_plan || o->moe_dict)
			return cli_usage_error(prog, "%s chooses how the MoE blocks run across ranks: "
					       "start the training under mpirun with 2 or more "
					       "ranks", o->have_plan ? "--moe-plan" : "--moe-dict");
		return -1;
	}
	if (o->have_plan && o->moe_dict)
		return cli_usage_error(prog, "--moe-plan and --moe-dict both choose the plan: give "
				       "one");
	if ((rc = dist_open(d, 0)) < 0)
		return cli_report(prog, rc);
	if (o->moe_dict) {
		const struct model_config *m = &cfg->model;
		if (!m->moe.experts)
			rc = err_set(CORE_EUSAGE, o->moe_dict, "--moe-dict: the model has no MoE "
				     "blocks (no moe section)");
		else if ((rc = moe_dict_read(o->moe_dict, dict)) == 0)
			rc = moe_dict_check(dict, o->moe_dict, (int)size, m->moe.experts, m->n_embd,
					    4 * (int64_t)m->n_embd, m->moe.top_k);
		if (rc < 0)
			return cli_report(prog, rc);
	}
	return -1;
}

static int print_train(struct backend *be, const struct options *o,
		       const struct train_result *rp, struct dist *d);

/* Training: the config, the refusals, the run, its JSON line. The exit status. */
static int run_train(struct backend *be, struct options *o)
{
	struct run_config cfg;
	struct train_result r;
	int rc;

	if (!o->config || !o->t.out_path)
		return cli_usage_error(prog, "--config and --output are required to train (see "
				       "--help)");
	if ((rc = config_load_with(&cfg, o->config, o->sets, o->nsets)) != 0)
		return cli_report(prog, rc);
	struct dist *d = NULL;
	struct moe_dict dict = {0};
	if ((rc = open_ranks(o, &cfg, &d, &dict)) >= 0)
		goto done;
	/* rank 0 checks and prepares the outputs, and says why when it refuses; the other
	 * ranks stop with its exit status */
	const int lead = !d || dist_rank(d) == 0;
	rc = lead ? prepare_outputs(o, &cfg) : -1;
	if (d) {
		int64_t v = rc;
		if (dist_allreduce_i64(d, &v, 1, DIST_MAX) < 0)
			v = 1;
		rc = (int)v;
	}
	if (rc >= 0)
		goto done;
	resolve_resume(o);
	o->t.cfg = &cfg;
	o->t.be = be;
	o->t.until = o->until;
	o->t.progress = !o->quiet;
	o->t.dist = d;
	o->t.moe_plan = o->have_plan ? &o->moe_plan : NULL;
	o->t.moe_dict = o->moe_dict ? &dict : NULL;
	if ((rc = train_path_run(&o->t, &r)) != 0) {
		rc = cli_report(prog, rc);
		goto done;
	}
	rc = lead ? print_train(be, o, &r, d) : 0;
done:
	if (d && rc > 0) /* every rank's line before mpirun stops the others */
		dist_barrier_timeout(d, 10.0);
	moe_dict_free(&dict);
	dist_close(d);
	return rc;
}

/* The training's JSON line. The exit status. */
static int print_train(struct backend *be, const struct options *o,
		       const struct train_result *rp, struct dist *d)
{
	const struct train_result r = *rp;
	int ran = r.final_step > r.start_step;
	json_t *j = json_pack("{s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:s, s:s, s:s, s:s}",
			      "steps", (json_int_t)(r.final_step - r.start_step), "step",
			      (json_int_t)r.final_step, "loss", num(ran ? r.loss : NAN),
			      "val_loss", num(r.val_loss), "tokens_per_s",
			      num(ran && r.tokens_per_s > 0 ? r.tokens_per_s : NAN),
			      "peak_rss_mb", num((double)peak_rss_bytes() / 1048576.0),
			      "matmul_frac", num(r.matmul_frac), "checkpoint", o->t.out_path,
			      "device", be->name, "gemm_kernel", be->gemm_kernel,
			      "precision", backend_precision_name(be->precision));
	if (d) { /* across ranks: how many, and how the MoE blocks ran (rank 0's figures) */
		json_object_set_new(j, "ranks", json_integer(dist_size(d)));
		if (o->t.cfg->model.moe.experts && o->moe_dict)
			json_object_set_new(j, "moe_plan", json_string("dictionary"));
		else if (o->t.cfg->model.moe.experts)
			json_object_set_new(j, "moe_plan",
					    json_pack("{s:i, s:i, s:s}", "r", o->moe_plan.r, "d",
						      o->moe_plan.d, "a",
						      dist_a2a_name(o->moe_plan.a)));
	}
	int rc = cli_print_json(j, json_flags);
	return rc ? cli_report(prog, rc) : 0;
}

/* The mode the options name, on the opened backend. The exit status. */
static int run(struct backend *be, struct options *o, int argc)
{
	int rc;

	if (o->run) {
		rc = run_task(be, o->run, o->phase, o->path, o->quiet);
		return rc ? cli_report(prog, rc) : 0;
	}
	if (o->info)
		return run_info(o->info);
	if (o->print_config)
		return run_print_config(o);
	if (o->export)
		return run_export(be, o->export, o->t.out_path, o->tokenizer, o->force);
	if (!o->t.data_path)
		return cli_usage_error(prog, argc == 1 ? "no arguments: train with -c CONFIG -d "
				       "TRAIN.tok -o OUT.safetensors, or evaluate with --eval CKPT "
				       "-d TOKENS (see --help)" : "--data is required");
	if (o->eval) {
		rc = run_eval(be, o->eval, o->t.data_path, o->max_tokens);
		return rc ? cli_report(prog, rc) : 0;
	}
	return run_train(be, o);
}

int main(int argc, char **argv)
{
	struct options o = {.device = "cpu", .precision = BACKEND_FP32, .path = -1,
			    .moe_plan = {.r = 1, .d = 1, .a = DIST_A2A_LINEAR}};
	struct backend *be = NULL;
	int rc;

	if (!(o.sets = calloc((size_t)argc, sizeof *o.sets)))
		return cli_report(prog, err_set(CORE_ENOMEM, NULL, "out of memory"));
	if ((rc = parse(argc, argv, &o)) < 0 && (rc = check_modes(&o)) < 0) {
		rc = backend_open(&be, o.device, &(struct backend_params){
			.threads = (int)o.threads,
			.precision = (enum backend_precision)o.precision});
		rc = rc ? cli_report(prog, rc) : run(be, &o, argc);
	}
	backend_close(be);
	free(o.sets);
	return rc;
}
