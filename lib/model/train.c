/* train.c - the training loop of dpc-train-path; see train.h for the semantics. */
#include "model/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model/checkpoint.h"
#include "common/err.h"
#include "io/metrics.h"
#include "common/progress.h"
#include "common/rng.h"
#include "common/banned.h"

double train_lr(const struct train_config *t, long s)
{
	if (s < t->warmup_steps)
		return t->lr * (double)(s + 1) / (double)t->warmup_steps;
	long span = t->steps - t->warmup_steps;
	double p = (double)(s - t->warmup_steps) / (double)(span > 1 ? span : 1);
	if (p > 1.0)
		p = 1.0;
	return t->lr * (t->min_lr_frac + (1.0 - t->min_lr_frac) * 0.5 * (1.0 + cos(M_PI * p)));
}

/* Tokens start..start+T-1 as inputs and start+1..start+T as their targets. */
static void fill_window(const struct tokfile *tf, uint64_t start, int T, int32_t *in,
			int32_t *tg)
{
	for (int t = 0; t < T; t++) {
		in[t] = (int32_t)tokfile_token(tf, start + (uint64_t)t);
		tg[t] = (int32_t)tokfile_token(tf, start + (uint64_t)t + 1);
	}
}

void train_sample_batch(const struct tokfile *tf, uint64_t seed, uint64_t stream, long s, int B,
			int T, int32_t *inputs, int32_t *targets)
{
	uint64_t span = tf->ntokens - (uint64_t)T;

	for (int b = 0; b < B; b++) {
		uint64_t start = rng_below(seed, stream, (uint64_t)s * (uint64_t)B + (uint64_t)b, span);
		fill_window(tf, start, T, inputs + (size_t)b * T, targets + (size_t)b * T);
	}
}

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

	int32_t *in = malloc(sizeof *in * (size_t)B * T), *tg = malloc(sizeof *tg * (size_t)B * T);
	double sum = 0.0;
	long count = 0;
	int rc = 0;

	if (!in || !tg) {
		rc = err_set(CORE_ENOMEM, tf->path, "out of memory for evaluation batch");
		goto out;
	}
	for (uint64_t w = 0; w < nwin; w += (uint64_t)B) {
		const int rows = nwin - w < (uint64_t)B ? (int)(nwin - w) : B;
		for (int b = 0; b < rows; b++)
			fill_window(tf, (w + (uint64_t)b) * (uint64_t)T, T, in + (size_t)b * T,
				    tg + (size_t)b * T);
		float mean;
		rc = gpt2_forward(g, in, tg, rows, T, &mean);
		if (rc == CORE_ENAN)
			rc = err_set(CORE_ENAN, tf->path, "evaluation loss is not finite at token %llu",
				     (unsigned long long)(w * (uint64_t)T));
		if (rc)
			goto out;
		/* Sum the per-position losses in double so the mean does not depend on batching. */
		const float *l = gpt2_losses(g);
		for (long i = 0; i < (long)rows * T; i++)
			sum += l[i];
		count += (long)rows * T;
	}
	*loss = sum / (double)count;
	if (ntokens)
		*ntokens = count;
	if (!isfinite(*loss))
		rc = err_set(CORE_ENAN, tf->path, "evaluation loss is not finite");
out:
	free(in);
	free(tg);
	return rc;
}

static int check_data(const struct tokfile *tf, const struct model_config *m)
{
	if (tf->vocab > (uint32_t)m->vocab_size)
		return err_set(CORE_ESHAPE, tf->path, "token vocabulary %u exceeds the model's %d",
			       tf->vocab, m->vocab_size);
	if (tf->ntokens < (uint64_t)m->seq_len + 1)
		return err_set(CORE_EFORMAT, tf->path, "%llu tokens is too few for context %d",
			       (unsigned long long)tf->ntokens, m->seq_len);
	return 0;
}

