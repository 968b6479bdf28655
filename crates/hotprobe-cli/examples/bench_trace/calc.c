/* A real nested workload: an expression tokenizer, recursive-descent
   parser and tree evaluator run over N pseudo-random expressions.
   Usage: calc N   prints "<ns> ns/expr n=N sum=S" */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { NUM, ADD, SUB, MUL, DIV, LP, RP, END };
struct tok { int kind; long val; };
struct node { int op; long val; struct node *l, *r; };

static unsigned long rng = 88172645463325252UL;
__attribute__((noinline)) unsigned long next_rand(void) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

static char buf[4096];
static int pos;
__attribute__((noinline)) void emit(char c) { if (pos < (int)sizeof buf - 1) buf[pos++] = c; }
__attribute__((noinline)) void gen_number(void) {
    unsigned long v = next_rand() % 1000 + 1;
    char d[8]; int n = 0;
    do { d[n++] = '0' + v % 10; v /= 10; } while (v);
    while (n) emit(d[--n]);
}
__attribute__((noinline)) void gen(int depth) {
    if (depth == 0 || next_rand() % 3 == 0) { gen_number(); return; }
    int paren = next_rand() % 2;
    if (paren) emit('(');
    gen(depth - 1);
    emit("+-*/"[next_rand() % 4]);
    gen(depth - 1);
    if (paren) emit(')');
}

static struct tok toks[2048];
static int ntok, cur;
__attribute__((noinline)) int is_digit(char c) { return c >= '0' && c <= '9'; }
__attribute__((noinline)) void add_tok(int kind, long val) { toks[ntok].kind = kind; toks[ntok].val = val; ntok++; }
__attribute__((noinline)) void tokenize(const char *s) {
    ntok = 0;
    while (*s) {
        if (is_digit(*s)) {
            long v = 0;
            while (is_digit(*s)) v = v * 10 + (*s++ - '0');
            add_tok(NUM, v);
            continue;
        }
        switch (*s++) {
        case '+': add_tok(ADD, 0); break;
        case '-': add_tok(SUB, 0); break;
        case '*': add_tok(MUL, 0); break;
        case '/': add_tok(DIV, 0); break;
        case '(': add_tok(LP, 0); break;
        case ')': add_tok(RP, 0); break;
        }
    }
    add_tok(END, 0);
}

static struct node pool[2048];
static int npool;
__attribute__((noinline)) struct node *mk(int op, long val, struct node *l, struct node *r) {
    struct node *n = &pool[npool++];
    n->op = op; n->val = val; n->l = l; n->r = r;
    return n;
}
__attribute__((noinline)) int peek(void) { return toks[cur].kind; }
struct node *expr(void);
__attribute__((noinline)) struct node *factor(void) {
    if (peek() == LP) { cur++; struct node *e = expr(); cur++; return e; }
    struct node *n = mk(NUM, toks[cur].val, 0, 0);
    cur++;
    return n;
}
__attribute__((noinline)) struct node *term(void) {
    struct node *l = factor();
    while (peek() == MUL || peek() == DIV) { int op = toks[cur++].kind; l = mk(op, 0, l, factor()); }
    return l;
}
__attribute__((noinline)) struct node *expr(void) {
    struct node *l = term();
    while (peek() == ADD || peek() == SUB) { int op = toks[cur++].kind; l = mk(op, 0, l, term()); }
    return l;
}
__attribute__((noinline)) long eval(struct node *n) {
    switch (n->op) {
    case NUM: return n->val;
    case ADD: return eval(n->l) + eval(n->r);
    case SUB: return eval(n->l) - eval(n->r);
    case MUL: return eval(n->l) * eval(n->r) % 1000003;
    default: { long d = eval(n->r); return d ? eval(n->l) / d : 0; }
    }
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 20000;
    long sum = 0;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < n; i++) {
        pos = 0; gen(5); buf[pos] = 0;
        tokenize(buf);
        cur = 0; npool = 0;
        sum += eval(expr());
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (double)n;
    printf("%.3f ns/expr n=%ld sum=%ld\n", ns, n, sum);
    return 0;
}
