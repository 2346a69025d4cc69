"""The pgoutput decoder on messages captured from a real PostgreSQL 15 server (protocol version 1), for

    CREATE TABLE items (id int PRIMARY KEY, name text, qty int, price numeric(10,2), ok boolean, at timestamptz);
    ALTER TABLE items REPLICA IDENTITY FULL;
    INSERT INTO items VALUES (1, 'a', 2, 3.50, true, '2026-01-02 03:04:05+00'), (2, null, 3, null, false, null);
    UPDATE items SET qty = 5 WHERE id = 1;
    DELETE FROM items WHERE id = 2;
    ALTER TABLE items ADD COLUMN note text;
    INSERT INTO items (id, note) VALUES (3, 'n');
    TRUNCATE items;

each statement its own transaction, read through a slot with `publication_names` = a publication of items."""

from __future__ import annotations

import decimal

import pytest

from runtime.connectors.pgoutput import (
    UNCHANGED_TOAST,
    Begin,
    ChangeDecoder,
    Column,
    Commit,
    Delete,
    Insert,
    PgoutputError,
    Relation,
    Truncate,
    Update,
    decode_message,
    lsn_text,
    parse_lsn,
    pg_time_to_unix_ms,
)

RELATION = (b"R\x00\x00@\x01public\x00items\x00f\x00\x06\x01id\x00\x00\x00\x00\x17\xff\xff\xff\xff\x01name\x00"
            b"\x00\x00\x00\x19\xff\xff\xff\xff\x01qty\x00\x00\x00\x00\x17\xff\xff\xff\xff\x01price\x00\x00\x00"
            b"\x06\xa4\x00\n\x00\x06\x01ok\x00\x00\x00\x00\x10\xff\xff\xff\xff\x01at\x00\x00\x00\x04\xa0\xff\xff"
            b"\xff\xff")
RELATION_WITH_NOTE = RELATION.replace(b"f\x00\x06", b"f\x00\x07") + (
    b"\x01note\x00\x00\x00\x00\x19\xff\xff\xff\xff")
BEGIN_1 = b"B\x00\x00\x00\x00\x01\x92R\x10\x00\x03\x04^\xf8\x9f\x19/\x00\x00\x02\xd8"
INSERT_1 = (b"I\x00\x00@\x01N\x00\x06t\x00\x00\x00\x011t\x00\x00\x00\x01at\x00\x00\x00\x012t\x00\x00\x00\x043.50"
            b"t\x00\x00\x00\x01tt\x00\x00\x00\x162026-01-02 03:04:05+00")
INSERT_2 = b"I\x00\x00@\x01N\x00\x06t\x00\x00\x00\x012nt\x00\x00\x00\x013nt\x00\x00\x00\x01fn"
COMMIT_1 = b"C\x00\x00\x00\x00\x00\x01\x92R\x10\x00\x00\x00\x00\x01\x92R@\x00\x03\x04^\xf8\x9f\x19/"
BEGIN_2 = b"B\x00\x00\x00\x00\x01\x92R\xc8\x00\x03\x04^\xf8\x9f\x1b1\x00\x00\x02\xd9"
UPDATE = (b"U\x00\x00@\x01O\x00\x06t\x00\x00\x00\x011t\x00\x00\x00\x01at\x00\x00\x00\x012t\x00\x00\x00\x043.50"
          b"t\x00\x00\x00\x01tt\x00\x00\x00\x162026-01-02 03:04:05+00N\x00\x06t\x00\x00\x00\x011t\x00\x00\x00\x01a"
          b"t\x00\x00\x00\x015t\x00\x00\x00\x043.50t\x00\x00\x00\x01tt\x00\x00\x00\x162026-01-02 03:04:05+00")
COMMIT_2 = b"C\x00\x00\x00\x00\x00\x01\x92R\xc8\x00\x00\x00\x00\x01\x92R\xf8\x00\x03\x04^\xf8\x9f\x1b1"
BEGIN_3 = b"B\x00\x00\x00\x00\x01\x92S@\x00\x03\x04^\xf8\x9f\x1b\xdc\x00\x00\x02\xda"
DELETE = b"D\x00\x00@\x01O\x00\x06t\x00\x00\x00\x012nt\x00\x00\x00\x013nt\x00\x00\x00\x01fn"
COMMIT_3 = b"C\x00\x00\x00\x00\x00\x01\x92S@\x00\x00\x00\x00\x01\x92Sp\x00\x03\x04^\xf8\x9f\x1b\xdc"
BEGIN_4 = b"B\x00\x00\x00\x00\x01\x92Wh\x00\x03\x04^\xf8\x9f\x1d\x9d\x00\x00\x02\xdc"
INSERT_NOTE = b"I\x00\x00@\x01N\x00\x07t\x00\x00\x00\x013nnnnnt\x00\x00\x00\x01n"
COMMIT_4 = b"C\x00\x00\x00\x00\x00\x01\x92Wh\x00\x00\x00\x00\x01\x92W\x98\x00\x03\x04^\xf8\x9f\x1d\x9d"
BEGIN_5 = b"B\x00\x00\x00\x00\x01\x92c8\x00\x03\x04^\xf8\x9f!k\x00\x00\x02\xdd"
TRUNCATE = b"T\x00\x00\x00\x01\x00\x00\x00@\x01"
COMMIT_5 = b"C\x00\x00\x00\x00\x00\x01\x92c8\x00\x00\x00\x00\x01\x92d\xa8\x00\x03\x04^\xf8\x9f!k"

