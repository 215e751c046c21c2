"""The core install is the SDK over HTTP: the wheel, installed alone, polls a live API without chDB.

Offline and fast: the wheel is built from a copy of the sources with this environment's setuptools (the
build-system's, no isolation), installed with ``--no-deps`` into a fresh venv, and given exactly the
distributions its core ``Requires-Dist`` needs (their closure, linked from this environment), so
anything the wheel forgot to declare, or imported without declaring, is missing in the child.

The wheel installs one top-level name, ``clawr1``: the role folders (pool/, proxy/, ...) are its
subpackages through the links in clawr1/, and none of their bare names lands on a trainer's import path.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi import FastAPI
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from clawr1.pool.api import pool_router
from tests.conftest import fresh_pool_store
from tests.integration.sdk.conftest import Pool, database_dsn, step
from tests.support.asgi import serve_asgi
from tests.support.distributions import requirement_closure

REPO = Path(__file__).resolve().parents[2]
# Top-level folders that are not shipped: the tests themselves.
NOT_SHIPPED = {"tests"}
# The one name the distribution puts on the import path.
TOP_LEVEL = "clawr1"
POOL_ONLY = {"chdb", "clickhouse_connect", "pydantic"}

CHILD_SCRIPT = """
import importlib.util, json, sys
from clawr1 import consumer_sdk
from clawr1.consumer_sdk import MissingDependency, PoolConsumer

result = {"file": consumer_sdk.__file__,
          "absent": sorted(m for m in %(absent)r if importlib.util.find_spec(m) is None),
          "bare": sorted(m for m in %(bare)r if importlib.util.find_spec(m) is not None)}
with PoolConsumer(sys.argv[1], "install-check") as consumer:
    batch = consumer.poll()
    result["steps"] = sorted(batch.step_ids)
    result["committed"] = consumer.commit()
try:
    PoolConsumer("chdb:///nonexistent/pool", "direct")
except MissingDependency as exc:
    result["direct"] = str(exc)
print(json.dumps(result))
"""


def shipped_packages() -> set[str]:
    """The package folders the wheel is built from: clawr1/ and the role folders it links to."""
    return {p.parent.name for p in REPO.glob("*/__init__.py")} - NOT_SHIPPED


def role_packages() -> set[str]:
    return shipped_packages() - {TOP_LEVEL}


def run(*args: str | Path, cwd: Path) -> str:
    done = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def build_wheel(tmp: Path) -> Path:
    source = tmp / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for package in shipped_packages():
        # Links kept as links (clawr1/pool -> ../pool): the build itself must follow them.
        shutil.copytree(REPO / package, source / package, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
        "-w", tmp / "dist", source, cwd=tmp)
    (wheel,) = (tmp / "dist").glob("claw_r1-*.whl")
    return wheel


def child_venv(tmp: Path, wheel: Path, requires: list[str]) -> Path:
    """A fresh venv holding the wheel and only the core closure (linked into a folder on its path)."""
    venv = tmp / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp)
    python = venv / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", wheel, cwd=tmp)
    deps = tmp / "deps"
    deps.mkdir()
    for dist in requirement_closure(requires).values():
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            target = deps / top
            if not target.exists():
                target.symlink_to(Path(str(dist.locate_file(top))).resolve())
    (site,) = (venv / "lib").glob("python3*/site-packages")
    installed = {p.name for p in site.iterdir() if not p.name.endswith((".dist-info", ".pth"))}
    assert installed == {TOP_LEVEL}, f"the wheel installed {sorted(installed)} at the top of site-packages"
    (site / "core-deps.pth").write_text(f"{deps}\n")
    return python


@pytest.fixture(scope="module")
def api_url(pool_dsn: str) -> Iterator[str]:
    """The pool's API over a database of its own holding two ready steps, served in this process."""
    with fresh_pool_store(pool_dsn, "install") as store:
        Pool(store=store, dsn=database_dsn(pool_dsn, store.database)).write(step("s1"), step("s2"))
        app = FastAPI()
        app.include_router(pool_router(store))
        with serve_asgi(app) as server:
            yield server.url


def test_core_wheel_polls_the_api_without_chdb(tmp_path: Path, api_url: str) -> None:
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        top_level = archive.read(next(n for n in names if n.endswith(".dist-info/top_level.txt"))).decode()
    assert top_level.split() == [TOP_LEVEL], "the distribution's top-level names are exactly clawr1"
    assert {n.split("/")[0] for n in names if ".dist-info/" not in n} == {TOP_LEVEL}
    # Every role folder is in the wheel as clawr1.<folder>, package data included.
    subpackages = {n.split("/")[1] for n in names if n.startswith(f"{TOP_LEVEL}/") and n.count("/") > 1}
    assert subpackages >= role_packages()
    assert any(n.startswith("clawr1/schemas/") and n.endswith(".avsc") for n in names)
    assert any(n.startswith("clawr1/schemas/history/") and n.endswith(".avsc") for n in names)
    assert "clawr1/broker/pom.xml" in names
    assert any(n.startswith("clawr1/dashboard/static/") for n in names)
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines()
                if line.startswith("Requires-Dist:")]
    core = sorted(canonicalize_name(Requirement(r).name) for r in requires if "extra ==" not in r)
    assert core == ["cachetools", "fastavro", "httpx", "numpy", "pyarrow"]

    python = child_venv(tmp_path, wheel, requires)
    script = CHILD_SCRIPT % {"absent": sorted(POOL_ONLY), "bare": sorted(role_packages())}
    out = run(python, "-I", "-c", script, api_url, cwd=tmp_path)
    result = json.loads(out.strip().splitlines()[-1])
    assert result["absent"] == sorted(POOL_ONLY), "the core install must not bring the pool's engine"
    assert result["bare"] == [], "only clawr1 is importable from the install, not pool, proxy, ..."
    assert Path(result["file"]).is_relative_to(python.parent.parent), "imported from the repo, not the wheel"
    assert result["steps"] == ["s1", "s2"] and result["committed"] == 2
    assert "pip install 'claw-r1[pool]'" in result["direct"]
