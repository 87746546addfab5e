/* moe_bench.c - the timing loops of moe-bench; see moe_bench.h. */
#include "moe/moe_bench.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/probe.h"
#include "common/err.h"
#include "common/progress.h"
#include "common/rng.h"
#include "common/stats.h"
#include "common/banned.h"

double moe_bench_setting(const struct moe_bench_opts *o, long i)
{
	return o->trace ? o->trace[(size_t)i % o->trace_n] : o->cfg.capacity_setting;
}

int moe_bench_inputs(struct backend *be, const struct moe_config *cfg, uint64_t row0,
		     float **x, float **y, float **dy, float **dx)
{
	const size_t n = (size_t)(cfg->T * cfg->M), base = (size_t)row0 * (size_t)cfg->M;
	float **io[] = {x, y, dy, dx};

	for (size_t i = 0; i < sizeof io / sizeof io[0]; i++)
		if (backend_alloc_zero(be, (void **)io[i], n * sizeof(float)) < 0)
			return err_set(CORE_ENOMEM, NULL, "cannot allocate the inputs");
	ERR_FORWARD(be->op->fill_normal(be, *x, n, 0.0f, 1.0f, cfg->seed, RNG_STREAM_TEST, base));
	return be->op->fill_normal(be, *dy, n, 0.0f, 1.0f, cfg->seed, RNG_STREAM_TEST,
				   (1ull << 40) + base);
}

int moe_bench_data_alloc(struct moe_bench_data *d, const struct moe_bench_opts *o)
{
	const struct moe_config *cfg = &o->cfg;

	memset(d, 0, sizeof *d);
	ERR_FORWARD(moe_params_alloc(&d->p, cfg, o->be));
	ERR_FORWARD(moe_params_alloc(&d->g, cfg, o->be));
	ERR_FORWARD(moe_params_init(&d->p, cfg, cfg->seed));
	return moe_bench_inputs(o->be, cfg, 0, &d->x, &d->y, &d->dy, &d->dx);
}

void moe_bench_data_free(struct moe_bench_data *d)
{
	struct backend *be = d->p.be;
	if (be) {
		be->op->free(be, d->x);
		be->op->free(be, d->y);
		be->op->free(be, d->dy);
		be->op->free(be, d->dx);
	}
	moe_params_free(&d->p);
	moe_params_free(&d->g);
	memset(d, 0, sizeof *d);
}

static void samples_free(struct moe_bench_samples *s)
{
	free(s->step);
	free(s->fwd);
	free(s->bwd);
	free(s->st);
	free(s->dropped);
	free(s->C);
	free(s->rows);
	free(s->aux);
	free(s->load);
	memset(s, 0, sizeof *s);
}

/* On failure nothing stays allocated. */
static int samples_alloc(struct moe_bench_samples *s, long n, int E)
{
	memset(s, 0, sizeof *s);
	s->n = n;
	s->E = E;
	s->aux = malloc((size_t)n * sizeof(double));
	s->load = calloc((size_t)E, sizeof(int64_t));
	for (long i = 0; s->aux && i < n; i++)
		s->aux[i] = NAN;
	s->step = calloc((size_t)n, sizeof(double));
	s->fwd = calloc((size_t)n, sizeof(double));
	s->bwd = calloc((size_t)n, sizeof(double));
	s->st = calloc((size_t)n, sizeof(struct moe_times));
	s->dropped = calloc((size_t)n, sizeof(int64_t));
	s->C = calloc((size_t)n, sizeof(int64_t));
	s->rows = calloc((size_t)n, sizeof(int64_t));
	if (!s->step || !s->fwd || !s->bwd || !s->st || !s->dropped || !s->C || !s->rows ||
	    !s->aux || !s->load) {
		samples_free(s);
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the timing samples");
	}
	return 0;
}

void moe_bench_result_free(struct moe_bench_result *r)
{
	samples_free(&r->s);
}

double moe_bench_stage_median(const struct moe_bench_samples *s, size_t off)
{
	double *v = malloc(sizeof(double) * (size_t)s->n), m;
	if (!v)
		return NAN;
	for (long i = 0; i < s->n; i++)
		v[i] = *(const double *)((const char *)&s->st[i] + off);
	m = stats_median(v, s->n, NULL, NULL);
	free(v);
	return m;
}

static int64_t kept_rows(const struct moe_routing *r)
{
	int64_t R = 0;
	for (int e = 0; e < r->E; e++)
		R += r->used[e];
	return R;
}

static double mean_rows(const struct moe_bench_samples *s)
{
	double R = 0.0;
	for (long i = 0; i < s->n; i++)
		R += (double)s->rows[i] / (double)s->n;
	return R;
}

