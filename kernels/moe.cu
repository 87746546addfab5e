/* moe.cu - the CUDA backend's MoE ops: gating (noisy softmax, top-k, scores, the auxiliary
 * losses and their backward), expert counts, locations, and Tutel's encode/decode kernels
 * K0/K1/K2 (arXiv 2206.03382 sec. 3.4.7). Contracts and math in backend.h; the CPU versions
 * are lib/backend/cpu/moe_cpu.c.
 *
 * Gating runs L lanes per token (L the smallest power of two with E <= 8 L, so 4 tokens per
 * warp at E = 64), lane s of a group owning experts s, s + L, ... in registers; beyond 256
 * experts a whole warp takes a token and keeps its values in the output row itself (each
 * lane only rereads what it wrote). Group reductions are xor butterflies, which give every
 * lane the same bits. The auxiliary loss is a sum over T*E in double, reduced in three fixed
 * levels: token chunks (their size a function of T only) each summed by one block in a fixed
 * order, then per expert the chunk partials by a fixed tree, then one block for the loss.
 * Locations are two stable radix sorts (CUB): the tokens by their BPR key, then the visiting
 * sequence by expert, whose position within its expert is the slot.
 *
 * The row kernels (encode, decode and their backwards, on float32 or bfloat16 rows, one
 * template each) run one block per token over its row of M elements in groups of 16 bytes
 * (4 floats, 8 bfloat16): one uint4 load or store when every pointer and M allow it, else
 * guarded scalars. All k choices of a token are handled in the one pass (Tutel's K0, K1, K2).
 * A thread owns the same groups in both cases and
 * does the same operations in the same order, so the bits never depend on which path ran;
 * this matters for the one reduction across a row (dscore), which every thread accumulates
 * over its groups in order and the block sums with a fixed tree.
 *
 * Determinism: no float atomics anywhere; the only atomics are the integer counts. Every
 * reduction has a fixed split and order, independent of the device's size and of alignment.
 * All work is queued on ctx->stream; nothing is read back to the host.
 */
#include "cuda_common.cuh"

#include <cub/cub.cuh>
#include <cuda_bf16.h>
#include <float.h>
#include <math.h>

extern "C" {
#include "common/rng.h"
}

#define FULL_MASK 0xffffffffu

/* ---- Philox and the gate noise ------------------------------------------------------------
 * Bit for bit lib/common/rng.c: Philox4x32-10 and Box-Muller in double. */

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u
#define MOE_PI 3.14159265358979323846

__device__ __forceinline__ void philox(uint64_t seed, uint64_t stream, uint64_t index,
				       uint32_t out[4])
{
	uint32_t c0 = (uint32_t)index, c1 = (uint32_t)(index >> 32);
	uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
	uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);

#pragma unroll
	for (int r = 0; r < 10; r++) {
		const uint32_t hi0 = __umulhi(PHILOX_M0, c0), lo0 = PHILOX_M0 * c0;
		const uint32_t hi1 = __umulhi(PHILOX_M1, c2), lo1 = PHILOX_M1 * c2;
		c0 = hi1 ^ c1 ^ k0;
		c1 = lo1;
		c2 = hi0 ^ c3 ^ k1;
		c3 = lo0;
		k0 += PHILOX_W0;
		k1 += PHILOX_W1;
	}
	out[0] = c0;
	out[1] = c1;
	out[2] = c2;
	out[3] = c3;
}

/* rng_normal: only products (no sums), so no contraction can change it; CUDA's log and cos
 * may differ from glibc's by an ulp in double, which the rounding to float nearly always
 * hides. */
__device__ __forceinline__ float dev_rng_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
	uint32_t w[4];
	philox(seed, stream, index, w);
	const double u1 = ((double)w[0] + 1.0) / 4294967296.0;
	const double u2 = (double)w[1] / 4294967296.0;
	return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * MOE_PI * u2));
}

/* What the gate kernels need of backend_moe_gate, by value. */
struct gate_args {
	int64_t T;
	int E, k, li;
	float noise;
	uint64_t seed, step;
	double sigma; /* s / E, load-importance */
};

/* The routed logit of (t, e), in float as the contract writes it: the product and the sum
 * rounded separately (__fmul_rn / __fadd_rn are never contracted into an fma). */
__device__ __forceinline__ float routed_logit(const gate_args &a, const float *logits, int64_t t,
					      int e)
{
	const float v = logits[t * a.E + e];
	if (a.noise == 0.0f)
		return v;
	const uint64_t i = ((uint64_t)a.step * (uint64_t)a.T + (uint64_t)t) * (uint64_t)a.E +
			   (uint64_t)e;
	const float s = a.noise / (float)a.E;
	return __fadd_rn(v, __fmul_rn(s, dev_rng_normal(a.seed, RNG_STREAM_NOISE, i)));
}

__device__ __forceinline__ double phi_cdf(double z)
{
	return 0.5 * erfc(-z / 1.4142135623730951); /* sqrt(2) */
}

__device__ __forceinline__ double phi_pdf(double z)
{
	return exp(-0.5 * z * z) / 2.5066282746310002; /* sqrt(2 pi) */
}

/* ---- reductions ----------------------------------------------------------------------------
 * Over the L lanes of an aligned group (L a power of two, up to the warp): butterflies (xor),
 * in which lanes l and l^o combine the same two values in swapped order, which IEEE addition
 * makes the same bits, so every lane of the group ends with the same result and the tree is
 * fixed. fmaxf ignores NaN on both sides alike. Every lane of the warp must call them. */

template <int L, typename F>
__device__ __forceinline__ F group_sum(F v)
{
#pragma unroll
	for (int o = L / 2; o > 0; o >>= 1)
		v += __shfl_xor_sync(FULL_MASK, v, o);
	return v;
}

