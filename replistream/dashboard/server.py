"""The dashboard's web server (aiohttp): the page, its static files and the JSON API.

Routes (every answer JSON but the page and its files; errors as ``{"error": "..."}``):

* ``GET /``: the page (``static/index.html``); ``GET /static/...``: its script, style and the
  vendored chart library (uPlot, ``static/vendor/uplot``);
* ``GET /api/health``: ``{"ok": true, "address": cluster address, "control": whether control
  actions are possible (the server knows the cluster's token)}``;
* ``GET /api/deployments``: ``{"deployments": [{name, query, running_s, fed, complete,
  fault_tolerance, error}]}``, one per detached deployment running on the cluster;
* ``GET /api/deployments/<name>?since=N``: that deployment's ``status(since=N)``, what
  ``replistream status <name> --json`` prints (schema in :func:`replistream.engines.ray.view.describe`);
  404 naming the running ones if there is none of that name;
* ``POST /api/deployments/<name>/kill`` with ``{"replica": "join#0"}`` and the header
  ``Authorization: Bearer <the cluster's token>``: kills that replica (``kill_replica``). Refused
  (403) without the right token, and always when the server knows no token.

Everything it shows comes from the client's public API (:func:`~replistream.engines.ray.host.list_deployments`,
:func:`~replistream.engines.ray.host.attach`, ``DeploymentClient.status``); the calls, which wait on
Ray, run on a thread pool, never on the event loop.

>>> app = make_app(Source("127.0.0.1:6379"))     # doctest: +SKIP
"""
from __future__ import annotations

import asyncio
import hmac
import json
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

__all__ = ["Source", "make_app", "serve", "STATIC"]

#: The page's files.
STATIC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "static")

_LABEL = re.compile(r"^([A-Za-z_][\w.-]*)#(\d+)$")


class Source:
    """The deployments of the Ray cluster at ``address``, read through the client's public API.
    ``token``: the cluster's token, which a control action must present (None: no control
    action is allowed).

    >>> Source("127.0.0.1:6379").status("monitor", since=0)["replicas"]     # doctest: +SKIP
    """

    def __init__(self, address: str, token: str | None = None):
        self.address = address
        self.token = token
        self._clients: dict = {}
        self._lock = threading.Lock()
        self._connected = False

    def connect(self) -> None:
        """Join the cluster (once)."""
        import ray

        from ..engines.ray import init_ray

        with self._lock:
            if not self._connected:
                if not ray.is_initialized():
                    init_ray(self.address)
                self._connected = True

    def names(self) -> list[str]:
        """The detached deployments running."""
        from ..engines.ray.host import list_deployments

        self.connect()
        return list_deployments()

    def _client(self, name: str):
        from ..engines.ray.host import attach

        with self._lock:
            c = self._clients.get(name)
        if c is None:
            c = attach(name)  # LookupError naming the running ones
            with self._lock:
                self._clients[name] = c
        return c

    def _forget(self, name: str) -> None:
        with self._lock:
            self._clients.pop(name, None)

    def status(self, name: str, since: int = 0) -> dict:
        """``attach(name).status(since)``; LookupError if it does not run (any more)."""
        self.connect()
        try:
            return self._client(name).status(since)
        except Exception:
            self._forget(name)  # a new host of that name, or none: attach again next time
            if name not in self.names():
                raise LookupError(f"no detached deployment named {name!r}; running: {self.names() or 'none'}") \
                    from None
            raise

    def kill(self, name: str, replica: str) -> None:
        """Kill ``replica`` (``"operator#index"``) of deployment ``name``."""
        m = _LABEL.match(replica or "")
        if m is None:
            raise ValueError(f"replica must be 'operator#index', got {replica!r}")
        self.connect()
        self._client(name).kill_replica(m.group(1), int(m.group(2)))

    def allowed(self, presented: str | None) -> bool:
        """Whether ``presented`` is the cluster's token (never when no token is known)."""
        return bool(self.token) and presented is not None and hmac.compare_digest(presented.encode(),
                                                                                   self.token.encode())


def _json(data, status: int = 200) -> web.Response:
    return web.Response(text=json.dumps(data, default=str), status=status, content_type="application/json",
                        headers={"Cache-Control": "no-store"})


