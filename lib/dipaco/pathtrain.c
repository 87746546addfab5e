/* pathtrain.c - one training task of a DiPaCo run; see pathtrain.h. */
#include "dipaco/pathtrain.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "common/progress.h"
#include "dipaco/module.h"
#include "io/metrics.h"
#include "io/tokfile.h"
#include "model/checkpoint.h"
#include "model/train.h"
#include "common/banned.h"

int pathtrain_assemble(const struct rundir *r, long phase, int p, struct gpt2 *g)
{
	const struct topology *t = &r->topo;
	struct backend *be = g->be;
	char path[RUNDIR_PATH_MAX];
	float *host = NULL;
	size_t cap = 0;
	struct tokenizer_id tok = {0};
	int rc = 0;

	for (int l = 0; l < t->nlevels && !rc; l++) {
		int m = topo_module_of(t, p, l);
		struct st_file f;
		rc = rundir_module(r, phase, m, ".safetensors", path, sizeof path);
		if (!rc)
			rc = module_open(&f, path, t, m, phase, r->config_hash, 1);
		if (rc)
			break;
		rc = module_tokenizer(&f, &tok);
		for (int i = 0; i < t->layout.n && !rc; i++) {
			if (!topo_owns(t, m, i))
				continue;
			struct tensor *v = &g->views[i], dst;
			size_t nb = tensor_nbytes(v);
			if (nb > cap) {
				free(host);
				host = malloc(nb);
				cap = host ? nb : 0;
				if (!host) {
					rc = err_set(CORE_ENOMEM, path, "out of memory");
					break;
				}
			}
			tensor_view(&dst, DT_F32, v->ndim, v->ne, host, v->name);
			rc = st_read(&f, v->name, &dst);
			for (size_t k = 0; !rc && k < nb / sizeof(float); k++)
				if (!isfinite(host[k]))
					rc = err_set(CORE_ENAN, path, "tensor '%s' holds a non-finite "
						     "value", v->name);
			if (!rc)
				rc = be->op->upload(be, v->data, host, nb);
		}
		st_close(&f);
	}
	free(host);
	if (!rc) /* modules from before the key: bytes when the vocabulary is 256 */
		g->cfg.tokenizer = tokenizer_id_known(tok, (uint32_t)g->cfg.vocab_size);
	return rc;
}

/* The moments of path p's checkpoint of phase `own`, its own AdamW state (own = t-1, or
 * with dipaco.paths_per_phase the last phase it trained in). */
static int load_moments(const struct rundir *r, long own, int p, struct gpt2 *g)
{
	char path[RUNDIR_PATH_MAX];
	struct st_file f;
	long step = 0, want = own * r->tau;

	ERR_FORWARD(rundir_path_ckpt(r, own, p, ".safetensors", path, sizeof path));
	ERR_FORWARD(pathckpt_open(&f, path, p, own, r->config_hash, &step, NULL, 0));
	st_close(&f);
	if (step != want)
		return err_set(CORE_EFORMAT, path, "is at step %ld, expected step %ld", step, want);
	return ckpt_load(path, g, CKPT_MOMENTS, NULL);
}

/* The run's fork moments (RUNDIR_FORK_MOMENTS), when init took them: their file into path
 * (else path[0] = 0) and their step into *t0 (else 0), the AdamW step every phase's bias
 * correction counts on from. */
static int fork_moments(const struct rundir *r, char *path, size_t n, long *t0)
{
	struct ckpt_info in;

	*t0 = 0;
	ERR_FORWARD(rundir_file(r, RUNDIR_FORK_MOMENTS, path, n));
	if (access(path, F_OK) != 0) {
		path[0] = '\0';
		return 0;
	}
	ERR_FORWARD(ckpt_info(path, &in));
	if (!in.has_optim)
		return err_set(CORE_EFORMAT, path, "holds no AdamW moments");
	if (!config_model_equal(&in.model, &r->cfg.model))
		return err_set(CORE_EFORMAT, path, "is a model of another shape than the run's");
	*t0 = in.step;
	return 0;
}

/* A view of tokens [from, from + n) of tf, sharing its memory. */
static struct tokfile token_slice(const struct tokfile *tf, uint64_t from, uint64_t n)
{
	struct tokfile s = *tf;
	s.tokens = (const char *)tf->tokens + from * tf->width;
	s.ntokens = n;
	s.map = NULL;
	return s;
}

/* A shard's training part and its held-out tail (the last dipaco.holdout_frac of its
 * tokens; none without early stopping), both at least T + 1 tokens: the one split of
 * training and of early stopping at evaluation. */
