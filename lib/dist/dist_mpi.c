/* dist_mpi.c - dist.h over MPI (Open MPI 4.1): the world and its nodes, the small
 * collectives, and the three All-to-All algorithms with their communication thread.
 *
 * Every MPI call goes through our own duplicate of MPI_COMM_WORLD, whose error handler is
 * MPI_ERRORS_RETURN, so that an MPI failure becomes CORE_EIO with MPI's text instead of an
 * abort, and our messages can never match a receive the program posts on its own
 * communicators. After such a failure the object is good only for dist_close.
 *
 * Pieces are described to MPI by derived datatypes rather than packed: a unit of row_bytes
 * bytes, an hvector of nblk blocks of n units at the span's block stride (the piece), and
 * for 2DH's phase 4 an hvector of m pieces at the span's peer stride. Each count is then an
 * int however large the piece (n and row_bytes below 2^31 each), and the datatypes are
 * built once per shape and kept (a small cache): building, committing and freeing one
 * takes about 0.18 us here, and a whole exchange of 1 KiB per rank at 2 ranks 0.55 us.
 *
 * The communication thread (dist_alltoall_start) is the only other thread that calls MPI.
 * MPI_THREAD_SERIALIZED allows that as long as two calls never overlap, which the queue
 * guarantees: the caller's thread waits for the queue to drain before any MPI call of its
 * own, and the queue stays empty until it returns (only the caller's thread adds jobs). The
 * mutex hand-over also orders the memory that the two threads share (caches, staging).
 */
#include "dist/dist.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/err.h"
#include "dist/dist_impl.h"
#include "common/banned.h"

/* SPLIT_MIN: LINEAR sends a piece that is not contiguous on both sides as one message per
 * block once blocks reach this size (see a2a_linear). */
enum { TAG_A2A = 7301, TYPE_CACHE = 16, SPLIT_MIN = 65536 };

/* A committed datatype for count pieces (count 1: one piece) of nblk blocks of n units of
 * row_bytes, blocks blk_stride bytes apart and pieces peer_stride bytes apart. */
struct type_entry {
	int nblk, count;
	int64_t n, blk_stride, peer_stride;
	size_t row_bytes;
	unsigned long used; /* 0: empty; else the cache's clock at the last use (LRU) */
	MPI_Datatype t;
};

/* One exchange queued for the communication thread: the arguments, spans copied. */
struct job {
	struct job *next;
	enum dist_a2a a;
	struct dist_span send, recv;
	int nblk;
	int64_t n;
	size_t row_bytes;
};

struct dist {
	MPI_Comm world; /* our duplicate of MPI_COMM_WORLD, errors returned */
	MPI_Comm intra; /* the m ranks of this node, by local index */
	MPI_Comm inter; /* the W / m ranks of this local index, one per node, by node */
	MPI_Comm *group; /* [W + 1]: groups of g (dist.h), made on first use; world at W */
	int q, W, m, init_here;
	const char *layout;
	char host[MPI_MAX_PROCESSOR_NAME + 1];
	MPI_Request *req; /* nreq: 2 W, or 2 W nblk for LINEAR's messages by block */
	size_t nreq;
	unsigned char *stage[2]; /* 2DH and the MPI baseline; grown, never shrunk */
	size_t stage_cap[2];
	struct type_entry types[TYPE_CACHE];
	unsigned long clock;

	/* the communication thread and its queue: everything below under mu */
	pthread_mutex_t mu;
	pthread_cond_t work, idle;
	pthread_t thread;
	int thread_up, stop;
	struct job *head, *tail;
	int64_t issued, completed; /* tickets: started, and done in order */
	int err_rc;                /* the first failure of a started exchange, kept */
	int64_t err_ticket;
	char err_file[512], err_detail[512];
	struct dist_stats st;
};

/* CORE_EIO "MPI: <MPI's text> (in <call>)". call is the stringised call: its name is what
 * precedes the parenthesis. */
static int mpi_fail(int rc, const char *call)
{
	char text[MPI_MAX_ERROR_STRING + 1];
	int len = 0;

	if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS || len <= 0)
		snprintf(text, sizeof text, "error code %d", rc);
	text[len > 0 && len < (int)sizeof text ? len : (int)sizeof text - 1] = '\0';
	int name = (int)strcspn(call, " (");
	return err_set(CORE_EIO, NULL, "MPI: %s (in %.*s)", text, name, call);
}

