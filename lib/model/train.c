/* train.c - the training loop of dpc-train-path; see train.h for the semantics. */
#include "model/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/checkpoint.h"
#include "common/err.h"
#include "dist/dist.h"
#include "io/metrics.h"
#include "common/progress.h"
#include "common/rng.h"
#include "common/banned.h"

double train_lr(const struct train_config *t, long s)
{
	long end = t->steps;
	/* a restart splits the steps into two segments, each warmed up and decayed in full */
	if (t->restart_step > 0 && s >= t->restart_step)
		s -= t->restart_step, end -= t->restart_step;
	else if (t->restart_step > 0)
		end = t->restart_step;
	if (s < t->warmup_steps)
		return t->lr * (double)(s + 1) / (double)t->warmup_steps;
	long span = end - t->warmup_steps;
	double p = (double)(s - t->warmup_steps) / (double)(span > 1 ? span : 1);
	if (p > 1.0)
		p = 1.0;
	return t->lr * (t->min_lr_frac + (1.0 - t->min_lr_frac) * 0.5 * (1.0 + cos(M_PI * p)));
}

/* Tokens start..start+T-1 as inputs and start+1..start+T as their targets, or the labels
 * of those positions (labels not NULL). */
static void fill_window(const struct tokfile *tf, const int32_t *labels, uint64_t start, int T,
			int32_t *in, int32_t *tg)
{
	for (int t = 0; t < T; t++) {
		const uint64_t k = start + (uint64_t)t;
		in[t] = (int32_t)tokfile_token(tf, k);
		tg[t] = labels ? labels[k + 1] : (int32_t)tokfile_token(tf, k + 1);
	}
}

void train_sample_batch(const struct tokfile *tf, const int32_t *labels, uint64_t seed,
			uint64_t stream, long s, int B, int T, int32_t *inputs, int32_t *targets)
{
	uint64_t span = tf->ntokens - (uint64_t)T;

	for (int b = 0; b < B; b++) {
		uint64_t start = rng_below(seed, stream, (uint64_t)s * (uint64_t)B + (uint64_t)b, span);
		fill_window(tf, labels, start, T, inputs + (size_t)b * T, targets + (size_t)b * T);
	}
}

/* Evaluation runs this many windows per forward: enough rows (EVAL_BATCH x seq_len) to keep
 * the matrix products efficient, few enough that a model of any context fits beside the
 * training batch. */
#define EVAL_BATCH 8

int train_evaluate(struct gpt2 *g, const struct tokfile *tf, long max_tokens, double *loss,
		   long *ntokens)
{
	const int T = g->cfg.seq_len, B = g->B;
	/* Consecutive windows of T tokens from the start (window w predicts tokens wT+1 ..
	 * wT+T), as many as the file holds, at most max_tokens / T of them when max_tokens > 0. */
	uint64_t nwin = tf->ntokens > (uint64_t)T ? (tf->ntokens - 1) / (uint64_t)T : 0;
	if (max_tokens > 0 && (uint64_t)(max_tokens / T) < nwin)
		nwin = (uint64_t)(max_tokens / T);
	if (nwin == 0 && max_tokens > 0 && max_tokens < T)
		return err_set(CORE_EUSAGE, NULL, "--max-tokens %ld is less than one window of %d "
			       "tokens", max_tokens, T);
	if (nwin == 0)
		return err_set(CORE_EFORMAT, tf->path, "%llu tokens is too few to evaluate a model "
			       "of context %d", (unsigned long long)tf->ntokens, T);

	const size_t n = (size_t)B * T;
	int32_t *in = malloc(sizeof *in * n), *tg = malloc(sizeof *tg * n);
	float *l = malloc(sizeof *l * n);
	double sum = 0.0;
	long count = 0;
	int rc = 0;

	if (!in || !tg || !l) {
		rc = err_set(CORE_ENOMEM, tf->path, "out of memory for evaluation batch");
		goto out;
	}
	for (uint64_t w = 0; w < nwin; w += (uint64_t)B) {
		const int rows = nwin - w < (uint64_t)B ? (int)(nwin - w) : B;
		for (int b = 0; b < rows; b++)
			fill_window(tf, NULL, (w + (uint64_t)b) * (uint64_t)T, T, in + (size_t)b * T,
				    tg + (size_t)b * T);
		rc = gpt2_forward(g, in, tg, rows, T, NULL);
		if (!rc)
			rc = gpt2_losses(g, l);
		if (rc)
			goto out;
		/* Sum the per-position losses in double so the mean does not depend on batching. */
		for (long i = 0; i < (long)rows * T; i++)
			sum += l[i];
		count += (long)rows * T;
		if (!isfinite(sum)) {
			rc = err_set(CORE_ENAN, tf->path, "evaluation loss is not finite at token "
				     "%llu", (unsigned long long)(w * (uint64_t)T));
			goto out;
		}
	}
	*loss = sum / (double)count;
	if (ntokens)
		*ntokens = count;
out:
	free(in);
	free(tg);
	free(l);
	return rc;
}

