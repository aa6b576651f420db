/* Compiled with frame pointers (tests/unit/test_native.py): the rows must follow push %rbp and
   mov %rsp,%rbp. */
extern int sink(int *);
int framed(int n) {
  int a[64];
  for (int i = 0; i < 64; i++) a[i] = n + i;
  return sink(a) + a[n & 63];
}
