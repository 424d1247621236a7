// SPDX-License-Identifier: GPL-2.0
/*
 * The events bench/ measures, made at a known rate by one process.
 *
 *   workload [--gate] getppid N   N getppid() system calls
 *   workload [--gate] fork N      N fork()s (clone) of a child that exits at once
 *   workload [--gate] exec N      N fork()s + execs of /bin/true
 *   workload [--gate] comms N     N forks, each under a new command name
 *                                 (gfxb00000, gfxb00001, ...): N clonecount keys
 *
 * --gate: wait for one byte on stdin before starting, so a tracer filtering
 * on this pid can attach first. Prints one JSON line on stdout:
 * {"start": <CLOCK_MONOTONIC s>, "elapsed": <s>, "n": N}.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void fork_one(int do_exec)
{
	pid_t pid = fork();

	if (pid < 0) {
		perror("workload: fork");
		exit(1);
	}
	if (pid == 0) {
		if (do_exec)
			execl("/bin/true", "true", (char *)NULL);
		_exit(0);
	}
	waitpid(pid, NULL, 0);
}

int main(int argc, char **argv)
{
	int gate = argc > 1 && strcmp(argv[1], "--gate") == 0;
	const char *what;
	long n, i;
	double t0;
	char c;

	if (argc != 3 + gate) {
		fprintf(stderr, "usage: workload [--gate] getppid|fork|exec|comms N\n");
		return 2;
	}
	what = argv[1 + gate];
	n = atol(argv[2 + gate]);
	if (gate && read(0, &c, 1) != 1)
		return 1;
	t0 = now();
	if (strcmp(what, "getppid") == 0) {
		for (i = 0; i < n; i++)
			syscall(SYS_getppid); /* not the libc wrapper: nothing cached */
	} else if (strcmp(what, "fork") == 0) {
		for (i = 0; i < n; i++)
			fork_one(0);
	} else if (strcmp(what, "exec") == 0) {
		for (i = 0; i < n; i++)
			fork_one(1);
	} else if (strcmp(what, "comms") == 0) {
		char name[16];

		for (i = 0; i < n; i++) {
			snprintf(name, sizeof(name), "gfxb%05d", (int)(i % 100000));
			prctl(PR_SET_NAME, name, 0, 0, 0);
			fork_one(0);
		}
	} else {
		fprintf(stderr, "workload: unknown workload %s\n", what);
		return 2;
	}
	printf("{\"start\": %.6f, \"elapsed\": %.6f, \"n\": %ld}\n", t0, now() - t0, n);
	return 0;
}
