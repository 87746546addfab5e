/* test_rng.c - Philox4x32-10 against the known-answer vectors of Random123 (kat_vectors, the
 * generator of Salmon et al., SC'11), then the derived draws against their definitions and
 * statistical bounds, and rng_fill_normal against the thread count.
 *
 * How lib/rng.c maps our arguments onto Philox's words (checked by the vectors below):
 *   counter = {index & 0xffffffff, index >> 32, stream & 0xffffffff, stream >> 32}
 *   key     = {seed & 0xffffffff, seed >> 32}
 *   out[0..3] = the four output words in Random123's order.
 * So a kat_vectors line "philox4x32 10 c0 c1 c2 c3 k0 k1 -> r0 r1 r2 r3" is
 * rng_philox(seed = k1:k0, stream = c3:c2, index = c1:c0) == {r0, r1, r2, r3}.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/rng.h"
#include "common/banned.h"

TestSuite(rng, .timeout = 20);

static uint64_t w64(uint32_t hi, uint32_t lo) { return (uint64_t)hi << 32 | lo; }

static void kat(const uint32_t ctr[4], const uint32_t key[2], const uint32_t want[4])
{
	uint32_t out[4];
	rng_philox(w64(key[1], key[0]), w64(ctr[3], ctr[2]), w64(ctr[1], ctr[0]), out);
	for (int i = 0; i < 4; i++)
		cr_assert_eq(out[i], want[i],
			     "ctr %08x %08x %08x %08x key %08x %08x: word %d is %08x, "
			     "expected %08x",
			     ctr[0], ctr[1], ctr[2], ctr[3], key[0], key[1], i, out[i], want[i]);
}

Test(rng, philox_known_answers)
{
	/* Random123 kat_vectors, philox4x32 10: counter, key, expected output. */
	kat((uint32_t[]){0, 0, 0, 0}, (uint32_t[]){0, 0},
	    (uint32_t[]){0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
	kat((uint32_t[]){0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
	    (uint32_t[]){0xffffffff, 0xffffffff},
	    (uint32_t[]){0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
	kat((uint32_t[]){0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
	    (uint32_t[]){0xa4093822, 0x299f31d0},
	    (uint32_t[]){0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

Test(rng, derived_draws_follow_their_definitions)
{
	for (uint64_t i = 0; i < 1000; i++) {
		uint32_t w[4];
		uint64_t seed = 1234567 + i * 77, idx = i * 0x9e3779b97f4a7c15ull;
		rng_philox(seed, RNG_STREAM_TEST, idx, w);
		cr_assert_eq(rng_u64(seed, RNG_STREAM_TEST, idx), (uint64_t)w[0] << 32 | w[1],
			     "rng_u64 seed %llu index %llu", (unsigned long long)seed,
			     (unsigned long long)idx);
		cr_assert_eq(rng_uniform(seed, RNG_STREAM_TEST, idx),
			     (float)(w[0] >> 8) / 16777216.0f, "rng_uniform index %llu",
			     (unsigned long long)idx);
		/* Box-Muller in double from the same two words, u1 in (0,1]. */
		double u1 = ((double)w[0] + 1.0) / 4294967296.0, u2 = (double)w[1] / 4294967296.0;
		double z = sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
		float got = rng_normal(seed, RNG_STREAM_TEST, idx);
		cr_assert(fabs((double)got - z) <= 1e-6 * (1.0 + fabs(z)),
			  "rng_normal index %llu = %.9g, expected %.9g", (unsigned long long)idx,
			  (double)got, z);
	}
	/* Different streams and seeds give different words. */
	cr_assert_neq(rng_u64(1, 1, 0), rng_u64(1, 2, 0));
	cr_assert_neq(rng_u64(1, 1, 0), rng_u64(2, 1, 0));
	cr_assert_neq(rng_u64(1, 1, 0), rng_u64(1, 1, 1));
}

Test(rng, uniform_range_and_moments)
{
	const int n = 100000;
	double sum = 0, sum2 = 0;
	float lo = 1, hi = 0;

	for (int i = 0; i < n; i++) {
		float u = rng_uniform(42, RNG_STREAM_TEST, (uint64_t)i);
		cr_assert(u >= 0.0f && u < 1.0f, "draw %d = %.9g outside [0,1)", i, (double)u);
		lo = u < lo ? u : lo;
		hi = u > hi ? u : hi;
		sum += u;
		sum2 += (double)u * u;
	}
	double mean = sum / n, var = sum2 / n - mean * mean;
	/* Mean 1/2 with standard error sqrt(1/12/n) = 0.0009; allow 5 standard errors. */
	cr_assert(fabs(mean - 0.5) < 5 * sqrt(1.0 / 12 / n), "mean %.6f over %d draws", mean, n);
	cr_assert(fabs(var - 1.0 / 12) < 0.002, "variance %.6f, expected 1/12", var);
	cr_assert(lo < 1e-3 && hi > 1 - 1e-3, "range [%g, %g] not filled", (double)lo, (double)hi);
	/* The largest possible value, (2^24 - 1) / 2^24, is still below 1 in float. */
	cr_assert((float)((1u << 24) - 1) * (1.0f / 16777216.0f) < 1.0f);
}

Test(rng, below_is_in_range_and_even)
{
	const int n = 100000, k = 10;
	int count[10] = {0};

	for (int i = 0; i < n; i++) {
		uint64_t v = rng_below(9, RNG_STREAM_TEST, (uint64_t)i, (uint64_t)k);
		cr_assert(v < (uint64_t)k, "draw %d = %llu", i, (unsigned long long)v);
		count[v]++;
		cr_assert_eq(rng_below(9, RNG_STREAM_TEST, (uint64_t)i, 1), 0);
	}
	/* Each bucket: n/k = 10000 expected, sd sqrt(n p (1-p)) = 95; allow 5 sd. */
	for (int b = 0; b < k; b++)
		cr_assert(abs(count[b] - n / k) < 5 * 95, "bucket %d has %d of %d", b, count[b], n);
}

Test(rng, normal_mean_variance_and_tails)
{
	const int n = 100000;
	double sum = 0, sum2 = 0;
	int tail = 0;

	for (int i = 0; i < n; i++) {
		double z = rng_normal(2024, RNG_STREAM_TEST, (uint64_t)i);
		cr_assert(isfinite(z), "draw %d not finite", i);
		sum += z;
		sum2 += z * z;
		tail += fabs(z) > 2.0;
	}
	double mean = sum / n, var = sum2 / n - mean * mean, ptail = (double)tail / n;
	/* Standard errors: mean 1/sqrt(n) = 0.0032, variance sqrt(2/n) = 0.0045, P(|z|>2) =
	 * 0.0455 with sqrt(p(1-p)/n) = 0.00066. Five of each. */
	cr_assert(fabs(mean) < 5 / sqrt(n), "mean %.5f over %d draws", mean, n);
	cr_assert(fabs(var - 1) < 5 * sqrt(2.0 / n), "variance %.5f over %d draws", var, n);
	cr_assert(fabs(ptail - 0.0455) < 5 * 0.00066, "P(|z|>2) = %.5f, expected 0.0455", ptail);
}

Test(rng, fill_normal_independent_of_thread_count)
{
	const int64_t n = 100003; /* not a multiple of any thread count used */
	float *ref = malloc(sizeof *ref * (size_t)n), *x = malloc(sizeof *x * (size_t)n);
	const uint64_t base = 5000000000ull; /* above 2^32: the index's high word matters */

	cr_assert(ref && x);
	for (int64_t i = 0; i < n; i++)
		ref[i] = 0.5f + 0.02f * rng_normal(77, RNG_STREAM_INIT, base + (uint64_t)i);
	int threads[] = {1, 2, 3, 8};
	for (int t = 0; t < 4; t++) {
		omp_set_num_threads(threads[t]);
		memset(x, 0, sizeof *x * (size_t)n);
		rng_fill_normal(x, n, 0.5f, 0.02f, 77, RNG_STREAM_INIT, base);
		for (int64_t i = 0; i < n; i++)
			cr_assert(x[i] == ref[i], "%d threads: element %lld = %.9g, expected %.9g",
				  threads[t], (long long)i, (double)x[i], (double)ref[i]);
	}
	free(ref);
	free(x);
}
