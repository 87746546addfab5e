/* replay.c - run a fuzz harness without libFuzzer: LLVMFuzzerTestOneInput on every file of
 * the directories (and files) given, in strcmp order of the names within each directory,
 * so that the committed corpus is replayed the same way by any C compiler (`make test`).
 *
 *   replay [-v] DIR|FILE...
 *
 * Names starting with '.' are skipped; subdirectories are not descended into. -v prints each
 * input's outcome ("ok" or the error message the parser gave). Exit status 0 when every input
 * ran; an input that breaks the harness's contract aborts it (the harness says why on
 * stderr), and this driver first names the input that did. */
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"
#include "common/banned.h"

static const char *prog = "replay";
static char current[1024]; /* the input being run, for the dying words */

/* A sanitizer's report ends in abort(), so that on_signal names the input after it (their
 * default is _exit, which nothing can follow). The environment can still override. */
const char *__asan_default_options(void);
const char *__ubsan_default_options(void);
const char *__asan_default_options(void) { return "abort_on_error=1"; }
const char *__ubsan_default_options(void) { return "abort_on_error=1:print_stacktrace=1"; }

static void say_current(void)
{
	static const char head[] = ": failed on input ";
	if (!current[0])
		return;
	/* async-signal-safe: write(2) only */
	if (write(2, prog, strlen(prog)) < 0 || write(2, head, sizeof head - 1) < 0 ||
	    write(2, current, strlen(current)) < 0 || write(2, "\n", 1) < 0)
		return;
}

static void on_signal(int sig)
{
	say_current();
	fuzz_cleanup();
	signal(sig, SIG_DFL);
	raise(sig);
}

static int run_file(const char *path, int verbose)
{
	FILE *fp = fopen(path, "rb");
	unsigned char *buf = NULL;
	size_t n = 0, cap = 0;

	if (!fp) {
		fprintf(stderr, "%s: cannot open '%s': %s\n", prog, path, strerror(errno));
		return -1;
	}
	for (;;) {
		if (n == cap) {
			cap = cap ? 2 * cap : 4096;
			unsigned char *nb = realloc(buf, cap);
			if (!nb) {
				fprintf(stderr, "%s: '%s': out of memory\n", prog, path);
				free(buf);
				fclose(fp);
				return -1;
			}
			buf = nb;
		}
		size_t k = fread(buf + n, 1, cap - n, fp);
		n += k;
		if (k == 0)
			break;
	}
	int bad = ferror(fp);
	fclose(fp);
	if (bad) {
		fprintf(stderr, "%s: cannot read '%s'\n", prog, path);
		free(buf);
		return -1;
	}
	snprintf(current, sizeof current, "%s", path);
	fuzz_outcome[0] = '\0';
	LLVMFuzzerTestOneInput(buf, n);
	if (verbose) {
		printf("%s: ", path);
		for (const char *s = fuzz_outcome; *s; s++)
			putchar((unsigned char)*s < 0x20 ? '?' : *s);
		putchar('\n');
	}
	current[0] = '\0';
	free(buf);
	return 0;
}

static int visible(const struct dirent *e)
{
	return e->d_name[0] != '.';
}

static int by_name(const struct dirent **a, const struct dirent **b)
{
	return strcmp((*a)->d_name, (*b)->d_name);
}

int main(int argc, char **argv)
{
	int verbose = 0, first = 1, fail = 0;
	long count = 0;

	if (argc > 0 && argv[0][0]) {
		const char *slash = strrchr(argv[0], '/');
		prog = slash ? slash + 1 : argv[0];
	}
	if (argc > 1 && strcmp(argv[1], "-v") == 0) {
		verbose = 1;
		first = 2;
	}
	if (first >= argc) {
		fprintf(stderr, "usage: %s [-v] DIR|FILE...\n", prog);
		return 2;
	}
	/* A signal a sanitizer already handles (it reports faults itself, then aborts) is left
	 * to it; abort() and the rest name the input. */
	static const int sigs[] = { SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL };
	for (size_t i = 0; i < sizeof sigs / sizeof sigs[0]; i++) {
		struct sigaction old;
		if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_DFL)
			signal(sigs[i], on_signal);
	}
	for (int i = first; i < argc; i++) {
		struct stat st;
		if (stat(argv[i], &st) != 0) {
			fprintf(stderr, "%s: '%s': %s\n", prog, argv[i], strerror(errno));
			fail = 1;
			continue;
		}
		if (!S_ISDIR(st.st_mode)) {
			fail |= run_file(argv[i], verbose) != 0;
			count++;
			continue;
		}
		struct dirent **names;
		int n = scandir(argv[i], &names, visible, by_name);
		if (n < 0) {
			fprintf(stderr, "%s: cannot list '%s': %s\n", prog, argv[i], strerror(errno));
			fail = 1;
			continue;
		}
		for (int j = 0; j < n; j++) {
			char path[1024];
			snprintf(path, sizeof path, "%s/%s", argv[i], names[j]->d_name);
			if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
				fail |= run_file(path, verbose) != 0;
				count++;
			}
			free(names[j]);
		}
		free(names);
	}
	printf("%ld inputs%s\n", count, fail ? ", some unreadable" : ", no failure");
	return fail;
}
