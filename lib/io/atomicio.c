/* atomicio.c - crash-safe output files: an unnamed file, fsync, a temporary name, rename, fsync
 * of the directory.
 *
 * Why each step: the temporary file lives in the target's directory because rename(2) is
 * atomic only within one file system; fsync before rename so that the name never points at
 * blocks that were not yet written (ext4 delalloc and friends); fsync of the directory after
 * rename so that the new name itself survives a power cut. The data stays unnamed (O_TMPFILE)
 * until commit, so that a process killed while writing (kill -9, the OOM killer) leaves no
 * file behind; linkat(2) cannot replace an existing name, hence the link to a temporary name
 * and then the rename. After afile_commit() or afile_abort() the struct holds nothing, so
 * calling afile_abort() again (a cleanup path that runs on every exit) is harmless.
 *
 * A target that is not a regular file (a device, a FIFO) must never be renamed over: root's
 * `-o /dev/null` would replace the machine's /dev/null with a regular file. Such targets are
 * written to directly; see atomicio.h.
 */
#include "io/atomicio.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <threads.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"
#include "common/banned.h"

enum {
	AFILE_NONE,   /* not open (a zeroed struct) */
	AFILE_NAMED,  /* temporary file with a name from mkstemp: tmp */
	AFILE_ANON,   /* unnamed O_TMPFILE file, given a name at commit */
	AFILE_DIRECT, /* the target itself (a device that can seek): fp writes to it */
	AFILE_SPOOL   /* unnamed spool in fp, copied to the target (out) at prepare */
};

/* Set by the unit test to exercise the mkstemp fallback of file systems without O_TMPFILE. */
static int afile_no_tmpfile;

static int io_error(const char *path, const char *what, int e)
{
	return err_errno(CORE_EIO, path, what, e);
}

/* mkstemp() creates files with mode 0600; a finished output file should get the mode a plain
 * fopen() would give it (0666 minus umask). umask() can only be read by setting it, so read it
 * once, before worker threads are likely to create files. */
static mode_t file_mode;
static once_flag file_mode_once = ONCE_FLAG_INIT;

static void read_umask(void)
{
	mode_t m = umask(022);
	umask(m);
	file_mode = 0666 & ~m;
}

static const char *type_name(mode_t m)
{
	if (S_ISDIR(m))
		return "a directory";
	if (S_ISFIFO(m))
		return "a FIFO";
	if (S_ISCHR(m))
		return "a character device";
	if (S_ISBLK(m))
		return "a block device";
	if (S_ISSOCK(m))
		return "a socket";
	return "something else";
}

/* "dir" of "dir/name", "." of "name", "/" of "/name". */
static char *dir_of(const char *path)
{
	const char *slash = strrchr(path, '/');

	if (!slash)
		return strdup(".");
	return strndup(path, slash == path ? 1 : (size_t)(slash - path));
}

/* The target is not a regular file: write to it, never rename over it. */
static int open_direct(struct afile *a)
{
	struct stat st;
	int fd = open(a->path, O_WRONLY | O_NOCTTY | O_CLOEXEC);

	if (fd < 0)
		return io_error(a->path, "cannot open for writing", errno);
	if (fstat(fd, &st) != 0) {
		int e = errno;
		close(fd);
		return io_error(a->path, "cannot stat", e);
	}
	if (S_ISREG(st.st_mode)) { /* replaced since the stat: back to the atomic way */
		close(fd);
		return 1;
	}
	int spool = lseek(fd, 0, SEEK_CUR) < 0;
	/* The spool is unnamed, in /tmp: nothing to clean up after a crash. */
	a->fp = spool ? tmpfile() : fdopen(fd, "wb");
	if (!a->fp) {
		int e = errno;
		close(fd);
		return io_error(a->path, spool ? "cannot create a spool file" : "cannot open", e);
	}
	a->kind = spool ? AFILE_SPOOL : AFILE_DIRECT;
	a->out = fd;
	return 0;
}

/* An unnamed file in dir, or -1 with errno set (EOPNOTSUPP and friends: no O_TMPFILE here). */
static int open_anon(const char *dir)
{
#ifdef O_TMPFILE
	if (!afile_no_tmpfile)
		return open(dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, file_mode);
#endif
	(void)dir;
	errno = EOPNOTSUPP;
	return -1;
}

