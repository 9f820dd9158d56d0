"""``get([a, b, ...])`` fails fast, as Ray's: it raises the first error as
soon as any ref fails, without waiting for the others (Ray's test_basic*.py
and test_failure*.py); when several have failed, the first in list order."""

from __future__ import annotations

import time

import pytest

import tray


@tray.remote
def sleeper(seconds, value="slept"):
    time.sleep(seconds)
    return value


@tray.remote
def fails(message, delay_s=0.0):
    time.sleep(delay_s)
    raise ValueError(message)


def test_get_raises_the_first_error_without_waiting_for_the_rest(cluster):
    slow = sleeper.remote(60 * cluster.tick_s)
    with pytest.raises(ValueError, match="early failure"):
        tray.get([slow, fails.remote("early failure")])
    ready, _ = tray.wait([slow], timeout=0)
    assert ready == []  # get did not wait for the slow one
    tray.cancel(slow, force=True)


def test_get_fails_fast_before_its_timeout(one_node):
    slow = sleeper.remote(60 * one_node.tick_s)
    with pytest.raises(ValueError, match="within the timeout"):
        tray.get([slow, fails.remote("within the timeout", one_node.tick_s)],
                 timeout=30 * one_node.tick_s)
    tray.cancel(slow, force=True)


def test_get_raises_the_first_failed_ref_in_list_order(one_node):
    first, second = fails.remote("first"), fails.remote("second")
    tray.wait([first, second], num_returns=2)
    for _ in range(3):
        with pytest.raises(ValueError, match="first"):
            tray.get([sleeper.remote(0), first, second])


def test_get_without_errors_still_returns_every_value(one_node):
    refs = [sleeper.remote(0.1 * i, i) for i in range(4)]
    assert tray.get(refs) == [0, 1, 2, 3]


@tray.remote
def get_both_inside(slow_s):
    slow = sleeper.remote(slow_s)
    try:
        tray.get([slow, fails.remote("inside a task")])
    except ValueError:
        ready, _ = tray.wait([slow], timeout=0)
        tray.cancel(slow, force=True)
        return "failed fast" if not ready else "waited"
    return "no error"


def test_get_fails_fast_inside_a_task(one_node):
    assert tray.get(get_both_inside.remote(60 * one_node.tick_s)) == "failed fast"


