"""A coordinator whose checkpoint storage fails on demand, or that dies at a step of an upgrade or rescale, for
tests: the fault is injected here, around the product's storage or through its step hook
(`JobManager.step`), so the coordinator's own code reads no test setting.

    python -m tests.support.faulty_coordinator --metadata-fails N -- <python> -m runtime.cli coordinator ARGS...
    python -m tests.support.faulty_coordinator --die-at upgrade:successor-recorded -- <python> -m runtime.cli ...
    python -m tests.support.faulty_coordinator --hold-first-metadata RELEASE_FILE -- <python> -m runtime.cli ...

The part after `--` is the usual command (the tests pass this module's part as the launcher `prefix` of
`LocalCluster.start_coordinator`); the coordinator runs in this process with its storage wrapped by
`FaultyStorage`: the first N `_metadata` writes fail as on a full disk (-1: every one), at the exact point where
a real write would fail. With `--die-at STEP` the process ends with `os._exit` (no cleanup, no lease released,
as after a kill -9) when the coordinator reaches that step, right after the job records queued so far were
written. With `--hold-first-metadata FILE` the first `_metadata` write waits (in its thread, as a slow store
would) until FILE exists: that checkpoint has every acknowledgement but is not complete, so the next one starts and
is taken beside it, a forced overlap of two checkpoints that otherwise take a few milliseconds each.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import sys
import time
from typing import Any

from coordinator.server import run_coordinator
from coordinator.storage import CheckpointStorage, LocalCheckpointStorage
from netstack.limits import raise_nofile_limit
from netstack.transport import run
from runtime.cli.main import build_parser, coordinator_config

HOLD_LIMIT_S = 120.0  # a held write never released fails (the test waiting for it has failed by then)


class FaultyStorage:
    """The real storage, except that the first `metadata_fails` `_metadata` writes raise ENOSPC (-1: all), and
    that the first write waits until the file `hold_first_until` exists (when given)."""

    def __init__(self, inner: CheckpointStorage, *, metadata_fails: int, hold_first_until: str = "") -> None:
        self._inner = inner
        self.metadata_fails = metadata_fails
        self.failed = 0
        self._hold_until = hold_first_until

    def write_metadata(self, directory: str, metadata: dict[str, Any]) -> str:
        if self.metadata_fails < 0 or self.failed < self.metadata_fails:
            self.failed += 1
            raise OSError(errno.ENOSPC, "No space left on device (injected by the test)")
        if self._hold_until:
            release, self._hold_until = self._hold_until, ""  # only the first write waits
            self._wait_for(release, directory)
        return self._inner.write_metadata(directory, metadata)

    @staticmethod
    def _wait_for(release: str, directory: str) -> None:
        log = logging.getLogger("sluice.faulty")
        log.warning("holding the _metadata write of %s until %s exists (injected by the test)", directory, release)
        deadline = time.monotonic() + HOLD_LIMIT_S
        while not os.path.exists(release):  # this runs in the runner's writer thread: the loop goes on
            if time.monotonic() > deadline:
                raise OSError(errno.ETIMEDOUT, f"held _metadata write never released ({release})")
            time.sleep(0.01)
        log.warning("released the _metadata write of %s", directory)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


DIED_EXIT = 137  # what a shell reports for a kill -9


def launcher(*, metadata_fails: int = 0, die_at: str = "", hold_first_metadata: str = "") -> list[str]:
    """The `prefix` that starts a coordinator through this module."""
    return [sys.executable, "-m", "tests.support.faulty_coordinator", "--metadata-fails", str(metadata_fails),
            *(["--die-at", die_at] if die_at else []),
            *(["--hold-first-metadata", hold_first_metadata] if hold_first_metadata else []), "--"]


def dying_at(step: str) -> Any:
    async def on_step(reached: str) -> None:
        logging.getLogger("sluice.faulty").warning("step %s reached%s", reached,
                                                   ": dying (injected by the test)" if reached == step else "")
        if reached == step:
            sys.stderr.flush()
            os._exit(DIED_EXIT)

    return on_step


def main(argv: list[str]) -> int:
    ours = argparse.ArgumentParser(prog="faulty_coordinator")
    ours.add_argument("--metadata-fails", type=int, default=0)
    ours.add_argument("--die-at", default="", help="a step of an upgrade or rescale (JobManager.step)")
    ours.add_argument("--hold-first-metadata", default="", metavar="FILE",
                      help="hold the first _metadata write until FILE exists")
    split = argv.index("--")
    options = ours.parse_args(argv[:split])
    command = argv[split + 1:]
    sluice_args = command[command.index("runtime.cli") + 1:]  # after `<python> -m runtime.cli`
    args = build_parser().parse_args(sluice_args)
    if args.command != "coordinator":
        raise SystemExit(f"faulty_coordinator runs a coordinator, not {args.command!r}")
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    raise_nofile_limit()
    config = coordinator_config(args)
    storage = FaultyStorage(LocalCheckpointStorage(config.checkpoint_root), metadata_fails=options.metadata_fails,
                            hold_first_until=options.hold_first_metadata)
    run(run_coordinator(config, storage=storage,  # type: ignore[arg-type]
                        on_step=dying_at(options.die_at) if options.die_at else None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
