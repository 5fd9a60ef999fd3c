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

// page_table(function, threads, shared, items_per_program, param_count, page_size, table, pool, lens, out):
// a call without options whose sizes and strides fit the packed words (page_table.packed_words).
PyObject *page_table(PyObject *, PyObject *const *args, Py_ssize_t nargs) {
  if (nargs != 10) {
    PyErr_SetString(PyExc_TypeError, "page_table takes 10 arguments");
    return nullptr;
  }
  uint64_t function = PyLong_AsUnsignedLongLongMask(args[0]);
  long threads = PyLong_AsLong(args[1]), shared = PyLong_AsLong(args[2]);
  long items = PyLong_AsLong(args[3]), count = PyLong_AsLong(args[4]), page_size = PyLong_AsLong(args[5]);
  if (PyErr_Occurred()) return nullptr;
  for (int i = 6; i < 10; ++i)
    if (!THPVariable_Check(args[i])) Py_RETURN_NOTIMPLEMENTED;
  const at::Tensor &table = THPVariable_Unpack(args[6]), &pool = THPVariable_Unpack(args[7]),
                   &lens = THPVariable_Unpack(args[8]), &out = THPVariable_Unpack(args[9]);
  if (table.dim() != 2 || out.dim() != 2 || pool.dim() != 1 || lens.dim() != 1) Py_RETURN_NOTIMPLEMENTED;
  int64_t batch = pool.size(0);
  auto device = table.device();
  if (table.scalar_type() != at::kInt || out.scalar_type() != at::kInt || pool.scalar_type() != at::kInt ||
      lens.scalar_type() != at::kInt || table.stride(1) != 1 || out.stride(1) != 1 || lens.size(0) != batch ||
      pool.stride(0) != 1 || lens.stride(0) != 1 ||
      out.size(0) < batch || !device.is_cuda() || pool.device() != device || lens.device() != device ||
      out.device() != device || count > 32 || count < 20 || page_size < 2)
    Py_RETURN_NOTIMPLEMENTED;
  const int64_t wide = (int64_t)1 << 31;  // launch.WIDE
  int64_t width = out.size(1);
  if (table.size(0) >= wide || table.stride(0) >= wide || width >= wide || out.stride(0) >= wide)
    Py_RETURN_NOTIMPLEMENTED;
  uint64_t grid_y = (uint64_t)((width + items - 1) / items);
  if (batch == 0 || grid_y == 0) return Py_NewRef(args[9]);
  PyObject *index = PyLong_FromLong(device.index());
  PyObject *stream_obj = index ? PyObject_CallOneArg(stream_query, index) : nullptr;
  Py_XDECREF(index);
  if (!stream_obj) return nullptr;
  uint64_t stream = PyLong_AsUnsignedLongLongMask(stream_obj);
  Py_DECREF(stream_obj);
  // page_table.packed_words (page size > 1: no 16-byte row alignment bit), then the kernel's parameters in
  // page_table.PARAMETERS order; the rest of the 32 (Triton's two scratch pointers) stay null.
  int64_t pages_in_row = (table.size(1) + page_size - 1) / page_size;
  uint64_t packed_table = (uint64_t)table.size(0) | (uint64_t)table.stride(0) << 32;
  uint64_t packed_out = (uint64_t)(width < pages_in_row ? width : pages_in_row) | (uint64_t)out.stride(0) << 32;
  uint64_t values[32] = {(uint64_t)table.data_ptr(), (uint64_t)pool.data_ptr(), (uint64_t)lens.data_ptr(),
                         (uint64_t)out.data_ptr(), packed_table, packed_out, 0, 0, (uint64_t)width,
                         (uint64_t)out.data_ptr(), (uint64_t)table.data_ptr(), (uint64_t)table.size(0),
                         (uint64_t)table.size(1), (uint64_t)table.stride(0), (uint64_t)out.stride(0),
                         (uint64_t)pool.stride(0), (uint64_t)lens.stride(0), 1};
  void *params[32];
  for (int i = 0; i < count; ++i) params[i] = &values[i];
  int rc = cu_launch_kernel((void *)(uintptr_t)function, (unsigned)batch, (unsigned)grid_y, 1, (unsigned)threads, 1, 1,
                            (unsigned)shared, (void *)(uintptr_t)stream, params, nullptr);
  if (rc != 0) return PyErr_Format(PyExc_RuntimeError, "cuLaunchKernel returned %d", rc);
  return Py_NewRef(args[9]);
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
