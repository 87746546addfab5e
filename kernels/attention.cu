/* attention.cu - fused causal multi-head attention for the CUDA backend, fp32, forward and
 * backward, in the manner of FlashAttention-2 (Dao, arXiv 2307.08691, algorithms 1 and 2): tiles
 * of queries x keys in shared memory, the softmax kept online in registers, and no T x T matrix
 * ever written. backend_cuda.cu calls it when CORE_CUDA_ATTENTION=fused and hs <= 128; the
 * cuBLAS formulation stays the default until this is measured on a GPU.
 *
 * Math (backend.h's contract, per batch b and head h; s = 1/sqrt(hs)):
 *   S_ij = s q_i.k_j (j <= i), m_i = max_j S_ij, l_i = sum_j exp(S_ij - m_i),
 *   O_i = sum_j exp(S_ij - m_i) v_j / l_i, L_i = m_i + log l_i (the logsumexp);
 *   backward with P_ij = exp(S_ij - L_i), D_i = dO_i.O_i (= sum_j P_ij dP_ij):
 *   dv_j = sum_i P_ij dO_i, dP_ij = dO_i.v_j, dS_ij = P_ij (dP_ij - D_i),
 *   dk_j = s sum_i dS_ij q_i, dq_i = s sum_j dS_ij k_j.
 * The forward visits the key tiles of a query tile in order, keeping per row the running max m
 * and sum l, and rescales the output accumulator by exp(m_old - m_new) when m grows (FA2 sec.
 * 3.1.1). q, k, v are read straight from qkv [B,T,3C] and out, dqkv written in place: the
 * permutes of the cuBLAS path are not needed, since a tile row is hs contiguous floats either
 * way.
 *
 * What att holds (the backward's only memory of the forward; backend.h leaves att to the
 * backend): L [B*NH*T] at att[0], then, when T > hs, a copy of O as [B*NH, T, hs] right after
 * it (B NH T (1 + hs) <= B NH T T floats). The backward first forms D in workspace from dout and
 * that O; when T <= hs (short sequences only) O does not fit, and the backward recomputes it by
 * running the forward kernel into workspace, which costs a forward at a size where that is
 * cheap. Nothing else of att is written.
 *
 * Determinism, without atomics: each output element is owned by one thread, which sums its
 * terms in a fixed order (d ascending in the products, tiles in order, within a tile j or i
 * ascending); row statistics are a fixed xor-shuffle tree over the 16 lanes that share a row.
 * The backward is the atomic-free split: one kernel per key tile computes dk, dv looping over
 * the query tiles at or below the diagonal; another per query tile computes dq looping over the
 * key tiles, recomputing S and dP (7 tile products instead of FA2's 5 with atomics on dq).
 * Loads are float4 when the operand's address and hs allow it and scalar otherwise; the values
 * and the arithmetic are the same, so results do not depend on alignment.
 *
 * Tiles, for sm_90 in plain fp32 (no TF32: there are no tensor cores to feed, so this is a
 * SIMT register-blocked product, like an sgemm). 256 threads as 16 x 16: thread (ty, tx) owns
 * rows 4 ty .. 4 ty + 3 of a tile and columns tx + 16 c, so one row lives in 16 lanes of one
 * warp (the shuffle tree above) and per 4 steps of d a thread loads 4 + RN float4 from shared
 * memory for 16 RN fused multiply-adds. The output accumulator (O, dk/dv, dq) is 4 rows x
 * hs/16 columns per thread, columns 64 g + 4 tx + e, read as float4 rows of V that 16 lanes
 * load contiguously. hs is padded to HSP in {16, 32, 64, 128} with zeros. Rows of a tile in
 * shared memory are HSP + 4 floats apart: 16-byte aligned, and the column reads tx + 16 c fall
 * on distinct banks. Tile sizes: 64 queries x 64 keys (32 keys at HSP 128, where the
 * accumulator is 32 registers and K, V tiles are twice as large), so a tile product is 64 x 64
 * x HSP, enough reuse that shared-memory bandwidth does not bound it; forward shared memory
 * 68 KiB at HSP 64 (three blocks per SM by memory; registers, about 120 a thread, allow two),
 * backward 85-118 KiB. None of this is tuned yet: it has not run on a GPU.
 * Query tiles are scheduled from the last (the longest, most key tiles) down, and key tiles of
 * the backward from the first, so the long blocks start first. Opting in to more than 48 KiB
 * of dynamic shared memory is cudaFuncSetAttribute's, per kernel.
 */
