"""Keeps the roles of ``clawr1 up`` running: a role that dies is restarted with backoff until it
crash-loops, then the stack stops with the reason.

A role its health check calls stuck (a worker that committed nothing while its input waited) is killed
and restarted with the same backoff, but such kills are not crashes: they never count toward the
crash-loop limit, so an overloaded machine that slows a worker down cannot stop the whole stack. A role
that stays stuck is restarted, at most every ``max_backoff_s``, and /healthz names it all along.

The decision (restart after how long, or give up) is a pure function of a role's recent crash and kill
times (``RestartPolicy.decide``), so it is tested without processes. ``Supervisor`` applies it to roles
through a thin adapter (``ProcessRole``: one child process, its stderr forwarded and its last lines
kept for the crash report) and records what it sees in ``run/supervisor.json`` for ``clawr1 status``,
which is the only witness while the API process itself is down.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Protocol

from clawr1.core import registry
from clawr1.core.backoff import Backoff
from clawr1.core.settings import Settings, config_from, setting_field

TAIL_LINES = 20
DUMP_WAIT_S = 1.0  # for a stuck process's thread dump to reach its log before the kill


@dataclass(frozen=True)
class Decision:
    restart: bool
    delay_s: float
    recent_exits: int  # crashes within the window (what the limit counts)


@dataclass(frozen=True)
class RestartPolicy:
    """Restart after ``backoff_s`` doubling per exit (crash or kill) within ``window_s`` (capped at
    ``max_backoff_s``); more than ``max_restarts`` crashes within the window is a crash loop: restarting
    again would only hide a fault that needs a person. Kills of a stuck role are not counted there: a
    process that was alive and slow is not a fault of its setup."""

    backoff_s: float = setting_field(registry.RESTART_BACKOFF_S)
    max_backoff_s: float = setting_field(registry.RESTART_MAX_BACKOFF_S)
    max_restarts: int = setting_field(registry.RESTART_LIMIT)
    window_s: float = setting_field(registry.RESTART_WINDOW_S)

    def decide(self, exits: Sequence[float], now: float, kills: Sequence[float] = ()) -> Decision:
        """``exits``: the role's crash times, ``kills``: the times it was killed as stuck, the one just seen
        included in either."""
        recent = sum(1 for t in exits if now - t < self.window_s)
        if recent > self.max_restarts:
            return Decision(False, 0.0, recent)
        # The ceiling, not a draw under it: a restart is one process, not a crowd of clients to spread, and
        # a jittered delay near zero would restart a crash at once.
        restarts = recent + sum(1 for t in kills if now - t < self.window_s)
        delay = Backoff(self.backoff_s, self.max_backoff_s).ceiling(max(1, restarts))
        return Decision(True, delay, recent)

    @classmethod
    def from_settings(cls, settings: Settings) -> RestartPolicy:
        return config_from(cls, settings)


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with code {returncode}"


QUORUM_LOST_GRACE_S = 10.0
STOP_POLL_S = 0.1


def quorum_lost(voters: int, stopped: int) -> bool:
    """Whether most of a quorum's ``voters`` have stopped (none: there is no quorum to lose)."""
    return voters > 0 and 2 * stopped > voters


class Role(Protocol):
    name: str
    stop_timeout_s: float
    votes: bool

    @property
    def pid(self) -> int | None: ...
    def start(self) -> None: ...
    def returncode(self) -> int | None: ...
    def exited(self) -> None: ...
    def last_lines(self) -> list[str]: ...
    def terminate(self) -> None: ...
    def wait(self, timeout: float) -> bool: ...
    def kill(self) -> None: ...


