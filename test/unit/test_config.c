/* test_config.c - YAML configs: hand-read values, every error case with its line and key,
 * overrides, validation, the canonical dump and its FNV-1a hashes, and the man page's key
 * list against the schema table.
 *
 * The test includes config.c itself (instead of only linking libcore.a) so that it can also
 * check the schema table row by row and exercise the value types no run_config field uses
 * yet (bool, string, enum) through a test-only schema. The public functions it calls are the
 * same code as in libcore.a.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/config.c"

/* ---- helpers ------------------------------------------------------------------------------ */

/* Write text to a fresh temporary file; the path goes to path (at least 64 bytes). */
static void write_temp(const char *text, size_t len, char *path)
{
	const char *dir = getenv("TMPDIR");

	snprintf(path, 64, "%.40s/cfgtestXXXXXX.yaml", dir && *dir ? dir : "/tmp");
	int fd = mkstemps(path, 5);
	cr_assert(fd >= 0, "mkstemps %s failed", path);
	cr_assert_eq(write(fd, text, len), (ssize_t)len, "short write to %s", path);
	close(fd);
}

/* Load text over c; returns the code, leaving err_detail() for the caller. */
static int load_text(struct run_config *c, const char *text)
{
	char path[64];

	write_temp(text, strlen(text), path);
	err_clear();
	int rc = config_load(c, path);
	if (rc)
		cr_expect_str_eq(err_file(), path, "error names the file; yaml:\n%s", text);
	unlink(path);
	return rc;
}

/* FNV-1a 64, written out from the definition (offset basis, xor byte, multiply by prime). */
static uint64_t ref_fnv1a(const char *s, size_t n)
{
	uint64_t h = 14695981039346656037ull;

	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 1099511628211ull;
	}
	return h;
}

static void check_tiny_values(const struct run_config *c, const char *what)
{
	/* Read by hand from configs/gpt-tiny.yaml. */
	cr_expect_eq(c->model.n_layer, 4, "%s: n_layer", what);
	cr_expect_eq(c->model.n_embd, 256, "%s: n_embd", what);
	cr_expect_eq(c->model.n_head, 4, "%s: n_head", what);
	cr_expect_eq(c->model.seq_len, 256, "%s: seq_len", what);
	cr_expect_eq(c->model.vocab_size, 256, "%s: vocab_size", what);
	cr_expect_eq(c->train.batch_size, 8, "%s: batch_size", what);
	cr_expect_eq(c->train.steps, 2000, "%s: steps", what);
	cr_expect_eq(c->train.lr, 3.0e-3, "%s: lr", what);
	cr_expect_eq(c->train.warmup_steps, 100, "%s: warmup_steps", what);
	cr_expect_eq(c->train.min_lr_frac, 0.1, "%s: min_lr_frac", what);
	cr_expect_eq(c->train.weight_decay, 0.1, "%s: weight_decay", what);
	cr_expect_eq(c->train.beta1, 0.9, "%s: beta1", what);
	cr_expect_eq(c->train.beta2, 0.95, "%s: beta2", what);
	cr_expect_eq(c->train.eps, 1.0e-8, "%s: eps", what);
	cr_expect_eq(c->train.grad_clip, 1.0, "%s: grad_clip", what);
	cr_expect_eq(c->train.eval_every, 100, "%s: eval_every", what);
	cr_expect_eq(c->train.eval_batches, 16, "%s: eval_batches", what);
	cr_expect_eq(c->train.checkpoint_every, 500, "%s: checkpoint_every", what);
	cr_expect_eq(c->train.seed, 1, "%s: seed", what);
}

/* ---- loading the shipped configs ---------------------------------------------------------- */

Test(config, gpt_tiny_file_has_hand_read_values)
{
	struct run_config c;

	/* not the defaults: every value of the sections in the file must come from it */
	config_defaults(&c);
	memset(&c.model, 0, sizeof c.model);
	memset(&c.train, 0, sizeof c.train);
	int rc = config_load(&c, "configs/gpt-tiny.yaml");
	cr_assert_eq(rc, 0, "load configs/gpt-tiny.yaml (run from the repository root): %s",
		     err_detail());
	check_tiny_values(&c, "gpt-tiny.yaml");
	cr_expect_eq(config_validate(&c, "configs/gpt-tiny.yaml"), 0, "%s", err_detail());
}

Test(config, defaults_are_gpt_tiny)
{
	struct run_config c;

	memset(&c, 0x5a, sizeof c);
	config_defaults(&c);
	check_tiny_values(&c, "defaults");
	cr_expect_eq(config_validate(&c, NULL), 0, "%s", err_detail());
}

Test(config, gpt_small_test_file)
{
	struct run_config c;

	config_defaults(&c);
	memset(&c.model, 0, sizeof c.model);
	memset(&c.train, 0, sizeof c.train);
	int rc = config_load(&c, "configs/gpt-small-test.yaml");
	cr_assert_eq(rc, 0, "load configs/gpt-small-test.yaml: %s", err_detail());
	cr_expect_eq(c.model.n_layer, 2);
	cr_expect_eq(c.model.n_embd, 32);
	cr_expect_eq(c.model.n_head, 2);
	cr_expect_eq(c.model.seq_len, 32);
	cr_expect_eq(c.model.vocab_size, 256);
	cr_expect_eq(c.train.batch_size, 4);
	cr_expect_eq(c.train.steps, 200);
	cr_expect_eq(c.train.lr, 1e-3);
	cr_expect_eq(c.train.warmup_steps, 10);
	cr_expect_eq(c.train.eval_every, 50);
	cr_expect_eq(c.train.eval_batches, 2);
	cr_expect_eq(c.train.checkpoint_every, 100);
	cr_expect_eq(c.train.seed, 1);
	cr_expect_eq(config_validate(&c, NULL), 0, "%s", err_detail());
}

Test(config, partial_file_keeps_other_defaults)
{
	struct run_config c, want;

	config_defaults(&c);
	config_defaults(&want);
	cr_assert_eq(load_text(&c, "train:\n  steps: 77\n  lr: 1e-2\nmodel: {n_layer: 6}\n"), 0,
		     "%s", err_detail());
	want.train.steps = 77;
	want.train.lr = 1e-2;
	want.model.n_layer = 6;
	cr_expect_eq(memcmp(&c, &want, sizeof c), 0, "only the three keys change");
}

Test(config, crlf_and_byte_order_mark)
{
	struct run_config c;

	config_defaults(&c);
	cr_assert_eq(load_text(&c, "\xef\xbb\xbfmodel:\r\n  n_layer: 3\r\ntrain:\r\n"
				   "  lr: 0.5\r\n"), 0, "%s", err_detail());
	cr_expect_eq(c.model.n_layer, 3);
	cr_expect_eq(c.train.lr, 0.5);
	cr_expect_eq(load_text(&c, "model:\r\n  n_layer: 3\r\n  n_layer: 4\r\n"), CORE_ECONFIG);
	cr_expect_str_eq(err_detail(), "line 3: duplicate key 'model.n_layer' (first at line 2)",
			 "lines counted with CRLF endings");
}

/* A config that sets nothing is refused (dpc-config(5)): an empty file, -c /dev/null or a file
 * of comments is far more often a mistake than a request for a default 2000-step run. */
Test(config, empty_files_are_refused)
{
	static const char *const texts[] = {
		"", "\n", "# only a comment\n", "---\n", "--- ~\n", "{}\n", "model:\n",
		"model:\ntrain: {}\n",
	};

	for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
		struct run_config c, d;
		config_defaults(&c);
		c.train.steps = 5; /* a value loaded before: a refused load leaves it */
		d = c;
		int rc = load_text(&c, texts[i]);
		cr_expect_eq(rc, CORE_ECONFIG, "yaml '%s': returned %d", texts[i], rc);
		cr_expect_str_eq(err_detail(),
				 "holds no settings (name at least one key)",
				 "yaml '%s'", texts[i]);
		cr_expect_eq(memcmp(&c, &d, sizeof c), 0, "yaml '%s' changed a value", texts[i]);
	}
	/* /dev/null itself, the usual way to write an empty config */
	struct run_config c;
	config_defaults(&c);
	cr_expect_eq(config_load(&c, "/dev/null"), CORE_ECONFIG);
	cr_expect_str_eq(err_file(), "/dev/null");
	/* one key, or the levels alone, is enough */
	static const char *const one[] = { "train:\n  steps: 7\n", "levels: []\n" };
	for (size_t i = 0; i < sizeof one / sizeof one[0]; i++) {
		config_defaults(&c);
		cr_expect_eq(load_text(&c, one[i]), 0, "yaml '%s': %s", one[i], err_detail());
	}
}

/* A config may come from a pipe (-c <(cat x.yaml) is /dev/fd/N): read as a stream. */
Test(config, config_from_a_fifo)
{
	char path[64];
	struct run_config c;
	const char *dir = getenv("TMPDIR");

	snprintf(path, sizeof path, "%.40s/cfgfifo.%d", dir && *dir ? dir : "/tmp", (int)getpid());
	unlink(path);
	cr_assert_eq(mkfifo(path, 0600), 0);
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		alarm(20); /* never outlive a failed test */
		FILE *fp = fopen(path, "w");
		_exit(fp && fputs("train:\n  steps: 77\n", fp) >= 0 && fclose(fp) == 0 ? 0 : 1);
	}
	config_defaults(&c);
	int rc = config_load(&c, path);
	int st;
	waitpid(pid, &st, 0);
	unlink(path);
	cr_assert_eq(rc, 0, "%s", err_detail());
	cr_expect_eq(c.train.steps, 77);
}

Test(config, value_limits_accepted)
{
	struct run_config c;

	config_defaults(&c);
	cr_assert_eq(load_text(&c, "model:\n  vocab_size: 2147483647\n  n_layer: 1024\n"
				   "train:\n  seed: 18446744073709551615\n  steps: 1000000000000\n"
				   "  lr: 10\n  beta1: 0\n  min_lr_frac: 1\n  eps: 1e-300\n"
				   "  warmup_steps: +5\n  grad_clip: 0\n  eval_every: 0\n"),
		     0, "%s", err_detail());
	cr_expect_eq(c.model.vocab_size, 2147483647);
	cr_expect_eq(c.model.n_layer, 1024);
	cr_expect_eq(c.train.seed, UINT64_MAX);
	cr_expect_eq(c.train.steps, 1000000000000L);
	cr_expect_eq(c.train.lr, 10.0);
	cr_expect_eq(c.train.beta1, 0.0);
	cr_expect_eq(c.train.min_lr_frac, 1.0);
	cr_expect_eq(c.train.eps, 1e-300);
	cr_expect_eq(c.train.warmup_steps, 5);
	cr_expect_eq(c.train.grad_clip, 0.0);
}

/* ---- errors: code, line, key ------------------------------------------------------------- */

struct bad_case {
	const char *yaml;
	const char *detail; /* the whole expected detail, with its line number */
};

