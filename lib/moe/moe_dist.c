/* moe_dist.c - the MoE layer across ranks: ZeRO-3 shards, plans {r, d, a}, the pipelined
 * exchange of the capacity dimension (moe_dist.h).
 *
 * One step, r >= 1, on rank q with s ranks per expert, g = s/r ranks per slice:
 *   route     the local moe_layer gates the local tokens; C_g from the largest need over
 *             ranks; locations with C_g.
 *   gather    the slice's parameters from its g ranks (none when g = 1: the shard is used
 *             in place), b2 from the expert's s ranks.
 *   encode    with the virtual route: E*r "experts" e*r + j, choice (j, r') of a token
 *             pointing at expert idx*r + j, so one encode writes the r copies straight into
 *             the send layout [E, r, C_g, M] (Tutel's local repeat).
 *   pipeline  the send layout cut, per peer, into blocks of cr rows (cr = C_g, or C_g/g
 *             when E < W: one of the g ranks of a slice takes each 1/g of a source's
 *             capacity); d row ranges [a_i, a_i + n_i) of those blocks are exchanged in
 *             turn into a piece-major receive buffer [piece][El][W][n_i][M], where each
 *             local expert's rows of a piece are contiguous for the GEMMs; the experts'
 *             outputs go back the same way into eo [E*r, C_g, M].
 *   decode    with the virtual route: sums the r partials of each choice (local sum).
 * Backward runs the same pipeline on d_eo, and reduce-scatters the gradients.
 * r = 0 gathers everything and runs the single-process flow on the local tokens.
 * On device memory (l->dd) each exchange of backend memory is queued through dist_dev instead
 * of the host path's communication thread: the pipeline's All-to-Alls (d > 1) on the
 * backend's second queue (backend.h, side_begin), ordered with the experts by marks (see
 * pipeline()), the parameters' collectives on the main queue.
 */
#include "moe/moe_dist.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/progress.h"
#include "dist/dist_dev.h"
#include "moe/moe_impl.h"
#include "common/banned.h"

#define MAX_PIECES 8

static int64_t gcd64(int64_t a, int64_t b)
{
	while (b) {
		int64_t t = a % b;
		a = b;
		b = t;
	}
	return a;
}

int moe_dist_place(struct moe_dist_place *pl, const struct moe_config *cfg, int W, int q)
{
	memset(pl, 0, sizeof *pl);
	if (W < 1 || q < 0 || q >= W)
		return err_set(CORE_EUSAGE, NULL, "rank %d of %d is not a rank", q, W);
	pl->W = W;
	pl->q = q;
	if (cfg->E >= W) {
		if (cfg->E % W)
			return err_set(CORE_EUSAGE, NULL, "%d experts cannot be shared by %d ranks "
				       "(E must be a multiple of W, or divide it)", cfg->E, W);
		pl->s = 1;
		pl->El = cfg->E / W;
	} else {
		if (W % cfg->E)
			return err_set(CORE_EUSAGE, NULL, "%d experts cannot be shared by %d ranks "
				       "(E must be a multiple of W, or divide it)", cfg->E, W);
		pl->s = W / cfg->E;
		pl->El = 1;
		if (cfg->H % pl->s || cfg->M % pl->s)
			return err_set(CORE_EUSAGE, NULL, "each expert is split over %d ranks, "
				       "which must divide H=%lld and M=%lld", pl->s,
				       (long long)cfg->H, (long long)cfg->M);
	}
	pl->Hs = cfg->H / pl->s;
	pl->b2n = cfg->E >= W ? (int64_t)pl->El * cfg->M : cfg->M / pl->s;
	pl->r_max = pl->s;
	return 0;
}

int moe_plan_rs(const struct moe_dist_place *pl, int *rs, int n)
{
	int m = 0;
	for (int r = 0; r <= pl->s; r++)
		if ((r == 0 || pl->s % r == 0) && m < n)
			rs[m++] = r;
	return m;
}

int moe_plan_check(const struct moe_plan *p, const struct moe_dist_place *pl)
{
	if (p->r < 0 || p->r > pl->s || (p->r > 0 && pl->s % p->r)) {
		char list[128] = "";
		int rs[64], n = moe_plan_rs(pl, rs, 64);
		size_t used = 0;
		for (int i = 0; i < n && used < sizeof list; i++)
			used += (size_t)snprintf(list + used, sizeof list - used, "%s%d",
						 i ? ", " : "", rs[i]);
		return err_set(CORE_EUSAGE, NULL, "r=%d is not a parallelism degree of this "
			       "placement (%d ranks per expert): use one of %s", p->r, pl->s, list);
	}
	if (p->r > 0 && p->d != 1 && p->d != 2 && p->d != 4 && p->d != 8)
		return err_set(CORE_EUSAGE, NULL, "pipelining degree d=%d is not 1, 2, 4 or 8",
			       p->d);
	if (p->r > 0 && (p->a < DIST_A2A_LINEAR || p->a > DIST_A2A_MPI))
		return err_set(CORE_EUSAGE, NULL, "unknown All-to-All algorithm %d", (int)p->a);
	return 0;
}

/* ---- parameters -------------------------------------------------------------------------- */

int moe_dist_params_alloc(struct moe_params *p, const struct moe_config *cfg,
			  const struct moe_dist_place *pl, struct backend *be)
{
	const size_t M = (size_t)cfg->M, El = (size_t)pl->El, Hs = (size_t)pl->Hs;
	const size_t n[5] = {M * (size_t)cfg->E, El * Hs * M, El * Hs, El * Hs * M,
			     (size_t)pl->b2n};
	return moe_params_alloc_n(p, be, n);
}

/* n floats of backend memory into a new host array (NULL and an error on failure). */
static float *fetch(struct backend *be, const float *src, size_t n, int *rc)
{
	float *h = malloc((n ? n : 1) * sizeof(float));
	if (!h) {
		*rc = err_set(CORE_ENOMEM, NULL, "cannot allocate %zu host floats", n);
		return NULL;
	}
	*rc = be->op->download(be, h, src, n * sizeof(float));
	if (*rc < 0) {
		free(h);
		return NULL;
	}
	return h;
}

/* moe_dist_params_from_full with both sides in host memory: straight copies, nothing
 * allocated (a training model takes its shard every step). */
static void from_full_host(struct moe_params *p, const struct moe_config *cfg,
			   const struct moe_dist_place *pl, const struct moe_params *full,
			   int64_t e0, int64_t h0)
{
	const int64_t M = cfg->M, H = cfg->H, E = cfg->E, El = pl->El, Hs = pl->Hs;
	memcpy(p->wg, full->wg, sizeof(float) * (size_t)(M * E));
	for (int64_t b = 0; b < El; b++) {
		for (int64_t h = 0; h < Hs; h++) /* w1: the shard out-in, the full tensor in-out */
			for (int64_t m = 0; m < M; m++)
				p->w1[(b * Hs + h) * M + m] = full->w1[((e0 + b) * M + m) * H + h0 + h];
		memcpy(p->b1 + b * Hs, full->b1 + (e0 + b) * H + h0, sizeof(float) * (size_t)Hs);
		memcpy(p->w2 + b * Hs * M, full->w2 + ((e0 + b) * H + h0) * M,
		       sizeof(float) * (size_t)(Hs * M));
	}
	memcpy(p->b2, full->b2 + e0 * M + (E >= pl->W ? 0 : (pl->q % pl->s) * pl->b2n),
	       sizeof(float) * (size_t)pl->b2n);
}