COLUMNS = (Column("id", 23, True), Column("name", 25, True), Column("qty", 23, True), Column("price", 1700, True),
           Column("ok", 16, True), Column("at", 1184, True))
ROW_1 = {"id": 1, "name": "a", "qty": 2, "price": decimal.Decimal("3.50"), "ok": True, "at": "2026-01-02 03:04:05+00"}
ROW_2 = {"id": 2, "name": None, "qty": 3, "price": None, "ok": False, "at": None}


def test_each_message_decodes_to_its_fields() -> None:
    assert decode_message(RELATION) == Relation(16385, "public", "items", "f", COLUMNS)
    assert decode_message(BEGIN_1) == Begin(parse_lsn("0/1925210"), 849_230_874_745_135, 728)
    assert decode_message(INSERT_2) == Insert(16385, ("2", None, "3", None, "f", None))
    assert decode_message(COMMIT_1) == Commit(0, parse_lsn("0/1925210"), parse_lsn("0/1925240"), 849_230_874_745_135)
    update = decode_message(UPDATE)
    assert isinstance(update, Update) and update.old is not None and not update.old_is_key
    assert (update.old[2], update.new[2]) == ("2", "5")
    assert decode_message(DELETE) == Delete(16385, ("2", None, "3", None, "f", None), False)
    assert decode_message(TRUNCATE) == Truncate(0, (16385,))


def test_transactions_come_out_whole_with_commit_lsn_and_time() -> None:
    decoder = ChangeDecoder()
    messages = [BEGIN_1, RELATION, INSERT_1, INSERT_2, COMMIT_1, BEGIN_2, UPDATE, COMMIT_2, BEGIN_3, DELETE,
                COMMIT_3, BEGIN_4, RELATION_WITH_NOTE, INSERT_NOTE, COMMIT_4, BEGIN_5, RELATION_WITH_NOTE,
                TRUNCATE, COMMIT_5]
    out = [(i, decoder.feed(m)) for i, m in enumerate(messages)]
    done = [(i, t) for i, t in out if t is not None]
    assert [i for i, _ in done] == [4, 7, 10, 14, 18]  # at each commit, nothing before
    first = done[0][1]
    assert (lsn_text(first.commit_lsn), lsn_text(first.end_lsn)) == ("0/1925210", "0/1925240")
    ts = pg_time_to_unix_ms(849_230_874_745_135)
    assert first.commit_ms == ts == 1_795_915_674_745  # 2026-11-29 01:27:54.745 UTC, when it was captured
    assert first.changes == [
        {"op": "c", "table": "public.items", "before": None, "after": ROW_1, "lsn": first.commit_lsn, "ts_ms": ts},
        {"op": "c", "table": "public.items", "before": None, "after": ROW_2, "lsn": first.commit_lsn, "ts_ms": ts}]
    assert [(c["op"], c["before"], c["after"]) for t in (done[1][1], done[2][1]) for c in t.changes] == [
        ("u", ROW_1, {**ROW_1, "qty": 5}), ("d", ROW_2, None)]
    # the column added mid-stream is in the records after its Relation message
    assert done[3][1].changes[0]["after"] == {"id": 3, "name": None, "qty": None, "price": None, "ok": None,
                                              "at": None, "note": "n"}
    assert [(c["op"], c["table"], c["before"], c["after"]) for c in done[4][1].changes] == [
        ("t", "public.items", None, None)]


def test_key_only_old_rows_and_unchanged_toast() -> None:
    relation = (b"R\x00\x00\x00\x07public\x00t\x00d\x00\x02\x01k\x00\x00\x00\x00\x17\xff\xff\xff\xff"
                b"\x00big\x00\x00\x00\x00\x19\xff\xff\xff\xff")
    decoder = ChangeDecoder()
    decoder.feed(BEGIN_1)
    decoder.feed(relation)
    # an update that changed the key (old key sent as 'K') and left the TOASTed value out ('u')
    decoder.feed(b"U\x00\x00\x00\x07K\x00\x02t\x00\x00\x00\x011nN\x00\x02t\x00\x00\x00\x012u")
    decoder.feed(b"D\x00\x00\x00\x07K\x00\x02t\x00\x00\x00\x012n")
    txn = decoder.feed(COMMIT_1)
    assert txn is not None
    assert [(c["op"], c["before"], c["after"]) for c in txn.changes] == [
        ("u", {"k": 1}, {"k": 2, "big": UNCHANGED_TOAST}), ("d", {"k": 2}, None)]


@pytest.mark.parametrize("payload, error", [
    (b"", "empty message"),
    (b"Z\x00", "unknown pgoutput message type"),
    (BEGIN_1[:10], "ends early"),
    (INSERT_2[:-3], "ends"),
    (b"I\x00\x00@\x01X", "insert without a new tuple"),
])
def test_malformed_messages_are_one_clear_error(payload: bytes, error: str) -> None:
    with pytest.raises(PgoutputError, match=error):
        decode_message(payload)


def test_a_change_outside_a_transaction_or_before_its_relation_is_an_error() -> None:
    with pytest.raises(PgoutputError, match="outside a transaction"):
        ChangeDecoder().feed(INSERT_1)
    decoder = ChangeDecoder()
    decoder.feed(BEGIN_1)
    with pytest.raises(PgoutputError, match="before its Relation message"):
        decoder.feed(INSERT_1)


def test_lsn_text_round_trips() -> None:
    assert lsn_text(parse_lsn("16/B374D848")) == "16/B374D848"
    assert parse_lsn("0/1925210") == 0x1925210
