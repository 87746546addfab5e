/* rng.c - Philox4x32-10; constants from Salmon et al., "Parallel random numbers: as easy as
 * 1, 2, 3" (SC'11), the same generator as curand's and numpy's Philox. */
#include "common/rng.h"

#include <math.h>

#include "common/banned.h"

#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

void rng_philox(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4])
{
	uint32_t c0 = (uint32_t)index, c1 = (uint32_t)(index >> 32);
	uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
	uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);

	for (int r = 0; r < 10; r++) {
		uint64_t p0 = (uint64_t)PHILOX_M0 * c0;
		uint64_t p1 = (uint64_t)PHILOX_M1 * c2;
		uint32_t n0 = (uint32_t)(p1 >> 32) ^ c1 ^ k0;
		uint32_t n2 = (uint32_t)(p0 >> 32) ^ c3 ^ k1;
		c0 = n0;
		c1 = (uint32_t)p1;
		c2 = n2;
		c3 = (uint32_t)p0;
		k0 += PHILOX_W0;
		k1 += PHILOX_W1;
	}
	out[0] = c0;
	out[1] = c1;
	out[2] = c2;
	out[3] = c3;
}

uint64_t rng_u64(uint64_t seed, uint64_t stream, uint64_t index)
{
	uint32_t w[4];
	rng_philox(seed, stream, index, w);
	return (uint64_t)w[0] << 32 | w[1];
}

float rng_uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
	uint32_t w[4];
	rng_philox(seed, stream, index, w);
	return (float)(w[0] >> 8) * (1.0f / 16777216.0f);
}

uint64_t rng_below(uint64_t seed, uint64_t stream, uint64_t index, uint64_t n)
{
	/* Lemire's multiply-shift on a 64-bit draw: bias below 2^-32 for n < 2^32. */
	return (uint64_t)(((unsigned __int128)rng_u64(seed, stream, index) * n) >> 64);
}

float rng_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
	uint32_t w[4];
	rng_philox(seed, stream, index, w);
	/* u1 in (0, 1] so the log is finite. */
	double u1 = ((double)w[0] + 1.0) / 4294967296.0;
	double u2 = (double)w[1] / 4294967296.0;
	return (float)(sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2));
}

void rng_fill_normal(float *x, int64_t n, float mean, float std, uint64_t seed, uint64_t stream,
		     uint64_t base)
{
#pragma omp parallel for schedule(static)
	for (int64_t i = 0; i < n; i++)
		x[i] = mean + std * rng_normal(seed, stream, base + (uint64_t)i);
}
