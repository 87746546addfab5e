/* config.c - YAML run configs: one schema table, one parser, one canonical dump; see config.h.
 *
 * Everything about a key lives in its row of the schema table: where it is stored, its type,
 * its range, its default (as text, parsed by the same code as a file value, so a default can
 * never be something a file could not say) and its one-line meaning. The parser, the
 * command-line overrides, config_validate's range checks, the dump and the hash all walk the
 * table, so a new section (dipaco:, moe:) is new rows and, at most, a cross-field rule in
 * config_validate.
 *
 * The file is read with libyaml's event API. We accept a strict subset of YAML: a mapping of
 * sections, each a mapping of scalar keys. Anchors, aliases and explicit tags are refused
 * rather than half-supported; numbers for numeric keys must be plain (unquoted) scalars, as a
 * YAML reader in another language would otherwise see a string where we see a number.
 *
 * One section is not a row of the table: levels:, the DiPaCo topology, a sequence of
 * mappings {name, owns, modules}. A level is a record whose position in the list matters
 * (it fixes how paths are numbered), so it has its own small parser with the same errors
 * (line, suggestion, duplicate) and its own lines at the end of the canonical dump; it can
 * be set only in a file, never with an override.
 */
#include "io/config.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

#include "common/editdist.h"
#include "common/err.h"
#include "io/atomicio.h"
#include "common/banned.h"

enum cfg_type { CFG_INT, CFG_LONG, CFG_DOUBLE, CFG_U64, CFG_BOOL, CFG_STRING, CFG_ENUM };

/* Range flags: which bounds exist and whether they are exclusive. */
enum {
	CFG_LO = 1,      /* value >= lo (or > lo with CFG_LO_OPEN) */
	CFG_HI = 2,      /* value <= hi (or < hi with CFG_HI_OPEN) */
	CFG_LO_OPEN = 4,
	CFG_HI_OPEN = 8,
	/* An optional key (CFG_INT or CFG_LONG, default "0" outside its range): 0 means the
	 * file does not set it. A file cannot say 0 (the range refuses it), and while the key
	 * holds 0 the canonical text (dump, hash, YAML) leaves it out, so the configs of runs
	 * made before the key existed keep their text and their hash. */
	CFG_UNSET = 16,
	CFG_MOE = 32, /* a key of the moe section: not written while moe.experts is 0 */
};
#define CFG_RANGE (CFG_LO | CFG_HI)

struct cfg_key {
	const char *section, *key;
	enum cfg_type type;
	size_t offset;               /* offsetof the field in the config struct */
	size_t size;                 /* CFG_STRING: sizeof the char array (with its nul) */
	unsigned flags;
	double lo, hi;               /* numeric bounds; exactly representable integers here */
	const char *def;             /* default, written as it would be in the file */
	const char *const *choices;  /* CFG_ENUM: NULL-terminated names; the field is an int */
	const char *doc;
};

struct cfg_schema {
	const struct cfg_key *keys;
	size_t n;
	size_t struct_size;
	int levels; /* the struct is a run_config, and the file may have a levels: section */
	int gated;  /* CFG_MOE keys are unset while the int at offset gate is 0 */
	size_t gate;
};

#define M(field) offsetof(struct run_config, model.field)
#define T(field) offsetof(struct run_config, train.field)
#define D(field) offsetof(struct run_config, dipaco.field)
#define E(field) offsetof(struct run_config, model.moe.field)

static const char *const moe_loss_choices[] = { "gshard", "load-importance", NULL };

/* Defaults are configs/gpt-tiny.yaml's values; man/dpc-config.5 lists the same rows. */
static const struct cfg_key run_keys[] = {
	{ "model", "n_layer", CFG_INT, M(n_layer), 0, CFG_RANGE, 1, 1024, "4", NULL,
	  "number of transformer blocks" },
	{ "model", "n_embd", CFG_INT, M(n_embd), 0, CFG_RANGE, 1, 65536, "256", NULL,
	  "model width C (residual stream channels)" },
	{ "model", "n_head", CFG_INT, M(n_head), 0, CFG_RANGE, 1, 1024, "4", NULL,
	  "attention heads; must divide n_embd" },
	{ "model", "seq_len", CFG_INT, M(seq_len), 0, CFG_RANGE, 1, 1048576, "256", NULL,
	  "context length T (also the number of positional embeddings)" },
	{ "model", "vocab_size", CFG_INT, M(vocab_size), 0, CFG_RANGE, 2, 2147483647.0, "256",
	  NULL, "vocabulary size V (256 for byte-level tokens)" },
	{ "train", "batch_size", CFG_INT, T(batch_size), 0, CFG_RANGE, 1, 65536, "8", NULL,
	  "sequences per step B" },
	{ "train", "steps", CFG_LONG, T(steps), 0, CFG_RANGE, 0, 1e12, "2000", NULL,
	  "total optimizer steps; the learning-rate schedule spans them" },
	{ "train", "lr", CFG_DOUBLE, T(lr), 0, CFG_RANGE | CFG_LO_OPEN, 0, 10, "3.0e-3", NULL,
	  "peak learning rate" },
	{ "train", "warmup_steps", CFG_LONG, T(warmup_steps), 0, CFG_LO, 0, 0, "100", NULL,
	  "steps of linear warmup from 0 to lr" },
	{ "train", "min_lr_frac", CFG_DOUBLE, T(min_lr_frac), 0, CFG_RANGE, 0, 1, "0.1", NULL,
	  "cosine decay ends at lr * min_lr_frac after steps" },
	{ "train", "restart_step", CFG_LONG, T(restart_step), 0, CFG_LO, 0, 0, "0", NULL,
	  "the schedule restarts at this step (warmup and cosine again over the rest); 0: none" },
	{ "train", "weight_decay", CFG_DOUBLE, T(weight_decay), 0, CFG_RANGE, 0, 10, "0.1", NULL,
	  "AdamW decoupled weight decay, on matrices only" },
	{ "train", "beta1", CFG_DOUBLE, T(beta1), 0, CFG_RANGE | CFG_HI_OPEN, 0, 1, "0.9", NULL,
	  "AdamW first-moment decay" },
	{ "train", "beta2", CFG_DOUBLE, T(beta2), 0, CFG_RANGE | CFG_HI_OPEN, 0, 1, "0.95", NULL,
	  "AdamW second-moment decay" },
	{ "train", "eps", CFG_DOUBLE, T(eps), 0, CFG_RANGE | CFG_LO_OPEN | CFG_HI_OPEN, 0, 1,
	  "1.0e-8", NULL, "AdamW denominator epsilon" },
	{ "train", "grad_clip", CFG_DOUBLE, T(grad_clip), 0, CFG_LO, 0, 0, "1.0", NULL,
	  "clip gradients to this global L2 norm; 0 disables clipping" },
	{ "train", "eval_every", CFG_LONG, T(eval_every), 0, CFG_LO, 0, 0, "100", NULL,
	  "evaluate on the validation tokens every this many steps; 0 disables" },
	{ "train", "eval_batches", CFG_LONG, T(eval_batches), 0, CFG_LO, 1, 0, "16", NULL,
	  "batches per evaluation" },
	{ "train", "checkpoint_every", CFG_LONG, T(checkpoint_every), 0, CFG_LO, 0, 0, "500", NULL,
	  "write a checkpoint every this many steps; 0: only at the end" },
	{ "train", "seed", CFG_U64, T(seed), 0, 0, 0, 0, "1", NULL,
	  "seed of every random stream (initialization, batches)" },
	{ "dipaco", "phases", CFG_LONG, D(phases), 0, CFG_LO, 1, 0, "1", NULL,
	  "outer phases T" },
	{ "dipaco", "inner_steps", CFG_LONG, D(inner_steps), 0, CFG_LO, 0, 0, "0", NULL,
	  "inner steps per phase tau; 0 means train.steps / phases" },
	{ "dipaco", "paths", CFG_INT, D(paths), 0, CFG_RANGE, 0, 65536, "0", NULL,
	  "number of paths P; 0 means the product of the routed levels' module counts" },
	{ "dipaco", "outer_lr", CFG_DOUBLE, D(outer_lr), 0, CFG_RANGE | CFG_LO_OPEN, 0, 10, "0.7",
	  NULL, "outer (Nesterov) learning rate" },
	{ "dipaco", "outer_momentum", CFG_DOUBLE, D(outer_momentum), 0, CFG_RANGE | CFG_HI_OPEN,
	  0, 1, "0.9", NULL, "outer momentum mu; 0 with outer_lr 1 is plain averaging" },
	{ "dipaco", "nesterov", CFG_BOOL, D(nesterov), 0, 0, 0, 0, "true", NULL,
	  "Nesterov outer update; false: heavy ball" },
	{ "dipaco", "rescale", CFG_BOOL, D(rescale), 0, 0, 0, 0, "true", NULL,
	  "multiply the averaged delta by sqrt(P_le)" },
	{ "dipaco", "reweight", CFG_BOOL, D(reweight), 0, 0, 0, 0, "true", NULL,
	  "weight paths by shard tokens, else uniformly" },
	{ "dipaco", "holdout", CFG_BOOL, D(holdout), 0, 0, 0, 0, "false", NULL,
	  "hold out the last holdout_frac of each shard's tokens, never trained on: the path's "
	  "validation set, for early stopping at evaluation (dpc-route eval --early-stop)" },
	{ "dipaco", "early_stop_every", CFG_LONG, D(early_stop_every), 0, CFG_LO, 0, 0, "0", NULL,
	  "within a phase, evaluate the held-out slice every this many inner steps and publish "
	  "the best parameters to the outer step (implies holdout); 0 disables" },
	{ "dipaco", "holdout_frac", CFG_DOUBLE, D(holdout_frac), 0, CFG_RANGE, 0, 0.5, "0.05",
	  NULL, "share of each shard's tokens held out (holdout, early_stop_every)" },
	{ "dipaco", "paths_per_phase", CFG_INT, D(paths_per_phase), 0, CFG_RANGE | CFG_UNSET, 1,
	  65536, "0", NULL,
	  "train only this many of the P paths in each phase, drawn from train.seed so that "
	  "every path trains in every ceil(P/N) consecutive phases; absent: every path" },
	{ "moe", "experts", CFG_INT, E(experts), 0, CFG_RANGE | CFG_MOE, 0, 65536, "0", NULL,
	  "experts E of every MoE block; 0: none, the dense GPT-2 (no moe key is then written)" },
	{ "moe", "top_k", CFG_INT, E(top_k), 0, CFG_RANGE | CFG_MOE, 1, 65536, "2", NULL,
	  "experts each token is sent to, k <= E" },
	{ "moe", "every", CFG_INT, E(every), 0, CFG_RANGE | CFG_MOE, 1, 1024, "2", NULL,
	  "the MLP of every this many blocks is MoE: blocks b with (b + 1) % every == 0" },
	{ "moe", "blocks", CFG_STRING, E(blocks), MOE_BLOCKS_CHARS, CFG_MOE, 0, 0, "", NULL,
	  "the MoE blocks as a list instead of every ('1,3', '0-3,6'); empty: from every" },
	{ "moe", "capacity_factor", CFG_DOUBLE, E(capacity_factor), 0, CFG_RANGE | CFG_MOE,
	  -1000, 1000, "1.0", NULL,
	  "Tutel's capacity setting x: > 0 C = k * int(x * ceil(N / E)) slots per expert over "
	  "the N tokens of a batch; 0: as many as the step needs (nothing dropped); < 0: that, "
	  "at most |x|'s" },
	{ "moe", "bpr", CFG_BOOL, E(bpr), 0, CFG_MOE, 0, 0, "false", NULL,
	  "batch-prioritized routing: slots go to the tokens of highest gate value first" },
	{ "moe", "gate_noise", CFG_DOUBLE, E(gate_noise), 0, CFG_RANGE | CFG_MOE, 0, 100, "0",
	  NULL, "noise s/E * N(0,1) on the gate's logits at training steps (not at evaluation)" },
	{ "moe", "aux_loss", CFG_ENUM, E(aux_loss), 0, CFG_MOE, 0, 0, "gshard", moe_loss_choices,
	  "the load-balancing loss: gshard, or load-importance (needs gate_noise > 0)" },
	{ "moe", "aux_weight", CFG_DOUBLE, E(aux_weight), 0, CFG_RANGE | CFG_MOE, 0, 100, "0.01",
	  NULL, "weight of the MoE blocks' summed auxiliary losses in the training objective" },
};

