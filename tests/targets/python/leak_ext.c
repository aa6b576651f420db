// A C extension that leaks through malloc (leak_service.py's `ext`).
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>

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

static PyMethodDef methods[] = {{"leak", ext_leak, METH_O, "keep a block of n bytes"},
                                {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "leak_ext", NULL, -1, methods};
PyMODINIT_FUNC PyInit_leak_ext(void) { return PyModule_Create(&module); }