int train_check_tokens(const struct tokfile *tf, const struct model_config *m)
{
	if (tf->vocab != (uint32_t)m->vocab_size)
		return err_set(CORE_ESHAPE, tf->path, "a vocabulary of %u, the model's is %d "
			       "(model.vocab_size: the two must be equal)", tf->vocab,
			       m->vocab_size);
	if (tokenizer_id_differ(tf->tokenizer, m->tokenizer)) {
		char a[TOKENIZER_ID_LEN], b[TOKENIZER_ID_LEN];
		tokenizer_id_str(&tf->tokenizer, a);
		tokenizer_id_str(&m->tokenizer, b);
		return err_set(CORE_EUSAGE, tf->path, "tokens of tokenizer %s, the model was "
			       "trained on tokens of %s", a, b);
	}
	return 0;
}

int train_check_data(const struct tokfile *tf, const struct model_config *m)
{
	ERR_FORWARD(train_check_tokens(tf, m));
	if (tf->ntokens < (uint64_t)m->seq_len + 1)
		return err_set(CORE_EFORMAT, tf->path, "%llu tokens is too few for context %d",
			       (unsigned long long)tf->ntokens, m->seq_len);
	return 0;
}

int train_eval_checkpoint(struct backend *be, const char *ckpt, const char *data,
			  long max_tokens, struct eval_result *r)
{
	struct ckpt_info info;
	struct tokfile tf;
	struct gpt2 g;
	int rc;

	memset(r, 0, sizeof *r);
	r->loss = NAN;
	ERR_FORWARD(ckpt_info(ckpt, &info));
	ERR_FORWARD(tokfile_open(&tf, data));
	rc = train_check_data(&tf, &info.model);
	if (!rc)
		rc = gpt2_create(&g, &info.model, EVAL_BATCH, info.model.seq_len, be);
	if (!rc) {
		rc = ckpt_load(ckpt, &g, CKPT_PARAMS, NULL);
		if (!rc)
			rc = train_evaluate(&g, &tf, max_tokens, &r->loss, &r->tokens);
		gpt2_free(&g);
	}
	tokfile_close(&tf);
	r->step = info.step;
	return rc;
}

/* What one run holds open. */
struct run {
	struct tokfile data, val;
	int have_data, have_val, have_model;
	struct gpt2 g;
	struct metrics mx;
	int32_t *in, *tg;
};

static void run_close(struct run *s)
{
	free(s->in);
	free(s->tg);
	metrics_close(&s->mx);
	if (s->have_model)
		gpt2_free(&s->g);
	if (s->have_val)
		tokfile_close(&s->val);
	if (s->have_data)
		tokfile_close(&s->data);
}

/* Open the data, build the model (fresh or from o->init_path: *step is its step), the
 * metrics and the batch buffers. */
/* A resumed run keeps the optimisation it was started with: the keys of the train section
 * that shape the updates or the data order must be the checkpoint's. What may change: steps
 * (a longer or shorter schedule, recomputed from the current step), eval_every, eval_batches,
 * checkpoint_every. */
