/* pathsample.c - the phases' draws of paths; see pathsample.h for the draw and its guarantee. */
#include "dipaco/pathsample.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/rng.h"
#include "common/banned.h"

int pathsample_init(struct path_sample *s, int P, int N, uint64_t seed, long phases)
{
	memset(s, 0, sizeof *s);
	if (P < 1 || N < 0 || N > P)
		return err_set(CORE_EUSAGE, NULL, "cannot train %d of %d paths per phase", N, P);
	s->P = P;
	s->N = N == 0 ? P : N;
	s->phases = phases;
	s->seed = seed;
	if (s->N == P)
		return 0;
	s->order = malloc(sizeof *s->order * (size_t)P);
	s->pos = malloc(sizeof *s->pos * (size_t)P);
	if (!s->order || !s->pos) {
		pathsample_free(s);
		return err_set(CORE_ENOMEM, NULL, "out of memory");
	}
	for (int i = 0; i < P; i++)
		s->order[i] = i;
	for (int i = P - 1; i > 0; i--) {
		int j = (int)rng_below(seed, RNG_STREAM_PATHS, (uint64_t)i, (uint64_t)i + 1);
		int x = s->order[i];
		s->order[i] = s->order[j];
		s->order[j] = x;
	}
	for (int i = 0; i < P; i++)
		s->pos[s->order[i]] = i;
	return 0;
}

void pathsample_free(struct path_sample *s)
{
	free(s->order);
	free(s->pos);
	s->order = s->pos = NULL;
}

/* Where phase t's window starts on the cycle: (t-1) N mod P, without overflow. */
static int phase_start(const struct path_sample *s, long t)
{
	return (int)((long long)((t - 1) % s->P) * s->N % s->P);
}

int pathsample_trains(const struct path_sample *s, long t, int p)
{
	if (pathsample_all(s))
		return 1;
	return ((s->pos[p] - phase_start(s, t)) % s->P + s->P) % s->P < s->N;
}

long pathsample_last(const struct path_sample *s, long t, int p)
{
	/* Within ceil(P/N) phases back, by the guarantee; the loop needs no other bound. */
	for (long u = t - 1; u >= 1; u--)
		if (pathsample_trains(s, u, p))
			return u;
	return 0;
}

int pathsample_phase(const struct path_sample *s, long t, int *out)
{
	int n = 0;

	for (int p = 0; p < s->P; p++)
		if (pathsample_trains(s, t, p))
			out[n++] = p;
	return n;
}

int pathsample_text(const struct path_sample *s, char **out, size_t *len)
{
	char *text = NULL;
	size_t n = 0;
	FILE *fp = open_memstream(&text, &n);

	*out = NULL;
	if (!fp)
		return err_set(CORE_ENOMEM, NULL, "out of memory");
	fprintf(fp, "{\"paths\": %d, \"paths_per_phase\": %d, \"seed\": %" PRIu64 ",\n \"order\": [",
		s->P, s->N, s->seed);
	for (int i = 0; i < s->P; i++)
		fprintf(fp, "%s%d", i ? ", " : "", s->order ? s->order[i] : i);
	fprintf(fp, "],\n \"phases\": [");
	for (long t = 1; t <= s->phases; t++) {
		fprintf(fp, "%s\n  [", t > 1 ? "," : "");
		for (int p = 0, k = 0; p < s->P; p++)
			if (pathsample_trains(s, t, p))
				fprintf(fp, "%s%d", k++ ? ", " : "", p);
		fputc(']', fp);
	}
	fprintf(fp, "]}\n");
	int bad = ferror(fp);
	if (fclose(fp) != 0 || bad) {
		free(text);
		return err_set(CORE_ENOMEM, NULL, "out of memory");
	}
	*out = text;
	*len = n;
	return 0;
}
