/* moe-bench.c - run and time one Mixture-of-Experts layer; see man/moe-bench.1.
 *
 * Thin: parse options, run the timing loops of libcore (lib/moe/moe_bench.h), print a table
 * on stderr and one JSON object per measured formulation on stdout. */
#include <getopt.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "cli/opt.h"
#include "common/err.h"
#include "common/progress.h"
#include "common/stats.h"
#include "io/trace.h"
#include "moe/moe.h"
#include "dist/dist_bench.h"
#include "dist/dist_dev.h"
#include "moe/moe_bench.h"
#include "moe/moe_bench_dist.h"
#include "moe/moe_dict.h"
#include "moe/moe_tutel.h"
#include "moe/moe_dist.h"
#include "common/banned.h"

static const char *prog = "moe-bench";

/* The keys of the long-only options (a short option's key is its letter). */
enum {
	OPT_CAPACITY_ALIGN = 256,
	OPT_BPR,
	OPT_NO_BPR,
	OPT_GATE_NOISE,
	OPT_AUX_LOSS,
	OPT_ACTIVATION,
	OPT_TRACE,
	OPT_FORWARD_ONLY,
	OPT_ONLY,
	OPT_BASELINE,
	OPT_DENSE_TOKENS,
	OPT_DRY_RUN,
	OPT_NO_INPUT_GRAD,
	OPT_DEVICE,
	OPT_R,
	OPT_D,
	OPT_A2A,
	OPT_LOCAL_SIZE,
	OPT_DICT,
	OPT_STAGE_TIMES,
	OPT_NO_OVERLAP,
	OPT_USE_2DH,
	OPT_PRECISION,
	OPT_DTYPE,
	/* Tutel's helloworld.py flags, with its meanings (struct tutel) */
	OPT_TUTEL,
	OPT_T_BATCH,
	OPT_T_NTOK,
	OPT_T_HIDDEN,
	OPT_T_NLE,
	OPT_T_TOP,
	OPT_T_CF,
	OPT_T_STEPS,
	OPT_T_OVERLAP,
	OPT_T_PTYPE,
	OPT_T_LAUX,
	OPT_T_EVAL,
	OPT_T_TENSORCORE,
	OPT_T_FP32_GATE,
	OPT_T_ALLREDUCE,
	OPT_T_EXPERT_TYPE,
	OPT_T_LOCAL_RANK,
	OPT_T_CHECKPOINT,
	OPT_SAVE,
	OPT_LOAD,
	OPT_PRINT_STEPS,
};

/* One table per section of --help. */
static const struct cli_opt shape_opts[] = {
	{"tokens", 'T', 'T', CLI_ARG, "N", "tokens per step T, per rank when distributed\n"
	 "(default 4096)"},
	{"model-dim", 'M', 'M', CLI_ARG, "N", "model dimension M (default 1024)"},
	{"hidden-dim", 'H', 'H', CLI_ARG, "N", "expert hidden dimension H (default 4096)"},
	{"experts", 'E', 'E', CLI_ARG, "N", "number of experts E, >= 1 (default 16)"},
	{"top-k", 'k', 'k', CLI_ARG, "N", "experts per token, 1..E (default 2)"},
	CLI_OPT_END,
};
static const struct cli_opt routing_opts[] = {
	{"capacity", 'c', 'c', CLI_ARG, "X", "capacity setting, as Tutel: X > 0 fixed factor,\n"
	 "C = k*int(X*ceil(T/E)); 0: smallest C that drops\n"
	 "nothing; X < 0: that, capped at k*int(|X|*ceil(T/E))\n"
	 "(default 1.0)"},
	{"capacity-align", OPT_CAPACITY_ALIGN, 0, CLI_ARG, "N",
	 "round C up to a multiple of N (default 1)"},
	{"bpr", OPT_BPR, 0, CLI_FLAG, NULL, "batch-prioritized routing (Tutel default: off)"},
	{"no-bpr", OPT_NO_BPR, 0, CLI_FLAG, NULL, "route tokens in their order (default)"},
	{"gate-noise", OPT_GATE_NOISE, 0, CLI_ARG, "S",
	 "add S/E * N(0,1) to the gate logits (default 0)"},
	{"aux-loss", OPT_AUX_LOSS, 0, CLI_ARG, "NAME",
	 "gshard (default) or load-importance (needs --gate-noise)"},
	{"activation", OPT_ACTIVATION, 0, CLI_ARG, "NAME",
	 "expert activation: relu (default) or gelu"},
	{"trace", OPT_TRACE, 0, CLI_ARG, "FILE",
	 "capacity settings, one per line, one per step, replayed\n"
	 "cyclically ('#' comments and blank lines ignored)"},
	CLI_OPT_END,
};
static const struct cli_opt measure_opts[] = {
	{"forward-only", OPT_FORWARD_ONLY, 0, CLI_FLAG, NULL, "time the forward pass only"},
	{"no-input-grad", OPT_NO_INPUT_GRAD, 0, CLI_FLAG, NULL,
	 "backward without the input gradient (as Tutel's\n"
	 "helloworld, whose input needs no gradient)"},
	{"only", OPT_ONLY, 0, CLI_ARG, "PART",
	 "layer (default: the whole layer), encode-decode (the\n"
	 "encode and decode kernels alone, next to a plain copy\n"
	 "of the same bytes) or alltoall (distributed: linear,\n"
	 "2dh and MPI_Alltoall, 1 KiB to 64 MiB per rank)"},
	{"baseline", OPT_BASELINE, 0, CLI_ARG, "KIND",
	 "sparse (default): the sparse layer alone; dense: also\n"
	 "run the dense GShard formulation on the same inputs"},
	{"dense-tokens", OPT_DENSE_TOKENS, 0, CLI_ARG, "N",
	 "run the dense baseline with N tokens instead of T (its\n"
	 "[T,E,C] tensors grow as T^2; the JSON says so)"},
	{"dry-run", OPT_DRY_RUN, 0, CLI_FLAG, NULL,
	 "print the memory each formulation would need and exit"},
	{"stage-times", OPT_STAGE_TIMES, 0, CLI_FLAG, NULL,
	 "on a device: time every stage, exchange and expert\n"
	 "GEMM (the device synchronized at each; nothing overlaps)"},
	{"iterations", 'n', 'n', CLI_ARG, "N", "timed steps (default 10)"},
	{"warmup", 'w', 'w', CLI_ARG, "N", "untimed steps first (default 2)"},
	{"seed", 's', 's', CLI_ARG, "N", "seed for parameters, inputs and gate noise (default 1)"},
	{"threads", 't', 't', CLI_ARG, "N",
	 "OpenMP and BLAS threads (default: OMP_NUM_THREADS or\n"
	 "all)"},
	{"device", OPT_DEVICE, 0, CLI_ARG, "NAME",
	 "where the layer runs: cpu (default), ref (the slow\n"
	 "reference backend), cuda (when built; under mpirun\n"
	 "one GPU per rank, exchanges on device memory, NCCL)"},
	{"precision", OPT_PRECISION, 0, CLI_ARG, "P",
	 "expert products in fp32 (default), tf32 (cuda) or\n"
	 "bf16 (cuda; cpu with oneDNN and AVX512_BF16)"},
	{"dtype", OPT_DTYPE, 0, CLI_ARG, "TYPE",
	 "rows of --only=encode-decode: fp32 (default) or bf16\n"
	 "(bfloat16 rows: the device's bfloat16 kernels)"},
	{"save", OPT_SAVE, 0, CLI_ARG, "FILE",
	 "write the layer (and the last step's input and\n"
	 "output) in Tutel's state-dict names, safetensors;\n"
	 "under mpirun each rank its shard: {rank} and {size}\n"
	 "in FILE as in Tutel's checkpoint_path"},
	{"print-steps", OPT_PRINT_STEPS, 0, CLI_FLAG, NULL,
	 "a line per timed step on stderr in the form of Tutel's\n"
	 "helloworld.py: STEP-i: loss, step_time, perf (tflops)"},
	{"load", OPT_LOAD, 0, CLI_ARG, "FILE",
	 "the layer's parameters from such a file (Tutel's names)\n"
	 "instead of the seed's"},
	{"help", 'h', 'h', CLI_FLAG, NULL, "print this help and exit"},
	{"version", 'V', 'V', CLI_FLAG, NULL, "print the version and exit"},
	CLI_OPT_END,
};
static const struct cli_opt dist_opts[] = {
	{"r", OPT_R, 0, CLI_ARG, "N", "parallelism r: 0 (data parallel) or a divisor of\n"
	 "s = ceil(W/E), the ranks per expert (default 1)"},
	{"d", OPT_D, 0, CLI_ARG, "N", "pipelining degree d: 1, 2, 4 or 8 (default 1)"},
	{"a2a", OPT_A2A, 0, CLI_ARG, "NAME", "All-to-All algorithm: linear (default), 2dh or mpi"},
	{"local-size", OPT_LOCAL_SIZE, 0, CLI_ARG, "N",
	 "ranks per node (default: from the host layout)"},
	{"dict", OPT_DICT, 0, CLI_ARG, "FILE",
	 "each step's plan from a moe-profile dictionary, then\n"
	 "every static plan on the same steps, compared"},
	{"no-overlap", OPT_NO_OVERLAP, 0, CLI_FLAG, NULL,
	 "on a device: the exchanges in order with the experts,\n"
	 "not on the second stream (what overlap saves)"},
	CLI_OPT_END,
};
/* Tutel's flags (tutel/examples/helloworld.py), with Tutel's meanings: any of them runs the
 * experiment helloworld.py would (struct tutel). Not listed in --help: its prose and
 * moe-bench(1)'s table name them. */