template <int L>
__device__ __forceinline__ float group_max(float v)
{
#pragma unroll
	for (int o = L / 2; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
	return v;
}

template <int L>
__device__ __forceinline__ unsigned long long group_max_u64(unsigned long long v)
{
#pragma unroll
	for (int o = L / 2; o > 0; o >>= 1) {
		const unsigned long long w = __shfl_xor_sync(FULL_MASK, v, o);
		v = w > v ? w : v;
	}
	return v;
}

/* Sum of v over the block (a fixed tree: warps, then warp 0 over the warp sums in order),
 * valid in thread 0; red holds 32 values of shared memory. Every thread must call it. */
template <typename F>
__device__ __forceinline__ F block_sum(F v, F *red)
{
	const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
	const int nw = (blockDim.x + 31) >> 5;
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_down_sync(FULL_MASK, v, o);
	if (lane == 0)
		red[warp] = v;
	__syncthreads();
	F r = 0;
	if (warp == 0) {
		r = lane < nw ? red[lane] : (F)0;
#pragma unroll
		for (int o = 16; o > 0; o >>= 1)
			r += __shfl_down_sync(FULL_MASK, r, o);
	}
	__syncthreads(); /* red may be reused */
	return r;
}

/* ---- gating ---------------------------------------------------------------------------- */

/* Gating runs L lanes per token (an aligned group; 32 / L tokens per warp), lane sub of a
 * group owning experts sub, sub + L, ..., held in NR registers each. L is the smallest power
 * of two with E <= GATE_NR L; beyond 256 experts a whole warp takes a token and keeps its
 * values in the output row itself (NR == 0, only with L == 32, so no group is ever idle). */
#define GATE_WARPS 8
#define GATE_THREADS (GATE_WARPS * 32)
#define GATE_NR 8
#define GATE_KEEP 8 /* chosen probabilities a lane keeps: rounds sub, sub + L, ... */

/* A lane's j-th value of a token row (expert e = sub + L j): register j when NR > 0, else
 * row[e] in memory. */
template <int NR>
__device__ __forceinline__ float lane_get(const float *reg, const float *row, int j, int e)
{
	return NR > 0 ? reg[j] : row[e];
}

template <int NR>
__device__ __forceinline__ void lane_put(float *reg, float *row, int j, int e, float x)
{
	if (NR > 0)
		reg[j] = x;
	else
		row[e] = x;
}

/* Top-k order as one integer: the probability's bits made monotonic (-0 as +0, NaN below
 * everything), then the complemented expert, so that the larger key is the larger
 * probability and, on a tie, the lower expert. Keys are distinct within a token. */
__device__ __forceinline__ unsigned long long topk_key(float p, int e)
{
	uint32_t u = __float_as_uint(p);
	if (p == 0.0f)
		u = 0u;
	else if (p != p)
		u = 0xffffffffu;
	const uint32_t ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
	return (unsigned long long)ord << 32 | (0xffffffffu - (uint32_t)e);
}

__device__ __forceinline__ float topk_value(unsigned long long key)
{
	const uint32_t ord = (uint32_t)(key >> 32);
	return __uint_as_float((ord & 0x80000000u) ? (ord & 0x7fffffffu) : ~ord);
}

/* Per token: routed logits, softmax, clean softmax (load-importance), top-k by k rounds of a
 * group arg-max below the previous pick, scores renormalised by the sum taken in rank order,
 * top, and thr (load-importance: the routed logit of the rank-(k-1) choice, for the loss).
 * A group past T (the last warp's) recomputes token t0 and stores nothing. */
template <int L, int NR>
__global__ void __launch_bounds__(GATE_THREADS)
gate_forward_kernel(const gate_args a, const float *__restrict__ logits, float *probs,
		    float *clean, float *top, int32_t *idx, float *score, float *thr)
{
	const int E = a.E, k = a.k, sub = threadIdx.x & (L - 1);
	const int64_t T = a.T, step = (int64_t)gridDim.x * GATE_WARPS * (32 / L);
	const int nj = NR > 0 ? NR : (E + L - 1) / L;
	float reg[NR > 0 ? NR : 1], keep[GATE_KEEP];

	for (int64_t t0 = ((int64_t)blockIdx.x * GATE_WARPS + (threadIdx.x >> 5)) * (32 / L);
	     t0 < T; t0 += step) {
		const int64_t tg = t0 + (threadIdx.x & 31) / L;
		const bool on = tg < T;
		const int64_t t = on ? tg : t0;
		float *prow = probs + t * E;
		float mx = -INFINITY;
#pragma unroll
		for (int j = 0; j < nj; j++) {
			const int e = sub + L * j;
			if (e < E) {
				const float z = routed_logit(a, logits, t, e);
				lane_put<NR>(reg, prow, j, e, z);
				mx = fmaxf(mx, z);
			}
		}
		mx = group_max<L>(mx);
		float sum = 0.0f;
#pragma unroll
		for (int j = 0; j < nj; j++) {
			const int e = sub + L * j;
			if (e < E) {
				const float x = expf(lane_get<NR>(reg, prow, j, e) - mx);
				lane_put<NR>(reg, prow, j, e, x);
				sum += x;
			}
		}
		sum = group_sum<L>(sum);
#pragma unroll
		for (int j = 0; j < nj; j++) {
			const int e = sub + L * j;
			if (e < E) {
				const float p = lane_get<NR>(reg, prow, j, e) / sum;
				lane_put<NR>(reg, prow, j, e, p);
				if (NR > 0 && on)
					prow[e] = p;
			}
		}
		if (a.li) {
			/* the clean softmax, recomputing each exp rather than keeping it */
			const float *lrow = logits + t * E;
			float cm = -INFINITY, cs = 0.0f;
			for (int e = sub; e < E; e += L)
				cm = fmaxf(cm, lrow[e]);
			cm = group_max<L>(cm);
			for (int e = sub; e < E; e += L)
				cs += expf(lrow[e] - cm);
			cs = group_sum<L>(cs);
			if (on)
				for (int e = sub; e < E; e += L)
					clean[t * E + e] = expf(lrow[e] - cm) / cs;
		}
		/* top-k: round r takes the largest key below round r-1's; every lane of the group
		 * sees every pick and sums them in rank order */
		unsigned long long prev = ~0ull;
		float ssum = 0.0f;
		for (int r = 0; r < k; r++) {
			unsigned long long best = 0ull;
#pragma unroll
			for (int j = 0; j < nj; j++) {
				const int e = sub + L * j;
				if (e < E) {
					const unsigned long long key =
						topk_key(lane_get<NR>(reg, prow, j, e), e);
					if (key < prev && key > best)
						best = key;
				}
			}
			best = group_max_u64<L>(best);
			prev = best;
			const int e = (int)(0xffffffffu - (uint32_t)best);
			const float p = topk_value(best);
			ssum += p;
#pragma unroll
			for (int i = 0; i < GATE_KEEP; i++)
				if (r == sub + L * i)
					keep[i] = p;
			if (on && sub == 0) {
				idx[(int64_t)r * T + t] = e;
				if (r == 0)
					top[t] = p;
				if (r == k - 1 && a.li)
					thr[t] = routed_logit(a, logits, t, e);
				if (r >= L * GATE_KEEP) /* not kept by the lanes: fixed below */
					score[(int64_t)r * T + t] = p;
			}
		}
		if (on) {
			/* renormalise (k > 1), in float */
			const float den = ssum > FLT_EPSILON ? ssum : FLT_EPSILON;
#pragma unroll
			for (int i = 0; i < GATE_KEEP; i++) {
				const int r = sub + L * i;
				if (r < k)
					score[(int64_t)r * T + t] = k > 1 ? keep[i] / den : keep[i];
			}
			if (sub == 0)
				for (int r = L * GATE_KEEP; r < k; r++)
					score[(int64_t)r * T + t] = score[(int64_t)r * T + t] / den;
		}
	}
}

/* thr[t] = the routed logit of token t's rank-(k-1) choice (load-importance backward). */
__global__ void gate_thr_kernel(const gate_args a, const float *__restrict__ logits,
				const int32_t *__restrict__ idx, float *thr)
{
	for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < a.T;
	     t += (int64_t)gridDim.x * blockDim.x)
		thr[t] = routed_logit(a, logits, t, idx[(int64_t)(a.k - 1) * a.T + t]);
}

/* The auxiliary loss's sums over tokens, in three fixed levels (no level depends on the
 * device's size):
 *  1. block b sums tokens [b ch, (b+1) ch) into part0[e nb + b], part1[e nb + b]:
 *     GShard: n1_e (rank-0 choices of e) and, when want_p, sum_t probs[t,e];
 *     load-importance: Imp_e = sum_t clean[t,e], Load_e = sum_t Phi((clean - thr_t) / sigma).
 *     The block's threads form nrg row groups of cw columns; group g takes the chunk's tokens
 *     g, g + nrg, ... in order, and the groups are added in group order;
 *  2. block e sums its nb partials: thread i those at i, i + blockDim, ... in order, then
 *     block_sum, into v0[e], v1[e];
 *  3. one block: the loss (forward) or the per-expert factors of its gradient (backward). */
#define AUX_THREADS 256
#define AUX_MIN_ROWS 64    /* tokens per chunk, at least */
#define AUX_MAX_CHUNKS 4096

