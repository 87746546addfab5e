/* dpc-shard - turn raw documents into token files, and split them into per-path shards (at
 * random, or by a router's choice of paths).
 *
 * Options are parsed here; the work is corpus_prepare(), tokfile_open() and the shard
 * splits in libcore. Subcommands live in one table.
 */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli/cli.h"
#include "cli/opt.h"
#include "io/corpus.h"
#include "common/err.h"
#include "common/progress.h"
#include "dipaco/rundir.h"
#include "io/shardsplit.h"
#include "io/tokenizer.h"
#include "io/tokfile.h"
#include "route/routesplit.h"
#include "common/banned.h"

static const char prog[] = "dpc-shard";

static int cmd_prepare(int argc, char **argv);
static int cmd_info(int argc, char **argv);
static int cmd_split(int argc, char **argv);
static int cmd_cat(int argc, char **argv);
static int cmd_tokenizer(int argc, char **argv);

static const struct cli_command commands[] = {
	{ "prepare", "tokenize documents into train.tok, val.tok and router.tok", cmd_prepare },
	{ "info", "print a token file's header as JSON, after verifying the file", cmd_info },
	{ "split", "divide a token file into per-path shards, documents kept whole", cmd_split },
	{ "cat", "decode a token file's documents back to text", cmd_cat },
	{ "tokenizer", "train a SentencePiece model (tokenizer train), or name one (tokenizer "
	  "info)", cmd_tokenizer },
};

#define NCOMMANDS ((int)(sizeof commands / sizeof commands[0]))

static int version(void)
{
	printf("%s %s\n", prog, CORE_VERSION);
	return 0;
}

/* Every command's last options. */
static const struct cli_opt common_opts[] = {
	{"help", 'h', 'h', CLI_FLAG, NULL, "show this help and exit"},
	{"version", 'V', 'V', CLI_FLAG, NULL, "show the version and exit"},
	CLI_OPT_END,
};

/* cli_parser_init for one command: 0, or the exit status after the report (a table
 * refused, the program's own error). */
static int parser_init(struct cli_parser *p, const char *cmd, const struct cli_opt *const *tables)
{
	int rc = cli_parser_init(p, prog, cmd, tables);

	return rc < 0 ? cli_report(prog, rc) : 0;
}

/* The JSON result on stdout; takes the reference. 0, or the exit status after the report. */
static int print_json_flags(json_t *j, size_t flags)
{
	int rc = cli_print_json(j, flags);

	return rc < 0 ? cli_report(prog, rc) : 0;
}

static int print_json(json_t *j)
{
	return print_json_flags(j, JSON_INDENT(2));
}

/* ---- prepare ------------------------------------------------------------------------------ */

/* The defaults named in the text are CORPUS_VAL_FRAC and CORPUS_ROUTER_FRAC (io/corpus.h). */
static const struct cli_opt prepare_opts[] = {
	{"val-frac", 'v', 0, CLI_ARG, "F", "fraction of documents for validation (default 0.02)"},
	{"router-frac", 'r', 0, CLI_ARG, "F",
	 "fraction of documents for fitting routers (default 0.005)"},
	{"seed", 's', 0, CLI_ARG, "N", "seed of the split (default 0)"},
	{"chunk", 'c', 0, CLI_ARG, "N", "cut each document, after its split is drawn, into\n"
	 "pieces of N tokens (N >= 2), each written as a\n"
	 "document with \"doc\" and \"chunk\" added to its\n"
	 "metadata; a remainder under N/2 tokens joins the\n"
	 "piece before it, so pieces hold N/2 to 1.5N tokens and\n"
	 "a document under N tokens stays whole (default 0:\n"
	 "no cutting)"},
	{"tokenizer", 't', 0, CLI_ARG, "SPEC", "byte (the default: a token per byte), or\n"
	 "spm:MODEL, a SentencePiece model file (dpc-shard\n"
	 "tokenizer train); the files record which"},
	{"force", 'f', 0, CLI_FLAG, NULL, "replace existing output files"},
	CLI_OPT_END,
};
static const struct cli_opt *const prepare_tables[] = {prepare_opts, common_opts, NULL};

static void prepare_usage(FILE *fp)
{
	fprintf(fp,
		"usage: %s prepare [options] INPUT OUTDIR\n"
		"Tokenize the documents of INPUT (a .jsonl file with a \"text\" field per\n"
		"line, a .txt file read as one document, or a directory of text files, one\n"
		"document each) into OUTDIR/train.tok, OUTDIR/val.tok and OUTDIR/router.tok;\n"
		"print a JSON summary on stdout. A split whose fraction is above 0 but that\n"
		"gets no document is an error, and nothing is written.\n\n"
		"options:\n", prog);
	cli_print_opts(fp, prepare_tables);
}

static void show_progress(void *ctx, uint64_t done, uint64_t total)
{
	struct progress *p = ctx;

	p->total = (int64_t)total;
	progress_update(p, (int64_t)done, NULL);
}

