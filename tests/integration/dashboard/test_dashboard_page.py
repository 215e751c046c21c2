"""The page and its assets: right content types, only local assets, mountable in the stack's API app."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin, urlsplit

from fastapi.testclient import TestClient

from clawr1.core.settings import Settings
from clawr1.dashboard.api import ASSETS, dashboard_page_router, dashboard_router
from clawr1.gateway.app import create_app
from clawr1.pool.api import pool_router
from clawr1.pool.store import PoolStore

PAGE_URL = "http://testserver/dashboard"


class _Links(HTMLParser):
    """Every URL the page makes the browser load (scripts, styles, images, frames)."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        for name, value in attrs:
            if name in {"src", "href"} and value:
                self.urls.append(value)


def page_links(client: TestClient) -> list[str]:
    response = client.get("/dashboard")
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    parser = _Links()
    parser.feed(response.text)
    return parser.urls


IMPORT = re.compile(r'^import [^;]*? from "([^"]+)";$', re.MULTILINE)


def test_the_page_loads_only_local_assets_served_with_their_types(empty_client: TestClient) -> None:
    links = page_links(empty_client)
    assert "data:," in links  # an empty inline icon: the browser asks the server for no favicon
    links.remove("data:,")
    assert sorted(links) == ["dashboard/assets/app.css", "dashboard/assets/app.js"]
    # The script is a module: every asset it reaches through its imports is loaded too.
    loaded, todo, types = set(), list(links), {}
    while todo:
        link = todo.pop()
        if link in loaded:
            continue
        loaded.add(link)
        assert not urlsplit(link).scheme and not link.startswith("//"), link
        response = empty_client.get(urljoin(PAGE_URL, link))
        assert response.status_code == 200, link
        types[link.rsplit(".", 1)[1]] = response.headers["content-type"]
        # No script or style pulls anything from elsewhere: the only absolute URL is the SVG namespace.
        assert set(re.findall(r"(?:https?:)?//[\w.-]+\.\w+[^\s\"'`)]*", response.text)) <= {
            "http://www.w3.org/2000/svg"
        }, link
        assert "@import" not in response.text and "url(" not in response.text
        assert "import(" not in response.text, link  # no dynamic imports: the module graph is static
        for target in IMPORT.findall(response.text):
            assert target.startswith("./") and target.endswith(".js"), (link, target)
            todo.append(urljoin(link, target))
    assert types == {"css": "text/css; charset=utf-8", "js": "text/javascript; charset=utf-8"}
    # Every module shipped is reached from the page, and every one reached is served.
    assert loaded == {f"dashboard/assets/{name}" for name in ASSETS}


def test_the_page_runs_its_script_as_a_module(empty_client: TestClient) -> None:
    page = empty_client.get("/dashboard").text
    assert '<script type="module" src="dashboard/assets/app.js"></script>' in page


def test_the_script_calls_the_api_relative_to_the_page(empty_client: TestClient) -> None:
    script = empty_client.get("/dashboard/assets/api.js").text
    assert 'const API = "v1/dashboard";' in script
    assert urljoin(PAGE_URL, "v1/dashboard/summary") == "http://testserver/v1/dashboard/summary"


def test_only_the_listed_assets_are_served(empty_client: TestClient) -> None:
    for name in ("api.py", "..%2Fapi.py", "index.html", "missing.js"):
        response = empty_client.get(f"/dashboard/assets/{name}")
        assert response.status_code == 404, name


def test_the_router_mounts_beside_the_pool_router_in_the_api_app(pool_store: PoolStore) -> None:
    app = create_app(
        Settings(),
        routers=[pool_router(pool_store), dashboard_router(pool_store)],
        public_routers=[dashboard_page_router()],
    )
    # No lifespan: the Kafka producer is not needed. Without keys only loopback Host names are served.
    client = TestClient(app, base_url="http://127.0.0.1")
    assert client.get("/dashboard").status_code == 200
    assert client.get("/v1/dashboard/summary").json()["totals"]["steps"] == 0
    assert client.post("/v1/sql", json={"query": "SELECT count() AS n FROM steps"}).status_code == 200
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/dashboard/summary", "/v1/dashboard/steps", "/v1/dashboard/steps/{step_id}"} <= set(paths)


def test_with_keys_the_page_is_public_and_its_data_needs_a_read_key(pool_store: PoolStore) -> None:
    app = create_app(
        Settings(api_keys="reader:key-r:read,agent:key-a:steps"),
        routers=[dashboard_router(pool_store)],
        public_routers=[dashboard_page_router()],
    )
    client = TestClient(app)
    assert client.get("/dashboard").status_code == 200
    assert client.get("/dashboard/assets/app.js").status_code == 200
    assert client.get("/v1/dashboard/summary").status_code == 401
    assert client.get("/v1/dashboard/trajectories/t").status_code == 401
    reader = {"Authorization": "Bearer key-r"}
    assert client.get("/v1/dashboard/trajectories/t", headers=reader).status_code == 404
    assert client.get("/v1/dashboard/summary", headers={"Authorization": "Bearer key-a"}).status_code == 403
    reply = client.get("/v1/dashboard/summary", headers={"Authorization": "Bearer key-r"})
    assert reply.status_code == 200 and reply.json()["totals"]["steps"] == 0


def test_a_pool_that_cannot_answer_is_a_503_with_the_reason(pool_dsn: str) -> None:
    store = PoolStore(pool_dsn)
    store.close()
    client = TestClient(create_app(Settings(), routers=[dashboard_router(store)]), base_url="http://127.0.0.1")
    for path in ("/v1/dashboard/summary", "/v1/dashboard/steps", "/v1/dashboard/steps/a"):
        response = client.get(path)
        assert response.status_code == 503, path
        assert "the pool store is closed" in response.text