static const struct cli_opt tutel_opts[] = {
	{"tutel", OPT_TUTEL, 0, CLI_FLAG, NULL, NULL},
	{"batch-size", OPT_T_BATCH, 0, CLI_ARG, "N", NULL},
	{"num-tokens", OPT_T_NTOK, 0, CLI_ARG, "N", NULL},
	{"hidden-size", OPT_T_HIDDEN, 0, CLI_ARG, "N", NULL},
	{"num-local-experts", OPT_T_NLE, 0, CLI_ARG, "N", NULL},
	{"num-experts", 'E', 0, CLI_ARG, "N", NULL},
	{"top", OPT_T_TOP, 0, CLI_ARG, "N", NULL},
	{"capacity-factor", OPT_T_CF, 0, CLI_ARG, "X", NULL},
	{"num-steps", OPT_T_STEPS, 0, CLI_ARG, "N", NULL},
	{"a2a-ffn-overlap-degree", OPT_T_OVERLAP, 0, CLI_ARG, "N", NULL},
	{"use-2dh", OPT_USE_2DH, 0, CLI_FLAG, NULL, NULL},
	{"parallel-type", OPT_T_PTYPE, 0, CLI_ARG, "TYPE", NULL},
	{"l-aux-wt", OPT_T_LAUX, 0, CLI_ARG, "X", NULL},
	{"eval", OPT_T_EVAL, 0, CLI_FLAG, NULL, NULL},
	{"use-tensorcore", OPT_T_TENSORCORE, 0, CLI_FLAG, NULL, NULL},
	{"fp32-gate", OPT_T_FP32_GATE, 0, CLI_FLAG, NULL, NULL},
	{"allreduce-degree", OPT_T_ALLREDUCE, 0, CLI_ARG, "N", NULL},
	{"expert-type", OPT_T_EXPERT_TYPE, 0, CLI_ARG, "TYPE", NULL},
	{"local-rank", OPT_T_LOCAL_RANK, 0, CLI_ARG, "N", NULL},
	{"checkpoint-path", OPT_T_CHECKPOINT, 0, CLI_ARG, "FILE", NULL},
	CLI_OPT_END,
};
static const struct cli_opt *const parse_tables[] = {
	shape_opts, routing_opts, measure_opts, dist_opts, tutel_opts, NULL,
};

static void usage(FILE *f)
{
	fprintf(f,
"Usage: moe-bench [OPTION]...\n"
"       mpirun -np W moe-bench [OPTION]...\n"
"Run and time one Mixture-of-Experts layer (forward and backward) and print\n"
"a table on stderr and one JSON object per measured run on stdout. Under mpirun,\n"
"or with any option of \"Distributed\" below, the layer runs over W ranks.\n"
"\n"
"Shape:\n");
	cli_print_opts(f, (const struct cli_opt *const[]){shape_opts, NULL});
	fprintf(f, "Routing:\n");
	cli_print_opts(f, (const struct cli_opt *const[]){routing_opts, NULL});
	fprintf(f, "Measurement:\n");
	cli_print_opts(f, (const struct cli_opt *const[]){measure_opts, NULL});
	fprintf(f, "Distributed (mpirun -np W; see moe-bench(1), DISTRIBUTED RUNS):\n");
	cli_print_opts(f, (const struct cli_opt *const[]){dist_opts, NULL});
	fprintf(f,
"\n"
"Tutel's helloworld.py flags run Tutel's experiment, with its defaults, spelled\n"
"with underscores or hyphens: --batch_size (16) times --num_tokens (512) tokens\n"
"per rank, --model_dim (2048), --hidden_size (2048), --num_local_experts (2 per\n"
"rank; -n: one expert shared by n ranks), --top (2), --capacity_factor (1.0),\n"
"--num_steps (100), --a2a_ffn_overlap_degree (1), --parallel_type (adaptive:1;\n"
"data, model, adaptive:R), --use_2dh, --l_aux_wt, --eval (forward only, no gate\n"
"noise), --dtype (float32; bfloat16: bfloat16 products), --use_tensorcore (tf32\n"
"on cuda), --fp32_gate, --allreduce_degree, --expert_type (ffn), --local_rank;\n"
"--tutel alone runs helloworld.py's defaults; --print-steps prints its line per\n"
"step; --save and --load carry the layer in Tutel's state-dict names (for its\n"
"--checkpoint_path). moe-bench(1) has the table.\n"
"\n"
"For timings on virtual machines set OMP_WAIT_POLICY=active (scripts/bench-moe.sh\n"
"does): a sleeping OpenMP thread can take a whole timer tick to wake, which adds\n"
"milliseconds to every kernel.\n"
"\n"
"Exit status: 0 success, 1 runtime failure, 2 usage error (inconsistent sizes,\n"
"k > E, E < 1, malformed trace file, E neither a multiple nor a divisor of W,\n"
"a plan or dictionary that does not fit the placement).\n");
}

static const char *flops_formula =
	"useful flops per step: forward 2*T*M*E (gate) + 4*R*M*H (fc1, fc2), backward twice "
	"that (less 2*R*M*H + 2*T*M*E with --no-input-grad); R = kept (token, expert) pairs = "
	"sum_e min(n_e, C); the same count for both formulations; GFLOP/s = flops / median "
	"step time";

static json_t *num_or_null(double v)
{
	return isfinite(v) ? json_real(v) : json_null();
}
/* milliseconds; null for a time not measured (NaN: a device's exchanges unless
 * --stage-times) */
#define MS(v) num_or_null(1e3 * (v))
#define STAGE(s, f) moe_bench_stage_median(s, offsetof(struct moe_times, f))

static json_t *times_json(const struct moe_bench_samples *s)
{
	json_t *o = json_object();
	static const struct {
		const char *name;
		size_t off;
	} f[] = {
		{"gate", offsetof(struct moe_times, gate)},
		{"scan", offsetof(struct moe_times, scan)},
		{"encode", offsetof(struct moe_times, encode)},
		{"experts", offsetof(struct moe_times, experts)},
		{"decode", offsetof(struct moe_times, decode)},
		{"bwd_decode", offsetof(struct moe_times, bwd_decode)},
		{"bwd_experts", offsetof(struct moe_times, bwd_experts)},
		{"bwd_encode", offsetof(struct moe_times, bwd_encode)},
		{"bwd_gate", offsetof(struct moe_times, bwd_gate)},
		{"gemm_fwd", offsetof(struct moe_times, gemm_fwd)},
		{"gemm_bwd", offsetof(struct moe_times, gemm_bwd)},
	};
	for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
		json_object_set_new(o, f[i].name, MS(moe_bench_stage_median(s, f[i].off)));
	return o;
}

/* Tutel's flags: whether any was given, their values, which of ours were given too (ours
 * win over Tutel's defaults, and clash with Tutel's flag for the same thing), and what Tutel
 * computes for them (tutel_apply) */
struct tutel {
	int on, eval, tensorcore;
	long batch, ntok, nle, steps, overlap;
	double cf, laux;
	const char *ptype, *dtype, *etype;
	int have_T, have_M, have_H, have_E, have_k, have_c, have_n, have_r, have_d, have_prec,
	    have_batch, have_ntok, have_nle, have_top, have_cf, have_steps, have_overlap;
	long W, s, C; /* ranks, ranks per expert, Tutel's capacity (-1: the data's) */
	double gflop; /* helloworld.py's perf count: T M H 4 (1 or 3) min(k, E) / 1e9 */
};

static struct tutel *tutel_info; /* the reports' "tutel" object, when Tutel's flags ran */
static const char *save_path, *load_path; /* --save, --load: the patterns as given */

/* --print-steps: what a step's line needs (step_line) */
struct step_log {
	struct backend *be;
	int64_t T, M, B;  /* tokens, model dim, samples (Tutel's batch_size; 1 without it) */
	double gflop;     /* helloworld.py's count per step */
	double aux_wt;    /* the auxiliary loss's weight in the loss (0 at --eval) */
	int quiet;        /* a rank other than 0: Tutel's dist_print prints on rank 0 */
	float *y;         /* host copy of the step's output */
};

/* Tutel helloworld.py's line for step j: its loss is nll_loss(log_softmax(sum over M of the
 * output [B, T/B, M], over the T/B tokens), label 0), plus l_aux_wt times the auxiliary loss
 * when it trains; perf is its flop count over the step's time. */
static int step_line(void *arg, long j, double seconds, double aux, const float *y)
{
	struct step_log *l = arg;
	if (l->quiet)
		return 0;
	const int64_t N = l->T / l->B;
	ERR_FORWARD(l->be->op->download(l->be, l->y, y, sizeof(float) * (size_t)(l->T * l->M)));
	double loss = 0;
	for (int64_t b = 0; b < l->B; b++) {
		double mx = -HUGE_VAL, sum = 0, s0 = 0;
		for (int pass = 0; pass < 2; pass++)
			for (int64_t n = 0; n < N; n++) {
				const float *row = l->y + (size_t)((b * N + n) * l->M);
				double sn = 0;
				for (int64_t m = 0; m < l->M; m++)
					sn += row[m];
				if (pass == 0)
					mx = sn > mx ? sn : mx;
				else
					sum += exp(sn - mx);
				if (n == 0)
					s0 = sn;
			}
		loss += (mx + log(sum) - s0) / (double)l->B;
	}
	loss += l->aux_wt * aux;
	fprintf(stderr, "STEP-%ld: loss = %.5f, step_time = %.6f sec, perf = %.2f tflops.\n", j,
		loss, seconds, l->gflop / seconds * 1e-3);
	return 0;
}

/* path with Tutel's {rank} and {size} (checkpoint_path's pattern) put in; under more than
 * one rank the name must hold {rank}, each rank having its own shard */
static int rank_path(char *out, size_t n, const char *path, const char *opt, int q, int W)
{
	if (W > 1 && !strstr(path, "{rank}"))
		return err_set(CORE_EUSAGE, path, "option '%s': each of the %d ranks has its own shard "
			       "of the layer: put {rank} in the name (as Tutel's checkpoint_path)",
			       opt, W);
	size_t k = 0;
	for (const char *c = path; *c && k + 24 < n; ) {
		if (strncmp(c, "{rank}", 6) == 0) {
			k += (size_t)snprintf(out + k, n - k, "%d", q);
			c += 6;
		} else if (strncmp(c, "{size}", 6) == 0) {
			k += (size_t)snprintf(out + k, n - k, "%d", W);
			c += 6;
		} else {
			out[k++] = *c++;
		}
	}
	out[k] = 0;
	if (strlen(path) + 24 >= n)
		return err_set(CORE_EUSAGE, path, "option '%s': the name is longer than %zu bytes",
			       opt, n - 24);
	return 0;
}