static json_t *split_json(const struct corpus_split_stats *s, const char *file)
{
	return json_pack("{s:I,s:I,s:I,s:s}", "docs", (json_int_t)s->docs, "source_docs",
			 (json_int_t)s->sources, "tokens", (json_int_t)s->tokens, "file", file);
}

/* prepare's options and arguments into *o and *force: the exit status when the command ends
 * here (--help, --version, a usage error), or -1 to run it. */
static int prepare_parse(int argc, char **argv, struct corpus_prepare_opts *o, int *force)
{
	struct cli_parser p;
	int c, rc;
	long seed, chunk;

	if ((rc = parser_init(&p, "prepare", prepare_tables)) != 0)
		return rc;
	while ((c = cli_next(&p, argc, argv)) != -1) {
		switch (c) {
		case 'v':
			if ((rc = cli_parse_double("--val-frac", optarg, 0, 1, &o->val_frac)) < 0)
				return cli_report(prog, rc);
			break;
		case 'r':
			rc = cli_parse_double("--router-frac", optarg, 0, 1, &o->router_frac);
			if (rc < 0)
				return cli_report(prog, rc);
			break;
		case 's':
			if ((rc = cli_parse_long("--seed", optarg, 0, LONG_MAX, &seed)) < 0)
				return cli_report(prog, rc);
			o->seed = (uint64_t)seed;
			break;
		case 'c':
			if ((rc = cli_parse_long("--chunk", optarg, 0, LONG_MAX, &chunk)) < 0)
				return cli_report(prog, rc);
			if (chunk == 1)
				return cli_usage_error(prog, "option '--chunk': pieces of 1 "
						       "token; N must be 2 or more, or 0 for no "
						       "cutting (see %s prepare --help)", prog);
			o->chunk = (uint64_t)chunk;
			break;
		case 't':
			o->tokenizer = optarg;
			break;
		case 'f':
			*force = 1;
			break;
		case 'h':
			prepare_usage(stdout);
			return 0;
		case 'V':
			return version();
		default: /* CLI_BAD, reported */
			return 2;
		}
	}
	if (argc - optind != 2)
		return cli_usage_error(prog,
				       "prepare: expected INPUT and OUTDIR, got %d argument%s "
				       "(see %s prepare --help)", argc - optind,
				       argc - optind == 1 ? "" : "s", prog);
	o->input = argv[optind];
	o->outdir = argv[optind + 1];
	return -1;
}

static int cmd_prepare(int argc, char **argv)
{
	struct corpus_prepare_opts o = {
		.tokenizer = "byte",
		.val_frac = CORPUS_VAL_FRAC,
		.router_frac = CORPUS_ROUTER_FRAC,
	};
	struct corpus_prepare_result res;
	struct progress bar;
	char paths[CORPUS_NSPLITS][4096];
	int force = 0, rc;

	if ((rc = prepare_parse(argc, argv, &o, &force)) >= 0)
		return rc;
	if ((rc = corpus_split_check(o.val_frac, o.router_frac)) < 0)
		return cli_report(prog, rc);
	for (int s = 0; s < CORPUS_NSPLITS; s++) {
		struct stat st;
		if ((rc = corpus_split_path(paths[s], sizeof paths[s], o.outdir,
					    (enum corpus_split)s)) < 0)
			return cli_report(prog, rc);
		if (!force && lstat(paths[s], &st) == 0)
			return cli_report(prog, err_set(CORE_EIO, paths[s], "exists (use --force to "
							"replace it)"));
	}

	progress_init(&bar, "prepare", 0);
	o.progress = show_progress;
	o.progress_ctx = &bar;
	rc = corpus_prepare(&o, &res);
	progress_done(&bar);
	if (rc < 0)
		return cli_report(prog, rc);

	uint64_t docs = 0, sources = 0, tokens = 0;
	for (int s = 0; s < CORPUS_NSPLITS; s++) {
		docs += res.split[s].docs;
		sources += res.split[s].sources;
		tokens += res.split[s].tokens;
	}
	/* docs: documents written (pieces with --chunk); source_docs: documents of INPUT */
	char id[TOKENIZER_ID_LEN];
	tokenizer_id_str(&res.tokenizer, id);
	return print_json(json_pack(
		"{s:s,s:s,s:s,s:s,s:i,s:I,s:f,s:f,s:I,s:I,s:I,s:I,s:o,s:o,s:o}", "input", o.input,
		"outdir", o.outdir, "tokenizer", o.tokenizer, "tokenizer_id", id, "vocab",
		(int)res.vocab, "seed",
		(json_int_t)o.seed, "val_frac", o.val_frac, "router_frac", o.router_frac, "chunk",
		(json_int_t)o.chunk, "docs", (json_int_t)docs, "source_docs", (json_int_t)sources,
		"tokens", (json_int_t)tokens,
		"train", split_json(&res.split[CORPUS_SPLIT_TRAIN], paths[CORPUS_SPLIT_TRAIN]),
		"val", split_json(&res.split[CORPUS_SPLIT_VAL], paths[CORPUS_SPLIT_VAL]),
		"router", split_json(&res.split[CORPUS_SPLIT_ROUTER], paths[CORPUS_SPLIT_ROUTER])));
}

