/* tokenizer_hf.h - a tokenizer as the files a Hugging Face model directory carries beside
 * model.safetensors and config.json, so that transformers (AutoTokenizer, a
 * PreTrainedTokenizerFast), the tokenizers library and tokenizers.js encode text into the ids
 * our models were trained on, and decode them back:
 *
 *   tokenizer.json         the tokenizers library's format. SentencePiece: a Unigram (or BPE)
 *                          model of the same pieces, ids and scores, byte fallback, no
 *                          normaliser, a Metaspace pre-tokenizer that splits before each space
 *                          (U+2581) and prepends none, a decoder of U+2581 -> space, bytes,
 *                          fused; the control pieces (<unk>, <s>, </s>) as special tokens.
 *                          Bytes: the ByteLevel alphabet of GPT-2 (byte b is one symbol),
 *                          vocabulary b -> id b, no merges.
 *   tokenizer_config.json  {"tokenizer_class": "PreTrainedTokenizerFast", model_max_length, ...}
 *   tokenizer.model        SentencePiece only: a copy of the model file, for SentencePiece's
 *                          own tools.
 *
 * Only a SentencePiece model that encodes as such a tokenizer.json says can be written: a
 * unigram or BPE model with the identity normalisation, no dummy prefix, spaces kept, split at
 * whitespace, byte fallback (what `dpc-shard tokenizer train` makes). Another (one trained
 * elsewhere, with NFKC or a dummy prefix) is CORE_EUNSUPPORTED, naming what differs. The BPE
 * merges are the pairs of pieces whose concatenation is a piece, in the order of its score, as
 * transformers' SentencePiece converter derives them.
 */
#ifndef CORE_TOKENIZER_HF_H
#define CORE_TOKENIZER_HF_H

#include "io/tokenizer.h"

#define TOKENIZER_HF_MAX_FILES 3

/* The names of the files tokenizer_hf_write writes for tk, into names; returns their count. */
int tokenizer_hf_files(const struct tokenizer *tk, const char *names[TOKENIZER_HF_MAX_FILES]);

/* Write them into the directory dir (which exists), each atomically; max_len: the model's
 * context, tokenizer_config.json's model_max_length. */
int tokenizer_hf_write(const struct tokenizer *tk, const char *dir, int max_len);

#endif
