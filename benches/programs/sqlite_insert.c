/* The SQLite workload of issue 14: an in-memory database, N rows inserted
 * through one prepared statement in one transaction, then read back. Linked
 * with SQLite's amalgamation (sqlite3.c) built like this file. Prints a
 * digest of the table so a run under a tracer can be checked unchanged. */
#include <stdio.h>
#include <stdlib.h>
#include "sqlite3.h"

static void check(int rc, sqlite3 *db, const char *what) {
    if (rc != SQLITE_OK && rc != SQLITE_DONE && rc != SQLITE_ROW) {
        fprintf(stderr, "%s: %s\n", what, sqlite3_errmsg(db));
        exit(1);
    }
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 200000;
    sqlite3 *db;
    sqlite3_stmt *ins, *sel;
    check(sqlite3_open(":memory:", &db), db, "open");
    check(sqlite3_exec(db, "CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, v REAL)", 0, 0, 0),
          db, "create");
    check(sqlite3_exec(db, "BEGIN", 0, 0, 0), db, "begin");
    check(sqlite3_prepare_v2(db, "INSERT INTO t(name, v) VALUES(?1, ?2)", -1, &ins, 0), db,
          "prepare insert");
    char name[32];
    for (long i = 0; i < n; i++) {
        snprintf(name, sizeof name, "row-%ld", i * 7919 % 100003);
        check(sqlite3_bind_text(ins, 1, name, -1, SQLITE_TRANSIENT), db, "bind");
        check(sqlite3_bind_double(ins, 2, (double)(i % 1000) / 8.0), db, "bind");
        check(sqlite3_step(ins), db, "insert");
        check(sqlite3_reset(ins), db, "reset");
    }
    check(sqlite3_finalize(ins), db, "finalize");
    check(sqlite3_exec(db, "COMMIT", 0, 0, 0), db, "commit");
    check(sqlite3_prepare_v2(db, "SELECT count(*), sum(v), max(name) FROM t", -1, &sel, 0), db,
          "prepare select");
    check(sqlite3_step(sel), db, "select");
    printf("%lld rows, sum %.3f, max %s\n", sqlite3_column_int64(sel, 0),
           sqlite3_column_double(sel, 1), (const char *)sqlite3_column_text(sel, 2));
    sqlite3_finalize(sel);
    sqlite3_close(db);
    return 0;
}
