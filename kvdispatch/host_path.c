// The host path of the index builders in C: the replay of the launch the Python path made for a call of the
// same key, for every op and every option.
//
// Built at first use by kvdispatch/host_path.py with the system's C compiler; only the
// Python C API (3.9+) is used: no torch or CUDA headers. A tensor's metadata is read from its TensorImpl
// (the address its `_cdata` attribute gives) through PyTorch's C shim (the AOTInductor getters of
// torch/csrc/inductor/aoti_torch/c/shim.h, a stable C ABI), whose addresses configure() receives with the
// launch and context functions (libcuda's cuLaunchKernel and cuCtxGetCurrent in the product, stubs in the
// tests).
//
// It knows no op: op codes are opaque ints given by the Python side (host_path.OPS), and so are the
// launchers that register plans (Triton's, kernels_triton/native.py, and CuPy's, kernels_cupy/native.py).
// The selector's approval of (op, device, requested backend) names the launcher whose plans serve a call.
// Validation stays in Python: see "Replay plans" below.
//
// replay(...) returns the op's first output after launching, or NotImplemented whenever the call is not
// exactly one it has a plan for (an unexpected type, a tensor its memory does not hold, no plan, an output
// sharing memory with another argument, another current context, a failed launch): the Python path then
// handles the call, errors included. It never raises for bad input.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if PY_VERSION_HEX < 0x030A0000
static inline PyObject *Py_NewRef(PyObject *o) {
    Py_INCREF(o);
    return o;
}
#endif

typedef int (*launch_fn)(void *function, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,
                         unsigned block_y, unsigned block_z, unsigned shared, void *stream, void **params,
                         void **extra);
typedef int (*context_fn)(void **context);
// The shim's getters: each takes an AtenTensorHandle (the address of an at::Tensor, which holds exactly its
// TensorImpl pointer) and returns 0 on success.
typedef int32_t (*get_int64_fn)(void *tensor, int64_t *value);
typedef int32_t (*get_int64s_fn)(void *tensor, int64_t **values);
typedef int32_t (*get_pointer_fn)(void *tensor, void **value);
typedef int32_t (*get_int32_fn)(void *tensor, int32_t *value);

// Values shared with the Python side come from kvdispatch/host_path.py (shared_defines) as -D options: the
// number of op codes (host_path.OPS) and of launcher codes (host_path.LAUNCHERS).
#if !defined(OP_COUNT) || !defined(LAUNCHER_COUNT)
#error "built by kvdispatch/host_path.py, which passes the values shared with Python as -D options"
#endif
#if OP_COUNT < 1 || OP_COUNT > 16 || LAUNCHER_COUNT < 1 || LAUNCHER_COUNT > 16
#error "the op codes index approved[OP_COUNT], the launcher codes fit its entries"
#endif
#define MAX_PARAMS 48

// Configuration (configure()).
static launch_fn launch_kernel = NULL;
static context_fn current_context = NULL;
static PyObject *stream_query = NULL, *tensor_type = NULL;
static struct {
    get_int64_fn dim, storage_size, storage_offset;
    get_int64s_fn sizes, strides;
    get_pointer_fn data_ptr;
    get_int32_fn dtype, device_type, device_index, layout;
    int32_t int32_code, int64_code;  // the shim's dtype codes of torch.int32 and torch.int64
    int32_t launch_device_type;      // the device type code of the tensors launches take
    int32_t strided_code;            // the shim's layout code of torch.strided
} shim;
static long index_offset = 0;  // added to a tensor's device index: 0 on GPUs; 1 lets the tests use CPU tensors
static unsigned long long launches = 0;
static PyObject *s_impl_address, *s_auto, *s_triton, *s_cupy;

// Which launcher the selector resolved (op, device, requested backend) to: 0 none, else its code + 1.
#define MAX_DEVICES 64
#define BACKEND_CODES 4  // None, "auto", "triton", "cupy"
static unsigned char approved[OP_COUNT][MAX_DEVICES][BACKEND_CODES];