int moe_dist_params_from_full(struct moe_params *p, const struct moe_config *cfg,
			      const struct moe_dist_place *pl, const struct moe_params *full)
{
	struct backend *fb = full->be, *be = p->be;
	const int64_t M = cfg->M, H = cfg->H, E = cfg->E, El = pl->El, Hs = pl->Hs;
	const int64_t e0 = E >= pl->W ? (int64_t)pl->q * El : pl->q / pl->s;
	const int64_t h0 = E >= pl->W ? 0 : (int64_t)(pl->q % pl->s) * Hs;
	int rc = 0;
	if (fb->host_visible && be->host_visible) {
		from_full_host(p, cfg, pl, full, e0, h0);
		return 0;
	}
	float *wg = NULL, *w1 = NULL, *b1 = NULL, *w2 = NULL, *b2 = NULL, *out = NULL;

	if (!(wg = fetch(fb, full->wg, (size_t)(M * E), &rc)) ||
	    !(w1 = fetch(fb, full->w1, (size_t)(E * M * H), &rc)) ||
	    !(b1 = fetch(fb, full->b1, (size_t)(E * H), &rc)) ||
	    !(w2 = fetch(fb, full->w2, (size_t)(E * H * M), &rc)) ||
	    !(b2 = fetch(fb, full->b2, (size_t)(E * M), &rc)))
		goto done;
	out = malloc(sizeof(float) * (size_t)(El * Hs * M + 1));
	if (!out) {
		rc = err_set(CORE_ENOMEM, NULL, "cannot allocate the shard on the host");
		goto done;
	}
	if ((rc = be->op->upload(be, p->wg, wg, sizeof(float) * (size_t)(M * E))) < 0)
		goto done;
	/* w1: the shard is out-in, the full tensor in-out. */
	for (int64_t b = 0; b < El; b++)
		for (int64_t h = 0; h < Hs; h++)
			for (int64_t m = 0; m < M; m++)
				out[(b * Hs + h) * M + m] = w1[((e0 + b) * M + m) * H + h0 + h];
	if ((rc = be->op->upload(be, p->w1, out, sizeof(float) * (size_t)(El * Hs * M))) < 0)
		goto done;
	for (int64_t b = 0; b < El; b++)
		for (int64_t h = 0; h < Hs; h++)
			out[b * Hs + h] = b1[(e0 + b) * H + h0 + h];
	if ((rc = be->op->upload(be, p->b1, out, sizeof(float) * (size_t)(El * Hs))) < 0)
		goto done;
	for (int64_t b = 0; b < El; b++)
		memcpy(out + b * Hs * M, w2 + ((e0 + b) * H + h0) * M,
		       sizeof(float) * (size_t)(Hs * M));
	if ((rc = be->op->upload(be, p->w2, out, sizeof(float) * (size_t)(El * Hs * M))) < 0)
		goto done;
	if (E >= pl->W)
		memcpy(out, b2 + e0 * M, sizeof(float) * (size_t)(El * M));
	else
		memcpy(out, b2 + e0 * M + (pl->q % pl->s) * pl->b2n,
		       sizeof(float) * (size_t)pl->b2n);
	rc = be->op->upload(be, p->b2, out, sizeof(float) * (size_t)pl->b2n);
done:
	free(wg);
	free(w1);
	free(b1);
	free(w2);
	free(b2);
	free(out);
	return rc;
}

/* Where rank q's shard starts in the full tensors: expert e0, hidden row h0, b2 column c0. */
static void shard_origin(const struct moe_dist_place *pl, const struct moe_config *cfg, int q,
			 int64_t *e0, int64_t *h0, int64_t *c0)
{
	const int whole = cfg->E >= pl->W;
	*e0 = whole ? (int64_t)q * pl->El : q / pl->s;
	*h0 = whole ? 0 : (int64_t)(q % pl->s) * pl->Hs;
	*c0 = whole ? 0 : (int64_t)(q % pl->s) * pl->b2n;
}

size_t moe_dist_gather_floats(const struct moe_config *cfg, const struct moe_dist_place *pl)
{
	const size_t nw = (size_t)(pl->El * pl->Hs * cfg->M), nb1 = (size_t)(pl->El * pl->Hs);
	/* every rank's shard of w1, b1, w2, b2, then room for this rank's largest */
	return (2 * nw + nb1 + (size_t)pl->b2n) * (size_t)pl->W + nw;
}

int moe_dist_params_to_full(struct moe_params *full, const struct moe_config *cfg,
			    const struct moe_dist_place *pl, const struct moe_params *p,
			    struct dist *d)
{
	float *buf = malloc(sizeof(float) * (moe_dist_gather_floats(cfg, pl) + 1));
	if (!buf)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the gathered shards");
	int rc = moe_dist_params_to_full_buf(full, cfg, pl, p, d, buf);
	free(buf);
	return rc;
}

int moe_dist_params_to_full_buf(struct moe_params *full, const struct moe_config *cfg,
				const struct moe_dist_place *pl, const struct moe_params *p,
				struct dist *d, float *buf)
{
	struct backend *fb = full->be, *be = p->be;
	const int W = pl->W;
	const int64_t M = cfg->M, H = cfg->H, E = cfg->E, El = pl->El, Hs = pl->Hs;
	const size_t nw = (size_t)(El * Hs * M), nb1 = (size_t)(El * Hs), nb2 = (size_t)pl->b2n;
	const size_t ns[4] = {nw, nb1, nw, nb2};
	const float *src[4] = {p->w1, p->b1, p->w2, p->b2};
	/* buf: the gathered shards of each tensor (W x its shard), then this rank's shard of
	 * one of them fetched, when p is not in host memory */
	float *all[4] = {buf, buf + nw * (size_t)W, buf + (nw + nb1) * (size_t)W,
			 buf + (2 * nw + nb1) * (size_t)W};
	float *fetched = buf + (2 * nw + nb1 + nb2) * (size_t)W, *out = NULL;
	int rc = 0;

