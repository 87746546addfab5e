/* test_gpt2_decode.c - incremental decoding with the key/value cache (gpt2_decoder) against
 * the full forward: feeding a sequence one token at a time gives, at every position, the
 * logits a full forward over the sequence gives at that position (1e-5 of the largest logit),
 * on cpu and on ref, for a model with several layers and heads and a context that the
 * sequence fills completely. A reset decoder gives the same logits again; a token outside
 * the vocabulary and a step past the context are refused.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "common/err.h"
#include "common/rng.h"
#include "model/gpt2.h"

TestSuite(gpt2_decode, .timeout = 60);

static void decode_matches_forward(const char *device)
{
	struct backend *be;
	struct gpt2 g;
	struct gpt2_decoder d;
	/* T = 24 positions, 3 layers, 4 heads of 5, a vocabulary of 37: nothing a multiple of
	 * a vector width */
	const struct model_config m = {.n_layer = 3, .n_embd = 20, .n_head = 4, .seq_len = 24,
				       .vocab_size = 37};
	const int T = m.seq_len, V = m.vocab_size;

	cr_assert_eq(backend_open(&be, device, &(struct backend_params){.threads = 2}), 0);
	cr_assert_eq(gpt2_create_forward(&g, &m, 1, T, be), 0, "%s", err_detail());
	cr_assert_eq(gpt2_init_params(&g, 5), 0);
	int32_t tok[24];
	for (int i = 0; i < T; i++)
		tok[i] = (int32_t)rng_below(3, RNG_STREAM_TEST, (uint64_t)i, (uint64_t)V);
	float *full = malloc(sizeof(float) * (size_t)T * V), *step = malloc(sizeof(float) * V);
	cr_assert(full && step);
	cr_assert_eq(gpt2_forward_logits(&g, tok, 1, T, full), 0, "%s", err_detail());

	cr_assert_eq(gpt2_decoder_open(&d, &g), 0, "%s", err_detail());
	for (int round = 0; round < 2; round++) {
		double worst = 0.0;
		for (int t = 0; t < T; t++) {
			cr_assert_eq(gpt2_decoder_step(&d, tok[t], step), 0, "%s: step %d: %s",
				     device, t, err_detail());
			double mx = 0.0, err = 0.0;
			for (int v = 0; v < V; v++) {
				double want = full[(size_t)t * V + v];
				mx = fabs(want) > mx ? fabs(want) : mx;
				double e = fabs((double)step[v] - want);
				err = e > err || isnan(e) ? e : err;
			}
			cr_assert(err <= 1e-5 * (mx > 1.0 ? mx : 1.0),
				  "%s: position %d: logits differ by %g (largest %g)", device, t, err,
				  mx);
			worst = err > worst ? err : worst;
		}
		cr_log_info("%s: round %d: largest logit difference %g", device, round, worst);
		/* the context is full now */
		cr_assert_eq(gpt2_decoder_step(&d, tok[0], step), CORE_EUSAGE);
		gpt2_decoder_reset(&d);
	}
	cr_assert_eq(gpt2_decoder_step(&d, V, step), CORE_EUSAGE, "a token outside the vocabulary");
	gpt2_decoder_close(&d);
	gpt2_free(&g);
	free(full);
	free(step);
	backend_close(be);
}

Test(gpt2_decode, cache_gives_the_full_forwards_logits_on_cpu)
{
	decode_matches_forward("cpu");
}

Test(gpt2_decode, cache_gives_the_full_forwards_logits_on_ref)
{
	decode_matches_forward("ref");
}