#undef M
#undef T
#undef D
#undef E

static const struct cfg_schema run_schema = {
	run_keys, sizeof run_keys / sizeof run_keys[0], sizeof(struct run_config), 1, 1,
	offsetof(struct run_config, model.moe.experts)
};

/* ---- messages ---------------------------------------------------------------------------- */

/* Where a value came from: a file line, a command-line override, or neither (validate). */
struct where {
	const char *path;
	const char *override;
	size_t line;
};

__attribute__((format(printf, 2, 3)))
static int fail(const struct where *w, const char *fmt, ...)
{
	char body[448];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(body, sizeof body, fmt, ap);
	va_end(ap);
	if (w->override)
		return err_set(CORE_ECONFIG, w->path, "override '%.200s': %s", w->override, body);
	if (w->line)
		return err_set(CORE_ECONFIG, w->path, "line %zu: %s", w->line, body);
	return err_set(CORE_ECONFIG, w->path, "%s", body);
}

static int is_integer_type(enum cfg_type t)
{
	return t == CFG_INT || t == CFG_LONG || t == CFG_U64;
}

/* The bounds actually enforced: the row's, or the storage type's where the row has none. */
static void effective_bounds(const struct cfg_key *k, double *lo, double *hi, unsigned *flags)
{
	*lo = k->lo;
	*hi = k->hi;
	*flags = k->flags;
	if (k->type == CFG_INT) {
		if (!(*flags & CFG_LO))
			*lo = INT_MIN, *flags |= CFG_LO;
		if (!(*flags & CFG_HI))
			*hi = INT_MAX, *flags |= CFG_HI;
	}
	if (k->type == CFG_U64 && !(*flags & CFG_LO))
		*lo = 0, *flags |= CFG_LO;
}

static void format_bound(const struct cfg_key *k, double v, char *buf, size_t n)
{
	if (is_integer_type(k->type))
		snprintf(buf, n, "%.0f", v);
	else
		snprintf(buf, n, "%g", v);
}

/* "(0, 10]", ">= 0", "> 0": the range text of error messages and of the man page. */
static void format_range(const struct cfg_key *k, char *buf, size_t n)
{
	char a[40], b[40];
	double lo, hi;
	unsigned f;

	effective_bounds(k, &lo, &hi, &f);
	format_bound(k, lo, a, sizeof a);
	format_bound(k, hi, b, sizeof b);
	if (k->type == CFG_U64 && !(f & CFG_HI))
		snprintf(buf, n, "[%s, 18446744073709551615]", a);
	else if ((f & CFG_LO) && (f & CFG_HI))
		snprintf(buf, n, "%c%s, %s%c", f & CFG_LO_OPEN ? '(' : '[', a, b,
			 f & CFG_HI_OPEN ? ')' : ']');
	else if (f & CFG_LO)
		snprintf(buf, n, "%s %s", f & CFG_LO_OPEN ? ">" : ">=", a);
	else if (f & CFG_HI)
		snprintf(buf, n, "%s %s", f & CFG_HI_OPEN ? "<" : "<=", b);
	else
		snprintf(buf, n, "any value");
}

static int in_range(const struct cfg_key *k, double v)
{
	double lo, hi;
	unsigned f;

	effective_bounds(k, &lo, &hi, &f);
	if (f & CFG_LO && (f & CFG_LO_OPEN ? !(v > lo) : !(v >= lo)))
		return 0;
	if (f & CFG_HI && (f & CFG_HI_OPEN ? !(v < hi) : !(v <= hi)))
		return 0;
	return 1;
}

static int range_fail(const struct where *w, const struct cfg_key *k, const char *text)
{
	char r[96];

	format_range(k, r, sizeof r);
	if (r[0] == '>' || r[0] == '<')
		return fail(w, "%s.%s: %.64s must be %s", k->section, k->key, text, r);
	return fail(w, "%s.%s: %.64s is outside %s", k->section, k->key, text, r);
}

/* ---- names and suggestions ---------------------------------------------------------------- */

static void full_name(const struct cfg_key *k, char *buf, size_t n)
{
	snprintf(buf, n, "%s.%s", k->section, k->key);
}

/* " (did you mean 'train.steps'?)" for the nearest key within 2 edits of the dotted name,
 * or for a key of that exact name in another section; "" when nothing is close. */
static void suggest_key(const struct cfg_schema *s, const char *name, char *buf, size_t n)
{
	const char *dot = strchr(name, '.');
	const char *bare = dot ? dot + 1 : name;
	size_t best = 3, bi = 0;
	char fn[128];

	buf[0] = '\0';
	if (s->levels && !strcmp(bare, "levels")) {
		snprintf(buf, n, " (levels is a top-level section of its own)");
		return;
	}
	for (size_t i = 0; i < s->n; i++) {
		if (!strcmp(s->keys[i].key, bare)) {
			best = 0, bi = i;
			break;
		}
	}
	for (size_t i = 0; best && i < s->n; i++) {
		full_name(&s->keys[i], fn, sizeof fn);
		size_t d = edit_distance(name, fn);
		if (d < best)
			best = d, bi = i;
	}
	if (best <= 2) {
		full_name(&s->keys[bi], fn, sizeof fn);
		snprintf(buf, n, " (did you mean '%s'?)", fn);
	}
}

static int section_exists(const struct cfg_schema *s, const char *name, size_t *first)
{
	for (size_t i = 0; i < s->n; i++) {
		if (!strcmp(s->keys[i].section, name)) {
			*first = i;
			return 1;
		}
	}
	return 0;
}

static void suggest_section(const struct cfg_schema *s, const char *name, char *buf, size_t n)
{
	size_t best = 3;
	const char *bs = NULL;

	buf[0] = '\0';
	for (size_t i = 0; i < s->n; i++) {
		size_t d = edit_distance(name, s->keys[i].section);
		if (d < best)
			best = d, bs = s->keys[i].section;
	}
	if (s->levels && edit_distance(name, "levels") < best)
		bs = "levels";
	if (bs) {
		snprintf(buf, n, " (did you mean '%s'?)", bs);
		return;
	}
	/* A key written at the top level, outside its section. */
	suggest_key(s, name, buf, n);
}