static void afile_clear(struct afile *a)
{
	free(a->path);
	free(a->tmp);
	free(a->target);
	memset(a, 0, sizeof *a);
}

int afile_open(struct afile *a, const char *path)
{
	static const char suffix[] = ".tmp.XXXXXX";
	struct stat st, lst;
	char *dir = NULL;
	int fd = -1, rc, e;

	memset(a, 0, sizeof *a);
	if (path[0] == '\0')
		return err_set(CORE_EUSAGE, NULL, "empty output file name");
	call_once(&file_mode_once, read_umask);
	if (!(a->path = strdup(path)))
		return err_set(CORE_ENOMEM, path, "cannot allocate file names");
	if (stat(path, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
		rc = open_direct(a);
		if (rc <= 0) {
			if (rc < 0)
				afile_clear(a);
			return rc;
		}
	}
	/* A link to a regular file: replace the file it names, keep the link. */
	if (lstat(path, &lst) == 0 && S_ISLNK(lst.st_mode))
		a->target = realpath(path, NULL);
	if (!a->target)
		a->target = strdup(path);
	if (!a->target || !(dir = dir_of(a->target))) {
		afile_clear(a);
		return err_set(CORE_ENOMEM, path, "cannot allocate file names");
	}
	fd = open_anon(dir);
	e = errno;
	free(dir);
	if (fd >= 0) {
		a->kind = AFILE_ANON;
	} else if (e == EOPNOTSUPP || e == EISDIR || e == EINVAL) {
		size_t len = strlen(a->target);
		if (!(a->tmp = malloc(len + sizeof suffix))) {
			afile_clear(a);
			return err_set(CORE_ENOMEM, path, "cannot allocate file names");
		}
		memcpy(a->tmp, a->target, len);
		memcpy(a->tmp + len, suffix, sizeof suffix);
		fd = mkstemp(a->tmp);
		e = errno;
		a->kind = AFILE_NAMED;
	}
	if (fd < 0) {
		afile_clear(a);
		return io_error(path, "cannot create temporary file", e);
	}
	if (fchmod(fd, file_mode) != 0 || !(a->fp = fdopen(fd, "wb"))) {
		e = errno;
		close(fd);
		if (a->tmp)
			unlink(a->tmp);
		afile_clear(a);
		return io_error(path, "cannot open temporary file", e);
	}
	return 0;
}

int afile_write(struct afile *a, const void *buf, size_t n)
{
	if (!a->fp)
		return err_set(CORE_EUSAGE, a->path, "write to a file that is not open");
	if (a->failed)
		return err_set(CORE_EIO, a->path, "write after a failed write");
	if (n == 0)
		return 0;
	if (fwrite(buf, 1, n, a->fp) != n) {
		a->failed = 1;
		return io_error(a->path, "cannot write", errno ? errno : EIO);
	}
	a->nbytes += n;
	return 0;
}

int afile_pwrite(struct afile *a, const void *buf, size_t n, uint64_t offset)
{
	const unsigned char *p = buf;

	if (!a->fp)
		return err_set(CORE_EUSAGE, a->path, "write to a file that is not open");
	if (a->failed)
		return err_set(CORE_EIO, a->path, "write after a failed write");
	/* The stdio buffer may still hold the bytes being overwritten: push it out first, then
	 * write below it with pwrite(2), which leaves the stream's position alone. */
	if (fflush(a->fp) != 0) {
		a->failed = 1;
		return io_error(a->path, "cannot write", errno);
	}
	if (offset > (uint64_t)INT64_MAX - n)
		return err_set(CORE_EUSAGE, a->path, "write offset %llu out of range",
			       (unsigned long long)offset);
	while (n > 0) {
		ssize_t w = pwrite(fileno(a->fp), p, n, (off_t)offset);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			a->failed = 1;
			return io_error(a->path, "cannot write", w < 0 ? errno : EIO);
		}
		p += w;
		n -= (size_t)w;
		offset += (uint64_t)w;
	}
	return 0;
}