static int split_heldout(const struct rundir *r, const struct tokfile *tf, const char *path,
			 struct tokfile *train, struct tokfile *held)
{
	const struct dipaco_config *dc = &r->cfg.dipaco;
	const uint64_t T = (uint64_t)r->cfg.model.seq_len;
	const int holds = config_holds_out(&r->cfg);
	const uint64_t nheld = holds ? (uint64_t)((double)tf->ntokens * dc->holdout_frac) : 0;
	const uint64_t ntrain = tf->ntokens - nheld;

	if (holds && (nheld < T + 1 || ntrain < T + 1))
		return err_set(CORE_EFORMAT, path, "%llu tokens cannot be split %.3g held out with "
			       "both parts at least %llu tokens", (unsigned long long)tf->ntokens,
			       dc->holdout_frac, (unsigned long long)T + 1);
	*train = token_slice(tf, 0, ntrain);
	*held = token_slice(tf, ntrain, nheld);
	return 0;
}

/* What one task holds open. */
struct task {
	struct tokfile shard, val;
	int have_shard, have_val, have_model;
	struct gpt2 g;
	float *best;
	struct metrics mx;
	int32_t *in, *tg;
};

static void task_close(struct task *k)
{
	free(k->in);
	free(k->tg);
	metrics_close(&k->mx);
	if (k->have_model) {
		k->g.be->op->free(k->g.be, k->best);
		gpt2_free(&k->g);
	}
	if (k->have_val)
		tokfile_close(&k->val);
	if (k->have_shard)
		tokfile_close(&k->shard);
}

/* Is the output there already, whole and ours? 1 yes, 0 absent, < 0 present but bad. */
static int output_done(const struct rundir *r, const char *out, long phase, int p)
{
	struct st_file f;
	long step;

	if (access(out, F_OK) != 0)
		return errno == ENOENT ? 0 : err_errno(CORE_EIO, out, "cannot access", errno);
	int rc = pathckpt_open(&f, out, p, phase, r->config_hash, &step, NULL, 1);
	if (rc) {
		char detail[400];
		snprintf(detail, sizeof detail, "%s", err_detail());
		return err_set(rc, out, "exists but is not this task's output (%s); remove it to "
			       "train the path again", detail);
	}
	st_close(&f);
	if (step != phase * r->tau)
		return err_set(CORE_EFORMAT, out, "exists at step %ld, expected %ld; remove it to "
			       "train the path again", step, phase * r->tau);
	return 1;
}

int pathtrain_run(const struct rundir *r, long phase, int p, struct backend *be, int progress,
		  struct path_task_result *res)
{
	const struct run_config *c = &r->cfg;
	const struct train_config *tc = &c->train;
	const struct dipaco_config *dc = &c->dipaco;
	const int B = tc->batch_size, T = c->model.seq_len;
	char out[RUNDIR_PATH_MAX], mpath[RUNDIR_PATH_MAX], part[RUNDIR_PATH_MAX + 8],
		shard[RUNDIR_PATH_MAX], val[RUNDIR_PATH_MAX];
	double t0 = now_seconds();
	struct task k;
	int rc;

	memset(&k, 0, sizeof k);
	memset(res, 0, sizeof *res);
	res->heldout_loss = res->val_loss = res->train_loss = NAN;
	if (phase < 1 || phase > dc->phases)
		return err_set(CORE_EUSAGE, r->dir, "phase %ld is outside 1..%ld", phase, dc->phases);
	if (p < 0 || p >= r->topo.npaths)
		return err_set(CORE_EUSAGE, r->dir, "path %d is outside 0..%d", p,
			       r->topo.npaths - 1);
	if (r->tau < 1)
		return err_set(CORE_ECONFIG, r->dir, "the config gives 0 inner steps per phase");
	if (!pathsample_trains(&r->sample, phase, p)) {
		ERR_FORWARD(rundir_file(r, RUNDIR_SAMPLED, out, sizeof out));
		return err_set(CORE_EUSAGE, out, "phase %ld does not train path %d (it trains %d "
			       "of the %d paths, dipaco.paths_per_phase)", phase, p, r->sample.N,
			       r->sample.P);
	}
	ERR_FORWARD(rundir_path_ckpt(r, phase, p, ".safetensors", out, sizeof out));
	ERR_FORWARD(rundir_path_ckpt(r, phase, p, ".jsonl", mpath, sizeof mpath));
	snprintf(part, sizeof part, "%s.part", mpath);
	rc = output_done(r, out, phase, p);
	if (rc != 0) {
		res->skipped = rc > 0;
		return rc < 0 ? rc : 0;
	}
	ERR_FORWARD(rundir_make_phase(r, phase));
	rundir_clean_stale(out);

