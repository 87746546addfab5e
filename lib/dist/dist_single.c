/* dist_single.c - dist.h without MPI: a world of one rank, where every collective is a copy
 * of this rank's own part and an exchange runs at once (dist_alltoall_start included, so no
 * communication thread is needed; its ticket is then done before dist_wait is called).
 *
 * A build without MPI started by mpirun with several processes would otherwise run W
 * copies of the same one-rank job, each believing it is the whole world; the launchers'
 * environment gives that away (dist_launcher), and dist_open refuses it.
 */
#include "dist/dist.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/err.h"
#include "dist/dist_impl.h"
#include "common/banned.h"

struct dist {
	const char *layout;
	char host[256];
	int64_t issued;
	struct dist_stats st;
};

int dist_have_mpi(void) { return 0; }

int dist_open(struct dist **out, int local_size)
{
	long rank, size;

	*out = NULL;
	if (dist_launcher(&rank, &size) && size > 1)
		return err_set(CORE_EUNSUPPORTED, NULL, "this build has no MPI (install "
			       "libopenmpi-dev and rebuild)");
	if (local_size < 0)
		return err_set(CORE_EUSAGE, NULL, "local size %d is negative", local_size);
	if (local_size > 1)
		return err_set(CORE_EUSAGE, NULL, "local size %d does not divide the 1 rank",
			       local_size);
	struct dist *d = calloc(1, sizeof *d);
	if (!d)
		return err_set(CORE_ENOMEM, NULL, "out of memory for the dist object");
	d->layout = local_size > 0 ? "given" : "host";
	if (gethostname(d->host, sizeof d->host) != 0)
		snprintf(d->host, sizeof d->host, "unknown");
	d->host[sizeof d->host - 1] = '\0';
	*out = d;
	return 0;
}

void dist_close(struct dist *d) { free(d); }

int dist_rank(const struct dist *d) { return 0; }
int dist_size(const struct dist *d) { return 1; }
int dist_local_size(const struct dist *d) { return 1; }
const char *dist_layout_source(const struct dist *d) { return d->layout; }
const char *dist_host(const struct dist *d) { return d->host; }

int dist_agree(struct dist *d, const int64_t *v, int n, const char *const *names)
{
	if (n < 0 || (n > 0 && !v))
		return err_set(CORE_EUSAGE, NULL, "dist_agree: %d values", n);
	return 0;
}

int dist_agree_rc(struct dist *d, int rc) { return rc < 0 ? rc : 0; }

static int check_op(enum dist_op op, int n, const void *v)
{
	if ((unsigned)op > DIST_MIN)
		return err_set(CORE_EUSAGE, NULL, "unknown reduction %d", (int)op);
	if (n < 0 || (n > 0 && !v))
		return err_set(CORE_EUSAGE, NULL, "allreduce of %d values", n);
	return 0;
}

int dist_allreduce_i64(struct dist *d, int64_t *v, int n, enum dist_op op)
{
	return check_op(op, n, v);
}

int dist_allreduce_f64(struct dist *d, double *v, int n, enum dist_op op)
{
	return check_op(op, n, v);
}

int dist_allreduce_f32(struct dist *d, float *v, size_t n)
{
	if (n > 0 && !v)
		return err_set(CORE_EUSAGE, NULL, "allreduce of %zu values from NULL", n);
	return 0;
}

int dist_barrier(struct dist *d) { return 0; }
int dist_barrier_timeout(struct dist *d, double seconds) { return 0; }

static int check_group(int g)
{
	if (g != 1)
		return err_set(CORE_EUSAGE, NULL, "a group of %d does not divide the 1 rank", g);
	return 0;
}

int dist_allgather(struct dist *d, int g, const void *send, void *recv, size_t bytes)
{
	ERR_FORWARD(check_group(g));
	if (bytes > 0 && (!send || !recv))
		return err_set(CORE_EUSAGE, NULL, "allgather of %zu bytes from or to NULL", bytes);
	uintptr_t x = (uintptr_t)send, y = (uintptr_t)recv;
	if (bytes > 0 && x < y + bytes && y < x + bytes)
		return err_set(CORE_EUSAGE, NULL, "allgather: the send and recv buffers overlap");
	if (bytes)
		memcpy(recv, send, bytes);
	return 0;
}

int dist_reduce_scatter_f32(struct dist *d, int g, const float *send, float *recv, size_t n)
{
	ERR_FORWARD(check_group(g));
	if (n > 0 && (!send || !recv))
		return err_set(CORE_EUSAGE, NULL, "reduce-scatter of %zu floats from or to NULL",
			       n);
	uintptr_t x = (uintptr_t)send, y = (uintptr_t)recv;
	if (n > 0 && x < y + n * sizeof(float) && y < x + n * sizeof(float))
		return err_set(CORE_EUSAGE, NULL, "reduce-scatter: the send and recv buffers "
			       "overlap (in place is not allowed)");
	if (n)
		memcpy(recv, send, n * sizeof(float));
	return 0;
}

int dist_alltoall(struct dist *d, enum dist_a2a a, const struct dist_span *send,
		  const struct dist_span *recv, int nblk, int64_t n, size_t row_bytes)
{
	double t0 = dist_time();
	int empty;

	ERR_FORWARD(dist_a2a_check(1, a, send, recv, nblk, n, row_bytes, &empty));
	for (int b = 0; !empty && b < nblk; b++)
		memcpy((char *)recv->base + dist_span_off(recv, 1, nblk, 0, b, row_bytes),
		       (const char *)send->base + dist_span_off(send, 1, nblk, 0, b, row_bytes),
		       (size_t)n * row_bytes);
	d->st.comm_seconds += dist_time() - t0;
	d->st.exchanges++;
	return 0;
}

int dist_alltoall_start(struct dist *d, enum dist_a2a a, const struct dist_span *send,
			const struct dist_span *recv, int nblk, int64_t n, size_t row_bytes,
			int64_t *ticket)
{
	ERR_FORWARD(dist_alltoall(d, a, send, recv, nblk, n, row_bytes));
	*ticket = ++d->issued;
	return 0;
}

int dist_wait(struct dist *d, int64_t ticket)
{
	if (ticket < 1 || ticket > d->issued)
		return err_set(CORE_EUSAGE, NULL, "all-to-all ticket %lld was not issued (%lld "
			       "were)", (long long)ticket, (long long)d->issued);
	return 0;
}

void dist_stats(const struct dist *d, struct dist_stats *s) { *s = d->st; }
void dist_stats_reset(struct dist *d) { memset(&d->st, 0, sizeof d->st); }
size_t dist_bytes(const struct dist *d) { return 0; }
