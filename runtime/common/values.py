"""Any Python value in records and state: msgpack for the types it knows, pickle (marked) for the rest.

msgpack stays the format: its C packer and unpacker handle None, bools, ints, floats, str, bytes, lists, tuples
and dicts without calling back into Python, so the keyed-count path costs what it did. A value msgpack does not
know (a datetime, a Decimal, a set, a dataclass) reaches the packer's `default` hook, which pickles it into an
extension type of code PICKLE_EXT; the unpacker's `ext_hook` loads it again. A value pickle refuses too (a lock,
a generator, a local function) is an `UnpicklableValue` the first time it is met, naming who emitted or stored it
and its type; it is unrecoverable (a restart would meet it again), so the job fails at once.

The trust boundary. Frames come only from peers that presented the cluster token (and, with TLS, a certificate
of the cluster's CA); checkpoint files come from the checkpoint storage, which whoever can write it can forge
(runtime/common/checksums.py says why checksums do not stop that). So nothing is loaded with plain
`pickle.loads`: `RestrictedUnpickler` resolves only classes, never functions or modules, and only classes of an
allowlist of standard-library value types or classes defined in the job's own code (a module outside the
standard library and site-packages: what the job module imports from its directory or PYTHONPATH). A class
of an installed package is refused with one line saying so (allow its module with SLUICE_PICKLE_MODULES, a
comma-separated list of module names, set on every worker; an allowed module is trusted whole, functions
included: numpy's scalars, for one, load through `numpy.core.multiarray.scalar`). What a forger could do with
a frame or a file is then what the job's own value classes do when constructed, not run any callable of the
interpreter.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import io
import os
import pickle
import sys
import sysconfig
from typing import Any

import msgpack

PICKLE_EXT = 2  # 1 is the state codec's tuple marker (runtime/state/codec.py)
PICKLE_PROTOCOL = 5
ALLOW_ENV = "SLUICE_PICKLE_MODULES"

# standard-library classes that are plain values: (module, class name)
_STDLIB_VALUES = frozenset({
    ("builtins", n) for n in ("set", "frozenset", "complex", "bytearray", "range", "slice", "object")} | {
    ("datetime", n) for n in ("datetime", "date", "time", "timedelta", "timezone", "tzinfo")} | {
    ("decimal", "Decimal"), ("fractions", "Fraction"), ("uuid", "UUID"), ("uuid", "SafeUUID"),
    ("collections", "OrderedDict"), ("collections", "deque"), ("collections", "Counter"),
    ("ipaddress", "IPv4Address"), ("ipaddress", "IPv6Address"), ("ipaddress", "IPv4Network"),
    ("ipaddress", "IPv6Network"), ("pathlib", "PurePosixPath"), ("pathlib", "PureWindowsPath"),
    ("zoneinfo", "ZoneInfo"), ("copyreg", "_reconstructor"),
})
_OWN_PACKAGES = frozenset({"runtime", "coordinator", "netstack"})  # the runtime's classes are not values
# ...except the few value classes the runtime itself emits as records (plain frozen dataclasses of values)
_RUNTIME_VALUES = frozenset({("runtime.connectors.kafka_core", "MalformedKafkaRecord")})
_VALUE_CLASSES = _STDLIB_VALUES | _RUNTIME_VALUES


class UnpicklableValue(TypeError):
    """A value that neither msgpack nor pickle can carry: no restart changes it, so the job fails at once."""

    unrecoverable = True


class RefusedPickle(pickle.UnpicklingError):
    """A pickled value names a class that may not be loaded (see the module docstring)."""

    unrecoverable = True


def _default(owner: str, obj: Any) -> msgpack.ExtType:
    try:
        return msgpack.ExtType(PICKLE_EXT, pickle.dumps(obj, protocol=PICKLE_PROTOCOL))
    except Exception as exc:
        kind = type(obj)
        raise UnpicklableValue(f"{owner}: a value of type {kind.__module__}.{kind.__qualname__} cannot be sent "
                               f"or stored: msgpack does not know it and pickle refuses it "
                               f"({type(exc).__name__}: {exc})") from None


def packer_default(owner: str) -> Any:
    """msgpack's `default` hook for values emitted or stored by `owner` (an operator's name, a state)."""
    return functools.partial(_default, owner)


def unpack_ext(code: int, data: bytes) -> Any:
    """msgpack's `ext_hook`: a pickled value loaded through the restricted unpickler; other codes as they are."""
    if code == PICKLE_EXT:
        return loads(data)
    return msgpack.ExtType(code, data)


def loads(data: bytes) -> Any:
    return RestrictedUnpickler(io.BytesIO(data)).load()


@functools.cache
def _system_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {os.path.realpath(paths[k]) for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    return tuple(sorted(d + os.sep for d in dirs))


@functools.cache
def _allowed_modules() -> frozenset[str]:
    return frozenset(m.strip() for m in os.environ.get(ALLOW_ENV, "").split(",") if m.strip())


def _is_job_module(name: str) -> bool:
    """A module of the job's own code: loaded from a file outside the standard library and site-packages."""
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    if not file:
        return False
    return not os.path.realpath(file).startswith(_system_dirs())


class RestrictedUnpickler(pickle.Unpickler):
    """Loads classes only: allowlisted standard-library value types, and classes of the job's own modules."""

    def find_class(self, module: str, name: str) -> Any:
        if "." not in name and _may_load(module, name):
            found = getattr(importlib.import_module(module), name, None)
            # a class defined where it is named: not one a job module imported (`from subprocess import Popen`);
            # a module the operator allowed is trusted whole (numpy's scalars load through a function of it)
            if (module, name) in _VALUE_CLASSES \
                    or (isinstance(found, type) and found.__module__ == module) \
                    or (found is not None and module in _allowed_modules()):
                return found
        raise RefusedPickle(f"refusing to load {module}.{name} from a pickled value: only standard-library value "
                            f"types and classes of the job's own modules are loaded (allow a module with {ALLOW_ENV})")


def _may_load(module: str, name: str) -> bool:
    if (module, name) in _VALUE_CLASSES or module in _allowed_modules():
        return True
    top = module.split(".")[0]
    if top in sys.stdlib_module_names or top in _OWN_PACKAGES:
        return False
    if module not in sys.modules:
        try:  # a worker imports the job module at deploy, so this is rare: a class of a module imported lazily
            spec = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            return False
        if spec is None or not spec.origin or os.path.realpath(spec.origin).startswith(_system_dirs()):
            return False
        importlib.import_module(module)
    return _is_job_module(module)