int train_path_run(const struct train_opts *o, struct train_result *r)
{
	const struct train_config *tc = &o->cfg->train;
	const struct model_config *mc = &o->cfg->model;
	const struct gpt2_config gc = {mc->n_layer, mc->n_embd, mc->n_head, mc->seq_len,
				       mc->vocab_size};
	const int B = tc->batch_size, T = mc->seq_len;
	const long until = o->until > 0 ? o->until : tc->steps;
	const struct adamw_config opt = {tc->beta1, tc->beta2, tc->eps, tc->weight_decay};
	struct tokfile data = {0}, val = {0};
	int have_data = 0, have_val = 0, have_model = 0;
	struct gpt2 g;
	struct metrics mx = {0};
	struct progress pr;
	int32_t *in = NULL, *tg = NULL;
	long step = 0;
	double timed = 0.0, eval_gemm = 0.0;
	long timed_steps = 0;
	int rc;

	memset(r, 0, sizeof *r);
	r->val_loss = NAN;
	r->matmul_frac = NAN;
	rc = tokfile_open(&data, o->data_path);
	if (rc)
		goto out;
	have_data = 1;
	rc = check_data(&data, mc);
	if (rc)
		goto out;
	if (o->val_path) {
		rc = tokfile_open(&val, o->val_path);
		if (rc)
			goto out;
		have_val = 1;
		rc = check_data(&val, mc);
		if (rc)
			goto out;
	}
	rc = gpt2_create(&g, &gc, B, T);
	if (rc)
		goto out;
	have_model = 1;
	if (o->init_path) {
		rc = ckpt_load(o->init_path, &g, 1, &step);
		if (rc)
			goto out;
	} else {
		gpt2_init_params(&g, tc->seed);
	}
	r->start_step = r->final_step = step;
	if (step > until) {
		rc = err_set(CORE_EUSAGE, o->init_path, "checkpoint is at step %ld, past --until %ld",
			     step, until);
		goto out;
	}
	rc = metrics_open(&mx, o->metrics_path);
	if (rc)
		goto out;
	in = malloc(sizeof *in * (size_t)B * T);
	tg = malloc(sizeof *tg * (size_t)B * T);
	if (!in || !tg) {
		rc = err_set(CORE_ENOMEM, NULL, "out of memory for the batch");
		goto out;
	}

	gpt2_profile(&g, 1);
	progress_init(&pr, "train", until - step);
	if (!o->progress)
		pr.enabled = 0;
	for (long s = step; s < until; s++) {
		double t0 = now_seconds();
		float loss;

		train_sample_batch(&data, tc->seed, RNG_STREAM_BATCH, s, B, T, in, tg);
		loss = NAN;
		rc = gpt2_forward(&g, in, tg, B, T, &loss); /* CORE_ENAN: loss not finite */
		if (rc == CORE_ENAN)
			rc = err_set(CORE_ENAN, o->init_path ? o->init_path : o->data_path,
				     "training loss is %s at step %ld; "
				     "nothing written after step %ld", isnan(loss) ? "NaN" : "infinite",
				     s + 1, s);
		if (rc)
			goto out;
		rc = gpt2_backward(&g);
		if (rc)
			goto out;
		float norm = gpt2_grad_norm(&g);
		if (!isfinite(norm)) {
			rc = err_set(CORE_ENAN, o->data_path, "gradient norm is not finite at step %ld",
				     s + 1);
			goto out;
		}
		float scale = (tc->grad_clip > 0 && norm > tc->grad_clip) ?
			(float)(tc->grad_clip / norm) : 1.0f;
		double lr = train_lr(tc, s);
		gpt2_adamw_step(&g, &opt, lr, s + 1, scale);
		double dt = now_seconds() - t0;
		if (s > step) {
			timed += dt;
			timed_steps++;
		} else {
			gpt2_profile(&g, 1); /* the first step warms caches: not in the share */
		}
		r->loss = loss;
		r->final_step = s + 1;
		rc = metrics_event(&mx, "train", "step", 'i', (long long)(s + 1), "loss", 'f',
				   (double)loss, "lr", 'f', lr, "grad_norm", 'f', (double)norm,
				   "tokens_per_s", 'f', (double)B * T / dt, NULL);
		if (rc)
			goto out;

		char extra[64];
		snprintf(extra, sizeof extra, "loss %.4f", loss);
		progress_update(&pr, s + 1 - step, extra);

		int last = s + 1 == until;
		if (have_val && tc->eval_every > 0 && ((s + 1) % tc->eval_every == 0 || last)) {
			double vl, ge = gpt2_gemm_seconds(&g);
			rc = train_evaluate(&g, &val, tc->eval_batches * (long)B * T, &vl, NULL);
			eval_gemm += gpt2_gemm_seconds(&g) - ge;
			if (rc)
				goto out;
			r->val_loss = vl;
			rc = metrics_event(&mx, "eval", "step", 'i', (long long)(s + 1), "val_loss",
					   'f', vl, NULL);
			if (rc)
				goto out;
		}
		if (o->out_path && (last || (tc->checkpoint_every > 0 &&
					     (s + 1) % tc->checkpoint_every == 0))) {
			rc = ckpt_save(o->out_path, &g, o->cfg, s + 1, 1);
			if (rc)
				goto out;
		}
	}
	progress_done(&pr);
	if (timed_steps > 0) {
		r->tokens_per_s = (double)timed_steps * B * T / timed;
		r->matmul_frac = (gpt2_gemm_seconds(&g) - eval_gemm) / timed;
	}
	gpt2_profile(&g, 0);
	if (o->out_path && until == step) /* nothing to train: still leave the checkpoint */
		rc = ckpt_save(o->out_path, &g, o->cfg, step, 1);
out:
	free(in);
	free(tg);
	metrics_close(&mx);
	if (have_model)
		gpt2_free(&g);
	if (have_val)
		tokfile_close(&val);
	if (have_data)
		tokfile_close(&data);
	return rc;
}
