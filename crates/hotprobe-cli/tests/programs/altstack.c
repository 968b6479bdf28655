// A small alternate signal stack under an in-process trap on `tiny`
// (4 bytes: too short for a jump).
//
// onstack SIZE: installs a SIZE-byte sigaltstack, calls tiny 1000 times
// from main, and raises SIGUSR1 100 times; its SA_ONSTACK handler calls
// tiny 10 times and checks it runs on the alternate stack the program
// installed (sigaltstack's answer: SS_ONSTACK, the buffer and size given).
//
// depth: paints 64 KiB of the stack below main's frame, then measures how
// deep a signal with a trivial handler writes ("trivial"), and how deep a
// call of tiny writes ("probed"), in bytes below the painted region's top.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) int tiny(int x) { return x + 1; }

static long handler_calls, handler_sum, shown_ok = 1;
static char *buf;
static size_t size;

static void on_usr1(int sig) {
    (void)sig;
    for (int i = 0; i < 10; i++) handler_sum += tiny(i);
    handler_calls += 10;
    stack_t cur;
    sigaltstack(NULL, &cur);
    if (!(cur.ss_flags & SS_ONSTACK) || cur.ss_sp != buf || cur.ss_size != size) shown_ok = 0;
}

#define PAINT (64 * 1024)
static volatile unsigned char *low;

__attribute__((noinline)) static void paint(void) {
    volatile unsigned char region[PAINT];
    for (size_t i = 0; i < PAINT; i++) region[i] = 0xa5;
    low = region;
}

// Bytes written below the painted region's top since `paint`.
__attribute__((noinline)) static long written(void) {
    size_t i = 0;
    while (i < PAINT && low[i] == 0xa5) i++;
    return PAINT - i;
}

static void on_usr2(int sig) { (void)sig; }

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *mode = argc > 1 ? argv[1] : "onstack";
    if (!strcmp(mode, "depth")) {
        signal(SIGUSR2, on_usr2);
        paint();
        raise(SIGUSR2);
        long trivial = written();
        paint();
        volatile int r = tiny(41);
        long probed = written();
        printf("trivial=%ld probed=%ld r=%d\n", trivial, probed, r);
        return 0;
    }
    size = argc > 2 ? strtoul(argv[2], NULL, 0) : 4096;
    buf = malloc(size);
    stack_t ss = {.ss_sp = buf, .ss_size = size, .ss_flags = 0};
    if (sigaltstack(&ss, NULL)) { perror("sigaltstack"); return 1; }
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_ONSTACK;
    sigaction(SIGUSR1, &sa, NULL);
    long s = 0;
    for (int i = 0; i < 1000; i++) {
        s += tiny(i);
        if (i % 10 == 0) raise(SIGUSR1);
    }
    stack_t after;
    sigaltstack(NULL, &after);
    printf("main=1000 sum=%ld handler=%ld handler_sum=%ld shown=%ld size=%zu same=%d\n", s,
           handler_calls, handler_sum, shown_ok, size,
           after.ss_sp == buf && after.ss_size == size && !(after.ss_flags & SS_ONSTACK));
    return 0;
}
