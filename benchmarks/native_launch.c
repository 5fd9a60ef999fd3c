// Experiment (not shipped): the floor of any launcher, cuLaunchKernel from C with its parameters given as
// ints. Built at run time by native_launch.py; see there. (Its first version, at 47b76d6, also did the checks
// and the packing: that is kvdispatch/host_path.c now.)

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                         void **, void **);

#define MAX_PARAMS 32

static launch_fn cu_launch_kernel = NULL;

static int launch(uint64_t function, unsigned grid_x, unsigned grid_y, unsigned threads, unsigned shared,
                  uint64_t stream, uint64_t *values, int count) {
    void *params[MAX_PARAMS];
    for (int i = 0; i < count; ++i) params[i] = &values[i];
    return cu_launch_kernel((void *)(uintptr_t)function, grid_x, grid_y, 1, threads, 1, 1, shared,
                            (void *)(uintptr_t)stream, params, NULL);
}

// init(cuLaunchKernel address)
static PyObject *init(PyObject *self, PyObject *args) {
    unsigned long long address;
    if (!PyArg_ParseTuple(args, "K", &address)) return NULL;
    cu_launch_kernel = (launch_fn)(uintptr_t)address;
    Py_RETURN_NONE;
}

// launch_raw(function, grid_x, grid_y, threads, shared, stream, *params): every parameter 8 bytes.
static PyObject *launch_raw(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 6 || nargs - 6 > MAX_PARAMS) {
        PyErr_SetString(PyExc_TypeError, "launch_raw(function, grid_x, grid_y, threads, shared, stream, *params)");
        return NULL;
    }
    uint64_t head[6], values[MAX_PARAMS];
    for (int i = 0; i < 6; ++i) head[i] = PyLong_AsUnsignedLongLongMask(args[i]);
    for (Py_ssize_t i = 6; i < nargs; ++i) values[i - 6] = PyLong_AsUnsignedLongLongMask(args[i]);
    if (PyErr_Occurred()) return NULL;
    int rc = launch(head[0], (unsigned)head[1], (unsigned)head[2], (unsigned)head[3], (unsigned)head[4], head[5],
                    values, (int)(nargs - 6));
    return PyLong_FromLong(rc);
}

static PyMethodDef methods[] = {
    {"init", init, METH_VARARGS, "init(cuLaunchKernel address)"},
    {"launch_raw", (PyCFunction)(void (*)(void))launch_raw, METH_FASTCALL, "cuLaunchKernel with 8-byte params"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kv_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit_kv_native(void) { return PyModule_Create(&module); }
