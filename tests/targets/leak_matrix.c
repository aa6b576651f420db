/* valgrind's nine pointer-chain cases (after memcheck/tests/leak-cases.c), written here: a root
 * pointer p, heap blocks A and B, start pointers (->) and interior pointers (-?>), each case
 * from its own function caseN and with blocks of its own size (8 * (N + 2) bytes, so that
 * p + 1 still points inside). valgrind's verdicts:
 *   1  p -> A             A reachable
 *   2  p -> A -> B        both reachable
 *   3       A             A definitely lost
 *   4       A -> B        A definitely, B indirectly lost
 *   5  p -?> A            A possibly lost
 *   6  p -> A -?> B       A reachable, B possibly lost
 *   7  p -?> A -> B       both possibly lost
 *   8  p -?> A -?> B      both possibly lost
 *   9       A -?> B       A definitely, B indirectly lost
 * "all" makes them all (the roots are globals), then says done. */
#include "harness.h"

typedef struct Node { struct Node* next; } Node;

static Node* p1; static Node* p2; static Node* p5; static Node* p6;
static Node* p7; static Node* p8; static Node* volatile p9;

NOINLINE static Node* mk(size_t size, Node* next) {
  Node* x = calloc(1, size);
  x->next = next;
  return x;
}

#define SIZE(n) (8 * ((n) + 2))
NOINLINE static void case1(void) { p1 = mk(SIZE(1), NULL); }
NOINLINE static void case2(void) { p2 = mk(SIZE(2), mk(SIZE(2), NULL)); }
NOINLINE static void case3(void) { (void)mk(SIZE(3), NULL); }
NOINLINE static void case4(void) { (void)mk(SIZE(4), mk(SIZE(4), NULL)); }
NOINLINE static void case5(void) { p5 = mk(SIZE(5), NULL) + 1; }
NOINLINE static void case6(void) { p6 = mk(SIZE(6), mk(SIZE(6), NULL)); p6->next++; }
NOINLINE static void case7(void) { p7 = mk(SIZE(7), mk(SIZE(7), NULL)) + 1; }
NOINLINE static void case8(void) {
  p8 = mk(SIZE(8), mk(SIZE(8), NULL));
  p8->next++;
  p8++;
}
NOINLINE static void case9(void) {
  p9 = mk(SIZE(9), mk(SIZE(9), NULL));
  p9->next++;
  p9 = NULL;
}

int main(void) {
  char cmd[64];
  harness_ready();
  while (harness_next(cmd, sizeof cmd)) {
    if (!strcmp(cmd, "all")) {
      case1(); case2(); case3(); case4(); case5(); case6(); case7(); case8(); case9();
      harness_scrub();
    }
    harness_done();
  }
  return 0;
}