	/* Data: the shard, minus the held-out tail when early stopping. */
	ERR_FORWARD(rundir_shard(r, phase, p, shard, sizeof shard));
	rc = tokfile_open(&k.shard, shard);
	if (rc)
		goto out;
	k.have_shard = 1;
	rc = train_check_data(&k.shard, &c->model);
	if (rc)
		goto out;
	struct tokfile trainset, heldout;
	rc = split_heldout(r, &k.shard, shard, &trainset, &heldout);
	if (rc)
		goto out;
	const uint64_t ntrain = trainset.ntokens;
	/* the run's validation tokens: those of the shard's tokenizer */
	struct model_config shard_model = c->model;
	shard_model.tokenizer = k.shard.tokenizer;
	rc = rundir_file(r, "val.tok", val, sizeof val);
	if (!rc && access(val, F_OK) == 0) {
		rc = tokfile_open(&k.val, val);
		k.have_val = !rc;
		if (!rc)
			rc = train_check_data(&k.val, &shard_model);
	}
	if (rc)
		goto out;

	/* The model: modules of phase t-1, moments of the path's own latest checkpoint (phase
	 * t-1 unless it sat phases out), else the fork's or zero. */
	rc = gpt2_create(&k.g, &c->model, B, T, be);
	if (rc)
		goto out;
	k.have_model = 1;
	rc = pathtrain_assemble(r, phase - 1, p, &k.g);
	/* the modules were trained on (or start from a checkpoint of) the shard's tokenizer;
	 * the path's checkpoint records it */
	if (!rc)
		rc = train_check_tokens(&k.shard, &k.g.cfg);
	if (!rc && k.shard.tokenizer.kind != TOKENIZER_NONE)
		k.g.cfg.tokenizer = k.shard.tokenizer;
	char fork[RUNDIR_PATH_MAX];
	long adam_t0 = 0;
	const long own = pathsample_last(&r->sample, phase, p);
	if (!rc)
		rc = fork_moments(r, fork, sizeof fork, &adam_t0);
	if (!rc && own > 0)
		rc = load_moments(r, own, p, &k.g);
	else if (!rc && fork[0])
		rc = ckpt_load(fork, &k.g, CKPT_MOMENTS, NULL);
	if (rc)
		goto out;
	/* Batches and the learning rate follow the global step, but the bias correction counts
	 * the steps these moments took: none in the phases the path sat out. */
	adam_t0 -= (phase - 1 - own) * r->tau;
	if (dc->early_stop_every > 0) {
		rc = be->op->alloc(be, (void **)&k.best, sizeof(float) * k.g.nparams);
		if (rc)
			goto out;
	}
	k.in = malloc(sizeof *k.in * (size_t)B * T);
	k.tg = malloc(sizeof *k.tg * (size_t)B * T);
	if (!k.in || !k.tg) {
		rc = err_set(CORE_ENOMEM, NULL, "out of memory for the batch");
		goto out;
	}
	unlink(part);
	rc = metrics_open(&k.mx, part);
	if (rc)
		goto out;