__global__ void __launch_bounds__(AUX_THREADS)
aux_partial_kernel(const gate_args a, const float *__restrict__ probs,
		   const float *__restrict__ clean, const int32_t *__restrict__ idx,
		   const float *__restrict__ thr, int want_p, int64_t ch, int64_t nb,
		   double *part0, double *part1)
{
	__shared__ double s0[AUX_THREADS], s1[AUX_THREADS];
	const int E = a.E, tid = threadIdx.x;
	const int cw = E < AUX_THREADS ? E : AUX_THREADS, nrg = AUX_THREADS / cw;
	const int rg = tid / cw, col = tid % cw;
	const int64_t t0 = (int64_t)blockIdx.x * ch;
	const int64_t t1 = t0 + ch < a.T ? t0 + ch : a.T;

	for (int e0 = 0; e0 < E; e0 += cw) {
		const int e = e0 + col;
		double a0 = 0.0, a1 = 0.0;
		if (rg < nrg && e < E) {
			if (a.li) {
#pragma unroll 4
				for (int64_t t = t0 + rg; t < t1; t += nrg) {
					const double c = clean[t * E + e];
					a0 += c;
					a1 += phi_cdf((c - (double)thr[t]) / a.sigma);
				}
			} else {
#pragma unroll 4
				for (int64_t t = t0 + rg; t < t1; t += nrg) {
					a0 += idx[t] == e ? 1.0 : 0.0;
					if (want_p)
						a1 += probs[t * E + e];
				}
			}
		}
		s0[tid] = a0;
		s1[tid] = a1;
		__syncthreads();
		if (rg == 0 && e < E) {
			double b0 = 0.0, b1 = 0.0;
			for (int g = 0; g < nrg; g++) {
				b0 += s0[g * cw + col];
				b1 += s1[g * cw + col];
			}
			part0[(int64_t)e * nb + blockIdx.x] = b0;
			part1[(int64_t)e * nb + blockIdx.x] = b1;
		}
		__syncthreads();
	}
}

__global__ void __launch_bounds__(AUX_THREADS)
aux_sum_kernel(const double *__restrict__ part0, const double *__restrict__ part1, int64_t nb,
	       double *v0, double *v1)
{
	__shared__ double red[32];
	const int64_t e = blockIdx.x;
	double b0 = 0.0, b1 = 0.0;
	for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) {
		b0 += part0[e * nb + b];
		b1 += part1[e * nb + b];
	}
	b0 = block_sum(b0, red);
	b1 = block_sum(b1, red);
	if (threadIdx.x == 0) {
		v0[e] = b0;
		v1[e] = b1;
	}
}

/* Sum over e < E of f(e), each thread taking e = tid, tid + blockDim, ... in order, then
 * block_sum; the result broadcast to every thread. */
template <typename Fn>
__device__ __forceinline__ double block_sum_over(int E, Fn f, double *red)
{
	__shared__ double out;
	double s = 0.0;
	for (int e = threadIdx.x; e < E; e += blockDim.x)
		s += f(e);
	s = block_sum(s, red);
	if (threadIdx.x == 0)
		out = s;
	__syncthreads();
	s = out;
	__syncthreads(); /* out may be reused */
	return s;
}

/* The loss into *aux (forward), or (backward) the per-expert factors of its gradient:
 *   GShard fac0[e] = aux_weight E (n1_e / T) / T;
 *   load-importance fac0[e] = aux_weight/2 d cv2(Imp) / d Imp_e, fac1[e] = aux_weight/2
 *   d cv2(Load) / d Load_e / sigma (sigma is the chain rule's factor of Phi's argument);
 * with cv2(v) = var / (mu^2 + 1e-10), unbiased variance. */
__global__ void __launch_bounds__(AUX_THREADS)
aux_final_kernel(const gate_args a, const double *__restrict__ v0,
		 const double *__restrict__ v1, float *aux, int backward, double aux_weight,
		 double *fac0, double *fac1)
{
	__shared__ double red[32];
	const int E = a.E;
	const double T = (double)a.T;

	if (!a.li) {
		if (backward) {
			for (int e = threadIdx.x; e < E; e += blockDim.x)
				fac0[e] = aux_weight * E * (v0[e] / T) / T;
			return;
		}
		const double l = block_sum_over(
			E, [&](int e) { return (v0[e] / T) * (v1[e] / T); }, red);
		if (threadIdx.x == 0)
			*aux = (float)(l * E);
		return;
	}
	double mu[2], var[2], D[2];
#pragma unroll
	for (int q = 0; q < 2; q++) {
		const double *v = q ? v1 : v0;
		mu[q] = block_sum_over(E, [&](int e) { return v[e]; }, red) / E;
		const double m = mu[q];
		var[q] = block_sum_over(E, [&](int e) { return (v[e] - m) * (v[e] - m); }, red) /
			 (E - 1);
		D[q] = mu[q] * mu[q] + 1e-10;
	}
	if (!backward) {
		if (threadIdx.x == 0)
			*aux = (float)((var[0] / D[0] + var[1] / D[1]) / 2.0);
		return;
	}
	for (int e = threadIdx.x; e < E; e += blockDim.x) {
#pragma unroll
		for (int q = 0; q < 2; q++) {
			const double v = q ? v1[e] : v0[e];
			const double g = 2.0 * (v - mu[q]) / (E - 1) / D[q] -
					 var[q] * (2.0 * mu[q] / E) / (D[q] * D[q]);
			if (q)
				fac1[e] = g * (0.5 * aux_weight) / a.sigma;
			else
				fac0[e] = g * (0.5 * aux_weight);
		}
	}
}

/* Per token (lanes as the forward's): dp = the GShard factor (or 0), plus the score terms
 * through the renormalisation, added by the owner lane; dlogits = p (dp - <p, dp>);
 * load-importance adds q (dq - <q, dq>) with dq = fac0 + fac1 pdf((q - thr) / sigma), and
 * minus the sum of those pdf terms at the rank-(k-1) logit (thrs from gate_thr_kernel). As
 * moe_cpu.c: float for the softmax parts, double for the factors. With NR == 0 dp lives in
 * the dlogits row and dq is recomputed where it is needed, with the same bits. */
template <int L, int NR>
__global__ void __launch_bounds__(GATE_THREADS)
gate_backward_kernel(const gate_args a, const float *__restrict__ probs,
		     const float *__restrict__ clean, const int32_t *__restrict__ idx,
		     const float *__restrict__ dscore, const float *__restrict__ thrs,
		     const double *__restrict__ fac0, const double *__restrict__ fac1,
		     float *dlogits)
{
	const int E = a.E, k = a.k, li = a.li, sub = threadIdx.x & (L - 1);
	const int64_t T = a.T, step = (int64_t)gridDim.x * GATE_WARPS * (32 / L);
	const int nj = NR > 0 ? NR : (E + L - 1) / L;
	float pr[NR > 0 ? NR : 1], dp[NR > 0 ? NR : 1], qr[NR > 0 ? NR : 1];
	float dqr[NR > 0 ? NR : 1];

	for (int64_t t0 = ((int64_t)blockIdx.x * GATE_WARPS + (threadIdx.x >> 5)) * (32 / L);
	     t0 < T; t0 += step) {
		const int64_t tg = t0 + (threadIdx.x & 31) / L;
		const bool on = tg < T;
		const int64_t t = on ? tg : t0;
		const float *prow = probs + t * E;
		float *drow = dlogits + t * E;
#pragma unroll
		for (int j = 0; j < nj; j++) {
			const int e = sub + L * j;
			if (e < E) {
				if (NR > 0)
					pr[j] = prow[e];
				lane_put<NR>(dp, drow, j, e, li ? 0.0f : (float)fac0[e]);
			}
		}
		/* through the renormalisation s_j = p_j / S (k > 1) */
		float S = 0.0f, sp = 0.0f, corr = 0.0f;
		if (k > 1) {
			for (int r = 0; r < k; r++)
				S += prow[idx[(int64_t)r * T + t]];
			for (int r = 0; r < k; r++)
				sp += dscore[(int64_t)r * T + t] * prow[idx[(int64_t)r * T + t]];
			const int clamped = !(S > FLT_EPSILON);
			S = clamped ? FLT_EPSILON : S;
			corr = clamped ? 0.0f : sp / (S * S);
		}
		for (int r = 0; r < k; r++) {
			const int er = idx[(int64_t)r * T + t];
			const float ds = dscore[(int64_t)r * T + t];
			const float d = k == 1 ? ds : ds / S - corr;
#pragma unroll
			for (int j = 0; j < nj; j++)
				if (sub + L * j == er)
					lane_put<NR>(dp, drow, j, er,
						     lane_get<NR>(dp, drow, j, er) + d);
		}
		/* softmax backward */
		float dot = 0.0f;
#pragma unroll
		for (int j = 0; j < nj; j++) {
			const int e = sub + L * j;
			if (e < E)
				dot += lane_get<NR>(pr, prow, j, e) * lane_get<NR>(dp, drow, j, e);
		}
		dot = group_sum<L>(dot);
#pragma unroll
		for (int j = 0; j < nj; j++) {
			const int e = sub + L * j;
			if (e < E) {
				const float p = lane_get<NR>(pr, prow, j, e);
				const float d = lane_get<NR>(dp, drow, j, e);
				lane_put<NR>(dp, drow, j, e, p * (d - dot));
			}
		}
		if (li) {
			const float *qrow = clean + t * E;
			const int ek = idx[(int64_t)(k - 1) * T + t];
			const double thr = thrs[t];
			double dthr = 0.0;
			float dotq = 0.0f;
#pragma unroll
			for (int j = 0; j < nj; j++) {
				const int e = sub + L * j;
				if (e < E) {
					const float q = qrow[e];
					const double gl =
						__dmul_rn(fac1[e], phi_pdf((q - thr) / a.sigma));
					const float dq = (float)__dadd_rn(fac0[e], gl);
					if (NR > 0) {
						qr[j] = q;
						dqr[j] = dq;
					}
					dthr -= gl;
					dotq += q * dq;
				}
			}
			dthr = group_sum<L>(dthr);
			dotq = group_sum<L>(dotq);
#pragma unroll
			for (int j = 0; j < nj; j++) {
				const int e = sub + L * j;
				if (e < E) {
					float q, dq;
					if (NR > 0) {
						q = qr[j];
						dq = dqr[j];
					} else { /* the first pass's bits: no contraction */
						q = qrow[e];
						dq = (float)__dadd_rn(
							fac0[e],
							__dmul_rn(fac1[e],
								  phi_pdf((q - thr) / a.sigma)));
					}
					float dl = lane_get<NR>(dp, drow, j, e) + q * (dq - dotq);
					if (e == ek)
						dl += (float)dthr;
					lane_put<NR>(dp, drow, j, e, dl);
				}
			}
		}
		if (NR > 0 && on) {
#pragma unroll
			for (int j = 0; j < nj; j++) {
				const int e = sub + L * j;
				if (e < E)
					drow[e] = dp[j];
			}
		}
	}
}

