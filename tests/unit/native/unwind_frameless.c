/* Compiled without frame pointers (tests/unit/test_native.py): the rows must follow the stack
   pointer's moves. main must be marked as the walk's last frame. */
extern int framed(int);
__attribute__((noinline)) int sink(int *a) { return a[3]; }
int frameless(int n) {
  int a[64];
  for (int i = 0; i < 64; i++) a[i] = n * i;
  return sink(a) + a[n & 63];
}
int main(int argc, char **argv) {
  (void)argv;
  return framed(argc) + frameless(argc);
}
