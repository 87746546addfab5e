/* routesplit.h - `dpc-shard split --router`: route every document of a token file with a
 * document router (k-means or logistic regression) to one shard per path, top-1 or top-2,
 * and report how the routing went.
 *
 * The features come from a features file of the same token file (checked: corpus crc32,
 * document count, and the router's recipe: checkpoint digest, block, prefix) or are computed
 * with the base checkpoint (checked: its digest is the router's). Everything is checked and
 * every document routed before the first byte is written; the shards are then written as
 * shard_split_write() writes them (all or nothing), the manifest recording the router.
 *
 * The report (a JSON object): per shard its documents and tokens; with top 2, the documents
 * each pair of shards shares; and when the documents carry a label (a string field of their
 * metadata: the key given, else "category", else "genre"), the label-by-shard table of the
 * first choices, its purity and normalised mutual information (clusterstats.h), and the same
 * two scores for random shards of the same sizes (the first choices shuffled, 20 draws: mean
 * and standard deviation), the baseline routing must beat.
 */
#ifndef CORE_ROUTE_ROUTESPLIT_H
#define CORE_ROUTE_ROUTESPLIT_H

#include "backend/backend.h"
#include "io/shardsplit.h"

struct json_t;

struct route_split_opts {
	const char *router;   /* the router file (required) */
	const char *features; /* features of the input, or NULL to compute them with model */
	const char *model;    /* the base checkpoint, when features is NULL */
	struct backend *be;   /* where the base model runs, when features is NULL */
	int batch;            /* documents per forward when computing features */
	const char *label;    /* metadata key of the label, or NULL (see above) */
	struct shard_split_opts split; /* outdir, force, top, progress; paths from the router */
	int want_paths;       /* > 0: the router must route to this many paths (a run's) */
};

/* Route input and write its shards; *report gets the report (a new reference). */
int route_split(const char *input, const struct route_split_opts *o,
		struct shard_split_result *res, struct json_t **report);

#endif
