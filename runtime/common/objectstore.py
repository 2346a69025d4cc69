"""The checkpoint-storage layer: files of checkpoints and savepoints, on a local (or mounted, shared) filesystem
or in an S3-compatible store.

Every byte of a checkpoint goes through here: task files (channel and operator state, written by the
checkpoint writer thread), state backend snapshots (RocksDB SST and private files, memory tables, remote-state
manifests: runtime/state/files.py), `_metadata` and the retention record (coordinator/storage.py).
A path is either a local path or an `s3://bucket/prefix/...` URL, and each operation (read, write, write_new,
exists, size, list_children, list_tree, upload_file, download_file, delete, remove_tree) picks the implementation from
the path. So a job can checkpoint to a bucket and be restored from a local savepoint, or the other way round.

Object stores have no directories and no rename: a "directory" is a key prefix, a write is one PUT (whole
or not at all: readers never see half an object), and `write_new` is a conditional PUT (`If-None-Match: *`)
that fails when the object exists, so a `_metadata` once written is never replaced. A server that does not
support conditional writes gets check-then-put instead (see `write_new`).

The S3 client is obstore (the `s3` extra): one compiled wheel without Python dependencies, thread-safe, with
both sync and async calls and conditional puts. Its configuration comes from the standard environment
variables: AWS_ENDPOINT_URL (an S3-compatible server; http:// is allowed for it), AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION / AWS_DEFAULT_REGION (default us-east-1).

Blocking calls: run them in a thread off the event loop.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import shutil
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

from runtime.common.files import fsync_directory, write_atomically

S3_SCHEME = "s3://"
_ENDPOINT_VARS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_ENDPOINT")


class ObjectStoreUnavailable(ValueError):
    """An s3:// path was given but the S3 client is not installed, or the URL names no bucket."""


def is_url(path: str) -> bool:
    return path.startswith(S3_SCHEME)


def split_url(url: str) -> tuple[str, str]:
    """`s3://bucket/a/b` -> ("bucket", "a/b"); a bucket name is required, the key may be empty."""
    if not is_url(url):
        raise ObjectStoreUnavailable(f"{url!r} is not an s3:// URL")
    bucket, _, key = url[len(S3_SCHEME):].partition("/")
    if not bucket:
        raise ObjectStoreUnavailable(f"{url!r} names no bucket (expected s3://BUCKET/PREFIX)")
    return bucket, key.strip("/")


def join(base: str, *names: str) -> str:
    return posixpath.join(base, *names) if is_url(base) else os.path.join(base, *names)


def basename(path: str) -> str:
    return posixpath.basename(path.rstrip("/")) if is_url(path) else os.path.basename(os.path.normpath(path))


def dirname(path: str) -> str:
    return posixpath.dirname(path.rstrip("/")) if is_url(path) else os.path.dirname(path)


def absolute(path: str) -> str:
    """A local path made absolute; a URL checked (it must name a bucket) and without a trailing slash. Another
    scheme is refused, not taken for a local directory called `gs:`."""
    if is_url(path):
        bucket, key = split_url(path)
        return f"{S3_SCHEME}{bucket}/{key}" if key else f"{S3_SCHEME}{bucket}"
    scheme = re.match(r"([a-zA-Z][a-zA-Z0-9+.-]*)://", path)
    if scheme:
        raise ObjectStoreUnavailable(f"{path!r}: unsupported storage scheme {scheme.group(1)}:// (s3:// or a "
                                     "local path)")
    return os.path.abspath(path)


def is_within(path: str, root: str) -> bool:
    """Whether URL `path` is `root` or under it (whole path segments: s3://b/ab is not under s3://b/a). Keys
    are not normalised by S3, so a path with `.`, `..` or empty segments is under nothing."""
    if not (is_url(path) and is_url(root)):
        return False
    path, root = path.rstrip("/"), root.rstrip("/")
    if any(part in ("", ".", "..") for part in path[len(S3_SCHEME):].split("/")):
        return False
    return path == root or path.startswith(root + "/")


