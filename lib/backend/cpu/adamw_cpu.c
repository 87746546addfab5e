/* adamw_cpu.c - the cpu backend's AdamW update (backend.h adamw_update). Its own file because
 * it is built with -ffp-contract=off (Makefile): it must round as torch does, each multiply
 * and add alone except where torch fuses them, and those fmas are written out; the rest of
 * the backend lets the compiler fuse a*b+c.
 */
#include "backend/cpu/cpu_impl.h"

#include <math.h>

#include "common/banned.h"

/* ---- optimizer ------------------------------------------------------------------------- */

/* Bit for bit the arithmetic of torch 1.13 _single_tensor_adamw (torch/optim/adamw.py) on
 * the CPU, checked against it element by element:
 *   param.mul_(1 - lr * wd)
 *   exp_avg.mul_(b1).add_(grad, alpha=1 - b1)          add with alpha is a fused multiply-add
 *   exp_avg_sq.mul_(b2).addcmul_(grad, grad, value=1 - b2)   fma((1 - b2) g, g, v b2)
 *   denom = (exp_avg_sq.sqrt() / sqrt(1 - b2^t)).add_(eps)
 *   param.addcdiv_(exp_avg, denom, value=-lr / (1 - b1^t))   p + (value m) / denom
 * with the Python-double scalars rounded to float as ATen does for float tensors. */
struct adamw_consts {
	float decay, b1, c1, b2, c2, bc2s, eps, step, scale;
};

/* One thread's share of the update. The Makefile builds with -fno-math-errno, so GCC
 * vectorises sqrtf here (vsqrtps); vector sqrt, division and FMA round exactly as the scalar
 * ones, so every width gives the same bits. */
static void adamw_range(float *restrict p, const float *restrict g, float *restrict m,
			float *restrict v, size_t i0, size_t i1, const struct adamw_consts *k)
{
	const float decay = k->decay, b1 = k->b1, c1 = k->c1, b2 = k->b2, c2 = k->c2;
	const float bc2s = k->bc2s, eps = k->eps, step = k->step, scale = k->scale;
#pragma omp simd
	for (size_t i = i0; i < i1; i++) {
		float gi = g[i] * scale;
		float pi = p[i] * decay;
		float mi = fmaf(c1, gi, m[i] * b1);
		float vi = fmaf(c2 * gi, gi, v[i] * b2);
		float den = sqrtf(vi) / bc2s + eps;
		p[i] = pi + (step * mi) / den;
		m[i] = mi;
		v[i] = vi;
	}
}

/* One parallel region for all segments (a model has dozens; a region each would put a
 * fork and a barrier per segment on the step): every thread takes its share of each
 * segment in turn, no barrier in between. */
int cpu_adamw_update(struct backend *be, float *p, const float *g, float *m, float *v,
			    const struct backend_segment *seg, int nseg, double lr, double beta1,
			    double beta2, double eps, long t, float grad_scale)
{
	const double bc1 = 1.0 - pow(beta1, (double)t), bc2 = 1.0 - pow(beta2, (double)t);
	struct adamw_consts k = {
		.b1 = (float)beta1,
		.c1 = (float)(1.0 - beta1),
		.b2 = (float)beta2,
		.c2 = (float)(1.0 - beta2),
		.bc2s = (float)sqrt(bc2),
		.eps = (float)eps,
		.step = (float)(-lr / bc1),
		.scale = grad_scale,
	};
	cpu_enter(be);
#pragma omp parallel firstprivate(k)
	{
		size_t nth = (size_t)omp_get_num_threads(), tid = (size_t)omp_get_thread_num();
		for (int s = 0; s < nseg; s++) {
			size_t o = seg[s].offset, n = seg[s].n;
			k.decay = (float)(1.0 - lr * seg[s].weight_decay);
			adamw_range(p + o, g + o, m + o, v + o, n * tid / nth, n * (tid + 1) / nth,
				    &k);
		}
	}
	return 0;
}
