// For the in-process harnesses (tests/unit): write into a segment the test formatted what
// memhook's attach would have (the real malloc and free, this process's pid), load the hook
// library and start it there. Returns the library's handle, or null after saying why.
#pragma once
#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "segment.h"

static void* load_hook_library(const char* library, const char* segment,
                               void (*plan)(memhook::Control*) = nullptr) {
  int fd = open(segment, O_RDWR);
  auto* c = (memhook::Control*)mmap(nullptr, sizeof(memhook::Control), PROT_READ | PROT_WRITE,
                                    MAP_SHARED, fd, 0);
  if (c == MAP_FAILED) return nullptr;
  c->real[1] = (uint64_t)&malloc;  // hooks.def ids
  c->real[18] = (uint64_t)&free;
  c->target_pid = (uint64_t)getpid();
  if (plan) plan(c);  // what memhook's scan would have planned (hook_library/slots.h)
  munmap(c, sizeof(memhook::Control));
  close(fd);
  void* lib = dlopen(library, RTLD_NOW);
  if (!lib) {
    printf("dlopen %s\n", dlerror());
    return nullptr;
  }
  auto start = (int (*)(const char*))dlsym(lib, "memhook_start");
  printf("start %d\n", start(segment));
  return lib;
}
