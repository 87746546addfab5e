/* shardsplit.h - divide a token file into P shards, one per path (DiLoCo, DiPaCo), documents
 * kept whole, and record how in OUTDIR/shards.json; the work of `dpc-shard split`.
 *
 * Two halves, so that every way of choosing shards shares the writing:
 *   an assignment: one shard index in [0, P) per document. Today shard_assign_random();
 *     a router-based split (k-means on document features, DiPaCo section 2.3) computes its
 *     own array and calls shard_split_write() with another method name;
 *   shard_split_write(): checks the assignment, then writes OUTDIR/shard-NNN.tok for every
 *     shard and OUTDIR/shards.json, all or nothing.
 *
 * Output names: shard-000.tok ... shard-{P-1}.tok, the number zero-padded to the digits of
 * P - 1 but at least 3 (shard-0999.tok only when P > 1000). Within a shard documents keep
 * the input's order, their tokens and their metadata; the shard has the input's vocabulary.
 *
 * shards.json (the manifest), one JSON object:
 *   {"source": input path as given, "source_crc": body crc32 of the input, 8 hex digits,
 *    "method": "random", "seed": N, "paths": P,
 *    "shards": [{"file": "shard-000.tok", "docs": n, "tokens": n}, ...]}
 *   and, for routed splits, "router": the router file, and "top": 2 when every document went
 *   to its two best shards (absent means 1).
 */
#ifndef CORE_SHARDSPLIT_H
#define CORE_SHARDSPLIT_H

#include <stddef.h>
#include <stdint.h>

#include "io/tokfile.h"

#define SHARD_MAX_PATHS 65536
#define SHARD_MIN_TOKENS 2 /* one input token and its target: the least a path trains on */
#define SHARD_MANIFEST "shards.json"

struct json_t;

struct shard_split_opts {
	const char *outdir; /* created (one level, like mkdir) when missing */
	uint32_t paths;     /* P in [1, SHARD_MAX_PATHS] */
	uint64_t seed;      /* the random assignment's seed, recorded in the manifest (< 2^63) */
	int force;          /* replace an existing split in outdir (see shard_split_write) */
	int top;            /* shards per document: 1 (0 means 1) or 2 (overlapping shards) */
	const char *router; /* the router file a routed split used, recorded; or NULL */
	/* Called every few thousand documents written and once at the end; may be NULL. */
	void (*progress)(void *ctx, uint64_t done, uint64_t total);
	void *progress_ctx;
};

struct shard_stats {
	uint64_t docs, tokens;
};

/* What was written: the manifest's contents. Release with shard_split_result_free(). */
struct shard_split_result {
	char *source;        /* the input path as given */
	uint32_t source_crc; /* the input's body crc32 (tokfile header) */
	const char *method;  /* "random", ... (a static string) */
	uint64_t seed;
	int top;      /* shards per document */
	char *router; /* or NULL */
	uint32_t paths;
	uint32_t vocab;
	uint64_t docs, tokens;     /* totals, equal to the input's */
	struct shard_stats *shard; /* [paths] */
};

/* Document d to shard rng_below(seed, RNG_STREAM_SHARD, d, paths), for d < ndocs: a pure
 * function of (seed, d), so independent of the thread count and of the order of the draws. */
void shard_assign_random(uint64_t seed, uint32_t paths, uint64_t ndocs, uint32_t *assign);

/* The name of shard s of paths into buf ("shard-007.tok"); CORE_EUSAGE if it does not fit. */
int shard_file_name(char *buf, size_t n, uint32_t s, uint32_t paths);

/* Write the documents of in to the shards assign says and the manifest, recording method and
 * o->seed. assign holds o->top entries per document (document d's shards are
 * assign[d * top .. d * top + top), distinct, each < paths); a document goes into each of its
 * shards. Before anything is written:
 *  - every assign[d] < o->paths, and paths in range (CORE_EUSAGE);
 *  - every shard gets at least one document and SHARD_MIN_TOKENS tokens (CORE_ESHAPE, on
 *    in's path: "shard 3 of 8 would be empty: ...");
 *  - unless o->force, outdir holds no shards.json and no shard-<digits>.tok, of this P or
 *    another (CORE_EIO: "'OUTDIR/shard-000.tok': exists (use --force to replace it)").
 * Then outdir is created if missing, every shard file and the manifest are completed and
 * synced, unnamed or under temporary names (tokw_prepare, afile_prepare), and only then put into
 * place, the manifest last. A failure before the renames leaves outdir as it was (and
 * removes it again if this call created it). With o->force, shard-<digits>.tok files that
 * are not part of the new split (left by a split with another P) are removed after the
 * renames, so that outdir holds one split. r is filled on success and left empty on
 * failure. */
int shard_split_write(const struct tokfile *in, const uint32_t *assign, const char *method,
		      const struct shard_split_opts *o, struct shard_split_result *r);

/* Open and verify the token file input, assign its documents at random
 * (shard_assign_random with o->seed and o->paths) and shard_split_write() them. */
int shard_split_random(const char *input, const struct shard_split_opts *o,
		       struct shard_split_result *r);

/* Read DIR/shards.json as shard_split_write wrote it: the shard count into *paths and each
 * shard's token count into (*tokens)[paths] (malloc'd; the caller frees it), every entry
 * naming the file shard_file_name gives. CORE_ENOTFOUND when there is no manifest,
 * CORE_EFORMAT naming the file when it is not one. The one reader of the manifest. */
int shard_manifest_read(const char *dir, uint32_t *paths, uint64_t **tokens);

/* The manifest object of r (a new reference; NULL when out of memory). */
struct json_t *shard_manifest_json(const struct shard_split_result *r);

void shard_split_result_free(struct shard_split_result *r);

#endif