static void clear_replays(int launcher, int op);  // -1: every launcher, every op

static void clear_all(void) {
    clear_replays(-1, -1);
    memset(approved, 0, sizeof(approved));
}

static void set_ref(PyObject **slot, PyObject *value) {
    PyObject *old = *slot;
    *slot = Py_NewRef(value);
    Py_XDECREF(old);
}

// configure(launch address, context address, stream query, torch.Tensor, shim, index offset); shim: the
// addresses of aoti_torch_get_dim, _sizes, _strides, _data_ptr, _dtype, _device_type, _device_index, _layout,
// _storage_size and _storage_offset (host_path.SHIM_GETTERS), then the dtype codes of int32 and int64, the launch
// device's type code and the layout code of torch.strided.
static PyObject *configure(PyObject *self, PyObject *args) {
    unsigned long long launch_address, context_address, getters[10];
    int codes[4];
    PyObject *query, *type;
    long offset;
    if (!PyArg_ParseTuple(args, "KKOO(KKKKKKKKKKiiii)l", &launch_address, &context_address, &query, &type,
                          &getters[0], &getters[1], &getters[2], &getters[3], &getters[4], &getters[5], &getters[6],
                          &getters[7], &getters[8], &getters[9], &codes[0], &codes[1], &codes[2], &codes[3], &offset))
        return NULL;
    if (!PyType_Check(type)) return PyErr_Format(PyExc_TypeError, "configure: the tensor type must be a type");
    for (int i = 0; i < 10; ++i)
        if (!getters[i]) return PyErr_Format(PyExc_ValueError, "configure: shim getter %d is missing", i);
    set_ref(&stream_query, query);
    set_ref(&tensor_type, type);
    shim.dim = (get_int64_fn)(uintptr_t)getters[0];
    shim.sizes = (get_int64s_fn)(uintptr_t)getters[1];
    shim.strides = (get_int64s_fn)(uintptr_t)getters[2];
    shim.data_ptr = (get_pointer_fn)(uintptr_t)getters[3];
    shim.dtype = (get_int32_fn)(uintptr_t)getters[4];
    shim.device_type = (get_int32_fn)(uintptr_t)getters[5];
    shim.device_index = (get_int32_fn)(uintptr_t)getters[6];
    shim.layout = (get_int32_fn)(uintptr_t)getters[7];
    shim.storage_size = (get_int64_fn)(uintptr_t)getters[8];
    shim.storage_offset = (get_int64_fn)(uintptr_t)getters[9];
    shim.int32_code = codes[0], shim.int64_code = codes[1], shim.launch_device_type = codes[2];
    shim.strided_code = codes[3];
    launch_kernel = (launch_fn)(uintptr_t)launch_address;
    current_context = (context_fn)(uintptr_t)context_address;
    index_offset = offset;
    launches = 0;
    clear_all();
    Py_RETURN_NONE;
}

static PyObject *clear(PyObject *self, PyObject *unused) {
    clear_all();
    Py_RETURN_NONE;
}

// clear_plans(launcher=-1, op=-1): forget the plans of one launcher's op (each Python plan cache forgets its
// own), of all its ops (op -1), or every plan (launcher -1).
static PyObject *clear_plans(PyObject *self, PyObject *args) {
    int launcher = -1, op = -1;
    if (!PyArg_ParseTuple(args, "|ii", &launcher, &op)) return NULL;
    clear_replays(launcher, op);
    Py_RETURN_NONE;
}

static PyObject *launch_count(PyObject *self, PyObject *unused) { return PyLong_FromUnsignedLongLong(launches); }

