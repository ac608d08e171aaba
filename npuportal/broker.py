"""The folder broker of the embedded setup (no Redis): kombu's filesystem transport, made safe to share.

kombu's own transport creates a message file, then writes it. A worker polling the folder can move
the file away between the two and read it empty: the JSON error killed the worker. Here a message is
written to a hidden file first and renamed into the queue folder, which is atomic on one filesystem, so
a reader sees a whole message or none. A message that still cannot be read (a disk error, a file left by an
older version) is dropped with a log line instead of killing the worker.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path
from time import monotonic
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

log = logging.getLogger(__name__)


class Channel(filesystem.Channel):
    """kombu's filesystem channel with atomic writes and a reader that never dies on a bad file."""

    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        folder = Path(self.data_folder_out)
        # The leading dot keeps the half-written file out of every reader's listing: kombu matches
        # "<stamp>_<uuid>.<queue>.msg" by what follows the first dot.
        partial = folder / f".{name}.partial"
        try:
            with open(partial, "wb", buffering=0) as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, folder / name)
        except OSError as exc:
            partial.unlink(missing_ok=True)
            raise ChannelError(f"Cannot add file {name!r} to {folder}") from exc

    def _get(self, queue: str) -> Any:
        while True:  # each failed round has used up one file; Empty ends the loop
            try:
                return super()._get(queue)
            except (ValueError, ChannelError) as exc:  # JSONDecodeError is a ValueError
                log.error("a message of queue %s could not be read and is dropped: %s", queue, exc)


class Transport(filesystem.Transport):
    Channel = Channel
