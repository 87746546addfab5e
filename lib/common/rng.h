/* rng.h - seeded, counter-based random numbers (Philox4x32-10, Salmon et al., SC'11).
 *
 * A draw is a pure function of (seed, stream, index): no state, so the numbers a loop gets
 * do not depend on how OpenMP splits it, and a resumed run draws what the straight run
 * would have drawn. Give each use its own stream constant (RNG_STREAM_*), and index the draws
 * by what they are for (element number, step * B + row, ...).
 */
#ifndef CORE_RNG_H
#define CORE_RNG_H

#include <stdint.h>

enum rng_stream {
	RNG_STREAM_INIT = 1,    /* parameter initialisation */
	RNG_STREAM_BATCH = 2,   /* training batch sampling */
	RNG_STREAM_EVAL = 3,    /* evaluation batch sampling */
	RNG_STREAM_SPLIT = 4,   /* corpus validation / router split */
	RNG_STREAM_NOISE = 5,   /* MoE gate noise */
	RNG_STREAM_SHARD = 6,   /* documents to random shards */
	RNG_STREAM_KMEANS = 7,  /* k-means++ initialisation */
	RNG_STREAM_HOLDOUT = 8, /* rows held out when fitting a router */
	RNG_STREAM_BASELINE = 9, /* shuffles of the random-shards baseline of a routing report */
	RNG_STREAM_SAMPLE = 10, /* drawing tokens when sampling text */
	RNG_STREAM_PATHS = 11,  /* the order in which a run cycles through its paths
				 * (dipaco.paths_per_phase, pathsample.h) */
	RNG_STREAM_TEST = 100   /* tests and benchmarks */
};

/* Four independent 32-bit words for counter (stream, index) under key seed. */
void rng_philox(uint64_t seed, uint64_t stream, uint64_t index, uint32_t out[4]);
/* 64 random bits. */
uint64_t rng_u64(uint64_t seed, uint64_t stream, uint64_t index);
/* Uniform in [0, 1) with 24 random bits (exactly representable in float). */
float rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);
/* Uniform integer in [0, n), n > 0, without modulo bias worth measuring (64-bit draw). */
uint64_t rng_below(uint64_t seed, uint64_t stream, uint64_t index, uint64_t n);
/* Standard normal (Box-Muller on one Philox block). */
float rng_normal(uint64_t seed, uint64_t stream, uint64_t index);
/* Fill x[0..n) with mean + std * N(0,1), draw i at index base + i; OpenMP-parallel. */
void rng_fill_normal(float *x, int64_t n, float mean, float std, uint64_t seed, uint64_t stream,
		     uint64_t base);

#endif
