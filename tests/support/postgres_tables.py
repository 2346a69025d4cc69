"""Tables and helpers for the PostgreSQL connector tests and benchmark (needs psycopg2: import this after
`pytest.importorskip("psycopg2")`): a database per test on one server, the orders table the CDC tests change,
a replica that applies change records strictly (a missed or repeated change fails it), and a writer thread
that changes the table while a job runs, riding out a server restart."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import psycopg2
import psycopg2.extras

from tests.support.postgres_server import PostgresServer

ORDERS = """
CREATE TABLE orders (id int PRIMARY KEY, customer text NOT NULL, amount int NOT NULL);
ALTER TABLE orders REPLICA IDENTITY FULL;
"""


def new_database(server: PostgresServer, name: str) -> str:
    """A fresh database `name` on `server`; its DSN."""
    server.admin(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    server.admin(f"CREATE DATABASE {name}")
    return server.dsn.replace("dbname=sluice", f"dbname={name}")


def execute(dsn: str, *statements: str, params: Any = None, autocommit: bool = False) -> list[Any]:
    """Run statements in one transaction (each on its own with `autocommit`); the rows of the last one (if it
    returns any)."""
    conn = psycopg2.connect(dsn)
    conn.autocommit = autocommit
    try:
        with conn.cursor() as cur:
            for sql in statements:
                cur.execute(sql, params)
            rows = cur.fetchall() if cur.description else []
        if not autocommit:
            conn.commit()
        return rows
    finally:
        conn.close()


def make_orders(dsn: str, rows: int, customers: int, *, publication: str = "sluice", seed: int = 1) -> None:
    rng = random.Random(seed)
    execute(dsn, ORDERS, f"CREATE PUBLICATION {publication} FOR TABLE orders")
    values = [(i, f"c{rng.randrange(customers):02d}", rng.randrange(1, 100)) for i in range(1, rows + 1)]
    conn = psycopg2.connect(dsn)
    try:
        with conn, conn.cursor() as cur:
            psycopg2.extras.execute_values(cur, "INSERT INTO orders VALUES %s", values)
    finally:
        conn.close()


def table_rows(dsn: str, table: str = "orders") -> dict[int, dict[str, Any]]:
    conn = psycopg2.connect(dsn)
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {table}")  # noqa: S608 - a test's own table name
            names = [d[0] for d in cur.description]
            return {row[0]: dict(zip(names, row, strict=True)) for row in cur.fetchall()}
    finally:
        conn.close()


def same_row(before: dict[str, Any] | None, held: dict[str, Any] | None) -> bool:
    """A before image is the row held, but for columns added since (NULL in it)."""
    if before is None or held is None:
        return False
    return all(before.get(k) == v for k, v in held.items()) and all(
        v is None for k, v in before.items() if k not in held)


class Replica:
    """Applies change records to a dict by primary key, strictly: a snapshot row or insert of a key it holds,
    an update or delete whose before image differs from what it holds, raise. So a change missed or repeated
    shows at once (the tables keep REPLICA IDENTITY FULL: every before image is whole)."""

    def __init__(self, key: str = "id") -> None:
        self.key = key
        self.rows: dict[Any, dict[str, Any]] = {}
        self.applied = 0

    def apply(self, change: dict[str, Any]) -> None:
        op, before, after = change["op"], change["before"], change["after"]
        key = (after or before)[self.key]
        if op in ("r", "c"):
            assert key not in self.rows, f"{op} of {key}, held already: {self.rows[key]} (a repeated change?)"
            self.rows[key] = after
        elif op == "u":
            assert same_row(before, self.rows.get(key)), f"update of {key}: before {before}, held {self.rows.get(key)}"
            self.rows[key] = after
        elif op == "d":
            assert same_row(before, self.rows.get(key)), f"delete of {key}: before {before}, held {self.rows.get(key)}"
            del self.rows[key]
        else:
            raise AssertionError(f"unexpected op {op!r}")
        self.applied += 1


class OrdersWriter(threading.Thread):
    """Transactions of 1..4 inserts, updates and deletes on orders, until stopped or `max_transactions`;
    reconnects when the server goes away (a transaction whose commit answer was lost may or may not have
    happened: the tests compare with the table as it ends, not with a count)."""

    def __init__(self, dsn: str, *, first_id: int, customers: int, seed: int = 2, pause_s: float = 0.002,
                 max_transactions: int = 100_000) -> None:
        super().__init__(name="orders-writer", daemon=True)
        self.dsn = dsn
        self.next_id = first_id
        self.customers = customers
        self.rng = random.Random(seed)
        self.pause_s = pause_s
        self.max_transactions = max_transactions
        self.stopping = threading.Event()
        self.transactions = 0
        self.errors = 0

    def run(self) -> None:
        conn = None
        known = list(range(1, self.next_id))
        while not self.stopping.is_set() and self.transactions < self.max_transactions:
            try:
                if conn is None or conn.closed:
                    conn = psycopg2.connect(self.dsn, connect_timeout=2)
                with conn, conn.cursor() as cur:
                    for _ in range(self.rng.randrange(1, 5)):
                        roll = self.rng.random()
                        if roll < 0.45 or not known:
                            cur.execute("INSERT INTO orders VALUES (%s, %s, %s)",
                                        (self.next_id, f"c{self.rng.randrange(self.customers):02d}",
                                         self.rng.randrange(1, 100)))
                            known.append(self.next_id)
                            self.next_id += 1
                        elif roll < 0.85:
                            cur.execute("UPDATE orders SET amount = %s WHERE id = %s",
                                        (self.rng.randrange(1, 100), self.rng.choice(known)))
                        else:
                            gone = known.pop(self.rng.randrange(len(known)))
                            cur.execute("DELETE FROM orders WHERE id = %s", (gone,))
                self.transactions += 1
            except psycopg2.Error:
                self.errors += 1
                if conn is not None:
                    conn.close()
                conn = None
                self.stopping.wait(0.1)
            self.stopping.wait(self.pause_s)
        if conn is not None:
            conn.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


def wait_until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out after {timeout_s}s waiting for {what}"
        time.sleep(0.05)