static const struct cfg_key *find_key(const struct cfg_schema *s, const char *section,
				      const char *key)
{
	for (size_t i = 0; i < s->n; i++)
		if (!strcmp(s->keys[i].section, section) && !strcmp(s->keys[i].key, key))
			return &s->keys[i];
	return NULL;
}

/* ---- scalar values ---------------------------------------------------------------------- */

enum val_style { VAL_PLAIN, VAL_QUOTED, VAL_OVERRIDE };

static int is_yaml_null(const char *s)
{
	return !strcmp(s, "") || !strcmp(s, "~") || !strcmp(s, "null") || !strcmp(s, "Null") ||
	       !strcmp(s, "NULL");
}

/* YAML's .inf/.nan spellings and the C library's, any case, optionally signed. */
static int is_nonfinite_word(const char *s)
{
	static const char *const words[] = { ".inf", ".nan", "inf", "nan", "infinity" };

	if (*s == '+' || *s == '-')
		s++;
	for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
		if (!strcasecmp(s, words[i]))
			return 1;
	return 0;
}

/* [-+]?digits: what strtol/strtoull may see. Leading zeros are refused because YAML 1.1
 * readers take 010 as octal 8 and YAML 1.2 readers as 10. */
static int check_integer_text(const char *s, int allow_minus)
{
	const char *p = s;

	if (*p == '+' || (allow_minus && *p == '-'))
		p++;
	if (!isdigit((unsigned char)*p))
		return 0;
	if (p[0] == '0' && p[1] != '\0')
		return 0;
	for (; *p; p++)
		if (!isdigit((unsigned char)*p))
			return 0;
	return 1;
}

/* Decimal floating point only (no hex floats, no words): digits, sign, point, exponent. */
static int check_double_text(const char *s)
{
	int digits = 0;

	for (const char *p = s; *p; p++) {
		if (isdigit((unsigned char)*p))
			digits = 1;
		else if (!strchr("+-.eE", *p))
			return 0;
	}
	return digits;
}

static int not_integer(const struct where *w, const struct cfg_key *k, const char *s)
{
	char *end;

	if (check_double_text(s)) {
		double v = strtod(s, &end);
		if (*end == '\0' && isfinite(v))
			return fail(w, "%s.%s: '%.64s' is not an integer", k->section, k->key, s);
	}
	return fail(w, "%s.%s: '%.64s' is not a number", k->section, k->key, s);
}

static void *field(void *base, const struct cfg_key *k)
{
	return (char *)base + k->offset;
}

static const void *cfield(const void *base, const struct cfg_key *k)
{
	return (const char *)base + k->offset;
}

/* Parse one scalar for key k and store it into base; nothing is stored on error. */
/* The typed setters of set_value: s is the whole value, checked and stored in k's field. */
static int set_integer(const struct where *w, const struct cfg_key *k, void *base,
		       const char *s)
{
	char *end;
	if (!check_integer_text(s, 1))
		return not_integer(w, k, s);
	errno = 0;
	long v = strtol(s, &end, 10);
	/* Past LONG_MAX with no upper bound of the key's own, "outside" has no interval to
	 * name. */
	unsigned side = v > 0 ? CFG_HI : CFG_LO;
	if (errno == ERANGE && k->type == CFG_LONG && !(k->flags & side))
		return fail(w, "%s.%s: %.64s is too %s", k->section, k->key, s,
			    v > 0 ? "large" : "small");
	if (errno == ERANGE || !in_range(k, (double)v))
		return range_fail(w, k, s);
	if (k->type == CFG_INT)
		*(int *)field(base, k) = (int)v;
	else
		*(long *)field(base, k) = v;
	return 0;
}

static int set_u64(const struct where *w, const struct cfg_key *k, void *base, const char *s)
{
	char *end;
	if (!check_integer_text(s, 1))
		return not_integer(w, k, s);
	if (*s == '-')
		return range_fail(w, k, s);
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno == ERANGE || !in_range(k, (double)v))
		return range_fail(w, k, s);
	*(uint64_t *)field(base, k) = (uint64_t)v;
	return 0;
}

static int set_double(const struct where *w, const struct cfg_key *k, void *base,
		      const char *s)
{
	char *end;
	if (is_nonfinite_word(s))
		return fail(w, "%s.%s: '%.64s' is not a finite number", k->section, k->key, s);
	if (!check_double_text(s))
		return fail(w, "%s.%s: '%.64s' is not a number", k->section, k->key, s);
	errno = 0;
	double v = strtod(s, &end);
	if (*end != '\0')
		return fail(w, "%s.%s: '%.64s' is not a number", k->section, k->key, s);
	/* Overflow is an error; underflow to 0 or a subnormal is left to the range. */
	if (!isfinite(v) || (errno == ERANGE && fabs(v) >= 1.0))
		return fail(w, "%s.%s: '%.64s' is not a finite number", k->section, k->key, s);
	if (!in_range(k, v))
		return range_fail(w, k, s);
	*(double *)field(base, k) = v;
	return 0;
}

static int set_bool(const struct where *w, const struct cfg_key *k, void *base, const char *s)
{
	int v;
	if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "TRUE"))
		v = 1;
	else if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "FALSE"))
		v = 0;
	else
		return fail(w, "%s.%s: '%.64s' is not true or false", k->section, k->key, s);
	*(int *)field(base, k) = v;
	return 0;
}

static int set_enum(const struct where *w, const struct cfg_key *k, void *base, const char *s)
{
	char list[256];
	size_t off = 0;
	for (int i = 0; k->choices[i]; i++) {
		if (!strcmp(s, k->choices[i])) {
			*(int *)field(base, k) = i;
			return 0;
		}
		int m = snprintf(list + off, sizeof list - off, "%s%s", i ? ", " : "",
				 k->choices[i]);
		if (m > 0 && (size_t)m < sizeof list - off)
			off += (size_t)m;
	}
	return fail(w, "%s.%s: '%.64s' is not one of %s", k->section, k->key, s, list);
}

static int set_value(const struct where *w, const struct cfg_key *k, void *base, const char *s,
		     size_t len, enum val_style style)
{
	if (strlen(s) != len)
		return fail(w, "%s.%s: value contains a nul byte", k->section, k->key);
	if ((style == VAL_PLAIN && is_yaml_null(s)) ||
	    (style == VAL_OVERRIDE && !*s && k->type != CFG_STRING))
		return fail(w, "%s.%s: missing value", k->section, k->key);
	if (style == VAL_QUOTED && k->type != CFG_STRING && k->type != CFG_ENUM)
		return fail(w, "%s.%s: \"%.64s\" is a quoted string, not a %s; remove the quotes",
			    k->section, k->key, s, k->type == CFG_BOOL ? "boolean" : "number");

	switch (k->type) {
	case CFG_INT:
	case CFG_LONG:
		return set_integer(w, k, base, s);
	case CFG_U64:
		return set_u64(w, k, base, s);
	case CFG_DOUBLE:
		return set_double(w, k, base, s);
	case CFG_BOOL:
		return set_bool(w, k, base, s);
	case CFG_STRING:
		if (len + 1 > k->size)
			return fail(w, "%s.%s: value is longer than %zu bytes", k->section, k->key,
				    k->size - 1);
		memcpy(field(base, k), s, len + 1);
		return 0;
	case CFG_ENUM:
		return set_enum(w, k, base, s);
	}
	return fail(w, "%s.%s: key has an unknown type", k->section, k->key);
}

static void schema_defaults(const struct cfg_schema *s, void *base)
{
	struct where w = { NULL, NULL, 0 };

	memset(base, 0, s->struct_size);
	/* The unit test checks that every default parses; a failure here cannot happen. */
	for (size_t i = 0; i < s->n; i++) {
		struct cfg_key k = s->keys[i];
		if (k.flags & CFG_UNSET) /* "absent" is outside the range a file may give */
			k.flags &= ~(unsigned)CFG_RANGE;
		set_value(&w, &k, base, k.def, strlen(k.def),
			  k.type == CFG_STRING ? VAL_QUOTED : VAL_PLAIN);
	}
}

/* An optional key that the config does not set (CFG_UNSET), or a key of the moe section of
 * a dense model (CFG_MOE). */
static int key_unset(const struct cfg_schema *s, const struct cfg_key *k, const void *base)
{
	if (k->flags & CFG_MOE) /* the schema's gate: moe.experts */
		return s->gated && *(const int *)((const char *)base + s->gate) == 0;
	if (!(k->flags & CFG_UNSET))
		return 0;
	const void *f = cfield(base, k);
	return k->type == CFG_LONG ? *(const long *)f == 0 : *(const int *)f == 0;
}

/* ---- levels: names, group words, canonical owns ------------------------------------------ */

/* The keys of one item of levels:, and the most modules a level may have (P <= 65536). */
static const char *const level_keys[] = { "name", "owns", "modules" };
enum { LK_NAME, LK_OWNS, LK_MODULES, LK_N };
#define LEVEL_MAX_MODULES 65536

/* [a-z][a-z0-9_]*, at most LEVEL_NAME_MAX - 1 bytes: a name that can be part of a tensor or
 * file name ("lower.1") without quoting. */
