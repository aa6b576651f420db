// A C extension that leaks through malloc (leak_service.py's `ext`).
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

static void* kept[64];
static int nkept;

__attribute__((noinline)) static void* ext_keep_block(size_t n) {
  void* p = malloc(n);
  if (nkept < 64) kept[nkept++] = p;
  return p;
}

static PyObject* ext_leak(PyObject* self, PyObject* arg) {
  (void)self;
  size_t n = PyLong_AsSize_t(arg);
  if (PyErr_Occurred()) return NULL;
  ext_keep_block(n);
  Py_RETURN_NONE;
}

// Keeps a block, then waits until a writer has opened and closed the FIFO at `path`: a stack
// held still where it allocated, for py-spy dump to read beside memhook's record of it.
static PyObject* ext_keep_and_wait(PyObject* self, PyObject* args) {
  (void)self;
  Py_ssize_t n;
  const char* path;
  if (!PyArg_ParseTuple(args, "ns", &n, &path)) return NULL;
  ext_keep_block((size_t)n);
  int fd = open(path, O_RDONLY);
  if (fd < 0) return PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
  char c;
  while (read(fd, &c, 1) > 0) {
  }
  close(fd);
  Py_RETURN_NONE;
}

static PyMethodDef methods[] = {{"leak", ext_leak, METH_O, "keep a block of n bytes"},
                                {"keep_and_wait", ext_keep_and_wait, METH_VARARGS,
                                 "keep a block of n bytes, then wait for the FIFO at path"},
                                {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "leak_ext", NULL, -1, methods};
PyMODINIT_FUNC PyInit_leak_ext(void) { return PyModule_Create(&module); }
