"""The `sluice` argument parser: every duration flag goes through one parser that refuses zero."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from runtime.cli.main import _client_token, build_parser
from runtime.graph.config import parse_duration

# every flag that takes a duration, with the rest of a command line that parses
DURATION_FLAGS = [
    (["coordinator"], "--heartbeat-timeout"),
    (["coordinator"], "--lease-timeout"),
    (["worker", "--coordinator", "h:1"], "--heartbeat-interval"),
    *[(["submit", "--coordinator", "h:1", "m:f"], flag) for flag in (
        "--flush-timeout", "--checkpoint-interval", "--aligned-timeout", "--checkpoint-timeout", "--restart-delay")],
    *[(["local", "m:f"], flag) for flag in ("--flush-timeout", "--checkpoint-interval", "--restart-delay")],
]


@pytest.mark.parametrize(("prefix", "flag"), DURATION_FLAGS)
@pytest.mark.parametrize("value", ["0", "0s", "0ms", "0.0m", "-1s", "soon"])
def test_zero_negative_and_garbage_durations_are_refused(prefix: list[str], flag: str, value: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([*prefix, f"{flag}={value}"])
    assert info.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert flag in error and ("more than zero" in error or "not a duration" in error), error


@pytest.mark.parametrize(("prefix", "flag"), DURATION_FLAGS)
def test_positive_durations_parse_to_seconds(prefix: list[str], flag: str) -> None:
    args = build_parser().parse_args([*prefix, flag, "250ms"])
    assert getattr(args, flag.lstrip("-").replace("-", "_")) == pytest.approx(0.25)


def test_min_pause_may_be_zero() -> None:
    assert build_parser().parse_args(["local", "m:f", "--min-pause", "0s"]).min_pause == 0.0


def test_parse_duration_units() -> None:
    assert parse_duration("1.5") == 1.5 and parse_duration("2m") == 120.0 and parse_duration("500ms") == 0.5
    assert parse_duration("0", allow_zero=True) == 0.0
    with pytest.raises(ValueError, match="more than zero"):
        parse_duration("0h")


@pytest.mark.parametrize("command", [["status"], ["cancel", "j"], ["checkpoint", "j"], ["savepoint", "j"],
                                     ["checkpoints", "j"], ["probe", "j"], ["submit", "m:f"]])
def test_client_commands_read_the_token_from_the_state_dir(command: list[str], tmp_path: Path) -> None:
    state = tmp_path
    (state / "token").write_text("local-cluster-token\n")
    args = build_parser().parse_args([command[0], "--coordinator", "h:1", *command[1:], "--state-dir", str(state)])
    assert _client_token(args) == "local-cluster-token"
    # an explicit --token-file still wins
    (state / "other").write_text("other-token")
    args.token_file = str(state / "other")
    assert _client_token(args) == "other-token"


def test_missing_token_in_state_dir_is_a_clear_error(tmp_path: Path) -> None:
    args = argparse.Namespace(token_file=None, state_dir=str(tmp_path))
    with pytest.raises(ValueError, match="cannot read token file"):
        _client_token(args)


@pytest.mark.parametrize("prefix", [["coordinator"], ["submit", "--coordinator", "h:1", "m:f"], ["local", "m:f"]])
def test_scale_down_after_takes_a_duration_zero_or_never(prefix: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    for value, seconds in (("3s", 3.0), ("0", 0.0), ("never", 0.0), ("NEVER", 0.0)):
        assert build_parser().parse_args([*prefix, "--scale-down-after", value]).scale_down_after == seconds
    with pytest.raises(SystemExit):
        build_parser().parse_args([*prefix, "--scale-down-after", "-1s"])
    assert "--scale-down-after" in capsys.readouterr().err


def test_scale_down_after_defaults() -> None:
    from runtime.cli.main import _job_config

    assert build_parser().parse_args(["coordinator"]).scale_down_after == 10.0
    assert build_parser().parse_args(["coordinator"]).scale_up_after == 5.0
    job = build_parser().parse_args(["submit", "--coordinator", "h:1", "m:f"])
    assert "scale_down_after_s" not in _job_config(job)  # the coordinator's default applies
    job = build_parser().parse_args(["submit", "--coordinator", "h:1", "m:f", "--scale-down-after", "never"])
    assert _job_config(job)["scale_down_after_s"] == 0.0


@pytest.mark.parametrize("command", [["worker"], ["status"], ["submit", "m:f"], ["cancel", "j"]])
def test_coordinator_takes_a_list_of_addresses(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args([command[0], "--coordinator", "h1:6123, h2:6124", *command[1:]])
    assert args.coordinator == (("h1", 6123), ("h2", 6124))
    assert build_parser().parse_args([command[0], "--coordinator", "h:1", *command[1:]]).coordinator == (("h", 1),)
    with pytest.raises(SystemExit):
        build_parser().parse_args([command[0], "--coordinator", "h1:6123,nope", *command[1:]])
    assert "--coordinator" in capsys.readouterr().err


def test_standby_and_lease_timeout() -> None:
    args = build_parser().parse_args(["coordinator", "--standby", "--lease-timeout", "3s"])
    assert args.standby and args.lease_timeout == 3.0
    assert not build_parser().parse_args(["coordinator"]).standby


def test_state_backend_options_go_into_the_job_config(tmp_path: Path) -> None:
    from runtime.cli.main import _job_config

    plain = build_parser().parse_args(["submit", "--coordinator", "h:1", "m:f"])
    assert "state" not in _job_config(plain)  # the job module's default (else memory) applies
    local = build_parser().parse_args(["local", "m:f", "--state-backend", "rocksdb", "--state-work-dir",
                                       str(tmp_path)])
    assert _job_config(local)["state"] == {"backend": "rocksdb", "work_dir": str(tmp_path)}
    remote = build_parser().parse_args(["submit", "--coordinator", "h:1", "m:f", "--state-backend", "remote",
                                        "--state-remote-address", "localhost:6379"])
    assert _job_config(remote)["state"] == {"backend": "remote", "remote_address": "localhost:6379"}
    no_address = build_parser().parse_args(["submit", "--coordinator", "h:1", "m:f", "--state-backend", "remote"])
    with pytest.raises(ValueError, match="--state-remote-address"):
        _job_config(no_address)


def test_async_state_options_go_into_the_job_config() -> None:
    from runtime.cli.main import _job_config

    plain = build_parser().parse_args(["local", "m:f"])
    assert "async_state" not in _job_config(plain)  # the defaults (README: Asynchronous state) apply
    given = build_parser().parse_args(["submit", "--coordinator", "h:1", "m:f", "--async-max-in-flight", "64",
                                       "--async-batch-size", "16", "--async-batch-timeout", "5ms",
                                       "--async-key-order", "first-state-access", "--async-epochs", "out-of-order",
                                       "--async-checkpoint", "capture"])
    assert _job_config(given)["async_state"] == {"max_in_flight": 64, "batch_size": 16, "batch_timeout_ms": 5.0,
                                                 "key_order": "first-state-access", "epochs": "out-of-order",
                                                 "checkpoint": "capture"}


def test_parse_bytes_units() -> None:
    from runtime.graph.config import parse_bytes

    assert parse_bytes("500000") == 500_000 and parse_bytes("64KiB") == 65_536 and parse_bytes("2mb") == 2_000_000
    assert parse_bytes("1M") == 1 << 20
    for bad in ("0", "-1", "1.5MiB", "lots", ""):
        with pytest.raises(ValueError, match="64KiB"):
            parse_bytes(bad)


def test_every_job_flag_is_declared_on_a_settings_field_and_documented() -> None:
    """The job options are generated from the settings fields (runtime/graph/flags.py): each parses into the
    document key of its field, and the README names each."""
    from runtime.cli.job_options import SECTIONS, job_config
    from runtime.graph.flags import flags_of

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    declared = [(key, name, spec) for key, settings in SECTIONS for name, spec in flags_of(settings)]
    assert len(declared) == 42 and all(spec.name in readme for _, _, spec in declared)
    args = build_parser().parse_args(["submit", "--coordinator", "h:1", "m:f", "--retain", "4", "--restart-attempts",
                                      "2", "--async-batch-size", "9", "--exclusive-credits", "5", "--autoscale",
                                      "--autoscale-window", "5s"])
    doc = job_config(args)
    assert (doc["checkpoint"]["retain"], doc["restart"]["max_attempts"], doc["async_state"]["batch_size"],
            doc["exclusive_credits"]) == (4, 2, 9, 5)
    assert doc["autoscaler"] == {"enabled": True, "window_s": 5.0}
    # the command line's own default where it differs from the field's: the coordinator tolerates 0, sluice 3
    assert doc["checkpoint"]["tolerable_failures"] == 3
