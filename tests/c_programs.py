"""C programs that more than one test module builds with gcc."""

# A SIGUSR1 handler that spins, raised from outer(): its samples lie above
# a signal frame (the sigreturn trampoline's CFI leads back to the raise).
# argv[1]: the handler's rounds.
SIGNAL_C = r"""
#include <signal.h>
#include <stdlib.h>
volatile unsigned long sink;
static long rounds;
__attribute__((noinline)) void handler_spin(void) { for (long i = 0; i < rounds; i++) sink += i; }
__attribute__((noinline)) void on_signal(int sig) { handler_spin(); sink += sig; }
__attribute__((noinline)) void outer(void) { raise(SIGUSR1); sink++; }
int main(int argc, char **argv)
{
    rounds = atol(argv[1]);
    signal(SIGUSR1, on_signal);
    outer();
    return 0;
}
"""