// The requested backend as the selector's key has it: 0 None, 1 "auto", 2 "triton", 3 "cupy"; -1 anything else.
static int backend_code(PyObject *backend) {
    if (backend == Py_None) return 0;
    if (!PyUnicode_CheckExact(backend)) return -1;
    if (backend == s_auto || PyUnicode_Compare(backend, s_auto) == 0) return 1;
    if (backend == s_triton || PyUnicode_Compare(backend, s_triton) == 0) return 2;
    if (backend == s_cupy || PyUnicode_Compare(backend, s_cupy) == 0) return 3;
    return -1;
}

static int is_launcher(int launcher) { return launcher >= 0 && launcher < LAUNCHER_COUNT; }

// approve(op, device index, backend, launcher): the selector resolves (op, device, backend) to `launcher`
// (a launcher code; -1: to none this path knows).
static PyObject *approve(PyObject *self, PyObject *args) {
    int op, launcher;
    long device;
    PyObject *backend;
    if (!PyArg_ParseTuple(args, "ilOi", &op, &device, &backend, &launcher)) return NULL;
    int code = backend_code(backend);
    if (PyErr_Occurred()) return NULL;
    if (op >= 0 && op < OP_COUNT && device >= 0 && device < MAX_DEVICES && code >= 0)
        approved[op][device][code] = (unsigned char)(is_launcher(launcher) ? launcher + 1 : 0);
    Py_RETURN_NONE;
}

static PyObject *context(PyObject *self, PyObject *unused) {
    void *ctx = NULL;
    if (current_context == NULL || current_context(&ctx) != 0) Py_RETURN_NONE;
    return PyLong_FromUnsignedLongLong((uint64_t)(uintptr_t)ctx);
}

typedef struct {
    int dim;
    int64_t size[2], stride[2];
    uint64_t data;
    uint64_t bytes;  // from the first element's byte to past the last's, as _validate._span; 0 without any element
    long device;
    int dtype;  // 1 int32, 2 int64, 0 other
    int64_t storage_offset, storage_bytes;  // as the shim reads them where the storage is checked, else -1
} tensor_info;

// What replay() reads of a strided tensor of at most two dimensions on the launch device type; an int32 or
// int64 one with elements must have memory that holds it (_validate._check_storage: a data pointer aligned to
// the element size, a storage covering the view). Returns 0, or -1 with no error set when anything does not fit.
static int read_tensor(PyObject *t, tensor_info *info) {
    if (Py_TYPE(t) != (PyTypeObject *)tensor_type || !shim.dim) return -1;
    PyObject *address = PyObject_GetAttr(t, s_impl_address);
    void *impl = address ? PyLong_AsVoidPtr(address) : NULL;
    Py_XDECREF(address);
    if (!impl) {
        PyErr_Clear();
        return -1;
    }
    void *tensor = &impl;  // an at::Tensor: its TensorImpl pointer
    int64_t rank, *sizes, *strides;
    void *data;
    int32_t device_type, device_index, dtype, layout;
    if (shim.device_type(tensor, &device_type) || device_type != shim.launch_device_type ||
        shim.layout(tensor, &layout) || layout != shim.strided_code || shim.dim(tensor, &rank) || rank > 2 ||
        shim.sizes(tensor, &sizes) || shim.strides(tensor, &strides) || shim.data_ptr(tensor, &data) ||
        shim.dtype(tensor, &dtype) || shim.device_index(tensor, &device_index))
        return -1;
    info->dim = (int)rank;
    info->dtype = dtype == shim.int32_code ? 1 : dtype == shim.int64_code ? 2 : 0;
    uint64_t extent = 1;  // elements from the first to the last (PyTorch strides are never negative)
    int empty = 0;
    for (int i = 0; i < rank; ++i) {
        info->size[i] = sizes[i], info->stride[i] = strides[i];
        empty |= sizes[i] == 0;
        extent += (uint64_t)(sizes[i] - 1) * (uint64_t)strides[i];
    }
    const uint64_t itemsize = info->dtype == 2 ? 8 : 4;  // replay() refuses other dtypes
    info->data = (uint64_t)(uintptr_t)data;
    info->storage_offset = info->storage_bytes = -1;
    if (!empty && info->dtype) {  // storage that exists and covers the view, a pointer aligned to the element
        int64_t *held = &info->storage_bytes, *offset = &info->storage_offset;
        if (data == NULL || info->data % itemsize || shim.storage_size(tensor, held) ||
            shim.storage_offset(tensor, offset) || *held <= 0 || *offset < 0 ||
            ((uint64_t)*offset + extent) * itemsize > (uint64_t)*held)
            return -1;
    }
    info->device = (long)device_index + index_offset;
    info->bytes = empty ? 0 : extent * itemsize;
    return info->device >= 0 ? 0 : -1;
}