/* Lines counted by hand in each text. */
static const struct bad_case bad_cases[] = {
	/* the example of the task, with lr on line 7 */
	{ "model:\n  n_layer: 4\n  n_embd: 256\n  n_head: 4\ntrain:\n  steps: 10\n  lr: -1\n",
	  "line 7: train.lr: -1 is outside (0, 10]" },
	/* malformed yaml */
	{ "model:\n  n_layer: 4\n  n_embd: 8: 9\n",
	  "line 3: malformed yaml: mapping values are not allowed in this context" },
	{ "model:\n  n_layer: 4\n\tn_embd: 8\n",
	  "line 3: malformed yaml: found a tab character that violates indentation "
	  "(while scanning a plain scalar)" },
	{ "train:\n  lr: \"0.1\n  steps: 4\n",
	  "line 4: malformed yaml: found unexpected end of stream "
	  "(while scanning a quoted scalar)" },
	{ "model:\n  n_layer: 4\n  n_embd: \xff\n",
	  "line 3: malformed yaml: invalid leading UTF-8 octet" },
	/* top level */
	{ "- model\n- train\n",
	  "line 1: top level is not a mapping of sections (found a sequence)" },
	{ "\n\nhello\n", "line 3: top level is not a mapping of sections (found a scalar)" },
	{ "model:\n  n_layer: 4\n---\nmodel:\n  n_layer: 5\n",
	  "line 3: more than one yaml document; a config is one document" },
	/* sections */
	{ "modle:\n  n_layer: 4\n", "line 1: unknown section 'modle' (did you mean 'model'?)" },
	{ "model:\n  n_layer: 4\nxyzzy:\n  bar: 1\n", "line 3: unknown section 'xyzzy'" },
	{ "lr: 0.1\n", "line 1: unknown section 'lr' (did you mean 'train.lr'?)" },
	{ "model: 4\n", "line 1: section 'model' must be a mapping of keys, found a scalar" },
	{ "model:\n  - 4\n",
	  "line 2: section 'model' must be a mapping of keys, found a sequence" },
	{ "model:\n  n_layer: 4\ntrain:\n  lr: 0.1\nmodel:\n  n_head: 2\n",
	  "line 5: duplicate section 'model' (first at line 1)" },
	{ "? [a, b]\n: 1\n", "line 1: a section name must be a scalar, found a sequence" },
	/* keys */
	{ "train:\n  lr: 0.1\n  setps: 5\n",
	  "line 3: unknown key 'train.setps' (did you mean 'train.steps'?)" },
	{ "train:\n  lr: 0.1\n  foo_bar_baz: 5\n", "line 3: unknown key 'train.foo_bar_baz'" },
	{ "model:\n  lr: 0.1\n", "line 2: unknown key 'model.lr' (did you mean 'train.lr'?)" },
	{ "model:\n  n_layers: 4\n",
	  "line 2: unknown key 'model.n_layers' (did you mean 'model.n_layer'?)" },
	{ "train:\n  lr: 0.1\n  steps: 4\n  lr: 0.2\n",
	  "line 4: duplicate key 'train.lr' (first at line 2)" },
	/* non-scalar values */
	{ "train:\n  lr:\n    a: 1\n",
	  "line 2: train.lr: expected a scalar value, found a mapping" },
	{ "train:\n  steps: [1, 2]\n",
	  "line 2: train.steps: expected a scalar value, found a sequence" },
	/* wrong types */
	{ "train:\n  lr: abc\n", "line 2: train.lr: 'abc' is not a number" },
	{ "train:\n  steps: abc\n", "line 2: train.steps: 'abc' is not a number" },
	{ "train:\n  steps: 1.5\n", "line 2: train.steps: '1.5' is not an integer" },
	{ "model:\n  n_layer: 1e3\n", "line 2: model.n_layer: '1e3' is not an integer" },
	{ "model:\n  n_layer: 010\n", "line 2: model.n_layer: '010' is not an integer" },
	{ "model:\n  n_layer: 0x10\n", "line 2: model.n_layer: '0x10' is not a number" },
	{ "train:\n  lr: 0x1p-3\n", "line 2: train.lr: '0x1p-3' is not a number" },
	{ "train:\n  lr: \"0.1\"\n",
	  "line 2: train.lr: \"0.1\" is a quoted string, not a number; remove the quotes" },
	{ "train:\n  lr:\n  steps: 3\n", "line 2: train.lr: missing value" },
	{ "train:\n  seed: ~\n", "line 2: train.seed: missing value" },
	{ "train:\n  lr: 1 2\n", "line 2: train.lr: '1 2' is not a number" },
	/* ranges */
	{ "model:\n  n_layer: 0\n", "line 2: model.n_layer: 0 is outside [1, 1024]" },
	{ "model:\n  n_layer: 1025\n", "line 2: model.n_layer: 1025 is outside [1, 1024]" },
	{ "model:\n  n_embd: 65537\n", "line 2: model.n_embd: 65537 is outside [1, 65536]" },
	{ "model:\n  seq_len: 1048577\n",
	  "line 2: model.seq_len: 1048577 is outside [1, 1048576]" },
	{ "model:\n  vocab_size: 1\n", "line 2: model.vocab_size: 1 is outside [2, 2147483647]" },
	{ "model:\n  vocab_size: 2147483648\n",
	  "line 2: model.vocab_size: 2147483648 is outside [2, 2147483647]" },
	{ "train:\n  batch_size: 65537\n",
	  "line 2: train.batch_size: 65537 is outside [1, 65536]" },
	{ "train:\n  steps: 1000000000001\n",
	  "line 2: train.steps: 1000000000001 is outside [0, 1000000000000]" },
	{ "train:\n  steps: 99999999999999999999999\n",
	  "line 2: train.steps: 99999999999999999999999 is outside [0, 1000000000000]" },
	{ "train:\n  warmup_steps: 9223372036854775808\n",
	  "line 2: train.warmup_steps: 9223372036854775808 is too large" },
	{ "train:\n  warmup_steps: 9223372036854775807\n  lr: 0\n",
	  "line 3: train.lr: 0 is outside (0, 10]" },
	{ "train:\n  lr: 10.5\n", "line 2: train.lr: 10.5 is outside (0, 10]" },
	{ "train:\n  warmup_steps: -1\n", "line 2: train.warmup_steps: -1 must be >= 0" },
	{ "train:\n  min_lr_frac: 1.01\n", "line 2: train.min_lr_frac: 1.01 is outside [0, 1]" },
	{ "train:\n  weight_decay: -0.1\n",
	  "line 2: train.weight_decay: -0.1 is outside [0, 10]" },
	{ "train:\n  beta1: 1\n", "line 2: train.beta1: 1 is outside [0, 1)" },
	{ "train:\n  beta2: 1.0\n", "line 2: train.beta2: 1.0 is outside [0, 1)" },
	{ "train:\n  eps: 0\n", "line 2: train.eps: 0 is outside (0, 1)" },
	{ "train:\n  eps: 1e-400\n", "line 2: train.eps: 1e-400 is outside (0, 1)" },
	{ "train:\n  grad_clip: -1\n", "line 2: train.grad_clip: -1 must be >= 0" },
	{ "train:\n  eval_every: -1\n", "line 2: train.eval_every: -1 must be >= 0" },
	{ "train:\n  eval_batches: 0\n", "line 2: train.eval_batches: 0 must be >= 1" },
	{ "train:\n  checkpoint_every: -5\n", "line 2: train.checkpoint_every: -5 must be >= 0" },
	{ "train:\n  seed: -1\n", "line 2: train.seed: -1 is outside [0, 18446744073709551615]" },
	{ "train:\n  seed: 18446744073709551616\n",
	  "line 2: train.seed: 18446744073709551616 is outside [0, 18446744073709551615]" },
	/* non-finite doubles */
	{ "train:\n  lr: .nan\n", "line 2: train.lr: '.nan' is not a finite number" },
	{ "train:\n  lr: .inf\n", "line 2: train.lr: '.inf' is not a finite number" },
	{ "train:\n  grad_clip: -.Inf\n",
	  "line 2: train.grad_clip: '-.Inf' is not a finite number" },
	{ "train:\n  lr: nan\n", "line 2: train.lr: 'nan' is not a finite number" },
	{ "train:\n  lr: 1e999\n", "line 2: train.lr: '1e999' is not a finite number" },
	/* anchors, aliases, tags */
	{ "train:\n  lr: &x 0.1\n  weight_decay: *x\n",
	  "line 2: yaml anchors are not supported ('&x'); write the value out" },
	{ "model: &m\n  n_layer: 4\n",
	  "line 1: yaml anchors are not supported ('&m'); write the value out" },
	{ "train:\n  lr: 0.1\n  weight_decay: *x\n",
	  "line 3: yaml aliases are not supported ('*x'); write the value out" },
	{ "train:\n  lr: !!float 0.1\n",
	  "line 2: yaml tags are not supported ('tag:yaml.org,2002:float')" },
	/* the dipaco section's ranges */
	{ "dipaco:\n  phases: 0\n", "line 2: dipaco.phases: 0 must be >= 1" },
	{ "dipaco:\n  inner_steps: -1\n", "line 2: dipaco.inner_steps: -1 must be >= 0" },
	{ "dipaco:\n  paths: 65537\n", "line 2: dipaco.paths: 65537 is outside [0, 65536]" },
	{ "dipaco:\n  outer_lr: 0\n", "line 2: dipaco.outer_lr: 0 is outside (0, 10]" },
	{ "dipaco:\n  outer_momentum: 1\n",
	  "line 2: dipaco.outer_momentum: 1 is outside [0, 1)" },
	{ "dipaco:\n  nesterov: yes\n", "line 2: dipaco.nesterov: 'yes' is not true or false" },
	{ "dipaco:\n  early_stop_every: -1\n",
	  "line 2: dipaco.early_stop_every: -1 must be >= 0" },
	{ "dipaco:\n  holdout_frac: 0.6\n",
	  "line 2: dipaco.holdout_frac: 0.6 is outside [0, 0.5]" },
	{ "dipaco:\n  rescale: true\n  levels: []\n",
	  "line 3: unknown key 'dipaco.levels' (levels is a top-level section of its own)" },
	/* levels: the section itself */
	{ "level:\n  - name: a\n", "line 1: unknown section 'level' (did you mean 'levels'?)" },
	{ "levels: 3\n",
	  "line 1: levels must be a sequence of levels (- name: ...), found a scalar" },
	{ "levels:\n  lower:\n    owns: embed\n    modules: 2\n",
	  "line 2: levels must be a sequence of levels (- name: ...), found a mapping" },
	{ "levels:\n  - name: a\n    owns: embed h.0-3 head\n    modules: 1\nlevels: []\n",
	  "line 5: duplicate section 'levels' (first at line 1)" },
	{ "levels:\n  - lower\n",
	  "line 2: levels.0 must be a mapping of name, owns and modules, found a scalar" },
	{ "levels:\n  - name: a\n    owns: embed h.0-3 head\n    modules: 1\n  - [b]\n",
	  "line 5: levels.1 must be a mapping of name, owns and modules, found a sequence" },
	/* level keys */
	{ "levels:\n  - name: a\n    own: embed\n",
	  "line 3: unknown key 'levels.0.own' (did you mean 'levels.0.owns'?)" },
	{ "levels:\n  - name: a\n    owns: embed h.0-3 head\n    modules: 1\n"
	  "  - name: b\n    module: 2\n",
	  "line 6: unknown key 'levels.1.module' (did you mean 'levels.1.modules'?)" },
	{ "levels:\n  - name: a\n    experts: 2\n", "line 3: unknown key 'levels.0.experts'" },
	{ "levels:\n  - name: a\n    owns: embed\n    name: b\n",
	  "line 4: duplicate key 'levels.0.name' (first at line 2)" },
	{ "levels:\n  - name: a\n    owns: embed h.0-3 head\n",
	  "line 2: levels.0: missing key 'modules'" },
	{ "levels:\n  - modules: 1\n    owns: embed h.0-3 head\n",
	  "line 2: levels.0: missing key 'name'" },
	{ "levels:\n  - {name: a, modules: 1}\n", "line 2: levels.0: missing key 'owns'" },
	{ "levels:\n  - ? [x]\n    : 1\n",
	  "line 2: a key of levels.0 must be a scalar, found a sequence" },
	/* name */
	{ "levels:\n  - name: lower\n    owns: embed h.0-1\n    modules: 2\n"
	  "  - name: lower\n    owns: h.2-3 head\n    modules: 2\n",
	  "line 5: levels.1.name: duplicate level name 'lower' (first at line 2)" },
	{ "levels:\n  - name: Lower\n",
	  "line 2: levels.0.name: 'Lower' is not a level name ([a-z][a-z0-9_]*, at most 31 "
	  "characters)" },
	{ "levels:\n  - name: 1st\n",
	  "line 2: levels.0.name: '1st' is not a level name ([a-z][a-z0-9_]*, at most 31 "
	  "characters)" },
	{ "levels:\n  - name: up-per\n",
	  "line 2: levels.0.name: 'up-per' is not a level name ([a-z][a-z0-9_]*, at most 31 "
	  "characters)" },
	{ "levels:\n  - name: \"\"\n",
	  "line 2: levels.0.name: '' is not a level name ([a-z][a-z0-9_]*, at most 31 "
	  "characters)" },
	/* 32 characters */
	{ "levels:\n  - name: abcdefghij_abcdefghij_abcdefghij\n",
	  "line 2: levels.0.name: 'abcdefghij_abcdefghij_abcdefghij' is not a level name "
	  "([a-z][a-z0-9_]*, at most 31 characters)" },
	{ "levels:\n  - name:\n    owns: embed\n", "line 2: levels.0.name: missing value" },
	{ "levels:\n  - name: [a]\n",
	  "line 2: levels.0.name: expected a scalar value, found a sequence" },
	/* owns */
	{ "levels:\n  - name: a\n    owns: embed h.x\n",
	  "line 3: levels.0.owns: 'h.x' is not a group (embed, head, h.I or h.I-J)" },
	{ "levels:\n  - name: a\n    owns: embed, blocks\n",
	  "line 3: levels.0.owns: 'blocks' is not a group (embed, head, h.I or h.I-J)" },
	{ "levels:\n  - name: a\n    owns: h.01\n",
	  "line 3: levels.0.owns: 'h.01' is not a group (embed, head, h.I or h.I-J)" },
	{ "levels:\n  - name: a\n    owns: h.1-\n",
	  "line 3: levels.0.owns: 'h.1-' is not a group (embed, head, h.I or h.I-J)" },
	{ "levels:\n  - name: a\n    owns: h.-1\n",
	  "line 3: levels.0.owns: 'h.-1' is not a group (embed, head, h.I or h.I-J)" },
	{ "levels:\n  - name: a\n    owns: H.1\n",
	  "line 3: levels.0.owns: 'H.1' is not a group (embed, head, h.I or h.I-J)" },
	{ "levels:\n  - name: a\n    owns: h.1-2-3\n",
	  "line 3: levels.0.owns: 'h.1-2-3' is not a group (embed, head, h.I or h.I-J)" },
	{ "levels:\n  - name: a\n    owns: h.12345678\n",
	  "line 3: levels.0.owns: 'h.12345678' is not a group (embed, head, h.I or h.I-J)" },
	{ "levels:\n  - name: a\n    owns: [embed, lm_head]\n",
	  "line 3: levels.0.owns: 'lm_head' is not a group (embed, head, h.I or h.I-J)" },
	{ "levels:\n  - name: a\n    owns:\n      - embed\n      - h.0-1x\n",
	  "line 5: levels.0.owns: 'h.0-1x' is not a group (embed, head, h.I or h.I-J)" },
	{ "levels:\n  - name: a\n    owns: [embed head]\n",
	  "line 3: levels.0.owns: 'embed head' is not a group (embed, head, h.I or h.I-J)" },
	{ "levels:\n  - name: a\n    owns: [embed, {h: 1}]\n",
	  "line 3: levels.0.owns: expected a group word, found a mapping" },
	{ "levels:\n  - name: a\n    owns:\n      embed: 1\n",
	  "line 3: levels.0.owns: expected a scalar value or a sequence, found a mapping" },
	{ "levels:\n  - name: a\n    owns: h.3-1\n",
	  "line 3: levels.0.owns: range 'h.3-1' runs backwards (3 > 1)" },
	{ "levels:\n  - name: a\n    owns: [embed, h.0-1, h.2-1]\n",
	  "line 3: levels.0.owns: range 'h.2-1' runs backwards (2 > 1)" },
	{ "levels:\n  - name: a\n    owns: head embed head\n",
	  "line 3: levels.0.owns: 'head' is named twice" },
	{ "levels:\n  - name: a\n    owns: \" , \"\n", "line 3: levels.0.owns: names no group" },
	{ "levels:\n  - name: a\n    owns: []\n", "line 3: levels.0.owns: names no group" },
	{ "levels:\n  - name: a\n    owns:\n    modules: 1\n",
	  "line 3: levels.0.owns: missing value" },
	{ "levels:\n  - name: a\n    owns: h.0 h.0 h.0 h.0 h.0 h.0 h.0 h.0 h.0 h.0 h.0 h.0 "
	  "h.0 h.0 h.0 h.0 h.0\n",
	  "line 3: levels.0.owns: more than 16 block ranges" },
	/* modules */
	{ "levels:\n  - name: a\n    owns: embed h.0-3 head\n    modules: 0\n",
	  "line 4: levels.0.modules: 0 is outside [1, 65536] (write path for one module per "
	  "path)" },
	{ "levels:\n  - name: a\n    owns: embed h.0-3 head\n    modules: -2\n",
	  "line 4: levels.0.modules: -2 is outside [1, 65536] (write path for one module per "
	  "path)" },
	{ "levels:\n  - name: a\n    owns: embed h.0-3 head\n    modules: 65537\n",
	  "line 4: levels.0.modules: 65537 is outside [1, 65536] (write path for one module per "
	  "path)" },
	{ "levels:\n  - name: a\n    owns: embed h.0-3 head\n    modules: paths\n",
	  "line 4: levels.0.modules: 'paths' is neither an integer nor the word path "
	  "(did you mean 'path'?)" },
	{ "levels:\n  - name: a\n    owns: embed h.0-3 head\n    modules: 2.0\n",
	  "line 4: levels.0.modules: '2.0' is neither an integer nor the word path" },
	{ "levels:\n  - name: a\n    owns: embed h.0-3 head\n    modules: \"2\"\n",
	  "line 4: levels.0.modules: \"2\" is a quoted string, not a number; remove the quotes" },
	{ "levels:\n  - name: a\n    owns: embed h.0-3 head\n    modules: ~\n",
	  "line 4: levels.0.modules: missing value" },
	/* anchors, aliases and tags inside levels */
	{ "levels: &l\n  - name: a\n",
	  "line 1: yaml anchors are not supported ('&l'); write the value out" },
	{ "levels:\n  - name: &n a\n",
	  "line 2: yaml anchors are not supported ('&n'); write the value out" },
	{ "levels:\n  - name: a\n    owns: [embed, *x]\n",
	  "line 3: yaml aliases are not supported ('*x'); write the value out" },
	{ "levels:\n  - name: a\n    owns: embed h.0-3 head\n    modules: !!int 2\n",
	  "line 4: yaml tags are not supported ('tag:yaml.org,2002:int')" },
};

