// Experiment (not shipped): native_launch.c's page_table with the tensors read through ATen (THPVariable_Unpack)
// instead of their Python attributes: the floor of a compiled launcher that links against torch.
#include <torch/extension.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>

namespace {

typedef int (*launch_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                         void **, void **);
launch_fn cu_launch_kernel = nullptr;
PyObject *stream_query = nullptr;

PyObject *init(PyObject *, PyObject *args) {
  unsigned long long address;
  PyObject *query;
  if (!PyArg_ParseTuple(args, "KO", &address, &query)) return nullptr;
  Py_XINCREF(query);
  stream_query = query;
  cu_launch_kernel = (launch_fn)(uintptr_t)address;
  Py_RETURN_NONE;
}

// page_table(function, threads, shared, items_per_program, param_count, table, pool, lens, out)
PyObject *page_table(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 9) {
    PyErr_SetString(PyExc_TypeError, "page_table takes 9 arguments");
    return nullptr;
  }
  uint64_t function = PyLong_AsUnsignedLongLongMask(args[0]);
  long threads = PyLong_AsLong(args[1]), shared = PyLong_AsLong(args[2]);
  long items = PyLong_AsLong(args[3]), count = PyLong_AsLong(args[4]);
  if (PyErr_Occurred()) return nullptr;
  for (int i = 5; i < 9; ++i)
    if (!THPVariable_Check(args[i])) Py_RETURN_NOTIMPLEMENTED;
  const at::Tensor &table = THPVariable_Unpack(args[5]), &pool = THPVariable_Unpack(args[6]),
                   &lens = THPVariable_Unpack(args[7]), &out = THPVariable_Unpack(args[8]);
  if (table.dim() != 2 || out.dim() != 2 || pool.dim() != 1 || lens.dim() != 1) Py_RETURN_NOTIMPLEMENTED;
  int64_t batch = pool.size(0);
  auto device = table.device();
  if (table.scalar_type() != at::kInt || out.scalar_type() != at::kInt || pool.scalar_type() != at::kInt ||
      lens.scalar_type() != at::kInt || table.stride(1) != 1 || out.stride(1) != 1 || lens.size(0) != batch ||
      out.size(0) < batch || !device.is_cuda() || pool.device() != device || lens.device() != device ||
      out.device() != device || count > 32 || count < 17)
    Py_RETURN_NOTIMPLEMENTED;
  int64_t width = out.size(1);
  uint64_t grid_y = (uint64_t)((width + items - 1) / items);
  if (batch == 0 || grid_y == 0) return Py_NewRef(args[8]);
  PyObject *index = PyLong_FromLong(device.index());
  PyObject *stream_obj = index ? PyObject_CallOneArg(stream_query, index) : nullptr;
  Py_XDECREF(index);
  if (!stream_obj) return nullptr;
  uint64_t stream = PyLong_AsUnsignedLongLongMask(stream_obj);
  Py_DECREF(stream_obj);
  uint64_t values[32] = {(uint64_t)table.data_ptr(), (uint64_t)pool.data_ptr(), (uint64_t)lens.data_ptr(),
                         (uint64_t)table.data_ptr(), (uint64_t)out.data_ptr(), (uint64_t)out.data_ptr(),
                         (uint64_t)pool.stride(0), (uint64_t)lens.stride(0), 1, (uint64_t)table.size(0),
                         (uint64_t)table.size(1), (uint64_t)table.stride(0), (uint64_t)width,
                         (uint64_t)out.stride(0), 0, 0, 0};
  void *params[32];
  for (int i = 0; i < count; ++i) params[i] = &values[i];
  int rc = cu_launch_kernel((void *)(uintptr_t)function, (unsigned)batch, (unsigned)grid_y, 1, (unsigned)threads, 1, 1,
                            (unsigned)shared, (void *)(uintptr_t)stream, params, nullptr);
  if (rc != 0) return PyErr_Format(PyExc_RuntimeError, "cuLaunchKernel returned %d", rc);
  return Py_NewRef(args[8]);
}

PyMethodDef methods[] = {
    {"init", init, METH_VARARGS, "init(cuLaunchKernel address, raw stream query)"},
    {"page_table", (PyCFunction)(void (*)(void))page_table, METH_FASTCALL, "checks through ATen, launch"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  for (PyMethodDef *def = methods; def->ml_name; ++def)
    m.add_object(def->ml_name, pybind11::reinterpret_steal<pybind11::object>(PyCFunction_New(def, nullptr)));
}
