/* fuzz_tutel.c - the MoE layer read in Tutel's state-dict names (lib/moe/moe_tutel.c,
 * moe-bench --load) on top of the safetensors reader, for a layer of E 2, M 4, H 6 on the
 * ref backend.
 *
 * Before each input the parameters are filled with a pattern. A failure must keep the error
 * contract naming the input and leave the parameters exactly as they were. An accepted file
 * must have put every parameter where moe.h's layout says, read back independently with
 * st_read in Tutel's layout (gates.0.wg.weight [E, M] is wg [M, E] transposed, fc1's [E, H, M]
 * is w1 [E, M, H] transposed, the rest as they are), bit for bit; and moe_tutel_save of the
 * loaded layer must load again to the same bits. Every crc key is recomputed first
 * (fuzz_fix_st_crcs), so mutations reach the names, dtypes and shapes behind the checksums.
 * Seeds: corpus/tutel. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "common/err.h"
#include "common/tensor.h"
#include "io/safetensors.h"
#include "moe/moe_tutel.h"
#include "common/banned.h"

enum { E = 2, M = 4, H = 6 };

static struct backend *be;
static struct moe_config cfg;
static struct moe_dist_place pl;

static float *tensor_of(struct moe_params *p, int i)
{
	float *t[5] = {p->wg, p->w1, p->b1, p->w2, p->b2};
	return t[i];
}

static const size_t count[5] = {M * E, E * M * H, E * H, E * H * M, E * M};

static void pattern(struct moe_params *p)
{
	for (int i = 0; i < 5; i++)
		for (size_t j = 0; j < count[i]; j++)
			tensor_of(p, i)[j] = 1000.0f * (float)(i + 1) + (float)j;
}

static void same_params(struct moe_params *a, struct moe_params *b, const char *what)
{
	for (int i = 0; i < 5; i++)
		if (memcmp(tensor_of(a, i), tensor_of(b, i), sizeof(float) * count[i]) != 0)
			fuzz_fail("%s: parameter %d differs", what, i);
}

/* The accepted file, read again in Tutel's layout, against moe.h's layout of p. */
static void check_layout(const char *path, struct moe_params *p)
{
	static const char *const names[5] = {
		"gates.0.wg.weight", "experts.batched_fc1_w", "experts.batched_fc1_bias",
		"experts.batched_fc2_w", "experts.batched_fc2_bias"};
	static const int64_t shape[5][3] = {{E, M}, {E, H, M}, {E, H}, {E, H, M}, {E, M}};
	static const int nd[5] = {2, 3, 2, 3, 2};
	struct st_file f;
	float buf[E * H * M];
	int rc = st_open(&f, path, 0);
	if (rc)
		fuzz_fail("st_open failed (%d) on a file moe_tutel_load accepted", rc);
	for (int i = 0; i < 5; i++) {
		struct tensor t;
		tensor_view(&t, DT_F32, nd[i], shape[i], buf, names[i]);
		if ((rc = st_read(&f, names[i], &t)) != 0)
			fuzz_fail("st_read of '%s' failed (%d) in an accepted file", names[i], rc);
		const float *got = tensor_of(p, i);
		for (int a = 0; a < E; a++)
			for (size_t j = 0; j < count[i] / E; j++) {
				size_t file = (size_t)a * (count[i] / E) + j, ours = file;
				if (i == 0) /* file [e][m] = wg[m][e] */
					ours = j * E + (size_t)a;
				else if (i == 1) /* file [e][h][m] = w1[e][m][h] */
					ours = (size_t)a * M * H + (j % M) * H + j / M;
				if (memcmp(&got[ours], &buf[file], sizeof(float)) != 0)
					fuzz_fail("'%s' element %zu is not where moe.h puts it", names[i],
						  file);
			}
	}
	st_close(&f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct moe_params p, q;
	int rc;

	if (!be) {
		moe_config_default(&cfg, 8, M, H, E);
		moe_tutel_place_one(&pl, &cfg);
		if (backend_open(&be, "ref", &(struct backend_params){.threads = 1}) != 0 ||
		    moe_params_alloc(&p, &cfg, be) != 0 || moe_params_alloc(&q, &cfg, be) != 0)
			fuzz_fail("cannot open the ref backend: %s", err_detail());
	}
	size_t fixed_size = 0;
	uint8_t *fixed = fuzz_fix_st_crcs(data, size, &fixed_size);
	const char *path = fixed ? fuzz_write("layer.safetensors", fixed, fixed_size)
				 : fuzz_write("layer.safetensors", data, size);
	free(fixed);

	pattern(&p);
	pattern(&q);
	if ((rc = moe_tutel_load(path, &cfg, &pl, &p, 1)) != 0) {
		fuzz_check_error("moe_tutel_load", rc, path);
		same_params(&q, &p, "a refused file changed the parameters");
		return 0;
	}
	check_layout(path, &p);
	const char *back = fuzz_path("back.safetensors");
	if ((rc = moe_tutel_save(back, &cfg, &pl, &p, 1, NULL)) != 0)
		fuzz_fail("moe_tutel_save of a loaded layer failed (%d): %s", rc, err_detail());
	if ((rc = moe_tutel_load(back, &cfg, &pl, &q, 1)) != 0)
		fuzz_fail("moe_tutel_load of what moe_tutel_save wrote failed (%d): %s", rc,
			  err_detail());
	same_params(&p, &q, "saved and loaded again");
	fuzz_ok();
	return 0;
}