static json_t *tutel_json(const struct tutel *t, const struct moe_config *c)
{
	return json_pack("{s:i, s:I, s:I, s:I, s:I, s:o, s:I, s:f, s:s}", "world", (int)t->W,
			 "samples", (json_int_t)c->T, "experts", (json_int_t)c->E,
			 "experts_per_rank", (json_int_t)(c->E >= t->W ? c->E / t->W : 1),
			 "ranks_per_expert", (json_int_t)t->s,
			 "capacity", t->C > 0 ? json_integer(t->C) : json_null(),
			 "capacity_alignment", (json_int_t)c->capacity_align, "gflop_per_step",
			 t->gflop, "perf_formula", "T M H 4 (1 at --eval, else 3) min(k, E) "
			 "(helloworld.py's tflops line)");
}

static json_t *base_json(const struct moe_bench_opts *o, const char *trace, const char *impl,
			 const char *only, int64_t T)
{
	const struct moe_config *c = &o->cfg;
	const char *wait = getenv("OMP_WAIT_POLICY");
	json_t *j = json_object();
	json_object_set_new(j, "impl", json_string(impl));
	json_object_set_new(j, "only", json_string(only));
	json_object_set_new(j, "device", json_string(o->be->name));
	json_object_set_new(j, "gemm_kernel", json_string(o->be->gemm_kernel));
	json_object_set_new(j, "precision",
			    json_string(backend_precision_name(o->be->precision)));
	json_object_set_new(j, "T", json_integer(T));
	json_object_set_new(j, "M", json_integer(c->M));
	json_object_set_new(j, "H", json_integer(c->H));
	json_object_set_new(j, "E", json_integer(c->E));
	json_object_set_new(j, "k", json_integer(c->k));
	if (trace)
		json_object_set_new(j, "trace", json_string(trace));
	else
		json_object_set_new(j, "capacity_setting", json_real(c->capacity_setting));
	json_object_set_new(j, "capacity_align", json_integer(c->capacity_align));
	json_object_set_new(j, "bpr", json_boolean(c->bpr));
	json_object_set_new(j, "gate_noise", json_real(c->gate_noise));
	json_object_set_new(j, "aux_loss", json_string(moe_loss_name(c->loss)));
	json_object_set_new(j, "activation", json_string(moe_act_name(c->act)));
	json_object_set_new(j, "forward_only", json_boolean(o->forward_only));
	json_object_set_new(j, "input_grad", json_boolean(!o->forward_only && o->input_grad));
	json_object_set_new(j, "threads", json_integer(o->be->threads));
	json_object_set_new(j, "omp_wait_policy", json_string(wait ? wait : "default"));
	json_object_set_new(j, "iterations", json_integer(o->iters));
	json_object_set_new(j, "warmup", json_integer(o->warmup));
	json_object_set_new(j, "seed", json_integer((json_int_t)c->seed));
	if (tutel_info) /* what Tutel computes for the flags given (tutel_apply) */
		json_object_set_new(j, "tutel", tutel_json(tutel_info, c));
	return j;
}

/* Steps' times, drops and capacities of a run with T tokens. */
static void add_step_stats(json_t *j, const struct moe_bench_opts *o,
			   const struct moe_bench_result *r)
{
	const struct moe_bench_samples *s = &r->s;
	const int64_t per_expert = (r->T + o->cfg.E - 1) / o->cfg.E, n = s->n;
	double mn, mx, md = stats_median(s->step, n, &mn, &mx);
	int64_t dsum = 0, cmin = s->C[0], cmax = s->C[0];
	for (long i = 0; i < n; i++) {
		dsum += s->dropped[i];
		cmin = s->C[i] < cmin ? s->C[i] : cmin;
		cmax = s->C[i] > cmax ? s->C[i] : cmax;
	}
	json_object_set_new(j, "step_ms", json_pack("{s:o, s:o, s:o}", "median", MS(md), "min",
						    MS(mn), "max", MS(mx)));
	json_object_set_new(j, "forward_ms", MS(stats_median(s->fwd, n, NULL, NULL)));
	if (!o->forward_only)
		json_object_set_new(j, "backward_ms", MS(stats_median(s->bwd, n, NULL, NULL)));
	json_object_set_new(j, "dropped_last", json_integer(s->dropped[n - 1]));
	json_object_set_new(j, "dropped_total", json_integer(dsum));
	json_object_set_new(j, "capacity_last", json_integer(s->C[n - 1]));
	json_object_set_new(j, "capacity_min", json_integer(cmin));
	json_object_set_new(j, "capacity_max", json_integer(cmax));
	/* What Tutel logs as the real-time capacity factor: C / (k * ceil(T / E)). */
	json_object_set_new(j, "capacity_factor_last",
			    json_real((double)s->C[n - 1] / (double)(o->cfg.k * per_expert)));
	json_object_set_new(j, "stage_ms", times_json(s));
	/* What a Tutel user reads off a step: the auxiliary loss, the share of choices dropped,
	 * each expert's load and its imbalance (max over mean; 1 is perfectly even), and with a
	 * trace the capacity of every timed step. */
	json_object_set_new(j, "aux_loss_last", num_or_null(s->aux[n - 1]));
	json_object_set_new(j, "dropped_frac", json_real((double)dsum /
							 ((double)o->cfg.k * (double)r->T * n)));
	int64_t lsum = 0, lmax = 0;
	json_t *load = json_array();
	for (int e = 0; e < s->E; e++) {
		lsum += s->load[e];
		lmax = s->load[e] > lmax ? s->load[e] : lmax;
		json_array_append_new(load, json_integer(s->load[e]));
	}
	if (lsum > 0) {
		json_object_set_new(j, "expert_load_last", load);
		json_object_set_new(j, "load_imbalance_last",
				    json_real((double)lmax * s->E / (double)lsum));
	} else {
		json_decref(load);
	}
	if (o->trace) {
		json_t *cs = json_array();
		for (long i = 0; i < n; i++)
			json_array_append_new(cs, json_integer(s->C[i]));
		json_object_set_new(j, "capacity_per_step", cs);
	}
}

static void print_table(const char *impl, const struct moe_bench_result *r, double gflops)
{
	const struct moe_bench_samples *s = &r->s;
	double mn, mx, md = stats_median(s->step, s->n, &mn, &mx);
	fprintf(stderr, "%-7s step %9.2f ms (min %.2f, max %.2f)  %8.1f GFLOP/s  %8.1f MiB  "
		"C %lld  dropped %lld\n", impl, 1e3 * md, 1e3 * mn, 1e3 * mx, gflops,
		(double)r->layer_bytes_peak / 1048576.0, (long long)s->C[s->n - 1],
		(long long)s->dropped[s->n - 1]);
	if (isnan(STAGE(s, encode)))
		fprintf(stderr, "        stages untimed: the device runs ahead (--stage-times)\n");
	else
		fprintf(stderr, "        gate %.2f  scan %.2f  encode %.2f  experts %.2f  decode "
			"%.2f | bwd decode %.2f  experts %.2f  encode %.2f  gate %.2f (ms)\n",
			1e3 * STAGE(s, gate), 1e3 * STAGE(s, scan), 1e3 * STAGE(s, encode),
			1e3 * STAGE(s, experts), 1e3 * STAGE(s, decode), 1e3 * STAGE(s, bwd_decode),
			1e3 * STAGE(s, bwd_experts), 1e3 * STAGE(s, bwd_encode),
			1e3 * STAGE(s, bwd_gate));
	int64_t lsum = 0, lmax = 0;
	for (int e = 0; e < s->E; e++) {
		lsum += s->load[e];
		lmax = s->load[e] > lmax ? s->load[e] : lmax;
	}
	if (lsum > 0 && isfinite(s->aux[s->n - 1]))
		fprintf(stderr, "        last step: aux loss %.4f, load imbalance (max/mean) %.2f, "
			"dropped %.2f%% of the choices\n", s->aux[s->n - 1],
			(double)lmax * s->E / (double)lsum,
			100.0 * (double)s->dropped[s->n - 1] / ((double)lsum));
}

/* One JSON object per run on a line of stdout; takes the reference. */
static int print_json(json_t *j)
{
	return cli_print_json(j, JSON_COMPACT);
}

static int report_layer(const struct moe_bench_opts *o, const char *trace,
			const struct moe_bench_result *r)
{
	const struct moe_config *c = &o->cfg;
	const struct moe_bench_samples *s = &r->s;
	const double md = stats_median(s->step, s->n, NULL, NULL), R = r->kept_rows_mean;
	/* Expert GEMM rate inside the layer (time inside its GEMM calls) against the plain
	 * GEMM of the expert shape. */
	const double gf = STAGE(s, gemm_fwd), gb = STAGE(s, gemm_bwd);
	const double ex_rate = gf > 0 ? 4.0 * R * c->M * c->H / gf / 1e9 : NAN;
	const double bex_rate = o->forward_only || !(gb > 0) ? NAN : (o->input_grad ? 8.0 : 6.0) *
								       R * c->M * c->H / gb / 1e9;
	json_t *j = base_json(o, trace, "sparse", "layer", c->T);
	add_step_stats(j, o, r);
	json_object_set_new(j, "flops_per_step", json_real(r->flops));
	json_object_set_new(j, "gflops", json_real(r->flops / md / 1e9));
	json_object_set_new(j, "flops_formula", json_string(flops_formula));
	json_object_set_new(j, "kept_rows_mean", json_real(R));
	json_object_set_new(j, "peak_rss_bytes", json_integer((json_int_t)peak_rss_bytes()));
	json_object_set_new(j, "layer_bytes_peak", json_integer((json_int_t)r->layer_bytes_peak));
	json_object_set_new(j, "dense_bytes_analytic",
			    json_integer((json_int_t)moe_dense_bytes(c, c->T, c->k, s->C[s->n - 1],
								     !o->forward_only)));
	json_object_set_new(j, "expert_fwd_gflops", num_or_null(ex_rate));
	if (!o->forward_only)
		json_object_set_new(j, "expert_bwd_gflops", num_or_null(bex_rate));
	json_object_set_new(j, "sgemm_gflops", json_real(r->ref_gflops));
	json_object_set_new(j, "sgemm_shape", json_pack("[I,I,I]", (json_int_t)r->ref_rows,
							(json_int_t)c->M, (json_int_t)c->H));
	json_object_set_new(j, "expert_fwd_to_sgemm", num_or_null(ex_rate / r->ref_gflops));
	if (!o->forward_only)
		json_object_set_new(j, "expert_bwd_to_sgemm",
				    num_or_null(bex_rate / r->ref_gflops));
	json_object_set_new(j, "non_gemm_ms", MS(r->nongemm_s));
	print_table("sparse", r, r->flops / md / 1e9);
	/* a rate the clock could not resolve, or a backward not run, is "-", never inf or nan */
	char fwd[32] = "-", bwd[48] = "", eff[32] = "-";
	if (isfinite(ex_rate)) {
		snprintf(fwd, sizeof fwd, "%.1f", ex_rate);
		snprintf(eff, sizeof eff, "%.2f", ex_rate / r->ref_gflops);
	}
	if (!o->forward_only)
		snprintf(bwd, sizeof bwd, isfinite(bex_rate) ? ", %.1f bwd" : ", - bwd", bex_rate);
	char ng[32] = "-";
	if (isfinite(r->nongemm_s))
		snprintf(ng, sizeof ng, "%.2f", 1e3 * r->nongemm_s);
	fprintf(stderr, "        expert GEMMs %s GFLOP/s fwd%s; plain sgemm [%lld,%lld]x[%lld,%lld] "
		"%.1f GFLOP/s (forward efficiency %s of it); non-GEMM %s ms\n", fwd, bwd,
		(long long)r->ref_rows, (long long)c->M, (long long)c->M, (long long)c->H,
		r->ref_gflops, eff, ng);
	return print_json(j);
}