Test(config, every_error_names_line_and_key)
{
	for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
		const struct bad_case *b = &bad_cases[i];
		struct run_config c, before;

		config_defaults(&c);
		c.train.steps = 12345; /* something a failed load must not reset */
		before = c;
		int rc = load_text(&c, b->yaml);
		cr_expect_eq(rc, CORE_ECONFIG, "case %zu: yaml:\n%s\ngave %d (%s)", i, b->yaml, rc,
			     err_detail());
		cr_expect_str_eq(err_detail(), b->detail,
				 "case %zu: yaml:\n%s\ngot:  %s\nwant: %s", i, b->yaml,
				 err_detail(), b->detail);
		cr_expect_eq(memcmp(&c, &before, sizeof c), 0,
			     "case %zu: a failed load changed the config; yaml:\n%s", i, b->yaml);
	}
}

Test(config, program_message_format)
{
	struct run_config c;
	char msg[1200], path[64];
	const char *text = "model:\n  n_layer: 4\n  n_embd: 256\n  n_head: 4\ntrain:\n  steps: 10\n"
			   "  lr: -1\n";

	config_defaults(&c);
	write_temp(text, strlen(text), path);
	int rc = config_load(&c, path);
	unlink(path);
	cr_assert_eq(rc, CORE_ECONFIG);
	err_format(msg, sizeof msg, rc);
	char want[200];
	snprintf(want, sizeof want, "'%s': line 7: train.lr: -1 is outside (0, 10]", path);
	cr_expect_str_eq(msg, want);
	cr_expect_eq(err_exit_status(rc), 2);
}

Test(config, missing_file_is_not_found)
{
	struct run_config c;

	config_defaults(&c);
	int rc = config_load(&c, "/nonexistent/dir/x.yaml");
	cr_expect_eq(rc, CORE_ENOTFOUND, "got %d", rc);
	cr_expect_str_eq(err_file(), "/nonexistent/dir/x.yaml");
	cr_expect(strstr(err_detail(), "no such file") != NULL, "detail: %s", err_detail());
	/* a directory cannot be read: an i/o error */
	rc = config_load(&c, "/");
	cr_expect_eq(rc, CORE_EIO, "got %d", rc);
}

Test(config, nul_byte_in_value)
{
	struct run_config c;
	char path[64];
	static const char text[] = "train:\n  lr: \"0.1\\x00\"\n";

	config_defaults(&c);
	write_temp(text, sizeof text - 1, path);
	int rc = config_load(&c, path);
	unlink(path);
	cr_expect_eq(rc, CORE_ECONFIG);
	cr_expect_str_eq(err_detail(), "line 2: train.lr: value contains a nul byte");
}

/* ---- overrides ---------------------------------------------------------------------------- */

Test(config, overrides_apply)
{
	struct run_config c, want;

	config_defaults(&c);
	config_defaults(&want);
	cr_assert_eq(config_set(&c, "train.steps=100"), 0, "%s", err_detail());
	cr_assert_eq(config_set(&c, "train.lr=1e-2"), 0, "%s", err_detail());
	cr_assert_eq(config_set(&c, "model.n_layer=2"), 0, "%s", err_detail());
	cr_assert_eq(config_set(&c, "train.seed=18446744073709551615"), 0, "%s", err_detail());
	cr_assert_eq(config_set(&c, "train.steps=200"), 0, "a later override wins: %s",
		     err_detail());
	want.train.steps = 200;
	want.train.lr = 1e-2;
	want.model.n_layer = 2;
	want.train.seed = UINT64_MAX;
	cr_expect_eq(memcmp(&c, &want, sizeof c), 0);
}

static const struct bad_case bad_overrides[] = {
	{ "train.lr=-1", "override 'train.lr=-1': train.lr: -1 is outside (0, 10]" },
	{ "train.setps=1", "override 'train.setps=1': unknown key 'train.setps' "
			   "(did you mean 'train.steps'?)" },
	{ "steps=1", "override 'steps=1': unknown key 'steps' (did you mean 'train.steps'?)" },
	{ "trian.steps=1", "override 'trian.steps=1': unknown section 'trian' "
			   "(did you mean 'train'?)" },
	{ "train.steps", "override 'train.steps': expected section.key=value" },
	{ "=5", "override '=5': expected section.key=value" },
	{ "train.steps=", "override 'train.steps=': train.steps: missing value" },
	{ "train.lr=abc", "override 'train.lr=abc': train.lr: 'abc' is not a number" },
	{ "train.steps=1.5", "override 'train.steps=1.5': train.steps: '1.5' is not an integer" },
	{ "train.steps= 5", "override 'train.steps= 5': train.steps: ' 5' is not a number" },
	{ "train.lr=nan", "override 'train.lr=nan': train.lr: 'nan' is not a finite number" },
	{ "train.lr=-inf", "override 'train.lr=-inf': train.lr: '-inf' is not a finite number" },
	{ "model.n_head=0", "override 'model.n_head=0': model.n_head: 0 is outside [1, 1024]" },
};

Test(config, override_errors)
{
	for (size_t i = 0; i < sizeof bad_overrides / sizeof bad_overrides[0]; i++) {
		struct run_config c, d;
		config_defaults(&c);
		config_defaults(&d);
		err_clear();
		int rc = config_set(&c, bad_overrides[i].yaml);
		cr_expect_eq(rc, CORE_ECONFIG, "override '%s' gave %d", bad_overrides[i].yaml, rc);
		cr_expect_str_eq(err_detail(), bad_overrides[i].detail, "override '%s'\ngot:  %s",
				 bad_overrides[i].yaml, err_detail());
		cr_expect_str_eq(err_file(), "", "an override names no file");
		cr_expect_eq(memcmp(&c, &d, sizeof c), 0, "override '%s' changed the config",
			     bad_overrides[i].yaml);
	}
}