	if (dist_size(d) != W || dist_rank(d) != pl->q)
		return err_set(CORE_EUSAGE, NULL, "the placement is for rank %d of %d, this is rank "
			       "%d of %d", pl->q, W, dist_rank(d), dist_size(d));
	/* the gate is the same on every rank: this rank's */
	if (fb != be || full->wg != p->wg) {
		float *wg = fetch(be, p->wg, (size_t)(M * E), &rc);
		if (!wg)
			return rc;
		rc = fb->op->upload(fb, full->wg, wg, sizeof(float) * (size_t)(M * E));
		free(wg);
		ERR_FORWARD(rc);
	}
	for (int t = 0; t < 4 && !rc; t++) {
		const float *mine = src[t];
		if (!be->host_visible) {
			rc = be->op->download(be, fetched, src[t], sizeof(float) * ns[t]);
			mine = fetched;
		}
		if (!rc)
			rc = dist_allgather(d, W, mine, all[t], sizeof(float) * ns[t]);
	}
	if (!rc && !fb->host_visible && !(out = malloc(sizeof(float) * (size_t)(E * M * H + 1))))
		rc = err_set(CORE_ENOMEM, NULL, "cannot allocate the full tensors on the host");
	/* each rank's shard back where moe_dist_params_from_full took it from: straight into
	 * full in host memory, else through out */
	float *dst[4] = {full->w1, full->b1, full->w2, full->b2};
	for (int t = 0; t < 4 && !rc; t++) {
		const size_t n = t == 0 || t == 2 ? (size_t)(E * M * H) : t == 1 ? (size_t)(E * H)
										 : (size_t)(E * M);
		if (fb->host_visible)
			out = dst[t];
		for (int q = 0; q < W; q++) {
			int64_t e0, h0, c0;
			shard_origin(pl, cfg, q, &e0, &h0, &c0);
			const float *sh = all[t] + ns[t] * (size_t)q;
			for (int64_t b = 0; b < El; b++) {
				if (t == 0) /* w1: the shard out-in, the full tensor in-out */
					for (int64_t h = 0; h < Hs; h++)
						for (int64_t m = 0; m < M; m++)
							out[((e0 + b) * M + m) * H + h0 + h] =
								sh[(b * Hs + h) * M + m];
				else if (t == 1)
					memcpy(out + (e0 + b) * H + h0, sh + b * Hs,
					       sizeof(float) * (size_t)Hs);
				else if (t == 2)
					memcpy(out + ((e0 + b) * H + h0) * M, sh + b * Hs * M,
					       sizeof(float) * (size_t)(Hs * M));
			}
			if (t == 3)
				memcpy(out + e0 * M + c0, sh, sizeof(float) * nb2);
		}
		if (!fb->host_visible)
			rc = fb->op->upload(fb, dst[t], out, sizeof(float) * n);
	}
	if (!fb->host_visible)
		free(out);
	return rc;
}

int moe_dist_params_init(struct moe_params *p, const struct moe_config *cfg,
			 const struct moe_dist_place *pl, uint64_t seed)
{
	struct moe_params full;
	ERR_FORWARD(moe_params_alloc(&full, cfg, p->be));
	int rc = moe_params_init(&full, cfg, seed);
	if (rc == 0)
		rc = moe_dist_params_from_full(p, cfg, pl, &full);
	moe_params_free(&full);
	return rc;
}

/* ---- the layer ---------------------------------------------------------------------------- */

struct buf {
	void *p;
	size_t bytes;
};

struct moe_dist_layer {
	struct moe_config cfg;
	struct moe_dist_place pl;
	struct backend *be;
	struct dist *d;
	struct dist_dev *dd;  /* device memory (be not host-visible): every exchange; else NULL */
	double dev_comm;      /* seconds in device exchanges (dd, timed), since the layer began */
	int overlap;          /* dd: the tokens' exchanges on the backend's second queue */
	int timing;           /* stages (and dd's exchanges) timed between syncs */
	struct moe_layer *ml; /* local gating and locations */
	int64_t T;
	int k, routed, have_forward, input_grad;
	int64_t C;
	struct moe_plan plan;
	struct backend_moe_route vroute;
	/* backend workspace */
	struct buf vidx, vloc, vscore, vcount, dscore, vdscore, ones;
	struct buf send, eo, recv, out, hpre, h, dh;
	struct buf gw1, gb1, gw2, gb2, dw1, db1, dw2, db2;
	/* host workspace for the virtual route */
	int32_t *hidx, *hloc;
	float *hscore;
	int64_t *hcount;
	size_t hcap;
	struct moe_dist_step last;
	struct moe_dist_stats st;
	double exposed; /* seconds the caller's thread spent in or waiting for exchanges */
};

static size_t round64(size_t bytes) { return (bytes + 63) / 64 * 64; }

static int grow(struct moe_dist_layer *l, struct buf *b, size_t bytes)
{
	struct backend *be = l->be;
	if (bytes <= b->bytes)
		return 0;
	bytes = round64(bytes);
	be->op->free(be, b->p);
	l->st.bytes -= b->bytes;
	b->bytes = 0;
	b->p = NULL;
	if (be->op->alloc(be, &b->p, bytes) < 0) {
		b->p = NULL;
		return err_set(CORE_ENOMEM, NULL, "cannot allocate %zu bytes of MoE workspace",
			       bytes);
	}
	b->bytes = bytes;
	l->st.bytes += bytes;
	l->st.allocs++;
	if (l->st.bytes > l->st.peak)
		l->st.peak = l->st.bytes;
	return 0;
}

int moe_dist_layer_init(struct moe_dist_layer **out, const struct moe_config *cfg,
			struct backend *be, struct dist *d)
{
	*out = NULL;
	ERR_FORWARD(moe_config_check(cfg));
	/* Every rank must hold the same layer: checked before anything else is exchanged. */
	int64_t v[] = {cfg->T, cfg->M, cfg->H, cfg->E, cfg->k, cfg->capacity_align, cfg->bpr,
		       (int64_t)cfg->act, (int64_t)cfg->loss, (int64_t)cfg->seed, 0,
		       be->host_visible};
	memcpy(&v[10], &cfg->gate_noise, sizeof cfg->gate_noise);
	static const char *const names[] = {"T", "M", "H", "E", "k", "capacity alignment",
					    "bpr", "activation", "auxiliary loss", "seed",
					    "gate noise", "whether backend memory is host memory"};
	ERR_FORWARD(dist_agree(d, v, (int)(sizeof v / sizeof v[0]), names));

	struct moe_dist_layer *l = calloc(1, sizeof *l);
	if (!l)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the MoE layer");
	l->cfg = *cfg;
	l->be = be;
	l->d = d;
	int rc = moe_dist_place(&l->pl, cfg, dist_size(d), dist_rank(d));
	if (rc == 0)
		rc = moe_layer_init(&l->ml, cfg, be);
	/* Device memory: the layer opens its own dist_dev, collectively (every rank agreed on
	 * host_visible above, and a rank's failure so far becomes everyone's first). */
	if (!be->host_visible) {
		rc = dist_agree_rc(d, rc);
		if (rc == 0)
			rc = dist_dev_open(&l->dd, d, be);
	}
	l->overlap = l->dd && be->op->side_begin;
	l->timing = be->host_visible;
	if (rc < 0) {
		moe_dist_layer_free(l);
		return rc;
	}
	*out = l;
	return 0;
}