static int report_encdec(const struct moe_bench_opts *o, const char *trace,
			 const struct moe_bench_result *r)
{
	const struct moe_config *c = &o->cfg;
	const struct moe_bench_samples *s = &r->s;
	const double md = stats_median(s->step, s->n, NULL, NULL), bytes = r->bytes_moved;
	const double copy_s = bytes / r->copy_gbps / 1e9;
	json_t *j = base_json(o, trace, "sparse", "encode-decode", c->T);
	add_step_stats(j, o, r);
	json_object_set_new(j, "dtype", json_string(o->bf16 ? "bf16" : "fp32"));
	json_object_set_new(j, "bytes_moved", json_real(bytes));
	json_object_set_new(j, "bytes_formula", json_string(
		"rows of M elements (fp32 4 bytes, bf16 2) read + written: encode T + E*C, decode "
		"R + T, decode backward T + R + E*C, encode backward R + T; R = kept choices"));
	json_object_set_new(j, "encdec_gbps", json_real(bytes / md / 1e9));
	json_object_set_new(j, "copy_gbps", json_real(r->copy_gbps));
	json_object_set_new(j, "copy_ms", MS(copy_s));
	json_object_set_new(j, "time_over_copy", json_real(md / copy_s));
	json_object_set_new(j, "peak_rss_bytes", json_integer((json_int_t)peak_rss_bytes()));
	json_object_set_new(j, "layer_bytes_peak", json_integer((json_int_t)r->layer_bytes_peak));
	json_object_set_new(j, "dense_bytes_analytic",
			    json_integer((json_int_t)moe_dense_bytes(c, c->T, c->k, s->C[s->n - 1],
								     !o->forward_only)));
	print_table("encdec", r, 0.0);
	fprintf(stderr, "        %.1f MB moved (%s rows): %.2f GB/s; plain copy of the same bytes "
		"%.2f GB/s (%.2f ms); time over the copy's %.2f\n", bytes / 1e6,
		o->bf16 ? "bf16" : "fp32", bytes / md / 1e9, r->copy_gbps, 1e3 * copy_s,
		md / copy_s);
	return print_json(j);
}

static int report_dense(const struct moe_bench_opts *o, const char *trace,
			const struct moe_bench_result *r)
{
	const double md = stats_median(r->s.step, r->s.n, NULL, NULL);
	json_t *j = base_json(o, trace, "dense", "layer", r->T);
	/* The dense formulation always computes the input gradient. */
	json_object_set_new(j, "input_grad", json_boolean(!o->forward_only));
	if (r->T != o->cfg.T)
		json_object_set_new(j, "note", json_string(
			"dense run with fewer tokens (--dense-tokens): its [T,E,C] tensors grow as "
			"T^2"));
	add_step_stats(j, o, r);
	json_object_set_new(j, "flops_per_step", json_real(r->flops));
	json_object_set_new(j, "gflops", json_real(r->flops / md / 1e9));
	json_object_set_new(j, "flops_formula", json_string(flops_formula));
	json_object_set_new(j, "peak_rss_bytes", json_integer((json_int_t)peak_rss_bytes()));
	json_object_set_new(j, "layer_bytes_peak", json_integer((json_int_t)r->layer_bytes_peak));
	print_table("dense", r, r->flops / md / 1e9);
	return print_json(j);
}

static int report_dry(const struct moe_bench_opts *o, const char *trace,
		      const struct moe_bench_result *r)
{
	const double below = 1.0 - (double)r->sparse_bytes / (double)r->dense_bytes;
	json_t *j = base_json(o, trace, "dry-run", "layer", o->cfg.T);
	json_object_set_new(j, "capacity", json_integer(r->C));
	json_object_set_new(j, "capacity_exact", json_boolean(r->C_exact));
	json_object_set_new(j, "data_bytes_analytic", json_integer((json_int_t)r->data_bytes));
	json_object_set_new(j, "sparse_bytes_analytic", json_integer((json_int_t)r->sparse_bytes));
	json_object_set_new(j, "dense_T", json_integer(o->dense_T));
	json_object_set_new(j, "dense_bytes_analytic", json_integer((json_int_t)r->dense_bytes));
	json_object_set_new(j, "sparse_below_dense", json_real(below));
	fprintf(stderr, "dry run: C %s%lld (%s); parameters, gradients and inputs %.1f MiB; "
		"sparse layer %.1f MiB, dense formulation %.1f MiB (T=%lld): %.1f%% below\n",
		r->C_exact ? "" : "<= ", (long long)r->C,
		r->C_exact ? "set by the capacity factor" : "depends on the routing: its bound",
		r->data_bytes / 1048576.0, r->sparse_bytes / 1048576.0, r->dense_bytes / 1048576.0,
		(long long)o->dense_T, 100.0 * below);
	return print_json(j);
}

/* Run what the options ask for and report it. */
static int run(const struct moe_bench_opts *o, const char *trace, int only_encdec, int dry,
	       int dense)
{
	struct moe_bench_data d;
	struct moe_bench_result r = {0};

	if (dry) { /* computed, nothing allocated: the question is whether it would fit */
		int rc = moe_bench_dry(o, &r);
		return rc < 0 ? rc : report_dry(o, trace, &r);
	}
	struct moe_dist_place one;
	char path[4096];
	moe_tutel_place_one(&one, &o->cfg);
	int rc = moe_bench_data_alloc(&d, o);
	if (rc == 0 && load_path && (rc = rank_path(path, sizeof path, load_path, "--load", 0,
						     1)) == 0)
		rc = moe_tutel_load(path, &o->cfg, &one, &d.p, 1);
	if (rc == 0 && only_encdec) {
		rc = moe_bench_encdec(o, &d, &r);
		if (rc == 0)
			rc = report_encdec(o, trace, &r);
	} else if (rc == 0) {
		rc = moe_bench_layer(o, &d, &r);
		if (rc == 0)
			rc = report_layer(o, trace, &r);
		if (rc == 0 && save_path &&
		    (rc = rank_path(path, sizeof path, save_path, "--save", 0, 1)) == 0)
			rc = moe_tutel_save(path, &o->cfg, &one, &d.p, 1, &(struct moe_tutel_step){
				.x = d.x, .y = d.y, .T = o->cfg.T, .step = o->warmup + o->iters - 1,
				.setting = moe_bench_setting(o, o->warmup + o->iters - 1)});
	}
	moe_bench_result_free(&r);
	if (rc == 0 && dense) {
		rc = moe_bench_dense(o, &d, &r);
		if (rc == 0)
			rc = report_dense(o, trace, &r);
		moe_bench_result_free(&r);
	}
	moe_bench_data_free(&d);
	return rc;
}


/* ---- the distributed layer (mpirun -np W moe-bench ...) ------------------------------------- */

/* Started by a launcher (mpirun, srun with PMIx): run distributed even with no option. */
static int launched(void)
{
	long rank, size;
	return dist_launcher(&rank, &size);
}

static void plan_str(char *buf, size_t n, const struct moe_plan *p)
{
	if (p->r == 0)
		snprintf(buf, n, "r=0");
	else
		snprintf(buf, n, "r=%d d=%d %s", p->r, p->d, dist_a2a_name(p->a));
}

/* At r = 0 nothing moves: d and a are shown as the layer runs them (1, linear). */
static json_t *plan_json(const struct moe_plan *p)
{
	return json_pack("{s:i, s:i, s:s}", "r", p->r, "d", p->r ? p->d : 1, "a",
			 dist_a2a_name(p->r ? p->a : DIST_A2A_LINEAR));
}

static json_t *dist_base_json(const struct moe_bench_dist_opts *o, const char *trace)
{
	const struct moe_bench_opts bo = {.cfg = o->cfg, .be = o->be,
					  .forward_only = o->forward_only,
					  .input_grad = o->input_grad, .iters = o->iters,
					  .warmup = o->warmup};
	json_t *j = base_json(&bo, trace, "dist", "layer", o->cfg.T);
	json_object_set_new(j, "W", json_integer(dist_size(o->d)));
	json_object_set_new(j, "local_size", json_integer(dist_local_size(o->d)));
	json_object_set_new(j, "local_size_from", json_string(dist_layout_source(o->d)));
	json_object_set_new(j, "tokens_per_rank", json_integer(o->cfg.T));
	return j;
}

/* Median over the n timed steps of a per-step array; NaN for a time not measured (a device's
 * exchanges and GEMMs unless --stage-times: NaN in every step alike). */
static double med(const double *v, long n)
{
	return isnan(v[0]) ? NAN : stats_median(v, n, NULL, NULL);
}

