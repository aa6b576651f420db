// A child that grew its heap after fork(): the kernel cannot merge the brk's growth into the
// [heap] it inherited (that VMA's anon_vma is shared with the parent), so /proc/PID/maps shows
// the heap as two mappings side by side, as in every PostgreSQL backend.
// Prints "child PID" once the child holds 3000 blocks of 1000 bytes; both wait on stdin.
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(void) {
  static void* keep[3000];
  for (int i = 0; i < 100; i++) keep[i] = malloc(1000);  // the parent's heap, before fork
  int ready[2];
  if (pipe(ready) != 0) return 1;
  pid_t pid = fork();
  if (pid == 0) {
    for (int i = 100; i < 3000; i++) keep[i] = malloc(1000);  // 2.8 MB more: brk grows
    write(ready[1], "x", 1);
    char c;
    read(0, &c, 1);  // until the test ends
    _exit(0);
  }
  char c;
  read(ready[0], &c, 1);
  printf("child %d\n", (int)pid);
  fflush(stdout);
  read(0, &c, 1);
  kill(pid, 9);
  waitpid(pid, NULL, 0);
  return keep[0] == NULL;
}
