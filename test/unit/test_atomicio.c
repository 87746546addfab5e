/* test_atomicio.c - atomic output files: commit replaces, abort and failures leave the old
 * file and no temporary file, a killed writer leaves nothing, the bytes written in pieces
 * arrive whole, devices and FIFOs are written to and never replaced, and inputs that must be
 * regular files refuse a FIFO at once.
 *
 * The test includes atomicio.c itself (as test_config.c does config.c) so that it can switch
 * off O_TMPFILE and exercise the mkstemp fallback of file systems without it.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "io/atomicio.c"
#include "common/err.h"
#include "common/rng.h"
#include "testutil.h"
#include "common/banned.h"

static char dir[256];

static void setup(void) { tu_mkdtemp(dir, sizeof dir, "atomicio"); }

static void teardown(void) { tu_rm_tree(dir); }

TestSuite(atomicio, .init = setup, .fini = teardown, .timeout = 20);

static int count_files(void)
{
	DIR *dd = opendir(dir);
	struct dirent *e;
	int n = 0;

	while ((e = readdir(dd)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			n++;
	closedir(dd);
	return n;
}

static void put(const char *path, const char *s)
{
	FILE *fp = fopen(path, "wb");
	cr_assert(fp);
	fputs(s, fp);
	cr_assert(fclose(fp) == 0);
}

/* Read back with stdio, independently of file_read_all. The text lasts until the next call,
 * which frees it (the callers free nothing). */
static char *get(const char *path, size_t *n)
{
	static char *buf;
	free(buf);
	buf = tu_slurp(path, n);
	return buf;
}

static void commit_replaces(void);

Test(atomicio, commit_replaces) { commit_replaces(); }

Test(atomicio, commit_replaces_without_o_tmpfile)
{
	afile_no_tmpfile = 1;
	commit_replaces();
}

static void commit_replaces(void)
{
	char path[320];
	struct afile a;
	size_t n;

	snprintf(path, sizeof path, "%s/out.txt", dir);
	put(path, "old content that is longer than the new one\n");
	cr_assert(afile_open(&a, path) == 0, "%s", err_detail());
	if (afile_no_tmpfile) { /* the fallback: a named temporary file next to the target */
		cr_assert_eq(count_files(), 2, "temporary file not next to the target");
		cr_assert(strncmp(a.tmp, path, strlen(path)) == 0 && strstr(a.tmp, ".tmp."),
			  "temporary name '%s'", a.tmp);
	} else { /* O_TMPFILE: nothing to see until commit */
		cr_assert_eq(count_files(), 1, "an unnamed temporary file has a name");
		cr_assert_null(a.tmp, "temporary name '%s'", a.tmp);
	}
	cr_assert(afile_write(&a, "new ", 4) == 0);
	cr_assert(fputs("content\n", a.fp) >= 0); /* writing through fp is allowed too */
	/* Before commit the target is still the old file. */
	cr_assert_str_eq(get(path, &n), "old content that is longer than the new one\n");
	cr_assert(afile_commit(&a) == 0, "%s", err_detail());
	cr_assert_str_eq(get(path, &n), "new content\n");
	cr_assert_eq(count_files(), 1, "temporary file left behind");
	cr_assert_null(a.tmp);
	cr_assert_null(a.path);
	afile_abort(&a); /* after commit: harmless, and must not remove the target */
	cr_assert_str_eq(get(path, &n), "new content\n");
}

Test(atomicio, commit_creates_with_umask_mode)
{
	char path[320];
	struct stat st;

	umask(027);
	snprintf(path, sizeof path, "%s/mode.txt", dir);
	cr_assert(file_write_atomic(path, "x", 1) == 0, "%s", err_detail());
	cr_assert(stat(path, &st) == 0);
	cr_assert_eq(st.st_mode & 0777, 0640, "mode %o, expected 640 under umask 027",
		     st.st_mode & 0777);
}

Test(atomicio, abort_keeps_old_content)
{
	char path[320];
	struct afile a;
	size_t n;

	snprintf(path, sizeof path, "%s/keep.txt", dir);
	put(path, "precious\n");
	cr_assert(afile_open(&a, path) == 0);
	cr_assert(afile_write(&a, "garbage", 7) == 0);
	afile_abort(&a);
	cr_assert_str_eq(get(path, &n), "precious\n");
	cr_assert_eq(count_files(), 1, "temporary file left behind");
	afile_abort(&a); /* twice is harmless */
}

