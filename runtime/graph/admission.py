"""What a submitted job needs from the install and the machine, checked once at submit.

A job that cannot run here should be refused when it is submitted, with the one line that says what to do,
not fail on every worker and restart until its attempts run out. Three checks:

- extras: the job's sources and sinks name the install's extras they need (`Source.extras`, `Sink.extras`),
  its state backend too (its descriptor names the extra), and a restore from s3:// needs the `s3` extra;
- connectors: a source or sink with `check_at_submit(context)` checks what it will use against its system
  (a path it can write, a catalog and table, a database's table and privileges, a broker and its topics, a
  transaction timeout that fits the checkpoint interval) and raises ValueError, RuntimeError or OSError with
  one line; network I/O, so the coordinator runs it on a thread;
- earlier output: a FileSink directory that already holds visible files (the output of an earlier run) is
  refused for a new job, unless the sink says `if_exists="append"`; a restore goes on writing where the run
  it restores left off, so it is not checked.
"""

from __future__ import annotations

from runtime.api import Job
from runtime.common import extras, objectstore, state_backends
from runtime.connectors.files import FileSink
from runtime.connectors.submit import SubmitContext


class SubmissionRefused(Exception):
    """The job cannot run as submitted; the message is one line saying why and what to do."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind  # MissingExtra, OutputExists or BadConnectorConfig


def needed_extras(job: Job, *, backend: str | None = None, restore: str | None = None) -> set[str]:
    """The extras the job uses: its connectors', its state backend's (`backend`, the submitted setting, else
    the job's; if it keeps keyed state), s3 for a restore from an object store."""
    needed: set[str] = set()
    for node in job.nodes:
        needed.update(getattr(node.payload, "extras", ()))
        needed.update(getattr(getattr(node.payload, "fn", None), "extras", ()))  # an async_map's function
    descriptor = state_backends.BY_NAME.get(str(backend or job.state_backend))
    if descriptor is not None and descriptor.extra and any(n.key_fn is not None for n in job.nodes):
        needed.add(descriptor.extra)
    if restore and objectstore.is_url(restore):
        needed.add("s3")
    return needed


def check_extras(job: Job, *, backend: str | None = None, restore: str | None = None) -> None:
    absent = extras.missing(needed_extras(job, backend=backend, restore=restore))
    if absent:
        raise SubmissionRefused(f"job {job.name}: {extras.describe_missing(absent)}", "MissingExtra")


def check_earlier_output(job: Job) -> None:
    """Refuse a FileSink directory that holds an earlier run's files (if_exists="fail", the default)."""
    for node in job.nodes:
        sink = node.payload
        if isinstance(sink, FileSink) and sink.if_exists == "fail":
            found = sink.earlier_output()
            if found:
                more = f" and {len(found) - 1} more" if len(found) > 1 else ""
                raise SubmissionRefused(
                    f"job {job.name}: the FileSink directory {sink.path} already holds output ({found[0]}{more}): "
                    "remove it or choose another directory, or give the sink if_exists='append' to add to it",
                    "OutputExists")


def check_connectors(job: Job, context: SubmitContext) -> None:
    """Ask every source and sink that can check its configuration (`check_at_submit(context)`) to do so, and
    every async_map function that can (a SQL lookup join's)."""
    for node in job.nodes:
        check = getattr(node.payload, "check_at_submit", None) or getattr(getattr(node.payload, "fn", None),
                                                                          "check_at_submit", None)
        if check is None:
            continue
        try:
            check(context)
        except (ValueError, RuntimeError, OSError, extras.MissingExtra) as exc:
            raise SubmissionRefused(f"job {job.name}: {exc}", "BadConnectorConfig") from None


def check_submission(job: Job, *, backend: str | None = None, restore: str | None = None) -> None:
    """Every check of a new submission; raises SubmissionRefused."""
    check_extras(job, backend=backend, restore=restore)
    check_connectors(job, SubmitContext(restore=bool(restore)))
    if not restore:
        check_earlier_output(job)
