// LeakDemo.keep: keeps a block of `bytes` (when `really`), as a JNI library that leaks would.
#include <jni.h>
#include <stdlib.h>

void* leak_demo_kept[4096];  // (exported: the compiler keeps every store)
static int nkept;

__attribute__((noinline)) static void keep_block(int bytes) {
  void* p = malloc((size_t)bytes);
  if (nkept < 4096) leak_demo_kept[nkept++] = p;
}

JNIEXPORT void JNICALL Java_LeakDemo_keep(JNIEnv* env, jclass cls, jint bytes, jboolean really) {
  (void)env;
  (void)cls;
  if (really) keep_block(bytes);
}
