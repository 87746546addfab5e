/* atomicio.c - crash-safe output files: temporary name, fsync, rename, fsync of the directory.
 *
 * Why each step: the temporary file lives in the target's directory because rename(2) is
 * atomic only within one file system; fsync before rename so that the name never points at
 * blocks that were not yet written (ext4 delalloc and friends); fsync of the directory after
 * rename so that the new name itself survives a power cut. After afile_commit() or
 * afile_abort() the struct holds nothing, so calling afile_abort() again (a cleanup path that
 * runs on every exit) is harmless.
 */
#include "io/atomicio.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <threads.h>
#include <unistd.h>

#include "common/err.h"
#include "common/banned.h"

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

int afile_open(struct afile *a, const char *path)
{
	static const char suffix[] = ".tmp.XXXXXX";
	size_t len = strlen(path);

	memset(a, 0, sizeof *a);
	if (len == 0)
		return err_set(CORE_EUSAGE, NULL, "empty output file name");
	call_once(&file_mode_once, read_umask);
	a->path = malloc(len + 1);
	a->tmp = malloc(len + sizeof suffix);
	if (!a->path || !a->tmp) {
		free(a->path);
		free(a->tmp);
		memset(a, 0, sizeof *a);
		return err_set(CORE_ENOMEM, path, "cannot allocate file names");
	}
	memcpy(a->path, path, len + 1);
	memcpy(a->tmp, path, len);
	memcpy(a->tmp + len, suffix, sizeof suffix);

	int fd = mkstemp(a->tmp);
	if (fd < 0) {
		int e = errno;
		free(a->path);
		free(a->tmp);
		memset(a, 0, sizeof *a);
		return io_error(path, "cannot create temporary file", e);
	}
	if (fchmod(fd, file_mode) != 0 || !(a->fp = fdopen(fd, "wb"))) {
		int e = errno;
		close(fd);
		unlink(a->tmp);
		free(a->path);
		free(a->tmp);
		memset(a, 0, sizeof *a);
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
	if (a->tmp)
		unlink(a->tmp);
	free(a->tmp);
	free(a->path);
	memset(a, 0, sizeof *a);
}

/* fsync the directory holding path, so that a completed rename survives a crash. */
static int fsync_dir(const char *path)
{
	const char *slash = strrchr(path, '/');
	char *dir;

	if (!slash) {
		dir = strdup(".");
	} else {
		size_t n = slash == path ? 1 : (size_t)(slash - path);
		dir = strndup(path, n);
	}
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

int afile_prepare(struct afile *a)
{
	FILE *fp;
	int rc;

	if (!a->tmp)
		return err_set(CORE_EUSAGE, a->path, "commit of a file that is not open");
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
	if (fsync(fileno(a->fp)) != 0) {
		rc = io_error(a->path, "cannot sync", errno);
		goto fail;
	}
	fp = a->fp;
	a->fp = NULL;
	if (fclose(fp) != 0) {
		rc = io_error(a->path, "cannot close", errno);
		goto fail;
	}
	return 0;
fail:
	afile_abort(a);
	return rc;
}

int afile_commit(struct afile *a)
{
	int rc = afile_prepare(a);

	if (rc < 0)
		return rc;
	if (rename(a->tmp, a->path) != 0) {
		rc = io_error(a->path, "cannot rename temporary file into place", errno);
		afile_abort(a);
		return rc;
	}
	free(a->tmp);
	a->tmp = NULL;
	rc = fsync_dir(a->path);
	afile_abort(a); /* frees the names; nothing left to remove */
	return rc;
}

int file_read_all(const char *path, size_t max, char **out, size_t *len)
{
	char *buf = NULL;
	size_t cap = 0, n = 0;
	int rc = 0;

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
	/* Read until EOF rather than trusting st_size: works for pipes and /proc files too. */
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
