"""The ``clawr1`` command: one entry point for every role of the stack.

Flags override ``CLAWR1_*`` environment variables; both feed the one ``Settings`` object. An unknown
or malformed ``CLAWR1_*`` variable stops every command at once (exit 2), naming it; ``clawr1 config``
prints the effective settings.
Role modules are imported inside their command, so a trainer's SDK-only install never needs
mitmproxy or Quix Streams.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import signal
import sys
import threading
from collections.abc import Callable

from clawr1.core import registry
from clawr1.core.settings import Settings, SettingsError, effective_settings, load_settings


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data-dir", dest="data_dir", help="state directory (default ./.clawr1)")


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="clawr1", description="Claw-R1: data middleware for agentic RL")
    sub = parser.add_subparsers(dest="command", required=True)

    kafka = sub.add_parser("kafka", help="run a local Kafka broker (KRaft), or cluster, in the foreground")
    _common(kafka)
    kafka.add_argument("--port", dest="kafka_port", type=int)
    kafka.add_argument("--heap", dest="kafka_heap")
    kafka.add_argument("--nodes", dest="kafka_nodes", type=int,
                       help="brokers on --port and the ports after it (default 1; 3+ survive losing one)")

    up = sub.add_parser("up", help="run the whole local stack in the foreground")
    _common(up)
    up.add_argument("--proxy-port", dest="proxy_port", type=int)
    up.add_argument("--reverse-port", dest="reverse_port", type=int)
    up.add_argument("--upstream")
    up.add_argument("--api-port", dest="api_port", type=int)
    up.add_argument("--compat-port", dest="compat_port", type=int,
                    help="the seed Claw-R1 gateway's protocol (default 8100; 0 = off)")
    up.add_argument("--kafka-port", dest="kafka_port", type=int)
    up.add_argument("--kafka-nodes", dest="kafka_nodes", type=int,
                    help="local Kafka brokers on --kafka-port and the ports after it (default 1)")
    up.add_argument("--capture-token-ids", dest="capture_token_ids", action="store_true", default=None)
    up.add_argument("--demo", action="store_true", help="start a stand-in LLM engine and a demo workload")
    up.add_argument("--workers", type=int, help="stream worker processes (CLAWR1_WORKERS, default 1)")

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

    export = sub.add_parser("export", help="write pool steps as sharded dataset files (Parquet, JSON Lines)")
    export.add_argument("--api", required=True, help="the running stack's API URL (or a pool DSN)")
    export.add_argument("--out", required=True,
                        help="folder for the shards and manifest.json; an interrupted export into it resumes")
    export.add_argument("--format", choices=("parquet", "jsonl"), default="parquet")
    export.add_argument("--channel", help="only steps of this data channel (train, val, ...)")
    export.add_argument("--where", help="a SQL condition on the steps view, e.g. \"reward_status = 'final'\"")
    export.add_argument("--preset", help="a saved curation preset's filters (consumer SDK presets)")
    export.add_argument("--group-by", dest="group_by", choices=("step", "trajectory"), default="step")
    export.add_argument("--shard-mb", dest="shard_mb", type=float, default=256.0, help="size cap of a shard")
    export.add_argument("--page-rows", dest="page_rows", type=int, default=1000,
                        help="rows (trajectories with --group-by trajectory) read per query")
    export.add_argument("--api-key", dest="api_key",
                        help="API key when the stack requires one (default: $CLAWR1_API_KEY, hidden from ps)")

    prune = sub.add_parser("prune", help="delete step data by age, policy version or channel, with what "
                                         "hangs on it (feedback, prefix trees, lookups); docs/pool.md")
    _common(prune)
    prune.add_argument("--dsn", help="a pool DSN (default: CLAWR1_CLICKHOUSE_DSN or the embedded pool, which "
                                     "the stack that owns it must not hold open)")
    prune.add_argument("--older-than", dest="older_than", metavar="AGE",
                       help="steps whose newest version landed longer ago than AGE: 30d, 12h, 90m, 2w")
    prune.add_argument("--policy-version-below", dest="policy_version_below", type=int, metavar="N",
                       help="steps whose policy version is below N (steps without one are kept)")
    prune.add_argument("--channel", help="steps of this data channel (train, val, ...)")
    prune.add_argument("--dry-run", dest="dry_run", action="store_true",
                       help="print the rows each table would lose; delete nothing")

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

    worker = sub.add_parser("worker", help="run one stream worker")
    _common(worker)
    worker.add_argument("--ready-as", default="worker",
                        help="the part this worker marks ready under (clawr1 up names each worker slot)")

    for name, text in (
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

    for name, text in (
        ("engines", "the capture proxy's engines: state, calls in flight, calls served, policy version"),
        ("drain", "stop new calls to an engine (before its weight update); returns once its calls are done"),
        ("resume", "put a drained engine back, serving the policy version given"),
    ):
        control = sub.add_parser(name, help=text)
        _common(control)
        control.add_argument("--proxy", help="the proxy's reverse-port URL (default: the stack's)")
        control.add_argument("--api-key", dest="api_key",
                             help="an operate key when the stack has keys (default: $CLAWR1_API_KEY)")
        if name != "engines":
            control.add_argument("engine", help="the engine's URL, as CLAWR1_UPSTREAM lists it")
        if name == "drain":
            control.add_argument("--timeout-s", dest="timeout_s", type=float, default=60.0,
                                 help="answer after this long even with calls still in flight")
        if name == "resume":
            control.add_argument("--policy-version", dest="policy_version", type=int,
                                 help="the policy version the engine now serves (its later steps carry it)")

    engine = sub.add_parser("standin-engine", help="a local stand-in for an LLM serving engine (demo, tests)")
    engine.add_argument("--host", default="127.0.0.1")
    engine.add_argument("--port", type=int, default=8091)
    return parser


_SETTING_FLAGS = (
    "data_dir",
    "kafka_port",
    "kafka_heap",
    "kafka_nodes",
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


def _cmd_engines(settings: Settings, args: argparse.Namespace) -> int:
    """``clawr1 engines|drain|resume``: the proxy's engine routes; prints the answer as JSON."""
    import json

    from clawr1.compat.relay import RelayUnavailable, proxy_authorization, proxy_target
    from clawr1.consumer_sdk import ConsumerError, EngineControl

    url = args.proxy or proxy_target(settings)[0]
    if url is None:
        print(f"clawr1 {args.command}: give --proxy URL, or set CLAWR1_REVERSE_PORT and CLAWR1_UPSTREAM",
              file=sys.stderr)
        return 2
    try:
        authorization = proxy_authorization(settings.proxy_auth)
        with EngineControl(url, args.api_key, authorization) as control:
            if args.command == "engines":
                answer: object = control.list()
            elif args.command == "drain":
                answer = control.drain(args.engine, args.timeout_s)
            else:
                answer = control.resume(args.engine, args.policy_version)
    except (RelayUnavailable, ConsumerError) as exc:
        print(f"clawr1 {args.command}: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(answer, indent=2))
    return 0 if args.command != "drain" or isinstance(answer, dict) and answer.get("drained") else 1


def _cmd_kafka(settings: Settings) -> int:
    from clawr1.broker.launcher import run_foreground

    return run_foreground(settings.data_dir / "kafka", settings.kafka_port, settings.kafka_heap,
                          settings.kafka_nodes, settings.role_setting(registry.KAFKA_REQUEST_LOG))


def _pipeline_groups(settings: Settings, with_sink: bool) -> dict[str, tuple[str, list[str]]]:
    """The consumer groups a step passes through: group -> (part, input topics). Their progress decides
    a part's health; their lag, the API's backpressure."""
    from clawr1.sinks.config import SinkConfig
    from clawr1.sinks.pool_sink import routes_for
    from clawr1.streams.config import StreamConfig

    worker = StreamConfig.from_settings(settings)
    groups = {worker.app_id: ("worker", worker.topics.inputs())}
    if with_sink:
        sink = SinkConfig.from_settings(settings)
        groups[sink.group_id] = ("sink", list(routes_for(sink)))
    return groups


def _cmd_api(settings: Settings, expect_parts: list[str], with_sink: bool) -> int:
    """Serve the API and run the sink in one process: the one process that may own the chDB pool."""
    import asyncio

    from clawr1 import readiness
    from clawr1.core.metrics import LagSampler, PoolRowsSampler, sample_interval
    from clawr1.core.progress import ProgressWatch
    from clawr1.core.signals import stop_loop_on_signals
    from clawr1.dashboard.api import dashboard_page_router, dashboard_router
    from clawr1.dashboard.decoding import load_decoder
    from clawr1.dashboard.live import LiveLimits
    from clawr1.gateway.app import create_app
    from clawr1.gateway.metrics import RequestMetrics, metrics_router
    from clawr1.gateway.server import serve
    from clawr1.pool.analyst_processes import analyst_processes
    from clawr1.pool.api import pool_router
    from clawr1.pool.retention import migrate_with_retention
    from clawr1.pool.sql import AnalystSql, SqlLimits
    from clawr1.pool.store import PoolStore
    from clawr1.proxy import engine_files
    from clawr1.sinks.config import SinkConfig
    from clawr1.sinks.pool_sink import routes_for
    from clawr1.sinks.runner import run_sink

    data_dir = settings.data_dir.resolve()
    # Two stores on one DSN (allowed within a process): a long analyst query never stalls the sink.
    store = PoolStore(settings.pool_dsn, cluster=settings.clickhouse_cluster)
    migrate_with_retention(store, settings)
    sink_store = PoolStore(settings.pool_dsn, cluster=settings.clickhouse_cluster)
    # Analyst SQL on read-only sessions of its own (the server's read-only user when CLAWR1_SQL_DSN is set);
    # on the embedded pool, keyed analysts' queries in processes of their own over snapshots.
    limits = SqlLimits.from_settings(settings)
    analyst = AnalystSql(settings.sql_dsn or settings.pool_dsn, store.database, limits,
                         control_dsn=settings.pool_dsn, processes=analyst_processes(settings, store, limits))
    stop = threading.Event()
    sink_ready = threading.Event()
    sink = threading.Thread(
        target=run_sink, args=(settings, sink_store, stop, sink_ready.set), name="sink", daemon=True
    )
    if with_sink:
        sink.start()

    pipeline = _pipeline_groups(settings, with_sink)
    watched = {group: (part, topics) for group, (part, topics) in pipeline.items()
               if part != "worker" or part in expect_parts}
    progress = ProgressWatch(settings.bootstrap_servers,
                             {group: topics for group, (_, topics) in watched.items()},
                             settings.role_setting(registry.STALL_S)).start()
    part_of = {group: part for group, (part, _) in watched.items()}

    def parts() -> dict[str, bool | str]:
        status: dict[str, bool | str] = {"pool": True}
        if with_sink:
            status["sink"] = sink_ready.is_set() and sink.is_alive()
        for part in expect_parts:
            status[part] = readiness.problem(data_dir, part) or readiness.is_ready(data_dir, part)
        for group, stall in progress.stalls().items():  # alive is not enough: healthy means progressing
            status[part_of[group]] = stall.describe()
        return status

    app = create_app(
        settings,
        routers=[pool_router(store, analyst),
                 dashboard_router(store, load_decoder(settings.tokenizer),
                                  LiveLimits.from_settings(settings),
                                  (settings.data_dir / engine_files.DIRECTORY).resolve()),
                 metrics_router()],
        public_routers=[dashboard_page_router()],
        readiness=parts,
        pipeline={group: topics for group, (_, topics) in pipeline.items()},
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
        progress.stop()
        for sampler in samplers:
            sampler.stop()
        if with_sink:
            sink.join(30)
        sink_store.close()
        analyst.close()
        store.close()
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from clawr1.consumer_sdk import ConsumerError, export_dataset

    try:
        manifest = export_dataset(
            args.api, args.out, preset=args.preset, api_key=args.api_key, format=args.format,
            group_by=args.group_by, where=args.where, channel=args.channel,
            shard_bytes=max(1, int(args.shard_mb * 1024 * 1024)), page_rows=args.page_rows)
    except ConsumerError as exc:
        print(f"clawr1 export: {exc}", file=sys.stderr)
        return 2
    unit = "steps" if args.group_by == "step" else "trajectories"
    print(f"exported {manifest.rows} {unit} in {len(manifest.shards)} shard(s) to {args.out} "
          f"(watermark {manifest.watermark_ms}; manifest.json)")
    return 0


def _cmd_prune(settings: Settings, args: argparse.Namespace) -> int:
    from clawr1.pool.prune import PruneError, PruneFilter, parse_age, prune, report
    from clawr1.pool.store import PoolError, PoolStore, is_embedded

    dsn = args.dsn or settings.pool_dsn
    try:
        where = PruneFilter(parse_age(args.older_than) if args.older_than else None,
                            args.policy_version_below, args.channel)
        where.condition()  # a prune without a filter is refused before the pool is opened
    except PruneError as exc:
        print(f"clawr1 prune: {exc}", file=sys.stderr)
        return 2
    try:
        store = PoolStore(dsn, cluster=settings.clickhouse_cluster)
    except PoolError as exc:
        print(f"clawr1 prune: {exc}", file=sys.stderr)
        if is_embedded(dsn):
            print("clawr1 prune: it opens the embedded pool itself, so stop the stack that owns it first "
                  "(the TTLs, CLAWR1_POOL_STEP_TTL_DAYS, run while it serves)", file=sys.stderr)
        return 2
    try:
        store.migrate()
        counts = prune(store, where, dry_run=args.dry_run)
    except (PruneError, PoolError) as exc:
        print(f"clawr1 prune: {exc}", file=sys.stderr)
        return 2
    finally:
        store.close()
    print(report(counts, args.dry_run))
    return 0


def _dump_threads_on_sigusr1() -> None:
    """`clawr1 up` sends SIGUSR1 before it kills a stuck role: where every thread was goes to the role's
    log (the process's own stderr, whatever ``sys.stderr`` was replaced with)."""
    if sys.__stderr__ is not None:
        with contextlib.suppress(OSError, ValueError):  # a stderr without a file descriptor
            faulthandler.register(signal.SIGUSR1, file=sys.__stderr__, all_threads=True)


def main(argv: list[str] | None = None) -> int:
    args = _build_parser().parse_args(argv)
    _dump_threads_on_sigusr1()
    if getattr(args, "workers", None) is not None:  # a role setting: it reaches the stack as its variable
        os.environ[registry.WORKERS.name] = str(args.workers)
    if args.command == "standin-engine":
        from clawr1.demo.standin.server import main as engine_main

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
        from clawr1.status import print_status, stack_bootstrap

        data_dir = settings.data_dir.resolve()
        return print_status(args.api or f"http://127.0.0.1:{settings.api_port}", data_dir / STATE_FILE,
                            stack_bootstrap(data_dir, settings.bootstrap_servers))
    if args.command == "kafka":
        return _cmd_kafka(settings)
    if args.command in ("engines", "drain", "resume"):
        return _cmd_engines(settings, args)
    if args.command == "up":
        from clawr1.stack import run_stack

        return run_stack(settings, demo=args.demo)
    if args.command == "sql":
        from clawr1.pool.sql_cli import main as sql_main

        target = ["--api", args.api] if args.api else ["--dsn", args.dsn or settings.pool_dsn]
        key = ["--api-key", args.api_key] if args.api_key else []
        return sql_main([*target, *key, "--format", args.format, *([args.query] if args.query else [])])
    if args.command == "export":
        return _cmd_export(args)
    if args.command == "prune":
        return _cmd_prune(settings, args)
    if args.command == "api":
        return _cmd_api(settings, [p for p in args.expect_parts.split(",") if p], with_sink=not args.no_sink)
    if args.command == "worker":
        from clawr1.core.metrics import serve_role_metrics
        from clawr1.streams.config import StreamConfig
        from clawr1.streams.worker import run_worker

        config = StreamConfig.from_settings(settings)
        read = config.topics.inputs()  # what the worker reads (its consumer group is its app id)
        served = _or_exit("worker", lambda: serve_role_metrics(
            settings, "worker_metrics_port", {config.app_id: read}))
        return served or run_worker(settings, ready=_ready_marker(settings, args.ready_as), config=config)
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
        from clawr1.proxy.config import ca_cert_path

        print(ca_cert_path(settings))
        return 0
    raise SystemExit(f"unknown command {args.command}")


if __name__ == "__main__":
    sys.exit(main())
