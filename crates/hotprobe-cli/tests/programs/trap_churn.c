/* Thread churn on a ptrace trap (tests/trap_churn.rs): OLD long-lived
 * threads each call probed() CALLS_OLD times while main keeps starting
 * waves of WAVE short threads that call it CALLS_NEW times each, until
 * every old thread is done (at least MIN_WAVES waves). Waves end
 * only once the old threads are through: an old thread starved by the
 * tracer keeps the churn going. Prints the number of waves and the sum
 * of probed()'s results, which the test checks against the counts. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>

enum { OLD = 4, CALLS_OLD = 1500, WAVE = 8, CALLS_NEW = 40, MIN_WAVES = 3, MAX_WAVES = 2000 };

static atomic_int old_done;
static atomic_long total;

__attribute__((noinline)) long probed(long x) {
    __asm__ volatile("" ::: "memory");
    return x * 3 + 1;
}

static void *old_thread(void *arg) {
    long id = (long)arg, sum = 0;
    for (long i = 0; i < CALLS_OLD; i++)
        sum += probed(id + i);
    atomic_fetch_add(&total, sum);
    atomic_fetch_add(&old_done, 1);
    return NULL;
}

static void *new_thread(void *arg) {
    long id = (long)arg, sum = 0;
    for (long i = 0; i < CALLS_NEW; i++)
        sum += probed(id - i);
    atomic_fetch_add(&total, sum);
    return NULL;
}

int main(void) {
    pthread_t old[OLD], wave[WAVE];
    for (long i = 0; i < OLD; i++)
        if (pthread_create(&old[i], NULL, old_thread, (void *)(i * 100000)))
            return 2;
    int waves = 0;
    while (waves < MAX_WAVES && (waves < MIN_WAVES || atomic_load(&old_done) < OLD)) {
        for (long i = 0; i < WAVE; i++)
            if (pthread_create(&wave[i], NULL, new_thread, (void *)(waves * 1000 + i)))
                return 2;
        for (int i = 0; i < WAVE; i++)
            pthread_join(wave[i], NULL);
        waves++;
    }
    for (int i = 0; i < OLD; i++)
        pthread_join(old[i], NULL);
    printf("waves %d\n", waves);
    printf("calls %ld\n", (long)OLD * CALLS_OLD + (long)waves * WAVE * CALLS_NEW);
    printf("sum %ld\n", atomic_load(&total));
    return waves < MAX_WAVES ? 0 : 3;
}
