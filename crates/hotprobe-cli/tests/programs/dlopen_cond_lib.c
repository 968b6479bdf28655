/* The library dlopen_cond.c loads: scale(n, weight), its parameters
 * named in `count` conditions. */
static volatile long total;

__attribute__((noinline)) long scale(int n, long weight) {
    total += weight;
    return (long)n * weight + total;
}