/* One run's JSON and table line (rank 0 prints; every rank builds nothing else). */
static int report_dist(const struct moe_bench_dist_opts *o, const char *trace, const char *name,
		       const struct moe_bench_dist_result *r)
{
	const long n = r->n;
	double mn, mx, md = stats_median(r->step, n, &mn, &mx);
	const double comm = med(r->comm, n), gemm = med(r->gemm, n);
	json_t *j = dist_base_json(o, trace);
	json_object_set_new(j, "run", json_string(name));
	if (o->dict)
		json_object_set_new(j, "plan", json_string("dictionary"));
	else
		json_object_set_new(j, "plan", plan_json(&o->plan));
	json_object_set_new(j, "step_ms", json_pack("{s:o, s:o, s:o}", "median", MS(md), "min",
						    MS(mn), "max", MS(mx)));
	json_object_set_new(j, "total_ms", MS(r->total));
	json_object_set_new(j, "comm_ms", MS(comm));
	json_object_set_new(j, "gemm_ms", MS(gemm));
	int64_t dsum = 0, cmin = r->C[0], cmax = r->C[0];
	json_t *per = json_array(), *cs = json_array(), *ps = json_array();
	for (long i = 0; i < n; i++) {
		dsum += r->dropped[i];
		cmin = r->C[i] < cmin ? r->C[i] : cmin;
		cmax = r->C[i] > cmax ? r->C[i] : cmax;
		json_array_append_new(per, MS(r->step[i]));
		json_array_append_new(cs, json_integer(r->C[i]));
		if (o->dict) {
			char b[48];
			plan_str(b, sizeof b, &r->plan[i]);
			json_array_append_new(ps, json_string(b));
		}
	}
	json_object_set_new(j, "step_ms_per_step", per);
	json_object_set_new(j, "capacity_per_step", cs);
	if (o->dict)
		json_object_set_new(j, "plan_per_step", ps);
	else
		json_decref(ps);
	json_object_set_new(j, "dropped_total", json_integer(dsum));
	json_object_set_new(j, "aux_loss_last", num_or_null(r->last.aux_loss));
	/* The share of the exchanges the experts hid: 1 - waited / exchanged, from the medians
	 * over steps; below 0 when this rank waited longer than its exchanges took (for a
	 * slower rank). */
	const double ce = med(r->exposed, n);
	const double hidden = comm > 0 ? 1.0 - ce / comm : NAN;
	json_object_set_new(j, "comm_exposed_ms", MS(ce));
	json_object_set_new(j, "overlap", num_or_null(hidden));
	if (o->dict)
		json_object_set_new(j, "nearest_bucket_steps", json_integer(r->nearest));
	json_object_set_new(j, "param_bytes_per_step",
			    json_real(r->stats.param_bytes_moved / (double)r->stats.steps));
	json_object_set_new(j, "token_bytes_per_step",
			    json_real(r->stats.token_bytes_moved / (double)r->stats.steps));
	json_object_set_new(j, "workspace_allocs", json_integer(r->stats.allocs));
	json_object_set_new(j, "steps_counted", json_integer(r->stats.steps));
	json_object_set_new(j, "workspace_bytes_peak", json_integer((json_int_t)r->stats.peak));
	json_object_set_new(j, "peak_rss_bytes", json_integer((json_int_t)peak_rss_bytes()));
	if (dist_rank(o->d) != 0) {
		json_decref(j);
		return 0;
	}
	char hid[64] = "";
	if (o->dict && r->nearest)
		snprintf(hid, sizeof hid, " (%ld steps took the nearest bucket)", r->nearest);
	else if (comm > 0 && o->plan.d > 1 && !o->dict)
		snprintf(hid, sizeof hid, ", %.0f%% hidden", 100.0 * hidden);
	char ex[64], gm[32];
	if (isnan(comm))
		snprintf(ex, sizeof ex, "untimed (--stage-times)");
	else
		snprintf(ex, sizeof ex, "%.2f ms", 1e3 * comm);
	if (isnan(gemm))
		snprintf(gm, sizeof gm, "untimed");
	else
		snprintf(gm, sizeof gm, "%.2f ms", 1e3 * gemm);
	fprintf(stderr, "%-22s step %8.2f ms (min %.2f, max %.2f)  total %9.1f ms  exchanges %s%s"
		"  GEMM %s  C %lld..%lld  dropped %lld\n", name, 1e3 * md, 1e3 * mn, 1e3 * mx,
		1e3 * r->total, ex, hid, gm, (long long)cmin, (long long)cmax, (long long)dsum);
	return print_json(j);
}

/* Every static plan of the placement, in order: r = 0, then each r >= 1 with every d and
 * both algorithms. */
static int static_plans(const struct moe_dist_place *pl, struct moe_plan *out, int max)
{
	static const int ds[] = {1, 2, 4, 8};
	int rs[64], nr = moe_plan_rs(pl, rs, 64), n = 0;
	for (int i = 0; i < nr; i++)
		for (int d = 0; d < (rs[i] ? 4 : 1); d++)
			for (int a = 0; a < (rs[i] ? 2 : 1) && n < max; a++)
				out[n++] = (struct moe_plan){.r = rs[i], .d = ds[d],
							     .a = (enum dist_a2a)a};
	return n;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

/* --dict: the dictionary on the trace, then every static plan on the same trace, then the
 * dictionary again (the two dictionary runs bound the run-to-run noise). */
static int run_dict(struct moe_bench_dist_opts *o, struct moe_bench_dist_data *dd,
		    const char *trace, const char *dict_path)
{
	struct moe_plan plans[160];
	const int np = static_plans(moe_dist_layer_place(dd->l), plans, 160);
	double *tot = calloc((size_t)np, sizeof(double));
	double dict_t[2] = {0, 0};
	int rc = 0, q = dist_rank(o->d);
	char name[64];

	if (!tot)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the report");
	const struct moe_dict *dict = o->dict;
	for (int i = -1; i <= np && rc == 0; i++) {
		struct moe_bench_dist_result r;
		o->dict = i < 0 || i == np ? dict : NULL;
		if (o->dict)
			snprintf(name, sizeof name, "dictionary%s", i < 0 ? "" : " (again)");
		else
			o->plan = plans[i];
		if (!o->dict)
			plan_str(name, sizeof name, &o->plan);
		rc = moe_bench_dist_run(o, dd, &r);
		if (rc == 0) {
			if (o->dict)
				dict_t[i < 0 ? 0 : 1] = r.total;
			else
				tot[i] = r.total;
			rc = report_dist(o, trace, name, &r);
		}
		moe_bench_dist_result_free(&r);
	}
	o->dict = dict;
	if (rc == 0 && q == 0) {
		int best = 0, worst = 0;
		for (int i = 1; i < np; i++) {
			best = tot[i] < tot[best] ? i : best;
			worst = tot[i] > tot[worst] ? i : worst;
		}
		double *sorted = malloc((size_t)np * sizeof(double));
		if (!sorted) {
			free(tot);
			return err_set(CORE_ENOMEM, NULL, "cannot allocate the report");
		}
		memcpy(sorted, tot, (size_t)np * sizeof(double));
		qsort(sorted, (size_t)np, sizeof(double), cmp_double);
		const double median = np % 2 ? sorted[np / 2] : 0.5 * (sorted[np / 2 - 1] +
								       sorted[np / 2]);
		free(sorted);
		const double dt = 0.5 * (dict_t[0] + dict_t[1]);
		const double noise = fabs(dict_t[0] - dict_t[1]) / dt;
		char bn[48], wn[48];
		plan_str(bn, sizeof bn, &plans[best]);
		plan_str(wn, sizeof wn, &plans[worst]);
		fprintf(stderr, "dictionary %s: %.1f ms (mean of two runs, %.1f%% apart); best "
			"static %s %.1f ms (dictionary/best %.3f), median static %.1f ms (%.3f), worst "
			"static %s %.1f ms (%.3f)\n", dict_path, 1e3 * dt, 100 * noise, bn,
			1e3 * tot[best], dt / tot[best], 1e3 * median, dt / median, wn,
			1e3 * tot[worst], dt / tot[worst]);
		json_t *j = dist_base_json(o, trace);
		json_object_set_new(j, "run", json_string("dictionary-summary"));
		json_object_set_new(j, "dict", json_string(dict_path));
		json_object_set_new(j, "dict_total_ms", json_pack("[o,o]", MS(dict_t[0]),
								  MS(dict_t[1])));
		json_object_set_new(j, "dict_noise", json_real(noise));
		json_object_set_new(j, "best_static", plan_json(&plans[best]));
		json_object_set_new(j, "best_static_total_ms", MS(tot[best]));
		json_object_set_new(j, "median_static_total_ms", MS(median));
		json_object_set_new(j, "worst_static", plan_json(&plans[worst]));
		json_object_set_new(j, "worst_static_total_ms", MS(tot[worst]));
		json_object_set_new(j, "dict_over_best", json_real(dt / tot[best]));
		json_object_set_new(j, "dict_over_median", json_real(dt / median));
		json_object_set_new(j, "dict_over_worst", json_real(dt / tot[worst]));
		json_object_set_new(j, "static_plans", json_integer(np));
		rc = print_json(j);
	}
	free(tot);
	return rc;
}

/* --only=alltoall: our Linear and 2DH against MPI_Alltoall, 1 KiB to 64 MiB per rank, on
 * the layer's layouts ([E, C, M] to [E/W, W*C, M]: E/W blocks of M-float rows). On a device
 * backend (not host_visible: cuda) Linear and 2DH run on device memory through its
 * collectives (dist_dev.h, NCCL), and MPI_Alltoall on host copies is the baseline. */
static int run_a2a(struct moe_bench_dist_opts *o)
{
	const int W = dist_size(o->d), dev = !o->be->host_visible;
	struct dist_bench_opts bo;
	struct dist_bench_row *rows = NULL;
	struct dist_dev *x = NULL;
	int n = 0, rc = 0;

	dist_bench_opts_default(&bo);
	bo.reps = (int)o->iters;
	bo.warmup = (int)o->warmup;
	bo.nblk = o->cfg.E >= W && o->cfg.E % W == 0 ? o->cfg.E / W : 1;
	bo.row_bytes = sizeof(float) * (size_t)o->cfg.M;
	if (dev) {
		rc = dist_dev_open(&x, o->d, o->be);
		if (rc == 0)
			rc = dist_bench_alltoall_dev(o->d, x, o->be, &bo, &rows, &n);
		dist_dev_close(x);
	} else {
		rc = dist_bench_alltoall(o->d, &bo, &rows, &n);
	}
	if (rc < 0)
		return rc;
	if (dist_rank(o->d) == 0) {
		fprintf(stderr, "All-to-All on W=%d ranks (nodes of %d, %s), %d block%s of %lld-byte "
			"rows per piece; median of %d, slowest rank\n", W, dist_local_size(o->d),
			dist_layout_source(o->d), bo.nblk, bo.nblk == 1 ? "" : "s",
			(long long)bo.row_bytes, bo.reps);
		if (dev)
			fprintf(stderr, "linear and 2dh on %s device memory; mpi: MPI_Alltoall on "
				"host copies (the baseline)\n", o->be->name);
		fprintf(stderr, "%12s %12s %12s %12s %10s %10s\n", "bytes/rank",
			dev ? "host mpi ms" : "mpi ms", "linear ms", "2dh ms", "lin/mpi", "2dh/mpi");
	}
	json_t *list = json_array();
	for (int i = 0; i < n; i++) {
		const struct dist_bench_row *r = &rows[i];
		const double m = r->seconds[DIST_A2A_MPI], l = r->seconds[DIST_A2A_LINEAR];
		const double h = r->seconds[DIST_A2A_2DH];
		if (dist_rank(o->d) == 0)
			fprintf(stderr, "%12zu %12.4f %12.4f %12.4f %10.3f %10.3f\n", r->bytes,
				1e3 * m, 1e3 * l, 1e3 * h, l / m, h / m);
		json_array_append_new(list, json_pack("{s:I, s:I, s:o, s:o, s:o, s:f, s:f}",
						      "bytes", (json_int_t)r->bytes, "piece",
						      (json_int_t)r->piece, "mpi_ms", MS(m),
						      "linear_ms", MS(l), "2dh_ms", MS(h),
						      "linear_over_mpi", l / m, "2dh_over_mpi", h / m));
	}
	free(rows);
	if (dist_rank(o->d) != 0) {
		json_decref(list);
		return 0;
	}
	json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:s, s:i, s:I, s:i, s:o}", "impl",
			      "dist", "only", "alltoall", "device", o->be->name, "mpi_on", "host",
			      "W", W, "local_size",
			      dist_local_size(o->d), "local_size_from", dist_layout_source(o->d),
			      "blocks", bo.nblk, "row_bytes", (json_int_t)bo.row_bytes, "reps",
			      bo.reps, "sizes", list);
	return print_json(j);
}