/* ---- validate ----------------------------------------------------------------------------- */

Test(config, validate_cross_field_and_ranges)
{
	struct run_config c;

	config_defaults(&c);
	c.train.warmup_steps = 5000; /* more than steps: allowed */
	cr_expect_eq(config_validate(&c, "x.yaml"), 0, "%s", err_detail());

	config_defaults(&c);
	c.model.n_head = 3;
	cr_expect_eq(config_validate(&c, "x.yaml"), CORE_ECONFIG);
	cr_expect_str_eq(err_detail(), "model.n_embd (256) must be a multiple of model.n_head (3)");
	cr_expect_str_eq(err_file(), "x.yaml");

	config_defaults(&c);
	c.train.lr = -1;
	cr_expect_eq(config_validate(&c, NULL), CORE_ECONFIG);
	cr_expect_str_eq(err_detail(), "train.lr: -1 is outside (0, 10]");

	config_defaults(&c);
	c.train.beta2 = NAN;
	cr_expect_eq(config_validate(&c, NULL), CORE_ECONFIG);
	cr_expect_str_eq(err_detail(), "train.beta2: nan is not a finite number");

	config_defaults(&c);
	c.train.eval_batches = 0;
	cr_expect_eq(config_validate(&c, NULL), CORE_ECONFIG);
	cr_expect_str_eq(err_detail(), "train.eval_batches: 0 must be >= 1");

	config_defaults(&c);
	c.model.n_layer = 0;
	cr_expect_eq(config_validate(&c, NULL), CORE_ECONFIG);
	cr_expect_str_eq(err_detail(), "model.n_layer: 0 is outside [1, 1024]");
}

/* ---- dipaco: and levels: ------------------------------------------------------------------ */

/* A level as read by hand from a file. */
struct want_level {
	const char *name;
	int modules, embed, head, nranges;
	int lo[3], hi[3];
};

static void check_level(const struct level_config *got, const struct want_level *w,
			const char *what, int i)
{
	cr_expect_str_eq(got->name, w->name, "%s: levels.%d.name", what, i);
	cr_expect_eq(got->modules, w->modules, "%s: levels.%d.modules %d, want %d", what, i,
		     got->modules, w->modules);
	cr_expect_eq(got->embed, w->embed, "%s: levels.%d.embed", what, i);
	cr_expect_eq(got->head, w->head, "%s: levels.%d.head", what, i);
	cr_expect_eq(got->nranges, w->nranges, "%s: levels.%d.nranges %d, want %d", what, i,
		     got->nranges, w->nranges);
	for (int r = 0; r < w->nranges && r < got->nranges; r++) {
		cr_expect_eq(got->range[r].lo, w->lo[r], "%s: levels.%d.range[%d].lo", what, i, r);
		cr_expect_eq(got->range[r].hi, w->hi[r], "%s: levels.%d.range[%d].hi", what, i, r);
	}
}

/* Two levels equal field by field (only the ranges in use). */
static void expect_levels_equal(const struct level_config *a, const struct level_config *b,
				const char *what, int i)
{
	cr_expect_str_eq(a->name, b->name, "%s: levels.%d.name", what, i);
	cr_expect_eq(a->modules, b->modules, "%s: levels.%d.modules", what, i);
	cr_expect_eq(a->embed, b->embed, "%s: levels.%d.embed", what, i);
	cr_expect_eq(a->head, b->head, "%s: levels.%d.head", what, i);
	cr_expect_eq(a->nranges, b->nranges, "%s: levels.%d.nranges", what, i);
	for (int r = 0; r < a->nranges && r < b->nranges && r < LEVEL_MAX_RANGES; r++) {
		cr_expect_eq(a->range[r].lo, b->range[r].lo, "%s: levels.%d.range[%d].lo", what, i,
			     r);
		cr_expect_eq(a->range[r].hi, b->range[r].hi, "%s: levels.%d.range[%d].hi", what, i,
			     r);
	}
}

/* The model and train values every shipped dipaco config shares (read by hand). */
static void check_short_run(const struct run_config *c, const char *what)
{
	cr_expect_eq(c->model.n_layer, 4, "%s: n_layer", what);
	cr_expect_eq(c->model.n_embd, 256, "%s: n_embd", what);
	cr_expect_eq(c->model.n_head, 4, "%s: n_head", what);
	cr_expect_eq(c->model.seq_len, 256, "%s: seq_len", what);
	cr_expect_eq(c->model.vocab_size, 256, "%s: vocab_size", what);
	cr_expect_eq(c->train.batch_size, 8, "%s: batch_size", what);
	cr_expect_eq(c->train.steps, 400, "%s: steps", what);
	cr_expect_eq(c->train.lr, 3.0e-3, "%s: lr", what);
	cr_expect_eq(c->train.warmup_steps, 20, "%s: warmup_steps", what);
	cr_expect_eq(c->train.min_lr_frac, 0.1, "%s: min_lr_frac", what);
	cr_expect_eq(c->train.weight_decay, 0.1, "%s: weight_decay", what);
	cr_expect_eq(c->train.beta1, 0.9, "%s: beta1", what);
	cr_expect_eq(c->train.beta2, 0.95, "%s: beta2", what);
	cr_expect_eq(c->train.eps, 1.0e-8, "%s: eps", what);
	cr_expect_eq(c->train.grad_clip, 1.0, "%s: grad_clip", what);
	cr_expect_eq(c->train.eval_every, 0, "%s: eval_every", what);
	cr_expect_eq(c->train.eval_batches, 16, "%s: eval_batches", what);
	cr_expect_eq(c->train.checkpoint_every, 0, "%s: checkpoint_every", what);
	cr_expect_eq(c->train.seed, 1, "%s: seed", what);
	cr_expect_eq(c->dipaco.phases, 4, "%s: phases", what);
	cr_expect_eq(c->dipaco.inner_steps, 100, "%s: inner_steps", what);
	cr_expect_eq(c->dipaco.nesterov, 1, "%s: nesterov", what);
	cr_expect_eq(c->dipaco.reweight, 1, "%s: reweight", what);
	cr_expect_eq(c->dipaco.holdout, 0, "%s: holdout", what);
	cr_expect_eq(c->dipaco.early_stop_every, 0, "%s: early_stop_every", what);
	cr_expect_eq(c->dipaco.holdout_frac, 0.05, "%s: holdout_frac", what);
}

static const struct {
	const char *path;
	int paths;
	double outer_lr, outer_momentum;
	int rescale; /* off in all: results/brown.md's sweep (DiLoCo as published has none) */
	int nlevels;
	struct want_level levels[3];
} shipped[] = {
	{ "configs/dense.yaml", 1, 1.0, 0.0, 1, 0, { { NULL } } },
	{ "configs/diloco.yaml", 4, 1.0, 0.5, 0, 1, { { "all", 1, 1, 1, 1, { 0 }, { 3 } } } },
	{ "configs/flat-moe.yaml", 0, 0.7, 0.5, 0, 1, { { "all", 4, 1, 1, 1, { 0 }, { 3 } } } },
	{ "configs/dipaco-2x2.yaml", 0, 0.7, 0.5, 0, 2,
	  { { "lower", 2, 1, 0, 1, { 0 }, { 1 } }, { "upper", 2, 0, 1, 1, { 2 }, { 3 } } } },
	{ "configs/dipaco-2x2-head.yaml", 0, 0.7, 0.5, 0, 3,
	  { { "lower", 2, 1, 0, 1, { 0 }, { 1 } }, { "upper", 2, 0, 0, 1, { 2 }, { 2 } },
	    { "head", LEVEL_PER_PATH, 0, 1, 1, { 3 }, { 3 } } } },
};

Test(config, shipped_dipaco_configs)
{
	for (size_t f = 0; f < sizeof shipped / sizeof shipped[0]; f++) {
		struct run_config c;
		const char *p = shipped[f].path;

		memset(&c, 0x5a, sizeof c);
		config_defaults(&c);
		cr_assert_eq(config_load(&c, p), 0, "load %s (run from the repository root): %s",
			     p, err_detail());
		check_short_run(&c, p);
		cr_expect_eq(c.dipaco.paths, shipped[f].paths, "%s: paths", p);
		cr_expect_eq(c.dipaco.outer_lr, shipped[f].outer_lr, "%s: outer_lr", p);
		cr_expect_eq(c.dipaco.outer_momentum, shipped[f].outer_momentum,
			     "%s: outer_momentum", p);
		cr_expect_eq(c.dipaco.rescale, shipped[f].rescale, "%s: rescale", p);
		cr_expect_eq(c.dipaco.nlevels, shipped[f].nlevels, "%s: nlevels %d", p,
			     c.dipaco.nlevels);
		for (int i = 0; i < shipped[f].nlevels && i < c.dipaco.nlevels; i++)
			check_level(&c.dipaco.levels[i], &shipped[f].levels[i], p, i);
		cr_expect_eq(config_validate(&c, p), 0, "%s: %s", p, err_detail());
		cr_expect_eq(config_inner_steps(&c), 100, "%s: tau", p);
	}
}

Test(config, level_forms_accepted)
{
	struct run_config c;
	static const struct want_level a = { "a", LEVEL_PER_PATH, 1, 0, 1, { 0 }, { 1 } };
	static const struct want_level b = { "l2_b", 1, 0, 1, 2, { 2, 3 }, { 2, 3 } };
	static const struct want_level e = { "x", 7, 0, 1, 2, { 5, 0 }, { 5, 1 } };

	/* flow item, owns with commas and no spaces; block sequence of words; quoted path */
	config_defaults(&c);
	cr_assert_eq(load_text(&c, "levels:\n  - {name: a, owns: 'embed,h.0-1', modules: path}\n"
				   "  - name: \"l2_b\"\n    owns:\n      - h.2\n      - h.3-3\n"
				   "      - head\n    modules: 1\n"), 0, "%s", err_detail());
	cr_expect_eq(c.dipaco.nlevels, 2);
	check_level(&c.dipaco.levels[0], &a, "forms", 0);
	check_level(&c.dipaco.levels[1], &b, "forms", 1);
	cr_expect_eq(config_validate(&c, NULL), 0, "%s", err_detail());

	/* ranges kept as written, in order; embed and head wherever they are written */
	config_defaults(&c);
	cr_assert_eq(load_text(&c, "levels: [{modules: 7, owns: \"head , h.5\th.0-1\", name: x}]\n"),
		     0, "%s", err_detail());
	check_level(&c.dipaco.levels[0], &e, "order", 0);

	/* 31 characters is the longest name */
	config_defaults(&c);
	cr_assert_eq(load_text(&c, "levels:\n  - name: abcdefghij_abcdefghij_abcdefghi\n"
				   "    owns: embed h.0-3 head\n    modules: 65536\n"), 0, "%s",
		     err_detail());
	cr_expect_str_eq(c.dipaco.levels[0].name, "abcdefghij_abcdefghij_abcdefghi");
	cr_expect_eq(c.dipaco.levels[0].modules, 65536);
	cr_expect_eq(config_validate(&c, NULL), 0, "%s", err_detail());

	/* no levels: nothing, an empty sequence, or null; each clears levels loaded before */
	static const char *const empty[] = { "levels:\n", "levels: []\n", "levels: ~\n" };
	for (size_t i = 0; i < sizeof empty / sizeof empty[0]; i++) {
		struct level_config zero[CONFIG_MAX_LEVELS];
		config_defaults(&c);
		cr_assert_eq(config_load(&c, "configs/dipaco-2x2.yaml"), 0, "%s", err_detail());
		cr_assert_eq(c.dipaco.nlevels, 2);
		cr_assert_eq(load_text(&c, empty[i]), 0, "'%s': %s", empty[i], err_detail());
		cr_expect_eq(c.dipaco.nlevels, 0, "'%s'", empty[i]);
		memset(zero, 0, sizeof zero);
		cr_expect_eq(memcmp(c.dipaco.levels, zero, sizeof zero), 0,
			     "'%s' leaves old levels behind", empty[i]);
	}
}

