/* test_moe_bench.c - moe_bench_check refuses, before anything runs, a dense baseline that
 * would not fit in memory, at sizes whose byte counts overflow size_t too. */
#include <criterion/criterion.h>
#include <string.h>

#include "common/err.h"
#include "common/progress.h"
#include "moe/moe_bench.h"
#include "common/banned.h"

TestSuite(moe_bench, .timeout = 10);

static struct moe_bench_opts opts(int64_t T, int64_t M, int64_t H, int E, int k)
{
	struct moe_bench_opts o = {.iters = 1, .input_grad = 1, .aux_weight = MOE_BENCH_AUX_WEIGHT};
	moe_config_default(&o.cfg, T, M, H, E);
	o.cfg.k = k;
	o.dense_T = T;
	return o;
}

Test(moe_bench, check_refuses_a_dense_run_beyond_memory)
{
	cr_assert(phys_memory_bytes() > 0);
	/* [T,E,C] floats with C = k*ceil(T/E): 4*T*k*T bytes, 80 GB at T = 1e5 and 8 TB at 1e6. */
	struct moe_bench_opts o = opts(1000000, 8, 8, 64, 2);
	cr_assert_eq(moe_bench_check(&o, 0), 0);
	cr_assert_eq(moe_bench_check(&o, 1), CORE_ENOMEM);
	cr_assert(strstr(err_detail(), "the dense formulation needs "), "%s", err_detail());
	o.dense_T = 64; /* --dense-tokens */
	cr_assert_eq(moe_bench_check(&o, 1), 0, "%s", err_detail());
	struct moe_bench_opts small = opts(64, 8, 16, 4, 2);
	cr_assert_eq(moe_bench_check(&small, 1), 0, "%s", err_detail());
}

Test(moe_bench, check_does_not_overflow_at_the_largest_sizes)
{
	/* A fixed capacity C = 2^35 at T = 2^10, E = 2^16, M = H = 2^20, forward only: the
	 * [T,E,C] and [E,C,M] buffers are multiples of 2^64 bytes, so their size_t sum wraps to
	 * the 1.3 GB of the small ones, which would fit (on a machine of more than 2.2 GB). */
	struct moe_bench_opts o = opts(1024, 1 << 20, 1 << 20, 65536, 1);
	o.forward_only = 1;
	o.cfg.capacity_setting = 34359738368.0;
	cr_assert_eq(moe_config_check(&o.cfg), 0, "%s", err_detail());
	cr_assert_eq(moe_bench_check(&o, 1), CORE_ENOMEM);
}