Test(atomicio, pieces_arrive_whole)
{
	char path[320];
	struct afile a;
	static unsigned char bytes[100000];

	for (size_t i = 0; i < sizeof bytes; i++)
		bytes[i] = (unsigned char)rng_u64(5, RNG_STREAM_TEST, i);
	snprintf(path, sizeof path, "%s/pieces.bin", dir);
	cr_assert(afile_open(&a, path) == 0);
	/* Uneven pieces, including an empty one. */
	size_t cuts[] = {0, 1, 1, 17, 4096, 50000, 99999, 100000};
	for (int i = 1; i < 8; i++)
		cr_assert(afile_write(&a, bytes + cuts[i - 1], cuts[i] - cuts[i - 1]) == 0);
	cr_assert_eq(a.nbytes, sizeof bytes);
	/* A header patched at the end does not count as written bytes. */
	cr_assert(afile_pwrite(&a, "HEAD", 4, 10) == 0, "%s", err_detail());
	cr_assert_eq(a.nbytes, sizeof bytes);
	cr_assert(afile_commit(&a) == 0, "%s", err_detail());

	size_t n;
	char *got;
	cr_assert(file_read_all(path, 0, &got, &n) == 0, "%s", err_detail());
	cr_assert_eq(n, sizeof bytes);
	memcpy(bytes + 10, "HEAD", 4);
	cr_assert(memcmp(got, bytes, n) == 0, "file content differs after pwrite");
	cr_assert_eq(got[n], '\0', "not NUL-terminated");
	free(got);
}

static void failed_rename_removes_temporary(void);

Test(atomicio, failed_rename_removes_temporary) { failed_rename_removes_temporary(); }

Test(atomicio, failed_rename_removes_temporary_without_o_tmpfile)
{
	afile_no_tmpfile = 1;
	failed_rename_removes_temporary();
}

static void failed_rename_removes_temporary(void)
{
	char path[320];
	struct afile a;

	/* A directory in the way of the target: rename(2) fails after everything was written. */
	snprintf(path, sizeof path, "%s/adir", dir);
	cr_assert(mkdir(path, 0755) == 0);
	cr_assert(afile_open(&a, path) == 0);
	cr_assert(afile_write(&a, "data", 4) == 0);
	int rc = afile_commit(&a);
	cr_assert_eq(rc, CORE_EIO, "commit over a directory returned %d", rc);
	cr_assert_str_eq(err_file(), path);
	cr_assert(strstr(err_detail(), "rename"), "detail '%s'", err_detail());
	cr_assert_eq(count_files(), 1, "temporary file left behind");
}

Test(atomicio, errors_name_the_path)
{
	char path[320], *buf = (char *)1;
	struct afile a;
	size_t n = 99;

	snprintf(path, sizeof path, "%s/missing/file", dir);
	cr_assert_eq(afile_open(&a, path), CORE_EIO);
	cr_assert_str_eq(err_file(), path);
	cr_assert(strstr(err_detail(), "no such file"), "detail '%s'", err_detail());
	cr_assert_eq(file_write_atomic(path, "x", 1), CORE_EIO);
	cr_assert_eq(file_read_all(path, 0, &buf, &n), CORE_ENOTFOUND);
	cr_assert_str_eq(err_file(), path);
	cr_assert_null(buf);
	cr_assert_eq(n, 0);
	cr_assert_eq(count_files(), 0);
}

Test(atomicio, read_all_of_empty_and_special_files)
{
	char path[320], *buf;
	size_t n;

	snprintf(path, sizeof path, "%s/empty", dir);
	put(path, "");
	cr_assert(file_read_all(path, 0, &buf, &n) == 0);
	cr_assert_eq(n, 0);
	cr_assert_str_eq(buf, "");
	free(buf);
	/* /proc files report size 0 but have content: read to EOF, not to st_size. */
	cr_assert(file_read_all("/proc/self/status", 0, &buf, &n) == 0, "%s", err_detail());
	cr_assert(n > 0 && strstr(buf, "Pid:"), "read %zu bytes", n);
	free(buf);
}

/* ---- a killed writer ---------------------------------------------------------------------- */

/* A child writes (and with prepared != 0 also prepares) path, tells the parent through a
 * pipe, and waits; the parent kills it with SIGKILL in the middle of the write. */
