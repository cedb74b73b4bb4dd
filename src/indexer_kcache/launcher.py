"""One host path for every op: a declaration, a checked plan, kernel launches.

An op is declared by decorating a function whose signature is the op's (names, types,
defaults, keyword-only options) and whose docstring documents it; the decorator returns
the public callable and registers the ``torch.library`` op of the same name::

    @declare_op(check=check_store, run=run_store, mutates=("k_cache",),
                token_dims={"k_pre": (0,), "positions": (0,), "kv_slot_mapping": (0,)})
    def indexer_k_norm_rope_store(k_pre: torch.Tensor, ...) -> None:
        '''RMS-norm -> RoPE -> quantize -> paged store ...'''

The op itself is three functions of ``call``, a named tuple of the arguments
(``call.k_pre``):

* ``check(call) -> plan``: checks every argument, raising ``TypeError`` / ``ValueError`` /
  ``NotImplementedError`` that names it, and returns a frozen dataclass of everything the
  arguments' metadata and options fix (formats, layout, strides, launch options);
* ``run(plan, call)``: the reference, or launches of ``Kernel``s with keyword arguments;
* ``fake(plan, call)`` (optional): the outputs' shapes for tracing (default: no output).

A call then flows:

1. a plain eager call (``fast_path.plain_eager``) runs the implementation directly;
   anything else (torch.compile, fake tensors, dispatch modes) goes through the
   ``torch.library`` op, whose implementation is the same; the options' Python types are
   checked first (the schema would convert some: None to a bool), and where the schema
   rejects an argument's type, ``check`` runs to name the argument;
2. the implementation looks up the plan kept for the call's options (the non-tensor
   arguments and their types) and its tensors' metadata (type, dtype, device, strides,
   sizes except the ``token_dims``), or runs ``check`` and keeps the plan. A plain eager
   call first tries the last such call's plan: taken when every option is the very
   object the last call passed and the plan's guard passes the tensors (ops without
   optional tensors);
3. ``run(plan, call)`` launches: a ``Kernel``'s ``KernelLaunch`` (one per plan and launch
   setting) holds the arguments the plan fixes; the first launch of each specialisation
   goes through Triton (which compiles), later ones call the compiled kernel directly.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import sys
import typing
from collections.abc import Callable, Iterator, Sequence
from operator import itemgetter

import torch

from . import checks, fast_path
from .kernels import INTERPRETED

NAMESPACE = "indexer_kcache"
MAX_GRID_Y = 65535  # CUDA's limit on a grid's second (and third) dimension
LIBRARY = torch.library.Library(NAMESPACE, "DEF")
_EMPTY = object()


# ------------------------------------------------------------------------------ plans
class PlanCache:
    """Plans by options (a hashable tuple), then by a guard on the tensors' metadata.

    ``token_dims[i]`` lists the dimensions of tensor ``i`` whose sizes a plan leaves free.
    """

    def __init__(self, token_dims: Sequence[Sequence[int]], max_per_options: int = 32) -> None:
        self.token_dims = token_dims
        self.max_per_options = max_per_options
        self.plans: dict[tuple, list] = {}
        # The last plain eager call's (plan, guard check, option values...), or None: the
        # entry of an op without optional tensors tries it first (see _entry).
        self.last: list = [None]
        fast_path.on_switch(self.clear)

    def find(self, options: tuple, tensors: tuple):
        """The plan kept for these options and tensors, or None."""
        try:
            candidates = self.plans.get(options, ())
        except TypeError:  # an unhashable option: never kept
            return None
        for guard, plan in candidates:
            if guard.check(*tensors):
                return plan
        return None

    def keep(self, options: tuple, tensors: tuple, plan):
        """Keep ``plan`` (of a call that passed every check) for these options and tensors;
        return its guard (None where the call's metadata is not kept)."""
        sizes = [list(t.shape) for t in tensors]
        for t, dims, t_sizes in zip(tensors, self.token_dims, sizes, strict=True):
            if dims and t.dim() == 1 and t.stride() != (1,):
                # A vector of zero or one element may have any stride; a guard fixing it
                # would let a longer vector with that stride skip the checks.
                return None
            for d in dims:
                t_sizes[d] = None
        guard = fast_path.guard_class()(*tensors, dynamic_dims_sizes=sizes,
                                        dynamic_dims_strides=[list(t.stride()) for t in tensors])
        if not guard.check(*tensors):
            # Would never be found (the native guard compares dispatch keys under the
            # thread's current modes): leave such calls to the full checks.
            return None
        try:
            candidates = self.plans.setdefault(options, [])
        except TypeError:
            return None
        if len(candidates) >= self.max_per_options:
            del candidates[0]  # the oldest
        candidates.append((guard, plan))
        return guard

    def clear(self) -> None:
        self.plans.clear()
        self.last[0] = None

    def __len__(self) -> int:
        return sum(len(candidates) for candidates in self.plans.values())


# --------------------------------------------------------------------------------- ops
class Op:
    """A declared op: its public entry point, torch.library op and plan cache."""

    def __init__(self, declaration: Callable, *, check: Callable, run: Callable,
                 fake: Callable | None, mutates: Sequence[str],
                 token_dims: dict[str, tuple[int, ...]]) -> None:
        self.name = declaration.__name__
        self.check, self.run, self.fake = check, run, fake
        signature = inspect.signature(declaration)
        names = list(signature.parameters)
        _check_generated_names(self.name, names, reserved=("type",))
        self.Call = collections.namedtuple(f"{self.name}_call", names)
        # The torch.library schema, from the declared signature. Ints stay ints: every one
        # of them selects a format or a layout, which the kernels are specialised on.
        schema = torch.library.infer_schema(declaration, mutates_args=tuple(mutates))
        LIBRARY.define(self.name + schema.replace("SymInt", "int"))
        self.torch_op = getattr(getattr(torch.ops, NAMESPACE), self.name).default
        arguments = self.torch_op._schema.arguments
        tensor_kinds = {a.name: str(a.type) for a in arguments if "Tensor" in str(a.type)}
        self._positional = [i for i, a in enumerate(arguments) if not a.kwarg_only]
        self._keywords = [(i, a.name) for i, a in enumerate(arguments) if a.kwarg_only]
        required = [i for i, n in enumerate(names) if tensor_kinds.get(n) == "Tensor"]
        optional = [i for i, n in enumerate(names) if tensor_kinds.get(n) == "Optional[Tensor]"]
        other = [i for i in range(len(names)) if names[i] not in tensor_kinds]
        self._tensors = _getter(required)
        self._optional = _getter(optional) if optional else None
        self._options = _getter(other)
        self._tensor_names = [names[i] for i in required]
        self._optional_names = [names[i] for i in optional]
        self.plans = PlanCache([token_dims.get(n, ()) for n in self._tensor_names])
        self._token_dims = token_dims
        self.tensor_positions, self.option_positions = required, other
        self._option_checks = _option_checks(declaration, [(i, names[i]) for i in other])
        self._mutated = [(names.index(name), name) for name in mutates]
        self.bind = _binder(self.name, signature, self.Call, lambda call: call)
        self.entry = _entry(self, signature)
        functools.update_wrapper(self.entry, declaration)
        self.entry.op = self
        LIBRARY.impl(self.name, self._impl, "CompositeExplicitAutograd")
        torch.library.register_fake(f"{NAMESPACE}::{self.name}", self._fake, lib=LIBRARY)

    # The ways in: the public entry (see ``_entry``), and the torch.library op's
    # implementation and fake.
    def check_option_types(self, call) -> None:
        """The options' Python types, as the op's checks take them. The op's schema would
        convert some values instead of refusing them (None or a 0-d tensor to a bool, True
        to an int, a tensor to a float) before its checks could see them. (A value of the
        exact type named costs a set lookup; any other meets the full check.)"""
        for index, exact, check in self._option_checks:
            value = call[index]
            if type(value) not in exact:
                check(value)

    def check_mutated_views(self, call) -> None:
        """A tensor the op writes may not be a lazily negated or conjugated view (the
        dispatcher cannot hand its bytes to the op; a kernel would write them unnegated)."""
        for index, name in self._mutated:
            t = call[index]
            if isinstance(t, torch.Tensor) and (t.is_neg() or t.is_conj()):
                checks.fail_value(name, "a tensor without the lazy negation or conjugation bit "
                                  "(the op writes its bytes)", "a view with it")

    def through_op(self, call):
        """Call the torch.library op (it runs ``implementation`` or, tracing, ``_fake``)."""
        self.check_option_types(call)
        self.check_mutated_views(call)
        args = [call[i] for i in self._positional]
        kwargs = {name: call[i] for i, name in self._keywords}
        try:
            return self.torch_op(*args, **kwargs)
        except RuntimeError:
            # The schema rejects a wrong argument type with a bare RuntimeError before
            # anything runs; name the argument instead.
            self.check(call)
            raise

    def _impl(self, *args, **kwargs):
        return self.implementation(self.bind(*args, **kwargs))

    def _fake(self, *args, **kwargs):
        call = self.bind(*args, **kwargs)
        plan = self.check(call)
        return None if self.fake is None else self.fake(plan, call)

    def implementation(self, call, tensors: tuple | None = None, options: tuple | None = None):
        """Find or make the call's plan, then run it. The public entry passes the call's
        tensors and options (non-tensor arguments, then their types) as it has them; a plain
        eager call whose tensors are not all plain goes through the op after all."""
        eager = options is not None
        if options is None:
            options = self._options(call)
            options += tuple(map(type, options))
            tensors = self._tensors(call)
        token_dims = None
        if self._optional is not None:  # which optional tensors are given is an option
            given = self._optional(call)
            options += tuple(t is None for t in given)
            tensors += tuple(t for t in given if t is not None)
            token_dims = self._plan_token_dims(given)
        plans = self.plans
        plan = found = None
        try:
            for found, kept in plans.plans.get(options, ()):  # PlanCache.find, inlined
                if found.check(*tensors):
                    plan = kept
                    break
        except TypeError:  # an unhashable option: never kept
            pass
        if plan is None:
            plain = fast_path.plain_tensors(tensors)
            if eager and not plain:
                return self.through_op(call)
            self.check_option_types(call)  # first, as on the way through the op
            plan = self.check(call)
            if token_dims is not None:
                plans.token_dims = token_dims
            # A plan of other tensors (a subclass inside the op) is not kept: a later eager
            # call with them must go through the op again.
            found = plans.keep(options, tensors, plan) if plain else None
        if eager and found is not None and self._optional is None:
            plans.last[0] = (plan, found.check, *options[:len(self.option_positions)])
        return self.run(plan, call)

    def _plan_token_dims(self, given) -> list:
        names = self._tensor_names + [n for n, t in zip(self._optional_names, given, strict=True)
                                      if t is not None]
        return [self._token_dims.get(n, ()) for n in names]


def _option_checks(declaration: Callable, options: list[tuple[int, str]]) -> list:
    """(index, exact types that pass at once, check) of the declared options whose values
    the schema would convert: bools, ints, floats and strs (each optionally None), by their
    annotations. Ints always meet their check (its int64 range)."""
    hints = typing.get_type_hints(declaration)
    found = []
    for index, name in options:
        hint = hints.get(name)
        allow_none = type(None) in typing.get_args(hint)
        kinds = {k for k in (typing.get_args(hint) or (hint,)) if k is not type(None)}
        exact = frozenset(kinds | ({type(None)} if allow_none else set())) - {int}
        if kinds == {bool}:
            found.append((index, exact, functools.partial(checks.check_flag, name,
                                                          allow_none=allow_none)))
        elif kinds == {int}:
            found.append((index, exact, functools.partial(checks.check_int, name,
                                                          allow_none=allow_none)))
        elif kinds == {float}:
            found.append((index, exact, functools.partial(checks.check_real, name,
                                                          allow_none=allow_none)))
        elif kinds == {str}:  # the schema would take bytes as a str
            found.append((index, exact, functools.partial(checks.check_text, name,
                                                          allow_none=allow_none)))
    return found



def _getter(indices: list[int]) -> Callable[[tuple], tuple]:
    """A fast ``lambda call: tuple(call[i] for i in indices)``."""
    if len(indices) == 1:
        index = indices[0]
        return lambda call: (call[index],)
    if not indices:
        return lambda call: ()
    return itemgetter(*indices)


def _binder(name: str, signature: inspect.Signature, call_type, then: Callable) -> Callable:
    """A function with ``signature`` that passes its arguments, as a ``call_type`` named
    tuple, to ``then``. Generated once, so that Python binds the arguments (defaults,
    keywords) at the speed of a plain call."""
    namespace = {"_then": then}
    source = (f"def {name}({_parameters(signature, namespace)}):\n"
              f"    return _then({_named_tuple(signature, call_type, namespace)})\n")
    exec(source, namespace)  # noqa: S102 (generated from the declared signature)
    return namespace[name]


def _entry(op: Op, signature: inspect.Signature) -> Callable:
    """The public function of ``op``: with the declared signature, generated once so that
    the way in costs a plain call. A call made while torch.compile traces goes straight to
    the torch.library op, in code the tracer reads plainly; a plain eager call to the
    implementation; anything else through the op."""
    namespace = {"_op": op.torch_op, "_compiling": torch.compiler.is_compiling,
                 "_check_options": op.check_option_types,
                 "_fp": fast_path, "_implementation": op.implementation,
                 "_through_op": op.through_op, "_last": op.plans.last, "_run": op.run}
    params = list(signature.parameters.values())
    op_args = ", ".join(p.name if p.kind is not p.KEYWORD_ONLY else f"{p.name}={p.name}"
                        for p in params)
    tensors = ", ".join(p.name for i, p in enumerate(params) if i in op.tensor_positions)
    option_names = [p.name for i, p in enumerate(params) if i in op.option_positions]
    options = ", ".join(option_names + [f"type({name})" for name in option_names])
    call = _named_tuple(signature, op.Call, namespace)
    lines = [f"def {op.name}({_parameters(signature, namespace)}):",
             "    if _compiling():",
             f"        _check_options({call})",
             f"        return _op({op_args})",
             f"    if {fast_path.PLAIN_EAGER_SOURCE.format(fp='_fp')}:"]
    if op._optional is None:
        # The last eager call's plan, if every option is the very object it was (``is``:
        # no 1 for True, no 1.0 for 1) and its guard passes the tensors.
        same = " and ".join(f"{name} is _l[{i + 2}]" for i, name in enumerate(option_names))
        lines += ["        _l = _last[0]",
                  f"        if _l is not None and {same or 'True'} and _l[1]({tensors}):",
                  f"            return _run(_l[0], {call})"]
    lines += [f"        return _implementation({call}, ({tensors},), ({options},))",
              f"    return _through_op({call})"]
    source = "\n".join(lines) + "\n"
    exec(source, namespace)  # noqa: S102 (generated from the declared signature)
    return namespace[op.name]


def _check_generated_names(owner: str, names: list[str], reserved: tuple[str, ...]) -> None:
    """The generated functions use names of their own that start with ``_`` and the
    ``reserved`` ones: parameter names must not."""
    clashing = [n for n in names if n.startswith("_") or n in reserved]
    if clashing:
        raise TypeError(f"{owner}: parameter names {clashing} clash with the generated code's "
                        f"names (none may start with '_' or be one of {list(reserved)})")


def _parameters(signature: inspect.Signature, namespace: dict) -> str:
    """The parameter list of ``signature`` as source, defaults taken from ``namespace``."""
    params, star = [], False
    namespace["_defaults"] = {p.name: p.default for p in signature.parameters.values()}
    for p in signature.parameters.values():
        if p.kind is p.KEYWORD_ONLY and not star:
            params.append("*")
            star = True
        params.append(p.name if p.default is p.empty else f"{p.name}=_defaults[{p.name!r}]")
    return ", ".join(params)


def _named_tuple(signature: inspect.Signature, call_type, namespace: dict) -> str:
    """Source building a ``call_type`` from the parameters of ``signature``."""
    namespace.update(_new=tuple.__new__, _Call=call_type)
    return f"_new(_Call, ({', '.join(signature.parameters)},))"


def declare_op(*, check: Callable, run: Callable, fake: Callable | None = None,
               mutates: Sequence[str] = (), token_dims: dict[str, tuple[int, ...]] | None = None
               ) -> Callable[[Callable], Callable]:
    """Declare an op from a signature-and-docstring function (see the module docstring).

    ``mutates`` names the tensors the op writes in place; ``token_dims`` the dimensions of
    tensors whose sizes a kept plan does not fix (the token or row counts of a call): a
    plan holds for any such size, so ``run`` must not rely on them being what ``check``
    saw, and must re-check any limit between them.
    """
    def declare(declaration: Callable) -> Callable:
        return Op(declaration, check=check, run=run, fake=fake, mutates=mutates,
                  token_dims=token_dims or {}).entry
    return declare


# ----------------------------------------------------------------------------- kernels
class KernelLaunch:
    """One kernel as one plan and one launch setting launch it: the arguments they fix (by
    name: compile-time constants, strides, sizes), warps, stages and compile options, and
    the compiled kernel of each specialisation of the per-call arguments.

    Launched through ``launch`` (what ``Kernel.launch`` returns): a function of the grid
    and the per-call arguments by keyword, generated with those names as its keyword-only
    parameters, so that a call passes them without building a dict. It hands them to
    ``self.run``: Triton's own launch at first, and on a GPU with the fast path on, from the
    first launch, a function generated for these arguments (``direct_launcher``) that
    launches the compiled kernel itself."""

    def __init__(self, kernel: Kernel, device: torch.device, *, num_warps: int,
                 num_stages: int | None = None, options: dict | None = None, **fixed) -> None:
        self.kernel = kernel
        self.device_index = device.index if device.type == "cuda" else None
        # Fused multiply-adds unless the options say otherwise (the store's, for the
        # reference's rounding): Triton's default through 3.9, named so that it holds on
        # every version (3.9 warns when it is left to the default, which 3.10 turns off).
        self.launch_options = {"num_warps": num_warps, "enable_fp_fusion": True, **(options or {})}
        if num_stages is not None:
            self.launch_options["num_stages"] = num_stages
        unknown = set(fixed) - set(kernel.names)
        if unknown:
            raise TypeError(f"{kernel.fn.__name__}: no parameters {sorted(unknown)}")
        self.fixed = fixed
        self.per_call = [name for name in kernel.names if name not in fixed]
        _check_generated_names(kernel.fn.__name__, kernel.names, reserved=("grid", "args"))
        self.compiles = not INTERPRETED and self.device_index is not None
        self.compiled: dict[tuple, object] = {}
        self.run: Callable[..., None] = self.first_launch  # run(grid, *per_call values)
        self.launch = _keyword_launch(self)

    def first_launch(self, grid: tuple[int, ...], *values) -> None:
        """Launch on ``grid`` with the per-call arguments in ``self.per_call`` order; where
        kernels compile and the fast path is on, make ``self.run`` the direct launcher for
        arguments of these types and launch through it."""
        if not (self.compiles and fast_path._enabled):
            self.triton_launch(grid, values)
            return
        self.run = direct_launcher(self, self._by_name(values))
        self.run(grid, *values)

    def _by_name(self, values: tuple) -> dict:
        return dict(zip(self.per_call, values, strict=True))

    def triton_launch(self, grid, values: tuple):
        """Triton's own launch (compiling on first use), on the kernel's device; returns the
        compiled kernel."""
        per_call = self._by_name(values)
        if self.device_index is None or self.device_index == torch.cuda.current_device():
            return self.kernel.fn[grid](**self.fixed, **per_call, **self.launch_options)
        with torch.cuda.device(self.device_index):
            return self.kernel.fn[grid](**self.fixed, **per_call, **self.launch_options)


Launch = Callable[..., None]  # launch(grid, **per_call arguments): see KernelLaunch


def _keyword_launch(state: KernelLaunch) -> Launch:
    """``launch(grid, *, <per-call names>)`` calling ``state.run``; the function carries
    ``state`` as ``launch.state``."""
    names = state.per_call
    namespace = {"_state": state}
    keywords = f", *, {', '.join(names)}" if names else ""
    source = (f"def launch(grid{keywords}):\n"
              f"    _state.run(grid, {', '.join(names)})\n")
    exec(source, namespace)  # noqa: S102 (generated from the kernel's parameter names)
    launch = namespace["launch"]
    launch.state = state
    return launch


def _pack_source(kernel: Kernel, fixed: dict, example: dict, namespace: dict
                 ) -> tuple[list[str], str, str, str]:
    """Source pieces that turn the per-call arguments (``example`` by name) into the
    kernel's arguments: (lines binding each tensor's address to ``_<name>``, the condition
    of the common key, the full key, all the kernel's arguments in order). The key is what
    Triton's specialisation sees of the per-call arguments (a pointer's 16-byte alignment;
    an int's width and, unless the kernel says ``do_not_specialize``, whether it is 1 or a
    multiple of 16), ``True`` in the common case of aligned pointers and unspecialised
    32-bit ints. Fixed values go into ``namespace``."""
    missing = set(kernel.names) - set(fixed) - set(example)
    if missing:
        raise TypeError(f"{kernel.fn.__name__}: missing arguments {sorted(missing)}")
    lines, key, args, pointers, common = [], [], [], [], []
    for name in kernel.names:
        if name in fixed:
            value = fixed[name]  # a fixed tensor (never read) stays alive in ``fixed``
            namespace[f"_{name}"] = value.data_ptr() if isinstance(value, torch.Tensor) else value
            args.append(f"_{name}")
            continue
        value = example[name]
        if isinstance(value, torch.Tensor):
            lines.append(f"_{name} = {name}.data_ptr()")
            key.append(f"_{name} & 15 == 0")
            pointers.append(f"_{name}")
            args.append(f"_{name}")
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            width = f"-0x80000000 <= {name} <= 0x7FFFFFFF"
            key.append(width)
            if kernel.specialise[name]:
                key.append(f"{name} == 1, {name} & 15 == 0")
                common.append("False")
            else:
                common.append(width)
        # floats and bools: Triton's type for them does not depend on the value
        args.append(name)
    if pointers:
        common.append(f"({' | '.join(pointers)}) & 15 == 0")
    return lines, " and ".join(common) or "True", f"({', '.join(key)},)", ", ".join(args)


def direct_launcher(state: KernelLaunch, example: dict) -> Callable[..., None]:
    """``run(grid, *per_call)`` for per-call arguments of the types in ``example``: the
    compiled kernel of the call's specialisation launched as ``fast_path.launch_compiled``
    does, in one generated function (an eager call's host time is mostly Python calls);
    Triton's own launch where nothing is compiled for the key yet (it compiles), and when
    the fast path is off."""
    namespace = {"_fp": fast_path, "_compiled": state.compiled, "_device": state.device_index,
                 "_triton": state.triton_launch, "_runtime": fast_path.knobs.runtime,
                 "_Chain": fast_path.HOOK_CHAIN}
    lines, common, key, args = _pack_source(state.kernel, state.fixed, example, namespace)
    values = ", ".join(state.per_call)
    as_tuple = f"({values},)" if values else "()"
    # The hooks as fast_path.installed_hook reads them, inline.
    hooks = [f"{name} = _runtime.launch_{name}_hook\n    if {name} is not None and "
             f"isinstance({name}, _Chain) and not {name}.calls:\n        {name} = None"
             for name in ("enter", "exit")]
    body = [
        "if not _fp._enabled:",
        f"    _triton(grid, {as_tuple})",
        "    return",
        *lines,
        f"compiled = _compiled.get(True if {common} else {key})",
        "if compiled is None:",
        f"    _compiled[True if {common} else {key}] = _triton(grid, {as_tuple})",
        "    return",
        "if len(grid) != 3:",
        "    grid = (tuple(grid) + (1, 1))[:3]",
        "if _device != _fp.current_device():",
        f"    _fp.launch_compiled(compiled, _device, grid, ({args},))",
        "    return",
        "stream = _fp.current_stream(_device)",
        *hooks,
        f"metadata = None if enter is None else compiled.launch_metadata(grid, stream, {args})",
        "compiled.run(grid[0], grid[1], grid[2], stream, compiled.function,",
        "             compiled.packed_metadata, metadata, enter, exit,",
        f"             {args})",
    ]
    source = f"def run(grid, {values}):\n" + "".join(f"    {b}\n" for b in body)
    exec(source, namespace)  # noqa: S102 (generated from the kernel's parameter names)
    return namespace["run"]


class Kernel:
    """A Triton kernel as the host path sees it: its parameter names and which per-call
    arguments Triton specialises on."""

    def __init__(self, fn) -> None:
        self.fn = fn
        self.names = list(fn.arg_names)
        params = getattr(fn, "params", None)
        if params is not None:
            self.specialise = {p.name: not p.do_not_specialize for p in params}
        else:  # an interpreted kernel keeps its jit options in ``kwargs``
            unspecialised = set(getattr(fn, "kwargs", {}).get("do_not_specialize") or ())
            self.specialise = {name: name not in unspecialised for name in self.names}

    def launch(self, device: torch.device, **settings) -> Launch:
        """The launch function of this kernel as ``settings`` fix it (see ``KernelLaunch``)."""
        return KernelLaunch(self, device, **settings).launch


def tunable(choose: Callable) -> Callable:
    """Mark a module-level launch-settings function as replaceable for a while, by tuning
    scripts and tests: ``with store_settings.override(setting): ...`` makes it return that
    setting (or, given a function, what the function returns). The override swaps the
    module's global for the duration, so normal calls pay nothing for the possibility."""
    module = sys.modules[choose.__module__]

    @contextlib.contextmanager
    def override(replacement) -> Iterator[None]:
        before = getattr(module, choose.__name__)
        replaced = replacement if callable(replacement) else lambda *args, **kwargs: replacement
        replaced.override = override
        setattr(module, choose.__name__, replaced)
        try:
            yield
        finally:
            setattr(module, choose.__name__, before)

    choose.override = override
    return choose