// An int64 read from the shim, or None for one not read (-1).
static PyObject *read_or_none(int64_t value) {
    return value < 0 ? Py_NewRef(Py_None) : PyLong_FromLongLong(value);
}

// tensor_metadata(t) -> (dtype code, device, sizes, strides, data pointer, storage offset, storage bytes), the
// storage's two None where read_tensor does not check it (no element, another dtype), or None where it refuses t.
static PyObject *tensor_metadata(PyObject *self, PyObject *t) {
    tensor_info info;
    if (read_tensor(t, &info)) Py_RETURN_NONE;
    PyObject *sizes = PyTuple_New(info.dim), *strides = PyTuple_New(info.dim);
    PyObject *offset = read_or_none(info.storage_offset), *held = read_or_none(info.storage_bytes);
    for (int i = 0; sizes && strides && i < info.dim; ++i) {
        PyTuple_SET_ITEM(sizes, i, PyLong_FromLongLong(info.size[i]));
        PyTuple_SET_ITEM(strides, i, PyLong_FromLongLong(info.stride[i]));
    }
    PyObject *result = sizes && strides && offset && held
                           ? Py_BuildValue("(ilOOKOO)", info.dtype, info.device, sizes, strides,
                                           (unsigned long long)info.data, offset, held)
                           : NULL;
    Py_XDECREF(sizes);
    Py_XDECREF(strides);
    Py_XDECREF(offset);
    Py_XDECREF(held);
    return result;
}

// An exact Python int in [low, high] into *value; 0 when it is not one (bool included).
static int small_int(PyObject *o, int64_t low, int64_t high, int64_t *value) {
    if (!PyLong_CheckExact(o)) return 0;
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    *value = v;
    return v >= low && v <= high;
}

// The launch of `function` (loaded in `context`, which must be the current one) with the `param_count` values
// as its parameters, on the current stream of `device`. Returns a new reference to `result`, or NotImplemented.
static PyObject *launch_on(long device, void *context, uint64_t function_handle, const unsigned grid[3],
                           unsigned threads, unsigned shared, uint64_t *values, unsigned param_count,
                           PyObject *result) {
    void *ctx = NULL;
    if (current_context(&ctx) != 0 || ctx != context) Py_RETURN_NOTIMPLEMENTED;
    PyObject *index = PyLong_FromLong(device);
    PyObject *stream_obj = index ? PyObject_CallOneArg(stream_query, index) : NULL;
    Py_XDECREF(index);
    if (stream_obj == NULL) return NULL;  // the stream query itself failed: a real error
    uint64_t stream = PyLong_AsUnsignedLongLongMask(stream_obj);
    Py_DECREF(stream_obj);
    if (PyErr_Occurred()) return NULL;
    void *params[MAX_PARAMS];
    for (unsigned i = 0; i < param_count; ++i) params[i] = &values[i];
    void *function = (void *)(uintptr_t)function_handle;
    int rc;
    Py_BEGIN_ALLOW_THREADS;
    rc = launch_kernel(function, grid[0], grid[1], grid[2], threads, 1, 1, shared, (void *)(uintptr_t)stream, params,
                       NULL);
    Py_END_ALLOW_THREADS;
    if (rc != 0) Py_RETURN_NOTIMPLEMENTED;  // the Python path makes this call and reports what it finds
    ++launches;
    return Py_NewRef(result);
}