static void kill_writer(const char *path, int prepared)
{
	static char block[1 << 16];
	int p[2];
	char c;

	cr_assert(pipe(p) == 0);
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		struct afile a;
		alarm(30); /* never outlive a failed test */
		close(p[0]);
		if (afile_open(&a, path) != 0)
			_exit(2);
		for (int i = 0; i < 16; i++)
			if (afile_write(&a, block, sizeof block) != 0)
				_exit(3);
		if (prepared && afile_prepare(&a) != 0)
			_exit(4);
		if (write(p[1], "x", 1) != 1)
			_exit(5);
		for (;;)
			pause();
	}
	close(p[1]);
	cr_assert_eq(read(p[0], &c, 1), 1, "the writer failed before the kill");
	close(p[0]);
	cr_assert(kill(pid, SIGKILL) == 0);
	int st;
	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "status %d", st);
}

Test(atomicio, kill_during_write_leaves_nothing)
{
	char path[320];
	size_t n;

	snprintf(path, sizeof path, "%s/out.safetensors", dir);
	kill_writer(path, 0);
	cr_assert_eq(count_files(), 0, "a killed writer left a file");
	kill_writer(path, 1);
	cr_assert_eq(count_files(), 0, "a writer killed after prepare left a file");
	put(path, "old\n");
	kill_writer(path, 0);
	cr_assert_eq(count_files(), 1, "a killed writer left a temporary file");
	cr_assert_str_eq(get(path, &n), "old\n");
}

/* ---- targets that are not regular files --------------------------------------------------- */

/* A private /dev/null (1, 3) or /dev/full (1, 7) in dir; skips the test without root. */
static void make_device(const char *path, unsigned minor)
{
	if (mknod(path, S_IFCHR | 0666, makedev(1, minor)) != 0)
		cr_skip_test("cannot mknod '%s' (%s): needs root", path, strerror(errno));
}

static void expect_type(const char *path, mode_t type, const char *what)
{
	struct stat st;

	cr_assert(lstat(path, &st) == 0, "%s: %s", path, strerror(errno));
	cr_assert_eq(st.st_mode & S_IFMT, type, "%s: '%s' is now of type %o", what, path,
		     st.st_mode & S_IFMT);
}

Test(atomicio, device_is_written_not_replaced)
{
	char path[320];
	struct afile a;

	snprintf(path, sizeof path, "%s/null", dir);
	make_device(path, 3);
	cr_assert(file_write_atomic(path, "discarded\n", 10) == 0, "%s", err_detail());
	expect_type(path, S_IFCHR, "file_write_atomic");
	/* a header patched at the end, as the token and checkpoint writers do */
	cr_assert(afile_open(&a, path) == 0, "%s", err_detail());
	cr_assert(afile_write(&a, "0123456789", 10) == 0, "%s", err_detail());
	cr_assert(afile_pwrite(&a, "HEAD", 4, 0) == 0, "%s", err_detail());
	cr_assert(afile_prepare(&a) == 0, "%s", err_detail());
	cr_assert(afile_commit(&a) == 0, "%s", err_detail());
	expect_type(path, S_IFCHR, "afile_commit");
	cr_assert(afile_open(&a, path) == 0, "%s", err_detail());
	afile_abort(&a);
	expect_type(path, S_IFCHR, "afile_abort");
	/* and through a link to it: the link stays, and so does the device */
	char link[320];
	snprintf(link, sizeof link, "%s/null-link", dir);
	cr_assert(symlink("null", link) == 0);
	cr_assert(file_write_atomic(link, "x", 1) == 0, "%s", err_detail());
	expect_type(link, S_IFLNK, "through a link");
	expect_type(path, S_IFCHR, "through a link");
	cr_assert_eq(count_files(), 2, "temporary file left behind");
}

Test(atomicio, full_device_fails_and_stays)
{
	char path[320];
	static char big[1 << 16];

	snprintf(path, sizeof path, "%s/full", dir);
	make_device(path, 7);
	int rc = file_write_atomic(path, big, sizeof big);
	cr_assert_eq(rc, CORE_EIO, "writing to a full device returned %d", rc);
	cr_assert_str_eq(err_file(), path);
	cr_assert(strstr(err_detail(), "space"), "detail '%s'", err_detail());
	expect_type(path, S_IFCHR, "after the failure");
	cr_assert_eq(count_files(), 1, "temporary file left behind");
}

