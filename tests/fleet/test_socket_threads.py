"""The agent sockets' database work runs on a few threads per web process, a node always on the same one: one
node's slow call no longer holds back the reports of every other node of the process."""

from __future__ import annotations

import asyncio
import threading

from scheduler.fleet.batching import db, socket_executor


def test_a_node_always_gets_the_same_thread_and_the_threads_are_shared_out(settings) -> None:
    settings.GPUPOOL_AGENT_DB_THREADS = 2

    assert socket_executor(7) is socket_executor(7)
    assert socket_executor(7) is socket_executor(9)
    assert socket_executor(7) is not socket_executor(8)


def test_without_threads_every_socket_uses_the_process_thread(settings) -> None:
    settings.GPUPOOL_AGENT_DB_THREADS = 0

    assert socket_executor(7) is None


def test_one_nodes_slow_database_call_does_not_hold_back_another_nodes(settings) -> None:
    # Before, every socket's calls ran on the process's one thread-sensitive thread: this quick call waited
    # for the slow one (a report of one node behind another node's, in a burst of short jobs).
    settings.GPUPOOL_AGENT_DB_THREADS = 2
    release, started = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(30)
        return "slow"

    def quick() -> str:
        return "quick"

    async def scenario() -> tuple[str, str]:
        slow_call = asyncio.ensure_future(db(slow, executor=socket_executor(1))())
        await asyncio.get_running_loop().run_in_executor(None, started.wait, 30)
        try:
            done = await asyncio.wait_for(db(quick, executor=socket_executor(2))(), timeout=20)
        finally:
            release.set()
        return done, await slow_call

    assert asyncio.run(scenario()) == ("quick", "slow")
