"""The op declaration: one decorator turns an op's signature into its public function, its PyTorch custom op
(with the fake kernel ``torch.compile`` traces through) and its dispatch entry.

An op module (``kvdispatch/ops/<key>.py``) writes its argument checks, its data checks and its torch reference
once, then declares the public function by its signature and docstring::

    @declare("page_table", outputs=("out", "seq_lens_out"), check=check_arguments, check_data=check_data,
             reference=reference)
    def create_flashmla_kv_indices(req_to_token: Tensor, ..., out: Tensor, *, page_size: int,
                                   kv_start_idx: Tensor | None = None, ..., backend: str | None = None,
                                   enable_pdl: bool | None = None) -> Tensor:
        '''docstring'''

The decorated body is never run. ``declare`` generates the public function with exactly that signature (its
source is written from the signature, as Triton writes a kernel's launcher, so a call pays no argument binding):

1. ``enable_pdl`` is checked (a bool or None; None: ``KVDISPATCH_PDL``).
2. While ``torch.compile`` traces, the call becomes ``torch.ops.kvdispatch.<public name>`` for the trace's backend
   request (``requested_backend``).
3. Else the compiled host path's replay entry (``dispatch.fast_replay``) may take the call whole; it takes none
   under ``KVDISPATCH_DEBUG`` or with PDL and hands back (NotImplemented) whatever it cannot take.
4. Else ``check`` validates (a bad argument raises, naming it, before anything is written), ``check_data``
   runs under ``KVDISPATCH_DEBUG`` (a host sync) and ``dispatch.call`` runs the selected backend's kernel for
   ``key``; on a GPU the launch it makes becomes the replay plan of the call's key (``run_and_register``).
5. It returns the first output.

The arguments reach the backends, the reference and the replay entry positionally, in the signature's order
without ``backend`` and ``enable_pdl`` (``Op.parameters``), then ``pdl``. ``check`` and ``check_data`` take them
by their names (each only those it declares); ``check`` also takes ``memory=False`` (metadata only: the fake).

The custom op's schema follows from the annotations: ``Tensor`` and ``Tensor | None`` arguments are ``Tensor``
and ``Tensor?`` (the outputs ``Tensor(a!)``: mutated, so AOTAutograd functionalises the op and Inductor writes in
place); ``int``/``bool`` options, with ``| None`` where None is allowed, are ``Scalar``/``Scalar?``, so that the
kernel and the fake see the caller's object and refuse what the public function refuses (the schema's ``int``
and ``bool`` would convert it first: ``True`` to 1, None to False, 0.5 to True); ``backend`` is ``str``, the
backend request fixed when the graph is traced. The op returns nothing. Its real kernel is the eager call with
``backend=`` the op's backend; its fake runs ``check`` on the tensors' metadata, so a bad argument fails at trace
time with the eager error, and takes an option Dynamo made symbolic (a ``SymInt``) as its value, guarded on: a
new value traces again, as a new page size compiles a new Triton kernel. Dynamo guards on ``backend=`` and on
``dispatch.generation``, which ``kvdispatch.reset()`` bumps, so a function compiled before a reset traces again.
"""

from __future__ import annotations

import inspect
import linecache
import os
from dataclasses import dataclass

import torch

from . import _debug, dispatch
from ._validate import check_flag

NAMESPACE = "kvdispatch"
# Kept alive for the life of the process: dropping a Library removes its ops.
_library = torch.library.Library(NAMESPACE, "FRAGMENT")
# The per-call options every op takes last; they never reach a backend.
_CALL_OPTIONS = ("backend", "enable_pdl")
_SCHEMA_TYPES = {"Tensor": "Tensor", "Tensor | None": "Tensor?", "int": "Scalar", "bool": "Scalar",
                 "int | None": "Scalar?", "bool | None": "Scalar?"}

# Dynamo reads this as a constant True while tracing; in eager mode it is one call returning False.
_compiling = torch.compiler.is_compiling
# ``kvdispatch.host_path``, imported by the first GPU call that may register a replay plan (``run_and_register``).
_host_path = None


