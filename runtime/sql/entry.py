"""A SQL script as a job entry point (`runtime.sql.entry:script_<text>`), so the coordinator and every worker
rebuild the job from the script itself, as they import a job module: the text travels inside the entry,
compressed, and a restart never reads a file that may have changed since the submission."""

from __future__ import annotations

import base64
import zlib
from collections.abc import Callable

from runtime.api import Job

MODULE = "runtime.sql.entry"
PREFIX = "script_"


def entry_for(text: str) -> str:
    """The job entry of a script: 'runtime.sql.entry:script_<zlib + urlsafe base64 of the text>'."""
    packed = base64.urlsafe_b64encode(zlib.compress(text.encode("utf-8"), 9)).decode("ascii").rstrip("=")
    return f"{MODULE}:{PREFIX}{packed}"


def script_of(name: str) -> str:
    packed = name[len(PREFIX):]
    return zlib.decompress(base64.urlsafe_b64decode(packed + "=" * (-len(packed) % 4))).decode("utf-8")


def __getattr__(name: str) -> Callable[[Job], None]:
    if not name.startswith(PREFIX):
        raise AttributeError(name)
    text = script_of(name)

    def build(job: Job) -> None:
        job.sql(text)
    return build
