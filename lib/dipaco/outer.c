/* outer.c - one module's outer step; the formulas and the orders of reading are in outer.h.
 *
 * Why this shape: the paths' copies of a module are folded one path at a time, in the order
 * of the paths, never in the order their checkpoints appeared, so the module written is the
 * same bits whether dpc-outer waited for the paths or found them all done, and whatever its
 * thread count. With every path present the tensors go by in pieces small enough for the
 * cache, so memory traffic is the inputs read once and memory does not grow with the number
 * of paths.
 */
#include "dipaco/outer.h"

#include <errno.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "common/crc.h"
#include "common/err.h"
#include "common/progress.h"
#include "dipaco/module.h"
#include "common/banned.h"

void outer_weights(double *a, const double *tokens, int n, int reweight)
{
	double sum = 0.0;
	int ok = reweight;

	for (int i = 0; i < n; i++) {
		if (!(tokens[i] > 0))
			ok = 0;
		sum += tokens[i];
	}
	for (int i = 0; i < n; i++)
		a[i] = ok ? tokens[i] / sum : 1.0 / n;
}

void outer_accumulate(double *acc, const float *prev, const float *theta, double a, size_t n)
{
	for (size_t k = 0; k < n; k++)
		acc[k] += a * ((double)prev[k] - (double)theta[k]);
}

void outer_apply(float *theta_out, float *buf, const float *prev, const double *acc, size_t n,
		 double scale, const struct outer_params *o)
{
	const double mu = o->momentum, lr = o->lr;

	for (size_t k = 0; k < n; k++) {
		double g = scale * acc[k];
		double b = mu * (double)buf[k] + g;
		double upd = o->nesterov ? g + mu * b : b;
		buf[k] = (float)b;
		theta_out[k] = (float)((double)prev[k] - lr * upd);
	}
}

/* The paths a job folds: j->paths, or every path of the module. */
static int job_npaths(const struct outer_job *j)
{
	return j->paths ? j->npaths : j->topo->modules[j->module].npaths;
}

static int job_path(const struct outer_job *j, int k)
{
	return j->paths ? j->paths[k] : j->topo->modules[j->module].paths[k];
}

void outer_diag_free(struct outer_diag *d)
{
	free(d->delta_norm);
	d->delta_norm = NULL;
}

/* Wait for a file to appear (rename makes it appear whole), polling: inotify does not see
 * other hosts' writes on a shared filesystem. */
static int wait_for(const char *path, double limit, double *waited)
{
	double t0 = now_seconds(), nap = 0.05;

	while (access(path, F_OK) != 0) {
		if (errno != ENOENT)
			return err_errno(CORE_EIO, path, "cannot access", errno);
		double el = now_seconds() - t0;
		if (limit == 0 || (limit > 0 && el >= limit))
			return err_set(CORE_ENOTFOUND, path, limit == 0 ? "path checkpoint does not "
				       "exist (is its training task done?)" : "path checkpoint did "
				       "not appear within %.0f s", limit);
		struct timespec ts = {(time_t)nap, (long)((nap - (double)(time_t)nap) * 1e9)};
		nanosleep(&ts, NULL);
		if (nap < 1.0)
			nap *= 2;
	}
	*waited += now_seconds() - t0;
	return 0;
}

/* Floats per piece: every buffer of a piece stays in the core's cache while all the paths'
 * copies of it are folded, so memory traffic is the inputs read once. */
#define CHUNK 16384

/* One tensor of one input file, read piece by piece with its crc32 checked at the end. */
struct stream {
	struct st_file *f;
	const struct st_entry *e;
	uint32_t crc;
};

static int stream_open(struct stream *s, struct st_file *f, const char *prefix,
		       const struct tensor *v)
{
	char name[TENSOR_NAME_MAX + 16];

	snprintf(name, sizeof name, "%s%s", prefix, v->name);
	s->f = f;
	s->crc = 0u;
	ERR_FORWARD(st_lookup(f, name, DT_F32, v->ndim, v->ne, &s->e));
	/* Our checkpoints carry every tensor's crc32; one without is not ours to trust. */
	if (!s->e->has_crc)
		return err_set(CORE_EFORMAT, f->path, "tensor '%s' has no crc32", name);
	return 0;
}