@dataclass(frozen=True)
class Op:
    """One declared op.

    key: its name in dispatch, the backends' kernel tables, the grid helper, the bench and the tests.
    public: the public function (``kvdispatch.<name>``); ``name`` its name, also the custom op's.
    parameters: the arguments the backends take, in order (the signature's, without ``backend``/``enable_pdl``).
    outputs: the arguments it writes; ``output_positions`` their indices in ``parameters``.
    code: the op's number in the compiled host path (its place in ``dispatch.OPS``).
    """

    key: str
    name: str
    public: object
    parameters: tuple[str, ...]
    outputs: tuple[str, ...]
    check: object
    check_data: object
    reference: object
    schema: str
    code: int

    @property
    def output_positions(self) -> tuple[int, ...]:
        return tuple(self.parameters.index(name) for name in self.outputs)


def requested_backend(backend, generation):
    """The backend request a graph is traced for. Dynamo calls it while tracing and keeps the result as a
    constant, so ``KVDISPATCH_BACKEND`` is read then and not guarded on.

    ``generation`` is ``dispatch.generation``: passing it makes Dynamo guard on it, so a graph traced
    before ``kvdispatch.reset()`` is not reused after it.
    """
    return dispatch.requested_backend(backend)


# What ``torch.compiler.assume_constant_result`` does, without the import of ``torch._dynamo`` that it starts
# (about a second, more than the rest of ``import kvdispatch`` after torch); tests/test_compile.py checks that
# the two agree.
requested_backend._dynamo_marked_constant = True


def pdl_choice(enable_pdl):
    """The backends' ``pdl`` argument: ``enable_pdl``, or ``KVDISPATCH_PDL`` (``dispatch.pdl_default``) for
    None; anything but a bool or None is a ``TypeError``, before the compiled host path or a backend sees the
    call. Each backend honours it only where the device supports PDL."""
    if enable_pdl is None:
        return dispatch.pdl_default
    check_flag("enable_pdl", enable_pdl, optional=True)
    return enable_pdl


def run_and_register(device, key, backend, args):
    """``dispatch.call`` of op ``key`` on a GPU with ``args`` (``Op.parameters``' values), without PDL or
    ``KVDISPATCH_DEBUG``: unless the compiled host path is known to be unavailable, the call's one launch becomes
    the replay plan of its key (``host_path.call_and_register``), which takes the next such call."""
    global _host_path
    if _host_path is None:
        from . import host_path  # noqa: PLC0415  (import kvdispatch does not import it)

        _host_path = host_path
    if _host_path.failure() is not None:
        dispatch.call(device, key, backend, *args, False)
    else:
        _host_path.call_and_register(key, backend, args, lambda: dispatch.call(device, key, backend, *args, False))


_PUBLIC_SOURCE = '''\
def {name}({signature}):
    pdl = pdl_choice(enable_pdl)  # also while tracing: the schema would refuse a string with its own error
    if _compiling():
        custom_op({traced}, backend=requested_backend(backend, dispatch.generation), enable_pdl=enable_pdl)
        return {result}
    if not pdl and not _debug.ENABLED:
        replay = dispatch.fast_replay
        if replay is not None and replay({code}, backend, {arguments}) is not NotImplemented:
            return {result}
    device = check({checked})
    if _debug.ENABLED:
        check_data({data_checked})
    if pdl or _debug.ENABLED or device.type != "cuda":
        dispatch.call(device, {key!r}, backend, {arguments}, pdl)
    else:
        run_and_register(device, {key!r}, backend, ({arguments},))
    return {result}
'''


def _parameter_source(parameter: inspect.Parameter) -> str:
    return parameter.name if parameter.default is inspect.Parameter.empty else f"{parameter.name}={parameter.default!r}"


def _schema(name: str, signature: inspect.Signature, outputs: tuple[str, ...]) -> str:
    """The custom op's schema (the module docstring's rules), returning nothing."""
    aliases = {output: chr(ord("a") + i) for i, output in enumerate(outputs)}
    items, keyword_only = [], False
    for parameter in signature.parameters.values():
        if parameter.kind is inspect.Parameter.KEYWORD_ONLY and not keyword_only:
            items.append("*")
            keyword_only = True
        if parameter.name == "backend":
            items.append('str backend="auto"')
            continue
        kind = _SCHEMA_TYPES[parameter.annotation]
        if parameter.name in aliases:
            kind = kind.replace("Tensor", f"Tensor({aliases[parameter.name]}!)")
        default = "" if parameter.default is inspect.Parameter.empty else f"={parameter.default!r}"
        items.append(f"{kind} {parameter.name}{default}")
    return f"{name}({', '.join(items)}) -> ()"


