"""A job's options on `sluice submit` and `sluice local`, generated from the settings they configure.

Each option is declared once, as a flag on its settings field (runtime/graph/flags.py): ChannelConfig,
JobConfig and AutoscalerConfig (runtime/graph/job_config.py), CheckpointSettings (coordinator/checkpointing.py),
RestartStrategy (coordinator/restarts.py), StateConfig and AsyncStateSettings (runtime/execution/async_operator.py).
Here they become arguments, and the ones given become the submission's `config` document (README, Job
configuration), section by section; what was not given is left out, so the field's default applies.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from coordinator.checkpointing import CheckpointSettings
from coordinator.restarts import RestartStrategy
from runtime.cli.arguments import absolute, add_flags, settings_document
from runtime.common import state_backends
from runtime.execution.async_operator import AsyncStateSettings
from runtime.graph import protocol as p
from runtime.graph.enums import CheckpointMode
from runtime.graph.job_config import (
    ASYNC_STATE,
    AUTOSCALER,
    CHECKPOINTS,
    NETWORK,
    RESTARTS,
    STATE,
    AutoscalerConfig,
    ChannelConfig,
    JobConfig,
    StateConfig,
)

GROUP_TITLES = {
    NETWORK: "network buffers",
    CHECKPOINTS: "checkpoints",
    STATE: "keyed state (README: Choosing a state backend)",
    ASYNC_STATE: "asynchronous state (README: Asynchronous state; AsyncKeyedProcessFunction only)",
    RESTARTS: "restarts after a failure",
    AUTOSCALER: "load-based autoscaling (README: Autoscaling)",
}

# where each settings class's fields go in the document: None at its top level, else under that key
SECTIONS: tuple[tuple[str | None, type[Any]], ...] = (
    (None, ChannelConfig), (None, JobConfig), ("checkpoint", CheckpointSettings), ("restart", RestartStrategy),
    ("state", StateConfig), ("async_state", AsyncStateSettings), ("autoscaler", AutoscalerConfig),
)


def add_job_options(parser: argparse.ArgumentParser) -> None:
    groups: dict[str, Any] = {"": parser, **{key: parser.add_argument_group(title)
                                             for key, title in GROUP_TITLES.items()}}
    parser.add_argument("--name", help="job name (default: the entry point)")
    groups[CHECKPOINTS].add_argument("--restore", metavar="PATH",
                                     help="start from this checkpoint or savepoint directory")
    for _, settings in SECTIONS:
        add_flags(groups, settings)


def job_config(args: argparse.Namespace) -> dict[str, Any]:
    """The submission's `config` document from the job options given; raises ValueError (one line naming the
    flags) for a combination no single flag's check can see."""
    doc: dict[str, Any] = {}
    for key, settings in SECTIONS:
        values = settings_document(args, settings)
        if key is None:
            doc.update(values)
        elif values:
            doc[key] = values
    checkpoint = doc.get("checkpoint", {})
    if "aligned_timeout_s" in checkpoint:  # --aligned-timeout is how a command line says mode aligned_timeout
        if checkpoint.get("mode", CheckpointMode.ALIGNED) != CheckpointMode.ALIGNED:
            raise ValueError("--aligned-timeout applies to --checkpoint-mode aligned only")
        checkpoint["mode"] = CheckpointMode.ALIGNED_TIMEOUT.value
    state = doc.get("state", {})
    if state_backends.BY_NAME[state.get("backend", state_backends.DEFAULT)].needs_address and \
            "remote_address" not in state:
        raise ValueError(f"--state-backend {state['backend']} needs --state-remote-address HOST:PORT")
    if "async_state" in doc:
        AsyncStateSettings.from_config(doc["async_state"])  # refuse a bad combination here, not on every worker
    return doc


def submit_message(args: argparse.Namespace) -> p.Submit:
    """`sluice submit`'s request: the entry point, the job options and where the job module is imported from."""
    return p.Submit(entry=args.entry, name=args.name, config=job_config(args), sys_path=os.getcwd(),
                    restore=absolute(args.restore))