static int level_name_ok(const char *s, size_t max)
{
	size_t n = strnlen(s, max);

	if (n == 0 || n >= LEVEL_NAME_MAX || !(s[0] >= 'a' && s[0] <= 'z'))
		return 0;
	for (size_t i = 1; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
			return 0;
	return 1;
}

/* A block number of a group word: decimal, no sign, no leading zeros (as integers
 * elsewhere), at most 7 digits (n_layer <= 1024; validate names the real bound). */
static const char *block_number(const char *p, int *v)
{
	int n = 0;

	if (!isdigit((unsigned char)*p) || (p[0] == '0' && isdigit((unsigned char)p[1])))
		return NULL;
	*v = 0;
	for (; isdigit((unsigned char)*p); p++) {
		if (++n > 7)
			return NULL;
		*v = *v * 10 + (*p - '0');
	}
	return p;
}

/* Add one group word (embed, head, h.I, h.I-J) to lv; name is "levels.N.owns". */
static int owns_word(const struct where *w, const char *name, struct level_config *lv,
		     const char *word)
{
	int lo, hi;
	const char *p;

	if (!strcmp(word, "embed") || !strcmp(word, "head")) {
		int *flag = word[0] == 'e' ? &lv->embed : &lv->head;
		if (*flag)
			return fail(w, "%s: '%s' is named twice", name, word);
		*flag = 1;
		return 0;
	}
	if (strncmp(word, "h.", 2) || !(p = block_number(word + 2, &lo)))
		goto bad;
	hi = lo;
	if (*p == '-' && !(p = block_number(p + 1, &hi)))
		goto bad;
	if (*p)
		goto bad;
	if (lo > hi)
		return fail(w, "%s: range '%s' runs backwards (%d > %d)", name, word, lo, hi);
	if (lv->nranges == LEVEL_MAX_RANGES)
		return fail(w, "%s: more than %d block ranges", name, LEVEL_MAX_RANGES);
	lv->range[lv->nranges].lo = lo;
	lv->range[lv->nranges].hi = hi;
	lv->nranges++;
	return 0;
bad:
	return fail(w, "%s: '%.64s' is not a group (embed, head, h.I or h.I-J)", name, word);
}

/* owns as one string: words separated by spaces, tabs or commas. */
static int owns_words(const struct where *w, const char *name, struct level_config *lv,
		      const char *s)
{
	char word[72];

	for (;;) {
		s += strspn(s, " \t,");
		size_t k = strcspn(s, " \t,");
		if (!k)
			return 0;
		snprintf(word, sizeof word, "%.*s", (int)(k < 64 ? k : 64), s);
		ERR_FORWARD(owns_word(w, name, lv, word));
		s += k;
	}
}

/* Append to buf[n] at *off, truncating (a buffer of 512 holds any valid level). */
__attribute__((format(printf, 4, 5)))
static void buf_add(char *buf, size_t n, size_t *off, const char *fmt, ...)
{
	va_list ap;

	if (*off + 1 >= n)
		return;
	va_start(ap, fmt);
	int m = vsnprintf(buf + *off, n - *off, fmt, ap);
	va_end(ap);
	if (m > 0)
		*off = *off + (size_t)m < n ? *off + (size_t)m : n - 1;
}

/* "embed h.0-1 head": embed first, the ranges as written, head last (the struct keeps no
 * other order, so this is the one way to write a level's groups). */
static void owns_text(const struct level_config *lv, char *buf, size_t n)
{
	size_t off = 0;
	int nr = lv->nranges < 0 ? 0 : lv->nranges > LEVEL_MAX_RANGES ? LEVEL_MAX_RANGES
									 : lv->nranges;

	buf[0] = '\0';
	if (lv->embed)
		buf_add(buf, n, &off, "embed");
	for (int i = 0; i < nr; i++) {
		buf_add(buf, n, &off, "%sh.%d", off ? " " : "", lv->range[i].lo);
		if (lv->range[i].hi != lv->range[i].lo)
			buf_add(buf, n, &off, "-%d", lv->range[i].hi);
	}
	if (lv->head)
		buf_add(buf, n, &off, "%shead", off ? " " : "");
}

/* ---- the YAML file ------------------------------------------------------------------------ */

struct loader {
	const struct cfg_schema *s;
	void *base;
	const char *path;
	const char *text;
	size_t len;
	yaml_parser_t parser;
	size_t *key_line;  /* per row: line where the key was set, 0 when not yet */
	size_t *sec_line;  /* per row that starts a section: line of that section */
	size_t levels_line;                        /* line of the levels: section, 0 if none */
	size_t nset;                               /* keys set, the levels counting as one */
	size_t name_line[CONFIG_MAX_LEVELS];       /* line of each level's name */
};

static size_t line_of_offset(const char *text, size_t len, size_t off)
{
	size_t line = 1;

	for (size_t i = 0; i < off && i < len; i++)
		line += text[i] == '\n';
	return line;
}

static int yaml_fail(struct loader *L)
{
	yaml_parser_t *p = &L->parser;
	struct where w = { L->path, NULL, 0 };
	const char *problem = p->problem ? p->problem : "unknown problem";

	if (p->error == YAML_MEMORY_ERROR)
		return err_set(CORE_ENOMEM, L->path, "out of memory while parsing yaml");
	if (p->error == YAML_READER_ERROR)
		w.line = line_of_offset(L->text, L->len, p->problem_offset);
	else
		w.line = p->problem_mark.line + 1;
	if (p->context)
		return fail(&w, "malformed yaml: %s (%s)", problem, p->context);
	return fail(&w, "malformed yaml: %s", problem);
}

static const char *node_kind(const yaml_event_t *ev)
{
	switch (ev->type) {
	case YAML_MAPPING_START_EVENT: return "a mapping";
	case YAML_SEQUENCE_START_EVENT: return "a sequence";
	case YAML_SCALAR_EVENT: return "a scalar";
	default: return "something else";
	}
}

static size_t ev_line(const yaml_event_t *ev)
{
	return ev->start_mark.line + 1;
}

/* The next event, with the YAML features we refuse turned into errors. On error no event is
 * held; on success the caller owns ev. */
static int next_event(struct loader *L, yaml_event_t *ev)
{
	struct where w = { L->path, NULL, 0 };
	const yaml_char_t *anchor = NULL, *tag = NULL;

	if (!yaml_parser_parse(&L->parser, ev))
		return yaml_fail(L);
	w.line = ev_line(ev);
	switch (ev->type) {
	case YAML_ALIAS_EVENT: {
		int rc = fail(&w, "yaml aliases are not supported ('*%.64s'); write the value out",
			      (const char *)ev->data.alias.anchor);
		yaml_event_delete(ev);
		return rc;
	}
	case YAML_SCALAR_EVENT:
		anchor = ev->data.scalar.anchor;
		tag = ev->data.scalar.tag;
		break;
	case YAML_MAPPING_START_EVENT:
		anchor = ev->data.mapping_start.anchor;
		tag = ev->data.mapping_start.tag;
		break;
	case YAML_SEQUENCE_START_EVENT:
		anchor = ev->data.sequence_start.anchor;
		tag = ev->data.sequence_start.tag;
		break;
	default:
		break;
	}
	if (anchor) {
		int rc = fail(&w, "yaml anchors are not supported ('&%.64s'); write the value out",
			      (const char *)anchor);
		yaml_event_delete(ev);
		return rc;
	}
	if (tag) {
		int rc = fail(&w, "yaml tags are not supported ('%.64s')", (const char *)tag);
		yaml_event_delete(ev);
		return rc;
	}
	return 0;
}

static int is_null_scalar(const yaml_event_t *ev)
{
	return ev->type == YAML_SCALAR_EVENT && ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE &&
	       is_yaml_null((const char *)ev->data.scalar.value);
}

/* The next key of a mapping whose MAPPING_START has been consumed: its text (cut to 64
 * bytes, longer than any schema name) into key[65] and its line into w->line; *end = 1 at
 * the mapping's end instead. what names the key in the error for a non-scalar key. */
static int next_key(struct loader *L, struct where *w, const char *what, char key[65], int *end)
{
	yaml_event_t ev;
	int rc = 0;

	ERR_FORWARD(next_event(L, &ev));
	*end = ev.type == YAML_MAPPING_END_EVENT;
	if (!*end) {
		w->line = ev_line(&ev);
		if (ev.type == YAML_SCALAR_EVENT)
			snprintf(key, 65, "%.64s", (const char *)ev.data.scalar.value);
		else
			rc = fail(w, "%s must be a scalar, found %s", what, node_kind(&ev));
	}
	yaml_event_delete(&ev);
	return rc;
}

/* The keys of one section: a mapping whose MAPPING_START has been consumed. */
static int load_keys(struct loader *L, const char *section)
{
	yaml_event_t ev;
	struct where w = { L->path, NULL, 0 };
	char key[65], what[96], name[160], sugg[200];
	int end;

	snprintf(what, sizeof what, "a key of section '%s'", section);
	for (;;) {
		ERR_FORWARD(next_key(L, &w, what, key, &end));
		if (end)
			return 0;
		const struct cfg_key *k = find_key(L->s, section, key);
		snprintf(name, sizeof name, "%s.%s", section, key);
		if (!k) {
			suggest_key(L->s, name, sugg, sizeof sugg);
			return fail(&w, "unknown key '%s'%s", name, sugg);
		}
		size_t row = (size_t)(k - L->s->keys);
		if (L->key_line[row])
			return fail(&w, "duplicate key '%s' (first at line %zu)", name,
				    L->key_line[row]);
		L->key_line[row] = w.line;
		L->nset++;

		/* A block mapping or sequence value starts on the next line; the error is the
		 * key's, so it keeps the key's line. A scalar's own line is right for multi-line
		 * scalars. */
		ERR_FORWARD(next_event(L, &ev));
		int rc;
		if (ev.type != YAML_SCALAR_EVENT) {
			rc = fail(&w, "%s: expected a scalar value, found %s", name,
				  node_kind(&ev));
		} else {
			if (ev.data.scalar.length) /* an empty scalar's mark is past the key */
				w.line = ev_line(&ev);
			rc = set_value(&w, k, L->base, (const char *)ev.data.scalar.value,
				       ev.data.scalar.length,
				       ev.data.scalar.style == YAML_PLAIN_SCALAR_STYLE ? VAL_PLAIN
										    : VAL_QUOTED);
		}
		yaml_event_delete(&ev);
		ERR_FORWARD(rc);
	}
}

/* ---- the levels: section ------------------------------------------------------------------ */

/* The levels of the scratch config being loaded (only for a schema with levels). */
static struct level_config *loader_levels(struct loader *L)
{
	return ((struct run_config *)L->base)->dipaco.levels;
}

/* " (did you mean 'levels.0.name'?)" for a key within 2 edits of a level key. */
static void suggest_level_key(const char *key, int idx, char *buf, size_t n)
{
	size_t best = 3, bi = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < LK_N; i++) {
		size_t d = edit_distance(key, level_keys[i]);
		if (d < best)
			best = d, bi = i;
	}
	if (best <= 2)
		snprintf(buf, n, " (did you mean 'levels.%d.%s'?)", idx, level_keys[bi]);
}

