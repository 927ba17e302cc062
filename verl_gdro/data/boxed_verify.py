"""math-verify in a warmed process pool, for the ``boxed`` template's scorer, configured as verl's
``math_verify`` scorer. Why not verl's: its workers import all of verl inside the 30 s per-answer
timeout, which scores a busy node's first responses as silently wrong; here start-up is paid
before any timeout. Processes, because math-verify's timeouts use ``signal.alarm`` (main thread only).
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeoutError

NUM_WORKERS = 4
TIMEOUT_S = 30.0

logger = logging.getLogger(__name__)
_pool: ProcessPoolExecutor | None = None
_lock = threading.Lock()


def verify_boxed(ground_truth: str, response: str) -> bool:
    """Whether ``response`` states an answer math-verify finds equal to ``ground_truth`` (in-process)."""
    from math_verify.grader import verify
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig, parse

    gold = parse("\\boxed{" + ground_truth + "}", (LatexExtractionConfig(),))
    pred = parse(response, (ExprExtractionConfig(), LatexExtractionConfig()))
    return bool(gold and pred and any(verify(g, p) for g in gold for p in pred))


def _warm(_: int) -> bool:
    import time

    import math_verify  # noqa: F401  (the expensive import, paid before any timed call)

    time.sleep(0.2)  # keep this worker busy so the next warm-up task spawns another one
    return True


def _get_pool() -> ProcessPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            pool = ProcessPoolExecutor(
                max_workers=NUM_WORKERS, mp_context=multiprocessing.get_context("spawn")
            )
            list(pool.map(_warm, range(NUM_WORKERS)))  # no timeout: start-up is not a verdict
            _pool = pool
    return _pool


def is_equivalent(ground_truth: str, response: str, timeout: float = TIMEOUT_S) -> bool:
    """:func:`verify_boxed` in a warmed worker; a verification that exceeds ``timeout`` counts as wrong."""
    future = _get_pool().submit(verify_boxed, ground_truth, response)
    try:
        return bool(future.result(timeout=timeout))
    except FuturesTimeoutError:
        future.cancel()
        return False
    except Exception as e:  # one malformed response must not stop the reward loop
        logger.warning("math-verify failed on a response (scored as wrong): %s: %s", type(e).__name__, e)
        return False
