"""A coordinator whose checkpoint storage fails on demand, for tests: the fault is injected here, around the
product's storage, so the coordinator's own code reads no test hook.

    python -m tests.support.faulty_coordinator --metadata-fails N -- <python> -m runtime.cli coordinator ARGS...

The part after `--` is the usual command (the tests pass this module's part as the launcher `prefix` of
`LocalCluster.start_coordinator`); the coordinator runs in this process with its storage wrapped by
`FaultyStorage`: the first N `_metadata` writes fail as on a full disk (-1: every one), at the exact point where
a real write would fail.
"""

from __future__ import annotations

import argparse
import errno
import logging
import sys
from typing import Any

from coordinator.server import run_coordinator
from coordinator.storage import CheckpointStorage, LocalCheckpointStorage
from netstack.limits import raise_nofile_limit
from netstack.transport import run
from runtime.cli.main import build_parser, coordinator_config


class FaultyStorage:
    """The real storage, except that the first `metadata_fails` `_metadata` writes raise ENOSPC (-1: all)."""

    def __init__(self, inner: CheckpointStorage, *, metadata_fails: int) -> None:
        self._inner = inner
        self.metadata_fails = metadata_fails
        self.failed = 0

    def write_metadata(self, directory: str, metadata: dict[str, Any]) -> str:
        if self.metadata_fails < 0 or self.failed < self.metadata_fails:
            self.failed += 1
            raise OSError(errno.ENOSPC, "No space left on device (injected by the test)")
        return self._inner.write_metadata(directory, metadata)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def launcher(*, metadata_fails: int) -> list[str]:
    """The `prefix` that starts a coordinator through this module."""
    return [sys.executable, "-m", "tests.support.faulty_coordinator", "--metadata-fails", str(metadata_fails), "--"]


def main(argv: list[str]) -> int:
    ours = argparse.ArgumentParser(prog="faulty_coordinator")
    ours.add_argument("--metadata-fails", type=int, default=0)
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
    storage = FaultyStorage(LocalCheckpointStorage(config.checkpoint_root), metadata_fails=options.metadata_fails)
    run(run_coordinator(config, storage=storage))  # type: ignore[arg-type]
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