class OutsideDirectory(ValueError):
    """A checkpoint names a file outside the directory it belongs to (an absolute name, or one with `..`)."""


def confined_join(root: str, relative: Any, *, what: str, error: type[ValueError] = OutsideDirectory) -> str:
    """`relative` (a name recorded in a checkpoint) joined under `root`, or `error` before anything is touched
    when it could name a file elsewhere: not a string, empty, absolute, or with an empty, `.` or `..` segment,
    a backslash or a NUL. The message names `root` and the recorded name only: nothing is read, so nothing is
    said about whatever file the name points at."""
    text = relative if isinstance(relative, str) else ""
    parts = text.split("/")
    if not text or "\\" in text or "\0" in text or any(p in ("", ".", "..") for p in parts) \
            or os.path.isabs(text) or re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", text):
        raise error(f"{root}: refusing {what} {str(relative)[:200]!r}: it is not a name inside this directory")
    return join(root, *parts)


def describe_backend(path: str) -> str:
    return f"object store (bucket {split_url(path)[0]})" if is_url(path) else "local filesystem"


# -- the operations ----------------------------------------------------------------------------------------


def make_dir(path: str) -> None:
    """A local directory is created; an object store needs none (a prefix exists once an object has it)."""
    if is_url(path):
        split_url(path)
        return
    os.makedirs(path, exist_ok=True)


def read(path: str) -> bytes:
    """The whole file or object; FileNotFoundError if it does not exist, OSError for other failures."""
    if not is_url(path):
        with open(path, "rb") as f:
            return f.read()
    store, key = _store_and_key(path)
    import obstore

    try:
        return bytes(obstore.get(store, key).bytes())
    except FileNotFoundError:
        raise FileNotFoundError(2, "No such object", path) from None
    except Exception as exc:
        raise _os_error(path, "cannot read", exc) from None