void moe_dist_layer_free(struct moe_dist_layer *l)
{
	if (!l)
		return;
	struct buf *all[] = {&l->vidx, &l->vloc, &l->vscore, &l->vcount, &l->dscore, &l->vdscore,
			     &l->ones, &l->send, &l->eo, &l->recv, &l->out, &l->hpre, &l->h,
			     &l->dh, &l->gw1, &l->gb1, &l->gw2, &l->gb2, &l->dw1, &l->db1,
			     &l->dw2, &l->db2};
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		l->be->op->free(l->be, all[i]->p);
	dist_dev_close(l->dd);
	moe_layer_free(l->ml);
	free(l->hidx);
	free(l->hloc);
	free(l->hscore);
	free(l->hcount);
	free(l);
}

const struct moe_dist_place *moe_dist_layer_place(const struct moe_dist_layer *l)
{
	return &l->pl;
}
const struct moe_dist_step *moe_dist_layer_last(const struct moe_dist_layer *l)
{
	return &l->last;
}
void moe_dist_layer_set_timing(struct moe_dist_layer *l, int on)
{
	l->timing = on || l->be->host_visible;
	moe_layer_set_timing(l->ml, on); /* and the expert GEMMs' profile */
}

void moe_dist_layer_set_overlap(struct moe_dist_layer *l, int on)
{
	l->overlap = on && l->dd && l->be->op->side_begin;
}

void moe_dist_layer_stats(const struct moe_dist_layer *l, struct moe_dist_stats *s)
{
	*s = l->st;
	/* the device exchanges' staging grows to the largest step and stays, like the rest */
	if (l->dd) {
		s->bytes += dist_dev_bytes(l->dd);
		s->peak += dist_dev_bytes(l->dd);
		s->allocs += dist_dev_allocs(l->dd);
	}
}

/* A stage boundary: NaN when stages are not timed (a device left to run ahead). */
static double clock_be(struct moe_dist_layer *l)
{
	if (!l->timing)
		return NAN;
	l->be->op->sync(l->be);
	return now_seconds();
}

/* Route with the capacity setting, or with C_g = force (> 0, before alignment). */
static int route(struct moe_dist_layer *l, const struct moe_params *p, const float *x,
		 int64_t T, int k, double setting, int64_t force, uint64_t step)
{
	const struct moe_config *cfg = &l->cfg;
	const int W = l->pl.W, E = cfg->E;

	l->routed = l->have_forward = 0;
	if (k == 0)
		k = cfg->k;
	/* The arguments must agree before anything depends on them. */
	int64_t v[5] = {T, k, 0, force, (int64_t)step};
	memcpy(&v[2], &setting, sizeof setting);
	static const char *const names[] = {"the token count", "top-k", "the capacity setting",
					    "the forced capacity", "the step"};
	ERR_FORWARD(dist_agree(l->d, v, 5, names));
	if (k < 1 || k > E)
		return err_set(CORE_EUSAGE, NULL, "top-k %d is outside [1, E = %d]", k, E);
	if (T < 1 || T > cfg->T)
		return err_set(CORE_EUSAGE, NULL, "token count %lld is outside [1, %lld]",
			       (long long)T, (long long)cfg->T);
	if (!isfinite(setting))
		return err_set(CORE_EUSAGE, NULL, "capacity setting is not finite");

	memset(&l->last, 0, sizeof l->last);
	double t0 = now_seconds();
	/* Rank q draws the noise of the concatenated batch's tokens q*T .. q*T + T - 1. */
	int rc = moe_route_gate(l->ml, p->wg, x, T, k, step * (uint64_t)W + (uint64_t)l->pl.q);
	ERR_FORWARD(dist_agree_rc(l->d, rc));
	const struct moe_routing *rt = moe_layer_routing(l->ml);
	int64_t need = 0;
	for (int e = 0; e < E; e++)
		need = rt->count[e] > need ? rt->count[e] : need;
	ERR_FORWARD(dist_allreduce_i64(l->d, &need, 1, DIST_MAX));
	int64_t C = need;
	if (force > 0) {
		C = force;
	} else if (setting != 0.0) {
		C = moe_capacity_fixed(E, T, k, fabs(setting));
		if (setting < 0.0 && need < C)
			C = need;
	}
	const int64_t align = cfg->capacity_align / gcd64(cfg->capacity_align, l->pl.s) * l->pl.s;
	if (C % align)
		C += align - C % align;
	if (C < 1)
		return err_set(CORE_EUSAGE, NULL, "capacity setting %g leaves no slot per expert "
			       "(k*int(%g*ceil(T/E)) = 0 at T=%lld, E=%d, k=%d)", setting,
			       fabs(setting), (long long)T, E, k);
	rc = moe_route_place(l->ml, C);
	ERR_FORWARD(dist_agree_rc(l->d, rc));
	double red[2] = {(double)rt->dropped, rt->aux_loss};
	ERR_FORWARD(dist_allreduce_f64(l->d, red, 2, DIST_SUM));
	l->T = T;
	l->k = k;
	l->C = C;
	l->last.C = C;
	l->last.need = need;
	l->last.dropped = (int64_t)red[0];
	l->last.aux_loss = (float)(red[1] / W);
	l->last.gate = now_seconds() - t0;
	l->routed = 1;
	return 0;
}

int moe_dist_route(struct moe_dist_layer *l, const struct moe_params *p, const float *x,
		   int64_t T, int k, double capacity_setting, uint64_t step)
{
	return route(l, p, x, T, k, capacity_setting, 0, step);
}

int moe_dist_route_capacity(struct moe_dist_layer *l, const struct moe_params *p,
			    const float *x, int64_t T, int k, int64_t C, uint64_t step)
{
	if (C < 1)
		return err_set(CORE_EUSAGE, NULL, "capacity %lld is below 1", (long long)C);
	return route(l, p, x, T, k, 0.0, C, step);
}

/* The virtual route of r copies (r > 1): choice (j, r') of token t at (j*k + r')*T + t points
 * at expert idx*r + j, same slot and score; expert e*r + j counts n_e. */