/* 16 levels, one block each, with 2 modules: R = 2^16 = 65536, the most paths. */
static void sixteen_levels(char *text, size_t n, int count)
{
	size_t off = (size_t)snprintf(text, n, "model:\n  n_layer: 16\n  n_head: 4\nlevels:\n");

	for (int i = 0; i < count; i++)
		off += (size_t)snprintf(text + off, n - off,
					"  - name: l%d\n    owns: %sh.%d%s\n    modules: 2\n", i,
					i == 0 ? "embed " : "", i, i == 15 ? " head" : "");
}

Test(config, sixteen_levels_and_no_more)
{
	struct run_config c;
	char text[4096];

	sixteen_levels(text, sizeof text, 16);
	config_defaults(&c);
	cr_assert_eq(load_text(&c, text), 0, "%s", err_detail());
	cr_expect_eq(c.dipaco.nlevels, 16);
	cr_expect_str_eq(c.dipaco.levels[15].name, "l15");
	cr_expect_eq(config_validate(&c, NULL), 0, "R = 65536 is allowed: %s", err_detail());

	c.dipaco.levels[3].modules = 3;
	cr_expect_eq(config_validate(&c, NULL), CORE_ECONFIG);
	cr_expect_str_eq(err_detail(), "levels: the levels' modules multiply to more than 65536 "
				       "paths");

	/* the 17th item starts on line 4 + 16 * 3 + 1 */
	sixteen_levels(text, sizeof text, 17);
	config_defaults(&c);
	struct run_config before = c;
	cr_expect_eq(load_text(&c, text), CORE_ECONFIG);
	cr_expect_str_eq(err_detail(), "line 53: levels: more than 16 levels");
	cr_expect_eq(memcmp(&c, &before, sizeof c), 0, "a failed load changed the config");
}

/* Loaded without error, refused by config_validate: the detail names no line. */
static const struct bad_case bad_validate[] = {
	{ "levels:\n- {name: lower, owns: embed h.0-1, modules: 2}\n"
	  "- {name: upper, owns: h.2-4 head, modules: 2}\n",
	  "levels.1.owns: level 'upper' names block h.4, but model.n_layer is 4" },
	{ "model:\n  n_layer: 3\nlevels:\n- {name: lower, owns: embed h.0-1, modules: 2}\n"
	  "- {name: upper, owns: h.2-3 head, modules: 2}\n",
	  "levels.1.owns: level 'upper' names block h.3, but model.n_layer is 3" },
	{ "levels:\n- {name: lower, owns: embed h.0-1, modules: 2}\n"
	  "- {name: upper, owns: h.3 head, modules: 2}\n",
	  "levels: no level owns 'h.2'" },
	{ "levels:\n- {name: lower, owns: h.0-1, modules: 2}\n"
	  "- {name: upper, owns: h.2-3 head, modules: 2}\n",
	  "levels: no level owns 'embed'" },
	{ "levels:\n- {name: lower, owns: embed h.0-1, modules: 2}\n"
	  "- {name: upper, owns: h.2-3, modules: 2}\n",
	  "levels: no level owns 'head'" },
	{ "levels:\n- {name: lower, owns: embed h.0-2, modules: 2}\n"
	  "- {name: upper, owns: h.2-3 head, modules: 2}\n",
	  "levels: 'h.2' is owned by both 'lower' and 'upper'" },
	{ "levels:\n- {name: lower, owns: embed h.0-1, modules: 2}\n"
	  "- {name: upper, owns: embed h.2-3, modules: 2}\n",
	  "levels: 'embed' is owned by both 'lower' and 'upper'" },
	{ "levels:\n- {name: all, owns: embed h.0-1 h.1-3 head, modules: 1}\n",
	  "levels: 'h.1' is owned twice by level 'all'" },
	/* a model override after the file: the levels no longer cover it */
	{ "model:\n  n_layer: 6\nlevels:\n- {name: lower, owns: embed h.0-1, modules: 2}\n"
	  "- {name: upper, owns: h.2-3 head, modules: 2}\n",
	  "levels: no level owns 'h.4'" },
	{ "dipaco:\n  paths: 6\nlevels:\n- {name: lower, owns: embed h.0-1, modules: 2}\n"
	  "- {name: upper, owns: h.2-3 head, modules: 2}\n",
	  "dipaco.paths (6) must be a multiple of 4, the product of the levels' modules" },
	/* a per-path level is not part of R */
	{ "dipaco:\n  paths: 3\nlevels:\n- {name: lower, owns: embed h.0-1, modules: 2}\n"
	  "- {name: top, owns: h.2-3 head, modules: path}\n",
	  "dipaco.paths (3) must be a multiple of 2, the product of the levels' modules" },
	{ "train:\n  steps: 400\ndipaco:\n  phases: 4\n  inner_steps: 101\n",
	  "dipaco.phases (4) times dipaco.inner_steps (101) is more than train.steps (400)" },
	{ "train:\n  steps: 0\ndipaco:\n  inner_steps: 1\n",
	  "dipaco.phases (1) times dipaco.inner_steps (1) is more than train.steps (0)" },
	{ "train:\n  steps: 4\ndipaco:\n  phases: 5\n",
	  "train.steps (4) must be at least dipaco.phases (5) when dipaco.inner_steps is 0" },
	{ "train:\n  steps: 0\ndipaco:\n  phases: 3\n",
	  "train.steps (0) must be at least dipaco.phases (3) when dipaco.inner_steps is 0" },
	{ "dipaco:\n  early_stop_every: 10\n  holdout_frac: 0\n",
	  "dipaco.early_stop_every (10) needs dipaco.holdout_frac > 0" },
	{ "dipaco:\n  holdout: true\n  holdout_frac: 0\n",
	  "dipaco.holdout needs dipaco.holdout_frac > 0" },
};

/* Their neighbours on the right side of each rule. */
static const char *const good_validate[] = {
	"train:\n  steps: 400\ndipaco:\n  phases: 4\n  inner_steps: 100\n",
	"train:\n  steps: 5\ndipaco:\n  phases: 5\n",
	"train:\n  steps: 0\n",
	"train:\n  steps: 2\n",
	"train:\n  steps: 1\ndipaco:\n  inner_steps: 1\n",
	"dipaco:\n  early_stop_every: 10\n  holdout_frac: 0.05\n",
	"dipaco:\n  paths: 8\nlevels:\n- {name: lower, owns: embed h.0-1, modules: 2}\n"
	"- {name: upper, owns: h.2-3 head, modules: 2}\n",
	"dipaco:\n  paths: 6\nlevels:\n- {name: lower, owns: embed h.0-1, modules: 2}\n"
	"- {name: top, owns: h.2-3 head, modules: path}\n",
	"dipaco:\n  paths: 65536\nlevels:\n- {name: all, owns: 'h.3 h.0-2 head embed', "
	"modules: 1}\n",
};

Test(config, validate_levels_and_schedule)
{
	for (size_t i = 0; i < sizeof bad_validate / sizeof bad_validate[0]; i++) {
		struct run_config c;
		config_defaults(&c);
		cr_assert_eq(load_text(&c, bad_validate[i].yaml), 0, "case %zu loads: %s", i,
			     err_detail());
		cr_expect_eq(config_validate(&c, "x.yaml"), CORE_ECONFIG, "case %zu: yaml:\n%s", i,
			     bad_validate[i].yaml);
		cr_expect_str_eq(err_detail(), bad_validate[i].detail,
				 "case %zu: yaml:\n%s\ngot:  %s\nwant: %s", i, bad_validate[i].yaml,
				 err_detail(), bad_validate[i].detail);
		cr_expect_str_eq(err_file(), "x.yaml", "case %zu", i);
	}
	for (size_t i = 0; i < sizeof good_validate / sizeof good_validate[0]; i++) {
		struct run_config c;
		config_defaults(&c);
		cr_assert_eq(load_text(&c, good_validate[i]), 0, "%s", err_detail());
		cr_expect_eq(config_validate(&c, NULL), 0, "yaml:\n%s\nrefused: %s",
			     good_validate[i], err_detail());
	}
}

Test(config, validate_levels_filled_by_code)
{
	struct run_config c, base;

	config_defaults(&base);
	cr_assert_eq(config_load(&base, "configs/dipaco-2x2.yaml"), 0, "%s", err_detail());
	cr_assert_eq(config_validate(&base, NULL), 0, "%s", err_detail());

	c = base;
	c.dipaco.nlevels = 17;
	cr_expect_eq(config_validate(&c, NULL), CORE_ECONFIG);
	cr_expect_str_eq(err_detail(), "levels: 17 levels is outside [0, 16]");
	c = base;
	c.dipaco.nlevels = -1;
	cr_expect_eq(config_validate(&c, NULL), CORE_ECONFIG);
	cr_expect_str_eq(err_detail(), "levels: -1 levels is outside [0, 16]");
	c = base;
	snprintf(c.dipaco.levels[1].name, LEVEL_NAME_MAX, "Up");
	cr_expect_eq(config_validate(&c, NULL), CORE_ECONFIG);
	cr_expect_str_eq(err_detail(), "levels.1.name: 'Up' is not a level name ([a-z][a-z0-9_]*, "
				       "at most 31 characters)");
	c = base;
	memset(c.dipaco.levels[1].name, 'a', LEVEL_NAME_MAX); /* no nul */
	cr_expect_eq(config_validate(&c, NULL), CORE_ECONFIG);
	c = base;
	snprintf(c.dipaco.levels[1].name, LEVEL_NAME_MAX, "lower");
	cr_expect_eq(config_validate(&c, NULL), CORE_ECONFIG);
	cr_expect_str_eq(err_detail(), "levels.1.name: duplicate level name 'lower' (levels.0)");
	c = base;
	c.dipaco.levels[0].modules = -1;
	cr_expect_eq(config_validate(&c, NULL), CORE_ECONFIG);
	cr_expect_str_eq(err_detail(), "levels.0.modules: -1 is outside [1, 65536] (or path)");
	c = base;
	c.dipaco.levels[0].nranges = 17;
	cr_expect_eq(config_validate(&c, NULL), CORE_ECONFIG);
	cr_expect_str_eq(err_detail(), "levels.0.owns: 17 block ranges is outside [0, 16]");
	c = base;
	c.dipaco.levels[0].range[0].lo = 2;
	cr_expect_eq(config_validate(&c, NULL), CORE_ECONFIG);
	cr_expect_str_eq(err_detail(), "levels.0.owns: range h.2-1 is not a range");
	c = base;
	c.dipaco.levels[1].head = 0;
	c.dipaco.levels[1].nranges = 0;
	cr_expect_eq(config_validate(&c, NULL), CORE_ECONFIG);
	cr_expect_str_eq(err_detail(), "levels.1.owns: names no group");
}

Test(config, overrides_cannot_set_levels)
{
	static const char *const refused[] = {
		"levels=[]", "levels.0.modules=2", "levels[0].name=x", "dipaco.levels=x",
		"dipaco.levels.0.name=a",
	};

	for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
		struct run_config c, d;
		char want[160];
		config_defaults(&c);
		d = c;
		cr_expect_eq(config_set(&c, refused[i]), CORE_ECONFIG, "'%s'", refused[i]);
		snprintf(want, sizeof want, "override '%s': levels can be set only in a config file",
			 refused[i]);
		cr_expect_str_eq(err_detail(), want);
		cr_expect_eq(memcmp(&c, &d, sizeof c), 0, "'%s' changed the config", refused[i]);
	}

	/* the scalar keys of dipaco: are ordinary overrides */
	struct run_config c;
	config_defaults(&c);
	cr_assert_eq(config_set(&c, "dipaco.paths=8"), 0, "%s", err_detail());
	cr_assert_eq(config_set(&c, "dipaco.nesterov=false"), 0, "%s", err_detail());
	cr_assert_eq(config_set(&c, "dipaco.holdout_frac=0.5"), 0, "%s", err_detail());
	cr_expect_eq(c.dipaco.paths, 8);
	cr_expect_eq(c.dipaco.nesterov, 0);
	cr_expect_eq(c.dipaco.holdout_frac, 0.5);
	cr_expect_eq(config_set(&c, "dipaco.phase=2"), CORE_ECONFIG);
	cr_expect_str_eq(err_detail(), "override 'dipaco.phase=2': unknown key 'dipaco.phase' "
				       "(did you mean 'dipaco.phases'?)");
}