/* ---- info --------------------------------------------------------------------------------- */

static const struct cli_opt *const info_tables[] = {common_opts, NULL};

static void info_usage(FILE *fp)
{
	fprintf(fp,
		"usage: %s info [options] FILE\n"
		"Verify the token file FILE (sizes, checksums, offsets, tokens) and print its\n"
		"header as JSON on stdout; a damaged file is an error (exit 1).\n\n"
		"options:\n", prog);
	cli_print_opts(fp, info_tables);
}

static int cmd_info(int argc, char **argv)
{
	struct cli_parser p;
	struct tokfile tf;
	char crc[16];
	int c, rc;

	if ((rc = parser_init(&p, "info", info_tables)) != 0)
		return rc;
	while ((c = cli_next(&p, argc, argv)) != -1) {
		switch (c) {
		case 'h':
			info_usage(stdout);
			return 0;
		case 'V':
			return version();
		default: /* CLI_BAD, reported */
			return 2;
		}
	}
	if (argc - optind != 1)
		return cli_usage_error(prog, "info: expected one FILE, got %d arguments "
				       "(see %s info --help)", argc - optind, prog);
	if ((rc = tokfile_open(&tf, argv[optind])) < 0)
		return cli_report(prog, rc);
	snprintf(crc, sizeof crc, "%08x", tf.crc);
	char id[TOKENIZER_ID_LEN];
	tokenizer_id_str(&tf.tokenizer, id);
	json_t *j = json_pack("{s:s,s:i,s:s,s:i,s:I,s:I,s:i,s:I,s:I,s:s,s:b}", "file", tf.path,
			      "version", (int)tf.version, "tokenizer", id, "vocab", (int)tf.vocab,
			      "docs",
			      (json_int_t)tf.ndocs, "tokens", (json_int_t)tf.ntokens, "width",
			      (int)tf.width, "meta_bytes", (json_int_t)tf.meta_offsets[tf.ndocs],
			      "bytes", (json_int_t)tf.maplen, "crc32", crc, "crc_ok", 1);
	tokfile_close(&tf);
	return print_json(j);
}

/* ---- cat ---------------------------------------------------------------------------------- */

static const struct cli_opt cat_opts[] = {
	{"doc", 'd', 'd', CLI_ARG, "N", "only document N (from 0)"},
	{"json", 'j', 0, CLI_FLAG, NULL, "JSON Lines with each document's metadata"},
	{"tokenizer", 't', 0, CLI_ARG, "SPEC", "decode with this tokenizer (byte, spm:MODEL),\n"
	 "checked against the one FILE records (default: the\n"
	 "byte tokenizer, when FILE's tokens are bytes)"},
	CLI_OPT_END,
};
static const struct cli_opt *const cat_tables[] = {cat_opts, common_opts, NULL};

static void cat_usage(FILE *fp)
{
	fprintf(fp,
		"usage: %s cat [options] FILE\n"
		"Decode the documents of the token file FILE back to text on stdout, each\n"
		"followed by a newline; with --doc N only that document, as it is; with --json\n"
		"one JSON object per document:\n"
		"{\"doc\":N,\"tokens\":n,\"meta\":{...},\"text\":\"...\"}.\n"
		"Tokens of a SentencePiece model need the model: --tokenizer spm:MODEL.\n\n"
		"options:\n", prog);
	cli_print_opts(fp, cat_tables);
}

static int cat_docs(const struct tokfile *tf, const struct tokenizer *tk, long doc, int json)
{
	uint64_t first = doc >= 0 ? (uint64_t)doc : 0;
	uint64_t last = doc >= 0 ? (uint64_t)doc + 1 : tf->ndocs;
	struct token_buf t = {0};
	int rc = 0;

	for (uint64_t d = first; rc == 0 && d < last; d++) {
		uint64_t a = tf->offsets[d], n = tf->offsets[d + 1] - a;
		char *text = NULL;
		size_t len;
		if ((rc = token_buf_reserve(&t, n)) < 0)
			break;
		for (uint64_t i = 0; i < n; i++)
			t.tok[i] = tokfile_token(tf, a + i);
		if ((rc = tokenizer_decode(tk, t.tok, (size_t)n, &text, &len)) < 0)
			break;
		if (json) {
			size_t mlen;
			const char *mt = tokfile_doc_meta(tf, d, &mlen);
			json_t *meta = json_loadb(mt, mlen, 0, NULL);
			json_t *j = json_pack("{s:I,s:I,s:o,s:s%}", "doc", (json_int_t)d, "tokens",
					      (json_int_t)n, "meta", meta ? meta : json_null(), "text",
					      text, len);
			rc = cli_print_json(j, JSON_COMPACT | JSON_ENSURE_ASCII);
		} else if (fwrite(text, 1, len, stdout) != len ||
			   (doc < 0 && putchar('\n') == EOF)) {
			rc = err_errno(CORE_EIO, "<stdout>", "cannot write", errno);
		}
		free(text);
	}
	token_buf_free(&t);
	if (rc == 0 && fflush(stdout) != 0)
		rc = err_errno(CORE_EIO, "<stdout>", "cannot write", errno);
	return rc;
}

