/* fuzz_spm.c - a SentencePiece model file as tokenizer_open("spm:PATH") reads it (the model
 * through Debian's libsentencepiece, its digest), then as tokenizer_hf_write reads its settings
 * out of the protocol buffer by hand and writes tokenizer.json (lib/io/tokenizer_hf.c).
 *
 * A failure must keep the error contract naming the input. An accepted model must have a
 * vocabulary, encode a fixed text into ids below it and decode them; its export either fails
 * within the contract (a model it cannot express: CORE_EUNSUPPORTED naming the input) or
 * writes a tokenizer.json that parses as JSON with one vocabulary entry per piece, and a
 * tokenizer.model equal to the input. In a build without SentencePiece every input is the one
 * CORE_EUNSUPPORTED. Seeds: corpus/spm (models of dpc-shard tokenizer train, unigram and BPE). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "harness.h"
#include "common/err.h"
#include "io/tokenizer.h"
#include "io/tokenizer_hf.h"
#include "common/banned.h"

static void check_export(const struct tokenizer *tk, const char *path, const uint8_t *data,
			 size_t size)
{
	const char *dir = fuzz_path("hf");
	char file[4096];

	mkdir(dir, 0700);
	int rc = tokenizer_hf_write(tk, dir, 64);
	if (rc < 0) {
		if (rc == CORE_EUNSUPPORTED || rc == CORE_EFORMAT)
			fuzz_check_error("tokenizer_hf_write", rc, path);
		else
			fuzz_check_error("tokenizer_hf_write", rc, NULL);
		return;
	}
	snprintf(file, sizeof file, "%s/tokenizer.json", dir);
	json_error_t je;
	json_t *j = json_load_file(file, 0, &je);
	if (!j)
		fuzz_fail("tokenizer.json does not parse: %s", je.text);
	const json_t *vocab = json_object_get(json_object_get(j, "model"), "vocab");
	const size_t n = json_is_array(vocab) ? json_array_size(vocab) : json_object_size(vocab);
	if (n != tokenizer_vocab(tk))
		fuzz_fail("tokenizer.json has %zu pieces, the model %u", n, tokenizer_vocab(tk));
	json_decref(j);
	snprintf(file, sizeof file, "%s/tokenizer.model", dir);
	FILE *f = fopen(file, "rb");
	if (!f)
		fuzz_fail("no tokenizer.model");
	uint8_t *copy = malloc(size + 1);
	size_t got = copy ? fread(copy, 1, size + 1, f) : 0;
	fclose(f);
	if (got != size || memcmp(copy, data, size) != 0)
		fuzz_fail("tokenizer.model is not the model file");
	free(copy);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char text[] = "The jury said  it\tdid.\nCaf\xc3\xa9 \xe6\x97\xa5\xf0\x9f\x98\x80 1961";
	const char *path = fuzz_write("in.model", data, size);
	char spec[4200];
	struct tokenizer *tk = NULL;

	snprintf(spec, sizeof spec, "spm:%s", path);
	int rc = tokenizer_open(&tk, spec);
	if (rc < 0) {
		fuzz_check_error("tokenizer_open", rc, path);
		return 0;
	}
	const uint32_t V = tokenizer_vocab(tk);
	if (V < 1 || tokenizer_get_id(tk).kind != TOKENIZER_SPM)
		fuzz_fail("an accepted model of %u pieces, kind %u", V, tokenizer_get_id(tk).kind);
	struct token_buf t = {0};
	rc = tokenizer_encode(tk, text, sizeof text - 1, &t);
	if (rc < 0) {
		fuzz_check_error("tokenizer_encode", rc, NULL);
	} else {
		for (uint64_t i = 0; i < t.n; i++)
			if (t.tok[i] >= V)
				fuzz_fail("token %u of a vocabulary of %u", t.tok[i], V);
		char *back = NULL;
		size_t len;
		rc = tokenizer_decode(tk, t.tok, (size_t)t.n, &back, &len);
		if (rc < 0)
			fuzz_check_error("tokenizer_decode", rc, NULL);
		free(back);
	}
	token_buf_free(&t);
	check_export(tk, path, data, size);
	tokenizer_close(tk);
	fuzz_ok();
	return 0;
}
