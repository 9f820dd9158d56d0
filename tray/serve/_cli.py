"""``tray serve``: run, deploy, inspect and shut down Serve applications.

    tray serve run module:app [--address auto] [--name N] [--route-prefix /P]
                              [--host H] [--port P] [--non-blocking]
    tray serve deploy config.yaml [--address auto]
    tray serve status [--address auto]
    tray serve shutdown [--address auto] [-y]

``run`` imports the application (an ``Application``; a ``Deployment``,
bound with no arguments; or a function that takes a dict of arguments and
returns an application, given ``--arg key=value``), deploys it and, unless
``--non-blocking``, serves until interrupted, then shuts Serve down. Without
``--address`` it starts a cluster on this machine for the purpose.

``deploy`` takes Ray Serve's config file format (``proxy_location``,
``http_options``, ``applications`` with ``name``, ``route_prefix``,
``import_path``, ``args`` and per-deployment ``deployments`` options, which
win over the code's), deploys every application in it, deletes the running
ones it does not list, and returns once they run (or one failed)."""

from __future__ import annotations

import importlib
import os
import signal
import sys


def add_parsers(commands) -> None:
    serve_parser = commands.add_parser("serve", help="run and manage tray.serve applications")
    sub = serve_parser.add_subparsers(dest="serve_command", required=True)
    run = sub.add_parser("run", help="deploy an application and serve it until interrupted")
    run.add_argument("import_path", help="module:attribute of an application (or builder)")
    run.add_argument("--address", default=None,
                     help="a running cluster (HOST:PORT or 'auto'); default: start one here")
    run.add_argument("--name", default="default", help="the application's name")
    run.add_argument("--route-prefix", default="/", help="its HTTP route prefix")
    run.add_argument("--host", default="127.0.0.1", help="the HTTP proxy's host")
    run.add_argument("--port", type=int, default=8000, help="the HTTP proxy's port")
    run.add_argument("--app-dir", default=".", help="directory to import the module from")
    run.add_argument("--arg", action="append", default=[], metavar="KEY=VALUE",
                     help="an argument for an application builder function")
    run.add_argument("--non-blocking", action="store_true",
                     help="return once the application runs (it keeps running)")
    deploy = sub.add_parser("deploy", help="deploy the applications of a YAML config file")
    deploy.add_argument("config", help="path of the YAML config file")
    deploy.add_argument("--address", default="auto", help="the cluster (HOST:PORT or 'auto')")
    deploy.add_argument("--app-dir", default=".", help="directory to import modules from")
    status = sub.add_parser("status", help="print the applications' status as YAML")
    status.add_argument("--address", default="auto", help="the cluster (HOST:PORT or 'auto')")
    shutdown = sub.add_parser("shutdown", help="delete every application and stop Serve")
    shutdown.add_argument("--address", default="auto", help="the cluster (HOST:PORT or 'auto')")
    shutdown.add_argument("-y", "--yes", action="store_true", help="do not ask to confirm")


def dispatch(args) -> int:
    return {"run": _run, "deploy": _deploy, "status": _status,
            "shutdown": _shutdown}[args.serve_command](args)


# ================================================================ helpers


def import_application(import_path: str, app_dir: str = ".", builder_args: dict | None = None):
    """The application named by ``module:attribute`` (or ``module.attribute``)."""
    from ._deployment import Application, Deployment

    if app_dir and os.path.abspath(app_dir) not in sys.path:
        sys.path.insert(0, os.path.abspath(app_dir))
    if ":" in import_path:
        module_name, _, attribute = import_path.partition(":")
    else:
        module_name, _, attribute = import_path.rpartition(".")
    if not module_name or not attribute:
        raise ValueError(f"an import path is 'module:attribute', got {import_path!r}")
    module = importlib.import_module(module_name)
    try:
        target = getattr(module, attribute)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attribute!r}") from None
    if isinstance(target, Application):
        if builder_args:
            raise ValueError(f"{import_path} is an application, which takes no arguments")
        return target
    if isinstance(target, Deployment):
        return target.bind()
    if callable(target):
        app = target(dict(builder_args or {}))
        if not isinstance(app, Application):
            raise TypeError(f"the builder {import_path} returned {app!r}, not an application")
        return app
    raise TypeError(f"{import_path} is a {type(target).__name__}, not an application")