static int cmd_cat(int argc, char **argv)
{
	struct cli_parser p;
	struct tokfile tf;
	struct tokenizer *tk = NULL;
	const char *spec = NULL;
	long doc = -1;
	int json = 0, c, rc = 0;

	if ((rc = parser_init(&p, "cat", cat_tables)) != 0)
		return rc;
	while ((c = cli_next(&p, argc, argv)) != -1) {
		switch (c) {
		case 'd':
			if ((rc = cli_parse_long("--doc", optarg, 0, LONG_MAX, &doc)) < 0)
				return cli_report(prog, rc);
			break;
		case 'j': json = 1; break;
		case 't': spec = optarg; break;
		case 'h': cat_usage(stdout); return 0;
		case 'V': return version();
		default: return 2; /* CLI_BAD, reported */
		}
	}
	if (argc - optind != 1)
		return cli_usage_error(prog, "cat: expected one FILE, got %d arguments "
				       "(see %s cat --help)", argc - optind, prog);
	if ((rc = tokfile_open(&tf, argv[optind])) < 0)
		return cli_report(prog, rc);
	if (doc >= 0 && (uint64_t)doc >= tf.ndocs)
		rc = err_set(CORE_EUSAGE, tf.path, "--doc %ld: the file holds %llu documents", doc,
			     (unsigned long long)tf.ndocs);
	if (rc == 0)
		rc = tokenizer_for(spec, tf.tokenizer, tf.vocab, tf.path, 1, &tk);
	if (rc == 0)
		rc = cat_docs(&tf, tk, doc, json);
	tokenizer_close(tk);
	tokfile_close(&tf);
	return rc < 0 ? cli_report(prog, rc) : 0;
}

/* ---- tokenizer ---------------------------------------------------------------------------- */

static const struct cli_opt tok_train_opts[] = {
	{"output", 'o', 'o', CLI_ARG, "MODEL", "the model file to write (train)"},
	{"vocab", 'n', 0, CLI_ARG, "N", "pieces in the vocabulary, 260 to 1048576 (train)"},
	{"type", 'T', 0, CLI_ARG, "TYPE", "unigram (default) or bpe"},
	{"train-split", 'S', 0, CLI_FLAG, NULL, "learn only from the documents that prepare,\n"
	 "with the same --seed, --val-frac and --router-frac,\n"
	 "puts in train.tok (default: every document)"},
	{"seed", 's', 0, CLI_ARG, "N", "seed of the split and of --sample (default 0)"},
	{"val-frac", 'v', 0, CLI_ARG, "F", "as prepare's, with --train-split (default 0.02)"},
	{"router-frac", 'r', 0, CLI_ARG, "F", "as prepare's, with --train-split (default 0.005)"},
	{"sample", 'm', 0, CLI_ARG, "N", "train on at most N texts, drawn at random (default\n"
	 "0: all)"},
	{"max-len", 'L', 0, CLI_ARG, "BYTES", "cut texts into pieces of at most BYTES, after a\n"
	 "newline or space where there is one (default 4096)"},
	{"coverage", 'c', 0, CLI_ARG, "F", "share of the characters the vocabulary covers; the\n"
	 "rarest others become byte pieces (default 0.9995)"},
	{"threads", 'j', 0, CLI_ARG, "N", "the trainer's threads; the model depends on the\n"
	 "count (default 1)"},
	{"force", 'f', 0, CLI_FLAG, NULL, "replace an existing MODEL"},
	{"quiet", 'q', 'q', CLI_FLAG, NULL, "no progress line on stderr"},
	CLI_OPT_END,
};
static const struct cli_opt *const tok_tables[] = {tok_train_opts, common_opts, NULL};

static void tokenizer_usage(FILE *fp)
{
	fprintf(fp,
		"usage: %s tokenizer train -o MODEL --vocab N [options] INPUT\n"
		"       %s tokenizer info SPEC\n"
		"train: learn a SentencePiece model (unigram or BPE) of N pieces from the\n"
		"documents of INPUT (read as prepare reads it) and write it to MODEL, for\n"
		"prepare --tokenizer spm:MODEL. The model keeps every byte of the text (no\n"
		"normalisation, spaces as they are, byte pieces for what it does not cover),\n"
		"so text decodes back exactly; the same INPUT and options give the same file.\n"
		"info: the tokenizer SPEC (byte, spm:MODEL) as token files and checkpoints name\n"
		"it, and its vocabulary. Both print JSON on stdout.\n\n"
		"options:\n", prog, prog);
	cli_print_opts(fp, tok_tables);
}

