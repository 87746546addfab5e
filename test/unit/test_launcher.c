/* test_launcher.c - dist_launcher (lib/dist/launcher.c), the one "started by mpirun or
 * srun?" test: each launcher's variables as Open MPI, MPICH's Hydra, Slurm's PMI2 and PMIx
 * under srun set them, written out by hand, and the environments that must not count. */
#include <criterion/criterion.h>
#include <stdlib.h>

#include "dist/dist.h"
#include "common/banned.h"

static const char *const vars[] = {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK",
				   "PMI_SIZE", "PMIX_RANK", "SLURM_NTASKS"};

static void clear(void)
{
	for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
		unsetenv(vars[i]);
}

TestSuite(launcher, .init = clear, .fini = clear);

/* Set pairs of name, value (NULL-terminated), then ask. */
static int ask(long *rank, long *size, const char *const *kv)
{
	clear();
	for (; kv[0]; kv += 2)
		setenv(kv[0], kv[1], 1);
	return dist_launcher(rank, size);
}

Test(launcher, each_launcher_and_what_does_not_count)
{
	static const struct {
		const char *kv[9];
		int found;
		long rank, size;
	} cases[] = {
		{{NULL}, 0, 0, 1},
		{{"OMPI_COMM_WORLD_RANK", "2", "OMPI_COMM_WORLD_SIZE", "4", NULL}, 1, 2, 4},
		{{"PMI_RANK", "0", "PMI_SIZE", "1", NULL}, 1, 0, 1},
		{{"PMIX_RANK", "3", "SLURM_NTASKS", "8", NULL}, 1, 3, 8},
		/* Open MPI first when several launchers' variables are there */
		{{"PMI_RANK", "1", "PMI_SIZE", "2", "OMPI_COMM_WORLD_RANK", "5",
		  "OMPI_COMM_WORLD_SIZE", "6", NULL}, 1, 5, 6},
		/* a rank alone, a size alone, a rank not below the size, not a number */
		{{"OMPI_COMM_WORLD_RANK", "1", NULL}, 0, 0, 1},
		{{"PMI_SIZE", "4", NULL}, 0, 0, 1},
		{{"PMI_RANK", "4", "PMI_SIZE", "4", NULL}, 0, 0, 1},
		{{"OMPI_COMM_WORLD_RANK", "1x", "OMPI_COMM_WORLD_SIZE", "4", NULL}, 0, 0, 1},
		{{"OMPI_COMM_WORLD_RANK", "-1", "OMPI_COMM_WORLD_SIZE", "4", NULL}, 0, 0, 1},
		{{"PMI_RANK", "0", "PMI_SIZE", "0", NULL}, 0, 0, 1},
		{{"PMIX_RANK", "0", NULL}, 0, 0, 1},
		/* a bad Open MPI pair falls through to a good PMI one */
		{{"OMPI_COMM_WORLD_RANK", "", "OMPI_COMM_WORLD_SIZE", "4", "PMI_RANK", "1",
		  "PMI_SIZE", "3", NULL}, 1, 1, 3},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		long rank = -7, size = -7;
		int got = ask(&rank, &size, cases[i].kv);
		cr_expect_eq(got, cases[i].found, "case %zu: found %d", i, got);
		cr_expect(rank == cases[i].rank && size == cases[i].size,
			  "case %zu: rank %ld size %ld, want %ld %ld", i, rank, size, cases[i].rank,
			  cases[i].size);
	}
}