	const long first = (phase - 1) * r->tau, last = phase * r->tau;
	const long eval_tokens = tc->eval_batches * (long)B * T;
	struct progress pr;
	char label[48];
	double best = INFINITY, timed = 0.0;
	snprintf(label, sizeof label, "phase %ld path %d", phase, p);
	progress_init(&pr, label, last - first);
	if (!progress)
		pr.enabled = 0;
	res->first_step = first;
	res->best_step = last;
	for (long st = first; st < last; st++) {
		double ts = now_seconds(), lr;
		float loss, norm;
		rc = train_step_on(&k.g, tc, &trainset, NULL, st, adam_t0, k.in, k.tg, &loss, &norm, &lr);
		if (rc)
			goto out;
		double dt = now_seconds() - ts;
		timed += dt;
		res->train_loss = loss;
		rc = metrics_event(&k.mx, "train", "phase", 'i', (long long)phase, "path", 'i',
				   (long long)p, "step", 'i', (long long)(st + 1), "loss", 'f',
				   (double)loss, "lr", 'f', lr, "grad_norm", 'f', (double)norm,
				   "tokens_per_s", 'f', (double)B * T / dt, NULL);
		if (rc)
			goto out;
		char extra[64];
		snprintf(extra, sizeof extra, "loss %.4f", loss);
		progress_update(&pr, st + 1 - first, extra);
		long done = st + 1 - first;
		if (dc->early_stop_every > 0 && (done % dc->early_stop_every == 0 || st + 1 == last)) {
			double hl;
			double te = now_seconds();
			rc = train_evaluate(&k.g, &heldout, eval_tokens, &hl, NULL);
			res->eval_seconds += now_seconds() - te;
			if (!rc)
				rc = metrics_event(&k.mx, "heldout", "phase", 'i', (long long)phase,
						   "path", 'i', (long long)p, "step", 'i',
						   (long long)(st + 1), "loss", 'f', hl, NULL);
			if (rc)
				goto out;
			if (hl < best) {
				best = hl;
				res->best_step = st + 1;
				rc = be->op->copy(be, k.best, k.g.params,
						  sizeof(float) * k.g.nparams);
				if (rc)
					goto out;
			}
		}
	}
	progress_done(&pr);
	res->last_step = last;
	res->train_seconds = timed;
	res->tokens_per_s = timed > 0 ? (double)(last - first) * B * T / timed : NAN;
	if (dc->early_stop_every > 0) {
		res->heldout_loss = best;
		if (res->best_step != last)
			rc = be->op->copy(be, k.g.params, k.best, sizeof(float) * k.g.nparams);
		if (rc)
			goto out;
	} else if (dc->holdout) { /* the validation set's loss of what is published */
		double te = now_seconds();
		rc = train_evaluate(&k.g, &heldout, eval_tokens, &res->heldout_loss, NULL);
		res->eval_seconds += now_seconds() - te;
		if (rc)
			goto out;
	}
	if (k.have_val) {
		double te = now_seconds();
		rc = train_evaluate(&k.g, &k.val, eval_tokens, &res->val_loss, NULL);
		res->eval_seconds += now_seconds() - te;
		if (rc)
			goto out;
	}
	res->seconds = now_seconds() - t0;
	rc = metrics_event(&k.mx, "path", "phase", 'i', (long long)phase, "path", 'i',
			   (long long)p, "step", 'i', (long long)last, "best_step", 'i',
			   (long long)res->best_step, "train_loss", 'f', res->train_loss,
			   "heldout_loss", 'f', res->heldout_loss, "val_loss", 'f', res->val_loss,
			   "tokens_per_s", 'f', res->tokens_per_s, "train_seconds", 'f', timed,
			   "eval_seconds", 'f', res->eval_seconds, "seconds", 'f', res->seconds, NULL);
	metrics_close(&k.mx);
	/* Metrics first: a task is done when its checkpoint exists, and a rerun of a task
	 * killed between the two renames rewrites both. */
	if (!rc && rename(part, mpath) != 0)
		rc = err_errno(CORE_EIO, mpath, "cannot rename the metrics into place", errno);
	char sphase[32], spath[16], stok[32], sbest[32];
	snprintf(sphase, sizeof sphase, "%ld", phase);
	snprintf(spath, sizeof spath, "%d", p);
	snprintf(stok, sizeof stok, "%llu", (unsigned long long)ntrain);
	snprintf(sbest, sizeof sbest, "%ld", res->best_step);
	const struct st_kv extra[] = {{"phase", sphase}, {"path", spath}, {"shard_tokens", stok},
				      {"best_step", sbest}};
	if (!rc)
		rc = ckpt_save(out, &k.g, c, last, 1, extra, 4);
out:
	task_close(&k);
	if (rc)
		unlink(part);
	return rc;
}

int pathtrain_best_phase(const struct rundir *r, long last, int p, struct backend *be,
			 double *losses, long *best)
{
	const struct run_config *c = &r->cfg;
	const struct dipaco_config *dc = &c->dipaco;
	const int B = c->train.batch_size, T = c->model.seq_len;
	char shard[RUNDIR_PATH_MAX];
	struct tokfile tf;
	struct gpt2 g;
	double low = INFINITY;
	int rc;

	if (!config_holds_out(c))
		return err_set(CORE_EUSAGE, r->dir, "holds no validation set out of its shards "
			       "(dipaco.holdout is false and dipaco.early_stop_every 0): there is "
			       "nothing to stop early on");
	if (last < 1 || last > dc->phases)
		return err_set(CORE_EUSAGE, r->dir, "phase %ld is outside 1..%ld", last, dc->phases);
	ERR_FORWARD(rundir_shard(r, last, p, shard, sizeof shard));
	ERR_FORWARD(tokfile_open(&tf, shard));
	struct tokfile trained, held;
	rc = split_heldout(r, &tf, shard, &trained, &held);
	if (!rc)
		rc = gpt2_create_forward(&g, &c->model, B, T, be);
	if (rc) {
		tokfile_close(&tf);
		return rc;
	}
	*best = 0;
	for (long t = 1; t <= last && !rc; t++) {
		rc = pathtrain_assemble(r, t, p, &g);
		if (!rc)
			rc = train_evaluate(&g, &held, c->train.eval_batches * (long)B * T,
					    &losses[t - 1], NULL);
		if (!rc && losses[t - 1] < low) {
			low = losses[t - 1];
			*best = t;
		}
	}
	gpt2_free(&g);
	tokfile_close(&tf);
	return rc;
}
