"""The embedded setup's folder broker: a reader never sees half a message, and a bad file is not fatal."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from kombu import Connection

from tests.waiting import ceiling


def _connection(folder: Path, transport: str = "npuportal.broker:Transport") -> Connection:
    for name in ("queue", "processed", "control"):
        (folder / name).mkdir(parents=True, exist_ok=True)
    return Connection(
        "filesystem://",
        transport=transport,
        transport_options={
            "data_folder_in": str(folder / "queue"),
            "data_folder_out": str(folder / "queue"),
            "processed_folder": str(folder / "processed"),
            "control_folder": str(folder / "control"),
            "store_processed": False,
            "polling_interval": 0.01,
        },
    )


def test_an_unreadable_message_is_dropped_and_the_next_one_delivered(tmp_path: Path) -> None:
    with _connection(tmp_path) as conn:
        queue = conn.SimpleQueue("ticks")
        queue.put({"n": 1})
        (tmp_path / "queue" / "0_broken.ticks.msg").write_bytes(b"")  # sorts first: an empty file
        (tmp_path / "queue" / ".1_half.ticks.msg.partial").write_bytes(b'{"bo')  # still being written
        message = queue.get(timeout=ceiling(60))
        assert message.payload == {"n": 1}
        message.ack()
        with pytest.raises(queue.Empty):
            queue.get(timeout=0.2)  # the partial file is nobody's message yet
        queue.close()


def test_a_reader_polling_hard_gets_every_message_whole(tmp_path: Path) -> None:
    """kombu's own transport created the file before writing it: a fast reader could read it empty."""
    count = 400
    errors: list[BaseException] = []

    def write() -> None:
        with _connection(tmp_path) as conn:
            queue = conn.SimpleQueue("jobs")
            for n in range(count):
                queue.put({"n": n, "pad": "x" * 2000})
            queue.close()

    writer = threading.Thread(target=write)
    got: list[int] = []
    with _connection(tmp_path) as conn:
        queue = conn.SimpleQueue("jobs")
        writer.start()
        while len(got) < count:
            try:
                message = queue.get(timeout=ceiling(60))
            except queue.Empty:
                break
            except Exception as exc:  # pragma: no cover - what the test is for
                errors.append(exc)
                break
            got.append(message.payload["n"])
            message.ack()
        queue.close()
    writer.join()
    assert not errors
    assert sorted(got) == list(range(count))
