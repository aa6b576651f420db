/* A library a program loads just before it ends (test_run.py): 5 blocks of 77 bytes kept. */
#include <stdlib.h>
#include <string.h>

__attribute__((noinline)) static void* leak_in_loaded_library(void) {
  return memset(malloc(77), 1, 77);
}

void loaded_last(void) {
  for (int i = 0; i < 5; i++) leak_in_loaded_library();
}
