/* test_atomicio.c - atomic output files: commit replaces, abort and failures leave the old
 * file and no temporary file, and the bytes written in pieces arrive whole. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "io/atomicio.h"
#include "common/err.h"
#include "common/rng.h"
#include "common/banned.h"

static char dir[64];

static void rm_tree(const char *d)
{
	DIR *dd = opendir(d);
	struct dirent *e;
	char p[512];

	if (!dd)
		return;
	while ((e = readdir(dd))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(p, sizeof p, "%s/%s", d, e->d_name);
		if (unlink(p) != 0)
			rm_tree(p);
	}
	closedir(dd);
	rmdir(d);
}

static void setup(void)
{
	snprintf(dir, sizeof dir, "/tmp/test_atomicio.XXXXXX");
	cr_assert(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
}

static void teardown(void) { rm_tree(dir); }

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

/* Read back with stdio, independently of file_read_all. */
static char *get(const char *path, size_t *n)
{
	static char buf[1 << 16];
	FILE *fp = fopen(path, "rb");
	cr_assert(fp, "cannot open '%s'", path);
	*n = fread(buf, 1, sizeof buf - 1, fp);
	buf[*n] = '\0';
	fclose(fp);
	return buf;
}

Test(atomicio, commit_replaces)
{
	char path[128];
	struct afile a;
	size_t n;

	snprintf(path, sizeof path, "%s/out.txt", dir);
	put(path, "old content that is longer than the new one\n");
	cr_assert(afile_open(&a, path) == 0, "%s", err_detail());
	cr_assert_eq(count_files(), 2, "temporary file not next to the target");
	cr_assert(strncmp(a.tmp, path, strlen(path)) == 0 && strstr(a.tmp, ".tmp."),
		  "temporary name '%s'", a.tmp);
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
	char path[128];
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
	char path[128];
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
	char path[128];
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

Test(atomicio, failed_rename_removes_temporary)
{
	char path[128];
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
	char path[160], *buf = (char *)1;
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
	char path[128], *buf;
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
