/* test_moe_dist.c - the distributed MoE layer (moe_dist.h) against the single-process layer
 * (moe.h) on the reference backend, under mpirun:
 *
 *   mpirun -np W test_moe_dist [--local-size m]       every check; exit 0 when all pass
 *   mpirun -np W test_moe_dist --disagree             rank 1 passes another E: every rank
 *                                                     must fail with one line, none hang
 *   mpirun -np W test_moe_dist --device cuda [...]    the layer on device memory (dist_dev.h,
 *                                                     one device per rank: its local index);
 *                                                     d in {1, 2}, a in {linear, 2dh}, and
 *                                                     a = mpi refused (CORE_EUSAGE)
 *
 * Checks, for each placement (E a multiple of W, E dividing W) and every plan {r, d, a}:
 *  1. with no drops and no auxiliary loss, outputs, input gradients and gradient shards
 *     equal the single-process layer's on the concatenated batch of all ranks (gate noise
 *     on: rank q draws the concatenated batch's noise);
 *  2. with an auxiliary loss and drops (a fixed capacity), they equal the sum over ranks of
 *     the single-process layer on each rank's own tokens with C_g slots (moe_dist.h);
 *  3. cycling through every plan again, step after step, allocates nothing, and leaves the
 *     parameter shard where and as it was (no migration).
 * The references run on the "ref" backend (naive loops), the layer on "cpu" (BLAS), or on
 * --device's backend (build/emu/test_moe_dist: the cuda backend in the CPU emulator, NCCL
 * emulated over MPI; kept small, the emulator is slow).
 * Each failed check prints one line; exit 1 when any failed.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "common/err.h"
#include "common/rng.h"
#include "dist/dist.h"
#include "moe/moe.h"
#include "moe/moe_dist.h"

static int failures, checks, rank;
/* the layer on device memory: fewer plans (d in {1, 2}, a in {linear, 2dh}) */
static int on_device;

#define CHECK(cond, ...)                                                                   \
	do {                                                                               \
		checks++;                                                                  \
		if (!(cond)) {                                                             \
			failures++;                                                        \
			printf("rank %d: FAILED %s:%d: ", rank, __FILE__, __LINE__);       \
			printf(__VA_ARGS__);                                               \
			printf("\n");                                                      \
		}                                                                          \
	} while (0)

