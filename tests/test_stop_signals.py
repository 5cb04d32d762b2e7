"""A stop signal takes no lock (docs/architecture.md, "Nothing that waits holds the lab"): it
stops a process whose main thread is inside an ``Event``'s lock when it arrives."""
import os
import signal
import threading

from conftest import WAIT_S
from device_loop.core.stop_signals import on_stop_signals


def test_a_stop_signal_that_arrives_while_the_main_thread_holds_the_event_s_lock_stops_all_the_same():
    stopping, said = threading.Event(), []
    previous = signal.getsignal(signal.SIGUSR1)
    on_stop_signals(lambda signum: (said.append(signum), stopping.set()), signals=(signal.SIGUSR1,))
    try:
        with stopping._cond:  # where the main thread is inside Event.wait or Event.clear
            # the handler runs at the next bytecode: one that set the Event itself would wait
            # here for the lock this thread holds, and never return (the test's timeout fails it)
            os.kill(os.getpid(), signal.SIGUSR1)
        assert stopping.wait(WAIT_S) and said == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, previous)
