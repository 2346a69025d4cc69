"""Bind and advertised addresses, and storage paths: the pure checks and the CLI flags that use them."""

from __future__ import annotations

import socket

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.cli.main import build_parser
from runtime.common import objectstore
from runtime.common.addresses import (
    advertised_host,
    check_advertise,
    check_host,
    is_wildcard,
    local_address_towards,
)


@pytest.mark.parametrize("text, expected", [
    ("0.0.0.0", "0.0.0.0"), ("10.0.0.5", "10.0.0.5"), ("::", "::"), ("[::1]", "::1"), ("fe80::1", "fe80::1"),
    ("coordinator", "coordinator"), ("sluice-coordinator.sluice.svc.cluster.local", "sluice-coordinator.sluice.svc."
                                                                                    "cluster.local"),
    (" 10.0.0.5 ", "10.0.0.5"), ("host.", "host."),
])
def test_hosts_that_are_accepted(text: str, expected: str) -> None:
    assert check_host(text) == expected


@pytest.mark.parametrize("text, reason", [
    ("", "empty address"), ("300.1.1.1", "not a valid IPv4 address"), ("10.0.0", "not a valid IPv4 address"),
    ("10.0.0.5:6123", "without a port"), ("a b", "not an IP address or host name"), ("-bad", "not an IP"),
    ("x" * 64, "not an IP"), ("fe80::zz::1", "not a valid IPv6 address"), ("under_score", "not an IP"),
])
def test_bad_hosts_are_one_line_errors(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as info:
        check_host(text)
    assert "\n" not in str(info.value) and str(info.value).startswith("--host: ")


@pytest.mark.parametrize("wildcard", ["0.0.0.0", "::", "[::]"])
def test_a_wildcard_is_bound_but_never_advertised(wildcard: str) -> None:
    assert is_wildcard(check_host(wildcard))
    with pytest.raises(ValueError, match="wildcard address"):
        check_advertise(wildcard)


def test_what_is_advertised() -> None:
    def fail() -> str:
        raise AssertionError("the fallback is only for a wildcard bind without --advertise")

    assert advertised_host("0.0.0.0", "10.0.0.5", fallback=fail) == "10.0.0.5"
    assert advertised_host("10.0.0.7", "", fallback=fail) == "10.0.0.7"
    assert advertised_host("127.0.0.1", "", fallback=fail) == "127.0.0.1"
    assert advertised_host("0.0.0.0", "", fallback=lambda: "10.1.2.3") == "10.1.2.3"
    assert advertised_host("::", "", fallback=lambda: "fd00::2") == "fd00::2"


def test_the_address_towards_a_peer_is_a_local_one() -> None:
    assert local_address_towards("127.0.0.1", 9) == "127.0.0.1"
    mine = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None)} | {"127.0.0.1"}
    assert local_address_towards("127.0.0.2", 9).startswith("127.") or local_address_towards("127.0.0.2", 9) in mine


@given(st.ip_addresses())
def test_every_ip_address_is_a_host(address: object) -> None:
    assert check_host(str(address)) == str(address)


@pytest.mark.parametrize("command", [["coordinator"], ["worker", "--coordinator", "10.0.0.1:6123"]])
def test_host_and_advertise_flags(command: list[str]) -> None:
    parser = build_parser()
    args = parser.parse_args([*command, "--host", "0.0.0.0", "--advertise", "10.0.0.5"])
    assert (args.host, args.advertise) == ("0.0.0.0", "10.0.0.5")
    args = parser.parse_args(command)
    assert (args.host, args.advertise) == ("127.0.0.1", None)


@pytest.mark.parametrize("command", [["coordinator"], ["worker", "--coordinator", "10.0.0.1:6123"]])
@pytest.mark.parametrize("flags, reason", [
    (["--host", "10.0.0.300"], "argument --host: '10.0.0.300' is not a valid IPv4 address"),
    (["--advertise", "0.0.0.0"], "argument --advertise: '0.0.0.0' is a wildcard address"),
    (["--advertise", "10.0.0.5:80"], "argument --advertise: '10.0.0.5:80' is not an address (give the host only"),
])
def test_bad_addresses_exit_2_with_one_line(command: list[str], flags: list[str], reason: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args([*command, *flags])
    assert info.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert reason in last


@pytest.mark.parametrize("value, expected", [
    ("s3://bucket/team/ckpt/", "s3://bucket/team/ckpt"), ("s3://bucket", "s3://bucket"), ("/srv/ckpt", "/srv/ckpt"),
])
def test_checkpoint_dir_flag(value: str, expected: str) -> None:
    assert build_parser().parse_args(["coordinator", "--checkpoint-dir", value]).checkpoint_dir == expected


@pytest.mark.parametrize("value, reason", [("s3://", "names no bucket"), ("s3:///x", "names no bucket"),
                                           ("gs://b/x", "unsupported storage scheme gs://")])
def test_bad_checkpoint_dirs(value: str, reason: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["coordinator", "--checkpoint-dir", value])
    assert reason in capsys.readouterr().err.strip().splitlines()[-1]


def test_url_paths() -> None:
    assert objectstore.split_url("s3://b/a/b/") == ("b", "a/b")
    assert objectstore.join("s3://b/p", "chk-1", "_metadata") == "s3://b/p/chk-1/_metadata"
    assert objectstore.basename("s3://b/p/chk-1/") == "chk-1"
    assert objectstore.dirname("s3://b/p/chk-1/_metadata") == "s3://b/p/chk-1"
    assert objectstore.is_within("s3://b/p/x", "s3://b/p") and objectstore.is_within("s3://b/p", "s3://b/p/")
    assert not objectstore.is_within("s3://b/px", "s3://b/p")
    assert not objectstore.is_within("s3://b/p/../q", "s3://b/p")
    assert not objectstore.is_within("/b/p/x", "s3://b/p")


def test_s3_settings_from_the_standard_environment() -> None:
    local = objectstore.s3_settings({"AWS_ENDPOINT_URL": "http://10.0.0.9:9000"})
    assert local["endpoint"] == "http://10.0.0.9:9000" and local["client_options"]["allow_http"] is True
    assert local["virtual_hosted_style_request"] is False and local["region"] == "us-east-1"
    aws = objectstore.s3_settings({"AWS_REGION": "eu-west-1"})
    assert "endpoint" not in aws and "region" not in aws and aws["client_options"]["allow_http"] is False
