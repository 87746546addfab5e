/* launcher.c - what the launcher's environment says of this process, without MPI: the one
 * test of "started by mpirun or srun" for every program (dist_launcher, dist.h). A file of
 * its own so that a program using it links nothing else of lib/dist. */
#include "dist/dist.h"

#include <errno.h>
#include <stdlib.h>

#include "common/banned.h"

/* A non-negative decimal integer in the environment variable var, or -1. */
static long env_long(const char *var)
{
	const char *s = getenv(var);
	char *end;

	if (!s || !*s)
		return -1;
	errno = 0;
	long v = strtol(s, &end, 10);
	return errno || *end || v < 0 ? -1 : v;
}

int dist_launcher(long *rank, long *size)
{
	static const char *const pairs[][2] = {
		{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"}, /* Open MPI's mpirun */
		{"PMI_RANK", "PMI_SIZE"},                         /* MPICH's Hydra, Slurm's PMI2 */
		{"PMIX_RANK", "SLURM_NTASKS"},                    /* srun --mpi=pmix */
	};

	*rank = 0;
	*size = 1;
	for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
		long r = env_long(pairs[k][0]), s = env_long(pairs[k][1]);
		if (r >= 0 && s >= 1 && r < s) {
			*rank = r;
			*size = s;
			return 1;
		}
	}
	return 0;
}