void afile_abort(struct afile *a)
{
	if (a->fp)
		fclose(a->fp);
	if (a->held)
		fclose(a->held);
	if (a->kind == AFILE_SPOOL)
		close(a->out);
	if (a->tmp)
		unlink(a->tmp);
	afile_clear(a);
}

/* fsync the directory holding path, so that a completed rename survives a crash. */
static int fsync_dir(const char *path)
{
	char *dir = dir_of(path);

	if (!dir)
		return err_set(CORE_ENOMEM, path, "cannot allocate directory name");
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int rc = 0;
	if (fd < 0) {
		rc = io_error(path, "cannot open directory to sync it", errno);
	} else {
		/* Some file systems refuse fsync on a directory (EINVAL); nothing more can be done
		 * there and the data itself is already synced. */
		if (fsync(fd) != 0 && errno != EINVAL)
			rc = io_error(path, "cannot sync directory", errno);
		close(fd);
	}
	free(dir);
	return rc;
}

/* Copy the spool to the target, which cannot seek: a FIFO, a terminal. */
static int copy_spool(struct afile *a)
{
	char buf[1 << 16];
	int in = fileno(a->fp);
	off_t at = 0;

	for (;;) {
		ssize_t got = pread(in, buf, sizeof buf, at);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0)
			return io_error(a->path, "cannot read back the spool file", errno);
		if (got == 0)
			return 0;
		at += got;
		for (ssize_t done = 0; done < got;) {
			ssize_t w = write(a->out, buf + done, (size_t)(got - done));
			if (w < 0 && errno == EINTR)
				continue;
			if (w <= 0)
				return io_error(a->path, "cannot write", w < 0 ? errno : EIO);
			done += w;
		}
	}
}

int afile_prepare(struct afile *a)
{
	FILE *fp;
	int rc;

	if (!a->path)
		return err_set(CORE_EUSAGE, NULL, "commit of a file that is not open");
	if (!a->fp)
		return 0; /* prepared already */
	if (a->failed) {
		rc = err_set(CORE_EIO, a->path, "not replaced: an earlier write failed");
		afile_abort(a);
		return rc;
	}
	if (fflush(a->fp) != 0) {
		rc = io_error(a->path, "cannot write", errno);
		goto fail;
	}
	if (a->kind == AFILE_SPOOL) {
		if ((rc = copy_spool(a)) < 0)
			goto fail;
		fclose(a->fp);
		a->fp = NULL;
		return 0;
	}
	/* A device is not synced: /dev/null refuses it, and nothing is being replaced. */
	if (a->kind != AFILE_DIRECT && fsync(fileno(a->fp)) != 0) {
		rc = io_error(a->path, "cannot sync", errno);
		goto fail;
	}
	fp = a->fp;
	a->fp = NULL;
	if (a->kind != AFILE_NAMED) { /* the descriptor is needed at commit */
		a->held = fp;
		return 0;
	}
	if (fclose(fp) != 0) {
		rc = io_error(a->path, "cannot close", errno);
		goto fail;
	}
	return 0;
fail:
	afile_abort(a);
	return rc;
}