static int tok_info(int argc, char **argv)
{
	struct tokenizer *tk;
	char id[TOKENIZER_ID_LEN];
	int rc;

	if (argc != 1)
		return cli_usage_error(prog, "tokenizer info: expected one SPEC, got %d arguments "
				       "(see %s tokenizer --help)", argc, prog);
	if ((rc = tokenizer_open(&tk, argv[0])) < 0)
		return cli_report(prog, rc);
	struct tokenizer_id tid = tokenizer_get_id(tk);
	tokenizer_id_str(&tid, id);
	json_t *j = json_pack("{s:s,s:s,s:i}", "spec", argv[0], "tokenizer", id, "vocab",
			      (int)tokenizer_vocab(tk));
	tokenizer_close(tk);
	return print_json(j);
}

/* train's options into *o and *out: the exit status when the command ends here, or -1. */
static int tok_train_parse(int argc, char **argv, struct corpus_tokenizer_opts *o,
			   const char **out, int *force, int *quiet)
{
	struct cli_parser p;
	int c, rc, split_opts = 0;
	long v;

	if ((rc = parser_init(&p, "tokenizer", tok_tables)) != 0)
		return rc;
	while ((c = cli_next(&p, argc, argv)) != -1) {
		switch (c) {
		case 'o': *out = optarg; break;
		case 'n':
			if ((rc = cli_parse_long("--vocab", optarg, 260, 1 << 20, &v)) < 0)
				return cli_report(prog, rc);
			o->train.vocab = (uint32_t)v;
			break;
		case 'T':
			if (strcmp(optarg, "unigram") != 0 && strcmp(optarg, "bpe") != 0)
				return cli_usage_error(prog, "option '--type': '%s' is no model type "
						       "(unigram or bpe)", optarg);
			o->train.type = optarg;
			break;
		case 'S': o->train_split = 1; break;
		case 's':
			if ((rc = cli_parse_long("--seed", optarg, 0, LONG_MAX, &v)) < 0)
				return cli_report(prog, rc);
			o->seed = (uint64_t)v;
			o->train.seed = (uint32_t)v; /* SentencePiece's seed is 32 bits */
			break;
		case 'v':
			if ((rc = cli_parse_double("--val-frac", optarg, 0, 1, &o->val_frac)) < 0)
				return cli_report(prog, rc);
			split_opts = 1;
			break;
		case 'r':
			rc = cli_parse_double("--router-frac", optarg, 0, 1, &o->router_frac);
			if (rc < 0)
				return cli_report(prog, rc);
			split_opts = 1;
			break;
		case 'm':
			if ((rc = cli_parse_long("--sample", optarg, 0, LONG_MAX, &v)) < 0)
				return cli_report(prog, rc);
			o->train.sample = (uint64_t)v;
			break;
		case 'L':
			if ((rc = cli_parse_long("--max-len", optarg, 16, 1L << 30, &v)) < 0)
				return cli_report(prog, rc);
			o->train.max_len = (uint64_t)v;
			break;
		case 'c':
			if ((rc = cli_parse_double("--coverage", optarg, 1e-6, 1,
						   &o->train.coverage)) < 0)
				return cli_report(prog, rc);
			break;
		case 'j':
			if ((rc = cli_parse_long("--threads", optarg, 1, 1024, &v)) < 0)
				return cli_report(prog, rc);
			o->train.threads = (int)v;
			break;
		case 'f': *force = 1; break;
		case 'q': *quiet = 1; break;
		case 'h': tokenizer_usage(stdout); return 0;
		case 'V': return version();
		default: return 2; /* CLI_BAD, reported */
		}
	}
	if (!*out || !o->train.vocab)
		return cli_usage_error(prog, "tokenizer train: needs --output MODEL and --vocab N "
				       "(see %s tokenizer --help)", prog);
	if (split_opts && !o->train_split)
		return cli_usage_error(prog, "tokenizer train: --val-frac and --router-frac go with "
				       "--train-split");
	if (argc - optind != 1)
		return cli_usage_error(prog, "tokenizer train: expected one INPUT, got %d "
				       "arguments (see %s tokenizer --help)", argc - optind, prog);
	o->input = argv[optind];
	return -1;
}

static int tok_train(int argc, char **argv)
{
	struct corpus_tokenizer_opts o = {
		.train = {.type = "unigram", .threads = 1, .max_len = 4096, .coverage = 0.9995},
		.val_frac = CORPUS_VAL_FRAC, .router_frac = CORPUS_ROUTER_FRAC,
	};
	struct corpus_tokenizer_result res;
	struct progress bar;
	struct stat st;
	const char *out = NULL;
	int force = 0, quiet = 0, rc;

	if ((rc = tok_train_parse(argc, argv, &o, &out, &force, &quiet)) >= 0)
		return rc;
	if (!force && lstat(out, &st) == 0)
		return cli_report(prog, err_set(CORE_EIO, out, "exists (use --force to replace "
						"it)"));
	progress_init(&bar, "read", 0);
	if (!quiet) {
		o.progress = show_progress;
		o.progress_ctx = &bar;
	}
	rc = corpus_train_tokenizer(out, &o, &res);
	progress_done(&bar);
	if (rc < 0)
		return cli_report(prog, rc);
	char id[TOKENIZER_ID_LEN];
	tokenizer_id_str(&res.id, id);
	return print_json(json_pack(
		"{s:s,s:s,s:s,s:s,s:i,s:I,s:I,s:b,s:I,s:I,s:I,s:f,s:i}", "model", out, "input",
		o.input, "tokenizer", id, "type", o.train.type, "vocab", (int)o.train.vocab, "docs",
		(json_int_t)res.docs, "bytes", (json_int_t)res.bytes, "train_split",
		o.train_split, "seed", (json_int_t)o.seed, "sample", (json_int_t)o.train.sample,
		"max_len", (json_int_t)o.train.max_len, "coverage", o.train.coverage, "threads",
		o.train.threads));
}