#include <math.h>
#include <stdint.h>

#include "cuda_common.cuh"

#define ATT_NT 256 /* threads per block: 16 x 16 */
#define ATT_BR 64  /* rows of a tile: queries (forward, dq) or keys (dk, dv) */

/* The other side of a tile (keys in the forward and dq, queries in dk/dv) per padded head
 * size HSP. */
__host__ __device__ constexpr int att_cols(int hsp)
{
	return hsp == 128 ? 32 : 64;
}

/* The row reductions: over the 16 lanes tx of a row (xor < 16 stays within the half-warp),
 * the same tree and so the same bits in every lane. */
__device__ __forceinline__ float att_max16(float v)
{
	for (int o = 8; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

__device__ __forceinline__ float att_sum16(float v)
{
	for (int o = 8; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

/* Rows row0 .. row0 + R - 1 of a [T, hs] slab with row stride gs (elements) into sm [R][HSP+4];
 * rows past T and columns past hs are zeros. vec: g and gs allow float4 loads (hs % 4 == 0 and
 * g 16-byte aligned, as the host checks). */
template <int R, int HSP>
__device__ __forceinline__ void att_load(float *sm, const float *g, size_t gs, int row0, int T,
					 int hs, int vec)
{
	constexpr int LD = HSP + 4, G = HSP / 4;
	for (int x = threadIdx.x; x < R * G; x += ATT_NT) {
		int r = x / G, d = x % G * 4, t = row0 + r;
		float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		if (t < T && d < hs) {
			const float *p = g + (size_t)t * gs + d;
			if (vec) {
				v = *(const float4 *)p;
			} else {
				v.x = p[0];
				v.y = d + 1 < hs ? p[1] : 0.0f;
				v.z = d + 2 < hs ? p[2] : 0.0f;
				v.w = d + 3 < hs ? p[3] : 0.0f;
			}
		}
		*(float4 *)(sm + r * LD + d) = v;
	}
}

/* acc[r][c] = sum over d < HSP of A[4 ty + r][d] B[tx + 16 c][d] (A, B in shared memory with
 * rows HSP + 4 apart), d ascending. */
template <int RN, int HSP>
__device__ __forceinline__ void att_dot(float (&acc)[4][RN], const float *A, const float *B,
					int ty, int tx)
{
	constexpr int LD = HSP + 4;
#pragma unroll
	for (int r = 0; r < 4; r++)
#pragma unroll
		for (int c = 0; c < RN; c++)
			acc[r][c] = 0.0f;
#pragma unroll 4
	for (int d = 0; d < HSP; d += 4) {
		float4 a[4], b[RN];
#pragma unroll
		for (int r = 0; r < 4; r++)
			a[r] = *(const float4 *)(A + (4 * ty + r) * LD + d);
#pragma unroll
		for (int c = 0; c < RN; c++)
			b[c] = *(const float4 *)(B + (tx + 16 * c) * LD + d);
#pragma unroll
		for (int r = 0; r < 4; r++)
#pragma unroll
			for (int c = 0; c < RN; c++) {
				float s = acc[r][c];
				s = fmaf(a[r].x, b[c].x, s);
				s = fmaf(a[r].y, b[c].y, s);
				s = fmaf(a[r].z, b[c].z, s);
				s = fmaf(a[r].w, b[c].w, s);
				acc[r][c] = s;
			}
	}
}

/* Column of the thread's c-th accumulator column (of hs/16). */
template <int HSP>
__device__ __forceinline__ int att_ocol(int c, int tx)
{
	constexpr int ON = HSP / 16;
	return ON >= 4 ? c / 4 * 64 + 4 * tx + c % 4 : tx * ON + c;
}

/* acc[r][c] += sum over j < NJ of P[4 ty + r][j] V[j][att_ocol(c)], j ascending; P [64][NJ+4],
 * V [NJ][HSP+4] in shared memory. */
template <int NJ, int HSP>
__device__ __forceinline__ void att_pv(float (&acc)[4][HSP / 16], const float *P, const float *V,
				       int ty, int tx)
{
	constexpr int LD = HSP + 4, LP = NJ + 4, ON = HSP / 16;
#pragma unroll 2
	for (int j = 0; j < NJ; j += 4) {
		float4 p4[4];
#pragma unroll
		for (int r = 0; r < 4; r++)
			p4[r] = *(const float4 *)(P + (4 * ty + r) * LP + j);
#pragma unroll
		for (int e = 0; e < 4; e++) {
			const float *vr = V + (j + e) * LD;
			float v[ON];
			if constexpr (ON >= 4) {
#pragma unroll
				for (int g = 0; g < ON / 4; g++) {
					float4 w = *(const float4 *)(vr + 64 * g + 4 * tx);
					v[4 * g] = w.x, v[4 * g + 1] = w.y, v[4 * g + 2] = w.z,
					v[4 * g + 3] = w.w;
				}
			} else {
#pragma unroll
				for (int c = 0; c < ON; c++)
					v[c] = vr[tx * ON + c];
			}
#pragma unroll
			for (int r = 0; r < 4; r++) {
				float p = e == 0 ? p4[r].x : e == 1 ? p4[r].y : e == 2 ? p4[r].z : p4[r].w;
#pragma unroll
				for (int c = 0; c < ON; c++)
					acc[r][c] = fmaf(p, v[c], acc[r][c]);
			}
		}
	}
}

/* Rows 4 ty + r (< T - row0) of acc times mul into g (a [T, hs] slab, row stride gs), columns
 * att_ocol < hs; float4 stores when vec. */
template <int HSP>
__device__ __forceinline__ void att_store(float *g, size_t gs, int row0, int T, int hs,
					  const float (&acc)[4][HSP / 16], float mul, int r, int tx,
					  int ty, int vec)
{
	constexpr int ON = HSP / 16;
	int t = row0 + 4 * ty + r;
	if (t >= T)
		return;
	float *p = g + (size_t)t * gs;
	if (ON >= 4 && vec) {
#pragma unroll
		for (int g4 = 0; g4 < ON / 4; g4++) {
			int col = att_ocol<HSP>(4 * g4, tx);
			if (col < hs)
				*(float4 *)(p + col) =
					make_float4(acc[r][4 * g4] * mul, acc[r][4 * g4 + 1] * mul,
						    acc[r][4 * g4 + 2] * mul, acc[r][4 * g4 + 3] * mul);
		}
	} else {
#pragma unroll
		for (int c = 0; c < ON; c++) {
			int col = att_ocol<HSP>(c, tx);
			if (col < hs)
				p[col] = acc[r][c] * mul;
		}
	}
}

/* ---- forward ------------------------------------------------------------------------------ */

/* One block per (query tile, b, h): out and L (lse [B*NH*T]), and O again into ocopy
 * [B*NH, T, hs] when it is not NULL. */
template <int HSP>
__global__ void __launch_bounds__(ATT_NT)
	k_attn_fwd(float *out, float *lse, float *ocopy, const float *qkv, int B, int T, int NH,
		   int hs, float scale, int vec_in, int vec_out)
{
	constexpr int BK = att_cols(HSP), LD = HSP + 4, LP = BK + 4, RN = BK / 16, ON = HSP / 16;
	CUDA_DYN_SHARED(float4, smv);
	float *Qs = (float *)smv, *Ks = Qs + ATT_BR * LD, *Vs = Ks + BK * LD, *Ps = Vs + BK * LD;
	int BH = B * NH, nqt = (T + ATT_BR - 1) / ATT_BR;
	int qt = nqt - 1 - (int)(blockIdx.x / BH), bh = (int)(blockIdx.x % BH);
	int b = bh / NH, h = bh % NH, ty = threadIdx.x / 16, tx = threadIdx.x % 16;
	size_t C = (size_t)NH * hs;
	const float *base = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
	int q0 = qt * ATT_BR;
	att_load<ATT_BR, HSP>(Qs, base, 3 * C, q0, T, hs, vec_in);
	float m[4], l[4], o[4][ON];
#pragma unroll
	for (int r = 0; r < 4; r++) {
		m[r] = -INFINITY;
		l[r] = 0.0f;
#pragma unroll
		for (int c = 0; c < ON; c++)
			o[r][c] = 0.0f;
	}
	int kend = min(q0 + ATT_BR, T);
	for (int k0 = 0; k0 < kend; k0 += BK) {
		__syncthreads(); /* the last tile's readers of Ks, Vs, Ps are done */
		att_load<BK, HSP>(Ks, base + C, 3 * C, k0, T, hs, vec_in);
		att_load<BK, HSP>(Vs, base + 2 * C, 3 * C, k0, T, hs, vec_in);
		__syncthreads();
		float s[4][RN];
		att_dot<RN, HSP>(s, Qs, Ks, ty, tx);
#pragma unroll
		for (int r = 0; r < 4; r++) {
			int i = q0 + 4 * ty + r;
			float mx = -INFINITY;
#pragma unroll
			for (int c = 0; c < RN; c++) {
				int j = k0 + tx + 16 * c;
				s[r][c] = j <= i && j < T ? s[r][c] * scale : -INFINITY;
				mx = fmaxf(mx, s[r][c]);
			}
			/* finite: key 0 is in every row's first tile */
			float mnew = fmaxf(m[r], att_max16(mx));
			float alpha = expf(m[r] - mnew), rs = 0.0f;
#pragma unroll
			for (int c = 0; c < RN; c++) {
				float p = expf(s[r][c] - mnew);
				Ps[(4 * ty + r) * LP + tx + 16 * c] = p;
				rs += p;
			}
			l[r] = l[r] * alpha + att_sum16(rs);
			m[r] = mnew;
#pragma unroll
			for (int c = 0; c < ON; c++)
				o[r][c] *= alpha;
		}
		__syncthreads();
		att_pv<BK, HSP>(o, Ps, Vs, ty, tx);
	}
	float *ob = out + (size_t)b * T * C + (size_t)h * hs;
#pragma unroll
	for (int r = 0; r < 4; r++) {
		float inv = 1.0f / l[r];
		att_store<HSP>(ob, C, q0, T, hs, o, inv, r, tx, ty, vec_out);
		if (ocopy)
			att_store<HSP>(ocopy + (size_t)bh * T * hs, hs, q0, T, hs, o, inv, r, tx, ty, 0);
		int i = q0 + 4 * ty + r;
		if (tx == 0 && i < T)
			lse[(size_t)bh * T + i] = m[r] + logf(l[r]);
	}
}

/* ---- backward ----------------------------------------------------------------------------- */

/* D[bh*T + t] = dO . O for each row, one warp per row, a fixed shuffle tree. O is [B*NH, T, hs]
 * (o_heads) or [B, T, C] like dout. */
__global__ void k_attn_delta(float *D, const float *dout, const float *O, int o_heads, int B,
			     int T, int NH, int hs)
{
	size_t rows = (size_t)B * NH * T, C = (size_t)NH * hs;
	int lane = threadIdx.x % 32;
	for (size_t r = blockIdx.x * (size_t)(blockDim.x / 32) + threadIdx.x / 32; r < rows;
	     r += (size_t)gridDim.x * (blockDim.x / 32)) {
		size_t t = r % T, bh = r / T, b = bh / NH, h = bh % NH;
		const float *dp = dout + (b * T + t) * C + h * hs;
		const float *op = o_heads ? O + r * hs : O + (b * T + t) * C + h * hs;
		float s = 0.0f;
		for (int d = lane; d < hs; d += 32)
			s = fmaf(dp[d], op[d], s);
		for (int o = 16; o > 0; o >>= 1)
			s += __shfl_xor_sync(0xffffffffu, s, o);
		if (lane == 0)
			D[r] = s;
	}
}

/* One block per (key tile of 64, b, h): dk, dv over the query tiles at or below the diagonal.
 * Thread rows are keys j, columns queries i. */
template <int HSP>
__global__ void __launch_bounds__(ATT_NT)
	k_attn_bwd_dkdv(float *dqkv, const float *qkv, const float *dout, const float *lse,
			const float *D, int B, int T, int NH, int hs, float scale, int vec_in,
			int vec_do, int vec_out)
{
	constexpr int BC = att_cols(HSP), LD = HSP + 4, LP = BC + 4, RN = BC / 16, ON = HSP / 16;
	CUDA_DYN_SHARED(float4, smv);
	float *Ks = (float *)smv, *Vs = Ks + ATT_BR * LD, *Qs = Vs + ATT_BR * LD;
	float *dOs = Qs + BC * LD, *Ps = dOs + BC * LD, *dSs = Ps + ATT_BR * LP;
	float *Ls = dSs + ATT_BR * LP, *Ds = Ls + BC;
	int BH = B * NH, kt = (int)(blockIdx.x / BH), bh = (int)(blockIdx.x % BH);
	int b = bh / NH, h = bh % NH, ty = threadIdx.x / 16, tx = threadIdx.x % 16;
	size_t C = (size_t)NH * hs;
	const float *base = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
	const float *dob = dout + (size_t)b * T * C + (size_t)h * hs;
	int k0 = kt * ATT_BR;
	att_load<ATT_BR, HSP>(Ks, base + C, 3 * C, k0, T, hs, vec_in);
	att_load<ATT_BR, HSP>(Vs, base + 2 * C, 3 * C, k0, T, hs, vec_in);
	float dk[4][ON], dv[4][ON];
#pragma unroll
	for (int r = 0; r < 4; r++)
#pragma unroll
		for (int c = 0; c < ON; c++)
			dk[r][c] = dv[r][c] = 0.0f;
	for (int q0 = k0 / BC * BC; q0 < T; q0 += BC) {
		__syncthreads(); /* the last tile's readers of Qs, dOs, Ps, dSs are done */
		att_load<BC, HSP>(Qs, base, 3 * C, q0, T, hs, vec_in);
		att_load<BC, HSP>(dOs, dob, C, q0, T, hs, vec_do);
		for (int x = threadIdx.x; x < BC; x += ATT_NT) {
			int i = q0 + x;
			Ls[x] = i < T ? lse[(size_t)bh * T + i] : 0.0f;
			Ds[x] = i < T ? D[(size_t)bh * T + i] : 0.0f;
		}
		__syncthreads();
		float s[4][RN], dp[4][RN];
		att_dot<RN, HSP>(s, Ks, Qs, ty, tx);
		att_dot<RN, HSP>(dp, Vs, dOs, ty, tx);
#pragma unroll
		for (int r = 0; r < 4; r++) {
			int j = k0 + 4 * ty + r;
#pragma unroll
			for (int c = 0; c < RN; c++) {
				int x = tx + 16 * c, i = q0 + x;
				float p = i < T && j <= i ? expf(s[r][c] * scale - Ls[x]) : 0.0f;
				Ps[(4 * ty + r) * LP + x] = p;
				dSs[(4 * ty + r) * LP + x] = p * (dp[r][c] - Ds[x]);
			}
		}
		__syncthreads();
		att_pv<BC, HSP>(dv, Ps, dOs, ty, tx);
		att_pv<BC, HSP>(dk, dSs, Qs, ty, tx);
	}
	float *gk = dqkv + (size_t)b * T * 3 * C + (size_t)h * hs + C;
#pragma unroll
	for (int r = 0; r < 4; r++) {
		att_store<HSP>(gk, 3 * C, k0, T, hs, dk, scale, r, tx, ty, vec_out);
		att_store<HSP>(gk + C, 3 * C, k0, T, hs, dv, 1.0f, r, tx, ty, vec_out);
	}
}

/* One block per (query tile of 64, b, h): dq over the key tiles up to the diagonal. */
template <int HSP>
__global__ void __launch_bounds__(ATT_NT)
	k_attn_bwd_dq(float *dqkv, const float *qkv, const float *dout, const float *lse,
		      const float *D, int B, int T, int NH, int hs, float scale, int vec_in,
		      int vec_do, int vec_out)
{
	constexpr int BC = att_cols(HSP), LD = HSP + 4, LP = BC + 4, RN = BC / 16, ON = HSP / 16;
	CUDA_DYN_SHARED(float4, smv);
	float *Qs = (float *)smv, *dOs = Qs + ATT_BR * LD, *Ks = dOs + ATT_BR * LD;
	float *Vs = Ks + BC * LD, *dSs = Vs + BC * LD, *Ls = dSs + ATT_BR * LP, *Ds = Ls + ATT_BR;
	int BH = B * NH, nqt = (T + ATT_BR - 1) / ATT_BR;
	int qt = nqt - 1 - (int)(blockIdx.x / BH), bh = (int)(blockIdx.x % BH);
	int b = bh / NH, h = bh % NH, ty = threadIdx.x / 16, tx = threadIdx.x % 16;
	size_t C = (size_t)NH * hs;
	const float *base = qkv + (size_t)b * T * 3 * C + (size_t)h * hs;
	int q0 = qt * ATT_BR;
	att_load<ATT_BR, HSP>(Qs, base, 3 * C, q0, T, hs, vec_in);
	att_load<ATT_BR, HSP>(dOs, dout + (size_t)b * T * C + (size_t)h * hs, C, q0, T, hs, vec_do);
	for (int x = threadIdx.x; x < ATT_BR; x += ATT_NT) {
		int i = q0 + x;
		Ls[x] = i < T ? lse[(size_t)bh * T + i] : 0.0f;
		Ds[x] = i < T ? D[(size_t)bh * T + i] : 0.0f;
	}
	float dq[4][ON];
#pragma unroll
	for (int r = 0; r < 4; r++)
#pragma unroll
		for (int c = 0; c < ON; c++)
			dq[r][c] = 0.0f;
	int kend = min(q0 + ATT_BR, T);
	for (int k0 = 0; k0 < kend; k0 += BC) {
		__syncthreads(); /* the last tile's readers of Ks, Vs, dSs are done */
		att_load<BC, HSP>(Ks, base + C, 3 * C, k0, T, hs, vec_in);
		att_load<BC, HSP>(Vs, base + 2 * C, 3 * C, k0, T, hs, vec_in);
		__syncthreads();
		float s[4][RN], dp[4][RN];
		att_dot<RN, HSP>(s, Qs, Ks, ty, tx);
		att_dot<RN, HSP>(dp, dOs, Vs, ty, tx);
#pragma unroll
		for (int r = 0; r < 4; r++) {
			int y = 4 * ty + r, i = q0 + y;
#pragma unroll
			for (int c = 0; c < RN; c++) {
				int j = k0 + tx + 16 * c;
				float p = i < T && j <= i ? expf(s[r][c] * scale - Ls[y]) : 0.0f;
				dSs[y * LP + tx + 16 * c] = p * (dp[r][c] - Ds[y]);
			}
		}
		__syncthreads();
		att_pv<BC, HSP>(dq, dSs, Ks, ty, tx);
	}
	float *gq = dqkv + (size_t)b * T * 3 * C + (size_t)h * hs;
#pragma unroll
	for (int r = 0; r < 4; r++)
		att_store<HSP>(gq, 3 * C, q0, T, hs, dq, scale, r, tx, ty, vec_out);
}

/* ---- host side ---------------------------------------------------------------------------- */

/* Dynamic shared memory of each kernel, bytes. */
static constexpr size_t att_fwd_smem(int hsp)
{
	return 4 * (size_t)((ATT_BR + 2 * att_cols(hsp)) * (hsp + 4) + ATT_BR * (att_cols(hsp) + 4));
}
static constexpr size_t att_bwd_smem(int hsp)
{
	return 4 * (size_t)((2 * ATT_BR + 2 * att_cols(hsp)) * (hsp + 4) +
			    ATT_BR * (att_cols(hsp) + 4) + 2 * ATT_BR);
}
static constexpr size_t att_dkdv_smem(int hsp)
{
	return att_bwd_smem(hsp) + 4 * (size_t)ATT_BR * (att_cols(hsp) + 4);
}

static int att_aligned(const void *p, int hs)
{
	return hs % 4 == 0 && (uintptr_t)p % 16 == 0;
}

int cuda_attention_fused_fits(int T, int C, int NH)
{
	(void)T;
	return NH > 0 && C % NH == 0 && C / NH >= 1 && C / NH <= 128;
}

template <int HSP>
static int att_forward(struct cuda_ctx *c, float *out, float *lse, float *ocopy,
		       const float *qkv, int B, int T, int NH, int hs)
{
	constexpr size_t smem = att_fwd_smem(HSP);
	CUDA_TRY(cudaFuncSetAttribute((k_attn_fwd<HSP>), cudaFuncAttributeMaxDynamicSharedMemorySize,
				      (int)smem),
		 "attention_forward: shared memory");
	unsigned grid = (unsigned)((T + ATT_BR - 1) / ATT_BR * B * NH);
	CUDA_LAUNCH((k_attn_fwd<HSP>), grid, ATT_NT, smem, c->stream, out, lse, ocopy, qkv, B, T,
		    NH, hs, 1.0f / sqrtf((float)hs), att_aligned(qkv, hs), att_aligned(out, hs));
	CUDA_LAUNCHED("attention_forward");
	return 0;
}

template <int HSP>
static int att_backward(struct cuda_ctx *c, float *dqkv, const float *dout, const float *qkv,
			const float *lse, const float *D, int B, int T, int NH, int hs)
{
	constexpr size_t s1 = att_dkdv_smem(HSP), s2 = att_bwd_smem(HSP);
	CUDA_TRY(cudaFuncSetAttribute((k_attn_bwd_dkdv<HSP>),
				      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s1),
		 "attention_backward: shared memory");
	CUDA_TRY(cudaFuncSetAttribute((k_attn_bwd_dq<HSP>),
				      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s2),
		 "attention_backward: shared memory");
	unsigned grid = (unsigned)((T + ATT_BR - 1) / ATT_BR * B * NH);
	float scale = 1.0f / sqrtf((float)hs);
	int vi = att_aligned(qkv, hs), vd = att_aligned(dout, hs), vo = att_aligned(dqkv, hs);
	CUDA_LAUNCH((k_attn_bwd_dkdv<HSP>), grid, ATT_NT, s1, c->stream, dqkv, qkv, dout, lse, D, B,
		    T, NH, hs, scale, vi, vd, vo);
	CUDA_LAUNCHED("attention_backward");
	CUDA_LAUNCH((k_attn_bwd_dq<HSP>), grid, ATT_NT, s2, c->stream, dqkv, qkv, dout, lse, D, B,
		    T, NH, hs, scale, vi, vd, vo);
	CUDA_LAUNCHED("attention_backward");
	return 0;
}

static int att_forward_hs(struct cuda_ctx *c, float *out, float *lse, float *ocopy,
			  const float *qkv, int B, int T, int NH, int hs)
{
	if (hs <= 16)
		return att_forward<16>(c, out, lse, ocopy, qkv, B, T, NH, hs);
	if (hs <= 32)
		return att_forward<32>(c, out, lse, ocopy, qkv, B, T, NH, hs);
	if (hs <= 64)
		return att_forward<64>(c, out, lse, ocopy, qkv, B, T, NH, hs);
	return att_forward<128>(c, out, lse, ocopy, qkv, B, T, NH, hs);
}

int cuda_attention_fused_forward(struct backend *be, float *out, float *att, const float *qkv,
				 int B, int T, int C, int NH)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	int hs = C / NH;
	if ((size_t)B * T * C == 0)
		return 0;
	float *ocopy = T > hs ? att + (size_t)B * NH * T : NULL;
	return att_forward_hs(c, out, att, ocopy, qkv, B, T, NH, hs);
}

int cuda_attention_fused_backward(struct backend *be, float *dqkv, const float *dout,
				  const float *qkv, const float *att, int B, int T, int C, int NH)
{
	struct cuda_ctx *c = cuda_ctx_of(be);
	int hs = C / NH;
	size_t rows = (size_t)B * NH * T, n = (size_t)B * T * C;
	if (!n)
		return 0;
	int keep_o = T > hs;
	void *ws;
	ERR_FORWARD(cuda_workspace(c, cuda_ws_round(4 * rows) +
					      (keep_o ? 0 : cuda_ws_round(4 * n) + cuda_ws_round(4 * rows)),
				  &ws));
	char *p = (char *)ws;
	float *D = (float *)cuda_ws_take(&p, 4 * rows);
	const float *O = att + rows;
	if (!keep_o) { /* O did not fit in att: the forward again, into workspace */
		float *o = (float *)cuda_ws_take(&p, 4 * n), *l = (float *)cuda_ws_take(&p, 4 * rows);
		ERR_FORWARD(att_forward_hs(c, o, l, NULL, qkv, B, T, NH, hs));
		O = o;
	}
	unsigned g = (unsigned)(rows / 8 + 1), cap = (unsigned)c->sms * 16;
	CUDA_LAUNCH(k_attn_delta, g < cap ? g : cap, 256, 0, c->stream, D, dout, O, keep_o, B, T,
		    NH, hs);
	CUDA_LAUNCHED("attention_backward");
	if (hs <= 16)
		return att_backward<16>(c, dqkv, dout, qkv, att, D, B, T, NH, hs);
	if (hs <= 32)
		return att_backward<32>(c, dqkv, dout, qkv, att, D, B, T, NH, hs);
	if (hs <= 64)
		return att_backward<64>(c, dqkv, dout, qkv, att, D, B, T, NH, hs);
	return att_backward<128>(c, dqkv, dout, qkv, att, D, B, T, NH, hs);
}