static double clock_after(struct backend *be)
{
	be->op->sync(be);
	return now_seconds();
}

int moe_bench_layer(const struct moe_bench_opts *o, struct moe_bench_data *d,
		    struct moe_bench_result *r)
{
	const struct moe_config *c = &o->cfg;
	struct backend *be = o->be;
	struct moe_layer *l = NULL;
	struct probe_gemm ref = {0};
	double *ref_t = NULL;
	int rc;

	memset(r, 0, sizeof *r);
	r->T = c->T;
	ERR_FORWARD(samples_alloc(&r->s, o->iters, o->cfg.E));
	struct moe_bench_samples *s = &r->s;
	ref_t = calloc((size_t)o->iters, sizeof(double));
	rc = ref_t ? moe_layer_init(&l, c, be)
		   : err_set(CORE_ENOMEM, NULL, "cannot allocate the timing samples");
	if (rc == 0)
		moe_layer_set_timing(l, o->stage_times);
	for (long i = 0; rc == 0 && i < o->warmup + o->iters; i++) {
		double t0 = clock_after(be), t1, t2;
		rc = moe_forward(l, &d->p, d->x, d->y, c->T, c->k, moe_bench_setting(o, i),
				 (uint64_t)i);
		t1 = clock_after(be);
		if (rc == 0 && !o->forward_only)
			rc = moe_backward(l, &d->p, d->x, d->dy, o->input_grad ? d->dx : NULL, &d->g,
					  o->aux_weight);
		t2 = clock_after(be);
		if (rc < 0)
			break;
		const struct moe_routing *rt = moe_layer_routing(l);
		if (!ref.be) /* the reference shape: the mean kept rows per expert */
			rc = probe_gemm_init(&ref, be, (int)((kept_rows(rt) + c->E / 2) / c->E),
					     (int)c->H, (int)c->M);
		if (rc < 0 || i < o->warmup)
			continue;
		long j = i - o->warmup;
		s->step[j] = t2 - t0;
		s->fwd[j] = t1 - t0;
		s->bwd[j] = t2 - t1;
		s->st[j] = *moe_layer_times(l);
		s->dropped[j] = rt->dropped;
		s->C[j] = rt->C;
		s->rows[j] = kept_rows(rt);
		s->aux[j] = rt->aux_loss;
		memcpy(s->load, rt->count, sizeof(int64_t) * (size_t)c->E);
		ref_t[j] = probe_gemm_seconds(&ref);
		if (o->hook.fn)
			rc = o->hook.fn(o->hook.arg, j, s->step[j], rt->aux_loss, d->y);
	}
	if (rc == 0) {
		r->layer_bytes_peak = moe_layer_peak_bytes(l);
		r->kept_rows_mean = mean_rows(s);
		r->flops = moe_step_flops(c, c->T, r->kept_rows_mean, !o->forward_only,
					  o->input_grad);
		r->ref_rows = ref.M;
		r->ref_gflops = 2.0 * ref.M * c->M * c->H / stats_median(ref_t, s->n, NULL, NULL) /
				1e9;
		for (long i = 0; i < s->n; i++)
			ref_t[i] = s->step[i] - s->st[i].gemm_fwd - s->st[i].gemm_bwd;
		r->nongemm_s = stats_median(ref_t, s->n, NULL, NULL);
	}
	moe_layer_free(l);
	probe_gemm_free(&ref);
	free(ref_t);
	return rc;
}

/* Bytes a step of the kernels reads and writes, in rows of M elements of es bytes: encode
 * T + E*C, decode R + T, decode backward T + R + E*C, encode backward R + T (R = kept
 * choices). Scores and metadata are not counted. */
static double encdec_bytes(const struct moe_config *c, const struct moe_routing *r,
			   int backward, size_t es)
{
	double R = (double)kept_rows(r), EC = (double)c->E * (double)r->C, T = (double)r->T;
	double rows = (T + EC) + (R + T);
	if (backward)
		rows += (T + R + EC) + (R + T);
	return rows * (double)c->M * (double)es;
}

/* bf16 rows x, y, dy, dx [T, M] for moe_bench_encdec: x and dy d's float inputs rounded, y
 * and dx zeroed (through the host: once, before the steps). */