static int cmd_tokenizer(int argc, char **argv)
{
	if (argc >= 2 && strcmp(argv[1], "train") == 0)
		return tok_train(argc - 1, argv + 1);
	if (argc >= 2 && strcmp(argv[1], "info") == 0)
		return tok_info(argc - 2, argv + 2);
	if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
		tokenizer_usage(stdout);
		return 0;
	}
	return cli_usage_error(prog, "tokenizer: %s%s%s: train or info (see %s tokenizer "
			       "--help)", argc < 2 ? "expected a command" : "'",
			       argc < 2 ? "" : argv[1], argc < 2 ? "" : "' is no command", prog);
}

/* ---- split -------------------------------------------------------------------------------- */

_Static_assert(SHARD_MAX_PATHS == 65536, "split --help names SHARD_MAX_PATHS");

static const struct cli_opt split_random_opts[] = {
	{"random", 'r', 0, CLI_ARG, "P", "P shards, each document to one drawn at random,\n"
	 "P in [1, 65536]"},
	{"seed", 's', 0, CLI_ARG, "N", "seed of the draw (default 0)"},
	CLI_OPT_END,
};
static const struct cli_opt split_run_opts[] = {
	{"run", 'u', 0, CLI_ARG, "RUNDIR", "split for this DiPaCo run: as many shards as it has\n"
	 "paths, into RUNDIR/shards (no OUTDIR argument)"},
	{"after-phase", 'a', 0, CLI_ARG, "T", "with --run: the shards of the phases after T, into\n"
	 "RUNDIR/phase-TTTT/shards (a re-sharding; phase T done)"},
	CLI_OPT_END,
};
static const struct cli_opt split_router_opts[] = {
	{"router", 'R', 0, CLI_ARG, "FILE", "route with this document router (dpc-route(5))"},
	{"model", 'm', 'm', CLI_ARG, "FILE", "the base checkpoint the router's features come from"},
	{"features", 'F', 0, CLI_ARG, "FILE",
	 "IN.tok's features (dpc-route features), instead of -m"},
	{"top", 'k', 0, CLI_ARG, "K", "each document in its K best shards: 1 (default) or 2"},
	{"label", 'L', 0, CLI_ARG, "KEY", "the metadata field the report compares shards with\n"
	 "(default: category, else genre, when documents have it)"},
	{"batch", 'B', 'B', CLI_ARG, "N", "documents per forward when computing features (64)"},
	{"threads", 't', 't', CLI_ARG, "N", "OpenMP threads for the features"},
	CLI_OPT_END,
};
static const struct cli_opt split_out_opts[] = {
	{"force", 'f', 0, CLI_FLAG, NULL, "replace an existing split in OUTDIR"},
	{"quiet", 'q', 'q', CLI_FLAG, NULL, "no progress line on stderr"},
	CLI_OPT_END,
};
static const struct cli_opt *const split_tables[] = {
	split_random_opts, split_run_opts, split_router_opts, split_out_opts, common_opts, NULL,
};

static void split_usage(FILE *fp)
{
	fprintf(fp,
		"usage: %s split --random P [options] IN.tok OUTDIR\n"
		"       %s split --router ROUTER (-m BASE | --features F) [options] IN.tok OUTDIR\n"
		"       %s split --run RUNDIR [--after-phase T] [--router ROUTER ...] [options] "
		"IN.tok\n"
		"Divide the token file IN.tok into one shard per path, each document whole:\n"
		"OUTDIR/shard-000.tok ... and OUTDIR/shards.json, which is also printed on\n"
		"stdout as one line of JSON. --random draws each document's shard; --router\n"
		"sends it to the path a document router (dpc-route kmeans or fit) picks from\n"
		"its prefix features, or to its two best paths with --top 2, and prints a\n"
		"routing report on stderr (shard sizes, overlap, and the label-by-shard table\n"
		"with purity and NMI against random shards of the same sizes); the manifest on\n"
		"stdout then carries the report as \"report\". With --run, the shard count and\n"
		"OUTDIR come from the run directory (dpc-rundir(5)): a random split unless\n"
		"--router is given.\n\n"
		"options:\n", prog, prog, prog);
	cli_print_opts(fp, split_tables);
}

