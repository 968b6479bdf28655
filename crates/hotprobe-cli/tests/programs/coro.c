// Coroutines on makecontext/swapcontext, each on a stack of its own
// (malloc'd), scheduled round robin by main. Every call of `step` (in a
// coroutine) swaps back to main from inside it; every call of `resume`
// (in main) swaps into a coroutine from inside it: entries and exits of
// both interleave across the stacks. Prints each coroutine's sum and the
// calls made: step = NCO * ROUNDS, resume = NCO * (ROUNDS + 1) (the last
// resume of each coroutine returns when it finishes, through uc_link).
#include <stdio.h>
#include <stdlib.h>
#include <ucontext.h>

#define NCO 3
#define STACK (64 * 1024)

static ucontext_t sched, co[NCO];
static long sums[NCO];
static int done[NCO];
static long rounds;
static long steps, resumes;

__attribute__((noinline)) long step(int id, long i) {
    long v = i * (id + 1) + 3;
    steps++;
    swapcontext(&co[id], &sched);
    __asm__ volatile("" ::: "memory");
    return v;
}

static void body(int id) {
    for (long i = 0; i < rounds; i++) sums[id] += step(id, i);
    done[id] = 1;
}

__attribute__((noinline)) int resume(int id) {
    resumes++;
    swapcontext(&sched, &co[id]);
    __asm__ volatile("" ::: "memory");
    return done[id];
}

int main(int argc, char **argv) {
    rounds = argc > 1 ? atol(argv[1]) : 500;
    for (int id = 0; id < NCO; id++) {
        getcontext(&co[id]);
        co[id].uc_stack.ss_sp = malloc(STACK);
        co[id].uc_stack.ss_size = STACK;
        co[id].uc_link = &sched;
        makecontext(&co[id], (void (*)(void))body, 1, id);
    }
    int left = NCO;
    while (left > 0)
        for (int id = 0; id < NCO; id++)
            if (!done[id] && resume(id)) left--;
    for (int id = 0; id < NCO; id++) printf("co%d sum=%ld\n", id, sums[id]);
    printf("step=%ld resume=%ld\n", steps, resumes);
    return 0;
}