/* Fork a reader that copies the FIFO at fifo to the file at copy; returns its pid. */
static pid_t fifo_reader(const char *fifo, const char *copy)
{
	pid_t pid = fork();

	cr_assert(pid >= 0);
	if (pid == 0) {
		char buf[4096];
		ssize_t n;
		alarm(20); /* a FIFO replaced by a file would leave this open waiting forever */
		int in = open(fifo, O_RDONLY), out = open(copy, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		if (in < 0 || out < 0)
			_exit(2);
		while ((n = read(in, buf, sizeof buf)) > 0)
			if (write(out, buf, (size_t)n) != n)
				_exit(3);
		_exit(n == 0 && close(out) == 0 ? 0 : 4);
	}
	return pid;
}

static void reap(pid_t pid)
{
	int st;

	cr_assert_eq(waitpid(pid, &st, 0), pid);
	cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "reader status %d", st);
}

Test(atomicio, fifo_with_a_reader_gets_the_bytes)
{
	char fifo[320], copy[320];
	struct afile a;
	size_t n;

	snprintf(fifo, sizeof fifo, "%s/out.fifo", dir);
	snprintf(copy, sizeof copy, "%s/copy", dir);
	cr_assert(mkfifo(fifo, 0600) == 0);
	pid_t pid = fifo_reader(fifo, copy);
	cr_assert(file_write_atomic(fifo, "through a pipe\n", 15) == 0, "%s", err_detail());
	reap(pid);
	expect_type(fifo, S_IFIFO, "file_write_atomic");
	cr_assert_str_eq(get(copy, &n), "through a pipe\n");
	/* A FIFO cannot seek: the header patched at the end still arrives in its place. */
	pid = fifo_reader(fifo, copy);
	cr_assert(afile_open(&a, fifo) == 0, "%s", err_detail());
	cr_assert(afile_write(&a, "....body\n", 9) == 0, "%s", err_detail());
	cr_assert(afile_pwrite(&a, "HEAD", 4, 0) == 0, "%s", err_detail());
	cr_assert(afile_commit(&a) == 0, "%s", err_detail());
	reap(pid);
	expect_type(fifo, S_IFIFO, "afile_commit");
	cr_assert_str_eq(get(copy, &n), "HEADbody\n");
	cr_assert_eq(count_files(), 2, "temporary file left behind");
}

Test(atomicio, link_to_a_file_is_followed)
{
	char path[320], link[320];
	size_t n;

	snprintf(path, sizeof path, "%s/target.txt", dir);
	snprintf(link, sizeof link, "%s/link.txt", dir);
	put(path, "old\n");
	cr_assert(symlink("target.txt", link) == 0);
	cr_assert(file_write_atomic(link, "new\n", 4) == 0, "%s", err_detail());
	expect_type(link, S_IFLNK, "the link");
	cr_assert_str_eq(get(path, &n), "new\n");
	cr_assert_eq(count_files(), 2, "temporary file left behind");
}

/* ---- inputs ------------------------------------------------------------------------------- */

Test(atomicio, regular_inputs_refuse_a_fifo_at_once)
{
	char path[320], *buf = NULL;
	int fd = -1;
	size_t n;

	snprintf(path, sizeof path, "%s/in.fifo", dir);
	cr_assert(mkfifo(path, 0600) == 0);
	/* no writer: a blocking open would hang here until the suite's timeout */
	cr_assert_eq(file_open_regular(path, &fd, NULL), CORE_EIO);
	cr_assert_eq(fd, -1);
	cr_assert_str_eq(err_file(), path);
	cr_assert_str_eq(err_detail(), "is a FIFO, not a regular file");
	cr_assert_eq(file_read_regular(path, 0, &buf, &n), CORE_EIO);
	cr_assert_null(buf);
	cr_assert_eq(file_open_regular(dir, &fd, NULL), CORE_EIO);
	cr_assert_str_eq(err_detail(), "is a directory, not a regular file");
	cr_assert_eq(file_open_regular("/dev/null", &fd, NULL), CORE_EIO);
	cr_assert_str_eq(err_detail(), "is a character device, not a regular file");
	snprintf(path, sizeof path, "%s/missing", dir);
	cr_assert_eq(file_open_regular(path, &fd, NULL), CORE_ENOTFOUND);
	/* a regular file opens, and reads block again (no O_NONBLOCK left over) */
	snprintf(path, sizeof path, "%s/plain", dir);
	put(path, "plain\n");
	struct stat st;
	cr_assert_eq(file_open_regular(path, &fd, &st), 0, "%s", err_detail());
	cr_assert_eq(st.st_size, 6);
	cr_assert_eq(fcntl(fd, F_GETFL) & O_NONBLOCK, 0, "O_NONBLOCK left on");
	close(fd);
	cr_assert_eq(file_read_regular(path, 0, &buf, &n), 0, "%s", err_detail());
	cr_assert_eq(n, 6);
	cr_assert_str_eq(buf, "plain\n");
	free(buf);
}