static int build_vroute(struct moe_dist_layer *l, int r)
{
	struct backend *be = l->be;
	const struct moe_routing *rt = moe_layer_routing(l->ml);
	const int64_t kT = (int64_t)l->k * l->T, E = l->cfg.E;
	const size_t need = (size_t)(kT * r);

	if (r == 1) {
		l->vroute = *moe_layer_route(l->ml);
		return 0;
	}
	ERR_FORWARD(grow(l, &l->vidx, need * sizeof(int32_t)));
	ERR_FORWARD(grow(l, &l->vloc, need * sizeof(int32_t)));
	ERR_FORWARD(grow(l, &l->vscore, need * sizeof(float)));
	ERR_FORWARD(grow(l, &l->vcount, (size_t)(E * l->pl.s) * sizeof(int64_t)));
	l->vroute = (struct backend_moe_route){.T = l->T, .C = l->C, .E = (int)(E * r),
					       .k = l->k * r, .idx = l->vidx.p,
					       .loc = l->vloc.p, .score = l->vscore.p,
					       .count = l->vcount.p};
	if (be->op->moe_route_copies) /* on the device, queued: no round trip through the host */
		return be->op->moe_route_copies(be, moe_layer_route(l->ml), r, l->vidx.p,
						l->vloc.p, l->vscore.p, l->vcount.p);
	/* host memory: built on the host */
	if (l->hcap < need || !l->hcount) {
		free(l->hidx);
		free(l->hloc);
		free(l->hscore);
		free(l->hcount);
		l->hidx = malloc(need * sizeof(int32_t));
		l->hloc = malloc(need * sizeof(int32_t));
		l->hscore = malloc(need * sizeof(float));
		l->hcount = malloc((size_t)(E * l->pl.s) * sizeof(int64_t));
		l->hcap = need;
		l->st.allocs++;
		if (!l->hidx || !l->hloc || !l->hscore || !l->hcount) {
			l->hcap = 0;
			return err_set(CORE_ENOMEM, NULL, "cannot allocate the virtual route");
		}
	}
	ERR_FORWARD(be->op->download(be, l->hidx, rt->idx, (size_t)kT * sizeof(int32_t)));
	ERR_FORWARD(be->op->download(be, l->hloc, rt->loc, (size_t)kT * sizeof(int32_t)));
	ERR_FORWARD(be->op->download(be, l->hscore, rt->score, (size_t)kT * sizeof(float)));
	for (int j = r - 1; j >= 0; j--)
		for (int64_t i = kT - 1; i >= 0; i--) {
			l->hidx[j * kT + i] = l->hidx[i] * r + j; /* j = 0 last: in place */
			l->hloc[j * kT + i] = l->hloc[i];
			l->hscore[j * kT + i] = l->hscore[i];
		}
	for (int64_t e = 0; e < E; e++)
		for (int j = 0; j < r; j++)
			l->hcount[e * r + j] = rt->count[e];
	ERR_FORWARD(be->op->upload(be, l->vidx.p, l->hidx, need * sizeof(int32_t)));
	ERR_FORWARD(be->op->upload(be, l->vloc.p, l->hloc, need * sizeof(int32_t)));
	ERR_FORWARD(be->op->upload(be, l->vscore.p, l->hscore, need * sizeof(float)));
	ERR_FORWARD(be->op->upload(be, l->vcount.p, l->hcount, (size_t)(E * r) * sizeof(int64_t)));
	return 0;
}

/* ---- a step under a plan ------------------------------------------------------------------ */

struct geom {
	int r, rr;    /* r, and the copies encode writes (max(r, 1)) */
	int g, gb2;   /* group sizes of the weights' all-gather and of b2's */
	int bias;     /* this rank's slice adds b2 */
	int nle;      /* local experts */
	int64_t Hl;   /* hidden units of a local expert's slice */
	int64_t cr;   /* rows per block of the send layout */
	int pieces;
	int64_t a[MAX_PIECES + 1]; /* piece i: rows [a[i], a[i+1]) of every block */
};

static void geom_of(const struct moe_dist_layer *l, const struct moe_plan *p, struct geom *G)
{
	const struct moe_dist_place *pl = &l->pl;
	const int W = pl->W, E = l->cfg.E;

	memset(G, 0, sizeof *G);
	G->r = p->r;
	G->rr = p->r ? p->r : 1;
	if (p->r == 0) {
		G->g = G->gb2 = W;
		G->bias = 1;
		G->nle = E;
		G->Hl = l->cfg.H;
		G->cr = l->C;
		G->pieces = 1;
	} else {
		G->g = pl->s / p->r;
		G->gb2 = E >= W ? 1 : pl->s;
		G->bias = (pl->q % pl->s) / G->g == 0;
		G->nle = pl->El;
		G->Hl = l->cfg.H / p->r;
		G->cr = E >= W ? l->C : l->C / G->g;
		G->pieces = p->d;
	}
	for (int i = 0; i <= G->pieces; i++)
		G->a[i] = G->cr * i / G->pieces;
}

/* One shard tensor of n floats gathered in groups of g into b (or used in place). */
static int gather1(struct moe_dist_layer *l, int g, const float *shard, size_t n,
		   struct buf *b, const float **out)
{
	if (g == 1) {
		*out = shard;
		return 0;
	}
	ERR_FORWARD(grow(l, b, sizeof(float) * n * (size_t)g));
	if (l->dd)
		ERR_FORWARD(dist_dev_allgather(l->dd, g, shard, b->p, sizeof(float) * n));
	else
		ERR_FORWARD(dist_allgather(l->d, g, shard, b->p, sizeof(float) * n));
	l->st.param_bytes_moved += (double)(g - 1) * (double)n * sizeof(float);
	*out = b->p;
	return 0;
}

struct wset {
	const float *w1, *b1, *w2, *b2;
};

static int gather_params(struct moe_dist_layer *l, const struct moe_params *p,
			 const struct geom *G, struct wset *w)
{
	const size_t El = (size_t)l->pl.El, Hs = (size_t)l->pl.Hs, M = (size_t)l->cfg.M;
	ERR_FORWARD(gather1(l, G->g, p->w1, El * Hs * M, &l->gw1, &w->w1));
	ERR_FORWARD(gather1(l, G->g, p->b1, El * Hs, &l->gb1, &w->b1));
	ERR_FORWARD(gather1(l, G->g, p->w2, El * Hs * M, &l->gw2, &w->w2));
	return gather1(l, G->gb2, p->b2, (size_t)l->pl.b2n, &l->gb2, &w->b2);
}

/* The parameters the forward gathered, still in place (or the shard itself). */
static void kept_params(const struct moe_dist_layer *l, const struct moe_params *p,
			const struct geom *G, struct wset *w)
{
	w->w1 = G->g == 1 ? p->w1 : l->gw1.p;
	w->b1 = G->g == 1 ? p->b1 : l->gb1.p;
	w->w2 = G->g == 1 ? p->w2 : l->gw2.p;
	w->b2 = G->gb2 == 1 ? p->b2 : l->gb2.p;
}

static int ones_for(struct moe_dist_layer *l, int64_t n)
{
	if ((size_t)n * sizeof(float) <= l->ones.bytes)
		return 0;
	ERR_FORWARD(grow(l, &l->ones, sizeof(float) * (size_t)n));
	return l->be->op->fill(l->be, l->ones.p, l->ones.bytes / sizeof(float), 1.0f);
}

static enum backend_act act_of(const struct moe_config *cfg)
{
	return cfg->act == MOE_ACT_GELU ? BACKEND_ACT_GELU : BACKEND_ACT_RELU;
}