/* Lanes per token for E experts (0: more than 32 GATE_NR, a warp per token, in memory). */
static int gate_lanes(int E)
{
	int L = 1;
	while (L < 32 && L * GATE_NR < E)
		L <<= 1;
	return L * GATE_NR < E ? 0 : L;
}

/* Launch kern<L, NR> for E's lanes over T tokens, on the stream of the cuda_ctx c in scope. */
#define GATE_LAUNCH(kern, E, T, ...)                                                           \
	do {                                                                                   \
		const int lanes_ = gate_lanes(E);                                              \
		const unsigned grid_ = cuda_grid(c, (size_t)(T), (lanes_ ? GATE_THREADS / lanes_ \
									 : GATE_WARPS));       \
		cudaStream_t st_ = c->stream;                                                  \
		switch (lanes_) {                                                              \
		case 1: CUDA_LAUNCH((kern<1, GATE_NR>), grid_, GATE_THREADS, 0, st_,           \
				    __VA_ARGS__);                                              \
			break;                                                                 \
		case 2: CUDA_LAUNCH((kern<2, GATE_NR>), grid_, GATE_THREADS, 0, st_,           \
				    __VA_ARGS__);                                              \
			break;                                                                 \
		case 4: CUDA_LAUNCH((kern<4, GATE_NR>), grid_, GATE_THREADS, 0, st_,           \
				    __VA_ARGS__);                                              \
			break;                                                                 \
		case 8: CUDA_LAUNCH((kern<8, GATE_NR>), grid_, GATE_THREADS, 0, st_,           \
				    __VA_ARGS__);                                              \
			break;                                                                 \
		case 16: CUDA_LAUNCH((kern<16, GATE_NR>), grid_, GATE_THREADS, 0, st_,         \
				     __VA_ARGS__);                                             \
			break;                                                                 \
		case 32: CUDA_LAUNCH((kern<32, GATE_NR>), grid_, GATE_THREADS, 0, st_,         \
				     __VA_ARGS__);                                             \
			break;                                                                 \
		default: CUDA_LAUNCH((kern<32, 0>), grid_, GATE_THREADS, 0, st_,               \
				     __VA_ARGS__);                                             \
			break;                                                                 \
		}                                                                              \
	} while (0)

static gate_args gate_args_of(const struct backend_moe_gate *g)
{
	gate_args a;
	a.T = g->T;
	a.E = g->E;
	a.k = g->k;
	a.li = g->load_importance;
	a.noise = g->noise;
	a.seed = g->seed;
	a.step = g->step;
	a.sigma = (double)g->noise / g->E;
	return a;
}

/* Tokens per chunk of the loss's first level: a function of T only. */
static int64_t aux_chunk(int64_t T)
{
	const int64_t ch = (T + AUX_MAX_CHUNKS - 1) / AUX_MAX_CHUNKS;
	return ch > AUX_MIN_ROWS ? ch : AUX_MIN_ROWS;
}

/* Levels 1-3 of the loss's reduction (after the gate forward, or for the backward). */
static int aux_launch(struct cuda_ctx *c, const gate_args &a, const float *probs,
		      const float *clean, const int32_t *idx, const float *thr, double *part0,
		      double *part1, double *v0, double *v1, float *aux, int backward,
		      double aux_weight, double *fac0, double *fac1, const char *what)
{
	const int64_t ch = aux_chunk(a.T), nb = (a.T + ch - 1) / ch;
	CUDA_LAUNCH(aux_partial_kernel, (unsigned)nb, AUX_THREADS, 0, c->stream, a, probs, clean,
		    idx, thr, !backward, ch, nb, part0, part1);
	CUDA_LAUNCHED(what);
	CUDA_LAUNCH(aux_sum_kernel, (unsigned)a.E, AUX_THREADS, 0, c->stream, part0, part1,
		    nb, v0, v1);
	CUDA_LAUNCHED(what);
	CUDA_LAUNCH(aux_final_kernel, 1, AUX_THREADS, 0, c->stream, a, v0, v1, aux, backward,
		    aux_weight, fac0, fac1);
	CUDA_LAUNCHED(what);
	return 0;
}

/* The gate ops' workspace, carved once: thr [T] (load-importance only), the loss's chunk
 * partials part0, part1 [nb, E] and per-expert sums v0, v1 [E]; the backward adds its
 * per-expert factors fac0, fac1 [E]. */
struct gate_ws {
	float *thr;
	double *part0, *part1, *v0, *v1, *fac0, *fac1;
};

static int gate_workspace(struct cuda_ctx *c, const gate_args *a, int backward,
			  struct gate_ws *w)
{
	const int64_t T = a->T, E = a->E, ch = aux_chunk(T), nb = (T + ch - 1) / ch;
	const size_t bpart = sizeof(double) * (size_t)(nb * E), bv = sizeof(double) * (size_t)E;
	const size_t bthr = a->li ? sizeof(float) * (size_t)T : 0;
	void *ws;
	ERR_FORWARD(cuda_workspace(c, cuda_ws_round(bthr) + 2 * cuda_ws_round(bpart) +
				      (backward ? 4 : 2) * cuda_ws_round(bv), &ws));
	char *p = (char *)ws;
	w->thr = a->li ? (float *)cuda_ws_take(&p, bthr) : NULL;
	w->part0 = (double *)cuda_ws_take(&p, bpart);
	w->part1 = (double *)cuda_ws_take(&p, bpart);
	w->v0 = (double *)cuda_ws_take(&p, bv);
	w->v1 = (double *)cuda_ws_take(&p, bv);
	w->fac0 = backward ? (double *)cuda_ws_take(&p, bv) : NULL;
	w->fac1 = backward ? (double *)cuda_ws_take(&p, bv) : NULL;
	return 0;
}