Test(config, defaults_validate_for_any_steps)
{
	static const long steps[] = { 0, 1, 2, 2000 };

	for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
		struct run_config c;
		config_defaults(&c);
		c.train.steps = steps[i];
		cr_expect_eq(config_validate(&c, NULL), 0, "train.steps %ld: %s", steps[i],
			     err_detail());
		cr_expect_eq(config_inner_steps(&c), steps[i], "one phase spans train.steps");
	}
}

Test(config, levels_in_effect)
{
	struct run_config c;
	struct level_config out[CONFIG_MAX_LEVELS];
	static const struct want_level all4 = { "all", 1, 1, 1, 1, { 0 }, { 3 } };
	static const struct want_level all1 = { "all", 1, 1, 1, 1, { 0 }, { 0 } };

	config_defaults(&c);
	memset(out, 0x5a, sizeof out);
	cr_expect_eq(config_levels(&c, out), 1);
	check_level(&out[0], &all4, "default, n_layer 4", 0);

	c.model.n_layer = 1;
	memset(out, 0x5a, sizeof out);
	cr_expect_eq(config_levels(&c, out), 1);
	check_level(&out[0], &all1, "default, n_layer 1", 0);

	config_defaults(&c);
	cr_assert_eq(config_load(&c, "configs/dipaco-2x2-head.yaml"), 0, "%s", err_detail());
	memset(out, 0x5a, sizeof out);
	cr_expect_eq(config_levels(&c, out), 3);
	for (int i = 0; i < 3; i++)
		check_level(&out[i], &shipped[4].levels[i], "config_levels", i);
}

Test(config, inner_steps_in_effect)
{
	struct run_config c;

	config_defaults(&c); /* steps 2000, phases 1, inner_steps 0 */
	cr_expect_eq(config_inner_steps(&c), 2000);
	c.dipaco.phases = 4;
	cr_expect_eq(config_inner_steps(&c), 500);
	c.train.steps = 10;
	c.dipaco.phases = 3;
	cr_expect_eq(config_inner_steps(&c), 3, "rounded down");
	c.dipaco.inner_steps = 7;
	cr_expect_eq(config_inner_steps(&c), 7, "given: taken as it is");
	c.dipaco.inner_steps = 0;
	c.train.steps = 0;
	c.dipaco.phases = 1;
	cr_expect_eq(config_inner_steps(&c), 0);
}

/* dipaco-2x2-head.yaml's canonical text from the dipaco section on, by hand. */
static const char head_dump_tail[] =
	"dipaco.phases: 4\n"
	"dipaco.inner_steps: 100\n"
	"dipaco.paths: 0\n"
	"dipaco.outer_lr: 0.69999999999999996\n"
	"dipaco.outer_momentum: 0.5\n"
	"dipaco.nesterov: true\n"
	"dipaco.rescale: false\n"
	"dipaco.reweight: true\n"
	"dipaco.holdout: false\n"
	"dipaco.early_stop_every: 0\n"
	"dipaco.holdout_frac: 0.050000000000000003\n"
	"levels.0: name=lower modules=2 owns=embed h.0-1\n"
	"levels.1: name=upper modules=2 owns=h.2\n"
	"levels.2: name=head modules=path owns=h.3 head\n";

Test(config, dump_and_hashes_cover_levels)
{
	struct run_config c, d;
	char buf[4096], got[17], want[17], tiny_model[17];

	config_defaults(&d);
	config_hash_model(&d, tiny_model);
	config_defaults(&c);
	cr_assert_eq(config_load(&c, "configs/dipaco-2x2-head.yaml"), 0, "%s", err_detail());
	size_t n = config_dump(&c, buf, sizeof buf);
	cr_assert_lt(n, sizeof buf);
	const char *tail = strstr(buf, "dipaco.phases:");
	cr_assert(tail, "no dipaco section in:\n%s", buf);
	cr_expect_str_eq(tail, head_dump_tail);
	cr_expect(strstr(buf, "train.steps: 400\ntrain.lr:") != NULL, "train lines:\n%s", buf);

	config_hash_all(&c, got);
	snprintf(want, sizeof want, "%016" PRIx64, ref_fnv1a(buf, n));
	cr_expect_str_eq(got, want, "hash_all covers the levels lines");
	config_hash_model(&c, got);
	cr_expect_str_eq(got, tiny_model, "same model section as gpt-tiny, same model hash");

	/* each level field changes the whole hash and never the model hash */
	char h0[17];
	config_hash_all(&c, h0);
	for (int field = 0; field < 5; field++) {
		d = c;
		struct level_config *lv = &d.dipaco.levels[field % 3];
		switch (field) {
		case 0: lv->modules = 3; break;
		case 1: lv->name[0] = 'x'; break;
		case 2: lv->head = 0; break;
		case 3: lv->range[0].hi = 2; break;
		case 4: d.dipaco.nlevels = 2; break;
		}
		config_hash_all(&d, got);
		cr_expect_str_neq(got, h0, "change %d must change hash_all", field);
		config_hash_model(&d, got);
		cr_expect_str_eq(got, tiny_model, "change %d must not change hash_model", field);
	}
}

/* config_yaml of configs/dipaco-2x2.yaml, written by hand. */
static const char yaml_2x2[] =
	"model:\n"
	"  n_layer: 4\n"
	"  n_embd: 256\n"
	"  n_head: 4\n"
	"  seq_len: 256\n"
	"  vocab_size: 256\n"
	"train:\n"
	"  batch_size: 8\n"
	"  steps: 400\n"
	"  lr: 0.0030000000000000001\n"
	"  warmup_steps: 20\n"
	"  min_lr_frac: 0.10000000000000001\n"
	"  restart_step: 0\n"
	"  weight_decay: 0.10000000000000001\n"
	"  beta1: 0.90000000000000002\n"
	"  beta2: 0.94999999999999996\n"
	"  eps: 1e-08\n"
	"  grad_clip: 1\n"
	"  eval_every: 0\n"
	"  eval_batches: 16\n"
	"  checkpoint_every: 0\n"
	"  seed: 1\n"
	"dipaco:\n"
	"  phases: 4\n"
	"  inner_steps: 100\n"
	"  paths: 0\n"
	"  outer_lr: 0.69999999999999996\n"
	"  outer_momentum: 0.5\n"
	"  nesterov: true\n"
	"  rescale: false\n"
	"  reweight: true\n"
	"  holdout: false\n"
	"  early_stop_every: 0\n"
	"  holdout_frac: 0.050000000000000003\n"
	"levels:\n"
	"  - name: \"lower\"\n"
	"    owns: \"embed h.0-1\"\n"
	"    modules: 2\n"
	"  - name: \"upper\"\n"
	"    owns: \"h.2-3 head\"\n"
	"    modules: 2\n";

Test(config, yaml_text)
{
	struct run_config c;
	char buf[4096];

	config_defaults(&c);
	cr_assert_eq(config_load(&c, "configs/dipaco-2x2.yaml"), 0, "%s", err_detail());
	size_t n = config_yaml(&c, buf, sizeof buf);
	cr_expect_eq(n, strlen(yaml_2x2), "length %zu, want %zu", n, strlen(yaml_2x2));
	cr_expect_str_eq(buf, yaml_2x2);
	cr_expect_eq(config_yaml(&c, NULL, 0), n, "size query");
	char small[10];
	cr_expect_eq(config_yaml(&c, small, sizeof small), n);
	cr_expect_str_eq(small, "model:\n  ", "nul-terminated prefix");

	/* no levels: no levels section */
	config_defaults(&c);
	config_yaml(&c, buf, sizeof buf);
	cr_expect(strstr(buf, "levels") == NULL, "defaults wrote levels:\n%s", buf);
	cr_expect(strstr(buf, "\n  holdout_frac: 0.050000000000000003\n") != NULL, "%s", buf);
}

/* config_yaml, then config_load of it into fresh defaults: the same dump and levels. */
static void round_trip(const struct run_config *c, const char *what)
{
	static char yaml[8192], d1[8192], d2[8192];
	char path[64];
	struct run_config back;

	size_t n = config_yaml(c, yaml, sizeof yaml);
	cr_assert_lt(n, sizeof yaml, "%s", what);
	write_temp(yaml, n, path);
	config_defaults(&back);
	int rc = config_load(&back, path);
	unlink(path);
	cr_assert_eq(rc, 0, "%s: its yaml does not load: %s\n%s", what, err_detail(), yaml);
	config_dump(c, d1, sizeof d1);
	config_dump(&back, d2, sizeof d2);
	cr_expect_str_eq(d2, d1, "%s: dump after the round trip differs; yaml:\n%s", what, yaml);
	cr_expect_eq(back.dipaco.nlevels, c->dipaco.nlevels, "%s: nlevels", what);
	for (int i = 0; i < c->dipaco.nlevels && i < back.dipaco.nlevels; i++)
		expect_levels_equal(&back.dipaco.levels[i], &c->dipaco.levels[i], what, i);
	cr_expect_eq(memcmp(&back, c, sizeof back), 0, "%s: the structs differ", what);
}

Test(config, yaml_round_trip)
{
	static const char *const files[] = {
		"configs/gpt-tiny.yaml", "configs/gpt-small-test.yaml", "configs/dense.yaml",
		"configs/diloco.yaml", "configs/flat-moe.yaml", "configs/dipaco-2x2.yaml",
		"configs/dipaco-2x2-head.yaml",
	};
	struct run_config c;

	config_defaults(&c);
	round_trip(&c, "defaults");
	for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
		config_defaults(&c);
		cr_assert_eq(config_load(&c, files[i]), 0, "%s: %s", files[i], err_detail());
		round_trip(&c, files[i]);
	}

	/* levels written out of canonical order, and values with every digit significant */
	static const char *const sets[] = {
		"train.lr=0.000123456789", "train.eps=5e-324", "train.seed=18446744073709551615",
		"dipaco.outer_lr=0.1", "dipaco.outer_momentum=0.99999999999999989",
		"dipaco.nesterov=false", "dipaco.rescale=false", "dipaco.reweight=false",
		"dipaco.paths=9", "dipaco.paths_per_phase=4", "dipaco.holdout=true", "dipaco.early_stop_every=25",
		"dipaco.holdout_frac=0.5",
		"dipaco.phases=3", "dipaco.inner_steps=7",
	};
	config_defaults(&c);
	cr_assert_eq(load_text(&c, "model:\n  n_layer: 8\n  n_embd: 64\n  n_head: 8\n"
				   "levels:\n  - name: x_1\n    owns: head, h.5 h.0-1\n"
				   "    modules: 3\n  - name: y\n    owns: [h.2-4, embed]\n"
				   "    modules: path\n  - name: z9\n    owns: h.7 h.6\n"
				   "    modules: 1\n"), 0, "%s", err_detail());
	for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++)
		cr_assert_eq(config_set(&c, sets[i]), 0, "%s: %s", sets[i], err_detail());
	cr_assert_eq(config_validate(&c, NULL), 0, "%s", err_detail());
	round_trip(&c, "overrides and out-of-order levels");
}

/* ---- dump and hashes ---------------------------------------------------------------------- */

/* dipaco.paths_per_phase is optional: absent, the canonical text (so the hash and the
 * config.yaml of a run) is what it was before the key existed; 0 and more than P are
 * refused, naming the file and the key. */