/* owns written as a sequence, whose SEQUENCE_START has been consumed: one word an item. */
static int load_owns_seq(struct loader *L, const char *name, struct level_config *lv)
{
	struct where w = { L->path, NULL, 0 };
	yaml_event_t ev;
	int rc;

	for (;;) {
		ERR_FORWARD(next_event(L, &ev));
		if (ev.type == YAML_SEQUENCE_END_EVENT) {
			yaml_event_delete(&ev);
			return 0;
		}
		w.line = ev_line(&ev);
		if (ev.type != YAML_SCALAR_EVENT)
			rc = fail(&w, "%s: expected a group word, found %s", name, node_kind(&ev));
		else if (strlen((const char *)ev.data.scalar.value) != ev.data.scalar.length)
			rc = fail(&w, "%s: value contains a nul byte", name);
		else
			rc = owns_word(&w, name, lv, (const char *)ev.data.scalar.value);
		yaml_event_delete(&ev);
		ERR_FORWARD(rc);
	}
}

/* The scalar value of name, owns or modules of level idx. */
static int level_scalar(struct loader *L, const struct where *w, int idx, int k,
			const char *name, const yaml_event_t *ev)
{
	struct level_config *lv = &loader_levels(L)[idx];
	const char *s = (const char *)ev->data.scalar.value;
	int plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
	char *end;

	if (strlen(s) != ev->data.scalar.length)
		return fail(w, "%s: value contains a nul byte", name);
	if (plain && is_yaml_null(s))
		return fail(w, "%s: missing value", name);
	switch (k) {
	case LK_NAME:
		if (!level_name_ok(s, ev->data.scalar.length + 1))
			return fail(w, "%s: '%.64s' is not a level name ([a-z][a-z0-9_]*, at most "
				    "%d characters)", name, s, LEVEL_NAME_MAX - 1);
		for (int j = 0; j < idx; j++)
			if (!strcmp(loader_levels(L)[j].name, s))
				return fail(w, "%s: duplicate level name '%s' (first at line %zu)",
					    name, s, L->name_line[j]);
		snprintf(lv->name, sizeof lv->name, "%s", s);
		L->name_line[idx] = w->line;
		return 0;
	case LK_OWNS:
		ERR_FORWARD(owns_words(w, name, lv, s));
		return 0;
	default: /* LK_MODULES */
		if (!strcmp(s, "path")) {
			lv->modules = LEVEL_PER_PATH;
			return 0;
		}
		if (!plain)
			return fail(w, "%s: \"%.64s\" is a quoted string, not a number; remove the "
				    "quotes", name, s);
		if (!check_integer_text(s, 1))
			return fail(w, "%s: '%.64s' is neither an integer nor the word path%s", name,
				    s, edit_distance(s, "path") <= 2 ? " (did you mean 'path'?)" : "");
		errno = 0;
		long v = strtol(s, &end, 10);
		if (errno == ERANGE || v < 1 || v > LEVEL_MAX_MODULES)
			return fail(w, "%s: %.64s is outside [1, %d] (write path for one module "
				    "per path)", name, s, LEVEL_MAX_MODULES);
		lv->modules = (int)v;
		return 0;
	}
}

/* One item of levels:, a mapping whose MAPPING_START (at line item_line) has been consumed. */
static int load_level(struct loader *L, int idx, size_t item_line)
{
	struct level_config *lv = &loader_levels(L)[idx];
	struct where w = { L->path, NULL, item_line };
	size_t seen[LK_N] = { 0 };
	char key[65], what[64], name[96], sugg[96];
	yaml_event_t ev;
	int end, rc;

	memset(lv, 0, sizeof *lv);
	snprintf(what, sizeof what, "a key of levels.%d", idx);
	for (;;) {
		ERR_FORWARD(next_key(L, &w, what, key, &end));
		if (end)
			break;
		int k = 0;
		while (k < LK_N && strcmp(key, level_keys[k]))
			k++;
		snprintf(name, sizeof name, "levels.%d.%s", idx, key);
		if (k == LK_N) {
			suggest_level_key(key, idx, sugg, sizeof sugg);
			return fail(&w, "unknown key '%s'%s", name, sugg);
		}
		if (seen[k])
			return fail(&w, "duplicate key '%s' (first at line %zu)", name, seen[k]);
		seen[k] = w.line;

		ERR_FORWARD(next_event(L, &ev));
		if (k == LK_OWNS && ev.type == YAML_SEQUENCE_START_EVENT) {
			yaml_event_delete(&ev);
			rc = load_owns_seq(L, name, lv);
		} else {
			if (ev.type != YAML_SCALAR_EVENT) {
				rc = fail(&w, "%s: expected a scalar value%s, found %s", name,
					  k == LK_OWNS ? " or a sequence" : "", node_kind(&ev));
			} else {
				if (ev.data.scalar.length)
					w.line = ev_line(&ev);
				rc = level_scalar(L, &w, idx, k, name, &ev);
			}
			yaml_event_delete(&ev);
		}
		ERR_FORWARD(rc);
		if (k == LK_OWNS && !lv->embed && !lv->head && !lv->nranges)
			return fail(&w, "%s: names no group", name);
	}
	w.line = item_line;
	for (int k = 0; k < LK_N; k++)
		if (!seen[k])
			return fail(&w, "levels.%d: missing key '%s'", idx, level_keys[k]);
	return 0;
}

/* The value of the top-level key levels: (line w->line): a block or flow sequence of levels,
 * or nothing (no levels: a dense model). */
static int load_levels(struct loader *L, struct where *w)
{
	struct run_config *c = L->base;
	yaml_event_t ev;
	int n = 0, rc = 0;

	ERR_FORWARD(next_event(L, &ev));
	w->line = ev_line(&ev);
	if (ev.type != YAML_SEQUENCE_START_EVENT) {
		if (!is_null_scalar(&ev))
			rc = fail(w, "levels must be a sequence of levels (- name: ...), found %s",
				  node_kind(&ev));
		yaml_event_delete(&ev);
		ERR_FORWARD(rc);
		goto done;
	}
	yaml_event_delete(&ev);
	for (;;) {
		ERR_FORWARD(next_event(L, &ev));
		if (ev.type == YAML_SEQUENCE_END_EVENT) {
			yaml_event_delete(&ev);
			break;
		}
		w->line = ev_line(&ev);
		if (n == CONFIG_MAX_LEVELS)
			rc = fail(w, "levels: more than %d levels", CONFIG_MAX_LEVELS);
		else if (ev.type != YAML_MAPPING_START_EVENT)
			rc = fail(w, "levels.%d must be a mapping of name, owns and modules, found %s",
				  n, node_kind(&ev));
		yaml_event_delete(&ev);
		ERR_FORWARD(rc);
		ERR_FORWARD(load_level(L, n, w->line));
		n++;
	}
done:
	/* Entries past the count are zero, so equal configs are equal bytes. */
	memset(&c->dipaco.levels[n], 0, (CONFIG_MAX_LEVELS - (size_t)n) * sizeof c->dipaco.levels[0]);
	c->dipaco.nlevels = n;
	return 0;
}