/* The routing report as text, on stderr. */
static void print_report(const json_t *r)
{
	const json_t *shards = json_object_get(r, "shards"), *lab = json_object_get(r, "labels");
	size_t i, P = json_array_size(shards);
	json_t *v;

	fprintf(stderr, "routed %lld documents with %s router '%s', top %lld:\n",
		(long long)json_integer_value(json_object_get(r, "docs")),
		json_string_value(json_object_get(r, "kind")),
		json_string_value(json_object_get(r, "router")),
		(long long)json_integer_value(json_object_get(r, "top")));
	fprintf(stderr, "  %-6s %10s %12s\n", "shard", "docs", "tokens");
	json_array_foreach(shards, i, v)
		fprintf(stderr, "  %-6zu %10lld %12lld\n", i,
			(long long)json_integer_value(json_object_get(v, "docs")),
			(long long)json_integer_value(json_object_get(v, "tokens")));
	json_array_foreach(json_object_get(r, "pairs"), i, v) {
		const json_t *ab = json_object_get(v, "shards");
		fprintf(stderr, "  shards %lld and %lld share %lld documents\n",
			(long long)json_integer_value(json_array_get(ab, 0)),
			(long long)json_integer_value(json_array_get(ab, 1)),
			(long long)json_integer_value(json_object_get(v, "docs")));
	}
	if (!json_is_object(lab))
		return;
	const json_t *names = json_object_get(lab, "labels"), *rnd;
	fprintf(stderr, "  %-16s", json_string_value(json_object_get(lab, "label")));
	for (i = 0; i < P; i++)
		fprintf(stderr, " %6zu", i);
	fputc('\n', stderr);
	json_array_foreach(json_object_get(lab, "table"), i, v) {
		size_t k;
		json_t *n;
		fprintf(stderr, "  %-16.16s", json_string_value(json_array_get(names, i)));
		json_array_foreach(v, k, n)
			fprintf(stderr, " %6lld", (long long)json_integer_value(n));
		fputc('\n', stderr);
	}
	rnd = json_object_get(lab, "random_shards");
	fprintf(stderr, "  purity %.4f (random shards of these sizes %.4f +- %.4f), NMI %.4f "
		"(random %.4f +- %.4f), ARI %.4f\n",
		json_real_value(json_object_get(lab, "purity")),
		json_real_value(json_object_get(rnd, "purity_mean")),
		json_real_value(json_object_get(rnd, "purity_sd")),
		json_real_value(json_object_get(lab, "nmi")),
		json_real_value(json_object_get(rnd, "nmi_mean")),
		json_real_value(json_object_get(rnd, "nmi_sd")),
		json_real_value(json_object_get(lab, "ari")));
}

/* --run: the run's path count as --random's P (or the router's, checked), and its folder
 * for the shards of the phases after `after`. 0, or the exit status after the report. */
static int split_into_run(const char *run, long after, struct shard_split_opts *o,
			  struct route_split_opts *ro, char *outdir, size_t n)
{
	struct rundir r;
	int rc = rundir_open(&r, run, 0);

	if (rc)
		return cli_report(prog, rc);
	const int P = r.topo.npaths;
	rc = rundir_split_dir(&r, after, outdir, n);
	rundir_close(&r);
	if (rc)
		return cli_report(prog, rc);
	if (o->paths && o->paths != (uint32_t)P)
		return cli_usage_error(prog, "split: --random %u, but run '%s' has %d paths (with "
				       "--run, leave --random out)", o->paths, run, P);
	if (ro->router)
		ro->want_paths = P;
	else
		o->paths = (uint32_t)P;
	return 0;
}

/* split's options and arguments. */
struct split_args {
	struct shard_split_opts o;
	struct route_split_opts ro;
	const char *run, *in, *outdir; /* outdir: NULL with --run */
	long after, threads;
	int quiet, seeded, batched;
};

/* Parse into *a: the exit status when the command ends here (--help, --version, a usage
 * error), or -1 to run it. */