static int bf16_rows(struct backend *be, const struct moe_bench_data *d, int64_t n,
		     uint16_t *io[4])
{
	float *h = malloc(sizeof *h * (size_t)n);
	uint16_t *b = malloc(sizeof *b * (size_t)n);
	int rc = h && b ? 0 : err_set(CORE_ENOMEM, NULL, "cannot allocate the bfloat16 inputs");
	for (int i = 0; rc == 0 && i < 4; i++)
		rc = backend_alloc_zero(be, (void **)&io[i], sizeof *b * (size_t)n);
	const float *src[2] = {d->x, d->dy};
	uint16_t *dst[2] = {io[0], io[2]};
	for (int i = 0; rc == 0 && i < 2; i++) {
		rc = be->op->download(be, h, src[i], sizeof *h * (size_t)n);
		for (int64_t j = 0; rc == 0 && j < n; j++)
			b[j] = backend_bf16_from_float(h[j]);
		if (rc == 0)
			rc = be->op->upload(be, dst[i], b, sizeof *b * (size_t)n);
	}
	free(h);
	free(b);
	return rc;
}

int moe_bench_encdec(const struct moe_bench_opts *o, struct moe_bench_data *d,
		     struct moe_bench_result *r)
{
	const struct moe_config *c = &o->cfg;
	struct backend *be = o->be;
	struct moe_layer *l = NULL;
	void *disp = NULL;
	float *dscore = NULL;
	uint16_t *b[4] = {NULL, NULL, NULL, NULL}; /* bf16: x, y, dy, dx */
	const size_t es = o->bf16 ? sizeof(uint16_t) : sizeof(float);
	size_t disp_bytes = 0;
	double bytes_sum = 0.0;
	int rc;

	memset(r, 0, sizeof *r);
	r->T = c->T;
	ERR_FORWARD(samples_alloc(&r->s, o->iters, o->cfg.E));
	struct moe_bench_samples *s = &r->s;
	rc = moe_layer_init(&l, c, be);
	if (rc == 0)
		rc = be->op->alloc(be, (void **)&dscore, sizeof(float) * (size_t)(c->k * c->T));
	if (rc == 0 && o->bf16)
		rc = bf16_rows(be, d, c->T * c->M, b);
	for (long i = 0; rc == 0 && i < o->warmup + o->iters; i++) {
		rc = moe_route(l, d->p.wg, d->x, c->T, c->k, moe_bench_setting(o, i), (uint64_t)i);
		if (rc < 0)
			break;
		const struct moe_routing *rt = moe_layer_routing(l);
		size_t need = es * (size_t)(c->E * rt->C * c->M);
		if (need > disp_bytes) {
			be->op->free(be, disp);
			disp_bytes = 0;
			rc = backend_alloc_zero(be, (void **)&disp, need);
			if (rc < 0)
				break;
			disp_bytes = need;
		}
		struct moe_times tm = {0};
		if (o->bf16)
			rc = moe_encode_decode_bf16(l, b[0], disp, b[1], b[2], dscore, b[3],
						    !o->forward_only, &tm);
		else
			rc = moe_encode_decode(l, d->x, disp, d->y, d->dy, dscore, d->dx,
					       !o->forward_only, &tm);
		if (rc < 0 || i < o->warmup)
			continue;
		long j = i - o->warmup;
		s->st[j] = tm;
		s->fwd[j] = tm.encode + tm.decode;
		s->bwd[j] = tm.bwd_decode + tm.bwd_encode;
		s->step[j] = s->fwd[j] + s->bwd[j];
		s->dropped[j] = rt->dropped;
		s->C[j] = rt->C;
		s->rows[j] = kept_rows(rt);
		s->aux[j] = rt->aux_loss;
		memcpy(s->load, rt->count, sizeof(int64_t) * (size_t)c->E);
		bytes_sum += encdec_bytes(c, rt, !o->forward_only, es);
	}
	if (rc == 0) {
		r->bytes_moved = bytes_sum / (double)o->iters;
		r->copy_gbps = probe_copy_gbps(be, (size_t)r->bytes_moved,
					       o->iters > 3 ? o->iters : 3);
		r->kept_rows_mean = mean_rows(s);
		r->layer_bytes_peak = moe_layer_peak_bytes(l) + disp_bytes +
				      sizeof(float) * (size_t)(c->k * c->T) +
				      (o->bf16 ? 4 * es * (size_t)(c->T * c->M) : 0);
	}
	for (int i = 0; i < 4; i++)
		be->op->free(be, b[i]);
	be->op->free(be, disp);
	be->op->free(be, dscore);
	moe_layer_free(l);
	return rc;
}

/* The dense formulation's buffers at its largest plausible capacity for this run: the
 * fixed capacity of a fixed setting, else every choice in one expert (k * T). */