static int run_dist(struct moe_bench_dist_opts *o, const char *trace, const char *dict_path)
{
	struct moe_bench_dist_data dd = {0};
	struct moe_dict dict = {0};
	int rc = 0;

	if (dict_path) {
		rc = moe_dict_read(dict_path, &dict);
		if (rc == 0)
			rc = moe_dict_check(&dict, dict_path, dist_size(o->d), o->cfg.E, o->cfg.M,
					    o->cfg.H, o->cfg.k);
		/* Each rank read the file: one that could not makes all stop. */
		rc = dist_agree_rc(o->d, rc);
		if (rc < 0) {
			moe_dict_free(&dict);
			return rc;
		}
		o->dict = &dict;
	}
	const int q = dist_rank(o->d), W = dist_size(o->d);
	char path[4096], spath[4096];
	rc = save_path ? rank_path(spath, sizeof spath, save_path, "--save", q, W) : 0;
	if (rc == 0)
		rc = moe_bench_dist_data_init(&dd, o);
	if (rc == 0 && load_path && (rc = rank_path(path, sizeof path, load_path, "--load", q,
						     W)) == 0)
		rc = moe_tutel_load(path, &o->cfg, moe_dist_layer_place(dd.l), &dd.p, 0);
	rc = dist_agree_rc(o->d, rc);
	if (rc == 0 && dict_path) {
		/* Every plan of the dictionary must fit this placement before anything runs. */
		for (size_t i = 0; i < dict.n && rc == 0; i++) {
			rc = moe_plan_check(&dict.e[i].plan, moe_dist_layer_place(dd.l));
			if (rc < 0)
				rc = err_set(rc, dict_path, "bucket %lld: %s", (long long)dict.e[i].key,
					     err_detail());
		}
	} else if (rc == 0) {
		rc = moe_plan_check(&o->plan, moe_dist_layer_place(dd.l));
	}
	if (rc == 0 && dict_path) {
		rc = run_dict(o, &dd, trace, dict_path);
	} else if (rc == 0) {
		struct moe_bench_dist_result r;
		char name[64];
		plan_str(name, sizeof name, &o->plan);
		rc = moe_bench_dist_run(o, &dd, &r);
		if (rc == 0)
			rc = report_dist(o, trace, name, &r);
		moe_bench_dist_result_free(&r);
	}
	if (rc == 0 && save_path) { /* the plans move tokens differently, not the output */
		const long last = o->warmup + o->iters - 1;
		const struct moe_tutel_step st = {
			.x = dd.x, .y = dd.y, .T = o->cfg.T, .step = last,
			.setting = o->trace ? o->trace[(size_t)last % o->trace_n]
					    : o->cfg.capacity_setting};
		rc = moe_tutel_save(spath, &o->cfg, moe_dist_layer_place(dd.l), &dd.p, 0, &st);
		rc = dist_agree_rc(o->d, rc);
	}
	moe_bench_dist_data_free(&dd);
	moe_dict_free(&dict);
	return rc;
}

/* *out = the index of arg in names (NULL-terminated), else a usage error naming them. */
static int choice(const char *opt, const char *arg, const char *const *names, int *out)
{
	char list[128];
	size_t used = 0;
	for (int i = 0; names[i]; i++) {
		if (strcmp(arg, names[i]) == 0) {
			*out = i;
			return 0;
		}
		used += (size_t)snprintf(list + used, used < sizeof list ? sizeof list - used : 0,
					 "%s%s", i ? ", " : "", names[i]);
	}
	return err_set(CORE_EUSAGE, NULL, "option '%s': unknown value '%s' (%s)", opt, arg, list);
}

/* What --only runs, in the order of parts[]. */
enum { ONLY_LAYER, ONLY_ENCDEC, ONLY_ALLTOALL };

/* The command line: the layer's settings (in o.cfg once parsed) and what to run. */
struct args {
	struct moe_bench_opts o;
	long T, M, H, E, k, align, seed, dense_T, threads;
	double x, noise;
	int bpr, act, loss, only, dense, dry, precision;
	const char *trace_path, *device, *dict_path;
	long r, d, local_size;
	int a2a, distopt; /* distopt: an option of "Distributed" was given */
	int no_overlap;
	int print_steps;
	struct step_log log; /* --print-steps */
	double *trace;    /* --trace's settings, o.trace_n of them; the caller frees */
	struct tutel tu;
};

