/* A program that installs a seccomp filter (allowing every system call)
 * through libc's prctl, then calls slen() with known strings: typed
 * values copied in the target stop reading memory through a system call
 * once a filter is in place (a filter may kill on process_vm_readv): a
 * literal of the program's image is still copied, a heap string is not;
 * the program runs on unchanged.  Logs "CALL slen("s") = n".  With argument "wait": prints
 * "ready" once filtered and waits for a line on stdin first (a tracer
 * attaches to it then). */
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>

__attribute__((noinline)) int slen(const char *s) { return (int)strlen(s); }

int main(int argc, char **argv) {
    printf("CALL slen(\"before\") = %d\n", slen("before"));
    struct sock_filter allow[] = {BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)};
    struct sock_fprog prog = {1, allow};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0) {
        perror("seccomp");
        return 1;
    }
    if (argc > 1 && strcmp(argv[1], "wait") == 0) {
        char line[16];
        printf("ready\n");
        fflush(stdout);
        if (!fgets(line, sizeof line, stdin))
            return 2;
    }
    printf("CALL slen(\"after\") = %d\n", slen("after"));
    char *heap = strdup("on the heap");
    printf("CALL slen(\"%s\") = %d\n", heap, slen(heap));
    free(heap);
    return 5;
}