static int split_parse(int argc, char **argv, struct split_args *a)
{
	struct cli_parser p;
	int c, rc;
	long v;

	if ((rc = parser_init(&p, "split", split_tables)) != 0)
		return rc;
	while ((c = cli_next(&p, argc, argv)) != -1) {
		switch (c) {
		case 'R':
			a->ro.router = optarg;
			break;
		case 'm':
			a->ro.model = optarg;
			break;
		case 'F':
			a->ro.features = optarg;
			break;
		case 'L':
			a->ro.label = optarg;
			break;
		case 'k':
			if ((rc = cli_parse_long("--top", optarg, 1, 2, &v)) < 0)
				return cli_report(prog, rc);
			a->o.top = (int)v;
			break;
		case 'B':
			if ((rc = cli_parse_long("--batch", optarg, 1, 4096, &v)) < 0)
				return cli_report(prog, rc);
			a->ro.batch = (int)v;
			a->batched = 1;
			break;
		case 't':
			if ((rc = cli_parse_long("--threads", optarg, 1, 4096, &a->threads)) < 0)
				return cli_report(prog, rc);
			a->batched = 1;
			break;
		case 'r':
			rc = cli_parse_long("--random", optarg, 1, SHARD_MAX_PATHS, &v);
			if (rc < 0)
				return cli_report(prog, rc);
			a->o.paths = (uint32_t)v;
			break;
		case 's':
			if ((rc = cli_parse_long("--seed", optarg, 0, LONG_MAX, &v)) < 0)
				return cli_report(prog, rc);
			a->o.seed = (uint64_t)v;
			a->seeded = 1;
			break;
		case 'u':
			a->run = optarg;
			break;
		case 'a':
			rc = cli_parse_long("--after-phase", optarg, 0, LONG_MAX, &a->after);
			if (rc < 0)
				return cli_report(prog, rc);
			break;
		case 'f':
			a->o.force = 1;
			break;
		case 'q':
			a->quiet = 1;
			break;
		case 'h':
			split_usage(stdout);
			return 0;
		case 'V':
			return version();
		default: /* CLI_BAD, reported */
			return 2;
		}
	}
	if (a->after >= 0 && !a->run)
		return cli_usage_error(prog, "split: --after-phase goes with --run");
	if (argc - optind != (a->run ? 1 : 2))
		return cli_usage_error(prog, a->run ? "split: with --run, expected IN.tok alone "
				       "(the run names OUTDIR), got %d argument%s (see %s split "
				       "--help)" : "split: expected IN.tok and OUTDIR, got %d "
				       "argument%s (see %s split --help)", argc - optind,
				       argc - optind == 1 ? "" : "s", prog);
	a->in = argv[optind];
	a->outdir = a->run ? NULL : argv[optind + 1];
	return -1;
}

/* The options that go together, once --run has set the shard count: 0, or the exit
 * status after the report. */
static int split_check(const struct split_args *a)
{
	const struct shard_split_opts *o = &a->o;
	const struct route_split_opts *ro = &a->ro;

	if (!o->paths == !ro->router)
		return cli_usage_error(prog, "split: give --random P or --router FILE (one of "
				       "them; see %s split --help)", prog);
	if (o->paths && (ro->model || ro->features || o->top || ro->label))
		return cli_usage_error(prog, "split: --model, --features, --top and --label go "
				       "with --router");
	if (ro->router && a->seeded)
		return cli_usage_error(prog, "split: --seed goes with --random (a router draws "
				       "nothing)");
	if (a->batched && !ro->model)
		return cli_usage_error(prog, "split: --batch and --threads go with --model (they "
				       "set how the features are computed)");
	if (ro->router && !ro->model == !ro->features)
		return cli_usage_error(prog, "split: --router needs the base checkpoint (--model) "
				       "or IN.tok's features (--features), one of them");
	return 0;
}

/* The split itself, a's options checked; the exit status. */
static int split_run(struct split_args *a)
{
	struct shard_split_result res;
	struct progress bar;
	int rc;

	progress_init(&bar, "split", 0);
	if (!a->quiet) {
		a->o.progress = show_progress;
		a->o.progress_ctx = &bar;
	}
	json_t *report = NULL;
	if (a->ro.router) {
		if (a->ro.model && (rc = backend_open(&a->ro.be, "cpu", &(struct backend_params){
						 .threads = (int)a->threads})) < 0)
			return cli_report(prog, rc);
		a->ro.split = a->o;
		rc = route_split(a->in, &a->ro, &res, &report);
		if (a->ro.be)
			backend_close(a->ro.be);
	} else {
		rc = shard_split_random(a->in, &a->o, &res);
	}
	progress_done(&bar);
	if (rc < 0)
		return cli_report(prog, rc);
	json_t *j = shard_manifest_json(&res);
	shard_split_result_free(&res);
	if (report) {
		if (!a->quiet)
			print_report(report);
		if (j)
			json_object_set(j, "report", report);
		json_decref(report);
	}
	/* One line: a manifest of many shards would run to pages indented. */
	return print_json_flags(j, 0);
}

static int cmd_split(int argc, char **argv)
{
	struct split_args a = {.after = -1, .ro = {.batch = 64}};
	char outdir[RUNDIR_PATH_MAX];
	int rc;

	if ((rc = split_parse(argc, argv, &a)) >= 0)
		return rc;
	if (a.run && (rc = split_into_run(a.run, a.after < 0 ? 0 : a.after, &a.o, &a.ro, outdir,
					  sizeof outdir)) != 0)
		return rc;
	if ((rc = split_check(&a)) != 0)
		return rc;
	a.o.outdir = a.run ? outdir : a.outdir;
	return split_run(&a);
}

/* ---- main --------------------------------------------------------------------------------- */

int main(int argc, char **argv)
{
	return cli_dispatch(prog, CORE_VERSION, commands, NCOMMANDS,
			    "'dpc-shard COMMAND --help' describes one command. See dpc-shard(1).\n", argc, argv);
}
