"""The ``clawr1`` command: one entry point for every role of the stack.

Flags override ``CLAWR1_*`` environment variables; both feed the one ``Settings`` object. An unknown
or malformed ``CLAWR1_*`` variable stops every command at once (exit 2), naming it; ``clawr1 config``
prints the effective settings.
Role modules are imported inside their command, so a trainer's SDK-only install never needs
mitmproxy or Faust.
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable

from clawr1.core.settings import Settings, SettingsError, effective_settings, load_settings


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", dest="data_dir", help="state directory (default ./.clawr1)")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clawr1", description="Claw-R1: data middleware for agentic RL")
    sub = parser.add_subparsers(dest="command", required=True)

    kafka = sub.add_parser("kafka", help="run the single-node Kafka broker (KRaft) in the foreground")
    _common(kafka)
    kafka.add_argument("--port", dest="kafka_port", type=int)
    kafka.add_argument("--heap", dest="kafka_heap")

    up = sub.add_parser("up", help="run the whole local stack in the foreground")
    _common(up)
    up.add_argument("--proxy-port", dest="proxy_port", type=int)
    up.add_argument("--reverse-port", dest="reverse_port", type=int)
    up.add_argument("--upstream")
    up.add_argument("--api-port", dest="api_port", type=int)
    up.add_argument("--compat-port", dest="compat_port", type=int,
                    help="the seed Claw-R1 gateway's protocol (default 8100; 0 = off)")
    up.add_argument("--kafka-port", dest="kafka_port", type=int)
    up.add_argument("--capture-token-ids", dest="capture_token_ids", action="store_true", default=None)
    up.add_argument("--demo", action="store_true", help="start a stand-in LLM engine and a demo workload")

    sql = sub.add_parser("sql", help="query the pool (interactive without a query)")
    _common(sql)
    sql.add_argument("--api", help="the running stack's API URL, e.g. http://127.0.0.1:8000")
    sql.add_argument(
        "--dsn", help="a pool DSN to open directly (default: CLAWR1_CLICKHOUSE_DSN or the embedded pool)"
    )
    sql.add_argument("--api-key", dest="api_key",
                     help="API key when the stack requires one (default: $CLAWR1_API_KEY, hidden from ps)")
    sql.add_argument("--format", default="TabSeparatedWithNames", help="ClickHouse output format")
    sql.add_argument("query", nargs="?")

    status = sub.add_parser("status", help="health of a running stack, its restarts and what its pool holds")
    _common(status)
    status.add_argument("--api", default=None)

    api = sub.add_parser("api", help="the API process: gateway, pool SQL and sink (owns the embedded pool)")
    _common(api)
    api.add_argument("--api-port", dest="api_port", type=int)
    api.add_argument("--compat-port", dest="compat_port", type=int,
                     help="also serve the seed Claw-R1 gateway's protocol there (default 8100; 0 = off)")
    api.add_argument("--expect-parts", default="", help="comma-separated parts /healthz waits for")
    api.add_argument("--no-sink", action="store_true", help="serve only; a separate `clawr1 sink` writes")

    for name, text in (
        ("worker", "run one stream worker"),
        ("sink", "run the pool sink alone"),
        ("rewarder", "score trajectories or steps with CLAWR1_REWARD_FN and post the rewards"),
        ("ca", "print the path of the proxy's CA certificate"),
    ):
        _common(sub.add_parser(name, help=text))

    proxy = sub.add_parser("proxy", help="run the capture proxy alone")
    _common(proxy)
    proxy.add_argument("--proxy-port", dest="proxy_port", type=int)
    proxy.add_argument("--reverse-port", dest="reverse_port", type=int)
    proxy.add_argument("--upstream")
    proxy.add_argument("--capture-token-ids", dest="capture_token_ids", action="store_true", default=None)

    config = sub.add_parser("config", help="print the effective settings and their source (secrets masked)")
    _common(config)
    config.add_argument("--markdown", action="store_true",
                        help="print the table of every CLAWR1_* variable (docs/settings.md) instead")

    engine = sub.add_parser("standin-engine", help="a local stand-in for an LLM serving engine (demo, tests)")
    engine.add_argument("--host", default="127.0.0.1")
    engine.add_argument("--port", type=int, default=8091)
    return parser


_SETTING_FLAGS = (
    "data_dir",
    "kafka_port",
    "kafka_heap",
    "proxy_port",
    "reverse_port",
    "upstream",
    "api_port",
    "compat_port",
    "capture_token_ids",
)


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings().with_overrides(**{k: getattr(args, k, None) for k in _SETTING_FLAGS})


def _cmd_config(settings: Settings, args: argparse.Namespace) -> int:
    from clawr1.core.registry import markdown_table

    if args.markdown:
        sys.stdout.write(markdown_table())
        return 0
    flags = frozenset(k for k in _SETTING_FLAGS if getattr(args, k, None) is not None)
    rows = [(o.name, o.show(value), source) for o, value, source in effective_settings(settings, flags=flags)]
    width = max(len(name) for name, _, _ in rows)
    for name, value, source in rows:
        print(f"{name:<{width}}  {source:<7}  {value}")
    return 0


def _ready_marker(settings: Settings, part: str) -> Callable[[], None]:
    from clawr1 import readiness

    return lambda: readiness.mark_ready(settings.data_dir.resolve(), part)


def _or_exit(command: str, start: Callable[[], None]) -> int:
    """0 once ``start`` ran; 2, with the reason on stderr, when it cannot (a metrics port is taken)."""
    from clawr1.core.metrics import MetricsPortError

    try:
        start()
    except MetricsPortError as exc:
        print(f"clawr1 {command}: {exc}", file=sys.stderr)
        return 2
    return 0


def _cmd_kafka(settings: Settings) -> int:
    from clawr1.broker.launcher import run_foreground

    return run_foreground(settings.data_dir / "kafka", settings.kafka_port, settings.kafka_heap)


def _cmd_api(settings: Settings, expect_parts: list[str], with_sink: bool) -> int:
    """Serve the API and run the sink in one process: the one process that may own the chDB pool."""
    import asyncio

    from clawr1 import readiness
    from clawr1.core.metrics import LagSampler, PoolRowsSampler, sample_interval
    from clawr1.core.signals import stop_loop_on_signals
    from clawr1.dashboard.api import dashboard_page_router, dashboard_router
    from clawr1.dashboard.live import LiveLimits
    from clawr1.gateway.app import create_app
    from clawr1.gateway.metrics import RequestMetrics, metrics_router
    from clawr1.gateway.server import serve
    from clawr1.pool.api import pool_router
    from clawr1.pool.sql import AnalystSql, SqlLimits
    from clawr1.pool.store import PoolStore
    from clawr1.sinks.config import SinkConfig
    from clawr1.sinks.pool_sink import routes_for
    from clawr1.sinks.runner import run_sink

    data_dir = settings.data_dir.resolve()
    # Two stores on one DSN (allowed within a process): a long analyst query never stalls the sink.
    store = PoolStore(settings.pool_dsn)
    store.migrate()
    sink_store = PoolStore(settings.pool_dsn)
    # Analyst SQL on read-only sessions of its own (the server's read-only user when CLAWR1_SQL_DSN is set).
    analyst = AnalystSql(settings.sql_dsn or settings.pool_dsn, store.database,
                         SqlLimits.from_settings(settings), control_dsn=settings.pool_dsn)
    stop = threading.Event()
    sink_ready = threading.Event()
    sink = threading.Thread(
        target=run_sink, args=(settings, sink_store, stop, sink_ready.set), name="sink", daemon=True
    )
    if with_sink:
        sink.start()

    def parts() -> dict[str, bool]:
        status = {"pool": True}
        if with_sink:
            status["sink"] = sink_ready.is_set() and sink.is_alive()
        status.update({part: readiness.is_ready(data_dir, part) for part in expect_parts})
        return status

    app = create_app(
        settings,
        routers=[pool_router(store, analyst), dashboard_router(store, LiveLimits.from_settings(settings)),
                 metrics_router()],
        public_routers=[dashboard_page_router()],
        readiness=parts,
    )
    app.add_middleware(RequestMetrics, app_name="api")
    interval = sample_interval(settings)
    samplers: list[PoolRowsSampler | LagSampler] = [PoolRowsSampler(store.query, interval)]
    if with_sink:
        sink_config = SinkConfig.from_settings(settings)
        samplers.append(LagSampler(settings.bootstrap_servers,
                                   {sink_config.group_id: list(routes_for(sink_config))}, interval))
    for sampler in samplers:
        sampler.start()
    servers = [(app, settings.api_port)]
    if settings.compat_port:
        from clawr1.compat.app import create_compat_app

        servers.append((create_compat_app(settings, app.state.gateway), settings.compat_port))

    async def main() -> None:
        shutdown = stop_loop_on_signals()
        await asyncio.gather(*(serve(server, settings.api_host, port, shutdown) for server, port in servers))

    try:
        asyncio.run(main())
    finally:
        stop.set()
        for sampler in samplers:
            sampler.stop()
        if with_sink:
            sink.join(30)
        sink_store.close()
        analyst.close()
        store.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    if args.command == "standin-engine":
        from clawr1.demo.standin_engine import main as engine_main

        return engine_main(["--host", args.host, "--port", str(args.port)])
    try:
        settings = _settings(args)
    except SettingsError as exc:  # before anything starts, and without a traceback
        print(f"clawr1 {args.command}: {exc}", file=sys.stderr)
        return 2
    if args.command == "config":
        return _cmd_config(settings, args)
    if args.command == "status":
        from clawr1.stack import STATE_FILE
        from clawr1.status import print_status

        return print_status(args.api or f"http://127.0.0.1:{settings.api_port}",
                            settings.data_dir.resolve() / STATE_FILE)
    if args.command == "kafka":
        return _cmd_kafka(settings)
    if args.command == "up":
        from clawr1.stack import run_stack

        return run_stack(settings, demo=args.demo)
    if args.command == "sql":
        from clawr1.pool.sql_cli import main as sql_main

        target = ["--api", args.api] if args.api else ["--dsn", args.dsn or settings.pool_dsn]
        key = ["--api-key", args.api_key] if args.api_key else []
        return sql_main([*target, *key, "--format", args.format, *([args.query] if args.query else [])])
    if args.command == "api":
        return _cmd_api(settings, [p for p in args.expect_parts.split(",") if p], with_sink=not args.no_sink)
    if args.command == "worker":
        from clawr1.core.metrics import serve_role_metrics
        from clawr1.streams.config import StreamConfig
        from clawr1.streams.worker import run_worker

        config = StreamConfig.from_settings(settings)
        t = config.topics  # what the worker's agents read (Faust's group is its app id)
        read = [t.raw_llm, t.raw_events, t.raw_steps, t.raw_feedback, t.targets, t.trajectories, t.scopes]
        served = _or_exit("worker", lambda: serve_role_metrics(
            settings, "worker_metrics_port", {config.app_id: read}))
        return served or run_worker(settings, ready=_ready_marker(settings, "worker"), config=config)
    if args.command == "rewarder":
        from clawr1.core.metrics import serve_role_metrics
        from clawr1.rewards.worker import RewarderConfig, run_rewarder

        rewarder = RewarderConfig.from_settings(settings)
        served = _or_exit("rewarder", lambda: serve_role_metrics(
            settings, "rewarder_metrics_port", {rewarder.group_id: [rewarder.steps_topic]}))
        return served or run_rewarder(settings, ready=_ready_marker(settings, "rewarder"))
    if args.command == "proxy":
        from clawr1.proxy.runner import run_proxy

        return run_proxy(settings, ready=_ready_marker(settings, "proxy"))
    if args.command == "sink":
        from clawr1.core.metrics import serve_role_metrics
        from clawr1.sinks.config import SinkConfig
        from clawr1.sinks.pool_sink import routes_for
        from clawr1.sinks.runner import run_sink_process

        sink = SinkConfig.from_settings(settings)
        served = _or_exit("sink", lambda: serve_role_metrics(
            settings, "sink_metrics_port", {sink.group_id: list(routes_for(sink))}))
        if served:
            return served
        run_sink_process(settings)  # its SinkStats are for tests and benchmarks, not an exit status
        return 0
    if args.command == "ca":
        from clawr1.proxy.runner import ca_cert_path

        print(ca_cert_path(settings))
        return 0
    raise SystemExit(f"unknown command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
