/* moe_bench_dist.c - timing the distributed MoE layer (moe_bench_dist.h). */
#include "moe/moe_bench_dist.h"

#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/progress.h"
#include "moe/moe_bench.h"
#include "common/banned.h"

int moe_bench_dist_data_init(struct moe_bench_dist_data *dd, const struct moe_bench_dist_opts *o)
{
	const struct moe_config *cfg = &o->cfg;
	struct backend *be = o->be;

	memset(dd, 0, sizeof *dd);
	ERR_FORWARD(moe_dist_layer_init(&dd->l, cfg, be, o->d));
	moe_dist_layer_set_timing(dd->l, o->stage_times);
	moe_dist_layer_set_overlap(dd->l, !o->no_overlap);
	const struct moe_dist_place *pl = moe_dist_layer_place(dd->l);
	ERR_FORWARD(moe_dist_params_alloc(&dd->p, cfg, pl, be));
	ERR_FORWARD(moe_dist_params_alloc(&dd->g, cfg, pl, be));
	ERR_FORWARD(moe_dist_params_init(&dd->p, cfg, pl, cfg->seed));
	return moe_bench_inputs(be, cfg, (uint64_t)dist_rank(o->d) * (uint64_t)cfg->T, &dd->x,
				&dd->y, &dd->dy, &dd->dx);
}

void moe_bench_dist_data_free(struct moe_bench_dist_data *dd)
{
	struct backend *be = dd->p.be;
	if (be) {
		be->op->free(be, dd->x);
		be->op->free(be, dd->y);
		be->op->free(be, dd->dy);
		be->op->free(be, dd->dx);
	}
	moe_params_free(&dd->p);
	moe_params_free(&dd->g);
	moe_dist_layer_free(dd->l);
	memset(dd, 0, sizeof *dd);
}

void moe_bench_dist_result_free(struct moe_bench_dist_result *r)
{
	free(r->step);
	free(r->comm);
	free(r->gemm);
	free(r->exposed);
	free(r->C);
	free(r->dropped);
	free(r->plan);
	free(r->exact);
	memset(r, 0, sizeof *r);
}

/* One step: route, the plan, forward, backward. */
static int step(const struct moe_bench_dist_opts *o, struct moe_bench_dist_data *dd, long i,
		struct moe_plan *plan, int *exact)
{
	struct moe_dist_layer *l = dd->l;
	const struct moe_config *c = &o->cfg;
	const double setting = o->trace ? o->trace[(size_t)i % o->trace_n] : c->capacity_setting;

	if (o->capacity > 0)
		ERR_FORWARD(moe_dist_route_capacity(l, &dd->p, dd->x, c->T, c->k, o->capacity,
						    (uint64_t)i));
	else
		ERR_FORWARD(moe_dist_route(l, &dd->p, dd->x, c->T, c->k, setting, (uint64_t)i));
	*plan = o->plan;
	*exact = 1;
	if (o->dict)
		*plan = moe_dict_lookup(o->dict, moe_dist_layer_last(l)->C, exact)->plan;
	ERR_FORWARD(moe_dist_forward_routed(l, &dd->p, dd->x, dd->y, plan));
	if (!o->forward_only)
		ERR_FORWARD(moe_dist_backward(l, &dd->p, dd->x, dd->dy, o->input_grad ? dd->dx : NULL,
					      &dd->g, o->aux_weight));
	return o->be->op->sync(o->be);
}

int moe_bench_dist_run(const struct moe_bench_dist_opts *o, struct moe_bench_dist_data *dd,
		       struct moe_bench_dist_result *r)
{
	const long n = o->iters;

	memset(r, 0, sizeof *r);
	r->n = n;
	r->step = calloc((size_t)n, sizeof(double));
	r->comm = calloc((size_t)n, sizeof(double));
	r->gemm = calloc((size_t)n, sizeof(double));
	r->exposed = calloc((size_t)n, sizeof(double));
	r->C = calloc((size_t)n, sizeof(int64_t));
	r->dropped = calloc((size_t)n, sizeof(int64_t));
	r->plan = calloc((size_t)n, sizeof(struct moe_plan));
	r->exact = calloc((size_t)n, sizeof(int));
	if (!r->step || !r->comm || !r->gemm || !r->exposed || !r->C || !r->dropped || !r->plan || !r->exact) {
		moe_bench_dist_result_free(r);
		return err_set(CORE_ENOMEM, NULL, "cannot allocate the samples");
	}
	struct moe_dist_stats s0;
	moe_dist_layer_stats(dd->l, &s0);
	for (long i = 0; i < o->warmup + n; i++) {
		struct moe_plan plan;
		int exact;
		ERR_FORWARD(dist_barrier(o->d));
		const double t0 = now_seconds();
		int rc = step(o, dd, i, &plan, &exact);
		double t = now_seconds() - t0;
		/* A rank that failed must not leave the others waiting in the next barrier. */
		ERR_FORWARD(dist_agree_rc(o->d, rc));
		ERR_FORWARD(dist_allreduce_f64(o->d, &t, 1, DIST_MAX));
		if (i < o->warmup)
			continue;
		const long j = i - o->warmup;
		const struct moe_dist_step *st = moe_dist_layer_last(dd->l);
		r->step[j] = t;
		r->total += t;
		r->comm[j] = st->comm;
		r->gemm[j] = st->gemm;
		r->exposed[j] = st->comm_exposed;
		r->nearest += !exact;
		r->C[j] = st->C;
		r->dropped[j] = st->dropped;
		r->plan[j] = st->plan;
		r->exact[j] = exact;
		r->last = *st;
		if (o->hook.fn)
			ERR_FORWARD(dist_agree_rc(o->d, o->hook.fn(o->hook.arg, j, t, st->aux_loss,
								   dd->y)));
	}
	/* The counters of this run alone: a layer may have run others before. */
	moe_dist_layer_stats(dd->l, &r->stats);
	r->stats.steps -= s0.steps;
	r->stats.param_bytes_moved -= s0.param_bytes_moved;
	r->stats.token_bytes_moved -= s0.token_bytes_moved;
	r->stats.allocs -= s0.allocs;
	return 0;
}