class ProcessRole:
    """One child process. ``launch`` starts it (with ``stderr=PIPE`` to have its lines forwarded to
    ours and their tail kept; otherwise ``log_file``'s tail is the report); ``on_exit`` runs once per
    exit seen, e.g. to withdraw the role's readiness marker so /healthz names it until it is back.
    ``dump_signal``: sent before a kill so that a process that would not stop (or is stuck) writes where
    each of its threads is to its log first (the CLI registers ``faulthandler`` on SIGUSR1). ``votes``: one
    of a quorum (a Kafka node of a cluster), whose clean stop needs most of its tier still up."""

    def __init__(self, name: str, launch: Callable[[], subprocess.Popen[bytes]], *,
                 log_file: Path | None = None, on_exit: Callable[[], None] | None = None,
                 stop_timeout_s: float = 20.0, dump_signal: signal.Signals | None = None,
                 votes: bool = False) -> None:
        self.name = name
        self.stop_timeout_s = stop_timeout_s
        self.votes = votes
        self._dump_signal = dump_signal
        self._launch = launch
        self._log_file = log_file
        self._on_exit = on_exit
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def start(self) -> None:
        self._tail.clear()
        self.process = self._launch()
        if self.process.stderr is not None:
            threading.Thread(target=self._forward, args=(self.process.stderr,), name=f"{self.name}-stderr",
                             daemon=True).start()

    def _forward(self, stream: IO[bytes]) -> None:
        with stream:
            for line in stream:
                self._tail.append(line.decode(errors="replace").rstrip())
                sys.stderr.buffer.write(line)
                sys.stderr.flush()

    def returncode(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def exited(self) -> None:
        if self._on_exit is not None:
            self._on_exit()

    def last_lines(self) -> list[str]:
        if self._log_file is not None:
            try:
                with self._log_file.open("rb") as handle:
                    handle.seek(max(0, handle.seek(0, os.SEEK_END) - 16384))
                    return handle.read().decode(errors="replace").splitlines()[-TAIL_LINES:]
            except FileNotFoundError:
                return []
        # The forwarding thread may still be draining the pipe of a process that just died.
        time.sleep(0.05)
        return list(self._tail)

    def terminate(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> bool:
        if self.process is None:
            return True
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            if self._dump_signal is not None:
                self.process.send_signal(self._dump_signal)
                self.wait(DUMP_WAIT_S)
            self.process.kill()
            self.process.wait()


@dataclass
class _Watch:
    role: Role
    tier: int
    # Why a running role is stuck (None when it is not), given its start time; judged once it has run
    # ``grace_s``.
    health: Callable[[float], str | None] | None = None
    grace_s: float = 0.0
    started_at: float = 0.0
    exits: list[float] = field(default_factory=list)  # crashes
    kills: list[float] = field(default_factory=list)  # killed as stuck
    restart_at: float | None = None
    restarts: int = 0
    last_exit: str = ""


def _stderr(message: str) -> None:
    print(f"[clawr1] {message}", file=sys.stderr, flush=True)


class Supervisor:
    """Call ``tick`` often; it returns a message when the stack must stop (a crash loop, or a role
    exiting on its own while ``restarting`` is off, as during start-up where that means a setup
    problem). A role killed by a signal is restarted even then: the kill came from outside (an
    operator, the OOM killer, a chaos test that saw /healthz answer 200 a moment before this loop
    did), and the role's setup was not what failed."""

    def __init__(self, policy: RestartPolicy, *, state_file: Path | None = None,
                 log: Callable[[str], None] = _stderr, clock: Callable[[], float] = time.monotonic) -> None:
        self.policy = policy
        self._state_file = state_file
        self._log = log
        self._clock = clock
        self._watches: list[_Watch] = []

    def add(self, role: Role, tier: int = 1, health: Callable[[float], str | None] | None = None,
            grace_s: float = 0.0) -> None:
        """Start ``role``; on stop, higher tiers stop first (the broker, tier 0, outlives its clients).

        ``health(started_at)`` says why the running role is stuck, if it is (``started_at`` is its start on
        the supervisor's clock): such a role is killed and restarted with the same backoff as one that
        died (but the kill is no crash: the crash-loop limit does not count it), once it has had
        ``grace_s`` since its start to make progress."""
        role.start()
        self._watches.append(_Watch(role, tier, health, grace_s, self._clock()))
        self._write_state()

    def tick(self, restarting: bool = True) -> str | None:
        now = self._clock()
        changed = False
        for watch in self._watches:
            if watch.restart_at is None:
                code = watch.role.returncode()
                reason = describe_exit(code) if code is not None else self._stuck(watch, now)
                if reason is None:
                    continue
                changed = True
                watch.role.exited()
                problem = self._exited(watch, reason, now, restarting or code is None or code < 0,
                                       killed=code is None)
            elif now >= watch.restart_at:
                changed = True
                problem = self._restart(watch, now, restarting)
            else:
                continue
            if problem is not None:
                self._write_state()
                return problem
        if changed:
            self._write_state()
        return None

    def _stuck(self, watch: _Watch, now: float) -> str | None:
        """Kill a running role its health check calls stuck; the reason, or None when it is fine."""
        if watch.health is None or now - watch.started_at < watch.grace_s:
            return None
        problem = watch.health(watch.started_at)
        if problem is None:
            return None
        watch.role.kill()
        return f"stuck ({problem}), killed"

    def _exited(self, watch: _Watch, reason: str, now: float, restarting: bool,
                killed: bool = False) -> str | None:
        """``killed``: by the health check (stuck), not a crash."""
        name = watch.role.name
        watch.exits = [t for t in watch.exits if now - t < self.policy.window_s] + ([] if killed else [now])
        watch.kills = [t for t in watch.kills if now - t < self.policy.window_s] + ([now] if killed else [])
        watch.last_exit = reason
        tail = "\n".join(f"    {line}" for line in watch.role.last_lines())
        tail = f"; its last lines:\n{tail}" if tail else ""
        if not restarting:
            return f"{name} {reason} during start-up{tail}"
        decision = self.policy.decide(watch.exits, now, watch.kills)
        if not decision.restart:
            return (f"{name} {reason}, exit {decision.recent_exits} within {self.policy.window_s:.0f}s "
                    f"(limit {self.policy.max_restarts} restarts): a crash loop, giving up{tail}")
        watch.restart_at = now + decision.delay_s
        self._log(f"{name} {reason}; restarting it in {decision.delay_s:.1f}s{tail}")
        return None

    def _restart(self, watch: _Watch, now: float, restarting: bool) -> str | None:
        watch.restart_at = None
        watch.started_at = now
        try:
            watch.role.start()
        except Exception as exc:  # noqa: BLE001 - a failed start is one more exit, under the same policy
            return self._exited(watch, f"failed to start ({exc})", now, restarting)
        watch.restarts += 1
        self._log(f"{watch.role.name} restarted (pid {watch.role.pid}, restart {watch.restarts})")
        return None

    def stop_all(self) -> None:
        """SIGTERM tier by tier, highest first; a role that outlives its stop timeout is killed."""
        for tier in sorted({w.tier for w in self._watches}, reverse=True):
            roles = [w.role for w in reversed(self._watches) if w.tier == tier]
            for role in roles:
                role.terminate()
            self._await_stop(roles)
        self._watches.clear()
        if self._state_file is not None:
            self._state_file.unlink(missing_ok=True)

    def _await_stop(self, roles: list[Role]) -> None:
        """Each role until its stop timeout, then killed. A voter left behind once most of its tier's voters
        have gone cannot finish a clean stop (a Kafka node's controlled shutdown waits for a controller
        quorum that no longer exists): it gets ``QUORUM_LOST_GRACE_S`` more, not the rest of its timeout."""
        since = time.monotonic()
        deadlines = {id(role): since + role.stop_timeout_s for role in roles}
        voters = [role for role in roles if role.votes]
        waiting = list(roles)
        while waiting:
            now = time.monotonic()
            if quorum_lost(len(voters), sum(role.returncode() is not None for role in voters)):
                for role in voters:
                    deadlines[id(role)] = min(deadlines[id(role)], now + QUORUM_LOST_GRACE_S)
                voters = []
            for role in list(waiting):
                if role.wait(0.0):
                    waiting.remove(role)
                elif now >= deadlines[id(role)]:
                    self._log(f"{role.name} did not stop in time; killing it")
                    role.kill()
                    waiting.remove(role)
            if waiting:
                time.sleep(STOP_POLL_S)

    def state(self) -> list[dict[str, object]]:
        return [
            {
                "role": w.role.name,
                "state": "restarting" if w.restart_at is not None else "running",
                "pid": w.role.pid,
                "restarts": w.restarts,
                "last_exit": w.last_exit,
            }
            for w in self._watches
        ]

    def _write_state(self) -> None:
        if self._state_file is None:
            return
        self._state_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"roles": self.state()}))
        tmp.replace(self._state_file)