/* The top-level mapping of sections, whose MAPPING_START has been consumed. */
static int load_sections(struct loader *L)
{
	yaml_event_t ev;
	struct where w = { L->path, NULL, 0 };
	char name[65], sugg[200];
	size_t first;
	int end;

	for (;;) {
		ERR_FORWARD(next_key(L, &w, "a section name", name, &end));
		if (end)
			return 0;
		if (L->s->levels && !strcmp(name, "levels")) {
			if (L->levels_line)
				return fail(&w, "duplicate section 'levels' (first at line %zu)",
					    L->levels_line);
			L->levels_line = w.line;
			L->nset++;
			ERR_FORWARD(load_levels(L, &w));
			continue;
		}
		if (!section_exists(L->s, name, &first)) {
			suggest_section(L->s, name, sugg, sizeof sugg);
			return fail(&w, "unknown section '%s'%s", name, sugg);
		}
		if (L->sec_line[first])
			return fail(&w, "duplicate section '%s' (first at line %zu)", name,
				    L->sec_line[first]);
		L->sec_line[first] = w.line;

		ERR_FORWARD(next_event(L, &ev));
		w.line = ev_line(&ev);
		if (ev.type == YAML_MAPPING_START_EVENT) {
			yaml_event_delete(&ev);
			ERR_FORWARD(load_keys(L, L->s->keys[first].section));
			continue;
		}
		int empty = is_null_scalar(&ev); /* "train:" alone: an empty section */
		int rc = empty ? 0 : fail(&w, "section '%s' must be a mapping of keys, found %s",
					  name, node_kind(&ev));
		yaml_event_delete(&ev);
		ERR_FORWARD(rc);
	}
}

static int load_stream(struct loader *L)
{
	yaml_event_t ev;
	struct where w = { L->path, NULL, 0 };
	int rc = 0;

	ERR_FORWARD(next_event(L, &ev)); /* STREAM_START */
	yaml_event_delete(&ev);
	ERR_FORWARD(next_event(L, &ev));
	if (ev.type == YAML_STREAM_END_EVENT) { /* no document at all: only comments, or empty */
		yaml_event_delete(&ev);
		return 0;
	}
	yaml_event_delete(&ev); /* DOCUMENT_START */

	ERR_FORWARD(next_event(L, &ev));
	w.line = ev_line(&ev);
	if (ev.type == YAML_MAPPING_START_EVENT) {
		yaml_event_delete(&ev);
		ERR_FORWARD(load_sections(L));
	} else {
		if (!is_null_scalar(&ev)) /* "---" alone is an empty document */
			rc = fail(&w, "top level is not a mapping of sections (found %s)",
				  node_kind(&ev));
		yaml_event_delete(&ev);
		ERR_FORWARD(rc);
	}

	ERR_FORWARD(next_event(L, &ev)); /* DOCUMENT_END */
	yaml_event_delete(&ev);
	ERR_FORWARD(next_event(L, &ev));
	w.line = ev_line(&ev);
	if (ev.type != YAML_STREAM_END_EVENT)
		rc = fail(&w, "more than one yaml document; a config is one document");
	yaml_event_delete(&ev);
	return rc;
}

/* Config files are small; anything larger than this is not a config. */
#define CONFIG_MAX_BYTES (16u << 20)

/* Parse into a scratch copy so that a failed load leaves the caller's config untouched. */
static int schema_load(const struct cfg_schema *s, void *base, const char *path)
{
	struct loader L = { .s = s, .path = path };
	char *text = NULL;
	int rc;

	ERR_FORWARD(file_read_all(path, CONFIG_MAX_BYTES, &text, &L.len));
	L.text = text;
	L.base = malloc(s->struct_size);
	L.key_line = calloc(2 * s->n, sizeof *L.key_line);
	if (!L.base || !L.key_line) {
		rc = err_set(CORE_ENOMEM, path, "cannot allocate the config");
		goto out;
	}
	L.sec_line = L.key_line + s->n;
	memcpy(L.base, base, s->struct_size);
	if (!yaml_parser_initialize(&L.parser)) {
		rc = err_set(CORE_ENOMEM, path, "cannot initialize the yaml parser");
		goto out;
	}
	yaml_parser_set_input_string(&L.parser, (const unsigned char *)text, L.len);
	rc = load_stream(&L);
	yaml_parser_delete(&L.parser);
	/* An empty file (or -c /dev/null, or a file of comments) is far more often a mistake than
	 * a request for every default: refuse it rather than start a default run. */
	if (rc == 0 && L.nset == 0)
		rc = err_set(CORE_ECONFIG, path,
			     "holds no settings (name at least one key)");
	if (rc == 0)
		memcpy(base, L.base, s->struct_size);
out:
	free(L.key_line);
	free(L.base);
	free(text);
	return rc;
}

/* a is "levels=...", "levels.0.name=..." or "levels[0]...", with prefix for "levels". */
static int names_levels(const char *a, const char *prefix)
{
	size_t n = strlen(prefix);

	return !strncmp(a, prefix, n) && a[n] && strchr(".[=", a[n]);
}

/* "section.key=value": the value is taken as written (a plain scalar, no YAML quoting). */
static int schema_set(const struct cfg_schema *s, void *base, const char *assignment)
{
	struct where w = { NULL, assignment, 0 };
	const char *eq = strchr(assignment, '=');
	char name[128], sugg[200];
	size_t first;

	if (!eq || eq == assignment)
		return fail(&w, "expected section.key=value");
	/* A level is several keys that only make sense together, and its place in the list
	 * is its meaning: no override syntax says that better than the file does. */
	if (s->levels && (names_levels(assignment, "levels") ||
			  names_levels(assignment, "dipaco.levels")))
		return fail(&w, "levels can be set only in a config file");
	if ((size_t)(eq - assignment) >= sizeof name)
		return fail(&w, "unknown key '%.64s...'", assignment);
	memcpy(name, assignment, (size_t)(eq - assignment));
	name[eq - assignment] = '\0';

	char *dot = strchr(name, '.');
	const struct cfg_key *k = NULL;
	if (dot) {
		*dot = '\0';
		k = find_key(s, name, dot + 1);
		if (!k && !section_exists(s, name, &first)) {
			suggest_section(s, name, sugg, sizeof sugg);
			return fail(&w, "unknown section '%s'%s", name, sugg);
		}
		*dot = '.';
	}
	if (!k) {
		suggest_key(s, name, sugg, sizeof sugg);
		return fail(&w, "unknown key '%s'%s", name, sugg);
	}
	return set_value(&w, k, base, eq + 1, strlen(eq + 1), VAL_OVERRIDE);
}

/* Every key in its range again: the struct may have been filled by code, not by us. */
static int schema_check_ranges(const struct cfg_schema *s, const void *base, const char *path)
{
	struct where w = { path, NULL, 0 };
	char text[64];

	for (size_t i = 0; i < s->n; i++) {
		const struct cfg_key *k = &s->keys[i];
		const void *f = cfield(base, k);
		double v;

		if (key_unset(s, k, base))
			continue;

		switch (k->type) {
		case CFG_INT:
			v = *(const int *)f;
			snprintf(text, sizeof text, "%d", *(const int *)f);
			break;
		case CFG_LONG:
			v = (double)*(const long *)f;
			snprintf(text, sizeof text, "%ld", *(const long *)f);
			break;
		case CFG_U64:
			v = (double)*(const uint64_t *)f;
			snprintf(text, sizeof text, "%" PRIu64, *(const uint64_t *)f);
			break;
		case CFG_DOUBLE:
			v = *(const double *)f;
			snprintf(text, sizeof text, "%g", v);
			if (!isfinite(v))
				return fail(&w, "%s.%s: %s is not a finite number", k->section,
					    k->key, text);
			break;
		case CFG_BOOL:
		case CFG_ENUM: {
			int e = *(const int *)f, nc = 0;
			if (k->type == CFG_BOOL)
				nc = 2;
			else
				while (k->choices[nc])
					nc++;
			if (e < 0 || e >= nc)
				return fail(&w, "%s.%s: %d is not a valid choice", k->section,
					    k->key, e);
			continue;
		}
		case CFG_STRING:
			if (!memchr(f, '\0', k->size))
				return fail(&w, "%s.%s: string is not terminated", k->section,
					    k->key);
			continue;
		default:
			continue;
		}
		if (!in_range(k, v))
			return range_fail(&w, k, text);
	}
	return 0;
}

/* ---- canonical text and hashes ------------------------------------------------------------ */

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

/* Where canonical text goes: a bounded buffer (counting what did not fit) or an FNV-1a 64
 * hash, so hashing needs no allocation. */
struct sink {
	char *buf;
	size_t n, len;
	int hashing;
	uint64_t h;
};

static void sink_put(struct sink *o, const char *p, size_t k)
{
	if (o->hashing) {
		for (size_t i = 0; i < k; i++) {
			o->h ^= (unsigned char)p[i];
			o->h *= FNV_PRIME;
		}
	} else if (o->len < o->n) {
		size_t room = o->n - 1 - o->len; /* keep one byte for the nul */
		memcpy(o->buf + o->len, p, k < room ? k : room);
	}
	o->len += k;
}

static void sink_str(struct sink *o, const char *s)
{
	sink_put(o, s, strlen(s));
}

/* A string value as a YAML double-quoted scalar, so any bytes give one unambiguous line. */
static void sink_quoted(struct sink *o, const char *s)
{
	char esc[8];

	sink_str(o, "\"");
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (*p == '"' || *p == '\\') {
			esc[0] = '\\', esc[1] = (char)*p;
			sink_put(o, esc, 2);
		} else if (*p < 0x20 || *p == 0x7f) {
			snprintf(esc, sizeof esc, "\\x%02x", *p);
			sink_str(o, esc);
		} else {
			sink_put(o, (const char *)p, 1);
		}
	}
	sink_str(o, "\"");
}