// ---- Replay plans ------------------------------------------------------------------------------------------
//
// After the Python path has validated a call of an op and launched exactly one kernel for it,
// add_replay() stores that launch under the call's replay key: the op, the requested backend, the launcher
// the selector resolved them to, then each public argument in the API's order: a tensor's dtype, device,
// shape, strides and whether its data is 16-byte aligned; None; an exact int or bool's value. The launch's
// parameters are fixed values but for its pointer slots (parameter -> argument whose data_ptr() goes there).
// replay() computes the key of a call (reading each tensor as read_tensor does: its memory must hold its view),
// finds the plan, checks what depends on the pointers only (the declared outputs share no byte with any other
// tensor argument, as the validator requires; the current context) and launches with the call's pointers in
// the slots. Anything else: NotImplemented.

#define MAX_ARGS 24
#define MAX_KEY_WORDS 136  // 3 header words, then at most 9 per argument (2-D tensors); the longest op needs 115
#define REPLAY_SLOTS 8192 // open addressing, at most half full: as many plans as one Python plan cache holds
#define KEY_TENSOR 1
#define KEY_NONE 2
#define KEY_INT 3
#define KEY_BOOL 4

typedef struct {
    int used, key_len;
    int64_t key[MAX_KEY_WORDS];
    void *context;
    uint64_t function;
    unsigned grid[3], threads, shared, param_count, slot_count, arg_count;
    uint64_t values[MAX_PARAMS];
    unsigned char slot_param[MAX_PARAMS], slot_arg[MAX_PARAMS];
    uint32_t outputs;             // bit i: argument i is an output
    uint64_t extent[MAX_ARGS];    // bytes from a tensor argument's first element to past its last (0: none)
    unsigned char result_arg;     // the argument replay() returns
} replay_plan;

static replay_plan replays[REPLAY_SLOTS];
static int replay_count = 0;

// What replay() reads of one argument: whether it is a tensor, and its data pointer.
typedef struct {
    int is_tensor;
    uint64_t data;
} arg_info;

static uint64_t hash_words(const int64_t *words, int count) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < count; ++i) h = (h ^ (uint64_t)words[i]) * 1099511628211ull;
    return h;
}

static replay_plan *find_replay_slot(const int64_t *key, int len) {
    uint64_t slot = hash_words(key, len) % REPLAY_SLOTS;
    for (int probe = 0; probe < REPLAY_SLOTS; ++probe, slot = (slot + 1) % REPLAY_SLOTS) {
        replay_plan *p = &replays[slot];
        if (!p->used || (p->key_len == len && memcmp(p->key, key, len * sizeof(int64_t)) == 0)) return p;
    }
    return NULL;  // unreachable: the table is never more than half full
}

// key[0..2]: op, backend code, launcher (key[2] is the launcher word).
static void clear_replays(int launcher, int op) {
    if (replay_count == 0) return;  // nothing to forget (every slot is unused)
    if (launcher < 0) {
        memset(replays, 0, sizeof(replays));
        replay_count = 0;
        return;
    }
    static replay_plan kept[REPLAY_SLOTS / 2];
    int count = 0;
    for (int i = 0; i < REPLAY_SLOTS; ++i)
        if (replays[i].used && (replays[i].key[2] != launcher || (op >= 0 && replays[i].key[0] != op)))
            kept[count++] = replays[i];
    if (count == replay_count) return;  // none of theirs
    memset(replays, 0, sizeof(replays));
    for (int i = 0; i < count; ++i) *find_replay_slot(kept[i].key, kept[i].key_len) = kept[i];
    replay_count = count;
}

