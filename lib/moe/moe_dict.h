/* moe_dict.h - Tutel's optimal strategy dictionary (arXiv 2206.03382, sec. 3.4.6): capacity
 * bucket floor(C / R) -> the plan {r, d, a} measured fastest for it, with the machine and the
 * layer shape it was measured for. The file format is moe-dict(5); moe-profile(1) writes it,
 * moe-bench --dict reads it.
 *
 * The format, one item per line, '#' starts a comment (to the end of the line), blank lines
 * are ignored, fields are separated by spaces or tabs:
 *
 *   moe-dict 1                      first line (not a comment): magic and version
 *   machine TEXT                    free text to the end of the line (cpu model, cores, host):
 *                                   1 to 511 bytes after trimming blanks, no '#' (a comment
 *                                   starts there), no control character but tab
 *   world W                         ranks W >= 1
 *   local-size m                    ranks per node, divides W
 *   experts E                       >= 1
 *   model-dim M                     >= 1
 *   hidden-dim H                    >= 1
 *   top-k k                         1..E
 *   tokens T                        tokens per rank per step it was measured with, >= 1
 *   window R                        the bucket width, >= 1 (Tutel: 128)
 *   bucket KEY r d a SECONDS        KEY >= 0; r >= 0; d in {1, 2, 4, 8}; a: linear, 2dh or
 *                                   mpi; SECONDS > 0 finite: the measured step time
 *
 * Every header key exactly once, before the first bucket; buckets in increasing KEY, each
 * once, at least one. Integers are decimal without sign or leading zeros (0 itself allowed),
 * at most 2^53 (W, m, E, k and r at most 2^31 - 1); SECONDS is a decimal floating-point
 * number (strtod syntax in the C locale whatever the program's, no hex, no inf/nan). Lines
 * are at most 4096 bytes; control characters other than tab are refused anywhere (a
 * carriage return too: no CRLF files). A comment may follow the first line's version.
 * Whether r fits the placement is checked by moe_plan_check when the dictionary is used,
 * not here.
 */
#ifndef CORE_MOE_DICT_H
#define CORE_MOE_DICT_H

#include <stddef.h>
#include <stdint.h>

#include "moe/moe_dist.h"

struct moe_dict_entry {
	int64_t key;
	struct moe_plan plan;
	double seconds;
};

struct moe_dict {
	char machine[512];
	int W, local_size, E, k;
	int64_t M, H, T, R;
	size_t n;                   /* entries, increasing key */
	struct moe_dict_entry *e;
};

/* Parse path. CORE_EIO when it cannot be read (a missing file too); CORE_EVERSION for a
 * newer version; CORE_EFORMAT with a detail naming the line ("line 7: bucket 3 after bucket
 * 5") for anything else that breaks the format above. On failure *d is empty (nothing to
 * free). */
int moe_dict_read(const char *path, struct moe_dict *d);
/* Parse n bytes of text (what moe_dict_read does after reading the file; path names it in
 * errors, may be NULL). */
int moe_dict_parse(const char *text, size_t n, const char *path, struct moe_dict *d);
/* Write d to path atomically (io/atomicio.h: a crash leaves the old file or the new one),
 * in the format above with a comment line saying what wrote it. Refuses (CORE_EUSAGE) a
 * dictionary that moe_dict_parse would not read back equal. */
int moe_dict_write(const char *path, const struct moe_dict *d);
void moe_dict_free(struct moe_dict *d);

/* CORE_EUSAGE naming path and the first field that differs, when the dictionary was measured
 * for another layer or world: "'d.txt': measured for W=4 ranks, this run has W=2". Checked:
 * W, E, M, H, k (the local size and T are not: they change the times, not the meaning). */
int moe_dict_check(const struct moe_dict *d, const char *path, int W, int E, int64_t M,
		   int64_t H, int k);
/* The entry for capacity C: key floor(C / R) when measured; otherwise the entry with the
 * nearest key (ties: the lower; a negative C floors below the first key); *exact (exact may
 * be NULL) says which. NULL when d has no entry or R < 1 (never for a dictionary read). */
const struct moe_dict_entry *moe_dict_lookup(const struct moe_dict *d, int64_t C, int *exact);

#endif
