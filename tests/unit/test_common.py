"""runtime.common: the atomic write, the background task owner and the handler table."""

from __future__ import annotations

import asyncio
import os

import pytest

from runtime.common.files import write_atomically


def test_write_atomically_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "_metadata"
    path.write_bytes(b"old")
    write_atomically(str(path), b"new")
    assert path.read_bytes() == b"new"
    assert os.listdir(tmp_path) == ["_metadata"]


def test_write_atomically_failure_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    path = tmp_path / "state.bin"
    path.write_bytes(b"old")
    with pytest.raises(TypeError):
        write_atomically(str(path), "not bytes")  # type: ignore[arg-type]
    assert path.read_bytes() == b"old"
    assert os.listdir(tmp_path) == ["state.bin"]


def test_write_atomically_needs_the_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        write_atomically(str(tmp_path / "missing" / "f"), b"x")


# --- BackgroundTasks ---------------------------------------------------------------------------------


def test_cancel_and_wait_runs_every_task_cleanup_before_returning():
    from runtime.common.tasks import BackgroundTasks

    cleaned: list[str] = []

    async def sleeper(name: str) -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0)  # a cleanup that itself awaits: a bare cancel() never lets it finish
            cleaned.append(name)

    async def main() -> None:
        tasks = BackgroundTasks("test")
        for name in ("a", "b", "c"):
            tasks.spawn(sleeper(name))
        await asyncio.sleep(0)
        await tasks.cancel_and_wait(timeout_s=5.0)
        assert sorted(cleaned) == ["a", "b", "c"]
        assert len(tasks) == 0

    asyncio.run(main())


def test_cancel_and_wait_also_ends_tasks_spawned_while_cancelling():
    from runtime.common.tasks import BackgroundTasks

    ended: list[str] = []

    async def main() -> None:
        tasks = BackgroundTasks("test")

        async def late() -> None:
            try:
                await asyncio.sleep(3600)
            finally:
                ended.append("late")

        async def spawner() -> None:
            try:
                await asyncio.sleep(3600)
            finally:
                tasks.spawn(late())  # e.g. a failure report spawned by a cancelled task's cleanup
                ended.append("spawner")

        tasks.spawn(spawner())
        await asyncio.sleep(0)
        await tasks.cancel_and_wait(timeout_s=5.0)
        assert len(tasks) == 0

    asyncio.run(main())
    assert ended == ["spawner", "late"]


def test_a_failed_background_task_is_logged_and_forgotten(caplog):
    from runtime.common.tasks import BackgroundTasks

    async def boom() -> None:
        raise RuntimeError("disk full")

    async def main() -> None:
        tasks = BackgroundTasks("test")
        task = tasks.spawn(boom())
        await asyncio.wait([task])
        await asyncio.sleep(0)
        assert len(tasks) == 0

    asyncio.run(main())
    assert "test: background task failed: RuntimeError: disk full" in caplog.text


# --- HandlerTable --------------------------------------------------------------------------------------


def test_handler_table_dispatches_plain_and_async_handlers_and_names_unknown_methods():
    from runtime.common.dispatch import HandlerTable, UnknownMethod

    async def echo(ctx: str, args: dict) -> dict:
        return {"ctx": ctx, **args}

    table: HandlerTable[str] = HandlerTable({"echo": echo, "ping": lambda ctx, args: "pong"})
    assert list(table) == ["echo", "ping"]
    assert "echo" in table and "nope" not in table
    assert asyncio.run(table.dispatch("link", "echo", {"x": 1})) == {"ctx": "link", "x": 1}
    assert asyncio.run(table.dispatch("link", "ping", {})) == "pong"
    with pytest.raises(UnknownMethod, match="unknown method 'nope'"):
        asyncio.run(table.dispatch("link", "nope", {}))
