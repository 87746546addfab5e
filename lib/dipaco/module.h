/* module.h - module checkpoints and the metadata checks of path checkpoints.
 *
 * A module checkpoint (dpc-rundir(5)) is a safetensors file holding the tensors its level
 * owns, under their Hugging Face GPT-2 names, each followed by its outer momentum
 * "outer.momentum.<name>", with metadata: format dpc-checkpoint, kind module, module NAME,
 * level LEVEL, phase t, paths "0,1,...", config_hash (of the whole run config), and the
 * model shape keys of every checkpoint.
 */
#ifndef CORE_MODULE_H
#define CORE_MODULE_H

#include "dipaco/topology.h"
#include "io/safetensors.h"

#define MODULE_MOMENTUM_PREFIX "outer.momentum."

/* Open a writer for module m of phase `phase` at path (st_writer: the caller then puts,
 * for each owned view in layout order, its parameters then its momentum). */
int module_writer_open(struct st_writer **w, const char *path, const struct topology *t, int m,
		       long phase, const char *config_hash);
/* Write module m's phase-0 checkpoint: gpt2_init_params' values for its tensors (bit for bit
 * those of a whole model initialised with seed), momentum zero. */
int module_write_init(const char *path, const struct topology *t, int m, uint64_t seed,
		      const char *config_hash);
/* Open a module checkpoint and check it is module m of `phase` for this config
 * (verify: whole-file crc too). One clear error naming the file otherwise. */
int module_open(struct st_file *f, const char *path, const struct topology *t, int m,
		long phase, const char *config_hash, int verify);
/* Open a path checkpoint and check it is path p of `phase` for this config; its step and
 * shard token count go to *step and *tokens when not NULL. */
int pathckpt_open(struct st_file *f, const char *path, int p, long phase,
		  const char *config_hash, long *step, long *tokens, int verify);

#endif