/* Random letters for XXXXXX, from getrandom(2) or, failing that, the clock and the pid. */
static void fill_random(char *x, size_t n)
{
	static const char abc[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
	unsigned char r[16];
	struct timespec ts;

	if (n > sizeof r)
		n = sizeof r;
	if (getrandom(r, n, GRND_NONBLOCK) != (ssize_t)n) {
		clock_gettime(CLOCK_MONOTONIC, &ts);
		uint64_t v = (uint64_t)ts.tv_nsec * 0x9e3779b97f4a7c15ull ^
			     (uint64_t)getpid() << 20 ^ (uint64_t)ts.tv_sec;
		for (size_t i = 0; i < n; i++) {
			v = v * 6364136223846793005ull + 1442695040888963407ull; /* Knuth's LCG */
			r[i] = (unsigned char)(v >> 56);
		}
	}
	for (size_t i = 0; i < n; i++)
		x[i] = abc[r[i] % (sizeof abc - 1)];
}

/* Give the unnamed file of a prepared AFILE_ANON the name TARGET.tmp.XXXXXX. */
static int link_anon(struct afile *a)
{
	static const char suffix[] = ".tmp.XXXXXX";
	size_t len = strlen(a->target);
	char proc[64], *tmp = malloc(len + sizeof suffix);
	int fd = fileno(a->held), e = 0;

	if (!tmp)
		return err_set(CORE_ENOMEM, a->path, "cannot allocate file names");
	memcpy(tmp, a->target, len);
	memcpy(tmp + len, suffix, sizeof suffix);
	snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
	for (int tries = 0; tries < 100; tries++) {
		fill_random(tmp + len + sizeof suffix - 7, 6);
		/* Through /proc needs no privilege; AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH but no
		 * /proc. */
		if (linkat(AT_FDCWD, proc, AT_FDCWD, tmp, AT_SYMLINK_FOLLOW) == 0 ||
		    (errno == ENOENT && linkat(fd, "", AT_FDCWD, tmp, AT_EMPTY_PATH) == 0)) {
			a->tmp = tmp;
			return 0;
		}
		if ((e = errno) != EEXIST)
			break;
	}
	free(tmp);
	return io_error(a->path, "cannot name the temporary file", e);
}

int afile_commit(struct afile *a)
{
	int rc = afile_prepare(a);

	if (rc < 0)
		return rc;
	if (a->kind == AFILE_DIRECT || a->kind == AFILE_SPOOL) {
		FILE *held = a->held;
		int out = a->kind == AFILE_SPOOL ? a->out : -1;
		a->held = NULL;
		a->kind = AFILE_NONE;
		if ((held && fclose(held) != 0) || (out >= 0 && close(out) != 0))
			rc = io_error(a->path, "cannot close", errno);
		afile_abort(a); /* frees the names */
		return rc;
	}
	if (a->kind == AFILE_ANON) {
		if ((rc = link_anon(a)) < 0) {
			afile_abort(a);
			return rc;
		}
		FILE *held = a->held;
		a->held = NULL;
		if (fclose(held) != 0) {
			rc = io_error(a->path, "cannot close", errno);
			afile_abort(a);
			return rc;
		}
	}
	if (rename(a->tmp, a->target) != 0) {
		rc = io_error(a->path, "cannot rename temporary file into place", errno);
		afile_abort(a);
		return rc;
	}
	free(a->tmp);
	a->tmp = NULL;
	rc = fsync_dir(a->target);
	afile_abort(a); /* frees the names; nothing left to remove */
	return rc;
}

/* Read fp until EOF rather than trusting st_size: works for pipes and /proc files too. */
static int read_stream(FILE *fp, const char *path, size_t max, char **out, size_t *len)
{
	char *buf = NULL;
	size_t cap = 0, n = 0;
	int rc = 0;

	for (;;) {
		if (cap - n < 2) {
			size_t ncap = cap ? cap * 2 : 4096;
			if (ncap < cap) {
				rc = err_set(CORE_ENOMEM, path, "file too large");
				goto out;
			}
			char *nb = realloc(buf, ncap);
			if (!nb) {
				rc = err_set(CORE_ENOMEM, path, "cannot allocate %zu bytes", ncap);
				goto out;
			}
			buf = nb;
			cap = ncap;
		}
		size_t got = fread(buf + n, 1, cap - n - 1, fp);
		n += got;
		if (got == 0)
			break;
		if (max && n > max) {
			rc = err_set(CORE_EFORMAT, path, "larger than %zu bytes", max);
			goto out;
		}
	}
	if (ferror(fp)) {
		rc = io_error(path, "cannot read", errno ? errno : EIO);
		goto out;
	}
	buf[n] = '\0';
	*out = buf;
	buf = NULL;
	if (len)
		*len = n;
out:
	free(buf);
	return rc;
}

int file_read_all(const char *path, size_t max, char **out, size_t *len)
{
	*out = NULL;
	if (len)
		*len = 0;
	FILE *fp = fopen(path, "rb");
	if (!fp) {
		int e = errno;
		if (e == ENOENT)
			return err_set(CORE_ENOTFOUND, path, "no such file");
		return io_error(path, "cannot open", e);
	}
	int rc = read_stream(fp, path, max, out, len);
	fclose(fp);
	return rc;
}

int file_read_regular(const char *path, size_t max, char **out, size_t *len)
{
	int fd;

	*out = NULL;
	if (len)
		*len = 0;
	ERR_FORWARD(file_open_regular(path, &fd, NULL));
	FILE *fp = fdopen(fd, "rb");
	if (!fp) {
		int e = errno;
		close(fd);
		return io_error(path, "cannot open", e);
	}
	int rc = read_stream(fp, path, max, out, len);
	fclose(fp);
	return rc;
}

int file_write_atomic(const char *path, const void *buf, size_t n)
{
	struct afile a;

	ERR_FORWARD(afile_open(&a, path));
	int rc = afile_write(&a, buf, n);
	if (rc < 0) {
		afile_abort(&a);
		return rc;
	}
	return afile_commit(&a);
}

int file_open_regular(const char *path, int *fd, struct stat *st)
{
	struct stat sb;
	int flags;

	*fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (*fd < 0) {
		int e = errno;
		if (e == ENOENT)
			return err_set(CORE_ENOTFOUND, path, "no such file");
		return io_error(path, "cannot open", e);
	}
	if (!st)
		st = &sb;
	if (fstat(*fd, st) != 0) {
		int e = errno;
		close(*fd);
		*fd = -1;
		return io_error(path, "cannot stat", e);
	}
	if (!S_ISREG(st->st_mode)) {
		close(*fd);
		*fd = -1;
		return err_set(CORE_EIO, path, "is %s, not a regular file", type_name(st->st_mode));
	}
	if ((flags = fcntl(*fd, F_GETFL)) < 0 || fcntl(*fd, F_SETFL, flags & ~O_NONBLOCK) < 0) {
		int e = errno;
		close(*fd);
		*fd = -1;
		return io_error(path, "cannot open", e);
	}
	return 0;
}

/* ---- output folders ----------------------------------------------------------------------- */

/* mkdir of one folder that may exist already; 1 when this call made it. */
static int make_one(const char *path, const char *dir)
{
	struct stat st;

	if (mkdir(path, 0777) == 0)
		return 1;
	if (errno != EEXIST)
		return err_errno(CORE_EIO, path, "cannot create directory", errno);
	if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
		return err_set(CORE_EIO, path, strcmp(path, dir) ? "not a directory (a parent of "
			       "the output folder)" : "not a directory");
	return 0;
}

int dir_make(const char *dir, char *made, size_t made_len)
{
	char buf[PATH_MAX];
	size_t n = strlen(dir);

	if (made && made_len)
		made[0] = '\0';
	if (n == 0 || n >= sizeof buf)
		return err_set(CORE_EUSAGE, dir, "not a usable folder name");
	memcpy(buf, dir, n + 1);
	while (n > 1 && buf[n - 1] == '/')
		buf[--n] = '\0';
	/* each parent, then dir: "a/b/c" makes "a", "a/b", "a/b/c" */
	for (size_t i = 1; i <= n; i++) {
		if (i < n && buf[i] != '/')
			continue;
		if (i < n && buf[i - 1] == '/')
			continue; /* "a//b" */
		buf[i] = '\0';
		int rc = make_one(buf, dir);
		if (rc < 0)
			return rc;
		if (rc == 1 && made && made_len && !made[0])
			snprintf(made, made_len, "%s", buf);
		if (i < n)
			buf[i] = '/';
	}
	return 0;
}

void dir_unmake(const char *dir, const char *made)
{
	char buf[PATH_MAX];
	size_t n = strlen(dir), m = made ? strlen(made) : 0;

	if (m == 0 || n >= sizeof buf)
		return;
	memcpy(buf, dir, n + 1);
	while (n > 1 && buf[n - 1] == '/')
		buf[--n] = '\0';
	/* dir, then its parents, down to made; each only while it is empty */
	while (n >= m) {
		if (rmdir(buf) != 0 || n == m)
			return;
		while (n > 0 && buf[n - 1] != '/')
			n--;
		while (n > 1 && buf[n - 1] == '/')
			n--;
		buf[n] = '\0';
	}
}