int cuda_moe_gate_forward(struct backend *be, const struct backend_moe_gate *g,
			  const float *logits, float *probs, float *clean, float *top,
			  int32_t *idx, float *score, float *aux)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	const gate_args a = gate_args_of(g);
	const int64_t T = a.T;
	if (T < 1)
		return 0;
	struct gate_ws w;
	ERR_FORWARD(gate_workspace(c, &a, 0, &w));
	GATE_LAUNCH(gate_forward_kernel, a.E, T, a, logits, probs, clean, top, idx, score, w.thr);
	CUDA_LAUNCHED("moe_gate_forward");
	return aux_launch(c, a, probs, clean, idx, w.thr, w.part0, w.part1, w.v0, w.v1, aux, 0, 0.0,
			  NULL, NULL, "moe_gate_forward (loss)");
}

int cuda_moe_gate_backward(struct backend *be, const struct backend_moe_gate *g,
			   const float *logits, const float *probs, const float *clean,
			   const int32_t *idx, const float *dscore, float aux_weight,
			   float *dlogits)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	const gate_args a = gate_args_of(g);
	const int64_t T = a.T;
	if (T < 1)
		return 0;
	struct gate_ws w;
	ERR_FORWARD(gate_workspace(c, &a, 1, &w));
	float *thr = w.thr;
	double *part0 = w.part0, *part1 = w.part1, *v0 = w.v0, *v1 = w.v1;
	double *fac0 = w.fac0, *fac1 = w.fac1;

	if (a.li) {
		CUDA_LAUNCH(gate_thr_kernel, cuda_grid(c, (size_t)T, 256), 256, 0, c->stream, a,
			    logits, idx, thr);
		CUDA_LAUNCHED("moe_gate_backward (thresholds)");
	}
	ERR_FORWARD(aux_launch(c, a, probs, clean, idx, thr, part0, part1, v0, v1, NULL, 1,
			       (double)aux_weight, fac0, fac1, "moe_gate_backward (loss factors)"));

	GATE_LAUNCH(gate_backward_kernel, a.E, T, a, probs, clean, idx, dscore, thr, fac0, fac1,
		    dlogits);
	CUDA_LAUNCHED("moe_gate_backward");
	return 0;
}

/* ---- counts and locations -------------------------------------------------------------- */

/* Per block a histogram in shared memory (hist non-zero: E counters) or straight in count;
 * integer atomics, whose result does not depend on their order. */
__global__ void count_kernel(const int32_t *__restrict__ idx, int64_t n, int E, int shared,
			     int64_t *count)
{
	CUDA_DYN_SHARED(unsigned, hist);
	unsigned long long *cnt = (unsigned long long *)count;

	if (shared) {
		for (int e = threadIdx.x; e < E; e += blockDim.x)
			hist[e] = 0u;
		__syncthreads();
	}
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		if (shared)
			atomicAdd(&hist[idx[i]], 1u);
		else
			atomicAdd(&cnt[idx[i]], 1ull);
	}
	if (shared) {
		__syncthreads();
		for (int e = threadIdx.x; e < E; e += blockDim.x)
			if (hist[e])
				atomicAdd(&cnt[e], (unsigned long long)hist[e]);
	}
}

int cuda_moe_count(struct backend *be, const int32_t *idx, int64_t n, int E, int64_t *count)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	CUDA_TRY(cudaMemsetAsync(count, 0, sizeof(int64_t) * (size_t)E, c->stream),
		 "moe_count");
	if (n < 1)
		return 0;
	const size_t sh = sizeof(unsigned) * (size_t)E;
	const int shared = sh <= 48 * 1024;
	CUDA_LAUNCH(count_kernel, cuda_grid(c, (size_t)n, 256), 256, shared ? sh : 0, c->stream,
		    idx, n, E, shared, count);
	CUDA_LAUNCHED("moe_count");
	return 0;
}

/* The r copies' route (backend.h, moe_route_copies): one thread per copied choice, and per
 * copied count. */
__global__ void route_copies_kernel(const int32_t *__restrict__ idx,
				    const int32_t *__restrict__ loc,
				    const float *__restrict__ score,
				    const int64_t *__restrict__ count, int64_t n, int E, int r,
				    int32_t *__restrict__ vidx, int32_t *__restrict__ vloc,
				    float *__restrict__ vscore, int64_t *__restrict__ vcount)
{
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n * r;
	     i += (int64_t)gridDim.x * blockDim.x) {
		const int64_t t = i % n;
		vidx[i] = idx[t] * r + (int32_t)(i / n);
		vloc[i] = loc[t];
		vscore[i] = score[t];
	}
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (int64_t)E * r;
	     i += (int64_t)gridDim.x * blockDim.x)
		vcount[i] = count[i / r];
}

int cuda_moe_route_copies(struct backend *be, const struct backend_moe_route *in, int r,
			  int32_t *vidx, int32_t *vloc, float *vscore, int64_t *vcount)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	const int64_t n = (int64_t)in->k * in->T, most = n > in->E ? n : in->E;
	if (most > 0) {
		CUDA_LAUNCH(route_copies_kernel, cuda_grid(c, (size_t)(most * r), 256), 256, 0,
			    c->stream, in->idx, in->loc, in->score, in->count, n, in->E, r, vidx,
			    vloc, vscore, vcount);
		CUDA_LAUNCHED("moe_route_copies");
	}
	return 0;
}

/* BPR sort keys: ascending order of key = descending top, -0 as +0 (the radix sort is
 * stable, so ties keep token order). */
__global__ void loc_order_keys(const float *__restrict__ top, int64_t T, uint32_t *key,
			       int32_t *val)
{
	for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < T;
	     t += (int64_t)gridDim.x * blockDim.x) {
		const float f = top[t];
		uint32_t u = __float_as_uint(f);
		if (f == 0.0f)
			u = 0u;
		const uint32_t ord = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
		key[t] = ~ord;
		val[t] = (int32_t)t;
	}
}

/* The visiting sequence v = r T + i (rank r, i-th token in BPR order, order NULL: token
 * order): the choice it visits and that choice's expert. */
__global__ void loc_visit(const int32_t *__restrict__ idx, const int32_t *__restrict__ order,
			  int64_t T, int64_t n, uint32_t *key, int32_t *val)
{
	for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < n;
	     v += (int64_t)gridDim.x * blockDim.x) {
		const int64_t r = v / T, i = v - r * T;
		const int64_t ch = r * T + (order ? order[i] : i);
		key[v] = (uint32_t)idx[ch];
		val[v] = (int32_t)ch;
	}
}

/* After the stable sort by expert: start[e] = the first position of expert e. */
__global__ void loc_starts(const uint32_t *__restrict__ key, int64_t n, int32_t *start)
{
	for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < n;
	     q += (int64_t)gridDim.x * blockDim.x)
		if (q == 0 || key[q] != key[q - 1])
			start[key[q]] = (int32_t)q;
}

/* The slot of the choice at sorted position q: its rank within its expert. */
__global__ void loc_assign(const uint32_t *__restrict__ key, const int32_t *__restrict__ val,
			   const int32_t *__restrict__ start, int64_t n, int64_t C, int32_t *loc)
{
	for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < n;
	     q += (int64_t)gridDim.x * blockDim.x) {
		const int64_t l = q - start[key[q]];
		loc[val[q]] = l < C ? (int32_t)l : -1;
	}
}