Test(config, paths_per_phase_is_optional)
{
	struct run_config c;
	char buf[8192], yaml[8192], h_absent[17], h_set[17];

	config_defaults(&c);
	cr_assert_eq(config_load(&c, "configs/dipaco-2x2.yaml"), 0, "%s", err_detail());
	cr_expect_eq(c.dipaco.paths_per_phase, 0);
	config_dump(&c, buf, sizeof buf);
	config_yaml(&c, yaml, sizeof yaml);
	cr_expect(!strstr(buf, "paths_per_phase") && !strstr(yaml, "paths_per_phase"),
		  "an absent key is written out:\n%s", buf);
	/* the hash is FNV-1a of the dump, which ends with holdout_frac then the levels */
	cr_expect(strstr(buf, "dipaco.holdout_frac: 0.050000000000000003\nlevels.0:") != NULL,
		  "%s", buf);
	config_hash_all(&c, h_absent);
	cr_assert_eq(config_set(&c, "dipaco.paths_per_phase=4"), 0, "%s", err_detail());
	cr_expect_eq(c.dipaco.paths_per_phase, 4);
	cr_expect_eq(config_validate(&c, "x.yaml"), 0, "4 of 4 paths: %s", err_detail());
	config_dump(&c, buf, sizeof buf);
	cr_expect(strstr(buf, "dipaco.paths_per_phase: 4\n") != NULL, "%s", buf);
	config_hash_all(&c, h_set);
	cr_expect_str_neq(h_absent, h_set);

	config_defaults(&c);
	cr_expect_eq(config_set(&c, "dipaco.paths_per_phase=0"), CORE_ECONFIG);
	cr_expect_str_eq(err_detail(), "override 'dipaco.paths_per_phase=0': "
			 "dipaco.paths_per_phase: 0 is outside [1, 65536]");
	cr_expect_eq(load_text(&c, "dipaco:\n  paths_per_phase: 0\n"), CORE_ECONFIG);
	cr_expect(strstr(err_detail(), "line 2: dipaco.paths_per_phase: 0 is outside [1, 65536]"),
		  "%s", err_detail());
	config_defaults(&c);
	cr_assert_eq(config_load(&c, "configs/dipaco-2x2.yaml"), 0, "%s", err_detail());
	cr_assert_eq(config_set(&c, "dipaco.paths_per_phase=5"), 0, "%s", err_detail());
	cr_expect_eq(config_validate(&c, "x.yaml"), CORE_ECONFIG);
	cr_expect_str_eq(err_file(), "x.yaml");
	cr_expect_str_eq(err_detail(), "dipaco.paths_per_phase (5) is more than the 4 paths of "
			 "the run");
	cr_assert_eq(config_set(&c, "dipaco.paths=8"), 0, "%s", err_detail());
	cr_expect_eq(config_validate(&c, "x.yaml"), 0, "5 of 8 paths: %s", err_detail());
}

/* The moe section: absent from the dump and hashes of a dense model (moe.experts 0, whatever
 * its other keys), part of the model hash otherwise; the blocks it names; its refusals. */
