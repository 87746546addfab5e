/* moe_tutel.c - the layer's parameters in Tutel's state-dict names (moe_tutel.h). */
#include "moe/moe_tutel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "common/tensor.h"
#include "io/safetensors.h"

#include "common/banned.h"

enum { T_WG, T_W1, T_B1, T_W2, T_B2, T_NP };

static const char *const names[T_NP] = {
	"gates.0.wg.weight", "experts.batched_fc1_w", "experts.batched_fc1_bias",
	"experts.batched_fc2_w", "experts.batched_fc2_bias",
};

void moe_tutel_place_one(struct moe_dist_place *pl, const struct moe_config *cfg)
{
	*pl = (struct moe_dist_place){.W = 1, .q = 0, .s = 1, .El = cfg->E, .Hs = cfg->H,
				      .b2n = (int64_t)cfg->E * cfg->M, .r_max = 1};
}

/* The Tutel shapes of the five tensors on this rank. */
static void shapes(const struct moe_config *cfg, const struct moe_dist_place *pl,
		   int64_t ne[T_NP][3], int nd[T_NP])
{
	const int64_t El = pl->El, Hs = pl->Hs, M = cfg->M;
	const int64_t v[T_NP][3] = {{cfg->E, M, 0}, {El, Hs, M}, {El, Hs, 0}, {El, Hs, M},
				    {El, pl->b2n / El, 0}};
	const int d[T_NP] = {2, 3, 2, 3, 2};
	memcpy(ne, v, sizeof v);
	memcpy(nd, d, sizeof d);
}

static size_t count(const int64_t *ne, int nd)
{
	size_t n = 1;
	for (int i = 0; i < nd; i++)
		n *= (size_t)ne[i];
	return n;
}

/* dst[e][b][a] = src[e][a][b] for E blocks of A x B */
static void transpose_blocks(float *dst, const float *src, int64_t E, int64_t A, int64_t B)
{
	for (int64_t e = 0; e < E; e++)
		for (int64_t a = 0; a < A; a++)
			for (int64_t b = 0; b < B; b++)
				dst[(e * B + b) * A + a] = src[(e * A + a) * B + b];
}

int moe_tutel_save(const char *path, const struct moe_config *cfg,
		   const struct moe_dist_place *pl, const struct moe_params *p, int full,
		   const struct moe_tutel_step *st)
{
	struct backend *be = p->be;
	int64_t ne[T_NP][3];
	int nd[T_NP];
	shapes(cfg, pl, ne, nd);
	const float *src[T_NP] = {p->wg, p->w1, p->b1, p->w2, p->b2};
	float *host[T_NP + 2] = {NULL}, *tmp = NULL;
	struct tensor t[T_NP + 3];
	const struct tensor *ts[T_NP + 3];
	int64_t E = cfg->E;
	int n = 0, rc = 0;

	for (int i = 0; i < T_NP && !rc; i++) {
		const size_t k = count(ne[i], nd[i]);
		if (!(host[i] = malloc(sizeof(float) * (k ? k : 1))) ||
		    (i <= T_W1 && !tmp && !(tmp = malloc(sizeof(float) * (count(ne[T_W1], 3) +
									 count(ne[T_WG], 2))))))
			rc = err_set(CORE_ENOMEM, path, "cannot allocate the layer on the host");
		else if ((rc = be->op->download(be, i == T_WG || (i == T_W1 && full) ? tmp : host[i],
						src[i], sizeof(float) * k)) < 0)
			break;
		if (!rc && i == T_WG) /* moe.h's wg [M, E] -> nn.Linear's [E, M] */
			transpose_blocks(host[i], tmp, 1, cfg->M, cfg->E);
		if (!rc && i == T_W1 && full) /* [E, M, H] in-out -> [E, H, M] out-in */
			transpose_blocks(host[i], tmp, cfg->E, cfg->M, cfg->H);
	}
	for (int i = 0; i < T_NP && !rc; i++) {
		tensor_view(&t[n], DT_F32, nd[i], ne[i], host[i], names[i]);
		ts[n] = &t[n];
		n++;
	}
	if (!rc) {
		tensor_view(&t[n], DT_I64, 0, NULL, &E, "_num_global_experts");
		ts[n] = &t[n];
		n++;
	}
	const float *io[2] = {st ? st->x : NULL, st ? st->y : NULL};
	static const char *const ionames[2] = {"moe_bench.input", "moe_bench.output"};
	const int64_t T = st ? st->T : 0;
	for (int i = 0; i < 2 && !rc && st; i++) {
		const int64_t e2[2] = {T, cfg->M};
		if (!(host[T_NP + i] = malloc(sizeof(float) * (size_t)(T * cfg->M + 1))))
			rc = err_set(CORE_ENOMEM, path, "cannot allocate the step on the host");
		else if ((rc = be->op->download(be, host[T_NP + i], io[i],
						sizeof(float) * (size_t)(T * cfg->M))) == 0) {
			tensor_view(&t[n], DT_F32, 2, e2, host[T_NP + i], ionames[i]);
			ts[n] = &t[n];
			n++;
		}
	}
	char sw[16], sq[16], se[24], sm[24], sh[24], sk[16], sa[16], sb[8], sn[32], sc[32],
		ss[24];
	snprintf(sw, sizeof sw, "%d", pl->W);
	snprintf(sq, sizeof sq, "%d", pl->q);
	snprintf(se, sizeof se, "%d", cfg->E);
	snprintf(sm, sizeof sm, "%lld", (long long)cfg->M);
	snprintf(sh, sizeof sh, "%lld", (long long)cfg->H);
	snprintf(sk, sizeof sk, "%d", cfg->k);
	snprintf(sa, sizeof sa, "%d", cfg->capacity_align);
	snprintf(sb, sizeof sb, "%d", cfg->bpr);
	snprintf(sn, sizeof sn, "%.9g", (double)cfg->gate_noise);
	snprintf(sc, sizeof sc, "%.17g", st ? st->setting : cfg->capacity_setting);
	snprintf(ss, sizeof ss, "%ld", st ? st->step : 0L);
	const struct st_kv meta[] = {
		{"format", "tutel-moe-layer"}, {"written_by", "libcore moe_tutel_save"},
		{"world", sw}, {"rank", sq}, {"experts", se}, {"model_dim", sm},
		{"hidden_dim", sh}, {"top_k", sk}, {"activation", moe_act_name(cfg->act)},
		{"batch_prioritized_routing", sb}, {"capacity_alignment", sa}, {"gate_noise", sn},
		{"capacity_factor", sc}, {"step", ss},
	};
	/* the output's step only where it was given */
	const int nmeta = (int)(sizeof meta / sizeof meta[0]) - (st ? 0 : 2);
	if (!rc)
		rc = st_write(path, ts, n, meta, nmeta);
	for (int i = 0; i < T_NP + 2; i++)
		free(host[i]);
	free(tmp);
	return rc;
}

