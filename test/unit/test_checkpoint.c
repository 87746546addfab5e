/* test_checkpoint.c - ckpt_load's CKPT_BODY (a base model's blocks into a window router,
 * whose head has another row count) and the n_out key ckpt_save writes for such a head.
 * The reference is the seeded initialisation itself: the base file holds 3 x init(seed 5),
 * so every view but the head must come back as that, by name, and the head as the router's
 * own init(seed 9), untouched.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "common/err.h"
#include "io/config.h"
#include "model/checkpoint.h"
#include "model/gpt2.h"
#include "testutil.h"

#include "common/banned.h"

TestSuite(checkpoint, .timeout = 60);

static const struct model_config base_cfg = {.n_layer = 2, .n_embd = 16, .n_head = 2,
					     .seq_len = 12, .vocab_size = 40};

struct fx {
	char dir[256], base[300];
	struct backend *be;
};

static void open_fx(struct fx *f)
{
	tu_mkdtemp(f->dir, sizeof f->dir, "checkpoint");
	cr_assert_eq(backend_open(&f->be, "cpu", &(struct backend_params){.threads = 1}), 0, "%s",
		     err_detail());
	snprintf(f->base, sizeof f->base, "%s/base.safetensors", f->dir);
	struct gpt2 g;
	struct run_config c;
	config_defaults(&c);
	c.model = base_cfg;
	cr_assert_eq(gpt2_create_forward(&g, &base_cfg, 1, 1, f->be), 0, "%s", err_detail());
	cr_assert_eq(gpt2_init_params(&g, 5), 0);
	for (size_t k = 0; k < g.nparams; k++)
		g.params[k] *= 3.0f;
	cr_assert_eq(ckpt_save(f->base, &g, &c, 7, 0, NULL, 0), 0, "%s", err_detail());
	gpt2_free(&g);
}

static void close_fx(struct fx *f)
{
	backend_close(f->be);
	tu_rm_tree(f->dir);
}

/* The view named name of a model of cfg initialised from seed (its floats, caller frees). */
static float *init_view(const struct model_config *cfg, uint64_t seed, const char *name,
			size_t *n, struct backend *be)
{
	struct gpt2 g;
	cr_assert_eq(gpt2_create_forward(&g, cfg, 1, 1, be), 0, "%s", err_detail());
	cr_assert_eq(gpt2_init_params(&g, seed), 0);
	float *out = NULL;
	for (int i = 0; i < g.nviews; i++)
		if (!strcmp(g.views[i].name, name)) {
			*n = (size_t)tensor_numel(&g.views[i]);
			out = malloc(sizeof *out * *n);
			cr_assert(out);
			memcpy(out, g.views[i].data, sizeof *out * *n);
		}
	gpt2_free(&g);
	cr_assert(out, "no view %s", name);
	return out;
}

Test(checkpoint, body_loads_every_view_but_the_head)
{
	struct fx f;
	open_fx(&f);
	struct model_config rc = base_cfg;
	rc.n_out = 3;
	struct gpt2 r;
	cr_assert_eq(gpt2_create(&r, &rc, 1, rc.seq_len, f.be), 0, "%s", err_detail());
	cr_assert_eq(gpt2_init_params(&r, 9), 0);
	cr_assert_eq(ckpt_load(f.base, &r, CKPT_BODY, NULL), 0, "%s", err_detail());
	int heads = 0;
	for (int i = 0; i < r.nviews; i++) {
		const struct tensor *t = &r.views[i];
		const int head = !strcmp(t->name, "lm_head.weight");
		size_t n;
		float *want = head ? init_view(&rc, 9, t->name, &n, f.be)
				   : init_view(&base_cfg, 5, t->name, &n, f.be);
		cr_assert_eq((int64_t)n, tensor_numel(t), "%s: %lld floats, want %zu", t->name,
			     (long long)tensor_numel(t), n);
		if (head)
			cr_expect_eq(t->ne[0], 3, "the head has the router's rows: %lld",
				     (long long)t->ne[0]);
		for (size_t k = 0; k < n; k++)
			if (((const float *)t->data)[k] != (head ? 1.0f : 3.0f) * want[k]) {
				cr_expect_fail("%s[%zu] = %.9g, want %.9g (%s)", t->name, k,
					       ((const float *)t->data)[k],
					       (head ? 1.0f : 3.0f) * want[k],
					       head ? "the router's own head" : "the base's");
				break;
			}
		heads += head;
		free(want);
	}
	cr_expect_eq(heads, 1);

	/* the router written back says its head's rows (n_out), read by ckpt_info */
	char out[300];
	snprintf(out, sizeof out, "%s/router.safetensors", f.dir);
	struct run_config c;
	config_defaults(&c);
	c.model = base_cfg;
	cr_assert_eq(ckpt_save(out, &r, &c, 0, 0, NULL, 0), 0, "%s", err_detail());
	struct ckpt_info info;
	cr_assert_eq(ckpt_info(out, &info), 0, "%s", err_detail());
	cr_expect_eq(info.model.n_out, 3, "n_out read back %d", info.model.n_out);
	cr_assert_eq(ckpt_info(f.base, &info), 0, "%s", err_detail());
	cr_expect_eq(info.model.n_out, 0, "a language model's file has no n_out");
	gpt2_free(&r);
	close_fx(&f);
}

Test(checkpoint, body_refuses_another_shape_and_company)
{
	struct fx f;
	open_fx(&f);
	struct model_config wide = base_cfg;
	wide.n_embd = 32;
	wide.n_out = 3;
	struct gpt2 r;
	cr_assert_eq(gpt2_create(&r, &wide, 1, wide.seq_len, f.be), 0, "%s", err_detail());
	cr_expect_eq(ckpt_load(f.base, &r, CKPT_BODY, NULL), CORE_ESHAPE,
		     "another width is refused: %s", err_detail());
	cr_expect(err_file() && strstr(err_file(), "base.safetensors"), "the file is named: %s",
		  err_file() ? err_file() : "(none)");
	gpt2_free(&r);
	struct model_config rc = base_cfg;
	rc.n_out = 3;
	cr_assert_eq(gpt2_create(&r, &rc, 1, rc.seq_len, f.be), 0, "%s", err_detail());
	cr_expect_eq(ckpt_load(f.base, &r, CKPT_PARAMS, NULL), CORE_ESHAPE,
		     "the whole file into a head of other rows is refused");
	cr_expect_eq(ckpt_load(f.base, &r, CKPT_BODY | CKPT_MOMENTS, NULL), CORE_EUSAGE,
		     "CKPT_BODY with moments: %s", err_detail());
	gpt2_free(&r);
	close_fx(&f);
}