def write(path: str, data: bytes) -> None:
    """Replace or create the file/object with `data`, atomically (local: temp file, fsync, rename)."""
    if not is_url(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        write_atomically(path, data)
        return
    store, key = _store_and_key(path)
    import obstore

    try:
        obstore.put(store, key, data)
    except Exception as exc:
        raise _os_error(path, "cannot write", exc) from None


def write_new(path: str, data: bytes) -> None:
    """Create the file/object with `data`; FileExistsError if it already exists, and then it is unchanged.

    Object store: a conditional PUT (`If-None-Match: *`), decided by the server, so two writers cannot both
    succeed. A server without conditional writes answers "not supported"; then this checks that the key is
    absent and puts: between the check and the put another writer could slip in (the window is one round
    trip). Sluice has one writer of a checkpoint's `_metadata` (the leading coordinator), so the fallback
    only loses the guarantee against a second coordinator writing the same checkpoint id at that instant.
    Local: written atomically (temp file, rename), after the same check.
    """
    if not is_url(path):
        if os.path.lexists(path):
            raise FileExistsError(17, "File exists", path)
        write(path, data)
        return
    store, key = _store_and_key(path)
    import obstore
    from obstore.exceptions import AlreadyExistsError, NotSupportedError, PreconditionError

    try:
        obstore.put(store, key, data, mode="create")
        return
    except (AlreadyExistsError, PreconditionError):
        raise FileExistsError(17, "Object exists (not overwritten)", path) from None
    except NotSupportedError:
        pass
    except Exception as exc:
        raise _os_error(path, "cannot write", exc) from None
    if exists(path):  # check-then-put: see the docstring for the window this leaves
        raise FileExistsError(17, "Object exists (not overwritten)", path)
    write(path, data)


def exists(path: str) -> bool:
    if not is_url(path):
        return os.path.isfile(path)
    store, key = _store_and_key(path)
    import obstore

    try:
        obstore.head(store, key)
    except FileNotFoundError:
        return False
    except Exception as exc:
        raise _os_error(path, "cannot look up", exc) from None
    return True


def list_children(path: str) -> list[str]:
    """Names directly under a directory/prefix (files and subdirectories); [] if there is none."""
    if not is_url(path):
        try:
            return os.listdir(path)
        except (FileNotFoundError, NotADirectoryError):
            return []
    store, key = _store_and_key(path)
    import obstore

    prefix = key + "/" if key else ""
    try:
        listing = obstore.list_with_delimiter(store, prefix or None)
    except Exception as exc:
        raise _os_error(path, "cannot list", exc) from None
    names = [posixpath.basename(p.rstrip("/")) for p in listing["common_prefixes"]]
    names += [posixpath.basename(o["path"]) for o in listing["objects"]]
    return names


def list_tree(path: str) -> list[str]:
    """Every file under a directory/prefix, as paths relative to it ("a/b.json"), sorted; [] if there is none."""
    if not is_url(path):
        found = []
        for root, _dirs, files in os.walk(path):
            rel = os.path.relpath(root, path)
            found += [f if rel == "." else f"{rel}/{f}" for f in files]
        return sorted(found)
    store, key = _store_and_key(path)
    import obstore

    prefix = key + "/" if key else ""
    try:
        return sorted(o["path"][len(prefix):] for batch in obstore.list(store, prefix or None) for o in batch)
    except Exception as exc:
        raise _os_error(path, "cannot list", exc) from None


def remove_tree(path: str, *, first: str | None = None) -> None:
    """Delete a directory/prefix and everything under it; a missing one is fine. `first` (a name in it) goes
    before the rest, so a removal that stops half-way leaves no such file behind."""
    if not is_url(path):
        if first is not None:
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.unlink(os.path.join(path, first))
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(path)
        return
    store, key = _store_and_key(path)
    if not key:
        raise ValueError(f"refusing to delete the whole bucket {path}")
    import obstore

    try:
        if first is not None:
            with contextlib.suppress(FileNotFoundError):
                obstore.delete(store, f"{key}/{first}")
        keys = [o["path"] for batch in obstore.list(store, key + "/") for o in batch]
        if keys:
            obstore.delete(store, keys)
    except Exception as exc:
        raise _os_error(path, "cannot delete", exc) from None


def upload_file(source: str, path: str) -> int:
    """Copy the local file `source` to `path` durably (local: temp file, fsync, rename; object store: one
    PUT, multipart for large files); returns the bytes copied. A crash leaves the target whole or absent."""
    if not is_url(path):
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        tmp = path + ".uploading"
        with open(source, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
            dst.flush()
            os.fsync(dst.fileno())
            size = dst.tell()
        os.replace(tmp, path)
        fsync_directory(os.path.dirname(path))
        return size
    store, key = _store_and_key(path)
    import obstore

    try:
        obstore.put(store, key, Path(source))
    except Exception as exc:
        raise _os_error(path, "cannot upload to", exc) from None
    return os.path.getsize(source)


def download_file(path: str, target: str) -> None:
    """Copy the file/object at `path` to the local file `target`; FileNotFoundError if it does not exist."""
    if not is_url(path):
        shutil.copyfile(path, target)
        return
    store, key = _store_and_key(path)
    import obstore

    try:
        with open(target, "wb") as out:
            for chunk in obstore.get(store, key):
                out.write(chunk)
    except FileNotFoundError:
        raise FileNotFoundError(2, "No such object", path) from None
    except Exception as exc:
        raise _os_error(path, "cannot download", exc) from None


def size(path: str) -> int | None:
    """The size in bytes of the file/object at `path`, or None if it does not exist."""
    if not is_url(path):
        try:
            return os.path.getsize(path) if os.path.isfile(path) else None
        except FileNotFoundError:
            return None
    store, key = _store_and_key(path)
    import obstore

    try:
        return int(obstore.head(store, key)["size"])
    except FileNotFoundError:
        return None
    except Exception as exc:
        raise _os_error(path, "cannot look up", exc) from None


def delete(path: str) -> None:
    """Delete one file/object; a missing one is fine."""
    if not is_url(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    store, key = _store_and_key(path)
    import obstore

    try:
        obstore.delete(store, key)
    except FileNotFoundError:
        pass
    except Exception as exc:
        raise _os_error(path, "cannot delete", exc) from None


# -- the S3 client -----------------------------------------------------------------------------------------

_stores: dict[str, Any] = {}
_stores_lock = threading.Lock()


def _store_and_key(url: str) -> tuple[Any, str]:
    bucket, key = split_url(url)
    with _stores_lock:
        store = _stores.get(bucket)
        if store is None:
            store = _stores[bucket] = _open_bucket(bucket)
    return store, key


def s3_settings(env: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, Any]:
    """The client options taken from the environment beyond what obstore reads itself: plain http for an
    http:// endpoint (a test server, a MinIO in the cluster), a default region, path-style requests to a custom
    endpoint (most S3-compatible servers want them), and bounded timeouts and retries, so that an unreachable
    store fails a checkpoint in seconds instead of hanging it."""
    endpoint = next((env[v] for v in _ENDPOINT_VARS if env.get(v)), None)
    settings: dict[str, Any] = {
        "client_options": {"allow_http": bool(endpoint and endpoint.startswith("http://")),
                           "connect_timeout": timedelta(seconds=5), "timeout": timedelta(seconds=30)},
        "retry_config": {"max_retries": 3, "retry_timeout": timedelta(seconds=20)},
    }
    if not (env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")):
        settings["region"] = "us-east-1"
    if endpoint:
        settings["endpoint"] = endpoint
        if not env.get("AWS_VIRTUAL_HOSTED_STYLE_REQUEST"):
            settings["virtual_hosted_style_request"] = False
    return settings


def _open_bucket(bucket: str) -> Any:
    try:
        from obstore.store import S3Store
    except ImportError:
        from runtime.common.extras import describe_missing

        raise ObjectStoreUnavailable(describe_missing(["s3"])) from None
    return S3Store(bucket, **s3_settings())


def forget_clients() -> None:
    """Drop cached clients (tests change the endpoint between servers)."""
    with _stores_lock:
        _stores.clear()


def _os_error(path: str, what: str, exc: BaseException) -> OSError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return OSError(f"{what} {path}: {first}")


def check_reachable(url: str) -> None:
    """List the prefix once: OSError, in one line, when the bucket does not exist or the store cannot be
    reached or refuses the credentials (for a check at start-up)."""
    store, key = _store_and_key(url)
    import obstore

    try:
        obstore.list_with_delimiter(store, key + "/" if key else None)
    except Exception as exc:
        raise OSError(f"object store {url}: {s3_error_reason(str(exc))}") from None


def s3_error_reason(text: str) -> str:
    """The S3 error code and message of an obstore error (whose text runs to dozens of lines), or the HTTP
    status, or the start of its first line."""
    code = re.search(r"<Code>([^<]+)</Code>", text)
    if code:
        message = re.search(r"<Message>([^<]*)</Message>", text)
        bucket = re.search(r"<BucketName>([^<]*)</BucketName>", text)
        return (f"{code.group(1)}" + (f": {message.group(1)}" if message else "")
                + (f" ({bucket.group(1)})" if bucket else ""))
    unreachable = re.search(r"(connection refused|timed out|dns error[^\n,)]*|connection reset)", text, re.I)
    if unreachable:
        endpoint = re.search(r"(https?://[^/\s]+)", text)
        return f"cannot reach {endpoint.group(1) if endpoint else 'the endpoint'}: {unreachable.group(1)}"
    status = re.search(r"status code: (\d{3}[^:<]*)", text)
    if status:
        return f"HTTP {status.group(1).strip()}"
    first = text.strip().splitlines()[0] if text.strip() else "unknown error"
    return first if len(first) <= 200 else first[:200] + "..."