static int stream_read(struct stream *s, size_t off, float *dst, size_t n, uint64_t *bytes)
{
	ERR_FORWARD(st_read_raw(s->f, s->e, sizeof(float) * off, dst, sizeof(float) * n));
	s->crc = crc32_update(s->crc, (const unsigned char *)dst, sizeof(float) * n);
	*bytes += sizeof(float) * n;
	return 0;
}

static int stream_check(const struct stream *s)
{
	if (s->e->has_crc && s->crc != s->e->crc)
		return err_set(CORE_ECHECKSUM, s->f->path, "checksum mismatch in tensor '%s'",
			       s->e->name);
	return 0;
}

static int all_finite(const float *x, size_t n)
{
	int bad = 0;

	for (size_t k = 0; k < n; k++)
		bad |= !isfinite(x[k]);
	return !bad;
}

/* acc += a (prev - theta), S += prev - theta, and the squared norm of prev - theta; -1 when
 * theta holds a value that is not finite. */
static int fold_piece(double *acc, float *S, const float *prev, const float *theta, double a,
		      size_t n, double *n2)
{
	double s2 = 0.0;

	if (!all_finite(theta, n))
		return -1;
	/* s2 feeds only the diagnostics, so it may be reassociated into vector lanes (the same
	 * binary still gives the same bits); acc, which feeds the parameters, is element-wise
	 * and exact in its order: the paths in their order. */
#pragma omp simd reduction(+ : s2)
	for (size_t k = 0; k < n; k++) {
		double dd = (double)prev[k] - (double)theta[k];
		acc[k] += a * dd;
		S[k] += (float)dd;
		s2 += dd * dd;
	}
	*n2 += s2;
	return 0;
}

/* What both orders of folding share: the job, its buffers for one piece, the running sums. */
struct fold {
	const struct outer_job *j;
	struct outer_diag *d;
	struct st_file prev;         /* the module of phase t-1 */
	struct st_file *paths;       /* [P] open path checkpoints (chunk order) */
	int nopen;
	float *M0, *TH, *OUT;        /* one piece (path by path) */
	float *newm;                 /* path by path: the new momentum of the current tensor */
	double s2, g2, u2;           /* ||sum of deltas||^2, ||acc||^2, ||update||^2 */
	struct st_writer *w;
	struct tokenizer_id tok;     /* what the module and its paths were trained on */
};

static int nonfinite(const struct fold *F, int k, const struct tensor *v)
{
	return err_set(CORE_ENAN, F->j->path_ckpts[k], "tensor '%s' holds a non-finite value",
		       v->name);
}

/* Update and write one piece [off, off + n) of view v whose deltas are summed in acc (and S);
 * prev holds its previous parameters; the old momentum is read here. */
static int apply_piece(struct fold *F, struct stream *mom, const float *prev, const double *acc,
		       const float *S, size_t off, size_t n, double scale)
{
	double s2 = 0.0, g2 = 0.0, u2 = 0.0;

	ERR_FORWARD(stream_read(mom, off, F->M0, n, &F->d->bytes_read));
	if (!all_finite(F->M0, n))
		return err_set(CORE_ENAN, mom->f->path, "tensor '%s' holds a non-finite value",
			       mom->e->name);
	outer_apply(F->OUT, F->M0, prev, acc, n, scale, &F->j->params);
#pragma omp simd reduction(+ : s2, g2, u2)
	for (size_t k = 0; k < n; k++) {
		double du = (double)F->OUT[k] - (double)prev[k];
		s2 += (double)S[k] * (double)S[k];
		g2 += acc[k] * acc[k];
		u2 += du * du;
	}
	F->s2 += s2;
	F->g2 += g2;
	F->u2 += u2;
	memcpy(F->newm + off, F->M0, sizeof(float) * n);
	return st_writer_put(F->w, F->OUT, sizeof(float) * n);
}