Test(config, moe_section)
{
	struct run_config c;
	char buf[8192], h_dense[17], h[17], h2[17];
	unsigned char mask[8];

	config_defaults(&c);
	config_hash_model(&c, h_dense);
	config_dump(&c, buf, sizeof buf);
	cr_expect(!strstr(buf, "moe."), "a dense model's dump has moe lines:\n%s", buf);
	cr_assert_eq(config_set(&c, "moe.top_k=3"), 0, "%s", err_detail());
	config_hash_model(&c, h);
	cr_expect_str_eq(h, h_dense, "moe.top_k changed a dense model's hash");
	cr_expect_eq(model_moe_blocks(&c.model, mask), 0);

	config_defaults(&c);
	cr_assert_eq(load_text(&c, "model:\n  n_layer: 4\nmoe:\n  experts: 8\n  blocks: 0-1,3\n"
				   "  capacity_factor: -2.5\n  bpr: true\n"), 0, "%s", err_detail());
	cr_expect_eq(config_validate(&c, NULL), 0, "%s", err_detail());
	cr_expect_eq(model_moe_blocks(&c.model, mask), 3);
	cr_expect(mask[0] && mask[1] && !mask[2] && mask[3], "blocks 0-1,3: %d%d%d%d", mask[0],
		  mask[1], mask[2], mask[3]);
	config_dump(&c, buf, sizeof buf);
	cr_expect(strstr(buf, "\nmoe.experts: 8\nmoe.top_k: 2\nmoe.every: 2\nmoe.blocks: \"0-1,3\"\n"
			  "moe.capacity_factor: -2.5\nmoe.bpr: true\n") != NULL, "%s", buf);
	round_trip(&c, "an moe section");
	config_hash_model(&c, h);
	cr_expect_str_neq(h, h_dense);
	cr_assert_eq(config_set(&c, "moe.top_k=3"), 0, "%s", err_detail());
	config_hash_model(&c, h2);
	cr_expect_str_neq(h, h2, "moe.top_k of an MoE model is not in the model hash");
	/* every: blocks b with (b + 1) % every == 0 */
	cr_assert_eq(config_set(&c, "moe.blocks="), 0, "%s", err_detail());
	cr_expect_eq(model_moe_blocks(&c.model, mask), 2);
	cr_expect(!mask[0] && mask[1] && !mask[2] && mask[3]);
	cr_assert_eq(config_set(&c, "moe.every=1"), 0, "%s", err_detail());
	cr_expect_eq(model_moe_blocks(&c.model, mask), 4);

	static const struct {
		const char *set, *detail;
	} bad[] = {
		{"moe.top_k=9", "moe.top_k (9) is more than moe.experts (8)"},
		{"moe.blocks=4", "moe.blocks: block 4, but model.n_layer is 4 (blocks 0..3)"},
		{"moe.blocks=1,,2", "moe.blocks: '1,,2' is not a list of blocks and ranges ('1,3', "
				    "'0-3,6')"},
		{"moe.blocks=1,", "moe.blocks: '1,' is not a list of blocks and ranges ('1,3', "
				  "'0-3,6')"},
		{"moe.blocks=-1", "moe.blocks: '-1' is not a list of blocks and ranges ('1,3', "
				  "'0-3,6')"},
		{"moe.blocks=3-1", "moe.blocks: '3-1' is not a range"},
		{"moe.blocks=0-2,1", "moe.blocks: block 1 named twice"},
		{"moe.every=8", "moe.every (8) leaves no MoE block among the 4 blocks (every block b "
				"with (b + 1) % every == 0 is one)"},
		{"moe.aux_loss=load-importance", "moe.aux_loss load-importance needs moe.gate_noise > "
						 "0 and moe.experts >= 2"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		config_defaults(&c);
		cr_assert_eq(load_text(&c, "model:\n  n_layer: 4\nmoe:\n  experts: 8\n"), 0);
		cr_assert_eq(config_set(&c, bad[i].set), 0, "%s: %s", bad[i].set, err_detail());
		cr_expect_eq(config_validate(&c, "m.yaml"), CORE_ECONFIG, "%s accepted", bad[i].set);
		cr_expect_str_eq(err_file(), "m.yaml");
		cr_expect_str_eq(err_detail(), bad[i].detail, "%s", bad[i].set);
	}
	config_defaults(&c);
	cr_expect_eq(config_set(&c, "moe.aux_loss=switch"), CORE_ECONFIG);
	cr_expect_str_eq(err_detail(), "override 'moe.aux_loss=switch': moe.aux_loss: 'switch' is "
			 "not one of gshard, load-importance");
	cr_assert_eq(config_set(&c, "moe.aux_loss=load-importance"), 0);
	cr_expect_eq(config_validate(&c, NULL), 0, "a dense model checks no moe rule: %s",
		     err_detail());
}

/* The defaults' canonical text, written by hand (%.17g of each double worked out once). */
static const char tiny_dump[] =
	"model.n_layer: 4\n"
	"model.n_embd: 256\n"
	"model.n_head: 4\n"
	"model.seq_len: 256\n"
	"model.vocab_size: 256\n"
	"train.batch_size: 8\n"
	"train.steps: 2000\n"
	"train.lr: 0.0030000000000000001\n"
	"train.warmup_steps: 100\n"
	"train.min_lr_frac: 0.10000000000000001\n"
	"train.restart_step: 0\n"
	"train.weight_decay: 0.10000000000000001\n"
	"train.beta1: 0.90000000000000002\n"
	"train.beta2: 0.94999999999999996\n"
	"train.eps: 1e-08\n"
	"train.grad_clip: 1\n"
	"train.eval_every: 100\n"
	"train.eval_batches: 16\n"
	"train.checkpoint_every: 500\n"
	"train.seed: 1\n"
	"dipaco.phases: 1\n"
	"dipaco.inner_steps: 0\n"
	"dipaco.paths: 0\n"
	"dipaco.outer_lr: 0.69999999999999996\n"
	"dipaco.outer_momentum: 0.90000000000000002\n"
	"dipaco.nesterov: true\n"
	"dipaco.rescale: true\n"
	"dipaco.reweight: true\n"
	"dipaco.holdout: false\n"
	"dipaco.early_stop_every: 0\n"
	"dipaco.holdout_frac: 0.050000000000000003\n";

Test(config, dump_is_canonical_text)
{
	struct run_config c;
	char buf[2048];

	config_defaults(&c);
	size_t n = config_dump(&c, buf, sizeof buf);
	cr_expect_eq(n, strlen(tiny_dump), "length %zu, want %zu", n, strlen(tiny_dump));
	cr_expect_str_eq(buf, tiny_dump);
	cr_expect_eq(config_dump(&c, NULL, 0), n, "size query");

	/* Too small: snprintf semantics, nul-terminated prefix. */
	char small[20];
	memset(small, 'x', sizeof small);
	cr_expect_eq(config_dump(&c, small, sizeof small), n);
	cr_expect_eq(strlen(small), sizeof small - 1);
	cr_expect_eq(strncmp(small, tiny_dump, sizeof small - 1), 0);

	/* The file and the defaults give the same text. */
	struct run_config f;
	char buf2[2048];
	config_defaults(&f);
	memset(&f.model, 0, sizeof f.model);
	memset(&f.train, 0, sizeof f.train);
	cr_assert_eq(config_load(&f, "configs/gpt-tiny.yaml"), 0, "%s", err_detail());
	config_dump(&f, buf2, sizeof buf2);
	cr_expect_str_eq(buf2, tiny_dump);
}

Test(config, fnv1a_test_vectors)
{
	/* The reference against the published vectors, then the module's hasher. */
	cr_expect_eq(ref_fnv1a("", 0), 0xcbf29ce484222325ull);
	cr_expect_eq(ref_fnv1a("a", 1), 0xaf63dc4c8601ec8cull);

	struct sink o = { NULL, 0, 0, 1, FNV_OFFSET };
	char hex[17];
	hash_hex(o.h, hex);
	cr_expect_str_eq(hex, "cbf29ce484222325");
	sink_put(&o, "a", 1);
	hash_hex(o.h, hex);
	cr_expect_str_eq(hex, "af63dc4c8601ec8c");
}

Test(config, hashes_cover_the_right_lines)
{
	struct run_config c;
	char got[17], want[17];
	size_t model_len = strstr(tiny_dump, "train.") - tiny_dump;

	config_defaults(&c);
	config_hash_all(&c, got);
	snprintf(want, sizeof want, "%016" PRIx64, ref_fnv1a(tiny_dump, strlen(tiny_dump)));
	cr_expect_str_eq(got, want, "hash of the whole dump");
	config_hash_model(&c, got);
	snprintf(want, sizeof want, "%016" PRIx64, ref_fnv1a(tiny_dump, model_len));
	cr_expect_str_eq(got, want, "hash of the model lines");
	cr_expect_eq(strlen(got), 16);
	for (int i = 0; i < 16; i++)
		cr_expect(strchr("0123456789abcdef", got[i]) != NULL, "lowercase hex: %s", got);
}

Test(config, hashes_stable_and_sensitive)
{
	struct run_config a, b;
	char ha[17], hb[17], ma[17], mb[17];

	config_defaults(&a);
	config_defaults(&b);
	config_hash_all(&a, ha);
	config_hash_all(&b, hb);
	cr_expect_str_eq(ha, hb, "same config, same hash");
	config_hash_model(&a, ma);
	config_hash_model(&b, mb);
	cr_expect_str_eq(ma, mb);

	/* A train value: whole hash changes, model hash does not. */
	cr_assert_eq(config_set(&b, "train.lr=0.0031"), 0);
	config_hash_all(&b, hb);
	config_hash_model(&b, mb);
	cr_expect_str_neq(ha, hb, "train.lr changed, hash_all must change");
	cr_expect_str_eq(ma, mb, "train.lr changed, hash_model must not");

	/* A model value: both change. */
	config_defaults(&b);
	cr_assert_eq(config_set(&b, "model.n_layer=5"), 0);
	config_hash_all(&b, hb);
	config_hash_model(&b, mb);
	cr_expect_str_neq(ha, hb);
	cr_expect_str_neq(ma, mb, "model.n_layer changed, hash_model must change");

	/* The last bit of a double matters. */
	config_defaults(&b);
	b.train.lr = nextafter(b.train.lr, 1.0);
	config_hash_all(&b, hb);
	cr_expect_str_neq(ha, hb, "one ulp of train.lr");
}

/* ---- the schema table itself -------------------------------------------------------------- */

Test(config, schema_rows_are_sound)
{
	const struct cfg_schema *s = &run_schema;

	for (size_t i = 0; i < s->n; i++) {
		const struct cfg_key *k = &s->keys[i];
		char scratch[sizeof(struct run_config)];
		struct where w = { NULL, NULL, 0 };

		cr_expect(strlen(k->section) + strlen(k->key) + 2 < 64, "row %zu: name too long",
			  i);
		cr_expect(k->doc && *k->doc, "row %zu (%s.%s): no description", i, k->section,
			  k->key);
		cr_expect(k->offset < sizeof(struct run_config), "row %zu: offset", i);
		memset(scratch, 0, sizeof scratch);
		enum val_style st = k->type == CFG_STRING ? VAL_QUOTED : VAL_PLAIN;
		/* An optional key's default is "absent": 0, which a file cannot say. */
		if (k->flags & CFG_UNSET)
			cr_expect(strcmp(k->def, "0") == 0 && (k->flags & CFG_LO) && k->lo >= 1 &&
					  (k->type == CFG_INT || k->type == CFG_LONG) &&
					  set_value(&w, k, scratch, k->def, 1, st) != 0,
				  "row %zu (%s.%s): an optional key's default must be 0, outside its "
				  "range", i, k->section, k->key);
		else
			cr_expect_eq(set_value(&w, k, scratch, k->def, strlen(k->def), st), 0,
				     "row %zu (%s.%s): default '%s' rejected: %s", i, k->section,
				     k->key, k->def, err_detail());
		if (k->type == CFG_INT && (k->flags & CFG_HI))
			cr_expect(k->hi <= INT_MAX && k->lo >= INT_MIN, "row %zu: int bounds", i);
		for (size_t j = 0; j < i; j++) {
			cr_expect(strcmp(k->section, s->keys[j].section) ||
					  strcmp(k->key, s->keys[j].key),
				  "row %zu duplicates row %zu (%s.%s)", i, j, k->section, k->key);
			cr_expect(k->offset != s->keys[j].offset, "rows %zu and %zu share a field",
				  i, j);
		}
		/* A section's rows are contiguous, so its dump lines are too. */
		if (i > 1 && strcmp(k->section, s->keys[i - 1].section))
			for (size_t j = 0; j < i; j++)
				cr_expect(strcmp(k->section, s->keys[j].section),
					  "section %s is split", k->section);
	}
}

Test(config, suggestions_need_two_edits_or_fewer)
{
	cr_expect_eq(edit_distance("setps", "steps"), 1, "a transposition is one edit");
	cr_expect_eq(edit_distance("", "abc"), 3);
	cr_expect_eq(edit_distance("kitten", "sitting"), 3);
	cr_expect_eq(edit_distance("train.sepz", "train.steps"), 2);

	char sugg[200];
	suggest_key(&run_schema, "train.sepz", sugg, sizeof sugg);
	cr_expect_str_eq(sugg, " (did you mean 'train.steps'?)");
	suggest_key(&run_schema, "train.sxpz", sugg, sizeof sugg); /* 3 edits */
	cr_expect_str_eq(sugg, "");
}

/* ---- bool, string and enum, through a test-only schema ------------------------------------ */

struct extra_config {
	int flag;
	char name[8];
	int algo;
	double x;
};

static const char *const algos[] = { "linear", "2dh", NULL };

static const struct cfg_key extra_keys[] = {
	{ "moe", "flag", CFG_BOOL, offsetof(struct extra_config, flag), 0, 0, 0, 0, "false",
	  NULL, "a switch" },
	{ "moe", "name", CFG_STRING, offsetof(struct extra_config, name),
	  sizeof(((struct extra_config *)0)->name), 0, 0, 0, "ab", NULL, "a name" },
	{ "moe", "algo", CFG_ENUM, offsetof(struct extra_config, algo), 0, 0, 0, 0, "2dh", algos,
	  "an algorithm" },
	{ "moe", "x", CFG_DOUBLE, offsetof(struct extra_config, x), 0, CFG_HI | CFG_HI_OPEN, 0,
	  5, "-1", NULL, "below five" },
};

static const struct cfg_schema extra_schema = { extra_keys, 4, sizeof(struct extra_config),
						0, 0, 0 };

static int load_extra(struct extra_config *e, const char *text)
{
	char path[64];

	write_temp(text, strlen(text), path);
	int rc = schema_load(&extra_schema, e, path);
	unlink(path);
	return rc;
}

Test(config, bool_string_enum_types)
{
	struct extra_config e;
	char buf[256];

	schema_defaults(&extra_schema, &e);
	cr_expect_eq(e.flag, 0);
	cr_expect_str_eq(e.name, "ab");
	cr_expect_eq(e.algo, 1);
	cr_expect_eq(e.x, -1.0);

	cr_assert_eq(load_extra(&e, "moe:\n  flag: true\n  name: \"q\\\"z\"\n  algo: linear\n"),
		     0, "%s", err_detail());
	cr_expect_eq(e.flag, 1);
	cr_expect_str_eq(e.name, "q\"z");
	cr_expect_eq(e.algo, 0);

	struct sink o = { buf, sizeof buf, 0, 0, 0 };
	schema_emit(&extra_schema, &e, NULL, &o);
	buf[o.len] = '\0';
	cr_expect_str_eq(buf, "moe.flag: true\nmoe.name: \"q\\\"z\"\nmoe.algo: linear\n"
			      "moe.x: -1\n");

	static const struct bad_case bad[] = {
		{ "moe:\n  flag: yes\n", "line 2: moe.flag: 'yes' is not true or false" },
		{ "moe:\n  flag: \"true\"\n",
		  "line 2: moe.flag: \"true\" is a quoted string, not a boolean; "
		  "remove the quotes" },
		{ "moe:\n  name: abcdefgh\n", "line 2: moe.name: value is longer than 7 bytes" },
		{ "moe:\n  algo: 2DH\n", "line 2: moe.algo: '2DH' is not one of linear, 2dh" },
		{ "moe:\n  x: 5\n", "line 2: moe.x: 5 must be < 5" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		struct extra_config before = e;
		cr_expect_eq(load_extra(&e, bad[i].yaml), CORE_ECONFIG, "yaml:\n%s", bad[i].yaml);
		cr_expect_str_eq(err_detail(), bad[i].detail, "yaml:\n%s\ngot:  %s", bad[i].yaml,
				 err_detail());
		cr_expect_eq(memcmp(&e, &before, sizeof e), 0);
	}
	cr_expect_eq(schema_set(&extra_schema, &e, "moe.name="), 0, "empty string override");
	cr_expect_str_eq(e.name, "");
	cr_expect_eq(schema_set(&extra_schema, &e, "moe.algo=linear"), 0);
	cr_expect_eq(e.algo, 0);
}

/* ---- the man page lists exactly the table ------------------------------------------------- */

static const char *test_type_name(enum cfg_type t)
{
	static const char *const names[] = { "int", "long", "double", "u64", "bool", "string",
					     "enum" };
	return names[t];
}

Test(config, man_page_agrees_with_table)
{
	FILE *f = fopen("man/dpc-config.5", "r");
	cr_assert(f, "man/dpc-config.5 not found (run from the repository root)");
	static char page[1 << 17];
	size_t n = fread(page, 1, sizeof page - 1, f);
	fclose(f);
	page[n] = '\0';

	for (size_t i = 0; i < run_schema.n; i++) {
		const struct cfg_key *k = &run_schema.keys[i];
		char want[512], range[96];
		format_range(k, range, sizeof range);
		/* ".B model.n_layer" then "int, range [1, 1024], default 4." */
		if (k->flags & CFG_UNSET) /* "default 0" would be a value a file cannot give */
			snprintf(want, sizeof want, ".B %s.%s\n%s, range %s, absent by default.\n",
				 k->section, k->key, test_type_name(k->type), range);
		else if (k->type == CFG_BOOL) /* a range says nothing about true and false */
			snprintf(want, sizeof want, ".B %s.%s\nbool, default %s.\n", k->section,
				 k->key, k->def);
		else
			snprintf(want, sizeof want, ".B %s.%s\n%s, range %s, default %s.\n",
				 k->section, k->key, test_type_name(k->type), range, k->def);
		cr_expect(strstr(page, want) != NULL, "man page lacks the entry:\n%s", want);
		cr_expect(strstr(page, k->doc + 1) != NULL, "man page lacks the description of "
			  "%s.%s: %s", k->section, k->key, k->doc);
	}
	/* And no key the table does not have: every entry named section.key (the LEVELS
	 * section's own entries, name, owns and modules, have no dot). */
	size_t entries = 0;
	for (const char *p = page; (p = strstr(p, "\n.TP\n.B ")) != NULL; p++) {
		size_t word = strcspn(p + 8, " \n");
		if (memchr(p + 8, '.', word))
			entries++;
	}
	cr_expect_eq(entries, run_schema.n, "man page has %zu key entries, table %zu rows",
		     entries, run_schema.n);
}

/* config_load_with: defaults, then the file, then the overrides in order (the last wins), then
 * the cross-field checks; the first error stops it, naming the file or the override. */
Test(config, load_with_file_then_overrides_then_checks)
{
	struct run_config c, want;
	char path[64];
	const char *text = "train:\n  steps: 77\nmodel: {n_layer: 6}\n";

	write_temp(text, strlen(text), path);
	const char *sets[] = {"train.steps=5", "train.lr=0.02", "train.steps=9"};
	cr_assert_eq(config_load_with(&c, path, sets, 3), 0, "%s", err_detail());
	config_defaults(&want);
	want.model.n_layer = 6;
	want.train.lr = 0.02;
	want.train.steps = 9;
	cr_expect_eq(memcmp(&c, &want, sizeof c), 0, "file, then overrides in order");

	/* no file: the defaults and the overrides */
	cr_assert_eq(config_load_with(&c, NULL, sets + 1, 1), 0, "%s", err_detail());
	config_defaults(&want);
	want.train.lr = 0.02;
	cr_expect_eq(memcmp(&c, &want, sizeof c), 0, "defaults, then the override");

	/* an override that breaks a cross-field rule (n_embd % n_head) is caught by the checks */
	const char *bad[] = {"model.n_head=7"};
	cr_expect_eq(config_load_with(&c, path, bad, 1), CORE_ECONFIG);
	cr_expect(strstr(err_detail(), "n_head"), "%s", err_detail());
	/* a bad override stops before the rest */
	const char *unknown[] = {"train.nosuch=1", "model.n_head=7"};
	cr_expect_eq(config_load_with(&c, path, unknown, 2), CORE_ECONFIG);
	cr_expect(strstr(err_detail(), "nosuch"), "%s", err_detail());
	unlink(path);
}
