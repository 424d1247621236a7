// SPDX-License-Identifier: GPL-2.0
/*
 * A process that drives a libcuda (the stand-in, or any with these names)
 * with calls whose counts and sizes the caller chose, for tests and the
 * bench: bench/cuda_standin.py writes the commands and computes the truth.
 *
 *   cuda_workload LIBRARY
 *
 * Loads LIBRARY with dlopen (so it shows in /proc/PID/maps by that path),
 * prints "ready", then reads commands from stdin, one a line:
 *
 *   call NAME COUNT A0 A1 A2 A3 A4 A5   call NAME COUNT times with these six
 *       register arguments (x86-64: every integer or pointer argument is a
 *       register; extra ones are ignored by the callee). An argument "&K"
 *       is the address of slot K (where an allocation writes its device
 *       pointer); "*K" is the value in slot K (the pointer to free).
 *       Prints "ok FAILED" (calls that returned non-zero) or "absent".
 *   bench NAME N ROUNDS   ROUNDS rounds of N calls; prints each round's ns per call
 *   quit
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef unsigned long long u64;
typedef int (*api_fn)(u64, u64, u64, u64, u64, u64);

#define SLOTS 64
static u64 slots[SLOTS];

static u64 arg_value(const char *s)
{
	if (s[0] == '&')
		return (u64)&slots[atoi(s + 1) % SLOTS];
	if (s[0] == '*')
		return slots[atoi(s + 1) % SLOTS];
	return strtoull(s, NULL, 0);
}

static u64 now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (u64)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

static void do_call(void *lib, char *rest)
{
	char name[128], a[6][32];
	long count, failed = 0;
	api_fn fn;
	u64 v[6];

	if (sscanf(rest, "%127s %ld %31s %31s %31s %31s %31s %31s", name, &count, a[0], a[1],
		   a[2], a[3], a[4], a[5]) != 8) {
		printf("error bad call line\n");
		return;
	}
	fn = (api_fn)dlsym(lib, name);
	if (!fn) {
		printf("absent\n");
		return;
	}
	for (long i = 0; i < count; i++) {
		for (int j = 0; j < 6; j++)
			v[j] = arg_value(a[j]);
		failed += fn(v[0], v[1], v[2], v[3], v[4], v[5]) != 0;
	}
	printf("ok %ld\n", failed);
}

static void do_bench(void *lib, char *rest)
{
	char name[128];
	long n, rounds;
	api_fn fn;

	if (sscanf(rest, "%127s %ld %ld", name, &n, &rounds) != 3 || n <= 0) {
		printf("error bad bench line\n");
		return;
	}
	fn = (api_fn)dlsym(lib, name);
	if (!fn) {
		printf("absent\n");
		return;
	}
	printf("ns");
	for (long r = 0; r < rounds; r++) {
		u64 t0 = now_ns();

		for (long i = 0; i < n; i++)
			fn(1, 1, 1, 1, 1, 1);
		printf(" %.1f", (double)(now_ns() - t0) / n);
	}
	printf("\n");
}

int main(int argc, char **argv)
{
	char line[512];
	void *lib;

	if (argc != 2) {
		fprintf(stderr, "usage: %s LIBRARY\n", argv[0]);
		return 2;
	}
	lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
		return 1;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("ready\n");
	while (fgets(line, sizeof(line), stdin)) {
		if (!strncmp(line, "call ", 5))
			do_call(lib, line + 5);
		else if (!strncmp(line, "bench ", 6))
			do_bench(lib, line + 6);
		else if (!strncmp(line, "quit", 4))
			break;
		else
			printf("error unknown command\n");
	}
	return 0;
}