// The replay key of `count` public arguments (the launcher word key[2] left 0), each argument's info and
// tensor byte extent (NULL: not wanted), and the device of the first (a tensor). Returns the key's length,
// or 0 (no error set) when an argument is none of the kinds a key holds.
static int replay_key(int op, int backend, PyObject *const *args, Py_ssize_t count, int64_t *key, arg_info *infos,
                      uint64_t *extents, long *device) {
    if (count < 1 || count > MAX_ARGS) return 0;
    int len = 0;
    key[len++] = op, key[len++] = backend, key[len++] = 0;
    for (Py_ssize_t i = 0; i < count; ++i) {
        PyObject *a = args[i];
        infos[i].is_tensor = 0, infos[i].data = 0;
        if (extents) extents[i] = 0;
        if (a == Py_None) {
            key[len++] = KEY_NONE;
        } else if (a == Py_True || a == Py_False) {
            key[len++] = KEY_BOOL, key[len++] = a == Py_True;
        } else if (PyLong_CheckExact(a)) {
            int overflow = 0;
            long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
            if (overflow || (v == -1 && PyErr_Occurred())) {
                PyErr_Clear();
                return 0;
            }
            key[len++] = KEY_INT, key[len++] = v;
        } else {
            tensor_info t;
            if (read_tensor(a, &t) || t.dtype == 0) return 0;
            if (i == 0) *device = t.device;
            key[len++] = KEY_TENSOR, key[len++] = t.dtype, key[len++] = t.device, key[len++] = t.dim;
            for (int d = 0; d < t.dim; ++d) key[len++] = t.size[d], key[len++] = t.stride[d];
            key[len++] = t.data % 16 == 0;
            infos[i].is_tensor = 1, infos[i].data = t.data;
            if (extents) extents[i] = t.bytes;  // from the metadata alone
        }
        if (len > MAX_KEY_WORDS - 9) return 0;
    }
    return infos[0].is_tensor ? len : 0;
}

// add_replay's arguments, in order: host_path.ReplayPlan's fields (tests/test_host_path_replay.py compares
// them), parsed by REPLAY_PLAN_FORMAT.
static const char *const replay_plan_fields[] = {"op",    "backend", "args",   "launcher", "context", "function",
                                                 "grid",  "threads", "shared", "values",   "slots",   "outputs"};
#define REPLAY_PLAN_FORMAT "iOO!iKK(III)IIO!O!O!"