/* nle experts, N rows each, contiguous: o = act(x w1^T + b1) w2 (+ b2). */
static int experts_fwd(struct moe_dist_layer *l, const float *x, float *o, float *hpre, float *h,
		       int nle, int64_t N, int64_t Hl, const struct wset *w, int bias)
{
	struct backend *be = l->be;
	const int64_t M = l->cfg.M;
	const int gelu = l->cfg.act == MOE_ACT_GELU;

	for (int b = 0; b < nle && N > 0; b++) {
		float *hb = h + b * N * Hl, *pb = gelu ? hpre + b * N * Hl : hb;
		ERR_FORWARD(be->op->matmul_forward(be, pb, x + b * N * M, w->w1 + b * Hl * M, NULL,
						   (int)N, (int)M, (int)Hl, BACKEND_W_OI));
		ERR_FORWARD(be->op->bias_act_forward(be, pb, hb, w->b1 + b * Hl, (int)N, (int)Hl,
						     act_of(&l->cfg)));
		ERR_FORWARD(be->op->matmul_forward(be, o + b * N * M, hb, w->w2 + b * Hl * M,
						   bias ? w->b2 + b * M : NULL, (int)N, (int)Hl,
						   (int)M, BACKEND_W_IO));
	}
	return 0;
}

struct gset {
	float *w1, *b1, *w2, *b2; /* b2 NULL: this slice adds no bias */
};

/* The backward of experts_fwd, gradients added into gs; x is overwritten with dx when
 * input_grad. */
static int experts_bwd(struct moe_dist_layer *l, float *x, const float *dout, const float *hpre,
		       const float *h, int nle, int64_t N, int64_t Hl, const struct wset *w,
		       const struct gset *gs, int input_grad)
{
	struct backend *be = l->be;
	const int64_t M = l->cfg.M;
	const int gelu = l->cfg.act == MOE_ACT_GELU;

	if (N == 0)
		return 0;
	ERR_FORWARD(ones_for(l, N));
	ERR_FORWARD(grow(l, &l->dh, sizeof(float) * (size_t)(N * Hl)));
	const float *ones = l->ones.p;
	float *dh = l->dh.p;
	for (int b = 0; b < nle; b++) {
		float *xb = x + b * N * M;
		const float *db = dout + b * N * M, *hb = h + b * N * Hl;
		const float *pb = gelu ? hpre + b * N * Hl : hb;
		const float *w1 = w->w1 + b * Hl * M, *w2 = w->w2 + b * Hl * M;
		ERR_FORWARD(be->op->gemm(be, 1, 0, (int)Hl, (int)M, (int)N, 1.0f, hb, (int)Hl, db,
					 (int)M, 1.0f, gs->w2 + b * Hl * M, (int)M));
		if (gs->b2)
			ERR_FORWARD(be->op->gemm(be, 0, 0, 1, (int)M, (int)N, 1.0f, ones, (int)N, db,
						 (int)M, 1.0f, gs->b2 + b * M, (int)M));
		ERR_FORWARD(be->op->gemm(be, 0, 1, (int)N, (int)Hl, (int)M, 1.0f, db, (int)M, w2,
					 (int)M, 0.0f, dh, (int)Hl));
		ERR_FORWARD(be->op->act_backward(be, dh, NULL, pb, (int)N, (int)Hl,
						 act_of(&l->cfg)));
		ERR_FORWARD(be->op->gemm(be, 0, 0, 1, (int)Hl, (int)N, 1.0f, ones, (int)N, dh,
					 (int)Hl, 1.0f, gs->b1 + b * Hl, (int)Hl));
		ERR_FORWARD(be->op->gemm(be, 1, 0, (int)Hl, (int)M, (int)N, 1.0f, dh, (int)Hl, xb,
					 (int)M, 1.0f, gs->w1 + b * Hl * M, (int)M));
		if (input_grad)
			ERR_FORWARD(be->op->gemm(be, 0, 0, (int)N, (int)M, (int)Hl, 1.0f, dh, (int)Hl,
						 w1, (int)M, 0.0f, xb, (int)M));
	}
	return 0;
}

/* What a piece of the pipeline computes: piece i's rows are N = W * n_i per local expert,
 * at row El*W*a[i] of the piece-major buffers. */
struct piece_ctx {
	const struct geom *G;
	const struct wset *w;
	const struct gset *gs;
	int backward, input_grad;
};

static int piece_work(struct moe_dist_layer *l, const struct piece_ctx *c, int i)
{
	const struct geom *G = c->G;
	const int64_t W = l->pl.W, M = l->cfg.M, n = G->a[i + 1] - G->a[i];
	const int64_t row = (int64_t)G->nle * W * G->a[i];
	float *recv = (float *)l->recv.p + row * M, *out = (float *)l->out.p + row * M;
	float *h = (float *)l->h.p + row * G->Hl;
	float *hpre = l->hpre.p ? (float *)l->hpre.p + row * G->Hl : NULL;

	if (!c->backward)
		return experts_fwd(l, recv, out, hpre, h, G->nle, W * n, G->Hl, c->w, G->bias);
	return experts_bwd(l, recv, out, hpre, h, G->nle, W * n, G->Hl, c->w, c->gs,
			   c->input_grad);
}

/* Exchange piece i: dispatch (from the send layout src into the piece-major in) or return
 * (from the piece-major buffer back into the send layout dst). */
static void spans(const struct moe_dist_layer *l, const struct geom *G, int i, int dispatch,
		  float *layout, float *piecebuf, struct dist_span *snd, struct dist_span *rcv)
{
	const int64_t W = l->pl.W, M = l->cfg.M, n = G->a[i + 1] - G->a[i];
	struct dist_span lay = {.base = layout, .rows = G->cr, .row0 = G->a[i], .interleaved = 0};
	struct dist_span pc = {.base = piecebuf + (int64_t)G->nle * W * G->a[i] * M, .rows = n,
			       .row0 = 0, .interleaved = 1};
	*snd = dispatch ? lay : pc;
	*rcv = dispatch ? pc : lay;
}

static int exchange(struct moe_dist_layer *l, const struct geom *G, enum dist_a2a a, int i,
		    int dispatch, float *layout, float *piecebuf, int async, int64_t *ticket)
{
	const int64_t n = G->a[i + 1] - G->a[i];
	const size_t rb = sizeof(float) * (size_t)l->cfg.M;
	struct dist_span snd, rcv;

	if (n == 0)
		return 0;
	spans(l, G, i, dispatch, layout, piecebuf, &snd, &rcv);
	l->st.token_bytes_moved += (double)(l->pl.W - 1) * G->nle * (double)n * (double)rb;
	if (l->dd && l->timing) {
		/* timed between two syncs: nothing overlaps it */
		ERR_FORWARD(l->be->op->sync(l->be));
		const double t0 = now_seconds();
		ERR_FORWARD(dist_dev_alltoall(l->dd, a, &snd, &rcv, G->nle, n, rb));
		ERR_FORWARD(l->be->op->sync(l->be));
		const double t = now_seconds() - t0;
		l->exposed += t;
		l->dev_comm += t;
		return 0;
	}
	if (l->dd && async) {
		/* on the backend's second queue, after everything queued so far (the encode, or
		 * the piece's experts); the ticket is its mark */
		struct backend *be = l->be;
		ERR_FORWARD(be->op->side_begin(be));
		int rc = dist_dev_alltoall(l->dd, a, &snd, &rcv, G->nle, n, rb);
		int rc2 = be->op->side_end(be, ticket);
		return rc < 0 ? rc : rc2;
	}
	if (l->dd) /* queued in order with the experts */
		return dist_dev_alltoall(l->dd, a, &snd, &rcv, G->nle, n, rb);
	if (async)
		return dist_alltoall_start(l->d, a, &snd, &rcv, G->nle, n, rb, ticket);
	const double t0 = now_seconds();
	int rc = dist_alltoall(l->d, a, &snd, &rcv, G->nle, n, rb);
	l->exposed += now_seconds() - t0;
	return rc;
}

