/* module.h - module checkpoints and the metadata checks of path checkpoints.
 *
 * A module checkpoint (dpc-rundir(5)) is a safetensors file holding the tensors its level
 * owns, under their Hugging Face GPT-2 names, each followed by its outer momentum
 * "outer.momentum.<name>", with metadata: format dpc-checkpoint, kind module, module NAME,
 * level LEVEL, phase t, paths "0,1,...", config_hash (of the whole run config), the model
 * shape keys of every checkpoint, and tokenizer (the tokens its paths were trained on, once
 * known: dpc-checkpoint(5)).
 */
#ifndef CORE_MODULE_H
#define CORE_MODULE_H

#include "dipaco/topology.h"
#include "io/safetensors.h"

#define MODULE_MOMENTUM_PREFIX "outer.momentum."

/* Open a writer for module m of phase `phase` at path (st_writer: the caller then puts,
 * for each owned view in layout order, its parameters then its momentum); init: phase 0's
 * "init" metadata (module_init_label), NULL for the other phases. */
int module_writer_open(struct st_writer **w, const char *path, const struct topology *t, int m,
		       long phase, const char *config_hash, const char *init,
		       struct tokenizer_id tok);
/* The tokenizer f's metadata names (a module's or a checkpoint's "tokenizer") merged into
 * *run: *run takes it when *run is unknown; CORE_EFORMAT on f when both are known and differ
 * (a run's modules and paths are all trained on the tokens of one tokenizer), or when the
 * text is no tokenizer id. Absent: nothing changes. */
int module_tokenizer(const struct st_file *f, struct tokenizer_id *run);
/* Where phase 0 comes from: the seeded initialisation, or a dense checkpoint's tensors. */
struct module_init {
	uint64_t seed;    /* gpt2_init_params' seed, when from is NULL */
	const char *from; /* a dpc checkpoint of the run's model shape (kind path), or NULL */
	int moments;      /* with from: the paths of phase 1 also take its AdamW moments */
};
/* The "init" metadata of a phase-0 module ("seed 1", "checkpoint 1a2b3c4d": the
 * checkpoint's ckpt_digest, "checkpoint 1a2b3c4d moments of step 192" with src->moments)
 * into out[MODULE_INIT_MAX], after checking that src->from is a model's checkpoint (kind
 * path) of shape `want`, holding moments when they are asked for: CORE_ECONFIG naming it
 * otherwise. */
#define MODULE_INIT_MAX 64
int module_init_label(const struct module_init *src, const struct model_config *want,
		      char out[MODULE_INIT_MAX]);
/* Write module m's phase-0 checkpoint with momentum zero and metadata init = label: from
 * src->from, its tensors of the same names (each finite; the shape of the run's model is
 * the caller's check), else gpt2_init_params' values (bit for bit those of a whole model
 * initialised with src->seed). */
int module_write_init(const char *path, const struct topology *t, int m,
		      const struct module_init *src, const char *label, const char *config_hash);
/* With src->moments: put a copy of src->from at path (RUNDIR_FORK_MOMENTS), verified first;
 * a copy that exists is kept when it has the digest and step label names, else
 * CORE_ECONFIG. Without: nothing (a copy there is CORE_ECONFIG: the run forked with the
 * moments). */
int module_write_fork_moments(const char *path, const struct module_init *src,
			      const char *label);
/* A phase-0 module that exists: CORE_ECONFIG unless it was written from the source label
 * names (a module without the key, from an older build, was the seeded initialisation). */
int module_check_init(const struct st_file *f, const char *label);
/* Open a module checkpoint and check it is module m of `phase` for this config
 * (verify: whole-file crc too). One clear error naming the file otherwise. */
int module_open(struct st_file *f, const char *path, const struct topology *t, int m,
		long phase, const char *config_hash, int verify);
/* Open a path checkpoint and check it is path p of `phase` for this config; its step and
 * shard token count go to *step and *tokens when not NULL. */
int pathckpt_open(struct st_file *f, const char *path, int p, long phase,
		  const char *config_hash, long *step, long *tokens, int verify);

#endif
