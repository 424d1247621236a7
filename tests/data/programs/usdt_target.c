// A program with USDT probes (<sys/sdt.h>): after one line on stdin it fires
// gfxtest:tick N times (N from argv), and gfxtest:gated each time its
// semaphore is raised (by an attached tracer), then prints how often gated
// fired and exits.
#define _SDT_HAS_SEMAPHORES 1
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>

// The semaphores dtrace -G would generate; the kernel increments them while
// a uprobe with their ref_ctr_offset is attached.
unsigned short gfxtest_tick_semaphore __attribute__((section(".probes"))) = 0;
unsigned short gfxtest_gated_semaphore __attribute__((section(".probes"))) = 0;

int main(int argc, char **argv)
{
	char line[16];
	int n = argc > 1 ? atoi(argv[1]) : 1;
	int gated = 0;
	volatile long minus_seven = -7;

	printf("ready\n");
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	for (int i = 1; i <= n; i++) {
		STAP_PROBE2(gfxtest, tick, i, minus_seven);
		if (*(volatile unsigned short *)&gfxtest_gated_semaphore) {
			STAP_PROBE1(gfxtest, gated, i);
			gated++;
		}
	}
	printf("done %d\n", gated);
	return 0;
}
