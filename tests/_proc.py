"""Drive child processes from tests (see tests/_children.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ezflow

SCRIPT = str(Path(__file__).with_name("_children.py"))


class Child:
    """One child process running a role; read its JSON events, stop it, kill it."""

    def __init__(
        self, process: asyncio.subprocess.Process, role: str, args: tuple[str, ...] = ()
    ) -> None:
        self.process = process
        self.role = role
        #: its command line (a child of tests/_children.py dumps its stacks on request)
        self.args = args

    @classmethod
    async def start(
        cls,
        role: str,
        loop: str,
        *,
        prefix: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        **args: Any,
    ) -> Child:
        """Start *role* on event loop *loop*; *prefix* runs it through another command
        first (``("ip", "netns", "exec", NAME)`` puts it on another test host); *env*:
        variables set for it on top of this process's."""
        env = dict(os.environ, **(env or {}), EZFLOW_EVENT_LOOP=loop, PYTHONUNBUFFERED="1")
        command = (*prefix, sys.executable, SCRIPT, role, json.dumps(args))
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        return cls(process, role, command)

    @property
    def pid(self) -> int:
        return self.process.pid

    async def event(self, name: str, timeout: float = 30) -> dict[str, Any]:
        """Wait for the next event called *name* (skipping others). A child that sends
        none in *timeout* seconds is asked for its stacks first (tasks and threads, on
        its stderr: the test's captured output), then the wait fails."""
        try:
            return await asyncio.wait_for(self._event(name), timeout)
        except asyncio.TimeoutError:
            if SCRIPT in self.args and self.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.process.pid, signal.SIGUSR2)  # tasks (tests/_children.py)
                    await asyncio.sleep(0.5)
                    os.kill(self.process.pid, signal.SIGUSR1)  # threads
                    await asyncio.sleep(0.5)
            raise AssertionError(
                f"{self.role} child sent no {name!r} event in {timeout} s "
                "(its stacks, if it could print them, are in the captured stderr)"
            ) from None

    async def _event(self, name: str) -> dict[str, Any]:
        assert self.process.stdout is not None
        while True:
            line = await self.process.stdout.readline()
            if not line:
                code = await self.process.wait()
                raise AssertionError(f"{self.role} child exited ({code}) before {name!r}")
            event = json.loads(line)
            if event["event"] == name:
                return event  # type: ignore[no-any-return]

    async def stop(self, timeout: float = 10) -> int:
        """Close stdin (the child's cue to finish) and wait for it to exit."""
        if self.process.stdin is not None and not self.process.stdin.is_closing():
            self.process.stdin.close()
        try:
            return await asyncio.wait_for(self.process.wait(), timeout)
        except asyncio.TimeoutError:
            self.kill()
            await self.process.wait()
            raise

    def kill(self) -> None:
        if self.process.returncode is None:
            self.process.kill()

    async def aclose(self) -> None:
        """Kill if still running, and reap."""
        self.kill()
        if self.process.stdin is not None:
            self.process.stdin.close()
        await self.process.wait()


def ezflow_cli(
    *args: str,
    timeout: float = 30,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``python -m ezflow ARGS`` as a real process (*env*: its whole environment)."""
    return subprocess.run(
        [sys.executable, "-m", "ezflow", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=cwd,
        check=False,
    )


PIPELINE = str(Path(ezflow.__file__).parent / "_perf" / "_pipeline.py")


@contextlib.contextmanager
def held_pipeline(folder: Path, *args: str, timeout: float = 60) -> Iterator[dict[str, Any]]:
    """Run ``ezflow/_perf/_pipeline.py ARGS --hold`` (its graph stays up) and yield its
    result once written (within *timeout* s); at the end close its stdin, which ends
    it, and check that it exited 0. Killed if anything fails."""
    result = folder / "result.json"
    process = subprocess.Popen(
        [sys.executable, PIPELINE, *args, "--hold", "-o", str(result)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + timeout
        while not result.exists():
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, f"the pipeline gave no result in {timeout} s"
            time.sleep(0.05)
        yield json.loads(result.read_text())
        _, stderr = process.communicate("", timeout=30)  # stdin closes: it ends
        assert process.returncode == 0, stderr
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