def _connect(address) -> None:
    import tray

    if address is None:
        tray.init()
    else:
        tray.init(address=address)


def _parse_args(pairs: list) -> dict:
    values = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"--arg takes KEY=VALUE, got {pair!r}")
        values[key] = value
    return values


# =============================================================== commands


def _run(args) -> int:
    import tray
    from tray import serve

    app = import_application(args.import_path, args.app_dir, _parse_args(args.arg))
    _connect(args.address)
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        serve.run(app, name=args.name, route_prefix=args.route_prefix)
        print(f"Application {args.name!r} is running at http://{args.host}:{args.port}"
              f"{args.route_prefix}", flush=True)
        if args.non_blocking:
            return 0
        stop = {"now": False}

        def interrupted(signum, frame):
            stop["now"] = True
        signal.signal(signal.SIGTERM, interrupted)
        signal.signal(signal.SIGINT, interrupted)
        import time

        while not stop["now"]:
            time.sleep(0.2)
        print("Shutting down Serve.", flush=True)
        serve.shutdown()
        return 0
    finally:
        tray.shutdown()


def _load_config(path: str) -> dict:
    import yaml

    with open(path, encoding="utf-8") as file:
        config = yaml.safe_load(file) or {}
    if not isinstance(config, dict):
        raise ValueError(f"{path}: a Serve config is a mapping")
    unknown = sorted(set(config) - {"proxy_location", "http_options", "applications",
                                    "grpc_options", "logging_config", "target_capacity"})
    if unknown:
        raise ValueError(f"{path}: unknown top-level key(s) {unknown}")
    applications = config.get("applications") or []
    if not isinstance(applications, list):
        raise ValueError(f"{path}: 'applications' must be a list")
    names = set()
    for app in applications:
        if not isinstance(app, dict) or "import_path" not in app:
            raise ValueError(f"{path}: each application needs an import_path, got {app!r}")
        name = app.get("name", "default")
        if name in names:
            raise ValueError(f"{path}: application name {name!r} appears twice")
        names.add(name)
    return config


def deploy_config(config: dict, app_dir: str = ".") -> list:
    """Deploy a config's applications (see the module's header); their names."""
    from tray import serve

    from . import _api
    from ._deployment import build, validate_route_prefix

    built = []
    for app in config.get("applications") or []:
        name = app.get("name", "default")
        route_prefix = validate_route_prefix(app.get("route_prefix", "/"))
        target = import_application(app["import_path"], app_dir, app.get("args"))
        overrides = {d["name"]: d for d in app.get("deployments") or []}
        ingress, specs = build(target, name, route_prefix, overrides)
        built.append((name, route_prefix, ingress, specs))
    serve.start(http_options=config.get("http_options"),
                proxy_location=config.get("proxy_location"))
    for name, route_prefix, ingress, specs in built:
        _api._deploy(name, route_prefix, ingress, specs)
    wanted = {name for name, *_ in built}
    for name in list(serve.status().applications):
        if name not in wanted:
            serve.delete(name)
    return sorted(wanted)


def _deploy(args) -> int:
    import tray

    config = _load_config(args.config)
    _connect(args.address)
    try:
        names = deploy_config(config, args.app_dir)
        print(f"Deployed {', '.join(names) or 'no applications'}.", flush=True)
        return 0
    finally:
        tray.shutdown()


def _status(args) -> int:
    import yaml

    import tray
    from tray import serve

    _connect(args.address)
    try:
        print(yaml.safe_dump(serve.status().to_dict(), sort_keys=False), end="", flush=True)
        return 0
    finally:
        tray.shutdown()


def _shutdown(args) -> int:
    import tray
    from tray import serve

    if not args.yes:
        answer = input("This deletes every application on the cluster. Continue? [y/N] ")
        if answer.strip().lower() not in ("y", "yes"):
            print("Nothing done.")
            return 1
    _connect(args.address)
    try:
        serve.shutdown()
        print("Serve is shut down.", flush=True)
        return 0
    finally:
        tray.shutdown()


__all__ = ["add_parsers", "dispatch", "import_application", "deploy_config"]