/* A value as canonical text; yaml quotes enum names too (a name such as "no" or "1" would
 * otherwise be read back as something else by a YAML reader). */
static void sink_value(struct sink *o, const struct cfg_key *k, const void *base, int yaml)
{
	const void *f = cfield(base, k);
	char v[64];

	switch (k->type) {
	case CFG_INT: snprintf(v, sizeof v, "%d", *(const int *)f); break;
	case CFG_LONG: snprintf(v, sizeof v, "%ld", *(const long *)f); break;
	case CFG_U64: snprintf(v, sizeof v, "%" PRIu64, *(const uint64_t *)f); break;
	case CFG_DOUBLE: snprintf(v, sizeof v, "%.17g", *(const double *)f); break;
	case CFG_BOOL: snprintf(v, sizeof v, "%s", *(const int *)f ? "true" : "false"); break;
	case CFG_ENUM: {
		int e = *(const int *)f, nc = 0;
		while (k->choices[nc])
			nc++;
		snprintf(v, sizeof v, "%s", e >= 0 && e < nc ? k->choices[e] : "?");
		if (yaml) {
			sink_quoted(o, v);
			return;
		}
		break;
	}
	case CFG_STRING:
		sink_quoted(o, (const char *)f);
		return;
	default: v[0] = '\0'; break;
	}
	sink_str(o, v);
}

static void sink_line(struct sink *o, const struct cfg_key *k, const void *base)
{
	sink_str(o, k->section);
	sink_str(o, ".");
	sink_str(o, k->key);
	sink_str(o, ": ");
	sink_value(o, k, base, 0);
	sink_str(o, "\n");
}

/* A level name, cut to its array (the struct may come from code, not from us). */
static void level_name_text(const struct level_config *lv, char *buf, size_t n)
{
	snprintf(buf, n, "%.*s", (int)strnlen(lv->name, LEVEL_NAME_MAX), lv->name);
}

/* A level's three values as text, for both ways a config is written out (the canonical
 * lines and the YAML): its name, the modules ("path" or a count) and what it owns
 * ("embed h.0-1 head"). */
struct level_text {
	char name[LEVEL_NAME_MAX + 1], modules[16], owns[512];
};

static void level_text(const struct level_config *lv, struct level_text *t)
{
	level_name_text(lv, t->name, sizeof t->name);
	if (lv->modules == LEVEL_PER_PATH)
		snprintf(t->modules, sizeof t->modules, "path");
	else
		snprintf(t->modules, sizeof t->modules, "%d", lv->modules);
	owns_text(lv, t->owns, sizeof t->owns);
}

/* The levels configured (at most CONFIG_MAX_LEVELS). */
static int levels_count(const struct run_config *c)
{
	return c->dipaco.nlevels > CONFIG_MAX_LEVELS ? CONFIG_MAX_LEVELS : c->dipaco.nlevels;
}

/* "levels.0: name=lower modules=2 owns=embed h.0-1" for each configured level. */
static void levels_emit(const struct run_config *c, struct sink *o)
{
	char line[640];

	for (int i = 0; i < levels_count(c); i++) {
		struct level_text t;
		level_text(&c->dipaco.levels[i], &t);
		snprintf(line, sizeof line, "levels.%d: name=%s modules=%s owns=%s\n", i, t.name,
			 t.modules, t.owns);
		sink_str(o, line);
	}
}

/* Table order; only_section NULL means every key. */
static void schema_emit(const struct cfg_schema *s, const void *base, const char *only_section,
			struct sink *o)
{
	for (size_t i = 0; i < s->n; i++)
		if ((!only_section || !strcmp(s->keys[i].section, only_section)) &&
		    !key_unset(s, &s->keys[i], base))
			sink_line(o, &s->keys[i], base);
}

static void hash_hex(uint64_t h, char out[17])
{
	snprintf(out, 17, "%016" PRIx64, h);
}

/* ---- public API --------------------------------------------------------------------------- */

void config_defaults(struct run_config *c)
{
	schema_defaults(&run_schema, c);
}

static int moe_equal(const struct model_moe *a, const struct model_moe *b)
{
	if (a->experts == 0 || b->experts == 0)
		return a->experts == b->experts;
	return a->experts == b->experts && a->top_k == b->top_k && a->every == b->every &&
	       !strcmp(a->blocks, b->blocks) && a->capacity_factor == b->capacity_factor &&
	       a->bpr == b->bpr && a->gate_noise == b->gate_noise && a->aux_loss == b->aux_loss &&
	       a->aux_weight == b->aux_weight;
}

int config_model_equal(const struct model_config *a, const struct model_config *b)
{
	return a->n_layer == b->n_layer && a->n_embd == b->n_embd && a->n_head == b->n_head &&
	       a->seq_len == b->seq_len && a->vocab_size == b->vocab_size &&
	       model_n_out(a) == model_n_out(b) && moe_equal(&a->moe, &b->moe);
}

/* moe.blocks: "b" or "lo-hi" items, comma-separated, each block in 0..L-1, none twice. */
static int moe_blocks_list(const struct model_config *c, unsigned char *mask, int L)
{
	const char *s = c->moe.blocks;
	int n = 0;

	while (*s) {
		char *end;
		long lo, hi;
		if (*s < '0' || *s > '9')
			goto bad;
		lo = strtol(s, &end, 10);
		hi = lo;
		s = end;
		if (*s == '-') {
			if (s[1] < '0' || s[1] > '9')
				goto bad;
			hi = strtol(s + 1, &end, 10);
			s = end;
		}
		if (*s && *s != ',')
			goto bad;
		if (*s == ',' && !s[1])
			goto bad;
		s += *s == ',';
		if (lo > hi)
			return err_set(CORE_ECONFIG, NULL, "moe.blocks: '%ld-%ld' is not a range",
				       lo, hi);
		if (hi >= L)
			return err_set(CORE_ECONFIG, NULL, "moe.blocks: block %ld, but model.n_layer "
				       "is %d (blocks 0..%d)", hi, L, L - 1);
		for (long b = lo; b <= hi; b++) {
			if (mask && mask[b])
				return err_set(CORE_ECONFIG, NULL, "moe.blocks: block %ld named twice",
					       b);
			if (mask)
				mask[b] = 1;
			n++;
		}
	}
	return n;
bad:
	return err_set(CORE_ECONFIG, NULL, "moe.blocks: '%.*s' is not a list of blocks and "
		       "ranges ('1,3', '0-3,6')", MOE_BLOCKS_CHARS, c->moe.blocks);
}

int model_moe_blocks(const struct model_config *c, unsigned char *mask)
{
	const int L = c->n_layer;
	if (c->moe.experts <= 0 || L < 1)
		return 0;
	unsigned char *m = calloc((size_t)L, 1);
	if (!m)
		return err_set(CORE_ENOMEM, NULL, "out of memory");
	int n = 0;
	if (c->moe.blocks[0]) {
		n = moe_blocks_list(c, m, L);
	} else {
		for (int b = 0; b < L && c->moe.every > 0; b++)
			if ((b + 1) % c->moe.every == 0)
				m[b] = 1, n++;
	}
	if (n >= 0 && mask)
		memcpy(mask, m, (size_t)L);
	free(m);
	return n;
}

int config_load(struct run_config *c, const char *path)
{
	return schema_load(&run_schema, c, path);
}

int config_set(struct run_config *c, const char *assignment)
{
	return schema_set(&run_schema, c, assignment);
}

int config_load_with(struct run_config *c, const char *path, const char *const *sets,
		     int nsets)
{
	int rc = 0;

	config_defaults(c);
	if (path)
		rc = config_load(c, path);
	for (int i = 0; !rc && i < nsets; i++)
		rc = config_set(c, sets[i]);
	return rc ? rc : config_validate(c, path);
}

int config_levels(const struct run_config *c, struct level_config *out)
{
	int n = c->dipaco.nlevels;

	if (n > 0) {
		if (n > CONFIG_MAX_LEVELS)
			n = CONFIG_MAX_LEVELS;
		memcpy(out, c->dipaco.levels, (size_t)n * sizeof *out);
		return n;
	}
	memset(out, 0, sizeof *out);
	snprintf(out->name, sizeof out->name, "all");
	out->modules = 1;
	out->embed = out->head = 1;
	out->nranges = 1;
	out->range[0].lo = 0;
	out->range[0].hi = c->model.n_layer - 1;
	return 1;
}

int config_holds_out(const struct run_config *c)
{
	return c->dipaco.holdout || c->dipaco.early_stop_every > 0;
}

long config_inner_steps(const struct run_config *c)
{
	if (c->dipaco.inner_steps > 0)
		return c->dipaco.inner_steps;
	return c->dipaco.phases > 0 ? c->train.steps / c->dipaco.phases : c->train.steps;
}

