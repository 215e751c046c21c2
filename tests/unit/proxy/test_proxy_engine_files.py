"""The engine table shared by the proxy's processes through files (clawr1.proxy.engine_files)."""

from __future__ import annotations

from pathlib import Path

from clawr1.proxy.engine_files import EngineFiles, combined, remaining
from clawr1.proxy.engines import EngineTable

URLS = ["http://e1:8000", "http://e2:8000"]


def test_what_an_operator_sets_in_one_process_reaches_another_and_the_next_start(tmp_path: Path) -> None:
    first, second = EngineTable(URLS), EngineTable(URLS)
    files = EngineFiles(tmp_path, 0, 2)
    assert files.read_control() == (0, {})
    first.drain(URLS[0])
    first.resume(URLS[1], 7)
    revision = files.write_control(first.control())
    taken, control = EngineFiles(tmp_path, 1, 2).read_control()
    assert taken == revision
    second.mark_out(URLS[1])
    second.apply(control)
    assert [(e.state, e.policy_version) for e in second.engines.values()] == [("draining", None), ("out", 7)]
    first.resume(URLS[0], 8)
    assert files.write_control(first.control()) > revision
    second.apply(EngineFiles(tmp_path).read_control()[1])  # a restarted proxy reads the same file
    assert (second.engines[URLS[0]].state, second.engines[URLS[0]].policy_version) == ("serving", 8)


def test_counts_add_up_over_processes_and_a_drain_waits_for_every_process(tmp_path: Path) -> None:
    tables = [EngineTable(URLS) for _ in range(3)]
    files = [EngineFiles(tmp_path, process, 3) for process in range(3)]
    for process, table in enumerate(tables):
        for _ in range(process + 1):
            table.start(table.engines[URLS[0]])
    tables[2].mark_out(URLS[1])
    files[1].write_status(5, tables[1].describe())
    assert remaining(URLS[0], 1, 5, 3, files[0].others()) == (3, 1)  # process 2 has not taken revision 5
    files[2].write_status(4, tables[2].describe())
    assert remaining(URLS[0], 1, 5, 3, files[0].others()) == (3, 1)  # an older revision: still waiting
    files[2].write_status(5, tables[2].describe())
    assert remaining(URLS[0], 1, 5, 3, files[0].others()) == (6, 0)
    rows = combined(tables[0].describe(), files[0].others())
    assert [(r["in_flight"], r["state"]) for r in rows] == [(6, "serving"), (0, "out")]
    files[0].clear_processes()
    assert files[1].others() == {}