/* Option c of parse_tables, its value in optarg, into *a: 0 or a usage error. */
static int parse_option(struct args *a, int c)
{
	static const char *const parts[] = {"layer", "encode-decode", "alltoall", NULL};
	static const char *const baselines[] = {"sparse", "dense", NULL};
	static const char *const dtypes[] = {"fp32", "bf16", NULL};
	int rc = 0;

	struct tutel *t = &a->tu;
	switch (c) {
	case 'T': rc = cli_parse_long("--tokens", optarg, 1, 1L << 30, &a->T); t->have_T = 1; break;
	case 'M': rc = cli_parse_long("--model-dim", optarg, 1, 1L << 20, &a->M); t->have_M = 1; break;
	case 'H': rc = cli_parse_long("--hidden-dim", optarg, 1, 1L << 20, &a->H); t->have_H = 1; break;
	case 'E': rc = cli_parse_long("--experts", optarg, 1, 1L << 16, &a->E); t->have_E = 1; break;
	case 'k': rc = cli_parse_long("--top-k", optarg, 1, 1L << 16, &a->k); t->have_k = 1; break;
	case 'c':
		rc = cli_parse_double("--capacity", optarg, -TRACE_SETTING_MAX, TRACE_SETTING_MAX,
				      &a->x);
		t->have_c = 1;
		break;
	/* Tutel's */
	case OPT_TUTEL: t->on = 1; break;
	case OPT_T_BATCH:
		rc = cli_parse_long("--batch_size", optarg, 1, 1L << 30, &t->batch);
		t->on = t->have_batch = 1;
		break;
	case OPT_T_NTOK:
		rc = cli_parse_long("--num_tokens", optarg, 1, 1L << 30, &t->ntok);
		t->on = t->have_ntok = 1;
		break;
	case OPT_T_HIDDEN:
		rc = cli_parse_long("--hidden_size", optarg, 1, 1L << 20, &a->H);
		t->on = t->have_H = 1;
		break;
	case OPT_T_NLE:
		rc = cli_parse_long("--num_local_experts", optarg, -(1L << 16), 1L << 16, &t->nle);
		if (rc == 0 && t->nle == 0)
			rc = err_set(CORE_EUSAGE, NULL, "option '--num_local_experts': 0 experts (n > 0: "
				     "experts per rank; -n: one expert shared by n ranks)");
		t->on = t->have_nle = 1;
		break;
	case OPT_T_TOP:
		rc = cli_parse_long("--top", optarg, 1, 1L << 16, &a->k);
		t->on = t->have_top = 1;
		break;
	case OPT_T_CF:
		rc = cli_parse_double("--capacity_factor", optarg, -TRACE_SETTING_MAX,
				      TRACE_SETTING_MAX, &t->cf);
		t->on = t->have_cf = 1;
		break;
	case OPT_T_STEPS:
		rc = cli_parse_long("--num_steps", optarg, 1, 1L << 30, &t->steps);
		t->on = t->have_steps = 1;
		break;
	case OPT_T_OVERLAP:
		rc = cli_parse_long("--a2a_ffn_overlap_degree", optarg, 1, 8, &t->overlap);
		t->on = t->have_overlap = 1;
		break;
	case OPT_T_PTYPE: t->ptype = optarg; t->on = 1; break;
	case OPT_T_LAUX:
		rc = cli_parse_double("--l_aux_wt", optarg, 0.0, 1e6, &t->laux);
		t->on = 1;
		break;
	case OPT_T_EVAL: t->eval = t->on = 1; break;
	case OPT_T_TENSORCORE: t->tensorcore = t->on = 1; break;
	case OPT_T_FP32_GATE: t->on = 1; break; /* the gate is float32 here always */
	case OPT_T_ALLREDUCE: { /* helloworld.py's all-reduce of the non-expert gradients: the
				 * layer all-reduces the gate's itself */
		long v;
		rc = cli_parse_long("--allreduce_degree", optarg, -1, 1L << 20, &v);
		t->on = 1;
		break;
	}
	case OPT_T_EXPERT_TYPE: t->etype = optarg; t->on = 1; break;
	case OPT_T_LOCAL_RANK: t->on = 1; break; /* the launcher's business */
	case OPT_T_CHECKPOINT:
		rc = err_set(CORE_EUSAGE, NULL, "option '--checkpoint_path': Tutel's file is "
			     "torch.save's pickle of a model it trained; moe-bench reads no pickle "
			     "and trains nothing: --load FILE and --save FILE carry the layer in "
			     "Tutel's state-dict names (safetensors; {rank} and {size} as Tutel)");
		break;
	case OPT_SAVE: save_path = optarg; break;
	case OPT_LOAD: load_path = optarg; break;
	case OPT_PRINT_STEPS: a->print_steps = 1; break;
	case OPT_CAPACITY_ALIGN:
		rc = cli_parse_long("--capacity-align", optarg, 1, 1L << 20, &a->align);
		break;
	case OPT_BPR: a->bpr = 1; break;
	case OPT_NO_BPR: a->bpr = 0; break;
	case OPT_GATE_NOISE: rc = cli_parse_double("--gate-noise", optarg, 0.0, 1e6, &a->noise); break;
	case OPT_AUX_LOSS:
		a->loss = moe_loss_from_name(optarg);
		if (a->loss < 0)
			rc = err_set(CORE_EUSAGE, NULL, "option '--aux-loss': unknown loss '%s' (%s)",
				     optarg, moe_loss_names());
		break;
	case OPT_ACTIVATION:
		a->act = moe_act_from_name(optarg);
		if (a->act < 0)
			rc = err_set(CORE_EUSAGE, NULL, "option '--activation': unknown activation "
				     "'%s' (%s)", optarg, moe_act_names());
		break;
	case OPT_TRACE: a->trace_path = optarg; break;
	case OPT_FORWARD_ONLY: a->o.forward_only = 1; break;
	case OPT_ONLY: rc = choice("--only", optarg, parts, &a->only); break;
	case OPT_BASELINE: rc = choice("--baseline", optarg, baselines, &a->dense); break;
	case OPT_DENSE_TOKENS:
		rc = cli_parse_long("--dense-tokens", optarg, 1, 1L << 30, &a->dense_T);
		break;
	case OPT_DRY_RUN: a->dry = 1; break;
	case OPT_NO_INPUT_GRAD: a->o.input_grad = 0; break;
	case OPT_DEVICE: a->device = optarg; break;
	case OPT_PRECISION:
		rc = cli_parse_precision("--precision", optarg, &a->precision);
		t->have_prec = 1;
		break;
	case OPT_DTYPE:
		if (strncmp(optarg, "float", 5) == 0) { /* Tutel's: the model's dtype */
			t->dtype = optarg;
			t->on = 1;
		} else {
			rc = choice("--dtype", optarg, dtypes, &a->o.bf16);
		}
		break;
	case OPT_R:
		rc = cli_parse_long("--r", optarg, 0, 1L << 20, &a->r);
		a->distopt = t->have_r = 1;
		break;
	case OPT_D:
		rc = cli_parse_long("--d", optarg, 1, 8, &a->d);
		a->distopt = t->have_d = 1;
		break;
	case OPT_A2A:
		a->a2a = dist_a2a_from_name(optarg);
		if (a->a2a < 0)
			rc = err_set(CORE_EUSAGE, NULL, "option '--a2a': unknown algorithm '%s' "
				     "(linear, 2dh, mpi)", optarg);
		a->distopt = 1;
		break;
	case OPT_LOCAL_SIZE:
		rc = cli_parse_long("--local-size", optarg, 1, 1L << 20, &a->local_size);
		a->distopt = 1;
		break;
	case OPT_DICT: a->dict_path = optarg; a->distopt = 1; break;
	case OPT_STAGE_TIMES: a->o.stage_times = 1; break;
	case OPT_NO_OVERLAP: a->no_overlap = a->distopt = 1; break;
	case OPT_USE_2DH: a->a2a = DIST_A2A_2DH; a->distopt = 1; break;
	case 'n':
		rc = cli_parse_long("--iterations", optarg, 1, 1L << 30, &a->o.iters);
		t->have_n = 1;
		break;
	case 'w': rc = cli_parse_long("--warmup", optarg, 0, 1L << 30, &a->o.warmup); break;
	case 's': rc = cli_parse_long("--seed", optarg, 0, 1L << 62, &a->seed); break;
	case 't': rc = cli_parse_long("--threads", optarg, 1, 4096, &a->threads); break;
	}
	return rc;
}

/* Tutel's flags into the experiment helloworld.py runs with them (tutel/examples/
 * helloworld.py, tutel/impls/moe_layer.py, fast_dispatch.py's extract_critical): its defaults
 * where neither its flag nor ours was given, and what Tutel computes: T = batch_size x
 * num_tokens per rank; E = num_local_experts x W, or W / n ranks sharing each of them for
 * -n; top-k at most E; capacity k int(f ceil(T/E)) for f > 0, rounded up to a multiple of
 * (ranks per expert) x a2a_ffn_overlap_degree (to 128 above 256); parallel_type data is
 * r = 1, model r = ranks per expert, adaptive:R r = R clamped to 0..that; the perf line's
 * flops T M H 4 (1 at --eval, else 3) min(k, E). 0, or a usage error. */
static int tutel_apply(struct args *a)
{
	struct tutel *t = &a->tu;
	long rank = 0, W = 1;
	dist_launcher(&rank, &W);
	const struct {
		int ours, theirs;
		const char *a, *b, *what;
	} clash[] = {
		{t->have_T, t->have_batch || t->have_ntok, "-T", "--batch_size/--num_tokens",
		 "the tokens per rank"},
		{t->have_E, t->have_nle, "-E", "--num_local_experts", "the experts"},
		{t->have_k, t->have_top, "-k", "--top", "top-k"},
		{t->have_c, t->have_cf, "-c", "--capacity_factor", "the capacity"},
		{t->have_n, t->have_steps, "-n", "--num_steps", "the timed steps"},
		{t->have_d, t->have_overlap, "--d", "--a2a_ffn_overlap_degree", "the pipelining"},
		{t->have_r, t->ptype != NULL, "--r", "--parallel_type", "the parallelism"},
	};
	for (size_t i = 0; i < sizeof clash / sizeof clash[0]; i++)
		if (clash[i].ours && clash[i].theirs)
			return err_set(CORE_EUSAGE, NULL, "%s and %s both set %s: give one", clash[i].a,
				       clash[i].b, clash[i].what);
	if (t->etype && strcmp(t->etype, "ffn") != 0)
		return err_set(CORE_EUSAGE, NULL, "option '--expert_type': '%s': the experts here are "
			       "ffn (two layers with biases), Tutel's default", t->etype);
	if (!t->have_T)
		a->T = (t->have_batch ? t->batch : 16) * (t->have_ntok ? t->ntok : 512);
	if (!t->have_M)
		a->M = 2048;
	if (!t->have_H)
		a->H = 2048;
	if (!t->have_E) {
		const long n = t->have_nle ? t->nle : 2;
		if (n < 0 && W % -n)
			return err_set(CORE_EUSAGE, NULL, "option '--num_local_experts': %ld: one expert "
				       "shared by %ld ranks, and %ld ranks do not split into such groups",
				       n, -n, W);
		a->E = n > 0 ? n * W : W / -n;
	}
	if (!t->have_k)
		a->k = t->have_top ? a->k : 2;
	if (a->k > a->E) /* Tutel takes min(top, E) */
		a->k = a->E;
	if (!t->have_c)
		a->x = t->have_cf ? t->cf : 1.0;
	if (!t->have_n)
		a->o.iters = t->have_steps ? t->steps : 100;
	const long s = a->E < W ? W / a->E : 1, d = t->have_overlap ? t->overlap : a->d;
	if (!t->have_d)
		a->d = d;
	if (t->ptype) {
		long r = -1;
		if (strcmp(t->ptype, "data") == 0)
			r = 1;
		else if (strcmp(t->ptype, "model") == 0)
			r = s;
		else if (strncmp(t->ptype, "adaptive:", 9) == 0 &&
			 cli_parse_long("--parallel_type", t->ptype + 9, -(1L << 20), 1L << 20, &r) == 0)
			r = r < 0 ? 0 : r > s ? s : r;
		else
			return err_set(CORE_EUSAGE, NULL, "option '--parallel_type': '%s' is not data, "
				       "model or adaptive:R (Tutel's 'auto' chooses as it runs: here "
				       "moe-profile's dictionary does, --dict)", t->ptype);
		if (r > 0 && s % r)
			return err_set(CORE_EUSAGE, NULL, "option '--parallel_type': %s is r = %ld, not "
				       "0 or a divisor of the %ld ranks of each expert", t->ptype, r, s);
		a->r = r;
	}
	a->o.input_grad = 0; /* helloworld.py's input needs no gradient */
	if (t->eval) { /* forward only, no gate noise */
		a->o.forward_only = 1;
		a->noise = 0.0;
	}
	if (t->dtype && strcmp(t->dtype, "float32") != 0) {
		if (strcmp(t->dtype, "bfloat16") != 0)
			return err_set(CORE_EUSAGE, NULL, "option '--dtype': %s: the layer computes in "
				       "float32 (--dtype float32), with bfloat16 products on request "
				       "(--dtype bfloat16)", t->dtype);
		if (t->have_prec && a->precision != BACKEND_BF16)
			return err_set(CORE_EUSAGE, NULL, "--dtype bfloat16 and --precision %s set the "
				       "same thing: give one",
				       backend_precision_name((enum backend_precision)a->precision));
		a->precision = BACKEND_BF16;
	}
	if (t->tensorcore && strcmp(a->device, "cuda") == 0 && a->precision == BACKEND_FP32)
		a->precision = BACKEND_TF32; /* Tutel's switch acts on CUDA's matmuls only */
	a->o.aux_weight = (float)t->laux; /* helloworld.py's loss: 0 unless --l_aux_wt */
	long align = s * d;
	if (align > 256)
		align = (align + 127) / 128 * 128;
	a->align = align;
	t->W = W;
	t->s = s;
	const long spe = (a->T + a->E - 1) / a->E;
	t->C = a->x > 0 ? a->k * (long)(a->x * (double)spe) : -1;
	if (t->C > 0 && t->C % align)
		t->C += align - t->C % align;
	t->gflop = (double)a->T * (double)a->M * (double)a->H * 4.0 * (t->eval ? 1.0 : 3.0) *
		   (double)(a->k < a->E ? a->k : a->E) * 1e-9;
	tutel_info = t;
	return 0;
}