/* Each level well formed: the struct may have been filled by code, not by the loader. */
static int levels_check_each(const struct run_config *c, const struct where *w)
{
	const struct dipaco_config *d = &c->dipaco;
	char name[LEVEL_NAME_MAX + 1];

	if (d->nlevels < 0 || d->nlevels > CONFIG_MAX_LEVELS)
		return fail(w, "levels: %d levels is outside [0, %d]", d->nlevels,
			    CONFIG_MAX_LEVELS);
	for (int i = 0; i < d->nlevels; i++) {
		const struct level_config *lv = &d->levels[i];
		level_name_text(lv, name, sizeof name);
		if (!level_name_ok(lv->name, LEVEL_NAME_MAX))
			return fail(w, "levels.%d.name: '%s' is not a level name ([a-z][a-z0-9_]*, "
				    "at most %d characters)", i, name, LEVEL_NAME_MAX - 1);
		for (int j = 0; j < i; j++)
			if (!strcmp(d->levels[j].name, lv->name))
				return fail(w, "levels.%d.name: duplicate level name '%s' (levels.%d)",
					    i, name, j);
		if (lv->modules < 0 || lv->modules > LEVEL_MAX_MODULES)
			return fail(w, "levels.%d.modules: %d is outside [1, %d] (or path)", i,
				    lv->modules, LEVEL_MAX_MODULES);
		if (lv->nranges < 0 || lv->nranges > LEVEL_MAX_RANGES)
			return fail(w, "levels.%d.owns: %d block ranges is outside [0, %d]", i,
				    lv->nranges, LEVEL_MAX_RANGES);
		if (!lv->embed && !lv->head && !lv->nranges)
			return fail(w, "levels.%d.owns: names no group", i);
		for (int r = 0; r < lv->nranges; r++) {
			int lo = lv->range[r].lo, hi = lv->range[r].hi;
			if (lo < 0 || lo > hi)
				return fail(w, "levels.%d.owns: range h.%d-%d is not a range", i, lo,
					    hi);
			if (hi >= c->model.n_layer)
				return fail(w, "levels.%d.owns: level '%s' names block h.%d, but "
					    "model.n_layer is %d", i, name, hi, c->model.n_layer);
		}
	}
	return 0;
}

/* Every group (embed, h.0 .. h.{L-1}, head) owned by exactly one level; the first that is
 * not is named. Group g: 0 embed, 1 .. L the blocks, L + 1 head. */
static int levels_check_owners(const struct run_config *c, const struct where *w)
{
	const struct dipaco_config *d = &c->dipaco;
	int L = c->model.n_layer;
	char group[16];

	for (int g = 0; g <= L + 1; g++) {
		int owners = 0, first = -1, second = -1;
		for (int i = 0; i < d->nlevels; i++) {
			const struct level_config *lv = &d->levels[i];
			int times = g == 0 ? lv->embed != 0 : g == L + 1 ? lv->head != 0 : 0;
			for (int r = 0; g >= 1 && g <= L && r < lv->nranges; r++)
				times += lv->range[r].lo <= g - 1 && g - 1 <= lv->range[r].hi;
			for (; times > 0; times--, owners++) {
				if (first < 0)
					first = i;
				else if (second < 0)
					second = i;
			}
		}
		if (owners == 1)
			continue;
		if (g == 0)
			snprintf(group, sizeof group, "embed");
		else if (g == L + 1)
			snprintf(group, sizeof group, "head");
		else
			snprintf(group, sizeof group, "h.%d", g - 1);
		if (owners == 0)
			return fail(w, "levels: no level owns '%s'", group);
		if (first == second)
			return fail(w, "levels: '%s' is owned twice by level '%s'", group,
				    d->levels[first].name);
		return fail(w, "levels: '%s' is owned by both '%s' and '%s'", group,
			    d->levels[first].name, d->levels[second].name);
	}
	return 0;
}

/* R, the product of the routed levels' K, and P against it; then the schedule. */
static int dipaco_check(const struct run_config *c, const struct where *w)
{
	const struct dipaco_config *d = &c->dipaco;
	long R = 1;

	for (int i = 0; i < d->nlevels; i++) {
		if (d->levels[i].modules == LEVEL_PER_PATH)
			continue;
		R *= d->levels[i].modules; /* both <= 65536: no overflow before the check */
		if (R > LEVEL_MAX_MODULES)
			return fail(w, "levels: the levels' modules multiply to more than %d paths",
				    LEVEL_MAX_MODULES);
	}
	if (d->paths && d->paths % R)
		return fail(w, "dipaco.paths (%d) must be a multiple of %ld, the product of the "
			    "levels' modules", d->paths, R);
	/* P = paths or R is then <= 65536 by paths' range and the check above. */

	if (d->inner_steps > 0 && d->inner_steps > c->train.steps / d->phases)
		return fail(w, "dipaco.phases (%ld) times dipaco.inner_steps (%ld) is more than "
			    "train.steps (%ld)", d->phases, d->inner_steps, c->train.steps);
	if (d->inner_steps == 0 && d->phases > 1 && c->train.steps < d->phases)
		return fail(w, "train.steps (%ld) must be at least dipaco.phases (%ld) when "
			    "dipaco.inner_steps is 0", c->train.steps, d->phases);
	if (c->train.restart_step > 0 && c->train.restart_step >= c->train.steps)
		return fail(w, "train.restart_step (%ld) must be before train.steps (%ld)",
			    c->train.restart_step, c->train.steps);
	if (d->early_stop_every > 0 && !(d->holdout_frac > 0))
		return fail(w, "dipaco.early_stop_every (%ld) needs dipaco.holdout_frac > 0",
			    d->early_stop_every);
	if (d->holdout && !(d->holdout_frac > 0))
		return fail(w, "dipaco.holdout needs dipaco.holdout_frac > 0");
	const long P = d->paths ? d->paths : R;
	if (d->paths_per_phase > P)
		return fail(w, "dipaco.paths_per_phase (%d) is more than the %ld paths of the run",
			    d->paths_per_phase, P);
	return 0;
}

static int moe_check(const struct run_config *c, const struct where *w)
{
	const struct model_moe *m = &c->model.moe;
	if (m->experts == 0)
		return 0;
	if (m->top_k > m->experts)
		return fail(w, "moe.top_k (%d) is more than moe.experts (%d)", m->top_k,
			    m->experts);
	if (m->aux_loss == 1 && (!(m->gate_noise > 0) || m->experts < 2))
		return fail(w, "moe.aux_loss load-importance needs moe.gate_noise > 0 and "
			    "moe.experts >= 2");
	int n = model_moe_blocks(&c->model, NULL);
	if (n < 0)
		return fail(w, "%s", err_detail());
	if (n == 0)
		return fail(w, "moe.every (%d) leaves no MoE block among the %d blocks (every "
			    "block b with (b + 1) %% every == 0 is one)", m->every,
			    c->model.n_layer);
	return 0;
}

int config_validate(const struct run_config *c, const char *path)
{
	struct where w = { path, NULL, 0 };

	ERR_FORWARD(schema_check_ranges(&run_schema, c, path));
	/* Rules between keys; each new section adds its own here. */
	if (c->model.n_embd % c->model.n_head != 0)
		return fail(&w, "model.n_embd (%d) must be a multiple of model.n_head (%d)",
			    c->model.n_embd, c->model.n_head);
	ERR_FORWARD(moe_check(c, &w));
	ERR_FORWARD(levels_check_each(c, &w));
	if (c->dipaco.nlevels > 0)
		ERR_FORWARD(levels_check_owners(c, &w));
	return dipaco_check(c, &w);
}

/* The whole canonical text: every key in table order, then the levels. */
static void emit_all(const struct run_config *c, struct sink *o)
{
	schema_emit(&run_schema, c, NULL, o);
	levels_emit(c, o);
}

size_t config_dump(const struct run_config *c, char *buf, size_t n)
{
	struct sink o = { buf, n, 0, 0, 0 };

	emit_all(c, &o);
	if (buf && n)
		buf[o.len < n ? o.len : n - 1] = '\0';
	return o.len;
}

void config_hash_model(const struct run_config *c, char out[17])
{
	struct sink o = { NULL, 0, 0, 1, FNV_OFFSET };

	schema_emit(&run_schema, c, "model", &o);
	schema_emit(&run_schema, c, "moe", &o); /* nothing for a dense model */
	hash_hex(o.h, out);
}

void config_hash_all(const struct run_config *c, char out[17])
{
	struct sink o = { NULL, 0, 0, 1, FNV_OFFSET };

	emit_all(c, &o);
	hash_hex(o.h, out);
}

size_t config_yaml(const struct run_config *c, char *buf, size_t n)
{
	struct sink o = { buf, n, 0, 0, 0 };
	const char *section = "";

	for (size_t i = 0; i < run_schema.n; i++) {
		const struct cfg_key *key = &run_schema.keys[i];
		if (key_unset(&run_schema, key, c))
			continue;
		if (strcmp(key->section, section)) {
			section = key->section;
			sink_str(&o, section);
			sink_str(&o, ":\n");
		}
		sink_str(&o, "  ");
		sink_str(&o, key->key);
		sink_str(&o, ": ");
		sink_value(&o, key, c, 1);
		sink_str(&o, "\n");
	}
	if (levels_count(c) > 0)
		sink_str(&o, "levels:\n");
	for (int i = 0; i < levels_count(c); i++) {
		struct level_text t;
		level_text(&c->dipaco.levels[i], &t);
		sink_str(&o, "  - name: ");
		sink_quoted(&o, t.name);
		sink_str(&o, "\n    owns: ");
		sink_quoted(&o, t.owns);
		sink_str(&o, "\n    modules: ");
		sink_str(&o, t.modules);
		sink_str(&o, "\n");
	}
	if (buf && n)
		buf[o.len < n ? o.len : n - 1] = '\0';
	return o.len;
}