static int dense_fits(const struct moe_bench_opts *o)
{
	const struct moe_config *c = &o->cfg;
	const int64_t T = o->dense_T;
	int64_t C = (int64_t)c->k * T;
	if (c->capacity_setting > 0.0 && !o->trace)
		C = moe_capacity_fixed(c->E, T, c->k, c->capacity_setting);
	double need = (double)moe_dense_bytes(c, T, c->k, C, !o->forward_only);
	/* Its largest buffers, [T,E,C], [E,C,M] and [E,C,H], in floating point: at the largest
	 * sizes moe_config_check lets through, their bytes overflow the size_t sum above. */
	int64_t widest = T > c->M ? T : c->M;
	widest = c->H > widest ? c->H : widest;
	const double big = sizeof(float) * (double)c->E * (double)C * (double)widest;
	if (big > need)
		need = big;
	double phys = (double)phys_memory_bytes();
	if (phys > 0 && need > MOE_BENCH_MEM_FRAC * phys)
		return err_set(CORE_ENOMEM, NULL, "the dense formulation needs %.1f GiB at T=%lld "
			       "(more than %.0f%% of memory); use --dense-tokens or --dry-run",
			       need / 1073741824.0, (long long)T, 100.0 * MOE_BENCH_MEM_FRAC);
	return 0;
}

int moe_bench_check(const struct moe_bench_opts *o, int dense)
{
	return dense ? dense_fits(o) : 0;
}

int moe_bench_dense(const struct moe_bench_opts *o, struct moe_bench_data *d,
		    struct moe_bench_result *r)
{
	const struct moe_config *c = &o->cfg;
	struct backend *be = o->be;
	const int64_t T = o->dense_T;
	int rc = 0;

	memset(r, 0, sizeof *r);
	r->T = T;
	ERR_FORWARD(dense_fits(o));
	ERR_FORWARD(samples_alloc(&r->s, o->iters, o->cfg.E));
	struct moe_bench_samples *s = &r->s;
	for (long i = 0; rc == 0 && i < o->warmup + o->iters; i++) {
		struct moe_dense_result dr;
		double t0 = clock_after(be);
		rc = moe_dense_step(c, &d->p, d->x, d->y, T, c->k, moe_bench_setting(o, i),
				    (uint64_t)i, d->dy, d->dx, o->forward_only ? NULL : &d->g,
				    o->aux_weight, &dr);
		double t1 = clock_after(be);
		if (rc < 0 || i < o->warmup)
			continue;
		const struct moe_times *tm = &dr.times;
		long j = i - o->warmup;
		s->step[j] = t1 - t0;
		s->fwd[j] = tm->gate + tm->scan + tm->encode + tm->experts + tm->decode;
		s->bwd[j] = s->step[j] - s->fwd[j];
		s->st[j] = *tm;
		s->dropped[j] = dr.dropped;
		s->C[j] = dr.C;
		s->aux[j] = dr.aux_loss;
		/* Same useful-flop count as the sparse layer: kept pairs, not E*C. */
		s->rows[j] = (int64_t)c->k * T - dr.dropped;
		r->layer_bytes_peak = dr.peak_bytes;
	}
	if (rc == 0) {
		r->kept_rows_mean = mean_rows(s);
		/* The dense formulation always computes the input gradient. */
		r->flops = moe_step_flops(c, T, r->kept_rows_mean, !o->forward_only, 1);
	}
	return rc;
}

int moe_bench_dry(const struct moe_bench_opts *o, struct moe_bench_result *r)
{
	const struct moe_config *c = &o->cfg;
	const double setting = moe_bench_setting(o, 0);
	const size_t M = (size_t)c->M, H = (size_t)c->H, E = (size_t)c->E;
	int64_t *count = calloc((size_t)c->E, sizeof *count);

	if (!count)
		return err_set(CORE_ENOMEM, NULL, "cannot allocate %d expert counts", c->E);
	memset(r, 0, sizeof *r);
	r->T = c->T;
	/* the worst routing for the capacity: every choice on one expert (k distinct experts
	 * per token, so at most T on any one) */
	count[0] = c->T;
	r->C = moe_capacity(count, c->E, c->T, c->k, setting, c->capacity_align);
	free(count);
	r->C_exact = setting > 0;
	if (r->C <= 0)
		return err_set(CORE_EUSAGE, NULL, "capacity setting %g leaves no slot for T=%lld "
			       "tokens over E=%d experts", setting, (long long)c->T, c->E);
	/* as moe_bench_data_alloc: parameters and gradients, x, y, dy, dx */
	r->data_bytes = 2 * sizeof(float) * (M * E + E * M * H + E * H + E * H * M + E * M) +
			4 * sizeof(float) * (size_t)c->T * M;
	r->sparse_bytes = moe_layer_bytes_for(c, c->T, c->k, r->C, !o->forward_only);
	r->dense_bytes = moe_dense_bytes(c, o->dense_T, c->k, r->C, !o->forward_only);
	return 0;
}
