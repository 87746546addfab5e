/* test_pathsample.c - the draw of paths per phase (dipaco.paths_per_phase, pathsample.h),
 * checked against its stated guarantee by brute force over the phases, not against its own
 * formula: each phase N distinct paths in range; every window of ceil(P/N) consecutive
 * phases holds every path; each path trained floor or ceil of tN/P times after t phases;
 * pathsample_last against a backward search of pathsample_phase's lists; the same seed the
 * same draw, another seed another one. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "dipaco/pathsample.h"
#include "testutil.h"

#define PHASES 40

/* The draw's lists, phase by phase: sets[t][p] = 1 when phase t + 1 trains p. */
static char *draw_sets(const struct path_sample *s, long phases)
{
	char *sets = calloc((size_t)phases * (size_t)s->P, 1);
	int *ids = malloc(sizeof *ids * (size_t)s->P);

	cr_assert(sets && ids);
	for (long t = 1; t <= phases; t++) {
		int n = pathsample_phase(s, t, ids);
		cr_assert_eq(n, s->N, "P %d N %d phase %ld: %d paths", s->P, s->N, t, n);
		for (int i = 0; i < n; i++) {
			cr_assert(ids[i] >= 0 && ids[i] < s->P, "phase %ld: path %d", t, ids[i]);
			cr_assert(i == 0 || ids[i] > ids[i - 1], "phase %ld: not ascending and "
				  "distinct", t);
			sets[(size_t)(t - 1) * s->P + ids[i]] = 1;
		}
		for (int p = 0; p < s->P; p++)
			cr_assert_eq(pathsample_trains(s, t, p), sets[(size_t)(t - 1) * s->P + p],
				     "phase %ld path %d: trains() and phase() disagree", t, p);
	}
	free(ids);
	return sets;
}

static void check_guarantee(int P, int N, uint64_t seed)
{
	struct path_sample s;
	const int E = (P + N - 1) / N;

	cr_assert_eq(pathsample_init(&s, P, N, seed, PHASES), 0, "%s", err_detail());
	char *sets = draw_sets(&s, PHASES);
	for (long a = 1; a + E - 1 <= PHASES; a++)
		for (int p = 0; p < P; p++) {
			int seen = 0;
			for (long t = a; t < a + E; t++)
				seen |= sets[(size_t)(t - 1) * P + p];
			cr_assert(seen, "P %d N %d seed %llu: path %d not in phases %ld..%ld", P, N,
				  (unsigned long long)seed, p, a, a + E - 1);
		}
	for (int p = 0; p < P; p++) {
		long count = 0, last = 0;
		for (long t = 1; t <= PHASES; t++) {
			cr_assert_eq(pathsample_last(&s, t, p), last, "P %d N %d: last of path %d "
				     "before phase %ld", P, N, p, t);
			if (sets[(size_t)(t - 1) * P + p]) {
				count++;
				last = t;
			}
			long lo = t * N / P, hi = (t * N + P - 1) / P;
			cr_assert(count >= lo && count <= hi, "P %d N %d: path %d trained %ld times "
				  "in %ld phases, not in [%ld, %ld]", P, N, p, count, t, lo, hi);
		}
	}
	/* the same seed, the same draw */
	struct path_sample again;
	cr_assert_eq(pathsample_init(&again, P, N, seed, PHASES), 0);
	char *sets2 = draw_sets(&again, PHASES);
	cr_expect_eq(memcmp(sets, sets2, (size_t)PHASES * P), 0, "P %d N %d: not reproducible",
		     P, N);
	free(sets);
	free(sets2);
	pathsample_free(&s);
	pathsample_free(&again);
}

Test(pathsample, guarantee_for_several_shapes_and_seeds)
{
	static const int shapes[][2] = {{8, 4}, {8, 3}, {8, 1}, {8, 7}, {7, 2}, {5, 5}, {2, 1},
					{16, 5}, {64, 12}, {3, 2}, {256, 16}};
	static const uint64_t seeds[] = {0, 1, 5, 123456789, UINT64_MAX};

	for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
		for (size_t k = 0; k < sizeof seeds / sizeof seeds[0]; k++)
			check_guarantee(shapes[i][0], shapes[i][1], seeds[k]);
}

/* The seed matters: over 20 seeds, 8 paths 4 at a time draw more than one first phase. */
Test(pathsample, seeds_give_different_draws)
{
	char first[20][8];
	int distinct = 0;

	for (int k = 0; k < 20; k++) {
		struct path_sample s;
		cr_assert_eq(pathsample_init(&s, 8, 4, (uint64_t)k, 4), 0);
		for (int p = 0; p < 8; p++)
			first[k][p] = (char)pathsample_trains(&s, 1, p);
		pathsample_free(&s);
		int seen = 0;
		for (int j = 0; j < k && !seen; j++)
			seen = !memcmp(first[j], first[k], 8);
		distinct += !seen;
	}
	cr_expect_geq(distinct, 5, "only %d distinct first phases in 20 seeds", distinct);
}

/* Without sampling (N 0 or P) every path trains in every phase, and its own latest
 * checkpoint is that of phase t-1; N out of range is refused. */
Test(pathsample, every_path_without_sampling)
{
	for (int N = 0; N <= 6; N += 6) {
		struct path_sample s;
		cr_assert_eq(pathsample_init(&s, 6, N, 9, 3), 0);
		cr_expect(pathsample_all(&s));
		for (long t = 1; t <= 5; t++)
			for (int p = 0; p < 6; p++) {
				cr_expect(pathsample_trains(&s, t, p));
				cr_expect_eq(pathsample_last(&s, t, p), t - 1);
			}
		pathsample_free(&s);
	}
	struct path_sample s;
	cr_expect_eq(pathsample_init(&s, 6, 7, 9, 3), CORE_EUSAGE);
	cr_expect_eq(pathsample_init(&s, 6, -1, 9, 3), CORE_EUSAGE);
}

/* The record: JSON whose phases are the lists of pathsample_phase (read back by hand). */
Test(pathsample, record_lists_the_phases)
{
	struct path_sample s;
	char *text;
	size_t len;
	int ids[8];

	cr_assert_eq(pathsample_init(&s, 8, 3, 5, 3), 0);
	cr_assert_eq(pathsample_text(&s, &text, &len), 0);
	cr_expect_eq(strlen(text), len);
	const char *head = "{\"paths\": 8, \"paths_per_phase\": 3, \"seed\": 5,\n \"order\": [";
	cr_expect(!strncmp(text, head, strlen(head)), "%s", text);
	const char *p = strstr(text, "\"phases\": [");
	cr_assert(p, "%s", text);
	p += strlen("\"phases\": [");
	for (long t = 1; t <= 3; t++) {
		int n = pathsample_phase(&s, t, ids), a, b, c;
		cr_assert_eq(n, 3);
		p = strchr(p, '[');
		cr_assert(p && sscanf(p, "[%d, %d, %d]", &a, &b, &c) == 3, "phase %ld: %s", t, text);
		cr_expect(a == ids[0] && b == ids[1] && c == ids[2], "phase %ld: %s", t, text);
		p++;
	}
	free(text);
	pathsample_free(&s);
}
