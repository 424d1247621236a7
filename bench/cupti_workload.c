// SPDX-License-Identifier: GPL-2.0
/*
 * Drives the stand-in CUPTI (gpu/cupti/standin.c) with known kernels: what
 * the CUDA driver would do at cuInit (load CUDA_INJECTION64_PATH), then, per
 * line on stdin, launches from two call sites with known device times:
 *
 *   a N      N launches of "gemm" (GFX_NS_GEMM ns each) from launch_a
 *   b N      N launches of "gemm" from launch_b, and N of "relu" (GFX_NS_RELU)
 *   copy N   N host-to-device copies of 4096 bytes (GFX_NS_COPY ns each)
 *   stats    prints "records R launches L collecting C" (the injection library's counters)
 *
 * Each command answers "ok" once done (after waiting for the library's next
 * poll, so the records reached the probes).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GFX_NS_GEMM 250000ull
#define GFX_NS_RELU 40000ull
#define GFX_NS_COPY 7000ull

unsigned gfx_standin_launch(const char *name, unsigned long long ns, int grid, int block);
unsigned gfx_standin_memcpy(unsigned long long bytes, unsigned kind, unsigned long long ns);
int gfx_standin_init(void);

static unsigned long long (*records)(void);
static unsigned long long (*launches)(void);
static int (*collecting)(void);
static void (*poll_now)(void);

__attribute__((noinline)) void launch_a(int n)
{
	for (int i = 0; i < n; i++)
		gfx_standin_launch("gemm", GFX_NS_GEMM, 128, 256);
}

__attribute__((noinline)) void launch_b(int n)
{
	for (int i = 0; i < n; i++) {
		gfx_standin_launch("gemm", GFX_NS_GEMM, 64, 128);
		gfx_standin_launch("relu", GFX_NS_RELU, 32, 1024);
	}
}

static void *symbol(void *lib, const char *name)
{
	void *p = dlsym(lib, name);

	if (!p) {
		fprintf(stderr, "cupti_workload: %s: %s\n", name, dlerror());
		exit(1);
	}
	return p;
}

int main(void)
{
	const char *path = getenv("CUDA_INJECTION64_PATH");
	char line[64];
	void *lib;

	if (!path || gfx_standin_init() != 1)
		return 1;
	lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
	if (!lib)
		return 1;
	records = symbol(lib, "gfx_cupti_records");
	launches = symbol(lib, "gfx_cupti_launches");
	collecting = symbol(lib, "gfx_cupti_collecting");
	poll_now = symbol(lib, "gfx_cupti_poll");
	printf("ready\n");
	fflush(stdout);
	while (fgets(line, sizeof(line), stdin)) {
		int n = 0;

		if (sscanf(line, "a %d", &n) == 1)
			launch_a(n);
		else if (sscanf(line, "b %d", &n) == 1)
			launch_b(n);
		else if (sscanf(line, "copy %d", &n) == 1)
			for (int i = 0; i < n; i++)
				gfx_standin_memcpy(4096, 1, GFX_NS_COPY);
		else if (strncmp(line, "stats", 5) == 0)
			printf("records %llu launches %llu collecting %d\n", records(), launches(),
			       collecting());
		poll_now();  /* hand what is done to the probes now, as the next tick would */
		printf("ok\n");
		fflush(stdout);
	}
	return 0;
}