/* One thread's buffers for one piece, and what the piece gave. */
struct slot {
	float *P0, *M0, *TH, *OUT, *S;
	double *acc;
	double s2, g2, u2;
	uint32_t crc_out, crc_mom; /* of the piece's new parameters and momentum */
	int rc;
	char file[256], detail[400];
};

static int slot_fail(struct slot *sl, int rc)
{
	sl->rc = rc;
	snprintf(sl->file, sizeof sl->file, "%s", err_file());
	snprintf(sl->detail, sizeof sl->detail, "%s", err_detail());
	return rc;
}

/* Piece q (elements [off, off + n)) of one tensor: read it from the previous module and from
 * every path, fold the paths in their order, apply the update. crcs[0], crcs[1] and
 * crcs[2 + k] get the piece's crc in the previous parameters, momentum and path k;
 * n2[k] the squared norm of path k's delta over the piece. */
static int fold_one_piece(const struct fold *F, struct slot *sl, const struct st_entry *pe,
			  const struct st_entry *me, const struct st_entry *const *te, int wi,
			  size_t off, size_t n, double scale, uint32_t *crcs, double *n2,
			  uint64_t *bytes)
{
	const struct outer_job *j = F->j;
	const int P = job_npaths(j);
	struct st_file *prev = (struct st_file *)&F->prev;
	const size_t nb = sizeof(float) * n, ob = sizeof(float) * off;
	int rc;

	if ((rc = st_read_raw(prev, pe, ob, sl->P0, nb)) || (rc = st_read_raw(prev, me, ob, sl->M0, nb)))
		return slot_fail(sl, rc);
	crcs[0] = crc32_update(0, sl->P0, nb);
	crcs[1] = crc32_update(0, sl->M0, nb);
	if (!all_finite(sl->P0, n) || !all_finite(sl->M0, n))
		return slot_fail(sl, err_set(CORE_ENAN, prev->path, "tensor '%s' or its momentum "
					     "holds a non-finite value", pe->name));
	memset(sl->acc, 0, sizeof(double) * n);
	memset(sl->S, 0, sizeof(float) * n);
	for (int k = 0; k < P; k++) {
		if ((rc = st_read_raw(&F->paths[k], te[k], ob, sl->TH, nb)))
			return slot_fail(sl, rc);
		crcs[2 + k] = crc32_update(0, sl->TH, nb);
		n2[k] = 0.0;
		if (fold_piece(sl->acc, sl->S, sl->P0, sl->TH, j->weights[k], n, &n2[k]))
			return slot_fail(sl, err_set(CORE_ENAN, j->path_ckpts[k], "tensor '%s' "
						     "holds a non-finite value", te[k]->name));
	}
	*bytes += (uint64_t)(2 + P) * nb;
	outer_apply(sl->OUT, sl->M0, sl->P0, sl->acc, n, scale, &j->params);
	double s2 = 0.0, g2 = 0.0, u2 = 0.0;
#pragma omp simd reduction(+ : s2, g2, u2)
	for (size_t k = 0; k < n; k++) {
		double du = (double)sl->OUT[k] - (double)sl->P0[k];
		s2 += (double)sl->S[k] * (double)sl->S[k];
		g2 += sl->acc[k] * sl->acc[k];
		u2 += du * du;
	}
	sl->s2 = s2, sl->g2 = g2, sl->u2 = u2;
	/* The piece goes to its place in the output from this thread: writer tensor wi holds
	 * the parameters, wi + 1 their momentum. */
	sl->crc_out = crc32_update(0, sl->OUT, nb);
	sl->crc_mom = crc32_update(0, sl->M0, nb);
	if ((rc = st_writer_pwrite(F->w, wi, ob, sl->OUT, nb)) ||
	    (rc = st_writer_pwrite(F->w, wi + 1, ob, sl->M0, nb)))
		return slot_fail(sl, rc);
	return 0;
}

/* Every path present: the tensor in pieces, nthreads pieces at a time in parallel, all paths
 * folded into each piece in their order. Output pieces, crcs and the diagnostics' partial
 * sums are taken in piece order, so neither the bits written nor the diagnostics depend on
 * the thread count. */
