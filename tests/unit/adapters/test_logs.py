"""One format per process: every logger a library writes to reaches the one handler."""

from __future__ import annotations

import io
import json
import logging

from billiard import util as billiard_util

from remediation.adapters import logs


def test_billiards_pool_logger_writes_json_even_after_celery_resets_it() -> None:
    stream = io.StringIO()
    logs.configure("INFO", "json", stream)
    billiard_util._logger = None  # what Celery's reset_multiprocessing_logger does
    billiard_util.get_logger().error("Process %r pid:%r exited with %r", "ForkPoolWorker-1", 7, "signal 15")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    rec = json.loads(lines[0])
    assert rec["level"] == "ERROR"
    assert rec["logger"] == "multiprocessing"
    assert rec["message"] == "Process 'ForkPoolWorker-1' pid:7 exited with 'signal 15'"


def test_a_library_logger_propagates_to_the_root_once() -> None:
    stream = io.StringIO()
    logs.configure("INFO", "text", stream)
    logging.getLogger("celery").addHandler(logging.StreamHandler(io.StringIO()))
    logs.configure("INFO", "text", stream)
    logging.getLogger("celery.worker").warning("hello")
    assert stream.getvalue().count("hello") == 1
