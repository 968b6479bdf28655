/* A program whose time goes into libraries: zlib's compress2 (from
 * do_compress) and SQLite's sqlite3_exec (from do_sql), with a callback
 * of the program (row_cb) entered from SQLite that calls back into zlib
 * (compressBound), zlib's compress (a tail call into compress2, through
 * zlib's own PLT) from do_tail, and a function only a trap can take (twice:
 * its own loop jumps back into the bytes a jump probe would move).
 * It prints how many calls it made, for the tests to compare with the
 * trace.
 *   libcalls COMPRESSES QUERIES TWICES
 */
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <zlib.h>

/* 2 * x, by a loop whose branch lands at +4, inside the first 7 bytes
 * (xor, xor, add) a jump would move. */
long twice(long x);
__asm__(".text\n"
        ".globl twice\n"
        ".type twice, @function\n"
        "twice:\n"
        "  xor %eax, %eax\n"
        "  xor %ecx, %ecx\n"
        "1:\n"
        "  add %rdi, %rax\n"
        "  inc %ecx\n"
        "  cmp $2, %ecx\n"
        "  jne 1b\n"
        "  ret\n"
        ".size twice, .-twice\n");

static unsigned char src[1 << 16], dst[(1 << 16) + 1024];
static int compresses, execs, rows, bounds, tails;

__attribute__((noinline)) int do_compress(int n) {
    for (size_t i = 0; i < sizeof src; i++)
        src[i] = (unsigned char)((i * 7 + (i >> 5)) ^ n);
    int ok = 0;
    for (int i = 0; i < n; i++) {
        uLongf len = sizeof dst;
        compresses++;
        if (compress2(dst, &len, src, sizeof src, 6) == Z_OK)
            ok++;
    }
    return ok;
}

__attribute__((noinline)) int do_tail(void) {
    uLongf len = sizeof dst;
    tails++;
    return compress(dst, &len, src, 4096) == Z_OK;
}

__attribute__((noinline)) int row_cb(void *u, int argc, char **argv, char **cols) {
    (void)u, (void)cols;
    rows++;
    bounds++;
    return argc == 1 && compressBound(strtoul(argv[0], 0, 10)) > 0 ? 0 : 1;
}

__attribute__((noinline)) int do_sql(sqlite3 *db, int n) {
    int ok = 0;
    for (int i = 0; i < n; i++) {
        execs++;
        if (sqlite3_exec(db, "SELECT count(*) FROM t WHERE x % 3 = 1", row_cb, 0, 0) == SQLITE_OK)
            ok++;
    }
    return ok;
}

int main(int argc, char **argv) {
    int nc = argc > 1 ? atoi(argv[1]) : 5;
    int ns = argc > 2 ? atoi(argv[2]) : 4;
    int nt = argc > 3 ? atoi(argv[3]) : 3;
    setvbuf(stdout, NULL, _IOLBF, 0);
    int c = do_compress(nc);
    int tail = do_tail();
    sqlite3 *db;
    if (sqlite3_open(":memory:", &db) != SQLITE_OK)
        return 2;
    /* Not through sqlite3_exec: the trace's sqlite3_exec calls are do_sql's. */
    sqlite3_stmt *st;
    const char *sql[] = {
        "CREATE TABLE t(x)",
        "WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 20000) "
        "INSERT INTO t SELECT i FROM c",
    };
    for (int i = 0; i < 2; i++) {
        if (sqlite3_prepare_v2(db, sql[i], -1, &st, 0) != SQLITE_OK || sqlite3_step(st) != SQLITE_DONE)
            return 3;
        sqlite3_finalize(st);
    }
    int s = do_sql(db, ns);
    sqlite3_close(db);
    long t = 0;
    for (int i = 0; i < nt; i++)
        t += twice(i);
    printf("compress2 %d ok %d\n", compresses, c);
    printf("sqlite3_exec %d ok %d\n", execs, s);
    printf("row_cb %d compressBound %d\n", rows, bounds);
    printf("twice %d sum %ld\n", nt, t);
    printf("compress %d ok %d\n", tails, tail);
    return 0;
}