static int resume_check(const char *path, const struct run_config *now)
{
	struct train_config was;
	ERR_FORWARD(ckpt_train_config(path, &was));
	const struct train_config *a = &was, *b = &now->train;
	struct {
		const char *key;
		double was, now;
	} k[] = {
		{"batch_size", a->batch_size, b->batch_size},
		{"lr", a->lr, b->lr},
		{"warmup_steps", (double)a->warmup_steps, (double)b->warmup_steps},
		{"min_lr_frac", a->min_lr_frac, b->min_lr_frac},
		{"restart_step", (double)a->restart_step, (double)b->restart_step},
		{"weight_decay", a->weight_decay, b->weight_decay},
		{"beta1", a->beta1, b->beta1},
		{"beta2", a->beta2, b->beta2},
		{"eps", a->eps, b->eps},
		{"grad_clip", a->grad_clip, b->grad_clip},
		{"seed", (double)a->seed, (double)b->seed},
	};
	for (size_t i = 0; i < sizeof k / sizeof k[0]; i++)
		if (k[i].was != k[i].now)
			return err_set(CORE_ECONFIG, path, "was trained with train.%s = %.9g, this run "
				       "has %.9g: a resumed run keeps its optimisation (only "
				       "train.steps, eval_every, eval_batches and checkpoint_every may "
				       "change; --init or --weights start a new run from it)", k[i].key,
				       k[i].was, k[i].now);
	return 0;
}

/* This process writes the run's files: one process, or rank 0 of several. */
static int lead(const struct train_opts *o) { return !o->dist || dist_rank(o->dist) == 0; }

static int run_open(struct run *s, const struct train_opts *o, long until, long *step)
{
	/* the model: the config's, trained on the tokenizer of the checkpoint it starts from,
	 * then on the data's */
	struct model_config m = o->cfg->model;
	const struct model_config *mc = &m;
	const int B = o->cfg->train.batch_size, T = mc->seq_len;
	const char *from = o->init_path ? o->init_path : o->weights_path;

	*step = 0;
	if (from) {
		struct ckpt_info info;
		ERR_FORWARD(ckpt_info(from, &info));
		m.tokenizer = info.model.tokenizer;
	}
	ERR_FORWARD(tokfile_open(&s->data, o->data_path));
	s->have_data = 1;
	ERR_FORWARD(train_check_data(&s->data, mc));
	if (s->data.tokenizer.kind != TOKENIZER_NONE)
		m.tokenizer = s->data.tokenizer;
	if (o->val_path) {
		ERR_FORWARD(tokfile_open(&s->val, o->val_path));
		s->have_val = 1;
		ERR_FORWARD(train_check_data(&s->val, mc));
	}
	const int W = o->dist ? dist_size(o->dist) : 1;
	if (B % W)
		return err_set(CORE_ECONFIG, NULL, "train.batch_size = %d does not split over %d "
			       "ranks (each takes batch_size / %d rows)", B, W, W);
	ERR_FORWARD(gpt2_create(&s->g, mc, B / W, T, o->be));
	s->have_model = 1;
	if (o->init_path) {
		if (o->resuming)
			ERR_FORWARD(resume_check(o->init_path, o->cfg));
		ERR_FORWARD(ckpt_load(o->init_path, &s->g, CKPT_PARAMS | CKPT_MOMENTS, step));
	} else if (o->weights_path) {
		long was;
		ERR_FORWARD(ckpt_load(o->weights_path, &s->g, CKPT_PARAMS, &was));
		*step = 0; /* the moments stay as gpt2_create made them: zero */
	} else {
		ERR_FORWARD(gpt2_init_params(&s->g, o->cfg->train.seed));
	}
	if (*step > until)
		return err_set(CORE_EUSAGE, o->init_path, "checkpoint is at step %ld, past --until "
			       "%ld", *step, until);
	if (W > 1)
		ERR_FORWARD(gpt2_distribute(&s->g, o->dist, o->moe_plan, o->moe_dict));
	/* on several ranks, rank 0 writes the metrics */
	ERR_FORWARD(metrics_open(&s->mx, lead(o) ? o->metrics_path : NULL));
	s->in = malloc(sizeof *s->in * (size_t)B * T);
	s->tg = malloc(sizeof *s->tg * (size_t)B * T);
	if (!s->in || !s->tg)
		return err_set(CORE_ENOMEM, NULL, "out of memory for the batch");
	return 0;
}