int cuda_moe_locations(struct backend *be, const int32_t *idx, const float *top, int64_t T,
		       int k, int E, int64_t C, int32_t *loc)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	const int64_t n = (int64_t)k * T;
	if (n < 1)
		return 0;
	if (n > INT32_MAX)
		return err_set(CORE_EUNSUPPORTED, NULL, "cuda: moe_locations: %lld choices are "
			       "more than the sort handles", (long long)n);
	int nbits = 1;
	while (nbits < 32 && (1u << nbits) < (unsigned)E)
		nbits++;
	/* CUB's scratch sizes (host-side arithmetic only) */
	size_t tmp1 = 0, tmp2 = 0;
	if (top)
		CUDA_TRY(cub::DeviceRadixSort::SortPairs(NULL, tmp1, (const uint32_t *)NULL,
							 (uint32_t *)NULL, (const int32_t *)NULL,
							 (int32_t *)NULL, (int)T, 0, 32, c->stream),
			 "moe_locations (sort size)");
	CUDA_TRY(cub::DeviceRadixSort::SortPairs(NULL, tmp2, (const uint32_t *)NULL,
						 (uint32_t *)NULL, (const int32_t *)NULL,
						 (int32_t *)NULL, (int)n, 0, nbits, c->stream),
		 "moe_locations (sort size)");
	const size_t tmp = tmp1 > tmp2 ? tmp1 : tmp2;
	const size_t bt = top ? sizeof(uint32_t) * (size_t)T : 0, bn = sizeof(uint32_t) * (size_t)n;
	void *ws;
	ERR_FORWARD(cuda_workspace(c, 4 * cuda_ws_round(bt) + 4 * cuda_ws_round(bn) +
				      cuda_ws_round(sizeof(int32_t) * (size_t)E) +
				      cuda_ws_round(tmp), &ws));
	char *p = (char *)ws;
	uint32_t *okey = (uint32_t *)cuda_ws_take(&p, bt);
	uint32_t *okey2 = (uint32_t *)cuda_ws_take(&p, bt);
	int32_t *oval = (int32_t *)cuda_ws_take(&p, bt), *order = (int32_t *)cuda_ws_take(&p, bt);
	uint32_t *vkey = (uint32_t *)cuda_ws_take(&p, bn);
	uint32_t *vkey2 = (uint32_t *)cuda_ws_take(&p, bn);
	int32_t *vval = (int32_t *)cuda_ws_take(&p, bn), *vval2 = (int32_t *)cuda_ws_take(&p, bn);
	int32_t *start = (int32_t *)cuda_ws_take(&p, sizeof(int32_t) * (size_t)E);
	void *sort_tmp = cuda_ws_take(&p, tmp);

	if (top) {
		CUDA_LAUNCH(loc_order_keys, cuda_grid(c, (size_t)T, 256), 256, 0, c->stream, top, T,
			    okey, oval);
		CUDA_LAUNCHED("moe_locations (keys)");
		size_t b = tmp;
		CUDA_TRY(cub::DeviceRadixSort::SortPairs(sort_tmp, b, okey, okey2, oval, order,
							 (int)T, 0, 32, c->stream),
			 "moe_locations (BPR sort)");
	}
	CUDA_LAUNCH(loc_visit, cuda_grid(c, (size_t)n, 256), 256, 0, c->stream, idx,
		    top ? order : NULL, T, n, vkey, vval);
	CUDA_LAUNCHED("moe_locations (visits)");
	size_t b = tmp;
	CUDA_TRY(cub::DeviceRadixSort::SortPairs(sort_tmp, b, vkey, vkey2, vval, vval2, (int)n, 0,
						 nbits, c->stream),
		 "moe_locations (expert sort)");
	CUDA_LAUNCH(loc_starts, cuda_grid(c, (size_t)n, 256), 256, 0, c->stream, vkey2, n, start);
	CUDA_LAUNCHED("moe_locations (starts)");
	CUDA_LAUNCH(loc_assign, cuda_grid(c, (size_t)n, 256), 256, 0, c->stream, vkey2, vval2,
		    start, n, C, loc);
	CUDA_LAUNCHED("moe_locations (slots)");
	return 0;
}

/* ---- row kernels: encode, decode and their backwards ------------------------------------
 * Rows hold S = float or S = __nv_bfloat16 (backend.h's uint16_t bfloat16), in groups of
 * RW<S> consecutive elements: 16 bytes, 4 floats or 8 bfloat16. In a tile of ROW_CPT *
 * blockDim groups thread tid owns groups tile + i blockDim + tid, i < ROW_CPT. VEC: one uint4
 * access per group (every row pointer 16-byte aligned: aligned buffers and M % RW<S> == 0);
 * else scalars, skipping the elements past M. Arithmetic is in float on the widened values
 * (exact), and a bfloat16 result is rounded once, to nearest even, as it is stored; encode
 * moves bits and never converts. */

#define ROW_CPT 4
#define ROW_MAX_THREADS 256

template <typename S>
constexpr int RW = 16 / (int)sizeof(S);

/* Conversions between a row's storage and float, per element and per uint4 group (a word of a
 * bfloat16 group holds element 2j in its low half and 2j+1 in its high half: little-endian). */
template <typename S>
struct row_io;

template <>
struct row_io<float> {
	static __device__ __forceinline__ float widen(float v) { return v; }
	static __device__ __forceinline__ float narrow(float v) { return v; }
	static __device__ __forceinline__ void unpack(uint4 u, float *a)
	{
		a[0] = __uint_as_float(u.x);
		a[1] = __uint_as_float(u.y);
		a[2] = __uint_as_float(u.z);
		a[3] = __uint_as_float(u.w);
	}
	static __device__ __forceinline__ uint4 pack(const float *a)
	{
		return make_uint4(__float_as_uint(a[0]), __float_as_uint(a[1]),
				  __float_as_uint(a[2]), __float_as_uint(a[3]));
	}
};

template <>
struct row_io<__nv_bfloat16> {
	static __device__ __forceinline__ float widen(__nv_bfloat16 v)
	{
		return __bfloat162float(v);
	}
	static __device__ __forceinline__ __nv_bfloat16 narrow(float v)
	{
		return __float2bfloat16_rn(v);
	}
	static __device__ __forceinline__ void half2(unsigned w, float *a)
	{
		a[0] = __uint_as_float(w << 16);
		a[1] = __uint_as_float(w & 0xffff0000u);
	}
	static __device__ __forceinline__ unsigned word(float lo, float hi)
	{
		return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
		       (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16;
	}
	static __device__ __forceinline__ void unpack(uint4 u, float *a)
	{
		half2(u.x, a);
		half2(u.y, a + 2);
		half2(u.z, a + 4);
		half2(u.w, a + 6);
	}
	static __device__ __forceinline__ uint4 pack(const float *a)
	{
		return make_uint4(word(a[0], a[1]), word(a[2], a[3]), word(a[4], a[5]),
				  word(a[6], a[7]));
	}
};

/* Group g of a row as floats (0 past M). */
template <typename S, bool VEC>
__device__ __forceinline__ void load_group(const S *row, int64_t g, int64_t M, float *a)
{
	constexpr int W = RW<S>;
	if (VEC) {
		row_io<S>::unpack(reinterpret_cast<const uint4 *>(row)[g], a);
		return;
	}
	const int64_t m = W * g; /* < M: g is a group of the row */
#pragma unroll
	for (int i = 0; i < W; i++)
		a[i] = (i == 0 || m + i < M) ? row_io<S>::widen(row[m + i]) : 0.0f;
}

/* Group g of a row from floats, rounded to S (elements past M not written). */
template <typename S, bool VEC>
__device__ __forceinline__ void store_group(S *row, int64_t g, int64_t M, const float *a)
{
	constexpr int W = RW<S>;
	if (VEC) {
		reinterpret_cast<uint4 *>(row)[g] = row_io<S>::pack(a);
		return;
	}
	const int64_t m = W * g;
#pragma unroll
	for (int i = 0; i < W; i++)
		if (i == 0 || m + i < M)
			row[m + i] = row_io<S>::narrow(a[i]);
}

/* Group g of a row as its bits, for copies: u (VEC) or s (scalars, past M unset). */
template <typename S>
struct raw_group {
	uint4 u;
	S s[RW<S>];
};

template <typename S, bool VEC>
__device__ __forceinline__ void load_raw(const S *row, int64_t g, int64_t M, raw_group<S> &v)
{
	constexpr int W = RW<S>;
	if (VEC) {
		v.u = reinterpret_cast<const uint4 *>(row)[g];
		return;
	}
	const int64_t m = W * g;
#pragma unroll
	for (int i = 0; i < W; i++)
		if (i == 0 || m + i < M)
			v.s[i] = row[m + i];
}

template <typename S, bool VEC>
__device__ __forceinline__ void store_raw(S *row, int64_t g, int64_t M, const raw_group<S> &v)
{
	constexpr int W = RW<S>;
	if (VEC) {
		reinterpret_cast<uint4 *>(row)[g] = v.u;
		return;
	}
	const int64_t m = W * g;
#pragma unroll
	for (int i = 0; i < W; i++)
		if (i == 0 || m + i < M)
			row[m + i] = v.s[i];
}

/* Zero rows min(n_e, C) .. C-1 of every expert: one contiguous run per expert, blockIdx.y
 * the expert (striding by gridDim.y), the x blocks striding over the run. */
template <typename S, bool VEC>
__global__ void zero_padding_kernel(const int64_t *__restrict__ count, int E, int64_t C,
				    int64_t M, S *buf)
{
	for (int e = blockIdx.y; e < E; e += gridDim.y) {
		const int64_t used = count[e] < C ? count[e] : C;
		const int64_t n = (C - used) * M;
		S *base = buf + ((int64_t)e * C + used) * M;
		const int64_t step = (int64_t)gridDim.x * blockDim.x;
		if (VEC) {
			uint4 *b4 = reinterpret_cast<uint4 *>(base);
			const uint4 z = make_uint4(0u, 0u, 0u, 0u);
			for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
			     i < n / RW<S>; i += step)
				b4[i] = z;
		} else {
			for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
			     i += step)
				base[i] = row_io<S>::narrow(0.0f);
		}
	}
}