static int fold_by_piece(struct fold *F, double scale, int nthreads)
{
	/* Pieces per round: a few per thread, so that starting the threads is paid rarely. */
	const int R = nthreads > 1 ? 4 * nthreads : 1;
	const struct outer_job *j = F->j;
	const struct topology *t = j->topo;
	const int P = job_npaths(j);
	const struct st_entry **te = calloc((size_t)P, sizeof *te);
	struct slot *slots = calloc((size_t)R, sizeof *slots);
	uint32_t *crcs = malloc(sizeof *crcs * (size_t)(2 + P) * (size_t)R);
	uint32_t *whole = malloc(sizeof *whole * (size_t)(2 + P));
	double *n2 = malloc(sizeof *n2 * (size_t)P * (size_t)R);
	uint64_t *bytes = calloc((size_t)R, sizeof *bytes);
	int rc = 0;

	if (!te || !slots || !crcs || !whole || !n2 || !bytes)
		rc = err_set(CORE_ENOMEM, j->out_path, "out of memory");
	for (int q = 0; q < R && !rc; q++) {
		struct slot *sl = &slots[q];
		sl->P0 = malloc(sizeof(float) * CHUNK);
		sl->M0 = malloc(sizeof(float) * CHUNK);
		sl->TH = malloc(sizeof(float) * CHUNK);
		sl->OUT = malloc(sizeof(float) * CHUNK);
		sl->S = malloc(sizeof(float) * CHUNK);
		sl->acc = malloc(sizeof(double) * CHUNK);
		if (!sl->P0 || !sl->M0 || !sl->TH || !sl->OUT || !sl->S || !sl->acc)
			rc = err_set(CORE_ENOMEM, j->out_path, "out of memory");
	}
	int wi = 0; /* the writer's tensor: parameters, then momentum, view after view */
	for (int i = 0; i < t->layout.n && !rc; i++) {
		if (!topo_owns(t, j->module, i))
			continue;
		const struct tensor *v = &t->layout.views[i];
		const size_t nv = (size_t)tensor_numel(v);
		const size_t npieces = (nv + CHUNK - 1) / CHUNK;
		uint32_t crc_out = 0, crc_mom = 0;
		struct stream sp, sm;
		rc = stream_open(&sp, &F->prev, "", v);
		if (!rc)
			rc = stream_open(&sm, &F->prev, MODULE_MOMENTUM_PREFIX, v);
		for (int k = 0; k < P && !rc; k++) {
			struct stream s;
			rc = stream_open(&s, &F->paths[k], "", v);
			te[k] = s.e;
		}

		for (int k = 0; k < 2 + P; k++)
			whole[k] = 0;
		for (size_t r = 0; r < npieces && !rc; r += (size_t)R) {
			const int nq = npieces - r < (size_t)R ? (int)(npieces - r) : R;
#pragma omp parallel for num_threads(nthreads) schedule(static) if (nq > 1 && nthreads > 1)
			for (int q = 0; q < nq; q++) {
				size_t off = (r + (size_t)q) * CHUNK, n = nv - off < CHUNK ? nv - off : CHUNK;
				slots[q].rc = 0;
				fold_one_piece(F, &slots[q], sp.e, sm.e, te, wi, off, n, scale,
					       crcs + (size_t)q * (2 + P), n2 + (size_t)q * P, &bytes[q]);
			}
			for (int q = 0; q < nq && !rc; q++) {
				struct slot *sl = &slots[q];
				size_t off = (r + (size_t)q) * CHUNK, n = nv - off < CHUNK ? nv - off : CHUNK;
				if (sl->rc) {
					rc = err_set(sl->rc, sl->file[0] ? sl->file : NULL, "%s", sl->detail);
					break;
				}
				for (int k = 0; k < 2 + P; k++)
					whole[k] = (uint32_t)crc32_combine64(whole[k], crcs[(size_t)q * (2 + P) + k],
									     (z_off64_t)(sizeof(float) * n));
				for (int k = 0; k < P; k++)
					F->d->delta_norm[k] += n2[(size_t)q * P + k];
				F->s2 += sl->s2;
				F->g2 += sl->g2;
				F->u2 += sl->u2;
				crc_out = (uint32_t)crc32_combine64(crc_out, sl->crc_out,
								    (z_off64_t)(sizeof(float) * n));
				crc_mom = (uint32_t)crc32_combine64(crc_mom, sl->crc_mom,
								    (z_off64_t)(sizeof(float) * n));
			}
		}
		/* The crcs of the whole tensors, before anything is committed. */
		sp.crc = whole[0];
		sm.crc = whole[1];
		if (!rc)
			rc = stream_check(&sp);
		if (!rc)
			rc = stream_check(&sm);
		for (int k = 0; k < P && !rc; k++) {
			struct stream s = {&F->paths[k], te[k], whole[2 + k]};
			rc = stream_check(&s);
		}
		st_writer_set_crc(F->w, wi, crc_out);
		st_writer_set_crc(F->w, wi + 1, crc_mom);
		wi += 2;
	}
	for (int q = 0; slots && bytes && q < R; q++) {
		F->d->bytes_read += bytes[q];
		free(slots[q].P0);
		free(slots[q].M0);
		free(slots[q].TH);
		free(slots[q].OUT);
		free(slots[q].S);
		free(slots[q].acc);
	}
	free(slots);
	free(te);
	free(crcs);
	free(whole);
	free(n2);
	free(bytes);
	return rc;
}