int train_step_on(struct gpt2 *g, const struct train_config *tc, const struct tokfile *data,
		  const int32_t *labels, long st, long t0, int32_t *in, int32_t *tg, float *loss,
		  float *norm, double *lr)
{
	const int B = tc->batch_size, T = g->cfg.seq_len;
	const struct adamw_config opt = {tc->beta1, tc->beta2, tc->eps, tc->weight_decay};
	int rc;

	*lr = train_lr(tc, st);
	train_sample_batch(data, labels, tc->seed, RNG_STREAM_BATCH, st, B, T, in, tg);
	*loss = NAN;
	g->gate_step = st; /* the MoE blocks' gate noise of this step (none at evaluation) */
	int row0, rows; /* on several ranks, this rank's rows of the batch */
	gpt2_dist_rows(g, B, &row0, &rows);
	rc = gpt2_forward(g, in + (size_t)row0 * T, tg + (size_t)row0 * T, rows, T, loss);
	g->gate_step = -1;
	if (rc == CORE_ENAN)
		return err_set(CORE_ENAN, data->path, "training loss is %s at step %ld",
			       isnan(*loss) ? "NaN" : "infinite", st + 1);
	ERR_FORWARD(rc);
	ERR_FORWARD(gpt2_backward(g));
	ERR_FORWARD(gpt2_grad_norm(g, norm));
	if (!isfinite(*norm))
		return err_set(CORE_ENAN, data->path, "gradient norm is not finite at step %ld",
			       st + 1);
	float scale = (tc->grad_clip > 0 && *norm > tc->grad_clip) ?
		(float)(tc->grad_clip / *norm) : 1.0f;
	return gpt2_adamw_step(g, &opt, *lr, t0 + st + 1, scale);
}

/* Step index st of the run. */
static int train_step(struct run *s, const struct train_opts *o, long st, float *loss,
		      float *norm, double *lr)
{
	return train_step_on(&s->g, &o->cfg->train, &s->data, NULL, st, 0, s->in, s->tg, loss,
			     norm, lr);
}