/* K0: token t's row read once per tile and written to each of its kept slots, bit for bit. */
template <typename S, bool VEC>
__global__ void __launch_bounds__(ROW_MAX_THREADS)
encode_kernel(const int32_t *__restrict__ idx, const int32_t *__restrict__ loc, int64_t T,
	      int k, int64_t C, int64_t M, const S *__restrict__ x, S *__restrict__ disp)
{
	const int64_t G = (M + RW<S> - 1) / RW<S>, B = blockDim.x;
	for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
		const S *src = x + t * M;
		for (int64_t g0 = 0; g0 < G; g0 += ROW_CPT * B) {
			raw_group<S> v[ROW_CPT];
#pragma unroll
			for (int i = 0; i < ROW_CPT; i++) {
				const int64_t g = g0 + i * B + threadIdx.x;
				if (g < G)
					load_raw<S, VEC>(src, g, M, v[i]);
			}
			for (int j = 0; j < k; j++) {
				const int32_t l = loc[(int64_t)j * T + t];
				if (l < 0)
					continue;
				S *dst = disp + ((int64_t)idx[(int64_t)j * T + t] * C + l) * M;
#pragma unroll
				for (int i = 0; i < ROW_CPT; i++) {
					const int64_t g = g0 + i * B + threadIdx.x;
					if (g < G)
						store_raw<S, VEC>(dst, g, M, v[i]);
				}
			}
		}
	}
}

/* K1: out[t] = the sum over t's kept choices, in rank order from zero, of score * row
 * (WEIGHTED, as fused multiply-adds: decode) or of the rows (encode backward), in float,
 * rounded to S once at the store. */
template <typename S, bool VEC, bool WEIGHTED>
__global__ void __launch_bounds__(ROW_MAX_THREADS)
gather_kernel(const int32_t *__restrict__ idx, const int32_t *__restrict__ loc,
	      const float *__restrict__ score, int64_t T, int k, int64_t C, int64_t M,
	      const S *__restrict__ buf, S *__restrict__ out)
{
	constexpr int W = RW<S>;
	const int64_t G = (M + W - 1) / W, B = blockDim.x;
	for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
		for (int64_t g0 = 0; g0 < G; g0 += ROW_CPT * B) {
			float acc[ROW_CPT][W];
#pragma unroll
			for (int i = 0; i < ROW_CPT; i++)
#pragma unroll
				for (int e = 0; e < W; e++)
					acc[i][e] = 0.0f;
			for (int j = 0; j < k; j++) {
				const int64_t ci = (int64_t)j * T + t;
				const int32_t l = loc[ci];
				if (l < 0)
					continue;
				const S *src = buf + ((int64_t)idx[ci] * C + l) * M;
				const float s = WEIGHTED ? score[ci] : 1.0f;
#pragma unroll
				for (int i = 0; i < ROW_CPT; i++) {
					const int64_t g = g0 + i * B + threadIdx.x;
					if (g < G) {
						float v[W];
						load_group<S, VEC>(src, g, M, v);
#pragma unroll
						for (int e = 0; e < W; e++) {
							float &a = acc[i][e];
							a = WEIGHTED ? fmaf(s, v[e], a)
								     : __fadd_rn(a, v[e]);
						}
					}
				}
			}
			S *dst = out + t * M;
#pragma unroll
			for (int i = 0; i < ROW_CPT; i++) {
				const int64_t g = g0 + i * B + threadIdx.x;
				if (g < G)
					store_group<S, VEC>(dst, g, M, acc[i]);
			}
		}
	}
}

/* K2 + K0 per kept choice of token t, in rank order: dscore = <dy[t], eo row> (each thread
 * accumulates its groups in order, then block_sum; for bfloat16 each product is exact in
 * float) and d_eo row = score * dy[t] (rounded to S). Each element of the row is read (eo)
 * and written (d_eo) by the same thread, read first, so d_eo may be eo; hence no
 * __restrict__ on those two. */
template <typename S, bool VEC>
__global__ void __launch_bounds__(ROW_MAX_THREADS)
decode_backward_kernel(const int32_t *__restrict__ idx, const int32_t *__restrict__ loc,
		       const float *__restrict__ score, int64_t T, int k, int64_t C, int64_t M,
		       const S *__restrict__ dy, const S *eo, S *d_eo, float *dscore)
{
	constexpr int W = RW<S>;
	__shared__ float red[32];
	const int64_t G = (M + W - 1) / W, B = blockDim.x;
	for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
		const S *gy = dy + t * M;
		for (int j = 0; j < k; j++) {
			const int64_t ci = (int64_t)j * T + t;
			const int32_t l = loc[ci];
			if (l < 0) { /* the same for the whole block */
				if (threadIdx.x == 0)
					dscore[ci] = 0.0f;
				continue;
			}
			const int64_t row = ((int64_t)idx[ci] * C + l) * M;
			const S *o = eo + row;
			S *d = d_eo + row;
			const float s = score[ci];
			float part = 0.0f;
			for (int64_t g0 = 0; g0 < G; g0 += ROW_CPT * B) {
#pragma unroll
				for (int i = 0; i < ROW_CPT; i++) {
					const int64_t g = g0 + i * B + threadIdx.x;
					if (g < G) {
						float a[W], b[W], sa[W];
						load_group<S, VEC>(gy, g, M, a);
						load_group<S, VEC>(o, g, M, b);
						/* past M (scalar path): a, b 0, skipped */
#pragma unroll
						for (int e = 0; e < W; e++) {
							if (VEC || e == 0 || W * g + e < M)
								part = fmaf(a[e], b[e], part);
							sa[e] = s * a[e];
						}
						store_group<S, VEC>(d, g, M, sa);
					}
				}
			}
			part = block_sum<float>(part, red);
			if (threadIdx.x == 0)
				dscore[ci] = part;
		}
	}
}

/* Threads per row block: enough for ROW_CPT groups of W elements each over one row, in whole
 * warps. */
static unsigned row_threads(int64_t M, int W)
{
	const int64_t G = (M + W - 1) / W;
	int64_t th = (G + ROW_CPT - 1) / ROW_CPT;
	th = (th + 31) / 32 * 32;
	return (unsigned)(th < 32 ? 32 : th > ROW_MAX_THREADS ? ROW_MAX_THREADS : th);
}