/* --wait: path after path as each appears, into sums over the whole module (prev, acc, S:
 * 16 bytes per parameter); the arithmetic per element is fold_by_piece's, in the same order,
 * so the module written is the same bits. */
static int fold_by_path(struct fold *F, double scale, double *read_s)
{
	const struct outer_job *j = F->j;
	const struct topology *t = j->topo;
	const struct topo_module *md = &t->modules[j->module];
	const size_t nm = md->nparams;
	float *prev = malloc(sizeof *prev * (nm ? nm : 1)), *S = calloc(nm ? nm : 1, sizeof *S);
	double *acc = calloc(nm ? nm : 1, sizeof *acc), t0 = now_seconds();
	int rc = 0;

	if (!prev || !S || !acc) {
		rc = err_set(CORE_ENOMEM, j->out_path, "out of memory for module %s", md->name);
		goto out;
	}
	size_t base = 0;
	for (int i = 0; i < t->layout.n && !rc; i++) {
		if (!topo_owns(t, j->module, i))
			continue;
		const struct tensor *v = &t->layout.views[i];
		const size_t nv = (size_t)tensor_numel(v);
		struct stream sp;
		rc = stream_open(&sp, &F->prev, "", v);
		for (size_t off = 0; off < nv && !rc; off += CHUNK)
			rc = stream_read(&sp, off, prev + base + off, nv - off < CHUNK ? nv - off : CHUNK,
					 &F->d->bytes_read);
		if (!rc)
			rc = stream_check(&sp);
		if (!rc && !all_finite(prev + base, nv))
			rc = err_set(CORE_ENAN, F->prev.path, "tensor '%s' holds a non-finite value",
				     v->name);
		base += nv;
	}
	for (int k = 0; k < job_npaths(j) && !rc; k++) {
		struct st_file pf;
		rc = wait_for(j->path_ckpts[k], j->wait_seconds, &F->d->wait_seconds);
		if (!rc)
			rc = pathckpt_open(&pf, j->path_ckpts[k], job_path(j, k), j->phase,
					   j->config_hash, NULL, NULL, 0);
		if (rc)
			break;
		if ((rc = module_tokenizer(&pf, &F->tok)) != 0) {
			st_close(&pf);
			break;
		}
		base = 0;
		for (int i = 0; i < t->layout.n && !rc; i++) {
			if (!topo_owns(t, j->module, i))
				continue;
			const struct tensor *v = &t->layout.views[i];
			const size_t nv = (size_t)tensor_numel(v);
			struct stream st;
			rc = stream_open(&st, &pf, "", v);
			for (size_t off = 0; off < nv && !rc; off += CHUNK) {
				const size_t n = nv - off < CHUNK ? nv - off : CHUNK;
				rc = stream_read(&st, off, F->TH, n, &F->d->bytes_read);
				if (!rc && fold_piece(acc + base + off, S + base + off,
						      prev + base + off, F->TH, j->weights[k], n,
						      &F->d->delta_norm[k]))
					rc = nonfinite(F, k, v);
			}
			if (!rc)
				rc = stream_check(&st);
			base += nv;
		}
		st_close(&pf);
	}
	*read_s = now_seconds() - t0 - F->d->wait_seconds;
	/* The output is created only now: a step waiting for its paths holds no file. */
	if (!rc)
		rc = module_writer_open(&F->w, j->out_path, t, j->module, j->phase, j->config_hash,
					NULL, F->tok);
	base = 0;
	for (int i = 0; i < t->layout.n && !rc; i++) {
		if (!topo_owns(t, j->module, i))
			continue;
		const struct tensor *v = &t->layout.views[i];
		const size_t nv = (size_t)tensor_numel(v);
		struct stream sm;
		rc = stream_open(&sm, &F->prev, MODULE_MOMENTUM_PREFIX, v);
		for (size_t off = 0; off < nv && !rc; off += CHUNK)
			rc = apply_piece(F, &sm, prev + base + off, acc + base + off, S + base + off,
					 off, nv - off < CHUNK ? nv - off : CHUNK, scale);
		if (!rc)
			rc = stream_check(&sm);
		if (!rc)
			rc = st_writer_put(F->w, F->newm, sizeof(float) * nv);
		base += nv;
	}
out:
	free(prev);
	free(S);
	free(acc);
	return rc;
}

