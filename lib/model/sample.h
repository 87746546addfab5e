/* sample.h - drawing the next token from a model's logits: temperature, top-k and top-p
 * (nucleus) sampling, as Hugging Face's generate() and llm.c's sampler do, with the uniform
 * draw given by the caller (counter-based: rng_uniform(seed, RNG_STREAM_SAMPLE, i)), so a
 * seed fixes the text.
 */
#ifndef CORE_SAMPLE_H
#define CORE_SAMPLE_H

struct sample_opts {
	double temperature; /* 0: greedy (the largest logit, the lowest index on ties) */
	int top_k;          /* keep the k most likely tokens; 0 keeps all */
	double top_p;       /* then the fewest most likely whose probability reaches p; 1 all */
};

/* The token drawn from logits [V] with u in [0, 1): the probabilities softmax(logits / T)
 * in double, sorted by decreasing probability (ties: lower index first), cut to top_k, then
 * to the shortest prefix whose mass reaches top_p of what is left, renormalised; the token
 * is the first whose cumulative mass exceeds u times the kept mass. work: V ints. */
int sample_token(const float *logits, int V, const struct sample_opts *o, double u, int *work);

#endif