/* The command line into *a, checked as far as it can be without the ranks: the exit status
 * when the program ends here (--help, --version, a usage error), or -1 to run. */
static int parse(int argc, char **argv, struct args *a)
{
	struct cli_parser p;
	int c, rc;

	*a = (struct args){
		.o = {.iters = 10, .warmup = 2, .input_grad = 1, .aux_weight = MOE_BENCH_AUX_WEIGHT},
		.T = 4096, .M = 1024, .H = 4096, .E = 16, .k = 2, .align = 1, .seed = 1,
		.x = 1.0, .act = MOE_ACT_RELU, .loss = MOE_LOSS_GSHARD, .precision = BACKEND_FP32,
		.device = "cpu", .r = 1, .d = 1, .a2a = DIST_A2A_LINEAR,
	};
	/* --capacity_factor=2 as Tutel's argparse spells it: underscores in a long option's
	 * name read as hyphens (the value after '=' is left alone) */
	for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
		if (strncmp(argv[i], "--", 2) == 0)
			for (char *s = argv[i] + 2; *s && *s != '='; s++)
				*s = *s == '_' ? '-' : *s;
	if ((rc = cli_parser_init(&p, prog, NULL, parse_tables)) < 0)
		return cli_report(prog, rc);
	while ((c = cli_next(&p, argc, argv)) != -1) {
		if (c == 'h') {
			usage(stdout);
			return 0;
		}
		if (c == 'V') {
			printf("moe-bench %s\n", CORE_VERSION);
			return 0;
		}
		if (c == CLI_BAD)
			return 2; /* reported */
		if ((rc = parse_option(a, c)) < 0)
			return cli_report(prog, rc);
	}
	if (optind < argc)
		return cli_usage_error(prog, "unexpected argument '%s'", argv[optind]);
	if (a->tu.on && (rc = tutel_apply(a)) < 0)
		return cli_report(prog, rc);
	struct moe_config *cfg = &a->o.cfg;
	moe_config_default(cfg, a->T, a->M, a->H, (int)a->E);
	cfg->k = (int)a->k;
	cfg->capacity_setting = a->x;
	cfg->capacity_align = (int)a->align;
	cfg->bpr = a->bpr;
	cfg->gate_noise = (float)a->noise;
	cfg->act = (enum moe_act)a->act;
	cfg->loss = (enum moe_loss)a->loss;
	cfg->seed = (uint64_t)a->seed;
	if ((rc = moe_config_check(cfg)) < 0)
		return cli_report(prog, rc);
	if (a->dense_T > a->T)
		return cli_usage_error(prog, "option '--dense-tokens': %ld is above T = %ld",
				       a->dense_T, a->T);
	if (a->dense_T && !a->dense)
		return cli_usage_error(prog, "option '--dense-tokens' sizes the dense baseline: it "
				       "needs --baseline=dense");
	a->o.dense_T = a->dense_T ? a->dense_T : a->T;
	if (a->o.bf16 && (a->only != ONLY_ENCDEC || a->dry))
		return cli_usage_error(prog, "option '--dtype': bf16 is for --only=encode-decode "
				       "only (the layer computes in float)");
	if ((save_path || load_path || a->print_steps) && (a->dry || a->only != ONLY_LAYER))
		return cli_usage_error(prog, "option '%s' is for the layer's runs: not with %s",
				       save_path ? "--save" : load_path ? "--load" : "--print-steps",
				       a->dry ? "--dry-run" : a->only == ONLY_ENCDEC ?
				       "--only=encode-decode" : "--only=alltoall");
	if (a->print_steps) {
		struct step_log *l = &a->log;
		*l = (struct step_log){
			.T = cfg->T, .M = cfg->M,
			.B = a->tu.on ? (a->tu.have_batch ? a->tu.batch : 16) : 1,
			.gflop = (double)cfg->T * (double)cfg->M * (double)cfg->H * 4.0 *
				 (a->o.forward_only ? 1.0 : 3.0) * (double)cfg->k * 1e-9,
			.aux_wt = a->o.forward_only ? 0.0 : a->o.aux_weight,
			.y = malloc(sizeof(float) * (size_t)(cfg->T * cfg->M))};
		if (!l->y)
			return cli_report(prog, err_set(CORE_ENOMEM, NULL, "cannot allocate the step's "
							"output on the host"));
		a->o.hook = (struct moe_bench_hook){step_line, l};
	}
	return -1;
}

/* Over the ranks (under mpirun, with an option of "Distributed", or --only=alltoall): the
 * exit status. */
static int main_dist(struct args *a)
{
	struct backend *be = NULL;
	struct dist *world = NULL;
	int rc;

	if (a->dense || a->dry || a->only == ONLY_ENCDEC)
		return cli_usage_error(prog, "%s is single-process only: not with mpirun or --r, "
				       "--d, --a2a, --local-size, --dict", a->dense ?
				       "--baseline=dense" : a->dry ? "--dry-run" :
				       "--only=encode-decode");
	/* On a device (cuda) the layer exchanges through its collectives (dist_dev.h): Linear
	 * and 2DH; MPI's All-to-All runs on host memory only. */
	if (a->only != ONLY_ALLTOALL && a->a2a == DIST_A2A_MPI && strcmp(a->device, "cpu") != 0 &&
	    strcmp(a->device, "ref") != 0)
		return cli_usage_error(prog, "option '--a2a': mpi runs on host memory (cpu or ref), "
				       "not on '%s': use linear or 2dh", a->device);
	rc = dist_open(&world, (int)a->local_size);
	/* one GPU per rank of a node */
	if (rc == 0)
		rc = backend_open(&be, a->device, &(struct backend_params){
			.threads = (int)a->threads,
			.precision = (enum backend_precision)a->precision,
			.device = dist_rank(world) % dist_local_size(world)});
	a->log.be = be;
	a->log.quiet = world && dist_rank(world) != 0;
	if (rc == 0) {
		const struct moe_bench_opts *o = &a->o;
		struct moe_bench_dist_opts dopt = {
			.cfg = o->cfg, .be = be, .d = world, .forward_only = o->forward_only,
			.aux_weight = o->aux_weight,
			.input_grad = o->input_grad, .iters = o->iters, .warmup = o->warmup,
			.trace = o->trace, .trace_n = o->trace_n,
			.plan = {.r = (int)a->r, .d = (int)a->d, .a = (enum dist_a2a)a->a2a},
			.hook = o->hook, .stage_times = o->stage_times,
			.no_overlap = a->no_overlap,
		};
		rc = a->only == ONLY_ALLTOALL ? run_a2a(&dopt)
					      : run_dist(&dopt, a->trace_path, a->dict_path);
	}
	backend_close(be);
	int st = rc < 0 ? cli_report(prog, rc) : 0;
	/* Every rank's line is out before any rank exits non-zero (mpirun kills the rest then). */
	if (rc < 0 && world)
		dist_barrier_timeout(world, 10.0);
	dist_close(world);
	return st;
}

/* In this process: the exit status. */
static int main_local(struct args *a)
{
	struct backend *be = NULL;
	int rc;

	/* Every run is checked before the first is run: one refused after another has printed
	 * its results would leave half a report. */
	if ((rc = moe_bench_check(&a->o, a->dense && !a->dry)) < 0)
		return cli_report(prog, rc);
	rc = backend_open(&be, a->device, &(struct backend_params){
		.threads = (int)a->threads, .precision = (enum backend_precision)a->precision});
	if (rc == 0 && a->o.bf16 && !be->op->moe_encode_bf16) {
		backend_close(be);
		return cli_usage_error(prog, "option '--dtype': device '%s' has no bfloat16 encode "
				       "and decode", a->device);
	}
	if (rc == 0) {
		a->o.be = be;
		a->log.be = be;
		rc = run(&a->o, a->trace_path, a->only == ONLY_ENCDEC, a->dry, a->dense);
	}
	backend_close(be);
	return rc < 0 ? cli_report(prog, rc) : 0;
}

int main(int argc, char **argv)
{
	struct args a;
	int rc = parse(argc, argv, &a);

	if (rc >= 0)
		return rc;
	if (a.trace_path) {
		if ((rc = trace_read(a.trace_path, &a.trace, &a.o.trace_n)) < 0)
			return cli_report(prog, rc);
		a.o.trace = a.trace;
	}
	long rank = 0, size = 1;
	if (tutel_info && (!dist_launcher(&rank, &size) || rank == 0)) {
		const struct tutel *t = tutel_info;
		char cap[32] = "the data's";
		if (t->C > 0)
			snprintf(cap, sizeof cap, "%ld", t->C);
		fprintf(stderr, "tutel: world %ld, samples %ld per rank, experts %ld (%ld per rank, %ld "
			"ranks per expert), top-%ld, capacity %s (alignment %ld), %.6g GFLOP per step "
			"by helloworld.py's count\n", t->W, a.T, a.E, a.E >= t->W ? a.E / t->W : 1,
			t->s, a.k, cap, a.align, t->gflop);
	}
	rc = a.distopt || launched() || a.only == ONLY_ALLTOALL ? main_dist(&a) : main_local(&a);
	free(a.trace);
	free(a.log.y);
	return rc;
}
