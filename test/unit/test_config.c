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

	memset(&c, 0, sizeof c); /* not the defaults: every value must come from the file */
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

	memset(&c, 0, sizeof c);
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

Test(config, empty_files_give_defaults)
{
	static const char *const texts[] = {
		"", "\n", "# only a comment\n", "---\n", "--- ~\n", "{}\n", "model:\n",
		"model:\ntrain: {}\n",
	};

	for (size_t i = 0; i < sizeof texts / sizeof texts[0]; i++) {
		struct run_config c, d;
		config_defaults(&c);
		config_defaults(&d);
		int rc = load_text(&c, texts[i]);
		cr_expect_eq(rc, 0, "yaml '%s': %s", texts[i], err_detail());
		cr_expect_eq(memcmp(&c, &d, sizeof c), 0, "yaml '%s' changed a value", texts[i]);
	}
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
	{ "model:\n  n_layer: 4\nfoo:\n  bar: 1\n", "line 3: unknown section 'foo'" },
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

/* ---- dump and hashes ---------------------------------------------------------------------- */

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
	"train.weight_decay: 0.10000000000000001\n"
	"train.beta1: 0.90000000000000002\n"
	"train.beta2: 0.94999999999999996\n"
	"train.eps: 1e-08\n"
	"train.grad_clip: 1\n"
	"train.eval_every: 100\n"
	"train.eval_batches: 16\n"
	"train.checkpoint_every: 500\n"
	"train.seed: 1\n";

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
	memset(&f, 0, sizeof f);
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
		cr_expect_eq(set_value(&w, k, scratch, k->def, strlen(k->def), st), 0,
			     "row %zu (%s.%s): default '%s' rejected: %s", i, k->section, k->key,
			     k->def, err_detail());
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

static const struct cfg_schema extra_schema = { extra_keys, 4, sizeof(struct extra_config) };

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
		snprintf(want, sizeof want, ".B %s.%s\n%s, range %s, default %s.\n", k->section,
			 k->key, test_type_name(k->type), range, k->def);
		cr_expect(strstr(page, want) != NULL, "man page lacks the entry:\n%s", want);
		cr_expect(strstr(page, k->doc + 1) != NULL, "man page lacks the description of "
			  "%s.%s: %s", k->section, k->key, k->doc);
	}
	/* And no key the table does not have. */
	size_t entries = 0;
	for (const char *p = page; (p = strstr(p, "\n.TP\n.B ")) != NULL; p++)
		entries++;
	cr_expect_eq(entries, run_schema.n, "man page has %zu key entries, table %zu rows",
		     entries, run_schema.n);
}
