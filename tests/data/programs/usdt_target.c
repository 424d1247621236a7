// A program with a USDT probe (<sys/sdt.h>): after one line on stdin it fires
// gfxtest:tick N times (N from argv), then prints "done" and exits.
#include <stdio.h>
#include <stdlib.h>
#include <sys/sdt.h>

int main(int argc, char **argv)
{
	char line[16];
	int n = argc > 1 ? atoi(argv[1]) : 1;
	volatile long minus_seven = -7;

	printf("ready\n");
	fflush(stdout);
	if (!fgets(line, sizeof(line), stdin))
		return 1;
	for (int i = 1; i <= n; i++)
		STAP_PROBE2(gfxtest, tick, i, minus_seven);
	printf("done\n");
	return 0;
}