/* Wait for a ticket, counting the time the experts stood still; on a device, the main queue
 * waits for the second queue's mark (the host goes on). */
static int wait_for(struct moe_dist_layer *l, int64_t ticket)
{
	if (l->dd)
		return l->be->op->side_wait(l->be, ticket);
	const double t0 = now_seconds();
	int rc = dist_wait(l->d, ticket);
	l->exposed += now_seconds() - t0;
	return rc;
}

/* The pipeline of d pieces: dispatch i+1 and return i-1 run on the communication thread
 * (host memory) or the backend's second queue (a device) while piece i computes. ret == 0:
 * nothing goes back (backward without an input gradient). On a device each piece's experts
 * wait for its dispatch's mark, and each return starts after its piece's experts (side_begin
 * orders it after everything queued before); the main queue waits for the last mark before
 * anything reads the results. Timed device stages (moe_dist_layer_set_timing) run the
 * exchanges in order instead, each between two syncs. */
static int pipeline(struct moe_dist_layer *l, const struct piece_ctx *c, enum dist_a2a a,
		    float *src, float *in, float *outp, float *dst, int ret)
{
	const struct geom *G = c->G;
	const int P = G->pieces;
	const int async = P > 1 && (!l->dd || (l->overlap && !l->timing));
	int64_t t_in[MAX_PIECES], last = -1;

	for (int i = 0; i < P; i++)
		t_in[i] = -1;
	ERR_FORWARD(exchange(l, G, a, 0, 1, src, in, async, &t_in[0]));
	for (int i = 0; i < P; i++) {
		if (i + 1 < P)
			ERR_FORWARD(exchange(l, G, a, i + 1, 1, src, in, async, &t_in[i + 1]));
		if (t_in[i] >= 0)
			ERR_FORWARD(wait_for(l, t_in[i]));
		ERR_FORWARD(piece_work(l, c, i));
		if (ret)
			ERR_FORWARD(exchange(l, G, a, i, 0, dst, outp, async, &last));
	}
	/* Tickets are issued in order: waiting for the largest waits for all. */
	for (int i = 0; i < P; i++)
		last = t_in[i] > last ? t_in[i] : last;
	if (last >= 0)
		ERR_FORWARD(wait_for(l, last));
	return 0;
}

static int agree_plan(struct moe_dist_layer *l, const struct moe_plan *p, int extra)
{
	int64_t v[4] = {p->r, p->d, (int64_t)p->a, extra};
	static const char *const names[] = {"r", "d", "the All-to-All algorithm",
					    "whether the input needs a gradient"};
	return dist_agree(l->d, v, 4, names);
}

int moe_dist_forward_routed(struct moe_dist_layer *l, const struct moe_params *p,
			    const float *x, float *y, const struct moe_plan *plan)
{
	struct backend *be = l->be;
	const int64_t M = l->cfg.M, H = l->cfg.H, C = l->C, E = l->cfg.E;
	const int gelu = l->cfg.act == MOE_ACT_GELU;
	struct moe_plan pn = *plan;
	struct geom G;
	struct wset w;

	if (!l->routed)
		return err_set(CORE_EUSAGE, NULL, "moe_dist_forward_routed without a route");
	ERR_FORWARD(moe_plan_check(plan, &l->pl));
	if (l->dd && pn.r > 0 && pn.a == DIST_A2A_MPI)
		return err_set(CORE_EUSAGE, NULL, "the mpi all-to-all runs on host memory, not on "
			       "the %s backend's: use linear or 2dh", be->name);
	if (pn.r == 0) {
		pn.d = 1;
		pn.a = DIST_A2A_LINEAR;
	}
	ERR_FORWARD(agree_plan(l, &pn, 0));
	l->plan = pn;
	l->last.plan = pn;
	geom_of(l, &pn, &G);
	const double g0 = be->op->gemm_seconds(be);
	struct dist_stats ds0;
	dist_stats(l->d, &ds0);
	const double dc0 = l->dev_comm;
	l->exposed = 0;

	double t0 = clock_be(l), t1;
	ERR_FORWARD(gather_params(l, p, &G, &w));
	t1 = clock_be(l);
	l->last.gather = t1 - t0;
	t0 = t1;

	const size_t lay = sizeof(float) * (size_t)(E * G.rr * C * M);
	const size_t hb = sizeof(float) * (size_t)(E * C * H);
	ERR_FORWARD(build_vroute(l, G.rr));
	ERR_FORWARD(grow(l, &l->send, lay));
	ERR_FORWARD(grow(l, &l->eo, lay));
	ERR_FORWARD(grow(l, &l->h, hb));
	if (gelu)
		ERR_FORWARD(grow(l, &l->hpre, hb));
	ERR_FORWARD(be->op->moe_encode(be, &l->vroute, x, l->send.p, M, 1));
	t1 = clock_be(l);
	l->last.encode = t1 - t0;
	t0 = t1;

	if (pn.r == 0) {
		ERR_FORWARD(experts_fwd(l, l->send.p, l->eo.p, l->hpre.p, l->h.p, (int)E, C, H, &w,
					1));
	} else {
		ERR_FORWARD(grow(l, &l->recv, lay));
		ERR_FORWARD(grow(l, &l->out, lay));
		const struct piece_ctx c = {.G = &G, .w = &w};
		ERR_FORWARD(pipeline(l, &c, pn.a, l->send.p, l->recv.p, l->out.p, l->eo.p, 1));
	}
	t1 = clock_be(l);
	l->last.experts = t1 - t0;
	t0 = t1;

	ERR_FORWARD(be->op->moe_decode(be, &l->vroute, l->eo.p, y, M));
	l->last.decode = clock_be(l) - t0;
	struct dist_stats ds1;
	dist_stats(l->d, &ds1);
	l->last.comm = ds1.comm_seconds - ds0.comm_seconds + (l->dev_comm - dc0);
	l->last.comm_exposed = l->exposed;
	if (l->dd && !l->timing) /* the device ran ahead: its exchanges were not timed */
		l->last.comm = l->last.comm_exposed = NAN;
	l->last.gemm = be->op->gemm_seconds(be) - g0;
	l->have_forward = 1;
	l->st.steps++;
	return 0;
}

