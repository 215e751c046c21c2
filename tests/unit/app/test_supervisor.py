"""The restart policy decides from exit times alone; the supervisor applies it to real processes:
restart after backoff with the reason and last lines logged, give up on a crash loop, stop tier by
tier and kill what ignores SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from clawr1 import readiness
from clawr1 import supervisor as supervisor_module
from clawr1.supervisor import ProcessRole, RestartPolicy, Supervisor, describe_exit, quorum_lost
from tests.support.waiting import wait_until

POLICY = RestartPolicy(backoff_s=1.0, max_backoff_s=5.0, max_restarts=3, window_s=60.0)


def test_backoff_doubles_per_recent_exit_and_is_capped() -> None:
    delays = [POLICY.decide([0.0] * n, 1.0).delay_s for n in (1, 2, 3)]
    assert delays == [1.0, 2.0, 4.0]
    wide = RestartPolicy(backoff_s=1.0, max_backoff_s=5.0, max_restarts=10, window_s=60.0)
    assert wide.decide([0.0] * 8, 1.0).delay_s == 5.0


def test_more_exits_than_the_limit_within_the_window_is_a_crash_loop() -> None:
    decision = POLICY.decide([10.0, 20.0, 30.0, 40.0], 40.0)
    assert not decision.restart and decision.recent_exits == 4


def test_exits_older_than_the_window_are_forgiven() -> None:
    decision = POLICY.decide([0.0, 1.0, 2.0, 100.0], 100.0)
    assert decision.restart and decision.recent_exits == 1 and decision.delay_s == 1.0


def test_kills_of_a_stuck_role_back_off_but_never_make_a_crash_loop() -> None:
    """A worker killed as stuck (overloaded, slow) is restarted with the backoff its kills earned, however
    often; only crashes count toward the limit."""
    kills = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    decision = POLICY.decide([], 60.0, kills)
    assert decision.restart and decision.recent_exits == 0 and decision.delay_s == 5.0
    assert POLICY.decide([55.0, 60.0], 60.0, kills[:1]).delay_s == 4.0  # two crashes and a kill: third delay
    assert not POLICY.decide([10.0, 20.0, 30.0, 60.0], 60.0, kills).restart


def test_exit_descriptions_name_the_signal_or_the_code() -> None:
    assert describe_exit(-signal.SIGKILL) == "killed by SIGKILL"
    assert describe_exit(3) == "exited with code 3"


def _python(code: str) -> Callable[[], subprocess.Popen[bytes]]:
    return lambda: subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE,
                                    start_new_session=True)


def _tick_until(supervisor: Supervisor, done: Callable[[], bool] | None, timeout: float = 20.0,
                restarting: bool = True) -> str | None:
    """Tick until the supervisor names a problem (returned) or ``done`` holds (None returned)."""

    def settled() -> tuple[str | None] | None:
        problem = supervisor.tick(restarting)
        return (problem,) if problem is not None or (done is not None and done()) else None

    return wait_until(settled, timeout, interval=0.02, message="the supervisor reaching the condition")[0]


def test_a_killed_role_is_restarted_with_its_reason_logged(tmp_path: Path) -> None:
    logs: list[str] = []
    readiness.mark_ready(tmp_path, "sleeper")
    role = ProcessRole("sleeper", _python("import time; time.sleep(60)"),
                       on_exit=lambda: readiness.withdraw(tmp_path, "sleeper"))
    state_file = tmp_path / "run" / "supervisor.json"
    supervisor = Supervisor(RestartPolicy(backoff_s=0.3), state_file=state_file, log=logs.append)
    try:
        supervisor.add(role)
        first = role.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        _tick_until(supervisor, lambda: bool(logs))
        assert "sleeper killed by SIGKILL; restarting it in 0.3s" in logs[0]
        assert not (tmp_path / "run" / "sleeper.ready").exists(), "/healthz must name the dead part"
        assert json.loads(state_file.read_text())["roles"][0]["state"] == "restarting"
        _tick_until(supervisor, lambda: len(logs) == 2)
        assert role.pid != first and role.returncode() is None
        saved = json.loads(state_file.read_text())["roles"][0]
        assert saved | {"pid": 0} == {"role": "sleeper", "state": "running", "pid": 0, "restarts": 1,
                                      "last_exit": "killed by SIGKILL"}
    finally:
        supervisor.stop_all()
    assert not state_file.exists()


def test_a_crash_loop_gives_up_with_the_last_lines(tmp_path: Path) -> None:
    logs: list[str] = []
    role = ProcessRole("crasher", _python(
        "import sys; print('bad config: port', file=sys.stderr); sys.exit(3)"))
    supervisor = Supervisor(RestartPolicy(backoff_s=0.01, max_restarts=2), log=logs.append)
    try:
        supervisor.add(role)
        problem = _tick_until(supervisor, None)
    finally:
        supervisor.stop_all()
    assert problem is not None
    assert problem.startswith(
        "crasher exited with code 3, exit 3 within 300s (limit 2 restarts): a crash loop")
    assert "bad config: port" in problem
    assert sum("restarted" in line for line in logs) == 2


def test_a_stuck_role_is_killed_and_restarted_after_its_grace_and_counted(tmp_path: Path) -> None:
    """A role alive but stuck (its health check names why) is restarted like one that died; a freshly
    started one gets its grace before it is judged again."""
    logs: list[str] = []
    verdict: list[str | None] = [None]
    role = ProcessRole("worker", _python("import time; time.sleep(60)"))
    supervisor = Supervisor(RestartPolicy(backoff_s=0.01), log=logs.append)
    try:
        supervisor.add(role, health=lambda _started: verdict[0], grace_s=0.2)
        first = role.pid
        assert supervisor.tick() is None and role.returncode() is None  # healthy: left alone
        verdict[0] = "consumer group g: 12 records waiting, no progress for 30s (t[0])"
        _tick_until(supervisor, lambda: len(logs) == 2)
        assert logs[0].startswith("worker stuck (consumer group g: 12 records waiting")
        assert "killed" in logs[0]
        assert role.pid != first and role.returncode() is None
        assert supervisor.state()[0]["restarts"] == 1
        assert supervisor.tick() is None and role.returncode() is None  # within its new grace
    finally:
        supervisor.stop_all()


def test_a_role_stuck_for_good_is_restarted_again_and_again_without_stopping_the_stack() -> None:
    """Kills of a stuck role are no crash loop: more of them than the limit allows crashes, and the stack
    goes on; each restart gives the new process its own grace (its clock starts at its start)."""
    logs: list[str] = []
    starts: list[float] = []

    def stuck(started: float) -> str:
        starts.append(started)
        return "consumer group g: 12 records waiting, no progress for 30s (t[0])"

    role = ProcessRole("worker", _python("import time; time.sleep(60)"))
    policy = RestartPolicy(backoff_s=0.01, max_backoff_s=0.05, max_restarts=1)
    supervisor = Supervisor(policy, log=logs.append)
    try:
        supervisor.add(role, health=stuck, grace_s=0.1)
        assert _tick_until(supervisor, lambda: supervisor.state()[0]["restarts"] == 4) is None
        assert len(set(starts)) == len(starts) >= 4, "each process is judged from its own start"
        assert role.returncode() is None
    finally:
        supervisor.stop_all()


def test_a_stuck_role_writes_where_its_threads_are_before_it_is_killed() -> None:
    """The only witness of a wedge is the process itself: its stacks reach the log, then SIGKILL."""
    logs: list[str] = []
    code = ("import faulthandler, signal, sys, time\n"
            "faulthandler.register(signal.SIGUSR1, all_threads=True)\n"
            "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
            "print('up', file=sys.stderr, flush=True)\n"
            "def wedged_in_a_commit():\n    time.sleep(60)\n"
            "wedged_in_a_commit()\n")
    role = ProcessRole("worker", _python(code), dump_signal=signal.SIGUSR1, stop_timeout_s=0.5)
    supervisor = Supervisor(RestartPolicy(backoff_s=60.0), log=logs.append)
    supervisor.add(role, health=lambda _started: "no progress for 30s", grace_s=0.0)
    wait_until(lambda: "up" in role.last_lines(), 10, message="the role's first line")
    _tick_until(supervisor, lambda: role.returncode() is not None)
    assert role.returncode() == -signal.SIGKILL
    assert any("wedged_in_a_commit" in line for line in role.last_lines()), role.last_lines()
    assert "worker stuck (no progress for 30s), killed" in logs[0]


def test_an_exit_during_start_up_stops_at_once() -> None:
    supervisor = Supervisor(POLICY, log=lambda _: None)
    supervisor.add(ProcessRole("api", _python("raise SystemExit(2)")))
    try:
        problem = _tick_until(supervisor, None, restarting=False)
    finally:
        supervisor.stop_all()
    assert problem is not None and problem.startswith("api exited with code 2 during start-up")


def test_a_kill_during_start_up_is_restarted_not_a_setup_failure() -> None:
    logs: list[str] = []
    supervisor = Supervisor(RestartPolicy(backoff_s=0.01), log=logs.append)
    supervisor.add(ProcessRole("api", _python("import time; time.sleep(60)")))
    try:
        first = supervisor.state()[0]["pid"]
        os.kill(int(str(first)), signal.SIGKILL)
        problem = _tick_until(supervisor, lambda: supervisor.state()[0]["restarts"] == 1, restarting=False)
    finally:
        supervisor.stop_all()
    assert problem is None
    assert any(line.startswith("api killed by SIGKILL; restarting it") for line in logs)


def test_a_role_that_cannot_start_counts_as_an_exit() -> None:
    logs: list[str] = []
    attempts: list[int] = []

    def launch() -> subprocess.Popen[bytes]:
        attempts.append(1)
        if len(attempts) > 1:
            raise OSError("port 9092 is already in use")
        return subprocess.Popen([sys.executable, "-c", "pass"])

    supervisor = Supervisor(RestartPolicy(backoff_s=0.01, max_restarts=1), log=logs.append)
    supervisor.add(ProcessRole("broker", launch))
    problem = _tick_until(supervisor, None)
    supervisor.stop_all()
    assert problem is not None and "broker failed to start (port 9092 is already in use)" in problem


def test_stop_all_stops_higher_tiers_first_and_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    logs: list[str] = []
    seen = tmp_path / "seen"
    broker = ProcessRole("broker", _python("import time; time.sleep(60)"))
    supervisor = Supervisor(POLICY, log=logs.append)
    supervisor.add(broker, tier=0)
    handled = [tmp_path / "worker.handles", tmp_path / "proxy.handles"]
    client = (
        "import os, signal, sys, time\n"
        "def bye(*_):\n"
        f"    os.kill({broker.pid}, 0)  # raises if the broker is already gone\n"
        f"    open({str(seen)!r}, 'w').write('broker alive')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        f"open({str(handled[0])!r}, 'w').close()\n"
        "time.sleep(60)\n"
    )
    supervisor.add(ProcessRole("worker", _python(client)))
    stubborn = ProcessRole("proxy", _python(
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        f"open({str(handled[1])!r}, 'w').close(); time.sleep(60)"),
        stop_timeout_s=0.5)
    supervisor.add(stubborn)
    wait_until(lambda: all(path.exists() for path in handled), 10, message="the children's handlers")
    started = time.monotonic()
    supervisor.stop_all()
    assert time.monotonic() - started < 10
    assert seen.read_text() == "broker alive"
    assert stubborn.returncode() == -signal.SIGKILL and broker.returncode() == -signal.SIGTERM
    assert logs == ["proxy did not stop in time; killing it"]


@pytest.mark.parametrize(("name", "value", "field", "expected"), [
    ("CLAWR1_RESTART_LIMIT", "9", "max_restarts", 9),
    ("CLAWR1_RESTART_WINDOW_S", "30", "window_s", 30.0),
    ("CLAWR1_RESTART_BACKOFF_S", "0.1", "backoff_s", 0.1),
])
def test_policy_comes_from_settings(name: str, value: str, field: str, expected: float) -> None:
    from clawr1.core.settings import load_settings

    assert getattr(RestartPolicy.from_settings(load_settings({name: value})), field) == expected


def test_quorum_lost_once_most_voters_stopped() -> None:
    assert [quorum_lost(3, stopped) for stopped in range(4)] == [False, False, True, True]
    assert not quorum_lost(0, 0) and not quorum_lost(1, 0) and quorum_lost(1, 1)


def test_a_voter_left_behind_by_its_quorum_gets_a_short_grace_not_its_whole_timeout(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As the last Kafka node of a cluster whose controlled shutdown waits for a quorum that has gone."""
    monkeypatch.setattr(supervisor_module, "QUORUM_LOST_GRACE_S", 0.5)
    logs: list[str] = []
    supervisor = Supervisor(POLICY, log=logs.append)
    ready = [tmp_path / f"node-{n}" for n in range(3)]
    stuck = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    nodes = [ProcessRole(f"node-{n}", _python((stuck if n == 0 else "import time; ")
                                              + f"open({str(ready[n])!r}, 'w').close(); time.sleep(60)"),
                         stop_timeout_s=30.0, votes=True)
             for n in range(3)]
    for node in nodes:
        supervisor.add(node, tier=0)
    wait_until(lambda: all(path.exists() for path in ready), 10, message="the nodes' handlers")
    started = time.monotonic()
    supervisor.stop_all()
    assert time.monotonic() - started < 10  # not the 30 s timeout
    assert nodes[0].returncode() == -signal.SIGKILL
    assert [node.returncode() for node in nodes[1:]] == [-signal.SIGTERM] * 2
    assert logs == ["node-0 did not stop in time; killing it"]