int train_path_run(const struct train_opts *o, struct train_result *r)
{
	const struct train_config *tc = &o->cfg->train;
	const int B = tc->batch_size, T = o->cfg->model.seq_len;
	const long until = o->until > 0 ? o->until : tc->steps;
	struct run s;
	struct progress pr;
	long step = 0;
	double timed = 0.0, eval_gemm = 0.0;
	long timed_steps = 0;
	int rc;

	memset(&s, 0, sizeof s);
	memset(r, 0, sizeof *r);
	r->val_loss = NAN;
	r->matmul_frac = NAN;
	rc = run_open(&s, o, until, &step);
	if (rc)
		goto out;
	r->start_step = r->final_step = step;

	gpt2_profile(&s.g, 1);
	progress_init(&pr, "train", until - step);
	pr.unit = "steps";
	if (!o->progress || !lead(o))
		pr.enabled = 0;
	for (long st = step; st < until; st++) {
		double t0 = now_seconds(), lr;
		float loss, norm;

		rc = train_step(&s, o, st, &loss, &norm, &lr);
		if (rc)
			goto out;
		double dt = now_seconds() - t0;
		if (st > step) {
			timed += dt;
			timed_steps++;
		} else {
			gpt2_profile(&s.g, 1); /* the first step warms caches: not in the share */
		}
		r->loss = loss;
		r->final_step = st + 1;
		if (s.g.moe) /* the objective's other part: the MoE blocks' auxiliary losses */
			rc = metrics_event(&s.mx, "train", "step", 'i', (long long)(st + 1), "loss",
					   'f', (double)loss, "aux_loss", 'f', (double)s.g.aux_loss,
					   "lr", 'f', lr, "grad_norm", 'f', (double)norm,
					   "tokens_per_s", 'f', (double)B * T / dt, NULL);
		else
			rc = metrics_event(&s.mx, "train", "step", 'i', (long long)(st + 1), "loss",
					   'f', (double)loss, "lr", 'f', lr, "grad_norm", 'f',
					   (double)norm, "tokens_per_s", 'f', (double)B * T / dt, NULL);
		for (int b = 0; rc == 0 && s.g.moe && b < s.g.cfg.n_layer; b++) {
			/* the capacity this step's routing asked for, per MoE block: the largest
			 * expert count, and that as a factor of N k / E (scripts/moe-trace.py) */
			struct gpt2_moe_step ms;
			if (!gpt2_block_is_moe(&s.g, b) || gpt2_moe_step(&s.g, b, &ms) < 0)
				continue;
			rc = metrics_event(&s.mx, "moe", "step", 'i', (long long)(st + 1), "block",
					   'i', (long long)b, "tokens", 'i', (long long)ms.tokens,
					   "experts", 'i', (long long)ms.E, "top_k", 'i',
					   (long long)ms.k, "capacity", 'i', (long long)ms.C, "need",
					   'i', (long long)ms.need, "need_factor", 'f',
					   (double)ms.need * ms.E / ((double)ms.tokens * ms.k), "dropped",
					   'i', (long long)ms.dropped, "aux_loss", 'f',
					   (double)ms.aux_loss, ms.ranks ? "ranks" : NULL, 'i',
					   (long long)ms.ranks, "r", 'i', (long long)ms.r, "d", 'i',
					   (long long)ms.d, "a2a", 's', ms.a2a, NULL);
		}
		if (rc)
			goto out;

		/* this run's steps are the bar; the line also gives the global step (a resumed run
		 * is at 21/40 when the bar says 1/20), the last validation loss and tokens/s */
		char extra[160], val[32] = "";
		if (isfinite(r->val_loss))
			snprintf(val, sizeof val, "  val %.4f", r->val_loss);
		snprintf(extra, sizeof extra, "step %ld/%ld  loss %.4f%s  %.0f tok/s", st + 1, until,
			 loss, val, (double)B * T / dt);
		progress_update(&pr, st + 1 - step, extra);

		int last = st + 1 == until;
		if (s.have_val && tc->eval_every > 0 && ((st + 1) % tc->eval_every == 0 || last)) {
			double vl, ge = gpt2_gemm_seconds(&s.g);
			rc = train_evaluate(&s.g, &s.val, tc->eval_batches * (long)B * T, &vl, NULL);
			eval_gemm += gpt2_gemm_seconds(&s.g) - ge;
			if (rc)
				goto out;
			r->val_loss = vl;
			rc = metrics_event(&s.mx, "eval", "step", 'i', (long long)(st + 1),
					   "val_loss", 'f', vl, NULL);
			if (rc)
				goto out;
		}
		if (o->out_path && (last || (tc->checkpoint_every > 0 &&
					     (st + 1) % tc->checkpoint_every == 0))) {
			/* one rank's checkpoint stands for all: they must be the same model */
			rc = gpt2_dist_agree(&s.g);
			if (!rc && lead(o))
				rc = ckpt_save(o->out_path, &s.g, o->cfg, st + 1, 1, NULL, 0);
			if (o->dist) /* every rank stops if rank 0 could not write it */
				rc = dist_agree_rc(o->dist, rc);
			if (rc)
				goto out;
		}
	}
	progress_done(&pr);
	if (timed_steps > 0) {
		r->tokens_per_s = (double)timed_steps * B * T / timed;
		r->matmul_frac = (gpt2_gemm_seconds(&s.g) - eval_gemm) / timed;
	}
	gpt2_profile(&s.g, 0);
	if (o->out_path && until == step) /* nothing to train: still leave the checkpoint */
		rc = lead(o) ? ckpt_save(o->out_path, &s.g, o->cfg, step, 1, NULL, 0) : 0;
out:
	run_close(&s);
	return rc;
}
