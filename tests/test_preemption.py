"""custom_fit._preemption: a ``SIGTERM`` while ``fit`` runs is recorded; after ``fit`` it goes where it went before."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator

import pytest

from custom_fit._preemption import PreemptionNotice


@pytest.fixture
def own_sigterm_handler() -> Iterator[list[int]]:
    """A Python ``SIGTERM`` handler installed for the test (recording the signals), the original one after it."""
    received: list[int] = []
    original = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
    try:
        yield received
    finally:
        signal.signal(signal.SIGTERM, original)


def test_a_sigterm_while_fit_runs_is_recorded_and_the_process_goes_on(own_sigterm_handler):
    notice = PreemptionNotice(lambda: True)
    assert notice.install() and notice.received is False
    signal.raise_signal(signal.SIGTERM)
    assert notice.received is True and own_sigterm_handler == []
    notice.uninstall()
    signal.raise_signal(signal.SIGTERM)  # the previous handler is back
    assert own_sigterm_handler == [signal.SIGTERM]


def test_a_sigterm_after_fit_goes_to_the_handler_installed_before(own_sigterm_handler):
    running = [True]
    notice = PreemptionNotice(lambda: running[0])
    notice.install()
    running[0] = False  # fit ended by an exception: nobody uninstalled the notice
    signal.raise_signal(signal.SIGTERM)
    assert notice.received is False and own_sigterm_handler == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is not notice._handle  # it uninstalled itself


def test_only_the_main_thread_can_install_it():
    notice = PreemptionNotice(lambda: True)
    installed = []
    thread = threading.Thread(target=lambda: installed.append(notice.install()))
    thread.start()
    thread.join()
    assert installed == [False]
    notice.uninstall()  # nothing to undo
