/* test_pathset.c - which paths a routing command reads (route/pathset.h) and the run
 * directory's notion of a finished phase (rundir_missing_module, rundir_last_phase), on a
 * DiPaCo 2x2 run directory of 3 phases whose module files are made by hand: phases 1 and 2
 * complete, phase 3 missing upper.1. The last finished phase is 2 (a later partial phase does
 * not count, an earlier one missing does not stop the search), and pathset_open picks it
 * when no phase is given; every misuse is one CORE_EUSAGE naming the command.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "common/err.h"
#include "dipaco/rundir.h"
#include "io/config.h"
#include "route/pathset.h"
#include "testutil.h"

TestSuite(pathset, .timeout = 30);

static void touch(const char *dir, const char *name)
{
	char p[1024];
	snprintf(p, sizeof p, "%s/%s", dir, name);
	FILE *fp = fopen(p, "w");
	cr_assert(fp, "create %s", p);
	fclose(fp);
}

/* A run directory of configs/dipaco-2x2.yaml with 3 phases, the modules of `have` there. */
static void make_run(char *dir, size_t n, const char *const *have, int nhave)
{
	struct run_config c;
	struct rundir r;
	tu_mkdtemp(dir, n, "pathset");
	config_defaults(&c);
	cr_assert_eq(config_load(&c, "configs/dipaco-2x2.yaml"), 0, "(run from the repository "
		     "root) %s", err_detail());
	cr_assert_eq(config_set(&c, "dipaco.phases=3"), 0, "%s", err_detail());
	cr_assert_eq(rundir_create(dir, &c), 0, "%s", err_detail());
	cr_assert_eq(rundir_open(&r, dir, 0), 0, "%s", err_detail());
	for (long t = 1; t <= 3; t++)
		cr_assert_eq(rundir_make_phase(&r, t), 0, "%s", err_detail());
	rundir_close(&r);
	for (int i = 0; i < nhave; i++)
		touch(dir, have[i]);
}

static const char *const two_and_a_half[] = {
	"phase-0001/modules/lower.0.safetensors", "phase-0001/modules/lower.1.safetensors",
	"phase-0001/modules/upper.0.safetensors", "phase-0001/modules/upper.1.safetensors",
	"phase-0002/modules/lower.0.safetensors", "phase-0002/modules/lower.1.safetensors",
	"phase-0002/modules/upper.0.safetensors", "phase-0002/modules/upper.1.safetensors",
	"phase-0003/modules/lower.0.safetensors", "phase-0003/modules/lower.1.safetensors",
	"phase-0003/modules/upper.0.safetensors",
};

Test(pathset, last_phase_is_the_last_with_every_module)
{
	char dir[256], miss[RUNDIR_PATH_MAX], want[1024];
	struct rundir r;
	make_run(dir, sizeof dir, two_and_a_half, 11);
	cr_assert_eq(rundir_open(&r, dir, 0), 0, "%s", err_detail());
	cr_expect_eq(rundir_missing_module(&r, 1, miss, sizeof miss), 0);
	cr_expect_eq(rundir_missing_module(&r, 2, miss, sizeof miss), 0);
	cr_expect_eq(rundir_missing_module(&r, 3, miss, sizeof miss), 1);
	snprintf(want, sizeof want, "%s/phase-0003/modules/upper.1.safetensors", dir);
	cr_expect_str_eq(miss, want);
	cr_expect_eq(rundir_last_phase(&r), 2);
	rundir_close(&r);
	tu_rm_tree(dir);

	/* phase 1 incomplete, phase 2 complete: 2 */
	make_run(dir, sizeof dir, two_and_a_half + 1, 7);
	cr_assert_eq(rundir_open(&r, dir, 0), 0, "%s", err_detail());
	cr_expect_eq(rundir_last_phase(&r), 2);
	rundir_close(&r);
	tu_rm_tree(dir);

	/* nothing trained: 0 */
	make_run(dir, sizeof dir, NULL, 0);
	cr_assert_eq(rundir_open(&r, dir, 0), 0, "%s", err_detail());
	cr_expect_eq(rundir_last_phase(&r), 0);
	rundir_close(&r);
	tu_rm_tree(dir);
}

/* pathset_open of ps, expecting code and a detail holding what. */
static void expect_open(struct pathset *ps, struct backend *be, int code, const char *what)
{
	cr_expect_eq(pathset_open(ps, be, 1, "eval"), code, "%s: got '%s'", what, err_detail());
	cr_expect(strstr(err_detail(), what), "'%s' not in '%s'", what, err_detail());
	pathset_close(ps);
}

Test(pathset, default_phase_and_misuse)
{
	char dir[256];
	struct backend *be;
	make_run(dir, sizeof dir, two_and_a_half, 11);
	cr_assert_eq(backend_open(&be, "cpu", &(struct backend_params){.threads = 1}), 0);

	/* no phase given: the last finished one, 2; the empty module files are then refused */
	struct pathset ps = {.run = dir, .phase = -1};
	const int rc = pathset_open(&ps, be, 1, "eval");
	char msg[1200];
	err_format(msg, sizeof msg, rc);
	cr_expect_eq(rc, CORE_ETRUNC, "%s", msg);
	cr_expect_eq(ps.phase, 2, "default phase %ld", ps.phase);
	cr_expect(strstr(msg, "phase-0002/modules/lower.0.safetensors"), "%s", msg);
	pathset_close(&ps);

	expect_open(&(struct pathset){.phase = -1}, be, CORE_EUSAGE,
		    "eval: give the paths with --run RUNDIR or with --path CKPT");
	expect_open(&(struct pathset){.run = dir, .phase = -1, .files = {"a"}, .nfiles = 1}, be,
		    CORE_EUSAGE, "(one of them)");
	expect_open(&(struct pathset){.phase = 2, .files = {"a"}, .nfiles = 1}, be, CORE_EUSAGE,
		    "eval: --phase goes with --run");
	expect_open(&(struct pathset){.phase = -1, .early = 1, .files = {"a"}, .nfiles = 1}, be,
		    CORE_EUSAGE, "eval: --early-stop picks phases of a run");
	expect_open(&(struct pathset){.run = dir, .phase = 4}, be, CORE_EUSAGE,
		    "eval: --phase 4 is outside the run's phases 1..3");
	expect_open(&(struct pathset){.run = dir, .phase = 0}, be, CORE_EUSAGE,
		    "--phase 0 is outside");
	backend_close(be);
	tu_rm_tree(dir);

	make_run(dir, sizeof dir, NULL, 0);
	cr_assert_eq(backend_open(&be, "cpu", &(struct backend_params){.threads = 1}), 0);
	expect_open(&(struct pathset){.run = dir, .phase = -1}, be, CORE_ENOTFOUND,
		    "no phase has all its modules yet");
	backend_close(be);
	tu_rm_tree(dir);
}