// add_replay(op, backend, args, launcher, context, function, grid, threads, shared, values, slots, outputs)
//   -> added
// op: an op code below OP_COUNT; args: the public arguments of the call just launched (tuple, the API's order,
// as replay() takes them); grid: (x, y, z); values: the kernel's parameters as 64-bit words (tuple of ints);
// slots: ((parameter, argument), ...) for each parameter that is an argument's data pointer (its value must be
// that pointer); outputs: the indices of the output arguments, the first being what replay() returns.
static PyObject *add_replay(PyObject *self, PyObject *args) {
    int op, launcher;
    PyObject *backend, *call_args, *values, *slots, *outputs;
    unsigned long long ctx, function;
    unsigned grid[3], threads, shared;
    if (!PyArg_ParseTuple(args, REPLAY_PLAN_FORMAT, &op, &backend, &PyTuple_Type, &call_args, &launcher, &ctx,
                          &function, &grid[0], &grid[1], &grid[2], &threads, &shared, &PyTuple_Type, &values,
                          &PyTuple_Type, &slots, &PyTuple_Type, &outputs))
        return NULL;
    int code = backend_code(backend);
    if (PyErr_Occurred()) return NULL;
    Py_ssize_t count = PyTuple_GET_SIZE(call_args), param_count = PyTuple_GET_SIZE(values);
    Py_ssize_t slot_count = PyTuple_GET_SIZE(slots), output_count = PyTuple_GET_SIZE(outputs);
    if (op < 0 || op >= OP_COUNT || !is_launcher(launcher) || code < 0 || param_count > MAX_PARAMS ||
        slot_count > param_count || output_count < 1 || count > MAX_ARGS)
        Py_RETURN_FALSE;
    replay_plan plan;
    memset(&plan, 0, sizeof(plan));
    arg_info infos[MAX_ARGS];
    long device = -1;
    plan.key_len = replay_key(op, code, &PyTuple_GET_ITEM(call_args, 0), count, plan.key, infos, plan.extent,
                              &device);
    if (plan.key_len == 0) Py_RETURN_FALSE;
    plan.key[2] = launcher;
    for (Py_ssize_t i = 0; i < param_count; ++i)
        plan.values[i] = PyLong_AsUnsignedLongLongMask(PyTuple_GET_ITEM(values, i));
    for (Py_ssize_t i = 0; i < slot_count; ++i) {
        PyObject *pair = PyTuple_GET_ITEM(slots, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2) Py_RETURN_FALSE;
        long parameter = PyLong_AsLong(PyTuple_GET_ITEM(pair, 0)), argument = PyLong_AsLong(PyTuple_GET_ITEM(pair, 1));
        if (PyErr_Occurred()) return NULL;
        // A slot names a tensor argument whose pointer the recorded launch passed there.
        if (parameter < 0 || parameter >= param_count || argument < 0 || argument >= count ||
            !infos[argument].is_tensor || plan.values[parameter] != infos[argument].data)
            Py_RETURN_FALSE;
        plan.slot_param[i] = (unsigned char)parameter, plan.slot_arg[i] = (unsigned char)argument;
    }
    for (Py_ssize_t i = 0; i < output_count; ++i) {
        long argument = PyLong_AsLong(PyTuple_GET_ITEM(outputs, i));
        if (PyErr_Occurred()) return NULL;
        if (argument < 0 || argument >= count) Py_RETURN_FALSE;
        if (i == 0) plan.result_arg = (unsigned char)argument;
        plan.outputs |= 1u << argument;
    }
    if (PyErr_Occurred()) return NULL;
    plan.used = 1;
    plan.context = (void *)(uintptr_t)ctx;
    plan.function = function;
    memcpy(plan.grid, grid, sizeof(grid));
    plan.threads = threads, plan.shared = shared, plan.param_count = (unsigned)param_count;
    plan.slot_count = (unsigned)slot_count, plan.arg_count = (unsigned)count;
    replay_plan *p = find_replay_slot(plan.key, plan.key_len);
    if (p == NULL) Py_RETURN_FALSE;
    if (!p->used) {
        if (replay_count * 2 >= REPLAY_SLOTS) Py_RETURN_FALSE;  // full: such calls stay on the Python path
        ++replay_count;
    }
    *p = plan;
    Py_RETURN_TRUE;
}

// Whether an output argument of `p` shares a byte with any other tensor argument (the byte ranges from each
// data pointer over its extent; an empty one meets none), as the validator's overlap check finds.
static int outputs_overlap(const replay_plan *p, const arg_info *infos) {
    for (unsigned o = 0; o < p->arg_count; ++o) {
        if (!(p->outputs >> o & 1) || !infos[o].data || !p->extent[o]) continue;
        uint64_t begin = infos[o].data, end = begin + p->extent[o];
        for (unsigned i = 0; i < p->arg_count; ++i) {
            if (i == o || !infos[i].data || !p->extent[i]) continue;  // a null pointer: no memory
            if (infos[i].data < end && begin < infos[i].data + p->extent[i]) return 1;
        }
    }
    return 0;
}

