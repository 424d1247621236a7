/* SPDX-License-Identifier: GPL-2.0 */
/*
 * LD_PRELOAD shim for slurmd and slurmstepd on a hybrid cgroup host only
 * (tools/slurm_lab.sh): Slurm's cgroup/v2 plugin refuses to run when
 * /proc/self/cgroup lists cgroup v1 hierarchies beside the v2 one, although
 * it only ever uses the v2 one. This shows it the v2 line ("0::/path") alone;
 * every other open() is the real one.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int (*real_open)(const char *, int, ...);

static int v2_lines(int in)
{
	char buf[16384], *line, *save = NULL;
	ssize_t n = read(in, buf, sizeof(buf) - 1);
	int out = memfd_create("cgroup-v2", MFD_CLOEXEC);

	close(in);
	if (out < 0)
		return -1;
	buf[n > 0 ? n : 0] = '\0';
	for (line = strtok_r(buf, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (strncmp(line, "0::", 3) == 0) {
			if (write(out, line, strlen(line)) < 0 || write(out, "\n", 1) < 0)
				break;
		}
	}
	lseek(out, 0, SEEK_SET);
	return out;
}

int open(const char *path, int flags, ...)
{
	mode_t mode = 0;
	int fd;

	if (flags & (O_CREAT | O_TMPFILE)) {
		va_list ap;

		va_start(ap, flags);
		mode = va_arg(ap, int);
		va_end(ap);
	}
	if (!real_open)
		real_open = dlsym(RTLD_NEXT, "open");
	fd = real_open(path, flags, mode);
	if (fd >= 0 && strcmp(path, "/proc/self/cgroup") == 0)
		return v2_lines(fd);
	return fd;
}
