/* Forks K children; child i names itself "aggkid<i>" (prctl PR_SET_NAME)
 * and calls malloc 2 * (i + 1) times; the parent calls it 3 times after
 * they are gone. Each logs "COMM name calls" (write(2)): the aggregation
 * tests compare `count -f --by comm` with it. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

static void say(const char *name, int calls) {
    char line[64];
    int n = snprintf(line, sizeof line, "COMM %s %d\n", name, calls);
    if (write(1, line, (size_t)n) != n)
        _exit(3);
}

int main(int argc, char **argv) {
    int k = argc > 1 ? atoi(argv[1]) : 3;
    for (int i = 0; i < k; i++) {
        pid_t pid = fork();
        if (pid < 0)
            return 1;
        if (pid == 0) {
            char name[16];
            snprintf(name, sizeof name, "aggkid%d", i);
            prctl(PR_SET_NAME, name, 0, 0, 0);
            int calls = 2 * (i + 1);
            for (int j = 0; j < calls; j++)
                free(malloc(32));
            say(name, calls);
            _exit(0);
        }
        if (waitpid(pid, NULL, 0) != pid)
            return 1;
    }
    char self[16] = {0};
    prctl(PR_GET_NAME, self, 0, 0, 0);
    for (int j = 0; j < 3; j++)
        free(malloc(64));
    say(self, 3);
    return 0;
}