// replay(op, backend, *public arguments): the call's launch from its replay plan; returns the op's first
// output, or NotImplemented (no plan, not approved, an output overlapping another argument, another current
// context, a failed launch), and the Python path serves the call.
static PyObject *replay(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 3 || launch_kernel == NULL) Py_RETURN_NOTIMPLEMENTED;
    int64_t op;
    if (!small_int(args[0], 0, OP_COUNT - 1, &op)) Py_RETURN_NOTIMPLEMENTED;
    int backend = backend_code(args[1]);
    if (backend < 0) {
        PyErr_Clear();
        Py_RETURN_NOTIMPLEMENTED;
    }
    int64_t key[MAX_KEY_WORDS];
    arg_info infos[MAX_ARGS];
    long device = -1;
    int len = replay_key((int)op, backend, args + 2, nargs - 2, key, infos, NULL, &device);
    if (len == 0 || device < 0 || device >= MAX_DEVICES || !approved[op][device][backend]) Py_RETURN_NOTIMPLEMENTED;
    key[2] = approved[op][device][backend] - 1;
    const replay_plan *p = find_replay_slot(key, len);
    if (p == NULL || !p->used || outputs_overlap(p, infos)) Py_RETURN_NOTIMPLEMENTED;
    uint64_t values[MAX_PARAMS];
    memcpy(values, p->values, sizeof(values));
    for (unsigned i = 0; i < p->slot_count; ++i) values[p->slot_param[i]] = infos[p->slot_arg[i]].data;
    return launch_on(device, p->context, p->function, p->grid, p->threads, p->shared, values, p->param_count,
                     args[2 + p->result_arg]);
}

// replay_plan_count(): the replay plans held.
static PyObject *replay_plan_count(PyObject *self, PyObject *unused) { return PyLong_FromLong(replay_count); }

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(launch address, context address, stream query, tensor type, shim, index offset)"},
    {"clear", clear, METH_NOARGS, "forget every plan and approval"},
    {"clear_plans", clear_plans, METH_VARARGS,
     "clear_plans(launcher=-1, op=-1): forget one launcher's plans of one op (-1: all), keep the approvals"},
    {"launch_count", launch_count, METH_NOARGS, "launches made since configure()"},
    {"approve", approve, METH_VARARGS,
     "approve(op, device index, backend, launcher): the selector chose this launcher (-1: none this path knows)"},
    {"context", context, METH_NOARGS, "the current context's handle, or None"},
    {"add_replay", add_replay, METH_VARARGS,
     "add_replay(op, backend, args, launcher, context, function, grid, threads, shared, values, slots, outputs)"},
    {"replay", (PyCFunction)(void (*)(void))replay, METH_FASTCALL,
     "replay(op, backend, *public arguments): launches from the call's replay plan, or returns NotImplemented"},
    {"tensor_metadata", tensor_metadata, METH_O,
     "tensor_metadata(t) -> (dtype code, device, sizes, strides, data pointer, storage offset, storage bytes) as "
     "the checks read them, or None"},
    {"replay_plan_count", replay_plan_count, METH_NOARGS, "the replay plans held"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "kvdispatch_host_path", NULL, -1, methods};

PyMODINIT_FUNC PyInit_kvdispatch_host_path(void) {
    s_impl_address = PyUnicode_InternFromString("_cdata");
    s_auto = PyUnicode_InternFromString("auto");
    s_triton = PyUnicode_InternFromString("triton");
    s_cupy = PyUnicode_InternFromString("cupy");
    PyObject *m = PyModule_Create(&module);
    const Py_ssize_t field_count = sizeof(replay_plan_fields) / sizeof(replay_plan_fields[0]);
    PyObject *fields = m ? PyTuple_New(field_count) : NULL;
    for (Py_ssize_t i = 0; fields && i < field_count; ++i)
        PyTuple_SET_ITEM(fields, i, PyUnicode_FromString(replay_plan_fields[i]));
    if (fields == NULL || PyModule_AddObject(m, "REPLAY_PLAN_FIELDS", fields) < 0) {
        Py_XDECREF(fields);
        Py_XDECREF(m);
        return NULL;
    }
    return m;
}