/* Blocks for T tokens (one each, a grid-stride loop beyond 2^20). */
static unsigned row_grid(int64_t T)
{
	return (unsigned)(T < (1 << 20) ? T : (1 << 20));
}

static int aligned16(const void *p)
{
	return ((uintptr_t)p & 15u) == 0;
}

template <typename S>
static int zero_padding(struct cuda_ctx *c, const struct backend_moe_route *r, S *buf,
			int64_t M)
{
	const int vec = aligned16(buf) && M % RW<S> == 0;
	const unsigned ey = (unsigned)(r->E < 65535 ? r->E : 65535);
	const int64_t want = (int64_t)c->sms * 8;
	int64_t bx = (want + ey - 1) / ey;
	const int64_t most = (r->C * M / (vec ? RW<S> : 1) + 255) / 256; /* a full run's blocks */
	bx = bx > most ? most : bx;
	bx = bx < 1 ? 1 : bx;
	const dim3 grid((unsigned)bx, ey);
	if (vec)
		CUDA_LAUNCH((zero_padding_kernel<S, true>), grid, 256, 0, c->stream, r->count,
			    r->E, r->C, M, buf);
	else
		CUDA_LAUNCH((zero_padding_kernel<S, false>), grid, 256, 0, c->stream, r->count,
			    r->E, r->C, M, buf);
	CUDA_LAUNCHED("moe zero padding");
	return 0;
}

template <typename S>
static int encode(struct cuda_ctx *c, const struct backend_moe_route *r, const S *x, S *disp,
		  int64_t M, int zero_pad, const char *what)
{
	if (zero_pad && r->E > 0 && r->C > 0 && M > 0)
		ERR_FORWARD(zero_padding<S>(c, r, disp, M));
	if (r->T < 1 || M < 1)
		return 0;
	const unsigned th = row_threads(M, RW<S>), grid = row_grid(r->T);
	if (aligned16(x) && aligned16(disp) && M % RW<S> == 0)
		CUDA_LAUNCH((encode_kernel<S, true>), grid, th, 0, c->stream, r->idx, r->loc,
			    r->T, r->k, r->C, M, x, disp);
	else
		CUDA_LAUNCH((encode_kernel<S, false>), grid, th, 0, c->stream, r->idx, r->loc,
			    r->T, r->k, r->C, M, x, disp);
	CUDA_LAUNCHED(what);
	return 0;
}

/* Decode (weighted) and encode backward (unweighted) share the gather. */
template <typename S>
static int gather(struct cuda_ctx *c, const struct backend_moe_route *r, const S *buf, S *out,
		  int64_t M, int weighted, const char *what)
{
	if (r->T < 1 || M < 1)
		return 0;
	const unsigned th = row_threads(M, RW<S>), grid = row_grid(r->T);
	const int vec = aligned16(buf) && aligned16(out) && M % RW<S> == 0;
	if (vec && weighted)
		CUDA_LAUNCH((gather_kernel<S, true, true>), grid, th, 0, c->stream, r->idx,
			    r->loc, r->score, r->T, r->k, r->C, M, buf, out);
	else if (vec)
		CUDA_LAUNCH((gather_kernel<S, true, false>), grid, th, 0, c->stream, r->idx,
			    r->loc, r->score, r->T, r->k, r->C, M, buf, out);
	else if (weighted)
		CUDA_LAUNCH((gather_kernel<S, false, true>), grid, th, 0, c->stream, r->idx,
			    r->loc, r->score, r->T, r->k, r->C, M, buf, out);
	else
		CUDA_LAUNCH((gather_kernel<S, false, false>), grid, th, 0, c->stream, r->idx,
			    r->loc, r->score, r->T, r->k, r->C, M, buf, out);
	CUDA_LAUNCHED(what);
	return 0;
}

template <typename S>
static int decode_backward(struct cuda_ctx *c, const struct backend_moe_route *r, const S *dy,
			   const S *eo, S *d_eo, float *dscore, int64_t M, int zero_pad,
			   const char *what)
{
	/* padding rows are not kept rows: zeroing them first never clobbers a row of eo that is
	 * still to be read when d_eo is eo */
	if (zero_pad && r->E > 0 && r->C > 0 && M > 0)
		ERR_FORWARD(zero_padding<S>(c, r, d_eo, M));
	if (r->T < 1)
		return 0;
	if (M < 1) { /* empty dot products */
		CUDA_TRY(cudaMemsetAsync(dscore, 0, sizeof(float) * (size_t)(r->k * r->T),
					 c->stream),
			 what);
		return 0;
	}
	const unsigned th = row_threads(M, RW<S>), grid = row_grid(r->T);
	if (aligned16(dy) && aligned16(eo) && aligned16(d_eo) && M % RW<S> == 0)
		CUDA_LAUNCH((decode_backward_kernel<S, true>), grid, th, 0, c->stream, r->idx,
			    r->loc, r->score, r->T, r->k, r->C, M, dy, eo, d_eo, dscore);
	else
		CUDA_LAUNCH((decode_backward_kernel<S, false>), grid, th, 0, c->stream, r->idx,
			    r->loc, r->score, r->T, r->k, r->C, M, dy, eo, d_eo, dscore);
	CUDA_LAUNCHED(what);
	return 0;
}

int cuda_moe_encode(struct backend *be, const struct backend_moe_route *r, const float *x,
		    float *disp, int64_t M, int zero_pad)
{
	return encode<float>(cuda_ctx_of(be), r, x, disp, M, zero_pad, "moe_encode");
}

int cuda_moe_decode(struct backend *be, const struct backend_moe_route *r, const float *eo,
		    float *y, int64_t M)
{
	return gather<float>(cuda_ctx_of(be), r, eo, y, M, 1, "moe_decode");
}

int cuda_moe_encode_backward(struct backend *be, const struct backend_moe_route *r,
			     const float *d_disp, float *dx, int64_t M)
{
	return gather<float>(cuda_ctx_of(be), r, d_disp, dx, M, 0, "moe_encode_backward");
}

int cuda_moe_decode_backward(struct backend *be, const struct backend_moe_route *r,
			     const float *dy, const float *eo, float *d_eo, float *dscore,
			     int64_t M, int zero_pad)
{
	return decode_backward<float>(cuda_ctx_of(be), r, dy, eo, d_eo, dscore, M, zero_pad,
				      "moe_decode_backward");
}

/* backend.h's bfloat16 is a uint16_t with the bits of CUDA's __nv_bfloat16. */
static_assert(sizeof(__nv_bfloat16) == sizeof(uint16_t), "bfloat16 is 2 bytes");
#define BF(p) reinterpret_cast<__nv_bfloat16 *>(p)
#define CBF(p) reinterpret_cast<const __nv_bfloat16 *>(p)

int cuda_moe_encode_bf16(struct backend *be, const struct backend_moe_route *r,
			 const uint16_t *x, uint16_t *disp, int64_t M, int zero_pad)
{
	return encode(cuda_ctx_of(be), r, CBF(x), BF(disp), M, zero_pad, "moe_encode_bf16");
}

int cuda_moe_decode_bf16(struct backend *be, const struct backend_moe_route *r,
			 const uint16_t *eo, uint16_t *y, int64_t M)
{
	return gather(cuda_ctx_of(be), r, CBF(eo), BF(y), M, 1, "moe_decode_bf16");
}

int cuda_moe_encode_backward_bf16(struct backend *be, const struct backend_moe_route *r,
				  const uint16_t *d_disp, uint16_t *dx, int64_t M)
{
	return gather(cuda_ctx_of(be), r, CBF(d_disp), BF(dx), M, 0, "moe_encode_backward_bf16");
}

int cuda_moe_decode_backward_bf16(struct backend *be, const struct backend_moe_route *r,
				  const uint16_t *dy, const uint16_t *eo, uint16_t *d_eo,
				  float *dscore, int64_t M, int zero_pad)
{
	return decode_backward(cuda_ctx_of(be), r, CBF(dy), CBF(eo), BF(d_eo), dscore, M,
			       zero_pad, "moe_decode_backward_bf16");
}
