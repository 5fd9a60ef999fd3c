// Experiment (not shipped): how cheap can one page-table call be on the host when the checks, the argument
// packing and the launch are all in C? Built at run time by native_launch.py; see there.
//
// Only the Python C API and a cuLaunchKernel address handed over from Python (ctypes): no torch or CUDA
// headers. Tensor metadata is read through the tensors' Python attributes, as any extension without
// torch's headers would have to.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                         void **, void **);

#define MAX_PARAMS 32

static launch_fn cu_launch_kernel = NULL;
static PyObject *stream_query = NULL, *dtype_int32 = NULL, *dtype_int64 = NULL;
static PyObject *s_data_ptr, *s_stride, *s_shape, *s_dtype, *s_get_device;

static int launch(uint64_t function, unsigned grid_x, unsigned grid_y, unsigned threads, unsigned shared,
                  uint64_t stream, uint64_t *values, int count) {
    void *params[MAX_PARAMS];
    for (int i = 0; i < count; ++i) params[i] = &values[i];
    return cu_launch_kernel((void *)(uintptr_t)function, grid_x, grid_y, 1, threads, 1, 1, shared,
                            (void *)(uintptr_t)stream, params, NULL);
}

// init(cuLaunchKernel address, torch._C._cuda_getCurrentRawStream, torch.int32, torch.int64)
static PyObject *init(PyObject *self, PyObject *args) {
    unsigned long long address;
    PyObject *query, *i32, *i64;
    if (!PyArg_ParseTuple(args, "KOOO", &address, &query, &i32, &i64)) return NULL;
    Py_XSETREF(stream_query, Py_NewRef(query));
    Py_XSETREF(dtype_int32, Py_NewRef(i32));
    Py_XSETREF(dtype_int64, Py_NewRef(i64));
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

typedef struct {
    int dim;
    int64_t size[2], stride[2];
    uint64_t data;
    long device;
    PyObject *dtype;  // borrowed: compared by identity only
} tensor_info;

// Reads what the validator reads. Returns 0 when the tensor has the expected rank, -1 otherwise (no error set).
static int read_tensor(PyObject *t, int dim, tensor_info *info) {
    PyObject *dtype = PyObject_GetAttr(t, s_dtype);
    PyObject *shape = dtype ? PyObject_GetAttr(t, s_shape) : NULL;
    PyObject *stride = shape ? PyObject_CallMethodNoArgs(t, s_stride) : NULL;
    PyObject *data = stride ? PyObject_CallMethodNoArgs(t, s_data_ptr) : NULL;
    PyObject *device = data ? PyObject_CallMethodNoArgs(t, s_get_device) : NULL;
    int ok = device && PyTuple_Check(shape) && PyTuple_Check(stride) && PyTuple_GET_SIZE(shape) == dim &&
             PyTuple_GET_SIZE(stride) == dim;
    if (ok) {
        info->dim = dim;
        for (int i = 0; i < dim; ++i) {
            info->size[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, i));
            info->stride[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(stride, i));
        }
        info->data = PyLong_AsUnsignedLongLong(data);
        info->device = PyLong_AsLong(device);
        info->dtype = dtype;
        ok = !PyErr_Occurred();
    }
    Py_XDECREF(dtype);  // dtypes are module-level singletons: the borrowed pointer stays valid
    Py_XDECREF(shape);
    Py_XDECREF(stride);
    Py_XDECREF(data);
    Py_XDECREF(device);
    PyErr_Clear();
    return ok ? 0 : -1;
}

// page_table(function, threads, shared, items_per_program, param_count, table, pool, lens, out)
// The page-64 kernel without options, int32 index vectors. Returns out, or NotImplemented when any check
// fails (the Python path then raises the proper error).
static PyObject *page_table(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 9) {
        PyErr_SetString(PyExc_TypeError, "page_table takes 9 arguments");
        return NULL;
    }
    uint64_t function = PyLong_AsUnsignedLongLongMask(args[0]);
    long threads = PyLong_AsLong(args[1]), shared = PyLong_AsLong(args[2]);
    long items = PyLong_AsLong(args[3]), count = PyLong_AsLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    tensor_info table, pool, lens, out;
    if (read_tensor(args[5], 2, &table) || read_tensor(args[6], 1, &pool) || read_tensor(args[7], 1, &lens) ||
        read_tensor(args[8], 2, &out))
        Py_RETURN_NOTIMPLEMENTED;
    int64_t batch = pool.size[0];
    if (table.dtype != dtype_int32 || out.dtype != dtype_int32 || pool.dtype != dtype_int32 ||
        lens.dtype != dtype_int32 || table.stride[1] != 1 || out.stride[1] != 1 || lens.size[0] != batch ||
        out.size[0] < batch || table.device < 0 || pool.device != table.device || lens.device != table.device ||
        out.device != table.device || count > MAX_PARAMS || count < 17)
        Py_RETURN_NOTIMPLEMENTED;
    int64_t width = out.size[1];
    uint64_t grid_y = (uint64_t)((width + items - 1) / items);
    if (batch == 0 || grid_y == 0) return Py_NewRef(args[8]);
    PyObject *index = PyLong_FromLong(table.device);
    PyObject *stream_obj = index ? PyObject_CallOneArg(stream_query, index) : NULL;
    Py_XDECREF(index);
    if (!stream_obj) return NULL;
    uint64_t stream = PyLong_AsUnsignedLongLongMask(stream_obj);
    Py_DECREF(stream_obj);
    uint64_t values[MAX_PARAMS] = {
        table.data, pool.data, lens.data, table.data, out.data, out.data,  // start and seq_lens_out: unused
        (uint64_t)pool.stride[0], (uint64_t)lens.stride[0], 1, (uint64_t)table.size[0], (uint64_t)table.size[1],
        (uint64_t)table.stride[0], (uint64_t)width, (uint64_t)out.stride[0], 0, 0, 0};  // the rest: 0
    int rc = launch(function, (unsigned)batch, (unsigned)grid_y, (unsigned)threads, (unsigned)shared, stream, values,
                    (int)count);
    if (rc != 0) return PyErr_Format(PyExc_RuntimeError, "cuLaunchKernel returned %d", rc);
    return Py_NewRef(args[8]);
}

static PyMethodDef methods[] = {
    {"init", init, METH_VARARGS, "init(cuLaunchKernel address, raw stream query, torch.int32, torch.int64)"},
    {"launch_raw", (PyCFunction)(void (*)(void))launch_raw, METH_FASTCALL, "cuLaunchKernel with 8-byte params"},
    {"page_table", (PyCFunction)(void (*)(void))page_table, METH_FASTCALL, "checks, packing and launch in C"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kv_native", NULL, -1, methods};

PyMODINIT_FUNC PyInit_kv_native(void) {
    s_data_ptr = PyUnicode_InternFromString("data_ptr");
    s_stride = PyUnicode_InternFromString("stride");
    s_shape = PyUnicode_InternFromString("shape");
    s_dtype = PyUnicode_InternFromString("dtype");
    s_get_device = PyUnicode_InternFromString("get_device");
    return PyModule_Create(&module);
}