def _named_arguments(function, names: tuple[str, ...], keyword: bool) -> str:
    """The call arguments of ``function`` from the values named ``names``: those it takes, in its order."""
    taken = [name for name in inspect.signature(function).parameters if name in names]
    return ", ".join(f"{name}={name}" if keyword else name for name in taken)


def declare(key: str, *, outputs: tuple[str, ...], check, check_data, reference):
    """Declare op ``key`` from the decorated signature (the module docstring): returns its public function."""
    def decorate(stub):
        signature = inspect.signature(stub)
        names = tuple(signature.parameters)
        if names[-2:] != _CALL_OPTIONS:
            raise TypeError(f"{stub.__name__} must end with the keyword options {_CALL_OPTIONS}")
        parameters = names[:-2]
        positional = [p.name for p in signature.parameters.values()
                      if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        keyword = [name for name in parameters if name not in positional]
        code = len(dispatch.OPS)
        namespace = dict(pdl_choice=pdl_choice, _compiling=_compiling, requested_backend=requested_backend,
                         dispatch=dispatch, _debug=_debug, check=check, check_data=check_data,
                         run_and_register=run_and_register)
        source = _PUBLIC_SOURCE.format(
            name=stub.__name__, key=key, code=code, result=outputs[0], arguments=", ".join(parameters),
            signature=", ".join(positional + ["*"] + [_parameter_source(signature.parameters[name])
                                                      for name in keyword + list(_CALL_OPTIONS)]),
            traced=", ".join(positional + [f"{name}={name}" for name in keyword]),
            checked=_named_arguments(check, parameters, keyword=False),
            data_checked=_named_arguments(check_data, parameters, keyword=True))
        # Named inside the package, so that warnings skip its frames as they skip the package's (dispatch), and
        # kept in linecache, so that tracebacks show it.
        filename = os.path.join(os.path.dirname(__file__), f"<generated {stub.__name__}>")
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102  (our own template)
        public = namespace[stub.__name__]
        public.__doc__, public.__module__, public.__qualname__ = stub.__doc__, "kvdispatch", stub.__name__
        public.__signature__ = signature

        schema = _schema(stub.__name__, signature, outputs)
        _library.define(schema)
        _library.impl(stub.__name__, _kernel(public), "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NAMESPACE}::{stub.__name__}", _fake(check, signature), lib=_library)
        namespace["custom_op"] = getattr(getattr(torch.ops, NAMESPACE), stub.__name__)
        dispatch.OPS[key] = Op(key, stub.__name__, public, parameters, tuple(outputs), check, check_data, reference,
                               schema, code)
        return public
    return decorate


def _kernel(public):
    """The custom op on real tensors: the eager call, for the op's backend, which fills the outputs."""
    def kernel(*args, **options):
        public(*args, **options)
    return kernel


def _fake(check, signature: inspect.Signature):
    """The custom op's fake: ``check`` on metadata only (``memory=False``), ``enable_pdl`` checked as the public
    function checks it, and each option Dynamo made symbolic (a ``SymInt`` where the caller passed an int that
    changed between calls) taken as its value, guarded on, so the checks see the Python int the real kernel
    will get."""
    taken = set(inspect.signature(check).parameters)
    positional = [p.name for p in signature.parameters.values() if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    defaults = {p.name: p.default for p in signature.parameters.values()
                if p.name in taken and p.default is not inspect.Parameter.empty}

    def fake(*tensors, backend="auto", enable_pdl=None, **options):
        check_flag("enable_pdl", enable_pdl, optional=True)
        values = dict(defaults, **dict(zip(positional, tensors)))
        values.update((name, int(value) if isinstance(value, torch.SymInt) else value)
                      for name, value in options.items())
        check(**{name: value for name, value in values.items() if name in taken}, memory=False)
    return fake