int moe_tutel_load(const char *path, const struct moe_config *cfg,
		   const struct moe_dist_place *pl, struct moe_params *p, int full)
{
	struct backend *be = p->be;
	struct st_file f;
	int64_t ne[T_NP][3];
	int nd[T_NP];
	shapes(cfg, pl, ne, nd);
	float *host[T_NP] = {NULL}, *tmp = NULL;
	int rc;

	ERR_FORWARD(st_open(&f, path, 1));
	const struct st_entry *e;
	rc = st_lookup(&f, "_num_global_experts", DT_I64, 0, NULL, &e);
	int64_t E = 0;
	if (!rc)
		rc = st_read_raw(&f, e, 0, &E, sizeof E);
	if (!rc && E != cfg->E)
		rc = err_set(CORE_EFORMAT, path, "_num_global_experts is %lld, this layer has %d "
			     "experts", (long long)E, cfg->E);
	for (int i = 0; i < T_NP && !rc; i++) {
		const size_t k = count(ne[i], nd[i]);
		struct tensor t;
		if (!(host[i] = malloc(sizeof(float) * (k ? k : 1)))) {
			rc = err_set(CORE_ENOMEM, path, "cannot allocate the layer on the host");
			break;
		}
		tensor_view(&t, DT_F32, nd[i], ne[i], host[i], names[i]);
		rc = st_read(&f, names[i], &t);
	}
	/* back to this layer's layout, then on the device: nothing changes until all is read */
	const size_t nw1 = count(ne[T_W1], 3);
	if (!rc && !(tmp = malloc(sizeof(float) * (nw1 + count(ne[T_WG], 2)))))
		rc = err_set(CORE_ENOMEM, path, "cannot allocate the layer on the host");
	if (!rc) {
		transpose_blocks(tmp, host[T_WG], 1, cfg->E, cfg->M); /* [E, M] -> [M, E] */
		memcpy(host[T_WG], tmp, sizeof(float) * (size_t)(cfg->E * cfg->M));
		if (full) { /* [E, H, M] out-in -> [E, M, H] in-out */
			transpose_blocks(tmp, host[T_W1], cfg->E, cfg->H, cfg->M);
			memcpy(host[T_W1], tmp, sizeof(float) * nw1);
		}
	}
	float *dst[T_NP] = {p->wg, p->w1, p->b1, p->w2, p->b2};
	for (int i = 0; i < T_NP && !rc; i++)
		rc = be->op->upload(be, dst[i], host[i], sizeof(float) * count(ne[i], nd[i]));
	for (int i = 0; i < T_NP; i++)
		free(host[i]);
	free(tmp);
	st_close(&f);
	return rc;
}
