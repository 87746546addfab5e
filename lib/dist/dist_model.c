/* dist_model.c - the alpha-beta model of Linear and 2DH All-to-All (dist_model.h). */
#include "dist/dist_model.h"

#include "common/banned.h"

static double msg(const struct dist_link *l, double s) { return l->alpha + s * l->beta; }

double dist_model_linear(const struct dist_net *net, int n, double S)
{
	const int m = net->m < n ? net->m : n;
	const double in = (m - 1) * msg(&net->intra, S / n);
	const double out = (n - m) * msg(&net->inter, S / n);
	return in > out ? in : out;
}

double dist_model_2dh(const struct dist_net *net, int n, double S)
{
	const int m = net->m < n ? net->m : n;
	const double nodes = (double)n / m;
	/* One node (or one rank per node): 2DH has no second level and no copies to make. */
	if (nodes <= 1.0)
		return (m - 1) * msg(&net->intra, S / m);
	if (m == 1)
		return (n - 1) * msg(&net->inter, S / n);
	return 2.0 * S * net->copy + (m - 1) * msg(&net->intra, S / m) +
	       (nodes - 1) * msg(&net->inter, S * m / n);
}

int dist_model_fit(const double *S, const double *t, int k, int n, struct dist_link *out)
{
	if (n < 2 || k < 2)
		return -1;
	/* t / (n - 1) = alpha + (S / n) beta: a straight line in x = S / n, each point weighted
	 * by 1 / y^2 */
	double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
	for (int i = 0; i < k; i++) {
		const double x = S[i] / n, y = t[i] / (n - 1);
		if (!(y > 0))
			continue;
		const double w = 1.0 / (y * y);
		sw += w;
		sx += w * x;
		sy += w * y;
		sxx += w * x * x;
		sxy += w * x * y;
	}
	const double den = sw * sxx - sx * sx;
	if (!(den > 1e-12 * sw * sxx))
		return -1;
	double beta = (sw * sxy - sx * sy) / den, alpha = (sy - beta * sx) / sw;
	out->alpha = alpha > 0 ? alpha : 0;
	out->beta = beta > 0 ? beta : 0;
	return 0;
}

int dist_model_crossover(const struct dist_net *net, double S, int nmax)
{
	for (long n = net->m > 1 ? 2L * net->m : 2; n <= nmax; n *= 2)
		if (dist_model_2dh(net, (int)n, S) < dist_model_linear(net, (int)n, S))
			return (int)n;
	return 0;
}