/* No path to fold (dipaco.paths_per_phase drew none of the module's): its parameters and
 * its momentum go to phase t unchanged, piece by piece, each tensor's crc checked. Not
 * outer_apply with a zero gradient: that would decay the momentum (buf = mu buf) and move
 * the parameters by it, as if a step had happened. */
static int keep_module(struct fold *F)
{
	const struct outer_job *j = F->j;
	const struct topology *t = j->topo;
	int rc = module_writer_open(&F->w, j->out_path, t, j->module, j->phase, j->config_hash,
				    NULL, F->tok);

	for (int i = 0; i < t->layout.n && !rc; i++) {
		if (!topo_owns(t, j->module, i))
			continue;
		const struct tensor *v = &t->layout.views[i];
		const size_t nv = (size_t)tensor_numel(v);
		for (int mom = 0; mom < 2 && !rc; mom++) {
			struct stream sp;
			rc = stream_open(&sp, &F->prev, mom ? MODULE_MOMENTUM_PREFIX : "", v);
			for (size_t off = 0; off < nv && !rc; off += CHUNK) {
				const size_t n = nv - off < CHUNK ? nv - off : CHUNK;
				rc = stream_read(&sp, off, F->M0, n, &F->d->bytes_read);
				if (!rc && !all_finite(F->M0, n))
					rc = err_set(CORE_ENAN, F->prev.path, "tensor '%s' holds a "
						     "non-finite value", sp.e->name);
				if (!rc)
					rc = st_writer_put(F->w, F->M0, sizeof(float) * n);
			}
			if (!rc)
				rc = stream_check(&sp);
		}
	}
	return rc;
}