/* rc = call; on failure, rc = CORE_EIO with MPI's text and goto out. */
#define MPI_GO(call)                                                                           \
	do {                                                                                   \
		int mpi_rc_ = (call);                                                          \
		if (mpi_rc_ != MPI_SUCCESS) {                                                  \
			rc = mpi_fail(mpi_rc_, #call);                                         \
			goto out;                                                              \
		}                                                                              \
	} while (0)
#define MPI_RET(call)                                                                          \
	do {                                                                                   \
		int mpi_rc_ = (call);                                                          \
		if (mpi_rc_ != MPI_SUCCESS)                                                    \
			return mpi_fail(mpi_rc_, #call);                                       \
	} while (0)

int dist_have_mpi(void) { return 1; }

/* Wait for k requests. On the communication thread, by polling with short sleeps: MPI's own
 * wait spins, and a spinning thread takes a core from the expert GEMMs the pipeline
 * overlaps it with (on a machine with no core to spare, d > 1 would only slow the step).
 * Open MPI progresses the transfers, shared-memory copies included, inside MPI_Testall, so
 * they still move; a piece completes at most one sleep late. */
static int wait_all(struct dist *d, int k, MPI_Request *req)
{
	if (!d->thread_up || !pthread_equal(pthread_self(), d->thread)) {
		MPI_RET(MPI_Waitall(k, req, MPI_STATUSES_IGNORE));
		return 0;
	}
	for (;;) {
		int done = 0;
		MPI_RET(MPI_Testall(k, req, &done, MPI_STATUSES_IGNORE));
		if (done)
			return 0;
		nanosleep(&(struct timespec){.tv_nsec = 20000}, NULL);
	}
}

/* ---- the queue ------------------------------------------------------------------------ */

/* Before any MPI call of the caller's thread: every started exchange is done. */
static void drain(struct dist *d)
{
	pthread_mutex_lock(&d->mu);
	while (d->completed < d->issued)
		pthread_cond_wait(&d->idle, &d->mu);
	pthread_mutex_unlock(&d->mu);
}

static int exchange(struct dist *d, const struct job *j);

static void *comm_main(void *arg)
{
	struct dist *d = arg;

	pthread_mutex_lock(&d->mu);
	for (;;) {
		while (!d->head && !d->stop)
			pthread_cond_wait(&d->work, &d->mu);
		struct job *j = d->head;
		if (!j)
			break;
		/* after a failure the exchanges still queued are not run: the ranks no longer
		 * agree on which message is which; dist_wait reports the first failure */
		int failed = d->err_rc != 0;
		pthread_mutex_unlock(&d->mu);
		int rc = failed ? 0 : exchange(d, j);
		pthread_mutex_lock(&d->mu);
		if (rc < 0 && !d->err_rc) {
			d->err_rc = rc;
			d->err_ticket = d->completed + 1;
			snprintf(d->err_file, sizeof d->err_file, "%s", err_file());
			snprintf(d->err_detail, sizeof d->err_detail, "%s", err_detail());
		}
		d->head = j->next;
		if (!d->head)
			d->tail = NULL;
		free(j);
		d->completed++;
		pthread_cond_broadcast(&d->idle);
	}
	pthread_mutex_unlock(&d->mu);
	return NULL;
}

/* ---- datatypes -------------------------------------------------------------------------- */

/* The cached datatype of count pieces (see struct type_entry); *out belongs to the cache. */
static int piece_type(struct dist *d, int nblk, int64_t n, size_t row_bytes, int64_t blk_stride,
		      int count, int64_t peer_stride, MPI_Datatype *out)
{
	MPI_Datatype unit = MPI_DATATYPE_NULL, piece = MPI_DATATYPE_NULL, t = MPI_DATATYPE_NULL;
	struct type_entry *e = &d->types[0];
	int rc = 0;

	if (nblk == 1) /* normalised so that equal layouts share an entry */
		blk_stride = 0;
	if (count == 1)
		peer_stride = 0;
	for (int i = 0; i < TYPE_CACHE; i++) {
		struct type_entry *c = &d->types[i];
		if (c->used && c->nblk == nblk && c->count == count && c->n == n &&
		    c->blk_stride == blk_stride && c->peer_stride == peer_stride &&
		    c->row_bytes == row_bytes) {
			c->used = ++d->clock;
			*out = c->t;
			return 0;
		}
		if (c->used < e->used)
			e = c;
	}
	MPI_GO(MPI_Type_contiguous((int)row_bytes, MPI_BYTE, &unit));
	MPI_GO(MPI_Type_create_hvector(nblk, (int)n, (MPI_Aint)blk_stride, unit, &piece));
	if (count == 1) {
		t = piece;
		piece = MPI_DATATYPE_NULL;
	} else {
		MPI_GO(MPI_Type_create_hvector(count, 1, (MPI_Aint)peer_stride, piece, &t));
	}
	MPI_GO(MPI_Type_commit(&t));
	/* evict the least recently used; MPI keeps a freed type alive for pending operations */
	if (e->used)
		MPI_Type_free(&e->t);
	*e = (struct type_entry){.nblk = nblk, .count = count, .n = n, .blk_stride = blk_stride,
				 .peer_stride = peer_stride, .row_bytes = row_bytes,
				 .used = ++d->clock, .t = t};
	*out = t;
	t = MPI_DATATYPE_NULL;
out:
	if (unit != MPI_DATATYPE_NULL)
		MPI_Type_free(&unit);
	if (piece != MPI_DATATYPE_NULL)
		MPI_Type_free(&piece);
	if (t != MPI_DATATYPE_NULL)
		MPI_Type_free(&t);
	return rc;
}

/* A contiguous piece of nblk * n rows: its extent is the piece's bytes, so a count of k is k
 * pieces back to back. */
static int packed_type(struct dist *d, int nblk, int64_t n, size_t row_bytes, MPI_Datatype *out)
{
	return piece_type(d, nblk, n, row_bytes, n * (int64_t)row_bytes, 1, 0, out);
}

/* A datatype of exactly bytes bytes, extent bytes, for the collectives on byte buffers
 * (bytes may exceed INT_MAX); the caller frees it. */
static int bytes_type(size_t bytes, MPI_Datatype *out)
{
	const size_t chunk = (size_t)1 << 30;
	MPI_Datatype big = MPI_DATATYPE_NULL, rest = MPI_DATATYPE_NULL;
	int rc = 0;

	*out = MPI_DATATYPE_NULL;
	if (bytes <= INT_MAX) {
		MPI_GO(MPI_Type_contiguous((int)bytes, MPI_BYTE, out));
	} else {
		if (bytes / chunk > INT_MAX)
			return err_set(CORE_EUSAGE, NULL, "%zu bytes are too many for one message",
				       bytes);
		int k = (int)(bytes / chunk);
		MPI_GO(MPI_Type_vector(k, (int)chunk, (int)chunk, MPI_BYTE, &big));
		MPI_GO(MPI_Type_contiguous((int)(bytes % chunk), MPI_BYTE, &rest));
		int len[2] = {1, 1};
		MPI_Aint disp[2] = {0, (MPI_Aint)(bytes / chunk * chunk)};
		MPI_Datatype parts[2] = {big, rest};
		MPI_GO(MPI_Type_create_struct(2, len, disp, parts, out));
	}
	MPI_GO(MPI_Type_commit(out));
out:
	if (big != MPI_DATATYPE_NULL)
		MPI_Type_free(&big);
	if (rest != MPI_DATATYPE_NULL)
		MPI_Type_free(&rest);
	if (rc < 0 && *out != MPI_DATATYPE_NULL)
		MPI_Type_free(out);
	return rc;
}

/* ---- the world ------------------------------------------------------------------------ */

/* The host layout: the ranks sharing memory with this one are its node, provided that every
 * node holds the same number of ranks and numbers them consecutively (dist.h). */
static int host_layout(struct dist *d)
{
	MPI_Comm shm = MPI_COMM_NULL;
	int rc = 0, ls, lr, first;

	MPI_GO(MPI_Comm_split_type(d->world, MPI_COMM_TYPE_SHARED, d->q, MPI_INFO_NULL, &shm));
	MPI_GO(MPI_Comm_size(shm, &ls));
	MPI_GO(MPI_Comm_rank(shm, &lr));
	MPI_GO(MPI_Allreduce(&d->q, &first, 1, MPI_INT, MPI_MIN, shm));
	/* v[0] = min of m, v[1] = -max of m, v[2] = 0 when some rank is out of place */
	int v[3] = {ls, -ls, first == d->q - lr && lr == d->q % ls};
	MPI_GO(MPI_Allreduce(MPI_IN_PLACE, v, 3, MPI_INT, MPI_MIN, d->world));
	if (v[0] != -v[1]) {
		rc = err_set(CORE_EUSAGE, NULL, "the hosts hold %d to %d ranks, not equal numbers: "
			     "give the local size", v[0], -v[1]);
		goto out;
	}
	if (!v[2]) {
		rc = err_set(CORE_EUSAGE, NULL, "the ranks of each host are not numbered "
			     "consecutively: give the local size");
		goto out;
	}
	d->m = ls;
out:
	if (shm != MPI_COMM_NULL)
		MPI_Comm_free(&shm);
	return rc;
}

static void world_free(struct dist *d)
{
	for (int g = 2; d->group && g < d->W; g++)
		if (d->group[g] != MPI_COMM_NULL)
			MPI_Comm_free(&d->group[g]);
	free(d->group);
	if (d->intra != MPI_COMM_NULL)
		MPI_Comm_free(&d->intra);
	if (d->inter != MPI_COMM_NULL)
		MPI_Comm_free(&d->inter);
	if (d->world != MPI_COMM_NULL)
		MPI_Comm_free(&d->world);
	for (int i = 0; i < TYPE_CACHE; i++)
		if (d->types[i].used)
			MPI_Type_free(&d->types[i].t);
}

int dist_open(struct dist **out, int local_size)
{
	struct dist *d = NULL;
	int rc = 0, inited = 0, finalized = 0, provided = 0, init_here = 0, len = 0;

	*out = NULL;
	if (local_size < 0)
		return err_set(CORE_EUSAGE, NULL, "local size %d is negative", local_size);
	MPI_Initialized(&inited);
	MPI_Finalized(&finalized);
	if (finalized)
		return err_set(CORE_EUSAGE, NULL, "MPI was finalised already");
	if (!inited) {
		int e = MPI_Init_thread(NULL, NULL, MPI_THREAD_SERIALIZED, &provided);
		if (e != MPI_SUCCESS)
			return mpi_fail(e, "MPI_Init_thread");
		init_here = 1;
		/* ours now: errors of calls without a communicator (datatypes) return too */
		MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
		MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
	} else {
		MPI_Query_thread(&provided);
	}
	if (provided < MPI_THREAD_SERIALIZED) {
		rc = err_set(CORE_EUNSUPPORTED, NULL, "MPI provides thread level %d, below the "
			     "MPI_THREAD_SERIALIZED that the communication thread needs", provided);
		goto out;
	}
	d = calloc(1, sizeof *d);
	if (!d) {
		rc = err_set(CORE_ENOMEM, NULL, "out of memory for the dist object");
		goto out;
	}
	d->world = d->intra = d->inter = MPI_COMM_NULL;
	d->init_here = init_here;
	MPI_GO(MPI_Comm_dup(MPI_COMM_WORLD, &d->world));
	MPI_GO(MPI_Comm_set_errhandler(d->world, MPI_ERRORS_RETURN));
	MPI_GO(MPI_Comm_rank(d->world, &d->q));
	MPI_GO(MPI_Comm_size(d->world, &d->W));
	if (local_size > 0) {
		if (d->W % local_size) {
			rc = err_set(CORE_EUSAGE, NULL, "local size %d does not divide the %d "
				     "rank%s", local_size, d->W, d->W == 1 ? "" : "s");
			goto out;
		}
		d->m = local_size;
		d->layout = "given";
	} else {
		if ((rc = host_layout(d)) < 0)
			goto out;
		d->layout = "host";
	}
	MPI_GO(MPI_Comm_split(d->world, d->q / d->m, d->q, &d->intra));
	MPI_GO(MPI_Comm_split(d->world, d->q % d->m, d->q, &d->inter));
	if (MPI_Get_processor_name(d->host, &len) != MPI_SUCCESS)
		snprintf(d->host, sizeof d->host, "unknown");
	d->group = malloc(sizeof *d->group * ((size_t)d->W + 1));
	for (int g = 0; d->group && g <= d->W; g++)
		d->group[g] = g == d->W ? d->world : MPI_COMM_NULL;
	d->nreq = 2 * (size_t)d->W;
	d->req = malloc(sizeof *d->req * d->nreq);
	if (!d->group || !d->req) {
		rc = err_set(CORE_ENOMEM, NULL, "out of memory for %d ranks", d->W);
		goto out;
	}
	pthread_mutex_init(&d->mu, NULL);
	pthread_cond_init(&d->work, NULL);
	pthread_cond_init(&d->idle, NULL);
	*out = d;
	return 0;
out:
	if (d) {
		world_free(d);
		free(d->req);
		free(d);
	}
	/* every rank fails the same way here, so the finalisation is collective too */
	if (init_here)
		MPI_Finalize();
	return rc;
}

void dist_close(struct dist *d)
{
	if (!d)
		return;
	if (d->thread_up) {
		pthread_mutex_lock(&d->mu);
		d->stop = 1;
		pthread_cond_signal(&d->work);
		pthread_mutex_unlock(&d->mu);
		pthread_join(d->thread, NULL); /* runs what is queued first */
	}
	world_free(d);
	pthread_mutex_destroy(&d->mu);
	pthread_cond_destroy(&d->work);
	pthread_cond_destroy(&d->idle);
	free(d->stage[0]);
	free(d->stage[1]);
	free(d->req);
	if (d->init_here)
		MPI_Finalize();
	free(d);
}

int dist_rank(const struct dist *d) { return d->q; }
int dist_size(const struct dist *d) { return d->W; }
int dist_local_size(const struct dist *d) { return d->m; }
const char *dist_layout_source(const struct dist *d) { return d->layout; }
const char *dist_host(const struct dist *d) { return d->host; }

/* ---- agreement ------------------------------------------------------------------------ */

int dist_agree(struct dist *d, const int64_t *v, int n, const char *const *names)
{
	int rc = 0;

	if (n < 0 || (n > 0 && !v))
		return err_set(CORE_EUSAGE, NULL, "dist_agree: %d values", n);
	if (n > INT_MAX / 2)
		return err_set(CORE_EUSAGE, NULL, "dist_agree: %d values are too many", n);
	drain(d);
	if (n == 0)
		return 0;
	int64_t *mm = malloc(sizeof *mm * 2 * (size_t)n);
	if (!mm)
		return err_set(CORE_ENOMEM, NULL, "out of memory for %d values", n);
	/* One reduction for both ends: the minimum of ~v is ~(the maximum of v), and ~ cannot
	 * overflow where a negation of INT64_MIN would. */
	for (int i = 0; i < n; i++) {
		mm[i] = v[i];
		mm[n + i] = ~v[i];
	}
	MPI_GO(MPI_Allreduce(MPI_IN_PLACE, mm, 2 * n, MPI_INT64_T, MPI_MIN, d->world));
	for (int i = 0; i < n; i++) {
		int64_t lo = mm[i], hi = ~mm[n + i];
		if (lo == hi)
			continue;
		/* the lowest rank holding each end: the same text on every rank */
		int who[2] = {v[i] == lo ? d->q : d->W, v[i] == hi ? d->q : d->W};
		MPI_GO(MPI_Allreduce(MPI_IN_PLACE, who, 2, MPI_INT, MPI_MIN, d->world));
		char dflt[32];
		const char *name = names && names[i] ? names[i] : dflt;
		snprintf(dflt, sizeof dflt, "value %d", i);
		rc = err_set(CORE_EUSAGE, NULL, "ranks disagree on %s: %lld on rank %d, %lld on "
			     "rank %d", name, (long long)lo, who[0], (long long)hi, who[1]);
		break;
	}
out:
	free(mm);
	return rc;
}

int dist_agree_rc(struct dist *d, int rc)
{
	drain(d);
	int first = rc < 0 ? d->q : d->W; /* rc > 0 is no error */
	int e = MPI_Allreduce(MPI_IN_PLACE, &first, 1, MPI_INT, MPI_MIN, d->world);
	if (e != MPI_SUCCESS)
		return mpi_fail(e, "MPI_Allreduce");
	if (first == d->W)
		return 0;
	/* the lowest failing rank's code and message travel to every rank, so that each one
	 * says why and exits as that rank does */
	struct {
		int code;
		char text[480];
	} msg = {rc, ""};
	if (d->q == first)
		err_format(msg.text, sizeof msg.text, rc);
	e = MPI_Bcast(&msg, (int)sizeof msg, MPI_BYTE, first, d->world);
	if (e != MPI_SUCCESS)
		return mpi_fail(e, "MPI_Bcast");
	if (rc < 0)
		return rc;
	msg.text[sizeof msg.text - 1] = '\0';
	return err_set(msg.code, NULL, "rank %d failed: %s", first, msg.text);
}

/* ---- small collectives ---------------------------------------------------------------- */

static int mpi_op(enum dist_op op, MPI_Op *o)
{
	switch (op) {
	case DIST_SUM: *o = MPI_SUM; return 0;
	case DIST_MAX: *o = MPI_MAX; return 0;
	case DIST_MIN: *o = MPI_MIN; return 0;
	}
	return err_set(CORE_EUSAGE, NULL, "unknown reduction %d", (int)op);
}

static int allreduce(struct dist *d, void *v, size_t n, MPI_Datatype t, size_t size,
		     enum dist_op op)
{
	const size_t chunk = (size_t)1 << 30;
	MPI_Op o = MPI_OP_NULL;

	ERR_FORWARD(mpi_op(op, &o));
	if (n > 0 && !v)
		return err_set(CORE_EUSAGE, NULL, "allreduce of %zu values from NULL", n);
	drain(d);
	for (size_t i = 0; i < n; i += chunk) {
		int k = (int)(n - i < chunk ? n - i : chunk);
		MPI_RET(MPI_Allreduce(MPI_IN_PLACE, (char *)v + i * size, k, t, o, d->world));
	}
	return 0;
}

int dist_allreduce_i64(struct dist *d, int64_t *v, int n, enum dist_op op)
{
	if (n < 0)
		return err_set(CORE_EUSAGE, NULL, "allreduce of %d values", n);
	return allreduce(d, v, (size_t)n, MPI_INT64_T, sizeof *v, op);
}

int dist_allreduce_f64(struct dist *d, double *v, int n, enum dist_op op)
{
	if (n < 0)
		return err_set(CORE_EUSAGE, NULL, "allreduce of %d values", n);
	return allreduce(d, v, (size_t)n, MPI_DOUBLE, sizeof *v, op);
}

int dist_allreduce_f32(struct dist *d, float *v, size_t n)
{
	return allreduce(d, v, n, MPI_FLOAT, sizeof *v, DIST_SUM);
}

int dist_barrier(struct dist *d)
{
	drain(d);
	MPI_RET(MPI_Barrier(d->world));
	return 0;
}

int dist_barrier_timeout(struct dist *d, double seconds)
{
	MPI_Request req;
	const double t0 = dist_time();
	drain(d);
	MPI_RET(MPI_Ibarrier(d->world, &req));
	for (;;) {
		int done = 0;
		MPI_RET(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
		if (done)
			return 0;
		if (dist_time() - t0 > seconds)
			/* the request is left behind: the process is about to exit */
			return err_set(CORE_EIO, NULL, "ranks did not meet within %g s", seconds);
		nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
	}
}

/* ---- groups --------------------------------------------------------------------------- */

/* The communicator of this rank's group of g (g > 1), split from the world on first use:
 * every rank asks for the same g at the same point, so the split is collective too. */
static int group_comm(struct dist *d, int g, MPI_Comm *c)
{
	if (d->group[g] == MPI_COMM_NULL)
		MPI_RET(MPI_Comm_split(d->world, d->q / g, d->q, &d->group[g]));
	*c = d->group[g];
	return 0;
}

static int check_group(const struct dist *d, int g)
{
	if (g < 1 || g > d->W || d->W % g)
		return err_set(CORE_EUSAGE, NULL, "a group of %d does not divide the %d rank%s", g,
			       d->W, d->W == 1 ? "" : "s");
	return 0;
}

static int overlap(const void *a, size_t na, const void *b, size_t nb)
{
	uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
	return na && nb && x < y + nb && y < x + na;
}

int dist_allgather(struct dist *d, int g, const void *send, void *recv, size_t bytes)
{
	MPI_Datatype t = MPI_DATATYPE_NULL;
	MPI_Comm c = MPI_COMM_NULL;
	int rc = 0;

	ERR_FORWARD(check_group(d, g));
	if (bytes > 0 && (!send || !recv))
		return err_set(CORE_EUSAGE, NULL, "allgather of %zu bytes from or to NULL", bytes);
	if (bytes > SIZE_MAX / (size_t)g)
		return err_set(CORE_EUSAGE, NULL, "allgather of %d x %zu bytes", g, bytes);
	if (overlap(send, bytes, recv, (size_t)g * bytes))
		return err_set(CORE_EUSAGE, NULL, "allgather: the send and recv buffers overlap");
	drain(d);
	if (g == 1 || bytes == 0) {
		if (bytes)
			memcpy(recv, send, bytes);
		return 0;
	}
	ERR_FORWARD(group_comm(d, g, &c));
	ERR_FORWARD(bytes_type(bytes, &t));
	MPI_GO(MPI_Allgather(send, 1, t, recv, 1, t, c));
out:
	MPI_Type_free(&t);
	return rc;
}

int dist_reduce_scatter_f32(struct dist *d, int g, const float *send, float *recv, size_t n)
{
	MPI_Comm c = MPI_COMM_NULL;

	ERR_FORWARD(check_group(d, g));
	if (n > 0 && (!send || !recv))
		return err_set(CORE_EUSAGE, NULL, "reduce-scatter of %zu floats from or to NULL",
			       n);
	if (n > SIZE_MAX / sizeof(float) / (size_t)g)
		return err_set(CORE_EUSAGE, NULL, "reduce-scatter of %d x %zu floats", g, n);
	if (overlap(send, (size_t)g * n * sizeof(float), recv, n * sizeof(float)))
		return err_set(CORE_EUSAGE, NULL, "reduce-scatter: the send and recv buffers "
			       "overlap (in place is not allowed)");
	drain(d);
	if (g == 1 || n == 0) {
		if (n)
			memcpy(recv, send, n * sizeof(float));
		return 0;
	}
	ERR_FORWARD(group_comm(d, g, &c));
	if (n <= INT_MAX) {
		MPI_RET(MPI_Reduce_scatter_block(send, recv, (int)n, MPI_FLOAT, MPI_SUM, c));
		return 0;
	}
	/* Counts beyond an int: member r's share is reduced to it, a chunk at a time (MPI's
	 * predefined reductions apply to predefined datatypes only, so no derived type helps). */
	const size_t chunk = (size_t)1 << 30;
	int me;
	MPI_RET(MPI_Comm_rank(c, &me));
	for (int r = 0; r < g; r++)
		for (size_t i = 0; i < n; i += chunk) {
			int k = (int)(n - i < chunk ? n - i : chunk);
			MPI_RET(MPI_Reduce(send + (size_t)r * n + i, r == me ? recv + i : NULL, k,
					   MPI_FLOAT, MPI_SUM, r, c));
		}
	return 0;
}

/* ---- the All-to-All ------------------------------------------------------------------- */

/* Room for two staging buffers of bytes each, kept for the next exchanges. */
static int stage_grow(struct dist *d, size_t bytes)
{
	for (int i = 0; i < 2; i++) {
		if (d->stage_cap[i] >= bytes)
			continue;
		void *p = malloc(bytes);
		if (!p)
			return err_set(CORE_ENOMEM, NULL, "out of memory for %zu bytes of "
				       "all-to-all staging", bytes);
		/* under the lock: dist_bytes reads the sizes from the caller's thread */
		pthread_mutex_lock(&d->mu);
		free(d->stage[i]);
		d->stage[i] = p;
		d->stage_cap[i] = bytes;
		pthread_mutex_unlock(&d->mu);
	}
	return 0;
}

/* Receive from every peer, then send to every peer starting with the next one (so that at
 * step i rank q sends to q + i while q - i sends to it, and no rank is everybody's first
 * destination), the own piece by a copy, then wait for all.
 *
 * One message per peer, described by the spans' datatypes, except for large blocks of a
 * piece that is not contiguous on both sides ([E / W, W * C, M] receives with E / W > 1):
 * Open MPI's shared-memory transport copies a message once (CMA) only between contiguous
 * buffers, and moves a non-contiguous one through 32 KiB fragments of its own memory, each
 * copied twice and handed over by both processes, measured 2 to 6 times slower than packing
 * and MPI_Alltoall at 16-64 MiB per rank. Each block is contiguous in both spans, so from
 * SPLIT_MIN bytes per block on, a piece goes as nblk messages (matched in order: MPI does
 * not reorder messages of one sender, tag and communicator); below it one message is
 * cheaper (at 8 KiB blocks, 4 messages were 1.7 times slower than one). */
static int a2a_linear(struct dist *d, const struct job *j)
{
	const struct dist_span *s = &j->send, *r = &j->recv;
	const int W = d->W, q = d->q, nb = j->nblk;
	const int64_t n = j->n;
	const size_t rb = j->row_bytes;
	char *sb = s->base, *rbase = r->base;
	MPI_Datatype st, rt;
	int k = 0, nmsg = 1; /* messages per peer, each of nb / nmsg blocks */

	/* with nb > 1, a piece is contiguous exactly when its span is packed */
	if (nb > 1 && (size_t)n * rb >= SPLIT_MIN &&
	    !(dist_span_packed(s, nb, n) && dist_span_packed(r, nb, n))) {
		nmsg = nb;
		if (d->nreq < 2 * (size_t)W * (size_t)nmsg) {
			MPI_Request *p = realloc(d->req, sizeof *p * 2 * (size_t)W * (size_t)nmsg);
			if (!p)
				return err_set(CORE_ENOMEM, NULL, "out of memory for %d x %d requests",
					       2 * W, nmsg);
			d->req = p;
			d->nreq = 2 * (size_t)W * (size_t)nmsg;
		}
	}
	MPI_Request *req = d->req;
	ERR_FORWARD(piece_type(d, nb / nmsg, n, rb, dist_span_blk_stride(s, W, rb), 1, 0, &st));
	ERR_FORWARD(piece_type(d, nb / nmsg, n, rb, dist_span_blk_stride(r, W, rb), 1, 0, &rt));
	for (int i = 1; i < W; i++) {
		int p = (q - i + W) % W;
		for (int b = 0; b < nmsg; b++)
			MPI_RET(MPI_Irecv(rbase + dist_span_off(r, W, nb, p, b, rb), 1, rt, p,
					  TAG_A2A, d->world, &req[k++]));
	}
	for (int i = 1; i < W; i++) {
		int p = (q + i) % W;
		for (int b = 0; b < nmsg; b++)
			MPI_RET(MPI_Isend(sb + dist_span_off(s, W, nb, p, b, rb), 1, st, p, TAG_A2A,
					  d->world, &req[k++]));
	}
	for (int b = 0; b < nb; b++)
		memcpy(rbase + dist_span_off(r, W, nb, q, b, rb),
		       sb + dist_span_off(s, W, nb, q, b, rb), (size_t)n * rb);
	ERR_FORWARD(wait_all(d, k, req));
	return 0;
}

/* Tutel's 2DH All-to-All (arXiv 2206.03382, sec. 3.4.5, Algorithm 2), with N = W / m nodes,
 * this rank being local index l of node v, and S the bytes of one piece:
 *   1. stride copy: A[l'][j] = our piece for rank j*m + l' (grouped by local destination);
 *   2. within the node, A[l'] (N pieces, one message) to local rank l'; from local rank l''
 *      into B[l''], so that B[l''][j] = the piece of rank v*m + l'' for rank j*m + l;
 *   3. stride copy: C[j][l''] = B[l''][j] (grouped by destination node); C reuses A;
 *   4. across nodes, C[j] (m pieces, one message) to rank j*m + l; from node i, the pieces
 *      of ranks i*m .. i*m + m - 1 for us, received straight into the recv span by a
 *      datatype of m pieces at the span's peer stride; our own node's by a copy.
 * m = 1 (every rank a node) leaves phases 1-3 nothing to aggregate and m = W (one node)
 * leaves phase 4 nothing to send: either way the exchange is one message per pair of ranks,
 * which LINEAR sends without the copies. */
/* ph: the seconds of its copies, of the exchange within the node and of the one across
 * (left as they are when there is one level), for exchange() to count. */
static int a2a_2dh(struct dist *d, const struct job *j, double ph[3])
{
	const struct dist_span *r = &j->recv;
	const int W = d->W, m = d->m, N = W / m, v = d->q / m, l = d->q % m, nb = j->nblk;
	const int64_t n = j->n;
	const size_t rb = j->row_bytes, S = (size_t)nb * (size_t)n * rb;
	MPI_Request *req = d->req;
	MPI_Datatype pt, rt;
	int k = 0;

	if (m == 1 || m == W)
		return a2a_linear(d, j);
	ERR_FORWARD(stage_grow(d, (size_t)W * S));
	unsigned char *A = d->stage[0], *B = d->stage[1];
	ERR_FORWARD(packed_type(d, nb, n, rb, &pt));
	ERR_FORWARD(piece_type(d, nb, n, rb, dist_span_blk_stride(r, W, rb), m,
			       dist_span_peer_stride(r, nb, rb), &rt));

	/* phase 1 */
	double t0 = dist_time();
	for (int l2 = 0; l2 < m; l2++)
		for (int jn = 0; jn < N; jn++)
			dist_piece_copy(&j->send, W, jn * m + l2, A + ((size_t)l2 * N + jn) * S, nb,
					n, rb, 0);
	/* phase 2 */
	for (int i = 1; i < m; i++) {
		int p = (l - i + m) % m;
		MPI_RET(MPI_Irecv(B + (size_t)p * N * S, N, pt, p, TAG_A2A, d->intra, &req[k++]));
	}
	for (int i = 1; i < m; i++) {
		int p = (l + i) % m;
		MPI_RET(MPI_Isend(A + (size_t)p * N * S, N, pt, p, TAG_A2A, d->intra, &req[k++]));
	}
	double t1 = dist_time();
	memcpy(B + (size_t)l * N * S, A + (size_t)l * N * S, (size_t)N * S);
	ERR_FORWARD(wait_all(d, k, req));
	/* phase 3 */
	double t2 = dist_time();
	for (int jn = 0; jn < N; jn++)
		for (int l2 = 0; l2 < m; l2++)
			memcpy(A + ((size_t)jn * m + l2) * S, B + ((size_t)l2 * N + jn) * S, S);
	/* phase 4 */
	double t3 = dist_time();
	k = 0;
	for (int i = 1; i < N; i++) {
		int p = (v - i + N) % N;
		MPI_RET(MPI_Irecv((char *)r->base + dist_span_off(r, W, nb, p * m, 0, rb), 1, rt, p,
				  TAG_A2A, d->inter, &req[k++]));
	}
	for (int i = 1; i < N; i++) {
		int p = (v + i) % N;
		MPI_RET(MPI_Isend(A + (size_t)p * m * S, m, pt, p, TAG_A2A, d->inter, &req[k++]));
	}
	for (int l2 = 0; l2 < m; l2++)
		dist_piece_copy(r, W, v * m + l2, A + ((size_t)v * m + l2) * S, nb, n, rb, 1);
	ERR_FORWARD(wait_all(d, k, req));
	ph[0] = (t1 - t0) + (t3 - t2);
	ph[1] = t2 - t1;
	ph[2] = dist_time() - t3;
	return 0;
}

/* MPI_Alltoall on the spans packed in peer order; a span that is packed already is passed
 * as it is, so that with plain [W, piece] buffers this is MPI_Alltoall itself. */
static int a2a_mpi(struct dist *d, const struct job *j)
{
	const struct dist_span *s = &j->send, *r = &j->recv;
	const int W = d->W, nb = j->nblk;
	const int64_t n = j->n;
	const size_t rb = j->row_bytes, S = (size_t)nb * (size_t)n * rb;
	const int spack = dist_span_packed(s, nb, n), rpack = dist_span_packed(r, nb, n);
	MPI_Datatype pt;

	if (!spack || !rpack)
		ERR_FORWARD(stage_grow(d, (size_t)W * S));
	ERR_FORWARD(packed_type(d, nb, n, rb, &pt));
	unsigned char *ps = spack ? s->base : d->stage[0], *pr = rpack ? r->base : d->stage[1];
	if (!spack)
		for (int p = 0; p < W; p++)
			dist_piece_copy(s, W, p, ps + (size_t)p * S, nb, n, rb, 0);
	MPI_RET(MPI_Alltoall(ps, 1, pt, pr, 1, pt, d->world));
	if (!rpack)
		for (int p = 0; p < W; p++)
			dist_piece_copy(r, W, p, pr + (size_t)p * S, nb, n, rb, 1);
	return 0;
}

/* One exchange, on whichever thread runs it, timed into the statistics. */
static int exchange(struct dist *d, const struct job *j)
{
	double t0 = dist_time(), ph[3] = {0, 0, 0};
	int rc = 0;

	if (j->nblk > 0 && j->n > 0 && j->row_bytes > 0) {
		switch (j->a) {
		case DIST_A2A_LINEAR: rc = a2a_linear(d, j); break;
		case DIST_A2A_2DH: rc = a2a_2dh(d, j, ph); break;
		case DIST_A2A_MPI: rc = a2a_mpi(d, j); break;
		}
	}
	double t = dist_time() - t0;
	pthread_mutex_lock(&d->mu);
	d->st.comm_seconds += t;
	d->st.exchanges++;
	d->st.h2d_copy_seconds += ph[0];
	d->st.h2d_intra_seconds += ph[1];
	d->st.h2d_inter_seconds += ph[2];
	pthread_mutex_unlock(&d->mu);
	return rc;
}

static int make_job(const struct dist *d, struct job *j, enum dist_a2a a,
		    const struct dist_span *send, const struct dist_span *recv, int nblk,
		    int64_t n, size_t row_bytes)
{
	int empty;

	ERR_FORWARD(dist_a2a_check(d->W, a, send, recv, nblk, n, row_bytes, &empty));
	*j = (struct job){.a = a, .send = *send, .recv = *recv, .nblk = nblk, .n = n,
			  .row_bytes = row_bytes};
	if (empty)
		j->nblk = 0;
	return 0;
}

int dist_alltoall(struct dist *d, enum dist_a2a a, const struct dist_span *send,
		  const struct dist_span *recv, int nblk, int64_t n, size_t row_bytes)
{
	struct job j;

	ERR_FORWARD(make_job(d, &j, a, send, recv, nblk, n, row_bytes));
	drain(d);
	return exchange(d, &j);
}

int dist_alltoall_start(struct dist *d, enum dist_a2a a, const struct dist_span *send,
			const struct dist_span *recv, int nblk, int64_t n, size_t row_bytes,
			int64_t *ticket)
{
	struct job *j = malloc(sizeof *j);

	if (!j)
		return err_set(CORE_ENOMEM, NULL, "out of memory for an all-to-all job");
	int rc = make_job(d, j, a, send, recv, nblk, n, row_bytes);
	if (rc < 0) {
		free(j);
		return rc;
	}
	j->next = NULL;
	pthread_mutex_lock(&d->mu);
	if (!d->thread_up) {
		int e = pthread_create(&d->thread, NULL, comm_main, d);
		if (e) {
			pthread_mutex_unlock(&d->mu);
			free(j);
			return err_errno(CORE_ENOMEM, NULL, "cannot start the communication thread",
					 e);
		}
		d->thread_up = 1;
	}
	if (d->tail)
		d->tail->next = j;
	else
		d->head = j;
	d->tail = j;
	*ticket = ++d->issued;
	pthread_cond_signal(&d->work);
	pthread_mutex_unlock(&d->mu);
	return 0;
}

int dist_wait(struct dist *d, int64_t ticket)
{
	char file[sizeof d->err_file], detail[sizeof d->err_detail];
	int rc = 0;

	pthread_mutex_lock(&d->mu);
	if (ticket < 1 || ticket > d->issued) {
		int64_t issued = d->issued;
		pthread_mutex_unlock(&d->mu);
		return err_set(CORE_EUSAGE, NULL, "all-to-all ticket %lld was not issued (%lld "
			       "were)", (long long)ticket, (long long)issued);
	}
	while (d->completed < ticket)
		pthread_cond_wait(&d->idle, &d->mu);
	if (d->err_rc && d->err_ticket <= ticket) {
		rc = d->err_rc;
		memcpy(file, d->err_file, sizeof file);
		memcpy(detail, d->err_detail, sizeof detail);
	}
	pthread_mutex_unlock(&d->mu);
	if (rc < 0)
		err_set(rc, file[0] ? file : NULL, "%s", detail);
	return rc;
}

void dist_stats(const struct dist *d, struct dist_stats *s)
{
	struct dist *w = (struct dist *)d; /* the lock, not the statistics, changes */

	pthread_mutex_lock(&w->mu);
	*s = d->st;
	pthread_mutex_unlock(&w->mu);
}

void dist_stats_reset(struct dist *d)
{
	pthread_mutex_lock(&d->mu);
	memset(&d->st, 0, sizeof d->st);
	pthread_mutex_unlock(&d->mu);
}

size_t dist_bytes(const struct dist *d)
{
	struct dist *w = (struct dist *)d;

	pthread_mutex_lock(&w->mu);
	size_t b = d->stage_cap[0] + d->stage_cap[1];
	pthread_mutex_unlock(&w->mu);
	return b;
}