Test(atomicio, read_all_reads_a_fifo_as_a_stream)
{
	char path[320], *buf;
	size_t n;

	snprintf(path, sizeof path, "%s/stream.fifo", dir);
	cr_assert(mkfifo(path, 0600) == 0);
	pid_t pid = fork();
	cr_assert(pid >= 0);
	if (pid == 0) {
		alarm(20); /* never outlive a failed test */
		int fd = open(path, O_WRONLY);
		for (int i = 0; fd >= 0 && i < 1000; i++)
			if (write(fd, "0123456789", 10) != 10)
				_exit(1);
		_exit(fd >= 0 && close(fd) == 0 ? 0 : 2);
	}
	cr_assert_eq(file_read_all(path, 0, &buf, &n), 0, "%s", err_detail());
	reap(pid);
	cr_assert_eq(n, 10000, "read %zu bytes of a stream of 10000", n);
	cr_assert_eq(memcmp(buf + 9990, "0123456789", 10), 0);
	free(buf);
}

/* ---- dir_make / dir_unmake: mkdir -p, and the undo of what it made ---------------------------- */

static int is_dir(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

Test(atomicio, dir_make_parents_and_undo)
{
	char p[512], made[512], q[512];

	/* three missing levels: all made, the outermost reported */
	snprintf(p, sizeof p, "%s/a/b//c/", dir);
	cr_assert_eq(dir_make(p, made, sizeof made), 0, "%s", err_detail());
	snprintf(q, sizeof q, "%s/a/b/c", dir);
	cr_assert(is_dir(q));
	snprintf(q, sizeof q, "%s/a", dir);
	cr_assert_str_eq(made, q);
	/* undone: every level it made, the test's own folder kept */
	dir_unmake(p, made);
	cr_assert(!is_dir(q), "%s left behind", q);
	cr_assert(is_dir(dir));

	/* a/ there already: only b and c made and undone; a kept */
	cr_assert_eq(mkdir(q, 0777), 0);
	snprintf(p, sizeof p, "%s/a/b/c", dir);
	cr_assert_eq(dir_make(p, made, sizeof made), 0);
	snprintf(q, sizeof q, "%s/a/b", dir);
	cr_assert_str_eq(made, q);
	/* a file put in b: undo stops there (only empty folders go) */
	snprintf(q, sizeof q, "%s/a/b/keep", dir);
	put(q, "x");
	dir_unmake(p, made);
	cr_assert(is_dir(dir) && access(q, F_OK) == 0);
	snprintf(q, sizeof q, "%s/a/b/c", dir);
	cr_assert(!is_dir(q), "the empty c was not removed");

	/* the whole path there: nothing made, nothing undone */
	snprintf(p, sizeof p, "%s/a/b", dir);
	cr_assert_eq(dir_make(p, made, sizeof made), 0);
	cr_assert_str_eq(made, "");
	dir_unmake(p, made);
	cr_assert(is_dir(p));
}

Test(atomicio, dir_make_refuses_files)
{
	char f[512], p[512], made[512];

	snprintf(f, sizeof f, "%s/file", dir);
	put(f, "x");
	cr_assert_eq(dir_make(f, made, sizeof made), CORE_EIO);
	cr_assert(strstr(err_detail(), "not a directory"), "%s", err_detail());
	snprintf(p, sizeof p, "%s/file/sub/x", dir);
	cr_assert_eq(dir_make(p, made, sizeof made), CORE_EIO);
	cr_assert(strstr(err_detail(), "a parent of the output folder"), "%s", err_detail());
	cr_assert_str_eq(err_file(), f, "the error names %s, not the file in the way %s", err_file(), f);
	cr_assert_str_eq(made, "");
	cr_assert_eq(count_files(), 1);
}
