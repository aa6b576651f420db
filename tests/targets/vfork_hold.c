// A process that holds itself in vfork() on "go": the parent waits in the kernel, taking no
// signal (a ptrace attach's SIGSTOP included) until its child exits, SECONDS later. Then it
// allocates for a while and says "done"; "exit" ends it.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
  const int seconds = argc > 1 ? atoi(argv[1]) : 5;
  free(malloc(16));
  printf("ready\n");
  fflush(stdout);
  char line[64];
  while (fgets(line, sizeof line, stdin)) {
    if (strncmp(line, "exit", 4) == 0) return 0;
    pid_t child = vfork();
    if (child == 0) {  // only a system call here: the parent's memory is shared
      struct timespec ts = {seconds, 0};
      syscall(SYS_nanosleep, &ts, NULL);
      _exit(0);
    }
    waitpid(child, NULL, 0);
    printf("resumed\n");
    fflush(stdout);
    for (int i = 0; i < 10; i++) {
      free(malloc(32));
      struct timespec ts = {0, 20000000};
      nanosleep(&ts, NULL);
    }
    printf("done\n");
    fflush(stdout);
  }
  return 0;
}
