/* Recursion, several functions, a tail call, output that depends on all. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int depth_max;

int fib(int n) { return n < 2 ? n : fib(n - 1) + fib(n - 2); }

int ackermann(int m, int n, int depth)
{
    if (depth > depth_max)
        depth_max = depth;
    if (m == 0)
        return n + 1;
    if (n == 0)
        return ackermann(m - 1, 1, depth + 1);
    return ackermann(m - 1, ackermann(m, n - 1, depth + 1), depth + 1);
}

void report(const char *what, long v) { printf("%s = %ld\n", what, v); }

static int cmp(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

double mean(const int *v, int n)
{
    double s = 0;
    for (int i = 0; i < n; i++)
        s += v[i];
    return s / n;
}

int main(int argc, char **argv)
{
    int v[] = {9, 3, 7, 1, 8, 2, 6};
    qsort(v, 7, sizeof v[0], cmp);
    for (int i = 0; i < 7; i++)
        printf("%d ", v[i]);
    printf("\n");
    report("fib(20)", fib(20));
    report("ack(2,3)", ackermann(2, 3, 0));
    report("depth", depth_max);
    printf("mean %.3f argc %d %s\n", mean(v, 7), argc, argc > 1 ? argv[1] : "-");
    return 0;
}