int moe_dist_forward(struct moe_dist_layer *l, const struct moe_params *p, const float *x,
		     float *y, int64_t T, int k, double capacity_setting, uint64_t step,
		     const struct moe_plan *plan)
{
	ERR_FORWARD(moe_dist_route(l, p, x, T, k, capacity_setting, step));
	return moe_dist_forward_routed(l, p, x, y, plan);
}

/* Where the gradients of the gathered (or local) parameters go: the shard itself when the
 * group is one rank, else a gathered-shape buffer reduce-scattered afterwards. */
static int grad_targets(struct moe_dist_layer *l, const struct geom *G,
			struct moe_params *g, struct gset *gs)
{
	struct backend *be = l->be;
	const size_t El = (size_t)l->pl.El, Hs = (size_t)l->pl.Hs, M = (size_t)l->cfg.M;
	struct {
		struct buf *tmp;
		float *shard, **dst;
		size_t n;
		int grp;
	} t[] = {{&l->dw1, g->w1, &gs->w1, El * Hs * M, G->g},
		 {&l->db1, g->b1, &gs->b1, El * Hs, G->g},
		 {&l->dw2, g->w2, &gs->w2, El * Hs * M, G->g},
		 {&l->db2, g->b2, &gs->b2, (size_t)l->pl.b2n, G->gb2}};
	for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
		const size_t n = t[i].n * (size_t)t[i].grp;
		if (t[i].grp == 1) {
			*t[i].dst = t[i].shard;
		} else {
			ERR_FORWARD(grow(l, t[i].tmp, sizeof(float) * n));
			*t[i].dst = t[i].tmp->p;
		}
		ERR_FORWARD(be->op->memset(be, *t[i].dst, 0, sizeof(float) * n));
	}
	return 0;
}

static int reduce_grads(struct moe_dist_layer *l, const struct geom *G, struct moe_params *g)
{
	const size_t El = (size_t)l->pl.El, Hs = (size_t)l->pl.Hs, M = (size_t)l->cfg.M;
	struct {
		struct buf *tmp;
		float *shard;
		size_t n;
		int grp;
	} t[] = {{&l->dw1, g->w1, El * Hs * M, G->g},
		 {&l->db1, g->b1, El * Hs, G->g},
		 {&l->dw2, g->w2, El * Hs * M, G->g},
		 {&l->db2, g->b2, (size_t)l->pl.b2n, G->gb2}};
	for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
		if (t[i].grp == 1)
			continue;
		if (l->dd)
			ERR_FORWARD(dist_dev_reduce_scatter_f32(l->dd, t[i].grp, t[i].tmp->p,
								t[i].shard, t[i].n));
		else
			ERR_FORWARD(dist_reduce_scatter_f32(l->d, t[i].grp, t[i].tmp->p,
							    t[i].shard, t[i].n));
		l->st.param_bytes_moved += (double)(t[i].grp - 1) * (double)t[i].n * sizeof(float);
	}
	if (l->dd)
		return dist_dev_allreduce_f32(l->dd, g->wg, (size_t)(l->cfg.M * l->cfg.E));
	return dist_allreduce_f32(l->d, g->wg, (size_t)(l->cfg.M * l->cfg.E));
}

int moe_dist_backward(struct moe_dist_layer *l, const struct moe_params *p,
		      const float *x, const float *dy, float *dx, struct moe_params *g,
		      float aux_weight)
{
	struct backend *be = l->be;
	const int64_t M = l->cfg.M, H = l->cfg.H, C = l->C, E = l->cfg.E, T = l->T;
	const int input_grad = dx != NULL;
	struct geom G;
	struct wset w;
	struct gset gs;

	if (!l->have_forward)
		return err_set(CORE_EUSAGE, NULL, "moe_dist_backward without a forward");
	ERR_FORWARD(agree_plan(l, &l->plan, input_grad));
	geom_of(l, &l->plan, &G);
	const double g0 = be->op->gemm_seconds(be);
	struct dist_stats ds0;
	dist_stats(l->d, &ds0);
	const double dc0 = l->dev_comm;
	kept_params(l, p, &G, &w);
	l->exposed = 0;

	double t0 = clock_be(l), t1;
	const size_t kT = (size_t)l->k * (size_t)T;
	ERR_FORWARD(grow(l, &l->dscore, sizeof(float) * kT));
	if (G.rr > 1) {
		ERR_FORWARD(grow(l, &l->vdscore, sizeof(float) * kT * (size_t)G.rr));
		ERR_FORWARD(be->op->moe_decode_backward(be, &l->vroute, dy, l->eo.p, l->eo.p,
							l->vdscore.p, M, 1));
		/* dscore = the sum of the r copies' scores' gradients. */
		ERR_FORWARD(ones_for(l, G.rr));
		ERR_FORWARD(be->op->gemm(be, 0, 0, 1, (int)kT, G.rr, 1.0f, l->ones.p, G.rr,
					 l->vdscore.p, (int)kT, 0.0f, l->dscore.p, (int)kT));
	} else {
		ERR_FORWARD(be->op->moe_decode_backward(be, &l->vroute, dy, l->eo.p, l->eo.p,
							l->dscore.p, M, 1));
	}
	t1 = clock_be(l);
	l->last.bwd_decode = t1 - t0;
	t0 = t1;

	ERR_FORWARD(grad_targets(l, &G, g, &gs));
	if (!G.bias)
		gs.b2 = NULL;
	if (G.r == 0) {
		ERR_FORWARD(experts_bwd(l, l->send.p, l->eo.p, l->hpre.p, l->h.p, (int)E, C, H, &w,
					&gs, input_grad));
	} else {
		const struct piece_ctx c = {.G = &G, .w = &w, .gs = &gs, .backward = 1,
					    .input_grad = input_grad};
		ERR_FORWARD(pipeline(l, &c, l->plan.a, l->eo.p, l->out.p, l->recv.p, l->send.p,
				     input_grad));
	}
	t1 = clock_be(l);
	l->last.bwd_experts = t1 - t0;
	t0 = t1;

	if (input_grad)
		ERR_FORWARD(be->op->moe_encode_backward(be, &l->vroute, l->send.p, dx, M));
	t1 = clock_be(l);
	l->last.bwd_encode = t1 - t0;
	t0 = t1;
	ERR_FORWARD(moe_gate_backward(l->ml, p->wg, x, l->dscore.p, dx, g->wg,
				      aux_weight / (float)l->pl.W));
	t1 = clock_be(l);
	l->last.bwd_gate = t1 - t0;
	t0 = t1;
	ERR_FORWARD(reduce_grads(l, &G, g));
	l->last.reduce = clock_be(l) - t0;
	struct dist_stats ds1;
	dist_stats(l->d, &ds1);
	l->last.comm += ds1.comm_seconds - ds0.comm_seconds + (l->dev_comm - dc0);
	l->last.comm_exposed += l->exposed;
	l->last.gemm += be->op->gemm_seconds(be) - g0;
	l->have_forward = 0;
	return 0;
}
