/* checkpoint.h - a path's checkpoint: GPT-2 parameters under Hugging Face names, the AdamW
 * moments as "optim.exp_avg.<name>" / "optim.exp_avg_sq.<name>", and metadata (format, kind,
 * step, model shape, config hashes, the canonical config text). Format: dpc-checkpoint(5).
 */
#ifndef CORE_CHECKPOINT_H
#define CORE_CHECKPOINT_H

#include "io/config.h"
#include "io/safetensors.h"
#include "model/gpt2.h"

#define CKPT_FORMAT "dpc-checkpoint"

/* Write g's parameters (and moments when with_optim) atomically; step = steps done. extra:
 * nextra more metadata pairs (a DiPaCo path's phase, path index, shard tokens), or NULL. */
int ckpt_save(const char *path, const struct gpt2 *g, const struct run_config *c, long step,
	      int with_optim, const struct st_kv *extra, int nextra);

struct ckpt_info {
	struct model_config model;
	long step;
	int has_optim;
	char config_hash_model[17];
};

/* The tokenizer f's metadata "tokenizer" records, as recorded (TOKENIZER_NONE when absent);
 * CORE_EFORMAT on f when it is not an id. */
int ckpt_meta_tokenizer_id(const struct st_file *f, struct tokenizer_id *id);
/* m->tokenizer from f's metadata "tokenizer" (m->vocab_size already read): unknown when
 * absent, the byte tokenizer when absent and the vocabulary is 256 (tokenizer_id_known);
 * CORE_EFORMAT when it is not an id. */
int ckpt_meta_tokenizer(const struct st_file *f, struct model_config *m);
/* Open path, check it is one of ours, and read the model shape and step from its metadata.
 * Reads the header only: the data is verified by ckpt_load. */
int ckpt_info(const char *path, struct ckpt_info *info);
#define CKPT_DIGEST_CHARS 8 /* hex digits of ckpt_digest */
/* The parameters' digest: crc32 over the per-tensor crc32s of the parameter tensors (not the
 * optimizer state), in the order of the file's header (ours write Hugging Face order), as 8
 * hex digits; a checkpoint without per-tensor crc32s (another tool's) is refused. Two checkpoints
 * with the same parameters have the same digest whatever else they hold (optimizer state
 * "optim.*" and a module's "outer.*" are left out); reads the header only. */
int ckpt_digest(const char *path, char out[CKPT_DIGEST_CHARS + 1]);
/* The train section the checkpoint was written with: its "config" metadata (one
 * "section.key: value" line per key, config_dump's canonical text) over the defaults. */
int ckpt_train_config(const char *path, struct train_config *out);
/* What ckpt_load reads. CKPT_BODY: the parameters but lm_head.weight (g keeps its own),
 * from a file whose head may have another row count (a base model into a window router). */
enum { CKPT_PARAMS = 1, CKPT_MOMENTS = 2, CKPT_BODY = 4 };
/* Load the parameters and/or the AdamW moments (what) into g, whose shape must match the
 * file's; verifies the whole file first. Through host memory: the backend's own when it is
 * host memory, else one staging buffer the size of the parameters. */
int ckpt_load(const char *path, struct gpt2 *g, int what, long *step);

/* Export the path checkpoint ckpt for Hugging Face transformers: DIR/model.safetensors, the
 * parameters alone under GPT2LMHeadModel's names ("transformer." + our name, lm_head.weight
 * as it is; metadata {"format": "pt"}), and DIR/config.json, a GPT2Config of the same shape
 * (gelu_new, layer_norm_epsilon 1e-5, n_positions = seq_len, untied lm_head, no dropout).
 * Both written atomically; be only stages the parameters. */
int ckpt_export_hf(const char *ckpt, const char *dir, struct backend *be);

#endif