def make_app(source: Source, workers: int = 8) -> web.Application:
    """The aiohttp application serving ``source`` (see the module doc for its routes).

    >>> app = make_app(Source("127.0.0.1:6379", token=None))   # doctest: +SKIP
    """
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="replistream-dashboard")

    async def blocking(fn, *args):
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    async def page(request):
        return web.FileResponse(os.path.join(STATIC, "index.html"), headers={"Cache-Control": "no-store"})

    async def health(request):
        return _json({"ok": True, "address": source.address, "control": bool(source.token)})

    async def deployments(request):
        try:
            names = await blocking(source.names)
        except Exception as e:  # noqa: BLE001 - said to the page
            return _json({"error": f"{type(e).__name__}: {e}"}, 503)
        rows = []
        for n in names:
            try:
                s = await blocking(source.status, n, 1 << 62)  # no timeline
                rows.append({k: s.get(k) for k in ("name", "query", "running_s", "fed", "complete",
                                                   "fault_tolerance")} | {"error": s.get("poll_error")})
            except Exception as e:  # noqa: BLE001 - one that ended meanwhile, or a host that does not answer
                rows.append({"name": n, "error": f"{type(e).__name__}: {e}"})
        return _json({"deployments": rows})

    async def deployment(request):
        name = request.match_info["name"]
        try:
            since = int(request.query.get("since", "0"))
        except ValueError:
            return _json({"error": f"since must be a whole number, got {request.query.get('since')!r}"}, 400)
        try:
            return _json(await blocking(source.status, name, since))
        except LookupError as e:
            return _json({"error": str(e)}, 404)
        except Exception as e:  # noqa: BLE001 - said to the page
            return _json({"error": f"{type(e).__name__}: {e}"}, 503)

    async def kill(request):
        auth = request.headers.get("Authorization", "")
        token = auth[len("Bearer "):] if auth.startswith("Bearer ") else None
        if not source.token:
            return _json({"error": "control actions are off: this dashboard knows no cluster token "
                                   "(start it on a cluster with token authentication, or give --token-file)"}, 403)
        if not source.allowed(token):
            return _json({"error": "a control action needs the cluster's token (Authorization: Bearer ...)"}, 403)
        try:
            body = await request.json()
        except ValueError:
            return _json({"error": "the body must be JSON: {\"replica\": \"operator#index\"}"}, 400)
        try:
            await blocking(source.kill, request.match_info["name"], body.get("replica"))
        except LookupError as e:
            return _json({"error": str(e)}, 404)
        except ValueError as e:
            return _json({"error": str(e)}, 400)
        except Exception as e:  # noqa: BLE001 - said to the page
            return _json({"error": f"{type(e).__name__}: {e}"}, 500)
        return _json({"killed": body.get("replica")})

    app = web.Application()
    app.router.add_get("/", page)
    app.router.add_get("/api/health", health)
    app.router.add_get("/api/deployments", deployments)
    app.router.add_get("/api/deployments/{name}", deployment)
    app.router.add_post("/api/deployments/{name}/kill", kill)
    app.router.add_static("/static/", STATIC)

    async def close_pool(_app):
        pool.shutdown(wait=False, cancel_futures=True)

    app.on_cleanup.append(close_pool)
    return app


def cluster_token() -> str | None:
    """The token of the cluster this machine joins with Ray's token authentication (what
    ``RAY_AUTH_TOKEN``, ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token`` holds), or None."""
    try:
        from ray._private.authentication.authentication_token_setup import AuthenticationTokenLoader
    except ImportError:  # a Ray without token authentication
        return None
    loader = AuthenticationTokenLoader.instance()
    if not loader.has_token(ignore_auth_mode=True):
        return None
    tok = loader.get_raw_token()
    return tok.decode() if isinstance(tok, bytes) else (str(tok) if tok else None)


def serve(address: str, port: int, host: str = "127.0.0.1", token: str | None = None,
          on_ready=None, watch_cluster: bool = True) -> None:
    """Serve the dashboard of the cluster at ``address`` on ``host:port`` until interrupted, or
    (``watch_cluster``) until the cluster stops answering. ``on_ready(url)`` runs once it listens.

    >>> serve("127.0.0.1:6379", 8270)     # doctest: +SKIP
    """
    from ..engines.ray.cluster import answers

    source = Source(address, token)

    async def main():
        runner = web.AppRunner(make_app(source), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        url = f"http://{host}:{port}/"
        if on_ready is not None:
            on_ready(url)
        hostport = address.split("://")[-1]
        try:
            while True:
                await asyncio.sleep(2.0)
                if watch_cluster and re.fullmatch(r"[\w.-]+:\d+", hostport) and not await asyncio.to_thread(answers, hostport, 2.0):
                    print(f"dashboard: the Ray cluster at {address} no longer answers: stopping", flush=True)
                    return
        finally:
            await runner.cleanup()

    asyncio.run(main())