static void die_rc(int rc, const char *what)
{
	char buf[512];
	err_format(buf, sizeof buf, rc);
	printf("rank %d: %s: %s\n", rank, what, buf);
	exit(1);
}
#define OK(expr)                                                                           \
	do {                                                                               \
		int rc_ = (expr);                                                          \
		if (rc_ < 0)                                                               \
			die_rc(rc_, #expr);                                                \
	} while (0)

static float *dev(struct backend *be, const float *host, size_t n)
{
	float *p;
	OK(backend_alloc_zero(be, (void **)&p, n * sizeof(float) + 4));
	if (host)
		OK(be->op->upload(be, p, host, n * sizeof(float)));
	return p;
}

static float *host(struct backend *be, const float *p, size_t n)
{
	float *h = malloc(n * sizeof(float) + 4);
	OK(be->op->download(be, h, p, n * sizeof(float)));
	return h;
}

/* The largest |a - b| over n, relative to the largest |b| (at least 1). */
static double rel_diff(const float *a, const float *b, size_t n)
{
	double d = 0, m = 1;
	for (size_t i = 0; i < n; i++) {
		double e = fabs((double)a[i] - b[i]);
		d = e > d || isnan(e) ? e : d;
		m = fabs(b[i]) > m ? fabs(b[i]) : m;
	}
	return d / m;
}

struct ref {
	float *y, *dx; /* [W*T, M] host */
	struct moe_params g; /* full gradients, summed (host-side sums uploaded to ref) */
	double aux;
};

/* The single-process reference: concat = 1 runs one layer on all W*T tokens; otherwise W
 * layers on T tokens each (rank w with noise step step*W + w and capacity alignment s), the
 * gradients summed over w and the auxiliary losses averaged. */
static void reference(struct backend *rb, const struct moe_config *cfg0, const float *x,
		      const float *dy, int W, int64_t T, int s, double setting, uint64_t step,
		      float aux_weight, int concat, const struct moe_params *pfull, struct ref *out)
{
	const int64_t M = cfg0->M;
	const int parts = concat ? 1 : W;
	const int64_t Tp = concat ? W * T : T;
	struct moe_config cfg = *cfg0;
	cfg.T = Tp;
	cfg.capacity_align = s;
	size_t nparam[5] = {(size_t)(M * cfg.E), (size_t)(cfg.E * M * cfg.H),
			    (size_t)(cfg.E * cfg.H), (size_t)(cfg.E * cfg.H * M),
			    (size_t)(cfg.E * M)};
	double *acc[5];
	for (int i = 0; i < 5; i++)
		acc[i] = calloc(nparam[i], sizeof(double));
	out->y = malloc(sizeof(float) * (size_t)(W * T * M));
	out->dx = malloc(sizeof(float) * (size_t)(W * T * M));
	out->aux = 0;
	struct moe_layer *l;
	OK(moe_layer_init(&l, &cfg, rb));
	struct moe_params g;
	OK(moe_params_alloc(&g, &cfg, rb));
	for (int w = 0; w < parts; w++) {
		const float *xw = x + (size_t)(w * Tp * M), *dyw = dy + (size_t)(w * Tp * M);
		float *dxd = dev(rb, xw, (size_t)(Tp * M)), *yd = dev(rb, NULL, (size_t)(Tp * M));
		float *dyd = dev(rb, dyw, (size_t)(Tp * M)), *dxo = dev(rb, NULL, (size_t)(Tp * M));
		OK(moe_forward(l, pfull, dxd, yd, Tp, 0, setting, concat ? step : step * W + w));
		out->aux += moe_layer_routing(l)->aux_loss / (double)parts;
		OK(moe_backward(l, pfull, dxd, dyd, dxo, &g, aux_weight / (float)parts));
		OK(rb->op->download(rb, out->y + w * Tp * M, yd, sizeof(float) * (size_t)(Tp * M)));
		OK(rb->op->download(rb, out->dx + w * Tp * M, dxo, sizeof(float) * (size_t)(Tp * M)));
		float *gp[5] = {g.wg, g.w1, g.b1, g.w2, g.b2};
		for (int i = 0; i < 5; i++) {
			float *h = host(rb, gp[i], nparam[i]);
			for (size_t j = 0; j < nparam[i]; j++)
				acc[i][j] += h[j];
			free(h);
		}
		rb->op->free(rb, dxd);
		rb->op->free(rb, yd);
		rb->op->free(rb, dyd);
		rb->op->free(rb, dxo);
	}
	OK(moe_params_alloc(&out->g, &cfg, rb));
	float *gp[5] = {out->g.wg, out->g.w1, out->g.b1, out->g.w2, out->g.b2};
	for (int i = 0; i < 5; i++) {
		float *h = malloc(nparam[i] * sizeof(float));
		for (size_t j = 0; j < nparam[i]; j++)
			h[j] = (float)acc[i][j];
		OK(rb->op->upload(rb, gp[i], h, nparam[i] * sizeof(float)));
		free(h);
		free(acc[i]);
	}
	moe_params_free(&g);
	moe_layer_free(l);
}

static void compare_shard(struct backend *be, const struct moe_config *cfg,
			  const struct moe_dist_place *pl, const struct moe_params *got,
			  const struct moe_params *full, const char *what, double tol)
{
	struct moe_params want;
	OK(moe_dist_params_alloc(&want, cfg, pl, be));
	OK(moe_dist_params_from_full(&want, cfg, pl, full));
	const size_t n[5] = {(size_t)(cfg->M * cfg->E), (size_t)(pl->El * pl->Hs * cfg->M),
			     (size_t)(pl->El * pl->Hs), (size_t)(pl->El * pl->Hs * cfg->M),
			     (size_t)pl->b2n};
	const float *a[5] = {got->wg, got->w1, got->b1, got->w2, got->b2};
	const float *b[5] = {want.wg, want.w1, want.b1, want.w2, want.b2};
	static const char *const names[5] = {"dwg", "dw1", "db1", "dw2", "db2"};
	for (int i = 0; i < 5; i++) {
		float *ha = host(be, a[i], n[i]), *hb = host(be, b[i], n[i]);
		double d = rel_diff(ha, hb, n[i]);
		CHECK(d <= tol, "%s: %s differs by %.3g (tolerance %g)", what, names[i], d, tol);
		free(ha);
		free(hb);
	}
	moe_params_free(&want);
}

/* The gradient shards of all ranks put together (moe_dist_params_to_full) against the
 * reference's full gradient. */
static void compare_gathered(struct dist *d, struct backend *rb, const struct moe_config *cfg,
			     const struct moe_config *fcfg, const struct moe_dist_place *pl,
			     const struct moe_params *g, const struct moe_params *want,
			     const char *what)
{
	struct moe_params all;
	OK(moe_params_alloc(&all, fcfg, rb));
	OK(moe_dist_params_to_full(&all, cfg, pl, g, d));
	const int64_t M = cfg->M, E = cfg->E, H = cfg->H;
	const size_t n[5] = {(size_t)(M * E), (size_t)(E * M * H), (size_t)(E * H),
			     (size_t)(E * H * M), (size_t)(E * M)};
	const float *a[5] = {all.wg, all.w1, all.b1, all.w2, all.b2};
	const float *b[5] = {want->wg, want->w1, want->b1, want->w2, want->b2};
	for (int i = 0; i < 5; i++) {
		float *ha = host(rb, a[i], n[i]), *hb = host(rb, b[i], n[i]);
		double dd = rel_diff(ha, hb, n[i]);
		CHECK(dd <= 1e-5, "%s: tensor %d of the gathered gradient differs by %.3g", what, i,
		      dd);
		free(ha);
		free(hb);
	}
	moe_params_free(&all);
}

/* The device all-reduce sums in one member order on every rank (dist_dev.h): the gate's
 * gradient must be the same bits everywhere, not only close. */
static void same_on_all_ranks(struct dist *d, struct backend *be, const float *v, size_t n,
			      const char *what)
{
	float *h = host(be, v, n);
	uint64_t hash = 14695981039346656037ull; /* FNV-1a over the bytes */
	const unsigned char *b = (const unsigned char *)h;
	for (size_t i = 0; i < n * sizeof(float); i++)
		hash = (hash ^ b[i]) * 1099511628211ull;
	free(h);
	int64_t v1 = (int64_t)(hash >> 1);
	static const char *const names[] = {"the gate gradient's bits"};
	int rc = dist_agree(d, &v1, 1, names);
	CHECK(rc == 0, "%s: dwg differs between ranks", what);
}

/* The smallest |x_t w1[e][:, j] + b1[e][j]| over every token, expert and hidden unit, in
 * double: how near the batch comes to ReLU's kink, where the derivative jumps. */
static double kink_margin(struct backend *rb, const struct moe_config *cfg,
			  const struct moe_params *p, const float *x, int64_t rows)
{
	const int64_t M = cfg->M, H = cfg->H, E = cfg->E;
	float *w1 = host(rb, p->w1, (size_t)(E * M * H)), *b1 = host(rb, p->b1, (size_t)(E * H));
	double m = INFINITY;
	for (int64_t t = 0; t < rows; t++)
		for (int64_t e = 0; e < E; e++)
			for (int64_t j = 0; j < H; j++) {
				double h = b1[e * H + j];
				for (int64_t i = 0; i < M; i++)
					h += (double)x[t * M + i] * w1[(e * M + i) * H + j];
				m = fabs(h) < m ? fabs(h) : m;
			}
	free(w1);
	free(b1);
	return m;
}

static const int ds[] = {1, 2, 4, 8};

/* One placement: every plan against the references. */
static void run_case(struct dist *d, struct backend *be, struct backend *rb, int E, int k,
		     enum moe_act act, int64_t T, int64_t M, int64_t H)
{
	const int W = dist_size(d), q = dist_rank(d);
	struct moe_config cfg;
	moe_config_default(&cfg, T, M, H, E);
	cfg.k = k;
	cfg.act = act;
	cfg.gate_noise = 0.5f;
	cfg.seed = 7;
	struct moe_dist_place pl;
	OK(moe_dist_place(&pl, &cfg, W, q));
	char name[96];
	snprintf(name, sizeof name, "W=%d E=%d k=%d %s", W, E, k, moe_act_name(act));

	struct moe_config fcfg = cfg;
	fcfg.T = W * T;
	struct moe_params full;
	OK(moe_params_alloc(&full, &fcfg, rb));
	OK(moe_params_init(&full, &fcfg, 3));
	/* The whole batch, the same on every rank. ReLU's derivative jumps at 0, so a
	 * pre-activation within rounding of it (float in the layer, double in the reference:
	 * about 1e-7 here) flips one unit's gradient, and whether it flips depends on the
	 * machine's summation order (seen: 6e-8 on an AVX2-only EPYC). A ReLU batch is drawn
	 * again until every pre-activation is 1e-5 clear of 0. */
	const size_t nx = (size_t)(W * T * M);
	float *x = malloc(nx * sizeof(float)), *dy = malloc(nx * sizeof(float));
	for (uint64_t seed = 11;; seed++) {
		for (size_t i = 0; i < nx; i++) {
			x[i] = (float)rng_normal(seed, 1, i);
			dy[i] = (float)rng_normal(seed, 2, i);
		}
		if (act != MOE_ACT_RELU || kink_margin(rb, &fcfg, &full, x, W * T) >= 1e-5)
			break;
		if (seed == 11 + 64)
			die_rc(err_set(CORE_EUSAGE, NULL, "no batch of 64 clears ReLU's kink"),
			       name);
	}

	struct moe_params p, g;
	OK(moe_dist_params_alloc(&p, &cfg, &pl, be));
	OK(moe_dist_params_alloc(&g, &cfg, &pl, be));
	OK(moe_dist_params_from_full(&p, &cfg, &pl, &full));
	/* 0. The shards put back together are the full parameters, bit for bit, on every rank. */
	{
		struct moe_params back;
		OK(moe_params_alloc(&back, &fcfg, rb));
		OK(moe_dist_params_to_full(&back, &cfg, &pl, &p, d));
		const size_t n[5] = {(size_t)(M * E), (size_t)(E * M * H), (size_t)(E * H),
				     (size_t)(E * H * M), (size_t)(E * M)};
		const float *a[5] = {back.wg, back.w1, back.b1, back.w2, back.b2};
		const float *b[5] = {full.wg, full.w1, full.b1, full.w2, full.b2};
		for (int i = 0; i < 5; i++) {
			float *ha = host(rb, a[i], n[i]), *hb = host(rb, b[i], n[i]);
			CHECK(memcmp(ha, hb, n[i] * sizeof(float)) == 0,
			      "%s: tensor %d of the shards put together differs from the full one",
			      name, i);
			free(ha);
			free(hb);
		}
		moe_params_free(&back);
	}
	struct moe_dist_layer *l;
	OK(moe_dist_layer_init(&l, &cfg, be, d));
	float *xd = dev(be, x + q * T * M, (size_t)(T * M)), *dyd = dev(be, dy + q * T * M,
									(size_t)(T * M));
	float *yd = dev(be, NULL, (size_t)(T * M)), *dxd = dev(be, NULL, (size_t)(T * M));

	int rs[16], nr = moe_plan_rs(&pl, rs, 16);
	/* 1: the concatenated batch (setting 0: no drop), no auxiliary loss; 2: per-rank
	 * references with drops (setting 0.5 where it drops) and the auxiliary loss. */
	for (int mode = 0; mode < 2; mode++) {
		const double setting = mode == 0 ? 0.0 : 0.5;
		const float aux_w = mode == 0 ? 0.0f : 0.3f;
		const uint64_t step = 5;
		struct ref R;
		reference(rb, &cfg, x, dy, W, T, pl.s, setting, step, aux_w, mode == 0, &full, &R);
		for (int ir = 0; ir < nr; ir++)
			for (int id = 0; id < (on_device ? 2 : 4); id++)
				for (int a = 0; a < (on_device ? 2 : 3); a++) {
					const int r = rs[ir];
					if (r == 0 && (id > 0 || a > 0))
						continue;
					struct moe_plan plan = {.r = r, .d = ds[id], .a = a};
					char what[192];
					snprintf(what, sizeof what, "%s %s r=%d d=%d a=%s", name,
						 mode ? "per-rank, drops, aux" : "concatenated", r,
						 ds[id], dist_a2a_name(a));
					OK(moe_dist_forward(l, &p, xd, yd, T, 0, setting, step, &plan));
					OK(moe_dist_backward(l, &p, xd, dyd, dxd, &g, aux_w));
					float *hy = host(be, yd, (size_t)(T * M));
					float *hdx = host(be, dxd, (size_t)(T * M));
					double dyv = rel_diff(hy, R.y + q * T * M, (size_t)(T * M));
					double ddx = rel_diff(hdx, R.dx + q * T * M, (size_t)(T * M));
					CHECK(dyv <= 1e-5, "%s: y differs by %.3g", what, dyv);
					CHECK(ddx <= 1e-5, "%s: dx differs by %.3g", what, ddx);
					const struct moe_dist_step *st = moe_dist_layer_last(l);
					/* The layer's aux is the mean of the ranks' own. */
					if (mode == 1) {
						CHECK(fabs(st->aux_loss - R.aux) <=
							      1e-5 * (1 + fabs(R.aux)),
						      "%s: aux %.7g, reference %.7g", what,
						      st->aux_loss, R.aux);
						CHECK(st->dropped > 0, "%s: the case drops nothing",
						      what);
					}
					compare_shard(be, &cfg, &pl, &g, &R.g, what, 1e-5);
					if (ir == 0 && id == 0 && a == 0)
						compare_gathered(d, rb, &cfg, &fcfg, &pl, &g, &R.g,
								 what);
					if (on_device)
						same_on_all_ranks(d, be, g.wg, (size_t)(M * E),
								  what);
					free(hy);
					free(hdx);
				}
		free(R.y);
		free(R.dx);
		moe_params_free(&R.g);
	}

	/* On device the MPI All-to-All (host memory) is a usage error, on every rank alike. */
	if (on_device && rs[nr - 1] > 0) {
		struct moe_plan plan = {.r = rs[nr - 1], .d = 1, .a = DIST_A2A_MPI};
		int rc = moe_dist_forward(l, &p, xd, yd, T, 0, 0.0, 5, &plan);
		CHECK(rc == CORE_EUSAGE, "%s: a=mpi on device returned %d, not CORE_EUSAGE", name,
		      rc);
	}

	/* 3. Zero-cost switching: after the cycle above every plan has run at this size;
	 * another cycle allocates nothing and the shard stays put, bit for bit. */
	struct moe_dist_stats s0, s1;
	const float *where[5] = {p.wg, p.w1, p.b1, p.w2, p.b2};
	const size_t nw1 = (size_t)(pl.El * pl.Hs * M);
	float *before = NULL;
	/* The first pass runs every plan at this step's capacity; the second must allocate
	 * nothing. Plans change every step, in another order each time. */
	for (int rep = 0; rep < 3; rep++) {
		if (rep == 1) {
			moe_dist_layer_stats(l, &s0);
			before = host(be, p.w1, nw1);
		}
		const int nd = on_device ? 2 : 4;
		for (int ir = 0; ir < nr; ir++)
			for (int id = 0; id < nd; id++) {
				struct moe_plan plan = {.r = rs[(ir + rep) % nr], .d = ds[(id + rep) % nd],
							.a = (enum dist_a2a)((id + rep) % 2)};
				OK(moe_dist_forward(l, &p, xd, yd, T, 0, 0.0, 9, &plan));
				OK(moe_dist_backward(l, &p, xd, dyd, dxd, &g, 0.0f));
			}
	}
	moe_dist_layer_stats(l, &s1);
	float *after = host(be, p.w1, nw1);
	CHECK(s1.allocs == s0.allocs, "%s: switching plans allocated %lld times", name,
	      (long long)(s1.allocs - s0.allocs));
	CHECK(s1.bytes == s0.bytes, "%s: workspace changed from %zu to %zu bytes", name,
	      s0.bytes, s1.bytes);
	const float *where2[5] = {p.wg, p.w1, p.b1, p.w2, p.b2};
	CHECK(memcmp(where, where2, sizeof where) == 0, "%s: the shard moved", name);
	CHECK(memcmp(before, after, nw1 * sizeof(float)) == 0, "%s: the shard changed", name);
	free(before);
	free(after);

	be->op->free(be, xd);
	be->op->free(be, dyd);
	be->op->free(be, yd);
	be->op->free(be, dxd);
	moe_dist_layer_free(l);
	moe_params_free(&p);
	moe_params_free(&g);
	moe_params_free(&full);
	free(x);
	free(dy);
}

int main(int argc, char **argv)
{
	int local = 0, disagree = 0;
	const char *device = "cpu";
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--local-size") == 0 && i + 1 < argc)
			local = atoi(argv[++i]);
		else if (strcmp(argv[i], "--device") == 0 && i + 1 < argc)
			device = argv[++i];
		else if (strcmp(argv[i], "--disagree") == 0)
			disagree = 1;
	}
	struct dist *d;
	int rc = dist_open(&d, local);
	if (rc < 0)
		die_rc(rc, "dist_open");
	rank = dist_rank(d);
	const int W = dist_size(d);
	struct backend *be, *rb;
	OK(backend_open(&be, device, &(struct backend_params){.threads = 1,
							     .device = rank % dist_local_size(d)}));
	on_device = !be->host_visible;
	OK(backend_open(&rb, "ref", &(struct backend_params){.threads = 1}));

	if (disagree) {
		/* Rank 1 builds a layer with other sizes: every rank must say so and stop. */
		struct moe_config cfg;
		moe_config_default(&cfg, 16, 8, 8, rank == 1 ? 2 * W : W);
		struct moe_dist_layer *l;
		rc = moe_dist_layer_init(&l, &cfg, be, d);
		char buf[512];
		err_format(buf, sizeof buf, rc);
		fprintf(stderr, "test_moe_dist: rank %d: %s\n", rank, buf);
		/* every rank's line before any rank exits: mpirun kills the rest then */
		dist_barrier_timeout(d, 10.0);
		dist_close(d);
		return rc < 0 ? err_exit_status(rc) : 0;
	}

	/* E a multiple of W (whole experts per rank) and E dividing W (experts split). */
	run_case(d, be, rb, 2 * W, 2, MOE_ACT_RELU, 24, 16, 32);
	run_case(d, be, rb, W, 2, MOE_ACT_GELU, 20, 16, 32);
	if (W >= 2)
		run_case(d, be, rb, W / 2, W / 2 >= 2 ? 2 : 1, MOE_ACT_RELU, 24, 16, 32);
	if (W >= 4)
		run_case(d, be, rb, 1, 1, MOE_ACT_GELU, 16, 16, 32);

	if (on_device)
		printf("rank %d: the layer on %s (device memory)\n", rank, be->name);
	backend_close(be);
	backend_close(rb);
	printf("rank %d: %d checks, %d failed\n", rank, checks, failures);
	dist_close(d);
	return failures ? 1 : 0;
}
