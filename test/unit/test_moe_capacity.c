/* test_moe_capacity.c - capacity modes, first-choice priority and batch-prioritized routing
 * pinned on hand-made routings, with the expected capacity, slots and drops worked out by
 * hand in the comments; and encode/decode on a hand-checked 3-token example. The kernels
 * run on the host backends (cpu and the reference backend ref), on host buffers. */
#include <criterion/criterion.h>
#include <string.h>

#include "backend/backend.h"
#include "moe/moe.h"
#include "common/banned.h"

static struct backend *be;

/* Run body on the named backend: each case is a Test per backend, so a failure names it. */
static void on_backend(const char *name, void (*body)(void))
{
	cr_assert_eq(backend_open(&be, name, NULL), 0, "%s", name);
	body();
	backend_close(be);
	be = NULL;
}

#define TEST_ON_BACKENDS(name)                                                                 \
	Test(moe_capacity, name##_cpu) { on_backend("cpu", name); }                            \
	Test(moe_capacity, name##_ref) { on_backend("ref", name); }

struct routing_buf {
	struct backend_moe_route r;
	int32_t idx[16], loc[16];
	float score[16];
	int64_t count[8];
};

/* Slots by the backend's locations op (key NULL: token order). */
static void locations(struct routing_buf *b, int64_t C, const float *key)
{
	b->r.C = C;
	cr_assert_eq(be->op->moe_locations(be, b->idx, key, b->r.T, b->r.k, b->r.E, C, b->loc),
		     0, "on %s", be->name);
}

/* Dropped choices: those without a slot. */
static int64_t dropped(const struct routing_buf *b)
{
	int64_t n = 0;
	for (int64_t i = 0; i < b->r.T * b->r.k; i++)
		n += b->loc[i] < 0;
	return n;
}

/* Kept rows of expert e. */
static int64_t used(const struct routing_buf *b, int e)
{
	int64_t n = 0;
	for (int64_t i = 0; i < b->r.T * b->r.k; i++)
		n += b->idx[i] == e && b->loc[i] >= 0;
	return n;
}

/* The (token * k + rank) holding slot c of expert e, from idx and loc; -1 for padding. */
static int64_t slot_holder(const struct routing_buf *b, int e, int32_t c)
{
	for (int64_t i = 0; i < b->r.T * b->r.k; i++)
		if (b->idx[i] == e && b->loc[i] == c)
			return (i % b->r.T) * b->r.k + i / b->r.T;
	return -1;
}

static void setup(struct routing_buf *b, int64_t T, int E, int k, const int32_t *idx)
{
	memset(b, 0, sizeof *b);
	b->r.T = T;
	b->r.E = E;
	b->r.k = k;
	b->r.idx = b->idx;
	b->r.loc = b->loc;
	b->r.score = b->score;
	b->r.count = b->count;
	memcpy(b->idx, idx, sizeof(int32_t) * (size_t)(T * k));
	for (int64_t i = 0; i < T * k; i++)
		b->score[i] = 1.0f;
	cr_assert_eq(be->op->moe_count(be, b->idx, T * k, E, b->count), 0);
}

/* T = 4, E = 2, k = 2. First choices: t0..t2 -> e0, t3 -> e1; second choices: t0..t2 -> e1,
 * t3 -> e0. n_0 = n_1 = 4, k*T/E = 4. */
static const int32_t idx_a[8] = { 0, 0, 0, 1, /* rank 0 */ 1, 1, 1, 0 /* rank 1 */ };

static void three_modes_on(void)
{
	struct routing_buf b;
	struct {
		double x;
		int align;
		int64_t C;
	} cases[] = {
		/* Tutel: C = k * int(x * ceil(T/E)), ceil(T/E) = 2 here. */
		{ 1.0, 1, 4 },  /* 2 * int(2.0) = 4 */
		{ 0.5, 1, 2 },  /* 2 * int(1.0) = 2 */
		{ 0.7, 1, 2 },  /* 2 * int(1.4) = 2: truncated, not rounded up */
		{ 0.7, 4, 4 },  /* 2 aligned up to 4 */
		{ 1.6, 1, 6 },  /* 2 * int(3.2) = 6, above the need: fixed mode does not cap */
		{ 0.0, 1, 4 },  /* max n_e = 4 */
		{ -0.5, 1, 2 }, /* min(4, 2 * int(1.0)) */
		{ -3.0, 1, 4 }, /* min(4, 2 * int(6.0)) */
		{ 0.3, 1, 0 },  /* 2 * int(0.6) = 0: no slot (moe_forward refuses it) */
		{ 0.3, 4, 0 },  /* 0 stays 0 under alignment, as in Tutel */
	};

	setup(&b, 4, 2, 2, idx_a);
	cr_assert_eq(b.count[0], 4);
	cr_assert_eq(b.count[1], 4);
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		int64_t C = moe_capacity(b.count, 2, 4, 2, cases[i].x, cases[i].align);
		cr_assert_eq(C, cases[i].C, "setting %g align %d: C = %lld, expected %lld",
			     cases[i].x, cases[i].align, (long long)C, (long long)cases[i].C);
	}
	/* Adaptive with an uneven load: n = {3, 1}, k = 1, T = 4, E = 2. */
	int64_t cnt[2] = { 3, 1 };
	cr_assert_eq(moe_capacity(cnt, 2, 4, 1, 0.0, 1), 3, "no-drop mode: need is 3");
	cr_assert_eq(moe_capacity(cnt, 2, 4, 1, -1.0, 1), 2, "min(3, 1 * int(1 * 2) = 2)");
	cr_assert_eq(moe_capacity(cnt, 2, 4, 1, -2.0, 1), 3, "min(3, 4)");
}

TEST_ON_BACKENDS(three_modes_on)

static void first_choices_before_second_on(void)
{
	struct routing_buf b;

	/* C = 2: e0 gets t0, t1 (rank 0); t2's first choice is dropped. e1 gets t3's first
	 * choice at slot 0 although t0's second choice comes earlier in token order, then t0's
	 * second choice at slot 1; t1, t2 second choices to e1 and t3's to e0 are dropped. */
	setup(&b, 4, 2, 2, idx_a);
	locations(&b, 2, NULL);
	const int32_t loc[8] = { 0, 1, -1, 0, 1, -1, -1, -1 };
	for (int i = 0; i < 8; i++)
		cr_assert_eq(b.loc[i], loc[i], "C=2: choice %d (rank %d, token %d): slot %d, "
			     "expected %d", i, i / 4, i % 4, b.loc[i], loc[i]);
	cr_assert_eq(dropped(&b), 4);
	cr_assert_eq(used(&b, 0), 2);
	cr_assert_eq(used(&b, 1), 2);
	/* The holder of slot (e, c) = token * k + rank. */
	const int64_t st[4] = { 0 * 2 + 0, 1 * 2 + 0, 3 * 2 + 0, 0 * 2 + 1 };
	for (int i = 0; i < 4; i++)
		cr_assert_eq(slot_holder(&b, i / 2, i % 2), st[i], "slot %d: %lld, expected %lld",
			     i, (long long)slot_holder(&b, i / 2, i % 2), (long long)st[i]);

	/* C = 4: nothing dropped; e1: t3 (rank 0) at 0, then t0, t1, t2 (rank 1) at 1..3;
	 * e0: t0, t1, t2 at 0..2, t3 (rank 1) at 3. */
	setup(&b, 4, 2, 2, idx_a);
	locations(&b, 4, NULL);
	const int32_t loc4[8] = { 0, 1, 2, 0, 1, 2, 3, 3 };
	for (int i = 0; i < 8; i++)
		cr_assert_eq(b.loc[i], loc4[i], "C=4: choice %d: slot %d, expected %d", i,
			     b.loc[i], loc4[i]);
	cr_assert_eq(dropped(&b), 0);

	/* C = 5 (padding): used = 4 each, slot 4 of each expert is padding (-1). */
	setup(&b, 4, 2, 2, idx_a);
	locations(&b, 5, NULL);
	cr_assert_eq(slot_holder(&b, 0, 4), -1);
	cr_assert_eq(slot_holder(&b, 1, 4), -1);
	cr_assert_eq(used(&b, 0), 4);
}

TEST_ON_BACKENDS(first_choices_before_second_on)

static void batch_prioritized_routing_on(void)
{
	struct routing_buf b;
	/* k = 1, T = 4, E = 2: t0..t2 -> e0, t3 -> e1; C = 2. Keys (top gate values):
	 * t0 0.6, t1 0.5, t2 0.6, t3 0.99. BPR order: t3, t0, t2, t1 (t0 before t2: a tie
	 * keeps token order). e0: t0 slot 0, t2 slot 1, t1 dropped. Without BPR: t0 0, t1 1,
	 * t2 dropped. */
	const int32_t idx[4] = { 0, 0, 0, 1 };
	const float key[4] = { 0.6f, 0.5f, 0.6f, 0.99f };

	setup(&b, 4, 2, 1, idx);
	locations(&b, 2, key);
	const int32_t bpr[4] = { 0, -1, 1, 0 };
	for (int i = 0; i < 4; i++)
		cr_assert_eq(b.loc[i], bpr[i], "BPR: token %d: slot %d, expected %d", i, b.loc[i],
			     bpr[i]);
	cr_assert_eq(dropped(&b), 1);

	setup(&b, 4, 2, 1, idx);
	locations(&b, 2, NULL);
	const int32_t plain[4] = { 0, 1, -1, 0 };
	for (int i = 0; i < 4; i++)
		cr_assert_eq(b.loc[i], plain[i], "no BPR: token %d: slot %d, expected %d", i,
			     b.loc[i], plain[i]);

	/* k = 2 with BPR: ranks stay outer. T = 3, E = 2; rank 0: t0 -> e0, t1 -> e1,
	 * t2 -> e0; rank 1: t0 -> e1, t1 -> e0, t2 -> e1. Keys 0.5, 0.7, 0.9: order t2, t1,
	 * t0. C = 2. Rank 0: e0: t2 slot 0, t0 slot 1; e1: t1 slot 0. Rank 1 (t2, t1, t0):
	 * t2 -> e1 slot 1; t1 -> e0 full, dropped; t0 -> e1 full, dropped. */
	const int32_t idx2[6] = { 0, 1, 0, 1, 0, 1 };
	const float key2[3] = { 0.5f, 0.7f, 0.9f };
	setup(&b, 3, 2, 2, idx2);
	locations(&b, 2, key2);
	const int32_t loc2[6] = { 1, 0, 0, -1, -1, 1 };
	for (int i = 0; i < 6; i++)
		cr_assert_eq(b.loc[i], loc2[i], "BPR k=2: choice %d: slot %d, expected %d", i,
			     b.loc[i], loc2[i]);
	cr_assert_eq(dropped(&b), 2);
}

TEST_ON_BACKENDS(batch_prioritized_routing_on)

static void encode_decode_by_hand_on(void)
{
	struct routing_buf b;
	/* T = 3, M = 2, E = 2, k = 2, C = 2. rank 0: t0 -> e1, t1 -> e0, t2 -> e1;
	 * rank 1: t0 -> e0, t1 -> e1, t2 -> e0. Slots: e0: t1 (r0) 0, t0 (r1) 1, t2 (r1)
	 * dropped; e1: t0 (r0) 0, t2 (r0) 1, t1 (r1) dropped. */
	const int32_t idx[6] = { 1, 0, 1, 0, 1, 0 };
	const float x[6] = { 1, 2, 3, 4, 5, 6 };
	float disp[8], y[6], dx[6], dscore[6];

	setup(&b, 3, 2, 2, idx);
	const float sc[6] = { 0.75f, 0.5f, 0.9f, 0.25f, 0.5f, 0.1f };
	memcpy(b.score, sc, sizeof sc);
	locations(&b, 2, NULL);
	memset(disp, 0x7f, sizeof disp);
	cr_assert_eq(be->op->moe_encode(be, &b.r, x, disp, 2, 1), 0);
	const float want[8] = { 3, 4, 1, 2, /* e1 */ 1, 2, 5, 6 };
	for (int i = 0; i < 8; i++)
		cr_assert_float_eq(disp[i], want[i], 0.0f, "disp[%d] = %g, expected %g", i,
				   disp[i], want[i]);
	/* Decode of eo = disp + 10: y0 = 0.75 * (11,12) + 0.25 * (11,12) = (11, 12);
	 * y1 = 0.5 * (13, 14) (second choice dropped); y2 = 0.9 * (15, 16). */
	float eo[8];
	for (int i = 0; i < 8; i++)
		eo[i] = disp[i] + 10.0f;
	cr_assert_eq(be->op->moe_decode(be, &b.r, eo, y, 2), 0);
	const float wy[6] = { 11, 12, 6.5f, 7, 13.5f, 14.4f };
	for (int i = 0; i < 6; i++)
		cr_assert_float_eq(y[i], wy[i], 1e-5f, "y[%d] = %g, expected %g", i, y[i], wy[i]);
	/* Decode backward with dy = 1: dscore = row sums of the kept eo rows, 0 if dropped;
	 * d_eo = score in the kept rows. */
	const float dy[6] = { 1, 1, 1, 1, 1, 1 };
	float deo[8];
	cr_assert_eq(be->op->moe_decode_backward(be, &b.r, dy, eo, deo, dscore, 2, 1), 0);
	const float wds[6] = { 23, 27, 31, 23, 0, 0 };
	for (int i = 0; i < 6; i++)
		cr_assert_float_eq(dscore[i], wds[i], 1e-5f, "dscore[%d] = %g, expected %g", i,
				   dscore[i], wds[i]);
	const float wdeo[8] = { 0.5f, 0.5f, 0.25f, 0.25f, 0.75f, 0.75f, 0.9f, 0.9f };
	for (int i = 0; i < 8; i++)
		cr_assert_float_eq(deo[i], wdeo[i], 1e-6f, "d_eo[%d] = %g, expected %g", i, deo[i],
				   wdeo[i]);
	/* Encode backward, unweighted: dx0 = disp rows e1/0 + e0/1; dx1 = e0/0; dx2 = e1/1. */
	cr_assert_eq(be->op->moe_encode_backward(be, &b.r, disp, dx, 2), 0);
	const float wdx[6] = { 2, 4, 3, 4, 5, 6 };
	for (int i = 0; i < 6; i++)
		cr_assert_float_eq(dx[i], wdx[i], 1e-6f, "dx[%d] = %g, expected %g", i, dx[i],
				   wdx[i]);
}

TEST_ON_BACKENDS(encode_decode_by_hand_on)

Test(moe_capacity, float_product_truncated_as_python_int)
{
	int64_t cnt[1] = { 1000 };
	/* 1.1 * 1000 is 1100.0000000000002 in binary; Python's int() truncates it to 1100. */
	cr_assert_eq(moe_capacity(cnt, 1, 1000, 1, 1.1, 1), 1100);
	cr_assert_eq(moe_capacity(cnt, 1, 1000, 1, 1.1009, 1), 1100, "int(1100.9) = 1100");
	cr_assert_eq(moe_capacity(cnt, 1, 1000, 1, 1.101, 1), 1101);
	/* 0.29 * 100 is 28.999999999999996 in binary: Tutel's int() gives 28, and so do we. */
	cr_assert_eq(moe_capacity(cnt, 1, 100, 1, 0.29, 1), 28);
}

Test(moe_capacity, tokens_not_divisible_by_experts)
{
	/* Tutel rounds T/E up before the factor: T = 5, E = 2 -> 3 samples per expert. */
	int64_t cnt[2] = { 5, 5 };
	cr_assert_eq(moe_capacity(cnt, 2, 5, 2, 1.0, 1), 6, "2 * int(1.0 * 3)");
	cr_assert_eq(moe_capacity(cnt, 2, 5, 2, 0.7, 1), 4, "2 * int(2.1)");
	cr_assert_eq(moe_capacity(cnt, 2, 5, 2, -0.7, 1), 4, "min(5, 4)");
	cr_assert_eq(moe_capacity(cnt, 2, 5, 2, -2.0, 1), 5, "min(5, 12)");
	cr_assert_eq(moe_capacity_fixed(3, 7, 1, 1.0), 3, "1 * int(ceil(7/3))");
	cr_assert_eq(moe_capacity_fixed(16, 16384, 2, 1.25), 2560, "2 * int(1.25 * 1024)");
	/* Beyond any real capacity the product saturates at 2^53 rather than overflow. */
	cr_assert_eq(moe_capacity_fixed(2, 1000, 2, 1e30), (int64_t)1 << 53);
	cr_assert_eq(moe_capacity(cnt, 2, 5, 2, -1e30, 1), 5, "min(5, saturated)");
}