int outer_step_module(const struct outer_job *j, struct outer_diag *d)
{
	const struct topology *t = j->topo;
	const struct topo_module *md = &t->modules[j->module];
	const int P = job_npaths(j);
	const double scale = j->params.rescale ? sqrt((double)P) : 1.0;
	double t0 = now_seconds(), read_s = 0.0;
	size_t maxv = 0;
	struct fold F = {.j = j, .d = d};
	int rc, have_prev = 0;

	memset(d, 0, sizeof *d);
	d->npaths = P;
	for (int i = 0; i < t->layout.n; i++)
		if (topo_owns(t, j->module, i) && (size_t)tensor_numel(&t->layout.views[i]) > maxv)
			maxv = (size_t)tensor_numel(&t->layout.views[i]);
	d->delta_norm = calloc((size_t)(P ? P : 1), sizeof *d->delta_norm);
	F.paths = calloc((size_t)(P ? P : 1), sizeof *F.paths);
	/* By piece needs every path checkpoint open at once; beyond the descriptors this
	 * process may hold, path by path gives the same bits. */
	struct rlimit nofile;
	const int by_piece = j->wait_seconds == 0 &&
		(getrlimit(RLIMIT_NOFILE, &nofile) != 0 || nofile.rlim_cur == RLIM_INFINITY ||
		 (rlim_t)P + 16 <= nofile.rlim_cur);
	F.M0 = malloc(sizeof(float) * CHUNK);
	F.TH = malloc(sizeof(float) * CHUNK);
	F.OUT = malloc(sizeof(float) * CHUNK);
	F.newm = by_piece ? NULL : malloc(sizeof(float) * (maxv ? maxv : 1));
	if (!d->delta_norm || !F.paths || !F.M0 || !F.TH || !F.OUT || (!by_piece && !F.newm)) {
		rc = err_set(CORE_ENOMEM, j->out_path, "out of memory for module %s", md->name);
		goto out;
	}
	rc = module_open(&F.prev, j->prev_path, t, j->module, j->phase - 1, j->config_hash, 0);
	if (rc)
		goto out;
	have_prev = 1;
	rc = module_tokenizer(&F.prev, &F.tok);
	/* By piece, every input is opened and checked before a byte is written. */
	for (int k = 0; k < P && by_piece && !rc; k++) {
		rc = wait_for(j->path_ckpts[k], 0, &d->wait_seconds);
		if (!rc)
			rc = pathckpt_open(&F.paths[k], j->path_ckpts[k], job_path(j, k), j->phase,
					   j->config_hash, NULL, NULL, 0);
		if (!rc)
			F.nopen++;
		if (!rc)
			rc = module_tokenizer(&F.paths[k], &F.tok);
	}
	if (!rc && P == 0) {
		rc = keep_module(&F);
		read_s = now_seconds() - t0;
	} else if (!rc && by_piece) {
		rc = module_writer_open(&F.w, j->out_path, t, j->module, j->phase, j->config_hash,
					NULL, F.tok);
		if (!rc)
			rc = fold_by_piece(&F, scale, j->threads > 0 ? j->threads : omp_get_max_threads());
		read_s = now_seconds() - t0;
	} else if (!rc) {
		rc = fold_by_path(&F, scale, &read_s);
	}

	/* sum_{i != j} d_i . d_j = |sum_i d_i|^2 - sum_i |d_i|^2, over the same pairs' norm
	 * products: the pairwise cosines' mean weighted by |d_i| |d_j|. */
	double sn = 0.0, sn2 = 0.0;
	for (int k = 0; k < P; k++) {
		d->delta_norm[k] = sqrt(d->delta_norm[k]);
		sn += d->delta_norm[k];
		sn2 += d->delta_norm[k] * d->delta_norm[k];
	}
	d->mean_cosine = P >= 2 && sn * sn - sn2 > 0 ? (F.s2 - sn2) / (sn * sn - sn2) : NAN;
	d->grad_norm = sqrt(F.g2);
	d->grad_norm_scaled = scale * d->grad_norm;
	d->update_norm = sqrt(F.u2);
	d->read_seconds = read_s;
	d->seconds = now_seconds() - t0;
	if (!rc && j->before_commit)
		rc = j->before_commit(j->ctx, d);
	if (F.w) {
		if (rc)
			st_writer_abort(F.w);
		else
			rc = st_writer_commit(F.w);
	}
out:
	for (int k = 0; k < F.nopen; k++)
		st_close(&F.paths[k]);
	if (have_prev)
		st_close(&F.prev);
	free(F.paths);
	free(F.M0);
	free(F.TH);
	free(F.OUT);
	free(F.newm);
	if (rc)
		outer_diag_free(d);
	return rc;
}
